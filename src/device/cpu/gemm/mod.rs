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
//! Tuning (AMD Zen 5 with AVX-512, 2 threads; see `bench_gemm`): the AVX-512 kernel is 8 rows ×
//! 32 columns (16 zmm accumulators; 8 divides the token counts of typical micro-batches, and the
//! kernel alone runs at the FMA peak), KC = 768 (one depth block for d_model = 768, so C is read
//! and written once), MC = 128 and NC = 3072.

use std::cell::RefCell;
use std::ops::Range;
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
            GemmKernel::Avx2 => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
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
    check_view("A", &a, m, k);
    check_view("B", &b, k, n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n, "GEMM: ldc {ldc} is smaller than n {n}");
    let c_needed = (m - 1).checked_mul(ldc).and_then(|x| x.checked_add(n)).expect("GEMM: C extent overflows usize");
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
pub(crate) fn check_view(name: &str, view: &MatRef<'_>, rows: usize, cols: usize) {
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

    /// Computes the `MR × NR` tile `acc = Σ_p a[p*MR + r] · b[p*NR + j]` over `kc` steps, then
    /// stores `C = acc` or, when `accumulate`, `C = C + acc` (one rounding per element).
    ///
    /// # Safety
    /// `a` holds `kc * MR` and `b` holds `kc * NR` readable floats, C rows `0..MR` with stride
    /// `ldc` have `NR` writable floats each, and the CPU supports the kernel's instructions.
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool);
}

/// Below this many multiply-adds (about 10 µs on one core) a GEMM runs on the calling thread
/// alone: below it, splitting measured slower than not. The cut-off cannot change results, only
/// speed.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 21;

/// Runs `tasks` tasks on the pool, or inline when the problem is too small to split.
pub(crate) fn run_tasks(pool: &ThreadPool, parallel: bool, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
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

/// A growable buffer (of f32, or of packed bf16 pairs) whose working slice starts on a 64-byte
/// boundary, so that packed slivers never straddle cache lines.
pub(crate) struct AlignedBuffer<T> {
    storage: Vec<T>,
}

impl<T> Default for AlignedBuffer<T> {
    fn default() -> Self {
        AlignedBuffer { storage: Vec::new() }
    }
}

impl<T: Copy + Default> AlignedBuffer<T> {
    /// Elements of slack so the slice can start on a 64-byte boundary.
    const SLACK: usize = 64 / std::mem::size_of::<T>();

    fn slice(&mut self, len: usize) -> &mut [T] {
        if self.storage.len() < len + Self::SLACK {
            self.storage = vec![T::default(); len + Self::SLACK];
        }
        let offset = self.storage.as_ptr().align_offset(64).min(Self::SLACK);
        &mut self.storage[offset..offset + len]
    }
}

thread_local! {
    /// Each thread's packed A block, reused across calls so that steady-state GEMMs never touch
    /// the allocator or fault in fresh pages.
    static PACKED_A: RefCell<AlignedBuffer<f32>> = RefCell::new(AlignedBuffer::default());
    /// Each thread's packed B block (up to `KC × NC` floats, 9 MiB for AVX-512), reused likewise.
    static PACKED_B: RefCell<AlignedBuffer<f32>> = RefCell::new(AlignedBuffer::default());
}

/// Runs `body` with a thread-local buffer of `len` elements, or a fresh one if that buffer is
/// already in use further up this thread's stack.
pub(crate) fn with_buffer<T: Copy + Default, R>(
    key: &'static std::thread::LocalKey<RefCell<AlignedBuffer<T>>>,
    len: usize,
    body: impl FnOnce(&mut [T]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => body(buffer.slice(len)),
        Err(_) => body(AlignedBuffer::default().slice(len)),
    })
}

fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// The blocked, parallel GEMM driver for one micro-kernel: cut C into one rectangle of whole
/// tiles per task and run the full blocked loop nest on each, independently. With no shared
/// packed buffers there is no barrier inside a call, and no thread reads another's caches.
fn drive<K: MicroKernel>(pool: &ThreadPool, p: &Problem<'_>) {
    debug_assert!(K::MR * K::NR <= MAX_TILE && K::MC % K::MR == 0 && K::NC % K::NR == 0);
    let threads = pool.threads();
    let parallel = threads > 1 && p.m.saturating_mul(p.n).saturating_mul(p.k) >= PARALLEL_MIN_MACS;
    let row_tiles = div_ceil(p.m, K::MR);
    let col_tiles = div_ceil(p.n, K::NR);
    let grid = if parallel { Grid::choose(row_tiles, col_tiles, threads, p.m, p.n) } else { Grid::SERIAL };
    run_tasks(pool, parallel, grid.rows * grid.cols, &|task| {
        let (tiles, slivers) = grid.task(task, row_tiles, col_tiles);
        let rows = tiles.start * K::MR..(tiles.end * K::MR).min(p.m);
        let cols = slivers.start * K::NR..(slivers.end * K::NR).min(p.n);
        if !rows.is_empty() && !cols.is_empty() {
            blocked_gemm::<K>(p, rows, cols);
        }
    });
}

/// How C's `row_tiles × col_tiles` micro-tiles are cut into `rows × cols` rectangular tasks.
/// The cut decides only which thread computes a tile, never how, so any grid gives the same
/// bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl Grid {
    pub(crate) const SERIAL: Grid = Grid { rows: 1, cols: 1 };

    /// Picks the grid with the shortest critical path when its tasks are handed out to
    /// `threads` threads, counting work in tiles. Among equals it picks the one that packs the
    /// least twice: every extra row cut packs all of B's `n` columns again, every extra column
    /// cut all of A's `m` rows. Then, fewer tasks.
    pub(crate) fn choose(row_tiles: usize, col_tiles: usize, threads: usize, m: usize, n: usize) -> Grid {
        let max_tasks = 4 * threads;
        let mut best = ((usize::MAX, usize::MAX, usize::MAX), Grid::SERIAL);
        for rows in 1..=row_tiles.min(max_tasks) {
            for cols in 1..=col_tiles.min(max_tasks / rows) {
                let tasks = rows * cols;
                let largest = div_ceil(row_tiles, rows) * div_ceil(col_tiles, cols);
                let critical_path = div_ceil(tasks, threads) * largest;
                let repacked = (rows - 1) * n + (cols - 1) * m;
                let key = (critical_path, repacked, tasks);
                if key < best.0 {
                    best = (key, Grid { rows, cols });
                }
            }
        }
        best.1
    }

    /// The tile rows and tile columns of task `task`, split as evenly as whole tiles allow.
    pub(crate) fn task(self, task: usize, row_tiles: usize, col_tiles: usize) -> (Range<usize>, Range<usize>) {
        let (r, c) = (task / self.cols, task % self.cols);
        let rows = r * row_tiles / self.rows..(r + 1) * row_tiles / self.rows;
        let cols = c * col_tiles / self.cols..(c + 1) * col_tiles / self.cols;
        (rows, cols)
    }
}

/// The BLIS loop nest over one rectangle of C, on the current thread. `rows` and `cols` start on
/// tile boundaries, so the tile grid (and with it every rounding) matches the unsplit problem.
fn blocked_gemm<K: MicroKernel>(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
    let (mr, nr) = (K::MR, K::NR);
    let kc_max = K::KC.min(p.k);
    let nc_max = div_ceil(K::NC.min(cols.len()), nr) * nr;
    let mc_max = div_ceil(K::MC.min(rows.len()), mr) * mr;
    with_buffer(&PACKED_B, kc_max * nc_max, |packed_b| {
        with_buffer(&PACKED_A, kc_max * mc_max, |packed_a| {
            for jc in cols.clone().step_by(K::NC) {
                let nc = K::NC.min(cols.end - jc);
                for pc in (0..p.k).step_by(K::KC) {
                    let kc = K::KC.min(p.k - pc);
                    let packed_b = &mut packed_b[..div_ceil(nc, nr) * nr * kc];
                    // B(q, j): j is the wide index, q the depth. It is packed sliver by sliver
                    // during the first row block, see `macro_kernel`.
                    let b_slab = Slab {
                        src: p.b.data,
                        base: pc * p.b.row_stride + jc * p.b.col_stride,
                        wide_stride: p.b.col_stride,
                        deep_stride: p.b.row_stride,
                        width: nc,
                        kc,
                        lanes: nr,
                    };
                    let accumulate = p.accumulate || pc > 0;
                    for (index, ic) in rows.clone().step_by(K::MC).enumerate() {
                        let mc = K::MC.min(rows.end - ic);
                        // A(i, q): i is the wide index, q the depth.
                        let packed_a = &mut packed_a[..div_ceil(mc, mr) * mr * kc];
                        let a_base = ic * p.a.row_stride + pc * p.a.col_stride;
                        pack::<K>(p.a.data, a_base, p.a.row_stride, p.a.col_stride, mc, kc, mr, packed_a);
                        let block = Block { kc, i0: ic, mc, j0: jc, nc, accumulate };
                        let pack_b = if index == 0 { Some(&b_slab) } else { None };
                        macro_kernel::<K>(p, packed_a, packed_b, pack_b, &block);
                    }
                }
            }
        });
    });
}

/// A `width × kc` region of a strided operand that packs into `ceil(width / lanes)` slivers:
/// element `(w, q)` is `src[base + w*wide_stride + q*deep_stride]`.
struct Slab<'a> {
    src: &'a [f32],
    base: usize,
    wide_stride: usize,
    deep_stride: usize,
    width: usize,
    kc: usize,
    lanes: usize,
}

impl Slab<'_> {
    /// Slivers packed (and prefetched) together: where the sliver lines are contiguous in the
    /// source, several slivers side by side make each source line a longer, cheaper read.
    fn slivers_per_group(&self) -> usize {
        if self.wide_stride == 1 {
            8
        } else {
            1
        }
    }

    /// Width of `count` slivers starting at sliver `s` (the last one may be narrower).
    fn group_width(&self, s: usize, count: usize) -> usize {
        (count * self.lanes).min(self.width - s * self.lanes)
    }

    /// Packs `count` slivers starting at sliver `s` into `dst`.
    fn pack_group<K: MicroKernel>(&self, s: usize, count: usize, dst: &mut [f32]) {
        let base = self.base + s * self.lanes * self.wide_stride;
        let width = self.group_width(s, count);
        pack::<K>(self.src, base, self.wide_stride, self.deep_stride, width, self.kc, self.lanes, dst);
    }

    /// Prefetches part `part` of `parts` of the source of `count` slivers starting at `s` into
    /// L2, so that packing them later reads from cache instead of waiting on memory. Layouts
    /// with no unit stride are left to the hardware.
    fn prefetch_group(&self, s: usize, count: usize, part: usize, parts: usize) {
        let base = self.base + s * self.lanes * self.wide_stride;
        let width = self.group_width(s, count);
        let (runs, run_len, run_stride) = if self.wide_stride == 1 {
            (self.kc, width, self.deep_stride)
        } else if self.deep_stride == 1 {
            (width, self.kc, self.wide_stride)
        } else {
            return;
        };
        for run in part * runs / parts..(part + 1) * runs / parts {
            let start = base + run * run_stride;
            if let Some(line) = self.src.get(start..start + run_len) {
                line.iter().step_by(16).chain(line.last()).for_each(prefetch_l2);
            }
        }
    }
}

/// Where one packed A block and one packed B block meet in C.
struct Block {
    kc: usize,
    i0: usize,
    mc: usize,
    j0: usize,
    nc: usize,
    /// Add to C (true) or overwrite it (false, only for the first depth block).
    accumulate: bool,
}

/// Multiplies a packed `mc × kc` A block by a packed `kc × nc` B block into C. The B sliver is
/// the outer loop so that it stays in L1 while the A slivers stream from L2.
///
/// With `pack_b`, the B slivers are packed here, each just before its first use, and the source
/// of the next sliver is prefetched a slice per tile while this one computes. Streaming B from
/// memory then overlaps with arithmetic instead of stalling a separate packing pass, which is
/// what dominates the wide, short GEMMs of a small-batch step (M = 256, N = 50304).
fn macro_kernel<K: MicroKernel>(
    p: &Problem<'_>,
    packed_a: &[f32],
    packed_b: &mut [f32],
    pack_b: Option<&Slab<'_>>,
    block: &Block,
) {
    let (mr, nr, kc) = (K::MR, K::NR, block.kc);
    let mut edge = EdgeTile([0.0; MAX_TILE]);
    let slivers = div_ceil(block.nc, nr);
    let tiles = packed_a.len() / (kc * mr);
    let group = pack_b.map_or(1, Slab::slivers_per_group);
    if let Some(slab) = pack_b {
        (0..tiles).for_each(|part| slab.prefetch_group(0, group, part, tiles));
    }
    for s in 0..slivers {
        if let Some(slab) = pack_b.filter(|_| s % group == 0) {
            let count = group.min(slivers - s);
            slab.pack_group::<K>(s, count, &mut packed_b[s * kc * nr..(s + count) * kc * nr]);
        }
        let b = &packed_b[s * kc * nr..(s + 1) * kc * nr];
        let j = block.j0 + s * nr;
        let width = nr.min(block.j0 + block.nc - j);
        for (r, a) in packed_a.chunks_exact(kc * mr).enumerate() {
            let i = block.i0 + r * mr;
            let height = mr.min(block.i0 + block.mc - i);
            // SAFETY: `i < m` and `j < n`, so the tile origin lies inside C (checked against the
            // slice length at entry); this task owns the rectangle the block lies in.
            let c = unsafe { p.c.ptr().add(i * p.ldc + j) };
            let next_group = (s / group + 1) * group;
            if let Some(slab) = pack_b.filter(|_| next_group < slivers) {
                let part = (s % group) * tiles + r;
                slab.prefetch_group(next_group, group, part, group * tiles);
            }
            if height == mr && width == nr {
                // SAFETY: a full tile lies inside C; the packed slivers hold kc*MR and kc*NR
                // floats; `drive` is only instantiated for kernels the CPU supports.
                unsafe { K::tile(kc, a.as_ptr(), b.as_ptr(), c, p.ldc, block.accumulate) };
            } else {
                // SAFETY: the scratch tile holds MR*NR floats with row stride NR.
                unsafe { K::tile(kc, a.as_ptr(), b.as_ptr(), edge.0.as_mut_ptr(), nr, false) };
                for (ii, edge_row) in edge.0.chunks_exact(nr).take(height).enumerate() {
                    // SAFETY: rows < height and columns < width of this tile are inside C.
                    let c_row = unsafe { std::slice::from_raw_parts_mut(c.add(ii * p.ldc), width) };
                    for (out, &value) in c_row.iter_mut().zip(edge_row) {
                        *out = if block.accumulate { *out + value } else { value };
                    }
                }
            }
        }
    }
}

/// Packs a `width × kc` slab of a strided matrix into `ceil(width / lanes)` slivers. Sliver `s`
/// holds `dst[s*kc*lanes + q*lanes + w] = src[base + (s*lanes + w)*wide_stride + q*deep_stride]`,
/// `w` walking the index that becomes a tile row or column and `q` the depth; lanes past `width`
/// are zero so edge tiles multiply zeros.
#[allow(clippy::too_many_arguments)] // Internal; the strides read best spelled out.
fn pack<K: MicroKernel>(
    src: &[f32],
    base: usize,
    wide_stride: usize,
    deep_stride: usize,
    width: usize,
    kc: usize,
    lanes: usize,
    dst: &mut [f32],
) {
    assert!(width > 0 && kc > 0 && dst.len() == div_ceil(width, lanes) * lanes * kc);
    // The entry check proved every element of the view is in bounds; re-checking this slab's
    // far corner here keeps the unchecked reads below locally sound.
    let last = base + (width - 1) * wide_stride + (kc - 1) * deep_stride;
    assert!(last < src.len(), "GEMM pack out of bounds");
    let src = &src[base..=last];

    if wide_stride == 1 && deep_stride != 1 {
        // Each depth step is contiguous across slivers. Walk a few slivers at a time so that
        // every source line is read once and whole, while the writes stay a handful of
        // sequential streams; prefetch the lines a few steps ahead, since each step starts a new
        // stream far away.
        let slivers = div_ceil(width, lanes);
        for first in (0..slivers).step_by(SLIVERS_PER_PASS) {
            let begin = first * lanes;
            let end = width.min(begin + SLIVERS_PER_PASS * lanes);
            for q in 0..kc {
                if q + PREFETCH_STEPS < kc {
                    let ahead = (q + PREFETCH_STEPS) * deep_stride;
                    src[ahead + begin..ahead + end].iter().step_by(16).for_each(prefetch);
                }
                let line = &src[q * deep_stride + begin..q * deep_stride + end];
                for (i, chunk) in line.chunks(lanes).enumerate() {
                    let out = &mut dst[(first + i) * kc * lanes + q * lanes..][..lanes];
                    if chunk.len() == lanes {
                        copy_line(out, chunk);
                    } else {
                        out[..chunk.len()].copy_from_slice(chunk);
                        out[chunk.len()..].fill(0.0);
                    }
                }
            }
        }
        return;
    }

    for (s, sliver) in dst.chunks_exact_mut(kc * lanes).enumerate() {
        let w0 = s * lanes;
        let sliver_width = lanes.min(width - w0);
        let sliver_src = &src[w0 * wide_stride..];
        if deep_stride == 1 {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            if K::AVX512_PACKING {
                // SAFETY: `sliver_src` holds rows 0..sliver_width of kc contiguous floats at
                // stride `wide_stride` (checked above), `sliver` holds kc*lanes floats, and the
                // kernel only asks for AVX-512 packing when it is an AVX-512 kernel.
                unsafe { x86::pack_transposed_avx512(sliver_src, wide_stride, sliver_width, kc, lanes, sliver) };
                continue;
            }
            pack_transposed(sliver_src, wide_stride, sliver_width, kc, lanes, sliver);
        } else {
            if sliver_width < lanes {
                sliver.fill(0.0);
            }
            for (q, out) in sliver.chunks_exact_mut(lanes).enumerate() {
                for (w, slot) in out[..sliver_width].iter_mut().enumerate() {
                    *slot = sliver_src[w * wide_stride + q * deep_stride];
                }
            }
        }
    }
}

/// Copies one sliver line. The sliver widths of the kernels get fixed-size copies, which compile
/// to a few vector moves instead of a `memcpy` call per line.
#[inline(always)]
fn copy_line(out: &mut [f32], line: &[f32]) {
    fn fixed<const N: usize>(out: &mut [f32], line: &[f32]) {
        if let (Ok(out), Ok(line)) = (<&mut [f32; N]>::try_from(out), <&[f32; N]>::try_from(line)) {
            *out = *line;
        }
    }
    match out.len() {
        32 => fixed::<32>(out, line),
        16 => fixed::<16>(out, line),
        12 => fixed::<12>(out, line),
        8 => fixed::<8>(out, line),
        6 => fixed::<6>(out, line),
        4 => fixed::<4>(out, line),
        _ => out.copy_from_slice(line),
    }
}

/// Depth steps ahead that the streaming pack prefetches.
const PREFETCH_STEPS: usize = 4;

/// Slivers the streaming pack fills per pass over the depth.
const SLIVERS_PER_PASS: usize = 8;

/// Which cache level a prefetch fills: L1 for data needed next, L2 for data needed far ahead (so
/// it does not evict the working set in L1). The values are x86's `_MM_HINT_T0` / `_MM_HINT_T1`.
const TO_L1: i32 = 3;
const TO_L2: i32 = 2;

/// Hints that the cache line holding `value` will be read soon, into the level `HINT` names. A
/// no-op off x86-64.
#[inline(always)]
fn prefetch_to<const HINT: i32>(value: &f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and does not change memory; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>((value as *const f32).cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[inline(always)]
fn prefetch(value: &f32) {
    prefetch_to::<TO_L1>(value)
}

#[inline(always)]
fn prefetch_l2(value: &f32) {
    prefetch_to::<TO_L2>(value)
}

/// The portable transposing pack: `width` rows of `kc` contiguous floats at stride `row_stride`
/// become `kc` packed lines of `lanes`. Blocks of eight depth steps keep both sides in L1.
fn pack_transposed(src: &[f32], row_stride: usize, width: usize, kc: usize, lanes: usize, dst: &mut [f32]) {
    const DEPTH_BLOCK: usize = 8;
    if width < lanes {
        dst.fill(0.0);
    }
    for q0 in (0..kc).step_by(DEPTH_BLOCK) {
        let depth = DEPTH_BLOCK.min(kc - q0);
        for w in 0..width {
            let row = &src[w * row_stride + q0..w * row_stride + q0 + depth];
            for (dq, &value) in row.iter().enumerate() {
                dst[(q0 + dq) * lanes + w] = value;
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

        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
            // SAFETY: the caller guarantees kc*MR and kc*NR readable floats.
            let (a, b) = unsafe { (std::slice::from_raw_parts(a, kc * MR), std::slice::from_raw_parts(b, kc * NR)) };
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
pub(crate) mod x86 {
    #[cfg(target_arch = "x86")]
    use std::arch::x86::*;
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;

    use super::MicroKernel;

    /// AVX-512F kernel: MR rows × 2 zmm (32 columns), 2·MR accumulators. Measured on Zen 5:
    /// 8 × 32 and 12 × 32 both reach the FMA peak on cached data; 8 rows won on the GEMMs because
    /// 256-token micro-batches leave no ragged row tiles.
    pub struct Avx512;

    const AVX512_MR: usize = 8;

    impl MicroKernel for Avx512 {
        const MR: usize = AVX512_MR;
        const NR: usize = 32;
        const KC: usize = 768;
        const MC: usize = 128;
        const NC: usize = 3072;
        const AVX512_PACKING: bool = true;

        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
            // SAFETY: forwarded contract; `drive` only instantiates this kernel after
            // `is_x86_feature_detected!("avx512f")`.
            unsafe { tile_avx512::<AVX512_MR>(kc, a, b, c, ldc, accumulate) }
        }
    }

    /// The AVX-512 body of `MicroKernel::tile` for `MR` rows and 32 columns.
    ///
    /// # Safety
    /// As `MicroKernel::tile` with `NR = 32`, and the CPU must support AVX-512F.
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

    /// Transposing pack with 16×16 register transposes: `width` rows of `kc` contiguous floats at
    /// stride `row_stride` become `kc` packed lines of `lanes` floats (`dst[q*lanes + w]`), with
    /// lanes past `width` zeroed. Bit-identical to the portable `pack_transposed`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `src` must hold `(width - 1) * row_stride + kc` floats and
    /// `dst` exactly `kc * lanes`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn pack_transposed_avx512(
        src: &[f32],
        row_stride: usize,
        width: usize,
        kc: usize,
        lanes: usize,
        dst: &mut [f32],
    ) {
        debug_assert!(width >= 1 && width <= lanes && dst.len() == kc * lanes);
        debug_assert!(src.len() >= (width - 1) * row_stride + kc);
        let (src, dst) = (src.as_ptr(), dst.as_mut_ptr());
        for group in (0..lanes).step_by(16) {
            let group_lanes = 16.min(lanes - group);
            let store_mask = ((1u32 << group_lanes) - 1) as __mmask16;
            let valid_rows = width.saturating_sub(group).min(16);
            // Rows past `width` get an all-zero mask: the load then reads no memory and yields
            // the zero padding. Their addresses are formed with wrapping arithmetic only.
            let row_ptr = |r: usize| src.wrapping_add((group + r) * row_stride);
            for q0 in (0..kc).step_by(16) {
                let depth = 16.min(kc - q0);
                let load_mask = ((1u32 << depth) - 1) as __mmask16;
                let mut rows = [_mm512_setzero_ps(); 16];
                for (r, row) in rows.iter_mut().enumerate() {
                    let mask = if r < valid_rows { load_mask } else { 0 };
                    // SAFETY: unmasked lanes are row group+r < width, columns q0..q0+depth < kc,
                    // all inside `src`; masked-off lanes are not accessed.
                    *row = unsafe { _mm512_maskz_loadu_ps(mask, row_ptr(r).wrapping_add(q0)) };
                    if r < valid_rows && q0 + PREFETCH_FLOATS < kc {
                        // The rows are separate streams too many for the hardware prefetcher to
                        // follow; fetching a few lines ahead hides most of the miss latency.
                        _mm_prefetch::<_MM_HINT_T0>(row_ptr(r).wrapping_add(q0 + PREFETCH_FLOATS) as *const i8);
                    }
                }
                // SAFETY: the caller guarantees AVX-512F.
                let columns = unsafe { transpose16(rows) };
                for (q, column) in columns.iter().enumerate() {
                    if q < depth {
                        // SAFETY: line q0+q < kc, lanes group..group+group_lanes <= lanes.
                        unsafe { _mm512_mask_storeu_ps(dst.add((q0 + q) * lanes + group), store_mask, *column) };
                    }
                }
            }
        }
    }

    /// How far ahead of the current 16-float block the transposing pack prefetches each row.
    const PREFETCH_FLOATS: usize = 128;

    /// Transposes a 16×16 block held as 16 row vectors into 16 column vectors: 32-bit and 64-bit
    /// interleaves within 128-bit lanes, then two rounds of 128-bit lane shuffles.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // After the interleaves, quad[4g + t] holds, in 128-bit lane j, rows 4g..4g+4 of
        // column 4j + t.
        let mut quad = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let lo01 = _mm512_castps_pd(_mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]));
            let hi01 = _mm512_castps_pd(_mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]));
            let lo23 = _mm512_castps_pd(_mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]));
            let hi23 = _mm512_castps_pd(_mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]));
            quad[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo01, lo23));
            quad[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo01, lo23));
            quad[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi01, hi23));
            quad[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi01, hi23));
        }
        // Gather lane j of the four row groups into column 4j + t.
        let mut out = [_mm512_setzero_ps(); 16];
        for t in 0..4 {
            let (a, b, c, d) = (quad[t], quad[4 + t], quad[8 + t], quad[12 + t]);
            let ab_even = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
            let ab_odd = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
            let cd_even = _mm512_shuffle_f32x4::<0b10_00_10_00>(c, d);
            let cd_odd = _mm512_shuffle_f32x4::<0b11_01_11_01>(c, d);
            out[t] = _mm512_shuffle_f32x4::<0b10_00_10_00>(ab_even, cd_even);
            out[8 + t] = _mm512_shuffle_f32x4::<0b11_01_11_01>(ab_even, cd_even);
            out[4 + t] = _mm512_shuffle_f32x4::<0b10_00_10_00>(ab_odd, cd_odd);
            out[12 + t] = _mm512_shuffle_f32x4::<0b11_01_11_01>(ab_odd, cd_odd);
        }
        out
    }

    /// AVX2+FMA kernel: 6 rows × 2 ymm (16 columns), 12 accumulators of the 16 ymm registers.
    pub struct Avx2;

    const AVX2_MR: usize = 6;

    impl MicroKernel for Avx2 {
        const MR: usize = AVX2_MR;
        const NR: usize = 16;
        const KC: usize = 256;
        const MC: usize = 6 * 16;
        const NC: usize = 3072;

        unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
            // SAFETY: forwarded contract; `drive` only instantiates this kernel after detecting
            // avx2 and fma.
            unsafe { tile_avx2::<AVX2_MR>(kc, a, b, c, ldc, accumulate) }
        }
    }

    /// The AVX2 body of `MicroKernel::tile` for `MR` rows and 16 columns.
    ///
    /// # Safety
    /// As `MicroKernel::tile` with `NR = 16`, and the CPU must support AVX2 and FMA.
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

/// Test helpers shared by the f32 and the bf16 GEMM tests.
#[cfg(test)]
pub(crate) mod test_support {
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
}

#[cfg(test)]
mod tests {
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
            let (row_tiles, col_tiles): (usize, usize) = (div_ceil(m, mr), div_ceil(n, nr));
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
}
