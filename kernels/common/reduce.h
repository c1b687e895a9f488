// reduce.h: wave and block reductions, for the kernels of kernels/ and the vendors' attention.
// The wave versions are butterflies over shfl_xor (common/portable.h) that start at half the wave
// (16 on a CUDA warp, 32 on an AMD wavefront), so every lane ends with the same total, summed in
// the same order on every lane, and in the same order in the emulation as on the GPU. All lanes
// of the wave must call them.
//
// TRIDENT_PLANT_WAVE32_BUG (tests only): the butterfly starts at 16 whatever the wave size, the
// wave32 assumption a port from CUDA would carry. On wave64 each half-wave then holds only its
// own half's total; tests/hip_emulation.rs builds the kernels with it and asserts that the
// LayerNorm test detects the wrong results.
#pragma once
#include "common/portable.h"

__device__ __forceinline__ int wave_first_offset() {
  static_assert(kWaveSize == 32 || kWaveSize == 64, "a wave has 32 or 64 lanes");
#ifdef TRIDENT_PLANT_WAVE32_BUG
  return 16;
#else
  return kWaveSize / 2;
#endif
}

__device__ __forceinline__ float wave_sum(float v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) v += shfl_xor(v, offset, kWaveSize);
  return v;
}
__device__ __forceinline__ float wave_max(float v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) v = fmaxf(v, shfl_xor(v, offset, kWaveSize));
  return v;
}

// The sum (max) of v over the block (blockDim.x a multiple of kWaveSize, at most 1024 threads),
// returned to every thread: wave butterflies, then the wave totals in wave order. `scratch` is
// kMaxWaves floats of shared memory (LDS); the function ends with a barrier so the caller may
// reuse scratch at once. Every thread of the block must call it.
inline constexpr int kMaxWaves = 1024 / kWaveSize;
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWaveSize, wave = threadIdx.x / kWaveSize, waves = blockDim.x / kWaveSize;
  v = wave_sum(v);
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  float total = lane < waves ? scratch[lane] : 0.0f;
  total = wave_sum(total);
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWaveSize, wave = threadIdx.x / kWaveSize, waves = blockDim.x / kWaveSize;
  v = wave_max(v);
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  float total = lane < waves ? scratch[lane] : -INFINITY;
  total = wave_max(total);
  __syncthreads();
  return total;
}
