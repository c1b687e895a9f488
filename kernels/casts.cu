// casts.cu: element-wise conversions between f32 and bf16, for the master-weight copy, gradient
// buffers and anything else that changes precision between kernels. One source for CUDA and HIP
// (common/portable.h).
//
//   cast_f32_to_bf16:  out[i] = bf16(in[i]), round to nearest even (NaN stays NaN)
//   cast_bf16_to_f32:  out[i] = f32(in[i]), exact
//
// for i < n, any n >= 0. When both pointers are 16-byte aligned each thread moves 8 elements per
// step with 16-byte loads and stores (two of them on the f32 side); the n % 8 elements past the
// last full group, or all of them when a pointer is not aligned, go one at a time. Grid-stride
// loops, so any grid covers any n (the launcher picks about ⌈n/8/256⌉ blocks of 256, capped).
// No shared memory; a handful of registers.
//
// Reference: `Precision::Bf16.round` / `from_bits16` (src/real.rs), the rounding trident uses
// everywhere; tested bit for bit under both emulations (tests/cuda_emulation.rs,
// tests/hip_emulation.rs).
#include "common/portable.h"

extern "C" __global__ void cast_f32_to_bf16(bf16* __restrict__ out, const float* __restrict__ in, int n) {
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(in)) {
    const int groups = n / 8;
    for (int v = first; v < groups; v += stride) {
      const F32x4 lo = reinterpret_cast<const F32x4*>(in)[2 * v], hi = reinterpret_cast<const F32x4*>(in)[2 * v + 1];
      bf16x8 o;
      UNROLL
      for (int e = 0; e < 4; ++e) {
        o.v[e] = to_bf16(lo.v[e]);
        o.v[4 + e] = to_bf16(hi.v[e]);
      }
      reinterpret_cast<bf16x8*>(out)[v] = o;
    }
    scalar_from = groups * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride) out[i] = to_bf16(in[i]);
}

extern "C" __global__ void cast_bf16_to_f32(float* __restrict__ out, const bf16* __restrict__ in, int n) {
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(in)) {
    const int groups = n / 8;
    for (int v = first; v < groups; v += stride) {
      const bf16x8 x = reinterpret_cast<const bf16x8*>(in)[v];
      F32x4 lo, hi;
      UNROLL
      for (int e = 0; e < 4; ++e) {
        lo.v[e] = to_float(x.v[e]);
        hi.v[e] = to_float(x.v[4 + e]);
      }
      reinterpret_cast<F32x4*>(out)[2 * v] = lo;
      reinterpret_cast<F32x4*>(out)[2 * v + 1] = hi;
    }
    scalar_from = groups * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride) out[i] = to_float(in[i]);
}
