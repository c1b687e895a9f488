//! The portable f32 micro-kernel, for any target: fixed-size arrays that the compiler keeps in
//! vector registers of whatever width the baseline target has.

use super::MicroKernel;

pub struct Portable;

const MR: usize = 4;
const NR: usize = 8;

impl MicroKernel for Portable {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 256;
    const MC: usize = 128;
    const NC: usize = 2048;

    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        // SAFETY: the caller guarantees kc*MR and kc*NR readable floats.
        let (a, b) = unsafe { (std::slice::from_raw_parts(a, kc * MR), std::slice::from_raw_parts(b, kc * NR)) };
        let mut acc = [[0.0f32; NR]; MR];
        for (a_step, b_step) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            for (acc_row, &a_value) in acc.iter_mut().zip(a_step) {
                for (slot, &b_value) in acc_row.iter_mut().zip(b_step) {
                    *slot += a_value * b_value;
                }
            }
        }
        // SAFETY: the caller guarantees NR writable floats in each of the MR rows.
        unsafe { store_tile(&acc, c, ldc, accumulate) }
    }
}

/// Stores a portable kernel's `MR × NR` accumulators to C: `C = acc` or, when `accumulate`,
/// `C = C + acc` (one rounding per element). The bf16 portable kernel ends the same way.
///
/// # Safety
/// C rows `0..MR` at stride `ldc` have `NR` writable floats each.
pub(crate) unsafe fn store_tile<const MR: usize, const NR: usize>(
    acc: &[[f32; NR]; MR],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    for (i, acc_row) in acc.iter().enumerate() {
        // SAFETY: the caller guarantees NR writable floats in each of the MR rows.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) };
        for (out, &value) in row.iter_mut().zip(acc_row) {
            *out = if accumulate { *out + value } else { value };
        }
    }
}
