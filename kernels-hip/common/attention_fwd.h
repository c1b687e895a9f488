// attention_fwd.h: causal self-attention forward, FlashAttention-2 style, on AMD matrix cores
// (the CDNA counterpart of kernels-cuda/attention_fwd.cu, same kernel names and arguments).
//
// Computes, for each sequence b, query head h and query position t < seq, with g = h / r the
// key/value head of h's group (r = heads / kv_heads query heads share it; r = 1 is multi-head):
//   out[t·batch + b][h·d .. h·d + d) = Σ_{u <= t} softmax_u(q_t · k_u / sqrt(d)) · v_u  (k, v of head g)
//   lse[(b·heads + h)·seq + t]       = log Σ_{u <= t} exp(q_t · k_u / sqrt(d))      (saved for backward)
// from the fused QKV activation qkv [seq·batch, (heads + 2·kv_heads)·d] bf16 (rows sequence-first,
// per group g of r query heads [q_(g·r) .. q_(g·r+r-1) | k_g | v_g], Megatron's layout: h's q at
// column (h + 2g)·d, g's k at (g·(r + 2) + r)·d, v right after; r = 1 is GPT-2's [q | k | v] per
// head); out [seq·batch, heads·d] bf16; lse f32. Head dims 32 (attention_fwd_bf16_d32), 64
// (attention_fwd_bf16_d64) and 128 (attention_fwd_bf16_d128): the MFMA tiling needs d to be a
// multiple of 32 (the 32-row d blocks of Oᵀ) and of 8 (the k steps of Sᵀ); any seq >= 1. Online softmax with the division deferred to the
// end (FA-2); no [seq, seq] matrix exists.
//
// Grid: (⌈seq/64⌉, batch·heads) workgroups of 128 threads (2 wave64s), the CUDA kernel's grid and
// longest-first order (common/tile_order.h), one per query head: the r query heads of a group each
// read their group's K and V (the offsets are set once per workgroup; the loops are the multi-head
// ones, no work per score is added).
// A workgroup owns 64 queries of one (b, h), each wave 32 of them (split-Q, no cross-wave
// reduction). Per tile of 32 keys a wave computes the transposed scores Sᵀ = K Qᵀ (32 keys x 32
// queries) with d/8 v_mfma_f32_32x32x8bf16_1k (v_mfma_f32_32x32x8_bf16 on gfx940+), so lane l
// holds query l % 32 and 16 of the tile's keys: the row max is a max over the lane's registers
// and one __shfl_xor with the other half-wave, and the running max m and the lane's part of the
// sum l are per lane. Then Oᵀ += Vᵀ Pᵀ (d/32 accumulators of 32 d x 32 queries, 4 MFMAs each):
// Pᵀ's B operand for keys 8kb.. is exactly registers 4kb..4kb+3 of the Sᵀ accumulator
// (common/mfma.h), rounded to bf16, and the rescaling of Oᵀ by exp(m_old - m_new) is per lane.
// Tiles that lie wholly above a wave's diagonal are skipped (wave-uniform).
// Per-document attention (the _docs_ kernels' `starts`, common/documents.h, as on CUDA): a query's
// keys begin at its document's start, the key tiles at the workgroup's first query's, and a
// wave skips the tiles wholly before its first query's; until a query has seen a key of its
// document its max stays -inf and its exponents are taken from 0 (e^-inf = 0, not NaN).
//
// Tiles are loaded with 16-byte loads; V is stored transposed (d x (32 + 8)) so that each lane's
// Vᵀ operand is one 8-byte LDS read.
//
// LDS: Q 64 x (d + 8), K 32 x (d + 8), Vᵀ d x 40 bf16 = 10240 B (d 32), 18944 B (d 64), 36352 B
// (d 128) of the 64 KiB. Registers: Oᵀ d/2 f32 per lane (16, 32 or 64, AGPRs on gfx90a), Sᵀ 16,
// operands 4; hipcc's counts are in docs/kernels.md (no scratch).
//
// The attention_fwd_drop_bf16_d* kernels add attention dropout as the CUDA ones do
// (common/dropout.h; one Philox block per probability, where CUDA shares a block between a
// lane's two neighbouring keys).
//
// Reference: `attention_forward` of the reference device (f64) on the same bf16 qkv
// (tests/hip_emulation.rs).
//
// The kernels are attention_fwd.hip's (the whole sequence) and attention_block.hip's (context
// parallelism's blocks, common/key_block.h); a kernel file includes this header after the
// headers below.
#pragma once
#include "common/attention.h"
#include "common/base.h"
#include "common/mfma.h"
#include "common/tile_order.h"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"

namespace attention_fwd_detail {

using namespace attention_common;

template <int D>
struct alignas(16) Tiles {
  bf16 q[kBlockRows][D + kPad];
  bf16 k[kTileRows][D + kPad];
  bf16 vt[D][kTileRows + kPad];  // V transposed: the PV product reads it along keys
};

// DROP: attention dropout (`drop`'s masks), the probabilities that multiply V masked and scaled,
// l summing the unmasked ones.
// An output element: bf16 for the whole attention, f32 for a block (merged in f32).
__device__ __forceinline__ void store_out(bf16* dst, float x) { *dst = to_bf16(x); }
__device__ __forceinline__ void store_out(float* dst, float x) { *dst = x; }

// BLOCK: one block of context parallelism (common/key_block.h), `qkv` the queries' buffer at
// their first position, `seq` their count, `kb` the keys' (query t sees keys u <= t + shift
// below kb.keys); `Out` f32.
template <int D, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void attention_fwd_body(Out* __restrict__ out, float* __restrict__ lse,
                                                   const bf16* __restrict__ qkv, int batch, int seq, int heads,
                                                   int kv_heads, const Documents documents, const DropoutSite& drop,
                                                   const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  __shared__ Tiles<D> tiles;
  static_assert(sizeof(Tiles<D>) <= kLdsBytes, "LDS over the 64 KiB budget");
  static_assert(kWaveSize == 2 * kMfmaN, "the MFMA layout spans a 64-lane wavefront");
  static_assert(D % kMfmaM == 0, "Oᵀ in whole 32-row d blocks");
  constexpr int kDBlocks = D / kMfmaM;
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  const AttentionTile block = longest_first(true, heads);  // common/tile_order.h
  const int q0 = block.tile * kBlockRows, b = block.b, head = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  // The head's q columns and its group's k columns (v follows) in the per-group rows, as int
  // (a row's width fits one: the launcher checks it; size_t offsets from the group's division
  // cost gfx90a 8 more VGPRs here).
  const int group = heads / kv_heads, kv = head / group;
  const int qkv_stride = (heads + 2 * kv_heads) * D, q_col = (head + 2 * kv) * D;
  const int k_col = (kv * (group + 2) + group) * D;
  const float scale = 1.0f / sqrtf((float)D);
  const int wave_q = wave * kMfmaN;                       // the wave's first query in the block
  const int query = q0 + wave_q + mfma_col(lane);         // this lane's query
  const int wave_last = q0 + wave_q + kMfmaN - 1;         // the wave's last query
  // DOCS: the first key this lane's query sees, and the wave's smallest (documents.h).
  const int first_key = DOCS ? docs.start(query) : 0;
  const int wave_lo = DOCS ? wave_uniform(docs.start(q0 + wave_q)) : 0;

  load_rows<D, kBlockRows>(tiles.q, qkv, qkv_stride, q_col, q0, seq, batch, b);

  mfma_acc o[kDBlocks];
  UNROLL for (int n = 0; n < kDBlocks; ++n) mfma_zero(o[n]);
  float m = -INFINITY, l = 0.0f;

  // Key tiles from the one holding the workgroup's first query's first key to its last query.
  const int last_query = (q0 + kBlockRows < seq ? q0 + kBlockRows : seq) - 1;
  const int first_tile_key = DOCS ? wave_uniform(docs.start(q0) / kTileRows * kTileRows) : 0;
  // BLOCK: the keys' own buffer and count, and the queries' offset from them.
  const bf16* kv_src = BLOCK ? kb.kv : qkv;
  const int keys = BLOCK ? kb.keys : seq, shift = BLOCK ? kb.shift : 0;
  const int last_key = BLOCK ? kb.last_key(last_query) : last_query;
  for (int k0 = first_tile_key; k0 <= last_key; k0 += kTileRows) {
    load_rows<D, kTileRows>(tiles.k, kv_src, qkv_stride, k_col, k0, keys, batch, b);
    load_rows_transposed<D, kTileRows>(tiles.vt, kv_src, qkv_stride, k_col + D, k0, keys, batch, b);
    __syncthreads();  // Q (first time), K and V of this tile are in LDS
    if (k0 <= wave_last + shift && (!DOCS || k0 + kTileRows > wave_lo)) {
      // Sᵀ = K Qᵀ: register r holds the score of key k0 + mfma_row(lane, r) for `query`.
      mfma_acc s;
      mfma_zero(s);
      UNROLL for (int kk = 0; kk < D; kk += kMfmaK) {
        bf16 ka[4], qb[4];
        UNROLL for (int j = 0; j < 4; ++j) {
          ka[j] = tiles.k[mfma_col(lane)][kk + mfma_k(lane) + j];
          qb[j] = tiles.q[wave_q + mfma_col(lane)][kk + mfma_k(lane) + j];
        }
        mfma_32x32x8_bf16(s, ka, qb);
      }
      // Scale, causal (and DOCS document) mask, online softmax (both half-waves share the row max
      // through the exchange below). Without documents key 0 is in every query's first tile, so m
      // is finite from then on; under documents a query's max stays -inf through tiles wholly
      // before its document and the exponents are taken from 0 there: its probabilities are
      // e^-inf = 0, not e^(-inf + inf) = NaN.
      float tile_max = -INFINITY;
      UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
        const int key = k0 + mfma_row(lane, r);
        const bool seen = key <= query + shift && (!BLOCK || key < keys) && (!DOCS || key >= first_key);
        const float v = seen ? s.v[r] * scale : -INFINITY;
        s.v[r] = v;
        tile_max = fmaxf(tile_max, v);
      }
      tile_max = fmaxf(tile_max, __shfl_xor(tile_max, kMfmaN));  // the other half-wave's keys
      const float m_new = fmaxf(m, tile_max);
      const float correction = m == -INFINITY ? 0.0f : expf(m - m_new);
      m = m_new;
      l *= correction;
      const float m_from = DOCS && m == -INFINITY ? 0.0f : m;
      UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
        const float p = expf(s.v[r] - m_from);
        l += p;
        if constexpr (DROP) {
          const int q_at = BLOCK ? kb.q_first + query : query, k_at = BLOCK ? kb.k_first + k0 : k0;
          const bool kept = drop.keeps(drop.attention_index(b, head, q_at) + k_at + mfma_row(lane, r));
          s.v[r] = kept ? p * drop.scale : 0.0f;
        } else {
          s.v[r] = p;
        }
      }
      // Oᵀ = correction · Oᵀ + Vᵀ Pᵀ, d block n: A = Vᵀ (row d, column key), B = Pᵀ from s.
      UNROLL for (int n = 0; n < kDBlocks; ++n) {
        UNROLL for (int r = 0; r < kMfmaAcc; ++r) o[n].v[r] *= correction;
        UNROLL for (int kb = 0; kb < kMfmaM / kMfmaK; ++kb) {
          bf16 va[4], pb[4];
          UNROLL for (int j = 0; j < 4; ++j) va[j] = tiles.vt[kMfmaM * n + mfma_col(lane)][kMfmaK * kb + mfma_k(lane) + j];
          mfma_acc_operand(pb, s, kb);
          mfma_32x32x8_bf16(o[n], va, pb);
        }
      }
    }
    __syncthreads();  // everyone is done with K and V before the next tile overwrites them
  }

  const float total = l + __shfl_xor(l, kMfmaN);
  if (query >= seq) return;  // no collective follows
  const float inv = 1.0f / total;
  Out* dst = out + ((size_t)query * batch + b) * heads * D + (size_t)head * D;
  UNROLL for (int n = 0; n < kDBlocks; ++n)
    UNROLL for (int r = 0; r < kMfmaAcc; ++r) store_out(&dst[kMfmaM * n + mfma_row(lane, r)], o[n].v[r] * inv);
  if (lane < kMfmaN) lse[((size_t)b * heads + head) * seq + query] = m + logf(total);
}

}  // namespace attention_fwd_detail
