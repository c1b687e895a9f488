//! The device smoke test behind `make gpu-check` (`trident check gpu`): on a real GPU, compile a
//! small kernel with NVRTC for the device's architecture (through the module cache), load it with
//! `cuModuleLoadData`, launch it over a ragged size, copy the result back and compare it with the
//! host's, exactly. It exercises every table entry the CUDA Device will need. The full comparison
//! of every fused kernel against the CPU reference arrives with the CUDA Device.

use super::cache::ModuleCache;
use super::driver::{DeviceBuffer, Driver, Module, PrimaryContext};
use super::launch;
use super::nvrtc::Nvrtc;
use crate::error::{Error, Result};
use std::ffi::c_void;

/// `y = a * x + y` over `n` floats, one thread per element.
pub const AXPY_SOURCE: &str = r#"
extern "C" __global__ void trident_smoke_axpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;
pub const AXPY_NAME: &str = "trident_smoke_axpy";

/// What the smoke test did, for its report line.
pub struct SmokeReport {
    pub device: String,
    pub arch: String,
    pub elements: usize,
    pub blocks: u64,
    pub cache: String,
}

/// Runs the smoke test on device `ordinal`.
pub fn run(driver: &Driver, nvrtc: &Nvrtc, cache: &ModuleCache, ordinal: usize) -> Result<SmokeReport> {
    let info = driver.device_info(ordinal)?;
    let arch = info.arch();
    let image = cache.get_or_compile(nvrtc, AXPY_NAME, AXPY_SOURCE, &arch, &[])?;
    let context = PrimaryContext::retain(driver, ordinal)?;
    let module = Module::load(&context, &image.bytes)?;
    let function = module.function(AXPY_NAME)?;

    // A ragged size (not a multiple of the block) so the guard of the last block is exercised;
    // small integers keep a * x + y exact in f32.
    let n: usize = (1 << 20) + 3;
    let a = 2.0f32;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let bytes = n * 4;
    let dx = DeviceBuffer::alloc(&context, bytes)?;
    let dy = DeviceBuffer::alloc(&context, bytes)?;
    dx.upload(bytemuck::cast_slice(&x))?;
    dy.upload(bytemuck::cast_slice(&y))?;
    let cfg = launch::elementwise(AXPY_NAME, n, 256, &info.limits)?;
    let (mut pa, mut px, mut py, mut pn) = (a, dx.pointer, dy.pointer, n as u64);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut f32).cast(),
        (&mut px as *mut u64).cast(),
        (&mut py as *mut u64).cast(),
        (&mut pn as *mut u64).cast(),
    ];
    // SAFETY: the function takes (float, const float*, float*, unsigned long long), matched by
    // the four parameter pointers, which outlive the launch (synchronized below); the geometry
    // was checked against the device's limits.
    let status = unsafe {
        driver.api.cuLaunchKernel(
            function,
            cfg.grid[0],
            cfg.grid[1],
            cfg.grid[2],
            cfg.block[0],
            cfg.block[1],
            cfg.block[2],
            cfg.shared_bytes,
            std::ptr::null_mut(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }?;
    driver.check("cuLaunchKernel", status)?;
    context.synchronize()?;
    let mut out = vec![0f32; n];
    dy.download(bytemuck::cast_slice_mut(&mut out))?;
    if let Some(i) = (0..n).find(|&i| out[i] != a * x[i] + y[i]) {
        return Err(Error::Data(format!(
            "gpu check: {AXPY_NAME} on device {ordinal} ({}) computed y[{i}] = {}, expected {}",
            info.name,
            out[i],
            a * x[i] + y[i]
        )));
    }
    let cache = match image.outcome {
        super::cache::Outcome::Hit => format!("cached {}", image.path.display()),
        _ => format!("compiled by NVRTC, stored in {}", image.path.display()),
    };
    Ok(SmokeReport { device: info.name, arch, elements: n, blocks: cfg.blocks(), cache })
}
