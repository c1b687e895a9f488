//! `trident plan`: enumerates tensor/pipeline/data-parallel layouts (with virtual stages,
//! micro-batch size, recompute and ZeRO-1) for a model on N GPUs, prices each one's memory per GPU
//! and iteration time with the closed-form model of `cost.rs` on a `hardware::Machine`, drops the
//! ones that do not fit, and ranks the rest. Pure functions: no MPI, no device, so it runs on a
//! login node and in the `--no-default-features` build.
//!
//! The layout carries a `TpMode`: Megatron's 1-D split, or 2-D / 2.5-D SUMMA grids
//! (docs/design.md) with their own communication volumes and memory divisors.

pub mod cost;
pub mod efficiency;
pub mod hardware;
pub mod models;
pub mod report;
pub mod request;

use crate::error::{Error, Result};
use crate::model::Recompute;
use cost::{Memory, Timing};
use hardware::{Machine, GIB};
use models::Shape;
use std::collections::BTreeMap;

/// Number format of weights and activations (`--precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Bf16,
    Fp16,
    Fp32,
}

impl Precision {
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            "fp32" => Ok(Precision::Fp32),
            _ => Err(Error::flag("--precision", format!("'{s}'"), "bf16, fp16 or fp32")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }
}

/// How a layer's matrices are split over the tensor-parallel group (`--tensor-parallel-mode`):
/// Megatron's 1-D split, or a SUMMA grid of q x q (2-D, depth 1) or d stacked q x q grids (2.5-D)
/// whose weights are split q² ways and whose activations and work are split over all d q² ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpMode {
    OneD,
    Summa { q: usize, depth: usize },
}

impl TpMode {
    /// Depth copies of each weight shard (1 except under 2.5-D).
    pub fn summa_depth(self) -> usize {
        match self {
            TpMode::OneD => 1,
            TpMode::Summa { depth, .. } => depth,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TpMode::OneD => "1d",
            TpMode::Summa { depth: 1, .. } => "2d",
            TpMode::Summa { .. } => "2.5d",
        }
    }

    /// The modes a tensor-parallel group of `t` ranks can take: 1-D, 2-D when t = q², and 2.5-D
    /// for every depth d >= 2 with t = d q² (q >= 2).
    pub fn for_group(t: usize) -> Vec<TpMode> {
        let mut out = vec![TpMode::OneD];
        for depth in 1..=t {
            if !t.is_multiple_of(depth) {
                continue;
            }
            let r = t / depth;
            let q = (r as f64).sqrt().round() as usize;
            if q >= 2 && q * q == r {
                out.push(TpMode::Summa { q, depth });
            }
        }
        out
    }
}

/// The pipeline schedule (`--pipeline-schedule`). `OneF1B` is plain 1F1B with one model chunk per
/// rank and Megatron's interleaved 1F1B with more (`Layout::vpp`); GPipe runs every forward first;
/// zero-bubble is Qi et al.'s ZB-H1 (backward split into input and weight gradients, the weight
/// gradients filling the bubble) and ZB-V (two chunks per rank in a V), which
/// `train --pipeline-schedule zb-h1|zb-v` runs; every pipeline is priced under 1F1B, interleaved
/// 1F1B, zb-h1 and zb-v unless the schedule is pinned (GPipe only where pinned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    OneF1B,
    GPipe,
    ZeroBubble,
    ZeroBubbleV,
}

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule> {
        match s {
            "1f1b" | "interleaved-1f1b" => Ok(Schedule::OneF1B),
            "gpipe" => Ok(Schedule::GPipe),
            "zb-h1" | "zero-bubble" => Ok(Schedule::ZeroBubble),
            "zb-v" => Ok(Schedule::ZeroBubbleV),
            _ => Err(Error::flag(
                "--pipeline-schedule",
                format!("'{s}'"),
                "gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v or megatron",
            )),
        }
    }

    /// The schedule's name for a layout with `vpp` chunks per rank.
    pub fn name(self, vpp: usize) -> &'static str {
        match self {
            Schedule::OneF1B if vpp > 1 => "interleaved-1f1b",
            Schedule::OneF1B => "1f1b",
            Schedule::GPipe => "gpipe",
            Schedule::ZeroBubble => "zb-h1",
            Schedule::ZeroBubbleV => "zb-v",
        }
    }

    /// The share of 1F1B's bubble (per virtual stage) the schedule leaves: a third for both
    /// zero-bubble schedules (Qi et al. 2023, §3: forward, input-gradient and weight-gradient
    /// passes taken as equal; zb-v's two chunks per rank halve it again through `Layout::vpp`).
    pub fn bubble_share(self) -> f64 {
        match self {
            Schedule::ZeroBubble | Schedule::ZeroBubbleV => 1.0 / 3.0,
            Schedule::OneF1B | Schedule::GPipe => 1.0,
        }
    }

    /// The model chunks per pipeline rank the schedule runs, where it fixes them.
    pub fn fixed_chunks(self) -> Option<usize> {
        match self {
            Schedule::GPipe | Schedule::ZeroBubble => Some(1),
            Schedule::ZeroBubbleV => Some(2),
            Schedule::OneF1B => None,
        }
    }
}

/// One way to lay a training job out on the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tp_mode: TpMode,
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    /// Virtual pipeline stages (model chunks) per pipeline rank; 1 is plain 1F1B.
    pub vpp: usize,
    pub micro_batch: usize,
    pub recompute: Recompute,
    pub zero1: bool,
    /// ZeRO-2 (with `zero1`): the gradients sharded too, reduce-scattered every micro-batch.
    pub shard_grads: bool,
    pub sequence_parallel: bool,
    pub schedule: Schedule,
    /// Context-parallel ranks splitting each sequence (Megatron's `--context-parallel-size`).
    pub cp: usize,
    /// Context parallelism's type: the all-to-all swap of positions for heads (`a2a`, what the
    /// search proposes: trident runs it on the device), or Megatron's `p2p` ring with its passes
    /// hidden behind attention (priced where `--cp-comm-type p2p` pins it).
    pub cp_a2a: bool,
}

impl Layout {
    /// Ranks holding the same weights, over which gradients are summed and ZeRO shards:
    /// data-parallel x context-parallel x (2.5-D) depth.
    pub fn replicas(&self) -> usize {
        self.dp * self.cp * self.tp_mode.summa_depth()
    }

    /// The factor by which TP divides a layer's weights (t for 1-D, q² for SUMMA: the depth
    /// layers of 2.5-D hold copies). Work and activations are split over all `tp` ranks.
    pub fn tp_degree(&self) -> usize {
        match self.tp_mode {
            TpMode::OneD => self.tp,
            TpMode::Summa { q, .. } => q * q,
        }
    }

    /// The SUMMA grid side and depth, if the layout has one.
    pub fn summa(&self) -> Option<(usize, usize)> {
        match self.tp_mode {
            TpMode::OneD => None,
            TpMode::Summa { q, depth } => Some((q, depth)),
        }
    }

    /// Micro-batches per iteration on each pipeline.
    pub fn micro_batches(&self, global_batch: usize) -> usize {
        global_batch / (self.dp * self.micro_batch)
    }
}

pub fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::Full => "full",
    }
}

/// The kernels and overlaps priced (`--attention-backend`, `--tp-comm-overlap`,
/// `--overlap-grad-reduce`, `--overlap-param-gather`). The default is what trident runs: flash
/// attention, no overlap beyond plain data parallelism's (its gradient all-reduce behind the
/// last backward). The overlaps are Megatron-LM's, for planning and comparing its runs: trident
/// runs `--overlap-grad-reduce` as priced, `--overlap-param-gather` with fp32 weights, and not
/// `--tp-comm-overlap`; the report says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Flash attention (no score matrix in memory), else Megatron 2021's unfused attention.
    pub flash_attention: bool,
    pub tp_comm_overlap: bool,
    pub overlap_grad_reduce: bool,
    pub overlap_param_gather: bool,
    /// Megatron's `--data-parallel-sharding-strategy optim_grads_params` (ZeRO-3 / FSDP: each
    /// layer's weights all-gathered before its forward and its backward, gradients sharded as
    /// ZeRO-2's, `Layout::shard_grads`); priced for comparison, not run.
    pub shard_params: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            flash_attention: true,
            tp_comm_overlap: false,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            shard_params: false,
        }
    }
}

/// Dimensions the user fixed; None lets the planner choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    pub micro_batch: Option<usize>,
    pub vpp: Option<usize>,
    /// `--context-parallel-size` (None: the search's choice).
    pub cp: Option<usize>,
    /// `--cp-comm-type`: `a2a` or `p2p` (None: a2a where the heads split, else p2p).
    pub cp_ring: Option<bool>,
    /// `--pipeline-schedule`: None considers 1F1B, interleaved 1F1B, zb-h1 and zb-v.
    pub schedule: Option<(Schedule, bool)>,
    /// `--pipeline-schedule megatron`: Megatron-LM's own schedules only (1F1B and interleaved
    /// 1F1B, what its published runs used), for comparing with them.
    pub megatron_schedules: bool,
    pub recompute: Option<Recompute>,
    pub zero1: Option<bool>,
    /// ZeRO-2 pinned on or off by `--data-parallel-sharding-strategy` (None: both priced where
    /// ZeRO-1 is on).
    pub shard_grads: Option<bool>,
    /// `--tensor-parallel-mode` (1d, 2d, 2.5d) and `--tesseract-depth`.
    pub tp_mode: Option<&'static str>,
    pub depth: Option<usize>,
}

/// Everything `plan` needs.
#[derive(Clone, Debug)]
pub struct Request {
    /// The model's name for the report (`--model`, or "custom").
    pub model_name: String,
    pub shape: Shape,
    pub gpus: usize,
    pub global_batch: usize,
    pub machine: Machine,
    pub precision: Precision,
    /// Fraction of GPU memory kept free for the runtime, communication buffers and fragmentation.
    pub memory_headroom: f64,
    /// Bytes per GPU the runtime holds before the model's first tensor (`--runtime-reserve-gib`):
    /// the CUDA / HIP context, NCCL / RCCL buffers of every communicator, library workspaces.
    pub runtime_reserve_bytes: f64,
    pub sequence_parallel: bool,
    pub features: Features,
    pub pins: Pins,
}

impl Request {
    pub fn usable_bytes(&self) -> f64 {
        self.machine.memory_bytes * (1.0 - self.memory_headroom) - self.runtime_reserve_bytes
    }
}

/// A priced layout.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub layout: Layout,
    pub memory: Memory,
    pub timing: Timing,
    pub executed_flops: f64,
    pub model_flops: f64,
    pub gpus: usize,
    pub global_batch: usize,
    pub seq_length: usize,
}

impl Candidate {
    pub fn iteration_s(&self) -> f64 {
        self.timing.iteration_s()
    }

    pub fn memory_gib(&self) -> f64 {
        self.memory.total_bytes() / GIB
    }

    /// Executed FLOPs (recompute included) per second per GPU, as the 2021 paper reports them.
    pub fn tflops_per_gpu(&self) -> f64 {
        self.executed_flops / self.iteration_s() / self.gpus as f64 / 1e12
    }

    /// Model FLOPs (72Bslh²(...), no recompute) per second per GPU: the numerator of MFU.
    pub fn model_tflops_per_gpu(&self) -> f64 {
        self.model_flops / self.iteration_s() / self.gpus as f64 / 1e12
    }

    pub fn tokens_per_s(&self) -> f64 {
        (self.global_batch * self.seq_length) as f64 / self.iteration_s()
    }

    pub fn micro_batches(&self) -> usize {
        self.layout.micro_batches(self.global_batch)
    }

    pub fn bubble_fraction(&self) -> f64 {
        let share = self.layout.schedule.bubble_share();
        share * (self.layout.pp as f64 - 1.0) / (self.layout.vpp * self.micro_batches()) as f64
    }
}

/// The outcome of planning: every layout that fits, best first, and what was dropped.
#[derive(Clone, Debug)]
pub struct Plan {
    pub ranked: Vec<Candidate>,
    /// Layouts priced (valid shapes), of which `ranked.len()` fit.
    pub considered: usize,
    /// Per (tp, pp): the fastest layout that fits, and the one that needs the least memory.
    pub by_tp_pp: BTreeMap<(usize, usize), (Option<Candidate>, Candidate)>,
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Why a tensor-parallel group of `t` ranks cannot sit on these GPUs, if it cannot.
fn tp_problem(req: &Request, t: usize) -> Option<String> {
    let g = req.machine.gpus_per_node;
    if t == 0 || !req.gpus.is_multiple_of(t) {
        return Some(format!("{t} does not divide {} GPUs", req.gpus));
    }
    if (t <= g && !g.is_multiple_of(t)) || (t > g && !t.is_multiple_of(g)) {
        return Some(format!("a group of {t} does not tile nodes of {g} GPUs"));
    }
    None
}

/// Why a tensor-parallel mode cannot split this model over `t` ranks, if it cannot.
fn mode_problem(req: &Request, t: usize, mode: TpMode) -> Option<String> {
    match mode {
        TpMode::OneD => one_d_problem(req, t),
        TpMode::Summa { q, .. } => summa_problem(req, q),
    }
}

/// Why Megatron's 1-D split over `t` ranks cannot split this model, if it cannot.
fn one_d_problem(req: &Request, t: usize) -> Option<String> {
    let s = &req.shape;
    if !s.num_attention_heads.is_multiple_of(t) {
        return Some(format!("{} attention heads are not divisible by {t}", s.num_attention_heads));
    }
    let groups = s.model().kv_heads();
    if !groups.is_multiple_of(t) {
        return Some(format!("{groups} query groups are not divisible by {t} (each rank holds whole groups)"));
    }
    if !s.ffn_hidden_size.is_multiple_of(t) {
        return Some(format!("the MLP width {} is not divisible by {t}", s.ffn_hidden_size));
    }
    if req.sequence_parallel && !s.seq_length.is_multiple_of(t) {
        return Some(format!("the sequence {} is not divisible by {t} (sequence parallelism)", s.seq_length));
    }
    None
}

/// Why a SUMMA grid of side q cannot split this model, if it cannot (the same rules as
/// `GptConfig::validate_summa`: heads by q, hidden and MLP widths by q²; the vocabulary pads to
/// a multiple of the grid).
fn summa_problem(req: &Request, q: usize) -> Option<String> {
    let s = &req.shape;
    let features = s.arch.features();
    if !features.is_empty() {
        return Some(format!(
            "trident's 2-D / 2.5-D tensor parallelism runs GPT-2's architecture only, not {}",
            features.join(", ")
        ));
    }
    if !s.num_attention_heads.is_multiple_of(q) {
        return Some(format!("{} attention heads are not divisible by q = {q}", s.num_attention_heads));
    }
    for (what, v) in [("hidden size", s.hidden_size), ("MLP width", s.ffn_hidden_size)] {
        if !v.is_multiple_of(q * q) {
            return Some(format!("the {what} {v} is not divisible by q² = {}", q * q));
        }
    }
    None
}

/// Why a pipeline size cannot split this model over the GPUs left by TP, if it cannot.
fn pp_problem(req: &Request, t: usize, p: usize) -> Option<String> {
    let layers = req.shape.num_layers;
    if p == 0 || !(req.gpus / t).is_multiple_of(p) {
        return Some(format!("{p} does not divide the {} GPUs left by tensor-parallel size {t}", req.gpus / t));
    }
    if p > layers || !layers.is_multiple_of(p) {
        return Some(format!("{layers} layers do not split evenly into {p} stages"));
    }
    None
}

/// "one model chunk", "two model chunks".
pub fn chunk_count(n: usize) -> &'static str {
    if n == 1 {
        "one model chunk"
    } else {
        "two model chunks"
    }
}

/// Why a virtual-stage count cannot be used under `schedule`, if it cannot (GPipe and zb-h1 run
/// one chunk per rank, zb-v two; trident's interleaved schedule needs equal chunks and a
/// micro-batch count that is a multiple of the pipeline size).
fn vpp_problem(req: &Request, schedule: Schedule, p: usize, v: usize, m: usize) -> Option<String> {
    if let Some(fixed) = schedule.fixed_chunks().filter(|&f| f != v) {
        return Some(format!("{} runs {} per pipeline rank", schedule.name(fixed), chunk_count(fixed)));
    }
    if matches!(req.pins.schedule, Some((Schedule::OneF1B, true))) && v == 1 {
        return Some("interleaved-1f1b needs two or more virtual stages per pipeline rank".into());
    }
    if v == 1 {
        return None;
    }
    if v == 0 || p == 1 {
        return Some("virtual stages need a pipeline (pipeline size above 1)".into());
    }
    if !req.shape.num_layers.is_multiple_of(p * v) {
        return Some(format!("{} layers do not split into {p} x {v} equal chunks", req.shape.num_layers));
    }
    if schedule == Schedule::OneF1B && (m < p || !m.is_multiple_of(p)) {
        return Some(format!("{m} micro-batches are not a multiple of the pipeline size {p}"));
    }
    None
}

/// Enumerates, prices and ranks every layout `req` allows: tensor-parallel sizes, then pipeline
/// sizes, micro-batch sizes and tensor-parallel modes, then (`Search::variants`) virtual stages,
/// recompute and ZeRO-1. A pinned value that cannot work is an error naming its flag; an unpinned
/// one is skipped. As Megatron's practice keeps tensor parallelism on a node's fast links, an
/// unpinned tensor-parallel group spans nodes only when no layout inside a node fits.
pub fn plan(req: &Request) -> Result<Plan> {
    check_request(req)?;
    let mut search = Search::default();
    let sizes = req.pins.tp.map(|t| vec![t]).unwrap_or_else(|| divisors(req.gpus));
    let (inside, beyond): (Vec<usize>, Vec<usize>) =
        sizes.into_iter().partition(|&t| t <= req.machine.gpus_per_node || req.pins.tp.is_some());
    for t in inside {
        search_tp(req, t, &mut search)?;
    }
    if search.ranked.is_empty() {
        for t in beyond {
            search_tp(req, t, &mut search)?;
        }
    }
    search.finish(req)
}

/// Every layout with tensor-parallel size `t` (`plan`): each context-parallel size, the pinned
/// one or (unpinned) none and each the all-to-all swap can take (`swap_sizes`).
fn search_tp(req: &Request, t: usize, search: &mut Search) -> Result<()> {
    if let Some(why) = tp_problem(req, t) {
        return match req.pins.tp {
            Some(_) => Err(pinned("--tensor-model-parallel-size", t, why)),
            None => Ok(()),
        };
    }
    if let (Some(c), Some(false)) = (req.pins.cp, req.pins.cp_ring) {
        if c > 1 && !swaps(req, t, c) {
            let why = format!(
                "--cp-comm-type a2a splits each tensor-parallel rank's key/value groups ({} / TP {t}) over the {c} ranks",
                req.shape.model().kv_heads()
            );
            return match req.pins.tp {
                Some(_) => Err(pinned("--context-parallel-size", c, why)),
                None => Ok(()),
            };
        }
    }
    let pinned_cp = req.pins.cp.map(|c| (c, req.pins.cp_ring.map_or(swaps(req, t, c), |ring| !ring)));
    let sizes =
        pinned_cp.map(|c| vec![c]).unwrap_or_else(|| swap_sizes(req, t).into_iter().map(|c| (c, c > 1)).collect());
    for cp in sizes {
        search_tp_cp(req, t, cp, search)?;
    }
    Ok(())
}

/// Whether context parallelism over `c` ranks beside TP `t` can swap positions for heads
/// (`a2a`): each tensor-parallel rank's key/value groups split over the `c` ranks.
fn swaps(req: &Request, t: usize, c: usize) -> bool {
    let groups = req.shape.model().kv_heads();
    groups.is_multiple_of(t) && (groups / t).is_multiple_of(c)
}

/// The context-parallel sizes the search tries beside TP `t`: 1, and every size dividing the GPUs
/// left whose swap the heads allow, with flash attention and a sequence of 2C chunks.
fn swap_sizes(req: &Request, t: usize) -> Vec<usize> {
    let s = req.shape.seq_length;
    divisors(req.gpus / t)
        .into_iter()
        .filter(|&c| c == 1 || (req.features.flash_attention && s.is_multiple_of(2 * c) && swaps(req, t, c)))
        .collect()
}

/// Every layout with tensor-parallel size `t` and context parallelism `(cp, a2a)`.
fn search_tp_cp(req: &Request, t: usize, (cp, cp_a2a): (usize, bool), search: &mut Search) -> Result<()> {
    let (n, pins) = (req.gpus, req.pins);
    if !(n / t).is_multiple_of(cp) {
        search.batch_problem.get_or_insert(format!(
            "--context-parallel-size {cp} does not divide the {} GPUs left by tensor-parallel size {t}",
            n / t
        ));
        return Ok(());
    }
    for p in pins.pp.map(|p| vec![p]).unwrap_or_else(|| divisors(n / t / cp)) {
        if let Some(why) = pp_problem(req, t, p) {
            match pins.pp {
                Some(_) => return Err(pinned("--pipeline-model-parallel-size", p, why)),
                None => continue,
            }
        }
        if !(n / t / cp).is_multiple_of(p) {
            match pins.pp {
                Some(_) => {
                    return Err(pinned(
                        "--pipeline-model-parallel-size",
                        p,
                        format!("{p} does not divide the {} GPUs left by TP {t} x CP {cp}", n / t / cp),
                    ))
                }
                None => continue,
            }
        }
        let dp = n / (t * p * cp);
        if !req.global_batch.is_multiple_of(dp) {
            search.batch_problem.get_or_insert(format!(
                "--global-batch-size {} does not split over {dp} data-parallel ranks (tp {t}, pp {p})",
                req.global_batch
            ));
            continue;
        }
        let per_rank = req.global_batch / dp;
        for b in pins.micro_batch.map(|b| vec![b]).unwrap_or_else(|| divisors(per_rank)) {
            if b == 0 || !per_rank.is_multiple_of(b) {
                search.batch_problem.get_or_insert(format!(
                    "--micro-batch-size {b} does not divide the {per_rank} sequences per data-parallel rank (tp {t}, pp {p})"
                ));
                continue;
            }
            for mode in tp_modes(req, t)?.into_iter().filter(|m| cp == 1 || *m == TpMode::OneD) {
                if let TpMode::Summa { q, depth } = mode {
                    if !b.is_multiple_of(q * depth) {
                        continue;
                    }
                }
                let layout = Layout {
                    tp_mode: mode,
                    tp: t,
                    pp: p,
                    dp,
                    vpp: 1,
                    micro_batch: b,
                    recompute: Recompute::None,
                    zero1: false,
                    shard_grads: false,
                    sequence_parallel: req.sequence_parallel && t > 1 && mode == TpMode::OneD,
                    schedule: pins.schedule.map_or(Schedule::OneF1B, |s| s.0),
                    cp,
                    cp_a2a,
                };
                search.variants(req, layout, per_rank / b);
            }
        }
    }
    Ok(())
}

/// The request's own errors, before any layout: no GPUs, GPUs that do not fill whole nodes, an
/// empty batch.
fn check_request(req: &Request) -> Result<()> {
    let (n, g) = (req.gpus, req.machine.gpus_per_node);
    if n == 0 {
        return Err(Error::flag("--gpus", 0, "a positive number of GPUs"));
    }
    if n > g && !n.is_multiple_of(g) {
        return Err(Error::Config(format!(
            "--gpus {n} is not a multiple of --gpus-per-node {g}: a job fills whole nodes"
        )));
    }
    if req.global_batch == 0 {
        return Err(Error::flag("--global-batch-size", 0, "a positive number of sequences"));
    }
    Ok(())
}

/// The error of a pinned flag whose value cannot work.
fn pinned(name: &str, value: usize, why: String) -> Error {
    Error::Config(format!("{name} {value}: {why}"))
}

/// The tensor-parallel modes of a group of `t` ranks that the pins allow and that can split this
/// model; none with a pinned tensor-parallel size is an error saying why.
fn tp_modes(req: &Request, t: usize) -> Result<Vec<TpMode>> {
    let pins = req.pins;
    let wanted = TpMode::for_group(t)
        .into_iter()
        .filter(|mode| pins.tp_mode.is_none_or(|name| name == mode.name()))
        .filter(|mode| match (mode, pins.depth) {
            (TpMode::Summa { depth, .. }, Some(d)) => *depth == d,
            _ => true,
        });
    let mut modes = Vec::new();
    let mut why_not = None;
    for mode in wanted {
        match mode_problem(req, t, mode) {
            None => modes.push(mode),
            Some(why) => {
                why_not.get_or_insert(why);
            }
        }
    }
    if modes.is_empty() && pins.tp.is_some() {
        let why = why_not.unwrap_or_else(|| {
            let mode = pins.tp_mode.unwrap_or("1d");
            format!("{t} ranks do not form the grid --tensor-parallel-mode {mode} needs (q², or d q²)")
        });
        return Err(pinned("--tensor-model-parallel-size", t, why));
    }
    Ok(modes)
}

/// What the enumeration has found so far.
#[derive(Default)]
struct Search {
    /// Every priced layout that fits.
    ranked: Vec<Candidate>,
    /// Per (tp, pp): the fastest layout that fits, and the one that needs the least memory.
    by_tp_pp: BTreeMap<(usize, usize), (Option<Candidate>, Candidate)>,
    /// Layouts priced.
    considered: usize,
    /// The first batch split (or pinned virtual-stage count) refused, for the error when no
    /// layout was priced at all.
    batch_problem: Option<String>,
}

impl Search {
    /// Prices `layout` under every schedule trident runs (1F1B, interleaved 1F1B, zb-h1 and zb-v;
    /// the pinned one only, GPipe only pinned), with every virtual-stage count, recompute choice
    /// and ZeRO-1 setting the pins allow, for `micro_batches` micro-batches per pipeline.
    fn variants(&mut self, req: &Request, layout: Layout, micro_batches: usize) {
        let (pins, p) = (req.pins, layout.pp);
        let schedules = match pins.schedule {
            Some((s, _)) => vec![s],
            None if p > 1 && !pins.megatron_schedules => {
                vec![Schedule::OneF1B, Schedule::ZeroBubble, Schedule::ZeroBubbleV]
            }
            None => vec![Schedule::OneF1B],
        };
        for schedule in schedules {
            let fixed = schedule.fixed_chunks();
            if pins.schedule.is_none() && fixed.is_some_and(|f| pins.vpp.is_some_and(|v| v != f)) {
                continue; // a pinned virtual-stage count this schedule does not run
            }
            // GPipe and the zero-bubble schedules fix their chunks per rank; interleaved-1f1b
            // needs more than one.
            let vpps: Vec<usize> = match (pins.vpp.or(fixed), pins.schedule) {
                (Some(v), _) => vec![v],
                (None, Some((_, false))) => vec![1],
                (None, Some((_, true))) => divisors(req.shape.num_layers / p).into_iter().filter(|&v| v > 1).collect(),
                (None, None) => divisors(req.shape.num_layers / p),
            };
            for vpp in vpps {
                if let Some(why) = vpp_problem(req, schedule, p, vpp, micro_batches) {
                    if pins.vpp.is_some() || pins.schedule.is_some() {
                        self.batch_problem
                            .get_or_insert(format!("--num-virtual-stages-per-pipeline-rank {vpp}: {why}"));
                    }
                    continue;
                }
                self.recompute_variants(req, Layout { vpp, schedule, ..layout });
            }
        }
    }

    /// Prices `layout` with every recompute choice and ZeRO-1 / ZeRO-2 setting the pins allow.
    fn recompute_variants(&mut self, req: &Request, layout: Layout) {
        let pins = req.pins;
        let recomputes = match pins.recompute {
            Some(r) => vec![r],
            None => vec![Recompute::None, Recompute::Selective, Recompute::Full],
        };
        for recompute in recomputes {
            let zero1s = match pins.zero1 {
                Some(z) => vec![z],
                None if layout.replicas() == 1 => vec![false],
                None => vec![false, true],
            };
            for zero1 in zero1s {
                // Megatron's published runs sharded the optimizer state at most.
                let shards = match (zero1, pins.shard_grads) {
                    (false, _) => vec![false],
                    (true, Some(s)) => vec![s],
                    (true, None) if pins.megatron_schedules => vec![false],
                    (true, None) => vec![false, true],
                };
                for shard_grads in shards {
                    self.record(req, Layout { recompute, zero1, shard_grads, ..layout });
                }
            }
        }
    }

    /// Prices one layout and keeps it if it fits, and its (tp, pp)'s fastest and smallest.
    fn record(&mut self, req: &Request, layout: Layout) {
        let c = price(req, layout);
        self.considered += 1;
        let fits = c.memory.total_bytes() <= req.usable_bytes();
        let entry = self.by_tp_pp.entry((layout.tp, layout.pp)).or_insert((None, c));
        if c.memory.total_bytes() < entry.1.memory.total_bytes() {
            entry.1 = c;
        }
        if fits {
            if entry.0.is_none_or(|best| better(&c, &best)) {
                entry.0 = Some(c);
            }
            self.ranked.push(c);
        }
    }

    /// The ranked plan, or why nothing was priced or nothing fits.
    fn finish(mut self, req: &Request) -> Result<Plan> {
        if self.considered == 0 {
            let (n, g) = (req.gpus, req.machine.gpus_per_node);
            return Err(Error::Config(self.batch_problem.unwrap_or_else(|| {
                format!("no tensor- and pipeline-parallel split of this model fits {n} GPUs of {g} per node")
            })));
        }
        if self.ranked.is_empty() {
            let smallest = self
                .by_tp_pp
                .values()
                .map(|v| v.1)
                .min_by(|a, b| a.memory.total_bytes().total_cmp(&b.memory.total_bytes()));
            let s = smallest.expect("considered > 0 means at least one priced layout");
            let pins = req.pins;
            return Err(Error::Config(format!(
                "no layout fits in {:.1} GiB per GPU ({:.0} GiB x {:.2} usable, less {:.1} GiB for the runtime): the smallest \
                 needs {:.1} GiB ({}); use more GPUs or a GPU with more memory{}",
                req.usable_bytes() / GIB,
                req.machine.memory_bytes / GIB,
                1.0 - req.memory_headroom,
                req.runtime_reserve_bytes / GIB,
                s.memory_gib(),
                report::describe(&s.layout),
                if pins.recompute.is_some() || pins.zero1.is_some() { ", or unpin recompute / ZeRO-1" } else { "" },
            )));
        }
        self.ranked.sort_by(ranking);
        prefer_no_pipeline(&mut self.ranked, req);
        Ok(Plan { ranked: self.ranked, considered: self.considered, by_tp_pp: self.by_tp_pp })
    }
}

/// How much slower (as a fraction) a layout without a pipeline may be and still come first: within
/// the model's error, Megatron's practice takes no pipeline over one (no bubble, no stage
/// imbalance, fewer ranks per model copy) when the model fits without.
pub const NO_PIPELINE_TOLERANCE: f64 = 0.03;

/// Moves the fastest layout without a pipeline to the front when it is within
/// `NO_PIPELINE_TOLERANCE` of the best and the pipeline size is not pinned.
fn prefer_no_pipeline(ranked: &mut [Candidate], req: &Request) {
    let Some(best) = ranked.first().map(|c| c.iteration_s()) else { return };
    if req.pins.pp.is_some() || ranked[0].layout.pp == 1 {
        return;
    }
    if let Some(i) = ranked.iter().position(|c| c.layout.pp == 1) {
        if ranked[i].iteration_s() <= best * (1.0 + NO_PIPELINE_TOLERANCE) {
            ranked[..=i].rotate_right(1);
        }
    }
}

/// Ranking: shorter iteration first; at equal time, less memory, then the smaller
/// model-parallel group (fewer GPUs to coordinate). A total order, so sorting is well defined.
fn ranking(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    a.iteration_s()
        .total_cmp(&b.iteration_s())
        .then(a.memory.total_bytes().total_cmp(&b.memory.total_bytes()))
        .then((a.layout.tp * a.layout.pp).cmp(&(b.layout.tp * b.layout.pp)))
}

fn better(a: &Candidate, b: &Candidate) -> bool {
    ranking(a, b) == std::cmp::Ordering::Less
}

/// Prices one layout.
pub fn price(req: &Request, layout: Layout) -> Candidate {
    Candidate {
        layout,
        memory: cost::memory(&req.shape, &layout, req.precision, req.global_batch, &req.features),
        timing: cost::timing(&req.shape, &layout, req.precision, req.global_batch, &req.machine, &req.features),
        executed_flops: cost::executed_flops(&req.shape, &layout, req.precision, req.global_batch),
        model_flops: cost::model_flops(&req.shape, &layout, req.precision, req.global_batch),
        gpus: req.gpus,
        global_batch: req.global_batch,
        seq_length: req.shape.seq_length,
    }
}
