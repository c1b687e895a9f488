//! Packing for the f32 GEMM: a strided slab of A or B (the region the f32 and the bf16 GEMM both
//! pack, `Slab`) into the kernel's `MR`-tall or `NR`-wide slivers (a streaming copy, a transpose
//! or a gather, by stride), zero-padded past the edge, with the prefetches that let packing B
//! overlap with arithmetic.

use super::MatRef;
use super::MicroKernel;

/// A `width × kc` region of a strided operand that packs into `ceil(width / lanes)` slivers:
/// element `(w, q)` is `src[base + w*wide_stride + q*deep_stride]`, `w` the index that becomes a
/// tile row or column and `q` the depth.
pub(crate) struct Slab<'a, T = f32> {
    pub(crate) src: &'a [T],
    pub(crate) base: usize,
    pub(crate) wide_stride: usize,
    pub(crate) deep_stride: usize,
    pub(crate) width: usize,
    pub(crate) kc: usize,
    pub(crate) lanes: usize,
}

// Manual impls: a slab is a slice and its geometry, copyable whatever `T` is.
impl<T> Clone for Slab<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Slab<'_, T> {}

impl<'a, T> Slab<'a, T> {
    /// Rows `i0..i0 + rows` of A at depths `p0..p0 + kc`, packed into `lanes`-tall slivers.
    pub(crate) fn of_a(a: &MatRef<'a, T>, (i0, rows): (usize, usize), (p0, kc): (usize, usize), lanes: usize) -> Self {
        let base = i0 * a.row_stride + p0 * a.col_stride;
        Slab { src: a.data, base, wide_stride: a.row_stride, deep_stride: a.col_stride, width: rows, kc, lanes }
    }

    /// The same region over `src`, a source of another element type (f32 values or bf16 bits).
    pub(crate) fn over<'b, U>(&self, src: &'b [U]) -> Slab<'b, U> {
        let Slab { base, wide_stride, deep_stride, width, kc, lanes, .. } = *self;
        Slab { src, base, wide_stride, deep_stride, width, kc, lanes }
    }

    /// The source from the slab's first element to its far corner, checked to lie in bounds (the
    /// entry check proved it for the whole view; re-checking the slab here keeps the packs'
    /// unchecked reads locally sound).
    pub(crate) fn checked_source(&self) -> &'a [T] {
        let Slab { src, base, wide_stride, deep_stride, width, kc, .. } = *self;
        assert!(width > 0 && kc > 0, "GEMM pack of an empty slab");
        let last = base + (width - 1) * wide_stride + (kc - 1) * deep_stride;
        assert!(last < src.len(), "GEMM pack out of bounds");
        &src[base..=last]
    }

    /// Columns `j0..j0 + cols` of B at depths `p0..p0 + kc`, packed into `lanes`-wide slivers.
    pub(crate) fn of_b(b: &MatRef<'a, T>, (p0, kc): (usize, usize), (j0, cols): (usize, usize), lanes: usize) -> Self {
        let base = p0 * b.row_stride + j0 * b.col_stride;
        Slab { src: b.data, base, wide_stride: b.col_stride, deep_stride: b.row_stride, width: cols, kc, lanes }
    }
}

impl<'a, T> Slab<'a, T> {
    /// Slivers packed (and prefetched) together: where the sliver lines are contiguous in the
    /// source, several slivers side by side make each source line a longer, cheaper read.
    pub(crate) fn slivers_per_group(&self) -> usize {
        if self.wide_stride == 1 {
            8
        } else {
            1
        }
    }

    /// The slab of `count` slivers starting at sliver `s` (the last one may be narrower).
    pub(crate) fn group(&self, s: usize, count: usize) -> Slab<'a, T> {
        let base = self.base + s * self.lanes * self.wide_stride;
        Slab { base, width: (count * self.lanes).min(self.width - s * self.lanes), ..*self }
    }

    /// Prefetches part `part` of `parts` of the source of `count` slivers starting at `s` into
    /// L2, so that packing them later reads from cache instead of waiting on memory. Layouts
    /// with no unit stride are left to the hardware.
    pub(crate) fn prefetch_group(&self, s: usize, count: usize, part: usize, parts: usize) {
        let Slab { base, width, .. } = self.group(s, count);
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
                line.iter().step_by(64 / std::mem::size_of::<T>().max(1)).chain(line.last()).for_each(prefetch_l2);
            }
        }
    }
}

impl Slab<'_> {
    /// Packs `count` slivers starting at sliver `s` into `dst`.
    pub(super) fn pack_group<K: MicroKernel>(&self, s: usize, count: usize, dst: &mut [f32]) {
        pack::<K>(&self.group(s, count), dst);
    }
}

/// Packs a slab into `ceil(width / lanes)` slivers. Sliver `s` holds
/// `dst[s*kc*lanes + q*lanes + w] = src[base + (s*lanes + w)*wide_stride + q*deep_stride]`; lanes
/// past `width` are zero so edge tiles multiply zeros.
pub(crate) fn pack<K: MicroKernel>(slab: &Slab<'_>, dst: &mut [f32]) {
    pack_as::<K, false>(slab, dst)
}

/// The AVX2 bf16 GEMM's packing: `pack::<Avx2>`'s layout with every value rounded to bf16
/// (`to_bf16`) and kept as f32, rounded as the lines are written rather than in a pass after.
/// Call it only where the CPU has AVX2 (the AVX2 bf16 kernel's packing).
#[cfg(target_arch = "x86_64")]
pub(crate) fn pack_bf16_avx2(slab: &Slab<'_>, dst: &mut [f32]) {
    pack_as::<super::x86::Avx2, true>(slab, dst)
}

/// The AVX2 bf16 GEMM's packing of a bf16 operand (bits): `pack_bf16_avx2`'s layout, each value
/// widened to f32 with a shift (`widen_bf16`) instead of rounded. Half the bytes of the f32
/// operand are read, and nothing is rounded: the CPU Device's bf16 working copy of the weights.
/// Call it only where the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
pub(crate) fn pack_bf16_bits_avx2(slab: &Slab<'_, u16>, dst: &mut [f32]) {
    let Slab { wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
    let src = slab.checked_source();
    assert!(dst.len() == width.div_ceil(lanes) * lanes * kc);
    if wide_stride == 1 && deep_stride != 1 && lanes.is_multiple_of(8) {
        // Each depth step is one contiguous line across the slivers (see `pack_as`).
        for q in 0..kc {
            if q + PREFETCH_STEPS < kc {
                let ahead = (q + PREFETCH_STEPS) * deep_stride;
                src[ahead..ahead + width].iter().step_by(32).for_each(prefetch_to::<TO_L1, u16>);
            }
            let line = &src[q * deep_stride..][..width];
            // SAFETY: this packing is only called on CPUs with AVX2.
            unsafe { super::x86::widen_bf16_line_to_slivers_avx2(line, lanes, &mut dst[q * lanes..], kc * lanes) };
        }
        return;
    }
    for (s, sliver) in dst.chunks_exact_mut(kc * lanes).enumerate() {
        let w0 = s * lanes;
        let sliver_width = lanes.min(width - w0);
        let sliver_src = &src[w0 * wide_stride..];
        if deep_stride == 1 {
            // SAFETY: `sliver_src` holds rows 0..sliver_width of kc contiguous values at stride
            // `wide_stride` (checked above); `sliver` holds kc*lanes floats; the CPU has AVX2.
            unsafe { super::x86::transpose_widen_bf16_avx2(sliver_src, wide_stride, sliver_width, kc, lanes, sliver) };
            continue;
        }
        sliver.fill(0.0);
        for (q, out) in sliver.chunks_exact_mut(lanes).enumerate() {
            for (w, slot) in out[..sliver_width].iter_mut().enumerate() {
                *slot = widen_bf16(sliver_src[w * wide_stride + q * deep_stride]);
            }
        }
    }
}

/// The f32 value of bf16 bits, a denormal flushed to a zero of the same sign (as `to_bf16` flushes
/// an f32 operand's): how the bf16 GEMM reads an operand held as bf16.
#[inline(always)]
pub(crate) fn widen_bf16(bits: u16) -> f32 {
    let kept = if bits & 0x7F80 == 0 { bits & 0x8000 } else { bits };
    f32::from_bits((kept as u32) << 16)
}

/// `pack`, with each value rounded to bf16 where `ROUND` (only with the AVX2 kernel, on x86-64).
fn pack_as<K: MicroKernel, const ROUND: bool>(slab: &Slab<'_>, dst: &mut [f32]) {
    let Slab { wide_stride, deep_stride, width, kc, lanes, .. } = *slab;
    let src = slab.checked_source();
    assert!(dst.len() == width.div_ceil(lanes) * lanes * kc);
    debug_assert!(!ROUND || K::AVX2_PACKING, "only the AVX2 packing rounds to bf16");

    if wide_stride == 1 && deep_stride != 1 {
        // Each depth step is contiguous across slivers. Walk a few slivers at a time so that
        // every source line is read once and whole, while the writes stay a handful of
        // sequential streams; prefetch the lines a few steps ahead, since each step starts a new
        // stream far away.
        let slivers = width.div_ceil(lanes);
        let mut rounded = [0.0f32; SLIVERS_PER_PASS * MAX_LANES];
        assert!(lanes <= MAX_LANES, "GEMM pack: slivers wider than {MAX_LANES}");
        for first in (0..slivers).step_by(SLIVERS_PER_PASS) {
            let begin = first * lanes;
            let end = width.min(begin + SLIVERS_PER_PASS * lanes);
            for q in 0..kc {
                if q + PREFETCH_STEPS < kc {
                    let ahead = (q + PREFETCH_STEPS) * deep_stride;
                    src[ahead + begin..ahead + end].iter().step_by(16).for_each(prefetch);
                }
                let source = &src[q * deep_stride + begin..q * deep_stride + end];
                #[cfg(target_arch = "x86_64")]
                if ROUND && lanes.is_multiple_of(8) {
                    let out = &mut dst[first * kc * lanes + q * lanes..];
                    // SAFETY: only `pack_bf16_avx2` rounds, on CPUs with AVX2.
                    unsafe { super::x86::round_bf16_line_to_slivers_avx2(source, lanes, out, kc * lanes) };
                    continue;
                }
                let line = line_as::<ROUND>(source, &mut rounded);
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
                unsafe { super::x86::pack_transposed_avx512(sliver_src, wide_stride, sliver_width, kc, lanes, sliver) };
                continue;
            }
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            if K::AVX2_PACKING {
                // SAFETY: as above; only AVX2 kernels ask for AVX2 packing.
                unsafe {
                    super::x86::transpose_pack_avx2::<ROUND>(sliver_src, wide_stride, sliver_width, kc, lanes, sliver)
                };
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
            #[cfg(target_arch = "x86_64")]
            if ROUND {
                // SAFETY: only `pack_bf16_avx2` rounds, on CPUs with AVX2.
                unsafe { super::x86::round_bf16_lines_avx2(sliver) };
            }
        }
    }
}

/// A depth step of the streaming pack as it is copied to the slivers: the source line itself, or
/// where `ROUND` (the AVX2 bf16 packing of 6-wide A slivers; B's 16-wide ones are rounded straight
/// into place) the line rounded to bf16 into `buf`, in whole vectors. Rounding it chunk by chunk
/// instead, with a masked load and store per 6-wide A chunk, cost 0.073 of the tile's samples in
/// the capped bf16 step on a Zen 4, against 0.045 this way.
#[inline(always)]
fn line_as<'l, const ROUND: bool>(line: &'l [f32], buf: &'l mut [f32]) -> &'l [f32] {
    #[cfg(target_arch = "x86_64")]
    if ROUND {
        // SAFETY: only `pack_bf16_avx2` rounds, on CPUs with AVX2.
        unsafe { super::x86::round_bf16_into_avx2(line, buf) };
        return &buf[..line.len()];
    }
    let _ = buf;
    line
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

/// The widest sliver of any kernel (AVX-512's 32 columns).
const MAX_LANES: usize = 32;

/// Which cache level a prefetch fills: L1 for data needed next, L2 for data needed far ahead (so
/// it does not evict the working set in L1). The values are x86's `_MM_HINT_T0` / `_MM_HINT_T1`.
const TO_L1: i32 = 3;
const TO_L2: i32 = 2;

/// Hints that the cache line holding `value` will be read soon, into the level `HINT` names. A
/// no-op off x86-64.
#[inline(always)]
fn prefetch_to<const HINT: i32, T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and does not change memory; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>((value as *const T).cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[inline(always)]
fn prefetch(value: &f32) {
    prefetch_to::<TO_L1, f32>(value)
}

#[inline(always)]
fn prefetch_l2<T>(value: &T) {
    prefetch_to::<TO_L2, T>(value)
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
