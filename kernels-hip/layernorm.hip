// layernorm.hip: LayerNorm forward (optionally fused with the residual add before it) and
// backward on 64-lane wavefronts, one wave per row (the CDNA counterpart of
// kernels-cuda/layernorm.cu, same kernel names and arguments).
//
// Forward  layernorm_fwd_bf16:  x = inp (+ residual, rounded to bf16 and stored in resid_out);
//          out = (x - mean) · rstd · weight + bias, mean = Σx / C, rstd = 1 / sqrt(Σ(x - mean)² / C + 1e-5)
//          inp, residual, resid_out, out [rows, C] bf16; weight, bias [C] f32; mean, rstd [rows]
//          f32 (saved for backward). residual and resid_out are both null or both set.
// Backward layernorm_bwd_dx_bf16:  dinp += rstd · (g - mean(g) - x̂ · mean(g · x̂)),
//          g = dout · weight, x̂ = (inp - mean) · rstd; dinp [rows, C] f32, accumulated.
//          layernorm_bwd_dparams_bf16:  dweight[c] += Σ_rows dout · x̂, dbias[c] += Σ_rows dout,
//          one thread per column, rows in order (deterministic).
//
// Grid: forward and dx: ⌈rows/4⌉ workgroups of 4 wave64s (256 threads); wave w of workgroup b
// owns row 4b + w and strides over the columns by kWaveSize lanes (three passes for the forward:
// sum, squared deviations, output, so the variance is two-pass; two for dx). Row statistics come
// from wave_sum, a butterfly over all 64 lanes (common/reduce.h). dparams: ⌈C/256⌉ workgroups of
// 256 threads, one column each. No LDS; a few tens of VGPRs.
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

extern "C" __global__ void __launch_bounds__(256)
    layernorm_bwd_dx_bf16(float* dinp, const bf16* dout, const bf16* inp, const float* weight, const float* mean,
                          const float* rstd, int rows, int C) {
  const int row = blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  if (row >= rows) return;
  const size_t base = (size_t)row * C;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int c = lane; c < C; c += kWaveSize) {
    const float g = to_float(dout[base + c]) * weight[c];
    sum_g += g;
    sum_gx += g * (to_float(inp[base + c]) - mu) * rs;
  }
  const float mean_g = wave_sum(sum_g) / C, mean_gx = wave_sum(sum_gx) / C;
  for (int c = lane; c < C; c += kWaveSize) {
    const float xhat = (to_float(inp[base + c]) - mu) * rs;
    dinp[base + c] += rs * (to_float(dout[base + c]) * weight[c] - mean_g - xhat * mean_gx);
  }
}

extern "C" __global__ void __launch_bounds__(256)
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
