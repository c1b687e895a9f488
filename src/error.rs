//! The crate's one error type: every failure a user can cause ends here, with the file or flag it
//! concerns, what was found and what was expected, and is printed by `main` as a single line.

use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can go wrong outside a programming bug. Each variant carries enough context
/// that its one-line rendering tells a user what to fix without reading the source.
#[derive(Debug)]
pub enum Error {
    /// A command-line flag that is unknown, missing its value, or has a value of the wrong form.
    Flag { name: String, found: String, expected: String },
    /// A command line that does not make sense as a whole (no subcommand, missing required flag).
    Usage(String),
    /// An operating-system error on a named file.
    Io { path: PathBuf, action: &'static str, source: std::io::Error },
    /// A file whose contents do not follow its format.
    Format { path: PathBuf, problem: String },
    /// A configuration that cannot be run (shapes that do not divide, batch sizes that do not fit).
    Config(String),
    /// Training data that is present and well-formed but unusable (token ids out of range, too
    /// few tokens for one sample).
    Data(String),
    /// A feature this build does not provide; the message says which and what to use instead.
    Unsupported(String),
    /// The communication layer misbehaved (a collective returned wrong values).
    Comm(String),
    /// A check (`trident check ops`, `check losses`) found results outside their bounds.
    Check(String),
    /// A GPU library loaded at run time (libcuda, NVRTC, NCCL) is absent, or lacks a symbol.
    GpuLibrary { library: String, problem: String },
    /// A call into a GPU library returned an error code: which API and call, the code, its name
    /// (`CUDA_ERROR_NO_DEVICE`, `NVRTC_ERROR_COMPILATION`, `ncclInvalidArgument`) and its message.
    GpuCall { api: &'static str, call: &'static str, code: i32, name: String, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn flag(name: &str, found: impl fmt::Display, expected: impl fmt::Display) -> Error {
        Error::Flag { name: name.to_string(), found: found.to_string(), expected: expected.to_string() }
    }

    pub fn io(path: &Path, action: &'static str, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), action, source }
    }

    pub fn format(path: &Path, problem: impl Into<String>) -> Error {
        Error::Format { path: path.to_path_buf(), problem: problem.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Flag { name, found, expected } => {
                write!(f, "flag {name}: found {found}, expected {expected}")
            }
            Error::Usage(msg) => write!(f, "{msg}"),
            Error::Io { path, action, source } => {
                write!(f, "{}: cannot {action}: {source}", path.display())
            }
            Error::Format { path, problem } => write!(f, "{}: {problem}", path.display()),
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::Data(msg) => write!(f, "bad training data: {msg}"),
            Error::Unsupported(msg) => write!(f, "not supported by this build: {msg}"),
            Error::Comm(msg) => write!(f, "communication failure: {msg}"),
            Error::Check(msg) => write!(f, "{msg}"),
            Error::GpuLibrary { library, problem } => write!(f, "{library} {problem}"),
            Error::GpuCall { api, call, code, name, message } => {
                write!(f, "{api}: {call} failed with {name} ({code}): {message}")
            }
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The same error with ` (context)` appended to its message (a flag or I/O error, whose
    /// rendering is fixed, is returned as it is), so a caller can say where it arose.
    pub fn within(self, context: &str) -> Error {
        let add = |s: String| format!("{s} ({context})");
        match self {
            Error::Usage(m) => Error::Usage(add(m)),
            Error::Format { path, problem } => Error::Format { path, problem: add(problem) },
            Error::Config(m) => Error::Config(add(m)),
            Error::Data(m) => Error::Data(add(m)),
            Error::Unsupported(m) => Error::Unsupported(add(m)),
            Error::Comm(m) => Error::Comm(add(m)),
            Error::Check(m) => Error::Check(add(m)),
            Error::GpuLibrary { library, problem } => Error::GpuLibrary { library, problem: add(problem) },
            Error::GpuCall { api, call, code, name, message } => {
                Error::GpuCall { api, call, code, name, message: add(message) }
            }
            e @ (Error::Flag { .. } | Error::Io { .. }) => e,
        }
    }
}

/// An error met inside an operation that has no way to return one: a GPU Device op (the `Device`
/// trait's ops return nothing) or a collective enqueued on a device stream. `fail` unwinds the
/// stack with it, without a panic message, to the command that ran the operation, whose
/// `catch_failure` turns it back into its `Err`: the command then ends as on any error (one line,
/// the job aborted where only this rank failed), and nothing in the library ends the process.
/// Needs unwinding (Cargo.toml's `panic = "unwind"`).
pub struct Failure(pub Error);

/// Abandons the current operation with `e` (see `Failure`).
pub fn fail(e: Error) -> ! {
    std::panic::resume_unwind(Box::new(Failure(e)))
}

/// Runs `f`; an operation inside it that `fail`ed becomes `f`'s error. Any other unwinding (a
/// bug's panic) continues.
pub fn catch_failure<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => match payload.downcast::<Failure>() {
            Ok(failure) => Err(failure.0),
            Err(other) => std::panic::resume_unwind(other),
        },
    }
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    #[test]
    fn a_failed_operation_becomes_the_commands_error_and_a_bug_still_panics() {
        let e = catch_failure(|| -> Result<()> { fail(Error::Data("x".into())) }).unwrap_err();
        assert_eq!(e.to_string(), "bad training data: x");
        assert_eq!(catch_failure(|| Ok(3)).unwrap(), 3);
        let bug = std::panic::catch_unwind(|| catch_failure(|| -> Result<()> { panic!("a bug") }));
        assert!(bug.is_err());
        let call = Error::GpuCall { api: "NCCL", call: "ncclSend", code: 6, name: "e".into(), message: "m".into() };
        assert_eq!(call.within("pipeline p2p").to_string(), "NCCL: ncclSend failed with e (6): m (pipeline p2p)");
    }
}
