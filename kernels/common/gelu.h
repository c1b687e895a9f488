// gelu.h: GPT-2's tanh-approximated GELU and its derivative, in f32, with the constants and
// formulas of `gelu` / `gelu_grad` in src/device/kernels.rs (shared by gelu.cu, tensor_ops.cu
// and the vendors' GEMM epilogues).
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
