//! The CUDA Device: the `Device` trait on one NVIDIA GPU. Buffers are device allocations of f32
//! (freed on drop; each holds an `Arc` of the runtime, so the context outlives every buffer).
//! Linear layers cast both operands to bf16 into device scratch (`casts.cu`) and run the
//! mma.sync GEMMs (`gemm_bf16.cu` with the bias fused, `gemm_bf16_bwd.cu`); attention casts the
//! fused QKV to bf16 and runs `attention_fwd.cu` / `attention_bwd.cu` (head dim 64 or 128); every
//! other op runs an f32 kernel of `tensor_ops.cu`, and AdamW `adamw.cu` on the f32 masters.
//! So the Device computes like the CPU backend's `--bf16`: GEMM and attention operands in bf16,
//! f32 accumulation and storage.
//!
//! The GPU calls go through `GpuRuntime` (allocate, free, copy, memset, load a module, find a
//! function, launch, synchronize): `CudaRuntime` implements it on the driver table of
//! `driver.rs`, and `HipRuntime` (hip_device.rs) on the HIP runtime, running the kernels-hip/
//! twins (same kernel names, arguments and grids); `Vendor` holds what differs, each kernel's file
//! and block size. Everything runs on the legacy default
//! stream, in order; `download`, `sum_squares` and the cross-entropy / split-LayerNorm row sums
//! copy to the host synchronously. A failed GPU call inside an op (the trait's ops return no
//! `Result`) ends the process with one `trident: error:` line naming the call.

use super::driver::{CuContext, CuFunction, CuModule, DeviceInfo, Driver};
use super::kernels::{arch_for, KernelModules};
use crate::device::{AdamWStep, AttentionShape, CollectivesRequest, Device};
use crate::error::{Error, Result};
use crate::real::Precision;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the Device needs of a GPU runtime. Pointers are device addresses; handles are opaque.
pub trait GpuRuntime: Send + Sync {
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Gives back an allocation of `bytes` from `alloc`.
    fn free(&self, pointer: u64, bytes: usize);
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()>;
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// Copies `bytes` between device allocations, in order with the launches.
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Sets `count` 32-bit words at `dst` to `value`.
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()>;
    /// Loads a compiled module (CUBIN) and returns its handle; it stays loaded for the runtime's life.
    fn load_module(&self, image: &[u8]) -> Result<usize>;
    fn function(&self, module: usize, name: &str) -> Result<usize>;
    /// Launches `function` with `params[i]` pointing to argument i, no dynamic shared memory.
    fn launch(&self, function: usize, grid: [u32; 3], block: [u32; 3], params: &mut [*mut c_void]) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// A one-line description: the GPU, its architecture and the driver.
    fn describe(&self) -> String;
}

/// The CUDA driver as a `GpuRuntime`: the primary context of one device, made current on every
/// thread that calls in, and the modules it loaded (unloaded on drop).
pub struct CudaRuntime {
    driver: Driver,
    info: DeviceInfo,
    context: CuContext,
    modules: std::sync::Mutex<Vec<CuModule>>,
    freed: FreedBlocks,
}

/// Freed device allocations (bytes, pointer) that a runtime keeps and hands to later requests of
/// the same size: `cuMemFree` / `hipFree` synchronize the whole device, which would make the
/// host wait for pipeline sends whose receives the peer posts only later (and cost a stall per
/// free besides). Reuse is safe because every launch and copy runs in order on the compute
/// stream and every communication stream waits for it before touching a buffer.
#[derive(Default)]
pub struct FreedBlocks(std::sync::Mutex<Vec<(usize, u64)>>);

impl FreedBlocks {
    /// A kept block of exactly `bytes`, else `fresh(bytes)`; when that fails and blocks of other
    /// sizes are kept, they go back through `release` and `fresh` is tried once more.
    pub fn alloc(&self, bytes: usize, fresh: impl Fn(usize) -> Result<u64>, release: impl Fn(u64)) -> Result<u64> {
        {
            let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = kept.iter().position(|&(b, _)| b == bytes) {
                return Ok(kept.swap_remove(i).1);
            }
        }
        match fresh(bytes) {
            Err(_) if !self.0.lock().map(|k| k.is_empty()).unwrap_or(true) => {
                self.release_all(release);
                fresh(bytes)
            }
            other => other,
        }
    }
    pub fn keep(&self, pointer: u64, bytes: usize) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((bytes, pointer));
    }
    /// Every kept block through `release` (at the runtime's end).
    pub fn release_all(&self, release: impl Fn(u64)) {
        let kept = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, pointer) in kept {
            release(pointer);
        }
    }
}

// SAFETY: the context and module handles are process-wide driver objects; the driver API is
// thread-safe, and each thread makes the context current before using it (`current`).
unsafe impl Send for CudaRuntime {}
// SAFETY: as above; the module list is behind a mutex.
unsafe impl Sync for CudaRuntime {}

thread_local! {
    static CONTEXT_SET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl CudaRuntime {
    /// Retains the primary context of device `ordinal` (compute capability 8.0 or newer).
    pub fn new(driver: Driver, ordinal: usize) -> Result<CudaRuntime> {
        let info = driver.device_info(ordinal)?;
        arch_for(info.compute_capability)?;
        let device = driver.device(ordinal)?;
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: writes one context handle for a device the driver just returned.
        driver
            .check("cuDevicePrimaryCtxRetain", unsafe { driver.api.cuDevicePrimaryCtxRetain(&mut context, device) }?)?;
        let rt = CudaRuntime {
            driver,
            info,
            context,
            modules: std::sync::Mutex::new(Vec::new()),
            freed: FreedBlocks::default(),
        };
        rt.current()?;
        Ok(rt)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// `cuMemFree` of a block from `cuMemAlloc` (through `FreedBlocks`, once per block).
    fn release(&self, pointer: u64) {
        // SAFETY: the pointer came from cuMemAlloc_v2 and left the kept blocks, so is freed once.
        let _ = unsafe { self.driver.api.cuMemFree_v2(pointer) };
    }

    /// Makes the context current on this thread (once per thread and context).
    fn current(&self) -> Result<()> {
        let key = self.context as usize;
        if CONTEXT_SET.with(|c| c.get()) == key {
            return Ok(());
        }
        // SAFETY: the context was retained in `new` and is released only on drop.
        self.driver.check("cuCtxSetCurrent", unsafe { self.driver.api.cuCtxSetCurrent(self.context) }?)?;
        CONTEXT_SET.with(|c| c.set(key));
        Ok(())
    }
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        let _ = self.current();
        self.freed.release_all(|p| self.release(p));
        for m in self.modules.lock().map(|m| m.clone()).unwrap_or_default() {
            // SAFETY: each handle came from cuModuleLoadData and is unloaded once.
            let _ = unsafe { self.driver.api.cuModuleUnload(m) };
        }
        if let Ok(device) = self.driver.device(self.info.ordinal) {
            // SAFETY: balances the retain in `new`.
            let _ = unsafe { self.driver.api.cuDevicePrimaryCtxRelease_v2(device) };
        }
        CONTEXT_SET.with(|c| c.set(0));
    }
}

impl GpuRuntime for CudaRuntime {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.current()?;
        let fresh = |bytes| {
            let mut p = 0;
            // SAFETY: writes one device pointer; a context is current.
            self.driver.check("cuMemAlloc_v2", unsafe { self.driver.api.cuMemAlloc_v2(&mut p, bytes) }?)?;
            Ok(p)
        };
        self.freed.alloc(bytes, fresh, |p| self.release(p))
    }
    fn free(&self, pointer: u64, bytes: usize) {
        self.freed.keep(pointer, bytes);
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: the caller's allocation at dst holds src.len() bytes; synchronous copy.
        self.driver
            .check("cuMemcpyHtoD_v2", unsafe { self.driver.api.cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) }?)
    }
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at src holds dst.len() bytes; synchronous after prior work.
        self.driver.check("cuMemcpyDtoH_v2", unsafe {
            self.driver.api.cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        }?)
    }
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both allocations hold `bytes` at these addresses; ordered on the default stream.
        self.driver.check("cuMemcpyDtoD_v2", unsafe { self.driver.api.cuMemcpyDtoD_v2(dst, src, bytes) }?)
    }
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        self.current()?;
        // SAFETY: the allocation at dst holds count words.
        self.driver.check("cuMemsetD32_v2", unsafe { self.driver.api.cuMemsetD32_v2(dst, value, count) }?)
    }
    fn load_module(&self, image: &[u8]) -> Result<usize> {
        self.current()?;
        let mut m: CuModule = std::ptr::null_mut();
        // SAFETY: the image outlives the call (the driver copies it).
        self.driver
            .check("cuModuleLoadData", unsafe { self.driver.api.cuModuleLoadData(&mut m, image.as_ptr().cast()) }?)?;
        self.modules.lock().expect("module list").push(m);
        Ok(m as usize)
    }
    fn function(&self, module: usize, name: &str) -> Result<usize> {
        self.current()?;
        let c = CString::new(name).map_err(|_| Error::Config(format!("kernel name {name:?}")))?;
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; writes one handle.
        self.driver.check("cuModuleGetFunction", unsafe {
            self.driver.api.cuModuleGetFunction(&mut f, module as CuModule, c.as_ptr())
        }?)?;
        Ok(f as usize)
    }
    fn launch(&self, function: usize, grid: [u32; 3], block: [u32; 3], params: &mut [*mut c_void]) -> Result<()> {
        self.current()?;
        // SAFETY: params point to live arguments of the kernel's types (see `Arg`); the null
        // stream is the legacy default stream, ordered with the synchronous copies.
        self.driver.check("cuLaunchKernel", unsafe {
            self.driver.api.cuLaunchKernel(
                function as CuFunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }?)
    }
    fn synchronize(&self) -> Result<()> {
        self.current()?;
        // SAFETY: a context is current.
        self.driver.check("cuCtxSynchronize", unsafe { self.driver.api.cuCtxSynchronize() }?)
    }
    fn describe(&self) -> String {
        let driver = match self.driver.version() {
            Ok((major, minor)) => format!("CUDA {major}.{minor} driver"),
            Err(_) => "CUDA driver".into(),
        };
        format!(
            "cuda: {} (device {}, {}, {} SMs), {driver} {}",
            self.info.name,
            self.info.ordinal,
            self.info.arch(),
            self.info.multiprocessors,
            self.driver.path()
        )
    }
}

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
    fn matrix_units(self) -> &'static str {
        match self {
            Vendor::Cuda => "mma.sync",
            Vendor::Hip => "MFMA",
        }
    }
}

/// Elements per block of `sum_squares_f32` (tensor_ops.cu's kSumSquaresChunk).
const SUM_SQUARES_CHUNK: usize = 8192;
/// Grid-stride kernels launch at most this many blocks of 256 per SM.
const BLOCKS_PER_SM: usize = 8;

/// A device allocation of `bytes`, freed on drop.
pub struct DeviceMem {
    rt: Arc<dyn GpuRuntime>,
    pointer: u64,
    bytes: usize,
}

impl DeviceMem {
    fn alloc(rt: &Arc<dyn GpuRuntime>, bytes: usize) -> Result<DeviceMem> {
        // A zero-byte request is legal for the Device but not for cuMemAlloc: it holds no memory.
        let pointer = if bytes == 0 { 0 } else { rt.alloc(bytes)? };
        Ok(DeviceMem { rt: rt.clone(), pointer, bytes })
    }
}

/// Scratch memory (bf16 operand copies, uploaded token ids, row sums) borrowed from the device's
/// pool and given back on drop. Reusing a block right after the kernels that read it were
/// launched is safe because every launch and copy runs in order on the one stream; the pool
/// saves a cuMemAlloc / cuMemFree pair (each of which synchronizes the device) per operand.
struct Scratch<'d> {
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

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.pointer != 0 {
            self.rt.free(self.pointer, self.bytes);
        }
    }
}

/// The CUDA Device's buffer: `len` f32 in device memory.
pub struct GpuBuf {
    mem: DeviceMem,
    len: usize,
}

impl GpuBuf {
    pub(crate) fn ptr(&self) -> u64 {
        self.mem.pointer
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The key a process group is found by: the address of its Comm object, which `train` keeps
/// for the whole run (the Device's communicators are made from the same `Groups`).
pub fn group_key(group: &dyn crate::comm::Comm) -> usize {
    group as *const dyn crate::comm::Comm as *const () as usize
}

/// One kernel argument, passed by address as `cuLaunchKernel` wants.
#[derive(Clone, Copy)]
enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

/// How a GPU Device makes its collectives (`Device::attach_collectives`): given by the code that
/// opened it (`open.rs`), which holds the runtime table the communicators' streams borrow.
pub type MakeCollectives = Box<dyn FnOnce(&mut GpuDevice, &CollectivesRequest) -> Result<String> + Send + Sync>;

/// The Device over any `GpuRuntime`.
pub struct GpuDevice {
    /// NCCL communicators of the run's process groups (`group_key`), when collectives run on
    /// device memory (`--gpu-collectives nccl`); first, so they are destroyed before the runtime.
    comms: Vec<(usize, super::collectives::DeviceNccl)>,
    /// The pipeline links (`--gpu-collectives nccl` with pipeline parallelism); before the
    /// runtime for the same reason.
    p2p: Option<super::collectives::PipelineNccl>,
    /// How `attach_collectives` makes them, until it has.
    make_collectives: Option<MakeCollectives>,
    rt: Arc<dyn GpuRuntime>,
    functions: Vec<usize>,
    multiprocessors: usize,
    limits: super::launch::DeviceLimits,
    bf16_matmul: AtomicBool,
    scratch: std::sync::Mutex<Vec<DeviceMem>>,
    vendor: Vendor,
}

/// The CUDA Device.
pub type CudaDevice = GpuDevice;

/// Ends the process on a failed GPU call inside an op (the trait's ops cannot return errors).
fn fatal(e: Error) -> ! {
    eprintln!("trident: error: gpu device: {e}");
    std::process::exit(1)
}

fn ok<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| fatal(e))
}

fn int(what: &str, v: usize) -> i32 {
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
        let root = super::cache::default_root(&|k| std::env::var(k).ok())?;
        let modules = KernelModules::new(super::cache::ModuleCache::new(&root));
        let rt: Arc<dyn GpuRuntime> = Arc::new(rt);
        GpuDevice::new(rt, &modules, &arch, info.multiprocessors.max(1) as usize, info.limits)
    }

    /// Loads every file the Device uses and finds its functions.
    pub fn new(
        rt: Arc<dyn GpuRuntime>,
        modules: &KernelModules,
        arch: &str,
        multiprocessors: usize,
        limits: super::launch::DeviceLimits,
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
        limits: super::launch::DeviceLimits,
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
            make_collectives: None,
        })
    }

    /// Collectives of these process groups run through their communicators on device buffers
    /// from now on (`Device::device_comm`).
    pub fn attach_comms(&mut self, comms: Vec<(usize, super::collectives::DeviceNccl)>) {
        self.comms = comms;
    }

    /// Pipeline messages travel through these links on device buffers from now on
    /// (`Device::device_p2p`).
    pub fn attach_p2p(&mut self, p2p: super::collectives::PipelineNccl) {
        self.p2p = Some(p2p);
    }

    /// `Device::attach_collectives` makes this device's collectives with `make`.
    pub fn make_collectives_with(&mut self, make: MakeCollectives) {
        self.make_collectives = Some(make);
    }

    /// Before the host reads device memory: every communicator's enqueued work has finished
    /// (polled, so a dead peer ends the run with an error instead of a hang in the copy).
    fn settle(&self) {
        for (_, c) in &self.comms {
            c.settle();
        }
        if let Some(p) = &self.p2p {
            p.settle();
        }
    }

    fn to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
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
    fn launch(&self, k: K, grid: [usize; 3], args: &[Arg]) {
        let (name, block) = (FUNCTIONS[k as usize].2, self.vendor.block(k));
        let config = ok(super::launch::tiled(name, grid, [1, 1, 1], [block, 1, 1], 0, &self.limits));
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
        ok(self.rt.launch(self.functions[k as usize], config.grid, config.block, &mut params));
    }

    /// A grid-stride launch over `n` elements in blocks of 256 (nothing when n is 0).
    fn elementwise(&self, k: K, n: usize, args: &[Arg]) {
        if n == 0 {
            return;
        }
        let blocks = n.div_ceil(256).min(BLOCKS_PER_SM * self.multiprocessors);
        self.launch(k, [blocks, 1, 1], args);
    }

    /// One warp (wave) per row, four rows per block.
    fn rowwise(&self, k: K, rows: usize, args: &[Arg]) {
        if rows > 0 {
            self.launch(k, [rows.div_ceil(4), 1, 1], args);
        }
    }

    /// One thread per column, blocks of 256.
    fn columnwise(&self, k: K, cols: usize, args: &[Arg]) {
        if cols > 0 {
            self.launch(k, [cols.div_ceil(256), 1, 1], args);
        }
    }

    /// A scratch block of at least `bytes`: the smallest free one that fits, else a new one.
    fn scratch(&self, bytes: usize) -> Scratch<'_> {
        let reused = self.scratch.lock().ok().and_then(|mut free| {
            let best = free.iter().enumerate().filter(|(_, m)| m.bytes >= bytes).min_by_key(|(_, m)| m.bytes)?.0;
            Some(free.swap_remove(best))
        });
        let mem = reused.unwrap_or_else(|| ok(DeviceMem::alloc(&self.rt, bytes)));
        Scratch { mem: Some(mem), pool: &self.scratch }
    }

    fn upload_bytes(&self, bytes: &[u8]) -> Scratch<'_> {
        let m = self.scratch(bytes.len());
        if !bytes.is_empty() {
            ok(self.rt.copy_to_device(m.pointer, bytes));
        }
        m
    }

    fn upload_u32(&self, v: &[u32]) -> Scratch<'_> {
        self.upload_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    fn upload_f64(&self, v: &[f64]) -> Scratch<'_> {
        self.upload_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    fn download_f64(&self, m: &DeviceMem, out: &mut [f64]) {
        let mut bytes = vec![0u8; out.len() * 8];
        if !bytes.is_empty() {
            ok(self.to_host(&mut bytes, m.pointer));
        }
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *o = f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }

    /// A bf16 copy of the first `n` elements of `src` (round to nearest even), in scratch.
    fn to_bf16(&self, src: &GpuBuf, n: usize) -> Scratch<'_> {
        assert!(n <= src.len, "bf16 cast of {n} elements from a buffer of {}", src.len);
        let out = self.scratch(2 * n);
        self.cast(K::CastF32ToBf16, out.pointer, src.ptr(), n);
        out
    }

    fn cast(&self, k: K, dst: u64, src: u64, n: usize) {
        if n == 0 {
            return;
        }
        let blocks = n.div_ceil(8).div_ceil(256).min(BLOCKS_PER_SM * self.multiprocessors);
        self.launch(k, [blocks, 1, 1], &[Arg::Ptr(dst), Arg::Ptr(src), Arg::I32(int("n", n))]);
    }

    fn attention_kernels(head_dim: usize) -> (K, K, K) {
        match head_dim {
            64 => (K::AttentionFwdD64, K::AttentionBwdDkvD64, K::AttentionBwdDqD64),
            128 => (K::AttentionFwdD128, K::AttentionBwdDkvD128, K::AttentionBwdDqD128),
            d => fatal(Error::Unsupported(format!(
                "attention on the GPU: head dim {d} (the kernels are built for 64 and 128)"
            ))),
        }
    }
}

use Arg::{Ptr, F32, I32};

impl Device for GpuDevice {
    type Buf = GpuBuf;

    fn describe(&self) -> String {
        format!("{}, bf16 GEMMs and attention ({})", self.rt.describe(), self.vendor.matrix_units())
    }
    fn alloc(&self, len: usize) -> GpuBuf {
        let mem = ok(DeviceMem::alloc(&self.rt, 4 * len));
        if len > 0 {
            ok(self.rt.memset_u32(mem.pointer, 0, len));
        }
        GpuBuf { mem, len }
    }
    fn len(&self, buf: &GpuBuf) -> usize {
        buf.len
    }
    fn upload(&self, dst: &mut GpuBuf, src: &[f32]) {
        assert_eq!(dst.len, src.len(), "upload: buffer and host lengths differ");
        if !src.is_empty() {
            // SAFETY: f32 has no padding; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 4 * src.len()) };
            ok(self.rt.copy_to_device(dst.ptr(), bytes));
        }
    }
    fn download(&self, src: &GpuBuf, dst: &mut [f32]) {
        assert_eq!(src.len, dst.len(), "download: buffer and host lengths differ");
        if !dst.is_empty() {
            // SAFETY: every bit pattern is a valid f32; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), 4 * dst.len()) };
            ok(self.to_host(bytes, src.ptr()));
        }
    }
    fn copy(&self, dst: &mut GpuBuf, dst_at: usize, src: &GpuBuf, src_at: usize, len: usize) {
        assert!(dst_at + len <= dst.len && src_at + len <= src.len, "copy: range outside a buffer");
        if len > 0 {
            ok(self.rt.copy_on_device(dst.ptr() + 4 * dst_at as u64, src.ptr() + 4 * src_at as u64, 4 * len));
        }
    }
    fn device_comm(&self, group: &dyn crate::comm::Comm) -> Option<&dyn crate::device::DeviceComm<GpuBuf>> {
        let key = group_key(group);
        self.comms.iter().find(|(k, _)| *k == key).map(|(_, c)| c as &dyn crate::device::DeviceComm<GpuBuf>)
    }
    fn device_p2p(&self) -> Option<&dyn crate::device::DeviceP2p<GpuBuf>> {
        self.p2p.as_ref().map(|p| p as &dyn crate::device::DeviceP2p<GpuBuf>)
    }
    fn attach_collectives(&mut self, request: &CollectivesRequest) -> Result<String> {
        match self.make_collectives.take() {
            Some(make) => make(self, request),
            None => Ok("collectives: MPI, device buffers staged through host memory".into()),
        }
    }
    fn fill(&self, dst: &mut GpuBuf, value: f32) {
        if dst.len > 0 {
            ok(self.rt.memset_u32(dst.ptr(), value.to_bits(), dst.len));
        }
    }

    fn add_assign(&self, acc: &mut GpuBuf, x: &GpuBuf) {
        assert_eq!(acc.len, x.len);
        self.elementwise(K::AddAssignF32, x.len, &[Ptr(acc.ptr()), Ptr(x.ptr()), I32(int("n", x.len))]);
    }
    fn add(&self, out: &mut GpuBuf, a: &GpuBuf, b: &GpuBuf) {
        assert!(a.len == out.len && b.len == out.len);
        self.elementwise(K::AddF32, a.len, &[Ptr(out.ptr()), Ptr(a.ptr()), Ptr(b.ptr()), I32(int("n", a.len))]);
    }
    fn sum_squares(&self, buf: &GpuBuf) -> f64 {
        let blocks = buf.len.div_ceil(SUM_SQUARES_CHUNK);
        if blocks == 0 {
            return 0.0;
        }
        let partials = self.scratch(8 * blocks);
        self.launch(K::SumSquaresF32, [blocks, 1, 1], &[Ptr(partials.pointer), Ptr(buf.ptr()), I32(int("n", buf.len))]);
        let mut host = vec![0f64; blocks];
        self.download_f64(&partials, &mut host);
        host.iter().sum()
    }

    fn embedding_forward(
        &self,
        out: &mut GpuBuf,
        tokens: &[u32],
        wte: &GpuBuf,
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        let t = self.upload_u32(&tokens[..batch * seq]);
        let rows = wte.len / hidden;
        self.elementwise(
            K::EmbeddingFwdF32,
            int("batch·seq·hidden", batch * seq * hidden) as usize,
            &[
                Ptr(out.ptr()),
                Ptr(t.pointer),
                Ptr(wte.ptr()),
                I32(int("vocab_start", vocab_start)),
                I32(int("vocab rows", rows)),
                I32(int("batch", batch)),
                I32(int("seq", seq)),
                I32(int("hidden", hidden)),
            ],
        );
    }
    fn embedding_backward(
        &self,
        dwte: &mut GpuBuf,
        dout: &GpuBuf,
        tokens: &[u32],
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        let t = self.upload_u32(&tokens[..batch * seq]);
        let rows = dwte.len / hidden;
        self.columnwise(
            K::EmbeddingBwdF32,
            hidden,
            &[
                Ptr(dwte.ptr()),
                Ptr(dout.ptr()),
                Ptr(t.pointer),
                I32(int("vocab_start", vocab_start)),
                I32(int("vocab rows", rows)),
                I32(int("batch", batch)),
                I32(int("seq", seq)),
                I32(int("hidden", hidden)),
            ],
        );
    }
    fn position_forward(
        &self,
        out: &mut GpuBuf,
        wpe: &GpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        self.elementwise(
            K::PositionFwdF32,
            int("positions·batch·hidden", positions * batch * hidden) as usize,
            &[
                Ptr(out.ptr()),
                Ptr(wpe.ptr()),
                I32(int("batch", batch)),
                I32(int("t0", t0)),
                I32(int("positions", positions)),
                I32(int("hidden", hidden)),
            ],
        );
    }
    fn position_backward(
        &self,
        dwpe: &mut GpuBuf,
        dout: &GpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        if hidden == 0 || positions == 0 {
            return;
        }
        self.launch(
            K::PositionBwdF32,
            [hidden.div_ceil(256), positions, 1],
            &[
                Ptr(dwpe.ptr()),
                Ptr(dout.ptr()),
                I32(int("batch", batch)),
                I32(int("t0", t0)),
                I32(int("positions", positions)),
                I32(int("hidden", hidden)),
            ],
        );
    }

    fn layernorm_forward(
        &self,
        out: &mut GpuBuf,
        mean: &mut GpuBuf,
        rstd: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: &GpuBuf,
        rows: usize,
        cols: usize,
    ) {
        int("rows·cols", rows * cols);
        self.rowwise(
            K::LayernormFwdF32,
            rows,
            &[
                Ptr(out.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                Ptr(inp.ptr()),
                Ptr(weight.ptr()),
                Ptr(bias.ptr()),
                I32(int("rows", rows)),
                I32(int("cols", cols)),
            ],
        );
    }
    fn layernorm_backward(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dbias: &mut GpuBuf,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        rows: usize,
        cols: usize,
    ) {
        let (r, c) = (I32(int("rows", rows)), I32(int("cols", cols)));
        int("rows·cols", rows * cols);
        self.rowwise(
            K::LayernormBwdDxF32,
            rows,
            &[
                Ptr(dinp.ptr()),
                Ptr(dout.ptr()),
                Ptr(inp.ptr()),
                Ptr(weight.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                r,
                c,
            ],
        );
        self.columnwise(
            K::LayernormBwdParamsF32,
            cols,
            &[
                Ptr(dweight.ptr()),
                Ptr(dbias.ptr()),
                Ptr(dout.ptr()),
                Ptr(inp.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                r,
                c,
            ],
        );
    }

    fn layernorm_sums(&self, inp: &GpuBuf, rows: usize, cols: usize, mean: Option<&[f64]>, out: &mut [f64]) {
        let m = mean.map(|m| self.upload_f64(&m[..rows]));
        let sums = self.scratch(8 * rows);
        self.rowwise(
            K::LayernormSumsF32,
            rows,
            &[
                Ptr(sums.pointer),
                Ptr(inp.ptr()),
                Ptr(m.as_ref().map_or(0, |m| m.pointer)),
                I32(int("rows", rows)),
                I32(int("cols", cols)),
            ],
        );
        self.download_f64(&sums, &mut out[..rows]);
    }
    fn layernorm_apply(
        &self,
        out: &mut GpuBuf,
        mean_out: &mut GpuBuf,
        rstd_out: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: &GpuBuf,
        mean: &[f64],
        rstd: &[f64],
        rows: usize,
        cols: usize,
    ) {
        let (m, r) = (self.upload_f64(&mean[..rows]), self.upload_f64(&rstd[..rows]));
        self.elementwise(
            K::LayernormApplyF32,
            int("rows·cols", rows * cols) as usize,
            &[
                Ptr(out.ptr()),
                Ptr(mean_out.ptr()),
                Ptr(rstd_out.ptr()),
                Ptr(inp.ptr()),
                Ptr(weight.ptr()),
                Ptr(bias.ptr()),
                Ptr(m.pointer),
                Ptr(r.pointer),
                I32(int("rows", rows)),
                I32(int("cols", cols)),
            ],
        );
    }
    fn layernorm_backward_sums(
        &self,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        rows: usize,
        cols: usize,
        out: &mut [f64],
    ) {
        let sums = self.scratch(16 * rows);
        self.rowwise(
            K::LayernormBwdSumsF32,
            rows,
            &[
                Ptr(sums.pointer),
                Ptr(dout.ptr()),
                Ptr(inp.ptr()),
                Ptr(weight.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                I32(int("rows", rows)),
                I32(int("cols", cols)),
            ],
        );
        self.download_f64(&sums, &mut out[..2 * rows]);
    }
    fn layernorm_backward_apply(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dbias: &mut GpuBuf,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        sums: &[f64],
        n: usize,
        rows: usize,
        cols: usize,
    ) {
        let s = self.upload_f64(&sums[..2 * rows]);
        let (r, c) = (I32(int("rows", rows)), I32(int("cols", cols)));
        self.elementwise(
            K::LayernormBwdApplyDxF32,
            int("rows·cols", rows * cols) as usize,
            &[
                Ptr(dinp.ptr()),
                Ptr(dout.ptr()),
                Ptr(inp.ptr()),
                Ptr(weight.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                Ptr(s.pointer),
                I32(int("n", n)),
                r,
                c,
            ],
        );
        self.columnwise(
            K::LayernormBwdParamsF32,
            cols,
            &[
                Ptr(dweight.ptr()),
                Ptr(dbias.ptr()),
                Ptr(dout.ptr()),
                Ptr(inp.ptr()),
                Ptr(mean.ptr()),
                Ptr(rstd.ptr()),
                r,
                c,
            ],
        );
    }

    fn linear_forward(
        &self,
        out: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: Option<&GpuBuf>,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        if rows == 0 || n == 0 {
            return;
        }
        assert!(out.len >= rows * n && weight.len >= n * k);
        let (a, w) = (self.to_bf16(inp, rows * k), self.to_bf16(weight, n * k));
        self.launch(
            K::GemmFwdF32Out,
            [n.div_ceil(64), rows.div_ceil(64), 1],
            &[
                Ptr(out.ptr()),
                Ptr(a.pointer),
                Ptr(w.pointer),
                Ptr(bias.map_or(0, |b| b.ptr())),
                Ptr(0),
                I32(int("rows", rows)),
                I32(int("n", n)),
                I32(int("k", k)),
                I32(0),
            ],
        );
    }
    fn linear_backward(
        &self,
        dinp: Option<&mut GpuBuf>,
        dweight: &mut GpuBuf,
        dbias: Option<&mut GpuBuf>,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        if rows == 0 || n == 0 || k == 0 {
            return;
        }
        let (m_, n_, k_) = (I32(int("rows", rows)), I32(int("n", n)), I32(int("k", k)));
        let d = self.to_bf16(dout, rows * n);
        if let Some(dinp) = dinp {
            let w = self.to_bf16(weight, n * k);
            self.launch(
                K::GemmBwdInput,
                [k.div_ceil(64), rows.div_ceil(64), 1],
                &[Ptr(dinp.ptr()), Ptr(d.pointer), Ptr(w.pointer), m_, n_, k_],
            );
        }
        let x = self.to_bf16(inp, rows * k);
        self.launch(
            K::GemmBwdWeight,
            [k.div_ceil(64), n.div_ceil(64), 1],
            &[Ptr(dweight.ptr()), Ptr(d.pointer), Ptr(x.pointer), m_, n_, k_],
        );
        if let Some(dbias) = dbias {
            self.columnwise(K::ColumnSumAddF32, n, &[Ptr(dbias.ptr()), Ptr(dout.ptr()), m_, n_]);
        }
    }

    fn gelu_forward(&self, out: &mut GpuBuf, inp: &GpuBuf) {
        self.elementwise(K::GeluFwdF32, inp.len, &[Ptr(out.ptr()), Ptr(inp.ptr()), I32(int("n", inp.len))]);
    }
    fn gelu_backward(&self, dinp: &mut GpuBuf, inp: &GpuBuf, dout: &GpuBuf) {
        self.elementwise(
            K::GeluBwdF32,
            inp.len,
            &[Ptr(dinp.ptr()), Ptr(inp.ptr()), Ptr(dout.ptr()), I32(int("n", inp.len))],
        );
    }

    fn attention_forward(&self, out: &mut GpuBuf, lse: &mut GpuBuf, qkv: &GpuBuf, shape: AttentionShape) {
        let (rows, w) = (shape.rows(), shape.width());
        assert!(out.len >= rows * w && lse.len >= rows * shape.heads && qkv.len >= 3 * rows * w);
        if rows == 0 {
            return;
        }
        let (fwd, _, _) = Self::attention_kernels(shape.head_dim);
        let q = self.to_bf16(qkv, 3 * rows * w);
        let o = self.scratch(2 * rows * w);
        int("batch·heads·seq", rows * shape.heads);
        let (b, s, h) = (I32(int("batch", shape.batch)), I32(int("seq", shape.seq)), I32(int("heads", shape.heads)));
        self.launch(
            fwd,
            [shape.seq.div_ceil(64), shape.batch * shape.heads, 1],
            &[Ptr(o.pointer), Ptr(lse.ptr()), Ptr(q.pointer), b, s, h],
        );
        self.cast(K::CastBf16ToF32, out.ptr(), o.pointer, rows * w);
    }
    fn attention_backward(
        &self,
        dqkv: &mut GpuBuf,
        dout: &GpuBuf,
        qkv: &GpuBuf,
        out: &GpuBuf,
        lse: &GpuBuf,
        shape: AttentionShape,
    ) {
        let (rows, w) = (shape.rows(), shape.width());
        assert!(dqkv.len >= 3 * rows * w);
        if rows == 0 {
            return;
        }
        let (_, dkv, dq) = Self::attention_kernels(shape.head_dim);
        let (q, o, d) = (self.to_bf16(qkv, 3 * rows * w), self.to_bf16(out, rows * w), self.to_bf16(dout, rows * w));
        let delta = self.scratch(4 * rows * shape.heads);
        let grad = self.scratch(2 * 3 * rows * w);
        let (b, s, h) = (I32(int("batch", shape.batch)), I32(int("seq", shape.seq)), I32(int("heads", shape.heads)));
        self.launch(
            K::AttentionBwdDelta,
            [(rows * shape.heads).div_ceil(4), 1, 1],
            &[Ptr(delta.pointer), Ptr(d.pointer), Ptr(o.pointer), b, s, h, I32(int("head dim", shape.head_dim))],
        );
        let grid = [shape.seq.div_ceil(64), shape.batch * shape.heads, 1];
        let args = [Ptr(grad.pointer), Ptr(q.pointer), Ptr(d.pointer), Ptr(lse.ptr()), Ptr(delta.pointer), b, s, h];
        self.launch(dkv, grid, &args);
        self.launch(dq, grid, &args);
        self.cast(K::CastBf16ToF32, dqkv.ptr(), grad.pointer, 3 * rows * w);
    }

    fn add_bias(&self, out: &mut GpuBuf, bias: &GpuBuf, rows: usize, cols: usize) {
        self.elementwise(
            K::AddBiasF32,
            int("rows·cols", rows * cols) as usize,
            &[Ptr(out.ptr()), Ptr(bias.ptr()), I32(int("rows", rows)), I32(int("cols", cols))],
        );
    }

    fn cross_entropy_max(&self, logits: &GpuBuf, rows: usize, vocab: usize, max: &mut [f64]) {
        int("rows·vocab", rows * vocab);
        let m = self.scratch(8 * rows);
        self.rowwise(
            K::XentMaxF32,
            rows,
            &[Ptr(m.pointer), Ptr(logits.ptr()), I32(int("rows", rows)), I32(int("vocab", vocab))],
        );
        self.download_f64(&m, &mut max[..rows]);
    }
    fn cross_entropy_partials(
        &self,
        logits: &GpuBuf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &[f64],
        sum_exp: &mut [f64],
        target_logit: &mut [f64],
    ) {
        let (t, m) = (self.upload_u32(&targets[..rows]), self.upload_f64(&max[..rows]));
        let (s, tl) = (self.scratch(8 * rows), self.scratch(8 * rows));
        self.rowwise(
            K::XentPartialsF32,
            rows,
            &[
                Ptr(s.pointer),
                Ptr(tl.pointer),
                Ptr(logits.ptr()),
                Ptr(t.pointer),
                I32(int("vocab_start", vocab_start)),
                Ptr(m.pointer),
                I32(int("rows", rows)),
                I32(int("vocab", vocab)),
            ],
        );
        self.download_f64(&s, &mut sum_exp[..rows]);
        self.download_f64(&tl, &mut target_logit[..rows]);
    }
    fn cross_entropy_backward(
        &self,
        logits: &mut GpuBuf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &[f64],
        sum_exp: &[f64],
        grad_scale: f32,
    ) {
        let (t, m, s) =
            (self.upload_u32(&targets[..rows]), self.upload_f64(&max[..rows]), self.upload_f64(&sum_exp[..rows]));
        self.elementwise(
            K::XentBwdF32,
            int("rows·vocab", rows * vocab) as usize,
            &[
                Ptr(logits.ptr()),
                Ptr(t.pointer),
                I32(int("vocab_start", vocab_start)),
                Ptr(m.pointer),
                Ptr(s.pointer),
                F32(grad_scale),
                I32(int("rows", rows)),
                I32(int("vocab", vocab)),
            ],
        );
    }

    fn set_matmul_precision(&self, precision: Precision) {
        self.bf16_matmul.store(precision == Precision::Bf16, Ordering::Relaxed);
    }
    fn matmul_rounds_operands(&self, precision: Precision) -> bool {
        // The GEMMs cast both f32 operands to bf16 (round to nearest even) before multiplying,
        // whatever the precision: exactly `Precision::Bf16.round`.
        precision == Precision::Bf16
    }

    fn round_to(&self, buf: &mut GpuBuf, precision: Precision) {
        match precision {
            Precision::F32 => {}
            Precision::Bf16 => {
                self.elementwise(K::RoundBf16F32, buf.len, &[Ptr(buf.ptr()), I32(int("n", buf.len))]);
            }
            Precision::F16 => {
                // No fp16 kernels: the Device is bf16-only (`--device cuda` requires --bf16),
                // so this stays correct, on the host.
                let mut host = vec![0f32; buf.len];
                self.download(buf, &mut host);
                for x in host.iter_mut() {
                    *x = precision.round(*x);
                }
                self.upload(buf, &host);
            }
        }
    }

    fn to_half(&self, buf: &GpuBuf, precision: Precision) -> Vec<u16> {
        if precision != Precision::Bf16 {
            let mut host = vec![0f32; buf.len];
            self.download(buf, &mut host);
            return host.iter().map(|&x| precision.to_bits16(x)).collect();
        }
        // Cast on the device and copy half the bytes; the values are already bf16, so exact.
        let half = self.to_bf16(buf, buf.len);
        let mut bytes = vec![0u8; 2 * buf.len];
        if !bytes.is_empty() {
            ok(self.to_host(&mut bytes, half.pointer));
        }
        bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
    }
    fn load_half(&self, src: &[u16], precision: Precision, dst: &mut GpuBuf) {
        assert_eq!(dst.len, src.len(), "load_half: buffer and host lengths differ");
        if precision != Precision::Bf16 {
            let host: Vec<f32> = src.iter().map(|&b| precision.from_bits16(b)).collect();
            return self.upload(dst, &host);
        }
        let half = self.upload_bytes(&src.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>());
        self.cast(K::CastBf16ToF32, dst.ptr(), half.pointer, src.len());
    }

    fn adamw(&self, param: &mut GpuBuf, grad: &GpuBuf, m: &mut GpuBuf, v: &mut GpuBuf, step: AdamWStep) {
        let c1 = 1.0 / (1.0 - (step.beta1 as f64).powi(step.step as i32));
        let c2 = 1.0 / (1.0 - (step.beta2 as f64).powi(step.step as i32));
        self.elementwise(
            K::AdamW,
            grad.len,
            &[
                Ptr(param.ptr()),
                Ptr(0),
                Ptr(grad.ptr()),
                Ptr(m.ptr()),
                Ptr(v.ptr()),
                I32(int("n", grad.len)),
                F32(step.lr),
                F32(step.beta1),
                F32(step.beta2),
                F32(step.eps),
                F32(step.weight_decay),
                F32(step.grad_scale),
                F32(c1 as f32),
                F32(c2 as f32),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_blocks_go_to_requests_of_their_size_and_back_when_an_allocation_fails() {
        use std::cell::{Cell, RefCell};
        let kept = FreedBlocks::default();
        let (next, out_of_memory, released) = (Cell::new(0x1000u64), Cell::new(false), RefCell::new(Vec::new()));
        let fresh = |bytes: usize| {
            if out_of_memory.get() && released.borrow().is_empty() {
                return Err(Error::Comm("out of memory".into()));
            }
            let p = next.get();
            next.set(p + bytes as u64);
            Ok(p)
        };
        let release = |p: u64| released.borrow_mut().push(p);
        let a = kept.alloc(256, fresh, release).unwrap();
        kept.keep(a, 256);
        let b = kept.alloc(512, fresh, release).unwrap();
        assert_ne!(a, b, "a block of another size");
        assert_eq!(kept.alloc(256, fresh, release).unwrap(), a, "the kept block of the same size");
        kept.keep(a, 256);
        kept.keep(b, 512);
        // Out of memory for a new size: the kept blocks go back, then the request is retried.
        out_of_memory.set(true);
        let c = kept.alloc(1024, fresh, release).unwrap();
        assert_eq!(released.borrow().len(), 2);
        assert!(c != a && c != b);
        // Nothing kept and still out of memory: the error.
        released.borrow_mut().clear();
        assert!(kept.alloc(2048, fresh, release).is_err());
    }

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
