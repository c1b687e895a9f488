//! The CUDA kernels, as the binary carries them, and their images.
//!
//! **Sources.** build.rs embeds the portable kernels both vendors compile (every `kernels/*.cu`
//! and `kernels/common/*.h`) and the NVIDIA ones (every `kernels-cuda/*.cu` and
//! `kernels-cuda/common/*.cuh`; not the emulation in `emu/`). A kernel file is compiled at run time by NVRTC for the device's exact
//! architecture (`arch_for`: compute capability X.Y gives `sm_XY`, 9.0 gives `sm_90a` so the
//! Hopper-only instructions are available; below 8.0 is an error, since the kernels use bf16
//! `mma.sync` and `cp.async`), with every embedded header passed by include name
//! (`common/base.cuh`, ...), through the on-disk cache of `cache.rs`, whose key covers the file's
//! text, every header's text, the architecture, NVRTC's version and the options. So a header edit
//! recompiles every kernel: conservative, and a kernel file compiles in well under a second.
//!
//! **Ahead of time.** A binary built with `TRIDENT_CUDA_ARCHS=80;90a` and nvcc at hand also holds
//! one nvcc CUBIN per kernel file and listed architecture; `KernelModules::image` uses the image
//! whose architecture is exactly the device's (`select_precompiled`) before NVRTC, and compiles
//! with NVRTC otherwise (an `sm_80` image is not used on an 8.6 device: NVRTC's exact-arch build
//! is preferred over binary compatibility). `read_cubin` reads a CUBIN's functions and sections.
//!
//! **Storage.** Each file compiles to one module per 16-bit storage type (`Storage`): bf16 with
//! the options above, or fp16 with `-DTRIDENT_FP16` added (the same sources, binary16 storage and
//! .f16 tensor-core operands, `common/base.cuh`); its own cache entry, its own precompiled images
//! (`precompiled_in`).
//!
//! Which functions the files hold, and how each is launched, is the index (`kernels/mod.rs`).

use super::{Storage, KERNELS};
use crate::error::{Error, Result};
use crate::gpu::cache::{ModuleCache, Outcome};
use crate::gpu::nvrtc::{Image, Nvrtc};
use std::cell::OnceCell;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));
}

/// The options every kernel is compiled with (NVRTC optimizes by default).
pub const NVRTC_OPTIONS: &[&str] = &["-std=c++17"];

/// NVRTC's options for the module of `storage`: `NVRTC_OPTIONS` and the storage's define.
pub fn nvrtc_options(storage: Storage) -> Vec<String> {
    NVRTC_OPTIONS.iter().chain(storage.defines()).map(|o| o.to_string()).collect()
}

/// The embedded kernel files: (file name, text), sorted by name.
pub fn files() -> &'static [(&'static str, &'static str)] {
    embedded::KERNEL_FILES
}

/// The embedded headers: (include name such as `common/base.cuh`, text).
pub fn headers() -> &'static [(&'static str, &'static str)] {
    embedded::KERNEL_HEADERS
}

/// The precompiled images of this build's bf16 modules: (file, arch, CUBIN). Empty unless built
/// with `TRIDENT_CUDA_ARCHS`.
pub fn precompiled() -> &'static [(&'static str, &'static str, &'static [u8])] {
    embedded::AOT_IMAGES
}

/// The precompiled images of the modules of `storage` (build.rs compiles both for every listed
/// architecture).
pub fn precompiled_in(storage: Storage) -> &'static [(&'static str, &'static str, &'static [u8])] {
    match storage {
        Storage::Bf16 => embedded::AOT_IMAGES,
        Storage::F16 => embedded::AOT_IMAGES_FP16,
    }
}

/// The architectures this build holds precompiled images for, in build order.
pub fn precompiled_archs() -> Vec<&'static str> {
    archs_of(precompiled())
}

/// The distinct architectures of a set of images (file, arch, bytes), in order.
pub fn archs_of(images: &[(&'static str, &'static str, &'static [u8])]) -> Vec<&'static str> {
    let mut out: Vec<&str> = Vec::new();
    for (_, arch, _) in images {
        if !out.contains(arch) {
            out.push(arch);
        }
    }
    out
}

/// The nvcc that built the precompiled images (its `--version` last line), empty when none.
pub fn precompiled_by() -> &'static str {
    embedded::AOT_NVCC
}

/// The text of an embedded kernel file.
pub fn source(file: &str) -> Result<&'static str> {
    files().iter().find(|(f, _)| *f == file).map(|(_, s)| *s).ok_or_else(|| {
        let known: Vec<&str> = files().iter().map(|(f, _)| *f).collect();
        Error::Config(format!("no embedded kernel file '{file}' (this build has {})", known.join(", ")))
    })
}

/// The architecture to compile for on a device of compute capability (major, minor):
/// `TRIDENT_CUDA_ARCH` when set (`arch_choice`), else the device's own.
pub fn arch_for(compute_capability: (i32, i32)) -> Result<String> {
    arch_choice(compute_capability, std::env::var("TRIDENT_CUDA_ARCH").ok().filter(|v| !v.is_empty()).as_deref())
}

/// The device's architecture (`sm_90a` on 9.0: wgmma and TMA), or `wanted` (`TRIDENT_CUDA_ARCH`,
/// e.g. `sm_90` to run an H100 on the mma.sync kernels alone): an `sm_XY` no newer than the
/// device and not below 8.0; `sm_90a` only on 9.0.
pub fn arch_choice(compute_capability: (i32, i32), wanted: Option<&str>) -> Result<String> {
    let (major, minor) = compute_capability;
    if major < 8 {
        return Err(Error::Unsupported(format!(
            "a GPU of compute capability {major}.{minor}: trident's CUDA kernels need 8.0 or newer (bf16 mma.sync, cp.async)"
        )));
    }
    let own = if (major, minor) == (9, 0) { "sm_90a".to_string() } else { format!("sm_{major}{minor}") };
    let Some(wanted) = wanted else { return Ok(own) };
    let digits = wanted.strip_prefix("sm_").map(|d| d.strip_suffix('a').unwrap_or(d));
    let number =
        digits.filter(|d| d.len() >= 2 && d.bytes().all(|b| b.is_ascii_digit())).and_then(|d| d.parse::<i32>().ok());
    let fits = match number {
        Some(_) if wanted.ends_with('a') => wanted == own,
        Some(n) => (80..=major * 10 + minor).contains(&n),
        None => false,
    };
    if fits {
        Ok(wanted.to_string())
    } else {
        Err(Error::Config(format!(
            "TRIDENT_CUDA_ARCH={wanted}: expected an architecture this GPU (compute capability {major}.{minor}) runs, \
             from sm_80 up to {own} (e.g. sm_80, sm_90)"
        )))
    }
}

/// The precompiled image of `file` for exactly `arch`, if the build holds one.
pub fn select_precompiled<'a>(file: &str, arch: &str, images: &[(&str, &str, &'a [u8])]) -> Option<&'a [u8]> {
    images.iter().find(|(f, a, _)| *f == file && *a == arch).map(|(_, _, bytes)| *bytes)
}

/// Where a kernel image came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled by nvcc when the binary was built.
    Precompiled,
    /// Compiled by NVRTC now, or earlier and read from the cache (the outcome says which).
    Nvrtc(Outcome),
}

pub struct KernelImage {
    pub file: &'static str,
    pub arch: String,
    pub storage: Storage,
    pub image: Image,
    pub bytes: Vec<u8>,
    pub origin: Origin,
}

/// Kernel images for one process: precompiled when the build has the architecture, else from
/// NVRTC (loaded on first need) through the module cache.
pub struct KernelModules {
    cache: ModuleCache,
    nvrtc: OnceCell<std::result::Result<Nvrtc, String>>,
    /// Whether this build's precompiled images are used (`precompiled_in`).
    use_precompiled: bool,
}

impl KernelModules {
    /// Images from this build's precompiled set, else NVRTC (`Nvrtc::load`) and `cache`.
    pub fn new(cache: ModuleCache) -> KernelModules {
        KernelModules { cache, nvrtc: OnceCell::new(), use_precompiled: true }
    }

    /// Always NVRTC (this one) through `cache`, whatever the build holds: for tests and tools.
    pub fn nvrtc_only(cache: ModuleCache, nvrtc: Nvrtc) -> KernelModules {
        let cell = OnceCell::new();
        let _ = cell.set(Ok(nvrtc));
        KernelModules { cache, nvrtc: cell, use_precompiled: false }
    }

    pub fn cache(&self) -> &ModuleCache {
        &self.cache
    }

    /// The image of kernel file `file` (e.g. `gemm_bf16.cu`) for `arch` (an `sm_XY`), its module
    /// of `storage`.
    pub fn image(&self, file: &str, arch: &str, storage: Storage) -> Result<KernelImage> {
        let text = source(file)?;
        let file: &'static str = files().iter().find(|(f, _)| *f == file).map(|(f, _)| *f).expect("found above");
        let images = if self.use_precompiled { precompiled_in(storage) } else { &[] };
        if let Some(bytes) = select_precompiled(file, arch, images) {
            return Ok(KernelImage {
                file,
                arch: arch.to_string(),
                storage,
                image: Image::Cubin,
                bytes: bytes.to_vec(),
                origin: Origin::Precompiled,
            });
        }
        let nvrtc = self.nvrtc.get_or_init(|| Nvrtc::load().map_err(|e| e.to_string())).as_ref().map_err(|e| {
            let built = precompiled_archs();
            Error::Unsupported(format!(
                "kernel {file} for {arch}: {} and {e}",
                if built.is_empty() {
                    "this build holds no precompiled kernels".to_string()
                } else {
                    format!("this build holds precompiled kernels for {} only", built.join(", "))
                }
            ))
        })?;
        let name = file.trim_end_matches(".cu");
        let got =
            self.cache.get_or_compile_with_headers(nvrtc, name, text, headers(), arch, &nvrtc_options(storage))?;
        Ok(KernelImage {
            file,
            arch: arch.to_string(),
            storage,
            image: got.image,
            bytes: got.bytes,
            origin: Origin::Nvrtc(got.outcome),
        })
    }
}

/// What a CUBIN (an ELF file) holds: its function symbols, and its sections with their sizes
/// (`.nv.shared.<kernel>` is a kernel's static shared memory).
#[derive(Debug, Default)]
pub struct CubinInfo {
    pub functions: Vec<String>,
    pub sections: Vec<(String, u64)>,
}

impl CubinInfo {
    /// The static shared memory of `function` (0 when it has none).
    pub fn static_shared(&self, function: &str) -> u64 {
        let want = format!(".nv.shared.{function}");
        self.sections.iter().find(|(n, _)| *n == want).map_or(0, |(_, s)| *s)
    }
}

/// Reads the section table and symbol names of a 64-bit little-endian ELF (a CUBIN).
pub fn read_cubin(elf: &[u8]) -> Result<CubinInfo> {
    let bad = |what: &str| Error::Config(format!("not a readable CUBIN: {what}"));
    let at = |o: usize, n: usize| elf.get(o..o + n).ok_or_else(|| bad("truncated"));
    let u16_at = |o: usize| at(o, 2).map(|b| u16::from_le_bytes(b.try_into().expect("2 bytes")) as usize);
    let u32_at = |o: usize| at(o, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    let u64_at = |o: usize| at(o, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    if !elf.starts_with(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(bad("not a 64-bit little-endian ELF"));
    }
    let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28)? as usize, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    struct Section {
        name: usize,
        kind: usize,
        offset: usize,
        size: u64,
        link: usize,
    }
    let mut sections = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        sections.push(Section {
            name: u32_at(h)?,
            kind: u32_at(h + 4)?,
            offset: u64_at(h + 0x18)? as usize,
            size: u64_at(h + 0x20)?,
            link: u32_at(h + 0x28)?,
        });
    }
    let string = |table: usize, index: usize| -> Result<String> {
        let s = sections.get(table).ok_or_else(|| bad("string table index"))?;
        let bytes = elf.get(s.offset + index..s.offset + s.size as usize).ok_or_else(|| bad("string offset"))?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    };
    let mut info = CubinInfo::default();
    for s in &sections {
        info.sections.push((string(shstrndx, s.name)?, s.size));
        const SHT_SYMTAB: usize = 2;
        if s.kind == SHT_SYMTAB {
            for k in 0..(s.size as usize / 24) {
                let sym = s.offset + k * 24;
                const STT_FUNC: u8 = 2;
                if at(sym + 4, 1)?[0] & 0xf == STT_FUNC {
                    info.functions.push(string(s.link, u32_at(sym)?)?);
                }
            }
        }
    }
    Ok(info)
}

/// `trident info`'s line about the kernels this binary carries.
pub fn info_line() -> String {
    let archs = precompiled_archs();
    format!(
        "cuda kernels: {} files embedded ({} kernel functions), compiled at run time by NVRTC for the device's sm_XY and cached; {}",
        files().len(),
        KERNELS.len(),
        if archs.is_empty() {
            "no precompiled images (build with TRIDENT_CUDA_ARCHS=80;90a and nvcc to add them)".to_string()
        } else {
            format!("precompiled for {} (nvcc {})", archs.join(", "), precompiled_by())
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_file_is_a_kernel_file_with_its_headers() {
        let names: Vec<&str> = files().iter().map(|(f, _)| *f).collect();
        for f in ["adamw.cu", "attention_bwd.cu", "attention_fwd.cu", "embedding.cu", "gelu.cu", "gemm_bf16.cu"] {
            assert!(names.contains(&f), "{f} in {names:?}");
        }
        let hs: Vec<&str> = headers().iter().map(|(h, _)| *h).collect();
        assert!(hs.contains(&"common/base.cuh") && hs.iter().all(|h| h.starts_with("common/")), "{hs:?}");
        assert!(hs.contains(&"common/portable.h") && hs.contains(&"common/reduce.h"), "{hs:?}");
        assert!(source("gemm_bf16.cu").unwrap().contains("gemm_fwd_bf16"));
        assert!(source("nope.cu").unwrap_err().to_string().contains("no embedded kernel file 'nope.cu'"));
    }

    #[test]
    fn architectures_follow_the_compute_capability() {
        let own = |cc| arch_choice(cc, None);
        assert_eq!(own((8, 0)).unwrap(), "sm_80");
        assert_eq!(own((8, 6)).unwrap(), "sm_86");
        assert_eq!(own((8, 9)).unwrap(), "sm_89");
        assert_eq!(own((9, 0)).unwrap(), "sm_90a");
        assert_eq!(own((10, 0)).unwrap(), "sm_100");
        let e = own((7, 5)).unwrap_err().to_string();
        assert!(e.contains("7.5") && e.contains("8.0 or newer"), "{e}");
    }

    #[test]
    fn trident_cuda_arch_picks_an_older_architecture_the_device_runs() {
        assert_eq!(arch_choice((9, 0), Some("sm_90")).unwrap(), "sm_90");
        assert_eq!(arch_choice((9, 0), Some("sm_80")).unwrap(), "sm_80");
        assert_eq!(arch_choice((9, 0), Some("sm_90a")).unwrap(), "sm_90a");
        assert_eq!(arch_choice((8, 6), Some("sm_80")).unwrap(), "sm_80");
        for (cc, bad) in [
            ((8, 0), "sm_90"),
            ((8, 0), "sm_90a"),
            ((10, 0), "sm_90a"),
            ((9, 0), "sm_75"),
            ((9, 0), "90"),
            ((9, 0), "sm_x"),
        ] {
            let e = arch_choice(cc, Some(bad)).unwrap_err().to_string();
            assert!(e.contains(&format!("TRIDENT_CUDA_ARCH={bad}")) && e.contains("from sm_80 up to"), "{e}");
        }
    }

    #[test]
    fn a_precompiled_image_is_used_only_for_its_exact_arch() {
        let images: &[(&str, &str, &[u8])] =
            &[("gemm_bf16.cu", "sm_80", b"A80"), ("gemm_bf16.cu", "sm_90a", b"A90a"), ("gelu.cu", "sm_80", b"G80")];
        assert_eq!(select_precompiled("gemm_bf16.cu", "sm_80", images), Some(&b"A80"[..]));
        assert_eq!(select_precompiled("gemm_bf16.cu", "sm_90a", images), Some(&b"A90a"[..]));
        assert_eq!(select_precompiled("gelu.cu", "sm_90a", images), None, "NVRTC, not another arch's image");
        assert_eq!(select_precompiled("gemm_bf16.cu", "sm_86", images), None, "8.6 compiles its own");
        assert_eq!(select_precompiled("gemm_bf16.cu", "sm_90", images), None);
        assert_eq!(select_precompiled("adamw.cu", "sm_80", &[]), None);
    }

    #[test]
    fn a_cubin_that_is_not_elf_is_an_error() {
        assert!(read_cubin(b"nope").unwrap_err().to_string().contains("not a 64-bit"));
        let mut short = b"\x7fELF\x02\x01".to_vec();
        short.resize(0x30, 0);
        assert!(read_cubin(&short).unwrap_err().to_string().contains("truncated"));
    }

    /// Only a build with `TRIDENT_CUDA_ARCHS` holds images (`make kernels-check` makes one and
    /// runs this test in it); elsewhere there is nothing to check.
    #[test]
    fn precompiled_images_are_used_before_nvrtc() {
        let dir = std::env::temp_dir().join(format!("trident-aot-{}", std::process::id()));
        let modules = KernelModules::new(ModuleCache::new(&dir));
        if std::env::var("TRIDENT_CUDA_ARCHS").is_ok_and(|v| !v.is_empty()) {
            assert_eq!(precompiled().len(), files().len() * precompiled_archs().len());
            assert!(!precompiled().is_empty(), "TRIDENT_CUDA_ARCHS is set but the build holds no images");
        }
        for storage in [Storage::Bf16, Storage::F16] {
            assert_eq!(precompiled_in(storage).len(), precompiled().len(), "{storage:?}: one image per file and arch");
            for (file, arch, bytes) in precompiled_in(storage) {
                let got = modules.image(file, arch, storage).unwrap();
                assert_eq!((got.origin, got.bytes.as_slice()), (Origin::Precompiled, *bytes), "{file} {arch}");
                let info = read_cubin(bytes).unwrap();
                for k in KERNELS.iter().filter(|k| k.file == *file) {
                    assert!(info.functions.iter().any(|f| f == k.function), "{} not in {file} {arch}", k.function);
                }
            }
        }
        for ((file, arch, bf16), (_, _, fp16)) in precompiled().iter().zip(precompiled_in(Storage::F16)) {
            // gelu.cu's kernels convert their storage type, so its two modules differ.
            if *file == "gelu.cu" {
                assert_ne!(bf16, fp16, "{file} {arch}: the fp16 module is the bf16 one");
            }
        }
        assert!(!dir.exists(), "no NVRTC compilation, so nothing cached");
    }

    #[test]
    fn info_names_the_embedded_kernels() {
        let line = info_line();
        assert!(line.contains(&format!("{} files embedded", files().len())), "{line}");
    }
}
