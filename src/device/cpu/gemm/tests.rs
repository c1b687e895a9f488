//! Tests of the f32 GEMM: every kernel against the f64 oracle on edge shapes, every layout and
//! every blocking boundary, empty depths, bit-identical results for any thread count, and the
//! task grid.

use super::driver::Grid;
use super::test_support::{self, fill, view, Storage, STORAGES};
use super::*;

#[allow(clippy::too_many_arguments)] // One flat list of case parameters reads best here.
fn check_case(
    kernel: GemmKernel,
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    a_storage: Storage,
    b_storage: Storage,
    accumulate: bool,
    ldc_pad: usize,
) {
    let tolerance = 4e-6 * (k.max(1) as f64).sqrt();
    test_support::check_case(
        &format!("{kernel:?}"),
        (m, n, k),
        (a_storage, b_storage),
        accumulate,
        ldc_pad,
        tolerance,
        |x| x as f64,
        |a, b, c, ldc| gemm_with(kernel, pool, m, n, k, a, b, c, ldc, accumulate),
    );
}

fn available_kernels() -> Vec<GemmKernel> {
    GemmKernel::ALL.into_iter().filter(|k| k.is_available()).collect()
}

#[test]
fn matches_reference_on_edge_shapes() {
    let pool = ThreadPool::new(2);
    let sizes = [1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 129];
    for kernel in available_kernels() {
        for (index, &m) in sizes.iter().enumerate() {
            // Pair every m with a rotating n and k so the cases mix without a full cube.
            for step in 0..sizes.len() {
                let n = sizes[(index + step) % sizes.len()];
                let k = sizes[(index * 3 + step * 5) % sizes.len()];
                let (a_storage, b_storage) = STORAGES[(index + step) % 4];
                let accumulate = step % 2 == 1;
                check_case(kernel, &pool, m, n, k, a_storage, b_storage, accumulate, step % 3);
            }
        }
    }
}

#[test]
fn matches_reference_in_every_layout() {
    let pool = ThreadPool::new(2);
    let shapes = [(257, 300, 129), (33, 257, 300), (300, 31, 257), (64, 129, 100)];
    for kernel in available_kernels() {
        for &(m, n, k) in &shapes {
            for (a_storage, b_storage) in STORAGES {
                for accumulate in [false, true] {
                    check_case(kernel, &pool, m, n, k, a_storage, b_storage, accumulate, 3);
                }
            }
        }
    }
}

#[test]
fn crosses_every_blocking_boundary() {
    // Deeper than KC, wider than NC and taller than MC for every kernel, so that
    // multi-block accumulation and the jc loop are exercised.
    let pool = ThreadPool::new(3);
    for kernel in available_kernels() {
        check_case(kernel, &pool, 150, 3100, 600, Storage::RowMajor, Storage::Transposed, false, 0);
        check_case(kernel, &pool, 301, 70, 530, Storage::Transposed, Storage::RowMajor, true, 5);
    }
}

#[test]
fn empty_depth_zeroes_or_keeps_c() {
    let pool = ThreadPool::new(2);
    for kernel in available_kernels() {
        let mut c = vec![5.0f32; 3 * 6];
        let empty = MatRef::row_major(&[], 0);
        gemm_with(kernel, &pool, 3, 4, 0, empty, empty, &mut c, 6, true);
        assert!(c.iter().all(|&x| x == 5.0));
        gemm_with(kernel, &pool, 3, 4, 0, empty, empty, &mut c, 6, false);
        for (index, &x) in c.iter().enumerate() {
            assert_eq!(x, if index % 6 < 4 { 0.0 } else { 5.0 });
        }
        // Zero rows or columns leave C alone, even a C that is empty.
        gemm_with(kernel, &pool, 0, 4, 3, empty, MatRef::row_major(&[1.0; 12], 4), &mut [], 4, false);
        gemm_with(kernel, &pool, 2, 0, 3, MatRef::row_major(&[1.0; 6], 3), empty, &mut [], 0, false);
    }
}

#[test]
fn bit_identical_for_any_thread_count() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let shapes = [(64, 768, 3072), (4096, 64, 256), (129, 257, 300), (300, 3100, 70)];
    for kernel in available_kernels() {
        for &(m, n, k) in &shapes {
            for (a_storage, b_storage) in STORAGES {
                let a_data = fill(m * k, 11);
                let b_data = fill(k * n, 12);
                let a = view(&a_data, m, k, a_storage);
                let b = view(&b_data, k, n, b_storage);
                let results: Vec<Vec<f32>> = pools
                    .iter()
                    .map(|pool| {
                        let mut c = fill(m * n, 13);
                        gemm_with(kernel, pool, m, n, k, a, b, &mut c, n, true);
                        c
                    })
                    .collect();
                for other in &results[1..] {
                    let same = results[0].iter().zip(other).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{kernel:?} {m}x{n}x{k} differs across thread counts");
                }
            }
        }
    }
}

#[test]
fn skinny_shapes_use_every_thread() {
    // Small M with large N must split columns, large M with small N must split rows, and
    // every tile must belong to exactly one task.
    for &(m, n, mr, nr) in &[
        // (m, n, MR, NR)
        (64, 768, 8, 32),
        (4096, 64, 8, 32),
        (256, 50304, 8, 32),
        (7, 9, 6, 16),
    ] {
        let (row_tiles, col_tiles): (usize, usize) = (usize::div_ceil(m, mr), usize::div_ceil(n, nr));
        for threads in [2, 3] {
            let grid = Grid::choose(row_tiles, col_tiles, threads, m, n);
            let tasks = grid.rows * grid.cols;
            assert!(tasks >= threads.min(row_tiles * col_tiles), "{m}x{n}: {grid:?}");
            let mut owner = vec![0u32; row_tiles * col_tiles];
            for task in 0..tasks {
                let (rows, cols) = grid.task(task, row_tiles, col_tiles);
                for r in rows {
                    for c in cols.clone() {
                        owner[r * col_tiles + c] += 1;
                    }
                }
            }
            assert!(owner.iter().all(|&count| count == 1), "{m}x{n}: {grid:?}");
        }
    }
    assert_eq!(Grid::choose(8, 24, 2, 64, 768), Grid { rows: 1, cols: 2 });
    assert_eq!(Grid::choose(512, 2, 2, 4096, 64), Grid { rows: 2, cols: 1 });
}

#[test]
fn best_kernel_is_available() {
    assert!(best_kernel().is_available());
}
