//! The CUDA driver API (`libcuda.so.1`), loaded at run time: the entry-point table, device
//! queries for `trident info` and `--device cuda`, and the small owned wrappers (primary context,
//! module, device buffer) that `make gpu-check` launches a kernel through. The CUDA Device
//! (`device.rs`) is built on the same table.

use super::dl::{api_table, candidates, Library};
use super::launch::DeviceLimits;
use super::status::cuda_error;
use crate::error::Result;
use std::ffi::{c_char, c_void, CStr, CString};

pub type CuDevice = i32;
pub type CuContext = *mut c_void;
pub type CuModule = *mut c_void;
pub type CuFunction = *mut c_void;
pub type CuStream = *mut c_void;
pub type CuDevicePtr = u64;
pub type CuEvent = *mut c_void;

/// The soname of the driver library, and the variable that names another file instead.
pub const LIBCUDA: &str = "libcuda.so.1";
pub const LIBCUDA_VAR: &str = "TRIDENT_LIBCUDA";

/// `CUdevice_attribute` values used here, from `cuda.h`.
pub mod attribute {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const WARP_SIZE: i32 = 10;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
}

api_table! {
    /// Driver entry points, with the `_v2` names the driver exports for the current ABI.
    CudaApi {
        fn cuInit(flags: u32) -> i32;
        fn cuDriverGetVersion(version: *mut i32) -> i32;
        fn cuDeviceGetCount(count: *mut i32) -> i32;
        fn cuDeviceGet(device: *mut CuDevice, ordinal: i32) -> i32;
        fn cuDeviceGetName(name: *mut c_char, len: i32, device: CuDevice) -> i32;
        fn cuDeviceGetAttribute(value: *mut i32, attribute: i32, device: CuDevice) -> i32;
        fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) -> i32;
        fn cuGetErrorName(code: i32, name: *mut *const c_char) -> i32;
        fn cuGetErrorString(code: i32, message: *mut *const c_char) -> i32;
        fn cuDevicePrimaryCtxRetain(context: *mut CuContext, device: CuDevice) -> i32;
        fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) -> i32;
        fn cuCtxCreate_v2(context: *mut CuContext, flags: u32, device: CuDevice) -> i32;
        fn cuCtxSetCurrent(context: CuContext) -> i32;
        fn cuCtxSynchronize() -> i32;
        fn cuProfilerStart() -> i32;
        fn cuProfilerStop() -> i32;
        fn cuModuleLoadData(module: *mut CuModule, image: *const c_void) -> i32;
        fn cuModuleUnload(module: CuModule) -> i32;
        fn cuModuleGetFunction(function: *mut CuFunction, module: CuModule, name: *const c_char) -> i32;
        fn cuLaunchKernel(
            function: CuFunction,
            grid_x: u32, grid_y: u32, grid_z: u32,
            block_x: u32, block_y: u32, block_z: u32,
            shared_bytes: u32, stream: CuStream,
            params: *mut *mut c_void, extra: *mut *mut c_void,
        ) -> i32;
        fn cuMemAlloc_v2(pointer: *mut CuDevicePtr, bytes: usize) -> i32;
        fn cuMemFree_v2(pointer: CuDevicePtr) -> i32;
        fn cuMemcpyHtoD_v2(destination: CuDevicePtr, source: *const c_void, bytes: usize) -> i32;
        fn cuMemcpyDtoH_v2(destination: *mut c_void, source: CuDevicePtr, bytes: usize) -> i32;
        fn cuMemcpyDtoD_v2(destination: CuDevicePtr, source: CuDevicePtr, bytes: usize) -> i32;
        fn cuMemsetD32_v2(destination: CuDevicePtr, value: u32, count: usize) -> i32;
        fn cuStreamCreate(stream: *mut CuStream, flags: u32) -> i32;
        fn cuStreamDestroy_v2(stream: CuStream) -> i32;
        fn cuStreamSynchronize(stream: CuStream) -> i32;
        // Streams and events for the NCCL Comm and the CUDA benchmarks (collectives.rs, cmd/bench/gpu/mod.rs).
        fn cuStreamQuery(stream: CuStream) -> i32;
        fn cuStreamWaitEvent(stream: CuStream, event: CuEvent, flags: u32) -> i32;
        fn cuEventCreate(event: *mut CuEvent, flags: u32) -> i32;
        fn cuEventRecord(event: CuEvent, stream: CuStream) -> i32;
        fn cuEventQuery(event: CuEvent) -> i32;
        fn cuEventSynchronize(event: CuEvent) -> i32;
        fn cuEventElapsedTime(ms: *mut f32, start: CuEvent, end: CuEvent) -> i32;
        fn cuEventDestroy_v2(event: CuEvent) -> i32;
        // The sm_90a GEMMs (cuda_runtime.rs): more than 48 KiB of dynamic shared memory, TMA maps.
        fn cuFuncSetAttribute(function: CuFunction, attribute: i32, value: i32) -> i32;
        fn cuTensorMapEncodeTiled(
            map: *mut c_void, data_type: i32, rank: u32, address: *mut c_void,
            dims: *const u64, strides: *const u64, boxes: *const u32, element_strides: *const u32,
            interleave: i32, swizzle: i32, l2_promotion: i32, oob_fill: i32,
        ) -> i32;
    }
}

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
pub const FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;

/// One GPU as the driver describes it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_bytes: usize,
    pub limits: DeviceLimits,
}

impl DeviceInfo {
    /// The NVRTC architecture for this device: `sm_80`, `sm_90`, ...
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The loaded driver library. `cuInit` has been called successfully once `Driver::load` returns.
pub struct Driver {
    pub api: CudaApi,
}

impl Driver {
    /// Opens `libcuda.so.1` (or `$TRIDENT_LIBCUDA`) and initialises it.
    pub fn load() -> Result<Driver> {
        let lib = Library::open_first(&candidates(LIBCUDA_VAR, &[LIBCUDA]), "no NVIDIA driver on this machine")?;
        let driver = Driver { api: CudaApi::new(lib.locate("cuInit")) };
        // SAFETY: cuInit takes flags 0 and has no pointer arguments.
        driver.check("cuInit", unsafe { driver.api.cuInit(0) }?)?;
        Ok(driver)
    }

    /// Where the library was found.
    pub fn path(&self) -> String {
        self.api.lib.shown_name()
    }

    /// Turns a status code into `Ok` or an error named by the driver itself when it can.
    pub fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(cuda_error(call, code, self.describe(code)))
    }

    fn describe(&self, code: i32) -> Option<(String, String)> {
        let mut name: *const c_char = std::ptr::null();
        let mut message: *const c_char = std::ptr::null();
        // SAFETY: both calls write a pointer to a static string owned by the driver (or leave
        // it null for an unknown code); the strings are copied before anything else happens.
        unsafe {
            if self.api.cuGetErrorName(code, &mut name).ok()? != 0 || name.is_null() {
                return None;
            }
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let message = match self.api.cuGetErrorString(code, &mut message) {
                Ok(0) if !message.is_null() => CStr::from_ptr(message).to_string_lossy().into_owned(),
                _ => "no description".into(),
            };
            Some((name, message))
        }
    }

    /// The CUDA version the driver supports, as (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDriverGetVersion", unsafe { self.api.cuDriverGetVersion(&mut v) }?)?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetCount", unsafe { self.api.cuDeviceGetCount(&mut n) }?)?;
        Ok(n.max(0) as usize)
    }

    pub fn device(&self, ordinal: usize) -> Result<CuDevice> {
        let mut d = 0;
        // SAFETY: writes one CUdevice (an int).
        self.check("cuDeviceGet", unsafe { self.api.cuDeviceGet(&mut d, ordinal as i32) }?)?;
        Ok(d)
    }

    fn attribute(&self, device: CuDevice, attribute: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetAttribute", unsafe { self.api.cuDeviceGetAttribute(&mut v, attribute, device) }?)?;
        Ok(v)
    }

    /// Name, compute capability, SM count, memory and launch limits of device `ordinal`.
    pub fn device_info(&self, ordinal: usize) -> Result<DeviceInfo> {
        use attribute::*;
        let device = self.device(ordinal)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and its length is passed; the driver NUL-terminates.
        self.check("cuDeviceGetName", unsafe { self.api.cuDeviceGetName(name.as_mut_ptr(), 256, device) }?)?;
        // SAFETY: NUL-terminated within the buffer (the last byte is never written by a 255-char name).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let mut total_bytes = 0usize;
        // SAFETY: writes one size_t.
        self.check("cuDeviceTotalMem_v2", unsafe { self.api.cuDeviceTotalMem_v2(&mut total_bytes, device) }?)?;
        let a = |attr| self.attribute(device, attr).map(|v| v.max(0) as u32);
        let limits = DeviceLimits {
            max_threads_per_block: a(MAX_THREADS_PER_BLOCK)?,
            max_block: [a(MAX_BLOCK_DIM_X)?, a(MAX_BLOCK_DIM_Y)?, a(MAX_BLOCK_DIM_Z)?],
            max_grid: [a(MAX_GRID_DIM_X)?, a(MAX_GRID_DIM_Y)?, a(MAX_GRID_DIM_Z)?],
            shared_bytes_per_block: a(MAX_SHARED_MEMORY_PER_BLOCK)?,
            shared_bytes_optin: a(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            warp_size: a(WARP_SIZE)?,
        };
        Ok(DeviceInfo {
            ordinal,
            name,
            compute_capability: (
                self.attribute(device, COMPUTE_CAPABILITY_MAJOR)?,
                self.attribute(device, COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessors: self.attribute(device, MULTIPROCESSOR_COUNT)?,
            total_bytes,
            limits,
        })
    }
}

/// The primary context of one device, retained and made current on this thread; released on drop.
pub struct PrimaryContext<'d> {
    driver: &'d Driver,
    device: CuDevice,
}

impl<'d> PrimaryContext<'d> {
    pub fn retain(driver: &'d Driver, ordinal: usize) -> Result<PrimaryContext<'d>> {
        let device = driver.device(ordinal)?;
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: writes one context handle for a device the driver just returned.
        driver
            .check("cuDevicePrimaryCtxRetain", unsafe { driver.api.cuDevicePrimaryCtxRetain(&mut context, device) }?)?;
        let retained = PrimaryContext { driver, device };
        // SAFETY: the context was retained above and stays alive until this value drops.
        driver.check("cuCtxSetCurrent", unsafe { driver.api.cuCtxSetCurrent(context) }?)?;
        Ok(retained)
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a context is current (set in retain).
        self.driver.check("cuCtxSynchronize", unsafe { self.driver.api.cuCtxSynchronize() }?)
    }
}

impl Drop for PrimaryContext<'_> {
    fn drop(&mut self) {
        // SAFETY: balances the retain of this value; errors at teardown are not actionable.
        let _ = unsafe { self.driver.api.cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// A loaded module (CUBIN or PTX image); unloaded on drop.
pub struct Module<'c> {
    driver: &'c Driver,
    handle: CuModule,
}

impl<'c> Module<'c> {
    /// Loads `image` into the current context. A PTX image must end in a NUL byte.
    pub fn load(context: &'c PrimaryContext<'c>, image: &[u8]) -> Result<Module<'c>> {
        let driver = context.driver;
        let mut handle: CuModule = std::ptr::null_mut();
        // SAFETY: image outlives the call (the driver copies it); a context is current.
        driver
            .check("cuModuleLoadData", unsafe { driver.api.cuModuleLoadData(&mut handle, image.as_ptr().cast()) }?)?;
        Ok(Module { driver, handle })
    }

    pub fn function(&self, name: &str) -> Result<CuFunction> {
        let c = CString::new(name).expect("kernel names are identifiers");
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; c is a C string; writes one function handle.
        self.driver.check("cuModuleGetFunction", unsafe {
            self.driver.api.cuModuleGetFunction(&mut f, self.handle, c.as_ptr())
        }?)?;
        Ok(f)
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuModuleLoadData and is unloaded once.
        let _ = unsafe { self.driver.api.cuModuleUnload(self.handle) };
    }
}

/// A device allocation of `bytes`; freed on drop.
pub struct DeviceBuffer<'c> {
    driver: &'c Driver,
    pub pointer: CuDevicePtr,
    pub bytes: usize,
}

impl<'c> DeviceBuffer<'c> {
    pub fn alloc(context: &'c PrimaryContext<'c>, bytes: usize) -> Result<DeviceBuffer<'c>> {
        let driver = context.driver;
        let mut pointer = 0;
        // SAFETY: writes one device pointer; a context is current.
        driver.check("cuMemAlloc_v2", unsafe { driver.api.cuMemAlloc_v2(&mut pointer, bytes) }?)?;
        Ok(DeviceBuffer { driver, pointer, bytes })
    }

    pub fn upload(&self, host: &[u8]) -> Result<()> {
        assert_eq!(host.len(), self.bytes, "upload: host and device sizes differ");
        // SAFETY: both ranges are `bytes` long; the copy is synchronous.
        self.driver.check("cuMemcpyHtoD_v2", unsafe {
            self.driver.api.cuMemcpyHtoD_v2(self.pointer, host.as_ptr().cast(), self.bytes)
        }?)
    }

    pub fn download(&self, host: &mut [u8]) -> Result<()> {
        assert_eq!(host.len(), self.bytes, "download: host and device sizes differ");
        // SAFETY: both ranges are `bytes` long; the copy is synchronous.
        self.driver.check("cuMemcpyDtoH_v2", unsafe {
            self.driver.api.cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), self.pointer, self.bytes)
        }?)
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc_v2 and is freed once.
        let _ = unsafe { self.driver.api.cuMemFree_v2(self.pointer) };
    }
}

// Streams and events: the NCCL Comm's communication stream, its ordering against a compute stream,
// and the CUDA benchmarks' timers (collectives.rs, cmd/bench/gpu/mod.rs).

/// `CUresult` values the stream and event wrappers tell apart.
pub const CUDA_SUCCESS: i32 = 0;
pub const CUDA_ERROR_NOT_READY: i32 = 600;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: u32 = 1;
/// `CU_EVENT_DEFAULT` (timing enabled) and `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DEFAULT: u32 = 0;
pub const CU_EVENT_DISABLE_TIMING: u32 = 2;

/// A stream created in the current context; destroyed on drop.
pub struct Stream<'d> {
    driver: &'d Driver,
    pub handle: CuStream,
}

impl<'d> Stream<'d> {
    /// A stream that does not synchronize with the legacy default stream.
    pub fn non_blocking(driver: &'d Driver) -> Result<Stream<'d>> {
        let mut handle: CuStream = std::ptr::null_mut();
        // SAFETY: writes one stream handle; the caller has made a context current.
        driver.check("cuStreamCreate", unsafe { driver.api.cuStreamCreate(&mut handle, CU_STREAM_NON_BLOCKING) }?)?;
        Ok(Stream { driver, handle })
    }

    /// Whether every operation enqueued so far has finished (`cuStreamQuery`).
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: the handle is a live stream of this driver.
        match unsafe { self.driver.api.cuStreamQuery(self.handle) }? {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.driver.check("cuStreamQuery", code).map(|_| false),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is a live stream of this driver.
        self.driver.check("cuStreamSynchronize", unsafe { self.driver.api.cuStreamSynchronize(self.handle) }?)
    }

    pub fn driver(&self) -> &'d Driver {
        self.driver
    }

    /// Work enqueued on this stream from now on waits for `event`'s last recorded point.
    pub fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live; flags must be 0.
        self.driver
            .check("cuStreamWaitEvent", unsafe { self.driver.api.cuStreamWaitEvent(self.handle, event.handle, 0) }?)
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuStreamCreate and is destroyed once.
        let _ = unsafe { self.driver.api.cuStreamDestroy_v2(self.handle) };
    }
}

/// An event in the current context; destroyed on drop.
pub struct Event<'d> {
    driver: &'d Driver,
    pub handle: CuEvent,
}

impl<'d> Event<'d> {
    /// `timing`: the event can measure elapsed time (the benchmarks); without it, ordering only.
    pub fn new(driver: &'d Driver, timing: bool) -> Result<Event<'d>> {
        let mut handle: CuEvent = std::ptr::null_mut();
        let flags = if timing { CU_EVENT_DEFAULT } else { CU_EVENT_DISABLE_TIMING };
        // SAFETY: writes one event handle; the caller has made a context current.
        driver.check("cuEventCreate", unsafe { driver.api.cuEventCreate(&mut handle, flags) }?)?;
        Ok(Event { driver, handle })
    }

    /// Records the point of `stream` (None: the legacy default stream) reached by the work
    /// enqueued so far.
    pub fn record(&self, stream: Option<&Stream>) -> Result<()> {
        let stream = stream.map_or(std::ptr::null_mut(), |s| s.handle);
        // SAFETY: the event and the stream are live; a null stream is the default stream.
        self.driver.check("cuEventRecord", unsafe { self.driver.api.cuEventRecord(self.handle, stream) }?)
    }

    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: the event is live.
        match unsafe { self.driver.api.cuEventQuery(self.handle) }? {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.driver.check("cuEventQuery", code).map(|_| false),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is live.
        self.driver.check("cuEventSynchronize", unsafe { self.driver.api.cuEventSynchronize(self.handle) }?)
    }

    /// Milliseconds from `self` to `end`, both recorded and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: writes one float; both events are live.
        self.driver.check("cuEventElapsedTime", unsafe {
            self.driver.api.cuEventElapsedTime(&mut ms, self.handle, end.handle)
        }?)?;
        Ok(ms)
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuEventCreate and is destroyed once.
        let _ = unsafe { self.driver.api.cuEventDestroy_v2(self.handle) };
    }
}

impl<'c> DeviceBuffer<'c> {
    /// The driver this buffer was allocated through.
    pub fn driver(&self) -> &'c Driver {
        self.driver
    }
}

impl<'d> PrimaryContext<'d> {
    /// The driver this context belongs to.
    pub fn driver(&self) -> &'d Driver {
        self.driver
    }
}
