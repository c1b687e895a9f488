//! A process group whose ranks are threads of one process, for unit tests of the parallel layers
//! (SUMMA, split LayerNorm, vocabulary-parallel pieces) without MPI. Every collective goes through
//! shared slots between two barriers; reductions add the ranks' contributions in rank order, so
//! every rank gets bit-identical results, as MPI's do.

use super::{Bf16, Comm, CommCounters, Dtype, Pending, Ready, ReduceOp};
use std::sync::{Arc, Barrier, Mutex};

struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
}

/// One rank's handle on a thread group.
pub struct ThreadComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    counters: Mutex<CommCounters>,
}

impl ThreadComm {
    /// Handles for a group of `size` ranks, one per thread.
    pub fn group(size: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared { barrier: Barrier::new(size), slots: Mutex::new(vec![Vec::new(); size]) });
        (0..size)
            .map(|rank| ThreadComm {
                rank,
                size,
                shared: shared.clone(),
                counters: Mutex::new(CommCounters::default()),
            })
            .collect()
    }

    /// Publishes `mine`, and returns every rank's contribution (in rank order) once all have.
    fn exchange(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        self.shared.slots.lock().unwrap()[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap().clone();
        self.shared.barrier.wait();
        all
    }

    fn count(&self, f: impl FnOnce(&mut CommCounters)) {
        f(&mut self.counters.lock().unwrap());
    }
}

/// Element-wise reduction of every contribution into `out`, in rank order.
fn reduce_into(out: &mut [u8], parts: &[&[u8]], dtype: Dtype, op: ReduceOp) {
    fn go<T: bytemuck::Pod>(out: &mut [u8], parts: &[&[u8]], f: impl Fn(T, T) -> T) {
        let out: &mut [T] = bytemuck::cast_slice_mut(out);
        out.copy_from_slice(bytemuck::cast_slice(parts[0]));
        for p in &parts[1..] {
            for (o, &x) in out.iter_mut().zip(bytemuck::cast_slice::<u8, T>(p)) {
                *o = f(*o, x);
            }
        }
    }
    match (dtype, op) {
        (Dtype::F32, ReduceOp::Sum) => go::<f32>(out, parts, |a, b| a + b),
        (Dtype::F32, ReduceOp::Max) => go::<f32>(out, parts, f32::max),
        (Dtype::F64, ReduceOp::Sum) => go::<f64>(out, parts, |a, b| a + b),
        (Dtype::F64, ReduceOp::Max) => go::<f64>(out, parts, f64::max),
        (Dtype::Bf16, op) => go::<super::Bf16>(out, parts, |a, b| super::Half16::combine(a, b, op)),
        (Dtype::F16, op) => go::<super::F16>(out, parts, |a, b| super::Half16::combine(a, b, op)),
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_bytes(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) {
        self.count(|c| c.all_reduce += (buf.len() / dtype.bytes()) as u64);
        let all = self.exchange(buf);
        let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        reduce_into(buf, &parts, dtype, op);
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        self.count(|c| c.all_gather += (send.len() / dtype.bytes()) as u64);
        let all = self.exchange(send);
        for (chunk, part) in recv.chunks_exact_mut(send.len()).zip(&all) {
            chunk.copy_from_slice(part);
        }
    }
    fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        self.count(|c| c.reduce_scatter += (send.len() / dtype.bytes()) as u64);
        let all = self.exchange(send);
        let n = recv.len();
        let parts: Vec<&[u8]> = all.iter().map(|p| &p[self.rank * n..(self.rank + 1) * n]).collect();
        reduce_into(recv, &parts, dtype, ReduceOp::Sum);
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        self.count(|c| c.all_to_all += (send.len() / dtype.bytes()) as u64);
        let all = self.exchange(send);
        let n = send.len() / self.size;
        for (block, part) in recv.chunks_exact_mut(n).zip(&all) {
            block.copy_from_slice(&part[self.rank * n..(self.rank + 1) * n]);
        }
    }
    fn broadcast_bytes(&self, buf: &mut [u8], dtype: Dtype, root: usize) {
        self.count(|c| c.broadcast += (buf.len() / dtype.bytes()) as u64);
        let all = self.exchange(buf);
        buf.copy_from_slice(&all[root]);
    }
    fn reduce_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype, root: usize) {
        self.count(|c| c.reduce += (send.len() / dtype.bytes()) as u64);
        let all = self.exchange(send);
        if self.rank == root {
            let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
            reduce_into(recv, &parts, dtype, ReduceOp::Sum);
        }
    }
    fn reduce_scatter_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        let mut out = vec![0f32; send.len() / self.size];
        self.reduce_scatter_bytes(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), Dtype::F32);
        Box::new(Ready(out))
    }
    fn all_gather_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        let mut out = vec![0f32; send.len() * self.size];
        self.all_gather_bytes(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), Dtype::F32);
        Box::new(Ready(out))
    }
    fn sum_start_bf16(&self, buf: Vec<f32>, scatter: bool) -> Box<dyn Pending> {
        let halves: Vec<Bf16> = buf.iter().map(|&x| Bf16::from_f32(x)).collect();
        let mut out = vec![Bf16::default(); if scatter { buf.len() / self.size } else { buf.len() }];
        let c: &dyn Comm = self;
        match scatter {
            true => c.reduce_scatter(&halves, &mut out),
            false => {
                out.copy_from_slice(&halves);
                c.all_reduce(&mut out, ReduceOp::Sum);
            }
        }
        Box::new(Ready(out.iter().map(|h| h.to_f32()).collect()))
    }
    fn broadcast_start(&self, mut buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        self.broadcast_bytes(bytemuck::cast_slice_mut(&mut buf), Dtype::F32, root);
        Box::new(Ready(buf))
    }
    fn reduce_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        let mut out = buf.clone();
        self.reduce_bytes(bytemuck::cast_slice(&buf), bytemuck::cast_slice_mut(&mut out), Dtype::F32, root);
        Box::new(Ready(out))
    }
    fn send_recv_bytes(&self, _send: Option<(&[u8], usize)>, _recv: Option<(&mut [u8], usize)>) {
        unimplemented!("the thread group is for collectives only")
    }
    fn barrier(&self) {
        self.shared.barrier.wait();
    }
    fn counters(&self) -> CommCounters {
        *self.counters.lock().unwrap()
    }
    fn all_reduce_start(&self, mut buf: Vec<f32>) -> Box<dyn Pending> {
        self.all_reduce_bytes(bytemuck::cast_slice_mut(&mut buf), Dtype::F32, ReduceOp::Sum);
        Box::new(Ready(buf))
    }
    fn send_start(&self, _buf: Vec<f32>, _peer: usize, _tag: u32) -> Box<dyn Pending> {
        unimplemented!("the thread group is for collectives only")
    }
    fn recv_tagged(&self, _buf: &mut [f32], _peer: usize, _tag: u32) {
        unimplemented!("the thread group is for collectives only")
    }
}

/// Runs `f(rank, comm)` on `size` threads and returns their results in rank order.
pub fn run_group<T: Send>(size: usize, f: impl Fn(usize, &ThreadComm) -> T + Sync) -> Vec<T> {
    let comms = ThreadComm::group(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_collectives_agree_with_their_definitions() {
        let out = run_group(3, |r, c| {
            let c: &dyn Comm = c;
            let mut x = [r as f32, 1.0];
            c.all_reduce(&mut x, ReduceOp::Sum);
            let mut g = [0f32; 6];
            c.all_gather(&[r as f32, 10.0 * r as f32], &mut g);
            let mut rs = [0f32; 1];
            c.reduce_scatter(&[1.0, 2.0, 3.0], &mut rs);
            let mut b = [r as f32];
            c.broadcast(&mut b, 2);
            let mut a2a = [0f32; 6];
            c.all_to_all(&(0..6).map(|j| (10 * r + j) as f32).collect::<Vec<_>>(), &mut a2a);
            (x, g, rs[0], b[0], a2a)
        });
        for (r, (x, g, rs, b, a2a)) in out.into_iter().enumerate() {
            // Block j of what rank r received is block r of rank j's: 10 j + 2 r and the next.
            let expect: Vec<f32> = (0..3).flat_map(|j| [0, 1].map(|k| (10 * j + 2 * r + k) as f32)).collect();
            assert_eq!(a2a.to_vec(), expect, "rank {r}");
            assert_eq!(x, [3.0, 3.0]);
            assert_eq!(g, [0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
            assert_eq!(rs, 3.0 * (r + 1) as f32);
            assert_eq!(b, 2.0);
        }
    }

    #[test]
    fn sixteen_bit_reductions_round_each_partial_sum_in_rank_order() {
        use crate::comm::{Bf16, F16};
        // Binary16's spacing at 1 is 2^-10: 1 + 2^-11 is a tie that stays 1, twice; 1 + 2^-9 is
        // exact in binary16 and rounds to 1 in bf16.
        let out = run_group(3, |r, c| {
            let c: &dyn Comm = c;
            let mut ties = [F16::from_f32([1.0, 2f32.powi(-11), 2f32.powi(-11)][r])];
            c.all_reduce(&mut ties, ReduceOp::Sum);
            let mut f16 = [F16::from_f32([1.0, 2f32.powi(-9), 0.0][r]), F16::from_f32(r as f32 - 5.0)];
            c.all_reduce(&mut f16[..1], ReduceOp::Sum);
            c.all_reduce(&mut f16[1..], ReduceOp::Max);
            let mut bf16 = [Bf16::from_f32([1.0, 2f32.powi(-9), 0.0][r])];
            c.all_reduce(&mut bf16, ReduceOp::Sum);
            (ties[0].to_f32(), f16.map(F16::to_f32), bf16[0].to_f32())
        });
        for (ties, f16, bf16) in out {
            assert_eq!(ties, 1.0);
            assert_eq!(f16, [1.0 + 2f32.powi(-9), -3.0]);
            assert_eq!(bf16, 1.0);
        }
    }
}
