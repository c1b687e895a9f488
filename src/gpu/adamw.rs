//! The GPU Device's multi-tensor ops of a step, each one launch over a table of tensors (adamw.cu
//! for both vendors, a block per 2,048-element chunk of a tensor): AdamW over an optimizer group
//! (`OptimizerOps::adamw_group`, `adamw_multi_f32_bf16`: the tensors' addresses, lengths and weight
//! decays) and the gradients' zeroing (`Memory::zero_buffers`, `zero_multi_u32`). The tables stay
//! on the device (`GpuDevice::kept_table`): tensors that are the same as at an earlier step (a
//! training run's are: parameters, gradients, moments and working copies never move) find theirs
//! there and cost no copy and no allocation. Also the bias corrections both AdamW kernels take.

use super::buffer::{Elem, GpuBuf};
use super::device::{first_blocks, int, GpuDevice};
use super::kernels::args;
use crate::device::prelude::*;
use crate::device::{AdamWStep, AdamWTensor};
use crate::real::Precision;

/// Elements (words) one block of `adamw_multi_f32_bf16` (`zero_multi_u32`) takes (adamw.cu's
/// `adamw_detail::kChunk`).
pub(super) const ADAMW_CHUNK: usize = 2048;

/// Bytes of one tensor's entry in the table (adamw.cu's `AdamwTensor`: six addresses, n and its
/// weight decay).
const ENTRY_BYTES: usize = 56;

/// AdamW's bias corrections 1 / (1 - β1^step) and 1 / (1 - β2^step), computed in f64 as the
/// reference does and passed to the kernels as f32.
pub(super) fn bias_corrections(step: &AdamWStep) -> (f32, f32) {
    let c1 = 1.0 / (1.0 - (step.beta1 as f64).powi(step.step as i32));
    let c2 = 1.0 / (1.0 - (step.beta2 as f64).powi(step.step as i32));
    (c1 as f32, c2 as f32)
}

/// The working-copy addresses the kernels take: a 16-bit copy (`param_bf16`, the module's storage
/// type, whose precision is `stored`) or an f32 copy rounded to it (`param_rounded`), 0 where
/// there is none; a copy of another precision is neither (it is copied and rounded after the
/// kernel).
pub(super) fn working_pointers(working: Option<&(&mut GpuBuf, Precision)>, stored: Precision) -> (u64, u64) {
    match working {
        Some((w, _)) if matches!(w.elem, Elem::Bf16 | Elem::F16) => (w.ptr(), 0),
        Some((w, p)) if *p == stored && w.elem == Elem::F32 => (0, w.ptr()),
        _ => (0, 0),
    }
}

impl GpuDevice {
    /// `OptimizerOps::adamw_group` on this GPU: one launch of `adamw_multi_f32_bf16` over every tensor,
    /// each element updated by the formula of `adamw_f32_bf16` (the same bits), the weight decay
    /// of `step` on the decayed tensors, 0 on the others.
    pub(super) fn adamw_tensors(
        &self,
        tensors: Vec<AdamWTensor<'_, GpuBuf>>,
        step: AdamWStep,
        (scales, slot): (&GpuBuf, usize),
    ) {
        assert!(scales.elem == Elem::F64 && slot < scales.len, "adamw: gradient scale slot {slot} outside the scalars");
        let mut table = Vec::with_capacity(ENTRY_BYTES * tensors.len() + 4 * (tensors.len() + 1));
        for t in &tensors {
            let n = t.grad.len;
            let same = [t.param.len, t.m.len, t.v.len].iter().all(|&len| len == n);
            assert!(same, "adamw_group: a tensor's parameter, gradient and moments differ in length");
            let f32s = [t.param.elem, t.grad.elem, t.m.elem, t.v.elem].iter().all(|&e| e == Elem::F32);
            assert!(f32s, "adamw_group: the master weights, gradients and moments are f32");
            let (bf16, rounded) = working_pointers(t.working.as_ref(), self.storage.precision());
            for address in [t.param.ptr(), bf16, t.grad.ptr(), t.m.ptr(), t.v.ptr(), rounded] {
                table.extend(address.to_le_bytes());
            }
            table.extend(int("n", n).to_le_bytes());
            table.extend(step.for_tensor(t.decayed).weight_decay.to_le_bytes());
        }
        let first_block = first_blocks(tensors.iter().map(|t| t.grad.len), ADAMW_CHUNK);
        let blocks = first_block[tensors.len()];
        table.extend(first_block.iter().flat_map(|&b| int("blocks", b).to_le_bytes()));
        if blocks > 0 {
            let tensors_at = self.kept_table(&table);
            let (c1, c2) = bias_corrections(&step);
            let (first, count) = (tensors_at + (ENTRY_BYTES * tensors.len()) as u64, int("tensors", tensors.len()));
            let AdamWStep { lr, beta1, beta2, eps, .. } = step;
            let scale = scales.ptr() + 8 * slot as u64;
            let l = args::adamw_multi_f32_bf16(tensors_at, first, count, lr, beta1, beta2, eps, scale, c1, c2);
            self.launch(l, [blocks, 1, 1]);
        }
        // Working copies of other precisions are copied and rounded after the update, as
        // `OptimizerOps::adamw` does.
        for t in tensors {
            if let Some((w, precision)) = t.working.filter(|(_, p)| *p != self.storage.precision()) {
                assert_eq!(w.elem, Elem::F32, "adamw: a {precision:?} working copy is kept in f32");
                self.copy(w, 0, t.param, 0, t.param.len);
                self.round_to(w, precision);
            }
        }
    }

    /// `Memory::zero_buffers` on this GPU: one launch of `zero_multi_u32` over the buffers' whole
    /// words (a bf16 buffer's allocation is whole words, as `fill` writes it).
    pub(super) fn zero_tensors(&self, bufs: Vec<&mut GpuBuf>) {
        let words: Vec<usize> = bufs
            .iter()
            .map(|b| match b.elem {
                Elem::F32 => b.len,
                Elem::Bf16 | Elem::F16 => b.len.div_ceil(2),
                e => panic!("zero_buffers: a {e:?} buffer"),
            })
            .collect();
        let first_block = first_blocks(words.iter().copied(), ADAMW_CHUNK);
        let blocks = first_block[bufs.len()];
        if blocks == 0 {
            return;
        }
        let mut table: Vec<u8> = bufs.iter().flat_map(|b| b.ptr().to_le_bytes()).collect();
        let sizes = words.iter().map(|&w| int("words", w)).chain(first_block.iter().map(|&b| int("blocks", b)));
        table.extend(sizes.flat_map(|x| x.to_le_bytes()));
        let (count, tensors) = (bufs.len() as u64, self.kept_table(&table));
        let l = args::zero_multi_u32(tensors, tensors + 8 * count, tensors + 12 * count, int("tensors", bufs.len()));
        self.launch(l, [blocks, 1, 1]);
    }
}
