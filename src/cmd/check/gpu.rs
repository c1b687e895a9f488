//! `trident check gpu` (behind `make gpu-check`): the device smoke test on every visible NVIDIA
//! GPU, else on every visible AMD GPU, then the GPU Device's ops against the reference device on
//! each (`ops::run_all`, small shapes; `trident check ops` runs the full set).
//! The smoke test (`smoke_cuda`), on a real GPU: compile a small kernel with NVRTC for the device's architecture
//! (through the module cache), load it with `cuModuleLoadData`, launch it over a ragged size, copy
//! the result back and compare it with the host's, exactly. `smoke_hip` is the same test on an AMD
//! GPU: the same kernel source compiled by hipRTC for the device's gfx architecture (through the
//! same cache), loaded with `hipModuleLoadData` and launched with `hipModuleLaunchKernel` in
//! 256-thread workgroups.

use super::ops::{run_all, Size};
use crate::error::{Error, Result};
use crate::gpu::cache::{ModuleCache, Outcome};
use crate::gpu::device::GpuDevice;
use crate::gpu::driver::{DeviceBuffer, Driver, Module, PrimaryContext};
use crate::gpu::hip::{Hip, HipBuffer, HipLoadedModule};
use crate::gpu::hiprtc::Hiprtc;
use crate::gpu::launch;
use crate::gpu::nvrtc::Nvrtc;
use std::ffi::c_void;

/// `trident check gpu`: the smoke test and the Device's ops on every NVIDIA GPU, else on every AMD
/// GPU; with neither, one error naming what each vendor's side is missing.
pub fn run() -> Result<()> {
    let nvidia = match Driver::load() {
        Ok(driver) => match driver.device_count() {
            Ok(n) if n > 0 => return check_cuda(&driver, n),
            Ok(_) => format!("the driver ({}) sees no device", driver.path()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    let amd = match Hip::load() {
        Ok(hip) => match hip.device_count() {
            Ok(n) if n > 0 => return check_hip(&hip, n),
            Ok(_) => format!("the HIP runtime ({}) sees no device", hip.path()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    Err(Error::Usage(format!("check gpu needs an NVIDIA GPU: {nvidia}; or an AMD GPU: {amd}")))
}

fn check_cuda(driver: &Driver, n: usize) -> Result<()> {
    let nvrtc = Nvrtc::load()?;
    let cache = ModuleCache::at_default_root()?;
    check_each(n, "NVIDIA", "CUDA", &|ordinal| smoke_cuda(driver, &nvrtc, &cache, ordinal), GpuDevice::cuda)
}

fn check_hip(hip: &Hip, n: usize) -> Result<()> {
    let hiprtc =
        Hiprtc::load().map_err(|e| Error::Usage(format!("check gpu on AMD compiles its kernel with hipRTC: {e}")))?;
    let cache = ModuleCache::at_default_root()?;
    check_each(n, "AMD", "HIP", &|ordinal| smoke_hip(hip, &hiprtc, &cache, ordinal), GpuDevice::hip)
}

/// The smoke test on each of the `n` GPUs of one vendor, then the Device (`api`) on each.
fn check_each(
    n: usize,
    vendor: &str,
    api: &str,
    smoke: &dyn Fn(usize) -> Result<SmokeReport>,
    device: fn(usize) -> Result<GpuDevice>,
) -> Result<()> {
    for ordinal in 0..n {
        print_smoke(ordinal, &smoke(ordinal)?);
    }
    // Then the Device itself on each GPU (after every smoke test, so a broken Device does not hide
    // which GPUs launch kernels at all).
    for ordinal in 0..n {
        device_ops_line(ordinal, api, &device(ordinal)?)?;
    }
    println!(
        "gpu check: passed on {n} {vendor} device{}; `trident check ops` compares every fused op with the reference",
        if n == 1 { "" } else { "s" }
    );
    Ok(())
}

fn print_smoke(ordinal: usize, r: &SmokeReport) {
    println!(
        "gpu check: device {ordinal} ({}, {}): {} launched over {} elements in {} blocks, result exact ({})",
        r.device, r.arch, AXPY_NAME, r.elements, r.blocks, r.cache
    );
}

/// The GPU Device's ops against the reference device on small shapes, as one line (`check ops`
/// prints the table).
fn device_ops_line(ordinal: usize, api: &str, dev: &GpuDevice) -> Result<()> {
    let checks = run_all(dev, Size::Small, &GpuDevice::HEAD_DIMS, 7, crate::real::Precision::Bf16);
    if let Some(bad) = checks.iter().find(|c| !c.passed()) {
        return Err(Error::Check(format!("gpu check: device {ordinal}: the {api} Device: {}", bad.line())));
    }
    println!(
        "gpu check: device {ordinal}: the {api} Device matches the reference device on {} op outputs",
        checks.len()
    );
    Ok(())
}

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

/// The inputs of the test: a ragged size (not a multiple of the block) so the guard of the last
/// block is exercised; small integers keep a * x + y exact in f32.
fn axpy_inputs() -> (usize, f32, Vec<f32>, Vec<f32>) {
    let n: usize = (1 << 20) + 3;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    (n, 2.0, x, y)
}

/// The first element where `out` is not exactly `a * x + y`, as an error naming the device.
fn check_axpy(out: &[f32], a: f32, x: &[f32], y: &[f32], ordinal: usize, device: &str) -> Result<()> {
    match (0..out.len()).find(|&i| out[i] != a * x[i] + y[i]) {
        None => Ok(()),
        Some(i) => Err(Error::Usage(format!(
            "gpu check: {AXPY_NAME} on device {ordinal} ({device}) computed y[{i}] = {}, expected {}",
            out[i],
            a * x[i] + y[i]
        ))),
    }
}

/// The workgroup size of the AMD test: four wave64s.
pub const HIP_BLOCK: usize = 256;

/// Runs the smoke test on AMD device `ordinal`, the kernel compiled by hipRTC through `cache`.
pub fn smoke_hip(hip: &Hip, hiprtc: &Hiprtc, cache: &ModuleCache, ordinal: usize) -> Result<SmokeReport> {
    let info = hip.device_info(ordinal)?;
    let arch = info.arch.clone().ok_or_else(|| {
        Error::Unsupported(format!(
            "gpu check: device {ordinal} ({}): the HIP runtime did not name its gfx architecture, so there is nothing to compile for",
            info.name
        ))
    })?;
    let options = vec!["-O3".to_string()];
    let image = cache.get_or_compile_hip(hiprtc, AXPY_NAME, AXPY_SOURCE, &[], &arch, &options)?;
    // SAFETY: takes a device ordinal, checked by the runtime.
    hip.check("hipSetDevice", unsafe { hip.api.hipSetDevice(ordinal as i32) }?)?;
    let module = HipLoadedModule::load(hip, &image.bytes)?;
    let function = module.function(AXPY_NAME)?;

    let (n, a, x, y) = axpy_inputs();
    let bytes = n * 4;
    let dx = HipBuffer::alloc(hip, bytes)?;
    let dy = HipBuffer::alloc(hip, bytes)?;
    dx.upload(bytemuck::cast_slice(&x))?;
    dy.upload(bytemuck::cast_slice(&y))?;
    let blocks = n.div_ceil(HIP_BLOCK) as u64;
    let grid = u32::try_from(blocks)
        .map_err(|_| Error::Config(format!("gpu check: {blocks} workgroups exceed the grid's 32-bit x dimension")))?;
    let (mut pa, mut px, mut py, mut pn) = (a, dx.pointer, dy.pointer, n as u64);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut f32).cast(),
        (&mut px as *mut *mut c_void).cast(),
        (&mut py as *mut *mut c_void).cast(),
        (&mut pn as *mut u64).cast(),
    ];
    // SAFETY: the function takes (float, const float*, float*, unsigned long long), matched by
    // the four parameter pointers, which outlive the launch (synchronized below); 256 threads
    // per workgroup is within every AMD GPU's limit of 1024.
    let status = unsafe {
        hip.api.hipModuleLaunchKernel(
            function,
            grid,
            1,
            1,
            HIP_BLOCK as u32,
            1,
            1,
            0,
            std::ptr::null_mut(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }?;
    hip.check("hipModuleLaunchKernel", status)?;
    // SAFETY: no arguments; waits for the launch above.
    hip.check("hipDeviceSynchronize", unsafe { hip.api.hipDeviceSynchronize() }?)?;
    let mut out = vec![0f32; n];
    dy.download(bytemuck::cast_slice_mut(&mut out))?;
    check_axpy(&out, a, &x, &y, ordinal, &info.name)?;
    let cache = match image.outcome {
        Outcome::Hit => format!("cached {}", image.path.display()),
        _ => format!("compiled by hipRTC, stored in {}", image.path.display()),
    };
    Ok(SmokeReport { device: info.name, arch, elements: n, blocks, cache })
}

/// Runs the smoke test on NVIDIA device `ordinal`.
pub fn smoke_cuda(driver: &Driver, nvrtc: &Nvrtc, cache: &ModuleCache, ordinal: usize) -> Result<SmokeReport> {
    let info = driver.device_info(ordinal)?;
    let arch = info.arch();
    let image = cache.get_or_compile(nvrtc, AXPY_NAME, AXPY_SOURCE, &arch, &[])?;
    let context = PrimaryContext::retain(driver, ordinal)?;
    let module = Module::load(&context, &image.bytes)?;
    let function = module.function(AXPY_NAME)?;

    let (n, a, x, y) = axpy_inputs();
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
    check_axpy(&out, a, &x, &y, ordinal, &info.name)?;
    let cache = match image.outcome {
        Outcome::Hit => format!("cached {}", image.path.display()),
        _ => format!("compiled by NVRTC, stored in {}", image.path.display()),
    };
    Ok(SmokeReport { device: info.name, arch, elements: n, blocks: cfg.blocks(), cache })
}
