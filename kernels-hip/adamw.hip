// adamw.hip: one AdamW step on an f32 master copy, writing the bf16 working copy the GEMMs read
// (the CDNA counterpart of kernels-cuda/adamw.cu, same kernel name and arguments).
//
// adamw_f32_bf16 computes, for i < n:  g = grad[i] · f32(*grad_scale_at)
//                       m = β1 m + (1 - β1) g;  v = β2 v + (1 - β2) g²
//                       param -= lr · (m · c1 / (sqrt(v · c2) + eps) + weight_decay · param)
//                       param_bf16[i] = bf16(param)   (skipped when param_bf16 is null)
//                       param_rounded[i] = f32(bf16(param))  (skipped when null: the rounded
//                       working copy of a mixed-precision run whose buffers are f32)
// with c1 = 1 / (1 - β1^step), c2 = 1 / (1 - β2^step) computed by the caller in f64 and passed as
// f32. param, grad, m, v, param_rounded [n] f32; param_bf16 [n] bf16. *grad_scale_at (an f64 slot of
// the step's scalars holding an f32 value, written by clip_scale_f64) folds gradient clipping and
// loss-scale removal into the step: read on the device, so the host never waits for the norm.
//
// Grid: any 1-D grid of 1-D workgroups, grid-stride loop (⌈n/256⌉ workgroups of 256 = 4
// wave64s, capped). Each element is touched by one thread; no LDS; a few VGPRs.
//
// clip_scale_f64 (one thread; grid 1, the rest of its workgroup idles): from the gradients' global sum
// of squares sum[sum_slot], out[slot] = norm = sqrt(sum) / loss_scale and out[slot + 1] =
// f32(clip / (norm + 1e-6) when below 1, else 1; 1 when clip <= 0) / f32(loss_scale): the step's
// gradient norm and AdamW's *grad_scale_at, in device memory. The host computes the same on the CPU
// (`clip_scale` in src/device/kernels.rs, line for line; IEEE sqrt and division in both).
//
// Reference: `adamw` of the reference device (f64; Megatron's decoupled weight decay), under the
// wave64 emulation (tests/hip_emulation.rs).
#include "common/base.h"

extern "C" __global__ void adamw_f32_bf16(float* param, bf16* param_bf16, const float* grad, float* m, float* v, int n,
                                          float lr, float beta1, float beta2, float eps, float weight_decay,
                                          const double* grad_scale_at, float c1, float c2, float* param_rounded) {
  const float grad_scale = (float)*grad_scale_at;
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

extern "C" __global__ void clip_scale_f64(const double* sum, int sum_slot, double* out, int slot, double clip,
                                          double loss_scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double norm = sqrt(sum[sum_slot]) / loss_scale;
  float coef = 1.0f;
  if (clip > 0.0) {
    const double c = clip / (norm + 1e-6);
    if (c < 1.0) coef = (float)c;
  }
  out[slot] = norm;
  out[slot + 1] = (double)(coef / (float)loss_scale);
}
