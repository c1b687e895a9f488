// casts.hip: element-wise conversions between f32 and bf16 (the CDNA counterpart of
// kernels-cuda/casts.cu, same kernel names and arguments).
//
//   cast_f32_to_bf16:  out[i] = bf16(in[i]), round to nearest even (NaN stays NaN)
//   cast_bf16_to_f32:  out[i] = f32(in[i]), exact
//
// for i < n, any n >= 0. When both pointers are 16-byte aligned each thread moves 8 elements per
// step with 16-byte loads and stores (two of them on the f32 side: global_load_dwordx4); the
// n % 8 elements past the last full group, or all of them when a pointer is not aligned, go one
// at a time. Grid-stride loops, so any grid covers any n (about ⌈n/8/256⌉ workgroups of 256 =
// 4 wave64s, capped). No LDS; a handful of VGPRs.
//
// Reference: `Precision::Bf16.round` / `from_bits16` (src/real.rs), bit for bit, under the wave64
// emulation (tests/hip_emulation.rs).
#include "common/base.h"

namespace casts_detail {

struct alignas(16) F32x4 {
  float v[4];
};
using Bf16x8 = bf16x8;

}  // namespace casts_detail

extern "C" __global__ void cast_f32_to_bf16(bf16* __restrict__ out, const float* __restrict__ in, int n) {
  using namespace casts_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(in)) {
    const int groups = n / 8;
    for (int v = first; v < groups; v += stride) {
      const F32x4 lo = reinterpret_cast<const F32x4*>(in)[2 * v], hi = reinterpret_cast<const F32x4*>(in)[2 * v + 1];
      Bf16x8 o;
      UNROLL for (int e = 0; e < 4; ++e) {
        o.v[e] = to_bf16(lo.v[e]);
        o.v[4 + e] = to_bf16(hi.v[e]);
      }
      reinterpret_cast<Bf16x8*>(out)[v] = o;
    }
    scalar_from = groups * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride) out[i] = to_bf16(in[i]);
}

extern "C" __global__ void cast_bf16_to_f32(float* __restrict__ out, const bf16* __restrict__ in, int n) {
  using namespace casts_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(in)) {
    const int groups = n / 8;
    for (int v = first; v < groups; v += stride) {
      const Bf16x8 x = reinterpret_cast<const Bf16x8*>(in)[v];
      F32x4 lo, hi;
      UNROLL for (int e = 0; e < 4; ++e) {
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
