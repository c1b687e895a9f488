//! f32 GEMM for the CPU backend: BLIS-style packing and cache blocking around run-time selected
//! AVX-512, AVX2+FMA and portable micro-kernels, parallel over independent blocks of C.
//!
//! `gemm` computes `C[i*ldc + j] = (accumulate ? C : 0) + Σ_p A(i,p)·B(p,j)` where each operand
//! is a strided view (`MatRef`), so the three products of a training step need no transposes:
//!
//! | product                     | A              | B              |
//! |-----------------------------|----------------|----------------|
//! | forward `X·Wᵀ` ("NT")       | strides (K, 1) | strides (1, K) |
//! | input grad `dY·W` ("NN")    | strides (K, 1) | strides (N, 1) |
//! | weight grad `dYᵀ·X` ("TN")  | strides (1, M) | strides (N, 1) |
//!
//! Parallel split: C is cut into one rectangle of whole `MR × NR` tiles per thread (`Grid`), in
//! M, in N or both, whichever balances best and packs least twice, and each task runs the whole
//! loop nest below on its rectangle with its own thread-local buffers. There is no barrier
//! inside a call and no thread reads another's packed data.
//!
//! Loop nest of one task, outermost first (names as in the BLIS papers):
//! 1. `jc` over column blocks of `NC` columns;
//! 2. `pc` over depth blocks of `KC`;
//! 3. `ic` over row blocks of `MC` rows: pack the `MC × KC` block of A into `MR`-tall slivers
//!    (it stays in L2), then run the micro-kernel over its tiles, B sliver outermost. During the
//!    first row block the `KC × NC` block of B is packed into `NR`-wide slivers just before each
//!    is first used, while the source of the next slivers is prefetched, so reading B from
//!    memory overlaps with arithmetic; later row blocks reuse the packed B.
//!
//! Packing handles every stride: unit stride along the tile's width is a streaming copy, unit
//! stride along the depth is a transpose (16×16 in registers on AVX-512), anything else a gather.
//!
//! Determinism: the depth blocking (`KC`), the tile grid and the order of every sum depend only on
//! the shape and the kernel, never on the thread count; threads only pick different, disjoint
//! rectangles of C. Results are therefore bit-identical for any pool size. Edge tiles run the same
//! micro-kernel into a scratch tile and then apply the same single add (or store) to C that a full
//! tile applies, so they round identically too.
//!
//! Tuning (AMD Zen 5 with AVX-512, 2 threads; see `trident bench gemm`): the AVX-512 kernel is 8 rows ×
//! 32 columns (16 zmm accumulators; 8 divides the token counts of typical micro-batches, and the
//! kernel alone runs at the FMA peak), KC = 768 (one depth block for d_model = 768, so C is read
//! and written once), MC = 128 and NC = 3072. The AVX2 kernel is 6 × 16 (12 ymm accumulators,
//! four depth steps per loop iteration) with KC = 256, MC = 96, NC = 3072; measured only under
//! `TRIDENT_CPU_ISA=avx2` on an Intel Xeon so far (BENCHMARKS.md), where only KC = 384, MC = 192
//! led, on the NT layer shapes, likely from that core's 48 KiB L1 (a Zen 3 has 32 KiB). A depth
//! block sized from the L1 (the 16-wide B sliver filling half of it: 384 there) was then tried
//! and dropped: GEMMs within noise, the gpt2-124m step 4-7% slower in three interleaved rounds.
//! KC fixes the f32 sum order, so it waited for an AMD core: on a Zen 4 under the cap (32 KiB L1,
//! a Zen 3's size) `avx2_blocking_probe` in `tests.rs` (which times variants side by side) had
//! KC = 256, MC = 96 leading or tied on every layer and vocabulary shape, so it stays (`trident
//! info` prints the blocking and the L1 size).
//!
//! Files: this one holds the API and the `MicroKernel` contract; `driver.rs` (the split and the
//! loop nest) uses `pack.rs` (packing), which uses `x86.rs`'s AVX-512 and AVX2 transposes; `portable.rs`
//! and `x86.rs` hold the micro-kernels.

pub(crate) mod driver;
pub(crate) mod pack;
pub(crate) mod portable;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
pub(crate) mod x86;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use super::isa::Isa;
use super::pool::ThreadPool;
use driver::{drive, Problem};

/// One register-blocked micro-kernel together with the cache blocking tuned for it.
pub(crate) trait MicroKernel {
    /// Rows of C per tile (A sliver height).
    const MR: usize;
    /// Columns of C per tile (B sliver width).
    const NR: usize;
    /// Depth block. It fixes the order of the sums, so it must not depend on the thread count.
    const KC: usize;
    /// Row block: an `MC × KC` packed A block should sit in L2. A multiple of `MR`.
    const MC: usize;
    /// Column block: the packed `KC × NC` B block, reused by every row block. A multiple of `NR`.
    const NC: usize;
    /// Whether packing may use AVX-512 transposes (bit-identical to the portable ones; only
    /// kernels that already require AVX-512 opt in, so the other kernels' tests cover the
    /// portable packing too).
    // Only x86 has AVX-512 packing to select, so elsewhere nothing reads this.
    #[cfg_attr(not(any(target_arch = "x86", target_arch = "x86_64")), allow(dead_code))]
    const AVX512_PACKING: bool = false;
    /// Whether packing may use AVX2 8×8 transposes (likewise bit-identical; the AVX2 kernels).
    #[cfg_attr(not(any(target_arch = "x86", target_arch = "x86_64")), allow(dead_code))]
    const AVX2_PACKING: bool = false;

    /// Computes the `MR × NR` tile `acc = Σ_p a[p*MR + r] · b[p*NR + j]` over `kc` steps, then
    /// stores `C = acc` or, when `accumulate`, `C = C + acc` (one rounding per element).
    ///
    /// # Safety
    /// `a` holds `kc * MR` and `b` holds `kc * NR` readable floats, C rows `0..MR` with stride
    /// `ldc` have `NR` writable floats each, and the CPU supports the kernel's instructions.
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool);
}

/// A kernel's cache blocking (`MicroKernel::KC`, `MC` and `NC`), for `info` and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks {
    pub kc: usize,
    pub mc: usize,
    pub nc: usize,
}

/// The blocking `kernel` runs with.
pub fn blocks(kernel: GemmKernel) -> Blocks {
    fn of<K: MicroKernel>() -> Blocks {
        Blocks { kc: K::KC, mc: K::MC, nc: K::NC }
    }
    match kernel {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        GemmKernel::Avx512 => of::<x86::Avx512>(),
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        GemmKernel::Avx2 => of::<x86::Avx2>(),
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        GemmKernel::Avx512 | GemmKernel::Avx2 => of::<portable::Portable>(),
        GemmKernel::Portable => of::<portable::Portable>(),
    }
}

/// A read-only strided matrix view: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
/// Its elements are f32, or (an operand of the bf16 GEMM only) bf16 bits.
#[derive(Debug)]
pub struct MatRef<'a, T = f32> {
    pub data: &'a [T],
    pub row_stride: usize,
    pub col_stride: usize,
}

// Manual impls: a view is a slice and two strides, copyable whatever `T` is.
impl<T> Clone for MatRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MatRef<'_, T> {}

impl<'a, T> MatRef<'a, T> {
    /// A row-major matrix with `cols` columns per row.
    pub fn row_major(data: &'a [T], cols: usize) -> MatRef<'a, T> {
        MatRef { data, row_stride: cols, col_stride: 1 }
    }

    /// A view with `rows` rows whose storage is its transpose in row-major order, i.e. element
    /// `(i, j)` is `data[j * rows + i]` (a weight `[out, in]` seen as `in × out`).
    pub fn transposed(data: &'a [T], rows: usize) -> MatRef<'a, T> {
        MatRef { data, row_stride: 1, col_stride: rows }
    }
}

/// The micro-kernel families; `best_kernel` picks the fastest the CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    Avx512,
    Avx2,
    Portable,
}

impl GemmKernel {
    /// Every kernel, fastest first.
    pub const ALL: [GemmKernel; 3] = [GemmKernel::Avx512, GemmKernel::Avx2, GemmKernel::Portable];

    /// A short name for logs and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Avx512 => "avx512",
            GemmKernel::Avx2 => "avx2",
            GemmKernel::Portable => "portable",
        }
    }

    /// The instruction-set level the kernel needs.
    pub fn isa(self) -> Isa {
        match self {
            GemmKernel::Avx512 => Isa::Avx512,
            GemmKernel::Avx2 => Isa::Avx2,
            GemmKernel::Portable => Isa::Portable,
        }
    }

    /// Whether this CPU can run the kernel at the level `TRIDENT_CPU_ISA` allows (`isa::active`).
    pub fn is_available(self) -> bool {
        self.isa() <= super::isa::active()
    }
}

/// The fastest kernel this CPU supports, detected once.
pub fn best_kernel() -> GemmKernel {
    static BEST: OnceLock<GemmKernel> = OnceLock::new();
    *BEST.get_or_init(|| {
        GemmKernel::ALL.into_iter().find(|kernel| kernel.is_available()).unwrap_or(GemmKernel::Portable)
    })
}

/// `C = (accumulate ? C : 0) + A·B` for an `m × k` view A, a `k × n` view B and a row-major C
/// with row stride `ldc`, using the best kernel for this CPU.
#[allow(clippy::too_many_arguments)] // The BLAS argument list is the clearest form for callers.
pub fn gemm(
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_with(best_kernel(), pool, m, n, k, a, b, c, ldc, accumulate);
}

/// `gemm` with an explicit micro-kernel, for tests and benchmarks. Panics if the CPU cannot run
/// `kernel` (check `GemmKernel::is_available` first) or if a slice is too short for its shape.
#[allow(clippy::too_many_arguments)] // The BLAS argument list is the clearest form for callers.
pub fn gemm_with(
    kernel: GemmKernel,
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(kernel.is_available(), "GEMM kernel {} is not supported by this CPU", kernel.name());
    let Some(problem) = Problem::new((m, n, k), a, b, (c, ldc), accumulate) else { return };
    match kernel {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        GemmKernel::Avx512 => drive::<x86::Avx512>(pool, &problem),
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        GemmKernel::Avx2 => drive::<x86::Avx2>(pool, &problem),
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        GemmKernel::Avx512 | GemmKernel::Avx2 => unreachable!("checked by is_available above"),
        GemmKernel::Portable => drive::<portable::Portable>(pool, &problem),
    }
}
