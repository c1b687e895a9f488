//! Context parallelism's `all_gather` type (Megatron's `--cp-comm-type all_gather`): every rank
//! all-gathers the group's fused QKV rows, and each of its two query chunks attends block by
//! block (`AttentionOps::attention_block_forward`) to its own chunk (the causal diagonal) and to
//! every chunk before it, the blocks merged by their log-sum-exps. Backward gathers again, adds
//! each block's query gradient to this rank's rows and its key/value gradient to the rows of the
//! chunk's owner in a buffer of the whole group's rows, and reduce-scatters that buffer, so each
//! rank receives the sum of every rank's contributions to its rows. The log-sum-exp of a rank's
//! queries is kept chunk-major ([chunk][batch][heads][positions]), the same length as one rank's.

use super::context::{ContextSplit, Gathered};
use crate::comm::Comm;
use crate::device::{AttentionShape, BlockMask, Device, Dropout, QkvRun};

/// A block's (output, log-sum-exp).
type Pair<B> = (B, B);

/// The buffers of the blocks, reused across layers: (output, log-sum-exp) pairs, f32, the merged
/// result of each query chunk and the block being merged in; backward's gradient rows (`summed`:
/// the all_gather type's reduce-scattered sum, the ring's zeros); and the ring's two key/value
/// buffers and its f32 wire buffers (`context_ring.rs`).
pub struct BlockScratch<B> {
    pub(super) acc: [Option<(B, B)>; 2],
    pub(super) part: Option<(B, B)>,
    pub(super) contrib: Option<B>,
    pub(super) summed: Option<B>,
    pub(super) kv: [Option<B>; 2],
    pub(super) wire: [Option<B>; 2],
}

impl<B> Default for BlockScratch<B> {
    fn default() -> Self {
        BlockScratch {
            acc: [None, None],
            part: None,
            contrib: None,
            summed: None,
            kv: [None, None],
            wire: [None, None],
        }
    }
}

impl<B> BlockScratch<B> {
    /// Bytes held (for `--log-memory`).
    pub fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        let pair = |p: &Option<(B, B)>| p.as_ref().map_or(0, |(o, l)| dev.bytes(o) + dev.bytes(l));
        let one = |b: &Option<B>| b.as_ref().map_or(0, |b| dev.bytes(b));
        self.acc.iter().map(pair).sum::<usize>()
            + pair(&self.part)
            + one(&self.contrib)
            + one(&self.summed)
            + self.kv.iter().chain(&self.wire).map(one).sum::<usize>()
    }
}

/// `slot` as an f32 buffer of `len` elements.
pub(super) fn ensure<'b, D: Device>(dev: &D, slot: &'b mut Option<D::Buf>, len: usize) -> &'b mut D::Buf {
    super::context::ensure(dev, slot, len, crate::real::Precision::F32)
}

/// `slot` as an f32 (output, log-sum-exp) pair for a block of `shape`'s `seq` queries.
pub(super) fn ensure_pair<'b, D: Device>(
    dev: &D,
    slot: &'b mut Option<(D::Buf, D::Buf)>,
    shape: AttentionShape,
) -> &'b mut (D::Buf, D::Buf) {
    let (o, l) = (shape.rows() * shape.width(), shape.batch * shape.heads * shape.seq);
    if slot.as_ref().is_none_or(|(a, b)| dev.len(a) != o || dev.len(b) != l) {
        *slot = Some((dev.alloc(o), dev.alloc(l)));
    }
    slot.as_mut().expect("just allocated")
}

/// The blocks the queries of chunk slot `slot` attend to: (rank, its slot) of every chunk at or
/// before theirs, the diagonal (this rank's own chunk) first.
fn key_blocks(split: ContextSplit, slot: usize) -> Vec<(usize, usize)> {
    let x = split.chunk(slot);
    let mut blocks = vec![(split.rank, slot)];
    for src in 0..split.size {
        let owner = ContextSplit { size: split.size, rank: src };
        blocks.extend((0..2).filter(|&j| owner.chunk(j) < x).map(|j| (src, j)));
    }
    blocks
}

/// Positions `slot`'s chunk of rank `src`'s rows in a buffer of the group's rows (or, with
/// `src` 0 and one rank's rows, of this rank's own buffer).
pub(super) fn run(shape: AttentionShape, src: usize, slot: usize) -> QkvRun {
    let l = shape.seq / 2;
    QkvRun { base: src * shape.rows() * shape.qkv_width(), seq: shape.seq, first: slot * l, len: l }
}

/// The mask of the block of this rank's query chunk `slot` against chunk slot `j` of `src`'s
/// rows (`diagonal`: the queries' own chunk), with `dropout` placed at their whole-sequence
/// positions (`shape.seq` this rank's positions: chunks of half of it).
pub(super) fn block_mask(
    split: ContextSplit,
    (slot, (src, j)): (usize, (usize, usize)),
    diagonal: bool,
    shape: AttentionShape,
    dropout: Option<&Dropout>,
) -> BlockMask<'_> {
    let half = shape.seq / 2;
    let key_chunk = ContextSplit { size: split.size, rank: src }.chunk(j);
    BlockMask { diagonal, dropout: dropout.map(|d| (d, split.chunk(slot) * half, key_chunk * half)) }
}

/// `out` ([rows, heads · head_dim]) and `lse` (chunk-major) of this rank's queries (`shape`:
/// its rows, `seq` its local positions) from its fused `qkv` rows and the group's; `dropout` the
/// attention's (its `seq` the whole sequence).
pub fn forward<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    (out, lse): (&mut D::Buf, &mut D::Buf),
    qkv: &D::Buf,
    (shape, dropout): (AttentionShape, Option<&Dropout>),
    (gathered, sc): (&mut Gathered<D::Buf>, &mut BlockScratch<D::Buf>),
) {
    let split = ContextSplit::of(cp);
    let all = gathered.ensure(dev, qkv, split.size * dev.len(qkv));
    super::tensor::all_gather(dev, cp, qkv, all);
    let block = AttentionShape { seq: shape.seq / 2, ..shape };
    ensure_pair(dev, &mut sc.part, block);
    for slot in 0..2 {
        let q = run(shape, 0, slot);
        let acc = ensure_pair(dev, &mut sc.acc[0], block);
        for (i, (src, j)) in key_blocks(split, slot).into_iter().enumerate() {
            let kv = if i == 0 { (qkv, q) } else { (&*all, run(shape, src, j)) };
            let mask = block_mask(split, (slot, (src, j)), i == 0, shape, dropout);
            attend(dev, (acc, &mut sc.part), (qkv, q), kv, shape, mask);
        }
        store(dev, (out, lse), acc, block, slot);
    }
}

/// Adds the block of the queries at `q` against the keys at `kv` to a query chunk's running
/// result `acc`: written into it on the diagonal (always the chunk's first block), else
/// computed into `part` and merged.
pub(super) fn attend<D: Device>(
    dev: &D,
    (acc, part): (&mut Pair<D::Buf>, &mut Option<Pair<D::Buf>>),
    q: (&D::Buf, QkvRun),
    kv: (&D::Buf, QkvRun),
    shape: AttentionShape,
    mask: BlockMask,
) {
    let (acc_out, acc_lse) = acc;
    if mask.diagonal {
        return dev.attention_block_forward((acc_out, acc_lse), q, kv, shape, mask);
    }
    let (part_out, part_lse) = part.as_mut().expect("the caller allocates the block's buffers");
    dev.attention_block_forward((part_out, part_lse), q, kv, shape, mask);
    dev.attention_merge((acc_out, acc_lse), (part_out, part_lse), shape, q.1.len);
}

/// Query chunk `slot`'s result `acc` into this rank's `out` rows and chunk-major `lse` (`block`:
/// the shape of one chunk's queries).
pub(super) fn store<D: Device>(
    dev: &D,
    (out, lse): (&mut D::Buf, &mut D::Buf),
    (acc_out, acc_lse): &(D::Buf, D::Buf),
    block: AttentionShape,
    slot: usize,
) {
    let (ol, ll) = (block.rows() * block.width(), block.batch * block.heads * block.seq);
    dev.copy(out, slot * ol, acc_out, 0, ol);
    dev.copy(lse, slot * ll, acc_lse, 0, ll);
}

/// `dqkv` (overwrite) from `dout`, through the blocks `forward` computed (`out` and `lse` are what
/// it wrote).
#[allow(clippy::too_many_arguments)]
pub fn backward<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    dqkv: &mut D::Buf,
    dout: &D::Buf,
    (qkv, out, lse): (&D::Buf, &D::Buf, &D::Buf),
    (shape, dropout): (AttentionShape, Option<&Dropout>),
    (gathered, sc): (&mut Gathered<D::Buf>, &mut BlockScratch<D::Buf>),
) {
    let split = ContextSplit::of(cp);
    let all = gathered.ensure(dev, qkv, split.size * dev.len(qkv));
    super::tensor::all_gather(dev, cp, qkv, all);
    let local = dev.len(qkv);
    let contrib = ensure(dev, &mut sc.contrib, split.size * local);
    dev.fill(contrib, 0.0);
    let block = AttentionShape { seq: shape.seq / 2, ..shape };
    let (ol, ll) = (block.rows() * block.width(), block.batch * block.heads * block.seq);
    for slot in 0..2 {
        let (q, dq) = (run(shape, 0, slot), run(shape, split.rank, slot));
        for (i, (src, j)) in key_blocks(split, slot).into_iter().enumerate() {
            let kv = run(shape, src, j);
            let saved = ((dout, out), slot * ol);
            dev.attention_block_backward(
                contrib,
                (dq, kv),
                saved,
                (lse, slot * ll),
                (qkv, q),
                (all, kv),
                shape,
                block_mask(split, (slot, (src, j)), i == 0, shape, dropout),
            );
        }
    }
    let summed = ensure(dev, &mut sc.summed, local);
    super::tensor::reduce_scatter(dev, cp, contrib, summed);
    dev.copy(dqkv, 0, summed, 0, local);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_query_chunk_sees_its_diagonal_then_every_earlier_chunk() {
        // C = 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
        let r0 = ContextSplit { size: 2, rank: 0 };
        assert_eq!(key_blocks(r0, 0), [(0, 0)]);
        assert_eq!(key_blocks(r0, 1), [(0, 1), (0, 0), (1, 0), (1, 1)]);
        let r1 = ContextSplit { size: 2, rank: 1 };
        assert_eq!(key_blocks(r1, 0), [(1, 0), (0, 0)]);
        assert_eq!(key_blocks(r1, 1), [(1, 1), (0, 0), (1, 0)]);
        // Every rank has chunk x's x earlier blocks and a diagonal for each of its chunks i and
        // 2C-1-i: 2C + 1 blocks (two of them diagonal) on every rank, C = 4.
        for rank in 0..4 {
            let s = ContextSplit { size: 4, rank };
            let blocks: usize = (0..2).map(|k| key_blocks(s, k).len()).sum();
            assert_eq!(blocks, 2 * 4 + 1, "rank {rank}");
        }
    }
}
