// harness.cpp: runs one CUDA kernel (kernels/ and kernels-cuda/) under the SIMT emulation on inputs that
// tests/cuda_emulation.rs wrote, and writes the outputs back for it to compare with trident's
// reference device. Built by that test with
//   g++ -std=c++20 -O1 -DTRIDENT_EMU -pthread -I kernels -I kernels-cuda -I kernels-hip harness.cpp -o harness
// Usage: harness <op> <dir> <integer and real arguments of the op>
// The ops the HIP kernels share (and the files they read and write) are harness.h's, run here in
// the CUDA geometry (kGeometry); this file adds the CUDA-only ones: the sm_90a wgmma + TMA GEMMs
// (forward and both backward products, on tensor maps made here as the host makes them),
// tensor_ops.cu's f32 kernels, and the probes of the 128-byte swizzle (TMA to wgmma), of
// ldmatrix, the warp collectives, a divergent collective, a buffer refilled by cp.async before
// another warp's read, and a launch short of the dynamic shared memory its kernel uses.
#include <string>

#include "../../../kernels/adamw.cu"
#include "../../attention_bwd.cu"
#include "../../attention_fwd.cu"
#include "../../../kernels/casts.cu"
#include "../../../kernels/embedding.cu"
#include "../../../kernels/gelu.cu"
#include "../../gemm_bf16.cu"
#include "../../gemm_bf16_bwd.cu"
#include "../../gemm_bf16_sm90.cu"
#include "../../../kernels/layernorm.cu"
#include "../../../kernels/rope.cu"
#include "../../../kernels/softmax_xent.cu"
#include "../../../kernels/tensor_ops.cu"
#include "harness.h"

namespace {

using namespace harness;

// Blocks of 4 warps (128 threads) for the row kernels (as the kernel index launches them); the
// sm_80 GEMMs' 8 warps on 128 x 128 tiles with their dynamic shared memory
// (common/gemm_pipeline.cuh); attention's tiles and stages in dynamic shared memory, and the
// queries per block of its forward and dQ.
constexpr Geometry kGeometry{gemm_pipeline::kThreads,
                             128,
                             gemm_pipeline::kTile,
                             {gemm_bf16_detail::kSharedBytes, gemm_bwd_detail::kInputSharedBytes,
                              gemm_bwd_detail::kWeightSharedBytes},
                             {{attention_fwd_detail::kSharedBytesD32, attention_bwd_detail::kDkvSharedBytesD32,
                               attention_bwd_detail::kDqSharedBytesD32},
                              {attention_fwd_detail::kSharedBytesD64, attention_bwd_detail::kDkvSharedBytesD64,
                               attention_bwd_detail::kDqSharedBytesD64},
                              {attention_fwd_detail::kSharedBytesD128, attention_bwd_detail::kDkvSharedBytesD128,
                               attention_bwd_detail::kDqSharedBytesD128}},
                             {attention_fwd_detail::kQueriesD32, attention_fwd_detail::kQueriesD64,
                              attention_fwd_detail::kQueriesD128},
                             {{attention_fwd_detail::kDocsSharedBytesD32, attention_bwd_detail::kDkvDocsSharedBytesD32,
                               attention_bwd_detail::kDqDocsSharedBytesD32},
                              {attention_fwd_detail::kDocsSharedBytesD64, attention_bwd_detail::kDkvDocsSharedBytesD64,
                               attention_bwd_detail::kDqDocsSharedBytesD64},
                              {attention_fwd_detail::kDocsSharedBytesD128, attention_bwd_detail::kDkvDocsSharedBytesD128,
                               attention_bwd_detail::kDqDocsSharedBytesD128}}};
static_assert(attention_bwd_detail::DqTilesOf<32>::kQueries == attention_fwd_detail::kQueriesD32 &&
                  attention_bwd_detail::DqTilesOf<64>::kQueries == attention_fwd_detail::kQueriesD64 &&
                  attention_bwd_detail::DqTilesOf<128>::kQueries == attention_fwd_detail::kQueriesD128,
              "the forward's and dQ's blocks own the same queries (Geometry::attention_queries)");

// The tensor map of gemm_bf16_sm90.cu over a row-major bf16 [rows, cols] matrix (cols a
// multiple of 8): 2-D (cols, rows), 128-byte swizzle, box (64, 128) for a K-major operand,
// (64, 64) for an MN-major one; src/gpu/tma.rs makes the same through the driver. `swizzle`:
// CU_TENSOR_MAP_SWIZZLE_128B but for wgmma_probe's planted wrong map.
TensorMap sm90_tensor_map(const bf16* base, int rows, int cols, bool mn_major, int swizzle = emu::kTmaSwizzle128B) {
  if (cols % 8) {
    std::fprintf(stderr, "harness: the sm_90a GEMMs need row pitches that are multiples of 8 (got %d)\n", cols);
    std::exit(2);
  }
  TensorMap map;
  const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)};
  const uint64_t strides[1] = {uint64_t(cols) * 2};
  const unsigned box[2] = {64, mn_major ? 64u : 128u}, ones[2] = {1, 1};
  const char* why = "";
  if (emu::encode_tiled(&map, emu::kTmaBfloat16, 2, base, dims, strides, box, ones, 0, swizzle, 0, 0, &why)) {
    std::fprintf(stderr, "harness: cuTensorMapEncodeTiled: %s\n", why);
    std::exit(2);
  }
  return map;
}

// gemm_fwd_bf16_f32out_sm90 (Out float) or gemm_fwd_bf16_sm90 (bf16) on harness.h's
// gemm_forward files, and the backward kernels on gemm_backward's.
template <class Out>
void gemm_sm90_forward() {
  constexpr bool f32 = std::is_same_v<Out, float>;
  const int M = arg(0), N = arg(1), K = arg(2), gelu = arg(3);
  auto A = read_bf16("a", size_t(M) * K), W = read_bf16("w", size_t(N) * K);
  bool present = false;
  auto bias = read_f32("bias", N, &present);
  auto residual = read<Out>("residual", f32 ? "f32" : "bf16", size_t(M) * N, &present);
  std::vector<Out> out(size_t(M) * N, from_float<Out>(-1.0f));
  void (*kernel)(TensorMap, TensorMap, Out*, const float*, const Out*, int, int, int, int);
  if constexpr (f32) kernel = gemm_fwd_bf16_f32out_sm90; else kernel = gemm_fwd_bf16_sm90;
  using gemm_sm90_detail::Product;
  emu::launch_dynamic(gemm_sm90_detail::kSharedBytes<Product::Forward>,
                      dim3(ceil_div(N, gemm_sm90_detail::kCols<Product::Forward>), ceil_div(M, 128)), dim3(384), kernel,
                      sm90_tensor_map(A.data(), M, K, false), sm90_tensor_map(W.data(), N, K, false), out.data(),
                      (const float*)or_null(bias), (const Out*)or_null(residual), M, N, K, gelu);
  write("out", f32 ? "f32" : "bf16", out);
}
// dinp = dout · W with a bf16 output on sm_90a (gemm_bwd_input_bf16_bf16out_sm90).
void gemm_sm90_backward_bf16_out() {
  const int M = arg(0), N = arg(1), K = arg(2);
  auto dout = read_bf16("dout", size_t(M) * N), W = read_bf16("w", size_t(N) * K);
  std::vector<bf16> dinp(size_t(M) * K, to_bf16(-1.0f));
  constexpr auto kInput = gemm_sm90_detail::Product::BackwardInput;
  emu::launch_dynamic(gemm_sm90_detail::kSharedBytes<kInput>,
                      dim3(ceil_div(K, gemm_sm90_detail::kCols<kInput>), ceil_div(M, 128)), dim3(384),
                      gemm_bwd_input_bf16_bf16out_sm90, sm90_tensor_map(dout.data(), M, N, false),
                      sm90_tensor_map(W.data(), N, K, true), dinp.data(), M, N, K);
  write_bf16("dinp", dinp);
}
// Both backward products; backward-weight's reduction over M in arg(3) slices (default 1), whose
// partial tiles and counters it allocates as the Device does (counters zero; they must be
// zero again after the launch: a nonzero one is reported).
void gemm_sm90_backward() {
  const int M = arg(0), N = arg(1), K = arg(2), slices = arg_or(3, 1);
  auto dout = read_bf16("dout", size_t(M) * N), W = read_bf16("w", size_t(N) * K);
  auto inp = read_bf16("inp", size_t(M) * K);
  auto dweight = read_f32("dweight", size_t(N) * K);
  std::vector<float> dinp(size_t(M) * K, -1.0f);
  using gemm_sm90_detail::kCols, gemm_sm90_detail::kSharedBytes, gemm_sm90_detail::Product;
  emu::launch_dynamic(kSharedBytes<Product::BackwardInput>,
                      dim3(ceil_div(K, kCols<Product::BackwardInput>), ceil_div(M, 128)), dim3(384),
                      gemm_bwd_input_bf16_sm90,
                      sm90_tensor_map(dout.data(), M, N, false), sm90_tensor_map(W.data(), N, K, true), dinp.data(), M,
                      N, K);
  const dim3 grid(ceil_div(K, kCols<Product::BackwardWeight>), ceil_div(N, 128), slices);
  const size_t tiles = size_t(grid.x) * grid.y;
  std::vector<float> partials(slices > 1 ? tiles * slices * 128 * kCols<Product::BackwardWeight> : 0, NAN);
  std::vector<unsigned> counters(slices > 1 ? tiles : 0, 0u);
  emu::launch_dynamic(kSharedBytes<Product::BackwardWeight>, grid, dim3(384), gemm_bwd_weight_bf16_sm90,
                      sm90_tensor_map(dout.data(), M, N, true), sm90_tensor_map(inp.data(), M, K, true),
                      dweight.data(), slices > 1 ? partials.data() : nullptr, slices > 1 ? counters.data() : nullptr,
                      M, N, K);
  for (unsigned c : counters) {
    if (c != 0) {
      std::fprintf(stderr, "harness: gemm_bwd_weight_bf16_sm90 left a slice counter at %u\n", c);
      std::exit(3);
    }
  }
  write_f32("dinp", dinp);
  write_f32("dweight", dweight);
}

// A test of the 128-byte swizzle end to end, TMA writing and wgmma reading: one warpgroup
// computes D [64, 128] = A · Bᵀ over K = 64 (four m64n128k16 steps) from A [64, 64] and B
// [128, 64] loaded by TMA, both K-major (A [m][k], B [n][k] in global memory, boxes (64, 64) and
// (64, 128)) or both MN-major (A [k][m], B [k][n], boxes (64, 64), B in two halves), with
// gemm_bf16_sm90.cu's descriptors, or with one bug planted (`plant`): 1 SBO 512 (half the
// atom), 2 the tensor maps without swizzle under 128B descriptors, 3 descriptors of layout type
// 0 (no swizzle) over swizzled tiles, 4 the K step of the other major-ness (K-major advanced by
// 128 bytes per element of K, MN-major by 2), 5 tiles 512 bytes past the 1024-byte period, 6 an
// MN-major LBO of 4096 (half a tile). out is D row-major.
__global__ void wgmma_probe(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, float* out,
                            int mn_major, int plant) {
  constexpr uint32_t kA = 64 * 64 * 2, kB = 128 * 64 * 2;
  constexpr size_t kBytes = 1024 + 512 + kA + kB + 8;
  unsigned char* const window = dynamic_shared(kBytes);
  wgmma_shared_window(window, kBytes);
  unsigned char* const a = align_shared_1024(window) + (plant == 5 ? 512 : 0);
  unsigned char* const b = a + kA;
  uint64_t* bar = reinterpret_cast<uint64_t*>(b + kB);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, kA + kB);
    tma_load_2d(a, &map_a, 0, 0, bar);
    tma_load_2d(b, &map_b, 0, 0, bar);
    if (mn_major) tma_load_2d(b + kB / 2, &map_b, 64, 0, bar);
  }
  mbarrier_wait(bar, 0);
  float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const uint32_t sbo = plant == 1 ? 512 : 1024, lbo = mn_major ? (plant == 6 ? 4096 : kB / 2) : 16;
  wgmma_fence();
  for (int kk = 0; kk < 64; kk += 16) {
    const int k_step = (mn_major != (plant == 4)) ? kk * 128 : kk * 2;
    uint64_t desc_a = wgmma_descriptor_sw128(a + k_step, lbo, sbo), desc_b = wgmma_descriptor_sw128(b + k_step, lbo, sbo);
    if (plant == 3) desc_a &= ~(uint64_t(3) << 62), desc_b &= ~(uint64_t(3) << 62);
    if (mn_major)
      wgmma_bf16<128, 1, 1>(acc, desc_a, desc_b, 1);
    else
      wgmma_bf16<128, 0, 0>(acc, desc_a, desc_b, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  for (int j = 0; j < 16; ++j)
    for (int c = 0; c < 4; ++c) out[(16 * warp + g + 8 * (c / 2)) * 128 + 8 * j + 2 * t + c % 2] = acc[4 * j + c];
}

// A test of ldmatrix itself: a 16x16 tile holding its own element indices, read by every
// variant with lane l addressing row l % 16, column block l / 16; registers out in lane order.
__global__ void ldmatrix_probe(uint32_t* out) {
  __shared__ __align__(16) uint16_t tile[16][16];
  for (int i = threadIdx.x; i < 256; i += 32) tile[i / 16][i % 16] = uint16_t(i);
  __syncthreads();
  const void* row = &tile[threadIdx.x % 16][(threadIdx.x / 16) * 8];
  uint32_t r1[1], r2[2], r4[4];
  uint32_t* o = out + threadIdx.x * 14;
  ldmatrix_x1(r1, row);
  o[0] = r1[0];
  ldmatrix_x2(r2, row);
  o[1] = r2[0], o[2] = r2[1];
  ldmatrix_x4(r4, row);
  for (int i = 0; i < 4; ++i) o[3 + i] = r4[i];
  ldmatrix_x1_trans(r1, row);
  o[7] = r1[0];
  ldmatrix_x2_trans(r2, row);
  o[8] = r2[0], o[9] = r2[1];
  ldmatrix_x4_trans(r4, row);
  for (int i = 0; i < 4; ++i) o[10 + i] = r4[i];
}

// A test of the warp collectives: each thread of two full warps records the results of every
// shuffle kind (with and without sub-warp widths) and the votes.
__global__ void shuffle_probe(int* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, v = 100 * warp + lane;
  int* o = out + threadIdx.x * 11;
  o[0] = __shfl_sync(FULL_WARP_MASK, v, lane * 7 + 3);
  o[1] = __shfl_sync(FULL_WARP_MASK, v, lane * 3, 8);
  o[2] = __shfl_up_sync(FULL_WARP_MASK, v, 3);
  o[3] = __shfl_up_sync(FULL_WARP_MASK, v, 2, 8);
  o[4] = __shfl_down_sync(FULL_WARP_MASK, v, 5);
  o[5] = __shfl_down_sync(FULL_WARP_MASK, v, 1, 16);
  o[6] = __shfl_xor_sync(FULL_WARP_MASK, v, 6);
  o[7] = __shfl_xor_sync(FULL_WARP_MASK, v, 1, 4);
  o[8] = __any_sync(FULL_WARP_MASK, lane == 5 && warp == 1);
  o[9] = __all_sync(FULL_WARP_MASK, lane < 31);
  o[10] = int(__ballot_sync(FULL_WARP_MASK, lane % 3 == 0));
}

// A kernel with a bug the emulation must report rather than hang on: one lane returns before a
// full-warp collective.
__global__ void early_return_probe(float* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = wave_sum(1.0f);
}

// A kernel with the race a cp.async ring must not have: each thread of two warps loads one
// element of a 64-float buffer, every thread reads an element of the other warp's half (through
// a warp collective, as ldmatrix reads a tile), and the buffer is refilled with no barrier
// between those reads and the refill. out[64 b + t] is what thread t of block b read: src[t ^ 32]
// if the refill came after every read; NaN (a refill in flight) where the other warp got ahead.
__global__ void early_refill_probe(float* out, const float* src) {
  __shared__ __align__(16) float buffer[64];
  const int t = threadIdx.x;
  cp_async_4(&buffer[t], &src[t], 4);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  out[64 * blockIdx.x + t] = __shfl_sync(FULL_WARP_MASK, buffer[t ^ 32], threadIdx.x % 32);
  cp_async_4(&buffer[t], &src[64 + t], 4);  // the bug: no __syncthreads() before this refill
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string op = parse(argc, argv);
  if (run_shared_op(op, kGeometry)) return 0;
  if (op == "gemm_sm90_f32out") {
    gemm_sm90_forward<float>();
  } else if (op == "gemm_sm90_bf16out") {
    gemm_sm90_forward<bf16>();
  } else if (op == "gemm_sm90_bwd") {
    gemm_sm90_backward();
  } else if (op == "gemm_sm90_bwd_bf16out") {
    gemm_sm90_backward_bf16_out();
  } else if (op == "wgmma_probe") {
    const int mn_major = arg(0), plant = arg(1);
    auto a = read_bf16("a", 64 * 64), b = read_bf16("b", 128 * 64);
    const int swizzle = plant == 2 ? emu::kTmaSwizzleNone : emu::kTmaSwizzle128B;
    // K-major: A [64 m][64 k], B [128 n][64 k]; MN-major: A [64 k][64 m], B [64 k][128 n].
    const TensorMap map_a = sm90_tensor_map(a.data(), 64, 64, true, swizzle);
    const TensorMap map_b = mn_major ? sm90_tensor_map(b.data(), 64, 128, true, swizzle)
                                     : sm90_tensor_map(b.data(), 128, 64, false, swizzle);
    std::vector<float> out(64 * 128, -1.0f);
    emu::launch_dynamic(1024 + 512 + 3 * 8192 + 8, dim3(1), dim3(128), wgmma_probe, map_a, map_b, out.data(), mn_major,
                        plant);
    write_f32("d", out);
  } else if (op == "tensor_map_rules") {
    // cuTensorMapEncodeTiled's rules as the emulated driver applies them: 0 accepted, 1 refused.
    alignas(16) static bf16 matrix[64 * 128];
    struct Try {
      int offset_bytes, cols, box0, swizzle;
    };
    const Try tries[] = {
        {0, 128, 64, emu::kTmaSwizzle128B},   // the sm_90a GEMMs' map: 128-byte rows
        {0, 128, 128, emu::kTmaSwizzle128B},  // an innermost box of 256 bytes, over the span
        {0, 128, 32, emu::kTmaSwizzle128B},   // 64 bytes: allowed, not emulated
        {8, 128, 64, emu::kTmaSwizzle128B},   // a global address 8 bytes off 16
        {0, 60, 64, emu::kTmaSwizzle128B},    // a row pitch of 120 bytes, not a multiple of 16
        {0, 128, 64, 2},                      // the 64-byte swizzle: not emulated
        {0, 128, 128, emu::kTmaSwizzleNone},  // no swizzle: 256-byte rows are fine
    };
    std::vector<int> refused;
    for (const Try& t : tries) {
      TensorMap map;
      const uint64_t dims[2] = {uint64_t(t.cols), 64}, strides[1] = {uint64_t(t.cols) * 2};
      const unsigned box[2] = {unsigned(t.box0), 64}, ones[2] = {1, 1};
      const char* why = "";
      const auto* base = reinterpret_cast<const unsigned char*>(matrix) + t.offset_bytes;
      refused.push_back(emu::encode_tiled(&map, emu::kTmaBfloat16, 2, base, dims, strides, box, ones, 0, t.swizzle, 0, 0,
                                          &why));
    }
    write("refused", "i32", refused);
  } else if (op == "tensor_ops") {
    // tensor_ops.cu's row, column and block reductions on one [rows, cols] matrix x, with the
    // Device's geometry (a warp per row in blocks of 128; a thread per column in blocks of 256;
    // the column sum's strips and chunks; a block per embedding segment; 8192-element blocks for
    // the squares) and grid-stride kernels on `blocks` blocks of 256. Arguments 4 and 5: the
    // segments' count and words (read_segments).
    const int rows = arg(0), cols = arg(1), blocks = arg(2), vocab_rows = arg(3);
    const size_t n = size_t(rows) * cols;
    auto x = read_f32("x", n), dy = read_f32("dy", n), w = read_f32("w", cols), b = read_f32("b", cols);
    auto tokens = read_u32("tokens", rows);
    auto dinp = read_f32("dinp", n), dweight = read_f32("dweight", cols), dbias = read_f32("dbias", cols);
    auto dwte = read_f32("dwte", size_t(vocab_rows) * cols);
    std::vector<float> out(n), mean(rows), rstd(rows), gelu(n), biased = x;
    const dim3 row_grid(ceil_div(rows, 4)), col_grid(ceil_div(cols, 256));
    emu::launch(row_grid, dim3(128), layernorm_fwd_f32, out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                b.data(), rows, cols);
    emu::launch(row_grid, dim3(128), layernorm_bwd_dx_f32, dinp.data(), dy.data(), x.data(), w.data(), mean.data(),
                rstd.data(), rows, cols);
    emu::launch(col_grid, dim3(256), layernorm_bwd_params_f32, dweight.data(), dbias.data(), dy.data(), x.data(),
                mean.data(), rstd.data(), rows, cols);
    std::vector<double> sums(rows), max(rows), sum_exp(rows), target_logit(rows);
    emu::launch(row_grid, dim3(128), layernorm_sums_f32, sums.data(), x.data(), (const double*)nullptr, rows, cols);
    emu::launch(row_grid, dim3(128), xent_max_f32, max.data(), x.data(), rows, cols);
    emu::launch(row_grid, dim3(128), xent_partials_f32, sum_exp.data(), target_logit.data(), x.data(), tokens.data(), 0,
                max.data(), rows, cols);
    std::vector<float> dlogits = x;
    emu::launch(dim3(blocks), dim3(256), xent_bwd_f32, dlogits.data(), tokens.data(), 0, max.data(), sum_exp.data(),
                0.5f, rows, cols);
    // Rows of x as one sequence of `rows` tokens of width `cols`: the word-embedding gradient.
    const Segments segments = read_segments(arg(4), arg(5));
    if (segments.count > 0)
      emu::launch(dim3(segments.count, ceil_div(cols, 256)), dim3(256), embedding_bwd_f32, dwte.data(), dy.data(),
                  segments.rows(), segments.starts(), segments.positions(), cols);
    ColumnSumScratch column_scratch(rows, cols);
    emu::launch(column_scratch.grid, dim3(256), column_sum_add_f32, dbias.data(), column_scratch.partials.data(),
                column_scratch.counters.data(), dy.data(), rows, cols);
    emu::launch(dim3(blocks), dim3(256), add_bias_f32, biased.data(), b.data(), rows, cols);
    emu::launch(dim3(blocks), dim3(256), gelu_fwd_f32, gelu.data(), x.data(), int(n), 0);
    std::vector<double> squares(ceil_div(int(n), 8192));
    // A table of one tensor: x, its length and its blocks.
    const unsigned long long tensors[] = {reinterpret_cast<unsigned long long>(x.data())};
    const int lens[] = {int(n)}, first_block[] = {0, int(squares.size())};
    emu::launch(dim3(unsigned(squares.size())), dim3(256), sum_squares_f32, squares.data(), tensors, lens, first_block,
                1);
    write_f32s({{"out", &out}, {"mean", &mean}, {"rstd", &rstd}, {"dinp", &dinp}, {"dweight", &dweight},
                {"dbias", &dbias}, {"dlogits", &dlogits}, {"dwte", &dwte}, {"biased", &biased}, {"gelu", &gelu}});
    write_f64s({{"sums", &sums}, {"max", &max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit},
                {"squares", &squares}});
  } else if (op == "shuffle") {
    std::vector<int> out(64 * 11);
    emu::launch(dim3(1), dim3(64), shuffle_probe, out.data());
    write("values", "i32", out);
  } else if (op == "short_dynamic_shared") {
    // The forward GEMM launched with one byte less dynamic shared memory than its stages need.
    std::vector<float> out(64), a(64), w(64);
    emu::launch_dynamic(gemm_bf16_detail::kSharedBytes - 1, dim3(1), dim3(gemm_pipeline::kThreads),
                        gemm_fwd_bf16_f32out, out.data(), reinterpret_cast<const bf16*>(a.data()),
                        reinterpret_cast<const bf16*>(w.data()), (const float*)nullptr, (const float*)nullptr, 8, 8,
                        8, 0);
  } else if (op == "early_refill") {
    std::vector<float> out(128), src(128);
    for (int i = 0; i < 128; ++i) src[i] = float(i);
    emu::launch(dim3(2), dim3(64), early_refill_probe, out.data(), src.data());
    write("values", "f32", out);
  } else if (op == "early_return") {
    std::vector<float> out(32);
    emu::launch(dim3(1), dim3(32), early_return_probe, out.data());
  } else if (op == "ldmatrix") {
    std::vector<uint32_t> out(32 * 14);
    emu::launch(dim3(1), dim3(32), ldmatrix_probe, out.data());
    write("regs", "u32", out);
  } else {
    return usage();
  }
  return 0;
}
