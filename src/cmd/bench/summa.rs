//! `trident bench summa`: the two SUMMA algorithms for 2-D tensor parallelism timed against each
//! other in one job, on the four linear layers of a GPT block (QKV, attention projection, fc1,
//! fc2) at a preset's shapes: gathered panels with one GEMM per product, and q broadcast steps
//! with the next step's blocks in flight. The world is one q x q grid (4, 9, 16, ... ranks).

use super::comm::time_op;
use crate::comm::runtime::Runtime;
use crate::device::cpu::CpuDevice;
use crate::device::prelude::*;
use crate::device::Gemm;
use crate::error::{Error, Result};
use crate::parallel::grid::SummaCoord;
use crate::parallel::summa::{Algorithm, Scratch, Summa};

/// One timed product: forward and both backward products of one linear layer.
#[derive(Clone, Debug)]
pub struct SummaRow {
    pub layer: &'static str,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub algorithm: Algorithm,
    pub ms: f64,
    /// The layer's whole FLOPs (6 m_total k n) over the grid's ranks, per rank per second.
    pub gflops_per_rank: f64,
}

/// Times forward + backward of each GPT linear layer at hidden size `h` with `rows` token rows
/// per rank (the micro-batch's rows over q), for both algorithms. Every rank returns the same
/// table (the slowest rank's times).
pub fn run(rt: &Runtime, threads: usize, h: usize, rows: usize, min_seconds: f64) -> Result<Vec<SummaRow>> {
    let n = rt.world_size;
    let q = (1..=n).find(|q| q * q >= n).unwrap_or(1);
    if q * q != n || q < 2 {
        return Err(Error::Usage(format!(
            "`trident bench summa` runs on one q x q grid: start it on 4, 9 or 16 ranks (mpirun -n 4); this job has {n}"
        )));
    }
    if !h.is_multiple_of(q * q) {
        return Err(Error::Config(format!("--hidden-size {h} is not divisible by q² = {}", q * q)));
    }
    let c = SummaCoord::of(rt.world_rank, q, 1);
    let world_ranks: Vec<usize> = (0..n).collect();
    let row_ranks: Vec<usize> = (0..q).map(|j| c.tp_rank(c.row, j, 0)).collect();
    let col_ranks: Vec<usize> = (0..q).map(|i| c.tp_rank(i, c.col, 0)).collect();
    // Groups are made in the same order on every rank (MPI's split is collective).
    let world = rt.group(&world_ranks);
    let row = rt.group(&row_ranks);
    let col = rt.group(&col_ranks);
    let dev = CpuDevice::new(threads);
    let layers = [("qkv", h, 3 * h), ("proj", h, h), ("fc1", h, 4 * h), ("fc2", 4 * h, h)];
    let mut out = Vec::new();
    for (layer, k, nn) in layers {
        let (kb, nb) = (k / q, nn / q);
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| (((i * 2_654_435_761 + seed) % 1000) as f32 / 1000.0 - 0.5) * 0.1).collect()
        };
        let up = |v: Vec<f32>| {
            let mut b = dev.alloc(v.len());
            dev.upload(&mut b, &v);
            b
        };
        let (x, w, bias, dy) =
            (up(fill(rows * kb, 1)), up(fill(nb * kb, 2)), up(fill(nb / q, 3)), up(fill(rows * nb, 4)));
        let (mut y, mut dx, mut dw, mut db) =
            (dev.alloc(rows * nb), dev.alloc(rows * kb), dev.alloc(nb * kb), dev.alloc(nb / q));
        // Alternate the two algorithms over rounds and keep each one's best, so that drift in the
        // machine's speed does not favour whichever ran first.
        let mut best = [f64::INFINITY; 2];
        for _round in 0..3 {
            for (i, algorithm) in [Algorithm::Panel, Algorithm::Broadcast].into_iter().enumerate() {
                let s = Summa { row: &*row, col: &*col, q, algorithm };
                let mut scratch = Scratch::default();
                let mut step = || {
                    s.linear_forward(&dev, &mut y, &x, (&w, Some(&bias)), Gemm { rows, k, n: nn }, &mut scratch);
                    let (dx, dw, db) = (Some(&mut dx), &mut dw, Some(&mut db));
                    s.linear_backward(&dev, dx, (dw, db), &dy, &x, &w, Gemm { rows, k, n: nn }, &mut scratch);
                };
                best[i] = best[i].min(time_op(&*world, min_seconds / 3.0, &mut step));
            }
        }
        let flops = 6.0 * (rows * q) as f64 * k as f64 * nn as f64 / (q * q) as f64;
        for (secs, algorithm) in best.into_iter().zip([Algorithm::Panel, Algorithm::Broadcast]) {
            out.push(SummaRow {
                layer,
                m: rows,
                k,
                n: nn,
                algorithm,
                ms: secs * 1e3,
                gflops_per_rank: flops / secs / 1e9,
            });
        }
    }
    Ok(out)
}

pub fn print_table(rows: &[SummaRow], q: usize, library: &str) {
    println!("SUMMA linear layers, forward + backward, on a {q} x {q} grid ({library}); rows = token rows per rank");
    println!(
        "{:<6} {:>6} {:>6} {:>6}  {:>10} {:>10}  {:>10} {:>10}  broadcast/panel",
        "layer", "rows", "k", "n", "panel ms", "GFLOP/s", "bcast ms", "GFLOP/s"
    );
    for pair in rows.chunks_exact(2) {
        let (p, b) = (&pair[0], &pair[1]);
        println!(
            "{:<6} {:>6} {:>6} {:>6}  {:>10.2} {:>10.1}  {:>10.2} {:>10.1}  {:>8.2}x",
            p.layer,
            p.m,
            p.k,
            p.n,
            p.ms,
            p.gflops_per_rank,
            b.ms,
            b.gflops_per_rank,
            b.ms / p.ms
        );
    }
}
