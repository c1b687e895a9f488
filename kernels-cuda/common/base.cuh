// base.cuh: what every kernel includes first. It selects the target: nvcc (the GPU build, where
// the instructions of ptx.cuh are inline PTX) or the host C++ compiler with -DTRIDENT_EMU (the
// SIMT emulation of ../emu/, where they are C++ functions with the same fragment layouts), so a
// kernel's .cu source is the same text for both. It also holds the 16-bit storage type and its
// conversions; kernels convert through to_float / to_bf16 only, so both builds round the same way
// (round-to-nearest-even).
//
// The storage type is a compile-time choice of the module. By default it is bfloat16 (the bf16
// module). Compiled with -DTRIDENT_FP16 (the fp16 module, `--fp16`: src/gpu/kernels/cuda.rs's
// `Storage::F16` adds it to NVRTC's and nvcc's options, the emulation's builds pass it too) the
// same sources store IEEE binary16 (10 mantissa bits, largest finite 65504, overflow rounds to
// infinity) and the tensor-core instructions read .f16 operands (TRIDENT_HALF_PTX names the type
// in their PTX). The names stay: in a kernel, `bf16`, `to_bf16`, `pack_bf16x2` and the `_bf16` of
// a function's name mean the module's 16-bit storage type; nothing else in the kernels depends on
// which one it is (f32 accumulation and statistics are the same in both).
//
// A third target is NVRTC (__CUDACC_RTC__, trident's run-time compilation, src/gpu/kernels.rs):
// it has no system or toolkit include path, so neither <cuda_bf16.h>, <cuda_fp16.h>, <stdint.h>
// nor <math.h> (INFINITY) can be included. There the storage type is the same 16-bit struct as
// under emulation, the integer types and INFINITY are defined here, and the conversions are the
// sm_80 PTX instructions cvt.rn.bf16{,x2}.f32 (fp16: cvt.rn.f16{,x2}.f32, cvt.f32.f16) that
// cuda_bf16.h's __float2bfloat16_rn / __floats2bfloat162_rn (cuda_fp16.h's __float2half_rn /
// __floats2half2_rn) compile to (same rounding).
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
#elif defined(TRIDENT_FP16)
#include <cuda_fp16.h>
#include <stdint.h>
#else
#include <cuda_bf16.h>
#include <stdint.h>
#endif

// The fp16 module's mark: a symbol its images hold and the bf16 module's do not, by which the
// emulating driver (tests/gpu/emu_libcuda.cpp, built for one storage type) refuses a module of
// the other one.
#if defined(TRIDENT_FP16) && !defined(TRIDENT_EMU)
extern "C" __device__ int trident_storage_fp16;
__device__ int trident_storage_fp16 = 1;
#endif

// The PTX name of the storage type, for the mma / wgmma instruction strings of ptx.cuh and
// wgmma.cuh.
#ifdef TRIDENT_FP16
#define TRIDENT_HALF_PTX "f16"
#else
#define TRIDENT_HALF_PTX "bf16"
#endif

#if defined(TRIDENT_EMU) && defined(TRIDENT_FP16)
struct bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float to_float(bf16 x) { return emu::f16_bits_to_float(x.bits); }
__device__ __forceinline__ bf16 to_bf16(float f) { return bf16{emu::float_to_f16_bits(f)}; }
#elif defined(TRIDENT_EMU)
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
#elif defined(__CUDACC_RTC__) && defined(TRIDENT_FP16)
struct __align__(2) bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float to_float(bf16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ bf16 to_bf16(float f) {
  bf16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
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
#elif defined(TRIDENT_FP16)
typedef __half bf16;
__device__ __forceinline__ float to_float(bf16 x) { return __half2float(x); }
__device__ __forceinline__ bf16 to_bf16(float f) { return __float2half_rn(f); }
#else
typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf16(float f) { return __float2bfloat16_rn(f); }
#endif

__device__ __forceinline__ float to_float(float x) { return x; }

// The warp: 32 lanes on every NVIDIA GPU. kWaveSize is the name the portable kernels of
// kernels/ use for it (kernels-hip/common/base.h's is an AMD wavefront's 64).
inline constexpr int kWaveSize = 32;

// Eight 16-bit values moved as one 16-byte load or store.
struct __align__(16) bf16x8 {
  bf16 v[8];
};
__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Two floats rounded to the storage type and packed as one .b32 register (lo in the low half):
// the operand format of mma.sync's A and B fragments.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(TRIDENT_EMU)
  return emu::pack_halves(to_bf16(lo).bits, to_bf16(hi).bits);
#elif defined(__CUDACC_RTC__) && defined(TRIDENT_FP16)
  uint32_t v;  // as below: cvt.rn.f16x2.f32 d, a, b puts a in the upper half, b in the lower
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
#elif defined(__CUDACC_RTC__)
  uint32_t v;  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half, b in the lower
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
#elif defined(TRIDENT_FP16)
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
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
