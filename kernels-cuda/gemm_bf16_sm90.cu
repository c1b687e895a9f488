// gemm_bf16_sm90.cu: the linear layer's forward, out = epilogue(A · Wᵀ), on Hopper's warpgroup
// tensor-core instruction (wgmma, sm_90a) instead of gemm_bf16.cu's warp-wide mma.sync.
//
// Computes   out[m][n] = act(Σ_k A[m][k]·W[n][k] + bias[n]) + residual[m][n]
// with the layouts and epilogue of gemm_fwd_bf16_f32out (gemm_bf16.cu): A [M, K] and W [N, K]
// bf16 row-major, bias [N] f32 or null, act identity or tanh GELU, residual [M, N] f32 or null,
// out [M, N] f32. Any M, N, K >= 1: ragged edges load as zeros and stores are guarded.
//
// Grid: (⌈N/64⌉, ⌈M/64⌉) blocks of one warpgroup (128 threads), each owning a 64x64 tile of out.
// Per 32-deep K tile the warpgroup issues two wgmma.mma_async.m64n64k16 (A and B both read from
// shared memory through matrix descriptors), commits them as one group and waits for it; the
// next K tile streams in with cp.async meanwhile (double buffering, as in gemm_bf16.cu; plain
// loads when K is not a multiple of 8). No TMA, no warp specialisation, no deeper wgmma
// pipelining yet: this is the smallest correct use of the instruction.
//
// Shared memory: both operands are stored in wgmma's no-swizzle K-major layout of 8x8 core
// matrices (8 rows of 16 contiguous bytes, 128 B each). A 64-row x 32-K tile holds them in
// order [K block 0..3][row block 0..7], so the core matrix next in M or N is 128 B on (the
// descriptor's stride byte offset) and the one next in K is 8 x 128 = 1024 B on (its leading byte
// offset). 2 stages x 2 operands x 4096 B = 16384 B, static. Registers: 32 f32 accumulators per
// thread in wgmma's m64n64 fragment layout (../emu/wgmma.h).
//
// Built only where wgmma exists (TRIDENT_WGMMA: sm_90a, and the emulation); compiled for any
// other arch the kernel traps, and the launcher must pick gemm_fwd_bf16_f32out there.
// Reference: trident's `Device::linear_forward` (+ `gelu_forward`, + `add`) on the reference
// device, in f64 on the same bf16-rounded inputs; tested under the SIMT emulation by
// tests/cuda_emulation.rs.
#include "common/base.cuh"
#include "common/gelu.cuh"
#include "common/ptx.cuh"
#include "common/wgmma.cuh"

namespace gemm_sm90_detail {

constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kThreads = 128;
constexpr int kCoreElems = 64;                       // an 8x8 core matrix, 128 bytes
constexpr int kTileElems = kTileM * kTileK;          // one operand's tile (kTileN == kTileM)
constexpr uint32_t kStrideBytes = 128;               // next core matrix in M / N
constexpr uint32_t kLeadingBytes = 8 * 128;          // next core matrix in K (8 row blocks on)

struct Tiles {
  bf16 a[2][kTileElems];
  bf16 w[2][kTileElems];
};

// Index of element (row, k) of a tile in the core-matrix layout above.
__device__ __forceinline__ int core_index(int row, int k) {
  return ((k / 8) * (kTileM / 8) + row / 8) * kCoreElems + (row % 8) * 8 + k % 8;
}

// Rows row0..row0+63, K columns k0..k0+31 of a [rows, K] row-major matrix into a tile; zeros
// outside the matrix. A 16-byte cp.async chunk is one row of one core matrix.
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int rows, int K, int row0, int k0, bool async) {
  if (async) {
    for (int chunk = threadIdx.x; chunk < kTileM * (kTileK / 8); chunk += kThreads) {
      const int r = chunk / (kTileK / 8), c = (chunk % (kTileK / 8)) * 8;
      const int row = row0 + r, k = k0 + c;
      int bytes = 0;
      const bf16* from = src;
      if (row < rows && k < K) {
        bytes = 2 * (K - k < 8 ? K - k : 8);
        from = src + (size_t)row * K + k;
      }
      cp_async_16(tile + core_index(r, c), from, bytes);
    }
  } else {
    for (int i = threadIdx.x; i < kTileM * kTileK; i += kThreads) {
      const int r = i / kTileK, c = i % kTileK;
      const int row = row0 + r, k = k0 + c;
      tile[core_index(r, c)] = (row < rows && k < K) ? src[(size_t)row * K + k] : to_bf16(0.0f);
    }
  }
}

#ifdef TRIDENT_WGMMA
__device__ __forceinline__ void gemm_sm90_body(float* __restrict__ out, const bf16* __restrict__ A,
                                               const bf16* __restrict__ W, const float* __restrict__ bias,
                                               const float* __restrict__ residual, int M, int N, int K, int gelu) {
  __shared__ __align__(128) Tiles tiles;
  wgmma_shared_window(&tiles, sizeof tiles);
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  const bool async = K % 8 == 0 && reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;

  float acc[32];
  UNROLL
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;

  auto load_stage = [&](int stage, int k0) {
    load_tile(tiles.a[stage], A, M, K, m0, k0, async);
    load_tile(tiles.w[stage], W, N, K, n0, k0, async);
    cp_async_commit();
  };

  const int k_tiles = ceil_div(K, kTileK);
  load_stage(0, 0);
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < k_tiles) {
      load_stage(stage ^ 1, (kt + 1) * kTileK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_shared();  // this thread's tile writes, visible to wgmma's operand reads
    __syncthreads();             // ... and everyone's

    wgmma_fence();
    UNROLL
    for (int kk = 0; kk < kTileK; kk += 16) {
      // The k16 slice starting at kk begins at core-matrix column kk / 8.
      const uint64_t desc_a = wgmma_descriptor(&tiles.a[stage][core_index(0, kk)], kLeadingBytes, kStrideBytes);
      const uint64_t desc_w = wgmma_descriptor(&tiles.w[stage][core_index(0, kk)], kLeadingBytes, kStrideBytes);
      wgmma_m64n64k16_bf16(acc, desc_a, desc_w, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();  // the accumulators are final and the stage may be refilled
    __syncthreads();
  }

  // Warp w holds rows 16w + g and 16w + g + 8; register 4j + e is column 8j + 2t + e % 2.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  UNROLL
  for (int j = 0; j < kTileN / 8; ++j)
    UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + 16 * warp + g + (e / 2) * 8;
      const int col = n0 + 8 * j + 2 * t + e % 2;
      if (row >= M || col >= N) continue;
      float v = acc[4 * j + e];
      if (bias) v += bias[col];
      if (gelu) v = gelu_tanh(v);
      const size_t at = (size_t)row * N + col;
      if (residual) v += residual[at];
      out[at] = v;
    }
}
#endif

}  // namespace gemm_sm90_detail

extern "C" __global__ void __launch_bounds__(128)
    gemm_fwd_bf16_f32out_sm90(float* out, const bf16* A, const bf16* W, const float* bias, const float* residual, int M,
                              int N, int K, int gelu) {
#ifdef TRIDENT_WGMMA
  gemm_sm90_detail::gemm_sm90_body(out, A, W, bias, residual, M, N, K, gelu);
#else
  __trap();  // no wgmma on this arch; never launched here
#endif
}
