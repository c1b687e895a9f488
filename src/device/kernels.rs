//! The math of every fused op except GEMM, written once over `Real` and over a slice of rows or
//! one attention head: the reference device runs it serially in f64, the CPU device in parallel
//! in f32, so the oracle and the fast path cannot drift apart in their formulas.

use super::dropout::{Dropout, Masks};
use super::{AdamWStep, AttentionShape, LayerNormSaved, Matrix, Tokens};
use crate::real::Real;
use std::ops::Range;

/// Megatron's default `--layernorm-epsilon`.
pub const LAYERNORM_EPS: f64 = 1e-5;

/// sqrt(2/pi) and the cubic coefficient of GPT-2's tanh-approximated GELU.
const GELU_SCALE: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044_715;

/// LayerNorm of the rows in `inp` (a whole number of rows of width `cols`).
#[inline(always)]
pub fn layernorm_forward_rows<R: Real>(
    out: &mut [R],
    (mean, rstd): (&mut [R], &mut [R]),
    inp: &[R],
    (weight, bias): (&[R], &[R]),
    cols: usize,
) {
    let eps = R::from_f64(LAYERNORM_EPS);
    let n = R::from_f64(cols as f64);
    for (r, (x, y)) in inp.chunks_exact(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
        let mu = lane_sum_of(x, |v| v) / n;
        let var = lane_sum_of(x, |v| (v - mu) * (v - mu));
        let rs = R::ONE / (var / n + eps).sqrt();
        normalize_row(y, x, (mu, rs), weight, bias);
        mean[r] = mu;
        rstd[r] = rs;
    }
}

/// One row of LayerNorm's output from the row's mean and reciprocal std:
/// `y = (x - mean) · rstd · weight + bias`.
#[inline(always)]
fn normalize_row<R: Real>(y: &mut [R], x: &[R], (mu, rs): (R, R), weight: &[R], bias: &[R]) {
    for c in 0..x.len() {
        y[c] = (x[c] - mu) * rs * weight[c] + bias[c];
    }
}

/// One row's LayerNorm gradients from the row's statistics and its means of `g = dy·weight` and
/// of `g·x̂`: `dinp += rstd · (g - mean(g) - x̂ · mean(g·x̂))`, and the row's contributions
/// `dweight += dy·x̂`, `dbias += dy`.
#[inline(always)]
fn layernorm_backward_row<R: Real>(
    dx: &mut [R],
    (dweight, dbias): (&mut [R], &mut [R]),
    dy: &[R],
    (x, weight): (&[R], &[R]),
    (mu, rs): (R, R),
    (mean_g, mean_gx): (R, R),
) {
    for c in 0..x.len() {
        let xhat = (x[c] - mu) * rs;
        dx[c] += rs * (dy[c] * weight[c] - mean_g - xhat * mean_gx);
        dweight[c] += dy[c] * xhat;
        dbias[c] += dy[c];
    }
}

/// LayerNorm backward for a block of rows: `dinp +=` the input gradient, and the block's
/// contribution to the weight and bias gradients is added to `dweight` / `dbias`.
#[inline(always)]
pub fn layernorm_backward_rows<R: Real>(
    dinp: &mut [R],
    (dweight, dbias): (&mut [R], &mut [R]),
    dout: &[R],
    LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, [R]>,
    cols: usize,
) {
    let n = R::from_f64(cols as f64);
    for r in 0..mean.len() {
        let x = &inp[r * cols..(r + 1) * cols];
        let dy = &dout[r * cols..(r + 1) * cols];
        let dx = &mut dinp[r * cols..(r + 1) * cols];
        let (mu, rs) = (mean[r], rstd[r]);
        // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * weight.
        let (dweight, dbias, weight) = (&mut dweight[..cols], &mut dbias[..cols], &weight[..cols]);
        let (mut acc_g, mut acc_gx) = ([R::ZERO; LANES], [R::ZERO; LANES]);
        let mut column = |c: usize, l: usize| {
            let xhat = (x[c] - mu) * rs;
            let g = dy[c] * weight[c];
            acc_g[l] += g;
            acc_gx[l] += g * xhat;
        };
        let full = cols - cols % LANES;
        for c0 in (0..full).step_by(LANES) {
            for l in 0..LANES {
                column(c0 + l, l);
            }
        }
        for c in full..cols {
            column(c, c - full);
        }
        let means = (combine_lanes(acc_g) / n, combine_lanes(acc_gx) / n);
        layernorm_backward_row(dx, (dweight, dbias), dy, (x, weight), (mu, rs), means);
    }
}

/// LayerNorm over a hidden dimension split across ranks (2-D tensor parallelism), step 1 of the
/// forward: each row's sum over this rank's columns, of `x` (no `mean`) or of `(x - mean)²`.
/// The four steps of the split LayerNorm take whole buffers and work on their first `rows` rows,
/// serially: both host devices run them as they are (the reference in f64, the CPU in f32).
pub fn layernorm_sums_rows<R: Real>(inp: &[R], Matrix { rows, cols }: Matrix, mean: Option<&[f64]>, out: &mut [f64]) {
    for (r, x) in inp[..rows * cols].chunks_exact(cols).enumerate() {
        out[r] = match mean {
            None => x.iter().map(|v| v.to_f64()).sum(),
            Some(m) => x.iter().map(|v| (v.to_f64() - m[r]) * (v.to_f64() - m[r])).sum(),
        };
    }
}

/// Step 2: normalise with the whole row's statistics and apply this rank's slice of the scale
/// and shift; the statistics are saved in the device's format for backward.
pub fn layernorm_apply_rows<R: Real>(
    out: &mut [R],
    (mean_out, rstd_out): (&mut [R], &mut [R]),
    inp: &[R],
    (weight, bias): (&[R], &[R]),
    (mean, rstd): (&[f64], &[f64]),
    Matrix { rows, cols }: Matrix,
) {
    let n = rows * cols;
    for (r, (x, y)) in inp[..n].chunks_exact(cols).zip(out[..n].chunks_exact_mut(cols)).enumerate() {
        let (mu, rs) = (R::from_f64(mean[r]), R::from_f64(rstd[r]));
        normalize_row(y, x, (mu, rs), weight, bias);
        mean_out[r] = mu;
        rstd_out[r] = rs;
    }
}

/// Backward step 1: each row's `Σ g` and `Σ g·x̂` over this rank's columns (`g = dy·weight`), as
/// pairs in `out`.
pub fn layernorm_backward_sums_rows<R: Real>(
    dout: &[R],
    LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, [R]>,
    Matrix { rows, cols }: Matrix,
    out: &mut [f64],
) {
    for r in 0..rows {
        let (x, dy) = (&inp[r * cols..(r + 1) * cols], &dout[r * cols..(r + 1) * cols]);
        let (mut sg, mut sgx) = (0.0f64, 0.0f64);
        for c in 0..cols {
            let xhat = ((x[c] - mean[r]) * rstd[r]).to_f64();
            let g = (dy[c] * weight[c]).to_f64();
            sg += g;
            sgx += g * xhat;
        }
        out[2 * r] = sg;
        out[2 * r + 1] = sgx;
    }
}

/// Backward step 2, with the whole rows' sums over `n` columns: `dinp +=` the input gradient,
/// `dweight`/`dbias +=` this block of rows' contributions.
pub fn layernorm_backward_apply_rows<R: Real>(
    dinp: &mut [R],
    (dweight, dbias): (&mut [R], &mut [R]),
    dout: &[R],
    LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, [R]>,
    (sums, n): (&[f64], usize),
    Matrix { rows, cols }: Matrix,
) {
    for r in 0..rows {
        let (x, dy) = (&inp[r * cols..(r + 1) * cols], &dout[r * cols..(r + 1) * cols]);
        let dx = &mut dinp[r * cols..(r + 1) * cols];
        let means = (R::from_f64(sums[2 * r] / n as f64), R::from_f64(sums[2 * r + 1] / n as f64));
        layernorm_backward_row(dx, (&mut *dweight, &mut *dbias), dy, (x, weight), (mean[r], rstd[r]), means);
    }
}

#[inline(always)]
pub fn gelu<R: Real>(x: R) -> R {
    let u = R::from_f64(GELU_SCALE) * (x + R::from_f64(GELU_CUBIC) * x * x * x);
    R::from_f64(0.5) * x * (R::ONE + u.tanh_fast())
}

#[inline(always)]
pub fn gelu_grad<R: Real>(x: R) -> R {
    let s = R::from_f64(GELU_SCALE);
    let c = R::from_f64(GELU_CUBIC);
    let u = s * (x + c * x * x * x);
    let t = u.tanh_fast();
    let half = R::from_f64(0.5);
    half * (R::ONE + t) + half * x * (R::ONE - t * t) * s * (R::ONE + R::from_f64(3.0) * c * x * x)
}

/// Which GELU: the tanh form (GPT-2's, Megatron's `--openai-gelu`) or the exact one,
/// `x·Φ(x) = x/2·(1 + erf(x/√2))` (megatron-core's and PyTorch's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gelu {
    #[default]
    Tanh,
    Erf,
}

const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// 1/√(2π), the standard normal density's factor.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The exact GELU, `x/2·(1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu_erf<R: Real>(x: R) -> R {
    R::from_f64(0.5) * x * (R::ONE + (x * R::from_f64(FRAC_1_SQRT_2)).erf_fast())
}

/// The exact GELU's derivative, `Φ(x) + x·φ(x)`.
#[inline(always)]
pub fn gelu_erf_grad<R: Real>(x: R) -> R {
    let cdf = R::from_f64(0.5) * (R::ONE + (x * R::from_f64(FRAC_1_SQRT_2)).erf_fast());
    cdf + x * R::from_f64(INV_SQRT_2PI) * (R::from_f64(-0.5) * x * x).exp_fast()
}

#[inline(always)]
pub fn gelu_forward_slice<R: Real>(out: &mut [R], inp: &[R], form: Gelu) {
    match form {
        Gelu::Tanh => out.iter_mut().zip(inp).for_each(|(y, &x)| *y = gelu(x)),
        Gelu::Erf => out.iter_mut().zip(inp).for_each(|(y, &x)| *y = gelu_erf(x)),
    }
}

#[inline(always)]
pub fn gelu_backward_slice<R: Real>(dinp: &mut [R], inp: &[R], dout: &[R], form: Gelu) {
    let pairs = dinp.iter_mut().zip(inp).zip(dout);
    match form {
        Gelu::Tanh => pairs.for_each(|((dx, &x), &dy)| *dx = dy * gelu_grad(x)),
        Gelu::Erf => pairs.for_each(|((dx, &x), &dy)| *dx = dy * gelu_erf_grad(x)),
    }
}

/// A dot product summed in 16 interleaved partial sums: the fixed grouping lets the compiler
/// use full vector registers while the result stays the same on every instruction set.
#[inline(always)]
pub fn dot<R: Real>(a: &[R], b: &[R]) -> R {
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [R::ZERO; LANES];
    let whole = n / LANES * LANES;
    for (ca, cb) in a[..whole].chunks_exact(LANES).zip(b[..whole].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut tail = R::ZERO;
    for i in whole..n {
        tail += a[i] * b[i];
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            let upper = acc[l + width];
            acc[l] += upper;
        }
    }
    acc[0] + tail
}

/// Offsets of the q vector of token row `row` and query head `head` inside the fused QKV
/// activation, and of its group's k and v vectors.
#[inline(always)]
fn qkv_offsets(shape: &AttentionShape, row: usize, head: usize) -> (usize, usize, usize) {
    let base = row * shape.qkv_width();
    let (q, k, v) = shape.qkv_offsets(head);
    (base + q, base + k, base + v)
}

/// Copies the q, k and v vectors of one (sequence, head) pair out of the fused QKV activation:
/// `q` and `v` as [seq, d] rows, and k both as rows and transposed ([d, seq]) so that scores for
/// one query against all keys are a sum of contiguous vector updates (no horizontal sums).
struct HeadQkv<R> {
    q: Vec<R>,
    k: Vec<R>,
    v: Vec<R>,
    kt: Vec<R>,
}

#[inline(always)]
fn gather_head<R: Real>(qkv: &[R], shape: &AttentionShape, b: usize, head: usize) -> HeadQkv<R> {
    let (s, d) = (shape.seq, shape.head_dim);
    let mut h =
        HeadQkv { q: vec![R::ZERO; s * d], k: vec![R::ZERO; s * d], v: vec![R::ZERO; s * d], kt: vec![R::ZERO; s * d] };
    for t in 0..s {
        let (q0, k0, v0) = qkv_offsets(shape, t * shape.batch + b, head);
        h.q[t * d..(t + 1) * d].copy_from_slice(&qkv[q0..q0 + d]);
        h.k[t * d..(t + 1) * d].copy_from_slice(&qkv[k0..k0 + d]);
        h.v[t * d..(t + 1) * d].copy_from_slice(&qkv[v0..v0 + d]);
        for i in 0..d {
            h.kt[i * s + t] = qkv[k0 + i];
        }
    }
    h
}

/// `y += alpha · x`.
#[inline(always)]
pub fn axpy<R: Real>(y: &mut [R], alpha: R, x: &[R]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// Query rows and key columns of one tile of the score matrix: a tile's scores stay in L1 and
/// each key (or value) row loaded is used for `QUERY_TILE` queries.
const QUERY_TILE: usize = 8;
const KEY_TILE: usize = 64;

/// `tile[r][c] = Σ_i a[(r0 + r) * d + i] · bt[i * stride + c0 + c]` for the tile's `rows` x
/// `cols` (`a` has rows of `d`, `bt` has `d` rows of `stride`): query-by-key products of a tile,
/// vectorised over keys.
#[inline(always)]
fn tile_products<R: Real>(
    tile: &mut [[R; KEY_TILE]; QUERY_TILE],
    (a, bt): (&[R], &[R]),
    (d, stride): (usize, usize),
    (r0, rows): (usize, usize),
    (c0, cols): (usize, usize),
) {
    for row in tile.iter_mut().take(rows) {
        row[..cols].fill(R::ZERO);
    }
    for i in 0..d {
        let b_row = &bt[i * stride + c0..i * stride + c0 + cols];
        for (r, row) in tile.iter_mut().enumerate().take(rows) {
            let av = a[(r0 + r) * d + i];
            for (t, &bv) in row[..cols].iter_mut().zip(b_row) {
                *t += av * bv;
            }
        }
    }
}

/// Causal attention for one (sequence, head) pair, FlashAttention-style: queries in tiles of
/// `QUERY_TILE`, keys in tiles of `KEY_TILE`, a running max and sum per query (online softmax),
/// so only the log-sum-exp is kept and no [seq, seq] matrix exists. `out` and `lse` are the whole
/// output arrays; this call writes only the columns of head `head` in the rows of sequence `b`,
/// and the lse entries of (b, head), so different pairs may run at once on disjoint memory.
/// With `dropout`, each probability is masked and scaled (`Dropout::attention_index`) where it
/// multiplies its value row; the sums, and so `lse`, are the unmasked ones. With `documents`,
/// query t sees the keys from `documents[b * seq + t]` (its document's start) on.
///
/// # Safety
/// `out` must point to `rows * heads * head_dim` elements and `lse` to `batch * heads * seq`, and
/// no other thread may touch the (b, head) part of either during the call.
#[inline(always)]
pub unsafe fn attention_forward_head<R: Real>(
    out: *mut R,
    lse: *mut R,
    qkv: &[R],
    shape: AttentionShape,
    (b, head): (usize, usize),
    (dropout, documents): (Option<&Dropout>, Option<&[u32]>),
) {
    let (s, d) = (shape.seq, shape.head_dim);
    let scale = R::from_f64(1.0 / (d as f64).sqrt());
    let h = gather_head(qkv, &shape, b, head);
    let mut masks = dropout.map(|dr| (Masks::new(dr), R::from_f64(dr.scale() as f64)));
    let mut tile = [[R::ZERO; KEY_TILE]; QUERY_TILE];
    let mut acc = vec![R::ZERO; QUERY_TILE * d];
    for q0 in (0..s).step_by(QUERY_TILE) {
        let qn = QUERY_TILE.min(s - q0);
        let mut max = [R::NEG_INFINITY; QUERY_TILE];
        let mut sum = [R::ZERO; QUERY_TILE];
        acc.fill(R::ZERO);
        let keys = q0 + qn;
        for k0 in (0..keys).step_by(KEY_TILE) {
            let kn = KEY_TILE.min(keys - k0);
            tile_products(&mut tile, (&h.q, &h.kt), (d, s), (q0, qn), (k0, kn));
            for (r, row) in tile.iter_mut().enumerate().take(qn) {
                let t = q0 + r;
                let first = document_start(documents, s, (b, t));
                if t < k0 || k0 + kn <= first {
                    continue;
                }
                // Keys k0 + lo .. of this tile are the row's.
                let lo = first.saturating_sub(k0);
                let row = &mut row[lo..kn.min(t + 1 - k0)];
                let mut m = max[r];
                for v in row.iter_mut() {
                    *v *= scale;
                    m = m.max(*v);
                }
                // Rescale what was accumulated under the old max.
                let correction = (max[r] - m).exp_fast();
                let mut z = R::ZERO;
                for v in row.iter_mut() {
                    *v = (*v - m).exp_fast();
                    z += *v;
                }
                sum[r] = sum[r] * correction + z;
                max[r] = m;
                let a = &mut acc[r * d..(r + 1) * d];
                for x in a.iter_mut() {
                    *x *= correction;
                }
                let k0 = k0 + lo;
                if let (Some((m, keep_scale)), Some(dr)) = (masks.as_mut(), dropout) {
                    let first = dr.attention_index(b, head, t) + k0 as u64;
                    for (j, &p) in row.iter().enumerate() {
                        if m.keeps(first + j as u64) {
                            axpy(a, p * *keep_scale, &h.v[(k0 + j) * d..(k0 + j + 1) * d]);
                        }
                    }
                    continue;
                }
                for (j, &p) in row.iter().enumerate() {
                    axpy(a, p, &h.v[(k0 + j) * d..(k0 + j + 1) * d]);
                }
            }
        }
        for r in 0..qn {
            let t = q0 + r;
            let inv = R::ONE / sum[r];
            // SAFETY: the caller guarantees these (b, head) elements are ours and in bounds.
            let o = std::slice::from_raw_parts_mut(out.add((t * shape.batch + b) * shape.width() + head * d), d);
            for (o, &x) in o.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                *o = x * inv;
            }
            *lse.add((b * shape.heads + head) * s + t) = max[r] + sum[r].ln();
        }
    }
}

/// The first key query `t` of sequence `b` sees: its document's start under `documents` (at
/// most `t`), else 0.
#[inline(always)]
pub fn document_start(documents: Option<&[u32]>, seq: usize, (b, t): (usize, usize)) -> usize {
    documents.map_or(0, |starts| (starts[b * seq + t] as usize).min(t))
}

/// Backward of `attention_forward_head` for one (sequence, head) pair: writes (overwrites) the
/// q gradient columns of that pair in `dqkv`, and the k and v gradient columns of its group (adds
/// to them for every head of the group but the first: callers run a group's heads in order),
/// rebuilding each tile of probabilities from the saved log-sum-exp instead of storing the
/// [seq, seq] matrix. With `dropout`, the forward's masks are drawn again: dv takes the masked
/// probabilities, and the probabilities' gradient is masked before the softmax's backward.
///
/// # Safety
/// `dqkv` must point to `rows * qkv_width` elements, and no other thread may touch the (b, head)
/// columns, or its group's k and v columns, during the call.
#[inline(always)]
pub unsafe fn attention_backward_head<R: Real>(
    dqkv: *mut R,
    dout: &[R],
    qkv: &[R],
    (out, lse): (&[R], &[R]),
    shape: AttentionShape,
    (b, head): (usize, usize),
    (dropout, documents): (Option<&Dropout>, Option<&[u32]>),
) {
    let (s, d, w) = (shape.seq, shape.head_dim, shape.width());
    let mut masks = dropout.map(|dr| (Masks::new(dr), R::from_f64(dr.scale() as f64)));
    let scale = R::from_f64(1.0 / (d as f64).sqrt());
    let h = gather_head(qkv, &shape, b, head);
    // dy as rows, and v transposed so that dy·v for a tile of keys is a sum of vector updates.
    let mut dy = vec![R::ZERO; s * d];
    let mut vt = vec![R::ZERO; s * d];
    let mut delta = vec![R::ZERO; s];
    for t in 0..s {
        let o_off = (t * shape.batch + b) * w + head * d;
        dy[t * d..(t + 1) * d].copy_from_slice(&dout[o_off..o_off + d]);
        delta[t] = dot(&dout[o_off..o_off + d], &out[o_off..o_off + d]);
        for i in 0..d {
            vt[i * s + t] = h.v[t * d + i];
        }
    }
    let (mut dq, mut dk, mut dv) = (vec![R::ZERO; s * d], vec![R::ZERO; s * d], vec![R::ZERO; s * d]);
    let mut p = [[R::ZERO; KEY_TILE]; QUERY_TILE];
    let mut ds = [[R::ZERO; KEY_TILE]; QUERY_TILE];
    let lse = &lse[(b * shape.heads + head) * s..(b * shape.heads + head + 1) * s];
    for q0 in (0..s).step_by(QUERY_TILE) {
        let qn = QUERY_TILE.min(s - q0);
        let keys = q0 + qn;
        for k0 in (0..keys).step_by(KEY_TILE) {
            let kn = KEY_TILE.min(keys - k0);
            tile_products(&mut p, (&h.q, &h.kt), (d, s), (q0, qn), (k0, kn));
            tile_products(&mut ds, (&dy, &vt), (d, s), (q0, qn), (k0, kn));
            for r in 0..qn {
                let t = q0 + r;
                let valid = if t < k0 { 0 } else { kn.min(t + 1 - k0) };
                let lo = document_start(documents, s, (b, t)).saturating_sub(k0).min(kn);
                let first = dropout.map_or(0, |dr| dr.attention_index(b, head, t) + k0 as u64);
                for j in 0..kn {
                    if (lo..valid).contains(&j) {
                        let pj = (p[r][j] * scale - lse[t]).exp_fast();
                        // Dropout: dv reads the masked probability, the softmax the unmasked one.
                        let (kept, dp) = match masks.as_mut() {
                            Some((m, keep)) => match m.keeps(first + j as u64) {
                                true => (pj * *keep, ds[r][j] * *keep),
                                false => (R::ZERO, R::ZERO),
                            },
                            None => (pj, ds[r][j]),
                        };
                        p[r][j] = kept;
                        ds[r][j] = pj * (dp - delta[t]) * scale;
                    } else {
                        p[r][j] = R::ZERO;
                        ds[r][j] = R::ZERO;
                    }
                }
                let dq_t = &mut dq[t * d..(t + 1) * d];
                for (j, &g) in ds[r][..valid].iter().enumerate() {
                    axpy(dq_t, g, &h.k[(k0 + j) * d..(k0 + j + 1) * d]);
                }
            }
            // Each key row gathers its gradient from the tile's queries.
            for j in 0..kn {
                let key = k0 + j;
                let (dk_j, dv_j) = (&mut dk[key * d..(key + 1) * d], &mut dv[key * d..(key + 1) * d]);
                for r in 0..qn {
                    let t = q0 + r;
                    if ds[r][j] != R::ZERO || p[r][j] != R::ZERO {
                        axpy(dk_j, ds[r][j], &h.q[t * d..(t + 1) * d]);
                        axpy(dv_j, p[r][j], &dy[t * d..(t + 1) * d]);
                    }
                }
            }
        }
    }
    let first_of_group = head.is_multiple_of(shape.group_size());
    for t in 0..s {
        let (q0, k0, v0) = qkv_offsets(&shape, t * shape.batch + b, head);
        // SAFETY: the q, k and v columns of (row t, head) lie inside dqkv and belong to this call.
        std::slice::from_raw_parts_mut(dqkv.add(q0), d).copy_from_slice(&dq[t * d..(t + 1) * d]);
        for (at, g) in [(k0, &dk), (v0, &dv)] {
            let dst = std::slice::from_raw_parts_mut(dqkv.add(at), d);
            if first_of_group {
                dst.copy_from_slice(&g[t * d..(t + 1) * d]);
            } else {
                dst.iter_mut().zip(&g[t * d..(t + 1) * d]).for_each(|(x, &y)| *x += y);
            }
        }
    }
}

/// Attention of the new query rows `t0..shape.seq` of one sequence (batch 1) and query head
/// `head` against the keys and values of rows `0..=t` (generation with a key/value cache): writes
/// the head's columns of `out`, whose row `i` is position `t0 + i`. The scores of a row are
/// exponentiated against their max and summed in key order.
#[inline(always)]
pub fn attention_decode_head<R: Real>(out: &mut [R], qkv: &[R], shape: AttentionShape, head: usize, t0: usize) {
    let (d, aw) = (shape.head_dim, shape.width());
    let scale = R::from_f64(1.0 / (d as f64).sqrt());
    let mut scores = vec![R::ZERO; shape.seq];
    for t in t0..shape.seq {
        let (q0, _, _) = qkv_offsets(&shape, t, head);
        let q = &qkv[q0..q0 + d];
        let mut max = R::NEG_INFINITY;
        for (u, s) in scores[..=t].iter_mut().enumerate() {
            let (_, k0, _) = qkv_offsets(&shape, u, head);
            *s = dot(q, &qkv[k0..k0 + d]) * scale;
            max = max.max(*s);
        }
        let mut z = R::ZERO;
        for s in scores[..=t].iter_mut() {
            *s = (*s - max).exp();
            z += *s;
        }
        let o = &mut out[(t - t0) * aw + head * d..][..d];
        o.fill(R::ZERO);
        for (u, &p) in scores[..=t].iter().enumerate() {
            let (_, _, v0) = qkv_offsets(&shape, u, head);
            axpy(o, p / z, &qkv[v0..v0 + d]);
        }
    }
}

/// The largest logit of a row (the first all-reduce of the vocab-parallel cross-entropy).
#[inline(always)]
pub fn row_max<R: Real>(row: &[R]) -> R {
    let mut acc = [R::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] = acc[l].max(c[l]);
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        acc[l] = acc[l].max(x);
    }
    acc.iter().fold(R::NEG_INFINITY, |m, &x| m.max(x))
}

/// Width of the partial-sum arrays of the row reductions: sixteen independent accumulators let a
/// loop run in vector registers, and since the width is fixed (not the machine's), the summation
/// order, and so every bit of the result, is the same at every instruction-set level.
const LANES: usize = 16;

/// `Σ f(x)` over a slice, where `f` may also rewrite the element: element i goes to partial sum
/// `i % LANES`, and the partial sums are combined pairwise at the end.
#[inline(always)]
fn lane_sum<R: Real>(xs: &mut [R], mut f: impl FnMut(&mut R) -> R) -> R {
    let mut acc = [R::ZERO; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += f(&mut c[l]);
        }
    }
    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
        acc[l] += f(x);
    }
    combine_lanes(acc)
}

/// `Σ f(x)` over a read-only slice, in the lane order of `lane_sum`.
#[inline(always)]
pub(super) fn lane_sum_of<R: Real>(xs: &[R], f: impl Fn(R) -> R) -> R {
    let mut acc = [R::ZERO; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] += f(c[l]);
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        acc[l] += f(x);
    }
    combine_lanes(acc)
}

/// The partial sums of `lane_sum`, combined pairwise. The partial sums pass through
/// `black_box` first: where LLVM sees the pairwise tree next to the loop that fills them, it
/// vectorizes that loop in 128-bit pairs matching the tree (no 256-bit vector at all in the
/// AVX2 builds of `sum_squares_lanes` and `dot_lanes`); the barrier costs one spill per call
/// and changes no value.
#[inline(always)]
fn combine_lanes<R: Real>(acc: [R; LANES]) -> R {
    let mut acc = std::hint::black_box(acc);
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Chunks of `sum_squares_lanes` its prefetch runs ahead (4 KiB).
const SUM_SQUARES_AHEAD: usize = 64;

/// `Σ x²` of f32 values, in f64 (each square is exact there), in the lane order of `lane_sum`:
/// one block's share of the gradient norm. Independent lanes let every level vectorize it; one
/// running sum would wait on each add's latency. It reads one stream and does little with it, so
/// on x86-64 it prefetches `SUM_SQUARES_AHEAD` chunks (cache lines) ahead: 11-16 GB/s without,
/// 18-20 with, over 480 MB on 2 threads of an Intel Xeon capped to AVX2, where AdamW's seven
/// streams reach about 40.
#[inline(always)]
pub fn sum_squares_lanes(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for (i, c) in (&mut chunks).enumerate() {
        #[cfg(target_arch = "x86_64")]
        if let Some(ahead) = xs.get((i + SUM_SQUARES_AHEAD) * LANES) {
            // SAFETY: a prefetch never faults; SSE is part of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((ahead as *const f32).cast())
            };
        }
        for l in 0..LANES {
            acc[l] += c[l] as f64 * c[l] as f64;
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        acc[l] += x as f64 * x as f64;
    }
    combine_lanes(acc)
}

/// Dot product in the fixed lane order of `lane_sum`.
#[inline(always)]
pub fn dot_lanes<R: Real>(a: &[R], b: &[R]) -> R {
    let mut acc = [R::ZERO; LANES];
    let n = a.len().min(b.len());
    let (mut ca, mut cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (&x, &y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
    combine_lanes(acc)
}

/// One query's row of causal attention scores, in place: `row[..n]` holds the raw products q·k of
/// the keys the query may see and becomes softmax(scale · q·k); `row[n..]` (masked keys) becomes 0.
/// Returns the log-sum-exp of the scaled scores, which the backward pass rebuilds the row from.
#[inline(always)]
pub fn attention_softmax_row<R: Real>(row: &mut [R], n: usize, scale: R) -> R {
    // The scale is positive, so the largest scaled score is the scaled largest score, exactly.
    let max = row_max(&row[..n]) * scale;
    let sum = lane_sum(&mut row[..n], |x| {
        let e = (*x * scale - max).exp_fast();
        *x = e;
        e
    });
    let inv = R::ONE / sum;
    for x in row[..n].iter_mut() {
        *x *= inv;
    }
    row[n..].fill(R::ZERO);
    max + sum.ln()
}

/// One query's rows of the attention backward, in place: `p[..n]` holds the raw scores q·k and
/// becomes the probabilities exp(scale · q·k - lse); `ds[..n]` holds dy·v and becomes the score
/// gradient p · (dy·v - delta) · scale, where delta = dy·y; masked entries become 0.
#[inline(always)]
pub fn attention_backward_row<R: Real>(p: &mut [R], ds: &mut [R], n: usize, scale: R, lse: R, delta: R) {
    for (pj, dj) in p[..n].iter_mut().zip(ds[..n].iter_mut()) {
        let e = (*pj * scale - lse).exp_fast();
        *pj = e;
        *dj = e * (*dj - delta) * scale;
    }
    p[n..].fill(R::ZERO);
    ds[n..].fill(R::ZERO);
}

/// The cross-entropy target of a token the loss leaves out (Megatron's loss mask under
/// `--eod-mask-loss`; PyTorch's `ignore_index`): its row adds nothing to the loss and its logits'
/// gradient is 0. Every Device and kernel agrees (`kIgnoredTarget` in kernels/common/portable.h).
pub const IGNORED_TARGET: u32 = u32::MAX;

/// The summed cross-entropy loss of `max.len()` rows from their global statistics: `stats` holds
/// each row's sum of exponentials, then each row's target logit. Rows are added in order, those
/// whose target is `IGNORED_TARGET` left out.
pub fn cross_entropy_loss_sum(max: &[f64], stats: &[f64], targets: &[u32]) -> f64 {
    let rows = max.len();
    let (sum_exp, target_logit) = stats[..2 * rows].split_at(rows);
    (0..rows).filter(|&i| targets[i] != IGNORED_TARGET).map(|i| sum_exp[i].ln() + max[i] - target_logit[i]).sum()
}

/// The gradient scale of a row with target `target`: 0 for an ignored one.
#[inline(always)]
pub fn row_grad_scale(target: u32, scale: f32) -> f32 {
    if target == IGNORED_TARGET {
        0.0
    } else {
        scale
    }
}

/// This shard's part of a row's softmax denominator, `Σ exp(x - max)` against the global max, and
/// the target's logit if the target falls in this shard (else 0): the second and third
/// all-reduces of the vocab-parallel cross-entropy sum these over the shards.
#[inline(always)]
pub fn cross_entropy_partials_row<R: Real>(row: &[R], target: Option<usize>, max: R) -> (R, R) {
    (lane_sum_of(row, |x| (x - max).exp_fast()), target.map_or(R::ZERO, |t| row[t]))
}

/// The row's logits become `scale * (softmax - onehot)`, from the global max and denominator.
#[inline(always)]
pub fn cross_entropy_backward_row<R: Real>(row: &mut [R], target: Option<usize>, max: R, sum_exp: R, scale: R) {
    let inv = scale / sum_exp;
    for x in row.iter_mut() {
        *x = (*x - max).exp_fast() * inv;
    }
    if let Some(t) = target {
        row[t] -= scale;
    }
}

/// A token's row in a vocabulary shard that starts at `vocab_start` and holds `vocab_rows` rows.
#[inline(always)]
pub fn local_row(token: u32, vocab_start: usize, vocab_rows: usize) -> Option<usize> {
    (token as usize).checked_sub(vocab_start).filter(|&r| r < vocab_rows)
}

/// The gradient norm and AdamW's gradient factor from the gradients' global sum of squares, as
/// every device computes them (`adamw.cu`'s `clip_scale_f64` line for line): the norm of the
/// unscaled gradients `sqrt(sum) / loss_scale`, and Megatron's clip coefficient
/// `clip / (norm + 1e-6)` when that is below 1 (else 1; a `clip` of 0 disables clipping), in f32,
/// over the loss scale in f32.
pub fn clip_scale(sum_squares: f64, clip: f64, loss_scale: f64) -> (f64, f32) {
    let norm = sum_squares.sqrt() / loss_scale;
    let mut coef = 1.0f32;
    if clip > 0.0 {
        let c = clip / (norm + 1e-6);
        if c < 1.0 {
            coef = c as f32;
        }
    }
    (norm, coef / loss_scale as f32)
}

/// AdamW with decoupled weight decay, as Megatron's fused Adam applies it:
/// `p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)`.
#[inline(always)]
pub fn adamw_slice<R: Real>(param: &mut [R], grad: &[R], m: &mut [R], v: &mut [R], s: &AdamWStep, grad_scale: f32) {
    let b1 = R::from_f32(s.beta1);
    let b2 = R::from_f32(s.beta2);
    let c1 = R::ONE / R::from_f64(1.0 - (s.beta1 as f64).powi(s.step as i32));
    let c2 = R::ONE / R::from_f64(1.0 - (s.beta2 as f64).powi(s.step as i32));
    let (lr, eps, wd, gs) =
        (R::from_f32(s.lr), R::from_f32(s.eps), R::from_f32(s.weight_decay), R::from_f32(grad_scale));
    for i in 0..param.len() {
        let g = grad[i] * gs;
        m[i] = b1 * m[i] + (R::ONE - b1) * g;
        v[i] = b2 * v[i] + (R::ONE - b2) * g * g;
        let update = (m[i] * c1) / ((v[i] * c2).sqrt() + eps) + wd * param[i];
        param[i] -= lr * update;
    }
}

/// Word-embedding lookup for the rows of positions `t0..` (sequence-first rows `t * batch + b`),
/// against a vocabulary shard starting at `vocab_start`: tokens outside it give zero rows, which
/// the tensor-parallel all-reduce fills in from the shard that holds them.
#[inline(always)]
pub fn embedding_forward_rows<R: Real>(out: &mut [R], wte: &[R], tokens: Tokens<'_>, hidden: usize, t0: usize) {
    let vocab_rows = wte.len() / hidden;
    embedding_rows_with(out, tokens, vocab_rows, (hidden, t0), |row, r| {
        row.copy_from_slice(&wte[r * hidden..(r + 1) * hidden])
    });
}

/// `embedding_forward_rows` with the table's row `r` written into an output row by `copy_row`
/// (a table in another storage, the CPU's bf16 working copy, widens it); `vocab_rows` rows.
#[inline(always)]
pub fn embedding_rows_with<R: Real>(
    out: &mut [R],
    Tokens { ids, batch, seq, vocab_start }: Tokens<'_>,
    vocab_rows: usize,
    (hidden, t0): (usize, usize),
    copy_row: impl Fn(&mut [R], usize),
) {
    for (i, row) in out.chunks_exact_mut(hidden).enumerate() {
        let t = t0 + i / batch;
        let b = i % batch;
        match local_row(ids[b * seq + t], vocab_start, vocab_rows) {
            Some(r) => copy_row(row, r),
            None => row.fill(R::ZERO),
        }
    }
}

/// Adds the position embedding to rows that hold positions `t0..` (row `i` is position
/// `t0 + i / batch`).
#[inline(always)]
pub fn position_forward_rows<R: Real>(out: &mut [R], wpe: &[R], batch: usize, hidden: usize, t0: usize) {
    for (i, row) in out.chunks_exact_mut(hidden).enumerate() {
        let t = t0 + i / batch;
        for (o, &p) in row.iter_mut().zip(&wpe[t * hidden..(t + 1) * hidden]) {
            *o += p;
        }
    }
}

/// Word-embedding backward restricted to the hidden columns `cols`, so that column blocks run
/// in parallel while every element is still summed in token order (deterministic); `dwte` has
/// `vocab_rows` rows of `hidden`.
///
/// # Safety
/// `dwte` must point to the shard's full gradient, and no other thread may touch its columns
/// `cols` during the call.
#[inline(always)]
pub unsafe fn embedding_backward_cols<R: Real>(
    (dwte, vocab_rows): (*mut R, usize),
    dout: &[R],
    Tokens { ids, batch, seq, vocab_start }: Tokens<'_>,
    hidden: usize,
    Range { start: c0, end: c1 }: Range<usize>,
) {
    for t in 0..seq {
        for b in 0..batch {
            let Some(r) = local_row(ids[b * seq + t], vocab_start, vocab_rows) else { continue };
            let g = &dout[(t * batch + b) * hidden + c0..(t * batch + b) * hidden + c1];
            // SAFETY: columns c0..c1 of row r are inside the gradient and owned by this call.
            let d = std::slice::from_raw_parts_mut(dwte.add(r * hidden + c0), c1 - c0);
            for (d, &x) in d.iter_mut().zip(g) {
                *d += x;
            }
        }
    }
}

/// Position-embedding backward for the rows of `positions` (`batch` rows each), columns `cols`.
///
/// # Safety
/// `dwpe` must point to the full gradient, and no other thread may touch its columns `cols`.
#[inline(always)]
pub unsafe fn position_backward_cols<R: Real>(
    dwpe: *mut R,
    dout: &[R],
    batch: usize,
    Range { start: t0, end: t_end }: Range<usize>,
    hidden: usize,
    Range { start: c0, end: c1 }: Range<usize>,
) {
    for i in 0..(t_end - t0) * batch {
        let t = t0 + i / batch;
        let g = &dout[i * hidden + c0..i * hidden + c1];
        // SAFETY: columns c0..c1 of row t are inside the gradient and owned by this call.
        let d = std::slice::from_raw_parts_mut(dwpe.add(t * hidden + c0), c1 - c0);
        for (d, &x) in d.iter_mut().zip(g) {
            *d += x;
        }
    }
}

/// `out[j] += Σ_r src[r * stride + j]` for `r < rows`, each column summed in row order: the bias
/// gradient's columns `c0..c0 + out.len()` (with `src` starting at column `c0`).
#[inline(always)]
pub fn add_column_sums<R: Real>(out: &mut [R], src: &[R], rows: usize, stride: usize) {
    for r in 0..rows {
        for (o, &g) in out.iter_mut().zip(&src[r * stride..]) {
            *o += g;
        }
    }
}

/// `out[r] += bias` for every row.
#[inline(always)]
pub fn add_bias_rows<R: Real>(out: &mut [R], bias: &[R]) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}
