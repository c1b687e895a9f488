//! The GPU Device's ops: `impl Device for GpuDevice`, each op one or a few launches of kernels of
//! the index (`kernels::Kernel`, one of `device::DEVICE_KERNELS`) with their arguments: the f32
//! kernels of `tensor_ops` on their own grids, the GEMMs, attention, the bf16 LayerNorm and GELU,
//! casts and AdamW on the geometry `kernels::plan` gives. Buffers are f32 or bf16 (`alloc_in`):
//! each op picks its kernel from the types of its activations (the bf16 kernels for bf16
//! storage) and takes every operand in the type that kernel reads through `GpuDevice::view` /
//! `view_mut`, which cast an operand of the other type into scratch (and an output back) - the
//! one fallback for any mix, so an op on f32 buffers casts GEMM and attention operands to bf16 as
//! before, and one on bf16 storage casts nothing on the hot path.

use super::adamw::{bias_corrections, working_pointers};
use super::buffer::{Elem, GpuBuf};
use super::device::{aligned, first_blocks, group_key, int, ok, GpuDevice, Scratch, SUM_SQUARES_CHUNK};
use super::kernels::args;
use super::kernels::plan::{
    column_sum_partials, layernorm_bwd_partials, linear_gemms, sm90_weight_partials, EmbeddingSegments, GemmOut, Op,
    COLUMN_SUM_COUNTERS, LAYERNORM_BWD_COUNTERS, SM90_SLICE_MAX_TILES,
};
use crate::comm::ReduceOp;
use crate::device::prelude::*;
use crate::device::{
    AdamWStep, AdamWTensor, CollectivesRequest, DeviceComm, DeviceP2p, Dropout, Gelu, Gemm, LayerNormSaved, Logits,
    Matrix, Tokens,
};
use crate::error::Result;
use crate::real::Precision;
use std::sync::atomic::Ordering;

impl Memory for GpuDevice {
    type Buf = GpuBuf;

    type Half = GpuBuf;

    type Scalars = GpuBuf;

    fn describe(&self) -> String {
        // The runtime names the compute capability; the kernels are built for `arch` (sm_90a on
        // 9.0, or TRIDENT_CUDA_ARCH), whose GEMMs are wgmma fed by TMA.
        let gemms = if self.wgmma { "wgmma + TMA GEMMs, mma.sync attention" } else { self.vendor.matrix_units() };
        format!(
            "{}, kernels for {}, {} GEMMs and attention ({gemms})",
            self.rt.describe(),
            self.arch,
            self.storage.name()
        )
    }

    fn alloc(&self, len: usize) -> GpuBuf {
        ok(GpuBuf::zeroed(&self.rt, len, Elem::F32))
    }

    fn alloc_in(&self, len: usize, precision: Precision) -> GpuBuf {
        match self.stores(precision) {
            true => ok(GpuBuf::zeroed(&self.rt, len, self.half)),
            // The other 16-bit format has no module on this Device: f32 storage.
            false => self.alloc(len),
        }
    }

    fn stores(&self, precision: Precision) -> bool {
        // The precision its kernels store: bf16, or binary16 on the fp16 module.
        precision == self.storage.precision()
    }

    fn len(&self, buf: &GpuBuf) -> usize {
        buf.len
    }

    fn bytes(&self, buf: &GpuBuf) -> usize {
        buf.elem.bytes() * buf.len
    }

    fn alloc_like_len(&self, buf: &GpuBuf, len: usize) -> GpuBuf {
        ok(GpuBuf::zeroed(&self.rt, len, buf.elem))
    }

    fn upload(&self, dst: &mut GpuBuf, src: &[f32]) {
        assert_eq!(dst.len, src.len(), "upload: buffer and host lengths differ");
        if dst.elem == self.half {
            let bits: Vec<u8> = src.iter().flat_map(|&x| self.half_bits(x).to_le_bytes()).collect();
            return ok(self.rt.copy_to_device(dst.ptr(), &bits));
        }
        assert_eq!(dst.elem, Elem::F32, "upload: not an f32 or 16-bit buffer");
        if !src.is_empty() {
            // SAFETY: f32 has no padding; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 4 * src.len()) };
            ok(self.rt.copy_to_device(dst.ptr(), bytes));
        }
    }

    fn host_threads(&self) -> usize {
        // The initial weights are drawn on the host: this process's CPUs (the job's share).
        crate::comm::runtime::process_cpus()
    }

    fn download(&self, src: &GpuBuf, dst: &mut [f32]) {
        assert_eq!(src.len, dst.len(), "download: buffer and host lengths differ");
        if src.elem == self.half {
            let mut bits = vec![0u8; 2 * src.len];
            if !bits.is_empty() {
                ok(self.to_host(&mut bits, src.ptr()));
            }
            let precision = self.storage.precision();
            for (d, b) in dst.iter_mut().zip(bits.chunks_exact(2)) {
                *d = precision.from_bits16(u16::from_le_bytes([b[0], b[1]]));
            }
            return;
        }
        assert_eq!(src.elem, Elem::F32, "download: not an f32 or 16-bit buffer");
        if !dst.is_empty() {
            // SAFETY: every bit pattern is a valid f32; the byte view covers exactly the slice.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), 4 * dst.len()) };
            ok(self.to_host(bytes, src.ptr()));
        }
    }

    fn copy(&self, dst: &mut GpuBuf, dst_at: usize, src: &GpuBuf, src_at: usize, len: usize) {
        self.cast(dst, dst_at, src, src_at, len);
    }

    fn fill(&self, dst: &mut GpuBuf, value: f32) {
        if dst.len == 0 {
            return;
        }
        match dst.elem {
            // Two 16-bit elements a word; the allocation is whole words.
            e if e == self.half => {
                let bits = self.half_bits(value) as u32;
                ok(self.rt.memset_u32(dst.ptr(), bits | bits << 16, dst.len.div_ceil(2)))
            }
            Elem::F32 => ok(self.rt.memset_u32(dst.ptr(), value.to_bits(), dst.len)),
            e => panic!("fill: a {e:?} buffer"),
        }
    }

    fn zero_buffers(&self, bufs: Vec<&mut GpuBuf>) {
        self.zero_tensors(bufs);
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

    fn round_to(&self, buf: &mut GpuBuf, precision: Precision) {
        match precision {
            // 16-bit storage holds nothing else.
            Precision::F32 => {}
            p if p == self.storage.precision() && buf.elem == self.half => {}
            // round_bf16_f32 rounds to the module's storage type (binary16 on the fp16 module,
            // overflow to infinity: fp16's gradients, `train::chunk`).
            p if p == self.storage.precision() => {
                self.elementwise(buf.len, args::round_bf16_f32(buf.ptr(), int("n", buf.len)));
            }
            _ => {
                // The other 16-bit format has no module on this Device (training opens the one of
                // its precision): correct, on the host.
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
            p if p == self.storage.precision() && buf.elem == self.half => {
                ok(self.rt.copy_on_device(half.ptr(), buf.ptr(), 2 * buf.len))
            }
            // Cast on the device into device memory; the values are already 16-bit, so exact.
            p if p == self.storage.precision() => {
                let l = args::cast_f32_to_bf16(half.ptr(), buf.ptr(), int("n", buf.len));
                self.run(Op::CastF32ToBf16 { n: buf.len }, l)
            }
            // The other format has no module on this Device: correct, through the host.
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
            p if p == self.storage.precision() && dst.elem == self.half => {
                ok(self.rt.copy_on_device(dst.ptr(), src.ptr(), 2 * src.len))
            }
            p if p == self.storage.precision() && src.len > 0 => {
                let l = args::cast_bf16_to_f32(dst.ptr(), src.ptr(), int("n", src.len));
                self.run(Op::CastBf16ToF32 { n: src.len }, l)
            }
            p if p == self.storage.precision() => {}
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

    fn profiler(&self, on: bool) -> crate::error::Result<()> {
        self.rt.profiler(on)
    }
}

impl ElementwiseOps for GpuDevice {
    fn add_assign(&self, acc: &mut GpuBuf, x: &GpuBuf) {
        assert_eq!(acc.len, x.len);
        let (x, acc) = (self.view(x, Elem::F32), self.view_mut(acc, Elem::F32, false));
        self.elementwise(x.len, args::add_assign_f32(acc.ptr(), x.ptr(), int("n", x.len)));
    }

    fn add(&self, out: &mut GpuBuf, a: &GpuBuf, b: &GpuBuf) {
        assert!(a.len == out.len && b.len == out.len);
        let (a, b, out) = (self.view(a, Elem::F32), self.view(b, Elem::F32), self.view_mut(out, Elem::F32, true));
        self.elementwise(a.len, args::add_f32(out.ptr(), a.ptr(), b.ptr(), int("n", a.len)));
    }

    fn gelu_forward(&self, out: &mut GpuBuf, inp: &GpuBuf, form: Gelu) {
        let (e, n, erf) = (activation(inp), inp.len, i32::from(form == Gelu::Erf));
        let (x, o) = (self.view(inp, e), self.view_mut(out, e, out.len == n));
        let (o, x, count) = (o.ptr(), x.ptr(), int("n", n));
        match e {
            Elem::Bf16 | Elem::F16 if n > 0 => self.run(Op::GeluFwd { n }, args::gelu_fwd_bf16(o, x, count, erf)),
            Elem::Bf16 | Elem::F16 => {}
            _ => self.elementwise(n, args::gelu_fwd_f32(o, x, count, erf)),
        }
    }

    fn gelu_backward(&self, dinp: &mut GpuBuf, inp: &GpuBuf, dout: &GpuBuf, form: Gelu) {
        let (e, n, erf) = (activation(inp), inp.len, i32::from(form == Gelu::Erf));
        let (x, dy, dx) = (self.view(inp, e), self.view(dout, e), self.view_mut(dinp, e, dinp.len == n));
        let (dx, x, dy, count) = (dx.ptr(), x.ptr(), dy.ptr(), int("n", n));
        match e {
            Elem::Bf16 | Elem::F16 if n > 0 => self.run(Op::GeluBwd { n }, args::gelu_bwd_bf16(dx, x, dy, count, erf)),
            Elem::Bf16 | Elem::F16 => {}
            _ => self.elementwise(n, args::gelu_bwd_f32(dx, x, dy, count, erf)),
        }
    }

    fn swiglu_forward(&self, out: &mut GpuBuf, inp: &GpuBuf, rows: usize, f: usize) {
        self.swiglu_fwd(out, inp, rows, f)
    }

    fn swiglu_backward(&self, dinp: &mut GpuBuf, inp: &GpuBuf, dout: &GpuBuf, rows: usize, f: usize) {
        self.swiglu_bwd(dinp, inp, dout, rows, f)
    }

    fn add_bias(&self, out: &mut GpuBuf, bias: &GpuBuf, Matrix { rows, cols }: Matrix) {
        let (bias, out) = (self.view(bias, Elem::F32), self.view_mut(out, Elem::F32, false));
        let l = args::add_bias_f32(out.ptr(), bias.ptr(), int("rows", rows), int("cols", cols));
        self.elementwise(int("rows·cols", rows * cols) as usize, l);
    }

    fn bias_dropout_add(
        &self,
        out: &mut GpuBuf,
        inputs: (&GpuBuf, &GpuBuf),
        bias: Option<&GpuBuf>,
        d: &Dropout,
        shape: Matrix,
    ) {
        self.launch_bias_dropout_add(out, inputs, bias, d, shape)
    }

    fn dropout(&self, x: &mut GpuBuf, d: &Dropout, shape: Matrix) {
        self.launch_dropout(x, d, shape)
    }
}

impl NormOps for GpuDevice {
    fn layernorm_forward(
        &self,
        out: &mut GpuBuf,
        (mean, rstd): (&mut GpuBuf, &mut GpuBuf),
        inp: &GpuBuf,
        (weight, bias): (&GpuBuf, &GpuBuf),
        Matrix { rows, cols }: Matrix,
    ) {
        int("rows·cols", rows * cols);
        let [r, c] = rows_cols(rows, cols);
        // bf16 activations: layernorm_fwd_bf16 (bf16 in and out, f32 weight, bias, statistics).
        let e = activation(inp);
        let x = self.view(inp, e);
        let o = self.view_mut(out, e, out.len == rows * cols);
        let (m, s) = (self.view_mut(mean, Elem::F32, false), self.view_mut(rstd, Elem::F32, false));
        let (w, b) = (self.view(weight, Elem::F32), self.view(bias, Elem::F32));
        let [o, m, s, x, w, b] = [&*o, &*m, &*s, &*x, &*w, &*b].map(|b| b.ptr());
        match e {
            Elem::Bf16 | Elem::F16 => {
                let l = args::layernorm_fwd_bf16(o, m, s, 0, x, 0, w, b, r, c);
                self.run(Op::LayernormFwd { rows, channels: cols }, l)
            }
            _ => self.rowwise(rows, args::layernorm_fwd_f32(o, m, s, x, w, b, r, c)),
        }
    }

    fn layernorm_backward(
        &self,
        dinp: &mut GpuBuf,
        (dweight, dbias): (&mut GpuBuf, &mut GpuBuf),
        dout: &GpuBuf,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, GpuBuf>,
        Matrix { rows, cols }: Matrix,
    ) {
        let [r, c] = rows_cols(rows, cols);
        int("rows·cols", rows * cols);
        // bf16 gradients: layernorm_bwd_bf16, the whole backward in one launch (bf16 dinp "+=",
        // f32 dweight and dbias "+=" through its block partials and the Device's counters).
        if activation(dout) == self.half {
            let [dy, x] = [dout, inp].map(|b| self.view(b, self.half));
            let [w, m, s] = [weight, mean, rstd].map(|b| self.view(b, Elem::F32));
            let dx = self.view_mut(dinp, self.half, false);
            let (dw, db) = (self.view_mut(dweight, Elem::F32, false), self.view_mut(dbias, Elem::F32, false));
            let partials = self.scratch(4 * layernorm_bwd_partials(rows, cols));
            let counter = self.zeroed_once(&self.counter, LAYERNORM_BWD_COUNTERS);
            let [dx, dw, db, dy, x, w, m, s] = [&*dx, &*dw, &*db, &*dy, &*x, &*w, &*m, &*s].map(|b| b.ptr());
            let (p, k) = (partials.pointer, counter.pointer());
            let l = args::layernorm_bwd_bf16(dx, dw, db, p, k, dy, x, w, m, s, r, c);
            return self.run(Op::LayernormBwd { rows, channels: cols }, l);
        }
        let [dy, x, w, m, s] = [dout, inp, weight, mean, rstd].map(|b| self.view(b, Elem::F32));
        {
            let dx = self.view_mut(dinp, Elem::F32, false);
            let [dx, dy, x, w, m, s] = [&*dx, &*dy, &*x, &*w, &*m, &*s].map(|b| b.ptr());
            self.rowwise(rows, args::layernorm_bwd_dx_f32(dx, dy, x, w, m, s, r, c));
        }
        self.layernorm_param_grads([dweight, dbias], [&*dy, &*x, &*m, &*s], rows, cols);
    }

    fn layernorm_sums(&self, inp: &GpuBuf, Matrix { rows, cols }: Matrix, mean: Option<&[f64]>, out: &mut [f64]) {
        let inp = self.view(inp, Elem::F32);
        let m = mean.map(|m| self.upload_f64(&m[..rows]));
        let sums = self.scratch(8 * rows);
        let [r, c] = rows_cols(rows, cols);
        let l = args::layernorm_sums_f32(sums.pointer, inp.ptr(), m.as_ref().map_or(0, |m| m.pointer), r, c);
        self.rowwise(rows, l);
        self.download_f64(&sums, &mut out[..rows]);
    }

    fn layernorm_apply(
        &self,
        out: &mut GpuBuf,
        (mean_out, rstd_out): (&mut GpuBuf, &mut GpuBuf),
        inp: &GpuBuf,
        (weight, bias): (&GpuBuf, &GpuBuf),
        (mean, rstd): (&[f64], &[f64]),
        Matrix { rows, cols }: Matrix,
    ) {
        let (m, s) = (self.upload_f64(&mean[..rows]), self.upload_f64(&rstd[..rows]));
        let n = int("rows·cols", rows * cols) as usize;
        let [inp, weight, bias] = [inp, weight, bias].map(|b| self.view(b, Elem::F32));
        let out = self.view_mut(out, Elem::F32, false);
        let (mean_out, rstd_out) =
            (self.view_mut(mean_out, Elem::F32, false), self.view_mut(rstd_out, Elem::F32, false));
        let [inp, weight, bias] = [&*inp, &*weight, &*bias];
        let [o, mo, so, x, w, b] = [&*out, &*mean_out, &*rstd_out, inp, weight, bias].map(|b| b.ptr());
        let [r, c] = rows_cols(rows, cols);
        self.elementwise(n, args::layernorm_apply_f32(o, mo, so, x, w, b, m.pointer, s.pointer, r, c));
    }

    fn layernorm_backward_sums(
        &self,
        dout: &GpuBuf,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, GpuBuf>,
        Matrix { rows, cols }: Matrix,
        out: &mut [f64],
    ) {
        let sums = self.scratch(16 * rows);
        let views = [dout, inp, weight, mean, rstd].map(|b| self.view(b, Elem::F32));
        let [dy, x, w, m, s] = [0, 1, 2, 3, 4].map(|i| views[i].ptr());
        let [r, c] = rows_cols(rows, cols);
        self.rowwise(rows, args::layernorm_bwd_sums_f32(sums.pointer, dy, x, w, m, s, r, c));
        self.download_f64(&sums, &mut out[..2 * rows]);
    }

    fn layernorm_backward_apply(
        &self,
        dinp: &mut GpuBuf,
        (dweight, dbias): (&mut GpuBuf, &mut GpuBuf),
        dout: &GpuBuf,
        LayerNormSaved { inp, weight, mean, rstd }: LayerNormSaved<'_, GpuBuf>,
        (sums, n): (&[f64], usize),
        Matrix { rows, cols }: Matrix,
    ) {
        let uploaded = self.upload_f64(&sums[..2 * rows]);
        let [r, c] = rows_cols(rows, cols);
        let elements = int("rows·cols", rows * cols) as usize;
        let [dy, x, w, m, s] = [dout, inp, weight, mean, rstd].map(|b| self.view(b, Elem::F32));
        {
            let dx = self.view_mut(dinp, Elem::F32, false);
            let [dx, dy, x, w, m, s] = [&*dx, &*dy, &*x, &*w, &*m, &*s].map(|b| b.ptr());
            let l = args::layernorm_bwd_apply_dx_f32(dx, dy, x, w, m, s, uploaded.pointer, int("n", n), r, c);
            self.elementwise(elements, l);
        }
        self.layernorm_param_grads([dweight, dbias], [&*dy, &*x, &*m, &*s], rows, cols);
    }

    // The Llama-family ops: `llama_ops` (what has no kernel yet abandons the op with `unbuilt`'s
    // error; `train` refuses such a model on a GPU before any work).
    #[rustfmt::skip]
    fn rmsnorm_forward(
        &self,
        out: &mut GpuBuf,
        rstd: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        shape: Matrix,
        eps: f64,
    ) {
        self.rmsnorm_fwd(out, rstd, inp, weight, shape, eps)
    }

    fn rmsnorm_backward(
        &self,
        dinp: &mut GpuBuf,
        dweight: &mut GpuBuf,
        dout: &GpuBuf,
        inp_weight: (&GpuBuf, &GpuBuf),
        rstd: &GpuBuf,
        shape: Matrix,
    ) {
        self.rmsnorm_bwd(dinp, dweight, dout, inp_weight, rstd, shape)
    }
}

impl LinearOps for GpuDevice {
    fn linear_forward(
        &self,
        out: &mut GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        bias: Option<&GpuBuf>,
        Gemm { rows, k, n }: Gemm,
    ) {
        if rows == 0 || n == 0 {
            return;
        }
        assert!(out.len >= rows * n && weight.len >= n * k);
        let (a, w) = (self.view(inp, self.half), self.view(weight, self.half));
        self.gemm_forward(out, (&a, &w), bias, None, (rows, k, n));
    }

    fn linear_residual_forward(
        &self,
        out: &mut GpuBuf,
        resid: &GpuBuf,
        inp: &GpuBuf,
        (weight, bias): (&GpuBuf, Option<&GpuBuf>),
        _tmp: &mut GpuBuf,
        Gemm { rows, k, n }: Gemm,
    ) {
        if rows == 0 || n == 0 {
            return;
        }
        assert!(out.len == rows * n && resid.len == rows * n && weight.len >= n * k);
        // One GEMM: bias and residual in its epilogue.
        let (a, w) = (self.view(inp, self.half), self.view(weight, self.half));
        self.gemm_forward(out, (&a, &w), bias, Some(resid), (rows, k, n));
    }

    fn linear_backward_input(&self, dinp: &mut GpuBuf, dout: &GpuBuf, weight: &GpuBuf, Gemm { rows, k, n }: Gemm) {
        if rows == 0 || n == 0 || k == 0 {
            return;
        }
        let (m_, n_, k_) = (int("rows", rows), int("n", n), int("k", k));
        let (d, w) = (self.view(dout, self.half), self.view(weight, self.half));
        // The backward-input GEMMs write f32 or bf16.
        let (out, e) = gemm_out(dinp);
        let op = linear_gemms(self.wgmma, aligned(&[d.ptr(), w.ptr()]), rows, k, n, out).backward_input;
        let whole = dinp.len == rows * k;
        let di = self.view_mut(dinp, e, whole);
        match op {
            Op::GemmBwdInputSm90 { .. } => {
                let [md, mw] = [self.operand_map(d.ptr(), rows, n, false), self.operand_map(w.ptr(), n, k, true)];
                self.run(op, args::gemm_bwd_input_bf16_sm90(md, mw, di.ptr(), m_, n_, k_));
            }
            _ => self.run(op, args::gemm_bwd_input_bf16(di.ptr(), d.ptr(), w.ptr(), m_, n_, k_)),
        }
    }

    fn linear_backward(
        &self,
        dinp: Option<&mut GpuBuf>,
        (dweight, dbias): (&mut GpuBuf, Option<&mut GpuBuf>),
        dout: &GpuBuf,
        inp: &GpuBuf,
        weight: &GpuBuf,
        Gemm { rows, k, n }: Gemm,
    ) {
        if rows == 0 || n == 0 || k == 0 {
            return;
        }
        let (m_, n_, k_) = (int("rows", rows), int("n", n), int("k", k));
        if let Some(dinp) = dinp {
            self.linear_backward_input(dinp, dout, weight, Gemm { rows, k, n });
        }
        let d = self.view(dout, self.half);
        let x = self.view(inp, self.half);
        let op = linear_gemms(self.wgmma, aligned(&[d.ptr(), x.ptr()]), rows, k, n, GemmOut::F32).backward_weight;
        let dw = self.view_mut(dweight, Elem::F32, false);
        match op {
            Op::GemmBwdWeightSm90 { m, n, k } => {
                let [md, mx] = [self.operand_map(d.ptr(), rows, n, true), self.operand_map(x.ptr(), rows, k, true)];
                // Several slices of the reduction: their partial tiles in scratch, the Device's
                // per-tile counters (plan::sm90_weight_slices).
                let sliced = sm90_weight_partials(m, n, k);
                let partials = (sliced > 0).then(|| self.scratch(4 * sliced));
                let counters = (sliced > 0).then(|| self.zeroed_once(&self.slice_counters, SM90_SLICE_MAX_TILES));
                let (p, c) = (partials.as_ref().map_or(0, |p| p.pointer), counters.map_or(0, |c| c.pointer()));
                self.run(op, args::gemm_bwd_weight_bf16_sm90(md, mx, dw.ptr(), p, c, m_, n_, k_));
            }
            _ => self.run(op, args::gemm_bwd_weight_bf16(dw.ptr(), d.ptr(), x.ptr(), m_, n_, k_)),
        }
        if let Some(dbias) = dbias {
            let e = activation(dout);
            let (d, db) = (self.view(dout, e), self.view_mut(dbias, Elem::F32, false));
            // Block partials in scratch and the Device's strip counters (plan::column_sum_grid).
            let partials = self.scratch(4 * column_sum_partials(rows, n));
            let counters = self.zeroed_once(&self.column_counters, COLUMN_SUM_COUNTERS);
            let (db, p, c, d) = (db.ptr(), partials.pointer, counters.pointer(), d.ptr());
            match e {
                Elem::Bf16 | Elem::F16 => {
                    self.run(Op::ColumnSumAdd { rows, cols: n }, args::column_sum_add_bf16(db, p, c, d, m_, n_))
                }
                _ => self.run(Op::ColumnSumAddF32 { rows, cols: n }, args::column_sum_add_f32(db, p, c, d, m_, n_)),
            }
        }
    }

    fn set_matmul_precision(&self, precision: Precision) {
        self.bf16_matmul.store(precision == Precision::Bf16, Ordering::Relaxed);
    }

    fn matmul_rounds_operands(&self, _precision: Precision) -> bool {
        // The GEMMs do cast f32 operands to bf16, but under --bf16 the working weights they read
        // are stored in bf16 (`stores`), so no master is read by a GEMM.
        false
    }
}

impl EmbeddingOps for GpuDevice {
    fn embedding_forward(
        &self,
        out: &mut GpuBuf,
        wte: &GpuBuf,
        Tokens { ids: tokens, batch, seq, vocab_start }: Tokens<'_>,
        hidden: usize,
    ) {
        let (t, [v0, rows, b, s, h]) = self.token_args(tokens, vocab_start, wte.len / hidden, batch, seq, hidden);
        let n = int("batch·seq·hidden", batch * seq * hidden) as usize;
        let (wte, out) = (self.view(wte, Elem::F32), self.view_mut(out, Elem::F32, false));
        self.elementwise(n, args::embedding_fwd_f32(out.ptr(), t.pointer, wte.ptr(), v0, rows, b, s, h));
    }

    fn embedding_backward(
        &self,
        dwte: &mut GpuBuf,
        dout: &GpuBuf,
        Tokens { ids: tokens, batch, seq, vocab_start }: Tokens<'_>,
        hidden: usize,
    ) {
        // The positions grouped by vocabulary row on the host (it has the tokens) and uploaded in
        // one copy, as the tokens were: a block per touched row and strip of 256 columns.
        let h = int("hidden", hidden);
        int("batch·seq", batch * seq);
        let segments = EmbeddingSegments::new(tokens, vocab_start, dwte.len / hidden, batch, seq);
        if segments.segments == 0 || hidden == 0 {
            return;
        }
        let index = self.upload_u32(&segments.words);
        let [rows_at, starts_at, positions_at] = segments.offsets().map(|o| index.pointer + 4 * o as u64);
        let (dout, dwte) = (self.view(dout, Elem::F32), self.view_mut(dwte, Elem::F32, false));
        let l = args::embedding_bwd_f32(dwte.ptr(), dout.ptr(), rows_at, starts_at, positions_at, h);
        self.launch(l, [segments.segments, hidden.div_ceil(256), 1]);
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
        let (wpe, out) = (self.view(wpe, Elem::F32), self.view_mut(out, Elem::F32, false));
        self.elementwise(n, args::position_fwd_f32(out.ptr(), wpe.ptr(), b, t, p, h));
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
        let (dout, dwpe) = (self.view(dout, Elem::F32), self.view_mut(dwpe, Elem::F32, false));
        self.launch(args::position_bwd_f32(dwpe.ptr(), dout.ptr(), b, t, p, h), grid);
    }
}

impl LossOps for GpuDevice {
    fn cross_entropy_max(&self, logits: &GpuBuf, rows: usize, vocab: usize, max: &mut GpuBuf) {
        int("rows·vocab", rows * vocab);
        assert!(max.elem == Elem::F64 && max.len >= rows, "cross_entropy_max: scalars shorter than the rows");
        // bf16 logits: the xent_*_bf16 kernels, with the f32 ones' arguments and f64 statistics.
        let e = activation(logits);
        let logits = self.view(logits, e);
        let (m, l, r, v) = (max.ptr(), logits.ptr(), int("rows", rows), int("vocab", vocab));
        match e {
            Elem::Bf16 | Elem::F16 if rows > 0 => {
                self.run(Op::XentMax { rows, vocab }, args::xent_max_bf16(m, l, r, v))
            }
            Elem::Bf16 | Elem::F16 => {}
            _ => self.rowwise(rows, args::xent_max_f32(m, l, r, v)),
        }
    }

    fn cross_entropy_partials(
        &self,
        logits: &GpuBuf,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &GpuBuf,
        stats: &mut GpuBuf,
    ) {
        assert!(stats.elem == Elem::F64 && stats.len >= 2 * rows, "cross_entropy_partials: scalars too short");
        let e = activation(logits);
        let logits = self.view(logits, e);
        let t = self.upload_u32(&targets[..rows]);
        let (sums, targets, m) = ((stats.ptr(), stats.ptr() + 8 * rows as u64), t.pointer, max.ptr());
        let (v0, r, v) = (int("vocab_start", vocab_start), int("rows", rows), int("vocab", vocab));
        match e {
            Elem::Bf16 | Elem::F16 if rows > 0 => {
                let l = args::xent_partials_bf16(sums.0, sums.1, logits.ptr(), targets, v0, m, r, v);
                self.run(Op::XentPartials { rows, vocab }, l)
            }
            Elem::Bf16 | Elem::F16 => {}
            _ => self.rowwise(rows, args::xent_partials_f32(sums.0, sums.1, logits.ptr(), targets, v0, m, r, v)),
        }
    }

    fn cross_entropy_loss(
        &self,
        max: &GpuBuf,
        stats: &GpuBuf,
        targets: &[u32],
        rows: usize,
        acc: &mut GpuBuf,
        slot: usize,
    ) {
        assert!(acc.elem == Elem::F64 && slot < acc.len, "cross_entropy_loss: slot {slot} outside the scalars");
        // The targets go up only when the loss leaves a row out (`--eod-mask-loss`); else the
        // kernel counts every row (a null pointer), with no copy.
        let ignored = targets[..rows].contains(&crate::device::kernels::IGNORED_TARGET);
        let t = ignored.then(|| self.upload_u32(&targets[..rows]));
        let (m, s, r) = (max.ptr(), stats.ptr(), int("rows", rows));
        let l = args::xent_loss_f64(acc.ptr(), int("slot", slot), m, s, t.as_ref().map_or(0, |t| t.pointer), r);
        self.launch(l, [1, 1, 1]);
    }

    fn cross_entropy_backward(
        &self,
        logits: &mut GpuBuf,
        targets: &[u32],
        Logits { rows, vocab, vocab_start }: Logits,
        max: &GpuBuf,
        stats: &GpuBuf,
        grad_scale: f32,
    ) {
        let t = self.upload_u32(&targets[..rows]);
        let e = activation(logits);
        let n = int("rows·vocab", rows * vocab) as usize;
        let logits = self.view_mut(logits, e, false);
        let (l, m, s) = (logits.ptr(), max.ptr(), stats.ptr());
        let (v0, r, v) = (int("vocab_start", vocab_start), int("rows", rows), int("vocab", vocab));
        match e {
            Elem::Bf16 | Elem::F16 if rows > 0 => {
                self.run(Op::XentBwd { rows, vocab }, args::xent_bwd_bf16(l, t.pointer, v0, m, s, grad_scale, r, v))
            }
            Elem::Bf16 | Elem::F16 => {}
            _ => self.elementwise(n, args::xent_bwd_f32(l, t.pointer, v0, m, s, grad_scale, r, v)),
        }
    }
}

impl OptimizerOps for GpuDevice {
    fn sum_squares_into(&self, bufs: &[&GpuBuf], acc: &mut GpuBuf, slot: usize) {
        assert!(acc.elem == Elem::F64 && slot < acc.len, "sum_squares_into: slot {slot} outside the scalars");
        // One launch over every buffer (a table of their addresses, lengths and first blocks,
        // uploaded in one copy when these buffers first come, `kept_table`), then one thread adds
        // the block partials buffer by buffer.
        let first_block = first_blocks(bufs.iter().map(|b| b.len), SUM_SQUARES_CHUNK);
        let blocks = first_block[bufs.len()];
        if blocks == 0 {
            return;
        }
        let mut table: Vec<u8> = bufs.iter().flat_map(|b| b.ptr().to_le_bytes()).collect();
        let lens = bufs.iter().map(|b| int("n", b.len));
        table.extend(lens.chain(first_block.iter().map(|&f| int("blocks", f))).flat_map(|x| x.to_le_bytes()));
        let (count, tensors) = (bufs.len() as u64, self.kept_table(&table));
        let (lens, first) = (tensors + 8 * count, tensors + 12 * count);
        let partials = self.scratch(8 * blocks);
        let count = int("tensors", bufs.len());
        self.launch(args::sum_squares_f32(partials.pointer, tensors, lens, first, count), [blocks, 1, 1]);
        let sum = args::sum_into_f64(acc.ptr(), int("slot", slot), partials.pointer, first, count);
        self.launch(sum, [1, 1, 1]);
    }

    fn clip_scale(&self, sum: &GpuBuf, sum_slot: usize, out: &mut GpuBuf, slot: usize, clip: f64, loss_scale: f64) {
        assert!(sum.elem == Elem::F64 && sum_slot < sum.len, "clip_scale: slot {sum_slot} outside the sums");
        assert!(out.elem == Elem::F64 && slot + 2 <= out.len, "clip_scale: slots {slot}.. outside the scalars");
        let (sum_at, out_at) = (int("slot", sum_slot), int("slot", slot));
        self.launch(args::clip_scale_f64(sum.ptr(), sum_at, out.ptr(), out_at, clip, loss_scale), [1, 1, 1]);
    }

    fn adamw(
        &self,
        AdamWTensor { param, grad, m, v, decayed, working }: AdamWTensor<'_, GpuBuf>,
        step: AdamWStep,
        (scales, slot): (&GpuBuf, usize),
    ) {
        let step = step.for_tensor(decayed);
        assert!(scales.elem == Elem::F64 && slot < scales.len, "adamw: gradient scale slot {slot} outside the scalars");
        if grad.len == 0 {
            return;
        }
        let (c1, c2) = bias_corrections(&step);
        // The kernel writes a 16-bit working copy (`param_bf16`, the module's storage type) or an
        // f32 one rounded to it itself (`param_rounded`); other precisions copy and round after it.
        let (bf16, rounded) = working_pointers(working.as_ref(), self.storage.precision());
        let (n, scale) = (int("n", grad.len), scales.ptr() + 8 * slot as u64);
        let AdamWStep { lr, beta1, beta2, eps, weight_decay, .. } = step;
        let (p, g) = (param.ptr(), grad.ptr());
        let l = args::adamw_f32_bf16(
            p,
            bf16,
            g,
            m.ptr(),
            v.ptr(),
            n,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            scale,
            c1,
            c2,
            rounded,
        );
        self.run(Op::AdamW { n: grad.len }, l);
        if let Some((w, precision)) = working.filter(|(_, p)| *p != self.storage.precision()) {
            assert_eq!(w.elem, Elem::F32, "adamw: a {precision:?} working copy is kept in f32");
            self.copy(w, 0, param, 0, param.len);
            self.round_to(w, precision);
        }
    }

    fn adamw_group(&self, tensors: Vec<AdamWTensor<'_, GpuBuf>>, step: AdamWStep, grad_scale: (&GpuBuf, usize)) {
        self.adamw_tensors(tensors, step, grad_scale);
    }
}

impl CollectiveOps for GpuDevice {
    fn device_comm(&self, group: &dyn crate::comm::Comm) -> Option<&dyn DeviceComm<GpuBuf>> {
        let key = group_key(group);
        self.comms.iter().find(|(k, _)| *k == key).map(|(_, c)| &**c as &dyn DeviceComm<GpuBuf>)
    }

    fn device_all_reduce_scalars(
        &self,
        group: &dyn crate::comm::Comm,
        s: &mut GpuBuf,
        len: usize,
        op: ReduceOp,
    ) -> bool {
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
}

/// The element type an op's kernels take for the activations of `buf`: its own for 16-bit
/// storage (bf16, or binary16 on the fp16 module: a Device makes only its own, `alloc_in`),
/// else f32.
fn activation(buf: &GpuBuf) -> Elem {
    match buf.elem {
        Elem::Bf16 | Elem::F16 => buf.elem,
        _ => Elem::F32,
    }
}

/// The output type of a GEMM writing `buf`: 16-bit for 16-bit storage, else f32.
fn gemm_out(buf: &GpuBuf) -> (GemmOut, Elem) {
    match activation(buf) {
        e @ (Elem::Bf16 | Elem::F16) => (GemmOut::Bf16, e),
        _ => (GemmOut::F32, Elem::F32),
    }
}

impl GpuDevice {
    /// `x` as bits of the storage type, rounded to nearest even (what `upload` and `fill` store
    /// in 16-bit buffers).
    fn half_bits(&self, x: f32) -> u16 {
        let precision = self.storage.precision();
        precision.to_bits16(precision.round(x))
    }
}

/// The `int` arguments rows and cols of the LayerNorm kernels.
fn rows_cols(rows: usize, cols: usize) -> [i32; 2] {
    [int("rows", rows), int("cols", cols)]
}

/// The `int` arguments of the position-embedding kernels.
fn position_args(batch: usize, t0: usize, positions: usize, hidden: usize) -> [i32; 4] {
    [int("batch", batch), int("t0", t0), int("positions", positions), int("hidden", hidden)]
}

/// What more than one op launches the same way.
impl GpuDevice {
    /// `out = A · Wᵀ (+ bias) (+ resid)` on bf16 operands `a`, `w`: the sm_90a GEMM where it
    /// applies, else the mma.sync / MFMA one, writing `out`'s type (f32 or bf16); a residual of
    /// another type goes through a view.
    fn gemm_forward(
        &self,
        out: &mut GpuBuf,
        (a, w): (&GpuBuf, &GpuBuf),
        bias: Option<&GpuBuf>,
        resid: Option<&GpuBuf>,
        (rows, k, n): (usize, usize, usize),
    ) {
        let (gemm_out, e) = gemm_out(out);
        let op = linear_gemms(self.wgmma, aligned(&[a.ptr(), w.ptr()]), rows, k, n, gemm_out).forward;
        let whole = out.len == rows * n;
        let o = self.view_mut(out, e, whole);
        let r = resid.map(|r| self.view(r, e));
        let b = bias.map(|b| self.view(b, Elem::F32));
        let (m_, n_, k_) = (int("rows", rows), int("n", n), int("k", k));
        let (o, b, r) = (o.ptr(), b.as_ref().map_or(0, |b| b.ptr()), r.as_ref().map_or(0, |r| r.ptr()));
        // The output type's kernel: one signature for both (`Launch::retarget`).
        match op {
            Op::GemmFwdSm90 { .. } => {
                let [ma, mw] = [self.operand_map(a.ptr(), rows, k, false), self.operand_map(w.ptr(), n, k, false)];
                self.run(op, args::gemm_fwd_bf16_sm90(ma, mw, o, b, r, m_, n_, k_, 0));
            }
            _ => self.run(op, args::gemm_fwd_bf16(o, a.ptr(), w.ptr(), b, r, m_, n_, k_, 0)),
        }
    }

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
    ) -> (Scratch<'_>, [i32; 5]) {
        let t = self.upload_u32(&tokens[..batch * seq]);
        let sizes = [
            ("vocab_start", vocab_start),
            ("vocab rows", vocab_rows),
            ("batch", batch),
            ("seq", seq),
            ("hidden", hidden),
        ];
        (t, sizes.map(|(what, v)| int(what, v)))
    }

    /// dweight += Σ_rows dout · x̂ and dbias += Σ_rows dout, one thread per column: the second half
    /// of both f32 LayerNorm backwards (whole rows and split rows).
    /// `inputs` are dout, inp, mean and rstd (f32).
    fn layernorm_param_grads(
        &self,
        [dweight, dbias]: [&mut GpuBuf; 2],
        inputs: [&GpuBuf; 4],
        rows: usize,
        cols: usize,
    ) {
        let [dout, inp, mean, rstd] = inputs.map(|b| b.ptr());
        let [r, c] = rows_cols(rows, cols);
        let (dw, db) = (self.view_mut(dweight, Elem::F32, false), self.view_mut(dbias, Elem::F32, false));
        self.columnwise(cols, args::layernorm_bwd_params_f32(dw.ptr(), db.ptr(), dout, inp, mean, rstd, r, c));
    }
}
