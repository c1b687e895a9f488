//! The reference device: every op in plain serial f64 loops. It is the oracle the fast backends
//! are tested against, and the device the finite-difference gradient checks run on.

use super::kernels;
use super::{AdamWStep, AttentionShape, Device};

/// Serial, f64, obviously-correct. Never used for real training.
#[derive(Default)]
pub struct ReferenceDevice;

impl Device for ReferenceDevice {
    type Buf = Vec<f64>;

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
    fn download(&self, src: &Vec<f64>, dst: &mut [f32]) {
        assert_eq!(dst.len(), src.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }
    fn fill(&self, dst: &mut Vec<f64>, value: f32) {
        dst.fill(value as f64);
    }
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
    fn sum_squares(&self, buf: &Vec<f64>) -> f64 {
        buf.iter().map(|x| x * x).sum()
    }

    fn embedding_forward(
        &self,
        out: &mut Vec<f64>,
        tokens: &[u32],
        wte: &Vec<f64>,
        wpe: &Vec<f64>,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        kernels::embedding_forward_rows(out, tokens, wte, wpe, batch, seq, hidden, 0);
    }
    fn embedding_backward(
        &self,
        dwte: &mut Vec<f64>,
        dwpe: &mut Vec<f64>,
        dout: &Vec<f64>,
        tokens: &[u32],
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        // SAFETY: both pointers cover their whole arrays and nothing else runs.
        unsafe {
            kernels::embedding_backward_cols(
                dwte.as_mut_ptr(),
                dwpe.as_mut_ptr(),
                dout,
                tokens,
                batch,
                seq,
                hidden,
                0,
                hidden,
            )
        }
    }

    fn layernorm_forward(
        &self,
        out: &mut Vec<f64>,
        mean: &mut Vec<f64>,
        rstd: &mut Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        bias: &Vec<f64>,
        rows: usize,
        cols: usize,
    ) {
        let n = rows * cols;
        kernels::layernorm_forward_rows(
            &mut out[..n],
            &mut mean[..rows],
            &mut rstd[..rows],
            &inp[..n],
            weight,
            bias,
            cols,
        );
    }
    fn layernorm_backward(
        &self,
        dinp: &mut Vec<f64>,
        dweight: &mut Vec<f64>,
        dbias: &mut Vec<f64>,
        dout: &Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        mean: &Vec<f64>,
        rstd: &Vec<f64>,
        rows: usize,
        cols: usize,
    ) {
        let n = rows * cols;
        kernels::layernorm_backward_rows(
            &mut dinp[..n],
            dweight,
            dbias,
            &dout[..n],
            &inp[..n],
            weight,
            &mean[..rows],
            &rstd[..rows],
            cols,
        );
    }

    fn linear_forward(
        &self,
        out: &mut Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        bias: Option<&Vec<f64>>,
        rows: usize,
        k: usize,
        n: usize,
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
    fn linear_backward(
        &self,
        dinp: Option<&mut Vec<f64>>,
        dweight: &mut Vec<f64>,
        dbias: Option<&mut Vec<f64>>,
        dout: &Vec<f64>,
        inp: &Vec<f64>,
        weight: &Vec<f64>,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        if let Some(dinp) = dinp {
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

    fn gelu_forward(&self, out: &mut Vec<f64>, inp: &Vec<f64>) {
        kernels::gelu_forward_slice(out, inp);
    }
    fn gelu_backward(&self, dinp: &mut Vec<f64>, inp: &Vec<f64>, dout: &Vec<f64>) {
        kernels::gelu_backward_slice(dinp, inp, dout);
    }

    fn attention_forward(&self, out: &mut Vec<f64>, lse: &mut Vec<f64>, qkv: &Vec<f64>, shape: AttentionShape) {
        assert!(out.len() >= shape.rows() * shape.width() && lse.len() >= shape.rows() * shape.heads);
        for b in 0..shape.batch {
            for h in 0..shape.heads {
                // SAFETY: sizes checked above; serial, so no other writer exists.
                unsafe { kernels::attention_forward_head(out.as_mut_ptr(), lse.as_mut_ptr(), qkv, shape, b, h) }
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
    ) {
        assert!(dqkv.len() >= 3 * shape.rows() * shape.width());
        for b in 0..shape.batch {
            for h in 0..shape.heads {
                // SAFETY: size checked above; serial.
                unsafe { kernels::attention_backward_head(dqkv.as_mut_ptr(), dout, qkv, out, lse, shape, b, h) }
            }
        }
    }

    fn cross_entropy(
        &self,
        logits: &mut Vec<f64>,
        targets: &[u32],
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> f64 {
        let mut total = 0.0;
        for r in 0..rows {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            total += kernels::cross_entropy_row(row, targets[r] as usize, grad_scale.map(|s| s as f64));
        }
        total
    }

    fn adamw(&self, param: &mut Vec<f64>, grad: &Vec<f64>, m: &mut Vec<f64>, v: &mut Vec<f64>, step: AdamWStep) {
        kernels::adamw_slice(param, grad, m, v, &step);
    }
}
