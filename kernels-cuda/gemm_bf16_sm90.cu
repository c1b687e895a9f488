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
// Shared memory (dynamic: 1 KiB of alignment slack + 4 stages + 8 barriers = 197696 bytes for
// C = 256, 132160 for 128, so the launcher sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
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
// Epilogue: a thread's accumulators 4j + 2h and 4j + 2h + 1 are columns 2t and 2t + 1 of one row;
// each pair is stored by one 8-byte (f32) or 4-byte (bf16) store where both columns are in range
// and the address is aligned for it, else column by column; bias, GELU, residual and
// backward-weight's += act on each column exactly as one at a time.
//
// Built only where wgmma and TMA exist (TRIDENT_WGMMA: sm_90a, and the emulation); compiled for
// any other arch the kernels trap, and the launcher picks the mma.sync kernels there.
// Reference: trident's `Device::linear_forward` (+ `gelu_forward`, + `add`) and
// `Device::linear_backward` on the reference device, in f64 on the same bf16-rounded inputs;
// tested under the SIMT emulation by tests/cuda_emulation.rs and, through the emulated driver,
// tests/cuda_device.rs.
#include "common/base.cuh"
#include "common/gelu.cuh"
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
// 197696 bytes (kCols 256) or 132160 (128).
template <Product kP>
constexpr size_t kSharedBytes = kAlignSlack + kBarrierOffset<kP> + 2 * kStages * sizeof(uint64_t);

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

// The output D (f32 or bf16) and, for the forward, its fused epilogue.
template <class Out>
struct Epilogue {
  Out* out;
  const float* bias;
  const Out* residual;
  int gelu;
};

// Two adjacent f32, for one 8-byte access.
struct __align__(8) F32Pair {
  float lo, hi;
};

__device__ __forceinline__ void load_pair(const float* p, float& lo, float& hi) {
  const F32Pair v = *reinterpret_cast<const F32Pair*>(p);
  lo = v.lo;
  hi = v.hi;
}
__device__ __forceinline__ void load_pair(const bf16* p, float& lo, float& hi) {
  lo = to_float(p[0]);
  hi = to_float(p[1]);
}
__device__ __forceinline__ void store_pair(float* p, float lo, float hi) { *reinterpret_cast<F32Pair*>(p) = F32Pair{lo, hi}; }
__device__ __forceinline__ void store_pair(bf16* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(lo, hi);
}
template <class T>
__device__ __forceinline__ bool pair_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
}

// D[row][col] = v[0] and, where `two`, D[row][col + 1] = v[1], through the epilogue; `at` is
// row * cols + col.
template <Product kP, class Out>
__device__ __forceinline__ void store_columns(const Epilogue<Out>& e, size_t at, int col, float (&v)[2], bool two) {
  if (kP == Product::Forward) {
    if (e.bias) {
      v[0] += e.bias[col];
      if (two) v[1] += e.bias[col + 1];
    }
    if (e.gelu) {
      v[0] = gelu_tanh(v[0]);
      v[1] = gelu_tanh(v[1]);
    }
  }
  const Out* add = kP == Product::Forward ? e.residual : kP == Product::BackwardWeight ? e.out : nullptr;
  if (two && pair_aligned(e.out + at) && (!add || pair_aligned(add + at))) {
    if (add) {
      float lo, hi;
      load_pair(add + at, lo, hi);
      v[0] += lo;
      v[1] += hi;
    }
    store_pair(e.out + at, v[0], v[1]);
    return;
  }
  for (int c = 0; c < (two ? 2 : 1); ++c) {
    if (add) v[c] += to_float(add[at + c]);
    e.out[at + c] = from_float<Out>(v[c]);
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
  const TileIndex tile = grouped_tile();
  const int row0 = tile.row * kTile, col0 = tile.col * kN;
  const int steps = ceil_div(R, kStep);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumerThreads);
    }
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
      load_tile<kTransP<kP>, kTile>(stage, map_p, row0, step * kStep, &full[s]);
      load_tile<kTransQ<kP>, kN>(stage + kOperandBytes, map_q, col0, step * kStep, &full[s]);
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

  // Warp w of the warpgroup holds rows 16w + g and 16w + g + 8 of its half; registers 4j + 2h
  // and 4j + 2h + 1 are row 16w + g + 8h, columns 8j + 2t and 8j + 2t + 1.
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  UNROLL
  for (int j = 0; j < kN / 8; ++j)
    UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + half + 16 * warp + g + 8 * h;
      const int col = col0 + 8 * j + 2 * t;
      if (row >= rows || col >= cols) continue;
      float v[2] = {acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]};
      store_columns<kP>(e, (size_t)row * cols + col, col, v, col + 1 < cols);
    }
}
#endif

}  // namespace gemm_sm90_detail

// map_a: A [M, K] (box 64 x 128); map_w: W [N, K] (the same).
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

// map_dout: dout [M, N] (box 64 x 64); map_inp: inp [M, K] (box 64 x 64).
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_bwd_weight_bf16_sm90(const __grid_constant__ TensorMap map_dout, const __grid_constant__ TensorMap map_inp,
                              float* dweight, int M, int N, int K) {
#ifdef TRIDENT_WGMMA
  using namespace gemm_sm90_detail;
  gemm_body<Product::BackwardWeight>(&map_dout, &map_inp, Epilogue<float>{dweight, nullptr, nullptr, 0}, N, K, M);
#else
  __trap();
#endif
}
