//! Tests of what only the bf16 GEMM has: its rounding, its packings and its fast kernels against
//! the portable one, bit for bit (the tests both GEMMs share are in `gemm/tests.rs`).

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

/// AVX512-BF16 gives the portable kernel's bits always, the widened kernels (AVX-512, AVX2)
/// wherever no product or partial sum is denormal (these inputs have none).
#[test]
fn gemm_bf16_fast_kernels_are_bitwise_equal_to_portable() {
    let pool = ThreadPool::new(2);
    for kernel in [Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx512, Bf16Kernel::Avx2] {
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
/// flush it to zero and the widened kernels' FMAs keep it: the results differ by at most one
/// smallest normal (2^-126) per product, the bound ARCHITECTURE.md states. The two widened
/// kernels run the same FMAs in the same order, so they agree bit for bit, denormals included
/// (these inputs, and random ones with denormal products among normal sums).
#[test]
fn gemm_bf16_widened_kernels_keep_denormal_products_within_the_stated_bound() {
    let widened: Vec<Bf16Kernel> =
        [Bf16Kernel::Avx512, Bf16Kernel::Avx2].into_iter().filter(|k| k.is_available()).collect();
    if widened.is_empty() {
        eprintln!("SKIPPED: CPU lacks avx2 (or TRIDENT_CPU_ISA caps it)");
        return;
    }
    let pool = ThreadPool::new(1);
    let run_all = |(m, n, k): (usize, usize, usize), a: &[f32], b: &[f32]| -> Vec<Vec<f32>> {
        let mut results = Vec::new();
        for &kernel in widened.iter().chain([&Bf16Kernel::Portable]) {
            let mut c = vec![0.0f32; m * n];
            let (a, b) = (MatRef::row_major(a, k), MatRef::row_major(b, n));
            gemm_bf16_with(kernel, &pool, m, n, k, a, b, &mut c, n, false);
            results.push(c);
        }
        results
    };
    let (m, n, k) = (7, 45, 40);
    let tiny = 2f32.powi(-70); // A product of two is 2^-140, below 2^-126.
    let a: Vec<f32> = (0..m * k).map(|i| tiny * (1.0 + (i % 5) as f32 / 8.0)).collect();
    let b: Vec<f32> = (0..k * n).map(|i| tiny * (1.0 + (i % 3) as f32 / 4.0)).collect();
    let results = run_all((m, n, k), &a, &b);
    let flushed = results.last().unwrap();
    assert!(flushed.iter().all(|&x| x == 0.0), "the portable kernel flushes denormal products");
    for kept in &results[..widened.len()] {
        for (&kept, &flushed) in kept.iter().zip(flushed) {
            assert!(kept > 0.0 && (kept - flushed).abs() <= k as f32 * 2f32.powi(-126), "{kept:e} vs {flushed:e}");
        }
    }
    // Mixed scales: some rows' products denormal, some normal, sums crossing between.
    let (m, n, k) = (19, 70, 37);
    let scaled = |len: usize, seed: u64| -> Vec<f32> {
        let values = crate::rng::fill(len, seed);
        values.iter().enumerate().map(|(i, x)| x * 2f32.powi(-60 - 5 * (i % 3) as i32)).collect()
    };
    let results = run_all((m, n, k), &scaled(m * k, 8), &scaled(k * n, 9));
    for pair in results[..widened.len()].windows(2) {
        assert!(same_bits(&pair[0], &pair[1]), "the widened kernels differ");
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
        assert_eq!(fast, scalar, "bits: lanes {lanes} width {width} kc {kc} strides ({wide_stride}, {deep_stride})");
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
