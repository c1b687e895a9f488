//! Tests of the CPU GEMMs, f32 and bf16: every kernel of both against the f64 oracle on ragged
//! shapes, every layout and every blocking boundary, empty products, bit-identical results for
//! any thread count, and the task grid. (`gemm_bf16.rs` tests what only bf16 has: its rounding,
//! its AVX512-BF16 kernel and packing against the portable ones.)

use super::driver::Grid;
use super::test_support::{self, check_case, KernelUnderTest, Storage};
use super::*;
use crate::device::cpu::gemm_bf16::{best_bf16_kernel, from_bf16, gemm_bf16_with, to_bf16, Bf16Kernel};

impl KernelUnderTest for GemmKernel {
    const TOLERANCE: f64 = 4e-6;
    const GEMM: test_support::GemmWith<Self> = gemm_with;

    fn input(x: f32) -> f64 {
        x as f64
    }
}

/// Checked against the f64 oracle over the bf16-rounded inputs.
impl KernelUnderTest for Bf16Kernel {
    const TOLERANCE: f64 = 1e-5;
    const GEMM: test_support::GemmWith<Self> = gemm_bf16_with;

    fn input(x: f32) -> f64 {
        from_bf16(to_bf16(x)) as f64
    }
}

fn available_kernels() -> Vec<GemmKernel> {
    GemmKernel::ALL.into_iter().filter(|k| k.is_available()).collect()
}

fn bf16_kernels() -> Vec<Bf16Kernel> {
    let kernels: Vec<_> = Bf16Kernel::ALL.into_iter().filter(|k| k.is_available()).collect();
    for missing in Bf16Kernel::ALL.into_iter().filter(|k| !kernels.contains(k)) {
        eprintln!("note: this CPU (or TRIDENT_CPU_ISA) lacks {}: its bf16 kernel is not tested", missing.isa().name());
    }
    kernels
}

#[test]
fn matches_reference_on_edge_shapes() {
    let sizes = [1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 129];
    test_support::check_ragged_shapes(&available_kernels(), &sizes, &sizes);
    let (sizes, depths) = ([1, 7, 17, 33, 100, 257], [1, 3, 7, 17, 33, 101, 257]);
    test_support::check_ragged_shapes(&bf16_kernels(), &sizes, &depths);
}

#[test]
fn matches_reference_in_every_layout() {
    let shapes = [(257, 300, 129), (33, 257, 300), (300, 31, 257), (64, 129, 100)];
    test_support::check_every_layout(&available_kernels(), &shapes);
    let shapes = [(257, 100, 33), (33, 257, 101), (100, 17, 257), (7, 33, 1)];
    test_support::check_every_layout(&bf16_kernels(), &shapes);
}

#[test]
fn crosses_every_blocking_boundary() {
    // Deeper than KC (and, for bf16, odd), wider than NC and taller than MC for every kernel, so
    // that multi-block accumulation and the jc loop are exercised.
    let pool = ThreadPool::new(3);
    let (nt, tn) = ((Storage::RowMajor, Storage::Transposed), (Storage::Transposed, Storage::RowMajor));
    for kernel in available_kernels() {
        let kc = super::blocks(kernel).kc;
        assert!(kc < 800, "{kernel:?} kc {kc}: the cases below must cross it");
        check_case(kernel, &pool, (150, 3100, 800), nt, false, 0);
        check_case(kernel, &pool, (301, 70, 1100), tn, true, 5);
    }
    for kernel in bf16_kernels() {
        check_case(kernel, &pool, (150, 3100, 801), nt, false, 0);
        check_case(kernel, &pool, (301, 70, 1537), tn, true, 5);
    }
}

#[test]
fn empty_depth_zeroes_or_keeps_c() {
    test_support::check_empty_products(&available_kernels());
    test_support::check_empty_products(&bf16_kernels());
}

#[test]
fn bit_identical_for_any_thread_count() {
    let shapes = [(64, 768, 3072), (4096, 64, 256), (129, 257, 300), (300, 3100, 70)];
    test_support::check_thread_count_independence(&available_kernels(), &shapes);
    let shapes = [(64, 768, 3072), (1024, 64, 255), (129, 257, 301), (300, 3100, 71)];
    test_support::check_thread_count_independence(&bf16_kernels(), &shapes);
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
    assert!(best_bf16_kernel().is_available());
}

/// AVX2 blocking variants timed alternately (best of rounds), for tuning on a noisy machine:
/// `cargo test --release avx2_blocking_probe -- --ignored --nocapture`.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn avx2_blocking_probe() {
    use super::driver::{drive, Problem};
    struct V<const KC: usize, const MC: usize>;
    impl<const KC: usize, const MC: usize> MicroKernel for V<KC, MC> {
        const MR: usize = 6;
        const NR: usize = 16;
        const KC: usize = KC;
        const MC: usize = MC;
        const NC: usize = 3072;
        const AVX2_PACKING: bool = true;
        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
            unsafe { x86::tile_avx2::<6, false>(kc, a, b, c, ldc, acc) }
        }
    }
    if !GemmKernel::Avx2.is_available() {
        return;
    }
    let pool = ThreadPool::new(2);
    type Run = fn(&ThreadPool, &Problem);
    let variants: [(&str, Run); 5] = [
        ("kc256 mc96", |p, q| drive::<V<256, 96>>(p, q)),
        ("kc384 mc96", |p, q| drive::<V<384, 96>>(p, q)),
        ("kc512 mc96", |p, q| drive::<V<512, 96>>(p, q)),
        ("kc768 mc120", |p, q| drive::<V<768, 120>>(p, q)),
        ("kc384 mc192", |p, q| drive::<V<384, 192>>(p, q)),
    ];
    for (m, n, k) in [(2048, 2048, 2048), (256, 2304, 768), (256, 768, 3072), (256, 50304, 768)] {
        let a_data = test_support::fill(m * k, 1);
        let b_data = test_support::fill(k * n, 2);
        let mut c = vec![0.0f32; m * n];
        for (layout, (sa, sb)) in [
            ("NT", (Storage::RowMajor, Storage::Transposed)),
            ("NN", (Storage::RowMajor, Storage::RowMajor)),
            ("TN", (Storage::Transposed, Storage::RowMajor)),
        ] {
            let a = test_support::view(&a_data, m, k, sa);
            let b = test_support::view(&b_data, k, n, sb);
            let mut best = [f64::MAX; 5];
            for _ in 0..6 {
                for (i, (_, run)) in variants.iter().enumerate() {
                    let problem = Problem::new((m, n, k), a, b, (&mut c, n), false).unwrap();
                    let t = std::time::Instant::now();
                    run(&pool, &problem);
                    best[i] = best[i].min(t.elapsed().as_secs_f64());
                }
            }
            let flops = 2.0 * (m * n * k) as f64;
            let line: Vec<String> =
                variants.iter().zip(best).map(|((name, _), t)| format!("{name} {:.1}", flops / t / 1e9)).collect();
            println!("{m}x{n}x{k} {layout}: {}", line.join(" | "));
        }
    }
}
