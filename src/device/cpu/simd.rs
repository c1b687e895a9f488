//! Instruction-set dispatch for the element-wise and row-wise kernels: each generic kernel of
//! `device::kernels` is instantiated for f32 three times, compiled for AVX-512, for AVX2+FMA and
//! for baseline x86-64, and the best one the CPU supports is picked at run time. The kernels use
//! no fused multiply-adds and fix their summation order, so all three give identical bits.

use super::isa::Isa;
use crate::device::{kernels, llama};
use crate::device::{AdamWStep, AttentionShape, Gelu, LayerNormSaved, Rotary, Tokens};
use std::ops::Range;

/// The vector instruction sets the dispatch distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Avx512,
    Avx2,
    Baseline,
}

impl Level {
    /// A short name for logs (`trident info`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Avx512 => "avx512",
            Level::Avx2 => "avx2",
            Level::Baseline => "baseline",
        }
    }
}

/// The best level this CPU supports, capped by `TRIDENT_CPU_ISA` (`isa::active`).
pub fn level() -> Level {
    match super::isa::active() {
        Isa::Avx512 | Isa::Avx512Bf16 => Level::Avx512,
        Isa::Avx2 => Level::Avx2,
        Isa::Portable => Level::Baseline,
    }
}

/// Defines `pub unsafe fn name(args) -> ret` that runs `kernel(args)` compiled for the CPU's best
/// level. The kernels are `#[inline(always)]`, so each instantiation is compiled with the target
/// features of the wrapper it lands in.
macro_rules! multiversion {
    ($( $(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $kernel:path; )*) => { $(
        $(#[$meta])*
        /// # Safety
        /// The same contract as the kernel it dispatches to.
        pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            $name::at(level(), $($arg),*)
        }

        /// The kernel compiled for one chosen level (tests compare the levels).
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;

            /// # Safety
            /// The kernel's contract, and the CPU must support `level` (every level up to
            /// `simd::level()` does).
            pub unsafe fn at(level: Level, $($arg: $ty),*) $(-> $ret)? {
                #[cfg(target_arch = "x86_64")]
                {
                    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
                    unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                        $kernel($($arg),*)
                    }
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                        $kernel($($arg),*)
                    }
                    match level {
                        Level::Avx512 => return avx512($($arg),*),
                        Level::Avx2 => return avx2($($arg),*),
                        Level::Baseline => {}
                    }
                }
                let _ = level;
                #[allow(unused_unsafe)]
                unsafe { $kernel($($arg),*) }
            }
        }
    )* };
}

multiversion! {
    fn layernorm_forward_rows(out: &mut [f32], stats: (&mut [f32], &mut [f32]), inp: &[f32],
        scale_shift: (&[f32], &[f32]), cols: usize) = kernels::layernorm_forward_rows::<f32>;
    fn layernorm_backward_rows(dinp: &mut [f32], dparams: (&mut [f32], &mut [f32]), dout: &[f32],
        saved: LayerNormSaved<'_, [f32]>, cols: usize) = kernels::layernorm_backward_rows::<f32>;
    fn rmsnorm_forward_rows(out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], cols: usize, eps: f64)
        = llama::rmsnorm_forward_rows::<f32>;
    fn rmsnorm_backward_rows(dinp: &mut [f32], dweight: &mut [f32], dout: &[f32], inp_weight: (&[f32], &[f32]),
        rstd: &[f32], cols: usize) = llama::rmsnorm_backward_rows::<f32>;
    fn swiglu_forward_rows(out: &mut [f32], inp: &[f32], f: usize) = llama::swiglu_forward_rows::<f32>;
    fn swiglu_backward_rows(dinp: &mut [f32], inp: &[f32], dout: &[f32], f: usize) = llama::swiglu_backward_rows::<f32>;
    fn rope_rows(qkv: &mut [f32], first_row: usize, table: &[f32], shape: &AttentionShape, rotary: Rotary,
        inverse: bool) = llama::rope_rows::<f32>;
    fn gelu_forward_slice(out: &mut [f32], inp: &[f32], form: Gelu) = kernels::gelu_forward_slice::<f32>;
    fn gelu_backward_slice(dinp: &mut [f32], inp: &[f32], dout: &[f32], form: Gelu)
        = kernels::gelu_backward_slice::<f32>;
    fn row_max(row: &[f32]) -> f32 = kernels::row_max::<f32>;
    fn cross_entropy_partials_row(row: &[f32], target: Option<usize>, max: f32) -> (f32, f32)
        = kernels::cross_entropy_partials_row::<f32>;
    fn cross_entropy_backward_row(row: &mut [f32], target: Option<usize>, max: f32, sum_exp: f32, scale: f32)
        = kernels::cross_entropy_backward_row::<f32>;
    fn adamw_slice(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], step: &AdamWStep, grad_scale: f32)
        = kernels::adamw_slice::<f32>;
    fn embedding_forward_rows(out: &mut [f32], wte: &[f32], tokens: Tokens<'_>, hidden: usize, t0: usize)
        = kernels::embedding_forward_rows::<f32>;
    fn position_forward_rows(out: &mut [f32], wpe: &[f32], batch: usize, hidden: usize, t0: usize)
        = kernels::position_forward_rows::<f32>;
    fn embedding_backward_cols(dwte: (*mut f32, usize), dout: &[f32], tokens: Tokens<'_>, hidden: usize,
        cols: Range<usize>) = kernels::embedding_backward_cols::<f32>;
    fn position_backward_cols(dwpe: *mut f32, dout: &[f32], batch: usize, positions: Range<usize>, hidden: usize,
        cols: Range<usize>) = kernels::position_backward_cols::<f32>;
    fn add_bias_rows(out: &mut [f32], bias: &[f32]) = kernels::add_bias_rows::<f32>;
    fn add_column_sums(out: &mut [f32], src: &[f32], rows: usize, stride: usize) = kernels::add_column_sums::<f32>;
    fn dot_lanes(a: &[f32], b: &[f32]) -> f32 = kernels::dot_lanes::<f32>;
    fn sum_squares_lanes(xs: &[f32]) -> f64 = kernels::sum_squares_lanes;
    fn attention_softmax_row(row: &mut [f32], n: usize, scale: f32) -> f32 = kernels::attention_softmax_row::<f32>;
    fn attention_backward_row(p: &mut [f32], ds: &mut [f32], n: usize, scale: f32, lse: f32, delta: f32)
        = kernels::attention_backward_row::<f32>;
    fn round_bf16_slice(xs: &mut [f32]) = bf16_casts::round_slice;
    fn bf16_bits_slice(out: &mut [u16], xs: &[f32]) = bf16_casts::bits_slice;
    fn round_bf16_bits_slice(out: &mut [u16], xs: &[f32]) = bf16_casts::round_bits_slice;
    fn from_bf16_bits_slice(out: &mut [f32], bits: &[u16]) = bf16_casts::from_bits_slice;
    fn round_f16_slice(xs: &mut [f32]) = f16_casts::round_slice;
    fn f16_bits_slice(out: &mut [u16], xs: &[f32]) = f16_casts::bits_slice;
    fn from_f16_bits_slice(out: &mut [f32], bits: &[u16]) = f16_casts::from_bits_slice;
}

/// `round_bf16_bits_slice` (with `round`) or `bf16_bits_slice` (without), the 16-bit results
/// written by non-temporal stores on AVX2 and up: for copies that are not read again until
/// much other memory has passed through the caches (AdamW's bf16 working copy of the weights,
/// read by the next step; a saved layer's 16-bit copy, read back in backward), so that
/// writing them neither reads their lines in first nor evicts what the next kernels read.
/// The same bits as the cached forms on every level (tested).
///
/// # Safety
/// `out` and `xs` have the same length; the CPU supports `simd::level()` (always true).
pub unsafe fn stream_bf16_bits(out: &mut [u16], xs: &[f32], round: bool) {
    assert_eq!(out.len(), xs.len(), "stream_bf16_bits: lengths differ");
    stream_bf16_bits_at(level(), out, xs, round)
}

/// `stream_bf16_bits` at a chosen level (tests compare the levels).
///
/// # Safety
/// The CPU supports `level`; `out` and `xs` have the same length.
pub unsafe fn stream_bf16_bits_at(level: Level, out: &mut [u16], xs: &[f32], round: bool) {
    let cached = |out: &mut [u16], xs: &[f32]| match round {
        // SAFETY: the caller's level is supported.
        true => unsafe { round_bf16_bits_slice::at(level, out, xs) },
        false => unsafe { bf16_bits_slice::at(level, out, xs) },
    };
    #[cfg(target_arch = "x86_64")]
    if level != Level::Baseline {
        // Up to the first 32-byte boundary of `out` the cached form; then 16 values a store.
        let head = (out.as_ptr().align_offset(32)).min(out.len());
        let body = (out.len() - head) / 16 * 16;
        cached(&mut out[..head], &xs[..head]);
        // SAFETY: AVX2 is supported at every level above Baseline; the body starts 32-byte
        // aligned in `out` and holds `body` values of each slice.
        unsafe { stream_bf16_bits_avx2(&mut out[head..head + body], &xs[head..head + body], round) };
        return cached(&mut out[head + body..], &xs[head + body..]);
    }
    cached(out, xs)
}

/// The 16-value blocks of `stream_bf16_bits`: `out` 32-byte aligned, its length a multiple of 16.
///
/// # Safety
/// AVX2; `out` starts 32-byte aligned and has `xs.len()`, a multiple of 16, elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_bf16_bits_avx2(out: &mut [u16], xs: &[f32], round: bool) {
    use std::arch::x86_64::*;
    debug_assert!(out.len() == xs.len() && xs.len().is_multiple_of(16) && (out.as_ptr() as usize).is_multiple_of(32));
    let (one, bias) = (_mm256_set1_epi32(1), _mm256_set1_epi32(0x7fff));
    // The top halves of eight values, rounded to nearest even unless NaN (`round_bits_slice`).
    let top = |p: *const f32| {
        // SAFETY: `p` points at eight readable values (the loop below).
        let x = unsafe { _mm256_loadu_ps(p) };
        let bits = _mm256_castps_si256(x);
        let bits = match round {
            true => {
                let up =
                    _mm256_add_epi32(bits, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(bits, 16), one)));
                let nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
                _mm256_blendv_epi8(up, bits, nan)
            }
            false => bits,
        };
        _mm256_srli_epi32(bits, 16)
    };
    for (o, x) in out.chunks_exact_mut(16).zip(xs.chunks_exact(16)) {
        // Packing interleaves the two vectors' 128-bit halves; the permute restores the order.
        let packed = _mm256_packus_epi32(top(x.as_ptr()), top(x[8..].as_ptr()));
        let ordered = _mm256_permute4x64_epi64(packed, 0b11_01_10_00);
        // SAFETY: `o` holds 16 u16 (32 bytes) at a 32-byte aligned address.
        unsafe { _mm256_stream_si256(o.as_mut_ptr().cast(), ordered) };
    }
    // Later plain stores and other threads' reads see the streamed lines after the fence.
    _mm_sfence();
}

/// fp16 mixed precision's casts on f32 storage (`Memory::round_to` under `--fp16`, of every
/// stored activation and of the parameter gradients; `to_half`, `load_half` of the saved
/// layers): `Precision::F16`'s `round`, `to_bits16` and `from_bits16` without branches, so that
/// each level vectorizes them. The tests below check them bit for bit.
mod f16_casts {
    /// Smallest normal binary16 magnitude, 2^-14: below it the grid is 2^-24 apart.
    const MIN_NORMAL: f32 = 6.103_515_6e-5;
    /// Magnitudes from here on round past binary16's largest finite value (65504) to infinity.
    const OVERFLOW: f32 = 65520.0;

    /// Rounds each value to the nearest binary16 value (ties to even; infinity past 65504's
    /// half-way point), kept as f32; NaNs and infinities are kept as they are.
    #[inline(always)]
    pub fn round_slice(xs: &mut [f32]) {
        for x in xs {
            let magnitude = x.abs();
            let bits = magnitude.to_bits();
            // Normal range: drop 13 of f32's 23 mantissa bits, to nearest even.
            let normal = f32::from_bits(bits.wrapping_add(0x0fff + ((bits >> 13) & 1)) & 0xffff_e000);
            // Subnormal range: adding and taking away 0.5 (where f32's spacing is 2^-24) rounds
            // to the 2^-24 grid, to nearest even.
            let subnormal = (magnitude + 0.5) - 0.5;
            let rounded = if magnitude < MIN_NORMAL { subnormal } else { normal };
            let rounded = if magnitude >= OVERFLOW { f32::INFINITY } else { rounded };
            *x = if x.is_nan() { *x } else { rounded.copysign(*x) };
        }
    }

    /// The binary16 pattern of each value, one `round_slice` returned (NaNs become the quiet
    /// NaN 0x7e00, with the sign).
    #[inline(always)]
    pub fn bits_slice(out: &mut [u16], xs: &[f32]) {
        for (o, x) in out.iter_mut().zip(xs) {
            let sign = (x.to_bits() >> 16) & 0x8000;
            let magnitude = x.abs();
            let bits = magnitude.to_bits();
            // f32's exponent rebased from 127 to 15, its top 10 mantissa bits kept.
            let normal = (bits >> 13).wrapping_sub(112 << 10) & 0x7fff;
            // A whole number of 2^-24 (exact: the value is on binary16's grid).
            let subnormal = (magnitude * 16_777_216.0) as u32;
            let value = if magnitude < MIN_NORMAL { subnormal } else { normal };
            let value = if magnitude == f32::INFINITY { 0x7c00 } else { value };
            let value = if x.is_nan() { 0x7e00 } else { value };
            *o = (sign | value) as u16;
        }
    }

    /// The f32 value of each binary16 pattern (NaNs become f32's quiet NaN, with the sign).
    #[inline(always)]
    pub fn from_bits_slice(out: &mut [f32], bits: &[u16]) {
        for (o, &b) in out.iter_mut().zip(bits) {
            let (exponent, mantissa) = ((b as u32 >> 10) & 0x1f, b as u32 & 0x3ff);
            let normal = f32::from_bits((((b as u32) & 0x7fff) << 13) + (112 << 23));
            let subnormal = mantissa as f32 / 16_777_216.0;
            let special = if mantissa == 0 { f32::INFINITY } else { f32::NAN };
            let value = if exponent == 0 { subnormal } else { normal };
            let value = if exponent == 31 { special } else { value };
            *o = if b & 0x8000 != 0 { -value } else { value };
        }
    }
}

/// bf16 mixed precision's casts on f32 storage (`Memory::round_to`, `to_half`, `load_half`):
/// `Precision::Bf16`'s `round`, `to_bits16` and `from_bits16` written without branches, so that
/// each level vectorizes them. The test below checks them against those, bit for bit.
mod bf16_casts {
    /// Rounds each value to the nearest bf16 (ties to even), NaNs kept as they are.
    #[inline(always)]
    pub fn round_slice(xs: &mut [f32]) {
        for x in xs {
            let bits = x.to_bits();
            let rounded = f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000);
            *x = if x.is_nan() { *x } else { rounded };
        }
    }

    /// The top 16 bits of each value (the bf16 of a value already rounded).
    #[inline(always)]
    pub fn bits_slice(out: &mut [u16], xs: &[f32]) {
        for (o, x) in out.iter_mut().zip(xs) {
            *o = (x.to_bits() >> 16) as u16;
        }
    }

    /// The bf16 bits of each value rounded to the nearest bf16 (ties to even), a NaN's top half
    /// kept: `round_slice` and `bits_slice` in one pass (the CPU's bf16 weight copy).
    #[inline(always)]
    pub fn round_bits_slice(out: &mut [u16], xs: &[f32]) {
        for (o, x) in out.iter_mut().zip(xs) {
            let bits = x.to_bits();
            let rounded = if x.is_nan() { bits } else { bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) };
            *o = (rounded >> 16) as u16;
        }
    }

    /// The f32 value of each bf16 bit pattern.
    #[inline(always)]
    pub fn from_bits_slice(out: &mut [f32], bits: &[u16]) {
        for (o, &b) in out.iter_mut().zip(bits) {
            *o = f32::from_bits((b as u32) << 16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    /// Every level this CPU supports, best first.
    fn levels() -> Vec<Level> {
        match level() {
            Level::Avx512 => vec![Level::Avx512, Level::Avx2, Level::Baseline],
            Level::Avx2 => vec![Level::Avx2, Level::Baseline],
            Level::Baseline => vec![Level::Baseline],
        }
    }

    fn random(n: usize, name: &str) -> Vec<f32> {
        let s = Stream::new(11, name, 0);
        (0..n).map(|i| s.normal(i as u64) as f32).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn sum_squares_lanes_matches_the_running_sum() {
        let x = random(16 * 61 + 7, "g");
        let running: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        for lv in levels() {
            // SAFETY: every level returned by `levels` is supported.
            let lanes = unsafe { sum_squares_lanes::at(lv, &x) };
            assert!((lanes - running).abs() <= 1e-14 * running, "{lv:?}: {lanes} vs {running}");
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let (rows, cols) = (13, 77); // ragged: not a multiple of any vector width
        let x = random(rows * cols, "x");
        let (w, b) = (random(cols, "w"), random(cols, "b"));
        let dy = random(rows * cols, "dy");
        let mut results: Vec<Vec<Vec<u32>>> = Vec::new();
        for lv in levels() {
            let mut r = Vec::new();
            // SAFETY: every level returned by `levels` is supported; slices are sized for the kernels.
            unsafe {
                let (mut y, mut mean, mut rstd) = (vec![0f32; rows * cols], vec![0f32; rows], vec![0f32; rows]);
                layernorm_forward_rows::at(lv, &mut y, (&mut mean, &mut rstd), &x, (&w, &b), cols);
                let (mut dx, mut dw, mut db) = (vec![0.5f32; rows * cols], vec![0f32; cols], vec![0f32; cols]);
                let saved = LayerNormSaved { inp: &x[..], weight: &w[..], mean: &mean[..], rstd: &rstd[..] };
                layernorm_backward_rows::at(lv, &mut dx, (&mut dw, &mut db), &dy, saved, cols);
                let (mut g, mut dg) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
                gelu_forward_slice::at(lv, &mut g, &x, Gelu::Tanh);
                gelu_backward_slice::at(lv, &mut dg, &x, &dy, Gelu::Tanh);
                let (mut ge, mut dge) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
                gelu_forward_slice::at(lv, &mut ge, &x, Gelu::Erf);
                gelu_backward_slice::at(lv, &mut dge, &x, &dy, Gelu::Erf);
                let mut logits = x[..cols].to_vec();
                let m = row_max::at(lv, &logits);
                let (se, tl) = cross_entropy_partials_row::at(lv, &logits, Some(5), m);
                cross_entropy_backward_row::at(lv, &mut logits, Some(5), m, se, 0.25);
                let (mut p, mut mm, mut vv) = (w.clone(), vec![0f32; cols], vec![0f32; cols]);
                let step = crate::device::AdamWStep {
                    lr: 1e-2,
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.1,
                    step: 3,
                };
                adamw_slice::at(lv, &mut p, &b, &mut mm, &mut vv, &step, 0.7);
                let mut scores = x[..cols].to_vec();
                let lse = attention_softmax_row::at(lv, &mut scores, cols - 7, 0.125);
                let (mut pr, mut ds) = (x[cols..2 * cols].to_vec(), dy[..cols].to_vec());
                let delta = dot_lanes::at(lv, &x[..cols], &dy[..cols]);
                let squares = sum_squares_lanes::at(lv, &dy[..cols - 3]);
                let mut column_sums = b.clone();
                add_column_sums::at(lv, &mut column_sums[..cols - 5], &dy[2..], rows, cols);
                attention_backward_row::at(lv, &mut pr, &mut ds, cols - 7, 0.125, lse, delta);
                r.extend([
                    bits(&y),
                    bits(&dx),
                    bits(&dw),
                    bits(&db),
                    bits(&g),
                    bits(&dg),
                    bits(&ge),
                    bits(&dge),
                    bits(&logits),
                    bits(&[m, se, tl]),
                    bits(&p),
                    bits(&vv),
                    bits(&scores),
                    bits(&pr),
                    bits(&ds),
                    bits(&[lse, delta]),
                    vec![squares.to_bits() as u32, (squares.to_bits() >> 32) as u32],
                    bits(&column_sums),
                ]);
            }
            results.push(r);
        }
        for (lv, r) in levels().iter().zip(&results).skip(1) {
            for (i, (a, b)) in r.iter().zip(&results[0]).enumerate() {
                assert_eq!(a, b, "output {i} differs between {lv:?} and {:?}", levels()[0]);
            }
        }
    }

    #[test]
    fn f16_rounding_matches_precision_on_every_level() {
        use crate::real::Precision::F16;
        // Random values at every scale f16 rounding treats differently (subnormal, normal,
        // overflowing), ties of both parities, the boundaries and the specials.
        let s = Stream::new(12, "f16", 0);
        let mut x: Vec<f32> = (0..20_000)
            .map(|i| {
                let scale = 2f32.powi(i % 50 - 30);
                scale * (2.0 * s.uniform(i as u64, 0) as f32 - 1.0)
            })
            .collect();
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            f32::MAX,
            65504.0,
            65519.996,
            65520.0,
            -65520.0,
            6.103_515_6e-5,
            6.103_515e-5,
            2f32.powi(-24),
            2f32.powi(-25),
            1.5 * 2f32.powi(-25),
            3.0 * 2f32.powi(-25),
            f32::from_bits(1),
            -0.0,
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
        ];
        x[..specials.len()].copy_from_slice(&specials);
        for lv in levels() {
            let mut rounded = x.clone();
            // SAFETY: every level returned by `levels` is supported.
            unsafe { round_f16_slice::at(lv, &mut rounded) };
            for (i, &v) in x.iter().enumerate() {
                let want = F16.round(v);
                assert_eq!(rounded[i].to_bits(), want.to_bits(), "{lv:?} round({v:e})");
            }
        }
    }

    #[test]
    fn f16_bit_casts_match_precision_on_every_level() {
        use crate::real::Precision::F16;
        // Every binary16 pattern, and the f32 values they stand for (NaNs of both signs too).
        let patterns: Vec<u16> = (0..=u16::MAX).collect();
        let values: Vec<f32> = patterns.iter().map(|&b| F16.from_bits16(b)).collect();
        for lv in levels() {
            let (mut back, mut bits) = (vec![0f32; patterns.len()], vec![0u16; values.len()]);
            // SAFETY: every level returned by `levels` is supported.
            unsafe {
                from_f16_bits_slice::at(lv, &mut back, &patterns);
                f16_bits_slice::at(lv, &mut bits, &values);
            }
            for (i, &b) in patterns.iter().enumerate() {
                assert_eq!(back[i].to_bits(), values[i].to_bits(), "{lv:?} from_bits({b:#06x})");
                assert_eq!(bits[i], F16.to_bits16(values[i]), "{lv:?} bits({:e})", values[i]);
            }
        }
    }

    #[test]
    fn streamed_bf16_bits_equal_the_cached_casts_on_every_level() {
        let mut x = random(1003, "stream");
        let specials = [f32::NAN, -f32::NAN, f32::INFINITY, f32::MAX, f32::from_bits(0x3F80_8000), f32::from_bits(1)];
        for at in [0, 37, 64, 500, 990] {
            x[at..at + specials.len()].copy_from_slice(&specials);
        }
        x[100] = f32::from_bits(0x3F81_8000);
        x[101] = -0.0;
        for lv in levels() {
            // Starts off and on the 32-byte grid, lengths short of one block and ragged.
            for (start, len) in [(0, 1003), (1, 1000), (5, 40), (3, 9), (16, 987), (0, 0)] {
                let xs = &x[start..start + len];
                for round in [true, false] {
                    let (mut want, mut got) = (vec![0u16; 1003], vec![0u16; 1003]);
                    // SAFETY: every level returned by `levels` is supported; equal lengths.
                    unsafe {
                        match round {
                            true => round_bf16_bits_slice::at(lv, &mut want[start..start + len], xs),
                            false => bf16_bits_slice::at(lv, &mut want[start..start + len], xs),
                        }
                        stream_bf16_bits_at(lv, &mut got[start..start + len], xs, round);
                    }
                    assert!(got == want, "{lv:?} start {start} len {len} round {round}");
                }
            }
        }
    }

    #[test]
    fn bf16_casts_match_precision_on_every_level() {
        use crate::real::Precision::Bf16;
        let mut x = random(1003, "casts");
        let specials = [f32::NAN, -f32::NAN, f32::INFINITY, f32::MAX, f32::from_bits(0x3F80_8000), f32::from_bits(1)];
        x[..specials.len()].copy_from_slice(&specials);
        x[10] = f32::from_bits(0x3F81_8000);
        x[11] = -0.0;
        for lv in levels() {
            let mut rounded = x.clone();
            let (mut half, mut back) = (vec![0u16; x.len()], vec![0f32; x.len()]);
            let mut direct = vec![0u16; x.len()];
            // SAFETY: every level returned by `levels` is supported.
            unsafe {
                round_bf16_slice::at(lv, &mut rounded);
                bf16_bits_slice::at(lv, &mut half, &rounded);
                from_bf16_bits_slice::at(lv, &mut back, &half);
                round_bf16_bits_slice::at(lv, &mut direct, &x);
            }
            assert!(direct == half, "{lv:?}: rounding to bits in one pass differs from round then bits");
            for (i, &v) in x.iter().enumerate() {
                let want = Bf16.round(v);
                assert_eq!(rounded[i].to_bits(), want.to_bits(), "{lv:?} round({v:e})");
                assert_eq!(half[i], Bf16.to_bits16(want), "{lv:?} bits({v:e})");
                assert_eq!(back[i].to_bits(), Bf16.from_bits16(half[i]).to_bits(), "{lv:?} from_bits({v:e})");
            }
        }
    }
}
