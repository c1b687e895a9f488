// mfma.h: the bf16 matrix instruction the GEMM uses, one spelling for both targets.
//
//   v_mfma_f32_32x32x8bf16_1k  (gfx90a; the same encoding is named v_mfma_f32_32x32x8_bf16 on
//   gfx940/gfx942; clang's builtin is __builtin_amdgcn_mfma_f32_32x32x8bf16_1k for both)
//
// acc (32x32 f32) += A (32x8 bf16) · B (8x32 bf16) over the 64 lanes of a wavefront. Per lane l
// (layouts from AMD's CDNA 2 ISA, section 7, as ../emu/hip.h states and emulates):
//   a[j] = A[l % 32][4 (l / 32) + j]      b[j] = B[4 (l / 32) + j][l % 32]      j = 0..3
//   acc[r] = D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32]                          r = 0..15
// The row and column of accumulator r are given by mfma_row / mfma_col so kernels never
// re-derive the mapping.
#pragma once
#include "base.h"

__device__ __forceinline__ int mfma_row(int lane, int r) { return 8 * (r / 4) + 4 * (lane / 32) + r % 4; }
__device__ __forceinline__ int mfma_col(int lane) { return lane % 32; }

#ifdef TRIDENT_EMU
struct mfma_acc {
  float v[16];
};
__device__ __forceinline__ void mfma_32x32x8_bf16(mfma_acc& acc, const bf16 a[4], const bf16 b[4]) {
  uint16_t ab[4], bb[4];
  for (int j = 0; j < 4; ++j) ab[j] = a[j].bits, bb[j] = b[j].bits;
  emu::mfma_f32_32x32x8bf16(acc.v, ab, bb);
}
#else
typedef short short4_t __attribute__((ext_vector_type(4)));
typedef float float16_t __attribute__((ext_vector_type(16)));
struct mfma_acc {
  float16_t v;
};
__device__ __forceinline__ void mfma_32x32x8_bf16(mfma_acc& acc, const bf16 a[4], const bf16 b[4]) {
  short4_t av, bv;
  UNROLL for (int j = 0; j < 4; ++j) av[j] = short(a[j].bits), bv[j] = short(b[j].bits);
  acc.v = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(av, bv, acc.v, 0, 0, 0);
}
#endif
