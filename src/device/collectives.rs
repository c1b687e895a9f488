//! A device's own collectives: the communicators a backend makes for the run's process groups
//! (NCCL / RCCL on a GPU), the collective family of the Device (`CollectiveOps`), and the helpers
//! that fall back to the MPI Comm on host memory where a device has none.

use super::{Device, Memory};

/// Collectives of one process group run directly on a device's buffers (NCCL / RCCL on a GPU),
/// where the backend made a communicator for the group at start-up. Every operation is ordered
/// after the compute work already enqueued, and compute enqueued afterwards sees its result
/// (`all_reduce_start` excepted: its result is visible to compute after `wait`). The host blocks
/// only where it reads values back, and that wait is bounded (a dead peer is an error, not a hang).
pub trait DeviceComm<B> {
    /// The library: "NCCL" or "RCCL".
    fn api(&self) -> &'static str;
    /// `buf` becomes the element-wise sum over the group.
    fn all_reduce(&self, buf: &mut B);
    /// The first `len` values of `scalars` (f64, a device's `Scalars`) become their element-wise
    /// `op` over the group, on device memory: the cross-entropy's row statistics.
    fn all_reduce_f64(&self, scalars: &mut B, len: usize, op: crate::comm::ReduceOp);
    /// Starts summing `buf` over the group; the caller leaves `buf` alone until `wait`.
    fn all_reduce_start(&self, buf: &mut B);
    /// Compute enqueued from now on runs after every operation started on this group.
    fn wait(&self);
    /// The host waits (bounded: a dead peer is an error) until every operation on this group has
    /// finished: before temporary buffers an operation used are freed.
    fn synchronize(&self);
    /// `full` becomes every rank's `local`, in rank order.
    fn all_gather(&self, local: &B, full: &mut B);
    /// `local` becomes the sum over ranks of this rank's block of `full`.
    fn reduce_scatter(&self, full: &B, local: &mut B);
    /// Starts `reduce_scatter`; the caller leaves both buffers alone until `wait`.
    fn reduce_scatter_start(&self, full: &B, local: &mut B);
    /// Block `j` of `recv` becomes block `rank` of rank j's `send` (both of `size` equal blocks).
    fn all_to_all(&self, send: &B, recv: &mut B);
    /// Starts a pass around the group's ring (context parallelism's `p2p`): `send` goes to the
    /// next rank (wrapping) as `recv` becomes the previous rank's `send`; compute enqueued before
    /// `wait` runs beside it, and the caller leaves both buffers alone until then.
    fn ring_pass_start(&self, send: &B, recv: &mut B);
    /// Elements counted so far, as the MPI Comm counts them (for `--log-comm`).
    fn counters(&self) -> crate::comm::CommCounters;
}

/// Pipeline point-to-point on a device's buffers (NCCL / RCCL on a GPU): this rank sends
/// activations to the next pipeline stage and gradients to the previous one, and receives them
/// from the other side. Messages of one kind between two stages arrive in the order they were
/// sent (`pipeline::fifo_order` holds for every schedule). A send reads its buffer after the
/// compute already enqueued; a receive writes its buffer after the compute already enqueued, and
/// compute enqueued after it sees what it received. Neither blocks the host: a send's buffer must
/// be left alone until `wait_sends`, or until this rank has received a message its peer sent
/// after taking that send's (the stream order above then puts any later write after the send's
/// read: `pipeline::send_releases`).
pub trait DeviceP2p<B> {
    /// The library: "NCCL" or "RCCL".
    fn api(&self) -> &'static str;
    /// Sends `buf` (activations, or `backward` gradients) to the next stage or, `upward`, to
    /// the previous one (gradients do; so do the activations of a V's second arm).
    fn send(&self, buf: &B, backward: bool, upward: bool);
    /// Receives the next message of its kind that travelled `upward` (from the next stage) or
    /// not (from the previous) into `buf` (exactly its length).
    fn recv(&self, buf: &mut B, backward: bool, upward: bool);
    /// The host waits (bounded: a dead peer is an error) until every send has been delivered.
    fn wait_sends(&self);
    /// Elements sent so far (for `--log-comm`).
    fn counters(&self) -> crate::comm::CommCounters;
}

/// What `group` has moved, through the MPI Comm and through the device's communicator for it.
pub fn comm_counters<D: Device>(dev: &D, group: &dyn crate::comm::Comm) -> crate::comm::CommCounters {
    let mut c = group.counters();
    if let Some(d) = dev.device_comm(group) {
        c.add(&d.counters());
    }
    c
}

/// `s[..len]` becomes its element-wise `op` over `group`: in place where the device keeps scalars
/// in host memory; on device memory through the device's communicator for the group, where it
/// has one (`--gpu-collectives nccl|rccl`); else staged through the host (one read, the MPI
/// all-reduce, one write). A group of one rank leaves device scalars alone.
pub fn all_reduce_scalars<D: Device>(
    dev: &D,
    group: &dyn crate::comm::Comm,
    s: &mut D::Scalars,
    len: usize,
    op: crate::comm::ReduceOp,
) {
    if let Some(host) = dev.host_scalars(s) {
        return group.all_reduce(&mut host[..len], op);
    }
    if group.size() > 1 && !dev.device_all_reduce_scalars(group, s, len, op) {
        let mut host = vec![0f64; len];
        dev.read_scalars(s, &mut host);
        group.all_reduce(&mut host, op);
        dev.write_scalars(s, &host);
    }
}

/// The library `--gpu-collectives` asks a device's collectives to use: NCCL, RCCL, or MPI (the
/// device's buffers staged through host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectiveLibrary {
    Nccl,
    Rccl,
    Mpi,
}

impl CollectiveLibrary {
    /// The flag's value: "nccl", "rccl" or "mpi".
    pub fn name(self) -> &'static str {
        match self {
            CollectiveLibrary::Nccl => "nccl",
            CollectiveLibrary::Rccl => "rccl",
            CollectiveLibrary::Mpi => "mpi",
        }
    }
}

/// What `CollectiveOps::attach_collectives` makes communicators for: the run's process groups, as the
/// `Comm`s that `device_comm` later finds them by, and the library asked for.
pub struct CollectivesRequest<'a> {
    pub library: CollectiveLibrary,
    /// Every rank of the job: the ranks agree here that each could load the library.
    pub world: &'a dyn crate::comm::Comm,
    /// The groups that move tensors, named for messages, in the order every rank creates their
    /// communicators: tensor parallel, the tied-embedding pair, data parallel x context parallel
    /// x depth, the group the gradient norm's sum of squares is summed over (model parallel, or
    /// the world under ZeRO-1), context parallel, and a2a+p2p's inner (all-to-all) groups.
    pub groups: [(&'static str, &'a dyn crate::comm::Comm); 6],
    /// The pipeline group; the caller checked that its schedule keeps each link's messages in
    /// the order they were sent (`pipeline::fifo_order`), as `DeviceP2p` delivers them.
    pub pipeline: &'a dyn crate::comm::Comm,
    /// Whether the pipeline's links wrap from the last stage to the first (virtual stages), and
    /// whether its chunks sit in a V (zb-v: both kinds of message flow both ways, no wrap).
    pub pipeline_links: (bool, bool),
}

/// Collectives on the device's own buffers (`--gpu-collectives`). The defaults make none: tensors
/// move through the MPI Comm on host memory.
pub trait CollectiveOps: Memory {
    /// The collectives of `group` on this device's buffers, when the backend made a communicator
    /// for it at start-up (`--gpu-collectives nccl`); None: the caller stages through the host
    /// and the MPI Comm.
    fn device_comm(&self, _group: &dyn crate::comm::Comm) -> Option<&dyn DeviceComm<Self::Buf>> {
        None
    }

    /// `s[..len]` becomes its element-wise `op` over `group` on the device, through the
    /// communicator the backend made for the group (`device_comm`); false, doing nothing, where
    /// it has none (the caller stages through the host).
    fn device_all_reduce_scalars(
        &self,
        _group: &dyn crate::comm::Comm,
        _s: &mut Self::Scalars,
        _len: usize,
        _op: crate::comm::ReduceOp,
    ) -> bool {
        false
    }

    /// Pipeline point-to-point on device buffers, where the backend made communicators for this
    /// rank's pipeline neighbours at start-up; None: messages are staged through host memory.
    fn device_p2p(&self) -> Option<&dyn DeviceP2p<Self::Buf>> {
        None
    }

    /// Makes device collectives for the run's process groups (`device_comm` and `device_p2p`
    /// answer for them from then on), collectively over `request.world` and in the same order on
    /// every rank; returns the start-up line saying which path collectives take. A device without
    /// its own (the default) moves tensors through the MPI Comm on host memory.
    fn attach_collectives(&mut self, _request: &CollectivesRequest) -> crate::error::Result<String> {
        Ok("collectives: MPI on host memory".into())
    }
}
