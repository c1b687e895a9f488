// gemm_pipeline.cuh: what the sm_80 GEMMs (gemm_bf16.cu, gemm_bf16_bwd.cu) share: the block
// geometry, the tile loader and the multi-stage cp.async main loop.
//
// Geometry. A block of 256 threads (8 warps) owns a 128 x 128 tile of the output, its warps a
// 2 (rows) x 4 (columns) arrangement of 64 x 32 warp tiles: per 16-deep step a warp issues
// 4 (m16) x 4 (n8) = 16 mma.sync.m16n8k16 on fragments from 4 ldmatrix.x4 for its rows and 2 for
// its columns. The reduction advances in 32-deep k-tiles through a ring of kStages = 4 shared
// memory stages: while k-tile t is multiplied, tiles t+1..t+3 are in flight (cp.async), so a
// block keeps three tiles' loads outstanding instead of one (the 64 x 64 double-buffered kernels
// before this one kept one).
//
// Shared memory rows carry 8 bf16 (16 B) of padding so that the eight 16-byte rows one ldmatrix
// reads start in distinct 4-bank groups (row strides of 80 B or 272 B: 20 or 68 words, which
// step through all eight 16-byte bank groups mod 128 B). The stages are dynamic shared memory
// (64 KiB and more: above the 48 KiB a block gets by default, so the host sets the kernel's
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES before launching; src/gpu/cuda_runtime.rs).
//
// Ragged edges. The loader zero-fills what lies past a matrix's rows or columns (cp.async with a
// short src_size), so partial tiles multiply as if padded with zeros; stores are guarded by the
// caller. cp.async needs 16-byte aligned rows: a source whose column count is not a multiple of 8
// (or that is not 16-byte aligned) is loaded with plain loads into the same stages instead.
//
// A kernel file includes common/base.cuh, common/ptx.cuh and common/cp_async_ring.cuh before this
// header (NVRTC resolves a header's own includes only among those already seen).
#pragma once
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"

namespace gemm_pipeline {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kTile = 128;          // output rows and columns per block
constexpr int kTileK = 32;          // reduction depth per stage
constexpr int kStages = 4;          // stages in the ring
constexpr int kWarpRows = 64, kWarpCols = 32;  // a warp's tile: 2 x 4 warps cover the block's
constexpr int kPad = 8;             // bf16 of padding per shared row
constexpr int kRowMajorLd = kTileK + kPad;  // [128][40]: a row per output row, the reduction along it
constexpr int kRedMajorLd = kTile + kPad;   // [32][136]: a row per reduction index
static_assert((kTile / kWarpRows) * (kTile / kWarpCols) == kWarps, "the warps tile the block");

// The first output row and column of this thread's warp within the block's tile.
__device__ __forceinline__ int warp_row() { return (threadIdx.x / 32) / (kTile / kWarpCols) * kWarpRows; }
__device__ __forceinline__ int warp_col() { return (threadIdx.x / 32) % (kTile / kWarpCols) * kWarpCols; }

// Whether a row-major matrix with `cols` columns at `p` can be loaded with 16-byte cp.async.
__device__ __forceinline__ bool rows_aligned(const void* p, int cols) {
  return cols % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Copies rows row0..row0+kRows-1, columns col0..col0+kCols-1 of a row-major [rows, cols] matrix
// into a tile with kLd elements per row; outside the matrix the tile holds zeros. With `async`
// the copies are cp.async (complete after the wait that covers the caller's commit), else plain
// stores (complete now).
template <int kRows, int kCols, int kLd>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int rows, int cols, int row0, int col0,
                                          bool async) {
  constexpr int kChunksPerRow = kCols / 8;
  static_assert((kRows * kChunksPerRow) % kThreads == 0, "every thread copies the same number of chunks");
  if (async) {
    UNROLL
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

// The main loop over `depth` reduction indices in k-tiles of kTileK: load(stage, k0) fills one
// stage with the k-tile starting at k0 (and does not commit), compute(stage) multiplies one; the
// ring of kStages stages is cp_async_ring.cuh's (kStages - 1 k-tiles in flight, one barrier per
// k-tile).
template <class Load, class Compute>
__device__ __forceinline__ void main_loop(int depth, Load load, Compute compute) {
  cp_async_ring<kStages>(
      ceil_div(depth, kTileK), [&](int stage, int t) { load(stage, t * kTileK); },
      [&](int stage, int) { compute(stage); });
}

// Accumulators of a 64 x 32 warp tile: [m16][n8][4] as mma.sync's C fragment.
struct Accumulators {
  float v[kWarpRows / 16][kWarpCols / 8][4];
};
__device__ __forceinline__ void zero(Accumulators& acc) {
  UNROLL
  for (int i = 0; i < kWarpRows / 16; ++i)
    UNROLL
    for (int j = 0; j < kWarpCols / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) acc.v[i][j][e] = 0.0f;
}

// B fragments of the warp's four n8 column tiles for one 16-deep step, from a reduction-major
// [r][j] tile (row r holds B[r][0..]) with ldmatrix.x4.trans, two n8 tiles per instruction:
// matrices (r 0-7, j 0-7), (r 8-15, j 0-7), (r 0-7, j 8-15), (r 8-15, j 8-15); lane l addresses
// row l % 8 of matrix l / 8.
__device__ __forceinline__ void b_fragments_trans(uint32_t (&b)[kWarpCols / 8][2], const bf16* tile, int kk,
                                                  int col0) {
  const int lane = threadIdx.x % 32, q = lane / 8, qr = lane % 8;
  UNROLL
  for (int p = 0; p < kWarpCols / 16; ++p) {
    uint32_t r[4];
    ldmatrix_x4_trans(r, &tile[(kk + (q % 2) * 8 + qr) * kRedMajorLd + col0 + p * 16 + (q / 2) * 8]);
    b[2 * p][0] = r[0];
    b[2 * p][1] = r[1];
    b[2 * p + 1][0] = r[2];
    b[2 * p + 1][1] = r[3];
  }
}

// A fragments of the warp's four m16 row tiles for one 16-deep step, from a row-major [i][r] tile
// (the reduction along the row) with ldmatrix.x4: matrices (i 0-7, r 0-7), (i 8-15, r 0-7),
// (i 0-7, r 8-15), (i 8-15, r 8-15); lane l addresses row l % 16, reduction block l / 16.
__device__ __forceinline__ void a_fragments(uint32_t (&a)[kWarpRows / 16][4], const bf16* tile, int kk, int row0) {
  const int lane = threadIdx.x % 32;
  UNROLL
  for (int i = 0; i < kWarpRows / 16; ++i)
    ldmatrix_x4(a[i], &tile[(row0 + i * 16 + lane % 16) * kRowMajorLd + kk + (lane / 16) * 8]);
}

// A fragments as a_fragments gives them, from a reduction-major [r][i] tile (row r holds A[0..][r])
// with ldmatrix.x4.trans: lane l addresses row (l / 16) * 8 + l % 8 of the step, row block
// (l / 8) % 2.
__device__ __forceinline__ void a_fragments_trans(uint32_t (&a)[kWarpRows / 16][4], const bf16* tile, int kk,
                                                  int row0) {
  const int lane = threadIdx.x % 32, q = lane / 8, qr = lane % 8;
  UNROLL
  for (int i = 0; i < kWarpRows / 16; ++i)
    ldmatrix_x4_trans(a[i], &tile[(kk + (q / 2) * 8 + qr) * kRedMajorLd + row0 + i * 16 + (q % 2) * 8]);
}

// B fragments as b_fragments_trans gives them, from a row-major [j][r] tile (row j holds
// B[0..][j], as W's rows in the forward) with ldmatrix.x4: lane l addresses column
// l % 8 + 8 (l / 16), reduction block (l / 8) % 2.
__device__ __forceinline__ void b_fragments(uint32_t (&b)[kWarpCols / 8][2], const bf16* tile, int kk, int col0) {
  const int lane = threadIdx.x % 32;
  UNROLL
  for (int p = 0; p < kWarpCols / 16; ++p) {
    uint32_t r[4];
    ldmatrix_x4(r, &tile[(col0 + p * 16 + lane % 8 + (lane / 16) * 8) * kRowMajorLd + kk + ((lane / 8) % 2) * 8]);
    b[2 * p][0] = r[0];
    b[2 * p][1] = r[1];
    b[2 * p + 1][0] = r[2];
    b[2 * p + 1][1] = r[3];
  }
}

// The 16 mma.sync of one 16-deep step of the warp tile.
__device__ __forceinline__ void multiply(Accumulators& acc, const uint32_t (&a)[kWarpRows / 16][4],
                                         const uint32_t (&b)[kWarpCols / 8][2]) {
  UNROLL
  for (int i = 0; i < kWarpRows / 16; ++i)
    UNROLL
    for (int j = 0; j < kWarpCols / 8; ++j) mma_m16n8k16_bf16(acc.v[i][j], a[i], b[j], acc.v[i][j]);
}

// Calls f(row, col, value) for every accumulator of the warp tile whose (row, col) falls inside
// [rows, cols], row and col relative to the matrix: lane (g, t) holds rows g and g + 8, columns
// 2t and 2t + 1 of each 16x8 tile.
template <class F>
__device__ __forceinline__ void for_each_output(const Accumulators& acc, int row0, int col0, int rows, int cols, F f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  UNROLL
  for (int i = 0; i < kWarpRows / 16; ++i)
    UNROLL
    for (int j = 0; j < kWarpCols / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + i * 16 + g + (e / 2) * 8;
        const int col = col0 + j * 8 + 2 * t + e % 2;
        if (row < rows && col < cols) f(row, col, acc.v[i][j][e]);
      }
}

}  // namespace gemm_pipeline
