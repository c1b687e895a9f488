// rope.cu: rotary position embedding (Llama's RoPE), forward and backward, in place on the fused
// QKV activation. One source for CUDA and HIP (common/portable.h).
//
// Computes, for every row r of qkv [rows, (heads + 2·kv_heads)·d] (16-bit, rows sequence-first:
// row t·batch + b has position p = t0 + t), every rotated head and every pair j < rd/2:
//   rope_fwd_bf16:  (x_j, x_{j+rd/2}) <- (x_j·cos - x_{j+rd/2}·sin, x_{j+rd/2}·cos + x_j·sin)
//   rope_bwd_bf16:  the same with -sin (the rotation's transpose is its inverse: dQKV in place)
// with cos = table[p·rd + j], sin = table[p·rd + rd/2 + j] (table [positions, rd] f32: each
// position's cosines, then its sines). The row holds per group g of n = heads/kv_heads query heads
// [q_g0 .. q_g(n-1) | k_g | v_g] (src/device/mod.rs's AttentionShape::qkv_offsets; MHA is n = 1,
// [q | k | v] per head): the rotated heads are each group's n query heads and its key head, at
// (g·(n + 2) + i)·d for i <= n; value heads and components rd .. d are untouched. rd is even and
// at most d (rotary on part of the head: rd < d).
//
// One thread per (row, rotated head, pair), grid-stride: element e of the rows·(heads +
// kv_heads)·rd/2 pairs stands for j = e % (rd/2), then the head, then the row, so a wave reads
// kWaveSize consecutive j of one head (two coalesced runs of 16-bit values: 64 bytes each on a
// CUDA warp, 128 on an AMD wavefront where rd/2 >= 64) and the table's matching cos and sin. f32
// arithmetic, each value rounded once. Any 1-D grid of 1-D blocks (the launcher picks
// ⌈pairs/256⌉ blocks of 256, capped at a few per SM or CU); no shared memory.
//
// Reference: `rope_rows` in src/device/llama.rs via the reference device (f64), on the same
// 16-bit inputs (`check ops`, on both emulations).
#include "common/portable.h"

namespace rope_detail {

__device__ __forceinline__ void rotate(bf16* qkv, const float* table, int rows, int batch, int heads, int kv_heads,
                                       int d, int rd, int t0, float sign) {
  const int half = rd / 2, n = heads / kv_heads, rotated = heads + kv_heads;
  const size_t width = (size_t)(heads + 2 * kv_heads) * d;
  const long long pairs = (long long)rows * rotated * half;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < pairs; e += stride) {
    const int j = (int)(e % half);
    const long long rest = e / half;
    const int head = (int)(rest % rotated), row = (int)(rest / rotated);
    const int g = head / (n + 1), i = head % (n + 1);
    bf16* x = qkv + (size_t)row * width + (size_t)(g * (n + 2) + i) * d;
    const float* angles = table + (size_t)(t0 + row / batch) * rd;
    const float c = angles[j], s = sign * angles[half + j];
    const float a = to_float(x[j]), b = to_float(x[half + j]);
    x[j] = to_bf16(a * c - b * s);
    x[half + j] = to_bf16(b * c + a * s);
  }
}

}  // namespace rope_detail

extern "C" __global__ void rope_fwd_bf16(bf16* qkv, const float* table, int rows, int batch, int heads, int kv_heads,
                                         int d, int rd, int t0) {
  rope_detail::rotate(qkv, table, rows, batch, heads, kv_heads, d, rd, t0, 1.0f);
}

extern "C" __global__ void rope_bwd_bf16(bf16* dqkv, const float* table, int rows, int batch, int heads, int kv_heads,
                                         int d, int rd, int t0) {
  rope_detail::rotate(dqkv, table, rows, batch, heads, kv_heads, d, rd, t0, -1.0f);
}
