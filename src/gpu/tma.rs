//! Tensor maps for sm_90's tensor memory accelerator (TMA): the 128-byte `CUtensorMap` a kernel
//! takes by value, and the one geometry trident's sm_90a GEMMs (`kernels-cuda/gemm_bf16_sm90.cu`)
//! load through, which the CUDA runtime hands to the driver's `cuTensorMapEncodeTiled`.
//!
//! The geometry: a row-major bf16 matrix [rows, cols] seen as 2 dimensions (the columns, the
//! rows) with the 128-byte swizzle, so that one copy writes a tile straight into wgmma's
//! 128-byte swizzle layout, whole 128-byte rows per request; the box is 64 columns (128 bytes,
//! the swizzle's span) by 128 rows for an operand whose reduction runs along its rows' elements
//! (K-major) and by 64 rows for one whose reduction runs down its rows (MN-major: the kernel
//! loads a tile's two 64-column halves). TMA needs 16-byte global strides and a 16-byte aligned
//! start: `cols` a multiple of 8 and the address a multiple of 16, else `gemm_operand` says no.

use crate::error::{Error, Result};

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned (cuda.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TensorMap(pub [u64; 16]);

/// What `cuTensorMapEncodeTiled` is given for a bf16 tensor: 2 dimensions, element strides 1,
/// no interleave, `SWIZZLE_128B`, no L2 promotion, out-of-bounds elements read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledMap {
    pub address: u64,
    /// Sizes, innermost first.
    pub dims: [u64; 2],
    /// Byte stride of dimension 1 (dimension 0 is contiguous).
    pub strides: [u64; 1],
    pub boxes: [u32; 2],
}

/// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16`; also the maps of the fp16 module's binary16 operands: TMA
/// copies 16-bit elements as they are (the type sizes them; the out-of-bounds zero fill is the
/// same bits in both formats).
pub const DATA_TYPE_BF16: i32 = 9;
/// `CU_TENSOR_MAP_SWIZZLE_128B`: 16-byte chunk bits [4:6] of each shared address XORed with
/// bits [7:9]; the innermost box may be at most 128 bytes.
pub const SWIZZLE_128B: i32 = 3;

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
        dims: [cols as u64, rows as u64],
        strides: [2 * cols as u64],
        boxes: [64, if mn_major { 64 } else { 128 }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_maps_follow_the_kernel_header() {
        let k = gemm_operand(0x1000, 100, 72, false).unwrap();
        assert_eq!((k.dims, k.strides, k.boxes), ([72, 100], [144], [64, 128]));
        let mn = gemm_operand(0x1000, 300, 264, true).unwrap();
        assert_eq!((mn.dims, mn.strides, mn.boxes), ([264, 300], [528], [64, 64]));
        // The inner box is the 128-byte swizzle's span; a K-major box is a 16 KiB stage operand,
        // an MN-major one half of it.
        for (b, bytes) in [(k.boxes, 16384), (mn.boxes, 8192)] {
            assert_eq!((b[0] * 2, b.iter().map(|&x| x as usize).product::<usize>() * 2), (128, bytes));
        }
        assert!(gemm_operand(0x1000, 10, 7, false).unwrap_err().to_string().contains("multiple of 8"));
        assert!(gemm_operand(0x1008, 10, 8, false).is_err());
        assert!(gemm_operand(0x1000, 4, 50257, true).is_err() && gemm_operand(0x1000, 0, 8, true).is_err());
    }
}
