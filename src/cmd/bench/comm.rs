//! `trident bench allreduce|allgather|reducescatter|sendrecv`: collective timings over the Comm
//! seam for sizes from 1 KiB up, with algorithm and bus bandwidth computed as nccl-tests does, and
//! (for all-reduce) the MPI library's own blocking all-reduce on the same buffers for comparison.

use crate::comm::runtime::Runtime;
use crate::comm::{Comm, ReduceOp};
use crate::error::{Error, Result};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommBench {
    AllReduce,
    AllGather,
    ReduceScatter,
    SendRecv,
}

impl CommBench {
    pub fn parse(name: &str) -> Option<CommBench> {
        match name {
            "allreduce" => Some(CommBench::AllReduce),
            "allgather" => Some(CommBench::AllGather),
            "reducescatter" => Some(CommBench::ReduceScatter),
            "sendrecv" => Some(CommBench::SendRecv),
            _ => None,
        }
    }

    /// nccl-tests' bus-bandwidth factor: the fraction of the data each rank's busiest link carries,
    /// so that the figure compares with the hardware's bandwidth whatever the rank count.
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            CommBench::AllReduce => 2.0 * (n - 1.0) / n,
            CommBench::AllGather | CommBench::ReduceScatter => (n - 1.0) / n,
            CommBench::SendRecv => 1.0,
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct CommBenchRow {
    pub bytes: usize,
    pub seconds: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// All-reduce only: the library's own MPI_Allreduce bus bandwidth on the same buffers.
    pub library_busbw_gbs: Option<f64>,
}

/// Times `op` (one call) in doubling batches until `min_seconds` have passed (at least 3 calls
/// after a warm-up) and returns the slowest rank's mean seconds per call. The ranks agree on when
/// to stop through one all-reduce per batch, whose cost the doubling amortises.
pub(crate) fn time_op(world: &dyn Comm, min_seconds: f64, op: &mut dyn FnMut()) -> f64 {
    op();
    world.barrier();
    let start = Instant::now();
    let (mut calls, mut batch) = (0u64, 1u64);
    loop {
        for _ in 0..batch {
            op();
        }
        calls += batch;
        let mut elapsed = [start.elapsed().as_secs_f64()];
        world.all_reduce(&mut elapsed, ReduceOp::Max);
        if calls >= 3 && elapsed[0] >= min_seconds || calls >= 100_000 {
            return elapsed[0] / calls as f64;
        }
        batch = (batch * 2).min(4096);
    }
}

pub fn sweep(bench: CommBench, rt: &Runtime, max_bytes: usize, min_seconds: f64) -> Result<Vec<CommBenchRow>> {
    let all: Vec<usize> = (0..rt.world_size).collect();
    let world_box = rt.group(&all);
    let world: &dyn Comm = &*world_box;
    let n = world.size();
    if n < 2 {
        return Err(Error::Usage(format!(
            "`trident bench` of a collective needs at least 2 ranks (start it under mpirun -n 2 or srun); this is one \
             rank (MPI: {})",
            rt.library
        )));
    }
    let (rank, next, prev) = (world.rank(), (world.rank() + 1) % n, (world.rank() + n - 1) % n);
    let mut rows = Vec::new();
    let mut bytes = 1024;
    while bytes <= max_bytes {
        // Sizes as nccl-tests counts them: the all-gather's output, the reduce-scatter's input.
        let count = (bytes / 4 / n).max(1) * n;
        let mut buf = vec![rank as f32; count];
        let mut small = vec![0f32; count / n];
        let mut op: Box<dyn FnMut()> = match bench {
            CommBench::AllReduce => Box::new(|| world.all_reduce(&mut buf, ReduceOp::Sum)),
            CommBench::AllGather => Box::new(|| world.all_gather(&small, &mut buf)),
            CommBench::ReduceScatter => Box::new(|| world.reduce_scatter(&buf, &mut small)),
            CommBench::SendRecv => {
                let send = vec![1f32; count];
                Box::new(move || world.send_recv(Some((&send[..], next)), Some((&mut buf[..], prev))))
            }
        };
        let seconds = time_op(world, min_seconds, &mut *op);
        drop(op);
        let size = (count * 4) as f64;
        let algbw = size / seconds / 1e9;
        let library_busbw_gbs = if bench == CommBench::AllReduce {
            let send = vec![1f32; count];
            let mut recv = vec![0f32; count];
            let mut ok = true;
            let t = time_op(world, min_seconds, &mut || ok &= rt.library_all_reduce(&send, &mut recv).is_some());
            ok.then(|| size / t / 1e9 * bench.bus_factor(n))
        } else {
            None
        };
        rows.push(CommBenchRow {
            bytes: count * 4,
            seconds,
            algbw_gbs: algbw,
            busbw_gbs: algbw * bench.bus_factor(n),
            library_busbw_gbs,
        });
        bytes *= 4;
    }
    Ok(rows)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

pub fn print_table(bench: CommBench, ranks: usize, library: &str, rows: &[CommBenchRow]) {
    println!("{bench:?} over {ranks} ranks, f32, Comm seam on {library}");
    let baseline = bench == CommBench::AllReduce;
    print!("{:>9} {:>12} {:>12} {:>12} {:>12}", "size", "time (us)", "algbw GB/s", "busbw GB/s", "");
    if baseline {
        print!("{:>16} {:>7}", "MPI_Allreduce", "ratio");
    }
    println!();
    for r in rows {
        print!(
            "{:>9} {:>12.1} {:>12.3} {:>12.3} {:>12}",
            human(r.bytes),
            r.seconds * 1e6,
            r.algbw_gbs,
            r.busbw_gbs,
            ""
        );
        if let Some(lib) = r.library_busbw_gbs {
            print!("{:>16.3} {:>7.2}", lib, r.busbw_gbs / lib);
        }
        println!();
    }
}
