//! The HIP kernels of `kernels-hip/` on the CPU: the same sources, compiled by the host C++
//! compiler against the SIMT emulation with 64-lane wavefronts (`kernels-hip/emu/hip.h`, on
//! `kernels-cuda/emu/simt.h`, with a model of `v_mfma_f32_32x32x8bf16_1k`), run on inputs written
//! here and compared with trident's reference device (serial f64) on the same bf16-rounded
//! inputs, within docs/design.md's bf16 rule |x - ref| <= atol + 0.079 |ref| (and a much tighter bound
//! for f32 outputs). The HIP kernels have the CUDA names and arguments, so the cases both vendors
//! run are `common/emu_cases.rs`'s (`shared_kernel_tests!`: the MFMA GEMMs with every epilogue and
//! both backward products, casts, GELU, AdamW, the cross-entropy pieces, the embedding, and
//! FlashAttention forward and backward on MFMA for head dims 32, 64 and 128, and the Llama family's
//! RMSNorm backward on any grid, SwiGLU and rotary embedding). This file adds LayerNorm and RMSNorm
//! on wavefront-sized shapes, the f32 ops of the HIP Device (`tensor_ops.cu`: wave-per-row
//! reductions, column sums, element-wise, embedding) and the wave64 and MFMA probes. Every kernel
//! runs on at least three shapes, ragged ones included. Two tests build the kernels with a planted
//! wave32 assumption (`-DTRIDENT_PLANT_WAVE32_BUG`, a reduction that stops at 32 lanes) and assert
//! that the LayerNorm and tensor_ops comparisons catch it. The same sources built as the fp16
//! module (`-DTRIDENT_FP16`: binary16 storage, `v_mfma_f32_32x32x8f16`) run the shared cases, the
//! wave64 LayerNorm and RMSNorm and the MFMA probe again on binary16 inputs, within fp16's bounds
//! (`mod fp16`).

mod common;
use common::emu::*;
use common::emu_cases::{self, gemm_bwd_by, gemm_case, layernorm_inputs, GemmCase};

use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::device::{LayerNormSaved, Logits, Matrix, Tokens};
use trident::real::Precision;

const HIP: Vendor = Vendor {
    kind: "hip-emu",
    seed: 13,
    harness: "kernels-hip/emu/tests/harness.cpp",
    defines: &[],
    half: Precision::Bf16,
    unaligned_attention: true,
};

/// The same kernels built with the planted wave32 reduction (a butterfly that stops at 32 lanes).
const PLANTED: Vendor = Vendor { kind: "hip-emu-planted", defines: &["-DTRIDENT_PLANT_WAVE32_BUG"], ..HIP };

shared_kernel_tests!(HIP);

/// The same sources built as the fp16 module (`-DTRIDENT_FP16`: binary16 storage, the f16 MFMA),
/// fed binary16 inputs and held to fp16's bounds (`half_bounds`).
const HIP_FP16: Vendor = Vendor { kind: "hip-emu-fp16", defines: &["-DTRIDENT_FP16"], half: Precision::F16, ..HIP };

/// Every shared case on the fp16 module (the MFMA GEMMs with their epilogues and both backward
/// products, FlashAttention for head dims 32, 64 and 128, the cross-entropy, AdamW's 16-bit
/// working copy, GELU, embedding, casts, the bias-gradient sums), the wave64 LayerNorm, and the
/// MFMA probe on operands binary16 holds exactly and bf16 does not.
mod fp16 {
    use super::*;
    shared_kernel_tests!(HIP_FP16);

    #[test]
    fn layernorm_wave64_forward_backward() {
        emu_cases::layernorm_forward_backward(&HIP_FP16, &[(4, 64), (7, 50), (6, 768), (5, 130)]);
    }

    #[test]
    fn rmsnorm_wave64_forward_backward() {
        emu_cases::rmsnorm_forward_backward(&HIP_FP16, &[(4, 64), (7, 50), (6, 768), (5, 130), (70, 64)]);
    }

    /// Multiples of 1/64 up to 6 in magnitude: 9 significant bits, exact in binary16 (11) and not
    /// all in bf16 (8), so an fp16 module that issued the bf16 MFMA (or rounded its operands to
    /// bf16) fails here.
    #[test]
    fn mfma_layout() {
        let a: Vec<f32> = (0..32 * 8).map(|i| (((i * 7) % 11) as f32 - 5.0) + ((i * 13) % 64) as f32 / 64.0).collect();
        let b: Vec<f32> = (0..8 * 32).map(|i| (((i * 5) % 13) as f32 - 6.0) + ((i * 29) % 64) as f32 / 64.0).collect();
        assert!(a.iter().chain(&b).any(|&x| Precision::Bf16.round(x) != x), "the probe must need binary16");
        mfma_layout_on(&HIP_FP16, &a, &b);
    }
}

/// The GEMMs built with groups of 2 row tiles in their grouped tile order (common/tile_order.h;
/// 8 in the real build): grids of 3 x 3 tiles of 64 hold a full group and a short last one, and
/// each GEMM still computes every tile once.
const GROUPS_OF_2: Vendor = Vendor { kind: "hip-emu-groups-of-2", defines: &["-DTRIDENT_GEMM_GROUP_ROWS=2"], ..HIP };

#[test]
fn gemm_grouped_tile_order_covers_every_tile() {
    emu_cases::gemm(&GROUPS_OF_2, GemmCase { bias: true, residual: true, ..gemm_case(150, 140, 40) });
    gemm_bwd_by(&GROUPS_OF_2, 150, 140, 130, "gemm_bwd");
}

// ---- wave64 collectives ----------------------------------------------------------------------

#[test]
fn wave64_collectives() {
    let case = HIP.case("wave64_probe");
    case.run("wave64_probe", &[]);
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
    let a: Vec<f32> = (0..32 * 8).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let b: Vec<f32> = (0..8 * 32).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
    mfma_layout_on(&HIP, &a, &b);
}

/// The MFMA probe of `v`'s build on A [32 x 8] and B [8 x 32] (row-major, values of its storage
/// type whose products and sums f32 holds exactly): every lane's 16 accumulators, which start at
/// lane·16 + r, exactly.
fn mfma_layout_on(v: &Vendor, a: &[f32], b: &[f32]) {
    let case = v.case("mfma_probe");
    case.put_half("a", a);
    case.put_half("b", b);
    case.run("mfma_probe", &[]);
    let out = case.get_f32("out");
    for lane in 0..64usize {
        for r in 0..16usize {
            let (row, col) = (8 * (r / 4) + 4 * (lane / 32) + r % 4, lane % 32);
            let dot: f32 = (0..8).map(|k| a[row * 8 + k] * b[k * 32 + col]).sum();
            assert_eq!(out[lane * 16 + r], (lane * 16 + r) as f32 + dot, "{}: lane {lane} register {r}", v.kind);
        }
    }
    println!("{} mfma probe: 64 lanes x 16 accumulators exact", v.kind);
}

// ---- LayerNorm (wave64 reductions) -------------------------------------------------------------

#[test]
fn layernorm_wave64_forward_backward() {
    // Rows not a multiple of the workgroup's 4 waves; widths below, at and above the 64 lanes
    // (and above 32, where a wave32 reduction would lose half the row), not multiples of 64; a
    // GPT-2 width.
    emu_cases::layernorm_forward_backward(&HIP, &[(4, 64), (7, 50), (13, 200), (6, 768), (3, 5), (5, 130)]);
}

/// The one-launch LayerNorm backward on grids the Device's shapes do not reach (several rows per
/// block, blocks with none, 12288 channels): deterministic, the counter reset.
#[test]
fn layernorm_backward_on_any_grid() {
    emu_cases::layernorm_backward_on_any_grid(&HIP);
}

/// RMSNorm on LayerNorm's wavefront-sized shapes (widths below, at and above the 64 lanes and
/// above 32, where a wave32 reduction would lose half the row) and a 3-block backward with 8-wide
/// accesses (its grids of several groups: the shared `rmsnorm_backward_on_any_grid`).
#[test]
fn rmsnorm_wave64_forward_backward() {
    emu_cases::rmsnorm_forward_backward(&HIP, &[(4, 64), (7, 50), (13, 200), (6, 768), (3, 5), (5, 130), (70, 64)]);
}

/// Runs the forward of `v`'s build and returns the case with (out, mean, rstd) from the reference.
fn layernorm_forward(v: &Vendor, rows: usize, cols: usize) -> (Case, [Vec<f64>; 3]) {
    let case = v.case(&format!("layernorm_{rows}x{cols}"));
    let (inp, weight, bias) = layernorm_inputs(v, rows, cols);
    case.put_half("inp", &inp);
    case.put_f32("weight", &weight);
    case.put_f32("bias", &bias);
    case.run("layernorm_fwd", &args(&[&rows, &cols]));
    let dev = ReferenceDevice;
    let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
    let (rx, rw, rb) = (reference(&dev, &inp), reference(&dev, &weight), reference(&dev, &bias));
    dev.layernorm_forward(&mut out, (&mut mean, &mut rstd), &rx, (&rw, &rb), Matrix { rows, cols });
    (case, [out, mean, rstd])
}

/// The planted wave32 assumption: the same kernels built with a butterfly that starts at 16
/// lanes. Each half-wave then normalises with its own half's statistics, and the comparison that
/// `layernorm_wave64_forward_backward` makes must reject the output; the correct build must
/// accept the same case. This proves the tests can see a wave32 assumption, on rows wide enough
/// that both half-waves hold columns: 600 with 8 columns per lane access, 202 with one.
#[test]
fn planted_wave32_reduction_is_caught() {
    for cols in [600, 202] {
        planted_wave32_reduction_is_caught_on(6, cols);
    }
}

fn planted_wave32_reduction_is_caught_on(rows: usize, cols: usize) {
    let mut detected = Vec::new();
    for build in [&HIP, &PLANTED] {
        let (case, [out, mean, rstd]) = layernorm_forward(build, rows, cols);
        let (bf_atol, bf_rtol) = bf16_bounds();
        let (m_atol, m_rtol) = f32_bounds(&mean, 1e-5);
        let (r_atol, r_rtol) = f32_bounds(&rstd, 1e-5);
        let results = [
            ("out", compare(&case.get_half("out"), &out, bf_atol, bf_rtol)),
            ("mean", compare(&case.get_f32("mean"), &mean, m_atol, m_rtol)),
            ("rstd", compare(&case.get_f32("rstd"), &rstd, r_atol, r_rtol)),
        ];
        for (what, c) in &results {
            println!(
                "{} layernorm {rows}x{cols} {what}: max |error| {:.3e}, {} elements out of bounds{}",
                build.kind,
                c.worst,
                c.violations,
                c.first.map(|(i, g, w)| format!(" (first: element {i} is {g}, the reference {w})")).unwrap_or_default()
            );
        }
        detected.push(results.iter().any(|(_, c)| c.violations > 0));
    }
    assert!(!detected[0], "the correct wave64 build must pass");
    assert!(detected[1], "the planted wave32 reduction was not detected by the LayerNorm comparison on {cols} columns");
}

// ---- tensor_ops.cu (the HIP Device's f32 ops) -------------------------------------------------

/// tensor_ops.cu's row-wise (a wave per row), column-wise and element-wise kernels on one
/// [rows, cols] matrix against the reference device's f64 ops.
fn run_tensor_rows(v: &Vendor, rows: usize, cols: usize, vocab_start: usize) {
    let name = format!("tensor_rows_{rows}x{cols}");
    let case = v.case(&name);
    let n = rows * cols;
    let x = v.f32_values(n, "x", 2.0, 0.5);
    let (weight, bias) = (v.f32_values(cols, "weight", 0.2, 1.0), v.f32_values(cols, "bias", 0.2, 0.0));
    let dout = v.f32_values(n, "dout", 1.0, 0.0);
    let (dinp0, dw0, db0) =
        (v.f32_values(n, "dinp0", 0.1, 0.0), v.f32_values(cols, "dw0", 0.1, 0.0), v.f32_values(cols, "db0", 0.1, 0.0));
    let targets = v.tokens(rows, "targets", (vocab_start + cols + 3) as u32);
    let dev = ReferenceDevice;
    let (rx, rw, rb, rd) =
        (reference(&dev, &x), reference(&dev, &weight), reference(&dev, &bias), reference(&dev, &dout));
    // The whole rows' f64 statistics of the split LayerNorm, from the reference.
    let mut sums = vec![0.0; rows];
    dev.layernorm_sums(&rx, Matrix { rows, cols }, None, &mut sums);
    let mean64: Vec<f64> = sums.iter().map(|s| s / cols as f64).collect();
    let mut sq = vec![0.0; rows];
    dev.layernorm_sums(&rx, Matrix { rows, cols }, Some(&mean64), &mut sq);
    let rstd64: Vec<f64> = sq.iter().map(|s| 1.0 / (s / cols as f64 + 1e-5).sqrt()).collect();
    let (mut out, mut mean, mut rstd) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_forward(&mut out, (&mut mean, &mut rstd), &rx, (&rw, &rb), Matrix { rows, cols });
    let mut bsums = vec![0.0; 2 * rows];
    dev.layernorm_backward_sums(
        &rd,
        LayerNormSaved { inp: &rx, weight: &rw, mean: &mean, rstd: &rstd },
        Matrix { rows, cols },
        &mut bsums,
    );
    let inputs = [("x", &x), ("weight", &weight), ("bias", &bias), ("dout", &dout), ("dinp", &dinp0)];
    for (k, values) in inputs.into_iter().chain([("dweight", &dw0), ("dbias", &db0)]) {
        case.put_f32(k, values);
    }
    case.put_u32("targets", &targets);
    case.put_f64("mean64", &mean64);
    case.put_f64("rstd64", &rstd64);
    case.put_f64("sums64", &bsums);
    let scale = 1.0f32 / 3.0;
    case.run("tensor_rows", &args(&[&rows, &cols, &vocab_start, &scale]));

    check_f32(&format!("{name} layernorm out"), &case.get_f32("out"), &out, 1e-5);
    check_f32(&format!("{name} mean"), &case.get_f32("mean"), &mean, 1e-5);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);
    // Backward on the kernel's own f32 statistics, as the Device runs it.
    let (m32, r32) = (reference(&dev, &case.get_f32("mean")), reference(&dev, &case.get_f32("rstd")));
    let (mut dx, mut dw, mut db) = (reference(&dev, &dinp0), reference(&dev, &dw0), reference(&dev, &db0));
    dev.layernorm_backward(
        &mut dx,
        (&mut dw, &mut db),
        &rd,
        LayerNormSaved { inp: &rx, weight: &rw, mean: &m32, rstd: &r32 },
        Matrix { rows, cols },
    );
    check_f32(&format!("{name} dinp"), &case.get_f32("dx"), &dx, 1e-4);
    check_f32(&format!("{name} dweight"), &case.get_f32("dw"), &dw, 1e-4);
    check_f32(&format!("{name} dbias"), &case.get_f32("db"), &db, 1e-4);
    check_f32(&format!("{name} row sums"), &case.get_f64_as_f32("sums"), &sums, 1e-6);
    check_f32(&format!("{name} squared deviations"), &case.get_f64_as_f32("sqsums"), &sq, 1e-6);
    let mut bs = vec![0.0; 2 * rows];
    dev.layernorm_backward_sums(
        &rd,
        LayerNormSaved { inp: &rx, weight: &rw, mean: &m32, rstd: &r32 },
        Matrix { rows, cols },
        &mut bs,
    );
    check_f32(&format!("{name} backward sums"), &case.get_f64_as_f32("bsums"), &bs, 1e-5);
    let (mut split, mut sm, mut sr) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_apply(&mut split, (&mut sm, &mut sr), &rx, (&rw, &rb), (&mean64, &rstd64), Matrix { rows, cols });
    check_f32(&format!("{name} split out"), &case.get_f32("split"), &split, 1e-5);
    check_f32(&format!("{name} split mean"), &case.get_f32("split_mean"), &sm, 1e-6);
    check_f32(&format!("{name} split rstd"), &case.get_f32("split_rstd"), &sr, 1e-6);
    let (mut sdx, mut sdw, mut sdb) = (reference(&dev, &dinp0), dev.alloc(cols), dev.alloc(cols));
    dev.layernorm_backward_apply(
        &mut sdx,
        (&mut sdw, &mut sdb),
        &rd,
        LayerNormSaved { inp: &rx, weight: &rw, mean: &m32, rstd: &r32 },
        (&bsums, cols),
        Matrix { rows, cols },
    );
    check_f32(&format!("{name} split dinp"), &case.get_f32("split_dx"), &sdx, 1e-4);
    // x as logits of a vocabulary shard.
    let [max, sum_exp, tl] = emu_cases::cross_entropy_reference(&rx, &targets, vocab_start, cols);
    check_f32(&format!("{name} xent max"), &case.get_f64_as_f32("max"), &max, 0.0);
    check_f32(&format!("{name} xent sum_exp"), &case.get_f64_as_f32("sum_exp"), &sum_exp, 1e-6);
    check_f32(&format!("{name} xent target logit"), &case.get_f64_as_f32("target_logit"), &tl, 0.0);
    let mut dl = rx.clone();
    dev.cross_entropy_backward(&mut dl, &targets, Logits { rows, vocab: cols, vocab_start }, &max, &sum_exp, scale);
    check_f32(&format!("{name} dlogits"), &case.get_f32("dlogits"), &dl, 1e-5);
    let colsum: Vec<f64> =
        (0..cols).map(|c| db0[c] as f64 + (0..rows).map(|r| dout[r * cols + c] as f64).sum::<f64>()).collect();
    check_f32(&format!("{name} column sums"), &case.get_f32("colsum"), &colsum, 1e-5);
    let mut biased = rx.clone();
    dev.add_bias(&mut biased, &rb, Matrix { rows, cols });
    check_f32(&format!("{name} add_bias"), &case.get_f32("biased"), &biased, 1e-6);
    let ssq: f64 = case.get_f64("partials").iter().sum();
    let mut acc = vec![0.0];
    dev.sum_squares_into(&[&rx], &mut acc, 0);
    let want = acc[0];
    assert!((ssq - want).abs() <= 1e-12 * want, "{name} sum_squares {ssq} vs {want}");
    println!("{name}: every row, column and element kernel matches the reference");
}

#[test]
fn tensor_ops_rows_columns_and_reductions() {
    // Rows not a multiple of the 4 waves of a workgroup; widths below, at and above the 64
    // lanes (and above 32), not multiples of 64 or of the 256-thread column workgroups; a width
    // over 8192 elements in all, so sum_squares has a ragged second chunk.
    for (rows, cols, vocab_start) in [(4, 64, 0), (7, 50, 3), (13, 200, 100), (3, 5, 0), (11, 777, 40)] {
        run_tensor_rows(&HIP, rows, cols, vocab_start);
    }
}

/// tensor_ops.cu's wave-per-row kernels built with the planted wave32 butterfly: each half-wave
/// keeps its own half's sum, and the comparison must reject the row statistics.
#[test]
fn planted_wave32_reduction_is_caught_in_tensor_ops() {
    let caught = std::panic::catch_unwind(|| run_tensor_rows(&PLANTED, 4, 64, 0));
    assert!(caught.is_err(), "the planted wave32 reduction passed the tensor_ops comparison");
}

#[test]
fn tensor_ops_element_wise_and_embedding() {
    let dev = ReferenceDevice;
    // Grid-stride loops over fewer workgroups than the elements need, and over more.
    for (n, blocks) in [(1, 1), (1000, 2), (4099, 3), (300, 8)] {
        let name = format!("tensor_elems_{n}_{blocks}");
        let case = HIP.case(&name);
        let (a, b) = (HIP.f32_values(n, "a", 2.0, 0.0), HIP.f32_values(n, "b", 1.0, 0.0));
        case.put_f32("a", &a);
        case.put_f32("b", &b);
        case.run("tensor_elems", &args(&[&n, &blocks]));
        let (ra, rb) = (reference(&dev, &a), reference(&dev, &b));
        let mut sum = dev.alloc(n);
        dev.add(&mut sum, &ra, &rb);
        check_f32(&format!("{name} add"), &case.get_f32("sum"), &sum, 1e-7);
        check_f32(&format!("{name} add_assign"), &case.get_f32("acc"), &sum, 1e-7);
        let rounded: Vec<f32> = a.iter().map(|&x| Precision::Bf16.round(x)).collect();
        assert_eq!(case.get_f32("rounded"), rounded, "{name}: round_bf16_f32 is bit-exact");
        let mut g = dev.alloc(n);
        dev.gelu_forward(&mut g, &ra, trident::device::Gelu::Tanh);
        check_f32(&format!("{name} gelu"), &case.get_f32("gelu"), &g, 1e-5);
        let mut dg = dev.alloc(n);
        dev.gelu_backward(&mut dg, &ra, &rb, trident::device::Gelu::Tanh);
        check_f32(&format!("{name} gelu'"), &case.get_f32("dgelu"), &dg, 1e-5);
    }
    for (batch, seq, hidden, vocab_start, vocab_rows, total, t0) in
        [(2, 5, 96, 10, 20, 40, 0), (3, 7, 300, 0, 11, 11, 2), (1, 4, 33, 3, 6, 12, 1), (2, 40, 50, 0, 2, 3, 0)]
    {
        let name = format!("tensor_embedding_{batch}x{seq}x{hidden}_shard{vocab_start}+{vocab_rows}");
        let case = HIP.case(&name);
        let toks = HIP.tokens(batch * seq, "tokens", total);
        let wte = HIP.f32_values(vocab_rows * hidden, "wte", 0.5, 0.0);
        let wpe = HIP.f32_values((t0 + seq) * hidden, "wpe", 0.1, 0.0);
        let dout = HIP.f32_values(batch * seq * hidden, "dout", 1.0, 0.0);
        let dwte0 = HIP.f32_values(vocab_rows * hidden, "dwte0", 0.1, 0.0);
        let dwpe0 = HIP.f32_values((t0 + seq) * hidden, "dwpe0", 0.1, 0.0);
        case.put_u32("tokens", &toks);
        for (k, v) in [("wte", &wte), ("wpe", &wpe), ("dout", &dout), ("dwte", &dwte0), ("dwpe", &dwpe0)] {
            case.put_f32(k, v);
        }
        let [segments, words] = emu_cases::put_segments(&case, &toks, vocab_start, vocab_rows, batch, seq);
        let shape = args(&[&batch, &seq, &hidden, &vocab_start, &vocab_rows, &t0, &segments, &words]);
        case.run("tensor_embedding", &shape);
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &reference(&dev, &wte), Tokens { ids: &toks, batch, seq, vocab_start }, hidden);
        dev.position_forward(&mut out, &reference(&dev, &wpe), batch, t0, seq, hidden);
        check_f32(&format!("{name} out"), &case.get_f32("out"), &out, 1e-6);
        let rd = reference(&dev, &dout);
        let (mut dwte, mut dwpe) = (reference(&dev, &dwte0), reference(&dev, &dwpe0));
        dev.embedding_backward(&mut dwte, &rd, Tokens { ids: &toks, batch, seq, vocab_start }, hidden);
        dev.position_backward(&mut dwpe, &rd, batch, t0, seq, hidden);
        check_f32(&format!("{name} dwte"), &case.get_f32("dwte"), &dwte, 1e-6);
        let in_order = emu_cases::embedding_backward_in_order(&dwte0, &dout, &toks, vocab_start, batch, seq, hidden);
        assert_eq!(case.get_f32("dwte"), in_order, "{name}: dwte is not the (t, b)-order f32 sum");
        check_f32(&format!("{name} dwpe"), &case.get_f32("dwpe"), &dwpe, 1e-6);
    }
}
