//! The x86 micro-kernels, each compiled for its instruction set and chosen at run time: the f32
//! GEMM's (AVX-512F: 8 rows × 32 columns; AVX2+FMA: 6 rows × 16 columns) with the AVX-512 16×16
//! transposing pack (both tiles also serve the bf16 GEMM, its depth pairs odd first), and in
//! `bf16_gemm` the bf16 GEMM's AVX512-BF16 tile (8 × 32, `vdpbf16ps`) with its AVX-512 packing.
//! The AVX-512 tiles of both share their C prefetch and store.

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
        // `isa::active()` reaches AVX-512, which `isa::detected` sets only after detecting it.
        unsafe { tile_avx512::<AVX512_MR, false>(kc, a, b, c, ldc, accumulate) }
    }
}

/// The AVX-512 body of `MicroKernel::tile` for `MR` rows and 32 columns. With `SWAP_PAIRS` the
/// depth steps go in pairs, odd first (1, 0, 3, 2, ...; `kc` even): `vdpbf16ps`'s order, which
/// the widened AVX-512 bf16 GEMM runs on its operands rounded to bf16 and packed as f32 lines.
///
/// # Safety
/// As `MicroKernel::tile` with `NR = 32`, and the CPU must support AVX-512F; with `SWAP_PAIRS`,
/// `kc` is even.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile_avx512<const MR: usize, const SWAP_PAIRS: bool>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the pointer arithmetic stays inside the ranges the caller guarantees.
    unsafe {
        prefetch_tile::<MR, 32>(c, ldc);
        let mut lo = [_mm512_setzero_ps(); MR];
        let mut hi = [_mm512_setzero_ps(); MR];
        let step = |a: *const f32, b: *const f32, lo: &mut [__m512; MR], hi: &mut [__m512; MR]| {
            let b_lo = _mm512_loadu_ps(b);
            let b_hi = _mm512_loadu_ps(b.add(16));
            for i in 0..MR {
                let a_i = _mm512_set1_ps(*a.add(i));
                lo[i] = _mm512_fmadd_ps(a_i, b_lo, lo[i]);
                hi[i] = _mm512_fmadd_ps(a_i, b_hi, hi[i]);
            }
        };
        let (mut a, mut b) = (a, b);
        if SWAP_PAIRS {
            debug_assert!(kc.is_multiple_of(2));
            for _ in 0..kc / 2 {
                step(a.add(MR), b.add(32), &mut lo, &mut hi);
                step(a, b, &mut lo, &mut hi);
                a = a.add(2 * MR);
                b = b.add(64);
            }
        } else {
            for _ in 0..kc {
                step(a, b, &mut lo, &mut hi);
                a = a.add(MR);
                b = b.add(32);
            }
        }
        store_tile::<MR>(c, ldc, &lo, &hi, accumulate);
    }
}

/// Prefetches the `MR` rows of an `MR × NR` tile of C into L1 before its accumulation starts,
/// every cache line of a row (one per 16 floats, and the line of the last, which an unaligned
/// row reaches into): the final add otherwise waits on C's misses (about a tenth of the AVX2
/// tile's time on the 2048³ GEMMs, by `perf annotate`). The AVX-512 and AVX2 tiles (f32 and
/// bf16) start with it.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` hold `NR` floats each.
#[inline]
pub(crate) unsafe fn prefetch_tile<const MR: usize, const NR: usize>(c: *mut f32, ldc: usize) {
    // SAFETY: the rows lie inside C, as the caller guarantees; a prefetch never faults.
    unsafe {
        for i in 0..MR {
            let row = c.add(i * ldc);
            for j in (0..NR).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(row.add(j) as *const i8);
            }
            _mm_prefetch::<_MM_HINT_T0>(row.add(NR - 1) as *const i8);
        }
    }
}

/// Stores the accumulators of an `MR × 32` tile (columns 0..16 in `lo`, 16..32 in `hi`) to C:
/// `C = acc` or, when `accumulate`, `C = C + acc`. The AVX512-BF16 kernel ends the same way.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` have 32 writable floats each; the CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store_tile<const MR: usize>(
    c: *mut f32,
    ldc: usize,
    lo: &[__m512; MR],
    hi: &[__m512; MR],
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the rows are writable.
    unsafe {
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
    const AVX2_PACKING: bool = true;

    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        // SAFETY: forwarded contract; `drive` only instantiates this kernel after detecting
        // avx2 and fma.
        unsafe { tile_avx2::<AVX2_MR, false>(kc, a, b, c, ldc, accumulate) }
    }
}

/// The AVX2 body of `MicroKernel::tile` for `MR` rows and 16 columns. With `SWAP_PAIRS` the
/// depth steps go in pairs, odd first (1, 0, 3, 2, ...; `kc` even): `vdpbf16ps`'s order, which
/// the AVX2 bf16 GEMM runs on its operands rounded to bf16 and packed as f32 lines.
///
/// # Safety
/// As `MicroKernel::tile` with `NR = 16`, and the CPU must support AVX2 and FMA; with
/// `SWAP_PAIRS`, `kc` is even.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_avx2<const MR: usize, const SWAP_PAIRS: bool>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the pointer arithmetic stays inside the ranges the caller guarantees.
    unsafe {
        prefetch_tile::<MR, 16>(c, ldc);
        let mut lo = [_mm256_setzero_ps(); MR];
        let mut hi = [_mm256_setzero_ps(); MR];
        let (mut a, mut b) = (a, b);
        // Four depth steps per iteration (then the rest one at a time): the same FMAs in the
        // same order, with a quarter of the loop overhead.
        let step = |a: *const f32, b: *const f32, lo: &mut [__m256; MR], hi: &mut [__m256; MR]| {
            let b_lo = _mm256_loadu_ps(b);
            let b_hi = _mm256_loadu_ps(b.add(8));
            for i in 0..MR {
                let a_i = _mm256_set1_ps(*a.add(i));
                lo[i] = _mm256_fmadd_ps(a_i, b_lo, lo[i]);
                hi[i] = _mm256_fmadd_ps(a_i, b_hi, hi[i]);
            }
        };
        let line = |u: usize| if SWAP_PAIRS { u ^ 1 } else { u };
        debug_assert!(!SWAP_PAIRS || kc.is_multiple_of(2));
        for _ in 0..kc / 4 {
            for u in 0..4 {
                step(a.add(line(u) * MR), b.add(line(u) * 16), &mut lo, &mut hi);
            }
            a = a.add(4 * MR);
            b = b.add(64);
        }
        for u in 0..kc % 4 {
            step(a.add(line(u) * MR), b.add(line(u) * 16), &mut lo, &mut hi);
        }
        store_tile_avx2::<MR>(c, ldc, &lo, &hi, accumulate);
    }
}

/// Stores the accumulators of an `MR × 16` tile (columns 0..8 in `lo`, 8..16 in `hi`) to C:
/// `C = acc` or, when `accumulate`, `C = C + acc`.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` have 16 writable floats each; the CPU supports AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_tile_avx2<const MR: usize>(
    c: *mut f32,
    ldc: usize,
    lo: &[__m256; MR],
    hi: &[__m256; MR],
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the rows are writable.
    unsafe {
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

/// The AVX2 transposing pack, bit-identical to the portable `pack_transposed`: `width` rows of
/// `kc` contiguous floats at stride `row_stride` become `kc` packed lines of `lanes` floats
/// (`dst[q*lanes + w]`), lanes past `width` zero, through 8×8 register transposes; with `ROUND`
/// each value is rounded to bf16 (`to_bf16`) and kept as f32 (the AVX2 bf16 GEMM's packing).
///
/// # Safety
/// The CPU must support AVX2; `src` must hold `(width - 1) * row_stride + kc` floats and `dst`
/// exactly `kc * lanes`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose_pack_avx2<const ROUND: bool>(
    src: &[f32],
    row_stride: usize,
    width: usize,
    kc: usize,
    lanes: usize,
    dst: &mut [f32],
) {
    assert!(width >= 1 && width <= lanes && dst.len() == kc * lanes);
    assert!(src.len() >= (width - 1) * row_stride + kc);
    let src = src.as_ptr();
    // SAFETY: rows group..group + valid_rows < width, depths q0..q0 + depth < kc of `src`.
    transpose_blocks8(width, kc, lanes, dst, |group, valid_rows, q0, depth| unsafe {
        let mut rows = load_rows8(src.add(group * row_stride + q0), row_stride, valid_rows, depth);
        if ROUND {
            // Rounding the loaded rows rather than the transposed columns skips the zero rows
            // past a 6-tall A sliver's edge: 6 roundings per block instead of 8.
            rows.iter_mut().take(valid_rows).for_each(|row| *row = round_bf16_x8(*row));
        }
        rows
    });
}

/// The transposing packs' loop: for each group of 8 lanes and each 8-deep block, `load(group,
/// valid_rows, q0, depth)` gives rows `group..group + valid_rows` at depths `q0..q0 + depth` (the
/// rest zero), which are transposed and stored as lines `q0..q0 + depth` of `dst` (`kc * lanes`).
#[inline(always)]
fn transpose_blocks8(
    width: usize,
    kc: usize,
    lanes: usize,
    dst: &mut [f32],
    load: impl Fn(usize, usize, usize, usize) -> [__m256; 8],
) {
    assert!(width >= 1 && width <= lanes && dst.len() == kc * lanes);
    let dst = dst.as_mut_ptr();
    for group in (0..lanes).step_by(8) {
        let group_lanes = 8.min(lanes - group);
        let valid_rows = width.saturating_sub(group).min(8);
        for q0 in (0..kc).step_by(8) {
            let depth = 8.min(kc - q0);
            let rows = load(group, valid_rows, q0, depth);
            // SAFETY: lines q0..q0 + depth <= kc of `dst`, lanes group..group + group_lanes; the
            // callers run on CPUs with AVX2.
            unsafe { store_transposed8(transpose8(rows), dst, (q0, depth), (group, group_lanes, lanes), kc) };
        }
    }
}

/// Stores the first `depth` transposed columns of an 8×8 block as lines `q0..q0 + depth` of a
/// packed sliver, lanes `group..group + group_lanes` of `lanes` (the transposing packs' stores).
///
/// # Safety
/// The CPU must support AVX2; `dst` holds `kc * lanes` floats, `q0 + depth <= kc` and
/// `group + group_lanes <= lanes`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_transposed8(
    columns: [__m256; 8],
    dst: *mut f32,
    (q0, depth): (usize, usize),
    (group, group_lanes, lanes): (usize, usize, usize),
    kc: usize,
) {
    let store_mask = lane_mask(group_lanes);
    for (q, column) in columns.iter().enumerate().take(depth) {
        let start = (q0 + q) * lanes + group;
        // SAFETY: line q0+q < kc; lanes group..group+group_lanes <= lanes. With one group
        // (lanes <= 8), a full-width store past its lanes writes only into later lines, which
        // are stored afterwards (masked stores are slow on AMD).
        unsafe {
            if group_lanes == 8 || (lanes <= 8 && start + 8 <= kc * lanes) {
                _mm256_storeu_ps(dst.add(start), *column)
            } else {
                _mm256_maskstore_ps(dst.add(start), store_mask, *column)
            }
        }
    }
}

/// `transpose_pack_avx2` of bf16 bits: `width` rows of `kc` contiguous bf16 values at stride
/// `row_stride` become `kc` packed lines of `lanes` f32 values, each widened with a shift and a
/// denormal flushed to signed zero (`widen_bf16_x8`), lanes past `width` zero: the AVX2 bf16
/// GEMM's packing of a bf16 operand whose depth is contiguous (the weight of `X·Wᵀ`).
///
/// # Safety
/// The CPU must support AVX2; `src` must hold `(width - 1) * row_stride + kc` values and `dst`
/// exactly `kc * lanes`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose_widen_bf16_avx2(
    src: &[u16],
    row_stride: usize,
    width: usize,
    kc: usize,
    lanes: usize,
    dst: &mut [f32],
) {
    assert!(width >= 1 && width <= lanes && dst.len() == kc * lanes);
    assert!(src.len() >= (width - 1) * row_stride + kc);
    let src = src.as_ptr();
    transpose_blocks8(width, kc, lanes, dst, |group, valid_rows, q0, depth| {
        let mut rows = [_mm256_setzero_ps(); 8];
        for (r, row) in rows.iter_mut().enumerate().take(valid_rows) {
            // SAFETY: row group + r < width holds depths q0..q0 + depth <= kc of `src`.
            let at = unsafe { src.add((group + r) * row_stride + q0) };
            let mut bits = [0u16; 8];
            // SAFETY: 8 values at `at` where the block is 8 deep, else `depth` of them copied into
            // `bits` (16 bytes).
            let loaded = unsafe {
                if depth == 8 {
                    _mm_loadu_si128(at.cast())
                } else {
                    std::ptr::copy_nonoverlapping(at, bits.as_mut_ptr(), depth);
                    _mm_loadu_si128(bits.as_ptr().cast())
                }
            };
            *row = widen_bf16_x8(loaded);
        }
        rows
    });
}

/// One depth step of a bf16 operand whose slivers run along its contiguous index (the weight of
/// `dY·W`): `line` widened to f32 (`widen_bf16_x8`) into consecutive `lanes`-wide chunks at
/// stride `sliver_stride` in `dst`, the last chunk zero-padded to `lanes`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn widen_bf16_line_to_slivers_avx2(
    line: &[u16],
    lanes: usize,
    dst: &mut [f32],
    sliver_stride: usize,
) {
    // SAFETY (of each call): `chunk` holds at most `lanes` values and `out` `lanes` floats, a
    // multiple of 8.
    line_to_slivers(line, lanes, dst, sliver_stride, |chunk, out| unsafe {
        let whole = chunk.len() / 8 * 8;
        for v in (0..whole).step_by(8) {
            _mm256_storeu_ps(out.add(v), widen_bf16_x8(_mm_loadu_si128(chunk.as_ptr().add(v).cast())));
        }
        if whole == chunk.len() {
            return whole;
        }
        // The ragged end through a zero-padded vector (zero bits widen to zero).
        let mut bits = [0u16; 8];
        bits[..chunk.len() - whole].copy_from_slice(&chunk[whole..]);
        _mm256_storeu_ps(out.add(whole), widen_bf16_x8(_mm_loadu_si128(bits.as_ptr().cast())));
        whole + 8
    });
}

/// Eight bf16 values (bits) widened to f32 lanes, a denormal flushed to a zero of the same sign.
#[inline]
#[target_feature(enable = "avx2")]
fn widen_bf16_x8(bits: __m128i) -> __m256 {
    let x = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits));
    // A zero exponent field (a zero or a denormal) keeps only the sign.
    let denormal = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7F80_0000)), _mm256_setzero_si256());
    let cleared = _mm256_and_si256(denormal, _mm256_set1_epi32(0x7FFF_FFFF));
    _mm256_castsi256_ps(_mm256_andnot_si256(cleared, x))
}

/// The first `depth` floats of `rows` rows at stride `row_stride` from `src`, one register each;
/// the lanes past `depth` and the rows past `rows` are zero (the transposing packs' loads).
///
/// # Safety
/// The CPU must support AVX2; rows `0..rows` hold `depth <= 8` readable floats each.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_rows8(src: *const f32, row_stride: usize, rows: usize, depth: usize) -> [__m256; 8] {
    let mask = lane_mask(depth);
    let mut out = [_mm256_setzero_ps(); 8];
    for (r, row) in out.iter_mut().enumerate().take(rows) {
        // SAFETY: row r < rows holds `depth` floats; the masked load reads no lane past them.
        *row = unsafe {
            let at = src.add(r * row_stride);
            if depth == 8 {
                _mm256_loadu_ps(at)
            } else {
                _mm256_maskload_ps(at, mask)
            }
        };
    }
    out
}

/// Each lane rounded to bf16 as `gemm_bf16::to_bf16` rounds it (to nearest even, NaNs quieted,
/// denormals flushed to signed zero) and widened back to f32, on 8 lanes with AVX2. Lanes that
/// are zero, normal or infinite, the common case, take the add-and-mask path alone (it keeps a
/// signed zero); a vector with a denormal or NaN lane also takes the selects. Zeros stay on the
/// fast path because the packs feed it zero-padded vectors (a 6-row sliver's transposed column
/// has two zero lanes) and activations hold real zeros.
#[inline]
#[target_feature(enable = "avx2")]
fn round_bf16_x8(v: __m256) -> __m256 {
    let bits = _mm256_castps_si256(v);
    let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let sum = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
    let high_half = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let rounded = _mm256_and_si256(sum, high_half);
    // Special lanes: not at least the smallest normal in magnitude (true for a NaN) and not
    // zero (true for a NaN too); `vtestps` ANDs the two masks' sign bits.
    let abs = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
    let below_normal = _mm256_cmp_ps::<_CMP_NGE_UQ>(abs, _mm256_set1_ps(f32::MIN_POSITIVE));
    let nonzero = _mm256_cmp_ps::<_CMP_NEQ_UQ>(abs, _mm256_setzero_ps());
    if _mm256_testz_ps(below_normal, nonzero) == 1 {
        return _mm256_castsi256_ps(rounded);
    }
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
    let quiet_nan = _mm256_and_si256(_mm256_or_si256(bits, _mm256_set1_epi32(0x0040_0000)), high_half);
    let signed_zero = _mm256_and_si256(bits, _mm256_set1_epi32(i32::MIN));
    // Magnitudes are below 2^31, so the signed compares order them correctly.
    let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F80_0000));
    let tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x0080_0000), magnitude);
    _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_blendv_epi8(rounded, quiet_nan, nan), signed_zero, tiny))
}

/// Rounds each value to bf16 (`to_bf16`) in place, kept as f32: the AVX2 bf16 GEMM's lines
/// where the packing gathers them one by one.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn round_bf16_lines_avx2(xs: &mut [f32]) {
    let at = xs.as_mut_ptr();
    // SAFETY: `xs` holds `xs.len()` floats; reading and writing them in place is allowed.
    unsafe { round_bf16_run(at, at, xs.len()) }
}

/// Rounds `src` to bf16 (`to_bf16`) into `dst[..src.len()]`, kept as f32: the AVX2 bf16 GEMM's
/// streaming pack of 6-wide A slivers rounds each contiguous depth step this way before copying
/// it to the slivers as the f32 pack does (B's 16-wide slivers use
/// `round_bf16_line_to_slivers_avx2`).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn round_bf16_into_avx2(src: &[f32], dst: &mut [f32]) {
    let dst = &mut dst[..src.len()];
    // SAFETY: both slices hold `src.len()` floats.
    unsafe { round_bf16_run(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// One depth step of the streaming pack for slivers whose width is whole vectors (the AVX2 bf16
/// kernel's 16-wide B slivers): chunk `i` of `lanes` floats of `line` is rounded to bf16
/// (`to_bf16`, kept as f32) straight into `dst[i * sliver_stride..][..lanes]`, a partial last
/// chunk zero-padded. Rounding into the sliver itself, instead of into a buffer that is then
/// copied, halves the stores: at 256 x 3072 x 768 the buffered way's rounding and copy took 1.9x
/// the samples of the f32 GEMM's streaming packs.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn round_bf16_line_to_slivers_avx2(
    line: &[f32],
    lanes: usize,
    dst: &mut [f32],
    sliver_stride: usize,
) {
    line_to_slivers(line, lanes, dst, sliver_stride, |chunk, out| {
        // SAFETY: `chunk` and `out[..chunk.len()]` hold `chunk.len()` floats and do not overlap.
        unsafe { round_bf16_run(chunk.as_ptr(), out, chunk.len()) };
        chunk.len()
    });
}

/// The streaming packs' step for whole-vector slivers: chunk `i` of `lanes` values of `line` is
/// written by `write(chunk, out)` to `out = dst[i * sliver_stride..]` (it returns how many floats
/// it wrote, at most `lanes`), and the rest of the chunk's `lanes` floats become zero.
#[inline(always)]
fn line_to_slivers<T>(
    line: &[T],
    lanes: usize,
    dst: &mut [f32],
    sliver_stride: usize,
    write: impl Fn(&[T], *mut f32) -> usize,
) {
    assert!(lanes.is_multiple_of(8) && lanes <= sliver_stride && !line.is_empty());
    let chunks = line.len().div_ceil(lanes);
    assert!(dst.len() >= (chunks - 1) * sliver_stride + lanes, "bf16 line pack out of bounds");
    for (i, chunk) in line.chunks(lanes).enumerate() {
        let out = &mut dst[i * sliver_stride..][..lanes];
        let written = write(chunk, out.as_mut_ptr());
        out[written..].fill(0.0);
    }
}

/// `len` floats from `src` rounded to bf16 (kept as f32) into `dst`: whole vectors, then one
/// masked vector for the tail. `src == dst` rounds in place.
///
/// # Safety
/// The CPU must support AVX2; `src` and `dst` hold `len` floats each, and either are the same
/// or do not overlap.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn round_bf16_run(src: *const f32, dst: *mut f32, len: usize) {
    let whole = len / 8 * 8;
    for at in (0..whole).step_by(8) {
        // SAFETY: `at + 8 <= whole <= len` floats of both.
        unsafe { _mm256_storeu_ps(dst.add(at), round_bf16_x8(_mm256_loadu_ps(src.add(at)))) };
    }
    if len > whole {
        let mask = lane_mask(len - whole);
        // SAFETY: the masked load and store touch lanes `whole..len` only.
        unsafe { _mm256_maskstore_ps(dst.add(whole), mask, round_bf16_x8(_mm256_maskload_ps(src.add(whole), mask))) };
    }
}

/// An AVX2 lane mask with lanes `0..count` set (`count <= 8`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lane_mask(count: usize) -> __m256i {
    let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(count as i32), index)
}

/// Transposes an 8×8 block held as 8 row vectors into 8 column vectors.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // s[4g + j]: rows 4g..4g+4 of columns j and 4 + j.
    let s: [__m256; 8] = std::array::from_fn(|i| {
        let (g, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + j / 2], t[4 * g + 2 + j / 2]);
        if j % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    std::array::from_fn(|q| {
        if q < 4 {
            _mm256_permute2f128_ps::<0x20>(s[q], s[4 + q])
        } else {
            _mm256_permute2f128_ps::<0x31>(s[q - 4], s[q])
        }
    })
}

/// The bf16 GEMM's x86-64 parts: bf16 rounding and packing on AVX-512F, and the AVX512-BF16 tile.
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16_gemm {
    use super::{prefetch_tile, store_tile, transpose16};
    use std::arch::x86_64::*;

    /// `gemm_bf16::to_bf16` on 16 lanes, with the same branch-free selects: each u32 lane gets the bf16
    /// bits of its f32 lane in its low half.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn to_bf16_x16(v: __m512) -> __m512i {
        let bits = _mm512_castps_si512(v);
        let top = _mm512_srli_epi32::<16>(bits);
        let magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
        let odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd));
        let quiet_nan = _mm512_or_si512(top, _mm512_set1_epi32(0x0040));
        let signed_zero = _mm512_and_si512(top, _mm512_set1_epi32(0x8000));
        let nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F80_0000));
        let tiny = _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(0x0080_0000));
        _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(rounded, nan, quiet_nan), tiny, signed_zero)
    }

    /// An element type the AVX-512 packing loads 16 at a time as bf16 bits, each in the low half
    /// of a u32 lane: f32 values rounded (`to_bf16_x16`), or bf16 bits with a denormal flushed to
    /// a zero of the same sign (as `to_bf16` flushes an f32).
    pub trait Lanes16: Copy {
        /// The masked lanes of 16 elements from `at` (masked-off lanes zero, not read).
        ///
        /// # Safety
        /// The CPU must support AVX-512F, BW and VL; the unmasked elements are readable.
        unsafe fn load_bf16(at: *const Self, mask: __mmask16) -> __m512i;
    }

    impl Lanes16 for f32 {
        #[inline(always)]
        unsafe fn load_bf16(at: *const f32, mask: __mmask16) -> __m512i {
            // SAFETY: forwarded contract.
            unsafe { to_bf16_x16(_mm512_maskz_loadu_ps(mask, at)) }
        }
    }

    impl Lanes16 for u16 {
        #[inline(always)]
        unsafe fn load_bf16(at: *const u16, mask: __mmask16) -> __m512i {
            // SAFETY: forwarded contract.
            unsafe {
                let bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, at.cast()));
                // A zero exponent field (a zero or a denormal) keeps only the sign.
                let tiny = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7F80));
                _mm512_mask_and_epi32(bits, tiny, bits, _mm512_set1_epi32(0x8000))
            }
        }
    }

    /// Lanes `0..count` set (`count <= 16`).
    fn mask(count: usize) -> __mmask16 {
        ((1u32 << count.min(16)) - 1) as __mmask16
    }

    /// The AVX-512 form of one sliver of `gemm_bf16::pack` (bit-identical to the scalar one): element
    /// `(w, q)` is `src[w*wide_stride + q*deep_stride]` (f32 values or bf16 bits, `Lanes16`), and
    /// `dst[t*lanes + w]` becomes the word of `(w, 2t)` and `(w, 2t + 1)`, zero past `width` and
    /// past `kc`. One of the strides is 1.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, BW and VL; every element `(w, q)` with `w < width`, `q < kc`
    /// lies in `src`; `dst` holds `ceil(kc / 2) * lanes` words; `lanes` is a multiple of 8 and
    /// `width <= lanes`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn pack_sliver<T: Lanes16>(
        src: &[T],
        wide_stride: usize,
        deep_stride: usize,
        width: usize,
        kc: usize,
        lanes: usize,
        dst: &mut [u32],
    ) {
        let words = kc.div_ceil(2);
        debug_assert!(width >= 1 && width <= lanes && dst.len() == words * lanes && lanes.is_multiple_of(8));
        let (src, dst) = (src.as_ptr(), dst.as_mut_ptr());
        // Addresses of masked-off elements are formed with wrapping arithmetic only; a load with
        // an all-zero mask reads no memory and yields zeros.
        let at = |w: usize, q: usize| src.wrapping_add(w * wide_stride + q * deep_stride);
        for group in (0..lanes).step_by(16) {
            let group_lanes = 16.min(lanes - group);
            let store = mask(group_lanes);
            let valid = width.saturating_sub(group).min(16);
            if wide_stride == 1 {
                // Depth steps 2t and 2t+1 are two contiguous runs of lanes.
                for t in 0..words {
                    // SAFETY: unmasked lanes are elements (group + w, q) with w < valid, q < kc;
                    // the store writes lanes group..group+group_lanes of line t.
                    unsafe {
                        let even = T::load_bf16(at(group, 2 * t), mask(valid));
                        let odd_mask = if 2 * t + 1 < kc { mask(valid) } else { 0 };
                        let odd = T::load_bf16(at(group, 2 * t + 1), odd_mask);
                        let word = _mm512_or_si512(even, _mm512_slli_epi32::<16>(odd));
                        _mm512_mask_storeu_epi32(dst.add(t * lanes + group).cast(), store, word);
                    }
                }
            } else {
                // Each row is contiguous along the depth: convert 32 depth steps (16 words) of 16
                // rows, pair even and odd steps, then transpose rows into lines.
                let even_index = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                let odd_index = _mm512_add_epi32(even_index, _mm512_set1_epi32(1));
                for q0 in (0..kc).step_by(32) {
                    let depth = 32.min(kc - q0);
                    let mut rows = [_mm512_setzero_ps(); 16];
                    for (r, row) in rows.iter_mut().enumerate().take(valid) {
                        // SAFETY: unmasked lanes are elements (group + r, q) with q < kc.
                        let (first, second) = unsafe {
                            (
                                T::load_bf16(at(group + r, q0), mask(depth)),
                                T::load_bf16(at(group + r, q0 + 16), mask(depth.saturating_sub(16))),
                            )
                        };
                        let even = _mm512_permutex2var_epi32(first, even_index, second);
                        let odd = _mm512_permutex2var_epi32(first, odd_index, second);
                        *row = _mm512_castsi512_ps(_mm512_or_si512(even, _mm512_slli_epi32::<16>(odd)));
                    }
                    // SAFETY: the CPU supports AVX-512F.
                    let lines = unsafe { transpose16(rows) };
                    for (t, line) in lines.iter().enumerate().take(depth.div_ceil(2)) {
                        // SAFETY: line q0/2 + t < words; lanes group..group+group_lanes <= lanes.
                        unsafe {
                            _mm512_mask_storeu_epi32(
                                dst.add((q0 / 2 + t) * lanes + group).cast(),
                                store,
                                _mm512_castps_si512(*line),
                            )
                        };
                    }
                }
            }
        }
    }

    /// The AVX512-BF16 tile: `MR` rows × 2 zmm (32 columns), 2·MR accumulators; per depth pair
    /// one broadcast of A's word and two `vdpbf16ps` per row.
    ///
    /// # Safety
    /// `a` holds `words * MR` and `b` `words * 32` readable words; C rows `0..MR` at stride `ldc`
    /// have 32 writable floats each; the CPU supports AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn tile_avx512bf16<const MR: usize>(
        words: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the pointer arithmetic stays inside the ranges the caller guarantees; the
        // transmutes reinterpret 64 bytes of packed bf16 pairs as the bf16 vector type.
        unsafe {
            prefetch_tile::<MR, 32>(c, ldc);
            let mut lo = [_mm512_setzero_ps(); MR];
            let mut hi = [_mm512_setzero_ps(); MR];
            let (mut a, mut b) = (a, b);
            for _ in 0..words {
                let b_lo = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(b.cast()));
                let b_hi = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(b.add(16).cast()));
                for i in 0..MR {
                    let a_i = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(i) as i32));
                    lo[i] = _mm512_dpbf16_ps(lo[i], a_i, b_lo);
                    hi[i] = _mm512_dpbf16_ps(hi[i], a_i, b_hi);
                }
                a = a.add(MR);
                b = b.add(32);
            }
            store_tile::<MR>(c, ldc, &lo, &hi, accumulate);
        }
    }
}
