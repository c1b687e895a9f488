//! Batch-size schedules: ramp-up (`--rampup-batch-size START INCREMENT SAMPLES`, megatron-core's
//! `RampupBatchsizeNumMicroBatchesCalculator`) and steps (`--step-batch-size-schedule
//! "0:768 250B:1536"`, its `StepBatchsizeNumMicroBatchesCalculator`): the global batch of an
//! iteration from the samples consumed before it, and the iteration count of a `--train-samples`
//! run as Megatron's `update_train_iters` counts it.

use crate::error::{Error, Result};

/// The ramp from `start` to the full global batch in steps of `increment`, spread evenly over
/// the first `samples` samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchRampup {
    pub start: u64,
    pub increment: u64,
    pub samples: u64,
    pub global: u64,
}

impl BatchRampup {
    /// Checks the ramp as megatron-core does (every value positive; the full batch at least the
    /// start, and reached by whole increments), each failure one error naming the flag.
    pub fn new(start: u64, increment: u64, samples: u64, global: u64) -> Result<BatchRampup> {
        let flag = "--rampup-batch-size";
        for (what, v) in
            [("start batch size", start), ("batch size increment", increment), ("ramp-up samples", samples)]
        {
            if v == 0 {
                return Err(Error::flag(flag, format!("a {what} of 0"), "START INCREMENT SAMPLES, all positive"));
            }
        }
        if start > global {
            return Err(Error::Config(format!(
                "{flag}: the start batch size {start} is larger than --global-batch-size {global}"
            )));
        }
        if !(global - start).is_multiple_of(increment) {
            return Err(Error::Config(format!(
                "{flag}: the increment {increment} does not divide the ramp from {start} to --global-batch-size \
                 {global} ({} samples)",
                global - start
            )));
        }
        Ok(BatchRampup { start, increment, samples, global })
    }

    /// The global batch of an iteration that starts after `consumed` samples: the start batch plus
    /// one increment per `samples / increments` samples consumed (megatron-core's float
    /// division, truncated), the full batch once the ramp's samples are passed.
    pub fn global_batch(&self, consumed: u64) -> u64 {
        let increments = (self.global - self.start) / self.increment;
        if consumed > self.samples || increments == 0 {
            return self.global;
        }
        let per_increment = self.samples as f64 / increments as f64;
        let steps = (consumed as f64 / per_increment) as u64;
        (self.start + steps * self.increment).min(self.global)
    }

    /// Iterations of a run of `train_samples` samples, as Megatron's `update_train_iters`: one per
    /// global batch while the consumed samples are at most the ramp's and the run's (so the ramp
    /// may end one batch past the run), then whole full batches of what is left.
    pub fn train_iters(&self, train_samples: u64) -> u64 {
        let (mut iterations, mut consumed) = (0, 0);
        while consumed <= self.samples && consumed <= train_samples {
            consumed += self.global_batch(consumed);
            iterations += 1;
        }
        if train_samples > consumed {
            iterations += (train_samples - consumed) / self.global;
        }
        iterations
    }

    /// The ramp's iterations: (samples consumed before it, its global batch) for each iteration
    /// whose batch is below the full one, from the start of the run.
    pub fn ramp(&self) -> Vec<(u64, u64)> {
        let (mut out, mut consumed) = (Vec::new(), 0);
        loop {
            let batch = self.global_batch(consumed);
            if batch == self.global {
                return out;
            }
            out.push((consumed, batch));
            consumed += batch;
        }
    }
}

/// `--step-batch-size-schedule`: from each threshold of consumed samples on, its global batch.
#[derive(Clone, Debug, PartialEq)]
pub struct StepBatches {
    /// (threshold in samples, global batch), the first threshold 0, strictly increasing.
    pub steps: Vec<(u64, u64)>,
}

impl StepBatches {
    /// Parses Megatron's "THRESHOLD:BATCH THRESHOLD:BATCH ..." (commas also separate; K, M, B and
    /// T multiply by 1e3 to 1e12): thresholds count tokens, turned into samples by whole
    /// `seq_length`s as megatron-core turns them, then sorted; the first must be 0, the rest
    /// strictly increasing, every batch positive.
    pub fn parse(text: &str, seq_length: u64) -> Result<StepBatches> {
        let flag = "--step-batch-size-schedule";
        let number = |v: &str| -> Option<u64> {
            let v = v.trim().to_ascii_uppercase();
            let (digits, scale) = match v.chars().last()? {
                'K' => (&v[..v.len() - 1], 1e3),
                'M' => (&v[..v.len() - 1], 1e6),
                'B' => (&v[..v.len() - 1], 1e9),
                'T' => (&v[..v.len() - 1], 1e12),
                _ => (&v[..], 1.0),
            };
            let x = digits.parse::<f64>().ok()? * scale;
            (0.0..1.8e19).contains(&x).then_some(x as u64)
        };
        let mut steps = Vec::new();
        for entry in text.replace(',', " ").split_whitespace() {
            let parsed = entry.split_once(':').and_then(|(t, b)| Some((number(t)? / seq_length.max(1), number(b)?)));
            let Some(step) = parsed.filter(|&(_, b)| b > 0) else {
                return Err(Error::flag(flag, format!("entry '{entry}'"), "THRESHOLD:BATCH with a positive batch"));
            };
            steps.push(step);
        }
        steps.sort_by_key(|&(t, _)| t);
        if steps.first().is_none_or(|&(t, _)| t != 0) {
            return Err(Error::flag(flag, format!("\"{text}\""), "a first entry at threshold 0"));
        }
        if let Some(w) = steps.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::flag(
                flag,
                format!("\"{text}\""),
                format!("thresholds at least one sequence apart ({} samples twice)", w[0].0),
            ));
        }
        Ok(StepBatches { steps })
    }

    /// The global batch after `consumed` samples: the last step whose threshold is reached.
    pub fn global_batch(&self, consumed: u64) -> u64 {
        self.steps.iter().take_while(|&&(t, _)| consumed >= t).last().map_or(self.steps[0].1, |&(_, b)| b)
    }
}

/// How the global batch changes over a run.
#[derive(Clone, Debug, PartialEq)]
pub enum BatchSchedule {
    Ramp(BatchRampup),
    Steps(StepBatches),
}

impl BatchSchedule {
    /// The global batch of an iteration that starts after `consumed` samples.
    pub fn global_batch(&self, consumed: u64) -> u64 {
        match self {
            BatchSchedule::Ramp(r) => r.global_batch(consumed),
            BatchSchedule::Steps(s) => s.global_batch(consumed),
        }
    }

    /// The batch the schedule ends at (what `--global-batch-size` is).
    pub fn global(&self) -> u64 {
        match self {
            BatchSchedule::Ramp(r) => r.global,
            BatchSchedule::Steps(s) => s.steps.last().expect("a step").1,
        }
    }

    /// The flag that set it, for messages.
    pub fn flag(&self) -> &'static str {
        match self {
            BatchSchedule::Ramp(_) => "--rampup-batch-size",
            BatchSchedule::Steps(_) => "--step-batch-size-schedule",
        }
    }

    /// Iterations of a run of `train_samples` samples, as Megatron's `update_train_iters`.
    pub fn train_iters(&self, train_samples: u64) -> u64 {
        match self {
            BatchSchedule::Ramp(r) => r.train_iters(train_samples),
            BatchSchedule::Steps(s) => {
                let (mut iterations, mut consumed) = (0, 0);
                while consumed < train_samples {
                    consumed += s.global_batch(consumed);
                    iterations += 1;
                }
                iterations
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_steps_up_by_increments_over_the_ramp() {
        // Megatron's docstring example: 16 to 1024 by 8 over 300000 samples, 126 increments.
        let r = BatchRampup::new(16, 8, 300000, 1024).unwrap();
        assert_eq!(r.global_batch(0), 16);
        assert_eq!(r.global_batch(2380), 16);
        assert_eq!(r.global_batch(2381), 24);
        assert_eq!(r.global_batch(300000), 1024);
        assert_eq!(r.global_batch(300001), 1024);
        let ramp = r.ramp();
        assert_eq!(ramp[0], (0, 16));
        assert!(ramp.windows(2).all(|w| w[1].0 == w[0].0 + w[0].1 && w[1].1 >= w[0].1));
    }

    #[test]
    fn train_iters_counts_the_ramp_then_full_batches() {
        let r = BatchRampup::new(2, 2, 8, 8).unwrap();
        // Batches 2 (at 0 consumed), 2 (2), 4 (4), then 8 from 8 on (megatron-core's values).
        assert_eq!(r.ramp(), vec![(0, 2), (2, 2), (4, 4)]);
        // The ramp loop runs while consumed <= 8 and <= the run: 4 iterations reach 16 samples.
        assert_eq!(r.train_iters(14), 4);
        assert_eq!(r.train_iters(8), 4);
        assert_eq!(r.train_iters(30), 5);
    }

    #[test]
    fn step_schedules_parse_as_megatron_and_count_their_iterations() {
        // The GPT-3 175B script's schedule, thresholds in tokens over sequences of 2048.
        let s = StepBatches::parse("0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", 2048).unwrap();
        assert_eq!(s.steps[..2], [(0, 16), (1_171_875, 320)]);
        assert_eq!((s.global_batch(0), s.global_batch(1_171_874), s.global_batch(1_171_875)), (16, 16, 320));
        let b = BatchSchedule::Steps(StepBatches::parse("0:2, 8:4", 1).unwrap());
        assert_eq!((b.global(), b.flag()), (4, "--step-batch-size-schedule"));
        // 2, 2, 2, 2 (8 consumed), then 4s: 14 samples take 6 iterations; 8 take 4.
        assert_eq!((b.train_iters(14), b.train_iters(8)), (6, 4));
        assert_eq!((b.global_batch(7), b.global_batch(8)), (2, 4));
        for (bad, why) in
            [("8:4", "threshold 0"), ("0:4 x:8", "entry 'x:8'"), ("0:0", "positive"), ("0:2 1:4", "apart")]
        {
            let e = StepBatches::parse(bad, 2).unwrap_err().to_string();
            assert!(e.contains("--step-batch-size-schedule") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_ramps_are_one_error_each() {
        assert!(BatchRampup::new(32, 8, 100, 16).unwrap_err().to_string().contains("larger than"));
        assert!(BatchRampup::new(4, 5, 100, 16).unwrap_err().to_string().contains("does not divide"));
        assert!(BatchRampup::new(4, 0, 100, 16).is_err());
        assert!(BatchRampup::new(4, 4, 0, 16).is_err());
    }
}
