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
// tiles in LDS (each thread loads a run of 8 + 8 elements along whichever index is contiguous in
// global memory, one 16-byte load each when the rows are 16-byte aligned, so the loads coalesce),
// then each wave issues 4
// v_mfma_f32_32x32x8bf16_1k, lane l reading its 4 operand elements as one 8-byte run of an LDS row.
// LDS: 2 x 64 x (32 + 8) bf16 = 10 KiB (8 elements of row padding spread the banks).
#pragma once
#include "common/base.h"
#include "common/mfma.h"

namespace gemm_mfma {

inline constexpr int kTile = 64, kDepth = 32, kLd = kDepth + 8, kThreads = 256;
static_assert(kThreads == 4 * kWaveSize, "4 waves of kWaveSize lanes per workgroup");

struct alignas(16) Slabs {
  bf16 a[kTile][kLd];
  bf16 b[kTile][kLd];
};
static_assert(kLd % 8 == 0, "LDS rows of whole 16-byte runs");
static_assert(sizeof(Slabs) <= kLdsBytes, "LDS over the 64 KiB budget");

// One 64 x 32 slab of an operand into lds[x][r] (x = i for A, j for B). kRContig: element (x, r)
// is src[x·ld + r], else src[r·ld + x]. `extent` bounds x, `depth` bounds r. Each thread moves
// one run of 8 elements along the contiguous index: a 16-byte load when `vec` (the source and its
// rows 16-byte aligned) and the run lies inside the matrix, else 8 guarded scalar loads.
template <bool kRContig>
__device__ __forceinline__ void load_slab(bf16 (*lds)[kLd], const bf16* src, int ld, int extent, int depth, int x0,
                                          int r0, bool vec) {
  static_assert(kTile * kDepth == 8 * kThreads, "one run of 8 per thread");
  constexpr int kRuns = kRContig ? kDepth / 8 : kTile / 8;  // runs per line of the contiguous index
  const int line = threadIdx.x / kRuns, first = 8 * (threadIdx.x % kRuns);
  const int x = kRContig ? line : first, r = kRContig ? first : line;  // the run's first element
  const int gx = x0 + x, gr = r0 + r;
  const int line_ok = kRContig ? gx < extent : gr < depth;  // the run's line exists
  const int run_left = kRContig ? depth - gr : extent - gx;  // elements of the line from the run on
  const bf16* from = kRContig ? src + (size_t)gx * ld + gr : src + (size_t)gr * ld + gx;
  if (kRContig && vec && line_ok && run_left >= 8) {  // straight through, 16 bytes each way
    *reinterpret_cast<bf16x8*>(&lds[x][r]) = *reinterpret_cast<const bf16x8*>(from);
    return;
  }
  bf16x8 run;
  if (vec && line_ok && run_left >= 8) {
    run = *reinterpret_cast<const bf16x8*>(from);
  } else {
    UNROLL for (int e = 0; e < 8; ++e) run.v[e] = line_ok && e < run_left ? from[e] : bf16{0};
  }
  if (kRContig) {
    *reinterpret_cast<bf16x8*>(&lds[x][r]) = run;
  } else {
    UNROLL for (int e = 0; e < 8; ++e) lds[x + e][r] = run.v[e];
  }
}

// The accumulator of this wave's quadrant (its origin: wave_i, wave_j within the tile).
template <bool kARContig, bool kBRContig>
__device__ __forceinline__ void tile(mfma_acc& acc, const bf16* a, int lda, const bf16* b, int ldb, int rows, int cols,
                                     int depth, int i0, int j0) {
  __shared__ Slabs lds;
  auto& lds_a = lds.a;
  auto& lds_b = lds.b;
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  const int wave_i = kMfmaM * (wave / 2), wave_j = kMfmaN * (wave % 2);
  const bool a_vec = aligned16(a) && lda % 8 == 0, b_vec = aligned16(b) && ldb % 8 == 0;
  mfma_zero(acc);
  for (int r0 = 0; r0 < depth; r0 += kDepth) {
    load_slab<kARContig>(lds_a, a, lda, rows, depth, i0, r0, a_vec);
    load_slab<kBRContig>(lds_b, b, ldb, cols, depth, j0, r0, b_vec);
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
