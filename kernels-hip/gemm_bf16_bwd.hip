// gemm_bf16_bwd.hip: the linear layer's backward GEMMs on AMD matrix cores (the CDNA counterpart
// of kernels-cuda/gemm_bf16_bwd.cu, same kernel names and arguments).
//
//   gemm_bwd_input_bf16:          dinp[m][k]     = Σ_n dout[m][n] · W[n][k]      (overwrite)
//   gemm_bwd_input_bf16_bf16out:  the same with dinp bf16 (the f32 sum rounded once)
//   gemm_bwd_weight_bf16:         dweight[n][k] += Σ_m dout[m][n] · inp[m][k]    (accumulate)
//
// with dout [M, N], W [N, K] and inp [M, K] bf16 row-major, dinp [M, K] f32 or bf16 and
// dweight [N, K] f32 row-major. Products accumulate in f32; dweight adds the tile to what is there (gradient
// accumulation over micro-batches). Any M, N, K >= 1. The bias gradient is not here.
//
// Both are common/gemm_mfma.h's tile C[i][j] = Σ_r A[i][r] · B[r][j] with the operands read in
// place, never transposed in memory: dinp has A = dout (reduction n contiguous) and B = W
// (output column k contiguous); dweight has A = doutᵀ (output row n contiguous in dout) and
// B = inp (k contiguous). The LDS loader walks whichever index is contiguous, and stages both
// as [output][reduction] tiles for the MFMA operands.
//
// Grid: dinp (⌈K/64⌉, ⌈M/64⌉), dweight (⌈K/64⌉, ⌈N/64⌉) workgroups of 256 threads (4 wave64s) in
// the grouped tile order of common/tile_order.h,
// each wave a 32x32 MFMA accumulator, 4 x v_mfma_f32_32x32x8bf16_1k per 32-deep step. LDS: 10 KiB
// of the 64 KiB. Registers (hipcc gfx90a): see docs/kernels.md (no scratch).
//
// Reference: `linear_backward` of trident's reference device (f64) on the same bf16 inputs
// (tests/hip_emulation.rs).
#include "common/base.h"
#include "common/gemm_mfma.h"
#include "common/tile_order.h"

namespace gemm_bwd_detail {

template <bool kARContig, bool kBRContig, bool kAccumulate, class Out = float>
__device__ __forceinline__ void gemm_bwd_body(Out* __restrict__ out, const bf16* __restrict__ a, int lda,
                                              const bf16* __restrict__ b, int ldb, int rows, int cols, int depth) {
  const TileIndex tile = grouped_tile();
  const int i0 = tile.row * gemm_mfma::kTile, j0 = tile.col * gemm_mfma::kTile;
  mfma_acc acc;
  gemm_mfma::tile<kARContig, kBRContig>(acc, a, lda, b, ldb, rows, cols, depth, i0, j0);
  const int j = j0 + gemm_mfma::out_col();
  if (j >= cols) return;
  UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
    const int i = i0 + gemm_mfma::out_row(r);
    if (i >= rows) continue;
    const size_t at = (size_t)i * cols + j;
    out[at] = from_float<Out>(kAccumulate ? to_float(out[at]) + acc.v[r] : acc.v[r]);
  }
}

}  // namespace gemm_bwd_detail

// dinp [M, K] = dout [M, N] · W [N, K]. Grid (⌈K/64⌉, ⌈M/64⌉), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_input_bf16(float* dinp, const bf16* dout, const bf16* W, int M, int N, int K) {
  // A[i = m][r = n] = dout[m·N + n] (r contiguous); B[r = n][j = k] = W[n·K + k] (j contiguous).
  gemm_bwd_detail::gemm_bwd_body<true, false, false>(dinp, dout, N, W, K, M, K, N);
}

// dinp [M, K] bf16 = dout [M, N] · W [N, K], rounded once. Grid and threads as gemm_bwd_input_bf16's.
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_input_bf16_bf16out(bf16* dinp, const bf16* dout, const bf16* W, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<true, false, false, bf16>(dinp, dout, N, W, K, M, K, N);
}

// dweight [N, K] += doutᵀ [N, M] · inp [M, K]. Grid (⌈K/64⌉, ⌈N/64⌉), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_weight_bf16(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K) {
  // A[i = n][r = m] = dout[m·N + n] (i contiguous); B[r = m][j = k] = inp[m·K + k] (j contiguous).
  gemm_bwd_detail::gemm_bwd_body<false, false, true>(dweight, dout, N, inp, K, N, K, M);
}
