// softmax_xent.hip: the vocab-parallel softmax cross-entropy, as the three pieces between which
// Megatron's tensor-parallel all-reduces run, over this rank's shard of the vocabulary (columns
// vocab_start .. vocab_start + V). The CDNA counterpart of kernels-cuda/softmax_xent.cu, same
// kernel names and arguments.
//
// Computes, per row r of logits [rows, V] bf16 (targets [rows] u32, global token ids):
//   xent_max_bf16:       max[r] = max_v logits[r][v]                              (then all-reduce max)
//   xent_partials_bf16:  sum_exp[r] = Σ_v exp(logits[r][v] - max[r]);
//                        target_logit[r] = logits[r][target - vocab_start] if the target is in this
//                        shard, else 0                                          (then all-reduce sum)
//   xent_bwd_bf16:       dlogits[r][v] = scale · (exp(logits[r][v] - max[r]) / sum_exp[r] - [v == target])
// max, sum_exp, target_logit f32 [rows]; dlogits [rows, V] bf16, which may be the logits buffer
// itself (each element is read once, then written by the same thread).
//
// Grid: one workgroup of 256 threads (4 wave64s) per row (gridDim.x = rows); threads stride over
// the row and combine with block_max / block_sum of common/reduce.h (64-lane butterflies, then
// the wave totals in wave order): a fixed order, so the result is deterministic. LDS: kMaxWaves
// (16) floats of reduction scratch. Few VGPRs.
//
// Reference: `cross_entropy_max`, `cross_entropy_partials`, `cross_entropy_backward` of the
// reference device (f64) on the same bf16 logits (tests/hip_emulation.rs).
#include "common/base.h"
#include "common/reduce.h"

namespace softmax_xent_detail {
// The target's column in this shard, or -1.
__device__ __forceinline__ int local_column(uint32_t target, int vocab_start, int V) {
  const long long c = (long long)target - vocab_start;
  return c >= 0 && c < V ? int(c) : -1;
}
}  // namespace softmax_xent_detail

extern "C" __global__ void __launch_bounds__(256) xent_max_bf16(float* max, const bf16* logits, int rows, int V) {
  __shared__ float scratch[kMaxWaves];
  const int r = blockIdx.x;
  if (r >= rows) return;  // uniform over the workgroup
  const bf16* row = logits + (size_t)r * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, to_float(row[v]));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) max[r] = m;
}

extern "C" __global__ void __launch_bounds__(256)
    xent_partials_bf16(float* sum_exp, float* target_logit, const bf16* logits, const uint32_t* targets, int vocab_start,
                       const float* max, int rows, int V) {
  __shared__ float scratch[kMaxWaves];
  const int r = blockIdx.x;
  if (r >= rows) return;
  const bf16* row = logits + (size_t)r * V;
  const float m = max[r];
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(to_float(row[v]) - m);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    sum_exp[r] = s;
    const int t = softmax_xent_detail::local_column(targets[r], vocab_start, V);
    target_logit[r] = t >= 0 ? to_float(row[t]) : 0.0f;
  }
}

extern "C" __global__ void __launch_bounds__(256)
    xent_bwd_bf16(bf16* dlogits, const bf16* logits, const uint32_t* targets, int vocab_start, const float* max,
                  const float* sum_exp, float scale, int rows, int V) {
  const int r = blockIdx.x;
  if (r >= rows) return;
  const size_t base = (size_t)r * V;
  const float m = max[r], inv = scale / sum_exp[r];
  const int t = softmax_xent_detail::local_column(targets[r], vocab_start, V);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float g = expf(to_float(logits[base + v]) - m) * inv;
    if (v == t) g -= scale;
    dlogits[base + v] = to_bf16(g);
  }
}
