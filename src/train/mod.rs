//! `trident train`: the training loop on one rank of any (tensor, data) parallel layout. Reads
//! this data-parallel rank's slice of each global batch from the memory-mapped dataset,
//! accumulates micro-batch gradients, reduces them over data-parallel ranks in buckets that start
//! while backward is still running, clips by the global norm, steps AdamW on Megatron's schedule,
//! logs, validates and checkpoints; resuming continues the uninterrupted run bit for bit.
//!
//! This file is the loop; `setup` makes the run (layout, groups, device, collectives, datasets),
//! `pipeline` executes a stage's passes, `chunk` holds a model chunk with its optimizer,
//! `checkpointing` saves and restores, `trace` times, and `report` prints what is not an
//! iteration line. The loop sees the device only through the `Device` trait.

mod checkpointing;
mod chunk;
mod pipeline;
mod report;
mod setup;
mod trace;

use checkpointing::{load_checkpoint, save_checkpoint, Progress};
use chunk::{grad_sum_squares, grad_zeros, Chunk};
use pipeline::Pipeline;
use setup::Setup;
pub use setup::{build_datasets, Datasets};
use trace::{write_trace, SpanKind, Timeline};

use crate::comm::placement::Placement;
use crate::comm::runtime::Runtime;
use crate::comm::{CommCounters, ReduceOp};
use crate::config::{LoadParts, TrainConfig};
use crate::device::all_reduce_scalars;
use crate::device::{Device, DevicePeak};
use crate::error::{Error, Result};
use crate::log::tensorboard::EventWriter;
use crate::log::{iteration_line, validation_line, IterationStats, JsonLog};
use crate::stop::{self, StopReason, StopWatch};
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

/// Runs `trident train` with a validated configuration on this rank of the job, on the device
/// `--device` names: the CPU backend, the GPU Device (CUDA or HIP) on the rank's GPU, or the f64
/// reference device (the oracle the others are tested against; serial, for tests).
pub fn run(cfg: &TrainConfig, rt: &Runtime) -> Result<TrainSummary> {
    let minutes = cfg.distributed_timeout_minutes;
    let timeout = std::time::Duration::try_from_secs_f64(minutes * 60.0).unwrap_or(std::time::Duration::MAX);
    crate::comm::watchdog::arm(timeout, rt.world_rank, minutes);
    match cfg.device.as_str() {
        "cuda" | "hip" => {
            let (gpu, count) = setup::load_gpu(cfg)?;
            run_on(cfg, rt, Some(count), |placement| setup::open_gpu(gpu, cfg, placement))
        }
        "reference" => run_on(cfg, rt, None, |_| Ok(setup::open_reference())),
        _ => run_on(cfg, rt, None, |_| Ok(setup::open_cpu(cfg, rt))),
    }
}

/// Rank 0's `--log-json` and `--tensorboard-dir` files (`say`); the other ranks open none.
/// `--log-json` appends when the run resumes from a checkpoint.
fn open_logs(cfg: &TrainConfig, say: bool, resumes: bool) -> Result<(Option<JsonLog>, Option<EventWriter>)> {
    if !say {
        return Ok((None, None));
    }
    let json = cfg.log_json.as_ref().map(|path| JsonLog::open(path, resumes)).transpose()?;
    let tensorboard = cfg.tensorboard_dir.as_ref().map(|dir| EventWriter::create(dir)).transpose()?;
    Ok((json, tensorboard))
}

/// The training run on one device type, top-down: set up (`make_device` creates this rank's
/// device once the ranks agree on their placement), build the chunks, restore a checkpoint, run
/// the iterations, then the test evaluation and the closing reports.
fn run_on<D: Device>(
    cfg: &TrainConfig,
    rt: &Runtime,
    device_count: Option<usize>,
    make_device: impl FnOnce(&Placement) -> Result<(D, DevicePeak)>,
) -> Result<TrainSummary> {
    let started = Instant::now();
    let setup = Setup::new(cfg, rt, device_count, make_device)?;
    report::start_up(&setup, rt);
    let cfg = &setup.cfg;
    let watch = StopWatch::new(cfg.exit_signal_handler, cfg.exit_duration_mins, started)?;
    if let (Some(dir), true) = (&cfg.save, setup.say) {
        stop::clear_marker(dir)?;
    }
    let data = build_datasets(cfg)?;
    let mut chunks: Vec<Chunk<D>> =
        setup.stage.plans.iter().map(|plan| Chunk::new(&setup.dev, cfg, setup.mp, plan, &setup.groups)).collect();
    report::parameters(&setup, &chunks, &data);
    let mut progress = Progress { scaler: cfg.loss_scaler, ..Progress::default() };
    let pretrained = cfg.pretrained_checkpoint.as_deref();
    let resume_from =
        checkpointing::to_resume_from(cfg.load.as_deref(), &setup.groups, setup.say && pretrained.is_none())?;
    let start_from = match (resume_from, pretrained) {
        (Some(dir), _) => Some((dir, cfg.load_parts)),
        (None, Some(p)) => {
            Some((checkpointing::pretrained(p, cfg.load.as_deref(), &setup.groups, setup.say)?, LoadParts::WeightsOnly))
        }
        (None, None) => None,
    };
    if let Some((dir, parts)) = start_from {
        progress = load_checkpoint(dir, &setup.dev, &setup.grid, &mut chunks, cfg.loss_scaler, parts, setup.say)?;
    }
    let logs = open_logs(cfg, setup.say, resume_from.is_some());
    let (json, tensorboard) = setup::agree(logs, &setup.groups, "could not open their logs", true)?;
    let pipe = Pipeline::new(&setup)?;
    setup.groups.world.barrier();
    // Under --profile the trace keeps the profiled iterations only (`Trainer::profile`).
    let tl = Timeline::new(cfg.timing_trace.is_some() && cfg.profile.is_none());
    let mut trainer = Trainer {
        setup: &setup,
        pipe,
        data,
        chunks,
        progress,
        tl,
        json,
        tensorboard,
        watch,
        world_size: rt.world_size,
        summary: TrainSummary::default(),
        window: Window::default(),
        bubble: (0.0, 0.0),
        skipped_iterations: 0,
        norm_sum: setup.dev.scalars(1),
        steps: setup.dev.scalars(2 * window_steps(cfg)),
        pending: Vec::new(),
        scaler_norms: None,
        grad_norm: 0.0,
        params_sq: cfg.log_params_norm.then(|| setup.dev.scalars(window_steps(cfg))),
        params_norm: None,
        num_zeros: None,
    };
    for c in trainer.chunks.iter_mut() {
        c.model.set_loss_slots(&setup.dev, window_steps(cfg));
    }
    while trainer.progress.iteration < cfg.train_iters {
        if !trainer.iteration()? {
            break;
        }
    }
    trainer.finish(rt)
}

/// The most steps whose loss and gradient norm stay on the device before the host reads them:
/// the steps of a log interval (or of the whole run, if shorter), capped so that the
/// accumulators stay small (a longer interval reads them once per `MAX_WINDOW_STEPS` steps too).
fn window_steps(cfg: &TrainConfig) -> usize {
    cfg.log_interval.min(cfg.train_iters).clamp(1, MAX_WINDOW_STEPS as u64) as usize
}

const MAX_WINDOW_STEPS: usize = 4096;

/// A step whose loss and gradient norm are still on the device (`Trainer::flush` reads them).
struct PendingStep {
    iteration: u64,
    /// fp16's loss scaler found the gradients overflowed and skipped the step (then a
    /// non-finite norm is expected, not an error).
    overflowed: bool,
    /// Its learning rate, global batch, the samples consumed after it and the loss scale after
    /// it: TensorBoard's per-iteration scalars, written at `flush` with its loss and norm.
    lr: f64,
    batch: usize,
    consumed: u64,
    loss_scale: f64,
    /// Under `--log-num-zeros-in-grad`: the gradient elements that were zero.
    num_zeros: Option<u64>,
    /// The tokens its loss counts (the global batch's, less those `--eod-mask-loss` leaves out),
    /// by which its summed loss is averaged.
    loss_tokens: usize,
}

/// The iterations since the last log line: their summed loss, seconds, tokens and FLOPs per
/// rank, and the global batch of the newest (under `--rampup-batch-size` each has its own).
#[derive(Default)]
struct Window {
    loss: f64,
    iters: u64,
    secs: f64,
    tokens: f64,
    flops_per_rank: f64,
    global_batch: usize,
}

/// The world ranks whose own share of a step's loss (`local`) is not finite, gathered from every
/// rank (all of them call this together).
fn nonfinite_ranks(world: &dyn crate::comm::Comm, local: f64) -> Vec<usize> {
    let mut flags = vec![0f32; world.size()];
    world.all_gather(&[f32::from(u8::from(!local.is_finite()))], &mut flags);
    flags.iter().enumerate().filter(|(_, &f)| f != 0.0).map(|(r, _)| r).collect()
}

/// "0", "0 and 2", "0, 1 and 3".
fn join_ranks(ranks: &[usize]) -> String {
    let words: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => words.join(""),
    }
}

/// What the loop reads and updates from one iteration to the next.
struct Trainer<'a, D: Device> {
    setup: &'a Setup<D>,
    pipe: Pipeline<'a, D>,
    data: Datasets,
    chunks: Vec<Chunk<D>>,
    progress: Progress,
    tl: Timeline,
    json: Option<JsonLog>,
    tensorboard: Option<EventWriter>,
    watch: StopWatch,
    world_size: usize,
    summary: TrainSummary,
    window: Window,
    /// Pipeline busy and wall seconds for the bubble, measured from the second iteration on (the
    /// first one warms caches up).
    bubble: (f64, f64),
    skipped_iterations: u64,
    /// The gradients' sum of squares, accumulated on the device.
    norm_sum: D::Scalars,
    /// Per step of the window (`pending`), on the device: slot 2k its gradient norm, 2k + 1
    /// AdamW's gradient factor (`OptimizerOps::clip_scale`); its loss is in the models' loss slot k.
    steps: D::Scalars,
    pending: Vec<PendingStep>,
    /// `steps` as the loss scaler last read it (its slots up to the newest pending step's norm),
    /// which `flush` uses instead of reading the norms again: an fp16 step with a log line reads
    /// the device twice, not three times.
    scaler_norms: Option<Vec<f64>>,
    /// The gradient norm of the last step read (the log line prints it).
    grad_norm: f64,
    /// Under `--log-params-norm`, per step of the window, this rank's share of the parameters'
    /// sum of squares after the step (summed over the model-parallel group at `flush`), and the
    /// last step's norm read.
    params_sq: Option<D::Scalars>,
    params_norm: Option<f64>,
    /// Under `--log-num-zeros-in-grad`, the last step's count of zero gradient elements.
    num_zeros: Option<u64>,
}

impl<D: Device> Trainer<'_, D> {
    /// `--profile` on this rank: before iteration `start + 1` (`starting`) the device's profiler
    /// range opens and the trace starts keeping spans; after iteration `end` both stop.
    fn profile(&mut self, iteration: u64, starting: bool) -> Result<()> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        let Some(p) = cfg.profile.as_ref().filter(|p| p.on(setup.grid.rank)) else { return Ok(()) };
        if iteration == if starting { p.start + 1 } else { p.end } {
            setup.dev.profiler(starting)?;
            self.tl.record(starting && cfg.timing_trace.is_some());
        }
        Ok(())
    }

    /// One iteration: the training step, `--log-comm`'s counts, validation when due, the log
    /// line, and the checkpoint or early stop. Returns whether the run goes on.
    fn iteration(&mut self) -> Result<bool> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        let iteration = self.progress.iteration + 1;
        let started = Instant::now();
        // Megatron's schedules: the rates, and the global batch (`--rampup-batch-size`), after the
        // samples consumed before this iteration.
        let per_micro = cfg.micro_batch_size * setup.grid.dp;
        let batch = cfg.running_batch_at(self.progress.consumed_train, per_micro);
        self.pipe.set_micro(batch / per_micro);
        let counted = self.progress.schedule_samples();
        let lr = cfg.lr.lr(counted);
        let weight_decay = cfg.lr.weight_decay(counted) as f32;
        let decoupled_lr = cfg.lr.decoupled_lr(counted).map(|lr| lr as f32);
        for c in self.chunks.iter_mut() {
            c.opt.set_rates(weight_decay, decoupled_lr);
            c.model.params.zero_grads(&setup.dev);
            c.model.reset_peak_in_flight();
            c.model.reset_layer_comm();
        }
        let comm_before = report::group_counters(&setup.groups, &setup.dev);
        let work_before = if cfg.log_device_work { setup.dev.work_counters() } else { None };
        let tokens = (batch * cfg.seq_length) as f64;
        self.profile(iteration, true)?;
        self.step(iteration, lr, batch)?;
        self.profile(iteration, false)?;
        // `--log-comm`: this step's counts by group, and the layers' (taken before evaluation
        // adds its forwards).
        let comm_report = cfg.log_comm.then(|| {
            let step: Vec<_> = report::group_counters(&setup.groups, &setup.dev)
                .into_iter()
                .zip(&comm_before)
                .map(|((name, n, now), (_, _, before))| (name, n, now.since(before)))
                .collect();
            let layers: Vec<(usize, Vec<[CommCounters; 3]>)> =
                self.chunks.iter().map(|c| (c.model.plan.layers.start, c.model.layer_comm().to_vec())).collect();
            (step, layers)
        });
        self.progress.iteration = iteration;
        self.progress.consumed_train += batch as u64;
        self.record();
        self.window.iters += 1;
        self.window.tokens += tokens;
        self.window.flops_per_rank += cfg.model.flops_per_iteration(batch, cfg.seq_length) / self.world_size as f64;
        self.window.global_batch = batch;
        let validate = iteration.is_multiple_of(cfg.eval_interval) || iteration == cfg.train_iters;
        let log = iteration.is_multiple_of(cfg.log_interval) || validate;
        // The window's losses and norms are read once, when the log line is due (or the
        // accumulators are full); the read waits for the step, so it is timed with it.
        if log || self.pending.len() == window_steps(cfg) {
            self.flush()?;
        }
        self.window.secs += started.elapsed().as_secs_f64();
        if cfg.log_device_work {
            let work = work_before.zip(setup.dev.work_counters()).map(|(b, now)| now.since(&b));
            report::device_work(iteration, (setup.grid.rank, setup.grid.world_size), work);
        }

        let val_loss = if validate { self.validate(iteration)? } else { None };
        if log {
            let stats = self.stats(iteration, lr, self.grad_norm, val_loss);
            if setup.say {
                println!("{}", iteration_line(&stats));
            }
            if let (Some((step, layers)), 0, 0) = (&comm_report, setup.grid.dp_rank, setup.grid.tp_rank) {
                report::log_comm(&setup.grid, layers, setup.n_micro, step, iteration);
            }
            if let Some(j) = self.json.as_mut() {
                j.write(&stats)?;
            }
            if let Some(tb) = self.tensorboard.as_mut() {
                tb.scalars(iteration, &crate::log::tensorboard_scalars(&stats, report::peak_rss_bytes()))?;
            }
            self.window = Window::default();
        }
        self.save_or_stop(iteration)
    }

    /// Forward and backward over the pipeline, the gradient sums, the norm and clip factor, and
    /// the optimizer step (skipped when fp16 gradients overflowed). The step's loss, norm and
    /// clip factor stay on the device, in slot `pending.len()` of the window, until `flush`: the
    /// host reads nothing here, unless a loss scaler must decide whether to skip the step (fp16,
    /// one read of the norm) or the norm's group (model-parallel, or the world under ZeRO-1) sums
    /// it through the host (a device without a communicator for it: `--gpu-collectives mpi`).
    fn step(&mut self, iteration: u64, lr: f64, batch: usize) -> Result<()> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        let tokens = self.pipe.loss_tokens(&self.data.train, cfg, self.progress.consumed_train)?;
        let (busy0, wall0) = (self.tl.busy_secs, self.tl.wall_secs);
        let scale = self.progress.scaler.map_or(1.0, |s| s.scale);
        let slot = self.pending.len();
        for c in self.chunks.iter_mut() {
            c.model.set_loss_slot(slot);
        }
        self.pipe.train_step(
            &mut self.chunks,
            &self.data.train,
            cfg,
            (iteration, self.progress.consumed_train),
            (&tokens, scale as f32),
            &mut self.tl,
        )?;
        if self.summary.iterations > 0 && setup.grid.pp > 1 {
            // Every stage's pipeline ends with the slowest one (the optimizer waits for all), so
            // the bubble is measured against the longest pipelined time in the group.
            let mut wall = [self.tl.wall_secs - wall0];
            setup.groups.pp.all_reduce(&mut wall, ReduceOp::Max);
            self.bubble.0 += self.tl.busy_secs - busy0;
            self.bubble.1 += wall[0];
        }
        let t_opt = self.tl.now_us();
        // Finalise gradients: the tied embedding and sequence-parallel sums, and the data-parallel
        // sum (bucketed all-reduce, or the distributed optimizer's reduce-scatter).
        for c in self.chunks.iter_mut() {
            c.settle_gradients(&setup.dev, &setup.groups, cfg.precision);
        }
        chunk::sum_tied_within_stage(&setup.dev, &mut self.chunks);
        let shards: Vec<_> = self.chunks.iter_mut().map(|c| c.finish_gradients(&setup.dev, &setup.groups)).collect();
        self.tl.span(SpanKind::GradSync, 0, 0, t_opt);
        let (tp_rank, counts, zero) = (setup.grid.tp_rank, setup.mp.counts_parameters(), self.pipe.zero);
        let norm_sum = &mut self.norm_sum;
        grad_sum_squares(&setup.dev, &self.chunks, &shards, zero, &setup.groups, tp_rank, counts, norm_sum);
        let num_zeros = cfg
            .log_num_zeros_in_grad
            .then(|| grad_zeros(&setup.dev, &self.chunks, &shards, zero, &setup.groups, (tp_rank, counts)));
        setup.dev.clip_scale(&self.norm_sum, 0, &mut self.steps, 2 * slot, cfg.clip_grad, scale);
        // With a loss scaler, a non-finite norm (the same on every rank: it is a global sum) means
        // the scaled gradients overflowed: the step is skipped and the scale backs off. Deciding
        // that is the one per-step read of the device that stays (kept for `flush`).
        let overflowed = self.progress.scaler.is_some() && {
            let mut norms = vec![0.0; 2 * slot + 1];
            setup.dev.read_scalars(&self.steps, &mut norms);
            let overflowed = !norms[2 * slot].is_finite();
            self.scaler_norms = Some(norms);
            overflowed
        };
        if let Some(s) = self.progress.scaler.as_mut() {
            s.update(overflowed);
        }
        if overflowed {
            self.skipped_iterations += 1;
            if setup.say {
                println!(
                    " iteration {iteration}: gradients overflowed at loss scale {scale}; step skipped, loss scale now {}",
                    self.progress.scaler.map_or(1.0, |s| s.scale)
                );
            }
        } else {
            for (c, shard) in self.chunks.iter_mut().zip(&shards) {
                let update = (lr as f32, cfg.overlap_param_gather);
                c.step(&setup.dev, &setup.groups, shard.as_ref(), update, (&self.steps, 2 * slot + 1));
            }
        }
        if let Some(acc) = self.params_sq.as_mut() {
            self.chunks.iter_mut().for_each(|c| c.model.settle_params(&setup.dev));
            if slot == 0 {
                setup.dev.write_scalars(acc, &vec![0.0; window_steps(cfg)]);
            }
            let sets: Vec<_> = self.chunks.iter().map(|c| &c.model.params).collect();
            crate::parallel::data::add_params_sum_squares(&setup.dev, &sets, (tp_rank, counts), acc, slot);
        }
        let (consumed, loss_scale) =
            (self.progress.consumed_train + batch as u64, self.progress.scaler.map_or(1.0, |s| s.scale));
        let loss_tokens = tokens.global;
        self.pending.push(PendingStep {
            iteration,
            overflowed,
            lr,
            batch,
            consumed,
            loss_scale,
            num_zeros,
            loss_tokens,
        });
        self.tl.span(SpanKind::Optimizer, 0, 0, t_opt);
        Ok(())
    }

    /// Reads the pending steps' losses and gradient norms from the device, in one copy each, and
    /// adds them to the summary and the log window in step order (so every printed figure is the
    /// one a per-step read gives). A non-finite loss, or norm of a step that was not skipped, ends
    /// the run on every rank naming its iteration and the ranks whose loss it came from (the
    /// caller saves no checkpoint after it), or with `--no-check-for-nan-in-loss-and-grad` is
    /// said and logged as it is.
    fn flush(&mut self) -> Result<()> {
        let n = self.pending.len();
        if n == 0 {
            return Ok(());
        }
        let mut losses = vec![0.0; n];
        let local_losses = self.pipe.take_step_losses(&mut self.chunks, &mut losses);
        // The window's norms: as the loss scaler read them after the newest step (they do not
        // change after it), else in one copy.
        let norms = match self.scaler_norms.take() {
            Some(norms) if norms.len() == 2 * n - 1 => norms,
            _ => {
                let mut norms = vec![0.0; 2 * n];
                self.setup.dev.read_scalars(&self.steps, &mut norms);
                norms
            }
        };
        let setup = self.setup;
        let params_norms: Option<Vec<f64>> = self.params_sq.as_mut().map(|acc| {
            all_reduce_scalars(&setup.dev, &*setup.groups.mp, acc, n, ReduceOp::Sum);
            let mut sq = vec![0.0; n];
            setup.dev.read_scalars(acc, &mut sq);
            sq.iter().map(|s| s.sqrt()).collect()
        });
        for (k, step) in self.pending.drain(..).enumerate() {
            let (loss, grad_norm) = (losses[k] / step.loss_tokens.max(1) as f64, norms[2 * k]);
            // Both figures are sums over every rank, so every rank takes this branch together.
            if !loss.is_finite() || (!step.overflowed && !grad_norm.is_finite()) {
                let ranks = nonfinite_ranks(&*setup.groups.world, local_losses[k]);
                let what = format!(
                    "iteration {}: loss {loss} / grad norm {grad_norm} is not finite ({})",
                    step.iteration,
                    if ranks.is_empty() {
                        "in the gradients of every rank's norm".to_string()
                    } else {
                        let s = if ranks.len() == 1 { "" } else { "s" };
                        format!("non-finite loss on rank{s} {} of {}", join_ranks(&ranks), setup.grid.world_size)
                    }
                );
                if setup.cfg.check_for_nan {
                    return Err(Error::Config(format!(
                        "{what}; stopped before any checkpoint of it: lower --lr, check the data or the \
                         checkpoint loaded (--no-check-for-nan-in-loss-and-grad trains on)"
                    )));
                }
                if setup.say {
                    println!(" {what}; training on (--no-check-for-nan-in-loss-and-grad)");
                }
            }
            self.summary.losses.push(loss);
            self.window.loss += loss;
            self.grad_norm = grad_norm;
            let params_norm = params_norms.as_ref().map(|norms| norms[k]);
            self.params_norm = params_norm;
            self.num_zeros = step.num_zeros;
            let every = setup.cfg.tensorboard_log_interval;
            if let Some(tb) = self.tensorboard.as_mut().filter(|_| step.iteration.is_multiple_of(every)) {
                let figures = crate::log::StepFigures {
                    loss,
                    lr: step.lr,
                    global_batch_size: step.batch,
                    loss_scale: step.loss_scale,
                    grad_norm: (!step.overflowed).then_some(grad_norm),
                    params_norm,
                    num_zeros: step.num_zeros,
                    world_size: setup.cfg.log_world_size_to_tensorboard.then_some(setup.grid.world_size),
                };
                let [by_iteration, by_samples] = crate::log::step_scalars(&figures);
                tb.scalars(step.iteration, &by_iteration)?;
                tb.scalars(step.consumed, &by_samples)?;
            }
        }
        Ok(())
    }

    /// Adds the iteration's memory figures to the summary (its loss follows at `flush`); after
    /// the first iteration, `--log-memory` and rank 0's activation-memory line.
    fn record(&mut self) {
        let (setup, cfg, summary) = (self.setup, &self.setup.cfg, &mut self.summary);
        summary.iterations += 1;
        summary.peak_in_flight = self.chunks.iter().map(|c| c.model.peak_in_flight()).collect();
        summary.activation_bytes = self.chunks.iter().map(|c| c.model.activation_bytes(&setup.dev)).sum();
        summary.optimizer_state_bytes = self.chunks.iter().map(|c| c.opt.state_bytes(&setup.dev)).sum();
        if summary.iterations == 1 && cfg.log_memory {
            report::log_memory(setup, &self.chunks);
        }
        if summary.iterations == 1 && setup.say {
            println!(
                " activation memory on rank 0 after the first iteration: {:.1} MiB (recompute: {:?})",
                summary.activation_bytes as f64 / 1048576.0,
                cfg.recompute
            );
        }
    }

    /// An evaluation's loss and perplexity as TensorBoard scalars: Megatron's "lm loss
    /// validation" and "lm loss validation ppl" (and "test" for the test split).
    fn evaluation_scalars(&mut self, split: &str, iteration: u64, loss: f64) -> Result<()> {
        let Some(tb) = self.tensorboard.as_mut() else { return Ok(()) };
        let (tag, ppl) = (format!("lm loss {split}"), format!("lm loss {split} ppl"));
        tb.scalars(iteration, &[(tag.as_str(), loss), (ppl.as_str(), loss.min(700.0).exp())])
    }

    /// The validation loss over `--eval-iters` batches of the validation split, when it has
    /// samples; rank 0 prints it.
    fn validate(&mut self, iteration: u64) -> Result<Option<f64>> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        let Some(valid) = self.data.valid.as_ref().filter(|_| cfg.eval_iters > 0) else {
            return Ok(None);
        };
        let first = self.progress.consumed_valid;
        let v = self.pipe.evaluate(&mut self.chunks, valid, cfg, first, cfg.eval_iters, &mut self.tl)?;
        self.progress.consumed_valid += cfg.eval_iters * cfg.global_batch_size as u64;
        if setup.say {
            println!("{}", validation_line("validation", iteration, v));
        }
        self.evaluation_scalars("validation", iteration, v)?;
        self.summary.final_val_loss = Some(v);
        Ok(Some(v))
    }

    /// The log line's figures, averaged over the window since the last one.
    fn stats(&self, iteration: u64, lr: f64, grad_norm: f64, val_loss: Option<f64>) -> IterationStats {
        let cfg = &self.setup.cfg;
        let secs = self.window.secs / self.window.iters as f64;
        IterationStats {
            iteration,
            train_iters: cfg.train_iters,
            consumed_samples: self.progress.consumed_train,
            ms_per_iter: 1e3 * secs,
            lr,
            global_batch_size: self.window.global_batch,
            loss: self.window.loss / self.window.iters as f64,
            grad_norm,
            tokens_per_s: self.window.tokens / self.window.secs,
            tflops: self.window.flops_per_rank / self.window.secs / 1e12,
            mfu: self.window.flops_per_rank / self.window.secs / (self.setup.peak.gflops * 1e9),
            val_loss,
            loss_scale: self.progress.scaler.map_or(1.0, |s| s.scale),
            skipped_iterations: self.skipped_iterations,
            params_norm: self.params_norm,
            num_zeros: self.num_zeros,
        }
    }

    /// Saves a checkpoint when one is due, and stops the run early after it (`--exit-interval`,
    /// or the agreed stop of `--exit-signal-handler` / `--exit-duration-in-mins`, which leaves
    /// the marker). Returns whether the run goes on.
    fn save_or_stop(&mut self, iteration: u64) -> Result<bool> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        // Every rank reaches this check at the same iteration; it is one all-reduce when enabled.
        let stop = if iteration < cfg.train_iters { self.watch.check(&*setup.groups.world) } else { None };
        let exiting = (cfg.exit_interval.is_some_and(|n| iteration.is_multiple_of(n)) || stop.is_some())
            && iteration < cfg.train_iters;
        let at_interval = cfg.save_interval.is_some_and(|n| iteration.is_multiple_of(n));
        // A checkpoint or the run's end first reads the steps still on the device: a non-finite
        // loss stops the run before it is saved, and the summary holds every step's loss.
        if exiting || stop.is_some() || iteration == cfg.train_iters || (cfg.save.is_some() && at_interval) {
            self.flush()?;
        }
        if let Some(dir) = &cfg.save {
            if at_interval || exiting || iteration == cfg.train_iters {
                self.chunks.iter_mut().for_each(|c| c.model.settle_params(&setup.dev));
                save_checkpoint(dir, &setup.dev, &setup.groups, &self.chunks, cfg, self.progress, setup.say)?;
            }
        }
        if let Some(reason) = stop {
            if let (Some(dir), true) = (&cfg.save, setup.say) {
                stop::write_marker(dir, iteration, reason)?;
            }
            if setup.say {
                println!(
                    " exiting program at iteration {iteration}: {reason}; checkpoint saved; exit code {} \
                     (resume with --load)",
                    stop::REQUEUE_EXIT_CODE
                );
            }
            self.summary.stopped = Some(reason);
            return Ok(false);
        }
        if exiting {
            if setup.say {
                println!(" exiting program at iteration {iteration} (--exit-interval)");
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// After the last iteration: the test evaluation (when the run completed), the per-stage
    /// pipeline report, the timing trace.
    fn finish(mut self, rt: &Runtime) -> Result<TrainSummary> {
        let (setup, cfg) = (self.setup, &self.setup.cfg);
        if self.progress.iteration >= cfg.train_iters {
            if let (Some(test), true) = (&self.data.test, cfg.eval_iters > 0) {
                let t = self.pipe.evaluate(&mut self.chunks, test, cfg, 0, cfg.eval_iters, &mut self.tl)?;
                if setup.say {
                    println!("{}", validation_line("test", self.progress.iteration, t));
                }
                self.evaluation_scalars("test", self.progress.iteration, t)?;
            }
        }
        if setup.grid.pp > 1 {
            report::report_pipeline(setup, self.bubble, self.tl.peak_live, &mut self.summary);
        }
        if let Some(path) = &cfg.timing_trace {
            write_trace(path, &setup.groups, &self.tl)?;
            if setup.say {
                println!(" wrote the timing trace of {} ranks to {}", rt.world_size, path.display());
            }
        }
        Ok(self.summary)
    }
}
