//! One transformer block (pre-LayerNorm, causal multi-head attention, GELU MLP) of one
//! micro-batch: its forward, the activations its backward reads (kept from forward, or rebuilt
//! where recomputation or 16-bit storage dropped them), and its backward.

use super::activations::{GradBufs, LayerActs, Rows, SpareAttention, SpareLayer, Stash, Widths};
use super::tensor_parallel::Pass;
use crate::device::{AttentionShape, Device};
use crate::real::Precision;
use crate::tensor::pair_mut;

/// One op of a layer that has a weight and a bias: their offsets among the layer's parameters, in
/// the canonical order of `GptConfig::parameters`.
#[derive(Clone, Copy)]
struct Op {
    weight: usize,
    bias: usize,
}

const LN1: Op = Op { weight: 0, bias: 1 };
const QKV: Op = Op { weight: 2, bias: 3 };
const PROJ: Op = Op { weight: 4, bias: 5 };
const LN2: Op = Op { weight: 6, bias: 7 };
const FC1: Op = Op { weight: 8, bias: 9 };
const FC2: Op = Op { weight: 10, bias: 11 };
/// Parameters per layer.
pub(super) const PER_LAYER: usize = 12;

impl Op {
    /// The op's weight and bias gradients among the layer's `grads`.
    fn grads<B>(self, grads: &mut [B]) -> (&mut B, &mut B) {
        pair_mut(grads, self.weight, self.bias)
    }
}

/// The sizes one layer's forward and backward work with.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub(super) rows: Rows,
    pub(super) shape: AttentionShape,
    pub(super) wd: Widths,
    /// Where activations are rounded to under mixed precision.
    pub(super) precision: Precision,
}

/// One transformer block's forward from `x_in`, saving what backward needs into `la` (and the
/// attention output into `attn_spare` when `la` does not keep it). Writes the block's output to
/// `x_out` unless it is None (recomputation, where the output is already known).
#[allow(clippy::too_many_arguments)]
pub(super) fn layer_forward<'w, D: Device>(
    p: &mut Pass<D>,
    w: &dyn Fn(usize) -> &'w D::Buf,
    dims: Dims,
    x_in: &D::Buf,
    x_out: Option<&mut D::Buf>,
    la: &mut LayerActs<D::Buf>,
    attn_spare: Option<(&mut D::Buf, &mut D::Buf)>,
    tmp_full: &mut D::Buf,
    tmp_local: &mut Option<D::Buf>,
) where
    D::Buf: 'w,
{
    let Dims { rows: r, shape, wd, precision } = dims;
    let (h, f, dev) = (wd.h, wd.f, p.dev);
    let wb = |op: Op| (w(op.weight), w(op.bias));
    p.ln_forward(&mut la.ln1, x_in, wb(LN1), r.local, h);
    dev.round_to(&mut la.ln1.out, precision);
    p.linear_in_forward(&mut la.qkv, &mut la.ln1, wb(QKV), r, (h, 3 * h));
    dev.round_to(&mut la.qkv, precision);
    let (attn, lse) = match (&mut la.attn, &mut la.lse, attn_spare) {
        (Some(attn), Some(lse), _) => (attn, lse),
        (_, _, Some(spare)) => spare,
        _ => unreachable!("a layer without its attention output has a spare"),
    };
    dev.attention_forward(attn, lse, &la.qkv, shape);
    dev.round_to(attn, precision);
    let tmp = (&mut *tmp_full, &mut *tmp_local);
    p.linear_out_forward(&mut la.resid_mid, x_in, attn, wb(PROJ), tmp, r, (h, h));
    dev.round_to(&mut la.resid_mid, precision);
    p.ln_forward(&mut la.ln2, &la.resid_mid, wb(LN2), r.local, h);
    dev.round_to(&mut la.ln2.out, precision);
    p.linear_in_forward(&mut la.fc1, &mut la.ln2, wb(FC1), r, (h, f));
    dev.round_to(&mut la.fc1, precision);
    dev.gelu_forward(&mut la.gelu, &la.fc1);
    dev.round_to(&mut la.gelu, precision);
    let Some(x_out) = x_out else { return };
    let tmp = (tmp_full, tmp_local);
    p.linear_out_forward(x_out, &la.resid_mid, &la.gelu, wb(FC2), tmp, r, (f, h));
    dev.round_to(x_out, precision);
}

/// What forward left of a layer for its backward: the activations it kept, or its 16-bit copy.
pub(super) type Saved<'a, 's, D> = (Option<&'a LayerActs<<D as Device>::Buf>>, Option<&'s [Stash<D>]>);

/// The activations a layer's backward reads, with its attention output and log-sum-exp: those
/// `kept` from forward, or the chunk's spare set. Rebuilds what recomputation dropped into the
/// spare buffers: the whole layer (full: `recompute` runs its forward from its input), or the
/// attention core from the saved QKV (selective). Under 16-bit storage the layer's `stash` is
/// restored into the spare set first.
pub(super) fn saved_layer<'a, D: Device>(
    dev: &D,
    dims: Dims,
    (kept, stash): Saved<'a, '_, D>,
    (spare, spare_attention): (&'a mut SpareLayer<D::Buf>, &'a mut SpareAttention<D::Buf>),
    recompute: impl FnOnce(&mut LayerActs<D::Buf>),
) -> (&'a LayerActs<D::Buf>, &'a D::Buf, &'a D::Buf) {
    let layer: &LayerActs<D::Buf> = match (kept, stash) {
        (Some(la), _) => la,
        (None, Some(stash)) => {
            let (_, sp) = spare.as_mut().expect("16-bit storage has a spare layer");
            sp.unstash(dev, stash, dims.precision);
            sp
        }
        (None, None) => {
            let (_, sp) = spare.as_mut().expect("full recompute has a spare layer");
            recompute(sp);
            sp
        }
    };
    match (layer.attn.as_ref(), layer.lse.as_ref()) {
        (Some(attn), Some(lse)) => (layer, attn, lse),
        _ => {
            let (_, attn, lse) = spare_attention.as_mut().expect("selective recompute has a spare attention");
            dev.attention_forward(attn, lse, &layer.qkv, dims.shape);
            dev.round_to(attn, dims.precision);
            (layer, &*attn, &*lse)
        }
    }
}

/// One transformer block's backward from `d.d_resid`, the gradient of the block's output (this
/// rank's rows), which becomes the gradient of its input `x_in`. `saved` is what `saved_layer`
/// returns; the layer's parameter gradients (`grads`, in the order of the offsets above) are
/// added to.
#[allow(clippy::too_many_arguments)]
pub(super) fn layer_backward<'w, D: Device>(
    p: &mut Pass<D>,
    w: &dyn Fn(usize) -> &'w D::Buf,
    grads: &mut [D::Buf],
    dims: Dims,
    x_in: &D::Buf,
    (la, attn, lse): (&LayerActs<D::Buf>, &D::Buf, &D::Buf),
    d: &mut GradBufs<D::Buf>,
) where
    D::Buf: 'w,
{
    let Dims { rows: r, shape, wd, .. } = dims;
    let (h, f, dev) = (wd.h, wd.f, p.dev);
    // MLP: d_resid holds the gradient of the block's output (this rank's rows).
    let gs = FC2.grads(grads);
    let d_out = (&d.d_resid, &mut d.d_full);
    p.linear_out_backward(&mut d.d_ffn, gs, d_out, &la.gelu, w(FC2.weight), r, (f, h));
    dev.gelu_backward(&mut d.d_ffn2, &la.fc1, &d.d_ffn);
    {
        let gs = FC1.grads(grads);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let d_ln2 = p.linear_in_backward(dh, gs, &d.d_ffn2, &la.ln2, w(FC1.weight), r, (h, f));
        let gs = LN2.grads(grads);
        let inp = (&la.resid_mid, w(LN2.weight));
        p.ln_backward(&mut d.d_resid, gs, d_ln2, inp, &la.ln2, r.local, h);
    }
    // Attention: d_resid now holds the gradient of the mid-block residual.
    let gs = PROJ.grads(grads);
    let d_mid = (&d.d_resid, &mut d.d_full);
    p.linear_out_backward(&mut d.d_attn, gs, d_mid, attn, w(PROJ.weight), r, (h, h));
    dev.attention_backward(&mut d.d_qkv, &d.d_attn, &la.qkv, attn, lse, shape);
    {
        let gs = QKV.grads(grads);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let d_ln1 = p.linear_in_backward(dh, gs, &d.d_qkv, &la.ln1, w(QKV.weight), r, (h, 3 * h));
        let gs = LN1.grads(grads);
        p.ln_backward(&mut d.d_resid, gs, d_ln1, (x_in, w(LN1.weight)), &la.ln1, r.local, h);
    }
}
