// adamw.cu: one AdamW step on f32 master copies, writing the bf16 working copy the GEMMs read,
// and the step's gradient zeroing. One source for CUDA and HIP (common/portable.h).
//
// adamw_f32_bf16 computes, for i < n:  g = grad[i] · f32(*grad_scale_at)
//                       m = β1 m + (1 - β1) g;  v = β2 v + (1 - β2) g²
//                       param -= lr · (m · c1 / (sqrt(v · c2) + eps) + weight_decay · param)
//                       param_bf16[i] = bf16(param)   (skipped when param_bf16 is null)
//                       param_rounded[i] = f32(bf16(param))  (skipped when null: the rounded
//                       working copy of a mixed-precision run whose buffers are f32)
// with c1 = 1 / (1 - β1^step), c2 = 1 / (1 - β2^step) computed by the caller in f64 (as the
// reference does) and passed as f32. param, grad, m, v [n] f32; param_bf16 [n] bf16.
// *grad_scale_at (an f64 slot of the step's scalars holding an f32 value, written by clip_scale_f64)
// folds gradient clipping and loss-scale removal into the step: read on the device, so the host
// never waits for the gradient norm.
//
// Grid: any 1-D grid of 1-D blocks, grid-stride loop (⌈n/256⌉ blocks of 256, capped). Each
// element is touched by one thread; no shared memory; a few registers.
//
// adamw_multi_f32_bf16 is the same update (one formula, adamw_detail::update, so the same bits) of
// every tensor of an optimizer group in one launch, over a table: tensors[t] (AdamwTensor: its
// param, param_bf16, grad, m, v, param_rounded as above, n, and its own weight_decay: 0 for the
// no-decay tensors), first_block[t] its first block (first_block[count] the blocks in all). The
// mapping is fixed by the sizes alone: block b takes tensor t, the last with first_block[t] <= b,
// and its elements c·2048 .. c·2048 + 2047 (c = b - first_block[t]); thread j the 8 elements
// c·2048 + j + 256 k, loaded first, then updated and stored. Blocks of 256 exactly,
// ⌈n_t / 2048⌉ per tensor; no shared memory; 32 values in registers. The table stays on the device
// between steps (the Device uploads it again only when the tensors change). Each element reads
// 16 bytes and writes 12, plus 2 (param_bf16) or 4 (param_rounded): about 30 bytes per parameter.
//
// zero_multi_u32 sets words[t] 32-bit words from tensors[t] to 0 for every tensor t of a table in
// one launch (the step's gradient zeroing: f32 and bf16 buffers alike, whole words), with
// adamw_multi_f32_bf16's mapping: first_block[t] its first block, a block per 2,048 words, thread
// j the words c·2048 + j + 256 k. It writes 4 bytes per word and reads nothing.
//
// clip_scale_f64 (one thread; grid 1, the rest of its block idles): from the gradients' global sum
// of squares sum[sum_slot], out[slot] = norm = sqrt(sum) / loss_scale and out[slot + 1] =
// f32(clip / (norm + 1e-6) when below 1, else 1; 1 when clip <= 0) / f32(loss_scale): the step's
// gradient norm and AdamW's *grad_scale_at, in device memory. The host computes the same on the CPU
// (`clip_scale` in src/device/kernels.rs, line for line; IEEE sqrt and division in both).
//
// Reference: `adamw_slice` in src/device/kernels.rs (Megatron's decoupled weight decay), via the
// reference device in f64 (tests/cuda_emulation.rs, tests/hip_emulation.rs). The multi-tensor
// kernels against the per-tensor kernel and `fill`, bit for bit (tests/cuda_device.rs and
// tests/hip_device.rs `adamw_group_...`, `zero_buffers_...`).
#include "common/portable.h"

namespace adamw_detail {

// One element's update, the one formula of both AdamW kernels (so the two give the same bits):
// p, m, v are the element's master weight and moments, updated in place; g its scaled gradient.
__device__ __forceinline__ void update(float& p, float& m, float& v, float g, float lr, float beta1, float beta2,
                                       float eps, float weight_decay, float c1, float c2) {
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  p -= lr * ((m * c1) / (sqrtf(v * c2) + eps) + weight_decay * p);
}

// The multi-tensor kernels' threads per block and elements (words) per thread: a block takes one
// chunk of kChunk of one tensor.
constexpr int kThreads = 256;
constexpr int kPerThread = 8;
constexpr int kChunk = kThreads * kPerThread;

// The tensor of a multi-tensor launch this block works on: the last t with first_block[t] <=
// blockIdx.x (binary search over the table's first blocks).
__device__ __forceinline__ int tensor_of(const int* first_block, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= (int)blockIdx.x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace adamw_detail

// One tensor of adamw_multi_f32_bf16's table (56 bytes, as the Device writes it).
struct AdamwTensor {
  float* param;
  bf16* param_bf16;
  const float* grad;
  float* m;
  float* v;
  float* param_rounded;
  int n;
  float weight_decay;
};

extern "C" __global__ void adamw_f32_bf16(float* param, bf16* param_bf16, const float* grad, float* m, float* v, int n,
                                          float lr, float beta1, float beta2, float eps, float weight_decay,
                                          const double* grad_scale_at, float c1, float c2, float* param_rounded) {
  const float grad_scale = (float)*grad_scale_at;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float p = param[i], mi = m[i], vi = v[i];
    adamw_detail::update(p, mi, vi, grad[i] * grad_scale, lr, beta1, beta2, eps, weight_decay, c1, c2);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (param_bf16) param_bf16[i] = to_bf16(p);
    if (param_rounded) param_rounded[i] = to_float(to_bf16(p));
  }
}

// block b updates chunk b - first_block[t] of tensor t, the last t with first_block[t] <= b: each
// thread loads its kPerThread elements first (independent loads in flight), then updates and
// stores them.
extern "C" __global__ void __launch_bounds__(256)
    adamw_multi_f32_bf16(const AdamwTensor* tensors, const int* first_block, int count, float lr, float beta1,
                         float beta2, float eps, const double* grad_scale_at, float c1, float c2) {
  using namespace adamw_detail;
  const int lo = tensor_of(first_block, count);
  const AdamwTensor t = tensors[lo];
  const int start = ((int)blockIdx.x - first_block[lo]) * kChunk + (int)threadIdx.x;
  const float grad_scale = (float)*grad_scale_at;
  float g[kPerThread], p[kPerThread], mi[kPerThread], vi[kPerThread];
  UNROLL
  for (int k = 0; k < kPerThread; ++k) {
    const int i = start + k * kThreads;
    if (i < t.n) {
      g[k] = t.grad[i];
      p[k] = t.param[i];
      mi[k] = t.m[i];
      vi[k] = t.v[i];
    }
  }
  UNROLL
  for (int k = 0; k < kPerThread; ++k) {
    const int i = start + k * kThreads;
    if (i < t.n) {
      update(p[k], mi[k], vi[k], g[k] * grad_scale, lr, beta1, beta2, eps, t.weight_decay, c1, c2);
      t.m[i] = mi[k];
      t.v[i] = vi[k];
      t.param[i] = p[k];
      if (t.param_bf16) t.param_bf16[i] = to_bf16(p[k]);
      if (t.param_rounded) t.param_rounded[i] = to_float(to_bf16(p[k]));
    }
  }
}

// Block b zeroes chunk b - first_block[t] of tensor t's words (tensor_of), thread j the words
// c·2048 + j + 256 k.
extern "C" __global__ void __launch_bounds__(256)
    zero_multi_u32(const unsigned long long* tensors, const int* words, const int* first_block, int count) {
  using namespace adamw_detail;
  const int t = tensor_of(first_block, count);
  unsigned* x = reinterpret_cast<unsigned*>(tensors[t]);
  const int start = ((int)blockIdx.x - first_block[t]) * kChunk + (int)threadIdx.x;
  UNROLL
  for (int k = 0; k < kPerThread; ++k) {
    const int i = start + k * kThreads;
    if (i < words[t]) x[i] = 0u;
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
