// layernorm.cu: LayerNorm forward (optionally fused with the residual add before it) and
// backward, one warp per row.
//
// Forward  layernorm_fwd_bf16:  x = inp (+ residual, rounded to bf16 and stored in resid_out);
//          out = (x - mean) · rstd · weight + bias, mean = Σx / C, rstd = 1 / sqrt(Σ(x - mean)² / C + 1e-5)
//          inp, residual, resid_out, out [rows, C] bf16; weight, bias [C] f32; mean, rstd [rows] f32
//          (saved for backward). residual and resid_out are both null or both set.
// Backward layernorm_bwd_bf16 (one launch): dinp += rstd · (g - mean(g) - x̂ · mean(g · x̂)),
//          g = dout · weight, x̂ = (inp - mean) · rstd; dinp [rows, C] bf16, accumulated (the
//          residual stream's gradient: the stored value plus the f32 gradient, rounded once);
//          dweight[c] += Σ_rows dout · x̂, dbias[c] += Σ_rows dout, f32 [C], deterministic: each
//          block sums its rows' terms per column in row order into `partials`, and the last block
//          to finish (an atomic count on `counter`, after __threadfence) adds the blocks' partials
//          in block order into dweight and dbias and sets *counter back to 0 (the caller zeroes
//          the counter once, when it allocates it). No float atomics: the same bits every run.
//
// Grid: forward: ⌈rows/4⌉ blocks of 128 threads, warp w of block b owns row 4b + w and
// strides over its columns by 32 lanes (three passes: sum, squared deviations, output, so the
// variance is two-pass and exact in f32); statistics come from warp_sum butterflies.
// Backward: src/gpu/kernels/plan.rs's layernorm_bwd_blocks(rows, C) blocks of 128 threads (at
// most ⌈rows/4⌉, and fewer the wider the rows, so the partials stay a few MiB and the last block's
// sum short); block b owns rows b·⌈rows/blocks⌉ .. (the last blocks may own none).
// partials: f32 [blocks][2][C] (each block's dweight then dbias column sums) followed by
// [rows][2] (each row's mean(g), mean(g·x̂)): layernorm_bwd_partials(rows, C) elements. No
// shared memory beyond one flag, whatever C (GPT-3 175B's 12288 included); a few tens of registers.
//
// Reference: `layernorm_forward_rows` / `layernorm_backward_rows` in src/device/kernels.rs via the
// reference device (f64), on the same bf16 inputs; the fused residual against the reference
// device's `add` then a bf16 rounding (tests/cuda_emulation.rs).
#include "common/base.cuh"
#include "common/reduce.cuh"

#define LAYERNORM_EPS 1e-5f

extern "C" __global__ void __launch_bounds__(128)
    layernorm_fwd_bf16(bf16* out, float* mean, float* rstd, bf16* resid_out, const bf16* inp, const bf16* residual,
                       const float* weight, const float* bias, int rows, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const size_t base = (size_t)row * C;
  // Pass 1: the row's sum; with a residual, form x = inp + residual once and store it rounded,
  // so the statistics, the output and the backward pass all see the stored value.
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float x = to_float(inp[base + c]);
    if (residual) {
      const bf16 s = to_bf16(x + to_float(residual[base + c]));
      resid_out[base + c] = s;
      x = to_float(s);
    }
    sum += x;
  }
  const bf16* xs = residual ? resid_out : inp;  // this lane reads back only what it wrote
  const float mu = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = to_float(xs[base + c]) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / C + LAYERNORM_EPS);
  for (int c = lane; c < C; c += 32)
    out[base + c] = to_bf16((to_float(xs[base + c]) - mu) * rs * weight[c] + bias[c]);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// One launch per LayerNorm backward (grid and partials above). Phase 1: warp w of the block takes
// rows first + w, first + w + 4, .. of the block's range and stores their mean(g) and mean(g·x̂)
// in the partials' row statistics. Phase 2: thread t takes columns t, t + 128, .., walks the
// block's rows in order (coalesced across the warp), updates dinp and sums the column's dweight
// and dbias terms in registers, then stores them as the block's partials. The last block to count
// itself finished adds every block's partials, blocks in order, into dweight and dbias.
extern "C" __global__ void __launch_bounds__(128)
    layernorm_bwd_bf16(bf16* dinp, float* dweight, float* dbias, float* partials, unsigned int* counter,
                       const bf16* dout, const bf16* inp, const float* weight, const float* mean, const float* rstd,
                       int rows, int C) {
  __shared__ unsigned int last;
  const int per_block = (rows + (int)gridDim.x - 1) / (int)gridDim.x;
  const long long from = (long long)blockIdx.x * per_block, to = from + per_block;
  const int first = from < rows ? (int)from : rows, end = to < rows ? (int)to : rows;
  float* row_stats = partials + (size_t)gridDim.x * 2 * C;  // [rows][2]: mean(g), mean(g·x̂)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int row = first + warp; row < end; row += warps) {
    const size_t base = (size_t)row * C;
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float g = to_float(dout[base + c]) * weight[c];
      sum_g += g;
      sum_gx += g * (to_float(inp[base + c]) - mu) * rs;
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    if (lane == 0) {
      row_stats[2 * (size_t)row] = sum_g / C;
      row_stats[2 * (size_t)row + 1] = sum_gx / C;
    }
  }
  __syncthreads();  // the block's row statistics, written to global memory, are visible to it
  float* mine = partials + (size_t)blockIdx.x * 2 * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float w = weight[c];
    float dw = 0.0f, db = 0.0f;
    for (int row = first; row < end; ++row) {
      const size_t at = (size_t)row * C + c;
      const float rs = rstd[row], dy = to_float(dout[at]), xhat = (to_float(inp[at]) - mean[row]) * rs;
      const float d = rs * (dy * w - row_stats[2 * (size_t)row] - xhat * row_stats[2 * (size_t)row + 1]);
      dinp[at] = to_bf16(to_float(dinp[at]) + d);
      dw += dy * xhat;
      db += dy;
    }
    mine[c] = dw;
    mine[C + c] = db;
  }
  // Publish the partials, then count this block finished; the block that counts last sums them.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;  // uniform over the block
  __threadfence();
  const volatile float* all = partials;  // written by other blocks: read past this SM's L1
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float dw = 0.0f, db = 0.0f;
    for (unsigned b = 0; b < gridDim.x; ++b) {
      dw += all[(size_t)b * 2 * C + c];
      db += all[(size_t)b * 2 * C + C + c];
    }
    dweight[c] += dw;
    dbias[c] += db;
  }
  if (threadIdx.x == 0) *counter = 0;  // every block has counted: ready for the next launch
}
