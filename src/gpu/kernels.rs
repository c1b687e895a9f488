//! The CUDA kernels of `kernels-cuda/`, as the binary carries them, and the table of how each op
//! launches them.
//!
//! **Sources.** build.rs embeds every `kernels-cuda/*.cu` and `kernels-cuda/common/*.cuh` (not the
//! emulation in `emu/`). A kernel file is compiled at run time by NVRTC for the device's exact
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
//! is preferred over binary compatibility).
//!
//! **Table.** `plan` turns an op and its shape into the kernel file, function name, grid, block
//! and shared memory the kernel's opening comment documents, checked against the device limits
//! (`launch::tiled`) and the kernel's own preconditions (head dim 64 or 128, sizes that fit the
//! kernels' `int` arguments), each violated one an error naming the kernel.

use super::cache::{ModuleCache, Outcome};
use super::launch::{tiled, DeviceLimits, LaunchConfig};
use super::nvrtc::{Image, Nvrtc};
use crate::error::{Error, Result};
use std::cell::OnceCell;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));
}

/// The options every kernel is compiled with (NVRTC optimizes by default).
pub const NVRTC_OPTIONS: &[&str] = &["-std=c++17"];

/// The embedded kernel files: (file name, text), sorted by name.
pub fn files() -> &'static [(&'static str, &'static str)] {
    embedded::KERNEL_FILES
}

/// The embedded headers: (include name such as `common/base.cuh`, text).
pub fn headers() -> &'static [(&'static str, &'static str)] {
    embedded::KERNEL_HEADERS
}

/// The precompiled images of this build: (file, arch, CUBIN). Empty unless built with
/// `TRIDENT_CUDA_ARCHS`.
pub fn precompiled() -> &'static [(&'static str, &'static str, &'static [u8])] {
    embedded::AOT_IMAGES
}

/// The architectures this build holds precompiled images for, in build order.
pub fn precompiled_archs() -> Vec<&'static str> {
    let mut out: Vec<&str> = Vec::new();
    for (_, arch, _) in precompiled() {
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

/// The architecture to compile for on a device of compute capability (major, minor).
pub fn arch_for(compute_capability: (i32, i32)) -> Result<String> {
    match compute_capability {
        (major, minor) if major < 8 => Err(Error::Unsupported(format!(
            "a GPU of compute capability {major}.{minor}: trident's CUDA kernels need 8.0 or newer (bf16 mma.sync, cp.async)"
        ))),
        (9, 0) => Ok("sm_90a".to_string()),
        (major, minor) => Ok(format!("sm_{major}{minor}")),
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
    pub image: Image,
    pub bytes: Vec<u8>,
    pub origin: Origin,
}

/// Kernel images for one process: precompiled when the build has the architecture, else from
/// NVRTC (loaded on first need) through the module cache.
pub struct KernelModules {
    cache: ModuleCache,
    nvrtc: OnceCell<std::result::Result<Nvrtc, String>>,
    precompiled: &'static [(&'static str, &'static str, &'static [u8])],
}

impl KernelModules {
    /// Images from this build's precompiled set, else NVRTC (`Nvrtc::load`) and `cache`.
    pub fn new(cache: ModuleCache) -> KernelModules {
        KernelModules { cache, nvrtc: OnceCell::new(), precompiled: precompiled() }
    }

    /// Always NVRTC (this one) through `cache`, whatever the build holds: for tests and tools.
    pub fn nvrtc_only(cache: ModuleCache, nvrtc: Nvrtc) -> KernelModules {
        let cell = OnceCell::new();
        let _ = cell.set(Ok(nvrtc));
        KernelModules { cache, nvrtc: cell, precompiled: &[] }
    }

    pub fn cache(&self) -> &ModuleCache {
        &self.cache
    }

    /// The image of kernel file `file` (e.g. `gemm_bf16.cu`) for `arch` (an `sm_XY`).
    pub fn image(&self, file: &str, arch: &str) -> Result<KernelImage> {
        let text = source(file)?;
        let file: &'static str = files().iter().find(|(f, _)| *f == file).map(|(f, _)| *f).expect("found above");
        if let Some(bytes) = select_precompiled(file, arch, self.precompiled) {
            return Ok(KernelImage {
                file,
                arch: arch.to_string(),
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
        let options: Vec<String> = NVRTC_OPTIONS.iter().map(|o| o.to_string()).collect();
        let name = file.trim_end_matches(".cu");
        let got = self.cache.get_or_compile_with_headers(nvrtc, name, text, headers(), arch, &options)?;
        Ok(KernelImage {
            file,
            arch: arch.to_string(),
            image: got.image,
            bytes: got.bytes,
            origin: Origin::Nvrtc(got.outcome),
        })
    }
}

/// The `extern "C" __global__` functions a kernel source declares, in order.
pub fn declared_functions(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("extern \"C\" __global__") {
        rest = &rest[at..];
        let Some(open) = rest.find('(') else { break };
        // The name is the last identifier before the first '(' (after `void` and any
        // `__launch_bounds__(...)`, whose own '(' comes first: skip past it).
        let head = &rest[..open];
        if head.trim_end().ends_with("__launch_bounds__") {
            let close = rest[open..].find(')').map(|c| open + c + 1).unwrap_or(rest.len());
            let after = &rest[close..];
            let open2 = after.find('(').unwrap_or(after.len());
            if let Some(name) = after[..open2].split_whitespace().last() {
                out.push(name.to_string());
            }
            rest = &after[open2..];
        } else {
            if let Some(name) = head.split_whitespace().last() {
                out.push(name.to_string());
            }
            rest = &rest[open..];
        }
    }
    out
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

/// One kernel function: its file, block size and static shared memory, as its file's opening
/// comment states (`tests/gpu_runtime.rs` checks the shared memory against the NVRTC CUBINs;
/// `xent_bwd_bf16` needs none of its file's reduction scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub function: &'static str,
    pub file: &'static str,
    pub threads: u32,
    pub static_shared: u32,
    /// The lowest compute capability (major x 10 + minor) the kernel runs on; below it the
    /// function is compiled as a stub that traps (the sm_90a wgmma GEMM).
    pub min_arch: u32,
}

const fn spec(function: &'static str, file: &'static str, threads: u32, static_shared: u32) -> KernelSpec {
    KernelSpec { function, file, threads, static_shared, min_arch: 80 }
}

const fn spec_sm90(function: &'static str, file: &'static str, threads: u32, static_shared: u32) -> KernelSpec {
    KernelSpec { function, file, threads, static_shared, min_arch: 90 }
}

/// Every kernel function the CUDA Device launches.
pub const KERNELS: &[KernelSpec] = &[
    spec("adamw_f32_bf16", "adamw.cu", 256, 0),
    spec("attention_bwd_delta_bf16", "attention_bwd.cu", 128, 0),
    spec("attention_bwd_dkv_bf16_d64", "attention_bwd.cu", 128, 27904),
    spec("attention_bwd_dkv_bf16_d128", "attention_bwd.cu", 128, 43648),
    spec("attention_bwd_dq_bf16_d64", "attention_bwd.cu", 128, 27648),
    spec("attention_bwd_dq_bf16_d128", "attention_bwd.cu", 128, 43520),
    spec("attention_fwd_bf16_d64", "attention_fwd.cu", 128, 27648),
    spec("attention_fwd_bf16_d128", "attention_fwd.cu", 128, 34816),
    spec("embedding_fwd_bf16", "embedding.cu", 128, 0),
    spec("embedding_bwd_wte_bf16", "embedding.cu", 128, 0),
    spec("embedding_bwd_wpe_bf16", "embedding.cu", 128, 0),
    spec("gelu_fwd_bf16", "gelu.cu", 256, 0),
    spec("gelu_bwd_bf16", "gelu.cu", 256, 0),
    spec("gemm_fwd_bf16_f32out", "gemm_bf16.cu", 128, 20480),
    spec("gemm_fwd_bf16", "gemm_bf16.cu", 128, 20480),
    spec("gemm_bwd_input_bf16", "gemm_bf16_bwd.cu", 128, 19456),
    spec("gemm_bwd_weight_bf16", "gemm_bf16_bwd.cu", 128, 18432),
    spec_sm90("gemm_fwd_bf16_f32out_sm90", "gemm_bf16_sm90.cu", 128, 16384),
    spec("cast_f32_to_bf16", "casts.cu", 256, 0),
    spec("cast_bf16_to_f32", "casts.cu", 256, 0),
    spec("layernorm_fwd_bf16", "layernorm.cu", 128, 0),
    spec("layernorm_bwd_dx_bf16", "layernorm.cu", 128, 0),
    spec("layernorm_bwd_dparams_bf16", "layernorm.cu", 128, 0),
    spec("xent_max_bf16", "softmax_xent.cu", 256, 128),
    spec("xent_partials_bf16", "softmax_xent.cu", 256, 128),
    spec("xent_bwd_bf16", "softmax_xent.cu", 256, 0),
    // tensor_ops.cu: the CUDA Device's f32 ops. Element-wise and per-column kernels run blocks
    // of 256, per-row kernels a warp per row in blocks of 128.
    spec("add_f32", "tensor_ops.cu", 256, 0),
    spec("add_assign_f32", "tensor_ops.cu", 256, 0),
    spec("add_bias_f32", "tensor_ops.cu", 256, 0),
    spec("round_bf16_f32", "tensor_ops.cu", 256, 0),
    spec("gelu_fwd_f32", "tensor_ops.cu", 256, 0),
    spec("gelu_bwd_f32", "tensor_ops.cu", 256, 0),
    spec("embedding_fwd_f32", "tensor_ops.cu", 256, 0),
    spec("position_fwd_f32", "tensor_ops.cu", 256, 0),
    spec("layernorm_apply_f32", "tensor_ops.cu", 256, 0),
    spec("layernorm_bwd_apply_dx_f32", "tensor_ops.cu", 256, 0),
    spec("xent_bwd_f32", "tensor_ops.cu", 256, 0),
    spec("embedding_bwd_f32", "tensor_ops.cu", 256, 0),
    spec("position_bwd_f32", "tensor_ops.cu", 256, 0),
    spec("column_sum_add_f32", "tensor_ops.cu", 256, 0),
    spec("layernorm_bwd_params_f32", "tensor_ops.cu", 256, 0),
    spec("layernorm_fwd_f32", "tensor_ops.cu", 128, 0),
    spec("layernorm_bwd_dx_f32", "tensor_ops.cu", 128, 0),
    spec("layernorm_sums_f32", "tensor_ops.cu", 128, 0),
    spec("layernorm_bwd_sums_f32", "tensor_ops.cu", 128, 0),
    spec("xent_max_f32", "tensor_ops.cu", 128, 0),
    spec("xent_partials_f32", "tensor_ops.cu", 128, 0),
    spec("sum_squares_f32", "tensor_ops.cu", 256, 64),
];

/// The spec of a kernel function.
pub fn kernel(function: &str) -> Result<&'static KernelSpec> {
    KERNELS.iter().find(|k| k.function == function).ok_or_else(|| Error::Config(format!("no kernel named {function}")))
}

/// The GEMM's output type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmOut {
    F32,
    Bf16,
}

/// An op the CUDA Device launches, with the sizes that decide its launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// out [m, n] = A [m, k] · W [n, k]ᵀ (+ bias, GELU, residual fused).
    GemmFwd {
        m: usize,
        n: usize,
        k: usize,
        out: GemmOut,
    },
    /// dinp [m, k] = dout [m, n] · W [n, k] (overwrite).
    GemmBwdInput {
        m: usize,
        n: usize,
        k: usize,
    },
    /// dW [n, k] += dout [m, n]ᵀ · inp [m, k].
    GemmBwdWeight {
        m: usize,
        n: usize,
        k: usize,
    },
    /// The forward GEMM on sm_90a's wgmma (f32 output; compute capability 9.0 only).
    GemmFwdSm90 {
        m: usize,
        n: usize,
        k: usize,
    },
    CastF32ToBf16 {
        n: usize,
    },
    CastBf16ToF32 {
        n: usize,
    },
    LayernormFwd {
        rows: usize,
        channels: usize,
    },
    LayernormBwdDx {
        rows: usize,
        channels: usize,
    },
    LayernormBwdParams {
        rows: usize,
        channels: usize,
    },
    GeluFwd {
        n: usize,
    },
    GeluBwd {
        n: usize,
    },
    AdamW {
        n: usize,
    },
    XentMax {
        rows: usize,
        vocab: usize,
    },
    XentPartials {
        rows: usize,
        vocab: usize,
    },
    XentBwd {
        rows: usize,
        vocab: usize,
    },
    EmbeddingFwd {
        batch: usize,
        seq: usize,
        hidden: usize,
    },
    EmbeddingBwdWte {
        batch: usize,
        seq: usize,
        hidden: usize,
    },
    EmbeddingBwdWpe {
        batch: usize,
        seq: usize,
        hidden: usize,
    },
    AttentionFwd {
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    },
    AttentionBwdDelta {
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    },
    AttentionBwdDkv {
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    },
    AttentionBwdDq {
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    },
}

/// A planned launch: which function of which file, and the checked geometry. `config.shared_bytes`
/// is the dynamic shared memory to pass to `cuLaunchKernel` (0: every kernel here declares its
/// shared memory statically, `static_shared` bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    pub spec: &'static KernelSpec,
    pub config: LaunchConfig,
}

/// Grid-stride kernels (GELU, AdamW) launch at most this many blocks per SM: 8 blocks of 256
/// threads fill an SM's 2048 resident threads, so one wave covers the device.
pub const GRID_STRIDE_BLOCKS_PER_SM: usize = 8;

/// The launch of `op` on a device with `limits` and `multiprocessors` SMs.
pub fn plan(op: &Op, limits: &DeviceLimits, multiprocessors: u32) -> Result<KernelLaunch> {
    let function = function_of(op)?;
    let spec = kernel(function)?;
    let ints: Vec<(&str, usize)> = int_arguments(op);
    for (what, v) in ints {
        if v > i32::MAX as usize {
            return Err(Error::Config(format!(
                "kernel {function}: {what} = {v} does not fit the kernel's int argument (at most {})",
                i32::MAX
            )));
        }
    }
    let t = spec.threads as usize;
    let (problem, tile) = match *op {
        Op::GemmFwd { m, n, .. } | Op::GemmFwdSm90 { m, n, .. } => ([n, m, 1], [64, 64, 1]),
        // A 64 x 64 tile of dinp [m, k] or of dW [n, k] per block.
        Op::GemmBwdInput { m, k, .. } => ([k, m, 1], [64, 64, 1]),
        Op::GemmBwdWeight { n, k, .. } => ([k, n, 1], [64, 64, 1]),
        // Eight elements per thread, grid-stride, capped like GELU's.
        Op::CastF32ToBf16 { n } | Op::CastBf16ToF32 { n } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([n.div_ceil(8).min(cap), 1, 1], [t, 1, 1])
        }
        Op::LayernormFwd { rows, .. } | Op::LayernormBwdDx { rows, .. } => ([rows, 1, 1], [4, 1, 1]),
        Op::LayernormBwdParams { channels, .. } => ([channels, 1, 1], [t, 1, 1]),
        Op::GeluFwd { n } | Op::GeluBwd { n } | Op::AdamW { n } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([n.min(cap), 1, 1], [t, 1, 1])
        }
        Op::XentMax { rows, .. } | Op::XentPartials { rows, .. } | Op::XentBwd { rows, .. } => {
            ([rows, 1, 1], [1, 1, 1])
        }
        Op::EmbeddingFwd { batch, seq, hidden } => ([hidden, seq * batch, 1], [t, 1, 1]),
        Op::EmbeddingBwdWte { hidden, .. } => ([hidden, 1, 1], [t, 1, 1]),
        Op::EmbeddingBwdWpe { seq, hidden, .. } => ([hidden, seq, 1], [t, 1, 1]),
        Op::AttentionFwd { batch, seq, heads, .. }
        | Op::AttentionBwdDkv { batch, seq, heads, .. }
        | Op::AttentionBwdDq { batch, seq, heads, .. } => ([seq, batch * heads, 1], [64, 1, 1]),
        // A warp per (row, head): 4 per block of 128.
        Op::AttentionBwdDelta { batch, seq, heads, .. } => ([seq * batch * heads, 1, 1], [4, 1, 1]),
    };
    if spec.static_shared > limits.shared_bytes_per_block {
        return Err(Error::Config(format!(
            "kernel {function}: {} bytes of static shared memory exceed the device's {} per block",
            spec.static_shared, limits.shared_bytes_per_block
        )));
    }
    let config = tiled(function, problem, tile, [spec.threads, 1, 1], 0, limits)?;
    Ok(KernelLaunch { spec, config })
}

fn function_of(op: &Op) -> Result<&'static str> {
    let by_dim = |d: usize, d64: &'static str, d128: &'static str, what: &str| match d {
        64 => Ok(d64),
        128 => Ok(d128),
        _ => Err(Error::Unsupported(format!(
            "{what} on CUDA: the kernels are built for head dims 64 and 128, and this model's head dim is {d}"
        ))),
    };
    Ok(match *op {
        Op::GemmFwd { out: GemmOut::F32, .. } => "gemm_fwd_bf16_f32out",
        Op::GemmFwd { out: GemmOut::Bf16, .. } => "gemm_fwd_bf16",
        Op::GemmBwdInput { .. } => "gemm_bwd_input_bf16",
        Op::GemmBwdWeight { .. } => "gemm_bwd_weight_bf16",
        Op::GemmFwdSm90 { .. } => "gemm_fwd_bf16_f32out_sm90",
        Op::CastF32ToBf16 { .. } => "cast_f32_to_bf16",
        Op::CastBf16ToF32 { .. } => "cast_bf16_to_f32",
        Op::LayernormFwd { .. } => "layernorm_fwd_bf16",
        Op::LayernormBwdDx { .. } => "layernorm_bwd_dx_bf16",
        Op::LayernormBwdParams { .. } => "layernorm_bwd_dparams_bf16",
        Op::GeluFwd { .. } => "gelu_fwd_bf16",
        Op::GeluBwd { .. } => "gelu_bwd_bf16",
        Op::AdamW { .. } => "adamw_f32_bf16",
        Op::XentMax { .. } => "xent_max_bf16",
        Op::XentPartials { .. } => "xent_partials_bf16",
        Op::XentBwd { .. } => "xent_bwd_bf16",
        Op::EmbeddingFwd { .. } => "embedding_fwd_bf16",
        Op::EmbeddingBwdWte { .. } => "embedding_bwd_wte_bf16",
        Op::EmbeddingBwdWpe { .. } => "embedding_bwd_wpe_bf16",
        Op::AttentionFwd { head_dim, .. } => {
            by_dim(head_dim, "attention_fwd_bf16_d64", "attention_fwd_bf16_d128", "attention forward")?
        }
        Op::AttentionBwdDelta { head_dim, .. } => {
            by_dim(head_dim, "attention_bwd_delta_bf16", "attention_bwd_delta_bf16", "attention backward")?
        }
        Op::AttentionBwdDkv { head_dim, .. } => {
            by_dim(head_dim, "attention_bwd_dkv_bf16_d64", "attention_bwd_dkv_bf16_d128", "attention backward")?
        }
        Op::AttentionBwdDq { head_dim, .. } => {
            by_dim(head_dim, "attention_bwd_dq_bf16_d64", "attention_bwd_dq_bf16_d128", "attention backward")?
        }
    })
}

/// The sizes an op passes to its kernel as `int`, or that the kernel indexes with `int`.
fn int_arguments(op: &Op) -> Vec<(&'static str, usize)> {
    match *op {
        Op::GemmFwd { m, n, k, .. }
        | Op::GemmBwdInput { m, n, k }
        | Op::GemmBwdWeight { m, n, k }
        | Op::GemmFwdSm90 { m, n, k } => vec![("M", m), ("N", n), ("K", k)],
        Op::CastF32ToBf16 { n } | Op::CastBf16ToF32 { n } => vec![("n", n)],
        Op::LayernormFwd { rows, channels }
        | Op::LayernormBwdDx { rows, channels }
        | Op::LayernormBwdParams { rows, channels } => {
            vec![("rows", rows), ("C", channels)]
        }
        Op::GeluFwd { n } | Op::GeluBwd { n } | Op::AdamW { n } => vec![("n", n)],
        Op::XentMax { rows, vocab } | Op::XentPartials { rows, vocab } | Op::XentBwd { rows, vocab } => {
            vec![("rows", rows), ("V", vocab)]
        }
        Op::EmbeddingFwd { batch, seq, hidden }
        | Op::EmbeddingBwdWte { batch, seq, hidden }
        | Op::EmbeddingBwdWpe { batch, seq, hidden } => {
            vec![("batch·seq", batch.saturating_mul(seq)), ("hidden", hidden)]
        }
        Op::AttentionFwd { batch, seq, heads, .. }
        | Op::AttentionBwdDelta { batch, seq, heads, .. }
        | Op::AttentionBwdDkv { batch, seq, heads, .. }
        | Op::AttentionBwdDq { batch, seq, heads, .. } => {
            vec![("batch·heads·seq", batch.saturating_mul(heads).saturating_mul(seq))]
        }
    }
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

    const A100: DeviceLimits = DeviceLimits::A100;

    fn p(op: Op) -> KernelLaunch {
        plan(&op, &A100, 108).unwrap()
    }

    #[test]
    fn every_embedded_file_is_a_kernel_file_with_its_headers() {
        let names: Vec<&str> = files().iter().map(|(f, _)| *f).collect();
        for f in ["adamw.cu", "attention_bwd.cu", "attention_fwd.cu", "embedding.cu", "gelu.cu", "gemm_bf16.cu"] {
            assert!(names.contains(&f), "{f} in {names:?}");
        }
        let hs: Vec<&str> = headers().iter().map(|(h, _)| *h).collect();
        assert!(hs.contains(&"common/base.cuh") && hs.iter().all(|h| h.starts_with("common/")), "{hs:?}");
        assert!(source("gemm_bf16.cu").unwrap().contains("gemm_fwd_bf16"));
        assert!(source("nope.cu").unwrap_err().to_string().contains("no embedded kernel file 'nope.cu'"));
    }

    #[test]
    fn the_table_names_every_declared_kernel_and_only_those() {
        let mut declared = Vec::new();
        for (file, text) in files() {
            for f in declared_functions(text) {
                declared.push((f, *file));
            }
        }
        for k in KERNELS {
            assert!(declared.contains(&(k.function.to_string(), k.file)), "{} not declared in {}", k.function, k.file);
        }
        // Every declared kernel of the files the table covers has an entry (new files, such as
        // the sm_90a GEMM being written, join the table when the Device uses them).
        for (f, file) in &declared {
            if KERNELS.iter().any(|k| k.file == *file) {
                assert!(KERNELS.iter().any(|k| k.function == f), "{f} of {file} is not in the table");
            }
        }
        assert_eq!(
            declared_functions(source("gelu.cu").unwrap()),
            vec!["gelu_fwd_bf16".to_string(), "gelu_bwd_bf16".to_string()]
        );
    }

    #[test]
    fn architectures_follow_the_compute_capability() {
        assert_eq!(arch_for((8, 0)).unwrap(), "sm_80");
        assert_eq!(arch_for((8, 6)).unwrap(), "sm_86");
        assert_eq!(arch_for((8, 9)).unwrap(), "sm_89");
        assert_eq!(arch_for((9, 0)).unwrap(), "sm_90a");
        assert_eq!(arch_for((10, 0)).unwrap(), "sm_100");
        let e = arch_for((7, 5)).unwrap_err().to_string();
        assert!(e.contains("7.5") && e.contains("8.0 or newer"), "{e}");
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
    fn geometry_for_ragged_shapes_matches_the_kernel_headers() {
        let g = p(Op::GemmFwd { m: 100, n: 70, k: 33, out: GemmOut::Bf16 });
        assert_eq!((g.spec.function, g.config.grid, g.config.block), ("gemm_fwd_bf16", [2, 2, 1], [128, 1, 1]));
        assert_eq!((g.config.shared_bytes, g.spec.static_shared), (0, 20480));
        assert_eq!(p(Op::GemmFwd { m: 1, n: 1, k: 1, out: GemmOut::F32 }).config.grid, [1, 1, 1]);
        assert_eq!(p(Op::GemmFwd { m: 1024, n: 3072, k: 768, out: GemmOut::F32 }).config.grid, [48, 16, 1]);
        assert_eq!(p(Op::LayernormFwd { rows: 7, channels: 33 }).config.grid, [2, 1, 1]);
        assert_eq!(p(Op::LayernormBwdDx { rows: 8, channels: 33 }).config.grid, [2, 1, 1]);
        let d = p(Op::LayernormBwdParams { rows: 7, channels: 129 });
        assert_eq!((d.config.grid, d.config.block), ([2, 1, 1], [128, 1, 1]));
        let e = p(Op::GeluFwd { n: 1000 });
        assert_eq!((e.config.grid, e.config.block), ([4, 1, 1], [256, 1, 1]));
        // Grid-stride kernels stop at 8 blocks per SM.
        assert_eq!(p(Op::AdamW { n: 124_000_000 }).config.grid, [8 * 108, 1, 1]);
        assert_eq!(p(Op::GeluBwd { n: 1 }).config.grid, [1, 1, 1]);
        let x = p(Op::XentPartials { rows: 5, vocab: 1000 });
        assert_eq!((x.config.grid, x.config.block, x.spec.static_shared), ([5, 1, 1], [256, 1, 1], 128));
        assert_eq!(p(Op::EmbeddingFwd { batch: 3, seq: 5, hidden: 130 }).config.grid, [2, 15, 1]);
        assert_eq!(p(Op::EmbeddingBwdWte { batch: 3, seq: 5, hidden: 130 }).config.grid, [2, 1, 1]);
        assert_eq!(p(Op::EmbeddingBwdWpe { batch: 3, seq: 5, hidden: 130 }).config.grid, [2, 5, 1]);
        let a = p(Op::AttentionFwd { batch: 2, seq: 100, heads: 3, head_dim: 64 });
        assert_eq!(
            (a.spec.function, a.config.grid, a.spec.static_shared),
            ("attention_fwd_bf16_d64", [2, 6, 1], 27648)
        );
        let a = p(Op::AttentionFwd { batch: 1, seq: 77, heads: 2, head_dim: 128 });
        assert_eq!(
            (a.spec.function, a.config.grid, a.spec.static_shared),
            ("attention_fwd_bf16_d128", [2, 2, 1], 34816)
        );
        // seq·batch = 200 rows, 3 heads: 600 warps, 150 blocks of 4.
        let dl = p(Op::AttentionBwdDelta { batch: 2, seq: 100, heads: 3, head_dim: 64 });
        assert_eq!((dl.config.grid, dl.config.block), ([150, 1, 1], [128, 1, 1]));
        assert_eq!(p(Op::AttentionBwdDelta { batch: 1, seq: 1, heads: 1, head_dim: 128 }).config.grid, [1, 1, 1]);
        let kv = p(Op::AttentionBwdDkv { batch: 2, seq: 70, heads: 1, head_dim: 128 });
        assert_eq!(
            (kv.spec.function, kv.config.grid, kv.spec.static_shared),
            ("attention_bwd_dkv_bf16_d128", [2, 2, 1], 43648)
        );
        let q = p(Op::AttentionBwdDq { batch: 1, seq: 1, heads: 1, head_dim: 64 });
        assert_eq!(
            (q.spec.function, q.config.grid, q.spec.static_shared),
            ("attention_bwd_dq_bf16_d64", [1, 1, 1], 27648)
        );
    }

    /// Every shape `tests/cuda_emulation.rs` runs, with the grid its harness
    /// (`kernels-cuda/emu/tests/harness.cpp`) launches: the same numbers, restated here.
    #[test]
    fn backward_gemm_wgmma_and_cast_launches_match_their_headers() {
        // gemm_bf16_bwd.cu: a 64 x 64 tile of dinp [M, K] or dW [N, K] per block of 128 threads.
        let d = p(Op::GemmBwdInput { m: 100, n: 70, k: 33 });
        assert_eq!((d.spec.function, d.config.grid, d.config.block), ("gemm_bwd_input_bf16", [1, 2, 1], [128, 1, 1]));
        let w = p(Op::GemmBwdWeight { m: 37, n: 130, k: 99 });
        assert_eq!((w.spec.function, w.config.grid), ("gemm_bwd_weight_bf16", [2, 3, 1]));
        // gemm_bf16_sm90.cu: one warpgroup per 64 x 64 tile of out [M, N]; sm_90a only.
        let g = p(Op::GemmFwdSm90 { m: 130, n: 192, k: 160 });
        assert_eq!((g.config.grid, g.spec.min_arch), ([3, 3, 1], 90));
        // casts.cu: eight elements per thread, blocks of 256, grid-stride.
        assert_eq!(p(Op::CastF32ToBf16 { n: 20_000 }).config.grid, [10, 1, 1]);
        assert_eq!(p(Op::CastBf16ToF32 { n: 1 }).config.grid, [1, 1, 1]);
        assert_eq!(p(Op::CastF32ToBf16 { n: 1 << 30 }).config.grid, [8 * 108, 1, 1]);
        assert!(plan(&Op::GemmBwdInput { m: 0, n: 1, k: 1 }, &DeviceLimits::A100, 108).is_err());
    }

    #[test]
    fn geometry_matches_the_emulation_harness_on_its_shapes() {
        let cd = |n: usize, t: usize| n.div_ceil(t) as u32;
        for (m, n, k) in [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)]
            .into_iter()
            .chain([(64, 64, 64), (77, 99, 56), (129, 65, 33)])
        {
            for out in [GemmOut::F32, GemmOut::Bf16] {
                let g = p(Op::GemmFwd { m, n, k, out });
                assert_eq!((g.config.grid, g.config.block), ([cd(n, 64), cd(m, 64), 1], [128, 1, 1]));
            }
        }
        for (rows, channels) in [(4, 32), (7, 50), (13, 200), (6, 768), (3, 5), (5, 96), (9, 130), (2, 31)] {
            assert_eq!(p(Op::LayernormFwd { rows, channels }).config.grid, [cd(rows, 4), 1, 1]);
            assert_eq!(p(Op::LayernormBwdDx { rows, channels }).config.grid, [cd(rows, 4), 1, 1]);
            assert_eq!(p(Op::LayernormBwdParams { rows, channels }).config.grid, [cd(channels, 128), 1, 1]);
        }
        for (rows, vocab) in [(5, 1000), (3, 333), (2, 12565), (4, 1)] {
            for op in [Op::XentMax { rows, vocab }, Op::XentPartials { rows, vocab }, Op::XentBwd { rows, vocab }] {
                assert_eq!((p(op).config.grid, p(op).config.block), ([rows as u32, 1, 1], [256, 1, 1]));
            }
        }
        for (batch, seq, hidden) in [(2, 5, 96), (3, 7, 130), (1, 4, 200), (4, 3, 33)] {
            let h = cd(hidden, 128);
            assert_eq!(p(Op::EmbeddingFwd { batch, seq, hidden }).config.grid, [h, (seq * batch) as u32, 1]);
            assert_eq!(p(Op::EmbeddingBwdWte { batch, seq, hidden }).config.grid, [h, 1, 1]);
            assert_eq!(p(Op::EmbeddingBwdWpe { batch, seq, hidden }).config.grid, [h, seq as u32, 1]);
        }
        for (batch, seq, heads, head_dim) in [
            (1, 64, 1, 64),
            (2, 100, 3, 64),
            (1, 1, 2, 64),
            (1, 77, 2, 128),
            (2, 130, 1, 128),
            (1, 5, 1, 128),
            (2, 100, 2, 64),
            (1, 1, 1, 64),
            (2, 70, 1, 128),
            (1, 3, 1, 128),
        ] {
            let grid = [cd(seq, 64), (batch * heads) as u32, 1];
            assert_eq!(p(Op::AttentionFwd { batch, seq, heads, head_dim }).config.grid, grid);
            assert_eq!(p(Op::AttentionBwdDkv { batch, seq, heads, head_dim }).config.grid, grid);
            assert_eq!(p(Op::AttentionBwdDq { batch, seq, heads, head_dim }).config.grid, grid);
            let delta = p(Op::AttentionBwdDelta { batch, seq, heads, head_dim });
            assert_eq!(delta.config.grid, [cd(seq * batch * heads, 4), 1, 1]);
        }
    }

    #[test]
    fn shared_memory_fits_every_device_without_opting_in() {
        for k in KERNELS {
            assert!(k.static_shared <= DeviceLimits::A100.shared_bytes_per_block, "{}", k.function);
            assert!(k.threads <= DeviceLimits::A100.max_threads_per_block && k.threads % 32 == 0, "{}", k.function);
        }
        let tiny = DeviceLimits { shared_bytes_per_block: 32 * 1024, ..DeviceLimits::A100 };
        let e =
            plan(&Op::AttentionBwdDq { batch: 1, seq: 8, heads: 1, head_dim: 128 }, &tiny, 1).unwrap_err().to_string();
        assert!(e.contains("kernel attention_bwd_dq_bf16_d128: 43520 bytes of static shared memory"), "{e}");
    }

    #[test]
    fn violated_preconditions_are_errors_naming_the_kernel() {
        let e =
            plan(&Op::AttentionFwd { batch: 1, seq: 8, heads: 1, head_dim: 96 }, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("head dims 64 and 128") && e.contains("head dim is 96"), "{e}");
        let e = plan(&Op::AttentionBwdDkv { batch: 1, seq: 8, heads: 1, head_dim: 32 }, &A100, 108)
            .unwrap_err()
            .to_string();
        assert!(e.contains("head dim is 32"), "{e}");
        let e = plan(&Op::GemmFwd { m: 0, n: 8, k: 8, out: GemmOut::Bf16 }, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("kernel gemm_fwd_bf16") && e.contains("zero"), "{e}");
        let e = plan(&Op::GeluFwd { n: 3_000_000_000 }, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("kernel gelu_fwd_bf16: n = 3000000000 does not fit"), "{e}");
        // Grid y is at most 65535: batch·heads for attention, seq·batch rows for the embedding.
        let e = plan(&Op::EmbeddingFwd { batch: 64, seq: 2048, hidden: 768 }, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("kernel embedding_fwd_bf16") && e.contains("131072 blocks along y"), "{e}");
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
        for (file, arch, bytes) in precompiled() {
            let got = modules.image(file, arch).unwrap();
            assert_eq!((got.origin, got.bytes.as_slice()), (Origin::Precompiled, *bytes), "{file} {arch}");
            let info = read_cubin(bytes).unwrap();
            for k in KERNELS.iter().filter(|k| k.file == *file) {
                assert!(info.functions.iter().any(|f| f == k.function), "{} not in {file} {arch}", k.function);
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
