//! Causal attention on the CPU backend with the packed GEMM doing the arithmetic: for each
//! (sequence, head) and each tile of `QUERY_TILE` queries, the scores against the keys up to the
//! tile's last query are one GEMM, the softmax runs over those rows, and the output is a second
//! GEMM; backward rebuilds the probabilities from the saved log-sum-exp and needs five GEMMs per
//! tile. Only a [tile, seq] block of scores ever exists (never [seq, seq]). The generic kernel in
//! `device::kernels` computes the same thing and is the oracle these are tested against.

use super::gemm::{gemm, MatRef};
use super::pool::ThreadPool;
use super::simd;
use crate::device::dropout::{apply_kept, Dropout, Masks};
use crate::device::kernels::document_start;
use crate::device::AttentionShape;

const QUERY_TILE: usize = 128;

/// Bytes of scratch the kernels hold while `threads` (sequence, head) pairs run at once: per pair,
/// two [tile, seq] score blocks (backward) and the pair's dq, dk and dv rows. An s x s score
/// matrix per pair would be `4 * seq * seq` bytes.
pub fn scratch_bytes(shape: &AttentionShape, threads: usize) -> usize {
    let (s, d) = (shape.seq, shape.head_dim);
    let forward = QUERY_TILE.min(s) * s + s * d + s;
    let backward = 2 * QUERY_TILE.min(s) * s + 3 * s * d;
    4 * forward.max(backward) * threads.min(shape.batch * shape.heads)
}

/// Where the q vectors of (sequence b, query head `head`), or (`part` 1, 2) its group's k or v
/// vectors, start in the fused QKV activation, and the stride between consecutive positions.
fn qkv_view<'a>(
    qkv: &'a [f32],
    shape: &AttentionShape,
    b: usize,
    head: usize,
    part: usize,
    first_row: usize,
) -> MatRef<'a> {
    let row_stride = shape.batch * shape.qkv_width();
    let (q, k, v) = shape.qkv_offsets(head);
    let start = (first_row * shape.batch + b) * shape.qkv_width() + [q, k, v][part];
    MatRef { data: &qkv[start..], row_stride, col_stride: 1 }
}

/// The same positions' keys as a transposed view (element (i, j) is key j's component i).
fn transposed(view: MatRef<'_>) -> MatRef<'_> {
    MatRef { data: view.data, row_stride: view.col_stride, col_stride: view.row_stride }
}

/// Forward for one (sequence, head) pair; returns its output rows [seq, d] and log-sum-exps.
/// With `dropout`, each row of probabilities is masked and scaled after its softmax; with
/// `documents`, a row's keys before its document's start get probability 0.
pub fn forward_head(
    pool: &ThreadPool,
    qkv: &[f32],
    shape: AttentionShape,
    (b, head): (usize, usize),
    (dropout, documents): (Option<&Dropout>, Option<&[u32]>),
) -> (Vec<f32>, Vec<f32>) {
    let (s, d) = (shape.seq, shape.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; s * d];
    let mut lse = vec![0f32; s];
    let mut scores = vec![0f32; QUERY_TILE.min(s) * s];
    let keys = qkv_view(qkv, &shape, b, head, 1, 0);
    let values = qkv_view(qkv, &shape, b, head, 2, 0);
    for q0 in (0..s).step_by(QUERY_TILE) {
        let qn = QUERY_TILE.min(s - q0);
        let kend = q0 + qn;
        let sc = &mut scores[..qn * kend];
        gemm(pool, qn, kend, d, qkv_view(qkv, &shape, b, head, 0, q0), transposed(keys), sc, kend, false);
        for r in 0..qn {
            let t = q0 + r;
            let (row, first) = (&mut sc[r * kend..(r + 1) * kend], document_start(documents, shape.seq, (b, t)));
            row[..first].fill(0.0);
            // SAFETY: the row kernel has no preconditions beyond its slice bounds.
            lse[t] = unsafe { simd::attention_softmax_row(&mut row[first..], t + 1 - first, scale) };
            if let Some(dr) = dropout {
                Masks::new(dr).apply(&mut sc[r * kend..r * kend + t + 1], dr.attention_index(b, head, t), dr.scale());
            }
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

/// Backward for one (sequence, head) pair; returns dq, dk, dv as [seq, d] rows each. With
/// `dropout`, the probabilities' gradient is masked before the softmax's backward and the
/// probabilities after it (dv reads the masked ones); with `documents`, the keys before a row's
/// document start have probability and gradient 0.
#[allow(clippy::too_many_arguments)]
pub fn backward_head(
    pool: &ThreadPool,
    dout: &[f32],
    qkv: &[f32],
    (out, lse): (&[f32], &[f32]),
    shape: AttentionShape,
    (b, head): (usize, usize),
    (dropout, documents): (Option<&Dropout>, Option<&[u32]>),
) -> [Vec<f32>; 3] {
    let (s, d, w) = (shape.seq, shape.head_dim, shape.width());
    let scale = 1.0 / (d as f32).sqrt();
    let (mut dq, mut dk, mut dv) = (vec![0f32; s * d], vec![0f32; s * d], vec![0f32; s * d]);
    let (mut p, mut ds) = (vec![0f32; QUERY_TILE.min(s) * s], vec![0f32; QUERY_TILE.min(s) * s]);
    let keys = qkv_view(qkv, &shape, b, head, 1, 0);
    let values = qkv_view(qkv, &shape, b, head, 2, 0);
    let dy_view = |first: usize| MatRef {
        data: &dout[(first * shape.batch + b) * w + head * d..],
        row_stride: shape.batch * w,
        col_stride: 1,
    };
    let lse = &lse[(b * shape.heads + head) * s..(b * shape.heads + head + 1) * s];
    let mut keep = vec![false; if dropout.is_some() { s } else { 0 }];
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
            // SAFETY: the row kernels have no preconditions beyond their slice bounds.
            unsafe {
                let delta = simd::dot_lanes(&dout[o..o + d], &out[o..o + d]);
                let (prow, dsrow) = (&mut pt[r * kend..(r + 1) * kend], &mut dst[r * kend..(r + 1) * kend]);
                // The row's mask, drawn once for both of its uses.
                if let Some(dr) = dropout {
                    Masks::new(dr).fill(&mut keep[..t + 1], dr.attention_index(b, head, t));
                    apply_kept(&mut dsrow[..t + 1], &keep[..t + 1], dr.scale());
                }
                let first = document_start(documents, shape.seq, (b, t));
                simd::attention_backward_row(
                    &mut prow[first..],
                    &mut dsrow[first..],
                    t + 1 - first,
                    scale,
                    lse[t],
                    delta,
                );
                prow[..first].fill(0.0);
                dsrow[..first].fill(0.0);
                if let Some(dr) = dropout {
                    apply_kept(&mut prow[..t + 1], &keep[..t + 1], dr.scale());
                }
            }
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
