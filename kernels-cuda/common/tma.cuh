// tma.cuh: sm_90's tensor memory accelerator (cp.async.bulk.tensor) and shared-memory barriers
// (mbarrier) as device functions, and the kernel's dynamic shared memory. The GPU build issues
// the PTX named in each comment and exists only where TRIDENT_WGMMA does (sm_90a; see
// wgmma.cuh); the emulation build calls the C++ models of ../emu/tma.h, which document the
// semantics (phases, parity, transaction bytes, out-of-bounds zero fill).
#pragma once
#include "common/wgmma.cuh"

#if defined(TRIDENT_EMU)
#define __grid_constant__
#endif

// CUtensorMap (cuda.h): 128 opaque bytes, 64-byte aligned, made on the host by
// cuTensorMapEncodeTiled and passed to the kernel by value as a `const __grid_constant__`
// parameter, so that its address is the parameter's own (the TMA unit reads it there).
struct __align__(64) TensorMap {
  uint64_t opaque[16];
};

#ifdef TRIDENT_WGMMA
#ifndef TRIDENT_EMU
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
#endif

// The launch's dynamic shared memory (`extern __shared__`); the kernel uses `bytes` of it (the
// launch must give at least that much: the emulation checks). Declared 1024-byte aligned, but
// the CUDA documentation promises less: a kernel that needs the alignment rounds up
// (align_shared_1024) within slack it asks for.
__device__ __forceinline__ unsigned char* dynamic_shared(size_t bytes) {
#ifdef TRIDENT_EMU
  return emu::dynamic_shared(bytes);
#else
  (void)bytes;
  extern __shared__ __align__(1024) unsigned char trident_dynamic_shared[];
  return trident_dynamic_shared;
#endif
}

// The first 1024-byte aligned shared address at or after p (the 128-byte swizzle's period, which
// its tiles must start on). The emulation's shared memory is 1024-byte aligned in host memory,
// so there the host address stands for the shared one.
__device__ __forceinline__ unsigned char* align_shared_1024(unsigned char* p) {
#ifdef TRIDENT_EMU
  const uint32_t address = uint32_t(reinterpret_cast<uintptr_t>(p) % 1024u);
#else
  const uint32_t address = smem_u32(p);
#endif
  return p + (1024u - address % 1024u) % 1024u;
}

// mbarrier.init.shared::cta.b64 [bar], count: phase 0, `count` arrivals expected per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#ifdef TRIDENT_EMU
  emu::mbarrier_init(bar, count);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

// fence.mbarrier_init.release.cluster: the inits above visible to the other threads (and the
// async proxy) before the barrier that follows it.
__device__ __forceinline__ void fence_mbarrier_init() {
#ifndef TRIDENT_EMU
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes: announces `bytes` of copies
// completing on this phase and arrives.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef TRIDENT_EMU
  emu::mbarrier_arrive(bar, bytes);
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

// mbarrier.arrive.shared::cta.b64 _, [bar].
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#ifdef TRIDENT_EMU
  emu::mbarrier_arrive(bar, 0);
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Waits until the phase of parity `parity` has completed: mbarrier.try_wait.parity in a loop.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#ifdef TRIDENT_EMU
  emu::mbarrier_wait(bar, parity);
#else
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
#endif
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes
// [dst], [map, {c0, c1}], [bar]: the box of `map` at coordinates (c0, c1) (c0 the innermost)
// into shared memory at dst (128-byte aligned; 1024 under the 128-byte swizzle), zeros where the
// box leaves the tensor; its bytes complete on `bar`'s current phase.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1, uint64_t* bar) {
#ifdef TRIDENT_EMU
  const int coords[2] = {c0, c1};
  emu::tma_load(dst, map, coords, 2, bar);
#else
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
#endif
}
#endif  // TRIDENT_WGMMA
