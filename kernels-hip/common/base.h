// base.h: what every HIP kernel includes first. It selects the target: hipcc or hipRTC (the GPU
// builds) or the host C++ compiler with -DTRIDENT_EMU (the SIMT emulation of ../emu/hip.h, 64-lane
// wavefronts), so a kernel's .hip source is the same text for both. It holds the bf16 type and
// its conversions (round-to-nearest-even, bit for bit the same in both builds, and the same as
// kernels-cuda/common/base.cuh), the wave size, and the LDS budget.
//
// Wave size. kWaveSize is the target's wavefront: 64 on CDNA (gfx90a, gfx942) and under the
// emulation. Reductions and lane arithmetic take it as a template parameter (WaveSize) and
// never spell 32 or 64, so a wave32 assumption is a visible, testable choice (see
// tests/hip_emulation.rs, the planted wave32 bug).
//
// LDS. A workgroup may use at most 64 KiB of LDS on gfx90a and gfx942 (kLdsBytes); every kernel
// states its use in its header and static_asserts it against this budget.
#pragma once

#if defined(TRIDENT_EMU)
#include "../emu/hip.h"
#elif defined(__HIPCC_RTC__)
// hipRTC (the run-time compile): hip_runtime is built in and there is no <stdint.h> or <math.h>
// (ROCm 5 declares only the 64-bit integer types), so the narrower ones, uintptr_t (the
// compiler's own type) and INFINITY are declared here (an identical repeated typedef is legal).
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef __UINTPTR_TYPE__ uintptr_t;
#ifndef INFINITY
#define INFINITY __builtin_huge_valf()
#endif
#else
#include <hip/hip_runtime.h>
#include <stdint.h>
#endif

#ifndef INFINITY  // hipRTC has no <math.h> macros
#define INFINITY __builtin_huge_valf()
#endif

#ifdef TRIDENT_EMU
inline constexpr int kWaveSize = TRIDENT_EMU_WAVE_SIZE;
#else
inline constexpr int kWaveSize = __AMDGCN_WAVEFRONT_SIZE;
#endif
inline constexpr unsigned kLdsBytes = 64 * 1024;

// bf16 as its bit pattern on both targets (HIP 5.2's hip_bfloat16 is a host/device class with
// its own rounding rules; the bit pattern keeps both builds identical).
struct bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float to_float(bf16 x) {
  const uint32_t u = uint32_t(x.bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
__device__ __forceinline__ bf16 to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

__device__ __forceinline__ float to_float(float x) { return x; }

// Eight bf16 moved as one 16-byte load or store (global_load_dwordx4, ds_write_b128).
struct alignas(16) bf16x8 {
  bf16 v[8];
};
__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<__UINTPTR_TYPE__>(p) % 16 == 0; }  // no uintptr_t under hipRTC
template <class T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) { return f; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float f) { return to_bf16(f); }

// Number of tiles of `tile` covering `n` (the last one ragged).
__host__ __device__ __forceinline__ int ceil_div(int n, int tile) { return (n + tile - 1) / tile; }

#ifdef TRIDENT_EMU
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif
