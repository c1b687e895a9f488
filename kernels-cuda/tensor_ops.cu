// tensor_ops.cu: the f32-storage ops of the CUDA Device (src/gpu/device.rs) besides the bf16
// GEMMs and attention: every buffer of the Device is f32, so these read and write f32. Row and
// block reductions (LayerNorm statistics, split-LayerNorm sums, cross-entropy, sum of squares)
// accumulate in f64; column sums (the embedding, position, bias and LayerNorm parameter
// gradients) add in f32 in row order, the order of the reference's loops, with no atomics.
//
//   element-wise (grid-stride, any 1-D grid of 1-D blocks; launched as ⌈n/256⌉ blocks of 256, capped):
//     add_f32            out[i] = a[i] + b[i]
//     add_assign_f32     acc[i] += x[i]
//     add_bias_f32       out[r·cols + c] += bias[c]
//     round_bf16_f32     buf[i] = f32(bf16(buf[i])), round to nearest even, in place
//     gelu_fwd_f32       out[i] = gelu(inp[i])                  (common/gelu.cuh)
//     gelu_bwd_f32       dinp[i] = dout[i] · gelu'(inp[i])
//     embedding_fwd_f32  out[t·batch + b] = wte[tokens[b·seq + t] - vocab_start], zero rows for
//                        tokens outside this vocabulary shard of vocab_rows rows
//     position_fwd_f32   out[p·batch + b] += wpe[t0 + p]       for p < positions
//     position_fwd_bf16  the same on bf16 rows, rounded once
//     layernorm_apply_f32  out = (x - mean_r)·rstd_r·w + b with the whole rows' f64 statistics
//                        (split LayerNorm), saving them as f32 in mean_out / rstd_out
//     layernorm_bwd_apply_dx_f32  dinp += rstd (dy·w - Σg/n - x̂ Σgx̂/n) from the whole rows' sums
//     xent_bwd_f32       logits[r][v] = scale · (exp(l - max_r) / sum_exp_r - [v == target_r])
//   one thread per column, rows in order (deterministic, no atomics; grid ⌈cols/256⌉ of 256):
//     embedding_bwd_f32  dwte[token - vocab_start][c] += dout[t·batch + b][c], tokens in (t, b) order
//     position_bwd_f32   dwpe[t0 + p][c] += Σ_b dout[p·batch + b][c]   (grid (⌈hidden/256⌉, positions))
//     column_sum_add_f32 out[c] += Σ_r x[r][c]                 (the bias gradient)
//     column_sum_add_bf16  the same over a bf16 x (bf16 storage's dout), summed in f32
//     layernorm_bwd_params_f32  dweight[c] += Σ_r dy·x̂, dbias[c] += Σ_r dy
//   one warp per row, 4 rows per block of 128 (grid ⌈rows/4⌉), f64 lane partials and a
//   butterfly, so every lane holds the same row total:
//     layernorm_fwd_f32  out, mean, rstd of each row (eps 1e-5, Megatron's default)
//     layernorm_bwd_dx_f32  dinp += rstd (g - mean(g) - x̂ mean(g x̂)), g = dy·w
//     layernorm_sums_f32 out[r] = Σ_c x (mean null) or Σ_c (x - mean_r)²  (f64 out)
//     layernorm_bwd_sums_f32  out[2r] = Σ_c g, out[2r+1] = Σ_c g·x̂     (f64 out)
//     xent_max_f32       max[r] = max_v logits[r][v]           (f64 out)
//     xent_partials_f32  sum_exp[r] = Σ_v exp(l - max_r), target_logit[r] (0 outside the shard)
//   blocks of a fixed size, over a table of tensors (one launch for every gradient of a step):
//     sum_squares_f32    partials[blk] = Σ x² over elements c·8192 .. +8192 of tensor t, f64, where
//                        block blk = first_block[t] + c (tensors[t] its address, lens[t] its
//                        elements, first_block[count] the blocks in all); added by sum_into_f64:
//                        the same grouping on every device and launch.
//   one thread (grid 1; the others of its block idle), so the sums are in a fixed order and stay
//   on the device (the step's scalars: no host round trip):
//     sum_into_f64       for each tensor t in order: acc[slot] += Σ parts[first_block[t] ..
//                        first_block[t+1]], in order (the gradient norm's accumulator)
//     xent_loss_f64      acc[slot] += Σ_r ln(stats[r]) + max[r] - stats[rows + r], r in order
//                        (stats: each row's sum_exp, then its target logit; the summed loss)
//
// Shapes: every count is an int (the Device checks that sizes fit). tokens / targets are u32.
// No shared memory except sum_squares_f32 (8 f64, its per-warp totals).
//
// Reference: src/device/kernels.rs (`layernorm_*_rows`, `gelu_*_slice`, `embedding_*`,
// `position_*`, `cross_entropy_*_row`, `add_bias_rows`) through the reference device, compared
// op by op by tests/cuda_device.rs under the SIMT emulation (kernels-cuda/emu) behind the
// emulating fake driver (tests/gpu/emu_libcuda.cpp).
#include "common/base.cuh"
#include "common/gelu.cuh"
#include "common/reduce.cuh"

namespace tensor_ops_detail {

constexpr double kLayernormEps = 1e-5;
constexpr int kSumSquaresChunk = 8192;

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_WARP_MASK, v, offset);
  return v;
}
__device__ __forceinline__ double warp_max_f64(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double o = __shfl_xor_sync(FULL_WARP_MASK, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

// The first element index of this thread and the grid-wide stride of a grid-stride loop.
__device__ __forceinline__ int first_index() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int grid_stride() { return gridDim.x * blockDim.x; }

// The row a warp owns in a one-warp-per-row launch, and its lane.
__device__ __forceinline__ int warp_row() { return blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }
__device__ __forceinline__ int lane() { return threadIdx.x % 32; }

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

// ---- one warp per row ------------------------------------------------------------------------

extern "C" __global__ void layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int rows, int cols) {
  const int r = warp_row();
  if (r >= rows) return;  // the whole warp leaves together
  const float* x = inp + (size_t)r * cols;
  double s = 0.0;
  for (int c = lane(); c < cols; c += 32) s += x[c];
  const double mu = warp_sum_f64(s) / cols;
  double q = 0.0;
  for (int c = lane(); c < cols; c += 32) q += (x[c] - mu) * (x[c] - mu);
  const double var = warp_sum_f64(q) / cols;
  const float muf = float(mu), rs = float(1.0 / sqrt(var + kLayernormEps));
  for (int c = lane(); c < cols; c += 32) out[(size_t)r * cols + c] = (x[c] - muf) * rs * weight[c] + bias[c];
  if (lane() == 0) {
    mean[r] = muf;
    rstd[r] = rs;
  }
}

extern "C" __global__ void layernorm_bwd_dx_f32(float* dinp, const float* dout, const float* inp, const float* weight,
                                                const float* mean, const float* rstd, int rows, int cols) {
  const int r = warp_row();
  if (r >= rows) return;
  const float *x = inp + (size_t)r * cols, *dy = dout + (size_t)r * cols;
  const float mu = mean[r], rs = rstd[r];
  double sg = 0.0, sgx = 0.0;
  for (int c = lane(); c < cols; c += 32) {
    const float g = dy[c] * weight[c], xhat = (x[c] - mu) * rs;
    sg += g;
    sgx += (double)g * xhat;
  }
  const float mean_g = float(warp_sum_f64(sg) / cols), mean_gx = float(warp_sum_f64(sgx) / cols);
  for (int c = lane(); c < cols; c += 32) {
    const float xhat = (x[c] - mu) * rs;
    dinp[(size_t)r * cols + c] += rs * (dy[c] * weight[c] - mean_g - xhat * mean_gx);
  }
}

extern "C" __global__ void layernorm_sums_f32(double* out, const float* inp, const double* mean, int rows, int cols) {
  const int r = warp_row();
  if (r >= rows) return;
  const float* x = inp + (size_t)r * cols;
  double s = 0.0;
  if (mean) {
    const double mu = mean[r];
    for (int c = lane(); c < cols; c += 32) s += (x[c] - mu) * (x[c] - mu);
  } else {
    for (int c = lane(); c < cols; c += 32) s += x[c];
  }
  s = warp_sum_f64(s);
  if (lane() == 0) out[r] = s;
}

extern "C" __global__ void layernorm_bwd_sums_f32(double* out, const float* dout, const float* inp,
                                                  const float* weight, const float* mean, const float* rstd, int rows,
                                                  int cols) {
  const int r = warp_row();
  if (r >= rows) return;
  const float *x = inp + (size_t)r * cols, *dy = dout + (size_t)r * cols;
  double sg = 0.0, sgx = 0.0;
  for (int c = lane(); c < cols; c += 32) {
    const double xhat = (x[c] - mean[r]) * rstd[r], g = dy[c] * weight[c];
    sg += g;
    sgx += g * xhat;
  }
  sg = warp_sum_f64(sg);
  sgx = warp_sum_f64(sgx);
  if (lane() == 0) {
    out[2 * r] = sg;
    out[2 * r + 1] = sgx;
  }
}

extern "C" __global__ void xent_max_f32(double* max, const float* logits, int rows, int V) {
  const int r = warp_row();
  if (r >= rows) return;
  double m = -INFINITY;
  for (int v = lane(); v < V; v += 32) {
    const double l = logits[(size_t)r * V + v];
    m = l > m ? l : m;
  }
  m = warp_max_f64(m);
  if (lane() == 0) max[r] = m;
}

extern "C" __global__ void xent_partials_f32(double* sum_exp, double* target_logit, const float* logits,
                                             const uint32_t* targets, int vocab_start, const double* max, int rows,
                                             int V) {
  const int r = warp_row();
  if (r >= rows) return;
  const double m = max[r];
  double s = 0.0;
  for (int v = lane(); v < V; v += 32) s += exp((double)logits[(size_t)r * V + v] - m);
  s = warp_sum_f64(s);
  if (lane() == 0) {
    const int t = local_row(targets[r], vocab_start, V);
    sum_exp[r] = s;
    target_logit[r] = t >= 0 ? (double)logits[(size_t)r * V + t] : 0.0;
  }
}

// ---- fixed-size blocks -----------------------------------------------------------------------

// Blocks of 256 threads; block blk sums the squares of its 8192-element chunk into partials[blk].
extern "C" __global__ void __launch_bounds__(256) sum_squares_f32(double* partials, const unsigned long long* tensors,
                                                                 const int* lens, const int* first_block, int count) {
  __shared__ double warp_totals[8];
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
  s = warp_sum_f64(s);
  if (lane() == 0) warp_totals[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < 8; ++w) total += warp_totals[w];
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
