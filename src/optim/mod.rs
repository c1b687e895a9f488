//! The optimizer side of a training step: AdamW state per parameter (its gradient factor, the clip
//! coefficient, read on the device: `OptimizerOps::clip_scale`), ZeRO-1 (`distributed.rs`), the
//! learning-rate schedule (`lr.rs`), batch-size ramp-up (`rampup.rs`) and fp16's loss scaler (`scaler.rs`).

pub mod distributed;
pub mod lr;
pub mod rampup;
pub mod scaler;

use crate::device::{AdamWStep, AdamWTensor, Device};
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
    /// The hyper-parameters of one update (`OptimizerOps::adamw_group` applies the weight decay to the
    /// decayed tensors only).
    pub fn step(&self, lr: f32, step: u64) -> AdamWStep {
        AdamWStep {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            step,
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

    /// One update of every parameter, the chunk's tensors as one group (`OptimizerOps::adamw_group`: on
    /// the GPU one launch). The factor at `grad_scale` (the device's scalars and a slot,
    /// `OptimizerOps::clip_scale`'s clip coefficient over the loss scale) multiplies each gradient
    /// first, read on the device. `working`, under mixed precision, is the rounded working copy
    /// of the parameters (None where a parameter has none) and its precision: each copy is
    /// written in the same pass.
    pub fn step(
        &mut self,
        dev: &D,
        params: &mut ParamSet<D>,
        working: WorkingCopy<'_, D::Buf>,
        lr: f32,
        grad_scale: (&D::Scalars, usize),
    ) {
        self.step += 1;
        let copies: Vec<Option<(&mut D::Buf, Precision)>> = match working {
            Some((w, precision)) => {
                assert_eq!(w.len(), params.info.len(), "a working copy entry per parameter");
                w.iter_mut().map(|w| w.as_mut().map(|w| (w, precision))).collect()
            }
            None => params.info.iter().map(|_| None).collect(),
        };
        let tensors = (params.values.iter_mut().zip(&params.grads))
            .zip(self.m.iter_mut().zip(self.v.iter_mut()))
            .zip(params.info.iter().zip(copies))
            .map(|(((param, grad), (m, v)), (info, working))| AdamWTensor {
                param,
                grad,
                m,
                v,
                decayed: info.decayed(),
                working,
            })
            .collect();
        dev.adamw_group(tensors, self.config.step(lr, self.step), grad_scale);
    }
}
