// layernorm.cu: LayerNorm forward (optionally fused with the residual add before it) and
// backward, one warp per row.
//
// Forward  layernorm_fwd_bf16:  x = inp (+ residual, rounded to bf16 and stored in resid_out);
//          out = (x - mean) · rstd · weight + bias, mean = Σx / C, rstd = 1 / sqrt(Σ(x - mean)² / C + 1e-5)
//          inp, residual, resid_out, out [rows, C] bf16; weight, bias [C] f32; mean, rstd [rows] f32
//          (saved for backward). residual and resid_out are both null or both set.
// Backward layernorm_bwd_dx_bf16:  dinp += rstd · (g - mean(g) - x̂ · mean(g · x̂)), g = dout · weight,
//          x̂ = (inp - mean) · rstd; dinp [rows, C] f32 (accumulated: the residual stream's gradient).
//          layernorm_bwd_dparams_bf16:  dweight[c] += Σ_rows dout · x̂, dbias[c] += Σ_rows dout, f32,
//          each column summed by one thread in row order, so the result is deterministic.
//
// Grid: forward and dx: ⌈rows/4⌉ blocks of 128 threads, warp w of block b owns row 4b + w and
// strides over its columns by 32 lanes (three passes for the forward: sum, squared deviations,
// output, so the variance is two-pass and exact in f32; two for dx); statistics come from
// warp_sum butterflies. dparams: ⌈C/128⌉ blocks of 128 threads, thread per column (coalesced
// across the warp). No shared memory; a few tens of registers.
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

extern "C" __global__ void __launch_bounds__(128)
    layernorm_bwd_dx_bf16(float* dinp, const bf16* dout, const bf16* inp, const float* weight, const float* mean,
                          const float* rstd, int rows, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const size_t base = (size_t)row * C;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float g = to_float(dout[base + c]) * weight[c];
    sum_g += g;
    sum_gx += g * (to_float(inp[base + c]) - mu) * rs;
  }
  const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (to_float(inp[base + c]) - mu) * rs;
    dinp[base + c] += rs * (to_float(dout[base + c]) * weight[c] - mean_g - xhat * mean_gx);
  }
}

extern "C" __global__ void __launch_bounds__(128)
    layernorm_bwd_dparams_bf16(float* dweight, float* dbias, const bf16* dout, const bf16* inp, const float* mean,
                               const float* rstd, int rows, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float dy = to_float(dout[(size_t)r * C + c]);
    dw += dy * (to_float(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
    db += dy;
  }
  dweight[c] += dw;
  dbias[c] += db;
}
