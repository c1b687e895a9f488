//! The price of one layout: bytes per GPU (weights, gradients, optimizer state, activations) and
//! seconds per iteration (GEMMs, memory-bound work, tensor-parallel collectives, pipeline
//! point-to-point, the bubble, the data-parallel gradient reduction, the optimizer step).
//!
//! Formulas: docs/design.md (activations after Korthikanti et al., per-micro-batch communication,
//! the bubble, the paper's FLOP counts); model states are Megatron's 18 bytes per parameter with
//! fp32 gradients.

use super::hardware::{Collective, Machine, Placement};
use super::models::Shape;
use super::{Features, Layout, Precision, Schedule, TpMode};
use crate::model::Recompute;

/// Bytes each GPU holds, for the stage that holds the most.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Memory {
    pub weights_bytes: f64,
    pub grads_bytes: f64,
    pub optimizer_bytes: f64,
    pub activations_bytes: f64,
}

impl Memory {
    pub fn total_bytes(&self) -> f64 {
        self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
    }
}

/// Seconds per iteration, split by what they are spent on. `pipeline_s` already contains the
/// per-micro-batch parts of the slowest stage times the micro-batch count, plus the bubble.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// GEMMs of the slowest stage over all micro-batches (including recompute).
    pub gemm_s: f64,
    /// The attention core (scores, softmax, values) of the slowest stage: flash attention's
    /// kernels, or the batched GEMMs of unfused attention (their score traffic is memory-bound).
    pub attention_s: f64,
    /// Memory-bound work of the slowest stage: unfused attention's scores, LayerNorm, GELU,
    /// residuals.
    pub memory_bound_s: f64,
    /// Tensor-parallel collectives of the slowest stage.
    pub tp_comm_s: f64,
    /// Context parallelism's key/value ring of the slowest stage, where attention does not hide it.
    pub cp_comm_s: f64,
    /// Pipeline sends and receives of the slowest stage.
    pub pp_comm_s: f64,
    /// Fill and drain of the pipeline: (p - 1) / v micro-batch times of an average stage.
    pub bubble_s: f64,
    /// The part of the data-parallel gradient reduction (or ZeRO-1 reduce-scatter + all-gather)
    /// that does not overlap with compute, plus the tied-embedding all-reduce.
    pub dp_comm_s: f64,
    /// The AdamW step (memory-bound).
    pub optimizer_s: f64,
}

impl Timing {
    pub fn iteration_s(&self) -> f64 {
        self.gemm_s
            + self.attention_s
            + self.memory_bound_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.pp_comm_s
            + self.bubble_s
            + self.dp_comm_s
            + self.optimizer_s
    }
}

/// Bytes of memory traffic per attention-score element (a·s²·b of them per layer and
/// micro-batch), forward plus backward, with the scores held in memory as Megatron's 2021
/// attention does: forward 13 bytes (QKᵀ writes 2, the fused scale-mask-softmax reads and writes
/// 4, dropout writes a 1-byte mask and a 2-byte output after reading 2, attention·V reads 2),
/// backward twice that. Recompute of the attention core (selective or full) adds a forward.
pub const SCORE_BYTES_FWD: f64 = 13.0;

/// Memory-bound traffic of the h-wide element-wise work (LayerNorms, bias-GELU, residual adds) as
/// a multiple of the activation bytes it stores: written in forward, read in backward, and the
/// gradient written once.
pub const ELEMENTWISE_PASSES: f64 = 3.0;

/// Bytes per element of weights and activations, and the bytes per parameter of weights,
/// gradients and optimizer state (trident's mixed precision: 16-bit working weights, fp32
/// gradients, fp32 master weights and AdamW moments).
struct Bytes {
    element: f64,
    weight: f64,
    grad: f64,
    optimizer: f64,
}

fn bytes(p: Precision) -> Bytes {
    match p {
        Precision::Bf16 | Precision::Fp16 => Bytes { element: 2.0, weight: 2.0, grad: 4.0, optimizer: 12.0 },
        Precision::Fp32 => Bytes { element: 4.0, weight: 4.0, grad: 4.0, optimizer: 8.0 },
    }
}

/// What every stage needs to know about the layout, in f64.
struct Dims {
    s: f64,
    /// The sequence each rank holds: s / cp under context parallelism.
    sl: f64,
    cp: f64,
    b: f64,
    h: f64,
    a: f64,
    f: f64,
    v: f64,
    /// Widths of the layer's matrices: QKV's outputs, the attention output (heads x head dim),
    /// the key/value heads', fc1's outputs (2f under SwiGLU).
    qkv: f64,
    aw: f64,
    kvw: f64,
    fc1: f64,
    /// Activation bytes per `sbh` that the MLP keeps for backward: fc1's outputs and the
    /// activation's (4f/h for GELU, 6f/h for SwiGLU's gate, up and product).
    mlp_kept: f64,
    /// A separate output layer on the last stage (no tied copy to sum).
    untied: bool,
    /// Ranks the layer's work and (SUMMA) activations are split over: the TP group.
    t: f64,
    /// Ways the weights are split: t under 1-D, q² under SUMMA.
    tw: f64,
    /// The SUMMA grid side and depth.
    summa: Option<(f64, f64)>,
    p: usize,
    layers_per_stage: f64,
    /// Activations split over all t ranks (sequence parallelism, or any SUMMA grid).
    sp: bool,
    /// Element bytes / 2: the reference formulas count 16-bit activations.
    scale: f64,
    /// Flash attention (no score matrix in memory) rather than Megatron 2021's unfused attention.
    flash: bool,
}

fn dims(shape: &Shape, layout: &Layout, precision: Precision, features: &Features) -> Dims {
    let model = shape.model();
    Dims {
        s: shape.seq_length as f64,
        sl: shape.seq_length as f64 / layout.cp as f64,
        cp: layout.cp as f64,
        b: layout.micro_batch as f64,
        h: shape.hidden_size as f64,
        a: shape.num_attention_heads as f64,
        f: shape.ffn_hidden_size as f64,
        v: shape.padded_vocab_size(layout.tp) as f64,
        qkv: model.qkv_rows() as f64,
        aw: model.attention_width() as f64,
        kvw: (model.kv_heads() * model.head_dim()) as f64,
        fc1: model.fc1_rows() as f64,
        mlp_kept: 2.0 * (model.fc1_rows() + shape.ffn_hidden_size) as f64 / shape.hidden_size as f64,
        untied: shape.arch.untie_embeddings,
        t: layout.tp as f64,
        tw: layout.tp_degree() as f64,
        summa: layout.summa().map(|(q, d)| (q as f64, d as f64)),
        p: layout.pp,
        layers_per_stage: (shape.num_layers / layout.pp) as f64,
        sp: (layout.sequence_parallel && layout.tp > 1) || layout.summa().is_some(),
        scale: bytes(precision).element / 2.0,
        flash: features.flash_attention,
    }
}

/// Activation bytes one layer keeps for one micro-batch (docs/design.md, Activation memory) for a recompute
/// mode: none keeps all, selective drops the attention scores (5as/h), full keeps the layer input.
/// Flash attention keeps no scores: every mode then keeps what selective keeps (plus its
/// per-row softmax statistics, under 1% of the rest, not counted).
fn layer_activation_bytes(d: &Dims, recompute: Recompute) -> f64 {
    let sbh = d.sl * d.b * d.h;
    // 10 sbh is replicated over TP ranks without SP (norm inputs, QKV and fc1 inputs, dropout
    // masks); split over them: Q, K, V and the projection's input, 2 bytes each (8 sbh for
    // GPT-2, less under grouped-query attention), and the MLP's kept tensors (16 sbh for a GELU
    // MLP of 4h); 5as/h is the attention-score part (a query heads).
    let split = (4.0 * d.aw + 4.0 * d.kvw) / d.h + d.mlp_kept;
    let scores = if d.flash { 0.0 } else { 5.0 * d.a * d.s / d.h };
    let bytes = match (recompute, d.sp) {
        (Recompute::None, false) => sbh * (10.0 + (split + scores) / d.t),
        (Recompute::None, true) => sbh * (10.0 + split + scores) / d.t,
        (Recompute::Selective, false) => sbh * (10.0 + split / d.t),
        (Recompute::Selective, true) => sbh * (10.0 + split) / d.t,
        (Recompute::Full, false) => 2.0 * sbh,
        (Recompute::Full, true) => 2.0 * sbh / d.t,
    };
    bytes * d.scale
}

/// Parameters one GPU of a stage holds: its layers' TP shards plus the replicated biases and
/// norms, and on the first stage the word and (learned) position embeddings, on the last the
/// final norm and the output layer: its own when untied, else (when the last stage is not also
/// the first) its copy of the tied word embedding.
fn stage_parameters(shape: &Shape, d: &Dims, first: bool, last: bool) -> f64 {
    let h = d.h;
    // SUMMA shards the position table and the final norm over its q² blocks too.
    let positions = shape.position_rows() as f64 * h;
    let (positions, final_norm) = match d.summa {
        None => (positions, shape.norm_parameters()),
        Some(_) => (positions / d.tw, shape.norm_parameters() / d.tw),
    };
    let mut n = d.layers_per_stage * layer_parameters(shape, d);
    if first {
        n += d.v * h / d.tw + positions;
    }
    if last {
        n += final_norm;
        if d.untied || !first {
            n += d.v * h / d.tw;
        }
    }
    n
}

/// Parameters one GPU holds of one transformer layer: 1-D replicates the two norms and the
/// projection and fc2 biases and shards the rest over `tw`; SUMMA shards everything over its q²
/// blocks.
fn layer_parameters(shape: &Shape, d: &Dims) -> f64 {
    let replicated = if d.summa.is_none() { shape.layer_replicated_parameters() } else { 0.0 };
    (shape.layer_parameters() - replicated) / d.tw + replicated
}

/// Micro-batches whose activations stage 0 holds at its peak: 1F1B (and ZB-H1 and ZB-V) keeps min(p, m),
/// the interleaved schedule (1 + (p-1)/(pv)) times that (docs/design.md), GPipe all m.
fn in_flight_first_stage(layout: &Layout, m: usize) -> f64 {
    if layout.pp == 1 {
        return 1.0;
    }
    if layout.schedule == Schedule::GPipe {
        return m as f64;
    }
    let base = layout.pp.min(m) as f64;
    // ZB-V holds 2p chunks of half a stage: 1F1B's p stages' worth.
    if layout.vpp > 1 && layout.schedule != Schedule::ZeroBubbleV {
        let (p, v) = (layout.pp as f64, layout.vpp as f64);
        base * (1.0 + (p - 1.0) / (p * v))
    } else {
        base
    }
}

/// Bytes per GPU of the heavier of the first and the last stage.
pub fn memory(
    shape: &Shape,
    layout: &Layout,
    precision: Precision,
    global_batch: usize,
    features: &Features,
) -> Memory {
    let d = dims(shape, layout, precision, features);
    let by = bytes(precision);
    let m = layout.micro_batches(global_batch);
    let stored = layer_activation_bytes(&d, layout.recompute);
    // Full recompute rebuilds one layer's whole activation set during its backward.
    let working = if layout.recompute == Recompute::Full { layer_activation_bytes(&d, Recompute::None) } else { 0.0 };
    // The loss needs fp32 logits over this rank's vocabulary shard and the final hidden states
    // (Megatron's 4sbh(1 + V/h) with the vocabulary split over TP).
    let logits = match d.summa {
        None => 4.0 * d.sl * d.b * (d.h + d.v / d.t),
        Some(_) => 4.0 * d.sl * d.b * (d.h + d.v) / d.t,
    };
    // ZeRO-1 shards over the ranks that hold the same parameters: data-parallel x depth.
    let replicas = layout.replicas() as f64;
    let optimizer_share = if layout.zero1 { 1.0 / replicas } else { 1.0 };
    // ZeRO-2 / ZeRO-3 (priced only with ZeRO-1 on) shard gradients and weights the same way; under
    // ZeRO-3 two layers' weights are whole at a time (the one running and the one prefetched).
    let grad_share = if layout.zero1 && layout.shard_grads { 1.0 / replicas } else { 1.0 };
    let sharded_weights = layout.zero1 && features.shard_params;
    let gathered = if sharded_weights { 2.0 * layer_parameters(shape, &d) } else { 0.0 };
    let stage = |first: bool, last: bool, in_flight: f64| {
        let params = stage_parameters(shape, &d, first, last);
        let mut acts = in_flight * d.layers_per_stage * stored + working;
        if last {
            acts += logits;
        }
        let weights = if sharded_weights { params / replicas + gathered } else { params };
        Memory {
            weights_bytes: weights * by.weight,
            grads_bytes: params * by.grad * grad_share,
            optimizer_bytes: params * by.optimizer * optimizer_share,
            activations_bytes: acts,
        }
    };
    let first = stage(true, d.p == 1, in_flight_first_stage(layout, m));
    if d.p == 1 {
        return first;
    }
    let last = stage(false, true, 1.0);
    if last.total_bytes() > first.total_bytes() {
        last
    } else {
        first
    }
}

/// FLOPs of one layer's forward pass for one micro-batch, whole (not divided over TP): two per
/// weight and token for QKV, the projection, fc1 and fc2, and the scores and values over the
/// attention width (the paper's 24bsh² + 4bs²h for GPT-2 with f = 4h).
fn layer_forward_flops(d: &Dims) -> f64 {
    let weights = d.h * d.qkv + d.aw * d.h + d.h * d.fc1 + d.f * d.h;
    2.0 * d.b * d.s * weights + 4.0 * d.b * d.s * d.s * d.aw
}

/// FLOPs one layer executes per micro-batch, forward and backward (backward = 2 x forward),
/// with the extra forward of full recompute or the attention core of selective recompute.
fn layer_executed_flops(d: &Dims, recompute: Recompute) -> f64 {
    let fwd = layer_forward_flops(d);
    3.0 * fwd
        + match recompute {
            Recompute::None => 0.0,
            Recompute::Selective => 4.0 * d.b * d.s * d.s * d.aw,
            Recompute::Full => fwd,
        }
}

/// FLOPs the whole job executes per iteration (recompute included), the numerator of the
/// paper's TFLOP/s per GPU: with full recompute this is 96Bslh²(1 + s/6h + V/16lh).
pub fn executed_flops(shape: &Shape, layout: &Layout, precision: Precision, global_batch: usize) -> f64 {
    let d = dims(shape, layout, precision, &Features::default());
    let per_micro = shape.num_layers as f64 * layer_executed_flops(&d, layout.recompute) + 6.0 * d.b * d.s * d.h * d.v;
    per_micro * (global_batch as f64 / d.b)
}

/// Model FLOPs per iteration, 72Bslh²(1 + s/6h + V/12lh): what MFU counts.
pub fn model_flops(shape: &Shape, layout: &Layout, precision: Precision, global_batch: usize) -> f64 {
    let none = Layout { recompute: Recompute::None, ..*layout };
    executed_flops(shape, &none, precision, global_batch)
}

/// Seconds per iteration on `machine` (see `Timing` for the parts).
/// Seconds of one product of `flops` FLOPs per rank whose forward, input-gradient and
/// weight-gradient GEMMs have inner dimensions `ks` (a forward alone: one entry), at `peak` times
/// the GPU's efficiency for each shape.
fn product_s(flops: f64, ks: &[f64], peak: f64, machine: &Machine) -> f64 {
    ks.iter().map(|&k| flops / (peak * machine.efficiency.gemm(k))).sum()
}

/// One layer's compute for one micro-batch on one GPU: (GEMMs, attention core, memory-bound).
/// Each linear layer is three GEMMs (forward, input gradient, weight gradient) priced by their
/// per-rank inner dimension, plus a forward again under full recompute. Flash attention executes
/// its causal half of the score FLOPs (forward 2bs²·width, backward 2.5x, selective and full
/// recompute a forward again) at the attention efficiency; Megatron 2021's unfused attention runs
/// all of them as batched GEMMs at the large-GEMM efficiency and moves its scores through HBM.
fn layer_compute_s(d: &Dims, layout: &Layout, peak: f64, machine: &Machine) -> (f64, f64, f64) {
    let tokens = d.b * d.sl;
    let recompute = layout.recompute;
    // Per-rank (M, N, K) of each product; column-parallel QKV and fc1 split N, row-parallel
    // projection and fc2 split K; a SUMMA grid splits rows by d·q and both N and K by q.
    let rows = match d.summa {
        None => tokens,
        Some((q, depth)) => tokens / (q * depth),
    };
    let mut gemm = 0.0;
    for (n, k, row_parallel) in [(d.qkv, d.h, false), (d.h, d.aw, true), (d.fc1, d.h, false), (d.h, d.f, true)] {
        let (n_rank, k_rank) = match d.summa {
            None if row_parallel => (n, k / d.t),
            None => (n / d.t, k),
            Some((q, _)) => (n / q, k / q),
        };
        let flops = 2.0 * tokens * n * k / d.t;
        let ks: &[f64] =
            if recompute == Recompute::Full { &[k_rank, n_rank, rows, k_rank] } else { &[k_rank, n_rank, rows] };
        gemm += product_s(flops, ks, peak, machine);
    }
    // Under context parallelism each rank's queries meet every key (load-balanced causal halves).
    let score_flops = 4.0 * d.b * d.sl * d.s * d.aw / d.t;
    let hbm = machine.hbm_bytes_per_s;
    let hidden_stored = layer_activation_bytes(d, Recompute::Selective);
    let recompute_factor = if recompute == Recompute::Full { 4.0 / 3.0 } else { 1.0 };
    let elementwise = ELEMENTWISE_PASSES * hidden_stored * recompute_factor / hbm;
    let extra_forward = if recompute == Recompute::None { 0.0 } else { 1.0 };
    if d.flash {
        let executed = score_flops / 2.0 * (3.5 + extra_forward);
        return (gemm, executed / (peak * machine.efficiency.attention), elementwise);
    }
    let attention = score_flops * (3.0 + extra_forward) / (peak * machine.efficiency.gemm_max);
    let scores = d.a / d.t * d.s * d.s * d.b;
    let score_bytes = scores * SCORE_BYTES_FWD * (3.0 + extra_forward) * d.scale;
    (gemm, attention, elementwise + score_bytes / hbm)
}

/// Seconds per iteration on `machine` (see `Timing` for the parts).
pub fn timing(
    shape: &Shape,
    layout: &Layout,
    precision: Precision,
    global_batch: usize,
    machine: &Machine,
    features: &Features,
) -> Timing {
    let d = dims(shape, layout, precision, features);
    let by = bytes(precision);
    let m = layout.micro_batches(global_batch) as f64;
    let g = machine.gpus_per_node;
    let peak = match precision {
        Precision::Fp32 => machine.peak_fp32_flops,
        _ => machine.peak_16bit_flops,
    };
    let hbm = machine.hbm_bytes_per_s;

    // One layer, one micro-batch, on one GPU.
    let step = machine.efficiency.step;
    let (gemm, attention, memory_bound) = layer_compute_s(&d, layout, peak * step, machine);
    let memory_bound = memory_bound / step;
    let tp_comm = tp_layer_comm_s(&d, layout, machine);
    // Megatron's --tp-comm-overlap pipelines 1-D TP's collectives inside a node with the layer's
    // GEMMs: only what outlasts them is exposed.
    let overlapped = features.tp_comm_overlap && layout.tp_mode == TpMode::OneD && layout.tp <= g;
    let tp_comm = if overlapped { (tp_comm - gemm).max(0.0) } else { tp_comm };
    let cp_comm = cp_layer_comm_s(&d, layout, machine, attention);

    // The output layer and loss on the last stage (not recomputed), the embedding on the first.
    let tokens = d.b * d.sl;
    let vocab_rank = match d.summa {
        None => d.v / d.t,
        Some((q, _)) => d.v / q,
    };
    let logits_gemm = product_s(2.0 * tokens * d.h * d.v / d.t, &[d.h, vocab_rank, tokens], peak * step, machine);
    let logits_memory = 3.0 * 4.0 * d.sl * d.b * d.v / d.t / hbm / step;
    let activation_bytes = d.sl * d.b * d.h * by.element;
    let tp = Placement::strided(layout.tp, 1, g);
    // Embedding forward and output-layer input-gradient all-reduces, and the loss's three small
    // all-reduces of per-token statistics.
    // Under SUMMA: the embedding's reduce-scatter and gather down the column, the output layer as
    // one SUMMA product, the loss's statistics along the row.
    let (embedding_comm, loss_comm) = match d.summa {
        None => (
            machine.collective_s(Collective::AllReduce, activation_bytes, tp),
            machine.collective_s(Collective::AllReduce, activation_bytes, tp)
                + 3.0 * machine.collective_s(Collective::AllReduce, 4.0 * d.sl * d.b, tp),
        ),
        Some((q, depth)) => {
            let (row, col) = summa_groups(layout, g);
            let rows_per_rank = d.s * d.b / (depth * q);
            let column_rows = rows_per_rank * q * d.h / q * by.element;
            (
                2.0 * machine.collective_s(Collective::ReduceScatter, column_rows, col),
                summa_linear_s(machine, rows_per_rank, d.h, d.v, q, by.element, 3.0, (row, col))
                    + 3.0 * machine.collective_s(Collective::AllReduce, 4.0 * rows_per_rank, row),
            )
        }
    };

    // Pipeline messages: each stage receives an activation and sends a gradient per micro-batch
    // and chunk (sequence-sharded under SP). Stages are tp * dp ranks apart.
    let pp_bytes = if d.sp { activation_bytes / d.t } else { activation_bytes };
    let across = layout.tp * layout.cp * layout.dp >= g;
    let pp_comm = if d.p > 1 { 2.0 * layout.vpp as f64 * machine.p2p_s(pp_bytes, across) } else { 0.0 };

    let layers = d.layers_per_stage;
    let body = layers * (gemm + attention + memory_bound + tp_comm + cp_comm);
    let first = body + embedding_comm + pp_comm;
    let last = body + logits_gemm + logits_memory + loss_comm + pp_comm;
    let (slow, slow_extra_gemm, slow_extra_mem, slow_extra_comm) = if d.p == 1 {
        (
            body + embedding_comm + logits_gemm + logits_memory + loss_comm,
            logits_gemm,
            logits_memory,
            embedding_comm + loss_comm,
        )
    } else if last >= first {
        (last, logits_gemm, logits_memory, loss_comm)
    } else {
        (first, 0.0, 0.0, embedding_comm)
    };
    let mean = if d.p == 1 { slow } else { (first + last + (d.p as f64 - 2.0) * (body + pp_comm)) / d.p as f64 };
    // ZB-H1 and ZB-V fill two thirds of 1F1B's bubble (per virtual stage) with weight-gradient
    // work (forward, input-gradient and weight-gradient passes taken as equal: Qi et al. 2023, §3).
    let zero_bubble = layout.schedule.bubble_share();
    let bubble = (d.p as f64 - 1.0) / layout.vpp as f64 * mean * zero_bubble;

    let params = stage_parameters(shape, &d, true, d.p == 1).max(stage_parameters(shape, &d, false, true));
    // Gradients are summed over data-parallel x depth: under 2.5-D the depth copies of a shard
    // sit q² ranks apart, then the data-parallel replicas (d q² apart), so one stride of q².
    let replicas = layout.replicas();
    let layer_params = layer_parameters(shape, &d);
    let compute = gemm + attention + memory_bound;
    let dp_comm = dp_comm_s(machine, layout, features, (params, layer_params), compute, (layers, m), by.weight);
    // The two copies of the tied word embedding (first and last stage) are summed every step.
    let tied = if d.p > 1 && !d.untied {
        let embedding_grad = d.v * d.h / d.tw * 4.0;
        machine.collective_s(
            Collective::AllReduce,
            embedding_grad,
            Placement { size: 2, per_node: if across { 1 } else { 2 } },
        )
    } else {
        0.0
    };
    // AdamW reads gradient, master weights and both moments, writes weights and moments.
    let updated = if layout.zero1 { params / replicas as f64 } else { params };
    let optimizer = updated * (4.0 * 4.0 + 3.0 * 4.0 + by.weight) / hbm;

    Timing {
        gemm_s: m * (layers * gemm + slow_extra_gemm),
        attention_s: m * layers * attention,
        memory_bound_s: m * (layers * memory_bound + slow_extra_mem),
        tp_comm_s: m * (layers * tp_comm + slow_extra_comm),
        cp_comm_s: m * layers * cp_comm,
        pp_comm_s: m * if d.p > 1 { pp_comm } else { 0.0 },
        bubble_s: bubble,
        dp_comm_s: dp_comm + tied,
        optimizer_s: optimizer,
    }
}

/// Data-parallel communication per iteration left exposed, for a stage of `params` parameters
/// (`layer_params` per layer) whose layer takes `compute` seconds per micro-batch, with `layers`
/// layers and `m` micro-batches. Plain DP all-reduces fp32 gradient buckets as the last
/// micro-batch's backward finishes them (overlap with up to that backward); trident's ZeRO-1
/// reduce-scatters after the backward and all-gathers the updated fp32 shards after the step,
/// neither overlapped. Megatron's --overlap-grad-reduce hides the reduce-scatter behind the last
/// backward as plain DP's all-reduce, and --overlap-param-gather all-gathers the updated 16-bit
/// weights behind the next iteration's first forward. ZeRO-2 reduce-scatters as ZeRO-1 but every
/// micro-batch (trident's: so that only a shard of the gradients outlives it). ZeRO-3 every
/// micro-batch all-gathers each
/// layer's 16-bit weights before its forward and again before its backward, and reduce-scatters
/// its gradients after; prefetched, so only what outlasts the layer's compute is exposed, and no
/// gather after the step.
fn dp_comm_s(
    machine: &Machine,
    layout: &Layout,
    features: &Features,
    (params, layer_params): (f64, f64),
    compute: f64,
    (layers, m): (f64, f64),
    weight_bytes: f64,
) -> f64 {
    let replicas = layout.replicas();
    let dp_group = Placement::strided(replicas, layout.tp_degree(), machine.gpus_per_node);
    let last_backward = 2.0 / 3.0 * layers * compute;
    let grad_bytes = params * 4.0;
    if !layout.zero1 {
        return (machine.collective_s(Collective::AllReduce, grad_bytes, dp_group) - last_backward).max(0.0);
    }
    if features.shard_params {
        let gather = machine.collective_s(Collective::AllGather, layer_params * weight_bytes, dp_group);
        let scatter = machine.collective_s(Collective::ReduceScatter, layer_params * 4.0, dp_group);
        let exposed = (gather - compute / 3.0).max(0.0) + (gather + scatter - 2.0 * compute / 3.0).max(0.0);
        return layers * m * exposed;
    }
    let reduce = machine.collective_s(Collective::ReduceScatter, grad_bytes, dp_group);
    let reduce = if features.overlap_grad_reduce { (reduce - last_backward).max(0.0) } else { reduce };
    // ZeRO-2 reduce-scatters every micro-batch's gradients, each behind its own backward.
    let reduce = if layout.shard_grads { m * reduce } else { reduce };
    let gather = if features.overlap_param_gather {
        (machine.collective_s(Collective::AllGather, params * weight_bytes, dp_group) - last_backward / 2.0).max(0.0)
    } else {
        machine.collective_s(Collective::AllGather, params * 4.0, dp_group)
    };
    reduce + gather
}

/// Context parallelism's ring for one layer and micro-batch: cp - 1 steps passing this rank's keys
/// and values (b·(s/cp)·kv-width/t 16-bit values each) to the next rank in forward, and keys,
/// values and their gradients in backward; the ring runs beside the attention of the chunk in
/// hand, so only what outlasts `attention` is exposed. CP peers are `tp` ranks apart.
fn cp_layer_comm_s(d: &Dims, layout: &Layout, machine: &Machine, attention: f64) -> f64 {
    if layout.cp == 1 {
        return 0.0;
    }
    if layout.cp_a2a {
        return cp_swap_s(d, layout, machine);
    }
    let chunk = 2.0 * d.b * d.sl * d.kvw / d.t * 2.0 * d.scale;
    let across = layout.tp * layout.cp > machine.gpus_per_node;
    let ring = (d.cp - 1.0) * (machine.p2p_s(chunk, across) + 2.0 * machine.p2p_s(2.0 * chunk, across));
    (ring - attention).max(0.0)
}

/// Context parallelism's all-to-all swap for one layer and micro-batch, as trident runs it: each
/// swap one all-to-all over the CP group (ranks `tp` apart) of this rank's rows of the TP rank's
/// columns, not overlapped: QKV to heads and the attention output back in forward; in backward
/// the saved QKV and output and the output's gradient to heads and QKV's gradient back (twice
/// the forward pair); and full recompute's forward pair again.
fn cp_swap_s(d: &Dims, layout: &Layout, machine: &Machine) -> f64 {
    let group = Placement::strided(layout.cp, layout.tp, machine.gpus_per_node);
    let swap = |width: f64| machine.collective_s(Collective::AllToAll, d.b * d.sl * width / d.t * 2.0 * d.scale, group);
    let forward = swap(d.qkv) + swap(d.aw);
    forward * if layout.recompute == Recompute::Full { 4.0 } else { 3.0 }
}

/// Tensor-parallel communication of one layer for one micro-batch (docs/design.md, Communication volumes): 1-D
/// Megatron TP all-reduces the b·s·h activation twice in forward and twice in backward (SP's
/// all-gathers and reduce-scatters move the same volume), and full recompute replays the two
/// forward ones. The group is `tp` adjacent ranks: one node while tp <= GPUs per node.
fn tp_layer_comm_s(d: &Dims, layout: &Layout, machine: &Machine) -> f64 {
    match layout.tp_mode {
        TpMode::OneD => {
            if layout.tp == 1 {
                return 0.0;
            }
            let count = if layout.recompute == Recompute::Full { 6.0 } else { 4.0 };
            let bytes = d.sl * d.b * d.h * 2.0 * d.scale;
            count
                * machine.collective_s(
                    Collective::AllReduce,
                    bytes,
                    Placement::strided(layout.tp, 1, machine.gpus_per_node),
                )
        }
        TpMode::Summa { q, depth } => {
            // Per linear layer, panel SUMMA: the input panel all-gathered along the row and the
            // weight panel down the column, forward and again in backward, and the two partial
            // gradients reduce-scattered (3(q-1)(MK + KN)/q² elements, docs/design.md,
            // §2.3); full recompute repeats the forward gathers.
            let (qf, df) = (q as f64, depth as f64);
            let rows = d.s * d.b / (df * qf);
            let element = 2.0 * d.scale;
            let passes = if layout.recompute == Recompute::Full { 4.0 } else { 3.0 };
            let groups = summa_groups(layout, machine.gpus_per_node);
            [(d.h, d.qkv), (d.aw, d.h), (d.h, d.fc1), (d.f, d.h)]
                .iter()
                .map(|&(k, n)| summa_linear_s(machine, rows, k, n, qf, element, passes, groups))
                .sum()
        }
    }
}

/// The row group (q adjacent ranks) and column group (q ranks, q apart) of a SUMMA layout.
fn summa_groups(layout: &Layout, gpus_per_node: usize) -> (Placement, Placement) {
    let q = layout.summa().map_or(1, |(q, _)| q);
    (Placement::strided(q, 1, gpus_per_node), Placement::strided(q, q, gpus_per_node))
}

/// Seconds of one SUMMA product `[rows, k] x [n, k]ᵀ` on a q x q grid, `passes` times each
/// operand's panel collective (3: forward gather, backward gather and reduce-scatter).
#[allow(clippy::too_many_arguments)]
fn summa_linear_s(
    machine: &Machine,
    rows: f64,
    k: f64,
    n: f64,
    q: f64,
    element: f64,
    passes: f64,
    (row, col): (Placement, Placement),
) -> f64 {
    let input_panel = rows * k * element;
    let weight_panel = n / q * k * element;
    passes
        * (machine.collective_s(Collective::AllGather, input_panel, row)
            + machine.collective_s(Collective::AllGather, weight_panel, col))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Shape {
        Shape {
            num_layers: 4,
            hidden_size: 1024,
            num_attention_heads: 16,
            ffn_hidden_size: 4096,
            seq_length: 1024,
            max_position_embeddings: 1024,
            vocab_size: 2048,
            vocab_divisible_by: 128,
            arch: crate::model::Arch::GPT2,
        }
    }

    fn layout(dp: usize, recompute: Recompute, zero1: bool) -> Layout {
        Layout {
            tp_mode: TpMode::OneD,
            tp: 2,
            pp: 2,
            dp,
            vpp: 1,
            micro_batch: 2,
            recompute,
            zero1,
            shard_grads: false,
            sequence_parallel: false,
            schedule: Schedule::OneF1B,
            cp: 1,
            cp_a2a: false,
        }
    }

    /// Worked by hand: h = 1024, f = 4h, 4 layers over 2 stages, TP 2, b = 2, s = 1024, V = 2048.
    /// A layer holds 4h² + 2hf + 9h + f = 12,596,224 parameters, of which 6h = 6144 replicated:
    /// per GPU (12,596,224 - 6144)/2 + 6144 = 6,301,184. The first stage adds V h / 2 = 1,048,576
    /// and the position embedding 1,048,576: 14,699,520 parameters, at 2 + 4 + 12 bytes.
    /// Activations per layer and micro-batch: sbh (10 + (24 + 5as/h)/t) = 2,097,152 x 62 =
    /// 130,023,424 bytes; 1F1B's first stage holds min(p, m) = 2 micro-batches of 2 layers.
    #[test]
    fn summa_time_is_the_volume_formula_over_the_link() {
        // Bandwidth only (no latency), inside one node: time x bandwidth / element bytes is the
        // per-rank volume 3(q-1)/q² (7 bsh/d + 12 h²) of docs/design.md's 2.5-D volume (f = 4h).
        let mut m = crate::plan::hardware::machine("a100").unwrap();
        m.intra.latency_s = 0.0;
        m.gpus_per_node = 64;
        let shape = small();
        for (q, depth) in [(2usize, 1usize), (2, 2), (4, 1)] {
            let layout =
                Layout { tp_mode: TpMode::Summa { q, depth }, tp: q * q * depth, ..layout(1, Recompute::None, false) };
            let d = dims(&shape, &layout, Precision::Bf16, &Features::default());
            let seconds = tp_layer_comm_s(&d, &layout, &m);
            let elements = seconds * m.intra.bytes_per_s / 2.0;
            let (q, depth) = (q as f64, depth as f64);
            let formula = 3.0 * (q - 1.0) / (q * q) * (7.0 * d.b * d.s * d.h / depth + 12.0 * d.h * d.h);
            assert!((elements - formula).abs() <= 1e-6 * formula, "q {q} d {depth}: {elements} vs {formula}");
        }
    }

    /// Megatron 2021's attention, whose scores the hand-computed activations count.
    const UNFUSED: Features = Features {
        flash_attention: false,
        tp_comm_overlap: false,
        overlap_grad_reduce: false,
        overlap_param_gather: false,
        shard_params: false,
    };

    #[test]
    fn memory_matches_a_hand_computed_case() {
        let m = memory(&small(), &layout(1, Recompute::None, false), Precision::Bf16, 8, &UNFUSED);
        assert_eq!(m.weights_bytes, 14_699_520.0 * 2.0);
        assert_eq!(m.grads_bytes, 14_699_520.0 * 4.0);
        assert_eq!(m.optimizer_bytes, 14_699_520.0 * 12.0);
        assert_eq!(m.activations_bytes, 4.0 * 130_023_424.0);
        // ZeRO-1 over 2 data-parallel ranks halves the optimizer state only.
        let z = memory(&small(), &layout(2, Recompute::None, true), Precision::Bf16, 8, &UNFUSED);
        assert_eq!(z.optimizer_bytes, 14_699_520.0 * 6.0);
        assert_eq!(z.weights_bytes, m.weights_bytes);
        // Full recompute keeps 2sbh per layer and micro-batch plus one layer's whole set.
        let f = memory(&small(), &layout(1, Recompute::Full, false), Precision::Bf16, 8, &UNFUSED);
        assert_eq!(f.activations_bytes, 4.0 * 2.0 * 2_097_152.0 + 130_023_424.0);
        // Selective drops the 5as/h term: 10 + 24/2 = 22 sbh.
        let s = memory(&small(), &layout(1, Recompute::Selective, false), Precision::Bf16, 8, &UNFUSED);
        assert_eq!(s.activations_bytes, 4.0 * 22.0 * 2_097_152.0);
    }

    #[test]
    fn executed_flops_are_the_papers_formulas() {
        let shape = crate::plan::models::named("megatron-1t").unwrap();
        let (b, s, l, h, v) = (3072.0, 2048.0, 128.0, 25600.0, 51200.0);
        let with_recompute = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
        let without = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let full = Layout { tp: 8, pp: 64, dp: 6, ..layout(6, Recompute::Full, false) };
        let got = executed_flops(&shape, &full, Precision::Fp16, 3072);
        assert!((got / with_recompute - 1.0).abs() < 1e-12, "{got} vs {with_recompute}");
        let got = model_flops(&shape, &full, Precision::Fp16, 3072);
        assert!((got / without - 1.0).abs() < 1e-12, "{got} vs {without}");
    }

    /// A small Llama: h = 1024, 16 heads of 64 in 4 query groups, SwiGLU of f = 2816, RMSNorm,
    /// rotary positions, no biases, an untied output layer; 4 layers over 2 stages, TP 2.
    fn small_llama() -> Shape {
        let arch = crate::model::Arch { num_query_groups: Some(4), ..crate::model::Arch::LLAMA };
        Shape { ffn_hidden_size: 2816, arch, ..small() }
    }

    /// Worked by hand: a layer holds QKV 1024 x (16 + 2·4)·64 = 1,572,864, the projection
    /// 1,048,576, fc1 1024 x 5632 = 5,767,168, fc2 2,883,584 and two RMSNorms of 1024: 11,274,240,
    /// of which 2048 replicated: (11,274,240 - 2048)/2 + 2048 = 5,638,144 per GPU, 11,276,288 for
    /// 2 layers. The first stage adds V h / 2 = 1,048,576 (no position table); the last the final
    /// norm (1024) and its own output layer (1,048,576) even when it is also the first.
    #[test]
    fn llama_stages_hold_their_parameters_and_activations() {
        let (shape, l) = (small_llama(), layout(1, Recompute::None, false));
        let d = dims(&shape, &l, Precision::Bf16, &Features::default());
        assert_eq!(shape.layer_parameters(), 11_274_240.0);
        assert_eq!(stage_parameters(&shape, &d, true, false), 11_276_288.0 + 1_048_576.0);
        assert_eq!(stage_parameters(&shape, &d, false, true), 11_276_288.0 + 1024.0 + 1_048_576.0);
        assert_eq!(stage_parameters(&shape, &d, true, true), 11_276_288.0 + 1024.0 + 2.0 * 1_048_576.0);
        // Split activations per sbh: Q and the projection input 2 x 2 x 1024/1024, K and V
        // 2 x 2 x 256/1024, the MLP's gate, up and product 2 x 3 x 2816/1024: 5 + 16.5; with
        // selective recompute and no SP, (10 + 21.5/2) sbh of 2 x 1024 x 1024.
        let selective = layer_activation_bytes(&d, Recompute::Selective);
        assert_eq!(selective, (10.0 + 21.5 / 2.0) * 2_097_152.0);
        // The same model with multi-head attention keeps more.
        let mha = Shape { arch: crate::model::Arch { num_query_groups: None, ..shape.arch.clone() }, ..shape.clone() };
        assert!(
            layer_activation_bytes(&dims(&mha, &l, Precision::Bf16, &Features::default()), Recompute::Selective)
                > selective
        );
    }

    #[test]
    fn llama_flops_are_the_models_own_count() {
        // The planner's model FLOPs against `GptConfig::flops_per_iteration` (what `train` and
        // `bench` report MFU with), for Llama 3 8B and 70B, the vocabulary padded for TP 8 as
        // `train` pads it.
        for name in ["llama3-8b", "llama3-70b"] {
            let shape = crate::plan::models::named(name).unwrap();
            let model = crate::model::GptConfig { padded_vocab_size: shape.padded_vocab_size(8), ..shape.model() };
            let l = Layout { tp: 8, pp: 4, dp: 2, micro_batch: 1, ..layout(2, Recompute::Full, false) };
            let got = model_flops(&shape, &l, Precision::Bf16, 64);
            let want = model.flops_per_iteration(64, shape.seq_length);
            assert!((got / want - 1.0).abs() < 1e-12, "{name}: {got} vs {want}");
        }
    }

    #[test]
    fn an_untied_output_layer_has_no_embedding_sum() {
        let machine = crate::plan::hardware::machine("h100").unwrap();
        let untied = small_llama();
        let tied =
            Shape { arch: crate::model::Arch { untie_embeddings: false, ..untied.arch.clone() }, ..untied.clone() };
        let l = layout(1, Recompute::None, false);
        let t = |s: &Shape| timing(s, &l, Precision::Bf16, 8, &machine, &Features::default()).dp_comm_s;
        // One data-parallel rank: the only data-parallel time is the tied embedding's sum.
        assert_eq!(t(&untied), 0.0);
        assert!(t(&tied) > 0.0);
    }

    #[test]
    fn more_bubble_and_more_communication_cost_time() {
        let shape = crate::plan::models::named("megatron-39.1b").unwrap();
        let machine = crate::plan::hardware::machine("a100").unwrap();
        let base = Layout { tp: 8, pp: 2, dp: 32, micro_batch: 1, ..layout(32, Recompute::None, false) };
        let t = |l: Layout| timing(&shape, &l, Precision::Bf16, 1536, &machine, &Features::default());
        // Interleaving halves the bubble.
        let plain = t(base);
        let interleaved = t(Layout { vpp: 2, ..base });
        assert!((interleaved.bubble_s / plain.bubble_s - 0.5).abs() < 0.05, "{plain:?} {interleaved:?}");
        // Full recompute adds a forward: GEMM time grows by a third.
        let full = t(Layout { recompute: Recompute::Full, ..base });
        assert!((full.gemm_s / plain.gemm_s - 4.0 / 3.0).abs() < 0.01);
        // TP over two nodes pays the network, not NVLink.
        let wide = t(Layout { tp: 16, pp: 1, dp: 32, ..base });
        let narrow = t(Layout { tp: 8, pp: 1, dp: 64, ..base });
        assert!(wide.tp_comm_s > 3.0 * narrow.tp_comm_s, "{wide:?} {narrow:?}");
    }
}
