//! Batch-size ramp-up (`--rampup-batch-size START INCREMENT SAMPLES`): the global batch of an
//! iteration as megatron-core's `RampupBatchsizeNumMicroBatchesCalculator` computes it from the
//! samples consumed before the iteration, and the iteration count of a `--train-samples` run with
//! ramp-up as Megatron's `update_train_iters` counts it.

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
    fn bad_ramps_are_one_error_each() {
        assert!(BatchRampup::new(32, 8, 100, 16).unwrap_err().to_string().contains("larger than"));
        assert!(BatchRampup::new(4, 5, 100, 16).unwrap_err().to_string().contains("does not divide"));
        assert!(BatchRampup::new(4, 0, 100, 16).is_err());
        assert!(BatchRampup::new(4, 4, 0, 16).is_err());
    }
}
