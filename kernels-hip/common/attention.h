// attention.h: what attention_fwd.hip and attention_bwd.hip share: the tile shape and the loader
// of head rows from the sequence-first activations into padded LDS tiles.
//
// A workgroup is kWaves wave64s; each wave owns kMfmaN (32) consecutive positions, the column
// dimension of its MFMA accumulators, so a lane's softmax row statistics belong to one position.
#pragma once
#include "base.h"
#include "mfma.h"

namespace attention_common {

inline constexpr int kWaves = 2, kThreads = kWaves * kWaveSize;
inline constexpr int kBlockRows = kWaves * kMfmaN;  // positions per workgroup (64)
inline constexpr int kTileRows = kMfmaM;            // positions per streamed tile (32)
inline constexpr int kPad = 8;                      // bf16 of padding per LDS row

// Rows row0..row0+ROWS-1 (positions t; rows past seq load as zeros) of one head's D columns,
// starting at column col0 of a [seq·batch, row_stride] activation, into a padded tile.
// Consecutive threads read consecutive columns of a row.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(bf16 (*tile)[D + kPad], const bf16* base, size_t row_stride, size_t col0,
                                          int row0, int seq, int batch, int b) {
  for (int i = threadIdx.x; i < ROWS * D; i += blockDim.x) {
    const int r = i / D, c = i % D, t = row0 + r;
    tile[r][c] = t < seq ? base[((size_t)t * batch + b) * row_stride + col0 + c] : bf16{0};
  }
}

}  // namespace attention_common
