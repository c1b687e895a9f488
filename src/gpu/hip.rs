//! The HIP runtime (`libamdhip64.so`, else `.so.7` / `.so.6` / `.so.5`, or the file
//! `$TRIDENT_LIBAMDHIP64` names), loaded at run time: the entry-point table, the device queries
//! behind `trident info` and `--device hip`, and the module / launch / memory entry points that
//! `trident check gpu` uses on AMD (with owning wrappers: `HipBuffer`, `HipLoadedModule`) and the
//! HIP Device will use.
//!
//! Device facts come from `hipDeviceGetName`, `hipDeviceTotalMem` and `hipDeviceGetAttribute`,
//! whose signatures and attribute values are stable across ROCm 5 and 6. `hipDeviceProp_t` is
//! not: ROCm 6 inserted fields (the `R0600` layout) and the struct size changed. The gfx
//! architecture (`gcnArchName`) exists only in that struct, so it is found without trusting any
//! offset: the struct is written into a zeroed buffer far larger than any ROCm's struct, and the
//! architecture is the first NUL-preceded string after the 256-byte `name` (at offset 0 in every
//! layout) that reads `gfx<hex digits>`, optionally followed by `:<features>`. If no such string
//! is found the architecture is reported as unknown rather than guessed.

use super::dl::{api_table, candidates, Library};
use super::status::hip_error;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr};

pub type HipDevice = i32;
pub type HipModule = *mut c_void;
pub type HipFunction = *mut c_void;
pub type HipStream = *mut c_void;
pub type HipEvent = *mut c_void;
/// `hipDeviceptr_t` is a `void*` on AMD.
pub type HipDevicePtr = *mut c_void;

pub const LIBAMDHIP64_VAR: &str = "TRIDENT_LIBAMDHIP64";
/// The unversioned name (present with the -dev package), then the runtime sonames, newest first.
pub const LIBAMDHIP64_SONAMES: &[&str] =
    &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// `hipDeviceAttribute_t` values used here, from `hip_runtime_api.h` (ROCm 5 and 6 agree).
pub mod attribute {
    pub const MAX_THREADS_PER_BLOCK: i32 = 56;
    pub const MULTIPROCESSOR_COUNT: i32 = 63;
    pub const WARP_SIZE: i32 = 87;
}

/// Bytes handed to `hipGetDeviceProperties`: several times the largest `hipDeviceProp_t` of any
/// ROCm (about 1.5 KiB in ROCm 6), so a newer, larger layout still writes inside the buffer.
const DEVICE_PROP_BUFFER_BYTES: usize = 16 << 10;
/// `hipDeviceProp_t.name` is `char[256]` at offset 0 in every layout.
const DEVICE_PROP_NAME_BYTES: usize = 256;

api_table! {
    /// HIP runtime entry points, as declared in `hip_runtime_api.h`.
    HipApi {
        fn hipInit(flags: u32) -> i32;
        fn hipDriverGetVersion(version: *mut i32) -> i32;
        fn hipRuntimeGetVersion(version: *mut i32) -> i32;
        fn hipGetDeviceCount(count: *mut i32) -> i32;
        fn hipDeviceGet(device: *mut HipDevice, ordinal: i32) -> i32;
        fn hipDeviceGetName(name: *mut c_char, len: i32, device: HipDevice) -> i32;
        fn hipDeviceTotalMem(bytes: *mut usize, device: HipDevice) -> i32;
        fn hipDeviceGetAttribute(value: *mut i32, attribute: i32, ordinal: i32) -> i32;
        fn hipGetDeviceProperties(properties: *mut c_void, ordinal: i32) -> i32;
        fn hipGetErrorName(code: i32) -> *const c_char;
        fn hipGetErrorString(code: i32) -> *const c_char;
        fn hipSetDevice(ordinal: i32) -> i32;
        fn hipModuleLoadData(module: *mut HipModule, image: *const c_void) -> i32;
        fn hipModuleUnload(module: HipModule) -> i32;
        fn hipModuleGetFunction(function: *mut HipFunction, module: HipModule, name: *const c_char) -> i32;
        fn hipModuleLaunchKernel(
            function: HipFunction,
            grid_x: u32, grid_y: u32, grid_z: u32,
            block_x: u32, block_y: u32, block_z: u32,
            shared_bytes: u32, stream: HipStream,
            params: *mut *mut c_void, extra: *mut *mut c_void,
        ) -> i32;
        fn hipMalloc(pointer: *mut HipDevicePtr, bytes: usize) -> i32;
        fn hipFree(pointer: HipDevicePtr) -> i32;
        fn hipMemcpyHtoD(destination: HipDevicePtr, source: *const c_void, bytes: usize) -> i32;
        fn hipMemcpyDtoH(destination: *mut c_void, source: HipDevicePtr, bytes: usize) -> i32;
        fn hipMemcpyDtoD(destination: HipDevicePtr, source: HipDevicePtr, bytes: usize) -> i32;
        fn hipMemsetD32(destination: HipDevicePtr, value: i32, count: usize) -> i32;
        fn hipStreamCreate(stream: *mut HipStream) -> i32;
        fn hipStreamDestroy(stream: HipStream) -> i32;
        fn hipStreamSynchronize(stream: HipStream) -> i32;
        fn hipDeviceSynchronize() -> i32;
        fn hipProfilerStart() -> i32;
        fn hipProfilerStop() -> i32;
        fn hipStreamCreateWithFlags(stream: *mut HipStream, flags: u32) -> i32;
        fn hipStreamQuery(stream: HipStream) -> i32;
        fn hipEventCreateWithFlags(event: *mut HipEvent, flags: u32) -> i32;
        fn hipEventRecord(event: HipEvent, stream: HipStream) -> i32;
        fn hipStreamWaitEvent(stream: HipStream, event: HipEvent, flags: u32) -> i32;
        fn hipEventDestroy(event: HipEvent) -> i32;
    }
}

/// `hipStreamNonBlocking`, `hipEventDisableTiming` and `hipErrorNotReady` (`hip_runtime_api.h`).
const HIP_STREAM_NON_BLOCKING: u32 = 1;
const HIP_EVENT_DISABLE_TIMING: u32 = 2;
const HIP_ERROR_NOT_READY: i32 = 600;

/// A communication stream (non-blocking) on the current device and two ordering events, as RCCL
/// on the HIP Device uses them: `after_compute` makes the stream wait for the work enqueued on
/// the null stream, `before_compute` the null stream for the work enqueued on this one, neither
/// blocking the host. Destroyed on drop.
pub struct HipStreams<'a> {
    hip: &'a Hip,
    pub stream: HipStream,
    compute_done: HipEvent,
    comm_done: HipEvent,
}

impl<'a> HipStreams<'a> {
    pub fn new(hip: &'a Hip) -> Result<HipStreams<'a>> {
        let mut s = HipStreams {
            hip,
            stream: std::ptr::null_mut(),
            compute_done: std::ptr::null_mut(),
            comm_done: std::ptr::null_mut(),
        };
        // SAFETY: each call writes one handle; the device was made current by the caller. A
        // failure leaves the handles made so far to the drop.
        unsafe {
            hip.check("hipStreamCreateWithFlags", hip.api.hipStreamCreateWithFlags(&mut s.stream, HIP_STREAM_NON_BLOCKING)?)?;
            hip.check("hipEventCreateWithFlags", hip.api.hipEventCreateWithFlags(&mut s.compute_done, HIP_EVENT_DISABLE_TIMING)?)?;
            hip.check("hipEventCreateWithFlags", hip.api.hipEventCreateWithFlags(&mut s.comm_done, HIP_EVENT_DISABLE_TIMING)?)?;
        }
        Ok(s)
    }

    pub fn after_compute(&self) -> Result<()> {
        // SAFETY: live handles; the null stream is the device's default stream; flags 0.
        unsafe {
            self.hip.check("hipEventRecord", self.hip.api.hipEventRecord(self.compute_done, std::ptr::null_mut())?)?;
            self.hip.check("hipStreamWaitEvent", self.hip.api.hipStreamWaitEvent(self.stream, self.compute_done, 0)?)
        }
    }

    pub fn before_compute(&self) -> Result<()> {
        // SAFETY: as above.
        unsafe {
            self.hip.check("hipEventRecord", self.hip.api.hipEventRecord(self.comm_done, self.stream)?)?;
            self.hip.check("hipStreamWaitEvent", self.hip.api.hipStreamWaitEvent(std::ptr::null_mut(), self.comm_done, 0)?)
        }
    }

    /// Whether every operation enqueued on the stream has finished (`hipStreamQuery`).
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: a live stream.
        match unsafe { self.hip.api.hipStreamQuery(self.stream) }? {
            0 => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            code => self.hip.check("hipStreamQuery", code).map(|_| false),
        }
    }
}

impl Drop for HipStreams<'_> {
    fn drop(&mut self) {
        // SAFETY: each non-null handle was created above and is destroyed once.
        unsafe {
            for e in [self.compute_done, self.comm_done] {
                if !e.is_null() {
                    let _ = self.hip.api.hipEventDestroy(e);
                }
            }
            if !self.stream.is_null() {
                let _ = self.hip.api.hipStreamDestroy(self.stream);
            }
        }
    }
}

/// One AMD GPU (a GCD on MI250X) as the runtime describes it.
#[derive(Clone, Debug)]
pub struct HipDeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// `gfx90a`, `gfx942`, ...; None when `hipGetDeviceProperties` gave no recognisable name.
    pub arch: Option<String>,
    pub compute_units: i32,
    pub total_bytes: usize,
}

/// The loaded HIP runtime. `hipInit` has succeeded once `Hip::load` returns.
pub struct Hip {
    pub api: HipApi,
}

impl Hip {
    /// Opens the HIP runtime (the file `$TRIDENT_LIBAMDHIP64` names, else the sonames) and
    /// initialises it.
    pub fn load() -> Result<Hip> {
        let files = candidates(LIBAMDHIP64_VAR, LIBAMDHIP64_SONAMES);
        let lib = Library::open_first(&files, "no ROCm on this machine").map_err(|e| match e {
            // The sonames are one library to a reader: name the first, not the list.
            Error::GpuLibrary { problem, .. } if std::env::var_os(LIBAMDHIP64_VAR).is_none() => {
                Error::GpuLibrary { library: LIBAMDHIP64_SONAMES[0].into(), problem }
            }
            other => other,
        })?;
        let hip = Hip { api: HipApi::new(lib.locate("hipInit")) };
        // SAFETY: hipInit takes flags 0 and has no pointer arguments.
        hip.check("hipInit", unsafe { hip.api.hipInit(0) }?)?;
        Ok(hip)
    }

    pub fn path(&self) -> String {
        self.api.lib.shown_name()
    }

    /// Turns a status code into `Ok` or an error named by the runtime itself when it can.
    pub fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(hip_error(call, code, self.describe(code)))
    }

    fn describe(&self, code: i32) -> Option<(String, String)> {
        // SAFETY: both return pointers to static strings owned by the runtime (or null), copied
        // at once.
        unsafe {
            let name = self.api.hipGetErrorName(code).ok().filter(|p| !p.is_null())?;
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let message = match self.api.hipGetErrorString(code) {
                Ok(p) if !p.is_null() => CStr::from_ptr(p).to_string_lossy().into_owned(),
                _ => "no description".into(),
            };
            Some((name, message))
        }
    }

    /// The HIP runtime version (`hipRuntimeGetVersion`), as "major.minor.patch".
    pub fn runtime_version(&self) -> Result<String> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipRuntimeGetVersion", unsafe { self.api.hipRuntimeGetVersion(&mut v) }?)?;
        Ok(version_string(v))
    }

    /// The driver version number as `hipDriverGetVersion` gives it (its encoding is not
    /// documented as HIP_VERSION's, so it is shown as the number).
    pub fn driver_version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDriverGetVersion", unsafe { self.api.hipDriverGetVersion(&mut v) }?)?;
        Ok(v)
    }

    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("hipGetDeviceCount", unsafe { self.api.hipGetDeviceCount(&mut n) }?)?;
        Ok(n.max(0) as usize)
    }

    fn attribute(&self, ordinal: usize, attribute: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceGetAttribute", unsafe {
            self.api.hipDeviceGetAttribute(&mut v, attribute, ordinal as i32)
        }?)?;
        Ok(v)
    }

    /// Name, gfx architecture (when found), compute units and memory of device `ordinal`.
    pub fn device_info(&self, ordinal: usize) -> Result<HipDeviceInfo> {
        let mut device = 0;
        // SAFETY: writes one hipDevice_t (an int).
        self.check("hipDeviceGet", unsafe { self.api.hipDeviceGet(&mut device, ordinal as i32) }?)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and 255 is passed, so the last byte stays NUL.
        self.check("hipDeviceGetName", unsafe { self.api.hipDeviceGetName(name.as_mut_ptr(), 255, device) }?)?;
        // SAFETY: NUL-terminated within the buffer (its last byte is never written).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let mut total_bytes = 0usize;
        // SAFETY: writes one size_t.
        self.check("hipDeviceTotalMem", unsafe { self.api.hipDeviceTotalMem(&mut total_bytes, device) }?)?;
        let compute_units = self.attribute(ordinal, attribute::MULTIPROCESSOR_COUNT)?;
        Ok(HipDeviceInfo { ordinal, name, arch: self.arch(ordinal), compute_units, total_bytes })
    }

    /// The gfx architecture from `hipDeviceProp_t.gcnArchName`, found by content (module doc).
    /// Any failure (a missing symbol, an error code, no such string) is None: the architecture
    /// is a detail of `trident info`, not a reason to fail it.
    fn arch(&self, ordinal: usize) -> Option<String> {
        // u64 elements: the buffer is aligned for every field the runtime writes.
        let mut buffer = vec![0u64; DEVICE_PROP_BUFFER_BYTES / 8];
        // SAFETY: the runtime writes one hipDeviceProp_t (at most a few KiB in any ROCm) into a
        // zeroed, 8-byte aligned buffer of DEVICE_PROP_BUFFER_BYTES.
        let code = unsafe { self.api.hipGetDeviceProperties(buffer.as_mut_ptr().cast(), ordinal as i32) }.ok()?;
        if code != 0 {
            return None;
        }
        // SAFETY: a u64 slice viewed as its bytes; same allocation, length in bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), DEVICE_PROP_BUFFER_BYTES) };
        find_gfx_arch(bytes, DEVICE_PROP_NAME_BYTES)
    }
}

/// Device memory from `hipMalloc`, freed when dropped.
pub struct HipBuffer<'a> {
    hip: &'a Hip,
    pub pointer: HipDevicePtr,
    pub bytes: usize,
}

impl<'a> HipBuffer<'a> {
    /// `bytes` of memory on the current device.
    pub fn alloc(hip: &'a Hip, bytes: usize) -> Result<HipBuffer<'a>> {
        let mut pointer: HipDevicePtr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        hip.check("hipMalloc", unsafe { hip.api.hipMalloc(&mut pointer, bytes) }?)?;
        Ok(HipBuffer { hip, pointer, bytes })
    }

    /// Copies `data` (exactly the buffer's size) to the device.
    pub fn upload(&self, data: &[u8]) -> Result<()> {
        assert_eq!(data.len(), self.bytes, "upload of a different size than the buffer");
        // SAFETY: the device buffer and the host slice both hold self.bytes bytes.
        self.hip.check("hipMemcpyHtoD", unsafe {
            self.hip.api.hipMemcpyHtoD(self.pointer, data.as_ptr().cast(), self.bytes)
        }?)
    }

    /// Copies the buffer back into `data` (exactly the buffer's size).
    pub fn download(&self, data: &mut [u8]) -> Result<()> {
        assert_eq!(data.len(), self.bytes, "download of a different size than the buffer");
        // SAFETY: the device buffer and the host slice both hold self.bytes bytes.
        self.hip.check("hipMemcpyDtoH", unsafe {
            self.hip.api.hipMemcpyDtoH(data.as_mut_ptr().cast(), self.pointer, self.bytes)
        }?)
    }
}

impl Drop for HipBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from hipMalloc and is freed once.
        let _ = unsafe { self.hip.api.hipFree(self.pointer) };
    }
}

/// A code object loaded with `hipModuleLoadData`, unloaded when dropped.
pub struct HipLoadedModule<'a> {
    hip: &'a Hip,
    module: HipModule,
}

impl<'a> HipLoadedModule<'a> {
    /// Loads `code` (an AMD code object) on the current device.
    pub fn load(hip: &'a Hip, code: &[u8]) -> Result<HipLoadedModule<'a>> {
        let mut module: HipModule = std::ptr::null_mut();
        // SAFETY: code is a complete code object in memory for the duration of the call (the
        // runtime copies what it keeps); writes one module handle.
        hip.check("hipModuleLoadData", unsafe { hip.api.hipModuleLoadData(&mut module, code.as_ptr().cast()) }?)?;
        Ok(HipLoadedModule { hip, module })
    }

    /// The kernel `name` of the module.
    pub fn function(&self, name: &str) -> Result<HipFunction> {
        let c = std::ffi::CString::new(name)
            .map_err(|_| Error::Config(format!("kernel name {name:?} contains a NUL byte")))?;
        let mut function: HipFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; c is a C string; writes one function handle.
        self.hip.check("hipModuleGetFunction", unsafe {
            self.hip.api.hipModuleGetFunction(&mut function, self.module, c.as_ptr())
        }?)?;
        Ok(function)
    }
}

impl Drop for HipLoadedModule<'_> {
    fn drop(&mut self) {
        // SAFETY: the module came from hipModuleLoadData and is unloaded once.
        let _ = unsafe { self.hip.api.hipModuleUnload(self.module) };
    }
}

/// The first string in `bytes[from..]` that starts after a NUL and reads `gfx` + hex digits,
/// ending in NUL or `:` (the target features, `gfx90a:sramecc+:xnack-`). Returns the `gfx...`
/// part, which is what `--offload-arch` takes.
pub fn find_gfx_arch(bytes: &[u8], from: usize) -> Option<String> {
    let mut at = from.max(1);
    while at + 4 < bytes.len() {
        if bytes[at - 1] == 0 && bytes[at..].starts_with(b"gfx") {
            let rest = &bytes[at + 3..];
            let digits = rest.iter().take_while(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()).count();
            let end = rest.get(digits).copied();
            if digits > 0 && (end == Some(0) || end == Some(b':')) {
                return Some(String::from_utf8_lossy(&bytes[at..at + 3 + digits]).into_owned());
            }
        }
        at += 1;
    }
    None
}

/// "major.minor.patch" of a HIP version number (`HIP_VERSION`: major * 10^7 + minor * 10^5 + patch).
pub fn version_string(code: i32) -> String {
    format!("{}.{}.{}", code / 10_000_000, (code / 100_000) % 100, code % 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_versions_decode_like_hip_version_h() {
        assert_eq!(version_string(50_221_153), "5.2.21153");
        assert_eq!(version_string(60_342_131), "6.3.42131");
    }

    #[test]
    fn the_arch_is_found_by_content_after_the_name() {
        let mut props = vec![0u8; 2048];
        // A name that itself starts with gfx is skipped: it sits inside the first 256 bytes.
        props[..9].copy_from_slice(b"gfx1100 X");
        props[600..604].copy_from_slice(&[7, 0, 0, 0]); // an int field before the string
        props[1160..1182].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(find_gfx_arch(&props, 256).as_deref(), Some("gfx90a"));
        props[1160..1167].copy_from_slice(b"gfx942\0");
        assert_eq!(find_gfx_arch(&props, 256).as_deref(), Some("gfx942"));
        // Not an architecture: no digits, or a string that does not end where the name ends.
        let mut other = vec![0u8; 1024];
        other[300..304].copy_from_slice(b"gfx:");
        other[400..408].copy_from_slice(b"gfx90az!");
        assert_eq!(find_gfx_arch(&other, 256), None);
        assert_eq!(find_gfx_arch(&[0u8; 8], 256), None);
    }
}
