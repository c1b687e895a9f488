//! The last chunk's head: the final norm, the output layer (tied to the word embedding, or its
//! own under `--untie-embeddings-and-output-weights`; vocab-parallel logits), the cross-entropy from three all-reduces of per-row statistics, and
//! their backward from the loss.

use super::activations::{logits_precision, Widths};
use super::tensor_parallel::Pass;
use super::{Gpt, Layout, Weights};
use crate::comm::ReduceOp;
use crate::device::{all_reduce_scalars, Device};
use crate::device::{Gemm, Logits};
use crate::parallel::tensor::TensorParallel;
use crate::tensor::{pair_mut, ParamSet};
use std::ops::Range;

impl<D: Device> Gpt<D> {
    /// The first vocabulary entry of this rank's logits (under SUMMA, of its column's block).
    pub(super) fn logits_start(&self) -> usize {
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        self.mp.summa.map_or(self.mp.tp_rank, |c| c.col) * vl
    }

    /// The final LayerNorm of the last block's output and the logits of activation set `index`.
    pub(super) fn head_forward(&mut self, dev: &D, tp: TensorParallel, index: usize) {
        let (cfg, lay, precision, mp) = (&self.cfg, self.layout, self.precision, self.mp);
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let (a, mut pass) = (
            &mut self.pool[index].1,
            Pass::plain((dev, tp), (&mut self.scratch, &mut self.heads), &self.cfg.arch, self.rope.as_ref()),
        );
        let r = a.rows;
        let Widths { h, vl, .. } = Widths::new(cfg, &mp);
        let hd = a.head.as_mut().expect("the last chunk has a head");
        let (lnf_w, lnf_b) = lay.lnf_params();
        let x_last = &a.resid[lay.num_layers];
        pass.ln_forward(&mut hd.lnf, x_last, (&p[lnf_w], lnf_b.map(|b| &p[b])), r.local, h);
        dev.round_to(&mut hd.lnf.out, precision);
        match tp.summa {
            None => {
                let lnf = pass.gathered(&hd.lnf.out, &mut hd.lnf.full);
                dev.linear_forward(&mut hd.logits, lnf, &p[lay.head()], None, Gemm { rows: r.full, k: h, n: vl });
            }
            Some((s, _)) => {
                let v = cfg.padded_vocab_size;
                s.logits_forward(dev, &mut hd.logits, &hd.lnf.out, &p[lay.head()], r.full, h, v, pass.sc);
            }
        }
        // Bf16 storage holds the GEMM's output rounded; f32 storage rounds it here (the CPU).
        dev.round_to(&mut hd.logits, logits_precision(precision));
    }

    /// The vocab-parallel cross-entropy of a forward's logits against `labels` (sample-major):
    /// the max, target-logit and sum-exp all-reduces over the group, on the device's scalars. Adds
    /// the sum of the rows' losses to the chunk's loss accumulator (under SUMMA this rank's batch
    /// block's; `take_loss` sums the blocks) and keeps the statistics for backward.
    pub(super) fn cross_entropy_loss(&mut self, dev: &D, tp: TensorParallel, index: usize, labels: &[u32]) {
        let vocab_start = self.logits_start();
        let vl = Widths::new(&self.cfg, &self.mp).vl;
        let a = &mut self.pool[index].1;
        let r = a.rows;
        let hd = a.head.as_mut().expect("the last chunk has a head");
        // The vocabulary is split over the group under 1-D, over the row under SUMMA.
        let comm = tp.summa.map_or(tp.comm, |(s, _)| s.row);
        let mine = &labels[r.first_sample * r.seq..(r.first_sample + r.sub_batch) * r.seq];
        reorder_to_rows(&mut hd.targets, mine, r.sub_batch, r.seq);
        dev.cross_entropy_max(&hd.logits, r.full, vl, &mut hd.ce_max);
        all_reduce_scalars(dev, comm, &mut hd.ce_max, r.full, ReduceOp::Max);
        dev.cross_entropy_partials(
            &hd.logits,
            &hd.targets,
            Logits { rows: r.full, vocab: vl, vocab_start },
            &hd.ce_max,
            &mut hd.ce_stats,
        );
        // Sum-exp and target logit travel in one all-reduce.
        all_reduce_scalars(dev, comm, &mut hd.ce_stats, 2 * r.full, ReduceOp::Sum);
        dev.cross_entropy_loss(&hd.ce_max, &hd.ce_stats, &hd.targets, r.full, &mut self.loss, self.loss_slot);
    }

    /// Backward of the output layer (tied to the word embedding) and the final LayerNorm from the
    /// loss scaled by `grad_scale`: `d_resid` becomes the gradient of the last block's output.
    /// Tells `ready` the parameters that are final now.
    pub(super) fn head_backward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        grad_scale: f32,
        ready: &mut dyn FnMut(&mut ParamSet<D>, Range<usize>),
    ) {
        let logits_start = self.logits_start();
        let (cfg, lay, mp) = (&self.cfg, self.layout, self.mp);
        let Widths { h, vl, .. } = Widths::new(cfg, &mp);
        let num_params = self.params.info.len();
        let (lnf_w, _) = lay.lnf_params();
        self.params.ensure_grads(dev, lay.head()..lay.head() + 1);
        self.params.ensure_grads(dev, lnf_w..lnf_w + lay.norm_params);
        let (a, mut pass) = (
            &mut self.pool[index].1,
            Pass::plain((dev, tp), (&mut self.scratch, &mut self.heads), &self.cfg.arch, self.rope.as_ref()),
        );
        let r = a.rows;
        let hd = a.head.as_mut().expect("the last chunk has a head");
        let d = &mut a.grad;
        dev.cross_entropy_backward(
            &mut hd.logits,
            &hd.targets,
            Logits { rows: r.full, vocab: vl, vocab_start: logits_start },
            &hd.ce_max,
            &hd.ce_stats,
            grad_scale,
        );
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let g = &mut self.params.grads;
        let d_lnf = match tp.summa {
            None => {
                let lnf = hd.lnf.gemm_input();
                let (dl, dw) = (&mut d.d_h_full, &mut g[lay.head()]);
                dev.linear_backward(
                    Some(dl),
                    (dw, None),
                    &hd.logits,
                    lnf,
                    &p[lay.head()],
                    Gemm { rows: r.full, k: h, n: vl },
                );
                pass.reduced(&mut d.d_h_full, &mut d.d_h_local)
            }
            Some((s, _)) => {
                let (dl, dw, v) = (&mut d.d_h_full, &mut g[lay.head()], cfg.padded_vocab_size);
                s.logits_backward(dev, dl, dw, &hd.logits, &hd.lnf.out, &p[lay.head()], r.full, h, v, pass.sc);
                &d.d_h_full
            }
        };
        dev.fill(&mut d.d_resid, 0.0);
        let (lnf_w, lnf_b) = lay.lnf_params();
        let x_last = &a.resid[lay.num_layers];
        let gs = match lnf_b {
            Some(b) => {
                let (w, b) = pair_mut(g, lnf_w, b);
                (w, Some(b))
            }
            None => (&mut g[lnf_w], None),
        };
        pass.ln_backward(&mut d.d_resid, gs, d_lnf, (x_last, &p[lnf_w]), &hd.lnf, r.local, h);
        // The output layer (its own, or the last stage's tied copy) is final too; the first
        // stage's word embedding is final after the embedding backward.
        let end = if lay.head() == Layout::WTE { lnf_w + lay.norm_params } else { num_params };
        ready(&mut self.params, lnf_w..end);
    }
}

/// Sample-major labels `[b][t]` to the activations' row order `t * batch + b`.
fn reorder_to_rows(rows: &mut [u32], sample_major: &[u32], batch: usize, seq: usize) {
    assert_eq!(sample_major.len(), batch * seq);
    for b in 0..batch {
        for t in 0..seq {
            rows[t * batch + b] = sample_major[b * seq + t];
        }
    }
}
