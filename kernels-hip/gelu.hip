// gelu.hip: GPT-2's tanh GELU on its own, forward and backward (the CDNA counterpart of
// kernels-cuda/gelu.cu, same kernel names and arguments).
//
// Computes   gelu_fwd_bf16:  out[i] = gelu(inp[i])
//            gelu_bwd_bf16:  dinp[i] = dout[i] · gelu'(inp[i])
// over n elements, bf16 in and out, f32 arithmetic (formulas in common/gelu.h).
//
// Grid: any 1-D grid of 1-D workgroups; a grid-stride loop covers n (⌈n/256⌉ workgroups of 256
// = 4 wave64s, capped at a few per CU). No LDS; a handful of VGPRs.
//
// Reference: `gelu_forward` / `gelu_backward` of the reference device (f64) on the same bf16
// inputs (tests/hip_emulation.rs).
#include "common/base.h"
#include "common/gelu.h"

extern "C" __global__ void gelu_fwd_bf16(bf16* out, const bf16* inp, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = to_bf16(gelu_tanh(to_float(inp[i])));
}

extern "C" __global__ void gelu_bwd_bf16(bf16* dinp, const bf16* inp, const bf16* dout, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dinp[i] = to_bf16(to_float(dout[i]) * gelu_tanh_grad(to_float(inp[i])));
}
