//! NVRTC (`libnvrtc.so.13`, else `.12`, or the file `$TRIDENT_NVRTC` names), loaded at run time:
//! compiles CUDA C++ source to a CUBIN for `sm_XX` (or PTX for `compute_XX`). NVRTC needs no GPU
//! and no driver, so compilation is tested on any machine that has the library.

use super::dl::{api_table, candidates, Library};
use super::rtc::{one_line, ProgramText};
use super::status::nvrtc_error;
use crate::error::Result;
use std::ffi::{c_char, c_void, CStr};

pub type NvrtcProgram = *mut c_void;

pub const NVRTC_VAR: &str = "TRIDENT_NVRTC";
pub const NVRTC_SONAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12"];

api_table! {
    /// NVRTC entry points, as declared in `nvrtc.h`.
    NvrtcApi {
        fn nvrtcVersion(major: *mut i32, minor: *mut i32) -> i32;
        fn nvrtcCreateProgram(
            program: *mut NvrtcProgram, source: *const c_char, name: *const c_char,
            headers: i32, header_sources: *const *const c_char, header_names: *const *const c_char,
        ) -> i32;
        fn nvrtcCompileProgram(program: NvrtcProgram, options: i32, option_values: *const *const c_char) -> i32;
        fn nvrtcGetProgramLogSize(program: NvrtcProgram, bytes: *mut usize) -> i32;
        fn nvrtcGetProgramLog(program: NvrtcProgram, log: *mut c_char) -> i32;
        fn nvrtcGetCUBINSize(program: NvrtcProgram, bytes: *mut usize) -> i32;
        fn nvrtcGetCUBIN(program: NvrtcProgram, cubin: *mut c_char) -> i32;
        fn nvrtcGetPTXSize(program: NvrtcProgram, bytes: *mut usize) -> i32;
        fn nvrtcGetPTX(program: NvrtcProgram, ptx: *mut c_char) -> i32;
        fn nvrtcDestroyProgram(program: *mut NvrtcProgram) -> i32;
        fn nvrtcGetErrorString(code: i32) -> *const c_char;
    }
}

/// What a compilation produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// Machine code for one `sm_XX` architecture.
    Cubin,
    /// PTX for a `compute_XX` virtual architecture (NUL-terminated, as `cuModuleLoadData` wants).
    Ptx,
}

impl Image {
    /// Cubin for `sm_*`, PTX for `compute_*`; anything else is not an architecture.
    pub fn for_arch(arch: &str) -> Option<Image> {
        let digits = |s: &str| {
            !s.is_empty()
                && s.chars().next().is_some_and(|c| c.is_ascii_digit())
                && s.chars().all(|c| c.is_ascii_alphanumeric())
        };
        match arch.split_once('_') {
            Some(("sm", rest)) if digits(rest) => Some(Image::Cubin),
            Some(("compute", rest)) if digits(rest) => Some(Image::Ptx),
            _ => None,
        }
    }
}

pub struct Compiled {
    pub image: Image,
    pub bytes: Vec<u8>,
    /// NVRTC's log (warnings; empty when there were none).
    pub log: String,
}

pub struct Nvrtc {
    pub api: NvrtcApi,
}

/// Destroys the program on every exit path.
struct Program<'a> {
    api: &'a NvrtcApi,
    handle: NvrtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { self.api.nvrtcDestroyProgram(&mut self.handle) };
    }
}

impl Nvrtc {
    /// Opens NVRTC: `$TRIDENT_NVRTC` when set, else `libnvrtc.so.13`, then `.12`.
    pub fn load() -> Result<Nvrtc> {
        Nvrtc::open(&candidates(NVRTC_VAR, NVRTC_SONAMES))
    }

    /// Opens the first of `files` (sonames or paths) that loads.
    pub fn open(files: &[String]) -> Result<Nvrtc> {
        let lib = Library::open_first(
            files,
            "no CUDA toolkit on the library path; set TRIDENT_NVRTC to a libnvrtc.so.13, which `pip install nvidia-cuda-nvrtc` provides",
        )?;
        Ok(Nvrtc { api: NvrtcApi::new(lib.locate("nvrtcVersion")) })
    }

    pub fn path(&self) -> String {
        self.api.lib.shown_name()
    }

    fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(nvrtc_error(call, code, self.describe(code)))
    }

    /// NVRTC's own description of a code (for NVRTC, its name again), or the table's.
    pub fn describe(&self, code: i32) -> String {
        // SAFETY: returns a pointer to a static string (never freed), copied at once.
        match unsafe { self.api.nvrtcGetErrorString(code) } {
            // SAFETY: non-null, NUL-terminated, owned by the library.
            Ok(p) if !p.is_null() => unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
            _ => super::status::nvrtc_result_name(code),
        }
    }

    /// NVRTC's version, (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        self.check("nvrtcVersion", unsafe { self.api.nvrtcVersion(&mut major, &mut minor) }?)?;
        Ok((major, minor))
    }

    /// Compiles `source` (named `name` in messages) for `arch` with extra `options`. A failed
    /// compilation is one error carrying NVRTC's log on one line.
    pub fn compile(&self, name: &str, source: &str, arch: &str, options: &[String]) -> Result<Compiled> {
        self.compile_with_headers(name, source, &[], arch, options)
    }

    /// As `compile`, with `headers` as (include name, text) pairs that `#include "name"` in the
    /// source resolves to (NVRTC has no include path of its own and matches a name exactly, not
    /// against the including file's directory: every kernel file and header includes by the full
    /// name, `"common/base.cuh"`).
    pub fn compile_with_headers(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: &str,
        options: &[String],
    ) -> Result<Compiled> {
        let image = Image::for_arch(arch).ok_or_else(|| {
            crate::error::Error::Config(format!(
                "kernel {name}: '{arch}' is not a GPU architecture (expected sm_XX for a CUBIN or compute_XX for PTX, e.g. sm_80, sm_90a)"
            ))
        })?;
        let mut all_options = vec![format!("--gpu-architecture={arch}")];
        all_options.extend(options.iter().cloned());
        let text = ProgramText::new(name, &format!("{name}.cu"), source, headers, &all_options)?;
        let (header_texts, header_names) = text.headers();

        let mut handle: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: source, name and the headers' texts and names are C strings that `text` keeps
        // alive for the call (NVRTC copies them); the two header arrays hold
        // `text.header_count()` pointers each (null arrays when there are none, as NVRTC allows).
        self.check("nvrtcCreateProgram", unsafe {
            self.api.nvrtcCreateProgram(
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
        let status = unsafe { self.api.nvrtcCompileProgram(program.handle, text.option_count(), text.options()) }?;
        let log = self.log(&program)?;
        if status != 0 {
            return Err(nvrtc_error(
                "nvrtcCompileProgram",
                status,
                format!("kernel {name} for {arch}: {}", one_line(&log)),
            ));
        }
        let bytes = match image {
            Image::Cubin => {
                let mut n = 0;
                // SAFETY: writes one size_t.
                self.check("nvrtcGetCUBINSize", unsafe { self.api.nvrtcGetCUBINSize(program.handle, &mut n) }?)?;
                let mut buf = vec![0u8; n];
                // SAFETY: the buffer holds exactly the size NVRTC reported.
                self.check("nvrtcGetCUBIN", unsafe {
                    self.api.nvrtcGetCUBIN(program.handle, buf.as_mut_ptr().cast())
                }?)?;
                buf
            }
            Image::Ptx => {
                let mut n = 0;
                // SAFETY: writes one size_t (the size includes the terminating NUL).
                self.check("nvrtcGetPTXSize", unsafe { self.api.nvrtcGetPTXSize(program.handle, &mut n) }?)?;
                let mut buf = vec![0u8; n];
                // SAFETY: the buffer holds exactly the size NVRTC reported.
                self.check("nvrtcGetPTX", unsafe { self.api.nvrtcGetPTX(program.handle, buf.as_mut_ptr().cast()) }?)?;
                buf
            }
        };
        Ok(Compiled { image, bytes, log })
    }

    fn log(&self, program: &Program) -> Result<String> {
        let mut n = 0;
        // SAFETY: writes one size_t (including the NUL).
        self.check("nvrtcGetProgramLogSize", unsafe { self.api.nvrtcGetProgramLogSize(program.handle, &mut n) }?)?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: the buffer holds the size NVRTC reported.
        self.check("nvrtcGetProgramLog", unsafe {
            self.api.nvrtcGetProgramLog(program.handle, buf.as_mut_ptr().cast())
        }?)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::Image;

    #[test]
    fn architectures_choose_the_image() {
        assert_eq!(Image::for_arch("sm_80"), Some(Image::Cubin));
        assert_eq!(Image::for_arch("sm_90a"), Some(Image::Cubin));
        assert_eq!(Image::for_arch("compute_90"), Some(Image::Ptx));
        for bad in ["", "sm_", "80", "sm80", "gfx90a", "sm_a0", "sm_8-0"] {
            assert_eq!(Image::for_arch(bad), None, "{bad}");
        }
    }
}
