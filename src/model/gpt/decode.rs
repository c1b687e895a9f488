//! Generation with a key/value cache: the whole model (one rank, one chunk) run over only the
//! newest positions of one sequence, each layer appending the new rows of its fused QKV
//! activation (keys and values rotated at their positions) to the cache and attending over every
//! cached position (`AttentionOps::attention_decode`), so a new token costs one position's work, not
//! the whole prefix's. The same ops as the training forward; f32, batch 1.

use super::activations::{LnActs, Rows, Widths};
use super::tensor_parallel::Pass;
use super::{Gpt, Weights};
use crate::device::{AttentionShape, Device, Rotary};
use crate::device::{Gemm, Tokens};
use crate::model::ModelParallel;
use crate::parallel::tensor::TensorParallel;

/// Each layer's fused QKV rows of the positions seen so far ([positions, qkv width]), of which
/// the keys and values are read.
pub struct KvCache<D: Device> {
    layers: Vec<D::Buf>,
    len: usize,
    capacity: usize,
}

impl<D: Device> KvCache<D> {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The most positions the cache holds (the model's position table).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Forgets every position from `len` on (the next `decode` overwrites them).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl<D: Device> Gpt<D> {
    /// An empty cache for this model's `max_position_embeddings` positions.
    pub fn kv_cache(&self, dev: &D) -> KvCache<D> {
        assert!(
            self.layout.first && self.layout.last && self.mp == ModelParallel::single(),
            "decode runs the whole model"
        );
        let capacity = self.cfg.max_position_embeddings;
        let qkv = self.cfg.qkv_rows();
        KvCache { layers: (0..self.layout.num_layers).map(|_| dev.alloc(capacity * qkv)).collect(), len: 0, capacity }
    }

    /// Runs `tokens`, the next positions of the sequence the cache holds, through the model,
    /// appending them to the cache; returns the logits of the last one (the padded vocabulary).
    pub fn decode(&mut self, dev: &D, cache: &mut KvCache<D>, tokens: &[u32]) -> Vec<f32> {
        let (n, t0) = (tokens.len(), cache.len);
        assert!(n > 0 && t0 + n <= cache.capacity, "{t0} cached + {n} new positions exceed {}", cache.capacity);
        let (cfg, lay) = (&self.cfg, self.layout);
        let wd = Widths::new(cfg, &self.mp);
        let (h, d) = (wd.h, cfg.head_dim());
        let r = Rows::new(&self.mp, 1, n);
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let mut pass = Pass::plain(
            (dev, TensorParallel::single()),
            (&mut self.scratch, &mut self.heads),
            &cfg.arch,
            self.rope.as_ref(),
        );
        let mut x = dev.alloc(n * h);
        dev.embedding_forward(&mut x, &p[0], Tokens { ids: tokens, batch: 1, seq: n, vocab_start: 0 }, h);
        if let Some(at) = lay.wpe() {
            dev.position_forward(&mut x, &p[at], 1, t0, n, h);
        }
        let mut ln = LnActs::new(dev, (cfg, n, n), h, false, crate::real::Precision::F32);
        let (mut qkv, mut attn) = (dev.alloc(n * wd.ql), dev.alloc(n * wd.al));
        let (mut mid, mut fc1, mut act) = (dev.alloc(n * h), dev.alloc(n * wd.f1l), dev.alloc(n * wd.fl));
        let mut tmp = dev.alloc(n * h);
        let shape = AttentionShape::new(1, t0 + n, wd.heads, d).grouped(wd.kv_heads);
        for (l, cached) in cache.layers.iter_mut().enumerate() {
            let w = |k: usize| &p[lay.layer(l, k)];
            let ops = lay.ops;
            let wb = |(weight, bias): (usize, Option<usize>)| (w(weight), bias.map(w));
            pass.ln_forward(&mut ln, &x, wb(ops.ln1_params()), n, h);
            pass.linear_in_forward(&mut qkv, &mut ln, wb(ops.qkv_params()), r, (h, wd.qkv));
            if let Some(table) = pass.rope {
                let rotary = Rotary { rotary_dim: cfg.arch.rotary_dim(d), t0 };
                dev.rope_forward(&mut qkv, table, AttentionShape { seq: n, ..shape }, rotary);
            }
            dev.copy(cached, t0 * wd.ql, &qkv, 0, n * wd.ql);
            dev.attention_decode(&mut attn, cached, shape, t0);
            pass.linear_out_forward(
                &mut mid,
                &x,
                &attn,
                wb(ops.proj_params()),
                (&mut tmp, &mut None),
                None,
                r,
                (wd.attn, h),
            );
            pass.ln_forward(&mut ln, &mid, wb(ops.ln2_params()), n, h);
            pass.linear_in_forward(&mut fc1, &mut ln, wb(ops.fc1_params()), r, (h, wd.fc1));
            if cfg.arch.swiglu {
                dev.swiglu_forward(&mut act, &fc1, n, wd.fl);
            } else {
                dev.gelu_forward(&mut act, &fc1, cfg.arch.gelu);
            }
            pass.linear_out_forward(
                &mut x,
                &mid,
                &act,
                wb(ops.fc2_params()),
                (&mut tmp, &mut None),
                None,
                r,
                (wd.f, h),
            );
        }
        cache.len += n;
        let (lnf, lnf_b) = lay.lnf_params();
        pass.ln_forward(&mut ln, &x, (&p[lnf], lnf_b.map(|b| &p[b])), n, h);
        // Only the last position's logits are needed.
        let mut last = dev.alloc(h);
        dev.copy(&mut last, 0, &ln.out, (n - 1) * h, h);
        let mut logits = dev.alloc(wd.vl);
        dev.linear_forward(&mut logits, &last, &p[lay.head()], None, Gemm { rows: 1, k: h, n: wd.vl });
        let mut out = vec![0f32; wd.vl];
        dev.download(&logits, &mut out);
        out
    }
}
