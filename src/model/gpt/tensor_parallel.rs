//! The parallel points of a layer, each a small method of `Pass` that does Megatron's 1-D
//! communication (all-gather / reduce-scatter under sequence parallelism, all-reduce otherwise)
//! or calls `parallel::summa` under 2-D / 2.5-D, so one forward and one backward serve every
//! layout: the LayerNorm, the linear layers that read a LayerNorm output (QKV, fc1) and those that
//! write back into the residual stream (projection, fc2); and the counters of what a layer's
//! groups moved.

use super::activations::{ContextScratch, LnActs, Rows};
use super::weight_pass::WeightGrads;
use crate::comm::CommCounters;
use crate::device::Device;
use crate::device::{Dropout, Gemm, LayerNormSaved, Matrix};
use crate::model::Normalization;
use crate::parallel::summa::Scratch;
use crate::parallel::tensor::{all_gather, all_reduce, reduce_scatter, TensorParallel};

/// What a chunk's forward or backward pass computes with: the device, the tensor-parallel groups,
/// SUMMA's panel buffers (unused under 1-D), the model's normalization, under rotary
/// positions the table of angles (`Arch::rotary_table`), and under `--reset-attention-mask` the
/// document start of each position of this rank's samples (`documents.rs`).
pub(super) struct Pass<'a, D: Device> {
    pub(super) dev: &'a D,
    pub(super) tp: TensorParallel<'a>,
    pub(super) sc: &'a mut Scratch<D::Buf>,
    /// The context-parallel attention's buffers (`context.rs`).
    pub(super) heads: &'a mut ContextScratch<D::Buf>,
    pub(super) norm: Norm,
    pub(super) rope: Option<&'a D::Buf>,
    pub(super) documents: Option<&'a [u32]>,
}

/// The normalization of every norm of the model and its epsilon.
#[derive(Clone, Copy, Debug)]
pub(super) struct Norm {
    pub(super) kind: Normalization,
    pub(super) eps: f64,
}

impl Norm {
    pub(super) fn of(arch: &crate::model::Arch) -> Norm {
        Norm { kind: arch.normalization, eps: arch.norm_epsilon }
    }
}

impl<'a, D: Device> Pass<'a, D> {
    /// A pass outside the blocks: no document bounds (the head, the embeddings, generation).
    pub(super) fn plain(
        (dev, tp): (&'a D, TensorParallel<'a>),
        (sc, heads): (&'a mut Scratch<D::Buf>, &'a mut ContextScratch<D::Buf>),
        arch: &crate::model::Arch,
        rope: Option<&'a D::Buf>,
    ) -> Self {
        Pass { dev, tp, sc, heads, norm: Norm::of(arch), rope, documents: None }
    }
}

impl<D: Device> Pass<'_, D> {
    /// The all-rows view of a LayerNorm output: its all-gather under sequence parallelism, itself
    /// otherwise.
    pub(super) fn gathered<'b>(&self, local: &'b D::Buf, full: &'b mut Option<D::Buf>) -> &'b D::Buf {
        match full {
            Some(f) => {
                all_gather(self.dev, self.tp.comm, local, f);
                f
            }
            None => local,
        }
    }

    /// Reduces the partial sums of a row-parallel layer over the group: reduce-scatter to this
    /// rank's rows under sequence parallelism, all-reduce otherwise. Returns the reduced rows.
    pub(super) fn reduced<'b>(&self, full: &'b mut D::Buf, local: &'b mut Option<D::Buf>) -> &'b D::Buf {
        match local {
            Some(l) => {
                reduce_scatter(self.dev, self.tp.comm, full, l);
                l
            }
            None => {
                all_reduce(self.dev, self.tp.comm, full);
                full
            }
        }
    }

    /// The model's norm (LayerNorm, or RMSNorm without a bias) of this rank's residual rows `inp`
    /// into `ln`: whole rows under 1-D, the hidden dimension split along the SUMMA row under 2-D /
    /// 2.5-D (LayerNorm only: `validate_summa` refuses the rest).
    pub(super) fn ln_forward(
        &mut self,
        ln: &mut LnActs<D::Buf>,
        inp: &D::Buf,
        (weight, bias): (&D::Buf, Option<&D::Buf>),
        rows: usize,
        h: usize,
    ) {
        let (dev, out, rstd) = (self.dev, &mut ln.out, &mut ln.rstd);
        match (self.norm.kind, bias, ln.mean.as_mut(), self.tp.summa) {
            (Normalization::RmsNorm, None, None, None) => {
                dev.rmsnorm_forward(out, rstd, inp, weight, Matrix { rows, cols: h }, self.norm.eps)
            }
            (Normalization::LayerNorm, Some(bias), Some(mean), None) => {
                dev.layernorm_forward(out, (mean, rstd), inp, (weight, bias), Matrix { rows, cols: h })
            }
            (Normalization::LayerNorm, Some(bias), Some(mean), Some((s, _))) => {
                s.layernorm_forward(dev, out, (mean, rstd), inp, (weight, bias), Matrix { rows, cols: h }, self.sc)
            }
            _ => unreachable!("a norm's parameters and statistics match its kind, and SUMMA runs LayerNorm"),
        }
    }

    /// Backward of `ln_forward` (whose statistics `ln` holds) from `dout`: `dinp`, `dweight`,
    /// `dbias` "+=".
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ln_backward(
        &mut self,
        dinp: &mut D::Buf,
        (dweight, dbias): (&mut D::Buf, Option<&mut D::Buf>),
        dout: &D::Buf,
        (inp, weight): (&D::Buf, &D::Buf),
        ln: &LnActs<D::Buf>,
        rows: usize,
        h: usize,
    ) {
        let (dev, rstd) = (self.dev, &ln.rstd);
        match (dbias, ln.mean.as_ref(), self.tp.summa) {
            (None, None, None) => {
                dev.rmsnorm_backward(dinp, dweight, dout, (inp, weight), rstd, Matrix { rows, cols: h })
            }
            (Some(dbias), Some(mean), None) => dev.layernorm_backward(
                dinp,
                (dweight, dbias),
                dout,
                LayerNormSaved { inp, weight, mean, rstd },
                Matrix { rows, cols: h },
            ),
            (Some(dbias), Some(mean), Some((s, _))) => s.layernorm_backward(
                dev,
                dinp,
                (dweight, dbias),
                dout,
                LayerNormSaved { inp, weight, mean, rstd },
                Matrix { rows, cols: h },
                self.sc,
            ),
            _ => unreachable!("a norm's parameters and statistics match its kind, and SUMMA runs LayerNorm"),
        }
    }

    /// A linear layer that reads a LayerNorm output `ln` (QKV, fc1) for the whole `[k] -> [n]`
    /// product: column-parallel under 1-D (all-gathering the input under sequence parallelism),
    /// SUMMA otherwise. `out` holds this rank's output features.
    pub(super) fn linear_in_forward(
        &mut self,
        out: &mut D::Buf,
        ln: &mut LnActs<D::Buf>,
        (weight, bias): (&D::Buf, Option<&D::Buf>),
        r: Rows,
        (k, n): (usize, usize),
    ) {
        match self.tp.summa {
            None => {
                let inp = self.gathered(&ln.out, &mut ln.full);
                self.dev.linear_forward(out, inp, weight, bias, Gemm { rows: r.full, k, n: n / self.tp.size() });
            }
            Some((s, _)) => {
                s.linear_forward(self.dev, out, &ln.out, (weight, bias), Gemm { rows: r.full, k, n }, self.sc)
            }
        }
    }

    /// A linear layer that writes back into the residual stream (the attention projection, fc2):
    /// `x_out = resid + inp · weightᵀ + bias` for the whole `[k] -> [n]` product. Row-parallel
    /// under 1-D (partial sums reduced over the group, or reduce-scattered under sequence
    /// parallelism), SUMMA otherwise; on one rank `LinearOps::linear_residual_forward`. With
    /// `dropout`, Megatron's bias-dropout-add: `x_out = resid + dropout(inp · weightᵀ + bias)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_out_forward(
        &mut self,
        x_out: &mut D::Buf,
        resid: &D::Buf,
        inp: &D::Buf,
        (weight, bias): (&D::Buf, Option<&D::Buf>),
        (tmp_full, tmp_local): (&mut D::Buf, &mut Option<D::Buf>),
        dropout: Option<&Dropout>,
        r: Rows,
        (k, n): (usize, usize),
    ) {
        let dev = self.dev;
        // This rank's rows of the residual, as wide as it holds them.
        let local = Matrix { rows: r.local, cols: dev.len(resid) / r.local.max(1) };
        match (self.tp.summa, dropout) {
            // One rank: nothing to reduce, so the device may fuse the bias and the residual.
            (None, None) if self.tp.size() == 1 => {
                dev.linear_residual_forward(x_out, resid, inp, (weight, bias), tmp_full, Gemm { rows: r.full, k, n })
            }
            (None, Some(d)) if self.tp.size() == 1 => {
                dev.linear_forward(tmp_full, inp, weight, None, Gemm { rows: r.full, k, n });
                dev.bias_dropout_add(x_out, (resid, tmp_full), bias, d, local);
            }
            (None, dropout) => {
                dev.linear_forward(tmp_full, inp, weight, None, Gemm { rows: r.full, k: k / self.tp.size(), n });
                let sum = self.reduced(tmp_full, tmp_local);
                if let Some(d) = dropout {
                    dev.bias_dropout_add(x_out, (resid, sum), bias, d, local);
                    return;
                }
                dev.add(x_out, resid, sum);
                if let Some(bias) = bias {
                    dev.add_bias(x_out, bias, Matrix { rows: r.local, cols: n });
                }
            }
            (Some((s, _)), dropout) => {
                s.linear_forward(dev, tmp_full, inp, (weight, bias), Gemm { rows: r.full, k, n }, self.sc);
                match dropout {
                    Some(d) => dev.bias_dropout_add(x_out, (resid, tmp_full), None, d, local),
                    None => dev.add(x_out, resid, tmp_full),
                }
            }
        }
    }

    /// Backward of `linear_out_forward` from the residual gradient `d_resid`: `d_inp`
    /// (overwrite), weight and bias gradients "+=".
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_out_backward(
        &mut self,
        d_inp: &mut D::Buf,
        grads: WeightGrads<'_, D::Buf>,
        (d_resid, d_full): (&D::Buf, &mut Option<D::Buf>),
        inp: &D::Buf,
        weight: &D::Buf,
        r: Rows,
        (k, n): (usize, usize),
    ) {
        match self.tp.summa {
            None => {
                let dev = self.dev;
                let d_out = self.gathered(d_resid, d_full);
                let k_local = k / self.tp.size();
                linear_backward(dev, d_inp, grads, d_out, inp, weight, Gemm { rows: r.full, k: k_local, n });
            }
            Some((s, _)) => {
                let WeightGrads::Now(dweight, dbias) = grads else {
                    unreachable!("zero-bubble schedules are refused under 2-D tensor parallelism")
                };
                let (dev, sc) = (self.dev, &mut *self.sc);
                s.linear_backward(
                    dev,
                    Some(d_inp),
                    (dweight, dbias),
                    d_resid,
                    inp,
                    weight,
                    Gemm { rows: r.full, k, n },
                    sc,
                )
            }
        }
    }

    /// Backward of `linear_in_forward`: returns the gradient of the LayerNorm output on this
    /// rank's rows (reduced over the group under 1-D), computed in `d_full` (and `d_local`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_in_backward<'b>(
        &mut self,
        (d_full, d_local): (&'b mut D::Buf, &'b mut Option<D::Buf>),
        grads: WeightGrads<'_, D::Buf>,
        d_out: &D::Buf,
        ln: &LnActs<D::Buf>,
        weight: &D::Buf,
        r: Rows,
        (k, n): (usize, usize),
    ) -> &'b D::Buf {
        let (dev, inp) = (self.dev, &ln.out);
        match self.tp.summa {
            None => {
                let inp = ln.gemm_input();
                let n_local = n / self.tp.size();
                linear_backward(dev, &mut *d_full, grads, d_out, inp, weight, Gemm { rows: r.full, k, n: n_local });
                self.reduced(d_full, d_local)
            }
            Some((s, _)) => {
                let WeightGrads::Now(dweight, dbias) = grads else {
                    unreachable!("zero-bubble schedules are refused under 2-D tensor parallelism")
                };
                let sc = &mut *self.sc;
                s.linear_backward(
                    dev,
                    Some(&mut *d_full),
                    (dweight, dbias),
                    d_out,
                    inp,
                    weight,
                    Gemm { rows: r.full, k, n },
                    sc,
                );
                d_full
            }
        }
    }
}

/// A linear layer's backward on this rank's shard: `d_inp` (overwrite), and its parameter
/// gradients added now or left for the W pass (`grads`).
fn linear_backward<D: Device>(
    dev: &D,
    d_inp: &mut D::Buf,
    grads: WeightGrads<'_, D::Buf>,
    d_out: &D::Buf,
    inp: &D::Buf,
    weight: &D::Buf,
    shape: Gemm,
) {
    match grads {
        WeightGrads::Now(dweight, dbias) => {
            dev.linear_backward(Some(d_inp), (dweight, dbias), d_out, inp, weight, shape)
        }
        WeightGrads::Later(deferred) => {
            dev.linear_backward_input(d_inp, d_out, weight, shape);
            deferred.keep(dev, d_out, inp, shape);
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

/// Adds to `acc` what each group moved between the counters `before` and `now`.
pub(super) fn add_since(acc: &mut [CommCounters; 3], now: &[CommCounters; 3], before: &[CommCounters; 3]) {
    for g in 0..3 {
        acc[g].add(&now[g].since(&before[g]));
    }
}
