// harness.h: what the two emulation harnesses (this folder's harness.cpp for kernels-cuda/ and
// kernels-hip/emu/tests/harness.cpp) share, included after the kernel sources: the case directory
// of raw arrays the Rust test wrote, the op's command-line arguments, and the ops whose kernels
// both vendors write under the same names and arguments (the GEMMs, the bias gradient's column
// sums, casts, LayerNorm, GELU, AdamW, the cross-entropy pieces, the step's scalars, the embedding
// and FlashAttention, and the Llama family's RMSNorm, SwiGLU and rotary embedding), run in the
// launch geometry of the vendor that includes it.
// Files in the directory are raw little-endian arrays named <name>.bf16 (u16 bit patterns),
// <name>.f32, <name>.u32, <name>.f64 or <name>.i32; an input file that does not exist is passed to
// the kernel as a null pointer where the kernel takes one.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace harness {

// The case directory and the op's arguments (after `harness <op> <dir>`).
inline std::string dir;
inline std::vector<std::string> op_args;

inline int usage() {
  std::fprintf(stderr, "usage: harness <op> <dir> args...\n");
  return 2;
}

// Integer argument i of the op, or a usage error.
inline int arg(size_t i) {
  if (i >= op_args.size()) std::exit(usage());
  return std::atoi(op_args[i].c_str());
}
// Integer argument i when the test gave it, else `fallback`.
inline int arg_or(size_t i, int fallback) { return i < op_args.size() ? arg(i) : fallback; }
// Real argument i of the op, or a usage error.
inline float real(size_t i) {
  if (i >= op_args.size()) std::exit(usage());
  return float(std::atof(op_args[i].c_str()));
}

// n elements of <dir>/<name>.<ext>. A missing file is an error, unless `present` is given: then
// it is set and an empty vector returned.
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
inline std::vector<bf16> read_bf16(const char* name, size_t n, bool* present = nullptr) {
  return read<bf16>(name, "bf16", n, present);
}
inline std::vector<float> read_f32(const char* name, size_t n, bool* present = nullptr) {
  return read<float>(name, "f32", n, present);
}
inline std::vector<uint32_t> read_u32(const char* name, size_t n) { return read<uint32_t>(name, "u32", n); }

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
inline void write_bf16(const char* name, const std::vector<bf16>& v) { write(name, "bf16", v); }
inline void write_f32(const char* name, const std::vector<float>& v) { write(name, "f32", v); }
// Several outputs at once: (name, array) pairs.
inline void write_f32s(std::initializer_list<std::pair<const char*, const std::vector<float>*>> outputs) {
  for (const auto& [name, v] : outputs) write_f32(name, *v);
}
inline void write_f64s(std::initializer_list<std::pair<const char*, const std::vector<double>*>> outputs) {
  for (const auto& [name, v] : outputs) write(name, "f64", *v);
}

template <class T>
T* or_null(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

// Reads `harness <op> <dir> args...`; returns the op (a usage error without one).
inline std::string parse(int argc, char** argv) {
  if (argc < 3) std::exit(usage());
  dir = argv[2];
  op_args.assign(argv + 3, argv + argc);
  return argv[1];
}

// The launch geometry in which the vendors' kernels of one name differ: a CUDA block of 4 warps
// has 128 threads, a HIP workgroup of 4 wavefronts 256; the GEMMs' tiles and shared memory.
struct Geometry {
  unsigned gemm_threads;     // a GEMM block's threads
  unsigned row_threads;      // 4 rows per block, a warp or wavefront each (LayerNorm, attention's delta)
  unsigned gemm_tile = 64;   // a GEMM block's output tile is gemm_tile x gemm_tile
  // Dynamic shared memory of the forward, backward-input and backward-weight GEMMs.
  unsigned gemm_shared[3] = {0, 0, 0};
  // Dynamic shared memory of attention's forward, dK/dV and dQ kernels, for head dims 32, 64 and
  // 128 (attention_dims's order).
  unsigned attention_shared[3][3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  // Queries per block of the attention forward and of dQ, for head dims 32, 64 and 128 (the
  // grid's tile; dK/dV's blocks own 64 keys).
  int attention_queries[3] = {64, 64, 64};
  // Dynamic shared memory of the per-document (_docs_) forward, dK/dV and dQ kernels (their
  // queries' document starts added), as attention_shared.
  unsigned attention_docs_shared[3][3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
};

// out = A · Wᵀ with the fused epilogue (bias, GELU, residual) by `kernel`, whose output and
// residual are `Out` (float or bf16).
template <class Out>
void gemm_forward(void (*kernel)(Out*, const bf16*, const bf16*, const float*, const Out*, int, int, int, int),
                  unsigned threads, unsigned tile = 64, unsigned shared = 0) {
  constexpr bool f32 = std::is_same_v<Out, float>;
  const int M = arg(0), N = arg(1), K = arg(2), gelu = arg(3);
  auto A = read_bf16("a", size_t(M) * K);
  auto W = read_bf16("w", size_t(N) * K);
  bool present = false;
  auto bias = read_f32("bias", N, &present);
  auto residual = read<Out>("residual", f32 ? "f32" : "bf16", size_t(M) * N, &present);
  Out unwritten;
  if constexpr (f32) unwritten = -1.0f; else unwritten = to_bf16(-1.0f);
  std::vector<Out> out(size_t(M) * N, unwritten);
  emu::launch_dynamic(shared, dim3(ceil_div(N, int(tile)), ceil_div(M, int(tile))), dim3(threads), kernel, out.data(),
                      A.data(), W.data(), or_null(bias), or_null(residual), M, N, K, gelu);
  write("out", f32 ? "f32" : "bf16", out);
}

inline void gemm_backward(const Geometry& g) {
  const int M = arg(0), N = arg(1), K = arg(2);
  auto dout = read_bf16("dout", size_t(M) * N), W = read_bf16("w", size_t(N) * K);
  auto inp = read_bf16("inp", size_t(M) * K);
  auto dweight = read_f32("dweight", size_t(N) * K);
  std::vector<float> dinp(size_t(M) * K, -1.0f);
  const int tile = int(g.gemm_tile);
  emu::launch_dynamic(g.gemm_shared[1], dim3(ceil_div(K, tile), ceil_div(M, tile)), dim3(g.gemm_threads),
                      gemm_bwd_input_bf16, dinp.data(), dout.data(), W.data(), M, N, K);
  emu::launch_dynamic(g.gemm_shared[2], dim3(ceil_div(K, tile), ceil_div(N, tile)), dim3(g.gemm_threads),
                      gemm_bwd_weight_bf16, dweight.data(), dout.data(), inp.data(), M, N, K);
  write_f32("dinp", dinp);
  write_f32("dweight", dweight);
}

// dinp = dout · W with a bf16 output (gemm_bwd_input_bf16_bf16out), every element preset to -1.
inline void gemm_backward_bf16_out(const Geometry& g) {
  const int M = arg(0), N = arg(1), K = arg(2);
  auto dout = read_bf16("dout", size_t(M) * N), W = read_bf16("w", size_t(N) * K);
  std::vector<bf16> dinp(size_t(M) * K, to_bf16(-1.0f));
  const int tile = int(g.gemm_tile);
  emu::launch_dynamic(g.gemm_shared[1], dim3(ceil_div(K, tile), ceil_div(M, tile)), dim3(g.gemm_threads),
                      gemm_bwd_input_bf16_bf16out, dinp.data(), dout.data(), W.data(), M, N, K);
  write_bf16("dinp", dinp);
}

// The grid and scratch of column_sum_add_* on [rows, cols] (src/gpu/kernels/plan/mod.rs
// column_sum_grid, the same for both vendors): ⌈cols/64⌉ strips by ⌈rows/256⌉ chunks (at least
// one) of 256 threads, the strip counters zeroed and the partials NaN, so that a partial read
// before it is written shows.
struct ColumnSumScratch {
  dim3 grid;
  std::vector<float> partials;
  std::vector<unsigned> counters;
  ColumnSumScratch(int rows, int cols)
      : grid(ceil_div(cols, 64), std::max(1, ceil_div(rows, 256))),
        partials(size_t(grid.y) * cols, NAN),
        counters(grid.x, 0u) {}
};

// column_sum_add_bf16: dbias [cols] += Σ_rows dout [rows, cols] (bf16), launched twice on the
// same scratch ("dbias" after the first launch, "dbias_again" after the second: the counters
// must be back at 0); column_sum_add_f32 once on the same values widened to f32 ("dbias_f32");
// the counters after all three ("counters").
inline void column_sum() {
  const int rows = arg(0), cols = arg(1);
  auto dout = read_bf16("dout", size_t(rows) * cols);
  auto dbias = read_f32("dbias", cols);
  std::vector<float> wide(dout.size()), narrow = dbias, widened = dbias;
  for (size_t i = 0; i < dout.size(); ++i) wide[i] = to_float(dout[i]);
  ColumnSumScratch s(rows, cols);
  const auto launch_bf16 = [&] {
    emu::launch(s.grid, dim3(256), column_sum_add_bf16, narrow.data(), s.partials.data(), s.counters.data(),
                dout.data(), rows, cols);
  };
  launch_bf16();
  write_f32("dbias", narrow);
  launch_bf16();
  write_f32("dbias_again", narrow);
  emu::launch(s.grid, dim3(256), column_sum_add_f32, widened.data(), s.partials.data(), s.counters.data(),
              wide.data(), rows, cols);
  write_f32("dbias_f32", widened);
  write("counters", "u32", s.counters);
}

// The word-embedding gradient's segments (src/gpu/kernels/plan/mod.rs EmbeddingSegments, the
// Device's upload) from <dir>/segments.u32: `count` segments in `words` u32s.
struct Segments {
  int count;
  std::vector<uint32_t> words;
  const int* rows() const { return reinterpret_cast<const int*>(words.data()); }
  const int* starts() const { return rows() + count; }
  const int* positions() const { return rows() + 2 * count + 1; }
};
inline Segments read_segments(int count, int words) { return Segments{count, read_u32("segments", words)}; }

// position_fwd_bf16 on `blocks` blocks of 256 (grid-stride): out [positions·batch, hidden] bf16
// += wpe[t0 + p] (wpe [t0 + positions, hidden] f32).
inline void position() {
  const int batch = arg(0), t0 = arg(1), positions = arg(2), hidden = arg(3), blocks = arg(4);
  auto out = read_bf16("out", size_t(positions) * batch * hidden);
  auto wpe = read_f32("wpe", size_t(t0 + positions) * hidden);
  emu::launch(dim3(blocks), dim3(256), position_fwd_bf16, out.data(), wpe.data(), batch, t0, positions, hidden);
  write_bf16("out", out);
}

// Both directions on n elements that start `offset` elements into their buffers (an offset
// that is not a multiple of 4 takes the one-at-a-time path).
inline void casts() {
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
}

inline void layernorm_forward(const Geometry& g) {
  const int rows = arg(0), C = arg(1);
  auto inp = read_bf16("inp", size_t(rows) * C);
  bool has_residual = false;
  auto residual = read_bf16("residual", size_t(rows) * C, &has_residual);
  auto weight = read_f32("weight", C), bias = read_f32("bias", C);
  std::vector<bf16> out(size_t(rows) * C), resid_out(has_residual ? size_t(rows) * C : 0);
  std::vector<float> mean(rows), rstd(rows);
  emu::launch(dim3(ceil_div(rows, 4)), dim3(g.row_threads), layernorm_fwd_bf16, out.data(), mean.data(), rstd.data(),
              or_null(resid_out), inp.data(), or_null(residual), weight.data(), bias.data(), rows, C);
  write_bf16("out", out);
  write_f32("mean", mean);
  write_f32("rstd", rstd);
  if (has_residual) write_bf16("resid_out", resid_out);
}

// layernorm_bwd_bf16 on `blocks` blocks (argument 2; the Device launches plan/mod.rs's
// layernorm_bwd_blocks), twice from the same inputs with the same partials and counters: the
// outputs of both runs and the counters after each (every one must be back at 0). The partials
// and counters are sized as layernorm.cu's header says: [blocks + groups][2][C] f32 and
// groups + 1 u32, groups = ⌈blocks / 16⌉.
inline void layernorm_backward(const Geometry& g) {
  const int rows = arg(0), C = arg(1), blocks = arg(2);
  auto dout = read_bf16("dout", size_t(rows) * C), inp = read_bf16("inp", size_t(rows) * C);
  auto weight = read_f32("weight", C), mean = read_f32("mean", rows), rstd = read_f32("rstd", rows);
  const auto dinp0 = read_bf16("dinp", size_t(rows) * C);
  const auto dweight0 = read_f32("dweight", C), dbias0 = read_f32("dbias", C);
  // Garbage in the partials: every element the kernel reads it must write first.
  const int groups = ceil_div(blocks, 16);
  std::vector<float> partials((size_t(blocks) + groups) * 2 * C, -7.0f);
  std::vector<unsigned> counter(groups + 1, 0);
  for (const char* run : {"", "2"}) {
    auto dinp = dinp0;
    auto dweight = dweight0, dbias = dbias0;
    emu::launch(dim3(blocks), dim3(g.row_threads), layernorm_bwd_bf16, dinp.data(), dweight.data(), dbias.data(),
                partials.data(), counter.data(), dout.data(), inp.data(), weight.data(), mean.data(), rstd.data(), rows,
                C);
    const std::string suffix = run;
    write_bf16(("dinp" + suffix).c_str(), dinp);
    write_f32(("dweight" + suffix).c_str(), dweight);
    write_f32(("dbias" + suffix).c_str(), dbias);
    write(("counter" + suffix).c_str(), "u32", counter);
  }
}

// rmsnorm_fwd_bf16 (eps, argument 3) on ⌈rows/4⌉ blocks of 4 warps or wavefronts ("out", "rstd"),
// then rmsnorm_bwd_bf16 on the forward's rstd and `blocks` blocks (argument 2) twice from the same
// inputs with the same partials and counters, as layernorm_backward runs LayerNorm's: each run's
// dinp ("+=" on "dinp") and dweight ("+=" on "dweight"), and the counters after each. Partials
// [blocks + groups][C] f32 start as garbage, counters groups + 1 u32 at 0.
inline void rmsnorm(const Geometry& g) {
  const int rows = arg(0), C = arg(1), blocks = arg(2);
  const float eps = real(3);
  auto inp = read_bf16("inp", size_t(rows) * C), dout = read_bf16("dout", size_t(rows) * C);
  auto weight = read_f32("weight", C);
  const auto dinp0 = read_bf16("dinp", size_t(rows) * C);
  const auto dweight0 = read_f32("dweight", C);
  std::vector<bf16> out(size_t(rows) * C, to_bf16(-7.0f));
  std::vector<float> rstd(rows, -7.0f);
  emu::launch(dim3(ceil_div(rows, 4)), dim3(g.row_threads), rmsnorm_fwd_bf16, out.data(), rstd.data(), inp.data(),
              weight.data(), rows, C, eps);
  write_bf16("out", out);
  write_f32("rstd", rstd);
  const int groups = ceil_div(blocks, 16);
  std::vector<float> partials((size_t(blocks) + groups) * C, -7.0f);
  std::vector<unsigned> counter(groups + 1, 0);
  for (const char* run : {"", "2"}) {
    auto dinp = dinp0;
    auto dweight = dweight0;
    emu::launch(dim3(blocks), dim3(g.row_threads), rmsnorm_bwd_bf16, dinp.data(), dweight.data(), partials.data(),
                counter.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows, C);
    const std::string suffix = run;
    write_bf16(("dinp" + suffix).c_str(), dinp);
    write_f32(("dweight" + suffix).c_str(), dweight);
    write(("counter" + suffix).c_str(), "u32", counter);
  }
}

// swiglu_fwd_bf16 ("out" [rows, f]) / swiglu_bwd_bf16 ("out" [rows, 2f], preset to garbage: every
// element must be written) on `blocks` x `threads` (arguments 2, 3), the buffers placed `offset`
// elements (argument 4) into theirs: an odd offset takes the kernels off their 16-byte path.
inline void swiglu(const std::string& op) {
  const int rows = arg(0), f = arg(1), blocks = arg(2), threads = arg(3), offset = arg(4);
  const size_t n = size_t(rows) * f;
  auto at = [&](std::vector<bf16> v) {
    v.insert(v.begin(), size_t(offset), to_bf16(0.0f));
    return v;
  };
  auto inp = at(read_bf16("inp", 2 * n));
  const bool forward = op == "swiglu_fwd";
  std::vector<bf16> out((forward ? n : 2 * n) + offset, to_bf16(-7.0f));
  if (forward) {
    emu::launch(dim3(blocks), dim3(threads), swiglu_fwd_bf16, out.data() + offset, inp.data() + offset, rows, f);
  } else {
    auto dout = at(read_bf16("dout", n));
    emu::launch(dim3(blocks), dim3(threads), swiglu_bwd_bf16, out.data() + offset, inp.data() + offset,
                dout.data() + offset, rows, f);
  }
  write_bf16("out", std::vector<bf16>(out.begin() + offset, out.end()));
}

// rope_fwd_bf16 in place on "qkv" [batch·seq, (heads + 2·kv_heads)·d] from position t0 with the
// f32 "table" [t0 + seq, rd] ("fwd"), then rope_bwd_bf16 on that result ("bwd"), each on
// `blocks` x `threads` (arguments 7, 8).
inline void rope() {
  const int batch = arg(0), seq = arg(1), heads = arg(2), kv_heads = arg(3), d = arg(4), rd = arg(5), t0 = arg(6);
  const int blocks = arg(7), threads = arg(8), rows = batch * seq;
  auto qkv = read_bf16("qkv", size_t(rows) * (heads + 2 * kv_heads) * d);
  auto table = read_f32("table", size_t(t0 + seq) * rd);
  emu::launch(dim3(blocks), dim3(threads), rope_fwd_bf16, qkv.data(), table.data(), rows, batch, heads, kv_heads, d,
              rd, t0);
  write_bf16("fwd", qkv);
  emu::launch(dim3(blocks), dim3(threads), rope_bwd_bf16, qkv.data(), table.data(), rows, batch, heads, kv_heads, d,
              rd, t0);
  write_bf16("bwd", qkv);
}

// gelu_fwd_bf16 / gelu_bwd_bf16 on `blocks` x `threads` (arguments 1, 2) over n elements placed
// `offset` elements (argument 3, default 0) into their buffers: an odd offset takes the kernels
// off their 16-byte path. Argument 4 (default 0) is the kernels' erf: 1 the exact GELU.
inline void gelu(const std::string& op) {
  const int n = arg(0), blocks = arg(1), threads = arg(2), offset = arg_or(3, 0), erf = arg_or(4, 0);
  auto at = [&](std::vector<bf16> v) {
    v.insert(v.begin(), size_t(offset), to_bf16(0.0f));
    return v;
  };
  auto inp = at(read_bf16("inp", n));
  std::vector<bf16> out(size_t(n) + offset);
  if (op == "gelu_fwd") {
    emu::launch(dim3(blocks), dim3(threads), gelu_fwd_bf16, out.data() + offset, inp.data() + offset, n, erf);
  } else {
    auto dout = at(read_bf16("dout", n));
    emu::launch(dim3(blocks), dim3(threads), gelu_bwd_bf16, out.data() + offset, inp.data() + offset,
                dout.data() + offset, n, erf);
  }
  write_bf16("out", std::vector<bf16>(out.begin() + offset, out.end()));
}

inline void adamw() {
  const int n = arg(0), blocks = arg(1), threads = arg(2);
  auto param = read_f32("param", n), grad = read_f32("grad", n), m = read_f32("m", n), v = read_f32("v", n);
  std::vector<bf16> param_bf16(n);
  std::vector<float> param_rounded(n);
  // The gradient factor is read from device memory (an f64 slot of the step's scalars).
  const double grad_scale = real(8);
  emu::launch(dim3(blocks), dim3(threads), adamw_f32_bf16, param.data(), param_bf16.data(), grad.data(), m.data(),
              v.data(), n, real(3), real(4), real(5), real(6), real(7), &grad_scale, real(9), real(10),
              param_rounded.data());
  write_f32("param", param);
  write_bf16("param_bf16", param_bf16);
  write_f32("param_rounded", param_rounded);
  write_f32("m", m);
  write_f32("v", v);
}

inline void cross_entropy() {
  const int rows = arg(0), V = arg(1), vocab_start = arg(2);
  const float scale = real(3);
  auto logits = read_bf16("logits", size_t(rows) * V);
  auto targets = read_u32("targets", rows);
  std::vector<double> max(rows, -7.0), sum_exp(rows, -7.0), target_logit(rows, -7.0);
  emu::launch(dim3(rows), dim3(256), xent_max_bf16, max.data(), logits.data(), rows, V);
  emu::launch(dim3(rows), dim3(256), xent_partials_bf16, sum_exp.data(), target_logit.data(), logits.data(),
              targets.data(), vocab_start, max.data(), rows, V);
  // In place, as the model runs it: the logits buffer becomes the gradient.
  emu::launch(dim3(rows), dim3(256), xent_bwd_bf16, logits.data(), targets.data(), vocab_start, max.data(),
              sum_exp.data(), scale, rows, V);
  write_f64s({{"max", &max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}});
  write_bf16("dlogits", logits);
}

// The step's scalars, as the Device launches them (one block of 1024): xent_loss_f64 adds the
// loss of `rows` rows (max [rows], stats [sum_exp rows, target logit rows], targets [rows] u32,
// kIgnoredTarget rows left out) into loss[1] of 2;
// sum_into_f64 adds the `tensors` tensors' parts (first_block [tensors + 1], u32) into norm[0].
inline void step_scalars() {
  const int rows = arg(0), tensors = arg(1);
  auto max = read<double>("max", "f64", rows), stats = read<double>("stats", "f64", 2 * size_t(rows));
  auto loss = read<double>("loss", "f64", 2), norm = read<double>("norm", "f64", 1);
  auto first_block = read<int>("first_block", "u32", size_t(tensors) + 1);
  auto parts = read<double>("parts", "f64", size_t(first_block[tensors]));
  auto targets = read_u32("targets", rows);
  emu::launch(dim3(1), dim3(1024), xent_loss_f64, loss.data(), 1, max.data(), stats.data(), targets.data(), rows);
  emu::launch(dim3(1), dim3(1024), sum_into_f64, norm.data(), 0, parts.data(), first_block.data(), tensors);
  write_f64s({{"loss", &loss}, {"norm", &norm}});
}

// Arguments 5 and 6 are the segments' count and words (read_segments).
inline void embedding() {
  const int batch = arg(0), seq = arg(1), hidden = arg(2), vocab_start = arg(3), vocab_rows = arg(4);
  const Segments segments = read_segments(arg(5), arg(6));
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
  if (segments.count > 0)
    emu::launch(dim3(segments.count, ceil_div(hidden, 128)), dim3(128), embedding_bwd_wte_bf16, dwte.data(),
                dout.data(), segments.rows(), segments.starts(), segments.positions(), hidden);
  emu::launch(dim3(ceil_div(hidden, 128), seq), dim3(128), embedding_bwd_wpe_bf16, dwpe.data(), dout.data(), batch, seq,
              hidden);
  write_bf16("out", out);
  write_f32("dwte", dwte);
  write_f32("dwpe", dwpe);
}

// The row of Geometry::attention_shared for head dim d; exits with the usage for any other.
inline int attention_dims(int d) {
  if (d != 32 && d != 64 && d != 128) std::exit(usage());
  return d == 32 ? 0 : d == 64 ? 1 : 2;
}

// The attention kernels' document starts (kernels/common/documents.h): the optional file
// `starts` (batch·seq u32), else null (one document per sequence).
struct Starts {
  std::vector<uint32_t> values;
  bool present = false;
  explicit Starts(size_t rows) { values = read<uint32_t>("starts", "u32", rows, &present); }
  const int* pointer() const { return present ? reinterpret_cast<const int*>(values.data()) : nullptr; }
};

// Arguments batch, seq, heads, kv_heads, d: the qkv rows hold (heads + 2 kv_heads)·d, Megatron's
// per-group layout. qkv starts `offset` elements into its buffer (argument 5, 0 when not given; an
// odd offset takes the scalar-load path of the kernels that have one). With a `starts` file,
// per-document attention.
inline void attention_forward(const Geometry& g) {
  const int batch = arg(0), seq = arg(1), heads = arg(2), kv_heads = arg(3), d = arg(4), offset = arg_or(5, 0);
  const size_t rows = size_t(batch) * seq;
  const Starts starts(rows);
  auto qkv_file = read_bf16("qkv", rows * (heads + 2 * kv_heads) * d);
  std::vector<bf16> qkv_buffer(qkv_file.size() + offset);
  std::copy(qkv_file.begin(), qkv_file.end(), qkv_buffer.begin() + offset);
  const bf16* qkv = qkv_buffer.data() + offset;
  std::vector<bf16> out(rows * heads * d, to_bf16(-7.0f));
  std::vector<float> lse(rows * heads, -7.0f);
  const int dims = attention_dims(d);
  const dim3 grid(ceil_div(seq, g.attention_queries[dims]), batch * heads);
  const unsigned shared = (starts.present ? g.attention_docs_shared : g.attention_shared)[dims][0];
  if (starts.present) {
    auto fwd = d == 32 ? attention_fwd_docs_bf16_d32 : d == 64 ? attention_fwd_docs_bf16_d64 : attention_fwd_docs_bf16_d128;
    emu::launch_dynamic(shared, grid, dim3(128), fwd, out.data(), lse.data(), qkv, batch, seq, heads, kv_heads,
                        starts.pointer());
  } else {
    auto fwd = d == 32 ? attention_fwd_bf16_d32 : d == 64 ? attention_fwd_bf16_d64 : attention_fwd_bf16_d128;
    emu::launch_dynamic(shared, grid, dim3(128), fwd, out.data(), lse.data(), qkv, batch, seq, heads, kv_heads);
  }
  write_bf16("out", out);
  write_f32("lse", lse);
}

// Arguments batch, seq, heads, kv_heads, d (attention_forward's layout, its `starts`); dK/dV's
// grid runs over the key/value heads.
inline void attention_backward(const Geometry& g) {
  const int batch = arg(0), seq = arg(1), heads = arg(2), kv_heads = arg(3), d = arg(4);
  const size_t rows = size_t(batch) * seq, width = size_t(heads + 2 * kv_heads) * d;
  const Starts starts(rows);
  auto qkv = read_bf16("qkv", rows * width);
  auto out = read_bf16("out", rows * heads * d), dout = read_bf16("dout", rows * heads * d);
  auto lse = read_f32("lse", rows * heads);
  std::vector<float> delta(rows * heads, -7.0f);
  std::vector<bf16> dqkv(rows * width, to_bf16(-7.0f));  // every element must be written
  emu::launch(dim3(ceil_div(int(rows) * heads, 4)), dim3(g.row_threads), attention_bwd_delta_bf16, delta.data(),
              dout.data(), out.data(), batch, seq, heads, kv_heads, d);
  const int dims = attention_dims(d);
  const dim3 grid(ceil_div(seq, 64), batch * kv_heads), dq_grid(ceil_div(seq, g.attention_queries[dims]), batch * heads);
  const unsigned(&shared)[3] = (starts.present ? g.attention_docs_shared : g.attention_shared)[dims];
  const unsigned dkv_shared = shared[1], dq_shared = shared[2];
  if (starts.present) {
    auto dkv = d == 32   ? attention_bwd_dkv_docs_bf16_d32
               : d == 64 ? attention_bwd_dkv_docs_bf16_d64
                         : attention_bwd_dkv_docs_bf16_d128;
    auto dq = d == 32 ? attention_bwd_dq_docs_bf16_d32 : d == 64 ? attention_bwd_dq_docs_bf16_d64 : attention_bwd_dq_docs_bf16_d128;
    emu::launch_dynamic(dkv_shared, grid, dim3(128), dkv, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                        delta.data(), batch, seq, heads, kv_heads, starts.pointer());
    emu::launch_dynamic(dq_shared, dq_grid, dim3(128), dq, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                        delta.data(), batch, seq, heads, kv_heads, starts.pointer());
  } else {
    auto dkv = d == 32 ? attention_bwd_dkv_bf16_d32 : d == 64 ? attention_bwd_dkv_bf16_d64 : attention_bwd_dkv_bf16_d128;
    auto dq = d == 32 ? attention_bwd_dq_bf16_d32 : d == 64 ? attention_bwd_dq_bf16_d64 : attention_bwd_dq_bf16_d128;
    emu::launch_dynamic(dkv_shared, grid, dim3(128), dkv, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                        delta.data(), batch, seq, heads, kv_heads);
    emu::launch_dynamic(dq_shared, dq_grid, dim3(128), dq, dqkv.data(), qkv.data(), dout.data(), lse.data(),
                        delta.data(), batch, seq, heads, kv_heads);
  }
  write_bf16("dqkv", dqkv);
}

// Runs `op` if both vendors have it; false for an op of the including harness alone.
inline bool run_shared_op(const std::string& op, const Geometry& g) {
  if (op == "gemm_f32out") {
    gemm_forward(gemm_fwd_bf16_f32out, g.gemm_threads, g.gemm_tile, g.gemm_shared[0]);
  } else if (op == "gemm_bf16out") {
    gemm_forward(gemm_fwd_bf16, g.gemm_threads, g.gemm_tile, g.gemm_shared[0]);
  } else if (op == "gemm_bwd") {
    gemm_backward(g);
  } else if (op == "gemm_bwd_bf16out") {
    gemm_backward_bf16_out(g);
  } else if (op == "position_bf16") {
    position();
  } else if (op == "column_sum_bf16") {
    column_sum();
  } else if (op == "step_scalars") {
    step_scalars();
  } else if (op == "casts") {
    casts();
  } else if (op == "layernorm_fwd") {
    layernorm_forward(g);
  } else if (op == "layernorm_bwd") {
    layernorm_backward(g);
  } else if (op == "gelu_fwd" || op == "gelu_bwd") {
    gelu(op);
  } else if (op == "rmsnorm") {
    rmsnorm(g);
  } else if (op == "swiglu_fwd" || op == "swiglu_bwd") {
    swiglu(op);
  } else if (op == "rope") {
    rope();
  } else if (op == "adamw") {
    adamw();
  } else if (op == "xent") {
    cross_entropy();
  } else if (op == "embedding") {
    embedding();
  } else if (op == "attention_fwd") {
    attention_forward(g);
  } else if (op == "attention_bwd") {
    attention_backward(g);
  } else {
    return false;
  }
  return true;
}

}  // namespace harness
