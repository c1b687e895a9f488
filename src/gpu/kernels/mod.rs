//! The GPU kernel index: every `extern "C" __global__` function of `kernels-cuda/*.cu` and of
//! its `kernels-hip/*.hip` twin, as one table. Each entry names the function, its file, its launch
//! geometry per vendor (CUDA block, HIP workgroup: the `__launch_bounds__` of the sources), its
//! static shared memory and the lowest architecture it runs on; `Kernel` is the typed key.
//! The GPU Device resolves the kernels it launches from this table once per device
//! (`device::DEVICE_KERNELS`), the launch planning of `plan` reads it, the GPU benches launch
//! the kernels nothing in training launches yet (`cmd/bench/gpu.rs`), and `trident info` counts it.
//! A unit test below holds the table to the sources (every declared function listed, every
//! listed function declared, the blocks equal to the launch bounds); another (`cmd/bench/gpu.rs`)
//! holds every entry to a launcher.
//!
//! Loading the files is elsewhere: `cuda` (the embedded CUDA sources, precompiled images or
//! NVRTC through the cache), `hip` (the same for HIP and hipRTC); `plan` turns an op and its
//! shape into a checked launch of the kernel that computes it.

pub mod cuda;
pub mod hip;
pub mod plan;

use crate::error::{Error, Result};
use crate::real::Precision;
use plan::{sm90_gemm_shared_bytes, SM90_GEMM_COLS, SM90_GEMM_WEIGHT_COLS};

/// Every kernel function, in the order of `KERNELS`: the function's name in CamelCase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    AdamwF32Bf16,
    AdamwMultiF32Bf16,
    ZeroMultiU32,
    ClipScaleF64,
    AttentionBwdDeltaBf16,
    AttentionBwdDkvBf16D32,
    AttentionBwdDkvBf16D64,
    AttentionBwdDkvBf16D128,
    AttentionBwdDqBf16D32,
    AttentionBwdDqBf16D64,
    AttentionBwdDqBf16D128,
    AttentionFwdBf16D32,
    AttentionFwdBf16D64,
    AttentionFwdBf16D128,
    CastF32ToBf16,
    CastBf16ToF32,
    EmbeddingFwdBf16,
    EmbeddingBwdWteBf16,
    EmbeddingBwdWpeBf16,
    GeluFwdBf16,
    GeluBwdBf16,
    GemmFwdBf16F32out,
    GemmFwdBf16,
    GemmBwdInputBf16,
    GemmBwdInputBf16Bf16out,
    GemmBwdWeightBf16,
    GemmFwdBf16F32outSm90,
    GemmFwdBf16Sm90,
    GemmBwdInputBf16Sm90,
    GemmBwdInputBf16Bf16outSm90,
    GemmBwdWeightBf16Sm90,
    LayernormFwdBf16,
    LayernormBwdBf16,
    RmsnormFwdBf16,
    RmsnormBwdBf16,
    SwigluFwdBf16,
    SwigluBwdBf16,
    RopeFwdBf16,
    RopeBwdBf16,
    XentMaxBf16,
    XentPartialsBf16,
    XentBwdBf16,
    AddF32,
    AddAssignF32,
    AddBiasF32,
    RoundBf16F32,
    GeluFwdF32,
    GeluBwdF32,
    EmbeddingFwdF32,
    EmbeddingBwdF32,
    PositionFwdF32,
    PositionFwdBf16,
    PositionBwdF32,
    ColumnSumAddF32,
    ColumnSumAddBf16,
    LayernormFwdF32,
    LayernormBwdDxF32,
    LayernormBwdParamsF32,
    LayernormSumsF32,
    LayernormApplyF32,
    LayernormBwdSumsF32,
    LayernormBwdApplyDxF32,
    XentMaxF32,
    XentPartialsF32,
    XentBwdF32,
    SumSquaresF32,
    SumIntoF64,
    XentLossF64,
}

/// One kernel function: its file, its launch geometry per vendor and its static and dynamic
/// shared memory, as its file's opening comment states (`tests/gpu_runtime.rs` checks the shared
/// memory against the NVRTC CUBINs; `xent_bwd_bf16` needs none of its file's reduction scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub kernel: Kernel,
    pub function: &'static str,
    /// The CUDA file (`kernels-cuda/`); the HIP twin is the same name with `.hip`
    /// (`Vendor::file`).
    pub file: &'static str,
    /// Threads per block on CUDA.
    pub threads: u32,
    /// Threads per workgroup on HIP; None where kernels-hip/ has no twin.
    pub hip_threads: Option<u32>,
    /// Static shared memory on CUDA, bytes.
    pub static_shared: u32,
    /// Dynamic shared memory every CUDA launch passes, bytes (0: none; above the default 48 KiB
    /// the launch opts in, `LaunchConfig::needs_shared_optin`). The HIP twins declare theirs
    /// statically (`Vendor::dynamic_shared`).
    pub dynamic_shared: u32,
    /// The lowest compute capability (major x 10 + minor) the kernel runs on; below it the
    /// function is compiled as a stub that traps (the sm_90a wgmma GEMM).
    pub min_arch: u32,
}

const fn spec(
    kernel: Kernel,
    function: &'static str,
    file: &'static str,
    threads: u32,
    hip_threads: Option<u32>,
    static_shared: u32,
) -> KernelSpec {
    KernelSpec { kernel, function, file, threads, hip_threads, static_shared, dynamic_shared: 0, min_arch: 80 }
}

/// An sm_80 GEMM of 256 threads (256-thread HIP twin) with `dynamic_shared` bytes of stages.
const fn gemm(kernel: Kernel, function: &'static str, file: &'static str, dynamic_shared: u32) -> KernelSpec {
    KernelSpec { dynamic_shared, ..spec(kernel, function, file, 256, Some(256), 0) }
}

/// An attention kernel of 128 threads (128-thread HIP twin) with `dynamic_shared` bytes of tiles
/// and stages.
const fn attention(kernel: Kernel, function: &'static str, file: &'static str, dynamic_shared: u32) -> KernelSpec {
    KernelSpec { dynamic_shared, ..spec(kernel, function, file, 128, Some(128), 0) }
}

/// An sm_90a GEMM of gemm_bf16_sm90.cu: 384 threads, no HIP twin, the dynamic shared memory of
/// its tiles of `cols` columns (`plan::sm90_gemm_shared_bytes`).
const fn gemm_sm90(kernel: Kernel, function: &'static str, cols: usize) -> KernelSpec {
    KernelSpec {
        min_arch: 90,
        dynamic_shared: sm90_gemm_shared_bytes(cols) as u32,
        ..spec(kernel, function, "gemm_bf16_sm90.cu", 384, None, 0)
    }
}

/// Every kernel function of kernels-cuda/ and kernels-hip/, in `Kernel`'s order.
pub const KERNELS: &[KernelSpec] = &[
    spec(Kernel::AdamwF32Bf16, "adamw_f32_bf16", "adamw.cu", 256, Some(256), 0),
    // Every tensor of an optimizer group in one launch: a block per 2,048-element chunk.
    spec(Kernel::AdamwMultiF32Bf16, "adamw_multi_f32_bf16", "adamw.cu", 256, Some(256), 0),
    // Every gradient of a step zeroed in one launch, the same mapping.
    spec(Kernel::ZeroMultiU32, "zero_multi_u32", "adamw.cu", 256, Some(256), 0),
    // One thread of a block: the step's gradient norm and clip factor, kept on the device.
    spec(Kernel::ClipScaleF64, "clip_scale_f64", "adamw.cu", 256, Some(256), 0),
    spec(Kernel::AttentionBwdDeltaBf16, "attention_bwd_delta_bf16", "attention_bwd.cu", 128, Some(256), 0),
    // Attention's tiles and 2-stage cp.async rings in dynamic shared memory (the d 128 kernels
    // above 48 KiB: opted in); the HIP twins keep theirs static.
    attention(Kernel::AttentionBwdDkvBf16D32, "attention_bwd_dkv_bf16_d32", "attention_bwd.cu", 31744),
    attention(Kernel::AttentionBwdDkvBf16D64, "attention_bwd_dkv_bf16_d64", "attention_bwd.cu", 37376),
    attention(Kernel::AttentionBwdDkvBf16D128, "attention_bwd_dkv_bf16_d128", "attention_bwd.cu", 52480),
    attention(Kernel::AttentionBwdDqBf16D32, "attention_bwd_dq_bf16_d32", "attention_bwd.cu", 30720),
    attention(Kernel::AttentionBwdDqBf16D64, "attention_bwd_dq_bf16_d64", "attention_bwd.cu", 55296),
    attention(Kernel::AttentionBwdDqBf16D128, "attention_bwd_dq_bf16_d128", "attention_bwd.cu", 52224),
    attention(Kernel::AttentionFwdBf16D32, "attention_fwd_bf16_d32", "attention_fwd.cu", 25600),
    attention(Kernel::AttentionFwdBf16D64, "attention_fwd_bf16_d64", "attention_fwd.cu", 55296),
    attention(Kernel::AttentionFwdBf16D128, "attention_fwd_bf16_d128", "attention_fwd.cu", 52224),
    spec(Kernel::CastF32ToBf16, "cast_f32_to_bf16", "casts.cu", 256, Some(256), 0),
    spec(Kernel::CastBf16ToF32, "cast_bf16_to_f32", "casts.cu", 256, Some(256), 0),
    spec(Kernel::EmbeddingFwdBf16, "embedding_fwd_bf16", "embedding.cu", 128, Some(128), 0),
    spec(Kernel::EmbeddingBwdWteBf16, "embedding_bwd_wte_bf16", "embedding.cu", 128, Some(128), 0),
    spec(Kernel::EmbeddingBwdWpeBf16, "embedding_bwd_wpe_bf16", "embedding.cu", 128, Some(128), 0),
    spec(Kernel::GeluFwdBf16, "gelu_fwd_bf16", "gelu.cu", 256, Some(256), 0),
    spec(Kernel::GeluBwdBf16, "gelu_bwd_bf16", "gelu.cu", 256, Some(256), 0),
    // The sm_80 GEMMs: 8 warps on 128 x 128 tiles, a 4-stage ring in dynamic shared memory
    // (common/gemm_pipeline.cuh); their HIP twins keep 64 x 64 tiles in static LDS.
    gemm(Kernel::GemmFwdBf16F32out, "gemm_fwd_bf16_f32out", "gemm_bf16.cu", 81920),
    gemm(Kernel::GemmFwdBf16, "gemm_fwd_bf16", "gemm_bf16.cu", 81920),
    // gemm_bf16_bwd.cu's also hold their tile's origin in 16 bytes of static shared memory.
    KernelSpec { static_shared: 16, ..gemm(Kernel::GemmBwdInputBf16, "gemm_bwd_input_bf16", "gemm_bf16_bwd.cu", 75776) },
    KernelSpec {
        static_shared: 16,
        ..gemm(Kernel::GemmBwdInputBf16Bf16out, "gemm_bwd_input_bf16_bf16out", "gemm_bf16_bwd.cu", 75776)
    },
    KernelSpec { static_shared: 16, ..gemm(Kernel::GemmBwdWeightBf16, "gemm_bwd_weight_bf16", "gemm_bf16_bwd.cu", 69632) },
    // gemm_bf16_sm90.cu: sm_90a's wgmma fed by TMA, 197704 bytes of dynamic shared memory for
    // 128 x 256 tiles, 132168 for backward-weight's 128 x 128; kernels-hip/ has no twin.
    gemm_sm90(Kernel::GemmFwdBf16F32outSm90, "gemm_fwd_bf16_f32out_sm90", SM90_GEMM_COLS),
    gemm_sm90(Kernel::GemmFwdBf16Sm90, "gemm_fwd_bf16_sm90", SM90_GEMM_COLS),
    gemm_sm90(Kernel::GemmBwdInputBf16Sm90, "gemm_bwd_input_bf16_sm90", SM90_GEMM_COLS),
    gemm_sm90(Kernel::GemmBwdInputBf16Bf16outSm90, "gemm_bwd_input_bf16_bf16out_sm90", SM90_GEMM_COLS),
    gemm_sm90(Kernel::GemmBwdWeightBf16Sm90, "gemm_bwd_weight_bf16_sm90", SM90_GEMM_WEIGHT_COLS),
    spec(Kernel::LayernormFwdBf16, "layernorm_fwd_bf16", "layernorm.cu", 128, Some(256), 0),
    // The whole backward in one launch: 260 bytes of shared memory (a pass's 32 row means and
    // rstds, the last-block flag).
    spec(Kernel::LayernormBwdBf16, "layernorm_bwd_bf16", "layernorm.cu", 512, Some(512), 260),
    // RMSNorm (Llama): LayerNorm's grids without the mean and bias (a pass's 32 rstds and the
    // flag: 132 bytes); SwiGLU and rotary embedding: GELU's element-wise grids.
    spec(Kernel::RmsnormFwdBf16, "rmsnorm_fwd_bf16", "layernorm.cu", 128, Some(256), 0),
    spec(Kernel::RmsnormBwdBf16, "rmsnorm_bwd_bf16", "layernorm.cu", 512, Some(512), 132),
    spec(Kernel::SwigluFwdBf16, "swiglu_fwd_bf16", "gelu.cu", 256, Some(256), 0),
    spec(Kernel::SwigluBwdBf16, "swiglu_bwd_bf16", "gelu.cu", 256, Some(256), 0),
    spec(Kernel::RopeFwdBf16, "rope_fwd_bf16", "rope.cu", 256, Some(256), 0),
    spec(Kernel::RopeBwdBf16, "rope_bwd_bf16", "rope.cu", 256, Some(256), 0),
    spec(Kernel::XentMaxBf16, "xent_max_bf16", "softmax_xent.cu", 256, Some(256), 128),
    spec(Kernel::XentPartialsBf16, "xent_partials_bf16", "softmax_xent.cu", 256, Some(256), 256),
    spec(Kernel::XentBwdBf16, "xent_bwd_bf16", "softmax_xent.cu", 256, Some(256), 0),
    // tensor_ops.cu: the Device's f32 ops. Element-wise and per-column kernels run blocks of 256;
    // per-row kernels a warp per row in blocks of 128 (CUDA), a wave64 per row in 256 (HIP).
    spec(Kernel::AddF32, "add_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::AddAssignF32, "add_assign_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::AddBiasF32, "add_bias_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::RoundBf16F32, "round_bf16_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::GeluFwdF32, "gelu_fwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::GeluBwdF32, "gelu_bwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::EmbeddingFwdF32, "embedding_fwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    // A block per (touched vocabulary row, strip of 256 columns): plan::EmbeddingSegments.
    spec(Kernel::EmbeddingBwdF32, "embedding_bwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::PositionFwdF32, "position_fwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::PositionFwdBf16, "position_fwd_bf16", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::PositionBwdF32, "position_bwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    // plan::column_sum_grid: 64 columns x 256 rows per block, 4 x 64 f32 group sums and a flag.
    spec(Kernel::ColumnSumAddF32, "column_sum_add_f32", "tensor_ops.cu", 256, Some(256), 1028),
    spec(Kernel::ColumnSumAddBf16, "column_sum_add_bf16", "tensor_ops.cu", 256, Some(256), 1028),
    spec(Kernel::LayernormFwdF32, "layernorm_fwd_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::LayernormBwdDxF32, "layernorm_bwd_dx_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::LayernormBwdParamsF32, "layernorm_bwd_params_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::LayernormSumsF32, "layernorm_sums_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::LayernormApplyF32, "layernorm_apply_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::LayernormBwdSumsF32, "layernorm_bwd_sums_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::LayernormBwdApplyDxF32, "layernorm_bwd_apply_dx_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::XentMaxF32, "xent_max_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::XentPartialsF32, "xent_partials_f32", "tensor_ops.cu", 128, Some(256), 0),
    spec(Kernel::XentBwdF32, "xent_bwd_f32", "tensor_ops.cu", 256, Some(256), 0),
    spec(Kernel::SumSquaresF32, "sum_squares_f32", "tensor_ops.cu", 256, Some(256), 64),
    // One block of 1024: the step's scalars summed in a fixed order on the device (1024 f64 of tree).
    spec(Kernel::SumIntoF64, "sum_into_f64", "tensor_ops.cu", 1024, Some(1024), 8192),
    spec(Kernel::XentLossF64, "xent_loss_f64", "tensor_ops.cu", 1024, Some(1024), 8192),
];

impl Kernel {
    /// This kernel's entry of `KERNELS`.
    pub fn spec(self) -> &'static KernelSpec {
        &KERNELS[self as usize]
    }

    pub fn function(self) -> &'static str {
        self.spec().function
    }
}

/// The entry of a kernel function, by name.
pub fn kernel(function: &str) -> Result<&'static KernelSpec> {
    KERNELS.iter().find(|k| k.function == function).ok_or_else(|| Error::Config(format!("no kernel named {function}")))
}

/// The 16-bit storage type a module is compiled for, from the same sources
/// (`kernels-cuda/common/base.cuh`, `kernels-hip/common/base.h`): bf16 (the default), or IEEE
/// binary16 under `--fp16`, whose module is compiled with `-DTRIDENT_FP16` (binary16 storage and
/// conversions; .f16 mma.sync and wgmma operands on CUDA, the f16 MFMA on HIP). The kernel
/// functions keep their names in both modules: the `bf16` of a kernel's name is the module's
/// 16-bit type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Bf16,
    F16,
}

impl Storage {
    /// The storage a run of `precision` keeps its 16-bit tensors in: f16 under `--fp16`, bf16
    /// otherwise (f32 runs keep f32 buffers, and their GEMM operands cast to bf16).
    pub fn of(precision: Precision) -> Storage {
        match precision {
            Precision::F16 => Storage::F16,
            _ => Storage::Bf16,
        }
    }

    /// The compiler's define that selects it (none for bf16, so the bf16 module is the text it
    /// always was).
    pub fn defines(self) -> &'static [&'static str] {
        match self {
            Storage::Bf16 => &[],
            Storage::F16 => &["-DTRIDENT_FP16"],
        }
    }

    /// `bf16` or `fp16`, as the flags say it.
    pub fn name(self) -> &'static str {
        match self {
            Storage::Bf16 => "bf16",
            Storage::F16 => "fp16",
        }
    }

    /// The precision of its values (`Precision::round` gives what the kernels store).
    pub fn precision(self) -> Precision {
        match self {
            Storage::Bf16 => Precision::Bf16,
            Storage::F16 => Precision::F16,
        }
    }
}

/// Whose GPU: the kernel suite (kernels-cuda/*.cu or their kernels-hip/*.hip twins, same kernel
/// names, arguments and grids) and its launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

impl Vendor {
    /// `--device`'s word for this vendor, as the bench records name it.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Cuda => "cuda",
            Vendor::Hip => "hip",
        }
    }

    /// The file of this vendor's suite that holds a kernel of `KERNELS` (named by its .cu file).
    pub fn file(self, cu_file: &str) -> String {
        match self {
            Vendor::Cuda => cu_file.to_string(),
            Vendor::Hip => format!("{}.hip", cu_file.trim_end_matches(".cu")),
        }
    }

    /// Threads per block (CUDA) or workgroup (HIP) of kernel `k`, None where this vendor has no
    /// such kernel; the grids are the same for both vendors except where a block covers a
    /// different number of output elements (`plan`). CUDA: 256 for the mma.sync GEMMs (8 warps),
    /// 384 for the sm_90a GEMMs, 128 for attention and the warp-per-row kernels (4 rows); HIP (each kernels-hip file's header):
    /// 256 for the MFMA GEMMs (4 wave64s), the wave-per-row kernels (4 rows) and attention's
    /// delta kernel, 128 for attention forward, dK/dV and dQ (2 wave64s).
    pub fn threads(self, k: Kernel) -> Option<u32> {
        match self {
            Vendor::Cuda => Some(k.spec().threads),
            Vendor::Hip => k.spec().hip_threads,
        }
    }

    /// Dynamic shared memory a launch of `k` passes on this vendor: the CUDA kernel's
    /// (`KernelSpec::dynamic_shared`); none on HIP, whose twins declare their LDS statically.
    pub fn dynamic_shared(self, k: Kernel) -> u32 {
        match self {
            Vendor::Cuda => k.spec().dynamic_shared,
            Vendor::Hip => 0,
        }
    }

    /// The matrix instructions the GEMMs and attention run on, for `describe`.
    pub fn matrix_units(self) -> &'static str {
        match self {
            Vendor::Cuda => "mma.sync",
            Vendor::Hip => "MFMA",
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::launch::DeviceLimits;

    /// The embedded text of `file` in `vendor`'s suite.
    fn source(vendor: Vendor, cu_file: &str) -> Option<&'static str> {
        let file = vendor.file(cu_file);
        match vendor {
            Vendor::Cuda => cuda::source(&file).ok(),
            Vendor::Hip => hip::source(&file).ok().map(|(_, text)| text),
        }
    }

    #[test]
    fn the_index_names_every_declared_kernel_of_both_suites_and_only_those() {
        let suites = [(Vendor::Cuda, cuda::files()), (Vendor::Hip, hip::files())];
        for (vendor, files) in suites {
            let mut declared = Vec::new();
            for (file, text) in files {
                for f in declared_functions(text) {
                    declared.push((f, file.to_string()));
                }
            }
            // Every extern "C" kernel of every file is an entry, with its file and, for HIP, a
            // workgroup size (a twin the index knows of).
            for (f, file) in &declared {
                let k = kernel(f).unwrap_or_else(|_| panic!("{f} of {file} is not in the kernel index"));
                assert_eq!(vendor.file(k.file), *file, "{f}");
                assert!(vendor.threads(k.kernel).is_some(), "{f} of {file}: no {vendor:?} geometry in the index");
            }
            // And every entry with a geometry for the vendor is declared in its file.
            for k in KERNELS.iter().filter(|k| vendor.threads(k.kernel).is_some()) {
                let file = vendor.file(k.file);
                assert!(
                    declared.contains(&(k.function.to_string(), file.clone())),
                    "{} not declared in {file}",
                    k.function
                );
            }
        }
        assert_eq!(
            declared_functions(source(Vendor::Cuda, "gelu.cu").unwrap()),
            ["gelu_fwd_bf16", "gelu_bwd_bf16", "swiglu_fwd_bf16", "swiglu_bwd_bf16"].map(String::from)
        );
    }

    #[test]
    fn each_kernel_is_named_after_its_function_in_table_order() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert_eq!(k.kernel as usize, i, "{} is out of order", k.function);
            let camel: String = k.function.split('_').map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect();
            assert_eq!(format!("{:?}", k.kernel), camel);
            assert_eq!(kernel(k.function).unwrap().kernel, k.kernel);
        }
        assert!(kernel("nope").unwrap_err().to_string().contains("no kernel named nope"));
    }

    /// The `__launch_bounds__(n)` (or `(n, blocks)`) of extern "C" kernel `name` in `source`, if
    /// it declares one.
    fn launch_bounds(source: &str, name: &str) -> Option<u32> {
        // The declaration: `extern "C"` followed by the name and its "(" with no statement between.
        let decl = source.match_indices(&format!("{name}(")).find_map(|(at, _)| {
            let start = source[..at].rfind("extern \"C\"")?;
            let decl = &source[start..at];
            (!decl.contains(';') && !decl.contains('{') && !decl.contains('}')).then_some(decl)
        });
        let decl = decl.unwrap_or_else(|| panic!("no extern \"C\" declaration of {name}"));
        let from = decl.find("__launch_bounds__(")? + "__launch_bounds__(".len();
        decl[from..].split([')', ',']).next()?.trim().parse().ok()
    }

    /// Every kernel is launched with exactly the workgroup its source is bounded to (a kernel
    /// written for 4 waves computes a quarter of its tile less with 2), and every unbounded one
    /// with a multiple of the vendor's wave; the CUDA and HIP tables differ where the headers say.
    #[test]
    fn block_sizes_follow_each_vendors_kernel_sources() {
        for (vendor, wave) in [(Vendor::Cuda, 32), (Vendor::Hip, 64)] {
            for k in KERNELS {
                let (Some(block), Some(source)) = (vendor.threads(k.kernel), source(vendor, k.file)) else {
                    continue;
                };
                let (name, file) = (k.function, vendor.file(k.file));
                assert!(source.contains(&format!("{name}(")), "{name} is not in {file}");
                assert_eq!(block % wave, 0, "{vendor:?} {name}: {block} threads is not whole waves");
                if let Some(bound) = launch_bounds(source, name) {
                    assert_eq!(block, bound, "{vendor:?} {name}: launched with {block}, bounded to {bound} in {file}");
                }
            }
        }
        let both = |k: Kernel| (Vendor::Cuda.threads(k), Vendor::Hip.threads(k));
        assert_eq!(both(Kernel::GemmFwdBf16F32out), (Some(256), Some(256)));
        assert_eq!(both(Kernel::LayernormFwdF32), (Some(128), Some(256)));
        assert_eq!(both(Kernel::AttentionBwdDeltaBf16), (Some(128), Some(256)));
        assert_eq!(both(Kernel::LayernormBwdBf16), (Some(512), Some(512)));
        assert_eq!(both(Kernel::RmsnormFwdBf16), (Some(128), Some(256)));
        assert_eq!(both(Kernel::RmsnormBwdBf16), (Some(512), Some(512)));
        assert_eq!(both(Kernel::GemmFwdBf16F32outSm90), (Some(384), None));
        assert_eq!(both(Kernel::GemmBwdWeightBf16Sm90), (Some(384), None));
        assert_eq!(Vendor::Hip.threads(Kernel::AttentionFwdBf16D64), Some(128));
    }

    /// Static shared memory fits without opting in; static and dynamic together fit an A100's
    /// opt-in, an H100's for the sm_90a kernels (the sm_80 GEMMs': two blocks per SM in its
    /// 164 KiB, each with 1 KiB the system reserves).
    #[test]
    fn shared_memory_and_blocks_fit_every_device() {
        for k in KERNELS {
            let limits = if k.min_arch >= 90 { DeviceLimits::H100 } else { DeviceLimits::A100 };
            assert!(k.static_shared <= DeviceLimits::A100.shared_bytes_per_block, "{}", k.function);
            assert!(k.static_shared + k.dynamic_shared <= limits.shared_bytes_optin, "{}", k.function);
            assert!(k.threads <= DeviceLimits::A100.max_threads_per_block && k.threads % 32 == 0, "{}", k.function);
        }
        let gemm = Kernel::GemmFwdBf16.spec().dynamic_shared;
        assert!(2 * (gemm + 1024) <= 164 * 1024, "{gemm}");
        assert_eq!(
            (Vendor::Cuda.dynamic_shared(Kernel::GemmFwdBf16), Vendor::Hip.dynamic_shared(Kernel::GemmFwdBf16)),
            (81920, 0)
        );
    }
}
