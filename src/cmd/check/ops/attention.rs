//! `check ops`'s attention cases: causal attention forward and backward (grouped-query, per
//! document, with dropout) and context parallelism's blocks (forward, merge and backward), each
//! against the reference device.

use super::{dropout_site, refb, Bound, Run};
use crate::device::prelude::*;
use crate::device::reference::ReferenceDevice;
use crate::device::{AttentionShape, BlockMask, Dropout, QkvRun};

/// Per-document attention's starts (`--reset-attention-mask`) for `shape`: the first sequence's
/// documents start at 3, 37, 70 and its last position, the others' at 64 when they reach it.
fn document_starts(shape: AttentionShape) -> Vec<u32> {
    let seq = shape.seq;
    let cut = |cuts: &[usize], t: usize| cuts.iter().rev().find(|&&c| c <= t).map_or(0, |&c| c as u32);
    let first: Vec<usize> = [3, 37, 70, seq - 1].into_iter().filter(|&c| c > 0).collect();
    let s = (0..shape.batch).flat_map(|b| (0..seq).map(move |t| (b, t)));
    s.map(|(b, t)| if b == 0 { cut(&first, t) } else { cut(&[64], t) }).collect()
}

/// Causal attention forward and backward; a grouped-query shape (`kv_heads < heads`) names its
/// key/value heads. With `documents`, per-document attention (`document_starts`).
pub(super) fn attention<D: Device>(run: &mut Run<D>, cases: &[AttentionShape], documents: bool) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &shape in cases {
        let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
        let (rows, w, qkv_w) = (shape.rows(), shape.width(), shape.qkv_width());
        let qkv = run.halves(rows * qkv_w, "qkv", 1.0);
        let dout = run.halves(rows * w, "dout", 1.0);
        let groups = if kv_heads < heads { format!(" kv{kv_heads}") } else { String::new() };
        let starts = documents.then(|| document_starts(shape));
        let docs = if documents { " documents" } else { "" };
        let case = format!("b{batch} s{seq} h{heads}{groups} d{head_dim}{docs}");
        let gq = run.up(&qkv);
        let (mut out, mut lse) = (dev.alloc(rows * w), dev.alloc(rows * heads));
        dev.attention_forward(&mut out, &mut lse, &gq, shape, None, starts.as_deref());
        let (mut rout, mut rlse) = (r.alloc(rows * w), r.alloc(rows * heads));
        r.attention_forward(&mut rout, &mut rlse, &refb(&qkv), shape, None, starts.as_deref());
        run.push_dev("attention_forward out", &case, &out, &rout, run.half_bound());
        run.push_dev("attention_forward lse", &case, &lse, &rlse, Bound::F32(1e-4));
        // Backward from the device's own forward output, as training runs it.
        let (out_host, lse_host) = (run.down(&out), run.down(&lse));
        let mut dqkv = run.up(&vec![9.0; rows * qkv_w]);
        dev.attention_backward(&mut dqkv, &run.up(&dout), &gq, &out, &lse, shape, None, starts.as_deref());
        let mut rdqkv = r.alloc(rows * qkv_w);
        let (rdout, rout) = (refb(&dout), refb(&out_host));
        r.attention_backward(&mut rdqkv, &rdout, &refb(&qkv), &rout, &refb(&lse_host), shape, None, starts.as_deref());
        run.push_dev("attention_backward dqkv", &case, &dqkv, &rdqkv, run.half_bound());
    }
}

/// Attention dropout: forward and backward against the reference on random inputs
/// (`dropout_site`'s masks, with the heads of a wider tensor), and the masks themselves, which
/// must be the reference's bit for bit. With q = 0 every probability of row t is 1/(t+1); with
/// v_u and dO_t one-hot (at component u and t), out[t][u] and dV[u][t] are m_tu / ((t+1)(1-p)),
/// so which entries are zero is the mask of the forward's kernel and of dK/dV's.
pub(super) fn attention_dropout<D: Device>(run: &mut Run<D>, head_dims: &[usize]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &d in head_dims {
        let shape = AttentionShape::new(2, 37, 4, d).grouped(2);
        let (rows, w, qkv_w) = (shape.rows(), shape.width(), shape.qkv_width());
        let site = Dropout { batch: 2, seq: 37, t0: 0, width: 9, col0: 3, ..dropout_site(rows, w) };
        let case = format!("b2 s37 h4 kv2 d{d} p0.3");
        let (qkv, dout) = (run.halves(rows * qkv_w, "qkv", 1.0), run.halves(rows * w, "dout", 1.0));
        let (gq, mut out, mut lse) = (run.up(&qkv), dev.alloc(rows * w), dev.alloc(rows * shape.heads));
        dev.attention_forward(&mut out, &mut lse, &gq, shape, Some(&site), None);
        let (mut rout, mut rlse) = (r.alloc(rows * w), r.alloc(rows * shape.heads));
        r.attention_forward(&mut rout, &mut rlse, &refb(&qkv), shape, Some(&site), None);
        run.push_dev("attention_forward out, dropout", &case, &out, &rout, run.half_bound());
        run.push_dev("attention_forward lse, dropout", &case, &lse, &rlse, Bound::F32(1e-4));
        let (out_host, lse_host) = (refb(&run.down(&out)), refb(&run.down(&lse)));
        let mut dqkv = dev.alloc(rows * qkv_w);
        dev.attention_backward(&mut dqkv, &run.up(&dout), &gq, &out, &lse, shape, Some(&site), None);
        let mut rdqkv = r.alloc(rows * qkv_w);
        r.attention_backward(&mut rdqkv, &refb(&dout), &refb(&qkv), &out_host, &lse_host, shape, Some(&site), None);
        run.push_dev("attention_backward dqkv, dropout", &case, &dqkv, &rdqkv, run.half_bound());
        // The masks: one-hot values and output gradients over `seq <= d` positions.
        let seq = d.min(24);
        let shape = AttentionShape::new(2, seq, 2, d);
        let (rows, w, qkv_w) = (shape.rows(), shape.width(), shape.qkv_width());
        let site = Dropout { batch: 2, seq, t0: 0, width: 5, col0: 1, ..dropout_site(rows, w) };
        let (mut qkv, mut dout) = (vec![0f32; rows * qkv_w], vec![0f32; rows * w]);
        for (t, b, h) in (0..seq).flat_map(|t| (0..2).flat_map(move |b| (0..2).map(move |h| (t, b, h)))) {
            let (_, _, v) = shape.qkv_offsets(h);
            qkv[(t * 2 + b) * qkv_w + v + t] = 1.0;
            dout[(t * 2 + b) * w + h * d + t] = 1.0;
        }
        let (gq, mut out, mut lse) = (run.up(&qkv), dev.alloc(rows * w), dev.alloc(rows * shape.heads));
        dev.attention_forward(&mut out, &mut lse, &gq, shape, Some(&site), None);
        let mut dqkv = dev.alloc(rows * qkv_w);
        dev.attention_backward(&mut dqkv, &run.up(&dout), &gq, &out, &lse, shape, Some(&site), None);
        let (out, dqkv) = (run.down(&out), run.down(&dqkv));
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (t, b, h) in (0..seq).flat_map(|t| (0..2).flat_map(move |b| (0..2).map(move |h| (t, b, h)))) {
            let (_, _, v) = shape.qkv_offsets(h);
            for u in 0..=t {
                let kept = site.keeps(site.attention_index(b, h, t) + u as u64);
                want.extend([kept as u8 as f64; 2]);
                got.push((out[(t * 2 + b) * w + h * d + u] != 0.0) as u8 as f32);
                got.push((dqkv[(u * 2 + b) * qkv_w + v + t] != 0.0) as u8 as f32);
            }
        }
        run.push("attention dropout masks (out, dV)", &format!("b2 s{seq} h2 d{d}"), &got, &want, Bound::Exact);
    }
}

/// Context parallelism's blocks, per head dim, plain and with dropout: the queries of chunk 1
/// of a buffer of two chunks (37 positions each, 2 groups of 2 query heads) against chunk 0 of
/// another buffer's second half (every key: the ring's and all_gather's earlier blocks) and
/// against themselves (the diagonal); the second merged into the first; and both blocks'
/// backward added into one gradient of both buffers' rows, from the merged output.
pub(super) fn attention_blocks<D: Device>(run: &mut Run<D>, head_dims: &[usize]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    let n = 37;
    for (&d, drop) in head_dims.iter().flat_map(|d| [(d, false), (d, true)]) {
        let shape = AttentionShape::new(2, 2 * n, 4, d).grouped(2);
        let (bt, qw, aw, lw) = (shape.batch, shape.qkv_width(), shape.width(), shape.batch * shape.heads * n);
        let site = Dropout { batch: 2, seq: 4 * n, t0: 0, width: 9, col0: 3, ..dropout_site(shape.rows(), aw) };
        let case = format!("b2 2x{n} h4 kv2 d{d}{}", if drop { " p0.3" } else { "" });
        // This rank's rows, then a buffer of two ranks' rows whose second rank's chunk 0 is the
        // earlier block's keys (whole-sequence chunk 1 of 4; the queries are chunk 2).
        let local = shape.rows() * qw;
        let (qkv, other) = (run.halves(local, "qkv", 1.0), run.halves(2 * local, "qkv other", 1.0));
        let q = QkvRun { base: 0, seq: 2 * n, first: n, len: n };
        let kv = QkvRun { base: local, seq: 2 * n, first: 0, len: n };
        let mask = |diagonal: bool, k0: usize| BlockMask { diagonal, dropout: drop.then_some((&site, 2 * n, k0)) };
        let (gq, go) = (run.up(&qkv), run.up(&other));
        let (rq, ro) = (refb(&qkv), refb(&other));
        let (mut out, mut lse) = (dev.alloc(n * bt * aw), dev.alloc(lw));
        let (mut part, mut part_lse) = (dev.alloc(n * bt * aw), dev.alloc(lw));
        let (mut rout, mut rlse) = (r.alloc(n * bt * aw), r.alloc(lw));
        dev.attention_block_forward((&mut out, &mut lse), (&gq, q), (&go, kv), shape, mask(false, n));
        r.attention_block_forward((&mut rout, &mut rlse), (&rq, q), (&ro, kv), shape, mask(false, n));
        run.push_dev("attention_block_forward out", &case, &out, &rout, run.half_bound());
        run.push_dev("attention_block_forward lse", &case, &lse, &rlse, Bound::F32(1e-4));
        dev.attention_block_forward((&mut part, &mut part_lse), (&gq, q), (&gq, q), shape, mask(true, 2 * n));
        r.attention_block_forward((&mut rout, &mut rlse), (&rq, q), (&rq, q), shape, mask(true, 2 * n));
        let case_diagonal = format!("{case} diagonal");
        run.push_dev("attention_block_forward out", &case_diagonal, &part, &rout, run.half_bound());
        run.push_dev("attention_block_forward lse", &case_diagonal, &part_lse, &rlse, Bound::F32(1e-4));
        // The merge alone: both sides from the device's blocks.
        let (mut racc, mut racc_lse) = (refb(&run.down(&out)), refb(&run.down(&lse)));
        let (rpart, rpart_lse) = (refb(&run.down(&part)), refb(&run.down(&part_lse)));
        dev.attention_merge((&mut out, &mut lse), (&part, &part_lse), shape, n);
        r.attention_merge((&mut racc, &mut racc_lse), (&rpart, &rpart_lse), shape, n);
        run.push_dev("attention_merge out", &case, &out, &racc, Bound::F32(1e-5));
        run.push_dev("attention_merge lse", &case, &lse, &racc_lse, Bound::F32(1e-5));
        // Backward of both blocks from the merged result, into one gradient: this rank's rows
        // (the queries' and the diagonal's keys') and the other buffer's rows after them.
        let dout = run.halves(n * bt * aw, "dout block", 1.0);
        let (out_host, lse_host) = (refb(&run.down(&out)), refb(&run.down(&lse)));
        let (gd, rd) = (run.up(&dout), refb(&dout));
        let (mut grad, mut rgrad) = (run.up(&vec![0.5; 3 * local]), vec![0.5f64; 3 * local]);
        let (dq, dkv) = (q, QkvRun { base: 2 * local, ..kv });
        for (diagonal, k0) in [(false, n), (true, 2 * n)] {
            let (src, rsrc, run_kv) = if diagonal { (&gq, &rq, q) } else { (&go, &ro, kv) };
            let dkv = if diagonal { q } else { dkv };
            dev.attention_block_backward(
                &mut grad,
                (dq, dkv),
                ((&gd, &out), 0),
                (&lse, 0),
                (&gq, q),
                (src, run_kv),
                shape,
                mask(diagonal, k0),
            );
            let saved = ((&rd, &out_host), 0);
            r.attention_block_backward(
                &mut rgrad,
                (dq, dkv),
                saved,
                (&lse_host, 0),
                (&rq, q),
                (rsrc, run_kv),
                shape,
                mask(diagonal, k0),
            );
        }
        run.push_dev("attention_block_backward", &case, &grad, &rgrad, run.half_bound());
    }
}
