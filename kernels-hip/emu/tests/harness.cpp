// harness.cpp: runs one kernel of kernels-hip/ under the SIMT emulation with 64-lane wavefronts
// on inputs that tests/hip_emulation.rs wrote, and writes the outputs back for it to compare with
// trident's reference device. Built by that test with
//   g++ -std=c++20 -O1 -DTRIDENT_EMU -pthread harness.cpp -o harness
// (and once more with -DTRIDENT_PLANT_WAVE32_BUG, the planted wave32 reduction).
// Usage: harness <op> <dir> <integer arguments of the op>
// Files in <dir> are raw little-endian arrays named <name>.bf16 (u16 bit patterns) or
// <name>.f32; an input file that does not exist is passed to the kernel as a null pointer.
#include <string>

#include "../../gemm_bf16.hip"
#include "../../layernorm.hip"

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
std::vector<float> read_f32(const char* name, size_t n, bool* present = nullptr) { return read<float>(name, "f32", n, present); }

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

  if (op == "gemm_f32out") {
    const int M = arg(0), N = arg(1), K = arg(2);
    auto A = read_bf16("a", size_t(M) * K);
    auto W = read_bf16("w", size_t(N) * K);
    bool has_bias = false;
    auto bias = read_f32("bias", N, &has_bias);
    std::vector<float> out(size_t(M) * N, -1.0f);
    emu::launch(dim3(ceil_div(N, 64), ceil_div(M, 64)), dim3(256), gemm_fwd_bf16_f32out_mfma, out.data(), A.data(),
                W.data(), or_null(bias), M, N, K);
    write_f32("out", out);
  } else if (op == "layernorm_fwd") {
    const int rows = arg(0), C = arg(1);
    auto inp = read_bf16("inp", size_t(rows) * C);
    auto weight = read_f32("weight", C), bias = read_f32("bias", C);
    std::vector<bf16> out(size_t(rows) * C);
    std::vector<float> mean(rows), rstd(rows);
    emu::launch(dim3(ceil_div(rows, 4)), dim3(256), layernorm_fwd_bf16_wave64, out.data(), mean.data(), rstd.data(),
                inp.data(), weight.data(), bias.data(), rows, C);
    write_bf16("out", out);
    write_f32("mean", mean);
    write_f32("rstd", rstd);
  } else if (op == "layernorm_bwd") {
    const int rows = arg(0), C = arg(1);
    auto dout = read_bf16("dout", size_t(rows) * C), inp = read_bf16("inp", size_t(rows) * C);
    auto weight = read_f32("weight", C), mean = read_f32("mean", rows), rstd = read_f32("rstd", rows);
    auto dinp = read_f32("dinp", size_t(rows) * C);
    auto dweight = read_f32("dweight", C), dbias = read_f32("dbias", C);
    emu::launch(dim3(ceil_div(rows, 4)), dim3(256), layernorm_bwd_dx_bf16_wave64, dinp.data(), dout.data(),
                inp.data(), weight.data(), mean.data(), rstd.data(), rows, C);
    emu::launch(dim3(ceil_div(C, 256)), dim3(256), layernorm_bwd_dparams_bf16_wave64, dweight.data(), dbias.data(),
                dout.data(), inp.data(), mean.data(), rstd.data(), rows, C);
    write_f32("dinp", dinp);
    write_f32("dweight", dweight);
    write_f32("dbias", dbias);
  } else if (op == "wave64_probe") {
    std::vector<int> out(128 * 8, -1);
    emu::launch(dim3(1), dim3(128), wave64_probe, out.data());
    write("out", "i32", out);
  } else {
    return usage();
  }
  return 0;
}
