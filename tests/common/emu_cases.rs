//! The kernel cases both emulation tests run: the CUDA and HIP kernels of one name take the same
//! arguments (`kernels-cuda/emu/tests/harness.h` runs them for both harnesses), so each case here
//! writes the inputs, runs the vendor's harness and compares its outputs with the reference
//! device. `shared_kernel_tests!(VENDOR)` makes the `#[test]`s whose shapes both vendors share;
//! LayerNorm's and RMSNorm's shapes follow the vendor's warp or wavefront, so their tests stay in
//! each file.

use super::emu::*;

use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AttentionShape, Rotary};
use trident::device::{AdamWTensor, Gemm, LayerNormSaved, Logits, Matrix, Tokens};
use trident::gpu::kernels::plan::{layernorm_bwd_blocks, EmbeddingSegments, LAYERNORM_BWD_GROUP};

/// The `#[test]`s both vendors run on the same shapes, for the test file's `Vendor` constant:
/// each is the function of its name here.
#[macro_export]
macro_rules! shared_kernel_tests {
    ($vendor:expr) => {
        $crate::shared_kernel_tests!($vendor; gemm_plain_f32_out, gemm_fused_epilogues, gemm_backward,
            gemm_backward_input_bf16_out, column_sum_add_bf16, step_scalars, position_forward_bf16,
            casts_f32_bf16, gelu_forward_backward, adamw_f32_master_bf16_weights, softmax_cross_entropy_pieces,
            embedding_forward_backward, attention_forward_causal, attention_backward_causal,
            attention_grouped_query, attention_documents, rmsnorm_backward_on_any_grid, swiglu_forward_backward, rope_forward_backward);
    };
    ($vendor:expr; $($test:ident),*) => {
        $(
            #[test]
            fn $test() {
                $crate::common::emu_cases::$test(&$vendor);
            }
        )*
    };
}

// ---- GEMM -------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
pub struct GemmCase {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    pub gelu: bool,
    pub residual: bool,
    pub bf16_out: bool,
}

pub fn gemm_case(m: usize, n: usize, k: usize) -> GemmCase {
    GemmCase { m, n, k, bias: false, gelu: false, residual: false, bf16_out: false }
}

/// out = A · Wᵀ with the case's epilogue, by the harness op `gemm_f32out` or `gemm_bf16out`.
pub fn gemm(v: &Vendor, c: GemmCase) {
    gemm_by(v, c, if c.bf16_out { "gemm_bf16out" } else { "gemm_f32out" });
}

/// The same by another harness op of the same arguments (CUDA's sm_90a `gemm_sm90_f32out`).
pub fn gemm_by(v: &Vendor, c: GemmCase, op: &str) {
    let GemmCase { m, n, k, bias, gelu, residual, bf16_out } = c;
    let name = format!(
        "{op}_{m}x{n}x{k}{}{}{}",
        if bias { "_bias" } else { "" },
        if gelu { "_gelu" } else { "" },
        if residual { "_res" } else { "" },
    );
    let case = v.case(&name);
    let a = v.half_values(m * k, "a", 1.0);
    let w = v.half_values(n * k, "w", 0.2);
    let b = v.f32_values(n, "bias", 0.5, 0.0);
    let res: Vec<f32> = if bf16_out { v.half_values(m * n, "res", 1.0) } else { v.f32_values(m * n, "res", 1.0, 0.0) };
    case.put_half("a", &a);
    case.put_half("w", &w);
    if bias {
        case.put_f32("bias", &b);
    }
    if residual {
        if bf16_out {
            case.put_half("residual", &res);
        } else {
            case.put_f32("residual", &res);
        }
    }
    case.run(op, &args(&[&m, &n, &k, &(gelu as i32)]));

    let dev = ReferenceDevice;
    let (ra, rw, rb) = (reference(&dev, &a), reference(&dev, &w), reference(&dev, &b));
    let mut want = dev.alloc(m * n);
    dev.linear_forward(&mut want, &ra, &rw, bias.then_some(&rb), Gemm { rows: m, k, n });
    if gelu {
        let pre = want.clone();
        dev.gelu_forward(&mut want, &pre, trident::device::Gelu::Tanh);
    }
    if residual {
        let pre = want.clone();
        dev.add(&mut want, &pre, &reference(&dev, &res));
    }
    if bf16_out {
        case.check_half(&name, "out", &want);
    } else {
        check_f32(&name, &case.get_f32("out"), &want, 1e-5);
    }
}

/// The plain GEMM's shapes: one full tile; ragged M, N and K, with K a multiple of 8 (CUDA's
/// cp.async path, zero-fill at the K edge) and not (its plain loads; for HIP, K not a multiple of
/// the 32-deep slab nor of MFMA's 8); several tiles and K steps each way; tiny.
pub const GEMM_SHAPES: [(usize, usize, usize); 6] =
    [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)];

pub fn gemm_plain_f32_out(v: &Vendor) {
    for (m, n, k) in GEMM_SHAPES {
        gemm(v, gemm_case(m, n, k));
    }
}

pub fn gemm_fused_epilogues(v: &Vendor) {
    for (m, n, k) in [(64, 64, 64), (77, 99, 56), (129, 65, 33)] {
        gemm(v, GemmCase { bias: true, ..gemm_case(m, n, k) });
        gemm(v, GemmCase { bias: true, gelu: true, ..gemm_case(m, n, k) });
        gemm(v, GemmCase { residual: true, ..gemm_case(m, n, k) });
        gemm(v, GemmCase { bias: true, gelu: true, residual: true, bf16_out: true, ..gemm_case(m, n, k) });
        gemm(v, GemmCase { bf16_out: true, ..gemm_case(m, n, k) });
    }
}

/// dinp = dout · W and dweight += doutᵀ · inp (both f32) against `linear_backward`.
fn gemm_bwd(v: &Vendor, m: usize, n: usize, k: usize) {
    gemm_bwd_by(v, m, n, k, "gemm_bwd");
}

/// The same by another harness op of the same files (CUDA's sm_90a `gemm_sm90_bwd`).
pub fn gemm_bwd_by(v: &Vendor, m: usize, n: usize, k: usize, op: &str) {
    gemm_bwd_runs(v, (m, n, k), op, &[], 1);
}

/// dinp and dweight by harness op `op` with `extra` arguments after M, N and K (the sm_90a
/// backward-weight's slices), launched `runs` times from the same inputs, the first launch
/// checked against `linear_backward`; every launch's dweight, in order.
pub fn gemm_bwd_runs(
    v: &Vendor,
    (m, n, k): (usize, usize, usize),
    op: &str,
    extra: &[usize],
    runs: usize,
) -> Vec<Vec<f32>> {
    let suffix: String = extra.iter().map(|e| format!("_{e}")).collect();
    let name = format!("{op}_{m}x{n}x{k}{suffix}");
    let case = v.case(&name);
    let dout = v.half_values(m * n, "dout", 1.0);
    let w = v.half_values(n * k, "w", 0.2);
    let inp = v.half_values(m * k, "inp", 1.0);
    let dweight0 = v.f32_values(n * k, "dweight0", 0.5, 0.0);
    case.put_half("dout", &dout);
    case.put_half("w", &w);
    case.put_half("inp", &inp);
    let arguments: Vec<String> = [m, n, k].iter().chain(extra).map(|a| a.to_string()).collect();
    let mut dweights = Vec::new();
    for _ in 0..runs {
        case.put_f32("dweight", &dweight0);
        case.run(op, &arguments);
        dweights.push(case.get_f32("dweight"));
    }
    let dev = ReferenceDevice;
    let (rdout, rw, rinp) = (reference(&dev, &dout), reference(&dev, &w), reference(&dev, &inp));
    let mut dinp = dev.alloc(m * k);
    let mut dweight = reference(&dev, &dweight0);
    dev.linear_backward(Some(&mut dinp), (&mut dweight, None), &rdout, &rinp, &rw, Gemm { rows: m, k, n });
    check_f32(&format!("{name} dinp"), &case.get_f32("dinp"), &dinp, 1e-5);
    check_f32(&format!("{name} dweight"), &dweights[0], &dweight, 1e-5);
    dweights
}

/// dinp = dout · W with a bf16 output (the f32 sum rounded once) by the harness op `op`
/// (`gemm_bwd_bf16out`, CUDA's sm_90a `gemm_sm90_bwd_bf16out`), against `linear_backward` within
/// docs/design.md's bf16 rule; every element overwritten (the harness presets -1).
pub fn gemm_bwd_input_bf16_out_by(v: &Vendor, m: usize, n: usize, k: usize, op: &str) {
    let name = format!("{op}_{m}x{n}x{k}");
    let case = v.case(&name);
    let dout = v.half_values(m * n, "dout", 1.0);
    let w = v.half_values(n * k, "w", 0.2);
    case.put_half("dout", &dout);
    case.put_half("w", &w);
    case.run(op, &args(&[&m, &n, &k]));
    let dev = ReferenceDevice;
    let (rdout, rw) = (reference(&dev, &dout), reference(&dev, &w));
    let (mut dinp, mut dweight) = (dev.alloc(m * k), dev.alloc(n * k));
    dev.linear_backward(Some(&mut dinp), (&mut dweight, None), &rdout, &dev.alloc(m * k), &rw, Gemm { rows: m, k, n });
    case.check_half(&format!("{name} dinp"), "dinp", &dinp);
}

/// The backward-input GEMM with a bf16 output on the shapes of `gemm_backward`.
pub fn gemm_backward_input_bf16_out(v: &Vendor) {
    for (m, n, k) in [(64, 64, 64), (100, 72, 40), (37, 130, 99), (130, 96, 200), (1, 1, 1), (17, 9, 7)] {
        gemm_bwd_input_bf16_out_by(v, m, n, k, "gemm_bwd_bf16out");
    }
}

pub fn gemm_backward(v: &Vendor) {
    // Full tiles; ragged everywhere, with the row lengths multiples of 8 (CUDA's cp.async,
    // zero-fill at the edges) and odd (plain loads for every operand; for HIP, sizes not multiples
    // of the 64 tile, the 32-deep slab or MFMA's 8); several tiles and reduction steps; tiny.
    for (m, n, k) in [(64, 64, 64), (100, 72, 40), (37, 130, 99), (130, 96, 200), (1, 1, 1), (17, 9, 7)] {
        gemm_bwd(v, m, n, k);
    }
}

/// out[c] plus the column sums of x [rows, cols] in column_sum_add_*'s order (kernels-cuda/
/// tensor_ops.cu's header), computed here independently in f32: chunks of 256 rows, each the sum
/// of its 4 row groups (rows g, g + 4, ..), then the chunks' 4 groups (chunks g, g + 4, ..).
pub fn column_sums_in_kernel_order(out: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let chunks = rows.div_ceil(256).max(1);
    let grouped = |sum: &dyn Fn(usize) -> f32, n: usize| {
        (0..4).fold(0f32, |acc, g| acc + (g..n).step_by(4).fold(0f32, |s, i| s + sum(i)))
    };
    (0..cols)
        .map(|c| {
            let partial = |k: usize| {
                let end = (256 * (k + 1)).min(rows);
                (0..4).fold(0f32, |acc, g| acc + (256 * k + g..end).step_by(4).fold(0f32, |s, r| s + x[r * cols + c]))
            };
            let partials: Vec<f32> = (0..chunks).map(partial).collect();
            out[c] + grouped(&|k| partials[k], chunks)
        })
        .collect()
}

/// The bias gradient of a bf16 dout: dbias[c] += Σ_r dout[r][c] in f32, bit for bit in the
/// kernel's fixed order (so deterministic) on widths below, across and past a 64-column strip
/// and rows below, across and past a 256-row chunk (tails of 1 to 9 chunks); launched again on
/// the same scratch (the strip counters must be back at 0: another exact sum); column_sum_add_f32
/// on the same values alike. A planted bug that drops a partial, reads a wrong row chunk or
/// leaves a counter set fails these.
pub fn column_sum_add_bf16(v: &Vendor) {
    for (rows, cols) in [(1, 1), (7, 33), (40, 300), (3, 1000), (130, 257), (300, 70), (1300, 130), (2100, 65)] {
        let name = format!("column_sum_bf16_{rows}x{cols}");
        let case = v.case(&name);
        let dout = v.half_values(rows * cols, "dout", 2.0);
        let dbias = v.f32_values(cols, "dbias", 0.5, 0.0);
        case.put_half("dout", &dout);
        case.put_f32("dbias", &dbias);
        case.run("column_sum_bf16", &args(&[&rows, &cols]));
        let want = column_sums_in_kernel_order(&dbias, &dout, rows, cols);
        assert_eq!(case.get_f32("dbias"), want, "{name}: not the fixed-order f32 sum");
        let again = column_sums_in_kernel_order(&want, &dout, rows, cols);
        assert_eq!(case.get_f32("dbias_again"), again, "{name}: the second launch differs (counters not reset?)");
        assert_eq!(case.get_f32("dbias_f32"), want, "{name}: column_sum_add_f32 differs from the bf16 kernel's order");
        assert!(case.get_u32("counters").iter().all(|&k| k == 0), "{name}: strip counters left set");
        let rows_order: Vec<f32> = (0..cols).map(|c| (0..rows).fold(dbias[c], |a, r| a + dout[r * cols + c])).collect();
        let exact: Vec<f64> =
            (0..cols).map(|c| dbias[c] as f64 + (0..rows).map(|r| dout[r * cols + c] as f64).sum::<f64>()).collect();
        check_f32(&format!("{name} against f64"), &want, &exact, 1e-5);
        check_f32(&format!("{name} row order against f64"), &rows_order, &exact, 1e-5);
    }
}

/// The step's scalars in the kernels' order, computed here independently: `tree` adds v[i + h]
/// into v[i] for h = n/2 .. 1 within groups of n.
fn tree(v: &mut [f64], n: usize) {
    let mut h = n / 2;
    while h > 0 {
        for i in 0..v.len() {
            if i % n < h {
                v[i] += v[i + h];
            }
        }
        h /= 2;
    }
}

/// xent_loss_f64 and sum_into_f64 (one block of 1024): bit for bit their fixed order (thread
/// strides, then the shared-memory trees: the same on both vendors), and against the plain sums;
/// rows below and past the block, tensors with no parts, one part, and many (past the 8-load
/// batches of a thread's strided sum), past a round of 32.
pub fn step_scalars(v: &Vendor) {
    for (rows, sizes) in
        [(1usize, vec![1usize]), (700, vec![0, 3, 40, 600, 1]), (3000, (0..70).map(|t| (t * 37) % 101).collect())]
    {
        let name = format!("step_scalars_{rows}_{}", sizes.len());
        let case = v.case(&name);
        let max: Vec<f64> = v.f32_values(rows, "max", 3.0, 0.0).iter().map(|&x| x as f64).collect();
        // Denominators of at least 1, as a softmax's are.
        let sum_exp: Vec<f64> =
            v.f32_values(rows, "sum_exp", 50.0, 0.0).iter().map(|&x| 1.0 + x.abs() as f64).collect();
        let target: Vec<f64> = v.f32_values(rows, "target", 2.0, 0.0).iter().map(|&x| x as f64).collect();
        let stats = [sum_exp.clone(), target.clone()].concat();
        // Every seventh row's token is one the loss leaves out (`--eod-mask-loss`).
        let targets: Vec<u32> =
            (0..rows as u32).map(|r| if r % 7 == 3 { trident::device::kernels::IGNORED_TARGET } else { r }).collect();
        let mut first_block = vec![0u32];
        for s in &sizes {
            first_block.push(first_block[first_block.len() - 1] + *s as u32);
        }
        let parts: Vec<f64> =
            v.f32_values(first_block[sizes.len()] as usize, "parts", 1.0, 1.0).iter().map(|&x| x as f64).collect();
        let (loss0, norm0) = ([0.25, -1.5], [0.125]);
        case.put_f64("max", &max);
        case.put_f64("stats", &stats);
        case.put_f64("loss", &loss0);
        case.put_f64("norm", &norm0);
        case.put_u32("first_block", &first_block);
        case.put_f64("parts", &parts);
        case.put_u32("targets", &targets);
        case.run("step_scalars", &args(&[&rows, &sizes.len()]));
        let mut threads = vec![0f64; 1024];
        for r in (0..rows).filter(|r| r % 7 != 3) {
            threads[r % 1024] += sum_exp[r].ln() + max[r] - target[r];
        }
        tree(&mut threads, 1024);
        assert_eq!(
            case.get_f64("loss"),
            [loss0[0], loss0[1] + threads[0]],
            "{name}: the loss is not the fixed-order sum"
        );
        let mut norm = norm0[0];
        for round in (0..sizes.len()).step_by(32) {
            let mut groups = vec![0f64; 1024];
            for t in round..(round + 32).min(sizes.len()) {
                for i in first_block[t] as usize..first_block[t + 1] as usize {
                    groups[32 * (t - round) + (i - first_block[t] as usize) % 32] += parts[i];
                }
            }
            tree(&mut groups, 32);
            for t in round..(round + 32).min(sizes.len()) {
                norm += groups[32 * (t - round)];
            }
        }
        assert_eq!(case.get_f64("norm"), [norm], "{name}: the norm's sum is not the fixed-order sum");
        let plain_loss: f64 = (0..rows).filter(|r| r % 7 != 3).map(|r| sum_exp[r].ln() + max[r] - target[r]).sum();
        let plain_norm: f64 = norm0[0] + parts.iter().sum::<f64>();
        assert!(
            (threads[0] - plain_loss).abs() <= 1e-12 * plain_loss.abs().max(1.0),
            "{name}: loss {} vs {plain_loss}",
            threads[0]
        );
        assert!((norm - plain_norm).abs() <= 1e-12 * plain_norm.abs().max(1.0), "{name}: norm {norm} vs {plain_norm}");
    }
}

/// out [positions·batch, hidden] bf16 += wpe[t0 + p]: bit for bit the stored value plus the f32
/// position row rounded once; a window of positions from t0 > 0, grids that wrap the grid stride.
pub fn position_forward_bf16(v: &Vendor) {
    let shapes = [(1, 0, 1, 1, 1), (2, 3, 5, 96, 1), (3, 0, 7, 130, 2), (2, 1, 4, 33, 5)];
    for (batch, t0, positions, hidden, blocks) in shapes {
        let name = format!("position_bf16_{batch}x{positions}x{hidden}_from{t0}");
        let case = v.case(&name);
        let rows = batch * positions;
        let out = v.half_values(rows * hidden, "out", 1.0);
        let wpe = v.f32_values((t0 + positions) * hidden, "wpe", 0.1, 0.0);
        case.put_half("out", &out);
        case.put_f32("wpe", &wpe);
        case.run("position_bf16", &args(&[&batch, &t0, &positions, &hidden, &blocks]));
        let want: Vec<f32> = (0..rows * hidden)
            .map(|i| v.half.round(out[i] + wpe[(t0 + i / hidden / batch) * hidden + i % hidden]))
            .collect();
        assert_eq!(case.get_half("out"), want, "{name}");
    }
}

// ---- casts ------------------------------------------------------------------------------------

pub fn casts_f32_bf16(v: &Vendor) {
    // Aligned (16-byte groups plus a ragged tail, and enough groups for the grid-stride loop to
    // wrap) and unaligned (offset 1: one element at a time); bit for bit against trident's rounding.
    for (n, offset) in [(1, 0), (7, 0), (8, 0), (1003, 0), (20000, 0), (1003, 1), (64, 3)] {
        let case = v.case(&format!("casts_{n}_{offset}"));
        let mut x = v.f32_values(n, "x", 3.0, 0.0);
        if n > 4 {
            // Ties to even, a value past bf16's range and a NaN.
            x[1] = f32::from_bits(0x3f80_8000);
            x[2] = f32::from_bits(0x3f81_8000);
            x[3] = 3.4e38;
            x[4] = f32::NAN;
        }
        let h = v.half_values(n, "h", 2.0);
        case.put_f32("x", &x);
        case.put_half("h", &h);
        case.run("casts", &args(&[&n, &offset]));
        let rounded = case.get_half("rounded");
        for (i, (&got, &want)) in
            rounded.iter().zip(x.iter().map(|&x| v.half.round(x)).collect::<Vec<_>>().iter()).enumerate()
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

// ---- LayerNorm ----------------------------------------------------------------------------

/// Inputs of a LayerNorm case (input, weight, bias), with a nonzero mean so a wrong sum shows in
/// every output.
pub fn layernorm_inputs(v: &Vendor, rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let inp = v.half_values(rows * cols, "inp", 2.0).iter().map(|x| v.half.round(x + 0.5)).collect();
    (inp, v.f32_values(cols, "weight", 0.2, 1.0), v.f32_values(cols, "bias", 0.2, 0.0))
}

/// The forward (with the fused residual add when `residual`), then the backward on the
/// forward's statistics.
fn layernorm(v: &Vendor, rows: usize, cols: usize, residual: bool) {
    let name = format!("layernorm_{rows}x{cols}{}", if residual { "_res" } else { "" });
    let case = v.case(&name);
    let (inp, weight, bias) = layernorm_inputs(v, rows, cols);
    let res = v.half_values(rows * cols, "res", 1.0);
    case.put_half("inp", &inp);
    if residual {
        case.put_half("residual", &res);
    }
    case.put_f32("weight", &weight);
    case.put_f32("bias", &bias);
    case.run("layernorm_fwd", &args(&[&rows, &cols]));

    // The fused residual add stores x + residual rounded to bf16; the reference normalises that.
    let x: Vec<f32> =
        if residual { inp.iter().zip(&res).map(|(a, b)| v.half.round(a + b)).collect() } else { inp.clone() };
    let dev = ReferenceDevice;
    let (rx, rw, rb) = (reference(&dev, &x), reference(&dev, &weight), reference(&dev, &bias));
    let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
    dev.layernorm_forward(&mut out, (&mut mean, &mut rstd), &rx, (&rw, &rb), Matrix { rows, cols });
    if residual {
        let got = case.get_half("resid_out");
        assert_eq!(got, x, "{name}: the stored residual sum must be the bf16-rounded sum");
    }
    case.check_half(&format!("{name} out"), "out", &out);
    check_f32(&format!("{name} mean"), &case.get_f32("mean"), &mean, 1e-5);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);

    // Backward on the forward's statistics (as f32, what the kernel saved), accumulating into
    // nonzero gradients as the model does, on the Device's grid.
    let (mean32, rstd32) = (case.get_f32("mean"), case.get_f32("rstd"));
    layernorm_backward(v, &case, &name, [&x, &weight, &mean32, &rstd32], layernorm_bwd_blocks(rows, cols));
}

/// `layernorm_bwd_bf16` on `blocks` blocks over `[x, weight, mean, rstd]` (x [rows, cols], the
/// statistics the forward saved): dinp (bf16, accumulated) within docs/design.md's bf16 rule of the reference, the
/// parameter gradients within f32 roundings; a second run from the same inputs gives the same bits
/// and each run leaves every counter (one per group of blocks and one for the groups) at 0.
pub fn layernorm_backward(v: &Vendor, case: &Case, name: &str, [x, weight, mean, rstd]: [&[f32]; 4], blocks: usize) {
    let (rows, cols) = (mean.len(), weight.len());
    let dout = v.half_values(rows * cols, "dout", 1.0);
    let dinp0 = v.half_values(rows * cols, "dinp0", 0.1);
    let dw0 = v.f32_values(cols, "dw0", 0.1, 0.0);
    let db0 = v.f32_values(cols, "db0", 0.1, 0.0);
    case.put_half("dout", &dout);
    case.put_half("inp", x);
    case.put_f32("weight", weight);
    case.put_f32("mean", mean);
    case.put_f32("rstd", rstd);
    case.put_half("dinp", &dinp0);
    case.put_f32("dweight", &dw0);
    case.put_f32("dbias", &db0);
    case.run("layernorm_bwd", &args(&[&rows, &cols, &blocks]));
    let dev = ReferenceDevice;
    let (mut dinp, mut dw, mut db) = (reference(&dev, &dinp0), reference(&dev, &dw0), reference(&dev, &db0));
    let (rx, rw) = (reference(&dev, x), reference(&dev, weight));
    let (rdout, rmean, rrstd) = (reference(&dev, &dout), reference(&dev, mean), reference(&dev, rstd));
    dev.layernorm_backward(
        &mut dinp,
        (&mut dw, &mut db),
        &rdout,
        LayerNormSaved { inp: &rx, weight: &rw, mean: &rmean, rstd: &rrstd },
        Matrix { rows, cols },
    );
    let name = format!("{name} on {blocks} blocks");
    case.check_half(&format!("{name} dinp"), "dinp", &dinp);
    check_f32(&format!("{name} dweight"), &case.get_f32("dweight"), &dw, 1e-4);
    check_f32(&format!("{name} dbias"), &case.get_f32("dbias"), &db, 1e-4);
    assert_repeatable(case, &name, (&["dinp"], &["dweight", "dbias"]), blocks);
}

/// A one-launch backward of `blocks` blocks run twice from the same inputs (the harness's
/// outputs `<out>` and `<out>2`) gave the same bits in each 16-bit and f32 output of `outputs`,
/// and each run left every counter (one per group of blocks and one for the groups) at 0.
fn assert_repeatable(case: &Case, name: &str, (halves, floats): (&[&str], &[&str]), blocks: usize) {
    let same =
        |a: Vec<f32>, b: Vec<f32>| a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    for out in halves {
        assert!(same(case.get_half(out), case.get_half(&format!("{out}2"))), "{name}: {out} differs between two runs");
    }
    for out in floats {
        assert!(same(case.get_f32(out), case.get_f32(&format!("{out}2"))), "{name}: {out} differs between two runs");
    }
    let counters = vec![0; blocks.div_ceil(LAYERNORM_BWD_GROUP) + 1];
    assert_eq!(
        (case.get_u32("counter"), case.get_u32("counter2")),
        (counters.clone(), counters),
        "{name}: counters not reset"
    );
}

/// LayerNorm on the vendor's `shapes` (rows, cols), then with the fused residual add on widths
/// above, below and between the lane counts.
pub fn layernorm_forward_backward(v: &Vendor, shapes: &[(usize, usize)]) {
    for &(rows, cols) in shapes {
        layernorm(v, rows, cols, false);
    }
    for (rows, cols) in [(5, 96), (9, 130), (2, 31)] {
        layernorm(v, rows, cols, true);
    }
}

/// `layernorm_bwd_bf16` on grids other than the Device's: blocks owning several rows with a ragged
/// last one, blocks owning none, one block, blocks taking several passes of 32 rows (a ragged last
/// pass), several groups of 16 blocks (a ragged last group), on widths with and without 8-wide
/// accesses, and GPT-3 175B's 12288 channels.
pub fn layernorm_backward_on_any_grid(v: &Vendor) {
    let grids = [
        (37, 50, 3),
        (200, 96, 7),
        (10, 33, 4),
        (9, 20, 5),
        (5, 7, 8),
        (3, 300, 1),
        (6, 12288, 2),
        (150, 64, 2),
        (130, 33, 1),
        (300, 40, 37),
        (100, 33, 20),
    ];
    for (rows, cols, blocks) in grids {
        let name = format!("layernorm_bwd_{rows}x{cols}");
        let case = v.case(&name);
        let (x, weight, _) = layernorm_inputs(v, rows, cols);
        let (mut mean, mut rstd) = (Vec::new(), Vec::new());
        for row in x.chunks(cols) {
            let mu = row.iter().map(|&a| a as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&a| (a as f64 - mu).powi(2)).sum::<f64>() / cols as f64;
            mean.push(mu as f32);
            rstd.push((1.0 / (var + 1e-5).sqrt()) as f32);
        }
        layernorm_backward(v, &case, &name, [&x, &weight, &mean, &rstd], blocks);
    }
}

// ---- RMSNorm, SwiGLU, rotary embedding (the Llama family) ------------------------------------

/// `rmsnorm_fwd_bf16` then `rmsnorm_bwd_bf16` on the forward's rstd over `blocks` blocks (the
/// Device's grid, `layernorm_bwd_blocks`, when None): out (16-bit) and dinp (accumulated onto a
/// nonzero 16-bit gradient) within the storage's bounds of the reference, rstd and dweight
/// (accumulated) within f32 roundings; a second backward from the same inputs gives the same bits
/// and each leaves every counter at 0.
fn rmsnorm(v: &Vendor, rows: usize, cols: usize, blocks: Option<usize>) {
    let blocks = blocks.unwrap_or_else(|| layernorm_bwd_blocks(rows, cols));
    let name = format!("rmsnorm_{rows}x{cols}_on_{blocks}_blocks");
    let case = v.case(&name);
    let (inp, weight, _) = layernorm_inputs(v, rows, cols);
    let (dout, dinp0) = (v.half_values(rows * cols, "dout", 1.0), v.half_values(rows * cols, "dinp0", 0.1));
    let dw0 = v.f32_values(cols, "dw0", 0.1, 0.0);
    case.put_half("inp", &inp);
    case.put_f32("weight", &weight);
    case.put_half("dout", &dout);
    case.put_half("dinp", &dinp0);
    case.put_f32("dweight", &dw0);
    let eps = 1e-5;
    case.run("rmsnorm", &args(&[&rows, &cols, &blocks, &eps]));
    let dev = ReferenceDevice;
    let (rx, rw, rdout) = (reference(&dev, &inp), reference(&dev, &weight), reference(&dev, &dout));
    let (mut out, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows));
    dev.rmsnorm_forward(&mut out, &mut rstd, &rx, &rw, Matrix { rows, cols }, eps);
    case.check_half(&format!("{name} out"), "out", &out);
    check_f32(&format!("{name} rstd"), &case.get_f32("rstd"), &rstd, 1e-5);
    // The backward on the rstd the kernel saved (f32), as the model runs it.
    let rstd32 = reference(&dev, &case.get_f32("rstd"));
    let (mut dinp, mut dw) = (reference(&dev, &dinp0), reference(&dev, &dw0));
    dev.rmsnorm_backward(&mut dinp, &mut dw, &rdout, (&rx, &rw), &rstd32, Matrix { rows, cols });
    case.check_half(&format!("{name} dinp"), "dinp", &dinp);
    check_f32(&format!("{name} dweight"), &case.get_f32("dweight"), &dw, 1e-4);
    assert_repeatable(&case, &name, (&["dinp"], &["dweight"]), blocks);
}

/// RMSNorm on the vendor's `shapes` (rows, cols) on the Device's grids.
pub fn rmsnorm_forward_backward(v: &Vendor, shapes: &[(usize, usize)]) {
    for &(rows, cols) in shapes {
        rmsnorm(v, rows, cols, None);
    }
}

/// `rmsnorm_bwd_bf16` on grids other than the Device's, as `layernorm_backward_on_any_grid`:
/// blocks owning several rows or none, several passes of 32 rows, several groups of 16 blocks
/// (a ragged last group: the two-level last-block sum), with and without 8-wide accesses.
pub fn rmsnorm_backward_on_any_grid(v: &Vendor) {
    for (rows, cols, blocks) in [(37, 50, 3), (5, 7, 8), (200, 96, 7), (300, 40, 37), (100, 33, 20), (1100, 64, 35)] {
        rmsnorm(v, rows, cols, Some(blocks));
    }
}

/// SwiGLU forward and backward (rows of 2f: gate, then up) on grids of `blocks` x `threads` over
/// buffers `offset` elements in: f one element at a time (f % 8 != 0, or off 16 bytes) and 8 per
/// thread, several grid-stride rounds, partial last wavefronts.
pub fn swiglu_forward_backward(v: &Vendor) {
    let cases = [
        (1, 1, 1, 64, 0),
        (5, 33, 2, 96, 0),
        (7, 64, 3, 256, 0),
        (4, 64, 1, 64, 1),
        (3, 1000, 2, 128, 0),
        (9, 40, 2, 100, 3),
    ];
    for (rows, f, blocks, threads, offset) in cases {
        let name = format!("swiglu_{rows}x{f}_{blocks}x{threads}+{offset}");
        let case = v.case(&name);
        let inp = v.half_values(rows * 2 * f, "inp", 2.0);
        let dout = v.half_values(rows * f, "dout", 1.0);
        case.put_half("inp", &inp);
        case.put_half("dout", &dout);
        let dev = ReferenceDevice;
        let (ri, rd) = (reference(&dev, &inp), reference(&dev, &dout));
        let geometry = args(&[&rows, &f, &blocks, &threads, &offset]);
        case.run("swiglu_fwd", &geometry);
        let mut want = dev.alloc(rows * f);
        dev.swiglu_forward(&mut want, &ri, rows, f);
        case.check_half(&format!("{name} fwd"), "out", &want);
        case.run("swiglu_bwd", &geometry);
        let mut want = dev.alloc(rows * 2 * f);
        dev.swiglu_backward(&mut want, &ri, &rd, rows, f);
        case.check_half(&format!("{name} bwd"), "out", &want);
    }
}

/// Rotary embedding in place on the QKV, forward then backward on the forward's output, against
/// the reference: groups of 2 and 4 query heads, multi-query (one group) and multi-head
/// attention, rotary on part of the head and on all of it, from position 0 and later ones, the
/// head dims the attention kernels take, one grid-stride round and several.
pub fn rope_forward_backward(v: &Vendor) {
    let sh = AttentionShape::new;
    let cases = [
        (sh(2, 5, 4, 8).grouped(2), 8, 0, 3, 64),
        (sh(1, 3, 3, 16).grouped(1), 6, 5, 1, 64),
        (sh(2, 4, 2, 8), 4, 1, 2, 96),
        (sh(2, 7, 8, 64).grouped(2), 64, 3, 4, 256),
        (sh(1, 9, 4, 32).grouped(1), 16, 0, 2, 128),
        (sh(3, 2, 4, 128), 128, 7, 1, 256),
    ];
    for (shape, rd, t0, blocks, threads) in cases {
        let (b, s, h, kv, d) = (shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim);
        let name = format!("rope_b{b}_s{s}_h{h}_kv{kv}_d{d}_rd{rd}_t{t0}");
        let case = v.case(&name);
        let qkv = v.half_values(shape.rows() * shape.qkv_width(), "qkv", 1.0);
        let mut table = Vec::new();
        for t in 0..t0 + s {
            let angle = |j: usize| t as f64 * 10000f64.powf(-2.0 * j as f64 / rd as f64);
            table.extend((0..rd / 2).map(|j| angle(j).cos() as f32));
            table.extend((0..rd / 2).map(|j| angle(j).sin() as f32));
        }
        case.put_half("qkv", &qkv);
        case.put_f32("table", &table);
        case.run("rope", &args(&[&b, &s, &h, &kv, &d, &rd, &t0, &blocks, &threads]));
        let dev = ReferenceDevice;
        let (rotary, rt) = (Rotary { rotary_dim: rd, t0 }, reference(&dev, &table));
        let mut want = reference(&dev, &qkv);
        dev.rope_forward(&mut want, &rt, shape, rotary);
        case.check_half(&format!("{name} fwd"), "fwd", &want);
        let mut want = reference(&dev, &case.get_half("fwd"));
        dev.rope_backward(&mut want, &rt, shape, rotary);
        case.check_half(&format!("{name} bwd"), "bwd", &want);
    }
}

// ---- GELU, AdamW ----------------------------------------------------------------------------

pub fn gelu_forward_backward(v: &Vendor) {
    // Element counts that leave the last block partly empty, several grid-stride rounds, and one
    // element; block sizes that are not multiples of 32 (nor of 64: a partial last wavefront);
    // counts past the last group of 8 (a scalar tail), and buffers off 16 bytes (all scalar);
    // the tanh form, and the exact one (erf 1) on two of them.
    for (n, blocks, threads, offset, erf) in [
        (1000, 4, 256, 0, 0),
        (4099, 3, 96, 0, 0),
        (1, 1, 32, 0, 0),
        (777, 2, 100, 0, 0),
        (1003, 2, 64, 1, 0),
        (4096, 1, 64, 3, 0),
        (1000, 4, 256, 0, 1),
        (1003, 2, 64, 1, 1),
    ] {
        let form = if erf == 1 { trident::device::Gelu::Erf } else { trident::device::Gelu::Tanh };
        let name = format!("gelu_{n}_{blocks}x{threads}+{offset}_{form:?}");
        let case = v.case(&name);
        let inp = v.half_values(n, "inp", 2.0);
        let dout = v.half_values(n, "dout", 1.0);
        case.put_half("inp", &inp);
        case.put_half("dout", &dout);
        let dev = ReferenceDevice;
        let (ri, rd) = (reference(&dev, &inp), reference(&dev, &dout));
        case.run("gelu_fwd", &args(&[&n, &blocks, &threads, &offset, &erf]));
        let mut want = dev.alloc(n);
        dev.gelu_forward(&mut want, &ri, form);
        case.check_half(&format!("{name} fwd"), "out", &want);
        case.run("gelu_bwd", &args(&[&n, &blocks, &threads, &offset, &erf]));
        dev.gelu_backward(&mut want, &ri, &rd, form);
        case.check_half(&format!("{name} bwd"), "out", &want);
    }
}

pub fn adamw_f32_master_bf16_weights(v: &Vendor) {
    for (n, blocks, threads, step_no) in [(1000, 2, 256, 1u64), (3333, 5, 128, 7), (31, 1, 64, 1000)] {
        let name = format!("adamw_{n}_step{step_no}");
        let case = v.case(&name);
        let param = v.f32_values(n, "param", 0.05, 0.0);
        let grad = v.f32_values(n, "grad", 0.01, 0.0);
        let m: Vec<f32> = v.f32_values(n, "m", 0.001, 0.0);
        let var: Vec<f32> = v.f32_values(n, "v", 1e-5, 0.0).iter().map(|x| x.abs()).collect();
        let step = AdamWStep { lr: 3e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: step_no };
        let grad_scale = 0.5f32;
        let c1 = 1.0 / (1.0 - (step.beta1 as f64).powi(step.step as i32));
        let c2 = 1.0 / (1.0 - (step.beta2 as f64).powi(step.step as i32));
        for (k, x) in [("param", &param), ("grad", &grad), ("m", &m), ("v", &var)] {
            case.put_f32(k, x);
        }
        let hyper: [&dyn std::fmt::Display; 8] = [
            &step.lr,
            &step.beta1,
            &step.beta2,
            &step.eps,
            &step.weight_decay,
            &grad_scale,
            &(c1 as f32),
            &(c2 as f32),
        ];
        case.run("adamw", &[args(&[&n, &blocks, &threads]), args(&hyper)].concat());
        let dev = ReferenceDevice;
        let (mut rp, mut rm, mut rv) = (reference(&dev, &param), reference(&dev, &m), reference(&dev, &var));
        let rg = reference(&dev, &grad);
        let t = AdamWTensor { param: &mut rp, grad: &rg, m: &mut rm, v: &mut rv, decayed: true, working: None };
        dev.adamw(t, step, (&vec![grad_scale as f64], 0));
        check_f32(&format!("{name} param"), &case.get_f32("param"), &rp, 1e-5);
        case.check_half(&format!("{name} param_bf16"), "param_bf16", &rp);
        check_f32(&format!("{name} m"), &case.get_f32("m"), &rm, 1e-5);
        check_f32(&format!("{name} v"), &case.get_f32("v"), &rv, 1e-5);
        // The bf16 copy is exactly the rounded master weight.
        let rounded: Vec<f32> = case.get_f32("param").iter().map(|&x| v.half.round(x)).collect();
        assert_eq!(case.get_half("param_bf16"), rounded, "{name}: bf16 weights are the rounded master");
        assert_eq!(case.get_f32("param_rounded"), rounded, "{name}: the f32 working copy is the rounded master");
    }
}

// ---- softmax cross-entropy (vocab-parallel pieces), embedding -------------------------------

/// The reference's cross-entropy pieces of `logits` [rows, vocab], a vocabulary shard from
/// `vocab_start`, per row: [max, sum of exp(logit - max), the target's logit (0 outside the shard)].
pub fn cross_entropy_reference(logits: &Vec<f64>, targets: &[u32], vocab_start: usize, vocab: usize) -> [Vec<f64>; 3] {
    let (dev, rows) = (ReferenceDevice, targets.len());
    let (mut max, mut stats) = (vec![0.0; rows], vec![0.0; 2 * rows]);
    dev.cross_entropy_max(logits, rows, vocab, &mut max);
    dev.cross_entropy_partials(logits, targets, Logits { rows, vocab, vocab_start }, &max, &mut stats);
    let target_logit = stats.split_off(rows);
    [max, stats, target_logit]
}

pub fn softmax_cross_entropy_pieces(v: &Vendor) {
    let mut hits = 0;
    // A shard in the middle of a vocabulary (targets below, inside and above it); widths that
    // are not multiples of the 256-thread block; a GPT-2-sized shard; one column. The bf16
    // kernels read 16 bytes at a time, in batches of 4 groups of 8 a thread: odd widths start
    // rows off a 16-byte boundary (333: heads of 3 and 6 elements), 12565 and the padded GPT-2
    // vocabulary (50304, every row aligned) run whole batches and a remainder.
    for (rows, vocab, vocab_start, total_vocab) in
        [(5, 1000, 500, 2000), (3, 333, 0, 333), (2, 12565, 12565, 50260), (4, 1, 7, 9), (2, 50304, 0, 50304)]
    {
        let name = format!("xent_{rows}x{vocab}_from{vocab_start}");
        let case = v.case(&name);
        let logits = v.half_values(rows * vocab, "logits", 3.0);
        let mut targets = v.tokens(rows, "targets", total_vocab as u32);
        // A token the loss leaves out (`--eod-mask-loss`): its row's gradient is 0.
        if rows > 2 {
            targets[1] = trident::device::kernels::IGNORED_TARGET;
        }
        let scale = 1.0f32 / 7.0;
        hits += targets.iter().filter(|&&t| (t as usize).wrapping_sub(vocab_start) < vocab).count();
        case.put_half("logits", &logits);
        case.put_u32("targets", &targets);
        case.run("xent", &args(&[&rows, &vocab, &vocab_start, &scale]));

        let dev = ReferenceDevice;
        let mut rl = reference(&dev, &logits);
        let [max, sum_exp, target_logit] = cross_entropy_reference(&rl, &targets, vocab_start, vocab);
        // f64 statistics, as the Device's f32-logit kernels write them: the max and the target's
        // logit exact, the sum of f32 exps within a few f32 roundings.
        assert_eq!(case.get_f64("max"), max, "{name} max");
        check_f32(&format!("{name} sum_exp"), &case.get_f64_as_f32("sum_exp"), &sum_exp, 1e-6);
        assert_eq!(case.get_f64("target_logit"), target_logit, "{name} target_logit");
        dev.cross_entropy_backward(&mut rl, &targets, Logits { rows, vocab, vocab_start }, &max, &sum_exp, scale);
        case.check_half(&format!("{name} dlogits"), "dlogits", &rl);
    }
    assert!(hits > 0, "some targets must fall inside the shard");
}

pub fn embedding_forward_backward(v: &Vendor) {
    // A vocabulary shard with tokens outside it and repeated tokens (a small vocabulary); hidden
    // sizes that are not multiples of the 128-thread block; with and without positions.
    for (batch, seq, hidden, vocab_start, vocab_rows, total, positions) in [
        (2, 5, 96, 10, 20, 40, true),
        (3, 7, 130, 0, 11, 11, true),
        (1, 4, 200, 3, 6, 12, false),
        (4, 3, 33, 0, 64, 64, true),
        // Segments of dozens of positions (past the 16-load batches) in a 3-token vocabulary.
        (4, 40, 70, 0, 3, 3, true),
    ] {
        let name = format!("embedding_{batch}x{seq}x{hidden}_shard{vocab_start}+{vocab_rows}");
        let case = v.case(&name);
        let toks = v.tokens(batch * seq, "tokens", total);
        let wte = v.half_values(vocab_rows * hidden, "wte", 0.5);
        let wpe = v.f32_values(seq * hidden, "wpe", 0.1, 0.0);
        let dout = v.half_values(batch * seq * hidden, "dout", 1.0);
        let dwte0 = v.f32_values(vocab_rows * hidden, "dwte0", 0.1, 0.0);
        let dwpe0 = v.f32_values(seq * hidden, "dwpe0", 0.1, 0.0);
        case.put_u32("tokens", &toks);
        case.put_half("wte", &wte);
        if positions {
            case.put_f32("wpe", &wpe);
        }
        case.put_half("dout", &dout);
        case.put_f32("dwte", &dwte0);
        case.put_f32("dwpe", &dwpe0);
        let [segments, words] = put_segments(&case, &toks, vocab_start, vocab_rows, batch, seq);
        case.run("embedding", &args(&[&batch, &seq, &hidden, &vocab_start, &vocab_rows, &segments, &words]));

        let dev = ReferenceDevice;
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &reference(&dev, &wte), Tokens { ids: &toks, batch, seq, vocab_start }, hidden);
        if positions {
            dev.position_forward(&mut out, &reference(&dev, &wpe), batch, 0, seq, hidden);
        }
        case.check_half(&format!("{name} out"), "out", &out);
        let rd = reference(&dev, &dout);
        let (mut dwte, mut dwpe) = (reference(&dev, &dwte0), reference(&dev, &dwpe0));
        dev.embedding_backward(&mut dwte, &rd, Tokens { ids: &toks, batch, seq, vocab_start }, hidden);
        dev.position_backward(&mut dwpe, &rd, batch, 0, seq, hidden);
        check_f32(&format!("{name} dwte"), &case.get_f32("dwte"), &dwte, 1e-6);
        let rows_order = embedding_backward_in_order(&dwte0, &dout, &toks, vocab_start, batch, seq, hidden);
        assert_eq!(case.get_f32("dwte"), rows_order, "{name}: dwte is not the (t, b)-order f32 sum");
        check_f32(&format!("{name} dwpe"), &case.get_f32("dwpe"), &dwpe, 1e-6);
    }
}

/// Writes the tokens' `EmbeddingSegments` (the Device's upload) as the harness's "segments" and
/// returns the op's two arguments for them: the segments and the words.
pub fn put_segments(
    case: &Case,
    tokens: &[u32],
    vocab_start: usize,
    vocab_rows: usize,
    batch: usize,
    seq: usize,
) -> [usize; 2] {
    let s = EmbeddingSegments::new(tokens, vocab_start, vocab_rows, batch, seq);
    case.put_u32("segments", &s.words);
    [s.segments, s.words.len()]
}

/// dwte plus each in-shard position's gradient row added in f32 in (t, b) order, as the reference
/// (and every GPU kernel of the word-embedding gradient) orders them.
pub fn embedding_backward_in_order(
    dwte: &[f32],
    dout: &[f32],
    tokens: &[u32],
    vocab_start: usize,
    batch: usize,
    seq: usize,
    hidden: usize,
) -> Vec<f32> {
    let mut out = dwte.to_vec();
    for t in 0..seq {
        for b in 0..batch {
            let row = (tokens[b * seq + t] as usize).wrapping_sub(vocab_start);
            if row < dwte.len() / hidden {
                for c in 0..hidden {
                    out[row * hidden + c] += dout[(t * batch + b) * hidden + c];
                }
            }
        }
    }
    out
}

// ---- attention ------------------------------------------------------------------------------

pub fn attention_forward_causal(v: &Vendor) {
    // Whole and ragged query blocks (64, CUDA's d 64 128; HIP's 32 per wave) and key tiles
    // (CUDA's 64 for d 32 and d 64, 32 for d 128; HIP's 32), one token, several sequences and
    // heads interleaved in the fused QKV rows, for every head dim; where the vendor reads it,
    // qkv at an odd element offset (not 16-byte aligned: the scalar loads).
    let mut shapes = vec![(1, 64, 1, 64, 0), (2, 100, 3, 64, 0), (1, 1, 2, 64, 0), (1, 77, 2, 128, 0)];
    shapes.extend([(2, 130, 1, 128, 0), (1, 5, 1, 128, 0)]);
    // d 32: one ragged key tile (seq 37), two query blocks over two key tiles, the last of 36
    // keys (seq 100), and three of each, the last of 2 (seq 130).
    shapes.extend([(2, 37, 3, 32, 0), (2, 100, 2, 32, 0), (1, 130, 1, 32, 0)]);
    if v.unaligned_attention {
        shapes.extend([(2, 45, 2, 64, 1), (2, 45, 2, 32, 1)]);
    }
    for (batch, seq, heads, head_dim, offset) in shapes {
        attention_forward_shape(v, AttentionShape::new(batch, seq, heads, head_dim), offset);
    }
}

/// Per-document attention (`--reset-attention-mask`, kernels/common/documents.h), forward and
/// backward against the reference, for every head dim and grouped-query: documents that start
/// inside a key or query tile, one that starts past a whole tile of a block's first rows (their
/// running max is -inf over that tile: the guard against 2^(-inf + inf)), a sequence that is
/// one document, one-position documents, and a second sequence with other bounds.
pub fn attention_documents(v: &Vendor) {
    for (batch, seq, heads, kv_heads, head_dim) in [(2, 130, 2, 1, 64), (2, 77, 2, 2, 128), (2, 100, 4, 2, 32)] {
        let shape = AttentionShape::new(batch, seq, heads, head_dim).grouped(kv_heads);
        // Each sequence's document starts after 0, ascending.
        let cuts: [Vec<usize>; 2] = [
            [3, 4, 37, 70, 71, 100, seq - 1].into_iter().filter(|&c| c < seq).collect(),
            (seq > 90).then_some(90).into_iter().collect(),
        ];
        let starts: Vec<u32> = cuts
            .iter()
            .flat_map(|c| (0..seq).map(move |t| c.iter().rev().find(|&&x| x <= t).map_or(0, |&x| x as u32)))
            .collect();
        attention_forward_documents(v, shape, Some(&starts));
        attention_backward_documents(v, shape, Some(&starts));
    }
}

/// The forward on one shape (grouped-query when `shape.kv_heads < shape.heads`), qkv `offset`
/// elements into its buffer, against the reference.
pub fn attention_forward_shape(v: &Vendor, shape: AttentionShape, offset: usize) {
    attention_forward_case(v, shape, offset, None)
}

fn attention_forward_documents(v: &Vendor, shape: AttentionShape, starts: Option<&[u32]>) {
    attention_forward_case(v, shape, 0, starts)
}

/// The forward of `attention_forward_shape`, under `starts`' documents when given.
fn attention_forward_case(v: &Vendor, shape: AttentionShape, offset: usize, starts: Option<&[u32]>) {
    let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
    let docs = if starts.is_some() { "_docs" } else { "" };
    let name = format!("attention_fwd_b{batch}_s{seq}_h{heads}_kv{kv_heads}_d{head_dim}_at{offset}{docs}");
    let case = v.case(&name);
    let qkv = v.half_values(shape.rows() * shape.qkv_width(), "qkv", 1.0);
    case.put_half("qkv", &qkv);
    if let Some(s) = starts {
        case.put_u32("starts", s);
    }
    case.run("attention_fwd", &args(&[&batch, &seq, &heads, &kv_heads, &head_dim, &offset]));
    let dev = ReferenceDevice;
    let (mut out, mut lse) = (dev.alloc(shape.rows() * shape.width()), dev.alloc(shape.rows() * heads));
    dev.attention_forward(&mut out, &mut lse, &reference(&dev, &qkv), shape, None, starts);
    case.check_half(&format!("{name} out"), "out", &out);
    check_f32(&format!("{name} lse"), &case.get_f32("lse"), &lse, 1e-4);
}

pub fn attention_backward_causal(v: &Vendor) {
    // The forward's output and log-sum-exp come from the reference (rounded to the kernels'
    // bf16 / f32 storage) and are given to both sides, so only the backward is compared.
    // d 32 (CUDA's 64-row tiles both ways): one ragged tile, and two blocks with a ragged second.
    for (batch, seq, heads, head_dim) in [
        (1, 64, 1, 64),
        (2, 100, 2, 64),
        (1, 1, 1, 64),
        (1, 77, 2, 128),
        (2, 70, 1, 128),
        (1, 3, 1, 128),
        (2, 37, 3, 32),
        (2, 100, 2, 32),
    ] {
        attention_backward_shape(v, AttentionShape::new(batch, seq, heads, head_dim));
    }
}

/// Grouped-query attention on Megatron's per-group QKV rows, for each head dim: r = 2 and r = 4
/// query heads per key/value head, with several groups and with one (multi-query), ragged
/// sequences, one and two sequences; the forward (where the vendor reads it, also from an odd
/// element offset: the scalar loads), and the backward whose dK/dV blocks sum their group's query
/// heads, against the reference.
pub fn attention_grouped_query(v: &Vendor) {
    let shapes = [(2, 100, 4, 2, 64), (1, 130, 4, 1, 64), (2, 77, 8, 2, 128), (1, 45, 2, 1, 128)];
    for (batch, seq, heads, kv_heads, head_dim) in shapes.into_iter().chain([(2, 100, 6, 3, 32), (1, 70, 4, 1, 32)]) {
        let shape = AttentionShape::new(batch, seq, heads, head_dim).grouped(kv_heads);
        attention_forward_shape(v, shape, 0);
        attention_backward_shape(v, shape);
    }
    if v.unaligned_attention {
        attention_forward_shape(v, AttentionShape::new(2, 45, 4, 64).grouped(2), 1);
    }
}

/// The backward on one shape (grouped-query when `shape.kv_heads < shape.heads`: dK and dV summed
/// over each group's query heads) against the reference.
pub fn attention_backward_shape(v: &Vendor, shape: AttentionShape) {
    attention_backward_documents(v, shape, None)
}

/// The backward of `attention_backward_shape`, under `starts`' documents when given.
fn attention_backward_documents(v: &Vendor, shape: AttentionShape, starts: Option<&[u32]>) {
    let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
    let docs = if starts.is_some() { "_docs" } else { "" };
    let name = format!("attention_bwd_b{batch}_s{seq}_h{heads}_kv{kv_heads}_d{head_dim}{docs}");
    let case = v.case(&name);
    let qkv = v.half_values(shape.rows() * shape.qkv_width(), "qkv", 1.0);
    let dout = v.half_values(shape.rows() * shape.width(), "dout", 1.0);
    let dev = ReferenceDevice;
    let rqkv = reference(&dev, &qkv);
    let (mut out, mut lse) = (dev.alloc(shape.rows() * shape.width()), dev.alloc(shape.rows() * heads));
    dev.attention_forward(&mut out, &mut lse, &rqkv, shape, None, starts);
    let out: Vec<f32> = out.iter().map(|&x| v.half.round(x as f32)).collect();
    let lse: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
    case.put_half("qkv", &qkv);
    case.put_half("out", &out);
    case.put_half("dout", &dout);
    case.put_f32("lse", &lse);
    if let Some(s) = starts {
        case.put_u32("starts", s);
    }
    case.run("attention_bwd", &args(&[&batch, &seq, &heads, &kv_heads, &head_dim]));
    let mut dqkv = dev.alloc(shape.rows() * shape.qkv_width());
    let (rdout, rout, rlse) = (reference(&dev, &dout), reference(&dev, &out), reference(&dev, &lse));
    dev.attention_backward(&mut dqkv, &rdout, &rqkv, &rout, &rlse, shape, None, starts);
    case.check_half(&format!("{name} dqkv"), "dqkv", &dqkv);
}
