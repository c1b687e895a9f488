//! Pipeline point-to-point on device memory through NCCL or RCCL: the links of `PipelineNccl`.

use super::buffer::{GpuBuf, GpuP2p};
use super::collectives::{timeout, NcclComm, StreamApi, Transfer};
use super::nccl::Nccl;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Pipeline point-to-point of the CUDA Device on device memory: one two-rank communicator per
/// link this rank takes part in, where a link carries one kind of message (activations or
/// gradients) from one stage to its neighbour. A rank sends activations to the next stage and
/// gradients to the previous one, and receives them from the other side (under zb-v's V, the
/// second arm's the other way round as well): up to four links (eight under a V), each
/// with its own stream, on which this rank only sends or only receives. So a send never waits
/// behind a receive (or the reverse) on one stream, and the host blocks on neither: messages of
/// one kind between two stages are delivered in the order they were issued
/// (`pipeline::fifo_order` holds for every schedule), as MPI's tags delivered them, and the host
/// waits only where the MPI path would have blocked in a receive. Receives count as enqueued
/// work the Device settles before reading device memory; sends are waited for in `wait_sends`
/// (end of a pass over the pipeline), bounded by `TRIDENT_NCCL_TIMEOUT_SECS`.
pub struct PipelineNccl {
    /// By kind (activations, gradients), direction (onward to higher stages, upward to lower)
    /// and role (out, in): `link_slot`. None where this stage has no such neighbour (the ends of
    /// a pipeline without virtual stages) or the layout no such flow.
    links: [Option<std::sync::Mutex<NcclComm<'static>>>; 8],
    api: &'static str,
    stage: usize,
    stages: usize,
    enqueued: [std::sync::atomic::AtomicBool; 8],
    sent: std::sync::atomic::AtomicU64,
}

// SAFETY: as DeviceNccl: each communicator is used by one thread at a time through its mutex.
unsafe impl Send for PipelineNccl {}
// SAFETY: as above.
unsafe impl Sync for PipelineNccl {}

/// The slot of `links` for a message kind, its direction and this rank's role.
fn link_slot(backward: bool, upward: bool, send: bool) -> usize {
    4 * usize::from(backward) + 2 * usize::from(upward) + usize::from(!send)
}

impl PipelineNccl {
    /// Creates the links of this rank's stage in the pipeline `group` (collective over the
    /// group): activations flow stage s -> s + 1, gradients s + 1 -> s, and with `wrap` (virtual
    /// stages) also between the last stage and the first; under a V (`v`, no wrap) both kinds
    /// flow both ways. Every rank creates its links in one global order (kind, direction, then
    /// sending stage), so the pairwise initialisations cannot deadlock.
    pub fn new(
        nccl: &'static Nccl,
        api: StreamApi<'static>,
        group: &dyn Comm,
        (wrap, v): (bool, bool),
    ) -> Result<PipelineNccl> {
        let (stage, stages) = (group.rank(), group.size());
        let timeout = timeout()?;
        let mut links: [Option<std::sync::Mutex<NcclComm<'static>>>; 8] = Default::default();
        for (backward, upward) in [(false, false), (false, true), (true, false), (true, true)] {
            if upward != backward && !v {
                continue;
            }
            for from in 0..stages {
                let to = if upward { (from + stages - 1) % stages } else { (from + 1) % stages };
                let wraps = if upward { from == 0 } else { from == stages - 1 };
                if stages < 2 || (wraps && (!wrap || v)) || (stage != from && stage != to) {
                    continue;
                }
                let what = if backward { "gradients" } else { "activations" };
                let comm = NcclComm::link(nccl, api, group, (from, to), timeout).map_err(|e| {
                    Error::Comm(format!("creating the pipeline link for {what} from stage {from} to stage {to}: {e}"))
                })?;
                links[link_slot(backward, upward, stage == from)] = Some(std::sync::Mutex::new(comm));
            }
        }
        Ok(PipelineNccl {
            links,
            api: nccl.flavor.api(),
            stage,
            stages,
            enqueued: Default::default(),
            sent: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Runs `f` on the link of `slot`; a failure (or a link this stage does not have) abandons the
    /// op (`error::fail`), after the communicator was aborted, and the command ends with it.
    fn run(&self, slot: usize, f: impl FnOnce(&NcclComm<'static>) -> Result<()>) {
        let result = match &self.links[slot] {
            Some(link) => f(&link.lock().unwrap_or_else(|p| p.into_inner())),
            None => Err(Error::Comm(format!(
                "pipeline stage {} of {} has no link to {} {} (a schedule bug)",
                self.stage,
                self.stages,
                if slot.is_multiple_of(2) { "send" } else { "receive" },
                if slot < 4 { "activations" } else { "gradients" }
            ))),
        };
        if let Err(e) = result {
            crate::error::fail(e.within("pipeline p2p, --gpu-collectives"));
        }
        self.enqueued[slot].store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits (polled, bounded) for the enqueued work of the links in `slots`.
    fn settle_slots(&self, slots: &[usize]) {
        for &slot in slots {
            if self.enqueued[slot].swap(false, std::sync::atomic::Ordering::Relaxed) {
                self.run(slot, |c| c.synchronize());
                self.enqueued[slot].store(false, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

impl GpuP2p for PipelineNccl {
    fn settle_receives(&self) {
        self.settle_slots(&[false, true].map(|b| [false, true].map(|u| link_slot(b, u, false))).concat());
    }
}

impl crate::device::DeviceP2p<GpuBuf> for PipelineNccl {
    fn api(&self) -> &'static str {
        self.api
    }
    fn send(&self, buf: &GpuBuf, backward: bool, upward: bool) {
        let (buffer, count, dtype) = (buf.ptr(), buf.len(), buf.dtype());
        self.sent.fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
        self.run(link_slot(backward, upward, true), |c| {
            // The send reads what the compute stream wrote.
            c.after_compute(None)?;
            c.send_recv(&[Transfer::Send { buffer, count, dtype, peer: 1 }])
        });
    }
    fn recv(&self, buf: &mut GpuBuf, backward: bool, upward: bool) {
        let (buffer, count, dtype) = (buf.ptr(), buf.len(), buf.dtype());
        self.run(link_slot(backward, upward, false), |c| {
            // The buffer may be one compute just finished reading; compute then reads the message.
            c.after_compute(None)?;
            c.send_recv(&[Transfer::Recv { buffer, count, dtype, peer: 0 }])?;
            c.before_compute(None)
        });
    }
    fn wait_sends(&self) {
        self.settle_slots(&[false, true].map(|b| [false, true].map(|u| link_slot(b, u, true))).concat());
    }
    fn counters(&self) -> crate::comm::CommCounters {
        crate::comm::CommCounters { send: self.sent.load(std::sync::atomic::Ordering::Relaxed), ..Default::default() }
    }
}
