// ptx.cuh: the tensor-core, ldmatrix and cp.async instructions as device functions, destination
// operand first. The GPU build issues the PTX instruction named in each comment; the emulation
// build calls its C++ model in ../emu/ptx.h, which documents the fragment layouts.
#pragma once
#include "common/base.cuh"

// d = a * b + c: one warp-wide mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (.f16.f16 in
// the fp16 module: TRIDENT_HALF_PTX, base.cuh). a holds the lane's four .b32 registers of the
// 16x16 16-bit A fragment, b the two of the 16x8 B fragment, c and d the four f32 accumulators.
// d and c may be the same array.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#ifdef TRIDENT_EMU
  emu::mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32." TRIDENT_HALF_PTX "." TRIDENT_HALF_PTX
      ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

#ifndef TRIDENT_EMU
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lanes 8i..8i+7 pass the shared-memory
// address of row 0..7 of matrix i (16 bytes, 16-byte aligned); register i receives the lane's
// fragment of matrix i.
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 1, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 2, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 4, false, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 1, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 2, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef TRIDENT_EMU
  emu::ldmatrix(r, 4, true, row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}

// ex2.approx.ftz.f32: 2^x on the special-function unit (one MUFU.EX2; relative error within
// 2^-22, 2^-inf = +0, results below 2^-126 flushed to +0). The emulation computes std::exp2 in f32 and
// flushes the same way. Softmax kernels fold log2(e) into their scale and call this where expf
// costs eight instructions (range reduction, the MUFU, the scaling).
__device__ __forceinline__ float exp2_approx(float x) {
#ifdef TRIDENT_EMU
  const float y = std::exp2(x);
  return y < 1.17549435e-38f ? 0.0f : y;
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes: copies 16 bytes from global to shared
// memory without staging in registers, zero-filling the bytes past src_bytes (0 <= src_bytes
// <= 16), which is how ragged tile edges load zeros. Both addresses must be 16-byte aligned
// (src need only be a valid address when src_bytes is 0). The copy is complete only after a
// cp_async_wait that covers its commit group, and visible to other threads only after a
// barrier that follows that wait.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
#ifdef TRIDENT_EMU
  emu::cp_async(dst, src, 16, unsigned(src_bytes));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(src_bytes));
#endif
}
// cp.async.ca.shared.global [dst], [src], 4, src_bytes: the same for one 4-byte word (src_bytes
// 0 or 4), for f32 rows whose starts need not be 16-byte aligned (attention's lse and delta).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, int src_bytes) {
#ifdef TRIDENT_EMU
  emu::cp_async(dst, src, 4, unsigned(src_bytes));
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(src_bytes));
#endif
}
// cp.async.commit_group: closes the group of the copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef TRIDENT_EMU
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// cp.async.wait_group N: waits until at most N of the most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef TRIDENT_EMU
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
