// emu_libcuda.cpp: a CUDA driver (libcuda.so.1's entry points, as src/gpu/driver.rs's table names
// them) that runs trident's kernels on the CPU, so the CUDA Device trains end to end on a machine
// without a GPU. tests/cuda_device.rs builds it with
//   g++ -std=c++20 -O2 -shared -fPIC -DTRIDENT_EMU -pthread emu_libcuda.cpp -o libcuda-emu.so
// and points TRIDENT_LIBCUDA at the result.
//
// Model. One device that describes itself as an A100 (sm_80, 108 SMs, 48 KiB shared memory per
// block, 163 KiB opt-in, 40 GiB); EMU_CUDA_CC=90 makes it report compute capability 9.0, so
// trident compiles for sm_90a and picks the kernels that need it (the wgmma GEMM). Device memory is host memory: cuMemAlloc is an aligned malloc,
// copies are memcpy, asynchronous variants run synchronously, streams and contexts are tokens.
// cuModuleLoadData accepts only an ELF image (NVRTC really compiles the kernels to a CUBIN through
// the pip wheel's libnvrtc) and keeps its bytes; cuModuleGetFunction resolves a name in the table
// of every extern "C" kernel of kernels-cuda/ below, and answers CUDA_ERROR_NOT_FOUND when the
// image does not contain that name or the table lacks it. cuLaunchKernel unpacks kernelParams
// with the kernel's own C++ signature and runs the kernel's source under the SIMT emulation
// (kernels-cuda/emu/simt.h). Dynamic shared memory and `extra` are refused (trident's kernels use
// static shared memory and kernelParams only).
//
// Streams and events follow the fake NCCL's progress per stream (emu_runtime.h, "Streams"):
// cuStreamQuery / cuEventQuery answer CUDA_ERROR_NOT_READY while a stream has operations
// outstanding, cuStreamWaitEvent blocks the host, cuMemFree and cuCtxSynchronize wait for every
// operation. Each stream is its own handle, so a test catches work waited for on the wrong stream.
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "../../kernels-cuda/adamw.cu"
#include "../../kernels-cuda/attention_bwd.cu"
#include "../../kernels-cuda/attention_fwd.cu"
#include "../../kernels-cuda/casts.cu"
#include "../../kernels-cuda/embedding.cu"
#include "../../kernels-cuda/gelu.cu"
#include "../../kernels-cuda/gemm_bf16.cu"
#include "../../kernels-cuda/gemm_bf16_bwd.cu"
#include "../../kernels-cuda/gemm_bf16_sm90.cu"
#include "../../kernels-cuda/layernorm.cu"
#include "../../kernels-cuda/softmax_xent.cu"
#include "../../kernels-cuda/tensor_ops.cu"

#include "smoke_axpy.inc"
#include "emu_runtime.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

namespace {

enum : CUresult {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidImage = 200,
  kInvalidHandle = 400,
  kNotFound = 500,
  kLaunchFailed = 719,
};

using emu_runtime::KernelEntry;
using emu_runtime::Module;
#define KERNEL EMU_KERNEL
const KernelEntry kKernels[] = {
    KERNEL(adamw_f32_bf16),
    KERNEL(attention_bwd_delta_bf16),
    KERNEL(attention_bwd_dkv_bf16_d64),
    KERNEL(attention_bwd_dkv_bf16_d128),
    KERNEL(attention_bwd_dq_bf16_d64),
    KERNEL(attention_bwd_dq_bf16_d128),
    KERNEL(attention_fwd_bf16_d64),
    KERNEL(attention_fwd_bf16_d128),
    KERNEL(cast_f32_to_bf16),
    KERNEL(cast_bf16_to_f32),
    KERNEL(embedding_fwd_bf16),
    KERNEL(embedding_bwd_wte_bf16),
    KERNEL(embedding_bwd_wpe_bf16),
    KERNEL(gelu_fwd_bf16),
    KERNEL(gelu_bwd_bf16),
    KERNEL(gemm_fwd_bf16_f32out),
    KERNEL(gemm_fwd_bf16),
    KERNEL(gemm_bwd_input_bf16),
    KERNEL(gemm_bwd_weight_bf16),
    KERNEL(gemm_fwd_bf16_f32out_sm90),
    KERNEL(layernorm_fwd_bf16),
    KERNEL(layernorm_bwd_dx_bf16),
    KERNEL(layernorm_bwd_dparams_bf16),
    KERNEL(xent_max_bf16),
    KERNEL(xent_partials_bf16),
    KERNEL(xent_bwd_bf16),
    KERNEL(add_f32),
    KERNEL(add_assign_f32),
    KERNEL(add_bias_f32),
    KERNEL(round_bf16_f32),
    KERNEL(gelu_fwd_f32),
    KERNEL(gelu_bwd_f32),
    KERNEL(embedding_fwd_f32),
    KERNEL(position_fwd_f32),
    KERNEL(layernorm_apply_f32),
    KERNEL(layernorm_bwd_apply_dx_f32),
    KERNEL(xent_bwd_f32),
    KERNEL(embedding_bwd_f32),
    KERNEL(position_bwd_f32),
    KERNEL(column_sum_add_f32),
    KERNEL(layernorm_bwd_params_f32),
    KERNEL(layernorm_fwd_f32),
    KERNEL(layernorm_bwd_dx_f32),
    KERNEL(layernorm_sums_f32),
    KERNEL(layernorm_bwd_sums_f32),
    KERNEL(xent_max_f32),
    KERNEL(xent_partials_f32),
    KERNEL(sum_squares_f32),
    KERNEL(trident_smoke_axpy),
};
#undef KERNEL

int context_token;

constexpr CUresult kNotReady = 600;

// The compute capability the device reports, major x 10 + minor: 80, or EMU_CUDA_CC.
int compute_capability() {
  const char* cc = std::getenv("EMU_CUDA_CC");
  return cc ? std::atoi(cc) : 80;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) { return flags == 0 ? kSuccess : kInvalidValue; }
CUresult cuDriverGetVersion(int* v) {
  *v = 12040;
  return kSuccess;
}
CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return kSuccess;
}
CUresult cuDeviceGet(int* d, int ordinal) {
  if (ordinal != 0) return kInvalidDevice;
  *d = 0;
  return kSuccess;
}
CUresult cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, "Emulated A100-SXM4-40GB (trident SIMT emulation)", size_t(len));
  if (len > 0) name[len - 1] = 0;
  return kSuccess;
}
CUresult cuDeviceGetAttribute(int* v, int attribute, int) {
  switch (attribute) {
    case 1: case 2: case 3: *v = 1024; return kSuccess;  // threads per block, block x, y
    case 4: *v = 64; return kSuccess;                     // block z
    case 5: *v = 2147483647; return kSuccess;             // grid x
    case 6: case 7: *v = 65535; return kSuccess;          // grid y, z
    case 8: *v = 49152; return kSuccess;                  // shared memory per block
    case 10: *v = 32; return kSuccess;                    // warp size
    case 16: *v = 108; return kSuccess;                   // SMs
    case 75: *v = compute_capability() / 10; return kSuccess;  // compute capability 8.0
    case 76: *v = compute_capability() % 10; return kSuccess;  // (or EMU_CUDA_CC)
    case 97: *v = 166912; return kSuccess;                // opt-in shared memory
    default: return kInvalidValue;
  }
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = size_t(40) << 30;
  return kSuccess;
}
CUresult cuGetErrorName(CUresult code, const char** name) {
  switch (code) {
    case kInvalidValue: *name = "CUDA_ERROR_INVALID_VALUE"; return kSuccess;
    case kOutOfMemory: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return kSuccess;
    case kInvalidImage: *name = "CUDA_ERROR_INVALID_IMAGE"; return kSuccess;
    case kInvalidHandle: *name = "CUDA_ERROR_INVALID_HANDLE"; return kSuccess;
    case kNotFound: *name = "CUDA_ERROR_NOT_FOUND"; return kSuccess;
    default: return kInvalidValue;
  }
}
CUresult cuGetErrorString(CUresult code, const char** message) {
  switch (code) {
    case kInvalidValue: *message = "emulated driver: invalid argument"; return kSuccess;
    case kOutOfMemory: *message = "emulated driver: out of memory"; return kSuccess;
    case kInvalidImage: *message = "emulated driver: the image is not a CUBIN (ELF)"; return kSuccess;
    case kInvalidHandle: *message = "emulated driver: invalid handle"; return kSuccess;
    case kNotFound: *message = "emulated driver: no such kernel in the module"; return kSuccess;
    default: return kInvalidValue;
  }
}
CUresult cuDevicePrimaryCtxRetain(void** context, int) {
  *context = &context_token;
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }
CUresult cuCtxCreate_v2(void** context, unsigned, int) {
  *context = &context_token;
  return kSuccess;
}
CUresult cuCtxSetCurrent(void*) { return kSuccess; }
CUresult cuCtxSynchronize() {
  emu_runtime::wait_device_idle();
  return kSuccess;
}

CUresult cuModuleLoadData(void** module, const void* image) {
  const auto* p = static_cast<const unsigned char*>(image);
  if (!p || std::memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return kInvalidImage;
  *module = new Module{std::string(reinterpret_cast<const char*>(p), emu_runtime::elf_size(p))};
  return kSuccess;
}
CUresult cuModuleUnload(void* module) {
  delete static_cast<Module*>(module);
  return kSuccess;
}
CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  if (!module || !name) return kInvalidHandle;
  const KernelEntry* k = emu_runtime::find_kernel(kKernels, *static_cast<Module*>(module), name);
  if (!k) return kNotFound;
  *function = const_cast<KernelEntry*>(k);
  return kSuccess;
}
CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared_bytes, void*, void** params, void** extra) {
  if (!function || extra || shared_bytes > 0) return kInvalidValue;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > 1024) return kInvalidValue;
  if (gy > 65535 || gz > 65535) return kInvalidValue;
  static_cast<KernelEntry*>(function)->launch(dim3(gx, gy, gz), dim3(bx, by, bz), params);
  return kSuccess;
}

CUresult cuMemAlloc_v2(CUdeviceptr* pointer, size_t bytes) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!p) return kOutOfMemory;
  *pointer = reinterpret_cast<CUdeviceptr>(p);
  return kSuccess;
}
CUresult cuMemFree_v2(CUdeviceptr pointer) {
  emu_runtime::wait_device_idle();
  std::free(reinterpret_cast<void*>(pointer));
  return kSuccess;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return kSuccess;
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  if (bytes) std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return kSuccess;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (bytes) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return kSuccess;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void*) {
  return cuMemcpyHtoD_v2(dst, src, bytes);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void*) {
  return cuMemcpyDtoH_v2(dst, src, bytes);
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, size_t count) {
  auto* p = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
  return kSuccess;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, void*) {
  return cuMemsetD32_v2(dst, value, count);
}
CUresult cuStreamCreate(void** stream, unsigned) {
  *stream = new char;
  return kSuccess;
}
CUresult cuStreamDestroy_v2(void* stream) {
  delete static_cast<char*>(stream);
  return kSuccess;
}
CUresult cuStreamQuery(void* stream) { return emu_runtime::stream_done(stream, UINT64_MAX) ? kSuccess : kNotReady; }
CUresult cuStreamSynchronize(void* stream) {
  emu_runtime::wait_stream(stream, UINT64_MAX);
  return kSuccess;
}

CUresult cuEventCreate(void** event, unsigned) {
  *event = new emu_runtime::Event{std::chrono::steady_clock::now(), nullptr, 0};
  return kSuccess;
}
CUresult cuEventRecord(void* event, void* stream) {
  static_cast<emu_runtime::Event*>(event)->record(stream);
  return kSuccess;
}
CUresult cuEventQuery(void* event) { return static_cast<emu_runtime::Event*>(event)->done() ? kSuccess : kNotReady; }
CUresult cuEventSynchronize(void* event) {
  static_cast<emu_runtime::Event*>(event)->wait();
  return kSuccess;
}
CUresult cuStreamWaitEvent(void*, void* event, unsigned) { return cuEventSynchronize(event); }
CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  auto d = static_cast<emu_runtime::Event*>(end)->at - static_cast<emu_runtime::Event*>(start)->at;
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return kSuccess;
}
CUresult cuEventDestroy_v2(void* event) {
  delete static_cast<emu_runtime::Event*>(event);
  return kSuccess;
}

}  // extern "C"
