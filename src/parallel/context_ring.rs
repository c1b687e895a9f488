//! Context parallelism's `p2p` type (Megatron's default `--cp-comm-type`): the group's key/value
//! rows passed around a ring. At step k a rank holds the fused QKV rows of rank `rank - k` (its
//! own at step 0) and its two query chunks attend to that rank's chunks at or before theirs
//! (`AttentionOps::attention_block_forward`; the diagonal only at step 0), merged into each
//! chunk's running output and log-sum-exp; meanwhile the rows move on to `rank + 1`. Backward
//! runs the same ring, the key/value gradient of the rows a rank holds travelling with them and
//! arriving at their owner after the last step. A rank holds two ranks' rows at a time, not the
//! group's. On a device with a communicator for the group (NCCL/RCCL) every pass runs on its
//! stream while a step's blocks run on the compute stream (`DeviceComm::ring_pass_start`): the
//! key/value rows a step's blocks read next, and backward's key/value gradient, which a rank
//! sends on as its own contribution plus the sum that arrived from the rank before; else each
//! pass is an MPI send-receive on host memory (staged through it on a GPU).

use super::context::{ensure_like, ContextSplit};
use super::context_gather::{attend, block_mask, ensure, ensure_pair, run, store, BlockScratch};
use crate::comm::Comm;
use crate::device::{AttentionShape, Device, DeviceComm, Dropout};

/// Starts `recv` becoming the `send` of the previous rank of the ring as `send` goes to the next:
/// on the device's communicator for the group, returned to wait on (the caller leaves both
/// buffers alone until then; compute enqueued meanwhile runs beside the pass), else through the
/// MPI Comm on host memory, done on return (None).
fn pass_start<'d, D: Device>(
    dev: &'d D,
    cp: &dyn Comm,
    send: &D::Buf,
    recv: &mut D::Buf,
) -> Option<&'d dyn DeviceComm<D::Buf>> {
    if let Some(comm) = dev.device_comm(cp) {
        comm.ring_pass_start(send, recv);
        return Some(comm);
    }
    let (rank, c) = (cp.rank(), cp.size());
    let (next, prev) = ((rank + 1) % c, (rank + c - 1) % c);
    let mut out = vec![0f32; dev.len(send)];
    dev.download(send, &mut out);
    let mut back = vec![0f32; dev.len(recv)];
    cp.send_recv(Some((&out, next)), Some((&mut back, prev)));
    dev.upload(recv, &back);
    None
}

/// The chunk slots of rank `src` that the queries of this rank's `slot` attend to, and whether
/// each is the diagonal: at or before theirs, the diagonal first.
fn blocks_of(split: ContextSplit, slot: usize, src: usize) -> Vec<(usize, bool)> {
    let (x, owner) = (split.chunk(slot), ContextSplit { size: split.size, rank: src });
    let order = if src == split.rank { [slot, 1 - slot] } else { [0, 1] };
    order.into_iter().filter(|&j| owner.chunk(j) <= x).map(|j| (j, owner.chunk(j) == x)).collect()
}

/// `out` ([rows, heads · head_dim]) and `lse` (chunk-major, as `context_gather`'s) of this rank's
/// queries from its fused `qkv` rows and, around the ring, the group's; `dropout` the attention's.
pub fn forward<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    (out, lse): (&mut D::Buf, &mut D::Buf),
    qkv: &D::Buf,
    (shape, dropout): (AttentionShape, Option<&Dropout>),
    sc: &mut BlockScratch<D::Buf>,
) {
    let (split, local) = (ContextSplit::of(cp), dev.len(qkv));
    let block = AttentionShape { seq: shape.seq / 2, ..shape };
    let [a, b] = &mut sc.kv;
    let (mut cur, mut next) = (ensure_like(dev, a, qkv, local), ensure_like(dev, b, qkv, local));
    dev.copy(cur, 0, qkv, 0, local);
    ensure_pair(dev, &mut sc.part, block);
    for slot in 0..2 {
        ensure_pair(dev, &mut sc.acc[slot], block);
    }
    for step in 0..split.size {
        let src = (split.rank + split.size - step) % split.size;
        // The next rank's rows travel while this step's blocks run.
        let passing = (step + 1 < split.size).then(|| pass_start(dev, cp, cur, next)).flatten();
        for slot in 0..2 {
            let q = run(shape, 0, slot);
            let acc = sc.acc[slot].as_mut().expect("allocated above");
            for (j, diagonal) in blocks_of(split, slot, src) {
                let kv = if diagonal { (qkv, q) } else { (&*cur, run(shape, 0, j)) };
                let mask = block_mask(split, (slot, (src, j)), diagonal, shape, dropout);
                attend(dev, (acc, &mut sc.part), (qkv, q), kv, shape, mask);
            }
        }
        if let Some(comm) = passing {
            comm.wait();
        }
        std::mem::swap(&mut cur, &mut next);
    }
    for slot in 0..2 {
        store(dev, (out, lse), sc.acc[slot].as_ref().expect("allocated above"), block, slot);
    }
}

/// `dqkv` (overwrite) from `dout`, around the ring again (`out` and `lse` are what `forward` wrote).
#[allow(clippy::too_many_arguments)]
pub fn backward<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    dqkv: &mut D::Buf,
    dout: &D::Buf,
    (qkv, out, lse): (&D::Buf, &D::Buf, &D::Buf),
    (shape, dropout): (AttentionShape, Option<&Dropout>),
    sc: &mut BlockScratch<D::Buf>,
) {
    let (split, local) = (ContextSplit::of(cp), dev.len(qkv));
    let block = AttentionShape { seq: shape.seq / 2, ..shape };
    let (ol, ll) = (block.rows() * block.width(), block.batch * block.heads * block.seq);
    let [a, b] = &mut sc.kv;
    let (mut cur, mut next) = (ensure_like(dev, a, qkv, local), ensure_like(dev, b, qkv, local));
    dev.copy(cur, 0, qkv, 0, local);
    // This rank's query gradient, then this step's key/value gradient of the rows it holds (the
    // sum over the ranks that held them before travels with them, `recv`; zeros from `zeros`).
    let grad = ensure(dev, &mut sc.contrib, 2 * local);
    dev.fill(grad, 0.0);
    let zeros = ensure(dev, &mut sc.summed, local);
    dev.fill(zeros, 0.0);
    let [send, recv] = &mut sc.wire;
    let (send, recv) = (ensure(dev, send, local), ensure(dev, recv, local));
    let mut arriving: Option<&dyn DeviceComm<D::Buf>> = None;
    for step in 0..split.size {
        let src = (split.rank + split.size - step) % split.size;
        let passing = (step + 1 < split.size).then(|| pass_start(dev, cp, cur, next)).flatten();
        for slot in 0..2 {
            let q = run(shape, 0, slot);
            for (j, diagonal) in blocks_of(split, slot, src) {
                let kv = run(shape, 0, j);
                let dkv = crate::device::QkvRun { base: local, ..kv };
                let saved = ((dout, out), slot * ol);
                dev.attention_block_backward(
                    grad,
                    (q, dkv),
                    saved,
                    (lse, slot * ll),
                    (qkv, q),
                    (cur, kv),
                    shape,
                    block_mask(split, (slot, (src, j)), diagonal, shape, dropout),
                );
            }
        }
        if let Some(comm) = passing {
            comm.wait();
        }
        if step + 1 < split.size {
            std::mem::swap(&mut cur, &mut next);
        }
        // The gradient of the rows held, the earlier holders' (arrived meanwhile) and this
        // step's, goes on with them while the next step's blocks run (after the last step, to
        // their owner).
        if let Some(comm) = arriving.take() {
            comm.wait();
        }
        dev.copy(send, 0, grad, local, local);
        if step > 0 {
            dev.add_assign(send, recv);
        }
        dev.copy(grad, local, zeros, 0, local);
        arriving = pass_start(dev, cp, send, recv);
    }
    if let Some(comm) = arriving {
        comm.wait();
    }
    dev.copy(dqkv, 0, grad, 0, local);
    dev.add_assign(dqkv, recv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_takes_the_held_ranks_chunks_at_or_before_the_queries() {
        // C = 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
        let r0 = ContextSplit { size: 2, rank: 0 };
        assert_eq!(blocks_of(r0, 0, 0), [(0, true)]);
        assert_eq!(blocks_of(r0, 1, 0), [(1, true), (0, false)]);
        assert_eq!(blocks_of(r0, 0, 1), []);
        assert_eq!(blocks_of(r0, 1, 1), [(0, false), (1, false)]);
        let r1 = ContextSplit { size: 2, rank: 1 };
        assert_eq!(blocks_of(r1, 1, 1), [(1, true), (0, false)]);
        assert_eq!(blocks_of(r1, 0, 0), [(0, false)]);
        // Over the ring every rank has 2C + 1 blocks, two of them diagonal (C = 4).
        for rank in 0..4 {
            let s = ContextSplit { size: 4, rank };
            let all: Vec<_> = (0..4).flat_map(|src| (0..2).flat_map(move |k| blocks_of(s, k, src))).collect();
            assert_eq!((all.len(), all.iter().filter(|b| b.1).count()), (9, 2), "rank {rank}");
        }
    }
}
