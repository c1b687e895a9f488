//! Forward and backward of GPT-2 on one device, written by hand: embeddings, pre-LayerNorm blocks
//! (causal multi-head attention, GELU MLP), final LayerNorm, and the output layer tied to the word
//! embedding. Activations are sequence-first, row `t * batch + b`, as in Megatron.
//!
//! With tensor parallelism (Megatron's layout) QKV and fc1 are column-parallel, the attention
//! projection and fc2 row-parallel, the word embedding and the output layer vocab-parallel, and
//! the cross-entropy is computed from three all-reduces of per-row statistics. With sequence
//! parallelism the residual stream, LayerNorms and biases work on this rank's contiguous block of
//! positions, and all-gather / reduce-scatter replace the all-reduces. A group of one rank makes
//! every collective a no-op, so the single-rank model is the same code.

use super::{GptConfig, ModelParallel};
use crate::comm::ReduceOp;
use crate::device::{AttentionShape, Device};
use crate::parallel::tensor::{all_gather, all_reduce, reduce_scatter, TensorParallel};
use crate::tensor::{pair_mut, ParamSet};
use std::ops::Range;

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

/// The parameter indices of layer `layer` (for gradient-ready notifications).
pub fn layer_params(layer: usize) -> Range<usize> {
    layer_param(layer, 0)..layer_param(layer, PER_LAYER)
}

/// Row counts of one micro-batch on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rows {
    batch: usize,
    seq: usize,
    /// All rows, `batch * seq` (inputs of the column-parallel layers).
    full: usize,
    /// Rows of the residual stream on this rank (`full / tp` under sequence parallelism).
    local: usize,
    /// The first position of this rank's residual rows.
    t0: usize,
    /// Positions in this rank's residual rows.
    positions: usize,
}

/// What one block keeps from forward for its backward. `*_full` buffers exist only under
/// sequence parallelism, where they hold the all-gathered LayerNorm outputs.
struct LayerActs<B> {
    ln1: B,
    ln1_mean: B,
    ln1_rstd: B,
    ln1_full: Option<B>,
    qkv: B,
    attn: B,
    lse: B,
    resid_mid: B,
    ln2: B,
    ln2_mean: B,
    ln2_rstd: B,
    ln2_full: Option<B>,
    fc1: B,
    gelu: B,
}

/// Every activation and scratch buffer for one (batch, seq) shape, allocated once and reused by
/// each micro-batch of that shape.
struct Activations<B> {
    rows: Rows,
    /// The residual stream entering each block, and (last) leaving the final block.
    resid: Vec<B>,
    layers: Vec<LayerActs<B>>,
    lnf: B,
    lnf_mean: B,
    lnf_rstd: B,
    lnf_full: Option<B>,
    logits: B,
    /// Sequence parallel: the embedding before its reduce-scatter.
    emb_full: Option<B>,
    /// Outputs of the row-parallel layers before their reduction (all rows)...
    tmp_full: B,
    /// ...and after it, under sequence parallelism (this rank's rows).
    tmp_local: Option<B>,
    d_resid: B,
    /// Sequence parallel: the residual gradient gathered to all rows.
    d_full: Option<B>,
    /// Gradients of LayerNorm outputs (all rows), and their reduce-scatter (SP).
    d_h_full: B,
    d_h_local: Option<B>,
    d_attn: B,
    d_qkv: B,
    d_ffn: B,
    d_ffn2: B,
    /// Labels in row order (`t * batch + b`) and the per-row cross-entropy statistics.
    targets: Vec<u32>,
    ce_max: Vec<f64>,
    ce_stats: Vec<f64>,
}

/// A buffer of `len` elements when sequence parallelism needs it.
fn sp_alloc<D: Device>(dev: &D, sp: bool, len: usize) -> Option<D::Buf> {
    sp.then(|| dev.alloc(len))
}

impl<B> Activations<B> {
    fn new<D: Device<Buf = B>>(dev: &D, cfg: &GptConfig, mp: &ModelParallel, batch: usize, seq: usize) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let t = mp.tp_size;
        let full = batch * seq;
        let positions = if sp { seq / t } else { seq };
        let rows = Rows {
            batch,
            seq,
            full,
            local: batch * positions,
            t0: if sp { mp.tp_rank * positions } else { 0 },
            positions,
        };
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let (m, ml) = (rows.full, rows.local);
        let lse = batch * (cfg.num_attention_heads / t) * seq;
        let layers = (0..cfg.num_layers)
            .map(|_| LayerActs {
                ln1: dev.alloc(ml * h),
                ln1_mean: dev.alloc(ml),
                ln1_rstd: dev.alloc(ml),
                ln1_full: sp_alloc(dev, sp, m * h),
                qkv: dev.alloc(m * 3 * hl),
                attn: dev.alloc(m * hl),
                lse: dev.alloc(lse),
                resid_mid: dev.alloc(ml * h),
                ln2: dev.alloc(ml * h),
                ln2_mean: dev.alloc(ml),
                ln2_rstd: dev.alloc(ml),
                ln2_full: sp_alloc(dev, sp, m * h),
                fc1: dev.alloc(m * fl),
                gelu: dev.alloc(m * fl),
            })
            .collect();
        Activations {
            rows,
            resid: (0..=cfg.num_layers).map(|_| dev.alloc(ml * h)).collect(),
            layers,
            lnf: dev.alloc(ml * h),
            lnf_mean: dev.alloc(ml),
            lnf_rstd: dev.alloc(ml),
            lnf_full: sp_alloc(dev, sp, m * h),
            logits: dev.alloc(m * vl),
            emb_full: sp_alloc(dev, sp, m * h),
            tmp_full: dev.alloc(m * h),
            tmp_local: sp_alloc(dev, sp, ml * h),
            d_resid: dev.alloc(ml * h),
            d_full: sp_alloc(dev, sp, m * h),
            d_h_full: dev.alloc(m * h),
            d_h_local: sp_alloc(dev, sp, ml * h),
            d_attn: dev.alloc(m * hl),
            d_qkv: dev.alloc(m * 3 * hl),
            d_ffn: dev.alloc(m * fl),
            d_ffn2: dev.alloc(m * fl),
            targets: vec![0; m],
            ce_max: vec![0.0; m],
            ce_stats: vec![0.0; 2 * m],
        }
    }
}

/// The all-rows view of a LayerNorm output: its all-gather under sequence parallelism, itself
/// otherwise.
fn gathered<'a, D: Device>(dev: &D, tp: TensorParallel, local: &'a D::Buf, full: &'a mut Option<D::Buf>) -> &'a D::Buf {
    match full {
        Some(f) => {
            all_gather(dev, tp.comm, local, f);
            f
        }
        None => local,
    }
}

/// Reduces the partial sums of a row-parallel layer over the group: reduce-scatter to this rank's
/// rows under sequence parallelism, all-reduce otherwise. Returns the reduced rows.
fn reduced<'a, D: Device>(
    dev: &D,
    tp: TensorParallel,
    full: &'a mut D::Buf,
    local: &'a mut Option<D::Buf>,
) -> &'a D::Buf {
    match local {
        Some(l) => {
            reduce_scatter(dev, tp.comm, full, l);
            l
        }
        None => {
            all_reduce(dev, tp.comm, full);
            full
        }
    }
}

/// A GPT-2 model (this rank's shard of it) whose parameters live on device `D`.
pub struct Gpt<D: Device> {
    pub cfg: GptConfig,
    pub mp: ModelParallel,
    pub params: ParamSet<D>,
    acts: Option<Activations<D::Buf>>,
}

impl<D: Device> Gpt<D> {
    /// A freshly initialised model on one rank: every element from (seed, parameter name, index).
    pub fn new(dev: &D, cfg: GptConfig, seed: u64) -> Gpt<D> {
        Gpt::new_parallel(dev, cfg, ModelParallel::single(), seed)
    }

    /// This tensor-parallel rank's shard of the model, holding exactly the values the single-rank
    /// model has at the same positions.
    pub fn new_parallel(dev: &D, cfg: GptConfig, mp: ModelParallel, seed: u64) -> Gpt<D> {
        let params = ParamSet::new(dev, cfg.parameters(&mp), seed);
        Gpt { cfg, mp, params, acts: None }
    }

    fn activations(&mut self, dev: &D, batch: usize, seq: usize) {
        let fits = matches!(&self.acts, Some(a) if a.rows.batch == batch && a.rows.seq == seq);
        if !fits {
            self.acts = None; // free the old shape before allocating the new one
            self.acts = Some(Activations::new(dev, &self.cfg, &self.mp, batch, seq));
        }
    }

    fn vocab_start(&self) -> usize {
        self.mp.tp_rank * (self.cfg.padded_vocab_size / self.mp.tp_size)
    }

    /// Runs the forward pass over `tokens` (`batch` samples of `seq` tokens, sample-major) and
    /// returns this rank's logits: [seq * batch, padded_vocab / tp] in row order `t * batch + b`.
    pub fn forward(&mut self, dev: &D, tp: TensorParallel, tokens: &[u32], batch: usize, seq: usize) -> &D::Buf {
        assert_eq!(tokens.len(), batch * seq);
        assert!(seq <= self.cfg.max_position_embeddings, "sequence longer than the position table");
        assert_eq!(tp.size(), self.mp.tp_size, "the tensor-parallel group does not match the model's split");
        self.activations(dev, batch, seq);
        let vocab_start = self.vocab_start();
        let cfg = &self.cfg;
        let t = self.mp.tp_size;
        let p = &self.params.values;
        let a = self.acts.as_mut().expect("allocated above");
        let r = a.rows;
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let shape = AttentionShape { batch, seq, heads: cfg.num_attention_heads / t, head_dim: cfg.head_dim() };

        // Embedding: this shard's word rows, summed over the group (reduce-scattered to this
        // rank's positions under SP), then the position embedding of those positions.
        match &mut a.emb_full {
            Some(emb) => {
                dev.embedding_forward(emb, tokens, &p[WTE], vocab_start, batch, seq, h);
                reduce_scatter(dev, tp.comm, emb, &mut a.resid[0]);
            }
            None => {
                dev.embedding_forward(&mut a.resid[0], tokens, &p[WTE], vocab_start, batch, seq, h);
                all_reduce(dev, tp.comm, &mut a.resid[0]);
            }
        }
        dev.position_forward(&mut a.resid[0], &p[WPE], batch, r.t0, r.positions, h);

        for l in 0..cfg.num_layers {
            let w = |k| &p[layer_param(l, k)];
            let (before, after) = a.resid.split_at_mut(l + 1);
            let (x_in, x_out) = (&before[l], &mut after[0]);
            let la = &mut a.layers[l];
            dev.layernorm_forward(
                &mut la.ln1,
                &mut la.ln1_mean,
                &mut la.ln1_rstd,
                x_in,
                w(LN1_W),
                w(LN1_B),
                r.local,
                h,
            );
            let ln1 = gathered(dev, tp, &la.ln1, &mut la.ln1_full);
            dev.linear_forward(&mut la.qkv, ln1, w(QKV_W), Some(w(QKV_B)), r.full, h, 3 * hl);
            dev.attention_forward(&mut la.attn, &mut la.lse, &la.qkv, shape);
            dev.linear_forward(&mut a.tmp_full, &la.attn, w(PROJ_W), None, r.full, hl, h);
            let proj = reduced(dev, tp, &mut a.tmp_full, &mut a.tmp_local);
            dev.add(&mut la.resid_mid, x_in, proj);
            dev.add_bias(&mut la.resid_mid, w(PROJ_B), r.local, h);
            dev.layernorm_forward(
                &mut la.ln2,
                &mut la.ln2_mean,
                &mut la.ln2_rstd,
                &la.resid_mid,
                w(LN2_W),
                w(LN2_B),
                r.local,
                h,
            );
            let ln2 = gathered(dev, tp, &la.ln2, &mut la.ln2_full);
            dev.linear_forward(&mut la.fc1, ln2, w(FC1_W), Some(w(FC1_B)), r.full, h, fl);
            dev.gelu_forward(&mut la.gelu, &la.fc1);
            dev.linear_forward(&mut a.tmp_full, &la.gelu, w(FC2_W), None, r.full, fl, h);
            let fc2 = reduced(dev, tp, &mut a.tmp_full, &mut a.tmp_local);
            dev.add(x_out, &la.resid_mid, fc2);
            dev.add_bias(x_out, w(FC2_B), r.local, h);
        }
        let lnf_w = p.len() - 2;
        let x_last = &a.resid[cfg.num_layers];
        dev.layernorm_forward(
            &mut a.lnf,
            &mut a.lnf_mean,
            &mut a.lnf_rstd,
            x_last,
            &p[lnf_w],
            &p[lnf_w + 1],
            r.local,
            h,
        );
        let lnf = gathered(dev, tp, &a.lnf, &mut a.lnf_full);
        dev.linear_forward(&mut a.logits, lnf, &p[WTE], None, r.full, h, vl);
        &a.logits
    }

    /// The vocab-parallel cross-entropy of the logits of the last forward against `labels`
    /// (sample-major): the max, target-logit and sum-exp all-reduces over the group. Returns the
    /// sum of the rows' losses.
    fn cross_entropy_loss(&mut self, dev: &D, tp: TensorParallel, labels: &[u32]) -> f64 {
        let vocab_start = self.vocab_start();
        let vl = self.cfg.padded_vocab_size / self.mp.tp_size;
        let a = self.acts.as_mut().expect("forward allocated activations");
        let r = a.rows;
        reorder_to_rows(&mut a.targets, labels, r.batch, r.seq);
        dev.cross_entropy_max(&a.logits, r.full, vl, &mut a.ce_max);
        tp.comm.all_reduce(&mut a.ce_max, ReduceOp::Max);
        let (sum_exp, target_logit) = a.ce_stats.split_at_mut(r.full);
        dev.cross_entropy_partials(&a.logits, &a.targets, vocab_start, r.full, vl, &a.ce_max, sum_exp, target_logit);
        // Sum-exp and target logit travel in one all-reduce.
        tp.comm.all_reduce(&mut a.ce_stats, ReduceOp::Sum);
        let (sum_exp, target_logit) = a.ce_stats.split_at(r.full);
        (0..r.full).map(|i| sum_exp[i].ln() + a.ce_max[i] - target_logit[i]).sum()
    }

    /// Sum over all tokens of the cross-entropy loss, without gradients (validation).
    pub fn loss(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
    ) -> f64 {
        self.forward(dev, tp, tokens, batch, seq);
        self.cross_entropy_loss(dev, tp, labels)
    }

    /// Forward and backward of one micro-batch. Gradients are added into `params.grads`, scaled
    /// by `grad_scale` (1 / tokens in the global batch, so that micro-batches accumulate to the
    /// mean). `ready` is told, in order, each range of parameters whose gradients this call will
    /// not touch again (so data-parallel reduction of them can start). Returns the sum of the
    /// micro-batch's token losses.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
        grad_scale: f32,
        ready: &mut dyn FnMut(&ParamSet<D>, Range<usize>),
    ) -> f64 {
        self.forward(dev, tp, tokens, batch, seq);
        let loss = self.cross_entropy_loss(dev, tp, labels);
        let vocab_start = self.vocab_start();
        let cfg = &self.cfg;
        let t = self.mp.tp_size;
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let shape = AttentionShape { batch, seq, heads: cfg.num_attention_heads / t, head_dim: cfg.head_dim() };
        let num_params = self.params.info.len();
        let a = self.acts.as_mut().expect("forward allocated activations");
        let r = a.rows;
        {
            let (sum_exp, _) = a.ce_stats.split_at(r.full);
            dev.cross_entropy_backward(
                &mut a.logits,
                &a.targets,
                vocab_start,
                r.full,
                vl,
                &a.ce_max,
                sum_exp,
                grad_scale,
            );
        }

        // Output layer (tied to the word embedding) and final LayerNorm.
        let lnf_w = num_params - 2;
        {
            let p = &self.params.values;
            let g = &mut self.params.grads;
            let lnf = a.lnf_full.as_ref().unwrap_or(&a.lnf);
            dev.linear_backward(Some(&mut a.d_h_full), &mut g[WTE], None, &a.logits, lnf, &p[WTE], r.full, h, vl);
            let d_lnf = reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local);
            dev.fill(&mut a.d_resid, 0.0);
            let (gw, gb) = pair_mut(g, lnf_w, lnf_w + 1);
            let x_last = &a.resid[cfg.num_layers];
            dev.layernorm_backward(
                &mut a.d_resid,
                gw,
                gb,
                d_lnf,
                x_last,
                &p[lnf_w],
                &a.lnf_mean,
                &a.lnf_rstd,
                r.local,
                h,
            );
        }
        ready(&self.params, lnf_w..num_params);

        for l in (0..cfg.num_layers).rev() {
            {
                let p = &self.params.values;
                let g = &mut self.params.grads;
                let la = &a.layers[l];
                let w = |k| &p[layer_param(l, k)];
                let x_in = &a.resid[l];
                // MLP: d_resid holds the gradient of the block's output (this rank's rows).
                let d_out = gathered(dev, tp, &a.d_resid, &mut a.d_full);
                {
                    let (gw, gb) = pair_mut(g, layer_param(l, FC2_W), layer_param(l, FC2_B));
                    dev.linear_backward(Some(&mut a.d_ffn), gw, Some(gb), d_out, &la.gelu, w(FC2_W), r.full, fl, h);
                }
                dev.gelu_backward(&mut a.d_ffn2, &la.fc1, &a.d_ffn);
                {
                    let ln2 = la.ln2_full.as_ref().unwrap_or(&la.ln2);
                    let (gw, gb) = pair_mut(g, layer_param(l, FC1_W), layer_param(l, FC1_B));
                    dev.linear_backward(Some(&mut a.d_h_full), gw, Some(gb), &a.d_ffn2, ln2, w(FC1_W), r.full, h, fl);
                }
                {
                    let d_ln2 = reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local);
                    let (gw, gb) = pair_mut(g, layer_param(l, LN2_W), layer_param(l, LN2_B));
                    dev.layernorm_backward(
                        &mut a.d_resid,
                        gw,
                        gb,
                        d_ln2,
                        &la.resid_mid,
                        w(LN2_W),
                        &la.ln2_mean,
                        &la.ln2_rstd,
                        r.local,
                        h,
                    );
                }
                // Attention: d_resid now holds the gradient of the mid-block residual.
                let d_mid = gathered(dev, tp, &a.d_resid, &mut a.d_full);
                {
                    let (gw, gb) = pair_mut(g, layer_param(l, PROJ_W), layer_param(l, PROJ_B));
                    dev.linear_backward(Some(&mut a.d_attn), gw, Some(gb), d_mid, &la.attn, w(PROJ_W), r.full, hl, h);
                }
                dev.attention_backward(&mut a.d_qkv, &a.d_attn, &la.qkv, &la.attn, &la.lse, shape);
                {
                    let ln1 = la.ln1_full.as_ref().unwrap_or(&la.ln1);
                    let (gw, gb) = pair_mut(g, layer_param(l, QKV_W), layer_param(l, QKV_B));
                    dev.linear_backward(
                        Some(&mut a.d_h_full),
                        gw,
                        Some(gb),
                        &a.d_qkv,
                        ln1,
                        w(QKV_W),
                        r.full,
                        h,
                        3 * hl,
                    );
                }
                {
                    let d_ln1 = reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local);
                    let (gw, gb) = pair_mut(g, layer_param(l, LN1_W), layer_param(l, LN1_B));
                    dev.layernorm_backward(
                        &mut a.d_resid,
                        gw,
                        gb,
                        d_ln1,
                        x_in,
                        w(LN1_W),
                        &la.ln1_mean,
                        &la.ln1_rstd,
                        r.local,
                        h,
                    );
                }
            }
            ready(&self.params, layer_params(l));
        }
        {
            let g = &mut self.params.grads;
            dev.position_backward(&mut g[WPE], &a.d_resid, batch, r.t0, r.positions, h);
            let d_emb = gathered(dev, tp, &a.d_resid, &mut a.d_full);
            dev.embedding_backward(&mut g[WTE], d_emb, tokens, vocab_start, batch, seq, h);
        }
        ready(&self.params, WTE..WPE + 1);
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
