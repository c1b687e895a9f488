// attention_fwd.cu: the causal self-attention forward kernels over whole sequences (common/attention_fwd.cuh:
// the algorithm, its tiles, shared memory and registers, and the arguments).
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/tile_order.cuh"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"
#include "common/attention_fwd.cuh"

// registry: dynamic_shared=25600
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<32, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DropoutSite{});
}

// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<64, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DropoutSite{});
}

// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<128, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                              DropoutSite{});
}

// The _docs_ kernels state at least one block per SM: ptxas then takes the registers their
// document bounds need instead of holding them to a multiple-blocks budget and spilling.
// registry: dynamic_shared=25856
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_docs_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                const int* starts) {
  attention_fwd_detail::attention_fwd_body<32, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DropoutSite{});
}

// registry: dynamic_shared=55808
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_docs_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                const int* starts) {
  attention_fwd_detail::attention_fwd_body<64, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DropoutSite{});
}

// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_docs_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                 const int* starts) {
  attention_fwd_detail::attention_fwd_body<128, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                             Documents{starts, seq}, DropoutSite{});
}

// registry: dynamic_shared=25600
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                int d_col0) {
  attention_fwd_detail::attention_fwd_body<32, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                            DROPOUT_SITE);
}

// registry: dynamic_shared=55296
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                int d_col0) {
  attention_fwd_detail::attention_fwd_body<64, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                            DROPOUT_SITE);
}

// registry: dynamic_shared=52224
extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                 int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                 int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                 int d_col0) {
  attention_fwd_detail::attention_fwd_body<128, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DROPOUT_SITE);
}

// registry: dynamic_shared=25856
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_drop_docs_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                     int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                     int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                     int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<32, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                           Documents{starts, seq}, DROPOUT_SITE);
}

// registry: dynamic_shared=55808
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_drop_docs_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                     int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                     int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                     int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<64, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                           Documents{starts, seq}, DROPOUT_SITE);
}

// registry: dynamic_shared=52480
extern "C" __global__ void __launch_bounds__(128, 1)
    attention_fwd_drop_docs_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                      int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                      int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                      int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<128, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DROPOUT_SITE);
}
