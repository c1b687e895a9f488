//! The blocked, parallel driver of the CPU GEMMs: C cut into one rectangle of whole tiles per
//! task (`Grid`), and on each the BLIS loop nest over column, depth and row blocks around a
//! micro-kernel, with thread-local packed buffers and edge tiles through a scratch tile. The
//! bf16 GEMM runs on the same split, buffers and edge handling.

use std::cell::RefCell;
use std::ops::Range;

use super::pack::{pack, Slab};
use super::{MatRef, MicroKernel};
use crate::device::cpu::pool::ThreadPool;

/// A raw pointer that tasks on several threads may hold at once. Every task writes a disjoint
/// region through it; `ThreadPool::run` returning orders those writes before the caller's reads.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(*mut f32);

// SAFETY: the pointer is only dereferenced at indices that the GEMM partitions among tasks, so no
// two threads touch the same element concurrently.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// Taking `self` by value makes closures capture the whole wrapper, not the bare pointer.
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// The validated arguments of one GEMM call (f32 or bf16).
pub(crate) struct Problem<'a, B = f32> {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a: MatRef<'a>,
    pub(crate) b: MatRef<'a, B>,
    pub(crate) c: SharedMut,
    pub(crate) ldc: usize,
    pub(crate) accumulate: bool,
}

impl<'a, B> Problem<'a, B> {
    /// Checks a call's views and C (with row stride `ldc`) against its shape (a slice too short
    /// panics) and returns the problem, or None when there is nothing to multiply: C is empty, or
    /// the sum is (`k == 0`), and then C keeps its value when accumulating and becomes zero
    /// otherwise.
    pub(crate) fn new(
        (m, n, k): (usize, usize, usize),
        a: MatRef<'a>,
        b: MatRef<'a, B>,
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) -> Option<Problem<'a, B>> {
        check_view("A", &a, m, k);
        check_view("B", &b, k, n);
        if m == 0 || n == 0 {
            return None;
        }
        assert!(ldc >= n, "GEMM: ldc {ldc} is smaller than n {n}");
        let c_needed = (m - 1).checked_mul(ldc).and_then(|x| x.checked_add(n)).expect("GEMM: C extent overflows usize");
        assert!(c.len() >= c_needed, "GEMM: C has {} elements, needs {c_needed}", c.len());
        if k == 0 {
            if !accumulate {
                c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
            }
            return None;
        }
        Some(Problem { m, n, k, a, b, c: SharedMut(c.as_mut_ptr()), ldc, accumulate })
    }
}

/// Asserts that every element of a `rows × cols` view lies inside its slice, which is what makes
/// the unchecked reads in the packing routines sound.
fn check_view<T>(name: &str, view: &MatRef<'_, T>, rows: usize, cols: usize) {
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

/// Below this many multiply-adds (about 10 µs on one core) a GEMM runs on the calling thread
/// alone: below it, splitting measured slower than not. The cut-off cannot change results, only
/// speed.
const PARALLEL_MIN_MACS: usize = 1 << 21;

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

/// A 64-byte aligned scratch tile for edge tiles: the micro-kernel stores a whole tile here,
/// and `apply` then gives the part inside C the same single add (or store) per element that a
/// full tile gets, so edge tiles round identically.
#[repr(C, align(64))]
pub(crate) struct EdgeTile([f32; MAX_TILE]);

impl EdgeTile {
    pub(crate) fn new() -> EdgeTile {
        EdgeTile([0.0; MAX_TILE])
    }

    /// The scratch tile, for a micro-kernel to store into with row stride `nr`.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut f32 {
        self.0.as_mut_ptr()
    }

    /// `C = value` or, when `accumulate`, `C = C + value` for the `height × width` corner of
    /// the tile (row stride `nr`), at `c` with row stride `ldc`.
    ///
    /// # Safety
    /// Rows `0..height` of C at stride `ldc` have `width` writable floats each, touched by no
    /// other thread.
    pub(crate) unsafe fn apply(
        &self,
        nr: usize,
        c: *mut f32,
        ldc: usize,
        (height, width): (usize, usize),
        accumulate: bool,
    ) {
        for (ii, edge_row) in self.0.chunks_exact(nr).take(height).enumerate() {
            // SAFETY: rows < height and columns < width of this tile are inside C.
            let c_row = unsafe { std::slice::from_raw_parts_mut(c.add(ii * ldc), width) };
            for (out, &value) in c_row.iter_mut().zip(edge_row) {
                *out = if accumulate { *out + value } else { value };
            }
        }
    }
}

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

/// The blocked, parallel GEMM driver for one micro-kernel: cut C into one rectangle of whole
/// tiles per task and run the full blocked loop nest on each, independently. With no shared
/// packed buffers there is no barrier inside a call, and no thread reads another's caches.
pub(crate) fn drive<K: MicroKernel>(pool: &ThreadPool, p: &Problem<'_>) {
    debug_assert!(K::MR * K::NR <= MAX_TILE && K::MC % K::MR == 0 && K::NC % K::NR == 0);
    for_each_rectangle(pool, p, (K::MR, K::NR), &|rows, cols| blocked_gemm::<K>(p, rows, cols));
}

/// Cuts C into one rectangle of whole `mr × nr` tiles per task (`Grid`; a single task below
/// `PARALLEL_MIN_MACS`) and runs `body(rows, cols)` on each non-empty one, in parallel.
pub(crate) fn for_each_rectangle<B: Sync>(
    pool: &ThreadPool,
    p: &Problem<'_, B>,
    (mr, nr): (usize, usize),
    body: &(dyn Fn(Range<usize>, Range<usize>) + Sync),
) {
    let threads = pool.threads();
    let parallel = threads > 1 && p.m.saturating_mul(p.n).saturating_mul(p.k) >= PARALLEL_MIN_MACS;
    let row_tiles = p.m.div_ceil(mr);
    let col_tiles = p.n.div_ceil(nr);
    let grid = if parallel { Grid::choose(row_tiles, col_tiles, threads, p.m, p.n) } else { Grid::SERIAL };
    run_tasks(pool, parallel, grid.rows * grid.cols, &|task| {
        let (tiles, slivers) = grid.task(task, row_tiles, col_tiles);
        let rows = tiles.start * mr..(tiles.end * mr).min(p.m);
        let cols = slivers.start * nr..(slivers.end * nr).min(p.n);
        if !rows.is_empty() && !cols.is_empty() {
            body(rows, cols);
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
                let largest = row_tiles.div_ceil(rows) * col_tiles.div_ceil(cols);
                let critical_path = tasks.div_ceil(threads) * largest;
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
    let nc_max = K::NC.min(cols.len()).div_ceil(nr) * nr;
    let mc_max = K::MC.min(rows.len()).div_ceil(mr) * mr;
    with_buffer(&PACKED_B, kc_max * nc_max, |packed_b| {
        with_buffer(&PACKED_A, kc_max * mc_max, |packed_a| {
            for jc in cols.clone().step_by(K::NC) {
                let nc = K::NC.min(cols.end - jc);
                for pc in (0..p.k).step_by(K::KC) {
                    let kc = K::KC.min(p.k - pc);
                    let packed_b = &mut packed_b[..nc.div_ceil(nr) * nr * kc];
                    // B(q, j): j is the wide index, q the depth. It is packed sliver by sliver
                    // during the first row block, see `macro_kernel`.
                    let b_slab = Slab::of_b(&p.b, (pc, kc), (jc, nc), nr);
                    let accumulate = p.accumulate || pc > 0;
                    for (index, ic) in rows.clone().step_by(K::MC).enumerate() {
                        let mc = K::MC.min(rows.end - ic);
                        // A(i, q): i is the wide index, q the depth.
                        let packed_a = &mut packed_a[..mc.div_ceil(mr) * mr * kc];
                        pack::<K>(&Slab::of_a(&p.a, (ic, mc), (pc, kc), mr), packed_a);
                        let block = Block { kc, i0: ic, mc, j0: jc, nc, accumulate };
                        let pack_b = if index == 0 { Some(&b_slab) } else { None };
                        macro_kernel::<K>(p, packed_a, packed_b, pack_b, &block);
                    }
                }
            }
        });
    });
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
    let mut edge = EdgeTile::new();
    let slivers = block.nc.div_ceil(nr);
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
                // SAFETY: the scratch tile holds MR*NR floats with row stride NR; rows < height and
                // columns < width of this tile are inside C.
                unsafe {
                    K::tile(kc, a.as_ptr(), b.as_ptr(), edge.as_mut_ptr(), nr, false);
                    edge.apply(nr, c, p.ldc, (height, width), block.accumulate);
                }
            }
        }
    }
}
