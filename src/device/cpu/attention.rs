//! Causal attention on the CPU backend with the packed GEMM doing the arithmetic: for each
//! (sequence, head) and each tile of `QUERY_TILE` queries, the scores against the keys up to the
//! tile's last query are one GEMM, the softmax runs over those rows, and the output is a second
//! GEMM; backward rebuilds the probabilities from the saved log-sum-exp and needs five GEMMs per
//! tile. Only a [tile, seq] block of scores ever exists (never [seq, seq]). The generic kernel in
//! `device::kernels` computes the same thing and is the oracle these are tested against.

use super::gemm::{gemm, MatRef};
use super::pool::ThreadPool;
use crate::device::AttentionShape;
use crate::real::Real;

const QUERY_TILE: usize = 64;

/// Where the q, k or v vectors of (sequence b, head) start in the fused QKV activation, and the
/// stride between consecutive positions.
fn qkv_view<'a>(
    qkv: &'a [f32],
    shape: &AttentionShape,
    b: usize,
    head: usize,
    part: usize,
    first_row: usize,
) -> MatRef<'a> {
    let d = shape.head_dim;
    let row_stride = shape.batch * 3 * shape.width();
    let start = (first_row * shape.batch + b) * 3 * shape.width() + head * 3 * d + part * d;
    MatRef { data: &qkv[start..], row_stride, col_stride: 1 }
}

/// The same positions' keys as a transposed view (element (i, j) is key j's component i).
fn transposed(view: MatRef<'_>) -> MatRef<'_> {
    MatRef { data: view.data, row_stride: view.col_stride, col_stride: view.row_stride }
}

/// Forward for one (sequence, head) pair; returns its output rows [seq, d] and log-sum-exps.
pub fn forward_head(
    pool: &ThreadPool,
    qkv: &[f32],
    shape: AttentionShape,
    b: usize,
    head: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (s, d) = (shape.seq, shape.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; s * d];
    let mut lse = vec![0f32; s];
    let mut scores = vec![0f32; QUERY_TILE * s];
    let keys = qkv_view(qkv, &shape, b, head, 1, 0);
    let values = qkv_view(qkv, &shape, b, head, 2, 0);
    for q0 in (0..s).step_by(QUERY_TILE) {
        let qn = QUERY_TILE.min(s - q0);
        let kend = q0 + qn;
        let sc = &mut scores[..qn * kend];
        gemm(pool, qn, kend, d, qkv_view(qkv, &shape, b, head, 0, q0), transposed(keys), sc, kend, false);
        for r in 0..qn {
            let t = q0 + r;
            let row = &mut sc[r * kend..(r + 1) * kend];
            let mut max = f32::NEG_INFINITY;
            for v in row[..=t].iter_mut() {
                *v *= scale;
                max = max.max(*v);
            }
            let mut sum = 0f32;
            for v in row[..=t].iter_mut() {
                *v = (*v - max).exp_fast();
                sum += *v;
            }
            let inv = 1.0 / sum;
            for v in row[..=t].iter_mut() {
                *v *= inv;
            }
            row[t + 1..].fill(0.0);
            lse[t] = max + sum.ln();
        }
        gemm(
            pool,
            qn,
            d,
            kend,
            MatRef { data: sc, row_stride: kend, col_stride: 1 },
            values,
            &mut out[q0 * d..],
            d,
            false,
        );
    }
    (out, lse)
}

/// Backward for one (sequence, head) pair; returns dq, dk, dv as [seq, d] rows each.
#[allow(clippy::too_many_arguments)]
pub fn backward_head(
    pool: &ThreadPool,
    dout: &[f32],
    qkv: &[f32],
    out: &[f32],
    lse: &[f32],
    shape: AttentionShape,
    b: usize,
    head: usize,
) -> [Vec<f32>; 3] {
    let (s, d, w) = (shape.seq, shape.head_dim, shape.width());
    let scale = 1.0 / (d as f32).sqrt();
    let (mut dq, mut dk, mut dv) = (vec![0f32; s * d], vec![0f32; s * d], vec![0f32; s * d]);
    let (mut p, mut ds) = (vec![0f32; QUERY_TILE * s], vec![0f32; QUERY_TILE * s]);
    let keys = qkv_view(qkv, &shape, b, head, 1, 0);
    let values = qkv_view(qkv, &shape, b, head, 2, 0);
    let dy_view = |first: usize| MatRef {
        data: &dout[(first * shape.batch + b) * w + head * d..],
        row_stride: shape.batch * w,
        col_stride: 1,
    };
    let lse = &lse[(b * shape.heads + head) * s..(b * shape.heads + head + 1) * s];
    for q0 in (0..s).step_by(QUERY_TILE) {
        let qn = QUERY_TILE.min(s - q0);
        let kend = q0 + qn;
        let (pt, dst) = (&mut p[..qn * kend], &mut ds[..qn * kend]);
        let queries = qkv_view(qkv, &shape, b, head, 0, q0);
        gemm(pool, qn, kend, d, queries, transposed(keys), pt, kend, false);
        gemm(pool, qn, kend, d, dy_view(q0), transposed(values), dst, kend, false);
        for r in 0..qn {
            let t = q0 + r;
            let o = (t * shape.batch + b) * w + head * d;
            let delta: f32 = dout[o..o + d].iter().zip(&out[o..o + d]).map(|(a, c)| a * c).sum();
            let (prow, dsrow) = (&mut pt[r * kend..(r + 1) * kend], &mut dst[r * kend..(r + 1) * kend]);
            for j in 0..=t {
                let pj = (prow[j] * scale - lse[t]).exp_fast();
                prow[j] = pj;
                dsrow[j] = pj * (dsrow[j] - delta) * scale;
            }
            prow[t + 1..].fill(0.0);
            dsrow[t + 1..].fill(0.0);
        }
        let ds_view = MatRef { data: dst, row_stride: kend, col_stride: 1 };
        let p_view = MatRef { data: pt, row_stride: kend, col_stride: 1 };
        // dq = dS K, dk += dS^T Q, dv += P^T dY.
        gemm(pool, qn, d, kend, ds_view, keys, &mut dq[q0 * d..], d, false);
        gemm(pool, kend, d, qn, transposed(ds_view), queries, &mut dk, d, true);
        gemm(pool, kend, d, qn, transposed(p_view), dy_view(q0), &mut dv, d, true);
    }
    [dq, dk, dv]
}
