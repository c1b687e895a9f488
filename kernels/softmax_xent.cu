// softmax_xent.cu: the vocab-parallel softmax cross-entropy, as the three pieces between which
// Megatron's tensor-parallel all-reduces run (max, then sum-exp and target logit, then the
// gradient), over this rank's shard of the vocabulary (columns vocab_start .. vocab_start + V).
// One source for CUDA and HIP (common/portable.h).
//
// Computes, per row r of logits [rows, V] bf16 (targets [rows] u32, global token ids):
//   xent_max_bf16:       max[r] = max_v logits[r][v]                              (then all-reduce max)
//   xent_partials_bf16:  sum_exp[r] = Σ_v exp(logits[r][v] - max[r]);
//                        target_logit[r] = logits[r][target - vocab_start] if the target is in this
//                        shard, else 0                                          (then all-reduce sum)
//   xent_bwd_bf16:       logits[r][v] = scale · (exp(logits[r][v] - max[r]) / sum_exp[r] - [v == target]),
//                        in place: the logits become their gradient (0 where the target is
//                        kIgnoredTarget, a token Megatron's loss mask leaves out)
// max, sum_exp, target_logit f64 [rows], the layout and arguments of tensor_ops.cu's xent_max_f32,
// xent_partials_f32 and xent_bwd_f32 (so the Device's f64 statistics, their all-reduces and
// xent_loss_f64 serve bf16 logits unchanged). exp is taken in f32 (the logits and the max are bf16
// values, their difference exact in f32) and summed in f64 (8 at a time in f32 first, see Grid). The loss is
// log(sum_exp) + max - target_logit, formed by the caller after the all-reduces.
//
// Grid: one block of 256 threads per row (gridDim.x = rows). A row is read (and, backward,
// written) 16 bytes at a time: its elements before the first 16-byte boundary (the head, at most 7:
// rows of a V % 8 == 0 buffer have none), then groups of 8 bf16 that the threads stride over as one
// 16-byte load / store each, 4 groups a thread at a time (4 loads in flight, then the stores), then
// the last V - head mod 8 elements (the tail), one per thread; so any V and any row start work. Each thread takes its head element, its groups in order and its
// tail element; the partials sum the 8 exps of a group in f32, in order, and add that to the
// thread's f64 sum (single elements add directly). Threads then combine with block_max /
// block_sum_f64 (wave butterflies, then the wave totals in wave order): a fixed order, so the
// result is deterministic. Shared memory: kMaxWaves floats (max) or doubles (partials) of
// reduction scratch (32 on CUDA, 16 on HIP). Few registers.
//
// Reference: `cross_entropy_max`, `cross_entropy_partials`, `cross_entropy_backward` of the
// reference device (row_max, cross_entropy_partials_row, cross_entropy_backward_row in
// src/device/kernels.rs), f64 on the same bf16 logits (tests/cuda_emulation.rs,
// tests/hip_emulation.rs).
#include "common/portable.h"
#include "common/reduce.h"

namespace softmax_xent_detail {
// The target's column in this shard, or -1.
__device__ __forceinline__ int local_column(uint32_t target, int vocab_start, int V) {
  const long long c = (long long)target - vocab_start;
  return c >= 0 && c < V ? int(c) : -1;
}

// The sum of v over the block in f64 (wave butterflies, then the wave totals in wave order, as
// block_sum does in f32); `scratch` is kMaxWaves doubles of shared memory; ends with a barrier.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
  const int lane = threadIdx.x % kWaveSize, wave = threadIdx.x / kWaveSize, waves = blockDim.x / kWaveSize;
  for (int o = wave_first_offset(); o > 0; o >>= 1) v += shfl_xor(v, o, kWaveSize);
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  double total = lane < waves ? scratch[lane] : 0.0;
  for (int o = wave_first_offset(); o > 0; o >>= 1) total += shfl_xor(total, o, kWaveSize);
  __syncthreads();
  return total;
}

// Visits this thread's elements of `row` [V] in its fixed order: one(v) for its element before
// the first 16-byte boundary, group(v, x) for each of its whole 16-byte groups in order (elements
// v .. v+7, x a copy of their bf16 values; `row + v` is 16-byte aligned), then one(v) for its tail
// element. The groups are loaded kBatch at a time (kBatch 16-byte loads in flight, 4 KB apart,
// before the first is used); with kStore, group changes x and the batch's groups are stored back
// after all of them are computed (no store between the loads of one batch).
inline constexpr int kBatch = 4;
template <bool kStore, class Elem, class One, class Group>
__device__ __forceinline__ void for_row(Elem* row, int V, One one, Group group) {
  const int to_boundary = int((16 - reinterpret_cast<uintptr_t>(row) % 16) % 16 / sizeof(bf16));
  const int head = to_boundary < V ? to_boundary : V, groups = (V - head) / 8, tail = head + 8 * groups;
  const auto at = [&](int g) { return row + head + 8 * g; };
  for (int v = threadIdx.x; v < head; v += blockDim.x) one(v);
  int g = threadIdx.x;
  for (; g + (kBatch - 1) * int(blockDim.x) < groups; g += kBatch * blockDim.x) {
    bf16x8 x[kBatch];
    UNROLL
    for (int k = 0; k < kBatch; ++k) x[k] = *reinterpret_cast<const bf16x8*>(at(g + k * blockDim.x));
    UNROLL
    for (int k = 0; k < kBatch; ++k) group(head + 8 * (g + k * blockDim.x), x[k]);
    if constexpr (kStore) {
      UNROLL
      for (int k = 0; k < kBatch; ++k) *reinterpret_cast<bf16x8*>(at(g + k * blockDim.x)) = x[k];
    }
  }
  for (; g < groups; g += blockDim.x) {
    bf16x8 x = *reinterpret_cast<const bf16x8*>(at(g));
    group(head + 8 * g, x);
    if constexpr (kStore) *reinterpret_cast<bf16x8*>(at(g)) = x;
  }
  for (int v = tail + threadIdx.x; v < V; v += blockDim.x) one(v);
}
}  // namespace softmax_xent_detail

// registry: static_shared=128
extern "C" __global__ void __launch_bounds__(256) xent_max_bf16(double* max, const bf16* logits, int rows, int V) {
  __shared__ float scratch[kMaxWaves];
  const int r = blockIdx.x;
  if (r >= rows) return;  // uniform over the block
  const bf16* row = logits + (size_t)r * V;
  float m = -INFINITY;
  softmax_xent_detail::for_row<false>(
      row, V, [&](int v) { m = fmaxf(m, to_float(row[v])); },
      [&](int, const bf16x8& x) {
        UNROLL
        for (int e = 0; e < 8; ++e) m = fmaxf(m, to_float(x.v[e]));
      });
  m = block_max(m, scratch);  // a bf16 value, exact in f32 and f64
  if (threadIdx.x == 0) max[r] = m;
}

// registry: static_shared=256
extern "C" __global__ void __launch_bounds__(256)
    xent_partials_bf16(double* sum_exp, double* target_logit, const bf16* logits, const uint32_t* targets,
                       int vocab_start, const double* max, int rows, int V) {
  __shared__ double scratch[kMaxWaves];
  const int r = blockIdx.x;
  if (r >= rows) return;
  const bf16* row = logits + (size_t)r * V;
  const float m = float(max[r]);  // the all-reduced max of bf16 values: exact in f32
  double s = 0.0;
  softmax_xent_detail::for_row<false>(
      row, V, [&](int v) { s += (double)expf(to_float(row[v]) - m); },
      [&](int, const bf16x8& x) {
        float group = 0.0f;
        UNROLL
        for (int e = 0; e < 8; ++e) group += expf(to_float(x.v[e]) - m);
        s += (double)group;
      });
  s = softmax_xent_detail::block_sum_f64(s, scratch);
  if (threadIdx.x == 0) {
    sum_exp[r] = s;
    const int t = softmax_xent_detail::local_column(targets[r], vocab_start, V);
    target_logit[r] = t >= 0 ? (double)to_float(row[t]) : 0.0;
  }
}

extern "C" __global__ void __launch_bounds__(256)
    xent_bwd_bf16(bf16* logits, const uint32_t* targets, int vocab_start, const double* max, const double* sum_exp,
                  float scale, int rows, int V) {
  const int r = blockIdx.x;
  if (r >= rows) return;
  bf16* row = logits + (size_t)r * V;
  const float s = targets[r] == kIgnoredTarget ? 0.0f : scale;  // an ignored row's gradient is 0
  const float m = float(max[r]), inv = s / float(sum_exp[r]);
  const int t = softmax_xent_detail::local_column(targets[r], vocab_start, V);
  const auto grad = [&](int v, bf16 x) { return to_bf16(expf(to_float(x) - m) * inv - (v == t ? s : 0.0f)); };
  // Each element is read once, then written by the same thread.
  softmax_xent_detail::for_row<true>(
      row, V, [&](int v) { row[v] = grad(v, row[v]); },
      [&](int v, bf16x8& x) {
        UNROLL
        for (int e = 0; e < 8; ++e) x.v[e] = grad(v + e, x.v[e]);
      });
}
