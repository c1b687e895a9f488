//! The HIP kernels, as the binary carries them, and their code objects: the AMD counterpart of
//! `cuda.rs`'s sources and `KernelModules`.
//!
//! **Sources.** build.rs embeds the portable kernels both vendors compile (every `kernels/*.cu`
//! and `kernels/common/*.h`) and the AMD ones (every `kernels-hip/*.hip` and
//! `kernels-hip/common/*.h`; not the emulation in `emu/`). A kernel file is compiled at run time by hipRTC for the device's gfx
//! architecture (`--offload-arch=gfx90a`), with every embedded header passed by include name
//! (`common/base.h`, ...), through the on-disk cache of `cache.rs`, whose key covers the file's
//! text, every header's text, the architecture, hipRTC's version and the options.
//!
//! **Ahead of time.** A binary built with `TRIDENT_HIP_ARCHS=gfx90a;gfx942` and hipcc (or clang)
//! at hand also holds one code object (v4) per kernel file and listed architecture;
//! `HipKernelModules::image` uses the one whose architecture is exactly the device's before
//! hipRTC, and compiles with hipRTC otherwise.
//!
//! **Storage.** As on CUDA, each file compiles to one module per 16-bit storage type (`Storage`):
//! bf16 with the options above, or fp16 with `-DTRIDENT_FP16` added (the same sources, binary16
//! storage and the f16 MFMA, `kernels-hip/common/base.h`); its own cache entry, its own
//! precompiled code objects (`precompiled_in`).

use super::cuda::{archs_of, select_precompiled};
use super::Storage;
use crate::error::{Error, Result};
use crate::gpu::cache::{ModuleCache, Outcome};
use crate::gpu::hiprtc::Hiprtc;
use std::cell::OnceCell;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/hip_kernel_sources.rs"));
}

/// The options every kernel is compiled with by hipRTC (besides `--offload-arch`).
pub const HIPRTC_OPTIONS: &[&str] = &["-O3", "-std=c++17"];

/// hipRTC's options for the module of `storage`: `HIPRTC_OPTIONS` and the storage's define.
pub fn hiprtc_options(storage: Storage) -> Vec<String> {
    HIPRTC_OPTIONS.iter().chain(storage.defines()).map(|o| o.to_string()).collect()
}

/// The embedded kernel files: (file name, text), sorted by name.
pub fn files() -> &'static [(&'static str, &'static str)] {
    embedded::HIP_KERNEL_FILES
}

/// The embedded headers: (include name such as `common/base.h`, text).
pub fn headers() -> &'static [(&'static str, &'static str)] {
    embedded::HIP_KERNEL_HEADERS
}

/// The precompiled code objects of this build's bf16 modules: (file, arch, code object). Empty
/// unless built with `TRIDENT_HIP_ARCHS`.
pub fn precompiled() -> &'static [(&'static str, &'static str, &'static [u8])] {
    embedded::HIP_AOT_IMAGES
}

/// The precompiled code objects of the modules of `storage` (build.rs compiles both for every
/// listed architecture).
pub fn precompiled_in(storage: Storage) -> &'static [(&'static str, &'static str, &'static [u8])] {
    match storage {
        Storage::Bf16 => embedded::HIP_AOT_IMAGES,
        Storage::F16 => embedded::HIP_AOT_IMAGES_FP16,
    }
}

/// The architectures this build holds precompiled code objects for, in build order.
pub fn precompiled_archs() -> Vec<&'static str> {
    archs_of(precompiled())
}

/// The compiler that built the precompiled code objects (its `clang version` line), empty when none.
pub fn precompiled_by() -> &'static str {
    embedded::HIP_AOT_COMPILER
}

/// The text of an embedded kernel file.
pub fn source(file: &str) -> Result<(&'static str, &'static str)> {
    files().iter().find(|(f, _)| *f == file).copied().ok_or_else(|| {
        let known: Vec<&str> = files().iter().map(|(f, _)| *f).collect();
        Error::Config(format!("no embedded HIP kernel file '{file}' (this build has {})", known.join(", ")))
    })
}

/// Where a code object came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HipOrigin {
    /// Compiled by hipcc when the binary was built.
    Precompiled,
    /// Compiled by hipRTC now, or earlier and read from the cache (the outcome says which).
    Hiprtc(Outcome),
}

pub struct HipKernelImage {
    pub file: &'static str,
    pub arch: String,
    pub storage: Storage,
    pub bytes: Vec<u8>,
    pub origin: HipOrigin,
}

/// Code objects for one process: precompiled when the build has the architecture, else from
/// hipRTC (loaded on first need) through the module cache.
pub struct HipKernelModules {
    cache: ModuleCache,
    hiprtc: OnceCell<std::result::Result<Hiprtc, String>>,
    /// Whether this build's precompiled code objects are used (`precompiled_in`).
    use_precompiled: bool,
}

impl HipKernelModules {
    /// Code objects from this build's precompiled set, else hipRTC (`Hiprtc::load`) and `cache`.
    pub fn new(cache: ModuleCache) -> HipKernelModules {
        HipKernelModules { cache, hiprtc: OnceCell::new(), use_precompiled: true }
    }

    /// Always hipRTC (this one) through `cache`, whatever the build holds: for tests and tools.
    pub fn hiprtc_only(cache: ModuleCache, hiprtc: Hiprtc) -> HipKernelModules {
        let cell = OnceCell::new();
        let _ = cell.set(Ok(hiprtc));
        HipKernelModules { cache, hiprtc: cell, use_precompiled: false }
    }

    pub fn cache(&self) -> &ModuleCache {
        &self.cache
    }

    /// The code object of kernel file `file` (e.g. `gemm_bf16.hip`) for `arch` (a `gfx...`), its
    /// module of `storage`.
    pub fn image(&self, file: &str, arch: &str, storage: Storage) -> Result<HipKernelImage> {
        let (file, text) = source(file)?;
        let images = if self.use_precompiled { precompiled_in(storage) } else { &[] };
        if let Some(bytes) = select_precompiled(file, arch, images) {
            return Ok(HipKernelImage {
                file,
                arch: arch.to_string(),
                storage,
                bytes: bytes.to_vec(),
                origin: HipOrigin::Precompiled,
            });
        }
        let hiprtc = self.hiprtc.get_or_init(|| Hiprtc::load().map_err(|e| e.to_string())).as_ref().map_err(|e| {
            let built = archs_of(images);
            Error::Unsupported(format!(
                "HIP kernel {file} for {arch}: {} and {e}",
                if built.is_empty() {
                    "this build holds no precompiled HIP kernels".to_string()
                } else {
                    format!("this build holds precompiled HIP kernels for {} only", built.join(", "))
                }
            ))
        })?;
        let name = file.trim_end_matches(".hip").trim_end_matches(".cu");
        let got = self.cache.get_or_compile_hip(hiprtc, name, text, headers(), arch, &hiprtc_options(storage))?;
        Ok(HipKernelImage {
            file,
            arch: arch.to_string(),
            storage,
            bytes: got.bytes,
            origin: HipOrigin::Hiprtc(got.outcome),
        })
    }
}

/// What the header of an AMD code object (an ELF file for `EM_AMDGPU`) says.
#[derive(Debug, PartialEq, Eq)]
pub struct CodeObjectHeader {
    /// The architecture from `e_flags`' `EF_AMDGPU_MACH` field, when this table knows it.
    pub arch: Option<&'static str>,
    /// The code object version (`EI_ABIVERSION` + 2: ABI version 2 is code object v4).
    pub version: u8,
}

/// `EF_AMDGPU_MACH` values (LLVM's AMDGPUUsage) of the architectures trident targets.
const AMDGPU_MACH: &[(u32, &str)] = &[(0x30, "gfx908"), (0x3f, "gfx90a"), (0x40, "gfx940"), (0x4c, "gfx942")];

/// Reads the ELF header of an AMD code object.
pub fn code_object_header(elf: &[u8]) -> Result<CodeObjectHeader> {
    let bad = |what: &str| Error::Config(format!("not an AMD code object: {what}"));
    if elf.len() < 0x34 || !elf.starts_with(b"\x7fELF") || elf[4] != 2 || elf[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF"));
    }
    const EM_AMDGPU: u16 = 0xe0;
    const ELFOSABI_AMDGPU_HSA: u8 = 64;
    if u16::from_le_bytes([elf[0x12], elf[0x13]]) != EM_AMDGPU || elf[7] != ELFOSABI_AMDGPU_HSA {
        return Err(bad("the ELF is not for the AMDGPU HSA target"));
    }
    let flags = u32::from_le_bytes(elf[0x30..0x34].try_into().expect("4 bytes"));
    let arch = AMDGPU_MACH.iter().find(|(m, _)| *m == flags & 0xff).map(|(_, a)| *a);
    Ok(CodeObjectHeader { arch, version: elf[8] + 2 })
}

/// `trident info`'s line about the HIP kernels this binary carries.
pub fn info_line() -> String {
    let archs = precompiled_archs();
    format!(
        "hip kernels: {} files embedded, compiled at run time by hipRTC for the device's gfx architecture and cached; {}",
        files().len(),
        if archs.is_empty() {
            "no precompiled code objects (build with TRIDENT_HIP_ARCHS=gfx90a;gfx942 and hipcc to add them)".to_string()
        } else {
            format!("precompiled for {} ({})", archs.join(", "), precompiled_by())
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernels::{cuda::read_cubin, declared_functions};

    #[test]
    fn every_embedded_file_is_a_hip_kernel_file_with_its_headers() {
        assert!(files().iter().any(|(f, _)| *f == "gemm_bf16.hip"));
        for (file, text) in files() {
            // A vendor file, or a portable one that the CUDA suite holds too, the same text.
            let portable = super::super::cuda::source(file).ok();
            assert!(file.ends_with(".hip") || portable == Some(*text), "{file}");
            assert!(!declared_functions(text).is_empty(), "{file} declares no extern \"C\" kernel");
        }
        assert!(files().iter().any(|(f, _)| *f == "layernorm.cu"), "the portable kernels are embedded");
        for h in ["common/base.h", "common/portable.h", "common/reduce.h"] {
            assert!(headers().iter().any(|(n, _)| *n == h), "{h}");
        }
        assert!(source("nope.hip").unwrap_err().to_string().contains("gemm_bf16.hip"));
    }

    #[test]
    fn code_object_headers_are_read_and_checked() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        (elf[4], elf[5], elf[7], elf[8]) = (2, 1, 64, 2);
        elf[0x12..0x14].copy_from_slice(&0xe0u16.to_le_bytes());
        elf[0x30..0x34].copy_from_slice(&0x53fu32.to_le_bytes());
        assert_eq!(code_object_header(&elf).unwrap(), CodeObjectHeader { arch: Some("gfx90a"), version: 4 });
        elf[0x30] = 0x4c;
        assert_eq!(code_object_header(&elf).unwrap().arch, Some("gfx942"));
        elf[0x12] = 0xbe; // EM_CUDA: a CUBIN is not a code object
        assert!(code_object_header(&elf).unwrap_err().to_string().contains("not for the AMDGPU"));
        assert!(code_object_header(b"nope").is_err());
    }

    /// Only a build with `TRIDENT_HIP_ARCHS` holds code objects (`make kernels-check` makes one
    /// and runs this test in it); elsewhere there is nothing to check.
    #[test]
    fn precompiled_code_objects_are_used_before_hiprtc() {
        let dir = std::env::temp_dir().join(format!("trident-hip-aot-{}", std::process::id()));
        let modules = HipKernelModules::new(ModuleCache::new(&dir));
        if std::env::var("TRIDENT_HIP_ARCHS").is_ok_and(|v| !v.is_empty()) {
            assert!(!precompiled().is_empty(), "TRIDENT_HIP_ARCHS is set but the build holds no code objects");
            assert_eq!(precompiled().len(), files().len() * precompiled_archs().len());
        }
        for storage in [Storage::Bf16, Storage::F16] {
            assert_eq!(precompiled_in(storage).len(), precompiled().len(), "{storage:?}: one object per file and arch");
            for (file, arch, bytes) in precompiled_in(storage) {
                let got = modules.image(file, arch, storage).unwrap();
                assert_eq!((got.origin, got.bytes.as_slice()), (HipOrigin::Precompiled, *bytes), "{file} {arch}");
                let header = code_object_header(bytes).unwrap();
                assert_eq!(header, CodeObjectHeader { arch: Some(arch), version: 4 }, "{file} {arch}");
                let functions = read_cubin(bytes).unwrap().functions;
                for f in declared_functions(source(file).unwrap().1) {
                    assert!(functions.contains(&f), "{f} not in {file} {arch}: {functions:?}");
                }
                // The fp16 module's mark (common/base.h), by which a runtime tells the modules apart.
                let marked = bytes.windows(21).any(|w| w == b"trident_storage_fp16\0");
                assert_eq!(marked, storage == Storage::F16, "{file} {arch} {storage:?}: the fp16 mark");
            }
        }
        assert!(!dir.exists(), "no hipRTC compilation, so nothing cached");
    }

    #[test]
    fn without_hiprtc_or_a_precompiled_object_the_error_says_both() {
        let cell = OnceCell::new();
        let _ = cell.set(Err("libhiprtc.so not found (no ROCm on this machine)".to_string()));
        let dir = std::env::temp_dir().join(format!("trident-hip-none-{}", std::process::id()));
        let modules = HipKernelModules { cache: ModuleCache::new(&dir), hiprtc: cell, use_precompiled: false };
        let e =
            modules.image("gemm_bf16.hip", "gfx90a", Storage::Bf16).err().expect("nothing to compile with").to_string();
        assert_eq!(
            e,
            "not supported by this build: HIP kernel gemm_bf16.hip for gfx90a: this build holds no precompiled HIP kernels and libhiprtc.so not found (no ROCm on this machine)"
        );
        assert!(modules
            .image("nope.hip", "gfx90a", Storage::Bf16)
            .err()
            .unwrap()
            .to_string()
            .contains("no embedded HIP kernel file"));
    }

    #[test]
    fn info_names_the_embedded_hip_kernels() {
        let line = info_line();
        assert!(line.contains(&format!("{} files embedded", files().len())), "{line}");
    }
}
