//! `trident check comm`: verifies the Comm seam on the running job before anyone trusts it with
//! a training run: every collective (blocking and in flight) and the paired send/receive, in f32,
//! f64 and bf16, on odd
//! sizes, against results each rank computes locally. Useful on a new machine or MPI build.

use crate::comm::runtime::Runtime;
use crate::comm::{Bf16, Comm, ReduceOp};
use crate::error::{Error, Result};

/// The value rank `r` contributes at element `i`: small integers, so sums are exact in every
/// dtype (bf16 holds integers up to 256 exactly).
fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 11) as f32
}

/// Runs every check; returns the number of checks passed or the first failure.
pub fn run(rt: &Runtime) -> Result<usize> {
    let all: Vec<usize> = (0..rt.world_size).collect();
    let world_box = rt.group(&all);
    let world: &dyn Comm = &*world_box;
    let (n, me) = (world.size(), world.rank());
    let mut passed = 0;
    let mut check = |what: &str, ok: bool| -> Result<()> {
        if ok {
            passed += 1;
            Ok(())
        } else {
            Err(Error::Comm(format!("check failed on rank {me} of {n}: {what}")))
        }
    };
    for len in [1usize, 7, 1000, 65_537] {
        let mine: Vec<f32> = (0..len).map(|i| value(me, i)).collect();
        let sum: Vec<f32> = (0..len).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
        let max: Vec<f32> = (0..len).map(|i| (0..n).map(|r| value(r, i)).fold(f32::MIN, f32::max)).collect();

        let mut x = mine.clone();
        world.all_reduce(&mut x, ReduceOp::Sum);
        check(&format!("f32 all-reduce sum of {len}"), x == sum)?;
        let mut x = mine.clone();
        world.all_reduce(&mut x, ReduceOp::Max);
        check(&format!("f32 all-reduce max of {len}"), x == max)?;
        let mut d: Vec<f64> = mine.iter().map(|&v| v as f64).collect();
        world.all_reduce(&mut d, ReduceOp::Sum);
        check(&format!("f64 all-reduce sum of {len}"), d.iter().zip(&sum).all(|(a, b)| *a == *b as f64))?;
        let mut b: Vec<Bf16> = mine.iter().map(|&v| Bf16::from_f32(v)).collect();
        world.all_reduce(&mut b, ReduceOp::Sum);
        check(&format!("bf16 all-reduce sum of {len}"), b.iter().zip(&sum).all(|(a, s)| a.to_f32() == *s))?;
        let mut b: Vec<Bf16> = mine.iter().map(|&v| Bf16::from_f32(v)).collect();
        world.all_reduce(&mut b, ReduceOp::Max);
        check(&format!("bf16 all-reduce max of {len}"), b.iter().zip(&max).all(|(a, m)| a.to_f32() == *m))?;

        let mut gathered = vec![0f32; len * n];
        world.all_gather(&mine, &mut gathered);
        let expect: Vec<f32> = (0..n).flat_map(|r| (0..len).map(move |i| value(r, i))).collect();
        check(&format!("f32 all-gather of {len}"), gathered == expect)?;
        let mut gb = vec![Bf16::default(); len * n];
        world.all_gather(&mine.iter().map(|&v| Bf16::from_f32(v)).collect::<Vec<_>>(), &mut gb);
        check(&format!("bf16 all-gather of {len}"), gb.iter().zip(&expect).all(|(a, e)| a.to_f32() == *e))?;

        // Reduce-scatter: every rank contributes n chunks of `len`; rank r keeps the sum of chunk r.
        let contribution: Vec<f32> = (0..n * len).map(|i| value(me, i)).collect();
        let mut chunk = vec![0f32; len];
        world.reduce_scatter(&contribution, &mut chunk);
        let expect: Vec<f32> = (0..len).map(|i| (0..n).map(|r| value(r, me * len + i)).sum()).collect();
        check(&format!("f32 reduce-scatter of {len}"), chunk == expect)?;
        let mut chunk_b = vec![Bf16::default(); len];
        world.reduce_scatter(&contribution.iter().map(|&v| Bf16::from_f32(v)).collect::<Vec<_>>(), &mut chunk_b);
        check(&format!("bf16 reduce-scatter of {len}"), chunk_b.iter().zip(&expect).all(|(a, e)| a.to_f32() == *e))?;

        // All-to-all: block j of what rank `me` receives is block `me` of rank j's `contribution`.
        let mut swapped = vec![0f32; n * len];
        world.all_to_all(&contribution, &mut swapped);
        let expect: Vec<f32> = (0..n).flat_map(|r| (0..len).map(move |i| value(r, me * len + i))).collect();
        check(&format!("f32 all-to-all of {len} per rank"), swapped == expect)?;

        let root = n - 1;
        let mut x = if me == root { mine.clone() } else { vec![-1.0; len] };
        world.broadcast(&mut x, root);
        check(
            &format!("f32 broadcast of {len} from rank {root}"),
            x.iter().enumerate().all(|(i, &v)| v == value(root, i)),
        )?;

        // A ring: everyone sends to the next rank and receives from the previous one at once.
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let mut got = vec![0f32; len];
        world.send_recv(Some((&mine[..], next)), Some((&mut got[..], prev)));
        check(&format!("f32 ring send/receive of {len}"), got.iter().enumerate().all(|(i, &v)| v == value(prev, i)))?;

        let pending = world.all_reduce_start(mine.clone());
        check(&format!("f32 overlapped all-reduce of {len}"), pending.wait() == sum)?;

        // Reductions onto one rank and broadcasts in flight (broadcast-SUMMA's steps).
        let mut onto = vec![-1f32; len];
        world.reduce(&mine, &mut onto, root);
        check(&format!("f32 reduce of {len} onto rank {root}"), me != root || onto == sum)?;
        let reduced = world.reduce_start(mine.clone(), 0).wait();
        check(&format!("f32 overlapped reduce of {len} onto rank 0"), me != 0 || reduced == sum)?;
        let buf = if me == root { mine.clone() } else { vec![-1.0; len] };
        let got = world.broadcast_start(buf, root).wait();
        check(
            &format!("f32 overlapped broadcast of {len} from rank {root}"),
            got.iter().enumerate().all(|(i, &v)| v == value(root, i)),
        )?;
    }
    world.barrier();
    Ok(passed)
}
