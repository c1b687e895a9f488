//! The distributed optimizer (ZeRO-1, `--use-distributed-optimizer`), sharded bucket by bucket as
//! Megatron's is: each data-parallel gradient bucket (a range of parameters) is seen as one flat
//! vector, padded to a multiple of the data-parallel size and cut into equal blocks; rank r keeps
//! the AdamW state of block r of every bucket, its shard. Gradients are reduce-scattered bucket by
//! bucket (each rank receives the sum of its blocks), under `--overlap-grad-reduce` each as soon
//! as backward's last micro-batch has finished it (`mark_final`), else after backward; the rank
//! updates its shard, and the updated blocks are all-gathered back into every rank's parameters.
//! Where the device has a communicator for the group (`CollectiveOps::device_comm`), both
//! collectives run on device memory (each bucket packed with device-to-device copies into buffers
//! kept from one step to the next) and the shard's summed gradients stay there: the norm's
//! squares are summed on the device too (`ShardGrads::OnDevice`). Otherwise the shard comes to the
//! host and the norm is summed there. The reduce-scatters are the same calls with or without the
//! overlap (only their start moves), so both give the same bits.

use super::AdamWConfig;
use crate::comm::{Comm, Pending};
use crate::device::{AdamWTensor, Device};
use crate::parallel::arriving::Arriving;
use crate::parallel::data::flatten;
use crate::tensor::ParamSet;
use std::collections::VecDeque;
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

/// How the buckets' gradients are summed: in bf16 (`--grad-reduce-in-bf16`); starting during
/// backward (`--overlap-grad-reduce`); and under ZeRO-2 (`shard_grads`,
/// `--data-parallel-sharding-strategy optim_grads`) every micro-batch, into a shard-sized sum,
/// each bucket's whole gradients released as soon as they are sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct GradReduce {
    pub bf16: bool,
    pub overlap: bool,
    pub shard_grads: bool,
}

/// One gradient bucket (the data-parallel buckets' ranges of parameters): its elements padded to
/// a multiple of the data-parallel size and cut into equal blocks, block r this rank's when r is
/// its rank, and its reduce-scatters in flight.
struct Bucket<B> {
    params: Range<usize>,
    /// Elements of the padded bucket, and of each block (`padded` / the data-parallel size).
    padded: usize,
    block_len: usize,
    /// Where this rank's block starts in its shard.
    shard_at: usize,
    /// Whether its reduce-scatter may start during backward (`mark_final`): under
    /// `--overlap-grad-reduce`, when no parameter in it needs a sum over another group first.
    early: bool,
    /// ZeRO-2: reduce-scattered every micro-batch (`grads_ready`), each result added into
    /// `sum` in the order sent, its whole gradients released once packed. Buckets whose
    /// gradients need another sum first keep them whole and reduce once, as under ZeRO-1.
    per_micro: bool,
    /// The host path's reduce-scatters in flight, oldest first.
    pending: VecDeque<Box<dyn Pending>>,
    /// The device path's buffers, made at the first step and kept: the packed bucket and this
    /// rank's block; and whether a reduce-scatter was started into them and not yet landed.
    flat: Option<B>,
    block: Option<B>,
    started: bool,
    /// `--grad-reduce-in-bf16`: the reduce-scatter in bf16, on the device through bf16 buffers
    /// of its own, made on first use (the weights' all-gather keeps `flat` and `block`).
    bf16: bool,
    flat16: Option<B>,
    block16: Option<B>,
    /// ZeRO-2's sum of this rank's block over the step's micro-batches, on the host or the
    /// device (whichever path the reduce-scatters take), made on first use; and on the device
    /// the packed bucket of the reduce-scatter in flight, made for it and freed once it lands.
    sum: Option<Summed<B>>,
    sending: Option<B>,
}

/// ZeRO-2's running sum of one bucket's block.
enum Summed<B> {
    Host(Vec<f32>),
    Device(B),
}

/// ZeRO-2's reduce-scatters in flight at most under `--overlap-grad-reduce` (the oldest lands
/// when another starts): enough to hide one bucket's sum behind the next one's backward.
const IN_FLIGHT: usize = 2;

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
    shard_len: usize,
    segments: Vec<Segment<D::Buf>>,
    buckets: Vec<Bucket<D::Buf>>,
    reduce: GradReduce,
    /// ZeRO-2's buckets with a reduce-scatter in flight, oldest first (at most `IN_FLIGHT`), and
    /// whether the device hands a lone parameter's buffer to the reduce-scatter
    /// (`Memory::take_host_f32`) instead of packing a copy.
    in_flight: VecDeque<usize>,
    hands_over: bool,
    /// Per parameter: final this step (`mark_final`), and ZeRO-2's reported since its bucket was
    /// last sent (`grads_ready`).
    final_params: Vec<bool>,
    unsent: Vec<bool>,
    /// The device buffer of `sum_segments`, made on first use and kept.
    sums_flat: Option<D::Buf>,
}

impl<D: Device> DistributedAdamW<D> {
    /// The optimizer of `params` sharded over `dp_size` ranks bucket by bucket (`buckets`: ranges
    /// of parameters covering them all, in any order; reduced as `reduce` says); `early(i)` says
    /// whether parameter `i`'s gradient is final when backward leaves it (no sum over another
    /// group to wait for). Under ZeRO-2 the whole gradients of the buckets reduced every
    /// micro-batch are released here, until backward makes them again.
    pub fn new(
        dev: &D,
        params: &mut ParamSet<D>,
        config: AdamWConfig,
        (dp_rank, dp_size): (usize, usize),
        buckets: &[Range<usize>],
        (reduce, early): (GradReduce, impl Fn(usize) -> bool),
    ) -> DistributedAdamW<D> {
        let mut ranges = buckets.to_vec();
        ranges.sort_by_key(|r| r.start);
        let (mut segments, mut made, mut shard_len) = (Vec::new(), Vec::new(), 0);
        for params_of in ranges {
            let total: usize = params_of.clone().map(|i| params.info[i].numel()).sum();
            let block = total.div_ceil(dp_size);
            let mine = dp_rank * block..(dp_rank + 1) * block;
            let mut start = 0;
            for i in params_of.clone() {
                let end = start + params.info[i].numel();
                let (lo, hi) = (start.max(mine.start), end.min(mine.end));
                if lo < hi {
                    let n = hi - lo;
                    let [m, v, value, grad] = [(); 4].map(|_| dev.alloc(n));
                    let (range, offset) = (lo - start..hi - start, shard_len + lo - mine.start);
                    segments.push(Segment { param: i, range, offset, m, v, value, grad });
                }
                start = end;
            }
            let final_early = params_of.clone().all(&early);
            if reduce.shard_grads && final_early {
                params.free_grads(dev, params_of.clone());
            }
            made.push(Bucket {
                early: reduce.overlap && final_early,
                per_micro: reduce.shard_grads && final_early,
                params: params_of,
                padded: block * dp_size,
                block_len: block,
                shard_at: shard_len,
                pending: VecDeque::new(),
                flat: None,
                block: None,
                started: false,
                bf16: reduce.bf16,
                flat16: None,
                block16: None,
                sum: None,
                sending: None,
            });
            shard_len += block;
        }
        let (n, buckets) = (params.info.len(), made);
        let (final_params, unsent) = (vec![false; n], vec![false; n]);
        let (in_flight, hands_over) = (VecDeque::new(), dev.take_host_f32(dev.alloc(0)).is_ok());
        let (step, sums_flat) = (0, None);
        DistributedAdamW {
            config,
            step,
            shard_len,
            segments,
            buckets,
            reduce,
            in_flight,
            hands_over,
            final_params,
            unsent,
            sums_flat,
        }
    }

    /// Bytes of ZeRO-2's summed shard of the gradients (nothing under ZeRO-1; its packed copies
    /// in flight count with the whole gradients, `ParamSet::held_outside`).
    pub fn summed_grad_bytes(&self, dev: &D) -> usize {
        let bytes = |s: &Summed<D::Buf>| match s {
            Summed::Host(v) => 4 * v.len(),
            Summed::Device(b) => 4 * dev.len(b),
        };
        self.buckets.iter().filter_map(|b| b.sum.as_ref()).map(bytes).sum::<usize>()
    }

    /// Bytes of gradients the sharding's formula gives this rank: without ZeRO-2 every
    /// parameter's. Under it the sums of its blocks (Ψ/N), and on top the most the buckets hold
    /// during backward, replayed over backward's `order` (`Gpt::backward_order`; one pass, since
    /// what was in flight before it landed, `land_in_flight`) as `grads_ready` runs it: whole
    /// gradients from the step that makes them until their bucket is sent (the buckets reduced
    /// once held throughout), beside the packed copies in flight (one for the moment of the send,
    /// `IN_FLIGHT` under `--overlap-grad-reduce`; a lone parameter's buffer handed over is not
    /// copied).
    pub fn formula_grad_bytes(&self, params: &ParamSet<D>, order: &[(Vec<usize>, Range<usize>)]) -> usize {
        let numel = |r: Range<usize>| r.map(|i| params.info[i].numel()).sum::<usize>();
        if !self.reduce.shard_grads {
            return 4 * params.num_elements();
        }
        let n = params.info.len();
        let (mut live, mut told) = (vec![false; n], vec![false; n]);
        let (mut whole, mut peak, mut flight) = (0, 0, VecDeque::<(usize, usize)>::new());
        for b in self.buckets.iter().filter(|b| !b.per_micro) {
            live[b.params.clone()].fill(true);
            whole += 4 * numel(b.params.clone());
        }
        for (made, finished) in order {
            for &i in made.iter().filter(|&&i| !std::mem::replace(&mut live[i], true)) {
                whole += 4 * numel(i..i + 1);
            }
            peak = peak.max(whole + flight.iter().map(|f| f.1).sum::<usize>());
            told[finished.clone()].fill(true);
            for (k, b) in self.buckets.iter().enumerate().filter(|(_, b)| b.per_micro) {
                if !b.params.clone().all(|i| told[i]) {
                    continue;
                }
                told[b.params.clone()].fill(false);
                live[b.params.clone()].fill(false);
                flight.retain(|f| f.0 != k);
                while flight.len() >= IN_FLIGHT {
                    flight.pop_front();
                }
                let copy = b.copy_bytes();
                let handed = if self.hands_over && b.lone(params) { copy } else { 0 };
                peak = peak.max(whole - handed + copy + flight.iter().map(|f| f.1).sum::<usize>());
                whole -= 4 * numel(b.params.clone());
                if self.reduce.overlap {
                    flight.push_back((k, copy));
                }
            }
        }
        let sums: usize = self.buckets.iter().filter(|b| b.per_micro).map(|b| b.block_len).sum();
        4 * sums + peak
    }

    /// What backward tells of each range of parameters whose gradients it will not touch again in
    /// this micro-batch (`last`: of the step). Under ZeRO-2 every bucket whose parameters have
    /// all been told of since it was last sent is reduce-scattered now and its whole gradients
    /// released; in the step's last micro-batch the other early buckets start (`mark_final`).
    pub fn grads_ready(&mut self, dev: &D, dp: &dyn Comm, set: &mut ParamSet<D>, params: Range<usize>, last: bool) {
        if self.reduce.shard_grads {
            for i in params.clone() {
                self.unsent[i] = true;
            }
            for k in 0..self.buckets.len() {
                let b = &mut self.buckets[k];
                if b.per_micro && b.params.clone().all(|i| self.unsent[i]) {
                    self.send(dev, dp, set, k);
                } else if let Some(p) = b.pending.front_mut() {
                    p.poll();
                }
            }
        }
        if last {
            self.mark_final(dev, dp, set, params);
        }
    }

    /// Bytes of optimizer state (both moments) this rank holds.
    pub fn state_bytes(&self, dev: &D) -> usize {
        self.segments.iter().map(|s| 4 * (dev.len(&s.m) + dev.len(&s.v))).sum()
    }

    /// Records that the gradients of `params` are final for this step (backward's last
    /// micro-batch left them), and starts the reduce-scatter of every early bucket now complete
    /// (`--overlap-grad-reduce`), on the device where it has a communicator for the group.
    pub fn mark_final(&mut self, dev: &D, dp: &dyn Comm, set: &ParamSet<D>, params: Range<usize>) {
        for i in params {
            self.final_params[i] = true;
        }
        let finals = &self.final_params;
        for b in self.buckets.iter_mut().filter(|b| b.early && !b.per_micro) {
            if !b.started && b.params.clone().all(|i| finals[i]) {
                b.start(dev, dp, set);
            } else if let Some(p) = b.pending.front_mut() {
                p.poll();
            }
        }
    }

    /// ZeRO-2: lands every reduce-scatter in flight, before a backward pass makes gradients
    /// again (so that a bucket's next whole gradients and its last packed copy do not meet).
    pub fn land_in_flight(&mut self, dev: &D, dp: &dyn Comm, set: &mut ParamSet<D>) {
        if !self.reduce.shard_grads {
            return;
        }
        for k in std::mem::take(&mut self.in_flight) {
            self.buckets[k].land(dev, dp);
        }
        set.held_outside(dev, self.packed_bytes());
    }

    /// Bytes of ZeRO-2's packed gradients in flight.
    fn packed_bytes(&self) -> usize {
        self.buckets.iter().map(Bucket::packed_bytes).sum()
    }

    /// ZeRO-2: sends bucket `k` (`Bucket::send`), first landing the oldest in flight where
    /// `IN_FLIGHT` are, so that packed copies of the gradients never add up to the whole of them.
    fn send(&mut self, dev: &D, dp: &dyn Comm, set: &mut ParamSet<D>, k: usize) {
        self.unsent[self.buckets[k].params.clone()].fill(false);
        self.in_flight.retain(|&j| j != k);
        while self.in_flight.len() >= IN_FLIGHT {
            let oldest = self.in_flight.pop_front().expect("IN_FLIGHT is positive");
            self.buckets[oldest].land(dev, dp);
        }
        self.buckets[k].land(dev, dp);
        let others = self.packed_bytes();
        let hand_over = self.hands_over && self.buckets[k].lone(set);
        self.buckets[k].send(dev, dp, set, (others, hand_over), self.reduce.overlap);
        set.held_outside(dev, self.packed_bytes());
        if self.reduce.overlap {
            self.in_flight.push_back(k);
        }
    }

    /// Sums the gradients over the data-parallel group, keeping only this rank's shard: sends
    /// ZeRO-2's buckets that gained gradients since they were last sent (a zero-bubble W pass can
    /// add to one after), starts every other bucket `mark_final` did not, then waits for all; on
    /// the device into the segments' gradient buffers where the device has a communicator for the
    /// group, else on the host. ZeRO-2's sums start again from zero.
    pub fn reduce_scatter_grads(&mut self, dev: &D, dp: &dyn Comm, params: &mut ParamSet<D>) -> ShardGrads {
        for k in 0..self.buckets.len() {
            let b = &mut self.buckets[k];
            if b.per_micro && b.params.clone().any(|i| self.unsent[i]) {
                self.send(dev, dp, params, k);
            } else if !b.per_micro && !b.started {
                b.start(dev, dp, params);
            }
        }
        self.in_flight.clear();
        self.final_params.fill(false);
        params.held_outside(dev, 0);
        if let Some(c) = dev.device_comm(dp) {
            c.wait();
            for b in &mut self.buckets {
                let (range, shard_at) = (b.params.clone(), b.shard_at);
                let block = match b.per_micro {
                    true => b.land(dev, dp).expect("a ZeRO-2 bucket is sent every micro-batch"),
                    false => &*b.grad_buffers(dev).1,
                };
                for s in self.segments.iter_mut().filter(|s| range.contains(&s.param)) {
                    dev.copy(&mut s.grad, 0, block, s.offset - shard_at, s.range.len());
                }
                b.started = false;
                if let Some(Summed::Device(sum)) = b.sum.as_mut() {
                    dev.fill(sum, 0.0);
                }
            }
            return ShardGrads::OnDevice;
        }
        let mut shard = vec![0f32; self.shard_len];
        for b in &mut self.buckets {
            b.started = false;
            let at = b.shard_at..b.shard_at + b.block_len;
            if !b.per_micro {
                shard[at].copy_from_slice(&b.pending.pop_front().expect("started").wait());
            } else {
                b.land(dev, dp);
                if let Some(Summed::Host(sum)) = b.sum.as_mut() {
                    shard[at].copy_from_slice(sum);
                    sum.fill(0.0);
                }
            }
        }
        ShardGrads::Host(shard)
    }

    /// Sums, over `group`, this shard's summed gradients of the parameters `which` selects, in
    /// place: the tensor-parallel sum of the sequence-parallel parameters' gradients after the
    /// data-parallel reduce-scatter (a sum over both groups in either order), which lets their
    /// buckets reduce during backward. `group`'s ranks must hold the same layout (1-D tensor
    /// parallelism's peers: the same parameters' shapes, so the same buckets and blocks).
    pub fn sum_segments(
        &mut self,
        dev: &D,
        group: &dyn Comm,
        shard_grads: &mut ShardGrads,
        which: impl Fn(usize) -> bool,
    ) {
        // The picked segments and where each sits in the packed buffer of their sum.
        let mut total = 0;
        let picked: Vec<(usize, usize)> = (0..self.segments.len())
            .filter(|&k| which(self.segments[k].param))
            .map(|k| {
                total += self.segments[k].range.len();
                (k, total - self.segments[k].range.len())
            })
            .collect();
        if group.size() == 1 || total == 0 {
            return;
        }
        if let (ShardGrads::OnDevice, Some(c)) = (&*shard_grads, dev.device_comm(group)) {
            let flat = self.sums_flat.get_or_insert_with(|| dev.alloc(total));
            for &(k, at) in &picked {
                let s = &self.segments[k];
                dev.copy(flat, at, &s.grad, 0, s.range.len());
            }
            c.all_reduce(flat);
            for &(k, at) in &picked {
                let s = &mut self.segments[k];
                dev.copy(&mut s.grad, 0, flat, at, s.range.len());
            }
            return;
        }
        let mut flat = vec![0f32; total];
        for &(k, at) in &picked {
            let s = &self.segments[k];
            let part = &mut flat[at..at + s.range.len()];
            match &*shard_grads {
                ShardGrads::Host(g) => part.copy_from_slice(&g[s.offset..s.offset + s.range.len()]),
                ShardGrads::OnDevice => dev.download(&s.grad, part),
            }
        }
        group.all_reduce(&mut flat, crate::comm::ReduceOp::Sum);
        for &(k, at) in &picked {
            let s = &mut self.segments[k];
            let part = &flat[at..at + s.range.len()];
            match shard_grads {
                ShardGrads::Host(g) => g[s.offset..s.offset + s.range.len()].copy_from_slice(part),
                ShardGrads::OnDevice => dev.upload(&mut s.grad, part),
            }
        }
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

    /// Updates this rank's shard from its summed gradients and all-gathers the parameters, bucket
    /// by bucket. The host path's all-gathers are started and, without `gather_later`, finished
    /// here; with it (`--overlap-param-gather`) the returned `Arriving` writes each bucket's
    /// weights when the next forward first reads one of them (the device path's all-gathers are
    /// enqueued on the communicator's stream either way, and nothing arrives later).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        dev: &D,
        dp: &dyn Comm,
        params: &mut ParamSet<D>,
        shard_grads: &ShardGrads,
        lr: f32,
        grad_scale: (&D::Scalars, usize),
        gather_later: bool,
    ) -> Arriving {
        let mut arriving = Arriving::default();
        self.step += 1;
        if let ShardGrads::Host(g) = shard_grads {
            for s in &mut self.segments {
                dev.upload(&mut s.grad, &g[s.offset..s.offset + s.range.len()]);
            }
        }
        for s in &mut self.segments {
            dev.copy(&mut s.value, 0, &params.values[s.param], s.range.start, s.range.len());
        }
        self.update_segments(dev, params, lr, grad_scale);
        let on_device = dev.device_comm(dp);
        for b in &mut self.buckets {
            let (range, shard_at) = (b.params.clone(), b.shard_at);
            let segments = self.segments.iter().filter(|s| range.contains(&s.param));
            let Some(c) = on_device else {
                let mut block = vec![0f32; b.block_len];
                for s in segments {
                    let at = s.offset - shard_at;
                    dev.download(&s.value, &mut block[at..at + s.range.len()]);
                }
                arriving.push(range, dp.all_gather_start(block));
                continue;
            };
            // The updated block goes out by one all-gather on the device, into the kept buffers
            // (the compute that reuses them is ordered after the collectives on the device, so
            // the host waits for nothing).
            let (flat, block) = b.buffers(dev);
            for s in segments {
                dev.copy(block, s.offset - shard_at, &s.value, 0, s.range.len());
            }
            c.all_gather(block, flat);
            let mut offset = 0;
            for i in range {
                let n = params.info[i].numel();
                dev.copy(&mut params.values[i], 0, flat, offset, n);
                offset += n;
            }
        }
        if !gather_later {
            arriving.settle_all(dev, params);
        }
        arriving
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
        let mut moments = [vec![Vec::new(); params.info.len()], vec![Vec::new(); params.info.len()]];
        for b in &self.buckets {
            for (which, per_param) in moments.iter_mut().enumerate() {
                let mut block = vec![0f32; b.block_len];
                for s in self.segments.iter().filter(|s| b.params.contains(&s.param)) {
                    let at = s.offset - b.shard_at;
                    dev.download(if which == 0 { &s.m } else { &s.v }, &mut block[at..at + s.range.len()]);
                }
                let mut flat = vec![0f32; b.padded];
                dp.all_gather(&block, &mut flat);
                let mut offset = 0;
                for i in b.params.clone() {
                    let n = params.info[i].numel();
                    per_param[i] = flat[offset..offset + n].to_vec();
                    offset += n;
                }
            }
        }
        let [m, v] = moments;
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

impl<B> Bucket<B> {
    /// The device path's packed bucket and block buffers, made on first use (zero-filled: the
    /// padding past the last parameter stays zero).
    fn buffers<D: Device<Buf = B>>(&mut self, dev: &D) -> (&mut B, &mut B) {
        let block_len = self.block_len;
        let flat = self.flat.get_or_insert_with(|| dev.alloc(self.padded));
        let block = self.block.get_or_insert_with(|| dev.alloc(block_len));
        (flat, block)
    }

    /// The device path's buffers of the gradients' reduce-scatter: `buffers`, or under
    /// `--grad-reduce-in-bf16` a pair in bf16 storage of their own.
    fn grad_buffers<D: Device<Buf = B>>(&mut self, dev: &D) -> (&mut B, &mut B) {
        if !self.bf16 {
            return self.buffers(dev);
        }
        let (padded, block_len) = (self.padded, self.block_len);
        let bf16 = |n| dev.alloc_in(n, crate::real::Precision::Bf16);
        (self.flat16.get_or_insert_with(|| bf16(padded)), self.block16.get_or_insert_with(|| bf16(block_len)))
    }

    /// Starts the sum reduce-scatter of the bucket's gradients as `set` holds them now: packed on
    /// the device and reduced by its communicator for the group, else flattened to the host and
    /// reduced by the Comm (both complete in `reduce_scatter_grads`); in bf16 under
    /// `--grad-reduce-in-bf16`.
    fn start<D: Device<Buf = B>>(&mut self, dev: &D, dp: &dyn Comm, set: &ParamSet<D>) {
        self.started = true;
        if let Some(c) = dev.device_comm(dp) {
            let params = self.params.clone();
            let (flat, block) = self.grad_buffers(dev);
            pack(dev, set, params, flat);
            c.reduce_scatter_start(flat, block);
            return;
        }
        self.pending.push_back(self.host_start(dp, self.host_flat(dev, set)));
    }

    /// The host path's reduce-scatter of `flat`, the bucket's gradients padded.
    fn host_start(&self, dp: &dyn Comm, flat: Vec<f32>) -> Box<dyn Pending> {
        match self.bf16 {
            true => dp.sum_start_bf16(flat, true),
            false => dp.reduce_scatter_start(flat),
        }
    }

    /// Whether the bucket is one parameter that needs no padding: its own buffer can go to the
    /// reduce-scatter as it is.
    fn lone<D: Device<Buf = B>>(&self, set: &ParamSet<D>) -> bool {
        self.params.len() == 1 && set.info[self.params.start].numel() == self.padded
    }

    /// Bytes of one packed copy of the bucket (padded; bf16 under `--grad-reduce-in-bf16`).
    fn copy_bytes(&self) -> usize {
        self.padded * if self.bf16 { 2 } else { 4 }
    }

    /// The bucket's gradients as `set` holds them, packed on the host and padded.
    fn host_flat<D: Device<Buf = B>>(&self, dev: &D, set: &ParamSet<D>) -> Vec<f32> {
        let mut flat = flatten(dev, set, self.params.clone());
        flat.resize(self.padded, 0.0);
        flat
    }

    /// ZeRO-2: starts the reduce-scatter of the bucket's gradients as `set` holds them (its
    /// reduce-scatter before landed: on the device its block buffer is reused) and releases them;
    /// on the device from a packed copy made for it, on the host from one or, `hand_over`, from
    /// the lone parameter's own buffer. `set` counts the packed bytes in flight (`others`
    /// beside this one's) with the gradients still whole. Without `overlap` it lands at once.
    fn send<D: Device<Buf = B>>(
        &mut self,
        dev: &D,
        dp: &dyn Comm,
        set: &mut ParamSet<D>,
        (others, hand_over): (usize, bool),
        overlap: bool,
    ) {
        match dev.device_comm(dp) {
            Some(c) => {
                self.started = true;
                let n = self.padded;
                let mut flat = if self.bf16 { dev.alloc_in(n, crate::real::Precision::Bf16) } else { dev.alloc(n) };
                pack(dev, set, self.params.clone(), &mut flat);
                c.reduce_scatter_start(&flat, self.grad_buffers(dev).1);
                self.sending = Some(flat);
            }
            None => {
                let i = self.params.start;
                let handed = hand_over.then(|| dev.take_host_f32(std::mem::replace(&mut set.grads[i], dev.alloc(0))));
                let flat = match handed {
                    Some(Ok(own)) => own,
                    Some(Err(kept)) => {
                        set.grads[i] = kept;
                        self.host_flat(dev, set)
                    }
                    None => self.host_flat(dev, set),
                };
                let pending = self.host_start(dp, flat);
                self.pending.push_back(pending);
            }
        }
        set.held_outside(dev, others + self.packed_bytes());
        set.free_grads(dev, self.params.clone());
        if !overlap {
            self.land(dev, dp);
        } else if let Some(p) = self.pending.front_mut() {
            p.poll();
        }
    }

    /// Bytes of packed gradients this bucket has in flight (ZeRO-2's reduce-scatters not landed).
    fn packed_bytes(&self) -> usize {
        let count = self.pending.len() + usize::from(self.sending.is_some());
        count * self.copy_bytes()
    }

    /// ZeRO-2: adds the reduce-scatters in flight into the bucket's sum of its block, oldest
    /// first (on the device the one its block buffer receives, widened from bf16 first), and
    /// returns the device's sum.
    fn land<D: Device<Buf = B>>(&mut self, dev: &D, dp: &dyn Comm) -> Option<&B> {
        let n = self.block_len;
        if let Some(c) = dev.device_comm(dp) {
            let Summed::Device(sum) = self.sum.get_or_insert_with(|| Summed::Device(dev.alloc(n))) else {
                unreachable!("the device path sums on the device")
            };
            if std::mem::take(&mut self.started) {
                c.wait();
                self.sending = None;
                let block = self.block.get_or_insert_with(|| dev.alloc(n));
                if let (true, Some(half)) = (self.bf16, &self.block16) {
                    dev.copy(block, 0, half, 0, n);
                }
                dev.add_assign(sum, block);
            }
            return Some(sum);
        }
        let Summed::Host(sum) = self.sum.get_or_insert_with(|| Summed::Host(vec![0.0; n])) else {
            unreachable!("the host path sums on the host")
        };
        while let Some(p) = self.pending.pop_front() {
            for (s, x) in sum.iter_mut().zip(p.wait()) {
                *s += x;
            }
        }
        self.started = false;
        None
    }
}

/// Copies the gradients of `params` as `set` holds them into `flat` on the device, one after
/// another (rounded to its storage).
fn pack<D: Device>(dev: &D, set: &ParamSet<D>, params: Range<usize>, flat: &mut D::Buf) {
    let mut offset = 0;
    for i in params {
        let n = set.info[i].numel();
        dev.copy(flat, offset, &set.grads[i], 0, n);
        offset += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::threads::run_group;
    use crate::device::cpu::CpuDevice;
    use crate::device::Memory;
    use crate::tensor::{Init, ParamInfo};

    const ADAM: AdamWConfig = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.0, decoupled_lr: None };

    /// Parameters of 3, 2, 4 and 1 elements, zero: buckets [p0 p1] and [p2 p3] of 5 elements
    /// each, padded to 6 over two ranks.
    fn four_parameters(dev: &CpuDevice) -> ParamSet<CpuDevice> {
        let info = [3, 2, 4, 1]
            .iter()
            .map(|&n| ParamInfo::replicated(format!("p{n}"), vec![n], Init::Constant(0.0)))
            .collect();
        ParamSet::new(dev, info, 0)
    }

    /// Rank `rank`'s shard of two: block `rank` of each padded bucket, element k of parameter i
    /// being `sum(i, k)`.
    fn shard_of(rank: usize, sum: impl Fn(usize, usize) -> f32) -> Vec<f32> {
        let flat0 = [sum(0, 0), sum(0, 1), sum(0, 2), sum(1, 0), sum(1, 1), 0.0];
        let flat1 = [sum(2, 0), sum(2, 1), sum(2, 2), sum(2, 3), sum(3, 0), 0.0];
        [&flat0[3 * rank..3 * rank + 3], &flat1[3 * rank..3 * rank + 3]].concat()
    }

    /// Two ranks, four parameters in two buckets: under the overlap the bucket whose gradients
    /// are final starts its reduce-scatter in `mark_final`, the other waits for
    /// `reduce_scatter_grads`; the shard is block r of each padded bucket, summed.
    #[test]
    fn each_bucket_reduce_scatters_its_own_padded_blocks_and_early_ones_start_in_backward() {
        let out = run_group(2, |rank, comm| {
            let dev = CpuDevice::new(1);
            let mut set = four_parameters(&dev);
            for (i, g) in set.grads.iter_mut().enumerate() {
                let n = dev.len(g);
                dev.upload(g, &(0..n).map(|k| (10 * i + k + 100 * rank) as f32).collect::<Vec<_>>());
            }
            let reduce = GradReduce { overlap: true, ..Default::default() };
            let mut z = DistributedAdamW::new(&dev, &mut set, ADAM, (rank, 2), &[2..4, 0..2], (reduce, |i| i >= 2));
            z.mark_final(&dev, comm, &set, 2..4);
            let early = z.buckets.iter().map(|b| b.started).collect::<Vec<_>>();
            z.mark_final(&dev, comm, &set, 0..2);
            let late = z.buckets.iter().map(|b| b.started).collect::<Vec<_>>();
            let ShardGrads::Host(shard) = z.reduce_scatter_grads(&dev, comm, &mut set) else { unreachable!() };
            (early, late, shard)
        });
        // Summed over ranks: element k of parameter i is 2 (10 i + k) + 100.
        let sum = |i: usize, k: usize| (2 * (10 * i + k) + 100) as f32;
        for (rank, (early, late, shard)) in out.into_iter().enumerate() {
            assert_eq!(early, [false, true], "rank {rank}: only the final early bucket started");
            assert_eq!(late, [false, true], "rank {rank}: a bucket that is not early waits");
            assert_eq!(shard, shard_of(rank, sum), "rank {rank}");
        }
    }

    /// ZeRO-2 on two ranks over three micro-batches: the bucket whose gradients are final in
    /// backward is reduce-scattered each micro-batch as soon as all of it is told of, its whole
    /// gradients released, and made again (zeroed) before the next backward adds; the other
    /// bucket keeps its gradients and reduces once. The shard is the sum over micro-batches and
    /// ranks, with the overlap or without; the next step's sums start from zero.
    #[test]
    fn zero2_sends_each_micro_batch_and_releases_the_whole_gradients() {
        for overlap in [false, true] {
            let out = run_group(2, move |rank, comm| {
                let dev = CpuDevice::new(1);
                let mut set = four_parameters(&dev);
                let reduce = GradReduce { overlap, shard_grads: true, ..Default::default() };
                let mut z = DistributedAdamW::new(&dev, &mut set, ADAM, (rank, 2), &[2..4, 0..2], (reduce, |i| i >= 2));
                let held = |set: &ParamSet<CpuDevice>| set.grads.iter().map(|g| dev.len(g)).collect::<Vec<_>>();
                assert_eq!(held(&set), [3, 2, 0, 0], "the per-micro-batch bucket's gradients start released");
                let mut shards = Vec::new();
                for _step in 0..2 {
                    for micro in 0..3 {
                        let last = micro == 2;
                        set.ensure_grads(&dev, 2..4);
                        for i in 0..4 {
                            let n = set.info[i].numel();
                            let g: Vec<f32> = (0..n).map(|k| (10 * i + k + 100 * rank + 1000 * micro) as f32).collect();
                            let mut now = vec![0f32; n];
                            dev.download(&set.grads[i], &mut now);
                            let sum: Vec<f32> = now.iter().zip(&g).map(|(a, b)| a + b).collect();
                            dev.upload(&mut set.grads[i], &sum);
                        }
                        z.grads_ready(&dev, comm, &mut set, 3..4, last);
                        assert_eq!(held(&set), [3, 2, 4, 1], "half a bucket told of: nothing sent");
                        z.grads_ready(&dev, comm, &mut set, 2..3, last);
                        assert_eq!(held(&set), [3, 2, 0, 0], "the told bucket was sent and released");
                        z.grads_ready(&dev, comm, &mut set, 0..2, last);
                    }
                    let ShardGrads::Host(shard) = z.reduce_scatter_grads(&dev, comm, &mut set) else { unreachable!() };
                    set.zero_grads(&dev);
                    shards.push(shard);
                }
                (shards, z.summed_grad_bytes(&dev), set.peak_grad_bytes(&dev))
            });
            // Element k of parameter i summed over 3 micro-batches and 2 ranks:
            // 6 (10 i + k) + 3 * 100 + 2 * 3000.
            let sum = |i: usize, k: usize| (6 * (10 * i + k) + 300 + 6000) as f32;
            for (rank, (shards, summed, peak)) in out.into_iter().enumerate() {
                let expect = shard_of(rank, sum);
                assert_eq!(shards[0], expect, "rank {rank}, overlap {overlap}");
                assert_eq!(shards[1], expect, "rank {rank}, overlap {overlap}: the second step's sums start at zero");
                // One block of the per-micro-batch bucket summed; at most every gradient whole
                // beside the packed copy of the bucket being sent.
                assert_eq!(summed, 4 * 3, "summed gradients");
                assert_eq!(peak, 4 * 10 + 4 * 6, "whole and packed gradients at once");
            }
        }
    }
}
