//! The GPU Device's ops: `impl Device for GpuDevice`, each op one or a few launches of kernels of
//! the index (`kernels::Kernel`, one of `device::DEVICE_KERNELS`) with their arguments: the f32
//! kernels of `tensor_ops` on their own grids, the GEMMs, attention, casts and AdamW on the
//! geometry `kernels::plan` gives, on bf16 scratch copies of the GEMM and attention operands.

use super::buffer::{Elem, GpuBuf};
use super::device::{aligned, group_key, int, ok, GpuDevice, Scratch, SUM_SQUARES_CHUNK};
use super::kernels::plan::{linear_gemms, GemmOut, Op};
use super::kernels::Kernel;
use super::runtime::Arg::{self, Ptr, F32, F64, I32};
use crate::device::{AdamWStep, AttentionShape, CollectivesRequest, Device, DeviceComm, DeviceP2p};
use crate::comm::ReduceOp;
use crate::error::Result;
use crate::real::Precision;
use std::sync::atomic::Ordering;

impl Device for GpuDevice {
    type Buf = GpuBuf;
    type Half = GpuBuf;
    type Scalars = GpuBuf;

    fn describe(&self) -> String {
        format!("{}, bf16 GEMMs and attention ({})", self.rt.describe(), self.vendor.matrix_units())
    }
    fn alloc(&self, len: usize) -> GpuBuf {
        ok(GpuBuf::zeroed(&self.rt, len, Elem::F32))
    }
    fn len(&self, buf: &GpuBuf) -> usize {
        buf.len
    }
    fn upload(&self, dst: &mut GpuBuf, src: &[f32]) {
        assert_eq!(dst.len, src.len(), "upload: buffer and host lengths differ");
        if !src.is_empty() {
            // SAFETY: f32 has no padding; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 4 * src.len()) };
            ok(self.rt.copy_to_device(dst.ptr(), bytes));
        }
    }
    fn download(&self, src: &GpuBuf, dst: &mut [f32]) {
        assert_eq!(src.len, dst.len(), "download: buffer and host lengths differ");
        if !dst.is_empty() {
            // SAFETY: every bit pattern is a valid f32; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), 4 * dst.len()) };
            ok(self.to_host(bytes, src.ptr()));
        }
    }
    fn copy(&self, dst: &mut GpuBuf, dst_at: usize, src: &GpuBuf, src_at: usize, len: usize) {
        assert!(dst_at + len <= dst.len && src_at + len <= src.len, "copy: range outside a buffer");
        if len > 0 {
            ok(self.rt.copy_on_device(dst.ptr() + 4 * dst_at as u64, src.ptr() + 4 * src_at as u64, 4 * len));
        }
    }
    fn device_comm(&self, group: &dyn crate::comm::Comm) -> Option<&dyn DeviceComm<GpuBuf>> {
        let key = group_key(group);
        self.comms.iter().find(|(k, _)| *k == key).map(|(_, c)| &**c as &dyn DeviceComm<GpuBuf>)
    }
    fn device_all_reduce_scalars(&self, group: &dyn crate::comm::Comm, s: &mut GpuBuf, len: usize, op: ReduceOp) -> bool {
        assert!(s.elem == Elem::F64 && len <= s.len, "device_all_reduce_scalars: {len} values of f64 scalars");
        self.device_comm(group).map(|c| c.all_reduce_f64(s, len, op)).is_some()
    }
    fn device_p2p(&self) -> Option<&dyn DeviceP2p<GpuBuf>> {
        self.p2p.as_deref().map(|p| p as &dyn DeviceP2p<GpuBuf>)
    }
    fn attach_collectives(&mut self, request: &CollectivesRequest) -> Result<String> {
        match self.make_collectives.take() {
            Some(make) => make(self, request),
            None => Ok("collectives: MPI, device buffers staged through host memory".into()),
        }
    }
    fn fill(&self, dst: &mut GpuBuf, value: f32) {
        if dst.len > 0 {
            ok(self.rt.memset_u32(dst.ptr(), value.to_bits(), dst.len));
        }
    }

    fn add_assign(&self, acc: &mut GpuBuf, x: &GpuBuf) {
        assert_eq!(acc.len, x.len);
        self.elementwise(Kernel::AddAssignF32, x.len, &[Ptr(acc.ptr()), Ptr(x.ptr()), I32(int("n", x.len))]);
    }
    fn add(&self, out: &mut GpuBuf, a: &GpuBuf, b: &GpuBuf) {
        assert!(a.len == out.len && b.len == out.len);
        self.elementwise(Kernel::AddF32, a.len, &[Ptr(out.ptr()), Ptr(a.ptr()), Ptr(b.ptr()), I32(int("n", a.len))]);
    }
    fn sum_squares_into(&self, bufs: &[&GpuBuf], acc: &mut GpuBuf, slot: usize) {
        assert!(acc.elem == Elem::F64 && slot < acc.len, "sum_squares_into: slot {slot} outside the scalars");
        // One launch over every buffer (a table of their addresses, lengths and first blocks,
        // uploaded in one copy), then one thread adds the block partials buffer by buffer.
        let mut first_block = vec![0usize];
        for b in bufs {
            first_block.push(first_block[first_block.len() - 1] + b.len.div_ceil(SUM_SQUARES_CHUNK));
        }
        let blocks = first_block[bufs.len()];
        if blocks == 0 {
            return;
        }
        let mut table: Vec<u8> = bufs.iter().flat_map(|b| b.ptr().to_le_bytes()).collect();
        let lens = bufs.iter().map(|b| int("n", b.len));
        table.extend(lens.chain(first_block.iter().map(|&f| int("blocks", f))).flat_map(|x| x.to_le_bytes()));
        let table = self.upload_bytes(&table);
        let (count, tensors) = (bufs.len() as u64, table.pointer);
        let (lens, first) = (Ptr(tensors + 8 * count), Ptr(tensors + 12 * count));
        let partials = self.scratch(8 * blocks);
        let count = I32(int("tensors", bufs.len()));
        self.launch(Kernel::SumSquaresF32, [blocks, 1, 1], &[Ptr(partials.pointer), Ptr(tensors), lens, first, count]);
        let args = [Ptr(acc.ptr()), I32(int("slot", slot)), Ptr(partials.pointer), first, count];
        self.launch(Kernel::SumIntoF64, [1, 1, 1], &args);
    }
    fn clip_scale(&self, sum: &GpuBuf, sum_slot: usize, out: &mut GpuBuf, slot: usize, clip: f64, loss_scale: f64) {
        assert!(sum.elem == Elem::F64 && sum_slot < sum.len, "clip_scale: slot {sum_slot} outside the sums");
        assert!(out.elem == Elem::F64 && slot + 2 <= out.len, "clip_scale: slots {slot}.. outside the scalars");
        let (sum_at, out_at) = (I32(int("slot", sum_slot)), I32(int("slot", slot)));
        let args = [Ptr(sum.ptr()), sum_at, Ptr(out.ptr()), out_at, F64(clip), F64(loss_scale)];
        self.launch(Kernel::ClipScaleF64, [1, 1, 1], &args);
    }
    fn scalars(&self, len: usize) -> GpuBuf {
        ok(GpuBuf::zeroed(&self.rt, len, Elem::F64))
    }
    fn read_scalars(&self, src: &GpuBuf, out: &mut [f64]) {
        assert!(src.elem == Elem::F64 && out.len() <= src.len, "read_scalars: more values than the scalars hold");
        self.download_f64(&src.mem, out);
    }
    fn write_scalars(&self, dst: &mut GpuBuf, values: &[f64]) {
        assert!(dst.elem == Elem::F64 && values.len() <= dst.len, "write_scalars: more values than the scalars hold");
        if !values.is_empty() {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            ok(self.rt.copy_to_device(dst.ptr(), &bytes));
        }
    }

    fn embedding_forward(
        &self,
        out: &mut GpuBuf,
        tokens: &[u32],
        wte: &GpuBuf,
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        let (t, [v0, rows, b, s, h]) = self.token_args(tokens, vocab_start, wte.len / hidden, batch, seq, hidden);
        let n = int("batch·seq·hidden", batch * seq * hidden) as usize;
        self.elementwise(
            Kernel::EmbeddingFwdF32,
            n,
            &[Ptr(out.ptr()), Ptr(t.pointer), Ptr(wte.ptr()), v0, rows, b, s, h],
        );
    }
    fn embedding_backward(
        &self,
        dwte: &mut GpuBuf,
        dout: &GpuBuf,
        tokens: &[u32],
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        let (t, [v0, rows, b, s, h]) = self.token_args(tokens, vocab_start, dwte.len / hidden, batch, seq, hidden);
        let args = [Ptr(dwte.ptr()), Ptr(dout.ptr()), Ptr(t.pointer), v0, rows, b, s, h];
        self.columnwise(Kernel::EmbeddingBwdF32, hidden, &args);
    }
    fn position_forward(
        &self,
        out: &mut GpuBuf,
        wpe: &GpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        let [b, t, p, h] = position_args(batch, t0, positions, hidden);
        let n = int("positions·batch·hidden", positions * batch * hidden) as usize;
        self.elementwise(Kernel::PositionFwdF32, n, &[Ptr(out.ptr()), Ptr(wpe.ptr()), b, t, p, h]);
    }
    fn position_backward(
        &self,
        dwpe: &mut GpuBuf,
        dout: &GpuBuf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    ) {
        if hidden == 0 || positions == 0 {
            return;
        }
        let [b, t, p, h] = position_args(batch, t0, positions, hidden);
        let grid = [hidden.div_ceil(256), positions, 1];
        self.launch(Kernel::PositionBwdF32, grid, &[Ptr(dwpe.ptr()), Ptr(dout.ptr()), b, t, p, h]);
    }

    fn layernorm_forward(
        &self,
        out: &mut GpuBuf,
        mean: &mut GpuBuf,
        rstd: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: &GpuBuf,
        rows: usize,
        cols: usize,
    ) {
        int("rows·cols", rows * cols);
        let [r, c] = rows_cols(rows, cols);
        let [o, m, s, x, w, b] = [&*out, &*mean, &*rstd, inp, weight, bias].map(|b| Ptr(b.ptr()));
        self.rowwise(Kernel::LayernormFwdF32, rows, &[o, m, s, x, w, b, r, c]);
    }
    fn layernorm_backward(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dbias: &mut GpuBuf,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        rows: usize,
        cols: usize,
    ) {
        let [r, c] = rows_cols(rows, cols);
        int("rows·cols", rows * cols);
        let [dx, dy, x, w, m, s] = [&*dinp, dout, inp, weight, mean, rstd].map(|b| Ptr(b.ptr()));
        self.rowwise(Kernel::LayernormBwdDxF32, rows, &[dx, dy, x, w, m, s, r, c]);
        self.layernorm_param_grads([dweight, dbias], [dout, inp, mean, rstd], rows, cols);
    }

    fn layernorm_sums(&self, inp: &GpuBuf, rows: usize, cols: usize, mean: Option<&[f64]>, out: &mut [f64]) {
        let m = mean.map(|m| self.upload_f64(&m[..rows]));
        let sums = self.scratch(8 * rows);
        let [r, c] = rows_cols(rows, cols);
        let args = [Ptr(sums.pointer), Ptr(inp.ptr()), Ptr(m.as_ref().map_or(0, |m| m.pointer)), r, c];
        self.rowwise(Kernel::LayernormSumsF32, rows, &args);
        self.download_f64(&sums, &mut out[..rows]);
    }
    fn layernorm_apply(
        &self,
        out: &mut GpuBuf,
        mean_out: &mut GpuBuf,
        rstd_out: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: &GpuBuf,
        mean: &[f64],
        rstd: &[f64],
        rows: usize,
        cols: usize,
    ) {
        let (m, s) = (self.upload_f64(&mean[..rows]), self.upload_f64(&rstd[..rows]));
        let n = int("rows·cols", rows * cols) as usize;
        let [o, mo, so, x, w, b] = [&*out, &*mean_out, &*rstd_out, inp, weight, bias].map(|b| Ptr(b.ptr()));
        let [r, c] = rows_cols(rows, cols);
        self.elementwise(Kernel::LayernormApplyF32, n, &[o, mo, so, x, w, b, Ptr(m.pointer), Ptr(s.pointer), r, c]);
    }
    fn layernorm_backward_sums(
        &self,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        rows: usize,
        cols: usize,
        out: &mut [f64],
    ) {
        let sums = self.scratch(16 * rows);
        let [dy, x, w, m, s] = [dout, inp, weight, mean, rstd].map(|b| Ptr(b.ptr()));
        let [r, c] = rows_cols(rows, cols);
        self.rowwise(Kernel::LayernormBwdSumsF32, rows, &[Ptr(sums.pointer), dy, x, w, m, s, r, c]);
        self.download_f64(&sums, &mut out[..2 * rows]);
    }
    fn layernorm_backward_apply(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dbias: &mut GpuBuf,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        mean: &GpuBuf,
        rstd: &GpuBuf,
        sums: &[f64],
        n: usize,
        rows: usize,
        cols: usize,
    ) {
        let uploaded = self.upload_f64(&sums[..2 * rows]);
        let [r, c] = rows_cols(rows, cols);
        let elements = int("rows·cols", rows * cols) as usize;
        let [dx, dy, x, w, m, s] = [&*dinp, dout, inp, weight, mean, rstd].map(|b| Ptr(b.ptr()));
        let args = [dx, dy, x, w, m, s, Ptr(uploaded.pointer), I32(int("n", n)), r, c];
        self.elementwise(Kernel::LayernormBwdApplyDxF32, elements, &args);
        self.layernorm_param_grads([dweight, dbias], [dout, inp, mean, rstd], rows, cols);
    }

    fn linear_forward(
        &self,
        out: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: Option<&GpuBuf>,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        if rows == 0 || n == 0 {
            return;
        }
        assert!(out.len >= rows * n && weight.len >= n * k);
        let (a, w) = (self.to_bf16(inp, rows * k), self.to_bf16(weight, n * k));
        let op = linear_gemms(self.wgmma, aligned(&[a.pointer, w.pointer]), rows, k, n, GemmOut::F32).forward;
        let (m_, n_, k_) = (I32(int("rows", rows)), I32(int("n", n)), I32(int("k", k)));
        let (out, bias) = (Ptr(out.ptr()), Ptr(bias.map_or(0, |b| b.ptr())));
        let args = match op {
            Op::GemmFwdSm90 { .. } => {
                let [ma, mw] = [self.operand_map(a.pointer, rows, k, false), self.operand_map(w.pointer, n, k, false)];
                [ma, mw, out, bias, Ptr(0), m_, n_, k_, I32(0)]
            }
            _ => [out, Ptr(a.pointer), Ptr(w.pointer), bias, Ptr(0), m_, n_, k_, I32(0)],
        };
        self.run(op, &args);
    }
    fn linear_backward(
        &self,
        dinp: Option<&mut GpuBuf>,
        dweight: &mut GpuBuf,
        dbias: Option<&mut GpuBuf>,
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        if rows == 0 || n == 0 || k == 0 {
            return;
        }
        let (m_, n_, k_) = (I32(int("rows", rows)), I32(int("n", n)), I32(int("k", k)));
        let d = self.to_bf16(dout, rows * n);
        if let Some(dinp) = dinp {
            let w = self.to_bf16(weight, n * k);
            let op =
                linear_gemms(self.wgmma, aligned(&[d.pointer, w.pointer]), rows, k, n, GemmOut::F32).backward_input;
            let args = match op {
                Op::GemmBwdInputSm90 { .. } => {
                    let [md, mw] =
                        [self.operand_map(d.pointer, rows, n, false), self.operand_map(w.pointer, n, k, true)];
                    [md, mw, Ptr(dinp.ptr()), m_, n_, k_]
                }
                _ => [Ptr(dinp.ptr()), Ptr(d.pointer), Ptr(w.pointer), m_, n_, k_],
            };
            self.run(op, &args);
        }
        let x = self.to_bf16(inp, rows * k);
        let op = linear_gemms(self.wgmma, aligned(&[d.pointer, x.pointer]), rows, k, n, GemmOut::F32).backward_weight;
        let args = match op {
            Op::GemmBwdWeightSm90 { .. } => {
                let [md, mx] = [self.operand_map(d.pointer, rows, n, true), self.operand_map(x.pointer, rows, k, true)];
                [md, mx, Ptr(dweight.ptr()), m_, n_, k_]
            }
            _ => [Ptr(dweight.ptr()), Ptr(d.pointer), Ptr(x.pointer), m_, n_, k_],
        };
        self.run(op, &args);
        if let Some(dbias) = dbias {
            self.columnwise(Kernel::ColumnSumAddF32, n, &[Ptr(dbias.ptr()), Ptr(dout.ptr()), m_, n_]);
        }
    }

    fn gelu_forward(&self, out: &mut GpuBuf, inp: &GpuBuf) {
        self.elementwise(Kernel::GeluFwdF32, inp.len, &[Ptr(out.ptr()), Ptr(inp.ptr()), I32(int("n", inp.len))]);
    }
    fn gelu_backward(&self, dinp: &mut GpuBuf, inp: &GpuBuf, dout: &GpuBuf) {
        self.elementwise(
            Kernel::GeluBwdF32,
            inp.len,
            &[Ptr(dinp.ptr()), Ptr(inp.ptr()), Ptr(dout.ptr()), I32(int("n", inp.len))],
        );
    }

    fn attention_forward(&self, out: &mut GpuBuf, lse: &mut GpuBuf, qkv: &GpuBuf, shape: AttentionShape) {
        let (rows, w) = (shape.rows(), shape.width());
        assert!(out.len >= rows * w && lse.len >= rows * shape.heads && qkv.len >= 3 * rows * w);
        if rows == 0 {
            return;
        }
        let q = self.to_bf16(qkv, 3 * rows * w);
        let o = self.scratch(2 * rows * w);
        let (b, s, h) = (I32(int("batch", shape.batch)), I32(int("seq", shape.seq)), I32(int("heads", shape.heads)));
        self.run(
            Op::AttentionFwd { batch: shape.batch, seq: shape.seq, heads: shape.heads, head_dim: shape.head_dim },
            &[Ptr(o.pointer), Ptr(lse.ptr()), Ptr(q.pointer), b, s, h],
        );
        self.bf16_to_f32(out.ptr(), o.pointer, rows * w);
    }
    fn attention_backward(
        &self,
        dqkv: &mut GpuBuf,
        dout: &GpuBuf,
        qkv: &GpuBuf,
        out: &GpuBuf,
        lse: &GpuBuf,
        shape: AttentionShape,
    ) {
        let (rows, w) = (shape.rows(), shape.width());
        assert!(dqkv.len >= 3 * rows * w);
        if rows == 0 {
            return;
        }
        let (q, o, d) = (self.to_bf16(qkv, 3 * rows * w), self.to_bf16(out, rows * w), self.to_bf16(dout, rows * w));
        let delta = self.scratch(4 * rows * shape.heads);
        let grad = self.scratch(2 * 3 * rows * w);
        let (b, s, h) = (I32(int("batch", shape.batch)), I32(int("seq", shape.seq)), I32(int("heads", shape.heads)));
        let (batch, seq, heads, head_dim) = (shape.batch, shape.seq, shape.heads, shape.head_dim);
        self.run(
            Op::AttentionBwdDelta { batch, seq, heads, head_dim },
            &[Ptr(delta.pointer), Ptr(d.pointer), Ptr(o.pointer), b, s, h, I32(int("head dim", head_dim))],
        );
        let args = [Ptr(grad.pointer), Ptr(q.pointer), Ptr(d.pointer), Ptr(lse.ptr()), Ptr(delta.pointer), b, s, h];
        self.run(Op::AttentionBwdDkv { batch, seq, heads, head_dim }, &args);
        self.run(Op::AttentionBwdDq { batch, seq, heads, head_dim }, &args);
        self.bf16_to_f32(dqkv.ptr(), grad.pointer, 3 * rows * w);
    }

    fn add_bias(&self, out: &mut GpuBuf, bias: &GpuBuf, rows: usize, cols: usize) {
        self.elementwise(
            Kernel::AddBiasF32,
            int("rows·cols", rows * cols) as usize,
            &[Ptr(out.ptr()), Ptr(bias.ptr()), I32(int("rows", rows)), I32(int("cols", cols))],
        );
    }

    fn cross_entropy_max(&self, logits: &GpuBuf, rows: usize, vocab: usize, max: &mut GpuBuf) {
        int("rows·vocab", rows * vocab);
        assert!(max.elem == Elem::F64 && max.len >= rows, "cross_entropy_max: scalars shorter than the rows");
        self.rowwise(
            Kernel::XentMaxF32,
            rows,
            &[Ptr(max.ptr()), Ptr(logits.ptr()), I32(int("rows", rows)), I32(int("vocab", vocab))],
        );
    }
    fn cross_entropy_partials(
        &self,
        logits: &GpuBuf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &GpuBuf,
        stats: &mut GpuBuf,
    ) {
        assert!(stats.elem == Elem::F64 && stats.len >= 2 * rows, "cross_entropy_partials: scalars too short");
        let t = self.upload_u32(&targets[..rows]);
        self.rowwise(
            Kernel::XentPartialsF32,
            rows,
            &[
                Ptr(stats.ptr()),
                Ptr(stats.ptr() + 8 * rows as u64),
                Ptr(logits.ptr()),
                Ptr(t.pointer),
                I32(int("vocab_start", vocab_start)),
                Ptr(max.ptr()),
                I32(int("rows", rows)),
                I32(int("vocab", vocab)),
            ],
        );
    }
    fn cross_entropy_loss(&self, max: &GpuBuf, stats: &GpuBuf, rows: usize, acc: &mut GpuBuf, slot: usize) {
        assert!(acc.elem == Elem::F64 && slot < acc.len, "cross_entropy_loss: slot {slot} outside the scalars");
        let args = [Ptr(acc.ptr()), I32(int("slot", slot)), Ptr(max.ptr()), Ptr(stats.ptr()), I32(int("rows", rows))];
        self.launch(Kernel::XentLossF64, [1, 1, 1], &args);
    }
    fn cross_entropy_backward(
        &self,
        logits: &mut GpuBuf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &GpuBuf,
        stats: &GpuBuf,
        grad_scale: f32,
    ) {
        let t = self.upload_u32(&targets[..rows]);
        self.elementwise(
            Kernel::XentBwdF32,
            int("rows·vocab", rows * vocab) as usize,
            &[
                Ptr(logits.ptr()),
                Ptr(t.pointer),
                I32(int("vocab_start", vocab_start)),
                Ptr(max.ptr()),
                Ptr(stats.ptr()),
                F32(grad_scale),
                I32(int("rows", rows)),
                I32(int("vocab", vocab)),
            ],
        );
    }

    fn set_matmul_precision(&self, precision: Precision) {
        self.bf16_matmul.store(precision == Precision::Bf16, Ordering::Relaxed);
    }
    fn matmul_rounds_operands(&self, precision: Precision) -> bool {
        // The GEMMs cast both f32 operands to bf16 (round to nearest even) before multiplying,
        // whatever the precision: exactly `Precision::Bf16.round`.
        precision == Precision::Bf16
    }

    fn round_to(&self, buf: &mut GpuBuf, precision: Precision) {
        match precision {
            Precision::F32 => {}
            Precision::Bf16 => {
                self.elementwise(Kernel::RoundBf16F32, buf.len, &[Ptr(buf.ptr()), I32(int("n", buf.len))]);
            }
            Precision::F16 => {
                // No fp16 kernels: the Device is bf16-only (`--device cuda` requires --bf16),
                // so this stays correct, on the host.
                let mut host = vec![0f32; buf.len];
                self.download(buf, &mut host);
                for x in host.iter_mut() {
                    *x = precision.round(*x);
                }
                self.upload(buf, &host);
            }
        }
    }

    fn to_half(&self, buf: &GpuBuf, precision: Precision) -> GpuBuf {
        let mut half = ok(GpuBuf::uninit(&self.rt, buf.len, Elem::Bits16));
        self.to_half_into(buf, precision, &mut half);
        half
    }
    fn to_half_into(&self, buf: &GpuBuf, precision: Precision, half: &mut GpuBuf) {
        assert!(half.elem == Elem::Bits16 && half.len == buf.len, "to_half_into: buffer and copy lengths differ");
        if buf.len == 0 {
            return;
        }
        match precision {
            // Cast on the device into device memory; the values are already bf16, so exact.
            Precision::Bf16 => self.run(
                Op::CastF32ToBf16 { n: buf.len },
                &[Ptr(half.ptr()), Ptr(buf.ptr()), I32(int("n", buf.len))],
            ),
            // No fp16 kernels (`--device cuda|hip` requires --bf16): correct, through the host.
            _ => {
                let mut host = vec![0f32; buf.len];
                self.download(buf, &mut host);
                let bits: Vec<u8> = host.iter().flat_map(|&x| precision.to_bits16(x).to_le_bytes()).collect();
                ok(self.rt.copy_to_device(half.ptr(), &bits));
            }
        }
    }
    fn load_half(&self, src: &GpuBuf, precision: Precision, dst: &mut GpuBuf) {
        assert!(src.elem == Elem::Bits16 && dst.len == src.len, "load_half: buffer and copy lengths differ");
        match precision {
            Precision::Bf16 => self.bf16_to_f32(dst.ptr(), src.ptr(), src.len),
            _ => {
                let mut bits = vec![0u8; 2 * src.len];
                if !bits.is_empty() {
                    ok(self.to_host(&mut bits, src.ptr()));
                }
                let host: Vec<f32> =
                    bits.chunks_exact(2).map(|b| precision.from_bits16(u16::from_le_bytes([b[0], b[1]]))).collect();
                self.upload(dst, &host);
            }
        }
    }
    fn half_len(&self, half: &GpuBuf) -> usize {
        half.len
    }

    fn work_counters(&self) -> Option<crate::device::WorkCounters> {
        Some(self.rt.tally().snapshot())
    }
    fn adamw(
        &self,
        param: &mut GpuBuf,
        grad: &GpuBuf,
        m: &mut GpuBuf,
        v: &mut GpuBuf,
        step: AdamWStep,
        (scales, slot): (&GpuBuf, usize),
        working: Option<(&mut GpuBuf, Precision)>,
    ) {
        assert!(scales.elem == Elem::F64 && slot < scales.len, "adamw: gradient scale slot {slot} outside the scalars");
        let c1 = 1.0 / (1.0 - (step.beta1 as f64).powi(step.step as i32));
        let c2 = 1.0 / (1.0 - (step.beta2 as f64).powi(step.step as i32));
        if grad.len == 0 {
            return;
        }
        self.run(
            Op::AdamW { n: grad.len },
            &[
                Ptr(param.ptr()),
                Ptr(0),
                Ptr(grad.ptr()),
                Ptr(m.ptr()),
                Ptr(v.ptr()),
                I32(int("n", grad.len)),
                F32(step.lr),
                F32(step.beta1),
                F32(step.beta2),
                F32(step.eps),
                F32(step.weight_decay),
                Ptr(scales.ptr() + 8 * slot as u64),
                F32(c1 as f32),
                F32(c2 as f32),
                // The kernel rounds to bf16 itself; other precisions copy and round after it.
                Ptr(working.as_ref().filter(|(_, p)| *p == Precision::Bf16).map_or(0, |(w, _)| w.ptr())),
            ],
        );
        if let Some((w, precision)) = working.filter(|(_, p)| *p != Precision::Bf16) {
            self.copy(w, 0, param, 0, param.len);
            self.round_to(w, precision);
        }
    }
}

/// The `int` arguments rows and cols of the LayerNorm kernels.
fn rows_cols(rows: usize, cols: usize) -> [Arg; 2] {
    [I32(int("rows", rows)), I32(int("cols", cols))]
}

/// The `int` arguments of the position-embedding kernels.
fn position_args(batch: usize, t0: usize, positions: usize, hidden: usize) -> [Arg; 4] {
    [I32(int("batch", batch)), I32(int("t0", t0)), I32(int("positions", positions)), I32(int("hidden", hidden))]
}

/// What more than one op launches the same way.
impl GpuDevice {
    /// The word-embedding kernels' tokens, uploaded, and their `int` arguments (vocab_start,
    /// vocabulary rows of the table, batch, seq, hidden).
    fn token_args(
        &self,
        tokens: &[u32],
        vocab_start: usize,
        vocab_rows: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) -> (Scratch<'_>, [Arg; 5]) {
        let t = self.upload_u32(&tokens[..batch * seq]);
        let sizes = [
            ("vocab_start", vocab_start),
            ("vocab rows", vocab_rows),
            ("batch", batch),
            ("seq", seq),
            ("hidden", hidden),
        ];
        (t, sizes.map(|(what, v)| I32(int(what, v))))
    }

    /// dweight += Σ_rows dout · x̂ and dbias += Σ_rows dout, one thread per column: the second half
    /// of both LayerNorm backwards (whole rows and split rows).
    /// `inputs` are dout, inp, mean and rstd.
    fn layernorm_param_grads(
        &self,
        [dweight, dbias]: [&mut GpuBuf; 2],
        inputs: [&GpuBuf; 4],
        rows: usize,
        cols: usize,
    ) {
        let [dout, inp, mean, rstd] = inputs.map(|b| Ptr(b.ptr()));
        let [r, c] = rows_cols(rows, cols);
        let args = [Ptr(dweight.ptr()), Ptr(dbias.ptr()), dout, inp, mean, rstd, r, c];
        self.columnwise(Kernel::LayernormBwdParamsF32, cols, &args);
    }
}
