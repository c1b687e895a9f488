// emu_libcuda.cpp: a CUDA driver (libcuda.so.1's entry points, as src/gpu/driver.rs's table names
// them) that runs trident's kernels on the CPU, so the CUDA Device trains end to end on a machine
// without a GPU. tests/cuda_device.rs builds it with
//   g++ -std=c++20 -O2 -shared -fPIC -DTRIDENT_EMU -pthread -I kernels -I kernels-cuda -I kernels-hip emu_libcuda.cpp -o libcuda-emu.so
// and points TRIDENT_LIBCUDA at the result; built with -DTRIDENT_FP16 as well (libcuda-emu-fp16.so)
// it runs the fp16 module's kernels instead (`--fp16`; see cuModuleLoadData).
//
// Model. One device that describes itself as an A100 (sm_80, 108 SMs, 48 KiB shared memory per
// block, 163 KiB opt-in, 40 GiB); EMU_CUDA_CC=90 makes it report compute capability 9.0 (and an
// H100's 227 KiB opt-in), so trident compiles for sm_90a and picks the kernels that need it (the
// wgmma + TMA GEMMs). Device memory is host memory: cuMemAlloc is an aligned malloc,
// copies are memcpy, asynchronous variants run synchronously, streams and contexts are tokens.
// cuModuleLoadData accepts only an ELF image (NVRTC really compiles the kernels to a CUBIN through
// the pip wheel's libnvrtc) and keeps its bytes; cuModuleGetFunction resolves a name in the table
// of every extern "C" kernel of kernels-cuda/ (emu_runtime.h's kernels of both vendors and this
// file's CUDA-only ones), and answers CUDA_ERROR_NOT_FOUND when the
// image does not contain that name or the table lacks it. cuLaunchKernel unpacks kernelParams
// with the kernel's own C++ signature and runs the kernel's source under the SIMT emulation
// (kernels-cuda/emu/simt.h), with the dynamic shared memory it asks for: up to 48 KiB, more once
// cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) allowed it on that function
// (up to the opt-in limit); `extra` is refused. cuTensorMapEncodeTiled checks its arguments and
// makes the map the TMA emulation reads (kernels-cuda/emu/tma.h: bf16 / f32, no swizzle or the
// 128-byte swizzle), refusing what the driver refuses (misaligned address or strides, an innermost
// box wider than the swizzle span).
//
// Streams and events follow the fake NCCL's progress per stream (emu_runtime.h, "Streams"):
// cuStreamQuery / cuEventQuery answer CUDA_ERROR_NOT_READY while a stream has operations
// outstanding, cuStreamWaitEvent blocks the host, cuMemFree and cuCtxSynchronize wait for every
// operation. Each stream is its own handle, so a test catches work waited for on the wrong stream.
//
// Counters. Every launch, copy, memset, synchronization, allocation and free is counted here, on
// the driver's side of the ABI, and written at exit to the file EMU_COUNTERS_FILE names
// (emu_runtime.h, `Counters`), so a test can hold trident's own counts to the driver's.
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../../kernels/adamw.cu"
#include "../../kernels-cuda/attention_block.cu"
#include "../../kernels-cuda/attention_bwd.cu"
#include "../../kernels-cuda/attention_fwd.cu"
#include "../../kernels/casts.cu"
#include "../../kernels/embedding.cu"
#include "../../kernels/gelu.cu"
#include "../../kernels-cuda/gemm_bf16.cu"
#include "../../kernels-cuda/gemm_bf16_bwd.cu"
#include "../../kernels-cuda/gemm_bf16_sm90.cu"
#include "../../kernels/layernorm.cu"
#include "../../kernels/rope.cu"
#include "../../kernels/softmax_xent.cu"
#include "../../kernels/tensor_ops.cu"

#include "smoke_axpy.inc"
#include "emu_runtime.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

namespace {

using namespace emu_runtime;  // its error codes are the driver's (CUDA_ERROR_INVALID_VALUE = 1, ...)

// The kernels of kernels-cuda/ that HIP lacks (the rest are emu_runtime.h's).
const KernelEntry kCudaOnly[] = {EMU_KERNEL(gemm_fwd_bf16_f32out_sm90), EMU_KERNEL(gemm_fwd_bf16_sm90),
                                  EMU_KERNEL(gemm_bwd_input_bf16_sm90), EMU_KERNEL(gemm_bwd_input_bf16_bf16out_sm90),
                                  EMU_KERNEL(gemm_bwd_weight_bf16_sm90)};

int context_token;

// The compute capability the device reports, major x 10 + minor: 80, or EMU_CUDA_CC.
int compute_capability() {
  const char* cc = std::getenv("EMU_CUDA_CC");
  return cc ? std::atoi(cc) : 80;
}

// Shared memory per block by default, and at most after opting in.
constexpr unsigned kDefaultShared = 49152;
unsigned optin_shared() { return compute_capability() >= 90 ? 232448 : 166912; }

// The dynamic shared memory each function may use (cuFuncSetAttribute), beyond the default.
std::mutex allowance_lock;
std::map<void*, unsigned> allowances;
unsigned allowance(void* function) {
  std::lock_guard<std::mutex> hold(allowance_lock);
  auto it = allowances.find(function);
  return it == allowances.end() ? kDefaultShared : it->second;
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
    case 97: *v = int(optin_shared()); return kSuccess;   // opt-in shared memory
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
CUresult cuCtxSynchronize() { return synchronize_device(); }
CUresult cuProfilerStart() { return profiler_mark("start") == 0 ? kSuccess : kInvalidValue; }
CUresult cuProfilerStop() { return profiler_mark("stop") == 0 ? kSuccess : kInvalidValue; }

// The storage type this driver's kernels were built for: bf16, or binary16 when built with
// -DTRIDENT_FP16 (libcuda-emu-fp16.so, for `--fp16`). A module compiled for the other one (the
// fp16 module's images hold the symbol trident_storage_fp16, kernels-cuda/common/base.cuh) is
// refused as an invalid image, so a Device can never run one storage type's kernels on the
// other's buffers here.
#ifdef TRIDENT_FP16
constexpr bool kFp16Driver = true;
#else
constexpr bool kFp16Driver = false;
#endif

CUresult cuModuleLoadData(void** module, const void* image) {
  Module* m = load_elf(image);
  if (m && (m->image.find(std::string("trident_storage_fp16") + '\0') != std::string::npos) != kFp16Driver) {
    std::fprintf(stderr, "emulated driver: a %s module on the %s driver\n", kFp16Driver ? "bf16" : "fp16",
                 kFp16Driver ? "fp16" : "bf16");
    delete m;
    m = nullptr;
  }
  *module = m;
  return *module ? kSuccess : kInvalidImage;
}
CUresult cuModuleUnload(void* module) { return unload_module(module); }
CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  return get_function(function, module, name, kCudaOnly, std::size(kCudaOnly));
}
CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared_bytes, void* stream, void** params, void** extra) {
  log_launch_stream(stream);
  return launch(function, dim3(gx, gy, gz), dim3(bx, by, bz), shared_bytes, params, extra, 65535,
                function ? allowance(function) : 0);
}
CUresult cuFuncSetAttribute(void* function, int attribute, int value) {
  constexpr int kMaxDynamicSharedSizeBytes = 8;
  if (!function || attribute != kMaxDynamicSharedSizeBytes || value < 0 || unsigned(value) > optin_shared())
    return kInvalidValue;
  std::lock_guard<std::mutex> hold(allowance_lock);
  allowances[function] = unsigned(value);
  return kSuccess;
}
CUresult cuTensorMapEncodeTiled(void* map, int data_type, unsigned rank, void* address, const uint64_t* dims,
                                const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                int interleave, int swizzle, int l2_promotion, int oob_fill) {
  const char* why = "";
  if (!map || !address || !dims || (rank > 1 && !strides) || !box || !element_strides) return kInvalidValue;
  return emu::encode_tiled(map, data_type, rank, address, dims, strides, box, element_strides, interleave, swizzle,
                           l2_promotion, oob_fill, &why);
}

CUresult cuMemAlloc_v2(CUdeviceptr* pointer, size_t bytes) {
  void* p = nullptr;
  CUresult r = malloc_device(&p, bytes);
  *pointer = reinterpret_cast<CUdeviceptr>(p);
  return r;
}
CUresult cuMemFree_v2(CUdeviceptr pointer) { return free_device(reinterpret_cast<void*>(pointer)); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return copy(reinterpret_cast<void*>(dst), src, bytes, Direction::kHostToDevice);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return copy(dst, reinterpret_cast<const void*>(src), bytes, Direction::kDeviceToHost);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes, Direction::kDeviceToDevice);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void*) {
  return copy(reinterpret_cast<void*>(dst), src, bytes, Direction::kHostToDevice, false);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void*) {
  return copy(dst, reinterpret_cast<const void*>(src), bytes, Direction::kDeviceToHost, false);
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, size_t count) {
  return fill_u32(reinterpret_cast<void*>(dst), value, count);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, void*) {
  return cuMemsetD32_v2(dst, value, count);
}

CUresult cuStreamCreate(void** stream, unsigned) { return create_stream(stream); }
CUresult cuStreamDestroy_v2(void* stream) { return destroy_stream(stream); }
CUresult cuStreamQuery(void* stream) { return query_stream(stream); }
CUresult cuStreamSynchronize(void* stream) { return synchronize_stream(stream); }
CUresult cuStreamWaitEvent(void* stream, void* event, unsigned) {
  stream_log("wait", stream, event);
  return synchronize_event(event, false);
}

CUresult cuEventCreate(void** event, unsigned) { return create_event(event); }
CUresult cuEventRecord(void* event, void* stream) { return record_event(event, stream); }
CUresult cuEventQuery(void* event) { return query_event(event); }
CUresult cuEventSynchronize(void* event) { return synchronize_event(event); }
CUresult cuEventElapsedTime(float* ms, void* start, void* end) { return elapsed_ms(ms, start, end); }
CUresult cuEventDestroy_v2(void* event) { return destroy_event(event); }

}  // extern "C"
