// gelu.h: GPT-2's tanh-approximated GELU and its derivative, in f32, with the constants and
// formulas of `gelu` / `gelu_grad` in src/device/kernels.rs (shared by gelu.cu, tensor_ops.cu
// and the vendors' GEMM epilogues); and the exact GELU, x/2·(1 + erf(x/√2)), and its derivative
// Φ(x) + x·φ(x) (`gelu_erf` / `gelu_erf_grad` there; megatron-core's default), on the vendor's
// erff and expf.
#pragma once
#include "common/portable.h"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)
#define GELU_CUBIC 0.044715f

__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

#define GELU_FRAC_1_SQRT_2 0.70710678118654752f
#define GELU_INV_SQRT_2PI 0.39894228040143268f

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * GELU_FRAC_1_SQRT_2)); }

__device__ __forceinline__ float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + erff(x * GELU_FRAC_1_SQRT_2)) + x * GELU_INV_SQRT_2PI * expf(-0.5f * x * x);
}

// The form a launch names: erf != 0 the exact GELU, else the tanh one (the same for every thread).
__device__ __forceinline__ float gelu_of(float x, int erf) { return erf ? gelu_erf(x) : gelu_tanh(x); }
__device__ __forceinline__ float gelu_grad_of(float x, int erf) { return erf ? gelu_erf_grad(x) : gelu_tanh_grad(x); }
