//! One transformer block (pre-LayerNorm, causal multi-head attention, GELU MLP) of one
//! micro-batch: its forward, the activations its backward reads (kept from forward, or rebuilt
//! where recomputation or 16-bit storage dropped them), and its backward.

use super::activations::{GradBufs, LayerActs, Rows, SpareAttention, SpareLayer, Stash, Widths};
use super::tensor_parallel::{linear_in_backward, linear_in_forward, linear_out_backward, linear_out_forward};
use super::tensor_parallel::{ln_backward, ln_forward};
use crate::device::{AttentionShape, Device};
use crate::parallel::summa::Scratch;
use crate::parallel::tensor::TensorParallel;
use crate::real::Precision;
use crate::tensor::pair_mut;

/// Offsets of a layer's parameters inside the canonical order of `GptConfig::parameters`.
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const QKV_W: usize = 2;
const QKV_B: usize = 3;
const PROJ_W: usize = 4;
const PROJ_B: usize = 5;
const LN2_W: usize = 6;
const LN2_B: usize = 7;
const FC1_W: usize = 8;
const FC1_B: usize = 9;
const FC2_W: usize = 10;
const FC2_B: usize = 11;
pub(super) const PER_LAYER: usize = 12;

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
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
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
    let (h, f) = (wd.h, wd.f);
    ln_forward(dev, tp, sc, &mut la.ln1, &mut la.ln1_mean, &mut la.ln1_rstd, x_in, w(LN1_W), w(LN1_B), r.local, h);
    dev.round_to(&mut la.ln1, precision);
    linear_in_forward(dev, tp, sc, &mut la.qkv, (&la.ln1, &mut la.ln1_full), w(QKV_W), w(QKV_B), r, (h, 3 * h));
    dev.round_to(&mut la.qkv, precision);
    let (attn, lse) = match (&mut la.attn, &mut la.lse, attn_spare) {
        (Some(attn), Some(lse), _) => (attn, lse),
        (_, _, Some(spare)) => spare,
        _ => unreachable!("a layer without its attention output has a spare"),
    };
    dev.attention_forward(attn, lse, &la.qkv, shape);
    dev.round_to(attn, precision);
    let tmp = (&mut *tmp_full, &mut *tmp_local);
    linear_out_forward(dev, tp, sc, &mut la.resid_mid, x_in, attn, w(PROJ_W), w(PROJ_B), tmp, r, (h, h));
    dev.round_to(&mut la.resid_mid, precision);
    ln_forward(
        dev,
        tp,
        sc,
        &mut la.ln2,
        &mut la.ln2_mean,
        &mut la.ln2_rstd,
        &la.resid_mid,
        w(LN2_W),
        w(LN2_B),
        r.local,
        h,
    );
    dev.round_to(&mut la.ln2, precision);
    linear_in_forward(dev, tp, sc, &mut la.fc1, (&la.ln2, &mut la.ln2_full), w(FC1_W), w(FC1_B), r, (h, f));
    dev.round_to(&mut la.fc1, precision);
    dev.gelu_forward(&mut la.gelu, &la.fc1);
    dev.round_to(&mut la.gelu, precision);
    let Some(x_out) = x_out else { return };
    let tmp = (tmp_full, tmp_local);
    linear_out_forward(dev, tp, sc, x_out, &la.resid_mid, &la.gelu, w(FC2_W), w(FC2_B), tmp, r, (f, h));
    dev.round_to(x_out, precision);
}

/// The activations a layer's backward reads, with its attention output and log-sum-exp: those
/// `kept` from forward, or the chunk's spare set. Rebuilds what recomputation dropped into the
/// spare buffers: the whole layer from its input `x_in` (full), or the attention core from the
/// saved QKV (selective). Under 16-bit storage the layer's `stash` is restored into the spare
/// set first.
#[allow(clippy::too_many_arguments)]
pub(super) fn saved_layer<'a, 'w, D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    w: &dyn Fn(usize) -> &'w D::Buf,
    dims: Dims,
    x_in: &D::Buf,
    (kept, stash): (Option<&'a LayerActs<D::Buf>>, Option<Vec<Stash>>),
    (spare, spare_attention): (&'a mut SpareLayer<D::Buf>, &'a mut SpareAttention<D::Buf>),
    (tmp_full, tmp_local): (&mut D::Buf, &mut Option<D::Buf>),
) -> (&'a LayerActs<D::Buf>, &'a D::Buf, &'a D::Buf)
where
    D::Buf: 'w,
{
    let layer: &LayerActs<D::Buf> = match (kept, stash) {
        (Some(la), _) => la,
        (None, Some(stash)) => {
            let (_, sp) = spare.as_mut().expect("16-bit storage has a spare layer");
            sp.unstash(dev, &stash, dims.precision);
            sp
        }
        (None, None) => {
            let (_, sp) = spare.as_mut().expect("full recompute has a spare layer");
            layer_forward(dev, tp, sc, w, dims, x_in, None, sp, None, tmp_full, tmp_local);
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
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
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
    let (h, f) = (wd.h, wd.f);
    // MLP: d_resid holds the gradient of the block's output (this rank's rows).
    let gs = pair_mut(grads, FC2_W, FC2_B);
    let d_out = (&d.d_resid, &mut d.d_full);
    linear_out_backward(dev, tp, sc, &mut d.d_ffn, gs, d_out, &la.gelu, w(FC2_W), r, (f, h));
    dev.gelu_backward(&mut d.d_ffn2, &la.fc1, &d.d_ffn);
    {
        let gs = pair_mut(grads, FC1_W, FC1_B);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let ln2 = (&la.ln2, &la.ln2_full);
        let d_ln2 = linear_in_backward(dev, tp, sc, dh, gs, &d.d_ffn2, ln2, w(FC1_W), r, (h, f));
        let gs = pair_mut(grads, LN2_W, LN2_B);
        let (mean, rstd) = (&la.ln2_mean, &la.ln2_rstd);
        ln_backward(dev, tp, sc, &mut d.d_resid, gs, d_ln2, &la.resid_mid, w(LN2_W), mean, rstd, r.local, h);
    }
    // Attention: d_resid now holds the gradient of the mid-block residual.
    let gs = pair_mut(grads, PROJ_W, PROJ_B);
    let d_mid = (&d.d_resid, &mut d.d_full);
    linear_out_backward(dev, tp, sc, &mut d.d_attn, gs, d_mid, attn, w(PROJ_W), r, (h, h));
    dev.attention_backward(&mut d.d_qkv, &d.d_attn, &la.qkv, attn, lse, shape);
    {
        let gs = pair_mut(grads, QKV_W, QKV_B);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let ln1 = (&la.ln1, &la.ln1_full);
        let d_ln1 = linear_in_backward(dev, tp, sc, dh, gs, &d.d_qkv, ln1, w(QKV_W), r, (h, 3 * h));
        let gs = pair_mut(grads, LN1_W, LN1_B);
        let (mean, rstd) = (&la.ln1_mean, &la.ln1_rstd);
        ln_backward(dev, tp, sc, &mut d.d_resid, gs, d_ln1, x_in, w(LN1_W), mean, rstd, r.local, h);
    }
}
