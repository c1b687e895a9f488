// tensor_ops.cu: the f32-storage ops of the GPU Device (src/gpu/device.rs) besides the bf16
// GEMMs and attention, one source for CUDA and HIP (common/portable.h): every buffer of the
// Device is f32, so these read and write f32. Row and
// block reductions (LayerNorm statistics, split-LayerNorm sums, cross-entropy, sum of squares)
// accumulate in f64; column sums (the embedding, position, bias and LayerNorm parameter
// gradients) add in f32 with no float atomics, in an order fixed by the shape: the reference's
// row order (embedding, position, LayerNorm parameters) or fixed chunks of rows (the bias).
//
//   element-wise (grid-stride, any 1-D grid of 1-D blocks; launched as ⌈n/256⌉ blocks of 256, capped):
//     add_f32            out[i] = a[i] + b[i]
//     add_assign_f32     acc[i] += x[i]
//     add_bias_f32       out[r·cols + c] += bias[c]
//     bias_dropout_add_f32  out = resid + mask ∘ (x + bias) · scale (common/dropout.h's masks;
//                        bias read where has_bias)
//     dropout_f32        x = mask ∘ x · scale, in place
//     attention_merge_f32  (out, lse) of a block of context parallelism's blockwise attention
//                        become the attention over its keys and part_out/part_lse's (disjoint
//                        keys, src/device/blocks.rs's merge); item i = (row t·batch + b, head h)
//                        of positions·batch·heads, lse at (b·heads + h)·positions + t; an lse of
//                        -inf has no keys yet
//     round_bf16_f32     buf[i] = f32(bf16(buf[i])), round to nearest even, in place
//     gelu_fwd_f32       out[i] = gelu(inp[i])                  (common/gelu.h; erf != 0: the
//     gelu_bwd_f32       dinp[i] = dout[i] · gelu'(inp[i])       exact form, else the tanh one)
//     embedding_fwd_f32  out[t·batch + b] = wte[tokens[b·seq + t] - vocab_start], zero rows for
//                        tokens outside this vocabulary shard of vocab_rows rows
//     position_fwd_f32   out[p·batch + b] += wpe[t0 + p]       for p < positions
//     position_fwd_bf16  the same on bf16 rows, rounded once
//     layernorm_apply_f32  out = (x - mean_r)·rstd_r·w + b with the whole rows' f64 statistics
//                        (split LayerNorm), saving them as f32 in mean_out / rstd_out
//     layernorm_bwd_apply_dx_f32  dinp += rstd (dy·w - Σg/n - x̂ Σgx̂/n) from the whole rows' sums
//     xent_bwd_f32       logits[r][v] = scale · (exp(l - max_r) / sum_exp_r - [v == target_r])
//   one block per touched vocabulary row (grid (segments, ⌈hidden/256⌉) of 256):
//     embedding_bwd_f32  dwte[token - vocab_start][c] += dout[t·batch + b][c], positions in (t, b)
//                        order. The host groups the positions by row (plan::EmbeddingSegments):
//                        segment s adds positions[segment_starts[s] .. segment_starts[s+1]]
//                        (row indices t·batch + b, ascending) into row segment_rows[s]; rows
//                        outside this vocabulary shard have no segment. Each element's additions
//                        are the reference's, in its order: the same bits as one thread walking
//                        every position, with every touched row in parallel.
//   one thread per column, rows in order (deterministic, no atomics; grid ⌈cols/256⌉ of 256):
//     position_bwd_f32   dwpe[t0 + p][c] += Σ_b dout[p·batch + b][c]   (grid (⌈hidden/256⌉, positions))
//     layernorm_bwd_params_f32  dweight[c] += Σ_r dy·x̂, dbias[c] += Σ_r dy
//   fixed chunks of rows, a last block per strip of columns (grid (⌈cols/64⌉, ⌈rows/256⌉) of 256):
//     column_sum_add_f32 out[c] += Σ_r x[r][c]                 (the bias gradient)
//     column_sum_add_bf16  the same over a bf16 x (bf16 storage's dout), summed in f32
//                        Block (strip, chunk): columns 64·strip .. +64, rows 256·chunk .. +256;
//                        threads 64g .. 64g + 63 (row group g < 4) sum rows g, g + 4, .. of the
//                        chunk from 0 in order, and partials[chunk][c] = ((g0 + g1) + g2) + g3.
//                        The strip's last block (counters[strip], an atomic count after
//                        __threadfence) sums the partials the same way (group g the chunks g,
//                        g + 4, ..; then the 4 in order), adds that into out[c] and resets
//                        counters[strip] to 0. partials: f32 [⌈rows/256⌉][cols], uninitialised;
//                        counters: u32 [⌈cols/64⌉], zero before the launch and after it. Every
//                        addition's order is a function of (rows, cols) alone.
//   one wave per row, 4 rows per block of 4 waves (128 threads on CUDA, 256 on HIP; grid
//   ⌈rows/4⌉ on both), f64 lane partials and a butterfly over all kWaveSize lanes (starting at
//   common/reduce.h's first offset), so every lane holds the same row total:
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
//   one block of 1024 threads (grid 1), sums in an order fixed by the sizes alone, kept on the
//   device (the step's scalars: no host round trip). tree(v, n): within groups of n threads,
//   v[i] += v[i + h] for h = n/2 .. 1 in shared memory (no shuffles, so both vendors add alike):
//     sum_into_f64       for each tensor t in order: acc[slot] += Σ parts[first_block[t] ..
//                        first_block[t+1]] (the gradient norm's accumulator): tensors in rounds
//                        of 32, group g of 32 threads takes tensor 32·round + g, thread j its
//                        parts j, j + 32, .. in order, then tree(·, 32); thread 0 adds the
//                        round's totals to acc in tensor order
//     xent_loss_f64      acc[slot] += Σ_r ln(stats[r]) + max[r] - stats[rows + r] over the rows
//                        whose target is not kIgnoredTarget: thread i the
//                        rows i, i + 1024, .. in order, then tree(·, 1024)
//                        (stats: each row's sum_exp, then its target logit; the summed loss)
//
// Shapes: every count is an int (the Device checks that sizes fit). tokens / targets are u32.
// Shared memory: sum_squares_f32 (256 / kWaveSize f64, its per-wave totals: 8 on CUDA, 4 on HIP),
// column_sum_add_* (4 x 64 f32 and a flag), sum_into_f64 and xent_loss_f64 (1024 f64, the tree).
// No wave-size literal: lanes and waves come from kWaveSize (the 64-column strips, 4 row groups
// and 32-thread tensor groups are data layouts, the same on both vendors).
//
// Reference: src/device/kernels.rs (`layernorm_*_rows`, `gelu_*_slice`, `embedding_*`,
// `position_*`, `cross_entropy_*_row`, `add_bias_rows`) through the reference device, compared
// op by op by tests/cuda_device.rs and tests/hip_device.rs under the SIMT emulation behind the
// emulating runtimes (tests/gpu/emu_libcuda.cpp, tests/gpu/emu_libamdhip64.cpp), and kernel by
// kernel under the wave64 emulation (tests/hip_emulation.rs).
#include "common/portable.h"
#include "common/gelu.h"
#include "common/reduce.h"
#include "common/dropout.h"

namespace tensor_ops_detail {

constexpr double kLayernormEps = 1e-5;
constexpr int kSumSquaresChunk = 8192;

__device__ __forceinline__ double wave_sum_f64(double v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) v += shfl_xor(v, offset, kWaveSize);
  return v;
}
__device__ __forceinline__ double wave_max_f64(double v) {
  for (int offset = wave_first_offset(); offset > 0; offset >>= 1) {
    const double o = shfl_xor(v, offset, kWaveSize);
    v = o > v ? o : v;
  }
  return v;
}

// The first element index of this thread and the grid-wide stride of a grid-stride loop.
__device__ __forceinline__ int first_index() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int grid_stride() { return gridDim.x * blockDim.x; }

// The row a warp owns in a one-warp-per-row launch, and its lane.
__device__ __forceinline__ int wave_row() { return blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize; }
__device__ __forceinline__ int lane() { return threadIdx.x % kWaveSize; }

__device__ __forceinline__ int local_row(uint32_t token, int vocab_start, int vocab_rows) {
  const long long r = (long long)token - vocab_start;
  return r >= 0 && r < vocab_rows ? int(r) : -1;
}

// ---- column sums: fixed chunks and strips, a last block per strip ----------------------------
//
// column_sum_add_*: block (strip, chunk) of 256 threads = kColumnStrip columns x kColumnGroups row
// groups takes columns strip·64 .. +64 and rows chunk·256 .. +256; group g sums rows g, g + 4, ..
// of the chunk (in order, f32, from 0), and the block adds its 4 group sums in group order into
// partials[chunk][c]. The last block of a strip to finish (an atomic count on counters[strip],
// after __threadfence) sums the strip's partials the same way (group g the chunks g, g + 4, ..;
// then the 4 in order), adds that total to out[c] and sets counters[strip] back to 0. Every
// addition's order is a function of (rows, cols): the same bits on every launch and device.
constexpr int kColumnStrip = 64, kColumnGroups = 4, kColumnChunkRows = 256;

// Σ x[first], x[first + step], .. below end (f32, in order), the loads issued 8 at a time.
template <class T>
__device__ __forceinline__ float strided_column_sum(const T* x, size_t first, size_t end, size_t step) {
  float s = 0.0f;
  size_t i = first;
  for (; i + 7 * step < end; i += 8 * step) {
    float v[8];
    UNROLL for (int k = 0; k < 8; ++k) v[k] = to_float(x[i + k * step]);
    UNROLL for (int k = 0; k < 8; ++k) s += v[k];
  }
  for (; i < end; i += step) s += to_float(x[i]);
  return s;
}

template <class T>
__device__ __forceinline__ void column_sum_add(float* out, float* partials, unsigned int* counters, const T* x,
                                               int rows, int cols) {
  __shared__ float group_sums[kColumnGroups][kColumnStrip];
  __shared__ unsigned int last;
  const int col = threadIdx.x % kColumnStrip, group = threadIdx.x / kColumnStrip;
  const int c = blockIdx.x * kColumnStrip + col, chunks = gridDim.y;
  const size_t pitch = (size_t)cols, first = (size_t)blockIdx.y * kColumnChunkRows;
  const size_t end = first + kColumnChunkRows < (size_t)rows ? first + kColumnChunkRows : (size_t)rows;
  group_sums[group][col] =
      c < cols ? strided_column_sum(x, (first + group) * pitch + c, end * pitch, kColumnGroups * pitch) : 0.0f;
  __syncthreads();
  if (group == 0 && c < cols) {
    float chunk = 0.0f;
    UNROLL for (int g = 0; g < kColumnGroups; ++g) chunk += group_sums[g][col];
    partials[(size_t)blockIdx.y * pitch + c] = chunk;
  }
  // Publish the partials, then count this block finished; the strip's last block sums them.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned)chunks - 1;
  __syncthreads();
  if (!last) return;  // uniform over the block
  __threadfence();
  const volatile float* all = partials;  // written by other blocks: read past this SM's L1
  float s = 0.0f;
  if (c < cols)
    for (int k = group; k < chunks; k += kColumnGroups) s += all[(size_t)k * pitch + c];
  group_sums[group][col] = s;
  __syncthreads();
  if (group == 0 && c < cols) {
    float total = 0.0f;
    UNROLL for (int g = 0; g < kColumnGroups; ++g) total += group_sums[g][col];
    out[c] += total;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // every block of the strip has counted
}

// ---- the word-embedding gradient by segments -------------------------------------------------

// init + Σ g[positions[i]·hidden] for i in from .. end, in order (f32), the loads 16 at a time
// (a frequent token's segment is a chain of hundreds of rows: its latency is the kernel's tail).
__device__ __forceinline__ float segment_sum(float init, const float* g, const int* positions, int from, int end,
                                             int hidden) {
  float s = init;
  int i = from;
  for (; i + 16 <= end; i += 16) {
    float v[16];
    UNROLL for (int k = 0; k < 16; ++k) v[k] = g[(size_t)positions[i + k] * hidden];
    UNROLL for (int k = 0; k < 16; ++k) s += v[k];
  }
  for (; i < end; ++i) s += g[(size_t)positions[i] * hidden];
  return s;
}

// ---- the step's scalars: one block of kScalarThreads, fixed trees ------------------------------

constexpr int kScalarThreads = 1024, kScalarGroup = 32;

// Σ v[first], v[first + step], .. below end (f64, in order), the loads 8 at a time.
__device__ __forceinline__ double strided_sum(const double* v, int first, int end, int step) {
  double s = 0.0;
  int i = first;
  for (; i + 7 * step < end; i += 8 * step) {
    double x[8];
    UNROLL for (int k = 0; k < 8; ++k) x[k] = v[i + k * step];
    UNROLL for (int k = 0; k < 8; ++k) s += x[k];
  }
  for (; i < end; i += step) s += v[i];
  return s;
}

// In place over shared `sums` (one per thread of the block), within groups of `size` threads (a
// power of two dividing blockDim.x): sums[i] += sums[i + h] for h = size/2 .. 1, a barrier after
// each step, so sums[group·size] holds the group's total, added in an order fixed by `size`.
// Every thread of the block must call it; it ends with a barrier.
__device__ __forceinline__ void tree_sum(double* sums, int size) {
  __syncthreads();
  for (int h = size / 2; h > 0; h /= 2) {
    if ((int)threadIdx.x % size < h) sums[threadIdx.x] += sums[threadIdx.x + h];
    __syncthreads();
  }
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

extern "C" __global__ void attention_merge_f32(float* out, float* lse, const float* part_out, const float* part_lse,
                                               int batch, int positions, int heads, int d) {
  const int n = positions * batch * heads;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int head = i % heads, row = i / heads, t = row / batch, b = row % batch;
    const size_t l = ((size_t)b * heads + head) * positions + t, at = (size_t)i * d;
    const float a = lse[l], p = part_lse[l], m = fmaxf(a, p);
    const float merged = m + logf(expf(a - m) + expf(p - m));
    const float wa = expf(a - merged), wp = expf(p - merged);
    for (int c = 0; c < d; ++c) out[at + c] = out[at + c] * wa + part_out[at + c] * wp;
    lse[l] = merged;
  }
}

extern "C" __global__ void add_bias_f32(float* out, const float* bias, int rows, int cols) {
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) out[i] += bias[i % cols];
}

extern "C" __global__ void bias_dropout_add_f32(float* out, const float* resid, const float* x, const float* bias,
                                                int has_bias, int rows, int cols, int d_threshold, float d_scale, int d_key0,
                                                int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                                int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                                int d_col0, int d_jump_at, int d_jump_by) {
  const DropoutSite d = DROPOUT_ROWS_SITE;
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) {
    const int r = i / cols, c = i % cols;
    const float v = has_bias ? x[i] + bias[c] : x[i];
    out[i] = d.keeps(d.hidden_index(r, c)) ? resid[i] + v * d.scale : resid[i];
  }
}

extern "C" __global__ void dropout_f32(float* x, int rows, int cols, int d_threshold, float d_scale, int d_key0,
                                       int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                       int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                       int d_col0, int d_jump_at, int d_jump_by) {
  const DropoutSite d = DROPOUT_ROWS_SITE;
  const int n = rows * cols;
  for (int i = first_index(); i < n; i += grid_stride()) {
    x[i] = d.keeps(d.hidden_index(i / cols, i % cols)) ? x[i] * d.scale : 0.0f;
  }
}

extern "C" __global__ void round_bf16_f32(float* buf, int n) {
  for (int i = first_index(); i < n; i += grid_stride()) buf[i] = to_float(to_bf16(buf[i]));
}

extern "C" __global__ void gelu_fwd_f32(float* out, const float* inp, int n, int erf) {
  for (int i = first_index(); i < n; i += grid_stride()) out[i] = gelu_of(inp[i], erf);
}

extern "C" __global__ void gelu_bwd_f32(float* dinp, const float* inp, const float* dout, int n, int erf) {
  for (int i = first_index(); i < n; i += grid_stride()) dinp[i] = dout[i] * gelu_grad_of(inp[i], erf);
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
    const float s = targets[r] == kIgnoredTarget ? 0.0f : scale;  // an ignored row's gradient is 0
    const float inv = s / float(sum_exp[r]);
    float g = expf(logits[i] - float(max[r])) * inv;
    if (local_row(targets[r], vocab_start, V) == v) g -= s;
    logits[i] = g;
  }
}

// ---- one block per touched vocabulary row ----------------------------------------------------

// The word-embedding gradient, one block per (segment, strip of 256 columns): the segment's
// vocabulary row gets its positions' gradient rows added to it in their (t, b) order, the
// reference's order, while every touched row runs in parallel.
extern "C" __global__ void __launch_bounds__(256)
    embedding_bwd_f32(float* dwte, const float* dout, const int* segment_rows, const int* segment_starts,
                      const int* positions, int hidden) {
  const int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  float* d = dwte + (size_t)segment_rows[s] * hidden + c;
  *d = segment_sum(*d, dout + c, positions, segment_starts[s], segment_starts[s + 1], hidden);
}

// ---- one thread per column -------------------------------------------------------------------

extern "C" __global__ void position_bwd_f32(float* dwpe, const float* dout, int batch, int t0, int positions,
                                            int hidden) {
  const int c = first_index(), p = blockIdx.y;
  if (c >= hidden || p >= positions) return;
  float acc = dwpe[(size_t)(t0 + p) * hidden + c];
  for (int b = 0; b < batch; ++b) acc += dout[(size_t)(p * batch + b) * hidden + c];
  dwpe[(size_t)(t0 + p) * hidden + c] = acc;
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

// ---- column sums: fixed chunks of rows, the last block of a strip adds them ------------------

// registry: static_shared=1028
extern "C" __global__ void __launch_bounds__(256)
    column_sum_add_f32(float* out, float* partials, unsigned int* counters, const float* x, int rows, int cols) {
  column_sum_add(out, partials, counters, x, rows, cols);
}

// The bias gradient from a bf16 dout (bf16 storage), summed in f32 in column_sum_add's order.
// registry: static_shared=1028
extern "C" __global__ void __launch_bounds__(256)
    column_sum_add_bf16(float* out, float* partials, unsigned int* counters, const bf16* x, int rows, int cols) {
  column_sum_add(out, partials, counters, x, rows, cols);
}

// ---- one warp per row ------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* inp,
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

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    layernorm_bwd_dx_f32(float* dinp, const float* dout, const float* inp, const float* weight,
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

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    layernorm_sums_f32(double* out, const float* inp, const double* mean, int rows, int cols) {
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

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    layernorm_bwd_sums_f32(double* out, const float* dout, const float* inp,
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

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    xent_max_f32(double* max, const float* logits, int rows, int V) {
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

// One block per SM is all ptxas is told to plan for: with the bound alone it spills 8 bytes on
// sm_90a (40 registers; 34 and no spill with this).
extern "C" __global__ void __launch_bounds__(4 * kWaveSize CUDA_MIN_BLOCKS(1))
    xent_partials_f32(double* sum_exp, double* target_logit, const float* logits,
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

// Blocks of 256 threads; block blk sums the squares of its 8192-element chunk into partials[blk].
// registry: static_shared=64
extern "C" __global__ void __launch_bounds__(256) sum_squares_f32(double* partials, const unsigned long long* tensors,
                                                                 const int* lens, const int* first_block, int count) {
  __shared__ double wave_totals[256 / kWaveSize];
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
    for (int w = 0; w < 256 / kWaveSize; ++w) total += wave_totals[w];
    partials[blockIdx.x] = total;
  }
}

// ---- one block of 1024: the step's scalars ----------------------------------------------------

// For each tensor t in order: acc[slot] += Σ parts[first_block[t] .. first_block[t+1]]. Rounds of
// 32 tensors: group g (threads 32g .. 32g + 31) sums tensor 32·round + g (thread j the parts j,
// j + 32, .. in order, then the group's tree), and thread 0 adds the round's totals in tensor order.
// registry: static_shared=8192
extern "C" __global__ void __launch_bounds__(1024)
    sum_into_f64(double* acc, int slot, const double* parts, const int* first_block, int count) {
  __shared__ double sums[kScalarThreads];
  const int group = threadIdx.x / kScalarGroup, j = threadIdx.x % kScalarGroup;
  const int groups = blockDim.x / kScalarGroup;
  double total = threadIdx.x == 0 ? acc[slot] : 0.0;
  for (int first = 0; first < count; first += groups) {
    const int t = first + group;
    double s = 0.0;
    if (t < count) s = strided_sum(parts, first_block[t] + j, first_block[t + 1], kScalarGroup);
    sums[threadIdx.x] = s;
    tree_sum(sums, kScalarGroup);
    if (threadIdx.x == 0)
      for (int g = 0; g < groups && first + g < count; ++g) total += sums[g * kScalarGroup];
    __syncthreads();  // thread 0 has read this round's totals before the next round overwrites them
  }
  if (threadIdx.x == 0) acc[slot] = total;
}

// acc[slot] += Σ_r ln(stats[r]) + max[r] - stats[rows + r] over the rows whose target is not
// kIgnoredTarget (every row when targets is null: no target is): thread i the rows i, i + 1024,
// .. in order, then the block's tree.
// registry: static_shared=8192
extern "C" __global__ void __launch_bounds__(1024)
    xent_loss_f64(double* acc, int slot, const double* max, const double* stats, const uint32_t* targets, int rows) {
  __shared__ double sums[kScalarThreads];
  double s = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x)
    if (!targets || targets[r] != kIgnoredTarget) s += log(stats[r]) + max[r] - stats[rows + r];
  sums[threadIdx.x] = s;
  tree_sum(sums, blockDim.x);
  if (threadIdx.x == 0) acc[slot] += sums[0];
}
