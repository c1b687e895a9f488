//! The buffers a chunk keeps per micro-batch: the row counts and widths of this rank's share,
//! each layer's saved activations (and their 16-bit copies under mixed precision), the head's
//! logits (bf16 under bf16 mixed precision) and cross-entropy statistics, and the gradient buffers
//! backward reuses layer after layer.

use crate::device::Device;
use crate::model::{ChunkPlan, GptConfig, ModelParallel, Normalization, Recompute};
use crate::parallel::context::HeadsScratch;
use crate::parallel::context_gather::BlockScratch;
use crate::real::Precision;

/// Row counts of one micro-batch on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rows {
    pub(super) batch: usize,
    pub(super) seq: usize,
    /// The samples whose rows this rank holds: the whole micro-batch under 1-D, this rank's
    /// batch block (`batch / (d q)`) under SUMMA.
    pub(super) sub_batch: usize,
    /// The first of those samples.
    pub(super) first_sample: usize,
    /// All rows, `sub_batch * seq` (inputs of the column-parallel layers).
    pub(super) full: usize,
    /// Rows of the residual stream on this rank (`full / tp` under sequence parallelism).
    pub(super) local: usize,
    /// The first position of this rank's residual rows.
    pub(super) t0: usize,
    /// Positions in this rank's residual rows.
    pub(super) positions: usize,
}

impl Rows {
    pub(super) fn new(mp: &ModelParallel, batch: usize, seq: usize) -> Rows {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let positions = if sp { seq / mp.tp_size } else { seq };
        let t0 = if sp { mp.tp_rank * positions } else { 0 };
        let sub_batch = batch / mp.batch_split();
        let first_sample = mp.summa.map_or(0, |c| c.batch_block() * sub_batch);
        Rows { batch, seq, sub_batch, first_sample, full: sub_batch * seq, local: sub_batch * positions, t0, positions }
    }
}

/// Widths of one rank's activations: the residual stream (`h`, or `h/q` under SUMMA), the whole
/// product widths the parallel linear layers divide (`attn` heads x head dim, `qkv` rows, `fc1`
/// rows, the MLP's `f`), this rank's attention output (`al`), QKV block (`ql`), fc1 output
/// (`f1l`), MLP activation (`fl`) and logits (`vl`), and the query and key/value heads this rank
/// computes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Widths {
    pub(super) h: usize,
    pub(super) f: usize,
    pub(super) attn: usize,
    pub(super) qkv: usize,
    pub(super) fc1: usize,
    pub(super) hr: usize,
    pub(super) al: usize,
    pub(super) ql: usize,
    pub(super) f1l: usize,
    pub(super) fl: usize,
    pub(super) vl: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
}

impl Widths {
    pub(super) fn new(cfg: &GptConfig, mp: &ModelParallel) -> Widths {
        let s = mp.feature_split();
        let h = cfg.hidden_size;
        let (attn, qkv, fc1) = (cfg.attention_width(), cfg.qkv_rows(), cfg.fc1_rows());
        Widths {
            h,
            f: cfg.ffn_hidden_size,
            attn,
            qkv,
            fc1,
            hr: if mp.summa.is_some() { h / s } else { h },
            al: attn / s,
            ql: qkv / s,
            f1l: fc1 / s,
            fl: cfg.ffn_hidden_size / s,
            vl: cfg.padded_vocab_size / s,
            heads: cfg.num_attention_heads / s,
            kv_heads: cfg.kv_heads() / s,
        }
    }
}

/// A norm's output on this rank's rows with its per-row mean (LayerNorm's; RMSNorm has none)
/// and reciprocal std, and under sequence parallelism the output all-gathered to all rows (`full`).
pub(super) struct LnActs<B> {
    pub(super) out: B,
    pub(super) mean: Option<B>,
    pub(super) rstd: B,
    pub(super) full: Option<B>,
}

impl<B> LnActs<B> {
    /// What a 1-D linear layer after the norm multiplies: the output on all rows (gathered under
    /// sequence parallelism), else this rank's.
    pub(super) fn gemm_input(&self) -> &B {
        self.full.as_ref().unwrap_or(&self.out)
    }

    /// The buffers of a norm (`cfg`'s) over `rows` rows of width `h`, of which this rank holds
    /// `local`: the output in `precision` storage (`Memory::alloc_in`), the statistics in f32.
    pub(super) fn new<D: Device<Buf = B>>(
        dev: &D,
        (cfg, rows, local): (&GptConfig, usize, usize),
        h: usize,
        sequence_parallel: bool,
        precision: Precision,
    ) -> Self {
        LnActs {
            out: dev.alloc_in(local * h, precision),
            mean: alloc_if(dev, cfg.arch.normalization == Normalization::LayerNorm, local),
            rstd: dev.alloc(local),
            full: sequence_parallel.then(|| dev.alloc_in(rows * h, precision)),
        }
    }

    /// Bytes of the buffers.
    fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        dev.bytes(&self.out)
            + self.mean.as_ref().map_or(0, |m| dev.bytes(m))
            + dev.bytes(&self.rstd)
            + self.full.as_ref().map_or(0, |f| dev.bytes(f))
    }
}

/// What one block keeps from forward for its backward.
pub(super) struct LayerActs<B> {
    pub(super) ln1: LnActs<B>,
    pub(super) qkv: B,
    /// The attention output and its log-sum-exp; None under selective recompute, where backward
    /// recomputes them into the chunk's spare buffers.
    pub(super) attn: Option<B>,
    pub(super) lse: Option<B>,
    pub(super) resid_mid: B,
    pub(super) ln2: LnActs<B>,
    pub(super) fc1: B,
    pub(super) gelu: B,
}

impl<B> LayerActs<B> {
    /// One layer's saved activations, in `precision` storage (`Memory::alloc_in`) but for the
    /// f32 statistics; `with_attention` false leaves out the attention output.
    pub(super) fn new<D: Device<Buf = B>>(
        dev: &D,
        cfg: &GptConfig,
        mp: &ModelParallel,
        (rows, precision): (Rows, Precision),
        with_attention: bool,
    ) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let Widths { hr: h, al, ql, f1l, fl, heads, .. } = Widths::new(cfg, mp);
        let (m, ml) = (rows.full, rows.local);
        let lse = rows.sub_batch * heads * rows.seq;
        let act = |len| dev.alloc_in(len, precision);
        LayerActs {
            ln1: LnActs::new(dev, (cfg, m, ml), h, sp, precision),
            qkv: act(m * ql),
            attn: with_attention.then(|| act(m * al)),
            lse: alloc_if(dev, with_attention, lse),
            resid_mid: act(ml * h),
            ln2: LnActs::new(dev, (cfg, m, ml), h, sp, precision),
            fc1: act(m * f1l),
            gelu: act(m * fl),
        }
    }
}

impl<B> LayerActs<B> {
    /// Every buffer this layer holds, in a fixed order, each marked true when it holds
    /// activations (rounded to the compute format under mixed precision) and false for the f32
    /// statistics (LayerNorm mean and rstd, the attention's log-sum-exp).
    fn buffers(&self) -> Vec<(&B, bool)> {
        let mut out = vec![
            (&self.ln1.out, true),
            (&self.ln1.rstd, false),
            (&self.qkv, true),
            (&self.resid_mid, true),
            (&self.ln2.out, true),
            (&self.ln2.rstd, false),
            (&self.fc1, true),
            (&self.gelu, true),
        ];
        out.extend(self.ln1.mean.iter().chain(&self.ln2.mean).map(|b| (b, false)));
        out.extend(self.ln1.full.iter().chain(&self.ln2.full).chain(&self.attn).map(|b| (b, true)));
        out.extend(self.lse.iter().map(|b| (b, false)));
        out
    }

    /// The same buffers, in the same order, to write.
    fn buffers_mut(&mut self) -> Vec<&mut B> {
        let mut out = vec![
            &mut self.ln1.out,
            &mut self.ln1.rstd,
            &mut self.qkv,
            &mut self.resid_mid,
            &mut self.ln2.out,
            &mut self.ln2.rstd,
            &mut self.fc1,
            &mut self.gelu,
        ];
        out.extend(self.ln1.mean.iter_mut().chain(self.ln2.mean.iter_mut()));
        out.extend(self.ln1.full.iter_mut().chain(self.ln2.full.iter_mut()).chain(self.attn.iter_mut()));
        out.extend(self.lse.iter_mut());
        out
    }

    /// Bytes of the buffers this layer holds (for `--log-memory`).
    pub(super) fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.buffers().iter().map(|(b, _)| dev.bytes(b)).sum::<usize>()
    }

    /// Bytes of this layer's buffers held in 16 bits (activations) and f32 (statistics).
    pub(super) fn stash_bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.buffers().iter().map(|(b, half)| if *half { 2 } else { 4 } * dev.len(b)).sum()
    }

    /// This layer's saved buffers copied aside in the device's memory: activations as 16-bit
    /// copies (exact: under mixed precision every activation was rounded to `precision` where it
    /// was stored), statistics as f32. Writes into `reuse` (an earlier copy of a layer of the
    /// same shape) where given, so steps after the first allocate nothing.
    pub(super) fn stash<D: Device<Buf = B>>(
        &self,
        dev: &D,
        precision: Precision,
        reuse: Option<Vec<Stash<D>>>,
    ) -> Vec<Stash<D>> {
        let buffers = self.buffers();
        let fits = |s: &Vec<Stash<D>>| {
            s.len() == buffers.len()
                && s.iter().zip(&buffers).all(|(s, (b, half))| match s {
                    Stash::Half(h) => *half && dev.half_len(h) == dev.len(b),
                    Stash::Full(f) => !*half && dev.len(f) == dev.len(b),
                })
        };
        match reuse.filter(fits) {
            Some(mut copy) => {
                for (s, (b, _)) in copy.iter_mut().zip(buffers) {
                    match s {
                        Stash::Half(h) => dev.to_half_into(b, precision, h),
                        Stash::Full(f) => dev.copy(f, 0, b, 0, dev.len(b)),
                    }
                }
                copy
            }
            None => buffers
                .into_iter()
                .map(|(b, half)| {
                    if half {
                        Stash::Half(dev.to_half(b, precision))
                    } else {
                        let mut copy = dev.alloc(dev.len(b));
                        dev.copy(&mut copy, 0, b, 0, dev.len(b));
                        Stash::Full(copy)
                    }
                })
                .collect(),
        }
    }

    /// Restores what `stash` copied.
    pub(super) fn unstash<D: Device<Buf = B>>(&mut self, dev: &D, stash: &[Stash<D>], precision: Precision) {
        for (b, s) in self.buffers_mut().into_iter().zip(stash) {
            match s {
                Stash::Half(h) => dev.load_half(h, precision, b),
                Stash::Full(f) => dev.copy(b, 0, f, 0, dev.len(f)),
            }
        }
    }
}

/// The layer recomputation rebuilds into (and 16-bit storage computes in), with the rows it was
/// made for.
pub(super) type SpareLayer<B> = Option<(Rows, LayerActs<B>)>;

/// The attention output and log-sum-exp selective recompute rebuilds into, with their rows.
pub(super) type SpareAttention<B> = Option<(Rows, B, B)>;

/// One saved buffer of a layer between its forward and its backward under mixed precision, in
/// the device's memory: activations in 16 bits, statistics in f32.
pub(super) enum Stash<D: Device> {
    Half(D::Half),
    Full(D::Buf),
}

impl<D: Device> Stash<D> {
    pub(super) fn bytes(&self, dev: &D) -> usize {
        match self {
            Stash::Half(h) => 2 * dev.half_len(h),
            Stash::Full(f) => dev.bytes(f),
        }
    }
}

/// The last chunk's final LayerNorm, logits and cross-entropy state.
pub(super) struct HeadActs<D: Device> {
    pub(super) lnf: LnActs<D::Buf>,
    pub(super) logits: D::Buf,
    /// Labels in row order (`t * batch + b`) and the per-row cross-entropy statistics, on the
    /// device: each row's max, then each row's sum of exponentials and target logit.
    pub(super) targets: Vec<u32>,
    pub(super) ce_max: D::Scalars,
    pub(super) ce_stats: D::Scalars,
}

/// Every activation and scratch buffer of one micro-batch in flight through this chunk.
pub(super) struct Activations<D: Device> {
    pub(super) rows: Rows,
    /// The residual stream entering each block, and (last) leaving the chunk's final block.
    pub(super) resid: Vec<D::Buf>,
    pub(super) layers: Vec<LayerActs<D::Buf>>,
    pub(super) head: Option<HeadActs<D>>,
    /// The first chunk's tokens (its embedding backward needs them).
    pub(super) tokens: Vec<u32>,
    /// `--reset-attention-mask`: the document start of each position of this rank's samples
    /// (sample-major); empty otherwise.
    pub(super) starts: Vec<u32>,
    /// `--reset-position-ids`: each token's position in its document (sample-major).
    pub(super) positions: Vec<u32>,
    /// Sequence parallel, first chunk: the embedding before its reduce-scatter.
    pub(super) emb_full: Option<D::Buf>,
    /// Outputs of the row-parallel layers before their reduction (all rows)...
    pub(super) tmp_full: D::Buf,
    /// ...and after it, under sequence parallelism (this rank's rows).
    pub(super) tmp_local: Option<D::Buf>,
    pub(super) grad: GradBufs<D::Buf>,
    /// Mixed precision (without full recompute): each layer's saved activations between its
    /// forward and its backward, in 16 bits; the layer computes in the chunk's spare set.
    pub(super) compact: Vec<Option<Vec<Stash<D>>>>,
}

/// The gradient buffers of one micro-batch's backward, reused layer after layer.
pub(super) struct GradBufs<B> {
    /// The gradient of the residual stream on this rank's rows.
    pub(super) d_resid: B,
    /// Sequence parallel: the residual gradient gathered to all rows.
    pub(super) d_full: Option<B>,
    /// Gradients of LayerNorm outputs (all rows), and their reduce-scatter (SP).
    pub(super) d_h_full: B,
    pub(super) d_h_local: Option<B>,
    pub(super) d_attn: B,
    pub(super) d_qkv: B,
    pub(super) d_ffn: B,
    pub(super) d_ffn2: B,
    /// The gradient of a residual branch before its dropout (this rank's rows), made at the
    /// first backward that drops.
    pub(super) d_drop: Option<B>,
}

/// The precision the head's logits (and, in place, their gradient) are held in: bf16 under bf16
/// mixed precision, as Megatron's (the output of a bf16 GEMM, which the cross-entropy reads and
/// turns into its gradient for the backward GEMMs; its statistics stay f64 on the GPU); f32
/// otherwise (fp16 keeps them f32, as it always has).
pub(super) fn logits_precision(precision: Precision) -> Precision {
    match precision {
        Precision::Bf16 => Precision::Bf16,
        Precision::F32 | Precision::F16 => Precision::F32,
    }
}

/// A buffer of `len` elements when `needed`.
pub(super) fn alloc_if<D: Device>(dev: &D, needed: bool, len: usize) -> Option<D::Buf> {
    needed.then(|| dev.alloc(len))
}

impl<D: Device> Activations<D> {
    /// Bytes of the buffers this activation set holds.
    pub(super) fn bytes(&self, dev: &D) -> usize {
        let opt = |b: &Option<D::Buf>| b.as_ref().map_or(0, |b| dev.bytes(b));
        let layers: usize = self.layers.iter().map(|l| l.bytes(dev)).sum();
        let resid: usize = self.resid.iter().map(|b| dev.bytes(b)).sum();
        let head = self.head.as_ref().map_or(0, |h| h.lnf.bytes(dev) + dev.bytes(&h.logits));
        let g = &self.grad;
        let scratch = [&self.tmp_full, &g.d_resid, &g.d_h_full, &g.d_attn, &g.d_qkv, &g.d_ffn, &g.d_ffn2];
        let scratch = scratch.iter().map(|b| dev.bytes(b)).sum::<usize>()
            + opt(&self.emb_full)
            + opt(&g.d_drop)
            + opt(&self.tmp_local)
            + opt(&g.d_full)
            + opt(&g.d_h_local);
        let compact: usize = self.compact.iter().flatten().flatten().map(|s| s.bytes(dev)).sum();
        layers + resid + head + scratch + compact
    }
}

impl<D: Device> Activations<D> {
    /// The activation set of one micro-batch of `batch` samples of `seq` tokens through the chunk
    /// `plan` (layers kept as `recompute` and `compact` decide). Activations and their gradients
    /// are held in `precision` storage (`Memory::alloc_in`), the logits in `logits_precision`'s;
    /// f32 are the statistics and the buffers reduced over the tensor-parallel group that are not
    /// sums with one term per element: the row-parallel outputs before their reduction and the
    /// gradients of LayerNorm outputs where they are reduced.
    pub(super) fn new(
        dev: &D,
        cfg: &GptConfig,
        mp: &ModelParallel,
        plan: &ChunkPlan,
        (recompute, compact, precision): (Recompute, bool, Precision),
        batch: usize,
        seq: usize,
    ) -> Self {
        let sp = mp.sequence_parallel && mp.tp_size > 1;
        let rows = Rows::new(mp, batch, seq);
        let Widths { hr: h, al, ql, f1l, fl, vl, .. } = Widths::new(cfg, mp);
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
            Recompute::Selective => {
                plan.layers.clone().map(|_| LayerActs::new(dev, cfg, mp, (rows, precision), false)).collect()
            }
            Recompute::None => {
                plan.layers.clone().map(|_| LayerActs::new(dev, cfg, mp, (rows, precision), true)).collect()
            }
        };
        let act = |len| dev.alloc_in(len, precision);
        // Reduced gradients of LayerNorm outputs are f32 unless one rank holds the whole sum.
        let unreduced = mp.tp_size == 1 && mp.summa.is_none();
        let head = plan.last.then(|| HeadActs {
            lnf: LnActs::new(dev, (cfg, m, ml), h, sp, precision),
            logits: dev.alloc_in(m * vl, logits_precision(precision)),
            targets: vec![0; m],
            ce_max: dev.scalars(m),
            ce_stats: dev.scalars(2 * m),
        });
        Activations {
            rows,
            resid: (0..=plan.layers.len()).map(|_| act(ml * h)).collect(),
            layers,
            head,
            tokens: vec![0; batch * seq],
            starts: Vec::new(),
            positions: Vec::new(),
            // The word rows of this vocabulary shard, zero elsewhere: their sum is exact in any type.
            emb_full: emb_rows.map(|rows| act(rows * h)),
            tmp_full: dev.alloc(m * h),
            tmp_local: alloc_if(dev, sp, ml * h),
            grad: GradBufs {
                d_resid: act(ml * h),
                d_full: sp.then(|| act(m * h)),
                d_h_full: if unreduced { act(m * h) } else { dev.alloc(m * h) },
                d_h_local: alloc_if(dev, sp, ml * h),
                d_attn: act(m * al),
                d_qkv: act(m * ql),
                d_ffn: act(m * fl),
                d_ffn2: act(m * f1l),
                d_drop: None,
            },
            compact: if compact { plan.layers.clone().map(|_| None).collect() } else { Vec::new() },
        }
    }
}

/// The context-parallel attention's buffers, reused across layers and micro-batches: the
/// all-to-all swap's and the blocks'.
pub(super) struct ContextScratch<B> {
    pub(super) heads: HeadsScratch<B>,
    pub(super) blocks: BlockScratch<B>,
}

impl<B> Default for ContextScratch<B> {
    fn default() -> Self {
        ContextScratch { heads: HeadsScratch::default(), blocks: BlockScratch::default() }
    }
}

impl<B> ContextScratch<B> {
    /// Bytes held (for `--log-memory`).
    pub(super) fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.heads.bytes(dev) + self.blocks.bytes(dev)
    }
}
