// reduce.cuh: warp and block reductions. The warp versions are butterflies over __shfl_xor_sync,
// so every lane ends with the same total, summed in the same order on every lane (and the same
// order in the emulation as on the GPU). All lanes of the warp must call them.
#pragma once
#include "base.cuh"

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_WARP_MASK, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_WARP_MASK, v, offset));
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024 threads), returned to
// every thread. `scratch` is 32 floats of shared memory; the function ends with a barrier so the
// caller may reuse scratch for the next reduction. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : -INFINITY;
  total = warp_max(total);
  __syncthreads();
  return total;
}
