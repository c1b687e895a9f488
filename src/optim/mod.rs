//! The optimizer side of a training step: AdamW state per parameter (its gradient factor, the clip
//! coefficient, read on the device: `OptimizerOps::clip_scale`), ZeRO-1 (`distributed.rs`), the
//! learning-rate schedule (`lr.rs`), batch-size ramp-up (`rampup.rs`) and fp16's loss scaler (`scaler.rs`).

pub mod distributed;
pub mod lr;
pub mod rampup;
pub mod scaler;

use crate::device::{AdamWStep, AdamWTensor, Device};
use crate::tensor::ParamInfo;
use crate::real::Precision;
use crate::tensor::ParamSet;

/// AdamW hyper-parameters (Megatron's `--adam-beta1 --adam-beta2 --adam-eps --weight-decay`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// `--decoupled-lr`: the word embedding's and output layer's own rate for the next step (set
    /// before each step from the schedule, as `weight_decay` is); None: one rate for all.
    pub decoupled_lr: Option<f32>,
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
            .map(|(((param, grad), (m, v)), (info, working))| {
                (info, AdamWTensor { param, grad, m, v, decayed: info.decayed(), working })
            })
            .collect();
        adamw_groups(dev, tensors, &self.config, lr, self.step, grad_scale);
    }
}

/// One AdamW step of `tensors` (each with its parameter's info) at the rate `lr`: one group
/// (`OptimizerOps::adamw_group`: on the GPU one launch); under `--decoupled-lr` two, the word
/// embedding and output layer at their own rate.
pub(crate) fn adamw_groups<D: Device>(
    dev: &D,
    tensors: Vec<(&ParamInfo, AdamWTensor<'_, D::Buf>)>,
    config: &AdamWConfig,
    lr: f32,
    step: u64,
    grad_scale: (&D::Scalars, usize),
) {
    let Some(decoupled) = config.decoupled_lr else {
        dev.adamw_group(tensors.into_iter().map(|(_, t)| t).collect(), config.step(lr, step), grad_scale);
        return;
    };
    let (own, rest): (Vec<_>, Vec<_>) = tensors.into_iter().partition(|(info, _)| info.embedding_or_output());
    for (group, rate) in [(rest, lr), (own, decoupled)] {
        if !group.is_empty() {
            dev.adamw_group(group.into_iter().map(|(_, t)| t).collect(), config.step(rate, step), grad_scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;
    use crate::device::Memory;
    use crate::tensor::{Init, ParamInfo};

    /// Under `--decoupled-lr` the word embedding and the output layer step at their own rate and
    /// every other parameter at the schedule's: Adam's first step moves each by its rate.
    #[test]
    fn decoupled_lr_rates_the_embedding_and_output_layer_alone() {
        let dev = CpuDevice::new(1);
        let names = ["embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight", "output_layer.weight"];
        let info = names.iter().map(|n| ParamInfo::replicated(n.to_string(), vec![4], Init::Constant(0.0))).collect();
        let mut params = ParamSet::new(&dev, info, 1);
        for g in params.grads.iter_mut() {
            dev.upload(g, &[1.0; 4]);
        }
        let config = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0.0, decoupled_lr: Some(1e-2) };
        let mut opt = AdamW::new(&dev, &params, config);
        let mut scale = dev.scalars(1);
        dev.write_scalars(&mut scale, &[1.0]);
        opt.step(&dev, &mut params, None, 1e-3, (&scale, 0));
        let moved: Vec<f32> = params
            .values
            .iter()
            .map(|v| {
                let mut out = [0f32; 4];
                dev.download(v, &mut out);
                -out[0]
            })
            .collect();
        for (name, (moved, want)) in names.iter().zip(moved.iter().zip([1e-2f32, 1e-3, 1e-2])) {
            assert!((moved - want).abs() < want * 1e-4, "{name} moved {moved}, not {want}");
        }
    }
}
