//! Reading files that someone else may have written (a downloaded model directory, a checkpoint
//! from another site): only regular files are opened, so a FIFO never hangs a read and a device
//! never feeds one forever; and a path named by a value inside a file (a checkpoint's tokenizer
//! flags, a safetensors index's `weight_map`) is resolved inside the directory that file came
//! from, so a crafted value cannot make trident read, or copy into its output, a file elsewhere.
//! Also where trident's own cache lives (`cache_root`).

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Opens `path` for reading if it is a regular file (following symlinks), without blocking on a
/// FIFO; anything else is an error naming it.
pub fn open_regular(path: &Path, what: &'static str) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, what, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, what, e))?;
    if !meta.is_file() {
        return Err(Error::format(path, "not a regular file (a directory, device, FIFO or socket): refused"));
    }
    Ok(file)
}

/// The whole of the regular file `path` (`open_regular`).
pub fn read_regular(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    let mut file = open_regular(path, what)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| Error::io(path, what, e))?;
    Ok(bytes)
}

/// The file that `value`, read from the file `named_in`, names inside `dir` (the directory
/// `named_in` belongs to). The value must be a relative path of plain components (no `..`, no
/// `.`, not absolute), and the file it names must be a regular file whose real path, symlinks
/// followed, lies inside `dir`, or, where `dir` is a snapshot of a Hugging Face hub cache
/// (`<repo>/snapshots/<revision>`), in that repository's `blobs/`, where the hub keeps the files
/// its snapshots link to. Anything else is one error naming `named_in` and the value.
pub fn inside(dir: &Path, value: &str, named_in: &Path) -> Result<PathBuf> {
    let refuse = |why: &str| {
        Error::format(named_in, format!("'{value}' {why}; a file named here must lie in {}", dir.display()))
    };
    let relative = Path::new(value);
    let plain = relative.components().all(|c| matches!(c, Component::Normal(_)));
    if value.is_empty() || !plain || value.contains('\0') {
        return Err(refuse("is not a plain relative path (absolute, '..', '.' or empty)"));
    }
    let joined = dir.join(relative);
    let real = joined.canonicalize().map_err(|e| Error::io(&joined, "find the file a value names", e))?;
    let home = dir.canonicalize().map_err(|e| Error::io(dir, "find the directory", e))?;
    if !real.starts_with(&home) && !in_hub_blobs(&home, &real) {
        return Err(refuse(&format!("leads out of the directory (to {})", real.display())));
    }
    if !real.is_file() {
        return Err(refuse("is not a regular file"));
    }
    Ok(joined)
}

/// Whether `real` is a blob of the Hugging Face hub cache repository whose snapshot `home` is.
fn in_hub_blobs(home: &Path, real: &Path) -> bool {
    let Some(snapshots) = home.parent() else { return false };
    let repo = snapshots.parent();
    snapshots.file_name().is_some_and(|n| n == "snapshots")
        && repo.is_some_and(|r| real.parent() == Some(r.join("blobs").as_path()))
}

/// The variable that moves trident's cache (compiled GPU kernels, the CPU's measured kernel
/// choices).
pub const CACHE_DIR_VAR: &str = "TRIDENT_CACHE_DIR";

/// trident's cache root: `$TRIDENT_CACHE_DIR`, `$XDG_CACHE_HOME/trident` or
/// `$HOME/.cache/trident`, from `env` (a lookup of the environment).
pub fn cache_root(env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(d) = set(CACHE_DIR_VAR) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("trident"));
    }
    if let Some(h) = set("HOME") {
        return Ok(PathBuf::from(h).join(".cache").join("trident"));
    }
    Err(Error::Config(format!("no place for trident's cache: set {CACHE_DIR_VAR}, XDG_CACHE_HOME or HOME")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trident-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn values_resolve_inside_their_directory_only() {
        let root = dir("inside");
        let model = root.join("model");
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::write(model.join("a.bin"), b"a").unwrap();
        std::fs::write(model.join("sub/b.bin"), b"b").unwrap();
        std::fs::write(root.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), model.join("out.bin")).unwrap();
        std::os::unix::fs::symlink("a.bin", model.join("in.bin")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", model.join("zero.bin")).unwrap();
        let index = model.join("index.json");
        assert_eq!(inside(&model, "a.bin", &index).unwrap(), model.join("a.bin"));
        assert_eq!(inside(&model, "sub/b.bin", &index).unwrap(), model.join("sub/b.bin"));
        assert!(inside(&model, "in.bin", &index).is_ok());
        for bad in ["../secret", "/etc/passwd", "./a.bin", "sub/../a.bin", "", "out.bin", "zero.bin", "sub"] {
            let e = inside(&model, bad, &index).unwrap_err().to_string();
            assert!(e.contains("index.json") && e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
        assert!(inside(&model, "missing.bin", &index).unwrap_err().to_string().contains("missing.bin"));
    }

    #[test]
    fn hub_snapshots_may_link_into_their_blobs() {
        let repo = dir("hub").join("models--x");
        let snap = repo.join("snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("other")).unwrap();
        std::fs::write(repo.join("blobs/f00d"), b"w").unwrap();
        std::fs::write(repo.join("other/f00d"), b"w").unwrap();
        std::os::unix::fs::symlink("../../blobs/f00d", snap.join("model.safetensors")).unwrap();
        std::os::unix::fs::symlink("../../other/f00d", snap.join("elsewhere.safetensors")).unwrap();
        let index = snap.join("model.safetensors.index.json");
        assert!(inside(&snap, "model.safetensors", &index).is_ok());
        assert!(inside(&snap, "elsewhere.safetensors", &index).is_err());
    }

    #[test]
    fn only_regular_files_are_read() {
        assert!(read_regular(Path::new("/dev/null"), "read").unwrap_err().to_string().contains("regular"));
        let d = dir("regular");
        assert!(read_regular(&d, "read").is_err());
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_regular(&fifo, "read").unwrap_err().to_string().contains("regular"));
        std::fs::write(d.join("f"), b"xy").unwrap();
        assert_eq!(read_regular(&d.join("f"), "read").unwrap(), b"xy");
    }

    #[test]
    fn the_root_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(cache_root(&env(&[("TRIDENT_CACHE_DIR", "/c"), ("HOME", "/h")])).unwrap(), PathBuf::from("/c"));
        assert_eq!(cache_root(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])).unwrap(), PathBuf::from("/x/trident"));
        assert_eq!(
            cache_root(&env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])).unwrap(),
            PathBuf::from("/h/.cache/trident")
        );
        assert!(cache_root(&env(&[])).is_err());
    }
}
