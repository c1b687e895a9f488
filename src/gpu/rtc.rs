//! What the two runtime compilers, NVRTC (nvrtc.rs) and hipRTC (hiprtc.rs), take and give back
//! alike: a program's text as C strings (the source, its file name, the options, the headers by
//! include name) with the pointer arrays their create and compile calls want, and a compile log
//! folded onto one line for the error that carries it.

use crate::error::{Error, Result};
use std::ffi::{c_char, CString};

/// A program's inputs as C strings that outlive the compiler's calls (the compilers copy them).
pub struct ProgramText {
    source: CString,
    name: CString,
    /// Kept alive for the pointer arrays below.
    _strings: Vec<CString>,
    options: Vec<*const c_char>,
    header_texts: Vec<*const c_char>,
    header_names: Vec<*const c_char>,
}

impl ProgramText {
    /// The inputs of kernel `kernel` (as errors name it), in file `file_name`, with `headers` as
    /// (include name, text) pairs and `options`; a NUL byte anywhere is an error naming the part.
    pub fn new(
        kernel: &str,
        file_name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<ProgramText> {
        let to_c = |what: &str, text: &str| {
            CString::new(text).map_err(|_| Error::Config(format!("kernel {kernel}: {what} contains a NUL byte")))
        };
        let (source, name) = (to_c("the source", source)?, to_c("the name", file_name)?);
        let options: Vec<CString> = options.iter().map(|o| to_c(&format!("option {o:?}"), o)).collect::<Result<_>>()?;
        let texts: Vec<CString> =
            headers.iter().map(|(n, t)| to_c(&format!("header {n}"), t)).collect::<Result<_>>()?;
        let names: Vec<CString> = headers.iter().map(|(n, _)| to_c("a header name", n)).collect::<Result<_>>()?;
        let pointers = |strings: &[CString]| strings.iter().map(|s| s.as_ptr()).collect::<Vec<_>>();
        let (option_ptrs, text_ptrs, name_ptrs) = (pointers(&options), pointers(&texts), pointers(&names));
        Ok(ProgramText {
            source,
            name,
            // A CString's bytes stay where they are when the CString moves: the pointers hold.
            _strings: options.into_iter().chain(texts).chain(names).collect(),
            options: option_ptrs,
            header_texts: text_ptrs,
            header_names: name_ptrs,
        })
    }

    pub fn source(&self) -> *const c_char {
        self.source.as_ptr()
    }

    pub fn name(&self) -> *const c_char {
        self.name.as_ptr()
    }

    pub fn header_count(&self) -> i32 {
        self.header_texts.len() as i32
    }

    /// The headers' texts and include names, each array null when there are none (as both
    /// compilers allow).
    pub fn headers(&self) -> (*const *const c_char, *const *const c_char) {
        if self.header_texts.is_empty() {
            return (std::ptr::null(), std::ptr::null());
        }
        (self.header_texts.as_ptr(), self.header_names.as_ptr())
    }

    pub fn option_count(&self) -> i32 {
        self.options.len() as i32
    }

    pub fn options(&self) -> *const *const c_char {
        self.options.as_ptr()
    }
}

/// A compile log on one line: its non-empty lines, trimmed, joined by " | " ("no log" if none).
pub fn one_line(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        "no log".to_string()
    } else {
        lines.join(" | ")
    }
}
