// attention_bwd.cuh: causal self-attention backward, FlashAttention-2 style, on sm_80+ tensor cores,
// deterministic (no atomics).
//
// Computes, for each sequence b and query head h (k, v: the key/value head of h's group; r =
// heads / kv_heads query heads per group, grouped-query attention; r = 1 is multi-head), with
// scale s = 1/sqrt(d), P_ij = exp(s q_i·k_j - lse_i) for j <= i (0 otherwise) rebuilt from the
// forward's log-sum-exp, and delta_i = dO_i · O_i:
//   dV_j = Σ_h Σ_i P_ij dO_i       dS_ij = P_ij (dO_i · v_j - delta_i)
//   dK_j = s Σ_h Σ_i dS_ij q_i     dQ_i  = s Σ_j dS_ij k_j
// (dK and dV of a key/value head sum over the r query heads h of its group.)
// Inputs: qkv [seq·batch, (heads + 2·kv_heads)·d] bf16 (the forward's fused rows, Megatron's
// per-group layout: per group g [q_(g·r) .. q_(g·r+r-1) | k_g | v_g], attention_fwd.cu), out and
// dout [seq·batch, heads·d] bf16, lse [batch·heads·seq] f32. Output: dqkv, laid out like qkv, bf16
// (overwritten: each of q, k, v columns is written once). Head dims 32, 64 and 128; any seq >= 1.
// Every kernel takes (…, batch, seq, heads, kv_heads); delta's work is on out/dout alone. The
// *_docs_* twins of dK/dV and dQ (with and without dropout) take `starts` after kv_heads,
// per-document attention as in the forward (common/documents.h): P_ij = 0 unless j lies in i's
// document. dQ holds its queries' starts in shared memory as the forward does; dK/dV streams each
// query tile's starts with its lse and delta (kStages x tile ints more) and ends its query tiles
// at the end of its last key's document (a binary search over the starts). Both state one block
// per SM, as the forward's.
// The *_drop_* twins of dK/dV and dQ add attention dropout (common/dropout.h's masks, its 13
// parameters after kv_heads; the forward's attention_fwd_drop_*): with m the mask and
// c = 1/(1 - p), dV_j takes m_ij c P_ij and dS_ij = P_ij (m_ij c dO_i · v_j - delta_i), delta
// being the dropped output's.
// Three kernels, launched in this order:
//   attention_bwd_delta_bf16:      delta [batch·heads·seq] f32. Grid ⌈seq·batch·heads / 4⌉ blocks
//                                  of 128, a warp per (row, head), warp_sum over d.
//   attention_bwd_dkv_bf16_d{32,64,128}: grid (⌈seq/64⌉, batch·kv_heads), 128 threads, taken longest
//                                  first (common/tile_order.cuh: first key tiles first); a block owns 64
//                                  keys of one (b, key/value head), a warp 16 of them, and for
//                                  each of the group's r query heads in turn (a ring of query
//                                  tiles per head, a barrier between; dK and dV accumulate in
//                                  registers over the heads, in head order, and are written once:
//                                  deterministic) walks the query tiles from the diagonal to the
//                                  end (to its keys' last document's end), computing Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
//                                  (keys as the M dimension), then dV += Pᵀ dO and dK += dSᵀ Q
//                                  with Pᵀ / dSᵀ repacked from accumulator to A fragments and dO
//                                  / Q through ldmatrix.trans (d 64 holds its K and V A
//                                  fragments in registers across the tiles). Query tiles: 64
//                                  (d 32), 32 (d 64), 16 (d 128).
//   attention_bwd_dq_bf16_d{32,64,128}: grid (⌈seq/Q⌉, batch·heads), 128 threads, longest first
//                                  (the last query tiles first); a block owns Q queries of one
//                                  (b, query head) (plan/mod.rs's attention_queries: 128 for d 64,
//                                  64 for d 32 and d 128) and streams its group's K and V, a
//                                  warp Q/4 as MT = Q/64 row tiles of 16 (each K and V
//                                  fragment feeds MT mma, as in the forward), and walks
//                                  the key tiles from its first query's document start up to
//                                  the diagonal, recomputing S and dP, then
//                                  dQ += dS K (K through ldmatrix.trans). Key tiles: 64 (d 32),
//                                  32 (d 64), 16 (d 128).
// The streamed tile times d is 2048 for every head dim, so each stage moves the same 8 KiB of
// bf16 rows (4 cp.async copies of 16 bytes per thread) and holds the same score registers per
// row tile; the
// mma shapes need d and the tile to be multiples of 16, and dK/dV's lse and delta loads (one
// thread per entry, load_words) need 2 x tile <= 128 threads, so 64 is d 32's largest tile.
// Splitting dQ from dK/dV costs a second computation of S and dP instead of FA-2's f32 atomicAdd
// into dQ, and makes the result independent of scheduling (docs/design.md, Determinism).
// Causal work per warp (warp-uniform branches, as in the forward): a streamed tile that holds a
// pair with the key after the query or before the query's document is masked (the compares and
// select per score), the other tiles below the diagonal run without them, and tiles with no live
// pair for the warp (or all tiles of a warp whose own rows are all past seq) are skipped. P is rebuilt in base 2:
// 2^(s·scale_log2 - lse·log2(e)) with scale_log2 = log2(e)/sqrt(d), one FFMA and one ex2.approx
// (common/ptx.cuh's exp2_approx, relative error within 2^-22) per score where expf cost a
// multiply and eight instructions.
//
// Pipeline: the streamed tiles (dK/dV: Q, dO and their lse and delta rows; dQ: K and V) go
// through a ring of kStages = 2 shared-memory stages (common/cp_async_ring.cuh): tile j+1's
// cp.async copies (zero-filled past seq) are in flight while tile j's products run, with one
// barrier per tile. The block's own rows (dK/dV: K and V; dQ: Q and dO) are loaded once, with
// the first streamed tile, and stay in shared memory. Each thread issues a fixed, unrolled set of
// 16-byte copies per tile (common/cp_async_ring.cuh's cp_async_rows), one 64-bit multiply-add of
// address each.
//
// Shared memory (dynamic, 8 bf16 of padding per row): dkv: K, V 64 x (d + 8) bf16 plus kStages x
// (Q, dO tile x (d + 8) bf16 and 2 x tile f32) = 31744 B (d 32), 37376 B (d 64), 52480 B
// (d 128); dq: Q, dO Q x (d + 8) plus kStages x (K, V tile x (d + 8)) = 30720 B (d 32), 55296 B
// (d 64), 52224 B (d 128). dK/dV's d 128 and dQ's d 64 and d 128 are above the default 48 KiB
// and opt in; the kernel index states all six. Registers: dkv holds dK and dV (d f32 per thread)
// and two score tiles (tile/2 f32 each), 96 for d 32 and d 64, 144 for d 128; dq holds dQ
// (MT·d/2) and two (MT·tile/2 each), 80, 128 and 80; dkv of d 64 also holds its warp's K and V
// A fragments (32). ptxas takes about 160 (dkv d 32), 168 (dkv d 64: 3 blocks per SM), 230 (dkv
// d 128), 110-128 (dq d 32), 225 (dq d 64: 2 blocks per SM) and 128 (dq d 128); `make
// kernels-check` prints the counts and rejects spills. The per-position offsets (k, dO, lse and
// delta rows; dQ's q too) are ints with the addresses formed in the loads, in the forms in which
// ptxas keeps a tile's loads shortest and spills nothing (the forward's note); with r = 1 dK/dV
// runs one ring, the loop multi-head attention ran.
//
// Reference: `attention_backward` of the reference device (`attention_backward_head` in
// src/device/kernels.rs), f64 on the same bf16 inputs and f32 lse (tests/cuda_emulation.rs).
//
// The kernels are attention_bwd.cu's (the whole sequence) and attention_block.cu's (context
// parallelism's blocks, common/key_block.h); a kernel file includes this header after the
// headers below (NVRTC resolves a header's own includes only among those already seen).
#pragma once
#include "common/base.cuh"
#include "common/ptx.cuh"
#include "common/cp_async_ring.cuh"
#include "common/reduce.h"
#include "common/tile_order.cuh"
#include "common/dropout.h"
#include "common/documents.h"
#include "common/key_block.h"

namespace attention_bwd_detail {

constexpr int kBlockRows = 64, kThreads = 128, kStages = 2;
constexpr float kLog2e = 1.44269504f;

// The A fragment of the 16x16 block at (row0, k0) of a row-major tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], bf16 (*tile)[D + 8], int row0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, &tile[row0 + lane % 16][k0 + (lane / 16) * 8]);
}
// B fragments of n-tiles n0..n0+7 and n0+8..n0+15 when the tile's rows are B's columns
// (tile[n][k], e.g. K when computing Q Kᵀ).
template <int D>
__device__ __forceinline__ void load_b_rows(uint32_t (&b0)[2], uint32_t (&b1)[2], bf16 (*tile)[D + 8], int n0, int k0) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  ldmatrix_x4(r, &tile[n0 + lane % 8 + (lane / 16) * 8][k0 + ((lane / 8) % 2) * 8]);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// B fragments of n-tiles n0.. and n0+8.. when the tile is B itself, row-major (tile[k][n], e.g.
// V when computing P V): the transposing ldmatrix.
template <int D>
__device__ __forceinline__ void load_b_trans(uint32_t (&b0)[2], uint32_t (&b1)[2], bf16 (*tile)[D + 8], int k0,
                                             int n0) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  ldmatrix_x4_trans(r, &tile[k0 + lane % 16][n0 + (lane / 16) * 8]);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// The A fragment of k16 block c of a 16-row matrix held as accumulator n-tiles (2c, 2c + 1).
__device__ __forceinline__ void repack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// The score pair both kernels recompute, for the warp's MT row tiles of 16 against the N rows
// of b1 and b2 (both [rows][D + 8] tiles): s1 = a1 b1ᵀ and s2 = a2 b2ᵀ over d, each B fragment
// of b1 and b2 feeding the MT row tiles' mma. a_frags(i, kk, x1, x2) gives the A fragments of
// row tile i's k16 block at kk of a1 and a2 (from shared memory, or registers held across tiles).
// dK/dV: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ; dQ: S = Q Kᵀ, dP = dO Vᵀ.
template <int D, int N, int MT, class AFrags>
__device__ __forceinline__ void score_pair(float (&s1)[MT][N / 8][4], float (&s2)[MT][N / 8][4], AFrags a_frags,
                                           bf16 (*b1)[D + 8], bf16 (*b2)[D + 8]) {
  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int j = 0; j < N / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) s1[i][j][e] = s2[i][j][e] = 0.0f;
  UNROLL
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t x1[MT][4], x2[MT][4];
    UNROLL
    for (int i = 0; i < MT; ++i) a_frags(i, kk, x1[i], x2[i]);
    UNROLL
    for (int p = 0; p < N / 16; ++p) {
      uint32_t b0[2], b1f[2];
      load_b_rows<D>(b0, b1f, b1, p * 16, kk);
      UNROLL
      for (int i = 0; i < MT; ++i) {
        mma_m16n8k16_bf16(s1[i][2 * p], x1[i], b0, s1[i][2 * p]);
        mma_m16n8k16_bf16(s1[i][2 * p + 1], x1[i], b1f, s1[i][2 * p + 1]);
      }
      load_b_rows<D>(b0, b1f, b2, p * 16, kk);
      UNROLL
      for (int i = 0; i < MT; ++i) {
        mma_m16n8k16_bf16(s2[i][2 * p], x2[i], b0, s2[i][2 * p]);
        mma_m16n8k16_bf16(s2[i][2 * p + 1], x2[i], b1f, s2[i][2 * p + 1]);
      }
    }
  }
}

template <int D, int BQ, bool DOCS = false>
struct DkvTiles {
  struct Stage {
    bf16 q[BQ][D + 8];
    bf16 dout[BQ][D + 8];
    float lse[BQ];
    float delta[BQ];
  };
  bf16 k[kBlockRows][D + 8];
  bf16 v[kBlockRows][D + 8];
  Stage stage[kStages];
};
// DOCS: each stage's query tile's document starts too, after the rest.
template <int D, int BQ>
struct DkvTiles<D, BQ, true> : DkvTiles<D, BQ, false> {
  int start[kStages][BQ];
};

// One query tile of BQ queries from qs for the warp's 16 keys (key_base, key_base + 8 of this
// lane): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, Pᵀ and dSᵀ, then dV += Pᵀ dO and dK += dSᵀ Q. MASK: the
// tile holds a query before one of the warp's keys, so each score is checked (past the
// diagonal every query is at or after every key and the compare is skipped).
// P = 2^(s·scale_log2 - lse·log2(e)), scale_log2 = log2(e)/sqrt(d): one FFMA and one ex2.approx.
// kv_frags: score_pair's A fragments of the warp's K and V rows. DROP: attention dropout
// (`drop`'s masks of the (b, query head) pair `bh`): dV takes the masked Pᵀ, and dPᵀ is masked
// before dSᵀ.
// BLOCK: a block of context parallelism (common/key_block.h): query t sits at key position
// t + shift, and dropout draws at the block's whole-sequence positions.
template <int D, int BQ, bool MASK, bool DROP, bool DOCS, bool BLOCK = false, class KvFrags>
__device__ __forceinline__ void dkv_tile(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                         typename DkvTiles<D, BQ>::Stage& st, int qs, int key_base, float scale_log2,
                                         KvFrags kv_frags, const int* tile_start, const DropoutSite& drop,
                                         DropPair bh, const KeyBlock& kb = KeyBlock{}) {
  const int t4 = threadIdx.x % 4;
  const int shift = BLOCK ? kb.shift : 0, q_first = BLOCK ? kb.q_first : 0, k_first = BLOCK ? kb.k_first : 0;
  bf16(*q)[D + 8] = st.q;
  bf16(*dout)[D + 8] = st.dout;
  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for the warp's 16 keys and the tile's BQ queries.
  float sp_dpt[2][1][BQ / 8][4];
  score_pair<D, BQ, 1>(sp_dpt[0], sp_dpt[1], kv_frags, q, dout);
  float(&sp)[BQ / 8][4] = sp_dpt[0][0];
  float(&dpt)[BQ / 8][4] = sp_dpt[1][0];
  // Pᵀ and dSᵀ in place: element e of n-tile j is key key_base + 8 (e / 2), query
  // qs + 8j + 2 t4 + e % 2. A query past seq needs no mask: its q and dO rows, lse and delta
  // load as zeros, so P = 2^0 = 1, dP = 0, dS = 0, and it adds exact zeros to dV (P dO) and dK.
  UNROLL
  for (int j = 0; j < BQ / 8; ++j)
    UNROLL
    for (int e = 0; e < 4; ++e) {
      const int key = key_base + (e / 2) * 8, qi = 8 * j + 2 * t4 + e % 2;
      float p = exp2_approx(fmaf(sp[j][e], scale_log2, -st.lse[qi] * kLog2e));
      // DOCS: also the keys before the query's document (its start, from the stage's tile_start).
      if (MASK && (key > qs + qi + shift || (DOCS && key < tile_start[qi]))) p = 0.0f;
      if constexpr (DROP) {
        const bool kept = drop.keeps(drop.attention_index(bh.b, bh.head, q_first + qs + qi) + k_first + key);
        sp[j][e] = kept ? p * drop.scale : 0.0f;
        dpt[j][e] = p * ((kept ? dpt[j][e] * drop.scale : 0.0f) - st.delta[qi]);
        continue;
      }
      sp[j][e] = p;
      dpt[j][e] = p * (dpt[j][e] - st.delta[qi]);
    }
  // dV += Pᵀ dO, dK += dSᵀ Q (the scale of dK is applied once at the end).
  UNROLL
  for (int c = 0; c < BQ / 16; ++c) {
    uint32_t pa[4], dsa[4];
    repack_a(pa, sp[2 * c], sp[2 * c + 1]);
    repack_a(dsa, dpt[2 * c], dpt[2 * c + 1]);
    UNROLL
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b0[2], b1[2];
      load_b_trans<D>(b0, b1, dout, c * 16, dp * 16);
      mma_m16n8k16_bf16(dv[2 * dp], pa, b0, dv[2 * dp]);
      mma_m16n8k16_bf16(dv[2 * dp + 1], pa, b1, dv[2 * dp + 1]);
      load_b_trans<D>(b0, b1, q, c * 16, dp * 16);
      mma_m16n8k16_bf16(dk[2 * dp], dsa, b0, dk[2 * dp]);
      mma_m16n8k16_bf16(dk[2 * dp + 1], dsa, b1, dk[2 * dp + 1]);
    }
  }
}

// Dynamic shared memory per block (kernel index: src/gpu/kernels/mod.rs).
constexpr unsigned kDkvSharedBytesD32 = sizeof(DkvTiles<32, 64>), kDkvSharedBytesD64 = sizeof(DkvTiles<64, 32>),
                   kDkvSharedBytesD128 = sizeof(DkvTiles<128, 16>);
static_assert(kDkvSharedBytesD32 == 31744 && kDkvSharedBytesD64 == 37376 && kDkvSharedBytesD128 == 52480,
              "the header and the kernel index state these");
// The _docs_ kernels' (the stages' document starts added).
constexpr unsigned kDkvDocsSharedBytesD32 = sizeof(DkvTiles<32, 64, true>),
                   kDkvDocsSharedBytesD64 = sizeof(DkvTiles<64, 32, true>),
                   kDkvDocsSharedBytesD128 = sizeof(DkvTiles<128, 16, true>);
static_assert(kDkvDocsSharedBytesD32 == 32256 && kDkvDocsSharedBytesD64 == 37632 && kDkvDocsSharedBytesD128 == 52608,
              "the kernel index states these");

// BLOCK: one block of context parallelism (common/key_block.h): `qkv` the queries' buffer (seq
// positions from its first), `kb` the keys', `dqkv` f32 rows laid out as the keys' that dK and
// dV are added to.
template <int D, int BQ, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void dkv_body(Out* __restrict__ dqkv, const bf16* __restrict__ qkv,
                                         const bf16* __restrict__ dout, const float* __restrict__ lse,
                                         const float* __restrict__ delta, int batch, int seq, int heads,
                                         int kv_heads, const Documents documents, const DropoutSite& drop,
                                         const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  static_assert(D % 16 == 0 && BQ % 16 == 0, "k16 steps over d, n-tile pairs and k16 blocks over the tile");
  static_assert(2 * BQ <= kThreads, "load_words: one thread per lse and per delta entry of a tile");
  using Shared = DkvTiles<D, BQ, DOCS>;
  DYNAMIC_SHARED(Shared, tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const AttentionTile block = longest_first(false, kv_heads);  // common/tile_order.cuh
  const int k0 = block.tile * kBlockRows, b = block.b, kv = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  // The block's group kv of r = heads / kv_heads query heads kv·r .. kv·r + r - 1: in each
  // per-group row their q at columns (kv (r + 2))·d.., then the group's k and v.
  const int group = (unsigned)heads / (unsigned)kv_heads;
  const int row_width = (heads + 2 * kv_heads) * D;
  const size_t qkv_stride = row_width, out_stride = (size_t)heads * D;
  const float scale = 1.0f / sqrtf((float)D);

  const float scale_log2 = kLog2e * scale;
  // Position 0 of the group's k (v follows), in qkv and dqkv alike; of its first query head's q,
  // and its dO columns and lse/delta row (the next head's are d columns, d columns and seq entries
  // on). The offsets within one position are ints, their addresses formed in the loads (the form
  // in which ptxas keeps dK/dV's loads as short as GPT-2's were and spills nothing).
  const size_t qkv_pos = (size_t)batch * qkv_stride, out_pos = (size_t)batch * out_stride;
  const int k_at = b * (heads + 2 * kv_heads) * D + (kv * (group + 2) + group) * D;
  const bf16* q_src = qkv + (size_t)b * qkv_stride + (size_t)kv * (group + 2) * D;
  int dout_at = (b * heads + kv * group) * D;
  int stats = (b * heads + kv * group) * seq;

  // The block's keys and values join the first head's query tile 0's commit group.
  if constexpr (BLOCK) {
    cp_async_rows<D, kBlockRows, kThreads>(tiles.k, kb.kv + k_at, qkv_pos, k0, kb.keys);
    cp_async_rows<D, kBlockRows, kThreads>(tiles.v, kb.kv + k_at + D, qkv_pos, k0, kb.keys);
  } else {
    cp_async_rows<D, kBlockRows, kThreads>(tiles.k, qkv + k_at, qkv_pos, k0, seq);
    cp_async_rows<D, kBlockRows, kThreads>(tiles.v, qkv + k_at + D, qkv_pos, k0, seq);
  }

  float dk[D / 8][4], dv[D / 8][4];
  UNROLL
  for (int j = 0; j < D / 8; ++j)
    UNROLL
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  const int key_base = k0 + warp * 16 + g;  // keys of this lane's rows: key_base, key_base + 8

  // Query tiles from the one holding the block's first key (the diagonal) to the end, or under
  // documents to the last query whose document starts at or before the block's last key.
  // BLOCK: from the tile holding the first query at or after the block's first key.
  const int qs0 = ((BLOCK ? (k0 > kb.shift ? k0 - kb.shift : 0) : k0) / BQ) * BQ, warp_first = k0 + warp * 16,
            warp_last = warp_first + 15;
  const int q_end = DOCS ? docs.end_after(k0 + kBlockRows - 1 < seq ? k0 + kBlockRows - 1 : seq - 1) : seq;
  // The A fragments of the warp's K and V rows: for d 64 read once, at the warp's first live tile
  // (its block rows have landed by then), and held in 32 registers, where reading them per tile
  // cost 8 of the tile's 40 ldmatrix (ptxas stays at 168 registers, 3 blocks per SM); d 128's 64
  // more would spill, and d 32 (4 of 36 ldmatrix) spilled on sm_80, so they read them per tile.
  constexpr bool kHold = D == 64;
  uint32_t ka[kHold ? D / 16 : 1][4], va[kHold ? D / 16 : 1][4];
  bool held = false;
  auto kv_frags = [&](int, int kk, uint32_t(&x1)[4], uint32_t(&x2)[4]) {
    if constexpr (kHold) {
      UNROLL
      for (int r = 0; r < 4; ++r) x1[r] = ka[kk / 16][r], x2[r] = va[kk / 16][r];
    } else {
      load_a<D>(x1, tiles.k, warp * 16, kk);
      load_a<D>(x2, tiles.v, warp * 16, kk);
    }
  };
  // The group's query heads one after another, dK and dV summed over them in registers (in head
  // order: the same bits on every run); a ring per head, the stages free again after a barrier.
  for (int left = group; left > 0; --left) {
    cp_async_ring<kStages>(
        ceil_div(q_end - qs0, BQ),
        [&](int stage, int t) {
          const int qs = qs0 + t * BQ;
          auto& st = tiles.stage[stage];
          cp_async_rows<D, BQ, kThreads>(st.q, q_src, qkv_pos, qs, seq);
          cp_async_rows<D, BQ, kThreads>(st.dout, dout + dout_at, out_pos, qs, seq);
          load_words<BQ>(st.lse, lse + stats, qs, seq, 0);
          load_words<BQ>(st.delta, delta + stats, qs, seq, BQ);
          if constexpr (DOCS) load_words<BQ>(tiles.start[stage], docs.starts, qs, seq, 0);
        },
        [&](int stage, int t) {
          // Per warp (uniform branches): a tile wholly before the warp's first key, or whose
          // queries' documents all start after its last key, is skipped (every pair masked; so is
          // every tile of a warp whose keys are all past seq), one that holds a query before the
          // warp's last key or whose last query's document starts after its first key is masked,
          // the rest run without the compare.
          const int qs = qs0 + t * BQ;
          auto& st = tiles.stage[stage];
          if constexpr (BLOCK) {
            if (qs + BQ - 1 + kb.shift < warp_first || warp_first >= kb.keys) return;
          } else {
            if (qs + BQ - 1 < warp_first || warp_first >= seq) return;
          }
          if (kHold && !held) {
            UNROLL
            for (int kk = 0; kk < D / 16; ++kk) {
              load_a<D>(ka[kk], tiles.k, warp * 16, kk * 16);
              load_a<D>(va[kk], tiles.v, warp * 16, kk * 16);
            }
            held = true;
          }
          DropPair bh{};  // the (b, query head) pair the masks are drawn for
          if constexpr (DROP) bh = DropPair{b, kv * group + group - left};
          // DOCS: `docs` is named only in the branch compiled for documents (captured by the
          // lambda otherwise, it cost the plain kernels' ptxas a register and spilled them).
          if constexpr (BLOCK) {
            if (qs + kb.shift < warp_last)
              dkv_tile<D, BQ, true, DROP, false, true>(dk, dv, st, qs, key_base, scale_log2, kv_frags, nullptr, drop,
                                                       bh, kb);
            else
              dkv_tile<D, BQ, false, DROP, false, true>(dk, dv, st, qs, key_base, scale_log2, kv_frags, nullptr, drop,
                                                        bh, kb);
          } else if constexpr (DOCS) {
            if (docs.start(qs) > warp_last) return;
            if (qs < warp_last || docs.start(qs + BQ - 1) > warp_first)
              dkv_tile<D, BQ, true, DROP, true>(dk, dv, st, qs, key_base, scale_log2, kv_frags, tiles.start[stage],
                                                drop, bh);
            else
              dkv_tile<D, BQ, false, DROP, true>(dk, dv, st, qs, key_base, scale_log2, kv_frags, tiles.start[stage],
                                                 drop, bh);
          } else if (qs < warp_last) {
            dkv_tile<D, BQ, true, DROP, false>(dk, dv, st, qs, key_base, scale_log2, kv_frags, nullptr, drop, bh);
          } else {
            dkv_tile<D, BQ, false, DROP, false>(dk, dv, st, qs, key_base, scale_log2, kv_frags, nullptr, drop, bh);
          }
        });
    if (left > 1) {
      q_src += D, dout_at += D, stats += seq;
      __syncthreads();  // every warp is done with this head's last stage before the next ring fills it
    }
  }

  // BLOCK: dK and dV added to the f32 rows.
  if constexpr (BLOCK) {
    UNROLL
    for (int h = 0; h < 2; ++h) {
      const int key = key_base + 8 * h;
      if (key >= kb.keys) continue;
      float* row = dqkv + k_at + (size_t)key * qkv_pos;
      UNROLL
      for (int j = 0; j < D / 8; ++j)
        UNROLL
        for (int e = 0; e < 2; ++e) {
          row[8 * j + 2 * t4 + e] += dk[j][2 * h + e] * scale;
          row[D + 8 * j + 2 * t4 + e] += dv[j][2 * h + e];
        }
    }
  } else {
    UNROLL
    for (int h = 0; h < 2; ++h) {
      const int key = key_base + 8 * h;
      if (key >= seq) continue;
      bf16* row = dqkv + k_at + (size_t)key * qkv_pos;
      UNROLL
      for (int j = 0; j < D / 8; ++j) {
        const int c = 8 * j + 2 * t4;
        row[c] = to_bf16(dk[j][2 * h] * scale);
        row[c + 1] = to_bf16(dk[j][2 * h + 1] * scale);
        row[D + c] = to_bf16(dv[j][2 * h]);
        row[D + c + 1] = to_bf16(dv[j][2 * h + 1]);
      }
    }
  }
}

// dQ's block: 4 warps, each owning MT row tiles of 16 consecutive queries (64·MT queries), as the
// forward's d 64 does: each K and V fragment a warp reads feeds MT mma.
template <int D, int BK, int MT, bool DOCS = false>
struct DqTiles {
  static constexpr int kQueries = 64 * MT;
  struct Stage {
    bf16 k[BK][D + 8];
    bf16 v[BK][D + 8];
  };
  bf16 q[kQueries][D + 8];
  bf16 dout[kQueries][D + 8];
  Stage stage[kStages];
};
// DOCS: the block's queries' document starts too, after the rest.
template <int D, int BK, int MT>
struct DqTiles<D, BK, MT, true> : DqTiles<D, BK, MT, false> {
  int start[64 * MT];
};
// The per-head-dim instances: key tile BK (the streamed tile times d is 2048) and row tiles MT.
template <int D, bool DOCS = false>
using DqTilesOf = DqTiles<D, 2048 / D, D == 64 ? 2 : 1, DOCS>;

// One key tile of BK keys from k0 for the warp's MT row tiles of 16 queries (row tile i: rows
// row_base + 16i and row_base + 16i + 8 of this lane): S and dP, dS, then dQ += dS K. MASK: the
// tile reaches past the warp's first query, so each score is checked (below the diagonal every
// key is at or before every query). row_lse2 is the rows' lse·log2(e):
// P = 2^(s·scale_log2 - row_lse2), one FFMA and one ex2.approx. DROP: dP is masked before dS
// (`drop`'s masks of the (b, head) pair `bh`).
// BLOCK: a block of context parallelism, as dkv_tile's. Keys past the block's are zero rows:
// their dS multiplies a zero K, so they need no mask.
template <int D, int BK, int MT, bool MASK, bool DROP, bool DOCS, bool BLOCK = false>
__device__ __forceinline__ void dq_tile(float (&dq)[MT][D / 8][4], DqTiles<D, BK, MT>& tiles,
                                        typename DqTiles<D, BK, MT>::Stage& st, int k0, int row_base,
                                        const float (&row_lse2)[MT][2], const float (&row_delta)[MT][2],
                                        const int* first_keys, float scale_log2, const DropoutSite& drop,
                                        DropPair bh, const KeyBlock& kb = KeyBlock{}) {
  const int warp = threadIdx.x / 32, t4 = threadIdx.x % 4;
  const int shift = BLOCK ? kb.shift : 0, q_first = BLOCK ? kb.q_first : 0, k_first = BLOCK ? kb.k_first : 0;
  float s[MT][BK / 8][4], dp[MT][BK / 8][4];
  auto q_dout_frags = [&](int i, int kk, uint32_t(&x1)[4], uint32_t(&x2)[4]) {
    load_a<D>(x1, tiles.q, (warp * MT + i) * 16, kk);
    load_a<D>(x2, tiles.dout, (warp * MT + i) * 16, kk);
  };
  score_pair<D, BK, MT>(s, dp, q_dout_frags, st.k, st.v);
  // dS in place of S: element e of n-tile j of row tile i is query row_base + 16i + 8 (e / 2),
  // key k0 + 8j + 2 t4 + e % 2.
  UNROLL
  for (int i = 0; i < MT; ++i) {
    // DROP: the mask index of the lane's first key of the tile in its two rows.
    unsigned long long at[2] = {0, 0};
    if constexpr (DROP)
      UNROLL
      for (int h = 0; h < 2; ++h)
        at[h] = drop.attention_index(bh.b, bh.head, q_first + row_base + 16 * i + 8 * h) + k_first + k0 + 2 * t4;
    // MASK and DOCS: the first key each of the two rows sees (the warp's rows' starts in shared
    // memory, read per masked tile, as forward).
    int row_start[2] = {0, 0};
    if constexpr (MASK && DOCS)
      UNROLL
      for (int h = 0; h < 2; ++h) row_start[h] = first_keys[16 * i + 8 * h + threadIdx.x % 32 / 4];
    UNROLL
    for (int j = 0; j < BK / 8; ++j) {
      unsigned kept[2] = {3u, 3u};
      if constexpr (DROP) kept[0] = drop.keeps2(at[0] + 8 * j), kept[1] = drop.keeps2(at[1] + 8 * j);
      UNROLL
      for (int e = 0; e < 4; ++e) {
        const int row = row_base + 16 * i + (e / 2) * 8, key = k0 + 8 * j + 2 * t4 + e % 2;
        float p = exp2_approx(fmaf(s[i][j][e], scale_log2, -row_lse2[i][e / 2]));
        if (MASK && (key > row + shift || (DOCS && key < row_start[e / 2]))) p = 0.0f;
        float dpe = dp[i][j][e];
        if constexpr (DROP) dpe = kept[e / 2] >> (e % 2) & 1u ? dpe * drop.scale : 0.0f;
        s[i][j][e] = p * (dpe - row_delta[i][e / 2]);
      }
    }
  }
  // dQ += dS K.
  UNROLL
  for (int c = 0; c < BK / 16; ++c) {
    uint32_t dsa[MT][4];
    UNROLL
    for (int i = 0; i < MT; ++i) repack_a(dsa[i], s[i][2 * c], s[i][2 * c + 1]);
    UNROLL
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b0[2], b1[2];
      load_b_trans<D>(b0, b1, st.k, c * 16, dn * 16);
      UNROLL
      for (int i = 0; i < MT; ++i) {
        mma_m16n8k16_bf16(dq[i][2 * dn], dsa[i], b0, dq[i][2 * dn]);
        mma_m16n8k16_bf16(dq[i][2 * dn + 1], dsa[i], b1, dq[i][2 * dn + 1]);
      }
    }
  }
}

// Dynamic shared memory per block (kernel index: src/gpu/kernels/mod.rs); the queries per block,
// DqTilesOf<D>::kQueries, are the forward's (plan/mod.rs's attention_queries; the emulation harness
// checks that they agree).
constexpr unsigned kDqSharedBytesD32 = sizeof(DqTilesOf<32>), kDqSharedBytesD64 = sizeof(DqTilesOf<64>),
                   kDqSharedBytesD128 = sizeof(DqTilesOf<128>);
static_assert(kDqSharedBytesD32 == 30720 && kDqSharedBytesD64 == 55296 && kDqSharedBytesD128 == 52224,
              "the header and the kernel index state these");
// The _docs_ kernels' (the queries' document starts added).
constexpr unsigned kDqDocsSharedBytesD32 = sizeof(DqTilesOf<32, true>), kDqDocsSharedBytesD64 = sizeof(DqTilesOf<64, true>),
                   kDqDocsSharedBytesD128 = sizeof(DqTilesOf<128, true>);
static_assert(kDqDocsSharedBytesD32 == 30976 && kDqDocsSharedBytesD64 == 55808 && kDqDocsSharedBytesD128 == 52480,
              "the kernel index states these");

// BLOCK: one block of context parallelism, as dkv_body's; `dqkv` f32 rows laid out as the
// queries' that dQ is added to.
template <int D, bool DROP, bool DOCS, bool BLOCK = false, class Out = bf16>
__device__ __forceinline__ void dq_body(Out* __restrict__ dqkv, const bf16* __restrict__ qkv,
                                        const bf16* __restrict__ dout, const float* __restrict__ lse,
                                        const float* __restrict__ delta, int batch, int seq, int heads,
                                        int kv_heads, const Documents documents, const DropoutSite& drop,
                                        const KeyBlock kb = KeyBlock{}) {
  static_assert(!(BLOCK && DOCS), "a block of context parallelism has no per-document attention");
  using Shared = DqTilesOf<D, DOCS>;
  constexpr int BK = 2048 / D, kQueries = Shared::kQueries, MT = kQueries / 64;
  static_assert(D % 16 == 0 && BK % 16 == 0, "k16 steps over d, n-tile pairs and k16 blocks over the tile");
  DYNAMIC_SHARED(Shared, tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const AttentionTile block = longest_first(true, heads);
  const int q0 = block.tile * kQueries, b = block.b, head = block.head;
  const Documents docs = documents.sequence(b);  // DOCS: the block's sequence's starts
  // Position 0 of the block's (b, head): its q columns (head + 2 kv)·d and its group's k columns
  // (kv (r + 2) + r)·d (v follows) in the per-group rows of r = heads / kv_heads query heads, and
  // its dO columns. Offsets within a position as ints, K/V addresses formed in the loads (as in
  // the forward: ptxas's shortest loads).
  const int group = heads / kv_heads, kv = head / group;
  const int row_width = (heads + 2 * kv_heads) * D;
  const size_t qkv_stride = row_width, out_stride = (size_t)heads * D;
  const int head_col = (head + 2 * kv) * D;
  const float scale = 1.0f / sqrtf((float)D);
  const float scale_log2 = kLog2e * scale;
  const size_t qkv_pos = (size_t)batch * qkv_stride, out_pos = (size_t)batch * out_stride;
  const bf16* q_src = qkv + b * row_width + head_col;
  const int k_at = b * (heads + 2 * kv_heads) * D + (kv * (group + 2) + group) * D;
  const bf16* dout_src = dout + (size_t)b * out_stride + (size_t)head * D;

  // The block's queries and their output gradients join key tile 0's commit group.
  cp_async_rows<D, kQueries, kThreads>(tiles.q, q_src, qkv_pos, q0, seq);
  cp_async_rows<D, kQueries, kThreads>(tiles.dout, dout_src, out_pos, q0, seq);
  if constexpr (DOCS) load_words<kQueries>(tiles.start, docs.starts, q0, seq, 0);  // DOCS: the rows' starts

  // The warp's rows: warp_first.. warp_last; this lane's are row_base + 16i and + 16i + 8.
  const int warp_first = q0 + warp * 16 * MT, warp_last = warp_first + 16 * MT - 1, row_base = warp_first + g;
  // The rows' lse·log2(e) (+inf past seq: P = 0) and delta.
  float row_lse2[MT][2], row_delta[MT][2];

  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 16 * i + 8 * h;
      const size_t at = ((size_t)b * heads + head) * seq + row;
      row_lse2[i][h] = row < seq ? lse[at] * kLog2e : INFINITY;
      row_delta[i][h] = row < seq ? delta[at] : 0.0f;
    }
  float dq[MT][D / 8][4];
  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int j = 0; j < D / 8; ++j)
      UNROLL
      for (int e = 0; e < 4; ++e) dq[i][j][e] = 0.0f;

  // Key tiles from the one holding the block's first query's first key to its last query.
  const int last_query = (q0 + kQueries < seq ? q0 + kQueries : seq) - 1;
  const int last_key = BLOCK ? kb.last_key(last_query) : last_query;
  const int first_tile = DOCS ? docs.start(q0) / BK : 0;
  cp_async_ring<kStages>(
      last_key / BK + 1 - first_tile,
      [&](int stage, int t) {
        auto& st = tiles.stage[stage];
        const int k0 = (first_tile + t) * BK;
        if constexpr (BLOCK) {  // `kb` named only here and below (the forward's note)
          cp_async_rows<D, BK, kThreads>(st.k, kb.kv + k_at, qkv_pos, k0, kb.keys);
          cp_async_rows<D, BK, kThreads>(st.v, kb.kv + k_at + D, qkv_pos, k0, kb.keys);
        } else {
          cp_async_rows<D, BK, kThreads>(st.k, qkv + k_at, qkv_pos, k0, seq);
          cp_async_rows<D, BK, kThreads>(st.v, qkv + k_at + D, qkv_pos, k0, seq);
        }
      },
      [&](int stage, int t) {
        // Per warp (uniform branches): a tile wholly after the warp's last query or wholly before
        // its rows' documents is skipped (so is every tile of a warp whose rows are all past seq),
        // one that reaches past the warp's first query or starts before one of its rows'
        // documents is masked, the others run without the compare (the forward's rule).
        const int k0 = (first_tile + t) * BK;
        auto& st = tiles.stage[stage];
        if constexpr (BLOCK) {
          if (k0 > warp_last + kb.shift || warp_first >= seq) return;
          const DropPair bh{b, head};
          if (k0 + BK - 1 > warp_first + kb.shift)
            dq_tile<D, BK, MT, true, DROP, false, true>(dq, tiles, st, k0, row_base, row_lse2, row_delta, nullptr,
                                                        scale_log2, drop, bh, kb);
          else
            dq_tile<D, BK, MT, false, DROP, false, true>(dq, tiles, st, k0, row_base, row_lse2, row_delta, nullptr,
                                                         scale_log2, drop, bh, kb);
          return;
        }
        if (k0 > warp_last || warp_first >= seq) return;
        const DropPair bh{b, head};
        // DOCS: by the warp's first and last rows' documents, as the forward (`docs` named only
        // in this branch).
        if constexpr (DOCS) {
          const int* first_keys = tiles.start + (warp_first - q0);
          const int last = (warp_last < seq ? warp_last : seq - 1) - warp_first;
          if (k0 + BK <= first_keys[0]) return;
          if (k0 + BK - 1 > warp_first || k0 < first_keys[last])
            dq_tile<D, BK, MT, true, DROP, true>(dq, tiles, st, k0, row_base, row_lse2, row_delta, first_keys,
                                                 scale_log2, drop, bh);
          else
            dq_tile<D, BK, MT, false, DROP, true>(dq, tiles, st, k0, row_base, row_lse2, row_delta, first_keys,
                                                  scale_log2, drop, bh);
        } else if (k0 + BK - 1 > warp_first) {
          dq_tile<D, BK, MT, true, DROP, false>(dq, tiles, st, k0, row_base, row_lse2, row_delta, nullptr, scale_log2,
                                                drop, bh);
        } else {
          dq_tile<D, BK, MT, false, DROP, false>(dq, tiles, st, k0, row_base, row_lse2, row_delta, nullptr, scale_log2,
                                                 drop, bh);
        }
      });

  UNROLL
  for (int i = 0; i < MT; ++i)
    UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 16 * i + 8 * h;
      if (row >= seq) continue;
      Out* dst = dqkv + ((size_t)row * batch + b) * qkv_stride + head_col;
      UNROLL
      for (int j = 0; j < D / 8; ++j)
        UNROLL
        for (int e = 0; e < 2; ++e) {
          if constexpr (BLOCK)
            dst[8 * j + 2 * t4 + e] += dq[i][j][2 * h + e] * scale;  // BLOCK: added to the f32 rows
          else
            dst[8 * j + 2 * t4 + e] = to_bf16(dq[i][j][2 * h + e] * scale);
        }
    }
}

}  // namespace attention_bwd_detail
