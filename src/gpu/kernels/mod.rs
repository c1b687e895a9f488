//! The GPU kernel index: every `extern "C" __global__` function of the portable kernels
//! (`kernels/*.cu`, one source for both vendors) and of the vendor files (`kernels-cuda/*.cu` and
//! their `kernels-hip/*.hip` twins: the GEMMs and attention), as one table generated at build time
//! from the declarations themselves (`build/registry.rs`): `Kernel` is the typed key, `KERNELS`
//! names each function's file, its launch geometry per vendor (CUDA block, HIP workgroup: the
//! `__launch_bounds__`), its shared memory and lowest architecture, and `args` holds one typed
//! argument list per kernel (`Launch`), so a launch with a wrong argument count or type does not
//! compile. Adding a kernel is its source, the call that launches it, and (for a planned op) a
//! line of `plan`.
//! The GPU Device resolves the kernels it launches from this table once per device
//! (`device::DEVICE_KERNELS`), the launch planning of `plan` reads it, the GPU benches launch
//! the kernels nothing in training launches yet (`cmd/bench/gpu/mod.rs`), and `trident info` counts it.
//! A unit test below holds the table to the embedded sources (every declared function listed,
//! every listed function declared); another (`cmd/bench/gpu/mod.rs`) holds every entry to a launcher.
//!
//! Loading the files is elsewhere: `cuda` (the embedded CUDA sources, precompiled images or
//! NVRTC through the cache), `hip` (the same for HIP and hipRTC); `plan` turns an op and its
//! shape into a checked launch of the kernel that computes it.

pub mod cuda;
pub mod hip;
pub mod plan;

use crate::error::{Error, Result};
use crate::real::Precision;

/// A kernel parameter's kind, as a launch passes it (`runtime::Arg`): a device pointer, a C
/// `int`, `float` or `double`, or a `__grid_constant__` TMA descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    Ptr,
    I32,
    F32,
    F64,
    Map,
}

/// One kernel function: its file, its launch geometry per vendor, its static and dynamic shared
/// memory and lowest architecture, and its parameters, all generated from its declaration
/// (`build/registry.rs`: the `__launch_bounds__` give the blocks, a `// registry:` line above the
/// declaration the rest). `tests/gpu_runtime.rs` checks the shared memory against the NVRTC
/// CUBINs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub kernel: Kernel,
    pub function: &'static str,
    /// The file as the CUDA suite names it: a portable kernel of `kernels/` (the same file on
    /// HIP) or a `kernels-cuda/` one, whose HIP twin is the same name with `.hip` (`Vendor::file`).
    pub file: &'static str,
    /// Threads per block on CUDA: the launch bounds with `kWaveSize` 32, else 256.
    pub threads: u32,
    /// Threads per workgroup on HIP (`kWaveSize` 64); None where the HIP suite has no such kernel.
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
    /// The C parameters' kinds, in order.
    pub params: &'static [ParamKind],
}

/// A kernel and its arguments, typed by its declaration: made only by the generated
/// `args::<function>` (one per kernel, its parameters the C parameters': a pointer is a `u64`
/// device address, `int` an `i32`, `float` an `f32`, `double` an `f64`), so a launch with a wrong
/// argument count or type does not compile. `add_f32(float* out, const float* a, const float* b,
/// int n)` takes `(u64, u64, u64, i32)` (the unit test `launches_are_typed_by_the_declarations`),
/// so a float for its `n` is refused:
/// ```compile_fail,E0308
/// let _ = trident::gpu::kernels::args::add_f32(0x1000, 0x2000, 0x3000, 4.0f32);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Launch<const N: usize> {
    pub kernel: Kernel,
    pub args: [crate::gpu::runtime::Arg; N],
}

impl<const N: usize> Launch<N> {
    /// The same arguments for `kernel`, which must take the same parameters (one op's kernels
    /// that differ in a tile or head dim, or an output type the pointer does not show); any
    /// other is an error naming both.
    pub fn retarget(self, kernel: Kernel) -> Result<Launch<N>> {
        if kernel != self.kernel && kernel.spec().params != self.kernel.spec().params {
            return Err(Error::Config(format!(
                "arguments of {} cannot launch {}: their parameters differ",
                self.kernel.function(),
                kernel.function()
            )));
        }
        Ok(Launch { kernel, args: self.args })
    }
}

// `Kernel` (every extern "C" __global__ function, in file and declaration order), `KERNELS` (their
// specs, in that order) and `args` (the typed argument lists).
include!(concat!(env!("OUT_DIR"), "/kernel_registry.rs"));

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

/// Whose GPU: the kernel suite (the portable kernels/*.cu and kernels-cuda/*.cu, or the same
/// portable files and the kernels-hip/*.hip twins, same kernel names, arguments and grids) and
/// its launch geometry.
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

    /// The file of this vendor's suite that holds a kernel of `KERNELS` (named by its .cu file):
    /// the same file where it is portable (the HIP suite embeds it too), else the `.hip` twin.
    pub fn file(self, cu_file: &str) -> String {
        match self {
            Vendor::Hip if hip::source(cu_file).is_err() => format!("{}.hip", cu_file.trim_end_matches(".cu")),
            _ => cu_file.to_string(),
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

    /// The generated argument lists have the C parameters' count and types (a function pointer
    /// of another signature would not compile), and a launch carries its kernel.
    #[test]
    fn launches_are_typed_by_the_declarations() {
        let add: fn(u64, u64, u64, i32) -> Launch<4> = args::add_f32;
        let l = add(0x1000, 0x2000, 0x3000, 4);
        let (ptr, int) = (ParamKind::Ptr, ParamKind::I32);
        assert_eq!((l.kernel, l.kernel.spec().params), (Kernel::AddF32, &[ptr, ptr, ptr, int][..]));
        let rms: fn(u64, u64, u64, u64, i32, i32, f32) -> Launch<7> = args::rmsnorm_fwd_bf16;
        let clip: fn(u64, i32, u64, i32, f64, f64) -> Launch<6> = args::clip_scale_f64;
        let kernels = (rms(0, 0, 0, 0, 1, 1, 1e-5).kernel, clip(0, 0, 0, 0, 1.0, 1.0).kernel);
        assert_eq!(kernels, (Kernel::RmsnormFwdBf16, Kernel::ClipScaleF64));
        // One signature for the head dims: the planned kernel takes the arguments built for another.
        let fwd = args::attention_fwd_bf16_d64(0, 0, 0, 1, 1, 1, 1);
        assert_eq!(fwd.retarget(Kernel::AttentionFwdBf16D128).unwrap().kernel, Kernel::AttentionFwdBf16D128);
        let e = fwd.retarget(Kernel::AddF32).unwrap_err().to_string();
        assert!(e.contains("arguments of attention_fwd_bf16_d64 cannot launch add_f32"), "{e}");
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

    /// Every kernel is launched with whole waves, the workgroup its source is bounded to (the
    /// registry reads the bounds: a kernel written for 4 waves computes a quarter of its tile
    /// less with 2); the CUDA and HIP blocks differ where the sources say.
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
        use plan::{sm90_gemm_shared_bytes, SM90_GEMM_COLS, SM90_GEMM_WEIGHT_COLS};
        assert_eq!(Kernel::GemmFwdBf16Sm90.spec().dynamic_shared as usize, sm90_gemm_shared_bytes(SM90_GEMM_COLS));
        assert_eq!(
            Kernel::GemmBwdWeightBf16Sm90.spec().dynamic_shared as usize,
            sm90_gemm_shared_bytes(SM90_GEMM_WEIGHT_COLS)
        );
        assert_eq!(
            (Kernel::GemmBwdWeightBf16Sm90.spec().min_arch, Kernel::GemmBwdWeightBf16.spec().min_arch),
            (90, 80)
        );
        let gemm = Kernel::GemmFwdBf16.spec().dynamic_shared;
        assert!(2 * (gemm + 1024) <= 164 * 1024, "{gemm}");
        assert_eq!(
            (Vendor::Cuda.dynamic_shared(Kernel::GemmFwdBf16), Vendor::Hip.dynamic_shared(Kernel::GemmFwdBf16)),
            (81920, 0)
        );
    }
}
