//! The Llama-family ops and model (issue 20) on the host devices: finite-difference gradient
//! checks of RMSNorm, SwiGLU, rotary embedding, grouped-query attention and a whole tiny Llama on
//! the f64 reference device; grouped-query attention against its textbook formula; the CPU
//! backend against the reference on ragged shapes (groups > 1 and = 1, rotary on part of the
//! head), its whole-model gradients, and its independence of the thread count.

mod common;
use common::numeric::{assert_close, check_gradient as check, EPS};
use trident::device::cpu::CpuDevice;
use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::device::Matrix;
use trident::device::{AttentionShape, Device, Rotary};
use trident::model::{Arch, Gpt, GptConfig};
use trident::parallel::tensor::TensorParallel;
use trident::rng::Stream;

fn random(n: usize, name: &str, scale: f64) -> Vec<f64> {
    let s = Stream::new(77, name, 5);
    (0..n).map(|i| scale * s.normal(i as u64)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (rows, cols, eps) = (3, 7, 1e-5);
    let (mut x, mut w, r) = (random(rows * cols, "x", 1.0), random(cols, "w", 1.0), random(rows * cols, "r", 1.0));
    let fwd = |x: &[f64], w: &[f64]| {
        let (mut out, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
        dev.rmsnorm_forward(&mut out, &mut rstd, &x.to_vec(), &w.to_vec(), Matrix { rows, cols }, eps);
        (out, rstd)
    };
    let (out, rstd) = fwd(&x, &w);
    // The definition, written out: x / sqrt(mean(x²) + eps) · w.
    for row in 0..rows {
        let xs = &x[row * cols..(row + 1) * cols];
        let rms = (xs.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
        for c in 0..cols {
            assert!((out[row * cols + c] - xs[c] / rms * w[c]).abs() < 1e-12);
        }
    }
    let (mut dx, mut dw) = (vec![0.5; rows * cols], vec![0.25; cols]);
    dev.rmsnorm_backward(&mut dx, &mut dw, &r, (&x, &w), &rstd, Matrix { rows, cols });
    // "+=": the gradients arrive on top of what the buffers held.
    dx.iter_mut().for_each(|v| *v -= 0.5);
    dw.iter_mut().for_each(|v| *v -= 0.25);
    let (x0, w0) = (x.clone(), w.clone());
    check("rmsnorm dx", &mut x, &dx, &mut |x| dot(&fwd(x, &w0).0, &r));
    check("rmsnorm dw", &mut w, &dw, &mut |w| dot(&fwd(&x0, w).0, &r));
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    let dev = ReferenceDevice;
    let (rows, f) = (3, 5);
    let (mut x, r) = (random(rows * 2 * f, "x", 2.0), random(rows * f, "r", 1.0));
    let fwd = |x: &[f64]| {
        let mut out = vec![0.0; rows * f];
        dev.swiglu_forward(&mut out, &x.to_vec(), rows, f);
        out
    };
    let out = fwd(&x);
    let silu = |a: f64| a / (1.0 + (-a).exp());
    assert!((out[f + 2] - silu(x[2 * f + 2]) * x[2 * f + f + 2]).abs() < 1e-15, "gate first, then up");
    let mut dx = vec![0.0; rows * 2 * f];
    dev.swiglu_backward(&mut dx, &x, &r, rows, f);
    check("swiglu dx", &mut x, &dx, &mut |x| dot(&fwd(x), &r));
}

/// A table of angles as the model makes it, for `positions` positions.
fn table(arch: &Arch, head_dim: usize, positions: usize) -> Vec<f64> {
    arch.rotary_table(head_dim, positions).into_iter().map(f64::from).collect()
}

#[test]
fn rope_rotates_query_and_key_heads_only_and_its_backward_is_the_transpose() {
    let dev = ReferenceDevice;
    let arch = Arch { rotary_percent: 0.5, ..Arch::LLAMA };
    // Two groups of three query heads, head dimension 8 of which 4 rotate; positions from t0 = 2.
    let shape = AttentionShape::new(2, 3, 6, 8).grouped(2);
    let rotary = Rotary { rotary_dim: 4, t0: 2 };
    let tab = table(&arch, 8, 5);
    let w = shape.qkv_width();
    let (mut x, r) = (random(shape.rows() * w, "qkv", 1.0), random(shape.rows() * w, "r", 1.0));
    let fwd = |x: &[f64]| {
        let mut y = x.to_vec();
        dev.rope_forward(&mut y, &tab, shape, rotary);
        y
    };
    let y = fwd(&x);
    for row in 0..shape.rows() {
        let pos = 2 + row / shape.batch;
        for g in 0..2 {
            let base = row * w + g * 5 * 8;
            // Value head (the group's last) and the unrotated half of every head: untouched.
            assert_eq!(y[base + 4 * 8..base + 5 * 8], x[base + 4 * 8..base + 5 * 8]);
            for head in 0..4 {
                let v = base + head * 8;
                assert_eq!(y[v + 4..v + 8], x[v + 4..v + 8]);
                // Pair (0, 2): the first frequency, 1, at this position.
                let (c, s) = ((pos as f64).cos() as f32 as f64, (pos as f64).sin() as f32 as f64);
                assert!((y[v] - (x[v] * c - x[v + 2] * s)).abs() < 1e-12);
                assert!((y[v + 2] - (x[v + 2] * c + x[v] * s)).abs() < 1e-12);
            }
        }
    }
    let mut dx = r.clone();
    dev.rope_backward(&mut dx, &tab, shape, rotary);
    check("rope dx", &mut x, &dx, &mut |x| dot(&fwd(x), &r));
}

#[test]
fn grouped_query_attention_matches_the_textbook_formula_and_finite_differences() {
    let dev = ReferenceDevice;
    let shape = AttentionShape::new(2, 9, 6, 3).grouped(2);
    let (rows, width, w, d) = (shape.rows(), shape.width(), shape.qkv_width(), shape.head_dim);
    let mut qkv = random(rows * w, "qkv", 1.5);
    let r = random(rows * width, "r", 1.0);
    let fwd = |qkv: &[f64]| {
        let (mut out, mut lse) = (vec![0.0; rows * width], vec![0.0; rows * shape.heads]);
        dev.attention_forward(&mut out, &mut lse, &qkv.to_vec(), shape, None, None);
        (out, lse)
    };
    let (out, lse) = fwd(&qkv);
    // Query head h reads the k and v of group h / 3: [q q q k v] per group.
    let at = |q: &[f64], t: usize, b: usize, h: usize, part: usize, j: usize| {
        let (g, i) = (h / 3, h % 3);
        let col = g * 5 * d + if part == 0 { i * d } else { (2 + part) * d };
        q[(t * shape.batch + b) * w + col + j]
    };
    for b in 0..shape.batch {
        for h in 0..shape.heads {
            for t in 0..shape.seq {
                let scores: Vec<f64> = (0..=t)
                    .map(|u| (0..d).map(|j| at(&qkv, t, b, h, 0, j) * at(&qkv, u, b, h, 1, j)).sum::<f64>())
                    .map(|s| s / (d as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for j in 0..d {
                    let expect: f64 =
                        scores.iter().enumerate().map(|(u, s)| (s - max).exp() / z * at(&qkv, u, b, h, 2, j)).sum();
                    assert!((out[(t * shape.batch + b) * width + h * d + j] - expect).abs() < 1e-12);
                }
            }
        }
    }
    let mut dqkv = vec![f64::NAN; qkv.len()];
    dev.attention_backward(&mut dqkv, &r, &qkv, &out, &lse, shape, None, None);
    check("gqa dqkv", &mut qkv, &dqkv, &mut |q| dot(&fwd(q).0, &r));
}

/// A two-layer Llama: RMSNorm, SwiGLU, rotary on half of each head, 4 heads in 2 groups,
/// untied output layer, no linear biases.
fn llama_config(arch: Arch) -> GptConfig {
    GptConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 4,
        ffn_hidden_size: 12,
        max_position_embeddings: 8,
        vocab_size: 11,
        padded_vocab_size: 16,
        init_method_std: 0.3,
        arch,
    }
}

fn tiny_llama() -> Arch {
    Arch { num_query_groups: Some(2), rotary_percent: 0.5, ..Arch::LLAMA }
}

fn batch(b: usize, s: usize) -> (Vec<u32>, Vec<u32>) {
    let tokens = (0..b * s).map(|i| (i * 7 % 11) as u32).collect();
    let labels = (0..b * s).map(|i| (i * 5 % 11) as u32).collect();
    (tokens, labels)
}

#[test]
#[allow(clippy::needless_range_loop)] // indices name the parameter and element in failures
fn whole_llama_backward_matches_finite_differences() {
    // The Llama recipe, and one with every bias and a LayerNorm but the rest Llama's (MQA, kv
    // channels of their own).
    let variants = [
        tiny_llama(),
        Arch {
            normalization: trident::model::Normalization::LayerNorm,
            add_bias_linear: true,
            num_query_groups: Some(1),
            kv_channels: Some(6),
            ..Arch::LLAMA
        },
    ];
    for arch in variants {
        let dev = ReferenceDevice;
        let cfg = llama_config(arch);
        let (b, s) = (2, 5);
        let (tokens, labels) = batch(b, s);
        let mut model: Gpt<ReferenceDevice> = Gpt::new(&dev, cfg, 42);
        for i in 0..model.params.info.len() {
            if !model.params.info[i].decayed() {
                let noise = random(model.params.values[i].len(), &model.params.info[i].name, 0.3);
                model.params.values[i].iter_mut().zip(noise).for_each(|(v, e)| *v += e);
            }
        }
        let scale = 1.0 / (b * s) as f32;
        model.params.zero_grads(&dev);
        model.forward_backward(&dev, TensorParallel::single(), &tokens, &labels, b, s, scale, &mut |_, _| {});
        let grads = model.params.grads.clone();
        let tp = TensorParallel::single();
        for p in 0..model.params.info.len() {
            let name = model.params.info[p].name.clone();
            for i in 0..model.params.values[p].len() {
                let orig = model.params.values[p][i];
                model.params.values[p][i] = orig + EPS;
                let up = model.loss(&dev, tp, &tokens, &labels, b, s) * scale as f64;
                model.params.values[p][i] = orig - EPS;
                let down = model.loss(&dev, tp, &tokens, &labels, b, s) * scale as f64;
                model.params.values[p][i] = orig;
                let numeric = (up - down) / (2.0 * EPS);
                let err = (grads[p][i] - numeric).abs();
                assert!(err <= 1e-7 + 1e-5 * numeric.abs(), "{name}[{i}]: analytic {} vs {numeric}", grads[p][i]);
            }
        }
    }
}

#[test]
fn a_llamas_parameters_are_megatrons() {
    let cfg = llama_config(tiny_llama());
    let names: Vec<String> =
        cfg.parameters(&trident::model::ModelParallel::single()).into_iter().map(|p| p.name).collect();
    let layer0: Vec<&str> = names.iter().filter_map(|n| n.strip_prefix("decoder.layers.0.")).collect();
    assert_eq!(
        layer0,
        [
            "input_layernorm.weight",
            "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight",
            "pre_mlp_layernorm.weight",
            "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight"
        ]
    );
    assert_eq!(names[0], "embedding.word_embeddings.weight");
    assert_eq!(&names[names.len() - 2..], ["decoder.final_layernorm.weight", "output_layer.weight"]);
    let shapes: Vec<Vec<usize>> =
        cfg.parameters(&trident::model::ModelParallel::single()).into_iter().map(|p| p.shape).collect();
    // QKV: 4 query heads and 2 key + 2 value heads of 4; fc1: gate and up, 12 each.
    assert_eq!(shapes[2], [32, 16]);
    assert_eq!(shapes[5], [24, 16]);
}

fn up<D: Device>(dev: &D, host: &[f64]) -> D::Buf {
    let mut b = dev.alloc(host.len());
    dev.upload(&mut b, &host.iter().map(|&v| v as f32).collect::<Vec<_>>());
    b
}

fn down<D: Device>(dev: &D, buf: &D::Buf) -> Vec<f32> {
    let mut h = vec![0.0; dev.len(buf)];
    dev.download(buf, &mut h);
    h
}

/// Every new op forward and backward on `dev`, outputs to the host: RMSNorm on rows of `cols`,
/// SwiGLU of width `f`, rotary embedding and (grouped-query) attention of `shape`.
fn ops_on<D: Device>(
    dev: &D,
    (rows, cols, f): (usize, usize, usize),
    shape: AttentionShape,
    rd: usize,
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let (x, w, dy) = (
        up(dev, &random(rows * cols, "x", 1.0)),
        up(dev, &random(cols, "w", 1.0)),
        up(dev, &random(rows * cols, "dy", 1.0)),
    );
    let (mut y, mut rstd, mut dx, mut dw) =
        (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows * cols), dev.alloc(cols));
    dev.rmsnorm_forward(&mut y, &mut rstd, &x, &w, Matrix { rows, cols }, 1e-6);
    dev.rmsnorm_backward(&mut dx, &mut dw, &dy, (&x, &w), &rstd, Matrix { rows, cols });
    out.extend([&y, &rstd, &dx, &dw].map(|b| down(dev, b)));
    let (g, dg) = (up(dev, &random(rows * 2 * f, "g", 2.0)), up(dev, &random(rows * f, "dg", 1.0)));
    let (mut s, mut ds) = (dev.alloc(rows * f), dev.alloc(rows * 2 * f));
    dev.swiglu_forward(&mut s, &g, rows, f);
    dev.swiglu_backward(&mut ds, &g, &dg, rows, f);
    out.extend([&s, &ds].map(|b| down(dev, b)));
    let arch = Arch { rotary_percent: rd as f64 / shape.head_dim as f64, ..Arch::LLAMA };
    let tab = up(dev, &table(&arch, shape.head_dim, shape.seq + 3));
    let rotary = Rotary { rotary_dim: rd, t0: 3 };
    let mut qkv = up(dev, &random(shape.rows() * shape.qkv_width(), "qkv", 1.0));
    dev.rope_forward(&mut qkv, &tab, shape, rotary);
    let (mut o, mut lse) = (dev.alloc(shape.rows() * shape.width()), dev.alloc(shape.rows() * shape.heads));
    dev.attention_forward(&mut o, &mut lse, &qkv, shape, None, None);
    let dout = up(dev, &random(shape.rows() * shape.width(), "dout", 1.0));
    let mut dqkv = dev.alloc(shape.rows() * shape.qkv_width());
    dev.attention_backward(&mut dqkv, &dout, &qkv, &o, &lse, shape, None, None);
    dev.rope_backward(&mut dqkv, &tab, shape, rotary);
    out.extend([&qkv, &o, &lse, &dqkv].map(|b| down(dev, b)));
    out
}

#[test]
fn cpu_llama_ops_match_the_reference_on_ragged_shapes() {
    let cpu = CpuDevice::new(2);
    let cases = [
        ((37, 77, 45), AttentionShape::new(3, 17, 6, 8).grouped(2), 4),
        ((16, 64, 352), AttentionShape::new(2, 150, 4, 32).grouped(1), 32),
        ((5, 33, 7), AttentionShape::new(2, 19, 3, 6), 2),
    ];
    for (dims, shape, rd) in cases {
        let (fast, oracle) = (ops_on(&cpu, dims, shape, rd), ops_on(&ReferenceDevice, dims, shape, rd));
        for (i, (f, o)) in fast.iter().zip(&oracle).enumerate() {
            assert_close(&format!("{dims:?} {shape:?} rotary {rd}: output {i}"), f, o, 2e-6);
        }
    }
}

/// Loss and gradients of one micro-batch through a whole model.
fn model_grads<D: Device>(dev: &D, cfg: &GptConfig, b: usize, s: usize) -> (f64, Vec<Vec<f32>>) {
    let (tokens, labels) = batch(b, s);
    let mut model: Gpt<D> = Gpt::new(dev, cfg.clone(), 7);
    model.params.zero_grads(dev);
    let scale = 1.0 / (b * s) as f32;
    let loss = model.forward_backward(dev, TensorParallel::single(), &tokens, &labels, b, s, scale, &mut |_, _| {});
    (loss, model.params.grads.iter().map(|g| down(dev, g)).collect())
}

#[test]
fn cpu_llama_matches_the_reference_and_not_the_thread_count() {
    let cfg = GptConfig { max_position_embeddings: 40, ..llama_config(tiny_llama()) };
    let (loss, grads) = model_grads(&CpuDevice::new(2), &cfg, 3, 37);
    let (want, oracle) = model_grads(&ReferenceDevice, &cfg, 3, 37);
    assert!((loss - want).abs() <= 1e-5 * want.abs(), "loss {loss} vs {want}");
    for (i, (g, o)) in grads.iter().zip(&oracle).enumerate() {
        assert_close(&format!("gradient {i}"), g, o, 1e-4);
    }
    let (loss1, grads1) = model_grads(&CpuDevice::new(1), &cfg, 3, 37);
    assert_eq!(loss1.to_bits(), loss.to_bits());
    for (a, b) in grads1.iter().zip(&grads) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "thread count changed a gradient");
    }
}

/// The logits of every position of `tokens` from the whole forward, and from the key/value cache
/// fed the prompt and then one token at a time.
fn decode_against_forward<D: Device>(dev: &D, cfg: &GptConfig, tokens: &[u32], prompt: usize) -> f64 {
    let mut model: Gpt<D> = Gpt::new(dev, cfg.clone(), 3);
    let vocab = cfg.padded_vocab_size;
    let whole = {
        let logits = model.forward(dev, TensorParallel::single(), tokens, 1, tokens.len());
        down(dev, logits)
    };
    let mut cache = model.kv_cache(dev);
    let mut worst = 0f64;
    let mut compare = |at: usize, got: Vec<f32>| {
        let want = &whole[at * vocab..(at + 1) * vocab];
        let norm = want.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        let err = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
        worst = worst.max(err / norm);
    };
    compare(prompt - 1, model.decode(dev, &mut cache, &tokens[..prompt]));
    for t in prompt..tokens.len() {
        compare(t, model.decode(dev, &mut cache, &tokens[t..t + 1]));
    }
    assert_eq!(cache.len(), tokens.len());
    worst
}

#[test]
fn decoding_with_the_cache_gives_the_whole_forwards_logits() {
    // GPT-2 (learned positions) and two Llamas (GQA with rotary on half the head; MQA with biases
    // and LayerNorm), to the last position of the table.
    let configs = [
        GptConfig { arch: Arch::GPT2, max_position_embeddings: 24, ..llama_config(Arch::GPT2) },
        GptConfig { max_position_embeddings: 24, ..llama_config(tiny_llama()) },
        GptConfig {
            max_position_embeddings: 24,
            ..llama_config(Arch {
                normalization: trident::model::Normalization::LayerNorm,
                add_bias_linear: true,
                num_query_groups: Some(1),
                ..Arch::LLAMA
            })
        },
    ];
    let tokens: Vec<u32> = (0..24).map(|i| (i * 7 % 11) as u32).collect();
    for cfg in &configs {
        let oracle = decode_against_forward(&ReferenceDevice, cfg, &tokens, 5);
        // Both read back as f32: an ulp of the logits.
        assert!(oracle < 1.2e-7, "{:?}: reference decode differs from the forward by {oracle}", cfg.arch.features());
        let cpu = decode_against_forward(&CpuDevice::new(2), cfg, &tokens, 9);
        assert!(cpu < 1e-5, "{:?}: CPU decode differs from the forward by {cpu}", cfg.arch.features());
    }
}
