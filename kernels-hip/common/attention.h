// attention.h: what attention_fwd.hip and attention_bwd.hip share: the tile shape and the loader
// of head rows from the sequence-first activations into padded LDS tiles.
//
// A workgroup is kWaves wave64s; each wave owns kMfmaN (32) consecutive positions, the column
// dimension of its MFMA accumulators, so a lane's softmax row statistics belong to one position.
#pragma once
#include "common/base.h"
#include "common/mfma.h"

namespace attention_common {

inline constexpr int kWaves = 2, kThreads = kWaves * kWaveSize;
inline constexpr int kBlockRows = kWaves * kMfmaN;  // positions per workgroup (64)
inline constexpr int kTileRows = kMfmaM;            // positions per streamed tile (32)
inline constexpr int kPad = 8;                      // bf16 of padding per LDS row

// Rows row0..row0+ROWS-1 (positions t; rows past seq load as zeros) of one head's D columns,
// starting at column col0 of a [seq·batch, row_stride] activation, into a padded tile (16-byte
// aligned rows). Each thread moves runs of 8 columns: one 16-byte load and LDS store when the
// source rows are 16-byte aligned (always, for buffers from hipMalloc), else 8 scalar loads.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(bf16 (*tile)[D + kPad], const bf16* base, size_t row_stride, size_t col0,
                                          int row0, int seq, int batch, int b) {
  static_assert(D % 8 == 0 && (D + kPad) % 8 == 0, "rows of whole 16-byte runs");
  constexpr int kRuns = D / 8;
  const bool vec = aligned16(base) && row_stride % 8 == 0 && col0 % 8 == 0;
  for (int i = threadIdx.x; i < ROWS * kRuns; i += blockDim.x) {
    const int r = i / kRuns, c = 8 * (i % kRuns), t = row0 + r;
    const bf16* from = base + ((size_t)t * batch + b) * row_stride + col0 + c;
    bf16x8& to = *reinterpret_cast<bf16x8*>(&tile[r][c]);
    if (t < seq && vec) {
      to = *reinterpret_cast<const bf16x8*>(from);  // 16 bytes each way
    } else {
      UNROLL for (int e = 0; e < 8; ++e) to.v[e] = t < seq ? from[e] : bf16{0};
    }
  }
}

// The same rows stored transposed, tile[column][row], for an operand read along positions.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows_transposed(bf16 (*tile)[ROWS + kPad], const bf16* base, size_t row_stride,
                                                     size_t col0, int row0, int seq, int batch, int b) {
  constexpr int kRuns = D / 8;
  const bool vec = aligned16(base) && row_stride % 8 == 0 && col0 % 8 == 0;
  for (int i = threadIdx.x; i < ROWS * kRuns; i += blockDim.x) {
    const int r = i / kRuns, c = 8 * (i % kRuns), t = row0 + r;
    bf16x8 run{};
    if (t < seq) {
      const bf16* from = base + ((size_t)t * batch + b) * row_stride + col0 + c;
      if (vec) {
        run = *reinterpret_cast<const bf16x8*>(from);
      } else {
        UNROLL for (int e = 0; e < 8; ++e) run.v[e] = from[e];
      }
    }
    UNROLL for (int e = 0; e < 8; ++e) tile[c + e][r] = run.v[e];
  }
}

// `x`, the same in every lane of the wave, in an SGPR. The compiler cannot tell that a value
// loaded through a pointer (a document start) is uniform: a loop bound or branch on it would run
// divergent, with exec masks in SGPRs (the _docs_ kernels spilled SGPRs so). Itself under emulation.
__device__ __forceinline__ int wave_uniform(int x) {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_readfirstlane(x);
#else
  return x;
#endif
}

}  // namespace attention_common
