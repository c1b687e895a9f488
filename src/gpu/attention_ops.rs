//! The GPU Device's attention and dropout: `impl AttentionOps` (FlashAttention-2 forward and
//! backward on the vendor's `attention_*` kernels, 16-bit operands, f32 statistics) and the
//! launches of `tensor_ops`'s dropout kernels that `device_ops`'s element-wise ops delegate to,
//! with the `int` arguments both kinds of kernel take (`kernels/common/dropout.h`).

use super::buffer::{Elem, GpuBuf};
use super::device::{int, unbuilt, GpuDevice, Scratch};
use super::kernels::args;
use super::kernels::plan::Op;
use crate::device::prelude::*;
use crate::device::{AttentionShape, BlockMask, Dropout, Matrix, QkvRun, Rotary};

/// `$kernel`'s arguments: `$args`, then those of the dropout site `$site` (`site_ints`, its scale
/// second), as every `_drop_` attention kernel takes them after its own; with `rows`, the
/// hidden-site kernels', its jump (`jump_ints`) last.
macro_rules! with_site {
    ($kernel:path, $site:expr, $($args:expr),*) => {{
        let [th, k0, k1, place, it, s_lo, s_hi, db, ds, t0, width, col0] = site_ints($site);
        $kernel($($args,)* th, $site.scale(), k0, k1, place, it, s_lo, s_hi, db, ds, t0, width, col0)
    }};
    (rows $kernel:path, $site:expr, $($args:expr),*) => {{
        let [th, k0, k1, place, it, s_lo, s_hi, db, ds, t0, width, col0] = site_ints($site);
        let [at, by] = jump_ints($site);
        $kernel($($args,)* th, $site.scale(), k0, k1, place, it, s_lo, s_hi, db, ds, t0, width, col0, at, by)
    }};
}

impl AttentionOps for GpuDevice {
    fn attention_decode(&self, _: &mut GpuBuf, _: &GpuBuf, _: AttentionShape, _: usize) {
        unbuilt("attention against a key/value cache (generation)")
    }

    // Context parallelism's blocks: the `attention_block_fwd` kernels (`kernels/common/key_block.h`),
    // 16-bit operands, f32 output and log-sum-exp; the merge on `tensor_ops`'s f32 kernel.
    fn attention_block_forward(
        &self,
        (out, lse): (&mut GpuBuf, &mut GpuBuf),
        (q_src, q): (&GpuBuf, QkvRun),
        (kv_src, kv): (&GpuBuf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        let (bt, qw) = (shape.batch, shape.qkv_width());
        assert!(!mask.diagonal || q.len == kv.len, "a diagonal block is square");
        assert!(q_src.len >= q.end(bt, qw) && kv_src.len >= kv.end(bt, qw));
        assert!(out.len >= q.len * bt * shape.width() && lse.len >= bt * shape.heads * q.len);
        if q.len == 0 {
            return;
        }
        assert!(kv.len > 0, "a block's queries see at least one key");
        let (qs, ks) = (self.view(q_src, self.half), self.view(kv_src, self.half));
        let (o, l) = (self.view_mut(out, Elem::F32, false), self.view_mut(lse, Elem::F32, false));
        let (qp, kp, o, l) = (run_at(&qs, q, shape), run_at(&ks, kv, shape), o.ptr(), l.ptr());
        let [b, s, h, kvh] = attention_ints(AttentionShape { seq: q.len, ..shape });
        let [keys, shift] = key_block_ints(kv, mask);
        let AttentionShape { batch, heads, kv_heads, head_dim, .. } = shape;
        let dropout = mask.dropout.is_some();
        let op = Op::AttentionBlockFwd { batch, seq: q.len, heads, kv_heads, head_dim, dropout };
        match mask.dropout {
            None => self.run(op, args::attention_block_fwd_bf16_d64(o, l, qp, kp, b, s, h, kvh, keys, shift)),
            Some((d, q0, k0)) => {
                let [q0, k0] = [q0, k0].map(|p| int("block's first position", p));
                let f = args::attention_block_fwd_drop_bf16_d64;
                let launch = with_site!(f, d, o, l, qp, kp, b, s, h, kvh, keys, shift, q0, k0);
                self.run(op, launch)
            }
        }
    }

    fn attention_merge(
        &self,
        (out, lse): (&mut GpuBuf, &mut GpuBuf),
        (part_out, part_lse): (&GpuBuf, &GpuBuf),
        shape: AttentionShape,
        positions: usize,
    ) {
        let rows = positions * shape.batch;
        assert!(out.len >= rows * shape.width() && part_out.len >= rows * shape.width());
        assert!(lse.len >= rows * shape.heads && part_lse.len >= rows * shape.heads);
        let (po, pl) = (self.view(part_out, Elem::F32), self.view(part_lse, Elem::F32));
        let (o, l) = (self.view_mut(out, Elem::F32, false), self.view_mut(lse, Elem::F32, false));
        let [b, p, h, d] = [shape.batch, positions, shape.heads, shape.head_dim].map(|v| int("merge size", v));
        let n = rows * shape.heads;
        int("positions·batch·heads", n);
        self.elementwise(n, args::attention_merge_f32(o.ptr(), l.ptr(), po.ptr(), pl.ptr(), b, p, h, d));
    }

    fn attention_block_backward(
        &self,
        grad: &mut GpuBuf,
        (dq, dkv): (QkvRun, QkvRun),
        ((dout, out), at): ((&GpuBuf, &GpuBuf), usize),
        (lse, lse_at): (&GpuBuf, usize),
        (q_src, q): (&GpuBuf, QkvRun),
        (kv_src, kv): (&GpuBuf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        let (bt, qw, aw) = (shape.batch, shape.qkv_width(), shape.width());
        assert!(grad.len >= dq.end(bt, qw) && grad.len >= dkv.end(bt, qw));
        assert!(dout.len >= at + q.len * bt * aw && out.len >= at + q.len * bt * aw);
        assert!(lse.len >= lse_at + bt * shape.heads * q.len);
        assert!(q_src.len >= q.end(bt, qw) && kv_src.len >= kv.end(bt, qw));
        if q.len == 0 {
            return;
        }
        let [qs, ks, d, o] = [q_src, kv_src, dout, out].map(|b| self.view(b, self.half));
        let (l, g) = (self.view(lse, Elem::F32), self.view_mut(grad, Elem::F32, false));
        // delta = dO · O of the block's queries (the whole attention's rows), then dK/dV and dQ.
        let delta = self.scratch(4 * q.len * bt * shape.heads);
        let block = AttentionShape { seq: q.len, ..shape };
        let [b, s, h, kvh] = attention_ints(block);
        let AttentionShape { batch, heads, kv_heads, head_dim, .. } = shape;
        let (dp, op) = (element_at(&d, at), element_at(&o, at));
        let l_delta = args::attention_bwd_delta_bf16(delta.pointer, dp, op, b, s, h, kvh, int("head dim", head_dim));
        self.run(Op::AttentionBwdDelta { batch, seq: q.len, heads, kv_heads, head_dim }, l_delta);
        let (qp, kp, lp, dl) = (run_at(&qs, q, shape), run_at(&ks, kv, shape), element_at(&l, lse_at), delta.pointer);
        let (gq, gkv) = (run_at(&g, dq, shape), run_at(&g, dkv, shape));
        let [keys, shift] = key_block_ints(kv, mask);
        let dropout = mask.dropout.is_some();
        let dkv_op = Op::AttentionBlockBwdDkv { batch, keys: kv.len, heads, kv_heads, head_dim, dropout };
        let dq_op = Op::AttentionBlockBwdDq { batch, seq: q.len, heads, kv_heads, head_dim, dropout };
        match mask.dropout {
            None => {
                let dkv_args =
                    args::attention_block_bwd_dkv_bf16_d64(gkv, qp, kp, dp, lp, dl, b, s, h, kvh, keys, shift);
                self.run(dkv_op, dkv_args);
                let dq_args = args::attention_block_bwd_dq_bf16_d64(gq, qp, kp, dp, lp, dl, b, s, h, kvh, keys, shift);
                self.run(dq_op, dq_args);
            }
            Some((r, q0, k0)) => {
                let [q0, k0] = [q0, k0].map(|p| int("block's first position", p));
                let f = args::attention_block_bwd_dkv_drop_bf16_d64;
                self.run(dkv_op, with_site!(f, r, gkv, qp, kp, dp, lp, dl, b, s, h, kvh, keys, shift, q0, k0));
                let f = args::attention_block_bwd_dq_drop_bf16_d64;
                self.run(dq_op, with_site!(f, r, gq, qp, kp, dp, lp, dl, b, s, h, kvh, keys, shift, q0, k0));
            }
        }
    }

    fn rope_forward(&self, qkv: &mut GpuBuf, table: &GpuBuf, shape: AttentionShape, rotary: Rotary) {
        self.rope(qkv, table, shape, rotary, false)
    }

    fn rope_backward(&self, dqkv: &mut GpuBuf, table: &GpuBuf, shape: AttentionShape, rotary: Rotary) {
        self.rope(dqkv, table, shape, rotary, true)
    }

    fn attention_forward(
        &self,
        out: &mut GpuBuf,
        lse: &mut GpuBuf,
        qkv: &GpuBuf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        let (rows, w) = (shape.rows(), shape.width());
        assert!(out.len >= rows * w && lse.len >= rows * shape.heads && qkv.len >= rows * shape.qkv_width());
        if rows == 0 {
            return;
        }
        // The kernels read and write bf16; the statistics are f32.
        let q = self.view(qkv, self.half);
        let whole = out.len == rows * w;
        let (o, lse) = (self.view_mut(out, self.half, whole), self.view_mut(lse, Elem::F32, false));
        let [b, s, h, kv] = attention_ints(shape);
        let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
        // The head dim's kernel: one signature for the three (`Launch::retarget`); the `_drop_`
        // kernels with dropout, the `_docs_` ones with documents.
        let (o, lse, q) = (o.ptr(), lse.ptr(), q.ptr());
        let starts = self.document_starts(documents, shape);
        let documents = starts.as_ref().map(|m| m.pointer);
        let (drop, docs) = (dropout.is_some(), documents.is_some());
        let op = Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim, dropout: drop, documents: docs };
        match (dropout, documents) {
            (None, None) => self.run(op, args::attention_fwd_bf16_d64(o, lse, q, b, s, h, kv)),
            (None, Some(st)) => self.run(op, args::attention_fwd_docs_bf16_d64(o, lse, q, b, s, h, kv, st)),
            (Some(d), None) => self.run(op, with_site!(args::attention_fwd_drop_bf16_d64, d, o, lse, q, b, s, h, kv)),
            (Some(d), Some(st)) => {
                self.run(op, with_site!(args::attention_fwd_drop_docs_bf16_d64, d, o, lse, q, b, s, h, kv, st))
            }
        }
    }

    fn attention_backward(
        &self,
        dqkv: &mut GpuBuf,
        dout: &GpuBuf,
        qkv: &GpuBuf,
        out: &GpuBuf,
        lse: &GpuBuf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        let rows = shape.rows();
        assert!(dqkv.len >= rows * shape.qkv_width());
        if rows == 0 {
            return;
        }
        let [q, o, d] = [qkv, out, dout].map(|b| self.view(b, self.half));
        let lse = self.view(lse, Elem::F32);
        let delta = self.scratch(4 * rows * shape.heads);
        let whole = dqkv.len == rows * shape.qkv_width();
        let grad = self.view_mut(dqkv, self.half, whole);
        let [b, s, h, kv] = attention_ints(shape);
        let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
        let l = args::attention_bwd_delta_bf16(delta.pointer, d.ptr(), o.ptr(), b, s, h, kv, int("head dim", head_dim));
        self.run(Op::AttentionBwdDelta { batch, seq, heads, kv_heads, head_dim }, l);
        // dK/dV (a block per key/value head, summing its group's query heads), then dQ; the head
        // dim's kernels, one signature for the three (`Launch::retarget`).
        // The `_drop_` kernels with dropout, the `_docs_` ones with documents, as forward.
        let ([g, q, d, lse], dl) = ([&*grad, &*q, &*d, &*lse].map(|b| b.ptr()), delta.pointer);
        let starts = self.document_starts(documents, shape);
        let documents = starts.as_ref().map(|m| m.pointer);
        let (drop, docs) = (dropout.is_some(), documents.is_some());
        let dkv_op = Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim, dropout: drop, documents: docs };
        let dq_op = Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim, dropout: drop, documents: docs };
        match (dropout, documents) {
            (None, None) => {
                self.run(dkv_op, args::attention_bwd_dkv_bf16_d64(g, q, d, lse, dl, b, s, h, kv));
                self.run(dq_op, args::attention_bwd_dq_bf16_d64(g, q, d, lse, dl, b, s, h, kv));
            }
            (None, Some(st)) => {
                self.run(dkv_op, args::attention_bwd_dkv_docs_bf16_d64(g, q, d, lse, dl, b, s, h, kv, st));
                self.run(dq_op, args::attention_bwd_dq_docs_bf16_d64(g, q, d, lse, dl, b, s, h, kv, st));
            }
            (Some(r), None) => {
                self.run(dkv_op, with_site!(args::attention_bwd_dkv_drop_bf16_d64, r, g, q, d, lse, dl, b, s, h, kv));
                self.run(dq_op, with_site!(args::attention_bwd_dq_drop_bf16_d64, r, g, q, d, lse, dl, b, s, h, kv));
            }
            (Some(r), Some(st)) => {
                let dkv = with_site!(args::attention_bwd_dkv_drop_docs_bf16_d64, r, g, q, d, lse, dl, b, s, h, kv, st);
                self.run(dkv_op, dkv);
                let dq = with_site!(args::attention_bwd_dq_drop_docs_bf16_d64, r, g, q, d, lse, dl, b, s, h, kv, st);
                self.run(dq_op, dq);
            }
        }
    }
}

/// Dropout: `tensor_ops`'s `bias_dropout_add_f32` and `dropout_f32`; the attention kernels'
/// document starts.
impl GpuDevice {
    /// `documents` (each position's document start, at b·seq + t) on the device for the `_docs_`
    /// attention kernels (`kernels/common/documents.h`), None without: each clamped to its
    /// position, as the reference reads them (`document_start`). The kernels skip and mask whole
    /// tiles from the first and last start of a run of positions, so within a sequence the starts
    /// must not decrease (as every sample's document starts do).
    fn document_starts(&self, documents: Option<&[u32]>, shape: AttentionShape) -> Option<Scratch<'_>> {
        let starts = documents?;
        let seq = shape.seq.max(1);
        assert_eq!(starts.len(), shape.batch * shape.seq, "document starts: one per position of each sequence");
        let first: Vec<u32> = starts.iter().enumerate().map(|(i, &s)| s.min((i % seq) as u32)).collect();
        let rising = first.chunks(seq).all(|s| s.windows(2).all(|w| w[0] <= w[1]));
        assert!(rising, "document starts decrease within a sequence");
        Some(self.upload_u32(&first))
    }

    pub(super) fn launch_bias_dropout_add(
        &self,
        out: &mut GpuBuf,
        (resid, x): (&GpuBuf, &GpuBuf),
        bias: Option<&GpuBuf>,
        d: &Dropout,
        Matrix { rows, cols }: Matrix,
    ) {
        let n = int("rows·cols", rows * cols);
        assert!(out.len >= n as usize && resid.len >= n as usize && x.len >= n as usize);
        let (resid, x) = (self.view(resid, Elem::F32), self.view(x, Elem::F32));
        let bias = bias.map(|b| self.view(b, Elem::F32));
        let whole = out.len == n as usize;
        let o = self.view_mut(out, Elem::F32, whole);
        let b = bias.as_ref().map_or(x.ptr(), |b| b.ptr());
        let (has_bias, r, c) = (i32::from(bias.is_some()), int("rows", rows), int("cols", cols));
        let l = with_site!(rows args::bias_dropout_add_f32, d, o.ptr(), resid.ptr(), x.ptr(), b, has_bias, r, c);
        self.elementwise(n as usize, l);
    }

    pub(super) fn launch_dropout(&self, x: &mut GpuBuf, d: &Dropout, Matrix { rows, cols }: Matrix) {
        let n = int("rows·cols", rows * cols);
        assert!(x.len >= n as usize);
        let o = self.view_mut(x, Elem::F32, false);
        let (r, c) = (int("rows", rows), int("cols", cols));
        let l = with_site!(rows args::dropout_f32, d, o.ptr(), r, c);
        self.elementwise(n as usize, l);
    }
}

/// A hidden-site kernel's last two `int` arguments: where the buffer's positions jump and by how
/// much (none: at `i32::MAX`).
fn jump_ints(d: &Dropout) -> [i32; 2] {
    match d.jump {
        Some((at, by)) => [int("dropout jump position", at), int("dropout jump", by)],
        None => [i32::MAX, 0],
    }
}

/// The `int` arguments of a dropout site (`kernels/common/dropout.h`), but its f32 scale: the
/// threshold, the key and counter words, the two halves of the first sample, and the row map.
fn site_ints(d: &Dropout) -> [i32; 12] {
    let w = |v: u32| v as i32;
    [
        w(d.threshold()),
        w(d.key[0]),
        w(d.key[1]),
        w(d.place),
        w(d.iteration),
        w(d.sample0 as u32),
        w((d.sample0 >> 32) as u32),
        int("dropout batch", d.batch),
        int("dropout positions", d.seq),
        int("dropout first position", d.t0),
        int("dropout width", d.width),
        int("dropout first column", d.col0),
    ]
}

/// The device address of element `elems` of `b`.
fn element_at(b: &GpuBuf, elems: usize) -> u64 {
    b.ptr() + (elems * b.elem.bytes()) as u64
}

/// The device address of the first row of `run` in the fused-QKV-wide buffer `b`.
fn run_at(b: &GpuBuf, run: QkvRun, shape: AttentionShape) -> u64 {
    element_at(b, run.at(0, 0, shape.batch, shape.qkv_width()))
}

/// A block's `keys` and `shift` arguments (`kernels/common/key_block.h`): query t sees the keys
/// up to t + shift, so the diagonal block shifts by 0 and a block of earlier keys by all of them.
fn key_block_ints(kv: QkvRun, mask: BlockMask) -> [i32; 2] {
    let keys = int("block keys", kv.len);
    [keys, if mask.diagonal { 0 } else { keys }]
}

/// The `int` arguments batch, seq, heads and kv_heads of the attention kernels.
fn attention_ints(shape: AttentionShape) -> [i32; 4] {
    let AttentionShape { batch, seq, heads, kv_heads, .. } = shape;
    [int("batch", batch), int("seq", seq), int("heads", heads), int("kv heads", kv_heads)]
}
