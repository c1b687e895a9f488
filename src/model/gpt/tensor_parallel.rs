//! The parallel points of a layer, each a small function that does Megatron's 1-D communication
//! (all-gather / reduce-scatter under sequence parallelism, all-reduce otherwise) or calls
//! `parallel::summa` under 2-D / 2.5-D, so one forward and one backward serve every layout: the
//! LayerNorm, the linear layers that read a LayerNorm output (QKV, fc1) and those that write back
//! into the residual stream (projection, fc2); and the counters of what a layer's groups moved.

use super::activations::Rows;
use crate::comm::CommCounters;
use crate::device::Device;
use crate::parallel::summa::Scratch;
use crate::parallel::tensor::{all_gather, all_reduce, reduce_scatter, TensorParallel};

/// The all-rows view of a LayerNorm output: its all-gather under sequence parallelism, itself
/// otherwise.
pub(super) fn gathered<'a, D: Device>(
    dev: &D,
    tp: TensorParallel,
    local: &'a D::Buf,
    full: &'a mut Option<D::Buf>,
) -> &'a D::Buf {
    match full {
        Some(f) => {
            all_gather(dev, tp.comm, local, f);
            f
        }
        None => local,
    }
}

/// Reduces the partial sums of a row-parallel layer over the group: reduce-scatter to this rank's
/// rows under sequence parallelism, all-reduce otherwise. Returns the reduced rows.
pub(super) fn reduced<'a, D: Device>(
    dev: &D,
    tp: TensorParallel,
    full: &'a mut D::Buf,
    local: &'a mut Option<D::Buf>,
) -> &'a D::Buf {
    match local {
        Some(l) => {
            reduce_scatter(dev, tp.comm, full, l);
            l
        }
        None => {
            all_reduce(dev, tp.comm, full);
            full
        }
    }
}

/// LayerNorm of this rank's residual rows: whole rows under 1-D, the hidden dimension split along
/// the SUMMA row under 2-D / 2.5-D.
#[allow(clippy::too_many_arguments)]
pub(super) fn ln_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    out: &mut D::Buf,
    mean: &mut D::Buf,
    rstd: &mut D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    bias: &D::Buf,
    rows: usize,
    h: usize,
) {
    match tp.summa {
        None => dev.layernorm_forward(out, mean, rstd, inp, weight, bias, rows, h),
        Some((s, _)) => s.layernorm_forward(dev, out, mean, rstd, inp, weight, bias, rows, h, sc),
    }
}

/// Backward of `ln_forward`: `dinp`, `dweight`, `dbias` "+=".
#[allow(clippy::too_many_arguments)]
pub(super) fn ln_backward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    dinp: &mut D::Buf,
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    dout: &D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    mean: &D::Buf,
    rstd: &D::Buf,
    rows: usize,
    h: usize,
) {
    match tp.summa {
        None => dev.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, h),
        Some((s, _)) => s.layernorm_backward(dev, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, h, sc),
    }
}

/// A linear layer that reads a LayerNorm output (QKV, fc1) for the whole `[k] -> [n]` product:
/// column-parallel under 1-D (all-gathering the input under sequence parallelism), SUMMA
/// otherwise. `out` holds this rank's output features.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_in_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    out: &mut D::Buf,
    (inp, inp_full): (&D::Buf, &mut Option<D::Buf>),
    weight: &D::Buf,
    bias: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            let inp = gathered(dev, tp, inp, inp_full);
            dev.linear_forward(out, inp, weight, Some(bias), r.full, k, n / tp.size());
        }
        Some((s, _)) => s.linear_forward(dev, out, inp, weight, Some(bias), r.full, k, n, sc),
    }
}

/// A linear layer that writes back into the residual stream (the attention projection, fc2):
/// `x_out = resid + inp · weightᵀ + bias` for the whole `[k] -> [n]` product. Row-parallel under
/// 1-D (partial sums reduced over the group, or reduce-scattered under sequence parallelism),
/// SUMMA otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_out_forward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    x_out: &mut D::Buf,
    resid: &D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    bias: &D::Buf,
    (tmp_full, tmp_local): (&mut D::Buf, &mut Option<D::Buf>),
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            dev.linear_forward(tmp_full, inp, weight, None, r.full, k / tp.size(), n);
            let sum = reduced(dev, tp, tmp_full, tmp_local);
            dev.add(x_out, resid, sum);
            dev.add_bias(x_out, bias, r.local, n);
        }
        Some((s, _)) => {
            s.linear_forward(dev, tmp_full, inp, weight, Some(bias), r.full, k, n, sc);
            dev.add(x_out, resid, tmp_full);
        }
    }
}

/// Backward of `linear_out_forward` from the residual gradient `d_resid`: `d_inp` (overwrite),
/// weight and bias gradients "+=".
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_out_backward<D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    d_inp: &mut D::Buf,
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    (d_resid, d_full): (&D::Buf, &mut Option<D::Buf>),
    inp: &D::Buf,
    weight: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) {
    match tp.summa {
        None => {
            let d_out = gathered(dev, tp, d_resid, d_full);
            dev.linear_backward(Some(d_inp), dweight, Some(dbias), d_out, inp, weight, r.full, k / tp.size(), n);
        }
        Some((s, _)) => {
            s.linear_backward(dev, Some(d_inp), dweight, Some(dbias), d_resid, inp, weight, r.full, k, n, sc)
        }
    }
}

/// Backward of `linear_in_forward`: returns the gradient of the LayerNorm output on this rank's
/// rows (reduced over the group under 1-D), computed in `d_full` (and `d_local`).
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_in_backward<'a, D: Device>(
    dev: &D,
    tp: TensorParallel,
    sc: &mut Scratch<D::Buf>,
    (d_full, d_local): (&'a mut D::Buf, &'a mut Option<D::Buf>),
    (dweight, dbias): (&mut D::Buf, &mut D::Buf),
    d_out: &D::Buf,
    (inp, inp_full): (&D::Buf, &Option<D::Buf>),
    weight: &D::Buf,
    r: Rows,
    (k, n): (usize, usize),
) -> &'a D::Buf {
    match tp.summa {
        None => {
            let inp = inp_full.as_ref().unwrap_or(inp);
            dev.linear_backward(Some(&mut *d_full), dweight, Some(dbias), d_out, inp, weight, r.full, k, n / tp.size());
            reduced(dev, tp, d_full, d_local)
        }
        Some((s, _)) => {
            s.linear_backward(dev, Some(&mut *d_full), dweight, Some(dbias), d_out, inp, weight, r.full, k, n, sc);
            d_full
        }
    }
}

/// The counters of the groups a layer talks over: the tensor-parallel group, then the SUMMA row
/// and column (zero under 1-D).
pub(super) fn tp_counters<D: Device>(dev: &D, tp: TensorParallel) -> [CommCounters; 3] {
    let t = crate::device::comm_counters(dev, tp.comm);
    match tp.summa {
        None => [t, CommCounters::default(), CommCounters::default()],
        Some((s, _)) => [t, s.row.counters(), s.col.counters()],
    }
}

pub(super) fn add_since(acc: &mut [CommCounters; 3], now: &[CommCounters; 3], before: &[CommCounters; 3]) {
    for g in 0..3 {
        acc[g].add(&now[g].since(&before[g]));
    }
}
