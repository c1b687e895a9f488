//! The x86 f32 micro-kernels (AVX-512F: 8 rows × 32 columns; AVX2+FMA: 6 rows × 16 columns) and
//! the AVX-512 16×16 transposing pack, each compiled for its instruction set and chosen at run
//! time by `GemmKernel`.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::driver::MicroKernel;

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
        prefetch_tile::<MR>(c, ldc);
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
        store_tile::<MR>(c, ldc, &lo, &hi, accumulate);
    }
}

/// Prefetches the `MR` rows of an `MR × 32` tile of C into L1 before its accumulation starts.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` hold 32 floats each; the CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn prefetch_tile<const MR: usize>(c: *mut f32, ldc: usize) {
    // SAFETY: the rows lie inside C, as the caller guarantees.
    unsafe {
        for i in 0..MR {
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + 16) as *const i8);
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
