//! One transformer block (pre-norm: LayerNorm or RMSNorm; causal multi-head or grouped-query
//! attention, with rotary positions where the model has them; GELU or SwiGLU MLP) of one
//! micro-batch: its forward, the activations its backward reads (kept from forward, or rebuilt
//! where recomputation or 16-bit storage dropped them), and its backward.

use super::activations::{GradBufs, LayerActs, Rows, SpareAttention, SpareLayer, Stash, Widths};
use super::dropout::LayerDropout;
use super::tensor_parallel::Pass;
use super::weight_pass::{LayerDeferred, WeightGrads, FC1, FC2, PROJ, QKV};
use crate::device::{AttentionShape, Device, Dropout, Matrix, Memory, Rotary};
use crate::model::{Arch, Normalization};
use crate::real::Precision;
use crate::tensor::pair_mut;

/// One op of a layer that has a weight and, in some architectures, a bias: their offsets among
/// the layer's parameters, in the canonical order of `GptConfig::parameters`.
#[derive(Clone, Copy, Debug)]
struct Op {
    weight: usize,
    bias: Option<usize>,
}

impl Op {
    /// The op's weight and bias gradients among the layer's `grads`.
    fn grads<B>(self, grads: &mut [B]) -> (&mut B, Option<&mut B>) {
        match self.bias {
            Some(b) => {
                let (w, b) = pair_mut(grads, self.weight, b);
                (w, Some(b))
            }
            None => (&mut grads[self.weight], None),
        }
    }
}

/// Where each op's parameters sit among a layer's, for the model's architecture: the norms have
/// a bias under LayerNorm, the linear layers unless `--disable-bias-linear`.
#[derive(Clone, Copy, Debug)]
pub(super) struct LayerOps {
    ln1: Op,
    qkv: Op,
    proj: Op,
    ln2: Op,
    fc1: Op,
    fc2: Op,
    /// Parameters per layer.
    pub(super) count: usize,
}

impl LayerOps {
    /// The (weight, bias) offsets of each op, for passes outside this file (generation).
    pub(super) fn ln1_params(&self) -> (usize, Option<usize>) {
        (self.ln1.weight, self.ln1.bias)
    }
    pub(super) fn qkv_params(&self) -> (usize, Option<usize>) {
        (self.qkv.weight, self.qkv.bias)
    }
    pub(super) fn proj_params(&self) -> (usize, Option<usize>) {
        (self.proj.weight, self.proj.bias)
    }
    pub(super) fn ln2_params(&self) -> (usize, Option<usize>) {
        (self.ln2.weight, self.ln2.bias)
    }
    pub(super) fn fc1_params(&self) -> (usize, Option<usize>) {
        (self.fc1.weight, self.fc1.bias)
    }
    pub(super) fn fc2_params(&self) -> (usize, Option<usize>) {
        (self.fc2.weight, self.fc2.bias)
    }

    pub(super) fn new(arch: &Arch) -> LayerOps {
        let mut next = 0;
        let mut op = |bias: bool| {
            let weight = next;
            next += 1 + usize::from(bias);
            Op { weight, bias: bias.then_some(weight + 1) }
        };
        let (norm_bias, bias) = (arch.normalization == Normalization::LayerNorm, arch.add_bias_linear);
        let (ln1, qkv, proj, ln2, fc1, fc2) = (op(norm_bias), op(bias), op(bias), op(norm_bias), op(bias), op(bias));
        LayerOps { ln1, qkv, proj, ln2, fc1, fc2, count: next }
    }
}

/// The sizes one layer's forward and backward work with, and the architecture's choices.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub(super) rows: Rows,
    pub(super) shape: AttentionShape,
    pub(super) wd: Widths,
    /// Where activations are rounded to under mixed precision.
    pub(super) precision: Precision,
    pub(super) ops: LayerOps,
    pub(super) swiglu: bool,
    /// The GELU's form where the MLP is not SwiGLU.
    pub(super) gelu: crate::device::Gelu,
    /// Rotary positions (the table is the pass's `rope`).
    pub(super) rotary: Option<Rotary>,
    /// This layer's dropouts in a training forward (and its backward and recomputation).
    pub(super) dropout: LayerDropout,
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
    let Dims { rows: r, shape, wd, precision, ops, .. } = dims;
    let (h, dev) = (wd.h, p.dev);
    let wb = |op: Op| (w(op.weight), op.bias.map(w));
    p.ln_forward(&mut la.ln1, x_in, wb(ops.ln1), r.local, h);
    dev.round_to(&mut la.ln1.out, precision);
    p.linear_in_forward(&mut la.qkv, &mut la.ln1, wb(ops.qkv), r, (h, wd.qkv));
    dev.round_to(&mut la.qkv, precision);
    if let (Some(rotary), Some(table)) = (dims.rotary, p.rope) {
        dev.rope_forward(&mut la.qkv, table, shape, rotary);
        dev.round_to(&mut la.qkv, precision);
    }
    let (attn, lse) = match (&mut la.attn, &mut la.lse, attn_spare) {
        (Some(attn), Some(lse), _) => (attn, lse),
        (_, _, Some(spare)) => spare,
        _ => unreachable!("a layer without its attention output has a spare"),
    };
    p.attention_forward((&mut *attn, &mut *lse), &la.qkv, shape, dims.dropout.attention.as_ref(), precision);
    dev.round_to(attn, precision);
    let tmp = (&mut *tmp_full, &mut *tmp_local);
    let drop = dims.dropout.attention_out.as_ref();
    p.linear_out_forward(&mut la.resid_mid, x_in, attn, wb(ops.proj), tmp, drop, r, (wd.attn, h));
    dev.round_to(&mut la.resid_mid, precision);
    p.ln_forward(&mut la.ln2, &la.resid_mid, wb(ops.ln2), r.local, h);
    dev.round_to(&mut la.ln2.out, precision);
    p.linear_in_forward(&mut la.fc1, &mut la.ln2, wb(ops.fc1), r, (h, wd.fc1));
    dev.round_to(&mut la.fc1, precision);
    if dims.swiglu {
        dev.swiglu_forward(&mut la.gelu, &la.fc1, r.full, wd.fl);
    } else {
        dev.gelu_forward(&mut la.gelu, &la.fc1, dims.gelu);
    }
    dev.round_to(&mut la.gelu, precision);
    let Some(x_out) = x_out else { return };
    let tmp = (tmp_full, tmp_local);
    let drop = dims.dropout.mlp_out.as_ref();
    p.linear_out_forward(x_out, &la.resid_mid, &la.gelu, wb(ops.fc2), tmp, drop, r, (wd.f, h));
    dev.round_to(x_out, precision);
}

/// What forward left of a layer for its backward: the activations it kept, or its 16-bit copy.
pub(super) type Saved<'a, 's, D> = (Option<&'a LayerActs<<D as Memory>::Buf>>, Option<&'s [Stash<D>]>);

/// What recomputation rebuilds: a whole layer into the spare set, or the attention core's output
/// and log-sum-exp from the saved QKV.
pub(super) enum Redo<'r, B> {
    Layer(&'r mut LayerActs<B>),
    Attention { out: &'r mut B, lse: &'r mut B, qkv: &'r B },
}

/// The activations a layer's backward reads, with its attention output and log-sum-exp: those
/// `kept` from forward, or the chunk's spare set. Rebuilds what recomputation dropped into the
/// spare buffers with `recompute`: the whole layer (full: its forward from its input), or the
/// attention core from the saved QKV (selective). Under 16-bit storage the layer's `stash` is
/// restored into the spare set first.
pub(super) fn saved_layer<'a, D: Device>(
    dev: &D,
    dims: Dims,
    (kept, stash): Saved<'a, '_, D>,
    (spare, spare_attention): (&'a mut SpareLayer<D::Buf>, &'a mut SpareAttention<D::Buf>),
    mut recompute: impl FnMut(Redo<'_, D::Buf>),
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
            recompute(Redo::Layer(&mut *sp));
            sp
        }
    };
    match (layer.attn.as_ref(), layer.lse.as_ref()) {
        (Some(attn), Some(lse)) => (layer, attn, lse),
        _ => {
            let (_, attn, lse) = spare_attention.as_mut().expect("selective recompute has a spare attention");
            recompute(Redo::Attention { out: &mut *attn, lse: &mut *lse, qkv: &layer.qkv });
            dev.round_to(attn, dims.precision);
            (layer, &*attn, &*lse)
        }
    }
}

/// One transformer block's backward from `d.d_resid`, the gradient of the block's output (this
/// rank's rows), which becomes the gradient of its input `x_in`. `saved` is what `saved_layer`
/// returns; the layer's parameter gradients (`grads`, in the order of the offsets above) are
/// added to, or with `defer` (a zero-bubble schedule's B pass) those of its linear layers are
/// left to `layer_weight_backward`, their operands kept in `defer`.
#[allow(clippy::too_many_arguments)]
pub(super) fn layer_backward<'w, D: Device>(
    p: &mut Pass<D>,
    w: &dyn Fn(usize) -> &'w D::Buf,
    grads: &mut [D::Buf],
    dims: Dims,
    x_in: &D::Buf,
    (la, attn, lse): (&LayerActs<D::Buf>, &D::Buf, &D::Buf),
    d: &mut GradBufs<D::Buf>,
    mut defer: Option<&mut LayerDeferred<D::Buf>>,
) where
    D::Buf: 'w,
{
    let Dims { rows: r, shape, wd, ops, precision, .. } = dims;
    let (h, dev) = (wd.h, p.dev);
    // MLP: d_resid holds the gradient of the block's output (this rank's rows).
    let gs = weight_grads(grads, &mut defer, ops.fc2, FC2);
    let d_branch =
        branch_gradient(dev, (&d.d_resid, &mut d.d_drop), dims.dropout.mlp_out.as_ref(), (r.local, precision));
    p.linear_out_backward(&mut d.d_ffn, gs, (d_branch, &mut d.d_full), &la.gelu, w(ops.fc2.weight), r, (wd.f, h));
    if dims.swiglu {
        dev.swiglu_backward(&mut d.d_ffn2, &la.fc1, &d.d_ffn, r.full, wd.fl);
    } else {
        dev.gelu_backward(&mut d.d_ffn2, &la.fc1, &d.d_ffn, dims.gelu);
    }
    {
        let gs = weight_grads(grads, &mut defer, ops.fc1, FC1);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let d_ln2 = p.linear_in_backward(dh, gs, &d.d_ffn2, &la.ln2, w(ops.fc1.weight), r, (h, wd.fc1));
        let gs = ops.ln2.grads(grads);
        let inp = (&la.resid_mid, w(ops.ln2.weight));
        p.ln_backward(&mut d.d_resid, gs, d_ln2, inp, &la.ln2, r.local, h);
    }
    // Attention: d_resid now holds the gradient of the mid-block residual.
    let gs = weight_grads(grads, &mut defer, ops.proj, PROJ);
    let drop = dims.dropout.attention_out.as_ref();
    let d_branch = branch_gradient(dev, (&d.d_resid, &mut d.d_drop), drop, (r.local, precision));
    p.linear_out_backward(&mut d.d_attn, gs, (d_branch, &mut d.d_full), attn, w(ops.proj.weight), r, (wd.attn, h));
    let drop = dims.dropout.attention.as_ref();
    p.attention_backward(&mut d.d_qkv, &d.d_attn, (&la.qkv, attn, lse), shape, drop, precision);
    if let (Some(rotary), Some(table)) = (dims.rotary, p.rope) {
        dev.rope_backward(&mut d.d_qkv, table, shape, rotary);
    }
    {
        let gs = weight_grads(grads, &mut defer, ops.qkv, QKV);
        let dh = (&mut d.d_h_full, &mut d.d_h_local);
        let d_ln1 = p.linear_in_backward(dh, gs, &d.d_qkv, &la.ln1, w(ops.qkv.weight), r, (h, wd.qkv));
        let gs = ops.ln1.grads(grads);
        p.ln_backward(&mut d.d_resid, gs, d_ln1, (x_in, w(ops.ln1.weight)), &la.ln1, r.local, h);
    }
}

/// Where the gradients of the linear op `op` (slot `slot` of a block's deferred W passes) go:
/// into `grads` now, or left for the W pass in `defer`.
fn weight_grads<'g, B>(
    grads: &'g mut [B],
    defer: &'g mut Option<&mut LayerDeferred<B>>,
    op: Op,
    slot: usize,
) -> WeightGrads<'g, B> {
    match defer {
        Some(deferred) => WeightGrads::Later(&mut deferred[slot]),
        None => {
            let (w, b) = op.grads(grads);
            WeightGrads::Now(w, b)
        }
    }
}

/// A block's W pass: the weight and bias gradients of its four linear layers (`grads`, in the
/// order of the offsets above) from what its B pass kept in `deferred`, and the layer's saved
/// activations `la` where B did not copy the inputs.
pub(super) fn layer_weight_backward<'w, D: Device>(
    dev: &D,
    w: &dyn Fn(usize) -> &'w D::Buf,
    grads: &mut [D::Buf],
    ops: LayerOps,
    deferred: &LayerDeferred<D::Buf>,
    la: Option<&LayerActs<D::Buf>>,
) where
    D::Buf: 'w,
{
    // The inputs B multiplied.
    let inputs: [Option<&D::Buf>; 4] = match la {
        Some(la) => [Some(la.ln1.gemm_input()), la.attn.as_ref(), Some(la.ln2.gemm_input()), Some(&la.gelu)],
        None => [None; 4],
    };
    for (slot, op) in [(QKV, ops.qkv), (PROJ, ops.proj), (FC1, ops.fc1), (FC2, ops.fc2)] {
        deferred[slot].add_grads(dev, op.grads(grads), w(op.weight), inputs[slot]);
    }
}

/// The gradient of a residual branch's output from the residual's, `d_resid` (this rank's
/// `rows`): itself, or through the branch's dropout into `d_drop` (made at the first use, in
/// `d_resid`'s storage `precision`, as the collectives that gather it need).
fn branch_gradient<'b, D: Device>(
    dev: &D,
    (d_resid, d_drop): (&'b D::Buf, &'b mut Option<D::Buf>),
    dropout: Option<&Dropout>,
    (rows, precision): (usize, Precision),
) -> &'b D::Buf {
    let Some(dr) = dropout else { return d_resid };
    let len = dev.len(d_resid);
    let buf = d_drop.get_or_insert_with(|| dev.alloc_in(len, precision));
    dev.copy(buf, 0, d_resid, 0, len);
    dev.dropout(buf, dr, Matrix { rows, cols: len / rows });
    buf
}
