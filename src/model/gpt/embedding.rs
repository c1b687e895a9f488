//! The first chunk's embeddings: word rows from this rank's vocabulary shard summed over the
//! group (reduce-scattered to this rank's positions under sequence parallelism, to its batch
//! block under SUMMA) plus the learned position embedding where the model has one (rotary
//! positions act in attention instead), and their backward into the tables.

use super::activations::Widths;
use super::documents::{add_document_positions, document_positions, document_positions_backward};
use super::tensor_parallel::Pass;
use super::{Gpt, Layout, Weights};
use crate::device::dropout::Site;
use crate::device::Tokens;
use crate::device::{Device, Matrix};
use crate::parallel::summa;
use crate::parallel::tensor::{all_reduce, reduce_scatter, TensorParallel};

impl<D: Device> Gpt<D> {
    /// The first vocabulary row of this rank's word-embedding shard (under SUMMA, of its row's
    /// vocabulary block).
    pub(super) fn vocab_start(&self) -> usize {
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        self.mp.summa.map_or(self.mp.tp_rank, |c| c.row) * vl
    }

    /// Embeds `tokens` (`batch` samples of `seq`, sample-major) into the residual stream entering
    /// the first block of activation set `index`.
    pub(super) fn embed(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        tokens: &[u32],
        batch: usize,
        seq: usize,
    ) {
        let vocab_start = self.vocab_start();
        let dropout = self.dropout_at(index, 0, Site::Embedding);
        let (cfg, precision, mp, lay) = (&self.cfg, self.precision, self.mp, self.layout);
        // --reset-position-ids's end-of-document id, where the positions are learned ones; under
        // context parallelism the positions of this rank's chunks, looked up the same way.
        let reset_eod = self.reset_positions.filter(|_| lay.wpe().is_some());
        let split = mp.context;
        let reset = reset_eod.is_some() || (split.size > 1 && lay.wpe().is_some());
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let a = &mut self.pool[index].1;
        let r = a.rows;
        let wd = Widths::new(cfg, &mp);
        let h = wd.h;
        assert_eq!(tokens.len(), batch * seq);
        a.tokens.copy_from_slice(tokens);
        if let Some(eod) = reset_eod {
            document_positions(tokens, seq, eod, &mut a.positions);
        } else if reset {
            a.positions.clear();
            a.positions.extend((0..batch * seq).map(|i| split.position(seq, i % seq) as u32));
        }
        // This shard's word rows, summed over the group (reduce-scattered to this rank's
        // positions under SP; to this rank's batch block under SUMMA), then the position
        // embedding of those positions.
        match (&mut a.emb_full, tp.summa, mp.summa) {
            (Some(emb), Some((s, _)), Some(c)) => {
                let bd = batch / c.depth;
                let mine = &tokens[c.dep * bd * seq..(c.dep + 1) * bd * seq];
                dev.embedding_forward(emb, &p[Layout::WTE], Tokens { ids: mine, batch: bd, seq, vocab_start }, wd.hr);
                // The rows as the compute format holds them (the table may be the master).
                dev.round_to(emb, precision);
                let blocks = rows_to_batch_blocks(&summa::host(dev, emb), c.q, r.sub_batch, seq, wd.hr);
                let mut out = vec![0f32; r.full * wd.hr];
                s.col.reduce_scatter(&blocks, &mut out);
                dev.upload(&mut a.resid[0], &out);
                let mut wpe = dev.alloc(cfg.max_position_embeddings * wd.hr);
                let at = lay.wpe().expect("SUMMA runs GPT-2's learned positions");
                summa::gather_stacked(dev, s.col, &p[at], &mut wpe);
                match reset {
                    true => add_document_positions(dev, &mut a.resid[0], &wpe, &a.positions, &r, wd.hr),
                    false => dev.position_forward(&mut a.resid[0], &wpe, r.sub_batch, 0, seq, wd.hr),
                }
            }
            (Some(emb), _, _) => {
                dev.embedding_forward(emb, &p[Layout::WTE], Tokens { ids: tokens, batch, seq, vocab_start }, h);
                dev.round_to(emb, precision);
                reduce_scatter(dev, tp.comm, emb, &mut a.resid[0]);
            }
            _ => {
                dev.embedding_forward(
                    &mut a.resid[0],
                    &p[Layout::WTE],
                    Tokens { ids: tokens, batch, seq, vocab_start },
                    h,
                );
                dev.round_to(&mut a.resid[0], precision);
                all_reduce(dev, tp.comm, &mut a.resid[0]);
            }
        }
        match (mp.summa, lay.wpe()) {
            (None, Some(at)) if reset => add_document_positions(dev, &mut a.resid[0], &p[at], &a.positions, &r, h),
            (None, Some(at)) => dev.position_forward(&mut a.resid[0], &p[at], batch, r.t0, r.positions, h),
            _ => {}
        }
        if let Some(d) = dropout {
            dev.dropout(&mut a.resid[0], &d, Matrix { rows: r.local, cols: wd.hr });
        }
        dev.round_to(&mut a.resid[0], precision);
    }

    /// Backward of `embed` from the gradient of the first block's input (`d_resid`): the word and
    /// position embeddings' gradients "+=".
    pub(super) fn embedding_backward(&mut self, dev: &D, tp: TensorParallel, index: usize) {
        let vocab_start = self.vocab_start();
        let dropout = self.dropout_at(index, 0, Site::Embedding);
        let (cfg, mp, lay) = (&self.cfg, self.mp, self.layout);
        let reset = (self.reset_positions.is_some() || self.mp.context.size > 1) && lay.wpe().is_some();
        let wd = Widths::new(cfg, &mp);
        let h = wd.h;
        self.params.ensure_grads(dev, lay.embeddings());
        let g = &mut self.params.grads;
        let a = &mut self.pool[index].1;
        let r = a.rows;
        // The gradient of the embeddings' sum, through their dropout.
        if let Some(d) = dropout {
            dev.dropout(&mut a.grad.d_resid, &d, Matrix { rows: r.local, cols: wd.hr });
        }
        match (tp.summa, mp.summa) {
            (Some((s, _)), Some(c)) => {
                // Position rows: this block's gradient, summed down the column into the shard.
                let mut dwpe = dev.alloc(cfg.max_position_embeddings * wd.hr);
                match reset {
                    true => document_positions_backward(dev, &mut dwpe, &a.grad.d_resid, &a.positions, &r, wd.hr),
                    false => dev.position_backward(&mut dwpe, &a.grad.d_resid, r.sub_batch, 0, r.seq, wd.hr),
                }
                let at = lay.wpe().expect("SUMMA runs GPT-2's learned positions");
                summa::scatter_stacked_add(dev, s.col, &dwpe, &mut g[at]);
                // Word rows: every batch block of the depth layer against this vocabulary block.
                let mut blocks = vec![0f32; c.q * r.full * wd.hr];
                s.col.all_gather(&summa::host(dev, &a.grad.d_resid), &mut blocks);
                let rows = batch_blocks_to_rows(&blocks, c.q, r.sub_batch, r.seq, wd.hr);
                let emb = a.emb_full.as_mut().expect("the first SUMMA chunk has an embedding buffer");
                dev.upload(emb, &rows);
                let bd = r.batch / c.depth;
                let mine = &a.tokens[c.dep * bd * r.seq..(c.dep + 1) * bd * r.seq];
                dev.embedding_backward(
                    &mut g[Layout::WTE],
                    emb,
                    Tokens { ids: mine, batch: bd, seq: r.seq, vocab_start },
                    wd.hr,
                );
            }
            _ => {
                let d = &mut a.grad;
                match lay.wpe() {
                    Some(at) if reset => document_positions_backward(dev, &mut g[at], &d.d_resid, &a.positions, &r, h),
                    Some(at) => dev.position_backward(&mut g[at], &d.d_resid, r.batch, r.t0, r.positions, h),
                    None => {}
                }
                let pass =
                    Pass::plain((dev, tp), (&mut self.scratch, &mut self.heads), &self.cfg.arch, self.rope.as_ref());
                let d_emb = pass.gathered(&d.d_resid, &mut d.d_full);
                dev.embedding_backward(
                    &mut g[Layout::WTE],
                    d_emb,
                    Tokens { ids: &a.tokens, batch: r.batch, seq: r.seq, vocab_start },
                    h,
                );
            }
        }
    }
}

/// Every row of a depth layer under SUMMA as a pair of places: in the layer's row order
/// (`t * (q * sub) + l * sub + b`), and in `q` batch blocks of `sub` samples, block `l` holding
/// samples `l * sub..` in row order `t * sub + b`.
fn depth_layer_rows(q: usize, sub: usize, seq: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..q).flat_map(move |l| {
        (0..seq).flat_map(move |t| (0..sub).map(move |b| (t * q * sub + l * sub + b, l * seq * sub + t * sub + b)))
    })
}

/// Rows of `width` moved from place `from` to place `to` for each pair.
fn move_rows(src: &[f32], width: usize, pairs: impl Iterator<Item = (usize, usize)>) -> Vec<f32> {
    let mut out = vec![0f32; src.len()];
    for (from, to) in pairs {
        out[to * width..(to + 1) * width].copy_from_slice(&src[from * width..(from + 1) * width]);
    }
    out
}

/// A depth layer's rows (`t * (q * sub) + b`) regrouped into `q` batch blocks of `sub` samples.
fn rows_to_batch_blocks(rows: &[f32], q: usize, sub: usize, seq: usize, width: usize) -> Vec<f32> {
    move_rows(rows, width, depth_layer_rows(q, sub, seq))
}

/// The inverse of `rows_to_batch_blocks`.
fn batch_blocks_to_rows(blocks: &[f32], q: usize, sub: usize, seq: usize, width: usize) -> Vec<f32> {
    move_rows(blocks, width, depth_layer_rows(q, sub, seq).map(|(row, block)| (block, row)))
}
