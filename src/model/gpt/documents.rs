//! Megatron's `--reset-position-ids`: the positions of a sample restart at 0 after each of its
//! end-of-document tokens (the end-of-document token itself closes its document), as megatron-core's
//! `_get_ltor_masks_and_position_ids` numbers them, and the learned position embedding adds the
//! row of each token's own position (an embedding lookup of the position table). Under
//! `--reset-attention-mask` each position attends to its own document only: the chunk keeps the
//! document start of every position of its samples, the lower bound the attention kernels take.

use super::activations::Rows;
use super::Gpt;
use crate::device::{Device, Tokens};

/// Each token's position within its document: `tokens` holds samples of `seq` tokens
/// (sample-major), and a sample's positions restart at 0 after each `eod`.
pub fn document_positions(tokens: &[u32], seq: usize, eod: u32, out: &mut Vec<u32>) {
    document_starts(tokens, seq, eod, out);
    for (i, start) in out.iter_mut().enumerate() {
        *start = (i % seq) as u32 - *start;
    }
}

/// Each token's document start, the first position of its sample it may attend to under
/// `--reset-attention-mask` (the position after the sample's last `eod` before it; megatron-core's
/// mask hides `[i + 1.., ..= i]` for each end-of-document position i).
pub fn document_starts(tokens: &[u32], seq: usize, eod: u32, out: &mut Vec<u32>) {
    out.clear();
    for sample in tokens.chunks(seq) {
        let mut start = 0;
        for (t, &id) in sample.iter().enumerate() {
            out.push(start as u32);
            if id == eod {
                start = t + 1;
            }
        }
    }
}

/// `starts` as the attention kernels take them: None where empty (attention spans the sample).
pub(super) fn bounds(starts: &[u32]) -> Option<&[u32]> {
    (!starts.is_empty()).then_some(starts)
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

    /// `--reset-attention-mask` with its end-of-document id, or None (attention spans whole
    /// samples): each position attends to its own document's positions only.
    pub fn set_reset_attention_mask(&mut self, eod: Option<u32>) {
        self.reset_attention = eod;
    }

    /// Under `--reset-attention-mask`, the document starts of activation set `index`'s samples
    /// on this rank (its batch block under SUMMA) from the micro-batch's `tokens`.
    pub(super) fn bound_documents(&mut self, index: usize, tokens: &[u32]) {
        let a = &mut self.pool[index].1;
        let Some(eod) = self.reset_attention else { return a.starts.clear() };
        let r = a.rows;
        document_starts(
            &tokens[r.first_sample * r.seq..(r.first_sample + r.sub_batch) * r.seq],
            r.seq,
            eod,
            &mut a.starts,
        );
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
    fn starts_follow_megatrons_mask() {
        // Megatron hides [i + 1.., ..= i] for each eod at i: position t sees from the last eod
        // before it, plus one.
        let tokens = [5, 0, 7, 8, 0, 0, /**/ 1, 2, 3, 0, 4, 5];
        let mut out = Vec::new();
        super::document_starts(&tokens, 6, 0, &mut out);
        assert_eq!(out, [0, 0, 2, 2, 2, 5, /**/ 0, 0, 0, 0, 4, 4]);
    }

    #[test]
    fn positions_restart_after_each_end_of_document_token() {
        // Two samples of 6; eod = 0. The eod closes its document; the next token is position 0.
        let tokens = [5, 0, 7, 8, 0, 0, /**/ 1, 2, 3, 0, 4, 5];
        let mut out = Vec::new();
        document_positions(&tokens, 6, 0, &mut out);
        assert_eq!(out, [0, 1, 0, 1, 2, 0, /**/ 0, 1, 2, 3, 0, 1]);
    }
}
