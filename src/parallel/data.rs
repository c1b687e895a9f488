//! Data-parallel gradient reduction: parameters are grouped into buckets in the order backward
//! finishes them (last layer first), and each bucket's all-reduce is posted as soon as every
//! gradient in it is final, so communication overlaps the rest of backward. Also the
//! tensor-parallel sum of the gradients that sequence parallelism leaves partial.
//!
//! Where the device has a communicator for the group (`CollectiveOps::device_comm`), a bucket's
//! gradients are packed into one flat device buffer with device-to-device copies, summed by one
//! all-reduce on device memory, and copied back; otherwise they are flattened into host memory
//! and summed through the MPI Comm.

use crate::comm::{Comm, Pending, ReduceOp};
use crate::device::{all_reduce_scalars, Device};
use crate::tensor::{ParamInfo, ParamSet};
use std::ops::Range;

/// Megatron's default bucket size (`--ddp-bucket-size`), in elements.
pub const DEFAULT_BUCKET_ELEMENTS: usize = 40_000_000;

struct Bucket<B> {
    params: Range<usize>,
    pending: Option<Box<dyn Pending>>,
    /// The flat device buffer of the bucket (kept across iterations) and whether its all-reduce
    /// was started on the device this iteration.
    flat: Option<B>,
    started: bool,
}

/// The buckets of one model replica and the state of the current iteration's reduction.
pub struct GradBuckets<B> {
    buckets: Vec<Bucket<B>>,
    final_params: Vec<bool>,
    /// `--grad-reduce-in-bf16`: the sums in bf16 (device buffers in bf16 storage).
    bf16: bool,
}

/// Copies the gradients of `params` into `flat` (allocated on first use, in bf16 storage with
/// `bf16`; the copy rounds) on the device.
fn pack<D: Device>(dev: &D, set: &ParamSet<D>, params: Range<usize>, flat: &mut Option<D::Buf>, bf16: bool) {
    let total: usize = params.clone().map(|i| set.info[i].numel()).sum();
    let flat = flat.get_or_insert_with(|| match bf16 {
        true => dev.alloc_in(total, crate::real::Precision::Bf16),
        false => dev.alloc(total),
    });
    let mut offset = 0;
    for i in params {
        let n = set.info[i].numel();
        dev.copy(flat, offset, &set.grads[i], 0, n);
        offset += n;
    }
}

/// Copies a flat device buffer made by `pack` back into the gradients.
fn unpack<D: Device>(dev: &D, set: &mut ParamSet<D>, params: Range<usize>, flat: &D::Buf) {
    let mut offset = 0;
    for i in params {
        let n = set.info[i].numel();
        dev.copy(&mut set.grads[i], 0, flat, offset, n);
        offset += n;
    }
}

/// Sums the gradients of `indices` over `group` on the device, through one flat buffer (made on
/// first use and kept: the same gradients every step). The copies back run after the sum on
/// the device; the host waits for nothing.
fn all_reduce_on_device<D: Device>(
    dev: &D,
    c: &dyn crate::device::DeviceComm<D::Buf>,
    set: &mut ParamSet<D>,
    indices: &[usize],
    flat: &mut Option<D::Buf>,
) {
    let total: usize = indices.iter().map(|&i| set.info[i].numel()).sum();
    let flat = flat.get_or_insert_with(|| dev.alloc(total));
    let mut offset = 0;
    for &i in indices {
        let n = set.info[i].numel();
        dev.copy(flat, offset, &set.grads[i], 0, n);
        offset += n;
    }
    c.all_reduce(flat);
    let mut offset = 0;
    for &i in indices {
        let n = set.info[i].numel();
        dev.copy(&mut set.grads[i], 0, flat, offset, n);
        offset += n;
    }
}

/// Copies the gradients of `params` into one flat host vector.
pub(crate) fn flatten<D: Device>(dev: &D, set: &ParamSet<D>, params: Range<usize>) -> Vec<f32> {
    let total: usize = params.clone().map(|i| set.info[i].numel()).sum();
    let mut flat = Vec::with_capacity(total);
    for i in params {
        match dev.host_f32_ref(&set.grads[i]) {
            Some(g) => flat.extend_from_slice(g),
            None => {
                let start = flat.len();
                flat.resize(start + set.info[i].numel(), 0.0);
                dev.download(&set.grads[i], &mut flat[start..]);
            }
        }
    }
    flat
}

/// Writes a flat vector made by `flatten` back into the gradients.
pub(crate) fn unflatten<D: Device>(dev: &D, set: &mut ParamSet<D>, params: Range<usize>, flat: &[f32]) {
    let mut offset = 0;
    for i in params {
        let n = set.info[i].numel();
        dev.upload(&mut set.grads[i], &flat[offset..offset + n]);
        offset += n;
    }
}

impl<B> GradBuckets<B> {
    /// Buckets of at least `bucket_elements` elements (the last one may be smaller), each a
    /// contiguous range of parameters, built from the last parameter backwards.
    pub fn new(info: &[ParamInfo], bucket_elements: usize) -> GradBuckets<B> {
        GradBuckets::made(info, bucket_elements, false)
    }

    /// As `new`, but a parameter of at least `bucket_elements` closes the bucket before it and
    /// has one of its own (ZeRO-2 then sends its buffer as it is, with no packed copy).
    pub fn with_large_apart(info: &[ParamInfo], bucket_elements: usize) -> GradBuckets<B> {
        GradBuckets::made(info, bucket_elements, true)
    }

    fn made(info: &[ParamInfo], bucket_elements: usize, apart: bool) -> GradBuckets<B> {
        let mut ranges = Vec::new();
        let mut end = info.len();
        let mut size = 0;
        for i in (0..info.len()).rev() {
            if apart && info[i].numel() >= bucket_elements && end > i + 1 {
                ranges.push(i + 1..end);
                (end, size) = (i + 1, 0);
            }
            size += info[i].numel();
            if size >= bucket_elements || i == 0 {
                ranges.push(i..end);
                (end, size) = (i, 0);
            }
        }
        let buckets = ranges.into_iter().map(|params| Bucket { params, pending: None, flat: None, started: false });
        GradBuckets { buckets: buckets.collect(), final_params: vec![false; info.len()], bf16: false }
    }

    /// The same buckets summed in bf16 (`--grad-reduce-in-bf16`) or not.
    pub fn with_bf16(self, bf16: bool) -> GradBuckets<B> {
        GradBuckets { bf16, ..self }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Each bucket's parameters, last bucket first.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        self.buckets.iter().map(|b| b.params.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Records that the gradients of `params` are final for this iteration, and starts the
    /// all-reduce of every bucket that is now complete.
    pub fn mark_final<D: Device<Buf = B>>(
        &mut self,
        dev: &D,
        comm: &dyn Comm,
        set: &ParamSet<D>,
        params: Range<usize>,
    ) {
        for i in params {
            self.final_params[i] = true;
        }
        let on_device = dev.device_comm(comm);
        for bucket in &mut self.buckets {
            if let Some(c) = on_device {
                if !bucket.started && bucket.params.clone().all(|i| self.final_params[i]) {
                    pack(dev, set, bucket.params.clone(), &mut bucket.flat, self.bf16);
                    c.all_reduce_start(bucket.flat.as_mut().expect("packed"));
                    bucket.started = true;
                }
            } else if bucket.pending.is_none() && bucket.params.clone().all(|i| self.final_params[i]) {
                bucket.pending = Some(sum_start(comm, flatten(dev, set, bucket.params.clone()), self.bf16));
            } else if let Some(p) = bucket.pending.as_mut() {
                p.poll();
            }
        }
    }

    /// Finishes every bucket's all-reduce (starting any that never became final, which a model
    /// that reports every parameter does not leave) and writes the sums back.
    pub fn finish<D: Device<Buf = B>>(&mut self, dev: &D, comm: &dyn Comm, set: &mut ParamSet<D>) {
        if let Some(c) = dev.device_comm(comm) {
            for bucket in &mut self.buckets {
                if !bucket.started {
                    pack(dev, set, bucket.params.clone(), &mut bucket.flat, self.bf16);
                    c.all_reduce_start(bucket.flat.as_mut().expect("packed"));
                }
                bucket.started = false;
            }
            c.wait();
            for bucket in &self.buckets {
                unpack(dev, set, bucket.params.clone(), bucket.flat.as_ref().expect("packed"));
            }
            self.final_params.fill(false);
            return;
        }
        for bucket in &mut self.buckets {
            let pending = match bucket.pending.take() {
                Some(p) => p,
                None => sum_start(comm, flatten(dev, set, bucket.params.clone()), self.bf16),
            };
            let flat = pending.wait();
            unflatten(dev, set, bucket.params.clone(), &flat);
        }
        self.final_params.fill(false);
    }
}

/// Starts the sum all-reduce of a bucket's flattened gradients, in bf16 with `bf16`.
fn sum_start(comm: &dyn Comm, flat: Vec<f32>, bf16: bool) -> Box<dyn Pending> {
    match bf16 {
        true => comm.sum_start_bf16(flat, false),
        false => comm.all_reduce_start(flat),
    }
}

/// Sums, over the tensor-parallel group, the gradients that sequence parallelism computed from
/// one sequence shard each (LayerNorm parameters, the position embedding), in one all-reduce
/// (on the device through `flat`, kept by the caller from one step to the next).
pub fn reduce_sequence_parallel_grads<D: Device>(
    dev: &D,
    tp: &dyn Comm,
    set: &mut ParamSet<D>,
    flat: &mut Option<D::Buf>,
) {
    if tp.size() == 1 {
        return;
    }
    let indices: Vec<usize> = (0..set.info.len()).filter(|&i| set.info[i].sequence_parallel).collect();
    if indices.is_empty() {
        return;
    }
    if let Some(c) = dev.device_comm(tp) {
        all_reduce_on_device(dev, c, set, &indices, flat);
        return;
    }
    let mut flat = Vec::new();
    for &i in &indices {
        flat.extend(flatten(dev, set, i..i + 1));
    }
    tp.all_reduce(&mut flat, ReduceOp::Sum);
    let mut offset = 0;
    for &i in &indices {
        let n = set.info[i].numel();
        unflatten(dev, set, i..i + 1, &flat[offset..offset + n]);
        offset += n;
    }
}

/// Sums the gradient of the tied word embedding over the embedding group (the first stage's
/// embedding and the last stage's output-layer copy), so both copies take the same step (on the
/// device through `flat`, kept by the caller).
pub fn reduce_tied_embedding<D: Device>(dev: &D, group: &dyn Comm, set: &mut ParamSet<D>, flat: &mut Option<D::Buf>) {
    if group.size() == 1 {
        return;
    }
    let name = "embedding.word_embeddings.weight";
    if let Some(i) = set.info.iter().position(|p| p.name == name) {
        if let Some(c) = dev.device_comm(group) {
            all_reduce_on_device(dev, c, set, &[i], flat);
            return;
        }
        let mut flat = flatten(dev, set, i..i + 1);
        group.all_reduce(&mut flat, ReduceOp::Sum);
        unflatten(dev, set, i..i + 1, &flat);
    }
}

/// The global sum of squares of the gradients of all `sets` (this rank's model chunks), each
/// parameter counted once (Megatron's rule): a tensor-parallel shard on every rank, a replicated
/// parameter on tensor-parallel rank 0 only, the last stage's tied embedding copy not at all,
/// nothing on the depth copies of 2.5-D (`counts` false); summed over the model-parallel group.
/// Summed on the device into `acc[0]`, every tensor in one reduction, and over the group on the
/// device's communicator for it (`--gpu-collectives nccl|rccl` makes one for the model-parallel
/// group); the host reads nothing unless the group has more than one rank and the device has
/// no communicator for it (`all_reduce_scalars` stages the sum through the host then).
pub fn global_grad_sum_squares<D: Device>(
    dev: &D,
    sets: &[&ParamSet<D>],
    tp_rank: usize,
    counts: bool,
    mp: &dyn Comm,
    acc: &mut D::Scalars,
) {
    let counted: Vec<&D::Buf> = counted_in_norm(sets, tp_rank, counts).map(|(set, i)| &set.grads[i]).collect();
    dev.write_scalars(acc, &[0.0]);
    dev.sum_squares_into(&counted, acc, 0);
    all_reduce_scalars(dev, mp, acc, 1, ReduceOp::Sum);
}

/// `acc[slot] += Σ w²` over this rank's parameter values that count in a global norm, each
/// parameter once over the model-parallel group (the gradient norm's rule): summed over that
/// group, Megatron's `--log-params-norm` squared. Every data-parallel replica holds the same values.
pub fn add_params_sum_squares<D: Device>(
    dev: &D,
    sets: &[&ParamSet<D>],
    (tp_rank, counts): (usize, bool),
    acc: &mut D::Scalars,
    slot: usize,
) {
    let counted: Vec<&D::Buf> = counted_in_norm(sets, tp_rank, counts).map(|(set, i)| &set.values[i]).collect();
    dev.sum_squares_into(&counted, acc, slot);
}

/// The (set, index) of every parameter this rank counts in a global norm (none where the rank's
/// copy of the model is counted elsewhere: `counts` false).
fn counted_in_norm<'a, D: Device>(
    sets: &'a [&'a ParamSet<D>],
    tp_rank: usize,
    counts: bool,
) -> impl Iterator<Item = (&'a ParamSet<D>, usize)> + 'a {
    sets.iter()
        .flat_map(|set| (0..set.info.len()).map(move |i| (*set, i)))
        .filter(move |(set, i)| counts && set.info[*i].counted_in_norm(tp_rank))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Init;

    #[test]
    fn buckets_cover_every_parameter_once_from_the_end() {
        let info: Vec<ParamInfo> = [5, 3, 8, 2, 7]
            .iter()
            .map(|&n| ParamInfo::replicated(format!("p{n}"), vec![n], Init::Constant(0.0)))
            .collect();
        let b = GradBuckets::<()>::new(&info, 9);
        let ranges: Vec<_> = b.buckets.iter().map(|b| b.params.clone()).collect();
        assert_eq!(ranges, vec![3..5, 1..3, 0..1]);
        assert_eq!(GradBuckets::<()>::new(&info, usize::MAX).len(), 1);
        // A parameter of at least 7 elements alone: p7 and p8 each close what came before.
        let apart = GradBuckets::<()>::with_large_apart(&info, 7);
        let ranges: Vec<_> = apart.buckets.iter().map(|b| b.params.clone()).collect();
        assert_eq!(ranges, vec![4..5, 3..4, 2..3, 0..2]);
    }
}
