// attention_bwd.h: causal self-attention backward, FlashAttention-2 style, on AMD matrix cores,
// deterministic (no atomics). The CDNA counterpart of kernels-cuda/attention_bwd.cu, same kernel
// names and arguments.
//
// Computes, for each sequence b and query head h (of group g = h / r: r = heads / kv_heads query
// heads share key/value head g; r = 1 is multi-head), with scale s = 1/sqrt(d),
// P_ij = exp(s q_i·k_j - lse_i) for j <= i (0 otherwise) rebuilt from the forward's log-sum-exp,
// and delta_i = dO_i · O_i:
//   dV_j = Σ_h Σ_i P_ij dO_i       dS_ij = P_ij (dO_i · v_j - delta_i)
//   dK_j = s Σ_h Σ_i dS_ij q_i     dQ_i  = s Σ_j dS_ij k_j
// (dK and dV of head g summed over its group's query heads h). Inputs: qkv [seq·batch,
// (heads + 2·kv_heads)·d] bf16 in Megatron's per-group rows (attention_fwd.hip's header: h's q at
// column (h + 2g)·d, g's k at (g·(r + 2) + r)·d, v after it), out and dout [seq·batch, heads·d]
// bf16, lse [batch·heads·seq] f32. Output: dqkv, laid out like qkv, bf16 (each element written
// once).
// Head dims 32, 64 and 128 (multiples of the MFMA's 32-row blocks); any seq >= 1. Three kernels, launched in this order:
//   attention_bwd_delta_bf16:  delta [batch·heads·seq] f32. ⌈seq·batch·heads / 4⌉ workgroups of
//                              256 (4 wave64s), a wave per (row, query head), wave_sum over d
//                              (kv_heads is not read: out and dout hold the query heads).
//   attention_bwd_dkv_bf16_d{32,64,128}: grid (⌈seq/64⌉, batch·kv_heads), 128 threads (2 wave64s),
//                              longest first (common/tile_order.h); a workgroup owns 64 keys of
//                              one (b, g), a wave 32, and for each query head of the group in
//                              order (one pass when r = 1) walks the 32-query tiles from the
//                              diagonal to the end, dK and dV summed over the heads in the same
//                              registers (a fixed order: the same bits on every run; the head's
//                              columns and statistics set once per head, no work per score
//                              added). Per tile a wave computes S = Q Kᵀ and
//                              dP = dO Vᵀ (32 queries x the wave's 32 keys, d/8 MFMAs each), so lane
//                              l holds key l % 32; then dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS (d/32 blocks,
//                              4 MFMAs each) with P and dS as B operands straight from the
//                              accumulator registers (common/mfma.h), dOᵀ and Qᵀ read as columns
//                              of the LDS tiles.
//   attention_bwd_dq_bf16_d{32,64,128}: grid (⌈seq/64⌉, batch·heads), 128 threads, longest first; a
//                              workgroup owns 64 queries of one query head, a wave 32, and walks the
//                              32-key tiles of its group's K and V up to the diagonal, computing Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (lane l holds query
//                              l % 32, so its lse and delta are per lane), then dQᵀ += Kᵀ dSᵀ.
// Splitting dQ from dK/dV costs a second computation of S and dP instead of FA-2's f32 atomicAdd
// into dQ, and makes the result independent of scheduling (docs/design.md, Determinism). Tiles wholly
// above a wave's diagonal are skipped (wave-uniform). All MFMAs are v_mfma_f32_32x32x8bf16_1k
// (v_mfma_f32_32x32x8_bf16 on gfx940+).
//
// LDS (8 bf16 of padding per row): dkv: K, V 64 x (d + 8) and Q, dO 32 x (d + 8) bf16 plus 2 x 32
// f32 = 15616 B (d 32), 27904 B (d 64), 52480 B (d 128); dq: Q, dO 64 x (d + 8) and K, V
// 32 x (d + 8) = 15360 B (d 32), 27648 B (d 64), 52224 B (d 128); all within the 64 KiB. Registers: dkv holds dKᵀ and dVᵀ (d f32 per
// lane) plus S and dP (32), dq holds dQᵀ (d/2) plus two; hipcc's counts are in docs/kernels.md.
//
// The *_drop_* twins of dK/dV and dQ add attention dropout as the CUDA ones do (common/dropout.h).
// The *_docs_* twins take `starts` and keep each query to its document's keys as the CUDA ones
// do (common/documents.h): dK/dV's query tiles end at its last key's document's end, dQ's key
// tiles begin at its first query's document start.
//
// Reference: `attention_backward` of the reference device (f64) on the same bf16 inputs and f32
// lse (tests/hip_emulation.rs).
//
// The kernels are attention_bwd.hip's (the whole sequence) and attention_block.hip's (context
// parallelism's blocks, common/key_block.h); a kernel file includes this header after the
// headers below.
#pragma once
#include "common/attention.h"
#include "common/base.h"
#include "common/mfma.h"
#include "common/reduce.h"
#include "common/tile_order.h"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"

namespace attention_bwd_detail {

using namespace attention_common;

// `x` in a VGPR (a uniform value the compiler would keep in an SGPR); itself under emulation.
__device__ __forceinline__ uint32_t in_vgpr(uint32_t x) {
#if defined(__HIP_DEVICE_COMPILE__)
  uint32_t v;
  asm volatile("v_mov_b32 %0, %1" : "=v"(v) : "s"(x));
  return v;
#else
  return x;
#endif
}

// The site with its Philox key and counter words and its threshold moved to VGPRs (uniform
// values the compiler would keep in SGPRs); the emulation has no registers to move.
__device__ __forceinline__ DropoutSite in_vgprs(const DropoutSite& d) {
  DropoutSite v = d;
#if defined(__HIP_DEVICE_COMPILE__)
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.key0) : "s"(d.key0));
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.key1) : "s"(d.key1));
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.place) : "s"(d.place));
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.iteration) : "s"(d.iteration));
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.threshold) : "s"(d.threshold));
  asm volatile("v_mov_b32 %0, %1" : "=v"(v.scale) : "s"(d.scale));
#endif
  return v;
}

// acc += X · Yᵀ over d for a 32 x 32 block: X rows x0.. of tile x, Y rows y0.. of tile y (both
// [position][d] row-major), i.e. A[i][k] = x[x0 + i][k], B[k][j] = y[y0 + j][k].
template <int D>
__device__ __forceinline__ void rows_product(mfma_acc& acc, bf16 (*x)[D + kPad], int x0, bf16 (*y)[D + kPad], int y0) {
  const int lane = threadIdx.x % kWaveSize;
  UNROLL for (int kk = 0; kk < D; kk += kMfmaK) {
    bf16 a[4], b[4];
    UNROLL for (int j = 0; j < 4; ++j) {
      a[j] = x[x0 + mfma_col(lane)][kk + mfma_k(lane) + j];
      b[j] = y[y0 + mfma_col(lane)][kk + mfma_k(lane) + j];
    }
    mfma_32x32x8_bf16(acc, a, b);
  }
}

// acc[n] += Xᵀ · C for every d block n: A[i = d][k = position] = x[k][32 n + i] (a column of
// tile x, positions 0..31), B = C, the 32 x 32 accumulator whose rows are those positions.
template <int D>
__device__ __forceinline__ void columns_product(mfma_acc (&acc)[D / kMfmaM], bf16 (*x)[D + kPad], const mfma_acc& c) {
  const int lane = threadIdx.x % kWaveSize;
  UNROLL for (int kb = 0; kb < kMfmaM / kMfmaK; ++kb) {
    bf16 b[4];
    mfma_acc_operand(b, c, kb);
    UNROLL for (int n = 0; n < D / kMfmaM; ++n) {
      bf16 a[4];
      UNROLL for (int j = 0; j < 4; ++j) a[j] = x[kMfmaK * kb + mfma_k(lane) + j][kMfmaM * n + mfma_col(lane)];
      mfma_32x32x8_bf16(acc[n], a, b);
    }
  }
}

template <int D>
struct alignas(16) DkvTiles {
  bf16 k[kBlockRows][D + kPad];
  bf16 v[kBlockRows][D + kPad];
  bf16 q[kTileRows][D + kPad];
  bf16 dout[kTileRows][D + kPad];
  float lse[kTileRows];
  float delta[kTileRows];
};

// DROP: attention dropout (`drop`'s masks): dV takes the masked P, dP is masked before dS.
// BLOCK: one block of context parallelism (common/key_block.h): `qkv` the queries' buffer (seq
// positions from its first), `kb` the keys' (query t sits at key position t + shift), `dqkv`
// f32 rows laid out as the keys' that dK and dV are added to.
template <int D, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void dkv_body(Out* __restrict__ dqkv, const bf16* __restrict__ qkv,
                                         const bf16* __restrict__ dout, const float* __restrict__ lse,
                                         const float* __restrict__ delta, int batch, int seq, int heads,
                                         int kv_heads, const Documents documents, const DropoutSite& drop,
                                         const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  __shared__ DkvTiles<D> tiles;
  static_assert(sizeof(DkvTiles<D>) <= kLdsBytes, "LDS over the 64 KiB budget");
  static_assert(kWaveSize == 2 * kMfmaN, "the MFMA layout spans a 64-lane wavefront");
  constexpr int kDBlocks = D / kMfmaM;
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  const AttentionTile block = longest_first(false, kv_heads);  // common/tile_order.h
  const int k0 = block.tile * kBlockRows, b = block.b, kv = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  // The group's k columns (v follows) in the per-group rows, as int (attention_fwd.hip's offsets);
  // its query heads kv·r .. kv·r + r - 1.
  const int group = heads / kv_heads;
  const int qkv_stride = (heads + 2 * kv_heads) * D, k_col = (kv * (group + 2) + group) * D, out_stride = heads * D;
  const float scale = 1.0f / sqrtf((float)D);
  const int wave_k = wave * kMfmaN;                 // the wave's first key in the block
  const int key = k0 + wave_k + mfma_col(lane);     // this lane's key
  // The queries after q_end see none of the workgroup's keys (documents.h; seq without documents).
  const int last_key = k0 + kBlockRows - 1 < seq ? k0 + kBlockRows - 1 : seq - 1;
  const int q_end = DOCS ? wave_uniform(docs.end_after(last_key)) : seq;

  // BLOCK: the keys' own buffer and count; the query tiles from the first query at or after
  // the workgroup's first key.
  const bf16* kv_src = BLOCK ? kb.kv : qkv;
  const int keys = BLOCK ? kb.keys : seq, shift = BLOCK ? kb.shift : 0;
  const int qs_first = BLOCK ? (k0 > shift ? k0 - shift : 0) : k0;
  load_rows<D, kBlockRows>(tiles.k, kv_src, qkv_stride, k_col, k0, keys, batch, b);
  load_rows<D, kBlockRows>(tiles.v, kv_src, qkv_stride, k_col + D, k0, keys, batch, b);

  mfma_acc dk[kDBlocks], dv[kDBlocks];
  UNROLL for (int n = 0; n < kDBlocks; ++n) mfma_zero(dk[n]), mfma_zero(dv[n]);

  // DROP: the mask index of (the group's first query head, query 0, this lane's key), advanced
  // by a head's seq² probabilities per head, and the site's Philox words, all in VGPRs: this
  // kernel's SGPRs are full (d 128 spilled them).
  // (BLOCK: the whole sequence's positions, the site's, not the block's queries.)
  const unsigned long long lane_seq = DROP ? in_vgpr(BLOCK ? drop.seq : seq) : 0;
  unsigned long long drop_at =
      DROP ? drop.attention_index(b, kv * group, BLOCK ? kb.q_first : 0) + (BLOCK ? kb.k_first : 0) + key : 0;
  const DropoutSite lane_drop = DROP ? in_vgprs(drop) : drop;
  // The group's query heads in order, dK and dV summed over them in the same registers.
  for (int head = kv * group; head < (kv + 1) * group; ++head) {
    const int q_col = (head + 2 * kv) * D;
    // (With DROP, the rows' statistics are addressed from VGPRs: SGPRs are full there.)
    const int seq_at = DROP ? (int)in_vgpr(seq) : seq;
    const float* lse_bh = lse + ((size_t)b * heads + head) * seq_at;
    const float* delta_bh = delta + ((size_t)b * heads + head) * seq_at;
    for (int qs = qs_first; qs < q_end; qs += kTileRows) {
      load_rows<D, kTileRows>(tiles.q, qkv, qkv_stride, q_col, qs, seq, batch, b);
      load_rows<D, kTileRows>(tiles.dout, dout, out_stride, head * D, qs, seq, batch, b);
      for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
        // A query past the end gets lse = +inf, so its P (and dS) are exactly 0.
        tiles.lse[i] = qs + i < seq ? lse_bh[qs + i] : INFINITY;
        tiles.delta[i] = qs + i < seq ? delta_bh[qs + i] : 0.0f;
      }
      __syncthreads();
      // Some query of the tile sees some key of the wave (its document starting at or before it).
      const bool seen_by_wave = !DOCS || wave_uniform(docs.start(qs)) <= k0 + wave_k + kMfmaN - 1;
      if (qs + kTileRows - 1 + shift >= k0 + wave_k && seen_by_wave) {
        // S = Q Kᵀ and dP = dO Vᵀ: register r is query qs + mfma_row(lane, r), key `key`.
        mfma_acc s, dp;
        mfma_zero(s);
        mfma_zero(dp);
        rows_product<D>(s, tiles.q, 0, tiles.k, wave_k);
        rows_product<D>(dp, tiles.dout, 0, tiles.v, wave_k);
        UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
          const int qi = mfma_row(lane, r);
          const bool seen = key <= qs + qi + shift && (!DOCS || key >= docs.start(qs + qi));
          const float p = seen ? expf(s.v[r] * scale - tiles.lse[qi]) : 0.0f;
          if constexpr (DROP) {
            const bool kept = lane_drop.keeps(drop_at + (unsigned long long)(qs + qi) * lane_seq);
            s.v[r] = kept ? p * lane_drop.scale : 0.0f;
            dp.v[r] = p * ((kept ? dp.v[r] * lane_drop.scale : 0.0f) - tiles.delta[qi]);
          } else {
            s.v[r] = p;
            dp.v[r] = p * (dp.v[r] - tiles.delta[qi]);
          }
        }
        // dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS (the scale of dK is applied once at the end).
        columns_product<D>(dv, tiles.dout, s);
        columns_product<D>(dk, tiles.q, dp);
      }
      __syncthreads();  // the tile is consumed before the next one (of this head or the next) overwrites it
    }
    if constexpr (DROP) drop_at += lane_seq * lane_seq;
  }

  if (key >= keys) return;
  Out* row = dqkv + ((size_t)key * batch + b) * qkv_stride + k_col;
  UNROLL for (int n = 0; n < kDBlocks; ++n)
    UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
      const int c = kMfmaM * n + mfma_row(lane, r);
      if constexpr (BLOCK) {  // added to the f32 rows
        row[c] += dk[n].v[r] * scale;
        row[D + c] += dv[n].v[r];
      } else {
        row[c] = to_bf16(dk[n].v[r] * scale);
        row[D + c] = to_bf16(dv[n].v[r]);
      }
    }
}

template <int D>
struct alignas(16) DqTiles {
  bf16 q[kBlockRows][D + kPad];
  bf16 dout[kBlockRows][D + kPad];
  bf16 k[kTileRows][D + kPad];
  bf16 v[kTileRows][D + kPad];
};

// DROP: dP is masked before dS (`drop`'s masks). BLOCK: as dkv_body's, `dqkv` f32 rows laid out
// as the queries' that dQ is added to (keys past the block's are zero rows: their dS multiplies
// a zero K).
template <int D, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void dq_body(Out* __restrict__ dqkv, const bf16* __restrict__ qkv,
                                        const bf16* __restrict__ dout, const float* __restrict__ lse,
                                        const float* __restrict__ delta, int batch, int seq, int heads,
                                        int kv_heads, const Documents documents, const DropoutSite& drop,
                                        const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  __shared__ DqTiles<D> tiles;
  static_assert(sizeof(DqTiles<D>) <= kLdsBytes, "LDS over the 64 KiB budget");
  constexpr int kDBlocks = D / kMfmaM;
  const int wave = threadIdx.x / kWaveSize, lane = threadIdx.x % kWaveSize;
  const AttentionTile block = longest_first(true, heads);
  const int q0 = block.tile * kBlockRows, b = block.b, head = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  // The head's q columns and its group's k columns (v follows) in the per-group rows, as int.
  const int group = heads / kv_heads, kv = head / group;
  const int qkv_stride = (heads + 2 * kv_heads) * D, q_col = (head + 2 * kv) * D;
  const int k_col = (kv * (group + 2) + group) * D, out_stride = heads * D;
  const float scale = 1.0f / sqrtf((float)D);
  const int wave_q = wave * kMfmaN, wave_last = q0 + wave_q + kMfmaN - 1;
  const int query = q0 + wave_q + mfma_col(lane);  // this lane's query
  // DOCS: the first key this lane's query sees, and the wave's smallest (documents.h).
  const int first_key = DOCS ? docs.start(query) : 0;
  const int wave_lo = DOCS ? wave_uniform(docs.start(q0 + wave_q)) : 0;

  load_rows<D, kBlockRows>(tiles.q, qkv, qkv_stride, q_col, q0, seq, batch, b);
  load_rows<D, kBlockRows>(tiles.dout, dout, out_stride, (size_t)head * D, q0, seq, batch, b);
  const size_t at = ((size_t)b * heads + head) * seq + query;
  const float row_lse = query < seq ? lse[at] : INFINITY, row_delta = query < seq ? delta[at] : 0.0f;

  mfma_acc dq[kDBlocks];
  UNROLL for (int n = 0; n < kDBlocks; ++n) mfma_zero(dq[n]);

  // Key tiles from the one holding the workgroup's first query's first key to its last query.
  const int last_query = (q0 + kBlockRows < seq ? q0 + kBlockRows : seq) - 1;
  const int first_tile_key = DOCS ? wave_uniform(docs.start(q0) / kTileRows * kTileRows) : 0;
  // BLOCK: the keys' own buffer and count, and the queries' offset from them.
  const bf16* kv_src = BLOCK ? kb.kv : qkv;
  const int keys = BLOCK ? kb.keys : seq, shift = BLOCK ? kb.shift : 0;
  const int last_key = BLOCK ? kb.last_key(last_query) : last_query;
  for (int k0 = first_tile_key; k0 <= last_key; k0 += kTileRows) {
    load_rows<D, kTileRows>(tiles.k, kv_src, qkv_stride, k_col, k0, keys, batch, b);
    load_rows<D, kTileRows>(tiles.v, kv_src, qkv_stride, k_col + D, k0, keys, batch, b);
    __syncthreads();
    if (k0 <= wave_last + shift && (!DOCS || k0 + kTileRows > wave_lo)) {
      // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: register r is key k0 + mfma_row(lane, r), query `query`.
      mfma_acc s, dp;
      mfma_zero(s);
      mfma_zero(dp);
      rows_product<D>(s, tiles.k, 0, tiles.q, wave_q);
      rows_product<D>(dp, tiles.v, 0, tiles.dout, wave_q);
      UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
        const int k = k0 + mfma_row(lane, r);
        const float p = k <= query + shift && (!DOCS || k >= first_key) ? expf(s.v[r] * scale - row_lse) : 0.0f;
        float dpr = dp.v[r];
        if constexpr (DROP && BLOCK) {
          const unsigned long long at = drop.attention_index(b, head, kb.q_first + query) + kb.k_first + k;
          dpr = drop.keeps(at) ? dpr * drop.scale : 0.0f;
        } else if constexpr (DROP) {
          dpr = drop.keeps(drop.attention_index(b, head, query) + k0 + mfma_row(lane, r)) ? dpr * drop.scale : 0.0f;
        }
        s.v[r] = p * (dpr - row_delta);
      }
      columns_product<D>(dq, tiles.k, s);  // dQᵀ += Kᵀ dSᵀ
    }
    __syncthreads();
  }

  if (query >= seq) return;
  Out* dst = dqkv + ((size_t)query * batch + b) * qkv_stride + q_col;
  UNROLL for (int n = 0; n < kDBlocks; ++n)
    UNROLL for (int r = 0; r < kMfmaAcc; ++r) {
      if constexpr (BLOCK)
        dst[kMfmaM * n + mfma_row(lane, r)] += dq[n].v[r] * scale;  // added to the f32 rows
      else
        dst[kMfmaM * n + mfma_row(lane, r)] = to_bf16(dq[n].v[r] * scale);
    }
}

}  // namespace attention_bwd_detail
