// gemm_bf16.hip: out = inp · Wᵀ (+ bias) on AMD matrix cores, bf16 in, f32 accumulate, f32 out
// (the CDNA counterpart of kernels-cuda/gemm_bf16.cu's gemm_fwd_bf16_f32out, bias epilogue).
//
// Shapes: inp [M, K] bf16 row-major; weight [N, K] bf16 row-major (PyTorch's Linear layout);
//         bias [N] f32 or null; out [M, N] f32. Any M, N, K >= 1 (ragged edges are zero-filled
//         in LDS and masked at the store).
// Grid:   ⌈N/64⌉ x ⌈M/64⌉ workgroups of 4 wave64s (256 threads). A workgroup owns a 64x64 output
//         tile; wave w owns its 32x32 quadrant (rows 32 (w / 2), columns 32 (w % 2)) and keeps it
//         in one MFMA accumulator (16 f32 per lane). Each step stages a 64x32 slab of inp and of
//         weight in LDS (every thread loads 8 + 8 elements, zero past M, N or K), then each wave
//         issues 4 x v_mfma_f32_32x32x8bf16_1k (gfx90a; v_mfma_f32_32x32x8_bf16 on gfx942), one
//         per 8-wide slice of K, with the operand layout of common/mfma.h.
// LDS:    2 x 64 x (32 + 8) bf16 = 10 KiB of the 64 KiB budget (rows padded by 8 elements to
//         spread LDS banks). Registers: 16 accumulator floats (AGPRs on gfx90a), 8 operand
//         halves, addressing: a few tens of VGPRs per lane.
// Reference: `linear_forward` of trident's reference device (f64) on the same bf16 inputs
//         (tests/hip_emulation.rs); f32 output within a few f32 roundings.
#include "common/base.h"
#include "common/mfma.h"

#define GEMM_HIP_TILE 64
#define GEMM_HIP_BK 32
#define GEMM_HIP_PAD 8

extern "C" __global__ void __launch_bounds__(256)
    gemm_fwd_bf16_f32out_mfma(float* out, const bf16* inp, const bf16* weight, const float* bias, int M, int N, int K) {
  constexpr int T = GEMM_HIP_TILE, BK = GEMM_HIP_BK, LD = GEMM_HIP_BK + GEMM_HIP_PAD;
  __shared__ bf16 lds_a[T][LD];
  __shared__ bf16 lds_w[T][LD];
  static_assert(sizeof(bf16) * 2 * T * LD <= kLdsBytes, "LDS over the 64 KiB budget");
  static_assert(kWaveSize == 64, "the MFMA operand layout is defined for 64-lane wavefronts");

  const int tid = threadIdx.x, wave = tid / kWaveSize, lane = tid % kWaveSize;
  const int row0 = blockIdx.y * T, col0 = blockIdx.x * T;
  const int wave_row = 32 * (wave / 2), wave_col = 32 * (wave % 2);
  // Loader mapping: 256 threads x 8 consecutive K elements cover one 64x32 slab.
  const int load_row = tid / (BK / 8), load_k = 8 * (tid % (BK / 8));

  mfma_acc acc;
  for (int r = 0; r < 16; ++r) acc.v[r] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += BK) {
    UNROLL for (int j = 0; j < 8; ++j) {
      const int k = k0 + load_k + j, m = row0 + load_row, n = col0 + load_row;
      lds_a[load_row][load_k + j] = (m < M && k < K) ? inp[(size_t)m * K + k] : bf16{0};
      lds_w[load_row][load_k + j] = (n < N && k < K) ? weight[(size_t)n * K + k] : bf16{0};
    }
    __syncthreads();
    UNROLL for (int kk = 0; kk < BK; kk += 8) {
      bf16 a[4], b[4];
      UNROLL for (int j = 0; j < 4; ++j) {
        a[j] = lds_a[wave_row + lane % 32][kk + 4 * (lane / 32) + j];  // A[i][k] = inp[row i][k]
        b[j] = lds_w[wave_col + lane % 32][kk + 4 * (lane / 32) + j];  // B[k][n] = weight[col n][k]
      }
      mfma_32x32x8_bf16(acc, a, b);
    }
    __syncthreads();
  }

  const int n = col0 + wave_col + mfma_col(lane);
  if (n >= N) return;  // no collective follows
  const float b = bias ? bias[n] : 0.0f;
  UNROLL for (int r = 0; r < 16; ++r) {
    const int m = row0 + wave_row + mfma_row(lane, r);
    if (m < M) out[(size_t)m * N + n] = acc.v[r] + b;
  }
}
