//! The GEMM benchmark: validates and times `gemm` over a sweep of shapes in the three layouts of a
//! training step, and prints GFLOP/s and the fraction of the measured FMA peak as a table.

use std::time::Instant;

use crate::device::cpu::gemm::{best_kernel, gemm, MatRef};
use crate::device::cpu::peak::Peak;
use crate::device::cpu::pool::ThreadPool;
use crate::rng::fill;

/// One benchmarked (shape, layout) pair. `C` is `m × n` and the sum runs over `k`.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmBenchRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// "NT" (forward `X·Wᵀ`), "NN" (input gradient `dY·W`) or "TN" (weight gradient `dYᵀ·X`).
    pub layout: &'static str,
    pub kernel: &'static str,
    pub gflops: f64,
    pub fraction_of_peak: f64,
    /// Largest `|C − reference| / Σ_p |A(i,p)·B(p,j)|` over the checked elements.
    pub max_rel_err: f64,
}

/// `(m, n, k)` triples: the linear layers of a GPT-2 small step at micro-batch 4 × sequence 64
/// (M = 256 tokens: QKV, attention projection, MLP up, MLP down, vocabulary head), then two
/// squares that show the kernel's steady state.
pub const DEFAULT_SHAPES: &[(usize, usize, usize)] = &[
    (256, 2304, 768),
    (256, 768, 768),
    (256, 3072, 768),
    (256, 768, 3072),
    (256, 50304, 768),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
];

/// How the operands of `C = A·B` are stored, named BLAS-style by whether A and B are transposed.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// A row-major `m × k`, B stored as its transpose `n × k` (a weight `[out, in]`).
    Nt,
    /// A row-major `m × k`, B row-major `k × n`.
    Nn,
    /// A stored as its transpose `k × m`, B row-major `k × n`.
    Tn,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::Nt, Layout::Nn, Layout::Tn];

    fn name(self) -> &'static str {
        match self {
            Layout::Nt => "NT",
            Layout::Nn => "NN",
            Layout::Tn => "TN",
        }
    }

    fn a_view(self, data: &[f32], m: usize, k: usize) -> MatRef<'_> {
        match self {
            Layout::Nt | Layout::Nn => MatRef::row_major(data, k),
            Layout::Tn => MatRef::transposed(data, m),
        }
    }

    fn b_view(self, data: &[f32], k: usize, n: usize) -> MatRef<'_> {
        match self {
            Layout::Nt => MatRef::transposed(data, k),
            Layout::Nn | Layout::Tn => MatRef::row_major(data, n),
        }
    }
}

/// Elements checked against the f64 reference per shape; a full check of 2048³ would take
/// seconds, and a wrong block shows up in a spread-out sample anyway.
const CHECKED_ELEMENTS: usize = 512;

/// Max relative error of `c` against a naive f64 dot product, over every element when C is small
/// and over a fixed spread of elements (the four corners included) otherwise.
fn max_relative_error(m: usize, n: usize, k: usize, a: &MatRef<'_>, b: &MatRef<'_>, c: &[f32]) -> f64 {
    let mut points: Vec<(usize, usize)> = if m * n <= CHECKED_ELEMENTS {
        (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).collect()
    } else {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        (0..CHECKED_ELEMENTS)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state % m as u64) as usize, ((state >> 32) % n as u64) as usize)
            })
            .collect()
    };
    points.extend([(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)]);
    points
        .into_iter()
        .map(|(i, j)| {
            let (mut sum, mut scale) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = f64::from(a.data[i * a.row_stride + p * a.col_stride]);
                let y = f64::from(b.data[p * b.row_stride + j * b.col_stride]);
                sum += x * y;
                scale += (x * y).abs();
            }
            (f64::from(c[i * n + j]) - sum).abs() / scale.max(f64::MIN_POSITIVE)
        })
        .fold(0.0, f64::max)
}

/// Which GEMM a sweep measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmDtype {
    F32,
    /// bf16 operands (rounded while packing), f32 accumulation: `gemm_bf16`.
    Bf16,
}

/// Validates and times every shape in every layout with the best kernel. Each (shape, layout)
/// gets one checked call, a warm-up, then samples of repeated calls until at least
/// `min_seconds` have passed and at least three samples exist; the fastest sample counts. The
/// bf16 GEMM is checked against the f64 products of its bf16-rounded inputs.
pub fn gemm_sweep(
    pool: &ThreadPool,
    shapes: &[(usize, usize, usize)],
    peak: &Peak,
    min_seconds: f64,
) -> Vec<GemmBenchRow> {
    gemm_sweep_dtype(pool, shapes, peak, min_seconds, GemmDtype::F32)
}

pub fn gemm_sweep_dtype(
    pool: &ThreadPool,
    shapes: &[(usize, usize, usize)],
    peak: &Peak,
    min_seconds: f64,
    dtype: GemmDtype,
) -> Vec<GemmBenchRow> {
    use crate::device::cpu::gemm_bf16::{best_bf16_kernel, from_bf16, gemm_bf16, to_bf16};
    let kernel_name = match dtype {
        GemmDtype::F32 => best_kernel().name(),
        GemmDtype::Bf16 => best_bf16_kernel().name(),
    };
    let round = |v: Vec<f32>| match dtype {
        GemmDtype::F32 => v,
        GemmDtype::Bf16 => v.into_iter().map(|x| from_bf16(to_bf16(x))).collect(),
    };
    let mut rows = Vec::new();
    for &(m, n, k) in shapes {
        if m == 0 || n == 0 || k == 0 {
            continue;
        }
        // Inputs already representable in bf16 make the bf16 check exact up to summation order.
        let a_data = round(fill(m * k, 1));
        let b_data = round(fill(k * n, 2));
        let mut c = vec![0.0f32; m * n];
        for layout in Layout::ALL {
            let a = layout.a_view(&a_data, m, k);
            let b = layout.b_view(&b_data, k, n);
            let call = |c: &mut [f32]| match dtype {
                GemmDtype::F32 => gemm(pool, m, n, k, a, b, c, n, false),
                GemmDtype::Bf16 => gemm_bf16(pool, m, n, k, a, b, c, n, false),
            };

            call(&mut c);
            let max_rel_err = max_relative_error(m, n, k, &a, &b, &c);

            // Size a sample to about a fifth of the budget so that there are several samples.
            let started = Instant::now();
            call(&mut c);
            let one_call = started.elapsed().as_secs_f64().max(1e-7);
            let calls_per_sample = ((min_seconds / 5.0) / one_call).ceil().max(1.0) as usize;
            let (mut best, mut spent, mut samples) = (f64::INFINITY, 0.0, 0);
            while samples < 3 || spent < min_seconds {
                let started = Instant::now();
                for _ in 0..calls_per_sample {
                    call(&mut c);
                }
                let seconds = started.elapsed().as_secs_f64();
                best = best.min(seconds / calls_per_sample as f64);
                spent += seconds;
                samples += 1;
            }

            let gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
            rows.push(GemmBenchRow {
                m,
                n,
                k,
                layout: layout.name(),
                kernel: kernel_name,
                gflops,
                fraction_of_peak: gflops / peak.gflops,
                max_rel_err,
            });
        }
    }
    rows
}

/// Prints the rows as an aligned table.
pub fn print_table(rows: &[GemmBenchRow]) {
    println!(
        "{:>6} {:>6} {:>6}  {:<6} {:<8} {:>9} {:>7} {:>11}",
        "M", "N", "K", "layout", "kernel", "GFLOP/s", "% peak", "max rel err"
    );
    for row in rows {
        println!(
            "{:>6} {:>6} {:>6}  {:<6} {:<8} {:>9.1} {:>6.1}% {:>11.2e}",
            row.m,
            row.n,
            row.k,
            row.layout,
            row.kernel,
            row.gflops,
            100.0 * row.fraction_of_peak,
            row.max_rel_err
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_validates_and_times_small_shapes() {
        let pool = ThreadPool::new(2);
        let peak = Peak { gflops: 100.0, gflops_per_thread: 50.0, threads: 2, isa: "test" };
        let rows = gemm_sweep(&pool, &[(33, 65, 17), (64, 64, 64)], &peak, 0.001);
        assert_eq!(rows.len(), 6);
        for row in &rows {
            assert!(row.gflops > 0.0, "{row:?}");
            assert!(row.max_rel_err < 1e-5, "{row:?}");
        }
        print_table(&rows);
    }
}
