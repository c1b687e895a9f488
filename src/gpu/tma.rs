//! Tensor maps for sm_90's tensor memory accelerator (TMA): the 128-byte `CUtensorMap` a kernel
//! takes by value, and the one geometry trident's sm_90a GEMMs (`kernels-cuda/gemm_bf16_sm90.cu`)
//! load through, which the CUDA runtime hands to the driver's `cuTensorMapEncodeTiled`.
//!
//! The geometry: a row-major bf16 matrix [rows, cols] seen as 3 dimensions (the 8 elements of a
//! 16-byte chunk, the rows, the chunks of a row) so that one copy writes a tile straight into
//! wgmma's no-swizzle core-matrix layout; the box is (8, 128, 8) for an operand whose
//! reduction runs along its rows' elements (K-major) and (8, 64, 16) for one whose reduction
//! runs down its rows (MN-major). TMA needs 16-byte global strides and a 16-byte aligned start:
//! `cols` a multiple of 8 and the address a multiple of 16, else `gemm_operand` says no.

use crate::error::{Error, Result};

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned (cuda.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TensorMap(pub [u64; 16]);

/// What `cuTensorMapEncodeTiled` is given for a bf16 tensor: 3 dimensions, element strides 1,
/// no interleave, no swizzle, no L2 promotion, out-of-bounds elements read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledMap {
    pub address: u64,
    /// Sizes, innermost first.
    pub dims: [u64; 3],
    /// Byte strides of dimensions 1 and 2 (dimension 0 is contiguous).
    pub strides: [u64; 2],
    pub boxes: [u32; 3],
}

/// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16`.
pub const DATA_TYPE_BF16: i32 = 9;

/// The map of gemm_bf16_sm90.cu's operand at `address`, a bf16 [rows, cols] row-major matrix;
/// `mn_major`: the reduction runs down the rows. An error when TMA cannot describe it.
pub fn gemm_operand(address: u64, rows: usize, cols: usize, mn_major: bool) -> Result<TiledMap> {
    if !cols.is_multiple_of(8) || !address.is_multiple_of(16) || rows == 0 {
        return Err(Error::Unsupported(format!(
            "a TMA tensor map needs a 16-byte aligned bf16 matrix with rows of a multiple of 8 elements \
             (got {rows} x {cols} at {address:#x})"
        )));
    }
    Ok(TiledMap {
        address,
        dims: [8, rows as u64, (cols / 8) as u64],
        strides: [2 * cols as u64, 16],
        boxes: if mn_major { [8, 64, 16] } else { [8, 128, 8] },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_maps_follow_the_kernel_header() {
        let k = gemm_operand(0x1000, 100, 72, false).unwrap();
        assert_eq!((k.dims, k.strides, k.boxes), ([8, 100, 9], [144, 16], [8, 128, 8]));
        let mn = gemm_operand(0x1000, 300, 264, true).unwrap();
        assert_eq!((mn.dims, mn.strides, mn.boxes), ([8, 300, 33], [528, 16], [8, 64, 16]));
        // Both boxes are 16 KiB, the kernel's per-operand stage.
        for b in [k.boxes, mn.boxes] {
            assert_eq!(b.iter().map(|&x| x as usize).product::<usize>() * 2, 16384);
        }
        assert!(gemm_operand(0x1000, 10, 7, false).unwrap_err().to_string().contains("multiple of 8"));
        assert!(gemm_operand(0x1008, 10, 8, false).is_err());
        assert!(gemm_operand(0x1000, 4, 50257, true).is_err() && gemm_operand(0x1000, 0, 8, true).is_err());
    }
}
