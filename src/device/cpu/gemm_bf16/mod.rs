//! bf16 GEMM for the CPU backend: f32 operands rounded to bf16 while packing (or a B of bf16 bits,
//! the CPU Device's bf16 working copy of the weights, widened while packing: `Bf16Operand`),
//! multiplied in pairs along the depth with AVX512-BF16 `vdpbf16ps`, with AVX-512 or AVX2 FMAs on
//! the bf16 values packed as f32 (the widened kernels), or with a bit-identical portable kernel;
//! f32 accumulation and f32 output. Which kernel runs is measured once per CPU model (`choose`).
//!
//! `gemm_bf16` has the contract of `gemm::gemm`: `C[i*ldc + j] = (accumulate ? C : 0) +
//! Σ_p bf16(A(i,p))·bf16(B(p,j))` for strided views A and B, where `bf16` rounds to nearest even.
//!
//! Arithmetic, as `vdpbf16ps` does it (verified on this machine, 10⁶ random cases, bitwise): each
//! packed word holds the bf16 values of depth steps `2t` (low half) and `2t + 1` (high half); one
//! step computes `acc = (acc + a_odd·b_odd) + a_even·b_even`, the odd product first, each add
//! rounded to nearest even. Products of two bf16 values are exact in f32. Denormal inputs and
//! outputs are flushed to zero. Packing flushes denormal inputs for every kernel, and the portable
//! kernel flushes denormal products and sums, so it gives `vdpbf16ps`'s bits. The widened kernels
//! run the same two rounded adds as FMAs (an exact product plus the sum, rounded once, is the
//! same add), so they give the same bits too, except where a product or a partial sum is denormal
//! (below 2^-126): FMA keeps it, `vdpbf16ps` flushes it, and the results differ by at most 2^-126
//! per product. Tests check both statements. The two widened kernels run the same FMAs in the
//! same order, so they agree bit for bit, denormals included.
//!
//! Structure: the blocking and parallel split of `gemm` (its `Grid`: one rectangle of whole tiles
//! per task, every sum's order fixed by the shape alone, so results are bit-identical for any
//! thread count). The depth block `KC` is the same for every kernel (so is the order of the sums);
//! the tile is 8 × 32 for AVX512-BF16, AVX-512 and portable, 6 × 16 for AVX2
//! (`Bf16Kernel::blocking`). For AVX512-BF16 and portable, packed slivers hold `u32` words of two
//! bf16 values, `ceil(kc / 2)` words deep, an odd depth padded with a zero half; unit-stride slabs
//! are packed with AVX-512F integer rounding (and a 16×16 word transpose when the depth is the
//! contiguous index), bit-identical to `to_bf16`; a test compares the two on random bit patterns.
//! The widened kernels are the f32 GEMM's AVX-512 and AVX2 tiles on the bf16 values held as f32,
//! with their depth steps taken in pairs odd first (`x86::tile_avx512::<8, true>`,
//! `x86::tile_avx2::<6, true>`), which is `vdpbf16ps`'s order: both operands are packed by the
//! f32 GEMM's AVX2 packing into `2 * ceil(kc / 2)` lines (an odd depth padded with a zero line),
//! each value rounded to bf16 as it is written (`pack::pack_bf16_avx2`; compared with `to_bf16`
//! on random bit patterns by a test, as the AVX-512 packing is). Widening once while packing,
//! rather than in the tile at every use, lets their FMAs run at the f32 tile's rate: the earlier
//! AVX2 tile, which widened bf16 pairs in registers with a mask and a shift, ran 7-40% slower on
//! most GEMM shapes (under the AVX2 cap on an Intel Xeon, whose shifts share the FMA ports;
//! BENCHMARKS.md). B is packed a group of slivers at a time during the first row block, its next
//! group's source prefetched meanwhile, as in `gemm`. The x86 code (the AVX512-BF16 packing and
//! tile) sits with the f32 kernels in `gemm/x86.rs`, `bf16_gemm`; the tests both GEMMs share are
//! in `gemm/tests.rs`, the bf16 GEMM's own in `tests.rs`.

use std::cell::RefCell;
use std::ops::Range;

use super::gemm::driver::{for_each_rectangle, with_buffer, AlignedBuffer, EdgeTile, Problem};
use super::gemm::pack::Slab;
#[cfg(target_arch = "x86_64")]
use super::gemm::pack::{pack_bf16_avx2, pack_bf16_bits_avx2};
use super::gemm::portable::store_tile;
#[cfg(target_arch = "x86_64")]
use super::gemm::x86;
use super::gemm::MatRef;
use super::pool::ThreadPool;

pub mod choose;

/// The bf16 micro-kernels; `best_bf16_kernel` picks the one this CPU runs fastest (at the level
/// `TRIDENT_CPU_ISA` allows), measuring where more than one could be (`choose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Kernel {
    /// AVX512-BF16 `vdpbf16ps` on zmm registers.
    Avx512Bf16,
    /// AVX-512F FMAs: both operands' bf16 values packed as f32, the f32 AVX-512 tile over them
    /// with each depth pair's two FMAs in `vdpbf16ps`'s order. For cores whose `vdpbf16ps` runs
    /// below their FMA rate, and AVX-512 cores without BF16.
    Avx512,
    /// AVX2 + FMA: as `Avx512`, with the f32 AVX2 tile.
    Avx2,
    /// Plain Rust with the same rounding, for any CPU.
    Portable,
}

impl Bf16Kernel {
    /// Every kernel, the one preferred where measurements tie first.
    pub const ALL: [Bf16Kernel; 4] =
        [Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx512, Bf16Kernel::Avx2, Bf16Kernel::Portable];

    /// A short name for logs and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Avx512Bf16 => "avx512bf16",
            Bf16Kernel::Avx512 => "avx512",
            Bf16Kernel::Avx2 => "avx2",
            Bf16Kernel::Portable => "portable",
        }
    }

    /// Whether this CPU can run the kernel at the level `TRIDENT_CPU_ISA` allows (`isa::active`).
    /// The kernel `name` names.
    pub fn parse(name: &str) -> Option<Bf16Kernel> {
        Bf16Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn is_available(self) -> bool {
        self.isa() <= super::isa::active()
    }

    /// The instruction-set level the kernel needs.
    pub fn isa(self) -> super::isa::Isa {
        match self {
            Bf16Kernel::Avx512Bf16 => super::isa::Isa::Avx512Bf16,
            Bf16Kernel::Avx512 => super::isa::Isa::Avx512,
            Bf16Kernel::Avx2 => super::isa::Isa::Avx2,
            Bf16Kernel::Portable => super::isa::Isa::Portable,
        }
    }

    /// The tile (`MR` rows × `NR` columns), the row block `MC` (a multiple of `MR`) and the
    /// packed lines per depth pair.
    fn blocking(self) -> Blocking {
        match self {
            Bf16Kernel::Avx2 => Blocking { mr: AVX2_MR, nr: 16, mc: 120, lines: 2 },
            Bf16Kernel::Avx512 => Blocking { mr: MR, nr: NR, mc: MC, lines: 2 },
            Bf16Kernel::Avx512Bf16 | Bf16Kernel::Portable => Blocking { mr: MR, nr: NR, mc: MC, lines: 1 },
        }
    }
}

/// One kernel's tile and row block; the depth block `KC` and column block `NC` are shared, so
/// every kernel sums in the same order.
#[derive(Clone, Copy)]
struct Blocking {
    mr: usize,
    nr: usize,
    mc: usize,
    /// Lines of packed A and of packed B per depth pair: one of bf16 pairs, or (the widened
    /// kernels) two of f32 values.
    lines: usize,
}

/// Rows of the AVX2 kernel's tile.
const AVX2_MR: usize = 6;

/// The bf16 kernel this process uses: pinned by `TRIDENT_BF16_KERNEL`, else the fastest of the
/// ones this CPU supports, measured once per CPU model (`choose`).
pub fn best_bf16_kernel() -> Bf16Kernel {
    choose::chosen().kernel
}

/// Rounds an f32 to bf16 bits: nearest even, NaN kept quiet, denormals flushed to signed zero
/// (as `vcvtne2ps2bf16` and `vdpbf16ps` treat them).
pub fn to_bf16(x: f32) -> u16 {
    // Branch-free selects, so that packing loops can vectorize.
    let bits = x.to_bits();
    let magnitude = bits & 0x7FFF_FFFF;
    // Adding 0x7FFF plus the lowest kept bit rounds half to even; overflow carries into the
    // exponent and yields infinity, as it should.
    let rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let signed_zero = (bits >> 16) & 0x8000;
    let out = if magnitude > 0x7F80_0000 {
        quiet_nan
    } else if magnitude < 0x0080_0000 {
        signed_zero
    } else {
        rounded
    };
    out as u16
}

/// The f32 value of bf16 bits.
pub fn from_bf16(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// An element type of the bf16 GEMM's B operand: f32 values, rounded to bf16 as they are packed
/// (`to_bf16`), or bf16 bits, widened as they are packed (the CPU Device's bf16 working copy of
/// the weights: half the bytes to read, nothing to round).
pub trait Bf16Operand: Copy + Send + Sync + 'static {
    /// The bf16 bits the GEMM multiplies: `to_bf16` of an f32; bits as they are, a denormal
    /// flushed to a zero of the same sign (as `to_bf16` flushes one).
    fn bf16_bits(self) -> u16;
    /// The slice as f32 values, where the elements are f32.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// The slice as bf16 bits, where the elements are bf16.
    fn as_bits(s: &[Self]) -> Option<&[u16]>;
}

impl Bf16Operand for f32 {
    fn bf16_bits(self) -> u16 {
        to_bf16(self)
    }
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_bits(_: &[f32]) -> Option<&[u16]> {
        None
    }
}

impl Bf16Operand for u16 {
    fn bf16_bits(self) -> u16 {
        (super::gemm::pack::widen_bf16(self).to_bits() >> 16) as u16
    }
    fn as_f32(_: &[u16]) -> Option<&[f32]> {
        None
    }
    fn as_bits(s: &[u16]) -> Option<&[u16]> {
        Some(s)
    }
}

/// `C = (accumulate ? C : 0) + bf16(A)·bf16(B)` for an `m × k` view A, a `k × n` view B (f32
/// values or bf16 bits, `Bf16Operand`) and a row-major C with row stride `ldc`, using the best
/// bf16 kernel for this CPU.
#[allow(clippy::too_many_arguments)] // The BLAS argument list is the clearest form for callers.
pub fn gemm_bf16<B: Bf16Operand>(
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_, B>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_bf16_with(best_bf16_kernel(), pool, m, n, k, a, b, c, ldc, accumulate);
}

/// `gemm_bf16` with an explicit kernel, for tests and benchmarks. Panics if the CPU cannot run
/// `kernel` (check `Bf16Kernel::is_available` first) or if a slice is too short for its shape.
#[allow(clippy::too_many_arguments)] // The BLAS argument list is the clearest form for callers.
pub fn gemm_bf16_with<B: Bf16Operand>(
    kernel: Bf16Kernel,
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_, B>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(kernel.is_available(), "bf16 GEMM kernel {} is not supported by this CPU", kernel.name());
    let Some(problem) = Problem::new((m, n, k), a, b, (c, ldc), accumulate) else { return };
    // The same split of C into one rectangle of whole tiles per task as `gemm`.
    for_each_rectangle(pool, &problem, (MR, NR), &|rows, cols| blocked(&problem, kernel, rows, cols));
}

/// Rows of C per tile.
const MR: usize = 8;
/// Columns of C per tile (two zmm of f32).
const NR: usize = 32;
/// Depth block in depth steps (even, so no pair straddles two blocks). It fixes the order of the
/// sums, so it must not depend on the thread count.
const KC: usize = 768;
/// Row block (a multiple of `MR`): the packed `MC × KC` A block stays in L2.
const MC: usize = 128;
/// Column block (a multiple of `NR`): the packed B block every row block reuses.
const NC: usize = 3072;

thread_local! {
    /// Each thread's packed A block (bf16 pairs, or for AVX2 f32 lines), reused across calls.
    static PACKED_A: RefCell<AlignedBuffer<u32>> = RefCell::new(AlignedBuffer::default());
    /// Each thread's packed B block (bf16 pairs, or for AVX2 f32 lines), reused across calls.
    static PACKED_B: RefCell<AlignedBuffer<u32>> = RefCell::new(AlignedBuffer::default());
}

/// The BLIS loop nest (`jc`, `pc`, `ic`, then B slivers, then A slivers) over one rectangle of C.
fn blocked<B: Bf16Operand>(p: &Problem<'_, B>, kernel: Bf16Kernel, rows: Range<usize>, cols: Range<usize>) {
    let Blocking { mr, nr, mc: mc_block, lines } = kernel.blocking();
    let words_max = KC.min(p.k).div_ceil(2);
    let nc_max = NC.min(cols.len()).div_ceil(nr) * nr;
    let mc_max = mc_block.min(rows.len()).div_ceil(mr) * mr;
    with_buffer(&PACKED_B, lines * words_max * nc_max, |packed_b| {
        with_buffer(&PACKED_A, lines * words_max * mc_max, |packed_a| {
            for jc in cols.clone().step_by(NC) {
                let nc = NC.min(cols.end - jc);
                for pc in (0..p.k).step_by(KC) {
                    let kc = KC.min(p.k - pc);
                    let words = kc.div_ceil(2);
                    let packed_b = &mut packed_b[..nc.div_ceil(nr) * nr * lines * words];
                    // B is packed sliver by sliver during the first row block (`macro_kernel`).
                    let b_slab = Slab::of_b(&p.b, (pc, kc), (jc, nc), nr);
                    let accumulate = p.accumulate || pc > 0;
                    for (index, ic) in rows.clone().step_by(mc_block).enumerate() {
                        let mc = mc_block.min(rows.end - ic);
                        let packed_a = &mut packed_a[..mc.div_ceil(mr) * mr * lines * words];
                        pack_operand(kernel, &Slab::of_a(&p.a, (ic, mc), (pc, kc), mr), packed_a);
                        let pack_b = if index == 0 { Some(&b_slab) } else { None };
                        let packed = (&*packed_a, &mut *packed_b, words);
                        macro_kernel(p, kernel, packed, pack_b, (ic, mc), (jc, nc), accumulate);
                    }
                }
            }
        });
    });
}

/// Multiplies a packed A block (rows `i0..i0+mc`) by a packed B block (columns `j0..j0+nc`),
/// `words` pairs deep, into C. Edge tiles go through a scratch tile and then get the same single
/// add (or store) per element that a full tile gets, so they round identically.
///
/// With `pack_b`, B's slivers are packed here, a group just before its first use, while the
/// source of the next group is prefetched a part per tile, as the f32 GEMM does: reading B from
/// memory then overlaps with arithmetic.
fn macro_kernel<B: Bf16Operand>(
    p: &Problem<'_, B>,
    kernel: Bf16Kernel,
    (packed_a, packed_b, words): (&[u32], &mut [u32], usize),
    pack_b_slab: Option<&Slab<'_, B>>,
    (i0, mc): (usize, usize),
    (j0, nc): (usize, usize),
    accumulate: bool,
) {
    let Blocking { mr, nr, lines, .. } = kernel.blocking();
    let mut edge = EdgeTile::new();
    let slivers = nc.div_ceil(nr);
    let (a_sliver, b_sliver) = (lines * words * mr, lines * words * nr);
    let tiles = packed_a.len() / a_sliver;
    let group = pack_b_slab.map_or(1, Slab::slivers_per_group);
    if let Some(slab) = pack_b_slab {
        (0..tiles).for_each(|part| slab.prefetch_group(0, group, part, tiles));
    }
    for s in 0..slivers {
        if let Some(slab) = pack_b_slab.filter(|_| s % group == 0) {
            let count = group.min(slivers - s);
            pack_operand(kernel, &slab.group(s, count), &mut packed_b[s * b_sliver..(s + count) * b_sliver]);
        }
        let b = &packed_b[s * b_sliver..(s + 1) * b_sliver];
        let j = j0 + s * nr;
        let width = nr.min(j0 + nc - j);
        for (r, a) in packed_a.chunks_exact(a_sliver).enumerate() {
            let i = i0 + r * mr;
            let height = mr.min(i0 + mc - i);
            let next_group = (s / group + 1) * group;
            if let Some(slab) = pack_b_slab.filter(|_| next_group < slivers) {
                slab.prefetch_group(next_group, group, (s % group) * tiles + r, group * tiles);
            }
            // SAFETY: `i < m` and `j < n`, so the tile origin lies inside C (checked against the
            // slice length at entry); this task owns the rectangle the block lies in.
            let c = unsafe { p.c.ptr().add(i * p.ldc + j) };
            if height == mr && width == nr {
                // SAFETY: a full tile lies inside C with row stride ldc; the slivers hold what
                // `tile` reads; the kernel was checked available at entry.
                unsafe { tile(kernel, words, a, b, c, p.ldc, accumulate) };
            } else {
                // SAFETY: the scratch tile holds mr*nr floats with row stride nr; rows < height and
                // columns < width of this tile are inside C.
                unsafe {
                    tile(kernel, words, a, b, edge.as_mut_ptr(), nr, false);
                    edge.apply(nr, c, p.ldc, (height, width), accumulate);
                }
            }
        }
    }
}

/// Dispatches one tile of the kernel's blocking: `acc = Σ_t dot2(a pair t, b word t)`, then
/// `C = acc` or `C = C + acc`.
///
/// # Safety
/// `a` holds one packed A sliver and `b` one packed B sliver of `words` pairs for the kernel's
/// tile; C rows `0..mr` at stride `ldc` have `nr` writable floats each; the CPU supports `kernel`.
unsafe fn tile(kernel: Bf16Kernel, words: usize, a: &[u32], b: &[u32], c: *mut f32, ldc: usize, acc: bool) {
    let Blocking { mr, nr, lines, .. } = kernel.blocking();
    debug_assert!(a.len() == lines * words * mr && b.len() == lines * words * nr);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded contract; availability was asserted in `gemm_bf16_with`.
        Bf16Kernel::Avx512Bf16 => unsafe {
            x86::bf16_gemm::tile_avx512bf16::<MR>(words, a.as_ptr(), b.as_ptr(), c, ldc, acc)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded contract; A's and B's words are f32 bit patterns, 2 * words lines
        // deep; availability as above.
        Bf16Kernel::Avx512 => unsafe {
            x86::tile_avx512::<MR, true>(2 * words, a.as_ptr().cast(), b.as_ptr().cast(), c, ldc, acc)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `Avx512`.
        Bf16Kernel::Avx2 => unsafe {
            x86::tile_avx2::<AVX2_MR, true>(2 * words, a.as_ptr().cast(), b.as_ptr().cast(), c, ldc, acc)
        },
        #[cfg(not(target_arch = "x86_64"))]
        Bf16Kernel::Avx512Bf16 | Bf16Kernel::Avx512 | Bf16Kernel::Avx2 => unreachable!("checked by is_available"),
        // SAFETY: forwarded contract.
        Bf16Kernel::Portable => unsafe { tile_portable(words, a, b, c, ldc, acc) },
    }
}

/// Packs a slab of A or B: into slivers of bf16 pairs (`pack`), or for the widened kernels into
/// f32 lines of bf16 values (`pack_lines`).
fn pack_operand<T: Bf16Operand>(kernel: Bf16Kernel, slab: &Slab<'_, T>, dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if kernel.blocking().lines == 2 {
        return pack_lines(slab, bytemuck::cast_slice_mut(dst));
    }
    pack(kernel, slab, dst)
}

/// The widened kernels' packing: `2 * ceil(kc / 2)` lines of `lanes` f32 values per sliver, each
/// rounded to bf16 (`to_bf16`), the line past an odd `kc` zero: the f32 GEMM's AVX2 packing
/// (every stride, vectorized, any multiple of 8 lanes), rounding each line as it writes it.
#[cfg(target_arch = "x86_64")]
fn pack_lines<T: Bf16Operand>(slab: &Slab<'_, T>, dst: &mut [f32]) {
    let (lanes, kc) = (slab.lanes, slab.kc);
    let lines = 2 * kc.div_ceil(2);
    assert!(slab.width > 0 && kc > 0 && dst.len() == slab.width.div_ceil(lanes) * lines * lanes);
    // f32 values are rounded, bf16 bits widened (`pack_bf16_bits_avx2`).
    let pack_lines_of = |slab: &Slab<'_, T>, dst: &mut [f32]| match (T::as_f32(slab.src), T::as_bits(slab.src)) {
        (Some(src), _) => pack_bf16_avx2(&slab.over(src), dst),
        (None, Some(src)) => pack_bf16_bits_avx2(&slab.over(src), dst),
        (None, None) => unreachable!("a bf16 GEMM operand is f32 or bf16"),
    };
    if kc == lines {
        pack_lines_of(slab, dst);
    } else {
        for (s, sliver) in dst.chunks_exact_mut(lines * lanes).enumerate() {
            pack_lines_of(&slab.group(s, 1), &mut sliver[..kc * lanes]);
            sliver[kc * lanes..].fill(0.0);
        }
    }
}

/// Packs a `width × kc` slab of a strided f32 matrix into `ceil(width / lanes)` slivers of bf16
/// pairs: `dst[s*words*lanes + t*lanes + w]` holds element `(s*lanes + w, 2t)` in its low half
/// and `(s*lanes + w, 2t + 1)` in its high half, where element `(w, q)` is
/// `src[base + w*wide_stride + q*deep_stride]`. Lanes past `width` and the half past an odd `kc`
/// are zero.
fn pack<T: Bf16Operand>(kernel: Bf16Kernel, slab: &Slab<'_, T>, dst: &mut [u32]) {
    let Slab { wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
    let words = kc.div_ceil(2);
    let src = slab.checked_source();
    assert!(dst.len() == width.div_ceil(lanes) * lanes * words);
    let word = |w: usize, q: usize| -> u32 {
        let at = w * wide_stride + q * deep_stride;
        let low = src[at].bf16_bits() as u32;
        let high = if q + 1 < kc { src[at + deep_stride].bf16_bits() as u32 } else { 0 };
        low | high << 16
    };
    for (s, sliver) in dst.chunks_exact_mut(words * lanes).enumerate() {
        let w0 = s * lanes;
        let sliver_width = lanes.min(width - w0);
        #[cfg(target_arch = "x86_64")]
        if kernel == Bf16Kernel::Avx512Bf16 && (wide_stride == 1 || deep_stride == 1) {
            let geometry = (wide_stride, deep_stride, sliver_width, kc, lanes);
            // SAFETY: the sliver's source holds elements (w, q) for w < sliver_width, q < kc at the
            // given strides (its far corner was checked above), `sliver` holds words*lanes words,
            // and this kernel is only used after detecting AVX-512F, BW, VL and BF16.
            unsafe {
                match (T::as_f32(src), T::as_bits(src)) {
                    (Some(src), _) => pack_sliver_avx512(&src[w0 * wide_stride..], geometry, sliver),
                    (None, Some(src)) => pack_sliver_avx512(&src[w0 * wide_stride..], geometry, sliver),
                    (None, None) => unreachable!("a bf16 GEMM operand is f32 or bf16"),
                }
            };
            continue;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = kernel;
        if sliver_width < lanes {
            sliver.fill(0);
        }
        if deep_stride == 1 {
            // Walk each source row along the depth (contiguous reads), scattering into lines.
            for w in 0..sliver_width {
                for t in 0..words {
                    sliver[t * lanes + w] = word(w0 + w, 2 * t);
                }
            }
        } else {
            for (t, line) in sliver.chunks_exact_mut(lanes).enumerate() {
                for (w, slot) in line[..sliver_width].iter_mut().enumerate() {
                    *slot = word(w0 + w, 2 * t);
                }
            }
        }
    }
}

/// `x86::bf16_gemm::pack_sliver` with its strides and extent as one tuple.
///
/// # Safety
/// That function's contract.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_sliver_avx512<T: x86::bf16_gemm::Lanes16>(
    src: &[T],
    (wide_stride, deep_stride, width, kc, lanes): (usize, usize, usize, usize, usize),
    dst: &mut [u32],
) {
    // SAFETY: forwarded contract.
    unsafe { x86::bf16_gemm::pack_sliver(src, wide_stride, deep_stride, width, kc, lanes, dst) }
}

/// Flushes a denormal to zero of the same sign, as `vdpbf16ps` does with its results.
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// The portable tile, computing exactly what `vdpbf16ps` computes: per word, the odd product is
/// added first, then the even one, each add rounded, denormals flushed.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` have `NR` writable floats each.
unsafe fn tile_portable(words: usize, a: &[u32], b: &[u32], c: *mut f32, ldc: usize, accumulate: bool) {
    let mut acc = [[0.0f32; NR]; MR];
    let split = |word: u32| (from_bf16(word as u16), from_bf16((word >> 16) as u16));
    for (a_step, b_step) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(words) {
        for (acc_row, &a_word) in acc.iter_mut().zip(a_step) {
            let (a_even, a_odd) = split(a_word);
            for (slot, &b_word) in acc_row.iter_mut().zip(b_step) {
                let (b_even, b_odd) = split(b_word);
                let sum = flush(*slot + flush(a_odd * b_odd));
                *slot = flush(sum + flush(a_even * b_even));
            }
        }
    }
    // SAFETY: the caller guarantees NR writable floats in each of the MR rows.
    unsafe { store_tile(&acc, c, ldc, accumulate) }
}

#[cfg(test)]
mod tests;
