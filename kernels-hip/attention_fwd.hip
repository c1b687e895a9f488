// attention_fwd.hip: the causal self-attention forward kernels over whole sequences on AMD matrix cores
// (common/attention_fwd.h: the algorithm, its tiles, LDS and registers, and the arguments).
#include "common/attention.h"
#include "common/base.h"
#include "common/mfma.h"
#include "common/tile_order.h"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"
#include "common/attention_fwd.h"

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<32, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<64, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads) {
  attention_fwd_detail::attention_fwd_body<128, false, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                              DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_docs_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                const int* starts) {
  attention_fwd_detail::attention_fwd_body<32, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_docs_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                const int* starts) {
  attention_fwd_detail::attention_fwd_body<64, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_docs_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                 const int* starts) {
  attention_fwd_detail::attention_fwd_body<128, false, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                             Documents{starts, seq}, DropoutSite{});
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                int d_col0) {
  attention_fwd_detail::attention_fwd_body<32, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                            DROPOUT_SITE);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                int d_col0) {
  attention_fwd_detail::attention_fwd_body<64, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                            DROPOUT_SITE);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                                 int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
                                 int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width,
                                 int d_col0) {
  attention_fwd_detail::attention_fwd_body<128, true, false>(out, lse, qkv, batch, seq, heads, kv_heads, Documents{},
                                                             DROPOUT_SITE);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_docs_bf16_d32(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                     int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                     int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                     int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<32, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                           Documents{starts, seq}, DROPOUT_SITE);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_docs_bf16_d64(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                     int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                     int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                     int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<64, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                           Documents{starts, seq}, DROPOUT_SITE);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_fwd_drop_docs_bf16_d128(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads,
                                      int kv_heads, const int* starts, int d_threshold, float d_scale, int d_key0,
                                      int d_key1, int d_place, int d_iteration, int d_sample0_lo, int d_sample0_hi,
                                      int d_batch, int d_seq, int d_t0, int d_width, int d_col0) {
  attention_fwd_detail::attention_fwd_body<128, true, true>(out, lse, qkv, batch, seq, heads, kv_heads,
                                                            Documents{starts, seq}, DROPOUT_SITE);
}
