//! The batch, the learning-rate and weight-decay schedule, the batch-size ramp-up and AdamW's
//! hyper-parameters, from Megatron's flags.

use super::presets::Preset;
use crate::cli::Args;
use crate::error::{Error, Result};
use crate::optim::lr::{DecayStyle, IncrStyle, LrSchedule};
use crate::optim::rampup::{BatchRampup, BatchSchedule, StepBatches};
use crate::optim::AdamWConfig;

/// The micro-batch and global batch sizes: both at least 1, the global a multiple of the micro.
pub(super) fn batch_sizes(args: &Args, p: &Preset, steps: Option<&StepBatches>) -> Result<(usize, usize)> {
    let micro_batch_size = args.usize("--micro-batch-size")?.unwrap_or(p.micro_batch_size);
    let last = steps.map(|s| s.steps.last().expect("a step").1 as usize);
    let global_batch_size = match (args.usize("--global-batch-size")?, last) {
        (Some(g), Some(last)) if g != last => {
            return Err(Error::Config(format!(
                "--global-batch-size {g} is not the last batch of --step-batch-size-schedule ({last}): give one, or \
                 both agreeing (Megatron takes only one)"
            )))
        }
        (Some(g), _) => g,
        (None, Some(last)) => last,
        (None, None) => p.global_batch_size.max(micro_batch_size),
    };
    if micro_batch_size == 0 || global_batch_size == 0 {
        return Err(Error::Config("--micro-batch-size and --global-batch-size must be at least 1".into()));
    }
    if !global_batch_size.is_multiple_of(micro_batch_size) {
        return Err(Error::Config(format!(
            "--global-batch-size {global_batch_size} is not a multiple of --micro-batch-size {micro_batch_size}"
        )));
    }
    Ok((micro_batch_size, global_batch_size))
}

/// The iterations to train and the learning-rate and weight-decay schedule, in samples as
/// Megatron counts them: by iterations (`--train-iters`, `--lr-decay-iters`, `--lr-warmup-iters`,
/// `--lr-wsd-decay-iters`, each times the global batch) or by samples (`--train-samples` and the
/// `-samples` flags; the run is `--train-samples` / global batch iterations). Flags of the other
/// kind are one error naming them.
pub(super) fn lr_schedule(
    args: &Args,
    p: &Preset,
    global_batch_size: usize,
    rampup: Option<&BatchSchedule>,
) -> Result<(u64, u64, LrSchedule)> {
    let gbs = global_batch_size as u64;
    let by_samples = args.has("--train-samples");
    let (wrong, right) = match by_samples {
        true => (["--train-iters", "--lr-decay-iters", "--lr-warmup-iters", "--lr-wsd-decay-iters"], "--train-samples"),
        false => (["--lr-decay-samples", "--lr-warmup-samples", "--lr-wsd-decay-samples", ""], "--train-iters"),
    };
    if let Some(flag) = wrong.iter().find(|f| !f.is_empty() && args.has(f)) {
        return Err(Error::Config(format!(
            "{flag} does not go with {right}: count the run, its warmup and its decay all in iterations or all in \
             samples"
        )));
    }
    let train_samples = match args.u64("--train-samples")? {
        Some(n) => n,
        None => args.u64("--train-iters")?.unwrap_or(p.train_iters) * gbs,
    };
    if matches!(rampup, Some(BatchSchedule::Ramp(_))) && !by_samples {
        return Err(Error::Config(format!(
            "--rampup-batch-size needs sample-based training: give --train-samples instead of {} (Megatron \
             expects no batch-size ramp-up for iteration-based training)",
            if args.has("--train-iters") { "--train-iters" } else { "the preset's iteration count" }
        )));
    }
    // By iterations, a step schedule's spans count whole final batches, as --global-batch-size does.
    let train_iters = match rampup {
        Some(r) if by_samples => r.train_iters(train_samples),
        _ => train_samples / gbs,
    };
    let samples = |iters: &str, samples: &str| -> Result<Option<u64>> {
        Ok(match by_samples {
            true => args.u64(samples)?,
            false => args.u64(iters)?.map(|n| n * gbs),
        })
    };
    let decay_steps = samples("--lr-decay-iters", "--lr-decay-samples")?.unwrap_or(train_samples);
    let warmup_steps = match (args.f64("--lr-warmup-fraction")?, samples("--lr-warmup-iters", "--lr-warmup-samples")?) {
        (Some(_), Some(_)) => {
            return Err(Error::Config("give --lr-warmup-fraction or a warmup count, not both".into()));
        }
        (Some(f), None) if (0.0..=1.0).contains(&f) => f * decay_steps as f64,
        (Some(f), None) => return Err(Error::flag("--lr-warmup-fraction", f, "a fraction from 0 to 1")),
        (None, Some(n)) => n as f64,
        // A preset's warmup shrinks to a tenth of a shorter run, so `--train-iters 20` just works.
        (None, None) => (p.warmup_iters.min(train_iters / 10) * gbs) as f64,
    };
    let style = DecayStyle::parse(args.str("--lr-decay-style").unwrap_or("cosine"), args.str("--lr-wsd-decay-style"))?;
    let max_lr = args.f64("--lr")?.unwrap_or(p.lr);
    let weight_decay = args.f64("--weight-decay")?.unwrap_or(0.01);
    let wd_style = IncrStyle::parse(args.str("--weight-decay-incr-style").unwrap_or("constant"))?;
    let (start_wd, end_wd) = match (wd_style, args.f64("--start-weight-decay")?, args.f64("--end-weight-decay")?) {
        (IncrStyle::Constant, None, None) => (weight_decay, weight_decay),
        (IncrStyle::Constant, _, _) => {
            return Err(Error::Config(
                "--start-weight-decay and --end-weight-decay need --weight-decay-incr-style linear or cosine \
                 (constant takes --weight-decay)"
                    .into(),
            ))
        }
        (_, Some(start), Some(end)) => (start, end),
        _ => {
            return Err(Error::Config(
                "--weight-decay-incr-style linear or cosine needs --start-weight-decay and --end-weight-decay".into(),
            ))
        }
    };
    let min_lr = args.f64("--min-lr")?.unwrap_or(if args.has("--lr") { 0.0 } else { p.min_lr });
    let schedule = LrSchedule {
        init_lr: args.f64("--lr-warmup-init")?.unwrap_or(0.0),
        max_lr,
        min_lr,
        warmup_steps,
        decay_steps,
        style,
        wsd_decay_steps: samples("--lr-wsd-decay-iters", "--lr-wsd-decay-samples")?.unwrap_or(0),
        start_wd,
        end_wd,
        wd_incr_steps: train_samples,
        wd_style,
        decoupled: match (args.f64("--decoupled-lr")?, args.f64("--decoupled-min-lr")?) {
            (Some(max), min) => Some((max, min.unwrap_or(min_lr))),
            (None, Some(_)) => return Err(Error::Usage("--decoupled-min-lr needs --decoupled-lr".into())),
            (None, None) => None,
        },
    };
    schedule.validate()?;
    if train_iters == 0 {
        return Err(Error::Config(format!(
            "the run is {train_samples} samples, less than one global batch of {global_batch_size}"
        )));
    }
    Ok((train_iters, train_samples, schedule))
}

/// `--step-batch-size-schedule`, its thresholds counted in tokens of `seq_length`.
pub(super) fn step_batches(args: &Args, seq_length: usize) -> Result<Option<StepBatches>> {
    let Some(text) = args.str("--step-batch-size-schedule") else { return Ok(None) };
    for other in ["--rampup-batch-size", "--decrease-batch-size-if-needed"] {
        if args.has(other) {
            return Err(Error::Usage(format!(
                "--step-batch-size-schedule and {other} exclude each other (as in Megatron)"
            )));
        }
    }
    StepBatches::parse(text, seq_length as u64).map(Some)
}

/// How the global batch changes: `--step-batch-size-schedule`'s steps, or `--rampup-batch-size
/// START INCREMENT SAMPLES` checked against the global batch; None: it does not.
pub(super) fn rampup(
    args: &Args,
    global_batch_size: usize,
    steps: Option<StepBatches>,
) -> Result<Option<BatchSchedule>> {
    if let Some(steps) = steps {
        return Ok(Some(BatchSchedule::Steps(steps)));
    }
    let Some(values) = args.list("--rampup-batch-size") else { return Ok(None) };
    let expected = "three whole numbers: START INCREMENT SAMPLES";
    let numbers: Vec<u64> = values
        .iter()
        .map(|v| v.parse().map_err(|_| Error::flag("--rampup-batch-size", format!("'{v}'"), expected)))
        .collect::<Result<_>>()?;
    let [start, increment, samples] = numbers[..] else {
        return Err(Error::flag("--rampup-batch-size", format!("{} values", numbers.len()), expected));
    };
    BatchRampup::new(start, increment, samples, global_batch_size as u64).map(|r| Some(BatchSchedule::Ramp(r)))
}

/// AdamW's hyper-parameters, with both betas in [0, 1).
pub(super) fn adam(args: &Args) -> Result<AdamWConfig> {
    let adam = AdamWConfig {
        beta1: args.f64("--adam-beta1")?.unwrap_or(0.9) as f32,
        beta2: args.f64("--adam-beta2")?.unwrap_or(0.999) as f32,
        eps: args.f64("--adam-eps")?.unwrap_or(1e-8) as f32,
        // `LrSchedule::weight_decay` replaces it before every step (`--weight-decay-incr-style`).
        weight_decay: args.f64("--weight-decay")?.unwrap_or(0.01) as f32,
        decoupled_lr: None,
    };
    for (name, b) in [("--adam-beta1", adam.beta1), ("--adam-beta2", adam.beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::flag(name, b, "a number in [0, 1)"));
        }
    }
    Ok(adam)
}
