// gemm_bf16.cu: the linear layer's forward, out = epilogue(A · Wᵀ), on sm_80+ tensor cores.
//
// Computes   out[m][n] = act(Σ_k A[m][k]·W[n][k] + bias[n]) + residual[m][n]
// with A [M, K] bf16 row-major (activations), W [N, K] bf16 row-major (the weight as trident stores
// it: one row per output feature), bias [N] f32 (or null), act = identity or GPT-2's tanh GELU,
// residual [M, N] of the output type (or null), out [M, N] f32 (gemm_fwd_bf16_f32out) or bf16
// (gemm_fwd_bf16). Products are accumulated in f32; the epilogue is fused so the f32 tile is
// written once. Any M, N, K >= 1: ragged edges load as zeros and stores are guarded.
//
// Grid: (⌈N/64⌉, ⌈M/64⌉) blocks of 128 threads; a block owns a 64x64 tile of out, its four warps
// a 2x2 arrangement of 32x32 warp tiles. Per 32-wide K step a warp issues 2 (M) x 4 (N) x 2 (k16)
// = 16 mma.sync.m16n8k16, feeding A with ldmatrix.x4 (rows of A are the "row" operand) and B
// with ldmatrix.x4 on W's rows (W's rows are B's columns, the "col" operand), so no transpose.
// K tiles are double-buffered: tile k+1 streams in with cp.async (16 B, zero-fill past the
// edge) while tile k is multiplied. When K is not a multiple of 8 (rows not 16-byte aligned)
// the tiles are loaded with plain loads instead, same tiles, same math.
//
// Shared memory: 2 stages x (64 + 64) rows x 40 bf16 (32 + 8 padding, so the eight 16-byte rows
// an ldmatrix reads fall in distinct banks) = 20480 B, static. Registers: 32 f32 accumulators,
// 8 A and 8 B fragment registers per thread; `make kernels-check` prints the count (no spills).
//
// Reference: trident's `Device::linear_forward` (+ `gelu_forward`, + `add`) on the reference
// device (src/device/reference.rs), in f64 on the same bf16-rounded inputs; tested under the
// SIMT emulation by tests/cuda_emulation.rs.
#include "common/base.cuh"
#include "common/gelu.cuh"
#include "common/ptx.cuh"

namespace gemm_bf16_detail {

constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kThreads = 128;
constexpr int kRowStride = kTileK + 8;  // bf16 elements per shared row, 80 bytes
constexpr int kChunksPerRow = kTileK / 8;  // 16-byte chunks

struct Tiles {
  bf16 a[2][kTileM][kRowStride];
  bf16 w[2][kTileN][kRowStride];
};

// Loads rows row0.. of a [rows, K] matrix, columns k0..k0+31, into one stage's tile.
__device__ __forceinline__ void load_tile_async(bf16 (*tile)[kRowStride], const bf16* src, int rows, int K, int row0,
                                                int k0) {
  for (int chunk = threadIdx.x; chunk < kTileM * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
    const int row = row0 + r, k = k0 + c;
    int bytes = 0;
    const bf16* from = src;
    if (row < rows && k < K) {
      bytes = 2 * (K - k < 8 ? K - k : 8);
      from = src + (size_t)row * K + k;
    }
    cp_async_16(&tile[r][c], from, bytes);
  }
}

__device__ __forceinline__ void load_tile_plain(bf16 (*tile)[kRowStride], const bf16* src, int rows, int K, int row0,
                                                int k0) {
  for (int i = threadIdx.x; i < kTileM * kTileK; i += kThreads) {
    const int r = i / kTileK, c = i % kTileK;
    const int row = row0 + r, k = k0 + c;
    tile[r][c] = (row < rows && k < K) ? src[(size_t)row * K + k] : to_bf16(0.0f);
  }
}

template <class Out>
__device__ __forceinline__ void gemm_bf16_body(Out* __restrict__ out, const bf16* __restrict__ A,
                                               const bf16* __restrict__ W, const float* __restrict__ bias,
                                               const Out* __restrict__ residual, int M, int N, int K, int gelu) {
  __shared__ __align__(16) Tiles tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  const int warp_m = (warp / 2) * 32, warp_n = (warp % 2) * 32;
  // cp.async needs every 16-byte chunk aligned, i.e. rows that start on 16 bytes.
  const bool async = K % 8 == 0 && reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;

  float acc[2][4][4];
  UNROLL
  for (int i = 0; i < 2; ++i)
    UNROLL
    for (int j = 0; j < 4; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  auto load_stage = [&](int stage, int k0) {
    if (async) {
      load_tile_async(tiles.a[stage], A, M, K, m0, k0);
      load_tile_async(tiles.w[stage], W, N, K, n0, k0);
    } else {
      load_tile_plain(tiles.a[stage], A, M, K, m0, k0);
      load_tile_plain(tiles.w[stage], W, N, K, n0, k0);
    }
    cp_async_commit();
  };

  const int k_tiles = ceil_div(K, kTileK);
  load_stage(0, 0);
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < k_tiles) {
      load_stage(stage ^ 1, (kt + 1) * kTileK);
      cp_async_wait<1>();  // this stage's copies have landed; the next stage's may be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies into this stage are visible

    UNROLL
    for (int kk = 0; kk < kTileK; kk += 16) {
      // A fragments: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
      // (rows 8-15, k 8-15) of the 16x16 sub-tile are a[0..3]; lane l addresses row l % 16,
      // column block l / 16.
      uint32_t a[2][4];
      UNROLL
      for (int i = 0; i < 2; ++i)
        ldmatrix_x4(a[i], &tiles.a[stage][warp_m + i * 16 + lane % 16][kk + (lane / 16) * 8]);
      // B fragments for two n8 tiles per ldmatrix.x4: matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
      // (n 8-15, k 0-7), (n 8-15, k 8-15); lane l addresses W row l % 8 + 8 (l / 16), k block
      // (l / 8) % 2.
      uint32_t b[4][2];
      UNROLL
      for (int p = 0; p < 2; ++p) {
        uint32_t r[4];
        ldmatrix_x4(r, &tiles.w[stage][warp_n + p * 16 + lane % 8 + (lane / 16) * 8][kk + ((lane / 8) % 2) * 8]);
        b[2 * p][0] = r[0];
        b[2 * p][1] = r[1];
        b[2 * p + 1][0] = r[2];
        b[2 * p + 1][1] = r[3];
      }
      UNROLL
      for (int i = 0; i < 2; ++i)
        UNROLL
        for (int j = 0; j < 4; ++j) mma_m16n8k16_bf16(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // everyone is done reading this stage before it is refilled
  }

  // Epilogue straight from the accumulator fragments: lane (g, t) holds rows g and g + 8,
  // columns 2t and 2t + 1 of each 16x8 tile.
  const int g = lane / 4, t = lane % 4;
  UNROLL
  for (int i = 0; i < 2; ++i)
    UNROLL
    for (int j = 0; j < 4; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + warp_m + i * 16 + g + (e / 2) * 8;
        const int col = n0 + warp_n + j * 8 + 2 * t + e % 2;
        if (row >= M || col >= N) continue;
        float v = acc[i][j][e];
        if (bias) v += bias[col];
        if (gelu) v = gelu_tanh(v);
        const size_t at = (size_t)row * N + col;
        if (residual) v += to_float(residual[at]);
        out[at] = from_float<Out>(v);
      }
}

}  // namespace gemm_bf16_detail

extern "C" __global__ void __launch_bounds__(128)
    gemm_fwd_bf16_f32out(float* out, const bf16* A, const bf16* W, const float* bias, const float* residual, int M, int N,
                         int K, int gelu) {
  gemm_bf16_detail::gemm_bf16_body<float>(out, A, W, bias, residual, M, N, K, gelu);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_fwd_bf16(bf16* out, const bf16* A, const bf16* W, const float* bias, const bf16* residual, int M, int N, int K,
                  int gelu) {
  gemm_bf16_detail::gemm_bf16_body<bf16>(out, A, W, bias, residual, M, N, K, gelu);
}
