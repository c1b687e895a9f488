//! The weight-gradient (W) pass of the zero-bubble pipeline schedules: a layer's backward split
//! into B, the gradients of its inputs, which the previous stage waits for, and W, its linear
//! layers' weight and bias gradients, which nobody waits for and which the schedule moves into the
//! pipeline's idle time. B keeps, for each linear layer, copies of the two operands W multiplies
//! (its output gradient and its input, as the layer's backward saw them: gathered under sequence
//! parallelism, through dropout where it drops) and the product's shape; W adds their product
//! to the gradients, exactly as the whole backward would have. Where the micro-batch's saved
//! activations stay whole until W (no recomputation, no 16-bit copies), the inputs are read from
//! them there and only the output gradients are copied; otherwise (the inputs then sit in the
//! chunk's spare buffers, which the next layer overwrites) both are.

use crate::device::{Device, Gemm};

/// Where a linear layer's parameter gradients go during its backward.
pub(super) enum WeightGrads<'g, B> {
    /// Added now (the whole backward): the weight gradient and the bias gradient, if any.
    Now(&'g mut B, Option<&'g mut B>),
    /// Left for the W pass: the operands are kept here.
    Later(&'g mut Deferred<B>),
}

/// One linear layer's W pass: its output gradient and input, and the product's shape.
pub(super) struct Deferred<B> {
    dout: Option<B>,
    inp: Option<B>,
    shape: Gemm,
    /// Whether B copies the input (else W is given it from the saved activations).
    pub(super) copy_input: bool,
}

impl<B> Default for Deferred<B> {
    fn default() -> Self {
        Deferred { dout: None, inp: None, shape: Gemm { rows: 0, k: 0, n: 0 }, copy_input: true }
    }
}

/// The W passes of one transformer block, in the slots below.
pub(super) type LayerDeferred<B> = [Deferred<B>; 4];

/// The slots of a block's linear layers in `LayerDeferred`.
pub(super) const QKV: usize = 0;
pub(super) const PROJ: usize = 1;
pub(super) const FC1: usize = 2;
pub(super) const FC2: usize = 3;

impl<B> Deferred<B> {
    /// Keeps copies of `dout` and, where `copy_input`, `inp` (buffers of the same storage, reused
    /// from the last micro-batch where their lengths agree) for the product of `shape`.
    pub(super) fn keep<D: Device<Buf = B>>(&mut self, dev: &D, dout: &B, inp: &B, shape: Gemm) {
        let copy = |slot: &mut Option<B>, src: &B| {
            let len = dev.len(src);
            if slot.as_ref().is_none_or(|b| dev.len(b) != len) {
                *slot = Some(dev.alloc_like(src));
            }
            dev.copy(slot.as_mut().expect("allocated above"), 0, src, 0, len);
        };
        copy(&mut self.dout, dout);
        match self.copy_input {
            true => copy(&mut self.inp, inp),
            false => self.inp = None,
        }
        self.shape = shape;
    }

    /// The W pass: `dweight += doutᵀ · inp` and `dbias += Σ_rows dout`, the input kept here or
    /// `saved` (the layer's saved activation B read).
    pub(super) fn add_grads<D: Device<Buf = B>>(
        &self,
        dev: &D,
        (dweight, dbias): (&mut B, Option<&mut B>),
        weight: &B,
        saved: Option<&B>,
    ) {
        let (Some(dout), Some(inp)) = (&self.dout, self.inp.as_ref().or(saved)) else {
            panic!("a W pass without its B pass");
        };
        dev.linear_backward(None, (dweight, dbias), dout, inp, weight, self.shape);
    }

    /// Bytes the copies take on the device.
    pub(super) fn bytes<D: Device<Buf = B>>(&self, dev: &D) -> usize {
        [&self.dout, &self.inp].into_iter().flatten().map(|b| dev.bytes(b)).sum()
    }
}
