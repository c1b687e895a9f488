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
// Grid: (⌈cols/128⌉, ⌈rows/128⌉) blocks of 384 threads, each owning a 128 x 128 tile of D.
// Warpgroup 0 is the producer: one thread issues the loads, the other 127 have nothing to do and
// return (no __syncthreads follows the split). Warpgroups 1 and 2 are the consumers, one 64-row
// half of the tile each, 64 f32 accumulators per thread in wgmma's m64n128 fragment layout.
// Per 64-deep reduction step the producer waits until the consumers have released stage s
// (barrier empty[s]), announces its 32 KiB (arrive.expect_tx on full[s]) and issues two TMA
// copies (the 128 x 64 P tile and Q tile); each consumer waits on full[s], issues four
// wgmma.mma_async.m64n128k16 (A from P's half, B from Q) as one commit group, and waits with
// wgmma.wait_group 1: the group just issued stays in flight while the previous one is known
// complete, whose stage it then releases (every consumer thread arrives on empty[s - 1]). So up
// to 4 loads and 2 wgmma groups are in flight per block.
// Why a producer warpgroup: the loads of step k + 3 are issued as soon as step k - 1's stage is
// released, independently of where either consumer is in its wgmma stream, and the consumers'
// loop has no load code; with 128 x 128 tiles the consumers need ~90 registers, within
// __launch_bounds__(384, 1)'s 168, so no setmaxnreg rebalancing is needed.
//
// Shared memory (dynamic, 1024-byte aligned: 4 x 32 KiB stages + 8 barriers = 131136 bytes, so
// the launcher sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). A tile is stored in wgmma's
// no-swizzle core-matrix layout (8 x 8 elements, 128 contiguous bytes: ../emu/wgmma.h), which TMA
// writes directly from a 3-D view of a row-major [rows, cols] matrix: dimension 0 the 8 elements
// of a 16-byte chunk (size 8), dimension 1 the rows (stride = the row pitch), dimension 2 the
// chunks of a row (size cols / 8, stride 16 bytes), box (8, b1, b2) landing as [b2][b1][8].
//   K-major operand (its rows along the tile's rows or columns, the reduction contiguous:
//   A of the forward, W of the forward, dout of backward-input): box (8, 128, 8) at
//   (0, tile row, r0 / 8): element (i, r) at 16 i + 2048 (r / 8) + 2 (r % 8) bytes, so the
//   descriptor's SBO (next core matrix in M / N) is 128 and LBO (next in K) 2048.
//   MN-major operand (the reduction along the matrix's rows: W of backward-input, dout and inp of
//   backward-weight): box (8, 64, 16) at (0, r0, tile col / 8): element (i, r) at
//   1024 (i / 8) + 16 r + 2 (i % 8) bytes: SBO 1024, LBO 128, and wgmma's transpose flag set.
// The host makes the tensor maps (src/gpu/device_ops.rs, the harness): bf16, 3 dimensions, no
// interleave, no swizzle, out-of-bounds fill with zeros.
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

namespace gemm_sm90_detail {

enum class Product { Forward, BackwardInput, BackwardWeight };

#ifdef TRIDENT_WGMMA
constexpr int kTile = 128, kStep = 64, kStages = 4, kConsumerThreads = 256;
constexpr uint32_t kOperandBytes = kTile * kStep * 2;     // one 128 x 64 bf16 tile: 16 KiB
constexpr uint32_t kStageBytes = 2 * kOperandBytes;       // P and Q
constexpr size_t kBarrierOffset = size_t(kStages) * kStageBytes;
constexpr size_t kSharedBytes = kBarrierOffset + 2 * kStages * sizeof(uint64_t);  // 131136

// P (the A operand) is MN-major only for backward-weight; Q (B) for both backward products.
template <Product kP>
constexpr int kTransP = kP == Product::BackwardWeight;
template <Product kP>
constexpr int kTransQ = kP != Product::Forward;

// The TMA coordinates of a tile whose rows or columns start at `i0`, reduction step at `r0`.
template <int kTrans>
__device__ __forceinline__ void load_tile(void* dst, const TensorMap* map, int i0, int r0, uint64_t* bar) {
  if (kTrans)
    tma_load_3d(dst, map, 0, r0, i0 / 8, bar);
  else
    tma_load_3d(dst, map, 0, i0, r0 / 8, bar);
}

// The descriptor of rows `i0`.. of a tile, reduction columns kk..kk+15 (layouts above).
template <int kTrans>
__device__ __forceinline__ uint64_t tile_descriptor(const unsigned char* tile, int i0, int kk) {
  if (kTrans) return wgmma_descriptor(tile + (i0 / 8) * 1024 + kk * 16, 128, 1024);
  return wgmma_descriptor(tile + i0 * 16 + (kk / 8) * 2048, 2048, 128);
}

// The output D (f32 or bf16) and, for the forward, its fused epilogue.
template <class Out>
struct Epilogue {
  Out* out;
  const float* bias;
  const Out* residual;
  int gelu;
};

template <Product kP, class Out>
__device__ __forceinline__ void gemm_body(const TensorMap* map_p, const TensorMap* map_q, const Epilogue<Out>& e, int rows,
                                          int cols, int R) {
  unsigned char* smem = dynamic_shared(kSharedBytes);
  wgmma_shared_window(smem, kSharedBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);
  uint64_t* empty = full + kStages;
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
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
      unsigned char* stage = smem + size_t(s) * kStageBytes;
      mbarrier_arrive_expect_tx(&full[s], kStageBytes);
      load_tile<kTransP<kP>>(stage, map_p, row0, step * kStep, &full[s]);
      load_tile<kTransQ<kP>>(stage + kOperandBytes, map_q, col0, step * kStep, &full[s]);
    }
    return;
  }

  const int half = (warpgroup - 1) * 64;  // this consumer's rows of the tile
  float acc[64];
  UNROLL
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int step = 0; step < steps; ++step) {
    const int s = step % kStages;
    mbarrier_wait(&full[s], (step / kStages) & 1);
    const unsigned char* stage = smem + size_t(s) * kStageBytes;
    wgmma_fence();
    UNROLL
    for (int kk = 0; kk < kStep; kk += 16) {
      const uint64_t desc_p = tile_descriptor<kTransP<kP>>(stage, half, kk);
      const uint64_t desc_q = tile_descriptor<kTransQ<kP>>(stage + kOperandBytes, 0, kk);
      wgmma_m64n128k16_bf16<kTransP<kP>, kTransQ<kP>>(acc, desc_p, desc_q, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous step's group is complete: its stage may be refilled
    if (step > 0) mbarrier_arrive(&empty[(step - 1) % kStages]);
  }
  wgmma_wait<0>();

  // Warp w of the warpgroup holds rows 16w + g and 16w + g + 8 of its half; register 4j + c is
  // column 8j + 2t + c % 2.
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  UNROLL
  for (int j = 0; j < kTile / 8; ++j)
    UNROLL
    for (int c = 0; c < 4; ++c) {
      const int row = row0 + half + 16 * warp + g + (c / 2) * 8;
      const int col = col0 + 8 * j + 2 * t + c % 2;
      if (row >= rows || col >= cols) continue;
      float v = acc[4 * j + c];
      const size_t at = (size_t)row * cols + col;
      if (kP == Product::Forward) {
        if (e.bias) v += e.bias[col];
        if (e.gelu) v = gelu_tanh(v);
        if (e.residual) v += to_float(e.residual[at]);
      } else if (kP == Product::BackwardWeight) {
        v += to_float(e.out[at]);
      }
      e.out[at] = from_float<Out>(v);
    }
}
#endif

}  // namespace gemm_sm90_detail

// map_a: A [M, K] (box 8 x 128 x 8); map_w: W [N, K] (the same).
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

// map_dout: dout [M, N] (box 8 x 128 x 8); map_w: W [N, K] (box 8 x 64 x 16).
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

// map_dout: dout [M, N] (box 8 x 64 x 16); map_inp: inp [M, K] (box 8 x 64 x 16).
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
