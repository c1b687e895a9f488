//! hipRTC (`libhiprtc.so`, else `.so.7` / `.so.6` / `.so.5`, or the file `$TRIDENT_HIPRTC` names), loaded
//! at run time: the entry-point table and the version query of `trident info`. Compiling HIP
//! source to a code object for a `gfx` architecture (`hiprtcCompileProgram`, `hiprtcGetCode`)
//! is declared here for the HIP Device, which is not built yet. Older ROCm 5 releases ship hipRTC
//! inside `libamdhip64.so`; `TRIDENT_HIPRTC` can name that file on such an install.

use super::dl::{api_table, candidates, Library};
use super::status::hiprtc_error;
use crate::error::Result;
use std::ffi::{c_char, c_void, CStr};

pub type HiprtcProgram = *mut c_void;

pub const HIPRTC_VAR: &str = "TRIDENT_HIPRTC";
pub const HIPRTC_SONAMES: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"];

api_table! {
    /// hipRTC entry points, as declared in `hiprtc.h`.
    HiprtcApi {
        fn hiprtcVersion(major: *mut i32, minor: *mut i32) -> i32;
        fn hiprtcCreateProgram(
            program: *mut HiprtcProgram, source: *const c_char, name: *const c_char,
            headers: i32, header_sources: *const *const c_char, header_names: *const *const c_char,
        ) -> i32;
        fn hiprtcCompileProgram(program: HiprtcProgram, options: i32, option_values: *const *const c_char) -> i32;
        fn hiprtcGetProgramLogSize(program: HiprtcProgram, bytes: *mut usize) -> i32;
        fn hiprtcGetProgramLog(program: HiprtcProgram, log: *mut c_char) -> i32;
        fn hiprtcGetCodeSize(program: HiprtcProgram, bytes: *mut usize) -> i32;
        fn hiprtcGetCode(program: HiprtcProgram, code: *mut c_char) -> i32;
        fn hiprtcDestroyProgram(program: *mut HiprtcProgram) -> i32;
        fn hiprtcGetErrorString(code: i32) -> *const c_char;
    }
}

pub struct Hiprtc {
    pub api: HiprtcApi,
}

impl Hiprtc {
    /// Opens the file `$TRIDENT_HIPRTC` names, else the sonames.
    pub fn load() -> Result<Hiprtc> {
        Hiprtc::open(&candidates(HIPRTC_VAR, HIPRTC_SONAMES))
    }

    pub fn open(files: &[String]) -> Result<Hiprtc> {
        let lib = Library::open_first(files, "no ROCm on this machine; set TRIDENT_HIPRTC to ROCm's libhiprtc.so")?;
        Ok(Hiprtc { api: HiprtcApi::new(lib.locate("hiprtcVersion")) })
    }

    pub fn path(&self) -> String {
        self.api.lib.shown_name()
    }

    pub fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a pointer to a static string (or null), copied at once.
        let message = match unsafe { self.api.hiprtcGetErrorString(code) } {
            // SAFETY: non-null, NUL-terminated, owned by the library.
            Ok(p) if !p.is_null() => Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()),
            _ => None,
        };
        Err(hiprtc_error(call, code, message))
    }

    /// hipRTC's (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        self.check("hiprtcVersion", unsafe { self.api.hiprtcVersion(&mut major, &mut minor) }?)?;
        Ok((major, minor))
    }
}
