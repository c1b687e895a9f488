//! hipRTC (`libhiprtc.so`, else `.so.7` / `.so.6` / `.so.5`, else the HIP runtime
//! `libamdhip64.so` / `.so.5`, or the file `$TRIDENT_HIPRTC` names), loaded at run time: the
//! entry-point table, the version query of `trident info`, and `compile`, which turns HIP source
//! (with its headers passed by include name) into an AMD code object for one `gfx` architecture
//! (`--offload-arch=gfx90a`). ROCm 5 ships hipRTC inside `libamdhip64.so` (Debian's ROCm 5.2
//! does), hence the fallback; its compiler needs no GPU, so the tests compile for real with it.

use super::dl::{api_table, candidates, Library};
use super::rtc::{one_line, ProgramText};
use super::status::hiprtc_error;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr};

pub type HiprtcProgram = *mut c_void;

pub const HIPRTC_VAR: &str = "TRIDENT_HIPRTC";
/// The hipRTC library of ROCm 6 and 7 first, then ROCm 5's HIP runtime, which contains hipRTC.
pub const HIPRTC_SONAMES: &[&str] =
    &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "libamdhip64.so.5"];

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

/// A code object compiled by hipRTC, and its log (warnings; empty when there were none).
pub struct HipCode {
    pub code: Vec<u8>,
    pub log: String,
}

/// A hipRTC program, destroyed when dropped.
struct Program<'a> {
    api: &'a HiprtcApi,
    handle: HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from hiprtcCreateProgram and is destroyed once.
        let _ = unsafe { self.api.hiprtcDestroyProgram(&mut self.handle) };
    }
}

/// Whether `arch` reads `gfx` + lowercase hex digits (`gfx90a`, `gfx942`), what `--offload-arch`
/// takes.
pub fn is_gfx_arch(arch: &str) -> bool {
    arch.strip_prefix("gfx")
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
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

    /// Compiles `source` (named `name` in messages) to a code object for `arch` (a `gfx...`) with
    /// extra `options`; `headers` are (include name, text) pairs that `#include "name"` resolves
    /// to. A failed compilation is one error carrying hipRTC's log on one line.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: &str,
        options: &[String],
    ) -> Result<HipCode> {
        if !is_gfx_arch(arch) {
            return Err(Error::Config(format!(
                "kernel {name}: '{arch}' is not an AMD GPU architecture (expected gfx followed by its number, e.g. gfx90a, gfx942)"
            )));
        }
        let mut all_options = vec![format!("--offload-arch={arch}")];
        all_options.extend(options.iter().cloned());
        let text = ProgramText::new(name, &format!("{name}.hip"), source, headers, &all_options)?;
        let (header_texts, header_names) = text.headers();

        let mut handle: HiprtcProgram = std::ptr::null_mut();
        // SAFETY: source, name and the headers' texts and names are C strings that `text` keeps
        // alive for the call (hipRTC copies them); the two header arrays hold
        // `text.header_count()` pointers each (null when there are none).
        self.check("hiprtcCreateProgram", unsafe {
            self.api.hiprtcCreateProgram(
                &mut handle,
                text.source(),
                text.name(),
                text.header_count(),
                header_texts,
                header_names,
            )
        }?)?;
        let program = Program { api: &self.api, handle };
        // SAFETY: the option array holds `text.option_count()` C strings alive for the call.
        let status = unsafe { self.api.hiprtcCompileProgram(program.handle, text.option_count(), text.options()) }?;
        let log = self.log(&program)?;
        if status != 0 {
            let detail = format!("kernel {name} for {arch}: {}", one_line(&log));
            return Err(hiprtc_error("hiprtcCompileProgram", status, Some(detail)));
        }
        let mut n = 0;
        // SAFETY: writes one size_t.
        self.check("hiprtcGetCodeSize", unsafe { self.api.hiprtcGetCodeSize(program.handle, &mut n) }?)?;
        let mut code = vec![0u8; n];
        // SAFETY: the buffer holds exactly the size hipRTC reported.
        self.check("hiprtcGetCode", unsafe { self.api.hiprtcGetCode(program.handle, code.as_mut_ptr().cast()) }?)?;
        if code.is_empty() {
            return Err(Error::Config(format!(
                "kernel {name} for {arch}: hipRTC reported success but produced no code"
            )));
        }
        Ok(HipCode { code, log })
    }

    fn log(&self, program: &Program) -> Result<String> {
        let mut n = 0;
        // SAFETY: writes one size_t (including the NUL).
        self.check("hiprtcGetProgramLogSize", unsafe { self.api.hiprtcGetProgramLogSize(program.handle, &mut n) }?)?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: the buffer holds at least the size hipRTC reported.
        self.check("hiprtcGetProgramLog", unsafe {
            self.api.hiprtcGetProgramLog(program.handle, buf.as_mut_ptr().cast())
        }?)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_string())
    }

    /// hipRTC's (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        self.check("hiprtcVersion", unsafe { self.api.hiprtcVersion(&mut major, &mut minor) }?)?;
        Ok((major, minor))
    }
}

#[cfg(test)]
mod tests {
    use super::is_gfx_arch;

    #[test]
    fn gfx_architectures_are_recognised() {
        for ok in ["gfx90a", "gfx942", "gfx908", "gfx1100"] {
            assert!(is_gfx_arch(ok), "{ok}");
        }
        for bad in ["", "gfx", "sm_80", "gfx90A", "gfx90a:xnack-", "gfx 90a"] {
            assert!(!is_gfx_arch(bad), "{bad}");
        }
    }
}
