// layernorm.hip: LayerNorm forward (optionally fused with the residual add before it) and
// backward on 64-lane wavefronts, one wave per row (the CDNA counterpart of
// kernels-cuda/layernorm.cu, same kernel names and arguments).
//
// Forward  layernorm_fwd_bf16:  x = inp (+ residual, rounded to bf16 and stored in resid_out);
//          out = (x - mean) · rstd · weight + bias, mean = Σx / C, rstd = 1 / sqrt(Σ(x - mean)² / C + 1e-5)
//          inp, residual, resid_out, out [rows, C] bf16; weight, bias [C] f32; mean, rstd [rows]
//          f32 (saved for backward). residual and resid_out are both null or both set.
// Backward layernorm_bwd_bf16 (one launch): dinp += rstd · (g - mean(g) - x̂ · mean(g · x̂)),
//          g = dout · weight, x̂ = (inp - mean) · rstd; dinp [rows, C] bf16, accumulated (the
//          stored value plus the f32 gradient, rounded once); dweight[c] += Σ_rows dout · x̂,
//          dbias[c] += Σ_rows dout, f32 [C], deterministic: each workgroup sums its rows' terms per
//          column in row order into `partials`, and the last workgroup to finish (an atomic count
//          on `counter`, after __threadfence) adds them in workgroup order into dweight and dbias
//          and sets *counter back to 0 (the caller zeroes it once). No float atomics.
//
// Grid: forward: ⌈rows/4⌉ workgroups of 4 wave64s (256 threads); wave w of workgroup b owns row
// 4b + w and strides over the columns by kWaveSize lanes (three passes: sum, squared
// deviations, output, so the variance is two-pass). Row statistics come from wave_sum, a
// butterfly over all 64 lanes (common/reduce.h). Backward: plan.rs's layernorm_bwd_blocks(rows, C)
// workgroups of 256 threads (the same count as CUDA's blocks); partials f32 [blocks][2][C] then
// [rows][2], layernorm_bwd_partials(rows, C) elements (kernels-cuda/layernorm.cu's header). No LDS
// beyond one flag; a few tens of VGPRs.
//
// Reference: `layernorm_forward_rows` / `layernorm_backward_rows` of trident's reference device
// (f64) on the same bf16 inputs (tests/hip_emulation.rs).
#include "common/base.h"
#include "common/reduce.h"

#define LAYERNORM_HIP_EPS 1e-5f

extern "C" __global__ void __launch_bounds__(256)
    layernorm_fwd_bf16(bf16* out, float* mean, float* rstd, bf16* resid_out, const bf16* inp, const bf16* residual,
                       const float* weight, const float* bias, int rows, int C) {
  const int row = blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  if (row >= rows) return;  // the whole wave leaves together
  const size_t base = (size_t)row * C;
  // Pass 1: the row's sum; with a residual, form x = inp + residual once and store it rounded,
  // so the statistics, the output and the backward pass all see the stored value.
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWaveSize) {
    float x = to_float(inp[base + c]);
    if (residual) {
      const bf16 s = to_bf16(x + to_float(residual[base + c]));
      resid_out[base + c] = s;
      x = to_float(s);
    }
    sum += x;
  }
  const bf16* xs = residual ? resid_out : inp;  // this lane reads back only what it wrote
  const float mu = wave_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWaveSize) {
    const float d = to_float(xs[base + c]) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(wave_sum(sq) / C + LAYERNORM_HIP_EPS);
  for (int c = lane; c < C; c += kWaveSize)
    out[base + c] = to_bf16((to_float(xs[base + c]) - mu) * rs * weight[c] + bias[c]);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// One launch per LayerNorm backward (grid and partials above). Phase 1: wave w of the workgroup takes
// rows first + w, first + w + 4, .. of the block's range and stores their mean(g) and mean(g·x̂)
// in the partials' row statistics. Phase 2: thread t takes columns t, t + 256, .., walks the
// block's rows in order (coalesced across the wave), updates dinp and sums the column's dweight
// and dbias terms in registers, then stores them as the block's partials. The last block to count
// itself finished adds every block's partials, blocks in order, into dweight and dbias.
extern "C" __global__ void __launch_bounds__(256)
    layernorm_bwd_bf16(bf16* dinp, float* dweight, float* dbias, float* partials, unsigned int* counter,
                       const bf16* dout, const bf16* inp, const float* weight, const float* mean, const float* rstd,
                       int rows, int C) {
  __shared__ unsigned int last;
  const int per_block = (rows + (int)gridDim.x - 1) / (int)gridDim.x;
  const long long from = (long long)blockIdx.x * per_block, to = from + per_block;
  const int first = from < rows ? (int)from : rows, end = to < rows ? (int)to : rows;
  float* row_stats = partials + (size_t)gridDim.x * 2 * C;  // [rows][2]: mean(g), mean(g·x̂)
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize, waves = blockDim.x / kWaveSize;
  for (int row = first + wave; row < end; row += waves) {
    const size_t base = (size_t)row * C;
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane; c < C; c += kWaveSize) {
      const float g = to_float(dout[base + c]) * weight[c];
      sum_g += g;
      sum_gx += g * (to_float(inp[base + c]) - mu) * rs;
    }
    sum_g = wave_sum(sum_g);
    sum_gx = wave_sum(sum_gx);
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
  const volatile float* all = partials;  // written by other blocks: read past this CU's L1
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
