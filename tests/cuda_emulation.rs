//! The CUDA kernels of `kernels-cuda/` on the CPU: the same sources, compiled by the host C++
//! compiler against the SIMT emulation (`kernels-cuda/emu/`), run on inputs written here and
//! compared with trident's reference device (serial f64) on the same bf16-rounded inputs, within
//! docs/design.md's bf16 rule |x - ref| <= atol + 0.079 |ref| (and a much tighter bound for f32
//! outputs). Every kernel runs on at least three shapes, ragged ones included (sizes that are not
//! multiples of any tile). The cases the HIP kernels share are `common/emu_cases.rs`'s
//! (`shared_kernel_tests!`); this file adds LayerNorm's and RMSNorm's warp-sized shapes, the sm_80 GEMMs' larger
//! tiles, the sm_90a wgmma GEMMs, tensor_ops.cu's f32 kernels, and the ldmatrix, shuffle,
//! divergence and dynamic shared memory probes.

mod common;
use common::emu::*;
use common::emu_cases::{self, gemm_bwd_by, gemm_bwd_input_bf16_out_by, gemm_by, gemm_case, GemmCase};

use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::device::AttentionShape;
use trident::device::{LayerNormSaved, Logits, Matrix, Tokens};
use trident::real::Precision;

const CUDA: Vendor = Vendor {
    kind: "cuda-emu",
    seed: 11,
    harness: "kernels-cuda/emu/tests/harness.cpp",
    defines: &[],
    half: Precision::Bf16,
    unaligned_attention: false,
};

shared_kernel_tests!(CUDA);

/// The same sources built as the fp16 module (`-DTRIDENT_FP16`: binary16 storage, .f16 mma and
/// wgmma operands), fed binary16 inputs and held to fp16's bounds (`half_bounds`).
const CUDA_FP16: Vendor = Vendor { kind: "cuda-emu-fp16", defines: &["-DTRIDENT_FP16"], half: Precision::F16, ..CUDA };

/// Every shared case on the fp16 module: the GEMMs forward and backward with their epilogues,
/// attention, the cross-entropy, AdamW's 16-bit working copy, GELU, embedding, casts, the
/// bias-gradient sums.
mod fp16 {
    use super::*;
    shared_kernel_tests!(CUDA_FP16);

    #[test]
    fn layernorm_forward_backward() {
        emu_cases::layernorm_forward_backward(&CUDA_FP16, &[(7, 50), (6, 768), (3, 5)]);
    }

    #[test]
    fn rmsnorm_forward_backward() {
        emu_cases::rmsnorm_forward_backward(&CUDA_FP16, &[(7, 50), (6, 768), (70, 64)]);
    }

    /// The sm_80 GEMMs' larger shapes and the sm_90a wgmma GEMMs (.f16 wgmma, TMA of 16-bit
    /// elements) on the fp16 module.
    #[test]
    fn gemm_sm80_and_wgmma_sm90() {
        emu_cases::gemm(&CUDA_FP16, GemmCase { bias: true, gelu: true, residual: true, ..gemm_case(150, 131, 203) });
        gemm_bwd_by(&CUDA_FP16, 257, 200, 136, "gemm_bwd");
        for (m, n, k) in [(100, 70, 72), (300, 260, 520)] {
            gemm_by(&CUDA_FP16, gemm_case(m, n, k), "gemm_sm90_f32out");
            let fused = GemmCase { bias: true, residual: true, bf16_out: true, ..gemm_case(m, n, k) };
            gemm_by(&CUDA_FP16, fused, "gemm_sm90_bf16out");
        }
        for (m, n, k) in [(100, 72, 40), (300, 264, 200)] {
            gemm_bwd_by(&CUDA_FP16, m, n, k, "gemm_sm90_bwd");
            gemm_bwd_input_bf16_out_by(&CUDA_FP16, m, n, k, "gemm_sm90_bwd_bf16out");
        }
    }
}

/// The sm_80 GEMMs' 128 x 128 tiles and 4-stage ring (common/gemm_pipeline.cuh) past the shared
/// shapes: several blocks each way with ragged last tiles (M, N one past and between multiples of
/// 128), reductions that wrap the ring twice with a ragged last k-tile, on the cp.async path (row
/// lengths multiples of 8) and on plain loads (K odd), with the fused epilogue.
#[test]
fn gemm_sm80_pipeline_ragged_tiles() {
    emu_cases::gemm(&CUDA, gemm_case(257, 200, 264));
    emu_cases::gemm(&CUDA, GemmCase { bias: true, gelu: true, residual: true, ..gemm_case(150, 131, 203) });
    emu_cases::gemm(&CUDA, GemmCase { bias: true, residual: true, bf16_out: true, ..gemm_case(129, 385, 296) });
    gemm_bwd_by(&CUDA, 257, 200, 136, "gemm_bwd");
    gemm_bwd_by(&CUDA, 150, 131, 203, "gemm_bwd");
    gemm_bwd_by(&CUDA, 296, 129, 264, "gemm_bwd");
    gemm_bwd_input_bf16_out_by(&CUDA, 257, 200, 136, "gemm_bwd_bf16out");
    gemm_bwd_input_bf16_out_by(&CUDA, 150, 131, 203, "gemm_bwd_bf16out");
}

/// The GEMMs built with groups of 2 row tiles in their grouped tile order (common/tile_order.cuh;
/// 8 in the real build), so these grids of 3 x 3 to 3 x 5 tiles hold a full group and a short last
/// one: each GEMM still computes every tile once (a tile left out keeps the output's old values, a
/// tile computed twice leaves another out).
const GROUPS_OF_2: Vendor = Vendor { kind: "cuda-emu-groups-of-2", defines: &["-DTRIDENT_GEMM_GROUP_ROWS=2"], ..CUDA };

#[test]
fn gemm_grouped_tile_order_covers_every_tile() {
    // sm_80 (128 x 128 tiles): forward 3 x 3 tiles; backward-input 3 x 3, backward-weight 3 x 3.
    emu_cases::gemm(&GROUPS_OF_2, GemmCase { bias: true, residual: true, ..gemm_case(300, 290, 40) });
    gemm_bwd_by(&GROUPS_OF_2, 300, 290, 270, "gemm_bwd");
    // sm_90a (128 x 256, dW 128 x 128): forward 3 x 3, backward-input 3 x 3, backward-weight 3 x 5.
    gemm_by(&GROUPS_OF_2, gemm_case(300, 520, 64), "gemm_sm90_f32out");
    gemm_bwd_by(&GROUPS_OF_2, 300, 296, 520, "gemm_sm90_bwd");
}

/// Attention's 2-stage cp.async rings (common/cp_async_ring.cuh) over many tiles, the last one
/// ragged: d 64 at seq 300 (forward: up to 5 key tiles of 64, the last 44 keys; dK/dV: 10 query
/// tiles of 32, the last 12; dQ: 10 key tiles of 32) and d 128 at seq 203 (forward: 7 key tiles
/// of 32, the last 11; dK/dV: 13 query tiles of 16; dQ: 13 key tiles of 16) and d 32 at seq 457
/// (forward, dK/dV and dQ: up to 8 tiles of 64, the last of 9 positions), two sequences and two
/// heads interleaved, so every stage is refilled several times while the other is read.
#[test]
fn attention_pipeline_many_tiles_ragged() {
    for (batch, seq, heads, head_dim) in [(2, 300, 2, 64), (2, 203, 2, 128), (2, 457, 2, 32)] {
        let shape = AttentionShape::new(batch, seq, heads, head_dim);
        emu_cases::attention_forward_shape(&CUDA, shape, 0);
        emu_cases::attention_backward_shape(&CUDA, shape);
    }
}

/// The sm_90a GEMMs (wgmma fed by TMA, 128 x 256 tiles, dW's 128 x 128, 4 stages): a full tile; ragged rows,
/// columns and reduction (TMA's zero fill, guarded stores) with row pitches multiples of 8 (what
/// TMA needs; the Device picks the mma.sync kernels otherwise); more reduction steps than stages
/// (every barrier through several phases) and several tiles each way; tiny.
#[test]
fn gemm_wgmma_sm90_forward() {
    for (m, n, k) in [(128, 128, 64), (100, 70, 72), (37, 130, 200), (300, 260, 520), (1, 1, 8)] {
        gemm_by(&CUDA, gemm_case(m, n, k), "gemm_sm90_f32out");
    }
    gemm_by(&CUDA, GemmCase { bias: true, gelu: true, residual: true, ..gemm_case(77, 99, 56) }, "gemm_sm90_f32out");
    gemm_by(&CUDA, GemmCase { bias: true, ..gemm_case(129, 136, 264) }, "gemm_sm90_f32out");
    // gemm_fwd_bf16_sm90: bf16 output and residual, the same epilogue.
    for (m, n, k) in [(128, 128, 64), (100, 70, 72), (300, 260, 520)] {
        gemm_by(&CUDA, GemmCase { bf16_out: true, ..gemm_case(m, n, k) }, "gemm_sm90_bf16out");
    }
    let fused = GemmCase { bias: true, gelu: true, residual: true, bf16_out: true, ..gemm_case(77, 99, 56) };
    gemm_by(&CUDA, fused, "gemm_sm90_bf16out");
    gemm_by(&CUDA, GemmCase { residual: true, bf16_out: true, ..gemm_case(129, 136, 264) }, "gemm_sm90_bf16out");
}

#[test]
fn gemm_wgmma_sm90_backward() {
    // Backward-input reduces over N, backward-weight over M: both past 4 stages in the last two;
    // K 264: two of backward-input's 256-column tiles (the second ragged), three of dW's 128.
    for (m, n, k) in
        [(128, 128, 128), (100, 72, 40), (37, 136, 96), (300, 264, 200), (520, 80, 136), (1, 8, 8), (150, 96, 264)]
    {
        gemm_bwd_by(&CUDA, m, n, k, "gemm_sm90_bwd");
    }
    // gemm_bwd_input_bf16_bf16out_sm90: the f32 sum rounded once into bf16.
    for (m, n, k) in [(128, 128, 128), (100, 72, 40), (300, 264, 200), (1, 8, 8)] {
        gemm_bwd_input_bf16_out_by(&CUDA, m, n, k, "gemm_sm90_bwd_bf16out");
    }
}

/// sm_90a backward-weight with its reduction over M cut into `slices` (gridDim.z) that the
/// Device picks for layers with few dW tiles (`plan::sm90_weight_slices`): each slice's partial
/// tile, the tile's last slice summing them in slice order and adding to dW. Against
/// `linear_backward` as one product, on: two tiles in 2 slices; a 3 x 2 grid in 3 (ragged rows,
/// columns and reduction); 4 slices of 4 steps each; 3 slices of 2 steps (one slice empty). Twice
/// each: whichever slice of a tile finishes last, the bits are the same (a sum in arrival order
/// gives other bits once blocks finish in another order); the harness also fails if a tile's
/// counter is left nonzero for the next launch.
#[test]
fn gemm_wgmma_sm90_weight_slices() {
    for (m, n, k, slices) in [(520, 80, 136, 2), (300, 264, 200, 3), (1000, 136, 72, 4), (100, 8, 8, 3)] {
        let runs = emu_cases::gemm_bwd_runs(&CUDA, (m, n, k), "gemm_sm90_bwd", &[slices], 2);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&runs[0]) == bits(&runs[1]), "{m}x{n}x{k} in {slices} slices: two launches gave different bits");
    }
}

/// The 128-byte swizzle from TMA's write to wgmma's read (harness.cpp's `wgmma_probe`: one
/// m64n128 product over K = 64 in four k16 steps, both operands K-major or both MN-major, with
/// gemm_bf16_sm90.cu's descriptors) matches the product computed here; and each planted bug
/// fails, by a wrong product or by the emulation refusing it: a wrong SBO, tensor maps without
/// swizzle under 128B descriptors, no-swizzle descriptors over swizzled tiles, the K step of the
/// other major-ness, tiles off the 1024-byte period, a wrong MN-major LBO.
#[test]
fn wgmma_reads_what_tma_swizzled_and_planted_layout_bugs_fail() {
    let (a, b) = (CUDA.half_values(64 * 64, "probe_a", 1.0), CUDA.half_values(128 * 64, "probe_b", 1.0));
    let want: Vec<f64> = (0..64 * 128)
        .map(|i| (0..64).map(|k| f64::from(a[i / 128 * 64 + k]) * f64::from(b[i % 128 * 64 + k])).sum())
        .collect();
    let transpose =
        |x: &[f32], rows: usize| -> Vec<f32> { (0..x.len()).map(|i| x[i % rows * 64 + i / rows]).collect() };
    for mn_major in [0, 1] {
        for plant in [0, 1, 2, 3, 4, 5, 6] {
            if plant == 6 && mn_major == 0 {
                continue; // a K-major operand's LBO is unused under the swizzle
            }
            let case = CUDA.case(&format!("wgmma_probe_{mn_major}_{plant}"));
            // K-major: A [m][k], B [n][k] as they are; MN-major: A [k][m], B [k][n].
            if mn_major == 1 {
                case.put_half("a", &transpose(&a, 64));
                case.put_half("b", &transpose(&b, 128));
            } else {
                case.put_half("a", &a);
                case.put_half("b", &b);
            }
            let outcome = case.outcome("wgmma_probe", &args(&[&mn_major, &plant]));
            let matches = outcome.is_ok() && compare(&case.get_f32("d"), &want, 1e-4, 1e-5).violations == 0;
            assert_eq!(matches, plant == 0, "major-ness {mn_major}, plant {plant}: {outcome:?}");
        }
    }
}

/// The emulated cuTensorMapEncodeTiled (harness.cpp's `tensor_map_rules`, also the emulating
/// driver's) refuses what the driver does (an innermost box over the 128-byte swizzle span, a
/// global address off 16 bytes, a row pitch not a multiple of 16 bytes) and what it does not
/// model (a 128B-swizzled box under 128 bytes, the 64-byte swizzle), and accepts the GEMMs' map.
#[test]
fn tensor_maps_follow_the_drivers_rules() {
    let case = CUDA.case("tensor_map_rules");
    case.run("tensor_map_rules", &[]);
    assert_eq!(case.get_i32("refused"), [0, 1, 1, 1, 1, 1, 0]);
}

#[test]
fn layernorm_forward_backward() {
    // Rows not a multiple of the block's 4 warps; widths below, at and above the 32 lanes, and
    // not multiples of 32; a GPT-2 width.
    emu_cases::layernorm_forward_backward(&CUDA, &[(4, 32), (7, 50), (13, 200), (6, 768), (3, 5)]);
}

/// The one-launch LayerNorm backward on grids the Device's shapes do not reach (several rows per
/// block, blocks with none, 12288 channels): deterministic, the counter reset.
#[test]
fn layernorm_backward_on_any_grid() {
    emu_cases::layernorm_backward_on_any_grid(&CUDA);
}

/// RMSNorm on LayerNorm's warp-sized shapes and a 3-block backward with 8-wide accesses.
#[test]
fn rmsnorm_forward_backward() {
    emu_cases::rmsnorm_forward_backward(&CUDA, &[(4, 32), (7, 50), (13, 200), (6, 768), (3, 5), (70, 64)]);
}

// ---- tensor_ops.cu (the CUDA Device's f32 ops) ----------------------------------------------

/// The reductions of tensor_ops.cu (a warp per row, a thread per column, fixed blocks) and two of
/// its grid-stride kernels on one matrix, against the reference device. The CUDA Device's tests
/// (tests/cuda_device.rs) run every kernel of the file through the Device as well.
#[test]
fn tensor_ops_reductions() {
    // The last shape: a 2-row vocabulary shard, so each embedding segment is dozens of positions.
    for (rows, cols, blocks, vocab_rows) in
        [(1usize, 1usize, 1usize, 1usize), (7, 33, 2, 5), (40, 300, 3, 17), (130, 70, 2, 2)]
    {
        let name = format!("tensor_ops_{rows}x{cols}");
        let case = CUDA.case(&name);
        let n = rows * cols;
        let x = CUDA.f32_values(n, "x", 2.0, 0.3);
        let dy = CUDA.f32_values(n, "dy", 1.0, 0.0);
        let w = CUDA.f32_values(cols, "w", 0.5, 1.0);
        let b = CUDA.f32_values(cols, "b", 0.5, 0.0);
        let (dinp0, dw0, db0) = (
            CUDA.f32_values(n, "dinp", 1.0, 0.0),
            CUDA.f32_values(cols, "dw", 1.0, 0.0),
            CUDA.f32_values(cols, "db", 1.0, 0.0),
        );
        let dwte0 = CUDA.f32_values(vocab_rows * cols, "dwte", 1.0, 0.0);
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
        let [segments, words] = emu_cases::put_segments(&case, &tokens, 0, vocab_rows, 1, rows);
        case.run("tensor_ops", &args(&[&rows, &cols, &blocks, &vocab_rows, &segments, &words]));

        let dev = ReferenceDevice;
        let f = |h: &[f32]| reference(&dev, h);
        let (rx, rdy, rw, rb) = (f(&x), f(&dy), f(&w), f(&b));
        let (mut out, mut mean, mut rstd) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
        dev.layernorm_forward(&mut out, (&mut mean, &mut rstd), &rx, (&rw, &rb), Matrix { rows, cols });
        check_f32(&format!("{name} layernorm out"), &case.get_f32("out"), &out, 1e-5);
        check_f32(&format!("{name} layernorm rstd"), &case.get_f32("rstd"), &rstd, 1e-5);
        let (mut dinp, mut dw, mut db) = (f(&dinp0), f(&dw0), f(&db0));
        dev.layernorm_backward(
            &mut dinp,
            (&mut dw, &mut db),
            &rdy,
            LayerNormSaved { inp: &rx, weight: &rw, mean: &mean, rstd: &rstd },
            Matrix { rows, cols },
        );
        // The harness adds Σ_rows dy into dbias once more (column_sum_add_f32, the bias gradient).
        for (c, d) in db.iter_mut().enumerate() {
            *d += (0..rows).map(|r| rdy[r * cols + c]).sum::<f64>();
        }
        check_f32(&format!("{name} layernorm dinp"), &case.get_f32("dinp"), &dinp, 1e-4);
        check_f32(&format!("{name} layernorm dweight"), &case.get_f32("dweight"), &dw, 1e-5);
        check_f32(&format!("{name} dbias"), &case.get_f32("dbias"), &db, 1e-5);
        let mut sums = vec![0f64; rows];
        dev.layernorm_sums(&rx, Matrix { rows, cols }, None, &mut sums);
        check_f32(&format!("{name} layernorm_sums"), &case.get_f64_as_f32("sums"), &sums, 1e-6);
        let [max, sum_exp, target] = emu_cases::cross_entropy_reference(&rx, &tokens, 0, cols);
        assert_eq!(case.get_f64("max"), max, "{name} xent max");
        check_f32(&format!("{name} xent sum_exp"), &case.get_f64_as_f32("sum_exp"), &sum_exp, 1e-6);
        assert_eq!(case.get_f64("target_logit"), target, "{name} xent target logit");
        let mut dlogits = rx.clone();
        dev.cross_entropy_backward(
            &mut dlogits,
            &tokens,
            Logits { rows, vocab: cols, vocab_start: 0 },
            &max,
            &sum_exp,
            0.5,
        );
        check(&format!("{name} xent backward"), &case.get_f32("dlogits"), &dlogits, 1e-6, 1e-5);
        let mut dwte = f(&dwte0);
        dev.embedding_backward(&mut dwte, &rdy, Tokens { ids: &tokens, batch: 1, seq: rows, vocab_start: 0 }, cols);
        check_f32(&format!("{name} embedding backward"), &case.get_f32("dwte"), &dwte, 1e-5);
        let in_order = emu_cases::embedding_backward_in_order(&dwte0, &dy, &tokens, 0, 1, rows, cols);
        assert_eq!(case.get_f32("dwte"), in_order, "{name}: dwte is not the (t, b)-order f32 sum");
        let mut biased = rx.clone();
        dev.add_bias(&mut biased, &rb, Matrix { rows, cols });
        check_f32(&format!("{name} add_bias"), &case.get_f32("biased"), &biased, 1e-6);
        let mut gelu = dev.alloc(n);
        dev.gelu_forward(&mut gelu, &rx, trident::device::Gelu::Tanh);
        check_f32(&format!("{name} gelu"), &case.get_f32("gelu"), &gelu, 1e-5);
        let squares = case.get_f64("squares");
        assert_eq!(squares.len(), n.div_ceil(8192), "{name}: one partial per 8192 elements");
        for (i, &s) in squares.iter().enumerate() {
            let want: f64 = rx[i * 8192..((i + 1) * 8192).min(n)].iter().map(|v| v * v).sum();
            assert!((s - want).abs() <= 1e-12 * want.max(1.0), "{name} sum of squares block {i}: {s} vs {want}");
        }
    }
}

// ---- primitives ---------------------------------------------------------------------------

/// ldmatrix in every variant against the PTX ISA's layout, computed here independently: a 16x16
/// tile holds its element indices, lane l addresses row l % 16, column block l / 16, so matrix i
/// of an .x4 is (rows 8(i%2).., columns 8(i/2)..).
#[test]
fn ldmatrix_layouts() {
    let case = CUDA.case("ldmatrix");
    case.run("ldmatrix", &[]);
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
    let case = CUDA.case("shuffle");
    case.run("shuffle", &[]);
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
    let case = CUDA.case("early_return");
    let stderr = case.run_failing("early_return");
    assert!(stderr.contains("deadlock"), "unexpected report: {stderr}");
}

/// A cp.async refill of a buffer that another warp has yet to read (no barrier between the read
/// and the refill: a ring stage overwritten too early) hands that warp the refill's NaNs (the
/// emulation fills a cp.async destination with NaN at the instruction) or its data: odd blocks
/// run warp first (simt.h), so the first warp refills before the second reads (block 0, in lockstep, shows at most the
/// lane that completes the collective running ahead).
#[test]
fn refill_before_another_warps_read_is_caught() {
    let case = CUDA.case("early_refill");
    case.run("early_refill", &[]);
    let got = case.get_f32("values");
    let want = |t: usize| (t ^ 32) as f32;
    assert!((64..96).all(|t| got[t] == want(t - 64)), "warp-first block, first warp: {:?}", &got[64..96]);
    // The second warp reads the refill (in flight: NaN; landed: src[64..]), never the first fill.
    assert!(got[96..].iter().all(|x| x.is_nan() || *x >= 64.0), "warp-first block, second warp: {:?}", &got[96..]);
}

/// A launch that gives a kernel less dynamic shared memory than it uses is reported (the GPU
/// traps on the same check, base.cuh's DYNAMIC_SHARED), not run past the buffer's end.
#[test]
fn dynamic_shared_memory_short_of_the_kernel_is_reported() {
    let case = CUDA.case("short_dynamic_shared");
    let stderr = case.run_failing("short_dynamic_shared");
    assert!(
        stderr.contains("the kernel uses 81920 bytes of dynamic shared memory, the launch gave 81919"),
        "unexpected report: {stderr}"
    );
}
