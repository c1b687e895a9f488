// base.cuh: what every kernel includes first. It selects the target: nvcc (the GPU build, where
// the instructions of ptx.cuh are inline PTX) or the host C++ compiler with -DTRIDENT_EMU (the
// SIMT emulation of ../emu/, where they are C++ functions with the same fragment layouts), so a
// kernel's .cu source is the same text for both. It also holds the bf16 type and conversions;
// kernels convert through to_float / to_bf16 only, so both builds round the same way
// (round-to-nearest-even).
#pragma once

#ifdef TRIDENT_EMU
#include "../emu/ptx.h"
#else
#include <cuda_bf16.h>
#include <stdint.h>
#endif

#ifdef TRIDENT_EMU
struct bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float to_float(bf16 x) { return emu::bf16_bits_to_float(x.bits); }
__device__ __forceinline__ bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
#else
typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf16(float f) { return __float2bfloat16_rn(f); }
#endif

__device__ __forceinline__ float to_float(float x) { return x; }

// Two floats rounded to bf16 and packed as one .b32 register (lo in the low half): the operand
// format of mma.sync's A and B fragments.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#ifdef TRIDENT_EMU
  return emu::pack_halves(to_bf16(lo).bits, to_bf16(hi).bits);
#else
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
#endif
}
template <class T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) { return f; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float f) { return to_bf16(f); }

// Number of tiles of `tile` covering `n` (the last one ragged).
__host__ __device__ __forceinline__ int ceil_div(int n, int tile) { return (n + tile - 1) / tile; }

#define FULL_WARP_MASK 0xffffffffu

// Full unrolling of a fixed-count loop, so that register arrays indexed by its counter stay in
// registers on the GPU (nvcc otherwise places them in local memory); the host build ignores it.
#ifdef TRIDENT_EMU
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif
