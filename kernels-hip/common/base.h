// base.h: what every HIP kernel includes first. It selects the target: hipcc or hipRTC (the GPU
// builds) or the host C++ compiler with -DTRIDENT_EMU (the SIMT emulation of ../emu/hip.h, 64-lane
// wavefronts), so a kernel's .hip source is the same text for both. It holds the 16-bit storage
// type and its conversions (round-to-nearest-even, bit for bit the same in both builds, and the
// same as kernels-cuda/common/base.cuh), the wave size, and the LDS budget.
//
// The storage type is a compile-time choice of the module, as on CUDA. By default it is bfloat16
// (the bf16 module). Compiled with -DTRIDENT_FP16 (the fp16 module, `--fp16`:
// src/gpu/kernels/hip.rs adds it to hipRTC's and hipcc's options for `Storage::F16`, the
// emulation's builds pass it too) the same sources store IEEE binary16 (10 mantissa bits, largest
// finite 65504, overflow rounds to infinity, subnormals kept) and the MFMA reads f16 operands
// (mfma.h). The names stay: in a kernel, `bf16`, `to_bf16`, `bf16x8` and the `_bf16` of a
// function's name mean the module's 16-bit storage type; nothing else in the kernels depends on
// which one it is (f32 accumulation and statistics are the same in both).
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

// The fp16 module's mark: a symbol its code objects hold and the bf16 module's do not, by which
// the emulating runtime (tests/gpu/emu_libamdhip64.cpp, built for one storage type) refuses a
// module of the other one.
#if defined(TRIDENT_FP16) && !defined(TRIDENT_EMU)
extern "C" __device__ __attribute__((used)) int trident_storage_fp16 = 1;
#endif

// The storage type as its bit pattern on every target (HIP 5.2's hip_bfloat16 and __half are
// host/device classes with their own rules; the bit pattern keeps the builds identical).
struct bf16 {
  uint16_t bits;
};
#if defined(TRIDENT_FP16) && defined(TRIDENT_EMU)
__device__ __forceinline__ float to_float(bf16 x) { return emu::f16_bits_to_float(x.bits); }
__device__ __forceinline__ bf16 to_bf16(float f) { return bf16{emu::float_to_f16_bits(f)}; }
#elif defined(TRIDENT_FP16)
// The compiler's _Float16 conversions: v_cvt_f32_f16 (exact) and v_cvt_f16_f32 (the default
// round-to-nearest-even mode, overflow to infinity, f16 subnormals kept: gfx9's default
// FP16 denormal mode), what emu::float_to_f16_bits models.
__device__ __forceinline__ float to_float(bf16 x) {
  _Float16 h;
  __builtin_memcpy(&h, &x.bits, 2);
  return float(h);
}
__device__ __forceinline__ bf16 to_bf16(float f) {
  const _Float16 h = _Float16(f);
  bf16 r;
  __builtin_memcpy(&r.bits, &h, 2);
  return r;
}
#else
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
#endif

__device__ __forceinline__ float to_float(float x) { return x; }

// Eight 16-bit values moved as one 16-byte load or store (global_load_dwordx4, ds_write_b128).
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
