//! The distributed optimizer (ZeRO-1, `--use-distributed-optimizer`): a chunk's parameters are
//! seen as one flat vector, padded to a multiple of the data-parallel size and cut into equal
//! contiguous shards; each data-parallel rank keeps the AdamW state of its shard only. Gradients
//! are reduce-scattered (each rank receives the sum of its shard), the rank updates its shard, and
//! the updated shards are all-gathered back into every rank's parameters. Where the device has a
//! communicator for the group (`CollectiveOps::device_comm`), both collectives run on device memory
//! (the flat vector is packed with device-to-device copies into buffers kept from one step to
//! the next) and the shard's summed gradients stay there: the norm's squares are summed on the
//! device too (`ShardGrads::OnDevice`). Otherwise the shard comes to the host and the norm is
//! summed there.

use super::AdamWConfig;
use crate::comm::Comm;
use crate::device::{AdamWTensor, Device};
use crate::parallel::data::flatten;
use crate::tensor::ParamSet;
use std::ops::Range;

/// The part of one parameter inside this rank's shard, with its optimizer state.
struct Segment<B> {
    param: usize,
    /// Elements of the parameter.
    range: Range<usize>,
    /// Offset of the segment inside the shard.
    offset: usize,
    m: B,
    v: B,
    /// Staging buffers for the segment's values and gradient on the device.
    value: B,
    grad: B,
}

/// Where a step's summed gradients of this rank's shard are after `reduce_scatter_grads`.
pub enum ShardGrads {
    /// On the host (the collectives went through MPI), in shard order.
    Host(Vec<f32>),
    /// On the device, already in the segments' gradient buffers.
    OnDevice,
}

pub struct DistributedAdamW<D: Device> {
    pub config: AdamWConfig,
    pub step: u64,
    /// This rank's shard of the flat (padded) parameter vector.
    shard: Range<usize>,
    padded_len: usize,
    segments: Vec<Segment<D::Buf>>,
    /// The device collectives' buffers, made at the first step and kept: the flat vector (the
    /// gradients reduce-scattered from it, the parameters all-gathered into it) and the shard.
    flat: Option<D::Buf>,
    shard_buf: Option<D::Buf>,
}

impl<D: Device> DistributedAdamW<D> {
    pub fn new(
        dev: &D,
        params: &ParamSet<D>,
        config: AdamWConfig,
        dp_rank: usize,
        dp_size: usize,
    ) -> DistributedAdamW<D> {
        let total: usize = params.info.iter().map(|p| p.numel()).sum();
        let shard_len = total.div_ceil(dp_size);
        let shard = dp_rank * shard_len..(dp_rank + 1) * shard_len;
        let mut segments = Vec::new();
        let mut start = 0;
        for (i, p) in params.info.iter().enumerate() {
            let end = start + p.numel();
            let (lo, hi) = (start.max(shard.start), end.min(shard.end));
            if lo < hi {
                let n = hi - lo;
                segments.push(Segment {
                    param: i,
                    range: lo - start..hi - start,
                    offset: lo - shard.start,
                    m: dev.alloc(n),
                    v: dev.alloc(n),
                    value: dev.alloc(n),
                    grad: dev.alloc(n),
                });
            }
            start = end;
        }
        DistributedAdamW {
            config,
            step: 0,
            shard,
            padded_len: shard_len * dp_size,
            segments,
            flat: None,
            shard_buf: None,
        }
    }

    /// Bytes of optimizer state (both moments) this rank holds.
    pub fn state_bytes(&self, dev: &D) -> usize {
        self.segments.iter().map(|s| 4 * (dev.len(&s.m) + dev.len(&s.v))).sum()
    }

    /// Sums the gradients over the data-parallel group, keeping only this rank's shard: on the
    /// device into the segments' gradient buffers where the device has a communicator for the
    /// group, else on the host.
    pub fn reduce_scatter_grads(&mut self, dev: &D, dp: &dyn Comm, params: &ParamSet<D>) -> ShardGrads {
        if let Some(c) = dev.device_comm(dp) {
            let flat = self.flat.get_or_insert_with(|| dev.alloc(self.padded_len));
            let mut offset = 0;
            for (i, p) in params.info.iter().enumerate() {
                dev.copy(flat, offset, &params.grads[i], 0, p.numel());
                offset += p.numel();
            }
            let shard = self.shard_buf.get_or_insert_with(|| dev.alloc(self.shard.len()));
            c.reduce_scatter(flat, shard);
            for s in &mut self.segments {
                dev.copy(&mut s.grad, 0, shard, s.offset, s.range.len());
            }
            return ShardGrads::OnDevice;
        }
        let mut flat = flatten(dev, params, 0..params.info.len());
        flat.resize(self.padded_len, 0.0);
        let mut shard = vec![0f32; self.shard.len()];
        dp.reduce_scatter(&flat, &mut shard);
        ShardGrads::Host(shard)
    }

    /// This shard's share of the squared gradient norm from its summed gradients on the host,
    /// each parameter counted once (`ParamInfo::counted_in_norm`).
    pub fn sum_squares(&self, shard_grads: &[f32], params: &ParamSet<D>, tp_rank: usize) -> f64 {
        self.segments
            .iter()
            .filter(|s| params.info[s.param].counted_in_norm(tp_rank))
            .map(|s| {
                shard_grads[s.offset..s.offset + s.range.len()].iter().map(|&g| (g as f64) * (g as f64)).sum::<f64>()
            })
            .sum()
    }

    /// The zero elements of this rank's summed-gradient shard (on the host), each parameter
    /// counted once as in `sum_squares`.
    pub fn count_zeros(&self, shard_grads: &[f32], params: &ParamSet<D>, tp_rank: usize) -> usize {
        self.segments
            .iter()
            .filter(|s| params.info[s.param].counted_in_norm(tp_rank))
            .map(|s| shard_grads[s.offset..s.offset + s.range.len()].iter().filter(|&&g| g == 0.0).count())
            .sum()
    }

    /// The segments' gradient buffers that count in the norm (`ParamInfo::counted_in_norm`), for
    /// the device's sum of squares when the summed shard stayed there (`ShardGrads::OnDevice`).
    pub fn counted_grads<'a>(&'a self, params: &ParamSet<D>, tp_rank: usize) -> Vec<&'a D::Buf> {
        self.segments.iter().filter(|s| params.info[s.param].counted_in_norm(tp_rank)).map(|s| &s.grad).collect()
    }

    /// Updates this rank's shard from its summed gradients and all-gathers the parameters.
    pub fn step(
        &mut self,
        dev: &D,
        dp: &dyn Comm,
        params: &mut ParamSet<D>,
        shard_grads: &ShardGrads,
        lr: f32,
        grad_scale: (&D::Scalars, usize),
    ) {
        self.step += 1;
        if let ShardGrads::Host(g) = shard_grads {
            for s in &mut self.segments {
                dev.upload(&mut s.grad, &g[s.offset..s.offset + s.range.len()]);
            }
        }
        if let Some(c) = dev.device_comm(dp) {
            // The shard's values come from device memory, its summed gradients are in the
            // segments already; the updated shard goes out by one all-gather on the device, into
            // the kept buffers (the compute that reuses them is ordered after the collectives on
            // the device, so the host waits for nothing).
            for s in &mut self.segments {
                dev.copy(&mut s.value, 0, &params.values[s.param], s.range.start, s.range.len());
            }
            self.update_segments(dev, params, lr, grad_scale);
            let shard = self.shard_buf.get_or_insert_with(|| dev.alloc(self.shard.len()));
            for s in &self.segments {
                dev.copy(shard, s.offset, &s.value, 0, s.range.len());
            }
            let flat = self.flat.get_or_insert_with(|| dev.alloc(self.padded_len));
            c.all_gather(shard, flat);
            let mut offset = 0;
            for (i, p) in params.info.iter().enumerate() {
                dev.copy(&mut params.values[i], 0, flat, offset, p.numel());
                offset += p.numel();
            }
            return;
        }
        let all = 0..params.info.len();
        let mut flat = flatten_values(dev, params);
        flat.resize(self.padded_len, 0.0);
        let mut updated = flat[self.shard.clone()].to_vec();
        for s in &mut self.segments {
            dev.upload(&mut s.value, &updated[s.offset..s.offset + s.range.len()]);
        }
        self.update_segments(dev, params, lr, grad_scale);
        for s in &self.segments {
            dev.download(&s.value, &mut updated[s.offset..s.offset + s.range.len()]);
        }
        dp.all_gather(&updated, &mut flat);
        let total: usize = params.info.iter().map(|p| p.numel()).sum();
        let mut offset = 0;
        for i in all {
            let n = params.info[i].numel();
            dev.upload(&mut params.values[i], &flat[offset..offset + n]);
            offset += n;
        }
        debug_assert_eq!(offset, total);
    }

    /// One AdamW step of every segment of the shard from its staged values and gradients, as one
    /// group (`OptimizerOps::adamw_group`: on the GPU one launch).
    fn update_segments(&mut self, dev: &D, params: &ParamSet<D>, lr: f32, grad_scale: (&D::Scalars, usize)) {
        let tensors = self
            .segments
            .iter_mut()
            .map(|s| {
                let info = &params.info[s.param];
                let (param, grad, m, v) = (&mut s.value, &s.grad, &mut s.m, &mut s.v);
                (info, AdamWTensor { param, grad, m, v, decayed: info.decayed(), working: None })
            })
            .collect();
        super::adamw_groups(dev, tensors, &self.config, lr, self.step, grad_scale);
    }

    /// Both moments of every parameter, whole (gathered from every data-parallel rank), for a
    /// checkpoint that does not depend on the data-parallel size.
    pub fn gather_state(&self, dev: &D, dp: &dyn Comm, params: &ParamSet<D>) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let mut moments = Vec::new();
        for which in 0..2 {
            let mut shard = vec![0f32; self.shard.len()];
            for s in &self.segments {
                let buf = if which == 0 { &s.m } else { &s.v };
                dev.download(buf, &mut shard[s.offset..s.offset + s.range.len()]);
            }
            let mut flat = vec![0f32; self.padded_len];
            dp.all_gather(&shard, &mut flat);
            let mut per_param = Vec::new();
            let mut offset = 0;
            for p in &params.info {
                per_param.push(flat[offset..offset + p.numel()].to_vec());
                offset += p.numel();
            }
            moments.push(per_param);
        }
        let v = moments.pop().expect("two moments");
        let m = moments.pop().expect("two moments");
        (m, v)
    }

    /// Restores this rank's shard of both moments from whole per-parameter tensors.
    pub fn load_state(&mut self, dev: &D, m: &[Vec<f32>], v: &[Vec<f32>]) {
        for s in &mut self.segments {
            dev.upload(&mut s.m, &m[s.param][s.range.clone()]);
            dev.upload(&mut s.v, &v[s.param][s.range.clone()]);
        }
    }
}

/// The parameter values as one flat host vector.
fn flatten_values<D: Device>(dev: &D, params: &ParamSet<D>) -> Vec<f32> {
    let mut flat = Vec::new();
    for (i, p) in params.info.iter().enumerate() {
        let start = flat.len();
        flat.resize(start + p.numel(), 0.0);
        dev.download(&params.values[i], &mut flat[start..]);
    }
    flat
}
