// gemm_bf16_bwd.cu: the linear layer's backward GEMMs on sm_80+ tensor cores (mma.sync), the
// two products the training step needs besides the forward of gemm_bf16.cu.
//
//   gemm_bwd_input_bf16:   dinp[m][k]     = Σ_n dout[m][n] · W[n][k]      (overwrite)
//   gemm_bwd_weight_bf16:  dweight[n][k] += Σ_m dout[m][n] · inp[m][k]    (accumulate)
//
// with dout [M, N], W [N, K] and inp [M, K] bf16 row-major (trident's layouts), dinp and dweight
// [.., K] f32 row-major. Products are accumulated in f32; dweight adds the block's f32 tile to
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
// Grid: (⌈C columns/64⌉, ⌈C rows/64⌉) blocks of 128 threads; a block owns a 64x64 tile of C, its
// four warps a 2x2 arrangement of 32x32 warp tiles, 16 mma.sync.m16n8k16 per warp per 32-deep
// reduction step. Tiles are double-buffered with cp.async (16 B, zero-fill past the edge) when
// the source's rows are 16-byte aligned (its column count a multiple of 8), else plain loads.
//
// Shared memory: 2 stages x (A: 64 x 40 or 32 x 72, B: 32 x 72) bf16 (8 elements of padding per
// row so the eight 16-byte rows an ldmatrix reads fall in distinct banks) = 19456 B (dinp) or
// 18432 B (dweight), static.
//
// Reference: trident's `Device::linear_backward` on the reference device (src/device/reference.rs),
// in f64 on the same bf16-rounded inputs; tested under the SIMT emulation by tests/cuda_emulation.rs.
#include "common/base.cuh"
#include "common/ptx.cuh"

namespace gemm_bwd_detail {

constexpr int kTile = 64, kTileR = 32, kThreads = 128;
constexpr int kRowMajorLd = kTileR + 8;  // [64][40]: a row per output row, the reduction along it
constexpr int kRedMajorLd = kTile + 8;   // [32][72]: a row per reduction index

template <bool kATrans>
struct Tiles {
  bf16 a[2][kATrans ? kTileR * kRedMajorLd : kTile * kRowMajorLd];
  bf16 b[2][kTileR * kRedMajorLd];
};

// Copies rows row0..row0+kRows-1, columns col0..col0+kCols-1 of a row-major [rows, cols] matrix
// into a tile with kLd elements per row; outside the matrix the tile holds zeros.
template <int kRows, int kCols, int kLd>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int rows, int cols, int row0, int col0,
                                          bool async) {
  constexpr int kChunksPerRow = kCols / 8;
  if (async) {
    for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow; chunk += kThreads) {
      const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
      const int row = row0 + r, col = col0 + c;
      int bytes = 0;
      const bf16* from = src;
      if (row < rows && col < cols) {
        bytes = 2 * (cols - col < 8 ? cols - col : 8);
        from = src + (size_t)row * cols + col;
      }
      cp_async_16(tile + r * kLd + c, from, bytes);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
      const int r = i / kCols, c = i % kCols;
      const int row = row0 + r, col = col0 + c;
      tile[r * kLd + c] = (row < rows && col < cols) ? src[(size_t)row * cols + col] : to_bf16(0.0f);
    }
  }
}

__device__ __forceinline__ bool rows_aligned(const bf16* p, int cols) {
  return cols % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// C [rows, cols] (=|+=) A · B over `depth` reduction indices. kATrans: A[i][r] = a[r * rows + i]
// (a is [depth, rows]), else A[i][r] = a[i * depth + r]. B[r][j] = b[r * cols + j].
// kAccumulate: C += the product, else C = it.
template <bool kATrans, bool kAccumulate>
__device__ __forceinline__ void gemm_bwd_body(float* __restrict__ out, const bf16* __restrict__ a,
                                              const bf16* __restrict__ b, int rows, int cols, int depth) {
  __shared__ __align__(16) Tiles<kATrans> tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  const int warp_i = (warp / 2) * 32, warp_j = (warp % 2) * 32;
  const bool a_async = kATrans ? rows_aligned(a, rows) : rows_aligned(a, depth);
  const bool b_async = rows_aligned(b, cols);

  float acc[2][4][4];
  UNROLL
  for (int i = 0; i < 2; ++i)
    UNROLL
    for (int j = 0; j < 4; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  auto load_stage = [&](int stage, int r0) {
    if (kATrans)
      load_tile<kTileR, kTile, kRedMajorLd>(tiles.a[stage], a, depth, rows, r0, i0, a_async);
    else
      load_tile<kTile, kTileR, kRowMajorLd>(tiles.a[stage], a, rows, depth, i0, r0, a_async);
    load_tile<kTileR, kTile, kRedMajorLd>(tiles.b[stage], b, depth, cols, r0, j0, b_async);
    cp_async_commit();
  };

  const int r_tiles = ceil_div(depth, kTileR);
  load_stage(0, 0);
  for (int rt = 0; rt < r_tiles; ++rt) {
    const int stage = rt & 1;
    if (rt + 1 < r_tiles) {
      load_stage(stage ^ 1, (rt + 1) * kTileR);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* ta = tiles.a[stage];
    const bf16* tb = tiles.b[stage];

    // Lane l addresses a row of matrix q = l / 8 of an ldmatrix.x4, row l % 8 of it.
    const int q = lane / 8, qr = lane % 8;
    UNROLL
    for (int kk = 0; kk < kTileR; kk += 16) {
      // A fragments: matrices (i 0-7, r 0-7), (i 8-15, r 0-7), (i 0-7, r 8-15), (i 8-15, r 8-15).
      uint32_t af[2][4];
      UNROLL
      for (int mi = 0; mi < 2; ++mi) {
        if (kATrans)  // tile [r][i]: matrix q's rows are r = kk + (q / 2) * 8 + qr, at i block q % 2
          ldmatrix_x4_trans(af[mi], &ta[(kk + (q / 2) * 8 + qr) * kRedMajorLd + warp_i + mi * 16 + (q % 2) * 8]);
        else  // tile [i][r], as in the forward: lane l addresses row l % 16, r block l / 16
          ldmatrix_x4(af[mi], &ta[(warp_i + mi * 16 + lane % 16) * kRowMajorLd + kk + (lane / 16) * 8]);
      }
      // B fragments for two n8 tiles per ldmatrix.x4.trans from the [r][j] tile: matrices
      // (r 0-7, j 0-7), (r 8-15, j 0-7), (r 0-7, j 8-15), (r 8-15, j 8-15).
      uint32_t bf[4][2];
      UNROLL
      for (int p = 0; p < 2; ++p) {
        uint32_t reg[4];
        ldmatrix_x4_trans(reg, &tb[(kk + (q % 2) * 8 + qr) * kRedMajorLd + warp_j + p * 16 + (q / 2) * 8]);
        bf[2 * p][0] = reg[0];
        bf[2 * p][1] = reg[1];
        bf[2 * p + 1][0] = reg[2];
        bf[2 * p + 1][1] = reg[3];
      }
      UNROLL
      for (int mi = 0; mi < 2; ++mi)
        UNROLL
        for (int nj = 0; nj < 4; ++nj) mma_m16n8k16_bf16(acc[mi][nj], af[mi], bf[nj], acc[mi][nj]);
    }
    __syncthreads();
  }

  // Lane (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 tile.
  const int g = lane / 4, t = lane % 4;
  UNROLL
  for (int mi = 0; mi < 2; ++mi)
    UNROLL
    for (int nj = 0; nj < 4; ++nj)
      UNROLL
      for (int e = 0; e < 4; ++e) {
        const int row = i0 + warp_i + mi * 16 + g + (e / 2) * 8;
        const int col = j0 + warp_j + nj * 8 + 2 * t + e % 2;
        if (row >= rows || col >= cols) continue;
        const size_t at = (size_t)row * cols + col;
        out[at] = kAccumulate ? out[at] + acc[mi][nj][e] : acc[mi][nj][e];
      }
}

}  // namespace gemm_bwd_detail

// dinp [M, K] = dout [M, N] · W [N, K]. Grid (⌈K/64⌉, ⌈M/64⌉), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    gemm_bwd_input_bf16(float* dinp, const bf16* dout, const bf16* W, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<false, false>(dinp, dout, W, M, K, N);
}

// dweight [N, K] += doutᵀ [N, M] · inp [M, K]. Grid (⌈K/64⌉, ⌈N/64⌉), 128 threads. The minimum
// of one block per SM lets ptxas use the registers it needs: without it, sm_90a's ptxas caps this
// kernel at 96 registers and spills.
extern "C" __global__ void __launch_bounds__(128, 1)
    gemm_bwd_weight_bf16(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K) {
  gemm_bwd_detail::gemm_bwd_body<true, true>(dweight, dout, inp, N, K, M);
}
