// gemm_bf16_sm90.cu: the linear layer's three products on Hopper (sm_90a): warpgroup wgmma fed
// by the tensor memory accelerator (TMA) through a 4-stage shared-memory pipeline, with a
// producer warp and two consumer warpgroups (warp specialisation).
//
//   gemm_fwd_bf16_f32out_sm90   out[m][n] = act(Σ_k A[m][k]·W[n][k] + bias[n]) + residual[m][n]
//                               (the layouts and epilogue of gemm_bf16.cu's gemm_fwd_bf16_f32out:
//                               bias [N] f32 or null, act identity or tanh GELU, residual [M, N]
//                               f32 or null, out [M, N] f32)
//   gemm_fwd_bf16_sm90          the same with out [M, N] and residual bf16 (gemm_bf16.cu's
//                               gemm_fwd_bf16: the f32 result rounded once)
//   gemm_bwd_input_bf16_sm90    dinp[m][k] = Σ_n dout[m][n]·W[n][k]    (dinp [M, K] f32, overwritten)
//   gemm_bwd_input_bf16_bf16out_sm90  the same with dinp bf16 (rounded once)
//   gemm_bwd_weight_bf16_sm90   dW[n][k] += Σ_m dout[m][n]·inp[m][k]   (dW [N, K] f32, accumulated)
// with A, W, dout, inp bf16 row-major (A, inp [M, K]; W [N, K]; dout [M, N]). Each computes a
// product D [rows, cols] = Σ_r P(row, r)·Q(col, r) over a reduction of length R: forward rows =
// M, cols = N, R = K; backward-input rows = M, cols = K, R = N; backward-weight rows = N,
// cols = K, R = M. Any sizes >= 1 whose row pitches are multiples of 8 elements (TMA's 16-byte
// global strides: K for the forward; N and K for the backward ones) with 16-byte aligned
// operands: the launcher picks gemm_bf16.cu / gemm_bf16_bwd.cu otherwise. Ragged edges load as
// zeros (TMA's out-of-bounds fill) and stores are guarded.
//
// Grid: (⌈cols/C⌉, ⌈rows/128⌉) blocks of 384 threads in the grouped tile order of
// common/tile_order.cuh (8 rows of tiles at a time), each owning a 128 x C tile of D, C = 256
// for the forward and backward-input, 128 for backward-weight (kCols: dW is a layer's weight,
// whose few tiles would leave most SMs idle if wider). Warpgroup 0 is the producer: one thread
// issues the loads, the other 127 have nothing to do and return (no __syncthreads follows the
// split). Warpgroups 1 and 2 are the consumers, one 64-row half of the tile each, C / 2 f32
// accumulators per thread in wgmma's m64nCk16 fragment layout.
// Backward-weight's reduction over M may be cut into gridDim.z slices (the Device's choice,
// plan::sm90_weight_slices: a layer's dW has few tiles, 36 for GPT-2's projection on 132 SMs),
// slice z taking steps [⌊steps·z/Z⌋, ⌊steps·(z+1)/Z⌋). Each slice publishes its f32 partial tile
// to `partials` and counts itself on the tile's counter; the one counted last sums the Z partials
// in slice order (so the bits do not depend on which finished last), adds dW and resets the
// counter (last_slice, slice_sum). One launch, deterministic, Z·64 KiB written and read per tile.
// Per 64-deep reduction step the producer waits until the consumers have released stage s
// (barrier empty[s]), announces its 16 KiB + C x 128 bytes (arrive.expect_tx on full[s]) and
// issues the TMA copies of the 128 x 64 P tile and the C x 64 Q tile; each consumer waits on
// full[s], issues four wgmma.mma_async.m64nCk16 (A from P's half, B from Q) as one commit group,
// and waits with wgmma.wait_group 1: the group just issued stays in flight while the previous
// one is known complete, whose stage it then releases (every consumer thread arrives on
// empty[s - 1]). So up to 4 stages of loads and 2 wgmma groups are in flight per block.
// Why a producer warpgroup: the loads of step k + 3 are issued as soon as step k - 1's stage is
// released, independently of where either consumer is in its wgmma stream, and the consumers'
// loop has no load code. Why 128 x 256: per stage 48 KiB feed 4.2 MFLOP (85 FLOP per byte
// from L2) where 128 x 128 tiles fed 2.1 MFLOP with 32 KiB (64 per byte); the consumers then
// need ~155 registers (128 accumulators), within __launch_bounds__(384, 1)'s 168, so no
// setmaxnreg rebalancing is needed (backward-weight's 128 x 128: ~90).
//
// Shared memory (dynamic: 1 KiB of alignment slack + 4 stages + 9 barriers = 197704 bytes for
// C = 256, 132168 for 128, so the launcher sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
// the stages start on the first 1024-byte aligned shared address, P's tile first, then Q's).
// Tiles are stored in wgmma's 128-byte swizzle layout (../emu/wgmma.h), which TMA writes
// directly from a 2-D view of a row-major [rows, cols] matrix (dimension 0 the columns,
// dimension 1 the rows, stride = the row pitch) with CU_TENSOR_MAP_SWIZZLE_128B and boxes 64
// elements = 128 bytes wide: box row i lands at 128 i bytes from the (1024-aligned)
// destination with its eight 16-byte chunks permuted, chunk c at c ^ (i % 8). Whole 128-byte
// rows move per request, where the no-swizzle core-matrix layout (16-byte box rows) made every
// tile a swarm of 16-byte L2 requests.
//   K-major operand (its rows along the tile's rows or columns, the reduction contiguous:
//   A of the forward, W of the forward, dout of backward-input): boxes (64, 128) at
//   (r0, tile row + 128 b) into 16384 b: element (i, r) at 128 i + 2 r before the swizzle, so the descriptor's SBO
//   (next 8 rows in M / N) is 1024 (LBO unused, 16), and the k16 step kk of the 64-deep stage
//   starts 2 kk bytes into the row: the hardware swizzles the address it forms, as TMA did.
//   MN-major operand (the reduction along the matrix's rows: W of backward-input, dout and inp of
//   backward-weight): boxes (64, 64) at (tile col + 64 h, r0) into 8192 h: element (i, r) at
//   8192 (i / 64) + 128 r + 2 (i % 64) before the swizzle: LBO (next 64 in M / N) 8192, SBO
//   (next 8 in K) 1024, the k16 step kk at 128 kk, and wgmma's transpose flag set.
// The host makes the tensor maps (src/gpu/tma.rs through src/gpu/device_ops.rs, the harness):
// bf16, 2 dimensions, no interleave, 128-byte swizzle, out-of-bounds fill with zeros.
//
// Epilogue, through shared memory: when both consumers' last wgmma group is complete (an
// mbarrier of the 256 consumer threads) the stages are idle, and each thread writes its
// accumulators (4j + 2h and 4j + 2h + 1: row 16w + g + 8h of its half, columns 8j + 2t and
// 8j + 2t + 1) as f32 pairs into a row-major 128 x (C + 8) staging of the tile over them; after
// the barrier's second phase, thread c of 256 takes columns 4 (c % (C / 4)) .. + 3 of every
// (256 / (C / 4))-th row, so a warp reads and writes whole rows: one 16-byte (f32) or 8-byte
// (bf16) access per operand where the four columns are in range and aligned, else column by
// column. Bias, GELU, residual and backward-weight's += act on each column exactly as one at a
// time. (Stored straight from the fragments, each warp store touched 8 rows with 16 or 32 bytes
// each.)
//
// Built only where wgmma and TMA exist (TRIDENT_WGMMA: sm_90a, and the emulation); compiled for
// any other arch the kernels trap, and the launcher picks the mma.sync kernels there.
// Reference: trident's `Device::linear_forward` (+ `gelu_forward`, + `add`) and
// `Device::linear_backward` on the reference device, in f64 on the same bf16-rounded inputs;
// tested under the SIMT emulation by tests/cuda_emulation.rs and, through the emulated driver,
// tests/cuda_device.rs.
#include "common/base.cuh"
#include "common/gelu.h"
// wgmma.cuh before tma.cuh, which includes it: NVRTC resolves a header's relative include only to
// a header the source has already included.
#include "common/wgmma.cuh"
#include "common/tma.cuh"
#include "common/tile_order.cuh"

namespace gemm_sm90_detail {

enum class Product { Forward, BackwardInput, BackwardWeight };

#ifdef TRIDENT_WGMMA
constexpr int kTile = 128, kStep = 64, kStages = 4, kConsumerThreads = 256;
constexpr uint32_t kOperandBytes = kTile * kStep * 2;     // P's 128 x 64 bf16 tile: 16 KiB
constexpr uint32_t kHalfBytes = kOperandBytes / 2;        // 64 rows or an MN-major 64-wide half
constexpr size_t kAlignSlack = 1024;                      // the 128-byte swizzle's period

// The tile's columns: 256 for the forward and backward-input, 128 for backward-weight (whose
// D, dW [N, K], is a layer's weight: few tiles, so wider ones would idle most SMs).
template <Product kP>
constexpr int kCols = kP == Product::BackwardWeight ? 128 : 256;
// A stage: P's tile, then Q's (kCols x 64).
template <Product kP>
constexpr uint32_t kStageBytes = kOperandBytes + kCols<kP> * kStep * 2;
template <Product kP>
constexpr size_t kBarrierOffset = size_t(kStages) * kStageBytes<kP>;
// 197704 bytes (kCols 256) or 132168 (128): the stages, then full[kStages], empty[kStages] and
// the consumers' epilogue barrier.
template <Product kP>
constexpr size_t kSharedBytes = kAlignSlack + kBarrierOffset<kP> + (2 * kStages + 1) * sizeof(uint64_t);
// The epilogue's f32 staging of the whole 128 x kCols tile over the (then idle) stages: rows of
// kCols + 8 floats, so the 8 rows a warp's pair stores touch start 8 banks apart (a half-warp's
// 64-bit stores are conflict-free) and every row starts on 16 bytes.
template <Product kP>
constexpr int kStagedPitch = kCols<kP> + 8;
static_assert(size_t(kTile) * kStagedPitch<Product::Forward> * 4 <= size_t(kStages) * kStageBytes<Product::Forward> &&
                  size_t(kTile) * kStagedPitch<Product::BackwardWeight> * 4 <=
                      size_t(kStages) * kStageBytes<Product::BackwardWeight>,
              "the staged tile fits in the stages");

// P (the A operand) is MN-major only for backward-weight; Q (B) for both backward products.
template <Product kP>
constexpr int kTransP = kP == Product::BackwardWeight;
template <Product kP>
constexpr int kTransQ = kP != Product::Forward;

// The tile of kRows rows or columns from `i0`, reduction step at `r0` (layouts above): K-major
// in boxes of 128 rows, MN-major in boxes of 64 columns.
template <int kTrans, int kRows>
__device__ __forceinline__ void load_tile(unsigned char* dst, const TensorMap* map, int i0, int r0, uint64_t* bar) {
  UNROLL
  for (int b = 0; b < kRows / (kTrans ? 64 : 128); ++b) {
    if (kTrans)
      tma_load_2d(dst + b * kHalfBytes, map, i0 + 64 * b, r0, bar);
    else
      tma_load_2d(dst + b * kOperandBytes, map, r0, i0 + 128 * b, bar);
  }
}

// The descriptor of rows `i0`.. (a multiple of 64) of a tile, reduction columns kk..kk+15.
template <int kTrans>
__device__ __forceinline__ uint64_t tile_descriptor(const unsigned char* tile, int i0, int kk) {
  if (kTrans) return wgmma_descriptor_sw128(tile + (i0 / 64) * kHalfBytes + kk * 128, kHalfBytes, 1024);
  return wgmma_descriptor_sw128(tile + i0 * 128 + kk * 2, 16, 1024);
}

// The output D (f32 or bf16) and, for the forward, its fused epilogue; for a backward-weight
// grid of several slices (gridDim.z > 1), the slices' partial tiles and per-tile counters.
template <class Out>
struct Epilogue {
  Out* out;
  const float* bias;
  const Out* residual;
  int gelu;
  float* partials = nullptr;
  unsigned* counters = nullptr;
};

// Two adjacent f32, for one 8-byte shared-memory store.
struct __align__(8) F32Pair {
  float lo, hi;
};
__device__ __forceinline__ void store_pair(float* p, float lo, float hi) { *reinterpret_cast<F32Pair*>(p) = F32Pair{lo, hi}; }

// Four adjacent f32, for one 16-byte access; four bf16 as one 8-byte access.
struct __align__(16) F32Quad {
  float v[4];
};
struct __align__(8) Bf16Quad {
  uint32_t lo, hi;
};

__device__ __forceinline__ void load_quad(const float* p, float (&v)[4]) {
  const F32Quad q = *reinterpret_cast<const F32Quad*>(p);
  UNROLL
  for (int c = 0; c < 4; ++c) v[c] = q.v[c];
}
__device__ __forceinline__ void load_quad(const bf16* p, float (&v)[4]) {
  UNROLL
  for (int c = 0; c < 4; ++c) v[c] = to_float(p[c]);
}
__device__ __forceinline__ void store_quad(float* p, const float (&v)[4]) {
  *reinterpret_cast<F32Quad*>(p) = F32Quad{{v[0], v[1], v[2], v[3]}};
}
__device__ __forceinline__ void store_quad(bf16* p, const float (&v)[4]) {
  *reinterpret_cast<Bf16Quad*>(p) = Bf16Quad{pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3])};
}
template <class T>
__device__ __forceinline__ bool quad_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// D[row][col + c] = v[c] for c < n (n <= 4), through the epilogue; `at` is row * cols + col.
// Four in-range columns at aligned addresses go as one access each way; otherwise column by
// column, with the same arithmetic.
template <Product kP, class Out>
__device__ __forceinline__ void store_columns(const Epilogue<Out>& e, size_t at, int col, float (&v)[4], int n) {
  if (kP == Product::Forward) {
    UNROLL
    for (int c = 0; c < 4; ++c) {
      if (e.bias && c < n) v[c] += e.bias[col + c];
      if (e.gelu) v[c] = gelu_tanh(v[c]);
    }
  }
  const Out* add = kP == Product::Forward ? e.residual : kP == Product::BackwardWeight ? e.out : nullptr;
  if (n == 4 && quad_aligned(e.out + at) && (!add || quad_aligned(add + at))) {
    if (add) {
      float a[4];
      load_quad(add + at, a);
      UNROLL
      for (int c = 0; c < 4; ++c) v[c] += a[c];
    }
    store_quad(e.out + at, v);
    return;
  }
  for (int c = 0; c < n; ++c) {
    if (add) v[c] += to_float(add[at + c]);
    e.out[at + c] = from_float<Out>(v[c]);
  }
}

// Split reduction (backward-weight over gridDim.z slices of its reduction): slice `slice` of
// tile `tile_id` publishes its staged partial tile (row-major 128 x kN f32, the whole tile, rows
// past the edge holding TMA's zeros) at partials[(tile_id · slices + slice) · 128 · kN], fences
// it, and counts itself on counters[tile_id]; the slice counted last (whichever it is) learns so
// through the flag word in row 0's padding of the staging (columns kN.. of the pitch, never part
// of the tile), resets the counter for the next launch and returns true: it then sums the slices.
// Phases 2 and 3 of the consumers' epilogue barrier order the stores before the count and the
// count before the flag's read. Every consumer thread calls it.
template <int kN>
__device__ __forceinline__ bool last_slice(const Epilogue<float>& e, const float* staged, int tile_id, int slice,
                                           int slices, uint64_t* epilogue) {
  constexpr int kPitch = kN + 8, kQuads = kN / 4, kRowsPerPass = kConsumerThreads / kQuads;
  const int c = threadIdx.x - 128;
  float* mine = e.partials + (size_t(tile_id) * slices + slice) * kTile * kN;
  for (int r = c / kQuads; r < kTile; r += kRowsPerPass) {
    float v[4];
    load_quad(staged + r * kPitch + 4 * (c % kQuads), v);
    store_quad(mine + r * kN + 4 * (c % kQuads), v);
  }
  __threadfence();
  mbarrier_arrive(epilogue);
  mbarrier_wait(epilogue, 0);  // phase 2: every thread's partial is stored and fenced
  unsigned* flag = reinterpret_cast<unsigned*>(const_cast<float*>(staged) + kN);
  if (c == 0) *flag = atomicAdd(&e.counters[tile_id], 1u) == unsigned(slices - 1);
  mbarrier_arrive(epilogue);
  mbarrier_wait(epilogue, 1);  // phase 3: the flag is set
  if (*flag == 0) return false;
  __threadfence();  // the other slices' partials, fenced before their counts, are visible
  if (c == 0) e.counters[tile_id] = 0;
  return true;
}

// v = Σ_{s < slices} partial_s[r][j .. j + 3], s in order (so every bit is the same whichever
// slice came last): slice `slice`'s own from the staging, the others' from global memory
// (volatile: other blocks wrote them, read past this SM's L1).
template <int kN>
__device__ __forceinline__ void slice_sum(const float* partials, const float* staged, int tile_id, int slice,
                                          int slices, int r, int j, float (&v)[4]) {
  const volatile float* tile = partials + size_t(tile_id) * slices * kTile * kN;
  UNROLL
  for (int q = 0; q < 4; ++q) v[q] = 0.0f;
  for (int s = 0; s < slices; ++s) {
    float p[4];
    if (s == slice) {
      load_quad(staged + r * (kN + 8) + j, p);
    } else {
      UNROLL
      for (int q = 0; q < 4; ++q) p[q] = tile[(size_t(s) * kTile + r) * kN + j + q];
    }
    UNROLL
    for (int q = 0; q < 4; ++q) v[q] = s == 0 ? p[q] : v[q] + p[q];
  }
}

template <Product kP, class Out>
__device__ __forceinline__ void gemm_body(const TensorMap* map_p, const TensorMap* map_q, const Epilogue<Out>& e, int rows,
                                          int cols, int R) {
  constexpr int kN = kCols<kP>;
  constexpr uint32_t kStage = kStageBytes<kP>;
  unsigned char* const window = dynamic_shared(kSharedBytes<kP>);
  wgmma_shared_window(window, kSharedBytes<kP>);
  unsigned char* const smem = align_shared_1024(window);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset<kP>);
  uint64_t* empty = full + kStages;
  uint64_t* epilogue = empty + kStages;
  const TileIndex tile = grouped_tile();
  const int row0 = tile.row * kTile, col0 = tile.col * kN;
  // Slice blockIdx.z of gridDim.z takes reduction steps [first_step, first_step + steps).
  const int all_steps = ceil_div(R, kStep), slices = (int)gridDim.z, slice = (int)blockIdx.z;
  const int first_step = int((long long)all_steps * slice / slices);
  const int steps = int((long long)all_steps * (slice + 1) / slices) - first_step;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumerThreads);
    }
    mbarrier_init(epilogue, kConsumerThreads);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    if (threadIdx.x != 0) return;
    for (int step = 0; step < steps; ++step) {
      const int s = step % kStages;
      if (step >= kStages) mbarrier_wait(&empty[s], (step / kStages - 1) & 1);
      unsigned char* stage = smem + size_t(s) * kStage;
      mbarrier_arrive_expect_tx(&full[s], kStage);
      const int r0 = (first_step + step) * kStep;
      load_tile<kTransP<kP>, kTile>(stage, map_p, row0, r0, &full[s]);
      load_tile<kTransQ<kP>, kN>(stage + kOperandBytes, map_q, col0, r0, &full[s]);
    }
    return;
  }

  const int half = (warpgroup - 1) * 64;  // this consumer's rows of the tile
  float acc[kN / 2];
  UNROLL
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  for (int step = 0; step < steps; ++step) {
    const int s = step % kStages;
    mbarrier_wait(&full[s], (step / kStages) & 1);
    const unsigned char* stage = smem + size_t(s) * kStage;
    wgmma_fence();
    UNROLL
    for (int kk = 0; kk < kStep; kk += 16) {
      const uint64_t desc_p = tile_descriptor<kTransP<kP>>(stage, half, kk);
      const uint64_t desc_q = tile_descriptor<kTransQ<kP>>(stage + kOperandBytes, 0, kk);
      wgmma_bf16<kN, kTransP<kP>, kTransQ<kP>>(acc, desc_p, desc_q, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous step's group is complete: its stage may be refilled
    if (step > 0) mbarrier_arrive(&empty[(step - 1) % kStages]);
  }
  wgmma_wait<0>();

  // The epilogue goes through shared memory, so that global memory sees whole rows: once both
  // consumers' wgmmas are complete (the first phase of the epilogue barrier) the stages are idle
  // (every TMA copy has landed: the consumers waited on each), the tile's f32 accumulators are
  // staged there row-major, and after the second phase each consumer thread takes 4 adjacent
  // columns of a row, the 256 threads kCols / 4 to a row, for one 16-byte (f32) or 8-byte (bf16)
  // access per operand.
  // Warp w of the warpgroup holds rows 16w + g and 16w + g + 8 of its half; registers 4j + 2h
  // and 4j + 2h + 1 are row 16w + g + 8h, columns 8j + 2t and 8j + 2t + 1.
  constexpr int kPitch = kStagedPitch<kP>, kQuads = kN / 4, kRowsPerPass = kConsumerThreads / kQuads;
  float* const staged = reinterpret_cast<float*>(smem);
  mbarrier_arrive(epilogue);
  mbarrier_wait(epilogue, 0);
  fence_proxy_async_shared();  // ordinary writes after the async proxy's reads of the stages
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  UNROLL
  for (int j = 0; j < kN / 8; ++j)
    UNROLL
    for (int h = 0; h < 2; ++h)
      store_pair(staged + (half + 16 * warp + g + 8 * h) * kPitch + 8 * j + 2 * t, acc[4 * j + 2 * h],
                 acc[4 * j + 2 * h + 1]);
  mbarrier_arrive(epilogue);
  mbarrier_wait(epilogue, 1);
  const int c = threadIdx.x - 128, col = col0 + 4 * (c % kQuads);
  if constexpr (kP == Product::BackwardWeight) {
    if (slices > 1) {
      const int tile_id = tile.row * (int)gridDim.x + tile.col;
      if (!last_slice<kN>(e, staged, tile_id, slice, slices, epilogue) || col >= cols) return;
      for (int r = c / kQuads; r < kTile && row0 + r < rows; r += kRowsPerPass) {
        float v[4];
        slice_sum<kN>(e.partials, staged, tile_id, slice, slices, r, 4 * (c % kQuads), v);
        store_columns<kP>(e, (size_t)(row0 + r) * cols + col, col, v, cols - col < 4 ? cols - col : 4);
      }
      return;
    }
  }
  if (col >= cols) return;
  for (int r = c / kQuads; r < kTile && row0 + r < rows; r += kRowsPerPass) {
    float v[4];
    load_quad(staged + r * kPitch + 4 * (c % kQuads), v);
    store_columns<kP>(e, (size_t)(row0 + r) * cols + col, col, v, cols - col < 4 ? cols - col : 4);
  }
}
#endif

}  // namespace gemm_sm90_detail

// map_a: A [M, K] (box 64 x 128); map_w: W [N, K] (the same).
// registry: dynamic_shared=197704 min_arch=90
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_fwd_bf16_f32out_sm90(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_w,
                              float* out, const float* bias, const float* residual, int M, int N, int K, int gelu) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::Forward>(&map_a, &map_w, Epilogue<float>{out, bias, residual, gelu}, M, N, K);
#else
  __trap();  // no wgmma on this arch; never launched here
#endif
}

// The same with out and residual bf16 (gemm_fwd_bf16's arguments after the two maps).
// registry: dynamic_shared=197704 min_arch=90
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_fwd_bf16_sm90(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_w, bf16* out,
                       const float* bias, const bf16* residual, int M, int N, int K, int gelu) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::Forward>(&map_a, &map_w, Epilogue<bf16>{out, bias, residual, gelu}, M, N, K);
#else
  __trap();
#endif
}

// map_dout: dout [M, N] (box 64 x 128); map_w: W [N, K] (box 64 x 64).
// registry: dynamic_shared=197704 min_arch=90
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_bwd_input_bf16_sm90(const __grid_constant__ TensorMap map_dout, const __grid_constant__ TensorMap map_w,
                             float* dinp, int M, int N, int K) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::BackwardInput>(&map_dout, &map_w, Epilogue<float>{dinp, nullptr, nullptr, 0}, M, K, N);
#else
  __trap();
#endif
}

// The same with dinp bf16 (the maps as gemm_bwd_input_bf16_sm90's).
// registry: dynamic_shared=197704 min_arch=90
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_bwd_input_bf16_bf16out_sm90(const __grid_constant__ TensorMap map_dout,
                                     const __grid_constant__ TensorMap map_w, bf16* dinp, int M, int N, int K) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::BackwardInput>(&map_dout, &map_w, Epilogue<bf16>{dinp, nullptr, nullptr, 0}, M, K, N);
#else
  __trap();
#endif
}

// map_dout: dout [M, N] (box 64 x 64); map_inp: inp [M, K] (box 64 x 64). gridDim.z slices of
// the reduction over M; with more than one, partials holds gridDim.x · gridDim.y · gridDim.z
// tiles of 128 x 128 f32 (uninitialised) and counters one u32 per tile, zero (left zero).
// registry: dynamic_shared=132168 min_arch=90
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_bwd_weight_bf16_sm90(const __grid_constant__ TensorMap map_dout, const __grid_constant__ TensorMap map_inp,
                              float* dweight, float* partials, unsigned* counters, int M, int N, int K) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::BackwardWeight>(&map_dout, &map_inp, Epilogue<float>{dweight, nullptr, nullptr, 0, partials, counters},
                                     N, K, M);
#else
  __trap();
#endif
}
