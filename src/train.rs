//! `trident train`: the single-rank training loop. Reads batches from the memory-mapped dataset,
//! accumulates micro-batch gradients, clips, steps AdamW on Megatron's schedule, logs, validates
//! and checkpoints; resuming from a checkpoint continues the uninterrupted run bit for bit.

use crate::checkpoint::{self, SavedTensor, Shard};
use crate::config::TrainConfig;
use crate::data::gpt_dataset::{split_ranges, GptDataset};
use crate::data::indexed::IndexedDataset;
use crate::device::cpu::{peak, CpuDevice};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::log::{iteration_line, validation_line, IterationStats, JsonLog};
use crate::model::{Gpt, GptConfig};
use crate::optim::{clip_coefficient, global_grad_norm, AdamW};
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

/// Mean per-token loss over `iters` global batches of `ds` starting at sample `first`.
fn evaluate<D: Device>(
    model: &mut Gpt<D>,
    dev: &D,
    ds: &GptDataset,
    cfg: &TrainConfig,
    first: u64,
    iters: u64,
) -> Result<f64> {
    let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
    let mut tokens = vec![0u32; mbs * seq];
    let mut labels = vec![0u32; mbs * seq];
    let mut total = 0.0;
    let micro_batches = iters as usize * cfg.num_micro_batches();
    for i in 0..micro_batches {
        fetch_batch(ds, first + (i * mbs) as u64, mbs, seq, &mut tokens, &mut labels)?;
        total += model.loss(dev, &tokens, &labels, mbs, seq);
    }
    Ok(total / (micro_batches * mbs * seq) as f64)
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

fn save_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    model: &Gpt<D>,
    opt: &AdamW<D>,
    cfg: &TrainConfig,
    progress: Progress,
) -> Result<()> {
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
        ("tensor_model_parallel_size", "1".to_string()),
        ("pipeline_model_parallel_size", "1".to_string()),
        ("data_parallel_size", "1".to_string()),
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
    let path = checkpoint::save(dir, progress.iteration, 0, &shard)?;
    println!(" saved checkpoint at iteration {} to {}", progress.iteration, path.display());
    Ok(())
}

/// Restores weights, optimizer state and the run's position from the latest checkpoint in `dir`.
fn load_checkpoint<D: Device>(dir: &Path, dev: &D, model: &mut Gpt<D>, opt: &mut AdamW<D>) -> Result<Progress> {
    let (_, path, shard) = checkpoint::load_latest(dir, 0)?;
    let saved = model_from_shard(&shard, &path)?;
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
    println!(" loaded checkpoint {} (iteration {})", path.display(), progress.iteration);
    Ok(progress)
}

/// Runs `trident train` with a validated configuration.
pub fn run(cfg: &TrainConfig) -> Result<TrainSummary> {
    let dev = CpuDevice::new(cfg.cpu_threads);
    let peak = peak::measure_fma_peak(dev.pool(), 150);
    let m = &cfg.model;
    println!(" trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
    println!(
        " trident train: preset {} | {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | device {} | \
         peak {:.1} GFLOP/s ({})",
        cfg.preset,
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        cfg.seq_length,
        m.vocab_size,
        m.padded_vocab_size,
        dev.describe(),
        peak.gflops,
        peak.isa
    );
    let data = build_datasets(cfg, m.vocab_size)?;
    let mut model = Gpt::new(&dev, m.clone(), cfg.seed);
    let mut opt = AdamW::new(&dev, &model.params, cfg.adam);
    println!(
        " parameters: {} | micro-batch {} x {} micro-batches = global batch {} | train samples available {}",
        model.params.num_elements(),
        cfg.micro_batch_size,
        cfg.num_micro_batches(),
        cfg.global_batch_size,
        data.train.len()
    );
    let mut progress = Progress::default();
    if let Some(dir) = &cfg.load {
        progress = load_checkpoint(dir, &dev, &mut model, &mut opt)?;
    }
    let mut json = match &cfg.log_json {
        Some(p) => Some(JsonLog::open(p, cfg.load.is_some())?),
        None => None,
    };

    let (mbs, seq) = (cfg.micro_batch_size, cfg.seq_length);
    let tokens_per_iter = (cfg.global_batch_size * seq) as f64;
    let flops_per_iter = m.flops_per_iteration(cfg.global_batch_size, seq);
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
        for micro in 0..cfg.num_micro_batches() {
            let first = progress.consumed_train + (micro * mbs) as u64;
            fetch_batch(&data.train, first, mbs, seq, &mut tokens, &mut labels)?;
            loss_sum += model.forward_backward(&dev, &tokens, &labels, mbs, seq, grad_scale);
        }
        let loss = loss_sum / tokens_per_iter;
        let grad_norm = global_grad_norm(&dev, &model.params);
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(Error::Data(format!(
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
                let v = evaluate(&mut model, &dev, valid, cfg, progress.consumed_valid, cfg.eval_iters)?;
                progress.consumed_valid += cfg.eval_iters * cfg.global_batch_size as u64;
                println!("{}", validation_line("validation", iteration, v));
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
                tflops: flops_per_iter / secs / 1e12,
                mfu: flops_per_iter / secs / (peak.gflops * 1e9),
                val_loss,
            };
            println!("{}", iteration_line(&stats));
            if let Some(j) = json.as_mut() {
                j.write(&stats)?;
            }
            (window_loss, window_iters, window_secs) = (0.0, 0, 0.0);
        }
        let exiting = cfg.exit_interval.is_some_and(|n| iteration.is_multiple_of(n)) && iteration < cfg.train_iters;
        if let Some(dir) = &cfg.save {
            let at_interval = cfg.save_interval.is_some_and(|n| iteration.is_multiple_of(n));
            if at_interval || exiting || iteration == cfg.train_iters {
                save_checkpoint(dir, &dev, &model, &opt, cfg, progress)?;
            }
        }
        if exiting {
            println!(" exiting program at iteration {iteration} (--exit-interval)");
            return Ok(summary);
        }
    }
    if let (Some(test), true) = (&data.test, cfg.eval_iters > 0) {
        let t = evaluate(&mut model, &dev, test, cfg, 0, cfg.eval_iters)?;
        println!("{}", validation_line("test", progress.iteration, t));
    }
    Ok(summary)
}
