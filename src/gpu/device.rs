//! The GPU Device: the `Device` trait on one GPU, NVIDIA or AMD (its ops are in device_ops.rs).
//! Buffers are `GpuBuf`s of f32 in device memory (buffer.rs). Linear layers cast both operands to
//! bf16 into device scratch (`casts.cu`) and run the matrix-unit GEMMs (`gemm_bf16.cu` with the
//! bias fused, `gemm_bf16_bwd.cu`); attention casts the fused QKV to bf16 and runs
//! `attention_fwd.cu` / `attention_bwd.cu` (head dim 64 or 128); every other op runs an f32
//! kernel of `tensor_ops.cu`, and AdamW `adamw.cu` on the f32 masters. So the Device computes
//! like the CPU backend's `--bf16`: GEMM and attention operands in bf16, f32 accumulation and
//! storage.
//!
//! The GPU calls go through `GpuRuntime` (runtime.rs): `CudaRuntime` on the CUDA driver, or
//! `HipRuntime` on the HIP runtime, running the kernels-hip/ twins (same kernel names, arguments
//! and grids); `Vendor` holds what differs, each kernel's file and block size. Everything runs on
//! the legacy default stream, in order; `download`, `sum_squares` and the cross-entropy /
//! split-LayerNorm row sums copy to the host synchronously. A failed GPU call inside an op (the
//! trait's ops return no `Result`) ends the process with one `trident: error:` line naming the
//! call. Collectives and pipeline p2p on device memory are attached as trait objects
//! (`attach_comms`, `attach_p2p`), so this file names no communicator type.

use super::buffer::{DeviceMem, GpuBuf, GpuP2p};
use super::cache::{default_root, ModuleCache};
use super::cuda_runtime::CudaRuntime;
use super::driver::Driver;
use super::hip::Hip;
use super::hip_kernels::HipKernelModules;
use super::hip_runtime::HipRuntime;
use super::kernels::{arch_for, KernelModules};
use super::launch::DeviceLimits;
use super::runtime::{Arg, GpuRuntime};
use crate::device::DeviceComm;
use crate::error::{Error, Result};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Every kernel the Device launches: a typed index into its function table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum K {
    AddF32,
    AddAssignF32,
    AddBiasF32,
    RoundBf16F32,
    GeluFwdF32,
    GeluBwdF32,
    EmbeddingFwdF32,
    EmbeddingBwdF32,
    PositionFwdF32,
    PositionBwdF32,
    ColumnSumAddF32,
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
    AdamW,
    CastF32ToBf16,
    CastBf16ToF32,
    GemmFwdF32Out,
    GemmBwdInput,
    GemmBwdWeight,
    AttentionFwdD64,
    AttentionFwdD128,
    AttentionBwdDelta,
    AttentionBwdDkvD64,
    AttentionBwdDkvD128,
    AttentionBwdDqD64,
    AttentionBwdDqD128,
}

/// (kernel, file, function name), in `K`'s order.
const FUNCTIONS: &[(K, &str, &str)] = &[
    (K::AddF32, "tensor_ops.cu", "add_f32"),
    (K::AddAssignF32, "tensor_ops.cu", "add_assign_f32"),
    (K::AddBiasF32, "tensor_ops.cu", "add_bias_f32"),
    (K::RoundBf16F32, "tensor_ops.cu", "round_bf16_f32"),
    (K::GeluFwdF32, "tensor_ops.cu", "gelu_fwd_f32"),
    (K::GeluBwdF32, "tensor_ops.cu", "gelu_bwd_f32"),
    (K::EmbeddingFwdF32, "tensor_ops.cu", "embedding_fwd_f32"),
    (K::EmbeddingBwdF32, "tensor_ops.cu", "embedding_bwd_f32"),
    (K::PositionFwdF32, "tensor_ops.cu", "position_fwd_f32"),
    (K::PositionBwdF32, "tensor_ops.cu", "position_bwd_f32"),
    (K::ColumnSumAddF32, "tensor_ops.cu", "column_sum_add_f32"),
    (K::LayernormFwdF32, "tensor_ops.cu", "layernorm_fwd_f32"),
    (K::LayernormBwdDxF32, "tensor_ops.cu", "layernorm_bwd_dx_f32"),
    (K::LayernormBwdParamsF32, "tensor_ops.cu", "layernorm_bwd_params_f32"),
    (K::LayernormSumsF32, "tensor_ops.cu", "layernorm_sums_f32"),
    (K::LayernormApplyF32, "tensor_ops.cu", "layernorm_apply_f32"),
    (K::LayernormBwdSumsF32, "tensor_ops.cu", "layernorm_bwd_sums_f32"),
    (K::LayernormBwdApplyDxF32, "tensor_ops.cu", "layernorm_bwd_apply_dx_f32"),
    (K::XentMaxF32, "tensor_ops.cu", "xent_max_f32"),
    (K::XentPartialsF32, "tensor_ops.cu", "xent_partials_f32"),
    (K::XentBwdF32, "tensor_ops.cu", "xent_bwd_f32"),
    (K::SumSquaresF32, "tensor_ops.cu", "sum_squares_f32"),
    (K::AdamW, "adamw.cu", "adamw_f32_bf16"),
    (K::CastF32ToBf16, "casts.cu", "cast_f32_to_bf16"),
    (K::CastBf16ToF32, "casts.cu", "cast_bf16_to_f32"),
    (K::GemmFwdF32Out, "gemm_bf16.cu", "gemm_fwd_bf16_f32out"),
    (K::GemmBwdInput, "gemm_bf16_bwd.cu", "gemm_bwd_input_bf16"),
    (K::GemmBwdWeight, "gemm_bf16_bwd.cu", "gemm_bwd_weight_bf16"),
    (K::AttentionFwdD64, "attention_fwd.cu", "attention_fwd_bf16_d64"),
    (K::AttentionFwdD128, "attention_fwd.cu", "attention_fwd_bf16_d128"),
    (K::AttentionBwdDelta, "attention_bwd.cu", "attention_bwd_delta_bf16"),
    (K::AttentionBwdDkvD64, "attention_bwd.cu", "attention_bwd_dkv_bf16_d64"),
    (K::AttentionBwdDkvD128, "attention_bwd.cu", "attention_bwd_dkv_bf16_d128"),
    (K::AttentionBwdDqD64, "attention_bwd.cu", "attention_bwd_dq_bf16_d64"),
    (K::AttentionBwdDqD128, "attention_bwd.cu", "attention_bwd_dq_bf16_d128"),
];

/// Whose GPU: the kernel suite (kernels-cuda/*.cu or their kernels-hip/*.hip twins, same kernel
/// names, arguments and grids) and its launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

impl Vendor {
    /// The file of this vendor's suite that holds a kernel of `FUNCTIONS` (named by its .cu file).
    fn file(self, cu_file: &str) -> String {
        match self {
            Vendor::Cuda => cu_file.to_string(),
            Vendor::Hip => format!("{}.hip", cu_file.trim_end_matches(".cu")),
        }
    }

    /// Threads per block of kernel `k` (the grids are the same for both vendors). CUDA: 128 for
    /// the mma.sync GEMMs (4 warps), attention and the warp-per-row kernels (4 rows); HIP (each
    /// kernels-hip file's header): 256 for the MFMA GEMMs (4 wave64s), the wave-per-row kernels
    /// (4 rows) and attention's delta kernel, 128 for attention forward, dK/dV and dQ (2
    /// wave64s). Everything else is 256 on both.
    pub(crate) fn block(self, k: K) -> u32 {
        use K::*;
        let per_row = matches!(
            k,
            LayernormFwdF32 | LayernormBwdDxF32 | LayernormSumsF32 | LayernormBwdSumsF32 | XentMaxF32 | XentPartialsF32
        );
        let gemm = matches!(k, GemmFwdF32Out | GemmBwdInput | GemmBwdWeight);
        let attention = matches!(
            k,
            AttentionFwdD64
                | AttentionFwdD128
                | AttentionBwdDkvD64
                | AttentionBwdDkvD128
                | AttentionBwdDqD64
                | AttentionBwdDqD128
        );
        match self {
            Vendor::Cuda if per_row || gemm || attention || k == AttentionBwdDelta => 128,
            Vendor::Hip if attention => 128,
            _ => 256,
        }
    }

    /// The matrix instructions the GEMMs and attention run on, for `describe`.
    pub(super) fn matrix_units(self) -> &'static str {
        match self {
            Vendor::Cuda => "mma.sync",
            Vendor::Hip => "MFMA",
        }
    }
}

/// Elements per block of `sum_squares_f32` (tensor_ops.cu's kSumSquaresChunk).
pub(super) const SUM_SQUARES_CHUNK: usize = 8192;
/// Grid-stride kernels launch at most this many blocks of 256 per SM.
const BLOCKS_PER_SM: usize = 8;

/// Scratch memory (bf16 operand copies, uploaded token ids, row sums) borrowed from the device's
/// pool and given back on drop. Reusing a block right after the kernels that read it were
/// launched is safe because every launch and copy runs in order on the one stream; the pool
/// saves a cuMemAlloc / cuMemFree pair (each of which synchronizes the device) per operand.
pub(super) struct Scratch<'d> {
    mem: Option<DeviceMem>,
    pool: &'d std::sync::Mutex<Vec<DeviceMem>>,
}

impl std::ops::Deref for Scratch<'_> {
    type Target = DeviceMem;
    fn deref(&self) -> &DeviceMem {
        self.mem.as_ref().expect("held until drop")
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let (Some(mem), Ok(mut free)) = (self.mem.take(), self.pool.lock()) {
            if mem.bytes > 0 {
                free.push(mem);
                // Keep the pool bounded: the smallest blocks go first.
                if free.len() > SCRATCH_BLOCKS {
                    free.sort_by_key(|m| std::cmp::Reverse(m.bytes));
                    free.truncate(SCRATCH_BLOCKS);
                }
            }
        }
    }
}

/// How many free scratch blocks the pool keeps.
const SCRATCH_BLOCKS: usize = 16;

/// The key a process group is found by: the address of its Comm object, which `train` keeps
/// for the whole run (the Device's communicators are made from the same `Groups`).
pub fn group_key(group: &dyn crate::comm::Comm) -> usize {
    group as *const dyn crate::comm::Comm as *const () as usize
}

/// The Device over any `GpuRuntime`.
pub struct GpuDevice {
    /// Communicators of the run's process groups (`group_key`), when collectives run on device
    /// memory (`--gpu-collectives nccl|rccl`); first, so they are destroyed before the runtime.
    pub(super) comms: Vec<(usize, Box<dyn DeviceComm<GpuBuf> + Send + Sync>)>,
    /// The pipeline links (`--gpu-collectives` with pipeline parallelism); before the runtime
    /// for the same reason.
    pub(super) p2p: Option<Box<dyn GpuP2p>>,
    pub(super) rt: Arc<dyn GpuRuntime>,
    functions: Vec<usize>,
    pub(super) multiprocessors: usize,
    limits: DeviceLimits,
    pub(super) bf16_matmul: AtomicBool,
    scratch: std::sync::Mutex<Vec<DeviceMem>>,
    pub(super) vendor: Vendor,
}

/// Ends the process on a failed GPU call inside an op (the trait's ops cannot return errors).
pub(super) fn fatal(e: Error) -> ! {
    eprintln!("trident: error: gpu device: {e}");
    std::process::exit(1)
}

pub(super) fn ok<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| fatal(e))
}

pub(super) fn int(what: &str, v: usize) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| {
        fatal(Error::Config(format!("{what} = {v} does not fit the kernels' int arguments (at most {})", i32::MAX)))
    })
}

impl GpuDevice {
    /// The CUDA Device on GPU `ordinal` of the driver, its kernels compiled by NVRTC through the
    /// disk cache (or taken from this build's precompiled images).
    pub fn cuda(ordinal: usize) -> Result<GpuDevice> {
        let driver = Driver::load()?;
        let rt = CudaRuntime::new(driver, ordinal)?;
        let info = rt.info().clone();
        let arch = arch_for(info.compute_capability)?;
        let root = default_root(&|k| std::env::var(k).ok())?;
        let modules = KernelModules::new(ModuleCache::new(&root));
        let rt: Arc<dyn GpuRuntime> = Arc::new(rt);
        GpuDevice::new(rt, &modules, &arch, info.multiprocessors.max(1) as usize, info.limits)
    }

    /// The HIP Device on GPU `ordinal` of the HIP runtime, its kernels (kernels-hip/) compiled
    /// for the device's gfx architecture by hipRTC through the disk cache (or taken from this
    /// build's precompiled code objects).
    pub fn hip(ordinal: usize) -> Result<GpuDevice> {
        let rt = HipRuntime::new(Hip::load()?, ordinal)?;
        let (arch, limits) = (rt.arch().to_string(), rt.limits());
        let units = rt.info().compute_units.max(1) as usize;
        let root = default_root(&|k| std::env::var(k).ok())?;
        let modules = HipKernelModules::new(ModuleCache::new(&root));
        let image = |file: &str| modules.image(file, &arch).map(|i| i.bytes);
        GpuDevice::with_images(Arc::new(rt), Vendor::Hip, &image, units, limits)
    }

    /// Loads every file the Device uses and finds its functions.
    pub fn new(
        rt: Arc<dyn GpuRuntime>,
        modules: &KernelModules,
        arch: &str,
        multiprocessors: usize,
        limits: DeviceLimits,
    ) -> Result<GpuDevice> {
        let image = |file: &str| modules.image(file, arch).map(|i| i.bytes);
        GpuDevice::with_images(rt, Vendor::Cuda, &image, multiprocessors, limits)
    }

    /// Loads every file the Device uses, as `image` (file name of `vendor`'s suite to a loadable
    /// module) gives them, and finds its functions.
    pub fn with_images(
        rt: Arc<dyn GpuRuntime>,
        vendor: Vendor,
        image: &dyn Fn(&str) -> Result<Vec<u8>>,
        multiprocessors: usize,
        limits: DeviceLimits,
    ) -> Result<GpuDevice> {
        let mut loaded: Vec<(&str, usize)> = Vec::new();
        let mut functions = Vec::with_capacity(FUNCTIONS.len());
        for (i, (k, file, name)) in FUNCTIONS.iter().enumerate() {
            debug_assert_eq!(*k as usize, i, "FUNCTIONS follows K's order");
            let module = match loaded.iter().find(|(f, _)| f == file) {
                Some((_, m)) => *m,
                None => {
                    let m = rt.load_module(&image(&vendor.file(file))?)?;
                    loaded.push((file, m));
                    m
                }
            };
            functions.push(rt.function(module, name)?);
        }
        Ok(GpuDevice {
            rt,
            functions,
            multiprocessors,
            limits,
            bf16_matmul: AtomicBool::new(false),
            scratch: std::sync::Mutex::new(Vec::new()),
            vendor,
            comms: Vec::new(),
            p2p: None,
        })
    }

    /// Collectives of these process groups run through their communicators on device buffers
    /// from now on (`Device::device_comm`).
    pub fn attach_comms<C: DeviceComm<GpuBuf> + Send + Sync + 'static>(&mut self, comms: Vec<(usize, C)>) {
        self.comms =
            comms.into_iter().map(|(key, c)| (key, Box::new(c) as Box<dyn DeviceComm<GpuBuf> + Send + Sync>)).collect();
    }

    /// Pipeline messages travel through these links on device buffers from now on
    /// (`Device::device_p2p`).
    pub fn attach_p2p(&mut self, p2p: impl GpuP2p + 'static) {
        self.p2p = Some(Box::new(p2p));
    }

    /// Before the host reads device memory: every communicator's enqueued work has finished
    /// (polled, so a dead peer ends the run with an error instead of a hang in the copy).
    fn settle(&self) {
        for (_, c) in &self.comms {
            c.synchronize();
        }
        if let Some(p) = &self.p2p {
            p.settle_receives();
        }
    }

    pub(super) fn to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.settle();
        self.rt.copy_to_host(dst, src)
    }

    /// Checks that the kernels can run a model with this head dim (attention is built for 64 and 128).
    pub fn check_head_dim(head_dim: usize) -> Result<()> {
        GpuDevice::check_head_dim_for("cuda", head_dim)
    }

    /// `check_head_dim` for `--device <device>`.
    pub fn check_head_dim_for(device: &str, head_dim: usize) -> Result<()> {
        if head_dim == 64 || head_dim == 128 {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "--device {device}: the attention kernels are built for head dims 64 and 128, and this model's head \
             dim (hidden size / attention heads) is {head_dim}"
        )))
    }

    /// Launches `k` over `grid` with its vendor's block size (`Vendor::block`).
    pub(super) fn launch(&self, k: K, grid: [usize; 3], args: &[Arg]) {
        let (name, block) = (FUNCTIONS[k as usize].2, self.vendor.block(k));
        let config = ok(super::launch::tiled(name, grid, [1, 1, 1], [block, 1, 1], 0, &self.limits));
        ok(self.rt.launch_args(self.functions[k as usize], config.grid, config.block, args));
    }

    /// A grid-stride launch over `n` elements in blocks of 256 (nothing when n is 0).
    pub(super) fn elementwise(&self, k: K, n: usize, args: &[Arg]) {
        if n == 0 {
            return;
        }
        let blocks = n.div_ceil(256).min(BLOCKS_PER_SM * self.multiprocessors);
        self.launch(k, [blocks, 1, 1], args);
    }

    /// One warp (wave) per row, four rows per block.
    pub(super) fn rowwise(&self, k: K, rows: usize, args: &[Arg]) {
        if rows > 0 {
            self.launch(k, [rows.div_ceil(4), 1, 1], args);
        }
    }

    /// One thread per column, blocks of 256.
    pub(super) fn columnwise(&self, k: K, cols: usize, args: &[Arg]) {
        if cols > 0 {
            self.launch(k, [cols.div_ceil(256), 1, 1], args);
        }
    }

    /// A scratch block of at least `bytes`: the smallest free one that fits, else a new one.
    pub(super) fn scratch(&self, bytes: usize) -> Scratch<'_> {
        let reused = self.scratch.lock().ok().and_then(|mut free| {
            let best = free.iter().enumerate().filter(|(_, m)| m.bytes >= bytes).min_by_key(|(_, m)| m.bytes)?.0;
            Some(free.swap_remove(best))
        });
        let mem = reused.unwrap_or_else(|| ok(DeviceMem::alloc(&self.rt, bytes)));
        Scratch { mem: Some(mem), pool: &self.scratch }
    }

    pub(super) fn upload_bytes(&self, bytes: &[u8]) -> Scratch<'_> {
        let m = self.scratch(bytes.len());
        if !bytes.is_empty() {
            ok(self.rt.copy_to_device(m.pointer, bytes));
        }
        m
    }

    pub(super) fn upload_u32(&self, v: &[u32]) -> Scratch<'_> {
        self.upload_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    pub(super) fn upload_f64(&self, v: &[f64]) -> Scratch<'_> {
        self.upload_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    pub(super) fn download_f64(&self, m: &DeviceMem, out: &mut [f64]) {
        let mut bytes = vec![0u8; out.len() * 8];
        if !bytes.is_empty() {
            ok(self.to_host(&mut bytes, m.pointer));
        }
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *o = f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }

    /// A bf16 copy of the first `n` elements of `src` (round to nearest even), in scratch.
    pub(super) fn to_bf16(&self, src: &GpuBuf, n: usize) -> Scratch<'_> {
        assert!(n <= src.len, "bf16 cast of {n} elements from a buffer of {}", src.len);
        let out = self.scratch(2 * n);
        self.cast(K::CastF32ToBf16, out.pointer, src.ptr(), n);
        out
    }

    pub(super) fn cast(&self, k: K, dst: u64, src: u64, n: usize) {
        if n == 0 {
            return;
        }
        let blocks = n.div_ceil(8).div_ceil(256).min(BLOCKS_PER_SM * self.multiprocessors);
        self.launch(k, [blocks, 1, 1], &[Arg::Ptr(dst), Arg::Ptr(src), Arg::I32(int("n", n))]);
    }

    pub(super) fn attention_kernels(head_dim: usize) -> (K, K, K) {
        match head_dim {
            64 => (K::AttentionFwdD64, K::AttentionBwdDkvD64, K::AttentionBwdDqD64),
            128 => (K::AttentionFwdD128, K::AttentionBwdDkvD128, K::AttentionBwdDqD128),
            d => fatal(Error::Unsupported(format!(
                "attention on the GPU: head dim {d} (the kernels are built for 64 and 128)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `__launch_bounds__(n)` of extern "C" kernel `name` in `source`, if it declares one.
    fn launch_bounds(source: &str, name: &str) -> Option<u32> {
        // The declaration: `extern "C"` followed by the name and its "(" with no statement between.
        let decl = source.match_indices(&format!("{name}(")).find_map(|(at, _)| {
            let start = source[..at].rfind("extern \"C\"")?;
            let decl = &source[start..at];
            (!decl.contains(';') && !decl.contains('{') && !decl.contains('}')).then_some(decl)
        });
        let decl = decl.unwrap_or_else(|| panic!("no extern \"C\" declaration of {name}"));
        let from = decl.find("__launch_bounds__(")? + "__launch_bounds__(".len();
        decl[from..].split(')').next()?.trim().parse().ok()
    }

    /// Every kernel is launched with exactly the workgroup its source is bounded to (a kernel
    /// written for 4 waves computes a quarter of its tile less with 2), and every unbounded one
    /// with a multiple of the vendor's wave; the CUDA and HIP tables differ where the headers say.
    #[test]
    fn block_sizes_follow_each_vendors_kernel_sources() {
        for (vendor, wave) in [(Vendor::Cuda, 32), (Vendor::Hip, 64)] {
            for (k, file, name) in FUNCTIONS {
                let file = vendor.file(file);
                let source = match vendor {
                    Vendor::Cuda => super::super::kernels::source(&file).unwrap(),
                    Vendor::Hip => super::super::hip_kernels::source(&file).unwrap().1,
                };
                assert!(source.contains(&format!("{name}(")), "{name} is not in {file}");
                let block = vendor.block(*k);
                assert_eq!(block % wave, 0, "{vendor:?} {name}: {block} threads is not whole waves");
                if let Some(bound) = launch_bounds(source, name) {
                    assert_eq!(block, bound, "{vendor:?} {name}: launched with {block}, bounded to {bound} in {file}");
                }
            }
        }
        assert_eq!((Vendor::Cuda.block(K::GemmFwdF32Out), Vendor::Hip.block(K::GemmFwdF32Out)), (128, 256));
        assert_eq!((Vendor::Cuda.block(K::LayernormFwdF32), Vendor::Hip.block(K::LayernormFwdF32)), (128, 256));
        assert_eq!((Vendor::Cuda.block(K::AttentionBwdDelta), Vendor::Hip.block(K::AttentionBwdDelta)), (128, 256));
        assert_eq!(Vendor::Hip.block(K::AttentionFwdD64), 128);
    }
}
