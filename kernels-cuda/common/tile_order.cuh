// tile_order.cuh: which tile a block computes: the GEMMs' grouped order, and causal
// attention's longest-first order (below). Blocks are numbered in launch order
// (blockIdx.x fastest); taken in that order, the plain mapping (row tile blockIdx.y, column tile
// blockIdx.x) runs a wave of blocks across one row of tiles, so each block of the wave streams its
// own column panel of the second operand, and that operand is read from DRAM once per row of tiles.
// At GPT-3's shapes on an H100 (K = 12288, 6 MiB per 256-column panel) a wave of 132 blocks wants
// 800 MiB against an L2 of 50 MiB. Grouped order: consecutive blocks sweep a group of G =
// TRIDENT_GEMM_GROUP_ROWS (8) row tiles down one column before moving to the next, so a wave
// covers about G rows by wave / G columns of tiles and shares both operands' panels in L2 (the second operand
// is then read once per group of rows). The last group holds the rows that remain. The mapping
// is a bijection of the grid onto the tiles; each tile's arithmetic is unchanged, so the results
// are the same bits in any order.
//
// Defining TRIDENT_GEMM_GROUP_ROWS overrides G (the emulation tests build with 2, so their small
// grids hold several groups and a short last one).
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

// Causal attention's blocks, on a grid of (tiles, batch · heads): block (blockIdx.x, blockIdx.y),
// numbered in launch order, takes tile `rank` = number / (batch · heads) of pair (sequence b,
// head) = number % (batch · heads), longest first: `tile` counts from the last tile when
// `last_longest` (the forward and dQ, whose last query tiles see the most keys), else from the
// first (dK / dV, whose first key tiles see the most queries). So every pair's longest tiles are
// dispatched before any shorter one and the grid ends on its shortest blocks, where the plain
// order ended on a mix (a block of the last tile then ran alone at the end). Each block's work
// is unchanged: the same bits in any order.
struct AttentionTile {
  int tile, b, head;
};

__device__ __forceinline__ AttentionTile longest_first(bool last_longest, int heads) {
  const int tiles = (int)gridDim.x, pairs = (int)gridDim.y;
  const int number = (int)blockIdx.y * tiles + (int)blockIdx.x, rank = number / pairs, pair = number % pairs;
  return AttentionTile{last_longest ? tiles - 1 - rank : rank, pair / heads, pair % heads};
}
