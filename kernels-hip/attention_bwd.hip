// attention_bwd.hip: the causal self-attention backward kernels over whole sequences on AMD matrix cores
// (common/attention_bwd.h: the algorithm, its tiles, LDS and registers, and the arguments).
#include "common/attention.h"
#include "common/base.h"
#include "common/mfma.h"
#include "common/reduce.h"
#include "common/tile_order.h"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"
#include "common/attention_bwd.h"

extern "C" __global__ void __launch_bounds__(256)
    attention_bwd_delta_bf16(float* delta, const bf16* dout, const bf16* out, int batch, int seq, int heads,
                             int /* kv_heads */, int d) {
  const int item = blockIdx.x * (blockDim.x / kWaveSize) + threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  if (item >= seq * batch * heads) return;  // the whole wave leaves together
  const int row = item / heads, head = item % heads, t = row / batch, b = row % batch;
  const size_t base = (size_t)row * heads * d + (size_t)head * d;
  float sum = 0.0f;
  for (int c = lane; c < d; c += kWaveSize) sum += to_float(dout[base + c]) * to_float(out[base + c]);
  sum = wave_sum(sum);
  if (lane == 0) delta[((size_t)b * heads + head) * seq + t] = sum;
}

extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<32, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<64, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                                int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dkv_body<128, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                    Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                              int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<32, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                              int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<64, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                               int batch, int seq, int heads, int kv_heads) {
  attention_bwd_detail::dq_body<128, false, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dkv_body<32, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dkv_body<64, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads,
                                     const int* starts) {
  attention_bwd_detail::dkv_body<128, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads,
                                   const int* starts) {
  attention_bwd_detail::dq_body<32, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads,
                                   const int* starts) {
  attention_bwd_detail::dq_body<64, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads,
                                    const int* starts) {
  attention_bwd_detail::dq_body<128, false, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{starts, seq}, DropoutSite{});
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dkv_body<32, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dkv_body<64, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                     float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                     int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0,
                                     int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<128, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                   Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                   float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                   int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                   int d_col0) {
  attention_bwd_detail::dq_body<32, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                   float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                   int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                   int d_col0) {
  attention_bwd_detail::dq_body<64, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int d_threshold,
                                    float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                    int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                    int d_col0) {
  attention_bwd_detail::dq_body<128, true, false>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<32, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<64, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dkv_drop_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                          const float* delta, int batch, int seq, int heads, int kv_heads,
                                          const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                          int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                          int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<128, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                  Documents{starts, seq}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_docs_bf16_d32(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                        const float* delta, int batch, int seq, int heads, int kv_heads,
                                        const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                        int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch,
                                        int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<32, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                Documents{starts, seq}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_docs_bf16_d64(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                        const float* delta, int batch, int seq, int heads, int kv_heads,
                                        const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                        int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch,
                                        int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<64, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                Documents{starts, seq}, DROPOUT_SITE);
}
extern "C" __global__ void __launch_bounds__(128)
    attention_bwd_dq_drop_docs_bf16_d128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads,
                                         const int* starts, int d_threshold, float d_scale, int d_key0, int d_key1,
                                         int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                         int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<128, true, true>(dqkv, qkv, dout, lse, delta, batch, seq, heads, kv_heads,
                                                 Documents{starts, seq}, DROPOUT_SITE);
}
