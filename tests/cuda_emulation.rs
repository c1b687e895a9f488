//! The CUDA kernels of `kernels-cuda/` on the CPU: the same sources, compiled by the host C++
//! compiler against the SIMT emulation (`kernels-cuda/emu/`), run on inputs written here and
//! compared with trident's reference device (serial f64) on the same bf16-rounded inputs, within
//! DESIGN.md's bf16 rule |x - ref| <= atol + 0.079 |ref| (and a much tighter bound for f32
//! outputs). Every kernel runs on at least three shapes, ragged ones included (sizes that are not
//! multiples of any tile).

mod common;
use common::emu::*;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AttentionShape, Device};
use trident::real::Precision;
use trident::rng::Stream;

const KIND: &str = "cuda-emu";
const SEED: u64 = 11;

/// The harness binary, compiled once per test process (about 2 s).
fn harness() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| compile_harness("kernels-cuda/emu/tests/harness.cpp", KIND, "cuda", &[]))
}

// ---- GEMM ---------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct GemmCase {
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    gelu: bool,
    residual: bool,
    bf16_out: bool,
    /// The sm_90a wgmma kernel (gemm_bf16_sm90.cu, f32 output) instead of the mma.sync one.
    wgmma: bool,
}

fn run_gemm(c: GemmCase) {
    let GemmCase { m, n, k, bias, gelu, residual, bf16_out, wgmma } = c;
    assert!(!(wgmma && bf16_out), "the wgmma GEMM writes f32 only");
    let name = format!(
        "gemm_{m}x{n}x{k}{}{}{}{}{}",
        if wgmma { "_sm90" } else { "" },
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
    let op = if wgmma {
        "gemm_sm90_f32out"
    } else if bf16_out {
        "gemm_bf16out"
    } else {
        "gemm_f32out"
    };
    case.run_on(harness(), op, &args(&[&m, &n, &k, &(gelu as i32)]));

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
    GemmCase { m, n, k, bias: false, gelu: false, residual: false, bf16_out: false, wgmma: false }
}

#[test]
fn gemm_plain_f32_out() {
    // One full tile; ragged in M, N and K with K a multiple of 8 (the cp.async path, zero-fill at
    // the K edge); K not a multiple of 8 (the plain-load path); several tiles in every direction.
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

#[test]
fn gemm_wgmma_sm90() {
    // The wgmma kernel on the shapes of the mma.sync one: a full tile, ragged M/N/K on the
    // cp.async path, K not a multiple of 8 (plain loads), several tiles each way, tiny; then the
    // fused epilogue.
    for (m, n, k) in [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)] {
        run_gemm(GemmCase { wgmma: true, ..gemm(m, n, k) });
    }
    run_gemm(GemmCase { wgmma: true, bias: true, gelu: true, residual: true, ..gemm(77, 99, 56) });
}

/// dinp = dout · W and dweight += doutᵀ · inp (both f32) against `linear_backward`.
fn run_gemm_bwd(m: usize, n: usize, k: usize) {
    let name = format!("gemm_bwd_{m}x{n}x{k}");
    let case = Case::new(KIND, &name);
    let dout = bf16_values(SEED, m * n, "dout", 1.0);
    let w = bf16_values(SEED, n * k, "w", 0.2);
    let inp = bf16_values(SEED, m * k, "inp", 1.0);
    let dweight0 = f32_values(SEED, n * k, "dweight0", 0.5, 0.0);
    case.put_bf16("dout", &dout);
    case.put_bf16("w", &w);
    case.put_bf16("inp", &inp);
    case.put_f32("dweight", &dweight0);
    case.run_on(harness(), "gemm_bwd", &args(&[&m, &n, &k]));

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
    // Full tiles; ragged everywhere with the row lengths multiples of 8 (cp.async, zero-fill at
    // the edges); odd sizes (plain loads for every operand); several tiles and reduction steps.
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
        case.run_on(harness(), "casts", &args(&[&n, &offset]));
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

// ---- LayerNorm ------------------------------------------------------------------------------

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
    case.run_on(harness(), "layernorm_fwd", &args(&[&rows, &cols]));

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
    case.run_on(harness(), "layernorm_bwd", &args(&[&rows, &cols]));
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
fn layernorm_forward_backward() {
    // Rows not a multiple of the block's 4 warps; widths below, at and above the 32 lanes, and
    // not multiples of 32; a GPT-2 width.
    for (rows, cols) in [(4, 32), (7, 50), (13, 200), (6, 768), (3, 5)] {
        run_layernorm(rows, cols, false);
    }
    for (rows, cols) in [(5, 96), (9, 130), (2, 31)] {
        run_layernorm(rows, cols, true);
    }
}

// ---- GELU ---------------------------------------------------------------------------------

#[test]
fn gelu_forward_backward() {
    // Element counts that leave the last block partly empty, several grid-stride rounds, and one
    // element; block sizes that are not multiples of 32.
    for (n, blocks, threads) in [(1000, 4, 256), (4099, 3, 96), (1, 1, 32), (777, 2, 100)] {
        let name = format!("gelu_{n}_{blocks}x{threads}");
        let case = Case::new(KIND, &name);
        let inp = bf16_values(SEED, n, "inp", 2.0);
        let dout = bf16_values(SEED, n, "dout", 1.0);
        case.put_bf16("inp", &inp);
        case.put_bf16("dout", &dout);
        let dev = ReferenceDevice;
        let (ri, rd) = (reference(&dev, &inp), reference(&dev, &dout));
        case.run_on(harness(), "gelu_fwd", &args(&[&n, &blocks, &threads]));
        let mut want = dev.alloc(n);
        dev.gelu_forward(&mut want, &ri);
        check_bf16(&format!("{name} fwd"), &case.get_bf16("out"), &want);
        case.run_on(harness(), "gelu_bwd", &args(&[&n, &blocks, &threads]));
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
            harness(),
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
    let s = Stream::new(11, name, 9);
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
        case.run_on(harness(), "xent", &args(&[&rows, &vocab, &vocab_start, &scale]));

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
        case.run_on(harness(), "embedding", &args(&[&batch, &seq, &hidden, &vocab_start, &vocab_rows]));

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

// ---- tensor_ops.cu (the CUDA Device's f32 ops) ----------------------------------------------

/// The reductions of tensor_ops.cu (a warp per row, a thread per column, fixed blocks) and two of
/// its grid-stride kernels on one matrix, against the reference device. The CUDA Device's tests
/// (tests/cuda_device.rs) run every kernel of the file through the Device as well.
#[test]
fn tensor_ops_reductions() {
    for (rows, cols, blocks, vocab_rows) in [(1usize, 1usize, 1usize, 1usize), (7, 33, 2, 5), (40, 300, 3, 17)] {
        let name = format!("tensor_ops_{rows}x{cols}");
        let case = Case::new(KIND, &name);
        let n = rows * cols;
        let x = f32_values(SEED, n, "x", 2.0, 0.3);
        let dy = f32_values(SEED, n, "dy", 1.0, 0.0);
        let w = f32_values(SEED, cols, "w", 0.5, 1.0);
        let b = f32_values(SEED, cols, "b", 0.5, 0.0);
        let (dinp0, dw0, db0) = (
            f32_values(SEED, n, "dinp", 1.0, 0.0),
            f32_values(SEED, cols, "dw", 1.0, 0.0),
            f32_values(SEED, cols, "db", 1.0, 0.0),
        );
        let dwte0 = f32_values(SEED, vocab_rows * cols, "dwte", 1.0, 0.0);
        let tokens: Vec<u32> = (0..rows).map(|i| ((i * 5 + 2) % (vocab_rows + 1)) as u32).collect();
        for (k, v) in [
            ("x", &x),
            ("dy", &dy),
            ("w", &w),
            ("b", &b),
            ("dinp", &dinp0),
            ("dweight", &dw0),
            ("dbias", &db0),
            ("dwte", &dwte0),
        ] {
            case.put_f32(k, v);
        }
        case.put_u32("tokens", &tokens);
        case.run_on(harness(), "tensor_ops", &args(&[&rows, &cols, &blocks, &vocab_rows]));

        let dev = ReferenceDevice;
        let f = |h: &[f32]| reference(&dev, h);
        let (rx, rdy, rw, rb) = (f(&x), f(&dy), f(&w), f(&b));
        let (mut out, mut mean, mut rstd) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
        dev.layernorm_forward(&mut out, &mut mean, &mut rstd, &rx, &rw, &rb, rows, cols);
        check_f32(&format!("{name} layernorm out"), &case.get_f32("out"), &out, 1e-5);
        check_f32(&format!("{name} layernorm rstd"), &case.get_f32("rstd"), &rstd, 1e-5);
        let (mut dinp, mut dw, mut db) = (f(&dinp0), f(&dw0), f(&db0));
        dev.layernorm_backward(&mut dinp, &mut dw, &mut db, &rdy, &rx, &rw, &mean, &rstd, rows, cols);
        // The harness adds Σ_rows dy into dbias once more (column_sum_add_f32, the bias gradient).
        for (c, d) in db.iter_mut().enumerate() {
            *d += (0..rows).map(|r| rdy[r * cols + c]).sum::<f64>();
        }
        check_f32(&format!("{name} layernorm dinp"), &case.get_f32("dinp"), &dinp, 1e-4);
        check_f32(&format!("{name} layernorm dweight"), &case.get_f32("dweight"), &dw, 1e-5);
        check_f32(&format!("{name} dbias"), &case.get_f32("dbias"), &db, 1e-5);
        let mut sums = vec![0f64; rows];
        dev.layernorm_sums(&rx, rows, cols, None, &mut sums);
        check_f32(
            &format!("{name} layernorm_sums"),
            &case.get_f64("sums").iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &sums,
            1e-6,
        );
        let (mut max, mut sum_exp, mut target) = (vec![0f64; rows], vec![0f64; rows], vec![0f64; rows]);
        dev.cross_entropy_max(&rx, rows, cols, &mut max);
        assert_eq!(case.get_f64("max"), max, "{name} xent max");
        dev.cross_entropy_partials(&rx, &tokens, 0, rows, cols, &max, &mut sum_exp, &mut target);
        check_f32(
            &format!("{name} xent sum_exp"),
            &case.get_f64("sum_exp").iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &sum_exp,
            1e-6,
        );
        assert_eq!(case.get_f64("target_logit"), target, "{name} xent target logit");
        let mut dlogits = rx.clone();
        dev.cross_entropy_backward(&mut dlogits, &tokens, 0, rows, cols, &max, &sum_exp, 0.5);
        check(&format!("{name} xent backward"), &case.get_f32("dlogits"), &dlogits, 1e-6, 1e-5);
        let mut dwte = f(&dwte0);
        dev.embedding_backward(&mut dwte, &rdy, &tokens, 0, 1, rows, cols);
        check_f32(&format!("{name} embedding backward"), &case.get_f32("dwte"), &dwte, 1e-5);
        let mut biased = rx.clone();
        dev.add_bias(&mut biased, &rb, rows, cols);
        check_f32(&format!("{name} add_bias"), &case.get_f32("biased"), &biased, 1e-6);
        let mut gelu = dev.alloc(n);
        dev.gelu_forward(&mut gelu, &rx);
        check_f32(&format!("{name} gelu"), &case.get_f32("gelu"), &gelu, 1e-5);
        let squares = case.get_f64("squares");
        assert_eq!(squares.len(), n.div_ceil(8192), "{name}: one partial per 8192 elements");
        for (i, &s) in squares.iter().enumerate() {
            let want: f64 = rx[i * 8192..((i + 1) * 8192).min(n)].iter().map(|v| v * v).sum();
            assert!((s - want).abs() <= 1e-12 * want.max(1.0), "{name} sum of squares block {i}: {s} vs {want}");
        }
    }
}

#[test]
fn attention_forward_causal() {
    // Whole and ragged query blocks (64) and key tiles (64 for d 64, 32 for d 128), one token,
    // several sequences and heads interleaved in the fused QKV rows.
    for (batch, seq, heads, head_dim) in
        [(1, 64, 1, 64), (2, 100, 3, 64), (1, 1, 2, 64), (1, 77, 2, 128), (2, 130, 1, 128), (1, 5, 1, 128)]
    {
        let shape = AttentionShape { batch, seq, heads, head_dim };
        let name = format!("attention_fwd_b{batch}_s{seq}_h{heads}_d{head_dim}");
        let case = Case::new(KIND, &name);
        let qkv = bf16_values(SEED, shape.rows() * 3 * shape.width(), "qkv", 1.0);
        case.put_bf16("qkv", &qkv);
        case.run_on(harness(), "attention_fwd", &args(&[&batch, &seq, &heads, &head_dim]));
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
        let name = format!("attention_bwd_b{batch}_s{seq}_h{heads}_d{head_dim}");
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
        case.run_on(harness(), "attention_bwd", &args(&[&batch, &seq, &heads, &head_dim]));
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

// ---- primitives ---------------------------------------------------------------------------

/// ldmatrix in every variant against the PTX ISA's layout, computed here independently: a 16x16
/// tile holds its element indices, lane l addresses row l % 16, column block l / 16, so matrix i
/// of an .x4 is (rows 8(i%2).., columns 8(i/2)..).
#[test]
fn ldmatrix_layouts() {
    let case = Case::new(KIND, "ldmatrix");
    case.run_on(harness(), "ldmatrix", &[]);
    let regs = case.get_u32("regs");
    let element = |matrix: u32, r: u32, c: u32| 16 * (8 * (matrix % 2) + r) + 8 * (matrix / 2) + c;
    let pack = |lo: u32, hi: u32| lo | (hi << 16);
    for lane in 0..32u32 {
        let (a, b) = (lane / 4, 2 * (lane % 4));
        let plain = |i: u32| pack(element(i, a, b), element(i, a, b + 1));
        let trans = |i: u32| pack(element(i, b, a), element(i, b + 1, a));
        let want = [
            plain(0),
            plain(0),
            plain(1),
            plain(0),
            plain(1),
            plain(2),
            plain(3),
            trans(0),
            trans(0),
            trans(1),
            trans(0),
            trans(1),
            trans(2),
            trans(3),
        ];
        assert_eq!(&regs[lane as usize * 14..lane as usize * 14 + 14], &want, "lane {lane}");
    }
}

/// The warp collectives against CUDA's documented semantics: lanes in segments of `width`;
/// up/down leave a lane whose source falls outside its segment unchanged; xor may read an earlier
/// segment but not a later one.
#[test]
fn shuffles_and_votes() {
    let case = Case::new(KIND, "shuffle");
    case.run_on(harness(), "shuffle", &[]);
    let got = case.get_i32("values");
    for t in 0..64i32 {
        let (warp, lane) = (t / 32, t % 32);
        let v = |l: i32| 100 * warp + l;
        let idx = |src: i32, width: i32| v((lane & !(width - 1)) + (src & (width - 1)));
        let up = |d: i32, width: i32| if lane - d >= (lane & !(width - 1)) { v(lane - d) } else { v(lane) };
        let down = |d: i32, width: i32| if lane + d < (lane & !(width - 1)) + width { v(lane + d) } else { v(lane) };
        let xor = |m: i32, width: i32| if (lane ^ m) < (lane & !(width - 1)) + width { v(lane ^ m) } else { v(lane) };
        let ballot = (0..32).filter(|l| l % 3 == 0).fold(0u32, |b, l| b | (1 << l)) as i32;
        let want = [
            idx(lane * 7 + 3, 32),
            idx(lane * 3, 8),
            up(3, 32),
            up(2, 8),
            down(5, 32),
            down(1, 16),
            xor(6, 32),
            xor(1, 4),
            (warp == 1) as i32,
            0,
            ballot,
        ];
        assert_eq!(&got[t as usize * 11..t as usize * 11 + 11], &want, "thread {t}");
    }
}

/// A lane that returns before a full-warp collective is reported as a deadlock, not a hang.
#[test]
fn divergent_collective_is_reported() {
    let case = Case::new(KIND, "early_return");
    let stderr = case.run_failing_on(harness(), "early_return");
    assert!(stderr.contains("deadlock"), "unexpected report: {stderr}");
}
