//! SUMMA matrix products for 2-D (Optimus) and 2.5-D (Tesseract) tensor parallelism, in the
//! panel form of docs/design.md (2-D and 2.5-D tensor parallelism): one all-gather per operand instead of q
//! broadcasts, one reduce-scatter per partial result instead of q reduces. The per-device volume
//! is the same as broadcast-SUMMA's, 3(q-1)(MK + KN)/q² elements per linear layer (forward and both
//! backward products), with two collectives per product instead of 2q, which is what MPI and NCCL
//! move best; the price is panel buffers q times a block.
//!
//! Layout on device (row i, column j) of a q x q grid (2.5-D: of its depth layer):
//! * activations `[m, k/q]`: this device's batch block (rows) and hidden block j (columns);
//! * a linear weight in Megatron's `[n, k]` layout: the block of output rows j and input columns
//!   i, `[n/q, k/q]` (so the output's hidden block is again j);
//! * a bias `[n]`: sub-block i of output block j, `[n/q²]` (Colossal-AI's sharding, §4.3),
//!   all-gathered down the column before use;
//! * the word embedding `[v, h]` (tied to the output layer): vocabulary block i, hidden block j,
//!   `[v/q, h/q]`; the logits come out as vocabulary block j of this device's rows.
//!
//! Row groups (fixed row, every column) are in column order and column groups in row order, as
//! `Grid::summa_row_group` / `summa_col_group` build them.

use crate::comm::{Comm, Pending, ReduceOp};
use crate::device::kernels::LAYERNORM_EPS;
use crate::device::Device;
use crate::device::{Gemm, LayerNormSaved, Matrix};
use std::borrow::Cow;

/// How a SUMMA linear layer moves its blocks (`--summa-algorithm`): gathered panels and one
/// local GEMM (two collectives per product), or q broadcast steps with the next step's blocks in
/// flight during this step's GEMM (broadcast-SUMMA with double buffering, as Optimus and
/// Colossal-AI run it: 2q collectives per product, two blocks of memory instead of a panel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Algorithm {
    #[default]
    Panel,
    Broadcast,
}

impl Algorithm {
    pub fn parse(s: &str) -> crate::error::Result<Algorithm> {
        match s {
            "panel" => Ok(Algorithm::Panel),
            "broadcast" => Ok(Algorithm::Broadcast),
            _ => Err(crate::error::Error::flag("--summa-algorithm", format!("'{s}'"), "panel or broadcast")),
        }
    }
}

/// The two groups a SUMMA product talks over, the grid side, and how linear layers move blocks.
#[derive(Clone, Copy)]
pub struct Summa<'a> {
    pub row: &'a dyn Comm,
    pub col: &'a dyn Comm,
    pub q: usize,
    pub algorithm: Algorithm,
}

/// Panel buffers reused across calls (reallocated when a shape changes).
pub struct Scratch<B> {
    a_panel: Option<B>,
    w_panel: Option<B>,
    d_panel: Option<B>,
    dw_panel: Option<B>,
    bias: Option<B>,
    gamma: Option<B>,
    beta: Option<B>,
}

impl<B> Default for Scratch<B> {
    fn default() -> Self {
        Scratch { a_panel: None, w_panel: None, d_panel: None, dw_panel: None, bias: None, gamma: None, beta: None }
    }
}

impl<B> Scratch<B> {
    /// Bytes held (for `--log-memory`).
    pub fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        [&self.a_panel, &self.w_panel, &self.d_panel, &self.dw_panel, &self.bias, &self.gamma, &self.beta]
            .iter()
            .map(|b| b.as_ref().map_or(0, |b| 4 * dev.len(b)))
            .sum()
    }
}

fn ensure<'b, D: Device>(dev: &D, slot: &'b mut Option<D::Buf>, len: usize) -> &'b mut D::Buf {
    if slot.as_ref().is_none_or(|b| dev.len(b) != len) {
        *slot = Some(dev.alloc(len));
    }
    slot.as_mut().expect("just allocated")
}

/// The buffer's values on the host: borrowed where the device keeps them there.
pub(crate) fn host<'b, D: Device>(dev: &D, buf: &'b D::Buf) -> Cow<'b, [f32]> {
    match dev.host_f32_ref(buf) {
        Some(h) => Cow::Borrowed(h),
        None => {
            let mut h = vec![0f32; dev.len(buf)];
            dev.download(buf, &mut h);
            Cow::Owned(h)
        }
    }
}

/// The buffer's values as an owned host vector.
fn summa_host<D: Device>(dev: &D, buf: &D::Buf) -> Vec<f32> {
    host(dev, buf).into_owned()
}

/// Lets `f` write the buffer's values through host memory.
pub(crate) fn write<D: Device>(dev: &D, buf: &mut D::Buf, f: impl FnOnce(&mut [f32])) {
    if let Some(h) = dev.host_f32(buf) {
        return f(h);
    }
    let mut h = vec![0f32; dev.len(buf)];
    dev.download(buf, &mut h);
    f(&mut h);
    dev.upload(buf, &h);
}

/// `[q][rows][w]` blocks side by side as `[rows][q * w]`.
fn blocks_to_panel(blocks: &[f32], panel: &mut [f32], q: usize, rows: usize, w: usize) {
    for (l, block) in blocks.chunks_exact(rows * w).enumerate().take(q) {
        for (r, src) in block.chunks_exact(w).enumerate() {
            panel[r * q * w + l * w..][..w].copy_from_slice(src);
        }
    }
}

/// The inverse: `[rows][q * w]` cut into `[q][rows][w]`.
fn panel_to_blocks(panel: &[f32], blocks: &mut [f32], q: usize, rows: usize, w: usize) {
    for (l, block) in blocks.chunks_exact_mut(rows * w).enumerate().take(q) {
        for (r, dst) in block.chunks_exact_mut(w).enumerate() {
            dst.copy_from_slice(&panel[r * q * w + l * w..][..w]);
        }
    }
}

/// `panel [rows, q*w]` = every group member's `local [rows, w]`, side by side in group order.
pub fn gather_panel<D: Device>(dev: &D, comm: &dyn Comm, local: &D::Buf, panel: &mut D::Buf, rows: usize, w: usize) {
    let q = comm.size();
    let mine = host(dev, local);
    let mut blocks = vec![0f32; q * rows * w];
    comm.all_gather(&mine[..], &mut blocks);
    write(dev, panel, |p| blocks_to_panel(&blocks, p, q, rows, w));
}

/// Sums `panel [rows, q*w]` over the group and returns this member's column block `[rows, w]`.
pub fn scatter_panel<D: Device>(dev: &D, comm: &dyn Comm, panel: &D::Buf, rows: usize, w: usize) -> Vec<f32> {
    let q = comm.size();
    let p = host(dev, panel);
    let mut blocks = vec![0f32; q * rows * w];
    panel_to_blocks(&p, &mut blocks, q, rows, w);
    let mut out = vec![0f32; rows * w];
    comm.reduce_scatter(&blocks, &mut out);
    out
}

/// `full` = every group member's `local`, stacked in group order (contiguous pieces).
pub fn gather_stacked<D: Device>(dev: &D, comm: &dyn Comm, local: &D::Buf, full: &mut D::Buf) {
    let mine = host(dev, local);
    write(dev, full, |f| comm.all_gather(&mine[..], f));
}

/// `acc += ` this member's piece of `full` summed over the group (contiguous pieces).
pub fn scatter_stacked_add<D: Device>(dev: &D, comm: &dyn Comm, full: &D::Buf, acc: &mut D::Buf) {
    let f = host(dev, full);
    let mut piece = vec![0f32; f.len() / comm.size()];
    comm.reduce_scatter(&f[..], &mut piece);
    write(dev, acc, |a| a.iter_mut().zip(&piece).for_each(|(a, p)| *a += p));
}

impl Summa<'_> {
    /// `out [m, n/q] = inp · weightᵀ (+ bias)` for the whole `[rows, k] x [n, k]ᵀ` product: the
    /// input's row panel gathered along the row, the weight's column panel down the column.
    pub fn linear_forward<D: Device>(
        &self,
        dev: &D,
        out: &mut D::Buf,
        inp: &D::Buf,
        (weight, bias): (&D::Buf, Option<&D::Buf>),
        shape: Gemm,
        s: &mut Scratch<D::Buf>,
    ) {
        if self.algorithm == Algorithm::Broadcast {
            return self.broadcast_forward(dev, out, inp, (weight, bias), shape, s);
        }
        let Gemm { rows: m, k, n } = shape;
        let (q, kb, nb) = (self.q, k / self.q, n / self.q);
        let a = ensure(dev, &mut s.a_panel, m * k);
        gather_panel(dev, self.row, inp, a, m, kb);
        let w = ensure(dev, &mut s.w_panel, nb * k);
        gather_panel(dev, self.col, weight, w, nb, kb);
        let bias = bias.map(|b| {
            let full = ensure(dev, &mut s.bias, nb);
            gather_stacked(dev, self.col, b, full);
            &*full
        });
        debug_assert_eq!(q * kb, k);
        dev.linear_forward(
            out,
            s.a_panel.as_ref().expect("gathered"),
            s.w_panel.as_ref().expect("gathered"),
            bias,
            Gemm { rows: m, k, n: nb },
        );
    }

    /// Both backward products: `dinp [m, k/q] = (dout · weight)` reduce-scattered along the row
    /// (overwrite), `dweight [n/q, k/q] += (doutᵀ · inp)` reduce-scattered down the column, and
    /// `dbias [n/q²] +=` the column's sum of `dout`'s rows. Operand panels are gathered again,
    /// as broadcast-SUMMA broadcasts them again.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_backward<D: Device>(
        &self,
        dev: &D,
        dinp: Option<&mut D::Buf>,
        (dweight, dbias): (&mut D::Buf, Option<&mut D::Buf>),
        dout: &D::Buf,
        inp: &D::Buf,
        weight: &D::Buf,
        Gemm { rows: m, k, n }: Gemm,
        s: &mut Scratch<D::Buf>,
    ) {
        if self.algorithm == Algorithm::Broadcast {
            return self.broadcast_backward(dev, dinp, dweight, dbias, dout, inp, weight, m, k, n, s);
        }
        let (kb, nb) = (k / self.q, n / self.q);
        gather_panel(dev, self.row, inp, ensure(dev, &mut s.a_panel, m * k), m, kb);
        gather_panel(dev, self.col, weight, ensure(dev, &mut s.w_panel, nb * k), nb, kb);
        let dw = ensure(dev, &mut s.dw_panel, nb * k);
        dev.fill(dw, 0.0);
        let db = dbias.is_some().then(|| {
            let b = ensure(dev, &mut s.bias, nb);
            dev.fill(b, 0.0);
        });
        let d_panel = dinp.is_some().then(|| ensure(dev, &mut s.d_panel, m * k));
        let (a, w) = (s.a_panel.as_ref().expect("gathered"), s.w_panel.as_ref().expect("gathered"));
        let dw = s.dw_panel.as_mut().expect("allocated");
        let db_buf = if db.is_some() { s.bias.as_mut() } else { None };
        dev.linear_backward(d_panel, (dw, db_buf), dout, a, w, Gemm { rows: m, k, n: nb });
        if let Some(dinp) = dinp {
            let mine = scatter_panel(dev, self.row, s.d_panel.as_ref().expect("computed"), m, kb);
            dev.upload(dinp, &mine);
        }
        let mine = scatter_panel(dev, self.col, s.dw_panel.as_ref().expect("computed"), nb, kb);
        write(dev, dweight, |g| g.iter_mut().zip(&mine).for_each(|(g, d)| *g += d));
        if let Some(dbias) = dbias {
            scatter_stacked_add(dev, self.col, s.bias.as_ref().expect("computed"), dbias);
        }
    }

    /// Posts broadcast-SUMMA's step `l`: the input block (`len` elements) of column `l` along each
    /// row, then the weight block of row `l` down each column; the root of each sends its own.
    fn broadcast_step(
        &self,
        l: usize,
        (a_host, a_len): (&[f32], usize),
        (w_host, w_len): (&[f32], usize),
    ) -> (Box<dyn Pending>, Box<dyn Pending>) {
        let (row_rank, col_rank) = (self.col.rank(), self.row.rank());
        let a = if col_rank == l { a_host.to_vec() } else { vec![0f32; a_len] };
        let w = if row_rank == l { w_host.to_vec() } else { vec![0f32; w_len] };
        (self.row.broadcast_start(a, l), self.col.broadcast_start(w, l))
    }

    /// Broadcast-SUMMA forward: step l broadcasts the input block of column l along each row and
    /// the weight block of row l down each column, and every rank accumulates their product; the
    /// broadcasts of step l + 1 are posted before step l's GEMM.
    fn broadcast_forward<D: Device>(
        &self,
        dev: &D,
        out: &mut D::Buf,
        inp: &D::Buf,
        (weight, bias): (&D::Buf, Option<&D::Buf>),
        Gemm { rows: m, k, n }: Gemm,
        s: &mut Scratch<D::Buf>,
    ) {
        let (q, kb, nb) = (self.q, k / self.q, n / self.q);
        let (a_host, w_host) = (host(dev, inp).into_owned(), host(dev, weight).into_owned());
        let post = |l: usize| self.broadcast_step(l, (&a_host, m * kb), (&w_host, nb * kb));
        match bias {
            Some(b) => {
                let full = ensure(dev, &mut s.bias, nb);
                gather_stacked(dev, self.col, b, full);
                let full = summa_host(dev, full);
                write(dev, out, |o| o.chunks_exact_mut(nb).for_each(|r| r.copy_from_slice(&full)));
            }
            None => dev.fill(out, 0.0),
        }
        let mut next = Some(post(0));
        for l in 0..q {
            let (pa, pw) = next.take().expect("posted");
            let (a, w) = (pa.wait(), pw.wait());
            if l + 1 < q {
                next = Some(post(l + 1));
            }
            dev.upload(ensure(dev, &mut s.a_panel, m * kb), &a);
            dev.upload(ensure(dev, &mut s.w_panel, nb * kb), &w);
            let part = ensure(dev, &mut s.d_panel, m * nb);
            dev.linear_forward(
                part,
                s.a_panel.as_ref().expect("set"),
                s.w_panel.as_ref().expect("set"),
                None,
                Gemm { rows: m, k: kb, n: nb },
            );
            dev.add_assign(out, s.d_panel.as_ref().expect("computed"));
        }
    }

    /// Broadcast-SUMMA backward: step l broadcasts the weight block of row l down each column and
    /// the input block of column l along each row; every rank forms its partial input gradient
    /// for column l (reduced along the row onto column l) and its partial weight gradient for
    /// row l (reduced down the column onto row l). Broadcasts run one step ahead; reductions
    /// complete at the end.
    #[allow(clippy::too_many_arguments)]
    fn broadcast_backward<D: Device>(
        &self,
        dev: &D,
        dinp: Option<&mut D::Buf>,
        dweight: &mut D::Buf,
        dbias: Option<&mut D::Buf>,
        dout: &D::Buf,
        inp: &D::Buf,
        weight: &D::Buf,
        m: usize,
        k: usize,
        n: usize,
        s: &mut Scratch<D::Buf>,
    ) {
        let (q, kb, nb) = (self.q, k / self.q, n / self.q);
        let (a_host, w_host) = (host(dev, inp).into_owned(), host(dev, weight).into_owned());
        let post = |l: usize| self.broadcast_step(l, (&a_host, m * kb), (&w_host, nb * kb));
        if let Some(dbias) = dbias {
            // The bias gradient: this rank's column sums, reduce-scattered down the column.
            let b = ensure(dev, &mut s.bias, nb);
            let rows = host(dev, dout);
            let mut sums = vec![0f32; nb];
            rows.chunks_exact(nb).for_each(|r| sums.iter_mut().zip(r).for_each(|(s, x)| *s += x));
            dev.upload(b, &sums);
            scatter_stacked_add(dev, self.col, s.bias.as_ref().expect("set"), dbias);
        }
        let want_dinp = dinp.is_some();
        let mut reductions = Vec::with_capacity(2 * q);
        let mut next = Some(post(0));
        for l in 0..q {
            let (pa, pw) = next.take().expect("posted");
            let (a, w) = (pa.wait(), pw.wait());
            if l + 1 < q {
                next = Some(post(l + 1));
            }
            dev.upload(ensure(dev, &mut s.a_panel, m * kb), &a);
            dev.upload(ensure(dev, &mut s.w_panel, nb * kb), &w);
            let dw = ensure(dev, &mut s.dw_panel, nb * kb);
            dev.fill(dw, 0.0);
            let d_part = want_dinp.then(|| ensure(dev, &mut s.d_panel, m * kb));
            let (ab, wb) = (s.a_panel.as_ref().expect("set"), s.w_panel.as_ref().expect("set"));
            dev.linear_backward(
                d_part,
                (s.dw_panel.as_mut().expect("set"), None),
                dout,
                ab,
                wb,
                Gemm { rows: m, k: kb, n: nb },
            );
            let d_part = want_dinp.then(|| self.row.reduce_start(summa_host(dev, s.d_panel.as_ref().expect("set")), l));
            let dw_part = self.col.reduce_start(summa_host(dev, s.dw_panel.as_ref().expect("set")), l);
            reductions.push((l, d_part, dw_part));
        }
        let (row_rank, col_rank) = (self.col.rank(), self.row.rank());
        let mut dinp = dinp;
        for (l, d_part, dw_part) in reductions {
            let d_sum = d_part.map(|p| p.wait());
            let dw_sum = dw_part.wait();
            if let (Some(d), true, Some(dinp)) = (d_sum, l == col_rank, dinp.as_deref_mut()) {
                dev.upload(dinp, &d);
            }
            if l == row_rank {
                write(dev, dweight, |g| g.iter_mut().zip(&dw_sum).for_each(|(g, d)| *g += d));
            }
        }
    }

    /// The output layer tied to the word embedding: `logits [m, v/q]` (vocabulary block j) of
    /// `inp [m, h/q] · wteᵀ`, with `wte [v/q, h/q]` (vocabulary block i, hidden block j): the
    /// embedding's hidden column panel gathered down the column, the partial logits of every
    /// vocabulary block reduce-scattered along the row.
    #[allow(clippy::too_many_arguments)]
    pub fn logits_forward<D: Device>(
        &self,
        dev: &D,
        out: &mut D::Buf,
        inp: &D::Buf,
        wte: &D::Buf,
        m: usize,
        h: usize,
        v: usize,
        s: &mut Scratch<D::Buf>,
    ) {
        let (hb, vb) = (h / self.q, v / self.q);
        let e = ensure(dev, &mut s.w_panel, v * hb);
        gather_stacked(dev, self.col, wte, e);
        let partial = ensure(dev, &mut s.d_panel, m * v);
        dev.linear_forward(partial, inp, s.w_panel.as_ref().expect("gathered"), None, Gemm { rows: m, k: hb, n: v });
        let mine = scatter_panel(dev, self.row, s.d_panel.as_ref().expect("computed"), m, vb);
        dev.upload(out, &mine);
    }

    /// Backward of `logits_forward`: `dinp [m, h/q]` (overwrite) and `dwte [v/q, h/q] +=`.
    #[allow(clippy::too_many_arguments)]
    pub fn logits_backward<D: Device>(
        &self,
        dev: &D,
        dinp: &mut D::Buf,
        dwte: &mut D::Buf,
        dout: &D::Buf,
        inp: &D::Buf,
        wte: &D::Buf,
        m: usize,
        h: usize,
        v: usize,
        s: &mut Scratch<D::Buf>,
    ) {
        let (hb, vb) = (h / self.q, v / self.q);
        gather_panel(dev, self.row, dout, ensure(dev, &mut s.d_panel, m * v), m, vb);
        gather_stacked(dev, self.col, wte, ensure(dev, &mut s.w_panel, v * hb));
        let de = ensure(dev, &mut s.dw_panel, v * hb);
        dev.fill(de, 0.0);
        let (d, e) = (s.d_panel.as_ref().expect("gathered"), s.w_panel.as_ref().expect("gathered"));
        dev.linear_backward(
            Some(dinp),
            (s.dw_panel.as_mut().expect("allocated"), None),
            d,
            inp,
            e,
            Gemm { rows: m, k: hb, n: v },
        );
        scatter_stacked_add(dev, self.col, s.dw_panel.as_ref().expect("computed"), dwte);
    }
}

impl Summa<'_> {
    /// LayerNorm of `rows` rows of width `h` whose columns are split along the row group (this
    /// rank holds `h/q`): the mean and the centred sum of squares are each summed over the row
    /// (two all-reduces of one f64 per row), and the scale and shift (`[h/q²]` shards) are
    /// gathered down the column. Saves mean and rstd like `NormOps::layernorm_forward`.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_forward<D: Device>(
        &self,
        dev: &D,
        out: &mut D::Buf,
        (mean_out, rstd_out): (&mut D::Buf, &mut D::Buf),
        inp: &D::Buf,
        (weight, bias): (&D::Buf, &D::Buf),
        Matrix { rows, cols: h }: Matrix,
        s: &mut Scratch<D::Buf>,
    ) {
        let cols = h / self.q;
        gather_stacked(dev, self.col, weight, ensure(dev, &mut s.gamma, cols));
        gather_stacked(dev, self.col, bias, ensure(dev, &mut s.beta, cols));
        let mut mean = vec![0f64; rows];
        dev.layernorm_sums(inp, Matrix { rows, cols }, None, &mut mean);
        self.row.all_reduce(&mut mean, ReduceOp::Sum);
        mean.iter_mut().for_each(|m| *m /= h as f64);
        let mut rstd = vec![0f64; rows];
        dev.layernorm_sums(inp, Matrix { rows, cols }, Some(&mean), &mut rstd);
        self.row.all_reduce(&mut rstd, ReduceOp::Sum);
        rstd.iter_mut().for_each(|v| *v = 1.0 / (*v / h as f64 + LAYERNORM_EPS).sqrt());
        let (g, b) = (s.gamma.as_ref().expect("gathered"), s.beta.as_ref().expect("gathered"));
        dev.layernorm_apply(out, (mean_out, rstd_out), inp, (g, b), (&mean, &rstd), Matrix { rows, cols });
    }

    /// Backward of `layernorm_forward`: `dinp +=`, and the scale and shift gradients `+=` their
    /// shards (reduce-scattered down the column).
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_backward<D: Device>(
        &self,
        dev: &D,
        dinp: &mut D::Buf,
        (dweight, dbias): (&mut D::Buf, &mut D::Buf),
        dout: &D::Buf,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, D::Buf>,
        Matrix { rows, cols: h }: Matrix,
        s: &mut Scratch<D::Buf>,
    ) {
        let cols = h / self.q;
        gather_stacked(dev, self.col, weight, ensure(dev, &mut s.bias, cols));
        let g = s.bias.as_ref().expect("gathered");
        let mut sums = vec![0f64; 2 * rows];
        dev.layernorm_backward_sums(
            dout,
            LayerNormSaved { inp, weight: g, mean, rstd },
            Matrix { rows, cols },
            &mut sums,
        );
        self.row.all_reduce(&mut sums, ReduceOp::Sum);
        let dg = ensure(dev, &mut s.gamma, cols);
        dev.fill(dg, 0.0);
        let db = ensure(dev, &mut s.beta, cols);
        dev.fill(db, 0.0);
        let (dg, db) = (s.gamma.as_mut().expect("allocated"), s.beta.as_mut().expect("allocated"));
        dev.layernorm_backward_apply(
            dinp,
            (dg, db),
            dout,
            LayerNormSaved { inp, weight: g, mean, rstd },
            (&sums, h),
            Matrix { rows, cols },
        );
        scatter_stacked_add(dev, self.col, s.gamma.as_ref().expect("computed"), dweight);
        scatter_stacked_add(dev, self.col, s.beta.as_ref().expect("computed"), dbias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::threads::{run_group, ThreadComm};
    use crate::device::prelude::*;
    use crate::device::reference::ReferenceDevice;
    use crate::parallel::grid::SummaCoord;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + seed * 104_729) % 1999) as f32 / 1999.0 - 0.5) * 2.0).collect()
    }

    /// Rows `r0..r0+nr`, columns `c0..c0+nc` of a row-major matrix with `cols` columns.
    fn block(x: &[f32], cols: usize, (r0, nr): (usize, usize), (c0, nc): (usize, usize)) -> Vec<f32> {
        (r0..r0 + nr).flat_map(|r| x[r * cols + c0..][..nc].to_vec()).collect()
    }

    /// A reference-device buffer holding `v`.
    fn up(v: impl AsRef<[f32]>) -> Vec<f64> {
        let v = v.as_ref();
        let mut buf = ReferenceDevice.alloc(v.len());
        ReferenceDevice.upload(&mut buf, v);
        buf
    }

    /// A reference-device buffer's values as f32.
    fn whole(buf: impl AsRef<[f64]>) -> Vec<f32> {
        buf.as_ref().iter().map(|&v| v as f32).collect()
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
        }
    }

    /// Runs `f` on a q x q grid of threads with row and column groups, giving each its coordinates.
    fn on_grid<T: Send>(q: usize, algorithm: Algorithm, f: impl Fn(SummaCoord, Summa) -> T + Sync) -> Vec<T> {
        // Row groups: q groups of q threads; column groups likewise. Each thread takes its
        // handle from the group it belongs to.
        let rows: Vec<Vec<ThreadComm>> = (0..q).map(|_| ThreadComm::group(q)).collect();
        let cols: Vec<Vec<ThreadComm>> = (0..q).map(|_| ThreadComm::group(q)).collect();
        let rows: Vec<std::sync::Mutex<Vec<Option<ThreadComm>>>> =
            rows.into_iter().map(|g| std::sync::Mutex::new(g.into_iter().map(Some).collect())).collect();
        let cols: Vec<std::sync::Mutex<Vec<Option<ThreadComm>>>> =
            cols.into_iter().map(|g| std::sync::Mutex::new(g.into_iter().map(Some).collect())).collect();
        run_group(q * q, |t, _| {
            let c = SummaCoord::of(t, q, 1);
            let row = rows[c.row].lock().unwrap()[c.col].take().unwrap();
            let col = cols[c.col].lock().unwrap()[c.row].take().unwrap();
            f(c, Summa { row: &row, col: &col, q, algorithm })
        })
    }

    #[test]
    fn summa_linear_matches_the_whole_product() {
        let dev = ReferenceDevice;
        for (q, m, k, n, algorithm) in [
            (2usize, 6usize, 8usize, 12usize, Algorithm::Panel),
            (3, 5, 9, 18, Algorithm::Panel),
            (2, 6, 8, 12, Algorithm::Broadcast),
            (3, 5, 9, 18, Algorithm::Broadcast),
        ] {
            // The whole problem: rows = q batch blocks of m rows each.
            let (x, w, b, dy) = (values(q * m * k, 1), values(n * k, 2), values(n, 3), values(q * m * n, 4));
            let mut y = dev.alloc(q * m * n);
            dev.linear_forward(&mut y, &up(&x), &up(&w), Some(&up(&b)), Gemm { rows: q * m, k, n });
            let (mut dx, mut dw, mut db) = (dev.alloc(q * m * k), dev.alloc(n * k), dev.alloc(n));
            dev.linear_backward(
                Some(&mut dx),
                (&mut dw, Some(&mut db)),
                &up(&dy),
                &up(&x),
                &up(&w),
                Gemm { rows: q * m, k, n },
            );
            let (y, dx, dw, db) = (whole(&y), whole(&dx), whole(&dw), whole(&db));
            let (kb, nb) = (k / q, n / q);
            let got = on_grid(q, algorithm, |c, s| {
                let dev = ReferenceDevice;
                let xi = up(block(&x, k, (c.row * m, m), (c.col * kb, kb)));
                let wi = up(block(&w, k, (c.col * nb, nb), (c.row * kb, kb)));
                let bi = up(&b[c.col * nb + c.row * (nb / q)..][..nb / q]);
                let dyi = up(block(&dy, n, (c.row * m, m), (c.col * nb, nb)));
                let mut scratch = Scratch::default();
                let mut yi = dev.alloc(m * nb);
                s.linear_forward(&dev, &mut yi, &xi, (&wi, Some(&bi)), Gemm { rows: m, k, n }, &mut scratch);
                let (mut dxi, mut dwi, mut dbi) = (dev.alloc(m * kb), dev.alloc(nb * kb), dev.alloc(nb / q));
                s.linear_backward(
                    &dev,
                    Some(&mut dxi),
                    (&mut dwi, Some(&mut dbi)),
                    &dyi,
                    &xi,
                    &wi,
                    Gemm { rows: m, k, n },
                    &mut scratch,
                );
                (c, whole(yi), whole(dxi), whole(dwi), whole(dbi))
            });
            for (c, yi, dxi, dwi, dbi) in got {
                let at = format!("{algorithm:?} q {q} ({}, {})", c.row, c.col);
                close(&yi, &block(&y, n, (c.row * m, m), (c.col * nb, nb)), &format!("{at} y"));
                close(&dxi, &block(&dx, k, (c.row * m, m), (c.col * kb, kb)), &format!("{at} dx"));
                close(&dwi, &block(&dw, k, (c.col * nb, nb), (c.row * kb, kb)), &format!("{at} dw"));
                close(&dbi, &db[c.col * nb + c.row * (nb / q)..][..nb / q], &format!("{at} db"));
            }
        }
    }

    #[test]
    fn split_layernorm_matches_the_whole_rows() {
        let dev = ReferenceDevice;
        let (q, m, h) = (2usize, 5usize, 12usize);
        let (x, g, b, dy) = (values(q * m * h, 8), values(h, 9), values(h, 10), values(q * m * h, 11));
        let rows = q * m;
        let (mut y, mut mean, mut rstd) = (dev.alloc(rows * h), dev.alloc(rows), dev.alloc(rows));
        dev.layernorm_forward(&mut y, (&mut mean, &mut rstd), &up(&x), (&up(&g), &up(&b)), Matrix { rows, cols: h });
        let (mut dx, mut dg, mut db) = (dev.alloc(rows * h), dev.alloc(h), dev.alloc(h));
        dev.layernorm_backward(
            &mut dx,
            (&mut dg, &mut db),
            &up(&dy),
            LayerNormSaved { inp: &up(&x), weight: &up(&g), mean: &mean, rstd: &rstd },
            Matrix { rows, cols: h },
        );
        let (y, dx, dg, db) = (whole(&y), whole(&dx), whole(&dg), whole(&db));
        let (hb, hs) = (h / q, h / (q * q));
        let got = on_grid(q, Algorithm::Panel, |c, s| {
            let dev = ReferenceDevice;
            let shard = |v: &[f32]| v[c.col * hb + c.row * hs..][..hs].to_vec();
            let (xi, gi, bi) = (up(block(&x, h, (c.row * m, m), (c.col * hb, hb))), up(shard(&g)), up(shard(&b)));
            let dyi = up(block(&dy, h, (c.row * m, m), (c.col * hb, hb)));
            let mut scratch = Scratch::default();
            let (mut yi, mut mi, mut ri) = (dev.alloc(m * hb), dev.alloc(m), dev.alloc(m));
            s.layernorm_forward(
                &dev,
                &mut yi,
                (&mut mi, &mut ri),
                &xi,
                (&gi, &bi),
                Matrix { rows: m, cols: h },
                &mut scratch,
            );
            let (mut dxi, mut dgi, mut dbi) = (dev.alloc(m * hb), dev.alloc(hs), dev.alloc(hs));
            s.layernorm_backward(
                &dev,
                &mut dxi,
                (&mut dgi, &mut dbi),
                &dyi,
                LayerNormSaved { inp: &xi, weight: &gi, mean: &mi, rstd: &ri },
                Matrix { rows: m, cols: h },
                &mut scratch,
            );
            (c, whole(yi), whole(dxi), whole(dgi), whole(dbi))
        });
        for (c, yi, dxi, dgi, dbi) in got {
            close(&yi, &block(&y, h, (c.row * m, m), (c.col * hb, hb)), "y");
            close(&dxi, &block(&dx, h, (c.row * m, m), (c.col * hb, hb)), "dx");
            close(&dgi, &dg[c.col * hb + c.row * hs..][..hs], "dgamma");
            close(&dbi, &db[c.col * hb + c.row * hs..][..hs], "dbeta");
        }
    }

    #[test]
    fn summa_logits_match_the_tied_output_layer() {
        let dev = ReferenceDevice;
        let (q, m, h, v) = (2usize, 3usize, 8usize, 10usize);
        let (x, e, dl) = (values(q * m * h, 5), values(v * h, 6), values(q * m * v, 7));
        let mut logits = dev.alloc(q * m * v);
        dev.linear_forward(&mut logits, &up(&x), &up(&e), None, Gemm { rows: q * m, k: h, n: v });
        let (mut dx, mut de) = (dev.alloc(q * m * h), dev.alloc(v * h));
        dev.linear_backward(
            Some(&mut dx),
            (&mut de, None),
            &up(&dl),
            &up(&x),
            &up(&e),
            Gemm { rows: q * m, k: h, n: v },
        );
        let (logits, dx, de) = (whole(&logits), whole(&dx), whole(&de));
        let (hb, vb) = (h / q, v / q);
        let got = on_grid(q, Algorithm::Panel, |c, s| {
            let dev = ReferenceDevice;
            let xi = up(block(&x, h, (c.row * m, m), (c.col * hb, hb)));
            let ei = up(block(&e, h, (c.row * vb, vb), (c.col * hb, hb)));
            let dli = up(block(&dl, v, (c.row * m, m), (c.col * vb, vb)));
            let mut scratch = Scratch::default();
            let mut li = dev.alloc(m * vb);
            s.logits_forward(&dev, &mut li, &xi, &ei, m, h, v, &mut scratch);
            let (mut dxi, mut dei) = (dev.alloc(m * hb), dev.alloc(vb * hb));
            s.logits_backward(&dev, &mut dxi, &mut dei, &dli, &xi, &ei, m, h, v, &mut scratch);
            (c, whole(li), whole(dxi), whole(dei))
        });
        for (c, li, dxi, dei) in got {
            close(&li, &block(&logits, v, (c.row * m, m), (c.col * vb, vb)), "logits");
            close(&dxi, &block(&dx, h, (c.row * m, m), (c.col * hb, hb)), "dx");
            close(&dei, &block(&de, h, (c.row * vb, vb), (c.col * hb, hb)), "de");
        }
    }
}
