//! The reference device: every op in plain serial f64 loops. It is the oracle the fast backends
//! are tested against, and the device the finite-difference gradient checks run on.

use super::blocks;
use super::prelude::*;
use super::{dropout, kernels, llama, Dropout, Gelu};
use super::{AdamWStep, AdamWTensor, AttentionShape, Gemm, LayerNormSaved, Logits, Matrix, Rotary, Tokens};
use super::{BlockMask, QkvRun};
use crate::real::Precision;

/// Serial, f64, obviously-correct. Never used for real training.
#[derive(Default)]
pub struct ReferenceDevice;

impl Memory for ReferenceDevice {
    type Buf = Vec<f64>;

    type Half = Vec<u16>;

    type Scalars = Vec<f64>;

    fn describe(&self) -> String {
        "reference (serial f64)".to_string()
    }

    fn alloc(&self, len: usize) -> Vec<f64> {
        vec![0.0; len]
    }

    fn len(&self, buf: &Vec<f64>) -> usize {
        buf.len()
    }

    fn upload(&self, dst: &mut Vec<f64>, src: &[f32]) {
        assert_eq!(dst.len(), src.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f64;
        }
    }

    /// A copy in f64 (the default stages through f32 host memory, which would round the oracle).
    fn copy(&self, dst: &mut Vec<f64>, dst_at: usize, src: &Vec<f64>, src_at: usize, len: usize) {
        dst[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
    }

    fn download(&self, src: &Vec<f64>, dst: &mut [f32]) {
        assert_eq!(dst.len(), src.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }

    fn fill(&self, dst: &mut Vec<f64>, value: f32) {
        dst.fill(value as f64);
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

    fn round_to(&self, buf: &mut Vec<f64>, precision: crate::real::Precision) {
        // f32 "storage" on the f64 oracle keeps its full precision.
        if precision == crate::real::Precision::F32 {
            return;
        }
        for x in buf.iter_mut() {
            *x = precision.round(*x as f32) as f64;
        }
    }

    fn to_half(&self, buf: &Vec<f64>, precision: Precision) -> Vec<u16> {
        buf.iter().map(|&x| precision.to_bits16(x as f32)).collect()
    }

    fn load_half(&self, src: &Vec<u16>, precision: Precision, dst: &mut Vec<f64>) {
        assert_eq!(dst.len(), src.len(), "load_half: buffer and copy lengths differ");
        for (d, &b) in dst.iter_mut().zip(src) {
            *d = precision.from_bits16(b) as f64;
        }
    }

    fn to_half_into(&self, buf: &Vec<f64>, precision: crate::real::Precision, half: &mut Vec<u16>) {
        assert_eq!(buf.len(), half.len(), "to_half_into: buffer and copy lengths differ");
        *half = self.to_half(buf, precision);
    }

    fn half_len(&self, half: &Vec<u16>) -> usize {
        half.len()
    }
}

impl ElementwiseOps for ReferenceDevice {
    fn add_assign(&self, acc: &mut Vec<f64>, x: &Vec<f64>) {
        for (a, &b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }

    fn add(&self, out: &mut Vec<f64>, a: &Vec<f64>, b: &Vec<f64>) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    }

    fn gelu_forward(&self, out: &mut Vec<f64>, inp: &Vec<f64>, form: Gelu) {
        kernels::gelu_forward_slice(out, inp, form);
    }

    fn gelu_backward(&self, dinp: &mut Vec<f64>, inp: &Vec<f64>, dout: &Vec<f64>, form: Gelu) {
        kernels::gelu_backward_slice(dinp, inp, dout, form);
    }

    fn swiglu_forward(&self, out: &mut Vec<f64>, inp: &Vec<f64>, rows: usize, f: usize) {
        llama::swiglu_forward_rows(&mut out[..rows * f], &inp[..rows * 2 * f], f);
    }

    fn swiglu_backward(&self, dinp: &mut Vec<f64>, inp: &Vec<f64>, dout: &Vec<f64>, rows: usize, f: usize) {
        llama::swiglu_backward_rows(&mut dinp[..rows * 2 * f], &inp[..rows * 2 * f], &dout[..rows * f], f);
    }

    fn add_bias(&self, out: &mut Vec<f64>, bias: &Vec<f64>, Matrix { rows, cols }: Matrix) {
        kernels::add_bias_rows(&mut out[..rows * cols], bias);
    }

    fn bias_dropout_add(
        &self,
        out: &mut Vec<f64>,
        (resid, x): (&Vec<f64>, &Vec<f64>),
        bias: Option<&Vec<f64>>,
        d: &Dropout,
        Matrix { rows, cols }: Matrix,
    ) {
        let n = rows * cols;
        dropout::bias_dropout_add_rows(&mut out[..n], (&resid[..n], &x[..n]), bias.map(|b| &b[..cols]), d, 0, cols);
    }

    fn dropout(&self, x: &mut Vec<f64>, d: &Dropout, Matrix { rows, cols }: Matrix) {
        dropout::dropout_rows(&mut x[..rows * cols], d, 0, cols);
    }
}

impl NormOps for ReferenceDevice {
    fn layernorm_forward(
        &self,
        out: &mut Vec<f64>,
        (mean, rstd): (&mut Vec<f64>, &mut Vec<f64>),
        inp: &Vec<f64>,
        (weight, bias): (&Vec<f64>, &Vec<f64>),
        Matrix { rows, cols }: Matrix,
    ) {
        let n = rows * cols;
        kernels::layernorm_forward_rows(
            &mut out[..n],
            (&mut mean[..rows], &mut rstd[..rows]),
            &inp[..n],
            (weight, bias),
            cols,
        );
    }

    fn layernorm_backward(
        &self,
        dinp: &mut Vec<f64>,
        (dweight, dbias): (&mut Vec<f64>, &mut Vec<f64>),
        dout: &Vec<f64>,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, Vec<f64>>,
        Matrix { rows, cols }: Matrix,
    ) {
        let n = rows * cols;
        kernels::layernorm_backward_rows(
            &mut dinp[..n],
            (dweight, dbias),
            &dout[..n],
            LayerNormSaved { inp: &inp[..n], weight, mean: &mean[..rows], rstd: &rstd[..rows] },
            cols,
        );
    }

    fn layernorm_sums(&self, inp: &Vec<f64>, shape: Matrix, mean: Option<&[f64]>, out: &mut [f64]) {
        kernels::layernorm_sums_rows(inp, shape, mean, out);
    }

    fn layernorm_apply(
        &self,
        out: &mut Vec<f64>,
        (mean_out, rstd_out): (&mut Vec<f64>, &mut Vec<f64>),
        inp: &Vec<f64>,
        (weight, bias): (&Vec<f64>, &Vec<f64>),
        row_stats: (&[f64], &[f64]),
        shape: Matrix,
    ) {
        kernels::layernorm_apply_rows(out, (mean_out, rstd_out), inp, (weight, bias), row_stats, shape);
    }

    fn layernorm_backward_sums(
        &self,
        dout: &Vec<f64>,
        saved: LayerNormSaved<'_, Vec<f64>>,
        shape: Matrix,
        out: &mut [f64],
    ) {
        kernels::layernorm_backward_sums_rows(dout, saved.map(|b| &b[..]), shape, out);
    }

    fn layernorm_backward_apply(
        &self,
        dinp: &mut Vec<f64>,
        (dweight, dbias): (&mut Vec<f64>, &mut Vec<f64>),
        dout: &Vec<f64>,
        saved: LayerNormSaved<'_, Vec<f64>>,
        row_sums: (&[f64], usize),
        shape: Matrix,
    ) {
        kernels::layernorm_backward_apply_rows(dinp, (dweight, dbias), dout, saved.map(|b| &b[..]), row_sums, shape);
    }

    fn rmsnorm_forward(
        &self,
        out: &mut Vec<f64>,
        rstd: &mut Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        Matrix { rows, cols }: Matrix,
        eps: f64,
    ) {
        let n = rows * cols;
        llama::rmsnorm_forward_rows(&mut out[..n], &mut rstd[..rows], &inp[..n], weight, cols, eps);
    }

    fn rmsnorm_backward(
        &self,
        dinp: &mut Vec<f64>,
        dweight: &mut Vec<f64>,
        dout: &Vec<f64>,
        (inp, weight): (&Vec<f64>, &Vec<f64>),
        rstd: &Vec<f64>,
        Matrix { rows, cols }: Matrix,
    ) {
        let n = rows * cols;
        llama::rmsnorm_backward_rows(&mut dinp[..n], dweight, &dout[..n], (&inp[..n], weight), &rstd[..rows], cols);
    }
}

impl LinearOps for ReferenceDevice {
    fn linear_forward(
        &self,
        out: &mut Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        bias: Option<&Vec<f64>>,
        Gemm { rows, k, n }: Gemm,
    ) {
        for r in 0..rows {
            for j in 0..n {
                let mut acc = bias.map_or(0.0, |b| b[j]);
                for p in 0..k {
                    acc += inp[r * k + p] * weight[j * k + p];
                }
                out[r * n + j] = acc;
            }
        }
    }

    fn linear_backward_input(
        &self,
        dinp: &mut Vec<f64>,
        dout: &Vec<f64>,
        weight: &Vec<f64>,
        Gemm { rows, k, n }: Gemm,
    ) {
        for r in 0..rows {
            for p in 0..k {
                let mut acc = 0.0;
                for j in 0..n {
                    acc += dout[r * n + j] * weight[j * k + p];
                }
                dinp[r * k + p] = acc;
            }
        }
    }

    fn linear_backward(
        &self,
        dinp: Option<&mut Vec<f64>>,
        (dweight, dbias): (&mut Vec<f64>, Option<&mut Vec<f64>>),
        dout: &Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        Gemm { rows, k, n }: Gemm,
    ) {
        if let Some(dinp) = dinp {
            self.linear_backward_input(dinp, dout, weight, Gemm { rows, k, n });
        }
        for j in 0..n {
            for p in 0..k {
                let mut acc = 0.0;
                for r in 0..rows {
                    acc += dout[r * n + j] * inp[r * k + p];
                }
                dweight[j * k + p] += acc;
            }
        }
        if let Some(dbias) = dbias {
            for j in 0..n {
                dbias[j] += (0..rows).map(|r| dout[r * n + j]).sum::<f64>();
            }
        }
    }
}

impl AttentionOps for ReferenceDevice {
    fn rope_forward(&self, qkv: &mut Vec<f64>, table: &Vec<f64>, shape: AttentionShape, rotary: Rotary) {
        llama::rope_rows(&mut qkv[..shape.rows() * shape.qkv_width()], 0, table, &shape, rotary, false);
    }

    fn rope_backward(&self, dqkv: &mut Vec<f64>, table: &Vec<f64>, shape: AttentionShape, rotary: Rotary) {
        llama::rope_rows(&mut dqkv[..shape.rows() * shape.qkv_width()], 0, table, &shape, rotary, true);
    }

    fn attention_forward(
        &self,
        out: &mut Vec<f64>,
        lse: &mut Vec<f64>,
        qkv: &Vec<f64>,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        assert!(out.len() >= shape.rows() * shape.width() && lse.len() >= shape.rows() * shape.heads);
        for b in 0..shape.batch {
            for h in 0..shape.heads {
                let masks = (dropout, documents);
                // SAFETY: sizes checked above; serial, so no other writer exists.
                unsafe {
                    kernels::attention_forward_head(out.as_mut_ptr(), lse.as_mut_ptr(), qkv, shape, (b, h), masks)
                }
            }
        }
    }

    fn attention_backward(
        &self,
        dqkv: &mut Vec<f64>,
        dout: &Vec<f64>,
        qkv: &Vec<f64>,
        out: &Vec<f64>,
        lse: &Vec<f64>,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    ) {
        assert!(dqkv.len() >= shape.rows() * shape.qkv_width());
        for b in 0..shape.batch {
            for h in 0..shape.heads {
                let masks = (dropout, documents);
                // SAFETY: size checked above; serial.
                unsafe {
                    kernels::attention_backward_head(dqkv.as_mut_ptr(), dout, qkv, (out, lse), shape, (b, h), masks)
                }
            }
        }
    }

    fn attention_block_forward(
        &self,
        (out, lse): (&mut Vec<f64>, &mut Vec<f64>),
        (q_src, q): (&Vec<f64>, QkvRun),
        (kv_src, kv): (&Vec<f64>, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        blocks::block_forward((out, lse), (q_src, q), (kv_src, kv), shape, mask);
    }

    fn attention_merge(
        &self,
        acc: (&mut Vec<f64>, &mut Vec<f64>),
        (o, l): (&Vec<f64>, &Vec<f64>),
        shape: AttentionShape,
        positions: usize,
    ) {
        blocks::merge((&mut acc.0[..], &mut acc.1[..]), (o, l), shape, positions);
    }

    fn attention_block_backward(
        &self,
        grad: &mut Vec<f64>,
        runs: (QkvRun, QkvRun),
        ((dout, out), at): ((&Vec<f64>, &Vec<f64>), usize),
        (lse, lse_at): (&Vec<f64>, usize),
        (q_src, q): (&Vec<f64>, QkvRun),
        (kv_src, kv): (&Vec<f64>, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    ) {
        let saved = ((&dout[..], &out[..]), at);
        blocks::block_backward(grad, runs, saved, (lse, lse_at), (q_src, q), (kv_src, kv), shape, mask);
    }

    fn attention_decode(&self, out: &mut Vec<f64>, qkv: &Vec<f64>, shape: AttentionShape, t0: usize) {
        assert!(shape.batch == 1 && out.len() >= (shape.seq - t0) * shape.width());
        for head in 0..shape.heads {
            kernels::attention_decode_head(out, qkv, shape, head, t0);
        }
    }
}

impl EmbeddingOps for ReferenceDevice {
    fn embedding_forward(&self, out: &mut Vec<f64>, wte: &Vec<f64>, tokens: Tokens<'_>, hidden: usize) {
        kernels::embedding_forward_rows(&mut out[..tokens.batch * tokens.seq * hidden], wte, tokens, hidden, 0);
    }

    fn embedding_backward(&self, dwte: &mut Vec<f64>, dout: &Vec<f64>, tokens: Tokens<'_>, hidden: usize) {
        let rows = dwte.len() / hidden;
        // SAFETY: the pointer covers the whole gradient and nothing else runs.
        unsafe { kernels::embedding_backward_cols((dwte.as_mut_ptr(), rows), dout, tokens, hidden, 0..hidden) }
    }

    fn position_forward(
        &self,
        out: &mut Vec<f64>,
        wpe: &Vec<f64>,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        kernels::position_forward_rows(&mut out[..positions * batch * hidden], wpe, batch, hidden, t0);
    }

    fn position_backward(
        &self,
        dwpe: &mut Vec<f64>,
        dout: &Vec<f64>,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        // SAFETY: the pointer covers the whole gradient and nothing else runs.
        unsafe {
            kernels::position_backward_cols(dwpe.as_mut_ptr(), dout, batch, t0..t0 + positions, hidden, 0..hidden)
        }
    }
}

impl LossOps for ReferenceDevice {
    fn cross_entropy_max(&self, logits: &Vec<f64>, rows: usize, vocab: usize, max: &mut Vec<f64>) {
        for (r, m) in max.iter_mut().enumerate().take(rows) {
            *m = kernels::row_max(&logits[r * vocab..(r + 1) * vocab]);
        }
    }

    fn cross_entropy_partials(
        &self,
        logits: &Vec<f64>,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &Vec<f64>,
        stats: &mut Vec<f64>,
    ) {
        let (sum_exp, target_logit) = stats[..2 * rows].split_at_mut(rows);
        for r in 0..rows {
            let target = kernels::local_row(targets[r], vocab_start, vocab);
            let (s, t) = kernels::cross_entropy_partials_row(&logits[r * vocab..(r + 1) * vocab], target, max[r]);
            sum_exp[r] = s;
            target_logit[r] = t;
        }
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
        logits: &mut Vec<f64>,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &Vec<f64>,
        stats: &Vec<f64>,
        grad_scale: f32,
    ) {
        let sum_exp = &stats[..rows];
        for r in 0..rows {
            let target = kernels::local_row(targets[r], vocab_start, vocab);
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            let scale = kernels::row_grad_scale(targets[r], grad_scale) as f64;
            kernels::cross_entropy_backward_row(row, target, max[r], sum_exp[r], scale);
        }
    }
}

impl OptimizerOps for ReferenceDevice {
    fn sum_squares_into(&self, bufs: &[&Vec<f64>], acc: &mut Vec<f64>, slot: usize) {
        for buf in bufs {
            acc[slot] += buf.iter().map(|x| x * x).sum::<f64>();
        }
    }

    fn clip_scale(&self, sum: &Vec<f64>, sum_slot: usize, out: &mut Vec<f64>, slot: usize, clip: f64, loss_scale: f64) {
        let (norm, coef) = kernels::clip_scale(sum[sum_slot], clip, loss_scale);
        out[slot..slot + 2].copy_from_slice(&[norm, coef as f64]);
    }

    fn adamw(
        &self,
        AdamWTensor { param, grad, m, v, decayed, working }: AdamWTensor<'_, Vec<f64>>,
        step: AdamWStep,
        (scales, slot): (&Vec<f64>, usize),
    ) {
        let step = step.for_tensor(decayed);
        kernels::adamw_slice(param, grad, m, v, &step, scales[slot] as f32);
        if let Some((w, precision)) = working {
            w.copy_from_slice(param);
            self.round_to(w, precision);
        }
    }
}

impl CollectiveOps for ReferenceDevice {}
