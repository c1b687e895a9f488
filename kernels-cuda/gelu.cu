// gelu.cu: GPT-2's tanh GELU on its own, forward and backward, for activations the GEMM epilogue
// did not already cover.
//
// Computes   gelu_fwd_bf16:  out[i] = gelu(inp[i])
//            gelu_bwd_bf16:  dinp[i] = dout[i] · gelu'(inp[i])
// over n elements, bf16 in and out, f32 arithmetic (formulas in common/gelu.cuh).
//
// Grid: any 1-D grid of 1-D blocks; a grid-stride loop covers n (launch ⌈n/256⌉ blocks of 256,
// capped at a few per SM). No shared memory; a handful of registers.
//
// Reference: `gelu_forward_slice` / `gelu_backward_slice` in src/device/kernels.rs, run in f64
// by the reference device on the same bf16 inputs (tests/cuda_emulation.rs).
#include "common/base.cuh"
#include "common/gelu.cuh"

extern "C" __global__ void gelu_fwd_bf16(bf16* out, const bf16* inp, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = to_bf16(gelu_tanh(to_float(inp[i])));
}

extern "C" __global__ void gelu_bwd_bf16(bf16* dinp, const bf16* inp, const bf16* dout, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dinp[i] = to_bf16(to_float(dout[i]) * gelu_tanh_grad(to_float(inp[i])));
}
