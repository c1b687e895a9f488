// tensor_ops.hip: the f32-storage ops of the HIP Device (src/gpu/device.rs) besides the bf16
// GEMMs and attention (the CDNA counterpart of kernels-cuda/tensor_ops.cu, same kernel names and
// arguments). Every buffer of the Device is f32, so these read and write f32 and accumulate every
// reduction in f64 (the LayerNorm parameter gradients and the bias gradient excepted, which add in
// f32 in row order exactly as the reference's loop does).
//
//   element-wise (grid-stride, any 1-D grid of 1-D workgroups; launched as ⌈n/256⌉ workgroups of
//   256 = 4 wave64s, capped):
//     add_f32, add_assign_f32, add_bias_f32, round_bf16_f32 (round to nearest even, in place),
//     gelu_fwd_f32, gelu_bwd_f32 (common/gelu.h), embedding_fwd_f32 (zero rows for tokens outside
//     this vocabulary shard), position_fwd_f32, position_fwd_bf16 (bf16 rows), layernorm_apply_f32 (split LayerNorm with the
//     whole rows' f64 statistics), layernorm_bwd_apply_dx_f32, xent_bwd_f32
//   one thread per column, rows in order (deterministic, no atomics; ⌈cols/256⌉ workgroups of 256):
//     embedding_bwd_f32, position_bwd_f32 (grid (⌈hidden/256⌉, positions)), column_sum_add_f32,
//     column_sum_add_bf16 (x bf16), layernorm_bwd_params_f32
//   one wave per row, 4 rows per workgroup of 4 wave64s = 256 threads (grid ⌈rows/4⌉, the CUDA
//   grid; the CUDA kernels run 4 warps in 128 threads), f64 lane partials and a butterfly over
//   all kWaveSize lanes (wave_sum_f64 starts at common/reduce.h's first offset), so every lane
//   holds the same row total:
//     layernorm_fwd_f32, layernorm_bwd_dx_f32, layernorm_sums_f32, layernorm_bwd_sums_f32,
//     xent_max_f32, xent_partials_f32 (f64 out)
//   workgroups of 256, over a table of tensors:
//     sum_squares_f32    partials[first_block[t] + c] = Σ x² over elements c·8192 .. +8192 of
//                        tensor t, f64; the wave totals are added in wave order, the partials by
//                        sum_into_f64 tensor by tensor in block order.
//   one thread (grid 1; the rest of its workgroup idles), sums in a fixed order kept on the device:
//     sum_into_f64       for each tensor t: acc[slot] += Σ parts[first_block[t] .. first_block[t+1]]
//     xent_loss_f64      acc[slot] += Σ_r ln(stats[r]) + max[r] - stats[rows + r], r in order
//
// The semantics of each kernel are tensor_ops.cu's (see its header). Every count is an int (the
// Device checks that sizes fit); tokens / targets are u32. LDS: sum_squares_f32 only, kMaxWaves
// f64. No wave-size literal: lanes and waves come from kWaveSize.
//
// Reference: src/device/kernels.rs through the reference device, kernel by kernel under the
// wave64 emulation (tests/hip_emulation.rs) and op by op behind the emulating HIP runtime
// (tests/gpu/emu_libamdhip64.cpp, tests/hip_device.rs).
#include "common/base.h"
#include "common/gelu.h"
#include "common/reduce.h"

namespace tensor_ops_detail {

constexpr double kLayernormEps = 1e-5;
constexpr int kSumSquaresChunk = 8192;

__device__ __forceinline__ double wave_sum_f64(double v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) v += __shfl_xor(v, offset, kWaveSize);
  return v;
}
__device__ __forceinline__ double wave_max_f64(double v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) {
    const double o = __shfl_xor(v, offset, kWaveSize);
    v = o > v ? o : v;
  }
  return v;
}

// The first element index of this thread and the grid-wide stride of a grid-stride loop.
__device__ __forceinline__ int first_index() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int grid_stride() { return gridDim.x * blockDim.x; }

// The row a wave owns in a one-wave-per-row launch, and its lane.
__device__ __forceinline__ int wave_row() { return blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize; }
__device__ __forceinline__ int lane() { return threadIdx.x % kWaveSize; }

__device__ __forceinline__ int local_row(uint32_t token, int vocab_start, int vocab_rows) {
  const long long r = (long long)token - vocab_start;
  return r >= 0 && r < vocab_rows ? int(r) : -1;
}

}  // namespace tensor_ops_detail

using namespace tensor_ops_detail;

// ---- element-wise ----------------------------------------------------------------------------

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

extern "C" __global__ void add_assign_f32(float* acc, const float* x, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) acc[i] += x[i];
}

extern "C" __global__ void add_bias_f32(float* out, const float* bias, int rows, int cols) {
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) out[i] += bias[i % cols];
}

extern "C" __global__ void round_bf16_f32(float* buf, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) buf[i] = to_float(to_bf16(buf[i]));
}

extern "C" __global__ void gelu_fwd_f32(float* out, const float* inp, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) out[i] = gelu_tanh(inp[i]);
}

extern "C" __global__ void gelu_bwd_f32(float* dinp, const float* inp, const float* dout, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) dinp[i] = dout[i] * gelu_tanh_grad(inp[i]);
}

extern "C" __global__ void embedding_fwd_f32(float* out, const uint32_t* tokens, const float* wte, int vocab_start,
                                             int vocab_rows, int batch, int seq, int hidden) {
  const int n = batch * seq * hidden;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int row = i / hidden, c = i % hidden, t = row / batch, b = row % batch;
    const int r = local_row(tokens[b * seq + t], vocab_start, vocab_rows);
    out[i] = r >= 0 ? wte[(size_t)r * hidden + c] : 0.0f;
  }
}

extern "C" __global__ void position_fwd_f32(float* out, const float* wpe, int batch, int t0, int positions,
                                            int hidden) {
  const int n = positions * batch * hidden;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int row = i / hidden, c = i % hidden;
    out[i] += wpe[(size_t)(t0 + row / batch) * hidden + c];
  }
}

// position_fwd_f32 on bf16 rows (bf16 storage): the stored value plus the f32 position row,
// rounded once.
extern "C" __global__ void position_fwd_bf16(bf16* out, const float* wpe, int batch, int t0, int positions,
                                             int hidden) {
  const int n = positions * batch * hidden;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int row = i / hidden, c = i % hidden;
    out[i] = to_bf16(to_float(out[i]) + wpe[(size_t)(t0 + row / batch) * hidden + c]);
  }
}

extern "C" __global__ void layernorm_apply_f32(float* out, float* mean_out, float* rstd_out, const float* inp,
                                               const float* weight, const float* bias, const double* mean,
                                               const double* rstd, int rows, int cols) {
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int r = i / cols, c = i % cols;
    const float mu = float(mean[r]), rs = float(rstd[r]);
    out[i] = (inp[i] - mu) * rs * weight[c] + bias[c];
    if (c == 0) {
      mean_out[r] = mu;
      rstd_out[r] = rs;
    }
  }
}

extern "C" __global__ void layernorm_bwd_apply_dx_f32(float* dinp, const float* dout, const float* inp,
                                                      const float* weight, const float* mean, const float* rstd,
                                                      const double* sums, int n_cols, int rows, int cols) {
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int r = i / cols, c = i % cols;
    const float mean_g = float(sums[2 * r] / n_cols), mean_gx = float(sums[2 * r + 1] / n_cols);
    const float xhat = (inp[i] - mean[r]) * rstd[r];
    dinp[i] += rstd[r] * (dout[i] * weight[c] - mean_g - xhat * mean_gx);
  }
}

extern "C" __global__ void xent_bwd_f32(float* logits, const uint32_t* targets, int vocab_start, const double* max,
                                        const double* sum_exp, float scale, int rows, int V) {
  const int n = rows * V;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int r = i / V, v = i % V;
    const float inv = scale / float(sum_exp[r]);
    float g = expf(logits[i] - float(max[r])) * inv;
    if (local_row(targets[r], vocab_start, V) == v) g -= scale;
    logits[i] = g;
  }
}

// ---- one thread per column -------------------------------------------------------------------

extern "C" __global__ void embedding_bwd_f32(float* dwte, const float* dout, const uint32_t* tokens, int vocab_start,
                                             int vocab_rows, int batch, int seq, int hidden) {
  const int c = first_index();
  if (c >= hidden) return;
  for (int t = 0; t < seq; ++t)
    for (int b = 0; b < batch; ++b) {
      const int r = local_row(tokens[b * seq + t], vocab_start, vocab_rows);
      if (r >= 0) dwte[(size_t)r * hidden + c] += dout[(size_t)(t * batch + b) * hidden + c];
    }
}

extern "C" __global__ void position_bwd_f32(float* dwpe, const float* dout, int batch, int t0, int positions,
                                            int hidden) {
  const int c = first_index(), p = blockIdx.y;
  if (c >= hidden || p >= positions) return;
  float acc = dwpe[(size_t)(t0 + p) * hidden + c];
  for (int b = 0; b < batch; ++b) acc += dout[(size_t)(p * batch + b) * hidden + c];
  dwpe[(size_t)(t0 + p) * hidden + c] = acc;
}

extern "C" __global__ void column_sum_add_f32(float* out, const float* x, int rows, int cols) {
  const int c = first_index();
  if (c >= cols) return;
  float acc = out[c];
  for (int r = 0; r < rows; ++r) acc += x[(size_t)r * cols + c];
  out[c] = acc;
}

// The bias gradient from a bf16 dout (bf16 storage): out[c] += Σ_r x[r][c], rows in order in f32.
extern "C" __global__ void column_sum_add_bf16(float* out, const bf16* x, int rows, int cols) {
  const int c = first_index();
  if (c >= cols) return;
  float acc = out[c];
  for (int r = 0; r < rows; ++r) acc += to_float(x[(size_t)r * cols + c]);
  out[c] = acc;
}

extern "C" __global__ void layernorm_bwd_params_f32(float* dweight, float* dbias, const float* dout,
                                                    const float* inp, const float* mean, const float* rstd, int rows,
                                                    int cols) {
  const int c = first_index();
  if (c >= cols) return;
  float dw = dweight[c], db = dbias[c];
  for (int r = 0; r < rows; ++r) {
    const float dy = dout[(size_t)r * cols + c];
    dw += dy * ((inp[(size_t)r * cols + c] - mean[r]) * rstd[r]);
    db += dy;
  }
  dweight[c] = dw;
  dbias[c] = db;
}

// ---- one wave per row ------------------------------------------------------------------------

extern "C" __global__ void layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int rows, int cols) {
  const int r = wave_row();
  if (r >= rows) return;  // the whole wave leaves together
  const float* x = inp + (size_t)r * cols;
  double s = 0.0;
  for (int c = lane(); c < cols; c += kWaveSize) s += x[c];
  const double mu = wave_sum_f64(s) / cols;
  double q = 0.0;
  for (int c = lane(); c < cols; c += kWaveSize) q += (x[c] - mu) * (x[c] - mu);
  const double var = wave_sum_f64(q) / cols;
  const float muf = float(mu), rs = float(1.0 / sqrt(var + kLayernormEps));
  for (int c = lane(); c < cols; c += kWaveSize) out[(size_t)r * cols + c] = (x[c] - muf) * rs * weight[c] + bias[c];
  if (lane() == 0) {
    mean[r] = muf;
    rstd[r] = rs;
  }
}

extern "C" __global__ void layernorm_bwd_dx_f32(float* dinp, const float* dout, const float* inp, const float* weight,
                                                const float* mean, const float* rstd, int rows, int cols) {
  const int r = wave_row();
  if (r >= rows) return;
  const float *x = inp + (size_t)r * cols, *dy = dout + (size_t)r * cols;
  const float mu = mean[r], rs = rstd[r];
  double sg = 0.0, sgx = 0.0;
  for (int c = lane(); c < cols; c += kWaveSize) {
    const float g = dy[c] * weight[c], xhat = (x[c] - mu) * rs;
    sg += g;
    sgx += (double)g * xhat;
  }
  const float mean_g = float(wave_sum_f64(sg) / cols), mean_gx = float(wave_sum_f64(sgx) / cols);
  for (int c = lane(); c < cols; c += kWaveSize) {
    const float xhat = (x[c] - mu) * rs;
    dinp[(size_t)r * cols + c] += rs * (dy[c] * weight[c] - mean_g - xhat * mean_gx);
  }
}

extern "C" __global__ void layernorm_sums_f32(double* out, const float* inp, const double* mean, int rows, int cols) {
  const int r = wave_row();
  if (r >= rows) return;
  const float* x = inp + (size_t)r * cols;
  double s = 0.0;
  if (mean) {
    const double mu = mean[r];
    for (int c = lane(); c < cols; c += kWaveSize) s += (x[c] - mu) * (x[c] - mu);
  } else {
    for (int c = lane(); c < cols; c += kWaveSize) s += x[c];
  }
  s = wave_sum_f64(s);
  if (lane() == 0) out[r] = s;
}

extern "C" __global__ void layernorm_bwd_sums_f32(double* out, const float* dout, const float* inp,
                                                  const float* weight, const float* mean, const float* rstd, int rows,
                                                  int cols) {
  const int r = wave_row();
  if (r >= rows) return;
  const float *x = inp + (size_t)r * cols, *dy = dout + (size_t)r * cols;
  double sg = 0.0, sgx = 0.0;
  for (int c = lane(); c < cols; c += kWaveSize) {
    const double xhat = (x[c] - mean[r]) * rstd[r], g = dy[c] * weight[c];
    sg += g;
    sgx += g * xhat;
  }
  sg = wave_sum_f64(sg);
  sgx = wave_sum_f64(sgx);
  if (lane() == 0) {
    out[2 * r] = sg;
    out[2 * r + 1] = sgx;
  }
}

extern "C" __global__ void xent_max_f32(double* max, const float* logits, int rows, int V) {
  const int r = wave_row();
  if (r >= rows) return;
  double m = -INFINITY;
  for (int v = lane(); v < V; v += kWaveSize) {
    const double l = logits[(size_t)r * V + v];
    m = l > m ? l : m;
  }
  m = wave_max_f64(m);
  if (lane() == 0) max[r] = m;
}

extern "C" __global__ void xent_partials_f32(double* sum_exp, double* target_logit, const float* logits,
                                             const uint32_t* targets, int vocab_start, const double* max, int rows,
                                             int V) {
  const int r = wave_row();
  if (r >= rows) return;
  const double m = max[r];
  double s = 0.0;
  for (int v = lane(); v < V; v += kWaveSize) s += exp((double)logits[(size_t)r * V + v] - m);
  s = wave_sum_f64(s);
  if (lane() == 0) {
    const int t = local_row(targets[r], vocab_start, V);
    sum_exp[r] = s;
    target_logit[r] = t >= 0 ? (double)logits[(size_t)r * V + t] : 0.0;
  }
}

// ---- fixed-size blocks -----------------------------------------------------------------------

// Workgroups of 256 threads; workgroup blk sums the squares of its 8192-element chunk into partials[blk].
extern "C" __global__ void __launch_bounds__(256) sum_squares_f32(double* partials, const unsigned long long* tensors,
                                                                 const int* lens, const int* first_block, int count) {
  __shared__ double wave_totals[kMaxWaves];
  // The tensor this block reads: the last t with first_block[t] <= blockIdx.x (binary search).
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= (int)blockIdx.x) lo = mid; else hi = mid - 1;
  }
  const float* x = reinterpret_cast<const float*>(tensors[lo]);
  const int n = lens[lo];
  const int start = ((int)blockIdx.x - first_block[lo]) * kSumSquaresChunk;
  const int end = start + kSumSquaresChunk < n ? start + kSumSquaresChunk : n;
  double s = 0.0;
  for (int i = start + threadIdx.x; i < end; i += blockDim.x) s += (double)x[i] * x[i];
  s = wave_sum_f64(s);
  if (lane() == 0) wave_totals[threadIdx.x / kWaveSize] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < (int)(blockDim.x / kWaveSize); ++w) total += wave_totals[w];
    partials[blockIdx.x] = total;
  }
}

// ---- one thread: the step's scalars ----------------------------------------------------------

extern "C" __global__ void sum_into_f64(double* acc, int slot, const double* parts, const int* first_block, int count) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int t = 0; t < count; ++t) {
    double s = 0.0;
    for (int i = first_block[t]; i < first_block[t + 1]; ++i) s += parts[i];
    acc[slot] += s;
  }
}

extern "C" __global__ void xent_loss_f64(double* acc, int slot, const double* max, const double* stats, int rows) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int r = 0; r < rows; ++r) s += log(stats[r]) + max[r] - stats[rows + r];
  acc[slot] += s;
}
