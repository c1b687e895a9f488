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

use super::{ChunkPlan, GptConfig, ModelParallel, Recompute};
use crate::comm::ReduceOp;
use crate::device::{AttentionShape, Device};
use crate::parallel::tensor::{all_gather, all_reduce, reduce_scatter, TensorParallel};
use crate::real::Precision;
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

/// Where a chunk's parameters sit in its `ParamSet` (the order of `GptConfig::chunk_parameters`).
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Index of the first layer's first parameter (after the embeddings on the first chunk).
    layers_base: usize,
    num_layers: usize,
    first: bool,
    last: bool,
}

impl Layout {
    fn new(plan: &ChunkPlan) -> Layout {
        Layout {
            layers_base: if plan.first { 2 } else { 0 },
            num_layers: plan.layers.len(),
            first: plan.first,
            last: plan.last,
        }
    }
    /// Parameter `which` of the chunk's local layer `layer`.
    fn layer(&self, layer: usize, which: usize) -> usize {
        self.layers_base + layer * PER_LAYER + which
    }
    fn layer_params(&self, layer: usize) -> Range<usize> {
        self.layer(layer, 0)..self.layer(layer, PER_LAYER)
    }
    const WTE: usize = 0;
    const WPE: usize = 1;
    /// The final LayerNorm weight (bias follows), on the last chunk.
    fn lnf(&self) -> usize {
        self.layers_base + self.num_layers * PER_LAYER
    }
    /// The output layer's weight: the word embedding itself, or the last stage's tied copy.
    fn head(&self) -> usize {
        if self.first {
            Layout::WTE
        } else {
            self.lnf() + 2
        }
    }
}

/// What a forward pass of a chunk produced: the hidden states to send to the next stage, or the
/// summed token loss on the last stage.
pub enum ChunkOutput {
    Hidden(Vec<f32>),
    Loss(f64),
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
    /// The attention output and its log-sum-exp; None under selective recompute, where backward
    /// recomputes them into the chunk's spare buffers.
    attn: Option<B>,
    lse: Option<B>,
    resid_mid: B,
    ln2: B,
    ln2_mean: B,
    ln2_rstd: B,
    ln2_full: Option<B>,
    fc1: B,
    gelu: B,
}

/// The last chunk's final LayerNorm, logits and cross-entropy state.
struct HeadActs<B> {
    lnf: B,
    lnf_mean: B,
    lnf_rstd: B,
    lnf_full: Option<B>,
    logits: B,
    /// Labels in row order (`t * batch + b`) and the per-row cross-entropy statistics.
    targets: Vec<u32>,
    ce_max: Vec<f64>,
    ce_stats: Vec<f64>,
}

/// Every activation and scratch buffer of one micro-batch in flight through this chunk.
struct Activations<B> {
    rows: Rows,
    /// The residual stream entering each block, and (last) leaving the chunk's final block.
    resid: Vec<B>,
    layers: Vec<LayerActs<B>>,
    head: Option<HeadActs<B>>,
    /// The first chunk's tokens (its embedding backward needs them).
    tokens: Vec<u32>,
    /// Sequence parallel, first chunk: the embedding before its reduce-scatter.
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
}

/// A buffer of `len` elements when `needed`.
fn alloc_if<D: Device>(dev: &D, needed: bool, len: usize) -> Option<D::Buf> {
    needed.then(|| dev.alloc(len))
}

impl Rows {
    fn new(mp: &ModelParallel, batch: usize, seq: usize) -> Rows {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let positions = if sp { seq / mp.tp_size } else { seq };
        let t0 = if sp { mp.tp_rank * positions } else { 0 };
        Rows { batch, seq, full: batch * seq, local: batch * positions, t0, positions }
    }
}

impl<B> LayerActs<B> {
    /// One layer's saved activations; `with_attention` false leaves out the attention output.
    fn new<D: Device<Buf = B>>(dev: &D, cfg: &GptConfig, mp: &ModelParallel, rows: Rows, with_attention: bool) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let t = mp.tp_size;
        let (h, hl, fl) = (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t);
        let (m, ml) = (rows.full, rows.local);
        let lse = rows.batch * (cfg.num_attention_heads / t) * rows.seq;
        LayerActs {
            ln1: dev.alloc(ml * h),
            ln1_mean: dev.alloc(ml),
            ln1_rstd: dev.alloc(ml),
            ln1_full: alloc_if(dev, sp, m * h),
            qkv: dev.alloc(m * 3 * hl),
            attn: alloc_if(dev, with_attention, m * hl),
            lse: alloc_if(dev, with_attention, lse),
            resid_mid: dev.alloc(ml * h),
            ln2: dev.alloc(ml * h),
            ln2_mean: dev.alloc(ml),
            ln2_rstd: dev.alloc(ml),
            ln2_full: alloc_if(dev, sp, m * h),
            fc1: dev.alloc(m * fl),
            gelu: dev.alloc(m * fl),
        }
    }
}

impl<B> LayerActs<B> {
    /// Bytes of the buffers this layer holds (for `--log-memory`).
    fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        let opt = |b: &Option<B>| b.as_ref().map_or(0, |b| dev.len(b));
        let all = [
            &self.ln1,
            &self.ln1_mean,
            &self.ln1_rstd,
            &self.qkv,
            &self.resid_mid,
            &self.ln2,
            &self.ln2_mean,
            &self.ln2_rstd,
            &self.fc1,
            &self.gelu,
        ];
        4 * (all.iter().map(|b| dev.len(b)).sum::<usize>()
            + opt(&self.ln1_full)
            + opt(&self.ln2_full)
            + opt(&self.attn)
            + opt(&self.lse))
    }
}

impl<B> Activations<B> {
    /// Bytes of the buffers this activation set holds.
    fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        let opt = |b: &Option<B>| b.as_ref().map_or(0, |b| dev.len(b));
        let layers: usize = self.layers.iter().map(|l| l.bytes(dev)).sum();
        let resid: usize = self.resid.iter().map(|b| 4 * dev.len(b)).sum();
        let head = self.head.as_ref().map_or(0, |h| {
            4 * (dev.len(&h.lnf) + dev.len(&h.lnf_mean) + dev.len(&h.lnf_rstd) + opt(&h.lnf_full) + dev.len(&h.logits))
        });
        let scratch =
            [&self.tmp_full, &self.d_resid, &self.d_h_full, &self.d_attn, &self.d_qkv, &self.d_ffn, &self.d_ffn2];
        let scratch = 4
            * (scratch.iter().map(|b| dev.len(b)).sum::<usize>()
                + opt(&self.emb_full)
                + opt(&self.tmp_local)
                + opt(&self.d_full)
                + opt(&self.d_h_local));
        layers + resid + head + scratch
    }
}

impl<B> Activations<B> {
    #[allow(clippy::too_many_arguments)]
    fn new<D: Device<Buf = B>>(
        dev: &D,
        cfg: &GptConfig,
        mp: &ModelParallel,
        plan: &ChunkPlan,
        recompute: Recompute,
        batch: usize,
        seq: usize,
    ) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let t = mp.tp_size;
        let rows = Rows::new(mp, batch, seq);
        let full = rows.full;
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let (m, ml) = (rows.full, rows.local);
        // Full recompute keeps only each layer's input; selective recompute drops the attention
        // core's output; both are rebuilt in backward.
        let layers = match recompute {
            Recompute::Full => Vec::new(),
            Recompute::Selective => plan.layers.clone().map(|_| LayerActs::new(dev, cfg, mp, rows, false)).collect(),
            Recompute::None => plan.layers.clone().map(|_| LayerActs::new(dev, cfg, mp, rows, true)).collect(),
        };
        let head = plan.last.then(|| HeadActs {
            lnf: dev.alloc(ml * h),
            lnf_mean: dev.alloc(ml),
            lnf_rstd: dev.alloc(ml),
            lnf_full: alloc_if(dev, sp, m * h),
            logits: dev.alloc(m * vl),
            targets: vec![0; m],
            ce_max: vec![0.0; m],
            ce_stats: vec![0.0; 2 * m],
        });
        Activations {
            rows,
            resid: (0..=plan.layers.len()).map(|_| dev.alloc(ml * h)).collect(),
            layers,
            head,
            tokens: vec![0; full],
            emb_full: alloc_if(dev, sp && plan.first, m * h),
            tmp_full: dev.alloc(m * h),
            tmp_local: alloc_if(dev, sp, ml * h),
            d_resid: dev.alloc(ml * h),
            d_full: alloc_if(dev, sp, m * h),
            d_h_full: dev.alloc(m * h),
            d_h_local: alloc_if(dev, sp, ml * h),
            d_attn: dev.alloc(m * hl),
            d_qkv: dev.alloc(m * 3 * hl),
            d_ffn: dev.alloc(m * fl),
            d_ffn2: dev.alloc(m * fl),
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

/// The sizes one layer's forward and backward work with.
#[derive(Clone, Copy)]
struct Dims {
    rows: Rows,
    shape: AttentionShape,
    h: usize,
    hl: usize,
    fl: usize,
    /// Where activations are rounded to under mixed precision.
    precision: Precision,
}

/// One transformer block's forward from `x_in`, saving what backward needs into `la` (and the
/// attention output into `attn_spare` when `la` does not keep it). Writes the block's output to
/// `x_out` unless it is None (recomputation, where the output is already known).
#[allow(clippy::too_many_arguments)]
fn layer_forward<'w, D: Device>(
    dev: &D,
    tp: TensorParallel,
    w: &dyn Fn(usize) -> &'w D::Buf,
    dims: Dims,
    x_in: &D::Buf,
    x_out: Option<&mut D::Buf>,
    la: &mut LayerActs<D::Buf>,
    attn_spare: Option<(&mut D::Buf, &mut D::Buf)>,
    tmp_full: &mut D::Buf,
    tmp_local: &mut Option<D::Buf>,
) where
    D::Buf: 'w,
{
    let Dims { rows: r, shape, h, hl, fl, precision } = dims;
    dev.layernorm_forward(&mut la.ln1, &mut la.ln1_mean, &mut la.ln1_rstd, x_in, w(LN1_W), w(LN1_B), r.local, h);
    dev.round_to(&mut la.ln1, precision);
    let ln1 = gathered(dev, tp, &la.ln1, &mut la.ln1_full);
    dev.linear_forward(&mut la.qkv, ln1, w(QKV_W), Some(w(QKV_B)), r.full, h, 3 * hl);
    dev.round_to(&mut la.qkv, precision);
    let (attn, lse) = match (&mut la.attn, &mut la.lse, attn_spare) {
        (Some(attn), Some(lse), _) => (attn, lse),
        (_, _, Some(spare)) => spare,
        _ => unreachable!("a layer without its attention output has a spare"),
    };
    dev.attention_forward(attn, lse, &la.qkv, shape);
    dev.round_to(attn, precision);
    dev.linear_forward(tmp_full, attn, w(PROJ_W), None, r.full, hl, h);
    let proj = reduced(dev, tp, tmp_full, tmp_local);
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
    let Some(x_out) = x_out else { return };
    dev.linear_forward(tmp_full, &la.gelu, w(FC2_W), None, r.full, fl, h);
    let fc2 = reduced(dev, tp, tmp_full, tmp_local);
    dev.add(x_out, &la.resid_mid, fc2);
    dev.add_bias(x_out, w(FC2_B), r.local, h);
    dev.round_to(x_out, precision);
}

fn to_host<D: Device>(dev: &D, buf: &D::Buf) -> Vec<f32> {
    match dev.host_f32_ref(buf) {
        Some(h) => h.to_vec(),
        None => {
            let mut h = vec![0f32; dev.len(buf)];
            dev.download(buf, &mut h);
            h
        }
    }
}

/// One chunk of a GPT-2 model (this rank's tensor-parallel shard of the layers `plan` names, with
/// the embeddings on the first chunk and the head on the last) whose parameters live on `D`.
/// Several micro-batches can be in flight: each forward takes an activation set keyed by its
/// micro-batch, and its backward gives the set back for reuse.
pub struct Gpt<D: Device> {
    pub cfg: GptConfig,
    pub mp: ModelParallel,
    pub plan: ChunkPlan,
    pub params: ParamSet<D>,
    layout: Layout,
    /// Allocated activation sets, and which micro-batch (if any) holds each.
    pool: Vec<(Option<usize>, Activations<D::Buf>)>,
    live: usize,
    peak_live: usize,
    recompute: Recompute,
    /// What recomputation rebuilds into, shared by every layer and micro-batch of the chunk, for
    /// the shape it was made for: one layer's buffers (full), or one attention output and its
    /// log-sum-exp (selective).
    spare: Option<(Rows, LayerActs<D::Buf>)>,
    spare_attention: Option<(Rows, D::Buf, D::Buf)>,
    /// Mixed precision: the format weights and activations are held in for compute, and the
    /// working copy of the weights rounded to it (the f32 values in `params` are the masters).
    precision: Precision,
    working: Option<Vec<D::Buf>>,
}

impl<D: Device> Gpt<D> {
    /// A freshly initialised whole model on one rank: every element from (seed, name, index).
    pub fn new(dev: &D, cfg: GptConfig, seed: u64) -> Gpt<D> {
        Gpt::new_parallel(dev, cfg, ModelParallel::single(), seed)
    }

    /// This tensor-parallel rank's shard of the whole model, holding exactly the values the
    /// single-rank model has at the same positions.
    pub fn new_parallel(dev: &D, cfg: GptConfig, mp: ModelParallel, seed: u64) -> Gpt<D> {
        let plan = ChunkPlan::whole(&cfg);
        Gpt::new_chunk(dev, cfg, mp, plan, seed)
    }

    /// One chunk of the model (a pipeline stage or virtual stage).
    pub fn new_chunk(dev: &D, cfg: GptConfig, mp: ModelParallel, plan: ChunkPlan, seed: u64) -> Gpt<D> {
        let params = ParamSet::new(dev, cfg.chunk_parameters(&mp, &plan), seed);
        let layout = Layout::new(&plan);
        Gpt {
            cfg,
            mp,
            plan,
            params,
            layout,
            pool: Vec::new(),
            live: 0,
            peak_live: 0,
            recompute: Recompute::None,
            spare: None,
            spare_attention: None,
            precision: Precision::F32,
            working: None,
        }
    }

    /// The most micro-batches whose activations were held at once since the last reset.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_live
    }

    /// Chooses the compute precision (bf16 or fp16 mixed precision, or f32) and makes the working
    /// weights from the masters.
    pub fn set_precision(&mut self, dev: &D, precision: Precision) {
        self.precision = precision;
        self.working =
            (precision != Precision::F32).then(|| self.params.info.iter().map(|p| dev.alloc(p.numel())).collect());
        self.refresh_working_weights(dev);
    }

    /// Rounds the master weights into the working copy (after every optimizer step).
    pub fn refresh_working_weights(&mut self, dev: &D) {
        if let Some(working) = self.working.as_mut() {
            for (w, (m, info)) in working.iter_mut().zip(self.params.values.iter().zip(&self.params.info)) {
                // Copy in place where the device keeps buffers in host memory; stage otherwise.
                match (dev.host_f32_ref(m), dev.host_f32(w)) {
                    (Some(src), Some(dst)) => dst.copy_from_slice(src),
                    _ => {
                        let mut host = vec![0f32; info.numel()];
                        dev.download(m, &mut host);
                        dev.upload(w, &host);
                    }
                }
                dev.round_to(w, self.precision);
            }
        }
    }

    /// Chooses activation recomputation; takes effect for activation sets made afterwards.
    pub fn set_recompute(&mut self, recompute: Recompute) {
        self.recompute = recompute;
        self.pool.retain(|(k, _)| k.is_some());
    }

    /// Bytes of activation buffers allocated now (every held and pooled set, and the spare
    /// layer), for `--log-memory`.
    pub fn activation_bytes(&self, dev: &D) -> usize {
        let sets: usize = self.pool.iter().map(|(_, a)| a.bytes(dev)).sum();
        sets + self.spare.as_ref().map_or(0, |(_, l)| l.bytes(dev))
            + self.spare_attention.as_ref().map_or(0, |(_, a, l)| 4 * (dev.len(a) + dev.len(l)))
    }

    /// Bytes of one micro-batch's activation set (0 before the first forward).
    pub fn set_bytes(&self, dev: &D) -> usize {
        self.pool.first().map_or(0, |(_, a)| a.bytes(dev))
    }

    /// Bytes of the spare buffers recomputation rebuilds into.
    pub fn spare_bytes(&self, dev: &D) -> usize {
        self.spare.as_ref().map_or(0, |(_, l)| l.bytes(dev))
            + self.spare_attention.as_ref().map_or(0, |(_, a, l)| 4 * (dev.len(a) + dev.len(l)))
    }

    /// Micro-batches whose activations this chunk holds now.
    pub fn in_flight(&self) -> usize {
        self.live
    }

    pub fn reset_peak_in_flight(&mut self) {
        self.peak_live = self.live;
    }

    /// The activation set for micro-batch `key`, taking a free one (or allocating one) for a new
    /// key. Sets of another shape are dropped first.
    fn slot(&mut self, dev: &D, key: usize, batch: usize, seq: usize) -> usize {
        if let Some(i) = self.pool.iter().position(|(k, _)| *k == Some(key)) {
            return i;
        }
        self.pool.retain(|(k, a)| k.is_some() || (a.rows.batch == batch && a.rows.seq == seq));
        self.live += 1;
        self.peak_live = self.peak_live.max(self.live);
        if let Some(i) = self.pool.iter().position(|(k, _)| k.is_none()) {
            self.pool[i].0 = Some(key);
            return i;
        }
        self.pool.push((Some(key), Activations::new(dev, &self.cfg, &self.mp, &self.plan, self.recompute, batch, seq)));
        let rows = Rows::new(&self.mp, batch, seq);
        match self.recompute {
            Recompute::Full if self.spare.as_ref().is_none_or(|(r, _)| *r != rows) => {
                self.spare = Some((rows, LayerActs::new(dev, &self.cfg, &self.mp, rows, true)));
            }
            Recompute::Selective if self.spare_attention.as_ref().is_none_or(|(r, _, _)| *r != rows) => {
                let t = self.mp.tp_size;
                let attn = dev.alloc(rows.full * self.cfg.hidden_size / t);
                let lse = dev.alloc(rows.batch * (self.cfg.num_attention_heads / t) * rows.seq);
                self.spare_attention = Some((rows, attn, lse));
            }
            _ => {}
        }
        self.pool.len() - 1
    }

    fn release(&mut self, index: usize) {
        if self.pool[index].0.take().is_some() {
            self.live -= 1;
        }
    }

    /// Drops micro-batch `key`'s activations without a backward (evaluation).
    pub fn discard(&mut self, key: usize) {
        if let Some(i) = self.pool.iter().position(|(k, _)| *k == Some(key)) {
            self.release(i);
        }
    }

    fn held(&self, key: usize) -> usize {
        self.pool.iter().position(|(k, _)| *k == Some(key)).expect("backward of a micro-batch that ran forward")
    }

    fn vocab_start(&self) -> usize {
        self.mp.tp_rank * (self.cfg.padded_vocab_size / self.mp.tp_size)
    }

    /// Forward of micro-batch `key` through this chunk. The first chunk embeds `tokens`
    /// (`batch` samples of `seq`, sample-major); others start from `hidden` (this rank's rows of
    /// the previous chunk's output). The last chunk computes the loss against `labels` and
    /// returns its sum over tokens; the others return their output hidden states.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        tokens: &[u32],
        hidden: Option<&[f32]>,
        labels: Option<&[u32]>,
        batch: usize,
        seq: usize,
    ) -> ChunkOutput {
        let index = self.slot(dev, key, batch, seq);
        self.run_forward(dev, tp, index, tokens, hidden, batch, seq);
        if self.layout.last {
            let labels = labels.expect("the last chunk needs labels");
            ChunkOutput::Loss(self.cross_entropy_loss(dev, tp, index, labels))
        } else {
            let a = &self.pool[index].1;
            ChunkOutput::Hidden(to_host(dev, &a.resid[self.layout.num_layers]))
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_forward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        tokens: &[u32],
        hidden: Option<&[f32]>,
        batch: usize,
        seq: usize,
    ) {
        assert!(seq <= self.cfg.max_position_embeddings, "sequence longer than the position table");
        assert_eq!(tp.size(), self.mp.tp_size, "the tensor-parallel group does not match the model's split");
        let vocab_start = self.vocab_start();
        let (cfg, lay, precision) = (&self.cfg, self.layout, self.precision);
        let t = self.mp.tp_size;
        let p = self.working.as_ref().unwrap_or(&self.params.values);
        let a = &mut self.pool[index].1;
        let (spare, spare_attention) = (&mut self.spare, &mut self.spare_attention);
        let r = a.rows;
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let shape = AttentionShape { batch, seq, heads: cfg.num_attention_heads / t, head_dim: cfg.head_dim() };

        if lay.first {
            assert_eq!(tokens.len(), batch * seq);
            a.tokens.copy_from_slice(tokens);
            // This shard's word rows, summed over the group (reduce-scattered to this rank's
            // positions under SP), then the position embedding of those positions.
            match &mut a.emb_full {
                Some(emb) => {
                    dev.embedding_forward(emb, tokens, &p[Layout::WTE], vocab_start, batch, seq, h);
                    reduce_scatter(dev, tp.comm, emb, &mut a.resid[0]);
                }
                None => {
                    dev.embedding_forward(&mut a.resid[0], tokens, &p[Layout::WTE], vocab_start, batch, seq, h);
                    all_reduce(dev, tp.comm, &mut a.resid[0]);
                }
            }
            dev.position_forward(&mut a.resid[0], &p[Layout::WPE], batch, r.t0, r.positions, h);
            dev.round_to(&mut a.resid[0], precision);
        } else {
            dev.upload(&mut a.resid[0], hidden.expect("a chunk after the first needs its input"));
        }

        let dims = Dims { rows: r, shape, h, hl, fl, precision };
        for l in 0..lay.num_layers {
            let w = |k| &p[lay.layer(l, k)];
            let (before, after) = a.resid.split_at_mut(l + 1);
            let (x_in, x_out) = (&before[l], &mut after[0]);
            // Full recompute writes every layer into the spare set (only the residual stream is
            // kept); selective keeps the layer's set but the attention output goes to the spare.
            let attn_spare = spare_attention.as_mut().map(|(_, a, l)| (a, l));
            let (la, attn_spare) = match (a.layers.get_mut(l), spare.as_mut()) {
                (Some(la), _) => (la, attn_spare),
                (None, Some((_, layer))) => (layer, None),
                (None, None) => unreachable!("full recompute has a spare layer"),
            };
            layer_forward(dev, tp, &w, dims, x_in, Some(x_out), la, attn_spare, &mut a.tmp_full, &mut a.tmp_local);
        }
        if let Some(hd) = a.head.as_mut() {
            let lnf_w = lay.lnf();
            let x_last = &a.resid[lay.num_layers];
            dev.layernorm_forward(
                &mut hd.lnf,
                &mut hd.lnf_mean,
                &mut hd.lnf_rstd,
                x_last,
                &p[lnf_w],
                &p[lnf_w + 1],
                r.local,
                h,
            );
            dev.round_to(&mut hd.lnf, precision);
            let lnf = gathered(dev, tp, &hd.lnf, &mut hd.lnf_full);
            dev.linear_forward(&mut hd.logits, lnf, &p[lay.head()], None, r.full, h, vl);
        }
    }

    /// The vocab-parallel cross-entropy of a forward's logits against `labels` (sample-major):
    /// the max, target-logit and sum-exp all-reduces over the group. Returns the sum of the rows'
    /// losses and keeps the statistics for backward.
    fn cross_entropy_loss(&mut self, dev: &D, tp: TensorParallel, index: usize, labels: &[u32]) -> f64 {
        let vocab_start = self.vocab_start();
        let vl = self.cfg.padded_vocab_size / self.mp.tp_size;
        let a = &mut self.pool[index].1;
        let r = a.rows;
        let hd = a.head.as_mut().expect("the last chunk has a head");
        reorder_to_rows(&mut hd.targets, labels, r.batch, r.seq);
        dev.cross_entropy_max(&hd.logits, r.full, vl, &mut hd.ce_max);
        tp.comm.all_reduce(&mut hd.ce_max, ReduceOp::Max);
        let (sum_exp, target_logit) = hd.ce_stats.split_at_mut(r.full);
        dev.cross_entropy_partials(&hd.logits, &hd.targets, vocab_start, r.full, vl, &hd.ce_max, sum_exp, target_logit);
        // Sum-exp and target logit travel in one all-reduce.
        tp.comm.all_reduce(&mut hd.ce_stats, ReduceOp::Sum);
        let (sum_exp, target_logit) = hd.ce_stats.split_at(r.full);
        (0..r.full).map(|i| sum_exp[i].ln() + hd.ce_max[i] - target_logit[i]).sum()
    }

    /// Backward of micro-batch `key` through this chunk, adding gradients into `params.grads`
    /// scaled by `grad_scale` (1 / tokens in the global batch, so micro-batches accumulate to the
    /// mean). The last chunk starts from its loss; the others from `d_hidden`, the gradient of
    /// their output. `ready` is told, in order, each range of parameters whose gradients this call
    /// will not touch again (so data-parallel reduction of them can start). Returns the gradient
    /// of the chunk's input for the previous stage (None on the first chunk), and frees the
    /// micro-batch's activations.
    pub fn backward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        d_hidden: Option<&[f32]>,
        grad_scale: f32,
        ready: &mut dyn FnMut(&ParamSet<D>, Range<usize>),
    ) -> Option<Vec<f32>> {
        let index = self.held(key);
        let vocab_start = self.vocab_start();
        let (cfg, lay, precision) = (&self.cfg, self.layout, self.precision);
        let t = self.mp.tp_size;
        let (h, hl, fl, vl) =
            (cfg.hidden_size, cfg.hidden_size / t, cfg.ffn_hidden_size / t, cfg.padded_vocab_size / t);
        let num_params = self.params.info.len();
        let a = &mut self.pool[index].1;
        let (spare, spare_attention) = (&mut self.spare, &mut self.spare_attention);
        let r = a.rows;
        let shape =
            AttentionShape { batch: r.batch, seq: r.seq, heads: cfg.num_attention_heads / t, head_dim: cfg.head_dim() };

        if let Some(hd) = a.head.as_mut() {
            // Output layer (tied to the word embedding) and final LayerNorm.
            let (sum_exp, _) = hd.ce_stats.split_at(r.full);
            dev.cross_entropy_backward(
                &mut hd.logits,
                &hd.targets,
                vocab_start,
                r.full,
                vl,
                &hd.ce_max,
                sum_exp,
                grad_scale,
            );
            let p = self.working.as_ref().unwrap_or(&self.params.values);
            let g = &mut self.params.grads;
            let lnf = hd.lnf_full.as_ref().unwrap_or(&hd.lnf);
            dev.linear_backward(
                Some(&mut a.d_h_full),
                &mut g[lay.head()],
                None,
                &hd.logits,
                lnf,
                &p[lay.head()],
                r.full,
                h,
                vl,
            );
            let d_lnf = reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local);
            dev.fill(&mut a.d_resid, 0.0);
            let lnf_w = lay.lnf();
            let (gw, gb) = pair_mut(g, lnf_w, lnf_w + 1);
            let x_last = &a.resid[lay.num_layers];
            dev.layernorm_backward(
                &mut a.d_resid,
                gw,
                gb,
                d_lnf,
                x_last,
                &p[lnf_w],
                &hd.lnf_mean,
                &hd.lnf_rstd,
                r.local,
                h,
            );
            // The tied copy (last stage only) is final too; the first stage's word embedding is
            // final after the embedding backward below.
            let end = if lay.first { lnf_w + 2 } else { num_params };
            ready(&self.params, lnf_w..end);
        } else {
            dev.upload(&mut a.d_resid, d_hidden.expect("a chunk before the last needs its output's gradient"));
        }

        for l in (0..lay.num_layers).rev() {
            {
                let p = self.working.as_ref().unwrap_or(&self.params.values);
                let g = &mut self.params.grads;
                let w = |k| &p[lay.layer(l, k)];
                let x_in = &a.resid[l];
                // Rebuild what recomputation dropped: the whole layer from its input (full), or
                // the attention core from the saved QKV (selective), into the spare set.
                let (la, attn, lse): (&LayerActs<D::Buf>, &D::Buf, &D::Buf) = match (a.layers.get(l), spare.as_mut()) {
                    (Some(la), _) if la.attn.is_some() => {
                        (la, la.attn.as_ref().expect("kept"), la.lse.as_ref().expect("kept"))
                    }
                    (Some(la), _) => {
                        let (_, attn, lse) =
                            spare_attention.as_mut().expect("selective recompute has a spare attention");
                        dev.attention_forward(attn, lse, &la.qkv, shape);
                        (la, &*attn, &*lse)
                    }
                    (None, Some((_, sp))) => {
                        let dims = Dims { rows: r, shape, h, hl, fl, precision };
                        layer_forward(dev, tp, &w, dims, x_in, None, sp, None, &mut a.tmp_full, &mut a.tmp_local);
                        let sp = &*sp;
                        (sp, sp.attn.as_ref().expect("spare attn"), sp.lse.as_ref().expect("spare lse"))
                    }
                    _ => unreachable!("recomputation has a spare layer"),
                };
                // MLP: d_resid holds the gradient of the block's output (this rank's rows).
                let d_out = gathered(dev, tp, &a.d_resid, &mut a.d_full);
                {
                    let (gw, gb) = pair_mut(g, lay.layer(l, FC2_W), lay.layer(l, FC2_B));
                    dev.linear_backward(Some(&mut a.d_ffn), gw, Some(gb), d_out, &la.gelu, w(FC2_W), r.full, fl, h);
                }
                dev.gelu_backward(&mut a.d_ffn2, &la.fc1, &a.d_ffn);
                {
                    let ln2 = la.ln2_full.as_ref().unwrap_or(&la.ln2);
                    let (gw, gb) = pair_mut(g, lay.layer(l, FC1_W), lay.layer(l, FC1_B));
                    dev.linear_backward(Some(&mut a.d_h_full), gw, Some(gb), &a.d_ffn2, ln2, w(FC1_W), r.full, h, fl);
                }
                {
                    let d_ln2 = reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local);
                    let (gw, gb) = pair_mut(g, lay.layer(l, LN2_W), lay.layer(l, LN2_B));
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
                    let (gw, gb) = pair_mut(g, lay.layer(l, PROJ_W), lay.layer(l, PROJ_B));
                    dev.linear_backward(Some(&mut a.d_attn), gw, Some(gb), d_mid, attn, w(PROJ_W), r.full, hl, h);
                }
                dev.attention_backward(&mut a.d_qkv, &a.d_attn, &la.qkv, attn, lse, shape);
                {
                    let ln1 = la.ln1_full.as_ref().unwrap_or(&la.ln1);
                    let (gw, gb) = pair_mut(g, lay.layer(l, QKV_W), lay.layer(l, QKV_B));
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
                    let (gw, gb) = pair_mut(g, lay.layer(l, LN1_W), lay.layer(l, LN1_B));
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
            ready(&self.params, lay.layer_params(l));
        }
        let d_input = if lay.first {
            let g = &mut self.params.grads;
            dev.position_backward(&mut g[Layout::WPE], &a.d_resid, r.batch, r.t0, r.positions, h);
            let d_emb = gathered(dev, tp, &a.d_resid, &mut a.d_full);
            dev.embedding_backward(&mut g[Layout::WTE], d_emb, &a.tokens, vocab_start, r.batch, r.seq, h);
            ready(&self.params, Layout::WTE..Layout::WPE + 1);
            None
        } else {
            Some(to_host(dev, &a.d_resid))
        };
        self.release(index);
        d_input
    }

    /// Runs the forward pass of the whole model (a chunk that is both first and last) over
    /// `tokens` and returns this rank's logits: [seq * batch, padded_vocab / tp] in row order
    /// `t * batch + b`. Used for generation; the activations are released at once.
    pub fn forward(&mut self, dev: &D, tp: TensorParallel, tokens: &[u32], batch: usize, seq: usize) -> &D::Buf {
        assert!(self.layout.first && self.layout.last, "forward() needs the whole model");
        let index = self.slot(dev, usize::MAX, batch, seq);
        self.run_forward(dev, tp, index, tokens, None, batch, seq);
        self.release(index);
        &self.pool[index].1.head.as_ref().expect("the whole model has a head").logits
    }

    /// Sum over all tokens of the cross-entropy loss of the whole model, without gradients.
    pub fn loss(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
    ) -> f64 {
        match self.forward_micro(dev, tp, usize::MAX, tokens, None, Some(labels), batch, seq) {
            ChunkOutput::Loss(loss) => {
                let index = self.held(usize::MAX);
                self.release(index);
                loss
            }
            ChunkOutput::Hidden(_) => unreachable!("the whole model ends in its loss"),
        }
    }

    /// Forward and backward of one micro-batch through the whole model. Returns the sum of the
    /// micro-batch's token losses; see `backward_micro` for `grad_scale` and `ready`.
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
        let loss = match self.forward_micro(dev, tp, 0, tokens, None, Some(labels), batch, seq) {
            ChunkOutput::Loss(loss) => loss,
            ChunkOutput::Hidden(_) => unreachable!("forward_backward needs the whole model"),
        };
        self.backward_micro(dev, tp, 0, None, grad_scale, ready);
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
