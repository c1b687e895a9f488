// cp_async_ring.cuh: a sequence of tiles streamed through a ring of shared-memory stages with
// cp.async, so that later tiles load while the current one is computed on. The sm_80 GEMMs
// (gemm_pipeline.cuh, 4 stages of k-tiles) and the attention kernels (attention_fwd.cu,
// attention_bwd.cu, 2 stages of K/V or Q/dO tiles) run their main loops on it; cp_async_rows
// and load_words (below) issue the attention kernels' row-tile and per-row copies.
//
// A kernel file includes common/base.cuh and common/ptx.cuh before this header (NVRTC resolves a
// header's own includes only among those already seen).
#pragma once
#include "common/base.cuh"
#include "common/ptx.cuh"

// Runs compute(stage, t) for t = 0 .. tiles-1, tile t having been loaded into stage t % kStages
// by load(stage, t) (which issues cp.async copies by every thread of the block and does not
// commit). Tiles 0..kStages-2 are issued first, one commit group each; at tile t the wait leaves
// at most kStages-2 groups in flight, so tile t's group has landed, and the barrier after it makes
// every thread's copies visible and tells that every warp is done with tile t-1, whose stage is
// then refilled with tile t+kStages-1 while tile t is computed on. One group is committed per
// tile, empty ones included, so the count holds at the end; copies a kernel issues before the
// ring (without committing) join tile 0's group. One barrier per tile, kStages-1 tiles in flight
// during compute. Every thread of the block calls this with the same `tiles`.
template <int kStages, class Load, class Compute>
__device__ __forceinline__ void cp_async_ring(int tiles, Load load, Compute compute) {
  static_assert(kStages >= 2, "a ring of one stage cannot overlap a load with the math");
  UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load(s, s);
    cp_async_commit();
  }
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = t + kStages - 1;
    if (next < tiles) load(next % kStages, next);
    cp_async_commit();
    compute(t % kStages, t);
  }
}

// Rows row0..row0+ROWS-1 of D bf16 columns (sequence positions; rows past seq load as zeros)
// into a [ROWS][D + 8] tile, by the block's THREADS threads: `src` is the columns' start at
// position 0, `pos_stride` the elements from one position to the next. Thread i copies the 16
// bytes at column (i % (D/8))·8 of rows i / (D/8) + n·(THREADS / (D/8)): a fixed count,
// unrolled, one 64-bit multiply-add of address per copy. Issues the copies, does not commit (the
// attention kernels' tiles, loaded inside cp_async_ring).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void cp_async_rows(bf16 (*tile)[D + 8], const bf16* src, size_t pos_stride, int row0,
                                              int seq) {
  constexpr int chunks = D / 8, rows_per_pass = THREADS / chunks;
  static_assert(THREADS % chunks == 0 && ROWS % rows_per_pass == 0, "whole passes of the block");
  const int r0 = threadIdx.x / chunks, c = (threadIdx.x % chunks) * 8;
  UNROLL
  for (int pass = 0; pass < ROWS / rows_per_pass; ++pass) {
    const int r = r0 + pass * rows_per_pass, t = row0 + r;
    cp_async_16(&tile[r][c], t < seq ? src + (size_t)t * pos_stride + c : src, t < seq ? 16 : 0);
  }
}

// Entries row0..row0+N-1 of a row of 4-byte values (f32 or int; zeros past seq) into shared
// memory, by threads first..first+N-1 of the block: one 4-byte cp.async each (the row's start
// need not be 16-byte aligned).
template <int N, class T>
__device__ __forceinline__ void load_words(T* dst, const T* src, int row0, int seq, int first) {
  static_assert(sizeof(T) == 4, "4-byte copies");
  const int i = threadIdx.x - first, t = row0 + i;
  if (i >= 0 && i < N) cp_async_4(&dst[i], t < seq ? src + t : src, t < seq ? 4 : 0);
}
