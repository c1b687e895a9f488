//! `CudaRuntime`: the CUDA driver (driver.rs) as a `VendorRuntime`, which `runtime::Counted`
//! makes the GPU Device's and the GPU benches' `GpuRuntime`: the primary context of one device,
//! made current on every thread that calls in, and the modules it loaded. Launches and copies run
//! on the legacy default stream, in order.

use super::driver::{
    CuContext, CuFunction, CuModule, DeviceInfo, Driver, Event, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
};
use super::kernels::cuda::arch_for;
use super::launch::LaunchConfig;
use super::runtime::VendorRuntime;
use super::tma::{TensorMap, TiledMap, DATA_TYPE_BF16, SWIZZLE_128B};
use crate::error::{Error, Result};
use std::ffi::{c_void, CString};

/// The CUDA driver as a `VendorRuntime`: the primary context of one device, made current on every
/// thread that calls in, and the modules it loaded (unloaded on drop).
pub struct CudaRuntime {
    driver: Driver,
    info: DeviceInfo,
    context: CuContext,
    modules: std::sync::Mutex<Vec<CuModule>>,
    /// Functions opted in to more dynamic shared memory than the default, and how much.
    opted_in: std::sync::Mutex<Vec<(usize, u32)>>,
}

// SAFETY: the context and module handles are process-wide driver objects; the driver API is
// thread-safe, and each thread makes the context current before using it (`current`).
unsafe impl Send for CudaRuntime {}
// SAFETY: as above; the module list is behind a mutex.
unsafe impl Sync for CudaRuntime {}

thread_local! {
    static CONTEXT_SET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl CudaRuntime {
    /// Retains the primary context of device `ordinal` (compute capability 8.0 or newer).
    pub fn new(driver: Driver, ordinal: usize) -> Result<CudaRuntime> {
        let info = driver.device_info(ordinal)?;
        arch_for(info.compute_capability)?;
        let device = driver.device(ordinal)?;
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: writes one context handle for a device the driver just returned.
        driver
            .check("cuDevicePrimaryCtxRetain", unsafe { driver.api.cuDevicePrimaryCtxRetain(&mut context, device) }?)?;
        let rt = CudaRuntime {
            driver,
            info,
            context,
            modules: std::sync::Mutex::new(Vec::new()),
            opted_in: std::sync::Mutex::new(Vec::new()),
        };
        rt.current()?;
        Ok(rt)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Makes the context current on this thread (once per thread and context).
    fn current(&self) -> Result<()> {
        let key = self.context as usize;
        if CONTEXT_SET.with(|c| c.get()) == key {
            return Ok(());
        }
        // SAFETY: the context was retained in `new` and is released only on drop.
        self.driver.check("cuCtxSetCurrent", unsafe { self.driver.api.cuCtxSetCurrent(self.context) }?)?;
        CONTEXT_SET.with(|c| c.set(key));
        Ok(())
    }
}

impl CudaRuntime {
    /// Lets `function` use `bytes` of dynamic shared memory (once per function and amount).
    fn opt_in(&self, function: usize, bytes: u32) -> Result<()> {
        let mut done = self.opted_in.lock().unwrap_or_else(|p| p.into_inner());
        if done.iter().any(|&(f, b)| f == function && b >= bytes) {
            return Ok(());
        }
        // SAFETY: the handle came from cuModuleGetFunction on a loaded module; a context is current.
        self.driver.check("cuFuncSetAttribute", unsafe {
            self.driver.api.cuFuncSetAttribute(
                function as CuFunction,
                FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }?)?;
        done.push((function, bytes));
        Ok(())
    }
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        let _ = self.current();
        for m in self.modules.lock().map(|m| m.clone()).unwrap_or_default() {
            // SAFETY: each handle came from cuModuleLoadData and is unloaded once.
            let _ = unsafe { self.driver.api.cuModuleUnload(m) };
        }
        if let Ok(device) = self.driver.device(self.info.ordinal) {
            // SAFETY: balances the retain in `new`.
            let _ = unsafe { self.driver.api.cuDevicePrimaryCtxRelease_v2(device) };
        }
        CONTEXT_SET.with(|c| c.set(0));
    }
}

impl VendorRuntime for CudaRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.current()?;
        let mut p = 0;
        // SAFETY: writes one device pointer; a context is current.
        self.driver.check("cuMemAlloc_v2", unsafe { self.driver.api.cuMemAlloc_v2(&mut p, bytes) }?)?;
        Ok(p)
    }
    fn free(&self, pointer: u64, _bytes: usize) {
        let _ = self.current();
        // SAFETY: the pointer came from cuMemAlloc_v2 and `Counted` frees each block once.
        let _ = unsafe { self.driver.api.cuMemFree_v2(pointer) };
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: the caller's allocation at dst holds src.len() bytes; synchronous copy.
        self.driver
            .check("cuMemcpyHtoD_v2", unsafe { self.driver.api.cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) }?)
    }
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at src holds dst.len() bytes; synchronous after prior work.
        self.driver.check("cuMemcpyDtoH_v2", unsafe {
            self.driver.api.cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        }?)
    }
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both allocations hold `bytes` at these addresses; ordered on the default stream.
        self.driver.check("cuMemcpyDtoD_v2", unsafe { self.driver.api.cuMemcpyDtoD_v2(dst, src, bytes) }?)
    }
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at dst holds count words.
        self.driver.check("cuMemsetD32_v2", unsafe { self.driver.api.cuMemsetD32_v2(dst, value, count) }?)
    }
    fn load_module(&self, image: &[u8]) -> Result<usize> {
        self.current()?;
        let mut m: CuModule = std::ptr::null_mut();
        // SAFETY: the image outlives the call (the driver copies it).
        self.driver
            .check("cuModuleLoadData", unsafe { self.driver.api.cuModuleLoadData(&mut m, image.as_ptr().cast()) }?)?;
        self.modules.lock().expect("module list").push(m);
        Ok(m as usize)
    }
    fn function(&self, module: usize, name: &str) -> Result<usize> {
        self.current()?;
        let c = CString::new(name).map_err(|_| Error::Config(format!("kernel name {name:?}")))?;
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; writes one handle.
        self.driver.check("cuModuleGetFunction", unsafe {
            self.driver.api.cuModuleGetFunction(&mut f, module as CuModule, c.as_ptr())
        }?)?;
        Ok(f as usize)
    }
    fn launch(&self, function: usize, config: &LaunchConfig, params: &mut [*mut c_void]) -> Result<()> {
        self.current()?;
        if config.needs_shared_optin {
            self.opt_in(function, config.shared_bytes)?;
        }
        let (grid, block) = (config.grid, config.block);
        // SAFETY: params point to live arguments of the kernel's types (see `Arg`); the null
        // stream is the legacy default stream, ordered with the synchronous copies.
        self.driver.check("cuLaunchKernel", unsafe {
            self.driver.api.cuLaunchKernel(
                function as CuFunction,
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
    fn tensor_map(&self, map: &TiledMap) -> Result<TensorMap> {
        self.current()?;
        let mut out = TensorMap([0; 16]);
        let element_strides = [1u32; 2];
        // SAFETY: `out` is a 64-byte aligned 128-byte CUtensorMap; the arrays hold rank (2)
        // sizes, boxes and element strides and rank - 1 strides; the driver only reads them and
        // records the address, which the caller keeps alive while kernels use the map.
        self.driver.check("cuTensorMapEncodeTiled", unsafe {
            self.driver.api.cuTensorMapEncodeTiled(
                (&mut out as *mut TensorMap).cast(),
                DATA_TYPE_BF16,
                2,
                map.address as *mut c_void,
                map.dims.as_ptr(),
                map.strides.as_ptr(),
                map.boxes.as_ptr(),
                element_strides.as_ptr(),
                0,
                SWIZZLE_128B,
                0,
                0,
            )
        }?)?;
        Ok(out)
    }
    fn synchronize(&self) -> Result<()> {
        self.current()?;
        // SAFETY: a context is current.
        self.driver.check("cuCtxSynchronize", unsafe { self.driver.api.cuCtxSynchronize() }?)
    }
    fn profiler(&self, on: bool) -> Result<()> {
        self.current()?;
        // SAFETY: a context is current; neither call takes arguments.
        match on {
            true => self.driver.check("cuProfilerStart", unsafe { self.driver.api.cuProfilerStart() }?),
            false => self.driver.check("cuProfilerStop", unsafe { self.driver.api.cuProfilerStop() }?),
        }
    }
    fn time_with_events(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Option<Result<f64>> {
        Some((|| {
            self.current()?;
            let (start, end) = (Event::new(&self.driver, true)?, Event::new(&self.driver, true)?);
            start.record(None)?;
            enqueue()?;
            end.record(None)?;
            end.synchronize()?;
            Ok(f64::from(start.elapsed_ms(&end)?))
        })())
    }
    fn describe(&self) -> String {
        let driver = match self.driver.version() {
            Ok((major, minor)) => format!("CUDA {major}.{minor} driver"),
            Err(_) => "CUDA driver".into(),
        };
        format!(
            "cuda: {} (device {}, {}, {} SMs), {driver} {}",
            self.info.name,
            self.info.ordinal,
            self.info.arch(),
            self.info.multiprocessors,
            self.driver.path()
        )
    }
}
