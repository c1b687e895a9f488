// wgmma.cuh: sm_90a's warpgroup matrix-multiply instructions as device functions, destination
// operand first. The GPU build issues the PTX named in each comment and exists only where the
// instructions do: __CUDA_ARCH__ >= 900 with the arch-specific feature set (sm_90a, which defines
// __CUDA_ARCH_FEAT_SM90_ALL); elsewhere TRIDENT_WGMMA is undefined and a kernel built on these
// must not be launched (gemm_bf16_sm90.cu's kernels trap). The emulation build calls the C++ models of
// ../emu/wgmma.h, which document the descriptor and accumulator layouts.
#pragma once
#include "common/base.cuh"

#if defined(TRIDENT_EMU)
#include "../emu/wgmma.h"
#define TRIDENT_WGMMA 1
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TRIDENT_WGMMA 1
#endif

// Names the kernel's shared memory for the descriptors' addresses: a no-op on the GPU (they are
// real shared addresses there); under emulation the start of the window offsets are taken from.
__device__ __forceinline__ void wgmma_shared_window(const void* base, size_t bytes) {
#ifdef TRIDENT_EMU
  emu::wgmma_shared_window(base, bytes);
#else
  (void)base;
  (void)bytes;
#endif
}

// The 64-bit shared-memory matrix descriptor for the 128-byte swizzle layout (the one TMA's
// CU_TENSOR_MAP_SWIZZLE_128B writes): start address >> 4 in bits 0-13, leading-dimension byte
// offset >> 4 in bits 16-29, stride-dimension byte offset >> 4 in bits 32-45, base offset (bits
// 49-51) zero, layout type 1 (128-byte swizzle) in bits 62-63. What LBO and SBO step between, per
// operand major-ness, is in ../emu/wgmma.h; the start must lie in the first 128-byte row of a
// 1024-byte aligned swizzle atom (so the base offset is zero), and all three are multiples of 16.
__device__ __forceinline__ uint64_t wgmma_descriptor_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
#ifdef TRIDENT_EMU
  const uint32_t address = emu::wgmma_shared_offset(smem);
#else
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
#endif
  return uint64_t((address & 0x3ffffu) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3fffu) << 32) | (uint64_t(1) << 62);
}

// fence.proxy.async.shared::cta: this thread's ordinary writes to shared memory become visible
// to the async proxy that wgmma reads its operands through. Issue after filling a tile and
// before the barrier that precedes the wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(TRIDENT_WGMMA) && !defined(TRIDENT_EMU)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// wgmma.fence.sync.aligned: orders this warpgroup's register accesses to the accumulators before
// the wgmma.mma_async that follow.
__device__ __forceinline__ void wgmma_fence() {
#ifdef TRIDENT_EMU
  emu::wgmma_fence();
#elif defined(TRIDENT_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.commit_group.sync.aligned: closes the group of the mma_async issued since the last one.
__device__ __forceinline__ void wgmma_commit() {
#ifdef TRIDENT_EMU
  emu::wgmma_commit();
#elif defined(TRIDENT_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.wait_group.sync.aligned N: waits until at most N of the latest groups are in flight; only
// then may the accumulators be read and the operand tiles be overwritten.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef TRIDENT_EMU
  emu::wgmma_wait(N);
#elif defined(TRIDENT_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// d = A · B + (scale_d ? d : 0), one warpgroup-wide
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (N 128 or 256; .f16.f16 in the fp16
// module, TRIDENT_HALF_PTX of base.cuh) with A (64x16) and B (16xN)
// both read from shared memory through descriptors: K-major when kTransA / kTransB is 0,
// MN-major (the instruction's imm-trans-a / imm-trans-b = 1) when 1 (layouts in
// ../emu/wgmma.h). d is the thread's N / 2 f32 accumulators in the m64nNk16 fragment layout.
template <int N, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 128 || N == 256, "the shapes the kernels use");
#ifdef TRIDENT_EMU
  emu::wgmma_bf16(N, d, desc_a, desc_b, scale_d, kTransA, kTransB);
#elif defined(TRIDENT_WGMMA)
  if constexpr (N == 128) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TRIDENT_HALF_PTX "." TRIDENT_HALF_PTX " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TRIDENT_HALF_PTX "." TRIDENT_HALF_PTX " "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, "
        "%128, %129, p, 1, 1, %131, %132;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  }
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
#endif
}
