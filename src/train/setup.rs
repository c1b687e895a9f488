//! Setting a run up on this rank: the layout checked against the world and the model, the
//! pipeline stage plan, the process groups, the device `--device` names (the CPU backend, or the
//! rank's GPU opened through `gpu::training`) once the ranks agree on their placement and devices,
//! its collectives attached behind the Device seam, and the datasets.

use crate::comm::placement::Placement;
use crate::comm::runtime::Runtime;
use crate::comm::ReduceOp;
use crate::config::TrainConfig;
use crate::data::datasets::{self, DataConfig, Dataset};
use crate::device::cpu::{peak, CpuDevice};
use crate::device::{CollectiveLibrary, CollectivesRequest, Device, DevicePeak};
use crate::error::{Error, Result};
use crate::gpu::training::TrainingGpu;
use crate::model::{ChunkPlan, ModelParallel};
use crate::parallel::context::{ContextSplit, CpCommType};
use crate::parallel::grid::{Grid, Groups, TensorMode};
use crate::parallel::pipeline::{self, Schedule};

/// A run as set up on this rank: the configuration for its data-parallel size, the layout, the
/// process groups, and the device with its collectives attached.
pub(super) struct Setup<D: Device> {
    pub cfg: TrainConfig,
    pub grid: Grid,
    pub mp: ModelParallel,
    pub stage: StagePlan,
    /// Micro-batches of one global batch on this data-parallel rank.
    pub n_micro: usize,
    pub groups: Groups,
    pub dev: D,
    pub peak: DevicePeak,
    /// The GPU this rank drives, as the ranks agreed (its `placement:` line).
    pub placement: Placement,
    /// The start-up line saying which path collectives take.
    pub collectives: String,
    /// Whether this rank prints the run's lines (rank 0).
    pub say: bool,
}

impl<D: Device> Setup<D> {
    /// Sets the run up: `make_device` creates this rank's device once the ranks agree on their
    /// placement (`device_count`: the GPUs the runtime sees, None on the CPU), and the device is
    /// asked for collectives for the run's groups; where it has none, tensors move through the
    /// host-staged MPI path (`host_f32` / `download` / `upload`).
    pub fn new(
        cfg: &TrainConfig,
        rt: &Runtime,
        device_count: Option<usize>,
        make_device: impl FnOnce(&Placement) -> Result<(D, DevicePeak)>,
    ) -> Result<Setup<D>> {
        let placement = Placement::decide(
            (rt.world_rank, rt.world_size),
            (rt.local_rank, rt.local_size),
            &cfg.device,
            device_count,
            &|name: &str| std::env::var(name).ok(),
        );
        let (cfg, grid, mp) = layout(cfg, rt)?;
        let stage = stage_plan(&cfg, &grid)?;
        let groups = if rt.world_size > 1 { Groups::new(rt, grid) } else { Groups::single() };
        let n_micro = num_micro_batches(&cfg, &grid);
        // A placement error can be one rank's own (its environment); creating the device can
        // fail on one rank too (its GPU, its driver).
        let placement = agree(placement, &groups, "could not choose their GPU", false)?;
        let (mut dev, peak) = agree(make_device(&placement), &groups, "could not create their device", true)?;
        dev.set_matmul_precision(cfg.precision);
        let collectives = attach_collectives(&mut dev, &cfg, &groups, &stage, n_micro)?;
        Ok(Setup { cfg, grid, mp, stage, n_micro, groups, dev, peak, placement, collectives, say: grid.rank == 0 })
    }

    /// The most micro-batch activation sets this stage's schedule holds at once.
    pub fn in_flight_bound(&self) -> usize {
        let (grid, stage) = (&self.grid, &self.stage);
        let passes = pipeline::passes(stage.schedule, grid.pp, grid.pp_rank, self.n_micro, stage.plans.len());
        pipeline::peak_in_flight(&passes)
    }
}

/// A step that can fail on one rank alone (its environment, its GPU): the ranks agree before any
/// of them stops; each failing rank says why, and every rank returns "N rank(s) `what` (see
/// above)". A rank alone in the job returns its own error instead where `own_error_alone`.
pub(super) fn agree<T>(result: Result<T>, groups: &Groups, what: &str, own_error_alone: bool) -> Result<T> {
    let mut failed = [f64::from(u8::from(result.is_err()))];
    groups.world.all_reduce(&mut failed, ReduceOp::Sum);
    let error = || Error::Usage(format!("{} rank(s) {what} (see above)", failed[0]));
    match result {
        Err(e) if own_error_alone && groups.world.size() == 1 => Err(e),
        Err(e) => {
            eprintln!("trident: error: rank {}: {e}", groups.grid.rank);
            Err(error())
        }
        Ok(_) if failed[0] > 0.0 => Err(error()),
        Ok(made) => Ok(made),
    }
}

/// `--device cuda|hip`: the GPU runtime, loaded before placement (which needs its device count)
/// and kept for the process's life, with that count.
pub(super) fn load_gpu(cfg: &TrainConfig) -> Result<(TrainingGpu, usize)> {
    let gpu = if cfg.device == "cuda" { TrainingGpu::cuda()? } else { TrainingGpu::hip()? };
    Ok((gpu, gpu.device_count()?))
}

/// The Device on the GPU placement chose for this rank (local rank modulo the visible devices).
pub(super) fn open_gpu(
    gpu: TrainingGpu,
    cfg: &TrainConfig,
    placement: &Placement,
) -> Result<(impl Device, DevicePeak)> {
    let ordinal = placement.gpu.as_ref().map_or(0, |g| g.ordinal);
    gpu.open(ordinal, cfg.model.hidden_size / cfg.model.num_attention_heads, cfg.precision)
}

/// The CPU backend on `--cpu-threads` (else this rank's share of the node) and its measured FMA
/// peak.
pub(super) fn open_cpu(cfg: &TrainConfig, rt: &Runtime) -> (CpuDevice, DevicePeak) {
    let threads = cfg.cpu_threads.unwrap_or_else(|| rt.default_threads());
    let dev = CpuDevice::new(threads);
    let peak = peak::measure_fma_peak(dev.pool(), 150);
    (dev, DevicePeak { gflops: peak.gflops, what: peak.isa.to_string() })
}

/// The f64 reference device, measured against one core's FMA peak (it runs serially).
pub(super) fn open_reference() -> (crate::device::reference::ReferenceDevice, DevicePeak) {
    let peak = peak::measure_fma_peak(CpuDevice::new(1).pool(), 150);
    let what = format!("one {} core (the reference device is serial f64)", peak.isa);
    (crate::device::reference::ReferenceDevice, DevicePeak { gflops: peak.gflops, what })
}

/// Asks the device for collectives for the run's groups (`CollectiveOps::attach_collectives`) and
/// returns its start-up line. Device pipeline links deliver one link's messages in the order
/// they were sent (MPI matched them by tag): every schedule keeps that order on every stage
/// (`fifo_order`, checked for this run's layout before any link is made; a failure would be a
/// schedule bug).
fn attach_collectives<D: Device>(
    dev: &mut D,
    cfg: &TrainConfig,
    groups: &Groups,
    stage: &StagePlan,
    n_micro: usize,
) -> Result<String> {
    let library = match cfg.gpu_collectives.as_str() {
        "mpi" => CollectiveLibrary::Mpi,
        "rccl" => CollectiveLibrary::Rccl,
        _ => CollectiveLibrary::Nccl,
    };
    let (p, v) = (groups.grid.pp, stage.plans.len());
    let lay = pipeline::Placement::new(stage.schedule, p, v);
    if library != CollectiveLibrary::Mpi && p > 1 {
        let ramp = ramp_micro_batches(cfg, &groups.grid)?.into_iter().map(|(_, m)| m);
        std::iter::once(n_micro)
            .chain(ramp)
            .try_for_each(|m| {
                let order = |s: usize| pipeline::passes(stage.schedule, p, s, m, v);
                pipeline::fifo_order(lay, &order)
            })
            .and_then(|_| pipeline::fifo_order(lay, &|_| pipeline::forward_passes(n_micro, v)))
            .map_err(|e| {
                Error::Config(format!(
                    "--gpu-collectives {}: the pipeline schedule breaks in-order delivery: {e}",
                    cfg.gpu_collectives
                ))
            })?;
    }
    // The gradient norm's sum of squares is summed over the model-parallel group, or over the
    // world under ZeRO-1 (each rank holds a shard of the summed gradients).
    let norm = match cfg.use_distributed_optimizer && groups.replica.size() > 1 {
        true => ("world", &*groups.world),
        false => ("model-parallel", &*groups.mp),
    };
    dev.attach_collectives(&CollectivesRequest {
        library,
        world: &*groups.world,
        groups: [
            ("tensor", &*groups.tp),
            ("embedding", &*groups.embedding),
            ("data", &*groups.replica),
            norm,
            ("context", &*groups.cp),
            ("context all-to-all", &*groups.cp_levels[0]),
        ],
        pipeline: &*groups.pp,
        pipeline_links: (v > 1, lay.v),
    })
}

/// This rank's pipeline: its chunks' layer plans, the schedule, and the chunk count.
pub(super) struct StagePlan {
    pub plans: Vec<ChunkPlan>,
    pub schedule: Schedule,
}

/// Checks the layout against the world and the model, before any work: each failure is the same
/// on every rank.
fn layout(cfg: &TrainConfig, rt: &Runtime) -> Result<(TrainConfig, Grid, ModelParallel)> {
    let grid = Grid::with_context(
        rt.world_size,
        rt.world_rank,
        cfg.tensor_parallel,
        cfg.context_parallel,
        cfg.pipeline_parallel,
    )?;
    let cfg = cfg.for_data_parallel(grid.dp);
    let ranks = cfg.profile.as_ref().and_then(|p| p.ranks.as_ref());
    if let Some(r) = ranks.and_then(|r| r.iter().find(|&&r| r >= rt.world_size)) {
        return Err(Error::flag("--profile-ranks", r, format!("global ranks below the world size {}", rt.world_size)));
    }
    if !cfg.global_batch_size.is_multiple_of(cfg.micro_batch_size * grid.dp) {
        return Err(Error::Config(format!(
            "--global-batch-size {} is not a multiple of --micro-batch-size {} x the data-parallel size {}",
            cfg.global_batch_size, cfg.micro_batch_size, grid.dp
        )));
    }
    let mode = TensorMode::new(&cfg.tensor_mode, cfg.tesseract_depth, grid.tp)?;
    let grid = grid
        .with_tensor_mode(mode)
        .with_v_pipeline(cfg.pipeline_schedule.is_some_and(Schedule::v_shaped))
        .with_cp_levels(cfg.cp_a2a_size);
    let mp = ModelParallel {
        tp_size: grid.tp,
        tp_rank: grid.tp_rank,
        sequence_parallel: cfg.sequence_parallel && grid.tp > 1,
        summa: grid.summa(),
        context: ContextSplit { size: grid.cp, rank: grid.cp_rank },
    };
    if mp.summa.is_some() && grid.cp > 1 {
        return Err(Error::Unsupported(
            "--context-parallel-size with --tensor-parallel-mode 2d or 2.5d: context parallelism runs beside 1-D \
             tensor parallelism only"
                .into(),
        ));
    }
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
    if grid.cp > 1 && cfg.cp_comm_type == CpCommType::A2a {
        cfg.model.validate_head_swap(grid.cp, grid.tp, false)?;
    }
    if grid.cp > 1 && cfg.cp_comm_type == CpCommType::A2aP2p {
        cfg.model.validate_head_swap(grid.cp_a2a, grid.tp, true)?;
    }
    Ok((cfg, grid, mp))
}

/// The pipeline layout of this rank: how many virtual stages, which layers each chunk holds, and
/// the schedule (Megatron's choice unless `--pipeline-schedule` says otherwise).
fn stage_plan(cfg: &TrainConfig, grid: &Grid) -> Result<StagePlan> {
    let (p, layers) = (grid.pp, cfg.model.num_layers);
    let v_shaped = cfg.pipeline_schedule.is_some_and(Schedule::v_shaped);
    let chunks = match cfg.layers_per_virtual_stage {
        // zb-v's V: two chunks on each stage.
        None if v_shaped && p > 1 => 2,
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
    if schedule.splits_backward() && grid.tensor_mode != crate::parallel::grid::TensorMode::OneD {
        return Err(Error::Unsupported(format!(
            "--pipeline-schedule {} with --tensor-parallel-mode 2d or 2.5d (SUMMA's weight gradients are not split              from its input gradients; use 1-D tensor parallelism)",
            schedule.name()
        )));
    }
    for (consumed, micro) in ramp_micro_batches(cfg, grid)? {
        pipeline::validate(schedule, p, chunks, micro).map_err(|e| {
            Error::Config(format!(
                "--rampup-batch-size: at {consumed} consumed samples the global batch is {}: {e}",
                micro * cfg.micro_batch_size * grid.dp
            ))
        })?;
    }
    let (first, last) = (cfg.first_stage_layers, cfg.last_stage_layers);
    if (first.is_some() || last.is_some()) && chunks > 1 {
        return Err(Error::Unsupported("--decoder-first/last-pipeline-num-layers with virtual pipeline stages".into()));
    }
    let lay = pipeline::Placement::new(schedule, p, chunks);
    let plans = (0..chunks)
        .map(|c| {
            let layers = pipeline::chunk_layers(layers, lay, grid.pp_rank, c, first, last)?;
            let (first, last) = lay.ends(grid.pp_rank, c);
            Ok(ChunkPlan { layers, first, last })
        })
        .collect::<Result<Vec<_>>>()?;
    // Every rank checks every stage's split, so a layout error stops all ranks alike.
    for r in 0..p {
        for c in 0..chunks {
            pipeline::chunk_layers(layers, lay, r, c, first, last)?;
        }
    }
    Ok(StagePlan { plans, schedule })
}

/// Micro-batches of one global batch on each data-parallel rank.
fn num_micro_batches(cfg: &TrainConfig, grid: &Grid) -> usize {
    cfg.global_batch_size / (cfg.micro_batch_size * grid.dp)
}

/// Under `--rampup-batch-size` or `--step-batch-size-schedule`, (samples consumed before it,
/// micro-batches per data-parallel
/// rank) of each distinct global batch the ramp reaches below the full one; a batch that
/// micro-batch x data-parallel size does not divide is an error naming where the ramp reaches
/// it (megatron-core's consistency check, made before the run rather than at that iteration),
/// unless `--decrease-batch-size-if-needed` rounds it down.
pub(super) fn ramp_micro_batches(cfg: &TrainConfig, grid: &Grid) -> Result<Vec<(u64, usize)>> {
    let Some(rampup) = cfg.rampup.as_ref() else { return Ok(Vec::new()) };
    let per_micro = (cfg.micro_batch_size * grid.dp) as u64;
    let mut out: Vec<(u64, usize)> = Vec::new();
    let mut consumed = 0;
    loop {
        let batch = rampup.global_batch(consumed);
        if batch == rampup.global() {
            return Ok(out);
        }
        let rounds = cfg.decrease_batch_size_if_needed && batch >= per_micro;
        if !batch.is_multiple_of(per_micro) && !rounds {
            return Err(Error::Config(format!(
                "{}: at {consumed} consumed samples the global batch is {batch}, not a multiple of \
                 --micro-batch-size {} x the data-parallel size {}{}",
                rampup.flag(),
                cfg.micro_batch_size,
                grid.dp,
                if cfg.decrease_batch_size_if_needed {
                    " (and below it: --decrease-batch-size-if-needed would leave no micro-batch)"
                } else {
                    " (--decrease-batch-size-if-needed rounds it down)"
                }
            )));
        }
        // The iteration consumes the running batch (rounded down under
        // --decrease-batch-size-if-needed), as the trainer does.
        let running = cfg.running_batch_at(consumed, per_micro as usize);
        let micro = running / per_micro as usize;
        if out.last().is_none_or(|&(_, m)| m != micro) {
            out.push((consumed, micro));
        }
        consumed += running as u64;
    }
}

/// The train, validation and test datasets of a run.
pub struct Datasets {
    pub train: Dataset,
    pub valid: Option<Dataset>,
    pub test: Option<Dataset>,
}

/// The splits as Megatron sizes them: the run's training samples, a validation pass of
/// `--eval-iters` global batches every `--eval-interval` iterations and at the end, and one
/// pass for the test split.
pub fn build_datasets(cfg: &TrainConfig) -> Result<Datasets> {
    let gbs = cfg.global_batch_size;
    let counts = [
        (cfg.train_samples as usize).max(1),
        (cfg.train_iters / cfg.eval_interval + 1) as usize * cfg.eval_iters as usize * gbs,
        cfg.eval_iters as usize * gbs,
    ];
    let data = DataConfig {
        source: cfg.data.clone(),
        seq_length: cfg.seq_length,
        seed: cfg.seed,
        surplus: cfg.data_surplus,
        vocab_size: cfg.model.vocab_size,
        cache: cfg.data_cache_path.clone(),
    };
    let [train, valid, test] = datasets::build(&data, counts)?;
    let train = train.ok_or_else(|| {
        Error::Data("the training split has no sequences: give it a larger --split weight or more data".into())
    })?;
    Ok(Datasets { train, valid, test })
}
