//! The CPU backend (f32, threaded, SIMD GEMM) against the f64 reference device: every op and the
//! whole model's loss and gradients, plus bit-identical results for any thread count.

mod common;
use common::numeric::assert_close;
use trident::device::cpu::CpuDevice;
use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AdamWTensor, AttentionShape, Device, Gelu, Gemm, LayerNormSaved, Logits, Matrix, Tokens};
use trident::model::{Gpt, GptConfig};
use trident::parallel::tensor::TensorParallel;
use trident::rng::Stream;

fn random(n: usize, name: &str, scale: f64) -> Vec<f32> {
    let s = Stream::new(5, name, 3);
    (0..n).map(|i| (scale * s.normal(i as u64)) as f32).collect()
}

fn on<D: Device>(dev: &D, host: &[f32]) -> D::Buf {
    let mut b = dev.alloc(host.len());
    dev.upload(&mut b, host);
    b
}

fn host<D: Device>(dev: &D, buf: &D::Buf) -> Vec<f32> {
    let mut h = vec![0.0; dev.len(buf)];
    dev.download(buf, &mut h);
    h
}

/// An op under test: inputs in, every output buffer out, on whichever device it is given.
type Op<'a> = &'a dyn Fn(&dyn AnyDevice, &[Vec<f32>]) -> Vec<Vec<f32>>;

/// Runs `op` on both devices with the same inputs and compares every output buffer.
fn compare(what: &str, inputs: &[Vec<f32>], op: Op) {
    let cpu = CpuDevice::new(2);
    let fast = op(&cpu, inputs);
    let oracle = op(&ReferenceDevice, inputs);
    for (i, (f, o)) in fast.iter().zip(&oracle).enumerate() {
        assert_close(&format!("{what} output {i}"), f, o, 2e-6);
    }
}

/// The ops under test, over host vectors, so one closure drives both devices.
trait AnyDevice {
    fn linear(&self, x: &[f32], w: &[f32], b: &[f32], shape: Gemm, dy: &[f32]) -> Vec<Vec<f32>>;
    fn layernorm(&self, x: &[f32], w: &[f32], b: &[f32], rows: usize, cols: usize, dy: &[f32]) -> Vec<Vec<f32>>;
    fn attention(&self, qkv: &[f32], shape: AttentionShape, dy: &[f32], documents: Option<&[u32]>) -> Vec<Vec<f32>>;
    fn cross_entropy(&self, logits: &[f32], targets: &[u32], rows: usize, vocab: usize) -> Vec<Vec<f32>>;
    fn embedding(&self, tokens: &[u32], wte: &[f32], wpe: &[f32], dy: &[f32], dims: [usize; 3]) -> Vec<Vec<f32>>;
    fn misc(&self, x: &[f32], y: &[f32]) -> Vec<Vec<f32>>;
}

impl<D: Device> AnyDevice for D {
    fn linear(&self, x: &[f32], w: &[f32], b: &[f32], shape: Gemm, dy: &[f32]) -> Vec<Vec<f32>> {
        let Gemm { rows, k, n } = shape;
        let (x, w, b, dy) = (on(self, x), on(self, w), on(self, b), on(self, dy));
        let mut out = self.alloc(rows * n);
        self.linear_forward(&mut out, &x, &w, Some(&b), shape);
        let mut dx = self.alloc(rows * k);
        let mut dw = on(self, &vec![0.5; n * k]);
        let mut db = on(self, &vec![0.25; n]);
        self.linear_backward(Some(&mut dx), (&mut dw, Some(&mut db)), &dy, &x, &w, shape);
        vec![host(self, &out), host(self, &dx), host(self, &dw), host(self, &db)]
    }
    fn layernorm(&self, x: &[f32], w: &[f32], b: &[f32], rows: usize, cols: usize, dy: &[f32]) -> Vec<Vec<f32>> {
        let (x, w, b, dy) = (on(self, x), on(self, w), on(self, b), on(self, dy));
        let (mut out, mut mean, mut rstd) = (self.alloc(rows * cols), self.alloc(rows), self.alloc(rows));
        self.layernorm_forward(&mut out, (&mut mean, &mut rstd), &x, (&w, &b), Matrix { rows, cols });
        let mut dx = on(self, &vec![1.0; rows * cols]);
        let (mut dw, mut db) = (self.alloc(cols), self.alloc(cols));
        self.layernorm_backward(
            &mut dx,
            (&mut dw, &mut db),
            &dy,
            LayerNormSaved { inp: &x, weight: &w, mean: &mean, rstd: &rstd },
            Matrix { rows, cols },
        );
        vec![host(self, &out), host(self, &dx), host(self, &dw), host(self, &db)]
    }
    fn attention(&self, qkv: &[f32], shape: AttentionShape, dy: &[f32], documents: Option<&[u32]>) -> Vec<Vec<f32>> {
        let (qkv, dy) = (on(self, qkv), on(self, dy));
        let (mut out, mut lse) = (self.alloc(shape.rows() * shape.width()), self.alloc(shape.rows() * shape.heads));
        self.attention_forward(&mut out, &mut lse, &qkv, shape, None, documents);
        let mut dqkv = self.alloc(3 * shape.rows() * shape.width());
        self.attention_backward(&mut dqkv, &dy, &qkv, &out, &lse, shape, None, documents);
        vec![host(self, &out), host(self, &lse), host(self, &dqkv)]
    }
    fn cross_entropy(&self, logits: &[f32], targets: &[u32], rows: usize, vocab: usize) -> Vec<Vec<f32>> {
        let mut l = on(self, logits);
        // A shard starting at 100: targets below it are in another shard.
        let (mut max, mut stats) = (self.scalars(rows), self.scalars(2 * rows));
        self.cross_entropy_max(&l, rows, vocab, &mut max);
        self.cross_entropy_partials(&l, targets, Logits { rows, vocab, vocab_start: 100 }, &max, &mut stats);
        let mut loss = self.scalars(1);
        self.cross_entropy_loss(&max, &stats, targets, rows, &mut loss, 0);
        self.cross_entropy_backward(&mut l, targets, Logits { rows, vocab, vocab_start: 100 }, &max, &stats, 0.5);
        let read = |s: &D::Scalars, n: usize| {
            let mut v = vec![0.0; n];
            self.read_scalars(s, &mut v);
            v.iter().map(|&x| x as f32).collect::<Vec<f32>>()
        };
        let stats = read(&stats, 2 * rows);
        vec![read(&max, rows), stats[..rows].to_vec(), stats[rows..].to_vec(), read(&loss, 1), host(self, &l)]
    }
    fn embedding(&self, tokens: &[u32], wte: &[f32], wpe: &[f32], dy: &[f32], dims: [usize; 3]) -> Vec<Vec<f32>> {
        let [batch, seq, hidden] = dims;
        let (wte_b, wpe_b, dy) = (on(self, wte), on(self, wpe), on(self, dy));
        let mut out = self.alloc(batch * seq * hidden);
        self.embedding_forward(&mut out, &wte_b, Tokens { ids: tokens, batch, seq, vocab_start: 3 }, hidden);
        self.position_forward(&mut out, &wpe_b, batch, 0, seq, hidden);
        let (mut dte, mut dpe) = (on(self, wte), on(self, wpe));
        self.embedding_backward(&mut dte, &dy, Tokens { ids: tokens, batch, seq, vocab_start: 3 }, hidden);
        self.position_backward(&mut dpe, &dy, batch, 0, seq, hidden);
        let mut biased = on(self, &host(self, &out));
        self.add_bias(&mut biased, &on(self, &wpe[..hidden]), Matrix { rows: batch * seq, cols: hidden });
        vec![host(self, &out), host(self, &dte), host(self, &dpe), host(self, &biased)]
    }
    fn misc(&self, x: &[f32], y: &[f32]) -> Vec<Vec<f32>> {
        let (xb, yb) = (on(self, x), on(self, y));
        let mut g = self.alloc(x.len());
        self.gelu_forward(&mut g, &xb, Gelu::Tanh);
        let mut dg = self.alloc(x.len());
        self.gelu_backward(&mut dg, &xb, &yb, Gelu::Tanh);
        let mut ge = self.alloc(x.len());
        self.gelu_forward(&mut ge, &xb, Gelu::Erf);
        let mut dge = self.alloc(x.len());
        self.gelu_backward(&mut dge, &xb, &yb, Gelu::Erf);
        let mut sum = self.alloc(x.len());
        self.add(&mut sum, &xb, &yb);
        self.add_assign(&mut sum, &xb);
        let mut acc = self.scalars(1);
        self.sum_squares_into(&[&yb, &xb], &mut acc, 0);
        let mut ss = [0.0];
        self.read_scalars(&acc, &mut ss);
        let ss = ss[0] as f32;
        let (mut p, mut m, mut v) = (on(self, x), self.alloc(x.len()), self.alloc(x.len()));
        let step = AdamWStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 1 };
        let mut scale = self.scalars(1);
        self.write_scalars(&mut scale, &[0.5]);
        for s in 1..=3 {
            let t = AdamWTensor { param: &mut p, grad: &yb, m: &mut m, v: &mut v, decayed: true, working: None };
            self.adamw(t, AdamWStep { step: s, ..step }, (&scale, 0));
        }
        vec![
            host(self, &g),
            host(self, &dg),
            host(self, &ge),
            host(self, &dge),
            host(self, &sum),
            vec![ss],
            host(self, &p),
            host(self, &m),
            host(self, &v),
        ]
    }
}

#[test]
fn linear_matches_reference_on_awkward_shapes() {
    for &(rows, k, n) in &[(1, 1, 1), (7, 5, 3), (67, 129, 200), (130, 64, 17), (33, 300, 96)] {
        let inputs =
            vec![random(rows * k, "x", 1.0), random(n * k, "w", 0.1), random(n, "b", 1.0), random(rows * n, "dy", 1.0)];
        compare(&format!("linear {rows}x{k}x{n}"), &inputs, &|d, i| {
            d.linear(&i[0], &i[1], &i[2], Gemm { rows, k, n }, &i[3])
        });
    }
}

#[test]
fn layernorm_matches_reference() {
    for &(rows, cols) in &[(1, 4), (37, 96), (100, 257)] {
        let inputs = vec![
            random(rows * cols, "x", 2.0),
            random(cols, "w", 1.0),
            random(cols, "b", 1.0),
            random(rows * cols, "dy", 1.0),
        ];
        compare(&format!("layernorm {rows}x{cols}"), &inputs, &|d, i| {
            d.layernorm(&i[0], &i[1], &i[2], rows, cols, &i[3])
        });
    }
}

#[test]
fn attention_matches_reference() {
    for shape in [
        AttentionShape::new(1, 1, 1, 4),
        AttentionShape::new(3, 17, 2, 8),
        AttentionShape::new(2, 64, 4, 32),
        // Several query tiles of the CPU kernel (128 queries each), the last one ragged.
        AttentionShape::new(2, 300, 2, 24),
    ] {
        let inputs =
            vec![random(3 * shape.rows() * shape.width(), "qkv", 1.0), random(shape.rows() * shape.width(), "dy", 1.0)];
        compare(&format!("attention {shape:?}"), &inputs, &|d, i| d.attention(&i[0], shape, &i[1], None));
        // --reset-attention-mask: documents of 1 to 70 tokens (an end-of-document id 0 in
        // about one token of 23), in tiles of the CPU kernel's queries too.
        let tokens: Vec<u32> = (0..shape.rows()).map(|i| ((i * 7919 + 13) % 23) as u32).collect();
        let mut starts = Vec::new();
        trident::model::gpt::document_starts(&tokens, shape.seq, 0, &mut starts);
        let within = |d: &dyn AnyDevice, i: &[Vec<f32>]| d.attention(&i[0], shape, &i[1], Some(&starts));
        compare(&format!("attention within documents {shape:?}"), &inputs, &within);
    }
}

#[test]
fn cross_entropy_gelu_residual_and_adamw_match_reference() {
    let (rows, vocab) = (45, 384);
    // Row 2's token is one the loss leaves out (`--eod-mask-loss`): no loss, a zero gradient.
    let targets: Vec<u32> =
        (0..rows as u32).map(|r| if r == 2 { trident::device::kernels::IGNORED_TARGET } else { (r * 37) % 257 }).collect();
    let inputs = vec![random(rows * vocab, "logits", 3.0)];
    compare("cross entropy", &inputs, &|d, i| d.cross_entropy(&i[0], &targets, rows, vocab));
    let (batch, seq, hidden) = (3, 37, 48);
    let tokens: Vec<u32> = (0..batch * seq).map(|i| (i * 13 % 50) as u32).collect();
    let inputs = vec![
        random(40 * hidden, "wte", 1.0),
        random(seq * hidden, "wpe", 1.0),
        random(batch * seq * hidden, "dy", 1.0),
    ];
    compare("embedding", &inputs, &|d, i| d.embedding(&tokens, &i[0], &i[1], &i[2], [batch, seq, hidden]));
    let n = 40_000; // more than one block of the element-wise ops
    let inputs = vec![random(n, "x", 2.0), random(n, "y", 1.0)];
    compare("element-wise ops", &inputs, &|d, i| d.misc(&i[0], &i[1]));
}

fn small_config() -> GptConfig {
    GptConfig {
        num_layers: 2,
        hidden_size: 64,
        num_attention_heads: 4,
        ffn_hidden_size: 256,
        max_position_embeddings: 32,
        vocab_size: 257,
        padded_vocab_size: 384,
        init_method_std: 0.02,
        arch: trident::model::Arch::GPT2,
    }
}

fn batch(batch: usize, seq: usize) -> (Vec<u32>, Vec<u32>) {
    let s = Stream::new(3, "tokens", 0);
    let toks: Vec<u32> = (0..batch * (seq + 1)).map(|i| (s.uniform(i as u64, 0) * 257.0) as u32 % 257).collect();
    let mut tokens = Vec::new();
    let mut labels = Vec::new();
    for b in 0..batch {
        tokens.extend_from_slice(&toks[b * (seq + 1)..b * (seq + 1) + seq]);
        labels.extend_from_slice(&toks[b * (seq + 1) + 1..(b + 1) * (seq + 1)]);
    }
    (tokens, labels)
}

fn model_grads<D: Device>(dev: &D, tokens: &[u32], labels: &[u32], b: usize, s: usize) -> (f64, Vec<Vec<f32>>) {
    let mut model = Gpt::new(dev, small_config(), 1234);
    model.params.zero_grads(dev);
    let loss = model.forward_backward(
        dev,
        TensorParallel::single(),
        tokens,
        labels,
        b,
        s,
        1.0 / (b * s) as f32,
        &mut |_, _| {},
    );
    (loss, model.params.grads.iter().map(|g| host(dev, g)).collect())
}

#[test]
fn whole_model_matches_reference() {
    let (b, s) = (3, 24);
    let (tokens, labels) = batch(b, s);
    let (loss_fast, grads_fast) = model_grads(&CpuDevice::new(2), &tokens, &labels, b, s);
    let (loss_ref, grads_ref) = model_grads(&ReferenceDevice, &tokens, &labels, b, s);
    assert!((loss_fast - loss_ref).abs() <= 1e-5 * loss_ref.abs(), "loss {loss_fast} vs {loss_ref}");
    let names = small_config().parameters(&trident::model::ModelParallel::single());
    for ((f, r), info) in grads_fast.iter().zip(&grads_ref).zip(&names) {
        assert_close(&info.name, f, r, 1e-4);
    }
}

#[test]
fn cpu_results_do_not_depend_on_thread_count() {
    let (b, s) = (4, 32);
    let (tokens, labels) = batch(b, s);
    let (loss1, grads1) = model_grads(&CpuDevice::new(1), &tokens, &labels, b, s);
    for threads in [2, 3] {
        let (loss, grads) = model_grads(&CpuDevice::new(threads), &tokens, &labels, b, s);
        assert_eq!(loss.to_bits(), loss1.to_bits(), "{threads} threads");
        for (g, g1) in grads.iter().zip(&grads1) {
            assert!(g.iter().zip(g1).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }
}
