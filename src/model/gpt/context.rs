//! A block's attention core where the context-parallel group splits each sequence: this rank's
//! fused QKV rows (its two chunks of every sample) swapped for every position of its block of
//! heads (`parallel::context::to_heads`), the Device's causal attention over the whole sequence
//! on those heads, and the output swapped back. The log-sum-exp stays in the heads layout (its
//! length is the same), which is all backward needs besides the swapped QKV, output and output
//! gradient, swapped again from what the layer saved (the activations kept are this rank's rows
//! only). Without context parallelism these are the Device's ops.

use super::activations::ContextScratch;
use super::tensor_parallel::Pass;
use super::Gpt;
use crate::comm::Comm;
use crate::device::{AttentionShape, Device, Dropout};
use crate::parallel::context::{ensure, ensure_like, to_heads, to_positions, CpCommType, SwapShape};
use crate::parallel::{context_gather, context_ring};
use crate::real::Precision;

impl<D: Device> Pass<'_, D> {
    /// Causal attention of this rank's rows: `out` ([rows, heads · head_dim]) and `lse` from
    /// `qkv`, as `AttentionOps::attention_forward` computes them over whole sequences.
    pub(super) fn attention_forward(
        &mut self,
        (out, lse): (&mut D::Buf, &mut D::Buf),
        qkv: &D::Buf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        precision: Precision,
    ) {
        let Some((cp, kind)) = self.tp.context else {
            return self.dev.attention_forward(out, lse, qkv, shape, dropout, self.documents);
        };
        let dev = self.dev;
        let ContextScratch { heads: h, blocks } = &mut *self.heads;
        match kind {
            CpCommType::AllGather => {
                return context_gather::forward(dev, cp, (out, lse), qkv, (shape, dropout), (&mut h.gathered, blocks))
            }
            CpCommType::P2p => return context_ring::forward(dev, cp, (out, lse), qkv, (shape, dropout), blocks),
            _ => {}
        }
        let (swap_group, ring, wide, dropout) = swap_levels(cp, self.tp.context_levels, shape, dropout);
        let dropout = dropout.as_ref();
        let rows = shape.rows();
        let q = ensure(dev, &mut h.qkv, rows * shape.qkv_width(), precision);
        to_heads(dev, swap_group, qkv, q, swap(shape, shape.qkv_width()), &mut h.exchange);
        let o = ensure(dev, &mut h.out, rows * shape.width(), precision);
        debug_assert_eq!(dev.len(lse), wide.batch * wide.heads * wide.seq);
        match ring {
            Some(outer) => context_ring::forward(dev, outer, (o, lse), q, (wide, dropout), blocks),
            None => dev.attention_forward(o, lse, q, wide, dropout, None),
        }
        dev.round_to(o, precision);
        to_positions(dev, swap_group, o, out, swap(shape, shape.width()), &mut h.exchange);
    }

    /// `dqkv` (overwrite) from `dout`, as `AttentionOps::attention_backward`; `out` and `lse` are
    /// what `attention_forward` above wrote.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_backward(
        &mut self,
        dqkv: &mut D::Buf,
        dout: &D::Buf,
        (qkv, out, lse): (&D::Buf, &D::Buf, &D::Buf),
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        precision: Precision,
    ) {
        let Some((cp, kind)) = self.tp.context else {
            return self.dev.attention_backward(dqkv, dout, qkv, out, lse, shape, dropout, self.documents);
        };
        let dev = self.dev;
        let ContextScratch { heads: h, blocks } = &mut *self.heads;
        let saved = (qkv, out, lse);
        match kind {
            CpCommType::AllGather => {
                return context_gather::backward(
                    dev,
                    cp,
                    dqkv,
                    dout,
                    saved,
                    (shape, dropout),
                    (&mut h.gathered, blocks),
                )
            }
            CpCommType::P2p => return context_ring::backward(dev, cp, dqkv, dout, saved, (shape, dropout), blocks),
            _ => {}
        }
        let (swap_group, ring, wide, dropout) = swap_levels(cp, self.tp.context_levels, shape, dropout);
        let dropout = dropout.as_ref();
        let (rows, qw, aw) = (shape.rows(), shape.qkv_width(), shape.width());
        let q = ensure(dev, &mut h.qkv, rows * qw, precision);
        to_heads(dev, swap_group, qkv, q, swap(shape, qw), &mut h.exchange);
        let o = ensure(dev, &mut h.out, rows * aw, precision);
        to_heads(dev, swap_group, out, o, swap(shape, aw), &mut h.exchange);
        let d_o = ensure_like(dev, &mut h.dout, dout, rows * aw);
        to_heads(dev, swap_group, dout, d_o, swap(shape, aw), &mut h.exchange);
        let dq = ensure_like(dev, &mut h.dqkv, dqkv, rows * qw);
        match ring {
            Some(outer) => context_ring::backward(dev, outer, dq, d_o, (q, o, lse), (wide, dropout), blocks),
            None => dev.attention_backward(dq, d_o, q, o, lse, wide, dropout, None),
        }
        to_positions(dev, swap_group, dq, dqkv, swap(shape, qw), &mut h.exchange);
    }
}

/// The group the heads swap over (a2a: the whole group; a2a+p2p: its inner group `levels[0]`),
/// the ring's group where one follows (a2a+p2p's outer group, over each inner group's runs of
/// chunks, which are the ring's split of it: `parallel::context`), the shape of this rank's
/// heads after the swap, and the attention dropout of those heads (their block sits
/// `rank · heads` further on).
fn swap_levels<'c>(
    cp: &'c dyn Comm,
    levels: Option<[&'c dyn Comm; 2]>,
    shape: AttentionShape,
    dropout: Option<&Dropout>,
) -> (&'c dyn Comm, Option<&'c dyn Comm>, AttentionShape, Option<Dropout>) {
    let (group, ring) = levels.map_or((cp, None), |[inner, outer]| (inner, Some(outer)));
    let wide = whole_sequences(shape, group);
    let dropout = dropout.map(|d| Dropout { col0: d.col0 + group.rank() * wide.heads, ..*d });
    (group, ring, wide, dropout)
}

/// The attention shape of this rank's heads over whole sequences.
fn whole_sequences(shape: AttentionShape, cp: &dyn Comm) -> AttentionShape {
    let c = cp.size();
    AttentionShape { seq: shape.seq * c, heads: shape.heads / c, kv_heads: shape.kv_heads / c, ..shape }
}

/// The swap of rows `width` wide of this rank's positions.
fn swap(shape: AttentionShape, width: usize) -> SwapShape {
    SwapShape { batch: shape.batch, local_seq: shape.seq, width }
}

impl<D: Device> Gpt<D> {
    /// Under context parallelism, the rotary table of this rank's `seq` positions of each
    /// sequence (row `t` holds the angles of `ContextSplit::position(seq, t)`), made when `seq`
    /// changes; nothing otherwise.
    pub(super) fn place_rope(&mut self, dev: &D, seq: usize) {
        let split = self.mp.context;
        if split.size == 1 || self.rope.is_none() || self.rope_seq == seq {
            return;
        }
        let positions = (0..seq).map(|t| split.position(seq, t));
        let table = self.cfg.arch.rotary_table_at(self.cfg.head_dim(), positions);
        let mut buf = dev.alloc(table.len());
        dev.upload(&mut buf, &table);
        (self.rope, self.rope_seq) = (Some(buf), seq);
    }
}
