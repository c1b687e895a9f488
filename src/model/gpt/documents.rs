//! Megatron's `--reset-position-ids`: the positions of a sample restart at 0 after each of its
//! end-of-document tokens (the end-of-document token itself closes its document), as megatron-core's
//! `_get_ltor_masks_and_position_ids` numbers them, and the learned position embedding adds the
//! row of each token's own position (an embedding lookup of the position table). Attention still
//! spans the whole sample.

use super::activations::Rows;
use super::Gpt;
use crate::device::{Device, Tokens};

/// Each token's position within its document: `tokens` holds samples of `seq` tokens
/// (sample-major), and a sample's positions restart at 0 after each `eod`.
pub fn document_positions(tokens: &[u32], seq: usize, eod: u32, out: &mut Vec<u32>) {
    out.clear();
    for sample in tokens.chunks(seq) {
        let mut start = 0;
        for (t, &id) in sample.iter().enumerate() {
            out.push((t - start) as u32);
            if id == eod {
                start = t + 1;
            }
        }
    }
}

/// The positions of this rank's rows as `Tokens` ids (sample-major): positions `t0 ..
/// t0 + positions` of the samples `first_sample ..` it holds.
fn local_ids(all: &[u32], r: &Rows) -> Vec<u32> {
    let mut ids = Vec::with_capacity(r.sub_batch * r.positions);
    for b in r.first_sample..r.first_sample + r.sub_batch {
        ids.extend_from_slice(&all[b * r.seq + r.t0..b * r.seq + r.t0 + r.positions]);
    }
    ids
}

impl<D: Device> Gpt<D> {
    /// `--reset-position-ids` with its end-of-document id, or None (positions run over whole
    /// samples). Only a learned position embedding reads it: rotary angles run over the whole
    /// sample, as megatron-core's do (its rotary embedding never reads the position ids).
    pub fn set_reset_position_ids(&mut self, eod: Option<u32>) {
        self.reset_positions = eod;
    }
}

/// Adds to `out` (this rank's residual rows) the rows of `wpe` at the reset positions `all`
/// (whole micro-batch, sample-major): the learned position embedding under
/// `--reset-position-ids`, as a lookup of the position table.
pub(super) fn add_document_positions<D: Device>(
    dev: &D,
    out: &mut D::Buf,
    wpe: &D::Buf,
    all: &[u32],
    r: &Rows,
    h: usize,
) {
    let ids = local_ids(all, r);
    let mut rows = dev.alloc(r.local * h);
    dev.embedding_forward(
        &mut rows,
        wpe,
        Tokens { ids: &ids, batch: r.sub_batch, seq: r.positions, vocab_start: 0 },
        h,
    );
    dev.add_assign(out, &rows);
}

/// Backward of `add_document_positions`: `dout`'s rows added into the gradient of the rows of
/// their positions.
pub(super) fn document_positions_backward<D: Device>(
    dev: &D,
    dwpe: &mut D::Buf,
    dout: &D::Buf,
    all: &[u32],
    r: &Rows,
    h: usize,
) {
    let ids = local_ids(all, r);
    dev.embedding_backward(dwpe, dout, Tokens { ids: &ids, batch: r.sub_batch, seq: r.positions, vocab_start: 0 }, h);
}

#[cfg(test)]
mod tests {
    use super::document_positions;

    #[test]
    fn positions_restart_after_each_end_of_document_token() {
        // Two samples of 6; eod = 0. The eod closes its document; the next token is position 0.
        let tokens = [5, 0, 7, 8, 0, 0, /**/ 1, 2, 3, 0, 4, 5];
        let mut out = Vec::new();
        document_positions(&tokens, 6, 0, &mut out);
        assert_eq!(out, [0, 1, 0, 1, 2, 0, /**/ 0, 1, 2, 3, 0, 1]);
    }
}
