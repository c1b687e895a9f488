//! Forward and backward of GPT-2 on one device, written by hand: embeddings, pre-LayerNorm blocks
//! (causal multi-head attention, GELU MLP), final LayerNorm, and the output layer tied to the
//! word embedding. Activations are sequence-first, row `t * batch + b`, as in Megatron.

use super::GptConfig;
use crate::device::{AttentionShape, Device};
use crate::tensor::{pair_mut, ParamSet};

/// Offsets of a layer's parameters inside the canonical order of `GptConfig::parameters`.
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const QKV_W: usize = 2;
const QKV_B: usize = 3;
const PROJ_W: usize = 4;
const PROJ_B: usize = 5;
const LN2_W: usize = 6;
const LN2_B: usize = 7;
const FC1_W: usize = 8;
const FC1_B: usize = 9;
const FC2_W: usize = 10;
const FC2_B: usize = 11;
const PER_LAYER: usize = 12;
const WTE: usize = 0;
const WPE: usize = 1;

fn layer_param(layer: usize, which: usize) -> usize {
    2 + layer * PER_LAYER + which
}

/// What one block keeps from forward for its backward.
struct LayerActs<B> {
    ln1: B,
    ln1_mean: B,
    ln1_rstd: B,
    qkv: B,
    attn: B,
    lse: B,
    resid_mid: B,
    ln2: B,
    ln2_mean: B,
    ln2_rstd: B,
    fc1: B,
    gelu: B,
}

/// Every activation and scratch buffer for one (batch, seq) shape, allocated once and reused by
/// each micro-batch of that shape.
struct Activations<B> {
    batch: usize,
    seq: usize,
    /// The residual stream entering each block, and (last) leaving the final block.
    resid: Vec<B>,
    layers: Vec<LayerActs<B>>,
    lnf: B,
    lnf_mean: B,
    lnf_rstd: B,
    logits: B,
    tmp_h: B,
    d_resid: B,
    d_h: B,
    d_attn: B,
    d_qkv: B,
    d_ffn: B,
    d_ffn2: B,
    /// Labels in row order (`t * batch + b`).
    targets: Vec<u32>,
}

impl<B> Activations<B> {
    fn new<D: Device<Buf = B>>(dev: &D, cfg: &GptConfig, batch: usize, seq: usize) -> Self {
        let m = batch * seq;
        let (h, f) = (cfg.hidden_size, cfg.ffn_hidden_size);
        let lse = batch * cfg.num_attention_heads * seq;
        let layers = (0..cfg.num_layers)
            .map(|_| LayerActs {
                ln1: dev.alloc(m * h),
                ln1_mean: dev.alloc(m),
                ln1_rstd: dev.alloc(m),
                qkv: dev.alloc(m * 3 * h),
                attn: dev.alloc(m * h),
                lse: dev.alloc(lse),
                resid_mid: dev.alloc(m * h),
                ln2: dev.alloc(m * h),
                ln2_mean: dev.alloc(m),
                ln2_rstd: dev.alloc(m),
                fc1: dev.alloc(m * f),
                gelu: dev.alloc(m * f),
            })
            .collect();
        Activations {
            batch,
            seq,
            resid: (0..=cfg.num_layers).map(|_| dev.alloc(m * h)).collect(),
            layers,
            lnf: dev.alloc(m * h),
            lnf_mean: dev.alloc(m),
            lnf_rstd: dev.alloc(m),
            logits: dev.alloc(m * cfg.padded_vocab_size),
            tmp_h: dev.alloc(m * h),
            d_resid: dev.alloc(m * h),
            d_h: dev.alloc(m * h),
            d_attn: dev.alloc(m * h),
            d_qkv: dev.alloc(m * 3 * h),
            d_ffn: dev.alloc(m * f),
            d_ffn2: dev.alloc(m * f),
            targets: vec![0; m],
        }
    }
}

/// A GPT-2 model whose parameters live on device `D`.
pub struct Gpt<D: Device> {
    pub cfg: GptConfig,
    pub params: ParamSet<D>,
    acts: Option<Activations<D::Buf>>,
}

impl<D: Device> Gpt<D> {
    /// A freshly initialised model: every element from (seed, parameter name, index).
    pub fn new(dev: &D, cfg: GptConfig, seed: u64) -> Gpt<D> {
        let params = ParamSet::new(dev, cfg.parameters(), seed);
        Gpt { cfg, params, acts: None }
    }

    fn activations(&mut self, dev: &D, batch: usize, seq: usize) -> &mut Activations<D::Buf> {
        let fits = matches!(&self.acts, Some(a) if a.batch == batch && a.seq == seq);
        if !fits {
            self.acts = None; // free the old shape before allocating the new one
            self.acts = Some(Activations::new(dev, &self.cfg, batch, seq));
        }
        self.acts.as_mut().expect("activations were just allocated")
    }

    /// Runs the forward pass over `tokens` (`batch` samples of `seq` tokens, sample-major) and
    /// returns the logits, [seq * batch, padded_vocab] in row order `t * batch + b`.
    pub fn forward(&mut self, dev: &D, tokens: &[u32], batch: usize, seq: usize) -> &D::Buf {
        assert_eq!(tokens.len(), batch * seq);
        assert!(seq <= self.cfg.max_position_embeddings, "sequence longer than the position table");
        self.activations(dev, batch, seq);
        let cfg = &self.cfg;
        let p = &self.params.values;
        let a = self.acts.as_mut().expect("allocated above");
        let (h, f, m) = (cfg.hidden_size, cfg.ffn_hidden_size, batch * seq);
        let shape = AttentionShape { batch, seq, heads: cfg.num_attention_heads, head_dim: cfg.head_dim() };

        dev.embedding_forward(&mut a.resid[0], tokens, &p[WTE], &p[WPE], batch, seq, h);
        for l in 0..cfg.num_layers {
            let w = |k| &p[layer_param(l, k)];
            let (before, after) = a.resid.split_at_mut(l + 1);
            let (x_in, x_out) = (&before[l], &mut after[0]);
            let la = &mut a.layers[l];
            dev.layernorm_forward(&mut la.ln1, &mut la.ln1_mean, &mut la.ln1_rstd, x_in, w(LN1_W), w(LN1_B), m, h);
            dev.linear_forward(&mut la.qkv, &la.ln1, w(QKV_W), Some(w(QKV_B)), m, h, 3 * h);
            dev.attention_forward(&mut la.attn, &mut la.lse, &la.qkv, shape);
            dev.linear_forward(&mut a.tmp_h, &la.attn, w(PROJ_W), Some(w(PROJ_B)), m, h, h);
            dev.add(&mut la.resid_mid, x_in, &a.tmp_h);
            dev.layernorm_forward(
                &mut la.ln2,
                &mut la.ln2_mean,
                &mut la.ln2_rstd,
                &la.resid_mid,
                w(LN2_W),
                w(LN2_B),
                m,
                h,
            );
            dev.linear_forward(&mut la.fc1, &la.ln2, w(FC1_W), Some(w(FC1_B)), m, h, f);
            dev.gelu_forward(&mut la.gelu, &la.fc1);
            dev.linear_forward(&mut a.tmp_h, &la.gelu, w(FC2_W), Some(w(FC2_B)), m, f, h);
            dev.add(x_out, &la.resid_mid, &a.tmp_h);
        }
        let lnf_w = p.len() - 2;
        let x_last = &a.resid[cfg.num_layers];
        dev.layernorm_forward(&mut a.lnf, &mut a.lnf_mean, &mut a.lnf_rstd, x_last, &p[lnf_w], &p[lnf_w + 1], m, h);
        dev.linear_forward(&mut a.logits, &a.lnf, &p[WTE], None, m, h, cfg.padded_vocab_size);
        &a.logits
    }

    /// Sum over all tokens of the cross-entropy loss, without gradients (validation).
    pub fn loss(&mut self, dev: &D, tokens: &[u32], labels: &[u32], batch: usize, seq: usize) -> f64 {
        self.forward(dev, tokens, batch, seq);
        let vocab = self.cfg.padded_vocab_size;
        let a = self.acts.as_mut().expect("forward allocated activations");
        reorder_to_rows(&mut a.targets, labels, batch, seq);
        dev.cross_entropy(&mut a.logits, &a.targets, batch * seq, vocab, None)
    }

    /// Forward and backward of one micro-batch. Gradients are added into `params.grads`, scaled
    /// by `grad_scale` (1 / tokens in the global batch, so that micro-batches accumulate to the
    /// mean). Returns the sum of the micro-batch's token losses.
    pub fn forward_backward(
        &mut self,
        dev: &D,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
        grad_scale: f32,
    ) -> f64 {
        self.forward(dev, tokens, batch, seq);
        let cfg = &self.cfg;
        let (h, f, m, vocab) = (cfg.hidden_size, cfg.ffn_hidden_size, batch * seq, cfg.padded_vocab_size);
        let shape = AttentionShape { batch, seq, heads: cfg.num_attention_heads, head_dim: cfg.head_dim() };
        let p = &self.params.values;
        let g = &mut self.params.grads;
        let a = self.acts.as_mut().expect("forward allocated activations");
        reorder_to_rows(&mut a.targets, labels, batch, seq);
        let loss = dev.cross_entropy(&mut a.logits, &a.targets, m, vocab, Some(grad_scale));

        // Output layer (tied to the word embedding) and final LayerNorm.
        dev.linear_backward(Some(&mut a.d_h), &mut g[WTE], None, &a.logits, &a.lnf, &p[WTE], m, h, vocab);
        dev.fill(&mut a.d_resid, 0.0);
        let lnf_w = p.len() - 2;
        {
            let (gw, gb) = pair_mut(g, lnf_w, lnf_w + 1);
            let x_last = &a.resid[cfg.num_layers];
            dev.layernorm_backward(&mut a.d_resid, gw, gb, &a.d_h, x_last, &p[lnf_w], &a.lnf_mean, &a.lnf_rstd, m, h);
        }

        for l in (0..cfg.num_layers).rev() {
            let la = &a.layers[l];
            let w = |k| &p[layer_param(l, k)];
            let x_in = &a.resid[l];
            // MLP: d_resid holds the gradient of the block's output.
            {
                let (gw, gb) = pair_mut(g, layer_param(l, FC2_W), layer_param(l, FC2_B));
                dev.linear_backward(Some(&mut a.d_ffn), gw, Some(gb), &a.d_resid, &la.gelu, w(FC2_W), m, f, h);
            }
            dev.gelu_backward(&mut a.d_ffn2, &la.fc1, &a.d_ffn);
            {
                let (gw, gb) = pair_mut(g, layer_param(l, FC1_W), layer_param(l, FC1_B));
                dev.linear_backward(Some(&mut a.d_h), gw, Some(gb), &a.d_ffn2, &la.ln2, w(FC1_W), m, h, f);
            }
            {
                let (gw, gb) = pair_mut(g, layer_param(l, LN2_W), layer_param(l, LN2_B));
                dev.layernorm_backward(
                    &mut a.d_resid,
                    gw,
                    gb,
                    &a.d_h,
                    &la.resid_mid,
                    w(LN2_W),
                    &la.ln2_mean,
                    &la.ln2_rstd,
                    m,
                    h,
                );
            }
            // Attention: d_resid now holds the gradient of the mid-block residual.
            {
                let (gw, gb) = pair_mut(g, layer_param(l, PROJ_W), layer_param(l, PROJ_B));
                dev.linear_backward(Some(&mut a.d_attn), gw, Some(gb), &a.d_resid, &la.attn, w(PROJ_W), m, h, h);
            }
            dev.attention_backward(&mut a.d_qkv, &a.d_attn, &la.qkv, &la.attn, &la.lse, shape);
            {
                let (gw, gb) = pair_mut(g, layer_param(l, QKV_W), layer_param(l, QKV_B));
                dev.linear_backward(Some(&mut a.d_h), gw, Some(gb), &a.d_qkv, &la.ln1, w(QKV_W), m, h, 3 * h);
            }
            {
                let (gw, gb) = pair_mut(g, layer_param(l, LN1_W), layer_param(l, LN1_B));
                dev.layernorm_backward(
                    &mut a.d_resid,
                    gw,
                    gb,
                    &a.d_h,
                    x_in,
                    w(LN1_W),
                    &la.ln1_mean,
                    &la.ln1_rstd,
                    m,
                    h,
                );
            }
        }
        let (gte, gpe) = pair_mut(g, WTE, WPE);
        dev.embedding_backward(gte, gpe, &a.d_resid, tokens, batch, seq, h);
        loss
    }
}

/// Sample-major labels `[b][t]` to the activations' row order `t * batch + b`.
fn reorder_to_rows(rows: &mut [u32], sample_major: &[u32], batch: usize, seq: usize) {
    assert_eq!(sample_major.len(), batch * seq);
    for b in 0..batch {
        for t in 0..seq {
            rows[t * batch + b] = sample_major[b * seq + t];
        }
    }
}
