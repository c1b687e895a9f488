//! Megatron's learning-rate and weight-decay schedule (megatron-core's `OptimizerParamScheduler`),
//! counted in samples as Megatron counts it: linear warmup from `--lr-warmup-init`, then
//! constant, linear, cosine, inverse-square-root or WSD (warmup-stable-decay) decay to `--min-lr`
//! over the decay span, `--min-lr` after it; weight decay from `--start-weight-decay` to
//! `--end-weight-decay` (constant, linear or cosine) over the run. Iteration-based flags are
//! turned into samples by the global batch size (`config/schedule.rs`), so the rate an iteration uses is
//! a function of the samples consumed before it, as in Megatron.

use crate::error::{Error, Result};
use std::f64::consts::PI;

/// The decay after warmup (`--lr-decay-style`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecayStyle {
    Constant,
    Linear,
    Cosine,
    InverseSquareRoot,
    /// Warmup-stable-decay: `max_lr` until the last `wsd_decay_steps`, then this anneal.
    Wsd(WsdStyle),
}

/// WSD's anneal (`--lr-wsd-decay-style`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsdStyle {
    Linear,
    Cosine,
    Exponential,
    MinusSqrt,
}

/// How weight decay moves from its start to its end value (`--weight-decay-incr-style`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncrStyle {
    Constant,
    Linear,
    Cosine,
}

impl DecayStyle {
    /// `--lr-decay-style` (with `--lr-wsd-decay-style` for WSD, default `exponential` as in
    /// Megatron).
    pub fn parse(s: &str, wsd: Option<&str>) -> Result<DecayStyle> {
        match s {
            "constant" => Ok(DecayStyle::Constant),
            "linear" => Ok(DecayStyle::Linear),
            "cosine" => Ok(DecayStyle::Cosine),
            "inverse-square-root" => Ok(DecayStyle::InverseSquareRoot),
            "WSD" => Ok(DecayStyle::Wsd(match wsd.unwrap_or("exponential") {
                "linear" => WsdStyle::Linear,
                "cosine" => WsdStyle::Cosine,
                "exponential" => WsdStyle::Exponential,
                "minus_sqrt" => WsdStyle::MinusSqrt,
                other => {
                    return Err(Error::flag("--lr-wsd-decay-style", other, "linear, cosine, exponential or minus_sqrt"))
                }
            })),
            _ => Err(Error::flag("--lr-decay-style", s, "constant, linear, cosine, inverse-square-root or WSD")),
        }
    }
}

impl IncrStyle {
    pub fn parse(s: &str) -> Result<IncrStyle> {
        match s {
            "constant" => Ok(IncrStyle::Constant),
            "linear" => Ok(IncrStyle::Linear),
            "cosine" => Ok(IncrStyle::Cosine),
            _ => Err(Error::flag("--weight-decay-incr-style", s, "constant, linear or cosine")),
        }
    }
}

/// The schedule, every span in samples. `warmup_steps` may be fractional
/// (`--lr-warmup-fraction` of the decay span).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub init_lr: f64,
    pub max_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: f64,
    pub decay_steps: u64,
    pub style: DecayStyle,
    /// WSD's anneal span (the last samples of the decay span).
    pub wsd_decay_steps: u64,
    pub start_wd: f64,
    pub end_wd: f64,
    pub wd_incr_steps: u64,
    pub wd_style: IncrStyle,
    /// `--decoupled-lr` and `--decoupled-min-lr` (default `min_lr`): the word embedding's and
    /// output layer's peak and floor, on the same warmup and decay (megatron-core's
    /// `ParamGroupOverride` of `max_lr` and `min_lr`).
    pub decoupled: Option<(f64, f64)>,
}

impl LrSchedule {
    /// The learning rate after `steps` samples (the rate of the iteration those samples precede).
    pub fn lr(&self, steps: u64) -> f64 {
        self.rate(steps, self.max_lr, self.min_lr)
    }

    /// Under `--decoupled-lr`, the word embedding's and output layer's rate after `steps` samples.
    pub fn decoupled_lr(&self, steps: u64) -> Option<f64> {
        self.decoupled.map(|(max_lr, min_lr)| self.rate(steps, max_lr, min_lr))
    }

    /// The schedule's rate after `steps` samples for a group whose peak is `max_lr` and floor `min_lr`.
    fn rate(&self, steps: u64, max_lr: f64, min_lr: f64) -> f64 {
        let n = steps as f64;
        if self.warmup_steps > 0.0 && n <= self.warmup_steps {
            return self.init_lr + (max_lr - self.init_lr) * n / self.warmup_steps;
        }
        if self.style == DecayStyle::Constant {
            return max_lr;
        }
        if steps > self.decay_steps {
            return min_lr;
        }
        if self.style == DecayStyle::InverseSquareRoot {
            let lr = max_lr * self.warmup_steps.max(1.0).sqrt() / n.max(1.0).sqrt();
            return lr.max(min_lr);
        }
        let ratio = (n - self.warmup_steps) / (self.decay_steps as f64 - self.warmup_steps);
        let coeff = match self.style {
            DecayStyle::Linear => 1.0 - ratio,
            DecayStyle::Cosine => 0.5 * ((PI * ratio).cos() + 1.0),
            DecayStyle::Wsd(anneal) => {
                let anneal_start = self.decay_steps - self.wsd_decay_steps;
                if steps <= anneal_start {
                    1.0
                } else {
                    let r = (steps - anneal_start) as f64 / self.wsd_decay_steps as f64;
                    match anneal {
                        WsdStyle::Linear => 1.0 - r,
                        WsdStyle::Cosine => 0.5 * ((PI * r).cos() + 1.0),
                        WsdStyle::Exponential => 2.0 * 0.5f64.powf(r) - 1.0,
                        WsdStyle::MinusSqrt => 1.0 - r.sqrt(),
                    }
                }
            }
            DecayStyle::Constant | DecayStyle::InverseSquareRoot => unreachable!("returned above"),
        };
        min_lr + coeff * (max_lr - min_lr)
    }

    /// The weight decay after `steps` samples.
    pub fn weight_decay(&self, steps: u64) -> f64 {
        if steps > self.wd_incr_steps || self.wd_style == IncrStyle::Constant {
            return self.end_wd;
        }
        let ratio = steps as f64 / self.wd_incr_steps as f64;
        let coeff = match self.wd_style {
            IncrStyle::Linear => ratio,
            IncrStyle::Cosine => 0.5 * ((PI * (1.0 - ratio)).cos() + 1.0),
            IncrStyle::Constant => 1.0,
        };
        self.start_wd + coeff * (self.end_wd - self.start_wd)
    }

    /// Megatron's checks: rates ordered, a decay span past the warmup, WSD's anneal inside it,
    /// weight decay that only grows (and stays put when constant).
    pub fn validate(&self) -> Result<()> {
        let lr = (self.init_lr, self.max_lr, self.min_lr);
        if !(self.max_lr > 0.0 && self.min_lr >= 0.0 && self.min_lr <= self.max_lr && self.init_lr >= 0.0) {
            return Err(Error::Config(format!(
                "need 0 <= --min-lr ({}) <= --lr ({}), --lr > 0 and --lr-warmup-init ({}) >= 0",
                lr.2, lr.1, lr.0
            )));
        }
        if let Some((max, min)) = self.decoupled {
            if !(max > 0.0 && (0.0..=max).contains(&min) && self.init_lr <= max) {
                return Err(Error::Config(format!(
                    "need 0 <= --decoupled-min-lr ({min}) <= --decoupled-lr ({max}), --decoupled-lr > 0 and \
                     --lr-warmup-init ({}) <= --decoupled-lr",
                    self.init_lr
                )));
            }
        }
        if self.init_lr > self.max_lr {
            return Err(Error::Config(format!("--lr-warmup-init {} is above --lr {}", lr.0, lr.1)));
        }
        if self.style != DecayStyle::Constant && self.decay_steps as f64 <= self.warmup_steps {
            return Err(Error::Config(format!(
                "the decay span ({} samples: --lr-decay-iters or --lr-decay-samples) must be longer than the warmup \
                 ({} samples: --lr-warmup-iters, --lr-warmup-samples or --lr-warmup-fraction)",
                self.decay_steps, self.warmup_steps
            )));
        }
        if matches!(self.style, DecayStyle::Wsd(_)) && !(1..=self.decay_steps).contains(&self.wsd_decay_steps) {
            return Err(Error::Config(format!(
                "--lr-decay-style WSD needs --lr-wsd-decay-iters or --lr-wsd-decay-samples: an anneal of 1 to {} \
                 samples (the decay span), not {}",
                self.decay_steps, self.wsd_decay_steps
            )));
        }
        if self.start_wd < 0.0 || self.end_wd < self.start_wd {
            return Err(Error::Config(format!(
                "need 0 <= --start-weight-decay ({}) <= --end-weight-decay ({})",
                self.start_wd, self.end_wd
            )));
        }
        if self.wd_style == IncrStyle::Constant && self.start_wd != self.end_wd {
            return Err(Error::Config(
                "--start-weight-decay and --end-weight-decay differ: pick --weight-decay-incr-style linear or cosine"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine() -> LrSchedule {
        LrSchedule {
            init_lr: 0.0,
            max_lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 10.0,
            decay_steps: 110,
            style: DecayStyle::Cosine,
            wsd_decay_steps: 0,
            start_wd: 0.1,
            end_wd: 0.1,
            wd_incr_steps: 110,
            wd_style: IncrStyle::Constant,
            decoupled: None,
        }
    }

    #[test]
    fn warmup_then_cosine_reaches_min() {
        let s = cosine();
        assert_eq!(s.lr(0), 0.0);
        assert!((s.lr(5) - 5e-4).abs() < 1e-12);
        assert!((s.lr(10) - 1e-3).abs() < 1e-12);
        assert!((s.lr(60) - 5.5e-4).abs() < 1e-12);
        assert!((s.lr(110) - 1e-4).abs() < 1e-12);
        assert!((s.lr(500) - 1e-4).abs() < 1e-12);
        let lin = LrSchedule { style: DecayStyle::Linear, ..s };
        assert!((lin.lr(60) - 5.5e-4).abs() < 1e-12);
        assert!(DecayStyle::parse("cosinus", None).is_err());
    }

    #[test]
    fn wsd_holds_then_anneals_and_weight_decay_grows() {
        let s = LrSchedule { style: DecayStyle::Wsd(WsdStyle::Linear), wsd_decay_steps: 20, ..cosine() };
        assert_eq!(s.lr(90), 1e-3);
        assert!((s.lr(100) - 5.5e-4).abs() < 1e-12);
        assert!((s.lr(110) - 1e-4).abs() < 1e-12);
        assert!(LrSchedule { wsd_decay_steps: 0, ..s }.validate().is_err());
        let wd = LrSchedule { start_wd: 0.0, end_wd: 0.1, wd_style: IncrStyle::Linear, ..cosine() };
        assert!((wd.weight_decay(55) - 0.05).abs() < 1e-12);
        assert_eq!(wd.weight_decay(111), 0.1);
        assert!(LrSchedule { wd_style: IncrStyle::Constant, ..wd }.validate().is_err());
    }
}
