//! `HipRuntime`: the HIP runtime (hip.rs) as a `VendorRuntime` (hipMalloc, hipFree,
//! hipMemcpyHtoD / DtoH / DtoD, hipMemsetD32, hipModuleLoadData, hipModuleGetFunction,
//! hipModuleLaunchKernel, hipDeviceSynchronize), which `runtime::Counted` makes the GPU Device's
//! and the GPU benches' `GpuRuntime` on an AMD GPU: one device, made current on every thread that
//! calls in, its gfx architecture and launch limits, and the modules it loaded. Everything runs
//! on the null stream, in order, as on CUDA.

use super::hip::{attribute, Hip, HipDeviceInfo, HipFunction, HipModule};
use super::launch::{DeviceLimits, LaunchConfig};
use super::runtime::VendorRuntime;
use crate::error::{Error, Result};
use std::ffi::{c_void, CString};
use std::sync::Mutex;

/// The HIP runtime as a `VendorRuntime`: device `ordinal`, made current (`hipSetDevice`) on every
/// thread that calls in, and the modules it loaded (unloaded on drop).
pub struct HipRuntime {
    hip: Hip,
    info: HipDeviceInfo,
    arch: String,
    limits: DeviceLimits,
    modules: Mutex<Vec<usize>>,
}

thread_local! {
    /// The device made current on this thread, plus one (0: none yet).
    static DEVICE_SET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl HipRuntime {
    /// The HIP runtime table this device runs on.
    pub fn hip(&self) -> &Hip {
        &self.hip
    }

    /// Device `ordinal` of the runtime; its gfx architecture must be known (kernels are compiled for it).
    pub fn new(hip: Hip, ordinal: usize) -> Result<HipRuntime> {
        let info = hip.device_info(ordinal)?;
        let arch = info.arch.clone().ok_or_else(|| {
            Error::Unsupported(format!(
                "--device hip: device {ordinal} ({}): the HIP runtime did not name its gfx architecture, so there is nothing to compile the kernels for",
                info.name
            ))
        })?;
        let attr = |a: i32| -> Result<u32> {
            let mut v = 0;
            // SAFETY: writes one int.
            hip.check("hipDeviceGetAttribute", unsafe { hip.api.hipDeviceGetAttribute(&mut v, a, ordinal as i32) }?)?;
            Ok(v.max(0) as u32)
        };
        // CDNA limits: 1024 threads and 64 KiB of LDS per workgroup (no opt-in beyond it).
        let limits = DeviceLimits {
            max_threads_per_block: attr(attribute::MAX_THREADS_PER_BLOCK)?,
            max_block: [1024, 1024, 1024],
            max_grid: [2_147_483_647, 65_535, 65_535],
            shared_bytes_per_block: 64 * 1024,
            shared_bytes_optin: 64 * 1024,
            warp_size: attr(attribute::WARP_SIZE)?,
        };
        let rt = HipRuntime { hip, info, arch, limits, modules: Mutex::new(Vec::new()) };
        rt.current()?;
        Ok(rt)
    }

    pub fn info(&self) -> &HipDeviceInfo {
        &self.info
    }

    /// The device's gfx architecture (`gfx90a`, ...).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// What a launch may use on this device.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// Makes the device current on this thread (once per thread and device).
    fn current(&self) -> Result<()> {
        let key = self.info.ordinal + 1;
        if DEVICE_SET.with(|c| c.get()) == key {
            return Ok(());
        }
        // SAFETY: takes a device ordinal, checked by the runtime.
        self.hip.check("hipSetDevice", unsafe { self.hip.api.hipSetDevice(self.info.ordinal as i32) }?)?;
        DEVICE_SET.with(|c| c.set(key));
        Ok(())
    }
}

impl Drop for HipRuntime {
    fn drop(&mut self) {
        let _ = self.current();
        for m in self.modules.lock().map(|m| m.clone()).unwrap_or_default() {
            // SAFETY: each handle came from hipModuleLoadData and is unloaded once.
            let _ = unsafe { self.hip.api.hipModuleUnload(m as HipModule) };
        }
        DEVICE_SET.with(|c| c.set(0));
    }
}

impl VendorRuntime for HipRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.current()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one device pointer.
        self.hip.check("hipMalloc", unsafe { self.hip.api.hipMalloc(&mut p, bytes) }?)?;
        Ok(p as u64)
    }
    fn free(&self, pointer: u64, _bytes: usize) {
        let _ = self.current();
        // SAFETY: the pointer came from hipMalloc and `Counted` frees each block once.
        let _ = unsafe { self.hip.api.hipFree(pointer as *mut c_void) };
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at dst holds src.len() bytes; synchronous copy.
        self.hip.check("hipMemcpyHtoD", unsafe {
            self.hip.api.hipMemcpyHtoD(dst as *mut c_void, src.as_ptr().cast(), src.len())
        }?)
    }
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at src holds dst.len() bytes; synchronous after prior work.
        self.hip.check("hipMemcpyDtoH", unsafe {
            self.hip.api.hipMemcpyDtoH(dst.as_mut_ptr().cast(), src as *mut c_void, dst.len())
        }?)
    }
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both allocations hold `bytes` bytes from these addresses; ordered after prior work.
        self.hip.check("hipMemcpyDtoD", unsafe {
            self.hip.api.hipMemcpyDtoD(dst as *mut c_void, src as *mut c_void, bytes)
        }?)
    }
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at dst holds count words.
        self.hip.check("hipMemsetD32", unsafe { self.hip.api.hipMemsetD32(dst as *mut c_void, value as i32, count) }?)
    }
    fn load_module(&self, image: &[u8]) -> Result<usize> {
        self.current()?;
        let mut m: HipModule = std::ptr::null_mut();
        // SAFETY: the code object outlives the call (the runtime copies what it keeps).
        self.hip
            .check("hipModuleLoadData", unsafe { self.hip.api.hipModuleLoadData(&mut m, image.as_ptr().cast()) }?)?;
        self.modules.lock().expect("module list").push(m as usize);
        Ok(m as usize)
    }
    fn function(&self, module: usize, name: &str) -> Result<usize> {
        self.current()?;
        let c = CString::new(name).map_err(|_| Error::Config(format!("kernel name {name:?}")))?;
        let mut f: HipFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; writes one handle.
        self.hip.check("hipModuleGetFunction", unsafe {
            self.hip.api.hipModuleGetFunction(&mut f, module as HipModule, c.as_ptr())
        }?)?;
        Ok(f as usize)
    }
    /// AMD GPUs have no opt-in: a workgroup may use the whole LDS (64 KiB) without one, and no
    /// more with one.
    fn launch(&self, function: usize, config: &LaunchConfig, params: &mut [*mut c_void]) -> Result<()> {
        if config.shared_bytes > self.limits.shared_bytes_optin {
            return Err(Error::Config(format!(
                "{} bytes of dynamic shared memory: an AMD workgroup has at most {} of LDS",
                config.shared_bytes, self.limits.shared_bytes_optin
            )));
        }
        self.current()?;
        let (grid, block) = (config.grid, config.block);
        // SAFETY: params point to live arguments of the kernel's types; the null stream is
        // ordered with the synchronous copies.
        self.hip.check("hipModuleLaunchKernel", unsafe {
            self.hip.api.hipModuleLaunchKernel(
                function as HipFunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                config.shared_bytes,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }?)
    }
    fn synchronize(&self) -> Result<()> {
        self.current()?;
        // SAFETY: no arguments.
        self.hip.check("hipDeviceSynchronize", unsafe { self.hip.api.hipDeviceSynchronize() }?)
    }
    fn profiler(&self, on: bool) -> Result<()> {
        self.current()?;
        // SAFETY: no arguments.
        match on {
            true => self.hip.check("hipProfilerStart", unsafe { self.hip.api.hipProfilerStart() }?),
            false => self.hip.check("hipProfilerStop", unsafe { self.hip.api.hipProfilerStop() }?),
        }
    }
    fn describe(&self) -> String {
        let runtime = self.hip.runtime_version().map_or_else(|_| "HIP runtime".into(), |v| format!("HIP {v} runtime"));
        format!(
            "hip: {} (device {}, {}, {} CUs, wave{}), {runtime} {}",
            self.info.name,
            self.info.ordinal,
            self.arch,
            self.info.compute_units,
            self.limits.warp_size,
            self.hip.path()
        )
    }
}
