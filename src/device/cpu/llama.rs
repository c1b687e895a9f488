//! The Llama-family ops on the CPU backend (RMSNorm, SwiGLU, rotary embedding): the shared math
//! of `device::llama`, compiled per instruction set (`simd`) and run over blocks of rows on the
//! thread pool, with per-block weight-gradient partials added in block order so the result does
//! not depend on the thread count.

use super::{simd, CpuDevice, SharedMut, ELEMS_PER_TASK, ROWS_PER_TASK};
use crate::device::{AttentionShape, Matrix, Rotary};

impl CpuDevice {
    pub(super) fn rmsnorm_fwd(
        &self,
        out: &mut [f32],
        rstd: &mut [f32],
        inp: &[f32],
        weight: &[f32],
        Matrix { rows, cols }: Matrix,
        eps: f64,
    ) {
        let (o, r) = (SharedMut::new(out), SharedMut::new(rstd));
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            // SAFETY: rows r0..r0+nr belong to this task in both outputs.
            unsafe {
                let x = &inp[r0 * cols..(r0 + nr) * cols];
                simd::rmsnorm_forward_rows(o.slice(r0 * cols, nr * cols), r.slice(r0, nr), x, weight, cols, eps)
            }
        });
    }

    pub(super) fn rmsnorm_bwd(
        &self,
        dinp: &mut [f32],
        dweight: &mut [f32],
        dout: &[f32],
        (inp, weight): (&[f32], &[f32]),
        rstd: &[f32],
        Matrix { rows, cols }: Matrix,
    ) {
        let blocks = rows.div_ceil(ROWS_PER_TASK);
        let mut partial = vec![0.0f32; blocks * cols];
        let (dx, pp) = (SharedMut::new(dinp), SharedMut::new(&mut partial));
        self.for_blocks(rows, ROWS_PER_TASK, &|r0, nr| {
            let span = r0 * cols..(r0 + nr) * cols;
            // SAFETY: rows r0..r0+nr of dinp and slot r0 / ROWS_PER_TASK of the partials are this task's.
            unsafe {
                simd::rmsnorm_backward_rows(
                    dx.slice(r0 * cols, nr * cols),
                    pp.slice(r0 / ROWS_PER_TASK * cols, cols),
                    &dout[span.clone()],
                    (&inp[span], weight),
                    &rstd[r0..r0 + nr],
                    cols,
                )
            }
        });
        for slot in partial.chunks_exact(cols) {
            dweight.iter_mut().zip(slot).for_each(|(w, &p)| *w += p);
        }
    }

    pub(super) fn swiglu_fwd(&self, out: &mut [f32], inp: &[f32], rows: usize, f: usize) {
        let o = SharedMut::new(out);
        let per_task = (ELEMS_PER_TASK / f.max(1)).max(1);
        self.for_blocks(rows, per_task, &|r0, nr| {
            // SAFETY: rows r0..r0+nr of the output belong to this task.
            unsafe { simd::swiglu_forward_rows(o.slice(r0 * f, nr * f), &inp[r0 * 2 * f..(r0 + nr) * 2 * f], f) }
        });
    }

    pub(super) fn swiglu_bwd(&self, dinp: &mut [f32], inp: &[f32], dout: &[f32], rows: usize, f: usize) {
        let d = SharedMut::new(dinp);
        let per_task = (ELEMS_PER_TASK / f.max(1)).max(1);
        self.for_blocks(rows, per_task, &|r0, nr| {
            let (x, dy) = (&inp[r0 * 2 * f..(r0 + nr) * 2 * f], &dout[r0 * f..(r0 + nr) * f]);
            // SAFETY: rows r0..r0+nr of the gradient belong to this task.
            unsafe { simd::swiglu_backward_rows(d.slice(r0 * 2 * f, nr * 2 * f), x, dy, f) }
        });
    }

    pub(super) fn rope(&self, qkv: &mut [f32], table: &[f32], shape: AttentionShape, rotary: Rotary, inverse: bool) {
        let w = shape.qkv_width();
        let q = SharedMut::new(&mut qkv[..shape.rows() * w]);
        self.for_blocks(shape.rows(), ROWS_PER_TASK, &|r0, nr| {
            // SAFETY: rows r0..r0+nr belong to this task.
            unsafe { simd::rope_rows(q.slice(r0 * w, nr * w), r0, table, &shape, rotary, inverse) }
        });
    }
}
