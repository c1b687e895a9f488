//! Run-time loading of shared libraries (`dlopen` / `dlsym` through `libc`) and the `api_table!`
//! macro that turns a list of C prototypes into a table of lazily resolved entry points. Nothing
//! here links against a GPU library: a missing library or symbol is an `Error::GpuLibrary` naming
//! it, never a panic and never a failure to start the binary.

use crate::error::{Error, Result};
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// One opened shared library. The handle is never closed: GPU runtimes register atexit handlers
/// and thread-local state that must outlive every use, so the library stays loaded until exit.
pub struct Library {
    handle: *mut libc::c_void,
    /// What was asked for (a soname like `libnvrtc.so.13`, or a path).
    pub requested: String,
    /// The file the dynamic loader actually opened (from `dladdr` on a symbol), when known.
    pub path: Option<String>,
}

// SAFETY: a dlopen handle is a process-wide token; dlsym on it is thread-safe (glibc locks).
unsafe impl Send for Library {}
// SAFETY: as above; the struct holds no interior mutability of its own.
unsafe impl Sync for Library {}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local C string or null; it is copied out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dynamic loader error".into()
    } else {
        // SAFETY: non-null pointer from dlerror points to a NUL-terminated string.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// Opens `name` (a soname searched on the loader path, or a path to a file).
    pub fn open(name: &str) -> std::result::Result<Library, String> {
        let c = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
        // SAFETY: c is a valid C string; RTLD_NOW resolves the library's own dependencies now, so
        // a broken install fails here with the loader's message rather than later in a call.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        Ok(Library { handle, requested: name.to_string(), path: None })
    }

    /// Opens the first of `candidates` that loads. The error reads "<candidates> not found
    /// (<absent>)", with the loader's reason added when it is more than "no such file" (a library
    /// that exists but does not load: wrong architecture, a missing dependency).
    pub fn open_first(candidates: &[String], absent: &str) -> Result<Library> {
        let mut reasons = Vec::new();
        for name in candidates {
            match Library::open(name) {
                Ok(lib) => return Ok(lib),
                Err(reason) => reasons.push(reason),
            }
        }
        let telling: Vec<String> = reasons.into_iter().filter(|r| !r.contains("No such file")).collect();
        let detail = if telling.is_empty() { String::new() } else { format!("; loader: {}", telling.join("; ")) };
        Err(Error::GpuLibrary { library: candidates.join(" / "), problem: format!("not found ({absent}{detail})") })
    }

    /// The address of `symbol`, or an error naming the library and the symbol.
    pub fn address(&self, symbol: &str) -> Result<usize> {
        let c = CString::new(symbol).expect("symbol names are literals without NUL");
        // SAFETY: handle came from a successful dlopen and is never closed; c is a C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(Error::GpuLibrary {
                library: self.shown_name(),
                problem: format!("has no symbol {symbol} (older than trident needs, or not the library expected)"),
            });
        }
        Ok(p as usize)
    }

    /// Resolves `symbol` once and keeps the address in `cell`.
    pub fn resolve(&self, symbol: &str, cell: &OnceLock<usize>) -> Result<usize> {
        if let Some(a) = cell.get() {
            return Ok(*a);
        }
        let a = self.address(symbol)?;
        let _ = cell.set(a);
        Ok(a)
    }

    /// Fills `path` with the file the loader opened, found through any symbol of it.
    pub fn locate(mut self, any_symbol: &str) -> Library {
        if let Ok(addr) = self.address(any_symbol) {
            // SAFETY: Dl_info is plain data; dladdr only writes it, and dli_fname (when set)
            // points into the loader's own tables, valid while the library stays loaded.
            unsafe {
                let mut info: libc::Dl_info = std::mem::zeroed();
                if libc::dladdr(addr as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
                    let name = CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned();
                    self.path = Some(std::fs::canonicalize(&name).map(|p| p.display().to_string()).unwrap_or(name));
                }
            }
        }
        self
    }

    /// The path when known, else the requested name.
    pub fn shown_name(&self) -> String {
        self.path.clone().unwrap_or_else(|| self.requested.clone())
    }
}

/// The libraries to try for an API: the path in `env_var` when it is set (and only it: a user
/// who names a file means that file), else the sonames in order.
pub fn candidates(env_var: &str, sonames: &[&str]) -> Vec<String> {
    match std::env::var(env_var) {
        Ok(path) if !path.is_empty() => vec![path],
        _ => sonames.iter().map(|s| s.to_string()).collect(),
    }
}

/// Declares a table of C entry points resolved lazily from a `Library`. Each entry becomes an
/// `unsafe fn` of the same name returning `Result<ret>`: `Err` when the symbol is missing, else
/// the C function's own return value (a status code the caller checks).
macro_rules! api_table {
    ($(#[$meta:meta])* $table:ident { $( fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty ; )* }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $table {
            pub lib: $crate::gpu::dl::Library,
            $( $name: std::sync::OnceLock<usize>, )*
        }

        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        impl $table {
            pub fn new(lib: $crate::gpu::dl::Library) -> $table {
                $table { lib, $( $name: std::sync::OnceLock::new(), )* }
            }
            $(
                /// The C entry point of the same name; the caller upholds its C contract
                /// (valid pointers, sizes, a current context where the API needs one).
                pub unsafe fn $name(&self, $( $arg: $ty ),*) -> $crate::error::Result<$ret> {
                    let address = self.lib.resolve(stringify!($name), &self.$name)?;
                    // SAFETY: the address came from dlsym for this exact symbol, whose C
                    // prototype is the one declared in this table (checked against the header).
                    let f: unsafe extern "C" fn($( $ty ),*) -> $ret = unsafe { std::mem::transmute(address) };
                    // SAFETY: forwarded to the caller, per this function's contract.
                    Ok(unsafe { f($( $arg ),*) })
                }
            )*
        }
    };
}
pub(crate) use api_table;
