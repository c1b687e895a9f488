//! The CPU Device's buffer: f32 values in host memory, or bf16 bits for the one kind of buffer the
//! CPU holds in 16 bits, the bf16 working copy of the GEMM weights (`Memory::alloc_weights`), which
//! AdamW writes and the bf16 GEMM packs widen with a shift instead of rounding.
//!
//! Every op reads and writes f32 buffers through `Deref` to `Vec<f32>`. A bf16 buffer reaches
//! only the ops that name it in their documentation (the linear layers' weight, the word
//! embedding's table, AdamW's working copy, and the buffer plumbing: `len`, `bytes`, `upload`,
//! `download`, `copy`, `fill`, `round_to`); any other use is a bug in trident and panics saying so.

use std::ops::{Deref, DerefMut};

/// A CPU Device buffer (`Device::Buf` of `CpuDevice`).
#[derive(Clone, Debug, PartialEq)]
pub enum CpuBuf {
    F32(Vec<f32>),
    /// bf16 bits, rounded to nearest even where they were written.
    Bf16(Vec<u16>),
}

impl CpuBuf {
    /// Elements, in either storage.
    pub fn len(&self) -> usize {
        match self {
            CpuBuf::F32(v) => v.len(),
            CpuBuf::Bf16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bf16 bits, where the buffer holds bf16.
    pub fn bf16(&self) -> Option<&[u16]> {
        match self {
            CpuBuf::Bf16(v) => Some(v),
            CpuBuf::F32(_) => None,
        }
    }

    /// The f32 values, where the buffer holds f32.
    pub fn f32(&self) -> Option<&[f32]> {
        match self {
            CpuBuf::F32(v) => Some(v),
            CpuBuf::Bf16(_) => None,
        }
    }

    /// The f32 values of an f32 buffer; a bf16 one panics (an op that takes only f32 buffers got
    /// the weight copy: a bug in trident).
    fn values(&self) -> &Vec<f32> {
        match self {
            CpuBuf::F32(v) => v,
            CpuBuf::Bf16(_) => panic!("a CPU op read the bf16 weight copy as f32 (a trident bug)"),
        }
    }
}

impl From<Vec<f32>> for CpuBuf {
    fn from(v: Vec<f32>) -> CpuBuf {
        CpuBuf::F32(v)
    }
}

impl Deref for CpuBuf {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        self.values()
    }
}

impl DerefMut for CpuBuf {
    fn deref_mut(&mut self) -> &mut Vec<f32> {
        match self {
            CpuBuf::F32(v) => v,
            CpuBuf::Bf16(_) => panic!("a CPU op wrote the bf16 weight copy as f32 (a trident bug)"),
        }
    }
}

impl<'a> IntoIterator for &'a CpuBuf {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.values().iter()
    }
}

#[cfg(test)]
mod tests {
    use super::CpuBuf;
    use crate::device::cpu::CpuDevice;
    use crate::device::prelude::*;
    use crate::device::{Gemm, Tokens};
    use crate::real::Precision;

    /// A bf16 weight copy multiplies exactly as the f32 weight it was made from (forward and input
    /// gradient, under the bf16 GEMM), the word embedding looks its rows up as the f32 table's
    /// rounded rows, and the plumbing keeps bf16 values: upload rounds as `round_to` does,
    /// download and `copy` give them back, AdamW writes the bits of the updated master.
    #[test]
    fn cpu_bf16_weight_copy_acts_as_the_rounded_f32_weight() {
        let dev = CpuDevice::new(2).with_bf16_weights(true);
        dev.set_matmul_precision(Precision::Bf16);
        assert!(dev.holds_weights_in(Precision::Bf16) && !dev.holds_weights_in(Precision::F16));
        for (rows, k, n) in [(16, 64, 192), (7, 33, 50), (24, 768, 100)] {
            let (x, w, dy) = (crate::rng::fill(rows * k, 1), crate::rng::fill(n * k, 2), crate::rng::fill(rows * n, 3));
            let mut bits = dev.alloc_weights(n * k, Precision::Bf16);
            assert!(bits.bf16().is_some() && dev.bytes(&bits) == 2 * n * k, "not a bf16 buffer");
            dev.upload(&mut bits, &w);
            let mut rounded = CpuBuf::from(w.clone());
            dev.round_to(&mut rounded, Precision::Bf16);
            let mut back = vec![0.0; n * k];
            dev.download(&bits, &mut back);
            let first = back.iter().zip(rounded.iter()).position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(
                first.is_none(),
                "{rows}x{k}x{n}: upload does not round as round_to at {first:?}: {} {} (from {})",
                back[first.unwrap()],
                rounded[first.unwrap()],
                w[first.unwrap()]
            );
            let mut copied = dev.alloc(n * k);
            dev.copy(&mut copied, 0, &bits, 0, n * k);
            assert!(copied == rounded, "{rows}x{k}x{n}: copy out of bf16");

            let (x, dy) = (CpuBuf::from(x), CpuBuf::from(dy));
            let mut outs = Vec::new();
            for weight in [&CpuBuf::from(w.clone()), &bits] {
                let (mut y, mut dx, mut dw) = (dev.alloc(rows * n), dev.alloc(rows * k), dev.alloc(n * k));
                dev.linear_forward(&mut y, &x, weight, None, Gemm { rows, k, n });
                dev.linear_backward(Some(&mut dx), (&mut dw, None), &dy, &x, weight, Gemm { rows, k, n });
                assert!(y.iter().any(|&v| v != 0.0) && dx.iter().any(|&v| v != 0.0));
                outs.push((y, dx));
            }
            assert!(outs[0] == outs[1], "{rows}x{k}x{n}: the bf16 copy multiplies differently");
        }

        let (vocab, hidden, batch, seq) = (11, 8, 2, 3);
        let table = crate::rng::fill(vocab * hidden, 4);
        let mut bits = dev.alloc_weights(vocab * hidden, Precision::Bf16);
        dev.upload(&mut bits, &table);
        let tokens = [0u32, 3, 10, 12, 4, 5];
        let mut outs = Vec::new();
        for wte in [CpuBuf::from(table.clone()), bits] {
            let mut out = dev.alloc(batch * seq * hidden);
            dev.embedding_forward(&mut out, &wte, Tokens { ids: &tokens, batch, seq, vocab_start: 2 }, hidden);
            dev.round_to(&mut out, Precision::Bf16);
            outs.push(out);
        }
        assert!(outs[0] == outs[1] && outs[0].iter().any(|&v| v != 0.0), "embedding rows differ");

        let n = 40_000;
        let (mut p, g) = (CpuBuf::from(crate::rng::fill(n, 5)), CpuBuf::from(crate::rng::fill(n, 6)));
        let (mut m, mut v) = (dev.alloc(n), dev.alloc(n));
        let mut working = dev.alloc_weights(n, Precision::Bf16);
        let step =
            crate::device::AdamWStep { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 1 };
        let copy = Some((&mut working, Precision::Bf16));
        let t =
            crate::device::AdamWTensor { param: &mut p, grad: &g, m: &mut m, v: &mut v, decayed: true, working: copy };
        dev.adamw(t, step, (&vec![1.0], 0));
        let mut want = dev.alloc_weights(n, Precision::Bf16);
        dev.upload(&mut want, &p);
        assert!(working == want, "AdamW's bf16 copy is not the updated master's bits");
    }
}
