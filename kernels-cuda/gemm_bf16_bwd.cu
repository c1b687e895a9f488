// gemm_bf16_bwd.cu: the linear layer's backward GEMMs on sm_80+ tensor cores (mma.sync), the
// two products the training step needs besides the forward of gemm_bf16.cu.
//
//   gemm_bwd_input_bf16:          dinp[m][k]     = Σ_n dout[m][n] · W[n][k]      (overwrite)
//   gemm_bwd_input_bf16_bf16out:  the same with dinp bf16 (the f32 sum rounded once)
//   gemm_bwd_weight_bf16:         dweight[n][k] += Σ_m dout[m][n] · inp[m][k]    (accumulate)
//
// with dout [M, N], W [N, K] and inp [M, K] bf16 row-major (trident's layouts), dinp [M, K] f32
// or bf16 and dweight [N, K] f32 row-major. Products are accumulated in f32; dweight adds the block's f32 tile to
// what is already there (gradient accumulation over micro-batches). Any M, N, K >= 1: ragged
// edges load as zeros and stores are guarded. The bias gradient (a column sum of dout) is not here.
//
// Both are one body, C[i][j] = Σ_r A[i][r] · B[r][j], with B stored reduction-major (row r holds
// B[r][0..]), which is W for dinp and inp for dweight. mma.sync wants B's fragments paired along
// the reduction, so B is read with ldmatrix.x4.trans from [r][j] tiles. A is dout: for dinp it is
// row-major with the reduction (n) contiguous, read with plain ldmatrix as in the forward; for
// dweight it is doutᵀ, whose reduction (m) is dout's row index, so it too is read with
// ldmatrix.x4.trans from [r][i] tiles. No transposed copy of any matrix is made.
//
// Grid: (⌈C columns/128⌉, ⌈C rows/128⌉) blocks of 256 threads in the grouped tile order of
// common/tile_order.cuh; a block owns a 128x128 tile of C,
// its eight warps a 2x4 arrangement of 64x32 warp tiles, 16 mma.sync.m16n8k16 per warp per
// 16-deep step, fed by a 4-stage cp.async ring of 32-deep reduction tiles
// (common/gemm_pipeline.cuh: geometry, loader, main loop). A source whose rows are not 16-byte
// aligned (its column count not a multiple of 8) is loaded with plain loads into the same stages.
//
// Shared memory: 4 stages x (A: 128 x 40 or 32 x 136, B: 32 x 136) bf16 (8 elements of padding
// per row so the eight 16-byte rows an ldmatrix reads fall in distinct banks) = 75776 B (dinp) or
// 69632 B (dweight), dynamic (above 48 KiB: the host opts each kernel in first).
//
// Reference: trident's `Device::linear_backward` on the reference device (src/device/reference.rs),
// in f64 on the same bf16-rounded inputs; tested under the SIMT emulation by tests/cuda_emulation.rs.
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/gemm_pipeline.cuh"
#include "common/tile_order.cuh"

namespace gemm_bwd_detail {

using namespace gemm_pipeline;

template <bool kATrans>
struct Stages {
  bf16 a[kStages][kATrans ? kTileK * kRedMajorLd : kTile * kRowMajorLd];
  bf16 b[kStages][kTileK * kRedMajorLd];
};
// The dynamic shared memory a launch passes (src/gpu/kernels/mod.rs states the same numbers).
constexpr unsigned kInputSharedBytes = sizeof(Stages<false>), kWeightSharedBytes = sizeof(Stages<true>);
static_assert(kInputSharedBytes == 75776 && kWeightSharedBytes == 69632, "the header and the index state these");

// C [rows, cols] (=|+=) A · B over `depth` reduction indices. kATrans: A[i][r] = a[r * rows + i]
// (a is [depth, rows]), else A[i][r] = a[i * depth + r]. B[r][j] = b[r * cols + j].
// kAccumulate: C += the product, else C = it; C is f32 or bf16 (Out).
template <bool kATrans, bool kAccumulate, class Out = float>
__device__ __forceinline__ void gemm_bwd_body(Out* __restrict__ out, const bf16* __restrict__ a,
                                              const bf16* __restrict__ b, int rows, int cols, int depth) {
  DYNAMIC_SHARED(Stages<kATrans>, stages);
  // The tile's origin sits in shared memory and is read where it is used: held in registers
  // across the main loop it pushes ptxas past 128 registers into spills on sm_90a (the plain
  // order's blockIdx could be re-read for free; the grouped order's divisions cannot).
  __shared__ int origin[2];
  if (threadIdx.x == 0) {
    const TileIndex tile = grouped_tile();
    origin[0] = tile.row * kTile;
    origin[1] = tile.col * kTile;
  }
  __syncthreads();
  const int wi = warp_row(), wj = warp_col();
  const bool a_async = kATrans ? rows_aligned(a, rows) : rows_aligned(a, depth);
  const bool b_async = rows_aligned(b, cols);

  Accumulators acc;
  zero(acc);
  main_loop(
      depth,
      [&](int stage, int r0) {
        const int i0 = origin[0], j0 = origin[1];
        if (kATrans)
          load_tile<kTileK, kTile, kRedMajorLd>(stages.a[stage], a, depth, rows, r0, i0, a_async);
        else
          load_tile<kTile, kTileK, kRowMajorLd>(stages.a[stage], a, rows, depth, i0, r0, a_async);
        load_tile<kTileK, kTile, kRedMajorLd>(stages.b[stage], b, depth, cols, r0, j0, b_async);
      },
      [&](int stage) {
        UNROLL
        for (int kk = 0; kk < kTileK; kk += 16) {
          uint32_t af[kWarpRows / 16][4], bf[kWarpCols / 8][2];
          if (kATrans)  // doutᵀ: the [r][i] tile, transposed by ldmatrix
            a_fragments_trans(af, stages.a[stage], kk, wi);
          else  // dout: the [i][r] tile, as in the forward
            a_fragments(af, stages.a[stage], kk, wi);
          b_fragments_trans(bf, stages.b[stage], kk, wj);
          multiply(acc, af, bf);
        }
      });

  const int i0 = origin[0], j0 = origin[1];
  for_each_output(acc, i0 + wi, j0 + wj, rows, cols, [&](int row, int col, float v) {
    const size_t at = (size_t)row * cols + col;
    out[at] = from_float<Out>(kAccumulate ? to_float(out[at]) + v : v);
  });
}

}  // namespace gemm_bwd_detail

// dinp [M, K] = dout [M, N] · W [N, K]. Grid (⌈K/128⌉, ⌈M/128⌉), 256 threads, kInputSharedBytes.
// registry: static_shared=16 dynamic_shared=75776
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_input_bf16(float* dinp, const bf16* dout, const bf16* W, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<false, false>(dinp, dout, W, M, K, N);
}

// dinp [M, K] bf16 = dout [M, N] · W [N, K], rounded once. Grid, threads and shared memory as
// gemm_bwd_input_bf16's.
// registry: static_shared=16 dynamic_shared=75776
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_input_bf16_bf16out(bf16* dinp, const bf16* dout, const bf16* W, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<false, false, bf16>(dinp, dout, W, M, K, N);
}

// dweight [N, K] += doutᵀ [N, M] · inp [M, K]. Grid (⌈K/128⌉, ⌈N/128⌉), 256 threads,
// kWeightSharedBytes.
// registry: static_shared=16 dynamic_shared=69632
extern "C" __global__ void __launch_bounds__(256)
    gemm_bwd_weight_bf16(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<true, true>(dweight, dout, inp, N, K, M);
}
