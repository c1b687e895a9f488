// gelu.cu: GPT-2's tanh GELU on its own, forward and backward, for activations the GEMM epilogue
// did not already cover.
//
// Computes   gelu_fwd_bf16:  out[i] = gelu(inp[i])
//            gelu_bwd_bf16:  dinp[i] = dout[i] · gelu'(inp[i])
// over n elements, bf16 in and out, f32 arithmetic (formulas in common/gelu.cuh).
//
// When every pointer starts on 16 bytes each thread takes 8 elements per step with 16-byte loads
// and stores; the n % 8 elements past the last full group, or all of them when a pointer is not
// aligned, go one at a time (the same values either way: the math is per element).
//
// Grid: any 1-D grid of 1-D blocks; grid-stride loops cover n (the launcher picks ⌈n/8/256⌉
// blocks of 256, capped at a few per SM). No shared memory; a few tens of registers.
//
// Reference: `gelu_forward_slice` / `gelu_backward_slice` in src/device/kernels.rs, run in f64
// by the reference device on the same bf16 inputs (tests/cuda_emulation.rs).
#include "common/base.cuh"
#include "common/gelu.cuh"

namespace gelu_detail {

struct __align__(16) Bf16x8 {
  bf16 v[8];
};

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace gelu_detail

extern "C" __global__ void gelu_fwd_bf16(bf16* out, const bf16* inp, int n) {
  using namespace gelu_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(inp)) {
    for (int v = first; v < n / 8; v += stride) {
      const Bf16x8 x = reinterpret_cast<const Bf16x8*>(inp)[v];
      Bf16x8 o;
      UNROLL for (int e = 0; e < 8; ++e) o.v[e] = to_bf16(gelu_tanh(to_float(x.v[e])));
      reinterpret_cast<Bf16x8*>(out)[v] = o;
    }
    scalar_from = n / 8 * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride) out[i] = to_bf16(gelu_tanh(to_float(inp[i])));
}

extern "C" __global__ void gelu_bwd_bf16(bf16* dinp, const bf16* inp, const bf16* dout, int n) {
  using namespace gelu_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    for (int v = first; v < n / 8; v += stride) {
      const Bf16x8 x = reinterpret_cast<const Bf16x8*>(inp)[v], dy = reinterpret_cast<const Bf16x8*>(dout)[v];
      Bf16x8 o;
      UNROLL for (int e = 0; e < 8; ++e) o.v[e] = to_bf16(to_float(dy.v[e]) * gelu_tanh_grad(to_float(x.v[e])));
      reinterpret_cast<Bf16x8*>(dinp)[v] = o;
    }
    scalar_from = n / 8 * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride)
    dinp[i] = to_bf16(to_float(dout[i]) * gelu_tanh_grad(to_float(inp[i])));
}
