//! Megatron's dropouts on a chunk: the embeddings' sum and each block's two residual branches
//! (`--hidden-dropout`) and the attention probabilities (`--attention-dropout`), in training
//! forwards only. Each call's mask is `device::dropout`'s, placed in the iteration's whole tensor
//! from the micro-batch, this rank's batch block, positions and columns or heads, so that every
//! layout draws the masks of one rank.

use super::activations::Widths;
use super::Gpt;
use crate::device::dropout::{Dropout, Site};
use crate::device::Device;
use crate::parallel::context::ContextSplit;

/// The dropout probabilities of a run and the seed its masks are drawn under.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DropoutRates {
    /// `--hidden-dropout`: the embeddings and the residual branches.
    pub hidden: f32,
    /// `--attention-dropout`: the attention probabilities.
    pub attention: f32,
    pub seed: u64,
}

/// Where a training step's masks are drawn: its iteration, and where this rank's micro-batches
/// sit in the global batch (micro-batch `m` starts at sample `m · micro_stride + first`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutStep {
    pub iteration: u64,
    pub micro_stride: u64,
    pub first: u64,
}

/// The dropouts of one block of one micro-batch (None where nothing drops).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LayerDropout {
    pub(super) attention: Option<Dropout>,
    pub(super) attention_out: Option<Dropout>,
    pub(super) mlp_out: Option<Dropout>,
}

impl<D: Device> Gpt<D> {
    /// The run's dropout probabilities (none until set).
    pub fn set_dropout(&mut self, rates: DropoutRates) {
        assert!((0.0..1.0).contains(&rates.hidden) && (0.0..1.0).contains(&rates.attention));
        self.dropout = rates;
    }

    /// The training step the next forwards and backwards belong to, or None (evaluation,
    /// generation: nothing drops).
    pub fn set_dropout_step(&mut self, step: Option<DropoutStep>) {
        self.dropout_step = step;
    }

    /// The dropout at `site` of global layer `layer` for activation set `index`.
    pub(super) fn dropout_at(&self, index: usize, layer: usize, site: Site) -> Option<Dropout> {
        let step = self.dropout_step?;
        let p = if site == Site::Attention { self.dropout.attention } else { self.dropout.hidden };
        if p == 0.0 {
            return None;
        }
        let (micro, set) = (&self.pool[index].0, &self.pool[index].1);
        let micro = micro.expect("a training forward's activation set belongs to a micro-batch") as u64;
        let r = set.rows;
        let wd = Widths::new(&self.cfg, &self.mp);
        let column_block = self.mp.summa.map_or(self.mp.tp_rank, |c| c.col);
        // Under context parallelism a rank's positions are two chunks of the whole sequence (the
        // hidden sites' rows jump between them); the attention's are numbered over the whole
        // sequence and this rank's heads (the swap of a2a moves its block of them further on:
        // `model::gpt::context`; the blocks of the other types place their positions).
        let split = self.mp.context;
        let (t0, width, col0, jump) = match site {
            Site::Attention => (0, self.cfg.num_attention_heads, column_block * wd.heads, None),
            _ => {
                let (t0, jump) = context_positions(split, r.seq, r.t0);
                (t0, self.cfg.hidden_size, self.mp.summa.map_or(0, |c| c.col * wd.hr), jump)
            }
        };
        Some(Dropout {
            p,
            key: crate::rng::key(self.dropout.seed, "dropout"),
            place: u32::try_from(4 * layer + site as usize).expect("layers fit the counter"),
            iteration: step.iteration as u32,
            sample0: micro * step.micro_stride + step.first + r.first_sample as u64,
            batch: r.sub_batch,
            seq: r.seq * split.size,
            t0,
            width,
            col0,
            jump,
        })
    }

    /// The dropouts of this chunk's layer `l` for activation set `index`.
    pub(super) fn layer_dropout(&self, index: usize, l: usize) -> LayerDropout {
        let layer = self.plan.layers.start + l;
        LayerDropout {
            attention: self.dropout_at(index, layer, Site::Attention),
            attention_out: self.dropout_at(index, layer, Site::AttentionOut),
            mlp_out: self.dropout_at(index, layer, Site::MlpOut),
        }
    }
}

/// The whole-sequence position of the first of a buffer's rows that starts at local position
/// `first` of a rank holding `local_seq` positions (`split`), and where its positions jump from
/// the rank's first chunk to its second (`Dropout::jump`).
fn context_positions(split: ContextSplit, local_seq: usize, first: usize) -> (usize, Option<(usize, usize)>) {
    if split.size == 1 {
        return (first, None);
    }
    let l = local_seq / 2;
    let (a, b) = (split.chunk(0), split.chunk(1));
    match first < l {
        true => (a * l + first, Some((l - first, (b - a - 1) * l))),
        false => (b * l + first - l, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_parallel_ranks_rows_jump_to_its_second_chunk() {
        // C = 2, 8 local positions (chunks of 4 of a sequence of 16): rank 0 holds 0..4 and 12..16.
        let r0 = ContextSplit { size: 2, rank: 0 };
        assert_eq!(context_positions(r0, 8, 0), (0, Some((4, 8))));
        // An SP shard from local position 2 (6 rows): 2, 3, then 12, 13, 14, 15.
        assert_eq!(context_positions(r0, 8, 2), (2, Some((2, 8))));
        assert_eq!(context_positions(r0, 8, 4), (12, None));
        // Rank 1 holds 4..8 and 8..12: the jump is 0.
        assert_eq!(context_positions(ContextSplit { size: 2, rank: 1 }, 8, 0), (4, Some((4, 0))));
        assert_eq!(context_positions(ContextSplit::single(), 8, 3), (3, None));
        for rank in 0..4 {
            let s = ContextSplit { size: 4, rank };
            let (t0, jump) = context_positions(s, 8, 0);
            for t in 0..8 {
                let p = t0 + t + jump.filter(|&(at, _)| t >= at).map_or(0, |(_, by)| by);
                assert_eq!(p, s.position(8, t), "rank {rank} position {t}");
            }
        }
    }
}
