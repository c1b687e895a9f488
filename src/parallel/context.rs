//! Context parallelism (`--context-parallel-size C`): each sequence split over C ranks in 2C
//! chunks of equal length, rank i holding chunks i and 2C-1-i (Megatron's load balancing: under
//! the causal mask every rank then has the same number of query-key pairs), and the attention of
//! a rank's positions computed across its group.
//!
//! `--cp-comm-type a2a` is here, DeepSpeed Ulysses' swap. Before attention each rank trades its
//! positions of every head for every position of 1/C of the heads (`to_heads`), runs the Device's
//! ordinary causal attention over the whole sequence on those heads, and trades back
//! (`to_positions`). The fused QKV row is group-major (each key/value group's query heads, then
//! its key and value head), so a rank's heads are one contiguous block of columns. Each trade is
//! one all-to-all of the local rows' size (a rank keeps 1/C and sends the rest), packed and
//! unpacked by strided copies on the Device. `all_gather` is
//! `context_gather.rs`, the `p2p` ring `context_ring.rs`. `a2a+p2p` is this swap inside groups of
//! adjacent ranks and the ring across them (`model::gpt::context`): rank r of C holds chunks r
//! and 2C-1-r, so after the swap inside group g of A ranks each holds 1/A of the heads for two
//! runs of A chunks, g's and 2B-1-g's of 2B runs: the ring's split of B ranks, on runs.

pub use super::grid::CpCommType;
use crate::comm::Comm;
use crate::device::Device;
use crate::real::Precision;

/// Where a rank's positions sit in its sequences: rank `rank` of `size` holds chunks `rank` and
/// `2 size - 1 - rank` of `2 size`, in that order (its local positions `0..L` and `L..2L`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextSplit {
    pub size: usize,
    pub rank: usize,
}

impl ContextSplit {
    pub fn single() -> ContextSplit {
        ContextSplit { size: 1, rank: 0 }
    }

    /// The chunk (of `2 size`) in local slot `slot` (0 or 1).
    pub fn chunk(&self, slot: usize) -> usize {
        match slot {
            0 => self.rank,
            _ => 2 * self.size - 1 - self.rank,
        }
    }

    /// Positions a rank holds of a sequence of `seq`.
    pub fn local_seq(&self, seq: usize) -> usize {
        seq / self.size
    }

    /// The position in the whole sequence of local position `t` of a rank holding `local_seq`.
    pub fn position(&self, local_seq: usize, t: usize) -> usize {
        if self.size == 1 {
            return t;
        }
        let l = local_seq / 2;
        self.chunk(t / l) * l + t % l
    }

    /// This rank's positions of each sample of `full` (samples of `seq`, sample-major) into
    /// `local` (samples of `seq / size`).
    pub fn take_local<T: Copy>(&self, full: &[T], seq: usize, local: &mut [T]) {
        let ls = self.local_seq(seq);
        for (sample, out) in full.chunks(seq).zip(local.chunks_mut(ls)) {
            for (t, o) in out.iter_mut().enumerate() {
                *o = sample[self.position(ls, t)];
            }
        }
    }
}

impl ContextSplit {
    /// The split of the context-parallel group `comm`.
    pub fn of(comm: &dyn Comm) -> ContextSplit {
        ContextSplit { size: comm.size(), rank: comm.rank() }
    }
}

/// One swap's shape: `batch` samples of which this rank holds `local_seq` positions, rows
/// `width` wide in the positions layout (every head) and `width / C` in the heads layout.
#[derive(Clone, Copy, Debug)]
pub struct SwapShape {
    pub batch: usize,
    pub local_seq: usize,
    pub width: usize,
}

/// The buffer a swap gathers into, reused across calls (reallocated when a length changes).
#[derive(Default)]
pub struct Gathered<B> {
    buf: Option<B>,
}

impl<B> Gathered<B> {
    pub(super) fn ensure<D: Device<Buf = B>>(&mut self, dev: &D, like: &B, len: usize) -> &mut B {
        ensure_like(dev, &mut self.buf, like, len)
    }

    /// Bytes held (for `--log-memory`).
    pub fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.buf.as_ref().map_or(0, |b| dev.bytes(b))
    }
}

/// The send and receive buffers of the swaps' all-to-alls, one pair per length and storage (a
/// layer swaps QKV rows, output rows and output-gradient rows, the last in f32 storage where the
/// others are 16-bit), reused across layers and micro-batches.
pub struct Exchange<B> {
    pairs: Vec<(B, B)>,
}

impl<B> Default for Exchange<B> {
    fn default() -> Self {
        Exchange { pairs: Vec::new() }
    }
}

impl<B> Exchange<B> {
    /// The pair of `len` elements in `like`'s storage.
    fn ensure<D: Device<Buf = B>>(&mut self, dev: &D, like: &B, len: usize) -> (&mut B, &mut B) {
        let bytes = dev.bytes(like) / dev.len(like).max(1) * len;
        let found = self.pairs.iter().position(|(s, _)| dev.len(s) == len && dev.bytes(s) == bytes);
        let at = found.unwrap_or_else(|| {
            self.pairs.push((dev.alloc_like_len(like, len), dev.alloc_like_len(like, len)));
            self.pairs.len() - 1
        });
        let (send, recv) = &mut self.pairs[at];
        (send, recv)
    }

    /// Bytes held (for `--log-memory`).
    pub fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        self.pairs.iter().map(|(s, r)| dev.bytes(s) + dev.bytes(r)).sum()
    }
}

/// `heads` ([batch · seq rows, width / C], rows `t · batch + b` over the whole sequence) becomes
/// this rank's block of columns of every position, from `local` ([batch · local_seq rows, width])
/// of every rank of the group: each rank sends rank j the columns of j's block (one all-to-all),
/// and places what it received at the sender's two chunks.
pub fn to_heads<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    local: &D::Buf,
    heads: &mut D::Buf,
    shape: SwapShape,
    exchange: &mut Exchange<D::Buf>,
) {
    let (c, rows) = (cp.size(), shape.batch * shape.local_seq);
    let (w, wc, half) = (shape.width, shape.width / c, rows / 2);
    assert_eq!(dev.len(local), rows * w, "to_heads: the local rows");
    assert_eq!(dev.len(heads), rows * w, "to_heads: the heads rows");
    let (send, recv) = exchange.ensure(dev, local, rows * w);
    for dst in 0..c {
        dev.copy_rows(send, (dst * rows * wc, wc), local, (dst * wc, w), (rows, wc));
    }
    super::tensor::all_to_all(dev, cp, send, recv);
    for src in 0..c {
        let from = ContextSplit { size: c, rank: src };
        for slot in 0..2 {
            let at = (src * rows + slot * half) * wc;
            dev.copy_rows(heads, (from.chunk(slot) * half * wc, wc), recv, (at, wc), (half, wc));
        }
    }
}

/// The inverse of `to_heads`: `local` ([batch · local_seq rows, width]) becomes this rank's
/// positions of every head, from `heads` ([batch · seq rows, width / C]) of every rank: each rank
/// sends rank j the rows of j's two chunks (one all-to-all), and places what it received at the
/// sender's block of columns.
pub fn to_positions<D: Device>(
    dev: &D,
    cp: &dyn Comm,
    heads: &D::Buf,
    local: &mut D::Buf,
    shape: SwapShape,
    exchange: &mut Exchange<D::Buf>,
) {
    let (c, rows) = (cp.size(), shape.batch * shape.local_seq);
    let (w, wc, half) = (shape.width, shape.width / c, rows / 2);
    assert_eq!(dev.len(heads), rows * w, "to_positions: the heads rows");
    let (send, recv) = exchange.ensure(dev, heads, rows * w);
    for dst in 0..c {
        let to = ContextSplit { size: c, rank: dst };
        for slot in 0..2 {
            let at = (dst * rows + slot * half) * wc;
            dev.copy_rows(send, (at, wc), heads, (to.chunk(slot) * half * wc, wc), (half, wc));
        }
    }
    super::tensor::all_to_all(dev, cp, send, recv);
    for src in 0..c {
        dev.copy_rows(local, (src * wc, w), recv, (src * rows * wc, wc), (rows, wc));
    }
}

/// The buffers of one layer's attention in the heads layout, reused across layers and
/// micro-batches: the swapped QKV, output and output gradient, the QKV gradient, the swaps'
/// all-to-all buffers and the `all_gather` type's gathered rows.
pub struct HeadsScratch<B> {
    pub qkv: Option<B>,
    pub out: Option<B>,
    pub dout: Option<B>,
    pub dqkv: Option<B>,
    pub exchange: Exchange<B>,
    pub gathered: Gathered<B>,
}

impl<B> Default for HeadsScratch<B> {
    fn default() -> Self {
        HeadsScratch {
            qkv: None,
            out: None,
            dout: None,
            dqkv: None,
            exchange: Exchange::default(),
            gathered: Gathered { buf: None },
        }
    }
}

impl<B> HeadsScratch<B> {
    /// Bytes held (for `--log-memory`).
    pub fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        [&self.qkv, &self.out, &self.dout, &self.dqkv]
            .iter()
            .map(|b| b.as_ref().map_or(0, |b| dev.bytes(b)))
            .sum::<usize>()
            + self.exchange.bytes(dev)
            + self.gathered.bytes(dev)
    }
}

/// `slot` as a buffer of `len` elements, made by `make` where it is missing or of another length
/// (the context-parallel layers' buffers, reused across layers and micro-batches).
fn reuse<'b, D: Device>(
    dev: &D,
    slot: &'b mut Option<D::Buf>,
    len: usize,
    make: impl FnOnce(usize) -> D::Buf,
) -> &'b mut D::Buf {
    if slot.as_ref().is_none_or(|b| dev.len(b) != len) {
        *slot = Some(make(len));
    }
    slot.as_mut().expect("just allocated")
}

/// `slot` as a buffer of `len` elements in `precision` storage (f32 for `Precision::F32`).
pub fn ensure<'b, D: Device>(
    dev: &D,
    slot: &'b mut Option<D::Buf>,
    len: usize,
    precision: Precision,
) -> &'b mut D::Buf {
    reuse(dev, slot, len, |n| dev.alloc_in(n, precision))
}

/// `slot` as a buffer of `len` elements in `like`'s storage.
pub fn ensure_like<'b, D: Device>(dev: &D, slot: &'b mut Option<D::Buf>, like: &D::Buf, len: usize) -> &'b mut D::Buf {
    reuse(dev, slot, len, |n| dev.alloc_like_len(like, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_holds_chunks_i_and_2c_minus_1_minus_i() {
        // C = 2, a sequence of 8: chunks of 2; rank 0 holds 0,1 and 6,7; rank 1 holds 2,3 and 4,5.
        let at = |rank, t| ContextSplit { size: 2, rank }.position(4, t);
        assert_eq!((0..4).map(|t| at(0, t)).collect::<Vec<_>>(), [0, 1, 6, 7]);
        assert_eq!((0..4).map(|t| at(1, t)).collect::<Vec<_>>(), [2, 3, 4, 5]);
        // Every position held once over the group, and the causal pairs balanced.
        for c in [1usize, 2, 4] {
            let seq = 8 * c;
            let mut seen = vec![0; seq];
            let mut pairs = Vec::new();
            for rank in 0..c {
                let s = ContextSplit { size: c, rank };
                let ls = s.local_seq(seq);
                (0..ls).for_each(|t| seen[s.position(ls, t)] += 1);
                pairs.push((0..ls).map(|t| s.position(ls, t) + 1).sum::<usize>());
            }
            assert!(seen.iter().all(|&n| n == 1), "C {c}");
            assert!(pairs.iter().all(|&p| p == pairs[0]), "C {c}: {pairs:?}");
        }
        let mut local = [0u32; 8];
        ContextSplit { size: 2, rank: 1 }.take_local(&(0..16).collect::<Vec<u32>>(), 8, &mut local);
        assert_eq!(local, [2, 3, 4, 5, 10, 11, 12, 13]);
    }

    #[test]
    fn the_swap_gives_each_rank_its_heads_of_every_position_and_back() {
        use crate::comm::threads::run_group;
        use crate::device::cpu::CpuDevice;
        use crate::device::Memory;
        let (batch, seq, w) = (2, 16, 12);
        let value = |t: usize, b: usize, col: usize| (t * 1000 + b * 100 + col) as f32;
        for c in [1, 2, 4] {
            let out = run_group(c, |rank, comm| {
                let dev = CpuDevice::new(1);
                let split = ContextSplit { size: c, rank };
                let ls = split.local_seq(seq);
                let rows: Vec<f32> = (0..ls * batch)
                    .flat_map(|row| (0..w).map(move |col| (row, col)))
                    .map(|(row, col)| value(split.position(ls, row / batch), row % batch, col))
                    .collect();
                let mut local = dev.alloc(rows.len());
                dev.upload(&mut local, &rows);
                let (mut heads, mut back) = (dev.alloc(rows.len()), dev.alloc(rows.len()));
                let (shape, mut ex) = (SwapShape { batch, local_seq: ls, width: w }, Exchange::default());
                to_heads(&dev, comm, &local, &mut heads, shape, &mut ex);
                to_positions(&dev, comm, &heads, &mut back, shape, &mut ex);
                let (mut h, mut b) = (vec![0f32; rows.len()], vec![0f32; rows.len()]);
                dev.download(&heads, &mut h);
                dev.download(&back, &mut b);
                (h, b == rows)
            });
            let wc = w / c;
            for (rank, (heads, round_trip)) in out.into_iter().enumerate() {
                let expect: Vec<f32> = (0..seq * batch)
                    .flat_map(|row| (0..wc).map(move |j| value(row / batch, row % batch, rank * wc + j)))
                    .collect();
                assert_eq!(heads, expect, "C {c} rank {rank}: heads of every position");
                assert!(round_trip, "C {c} rank {rank}: back to its positions");
            }
        }
    }

    #[test]
    fn comm_types_parse() {
        for name in ["p2p", "all_gather", "a2a", "a2a+p2p"] {
            assert_eq!(CpCommType::parse(name).unwrap().name(), name);
        }
        assert!(CpCommType::parse("ring").unwrap_err().to_string().contains("p2p, all_gather, a2a or a2a+p2p"));
    }
}
