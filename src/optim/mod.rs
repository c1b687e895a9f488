//! The optimizer side of a training step: AdamW state per parameter, the global gradient norm and
//! clipping, and (in `lr.rs`) the learning-rate schedule.

pub mod distributed;
pub mod lr;
pub mod scaler;

use crate::device::{AdamWStep, Device};
use crate::real::Precision;
use crate::tensor::ParamSet;

/// AdamW hyper-parameters (Megatron's `--adam-beta1 --adam-beta2 --adam-eps --weight-decay`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl AdamWConfig {
    /// The hyper-parameters of one update of a parameter (no weight decay unless `decayed`).
    pub fn step(&self, lr: f32, decayed: bool, step: u64, grad_scale: f32) -> AdamWStep {
        AdamWStep {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: if decayed { self.weight_decay } else { 0.0 },
            step,
            grad_scale,
        }
    }
}

/// Mixed precision's working copy of a chunk's parameters: per parameter the rounded copy (None
/// where it has none) and the precision it is rounded to; None in f32.
pub type WorkingCopy<'a, B> = Option<(&'a mut [Option<B>], Precision)>;

/// First and second moments for every parameter, on the device, plus the step count.
pub struct AdamW<D: Device> {
    pub config: AdamWConfig,
    pub m: Vec<D::Buf>,
    pub v: Vec<D::Buf>,
    /// Steps taken so far; the next step uses `step + 1` for bias correction.
    pub step: u64,
}

impl<D: Device> AdamW<D> {
    pub fn new(dev: &D, params: &ParamSet<D>, config: AdamWConfig) -> AdamW<D> {
        let alloc = || params.info.iter().map(|p| dev.alloc(p.numel())).collect();
        AdamW { config, m: alloc(), v: alloc(), step: 0 }
    }

    /// One update of every parameter. `grad_scale` multiplies each gradient first (clipping).
    /// `working`, under mixed precision, is the rounded working copy of the parameters (None where
    /// a parameter has none) and its precision: each copy is written in the same pass.
    pub fn step(
        &mut self,
        dev: &D,
        params: &mut ParamSet<D>,
        mut working: WorkingCopy<'_, D::Buf>,
        lr: f32,
        grad_scale: f32,
    ) {
        self.step += 1;
        for i in 0..params.info.len() {
            let step = self.config.step(lr, params.info[i].decayed(), self.step, grad_scale);
            let copy = working.as_mut().and_then(|(w, p)| w[i].as_mut().map(|w| (w, *p)));
            dev.adamw(&mut params.values[i], &params.grads[i], &mut self.m[i], &mut self.v[i], step, copy);
        }
    }
}

/// Megatron's clipping coefficient: `clip / (norm + 1e-6)` when that is below 1, else 1. A
/// `clip` of 0 disables clipping.
pub fn clip_coefficient(norm: f64, clip: f64) -> f32 {
    if clip <= 0.0 {
        return 1.0;
    }
    let coef = clip / (norm + 1e-6);
    if coef < 1.0 {
        coef as f32
    } else {
        1.0
    }
}
