// tile_order.h: which tile a workgroup computes: the GEMMs' grouped order (TRIDENT_GEMM_GROUP_ROWS
// rows of tiles at a time, 8 unless defined) and causal attention's longest-first order, the
// order and text of kernels-cuda/common/tile_order.cuh (the reasons are written there). On an
// MI250X GCD (L2 8 MiB) a wave of 110 workgroups in the plain order streamed 110 column panels of
// 1.5 MiB at GPT-3's K = 12288.
#pragma once

#ifndef TRIDENT_GEMM_GROUP_ROWS
#define TRIDENT_GEMM_GROUP_ROWS 8
#endif

struct TileIndex {
  int row, col;  // in tiles: the block's output tile is rows row·tile_rows.., columns col·tile_cols..
};

__device__ __forceinline__ TileIndex grouped_tile() {
  const int cols = (int)gridDim.x, rows = (int)gridDim.y, group_rows = TRIDENT_GEMM_GROUP_ROWS;
  const int linear = (int)blockIdx.y * cols + (int)blockIdx.x;
  const int per_group = group_rows * cols, group = linear / per_group, first = group * group_rows;
  const int height = rows - first < group_rows ? rows - first : group_rows;
  const int at = linear - group * per_group;
  return TileIndex{first + at % height, at / height};
}

// Causal attention: tile `tile` of pair (b, head), every pair's longest tiles first.
struct AttentionTile {
  int tile, b, head;
};

__device__ __forceinline__ AttentionTile longest_first(bool last_longest, int heads) {
  const int tiles = (int)gridDim.x, pairs = (int)gridDim.y;
  const int number = (int)blockIdx.y * tiles + (int)blockIdx.x, rank = number / pairs, pair = number % pairs;
  return AttentionTile{last_longest ? tiles - 1 - rank : rank, pair / heads, pair % heads};
}
