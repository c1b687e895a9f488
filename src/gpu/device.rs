//! The GPU Device: the `Device` trait on one GPU, NVIDIA or AMD (its ops are in device_ops.rs).
//! Buffers are `GpuBuf`s in device memory (buffer.rs) with their element type: f32, or bf16
//! storage (`Memory::alloc_in` under `--bf16`: the activations, their gradients and the GEMMs'
//! working weights), 16-bit for mixed precision's saved activations on f32 storage
//! (`Device::Half`), f64 for `Scalars`. Each op picks its kernel by the type of its activations:
//! on bf16 storage the GEMMs (`gemm_bf16.cu` with bias, GELU and residual fused,
//! `gemm_bf16_bwd.cu`; on sm_90a the wgmma + TMA kernels of `gemm_bf16_sm90.cu`, per product,
//! `plan::linear_gemms`), `attention_fwd.cu` / `attention_bwd.cu` (head dim 32, 64 or 128),
//! `layernorm.cu`, `gelu.cu` and the bf16 bias-gradient sum; else the f32 kernels of
//! `tensor_ops.cu`; AdamW `adamw.cu` on the f32 masters. An operand of the other type goes
//! through `View` / `ViewMut`, the one fallback, which casts it into pooled scratch (`casts.cu`)
//! and an output back: so f32 buffers run as before (GEMM and attention operands cast to bf16,
//! f32 accumulation and storage), and any mix of f32 and bf16 buffers is correct.
//!
//! The GPU calls go through `GpuRuntime` (runtime.rs): `CudaRuntime` on the CUDA driver, or
//! `HipRuntime` on the HIP runtime, running the kernels-hip/ twins (same kernel names, arguments
//! and grids). The kernels it launches (`DEVICE_KERNELS`) are resolved once per device from the
//! kernel index (`kernels/mod.rs`), which also holds what differs between the vendors, each
//! kernel's file and block size. Everything runs on the legacy default stream, in order; `download`, `read_scalars` and the
//! split-LayerNorm row sums copy to the host synchronously (the cross-entropy's statistics, the
//! loss and the gradient norm's sums stay on the device as `Scalars`). A failed GPU call inside an op (the
//! trait's ops return no `Result`) abandons the op (`error::fail`) and the command ends with one
//! `trident: error:` line naming the call. Collectives and pipeline p2p on device memory are attached as trait objects
//! (`attach_comms`, `attach_p2p`), so this file names no communicator type. Every runtime call
//! is counted (`runtime::Counted`): `Memory::work_counters` reads the counts, `tally` shares them.

use super::buffer::{DeviceMem, Elem, GpuBuf, GpuP2p};
use super::kernels::plan::{plan, Op, GRID_STRIDE_BLOCKS_PER_SM};
use super::kernels::{args, Kernel, Launch, Storage, Vendor};
use super::launch::{tiled, DeviceLimits};
use super::open::{Functions, OpenGpu};
use super::runtime::GpuRuntime;
use super::tma::TensorMap;
use crate::device::{CollectivesRequest, DeviceComm};
use crate::error::{Error, Result};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Every kernel the Device launches, resolved once per device (the other kernels of the index
/// are the benches': `cmd/bench/gpu/mod.rs`).
pub const DEVICE_KERNELS: &[Kernel] = &[
    Kernel::AddF32,
    Kernel::AddAssignF32,
    Kernel::AddBiasF32,
    Kernel::BiasDropoutAddF32,
    Kernel::DropoutF32,
    Kernel::RoundBf16F32,
    Kernel::GeluFwdF32,
    Kernel::GeluBwdF32,
    Kernel::EmbeddingFwdF32,
    Kernel::EmbeddingBwdF32,
    Kernel::PositionFwdF32,
    Kernel::PositionBwdF32,
    Kernel::ColumnSumAddF32,
    Kernel::LayernormFwdF32,
    Kernel::LayernormBwdDxF32,
    Kernel::LayernormBwdParamsF32,
    Kernel::LayernormSumsF32,
    Kernel::LayernormApplyF32,
    Kernel::LayernormBwdSumsF32,
    Kernel::LayernormBwdApplyDxF32,
    Kernel::XentMaxBf16,
    Kernel::XentPartialsBf16,
    Kernel::XentBwdBf16,
    Kernel::XentMaxF32,
    Kernel::XentPartialsF32,
    Kernel::XentBwdF32,
    Kernel::SumSquaresF32,
    Kernel::SumIntoF64,
    Kernel::XentLossF64,
    Kernel::AdamwF32Bf16,
    Kernel::AdamwMultiF32Bf16,
    Kernel::ZeroMultiU32,
    Kernel::ClipScaleF64,
    Kernel::CastF32ToBf16,
    Kernel::CastBf16ToF32,
    Kernel::GemmFwdBf16F32out,
    Kernel::GemmFwdBf16,
    Kernel::LayernormFwdBf16,
    Kernel::LayernormBwdBf16,
    Kernel::RmsnormFwdBf16,
    Kernel::RmsnormBwdBf16,
    Kernel::SwigluFwdBf16,
    Kernel::SwigluBwdBf16,
    Kernel::RopeFwdBf16,
    Kernel::RopeBwdBf16,
    Kernel::ColumnSumAddBf16,
    Kernel::GeluFwdBf16,
    Kernel::GeluBwdBf16,
    Kernel::GemmBwdInputBf16,
    Kernel::GemmBwdInputBf16Bf16out,
    Kernel::GemmBwdWeightBf16,
    Kernel::AttentionFwdBf16D32,
    Kernel::AttentionFwdBf16D64,
    Kernel::AttentionFwdBf16D128,
    Kernel::AttentionBwdDeltaBf16,
    Kernel::AttentionBwdDkvBf16D32,
    Kernel::AttentionBwdDkvBf16D64,
    Kernel::AttentionBwdDkvBf16D128,
    Kernel::AttentionBwdDqBf16D32,
    Kernel::AttentionBwdDqBf16D64,
    Kernel::AttentionBwdDqBf16D128,
    Kernel::AttentionFwdDropBf16D32,
    Kernel::AttentionFwdDropBf16D64,
    Kernel::AttentionFwdDropBf16D128,
    Kernel::AttentionBwdDkvDropBf16D32,
    Kernel::AttentionBwdDkvDropBf16D64,
    Kernel::AttentionBwdDkvDropBf16D128,
    Kernel::AttentionBwdDqDropBf16D32,
    Kernel::AttentionBwdDqDropBf16D64,
    Kernel::AttentionBwdDqDropBf16D128,
    Kernel::AttentionFwdDocsBf16D32,
    Kernel::AttentionFwdDocsBf16D64,
    Kernel::AttentionFwdDocsBf16D128,
    Kernel::AttentionBwdDkvDocsBf16D32,
    Kernel::AttentionBwdDkvDocsBf16D64,
    Kernel::AttentionBwdDkvDocsBf16D128,
    Kernel::AttentionBwdDqDocsBf16D32,
    Kernel::AttentionBwdDqDocsBf16D64,
    Kernel::AttentionBwdDqDocsBf16D128,
    Kernel::AttentionFwdDropDocsBf16D32,
    Kernel::AttentionFwdDropDocsBf16D64,
    Kernel::AttentionFwdDropDocsBf16D128,
    Kernel::AttentionBwdDkvDropDocsBf16D32,
    Kernel::AttentionBwdDkvDropDocsBf16D64,
    Kernel::AttentionBwdDkvDropDocsBf16D128,
    Kernel::AttentionBwdDqDropDocsBf16D32,
    Kernel::AttentionBwdDqDropDocsBf16D64,
    Kernel::AttentionBwdDqDropDocsBf16D128,
    Kernel::AttentionBlockFwdBf16D32,
    Kernel::AttentionBlockFwdBf16D64,
    Kernel::AttentionBlockFwdBf16D128,
    Kernel::AttentionBlockFwdDropBf16D32,
    Kernel::AttentionBlockFwdDropBf16D64,
    Kernel::AttentionBlockFwdDropBf16D128,
    Kernel::AttentionMergeF32,
    Kernel::AttentionBlockBwdDkvBf16D32,
    Kernel::AttentionBlockBwdDkvBf16D64,
    Kernel::AttentionBlockBwdDkvBf16D128,
    Kernel::AttentionBlockBwdDkvDropBf16D32,
    Kernel::AttentionBlockBwdDkvDropBf16D64,
    Kernel::AttentionBlockBwdDkvDropBf16D128,
    Kernel::AttentionBlockBwdDqBf16D32,
    Kernel::AttentionBlockBwdDqBf16D64,
    Kernel::AttentionBlockBwdDqBf16D128,
    Kernel::AttentionBlockBwdDqDropBf16D32,
    Kernel::AttentionBlockBwdDqDropBf16D64,
    Kernel::AttentionBlockBwdDqDropBf16D128,
];

/// The sm_90a GEMMs (wgmma fed by TMA), resolved besides `DEVICE_KERNELS` on compute capability
/// 9.0, where the linear layers run on them (`plan::linear_gemms`).
pub const SM90_DEVICE_KERNELS: &[Kernel] = &[
    Kernel::GemmFwdBf16F32outSm90,
    Kernel::GemmFwdBf16Sm90,
    Kernel::GemmBwdInputBf16Sm90,
    Kernel::GemmBwdInputBf16Bf16outSm90,
    Kernel::GemmBwdWeightBf16Sm90,
];

/// The kernels the Device resolves: `DEVICE_KERNELS`, and with `wgmma` `SM90_DEVICE_KERNELS`.
pub fn device_kernels(wgmma: bool) -> Vec<Kernel> {
    [DEVICE_KERNELS, if wgmma { SM90_DEVICE_KERNELS } else { &[] }].concat()
}

/// Elements per block of `sum_squares_f32` (tensor_ops.cu's kSumSquaresChunk).
pub(super) const SUM_SQUARES_CHUNK: usize = 8192;

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
        if let Some(mem) = self.mem.take() {
            keep(self.pool, mem);
        }
    }
}

impl Scratch<'_> {
    /// The block, no longer given back on drop (`GpuDevice::keep` gives it back).
    fn take(mut self) -> DeviceMem {
        self.mem.take().expect("held until drop")
    }
}

/// Gives a scratch block back to the pool, which stays bounded: the smallest blocks go first.
fn keep(pool: &std::sync::Mutex<Vec<DeviceMem>>, mem: DeviceMem) {
    if let Ok(mut free) = pool.lock() {
        if mem.bytes > 0 {
            free.push(mem);
            if free.len() > SCRATCH_BLOCKS {
                free.sort_by_key(|m| std::cmp::Reverse(m.bytes));
                free.truncate(SCRATCH_BLOCKS);
            }
        }
    }
}

/// A buffer as an operand a kernel reads in element type `want` (`GpuDevice::view`): the buffer
/// itself where it holds that type, else a copy cast into pooled scratch, given back on drop.
/// With `ViewMut` this is the one fallback through which every op takes any mix of f32 and bf16
/// buffers: the op picks its kernel, and each operand the kernel reads in the other type is cast.
pub(super) struct View<'a> {
    dev: &'a GpuDevice,
    same: Option<&'a GpuBuf>,
    cast: Option<GpuBuf>,
}

impl std::ops::Deref for View<'_> {
    type Target = GpuBuf;
    fn deref(&self) -> &GpuBuf {
        self.same.or(self.cast.as_ref()).expect("a view holds a buffer")
    }
}

impl Drop for View<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.cast.take() {
            keep(&self.dev.scratch, c.mem);
        }
    }
}

/// A buffer as an output a kernel writes in element type `want` (`GpuDevice::view_mut`): the
/// buffer itself, or a scratch copy in that type (loaded from the buffer first where the kernel
/// accumulates or writes only part of it) that is cast back into the buffer on drop.
pub(super) struct ViewMut<'a> {
    dev: &'a GpuDevice,
    target: &'a mut GpuBuf,
    cast: Option<GpuBuf>,
}

impl std::ops::Deref for ViewMut<'_> {
    type Target = GpuBuf;
    fn deref(&self) -> &GpuBuf {
        self.cast.as_ref().unwrap_or(self.target)
    }
}

impl Drop for ViewMut<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.cast.take() {
            self.dev.cast(self.target, 0, &c, 0, c.len);
            keep(&self.dev.scratch, c.mem);
        }
    }
}

/// How many free scratch blocks the pool keeps.
const SCRATCH_BLOCKS: usize = 16;

/// How many tables of tensors the Device keeps (`GpuDevice::kept_table`): each chunk of a rank (a
/// pipeline stage, or a virtual stage of one) has its AdamW group, its gradients to zero and its
/// gradients to sum.
const KEPT_TABLES: usize = 16;

/// The key a process group is found by: the address of its Comm object, which `train` keeps
/// for the whole run (the Device's communicators are made from the same `Groups`).
pub fn group_key(group: &dyn crate::comm::Comm) -> usize {
    group as *const dyn crate::comm::Comm as *const () as usize
}

/// How a GPU Device makes its collectives (`CollectiveOps::attach_collectives`): given by the code that
/// opened it for training (`training.rs`), which holds the runtime table the communicators'
/// streams borrow.
pub type MakeCollectives = Box<dyn FnOnce(&mut GpuDevice, &CollectivesRequest) -> Result<String> + Send + Sync>;

/// The Device over any `GpuRuntime`.
pub struct GpuDevice {
    /// Communicators of the run's process groups (`group_key`), when collectives run on device
    /// memory (`--gpu-collectives nccl|rccl`); first, so they are destroyed before the runtime.
    pub(super) comms: Vec<(usize, Box<dyn DeviceComm<GpuBuf> + Send + Sync>)>,
    /// The pipeline links (`--gpu-collectives` with pipeline parallelism); before the runtime
    /// for the same reason.
    pub(super) p2p: Option<Box<dyn GpuP2p>>,
    /// How `attach_collectives` makes them, until it has.
    pub(super) make_collectives: Option<MakeCollectives>,
    pub(super) rt: Arc<dyn GpuRuntime>,
    functions: Functions,
    pub(super) multiprocessors: usize,
    limits: DeviceLimits,
    pub(super) bf16_matmul: AtomicBool,
    scratch: std::sync::Mutex<Vec<DeviceMem>>,
    pub(super) vendor: Vendor,
    /// The architecture the kernels are built for (`sm_90a`, `gfx90a`, ...).
    pub(super) arch: String,
    /// The 16-bit storage its modules are compiled for (bf16, or fp16 under `--fp16`), and the
    /// element type of its 16-bit buffers (`Elem::Bf16` or `Elem::F16`): what `alloc_in` makes
    /// and what the 16-bit kernels read and write.
    pub(super) storage: Storage,
    pub(super) half: Elem,
    /// Compute capability 9.0 (sm_90a): the linear layers' GEMMs run on wgmma fed by TMA.
    pub(super) wgmma: bool,
    /// `layernorm_bwd_bf16`'s last-block counters (`plan::LAYERNORM_BWD_COUNTERS` u32: one per
    /// group of blocks and one for the groups), zeroed when first needed; every launch leaves
    /// them at 0.
    pub(super) counter: std::sync::OnceLock<DeviceMem>,
    /// `column_sum_add_*`'s last-block counters, one u32 per strip of columns
    /// (`plan::COLUMN_SUM_COUNTERS`), zeroed when first needed; every launch leaves them at 0.
    pub(super) column_counters: std::sync::OnceLock<DeviceMem>,
    /// `gemm_bwd_weight_bf16_sm90`'s slice counters, one u32 per tile of dW
    /// (`plan::SM90_SLICE_MAX_TILES`), zeroed when first needed; every launch leaves them at 0.
    pub(super) slice_counters: std::sync::OnceLock<DeviceMem>,
    /// Tables of tensors the multi-tensor kernels read (`kept_table`), each with the bytes it
    /// holds, oldest first: a set of the same tensors finds its table here at its next step.
    tables: std::sync::Mutex<Vec<(Vec<u8>, DeviceMem)>>,
}

/// Abandons an op on a failed GPU call (the trait's ops cannot return errors): the command that
/// ran it ends with `e` (`error::fail`).
pub(super) fn fatal(e: Error) -> ! {
    crate::error::fail(e)
}

/// Abandons a Llama-family op the GPU kernels do not run (on f32 activations, or
/// decoding against a key/value cache); `train` refuses such a run before any work
/// (`config::llama_on_device`).
pub(super) fn unbuilt(op: &str) -> ! {
    fatal(Error::Unsupported(format!("{op} on a GPU: no GPU kernel runs it yet; run this model with --device cpu")))
}

pub(super) fn ok<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| fatal(e))
}

/// Whether every bf16 operand starts on 16 bytes, as TMA needs (`plan::linear_gemms`).
pub(super) fn aligned(pointers: &[u64]) -> bool {
    pointers.iter().all(|&p| p.is_multiple_of(16))
}

/// The first block of each tensor of a multi-tensor launch that gives every tensor ⌈len / chunk⌉
/// blocks, then the total (the `first_block` table the kernels search): `lens.len() + 1` entries.
pub(super) fn first_blocks(lens: impl IntoIterator<Item = usize>, chunk: usize) -> Vec<usize> {
    let mut first = vec![0];
    for len in lens {
        first.push(first[first.len() - 1] + len.div_ceil(chunk));
    }
    first
}

pub(super) fn int(what: &str, v: usize) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| {
        fatal(Error::Config(format!("{what} = {v} does not fit the kernels' int arguments (at most {})", i32::MAX)))
    })
}

impl GpuDevice {
    /// The CUDA Device on GPU `ordinal` of the driver, on bf16 storage, its kernels compiled by
    /// NVRTC through the disk cache (or taken from this build's precompiled images).
    pub fn cuda(ordinal: usize) -> Result<GpuDevice> {
        GpuDevice::open(Vendor::Cuda, ordinal, Storage::Bf16)
    }

    /// The HIP Device on GPU `ordinal` of the HIP runtime, its kernels (kernels/ and kernels-hip/) compiled
    /// for the device's gfx architecture by hipRTC through the disk cache (or taken from this
    /// build's precompiled code objects).
    pub fn hip(ordinal: usize) -> Result<GpuDevice> {
        GpuDevice::open(Vendor::Hip, ordinal, Storage::Bf16)
    }

    /// The Device of `vendor` on GPU `ordinal` whose 16-bit buffers are `storage` (`--fp16`:
    /// binary16), its kernels the modules of that storage.
    pub fn open(vendor: Vendor, ordinal: usize, storage: Storage) -> Result<GpuDevice> {
        GpuDevice::on(OpenGpu::open(vendor, ordinal, storage)?)
    }

    /// The Device on an opened GPU: loads every file it uses and finds its functions.
    pub fn on(gpu: OpenGpu) -> Result<GpuDevice> {
        let wgmma = super::kernels::plan::wgmma(gpu.vendor, &gpu.arch);
        Ok(GpuDevice {
            functions: gpu.functions(&device_kernels(wgmma))?,
            rt: gpu.rt,
            multiprocessors: gpu.multiprocessors,
            limits: gpu.limits,
            bf16_matmul: AtomicBool::new(false),
            scratch: std::sync::Mutex::new(Vec::new()),
            vendor: gpu.vendor,
            arch: gpu.arch,
            storage: gpu.storage,
            half: Elem::of(gpu.storage),
            wgmma,
            counter: std::sync::OnceLock::new(),
            column_counters: std::sync::OnceLock::new(),
            slice_counters: std::sync::OnceLock::new(),
            tables: std::sync::Mutex::new(Vec::new()),
            comms: Vec::new(),
            p2p: None,
            make_collectives: None,
        })
    }

    /// Collectives of these process groups run through their communicators on device buffers
    /// from now on (`CollectiveOps::device_comm`).
    pub fn attach_comms<C: DeviceComm<GpuBuf> + Send + Sync + 'static>(&mut self, comms: Vec<(usize, C)>) {
        self.comms =
            comms.into_iter().map(|(key, c)| (key, Box::new(c) as Box<dyn DeviceComm<GpuBuf> + Send + Sync>)).collect();
    }

    /// Pipeline messages travel through these links on device buffers from now on
    /// (`CollectiveOps::device_p2p`).
    pub fn attach_p2p(&mut self, p2p: impl GpuP2p + 'static) {
        self.p2p = Some(Box::new(p2p));
    }

    /// `CollectiveOps::attach_collectives` makes this device's collectives with `make`.
    pub fn make_collectives_with(&mut self, make: MakeCollectives) {
        self.make_collectives = Some(make);
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

    /// Waits until the work enqueued so far has finished (what a bench times up to).
    pub fn synchronize(&self) -> Result<()> {
        self.settle();
        self.rt.synchronize()
    }

    /// The counters of this Device's runtime calls, shared: they stay readable after the Device
    /// is dropped, with the frees of its kept blocks at the end counted.
    pub fn tally(&self) -> Arc<super::tally::Tally> {
        self.rt.tally().clone()
    }

    /// The head dims the attention kernels are built for (`attention_fwd.cu` / `attention_bwd.cu`
    /// and their HIP twins).
    pub const HEAD_DIMS: [usize; 3] = [32, 64, 128];

    /// Checks that the kernels can run a model with this head dim (`HEAD_DIMS`).
    pub fn check_head_dim(head_dim: usize) -> Result<()> {
        GpuDevice::check_head_dim_for("cuda", head_dim)
    }

    /// `check_head_dim` for `--device <device>`.
    pub fn check_head_dim_for(device: &str, head_dim: usize) -> Result<()> {
        if GpuDevice::HEAD_DIMS.contains(&head_dim) {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "--device {device}: the attention kernels are built for head dims 32, 64 and 128, and this model's \
             head dim (hidden size / attention heads) is {head_dim}"
        )))
    }

    /// The function handle and block size of `k`, one of `DEVICE_KERNELS`.
    fn function(&self, k: Kernel) -> (usize, u32) {
        self.functions
            .get(k)
            .unwrap_or_else(|| fatal(Error::Config(format!("kernel {} is not one the Device resolved", k.function()))))
    }

    /// Launches a kernel with its arguments (`kernels::args`) over `grid`, with its vendor's block
    /// size (`Vendor::threads`).
    pub(super) fn launch<const N: usize>(&self, l: Launch<N>, grid: [usize; 3]) {
        let (function, block) = self.function(l.kernel);
        let shared = self.vendor.dynamic_shared(l.kernel) as usize;
        let config = ok(tiled(l.kernel.function(), grid, [1, 1, 1], [block, 1, 1], shared, &self.limits));
        ok(self.rt.launch_args(function, &config, &l.args));
    }

    /// Launches the kernel that computes `op`, with the geometry `plan` gives it on this device;
    /// `l` holds arguments of that kernel or of one with the same parameters (`Launch::retarget`:
    /// the head dims, the GEMM output types).
    pub(super) fn run<const N: usize>(&self, op: Op, l: Launch<N>) {
        let planned = ok(plan(&op, self.vendor, &self.limits, self.multiprocessors as u32));
        let l = ok(l.retarget(planned.spec.kernel));
        let (function, _) = self.function(l.kernel);
        ok(self.rt.launch_args(function, &planned.config, &l.args));
    }

    /// A grid-stride launch over `n` elements in blocks of 256 (nothing when n is 0).
    pub(super) fn elementwise<const N: usize>(&self, n: usize, l: Launch<N>) {
        if n == 0 {
            return;
        }
        let blocks = n.div_ceil(256).min(GRID_STRIDE_BLOCKS_PER_SM * self.multiprocessors);
        self.launch(l, [blocks, 1, 1]);
    }

    /// One warp (wave) per row, four rows per block.
    pub(super) fn rowwise<const N: usize>(&self, rows: usize, l: Launch<N>) {
        if rows > 0 {
            self.launch(l, [rows.div_ceil(4), 1, 1]);
        }
    }

    /// The device words `cell` holds: `words` u32 allocated and zeroed on first use (the
    /// last-block counters, which every launch that uses them leaves at 0).
    pub(super) fn zeroed_once<'a>(&self, cell: &'a std::sync::OnceLock<DeviceMem>, words: usize) -> &'a DeviceMem {
        cell.get_or_init(|| {
            let c = ok(DeviceMem::alloc(&self.rt, 4 * words));
            ok(self.rt.memset_u32(c.pointer(), 0, words));
            c
        })
    }

    /// One thread per column, blocks of 256.
    pub(super) fn columnwise<const N: usize>(&self, cols: usize, l: Launch<N>) {
        if cols > 0 {
            self.launch(l, [cols.div_ceil(256), 1, 1]);
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

    /// The device address of a table holding `table`'s bytes (the addresses and lengths of a set
    /// of tensors a multi-tensor kernel reads: AdamW's group, the gradients the norm sums): one
    /// the Device kept from an earlier call with the same bytes, else a new one uploaded and kept.
    /// A training run's tensors never move, so after its first step this costs no copy and no
    /// allocation. Beyond `KEPT_TABLES`, the oldest goes back to the runtime's kept blocks:
    /// whatever is later written there runs after the launches that read it, in stream order.
    pub(super) fn kept_table(&self, table: &[u8]) -> u64 {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, mem)) = tables.iter().find(|(bytes, _)| bytes[..] == *table) {
            return mem.pointer();
        }
        let mem = ok(DeviceMem::alloc(&self.rt, table.len()));
        ok(self.rt.copy_to_device(mem.pointer(), table));
        let pointer = mem.pointer();
        if tables.len() == KEPT_TABLES {
            tables.remove(0);
        }
        tables.push((table.to_vec(), mem));
        pointer
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

    /// `dst[dst_at..dst_at+n]` becomes `src[src_at..src_at+n]` on the device: bytes where both
    /// hold one element type, else converted by a cast kernel (f32 -> bf16 rounds to nearest even).
    pub(super) fn cast(&self, dst: &GpuBuf, dst_at: usize, src: &GpuBuf, src_at: usize, n: usize) {
        assert!(dst_at + n <= dst.len && src_at + n <= src.len, "copy: range outside a buffer");
        if n == 0 {
            return;
        }
        let (d, s) = (dst.ptr() + (dst.elem.bytes() * dst_at) as u64, src.ptr() + (src.elem.bytes() * src_at) as u64);
        match (src.elem, dst.elem) {
            (a, b) if a == b => ok(self.rt.copy_on_device(d, s, a.bytes() * n)),
            // The cast kernels convert to and from the module's storage type.
            (Elem::F32, h) if h == self.half => {
                self.run(Op::CastF32ToBf16 { n }, args::cast_f32_to_bf16(d, s, int("n", n)))
            }
            (h, Elem::F32) if h == self.half => {
                self.run(Op::CastBf16ToF32 { n }, args::cast_bf16_to_f32(d, s, int("n", n)))
            }
            (a, b) => fatal(Error::Config(format!("no conversion of a {a:?} buffer into a {b:?} one on the device"))),
        }
    }

    /// `len` elements of `elem` in pooled scratch, uninitialised (given back by `keep`).
    fn scratch_buf(&self, len: usize, elem: Elem) -> GpuBuf {
        let mem = self.scratch((elem.bytes() * len).next_multiple_of(4)).take();
        GpuBuf { mem, len, elem }
    }

    /// `buf` as a kernel operand of element type `want` (f32 or bf16; see `View`).
    pub(super) fn view<'a>(&'a self, buf: &'a GpuBuf, want: Elem) -> View<'a> {
        if buf.elem == want {
            return View { dev: self, same: Some(buf), cast: None };
        }
        let c = self.scratch_buf(buf.len, want);
        self.cast(&c, 0, buf, 0, buf.len);
        View { dev: self, same: None, cast: Some(c) }
    }

    /// `buf` as a kernel output of element type `want`; `whole` says the kernel overwrites all of
    /// it, so a scratch copy needs no loading (see `ViewMut`).
    pub(super) fn view_mut<'a>(&'a self, buf: &'a mut GpuBuf, want: Elem, whole: bool) -> ViewMut<'a> {
        if buf.elem == want {
            return ViewMut { dev: self, target: buf, cast: None };
        }
        let c = self.scratch_buf(buf.len, want);
        if !whole {
            self.cast(&c, 0, buf, 0, buf.len);
        }
        ViewMut { dev: self, target: buf, cast: Some(c) }
    }

    /// The TMA tensor map of a bf16 [rows, cols] GEMM operand (`GpuRuntime::operand_map`).
    pub(super) fn operand_map(&self, pointer: u64, rows: usize, cols: usize, mn_major: bool) -> TensorMap {
        ok(self.rt.operand_map(pointer, rows, cols, mn_major))
    }
}
