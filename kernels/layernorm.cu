// layernorm.cu: LayerNorm (and RMSNorm, below) forward (LayerNorm optionally fused with the
// residual add before it), one wave per row, and backward, one launch of a few hundred blocks
// owning contiguous row ranges. One source for CUDA and HIP (common/portable.h): a wave is a
// 32-lane warp or a 64-lane AMD wavefront (kWaveSize), a block a CUDA block or a HIP workgroup.
//
// Forward  layernorm_fwd_bf16:  x = inp (+ residual, rounded to bf16 and stored in resid_out);
//          out = (x - mean) · rstd · weight + bias, mean = Σx / C, rstd = 1 / sqrt(Σ(x - mean)² / C + 1e-5)
//          inp, residual, resid_out, out [rows, C] bf16; weight, bias [C] f32; mean, rstd [rows] f32
//          (saved for backward). residual and resid_out are both null or both set.
// Backward layernorm_bwd_bf16 (one launch): dinp += rstd · (g - mean(g) - x̂ · mean(g · x̂)),
//          g = dout · weight, x̂ = (inp - mean) · rstd; dinp [rows, C] bf16, accumulated (the
//          residual stream's gradient: the stored value plus the f32 gradient, rounded once);
//          dweight[c] += Σ_rows dout · x̂, dbias[c] += Σ_rows dout, f32 [C], deterministic: each
//          block sums its rows' terms per column in row order into its slot of `partials`; the
//          last block of each group of kLnGroup blocks to finish (an atomic count on
//          counters[group], after __threadfence) adds its group's slots in block order into the
//          group's slot and sets counters[group] back to 0; the last group to finish (counted on
//          counters[groups]) adds the group slots in group order into dweight and dbias and sets
//          that counter back to 0 (the caller zeroes the counters once, when it allocates them).
//          No float atomics: the same bits every run.
//
// Vector width. When C % 8 == 0 and dout, inp, dinp, weight (forward: inp, out, weight, bias, and
// residual, resid_out when set) start on 16 bytes, every row access is 8 bf16 (16 bytes) per lane
// and the backward's column walk takes 2 adjacent columns (4 bytes) per thread; otherwise one
// element at a time (any C, any alignment). The block decides once; the sums' grouping follows.
//
// Grid: forward: ⌈rows/4⌉ blocks of 4 waves (128 threads on CUDA, 256 on HIP), wave w of block
// b owns row 4b + w and strides over its columns by kWaveSize lanes (three passes: sum, squared
// deviations, output, so the variance is two-pass and exact in f32); statistics come from
// wave_sum butterflies (common/reduce.h).
// Backward: src/gpu/kernels/plan/mod.rs's layernorm_bwd_blocks(rows, C) blocks of 512 threads (one per
// 32 rows, at most 256, and fewer the wider the rows so the partials stay a few MiB; 16 warps or 8
// wavefronts); block b owns rows b·⌈rows/blocks⌉ .. (the last blocks may own none) and takes them
// kLnPassRows at a time: (1) wave w takes the pass's rows w, w + waves, ..: reads its row (dout,
// inp, weight) for mean(g) and mean(g·x̂) (wave_sum), reads it again (from L1) with dinp and stores
// dinp, and keeps the row's mean and rstd in shared memory; (2) thread t takes columns P·t, P·(t + 512), .. and walks the pass's
// rows in order, summing dout · x̂ and dout (L1 hits) into its slot (the block's first pass stores,
// later passes add).
// partials: f32 [blocks + groups][2][C] (each block's dweight then dbias column sums, then each
// group's), groups = ⌈blocks / kLnGroup⌉: layernorm_bwd_partials(rows, C) elements; counters: u32
// [groups + 1]. Shared memory: 2 x kLnPassRows f32 and one flag (260 bytes) whatever C (GPT-3
// 175B's 12288 included); on CUDA at most 64 registers (two blocks of 512 per SM).
//
// RMSNorm (Llama's), the same shapes and grids without the mean and the bias:
// Forward  rmsnorm_fwd_bf16:  out = x · rstd · weight, rstd = 1 / sqrt(Σx² / C + eps) (eps an
//          argument); inp, out [rows, C] bf16; weight [C] f32; rstd [rows] f32 (saved). One wave
//          per row as above, two passes (Σx², output).
// Backward rmsnorm_bwd_bf16 (one launch): dinp += rstd · (g - x̂ · mean(g · x̂)), g = dout · weight,
//          x̂ = inp · rstd (bf16 dinp "+=", rounded once); dweight[c] += Σ_rows dout · x̂ (f32),
//          deterministic exactly as layernorm_bwd_bf16's: the same grid (layernorm_bwd_blocks),
//          passes, counters and two-level last-block sum, over slots of one column sum each
//          (partials: [blocks + groups][C] f32, within layernorm_bwd_partials(rows, C)).
//
// Reference: `layernorm_forward_rows` / `layernorm_backward_rows` in src/device/kernels.rs via the
// reference device (f64), on the same bf16 inputs; the fused residual against the reference
// device's `add` then a bf16 rounding (tests/cuda_emulation.rs, tests/hip_emulation.rs); RMSNorm:
// src/device/llama.rs's `rmsnorm_forward_rows` / `rmsnorm_backward_rows` (`check ops`,
// tests/cuda_device.rs, tests/hip_device.rs).
#include "common/portable.h"
#include "common/reduce.h"

#define LAYERNORM_EPS 1e-5f

// The backward's rows per pass (phase 1 then 2) and blocks per group of the partials' first-level
// sum (plan/mod.rs's LAYERNORM_BWD_PASS_ROWS, LAYERNORM_BWD_GROUP).
constexpr int kLnPassRows = 32, kLnGroup = 16;

// Loop unrolling by a fixed factor on the GPU, so the loads of several iterations are in flight
// at once; the host build ignores it. The backward's column walk stays rolled on HIP (UNROLL_4
// is CUDA's only: unrolled, it needs more than gfx90a's SGPRs).
#ifdef TRIDENT_EMU
#define UNROLL_2
#define UNROLL_4
#else
#define UNROLL_2 _Pragma("unroll 2")
#ifdef TRIDENT_CUDA
#define UNROLL_4 _Pragma("unroll 4")
#else
#define UNROLL_4
#endif
#endif

namespace ln_detail {

struct alignas(4) Bf16x2 {
  bf16 v[2];
};

// V consecutive elements at p (V = 8: one 16-byte access, p 16-byte aligned; V = 2: 4 bytes; V = 1).
template <int V>
__device__ __forceinline__ void load(const bf16* p, float (&v)[V]) {
  if constexpr (V == 8) {
    const bf16x8 x = *reinterpret_cast<const bf16x8*>(p);
    UNROLL for (int e = 0; e < 8; ++e) v[e] = to_float(x.v[e]);
  } else if constexpr (V == 2) {
    const Bf16x2 x = *reinterpret_cast<const Bf16x2*>(p);
    v[0] = to_float(x.v[0]);
    v[1] = to_float(x.v[1]);
  } else {
    v[0] = to_float(*p);
  }
}
template <int V>
__device__ __forceinline__ void load(const float* p, float (&v)[V]) {
  if constexpr (V == 8) {
    const F32x4 lo = reinterpret_cast<const F32x4*>(p)[0], hi = reinterpret_cast<const F32x4*>(p)[1];
    UNROLL for (int e = 0; e < 4; ++e) {
      v[e] = lo.v[e];
      v[4 + e] = hi.v[e];
    }
  } else {
    v[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store(bf16* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    bf16x8 x;
    UNROLL for (int e = 0; e < 8; ++e) x.v[e] = to_bf16(v[e]);
    *reinterpret_cast<bf16x8*>(p) = x;
  } else {
    *p = to_bf16(v[0]);
  }
}

// The forward of one row on one warp, V elements per lane access (lane takes columns
// V·lane + 32·V·k .. + V).
template <int V>
__device__ __forceinline__ void forward_row(bf16* out, float* mean, float* rstd, bf16* resid_out, const bf16* inp,
                                            const bf16* residual, const float* weight, const float* bias, int row,
                                            int C, int lane) {
  const size_t base = (size_t)row * C;
  // Pass 1: the row's sum; with a residual, form x = inp + residual once and store it rounded,
  // so the statistics, the output and the backward pass all see the stored value.
  float sum = 0.0f;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float x[V];
    load<V>(inp + base + c, x);
    if (residual) {
      float r[V];
      load<V>(residual + base + c, r);
      UNROLL for (int e = 0; e < V; ++e) x[e] = to_float(to_bf16(x[e] + r[e]));
      store<V>(resid_out + base + c, x);
    }
    UNROLL for (int e = 0; e < V; ++e) sum += x[e];
  }
  const bf16* xs = residual ? resid_out : inp;  // this lane reads back only what it wrote
  const float mu = wave_sum(sum) / C;
  float sq = 0.0f;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float x[V];
    load<V>(xs + base + c, x);
    UNROLL for (int e = 0; e < V; ++e) sq += (x[e] - mu) * (x[e] - mu);
  }
  const float rs = rsqrtf(wave_sum(sq) / C + LAYERNORM_EPS);
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float x[V], w[V], b[V];
    load<V>(xs + base + c, x);
    load<V>(weight + c, w);
    load<V>(bias + c, b);
    UNROLL for (int e = 0; e < V; ++e) x[e] = (x[e] - mu) * rs * w[e] + b[e];
    store<V>(out + base + c, x);
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

}  // namespace ln_detail

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    layernorm_fwd_bf16(bf16* out, float* mean, float* rstd, bf16* resid_out, const bf16* inp, const bf16* residual,
                       const float* weight, const float* bias, int rows, int C) {
  using namespace ln_detail;
  const int row = blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  if (row >= rows) return;  // the whole wave leaves together
  const bool wide = C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias) &&
                    (!residual || (aligned16(residual) && aligned16(resid_out)));
  if (wide)
    forward_row<8>(out, mean, rstd, resid_out, inp, residual, weight, bias, row, C, lane);
  else
    forward_row<1>(out, mean, rstd, resid_out, inp, residual, weight, bias, row, C, lane);
}

namespace ln_detail {

// Phase 1 of a backward pass on one warp: row `row`'s mean(g) and mean(g·x̂) from dout, inp and
// weight, then dinp += rstd · (g - mean(g) - x̂ · mean(g·x̂)) on a second read (L1 hits).
template <int V>
__device__ __forceinline__ void backward_row(bf16* dinp, const bf16* dout, const bf16* inp, const float* weight,
                                             float mu, float rs, int row, int C, int lane) {
  const size_t base = (size_t)row * C;
  float sum_g = 0.0f, sum_gx = 0.0f;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float dy[V], x[V], w[V];
    load<V>(dout + base + c, dy);
    load<V>(inp + base + c, x);
    load<V>(weight + c, w);
    UNROLL for (int e = 0; e < V; ++e) {
      const float g = dy[e] * w[e];
      sum_g += g;
      sum_gx += g * (x[e] - mu) * rs;
    }
  }
  const float mean_g = wave_sum(sum_g) / C, mean_gx = wave_sum(sum_gx) / C;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float dy[V], x[V], w[V], dx[V];
    load<V>(dout + base + c, dy);
    load<V>(inp + base + c, x);
    load<V>(weight + c, w);
    load<V>(dinp + base + c, dx);
    UNROLL for (int e = 0; e < V; ++e) dx[e] += rs * (dy[e] * w[e] - mean_g - (x[e] - mu) * rs * mean_gx);
    store<V>(dinp + base + c, dx);
  }
}

// The block's rows [first, end), kLnPassRows per pass: phase 1 (backward_row, V elements per lane
// access; each row's mean and rstd into shared memory), then phase 2: thread t sums the pass's
// rows' dout · x̂ and dout for columns P·t .. + P, P·(t + blockDim) .., in row order, into `mine`
// (the block's slot: [2][C]), storing on the first pass and adding on later ones. At least one
// pass runs, so a block that owns no rows stores zeros. pass_mean, pass_rstd: kLnPassRows floats
// of shared memory each.
template <int V, int P>
__device__ __forceinline__ void backward_rows(float* mine, float* pass_mean, float* pass_rstd, bf16* dinp,
                                              const bf16* dout, const bf16* inp, const float* weight,
                                              const float* mean, const float* rstd, int first, int end, int C) {
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize, waves = blockDim.x / kWaveSize;
  for (int from = first;; from += kLnPassRows) {
    const int n = end - from < kLnPassRows ? end - from : kLnPassRows;
    for (int r = wave; r < n; r += waves) {
      const float mu = mean[from + r], rs = rstd[from + r];
      backward_row<V>(dinp, dout, inp, weight, mu, rs, from + r, C, lane);
      if (lane == 0) {
        pass_mean[r] = mu;
        pass_rstd[r] = rs;
      }
    }
    __syncthreads();  // the pass's statistics are in shared memory
    for (int c = P * threadIdx.x; c < C; c += P * blockDim.x) {
      float dw[P] = {}, db[P] = {};
      UNROLL_4 for (int r = 0; r < n; ++r) {
        float dy[P], x[P];
        load<P>(dout + (size_t)(from + r) * C + c, dy);
        load<P>(inp + (size_t)(from + r) * C + c, x);
        UNROLL for (int e = 0; e < P; ++e) {
          dw[e] += dy[e] * ((x[e] - pass_mean[r]) * pass_rstd[r]);
          db[e] += dy[e];
        }
      }
      UNROLL for (int e = 0; e < P; ++e) {
        mine[c + e] = from == first ? dw[e] : mine[c + e] + dw[e];
        mine[C + c + e] = from == first ? db[e] : mine[C + c + e] + db[e];
      }
    }
    if (from + kLnPassRows >= end) break;  // uniform over the block
    __syncthreads();  // phase 2 is done with the statistics before the next pass replaces them
  }
}

// Publishes the block's global writes, counts the block on *counter and says, to every thread,
// whether it was the last of the `count` blocks counted there; that one then sees what every
// counted block wrote. `flag`: one word of shared memory. Every thread of the block must call it.
__device__ __forceinline__ bool last_to_count(unsigned int* counter, unsigned int count, unsigned int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(counter, 1u) == count - 1;
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// Σ_{k < count} slots[k·pitch + i], k in order, the loads (volatile: other blocks wrote them, read
// past this SM's L1) issued 8 at a time.
__device__ __forceinline__ float slot_sum(const volatile float* slots, size_t pitch, int count, size_t i) {
  float s = 0.0f;
  int k = 0;
  for (; k + 8 <= count; k += 8) {
    float v[8];
    UNROLL for (int j = 0; j < 8; ++j) v[j] = slots[(size_t)(k + j) * pitch + i];
    UNROLL for (int j = 0; j < 8; ++j) s += v[j];
  }
  for (; k < count; ++k) s += slots[(size_t)k * pitch + i];
  return s;
}

// The first level of the backward's partial sums, after the block stored its slot (pitch floats)
// in partials: publishes the slot and counts the block finished in its group of kLnGroup; the
// group's last block sums the group's slots in block order into the group's slot (after the
// blocks' slots), sets its counter back to 0, publishes that and counts the group finished.
// Says, to every thread, whether this block is the last group's: it then sees every group's slot
// and adds them (slot_sum over the groups) and resets counters[groups]. `last`: one word of
// shared memory. Every thread of the block must call it.
__device__ __forceinline__ bool last_of_all_groups(float* partials, unsigned int* counters, size_t pitch,
                                                   unsigned int* last) {
  const int blocks = (int)gridDim.x, groups = (blocks + kLnGroup - 1) / kLnGroup, group = (int)blockIdx.x / kLnGroup;
  const int members = blocks - group * kLnGroup < kLnGroup ? blocks - group * kLnGroup : kLnGroup;
  if (!last_to_count(&counters[group], members, last)) return false;  // uniform over the block
  float* group_slot = partials + ((size_t)blocks + group) * pitch;
  for (size_t i = threadIdx.x; i < pitch; i += blockDim.x)
    group_slot[i] = slot_sum(partials + (size_t)group * kLnGroup * pitch, pitch, members, i);
  if (threadIdx.x == 0) counters[group] = 0;  // every block of the group has counted
  return last_to_count(&counters[groups], groups, last);
}

}  // namespace ln_detail

// One launch per LayerNorm backward (grid, partials and counters above): the block's rows in
// passes (backward_rows), then the two-level last-block sum of the column partials.
// registry: static_shared=260
extern "C" __global__ void __launch_bounds__(512 CUDA_MIN_BLOCKS(2))
    layernorm_bwd_bf16(bf16* dinp, float* dweight, float* dbias, float* partials, unsigned int* counters,
                       const bf16* dout, const bf16* inp, const float* weight, const float* mean, const float* rstd,
                       int rows, int C) {
  using namespace ln_detail;
  __shared__ float pass_mean[kLnPassRows], pass_rstd[kLnPassRows];
  __shared__ unsigned int last;
  const int blocks = (int)gridDim.x, per_block = (rows + blocks - 1) / blocks;
  const long long from = (long long)blockIdx.x * per_block, to = from + per_block;
  const int first = from < rows ? (int)from : rows, end = to < rows ? (int)to : rows;
  const size_t pitch = 2 * (size_t)C;
  float* mine = partials + blockIdx.x * pitch;
  if (C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight))
    backward_rows<8, 2>(mine, pass_mean, pass_rstd, dinp, dout, inp, weight, mean, rstd, first, end, C);
  else
    backward_rows<1, 1>(mine, pass_mean, pass_rstd, dinp, dout, inp, weight, mean, rstd, first, end, C);
  const int groups = (blocks + kLnGroup - 1) / kLnGroup;
  if (!last_of_all_groups(partials, counters, pitch, &last)) return;  // uniform over the block
  for (size_t i = threadIdx.x; i < pitch; i += blockDim.x) {
    const float s = slot_sum(partials + (size_t)blocks * pitch, pitch, groups, i);
    if (i < (size_t)C)
      dweight[i] += s;
    else
      dbias[i - C] += s;
  }
  if (threadIdx.x == 0) counters[groups] = 0;  // every group has counted: ready for the next launch
}

namespace ln_detail {

// RMSNorm's forward of one row on one warp (forward_row without the mean and the bias).
template <int V>
__device__ __forceinline__ void rms_forward_row(bf16* out, float* rstd, const bf16* inp, const float* weight,
                                                float eps, int row, int C, int lane) {
  const size_t base = (size_t)row * C;
  float sq = 0.0f;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float x[V];
    load<V>(inp + base + c, x);
    UNROLL for (int e = 0; e < V; ++e) sq += x[e] * x[e];
  }
  const float rs = rsqrtf(wave_sum(sq) / C + eps);
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float x[V], w[V];
    load<V>(inp + base + c, x);
    load<V>(weight + c, w);
    UNROLL for (int e = 0; e < V; ++e) x[e] = x[e] * rs * w[e];
    store<V>(out + base + c, x);
  }
  if (lane == 0) rstd[row] = rs;
}

}  // namespace ln_detail

extern "C" __global__ void __launch_bounds__(4 * kWaveSize)
    rmsnorm_fwd_bf16(bf16* out, float* rstd, const bf16* inp, const float* weight, int rows, int C, float eps) {
  using namespace ln_detail;
  const int row = blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  if (row >= rows) return;  // the whole wave leaves together
  if (C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight))
    rms_forward_row<8>(out, rstd, inp, weight, eps, row, C, lane);
  else
    rms_forward_row<1>(out, rstd, inp, weight, eps, row, C, lane);
}

namespace ln_detail {

// RMSNorm's phase 1 on one warp: mean(g·x̂), then dinp += rstd · (g - x̂ · mean(g·x̂)).
template <int V>
__device__ __forceinline__ void rms_backward_row(bf16* dinp, const bf16* dout, const bf16* inp, const float* weight,
                                                 float rs, int row, int C, int lane) {
  const size_t base = (size_t)row * C;
  float sum_gx = 0.0f;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float dy[V], x[V], w[V];
    load<V>(dout + base + c, dy);
    load<V>(inp + base + c, x);
    load<V>(weight + c, w);
    UNROLL for (int e = 0; e < V; ++e) sum_gx += dy[e] * w[e] * (x[e] * rs);
  }
  const float mean_gx = wave_sum(sum_gx) / C;
  UNROLL_2 for (int c = V * lane; c < C; c += kWaveSize * V) {
    float dy[V], x[V], w[V], dx[V];
    load<V>(dout + base + c, dy);
    load<V>(inp + base + c, x);
    load<V>(weight + c, w);
    load<V>(dinp + base + c, dx);
    UNROLL for (int e = 0; e < V; ++e) dx[e] += rs * (dy[e] * w[e] - x[e] * rs * mean_gx);
    store<V>(dinp + base + c, dx);
  }
}

// backward_rows for RMSNorm: the block's rows in passes, one column sum (dout · x̂) per slot.
template <int V, int P>
__device__ __forceinline__ void rms_backward_rows(float* mine, float* pass_rstd, bf16* dinp, const bf16* dout,
                                                  const bf16* inp, const float* weight, const float* rstd, int first,
                                                  int end, int C) {
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize, waves = blockDim.x / kWaveSize;
  for (int from = first;; from += kLnPassRows) {
    const int n = end - from < kLnPassRows ? end - from : kLnPassRows;
    for (int r = wave; r < n; r += waves) {
      const float rs = rstd[from + r];
      rms_backward_row<V>(dinp, dout, inp, weight, rs, from + r, C, lane);
      if (lane == 0) pass_rstd[r] = rs;
    }
    __syncthreads();  // the pass's statistics are in shared memory
    for (int c = P * threadIdx.x; c < C; c += P * blockDim.x) {
      float dw[P] = {};
      UNROLL_4 for (int r = 0; r < n; ++r) {
        float dy[P], x[P];
        load<P>(dout + (size_t)(from + r) * C + c, dy);
        load<P>(inp + (size_t)(from + r) * C + c, x);
        UNROLL for (int e = 0; e < P; ++e) dw[e] += dy[e] * (x[e] * pass_rstd[r]);
      }
      UNROLL for (int e = 0; e < P; ++e) mine[c + e] = from == first ? dw[e] : mine[c + e] + dw[e];
    }
    if (from + kLnPassRows >= end) break;  // uniform over the block
    __syncthreads();  // phase 2 is done with the statistics before the next pass replaces them
  }
}

}  // namespace ln_detail

// One launch per RMSNorm backward: layernorm_bwd_bf16's structure with one column sum per slot.
// registry: static_shared=132
extern "C" __global__ void __launch_bounds__(512 CUDA_MIN_BLOCKS(2))
    rmsnorm_bwd_bf16(bf16* dinp, float* dweight, float* partials, unsigned int* counters, const bf16* dout,
                     const bf16* inp, const float* weight, const float* rstd, int rows, int C) {
  using namespace ln_detail;
  __shared__ float pass_rstd[kLnPassRows];
  __shared__ unsigned int last;
  const int blocks = (int)gridDim.x, per_block = (rows + blocks - 1) / blocks;
  const long long from = (long long)blockIdx.x * per_block, to = from + per_block;
  const int first = from < rows ? (int)from : rows, end = to < rows ? (int)to : rows;
  const size_t pitch = (size_t)C;
  float* mine = partials + blockIdx.x * pitch;
  if (C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight))
    rms_backward_rows<8, 2>(mine, pass_rstd, dinp, dout, inp, weight, rstd, first, end, C);
  else
    rms_backward_rows<1, 1>(mine, pass_rstd, dinp, dout, inp, weight, rstd, first, end, C);
  const int groups = (blocks + kLnGroup - 1) / kLnGroup;
  if (!last_of_all_groups(partials, counters, pitch, &last)) return;  // uniform over the block
  for (size_t i = threadIdx.x; i < pitch; i += blockDim.x)
    dweight[i] += slot_sum(partials + (size_t)blocks * pitch, pitch, groups, i);
  if (threadIdx.x == 0) counters[groups] = 0;  // every group has counted: ready for the next launch
}
