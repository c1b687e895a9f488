//! f32 GEMM for the CPU backend: BLIS-style packing and cache blocking around run-time selected
//! AVX-512, AVX2+FMA and portable micro-kernels, parallel over independent blocks of C.
//!
//! `gemm` computes `C[i*ldc + j] = (accumulate ? C : 0) + Σ_p A(i,p)·B(p,j)` where each operand
//! is a strided view (`MatRef`), so the three products of a training step need no transposes:
//!
//! | product                | A              | B              |
//! |------------------------|----------------|----------------|
//! | forward `X·Wᵀ` ("NT")  | strides (K, 1) | strides (1, K) |
//! | input grad `dY·W` ("NN") | strides (K, 1) | strides (N, 1) |
//! | weight grad `dYᵀ·X` ("TN") | strides (1, M) | strides (N, 1) |
//!
//! Loop nest, outermost first (names as in the BLIS papers):
//! 1. `jc` over column blocks of `NC` columns of C and B;
//! 2. `pc` over depth blocks of `KC`; the `KC × NC` block of B is packed once into `NR`-wide
//!    slivers, in parallel over slivers, into a buffer every thread reads;
//! 3. the `M × NC` block of C is cut into tasks of up to `MC` rows by a range of slivers; each task
//!    packs its `MC × KC` block of A into `MR`-tall slivers (in its own thread-local buffer, sized
//!    for L2) and runs the micro-kernel over `MR × NR` tiles, B sliver outermost so that it stays
//!    in L1 while the A slivers stream from L2.
//!
//! Determinism: the depth blocking (`KC`), the tile grid and the order of every sum depend only on
//! the shape and the kernel, never on the thread count; threads only pick up different, disjoint
//! blocks of C. Results are therefore bit-identical for any pool size. Edge tiles run the same
//! micro-kernel into a scratch tile and then apply the same single add (or store) to C that a full
//! tile applies, so they round identically too.

use std::cell::RefCell;
use std::sync::OnceLock;

use super::pool::ThreadPool;

/// A read-only strided matrix view: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix with `cols` columns per row.
    pub fn row_major(data: &'a [f32], cols: usize) -> MatRef<'a> {
        MatRef { data, row_stride: cols, col_stride: 1 }
    }

    /// A view with `rows` rows whose storage is its transpose in row-major order, i.e. element
    /// `(i, j)` is `data[j * rows + i]` (a weight `[out, in]` seen as `in × out`).
    pub fn transposed(data: &'a [f32], rows: usize) -> MatRef<'a> {
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

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            GemmKernel::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            GemmKernel::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            GemmKernel::Avx512 | GemmKernel::Avx2 => false,
            GemmKernel::Portable => true,
        }
    }
}

/// The fastest kernel this CPU supports, detected once.
pub fn best_kernel() -> GemmKernel {
    static BEST: OnceLock<GemmKernel> = OnceLock::new();
    *BEST.get_or_init(|| {
        GemmKernel::ALL
            .into_iter()
            .find(|kernel| kernel.is_available())
            .unwrap_or(GemmKernel::Portable)
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
    check_view("A", &a, m, k);
    check_view("B", &b, k, n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n, "GEMM: ldc {ldc} is smaller than n {n}");
    let c_needed = (m - 1)
        .checked_mul(ldc)
        .and_then(|x| x.checked_add(n))
        .expect("GEMM: C extent overflows usize");
    assert!(c.len() >= c_needed, "GEMM: C has {} elements, needs {c_needed}", c.len());

    if k == 0 {
        // An empty sum: C keeps its value when accumulating and becomes zero otherwise.
        if !accumulate {
            c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }

    let problem = Problem { m, n, k, a, b, c: SharedMut(c.as_mut_ptr()), ldc, accumulate };
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

/// Asserts that every element of a `rows × cols` view lies inside its slice, which is what makes
/// the unchecked reads in the packing routines sound.
fn check_view(name: &str, view: &MatRef<'_>, rows: usize, cols: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    let last = (rows - 1)
        .checked_mul(view.row_stride)
        .and_then(|r| (cols - 1).checked_mul(view.col_stride).and_then(|c| r.checked_add(c)))
        .unwrap_or_else(|| panic!("GEMM: {name} extent overflows usize"));
    assert!(
        last < view.data.len(),
        "GEMM: {name} is {rows}x{cols} with strides ({}, {}) but its slice has only {} elements",
        view.row_stride,
        view.col_stride,
        view.data.len()
    );
}

/// A raw pointer that tasks on several threads may hold at once. Every task writes a disjoint
/// region through it; `ThreadPool::run` returning orders those writes before the caller's reads.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);

// SAFETY: the pointer is only dereferenced at indices that the GEMM partitions among tasks, so no
// two threads touch the same element concurrently.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// Taking `self` by value makes closures capture the whole wrapper, not the bare pointer.
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// The validated arguments of one GEMM call.
struct Problem<'a> {
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'a>,
    b: MatRef<'a>,
    c: SharedMut,
    ldc: usize,
    accumulate: bool,
}

/// One register-blocked micro-kernel together with the cache blocking tuned for it.
trait MicroKernel {
    /// Rows of C per tile (A sliver height).
    const MR: usize;
    /// Columns of C per tile (B sliver width).
    const NR: usize;
    /// Depth block: a `KC × NR` B sliver should sit comfortably in L1.
    const KC: usize;
    /// Row block: an `MC × KC` packed A block should sit in L2. A multiple of `MR`.
    const MC: usize;
    /// Column block: the shared packed `KC × NC` B block. A multiple of `NR`.
    const NC: usize;

    /// Computes the `MR × NR` tile `acc = Σ_p a[p*MR + r] · b[p*NR + j]` over `kc` steps, then
    /// stores `C = acc` or, when `accumulate`, `C = C + acc` (one rounding per element).
    ///
    /// # Safety
    /// `a` holds `kc * MR` and `b` holds `kc * NR` readable floats, C rows `0..MR` with stride
    /// `ldc` have `NR` writable floats each, and the CPU supports the kernel's instructions.
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool);
}

/// Below this many multiply-adds a GEMM runs on the calling thread alone: waking a worker costs
/// more than it saves. The cut-off cannot change results, only speed.
const PARALLEL_MIN_MACS: usize = 1 << 17;

/// Runs `tasks` tasks on the pool, or inline when the problem is too small to split.
fn run_tasks(pool: &ThreadPool, parallel: bool, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    if parallel {
        pool.run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// The largest tile any kernel uses, for the scratch tile of edge tiles.
const MAX_TILE: usize = 16 * 64;

/// A 64-byte aligned scratch tile for edge tiles.
#[repr(C, align(64))]
struct EdgeTile([f32; MAX_TILE]);

/// A growable f32 buffer whose working slice starts on a 64-byte boundary, so that packed
/// slivers never straddle cache lines.
#[derive(Default)]
struct AlignedBuffer {
    storage: Vec<f32>,
}

impl AlignedBuffer {
    const ALIGN_FLOATS: usize = 16;

    fn slice(&mut self, len: usize) -> &mut [f32] {
        if self.storage.len() < len + Self::ALIGN_FLOATS {
            self.storage = vec![0.0; len + Self::ALIGN_FLOATS];
        }
        let offset = self.storage.as_ptr().align_offset(64).min(Self::ALIGN_FLOATS);
        &mut self.storage[offset..offset + len]
    }
}

thread_local! {
    /// Each thread's packed A block, reused across calls so that steady-state GEMMs never touch
    /// the allocator or fault in fresh pages.
    static PACKED_A: RefCell<AlignedBuffer> = RefCell::new(AlignedBuffer::default());
    /// The calling thread's packed B block, shared read-only with the workers during a call.
    static PACKED_B: RefCell<AlignedBuffer> = RefCell::new(AlignedBuffer::default());
}

/// Runs `body` with a thread-local buffer of `len` floats, or a fresh one if that buffer is
/// already in use further up this thread's stack.
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<RefCell<AlignedBuffer>>,
    len: usize,
    body: impl FnOnce(&mut [f32]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => body(buffer.slice(len)),
        Err(_) => body(AlignedBuffer::default().slice(len)),
    })
}

fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// The blocked, parallel GEMM driver for one micro-kernel.
fn drive<K: MicroKernel>(pool: &ThreadPool, p: &Problem<'_>) {
    let (mr, nr) = (K::MR, K::NR);
    debug_assert!(mr * nr <= MAX_TILE && K::MC % mr == 0 && K::NC % nr == 0);
    let threads = pool.threads();
    let parallel = threads > 1 && p.m.saturating_mul(p.n).saturating_mul(p.k) >= PARALLEL_MIN_MACS;
    let kc_max = K::KC.min(p.k);
    let nc_max = div_ceil(K::NC.min(p.n), nr) * nr;

    with_buffer(&PACKED_B, kc_max * nc_max, |packed_b| {
        for jc in (0..p.n).step_by(K::NC) {
            let nc = K::NC.min(p.n - jc);
            let slivers = div_ceil(nc, nr);
            for pc in (0..p.k).step_by(K::KC) {
                let kc = K::KC.min(p.k - pc);
                let packed_b = &mut packed_b[..slivers * kc * nr];

                // Pack B: each task packs a contiguous run of slivers into its own region.
                let per_task = div_ceil(slivers, if parallel { 4 * threads } else { 1 });
                let b_tasks = div_ceil(slivers, per_task);
                let b_out = SharedMut(packed_b.as_mut_ptr());
                run_tasks(pool, parallel, b_tasks, &|task| {
                    let first = task * per_task;
                    for s in first..(first + per_task).min(slivers) {
                        let j0 = jc + s * nr;
                        let width = nr.min(jc + nc - j0);
                        // SAFETY: sliver `s` owns `kc * nr` floats at offset `s * kc * nr` of
                        // the packed buffer, and slivers are split disjointly among tasks.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(b_out.ptr().add(s * kc * nr), kc * nr)
                        };
                        // B(p, j) with j as the "wide" index and p as the "deep" index.
                        let base = pc * p.b.row_stride + j0 * p.b.col_stride;
                        pack_panel(p.b.data, base, p.b.col_stride, p.b.row_stride, width, nr, kc, dst);
                    }
                });

                // Compute: a grid of row blocks × sliver ranges, enough tasks to balance threads.
                let packed_b: &[f32] = packed_b;
                let row_blocks = div_ceil(p.m, K::MC);
                let col_blocks = if parallel {
                    div_ceil(4 * threads, row_blocks).clamp(1, slivers)
                } else {
                    1
                };
                let accumulate = p.accumulate || pc > 0;
                run_tasks(pool, parallel, row_blocks * col_blocks, &|task| {
                    let (row_block, col_block) = (task / col_blocks, task % col_blocks);
                    let i0 = row_block * K::MC;
                    let mc = K::MC.min(p.m - i0);
                    let s_begin = col_block * slivers / col_blocks;
                    let s_end = (col_block + 1) * slivers / col_blocks;
                    with_buffer(&PACKED_A, div_ceil(mc, mr) * mr * kc, |packed_a| {
                        for (r, dst) in packed_a.chunks_exact_mut(mr * kc).enumerate() {
                            let row = i0 + r * mr;
                            let height = mr.min(i0 + mc - row);
                            let base = row * p.a.row_stride + pc * p.a.col_stride;
                            pack_panel(p.a.data, base, p.a.row_stride, p.a.col_stride, height, mr, kc, dst);
                        }
                        macro_kernel::<K>(
                            p,
                            packed_a,
                            packed_b,
                            kc,
                            i0,
                            mc,
                            jc,
                            nc,
                            s_begin..s_end,
                            accumulate,
                        );
                    });
                });
            }
        }
    });
}

/// Multiplies one packed `mc × kc` A block by the packed B slivers `slivers` and applies the
/// result to C rows `i0..i0 + mc`.
#[allow(clippy::too_many_arguments)] // Internal; the block coordinates read best spelled out.
fn macro_kernel<K: MicroKernel>(
    p: &Problem<'_>,
    packed_a: &[f32],
    packed_b: &[f32],
    kc: usize,
    i0: usize,
    mc: usize,
    jc: usize,
    nc: usize,
    slivers: std::ops::Range<usize>,
    accumulate: bool,
) {
    let (mr, nr) = (K::MR, K::NR);
    let mut edge = EdgeTile([0.0; MAX_TILE]);
    for s in slivers {
        let b = packed_b[s * kc * nr..(s + 1) * kc * nr].as_ptr();
        let j0 = jc + s * nr;
        let width = nr.min(jc + nc - j0);
        for (r, a) in packed_a.chunks_exact(mr * kc).enumerate() {
            let row = i0 + r * mr;
            let height = mr.min(i0 + mc - row);
            // SAFETY: `row < m` and `j0 < n`, so the tile origin lies inside C (checked against
            // the slice length at entry); this task owns rows i0..i0+mc of these columns.
            let c = unsafe { p.c.ptr().add(row * p.ldc + j0) };
            if height == mr && width == nr {
                // SAFETY: a full tile lies inside C; the packed slivers hold kc*MR and kc*NR
                // floats; `drive` is only instantiated for kernels the CPU supports.
                unsafe { K::tile(kc, a.as_ptr(), b, c, p.ldc, accumulate) };
            } else {
                // SAFETY: the scratch tile holds MR*NR floats with row stride NR.
                unsafe { K::tile(kc, a.as_ptr(), b, edge.0.as_mut_ptr(), nr, false) };
                for i in 0..height {
                    for j in 0..width {
                        let value = edge.0[i * nr + j];
                        // SAFETY: (i, j) is inside the valid part of the tile, inside C.
                        unsafe {
                            let out = c.add(i * p.ldc + j);
                            *out = if accumulate { *out + value } else { value };
                        }
                    }
                }
            }
        }
    }
}

/// Packs a `width × kc` slab of a strided matrix into one sliver laid out as `dst[q*W + w]`,
/// where `w` walks the "wide" index (stride `wide_stride`) and `q` the depth (stride
/// `deep_stride`), starting at `src[base]`. Lanes `width..W` are zero.
#[allow(clippy::too_many_arguments)] // Internal; the strides read best spelled out.
fn pack_panel(
    src: &[f32],
    base: usize,
    wide_stride: usize,
    deep_stride: usize,
    width: usize,
    lanes: usize,
    kc: usize,
    dst: &mut [f32],
) {
    debug_assert!(dst.len() == kc * lanes && width <= lanes && width > 0 && kc > 0);
    // The entry check proved every element of the view is in bounds; this re-check of the two
    // extreme corners of this slab keeps the unchecked reads below locally sound.
    let last = base + (width - 1) * wide_stride + (kc - 1) * deep_stride;
    assert!(last < src.len());
    let src = &src[base..=last];
    if width < lanes {
        dst.fill(0.0);
    }
    if wide_stride == 1 {
        // Contiguous along the wide index: each depth step is one short copy.
        for (q, out) in dst.chunks_exact_mut(lanes).enumerate() {
            let start = q * deep_stride;
            out[..width].copy_from_slice(&src[start..start + width]);
        }
    } else if deep_stride == 1 {
        // Contiguous along depth: a transpose. Reading each source row sequentially and
        // scattering with stride `lanes` keeps the reads streaming; the sliver fits in L1.
        for w in 0..width {
            let row = &src[w * wide_stride..w * wide_stride + kc];
            for (q, &value) in row.iter().enumerate() {
                // SAFETY: q < kc and w < lanes, so q*lanes + w < kc*lanes = dst.len().
                unsafe { *dst.get_unchecked_mut(q * lanes + w) = value };
            }
        }
    } else {
        for (q, out) in dst.chunks_exact_mut(lanes).enumerate() {
            for (w, slot) in out[..width].iter_mut().enumerate() {
                *slot = src[w * wide_stride + q * deep_stride];
            }
        }
    }
}

/// Plain-Rust kernel for any target: fixed-size arrays that the compiler keeps in vector
/// registers of whatever width the baseline target has.
mod portable {
    use super::MicroKernel;

    pub struct Portable;

    const MR: usize = 4;
    const NR: usize = 8;

    impl MicroKernel for Portable {
        const MR: usize = MR;
        const NR: usize = NR;
        const KC: usize = 256;
        const MC: usize = 128;
        const NC: usize = 2048;

        unsafe fn tile(
            kc: usize,
            a: *const f32,
            b: *const f32,
            c: *mut f32,
            ldc: usize,
            accumulate: bool,
        ) {
            // SAFETY: the caller guarantees kc*MR and kc*NR readable floats.
            let (a, b) = unsafe {
                (std::slice::from_raw_parts(a, kc * MR), std::slice::from_raw_parts(b, kc * NR))
            };
            let mut acc = [[0.0f32; NR]; MR];
            for (a_step, b_step) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
                for (acc_row, &a_value) in acc.iter_mut().zip(a_step) {
                    for (slot, &b_value) in acc_row.iter_mut().zip(b_step) {
                        *slot += a_value * b_value;
                    }
                }
            }
            for (i, acc_row) in acc.iter().enumerate() {
                // SAFETY: the caller guarantees NR writable floats in each of the MR rows.
                let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) };
                for (out, &value) in row.iter_mut().zip(acc_row) {
                    *out = if accumulate { *out + value } else { value };
                }
            }
        }
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86 {
    #[cfg(target_arch = "x86")]
    use std::arch::x86::*;
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;

    use super::MicroKernel;

    /// AVX-512F kernel: MR rows × 2 zmm (32 columns), 2·MR accumulators.
    pub struct Avx512;

    const AVX512_MR: usize = 12;

    impl MicroKernel for Avx512 {
        const MR: usize = AVX512_MR;
        const NR: usize = 32;
        const KC: usize = 256;
        const MC: usize = 12 * 12;
        const NC: usize = 3072;

        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
            // SAFETY: forwarded contract; `drive` only instantiates this kernel after
            // `is_x86_feature_detected!("avx512f")`.
            unsafe { tile_avx512::<AVX512_MR>(kc, a, b, c, ldc, accumulate) }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn tile_avx512<const MR: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the pointer arithmetic stays inside the ranges the caller guarantees.
        unsafe {
            for i in 0..MR {
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + 16) as *const i8);
            }
            let mut lo = [_mm512_setzero_ps(); MR];
            let mut hi = [_mm512_setzero_ps(); MR];
            let (mut a, mut b) = (a, b);
            for _ in 0..kc {
                let b_lo = _mm512_loadu_ps(b);
                let b_hi = _mm512_loadu_ps(b.add(16));
                for i in 0..MR {
                    let a_i = _mm512_set1_ps(*a.add(i));
                    lo[i] = _mm512_fmadd_ps(a_i, b_lo, lo[i]);
                    hi[i] = _mm512_fmadd_ps(a_i, b_hi, hi[i]);
                }
                a = a.add(MR);
                b = b.add(32);
            }
            for i in 0..MR {
                let row = c.add(i * ldc);
                if accumulate {
                    _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), lo[i]));
                    _mm512_storeu_ps(row.add(16), _mm512_add_ps(_mm512_loadu_ps(row.add(16)), hi[i]));
                } else {
                    _mm512_storeu_ps(row, lo[i]);
                    _mm512_storeu_ps(row.add(16), hi[i]);
                }
            }
        }
    }

    /// AVX2+FMA kernel: 6 rows × 2 ymm (16 columns), 12 accumulators of the 16 ymm registers.
    pub struct Avx2;

    const AVX2_MR: usize = 6;

    impl MicroKernel for Avx2 {
        const MR: usize = AVX2_MR;
        const NR: usize = 16;
        const KC: usize = 256;
        const MC: usize = 6 * 24;
        const NC: usize = 3072;

        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
            // SAFETY: forwarded contract; `drive` only instantiates this kernel after detecting
            // avx2 and fma.
            unsafe { tile_avx2::<AVX2_MR>(kc, a, b, c, ldc, accumulate) }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const MR: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the pointer arithmetic stays inside the ranges the caller guarantees.
        unsafe {
            let mut lo = [_mm256_setzero_ps(); MR];
            let mut hi = [_mm256_setzero_ps(); MR];
            let (mut a, mut b) = (a, b);
            for _ in 0..kc {
                let b_lo = _mm256_loadu_ps(b);
                let b_hi = _mm256_loadu_ps(b.add(8));
                for i in 0..MR {
                    let a_i = _mm256_set1_ps(*a.add(i));
                    lo[i] = _mm256_fmadd_ps(a_i, b_lo, lo[i]);
                    hi[i] = _mm256_fmadd_ps(a_i, b_hi, hi[i]);
                }
                a = a.add(MR);
                b = b.add(16);
            }
            for i in 0..MR {
                let row = c.add(i * ldc);
                if accumulate {
                    _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), lo[i]));
                    _mm256_storeu_ps(row.add(8), _mm256_add_ps(_mm256_loadu_ps(row.add(8)), hi[i]));
                } else {
                    _mm256_storeu_ps(row, lo[i]);
                    _mm256_storeu_ps(row.add(8), hi[i]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random fill in [-1, 1).
    fn fill(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// How a test operand is stored: as the matrix itself or as its transpose.
    #[derive(Clone, Copy, Debug)]
    enum Storage {
        RowMajor,
        Transposed,
    }

    fn view(data: &[f32], rows: usize, cols: usize, storage: Storage) -> MatRef<'_> {
        match storage {
            Storage::RowMajor => MatRef::row_major(data, cols),
            Storage::Transposed => MatRef::transposed(data, rows),
        }
    }

    /// The oracle: f64 accumulation in the obvious order. Returns the value and Σ|a·b| (the
    /// scale that bounds f32 rounding error) for each element.
    fn reference(m: usize, n: usize, k: usize, a: &MatRef<'_>, b: &MatRef<'_>) -> Vec<(f64, f64)> {
        let mut out = vec![(0.0, 0.0); m * n];
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut scale) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let x = a.data[i * a.row_stride + p * a.col_stride] as f64;
                    let y = b.data[p * b.row_stride + j * b.col_stride] as f64;
                    sum += x * y;
                    scale += (x * y).abs();
                }
                out[i * n + j] = (sum, scale);
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
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
        let seed = (m * 1_000_003 + n * 1009 + k) as u64;
        let a_data = fill(m * k, seed);
        let b_data = fill(k * n, seed + 1);
        let a = view(&a_data, m, k, a_storage);
        let b = view(&b_data, k, n, b_storage);
        let ldc = n + ldc_pad;
        let initial = fill(m.max(1) * ldc, seed + 2);
        let mut c = initial.clone();
        gemm_with(kernel, pool, m, n, k, a, b, &mut c, ldc, accumulate);
        let expected = reference(m, n, k, &a, &b);
        let tolerance = 1e-6 * (k.max(1) as f64).sqrt() * 4.0;
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
                let error = (got - want).abs() / (scale + before.abs() + 1e-30);
                assert!(
                    error <= tolerance || (got - want).abs() < 1e-30,
                    "{kernel:?} m={m} n={n} k={k} A {a_storage:?} B {b_storage:?} acc={accumulate} \
                     ldc={ldc}: C({i},{j}) = {got}, want {want} (relative error {error:e})"
                );
            }
        }
    }

    fn available_kernels() -> Vec<GemmKernel> {
        GemmKernel::ALL.into_iter().filter(|k| k.is_available()).collect()
    }

    const STORAGES: [(Storage, Storage); 4] = [
        (Storage::RowMajor, Storage::RowMajor),
        (Storage::RowMajor, Storage::Transposed),
        (Storage::Transposed, Storage::RowMajor),
        (Storage::Transposed, Storage::Transposed),
    ];

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
                        let same = results[0]
                            .iter()
                            .zip(other)
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{kernel:?} {m}x{n}x{k} differs across thread counts");
                    }
                }
            }
        }
    }

    #[test]
    fn best_kernel_is_available() {
        assert!(best_kernel().is_available());
    }
}

/// TEMPORARY tuning hook: GFLOP/s of the bare micro-kernel on L1/L2-resident packed data.
#[doc(hidden)]
pub fn tune_tile_gflops(kernel: GemmKernel, kc: usize, tiles: usize, reps: usize) -> f64 {
    fn go<K: MicroKernel>(kc: usize, tiles: usize, reps: usize) -> f64 {
        let a = vec![0.5f32; K::MR * kc * tiles];
        let b = vec![0.25f32; K::NR * kc];
        let mut c = vec![0.0f32; K::MR * K::NR * tiles];
        let start = std::time::Instant::now();
        for _ in 0..reps {
            for t in 0..tiles {
                unsafe { K::tile(kc, a.as_ptr().add(t * K::MR * kc), b.as_ptr(), c.as_mut_ptr().add(t * K::MR * K::NR), K::NR, true) };
            }
        }
        let s = start.elapsed().as_secs_f64();
        std::hint::black_box(&c);
        (2 * K::MR * K::NR * kc * tiles * reps) as f64 / s / 1e9
    }
    match kernel {
        GemmKernel::Avx512 => go::<x86::Avx512>(kc, tiles, reps),
        GemmKernel::Avx2 => go::<x86::Avx2>(kc, tiles, reps),
        GemmKernel::Portable => go::<portable::Portable>(kc, tiles, reps),
    }
}
