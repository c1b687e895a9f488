// attention_fwd.cuh: causal self-attention forward, FlashAttention-2 style, on sm_80+ tensor cores.
//
// Computes, for each sequence b, query head h and query position t < seq, with k and v the
// key/value head of h's group (grouped-query attention: kv_heads divides heads, r = heads /
// kv_heads query heads share a key/value head; r = 1 is multi-head attention):
//   out[t·batch + b][h·d .. h·d + d) = Σ_{u <= t} softmax_u(q_t · k_u / sqrt(d)) · v_u
//   lse[(b·heads + h)·seq + t]       = log Σ_{u <= t} exp(q_t · k_u / sqrt(d))      (saved for backward)
// from the fused QKV activation qkv [seq·batch, (heads + 2·kv_heads)·d] bf16 (rows sequence-first,
// Megatron's per-group layout, as trident's model lays it out: per key/value group g the row holds
// [q_(g·r) .. q_(g·r+r-1) | k_g | v_g], so query head h = g·r + j sits at column (h + 2g)·d and its
// group's k at (g·(r + 2) + r)·d; r = 1 is GPT-2's [q | k | v] per head); out [seq·batch, heads·d]
// bf16; lse f32. Arguments (out, lse, qkv, batch, seq, heads, kv_heads). Head dims 32
// (attention_fwd_bf16_d32), 64 (attention_fwd_bf16_d64) and 128 (attention_fwd_bf16_d128); any
// seq >= 1. The attention_fwd_drop_bf16_d* kernels add attention dropout (common/dropout.h's
// masks, its 13 parameters after kv_heads): each probability that multiplies V is kept and
// scaled by 1/(1 - p) or dropped, index ((b·heads_total + head0 + h)·seq + t)·seq + u, while the
// running sum and lse stay the unmasked ones (what backward rebuilds P from).
// Per-document attention (--reset-attention-mask): the attention_fwd_docs_bf16_d* and
// attention_fwd_drop_docs_bf16_d* kernels take `starts` after kv_heads, each position's document
// start (common/documents.h), and query t sums over its document's keys u, from
// min(starts[b·seq + t], t) to t, alone (a template flag: the other kernels hold no trace of it).
// The block's queries' starts are copied to shared memory with Q (256 B for d 32 and d 128, 512 B
// for d 64 more) and read per masked tile; these kernels state one block per SM, so that ptxas
// gives them the registers the bounds take rather than spilling at a two-blocks budget.
// No [seq, seq] matrix exists: scores live in registers, with the online softmax (running max m
// and per-lane partial sums l, the division by l deferred to the end, FA-2's first change).
//
// Grid: (⌈seq/Q⌉, batch·heads) blocks of 128 threads, Q = 128 queries per block for d 64 and 64
// for d 32 and d 128 (plan/mod.rs's attention_queries), taken longest first (the last query
// tiles of every (b, h) first: common/tile_order.cuh's longest_first). A block owns Q queries of
// one (b, h) and streams its group's K and V (the group's r blocks read the same K/V rows; their
// offsets are computed once per block, nothing per score changes with r); each of its 4 warps
// owns Q/4 consecutive queries (split-Q: no cross-warp reduction),
// as MT = Q/64 row tiles of 16 (FA-2's 128-query blocks of 4 warps for d 64: each K and V
// fragment a warp reads from shared memory feeds MT mma, so the ldmatrix traffic per mma halves
// at MT = 2). Per key tile of BN keys (64 for d 32 and d 64, 32 for d 128), a warp computes
// S = Q Kᵀ (16·MT x BN) with mma.sync.m16n8k16 (Q and K through ldmatrix, K's rows being B's
// columns), masks u > t, rescales its O accumulator, and multiplies P (rounded to bf16 as it is
// computed, packed from the S accumulator fragments straight into A fragments) by V, whose B
// fragments come from ldmatrix.trans on V's rows. Key tiles run from the one holding the
// block's first query's document start (0 without documents) to the block's last query.
// Causal work per warp (FA-2's split of the masked steps from the rest; warp-uniform branches):
// a key tile that reaches past the warp's first query, or begins before its last row's document,
// is masked (the compares and select per score), a tile wholly at or before the first and within
// every row's document runs without them, and a tile wholly after the warp's last query or
// before its first row's document (or any tile of a warp whose rows are all past seq) is
// skipped. Keys past seq (zero rows) lie only in masked tiles, after every live row. A row whose
// first tiles hold no key of its document keeps the running max -inf through them, and its
// exponents are taken from 0 there (2^-inf = 0, not the NaN of -inf + inf).
// Softmax in base 2 (FA-2's): m is the running max of the raw scores q·k, and with scale_log2 =
// log2(e)/sqrt(d) each probability is 2^(s·scale_log2 - m·scale_log2), one FFMA and one
// ex2.approx (common/ptx.cuh's exp2_approx, relative error within 2^-22) where expf of the
// scaled score cost a multiply and eight instructions; lse = m/sqrt(d) + log(l).
//
// Pipeline (FA-2's loop with the loads overlapped): the block's Q tile is loaded once, with the
// first key tile, and stays in shared memory (each warp reads its rows with ldmatrix per key
// tile, as FA-2 does by default: held in registers instead it cost 30-40 more registers per
// thread and row tile). K/V tiles stream through a ring of kStages = 2 shared-memory stages
// (common/cp_async_ring.cuh): tile j+1's cp.async copies (zero-filled past seq) are in flight
// while tile j's QK^T, softmax and PV run, with one barrier per tile. Each thread issues a fixed,
// unrolled set of 16-byte copies per tile (cp_async_ring.cuh's cp_async_rows), one 64-bit
// multiply-add of address each.
//
// Shared memory (dynamic, 8 bf16 of padding per row spread ldmatrix rows over the banks): Q
// Q x (d + 8) plus kStages x (K and V BN x (d + 8)) bf16 = 25600 B for d 32, 55296 B for d 64,
// 52224 B for d 128 (the last two above the default 48 KiB: the launch opts in; the kernel index
// states all three). Rows of d + 8 = 40, 72 or 136 bf16 (80, 144, 272 B) put the 8 rows of an
// ldmatrix 8x8 matrix on 8 distinct 16-byte bank groups. Registers: the O accumulator is
// MT·d/2 f32 per thread (16, 64 or 64), S is MT·BN/2 (32, 64 or 16); ptxas takes about 105-120
// (d 32), 215-225 (d 64) and 128 (d 128), so 2 blocks of d 64 share an SM (8 warps, as FA-2's
// d 64 forward); `make kernels-check` prints the counts and rejects spills. The block's q, k
// offsets within a position are ints and the K/V addresses are formed in the loads (qkv + k_at):
// ptxas then keeps the per-tile loads shortest and spills nothing (kept as pointers, the same
// offsets cost 15-50 more instructions per key tile, and at 128 registers d 128 spilled). d 32
// stays at one row tile per warp: its softmax costs as many instructions per score and half the
// mma, so it is bound by issue rather than by shared memory, and one row tile keeps 4 blocks per
// SM.
// d 32 keeps d 64's 64-key tile: with 128 keys (FA-2's d 32 tile) S doubles, and at tiny's
// sequence of 128 a 128-key tile computes 256 key rows per (b, h) where 64 compute 192. The mma
// shapes need d and BN to be multiples of 16 (k16 steps over d for S, n-tile pairs over d for
// P V, k16 blocks over BN).
//
// Reference: `attention_forward` of the reference device (`attention_forward_head` in
// src/device/kernels.rs), f64 on the same bf16 qkv (tests/cuda_emulation.rs).
//
// The kernels are attention_fwd.cu's (the whole sequence) and attention_block.cu's (context
// parallelism's blocks, common/key_block.h); a kernel file includes this header after the
// headers below (NVRTC resolves a header's own includes only among those already seen).
#pragma once
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/tile_order.cuh"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"

namespace attention_fwd_detail {

constexpr int kThreads = 128, kStages = 2;

// A block of 4 warps, each owning MT m16 row tiles (16·MT consecutive queries): 64·MT queries.
template <int D, int BN, int MT, bool DOCS = false>
struct Tiles {
  static constexpr int kQueries = 64 * MT;
  struct Stage {
    bf16 k[BN][D + 8];
    bf16 v[BN][D + 8];
  };
  bf16 q[kQueries][D + 8];
  Stage stage[kStages];
};
// DOCS: the block's queries' document starts too, after the rest.
template <int D, int BN, int MT>
struct Tiles<D, BN, MT, true> : Tiles<D, BN, MT, false> {
  int start[64 * MT];
};
// The per-head-dim instances: key tile BN and row tiles per warp MT.
template <int D, bool DOCS = false>
using TilesOf = Tiles<D, D == 128 ? 32 : 64, D == 64 ? 2 : 1, DOCS>;
// Queries per block (the launch's grid tile: src/gpu/kernels/plan/mod.rs) and dynamic shared memory
// per block (kernel index: src/gpu/kernels/mod.rs).
constexpr int kQueriesD32 = TilesOf<32>::kQueries, kQueriesD64 = TilesOf<64>::kQueries,
              kQueriesD128 = TilesOf<128>::kQueries;
constexpr unsigned kSharedBytesD32 = sizeof(TilesOf<32>), kSharedBytesD64 = sizeof(TilesOf<64>),
                   kSharedBytesD128 = sizeof(TilesOf<128>);
static_assert(kQueriesD32 == 64 && kQueriesD64 == 128 && kQueriesD128 == 64, "the header and plan/mod.rs state these");
static_assert(kSharedBytesD32 == 25600 && kSharedBytesD64 == 55296 && kSharedBytesD128 == 52224,
              "the header and the kernel index state these");
// The _docs_ kernels' (the queries' document starts added).
constexpr unsigned kDocsSharedBytesD32 = sizeof(TilesOf<32, true>), kDocsSharedBytesD64 = sizeof(TilesOf<64, true>),
                   kDocsSharedBytesD128 = sizeof(TilesOf<128, true>);
static_assert(kDocsSharedBytesD32 == 25856 && kDocsSharedBytesD64 == 55808 && kDocsSharedBytesD128 == 52480,
              "the kernel index states these");

// One key tile of BN keys from k0 for the warp's 16·MT queries (row tile i: rows
// row_base + 16i and row_base + 16i + 8 of this lane): S = Q Kᵀ, the causal mask where MASK (a
// tile that reaches past the warp's first query; below the diagonal every key is at or before
// every query and the compare is skipped), the online softmax update of m, l and o, and
// O += P V. Each K and V fragment from ldmatrix feeds the MT row tiles' mma. m is the running
// max of the raw scores q·k; the softmax's exponent is s·scale_log2 - m·scale_log2 (scale_log2 =
// log2(e)/sqrt(d)), one FFMA and one ex2.approx per score.
// DROP: attention dropout, the probabilities that multiply V masked and scaled (`drop`, keyed
// by the (b, head) pair `bh`), l summing the unmasked ones.
// BLOCK: a block of context parallelism (common/key_block.h): query t sees keys up to t + shift
// below kb.keys, and dropout draws at the block's whole-sequence positions.
template <int D, int BN, int MT, bool MASK, bool DROP, bool DOCS, bool BLOCK = false>
__device__ __forceinline__ void attend_tile(float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                            bf16 (*q)[D + 8], bf16 (*k)[D + 8], bf16 (*v)[D + 8], int k0,
                                            int row_base, const int* first_keys, float scale_log2,
                                            const DropoutSite& drop, DropPair bh, const KeyBlock& kb = KeyBlock{}) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
  const int shift = BLOCK ? kb.shift : 0, q_first = BLOCK ? kb.q_first : 0, k_first = BLOCK ? kb.k_first : 0;
  // S = Q Kᵀ for the warp's 16·MT queries and the tile's BN keys.
  float s[MT][BN / 8][4];
  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int j = 0; j < BN / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) s[i][j][e] = 0.0f;
  UNROLL
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t qa[MT][4];
    UNROLL
    for (int i = 0; i < MT; ++i) ldmatrix_x4(qa[i], &q[(warp * MT + i) * 16 + lane % 16][kk + (lane / 16) * 8]);
    UNROLL
    for (int p = 0; p < BN / 16; ++p) {
      uint32_t r[4];
      ldmatrix_x4(r, &k[p * 16 + lane % 8 + (lane / 16) * 8][kk + ((lane / 8) % 2) * 8]);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      UNROLL
      for (int i = 0; i < MT; ++i) {
        mma_m16n8k16_bf16(s[i][2 * p], qa[i], b0, s[i][2 * p]);
        mma_m16n8k16_bf16(s[i][2 * p + 1], qa[i], b1, s[i][2 * p + 1]);
      }
    }
  }

  // Causal mask, online softmax. Element e of n-tile j of row tile i is row
  // row_base + 16i + 8 (e / 2), key k0 + 8j + 2 t4 + e % 2.
  uint32_t pa[MT][BN / 16][4];
  UNROLL
  for (int i = 0; i < MT; ++i) {
    // MASK and DOCS: the first key each of the row tile's two rows of this lane sees, from the
    // warp's rows' starts in shared memory (`first_keys`; read per masked tile: held across the
    // tiles they spilled the d 64 kernel with dropout).
    int row_start[2] = {0, 0};
    if constexpr (MASK && DOCS)
      UNROLL
      for (int h = 0; h < 2; ++h) row_start[h] = first_keys[16 * i + 8 * h + threadIdx.x % 32 / 4];
    float tile_max[2] = {-INFINITY, -INFINITY};
    UNROLL
    for (int j = 0; j < BN / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + 8 * j + 2 * t4 + e % 2;
        if (MASK && (key > row_base + shift + 16 * i + (e / 2) * 8 || (DOCS && key < row_start[e / 2]) ||
                     (BLOCK && key >= kb.keys)))
          s[i][j][e] = -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[i][j][e]);
      }
    float correction[2], max_scaled[2];
    UNROLL
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL_WARP_MASK, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL_WARP_MASK, tile_max[h], 2));
      // Without documents the new max is finite: every row's first tile holds key 0. Under
      // documents a row's max stays -inf through tiles wholly before its document's start, and
      // its exponents are taken from 0 there, so that its probabilities and correction are
      // 2^-inf = 0, not 2^(-inf + inf) = NaN. At a row's first seen key the old m = -inf gives a
      // correction of 2^-inf = 0 (o and l are still 0).
      const float m_new = fmaxf(m[i][h], tile_max[h]);
      max_scaled[h] = DOCS && m_new == -INFINITY ? 0.0f : m_new * scale_log2;
      correction[h] = exp2_approx(m[i][h] * scale_log2 - max_scaled[h]);
      m[i][h] = m_new;
      l[i][h] *= correction[h];
    }
    // P = 2^(s·scale_log2 - m·scale_log2) (a masked score, -inf, gives 2^-inf = 0), added to l
    // in f32 and rounded to bf16 at once: the accumulator fragments of S n-tiles 2c and 2c + 1
    // are exactly the A fragment of P's k16 block c (a[0] = row g, keys 2t4.. of tile 2c; a[1] =
    // row g + 8 of it; a[2], a[3] the same of tile 2c + 1), so P lives as BN/4 packed registers
    // per row tile.
    // DROP: the mask index of the lane's first key of the tile in its two rows.
    unsigned long long at[2] = {0, 0};
    if constexpr (DROP)
      UNROLL
      for (int h = 0; h < 2; ++h)
        at[h] = drop.attention_index(bh.b, bh.head, q_first + row_base + 16 * i + 8 * h) + k_first + k0 + 2 * t4;
    UNROLL
    for (int j = 0; j < BN / 8; ++j)
      UNROLL
      for (int h = 0; h < 2; ++h) {
        float p0 = exp2_approx(fmaf(s[i][j][2 * h], scale_log2, -max_scaled[h]));
        float p1 = exp2_approx(fmaf(s[i][j][2 * h + 1], scale_log2, -max_scaled[h]));
        l[i][h] += p0 + p1;
        if constexpr (DROP) {
          const unsigned kept = drop.keeps2(at[h] + 8 * j);
          p0 = kept & 1u ? p0 * drop.scale : 0.0f;
          p1 = kept & 2u ? p1 * drop.scale : 0.0f;
        }
        pa[i][j / 2][(j % 2) * 2 + h] = pack_bf16x2(p0, p1);
      }
    UNROLL
    for (int j = 0; j < D / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) o[i][j][e] *= correction[e / 2];
  }

  // O += P V.
  UNROLL
  for (int c = 0; c < BN / 16; ++c) {
    UNROLL
    for (int dp = 0; dp < D / 16; ++dp) {
      // Matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15)
      // of V's 16x16 block, transposed: B fragments of d n-tiles 2dp and 2dp + 1.
      uint32_t r[4];
      ldmatrix_x4_trans(r, &v[c * 16 + lane % 16][dp * 16 + (lane / 16) * 8]);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      UNROLL
      for (int i = 0; i < MT; ++i) {
        mma_m16n8k16_bf16(o[i][2 * dp], pa[i][c], b0, o[i][2 * dp]);
        mma_m16n8k16_bf16(o[i][2 * dp + 1], pa[i][c], b1, o[i][2 * dp + 1]);
      }
    }
  }
}

// An output element: bf16 for the whole attention, f32 for a block (merged in f32).
__device__ __forceinline__ void store_out(bf16* dst, float x) { *dst = to_bf16(x); }
__device__ __forceinline__ void store_out(float* dst, float x) { *dst = x; }

// BLOCK: one block of context parallelism (common/key_block.h), `qkv` the queries' buffer at
// their first position, `seq` their count, `kb` the keys'; `Out` f32.
template <int D, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void attention_fwd_body(Out* __restrict__ out, float* __restrict__ lse,
                                                   const bf16* __restrict__ qkv, int batch, int seq, int heads,
                                                   int kv_heads, const Documents documents, const DropoutSite& drop,
                                                   const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  using Shared = TilesOf<D, DOCS>;
  constexpr int BN = sizeof(Shared::Stage::k) / sizeof(Shared::Stage::k[0]), kQueries = Shared::kQueries,
                MT = kQueries / 64;
  static_assert(D % 16 == 0 && BN % 16 == 0, "k16 steps over d, n-tile pairs over d, k16 blocks over BN");
  DYNAMIC_SHARED(Shared, tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const AttentionTile block = longest_first(true, heads);  // common/tile_order.cuh
  const int q0 = block.tile * kQueries, b = block.b, head = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  const float scale = 1.0f / sqrtf((float)D), scale_log2 = 1.44269504f * scale;
  // Position 0's q of the block's head, at column (head + 2 kv)·d of the per-group rows of
  // r = heads / kv_heads query heads, and its group's k at column (kv (r + 2) + r)·d (v follows);
  // offsets within one position's rows (int), the K/V addresses formed in the loads; k_at spelt
  // out, not from row_width: ptxas's registers depend on the form (the header).
  const int group = heads / kv_heads, kv = head / group;
  const int row_width = (heads + 2 * kv_heads) * D;
  const size_t pos_stride = (size_t)batch * row_width;
  const bf16* q_src = qkv + b * row_width + (head + 2 * kv) * D;
  const int k_at = b * (heads + 2 * kv_heads) * D + (kv * (group + 2) + group) * D;

  cp_async_rows<D, kQueries, kThreads>(tiles.q, q_src, pos_stride, q0, seq);  // joins key tile 0's group
  if constexpr (DOCS) load_words<kQueries>(tiles.start, docs.starts, q0, seq, 0);  // so do the rows' starts

  float o[MT][D / 8][4];
  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int j = 0; j < D / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) o[i][j][e] = 0.0f;
  // Row state for the lane's rows (g and g + 8 of each row tile): the running max, and this
  // lane's part of the running sum (the four lanes of a group are added at the end).
  float m[MT][2], l[MT][2];
  UNROLL
  for (int i = 0; i < MT; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  const int warp_first = q0 + warp * 16 * MT, warp_last = warp_first + 16 * MT - 1, row_base = warp_first + g;

  // Key tiles from the one holding the block's first query's first key (0 without documents) to
  // its last query's last key.
  const int last_query = (q0 + kQueries < seq ? q0 + kQueries : seq) - 1;
  const int last_key = BLOCK ? kb.last_key(last_query) : last_query;
  const int first_tile = DOCS ? docs.start(q0) / BN : 0;
  cp_async_ring<kStages>(
      last_key / BN + 1 - first_tile,
      [&](int stage, int t) {
        const int k0 = (first_tile + t) * BN;
        // BLOCK: the keys' own buffer and count (`kb` named only in the branch compiled for
        // blocks: captured by the lambdas otherwise, it changed the other kernels' registers).
        if constexpr (BLOCK) {
          cp_async_rows<D, BN, kThreads>(tiles.stage[stage].k, kb.kv + k_at, pos_stride, k0, kb.keys);
          cp_async_rows<D, BN, kThreads>(tiles.stage[stage].v, kb.kv + k_at + D, pos_stride, k0, kb.keys);
        } else {
          cp_async_rows<D, BN, kThreads>(tiles.stage[stage].k, qkv + k_at, pos_stride, k0, seq);
          cp_async_rows<D, BN, kThreads>(tiles.stage[stage].v, qkv + k_at + D, pos_stride, k0, seq);
        }
      },
      [&](int stage, int t) {
        // Per warp (uniform branches): a tile wholly after the warp's last query or wholly before
        // its rows' documents is skipped (all its scores are masked; so is every tile of a warp
        // whose rows are all past seq), one that reaches past the warp's first query or starts
        // before one of its rows' documents is masked, the others run without the compare.
        const int k0 = (first_tile + t) * BN;
        auto& st = tiles.stage[stage];
        // BLOCK: skipped past the warp's last query's last key, masked where the tile reaches
        // past its first query's or past the keys.
        if constexpr (BLOCK) {
          if (k0 > warp_last + kb.shift || warp_first >= seq) return;
          const DropPair bh{b, head};
          if (k0 + BN - 1 > warp_first + kb.shift || k0 + BN > kb.keys)
            attend_tile<D, BN, MT, true, DROP, false, true>(o, m, l, tiles.q, st.k, st.v, k0, row_base, nullptr,
                                                            scale_log2, drop, bh, kb);
          else
            attend_tile<D, BN, MT, false, DROP, false, true>(o, m, l, tiles.q, st.k, st.v, k0, row_base, nullptr,
                                                             scale_log2, drop, bh, kb);
          return;
        }
        if (k0 > warp_last || warp_first >= seq) return;
        const DropPair bh{b, head};
        // DOCS: by the warp's first and last rows' documents (their starts the smallest and the
        // largest); `docs` named only in this branch (captured by the lambda otherwise, it would
        // change the plain kernels' code).
        if constexpr (DOCS) {
          const int* first_keys = tiles.start + (warp_first - q0);
          const int last = (warp_last < seq ? warp_last : seq - 1) - warp_first;
          if (k0 + BN <= first_keys[0]) return;
          if (k0 + BN - 1 > warp_first || k0 < first_keys[last])
            attend_tile<D, BN, MT, true, DROP, true>(o, m, l, tiles.q, st.k, st.v, k0, row_base, first_keys,
                                                     scale_log2, drop, bh);
          else
            attend_tile<D, BN, MT, false, DROP, true>(o, m, l, tiles.q, st.k, st.v, k0, row_base, first_keys,
                                                      scale_log2, drop, bh);
        } else if (k0 + BN - 1 > warp_first) {
          attend_tile<D, BN, MT, true, DROP, false>(o, m, l, tiles.q, st.k, st.v, k0, row_base, nullptr, scale_log2,
                                                    drop, bh);
        } else {
          attend_tile<D, BN, MT, false, DROP, false>(o, m, l, tiles.q, st.k, st.v, k0, row_base, nullptr, scale_log2,
                                                     drop, bh);
        }
      });

  const size_t width = (size_t)heads * D;
  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int h = 0; h < 2; ++h) {
      float total = l[i][h];
      total += __shfl_xor_sync(FULL_WARP_MASK, total, 1);
      total += __shfl_xor_sync(FULL_WARP_MASK, total, 2);
      const int row = row_base + 16 * i + 8 * h;
      if (row >= seq) continue;
      const float inv = 1.0f / total;
      Out* dst = out + ((size_t)row * batch + b) * width + (size_t)head * D;
      UNROLL
      for (int j = 0; j < D / 8; ++j) {
        store_out(&dst[8 * j + 2 * t4], o[i][j][2 * h] * inv);
        store_out(&dst[8 * j + 2 * t4 + 1], o[i][j][2 * h + 1] * inv);
      }
      if (t4 == 0) lse[((size_t)b * heads + head) * seq + row] = m[i][h] * scale + logf(total);
    }
}

}  // namespace attention_fwd_detail
