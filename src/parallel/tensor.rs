//! Tensor-parallel communication on device buffers: the all-reduce, all-gather and reduce-scatter
//! that Megatron's column- and row-parallel layers, vocab-parallel embedding and sequence
//! parallelism place around the local math. Where the device has a communicator for the group
//! (`CollectiveOps::device_comm`: NCCL on the CUDA Device) they run on device memory; buffers a device
//! keeps in host memory are handed to the Comm in place; others are staged through the host.

use crate::comm::{Comm, ReduceOp};
use crate::device::Device;
use crate::parallel::summa::{host, Summa};

/// The tensor-parallel group of a model replica, whether activations outside the attention and
/// MLP cores are split along the sequence (`--sequence-parallel`), under 2-D / 2.5-D tensor
/// parallelism the SUMMA row and column groups and the depth group, and the context-parallel
/// group that computes attention across each sequence's positions (None: one rank holds them).
#[derive(Clone, Copy)]
pub struct TensorParallel<'a> {
    pub comm: &'a dyn Comm,
    pub sequence_parallel: bool,
    pub summa: Option<(Summa<'a>, &'a dyn Comm)>,
    pub context: Option<(&'a dyn Comm, crate::parallel::grid::CpCommType)>,
    /// Under `--cp-comm-type a2a+p2p`, the inner (all-to-all) and outer (ring) groups.
    pub context_levels: Option<[&'a dyn Comm; 2]>,
}

impl TensorParallel<'static> {
    /// No tensor parallelism: a group of one rank.
    pub fn single() -> TensorParallel<'static> {
        TensorParallel {
            comm: &crate::comm::SelfComm,
            sequence_parallel: false,
            summa: None,
            context: None,
            context_levels: None,
        }
    }
}

impl TensorParallel<'_> {
    pub fn size(&self) -> usize {
        self.comm.size()
    }
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
}

/// Sums `buf` over the group (the forward of a row-parallel layer, the backward of a
/// column-parallel one).
pub fn all_reduce<D: Device>(dev: &D, comm: &dyn Comm, buf: &mut D::Buf) {
    if comm.size() == 1 {
        return;
    }
    if let Some(c) = dev.device_comm(comm) {
        c.all_reduce(buf);
        return;
    }
    if let Some(host) = dev.host_f32(buf) {
        comm.all_reduce(host, ReduceOp::Sum);
        return;
    }
    let mut host = vec![0f32; dev.len(buf)];
    dev.download(buf, &mut host);
    comm.all_reduce(&mut host, ReduceOp::Sum);
    dev.upload(buf, &host);
}

/// `full` becomes every rank's `local`, in rank order (sequence-parallel: shards of contiguous
/// rows become the whole sequence).
pub fn all_gather<D: Device>(dev: &D, comm: &dyn Comm, local: &D::Buf, full: &mut D::Buf) {
    if let Some(c) = dev.device_comm(comm) {
        c.all_gather(local, full);
        return;
    }
    through_host(dev, local, full, |l, f| comm.all_gather(l, f));
}

/// `local` becomes the sum over ranks of this rank's shard of `full` (sequence-parallel: the
/// reduction of a row-parallel layer, leaving each rank its rows).
pub fn reduce_scatter<D: Device>(dev: &D, comm: &dyn Comm, full: &D::Buf, local: &mut D::Buf) {
    if let Some(c) = dev.device_comm(comm) {
        c.reduce_scatter(full, local);
        return;
    }
    through_host(dev, full, local, |f, l| comm.reduce_scatter(f, l));
}

/// Block `j` of `recv` becomes block `rank` of rank j's `send` (both of the group's size in equal
/// blocks): context parallelism's swap of positions for heads.
pub fn all_to_all<D: Device>(dev: &D, comm: &dyn Comm, send: &D::Buf, recv: &mut D::Buf) {
    if let Some(c) = dev.device_comm(comm) {
        c.all_to_all(send, recv);
        return;
    }
    through_host(dev, send, recv, |s, r| comm.all_to_all(s, r));
}

/// Runs a host collective from `src` into `dst`, which it overwrites whole: on the buffers
/// themselves where the device keeps them in host memory, staged through the host otherwise.
fn through_host<D: Device>(dev: &D, src: &D::Buf, dst: &mut D::Buf, collective: impl FnOnce(&[f32], &mut [f32])) {
    let src_host = host(dev, src);
    if let Some(d) = dev.host_f32(dst) {
        return collective(&src_host, d);
    }
    let mut h = vec![0f32; dev.len(dst)];
    collective(&src_host, &mut h);
    dev.upload(dst, &h);
}
