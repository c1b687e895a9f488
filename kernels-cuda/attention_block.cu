// attention_block.cu: context parallelism's blocks of causal attention (common/key_block.h,
// src/device/blocks.rs): the queries of one run of positions of a fused QKV buffer against the
// keys and values of a run of another (or the same), query t seeing keys u <= t + shift; the
// forward writes an f32 output and log-sum-exp that the Device merges with the other blocks'
// (tensor_ops.cu's attention_merge_f32), the backward adds dQ, dK and dV to f32 gradient rows.
// The bodies are the whole-sequence kernels' (common/attention_fwd.cuh and attention_bwd.cuh)
// with their BLOCK flag: the same tiles, pipeline, shared memory and launch geometry.
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/reduce.h"
#include "common/tile_order.cuh"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"
#include "common/attention_fwd.cuh"
#include "common/attention_bwd.cuh"

// Context parallelism's blocks (common/key_block.h): the queries of `q` (seq positions from its
// first) against the `keys` positions of `kv`, query t seeing keys u <= t + shift; out and lse
// f32 ([seq·batch, heads·d] and [batch·heads·seq], as the whole attention's), merged with the
// other blocks' by the Device. The _drop_ twins draw at query q_first + t, key k_first + u.
// registry: dynamic_shared=25600
extern "C" __global__ void __launch_bounds__(128)
    attention_block_fwd_bf16_d32(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq, int heads,
                                 int kv_heads, int keys, int shift) {
  attention_fwd_detail::attention_fwd_body<32, false, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_block_fwd_bf16_d64(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq, int heads,
                                 int kv_heads, int keys, int shift) {
  attention_fwd_detail::attention_fwd_body<64, false, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// One block per SM stated: at the default budget it spilled on sm_90a.
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_block_fwd_bf16_d128(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq, int heads,
                                 int kv_heads, int keys, int shift) {
  attention_fwd_detail::attention_fwd_body<128, false, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=25600
extern "C" __global__ void __launch_bounds__(128)
    attention_block_fwd_drop_bf16_d32(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq,
                                      int heads, int kv_heads, int keys, int shift, int q_first, int k_first,
                                      int d_threshold, float d_scale, int d_key0, int d_key1, int d_place,
                                      int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq,
                                      int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<32, true, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_block_fwd_drop_bf16_d64(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq,
                                      int heads, int kv_heads, int keys, int shift, int q_first, int k_first,
                                      int d_threshold, float d_scale, int d_key0, int d_key1, int d_place,
                                      int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq,
                                      int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<64, true, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// The d 128 one states one block per SM, as the _docs_ kernels do: at two it spilled on sm_80.
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_block_fwd_drop_bf16_d128(float* out, float* lse, const bf16* q, const bf16* kv, int batch, int seq,
                                      int heads, int kv_heads, int keys, int shift, int q_first, int k_first,
                                      int d_threshold, float d_scale, int d_key0, int d_key1, int d_place,
                                      int d_iteration, int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq,
                                      int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<128, true, false, true>(out, lse, q, batch, seq, heads, kv_heads, Documents{},
                                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}

// Context parallelism's blocks (common/key_block.h): the backward of the queries of `q` (seq
// positions from its first) against the `keys` positions of `kv` (query t seeing keys
// u <= t + shift), from the whole attention's dout, lse and delta at the queries' rows; dK and
// dV added to the f32 rows of `dkv` (laid out as kv's), dQ to those of `dq` (as q's). The grids
// are the whole attention's: dK/dV over the keys, dQ over the queries. The _drop_ twins draw at
// query q_first + t, key k_first + u.
// registry: dynamic_shared=31744
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dkv_bf16_d32(float* dkv, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                     int shift) {
  attention_bwd_detail::dkv_body<32, 64, false, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=30720
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_bf16_d32(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                    int shift) {
  attention_bwd_detail::dq_body<32, false, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// One block per SM stated: at the default budget it spilled on sm_90a.
// registry: dynamic_shared=37376
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_block_bwd_dkv_bf16_d64(float* dkv, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                     int shift) {
  attention_bwd_detail::dkv_body<64, 32, false, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_bf16_d64(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                    const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                    int shift) {
  attention_bwd_detail::dq_body<64, false, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dkv_bf16_d128(float* dkv, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                      const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                      int shift) {
  attention_bwd_detail::dkv_body<128, 16, false, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                       Documents{}, DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_bf16_d128(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                     const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                     int shift) {
  attention_bwd_detail::dq_body<128, false, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                  DropoutSite{}, KeyBlock{kv, keys, shift, 0, 0});
}
// One block per SM stated, as the _docs_ kernels do: at the default budget it spilled on sm_80.
// registry: dynamic_shared=31744
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_block_bwd_dkv_drop_bf16_d32(float* dkv, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                          const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                          int shift, int q_first, int k_first, int d_threshold, float d_scale,
                                          int d_key0, int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                          int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<32, 64, true, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{}, DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=30720
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_drop_bf16_d32(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                         int shift, int q_first, int k_first, int d_threshold, float d_scale,
                                         int d_key0, int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                         int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<32, true, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=37376
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dkv_drop_bf16_d64(float* dkv, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                          const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                          int shift, int q_first, int k_first, int d_threshold, float d_scale,
                                          int d_key0, int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                          int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<64, 32, true, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{}, DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_drop_bf16_d64(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                         const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                         int shift, int q_first, int k_first, int d_threshold, float d_scale,
                                         int d_key0, int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                         int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<64, true, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dkv_drop_bf16_d128(float* dkv, const bf16* q, const bf16* kv, const bf16* dout,
                                           const float* lse, const float* delta, int batch, int seq, int heads,
                                           int kv_heads, int keys, int shift, int q_first, int k_first, int d_threshold,
                                           float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                           int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0,
                                           int d_width, int d_col0) {
  attention_bwd_detail::dkv_body<128, 16, true, false, true>(dkv, q, dout, lse, delta, batch, seq, heads, kv_heads,
                                                      Documents{}, DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_block_bwd_dq_drop_bf16_d128(float* dq, const bf16* q, const bf16* kv, const bf16* dout, const float* lse,
                                          const float* delta, int batch, int seq, int heads, int kv_heads, int keys,
                                          int shift, int q_first, int k_first, int d_threshold, float d_scale,
                                          int d_key0, int d_key1, int d_place, int d_iteration, int d_sample0_lo,
                                          int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_bwd_detail::dq_body<128, true, false, true>(dq, q, dout, lse, delta, batch, seq, heads, kv_heads, Documents{},
                                                 DROPOUT_SITE, KeyBlock{kv, keys, shift, q_first, k_first});
}
