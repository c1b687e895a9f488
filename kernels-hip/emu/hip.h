// hip.h: the HIP spellings of the SIMT emulation, so that the kernels in kernels-hip/ run
// unchanged under g++ (-std=c++20, -DTRIDENT_EMU) in `cargo test` on a machine without a GPU.
//
// It reuses kernels-cuda/emu/simt.h (fibers, barriers, deadlock detection, wave collectives)
// with TRIDENT_EMU_WAVE_SIZE = 64, so every collective spans a 64-lane wavefront and lane masks
// are 64-bit, and adds:
//   - HIP's mask-free wave intrinsics: __shfl, __shfl_xor, __shfl_down, __ballot (64-bit), __any, __all;
//   - v_mfma_f32_32x32x8bf16_1k (gfx90a; v_mfma_f32_32x32x8_bf16 on gfx940/942) and
//     v_mfma_f32_32x32x8f16 (v_mfma_f32_32x32x8_f16 on gfx940/942), the same operation and
//     register layouts on bf16 or binary16 operands, in mfma_f32_32x32x8bf16_1k and
//     mfma_f32_32x32x8f16 below (clang's builtin names without __builtin_amdgcn_, so
//     ../common/mfma.h names the instruction once for both targets).
//
// MFMA layout reference: AMD "CDNA 2 Instruction Set Architecture" (2022), section 7 "Matrix
// Arithmetic Instructions", and the register layouts that AMD's Matrix Instruction Calculator
// (github.com/ROCm/amd_matrix_instruction_calculator, `--architecture cdna2 --instruction
// v_mfma_f32_32x32x8bf16_1k --detail-instruction`) prints for it. One block (32x32 output), K = 8:
//   A (32x8, M x K):  lane l holds A[l % 32][4 (l / 32) + j] in element j of its 4 x bf16 operand
//   B (8x32, K x N):  lane l holds B[4 (l / 32) + j][l % 32] in element j
//   C, D (32x32 f32): lane l, accumulator register r (0..15) holds D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32]
// The f16 instruction has the same A, B, C and D layouts (the calculator's
// `--instruction v_mfma_f32_32x32x8f16`). The products of 16-bit values are exact; each output's
// sum is taken in double and rounded once to f32, which is within the hardware's accumulation
// error for any order it uses.
#pragma once

#ifndef TRIDENT_EMU_WAVE_SIZE
#define TRIDENT_EMU_WAVE_SIZE 64
#endif
#include "../../kernels-cuda/emu/ptx.h"  // simt.h and the bf16 bit helpers
static_assert(TRIDENT_EMU_WAVE_SIZE == 64, "the HIP emulation runs 64-lane wavefronts");

template <class T>
T __shfl(T v, int src, int width = warpSize) {
  return emu::shuffle(emu::Shuffle::Index, emu::kAllLanes, v, src, width);
}
template <class T>
T __shfl_xor(T v, int lane_mask, int width = warpSize) {
  return emu::shuffle(emu::Shuffle::Xor, emu::kAllLanes, v, lane_mask, width);
}
template <class T>
T __shfl_down(T v, unsigned delta, int width = warpSize) {
  return emu::shuffle(emu::Shuffle::Down, emu::kAllLanes, v, int(delta), width);
}
inline unsigned long long __ballot(int p) { return emu::vote(emu::Vote::Ballot, emu::kAllLanes, p != 0); }
inline int __any(int p) { return int(emu::vote(emu::Vote::Any, emu::kAllLanes, p != 0)); }
inline int __all(int p) { return int(emu::vote(emu::Vote::All, emu::kAllLanes, p != 0)); }

namespace emu {

// Operand of one lane: its 4 A and 4 B elements (16-bit patterns, element j at index j) and where its
// 16 accumulators live (on the lane's own fiber stack, which stays put while it waits here).
struct MfmaOperand {
  uint16_t a[4];
  uint16_t b[4];
  float* acc;
};
inline constexpr int kMfma = 100;

// acc = A · B + acc over the wavefront, with the layouts above, the operands' bit patterns read
// by `element` (bf16 or binary16).
template <float (*element)(uint16_t)>
inline void mfma_f32_32x32x8(float acc[16], const uint16_t a[4], const uint16_t b[4]) {
  MfmaOperand op;
  std::memcpy(op.a, a, sizeof op.a);
  std::memcpy(op.b, b, sizeof op.b);
  op.acc = acc;
  warp_collective<MfmaOperand, int>(kMfma, kAllLanes, op, [](const MfmaOperand* ops, int* res, unsigned lanes) {
    if (lanes != 64) fail("v_mfma in a partial wavefront");
    float A[32][8], B[8][32];
    for (unsigned l = 0; l < 64; ++l)
      for (unsigned j = 0; j < 4; ++j) {
        A[l % 32][4 * (l / 32) + j] = element(ops[l].a[j]);
        B[4 * (l / 32) + j][l % 32] = element(ops[l].b[j]);
      }
    // Every output element lives in exactly one (lane, register), so updating in place reads
    // each C value before writing its D.
    for (unsigned l = 0; l < 64; ++l) {
      for (unsigned r = 0; r < 16; ++r) {
        const unsigned row = 8 * (r / 4) + 4 * (l / 32) + r % 4, col = l % 32;
        double sum = ops[l].acc[r];
        for (int k = 0; k < 8; ++k) sum += double(A[row][k]) * double(B[k][col]);
        ops[l].acc[r] = float(sum);
      }
      res[l] = 0;
    }
  });
}
inline void mfma_f32_32x32x8bf16_1k(float acc[16], const uint16_t a[4], const uint16_t b[4]) {
  mfma_f32_32x32x8<bf16_bits_to_float>(acc, a, b);
}
inline void mfma_f32_32x32x8f16(float acc[16], const uint16_t a[4], const uint16_t b[4]) {
  mfma_f32_32x32x8<f16_bits_to_float>(acc, a, b);
}

}  // namespace emu
