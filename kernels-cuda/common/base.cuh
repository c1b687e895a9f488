// base.cuh: what every kernel includes first. It selects the target: nvcc (the GPU build, where
// the instructions of ptx.cuh are inline PTX) or the host C++ compiler with -DTRIDENT_EMU (the
// SIMT emulation of ../emu/, where they are C++ functions with the same fragment layouts), so a
// kernel's .cu source is the same text for both. It also holds the bf16 type and conversions;
// kernels convert through to_float / to_bf16 only, so both builds round the same way
// (round-to-nearest-even).
//
// A third target is NVRTC (__CUDACC_RTC__, trident's run-time compilation, src/gpu/kernels.rs):
// it has no system or toolkit include path, so neither <cuda_bf16.h>, <stdint.h> nor <math.h>
// (INFINITY) can be included. There bf16 is the same 16-bit struct as under emulation, the
// integer types and INFINITY are defined here, and the conversions are the sm_80 PTX
// instructions cvt.rn.bf16{,x2}.f32 that cuda_bf16.h's __float2bfloat16_rn /
// __floats2bfloat162_rn compile to (same rounding).
#pragma once

#if defined(TRIDENT_EMU)
#include "../emu/ptx.h"
#elif defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned long long uintptr_t;
#define INFINITY __int_as_float(0x7f800000)
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
#elif defined(__CUDACC_RTC__)
struct __align__(2) bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float to_float(bf16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ bf16 to_bf16(float f) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
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
#if defined(TRIDENT_EMU)
  return emu::pack_halves(to_bf16(lo).bits, to_bf16(hi).bits);
#elif defined(__CUDACC_RTC__)
  uint32_t v;  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half, b in the lower
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
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

// `name`, a T&, on the kernel's dynamic shared memory (the launch's shared-memory bytes, which
// must be at least sizeof(T), 16-byte aligned). Both builds check the size: the GPU traps when
// the launch gave less (%dynamic_smem_size), the emulation reports it (emu::dynamic_shared, the
// same buffer tma.cuh's dynamic_shared hands the sm_90a GEMMs).
#ifdef TRIDENT_EMU
#define DYNAMIC_SHARED(T, name) T& name = *reinterpret_cast<T*>(emu::dynamic_shared(sizeof(T)))
#else
#define DYNAMIC_SHARED(T, name)                                              \
  extern __shared__ __align__(16) unsigned char trident_dynamic_shared[];    \
  if (dynamic_shared_bytes() < sizeof(T)) __trap();                          \
  T& name = *reinterpret_cast<T*>(trident_dynamic_shared)
__device__ __forceinline__ uint32_t dynamic_shared_bytes() {
  uint32_t bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}
#endif

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
