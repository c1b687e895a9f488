// gemm_mfma.h: the 64x64 MFMA tile both GEMM files use (gemm_bf16.hip, gemm_bf16_bwd.hip).
//
//   C[i][j] = Σ_r A[i][r] · B[r][j]   for i in i0..i0+63, j in j0..j0+63, r < depth
//
// A and B are bf16 in global memory, each either "reduction-contiguous" (A[i][r] at a[i·lda + r],
// B[r][j] at b[j·ldb + r]) or "output-contiguous" (A[i][r] at a[r·lda + i], B[r][j] at
// b[r·ldb + j]); the template flags pick the layout, so no operand is ever transposed in memory.
// Elements outside rows x depth / depth x cols load as zeros, so any sizes work.
//
// A workgroup of 4 wave64s (256 threads); wave w owns the 32x32 quadrant (32 (w / 2), 32 (w % 2))
// in one MFMA accumulator. Per 32-deep step the workgroup stages A and B as [i][r] and [j][r]
// tiles in LDS (each thread loads 8 + 8 elements, consecutive threads along whichever index is
// contiguous in global memory, so the loads coalesce), then each wave issues 4
// v_mfma_f32_32x32x8bf16_1k, lane l reading its 4 operand elements as one 8-byte run of an LDS row.
// LDS: 2 x 64 x (32 + 8) bf16 = 10 KiB (8 elements of row padding spread the banks).
#pragma once
#include "base.h"
#include "mfma.h"

namespace gemm_mfma {

inline constexpr int kTile = 64, kDepth = 32, kLd = kDepth + 8, kThreads = 256;
static_assert(kThreads == 4 * kWaveSize, "4 waves of kWaveSize lanes per workgroup");
static_assert(sizeof(bf16) * 2 * kTile * kLd <= kLdsBytes, "LDS over the 64 KiB budget");

// One 64 x 32 slab of an operand into lds[x][r] (x = i for A, j for B). kRContig: element (x, r)
// is src[x·ld + r], else src[r·ld + x]. `extent` bounds x, `depth` bounds r.
template <bool kRContig>
__device__ __forceinline__ void load_slab(bf16 (*lds)[kLd], const bf16* src, int ld, int extent, int depth, int x0,
                                          int r0) {
  UNROLL for (int step = 0; step < kTile * kDepth / kThreads; ++step) {
    const int e = threadIdx.x + step * kThreads;
    const int x = kRContig ? e / kDepth : e % kTile, r = kRContig ? e % kDepth : e / kTile;
    const int gx = x0 + x, gr = r0 + r;
    bf16 v{0};
    if (gx < extent && gr < depth) v = kRContig ? src[(size_t)gx * ld + gr] : src[(size_t)gr * ld + gx];
    lds[x][r] = v;
  }
}

// The accumulator of this wave's quadrant (its origin: wave_i, wave_j within the tile).
template <bool kARContig, bool kBRContig>
__device__ __forceinline__ void tile(mfma_acc& acc, const bf16* a, int lda, const bf16* b, int ldb, int rows, int cols,
                                     int depth, int i0, int j0) {
  __shared__ bf16 lds_a[kTile][kLd];
  __shared__ bf16 lds_b[kTile][kLd];
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  const int wave_i = kMfmaM * (wave / 2), wave_j = kMfmaN * (wave % 2);
  mfma_zero(acc);
  for (int r0 = 0; r0 < depth; r0 += kDepth) {
    load_slab<kARContig>(lds_a, a, lda, rows, depth, i0, r0);
    load_slab<kBRContig>(lds_b, b, ldb, cols, depth, j0, r0);
    __syncthreads();
    UNROLL for (int kk = 0; kk < kDepth; kk += kMfmaK) {
      bf16 av[4], bv[4];
      UNROLL for (int j = 0; j < 4; ++j) {
        av[j] = lds_a[wave_i + mfma_col(lane)][kk + mfma_k(lane) + j];  // A[i = l % 32][k]
        bv[j] = lds_b[wave_j + mfma_col(lane)][kk + mfma_k(lane) + j];  // B[k][n = l % 32]
      }
      mfma_32x32x8_bf16(acc, av, bv);
    }
    __syncthreads();  // the slab is consumed before the next one overwrites it
  }
}

// Where accumulator r of this lane lands in the 64x64 tile.
__device__ __forceinline__ int out_row(int r) {
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  return kMfmaM * (wave / 2) + mfma_row(lane, r);
}
__device__ __forceinline__ int out_col() {
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  return kMfmaN * (wave % 2) + mfma_col(lane);
}

}  // namespace gemm_mfma
