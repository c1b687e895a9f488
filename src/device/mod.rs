//! The Device seam: the fused ops the model calls on buffers that live on one device. A backend
//! implements each op family (`Memory`, then the traits of `ops` and `collectives`), which
//! together make a `Device`; no model, parallel or optimizer code branches on which backend it
//! is. What a device's work costs, where it counts it, is `counters::WorkCounters`.

pub mod blocks;
pub mod collectives;
pub mod counters;
pub mod cpu;
pub mod dropout;
pub mod kernels;
pub mod llama;
pub mod ops;
pub mod reference;

pub use collectives::{
    all_reduce_scalars, comm_counters, CollectiveLibrary, CollectiveOps, CollectivesRequest, DeviceComm, DeviceP2p,
};
pub use counters::WorkCounters;
pub use dropout::Dropout;
pub use kernels::Gelu;
pub use ops::{
    AdamWStep, AdamWTensor, AttentionOps, AttentionShape, BlockMask, ElementwiseOps, EmbeddingOps, Gemm,
    LayerNormSaved, LinearOps, Logits, LossOps, Matrix, NormOps, OptimizerOps, QkvRun, Rotary, Tokens,
};

/// The op families, for code that calls ops on a concrete backend (`CpuDevice`, `GpuDevice`)
/// rather than through a `D: Device` bound: `use trident::device::prelude::*`.
pub mod prelude {
    pub use super::{
        AttentionOps, CollectiveOps, Device, ElementwiseOps, EmbeddingOps, LinearOps, LossOps, Memory, NormOps,
        OptimizerOps,
    };
}

/// The throughput a rank's device is measured against for MFU: the CPU's measured FMA peak, or
/// a GPU's nominal dense bf16 tensor-core peak.
pub struct DevicePeak {
    pub gflops: f64,
    pub what: String,
}

/// A backend: every op family. Buffers are flat arrays of `len` elements; shapes are passed
/// explicitly, as the shape structs of `ops` where an op takes more than one size. Outputs
/// marked "+=" accumulate into what the buffer holds; all others overwrite.
pub trait Device:
    Memory + ElementwiseOps + NormOps + LinearOps + AttentionOps + EmbeddingOps + LossOps + OptimizerOps + CollectiveOps
{
}

impl<T> Device for T where
    T: Memory
        + ElementwiseOps
        + NormOps
        + LinearOps
        + AttentionOps
        + EmbeddingOps
        + LossOps
        + OptimizerOps
        + CollectiveOps
{
}

/// Buffers and scalars on the device: allocation, host copies, 16-bit copies and rounding.
pub trait Memory: Send + Sync {
    type Buf: Send + Sync;

    /// A 16-bit copy of a buffer (bf16 or f16 bits) where the device keeps it: mixed precision's
    /// saved activations between a layer's forward and its backward.
    type Half: Send + Sync;

    /// f64 values where the device computes them: the cross-entropy's row statistics and the
    /// step's accumulators (the loss, the gradients' sum of squares), read by the host only when
    /// it needs them (`read_scalars`), so a step makes no host round trip for them.
    type Scalars: Send + Sync;

    /// A one-line description for logs (`cpu: 2 threads, avx512f`).
    fn describe(&self) -> String;

    /// A zero-filled buffer of `len` elements.
    fn alloc(&self, len: usize) -> Self::Buf;

    /// A zero-filled buffer of `len` elements held in `precision` where the device stores that
    /// format natively (`stores`); the default is `alloc`, f32 storage whose values mixed
    /// precision rounds where they are stored (`round_to`).
    fn alloc_in(&self, len: usize, _precision: crate::real::Precision) -> Self::Buf {
        self.alloc(len)
    }

    /// Whether `alloc_in(_, precision)` gives native 16-bit storage: its values are rounded to
    /// `precision` by being stored, so they need no rounding pass and no 16-bit copy aside.
    fn stores(&self, _precision: crate::real::Precision) -> bool {
        false
    }

    /// Whether mixed precision holds the working copy of the GEMM weights in `precision` storage
    /// (`alloc_weights`): where the device stores the format (`stores`), and on the CPU where its
    /// bf16 GEMM reads bf16 weights faster than it rounds f32 ones.
    fn holds_weights_in(&self, precision: crate::real::Precision) -> bool {
        self.stores(precision)
    }

    /// A zero-filled buffer for a GEMM weight's working copy: in `precision` storage where
    /// `holds_weights_in`; on the CPU such a buffer reaches only the linear layers (as their
    /// weight), the word embedding (as its table), AdamW (as its working copy) and the buffer
    /// plumbing (`upload`, `download`, `copy`, `fill`, `round_to`).
    fn alloc_weights(&self, len: usize, precision: crate::real::Precision) -> Self::Buf {
        self.alloc_in(len, precision)
    }

    fn len(&self, buf: &Self::Buf) -> usize;

    /// A zero-filled buffer of `buf`'s length and storage (f32 or 16-bit), for a copy of it that
    /// must reach the same kernels: the default is `alloc`, f32 storage.
    fn alloc_like(&self, buf: &Self::Buf) -> Self::Buf {
        self.alloc_like_len(buf, self.len(buf))
    }

    /// A zero-filled buffer of `len` elements in `buf`'s storage (f32 or 16-bit).
    fn alloc_like_len(&self, _buf: &Self::Buf, len: usize) -> Self::Buf {
        self.alloc(len)
    }

    /// Bytes of device memory the buffer's elements take (4 each on f32 storage).
    fn bytes(&self, buf: &Self::Buf) -> usize {
        4 * self.len(buf)
    }

    fn upload(&self, dst: &mut Self::Buf, src: &[f32]);

    /// Host threads that preparing data for this device (the initial weights) may use.
    fn host_threads(&self) -> usize {
        1
    }

    fn download(&self, src: &Self::Buf, dst: &mut [f32]);

    fn fill(&self, dst: &mut Self::Buf, value: f32);

    /// Every buffer of `bufs` becomes 0 (a step's gradients): `fill` with 0 on each, this default;
    /// a device may zero them all in one pass (the GPU Device: one launch over a table kept on
    /// the device).
    fn zero_buffers(&self, bufs: Vec<&mut Self::Buf>) {
        for b in bufs {
            self.fill(b, 0.0);
        }
    }

    /// `len` f64 values, all 0.
    fn scalars(&self, len: usize) -> Self::Scalars;

    /// Copies the first `out.len()` values to the host: one device->host copy, which waits for
    /// the work that writes them.
    fn read_scalars(&self, src: &Self::Scalars, out: &mut [f64]);

    /// The first `values.len()` values become `values`.
    fn write_scalars(&self, dst: &mut Self::Scalars, values: &[f64]);

    /// The values as host memory, when the device keeps them there; collectives then work on
    /// them in place. Devices without host-visible scalars return None and are staged through
    /// `read_scalars` / `write_scalars`.
    fn host_scalars<'a>(&self, _s: &'a mut Self::Scalars) -> Option<&'a mut [f64]> {
        None
    }

    /// Rounds every element to `precision` where it would be stored (bf16 / fp16 emulation on
    /// backends that compute in f32).
    fn round_to(&self, buf: &mut Self::Buf, precision: crate::real::Precision);

    /// A 16-bit copy of `buf`, whose values are already rounded to `precision` (bf16 or f16), so
    /// the copy is exact: mixed precision keeps saved activations this way between a layer's
    /// forward and its backward, in the device's memory.
    fn to_half(&self, buf: &Self::Buf, precision: crate::real::Precision) -> Self::Half;

    /// `half` (of as many elements as `buf`) becomes `to_half(buf, precision)`, in place.
    fn to_half_into(&self, buf: &Self::Buf, precision: crate::real::Precision, half: &mut Self::Half);

    /// `dst` (of as many elements as `src`) becomes the values of the 16-bit copy `src`.
    fn load_half(&self, src: &Self::Half, precision: crate::real::Precision, dst: &mut Self::Buf);

    /// Elements of a 16-bit copy.
    fn half_len(&self, half: &Self::Half) -> usize;

    /// The buffer as host f32 memory, when the device keeps it there; collectives then work on it
    /// in place. Devices without host-visible f32 buffers return None and are staged through
    /// `download` / `upload`.
    fn host_f32<'a>(&self, _buf: &'a mut Self::Buf) -> Option<&'a mut [f32]> {
        None
    }

    fn host_f32_ref<'a>(&self, _buf: &'a Self::Buf) -> Option<&'a [f32]> {
        None
    }

    /// The buffer's host f32 memory itself, handed over (a collective then sends it without a
    /// packed copy), where the device keeps it there; else the buffer back.
    fn take_host_f32(&self, buf: Self::Buf) -> std::result::Result<Vec<f32>, Self::Buf> {
        Err(buf)
    }

    /// `dst[dst_at..dst_at+len] = src[src_at..src_at+len]`, on the device where it has such a copy
    /// (the default stages through the host).
    fn copy(&self, dst: &mut Self::Buf, dst_at: usize, src: &Self::Buf, src_at: usize, len: usize) {
        let mut s = vec![0f32; self.len(src)];
        self.download(src, &mut s);
        let mut d = vec![0f32; self.len(dst)];
        self.download(dst, &mut d);
        d[dst_at..dst_at + len].copy_from_slice(&s[src_at..src_at + len]);
        self.upload(dst, &d);
    }

    /// A block of `rows` rows of `cols` elements: row i of `dst` at `dst_at + i · dst_stride`
    /// becomes row i of `src` at `src_at + i · src_stride`. The default copies row by row.
    fn copy_rows(
        &self,
        dst: &mut Self::Buf,
        (dst_at, dst_stride): (usize, usize),
        src: &Self::Buf,
        (src_at, src_stride): (usize, usize),
        (rows, cols): (usize, usize),
    ) {
        for i in 0..rows {
            self.copy(dst, dst_at + i * dst_stride, src, src_at + i * src_stride, cols);
        }
    }

    /// What this device's work has cost since it was opened (kernel launches, copies,
    /// synchronisations, allocations), where the device counts it: the GPU Device does; None on
    /// devices that count nothing (the CPU, the reference). Subtract two snapshots
    /// (`WorkCounters::since`) for the work between them.
    fn work_counters(&self) -> Option<WorkCounters> {
        None
    }

    /// `--profile`: starts (`on`) or stops the vendor profiler's capture range (CUDA's
    /// `cuProfilerStart`/`cuProfilerStop`, HIP's `hipProfilerStart`/`hipProfilerStop`), so a
    /// profiler run with capture-range on the profiler API records just those steps. Nothing on
    /// devices without one (the CPU, the reference).
    fn profiler(&self, _on: bool) -> crate::error::Result<()> {
        Ok(())
    }
}
