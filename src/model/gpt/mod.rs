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
use crate::comm::{CommCounters, ReduceOp};
use crate::device::{AttentionShape, Device};
use crate::parallel::summa::{self, Scratch};
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

/// What a forward pass of a chunk produced: the hidden states for the next stage (written into
/// the caller's buffer), or the summed token loss on the last stage.
pub enum ChunkOutput {
    Hidden,
    Loss(f64),
}

/// Row counts of one micro-batch on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rows {
    batch: usize,
    seq: usize,
    /// The samples whose rows this rank holds: the whole micro-batch under 1-D, this rank's
    /// batch block (`batch / (d q)`) under SUMMA.
    sub_batch: usize,
    /// The first of those samples.
    first_sample: usize,
    /// All rows, `sub_batch * seq` (inputs of the column-parallel layers).
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
    /// Mixed precision (without full recompute): each layer's saved activations between its
    /// forward and its backward, in 16 bits; the layer computes in the chunk's spare set.
    compact: Vec<Option<Vec<Stash>>>,
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
        let sub_batch = batch / mp.batch_split();
        let first_sample = mp.summa.map_or(0, |c| c.batch_block() * sub_batch);
        Rows { batch, seq, sub_batch, first_sample, full: sub_batch * seq, local: sub_batch * positions, t0, positions }
    }
}

/// Widths of one rank's activations: the residual stream (`h`, or `h/q` under SUMMA), the
/// attention core and QKV block (`h/t` or `h/q`), the MLP (`f/t`, `f/q`), the logits (`V/t`,
/// `V/q`), and the heads this rank computes.
#[derive(Clone, Copy, Debug)]
struct Widths {
    h: usize,
    f: usize,
    hr: usize,
    hl: usize,
    fl: usize,
    vl: usize,
    heads: usize,
}

impl Widths {
    fn new(cfg: &GptConfig, mp: &ModelParallel) -> Widths {
        let s = mp.feature_split();
        let h = cfg.hidden_size;
        Widths {
            h,
            f: cfg.ffn_hidden_size,
            hr: if mp.summa.is_some() { h / s } else { h },
            hl: h / s,
            fl: cfg.ffn_hidden_size / s,
            vl: cfg.padded_vocab_size / s,
            heads: cfg.num_attention_heads / s,
        }
    }
}

impl<B> LayerActs<B> {
    /// One layer's saved activations; `with_attention` false leaves out the attention output.
    fn new<D: Device<Buf = B>>(dev: &D, cfg: &GptConfig, mp: &ModelParallel, rows: Rows, with_attention: bool) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let Widths { hr: h, hl, fl, heads, .. } = Widths::new(cfg, mp);
        let (m, ml) = (rows.full, rows.local);
        let lse = rows.sub_batch * heads * rows.seq;
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
    /// Every buffer this layer holds, in a fixed order, each marked true when it holds
    /// activations (rounded to the compute format under mixed precision) and false for the f32
    /// statistics (LayerNorm mean and rstd, the attention's log-sum-exp).
    fn buffers(&self) -> Vec<(&B, bool)> {
        let mut out = vec![
            (&self.ln1, true),
            (&self.ln1_mean, false),
            (&self.ln1_rstd, false),
            (&self.qkv, true),
            (&self.resid_mid, true),
            (&self.ln2, true),
            (&self.ln2_mean, false),
            (&self.ln2_rstd, false),
            (&self.fc1, true),
            (&self.gelu, true),
        ];
        out.extend(self.ln1_full.iter().chain(&self.ln2_full).chain(&self.attn).map(|b| (b, true)));
        out.extend(self.lse.iter().map(|b| (b, false)));
        out
    }

    /// The same buffers, in the same order, to write.
    fn buffers_mut(&mut self) -> Vec<&mut B> {
        let mut out = vec![
            &mut self.ln1,
            &mut self.ln1_mean,
            &mut self.ln1_rstd,
            &mut self.qkv,
            &mut self.resid_mid,
            &mut self.ln2,
            &mut self.ln2_mean,
            &mut self.ln2_rstd,
            &mut self.fc1,
            &mut self.gelu,
        ];
        out.extend(self.ln1_full.iter_mut().chain(self.ln2_full.iter_mut()).chain(self.attn.iter_mut()));
        out.extend(self.lse.iter_mut());
        out
    }

    /// Bytes of the buffers this layer holds (for `--log-memory`).
    fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        4 * self.buffers().iter().map(|(b, _)| dev.len(b)).sum::<usize>()
    }

    /// Bytes of this layer's buffers held in 16 bits (activations) and f32 (statistics).
    fn stash_bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.buffers().iter().map(|(b, half)| if *half { 2 } else { 4 } * dev.len(b)).sum()
    }

    /// This layer's saved buffers as a 16-bit copy (exact: under mixed precision every activation
    /// was rounded to `precision` where it was stored).
    fn stash<D: Device<Buf = B>>(&self, dev: &D, precision: Precision) -> Vec<Stash> {
        self.buffers()
            .into_iter()
            .map(|(b, half)| {
                if half {
                    Stash::Half(dev.to_half(b, precision))
                } else {
                    let mut h = vec![0f32; dev.len(b)];
                    dev.download(b, &mut h);
                    Stash::Full(h)
                }
            })
            .collect()
    }

    /// Restores what `stash` copied.
    fn unstash<D: Device<Buf = B>>(&mut self, dev: &D, stash: &[Stash], precision: Precision) {
        for (b, s) in self.buffers_mut().into_iter().zip(stash) {
            match s {
                Stash::Half(h) => dev.load_half(h, precision, b),
                Stash::Full(f) => dev.upload(b, f),
            }
        }
    }
}

/// One saved buffer of a layer between its forward and its backward under mixed precision:
/// activations in 16 bits, statistics in f32.
enum Stash {
    Half(Vec<u16>),
    Full(Vec<f32>),
}

impl Stash {
    fn bytes(&self) -> usize {
        match self {
            Stash::Half(h) => 2 * h.len(),
            Stash::Full(f) => 4 * f.len(),
        }
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
        let compact: usize = self.compact.iter().flatten().flatten().map(Stash::bytes).sum();
        layers + resid + head + scratch + compact
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
        compact: bool,
        batch: usize,
        seq: usize,
    ) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let rows = Rows::new(mp, batch, seq);
        let Widths { hr: h, hl, fl, vl, .. } = Widths::new(cfg, mp);
        let (m, ml) = (rows.full, rows.local);
        // The first chunk's embedding before its reduction: all rows under sequence parallelism;
        // under SUMMA the rows of every batch block of this depth layer (also the gather target
        // of the embedding's backward).
        let emb_rows = match mp.summa {
            Some(c) => plan.first.then_some(c.q * m),
            None => (sp && plan.first).then_some(m),
        };
        // Full recompute keeps only each layer's input; selective recompute drops the attention
        // core's output; both are rebuilt in backward.
        let layers = match recompute {
            Recompute::Full => Vec::new(),
            _ if compact => Vec::new(),
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
            tokens: vec![0; batch * seq],
            emb_full: emb_rows.map(|rows| dev.alloc(rows * h)),
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
            compact: if compact { plan.layers.clone().map(|_| None).collect() } else { Vec::new() },
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

/// LayerNorm of this rank's residual rows: whole rows under 1-D, the hidden dimension split along
/// the SUMMA row under 2-D / 2.5-D.
#[allow(clippy::too_many_arguments)]
fn ln_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    out: &mut D::Buf,
    mean: &mut D::Buf,
    rstd: &mut D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    bias: &D::Buf,
    rows: usize,
    h: usize,
) {
    match tp.summa {
        None => dev.layernorm_forward(out, mean, rstd, inp, weight, bias, rows, h),
        Some((s, _)) => s.layernorm_forward(dev, out, mean, rstd, inp, weight, bias, rows, h, sc),
    }
}

/// Backward of `ln_forward`: `dinp`, `dweight`, `dbias` "+=".
#[allow(clippy::too_many_arguments)]
fn ln_backward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    dinp: &mut D::Buf,
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    dout: &D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    mean: &D::Buf,
    rstd: &D::Buf,
    rows: usize,
    h: usize,
) {
    match tp.summa {
        None => dev.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, h),
        Some((s, _)) => s.layernorm_backward(dev, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, h, sc),
    }
}

/// A linear layer that reads a LayerNorm output (QKV, fc1) for the whole `[k] -> [n]` product:
/// column-parallel under 1-D (all-gathering the input under sequence parallelism), SUMMA
/// otherwise. `out` holds this rank's output features.
#[allow(clippy::too_many_arguments)]
fn linear_in_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    out: &mut D::Buf,
    (inp, inp_full): (&D::Buf, &mut Option<D::Buf>),
    weight: &D::Buf,
    bias: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            let inp = gathered(dev, tp, inp, inp_full);
            dev.linear_forward(out, inp, weight, Some(bias), r.full, k, n / tp.size());
        }
        Some((s, _)) => s.linear_forward(dev, out, inp, weight, Some(bias), r.full, k, n, sc),
    }
}

/// A linear layer that writes back into the residual stream (the attention projection, fc2):
/// `x_out = resid + inp · weightᵀ + bias` for the whole `[k] -> [n]` product. Row-parallel under
/// 1-D (partial sums reduced over the group, or reduce-scattered under sequence parallelism),
/// SUMMA otherwise.
#[allow(clippy::too_many_arguments)]
fn linear_out_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    x_out: &mut D::Buf,
    resid: &D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    bias: &D::Buf,
    (tmp_full, tmp_local): (&mut D::Buf, &mut Option<D::Buf>),
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            dev.linear_forward(tmp_full, inp, weight, None, r.full, k / tp.size(), n);
            let sum = reduced(dev, tp, tmp_full, tmp_local);
            dev.add(x_out, resid, sum);
            dev.add_bias(x_out, bias, r.local, n);
        }
        Some((s, _)) => {
            s.linear_forward(dev, tmp_full, inp, weight, Some(bias), r.full, k, n, sc);
            dev.add(x_out, resid, tmp_full);
        }
    }
}

/// Backward of `linear_out_forward` from the residual gradient `d_resid`: `d_inp` (overwrite),
/// weight and bias gradients "+=".
#[allow(clippy::too_many_arguments)]
fn linear_out_backward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    d_inp: &mut D::Buf,
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    (d_resid, d_full): (&D::Buf, &mut Option<D::Buf>),
    inp: &D::Buf,
    weight: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            let d_out = gathered(dev, tp, d_resid, d_full);
            dev.linear_backward(Some(d_inp), dweight, Some(dbias), d_out, inp, weight, r.full, k / tp.size(), n);
        }
        Some((s, _)) => {
            s.linear_backward(dev, Some(d_inp), dweight, Some(dbias), d_resid, inp, weight, r.full, k, n, sc)
        }
    }
}

/// Backward of `linear_in_forward`: returns the gradient of the LayerNorm output on this rank's
/// rows (reduced over the group under 1-D), computed in `d_full` (and `d_local`).
#[allow(clippy::too_many_arguments)]
fn linear_in_backward<'a, D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    (d_full, d_local): (&'a mut D::Buf, &'a mut Option<D::Buf>),
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    d_out: &D::Buf,
    (inp, inp_full): (&D::Buf, &Option<D::Buf>),
    weight: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) -> &'a D::Buf {
    match tp.summa {
        None => {
            let inp = inp_full.as_ref().unwrap_or(inp);
            dev.linear_backward(Some(&mut *d_full), dweight, Some(dbias), d_out, inp, weight, r.full, k, n / tp.size());
            reduced(dev, tp, d_full, d_local)
        }
        Some((s, _)) => {
            s.linear_backward(dev, Some(&mut *d_full), dweight, Some(dbias), d_out, inp, weight, r.full, k, n, sc);
            d_full
        }
    }
}

/// The sizes one layer's forward and backward work with.
#[derive(Clone, Copy)]
struct Dims {
    rows: Rows,
    shape: AttentionShape,
    wd: Widths,
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
    sc: &mut Scratch<D::Buf>,
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
    let Dims { rows: r, shape, wd, precision } = dims;
    let (h, f) = (wd.h, wd.f);
    ln_forward(dev, tp, sc, &mut la.ln1, &mut la.ln1_mean, &mut la.ln1_rstd, x_in, w(LN1_W), w(LN1_B), r.local, h);
    dev.round_to(&mut la.ln1, precision);
    linear_in_forward(dev, tp, sc, &mut la.qkv, (&la.ln1, &mut la.ln1_full), w(QKV_W), w(QKV_B), r, (h, 3 * h));
    dev.round_to(&mut la.qkv, precision);
    let (attn, lse) = match (&mut la.attn, &mut la.lse, attn_spare) {
        (Some(attn), Some(lse), _) => (attn, lse),
        (_, _, Some(spare)) => spare,
        _ => unreachable!("a layer without its attention output has a spare"),
    };
    dev.attention_forward(attn, lse, &la.qkv, shape);
    dev.round_to(attn, precision);
    let tmp = (&mut *tmp_full, &mut *tmp_local);
    linear_out_forward(dev, tp, sc, &mut la.resid_mid, x_in, attn, w(PROJ_W), w(PROJ_B), tmp, r, (h, h));
    dev.round_to(&mut la.resid_mid, precision);
    ln_forward(
        dev,
        tp,
        sc,
        &mut la.ln2,
        &mut la.ln2_mean,
        &mut la.ln2_rstd,
        &la.resid_mid,
        w(LN2_W),
        w(LN2_B),
        r.local,
        h,
    );
    dev.round_to(&mut la.ln2, precision);
    linear_in_forward(dev, tp, sc, &mut la.fc1, (&la.ln2, &mut la.ln2_full), w(FC1_W), w(FC1_B), r, (h, f));
    dev.round_to(&mut la.fc1, precision);
    dev.gelu_forward(&mut la.gelu, &la.fc1);
    dev.round_to(&mut la.gelu, precision);
    let Some(x_out) = x_out else { return };
    let tmp = (tmp_full, tmp_local);
    linear_out_forward(dev, tp, sc, x_out, &la.resid_mid, &la.gelu, w(FC2_W), w(FC2_B), tmp, r, (f, h));
    dev.round_to(x_out, precision);
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
    /// Per parameter: None where the device's GEMM rounds its operands itself (the matrices and
    /// the word embedding under bf16), which then read the masters.
    working: Option<Vec<Option<D::Buf>>>,
    /// SUMMA's panel buffers (unused under 1-D).
    scratch: Scratch<D::Buf>,
    /// Per layer, what the tensor-parallel group, the SUMMA row and the SUMMA column moved in the
    /// layer's forward and backward passes (recomputation included) since the last reset.
    layer_comm: Vec<[CommCounters; 3]>,
    /// Bytes of 16-bit layer copies held now, and the most since `reset_peak_in_flight`.
    stashed: usize,
    peak_stashed: usize,
}

/// The counters of the groups a layer talks over: the tensor-parallel group, then the SUMMA row
/// and column (zero under 1-D).
fn tp_counters<D: Device>(dev: &D, tp: TensorParallel) -> [CommCounters; 3] {
    let t = crate::device::comm_counters(dev, tp.comm);
    match tp.summa {
        None => [t, CommCounters::default(), CommCounters::default()],
        Some((s, _)) => [t, s.row.counters(), s.col.counters()],
    }
}

fn add_since(acc: &mut [CommCounters; 3], now: &[CommCounters; 3], before: &[CommCounters; 3]) {
    for g in 0..3 {
        acc[g].add(&now[g].since(&before[g]));
    }
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
            scratch: Scratch::default(),
            layer_comm: vec![[CommCounters::default(); 3]; layout.num_layers],
            stashed: 0,
            peak_stashed: 0,
        }
    }

    /// Per layer of this chunk, the elements its tensor-parallel group, SUMMA row and SUMMA column
    /// moved since `reset_layer_comm` (forward, backward and recomputation).
    pub fn layer_comm(&self) -> &[[CommCounters; 3]] {
        &self.layer_comm
    }

    pub fn reset_layer_comm(&mut self) {
        self.layer_comm.iter_mut().for_each(|l| *l = Default::default());
    }

    /// The most micro-batches whose activations were held at once since the last reset.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_live
    }

    /// Chooses the compute precision (bf16 or fp16 mixed precision, or f32) and makes the working
    /// weights from the masters.
    pub fn set_precision(&mut self, dev: &D, precision: Precision) {
        self.precision = precision;
        // Activation sets made from now on hold their layers in the new format.
        self.pool.retain(|(k, _)| k.is_some());
        // Matrices that only GEMMs read (and the word embedding, whose looked-up rows are rounded
        // as they are read) need no rounded copy where the GEMM rounds its operands itself.
        let gemm_rounds = dev.matmul_rounds_operands(precision);
        self.working = (precision != Precision::F32).then(|| {
            self.params
                .info
                .iter()
                .map(|p| (!(gemm_rounds && is_gemm_operand(&p.name))).then(|| dev.alloc(p.numel())))
                .collect()
        });
        self.refresh_working_weights(dev);
    }

    /// Rounds the master weights into the working copy (after every optimizer step).
    pub fn refresh_working_weights(&mut self, dev: &D) {
        if let Some(working) = self.working.as_mut() {
            let pairs = working.iter_mut().zip(self.params.values.iter().zip(&self.params.info));
            for (w, (m, info)) in pairs.filter_map(|(w, rest)| w.as_mut().map(|w| (w, rest))) {
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

    /// Bytes of the working copy of the weights mixed precision computes with (its values are
    /// 16-bit, held in the device's f32 buffers), 0 in f32.
    pub fn working_bytes(&self, dev: &D) -> usize {
        self.working.as_ref().map_or(0, |w| w.iter().flatten().map(|b| 4 * dev.len(b)).sum())
    }

    /// Chooses activation recomputation; takes effect for activation sets made afterwards.
    pub fn set_recompute(&mut self, recompute: Recompute) {
        self.recompute = recompute;
        self.pool.retain(|(k, _)| k.is_some());
    }

    /// Bytes of activation buffers allocated now (every held and pooled set, and the spare
    /// layer), for `--log-memory`.
    /// Under mixed precision the 16-bit copies of saved layers come and go with each micro-batch,
    /// so their most since the last `reset_peak_in_flight` is counted.
    pub fn activation_bytes(&self, dev: &D) -> usize {
        let sets: usize = self.pool.iter().map(|(_, a)| a.bytes(dev)).sum();
        let now: usize =
            self.pool.iter().flat_map(|(_, a)| a.compact.iter().flatten().flatten()).map(Stash::bytes).sum();
        sets - now
            + self.peak_stashed
            + self.spare.as_ref().map_or(0, |(_, l)| l.bytes(dev))
            + self.spare_attention.as_ref().map_or(0, |(_, a, l)| 4 * (dev.len(a) + dev.len(l)))
    }

    /// Bytes of one micro-batch's activation set while it is in flight (0 before the first
    /// forward): under mixed precision, with every layer's 16-bit copy.
    pub fn set_bytes(&self, dev: &D) -> usize {
        self.pool.first().map_or(0, |(_, a)| {
            let now: usize = a.compact.iter().flatten().flatten().map(Stash::bytes).sum();
            let per_layer = self.spare.as_ref().map_or(0, |(_, l)| l.stash_bytes(dev));
            a.bytes(dev) - now + a.compact.len() * per_layer
        })
    }

    /// Whether saved layers are held in 16 bits between forward and backward (mixed precision,
    /// unless full recompute keeps only the layer inputs anyway).
    fn compacting(&self) -> bool {
        self.precision != Precision::F32 && self.recompute != Recompute::Full
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
        self.peak_stashed = self.stashed;
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
        let compact = self.compacting();
        let set = Activations::new(dev, &self.cfg, &self.mp, &self.plan, self.recompute, compact, batch, seq);
        self.pool.push((Some(key), set));
        let rows = Rows::new(&self.mp, batch, seq);
        // Full recompute rebuilds each layer into one spare set, and 16-bit storage computes each
        // layer there (with its attention output unless selective recompute drops it).
        let with_attention = self.recompute != Recompute::Selective;
        if (self.recompute == Recompute::Full || compact)
            && self.spare.as_ref().is_none_or(|(r, l)| *r != rows || l.attn.is_some() != with_attention)
        {
            self.spare = Some((rows, LayerActs::new(dev, &self.cfg, &self.mp, rows, with_attention)));
        }
        if self.recompute == Recompute::Selective && self.spare_attention.as_ref().is_none_or(|(r, _, _)| *r != rows) {
            let wd = Widths::new(&self.cfg, &self.mp);
            let attn = dev.alloc(rows.full * wd.hl);
            let lse = dev.alloc(rows.sub_batch * wd.heads * rows.seq);
            self.spare_attention = Some((rows, attn, lse));
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

    /// The first vocabulary row of this rank's word-embedding shard (under SUMMA, of its row's
    /// vocabulary block).
    fn vocab_start(&self) -> usize {
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        self.mp.summa.map_or(self.mp.tp_rank, |c| c.row) * vl
    }

    /// The first vocabulary entry of this rank's logits (under SUMMA, of its column's block).
    fn logits_start(&self) -> usize {
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        self.mp.summa.map_or(self.mp.tp_rank, |c| c.col) * vl
    }

    /// Forward of micro-batch `key` through this chunk. The first chunk embeds `tokens`
    /// (`batch` samples of `seq`, sample-major); others start from `hidden` (this rank's rows of
    /// the previous chunk's output, on the device). The last chunk computes the loss against
    /// `labels` and returns its sum over tokens; the others copy their output hidden states into
    /// `out` (as long as `hidden`; it stays the caller's, to send while this chunk goes on).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        tokens: &[u32],
        hidden: Option<&D::Buf>,
        labels: Option<&[u32]>,
        batch: usize,
        seq: usize,
        out: Option<&mut D::Buf>,
    ) -> ChunkOutput {
        let index = self.slot(dev, key, batch, seq);
        self.run_forward(dev, tp, index, tokens, hidden, batch, seq);
        if self.layout.last {
            let labels = labels.expect("the last chunk needs labels");
            ChunkOutput::Loss(self.cross_entropy_loss(dev, tp, index, labels))
        } else {
            let last = &self.pool[index].1.resid[self.layout.num_layers];
            let out = out.expect("a chunk before the last needs a buffer for its output");
            assert_eq!(dev.len(out), dev.len(last), "the output buffer does not match the chunk's hidden states");
            dev.copy(out, 0, last, 0, dev.len(last));
            ChunkOutput::Hidden
        }
    }

    /// Elements of this rank's hidden states of one micro-batch at a chunk boundary (what
    /// `forward_micro` writes to `out` and `backward_micro` to `d_input`).
    pub fn boundary_len(&self, batch: usize, seq: usize) -> usize {
        Rows::new(&self.mp, batch, seq).local * Widths::new(&self.cfg, &self.mp).h
    }

    #[allow(clippy::too_many_arguments)]
    fn run_forward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        tokens: &[u32],
        hidden: Option<&D::Buf>,
        batch: usize,
        seq: usize,
    ) {
        assert!(seq <= self.cfg.max_position_embeddings, "sequence longer than the position table");
        assert_eq!(tp.size(), self.mp.tp_size, "the tensor-parallel group does not match the model's split");
        let vocab_start = self.vocab_start();
        let (cfg, lay, precision, mp) = (&self.cfg, self.layout, self.precision, self.mp);
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let a = &mut self.pool[index].1;
        let (spare, spare_attention, sc) = (&mut self.spare, &mut self.spare_attention, &mut self.scratch);
        let layer_comm = &mut self.layer_comm;
        let (stashed, peak_stashed) = (&mut self.stashed, &mut self.peak_stashed);
        let r = a.rows;
        let wd = Widths::new(cfg, &mp);
        let (h, vl) = (wd.h, wd.vl);
        let shape = AttentionShape { batch: r.sub_batch, seq, heads: wd.heads, head_dim: cfg.head_dim() };

        if lay.first {
            assert_eq!(tokens.len(), batch * seq);
            a.tokens.copy_from_slice(tokens);
            // This shard's word rows, summed over the group (reduce-scattered to this rank's
            // positions under SP; to this rank's batch block under SUMMA), then the position
            // embedding of those positions.
            match (&mut a.emb_full, tp.summa, mp.summa) {
                (Some(emb), Some((s, _)), Some(c)) => {
                    let bd = batch / c.depth;
                    let mine = &tokens[c.dep * bd * seq..(c.dep + 1) * bd * seq];
                    dev.embedding_forward(emb, mine, &p[Layout::WTE], vocab_start, bd, seq, wd.hr);
                    // The rows as the compute format holds them (the table may be the master).
                    dev.round_to(emb, precision);
                    let blocks = rows_to_batch_blocks(&summa::host(dev, emb), c.q, r.sub_batch, seq, wd.hr);
                    let mut out = vec![0f32; r.full * wd.hr];
                    s.col.reduce_scatter(&blocks, &mut out);
                    dev.upload(&mut a.resid[0], &out);
                    let mut wpe = dev.alloc(cfg.max_position_embeddings * wd.hr);
                    summa::gather_stacked(dev, s.col, &p[Layout::WPE], &mut wpe);
                    dev.position_forward(&mut a.resid[0], &wpe, r.sub_batch, 0, seq, wd.hr);
                }
                (Some(emb), _, _) => {
                    dev.embedding_forward(emb, tokens, &p[Layout::WTE], vocab_start, batch, seq, h);
                    dev.round_to(emb, precision);
                    reduce_scatter(dev, tp.comm, emb, &mut a.resid[0]);
                }
                _ => {
                    dev.embedding_forward(&mut a.resid[0], tokens, &p[Layout::WTE], vocab_start, batch, seq, h);
                    dev.round_to(&mut a.resid[0], precision);
                    all_reduce(dev, tp.comm, &mut a.resid[0]);
                }
            }
            if mp.summa.is_none() {
                dev.position_forward(&mut a.resid[0], &p[Layout::WPE], batch, r.t0, r.positions, h);
            }
            dev.round_to(&mut a.resid[0], precision);
        } else {
            let hidden = hidden.expect("a chunk after the first needs its input");
            assert_eq!(dev.len(hidden), dev.len(&a.resid[0]), "the input does not match the chunk's hidden states");
            dev.copy(&mut a.resid[0], 0, hidden, 0, dev.len(hidden));
        }

        let dims = Dims { rows: r, shape, wd, precision };
        for l in 0..lay.num_layers {
            let w = |k| &p[lay.layer(l, k)];
            let (before, after) = a.resid.split_at_mut(l + 1);
            let (x_in, x_out) = (&before[l], &mut after[0]);
            // Full recompute writes every layer into the spare set (only the residual stream is
            // kept); selective keeps the layer's set but the attention output goes to the spare.
            let attn_spare = spare_attention.as_mut().map(|(_, a, l)| (a, l));
            // Under 16-bit storage the layer computes in the spare set and is then copied out.
            let (la, attn_spare) = match (a.layers.get_mut(l), spare.as_mut()) {
                (Some(la), _) => (la, attn_spare),
                (None, Some((_, layer))) if layer.attn.is_none() => (layer, attn_spare),
                (None, Some((_, layer))) => (layer, None),
                (None, None) => unreachable!("full recompute has a spare layer"),
            };
            let tmp = (&mut a.tmp_full, &mut a.tmp_local);
            let before = tp_counters(dev, tp);
            layer_forward(dev, tp, sc, &w, dims, x_in, Some(x_out), la, attn_spare, tmp.0, tmp.1);
            add_since(&mut layer_comm[l], &tp_counters(dev, tp), &before);
            if let Some(slot) = a.compact.get_mut(l) {
                let copy = la.stash(dev, precision);
                *stashed += copy.iter().map(Stash::bytes).sum::<usize>();
                *peak_stashed = (*peak_stashed).max(*stashed);
                *slot = Some(copy);
            }
        }
        if let Some(hd) = a.head.as_mut() {
            let lnf_w = lay.lnf();
            let x_last = &a.resid[lay.num_layers];
            let (lnf, mean, rstd) = (&mut hd.lnf, &mut hd.lnf_mean, &mut hd.lnf_rstd);
            ln_forward(dev, tp, sc, lnf, mean, rstd, x_last, &p[lnf_w], &p[lnf_w + 1], r.local, h);
            dev.round_to(&mut hd.lnf, precision);
            match tp.summa {
                None => {
                    let lnf = gathered(dev, tp, &hd.lnf, &mut hd.lnf_full);
                    dev.linear_forward(&mut hd.logits, lnf, &p[lay.head()], None, r.full, h, vl);
                }
                Some((s, _)) => {
                    let v = cfg.padded_vocab_size;
                    s.logits_forward(dev, &mut hd.logits, &hd.lnf, &p[lay.head()], r.full, h, v, sc);
                }
            }
        }
    }

    /// The vocab-parallel cross-entropy of a forward's logits against `labels` (sample-major):
    /// the max, target-logit and sum-exp all-reduces over the group. Returns the sum of the rows'
    /// losses and keeps the statistics for backward.
    fn cross_entropy_loss(&mut self, dev: &D, tp: TensorParallel, index: usize, labels: &[u32]) -> f64 {
        let vocab_start = self.logits_start();
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        let a = &mut self.pool[index].1;
        let r = a.rows;
        let hd = a.head.as_mut().expect("the last chunk has a head");
        // The vocabulary is split over the group under 1-D, over the row under SUMMA.
        let comm = tp.summa.map_or(tp.comm, |(s, _)| s.row);
        let mine = &labels[r.first_sample * r.seq..(r.first_sample + r.sub_batch) * r.seq];
        reorder_to_rows(&mut hd.targets, mine, r.sub_batch, r.seq);
        dev.cross_entropy_max(&hd.logits, r.full, vl, &mut hd.ce_max);
        comm.all_reduce(&mut hd.ce_max, ReduceOp::Max);
        let (sum_exp, target_logit) = hd.ce_stats.split_at_mut(r.full);
        dev.cross_entropy_partials(&hd.logits, &hd.targets, vocab_start, r.full, vl, &hd.ce_max, sum_exp, target_logit);
        // Sum-exp and target logit travel in one all-reduce.
        comm.all_reduce(&mut hd.ce_stats, ReduceOp::Sum);
        let (sum_exp, target_logit) = hd.ce_stats.split_at(r.full);
        let loss: f64 = (0..r.full).map(|i| sum_exp[i].ln() + hd.ce_max[i] - target_logit[i]).sum();
        // Under SUMMA each rank has its batch block's loss: sum the blocks of the micro-batch.
        match tp.summa {
            None => loss,
            Some((s, depth)) => depth.sum_f64(s.col.sum_f64(loss)),
        }
    }

    /// Backward of micro-batch `key` through this chunk, adding gradients into `params.grads`
    /// scaled by `grad_scale` (1 / tokens in the global batch, so micro-batches accumulate to the
    /// mean). The last chunk starts from its loss; the others from `d_hidden`, the gradient of
    /// their output. `ready` is told, in order, each range of parameters whose gradients this call
    /// will not touch again (so data-parallel reduction of them can start). Copies the gradient
    /// of the chunk's input for the previous stage into `d_input` (every chunk but the first),
    /// and frees the micro-batch's activations.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        d_hidden: Option<&D::Buf>,
        d_input: Option<&mut D::Buf>,
        grad_scale: f32,
        ready: &mut dyn FnMut(&ParamSet<D>, Range<usize>),
    ) {
        let index = self.held(key);
        let (vocab_start, logits_start) = (self.vocab_start(), self.logits_start());
        let (cfg, lay, precision, mp) = (&self.cfg, self.layout, self.precision, self.mp);
        let wd = Widths::new(cfg, &mp);
        let (h, f, vl) = (wd.h, wd.f, wd.vl);
        let num_params = self.params.info.len();
        let a = &mut self.pool[index].1;
        let (spare, spare_attention, sc) = (&mut self.spare, &mut self.spare_attention, &mut self.scratch);
        let layer_comm = &mut self.layer_comm;
        let stashed = &mut self.stashed;
        let r = a.rows;
        let shape = AttentionShape { batch: r.sub_batch, seq: r.seq, heads: wd.heads, head_dim: cfg.head_dim() };

        if let Some(hd) = a.head.as_mut() {
            // Output layer (tied to the word embedding) and final LayerNorm.
            let (sum_exp, _) = hd.ce_stats.split_at(r.full);
            dev.cross_entropy_backward(
                &mut hd.logits,
                &hd.targets,
                logits_start,
                r.full,
                vl,
                &hd.ce_max,
                sum_exp,
                grad_scale,
            );
            let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
            let g = &mut self.params.grads;
            let d_lnf = match tp.summa {
                None => {
                    let lnf = hd.lnf_full.as_ref().unwrap_or(&hd.lnf);
                    let (d, dw) = (&mut a.d_h_full, &mut g[lay.head()]);
                    dev.linear_backward(Some(d), dw, None, &hd.logits, lnf, &p[lay.head()], r.full, h, vl);
                    reduced(dev, tp, &mut a.d_h_full, &mut a.d_h_local)
                }
                Some((s, _)) => {
                    let (d, dw, v) = (&mut a.d_h_full, &mut g[lay.head()], cfg.padded_vocab_size);
                    s.logits_backward(dev, d, dw, &hd.logits, &hd.lnf, &p[lay.head()], r.full, h, v, sc);
                    &a.d_h_full
                }
            };
            dev.fill(&mut a.d_resid, 0.0);
            let lnf_w = lay.lnf();
            let x_last = &a.resid[lay.num_layers];
            let (mean, rstd) = (&hd.lnf_mean, &hd.lnf_rstd);
            let gs = pair_mut(g, lnf_w, lnf_w + 1);
            ln_backward(dev, tp, sc, &mut a.d_resid, gs, d_lnf, x_last, &p[lnf_w], mean, rstd, r.local, h);
            // The tied copy (last stage only) is final too; the first stage's word embedding is
            // final after the embedding backward below.
            let end = if lay.first { lnf_w + 2 } else { num_params };
            ready(&self.params, lnf_w..end);
        } else {
            let d_hidden = d_hidden.expect("a chunk before the last needs its output's gradient");
            assert_eq!(dev.len(d_hidden), dev.len(&a.d_resid), "the gradient does not match the chunk's hidden states");
            dev.copy(&mut a.d_resid, 0, d_hidden, 0, dev.len(d_hidden));
        }

        for l in (0..lay.num_layers).rev() {
            let before = tp_counters(dev, tp);
            {
                let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
                let g = &mut self.params.grads;
                let w = |k| &p[lay.layer(l, k)];
                let x_in = &a.resid[l];
                // Rebuild what recomputation dropped: the whole layer from its input (full), or
                // the attention core from the saved QKV (selective), into the spare set.
                // Under 16-bit storage the layer's copy is restored into the spare set first.
                let stash = a.compact.get_mut(l).and_then(Option::take);
                let (la, attn, lse): (&LayerActs<D::Buf>, &D::Buf, &D::Buf) =
                    match (a.layers.get(l), spare.as_mut(), stash) {
                        (Some(la), _, _) if la.attn.is_some() => {
                            (la, la.attn.as_ref().expect("kept"), la.lse.as_ref().expect("kept"))
                        }
                        (Some(la), _, _) => {
                            let (_, attn, lse) =
                                spare_attention.as_mut().expect("selective recompute has a spare attention");
                            dev.attention_forward(attn, lse, &la.qkv, shape);
                            dev.round_to(attn, precision);
                            (la, &*attn, &*lse)
                        }
                        (None, Some((_, sp)), Some(stash)) => {
                            sp.unstash(dev, &stash, precision);
                            *stashed -= stash.iter().map(Stash::bytes).sum::<usize>();
                            let sp = &*sp;
                            match (sp.attn.as_ref(), sp.lse.as_ref()) {
                                (Some(attn), Some(lse)) => (sp, attn, lse),
                                _ => {
                                    let (_, attn, lse) =
                                        spare_attention.as_mut().expect("selective recompute has a spare attention");
                                    dev.attention_forward(attn, lse, &sp.qkv, shape);
                                    dev.round_to(attn, precision);
                                    (sp, &*attn, &*lse)
                                }
                            }
                        }
                        (None, Some((_, sp)), None) => {
                            let dims = Dims { rows: r, shape, wd, precision };
                            layer_forward(
                                dev,
                                tp,
                                sc,
                                &w,
                                dims,
                                x_in,
                                None,
                                sp,
                                None,
                                &mut a.tmp_full,
                                &mut a.tmp_local,
                            );
                            let sp = &*sp;
                            (sp, sp.attn.as_ref().expect("spare attn"), sp.lse.as_ref().expect("spare lse"))
                        }
                        _ => unreachable!("recomputation has a spare layer"),
                    };
                // MLP: d_resid holds the gradient of the block's output (this rank's rows).
                let gs = pair_mut(g, lay.layer(l, FC2_W), lay.layer(l, FC2_B));
                let d_out = (&a.d_resid, &mut a.d_full);
                linear_out_backward(dev, tp, sc, &mut a.d_ffn, gs, d_out, &la.gelu, w(FC2_W), r, (f, h));
                dev.gelu_backward(&mut a.d_ffn2, &la.fc1, &a.d_ffn);
                {
                    let gs = pair_mut(g, lay.layer(l, FC1_W), lay.layer(l, FC1_B));
                    let d = (&mut a.d_h_full, &mut a.d_h_local);
                    let ln2 = (&la.ln2, &la.ln2_full);
                    let d_ln2 = linear_in_backward(dev, tp, sc, d, gs, &a.d_ffn2, ln2, w(FC1_W), r, (h, f));
                    let gs = pair_mut(g, lay.layer(l, LN2_W), lay.layer(l, LN2_B));
                    let (mean, rstd) = (&la.ln2_mean, &la.ln2_rstd);
                    ln_backward(
                        dev,
                        tp,
                        sc,
                        &mut a.d_resid,
                        gs,
                        d_ln2,
                        &la.resid_mid,
                        w(LN2_W),
                        mean,
                        rstd,
                        r.local,
                        h,
                    );
                }
                // Attention: d_resid now holds the gradient of the mid-block residual.
                let gs = pair_mut(g, lay.layer(l, PROJ_W), lay.layer(l, PROJ_B));
                let d_mid = (&a.d_resid, &mut a.d_full);
                linear_out_backward(dev, tp, sc, &mut a.d_attn, gs, d_mid, attn, w(PROJ_W), r, (h, h));
                dev.attention_backward(&mut a.d_qkv, &a.d_attn, &la.qkv, attn, lse, shape);
                {
                    let gs = pair_mut(g, lay.layer(l, QKV_W), lay.layer(l, QKV_B));
                    let d = (&mut a.d_h_full, &mut a.d_h_local);
                    let ln1 = (&la.ln1, &la.ln1_full);
                    let d_ln1 = linear_in_backward(dev, tp, sc, d, gs, &a.d_qkv, ln1, w(QKV_W), r, (h, 3 * h));
                    let gs = pair_mut(g, lay.layer(l, LN1_W), lay.layer(l, LN1_B));
                    let (mean, rstd) = (&la.ln1_mean, &la.ln1_rstd);
                    ln_backward(dev, tp, sc, &mut a.d_resid, gs, d_ln1, x_in, w(LN1_W), mean, rstd, r.local, h);
                }
            }
            add_since(&mut layer_comm[l], &tp_counters(dev, tp), &before);
            ready(&self.params, lay.layer_params(l));
        }
        if lay.first {
            let g = &mut self.params.grads;
            match (tp.summa, mp.summa) {
                (Some((s, _)), Some(c)) => {
                    // Position rows: this block's gradient, summed down the column into the shard.
                    let mut dwpe = dev.alloc(cfg.max_position_embeddings * wd.hr);
                    dev.position_backward(&mut dwpe, &a.d_resid, r.sub_batch, 0, r.seq, wd.hr);
                    summa::scatter_stacked_add(dev, s.col, &dwpe, &mut g[Layout::WPE]);
                    // Word rows: every batch block of the depth layer against this vocabulary block.
                    let mut blocks = vec![0f32; c.q * r.full * wd.hr];
                    s.col.all_gather(&summa::host(dev, &a.d_resid), &mut blocks);
                    let rows = batch_blocks_to_rows(&blocks, c.q, r.sub_batch, r.seq, wd.hr);
                    let emb = a.emb_full.as_mut().expect("the first SUMMA chunk has an embedding buffer");
                    dev.upload(emb, &rows);
                    let bd = r.batch / c.depth;
                    let mine = &a.tokens[c.dep * bd * r.seq..(c.dep + 1) * bd * r.seq];
                    dev.embedding_backward(&mut g[Layout::WTE], emb, mine, vocab_start, bd, r.seq, wd.hr);
                }
                _ => {
                    dev.position_backward(&mut g[Layout::WPE], &a.d_resid, r.batch, r.t0, r.positions, h);
                    let d_emb = gathered(dev, tp, &a.d_resid, &mut a.d_full);
                    dev.embedding_backward(&mut g[Layout::WTE], d_emb, &a.tokens, vocab_start, r.batch, r.seq, h);
                }
            }
            ready(&self.params, Layout::WTE..Layout::WPE + 1);
        } else {
            let d = d_input.expect("a chunk after the first needs a buffer for its input's gradient");
            assert_eq!(dev.len(d), dev.len(&a.d_resid), "the input-gradient buffer does not match the hidden states");
            dev.copy(d, 0, &a.d_resid, 0, dev.len(d));
        }
        self.release(index);
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
        match self.forward_micro(dev, tp, usize::MAX, tokens, None, Some(labels), batch, seq, None) {
            ChunkOutput::Loss(loss) => {
                let index = self.held(usize::MAX);
                self.release(index);
                loss
            }
            ChunkOutput::Hidden => unreachable!("the whole model ends in its loss"),
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
        let loss = match self.forward_micro(dev, tp, 0, tokens, None, Some(labels), batch, seq, None) {
            ChunkOutput::Loss(loss) => loss,
            ChunkOutput::Hidden => unreachable!("forward_backward needs the whole model"),
        };
        self.backward_micro(dev, tp, 0, None, None, grad_scale, ready);
        loss
    }
}

/// Rows `t * (q * sub) + b` of `width` (a depth layer's rows) regrouped into `q` blocks of
/// `sub` samples each, block `l` holding samples `l * sub..` in row order `t * sub + b`.
fn rows_to_batch_blocks(rows: &[f32], q: usize, sub: usize, seq: usize, width: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows.len()];
    for l in 0..q {
        for t in 0..seq {
            for b in 0..sub {
                let src = (t * q * sub + l * sub + b) * width;
                let dst = (l * seq * sub + t * sub + b) * width;
                out[dst..dst + width].copy_from_slice(&rows[src..src + width]);
            }
        }
    }
    out
}

/// The inverse of `rows_to_batch_blocks`.
fn batch_blocks_to_rows(blocks: &[f32], q: usize, sub: usize, seq: usize, width: usize) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len()];
    for l in 0..q {
        for t in 0..seq {
            for b in 0..sub {
                let dst = (t * q * sub + l * sub + b) * width;
                let src = (l * seq * sub + t * sub + b) * width;
                out[dst..dst + width].copy_from_slice(&blocks[src..src + width]);
            }
        }
    }
    out
}

/// Whether parameter `name` is read only as a GEMM operand (the linear layers' weight matrices)
/// or, for the word embedding, also by a lookup whose output is rounded.
fn is_gemm_operand(name: &str) -> bool {
    name == "embedding.word_embeddings.weight"
        || ["linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
}

/// The weights a pass reads: parameter `i` from the working copy if it has one, else the master.
struct Weights<'a, B> {
    working: Option<&'a [Option<B>]>,
    masters: &'a [B],
}

impl<B> std::ops::Index<usize> for Weights<'_, B> {
    type Output = B;
    fn index(&self, i: usize) -> &B {
        self.working.and_then(|w| w[i].as_ref()).unwrap_or(&self.masters[i])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;

    #[test]
    fn bf16_without_rounded_matrix_copies_computes_the_same_bits() {
        // Under bf16 the matrices and the word embedding are read as masters (the bf16 GEMM rounds
        // its operands; looked-up rows are rounded): the loss and every gradient equal those of a
        // model that keeps a rounded copy of every weight.
        let cfg = GptConfig {
            num_layers: 2,
            hidden_size: 64,
            num_attention_heads: 4,
            ffn_hidden_size: 256,
            max_position_embeddings: 16,
            vocab_size: 257,
            padded_vocab_size: 384,
            init_method_std: 0.02,
        };
        let dev = CpuDevice::new(2);
        dev.set_matmul_precision(Precision::Bf16);
        let (batch, seq) = (3usize, 16usize);
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 37 + 11) % 257) as u32).collect();
        let labels: Vec<u32> = (0..batch * seq).map(|i| ((i * 53 + 5) % 257) as u32).collect();
        let run = |keep_every_copy: bool| {
            let mut m = Gpt::new(&dev, cfg.clone(), 7);
            m.set_precision(&dev, Precision::Bf16);
            if keep_every_copy {
                let info = m.params.info.clone();
                let working = m.working.as_mut().expect("bf16 has a working copy");
                for (w, p) in working.iter_mut().zip(&info) {
                    w.get_or_insert_with(|| dev.alloc(p.numel()));
                }
                m.refresh_working_weights(&dev);
            }
            let loss =
                m.forward_backward(&dev, TensorParallel::single(), &tokens, &labels, batch, seq, 1.0, &mut |_, _| {});
            (loss, m.params.grads.clone(), m.working_bytes(&dev))
        };
        let (lean, full) = (run(false), run(true));
        assert_eq!(lean.0.to_bits(), full.0.to_bits(), "loss {} vs {}", lean.0, full.0);
        for (i, (a, b)) in lean.1.iter().zip(&full.1).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "gradient {i} differs");
        }
        assert!(lean.2 * 10 < full.2, "working copy {} bytes, not far below {}", lean.2, full.2);
    }
}
