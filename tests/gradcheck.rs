//! Finite-difference gradient checks: every layer's backward and the whole model's, on the f64
//! reference device, against central differences of the forward pass.

mod common;
use common::numeric::{check_gradient as check, EPS};
use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::device::{AttentionShape, Dropout};
use trident::device::{Gemm, LayerNormSaved, Logits, Matrix, Tokens};
use trident::model::gpt::{DropoutRates, DropoutStep};
use trident::model::{Gpt, GptConfig};
use trident::parallel::tensor::TensorParallel;
use trident::rng::Stream;

fn random(n: usize, name: &str, scale: f64) -> Vec<f64> {
    let s = Stream::new(99, name, 7);
    (0..n).map(|i| scale * s.normal(i as u64)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (rows, cols) = (3, 7);
    let mut x = random(rows * cols, "x", 1.0);
    let mut w = random(cols, "w", 1.0);
    let mut b = random(cols, "b", 1.0);
    let r = random(rows * cols, "r", 1.0);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        let (mut out, mut mean, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
        dev.layernorm_forward(
            &mut out,
            (&mut mean, &mut rstd),
            &x.to_vec(),
            (&w.to_vec(), &b.to_vec()),
            Matrix { rows, cols },
        );
        (out, mean, rstd)
    };
    let (_, mean, rstd) = fwd(&x, &w, &b);
    let (mut dx, mut dw, mut db) = (vec![0.0; rows * cols], vec![0.0; cols], vec![0.0; cols]);
    dev.layernorm_backward(
        &mut dx,
        (&mut dw, &mut db),
        &r,
        LayerNormSaved { inp: &x, weight: &w, mean: &mean, rstd: &rstd },
        Matrix { rows, cols },
    );
    let (x0, w0, b0) = (x.clone(), w.clone(), b.clone());
    check("layernorm dx", &mut x, &dx, &mut |x| dot(&fwd(x, &w0, &b0).0, &r));
    check("layernorm dw", &mut w, &dw, &mut |w| dot(&fwd(&x0, w, &b0).0, &r));
    check("layernorm db", &mut b, &db, &mut |b| dot(&fwd(&x0, &w0, b).0, &r));
}

#[test]
fn linear_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (rows, k, n) = (4, 5, 3);
    let mut x = random(rows * k, "x", 1.0);
    let mut w = random(n * k, "w", 1.0);
    let mut b = random(n, "b", 1.0);
    let r = random(rows * n, "r", 1.0);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        let mut out = vec![0.0; rows * n];
        dev.linear_forward(&mut out, &x.to_vec(), &w.to_vec(), Some(&b.to_vec()), Gemm { rows, k, n });
        dot(&out, &r)
    };
    let (mut dx, mut dw, mut db) = (vec![0.0; rows * k], vec![0.0; n * k], vec![0.0; n]);
    dev.linear_backward(Some(&mut dx), (&mut dw, Some(&mut db)), &r, &x, &w, Gemm { rows, k, n });
    let (x0, w0, b0) = (x.clone(), w.clone(), b.clone());
    check("linear dx", &mut x, &dx, &mut |x| fwd(x, &w0, &b0));
    check("linear dw", &mut w, &dw, &mut |w| fwd(&x0, w, &b0));
    check("linear db", &mut b, &db, &mut |b| fwd(&x0, &w0, b));
}

#[test]
fn gelu_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    for form in [trident::device::Gelu::Tanh, trident::device::Gelu::Erf] {
        let mut x = random(40, "x", 2.0);
        let r = random(40, "r", 1.0);
        let fwd = |x: &[f64]| {
            let mut out = vec![0.0; x.len()];
            dev.gelu_forward(&mut out, &x.to_vec(), form);
            dot(&out, &r)
        };
        let mut dx = vec![0.0; 40];
        dev.gelu_backward(&mut dx, &x, &r, form);
        check(&format!("gelu {form:?} dx"), &mut x, &dx, &mut |x| fwd(x));
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(2, 5, 2, 3);
    let (rows, width) = (shape.rows(), shape.width());
    let mut qkv = random(rows * 3 * width, "qkv", 1.0);
    let r = random(rows * width, "r", 1.0);
    let fwd = |qkv: &[f64]| {
        let (mut out, mut lse) = (vec![0.0; rows * width], vec![0.0; rows * shape.heads]);
        dev.attention_forward(&mut out, &mut lse, &qkv.to_vec(), shape, None, None);
        (out, lse)
    };
    let (out, lse) = fwd(&qkv);
    let mut dqkv = vec![0.0; qkv.len()];
    dev.attention_backward(&mut dqkv, &r, &qkv, &out, &lse, shape, None, None);
    check("attention dqkv", &mut qkv, &dqkv, &mut |q| dot(&fwd(q).0, &r));
}

#[test]
fn attention_backward_with_dropout_matches_finite_differences() {
    // Dropout 0.4 on the probabilities of 2 sequences (samples 3 and 4 of the global batch) and
    // heads 1 and 2 of 4: the masks are fixed, so the masked attention is a smooth function.
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(2, 6, 2, 3);
    let key = trident::rng::key(5, "dropout");
    let d = Dropout {
        p: 0.4,
        key,
        place: 9,
        iteration: 2,
        sample0: 3,
        batch: 2,
        seq: 6,
        t0: 0,
        width: 4,
        col0: 1,
        jump: None,
    };
    let (rows, width) = (shape.rows(), shape.width());
    let mut qkv = random(rows * 3 * width, "qkv", 1.0);
    let r = random(rows * width, "r", 1.0);
    let fwd = |qkv: &[f64], dropout: Option<&Dropout>| {
        let (mut out, mut lse) = (vec![0.0; rows * width], vec![0.0; rows * shape.heads]);
        dev.attention_forward(&mut out, &mut lse, &qkv.to_vec(), shape, dropout, None);
        (out, lse)
    };
    let (out, lse) = fwd(&qkv, Some(&d));
    assert_ne!(out, fwd(&qkv, None).0, "the masks act");
    let mut dqkv = vec![0.0; qkv.len()];
    dev.attention_backward(&mut dqkv, &r, &qkv, &out, &lse, shape, Some(&d), None);
    check("attention dqkv with dropout", &mut qkv, &dqkv, &mut |q| dot(&fwd(q, Some(&d)).0, &r));
}

#[test]
fn attention_within_documents_is_each_document_alone_and_its_gradient_checks() {
    // --reset-attention-mask: sample 0 holds documents [0, 3) and [3, 6), sample 1 [0, 2), [2, 5)
    // and [5, 6); 4 query heads in 2 groups.
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(2, 6, 4, 3).grouped(2);
    let starts: [u32; 12] = [0, 0, 0, 3, 3, 3, /**/ 0, 0, 2, 2, 2, 5];
    let (rows, width, qw) = (shape.rows(), shape.width(), shape.qkv_width());
    let mut qkv = random(rows * qw, "qkv", 1.0);
    let r = random(rows * width, "r", 1.0);
    let fwd = |qkv: &[f64], documents: Option<&[u32]>| {
        let (mut out, mut lse) = (vec![0.0; rows * width], vec![0.0; rows * shape.heads]);
        dev.attention_forward(&mut out, &mut lse, &qkv.to_vec(), shape, None, documents);
        (out, lse)
    };
    let (out, lse) = fwd(&qkv, Some(&starts));
    // Each document's outputs are those of the document run alone (rows t * batch + b).
    for (b, docs) in [(0, vec![0..3, 3..6]), (1, vec![0..2, 2..5, 5..6])] {
        for doc in docs {
            let alone = AttentionShape { batch: 1, seq: doc.len(), ..shape };
            let own: Vec<f64> = doc.clone().flat_map(|t| qkv[(t * 2 + b) * qw..(t * 2 + b + 1) * qw].to_vec()).collect();
            let (mut o, mut l) = (vec![0.0; doc.len() * width], vec![0.0; doc.len() * shape.heads]);
            dev.attention_forward(&mut o, &mut l, &own, alone, None, None);
            for (i, t) in doc.clone().enumerate() {
                let got = &out[(t * 2 + b) * width..(t * 2 + b + 1) * width];
                let want = &o[i * width..(i + 1) * width];
                assert!(got.iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-12), "sample {b}, position {t}");
            }
        }
    }
    assert_ne!(out, fwd(&qkv, None).0, "the documents act");
    let mut dqkv = vec![0.0; qkv.len()];
    dev.attention_backward(&mut dqkv, &r, &qkv, &out, &lse, shape, None, Some(&starts));
    check("attention dqkv within documents", &mut qkv, &dqkv, &mut |q| dot(&fwd(q, Some(&starts)).0, &r));
}

#[test]
fn attention_is_causal() {
    // Changing the last token's q, k and v must not change any earlier position's output.
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(1, 4, 2, 2);
    let mut qkv = random(shape.rows() * 3 * shape.width(), "qkv", 1.0);
    let run = |qkv: &Vec<f64>| {
        let (mut out, mut lse) = (vec![0.0; shape.rows() * shape.width()], vec![0.0; shape.rows() * shape.heads]);
        dev.attention_forward(&mut out, &mut lse, qkv, shape, None, None);
        out
    };
    let before = run(&qkv);
    let last_row = (shape.seq - 1) * 3 * shape.width();
    for v in &mut qkv[last_row..] {
        *v += 1.0;
    }
    let after = run(&qkv);
    let earlier = (shape.seq - 1) * shape.width();
    assert_eq!(before[..earlier], after[..earlier]);
    assert_ne!(before[earlier..], after[earlier..]);
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (rows, vocab) = (3, 6);
    let mut logits = random(rows * vocab, "logits", 2.0);
    let targets = [1u32, 5, 0];
    let stats = |l: &Vec<f64>| {
        let (mut max, mut sum_exp) = (vec![0.0; rows], vec![0.0; 2 * rows]);
        dev.cross_entropy_max(l, rows, vocab, &mut max);
        dev.cross_entropy_partials(l, &targets, Logits { rows, vocab, vocab_start: 0 }, &max, &mut sum_exp);
        let target = sum_exp.split_off(rows);
        (max, sum_exp, target)
    };
    let loss = |l: &[f64]| {
        let (max, sum_exp, target) = stats(&l.to_vec());
        (0..rows).map(|r| sum_exp[r].ln() + max[r] - target[r]).sum::<f64>()
    };
    let mut grad = logits.clone();
    let (max, sum_exp, _) = stats(&grad);
    dev.cross_entropy_backward(&mut grad, &targets, Logits { rows, vocab, vocab_start: 0 }, &max, &sum_exp, 1.0);
    check("cross entropy dlogits", &mut logits, &grad, &mut |l| loss(l));
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (batch, seq, hidden, vocab) = (2, 3, 4, 5);
    let tokens = [1u32, 4, 1, 0, 2, 4];
    let mut wte = random(vocab * hidden, "wte", 1.0);
    let mut wpe = random(seq * hidden, "wpe", 1.0);
    let r = random(batch * seq * hidden, "r", 1.0);
    let fwd = |wte: &[f64], wpe: &[f64]| {
        let mut out = vec![0.0; batch * seq * hidden];
        dev.embedding_forward(&mut out, &wte.to_vec(), Tokens { ids: &tokens, batch, seq, vocab_start: 0 }, hidden);
        dev.position_forward(&mut out, &wpe.to_vec(), batch, 0, seq, hidden);
        dot(&out, &r)
    };
    let (mut dte, mut dpe) = (vec![0.0; wte.len()], vec![0.0; wpe.len()]);
    dev.embedding_backward(&mut dte, &r, Tokens { ids: &tokens, batch, seq, vocab_start: 0 }, hidden);
    dev.position_backward(&mut dpe, &r, batch, 0, seq, hidden);
    let (te0, pe0) = (wte.clone(), wpe.clone());
    check("embedding dwte", &mut wte, &dte, &mut |w| fwd(w, &pe0));
    check("embedding dwpe", &mut wpe, &dpe, &mut |w| fwd(&te0, w));
}

pub fn tiny_config() -> GptConfig {
    GptConfig {
        num_layers: 2,
        hidden_size: 8,
        num_attention_heads: 2,
        ffn_hidden_size: 32,
        max_position_embeddings: 6,
        vocab_size: 11,
        padded_vocab_size: 16,
        init_method_std: 0.3,
        arch: trident::model::Arch::GPT2,
    }
}

#[test]
fn whole_model_backward_matches_finite_differences() {
    whole_model_gradient(None);
}

#[test]
fn whole_model_backward_with_dropout_matches_finite_differences() {
    // Every dropout at 0.2, the masks of iteration 3 (the gradient through fixed masks).
    whole_model_gradient(Some(DropoutRates { hidden: 0.2, attention: 0.2, seed: 9 }));
}

#[allow(clippy::needless_range_loop)] // indices name the parameter and element in failures
fn whole_model_gradient(dropout: Option<DropoutRates>) {
    let dev = ReferenceDevice;
    let cfg = tiny_config();
    let (batch, seq) = (2, 5);
    let tokens: Vec<u32> = (0..batch * seq).map(|i| (i * 7 % 11) as u32).collect();
    let labels: Vec<u32> = (0..batch * seq).map(|i| (i * 5 % 11) as u32).collect();
    let mut model: Gpt<ReferenceDevice> = Gpt::new(&dev, cfg, 42);
    // Random LayerNorm and bias values, so their gradients are not a special case.
    for i in 0..model.params.info.len() {
        if !model.params.info[i].decayed() {
            let n = model.params.values[i].len();
            let noise = random(n, &model.params.info[i].name, 0.3);
            for (v, e) in model.params.values[i].iter_mut().zip(noise) {
                *v += e;
            }
        }
    }
    if let Some(rates) = dropout {
        let plain = model.loss(&dev, TensorParallel::single(), &tokens, &labels, batch, seq);
        model.set_dropout(rates);
        model.set_dropout_step(Some(DropoutStep { iteration: 3, micro_stride: 2, first: 0 }));
        let dropped = model.loss(&dev, TensorParallel::single(), &tokens, &labels, batch, seq);
        assert!((plain - dropped).abs() > 1e-6, "the masks act: {plain} vs {dropped}");
    }
    let scale = 1.0 / (batch * seq) as f32;
    model.params.zero_grads(&dev);
    model.forward_backward(&dev, TensorParallel::single(), &tokens, &labels, batch, seq, scale, &mut |_, _| {});
    let grads = model.params.grads.clone();
    for p in 0..model.params.info.len() {
        let name = model.params.info[p].name.clone();
        let n = model.params.values[p].len();
        for i in 0..n {
            let orig = model.params.values[p][i];
            model.params.values[p][i] = orig + EPS;
            let up = model.loss(&dev, TensorParallel::single(), &tokens, &labels, batch, seq) * scale as f64;
            model.params.values[p][i] = orig - EPS;
            let down = model.loss(&dev, TensorParallel::single(), &tokens, &labels, batch, seq) * scale as f64;
            model.params.values[p][i] = orig;
            let numeric = (up - down) / (2.0 * EPS);
            let err = (grads[p][i] - numeric).abs();
            assert!(err <= 1e-7 + 1e-5 * numeric.abs(), "{name}[{i}]: analytic {} vs numeric {numeric}", grads[p][i]);
        }
    }
}

#[test]
fn attention_forward_matches_the_textbook_formula() {
    // softmax(q k^T / sqrt(d)) v with a causal mask, written out directly, against the kernel.
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(2, 37, 3, 5);
    let (rows, width, d) = (shape.rows(), shape.width(), shape.head_dim);
    let qkv = random(rows * 3 * width, "qkv", 1.5);
    let (mut out, mut lse) = (vec![0.0; rows * width], vec![0.0; rows * shape.heads]);
    dev.attention_forward(&mut out, &mut lse, &qkv, shape, None, None);
    let at = |t: usize, b: usize, h: usize, part: usize, j: usize| {
        qkv[(t * shape.batch + b) * 3 * width + h * 3 * d + part * d + j]
    };
    for b in 0..shape.batch {
        for h in 0..shape.heads {
            for t in 0..shape.seq {
                let scores: Vec<f64> = (0..=t)
                    .map(|u| (0..d).map(|j| at(t, b, h, 0, j) * at(u, b, h, 1, j)).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                assert!((lse[(b * shape.heads + h) * shape.seq + t] - (max + z.ln())).abs() < 1e-12);
                for j in 0..d {
                    let expect: f64 =
                        scores.iter().enumerate().map(|(u, s)| (s - max).exp() / z * at(u, b, h, 2, j)).sum();
                    let got = out[(t * shape.batch + b) * width + h * d + j];
                    assert!((got - expect).abs() < 1e-12, "b {b} h {h} t {t} j {j}: {got} vs {expect}");
                }
            }
        }
    }
}
