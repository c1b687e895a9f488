// gemm_bf16.cu: the linear layer's forward, out = epilogue(A · Wᵀ), on sm_80+ tensor cores.
//
// Computes   out[m][n] = act(Σ_k A[m][k]·W[n][k] + bias[n]) + residual[m][n]
// with A [M, K] bf16 row-major (activations), W [N, K] bf16 row-major (the weight as trident stores
// it: one row per output feature), bias [N] f32 (or null), act = identity or GPT-2's tanh GELU,
// residual [M, N] of the output type (or null), out [M, N] f32 (gemm_fwd_bf16_f32out) or bf16
// (gemm_fwd_bf16). Products are accumulated in f32; the epilogue is fused so the f32 tile is
// written once. Any M, N, K >= 1: ragged edges load as zeros and stores are guarded.
//
// Grid: (⌈N/128⌉, ⌈M/128⌉) blocks of 256 threads, taken in the grouped tile order of
// common/tile_order.cuh (8 rows of tiles at a time); a block owns a 128x128 tile of out, its eight
// warps a 2x4 arrangement of 64x32 warp tiles, fed by a 4-stage cp.async ring of 32-deep k-tiles
// (common/gemm_pipeline.cuh: geometry, loader, main loop). Per 16-deep step a warp issues
// 4 (M) x 4 (N) = 16 mma.sync.m16n8k16, feeding A with 4 ldmatrix.x4 (rows of A are the "row"
// operand) and B with 2 ldmatrix.x4 on W's rows (W's rows are B's columns, the "col" operand), so
// no transpose. When K is not a multiple of 8 (rows not 16-byte aligned) the tiles are loaded
// with plain loads instead, same tiles, same math.
//
// Shared memory: 4 stages x (128 + 128) rows x 40 bf16 (32 + 8 padding, so the eight 16-byte rows
// an ldmatrix reads fall in distinct banks) = 81920 B, dynamic (the launch passes kSharedBytes;
// above 48 KiB, so the host opts the kernel in first). Registers: 64 f32 accumulators, 16 A and
// 8 B fragment registers per thread; `make kernels-check` prints the count (no spills).
//
// Reference: trident's `Device::linear_forward` (+ `gelu_forward`, + `add`) on the reference
// device (src/device/reference.rs), in f64 on the same bf16-rounded inputs; tested under the
// SIMT emulation by tests/cuda_emulation.rs.
#include "common/base.cuh"
#include "common/gelu.h"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/gemm_pipeline.cuh"
#include "common/tile_order.cuh"

namespace gemm_bf16_detail {

using namespace gemm_pipeline;

struct Stages {
  bf16 a[kStages][kTile * kRowMajorLd];
  bf16 w[kStages][kTile * kRowMajorLd];
};
// The dynamic shared memory a launch passes (src/gpu/kernels/mod.rs states the same number).
constexpr unsigned kSharedBytes = sizeof(Stages);
static_assert(kSharedBytes == 81920, "the header and the kernel index state this size");

template <class Out>
__device__ __forceinline__ void gemm_bf16_body(Out* __restrict__ out, const bf16* __restrict__ A,
                                               const bf16* __restrict__ W, const float* __restrict__ bias,
                                               const Out* __restrict__ residual, int M, int N, int K, int gelu) {
  DYNAMIC_SHARED(Stages, stages);
  const TileIndex tile = grouped_tile();
  const int m0 = tile.row * kTile, n0 = tile.col * kTile;
  const int wm = warp_row(), wn = warp_col();
  // cp.async needs every 16-byte chunk aligned, i.e. rows that start on 16 bytes.
  const bool async = rows_aligned(A, K) && rows_aligned(W, K);

  Accumulators acc;
  zero(acc);
  main_loop(
      K,
      [&](int stage, int k0) {
        load_tile<kTile, kTileK, kRowMajorLd>(stages.a[stage], A, M, K, m0, k0, async);
        load_tile<kTile, kTileK, kRowMajorLd>(stages.w[stage], W, N, K, n0, k0, async);
      },
      [&](int stage) {
        UNROLL
        for (int kk = 0; kk < kTileK; kk += 16) {
          uint32_t a[kWarpRows / 16][4], b[kWarpCols / 8][2];
          a_fragments(a, stages.a[stage], kk, wm);
          b_fragments(b, stages.w[stage], kk, wn);
          multiply(acc, a, b);
        }
      });

  // Epilogue straight from the accumulator fragments.
  for_each_output(acc, m0 + wm, n0 + wn, M, N, [&](int row, int col, float v) {
    if (bias) v += bias[col];
    if (gelu) v = gelu_tanh(v);
    const size_t at = (size_t)row * N + col;
    if (residual) v += to_float(residual[at]);
    out[at] = from_float<Out>(v);
  });
}

}  // namespace gemm_bf16_detail

// registry: dynamic_shared=81920
extern "C" __global__ void __launch_bounds__(256)
    gemm_fwd_bf16_f32out(float* out, const bf16* A, const bf16* W, const float* bias, const float* residual, int M, int N,
                         int K, int gelu) {
  gemm_bf16_detail::gemm_bf16_body<float>(out, A, W, bias, residual, M, N, K, gelu);
}

// registry: dynamic_shared=81920
extern "C" __global__ void __launch_bounds__(256)
    gemm_fwd_bf16(bf16* out, const bf16* A, const bf16* W, const float* bias, const bf16* residual, int M, int N, int K,
                  int gelu) {
  gemm_bf16_detail::gemm_bf16_body<bf16>(out, A, W, bias, residual, M, N, K, gelu);
}
