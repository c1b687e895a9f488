//! The HIP kernels of `kernels-hip/` on the CPU: the same sources, compiled by the host C++
//! compiler against the SIMT emulation with 64-lane wavefronts (`kernels-hip/emu/hip.h`, on
//! `kernels-cuda/emu/simt.h`), run on inputs written here and compared with trident's reference
//! device (serial f64) on the same bf16-rounded inputs, within DESIGN.md's bf16 rule
//! |x - ref| <= atol + 0.079 |ref| (and a much tighter bound for f32 outputs). Every kernel runs
//! on at least three shapes, ragged ones included. One test builds the kernels with a planted
//! wave32 assumption (`-DTRIDENT_PLANT_WAVE32_BUG`, a reduction that stops at 32 lanes) and
//! asserts that the LayerNorm comparison catches it.

mod common;
use common::emu::*;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use trident::device::reference::ReferenceDevice;
use trident::device::Device;
use trident::real::Precision;

const KIND: &str = "hip-emu";
const SEED: u64 = 13;

/// Which build of the harness: the kernels as written, or with the planted wave32 reduction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Build {
    Correct,
    PlantedWave32Bug,
}

/// The harness binary of a build, compiled once per test process (about 2 s).
fn harness(build: Build) -> &'static Path {
    static CORRECT: OnceLock<PathBuf> = OnceLock::new();
    static PLANTED: OnceLock<PathBuf> = OnceLock::new();
    let source = "kernels-hip/emu/tests/harness.cpp";
    match build {
        Build::Correct => CORRECT.get_or_init(|| compile_harness(source, KIND, "correct", &[])),
        Build::PlantedWave32Bug => {
            PLANTED.get_or_init(|| compile_harness(source, KIND, "planted", &["-DTRIDENT_PLANT_WAVE32_BUG"]))
        }
    }
}

// ---- wave64 collectives ----------------------------------------------------------------------

#[test]
fn wave64_collectives() {
    let case = Case::new(KIND, "wave64_probe");
    case.run_on(harness(Build::Correct), "wave64_probe", &[]);
    let out = case.get_i32("out");
    let ballot: u64 = (0..64).filter(|l| l % 3 == 0).fold(0, |b, l| b | 1u64 << l);
    for t in 0..128usize {
        let (lane, wave) = (t % 64, t / 64);
        let v = |l: usize| (100 * wave + l) as i32;
        let want = [
            v((lane * 7 + 3) % 64),
            v(lane ^ 32),
            v(if lane + 5 < 64 { lane + 5 } else { lane }),
            ballot as u32 as i32,
            (ballot >> 32) as u32 as i32,
            (wave == 1) as i32,
            0,
            (0..64).sum::<i32>(),
        ];
        assert_eq!(&out[t * 8..t * 8 + 8], &want, "thread {t}");
    }
    println!("wave64 probe: shuffles, 64-bit ballot, votes and wave_sum exact on 2 wavefronts");
}

// ---- GEMM (MFMA) -----------------------------------------------------------------------------

fn run_gemm(m: usize, n: usize, k: usize, bias: bool) -> f64 {
    let name = format!("gemm_mfma_{m}x{n}x{k}{}", if bias { "_bias" } else { "" });
    let case = Case::new(KIND, &name);
    let a = bf16_values(SEED, m * k, "a", 1.0);
    let w = bf16_values(SEED, n * k, "w", 0.2);
    let b = f32_values(SEED, n, "bias", 0.5, 0.0);
    case.put_bf16("a", &a);
    case.put_bf16("w", &w);
    if bias {
        case.put_f32("bias", &b);
    }
    case.run_on(harness(Build::Correct), "gemm_f32out", &args(&[&m, &n, &k]));
    let dev = ReferenceDevice;
    let (ra, rw, rb) = (reference(&dev, &a), reference(&dev, &w), reference(&dev, &b));
    let mut want = dev.alloc(m * n);
    dev.linear_forward(&mut want, &ra, &rw, bias.then_some(&rb), m, k, n);
    check_f32(&name, &case.get_f32("out"), &want, 1e-5)
}

#[test]
fn gemm_mfma_bf16() {
    // One full tile; ragged M, N and K (K not a multiple of the 32-wide slab nor of MFMA's 8);
    // several tiles and K steps each way; tiny. Then the bias epilogue on ragged shapes.
    for (m, n, k) in [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)] {
        run_gemm(m, n, k, false);
    }
    for (m, n, k) in [(64, 64, 64), (77, 99, 56), (129, 65, 33)] {
        run_gemm(m, n, k, true);
    }
}

// ---- LayerNorm (wave64 reductions) -----------------------------------------------------------

/// Inputs of a LayerNorm case, with a nonzero mean so a wrong sum shows in every output.
fn layernorm_inputs(rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let inp = bf16_values(SEED, rows * cols, "inp", 2.0).iter().map(|x| Precision::Bf16.round(x + 0.5)).collect();
    (inp, f32_values(SEED, cols, "weight", 0.2, 1.0), f32_values(SEED, cols, "bias", 0.2, 0.0))
}

/// Runs the forward of `build` and returns the case with (out, mean, rstd) from the reference.
fn layernorm_forward(build: Build, name: &str, rows: usize, cols: usize) -> (Case, [Vec<f64>; 3]) {
    let case = Case::new(KIND, name);
    let (inp, weight, bias) = layernorm_inputs(rows, cols);
    case.put_bf16("inp", &inp);
    case.put_f32("weight", &weight);
    case.put_f32("bias", &bias);
    case.run_on(harness(build), "layernorm_fwd", &args(&[&rows, &cols]));
    let dev = ReferenceDevice;
    let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_forward(
        &mut out,
        &mut mean,
        &mut rstd,
        &reference(&dev, &inp),
        &reference(&dev, &weight),
        &reference(&dev, &bias),
        rows,
        cols,
    );
    (case, [out, mean, rstd])
}

fn run_layernorm(rows: usize, cols: usize) {
    let name = format!("layernorm_wave64_{rows}x{cols}");
    let (case, [out, mean, rstd]) = layernorm_forward(Build::Correct, &name, rows, cols);
    check_bf16(&format!("{name} out"), &case.get_bf16("out"), &out);
    check_f32(&format!("{name} mean"), &case.get_f32("mean"), &mean, 1e-5);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);

    // Backward on the forward's saved f32 statistics, accumulating into nonzero gradients.
    let dev = ReferenceDevice;
    let (inp, weight, _) = layernorm_inputs(rows, cols);
    let dout = bf16_values(SEED, rows * cols, "dout", 1.0);
    let dinp0 = f32_values(SEED, rows * cols, "dinp0", 0.1, 0.0);
    let dw0 = f32_values(SEED, cols, "dw0", 0.1, 0.0);
    let db0 = f32_values(SEED, cols, "db0", 0.1, 0.0);
    let (mean32, rstd32) = (case.get_f32("mean"), case.get_f32("rstd"));
    case.put_bf16("dout", &dout);
    case.put_f32("mean", &mean32);
    case.put_f32("rstd", &rstd32);
    case.put_f32("dinp", &dinp0);
    case.put_f32("dweight", &dw0);
    case.put_f32("dbias", &db0);
    case.run_on(harness(Build::Correct), "layernorm_bwd", &args(&[&rows, &cols]));
    let (mut dinp, mut dw, mut db) = (reference(&dev, &dinp0), reference(&dev, &dw0), reference(&dev, &db0));
    dev.layernorm_backward(
        &mut dinp,
        &mut dw,
        &mut db,
        &reference(&dev, &dout),
        &reference(&dev, &inp),
        &reference(&dev, &weight),
        &reference(&dev, &mean32),
        &reference(&dev, &rstd32),
        rows,
        cols,
    );
    check_f32(&format!("{name} dinp"), &case.get_f32("dinp"), &dinp, 1e-4);
    check_f32(&format!("{name} dweight"), &case.get_f32("dweight"), &dw, 1e-4);
    check_f32(&format!("{name} dbias"), &case.get_f32("dbias"), &db, 1e-4);
}

#[test]
fn layernorm_wave64_forward_backward() {
    // Rows not a multiple of the workgroup's 4 waves; widths below, at and above the 64 lanes
    // (and above 32, where a wave32 reduction would lose half the row), not multiples of 64; a
    // GPT-2 width.
    for (rows, cols) in [(4, 64), (7, 50), (13, 200), (6, 768), (3, 5), (5, 130)] {
        run_layernorm(rows, cols);
    }
}

/// The planted wave32 assumption: the same kernels built with a butterfly that starts at 16
/// lanes. Each half-wave then normalises with its own half's statistics, and the comparison that
/// `layernorm_wave64_forward_backward` makes must reject the output; the correct build must
/// accept the same case. This proves the tests can see a wave32 assumption.
#[test]
fn planted_wave32_reduction_is_caught() {
    let (rows, cols) = (6, 200);
    let mut detected = Vec::new();
    for build in [Build::Correct, Build::PlantedWave32Bug] {
        let (case, [out, mean, rstd]) = layernorm_forward(build, &format!("layernorm_{build:?}"), rows, cols);
        let (bf_atol, bf_rtol) = bf16_bounds();
        let (m_atol, m_rtol) = f32_bounds(&mean, 1e-5);
        let (r_atol, r_rtol) = f32_bounds(&rstd, 1e-5);
        let results = [
            ("out", compare(&case.get_bf16("out"), &out, bf_atol, bf_rtol)),
            ("mean", compare(&case.get_f32("mean"), &mean, m_atol, m_rtol)),
            ("rstd", compare(&case.get_f32("rstd"), &rstd, r_atol, r_rtol)),
        ];
        for (what, c) in &results {
            println!(
                "{build:?} layernorm {rows}x{cols} {what}: max |error| {:.3e}, {} elements out of bounds{}",
                c.worst,
                c.violations,
                c.first.map(|(i, g, w)| format!(" (first: element {i} is {g}, the reference {w})")).unwrap_or_default()
            );
        }
        detected.push(results.iter().any(|(_, c)| c.violations > 0));
    }
    assert!(!detected[0], "the correct wave64 build must pass");
    assert!(detected[1], "the planted wave32 reduction was not detected by the LayerNorm comparison");
}
