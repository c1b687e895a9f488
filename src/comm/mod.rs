//! The Comm seam: collectives and point-to-point transfers on one process group, over host
//! buffers of f32, f64, bf16 or IEEE binary16. MPI implements it (`mpi.rs`); a group of one rank is `SelfComm`.
//! Process groups are values (`parallel::grid::Groups`), never globals.

#[cfg(feature = "mpi")]
pub mod mpi;
pub mod placement;
pub mod runtime;
#[cfg(test)]
pub mod threads;
pub mod watchdog;

use bytemuck::{Pod, Zeroable};

/// The reductions the training step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Element types a Comm moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    Bf16,
    /// IEEE binary16 (`--fp16` storage).
    F16,
}

impl Dtype {
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The short name reports use ("bf16").
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
}

/// bfloat16 as its bit pattern: the top half of an f32.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

// SAFETY: a transparent wrapper of u16: every bit pattern is valid and there is no padding.
unsafe impl Zeroable for Bf16 {}
// SAFETY: as above.
unsafe impl Pod for Bf16 {}

impl Bf16 {
    /// Round to nearest even (NaN stays NaN).
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) | 0x40) as u16);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// IEEE binary16 as its bit pattern.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

// SAFETY: a transparent wrapper of u16: every bit pattern is valid and there is no padding.
unsafe impl Zeroable for F16 {}
// SAFETY: as above.
unsafe impl Pod for F16 {}

impl F16 {
    /// Round to nearest even; above 65504 (from 65520 on) to infinity, below 2^-14 to the
    /// subnormals' multiples of 2^-24, as binary16 does (NaN stays NaN).
    pub fn from_f32(x: f32) -> F16 {
        let f16 = crate::real::Precision::F16;
        F16(f16.to_bits16(f16.round(x)))
    }
    pub fn to_f32(self) -> f32 {
        crate::real::Precision::F16.from_bits16(self.0)
    }
}

/// A 16-bit float a reduction widens to f32, combines and rounds back: `Bf16` or `F16`. One
/// combination of two 16-bit values through f32 is their correctly rounded result (f32 has more
/// than twice their significand bits, so rounding twice is rounding once), as NCCL's own sums
/// of 16-bit elements are.
pub trait Half16: Pod {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;

    /// `a op b`, rounded once.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        let (a, b) = (a.to_f32(), b.to_f32());
        Self::from_f32(match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
        })
    }
}
impl Half16 for Bf16 {
    fn from_f32(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
}
impl Half16 for F16 {
    fn from_f32(x: f32) -> F16 {
        F16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        F16::to_f32(self)
    }
}

/// A type a Comm can move: its bytes and the dtype that names them.
pub trait Element: Pod {
    const DTYPE: Dtype;
}
impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
}
impl Element for Bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl Element for F16 {
    const DTYPE: Dtype = Dtype::F16;
}

/// How many elements of each kind a rank has sent, per collective kind (for `--log-comm` and the
/// volume checks of later layouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommCounters {
    pub all_reduce: u64,
    pub all_gather: u64,
    pub reduce_scatter: u64,
    pub broadcast: u64,
    pub reduce: u64,
    pub send: u64,
    pub all_to_all: u64,
}

impl CommCounters {
    /// What was counted after `before` was.
    pub fn since(&self, before: &CommCounters) -> CommCounters {
        CommCounters {
            all_reduce: self.all_reduce - before.all_reduce,
            all_gather: self.all_gather - before.all_gather,
            reduce_scatter: self.reduce_scatter - before.reduce_scatter,
            broadcast: self.broadcast - before.broadcast,
            reduce: self.reduce - before.reduce,
            send: self.send - before.send,
            all_to_all: self.all_to_all - before.all_to_all,
        }
    }

    pub fn add(&mut self, other: &CommCounters) {
        self.all_reduce += other.all_reduce;
        self.all_gather += other.all_gather;
        self.reduce_scatter += other.reduce_scatter;
        self.broadcast += other.broadcast;
        self.reduce += other.reduce;
        self.send += other.send;
        self.all_to_all += other.all_to_all;
    }

    /// Elements each rank of a group of `n` moves for these calls, with the bandwidth-optimal
    /// counts of docs/design.md (Communication volumes): an all-reduce of S moves 2(n-1)/n S, an
    /// all-gather or reduce-scatter of full size S moves (n-1)/n S (the counters hold the piece
    /// S/n for an all-gather and the full S for a reduce-scatter), a broadcast or a reduce to one
    /// rank (n-1)/n S averaged over the group (every rank counts S), a send S, an all-to-all of
    /// S sent (n-1)/n S (the block a rank keeps for itself does not travel).
    pub fn moved(&self, n: usize) -> f64 {
        let f = (n.max(1) - 1) as f64 / n.max(1) as f64;
        2.0 * f * self.all_reduce as f64
            + (n.max(1) - 1) as f64 * self.all_gather as f64
            + f * (self.reduce_scatter + self.broadcast + self.reduce + self.all_to_all) as f64
            + self.send as f64
    }
}

/// A transfer in flight (a data-parallel bucket's sum all-reduce, a pipeline send): `poll`
/// drives it without blocking, `wait` finishes it and returns the buffer (reduced, for an
/// all-reduce).
pub trait Pending {
    fn poll(&mut self) -> bool;
    fn wait(self: Box<Self>) -> Vec<f32>;
}

/// `values` rounded to bf16, packed two to an f32 slot (the buffer a 16-bit collective in flight
/// keeps alive), and the inverse: the first `len` bf16 values of `packed`, widened.
pub fn pack_bf16(values: &[f32]) -> Vec<f32> {
    let mut packed = vec![0f32; values.len().div_ceil(2)];
    let halves: &mut [Bf16] = bytemuck::cast_slice_mut(&mut packed);
    for (h, &x) in halves.iter_mut().zip(values) {
        *h = Bf16::from_f32(x);
    }
    packed
}

pub fn unpack_bf16(packed: &[f32], len: usize) -> Vec<f32> {
    bytemuck::cast_slice::<f32, Bf16>(packed)[..len].iter().map(|h| h.to_f32()).collect()
}

/// A 16-bit collective in flight on packed buffers (`pack_bf16`): `wait` widens its result.
pub struct Widened {
    pub inner: Box<dyn Pending>,
    pub len: usize,
}

impl Pending for Widened {
    fn poll(&mut self) -> bool {
        self.inner.poll()
    }
    fn wait(self: Box<Self>) -> Vec<f32> {
        let len = self.len;
        unpack_bf16(&self.inner.wait(), len)
    }
}

/// A reduction that was complete when it started (a group of one).
pub struct Ready(pub Vec<f32>);

impl Pending for Ready {
    fn poll(&mut self) -> bool {
        true
    }
    fn wait(self: Box<Self>) -> Vec<f32> {
        self.0
    }
}

/// One process group. Every rank of the group must make the same calls in the same order, with
/// the same sizes; buffers are host memory. Byte slices carry elements of `dtype`.
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `buf` becomes the element-wise reduction of every rank's `buf`.
    fn all_reduce_bytes(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp);
    /// `recv` (size × len(send)) becomes every rank's `send`, in rank order.
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype);
    /// `recv` (len(send) / size) becomes the sum over ranks of this rank's chunk of `send`.
    fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype);
    /// Block `j` of `recv` becomes block `rank` of rank j's `send` (both `size` equal blocks):
    /// every rank sends each rank its own block.
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype);
    /// `buf` becomes root's `buf`.
    fn broadcast_bytes(&self, buf: &mut [u8], dtype: Dtype, root: usize);
    /// Root's `recv` becomes the element-wise sum of every rank's `send` (other ranks' `recv` is
    /// left alone).
    fn reduce_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype, root: usize);
    /// Sends `send` to its peer and receives `recv` from its peer, both posted together so that
    /// pairs of ranks exchanging in both directions cannot deadlock.
    fn send_recv_bytes(&self, send: Option<(&[u8], usize)>, recv: Option<(&mut [u8], usize)>);
    fn barrier(&self);
    fn counters(&self) -> CommCounters;
    /// Starts a sum all-reduce that completes later, so communication overlaps computation.
    fn all_reduce_start(&self, buf: Vec<f32>) -> Box<dyn Pending>;
    /// Starts a sum reduce-scatter of `send` (size equal blocks); `wait` returns this rank's
    /// block of the sum. Lets the distributed optimizer's gradient buckets reduce during backward.
    fn reduce_scatter_start(&self, send: Vec<f32>) -> Box<dyn Pending>;
    /// Starts an all-gather of every rank's `send` (in rank order); `wait` returns it. Lets the
    /// distributed optimizer's updated weights travel while the next forward starts.
    fn all_gather_start(&self, send: Vec<f32>) -> Box<dyn Pending>;
    /// Starts a sum of `buf` in bf16 (`--grad-reduce-in-bf16`): every value rounded to bf16 and
    /// each partial sum rounded, half the bytes of f32; an all-reduce, or with `scatter` a
    /// reduce-scatter (size equal blocks). `wait` returns the sum (this rank's block) as f32.
    fn sum_start_bf16(&self, buf: Vec<f32>, scatter: bool) -> Box<dyn Pending>;
    /// Starts a broadcast of root's `buf` (every rank passes a buffer of the same length); `wait`
    /// returns it filled. Lets broadcast-SUMMA fetch the next step's blocks during this one's GEMM.
    fn broadcast_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending>;
    /// Starts a sum of every rank's `buf` onto `root`; `wait` returns the sum on root (and an
    /// unspecified buffer of the same length elsewhere).
    fn reduce_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending>;
    /// Starts sending `buf` to `peer` under `tag`; it never blocks, so a schedule whose receives
    /// are matched by tag cannot deadlock on its sends.
    fn send_start(&self, buf: Vec<f32>, peer: usize, tag: u32) -> Box<dyn Pending>;
    /// Receives the message `peer` sent under `tag` into `buf` (exactly its length).
    fn recv_tagged(&self, buf: &mut [f32], peer: usize, tag: u32);
}

impl dyn Comm + '_ {
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) {
        if self.size() > 1 {
            self.all_reduce_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, op);
        }
    }
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) {
        assert_eq!(send.len() * self.size(), recv.len(), "all_gather: receive buffer must hold size x send");
        self.all_gather_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE);
    }
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T]) {
        assert_eq!(recv.len() * self.size(), send.len(), "reduce_scatter: send buffer must hold size x receive");
        self.reduce_scatter_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE);
    }
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) {
        assert_eq!(send.len(), recv.len(), "all_to_all: send and receive buffers have the same length");
        assert_eq!(send.len() % self.size(), 0, "all_to_all: the buffers split into size equal blocks");
        self.all_to_all_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE);
    }
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) {
        if self.size() > 1 {
            self.broadcast_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, root);
        }
    }
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) {
        assert_eq!(send.len(), recv.len(), "reduce: send and receive buffers have the same length");
        self.reduce_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), T::DTYPE, root);
    }
    pub fn send_recv<T: Element>(&self, send: Option<(&[T], usize)>, recv: Option<(&mut [T], usize)>) {
        self.send_recv_bytes(
            send.map(|(b, peer)| (bytemuck::cast_slice(b), peer)),
            recv.map(|(b, peer)| (bytemuck::cast_slice_mut(b), peer)),
        );
    }
    /// Sum of `x` over the group, in f64 (loss and norm bookkeeping).
    pub fn sum_f64(&self, x: f64) -> f64 {
        if self.size() == 1 {
            return x;
        }
        // Split into a high f32 and the f32 remainder so the sum keeps about 48 bits.
        let hi = x as f32;
        let lo = (x - hi as f64) as f32;
        let mut parts = vec![0f32; 2 * self.size()];
        self.all_gather(&[hi, lo], &mut parts);
        parts.chunks_exact(2).map(|p| p[0] as f64 + p[1] as f64).sum()
    }

    /// `sum_f64` of each element of `xs` in one all-gather: every element gets exactly the value
    /// `sum_f64` gives it alone (the same parts, added in rank order).
    pub fn sum_f64s(&self, xs: &mut [f64]) {
        if self.size() == 1 || xs.is_empty() {
            return;
        }
        let local: Vec<f32> = xs.iter().flat_map(|&x| [x as f32, (x - (x as f32) as f64) as f32]).collect();
        let mut parts = vec![0f32; local.len() * self.size()];
        self.all_gather(&local, &mut parts);
        for (k, x) in xs.iter_mut().enumerate() {
            *x = parts.chunks_exact(local.len()).map(|p| p[2 * k] as f64 + p[2 * k + 1] as f64).sum();
        }
    }
}

/// The group of one rank: every collective is the identity (or a copy), and nothing is sent.
#[derive(Default)]
pub struct SelfComm;

impl Comm for SelfComm {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_bytes(&self, _buf: &mut [u8], _dtype: Dtype, _op: ReduceOp) {}
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], _dtype: Dtype) {
        recv.copy_from_slice(send);
    }
    fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], _dtype: Dtype) {
        recv.copy_from_slice(send);
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], _dtype: Dtype) {
        recv.copy_from_slice(send);
    }
    fn broadcast_bytes(&self, _buf: &mut [u8], _dtype: Dtype, _root: usize) {}
    fn reduce_bytes(&self, send: &[u8], recv: &mut [u8], _dtype: Dtype, _root: usize) {
        recv.copy_from_slice(send);
    }
    fn reduce_scatter_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        Box::new(Ready(send))
    }
    fn all_gather_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        Box::new(Ready(send))
    }
    fn sum_start_bf16(&self, buf: Vec<f32>, _scatter: bool) -> Box<dyn Pending> {
        Box::new(Ready(buf.into_iter().map(|x| Bf16::from_f32(x).to_f32()).collect()))
    }
    fn broadcast_start(&self, buf: Vec<f32>, _root: usize) -> Box<dyn Pending> {
        Box::new(Ready(buf))
    }
    fn reduce_start(&self, buf: Vec<f32>, _root: usize) -> Box<dyn Pending> {
        Box::new(Ready(buf))
    }
    fn send_recv_bytes(&self, send: Option<(&[u8], usize)>, recv: Option<(&mut [u8], usize)>) {
        if let (Some((s, _)), Some((r, _))) = (send, recv) {
            r.copy_from_slice(s);
        }
    }
    fn barrier(&self) {}
    fn counters(&self) -> CommCounters {
        CommCounters::default()
    }
    fn all_reduce_start(&self, buf: Vec<f32>) -> Box<dyn Pending> {
        Box::new(Ready(buf))
    }
    fn send_start(&self, _buf: Vec<f32>, _peer: usize, _tag: u32) -> Box<dyn Pending> {
        unreachable!("a group of one rank has no peer to send to")
    }
    fn recv_tagged(&self, _buf: &mut [f32], _peer: usize, _tag: u32) {
        unreachable!("a group of one rank has no peer to receive from")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).to_f32(), 1.0);
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0); // tie -> even
        assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(), 1.0 + 4.0 / 256.0);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn f16_rounds_to_nearest_even_and_combines_once() {
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(-2.0).0, 0xc000);
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).to_f32(), 1.0); // tie -> even
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).to_f32(), 1.0 + 2.0 / 1024.0);
        assert_eq!(F16::from_f32(65520.0).to_f32(), f32::INFINITY);
        assert_eq!(F16::from_f32(2f32.powi(-24)).0, 1);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        // 2048 + 1 is a tie in binary16 (spacing 2 there): even, 2048; bf16 would keep 2048 too,
        // but 1 + 2^-9 separates the formats (binary16 holds it, bf16 rounds it to 1).
        let (a, b) = (F16::from_f32(2048.0), F16::from_f32(1.0));
        assert_eq!(Half16::combine(a, b, ReduceOp::Sum).to_f32(), 2048.0);
        let (a, b) = (F16::from_f32(1.0), F16::from_f32(2f32.powi(-9)));
        assert_eq!(Half16::combine(a, b, ReduceOp::Sum).to_f32(), 1.0 + 2f32.powi(-9));
        assert_eq!(Half16::combine(a, b, ReduceOp::Max), a);
        let (a, b) = (Bf16::from_f32(1.0), Bf16::from_f32(2f32.powi(-9)));
        assert_eq!(Half16::combine(a, b, ReduceOp::Sum).to_f32(), 1.0);
    }

    #[test]
    fn self_comm_is_the_identity() {
        let c: &dyn Comm = &SelfComm;
        let mut x = [1.0f32, 2.0];
        c.all_reduce(&mut x, ReduceOp::Sum);
        assert_eq!(x, [1.0, 2.0]);
        let mut y = [0.0f32; 2];
        c.all_gather(&x, &mut y);
        assert_eq!(y, x);
        assert_eq!(c.sum_f64(0.1), 0.1);
    }
}
