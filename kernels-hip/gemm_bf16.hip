// gemm_bf16.hip: the linear layer's forward, out = epilogue(A · Wᵀ), on AMD matrix cores (the
// CDNA counterpart of kernels-cuda/gemm_bf16.cu, same kernel names and arguments).
//
// Computes   out[m][n] = act(Σ_k A[m][k]·W[n][k] + bias[n]) + residual[m][n]
// with A [M, K] bf16 row-major (activations), W [N, K] bf16 row-major (one row per output
// feature), bias [N] f32 (or null), act = identity or GPT-2's tanh GELU (gelu != 0), residual
// [M, N] of the output type (or null), out [M, N] f32 (gemm_fwd_bf16_f32out) or bf16
// (gemm_fwd_bf16). Products accumulate in f32; the epilogue is fused so the f32 tile is written
// once. Any M, N, K >= 1: ragged edges load as zeros and stores are guarded.
//
// Grid: (⌈N/64⌉, ⌈M/64⌉) workgroups of 256 threads in the grouped tile order of
// common/tile_order.h (4 wave64s; the CUDA kernel's grid and order, with
// 64-lane waves). The tile is common/gemm_mfma.h's: wave w owns a 32x32 quadrant in one MFMA
// accumulator (16 f32 per lane, AGPRs on gfx90a), 4 x v_mfma_f32_32x32x8bf16_1k per 32-deep step
// (v_mfma_f32_32x32x8_bf16 on gfx940+), both operands reduction-contiguous (A's rows, W's rows).
// LDS: 10 KiB of the 64 KiB. Registers (hipcc gfx90a): see docs/kernels.md (no scratch).
//
// Reference: `linear_forward` (+ `gelu_forward`, + `add`) of trident's reference device (f64) on
// the same bf16 inputs (tests/hip_emulation.rs).
#include "common/base.h"
#include "common/gelu.h"
#include "common/gemm_mfma.h"
#include "common/tile_order.h"

namespace gemm_bf16_detail {

template <class Out>
__device__ __forceinline__ void gemm_fwd_body(Out* __restrict__ out, const bf16* __restrict__ A,
                                              const bf16* __restrict__ W, const float* __restrict__ bias,
                                              const Out* __restrict__ residual, int M, int N, int K, int gelu) {
  const TileIndex tile = grouped_tile();
  const int m0 = tile.row * gemm_mfma::kTile, n0 = tile.col * gemm_mfma::kTile;
  mfma_acc acc;
  gemm_mfma::tile<true, true>(acc, A, K, W, K, M, N, K, m0, n0);
  const int n = n0 + gemm_mfma::out_col();
  if (n >= N) return;  // no collective follows
  const float b = bias ? bias[n] : 0.0f;
  UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
    const int m = m0 + gemm_mfma::out_row(r);
    if (m >= M) continue;
    float v = acc.v[r] + b;
    if (gelu) v = gelu_tanh(v);
    const size_t at = (size_t)m * N + n;
    if (residual) v += to_float(residual[at]);
    out[at] = from_float<Out>(v);
  }
}

}  // namespace gemm_bf16_detail

extern "C" __global__ void __launch_bounds__(256)
    gemm_fwd_bf16_f32out(float* out, const bf16* A, const bf16* W, const float* bias, const float* residual, int M, int N,
                         int K, int gelu) {
  gemm_bf16_detail::gemm_fwd_body<float>(out, A, W, bias, residual, M, N, K, gelu);
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_fwd_bf16(bf16* out, const bf16* A, const bf16* W, const float* bias, const bf16* residual, int M, int N, int K,
                  int gelu) {
  gemm_bf16_detail::gemm_fwd_body<bf16>(out, A, W, bias, residual, M, N, K, gelu);
}
