// harness.cpp: runs one kernel of kernels-hip/ under the SIMT emulation with 64-lane wavefronts
// on inputs that tests/hip_emulation.rs wrote, and writes the outputs back for it to compare with
// trident's reference device. Built by that test with
//   g++ -std=c++20 -O1 -DTRIDENT_EMU -pthread harness.cpp -o harness
// (and once more with -DTRIDENT_PLANT_WAVE32_BUG, the planted wave32 reduction).
// Usage: harness <op> <dir> <arguments of the op (integers, and reals for adamw / xent)>
// Files in <dir> are raw little-endian arrays named <name>.bf16 (u16 bit patterns) or
// <name>.f32; an input file that does not exist is passed to the kernel as a null pointer.
#include <string>

#include <algorithm>

#include "../../adamw.hip"
#include "../../attention_bwd.hip"
#include "../../attention_fwd.hip"
#include "../../casts.hip"
#include "../../embedding.hip"
#include "../../gelu.hip"
#include "../../gemm_bf16.hip"
#include "../../gemm_bf16_bwd.hip"
#include "../../layernorm.hip"
#include "../../softmax_xent.hip"
#include "../../tensor_ops.hip"

namespace {

std::string dir;

template <class T>
std::vector<T> read(const char* name, const char* ext, size_t n, bool* present = nullptr) {
  std::string path = dir + "/" + name + "." + ext;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (present) *present = f != nullptr;
  std::vector<T> v(n);
  if (!f) {
    if (present) return {};
    std::fprintf(stderr, "harness: cannot open %s\n", path.c_str());
    std::exit(2);
  }
  if (std::fread(v.data(), sizeof(T), n, f) != n) {
    std::fprintf(stderr, "harness: %s holds fewer than %zu elements\n", path.c_str(), n);
    std::exit(2);
  }
  std::fclose(f);
  return v;
}
std::vector<bf16> read_bf16(const char* name, size_t n) { return read<bf16>(name, "bf16", n); }
std::vector<bf16> read_bf16(const char* name, size_t n, bool* present) { return read<bf16>(name, "bf16", n, present); }
std::vector<float> read_f32(const char* name, size_t n, bool* present = nullptr) { return read<float>(name, "f32", n, present); }
std::vector<uint32_t> read_u32(const char* name, size_t n) { return read<uint32_t>(name, "u32", n); }

template <class T>
void write(const char* name, const char* ext, const std::vector<T>& v) {
  std::string path = dir + "/" + name + "." + ext;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) {
    std::fprintf(stderr, "harness: cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
}
void write_bf16(const char* name, const std::vector<bf16>& v) { write(name, "bf16", v); }
void write_f32(const char* name, const std::vector<float>& v) { write(name, "f32", v); }
template <class T>
T* or_null(std::vector<T>& v) { return v.empty() ? nullptr : v.data(); }

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
// by B [8 x 32] (row-major, bf16) onto accumulators that start at lane·16 + r, each lane taking
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

int usage() {
  std::fprintf(stderr, "usage: harness <op> <dir> args...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string op = argv[1];
  dir = argv[2];
  auto arg = [&](int i) {
    if (3 + i >= argc) std::exit(usage());
    return std::atoi(argv[3 + i]);
  };
  auto real = [&](int i) {
    if (3 + i >= argc) std::exit(usage());
    return float(std::atof(argv[3 + i]));
  };

  if (op == "gemm_f32out" || op == "gemm_bf16out") {
    const int M = arg(0), N = arg(1), K = arg(2), gelu = arg(3);
    auto A = read_bf16("a", size_t(M) * K);
    auto W = read_bf16("w", size_t(N) * K);
    bool present = false;
    auto bias = read_f32("bias", N, &present);
    const dim3 grid(ceil_div(N, 64), ceil_div(M, 64));
    if (op == "gemm_f32out") {
      auto residual = read_f32("residual", size_t(M) * N, &present);
      std::vector<float> out(size_t(M) * N, -1.0f);
      emu::launch(grid, dim3(256), gemm_fwd_bf16_f32out, out.data(), A.data(), W.data(), or_null(bias),
                  or_null(residual), M, N, K, gelu);
      write_f32("out", out);
    } else {
      auto residual = read_bf16("residual", size_t(M) * N, &present);
      std::vector<bf16> out(size_t(M) * N, to_bf16(-1.0f));
      emu::launch(grid, dim3(256), gemm_fwd_bf16, out.data(), A.data(), W.data(), or_null(bias), or_null(residual), M, N,
                  K, gelu);
      write_bf16("out", out);
    }
  } else if (op == "gemm_bwd") {
    const int M = arg(0), N = arg(1), K = arg(2);
    auto dout = read_bf16("dout", size_t(M) * N), W = read_bf16("w", size_t(N) * K), inp = read_bf16("inp", size_t(M) * K);
    auto dweight = read_f32("dweight", size_t(N) * K);
    std::vector<float> dinp(size_t(M) * K, -1.0f);
    emu::launch(dim3(ceil_div(K, 64), ceil_div(M, 64)), dim3(256), gemm_bwd_input_bf16, dinp.data(), dout.data(),
                W.data(), M, N, K);
    emu::launch(dim3(ceil_div(K, 64), ceil_div(N, 64)), dim3(256), gemm_bwd_weight_bf16, dweight.data(), dout.data(),
                inp.data(), M, N, K);
    write_f32("dinp", dinp);
    write_f32("dweight", dweight);
  } else if (op == "casts") {
    // Both directions on n elements that start `offset` elements into their buffers (an offset
    // that is not a multiple of 4 takes the one-at-a-time path).
    const int n = arg(0), offset = arg(1);
    auto x = read_f32("x", n);
    auto h = read_bf16("h", n);
    std::vector<float> xs(size_t(n) + offset), back(size_t(n) + offset, -1.0f);
    std::vector<bf16> hs(size_t(n) + offset), rounded(size_t(n) + offset, to_bf16(-1.0f));
    std::copy(x.begin(), x.end(), xs.begin() + offset);
    std::copy(h.begin(), h.end(), hs.begin() + offset);
    const dim3 grid(std::min(ceil_div(ceil_div(n, 8), 256), 3));
    emu::launch(grid, dim3(256), cast_f32_to_bf16, rounded.data() + offset, xs.data() + offset, n);
    emu::launch(grid, dim3(256), cast_bf16_to_f32, back.data() + offset, hs.data() + offset, n);
    write_bf16("rounded", std::vector<bf16>(rounded.begin() + offset, rounded.end()));
    write_f32("back", std::vector<float>(back.begin() + offset, back.end()));
  } else if (op == "layernorm_fwd") {
    const int rows = arg(0), C = arg(1);
    auto inp = read_bf16("inp", size_t(rows) * C);
    bool has_residual = false;
    auto residual = read_bf16("residual", size_t(rows) * C, &has_residual);
    auto weight = read_f32("weight", C), bias = read_f32("bias", C);
    std::vector<bf16> out(size_t(rows) * C), resid_out(has_residual ? size_t(rows) * C : 0);
    std::vector<float> mean(rows), rstd(rows);
    emu::launch(dim3(ceil_div(rows, 4)), dim3(256), layernorm_fwd_bf16, out.data(), mean.data(), rstd.data(),
                or_null(resid_out), inp.data(), or_null(residual), weight.data(), bias.data(), rows, C);
    write_bf16("out", out);
    write_f32("mean", mean);
    write_f32("rstd", rstd);
    if (has_residual) write_bf16("resid_out", resid_out);
  } else if (op == "layernorm_bwd") {
    const int rows = arg(0), C = arg(1);
    auto dout = read_bf16("dout", size_t(rows) * C), inp = read_bf16("inp", size_t(rows) * C);
    auto weight = read_f32("weight", C), mean = read_f32("mean", rows), rstd = read_f32("rstd", rows);
    auto dinp = read_f32("dinp", size_t(rows) * C);
    auto dweight = read_f32("dweight", C), dbias = read_f32("dbias", C);
    emu::launch(dim3(ceil_div(rows, 4)), dim3(256), layernorm_bwd_dx_bf16, dinp.data(), dout.data(), inp.data(),
                weight.data(), mean.data(), rstd.data(), rows, C);
    emu::launch(dim3(ceil_div(C, 256)), dim3(256), layernorm_bwd_dparams_bf16, dweight.data(), dbias.data(), dout.data(),
                inp.data(), mean.data(), rstd.data(), rows, C);
    write_f32("dinp", dinp);
    write_f32("dweight", dweight);
    write_f32("dbias", dbias);
  } else if (op == "gelu_fwd" || op == "gelu_bwd") {
    const int n = arg(0), blocks = arg(1), threads = arg(2);
    auto inp = read_bf16("inp", n);
    std::vector<bf16> out(n);
    if (op == "gelu_fwd") {
      emu::launch(dim3(blocks), dim3(threads), gelu_fwd_bf16, out.data(), inp.data(), n);
    } else {
      auto dout = read_bf16("dout", n);
      emu::launch(dim3(blocks), dim3(threads), gelu_bwd_bf16, out.data(), inp.data(), dout.data(), n);
    }
    write_bf16("out", out);
  } else if (op == "adamw") {
    const int n = arg(0), blocks = arg(1), threads = arg(2);
    auto param = read_f32("param", n), grad = read_f32("grad", n), m = read_f32("m", n), v = read_f32("v", n);
    std::vector<bf16> param_bf16(n);
    emu::launch(dim3(blocks), dim3(threads), adamw_f32_bf16, param.data(), param_bf16.data(), grad.data(), m.data(),
                v.data(), n, real(3), real(4), real(5), real(6), real(7), real(8), real(9), real(10));
    write_f32("param", param);
    write_bf16("param_bf16", param_bf16);
    write_f32("m", m);
    write_f32("v", v);
  } else if (op == "xent") {
    const int rows = arg(0), V = arg(1), vocab_start = arg(2);
    const float scale = real(3);
    auto logits = read_bf16("logits", size_t(rows) * V);
    auto targets = read_u32("targets", rows);
    std::vector<float> max(rows), sum_exp(rows), target_logit(rows);
    emu::launch(dim3(rows), dim3(256), xent_max_bf16, max.data(), logits.data(), rows, V);
    emu::launch(dim3(rows), dim3(256), xent_partials_bf16, sum_exp.data(), target_logit.data(), logits.data(),
                targets.data(), vocab_start, max.data(), rows, V);
    // In place, as the model runs it: the logits buffer becomes the gradient.
    emu::launch(dim3(rows), dim3(256), xent_bwd_bf16, logits.data(), logits.data(), targets.data(), vocab_start,
                max.data(), sum_exp.data(), scale, rows, V);
    write_f32("max", max);
    write_f32("sum_exp", sum_exp);
    write_f32("target_logit", target_logit);
    write_bf16("dlogits", logits);
  } else if (op == "embedding") {
    const int batch = arg(0), seq = arg(1), hidden = arg(2), vocab_start = arg(3), vocab_rows = arg(4);
    const size_t rows = size_t(batch) * seq;
    auto tokens = read_u32("tokens", rows);
    auto wte = read_bf16("wte", size_t(vocab_rows) * hidden);
    bool has_wpe = false;
    auto wpe = read_f32("wpe", size_t(seq) * hidden, &has_wpe);
    auto dout = read_bf16("dout", rows * hidden);
    auto dwte = read_f32("dwte", size_t(vocab_rows) * hidden), dwpe = read_f32("dwpe", size_t(seq) * hidden);
    std::vector<bf16> out(rows * hidden);
    emu::launch(dim3(ceil_div(hidden, 128), unsigned(rows)), dim3(128), embedding_fwd_bf16, out.data(), tokens.data(),
                wte.data(), or_null(wpe), vocab_start, vocab_rows, batch, seq, hidden);
    emu::launch(dim3(ceil_div(hidden, 128)), dim3(128), embedding_bwd_wte_bf16, dwte.data(), dout.data(), tokens.data(),
                vocab_start, vocab_rows, batch, seq, hidden);
    emu::launch(dim3(ceil_div(hidden, 128), seq), dim3(128), embedding_bwd_wpe_bf16, dwpe.data(), dout.data(), batch,
                seq, hidden);
    write_bf16("out", out);
    write_f32("dwte", dwte);
    write_f32("dwpe", dwpe);
  } else if (op == "attention_fwd") {
    // qkv starts `offset` elements into its buffer (an odd offset takes the scalar-load path).
    const int batch = arg(0), seq = arg(1), heads = arg(2), d = arg(3), offset = arg(4);
    const size_t rows = size_t(batch) * seq;
    auto qkv_file = read_bf16("qkv", rows * 3 * heads * d);
    std::vector<bf16> qkv_buffer(qkv_file.size() + offset);
    std::copy(qkv_file.begin(), qkv_file.end(), qkv_buffer.begin() + offset);
    const bf16* qkv_data = qkv_buffer.data() + offset;
    std::vector<bf16> out(rows * heads * d, to_bf16(-7.0f));
    std::vector<float> lse(rows * heads, -7.0f);
    const dim3 grid(ceil_div(seq, 64), batch * heads);
    if (d == 64) {
      emu::launch(grid, dim3(128), attention_fwd_bf16_d64, out.data(), lse.data(), qkv_data, batch, seq, heads);
    } else if (d == 128) {
      emu::launch(grid, dim3(128), attention_fwd_bf16_d128, out.data(), lse.data(), qkv_data, batch, seq, heads);
    } else {
      return usage();
    }
    write_bf16("out", out);
    write_f32("lse", lse);
  } else if (op == "attention_bwd") {
    const int batch = arg(0), seq = arg(1), heads = arg(2), d = arg(3);
    const size_t rows = size_t(batch) * seq;
    auto qkv = read_bf16("qkv", rows * 3 * heads * d);
    auto out = read_bf16("out", rows * heads * d), dout = read_bf16("dout", rows * heads * d);
    auto lse = read_f32("lse", rows * heads);
    std::vector<float> delta(rows * heads, -7.0f);
    std::vector<bf16> dqkv(rows * 3 * heads * d, to_bf16(-7.0f));  // every element must be written
    emu::launch(dim3(ceil_div(int(rows) * heads, 4)), dim3(256), attention_bwd_delta_bf16, delta.data(), dout.data(),
                out.data(), batch, seq, heads, d);
    const dim3 grid(ceil_div(seq, 64), batch * heads);
    if (d == 64) {
      emu::launch(grid, dim3(128), attention_bwd_dkv_bf16_d64, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                  delta.data(), batch, seq, heads);
      emu::launch(grid, dim3(128), attention_bwd_dq_bf16_d64, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                  delta.data(), batch, seq, heads);
    } else if (d == 128) {
      emu::launch(grid, dim3(128), attention_bwd_dkv_bf16_d128, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                  delta.data(), batch, seq, heads);
      emu::launch(grid, dim3(128), attention_bwd_dq_bf16_d128, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                  delta.data(), batch, seq, heads);
    } else {
      return usage();
    }
    write_bf16("dqkv", dqkv);
  } else if (op == "tensor_rows") {
    // tensor_ops.hip's row, column and element-wise kernels on one [rows, cols] f32 matrix x
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
    emu::launch(per_col, cols_wg, column_sum_add_f32, colsum.data(), dout.data(), rows, C);
    emu::launch(elems, cols_wg, add_bias_f32, biased.data(), bias.data(), rows, C);
    std::vector<double> partials(ceil_div(int(n), 8192), -1.0);
    emu::launch(dim3(partials.size()), dim3(256), sum_squares_f32, partials.data(), x.data(), int(n));
    write_f32("out", out);
    write_f32("mean", mean);
    write_f32("rstd", rstd);
    write_f32("dx", dx);
    write_f32("dw", dw);
    write_f32("db", db);
    write("sums", "f64", sums);
    write("sqsums", "f64", sqsums);
    write("bsums", "f64", bsums);
    write_f32("split", split);
    write_f32("split_mean", split_mean);
    write_f32("split_rstd", split_rstd);
    write_f32("split_dx", split_dx);
    write("max", "f64", max);
    write("sum_exp", "f64", sum_exp);
    write("target_logit", "f64", target_logit);
    write_f32("dlogits", dlogits);
    write_f32("colsum", colsum);
    write_f32("biased", biased);
    write("partials", "f64", partials);
  } else if (op == "tensor_elems") {
    // The element-wise kernels of tensor_ops.hip on n elements, over `blocks` workgroups of 256.
    const int n = arg(0), blocks = arg(1);
    auto a = read_f32("a", n), b = read_f32("b", n);
    std::vector<float> sum(n, -1.0f), acc = a, rounded = a, g(n, -1.0f), dg(n, -1.0f);
    emu::launch(dim3(blocks), dim3(256), add_f32, sum.data(), a.data(), b.data(), n);
    emu::launch(dim3(blocks), dim3(256), add_assign_f32, acc.data(), b.data(), n);
    emu::launch(dim3(blocks), dim3(256), round_bf16_f32, rounded.data(), n);
    emu::launch(dim3(blocks), dim3(256), gelu_fwd_f32, g.data(), a.data(), n);
    emu::launch(dim3(blocks), dim3(256), gelu_bwd_f32, dg.data(), a.data(), b.data(), n);
    write_f32("sum", sum);
    write_f32("acc", acc);
    write_f32("rounded", rounded);
    write_f32("gelu", g);
    write_f32("dgelu", dg);
  } else if (op == "tensor_embedding") {
    // embedding_fwd_f32 + position_fwd_f32 and their backward kernels (positions t0.. of wpe).
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
    emu::launch(dim3(ceil_div(hidden, 256)), dim3(256), embedding_bwd_f32, dwte.data(), dout.data(), tokens.data(),
                vocab_start, vocab_rows, batch, seq, hidden);
    emu::launch(dim3(ceil_div(hidden, 256), seq), dim3(256), position_bwd_f32, dwpe.data(), dout.data(), batch, t0, seq,
                hidden);
    write_f32("out", out);
    write_f32("dwte", dwte);
    write_f32("dwpe", dwpe);
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
