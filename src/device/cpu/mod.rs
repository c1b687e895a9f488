//! The CPU backend: f32 buffers in host memory, GEMMs on packed AVX-512 / AVX2 / portable
//! micro-kernels, and every other op from `device::kernels` spread over a small thread pool.
//! Work is split into blocks whose sizes do not depend on the thread count, and reductions add
//! block results in a fixed order, so results are bit-identical for any `--cpu-threads`.

pub mod attention;
mod buf;
pub mod gemm;
pub mod gemm_bf16;
pub mod isa;
mod llama;
pub mod peak;
pub mod pool;
pub mod simd;

use super::blocks;
use super::prelude::*;
use super::{
    dropout, kernels, AdamWStep, AdamWTensor, AttentionShape, Dropout, Gelu, Gemm, LayerNormSaved, Logits, Matrix,
    Rotary, Tokens,
};
use super::{BlockMask, QkvRun};
pub use buf::CpuBuf;
use gemm::MatRef;
use pool::ThreadPool;

/// Rows per task for row-wise ops, elements per task for element-wise ones: fixed sizes, so the
/// grouping of floating-point sums never depends on how many threads there are.
const ROWS_PER_TASK: usize = 16;
const ELEMS_PER_TASK: usize = 1 << 14;
const COLS_PER_TASK: usize = 32;

/// A raw pointer that may cross into pool tasks. Each task derives a disjoint sub-slice from it.
#[derive(Clone, Copy)]
struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}
// SAFETY: used only to hand disjoint regions of one buffer to different tasks.
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    fn new(slice: &mut [T]) -> Self {
        SharedMut { ptr: slice.as_mut_ptr(), len: slice.len() }
    }
    /// The raw pointer, for kernels that take one (a method, so closures capture `self` whole).
    fn ptr(&self) -> *mut T {
        self.ptr
    }
    /// # Safety
    /// `start..start+len` must lie inside the original slice and be touched by no other task.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        debug_assert!(start + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

pub struct CpuDevice {
    pool: ThreadPool,
    /// Whether linear layers multiply bf16 operands (`gemm_bf16`) instead of f32 ones.
    bf16_matmul: std::sync::atomic::AtomicBool,
    /// Whether bf16 mixed precision holds the GEMM weights' working copy as bf16 bits
    /// (`holds_weights_in`), which every bf16 kernel's packing reads at half the bytes and widens
    /// instead of rounding: yes, unless a test chose otherwise (`with_bf16_weights`).
    bf16_weights: bool,
}

impl CpuDevice {
    pub fn new(threads: usize) -> CpuDevice {
        CpuDevice {
            pool: ThreadPool::new(threads.max(1)),
            bf16_matmul: std::sync::atomic::AtomicBool::new(false),
            bf16_weights: true,
        }
    }

    /// The device with bf16 weight copies held as bf16 bits or not, whatever the kernel (tests
    /// compare the two; every bf16 kernel multiplies either form to the same bits).
    pub fn with_bf16_weights(mut self, held: bool) -> CpuDevice {
        self.bf16_weights = held;
        self
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// The GEMM the linear layers use, `C (+)= A·B` for an `m × k` A and a `k × n` B: f32, or
    /// bf16 operands under bf16 mixed precision.
    fn matmul(
        &self,
        (m, n, k): (usize, usize, usize),
        a: MatRef<'_>,
        b: MatRef<'_>,
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        if self.bf16_matmul.load(std::sync::atomic::Ordering::Relaxed) {
            gemm_bf16::gemm_bf16(&self.pool, m, n, k, a, b, c, ldc, accumulate);
        } else {
            gemm::gemm(&self.pool, m, n, k, a, b, c, ldc, accumulate);
        }
    }

    /// `matmul` whose B is a weight `[out, in]` as the linear layers read it, f32 or (the bf16
    /// working copy) bf16 bits: `X·Wᵀ` where `transposed`, else `dY·W`.
    fn matmul_weight(
        &self,
        (m, n, k): (usize, usize, usize),
        a: MatRef<'_>,
        (weight, transposed): (&CpuBuf, bool),
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        let (row_stride, col_stride) = if transposed { (1, k) } else { (n, 1) };
        match weight {
            CpuBuf::F32(w) => {
                let b = MatRef { data: &w[..n * k], row_stride, col_stride };
                self.matmul((m, n, k), a, b, (c, ldc), accumulate)
            }
            CpuBuf::Bf16(bits) => {
                assert!(
                    self.bf16_matmul.load(std::sync::atomic::Ordering::Relaxed),
                    "a bf16 weight copy in an f32 GEMM (a trident bug)"
                );
                let b = MatRef { data: &bits[..n * k], row_stride, col_stride };
                gemm_bf16::gemm_bf16(&self.pool, m, n, k, a, b, c, ldc, accumulate)
            }
        }
    }

    /// `bits` becomes the bf16 bits of `values` (rounded to nearest even, as `round_to` rounds),
    /// in parallel blocks.
    fn to_bf16_bits(&self, bits: &mut [u16], values: &[f32]) {
        assert_eq!(bits.len(), values.len(), "bf16 bits and values differ in length");
        let o = SharedMut::new(bits);
        self.for_blocks(values.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks; the dispatch picks a level this CPU has.
            unsafe { simd::round_bf16_bits_slice(o.slice(s, n), &values[s..s + n]) };
        });
    }

    /// Runs `f(start, len)` over `0..total` in blocks of `block`, in parallel.
    fn for_blocks(&self, total: usize, block: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let tasks = total.div_ceil(block);
        if tasks <= 1 {
            if total > 0 {
                f(0, total);
            }
            return;
        }
        self.pool.run(tasks, &|i| {
            let start = i * block;
            f(start, block.min(total - start));
        });
    }
}

/// Rounds a block of f32 storage to `precision`'s values (`round_to` of one task's block).
fn round_block(block: &mut [f32], precision: crate::real::Precision) {
    match precision {
        crate::real::Precision::F32 => {}
        // SAFETY: the dispatch picks a level this CPU has.
        crate::real::Precision::Bf16 => unsafe { simd::round_bf16_slice(block) },
        // SAFETY: as above.
        crate::real::Precision::F16 => unsafe { simd::round_f16_slice(block) },
    }
}

impl Memory for CpuDevice {
    type Buf = CpuBuf;

    type Half = Vec<u16>;

    type Scalars = Vec<f64>;

    fn describe(&self) -> String {
        let bf16 = self.bf16_matmul.load(std::sync::atomic::Ordering::Relaxed);
        format!(
            "cpu: {} threads, gemm kernel {}{}",
            self.pool.threads(),
            gemm::best_kernel().name(),
            if bf16 { format!(", bf16 gemm kernel {}", gemm_bf16::choose::chosen().describe()) } else { String::new() }
        )
    }

    fn alloc(&self, len: usize) -> CpuBuf {
        CpuBuf::F32(vec![0.0; len])
    }

    fn holds_weights_in(&self, precision: crate::real::Precision) -> bool {
        self.bf16_weights && self.matmul_rounds_operands(precision)
    }

    fn alloc_weights(&self, len: usize, precision: crate::real::Precision) -> CpuBuf {
        match self.holds_weights_in(precision) {
            true => CpuBuf::Bf16(vec![0; len]),
            false => self.alloc(len),
        }
    }

    fn len(&self, buf: &CpuBuf) -> usize {
        buf.len()
    }

    fn bytes(&self, buf: &CpuBuf) -> usize {
        match buf {
            CpuBuf::F32(v) => 4 * v.len(),
            CpuBuf::Bf16(v) => 2 * v.len(),
        }
    }

    fn upload(&self, dst: &mut CpuBuf, src: &[f32]) {
        match dst {
            CpuBuf::F32(v) => v.copy_from_slice(src),
            CpuBuf::Bf16(bits) => self.to_bf16_bits(bits, src),
        }
    }

    fn copy(&self, dst: &mut CpuBuf, dst_at: usize, src: &CpuBuf, src_at: usize, len: usize) {
        let (from, to) = (src_at..src_at + len, dst_at..dst_at + len);
        match (dst, src) {
            (CpuBuf::F32(d), CpuBuf::F32(s)) => d[to].copy_from_slice(&s[from]),
            (CpuBuf::Bf16(d), CpuBuf::Bf16(s)) => d[to].copy_from_slice(&s[from]),
            (CpuBuf::Bf16(d), CpuBuf::F32(s)) => self.to_bf16_bits(&mut d[to], &s[from]),
            // SAFETY: equal lengths; the dispatch picks a level this CPU has.
            (CpuBuf::F32(d), CpuBuf::Bf16(s)) => unsafe { simd::from_bf16_bits_slice(&mut d[to], &s[from]) },
        }
    }

    fn host_threads(&self) -> usize {
        self.pool.threads()
    }

    fn download(&self, src: &CpuBuf, dst: &mut [f32]) {
        match src {
            CpuBuf::F32(v) => dst.copy_from_slice(v),
            // SAFETY: the lengths are checked; the dispatch picks a level this CPU has.
            CpuBuf::Bf16(bits) => unsafe {
                assert_eq!(bits.len(), dst.len(), "download: buffer and host lengths differ");
                simd::from_bf16_bits_slice(dst, bits)
            },
        }
    }

    fn fill(&self, dst: &mut CpuBuf, value: f32) {
        match dst {
            CpuBuf::F32(v) => v.fill(value),
            CpuBuf::Bf16(bits) => {
                let mut one = [0u16];
                self.to_bf16_bits(&mut one, &[value]);
                bits.fill(one[0]);
            }
        }
    }

    fn scalars(&self, len: usize) -> Vec<f64> {
        vec![0.0; len]
    }

    fn read_scalars(&self, src: &Vec<f64>, out: &mut [f64]) {
        out.copy_from_slice(&src[..out.len()]);
    }

    fn write_scalars(&self, dst: &mut Vec<f64>, values: &[f64]) {
        dst[..values.len()].copy_from_slice(values);
    }

    fn host_scalars<'a>(&self, s: &'a mut Vec<f64>) -> Option<&'a mut [f64]> {
        Some(s.as_mut_slice())
    }

    fn round_to(&self, buf: &mut CpuBuf, precision: crate::real::Precision) {
        // bf16 storage holds bf16 values already.
        if precision == crate::real::Precision::F32 || buf.bf16().is_some() {
            return;
        }
        let b = SharedMut::new(buf);
        let len = b.len;
        self.for_blocks(len, ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks.
            round_block(unsafe { b.slice(s, n) }, precision);
        });
    }

    fn to_half(&self, buf: &CpuBuf, precision: crate::real::Precision) -> Vec<u16> {
        let mut out = vec![0u16; buf.len()];
        self.to_half_into(buf, precision, &mut out);
        out
    }

    fn to_half_into(&self, buf: &CpuBuf, precision: crate::real::Precision, half: &mut Vec<u16>) {
        assert_eq!(buf.len(), half.len(), "to_half_into: buffer and copy lengths differ");
        let o = SharedMut::new(half);
        self.for_blocks(buf.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks.
            let (out, src) = (unsafe { o.slice(s, n) }, &buf[s..s + n]);
            // SAFETY: both slices are this task's block; the dispatch picks a level this CPU has.
            unsafe {
                match precision {
                    crate::real::Precision::F16 => simd::f16_bits_slice(out, src),
                    _ => simd::stream_bf16_bits(out, src, false),
                }
            }
        });
    }

    fn half_len(&self, half: &Vec<u16>) -> usize {
        half.len()
    }

    fn load_half(&self, src: &Vec<u16>, precision: crate::real::Precision, dst: &mut CpuBuf) {
        let o = SharedMut::new(dst);
        self.for_blocks(src.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks.
            let (out, bits) = (unsafe { o.slice(s, n) }, &src[s..s + n]);
            // SAFETY: both slices are this task's block; the dispatch picks a level this CPU has.
            unsafe {
                match precision {
                    crate::real::Precision::F16 => simd::from_f16_bits_slice(out, bits),
                    _ => simd::from_bf16_bits_slice(out, bits),
                }
            }
        });
    }

    fn host_f32<'a>(&self, buf: &'a mut CpuBuf) -> Option<&'a mut [f32]> {
        match buf {
            CpuBuf::F32(v) => Some(v.as_mut_slice()),
            CpuBuf::Bf16(_) => None,
        }
    }

    fn host_f32_ref<'a>(&self, buf: &'a CpuBuf) -> Option<&'a [f32]> {
        buf.f32()
    }

    fn take_host_f32(&self, buf: CpuBuf) -> std::result::Result<Vec<f32>, CpuBuf> {
        match buf {
            CpuBuf::F32(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl ElementwiseOps for CpuDevice {
    fn add_assign(&self, acc: &mut CpuBuf, x: &CpuBuf) {
        assert_eq!(acc.len(), x.len());
        let acc_ptr = SharedMut::new(acc);
        self.for_blocks(x.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: blocks are disjoint and inside the buffer.
            let a = unsafe { acc_ptr.slice(s, n) };
            for (a, &b) in a.iter_mut().zip(&x[s..s + n]) {
                *a += b;
            }
        });
    }

    fn add(&self, out: &mut CpuBuf, a: &CpuBuf, b: &CpuBuf) {
        assert!(a.len() == out.len() && b.len() == out.len());
        let out_ptr = SharedMut::new(out);
        self.for_blocks(a.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: blocks are disjoint and inside the buffer.
            let o = unsafe { out_ptr.slice(s, n) };
            for ((o, &x), &y) in o.iter_mut().zip(&a[s..s + n]).zip(&b[s..s + n]) {
                *o = x + y;
            }
        });
    }

    fn gelu_forward(&self, out: &mut CpuBuf, inp: &CpuBuf, form: Gelu) {
        let o = SharedMut::new(out);
        self.for_blocks(inp.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks.
            unsafe { simd::gelu_forward_slice(o.slice(s, n), &inp[s..s + n], form) };
        });
    }

    fn gelu_backward(&self, dinp: &mut CpuBuf, inp: &CpuBuf, dout: &CpuBuf, form: Gelu) {
        let d = SharedMut::new(dinp);
        self.for_blocks(inp.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks.
            unsafe { simd::gelu_backward_slice(d.slice(s, n), &inp[s..s + n], &dout[s..s + n], form) };
        });
    }

    fn swiglu_forward(&self, out: &mut CpuBuf, inp: &CpuBuf, rows: usize, f: usize) {
        self.swiglu_fwd(out, inp, rows, f);
    }

    fn swiglu_backward(&self, dinp: &mut CpuBuf, inp: &CpuBuf, dout: &CpuBuf, rows: usize, f: usize) {
        self.swiglu_bwd(dinp, inp, dout, rows, f);
    }

    fn add_bias(&self, out: &mut CpuBuf, bias: &CpuBuf, Matrix { rows, cols }: Matrix) {
        let o = SharedMut::new(out);
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            // SAFETY: rows r0..r0+nr belong to this task.
            unsafe { simd::add_bias_rows(o.slice(r0 * cols, nr * cols), bias) };
        });
    }

    fn bias_dropout_add(
        &self,
        out: &mut CpuBuf,
        (resid, x): (&CpuBuf, &CpuBuf),
        bias: Option<&CpuBuf>,
        d: &Dropout,
        Matrix { rows, cols }: Matrix,
    ) {
        assert!(out.len() >= rows * cols && resid.len() >= rows * cols && x.len() >= rows * cols);
        let o = SharedMut::new(out);
        let bias = bias.map(|b| &b[..cols]);
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            let span = r0 * cols..(r0 + nr) * cols;
            // SAFETY: rows r0..r0+nr belong to this task.
            let o = unsafe { o.slice(r0 * cols, nr * cols) };
            dropout::bias_dropout_add_rows(o, (&resid[span.clone()], &x[span]), bias, d, r0, cols);
        });
    }

    fn dropout(&self, x: &mut CpuBuf, d: &Dropout, Matrix { rows, cols }: Matrix) {
        assert!(x.len() >= rows * cols);
        let o = SharedMut::new(x);
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            // SAFETY: rows r0..r0+nr belong to this task.
            dropout::dropout_rows(unsafe { o.slice(r0 * cols, nr * cols) }, d, r0, cols);
        });
    }
}

impl NormOps for CpuDevice {
    fn layernorm_forward(
        &self,
        out: &mut CpuBuf,
        (mean, rstd): (&mut CpuBuf, &mut CpuBuf),
        inp: &CpuBuf,
        (weight, bias): (&CpuBuf, &CpuBuf),
        Matrix { rows, cols }: Matrix,
    ) {
        let (o, m, r) = (SharedMut::new(out), SharedMut::new(mean), SharedMut::new(rstd));
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            // SAFETY: rows r0..r0+nr belong to this task in all three outputs.
            unsafe {
                simd::layernorm_forward_rows(
                    o.slice(r0 * cols, nr * cols),
                    (m.slice(r0, nr), r.slice(r0, nr)),
                    &inp[r0 * cols..(r0 + nr) * cols],
                    (weight, bias),
                    cols,
                )
            }
        });
    }

    fn layernorm_backward(
        &self,
        dinp: &mut CpuBuf,
        (dweight, dbias): (&mut CpuBuf, &mut CpuBuf),
        dout: &CpuBuf,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, CpuBuf>,
        Matrix { rows, cols }: Matrix,
    ) {
        // Each block of rows adds its weight/bias contribution into its own slot; the slots are
        // then added in block order, which keeps the result independent of the thread count.
        let blocks = rows.div_ceil(ROWS_PER_TASK);
        let mut partial = vec![0.0f32; blocks * 2 * cols];
        let (dx, pp) = (SharedMut::new(dinp), SharedMut::new(&mut partial));
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            let blk = r0 / ROWS_PER_TASK;
            // SAFETY: rows r0..r0+nr of dinp and slot `blk` of the partials belong to this task.
            unsafe {
                let slot = pp.slice(blk * 2 * cols, 2 * cols);
                let (dw, db) = slot.split_at_mut(cols);
                simd::layernorm_backward_rows(
                    dx.slice(r0 * cols, nr * cols),
                    (dw, db),
                    &dout[r0 * cols..(r0 + nr) * cols],
                    LayerNormSaved {
                        inp: &inp[r0 * cols..(r0 + nr) * cols],
                        weight,
                        mean: &mean[r0..r0 + nr],
                        rstd: &rstd[r0..r0 + nr],
                    },
                    cols,
                )
            }
        });
        for slot in partial.chunks_exact(2 * cols) {
            for c in 0..cols {
                dweight[c] += slot[c];
                dbias[c] += slot[cols + c];
            }
        }
    }

    fn layernorm_sums(&self, inp: &CpuBuf, shape: Matrix, mean: Option<&[f64]>, out: &mut [f64]) {
        kernels::layernorm_sums_rows(inp, shape, mean, out);
    }

    fn layernorm_apply(
        &self,
        out: &mut CpuBuf,
        (mean_out, rstd_out): (&mut CpuBuf, &mut CpuBuf),
        inp: &CpuBuf,
        (weight, bias): (&CpuBuf, &CpuBuf),
        row_stats: (&[f64], &[f64]),
        shape: Matrix,
    ) {
        kernels::layernorm_apply_rows(out, (mean_out, rstd_out), inp, (weight, bias), row_stats, shape);
    }

    fn layernorm_backward_sums(
        &self,
        dout: &CpuBuf,
        saved: LayerNormSaved<'_, CpuBuf>,
        shape: Matrix,
        out: &mut [f64],
    ) {
        kernels::layernorm_backward_sums_rows(dout, saved.map(|b| &b[..]), shape, out);
    }

    fn layernorm_backward_apply(
        &self,
        dinp: &mut CpuBuf,
        (dweight, dbias): (&mut CpuBuf, &mut CpuBuf),
        dout: &CpuBuf,
        saved: LayerNormSaved<'_, CpuBuf>,
        row_sums: (&[f64], usize),
        shape: Matrix,
    ) {
        kernels::layernorm_backward_apply_rows(dinp, (dweight, dbias), dout, saved.map(|b| &b[..]), row_sums, shape);
    }

    fn rmsnorm_forward(
        &self,
        out: &mut CpuBuf,
        rstd: &mut CpuBuf,
        inp: &CpuBuf,
        weight: &CpuBuf,
        shape: Matrix,
        eps: f64,
    ) {
        self.rmsnorm_fwd(out, rstd, inp, weight, shape, eps);
    }

    fn rmsnorm_backward(
        &self,
        dinp: &mut CpuBuf,
        dweight: &mut CpuBuf,
        dout: &CpuBuf,
        (inp, weight): (&CpuBuf, &CpuBuf),
        rstd: &CpuBuf,
        shape: Matrix,
    ) {
        self.rmsnorm_bwd(dinp, dweight, dout, (inp, weight), rstd, shape);
    }
}

impl LinearOps for CpuDevice {
    fn linear_forward(
        &self,
        out: &mut CpuBuf,
        inp: &CpuBuf,
        weight: &CpuBuf,
        bias: Option<&CpuBuf>,
        Gemm { rows, k, n }: Gemm,
    ) {
        let out = &mut out[..rows * n];
        if let Some(bias) = bias {
            for row in out.chunks_exact_mut(n) {
                row.copy_from_slice(bias);
            }
        }
        let a = MatRef { data: &inp[..rows * k], row_stride: k, col_stride: 1 };
        self.matmul_weight((rows, n, k), a, (weight, true), (out, n), bias.is_some());
    }

    fn linear_backward_input(&self, dinp: &mut CpuBuf, dout: &CpuBuf, weight: &CpuBuf, Gemm { rows, k, n }: Gemm) {
        let a = MatRef { data: &dout[..rows * n], row_stride: n, col_stride: 1 };
        self.matmul_weight((rows, k, n), a, (weight, false), (&mut dinp[..rows * k], k), false);
    }

    fn linear_backward(
        &self,
        dinp: Option<&mut CpuBuf>,
        (dweight, dbias): (&mut CpuBuf, Option<&mut CpuBuf>),
        dout: &CpuBuf,
        inp: &CpuBuf,
        weight: &CpuBuf,
        Gemm { rows, k, n }: Gemm,
    ) {
        if let Some(dinp) = dinp {
            self.linear_backward_input(dinp, dout, weight, Gemm { rows, k, n });
        }
        let a = MatRef { data: &dout[..rows * n], row_stride: 1, col_stride: n };
        let b = MatRef { data: &inp[..rows * k], row_stride: k, col_stride: 1 };
        self.matmul((n, k, rows), a, b, (&mut dweight[..n * k], k), true);
        if let Some(dbias) = dbias {
            let db = SharedMut::new(dbias);
            self.for_blocks(n, COLS_PER_TASK, &|c0, nc| {
                // SAFETY: columns c0..c0+nc of dbias belong to this task; the dispatch picks a
                // level this CPU has.
                unsafe { simd::add_column_sums(db.slice(c0, nc), &dout[c0..], rows, n) };
            });
        }
    }

    fn set_matmul_precision(&self, precision: crate::real::Precision) {
        self.bf16_matmul.store(precision == crate::real::Precision::Bf16, std::sync::atomic::Ordering::Relaxed);
    }

    fn matmul_rounds_operands(&self, precision: crate::real::Precision) -> bool {
        // The bf16 GEMM (on every CPU: AVX512-BF16, AVX2 or the portable twin) rounds to nearest
        // even while packing, exactly as `Precision::Bf16` rounds.
        precision == crate::real::Precision::Bf16 && self.bf16_matmul.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl AttentionOps for CpuDevice {
    fn rope_forward(&self, qkv: &mut CpuBuf, table: &CpuBuf, shape: AttentionShape, rotary: Rotary) {
        self.rope(qkv, table, shape, rotary, false);
    }

    fn rope_backward(&self, dqkv: &mut CpuBuf, table: &CpuBuf, shape: AttentionShape, rotary: Rotary) {
        self.rope(dqkv, table, shape, rotary, true);
    }

    fn attention_forward(
        &self,
        out: &mut CpuBuf,
        lse: &mut CpuBuf,
        qkv: &CpuBuf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        assert!(out.len() >= shape.rows() * shape.width() && lse.len() >= shape.rows() * shape.heads);
        assert!(qkv.len() >= shape.rows() * shape.qkv_width());
        assert!(documents.is_none_or(|s| s.len() >= shape.rows()));
        let (o, l) = (SharedMut::new(out), SharedMut::new(lse));
        let (s, d, w) = (shape.seq, shape.head_dim, shape.width());
        self.pool.run(shape.batch * shape.heads, &|i| {
            let (b, head) = (i / shape.heads, i % shape.heads);
            let (rows, lses) = attention::forward_head(&self.pool, qkv, shape, (b, head), (dropout, documents));
            // SAFETY: sizes checked above; task i owns the (b, head) columns and lse entries.
            unsafe {
                for t in 0..s {
                    o.slice((t * shape.batch + b) * w + head * d, d).copy_from_slice(&rows[t * d..(t + 1) * d]);
                }
                l.slice((b * shape.heads + head) * s, s).copy_from_slice(&lses);
            }
        });
    }

    fn attention_backward(
        &self,
        dqkv: &mut CpuBuf,
        dout: &CpuBuf,
        qkv: &CpuBuf,
        out: &CpuBuf,
        lse: &CpuBuf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        assert!(dqkv.len() >= shape.rows() * shape.qkv_width());
        assert!(documents.is_none_or(|s| s.len() >= shape.rows()));
        let dq = SharedMut::new(dqkv);
        let (s, d, n) = (shape.seq, shape.head_dim, shape.group_size());
        // One task per (sequence, group): the group's heads add their k and v gradients in order.
        self.pool.run(shape.batch * shape.kv_heads, &|i| {
            let (b, g) = (i / shape.kv_heads, i % shape.kv_heads);
            for head in g * n..(g + 1) * n {
                let grads =
                    attention::backward_head(&self.pool, dout, qkv, (out, lse), shape, (b, head), (dropout, documents));
                let (q, k, v) = shape.qkv_offsets(head);
                for t in 0..s {
                    let row = (t * shape.batch + b) * shape.qkv_width();
                    for (part, (at, grad)) in [q, k, v].into_iter().zip(&grads).enumerate() {
                        // SAFETY: size checked above; task i owns the (b, group) columns of dqkv.
                        let dst = unsafe { dq.slice(row + at, d) };
                        let src = &grad[t * d..(t + 1) * d];
                        if part == 0 || head == g * n {
                            dst.copy_from_slice(src);
                        } else {
                            dst.iter_mut().zip(src).for_each(|(x, &y)| *x += y);
                        }
                    }
                }
            }
        });
    }

    fn attention_block_forward(
        &self,
        (out, lse): (&mut CpuBuf, &mut CpuBuf),
        (q_src, q): (&CpuBuf, QkvRun),
        (kv_src, kv): (&CpuBuf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        blocks::block_forward((out, lse), (q_src, q), (kv_src, kv), shape, mask);
    }

    fn attention_merge(
        &self,
        acc: (&mut CpuBuf, &mut CpuBuf),
        (o, l): (&CpuBuf, &CpuBuf),
        shape: AttentionShape,
        positions: usize,
    ) {
        blocks::merge((&mut acc.0[..], &mut acc.1[..]), (o, l), shape, positions);
    }

    fn attention_block_backward(
        &self,
        grad: &mut CpuBuf,
        runs: (QkvRun, QkvRun),
        ((dout, out), at): ((&CpuBuf, &CpuBuf), usize),
        (lse, lse_at): (&CpuBuf, usize),
        (q_src, q): (&CpuBuf, QkvRun),
        (kv_src, kv): (&CpuBuf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        let saved = ((&dout[..], &out[..]), at);
        blocks::block_backward(grad, runs, saved, (lse, lse_at), (q_src, q), (kv_src, kv), shape, mask);
    }

    fn attention_decode(&self, out: &mut CpuBuf, qkv: &CpuBuf, shape: AttentionShape, t0: usize) {
        let (n, aw, d) = (shape.seq - t0, shape.width(), shape.head_dim);
        assert!(shape.batch == 1 && out.len() >= n * aw && qkv.len() >= shape.seq * shape.qkv_width());
        let o = SharedMut::new(out);
        self.pool.run(shape.heads, &|head| {
            let mut mine = vec![0f32; n * aw];
            kernels::attention_decode_head(&mut mine, qkv, shape, head, t0);
            for i in 0..n {
                // SAFETY: task `head` owns the head's columns of every row.
                unsafe { o.slice(i * aw + head * d, d) }.copy_from_slice(&mine[i * aw + head * d..][..d]);
            }
        });
    }
}

impl EmbeddingOps for CpuDevice {
    fn embedding_forward(&self, out: &mut CpuBuf, wte: &CpuBuf, tokens: Tokens<'_>, hidden: usize) {
        let (batch, seq) = (tokens.batch, tokens.seq);
        let out_ptr = SharedMut::new(out);
        self.for_blocks(seq, ROWS_PER_TASK, &|t0, nt| {
            // SAFETY: positions t0..t0+nt own rows t0*batch..(t0+nt)*batch.
            let o = unsafe { out_ptr.slice(t0 * batch * hidden, nt * batch * hidden) };
            match wte {
                CpuBuf::F32(wte) => unsafe { simd::embedding_forward_rows(o, wte, tokens, hidden, t0) },
                // The bf16 working copy: each looked-up row widened.
                CpuBuf::Bf16(bits) => {
                    kernels::embedding_rows_with(o, tokens, bits.len() / hidden, (hidden, t0), |row, r| {
                        // SAFETY: equal lengths; the dispatch picks a level this CPU has.
                        unsafe { simd::from_bf16_bits_slice(row, &bits[r * hidden..(r + 1) * hidden]) }
                    })
                }
            }
        });
    }

    fn embedding_backward(&self, dwte: &mut CpuBuf, dout: &CpuBuf, tokens: Tokens<'_>, hidden: usize) {
        let rows = dwte.len() / hidden;
        let te = SharedMut::new(dwte);
        self.for_blocks(hidden, COLS_PER_TASK, &|c0, nc| {
            // SAFETY: each task owns columns c0..c0+nc of the gradient.
            unsafe { simd::embedding_backward_cols((te.ptr(), rows), dout, tokens, hidden, c0..c0 + nc) }
        });
    }

    fn position_forward(
        &self,
        out: &mut CpuBuf,
        wpe: &CpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        let out_ptr = SharedMut::new(out);
        self.for_blocks(positions, ROWS_PER_TASK, &|p0, np| {
            // SAFETY: positions p0..p0+np own rows p0*batch..(p0+np)*batch.
            let o = unsafe { out_ptr.slice(p0 * batch * hidden, np * batch * hidden) };
            unsafe { simd::position_forward_rows(o, wpe, batch, hidden, t0 + p0) };
        });
    }

    fn position_backward(
        &self,
        dwpe: &mut CpuBuf,
        dout: &CpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        let pe = SharedMut::new(dwpe);
        self.for_blocks(hidden, COLS_PER_TASK, &|c0, nc| {
            // SAFETY: each task owns columns c0..c0+nc of the gradient.
            unsafe { simd::position_backward_cols(pe.ptr(), dout, batch, t0..t0 + positions, hidden, c0..c0 + nc) }
        });
    }
}

impl LossOps for CpuDevice {
    fn cross_entropy_max(&self, logits: &CpuBuf, rows: usize, vocab: usize, max: &mut Vec<f64>) {
        let m = SharedMut::new(max);
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            for r in r0..r0 + nr {
                // SAFETY: slot r belongs to this task.
                unsafe { m.slice(r, 1)[0] = simd::row_max(&logits[r * vocab..(r + 1) * vocab]) as f64 };
            }
        });
    }

    fn cross_entropy_partials(
        &self,
        logits: &CpuBuf,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &Vec<f64>,
        stats: &mut Vec<f64>,
    ) {
        let (sum_exp, target_logit) = stats[..2 * rows].split_at_mut(rows);
        let (se, tl) = (SharedMut::new(sum_exp), SharedMut::new(target_logit));
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            for r in r0..r0 + nr {
                let target = kernels::local_row(targets[r], vocab_start, vocab);
                // SAFETY: slot r of both outputs belongs to this task.
                unsafe {
                    let (s, t) =
                        simd::cross_entropy_partials_row(&logits[r * vocab..(r + 1) * vocab], target, max[r] as f32);
                    se.slice(r, 1)[0] = s as f64;
                    tl.slice(r, 1)[0] = t as f64;
                }
            }
        });
    }

    fn cross_entropy_loss(
        &self,
        max: &Vec<f64>,
        stats: &Vec<f64>,
        targets: &[u32],
        rows: usize,
        acc: &mut Vec<f64>,
        slot: usize,
    ) {
        acc[slot] += kernels::cross_entropy_loss_sum(&max[..rows], &stats[..2 * rows], &targets[..rows]);
    }

    fn cross_entropy_backward(
        &self,
        logits: &mut CpuBuf,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &Vec<f64>,
        stats: &Vec<f64>,
        grad_scale: f32,
    ) {
        let sum_exp = &stats[..rows];
        let lg = SharedMut::new(logits);
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            for r in r0..r0 + nr {
                let target = kernels::local_row(targets[r], vocab_start, vocab);
                // SAFETY: row r belongs to this task.
                unsafe {
                    simd::cross_entropy_backward_row(
                        lg.slice(r * vocab, vocab),
                        target,
                        max[r] as f32,
                        sum_exp[r] as f32,
                        kernels::row_grad_scale(targets[r], grad_scale),
                    )
                };
            }
        });
    }
}

impl OptimizerOps for CpuDevice {
    fn sum_squares_into(&self, bufs: &[&CpuBuf], acc: &mut Vec<f64>, slot: usize) {
        for buf in bufs {
            let mut partial = vec![0.0f64; buf.len().div_ceil(ELEMS_PER_TASK)];
            let p = SharedMut::new(&mut partial);
            self.for_blocks(buf.len(), ELEMS_PER_TASK, &|s, n| {
                // SAFETY: the slice is in bounds; the dispatch picks a level this CPU has.
                let sum = unsafe { simd::sum_squares_lanes(&buf[s..s + n]) };
                // SAFETY: one slot per block.
                unsafe { p.slice(s / ELEMS_PER_TASK, 1)[0] = sum };
            });
            acc[slot] += partial.iter().sum::<f64>();
        }
    }

    fn clip_scale(&self, sum: &Vec<f64>, sum_slot: usize, out: &mut Vec<f64>, slot: usize, clip: f64, loss_scale: f64) {
        let (norm, coef) = kernels::clip_scale(sum[sum_slot], clip, loss_scale);
        out[slot..slot + 2].copy_from_slice(&[norm, coef as f64]);
    }

    fn adamw(
        &self,
        AdamWTensor { param, grad, m, v, decayed, working }: AdamWTensor<'_, CpuBuf>,
        step: AdamWStep,
        (scales, slot): (&Vec<f64>, usize),
    ) {
        let step = step.for_tensor(decayed);
        let (p, mm, vv) = (SharedMut::new(param), SharedMut::new(m), SharedMut::new(v));
        let grad_scale = scales[slot] as f32;
        // The working copy is written block by block right behind the update, while the block
        // is still in cache: one more stream, not two more passes.
        // f32 storage gets the rounded values, bf16 storage their bits.
        enum Working {
            Rounded(SharedMut<f32>, crate::real::Precision),
            Bits(SharedMut<u16>),
        }
        let working = working.map(|(w, precision)| {
            assert_eq!(w.len(), grad.len(), "adamw: working copy and parameter lengths differ");
            match w {
                CpuBuf::F32(w) => Working::Rounded(SharedMut::new(w), precision),
                CpuBuf::Bf16(bits) => Working::Bits(SharedMut::new(bits)),
            }
        });
        self.for_blocks(grad.len(), ELEMS_PER_TASK, &|s, n| {
            // SAFETY: disjoint blocks of the three state arrays and of the working copy; the
            // dispatch picks a level this CPU has.
            unsafe {
                let param = p.slice(s, n);
                simd::adamw_slice(param, &grad[s..s + n], mm.slice(s, n), vv.slice(s, n), &step, grad_scale);
                match &working {
                    Some(Working::Rounded(w, precision)) => {
                        let w = w.slice(s, n);
                        w.copy_from_slice(param);
                        round_block(w, *precision);
                    }
                    Some(Working::Bits(bits)) => simd::stream_bf16_bits(bits.slice(s, n), param, true),
                    None => {}
                }
            }
        });
    }
}

impl CollectiveOps for CpuDevice {}
