// gelu.cu: GELU on its own, forward and backward (GPT-2's tanh form, or with erf != 0 the exact
// erf form), for activations the GEMM epilogue did not already cover; and Llama's SwiGLU (below), the same element-wise scheme. One source for
// CUDA and HIP (common/portable.h).
//
// Computes   gelu_fwd_bf16:  out[i] = gelu(inp[i])
//            gelu_bwd_bf16:  dinp[i] = dout[i] · gelu'(inp[i])
// over n elements, bf16 in and out, f32 arithmetic (formulas in common/gelu.h).
//
// When every pointer starts on 16 bytes each thread takes 8 elements per step with 16-byte loads
// and stores; the n % 8 elements past the last full group, or all of them when a pointer is not
// aligned, go one at a time (the same values either way: the math is per element).
//
// Grid: any 1-D grid of 1-D blocks (workgroups); grid-stride loops cover n (the launcher picks
// ⌈n/8/256⌉ blocks of 256, capped at a few per SM or CU). No shared memory; a few tens of
// registers.
//
// SwiGLU over rows of 2f values, the gate's f then the up projection's f, silu(a) = a · sigmoid(a):
//   swiglu_fwd_bf16:  out[r, i] = silu(inp[r, i]) · inp[r, f + i]                 (out [rows, f])
//   swiglu_bwd_bf16:  dinp[r, i] = dout[r, i] · inp[r, f + i] · silu'(inp[r, i]),
//                     dinp[r, f + i] = dout[r, i] · silu(inp[r, i])        (dinp [rows, 2f], overwritten)
// 16-bit in and out, f32 arithmetic; element i of out stands for (r, c) = (i / f, i % f). When
// f % 8 == 0 and every pointer starts on 16 bytes, a thread takes 8 consecutive c of one row
// (16-byte accesses of gate, up and out); otherwise one element at a time. Same grid as GELU's,
// over rows · f elements.
//
// Reference: `gelu_forward_slice` / `gelu_backward_slice` in src/device/kernels.rs, run in f64
// by the reference device on the same bf16 inputs (tests/cuda_emulation.rs, tests/hip_emulation.rs);
// SwiGLU: `swiglu_forward_rows` / `swiglu_backward_rows` in src/device/llama.rs (`check ops`).
#include "common/portable.h"
#include "common/gelu.h"

extern "C" __global__ void gelu_fwd_bf16(bf16* out, const bf16* inp, int n, int erf) {
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(out) && aligned16(inp)) {
    for (int v = first; v < n / 8; v += stride) {
      const bf16x8 x = reinterpret_cast<const bf16x8*>(inp)[v];
      bf16x8 o;
      UNROLL for (int e = 0; e < 8; ++e) o.v[e] = to_bf16(gelu_of(to_float(x.v[e]), erf));
      reinterpret_cast<bf16x8*>(out)[v] = o;
    }
    scalar_from = n / 8 * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride) out[i] = to_bf16(gelu_of(to_float(inp[i]), erf));
}

extern "C" __global__ void gelu_bwd_bf16(bf16* dinp, const bf16* inp, const bf16* dout, int n, int erf) {
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  int scalar_from = 0;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    for (int v = first; v < n / 8; v += stride) {
      const bf16x8 x = reinterpret_cast<const bf16x8*>(inp)[v], dy = reinterpret_cast<const bf16x8*>(dout)[v];
      bf16x8 o;
      UNROLL for (int e = 0; e < 8; ++e) o.v[e] = to_bf16(to_float(dy.v[e]) * gelu_grad_of(to_float(x.v[e]), erf));
      reinterpret_cast<bf16x8*>(dinp)[v] = o;
    }
    scalar_from = n / 8 * 8;
  }
  for (int i = scalar_from + first; i < n; i += stride)
    dinp[i] = to_bf16(to_float(dout[i]) * gelu_grad_of(to_float(inp[i]), erf));
}

namespace gelu_detail {

// silu(a) and silu'(a) = sigmoid(a) · (1 + a · (1 - sigmoid(a))), src/device/llama.rs's formulas.
__device__ __forceinline__ void silu_and_grad(float a, float& silu, float& grad) {
  const float sig = 1.0f / (1.0f + expf(-a));
  silu = a * sig;
  grad = sig * (1.0f + a * (1.0f - sig));
}

}  // namespace gelu_detail

extern "C" __global__ void swiglu_fwd_bf16(bf16* out, const bf16* inp, int rows, int f) {
  using namespace gelu_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = rows * f;
  if (f % 8 == 0 && aligned16(out) && aligned16(inp)) {
    for (int v = first; v < n / 8; v += stride) {
      const int r = 8 * v / f, c = 8 * v % f;
      const bf16x8 g = *reinterpret_cast<const bf16x8*>(inp + (size_t)r * 2 * f + c);
      const bf16x8 u = *reinterpret_cast<const bf16x8*>(inp + (size_t)r * 2 * f + f + c);
      bf16x8 o;
      UNROLL for (int e = 0; e < 8; ++e) {
        float s, d;
        silu_and_grad(to_float(g.v[e]), s, d);
        o.v[e] = to_bf16(s * to_float(u.v[e]));
      }
      reinterpret_cast<bf16x8*>(out)[v] = o;
    }
    return;
  }
  for (int i = first; i < n; i += stride) {
    const int r = i / f, c = i % f;
    float s, d;
    silu_and_grad(to_float(inp[(size_t)r * 2 * f + c]), s, d);
    out[i] = to_bf16(s * to_float(inp[(size_t)r * 2 * f + f + c]));
  }
}

extern "C" __global__ void swiglu_bwd_bf16(bf16* dinp, const bf16* inp, const bf16* dout, int rows, int f) {
  using namespace gelu_detail;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = rows * f;
  if (f % 8 == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    for (int v = first; v < n / 8; v += stride) {
      const int r = 8 * v / f, c = 8 * v % f;
      const size_t gate = (size_t)r * 2 * f + c, up = gate + f;
      const bf16x8 g = *reinterpret_cast<const bf16x8*>(inp + gate), u = *reinterpret_cast<const bf16x8*>(inp + up);
      const bf16x8 dy = reinterpret_cast<const bf16x8*>(dout)[v];
      bf16x8 dg, du;
      UNROLL for (int e = 0; e < 8; ++e) {
        float s, d;
        silu_and_grad(to_float(g.v[e]), s, d);
        const float y = to_float(dy.v[e]);
        dg.v[e] = to_bf16(y * to_float(u.v[e]) * d);
        du.v[e] = to_bf16(y * s);
      }
      *reinterpret_cast<bf16x8*>(dinp + gate) = dg;
      *reinterpret_cast<bf16x8*>(dinp + up) = du;
    }
    return;
  }
  for (int i = first; i < n; i += stride) {
    const int r = i / f, c = i % f;
    const size_t gate = (size_t)r * 2 * f + c, up = gate + f;
    float s, d;
    silu_and_grad(to_float(inp[gate]), s, d);
    const float y = to_float(dout[i]);
    dinp[gate] = to_bf16(y * to_float(inp[up]) * d);
    dinp[up] = to_bf16(y * s);
  }
}
