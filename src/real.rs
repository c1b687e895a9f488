//! `Real`: the float arithmetic the generic kernels need, implemented for f32 (the CPU backend)
//! and f64 (the reference oracle that gradient checks run on).

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point element type. Kernels written against it run in f32 for speed and in f64
/// for the finite-difference checks, so one body of math serves both.
pub trait Real:
    Copy
    + Send
    + Sync
    + Default
    + Debug
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn max(self, other: Self) -> Self;
    /// exp for the hot loops: a branch-free polynomial in f32 (within 2 ulp, and it vectorizes,
    /// unlike libm's), the exact function in f64 so the oracle stays exact.
    fn exp_fast(self) -> Self;
    /// tanh built on `exp_fast` (absolute error below 1e-7 in f32).
    fn tanh_fast(self) -> Self;
    /// The error function: `erf_f32` in f32 (absolute error below 4e-7, and it vectorizes), the
    /// C library's in f64.
    fn erf_fast(self) -> Self;
    fn from_f32(x: f32) -> Self {
        Self::from_f64(x as f64)
    }
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
}

macro_rules! impl_real {
    ($t:ty, $exp:expr, $tanh:expr, $erf:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline(always)]
            fn exp_fast(self) -> Self {
                ($exp)(self)
            }
            #[inline(always)]
            fn tanh_fast(self) -> Self {
                ($tanh)(self)
            }
            #[inline(always)]
            fn erf_fast(self) -> Self {
                ($erf)(self)
            }
        }
    };
}

impl_real!(f32, |x: f32| exp_f32(x), |x: f32| 1.0 - 2.0 / (exp_f32(2.0 * x) + 1.0), erf_f32);
impl_real!(f64, |x: f64| x.exp(), |x: f64| x.tanh(), erf_f64);

extern "C" {
    /// The C library's double-precision error function (libm, which Rust's standard library
    /// links on every target trident builds for).
    fn erf(x: f64) -> f64;
}

/// erf in f64: the C library's (correctly rounded to within an ulp or so), for the f64 oracle.
pub fn erf_f64(x: f64) -> f64 {
    // SAFETY: a pure function of its argument.
    unsafe { erf(x) }
}

/// erf in f32 without libm: below |x| = 0.5 its Taylor series to x¹¹ (truncation below 2e-8, and
/// erf(0) = 0 exactly); above, `erfc(|x|) = t·exp(-x² + P(t))` with `t = 1 / (1 + |x|/2)` and `P`
/// the degree-9 Chebyshev fit Numerical Recipes gives for `erfcc` (fractional error below 1.2e-7
/// for every x), then the sign of x. Both are computed and one selected, so loops vectorize.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let x2 = x * x;
    // 2/√π · (x - x³/3 + x⁵/10 - x⁷/42 + x⁹/216 - x¹¹/1320)
    let series = std::f32::consts::FRAC_2_SQRT_PI
        * x
        * (1.0
            + x2 * (-1.0 / 3.0 + x2 * (1.0 / 10.0 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0))))));
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_95
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_08
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_26 + t * 0.170_872_76))))))));
    let tail = (1.0 - t * exp_f32(p - x2)).copysign(x);
    if z < 0.5 {
        series
    } else {
        tail
    }
}

/// e^x in f32 without libm: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to degree
/// 7 (truncation error below 6e-9 relative), 2^n assembled in the exponent bits. Every step is
/// branch-free, so loops over it vectorize.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in the float unit.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_erf_is_accurate() {
        let mut worst: f64 = 0.0;
        for i in -60_000..=60_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((erf_f32(x) as f64 - erf_f64(x as f64)).abs());
        }
        assert!(worst < 4e-7, "erf_f32's worst absolute error {worst}");
        assert_eq!((erf_f32(0.0), erf_f32(9.0), erf_f32(-9.0)), (0.0, 1.0, -1.0));
        assert!((erf_f64(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
    }

    #[test]
    fn fast_exp_and_tanh_are_accurate() {
        let mut worst_exp: f64 = 0.0;
        let mut worst_tanh: f64 = 0.0;
        for i in -80_000..=80_000 {
            let x = i as f32 * 1e-3;
            let e = exp_f32(x) as f64;
            let exact = (x as f64).exp();
            worst_exp = worst_exp.max(((e - exact) / exact).abs());
            worst_tanh = worst_tanh.max((x.tanh_fast() as f64 - (x as f64).tanh()).abs());
        }
        assert!(worst_exp < 2.5e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 2e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(exp_f32(-1000.0), exp_f32(-87.0));
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }
}

/// Floating-point formats a value can be rounded to where it would be stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Precision {
    /// `x` rounded to the nearest value of this format (ties to even), as an f32. f16 overflows to
    /// infinity above 65504 and loses precision below 2^-14 as real half-precision does.
    #[inline(always)]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::Bf16 => {
                let bits = x.to_bits();
                if x.is_nan() {
                    return x;
                }
                let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
                f32::from_bits(rounded)
            }
            Precision::F16 => {
                if !x.is_finite() {
                    return x;
                }
                let a = x.abs();
                if a >= 65520.0 {
                    return f32::INFINITY.copysign(x);
                }
                // Spacing of f16 values around `a`: 2^(e-10) for normals, 2^-24 below 2^-14.
                let e = if a < 6.103_515_6e-5 { -14 } else { (a.to_bits() >> 23) as i32 - 127 };
                let quantum = f32::from_bits(((e - 10 + 127) as u32) << 23);
                let q = a / quantum;
                // Ties to even on the quantised value (exact in f32 for these magnitudes).
                let r = q.round();
                let r = if (q - q.trunc() - 0.5).abs() == 0.0 && r % 2.0 != 0.0 { r - 1.0 } else { r };
                (r * quantum).copysign(x)
            }
        }
    }
}

impl Precision {
    /// The 16-bit pattern of `x`, a value of this format (one that `round` returned): bf16's top
    /// half of the f32, or IEEE binary16 for f16. Exact for such values; `from_bits16` inverts it.
    #[inline(always)]
    pub fn to_bits16(self, x: f32) -> u16 {
        match self {
            Precision::F32 | Precision::Bf16 => (x.to_bits() >> 16) as u16,
            Precision::F16 => {
                let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
                let a = x.abs();
                if a.is_nan() {
                    return sign | 0x7e00;
                }
                if a.is_infinite() {
                    return sign | 0x7c00;
                }
                if a < 6.103_515_6e-5 {
                    // Subnormal (or zero): a whole number of 2^-24.
                    return sign | (a * 16_777_216.0) as u16;
                }
                let bits = a.to_bits();
                let exponent = ((bits >> 23) as i32 - 127 + 15) as u16;
                sign | (exponent << 10) | ((bits >> 13) & 0x3ff) as u16
            }
        }
    }

    #[inline(always)]
    pub fn from_bits16(self, b: u16) -> f32 {
        match self {
            Precision::F32 | Precision::Bf16 => f32::from_bits((b as u32) << 16),
            Precision::F16 => {
                let (exponent, mantissa) = ((b >> 10) & 0x1f, (b & 0x3ff) as u32);
                let v = match exponent {
                    0 => mantissa as f32 / 16_777_216.0,
                    31 if mantissa == 0 => f32::INFINITY,
                    31 => f32::NAN,
                    e => f32::from_bits(((e as u32 + 112) << 23) | (mantissa << 13)),
                };
                if b & 0x8000 != 0 {
                    -v
                } else {
                    v
                }
            }
        }
    }
}

#[cfg(test)]
mod precision_tests {
    use super::Precision;

    #[test]
    fn sixteen_bit_patterns_hold_rounded_values_exactly() {
        let mut x = 1.2345e-9f32;
        let mut values = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 65504.0, 2f32.powi(-24), -2f32.powi(-20)];
        while x < 1e6 {
            values.extend([x, -x, x * 1.37, -x * 0.71]);
            x *= 1.9;
        }
        for p in [Precision::Bf16, Precision::F16] {
            for &v in &values {
                let r = p.round(v);
                let back = p.from_bits16(p.to_bits16(r));
                assert!(back == r || (back.is_nan() && r.is_nan()), "{p:?}: {v} rounds to {r}, comes back as {back}");
                assert_eq!(back.is_sign_negative(), r.is_sign_negative(), "{p:?}: sign of {r}");
            }
        }
        // The patterns are the formats' own: 1.0 and -2.0.
        assert_eq!(Precision::F16.to_bits16(1.0), 0x3c00);
        assert_eq!(Precision::F16.to_bits16(-2.0), 0xc000);
        assert_eq!(Precision::Bf16.to_bits16(1.0), 0x3f80);
    }

    #[test]
    fn rounding_to_bf16_and_f16() {
        assert_eq!(Precision::Bf16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(Precision::Bf16.round(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(Precision::F16.round(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(Precision::F16.round(1.0 + 3.0 / 2048.0), 1.0 + 2.0 / 1024.0);
        assert_eq!(Precision::F16.round(65504.0), 65504.0);
        assert_eq!(Precision::F16.round(70000.0), f32::INFINITY);
        assert_eq!(Precision::F16.round(-1e6), f32::NEG_INFINITY);
        assert_eq!(Precision::F16.round(2f32.powi(-24)), 2f32.powi(-24));
        assert_eq!(Precision::F16.round(2f32.powi(-26)), 0.0);
        assert_eq!(Precision::F32.round(0.1), 0.1);
    }
}
