//! The HIP kernels of `kernels-hip/` on the CPU: the same sources, compiled by the host C++
//! compiler against the SIMT emulation with 64-lane wavefronts (`kernels-hip/emu/hip.h`, on
//! `kernels-cuda/emu/simt.h`, with a model of `v_mfma_f32_32x32x8bf16_1k`), run on inputs written
//! here and compared with trident's reference device (serial f64) on the same bf16-rounded
//! inputs, within DESIGN.md's bf16 rule |x - ref| <= atol + 0.079 |ref| (and a much tighter bound
//! for f32 outputs). The tests mirror `cuda_emulation.rs` kernel for kernel (the HIP kernels have
//! the CUDA names and arguments): the MFMA GEMMs with every epilogue and both backward products,
//! casts, LayerNorm, GELU, AdamW, the cross-entropy pieces, the embedding, and FlashAttention
//! forward and backward on MFMA for head dims 64 and 128, and the f32 ops of the HIP Device
//! (`tensor_ops.hip`: wave-per-row reductions, column sums, element-wise, embedding). Every kernel runs on at least three
//! shapes, ragged ones included. One test builds the kernels with a planted wave32 assumption
//! (`-DTRIDENT_PLANT_WAVE32_BUG`, a reduction that stops at 32 lanes) and asserts that the
//! LayerNorm comparison catches it.

mod common;
use common::emu::*;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AttentionShape, Device};
use trident::real::Precision;
use trident::rng::Stream;

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

/// v_mfma_f32_32x32x8bf16_1k as the CDNA 2 ISA lays it out, written here independently of the
/// emulation's model and of common/mfma.h: lane l supplies A[l % 32][4 (l / 32) + j] and
/// B[4 (l / 32) + j][l % 32] (j = 0..3), and its register r holds D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32].
/// Small integers keep every product and sum exact.
#[test]
fn mfma_layout() {
    let case = Case::new(KIND, "mfma_probe");
    let a: Vec<f32> = (0..32 * 8).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let b: Vec<f32> = (0..8 * 32).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
    case.put_bf16("a", &a);
    case.put_bf16("b", &b);
    case.run_on(harness(Build::Correct), "mfma_probe", &[]);
    let out = case.get_f32("out");
    for lane in 0..64usize {
        for r in 0..16usize {
            let (row, col) = (8 * (r / 4) + 4 * (lane / 32) + r % 4, lane % 32);
            let dot: f32 = (0..8).map(|k| a[row * 8 + k] * b[k * 32 + col]).sum();
            assert_eq!(out[lane * 16 + r], (lane * 16 + r) as f32 + dot, "lane {lane} register {r}");
        }
    }
    println!("mfma probe: 64 lanes x 16 accumulators exact");
}

// ---- GEMM (MFMA) ---------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct GemmCase {
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    gelu: bool,
    residual: bool,
    bf16_out: bool,
}

fn run_gemm(c: GemmCase) {
    let GemmCase { m, n, k, bias, gelu, residual, bf16_out } = c;
    let name = format!(
        "gemm_mfma_{m}x{n}x{k}{}{}{}{}",
        if bias { "_bias" } else { "" },
        if gelu { "_gelu" } else { "" },
        if residual { "_res" } else { "" },
        if bf16_out { "_bf16" } else { "_f32" }
    );
    let case = Case::new(KIND, &name);
    let a = bf16_values(SEED, m * k, "a", 1.0);
    let w = bf16_values(SEED, n * k, "w", 0.2);
    let b = f32_values(SEED, n, "bias", 0.5, 0.0);
    let res: Vec<f32> =
        if bf16_out { bf16_values(SEED, m * n, "res", 1.0) } else { f32_values(SEED, m * n, "res", 1.0, 0.0) };
    case.put_bf16("a", &a);
    case.put_bf16("w", &w);
    if bias {
        case.put_f32("bias", &b);
    }
    if residual {
        if bf16_out {
            case.put_bf16("residual", &res);
        } else {
            case.put_f32("residual", &res);
        }
    }
    let op = if bf16_out { "gemm_bf16out" } else { "gemm_f32out" };
    case.run_on(harness(Build::Correct), op, &args(&[&m, &n, &k, &(gelu as i32)]));

    let dev = ReferenceDevice;
    let (ra, rw, rb) = (reference(&dev, &a), reference(&dev, &w), reference(&dev, &b));
    let mut want = dev.alloc(m * n);
    dev.linear_forward(&mut want, &ra, &rw, bias.then_some(&rb), m, k, n);
    if gelu {
        let pre = want.clone();
        dev.gelu_forward(&mut want, &pre);
    }
    if residual {
        let pre = want.clone();
        dev.add(&mut want, &pre, &reference(&dev, &res));
    }
    if bf16_out {
        check_bf16(&name, &case.get_bf16("out"), &want);
    } else {
        check_f32(&name, &case.get_f32("out"), &want, 1e-5);
    }
}

fn gemm(m: usize, n: usize, k: usize) -> GemmCase {
    GemmCase { m, n, k, bias: false, gelu: false, residual: false, bf16_out: false }
}

#[test]
fn gemm_plain_f32_out() {
    // One full tile; ragged M, N and K (K not a multiple of the 32-deep slab nor of MFMA's 8);
    // several tiles and K steps each way; tiny.
    for (m, n, k) in [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)] {
        run_gemm(gemm(m, n, k));
    }
}

#[test]
fn gemm_fused_epilogues() {
    for (m, n, k) in [(64, 64, 64), (77, 99, 56), (129, 65, 33)] {
        run_gemm(GemmCase { bias: true, ..gemm(m, n, k) });
        run_gemm(GemmCase { bias: true, gelu: true, ..gemm(m, n, k) });
        run_gemm(GemmCase { residual: true, ..gemm(m, n, k) });
        run_gemm(GemmCase { bias: true, gelu: true, residual: true, bf16_out: true, ..gemm(m, n, k) });
        run_gemm(GemmCase { bf16_out: true, ..gemm(m, n, k) });
    }
}

/// dinp = dout · W and dweight += doutᵀ · inp (both f32) against `linear_backward`.
fn run_gemm_bwd(m: usize, n: usize, k: usize) {
    let name = format!("gemm_mfma_bwd_{m}x{n}x{k}");
    let case = Case::new(KIND, &name);
    let dout = bf16_values(SEED, m * n, "dout", 1.0);
    let w = bf16_values(SEED, n * k, "w", 0.2);
    let inp = bf16_values(SEED, m * k, "inp", 1.0);
    let dweight0 = f32_values(SEED, n * k, "dweight0", 0.5, 0.0);
    case.put_bf16("dout", &dout);
    case.put_bf16("w", &w);
    case.put_bf16("inp", &inp);
    case.put_f32("dweight", &dweight0);
    case.run_on(harness(Build::Correct), "gemm_bwd", &args(&[&m, &n, &k]));

    let dev = ReferenceDevice;
    let (rdout, rw, rinp) = (reference(&dev, &dout), reference(&dev, &w), reference(&dev, &inp));
    let mut dinp = dev.alloc(m * k);
    let mut dweight = reference(&dev, &dweight0);
    dev.linear_backward(Some(&mut dinp), &mut dweight, None, &rdout, &rinp, &rw, m, k, n);
    check_f32(&format!("{name} dinp"), &case.get_f32("dinp"), &dinp, 1e-5);
    check_f32(&format!("{name} dweight"), &case.get_f32("dweight"), &dweight, 1e-5);
}

#[test]
fn gemm_backward() {
    // Full tiles; ragged everywhere (sizes not multiples of the 64 tile, the 32-deep slab or
    // MFMA's 8); several tiles and reduction steps; tiny.
    for (m, n, k) in [(64, 64, 64), (100, 72, 40), (37, 130, 99), (130, 96, 200), (1, 1, 1), (17, 9, 7)] {
        run_gemm_bwd(m, n, k);
    }
}

// ---- casts ------------------------------------------------------------------------------------

#[test]
fn casts_f32_bf16() {
    // Aligned (16-byte groups plus a ragged tail, and enough groups for the grid-stride loop to
    // wrap) and unaligned (offset 1: one element at a time); bit for bit against trident's rounding.
    for (n, offset) in [(1, 0), (7, 0), (8, 0), (1003, 0), (20000, 0), (1003, 1), (64, 3)] {
        let case = Case::new(KIND, &format!("casts_{n}_{offset}"));
        let mut x = f32_values(SEED, n, "x", 3.0, 0.0);
        if n > 4 {
            // Ties to even, a value past bf16's range and a NaN.
            x[1] = f32::from_bits(0x3f80_8000);
            x[2] = f32::from_bits(0x3f81_8000);
            x[3] = 3.4e38;
            x[4] = f32::NAN;
        }
        let h = bf16_values(SEED, n, "h", 2.0);
        case.put_f32("x", &x);
        case.put_bf16("h", &h);
        case.run_on(harness(Build::Correct), "casts", &args(&[&n, &offset]));
        let rounded = case.get_bf16("rounded");
        for (i, (&got, &want)) in
            rounded.iter().zip(x.iter().map(|&v| Precision::Bf16.round(v)).collect::<Vec<_>>().iter()).enumerate()
        {
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "casts {n}+{offset}: f32 -> bf16 element {i}: {got} != {want}"
            );
        }
        assert_eq!(case.get_f32("back"), h, "casts {n}+{offset}: bf16 -> f32 must be exact");
        println!("casts {n} (offset {offset}): bit-exact both ways");
    }
}

// ---- LayerNorm (wave64 reductions) ------------------------------------------------------------------------------

fn run_layernorm(rows: usize, cols: usize, residual: bool) {
    let name = format!("layernorm_{rows}x{cols}{}", if residual { "_res" } else { "" });
    let case = Case::new(KIND, &name);
    let inp = bf16_values(SEED, rows * cols, "inp", 2.0)
        .iter()
        .map(|x| x + 0.5)
        .map(|x| Precision::Bf16.round(x))
        .collect::<Vec<_>>();
    let res = bf16_values(SEED, rows * cols, "res", 1.0);
    let weight = f32_values(SEED, cols, "weight", 0.2, 1.0);
    let bias = f32_values(SEED, cols, "bias", 0.2, 0.0);
    case.put_bf16("inp", &inp);
    if residual {
        case.put_bf16("residual", &res);
    }
    case.put_f32("weight", &weight);
    case.put_f32("bias", &bias);
    case.run_on(harness(Build::Correct), "layernorm_fwd", &args(&[&rows, &cols]));

    // The fused residual add stores x + residual rounded to bf16; the reference normalises that.
    let x: Vec<f32> =
        if residual { inp.iter().zip(&res).map(|(a, b)| Precision::Bf16.round(a + b)).collect() } else { inp.clone() };
    let dev = ReferenceDevice;
    let (rx, rw, rb) = (reference(&dev, &x), reference(&dev, &weight), reference(&dev, &bias));
    let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_forward(&mut out, &mut mean, &mut rstd, &rx, &rw, &rb, rows, cols);
    if residual {
        let got = case.get_bf16("resid_out");
        assert_eq!(got, x, "{name}: the stored residual sum must be the bf16-rounded sum");
    }
    check_bf16(&format!("{name} out"), &case.get_bf16("out"), &out);
    check_f32(&format!("{name} mean"), &case.get_f32("mean"), &mean, 1e-5);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);

    // Backward on the forward's statistics (as f32, what the kernel saved), accumulating into
    // nonzero gradients as the model does.
    let dout = bf16_values(SEED, rows * cols, "dout", 1.0);
    let dinp0 = f32_values(SEED, rows * cols, "dinp0", 0.1, 0.0);
    let dw0 = f32_values(SEED, cols, "dw0", 0.1, 0.0);
    let db0 = f32_values(SEED, cols, "db0", 0.1, 0.0);
    let (mean32, rstd32) = (case.get_f32("mean"), case.get_f32("rstd"));
    case.put_bf16("dout", &dout);
    case.put_bf16("inp", &x);
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
        &rx,
        &rw,
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
        run_layernorm(rows, cols, false);
    }
    for (rows, cols) in [(5, 96), (9, 130), (2, 31)] {
        run_layernorm(rows, cols, true);
    }
}

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

// ---- GELU ---------------------------------------------------------------------------------

#[test]
fn gelu_forward_backward() {
    // Element counts that leave the last workgroup partly empty, several grid-stride rounds, and
    // one element; workgroup sizes that are not multiples of 64 (a partial last wave).
    for (n, blocks, threads) in [(1000, 4, 256), (4099, 3, 96), (1, 1, 32), (777, 2, 100)] {
        let name = format!("gelu_{n}_{blocks}x{threads}");
        let case = Case::new(KIND, &name);
        let inp = bf16_values(SEED, n, "inp", 2.0);
        let dout = bf16_values(SEED, n, "dout", 1.0);
        case.put_bf16("inp", &inp);
        case.put_bf16("dout", &dout);
        let dev = ReferenceDevice;
        let (ri, rd) = (reference(&dev, &inp), reference(&dev, &dout));
        case.run_on(harness(Build::Correct), "gelu_fwd", &args(&[&n, &blocks, &threads]));
        let mut want = dev.alloc(n);
        dev.gelu_forward(&mut want, &ri);
        check_bf16(&format!("{name} fwd"), &case.get_bf16("out"), &want);
        case.run_on(harness(Build::Correct), "gelu_bwd", &args(&[&n, &blocks, &threads]));
        dev.gelu_backward(&mut want, &ri, &rd);
        check_bf16(&format!("{name} bwd"), &case.get_bf16("out"), &want);
    }
}

// ---- AdamW --------------------------------------------------------------------------------

#[test]
fn adamw_f32_master_bf16_weights() {
    for (n, blocks, threads, step_no) in [(1000, 2, 256, 1u64), (3333, 5, 128, 7), (31, 1, 64, 1000)] {
        let name = format!("adamw_{n}_step{step_no}");
        let case = Case::new(KIND, &name);
        let param = f32_values(SEED, n, "param", 0.05, 0.0);
        let grad = f32_values(SEED, n, "grad", 0.01, 0.0);
        let m: Vec<f32> = f32_values(SEED, n, "m", 0.001, 0.0);
        let v: Vec<f32> = f32_values(SEED, n, "v", 1e-5, 0.0).iter().map(|x| x.abs()).collect();
        let step = AdamWStep {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: step_no,
            grad_scale: 0.5,
        };
        let c1 = 1.0 / (1.0 - (step.beta1 as f64).powi(step.step as i32));
        let c2 = 1.0 / (1.0 - (step.beta2 as f64).powi(step.step as i32));
        for (k, x) in [("param", &param), ("grad", &grad), ("m", &m), ("v", &v)] {
            case.put_f32(k, x);
        }
        case.run_on(
            harness(Build::Correct),
            "adamw",
            &args(&[
                &n,
                &blocks,
                &threads,
                &step.lr,
                &step.beta1,
                &step.beta2,
                &step.eps,
                &step.weight_decay,
                &step.grad_scale,
                &(c1 as f32),
                &(c2 as f32),
            ]),
        );
        let dev = ReferenceDevice;
        let (mut rp, mut rm, mut rv) = (reference(&dev, &param), reference(&dev, &m), reference(&dev, &v));
        dev.adamw(&mut rp, &reference(&dev, &grad), &mut rm, &mut rv, step);
        check_f32(&format!("{name} param"), &case.get_f32("param"), &rp, 1e-5);
        check_bf16(&format!("{name} param_bf16"), &case.get_bf16("param_bf16"), &rp);
        check_f32(&format!("{name} m"), &case.get_f32("m"), &rm, 1e-5);
        check_f32(&format!("{name} v"), &case.get_f32("v"), &rv, 1e-5);
        // The bf16 copy is exactly the rounded master weight.
        let rounded: Vec<f32> = case.get_f32("param").iter().map(|&x| Precision::Bf16.round(x)).collect();
        assert_eq!(case.get_bf16("param_bf16"), rounded, "{name}: bf16 weights are the rounded master");
    }
}

// ---- softmax cross-entropy (vocab-parallel pieces) ----------------------------------------

fn tokens(n: usize, name: &str, below: u32) -> Vec<u32> {
    let s = Stream::new(SEED, name, 9);
    (0..n).map(|i| ((s.uniform(i as u64, 0) * below as f64) as u32).min(below - 1)).collect()
}

#[test]
fn softmax_cross_entropy_pieces() {
    let mut hits = 0;
    // A shard in the middle of a vocabulary (targets below, inside and above it); widths that
    // are not multiples of the 256-thread block; a GPT-2-sized shard; one column.
    for (rows, vocab, vocab_start, total_vocab) in
        [(5, 1000, 500, 2000), (3, 333, 0, 333), (2, 12565, 12565, 50260), (4, 1, 7, 9)]
    {
        let name = format!("xent_{rows}x{vocab}_from{vocab_start}");
        let case = Case::new(KIND, &name);
        let logits = bf16_values(SEED, rows * vocab, "logits", 3.0);
        let targets = tokens(rows, "targets", total_vocab as u32);
        let scale = 1.0f32 / 7.0;
        hits += targets.iter().filter(|&&t| (t as usize).wrapping_sub(vocab_start) < vocab).count();
        case.put_bf16("logits", &logits);
        case.put_u32("targets", &targets);
        case.run_on(harness(Build::Correct), "xent", &args(&[&rows, &vocab, &vocab_start, &scale]));

        let dev = ReferenceDevice;
        let mut rl = reference(&dev, &logits);
        let (mut max, mut sum_exp, mut target_logit) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
        dev.cross_entropy_max(&rl, rows, vocab, &mut max);
        dev.cross_entropy_partials(&rl, &targets, vocab_start, rows, vocab, &max, &mut sum_exp, &mut target_logit);
        check_f32(&format!("{name} max"), &case.get_f32("max"), &max, 0.0);
        check_f32(&format!("{name} sum_exp"), &case.get_f32("sum_exp"), &sum_exp, 1e-5);
        check_f32(&format!("{name} target_logit"), &case.get_f32("target_logit"), &target_logit, 0.0);
        dev.cross_entropy_backward(&mut rl, &targets, vocab_start, rows, vocab, &max, &sum_exp, scale);
        check_bf16(&format!("{name} dlogits"), &case.get_bf16("dlogits"), &rl);
    }
    assert!(hits > 0, "some targets must fall inside the shard");
}

// ---- embedding ----------------------------------------------------------------------------

#[test]
fn embedding_forward_backward() {
    // A vocabulary shard with tokens outside it and repeated tokens (a small vocabulary); hidden
    // sizes that are not multiples of the 128-thread block; with and without positions.
    for (batch, seq, hidden, vocab_start, vocab_rows, total, positions) in [
        (2, 5, 96, 10, 20, 40, true),
        (3, 7, 130, 0, 11, 11, true),
        (1, 4, 200, 3, 6, 12, false),
        (4, 3, 33, 0, 64, 64, true),
    ] {
        let name = format!("embedding_{batch}x{seq}x{hidden}_shard{vocab_start}+{vocab_rows}");
        let case = Case::new(KIND, &name);
        let toks = tokens(batch * seq, "tokens", total);
        let wte = bf16_values(SEED, vocab_rows * hidden, "wte", 0.5);
        let wpe = f32_values(SEED, seq * hidden, "wpe", 0.1, 0.0);
        let dout = bf16_values(SEED, batch * seq * hidden, "dout", 1.0);
        let dwte0 = f32_values(SEED, vocab_rows * hidden, "dwte0", 0.1, 0.0);
        let dwpe0 = f32_values(SEED, seq * hidden, "dwpe0", 0.1, 0.0);
        case.put_u32("tokens", &toks);
        case.put_bf16("wte", &wte);
        if positions {
            case.put_f32("wpe", &wpe);
        }
        case.put_bf16("dout", &dout);
        case.put_f32("dwte", &dwte0);
        case.put_f32("dwpe", &dwpe0);
        case.run_on(harness(Build::Correct), "embedding", &args(&[&batch, &seq, &hidden, &vocab_start, &vocab_rows]));

        let dev = ReferenceDevice;
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &toks, &reference(&dev, &wte), vocab_start, batch, seq, hidden);
        if positions {
            dev.position_forward(&mut out, &reference(&dev, &wpe), batch, 0, seq, hidden);
        }
        check_bf16(&format!("{name} out"), &case.get_bf16("out"), &out);
        let rd = reference(&dev, &dout);
        let (mut dwte, mut dwpe) = (reference(&dev, &dwte0), reference(&dev, &dwpe0));
        dev.embedding_backward(&mut dwte, &rd, &toks, vocab_start, batch, seq, hidden);
        dev.position_backward(&mut dwpe, &rd, batch, 0, seq, hidden);
        check_f32(&format!("{name} dwte"), &case.get_f32("dwte"), &dwte, 1e-6);
        check_f32(&format!("{name} dwpe"), &case.get_f32("dwpe"), &dwpe, 1e-6);
    }
}

// ---- attention --------------------------------------------------------------------------

#[test]
fn attention_forward_causal() {
    // Whole and ragged query blocks (64, 32 per wave) and key tiles (32), one token, several
    // sequences and heads interleaved in the fused QKV rows, for both head dims; qkv at an odd
    // element offset (not 16-byte aligned: the scalar loads).
    for (batch, seq, heads, head_dim, offset) in [
        (1, 64, 1, 64, 0),
        (2, 100, 3, 64, 0),
        (1, 1, 2, 64, 0),
        (1, 77, 2, 128, 0),
        (2, 130, 1, 128, 0),
        (1, 5, 1, 128, 0),
        (2, 45, 2, 64, 1),
    ] {
        let shape = AttentionShape { batch, seq, heads, head_dim };
        let name = format!("attention_mfma_fwd_b{batch}_s{seq}_h{heads}_d{head_dim}_at{offset}");
        let case = Case::new(KIND, &name);
        let qkv = bf16_values(SEED, shape.rows() * 3 * shape.width(), "qkv", 1.0);
        case.put_bf16("qkv", &qkv);
        case.run_on(harness(Build::Correct), "attention_fwd", &args(&[&batch, &seq, &heads, &head_dim, &offset]));
        let dev = ReferenceDevice;
        let (mut out, mut lse) = (dev.alloc(shape.rows() * shape.width()), dev.alloc(shape.rows() * heads));
        dev.attention_forward(&mut out, &mut lse, &reference(&dev, &qkv), shape);
        check_bf16(&format!("{name} out"), &case.get_bf16("out"), &out);
        check_f32(&format!("{name} lse"), &case.get_f32("lse"), &lse, 1e-4);
    }
}

#[test]
fn attention_backward_causal() {
    // The forward's output and log-sum-exp come from the reference (rounded to the kernels'
    // bf16 / f32 storage) and are given to both sides, so only the backward is compared.
    for (batch, seq, heads, head_dim) in
        [(1, 64, 1, 64), (2, 100, 2, 64), (1, 1, 1, 64), (1, 77, 2, 128), (2, 70, 1, 128), (1, 3, 1, 128)]
    {
        let shape = AttentionShape { batch, seq, heads, head_dim };
        let name = format!("attention_mfma_bwd_b{batch}_s{seq}_h{heads}_d{head_dim}");
        let case = Case::new(KIND, &name);
        let qkv = bf16_values(SEED, shape.rows() * 3 * shape.width(), "qkv", 1.0);
        let dout = bf16_values(SEED, shape.rows() * shape.width(), "dout", 1.0);
        let dev = ReferenceDevice;
        let rqkv = reference(&dev, &qkv);
        let (mut out, mut lse) = (dev.alloc(shape.rows() * shape.width()), dev.alloc(shape.rows() * heads));
        dev.attention_forward(&mut out, &mut lse, &rqkv, shape);
        let out: Vec<f32> = out.iter().map(|&x| Precision::Bf16.round(x as f32)).collect();
        let lse: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
        case.put_bf16("qkv", &qkv);
        case.put_bf16("out", &out);
        case.put_bf16("dout", &dout);
        case.put_f32("lse", &lse);
        case.run_on(harness(Build::Correct), "attention_bwd", &args(&[&batch, &seq, &heads, &head_dim]));
        let mut dqkv = dev.alloc(shape.rows() * 3 * shape.width());
        dev.attention_backward(
            &mut dqkv,
            &reference(&dev, &dout),
            &rqkv,
            &reference(&dev, &out),
            &reference(&dev, &lse),
            shape,
        );
        check_bf16(&format!("{name} dqkv"), &case.get_bf16("dqkv"), &dqkv);
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

// ---- tensor_ops.hip (the HIP Device's f32 ops) -------------------------------------------------

fn put_f64(case: &Case, name: &str, values: &[f64]) {
    std::fs::write(
        case.dir.join(format!("{name}.f64")),
        values.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
}
fn get_f64(case: &Case, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(case.dir.join(format!("{name}.f64"))).unwrap();
    bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32).collect()
}

/// tensor_ops.hip's row-wise (a wave per row), column-wise and element-wise kernels on one
/// [rows, cols] matrix against the reference device's f64 ops.
fn run_tensor_rows(build: Build, rows: usize, cols: usize, vocab_start: usize) {
    let name = format!("tensor_rows_{rows}x{cols}_{build:?}");
    let case = Case::new(KIND, &name);
    let n = rows * cols;
    let x = f32_values(SEED, n, "x", 2.0, 0.5);
    let (weight, bias) = (f32_values(SEED, cols, "weight", 0.2, 1.0), f32_values(SEED, cols, "bias", 0.2, 0.0));
    let dout = f32_values(SEED, n, "dout", 1.0, 0.0);
    let (dinp0, dw0, db0) = (
        f32_values(SEED, n, "dinp0", 0.1, 0.0),
        f32_values(SEED, cols, "dw0", 0.1, 0.0),
        f32_values(SEED, cols, "db0", 0.1, 0.0),
    );
    let targets = tokens(rows, "targets", (vocab_start + cols + 3) as u32);
    let dev = ReferenceDevice;
    let (rx, rw, rb, rd) =
        (reference(&dev, &x), reference(&dev, &weight), reference(&dev, &bias), reference(&dev, &dout));
    // The whole rows' f64 statistics of the split LayerNorm, from the reference.
    let mut sums = vec![0.0; rows];
    dev.layernorm_sums(&rx, rows, cols, None, &mut sums);
    let mean64: Vec<f64> = sums.iter().map(|s| s / cols as f64).collect();
    let mut sq = vec![0.0; rows];
    dev.layernorm_sums(&rx, rows, cols, Some(&mean64), &mut sq);
    let rstd64: Vec<f64> = sq.iter().map(|s| 1.0 / (s / cols as f64 + 1e-5).sqrt()).collect();
    let (mut out, mut mean, mut rstd) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_forward(&mut out, &mut mean, &mut rstd, &rx, &rw, &rb, rows, cols);
    let mut bsums = vec![0.0; 2 * rows];
    dev.layernorm_backward_sums(&rd, &rx, &rw, &mean, &rstd, rows, cols, &mut bsums);
    for (k, v) in [("x", &x), ("weight", &weight), ("bias", &bias), ("dout", &dout), ("dinp", &dinp0)] {
        case.put_f32(k, v);
    }
    case.put_f32("dweight", &dw0);
    case.put_f32("dbias", &db0);
    case.put_u32("targets", &targets);
    put_f64(&case, "mean64", &mean64);
    put_f64(&case, "rstd64", &rstd64);
    put_f64(&case, "sums64", &bsums);
    let scale = 1.0f32 / 3.0;
    case.run_on(harness(build), "tensor_rows", &args(&[&rows, &cols, &vocab_start, &scale]));

    check_f32(&format!("{name} layernorm out"), &case.get_f32("out"), &out, 1e-5);
    check_f32(&format!("{name} mean"), &case.get_f32("mean"), &mean, 1e-5);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);
    // Backward on the kernel's own f32 statistics, as the Device runs it.
    let (m32, r32) = (reference(&dev, &case.get_f32("mean")), reference(&dev, &case.get_f32("rstd")));
    let (mut dx, mut dw, mut db) = (reference(&dev, &dinp0), reference(&dev, &dw0), reference(&dev, &db0));
    dev.layernorm_backward(&mut dx, &mut dw, &mut db, &rd, &rx, &rw, &m32, &r32, rows, cols);
    check_f32(&format!("{name} dinp"), &case.get_f32("dx"), &dx, 1e-4);
    check_f32(&format!("{name} dweight"), &case.get_f32("dw"), &dw, 1e-4);
    check_f32(&format!("{name} dbias"), &case.get_f32("db"), &db, 1e-4);
    check_f32(&format!("{name} row sums"), &get_f64(&case, "sums"), &sums, 1e-6);
    check_f32(&format!("{name} squared deviations"), &get_f64(&case, "sqsums"), &sq, 1e-6);
    let mut bs = vec![0.0; 2 * rows];
    dev.layernorm_backward_sums(&rd, &rx, &rw, &m32, &r32, rows, cols, &mut bs);
    check_f32(&format!("{name} backward sums"), &get_f64(&case, "bsums"), &bs, 1e-5);
    let (mut split, mut sm, mut sr) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_apply(&mut split, &mut sm, &mut sr, &rx, &rw, &rb, &mean64, &rstd64, rows, cols);
    check_f32(&format!("{name} split out"), &case.get_f32("split"), &split, 1e-5);
    check_f32(&format!("{name} split mean"), &case.get_f32("split_mean"), &sm, 1e-6);
    check_f32(&format!("{name} split rstd"), &case.get_f32("split_rstd"), &sr, 1e-6);
    let (mut sdx, mut sdw, mut sdb) = (reference(&dev, &dinp0), dev.alloc(cols), dev.alloc(cols));
    dev.layernorm_backward_apply(&mut sdx, &mut sdw, &mut sdb, &rd, &rx, &rw, &m32, &r32, &bsums, cols, rows, cols);
    check_f32(&format!("{name} split dinp"), &case.get_f32("split_dx"), &sdx, 1e-4);
    // x as logits of a vocabulary shard.
    let (mut max, mut sum_exp, mut tl) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
    dev.cross_entropy_max(&rx, rows, cols, &mut max);
    dev.cross_entropy_partials(&rx, &targets, vocab_start, rows, cols, &max, &mut sum_exp, &mut tl);
    check_f32(&format!("{name} xent max"), &get_f64(&case, "max"), &max, 0.0);
    check_f32(&format!("{name} xent sum_exp"), &get_f64(&case, "sum_exp"), &sum_exp, 1e-6);
    check_f32(&format!("{name} xent target logit"), &get_f64(&case, "target_logit"), &tl, 0.0);
    let mut dl = rx.clone();
    dev.cross_entropy_backward(&mut dl, &targets, vocab_start, rows, cols, &max, &sum_exp, scale);
    check_f32(&format!("{name} dlogits"), &case.get_f32("dlogits"), &dl, 1e-5);
    let colsum: Vec<f64> =
        (0..cols).map(|c| db0[c] as f64 + (0..rows).map(|r| dout[r * cols + c] as f64).sum::<f64>()).collect();
    check_f32(&format!("{name} column sums"), &case.get_f32("colsum"), &colsum, 1e-5);
    let mut biased = rx.clone();
    dev.add_bias(&mut biased, &rb, rows, cols);
    check_f32(&format!("{name} add_bias"), &case.get_f32("biased"), &biased, 1e-6);
    let ssq: f64 = std::fs::read(case.dir.join("partials.f64"))
        .unwrap()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .sum();
    let want = dev.sum_squares(&rx);
    assert!((ssq - want).abs() <= 1e-12 * want, "{name} sum_squares {ssq} vs {want}");
    println!("{name}: every row, column and element kernel matches the reference");
}

#[test]
fn tensor_ops_rows_columns_and_reductions() {
    // Rows not a multiple of the 4 waves of a workgroup; widths below, at and above the 64
    // lanes (and above 32), not multiples of 64 or of the 256-thread column workgroups; a width
    // over 8192 elements in all, so sum_squares has a ragged second chunk.
    for (rows, cols, vocab_start) in [(4, 64, 0), (7, 50, 3), (13, 200, 100), (3, 5, 0), (11, 777, 40)] {
        run_tensor_rows(Build::Correct, rows, cols, vocab_start);
    }
}

/// tensor_ops.hip's wave-per-row kernels built with the planted wave32 butterfly: each half-wave
/// keeps its own half's sum, and the comparison must reject the row statistics.
#[test]
fn planted_wave32_reduction_is_caught_in_tensor_ops() {
    let caught = std::panic::catch_unwind(|| run_tensor_rows(Build::PlantedWave32Bug, 4, 64, 0));
    assert!(caught.is_err(), "the planted wave32 reduction passed the tensor_ops comparison");
}

#[test]
fn tensor_ops_element_wise_and_embedding() {
    let dev = ReferenceDevice;
    // Grid-stride loops over fewer workgroups than the elements need, and over more.
    for (n, blocks) in [(1, 1), (1000, 2), (4099, 3), (300, 8)] {
        let name = format!("tensor_elems_{n}_{blocks}");
        let case = Case::new(KIND, &name);
        let (a, b) = (f32_values(SEED, n, "a", 2.0, 0.0), f32_values(SEED, n, "b", 1.0, 0.0));
        case.put_f32("a", &a);
        case.put_f32("b", &b);
        case.run_on(harness(Build::Correct), "tensor_elems", &args(&[&n, &blocks]));
        let (ra, rb) = (reference(&dev, &a), reference(&dev, &b));
        let mut sum = dev.alloc(n);
        dev.add(&mut sum, &ra, &rb);
        check_f32(&format!("{name} add"), &case.get_f32("sum"), &sum, 1e-7);
        check_f32(&format!("{name} add_assign"), &case.get_f32("acc"), &sum, 1e-7);
        let rounded: Vec<f32> = a.iter().map(|&x| Precision::Bf16.round(x)).collect();
        assert_eq!(case.get_f32("rounded"), rounded, "{name}: round_bf16_f32 is bit-exact");
        let mut g = dev.alloc(n);
        dev.gelu_forward(&mut g, &ra);
        check_f32(&format!("{name} gelu"), &case.get_f32("gelu"), &g, 1e-5);
        let mut dg = dev.alloc(n);
        dev.gelu_backward(&mut dg, &ra, &rb);
        check_f32(&format!("{name} gelu'"), &case.get_f32("dgelu"), &dg, 1e-5);
    }
    for (batch, seq, hidden, vocab_start, vocab_rows, total, t0) in
        [(2, 5, 96, 10, 20, 40, 0), (3, 7, 300, 0, 11, 11, 2), (1, 4, 33, 3, 6, 12, 1)]
    {
        let name = format!("tensor_embedding_{batch}x{seq}x{hidden}_shard{vocab_start}+{vocab_rows}");
        let case = Case::new(KIND, &name);
        let toks = tokens(batch * seq, "tokens", total);
        let wte = f32_values(SEED, vocab_rows * hidden, "wte", 0.5, 0.0);
        let wpe = f32_values(SEED, (t0 + seq) * hidden, "wpe", 0.1, 0.0);
        let dout = f32_values(SEED, batch * seq * hidden, "dout", 1.0, 0.0);
        let dwte0 = f32_values(SEED, vocab_rows * hidden, "dwte0", 0.1, 0.0);
        let dwpe0 = f32_values(SEED, (t0 + seq) * hidden, "dwpe0", 0.1, 0.0);
        case.put_u32("tokens", &toks);
        for (k, v) in [("wte", &wte), ("wpe", &wpe), ("dout", &dout), ("dwte", &dwte0), ("dwpe", &dwpe0)] {
            case.put_f32(k, v);
        }
        case.run_on(
            harness(Build::Correct),
            "tensor_embedding",
            &args(&[&batch, &seq, &hidden, &vocab_start, &vocab_rows, &t0]),
        );
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &toks, &reference(&dev, &wte), vocab_start, batch, seq, hidden);
        dev.position_forward(&mut out, &reference(&dev, &wpe), batch, t0, seq, hidden);
        check_f32(&format!("{name} out"), &case.get_f32("out"), &out, 1e-6);
        let rd = reference(&dev, &dout);
        let (mut dwte, mut dwpe) = (reference(&dev, &dwte0), reference(&dev, &dwpe0));
        dev.embedding_backward(&mut dwte, &rd, &toks, vocab_start, batch, seq, hidden);
        dev.position_backward(&mut dwpe, &rd, batch, t0, seq, hidden);
        check_f32(&format!("{name} dwte"), &case.get_f32("dwte"), &dwte, 1e-6);
        check_f32(&format!("{name} dwpe"), &case.get_f32("dwpe"), &dwpe, 1e-6);
    }
}
