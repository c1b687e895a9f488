// mfma.h: the 16-bit matrix instruction the GEMM uses, one spelling for both targets.
//
//   bf16 module: v_mfma_f32_32x32x8bf16_1k  (gfx90a; the same encoding is named
//     v_mfma_f32_32x32x8_bf16 on gfx940/gfx942; clang's builtin is
//     __builtin_amdgcn_mfma_f32_32x32x8bf16_1k for both)
//   fp16 module (-DTRIDENT_FP16, base.h): v_mfma_f32_32x32x8f16  (gfx90a; v_mfma_f32_32x32x8_f16
//     on gfx940/gfx942; __builtin_amdgcn_mfma_f32_32x32x8f16), the same shape and register
//     layouts on binary16 operands
//
// TRIDENT_MFMA_32X32X8 names the module's instruction once; the GPU build calls clang's builtin of
// that name and the emulation its model of the same name (../emu/hip.h), which reads the operands
// as that instruction does, so an fp16 module that issued the bf16 instruction would compute
// wrong products under the emulation too.
//
// acc (32x32 f32) += A (32x8 16-bit) · B (8x32 16-bit) over the 64 lanes of a wavefront. Per lane l
// (layouts from AMD's CDNA 2 ISA, section 7, as ../emu/hip.h states and emulates):
//   a[j] = A[l % 32][4 (l / 32) + j]      b[j] = B[4 (l / 32) + j][l % 32]      j = 0..3
//   acc[r] = D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32]                          r = 0..15
// The row and column of accumulator r are given by mfma_row / mfma_col so kernels never
// re-derive the mapping.
//
// Two consequences the kernels use (FlashAttention and the backward GEMMs): registers 4kb..4kb+3
// of an accumulator C hold C[8kb + 4 (l / 32) + j][l % 32], j = 0..3, which is exactly the B
// operand of k-block kb of a product with C as its B matrix (reduction over C's rows), and the A
// operand of one with Cᵀ as its A matrix. So a product's result feeds the next MFMA with no
// shuffle and no LDS round trip (mfma_acc_operand).
//
// Architectures. gfx90a (MI250X) and gfx940/941/942 (MI300) have this instruction; clang's
// builtin has the same name on both, and the assembler prints the gfx940 spelling, so the only
// arch selection is the guard below (gfx908 would need 2 x v_mfma_f32_32x32x4bf16 per k8, RDNA has
// no MFMA at all; the f16 instruction is on gfx908 too, but one guard serves both modules). Debian's clang-15 hipcc accepts gfx90a and gfx940 but not gfx942
// ; gfx942 builds with clang-19 and the gfx942 device-library shim (docs/design.md).
#pragma once
#include "common/base.h"

#if defined(__HIP_DEVICE_COMPILE__) && !defined(TRIDENT_EMU) && !defined(__gfx90a__) && !defined(__gfx940__) && \
    !defined(__gfx941__) && !defined(__gfx942__)
#error "kernels-hip needs v_mfma_f32_32x32x8bf16_1k: build for gfx90a or gfx940/941/942"
#endif

// The MFMA block: kMfmaM x kMfmaN outputs, kMfmaK deep, kMfmaAcc accumulators per lane. These
// are matrix dimensions of the instruction, not the wave size.
inline constexpr int kMfmaM = 32, kMfmaN = 32, kMfmaK = 8, kMfmaAcc = 16;

// Lanes l and l + kMfmaN hold the same column (the two halves of the wavefront split k and rows).
__device__ __forceinline__ int mfma_row(int lane, int r) { return 8 * (r / 4) + 4 * (lane / kMfmaN) + r % 4; }
__device__ __forceinline__ int mfma_col(int lane) { return lane % kMfmaN; }
// The first of the 4 consecutive k indices lane `lane` supplies in its A and B operands.
__device__ __forceinline__ int mfma_k(int lane) { return 4 * (lane / kMfmaN); }

// The module's instruction (builtin and emulation name) and the element type of its operand
// vectors (the bit patterns of `bf16`, whichever the storage type, reinterpreted as it).
#ifdef TRIDENT_FP16
#define TRIDENT_MFMA_32X32X8 mfma_f32_32x32x8f16
typedef _Float16 mfma_element_t;
#else
#define TRIDENT_MFMA_32X32X8 mfma_f32_32x32x8bf16_1k
typedef short mfma_element_t;
#endif

#ifdef TRIDENT_EMU
struct mfma_acc {
  float v[16];
};
__device__ __forceinline__ void mfma_32x32x8_bf16(mfma_acc& acc, const bf16 a[4], const bf16 b[4]) {
  uint16_t ab[4], bb[4];
  for (int j = 0; j < 4; ++j) ab[j] = a[j].bits, bb[j] = b[j].bits;
  emu::TRIDENT_MFMA_32X32X8(acc.v, ab, bb);
}
#else
#define TRIDENT_MFMA_PASTE(a, b) a##b
#define TRIDENT_MFMA_BUILTIN(name) TRIDENT_MFMA_PASTE(__builtin_amdgcn_, name)
typedef short short4_t __attribute__((ext_vector_type(4)));
typedef mfma_element_t mfma_operand_t __attribute__((ext_vector_type(4)));
typedef float float16_t __attribute__((ext_vector_type(16)));
struct mfma_acc {
  float16_t v;
};
__device__ __forceinline__ void mfma_32x32x8_bf16(mfma_acc& acc, const bf16 a[4], const bf16 b[4]) {
  short4_t av, bv;
  UNROLL for (int j = 0; j < 4; ++j) av[j] = short(a[j].bits), bv[j] = short(b[j].bits);
  const mfma_operand_t ao = __builtin_bit_cast(mfma_operand_t, av), bo = __builtin_bit_cast(mfma_operand_t, bv);
  acc.v = TRIDENT_MFMA_BUILTIN(TRIDENT_MFMA_32X32X8)(ao, bo, acc.v, 0, 0, 0);
}
#endif

__device__ __forceinline__ void mfma_zero(mfma_acc& acc) {
  UNROLL for (int r = 0; r < kMfmaAcc; ++r) acc.v[r] = 0.0f;
}
// Registers 4kb..4kb+3 of acc, rounded to the storage type: the operand of k-block kb described above.
__device__ __forceinline__ void mfma_acc_operand(bf16 op[4], const mfma_acc& acc, int kb) {
  UNROLL for (int j = 0; j < 4; ++j) op[j] = to_bf16(acc.v[4 * kb + j]);
}
