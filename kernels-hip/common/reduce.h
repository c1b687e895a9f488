// reduce.h: wave reductions over __shfl_xor butterflies. WaveSize is a template parameter (the
// target's kWaveSize by default): the butterfly starts at WaveSize / 2, so every lane of a
// 64-lane wavefront ends with the same total, summed in the same order on every lane. All lanes
// of the wave must call them.
//
// TRIDENT_PLANT_WAVE32_BUG (tests only): the butterfly starts at 16 whatever the wave size, the
// wave32 assumption a port from CUDA would carry. On wave64 each half-wave then holds only its
// own half's total; tests/hip_emulation.rs builds the kernels with it and asserts that the
// LayerNorm test detects the wrong results.
#pragma once
#include "base.h"

template <int WaveSize = kWaveSize>
__device__ __forceinline__ int wave_first_offset() {
  static_assert(WaveSize == 32 || WaveSize == 64, "a wave has 32 or 64 lanes");
#ifdef TRIDENT_PLANT_WAVE32_BUG
  return 16;
#else
  return WaveSize / 2;
#endif
}

template <int WaveSize = kWaveSize>
__device__ __forceinline__ float wave_sum(float v) {
  for (int offset = wave_first_offset<WaveSize>(); offset > 0; offset >>= 1) v += __shfl_xor(v, offset, WaveSize);
  return v;
}
template <int WaveSize = kWaveSize>
__device__ __forceinline__ float wave_max(float v) {
  for (int offset = wave_first_offset<WaveSize>(); offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor(v, offset, WaveSize));
  return v;
}

// The sum (max) of v over the workgroup (blockDim.x a multiple of WaveSize, at most 1024 threads),
// returned to every thread: wave butterflies, then the wave totals in wave order. `scratch` is
// kMaxWaves floats of LDS; the function ends with a barrier so scratch may be reused at once.
// Every thread of the workgroup must call it.
inline constexpr int kMaxWaves = 1024 / kWaveSize;
template <int WaveSize = kWaveSize>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % WaveSize, wave = threadIdx.x / WaveSize, waves = blockDim.x / WaveSize;
  v = wave_sum<WaveSize>(v);
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  float total = lane < waves ? scratch[lane] : 0.0f;
  total = wave_sum<WaveSize>(total);
  __syncthreads();
  return total;
}
template <int WaveSize = kWaveSize>
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % WaveSize, wave = threadIdx.x / WaveSize, waves = blockDim.x / WaveSize;
  v = wave_max<WaveSize>(v);
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  float total = lane < waves ? scratch[lane] : -INFINITY;
  total = wave_max<WaveSize>(total);
  __syncthreads();
  return total;
}
