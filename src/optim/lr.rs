//! Megatron's learning-rate schedule: linear warmup from 0, then constant, linear or cosine decay
//! to `--min-lr` over `--lr-decay-iters`, constant at `--min-lr` afterwards.

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecayStyle {
    Constant,
    Linear,
    Cosine,
}

impl DecayStyle {
    pub fn parse(s: &str) -> Result<DecayStyle> {
        match s {
            "constant" => Ok(DecayStyle::Constant),
            "linear" => Ok(DecayStyle::Linear),
            "cosine" => Ok(DecayStyle::Cosine),
            _ => Err(Error::flag("--lr-decay-style", s, "constant, linear or cosine")),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            DecayStyle::Constant => "constant",
            DecayStyle::Linear => "linear",
            DecayStyle::Cosine => "cosine",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub max_lr: f64,
    pub min_lr: f64,
    pub warmup_iters: u64,
    pub decay_iters: u64,
    pub style: DecayStyle,
}

impl LrSchedule {
    /// The learning rate used by iteration `iteration` (1-based): warmup reaches `max_lr` at
    /// iteration `warmup_iters`, and decay reaches `min_lr` at iteration `decay_iters`.
    pub fn at(&self, iteration: u64) -> f64 {
        if self.warmup_iters > 0 && iteration <= self.warmup_iters {
            return self.max_lr * iteration as f64 / self.warmup_iters as f64;
        }
        if self.style == DecayStyle::Constant {
            return self.max_lr;
        }
        if iteration >= self.decay_iters {
            return self.min_lr;
        }
        let span = (self.decay_iters - self.warmup_iters) as f64;
        let ratio = (iteration - self.warmup_iters) as f64 / span;
        let coef = match self.style {
            DecayStyle::Linear => 1.0 - ratio,
            DecayStyle::Cosine => 0.5 * ((std::f64::consts::PI * ratio).cos() + 1.0),
            DecayStyle::Constant => 1.0,
        };
        self.min_lr + coef * (self.max_lr - self.min_lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_reaches_min() {
        let s =
            LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 10, decay_iters: 110, style: DecayStyle::Cosine };
        assert!((s.at(5) - 5e-4).abs() < 1e-12);
        assert!((s.at(10) - 1e-3).abs() < 1e-12);
        assert!((s.at(60) - 5.5e-4).abs() < 1e-12);
        assert!((s.at(110) - 1e-4).abs() < 1e-12);
        assert!((s.at(500) - 1e-4).abs() < 1e-12);
        let lin = LrSchedule { style: DecayStyle::Linear, ..s };
        assert!((lin.at(60) - 5.5e-4).abs() < 1e-12);
        assert!(DecayStyle::parse("cosinus").is_err());
    }
}
