//! `trident train`: the training loop on one rank of any (tensor, data) parallel layout. Reads
//! this data-parallel rank's slice of each global batch from the memory-mapped dataset,
//! accumulates micro-batch gradients, reduces them over data-parallel ranks in buckets that start
//! while backward is still running, clips by the global norm, steps AdamW on Megatron's schedule,
//! logs, validates and checkpoints; resuming continues the uninterrupted run bit for bit.

use crate::checkpoint::{self, SavedTensor, Shard};
use crate::comm::runtime::Runtime;
use crate::config::TrainConfig;
use crate::data::gpt_dataset::{split_ranges, GptDataset};
use crate::data::indexed::IndexedDataset;
use crate::device::cpu::{peak, CpuDevice};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::log::{iteration_line, validation_line, IterationStats, JsonLog};
use crate::model::{Gpt, GptConfig, ModelParallel};
use crate::optim::{clip_coefficient, AdamW};
use crate::parallel::data::{global_grad_norm, reduce_sequence_parallel_grads, GradBuckets};
use crate::parallel::grid::{Grid, Groups};
use crate::parallel::tensor::TensorParallel;
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

/// Mean per-token loss over `iters` global batches of `ds` starting at sample `first`, over all
/// data-parallel ranks.
#[allow(clippy::too_many_arguments)]
fn evaluate<D: Device>(
    model: &mut Gpt<D>,
    dev: &D,
    groups: &Groups,
    tp: TensorParallel,
    ds: &GptDataset,
    cfg: &TrainConfig,
    first: u64,
    iters: u64,
) -> Result<f64> {
    let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
    let mut tokens = vec![0u32; mbs * seq];
    let mut labels = vec![0u32; mbs * seq];
    let mut total = 0.0;
    let micro_batches = iters as usize * num_micro_batches(cfg, &groups.grid);
    for i in 0..micro_batches {
        fetch_batch(ds, micro_batch_start(first, i, mbs, &groups.grid), mbs, seq, &mut tokens, &mut labels)?;
        total += model.loss(dev, tp, &tokens, &labels, mbs, seq);
    }
    Ok(groups.dp.sum_f64(total) / (iters as usize * cfg.global_batch_size * seq) as f64)
}

fn num_micro_batches(cfg: &TrainConfig, grid: &Grid) -> usize {
    cfg.global_batch_size / (cfg.micro_batch_size * grid.dp)
}

/// Position in the run that a checkpoint must carry besides weights and optimizer state.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    iteration: u64,
    consumed_train: u64,
    consumed_valid: u64,
}

fn model_meta(m: &GptConfig) -> Vec<(&'static str, String)> {
    vec![
        ("num_layers", m.num_layers.to_string()),
        ("hidden_size", m.hidden_size.to_string()),
        ("num_attention_heads", m.num_attention_heads.to_string()),
        ("ffn_hidden_size", m.ffn_hidden_size.to_string()),
        ("max_position_embeddings", m.max_position_embeddings.to_string()),
        ("vocab_size", m.vocab_size.to_string()),
        ("padded_vocab_size", m.padded_vocab_size.to_string()),
    ]
}

/// The model shape recorded in a checkpoint.
pub fn model_from_shard(shard: &Shard, path: &Path) -> Result<GptConfig> {
    Ok(GptConfig {
        num_layers: shard.meta_value(path, "num_layers")?,
        hidden_size: shard.meta_value(path, "hidden_size")?,
        num_attention_heads: shard.meta_value(path, "num_attention_heads")?,
        ffn_hidden_size: shard.meta_value(path, "ffn_hidden_size")?,
        max_position_embeddings: shard.meta_value(path, "max_position_embeddings")?,
        vocab_size: shard.meta_value(path, "vocab_size")?,
        padded_vocab_size: shard.meta_value(path, "padded_vocab_size")?,
        init_method_std: 0.02,
    })
}

#[allow(clippy::too_many_arguments)]
fn save_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    groups: &Groups,
    model: &Gpt<D>,
    opt: &AdamW<D>,
    cfg: &TrainConfig,
    progress: Progress,
    say: bool,
) -> Result<()> {
    let grid = &groups.grid;
    let mut shard = Shard::default();
    let meta = [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", progress.iteration.to_string()),
        ("consumed_train_samples", progress.consumed_train.to_string()),
        ("consumed_valid_samples", progress.consumed_valid.to_string()),
        ("adam_step", opt.step.to_string()),
        ("seed", cfg.seed.to_string()),
        ("rng", "philox4x32-10 keyed by (seed, name); no other state".to_string()),
        ("seq_length", cfg.seq_length.to_string()),
        ("tokenizer", "ByteTokenizer".to_string()),
        ("tensor_model_parallel_size", grid.tp.to_string()),
        ("tensor_model_parallel_rank", grid.tp_rank.to_string()),
        ("pipeline_model_parallel_size", grid.pp.to_string()),
        ("data_parallel_size", grid.dp.to_string()),
        ("sequence_parallel", model.mp.sequence_parallel.to_string()),
    ];
    for (k, v) in meta.into_iter().chain(model_meta(&model.cfg)) {
        shard.meta.insert(k.to_string(), v);
    }
    let download = |buf: &D::Buf, n: usize| {
        let mut host = vec![0.0f32; n];
        dev.download(buf, &mut host);
        host
    };
    for (i, info) in model.params.info.iter().enumerate() {
        let n = info.numel();
        for (prefix, buf) in [("param", &model.params.values[i]), ("adam_m", &opt.m[i]), ("adam_v", &opt.v[i])] {
            shard.tensors.push(SavedTensor {
                name: format!("{prefix}/{}", info.name),
                shape: info.shape.clone(),
                data: download(buf, n),
            });
        }
    }
    // Rank 0 prepares the staging directory, one data-parallel replica writes a shard per
    // tensor-parallel rank, and rank 0 renames it into place once all are written.
    if grid.rank == 0 {
        checkpoint::begin(dir, progress.iteration)?;
    }
    groups.world.barrier();
    if grid.dp_rank == 0 {
        checkpoint::write_shard(dir, progress.iteration, grid.tp_rank, &shard)?;
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
    model: &mut Gpt<D>,
    opt: &mut AdamW<D>,
    say: bool,
) -> Result<Progress> {
    let (_, path, shard) = checkpoint::load_latest(dir, grid.tp_rank)?;
    let saved = model_from_shard(&shard, &path)?;
    let saved_tp: usize = shard.meta_value(&path, "tensor_model_parallel_size").unwrap_or(1);
    if saved_tp != grid.tp {
        return Err(Error::Config(format!(
            "{} was written with --tensor-model-parallel-size {saved_tp}, this run uses {}; resharding arrives with \
             `trident convert`",
            path.display(),
            grid.tp
        )));
    }
    let ours = &model.cfg;
    let mismatches: Vec<String> = model_meta(&saved)
        .into_iter()
        .zip(model_meta(ours))
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, b)| format!("{} is {} in the checkpoint but {} here", a.0, a.1, b.1))
        .collect();
    if !mismatches.is_empty() {
        return Err(Error::Config(format!("{} does not fit this model: {}", path.display(), mismatches.join("; "))));
    }
    for (i, info) in model.params.info.iter().enumerate() {
        for (prefix, buf) in
            [("param", &mut model.params.values[i]), ("adam_m", &mut opt.m[i]), ("adam_v", &mut opt.v[i])]
        {
            let t = shard.tensor(&path, &format!("{prefix}/{}", info.name))?;
            if t.shape != info.shape {
                return Err(Error::format(
                    &path,
                    format!("tensor '{}' has shape {:?}, expected {:?}", t.name, t.shape, info.shape),
                ));
            }
            dev.upload(buf, &t.data);
        }
    }
    opt.step = shard.meta_value(&path, "adam_step")?;
    let progress = Progress {
        iteration: shard.meta_value(&path, "iteration")?,
        consumed_train: shard.meta_value(&path, "consumed_train_samples")?,
        consumed_valid: shard.meta_value(&path, "consumed_valid_samples")?,
    };
    if say {
        println!(" loaded checkpoint {} (iteration {})", path.display(), progress.iteration);
    }
    Ok(progress)
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
    let mp = ModelParallel {
        tp_size: grid.tp,
        tp_rank: grid.tp_rank,
        sequence_parallel: cfg.sequence_parallel && grid.tp > 1,
    };
    cfg.model.validate_parallel(&mp, cfg.seq_length)?;
    Ok((cfg, grid, mp))
}

/// Runs `trident train` with a validated configuration on this rank of the job.
pub fn run(cfg: &TrainConfig, rt: &Runtime) -> Result<TrainSummary> {
    let (cfg, grid, mp) = layout(cfg, rt)?;
    let cfg = &cfg;
    let say = grid.rank == 0;
    let groups = if rt.world_size > 1 { Groups::new(rt, grid) } else { Groups::single() };
    let tp = TensorParallel { comm: &*groups.tp, sequence_parallel: mp.sequence_parallel };
    let threads = cfg.cpu_threads.unwrap_or_else(|| rt.default_threads());
    let dev = CpuDevice::new(threads);
    let peak = peak::measure_fma_peak(dev.pool(), 150);
    let m = &cfg.model;
    if say {
        println!(" trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
        println!(
            " trident train: preset {} | {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | {} ranks: {}{}{} | \
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
            if rt.oversubscribed { ", oversubscribed (collectives yield)" } else { "" },
            rt.library,
            dev.describe(),
            peak.gflops,
            peak.isa
        );
    }
    let data = build_datasets(cfg, m.vocab_size)?;
    let mut model = Gpt::new_parallel(&dev, m.clone(), mp, cfg.seed);
    let mut opt = AdamW::new(&dev, &model.params, cfg.adam);
    let mut buckets = GradBuckets::new(&model.params.info, cfg.ddp_bucket_size);
    let n_micro = num_micro_batches(cfg, &grid);
    if say {
        println!(
            " parameters: {} on this rank | micro-batch {} x {} micro-batches x {} data-parallel = global batch {} | \
             {} gradient buckets | train samples available {}",
            model.params.num_elements(),
            cfg.micro_batch_size,
            n_micro,
            grid.dp,
            cfg.global_batch_size,
            buckets.len(),
            data.train.len()
        );
    }
    let mut progress = Progress::default();
    if let Some(dir) = &cfg.load {
        progress = load_checkpoint(dir, &dev, &grid, &mut model, &mut opt, say)?;
    }
    let mut json = match (&cfg.log_json, say) {
        (Some(p), true) => Some(JsonLog::open(p, cfg.load.is_some())?),
        _ => None,
    };

    let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
    let tokens_per_iter = (cfg.global_batch_size * seq) as f64;
    let flops_per_rank = m.flops_per_iteration(cfg.global_batch_size, seq) / rt.world_size as f64;
    let grad_scale = 1.0 / tokens_per_iter as f32;
    let mut tokens = vec![0u32; mbs * seq];
    let mut labels = vec![0u32; mbs * seq];
    let mut summary = TrainSummary::default();
    let (mut window_loss, mut window_iters, mut window_secs) = (0.0, 0u64, 0.0);

    while progress.iteration < cfg.train_iters {
        let iteration = progress.iteration + 1;
        let started = Instant::now();
        let lr = cfg.lr.at(iteration);
        model.params.zero_grads(&dev);
        let mut loss_sum = 0.0;
        for micro in 0..n_micro {
            let first = micro_batch_start(progress.consumed_train, micro, mbs, &grid);
            fetch_batch(&data.train, first, mbs, seq, &mut tokens, &mut labels)?;
            // Data-parallel buckets start reducing during the last micro-batch's backward.
            let last = micro + 1 == n_micro && grid.dp > 1;
            let dp = &*groups.dp;
            let mut ready = |set: &crate::tensor::ParamSet<CpuDevice>, params: std::ops::Range<usize>| {
                if last {
                    buckets.mark_final(&dev, dp, set, params);
                }
            };
            loss_sum += model.forward_backward(&dev, tp, &tokens, &labels, mbs, seq, grad_scale, &mut ready);
        }
        if grid.dp > 1 {
            buckets.finish(&dev, &*groups.dp, &mut model.params);
        }
        reduce_sequence_parallel_grads(&dev, &*groups.tp, &mut model.params);
        let loss = groups.dp.sum_f64(loss_sum) / tokens_per_iter;
        let grad_norm = global_grad_norm(&dev, &model.params, grid.tp_rank, &*groups.mp);
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(Error::Config(format!(
                "iteration {iteration}: loss {loss} / grad norm {grad_norm} is not finite; lower --lr or check the data"
            )));
        }
        opt.step(&dev, &mut model.params, lr as f32, clip_coefficient(grad_norm, cfg.clip_grad));
        progress.iteration = iteration;
        progress.consumed_train += cfg.global_batch_size as u64;
        summary.losses.push(loss);
        summary.iterations += 1;
        window_loss += loss;
        window_iters += 1;
        window_secs += started.elapsed().as_secs_f64();

        let validate = iteration.is_multiple_of(cfg.eval_interval) || iteration == cfg.train_iters;
        let mut val_loss = None;
        if validate && cfg.eval_iters > 0 {
            if let Some(valid) = &data.valid {
                let v = evaluate(&mut model, &dev, &groups, tp, valid, cfg, progress.consumed_valid, cfg.eval_iters)?;
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
            };
            if say {
                println!("{}", iteration_line(&stats));
            }
            if let Some(j) = json.as_mut() {
                j.write(&stats)?;
            }
            (window_loss, window_iters, window_secs) = (0.0, 0, 0.0);
        }
        let exiting = cfg.exit_interval.is_some_and(|n| iteration.is_multiple_of(n)) && iteration < cfg.train_iters;
        if let Some(dir) = &cfg.save {
            let at_interval = cfg.save_interval.is_some_and(|n| iteration.is_multiple_of(n));
            if at_interval || exiting || iteration == cfg.train_iters {
                save_checkpoint(dir, &dev, &groups, &model, &opt, cfg, progress, say)?;
            }
        }
        if exiting {
            if say {
                println!(" exiting program at iteration {iteration} (--exit-interval)");
            }
            return Ok(summary);
        }
    }
    if let (Some(test), true) = (&data.test, cfg.eval_iters > 0) {
        let t = evaluate(&mut model, &dev, &groups, tp, test, cfg, 0, cfg.eval_iters)?;
        if say {
            println!("{}", validation_line("test", progress.iteration, t));
        }
    }
    Ok(summary)
}
