// tile_order.cuh: which output tile a GEMM block computes. Blocks are numbered in launch order
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
