//! One model chunk of this rank (a pipeline stage, or a virtual stage of one) with its optimizer
//! state and data-parallel gradient buckets, and the end of a step over a rank's chunks: the
//! gradients finalised, the global norm, the optimizer step. AdamW keeps its full state on every
//! data-parallel rank, or shards it over them (ZeRO-1).

use crate::comm::ReduceOp;
use crate::config::TrainConfig;
use crate::device::{all_reduce_scalars, Device};
use crate::model::{ChunkPlan, Gpt, ModelParallel};
use crate::optim::distributed::{DistributedAdamW, GradReduce, ShardGrads};
use crate::optim::AdamW;
use crate::parallel::data::{
    global_grad_sum_squares, reduce_sequence_parallel_grads, reduce_tied_embedding, GradBuckets,
    DEFAULT_BUCKET_ELEMENTS,
};
use crate::parallel::grid::Groups;
use crate::real::Precision;

/// One model chunk of this rank with its optimizer state and data-parallel buckets.
pub(super) struct Chunk<D: Device> {
    pub model: Gpt<D>,
    pub opt: Optimizer<D>,
    pub buckets: GradBuckets<D::Buf>,
    /// The flat device buffers of the sequence-parallel and the tied-embedding sums, made at the
    /// first step and kept.
    sums_flat: [Option<D::Buf>; 2],
}

/// AdamW with the full state on every data-parallel rank, or sharded over them (ZeRO-1).
pub(super) enum Optimizer<D: Device> {
    Replicated(AdamW<D>),
    Distributed(DistributedAdamW<D>),
}

impl<D: Device> Optimizer<D> {
    /// The weight decay of the next step (`--weight-decay-incr-style`'s schedule).
    /// The next step's weight decay and, under `--decoupled-lr`, the embedding's and output
    /// layer's rate (both from the schedule).
    pub fn set_rates(&mut self, weight_decay: f32, decoupled_lr: Option<f32>) {
        let config = match self {
            Optimizer::Replicated(o) => &mut o.config,
            Optimizer::Distributed(o) => &mut o.config,
        };
        (config.weight_decay, config.decoupled_lr) = (weight_decay, decoupled_lr);
    }
    pub fn step_count(&self) -> u64 {
        match self {
            Optimizer::Replicated(o) => o.step,
            Optimizer::Distributed(o) => o.step,
        }
    }
    pub fn state_bytes(&self, dev: &D) -> usize {
        match self {
            Optimizer::Replicated(o) => o.m.iter().chain(&o.v).map(|b| 4 * dev.len(b)).sum(),
            Optimizer::Distributed(o) => o.state_bytes(dev),
        }
    }
}

impl<D: Device> Chunk<D> {
    /// Bytes of gradients by the sharding's formula (`DistributedAdamW::formula_grad_bytes`) and
    /// measured (the most whole gradients held at once, and ZeRO-2's summed shard and packed
    /// copies).
    pub fn grad_bytes(&self, dev: &D) -> (usize, usize) {
        let params = &self.model.params;
        match &self.opt {
            Optimizer::Replicated(_) => (4 * params.num_elements(), params.peak_grad_bytes(dev)),
            Optimizer::Distributed(z) => (
                z.formula_grad_bytes(params, &self.model.backward_order()),
                params.peak_grad_bytes(dev) + z.summed_grad_bytes(dev),
            ),
        }
    }

    /// The chunk `plan` describes, its weights initialised from the seed, with its optimizer and
    /// buckets.
    pub fn new(dev: &D, cfg: &TrainConfig, mp: ModelParallel, plan: &ChunkPlan, groups: &Groups) -> Chunk<D> {
        let mut model = Gpt::new_chunk(dev, cfg.model.clone(), mp, plan.clone(), cfg.seed);
        model.set_recompute(cfg.recompute);
        model.set_precision(dev, cfg.precision);
        model.set_dropout(cfg.dropout);
        model.set_reset_position_ids(cfg.documents.positions);
        model.set_reset_attention_mask(cfg.documents.attention);
        // ZeRO-1 shards over the ranks that hold the same parameters: data-parallel x depth.
        let replica = &*groups.replica;
        // ZeRO-2 sends a bucket every micro-batch and holds it whole until then: a layer apiece,
        // and a parameter as large alone (sent from its own buffer where the device can).
        let zero2 = cfg.shard_grads && cfg.use_distributed_optimizer;
        let bucket = match (cfg.ddp_bucket_size, zero2) {
            (Some(elements), _) => elements,
            (None, true) => model.largest_layer_elements(),
            (None, false) => DEFAULT_BUCKET_ELEMENTS,
        };
        let info = &model.params.info;
        let buckets = if zero2 { GradBuckets::with_large_apart(info, bucket) } else { GradBuckets::new(info, bucket) };
        let buckets = buckets.with_bf16(cfg.grad_reduce_in_bf16);
        let opt = if cfg.use_distributed_optimizer && replica.size() > 1 {
            let ranks = (replica.rank(), replica.size());
            let reduce = GradReduce {
                bf16: cfg.grad_reduce_in_bf16,
                overlap: cfg.overlap_grad_reduce,
                shard_grads: cfg.shard_grads,
            };
            let early = (reduce, final_in_backward(cfg, &model, groups));
            Optimizer::Distributed(DistributedAdamW::new(
                dev,
                &mut model.params,
                cfg.adam,
                ranks,
                &buckets.ranges(),
                early,
            ))
        } else {
            Optimizer::Replicated(AdamW::new(dev, &model.params, cfg.adam))
        };
        Chunk { model, opt, buckets, sums_flat: [None, None] }
    }

    /// The gradients as backward leaves them for the sums: the buckets' all-reduces (posted
    /// during backward from the gradients as they were then, so they finish before the other sums
    /// touch the gradients), and fp16's rounding (fp16 gradients overflow to infinity where real
    /// half precision would). `finish_gradients` follows, on every chunk.
    pub fn settle_gradients(&mut self, dev: &D, groups: &Groups, precision: Precision) {
        if let (Optimizer::Replicated(_), true) = (&self.opt, groups.replica.size() > 1) {
            self.buckets.finish(dev, &*groups.replica, &mut self.model.params);
        }
        if precision == Precision::F16 {
            for g in self.model.params.grads.iter_mut() {
                dev.round_to(g, Precision::F16);
            }
        }
    }

    /// Finalises the settled gradients (`settle_gradients`): the tied-embedding and the
    /// sequence-parallel sums, then the distributed optimizer's reduce-scatter (which says where
    /// its shard of summed gradients is; it reads the gradients after the tied sum). Under the
    /// distributed optimizer with 1-D tensor parallelism the sequence-parallel sum runs on the
    /// shard after the reduce-scatter (`sp_after_scatter`), so those buckets need not wait.
    pub fn finish_gradients(&mut self, dev: &D, groups: &Groups) -> Option<ShardGrads> {
        let [sequence_parallel, tied] = &mut self.sums_flat;
        // An untied output layer is a parameter of the last stage alone: no pair to sum over.
        if !self.model.cfg.arch.untie_embeddings {
            reduce_tied_embedding(dev, &*groups.embedding, &mut self.model.params, tied);
        }
        let params = &mut self.model.params;
        let sp_after = matches!(self.opt, Optimizer::Distributed(_)) && sp_after_scatter(groups);
        if !sp_after {
            reduce_sequence_parallel_grads(dev, &*groups.tp, params, sequence_parallel);
        }
        let Optimizer::Distributed(z) = &mut self.opt else { return None };
        let mut shard = z.reduce_scatter_grads(dev, &*groups.replica, params);
        if sp_after {
            let info = &params.info;
            z.sum_segments(dev, &*groups.tp, &mut shard, |i| info[i].sequence_parallel);
        }
        Some(shard)
    }

    /// The distributed optimizer, which every chunk has under ZeRO-1.
    fn zero(&self) -> &DistributedAdamW<D> {
        match &self.opt {
            Optimizer::Distributed(z) => z,
            Optimizer::Replicated(_) => unreachable!("every chunk shards its state under ZeRO-1"),
        }
    }

    /// One AdamW step at `lr`, the clip and loss scale folded into the factor at `grad_scale` (on
    /// the device), from the finalised gradients (`shard`: the ZeRO-1 shard `finish_gradients`
    /// returned); the mixed-precision working copy of the weights follows the masters (written by
    /// the replicated AdamW in the same pass, refreshed after ZeRO-1's all-gather, or as each
    /// bucket arrives under `gather_later`: `--overlap-param-gather`).
    pub fn step(
        &mut self,
        dev: &D,
        groups: &Groups,
        shard: Option<&ShardGrads>,
        (lr, gather_later): (f32, bool),
        grad_scale: (&D::Scalars, usize),
    ) {
        match &mut self.opt {
            Optimizer::Replicated(o) => {
                let (params, working) = self.model.params_and_working();
                o.step(dev, params, working, lr, grad_scale);
                self.model.shift_norm_weights(dev);
            }
            Optimizer::Distributed(z) => {
                let shard = shard.expect("a ZeRO-1 chunk's gradients are reduce-scattered before its step");
                let params = &mut self.model.params;
                let arriving = z.step(dev, &*groups.replica, params, shard, lr, grad_scale, gather_later);
                if arriving.is_empty() {
                    self.model.refresh_working_weights(dev);
                }
                self.model.set_arriving(arriving);
            }
        }
    }
}

/// Under the distributed optimizer, which parameters' gradients are final when backward leaves
/// them, so their buckets may reduce-scatter during backward (`--overlap-grad-reduce`) and, under
/// ZeRO-2, every micro-batch: not the tied word embedding where another copy of it is summed in
/// first (the first and last stages' embedding group, or zb-v's two chunks on one stage), not
/// the sequence-parallel ones under 2-D / 2.5-D tensor parallelism (summed over the
/// tensor-parallel group first; under 1-D that sum follows the reduce-scatter:
/// `sp_after_scatter`), and none under fp16 (rounded to binary16 before the reduction).
fn final_in_backward<D: Device>(cfg: &TrainConfig, model: &Gpt<D>, groups: &Groups) -> impl Fn(usize) -> bool {
    let on = cfg.precision != Precision::F16;
    let copies = groups.embedding.size() > 1 || groups.grid.pipeline_v;
    let (tied, tp) = (!model.cfg.arch.untie_embeddings && copies, groups.tp.size() > 1);
    let sp_after = sp_after_scatter(groups);
    let info: Vec<(bool, bool)> =
        model.params.info.iter().map(|p| (p.name == "embedding.word_embeddings.weight", p.sequence_parallel)).collect();
    move |i| on && !(tied && info[i].0) && !(tp && info[i].1 && !sp_after)
}

/// Whether the distributed optimizer sums the sequence-parallel gradients over the
/// tensor-parallel group after its reduce-scatter, on its shard: under 1-D tensor parallelism,
/// whose peers hold the same parameters' shapes and so the same shard layout.
fn sp_after_scatter(groups: &Groups) -> bool {
    groups.tp.size() > 1 && groups.grid.summa().is_none()
}

/// zb-v's V puts the word embedding (chunk 0) and the output layer's tied copy of it (chunk 1) on
/// stage 0 together: their gradients are summed here, where other layouts sum them over the
/// embedding group (`finish_gradients`), so the two copies stay equal. Nothing elsewhere.
pub(super) fn sum_tied_within_stage<D: Device>(dev: &D, chunks: &mut [Chunk<D>]) {
    let [first, last] = chunks else { return };
    if first.model.cfg.arch.untie_embeddings {
        return;
    }
    let name = "embedding.word_embeddings.weight";
    let find = |c: &Chunk<D>| c.model.params.info.iter().position(|p| p.name == name);
    if let (Some(i), Some(j)) = (find(first), find(last)) {
        let (a, b) = (&mut first.model.params.grads[i], &mut last.model.params.grads[j]);
        dev.add_assign(a, b);
        let n = dev.len(a);
        dev.copy(b, 0, a, 0, n);
    }
}

/// The gradients' global sum of squares over every chunk of every rank, into `acc[0]` on the
/// device. Under ZeRO-1 (`zero`) from the shards, each element counted once across the world:
/// summed on the device and over the world on its communicator where the reduce-scatter left
/// them on the device (`ShardGrads::OnDevice`), else on the host as they came. Otherwise from the
/// whole gradients on the device, each parameter counted once (`counts_parameters`: shards
/// everywhere, replicated parameters on tensor-parallel rank 0) over the model-parallel group.
#[allow(clippy::too_many_arguments)]
pub(super) fn grad_sum_squares<D: Device>(
    dev: &D,
    chunks: &[Chunk<D>],
    shards: &[Option<ShardGrads>],
    zero: bool,
    groups: &Groups,
    tp_rank: usize,
    counts_parameters: bool,
    acc: &mut D::Scalars,
) {
    if !zero {
        let sets: Vec<_> = chunks.iter().map(|c| &c.model.params).collect();
        return global_grad_sum_squares(dev, &sets, tp_rank, counts_parameters, &*groups.mp, acc);
    }
    if shards.iter().all(|g| matches!(g, Some(ShardGrads::OnDevice))) {
        let counted: Vec<&D::Buf> =
            chunks.iter().flat_map(|c| c.zero().counted_grads(&c.model.params, tp_rank)).collect();
        dev.write_scalars(acc, &[0.0]);
        dev.sum_squares_into(&counted, acc, 0);
        return all_reduce_scalars(dev, &*groups.world, acc, 1, ReduceOp::Sum);
    }
    let local: f64 = chunks
        .iter()
        .zip(shards)
        .map(|(c, g)| match g {
            Some(ShardGrads::Host(g)) => c.zero().sum_squares(g, &c.model.params, tp_rank),
            _ => unreachable!("a ZeRO-1 rank's shards are all on the host or all on the device"),
        })
        .sum();
    let mut total = [local];
    groups.world.all_reduce(&mut total, ReduceOp::Sum);
    dev.write_scalars(acc, &total);
}

/// `--log-num-zeros-in-grad`: the gradient elements that are zero, each counted once (the norm's
/// rule, `grad_sum_squares`), summed over the model-parallel group (under ZeRO-1 the world, from
/// the shards). A diagnostic: it copies the counted gradients to the host.
pub(super) fn grad_zeros<D: Device>(
    dev: &D,
    chunks: &[Chunk<D>],
    shards: &[Option<ShardGrads>],
    zero: bool,
    groups: &Groups,
    (tp_rank, counts_parameters): (usize, bool),
) -> u64 {
    let zeros_in = |buf: &D::Buf| {
        let mut host = vec![0f32; dev.len(buf)];
        dev.download(buf, &mut host);
        host.iter().filter(|&&g| g == 0.0).count() as f64
    };
    let (local, group): (f64, &dyn crate::comm::Comm) = if !zero {
        let counted = chunks.iter().flat_map(|c| {
            let p = &c.model.params;
            (0..p.info.len())
                .filter(move |&i| counts_parameters && p.info[i].counted_in_norm(tp_rank))
                .map(move |i| &p.grads[i])
        });
        (counted.map(zeros_in).sum(), &*groups.mp)
    } else {
        let local = chunks
            .iter()
            .zip(shards)
            .map(|(c, g)| match g {
                Some(ShardGrads::Host(g)) => c.zero().count_zeros(g, &c.model.params, tp_rank) as f64,
                _ => c.zero().counted_grads(&c.model.params, tp_rank).into_iter().map(zeros_in).sum(),
            })
            .sum();
        (local, &*groups.world)
    };
    let mut total = [local];
    group.all_reduce(&mut total, ReduceOp::Sum);
    total[0] as u64
}
