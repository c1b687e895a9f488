//! The GPU Device's Llama-family ops (`device_ops`'s trait methods delegate here): RMSNorm on
//! `layernorm.cu`'s `rmsnorm_fwd_bf16` / `rmsnorm_bwd_bf16` (16-bit activations, f32 weight and
//! statistics), SwiGLU on `gelu.cu`'s `swiglu_fwd_bf16` / `swiglu_bwd_bf16`, rotary embedding on
//! `rope.cu`'s `rope_fwd_bf16` / `rope_bwd_bf16` (f32 table), on CUDA and on HIP (one source
//! each in `kernels/`, the same names, arguments and grids). What has no kernel (f32
//! activations) abandons the op with `device::unbuilt`'s error (`error::fail`: the command ends
//! with it); `train` refuses such a run before any work (`config/`).

use super::buffer::{Elem, GpuBuf};
use super::device::{int, unbuilt, GpuDevice};
use super::kernels::args;
use super::kernels::plan::{layernorm_bwd_partials, Op, LAYERNORM_BWD_COUNTERS};
use crate::device::{AttentionShape, Matrix, Rotary};

impl GpuDevice {
    /// Whether the Llama-family kernels run here: with 16-bit activations `e`; else the process
    /// ends naming `op`.
    fn llama_kernels(&self, op: &str, e: Elem) {
        if e != self.half {
            unbuilt(&format!("{op} on f32 activations (the kernels take --bf16 or --fp16 storage)"))
        }
    }

    /// `NormOps::rmsnorm_forward`: one warp per row (`rmsnorm_fwd_bf16`).
    pub(super) fn rmsnorm_fwd(
        &self,
        out: &mut GpuBuf,
        rstd: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        Matrix { rows, cols }: Matrix,
        eps: f64,
    ) {
        int("rows·cols", rows * cols);
        self.llama_kernels("RMSNorm", inp.elem);
        if rows == 0 {
            return;
        }
        let x = self.view(inp, self.half);
        let o = self.view_mut(out, self.half, out.len == rows * cols);
        let (s, w) = (self.view_mut(rstd, Elem::F32, false), self.view(weight, Elem::F32));
        let [o, s, x, w] = [&*o, &*s, &*x, &*w].map(|b| b.ptr());
        let [r, c] = [int("rows", rows), int("cols", cols)];
        self.run(Op::RmsnormFwd { rows, channels: cols }, args::rmsnorm_fwd_bf16(o, s, x, w, r, c, eps as f32));
    }

    /// `NormOps::rmsnorm_backward`: one launch (`rmsnorm_bwd_bf16`), dweight through the block
    /// partials and the counters LayerNorm's backward shares (every launch leaves them at 0). An
    /// f32 `dout` (tensor parallelism's all-reduced gradient of the norm's output) is rounded to
    /// the 16-bit storage on the way in, the format one rank's GEMM writes it in.
    pub(super) fn rmsnorm_bwd(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dout: &GpuBuf,
        (inp, weight): (&GpuBuf, &GpuBuf),
        rstd: &GpuBuf,
        Matrix { rows, cols }: Matrix,
    ) {
        int("rows·cols", rows * cols);
        self.llama_kernels("RMSNorm", inp.elem);
        if rows == 0 {
            return;
        }
        let [dy, x] = [dout, inp].map(|b| self.view(b, self.half));
        let [w, s] = [weight, rstd].map(|b| self.view(b, Elem::F32));
        let dx = self.view_mut(dinp, self.half, false);
        let dw = self.view_mut(dweight, Elem::F32, false);
        let partials = self.scratch(4 * layernorm_bwd_partials(rows, cols));
        let counter = self.zeroed_once(&self.counter, LAYERNORM_BWD_COUNTERS);
        let [dx, dw, dy, x, w, s] = [&*dx, &*dw, &*dy, &*x, &*w, &*s].map(|b| b.ptr());
        let (p, k) = (partials.pointer, counter.pointer());
        let [r, c] = [int("rows", rows), int("cols", cols)];
        self.run(Op::RmsnormBwd { rows, channels: cols }, args::rmsnorm_bwd_bf16(dx, dw, p, k, dy, x, w, s, r, c));
    }

    /// `ElementwiseOps::swiglu_forward`: out [rows, f] from rows of 2f (`swiglu_fwd_bf16`).
    pub(super) fn swiglu_fwd(&self, out: &mut GpuBuf, inp: &GpuBuf, rows: usize, f: usize) {
        int("rows·2f", rows * 2 * f);
        self.llama_kernels("SwiGLU", inp.elem);
        if rows * f == 0 {
            return;
        }
        let x = self.view(inp, self.half);
        let o = self.view_mut(out, self.half, out.len == rows * f);
        self.run(Op::SwigluFwd { rows, f }, args::swiglu_fwd_bf16(o.ptr(), x.ptr(), int("rows", rows), int("f", f)));
    }

    /// `ElementwiseOps::swiglu_backward`: dinp [rows, 2f] overwritten (`swiglu_bwd_bf16`).
    pub(super) fn swiglu_bwd(&self, dinp: &mut GpuBuf, inp: &GpuBuf, dout: &GpuBuf, rows: usize, f: usize) {
        int("rows·2f", rows * 2 * f);
        self.llama_kernels("SwiGLU", dout.elem);
        if rows * f == 0 {
            return;
        }
        let (x, dy) = (self.view(inp, self.half), self.view(dout, self.half));
        let dx = self.view_mut(dinp, self.half, dinp.len == rows * 2 * f);
        let l = args::swiglu_bwd_bf16(dx.ptr(), x.ptr(), dy.ptr(), int("rows", rows), int("f", f));
        self.run(Op::SwigluBwd { rows, f }, l);
    }

    /// `AttentionOps::rope_forward` (`inverse`: `rope_backward`) in place on the 16-bit QKV (or its
    /// gradient), the f32 table read as `Rotary` describes it.
    pub(super) fn rope(&self, qkv: &mut GpuBuf, table: &GpuBuf, shape: AttentionShape, rotary: Rotary, inverse: bool) {
        let (rows, width, rd) = (shape.rows(), shape.qkv_width(), rotary.rotary_dim);
        assert!(rd % 2 == 0 && rd <= shape.head_dim && qkv.len >= rows * width, "rotary {rd} of {shape:?}");
        assert!(
            table.len >= (rotary.t0 + shape.seq) * rd,
            "the rotary table ends before position {}",
            rotary.t0 + shape.seq
        );
        self.llama_kernels("rotary position embedding", qkv.elem);
        let rotated_heads = shape.heads + shape.kv_heads;
        int("rotated pairs", rows * rotated_heads * (rd / 2));
        if rows * rd == 0 {
            return;
        }
        let t = self.view(table, Elem::F32);
        let x = self.view_mut(qkv, self.half, false);
        let ints = [rows, shape.batch, shape.heads, shape.kv_heads, shape.head_dim, rd, rotary.t0];
        let [r, b, h, kv, d, rd_, t0] = ints.map(|v| int("rotary size", v));
        let op = Op::Rope { rows, width, rotated_heads, rotary_dim: rd, inverse };
        match inverse {
            false => self.run(op, args::rope_fwd_bf16(x.ptr(), t.ptr(), r, b, h, kv, d, rd_, t0)),
            true => self.run(op, args::rope_bwd_bf16(x.ptr(), t.ptr(), r, b, h, kv, d, rd_, t0)),
        }
    }
}
