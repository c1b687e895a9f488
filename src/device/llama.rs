//! The math of the Llama-family ops (RMSNorm, SwiGLU, rotary position embedding), written once
//! over `Real` and over a slice of rows, as `kernels` is for GPT-2's: the reference device runs
//! it serially in f64, the CPU device in parallel in f32.

use super::kernels::lane_sum_of;
use super::{AttentionShape, Rotary};
use crate::real::Real;

/// RMSNorm of the rows in `inp` (a whole number of rows of width `cols`): `y = x · rstd · w`.
#[inline(always)]
pub fn rmsnorm_forward_rows<R: Real>(out: &mut [R], rstd: &mut [R], inp: &[R], weight: &[R], cols: usize, eps: f64) {
    let (eps, n) = (R::from_f64(eps), R::from_f64(cols as f64));
    for (r, (x, y)) in inp.chunks_exact(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
        let rs = R::ONE / (lane_sum_of(x, |v| v * v) / n + eps).sqrt();
        for c in 0..cols {
            y[c] = x[c] * rs * weight[c];
        }
        rstd[r] = rs;
    }
}

/// RMSNorm backward for a block of rows: with `x̂ = x · rstd` and `g = dy · w`,
/// `dinp += rstd · (g - x̂ · mean(g · x̂))` and `dweight += Σ_rows dy · x̂`.
#[inline(always)]
pub fn rmsnorm_backward_rows<R: Real>(
    dinp: &mut [R],
    dweight: &mut [R],
    dout: &[R],
    (inp, weight): (&[R], &[R]),
    rstd: &[R],
    cols: usize,
) {
    let n = R::from_f64(cols as f64);
    for (r, ((dx, dy), x)) in
        dinp.chunks_exact_mut(cols).zip(dout.chunks_exact(cols)).zip(inp.chunks_exact(cols)).enumerate()
    {
        let rs = rstd[r];
        let mut gx = vec![R::ZERO; cols];
        for c in 0..cols {
            gx[c] = dy[c] * weight[c] * (x[c] * rs);
        }
        let mean_gx = lane_sum_of(&gx, |v| v) / n;
        for c in 0..cols {
            let xh = x[c] * rs;
            dx[c] += rs * (dy[c] * weight[c] - xh * mean_gx);
            dweight[c] += dy[c] * xh;
        }
    }
}

/// `silu(a) = a · sigmoid(a)` and its derivative `sigmoid(a) · (1 + a · (1 - sigmoid(a)))`.
#[inline(always)]
fn silu_and_grad<R: Real>(a: R) -> (R, R) {
    let sig = R::ONE / (R::ONE + (-a).exp());
    (a * sig, sig * (R::ONE + a * (R::ONE - sig)))
}

/// SwiGLU of rows of `2 f` (gate, then up) into rows of `f`.
#[inline(always)]
pub fn swiglu_forward_rows<R: Real>(out: &mut [R], inp: &[R], f: usize) {
    for (y, x) in out.chunks_exact_mut(f).zip(inp.chunks_exact(2 * f)) {
        let (gate, up) = x.split_at(f);
        for i in 0..f {
            y[i] = silu_and_grad(gate[i]).0 * up[i];
        }
    }
}

/// SwiGLU backward for a block of rows: the gate's and up projection's gradients (overwrite).
#[inline(always)]
pub fn swiglu_backward_rows<R: Real>(dinp: &mut [R], inp: &[R], dout: &[R], f: usize) {
    for ((dx, x), dy) in dinp.chunks_exact_mut(2 * f).zip(inp.chunks_exact(2 * f)).zip(dout.chunks_exact(f)) {
        let (gate, up) = x.split_at(f);
        let (dgate, dup) = dx.split_at_mut(f);
        for i in 0..f {
            let (s, ds) = silu_and_grad(gate[i]);
            dgate[i] = dy[i] * up[i] * ds;
            dup[i] = dy[i] * s;
        }
    }
}

/// Rotates (or, `inverse`, rotates back) the query and key heads of the QKV rows `first_row..`
/// (`qkv` holds those rows only) by their positions' angles in `table`.
#[inline(always)]
pub fn rope_rows<R: Real>(
    qkv: &mut [R],
    first_row: usize,
    table: &[R],
    shape: &AttentionShape,
    rotary: Rotary,
    inverse: bool,
) {
    let (rd, w) = (rotary.rotary_dim, shape.qkv_width());
    let half = rd / 2;
    let (n, d) = (shape.group_size(), shape.head_dim);
    for (i, row) in qkv.chunks_exact_mut(w).enumerate() {
        let pos = rotary.t0 + (first_row + i) / shape.batch;
        let (cos, sin) = table[pos * rd..(pos + 1) * rd].split_at(half);
        for g in 0..shape.kv_heads {
            // The group's n query heads and its key head are contiguous; its value head follows.
            for head in 0..=n {
                let v = &mut row[(g * (n + 2) + head) * d..][..rd];
                let (x1, x2) = v.split_at_mut(half);
                for j in 0..half {
                    let (a, b, c) = (x1[j], x2[j], cos[j]);
                    let s = if inverse { -sin[j] } else { sin[j] };
                    x1[j] = a * c - b * s;
                    x2[j] = b * c + a * s;
                }
            }
        }
    }
}
