// adamw.cu: one AdamW step on an f32 master copy, writing the bf16 working copy the GEMMs read.
//
// Computes, for i < n:  g = grad[i] · grad_scale
//                       m = β1 m + (1 - β1) g;  v = β2 v + (1 - β2) g²
//                       param -= lr · (m · c1 / (sqrt(v · c2) + eps) + weight_decay · param)
//                       param_bf16[i] = bf16(param)   (skipped when param_bf16 is null)
//                       param_rounded[i] = f32(bf16(param))  (skipped when null: the rounded
//                       working copy of a mixed-precision run whose buffers are f32)
// with c1 = 1 / (1 - β1^step), c2 = 1 / (1 - β2^step) computed by the caller in f64 (as the
// reference does) and passed as f32. param, grad, m, v [n] f32; param_bf16 [n] bf16.
// grad_scale folds gradient clipping and loss-scale removal into the step.
//
// Grid: any 1-D grid of 1-D blocks, grid-stride loop (⌈n/256⌉ blocks of 256, capped). Each
// element is touched by one thread; no shared memory; a few registers.
//
// Reference: `adamw_slice` in src/device/kernels.rs (Megatron's decoupled weight decay), via the
// reference device in f64 (tests/cuda_emulation.rs).
#include "common/base.cuh"

extern "C" __global__ void adamw_f32_bf16(float* param, bf16* param_bf16, const float* grad, float* m, float* v, int n,
                                          float lr, float beta1, float beta2, float eps, float weight_decay,
                                          float grad_scale, float c1, float c2, float* param_rounded) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = param[i];
    p -= lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + weight_decay * p);
    param[i] = p;
    if (param_bf16) param_bf16[i] = to_bf16(p);
    if (param_rounded) param_rounded[i] = to_float(to_bf16(p));
  }
}
