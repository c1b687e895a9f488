//! Forward and backward of GPT-2 and the Llama family on one device, written by hand: embeddings,
//! pre-norm blocks (causal multi-head or grouped-query attention, GELU or SwiGLU MLP), the final
//! norm, and the output layer (tied to the word embedding, or its own). Activations are
//! sequence-first, row `t * batch + b`, as in Megatron.
//!
//! With tensor parallelism (Megatron's layout) QKV and fc1 are column-parallel, the attention
//! projection and fc2 row-parallel, the word embedding and the output layer vocab-parallel, and
//! the cross-entropy is computed from three all-reduces of per-row statistics. With sequence
//! parallelism the residual stream, LayerNorms and biases work on this rank's contiguous block of
//! positions, and all-gather / reduce-scatter replace the all-reduces. A group of one rank makes
//! every collective a no-op, so the single-rank model is the same code.
//!
//! This file holds `Gpt` itself (a chunk's parameters, its precision and recompute settings, its
//! memory accounting); the passes are in `chunk.rs` (the micro-batch API), `embedding.rs`,
//! `block.rs` and `head.rs`, their parallel points in `tensor_parallel.rs`, and the buffers a
//! micro-batch keeps in `activations.rs`.

mod activations;
mod block;
mod chunk;
mod context;
mod decode;
mod documents;
mod dropout;
mod embedding;
mod head;
mod tensor_parallel;
mod weight_pass;

use super::{Arch, ChunkPlan, GptConfig, ModelParallel, Normalization, PositionEmbedding, Recompute};
use crate::comm::CommCounters;
use crate::device::{Device, WorkCounters};
use crate::optim::WorkingCopy;
use crate::parallel::summa::Scratch;
use crate::parallel::tensor::TensorParallel;
use crate::real::Precision;
use crate::tensor::ParamSet;
use activations::{Activations, SpareAttention, SpareLayer, Stash};
use block::LayerOps;
use std::ops::Range;

pub use decode::KvCache;
pub use documents::{document_positions, document_starts};
pub use dropout::{DropoutRates, DropoutStep};

/// Where a chunk's parameters sit in its `ParamSet` (the order of `GptConfig::chunk_parameters`).
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Index of the first layer's first parameter (after the embeddings on the first chunk).
    layers_base: usize,
    num_layers: usize,
    first: bool,
    last: bool,
    /// Each layer's parameters.
    ops: LayerOps,
    /// The final norm's parameters: its weight, and LayerNorm's bias.
    norm_params: usize,
    /// The output layer is a parameter of its own (`--untie-embeddings-and-output-weights`).
    untied: bool,
}

impl Layout {
    fn new(plan: &ChunkPlan, cfg: &GptConfig) -> Layout {
        let arch = &cfg.arch;
        let learned = arch.position_embedding == PositionEmbedding::LearnedAbsolute;
        Layout {
            layers_base: if plan.first { 1 + usize::from(learned) } else { 0 },
            num_layers: plan.layers.len(),
            first: plan.first,
            last: plan.last,
            ops: LayerOps::new(arch),
            norm_params: 1 + usize::from(arch.normalization == Normalization::LayerNorm),
            untied: arch.untie_embeddings,
        }
    }
    /// Parameter `which` of the chunk's local layer `layer`.
    fn layer(&self, layer: usize, which: usize) -> usize {
        self.layers_base + layer * self.ops.count + which
    }
    fn layer_params(&self, layer: usize) -> Range<usize> {
        self.layer(layer, 0)..self.layer(layer, self.ops.count)
    }
    const WTE: usize = 0;
    /// The learned position embedding, where the model has one (first chunk).
    fn wpe(&self) -> Option<usize> {
        (self.layers_base == 2).then_some(1)
    }
    /// The first chunk's embeddings: the word embedding and any position embedding.
    fn embeddings(&self) -> Range<usize> {
        0..self.layers_base
    }
    /// The final norm's weight (LayerNorm's bias follows), on the last chunk.
    fn lnf(&self) -> usize {
        self.layers_base + self.num_layers * self.ops.count
    }
    /// The final norm's weight and, under LayerNorm, bias.
    fn lnf_params(&self) -> (usize, Option<usize>) {
        (self.lnf(), (self.norm_params == 2).then_some(self.lnf() + 1))
    }
    /// The output layer's weight: its own (untied), the word embedding itself, or the last
    /// stage's tied copy.
    fn head(&self) -> usize {
        if self.first && !self.untied {
            Layout::WTE
        } else {
            self.lnf() + self.norm_params
        }
    }
}

/// What a forward pass of a chunk produced: the hidden states for the next stage (written into
/// the caller's buffer), or, on the last stage, the summed token loss added to the chunk's loss
/// accumulator on the device (`Gpt::take_loss` reads it).
pub enum ChunkOutput {
    Hidden,
    Loss,
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
    pool: Vec<(Option<usize>, Activations<D>)>,
    live: usize,
    peak_live: usize,
    recompute: Recompute,
    /// What recomputation rebuilds into, shared by every layer and micro-batch of the chunk, for
    /// the shape it was made for: one layer's buffers (full), or one attention output and its
    /// log-sum-exp (selective).
    spare: SpareLayer<D::Buf>,
    spare_attention: SpareAttention<D::Buf>,
    /// Mixed precision: the format weights and activations are held in for compute, and the
    /// working copy of the weights rounded to it (the f32 values in `params` are the masters).
    precision: Precision,
    /// Whether the device stores `precision` natively (`Memory::stores`): activations are then
    /// held in it, and saved layers need no 16-bit copy aside.
    stored: bool,
    /// Per parameter: None where the device's GEMM rounds its operands itself (the matrices and
    /// the word embedding under bf16), which then read the masters; held in `precision` storage
    /// for those where the device stores it (`stored`), f32 rounded to it otherwise.
    working: Option<Vec<Option<D::Buf>>>,
    /// `--apply-layernorm-1p`: a buffer of ones per length of norm weight, added to their
    /// working copies (the scale `1 + w` the norms read); empty otherwise.
    gamma_ones: Vec<(usize, D::Buf)>,
    /// Weights still on their way (`--overlap-param-gather`): each bucket written, with its
    /// working copy, just before a forward first reads it (`await_params`).
    arriving: crate::parallel::arriving::Arriving,
    /// SUMMA's panel buffers (unused under 1-D).
    scratch: Scratch<D::Buf>,
    heads: activations::ContextScratch<D::Buf>,
    /// Per layer, what the tensor-parallel group, the SUMMA row and the SUMMA column moved in the
    /// layer's forward and backward passes (recomputation included) since the last reset.
    layer_comm: Vec<[CommCounters; 3]>,
    /// Per layer, the device's work (`Memory::work_counters`) in the layer's forward and backward
    /// passes (recomputation included) since `count_layer_work`; None while not counted.
    layer_work: Option<Vec<[WorkCounters; 2]>>,
    /// Bytes of 16-bit layer copies held now, and the most since `reset_peak_in_flight`.
    stashed: usize,
    peak_stashed: usize,
    /// Buffers of 16-bit layer copies already restored, kept for the next layer's copy.
    stash_spares: Vec<Vec<Stash<D>>>,
    /// A zero-bubble schedule's split backward (`set_weight_pass`): the micro-batches whose B
    /// pass ran and whose W pass has not, with what B kept for it per layer; and kept sets whose
    /// W pass ran, for the next B pass to reuse.
    weight_pass: bool,
    deferred: Vec<(usize, Vec<weight_pass::LayerDeferred<D::Buf>>)>,
    deferred_spares: Vec<Vec<weight_pass::LayerDeferred<D::Buf>>>,
    /// The last chunk: the summed token loss of the forwards since the last `take_losses`, kept
    /// on the device, one slot per step of a log interval (`set_loss_slots`), so the host reads
    /// the steps' losses at once; forwards add to slot `loss_slot`.
    loss: D::Scalars,
    loss_slot: usize,
    /// Rotary positions: the table of angles for every position (`Arch::rotary_table`), or under
    /// context parallelism for this rank's `rope_seq` positions of each sequence.
    rope: Option<D::Buf>,
    rope_seq: usize,
    /// `--reset-position-ids`: the end-of-document id after which the learned positions restart.
    reset_positions: Option<u32>,
    /// `--reset-attention-mask`: the end-of-document id after which attention restarts.
    reset_attention: Option<u32>,
    /// The dropout probabilities, and the training step whose forwards drop (`dropout.rs`).
    dropout: DropoutRates,
    dropout_step: Option<DropoutStep>,
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
        let layout = Layout::new(&plan, &cfg);
        let rope = (cfg.arch.position_embedding == PositionEmbedding::Rope).then(|| {
            let table = cfg.arch.rotary_table(cfg.head_dim(), cfg.max_position_embeddings);
            let mut buf = dev.alloc(table.len());
            dev.upload(&mut buf, &table);
            buf
        });
        let shifted = cfg.arch.zero_centered_gamma;
        let mut gpt = Gpt {
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
            stored: false,
            working: None,
            arriving: Default::default(),
            gamma_ones: Vec::new(),
            scratch: Scratch::default(),
            heads: activations::ContextScratch::default(),
            layer_comm: vec![[CommCounters::default(); 3]; layout.num_layers],
            layer_work: None,
            stashed: 0,
            peak_stashed: 0,
            stash_spares: Vec::new(),
            weight_pass: false,
            deferred: Vec::new(),
            deferred_spares: Vec::new(),
            loss: dev.scalars(1),
            loss_slot: 0,
            rope,
            rope_seq: 0,
            reset_positions: None,
            reset_attention: None,
            dropout: DropoutRates::default(),
            dropout_step: None,
        };
        if shifted {
            // The norms read `1 + w` from a working copy, in f32 too.
            gpt.set_precision(dev, Precision::F32);
        }
        gpt
    }

    /// Per layer of this chunk, the elements its tensor-parallel group, SUMMA row and SUMMA column
    /// moved since `reset_layer_comm` (forward, backward and recomputation).
    pub fn layer_comm(&self) -> &[[CommCounters; 3]] {
        &self.layer_comm
    }

    pub fn reset_layer_comm(&mut self) {
        self.layer_comm.iter_mut().for_each(|l| *l = Default::default());
    }

    /// Counts, from now on and from zero, the device's work in each layer's forward and backward
    /// passes (`layer_work`), on a device that counts its work (a snapshot before and after each).
    pub fn count_layer_work(&mut self) {
        self.layer_work = Some(vec![Default::default(); self.layout.num_layers]);
    }

    /// Per layer of this chunk, the device's work in its forward and backward passes since
    /// `count_layer_work`; None when not counted.
    pub fn layer_work(&self) -> Option<&[[WorkCounters; 2]]> {
        self.layer_work.as_deref()
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
        // Where the device stores the precision, those matrices are held in it (the kernels read
        // LayerNorm weights and biases in f32: their copies stay f32, rounded).
        // Where the device holds GEMM weights in the precision without storing it (the CPU under
        // bf16: bits its GEMM widens while packing), they get a copy in it too.
        let gemm_rounds = dev.matmul_rounds_operands(precision);
        self.stored = precision != Precision::F32 && dev.stores(precision);
        let held = precision != Precision::F32 && dev.holds_weights_in(precision);
        // Under `--apply-layernorm-1p` the norms' weights have a copy in f32 too: `1 + w`.
        let shifted = |p: &crate::tensor::ParamInfo| self.cfg.arch.zero_centered_gamma && Arch::is_norm_weight(&p.name);
        self.working = (precision != Precision::F32 || self.params.info.iter().any(shifted)).then(|| {
            let copy = |p: &crate::tensor::ParamInfo| match is_gemm_operand(&p.name) {
                _ if precision == Precision::F32 => shifted(p).then(|| dev.alloc(p.numel())),
                true if held => Some(dev.alloc_weights(p.numel(), precision)),
                true if gemm_rounds => None,
                _ => Some(dev.alloc(p.numel())),
            };
            self.params.info.iter().map(copy).collect()
        });
        self.gamma_ones.clear();
        for p in self.params.info.iter().filter(|p| shifted(p)) {
            if !self.gamma_ones.iter().any(|(n, _)| *n == p.numel()) {
                let mut ones = dev.alloc(p.numel());
                dev.fill(&mut ones, 1.0);
                self.gamma_ones.push((p.numel(), ones));
            }
        }
        self.refresh_working_weights(dev);
    }

    /// `--apply-layernorm-1p`: adds 1 to the norm weights' working copies, which hold the
    /// (rounded) masters `w`, so the norms read their scale `1 + w` (after `refresh_working_weights`
    /// and after the optimizer writes the copies).
    pub fn shift_norm_weights(&mut self, dev: &D) {
        self.shift_norm_range(dev, 0..self.params.info.len());
    }

    fn shift_norm_range(&mut self, dev: &D, range: Range<usize>) {
        let Some(working) = self.working.as_mut() else { return };
        if self.gamma_ones.is_empty() {
            return;
        }
        for (w, info) in working[range.clone()].iter_mut().zip(&self.params.info[range]) {
            if let (Some(w), true) = (w.as_mut(), Arch::is_norm_weight(&info.name)) {
                let ones = &self.gamma_ones.iter().find(|(n, _)| *n == info.numel()).expect("ones of every length").1;
                dev.add_assign(w, ones);
            }
        }
    }

    /// Rounds the master weights into the working copy (after loading a checkpoint, and after a
    /// ZeRO-1 step; the replicated AdamW writes the copy itself).
    pub fn refresh_working_weights(&mut self, dev: &D) {
        self.refresh_working(dev, 0..self.params.info.len());
    }

    /// `refresh_working_weights` of the parameters in `range`.
    fn refresh_working(&mut self, dev: &D, range: Range<usize>) {
        if let Some(working) = self.working.as_mut() {
            let masters = self.params.values[range.clone()].iter().zip(&self.params.info[range.clone()]);
            let pairs = working[range.clone()].iter_mut().zip(masters);
            for (w, (m, info)) in pairs.filter_map(|(w, rest)| w.as_mut().map(|w| (w, rest))) {
                // Copy in place where the device keeps buffers in host memory; on the device otherwise.
                match (dev.host_f32_ref(m), dev.host_f32(w)) {
                    (Some(src), Some(dst)) => dst.copy_from_slice(src),
                    _ => dev.copy(w, 0, m, 0, info.numel()),
                }
                dev.round_to(w, self.precision);
            }
        }
        self.shift_norm_range(dev, range);
    }

    /// Takes the distributed optimizer's all-gathers in flight (`--overlap-param-gather`): the
    /// weights they carry are written by `await_params` (or `settle_params`), not before.
    pub fn set_arriving(&mut self, arriving: crate::parallel::arriving::Arriving) {
        self.arriving = arriving;
    }

    /// Writes the weights of every bucket in flight that holds a parameter of `range` (and their
    /// working copies), waiting for their all-gathers: before a forward reads them.
    fn await_params(&mut self, dev: &D, range: Range<usize>) {
        if self.arriving.is_empty() {
            return;
        }
        for written in self.arriving.settle(dev, &mut self.params, range) {
            self.refresh_working(dev, written);
        }
        self.arriving.poll();
    }

    /// Writes every weight still in flight: before anything but a forward reads the weights (a
    /// checkpoint, the parameter norm).
    pub fn settle_params(&mut self, dev: &D) {
        self.await_params(dev, 0..self.params.info.len());
    }

    /// The parameters and mixed precision's working copy of them (per parameter, None where it
    /// has none) with its precision: what the optimizer updates in one pass.
    pub fn params_and_working(&mut self) -> (&mut ParamSet<D>, WorkingCopy<'_, D::Buf>) {
        (&mut self.params, self.working.as_deref_mut().map(|w| (w, self.precision)))
    }

    /// The summed token loss of the forwards since the last call (0 on a chunk without the head),
    /// read from the device once: `take_losses` of slot 0.
    pub fn take_loss(&mut self, dev: &D, tp: TensorParallel) -> f64 {
        let mut loss = [0.0];
        self.take_losses(dev, tp, &mut loss);
        loss[0]
    }

    /// The summed token loss of each of the first `out.len()` slots since the last call (0 on a
    /// chunk without the head), read from the device in one copy and zeroed there; under SUMMA
    /// summed over the batch blocks (the column and depth groups), so every rank of the chunk's
    /// row has the whole micro-batches' loss.
    pub fn take_losses(&mut self, dev: &D, tp: TensorParallel, out: &mut [f64]) {
        out.fill(0.0);
        if !self.layout.last {
            return;
        }
        dev.read_scalars(&self.loss, out);
        dev.write_scalars(&mut self.loss, &vec![0.0; out.len()]);
        if let Some((s, depth)) = tp.summa {
            s.col.sum_f64s(out);
            depth.sum_f64s(out);
        }
    }

    /// Gives the loss accumulator `slots` slots (zero), one per step the host reads at once.
    pub fn set_loss_slots(&mut self, dev: &D, slots: usize) {
        self.loss = dev.scalars(slots.max(1));
        self.loss_slot = 0;
    }

    /// Forwards from now on add their loss to slot `slot` of the accumulator.
    pub fn set_loss_slot(&mut self, slot: usize) {
        self.loss_slot = slot;
    }

    /// Elements of the chunk's largest layer (of all its parameters where it has no layer).
    pub fn largest_layer_elements(&self) -> usize {
        let numel = |r: Range<usize>| r.map(|i| self.params.info[i].numel()).sum::<usize>();
        let layers = (0..self.layout.num_layers).map(|l| numel(self.layout.layer_params(l))).max();
        layers.unwrap_or_else(|| self.params.num_elements())
    }

    /// The order in which one micro-batch's backward makes gradients (zeroed, `ensure_grads`)
    /// and tells `ready` of them: per step, (the parameters made, the range told of). The output
    /// layer and final norm first (the tied word embedding is made there and told of last), the
    /// blocks last first (under a W pass, `set_weight_pass`, made in B and told of in W), then
    /// the embeddings.
    pub fn backward_order(&self) -> Vec<(Vec<usize>, Range<usize>)> {
        let (lay, n) = (&self.layout, self.params.info.len());
        let mut order = Vec::new();
        if lay.last {
            let lnf = lay.lnf()..lay.lnf() + lay.norm_params;
            let told = if lay.head() == Layout::WTE { lnf.clone() } else { lnf.start..n };
            order.push((std::iter::once(lay.head()).chain(lnf).collect(), told));
        }
        let layers = (0..lay.num_layers).rev().map(|l| lay.layer_params(l));
        match self.weight_pass {
            false => order.extend(layers.map(|r| (r.clone().collect(), r))),
            true => {
                order.extend(layers.clone().map(|r| (r.collect(), 0..0)));
                order.extend(layers.map(|r| (Vec::new(), r)));
            }
        }
        if lay.first {
            order.push((lay.embeddings().collect(), lay.embeddings()));
        }
        order
    }

    /// Bytes of the working copy of the weights mixed precision computes with (its values are
    /// 16-bit, held in f32 buffers or, where the device stores the format, in 16 bits), 0 in f32.
    pub fn working_bytes(&self, dev: &D) -> usize {
        self.working.as_ref().map_or(0, |w| w.iter().flatten().map(|b| dev.bytes(b)).sum())
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
            self.pool.iter().flat_map(|(_, a)| a.compact.iter().flatten().flatten()).map(|s| s.bytes(dev)).sum();
        let deferred = self.deferred.iter().map(|(_, d)| d).chain(&self.deferred_spares).flatten().flatten();
        sets - now
            + deferred.map(|d| d.bytes(dev)).sum::<usize>()
            + self.peak_stashed
            + self.spare.as_ref().map_or(0, |(_, l)| l.bytes(dev))
            + self.spare_attention.as_ref().map_or(0, |(_, a, l)| dev.bytes(a) + dev.bytes(l))
            + self.heads.bytes(dev)
    }

    /// Bytes of one micro-batch's activation set while it is in flight (0 before the first
    /// forward): under mixed precision, with every layer's 16-bit copy.
    pub fn set_bytes(&self, dev: &D) -> usize {
        self.pool.first().map_or(0, |(_, a)| {
            let now: usize = a.compact.iter().flatten().flatten().map(|s| s.bytes(dev)).sum();
            let per_layer = self.spare.as_ref().map_or(0, |(_, l)| l.stash_bytes(dev));
            a.bytes(dev) - now + a.compact.len() * per_layer
        })
    }

    /// Whether saved layers are held in 16 bits between forward and backward (mixed precision,
    /// unless full recompute keeps only the layer inputs anyway, or the device stores the precision).
    fn compacting(&self) -> bool {
        self.precision != Precision::F32 && self.recompute != Recompute::Full && !self.stored
    }

    /// Bytes of the spare buffers recomputation rebuilds into, and of the context-parallel
    /// attention's swapped buffers.
    pub fn spare_bytes(&self, dev: &D) -> usize {
        self.spare.as_ref().map_or(0, |(_, l)| l.bytes(dev))
            + self.spare_attention.as_ref().map_or(0, |(_, a, l)| dev.bytes(a) + dev.bytes(l))
            + self.heads.bytes(dev)
    }

    /// Micro-batches whose activations this chunk holds now.
    pub fn in_flight(&self) -> usize {
        self.live
    }

    pub fn reset_peak_in_flight(&mut self) {
        self.peak_stashed = self.stashed;
        self.peak_live = self.live;
    }
}

/// Whether parameter `name` is read only as a GEMM operand (the linear layers' weight matrices)
/// or, for the word embedding, also by a lookup whose output is rounded.
fn is_gemm_operand(name: &str) -> bool {
    name == "embedding.word_embeddings.weight"
        || name == "output_layer.weight"
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;
    use crate::device::prelude::*;
    use crate::parallel::tensor::TensorParallel;

    /// Two layers of width 64 over a 257-token vocabulary (padded to 384), 16 positions.
    fn small_config() -> GptConfig {
        GptConfig {
            num_layers: 2,
            hidden_size: 64,
            num_attention_heads: 4,
            ffn_hidden_size: 256,
            max_position_embeddings: 16,
            vocab_size: 257,
            padded_vocab_size: 384,
            init_method_std: 0.02,
            arch: crate::model::Arch::GPT2,
        }
    }

    #[test]
    fn bf16_without_rounded_matrix_copies_computes_the_same_bits() {
        // Under bf16 the matrices and the word embedding are read as masters (the bf16 GEMM rounds
        // its operands; looked-up rows are rounded), or from a copy held as bf16 bits (the CPU on
        // AVX2, forced here on any CPU): the loss and every gradient equal those of a model that
        // keeps a rounded f32 copy of every weight.
        let cfg = small_config();
        let (batch, seq) = (3usize, 16usize);
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 37 + 11) % 257) as u32).collect();
        let labels: Vec<u32> = (0..batch * seq).map(|i| ((i * 53 + 5) % 257) as u32).collect();
        let run = |bf16_weights: bool, keep_every_copy: bool| {
            let dev = CpuDevice::new(2).with_bf16_weights(bf16_weights);
            dev.set_matmul_precision(Precision::Bf16);
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
        let (lean, bits, full) = (run(false, false), run(true, false), run(false, true));
        for (name, other) in [("without copies", &lean), ("with bf16 copies", &bits)] {
            assert_eq!(other.0.to_bits(), full.0.to_bits(), "{name}: loss {} vs {}", other.0, full.0);
            for (i, (a, b)) in other.1.iter().zip(&full.1).enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: gradient {i} differs");
            }
        }
        assert!(lean.2 * 10 < full.2, "working copy {} bytes, not far below {}", lean.2, full.2);
        assert!(
            bits.2 * 10 < full.2 * 6 && bits.2 * 10 > full.2 * 4,
            "bf16 copies {} bytes against {}",
            bits.2,
            full.2
        );
    }

    #[test]
    fn the_logits_are_bf16_values_under_bf16_alone() {
        // The GPU stores bf16 logits under bf16 (`activations::logits_precision`); the CPU mirrors
        // it by rounding the head's output where it is stored. f32 and fp16 keep f32 logits.
        let dev = CpuDevice::new(2);
        let (batch, seq) = (2usize, 16usize);
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 37 + 11) % 257) as u32).collect();
        for precision in [Precision::F32, Precision::Bf16, Precision::F16] {
            dev.set_matmul_precision(precision);
            let mut m = Gpt::new(&dev, small_config(), 7);
            m.set_precision(&dev, precision);
            let logits = m.forward(&dev, TensorParallel::single(), &tokens, batch, seq).clone();
            assert!(logits.iter().any(|&x| x != 0.0), "{precision:?}: the logits are zero");
            let held_in = |p: Precision| logits.iter().filter(|&&x| p.round(x) == x).count();
            if precision == Precision::Bf16 {
                assert_eq!(held_in(Precision::Bf16), logits.len(), "{precision:?}: logits that are not bf16 values");
            } else {
                for p in [Precision::Bf16, Precision::F16] {
                    let n = held_in(p);
                    assert!(n < logits.len() / 2, "{precision:?}: {n} of {} logits are {p:?} values", logits.len());
                }
            }
        }
    }
}
