//! bf16 GEMM for the CPU backend: f32 operands rounded to bf16 while packing (or a B of bf16 bits,
//! the CPU Device's bf16 working copy of the weights, widened while packing: `Bf16Operand`),
//! multiplied in pairs along the depth with AVX512-BF16 `vdpbf16ps`, with AVX2 FMAs on the bf16
//! values packed as f32, or with a bit-identical portable kernel; f32 accumulation and f32 output.
//!
//! `gemm_bf16` has the contract of `gemm::gemm`: `C[i*ldc + j] = (accumulate ? C : 0) +
//! Σ_p bf16(A(i,p))·bf16(B(p,j))` for strided views A and B, where `bf16` rounds to nearest even.
//!
//! Arithmetic, as `vdpbf16ps` does it (verified on this machine, 10⁶ random cases, bitwise): each
//! packed word holds the bf16 values of depth steps `2t` (low half) and `2t + 1` (high half); one
//! step computes `acc = (acc + a_odd·b_odd) + a_even·b_even`, the odd product first, each add
//! rounded to nearest even. Products of two bf16 values are exact in f32. Denormal inputs and
//! outputs are flushed to zero. Packing flushes denormal inputs for every kernel, and the portable
//! kernel flushes denormal products and sums, so it gives `vdpbf16ps`'s bits. The AVX2 kernel
//! runs the same two rounded adds as FMAs (an exact product plus the sum, rounded once, is the
//! same add), so it gives the same bits too, except where a product or a partial sum is denormal
//! (below 2^-126): FMA keeps it, `vdpbf16ps` flushes it, and the results differ by at most 2^-126
//! per product. Tests check both statements.
//!
//! Structure: the blocking and parallel split of `gemm` (its `Grid`: one rectangle of whole tiles
//! per task, every sum's order fixed by the shape alone, so results are bit-identical for any
//! thread count). The depth block `KC` is the same for every kernel (so is the order of the sums);
//! the tile is 8 × 32 for AVX512-BF16 and portable, 6 × 16 for AVX2 (`Bf16Kernel::blocking`).
//! For AVX512-BF16 and portable, packed slivers hold `u32` words of two bf16 values,
//! `ceil(kc / 2)` words deep, an odd depth padded with a zero half; unit-stride slabs are packed
//! with AVX-512F integer rounding (and a 16×16 word transpose when the depth is the contiguous
//! index), bit-identical to `to_bf16`; a test compares the two on random bit patterns. The AVX2
//! kernel is the f32 GEMM's AVX2 tile on the bf16 values held as f32, with its depth steps taken
//! in pairs odd first (`x86::tile_avx2::<6, true>`), which is `vdpbf16ps`'s order: both operands
//! are packed by the f32 GEMM's packing into `2 * ceil(kc / 2)` lines (an odd depth padded with a
//! zero line), each value rounded to bf16 as it is written (`pack::pack_bf16_avx2`; compared
//! with `to_bf16` on random bit patterns by a test, as the AVX-512 packing is). Widening once
//! while packing, rather than in the tile at every use, lets its FMAs run at the f32 tile's rate:
//! the earlier tile, which widened bf16 pairs in registers with a mask and a shift, ran 7-40%
//! slower on most GEMM shapes (under the AVX2 cap on an Intel Xeon, whose shifts share the FMA
//! ports; BENCHMARKS.md). B is packed a group of slivers at a time during the first row block,
//! its next group's source prefetched meanwhile, as in `gemm`. The x86 code (the AVX512-BF16
//! packing and tile) sits with the f32 kernels in `gemm/x86.rs`, `bf16_gemm`; the tests both
//! GEMMs share are in `gemm/tests.rs`.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use super::gemm::driver::{for_each_rectangle, with_buffer, AlignedBuffer, EdgeTile, Problem};
use super::gemm::pack::Slab;
#[cfg(target_arch = "x86_64")]
use super::gemm::pack::{pack_bf16_avx2, pack_bf16_bits_avx2};
use super::gemm::portable::store_tile;
#[cfg(target_arch = "x86_64")]
use super::gemm::x86;
use super::gemm::MatRef;
use super::pool::ThreadPool;

/// The bf16 micro-kernels; `best_bf16_kernel` picks the fastest the CPU supports (at the level
/// `TRIDENT_CPU_ISA` allows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Kernel {
    /// AVX512-BF16 `vdpbf16ps` on zmm registers.
    Avx512Bf16,
    /// AVX2 + FMA: both operands' bf16 values packed as f32, the f32 AVX2 tile over them with
    /// each depth pair's two FMAs in `vdpbf16ps`'s order.
    Avx2,
    /// Plain Rust with the same rounding, for any CPU.
    Portable,
}

impl Bf16Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Bf16Kernel; 3] = [Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx2, Bf16Kernel::Portable];

    /// A short name for logs and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Avx512Bf16 => "avx512bf16",
            Bf16Kernel::Avx2 => "avx2",
            Bf16Kernel::Portable => "portable",
        }
    }

    /// Whether this CPU can run the kernel at the level `TRIDENT_CPU_ISA` allows (`isa::active`).
    pub fn is_available(self) -> bool {
        self.isa() <= super::isa::active()
    }

    /// The instruction-set level the kernel needs.
    pub fn isa(self) -> super::isa::Isa {
        match self {
            Bf16Kernel::Avx512Bf16 => super::isa::Isa::Avx512Bf16,
            Bf16Kernel::Avx2 => super::isa::Isa::Avx2,
            Bf16Kernel::Portable => super::isa::Isa::Portable,
        }
    }

    /// The tile (`MR` rows × `NR` columns), the row block `MC` (a multiple of `MR`) and the
    /// packed lines per depth pair.
    fn blocking(self) -> Blocking {
        match self {
            Bf16Kernel::Avx2 => Blocking { mr: AVX2_MR, nr: 16, mc: 120, lines: 2 },
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
    /// Lines of packed A and of packed B per depth pair: one of bf16 pairs, or (AVX2) two of f32
    /// values.
    lines: usize,
}

/// Rows of the AVX2 kernel's tile.
const AVX2_MR: usize = 6;

/// The fastest bf16 kernel this CPU supports, detected once.
pub fn best_bf16_kernel() -> Bf16Kernel {
    static BEST: OnceLock<Bf16Kernel> = OnceLock::new();
    *BEST.get_or_init(|| Bf16Kernel::ALL.into_iter().find(|k| k.is_available()).unwrap_or(Bf16Kernel::Portable))
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
        Bf16Kernel::Avx2 => unsafe {
            x86::tile_avx2::<AVX2_MR, true>(2 * words, a.as_ptr().cast(), b.as_ptr().cast(), c, ldc, acc)
        },
        #[cfg(not(target_arch = "x86_64"))]
        Bf16Kernel::Avx512Bf16 | Bf16Kernel::Avx2 => unreachable!("checked by is_available"),
        // SAFETY: forwarded contract.
        Bf16Kernel::Portable => unsafe { tile_portable(words, a, b, c, ldc, acc) },
    }
}

/// Packs a slab of A or B: into slivers of bf16 pairs (`pack`), or for the AVX2 kernel into f32
/// lines of bf16 values (`pack_lines`).
fn pack_operand<T: Bf16Operand>(kernel: Bf16Kernel, slab: &Slab<'_, T>, dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Avx2 {
        return pack_lines(slab, bytemuck::cast_slice_mut(dst));
    }
    pack(kernel, slab, dst)
}

/// The AVX2 kernel's packing: `2 * ceil(kc / 2)` lines of `lanes` f32 values per sliver, each
/// rounded to bf16 (`to_bf16`), the line past an odd `kc` zero: the f32 GEMM's packing (every
/// stride, vectorized), rounding each line as it writes it.
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
mod tests {
    use super::super::gemm::test_support::{fill, run, same_bits, STORAGES};
    use super::*;

    #[test]
    fn gemm_bf16_rounding_is_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        // Exactly halfway between 1.0 and the next bf16: ties to the even 1.0.
        assert_eq!(to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        // Halfway above an odd mantissa: ties up to even.
        assert_eq!(to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(to_bf16(-2.5), 0xC020);
        assert_eq!(to_bf16(f32::MAX), 0x7F80);
        assert_eq!(to_bf16(f32::INFINITY), 0x7F80);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(to_bf16(f32::from_bits(1)), 0);
        assert_eq!(to_bf16(-f32::from_bits(1)), 0x8000);
    }

    /// AVX512-BF16 gives the portable kernel's bits always, AVX2 wherever no product or partial
    /// sum is denormal (these inputs have none).
    #[test]
    fn gemm_bf16_fast_kernels_are_bitwise_equal_to_portable() {
        let pool = ThreadPool::new(2);
        for kernel in [Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx2] {
            if !kernel.is_available() {
                eprintln!("SKIPPED: CPU lacks {} (or TRIDENT_CPU_ISA caps it)", kernel.name());
                continue;
            }
            for shape in [(257, 100, 33), (33, 257, 1537), (100, 3100, 17), (64, 768, 769), (7, 5, 3)] {
                for storage in STORAGES {
                    let fast = run(kernel, &pool, shape, storage);
                    let portable = run(Bf16Kernel::Portable, &pool, shape, storage);
                    assert!(same_bits(&fast, &portable), "{} {shape:?} {storage:?}: kernels differ", kernel.name());
                }
            }
            // Views with no unit stride (every other element), packed by gathering.
            let (m, n, k) = (13, 37, 21);
            let (a_data, b_data) = (crate::rng::fill(2 * m * k + 2, 5), crate::rng::fill(2 * k * n + 2, 6));
            let a = MatRef { data: &a_data, row_stride: 2 * k, col_stride: 2 };
            let b = MatRef { data: &b_data, row_stride: 2, col_stride: 2 * k };
            let mut results = Vec::new();
            for kernel in [kernel, Bf16Kernel::Portable] {
                let mut c = vec![0.0f32; m * n];
                gemm_bf16_with(kernel, &pool, m, n, k, a, b, &mut c, n, false);
                results.push(c);
            }
            assert!(same_bits(&results[0], &results[1]), "{}: strided views differ", kernel.name());
        }
    }

    /// Where a product of two bf16 values is denormal, `vdpbf16ps` (and the portable kernel)
    /// flush it to zero and the AVX2 kernel's FMA keeps it: the results differ by at most one
    /// smallest normal (2^-126) per product, the bound ARCHITECTURE.md states.
    #[test]
    fn gemm_bf16_avx2_keeps_denormal_products_within_the_stated_bound() {
        if !Bf16Kernel::Avx2.is_available() {
            eprintln!("SKIPPED: CPU lacks avx2 (or TRIDENT_CPU_ISA caps it)");
            return;
        }
        let pool = ThreadPool::new(1);
        let (m, n, k) = (7, 19, 40);
        let tiny = 2f32.powi(-70); // A product of two is 2^-140, below 2^-126.
        let a: Vec<f32> = (0..m * k).map(|i| tiny * (1.0 + (i % 5) as f32 / 8.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| tiny * (1.0 + (i % 3) as f32 / 4.0)).collect();
        let mut results = Vec::new();
        for kernel in [Bf16Kernel::Avx2, Bf16Kernel::Portable] {
            let mut c = vec![0.0f32; m * n];
            let (a, b) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
            gemm_bf16_with(kernel, &pool, m, n, k, a, b, &mut c, n, false);
            results.push(c);
        }
        assert!(results[1].iter().all(|&x| x == 0.0), "the portable kernel flushes denormal products");
        for (&kept, &flushed) in results[0].iter().zip(&results[1]) {
            assert!(kept > 0.0 && (kept - flushed).abs() <= k as f32 * 2f32.powi(-126), "{kept:e} vs {flushed:e}");
        }
    }

    #[test]
    fn gemm_bf16_avx512_packing_is_bitwise_equal_to_scalar() {
        if !Bf16Kernel::Avx512Bf16.is_available() {
            eprintln!("skipped: CPU lacks avx512bf16");
            return;
        }
        for_each_random_slab(&[(32, 32), (32, 17), (8, 8), (8, 3)], |slab| {
            let Slab { wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
            let size = kc.div_ceil(2) * lanes;
            let (mut fast, mut scalar) = (vec![7u32; size], vec![9u32; size]);
            pack(Bf16Kernel::Avx512Bf16, slab, &mut fast);
            pack(Bf16Kernel::Portable, slab, &mut scalar);
            assert_eq!(fast, scalar, "lanes {lanes} width {width} kc {kc} strides ({wide_stride}, {deep_stride})");
            // The same slab as bf16 bits (the top halves of the patterns, denormals among them).
            let bits = bits_of(slab.src);
            let slab = slab.over(&bits[..]);
            let (mut fast, mut scalar) = (vec![7u32; size], vec![9u32; size]);
            pack(Bf16Kernel::Avx512Bf16, &slab, &mut fast);
            pack(Bf16Kernel::Portable, &slab, &mut scalar);
            assert_eq!(
                fast, scalar,
                "bits: lanes {lanes} width {width} kc {kc} strides ({wide_stride}, {deep_stride})"
            );
        });
    }

    /// The AVX2 packing of bf16 bits holds each as its f32 value, a denormal flushed to a zero of
    /// the same sign (NaNs and infinities kept), zero past the slab's width and depth: what the
    /// f32 packing gives for those values (`to_bf16` flushes the same denormals).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gemm_bf16_avx2_packing_widens_bf16_bits() {
        if !Bf16Kernel::Avx2.is_available() {
            eprintln!("SKIPPED: CPU lacks avx2 (or TRIDENT_CPU_ISA caps it)");
            return;
        }
        let bits: Vec<u16> = random_bit_patterns().iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        for_each_random_slab(&[(16, 16), (16, 24), (16, 37), (16, 130), (6, 13)], |slab| {
            let Slab { wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
            let slab = slab.over(&bits[..]);
            let (slivers, lines) = (width.div_ceil(lanes), 2 * kc.div_ceil(2));
            let mut packed = vec![7.0f32; slivers * lines * lanes];
            pack_lines(&slab, &mut packed);
            for (at, got) in packed.iter().enumerate() {
                let (w, q) = (at / (lines * lanes) * lanes + at % lanes, at / lanes % lines);
                let in_slab = w < width && q < kc;
                let b = if in_slab { bits[w * wide_stride + q * deep_stride] } else { 0 };
                let want = if b & 0x7F80 == 0 { from_bf16(b & 0x8000) } else { from_bf16(b) };
                assert_eq!(got.to_bits(), want.to_bits(), "lanes {lanes} width {width} kc {kc} ({w}, {q})");
            }
        });
    }

    /// Every kernel multiplies a B of bf16 bits exactly as the B of their f32 values, bit for bit,
    /// in every layout of B (row-major, transposed, no unit stride), across depth blocks and odd
    /// depths, denormals (flushed either way), zeros and infinities included.
    #[test]
    fn gemm_bf16_takes_bf16_bits_as_their_values() {
        let pool = ThreadPool::new(2);
        let mut state = 0x9E37_79B9u32;
        for kernel in Bf16Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            for (m, n, k) in [(13, 37, 29), (20, 70, 800), (7, 16, 6), (6, 130, 64)] {
                let a = crate::rng::fill(m * k, 3);
                let mut bits: Vec<u16> = (0..2 * k * n + 2)
                    .map(|_| {
                        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        // Random signs and mantissas, exponents near 1 so sums stay finite.
                        ((state >> 16) as u16 & 0x807F) | 0x3C00 | ((state >> 9) as u16 & 0x0380)
                    })
                    .collect();
                for (at, special) in [(1, 0x0001), (5, 0x8042), (9, 0x0000), (12, 0x8000), (17, 0x7F80), (40, 0x0080)] {
                    bits[at] = special;
                }
                let values: Vec<f32> = bits.iter().map(|&b| from_bf16(b)).collect();
                let views = [(n, 1), (1, k), (2 * n, 2)];
                for (row_stride, col_stride) in views {
                    let run_with = |c: &mut Vec<f32>, bits: bool| {
                        let a = MatRef::row_major(&a, k);
                        match bits {
                            true => gemm_bf16_with(
                                kernel,
                                &pool,
                                m,
                                n,
                                k,
                                a,
                                MatRef { data: &bits_of(&values), row_stride, col_stride },
                                c,
                                n,
                                false,
                            ),
                            false => gemm_bf16_with(
                                kernel,
                                &pool,
                                m,
                                n,
                                k,
                                a,
                                MatRef { data: &values[..], row_stride, col_stride },
                                c,
                                n,
                                false,
                            ),
                        }
                    };
                    let (mut from_bits, mut from_values) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
                    run_with(&mut from_bits, true);
                    run_with(&mut from_values, false);
                    let what = format!("{} {m}x{n}x{k} strides ({row_stride}, {col_stride})", kernel.name());
                    assert!(same_bits(&from_bits, &from_values), "{what}: bf16 bits and f32 values differ");
                    assert!(from_values.iter().any(|&x| x != 0.0), "{what}: a zero product");
                }
            }
        }
    }

    /// The bf16 bits of values that are bf16 already.
    fn bits_of(values: &[f32]) -> Vec<u16> {
        values.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
    }

    /// Runs `check` on slabs of random bit patterns (NaNs, infinities, denormals, ties, plus some
    /// exact ties) for each `(lanes, width)`, depths odd and even, and each kind of stride.
    fn for_each_random_slab(lanes_widths: &[(usize, usize)], check: impl Fn(&Slab<'_>)) {
        let data = random_bit_patterns();
        for &(lanes, width) in lanes_widths {
            for kc in [1, 2, 31, 33, 64, 69] {
                for (wide_stride, deep_stride) in [(1, 40), (70, 1), (3, 100)] {
                    if (width - 1) * wide_stride + (kc - 1) * deep_stride < data.len() {
                        check(&Slab { src: &data, base: 0, wide_stride, deep_stride, width, kc, lanes });
                    }
                }
            }
        }
    }

    /// 40 × 70 random bit patterns, with exact ties, a denormal, the largest f32 and signed zeros
    /// planted (zeros mixed with a NaN, with a denormal and with normal values, in both of the
    /// contiguous directions: runs and columns of 40 and 70).
    fn random_bit_patterns() -> Vec<f32> {
        let mut state = 0x1234_5678_9ABC_DEFFu64;
        let mut data: Vec<f32> = (0..40 * 70)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                f32::from_bits((state >> 20) as u32)
            })
            .collect();
        data[3] = f32::from_bits(0x3F80_8000);
        data[4] = f32::from_bits(0x3F81_8000);
        data[5] = f32::from_bits(0x8000_0001);
        data[6] = f32::MAX;
        for at in [7, 8, 47, 48, 70, 71, 140, 141, 210, 280] {
            data[at] = if at % 2 == 0 { 0.0 } else { -0.0 };
        }
        data[9] = f32::from_bits(0x7FC0_1234);
        data[120] = f32::from_bits(0x0000_0042);
        data
    }

    /// The AVX2 kernel's packing holds each element as `from_bf16(to_bf16(x))`, bit for bit
    /// (NaNs quieted, denormals flushed), in `2 * ceil(kc / 2)` lines per sliver, zero past the
    /// slab's width and depth.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gemm_bf16_avx2_packing_rounds_as_to_bf16() {
        if !Bf16Kernel::Avx2.is_available() {
            eprintln!("SKIPPED: CPU lacks avx2 (or TRIDENT_CPU_ISA caps it)");
            return;
        }
        for_each_random_slab(&[(16, 16), (16, 37), (6, 6), (6, 13)], |slab| {
            let Slab { src, wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
            let (slivers, lines) = (width.div_ceil(lanes), 2 * kc.div_ceil(2));
            let mut packed = vec![7.0f32; slivers * lines * lanes];
            pack_lines(slab, &mut packed);
            for (at, got) in packed.iter().enumerate() {
                let (w, q) = (at / (lines * lanes) * lanes + at % lanes, at / lanes % lines);
                let in_slab = w < width && q < kc;
                let want = if in_slab { from_bf16(to_bf16(src[w * wide_stride + q * deep_stride])) } else { 0.0 };
                assert_eq!(got.to_bits(), want.to_bits(), "lanes {lanes} width {width} kc {kc} ({w}, {q})");
            }
        });
    }

    /// GFLOP/s of bf16 vs f32 GEMM on 2 threads against the FMA peak:
    /// `cargo test --release gemm_bf16_bench -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gemm_bf16_bench() {
        use std::time::Instant;
        let pool = ThreadPool::new(2);
        let peak = crate::device::cpu::peak::measure_fma_peak(&pool, 300);
        println!("FMA peak: {:.1} GFLOP/s ({} threads, {})", peak.gflops, peak.threads, peak.isa);
        for (m, n, k, layout) in [(2048, 2048, 2048, "NN"), (256, 2304, 768, "NT"), (256, 2304, 768, "NN")] {
            let a_data = fill(m * k, 1);
            let b_data = fill(k * n, 2);
            let a = MatRef::row_major(&a_data, k);
            let b = if layout == "NT" { MatRef::transposed(&b_data, k) } else { MatRef::row_major(&b_data, n) };
            let mut c = vec![0.0f32; m * n];
            let flops = 2.0 * (m * n * k) as f64;
            let time = |f: &mut dyn FnMut()| {
                f();
                let reps = ((2e10 / flops) as usize).clamp(3, 200);
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let start = Instant::now();
                    f();
                    best = best.min(start.elapsed().as_secs_f64());
                }
                flops / best / 1e9
            };
            let f32_rate = time(&mut || crate::device::cpu::gemm::gemm(&pool, m, n, k, a, b, &mut c, n, false));
            let bf16_rate = time(&mut || gemm_bf16(&pool, m, n, k, a, b, &mut c, n, false));
            println!(
                "{m}x{n}x{k} {layout}: f32 {f32_rate:.1} GFLOP/s ({:.0}% peak), bf16 [{}] {bf16_rate:.1} GFLOP/s \
                 ({:.0}% of FMA peak, {:.2}x f32)",
                100.0 * f32_rate / peak.gflops,
                best_bf16_kernel().name(),
                100.0 * bf16_rate / peak.gflops,
                bf16_rate / f32_rate
            );
        }
    }
}
