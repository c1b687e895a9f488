// harness.cpp: runs one HIP kernel (kernels/ and kernels-hip/) under the SIMT emulation with 64-lane wavefronts
// on inputs that tests/hip_emulation.rs wrote, and writes the outputs back for it to compare with
// trident's reference device. Built by that test with
//   g++ -std=c++20 -O1 -DTRIDENT_EMU -pthread -I kernels -I kernels-cuda -I kernels-hip harness.cpp -o harness
// (and once more with -DTRIDENT_PLANT_WAVE32_BUG, the planted wave32 reduction).
// Usage: harness <op> <dir> <arguments of the op (integers, and reals for adamw / xent)>
// The ops the CUDA kernels share (and the files they read and write) are
// kernels-cuda/emu/tests/harness.h's, run here in workgroups of 4 wavefronts; this file adds the
// HIP-only ones: tensor_ops.cu's f32 kernels on wave64 and the probes of the wave64 collectives and MFMA.
#include <string>

#include <algorithm>

// The portable kernels of kernels/ pick the HIP base (kernels/common/portable.h).
#define TRIDENT_EMU_HIP 1
#include "../../../kernels/adamw.cu"
#include "../../attention_bwd.hip"
#include "../../attention_fwd.hip"
#include "../../../kernels/casts.cu"
#include "../../../kernels/embedding.cu"
#include "../../../kernels/gelu.cu"
#include "../../gemm_bf16.hip"
#include "../../gemm_bf16_bwd.hip"
#include "../../../kernels/layernorm.cu"
#include "../../../kernels/rope.cu"
#include "../../../kernels/softmax_xent.cu"
#include "../../../kernels/tensor_ops.cu"
#include "../../../kernels-cuda/emu/tests/harness.h"

namespace {

using namespace harness;

// Workgroups of 4 wavefronts: 256 threads for the GEMMs, the row kernels and the column kernels.
constexpr Geometry kGeometry{4 * kWaveSize, 4 * kWaveSize};

// A test of the wave64 collectives: each thread of two wavefronts records a shuffle, an xor
// shuffle across the half-wave boundary, a shuffle down, the 64-bit ballot (two halves), any,
// all, and wave_sum of its lane index.
__global__ void wave64_probe(int* out) {
  const int lane = threadIdx.x % kWaveSize, wave = threadIdx.x / kWaveSize, v = 100 * wave + lane;
  int* o = out + threadIdx.x * 8;
  o[0] = __shfl(v, lane * 7 + 3);
  o[1] = __shfl_xor(v, 32);
  o[2] = __shfl_down(v, 5);
  const unsigned long long ballot = __ballot(lane % 3 == 0);
  o[3] = int(uint32_t(ballot));
  o[4] = int(uint32_t(ballot >> 32));
  o[5] = __any(lane == 63 && wave == 1);
  o[6] = __all(lane < 63);
  o[7] = int(wave_sum(float(lane)));
}

// A test of the MFMA model and common/mfma.h's lane mapping: one wavefront multiplies A [32 x 8]
// by B [8 x 32] (row-major, 16-bit storage) onto accumulators that start at lane·16 + r, each lane taking
// its operands by mfma_col / mfma_k; every lane writes its 16 registers.
__global__ void mfma_probe(float* out, const bf16* A, const bf16* B) {
  const int lane = threadIdx.x % kWaveSize;
  bf16 a[4], b[4];
  for (int j = 0; j < 4; ++j) {
    a[j] = A[mfma_col(lane) * kMfmaK + mfma_k(lane) + j];
    b[j] = B[(mfma_k(lane) + j) * kMfmaN + mfma_col(lane)];
  }
  mfma_acc acc;
  for (int r = 0; r < kMfmaAcc; ++r) acc.v[r] = float(lane * kMfmaAcc + r);
  mfma_32x32x8_bf16(acc, a, b);
  for (int r = 0; r < kMfmaAcc; ++r) out[lane * kMfmaAcc + r] = acc.v[r];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string op = parse(argc, argv);
  if (run_shared_op(op, kGeometry)) return 0;
  if (op == "tensor_rows") {
    // tensor_ops.cu's row, column and element-wise kernels on one [rows, cols] f32 matrix x
    // (also read as logits over a vocabulary shard of cols entries starting at vocab_start), in
    // the HIP Device's launch geometry: a wave per row in workgroups of 4 waves, a thread per
    // column in workgroups of 256, grid-stride element loops over at most 3 workgroups of 256.
    const int rows = arg(0), C = arg(1), vocab_start = arg(2);
    const float scale = real(3);
    const size_t n = size_t(rows) * C;
    const dim3 per_row(ceil_div(rows, 4)), per_col(ceil_div(C, 256)), wg(4 * kWaveSize), cols_wg(256);
    const dim3 elems(std::min(ceil_div(int(n), 256), 3));
    auto x = read_f32("x", n), weight = read_f32("weight", C), bias = read_f32("bias", C), dout = read_f32("dout", n);
    auto dinp = read_f32("dinp", n), dweight = read_f32("dweight", C), dbias = read_f32("dbias", C);
    auto targets = read_u32("targets", rows);
    auto mean64 = read<double>("mean64", "f64", rows), rstd64 = read<double>("rstd64", "f64", rows);
    auto sums64 = read<double>("sums64", "f64", 2 * size_t(rows));
    std::vector<float> out(n, -1.0f), mean(rows, -1.0f), rstd(rows, -1.0f);
    emu::launch(per_row, wg, layernorm_fwd_f32, out.data(), mean.data(), rstd.data(), x.data(), weight.data(),
                bias.data(), rows, C);
    std::vector<float> dx = dinp, dw = dweight, db = dbias;
    emu::launch(per_row, wg, layernorm_bwd_dx_f32, dx.data(), dout.data(), x.data(), weight.data(), mean.data(),
                rstd.data(), rows, C);
    emu::launch(per_col, cols_wg, layernorm_bwd_params_f32, dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                rstd.data(), rows, C);
    std::vector<double> sums(rows, -1.0), sqsums(rows, -1.0), bsums(2 * size_t(rows), -1.0);
    emu::launch(per_row, wg, layernorm_sums_f32, sums.data(), x.data(), (const double*)nullptr, rows, C);
    emu::launch(per_row, wg, layernorm_sums_f32, sqsums.data(), x.data(), mean64.data(), rows, C);
    emu::launch(per_row, wg, layernorm_bwd_sums_f32, bsums.data(), dout.data(), x.data(), weight.data(), mean.data(),
                rstd.data(), rows, C);
    std::vector<float> split(n, -1.0f), split_mean(rows, -1.0f), split_rstd(rows, -1.0f);
    emu::launch(elems, cols_wg, layernorm_apply_f32, split.data(), split_mean.data(), split_rstd.data(), x.data(),
                weight.data(), bias.data(), mean64.data(), rstd64.data(), rows, C);
    std::vector<float> split_dx = dinp;
    emu::launch(elems, cols_wg, layernorm_bwd_apply_dx_f32, split_dx.data(), dout.data(), x.data(), weight.data(),
                mean.data(), rstd.data(), sums64.data(), C, rows, C);
    std::vector<double> max(rows, -1.0), sum_exp(rows, -1.0), target_logit(rows, -1.0);
    emu::launch(per_row, wg, xent_max_f32, max.data(), x.data(), rows, C);
    emu::launch(per_row, wg, xent_partials_f32, sum_exp.data(), target_logit.data(), x.data(), targets.data(),
                vocab_start, max.data(), rows, C);
    std::vector<float> dlogits = x;
    emu::launch(elems, cols_wg, xent_bwd_f32, dlogits.data(), targets.data(), vocab_start, max.data(), sum_exp.data(),
                scale, rows, C);
    std::vector<float> colsum = dbias, biased = x;
    ColumnSumScratch scratch(rows, C);
    emu::launch(scratch.grid, cols_wg, column_sum_add_f32, colsum.data(), scratch.partials.data(),
                scratch.counters.data(), dout.data(), rows, C);
    emu::launch(elems, cols_wg, add_bias_f32, biased.data(), bias.data(), rows, C);
    std::vector<double> partials(ceil_div(int(n), 8192), -1.0);
    // A table of one tensor: x, its length and its blocks.
    const unsigned long long tensors[] = {reinterpret_cast<unsigned long long>(x.data())};
    const int lens[] = {int(n)}, first_block[] = {0, int(partials.size())};
    emu::launch(dim3(partials.size()), dim3(256), sum_squares_f32, partials.data(), tensors, lens, first_block, 1);
    write_f32s({{"out", &out}, {"mean", &mean}, {"rstd", &rstd}, {"dx", &dx}, {"dw", &dw}, {"db", &db},
                {"split", &split}, {"split_mean", &split_mean}, {"split_rstd", &split_rstd}, {"split_dx", &split_dx},
                {"dlogits", &dlogits}, {"colsum", &colsum}, {"biased", &biased}});
    write_f64s({{"sums", &sums}, {"sqsums", &sqsums}, {"bsums", &bsums}, {"max", &max}, {"sum_exp", &sum_exp},
                {"target_logit", &target_logit}, {"partials", &partials}});
  } else if (op == "tensor_elems") {
    // The element-wise kernels of tensor_ops.cu on n elements, over `blocks` workgroups of 256.
    const int n = arg(0), blocks = arg(1);
    auto a = read_f32("a", n), b = read_f32("b", n);
    std::vector<float> sum(n, -1.0f), acc = a, rounded = a, g(n, -1.0f), dg(n, -1.0f);
    emu::launch(dim3(blocks), dim3(256), add_f32, sum.data(), a.data(), b.data(), n);
    emu::launch(dim3(blocks), dim3(256), add_assign_f32, acc.data(), b.data(), n);
    emu::launch(dim3(blocks), dim3(256), round_bf16_f32, rounded.data(), n);
    emu::launch(dim3(blocks), dim3(256), gelu_fwd_f32, g.data(), a.data(), n, 0);
    emu::launch(dim3(blocks), dim3(256), gelu_bwd_f32, dg.data(), a.data(), b.data(), n, 0);
    write_f32s({{"sum", &sum}, {"acc", &acc}, {"rounded", &rounded}, {"gelu", &g}, {"dgelu", &dg}});
  } else if (op == "tensor_embedding") {
    // embedding_fwd_f32 + position_fwd_f32 and their backward kernels (positions t0.. of wpe);
    // arguments 6 and 7 are the segments' count and words (read_segments).
    const int batch = arg(0), seq = arg(1), hidden = arg(2), vocab_start = arg(3), vocab_rows = arg(4), t0 = arg(5);
    const size_t n = size_t(batch) * seq * hidden;
    auto tokens = read_u32("tokens", size_t(batch) * seq);
    auto wte = read_f32("wte", size_t(vocab_rows) * hidden);
    auto wpe = read_f32("wpe", size_t(t0 + seq) * hidden), dout = read_f32("dout", n);
    auto dwte = read_f32("dwte", size_t(vocab_rows) * hidden), dwpe = read_f32("dwpe", size_t(t0 + seq) * hidden);
    std::vector<float> out(n, -1.0f);
    const dim3 elems(std::min(ceil_div(int(n), 256), 2));
    emu::launch(elems, dim3(256), embedding_fwd_f32, out.data(), tokens.data(), wte.data(), vocab_start, vocab_rows,
                batch, seq, hidden);
    emu::launch(elems, dim3(256), position_fwd_f32, out.data(), wpe.data(), batch, t0, seq, hidden);
    const Segments segments = read_segments(arg(6), arg(7));
    if (segments.count > 0)
      emu::launch(dim3(segments.count, ceil_div(hidden, 256)), dim3(256), embedding_bwd_f32, dwte.data(), dout.data(),
                  segments.rows(), segments.starts(), segments.positions(), hidden);
    emu::launch(dim3(ceil_div(hidden, 256), seq), dim3(256), position_bwd_f32, dwpe.data(), dout.data(), batch, t0, seq,
                hidden);
    write_f32s({{"out", &out}, {"dwte", &dwte}, {"dwpe", &dwpe}});
  } else if (op == "mfma_probe") {
    auto A = read_bf16("a", 32 * 8), B = read_bf16("b", 8 * 32);
    std::vector<float> out(64 * 16, -1.0f);
    emu::launch(dim3(1), dim3(64), mfma_probe, out.data(), A.data(), B.data());
    write_f32("out", out);
  } else if (op == "wave64_probe") {
    std::vector<int> out(128 * 8, -1);
    emu::launch(dim3(1), dim3(128), wave64_probe, out.data());
    write("out", "i32", out);
  } else {
    return usage();
  }
  return 0;
}
