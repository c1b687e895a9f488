// attention_bwd.cu: the causal self-attention backward kernels over whole sequences (common/attention_bwd.cuh:
// the algorithm, its tiles, shared memory and registers, and the arguments).
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/reduce.h"
#include "common/tile_order.cuh"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"
#include "common/attention_bwd.cuh"

extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_delta_bf16(float* delta, const bf16* dout, const bf16* out, int batch, int seq, int heads,
                             int /* kv_heads: not read, out and dout hold the query heads */, int d) {
  const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (item >= seq * batch * heads) return;  // the whole warp leaves together
  const int row = item / heads, head = item % heads, t = row / batch, b = row % batch;
  const size_t base = (size_t)row * heads * d + (size_t)head * d;
  float sum = 0.0f;
  for (int c = lane; c < d; c += 32) sum += to_float(dout[base + c]) * to_float(out[base + c]);
  sum = wave_sum(sum);
  if (lane == 0) delta[((size_t)b * heads + head) * seq + t] = sum;
}

// registry: dynamic_shared=31744
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<32, 64, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DropoutSite{});
}
// registry: dynamic_shared=37376
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<64, 32, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DropoutSite{});
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                                int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<128, 16, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                        Documents{}, DropoutSite{});
}
// registry: dynamic_shared=30720
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                              int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<32, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DropoutSite{});
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                              int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<64, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DropoutSite{});
}
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<128, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{}, DropoutSite{});
}
// The _docs_ kernels state at least one block per SM: ptxas then takes the registers their
// document bounds need instead of holding them to a multiple-blocks budget and spilling.
// registry: dynamic_shared=32256
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dkv_body<32, 64, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{starts, seq}, DropoutSite{});
}
// registry: dynamic_shared=37632
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dkv_body<64, 32, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{starts, seq}, DropoutSite{});
}
// registry: dynamic_shared=52608
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads,
                                     const int* starts) {
  attention_bwd_detail::dkv_body<128, 16, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{starts, seq}, DropoutSite{});
}
// registry: dynamic_shared=30976
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads,
                                   const int* starts) {
  attention_bwd_detail::dq_body<32, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DropoutSite{});
}
// registry: dynamic_shared=55808
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads,
                                   const int* starts) {
  attention_bwd_detail::dq_body<64, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DropoutSite{});
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dq_body<128, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{starts, seq}, DropoutSite{});
}
// At least one block per SM stated: ptxas otherwise holds it to 168 registers on sm_80 and spills.
// registry: dynamic_shared=31744
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_drop_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dkv_body<32, 64, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{}, DROPOUT_SITE);
}
// registry: dynamic_shared=37376
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dkv_body<64, 32, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{}, DROPOUT_SITE);
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                     float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                     int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0,
                                     int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<128, 16, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DROPOUT_SITE);
}
// registry: dynamic_shared=30720
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                   float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                   int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                   int d_col0) {
  attention_bwd_detail::dq_body<32, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{}, DROPOUT_SITE);
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                   float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                   int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                   int d_col0) {
  attention_bwd_detail::dq_body<64, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{}, DROPOUT_SITE);
}
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dq_body<128, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DROPOUT_SITE);
}
// At least one block per SM stated: ptxas otherwise holds it to 168 registers on sm_80 and spills.
// registry: dynamic_shared=32256
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_drop_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<32, 64, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                     Documents{starts, seq}, DROPOUT_SITE);
}
// registry: dynamic_shared=37632
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_drop_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<64, 32, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                     Documents{starts, seq}, DROPOUT_SITE);
}
// registry: dynamic_shared=52608
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dkv_drop_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                          const float* delta, int batch, int seq, int heads, int kv_heads,
                                          const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                          int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                          int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<128, 16, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{starts, seq}, DROPOUT_SITE);
}
// registry: dynamic_shared=30976
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_drop_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                        const float* delta, int batch, int seq, int heads, int kv_heads,
                                        const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                        int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch,
                                        int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<32, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                Documents{starts, seq}, DROPOUT_SITE);
}
// registry: dynamic_shared=55808
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_drop_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                        const float* delta, int batch, int seq, int heads, int kv_heads,
                                        const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                        int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch,
                                        int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<64, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                Documents{starts, seq}, DROPOUT_SITE);
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_bwd_dq_drop_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<128, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DROPOUT_SITE);
}
