//! `trident train`: the training loop on one rank of any (tensor, data) parallel layout. Reads
//! this data-parallel rank's slice of each global batch from the memory-mapped dataset,
//! accumulates micro-batch gradients, reduces them over data-parallel ranks in buckets that start
//! while backward is still running, clips by the global norm, steps AdamW on Megatron's schedule,
//! logs, validates and checkpoints; resuming continues the uninterrupted run bit for bit.

use crate::checkpoint::shape::{model_from_shard, model_meta};
use crate::checkpoint::{self, SavedTensor, Shard};
use crate::comm::placement::Placement;
use crate::comm::runtime::Runtime;
use crate::comm::{CommCounters, Pending, ReduceOp};
use crate::config::TrainConfig;
use crate::data::gpt_dataset::{split_ranges, GptDataset};
use crate::data::indexed::IndexedDataset;
use crate::device::cpu::{peak, CpuDevice};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::log::{iteration_line, validation_line, IterationStats, JsonLog};
use crate::gpu::collectives::StreamApi;
use crate::model::gpt::ChunkOutput;
use crate::model::{ChunkPlan, Gpt, ModelParallel};
use crate::optim::distributed::{self, DistributedAdamW};
use crate::optim::scaler::LossScaler;
use crate::optim::{clip_coefficient, AdamW};
use crate::parallel::data::{global_grad_norm, reduce_sequence_parallel_grads, reduce_tied_embedding, GradBuckets};
use crate::parallel::grid::{Grid, Groups, TensorMode};
use crate::parallel::pipeline::{self, Pass, Schedule};
use crate::parallel::summa::Summa;
use crate::parallel::tensor::TensorParallel;
use crate::real::Precision;
use crate::stop::{self, StopReason, StopWatch};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What a finished run reports back (used by tests and the final summary line).
#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    pub iterations: u64,
    /// Loss of every iteration this process ran, in order.
    pub losses: Vec<f64>,
    pub final_val_loss: Option<f64>,
    /// Per model chunk: the most micro-batches whose activations were held at once in the last
    /// iteration.
    pub peak_in_flight: Vec<usize>,
    /// Per pipeline stage: the measured bubble fraction, and the schedule's theory.
    pub bubble_fractions: Vec<f64>,
    pub bubble_theory: f64,
    /// Bytes of activation buffers this rank holds (all chunks) after the last iteration.
    pub activation_bytes: usize,
    /// Bytes of AdamW state (both moments) this rank holds.
    pub optimizer_state_bytes: usize,
    /// Why the run stopped before its last iteration after a checkpoint (`--exit-signal-handler`,
    /// `--exit-duration-in-mins`); the process then exits with `stop::REQUEUE_EXIT_CODE`.
    pub stopped: Option<StopReason>,
}

/// The train, validation and test datasets of a run.
struct Datasets {
    train: GptDataset,
    valid: Option<GptDataset>,
    test: Option<GptDataset>,
}

fn build_datasets(cfg: &TrainConfig, vocab: usize) -> Result<Datasets> {
    let data = Arc::new(IndexedDataset::open(&cfg.data_path)?);
    // Megatron's GPT split counts sequences (its `numel_low_level_dataset`), not documents.
    let ranges = split_ranges(&cfg.split, data.num_sequences())?;
    let gbs = cfg.global_batch_size;
    let train_samples = cfg.train_iters as usize * gbs;
    let valid_samples = (cfg.train_iters / cfg.eval_interval + 1) as usize * cfg.eval_iters as usize * gbs;
    let test_samples = cfg.eval_iters as usize * gbs;
    let build = |range: std::ops::Range<usize>, samples: usize, name: &str| {
        GptDataset::build(data.clone(), range, samples, cfg.seq_length, cfg.seed, name, vocab)
    };
    let train = build(ranges[0].clone(), train_samples.max(1), "train")?;
    let optional = |range: std::ops::Range<usize>, samples: usize, name: &str| -> Result<Option<GptDataset>> {
        if range.is_empty() || samples == 0 {
            Ok(None)
        } else {
            build(range, samples, name).map(Some)
        }
    };
    Ok(Datasets {
        valid: optional(ranges[1].clone(), valid_samples, "valid")?,
        test: optional(ranges[2].clone(), test_samples, "test")?,
        train,
    })
}

/// Fills `tokens` and `labels` (sample-major) with `count` consecutive samples from `first`.
fn fetch_batch(
    ds: &GptDataset,
    first: u64,
    count: usize,
    seq: usize,
    tokens: &mut [u32],
    labels: &mut [u32],
) -> Result<()> {
    let mut sample = vec![0u32; seq + 1];
    for i in 0..count {
        ds.get(first as usize + i, &mut sample)?;
        tokens[i * seq..(i + 1) * seq].copy_from_slice(&sample[..seq]);
        labels[i * seq..(i + 1) * seq].copy_from_slice(&sample[1..]);
    }
    Ok(())
}

/// The first sample of micro-batch `micro` of a global batch starting at `consumed`, for
/// data-parallel rank `dp_rank` (Megatron's sampler: each chunk of micro x dp samples is split in
/// rank order).
fn micro_batch_start(consumed: u64, micro: usize, mbs: usize, grid: &Grid) -> u64 {
    consumed + (micro * mbs * grid.dp + grid.dp_rank * mbs) as u64
}

fn num_micro_batches(cfg: &TrainConfig, grid: &Grid) -> usize {
    cfg.global_batch_size / (cfg.micro_batch_size * grid.dp)
}

/// One model chunk of this rank with its optimizer state and data-parallel buckets.
struct Chunk<D: Device> {
    model: Gpt<D>,
    opt: Optimizer<D>,
    buckets: GradBuckets<D::Buf>,
}

/// AdamW with the full state on every data-parallel rank, or sharded over them (ZeRO-1).
enum Optimizer<D: Device> {
    Replicated(AdamW<D>),
    Distributed(DistributedAdamW<D>),
}

impl<D: Device> Optimizer<D> {
    fn step_count(&self) -> u64 {
        match self {
            Optimizer::Replicated(o) => o.step,
            Optimizer::Distributed(o) => o.step,
        }
    }
    fn state_bytes(&self, dev: &D) -> usize {
        match self {
            Optimizer::Replicated(o) => o.m.iter().chain(&o.v).map(|b| 4 * dev.len(b)).sum(),
            Optimizer::Distributed(o) => o.state_bytes(dev),
        }
    }
}

/// A span of the timing trace: what ran, for which (micro-batch, chunk), from when, how long.
#[derive(Clone, Copy, Debug)]
struct Span {
    kind: SpanKind,
    micro: usize,
    chunk: usize,
    start_us: f64,
    dur_us: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanKind {
    Forward,
    Backward,
    Send,
    Recv,
    Optimizer,
}

impl SpanKind {
    fn name(self) -> &'static str {
        match self {
            SpanKind::Forward => "forward",
            SpanKind::Backward => "backward",
            SpanKind::Send => "send",
            SpanKind::Recv => "recv",
            SpanKind::Optimizer => "optimizer",
        }
    }
    fn from_code(code: f64) -> SpanKind {
        [SpanKind::Forward, SpanKind::Backward, SpanKind::Send, SpanKind::Recv, SpanKind::Optimizer][code as usize]
    }
    fn code(self) -> f64 {
        self as usize as f64
    }
}

/// The timing record of this rank: trace spans (with `--timing-trace`) and the per-iteration
/// pipeline busy and wall time behind the measured bubble fraction.
struct Timeline {
    origin: Instant,
    record_spans: bool,
    spans: Vec<Span>,
    busy_secs: f64,
    wall_secs: f64,
    /// The most micro-batch activation sets held at once in one iteration.
    peak_live: usize,
}

impl Timeline {
    fn now_us(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1e6
    }
    fn span(&mut self, kind: SpanKind, micro: usize, chunk: usize, start_us: f64) {
        let dur_us = self.now_us() - start_us;
        if matches!(kind, SpanKind::Forward | SpanKind::Backward) {
            self.busy_secs += dur_us * 1e-6;
        }
        if self.record_spans {
            self.spans.push(Span { kind, micro, chunk, start_us, dur_us });
        }
    }
}

/// Tags of pipeline messages: which (micro-batch, chunk) on the receiving stage, which direction.
fn p2p_tag(micro: usize, chunk: usize, chunks: usize, backward: bool) -> u32 {
    ((micro * chunks + chunk) * 2 + usize::from(backward)) as u32
}

/// Everything one training or evaluation pass over the pipeline needs.
struct Pipeline<'a, D: Device> {
    dev: &'a D,
    groups: &'a Groups,
    tp: TensorParallel<'a>,
    schedule: Schedule,
    chunks: usize,
    micro: usize,
    hidden_len: usize,
    zero: bool,
    /// Message buffers: reused across passes; the ones of sends not yet known delivered; and the
    /// MPI path's pending sends.
    messages: std::cell::RefCell<Messages<D::Buf>>,
}

/// The pipeline's message buffers (device buffers of `hidden_len`).
struct Messages<B> {
    free: Vec<B>,
    in_flight: Vec<B>,
    host_sends: Vec<Box<dyn Pending>>,
}

impl<B> Default for Messages<B> {
    fn default() -> Self {
        Messages { free: Vec::new(), in_flight: Vec::new(), host_sends: Vec::new() }
    }
}

impl<D: Device> Pipeline<'_, D> {
    fn stages(&self) -> usize {
        self.groups.grid.pp
    }
    fn stage(&self) -> usize {
        self.groups.grid.pp_rank
    }
    fn virtual_stage(&self, chunk: usize) -> usize {
        chunk * self.stages() + self.stage()
    }
    fn last_virtual(&self) -> usize {
        self.stages() * self.chunks - 1
    }

    /// A message buffer: a reused one (sends the device has delivered by now included), else a
    /// new one.
    fn buffer(&self) -> D::Buf {
        let mut m = self.messages.borrow_mut();
        if m.free.is_empty() && !m.in_flight.is_empty() && self.dev.device_p2p().is_some_and(|p| p.sends_delivered()) {
            let delivered = std::mem::take(&mut m.in_flight);
            m.free.extend(delivered);
        }
        let reused = m.free.pop();
        drop(m);
        reused.unwrap_or_else(|| self.dev.alloc(self.hidden_len))
    }

    /// Gives a buffer whose message the chunk has taken back for reuse.
    fn done_with(&self, buf: D::Buf) {
        self.messages.borrow_mut().free.push(buf);
    }

    /// Receives the message for (micro, chunk) from the previous stage (activations) or the
    /// next (`backward`: gradients): through the device's pipeline links in order, or through
    /// MPI on host memory matched by tag.
    fn recv(&self, tl: &mut Timeline, micro: usize, chunk: usize, backward: bool) -> D::Buf {
        let t0 = tl.now_us();
        let mut buf = self.buffer();
        match self.dev.device_p2p() {
            Some(p2p) => p2p.recv(&mut buf, backward),
            None => {
                let from = pipeline::recv_source(self.stages(), self.stage(), backward);
                let tag = p2p_tag(micro, chunk, self.chunks, backward);
                match self.dev.host_f32(&mut buf) {
                    Some(host) => self.groups.pp.recv_tagged(host, from, tag),
                    None => {
                        let mut host = vec![0f32; self.hidden_len];
                        self.groups.pp.recv_tagged(&mut host, from, tag);
                        self.dev.upload(&mut buf, &host);
                    }
                }
            }
        }
        tl.span(SpanKind::Recv, micro, chunk, t0);
        buf
    }

    /// Sends (micro, chunk)'s output on to the next virtual stage, or (`backward`) the gradient
    /// of its input back to the previous one. Neither path blocks: the buffer is kept until the
    /// send is known delivered (`finish_sends`).
    fn send(&self, tl: &mut Timeline, buf: D::Buf, micro: usize, chunk: usize, backward: bool) {
        let t0 = tl.now_us();
        match self.dev.device_p2p() {
            Some(p2p) => {
                p2p.send(&buf, backward);
                self.messages.borrow_mut().in_flight.push(buf);
            }
            None => {
                let (to, to_chunk) = pipeline::send_target(self.stages(), self.stage(), chunk, backward);
                let host = match self.dev.host_f32_ref(&buf) {
                    Some(h) => h.to_vec(),
                    None => {
                        let mut h = vec![0f32; self.hidden_len];
                        self.dev.download(&buf, &mut h);
                        h
                    }
                };
                let pending = self.groups.pp.send_start(host, to, p2p_tag(micro, to_chunk, self.chunks, backward));
                let mut m = self.messages.borrow_mut();
                m.host_sends.push(pending);
                m.free.push(buf);
            }
        }
        tl.span(SpanKind::Send, micro, chunk, t0);
    }

    /// The forward pass of (micro, chunk) on this stage: receives its input (after the first
    /// virtual stage), runs the chunk and sends its output on (before the last), or returns the
    /// chunk's loss sum (0 elsewhere). `timed` records the pass as busy time of a training step.
    fn forward(
        &self,
        tl: &mut Timeline,
        model: &mut Gpt<D>,
        (micro, chunk): (usize, usize),
        (tokens, labels): (&[u32], &[u32]),
        (mbs, seq): (usize, usize),
        timed: bool,
    ) -> f64 {
        let vs = self.virtual_stage(chunk);
        let hidden = (vs > 0).then(|| self.recv(tl, micro, chunk, false));
        let mut out = (vs < self.last_virtual()).then(|| self.buffer());
        let t0 = tl.now_us();
        let result =
            model.forward_micro(self.dev, self.tp, micro, tokens, hidden.as_ref(), Some(labels), mbs, seq, out.as_mut());
        if timed {
            tl.span(SpanKind::Forward, micro, chunk, t0);
        }
        if let Some(h) = hidden {
            self.done_with(h);
        }
        match (result, out) {
            (ChunkOutput::Loss(l), _) => l,
            (ChunkOutput::Hidden, Some(h)) => {
                self.send(tl, h, micro, chunk, false);
                0.0
            }
            (ChunkOutput::Hidden, None) => unreachable!("a chunk before the last has an output buffer"),
        }
    }

    /// Waits until every send of this pass was delivered and keeps the buffers for reuse.
    fn finish_sends(&self) {
        let host_sends = std::mem::take(&mut self.messages.borrow_mut().host_sends);
        for s in host_sends {
            s.wait();
        }
        if let Some(p2p) = self.dev.device_p2p() {
            p2p.wait_sends();
        }
        let mut m = self.messages.borrow_mut();
        let delivered = std::mem::take(&mut m.in_flight);
        m.free.extend(delivered);
    }

    /// One iteration's forward and backward passes in this stage's schedule order. Returns the
    /// summed token loss (nonzero on the last stage only).
    #[allow(clippy::too_many_arguments)]
    fn train_step(
        &self,
        chunks: &mut [Chunk<D>],
        ds: &GptDataset,
        cfg: &TrainConfig,
        consumed: u64,
        grad_scale: f32,
        tl: &mut Timeline,
    ) -> Result<f64> {
        let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
        let grid = &self.groups.grid;
        let mut tokens = vec![0u32; mbs * seq];
        let mut labels = vec![0u32; mbs * seq];
        let mut loss_sum = 0.0;
        let started = tl.now_us();
        let mut peak_live = 0;
        for pass in pipeline::passes(self.schedule, self.stages(), self.stage(), self.micro, self.chunks) {
            match pass {
                Pass::Forward { micro, chunk } => {
                    fetch_batch(ds, micro_batch_start(consumed, micro, mbs, grid), mbs, seq, &mut tokens, &mut labels)?;
                    let model = &mut chunks[chunk].model;
                    loss_sum += self.forward(tl, model, (micro, chunk), (&tokens, &labels), (mbs, seq), true);
                    // Activation sets the chunks hold right now, counted by the model itself.
                    peak_live = peak_live.max(chunks.iter().map(|c| c.model.in_flight()).sum::<usize>());
                }
                Pass::Backward { micro, chunk } => {
                    let vs = self.virtual_stage(chunk);
                    let d_out = (vs < self.last_virtual()).then(|| self.recv(tl, micro, chunk, true));
                    let mut d_in = (vs > 0).then(|| self.buffer());
                    // Data-parallel buckets start reducing during each chunk's last backward (the
                    // distributed optimizer reduce-scatters once backward is done instead).
                    let last = micro + 1 == self.micro && self.groups.replica.size() > 1 && !self.zero;
                    let Chunk { model, buckets, .. } = &mut chunks[chunk];
                    let (dev, dp) = (self.dev, &*self.groups.replica);
                    let mut ready = |set: &crate::tensor::ParamSet<D>, params: std::ops::Range<usize>| {
                        if last {
                            buckets.mark_final(dev, dp, set, params);
                        }
                    };
                    let t0 = tl.now_us();
                    model.backward_micro(self.dev, self.tp, micro, d_out.as_ref(), d_in.as_mut(), grad_scale, &mut ready);
                    tl.span(SpanKind::Backward, micro, chunk, t0);
                    if let Some(d) = d_out {
                        self.done_with(d);
                    }
                    if let Some(d) = d_in {
                        self.send(tl, d, micro, chunk, true);
                    }
                }
            }
        }
        self.finish_sends();
        tl.wall_secs += (tl.now_us() - started) * 1e-6;
        tl.peak_live = tl.peak_live.max(peak_live);
        Ok(loss_sum)
    }

    /// Forward passes only over `iters` global batches from sample `first` (validation): every
    /// stage runs (micro-batch, chunk) in order, which respects every dependency.
    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &self,
        chunks: &mut [Chunk<D>],
        ds: &GptDataset,
        cfg: &TrainConfig,
        first: u64,
        iters: u64,
        tl: &mut Timeline,
    ) -> Result<f64> {
        let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
        let grid = &self.groups.grid;
        let mut tokens = vec![0u32; mbs * seq];
        let mut labels = vec![0u32; mbs * seq];
        let mut total = 0.0;
        for it in 0..iters {
            let consumed = first + it * cfg.global_batch_size as u64;
            for micro in 0..self.micro {
                fetch_batch(ds, micro_batch_start(consumed, micro, mbs, grid), mbs, seq, &mut tokens, &mut labels)?;
                for chunk in 0..self.chunks {
                    let model = &mut chunks[chunk].model;
                    total += self.forward(tl, model, (micro, chunk), (&tokens, &labels), (mbs, seq), false);
                    model.discard(micro);
                }
            }
            self.finish_sends();
        }
        // The loss lives on the last stage; the sum over the pipeline and data-parallel groups
        // gives every rank the mean.
        let total = self.groups.dp.sum_f64(self.groups.pp.sum_f64(total));
        Ok(total / (iters as usize * cfg.global_batch_size * seq) as f64)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    iteration: u64,
    consumed_train: u64,
    consumed_valid: u64,
    /// The fp16 loss scaler's state, when there is one.
    scaler: Option<LossScaler>,
}

#[allow(clippy::too_many_arguments)]
fn save_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    groups: &Groups,
    chunks: &[Chunk<D>],
    cfg: &TrainConfig,
    progress: Progress,
    say: bool,
) -> Result<()> {
    let grid = &groups.grid;
    let mut shard = Shard::default();
    let first = &chunks[0];
    let meta = [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", progress.iteration.to_string()),
        ("consumed_train_samples", progress.consumed_train.to_string()),
        ("consumed_valid_samples", progress.consumed_valid.to_string()),
        ("adam_step", first.opt.step_count().to_string()),
        ("seed", cfg.seed.to_string()),
        ("rng", "philox4x32-10 keyed by (seed, name); no other state".to_string()),
        ("seq_length", cfg.seq_length.to_string()),
        ("tokenizer", "ByteTokenizer".to_string()),
        ("tensor_model_parallel_size", grid.tp.to_string()),
        ("tensor_model_parallel_rank", grid.tp_rank.to_string()),
        ("pipeline_model_parallel_size", grid.pp.to_string()),
        ("pipeline_model_parallel_rank", grid.pp_rank.to_string()),
        ("virtual_pipeline_chunks", chunks.len().to_string()),
        ("decoder_first_pipeline_num_layers", cfg.first_stage_layers.map_or("none".into(), |n| n.to_string())),
        ("decoder_last_pipeline_num_layers", cfg.last_stage_layers.map_or("none".into(), |n| n.to_string())),
        ("data_parallel_size", grid.dp.to_string()),
        ("sequence_parallel", first.model.mp.sequence_parallel.to_string()),
        ("tensor_parallel_mode", grid.tensor_mode.describe()),
        ("summa_q", grid.summa().map_or(0, |c| c.q).to_string()),
        ("tesseract_depth", grid.summa().map_or(0, |c| c.depth).to_string()),
    ];
    if let Some(sc) = progress.scaler {
        shard.meta.insert("loss_scale".into(), sc.scale.to_string());
        shard.meta.insert("loss_scale_growth_tracker".into(), sc.growth_tracker.to_string());
        shard.meta.insert("loss_scale_hysteresis_left".into(), sc.hysteresis_left.to_string());
    }
    for (k, v) in meta.into_iter().chain(model_meta(&first.model.cfg)) {
        shard.meta.insert(k.to_string(), v);
    }
    let download = |buf: &D::Buf, n: usize| {
        let mut host = vec![0.0f32; n];
        dev.download(buf, &mut host);
        host
    };
    for (c, chunk) in chunks.iter().enumerate() {
        let model = &chunk.model;
        // Whole moments per parameter (gathered from the data-parallel shards under ZeRO-1), so
        // a checkpoint does not depend on the optimizer's sharding.
        let (m, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) = match &chunk.opt {
            Optimizer::Replicated(o) => (
                o.m.iter().zip(&model.params.info).map(|(b, p)| download(b, p.numel())).collect(),
                o.v.iter().zip(&model.params.info).map(|(b, p)| download(b, p.numel())).collect(),
            ),
            Optimizer::Distributed(z) => z.gather_state(dev, &*groups.replica, &model.params),
        };
        for (i, info) in model.params.info.iter().enumerate() {
            let value = download(&model.params.values[i], info.numel());
            for (prefix, data) in [("param", value), ("adam_m", m[i].clone()), ("adam_v", v[i].clone())] {
                shard.tensors.push(SavedTensor {
                    name: format!("{prefix}/chunk{c}/{}", info.name),
                    shape: info.shape.clone(),
                    data,
                });
            }
        }
    }
    // Rank 0 prepares the staging directory, one data-parallel replica writes a shard per
    // model-parallel rank, and rank 0 renames it into place once all are written.
    if grid.rank == 0 {
        checkpoint::begin(dir, progress.iteration)?;
    }
    groups.world.barrier();
    if grid.dp_rank == 0 {
        checkpoint::write_shard(
            dir,
            progress.iteration,
            &checkpoint::shard_name(grid.tp_rank, grid.pp_rank, grid.pp),
            &shard,
        )?;
    }
    groups.world.barrier();
    if grid.rank == 0 {
        let path = checkpoint::commit(dir, progress.iteration)?;
        if say {
            println!(" saved checkpoint at iteration {} to {}", progress.iteration, path.display());
        }
    }
    groups.world.barrier();
    Ok(())
}

/// Restores weights, optimizer state and the run's position from the latest checkpoint in `dir`.
fn load_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    grid: &Grid,
    chunks: &mut [Chunk<D>],
    scaler_config: Option<LossScaler>,
    say: bool,
) -> Result<Progress> {
    let (_, path, shard) = checkpoint::load_latest(dir, &checkpoint::shard_name(grid.tp_rank, grid.pp_rank, grid.pp))?;
    let saved = model_from_shard(&shard, &path)?;
    let layout = |key: &str| shard.meta_value::<usize>(&path, key).unwrap_or(1);
    let (saved_tp, saved_pp, saved_v) = (
        layout("tensor_model_parallel_size"),
        layout("pipeline_model_parallel_size"),
        layout("virtual_pipeline_chunks"),
    );
    let saved_mode = shard.meta.get("tensor_parallel_mode").cloned().unwrap_or_else(|| "1d".into());
    if saved_mode != grid.tensor_mode.describe() {
        return Err(Error::Config(format!(
            "{} was written with --tensor-parallel-mode {saved_mode}; this run uses {}: resume with the layout it \
             was saved with, or reshard it with `trident convert --target-tensor-parallel-mode`",
            path.display(),
            grid.tensor_mode.describe()
        )));
    }
    if (saved_tp, saved_pp, saved_v) != (grid.tp, grid.pp, chunks.len()) {
        return Err(Error::Config(format!(
            "{} was written with tensor-parallel size {saved_tp}, pipeline size {saved_pp} and {saved_v} virtual \
             stages per rank; this run uses {}, {} and {}; resharding arrives with `trident convert`",
            path.display(),
            grid.tp,
            grid.pp,
            chunks.len()
        )));
    }
    let ours = &chunks[0].model.cfg;
    let mismatches: Vec<String> = model_meta(&saved)
        .into_iter()
        .zip(model_meta(ours))
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, b)| format!("{} is {} in the checkpoint but {} here", a.0, a.1, b.1))
        .collect();
    if !mismatches.is_empty() {
        return Err(Error::Config(format!("{} does not fit this model: {}", path.display(), mismatches.join("; "))));
    }
    let step: u64 = shard.meta_value(&path, "adam_step")?;
    for (c, chunk) in chunks.iter_mut().enumerate() {
        let model = &mut chunk.model;
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (i, info) in model.params.info.iter().enumerate() {
            for prefix in ["param", "adam_m", "adam_v"] {
                let t = shard.tensor(&path, &format!("{prefix}/chunk{c}/{}", info.name))?;
                if t.shape != info.shape {
                    return Err(Error::format(
                        &path,
                        format!("tensor '{}' has shape {:?}, expected {:?}", t.name, t.shape, info.shape),
                    ));
                }
                match prefix {
                    "param" => dev.upload(&mut model.params.values[i], &t.data),
                    "adam_m" => m.push(t.data.clone()),
                    _ => v.push(t.data.clone()),
                }
            }
        }
        match &mut chunk.opt {
            Optimizer::Replicated(o) => {
                for i in 0..m.len() {
                    dev.upload(&mut o.m[i], &m[i]);
                    dev.upload(&mut o.v[i], &v[i]);
                }
                o.step = step;
            }
            Optimizer::Distributed(z) => {
                z.load_state(dev, &m, &v);
                z.step = step;
            }
        }
    }
    let mut progress = Progress {
        iteration: shard.meta_value(&path, "iteration")?,
        consumed_train: shard.meta_value(&path, "consumed_train_samples")?,
        consumed_valid: shard.meta_value(&path, "consumed_valid_samples")?,
        scaler: scaler_config,
    };
    if let (Some(sc), true) = (progress.scaler.as_mut(), shard.meta.contains_key("loss_scale")) {
        sc.scale = shard.meta_value(&path, "loss_scale")?;
        sc.growth_tracker = shard.meta_value(&path, "loss_scale_growth_tracker")?;
        sc.hysteresis_left = shard.meta_value(&path, "loss_scale_hysteresis_left")?;
    }
    for c in chunks.iter_mut() {
        c.model.refresh_working_weights(dev);
    }
    if say {
        println!(" loaded checkpoint {} (iteration {})", path.display(), progress.iteration);
    }
    Ok(progress)
}

/// This rank's pipeline: its chunks' layer plans, the schedule, and the chunk count.
struct StagePlan {
    plans: Vec<ChunkPlan>,
    schedule: Schedule,
}

/// Checks the layout against the world and the model, before any work: each failure is the same
/// on every rank.
pub fn layout(cfg: &TrainConfig, rt: &Runtime) -> Result<(TrainConfig, Grid, ModelParallel)> {
    let grid = Grid::new(rt.world_size, rt.world_rank, cfg.tensor_parallel, cfg.pipeline_parallel)?;
    let cfg = cfg.for_data_parallel(grid.dp);
    if !cfg.global_batch_size.is_multiple_of(cfg.micro_batch_size * grid.dp) {
        return Err(Error::Config(format!(
            "--global-batch-size {} is not a multiple of --micro-batch-size {} x the data-parallel size {}",
            cfg.global_batch_size, cfg.micro_batch_size, grid.dp
        )));
    }
    let mode = TensorMode::new(&cfg.tensor_mode, cfg.tesseract_depth, grid.tp)?;
    let grid = grid.with_tensor_mode(mode);
    let mp = ModelParallel {
        tp_size: grid.tp,
        tp_rank: grid.tp_rank,
        sequence_parallel: cfg.sequence_parallel && grid.tp > 1,
        summa: grid.summa(),
    };
    if let Some(c) = mp.summa {
        if cfg.sequence_parallel {
            return Err(Error::Config(
                "--sequence-parallel is for 1-D tensor parallelism; 2-D and 2.5-D split every activation already"
                    .into(),
            ));
        }
        let split = c.q * c.depth;
        if !cfg.micro_batch_size.is_multiple_of(split) {
            return Err(Error::Config(format!(
                "--micro-batch-size {} is not divisible by {}, which --tensor-parallel-mode {} needs (the batch \
                 splits over the grid's {} rows{})",
                cfg.micro_batch_size,
                split,
                cfg.tensor_mode,
                c.q,
                if c.depth > 1 { format!(" in each of {} depth layers", c.depth) } else { String::new() }
            )));
        }
    }
    cfg.model.validate_parallel(&mp, cfg.seq_length)?;
    Ok((cfg, grid, mp))
}

/// The pipeline layout of this rank: how many virtual stages, which layers each chunk holds, and
/// the schedule (Megatron's choice unless `--pipeline-schedule` says otherwise).
fn stage_plan(cfg: &TrainConfig, grid: &Grid) -> Result<StagePlan> {
    let (p, layers) = (grid.pp, cfg.model.num_layers);
    let chunks = match cfg.layers_per_virtual_stage {
        None => 1,
        Some(n) => {
            if p == 1 {
                return Err(Error::Config(
                    "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1".into(),
                ));
            }
            if !layers.is_multiple_of(n * p) {
                return Err(Error::Config(format!(
                    "--num-layers {layers} is not a multiple of --num-layers-per-virtual-pipeline-stage {n} x \
                     --pipeline-model-parallel-size {p}"
                )));
            }
            layers / (n * p)
        }
    };
    let schedule = cfg.pipeline_schedule.unwrap_or(if chunks > 1 { Schedule::Interleaved } else { Schedule::OneFOneB });
    let micro = num_micro_batches(cfg, grid);
    pipeline::validate(schedule, p, chunks, micro)?;
    let (first, last) = (cfg.first_stage_layers, cfg.last_stage_layers);
    if (first.is_some() || last.is_some()) && chunks > 1 {
        return Err(Error::Unsupported("--decoder-first/last-pipeline-num-layers with virtual pipeline stages".into()));
    }
    let plans = (0..chunks)
        .map(|c| {
            let layers = pipeline::chunk_layers(layers, p, chunks, grid.pp_rank, c, first, last)?;
            Ok(ChunkPlan { layers, first: grid.pp_rank == 0 && c == 0, last: grid.pp_rank == p - 1 && c == chunks - 1 })
        })
        .collect::<Result<Vec<_>>>()?;
    // Every rank checks every stage's split, so a layout error stops all ranks alike.
    for r in 0..p {
        for c in 0..chunks {
            pipeline::chunk_layers(layers, p, chunks, r, c, first, last)?;
        }
    }
    Ok(StagePlan { plans, schedule })
}

/// Writes the Chrome trace of every rank's spans (gathered to rank 0) to `path`.
fn write_trace(path: &Path, groups: &Groups, tl: &Timeline) -> Result<()> {
    let world = &*groups.world;
    let mine: Vec<f64> =
        tl.spans.iter().flat_map(|s| [s.kind.code(), s.micro as f64, s.chunk as f64, s.start_us, s.dur_us]).collect();
    let mut counts = vec![0f64; world.size()];
    world.all_gather(&[mine.len() as f64], &mut counts);
    let longest = counts.iter().fold(0f64, |m, &c| m.max(c)) as usize;
    let mut padded = mine.clone();
    padded.resize(longest, 0.0);
    let mut all = vec![0f64; longest * world.size()];
    world.all_gather(&padded, &mut all);
    if groups.grid.rank != 0 {
        return Ok(());
    }
    let mut events = Vec::new();
    for (rank, block) in all.chunks(longest.max(1)).enumerate().take(world.size()) {
        let g = Grid { rank, ..groups.grid };
        let (tp, dp, pp) = (rank % g.tp, (rank / g.tp) % g.dp, rank / (g.tp * g.dp));
        events.push(format!(
            "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": {rank}, \"args\": {{\"name\": \"rank {rank} (pp {pp}, tp {tp}, dp {dp})\"}}}}"
        ));
        for e in block[..counts[rank] as usize].chunks_exact(5) {
            let kind = SpanKind::from_code(e[0]);
            let label = match kind {
                SpanKind::Optimizer => "optimizer".to_string(),
                _ => format!("{} mb{} c{}", kind.name(), e[1], e[2]),
            };
            events.push(format!(
                "{{\"name\": \"{label}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": 0, \"tid\": {rank}}}",
                kind.name(),
                e[3],
                e[4]
            ));
        }
    }
    let text = format!("{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{}\n]}}\n", events.join(",\n"));
    std::fs::write(path, text).map_err(|e| Error::io(path, "write", e))
}
/// The throughput a rank's device is measured against for MFU: the CPU's measured FMA peak, or
/// a GPU's nominal dense bf16 tensor-core peak.
pub struct DevicePeak {
    pub gflops: f64,
    pub what: String,
}

/// Runs `trident train` with a validated configuration on this rank of the job, on the device
/// `--device` names: the CPU backend, or the GPU Device (CUDA or HIP) on the rank's GPU.
pub fn run(cfg: &TrainConfig, rt: &Runtime) -> Result<TrainSummary> {
    match cfg.device.as_str() {
        "cuda" => {
            let driver = crate::gpu::driver::Driver::load()
                .map_err(|e| Error::Usage(format!("--device cuda: {e}; train on the CPU with --device cpu")))?;
            // Kept for the process's life: the communicators' streams borrow it.
            let driver: &'static crate::gpu::driver::Driver = Box::leak(Box::new(driver));
            let count = driver.device_count()?;
            run_on(
                cfg,
                rt,
                Some(count),
                |placement| {
                    // Placement chose the rank's GPU (local rank modulo the visible devices).
                    let ordinal = placement.gpu.as_ref().map_or(0, |g| g.ordinal);
                    crate::gpu::device::GpuDevice::check_head_dim(
                        cfg.model.hidden_size / cfg.model.num_attention_heads,
                    )?;
                    let dev = crate::gpu::device::GpuDevice::cuda(ordinal)?;
                    let (major, minor) = driver.device_info(ordinal)?.compute_capability;
                    // Dense bf16 tensor-core peaks of the data-center parts (A100: 312, H100 SXM: 989 TFLOP/s).
                    let (tflops, part) = if major >= 9 { (989.0, "H100 SXM") } else { (312.0, "A100") };
                    let what = format!("nominal dense bf16 of an {part}, sm_{major}{minor}");
                    Ok((dev, DevicePeak { gflops: tflops * 1e3, what }))
                },
                |dev, groups| attach_gpu_collectives(cfg, dev, groups, StreamApi::Cuda(driver)),
            )
        }
        "hip" => {
            let hip: &'static crate::gpu::hip::Hip = Box::leak(Box::new(crate::gpu::require_hip_runtime()?));
            let count = hip.device_count()?;
            run_on(
                cfg,
                rt,
                Some(count),
                |placement| {
                    let ordinal = placement.gpu.as_ref().map_or(0, |g| g.ordinal);
                    let head_dim = cfg.model.hidden_size / cfg.model.num_attention_heads;
                    crate::gpu::device::GpuDevice::check_head_dim_for("hip", head_dim)?;
                    let dev = crate::gpu::device::GpuDevice::hip(ordinal)?;
                    let arch = hip.device_info(ordinal)?.arch.unwrap_or_default();
                    // Dense bf16 matrix-core peaks: an MI250X GCD (half of 383 TFLOP/s), an MI300X.
                    let (tflops, part) =
                        if arch.starts_with("gfx94") { (1307.4, "MI300X") } else { (191.5, "MI250X GCD") };
                    let what = format!("nominal dense bf16 of an {part}, {arch}");
                    Ok((dev, DevicePeak { gflops: tflops * 1e3, what }))
                },
                |dev, groups| attach_gpu_collectives(cfg, dev, groups, StreamApi::Hip(hip)),
            )
        }
        _ => {
            let threads = cfg.cpu_threads.unwrap_or_else(|| rt.default_threads());
            run_on(
                cfg,
                rt,
                None,
                |_| {
                    let dev = CpuDevice::new(threads);
                    let peak = peak::measure_fma_peak(dev.pool(), 150);
                    Ok((dev, DevicePeak { gflops: peak.gflops, what: peak.isa.to_string() }))
                },
                |_, _| Ok("collectives: MPI on host memory".into()),
            )
        }
    }
}

/// `--gpu-collectives nccl|rccl` on the GPU Device, with streams made by `api` (the CUDA driver,
/// or the HIP runtime for RCCL on AMD): loads the library (every rank agrees that it could before
/// any communicator is made), then creates, eagerly and in the same order on every rank, one
/// communicator for each of this rank's groups that moves tensors (tensor parallel, the
/// tied-embedding pair, data parallel x depth) and has more than one rank, and the pipeline links.
/// Returns the start-up line saying which path the collectives take.
fn attach_gpu_collectives(
    cfg: &TrainConfig,
    dev: &mut crate::gpu::device::GpuDevice,
    groups: &Groups,
    api: StreamApi<'static>,
) -> Result<String> {
    use crate::gpu::nccl::{Flavor, Nccl};
    let flavor = match cfg.gpu_collectives.as_str() {
        "mpi" => {
            return Ok("collectives: MPI, device buffers staged through host memory (--gpu-collectives mpi)".into())
        }
        "rccl" => Flavor::Rccl,
        _ => Flavor::Nccl,
    };
    if groups.world.size() == 1 {
        return Ok("collectives: none (one rank)".into());
    }
    let loaded = Nccl::load(flavor);
    let mut failed = [f64::from(u8::from(loaded.is_err()))];
    groups.world.all_reduce(&mut failed, ReduceOp::Sum);
    let flag = format!("--gpu-collectives {}", cfg.gpu_collectives);
    let nccl = match loaded {
        Err(e) => {
            return Err(Error::Usage(format!("{flag}: {e}; or move tensors through MPI with --gpu-collectives mpi")))
        }
        Ok(_) if failed[0] > 0.0 => {
            return Err(Error::Usage(format!(
                "{flag}: {} rank(s) could not load {}; or move tensors through MPI with --gpu-collectives mpi",
                failed[0],
                flavor.api()
            )))
        }
        Ok(n) => n,
    };
    let describe = format!("{} {} ({})", flavor.api(), nccl.version().unwrap_or_default(), nccl.path());
    // The library table lives as long as the process (the communicators borrow it).
    let nccl: &'static Nccl = Box::leak(Box::new(nccl));
    let mut comms = Vec::new();
    let mut names = Vec::new();
    for (name, group) in [("tensor", &*groups.tp), ("embedding", &*groups.embedding), ("data", &*groups.replica)] {
        if group.size() > 1 {
            let c = crate::gpu::collectives::DeviceNccl::new(nccl, api, group, groups.grid.rank)
                .map_err(|e| Error::Comm(format!("{flag}: creating the {name}-parallel communicator: {e}")))?;
            comms.push((crate::gpu::device::group_key(group), c));
            names.push(name);
        }
    }
    dev.attach_comms(comms);
    if groups.pp.size() > 1 {
        // NCCL delivers one link's messages in the order they were sent (MPI matched them by
        // tag): every schedule keeps that order on every stage (`fifo_order`, checked for this
        // run's layout before any link is made; a failure would be a schedule bug).
        let (stage, n_micro) = (stage_plan(cfg, &groups.grid)?, num_micro_batches(cfg, &groups.grid));
        let (p, v) = (groups.grid.pp, stage.plans.len());
        let order = |s: usize| pipeline::passes(stage.schedule, p, s, n_micro, v);
        pipeline::fifo_order(p, v, &order)
            .and_then(|_| pipeline::fifo_order(p, v, &|_| pipeline::forward_passes(n_micro, v)))
            .map_err(|e| Error::Config(format!("{flag}: the pipeline schedule breaks in-order delivery: {e}")))?;
        let links = crate::gpu::collectives::PipelineNccl::new(nccl, api, &*groups.pp, v > 1, groups.grid.rank)
            .map_err(|e| Error::Comm(format!("{flag}: {e}")))?;
        names.push("pipeline p2p");
        dev.attach_p2p(links);
    }
    Ok(format!(
        "collectives: {describe} on device memory for the {} group(s) (--gpu-collectives {}); \
         2-D SUMMA and scalar sums through MPI on host memory",
        if names.is_empty() { "no multi-rank".to_string() } else { names.join(", ") },
        cfg.gpu_collectives
    ))
}

/// The training run on one device type; `make_device` creates this rank's device once the ranks
/// agree on their placement, and `attach` gives it device collectives for the run's groups
/// (`Device::device_comm`; returns the start-up line that says which path collectives take).
/// Where a device has none, tensors move through the host-staged MPI path (`host_f32` /
/// `download` / `upload`).
fn run_on<D: Device>(
    cfg: &TrainConfig,
    rt: &Runtime,
    device_count: Option<usize>,
    make_device: impl FnOnce(&Placement) -> Result<(D, DevicePeak)>,
    attach: impl FnOnce(&mut D, &Groups) -> Result<String>,
) -> Result<TrainSummary> {
    let started = Instant::now();
    let placement = Placement::decide(
        (rt.world_rank, rt.world_size),
        (rt.local_rank, rt.local_size),
        &cfg.device,
        device_count,
        &|name: &str| std::env::var(name).ok(),
    );
    let (cfg, grid, mp) = layout(cfg, rt)?;
    let cfg = &cfg;
    let stage = stage_plan(cfg, &grid)?;
    let say = grid.rank == 0;
    let groups = if rt.world_size > 1 { Groups::new(rt, grid) } else { Groups::single() };
    let tp = TensorParallel {
        comm: &*groups.tp,
        sequence_parallel: mp.sequence_parallel,
        summa: mp.summa.map(|c| {
            let (row, col) = (&*groups.summa_row, &*groups.summa_col);
            (Summa { row, col, q: c.q, algorithm: cfg.summa_algorithm }, &*groups.depth)
        }),
    };
    let m = &cfg.model;
    let n_micro = num_micro_batches(cfg, &grid);
    let v = stage.plans.len();
    // A placement error can be one rank's own (its environment): the ranks agree before any of
    // them stops, each failing rank says why, and rank 0 sums up.
    let mut failed = [f64::from(u8::from(placement.is_err()))];
    groups.world.all_reduce(&mut failed, ReduceOp::Sum);
    let placement = match placement {
        Err(e) => {
            eprintln!("trident: error: rank {}: {e}", grid.rank);
            return Err(Error::Usage(format!("{} rank(s) could not choose their GPU (see above)", failed[0])));
        }
        Ok(_) if failed[0] > 0.0 => {
            return Err(Error::Usage(format!("{} rank(s) could not choose their GPU (see above)", failed[0])));
        }
        Ok(p) => p,
    };
    // Creating the device can fail on one rank (its GPU, its driver): as with the placement, the
    // ranks agree before any of them stops.
    let made = make_device(&placement);
    let mut failed = [f64::from(u8::from(made.is_err()))];
    groups.world.all_reduce(&mut failed, ReduceOp::Sum);
    let (mut dev, peak) = match made {
        Err(e) if rt.world_size > 1 => {
            eprintln!("trident: error: rank {}: {e}", grid.rank);
            return Err(Error::Usage(format!("{} rank(s) could not create their device (see above)", failed[0])));
        }
        Err(e) => return Err(e),
        Ok(_) if failed[0] > 0.0 => {
            return Err(Error::Usage(format!("{} rank(s) could not create their device (see above)", failed[0])));
        }
        Ok(made) => made,
    };
    dev.set_matmul_precision(cfg.precision);
    let collectives = attach(&mut dev, &groups)?;
    if say {
        println!(" trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
        println!(
            " trident train: preset {} | {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | {} ranks: {}{}{}{} | \
             MPI: {} | device {} | peak {:.1} GFLOP/s per rank ({})",
            cfg.preset,
            m.num_layers,
            m.hidden_size,
            m.num_attention_heads,
            cfg.seq_length,
            m.vocab_size,
            m.padded_vocab_size,
            rt.world_size,
            grid.describe(),
            if mp.sequence_parallel { ", sequence parallel" } else { "" },
            if grid.pp > 1 { format!(", {} schedule, {v} chunk(s) per stage", stage.schedule.name()) } else { String::new() },
            if rt.oversubscribed { ", oversubscribed (collectives yield)" } else { "" },
            rt.library,
            dev.describe(),
            peak.gflops,
            peak.what
        );
    }
    println!(" {placement}");
    if say {
        println!(" {collectives}");
    }
    let watch = StopWatch::new(cfg.exit_signal_handler, cfg.exit_duration_mins, started)?;
    if let (Some(dir), true) = (&cfg.save, say) {
        stop::clear_marker(dir)?;
    }
    let data = build_datasets(cfg, m.vocab_size)?;
    let mut chunks: Vec<Chunk<D>> = stage
        .plans
        .iter()
        .map(|plan| {
            let mut model = Gpt::new_chunk(&dev, m.clone(), mp, plan.clone(), cfg.seed);
            model.set_recompute(cfg.recompute);
            model.set_precision(&dev, cfg.precision);
            // ZeRO-1 shards over the ranks that hold the same parameters: data-parallel x depth.
            let replica = &*groups.replica;
            let opt = if cfg.use_distributed_optimizer && replica.size() > 1 {
                let (rank, size) = (replica.rank(), replica.size());
                Optimizer::Distributed(DistributedAdamW::new(&dev, &model.params, cfg.adam, rank, size))
            } else {
                Optimizer::Replicated(AdamW::new(&dev, &model.params, cfg.adam))
            };
            let buckets = GradBuckets::new(&model.params.info, cfg.ddp_bucket_size);
            Chunk { model, opt, buckets }
        })
        .collect();
    if say {
        println!(
            " parameters: {} on this rank | micro-batch {} x {} micro-batches x {} data-parallel = global batch {} | \
             {} gradient buckets | train samples available {}",
            chunks.iter().map(|c| c.model.params.num_elements()).sum::<usize>(),
            cfg.micro_batch_size,
            n_micro,
            grid.dp,
            cfg.global_batch_size,
            chunks.iter().map(|c| c.buckets.len()).sum::<usize>(),
            data.train.len()
        );
    }
    let mut progress = Progress { scaler: cfg.loss_scaler, ..Progress::default() };
    if let Some(dir) = &cfg.load {
        progress = load_checkpoint(dir, &dev, &grid, &mut chunks, cfg.loss_scaler, say)?;
    }
    let mut json = match (&cfg.log_json, say) {
        (Some(p), true) => Some(JsonLog::open(p, cfg.load.is_some())?),
        _ => None,
    };

    // Elements of the hidden states one rank passes between pipeline stages: its rows (a sequence
    // shard under SP, a batch block under SUMMA) of its hidden columns.
    let hidden_len = match mp.summa {
        Some(c) => cfg.micro_batch_size / (c.q * c.depth) * cfg.seq_length * m.hidden_size / c.q,
        None => cfg.micro_batch_size * cfg.seq_length / if mp.sequence_parallel { grid.tp } else { 1 } * m.hidden_size,
    };
    let pipe = Pipeline {
        dev: &dev,
        groups: &groups,
        tp,
        schedule: stage.schedule,
        chunks: v,
        micro: n_micro,
        hidden_len,
        zero: cfg.use_distributed_optimizer && groups.replica.size() > 1,
        messages: Default::default(),
    };
    if (n_micro * v * 2) as u64 >= 1 << 30 {
        return Err(Error::Config(format!("{n_micro} micro-batches x {v} chunks exceed the pipeline's message tags")));
    }
    groups.world.barrier();
    let mut tl = Timeline {
        origin: Instant::now(),
        record_spans: cfg.timing_trace.is_some(),
        spans: Vec::new(),
        busy_secs: 0.0,
        wall_secs: 0.0,
        peak_live: 0,
    };
    let seq = cfg.seq_length;
    let tokens_per_iter = (cfg.global_batch_size * seq) as f64;
    let flops_per_rank = m.flops_per_iteration(cfg.global_batch_size, seq) / rt.world_size as f64;
    let grad_scale = 1.0 / tokens_per_iter as f32;
    let mut summary = TrainSummary::default();
    let (mut window_loss, mut window_iters, mut window_secs) = (0.0, 0u64, 0.0);
    // The bubble is measured from the second iteration on (the first one warms caches up).
    let (mut bubble_busy, mut bubble_wall) = (0.0, 0.0);
    let mut skipped_iterations = 0u64;

    while progress.iteration < cfg.train_iters {
        let iteration = progress.iteration + 1;
        let started = Instant::now();
        let lr = cfg.lr.at(iteration);
        for c in chunks.iter_mut() {
            c.model.params.zero_grads(&dev);
            c.model.reset_peak_in_flight();
            c.model.reset_layer_comm();
        }
        let comm_before = group_counters(&groups, &dev);
        let (busy0, wall0) = (tl.busy_secs, tl.wall_secs);
        let scale = progress.scaler.map_or(1.0, |s| s.scale);
        let loss_sum = pipe.train_step(
            &mut chunks,
            &data.train,
            cfg,
            progress.consumed_train,
            grad_scale * scale as f32,
            &mut tl,
        )?;
        if summary.iterations > 0 && grid.pp > 1 {
            // Every stage's pipeline ends with the slowest one (the optimizer waits for all), so
            // the bubble is measured against the longest pipelined time in the group.
            let mut wall = [tl.wall_secs - wall0];
            groups.pp.all_reduce(&mut wall, ReduceOp::Max);
            bubble_busy += tl.busy_secs - busy0;
            bubble_wall += wall[0];
        }
        let t_opt = tl.now_us();
        // Finalise gradients: the tied embedding and sequence-parallel sums, and the data-parallel
        // sum (bucketed all-reduce, or the distributed optimizer's reduce-scatter).
        let mut shard_grads = Vec::with_capacity(chunks.len());
        for c in chunks.iter_mut() {
            // The buckets' all-reduces were posted during backward from the gradients as they
            // were then, so they finish before the other sums touch the gradients; the
            // distributed optimizer's reduce-scatter reads the gradients after those sums.
            if let (Optimizer::Replicated(_), true) = (&c.opt, groups.replica.size() > 1) {
                c.buckets.finish(&dev, &*groups.replica, &mut c.model.params);
            }
            // fp16 gradients overflow to infinity where real half precision would.
            if cfg.precision == Precision::F16 {
                for g in c.model.params.grads.iter_mut() {
                    dev.round_to(g, Precision::F16);
                }
            }
            reduce_tied_embedding(&dev, &*groups.embedding, &mut c.model.params);
            reduce_sequence_parallel_grads(&dev, &*groups.tp, &mut c.model.params);
            if let Optimizer::Distributed(z) = &c.opt {
                shard_grads.push(z.reduce_scatter_grads(&dev, &*groups.replica, &c.model.params));
            }
        }
        let loss = groups.dp.sum_f64(groups.pp.sum_f64(loss_sum)) / tokens_per_iter;
        let grad_norm = if pipe.zero {
            let local: f64 = chunks
                .iter()
                .zip(&shard_grads)
                .map(|(c, g)| match &c.opt {
                    Optimizer::Distributed(z) => z.sum_squares(g, &c.model.params, grid.tp_rank),
                    Optimizer::Replicated(_) => unreachable!("every chunk shards its state under ZeRO-1"),
                })
                .sum();
            distributed::global_norm(local, &*groups.world)
        } else {
            let sets: Vec<_> = chunks.iter().map(|c| &c.model.params).collect();
            global_grad_norm(&dev, &sets, grid.tp_rank, mp.counts_parameters(), &*groups.mp)
        };
        // With a loss scaler, a non-finite norm (the same on every rank: it is a global sum) means
        // the scaled gradients overflowed: the step is skipped and the scale backs off.
        let overflow = progress.scaler.is_some() && !grad_norm.is_finite();
        let grad_norm = grad_norm / scale;
        if !loss.is_finite() || (!overflow && !grad_norm.is_finite()) {
            return Err(Error::Config(format!(
                "iteration {iteration}: loss {loss} / grad norm {grad_norm} is not finite; lower --lr or check the data"
            )));
        }
        if let Some(s) = progress.scaler.as_mut() {
            s.update(overflow);
        }
        if overflow {
            skipped_iterations += 1;
            if say {
                println!(
                    " iteration {iteration}: gradients overflowed at loss scale {scale}; step skipped, loss scale now {}",
                    progress.scaler.map_or(1.0, |s| s.scale)
                );
            }
        } else {
            let coef = clip_coefficient(grad_norm, cfg.clip_grad) / scale as f32;
            for (i, c) in chunks.iter_mut().enumerate() {
                match &mut c.opt {
                    Optimizer::Replicated(o) => o.step(&dev, &mut c.model.params, lr as f32, coef),
                    Optimizer::Distributed(z) => {
                        z.step(&dev, &*groups.replica, &mut c.model.params, &shard_grads[i], lr as f32, coef)
                    }
                }
                c.model.refresh_working_weights(&dev);
            }
        }
        tl.span(SpanKind::Optimizer, 0, 0, t_opt);
        // `--log-comm`: this step's counts by group, and the layers' (taken before evaluation
        // adds its forwards).
        let comm_report = cfg.log_comm.then(|| {
            let step: Vec<_> = group_counters(&groups, &dev)
                .into_iter()
                .zip(&comm_before)
                .map(|((name, n, now), (_, _, before))| (name, n, now.since(before)))
                .collect();
            let layers: Vec<(usize, Vec<[CommCounters; 3]>)> =
                chunks.iter().map(|c| (c.model.plan.layers.start, c.model.layer_comm().to_vec())).collect();
            (step, layers)
        });
        progress.iteration = iteration;
        progress.consumed_train += cfg.global_batch_size as u64;
        summary.losses.push(loss);
        summary.iterations += 1;
        summary.peak_in_flight = chunks.iter().map(|c| c.model.peak_in_flight()).collect();
        summary.activation_bytes = chunks.iter().map(|c| c.model.activation_bytes(&dev)).sum();
        summary.optimizer_state_bytes = chunks.iter().map(|c| c.opt.state_bytes(&dev)).sum();
        if summary.iterations == 1 && cfg.log_memory {
            let bound = pipeline::peak_in_flight(&pipeline::passes(stage.schedule, grid.pp, grid.pp_rank, n_micro, v));
            log_memory(&dev, &groups, &chunks, cfg, bound, say);
        }
        if summary.iterations == 1 && say {
            println!(
                " activation memory on rank 0 after the first iteration: {:.1} MiB (recompute: {:?})",
                summary.activation_bytes as f64 / 1048576.0,
                cfg.recompute
            );
        }
        window_loss += loss;
        window_iters += 1;
        window_secs += started.elapsed().as_secs_f64();

        let validate = iteration.is_multiple_of(cfg.eval_interval) || iteration == cfg.train_iters;
        let mut val_loss = None;
        if validate && cfg.eval_iters > 0 {
            if let Some(valid) = &data.valid {
                let v = pipe.evaluate(&mut chunks, valid, cfg, progress.consumed_valid, cfg.eval_iters, &mut tl)?;
                progress.consumed_valid += cfg.eval_iters * cfg.global_batch_size as u64;
                if say {
                    println!("{}", validation_line("validation", iteration, v));
                }
                val_loss = Some(v);
                summary.final_val_loss = Some(v);
            }
        }
        if iteration.is_multiple_of(cfg.log_interval) || validate {
            let secs = window_secs / window_iters as f64;
            let stats = IterationStats {
                iteration,
                train_iters: cfg.train_iters,
                consumed_samples: progress.consumed_train,
                ms_per_iter: 1e3 * secs,
                lr,
                global_batch_size: cfg.global_batch_size,
                loss: window_loss / window_iters as f64,
                grad_norm,
                tokens_per_s: tokens_per_iter / secs,
                tflops: flops_per_rank / secs / 1e12,
                mfu: flops_per_rank / secs / (peak.gflops * 1e9),
                val_loss,
                loss_scale: progress.scaler.map_or(1.0, |s| s.scale),
                skipped_iterations,
            };
            if say {
                println!("{}", iteration_line(&stats));
            }
            if let (Some((step, layers)), 0, 0) = (&comm_report, grid.dp_rank, grid.tp_rank) {
                log_comm(&grid, layers, n_micro, step, iteration);
            }
            if let Some(j) = json.as_mut() {
                j.write(&stats)?;
            }
            (window_loss, window_iters, window_secs) = (0.0, 0, 0.0);
        }
        // Every rank reaches this check at the same iteration; it is one all-reduce when enabled.
        let stop = if iteration < cfg.train_iters { watch.check(&*groups.world) } else { None };
        let exiting = (cfg.exit_interval.is_some_and(|n| iteration.is_multiple_of(n)) || stop.is_some())
            && iteration < cfg.train_iters;
        if let Some(dir) = &cfg.save {
            let at_interval = cfg.save_interval.is_some_and(|n| iteration.is_multiple_of(n));
            if at_interval || exiting || iteration == cfg.train_iters {
                save_checkpoint(dir, &dev, &groups, &chunks, cfg, progress, say)?;
            }
        }
        if let Some(reason) = stop {
            if let (Some(dir), true) = (&cfg.save, say) {
                stop::write_marker(dir, iteration, reason)?;
            }
            if say {
                println!(
                    " exiting program at iteration {iteration}: {reason}; checkpoint saved; exit code {} \
                     (resume with --load)",
                    stop::REQUEUE_EXIT_CODE
                );
            }
            summary.stopped = Some(reason);
            break;
        }
        if exiting {
            if say {
                println!(" exiting program at iteration {iteration} (--exit-interval)");
            }
            break;
        }
    }
    if progress.iteration >= cfg.train_iters {
        if let (Some(test), true) = (&data.test, cfg.eval_iters > 0) {
            let t = pipe.evaluate(&mut chunks, test, cfg, 0, cfg.eval_iters, &mut tl)?;
            if say {
                println!("{}", validation_line("test", progress.iteration, t));
            }
        }
    }
    if grid.pp > 1 {
        let bound = pipeline::peak_in_flight(&pipeline::passes(stage.schedule, grid.pp, grid.pp_rank, n_micro, v));
        report_pipeline(
            &groups,
            stage.schedule,
            v,
            n_micro,
            (bubble_busy, bubble_wall),
            (tl.peak_live, bound),
            say,
            &mut summary,
        );
    }
    if let Some(path) = &cfg.timing_trace {
        write_trace(path, &groups, &tl)?;
        if say {
            println!(" wrote the timing trace of {} ranks to {}", rt.world_size, path.display());
        }
    }
    Ok(summary)
}

/// The process's peak resident memory (VmHWM), in bytes, where /proc reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Every group's counters, named, with its size.
fn group_counters<D: Device>(groups: &Groups, dev: &D) -> Vec<(&'static str, usize, CommCounters)> {
    [
        ("tensor", &groups.tp),
        ("summa row", &groups.summa_row),
        ("summa column", &groups.summa_col),
        ("depth", &groups.depth),
        ("data-parallel x depth", &groups.replica),
        ("pipeline", &groups.pp),
        ("embedding", &groups.embedding),
    ]
    .into_iter()
    .map(|(name, c)| {
        let mut counted = crate::device::comm_counters(dev, &**c);
        if name == "pipeline" {
            if let Some(p2p) = dev.device_p2p() {
                counted.add(&p2p.counters());
            }
        }
        (name, c.size(), counted)
    })
    .collect()
}

/// `--log-comm`: the elements this rank moved (bandwidth-optimal counts, `CommCounters::moved`)
/// per layer per micro-batch, by group, and per step by group and collective, for comparison
/// with the volume formulas of shared/reference/tp-advanced.md. Printed by the first tensor- and
/// data-parallel rank of each pipeline stage for its own layers.
fn log_comm(
    grid: &Grid,
    layers: &[(usize, Vec<[CommCounters; 3]>)],
    n_micro: usize,
    step: &[(&str, usize, CommCounters)],
    iteration: u64,
) {
    let rank = grid.rank;
    println!(" comm at iteration {iteration}, rank {rank} (elements moved per rank, bandwidth-optimal counts):");
    let sizes = [step[0].1, step[1].1, step[2].1];
    for (first, chunk) in layers {
        for (l, groups) in chunk.iter().enumerate() {
            let per: Vec<f64> = groups.iter().zip(sizes).map(|(g, n)| g.moved(n) / n_micro as f64).collect();
            println!(
                "   layer {:>3} per micro-batch: {:.0} = tensor {:.0} + summa row {:.0} + summa column {:.0}",
                first + l,
                per.iter().sum::<f64>(),
                per[0],
                per[1],
                per[2]
            );
        }
    }
    for (name, n, k) in step.iter().filter(|(_, n, _)| *n > 1) {
        println!(
            "   step, {name} group of {n}: {:.0} (all-reduce {}, all-gather {}, reduce-scatter {}, broadcast {}, send {} \
             elements counted)",
            k.moved(*n),
            k.all_reduce,
            k.all_gather,
            k.reduce_scatter,
            k.broadcast,
            k.send
        );
    }
}

/// `--log-memory`: per rank, bytes of weights, gradients, optimizer state and activations,
/// predicted (from parameter counts, the data-parallel sharding and the schedule's in-flight
/// bound) beside measured (the buffers held, and the process's peak resident memory).
fn log_memory<D: Device>(dev: &D, groups: &Groups, chunks: &[Chunk<D>], cfg: &TrainConfig, bound: usize, say: bool) {
    let params: usize = chunks.iter().map(|c| c.model.params.num_elements()).sum();
    let replicas = groups.replica.size();
    let zero = cfg.use_distributed_optimizer && replicas > 1;
    let predicted_state = if zero {
        chunks.iter().map(|c| 8 * c.model.params.num_elements().div_ceil(replicas)).sum::<usize>()
    } else {
        8 * params
    };
    let predicted_acts: usize = chunks.iter().map(|c| c.model.set_bytes(dev) * bound + c.model.spare_bytes(dev)).sum();
    let measured_state: usize = chunks.iter().map(|c| c.opt.state_bytes(dev)).sum();
    let measured_acts: usize = chunks.iter().map(|c| c.model.activation_bytes(dev)).sum();
    let rss = peak_rss_bytes().unwrap_or(0);
    // Masters, plus mixed precision's working copy.
    let working: usize = chunks.iter().map(|c| c.model.working_bytes(dev)).sum();
    let mine = [
        (4 * params + working) as f64,
        4.0 * params as f64,
        predicted_state as f64,
        measured_state as f64,
        predicted_acts as f64,
        measured_acts as f64,
        rss as f64,
    ];
    let mut all = vec![0f64; mine.len() * groups.world.size()];
    groups.world.all_gather(&mine, &mut all);
    if say {
        let mib = |b: f64| b / 1048576.0;
        println!(
            " memory per rank (MiB): weights | gradients | optimizer state predicted / measured | activations \
             predicted / measured | peak RSS"
        );
        for (rank, r) in all.chunks_exact(mine.len()).enumerate() {
            println!(
                "   rank {rank:>3}: {:>9.2} | {:>9.2} | {:>9.2} / {:>9.2} | {:>9.2} / {:>9.2} | {:>9.1}",
                mib(r[0]),
                mib(r[1]),
                mib(r[2]),
                mib(r[3]),
                mib(r[4]),
                mib(r[5]),
                mib(r[6])
            );
        }
    }
}

/// Prints, per pipeline stage, the measured bubble fraction (time not spent in forward or
/// backward passes over time spent in them, against the longest pipelined time of the iteration)
/// beside the schedule's theory, (p-1)/m or (p-1)/(v m); and the most micro-batch activations the
/// stage held at once beside the bound its schedule implies.
#[allow(clippy::too_many_arguments)]
fn report_pipeline(
    groups: &Groups,
    schedule: Schedule,
    v: usize,
    m: usize,
    (busy, wall): (f64, f64),
    (peak, bound): (usize, usize),
    say: bool,
    summary: &mut TrainSummary,
) {
    let grid = &groups.grid;
    let measured = if busy > 0.0 { (wall - busy) / busy } else { f64::NAN };
    let mut all = vec![0f64; 3 * groups.world.size()];
    groups.world.all_gather(&[measured, peak as f64, bound as f64], &mut all);
    let p = grid.pp as f64;
    let theory =
        if schedule == Schedule::Interleaved { (p - 1.0) / (v as f64 * m as f64) } else { (p - 1.0) / m as f64 };
    // Stage figures come from tensor- and data-parallel rank 0 of each stage.
    let at = |r: usize, k: usize| all[3 * grid.rank_of(0, 0, r) + k];
    summary.bubble_fractions = (0..grid.pp).map(|r| at(r, 0)).collect();
    summary.bubble_theory = theory;
    if say {
        for r in 0..grid.pp {
            println!(
                " pipeline stage {r}: bubble fraction {:.3} measured, {theory:.3} in theory ({}, p {}, m {m}, v {v}) | \
                 peak {} micro-batch activations held (schedule bound {})",
                at(r, 0),
                schedule.name(),
                grid.pp,
                at(r, 1),
                at(r, 2)
            );
        }
    }
}
