//! Blockwise causal attention, the math of context parallelism's `all_gather` and `p2p` types:
//! the queries of one run of positions against the keys and values of another, every key (a
//! block wholly before the queries) or key j ≤ query j (the diagonal block), each block's output
//! normalized with its own log-sum-exp; blocks of disjoint keys merged by their log-sum-exps
//! (the result is the attention over the union); and a block's backward from the whole
//! attention's output and log-sum-exp, adding to the query and the key/value gradients. Generic
//! over `Real`: the reference device runs it in f64, the CPU in f32 (GPU kernels are not built).

use super::dropout::Masks;
use super::ops::{AttentionShape, BlockMask, QkvRun};
use crate::real::Real;

/// `out` ([q.len · batch, heads · head_dim]) and `lse` ([batch, heads, q.len]) become the block
/// of the queries at `q` of `q_src` against the keys and values at `kv` of `kv_src`.
pub fn block_forward<R: Real>(
    (out, lse): (&mut [R], &mut [R]),
    (q_src, q): (&[R], QkvRun),
    (kv_src, kv): (&[R], QkvRun),
    shape: AttentionShape,
    mask: BlockMask,
) {
    let (bt, d, qw, aw) = (shape.batch, shape.head_dim, shape.qkv_width(), shape.width());
    assert!(!mask.diagonal || q.len == kv.len, "a diagonal block is square");
    let mut masks = mask.dropout.map(|(dr, _, _)| Masks::new(dr));
    assert!(q_src.len() >= q.end(bt, qw) && kv_src.len() >= kv.end(bt, qw));
    assert!(out.len() >= q.len * bt * aw && lse.len() >= bt * shape.heads * q.len);
    let scale = R::from_f64(1.0 / (d as f64).sqrt());
    let mut scores = vec![R::ZERO; kv.len];
    for b in 0..bt {
        for head in 0..shape.heads {
            let (qo, ko, vo) = shape.qkv_offsets(head);
            for t in 0..q.len {
                let qv = &q_src[q.at(t, b, bt, qw) + qo..][..d];
                let n = mask.keys(t, kv.len);
                let mut max = R::NEG_INFINITY;
                for (j, s) in scores[..n].iter_mut().enumerate() {
                    *s = super::kernels::dot(qv, &kv_src[kv.at(j, b, bt, qw) + ko..][..d]) * scale;
                    max = max.max(*s);
                }
                let o = &mut out[(t * bt + b) * aw + head * d..][..d];
                o.fill(R::ZERO);
                let mut sum = R::ZERO;
                // Dropout: the value rows take the masked probabilities, the sum the unmasked.
                let first = mask.first::<R>((b, head, t));
                for (j, s) in scores[..n].iter().enumerate() {
                    let p = (*s - max).exp_fast();
                    sum += p;
                    let kept = match (first, masks.as_mut()) {
                        (Some((at, keep)), Some(m)) => match m.keeps(at + j as u64) {
                            true => p * keep,
                            false => continue,
                        },
                        _ => p,
                    };
                    super::kernels::axpy(o, kept, &kv_src[kv.at(j, b, bt, qw) + vo..][..d]);
                }
                let inv = R::ONE / sum;
                o.iter_mut().for_each(|x| *x *= inv);
                lse[(b * shape.heads + head) * q.len + t] = max + sum.ln();
            }
        }
    }
}

/// `(out, lse)` becomes the attention over the keys of both itself and `(part_out, part_lse)`
/// (blocks of the same queries over disjoint keys, shaped as `block_forward` writes them for
/// `positions` queries); an `lse` of -inf is a block with no keys yet.
pub fn merge<R: Real>(
    (out, lse): (&mut [R], &mut [R]),
    (part_out, part_lse): (&[R], &[R]),
    shape: AttentionShape,
    positions: usize,
) {
    let (bt, d, aw) = (shape.batch, shape.head_dim, shape.width());
    for b in 0..bt {
        for head in 0..shape.heads {
            for t in 0..positions {
                let l = (b * shape.heads + head) * positions + t;
                let (a, p) = (lse[l], part_lse[l]);
                let m = a.max(p);
                let (wa, wp) = ((a - m).exp_fast(), (p - m).exp_fast());
                let merged = m + (wa + wp).ln();
                let (wa, wp) = ((a - merged).exp_fast(), (p - merged).exp_fast());
                let at = (t * bt + b) * aw + head * d;
                for (o, &x) in out[at..at + d].iter_mut().zip(&part_out[at..at + d]) {
                    *o = *o * wa + x * wp;
                }
                lse[l] = merged;
            }
        }
    }
}

/// Backward of one block: adds to the query columns of `grad` at `dq` (laid out as the queries'
/// buffer) and to its key and value columns at `dkv` (as the keys'), from the whole attention's
/// output gradient `dout`, output `out` (each [q.len · batch, heads · head_dim] from element
/// `at`) and log-sum-exp `lse` ([batch, heads, q.len] from element `lse_at`).
#[allow(clippy::too_many_arguments)]
pub fn block_backward<R: Real>(
    grad: &mut [R],
    (dq, dkv): (QkvRun, QkvRun),
    ((dout, out), at): ((&[R], &[R]), usize),
    (lse, lse_at): (&[R], usize),
    (q_src, q): (&[R], QkvRun),
    (kv_src, kv): (&[R], QkvRun),
    shape: AttentionShape,
    mask: BlockMask,
) {
    let (bt, d, qw, aw) = (shape.batch, shape.head_dim, shape.qkv_width(), shape.width());
    assert!(grad.len() >= dq.end(bt, qw) && grad.len() >= dkv.end(bt, qw));
    let mut masks = mask.dropout.map(|(dr, _, _)| Masks::new(dr));
    assert!(dout.len() >= at + q.len * bt * aw && out.len() >= at + q.len * bt * aw);
    let scale = R::from_f64(1.0 / (d as f64).sqrt());
    let mut ds = vec![R::ZERO; kv.len];
    let mut dq_t = vec![R::ZERO; d];
    for b in 0..bt {
        for head in 0..shape.heads {
            let (qo, ko, vo) = shape.qkv_offsets(head);
            for t in 0..q.len {
                let row = at + (t * bt + b) * aw + head * d;
                let (go, o) = (&dout[row..row + d], &out[row..row + d]);
                let delta = super::kernels::dot(go, o);
                let l = lse[lse_at + (b * shape.heads + head) * q.len + t];
                let qv = &q_src[q.at(t, b, bt, qw) + qo..][..d];
                let n = mask.keys(t, kv.len);
                let first = mask.first::<R>((b, head, t));
                dq_t.fill(R::ZERO);
                for (j, g) in ds[..n].iter_mut().enumerate() {
                    let k = &kv_src[kv.at(j, b, bt, qw) + ko..][..d];
                    let v = &kv_src[kv.at(j, b, bt, qw) + vo..][..d];
                    let p = (super::kernels::dot(qv, k) * scale - l).exp_fast();
                    // Dropout, as the one-rank kernel: dv takes the masked probability, and the
                    // probability's gradient is masked before the softmax's backward.
                    let (kept, dp) = match (first, masks.as_mut()) {
                        (Some((at, keep)), Some(m)) => match m.keeps(at + j as u64) {
                            true => (p * keep, super::kernels::dot(go, v) * keep),
                            false => (R::ZERO, R::ZERO),
                        },
                        _ => (p, super::kernels::dot(go, v)),
                    };
                    *g = p * (dp - delta) * scale;
                    super::kernels::axpy(&mut dq_t, *g, k);
                    super::kernels::axpy(&mut grad[dkv.at(j, b, bt, qw) + vo..][..d], kept, go);
                }
                for (j, &g) in ds[..n].iter().enumerate() {
                    super::kernels::axpy(&mut grad[dkv.at(j, b, bt, qw) + ko..][..d], g, qv);
                }
                let dst = &mut grad[dq.at(t, b, bt, qw) + qo..][..d];
                dst.iter_mut().zip(&dq_t).for_each(|(x, &y)| *x += y);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{kernels, Dropout};

    /// Causal attention over 12 positions as three blocks of 4 queries, each against every
    /// earlier block and its own diagonal, merged: the output, log-sum-exp and the gradients of
    /// the whole-sequence kernels, in f64 (grouped-query attention, batch 2), without and with
    /// attention dropout (each block drawing the whole kernel's masks at its positions).
    #[test]
    fn blocks_merged_are_the_whole_attention() {
        let dropout = Dropout {
            p: 0.3,
            key: [7, 11],
            place: 5,
            iteration: 3,
            sample0: 2,
            batch: 2,
            seq: 12,
            t0: 0,
            width: 8,
            col0: 4,
            jump: None,
        };
        blocks_merged_are_the_whole_attention_with(None);
        blocks_merged_are_the_whole_attention_with(Some(&dropout));
    }

    fn blocks_merged_are_the_whole_attention_with(dropout: Option<&Dropout>) {
        let shape = AttentionShape::new(2, 12, 4, 3).grouped(2);
        let (bt, qw, aw, n) = (shape.batch, shape.qkv_width(), shape.width(), 4);
        let qkv: Vec<f64> = crate::rng::fill(shape.rows() * qw, 1).into_iter().map(f64::from).collect();
        let dout: Vec<f64> = crate::rng::fill(shape.rows() * aw, 2).into_iter().map(f64::from).collect();
        let (mut out, mut lse, mut dqkv) =
            (vec![0f64; shape.rows() * aw], vec![0f64; bt * 4 * 12], vec![0f64; shape.rows() * qw]);
        for b in 0..bt {
            for h in 0..4 {
                // SAFETY: whole buffers, serial.
                unsafe {
                    kernels::attention_forward_head(
                        out.as_mut_ptr(),
                        lse.as_mut_ptr(),
                        &qkv,
                        shape,
                        (b, h),
                        (dropout, None),
                    );
                }
            }
        }
        for b in 0..bt {
            for h in 0..4 {
                // SAFETY: as above.
                unsafe {
                    let saved = (&out[..], &lse[..]);
                    kernels::attention_backward_head(
                        dqkv.as_mut_ptr(),
                        &dout,
                        &qkv,
                        saved,
                        shape,
                        (b, h),
                        (dropout, None),
                    );
                }
            }
        }
        let run = |x: usize| QkvRun { base: 0, seq: 12, first: x * n, len: n };
        let block = AttentionShape { seq: n, ..shape };
        let mut grad = vec![0f64; qkv.len()];
        for x in 0..3 {
            let (mut acc, mut acc_lse) = (vec![0f64; n * bt * aw], vec![f64::NEG_INFINITY; bt * 4 * n]);
            let (mut part, mut part_lse) = (acc.clone(), acc_lse.clone());
            for y in 0..=x {
                let mask = BlockMask { diagonal: x == y, dropout: dropout.map(|d| (d, x * n, y * n)) };
                block_forward((&mut part, &mut part_lse), (&qkv, run(x)), (&qkv, run(y)), shape, mask);
                merge((&mut acc, &mut acc_lse), (&part, &part_lse), block, n);
            }
            for t in 0..n * bt {
                let whole = &out[(x * n * bt + t) * aw..][..aw];
                let mine = &acc[t * aw..][..aw];
                assert!(whole.iter().zip(mine).all(|(a, b)| (a - b).abs() < 1e-12), "chunk {x} row {t}");
            }
            for b in 0..bt {
                for h in 0..4 {
                    for t in 0..n {
                        let (w, m) = (lse[(b * 4 + h) * 12 + x * n + t], acc_lse[(b * 4 + h) * n + t]);
                        assert!((w - m).abs() < 1e-12, "lse {b} {h} {x} {t}");
                    }
                }
            }
            // The gradients of this chunk's queries, from its rows of dout and out.
            let (d_rows, o_rows) = (&dout[x * n * bt * aw..], &out[x * n * bt * aw..]);
            for y in 0..=x {
                let saved = ((&d_rows[..n * bt * aw], &o_rows[..n * bt * aw]), 0);
                block_backward(
                    &mut grad,
                    (run(x), run(y)),
                    saved,
                    (&acc_lse, 0),
                    (&qkv, run(x)),
                    (&qkv, run(y)),
                    shape,
                    BlockMask { diagonal: x == y, dropout: dropout.map(|d| (d, x * n, y * n)) },
                );
            }
        }
        let worst = grad.iter().zip(&dqkv).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 1e-12, "gradients differ by {worst}");
    }
}
