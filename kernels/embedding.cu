// embedding.cu: the GPT input embedding, word (vocab-parallel) plus position, forward and
// backward. One source for CUDA and HIP (common/portable.h).
//
// Forward  embedding_fwd_bf16:  out[t·batch + b][c] = wte[tokens[b·seq + t] - vocab_start][c]
//          (+ wpe[t][c] when wpe is set), or 0 + wpe when the token is outside this rank's
//          vocabulary shard (the tensor-parallel all-reduce fills it in from the owner).
//          Rows are sequence-first as in Megatron. tokens [batch, seq] u32 (global ids);
//          wte [vocab_rows, hidden] bf16; wpe [seq, hidden] f32 or null; out [seq·batch, hidden] bf16.
// Backward embedding_bwd_wte_bf16:  dwte[token - vocab_start][c] += dout[t·batch + b][c] for every
//          position in order t, then b, in f32, one block per (touched row, strip of columns): the
//          host groups the positions by vocabulary row (src/gpu/kernels/plan/mod.rs,
//          EmbeddingSegments): segment s adds the rows positions[segment_starts[s] ..
//          segment_starts[s+1]] (t·batch + b, ascending) of dout into dwte row segment_rows[s];
//          positions outside this vocabulary shard have no segment. Repeated tokens are summed in
//          a fixed order (deterministic, no atomics; the reference's order, so the same bits as one
//          thread walking every position) and every touched row runs in parallel.
//          embedding_bwd_wpe_bf16:  dwpe[t][c] += Σ_b dout[t·batch + b][c], thread per (t, c).
//          dout [seq·batch, hidden] bf16; dwte, dwpe f32.
//
// Grid: forward ⌈hidden/128⌉ x (seq·batch) blocks of 128 (thread per output element, coalesced
// along the row); bwd_wte segments x ⌈hidden/128⌉ blocks of 128 (coalesced along the row);
// bwd_wpe ⌈hidden/128⌉ x seq blocks of 128.
// No shared memory; few registers.
//
// Reference: the reference device's `embedding_forward` + `position_forward` and
// `embedding_backward` / `position_backward` (src/device/kernels.rs), in f64 on the same bf16
// tables and gradients (tests/cuda_emulation.rs, tests/hip_emulation.rs).
#include "common/portable.h"

extern "C" __global__ void __launch_bounds__(128)
    embedding_fwd_bf16(bf16* out, const uint32_t* tokens, const bf16* wte, const float* wpe, int vocab_start,
                       int vocab_rows, int batch, int seq, int hidden) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
  if (c >= hidden) return;
  const int t = i / batch, b = i % batch;
  const long long r = (long long)tokens[(size_t)b * seq + t] - vocab_start;
  float v = r >= 0 && r < vocab_rows ? to_float(wte[(size_t)r * hidden + c]) : 0.0f;
  if (wpe) v += wpe[(size_t)t * hidden + c];
  out[(size_t)i * hidden + c] = to_bf16(v);
}

extern "C" __global__ void __launch_bounds__(128)
    embedding_bwd_wte_bf16(float* dwte, const bf16* dout, const int* segment_rows, const int* segment_starts,
                           const int* positions, int hidden) {
  const int s = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  float* d = dwte + (size_t)segment_rows[s] * hidden + c;
  const bf16* g = dout + c;
  float acc = *d;
  int i = segment_starts[s];
  const int end = segment_starts[s + 1];
  for (; i + 16 <= end; i += 16) {  // the loads 16 at a time (a frequent token's chain), added in order
    float v[16];
    UNROLL for (int k = 0; k < 16; ++k) v[k] = to_float(g[(size_t)positions[i + k] * hidden]);
    UNROLL for (int k = 0; k < 16; ++k) acc += v[k];
  }
  for (; i < end; ++i) acc += to_float(g[(size_t)positions[i] * hidden]);
  *d = acc;
}

extern "C" __global__ void __launch_bounds__(128)
    embedding_bwd_wpe_bf16(float* dwpe, const bf16* dout, int batch, int seq, int hidden) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (c >= hidden || t >= seq) return;
  float s = 0.0f;
  for (int b = 0; b < batch; ++b) s += to_float(dout[((size_t)t * batch + b) * hidden + c]);
  dwpe[(size_t)t * hidden + c] += s;
}
