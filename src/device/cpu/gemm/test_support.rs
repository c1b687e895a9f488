//! The GEMM tests' shared bodies, run by the f32 and the bf16 tests on each of their kernels
//! (`KernelUnderTest`): operand storage, the f64 oracle, one checked case, ragged shapes, every
//! layout, empty products and thread-count independence.

use super::MatRef;
use crate::device::cpu::pool::ThreadPool;
pub(crate) use crate::rng::fill;

/// A GEMM entry point with an explicit kernel, `gemm_with` or `gemm_bf16_with`.
pub(crate) type GemmWith<K> = fn(K, &ThreadPool, usize, usize, usize, MatRef, MatRef, &mut [f32], usize, bool);

/// A GEMM kernel the shared cases run: each f32 kernel and each bf16 one.
pub(crate) trait KernelUnderTest: Copy + std::fmt::Debug {
    /// The error allowed against the oracle, relative to Σ|a·b|, per √k.
    const TOLERANCE: f64;
    /// The GEMM that runs the kernel.
    const GEMM: GemmWith<Self>;
    /// An input as the kernel multiplies it: exactly, or rounded as it rounds its operands.
    fn input(x: f32) -> f64;

    /// `C = (accumulate ? C : 0) + A·B` with this kernel, C with row stride `ldc`.
    fn gemm(
        self,
        pool: &ThreadPool,
        (m, n, k): (usize, usize, usize),
        a: MatRef,
        b: MatRef,
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        Self::GEMM(self, pool, m, n, k, a, b, c, ldc, accumulate)
    }
}

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

/// One case: A, B and C filled from the shape, the kernel run on them, and every element of C
/// checked against `reference` within the kernel's tolerance relative to Σ|a·b| (plus |C| when
/// accumulating), with the padding columns beyond `n` untouched.
pub(crate) fn check_case<K: KernelUnderTest>(
    kernel: K,
    pool: &ThreadPool,
    (m, n, k): (usize, usize, usize),
    (a_storage, b_storage): (Storage, Storage),
    accumulate: bool,
    ldc_pad: usize,
) {
    let tolerance = K::TOLERANCE * (k.max(1) as f64).sqrt();
    let seed = (m * 1_000_003 + n * 1009 + k) as u64;
    let a_data = fill(m * k, seed);
    let b_data = fill(k * n, seed + 1);
    let a = view(&a_data, m, k, a_storage);
    let b = view(&b_data, k, n, b_storage);
    let ldc = n + ldc_pad;
    let initial = fill(m.max(1) * ldc, seed + 2);
    let mut c = initial.clone();
    kernel.gemm(pool, (m, n, k), a, b, (&mut c, ldc), accumulate);
    let expected = reference((m, n, k), &a, &b, K::input);
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
                "{kernel:?} m={m} n={n} k={k} A {a_storage:?} B {b_storage:?} acc={accumulate} \
                 ldc={ldc}: C({i},{j}) = {got}, want {want} (relative error {error:e})"
            );
        }
    }
}

/// C (filled from seed 13) after `C += A·B` with A and B filled from seeds 11 and 12: what the
/// thread-count tests compare bit for bit.
pub(crate) fn run<K: KernelUnderTest>(
    kernel: K,
    pool: &ThreadPool,
    (m, n, k): (usize, usize, usize),
    (a_storage, b_storage): (Storage, Storage),
) -> Vec<f32> {
    let a_data = fill(m * k, 11);
    let b_data = fill(k * n, 12);
    let a = view(&a_data, m, k, a_storage);
    let b = view(&b_data, k, n, b_storage);
    let mut c = fill(m * n, 13);
    kernel.gemm(pool, (m, n, k), a, b, (&mut c, n), true);
    c
}

/// Whether two results are equal bit for bit.
pub(crate) fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Each of `sizes` as m, paired with a rotating n (from `sizes`) and k (from `depths`) so the
/// cases mix without a full cube, in rotating storages, overwriting and accumulating, with C
/// padded or not.
pub(crate) fn check_ragged_shapes<K: KernelUnderTest>(kernels: &[K], sizes: &[usize], depths: &[usize]) {
    let pool = ThreadPool::new(2);
    for &kernel in kernels {
        for (index, &m) in sizes.iter().enumerate() {
            for step in 0..sizes.len() {
                let n = sizes[(index + step) % sizes.len()];
                let k = depths[(index * 3 + step * 5) % depths.len()];
                let storage = STORAGES[(index + step) % 4];
                check_case(kernel, &pool, (m, n, k), storage, step % 2 == 1, step % 3);
            }
        }
    }
}

/// Each of `shapes` in every storage of A and B, overwriting and accumulating into a padded C.
pub(crate) fn check_every_layout<K: KernelUnderTest>(kernels: &[K], shapes: &[(usize, usize, usize)]) {
    let pool = ThreadPool::new(2);
    for &kernel in kernels {
        for &shape in shapes {
            for storage in STORAGES {
                for accumulate in [false, true] {
                    check_case(kernel, &pool, shape, storage, accumulate, 3);
                }
            }
        }
    }
}

/// An empty depth zeroes C or, accumulating, keeps it (padding untouched either way); zero rows
/// or columns leave C alone, even a C that is empty.
pub(crate) fn check_empty_products<K: KernelUnderTest>(kernels: &[K]) {
    let pool = ThreadPool::new(2);
    for &kernel in kernels {
        let mut c = vec![5.0f32; 3 * 6];
        let empty = MatRef::row_major(&[], 0);
        kernel.gemm(&pool, (3, 4, 0), empty, empty, (&mut c, 6), true);
        assert!(c.iter().all(|&x| x == 5.0));
        kernel.gemm(&pool, (3, 4, 0), empty, empty, (&mut c, 6), false);
        for (index, &x) in c.iter().enumerate() {
            assert_eq!(x, if index % 6 < 4 { 0.0 } else { 5.0 });
        }
        kernel.gemm(&pool, (0, 4, 3), empty, MatRef::row_major(&[1.0; 12], 4), (&mut [], 4), false);
        kernel.gemm(&pool, (2, 0, 3), MatRef::row_major(&[1.0; 6], 3), empty, (&mut [], 0), false);
    }
}

/// Each of `shapes` in every storage gives the same bits on 1, 2 and 3 threads.
pub(crate) fn check_thread_count_independence<K: KernelUnderTest>(kernels: &[K], shapes: &[(usize, usize, usize)]) {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for &kernel in kernels {
        for &shape in shapes {
            for storage in STORAGES {
                let results: Vec<Vec<f32>> = pools.iter().map(|pool| run(kernel, pool, shape, storage)).collect();
                for other in &results[1..] {
                    assert!(same_bits(&results[0], other), "{kernel:?} {shape:?} differs across thread counts");
                }
            }
        }
    }
}
