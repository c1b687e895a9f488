//! The on-disk module cache: a kernel compiled by NVRTC (or hipRTC) for one architecture is kept under
//! `$TRIDENT_CACHE_DIR`, else `$XDG_CACHE_HOME/trident`, else `~/.cache/trident` (in `kernels/`),
//! keyed by a hash of (source, headers, architecture, compiler and its version, options), so a
//! second run loads the CUBIN (or the AMD code object, `.co`) instead of compiling it. Entries are written to a temporary file and renamed (a crash
//! never leaves a half-written entry under the real name) and carry their length and an FNV-1a
//! checksum; an entry that fails either check is compiled again and replaced. A process that
//! misses compiles under a lock on the cache's root (`flock`; no file is added), and one that
//! finds the lock held waits and then reads what the holder stored: the ranks of a job that start
//! together on a cold cache compile each module once, not once per rank (about 9 s of NVRTC each).
//!
//! Entry layout (little-endian): magic `TRIDENTK`, format version u32, image kind u32 (0 CUBIN,
//! 1 PTX, 2 AMD code object), key u64, payload length u64, payload FNV-1a u64, payload.

use super::hiprtc::Hiprtc;
use super::nvrtc::{Image, Nvrtc};
use crate::error::{Error, Result};
use crate::rng::fnv1a64;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TRIDENTK";
const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 8;
/// The image kinds of the entry header.
const KIND_CUBIN: u32 = 0;
const KIND_PTX: u32 = 1;
const KIND_HIP_CODE_OBJECT: u32 = 2;

fn kind_of(image: Image) -> u32 {
    if image == Image::Cubin {
        KIND_CUBIN
    } else {
        KIND_PTX
    }
}

/// The variable that moves the cache (the kernels go in its `kernels/` folder), and the root.
pub use crate::files::{cache_root as default_root, CACHE_DIR_VAR};

/// How an image was obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Read from the cache; NVRTC was not called.
    Hit,
    /// Not in the cache: compiled and stored.
    Compiled,
    /// In the cache but damaged (the reason): compiled again and replaced.
    Recompiled(String),
}

pub struct CachedImage {
    pub image: Image,
    pub bytes: Vec<u8>,
    pub path: PathBuf,
    pub outcome: Outcome,
}

/// An AMD code object from the cache or hipRTC.
pub struct CachedCodeObject {
    pub bytes: Vec<u8>,
    pub path: PathBuf,
    pub outcome: Outcome,
}

pub struct ModuleCache {
    dir: PathBuf,
}

/// The cache key of a compilation. Every field is length-prefixed so that no two different
/// inputs concatenate to the same bytes.
pub fn key(source: &str, arch: &str, nvrtc_version: (i32, i32), options: &[String]) -> u64 {
    key_with_headers(source, &[], arch, nvrtc_version, options)
}

/// The key of a compilation with headers: as `key`, then each header's name and text (after a
/// marker no option can spell, since options cannot hold a NUL), so editing a header changes it.
pub fn key_with_headers(
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    nvrtc_version: (i32, i32),
    options: &[String],
) -> u64 {
    key_for(&format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1), source, headers, arch, options)
}

/// The key of a compilation by `compiler` (its name and version, e.g. `hiprtc 5.2`), with headers.
pub fn key_for(compiler: &str, source: &str, headers: &[(&str, &str)], arch: &str, options: &[String]) -> u64 {
    let mut bytes = Vec::with_capacity(source.len() + 64);
    let mut field = |b: &[u8]| {
        bytes.extend_from_slice(&(b.len() as u64).to_le_bytes());
        bytes.extend_from_slice(b);
    };
    field(source.as_bytes());
    field(arch.as_bytes());
    field(compiler.as_bytes());
    for o in options {
        field(o.as_bytes());
    }
    if !headers.is_empty() {
        field(b"\0headers");
        for (name, text) in headers {
            field(name.as_bytes());
            field(text.as_bytes());
        }
    }
    fnv1a64(&bytes)
}

fn encode(kind: u32, key: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a cache entry, or why the entry is unusable.
fn decode(bytes: &[u8], kind: u32, want_key: u64) -> std::result::Result<Vec<u8>, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than the {HEADER_BYTES}-byte header", bytes.len()));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    if &bytes[..8] != MAGIC {
        return Err("not a trident kernel cache entry (bad magic)".into());
    }
    if u32_at(8) != FORMAT_VERSION {
        return Err(format!("format version {} (expected {FORMAT_VERSION})", u32_at(8)));
    }
    if u32_at(12) != kind || u64_at(16) != want_key {
        return Err("header names another compilation".into());
    }
    let len = u64_at(24);
    let payload = &bytes[HEADER_BYTES..];
    if payload.len() as u64 != len {
        return Err(format!("payload of {} bytes, header says {len}", payload.len()));
    }
    if fnv1a64(payload) != u64_at(32) {
        return Err("checksum mismatch".into());
    }
    Ok(payload.to_vec())
}

impl ModuleCache {
    /// A cache in `root/kernels` (created on first store).
    pub fn new(root: &Path) -> ModuleCache {
        ModuleCache { dir: root.join("kernels") }
    }

    /// The cache at the default root of this process's environment.
    pub fn at_default_root() -> Result<ModuleCache> {
        Ok(ModuleCache::new(&default_root(&|k| std::env::var(k).ok())?))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file an entry lives in: readable names, the key making it unique.
    pub fn entry_path(&self, name: &str, arch: &str, key: u64) -> PathBuf {
        let image = if Image::for_arch(arch) == Some(Image::Ptx) { "ptx" } else { "cubin" };
        self.dir.join(format!("{name}-{arch}-{key:016x}.{image}"))
    }

    /// The image of kernel `name` for `arch`: from the cache when a valid entry exists, else
    /// compiled with NVRTC and stored.
    pub fn get_or_compile(
        &self,
        nvrtc: &Nvrtc,
        name: &str,
        source: &str,
        arch: &str,
        options: &[String],
    ) -> Result<CachedImage> {
        self.get_or_compile_with_headers(nvrtc, name, source, &[], arch, options)
    }

    /// As `get_or_compile`, for a source that includes `headers` ((include name, text) pairs);
    /// their texts are part of the key.
    pub fn get_or_compile_with_headers(
        &self,
        nvrtc: &Nvrtc,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: &str,
        options: &[String],
    ) -> Result<CachedImage> {
        let image = Image::for_arch(arch).ok_or_else(|| {
            Error::Config(format!("kernel {name}: '{arch}' is not a GPU architecture (expected sm_XX or compute_XX)"))
        })?;
        let key = key_with_headers(source, headers, arch, nvrtc.version()?, options);
        let path = self.entry_path(name, arch, key);
        let (bytes, outcome) = self.get_or_build(&path, kind_of(image), key, || {
            Ok(nvrtc.compile_with_headers(name, source, headers, arch, options)?.bytes)
        })?;
        Ok(CachedImage { image, bytes, path, outcome })
    }

    /// The AMD code object of kernel `name` for `arch` (a `gfx...`): from the cache when a valid
    /// entry exists, else compiled by hipRTC (`--offload-arch=<arch>` and `options`) and stored.
    /// The key covers the source, the headers, the architecture, hipRTC's version and library file
    /// and the options.
    pub fn get_or_compile_hip(
        &self,
        hiprtc: &Hiprtc,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: &str,
        options: &[String],
    ) -> Result<CachedCodeObject> {
        // hipRTC's version alone says little (ROCm 5.2's reports 9.0), so the library's file name,
        // which carries the ROCm release (libamdhip64.so.5.2.21153), is part of the key too.
        let (major, minor) = hiprtc.version()?;
        let path = hiprtc.path();
        let file = Path::new(&path).file_name().map_or(path.clone(), |f| f.to_string_lossy().into_owned());
        let key = key_for(&format!("hiprtc {major}.{minor} {file}"), source, headers, arch, options);
        let path = self.dir.join(format!("{name}-{arch}-{key:016x}.co"));
        let (bytes, outcome) = self.get_or_build(&path, KIND_HIP_CODE_OBJECT, key, || {
            Ok(hiprtc.compile(name, source, headers, arch, options)?.code)
        })?;
        Ok(CachedCodeObject { bytes, path, outcome })
    }

    /// The payload of the entry at `path` when it is valid, else `build()`'s, stored there.
    fn get_or_build(
        &self,
        path: &Path,
        kind: u32,
        key: u64,
        build: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<(Vec<u8>, Outcome)> {
        let mut outcome = Outcome::Compiled;
        match std::fs::read(path) {
            Ok(bytes) => match decode(&bytes, kind, key) {
                Ok(payload) => return Ok((payload, Outcome::Hit)),
                Err(reason) => outcome = Outcome::Recompiled(reason),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(path, "read the kernel cache entry", e)),
        }
        // The lock is on the cache's root, which holds `kernels/` (created only when an entry is
        // stored, so a failed compile leaves no folder).
        let root = self.dir.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(root).map_err(|e| Error::io(root, "create the kernel cache directory", e))?;
        let _lock = CompileLock::acquire(root);
        // Whoever held the lock may have stored the entry meanwhile.
        if let Some(payload) = std::fs::read(path).ok().and_then(|b| decode(&b, kind, key).ok()) {
            return Ok((payload, Outcome::Hit));
        }
        let bytes = build()?;
        self.store(path, &encode(kind, key, &bytes))?;
        Ok((bytes, outcome))
    }

    /// Writes `bytes` to a temporary file beside `path`, syncs it and renames it into place.
    fn store(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, "create the kernel cache directory", e))?;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(&tmp, "write the kernel cache entry", e));
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(path, "rename the kernel cache entry into place", e)
        })
    }
}

/// An exclusive `flock` on the cache's root directory, held while a missing entry is compiled and
/// released when dropped (or when the process ends, however it ends). Where the file system
/// cannot lock (some network file systems) or the wait passes `LOCK_WAIT`, there is no lock and
/// the caller compiles anyway, as every process did before: the lock only saves work.
struct CompileLock {
    _dir: Option<std::fs::File>,
}

/// The longest a process waits for another's compile before doing its own.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

impl CompileLock {
    fn acquire(dir: &Path) -> CompileLock {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(dir) else {
            return CompileLock { _dir: None };
        };
        let start = std::time::Instant::now();
        loop {
            // SAFETY: flock on a descriptor this File owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return CompileLock { _dir: Some(file) };
            }
            let held = std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
            if !held || start.elapsed() > LOCK_WAIT {
                return CompileLock { _dir: None };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_changes_with_every_input() {
        let o = vec!["-O3".to_string()];
        let k = key("src", "sm_80", (13, 5), &o);
        assert_eq!(k, key("src", "sm_80", (13, 5), &o));
        assert_ne!(k, key("src2", "sm_80", (13, 5), &o));
        assert_ne!(k, key("src", "sm_90a", (13, 5), &o));
        assert_ne!(k, key("src", "sm_80", (12, 9), &o));
        assert_ne!(k, key("src", "sm_80", (13, 5), &[]));
        // Length prefixes: moving a byte between fields changes the key.
        assert_ne!(key("ab", "c", (13, 5), &[]), key("a", "bc", (13, 5), &[]));
        // Headers: none is the plain key; each header's name and text count.
        assert_eq!(key_with_headers("src", &[], "sm_80", (13, 5), &o), k);
        let h = key_with_headers("src", &[("common/base.cuh", "x")], "sm_80", (13, 5), &o);
        assert_ne!(h, k);
        assert_ne!(h, key_with_headers("src", &[("common/base.cuh", "y")], "sm_80", (13, 5), &o));
        assert_ne!(h, key_with_headers("src", &[("common/other.cuh", "x")], "sm_80", (13, 5), &o));
        // The compiler and its version count: hipRTC's key differs from NVRTC's and by version.
        let hip = key_for("hiprtc 5.2", "src", &[], "gfx90a", &o);
        assert_ne!(hip, key_for("hiprtc 6.2", "src", &[], "gfx90a", &o));
        assert_ne!(hip, key_for("hiprtc 5.2", "src", &[], "gfx942", &o));
        assert_eq!(key_for("nvrtc 13.5", "src", &[], "sm_80", &o), k);
    }

    #[test]
    fn entries_round_trip_and_damage_is_detected() {
        let payload = b"\x7fELF cubin bytes".to_vec();
        let e = encode(KIND_CUBIN, 42, &payload);
        assert_eq!(decode(&e, KIND_CUBIN, 42).unwrap(), payload);
        assert!(decode(&e, KIND_CUBIN, 43).unwrap_err().contains("another compilation"));
        assert!(decode(&e, KIND_PTX, 42).unwrap_err().contains("another compilation"));
        assert!(decode(&e, KIND_HIP_CODE_OBJECT, 42).unwrap_err().contains("another compilation"));
        assert!(decode(&e[..e.len() - 1], KIND_CUBIN, 42).unwrap_err().contains("header says"));
        assert!(decode(&e[..10], KIND_CUBIN, 42).unwrap_err().contains("shorter"));
        let mut flipped = e.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&flipped, KIND_CUBIN, 42).unwrap_err(), "checksum mismatch");
        let mut magic = e;
        magic[0] = b'X';
        assert!(decode(&magic, KIND_CUBIN, 42).unwrap_err().contains("magic"));
    }

    #[test]
    fn a_miss_waits_for_the_compile_under_way_and_reads_its_entry() {
        let root = std::env::temp_dir().join(format!("trident-cache-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = ModuleCache::new(&root);
        std::fs::create_dir_all(cache.dir()).unwrap();
        let path = cache.entry_path("gelu", "sm_80", 7);
        // Another "rank" is compiling: it holds the lock, then stores the entry.
        let held = CompileLock::acquire(&root);
        assert!(held._dir.is_some(), "flock on {}", root.display());
        let compiled = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                cache.get_or_build(&path, KIND_CUBIN, 7, || {
                    compiled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(b"compiled again".to_vec())
                })
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            cache.store(&path, &encode(KIND_CUBIN, 7, b"the holder's")).unwrap();
            drop(held);
            let (bytes, outcome) = waiter.join().unwrap().unwrap();
            assert_eq!((bytes.as_slice(), outcome), (&b"the holder's"[..], Outcome::Hit));
        });
        assert_eq!(compiled.load(std::sync::atomic::Ordering::SeqCst), 0, "the waiter compiled too");
        // With nobody holding it, a miss compiles and stores.
        let other = cache.entry_path("gelu", "sm_90", 8);
        let (bytes, outcome) = cache.get_or_build(&other, KIND_CUBIN, 8, || Ok(b"fresh".to_vec())).unwrap();
        assert_eq!((bytes.as_slice(), outcome), (&b"fresh"[..], Outcome::Compiled));
        assert_eq!(decode(&std::fs::read(&other).unwrap(), KIND_CUBIN, 8).unwrap(), b"fresh");
        assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 2, "the entries, and no other file");
        let _ = std::fs::remove_dir_all(&root);
    }
}
