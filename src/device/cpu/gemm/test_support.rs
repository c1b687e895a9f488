//! Test helpers shared by the f32 and the bf16 GEMM tests: operand storage, the f64 oracle and
//! one checked case.

use super::MatRef;
pub(crate) use crate::bench_gemm::fill;

/// How a test operand is stored: as the matrix itself or as its transpose.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Storage {
    RowMajor,
    Transposed,
}

pub(crate) fn view(data: &[f32], rows: usize, cols: usize, storage: Storage) -> MatRef<'_> {
    match storage {
        Storage::RowMajor => MatRef::row_major(data, cols),
        Storage::Transposed => MatRef::transposed(data, rows),
    }
}

pub(crate) const STORAGES: [(Storage, Storage); 4] = [
    (Storage::RowMajor, Storage::RowMajor),
    (Storage::RowMajor, Storage::Transposed),
    (Storage::Transposed, Storage::RowMajor),
    (Storage::Transposed, Storage::Transposed),
];

/// The oracle: f64 accumulation in the obvious order over the inputs as `input` maps them
/// (exactly, or rounded as a kernel rounds its operands). Returns the value and Σ|a·b| (the
/// scale that bounds the rounding error) for each element.
pub(crate) fn reference(
    (m, n, k): (usize, usize, usize),
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    input: impl Fn(f32) -> f64,
) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut scale) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = input(a.data[i * a.row_stride + p * a.col_stride]);
                let y = input(b.data[p * b.row_stride + j * b.col_stride]);
                sum += x * y;
                scale += (x * y).abs();
            }
            out[i * n + j] = (sum, scale);
        }
    }
    out
}

/// One case: A, B and C filled from the shape, `gemm(a, b, c, ldc)` run on them, and every
/// element of C checked against `reference` within `tolerance` relative to Σ|a·b| (plus |C|
/// when accumulating), with the padding columns beyond `n` untouched.
#[allow(clippy::too_many_arguments)] // One flat list of case parameters reads best here.
pub(crate) fn check_case(
    kernel: &str,
    (m, n, k): (usize, usize, usize),
    (a_storage, b_storage): (Storage, Storage),
    accumulate: bool,
    ldc_pad: usize,
    tolerance: f64,
    input: impl Fn(f32) -> f64,
    gemm: impl FnOnce(MatRef<'_>, MatRef<'_>, &mut [f32], usize),
) {
    let seed = (m * 1_000_003 + n * 1009 + k) as u64;
    let a_data = fill(m * k, seed);
    let b_data = fill(k * n, seed + 1);
    let a = view(&a_data, m, k, a_storage);
    let b = view(&b_data, k, n, b_storage);
    let ldc = n + ldc_pad;
    let initial = fill(m.max(1) * ldc, seed + 2);
    let mut c = initial.clone();
    gemm(a, b, &mut c, ldc);
    let expected = reference((m, n, k), &a, &b, input);
    for i in 0..m {
        for j in 0..ldc {
            let got = c[i * ldc + j] as f64;
            let before = initial[i * ldc + j] as f64;
            if j >= n {
                assert_eq!(got, before, "padding ({i},{j}) was written");
                continue;
            }
            let (sum, scale) = expected[i * n + j];
            let want = if accumulate { before + sum } else { sum };
            let error = (got - want).abs() / (scale + if accumulate { before.abs() } else { 0.0 } + 1e-30);
            assert!(
                error <= tolerance || (got - want).abs() < 1e-30,
                "{kernel} m={m} n={n} k={k} A {a_storage:?} B {b_storage:?} acc={accumulate} \
                 ldc={ldc}: C({i},{j}) = {got}, want {want} (relative error {error:e})"
            );
        }
    }
}
