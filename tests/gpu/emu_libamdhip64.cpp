// emu_libamdhip64.cpp: a HIP runtime (libamdhip64.so's entry points, as src/gpu/hip.rs's table
// names them) that runs trident's kernels-hip/ kernels on the CPU, so the HIP Device trains end
// to end on a machine without an AMD GPU. tests/hip_device.rs builds it with
//   g++ -std=c++20 -O2 -shared -fPIC -DTRIDENT_EMU -pthread emu_libamdhip64.cpp -o libamdhip64-emu.so
// and points TRIDENT_LIBAMDHIP64 at the result (hipRTC is the machine's real one).
//
// Model. EMU_HIP_DEVICES devices (default 8, the GCDs of an MI250X node), each an MI250X GCD:
// gfx90a, 110 compute units, wave64, 1024 threads and 64 KiB of LDS per workgroup, 64 GiB. Device
// memory is host memory: hipMalloc is an aligned malloc, copies are memcpy, and kernels and copies
// are synchronous; streams and events follow the fake NCCL's progress per stream (emu_runtime.h,
// "Streams": RCCL on HIP streams), and hipFree / hipDeviceSynchronize wait for its operations.
// hipModuleLoadData accepts only an AMDGPU code object (a 64-bit ELF
// for EM_AMDGPU, what hipRTC writes) and keeps its bytes; hipModuleGetFunction resolves a name in
// the table of every extern "C" kernel of kernels-hip/ below, and answers hipErrorNotFound when
// the code object does not contain that name (with its NUL, as the string table holds it) or the
// table lacks it. hipModuleLaunchKernel unpacks kernelParams with the kernel's own C++ signature
// and runs the kernel's source under the SIMT emulation with 64-lane wavefronts
// (kernels-hip/emu/hip.h). Dynamic shared memory and `extra` are refused (trident's kernels use
// static LDS and kernelParams only), as is a workgroup over 1024 threads.
// hipGetDeviceProperties writes a struct of its own layout (name first, gcnArchName later, as
// every ROCm has them), which trident reads by content.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "../../kernels-hip/adamw.hip"
#include "../../kernels-hip/attention_bwd.hip"
#include "../../kernels-hip/attention_fwd.hip"
#include "../../kernels-hip/casts.hip"
#include "../../kernels-hip/embedding.hip"
#include "../../kernels-hip/gelu.hip"
#include "../../kernels-hip/gemm_bf16.hip"
#include "../../kernels-hip/gemm_bf16_bwd.hip"
#include "../../kernels-hip/layernorm.hip"
#include "../../kernels-hip/softmax_xent.hip"
#include "../../kernels-hip/tensor_ops.hip"
#include "smoke_axpy.inc"
#include "emu_runtime.h"

typedef int hipError_t;

namespace {

enum : hipError_t {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidImage = 200,
  kNoBinaryForGpu = 209,
  kInvalidHandle = 400,
  kNotFound = 500,
  kNotReady = 600,
};

using emu_runtime::KernelEntry;
using emu_runtime::Module;
#define KERNEL EMU_KERNEL
const KernelEntry kKernels[] = {
    KERNEL(trident_smoke_axpy),
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
};
#undef KERNEL

thread_local int current_device = 0;

int device_count() {
  const char* v = std::getenv("EMU_HIP_DEVICES");
  const int n = v ? std::atoi(v) : 8;
  return n > 0 ? n : 0;
}

// hipDeviceProp_t as this runtime lays it out (not ROCm's: trident finds the arch by content).
struct DeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int fields_before_the_arch[150];
  int gcnArch;
  char gcnArchName[256];
  int fields_after_the_arch[64];
};

constexpr const char* kName = "Emulated AMD Instinct MI250X (trident wave64 SIMT emulation)";

}  // namespace

extern "C" {

hipError_t hipInit(unsigned flags) { return flags == 0 ? kSuccess : kInvalidValue; }
hipError_t hipDriverGetVersion(int* v) {
  *v = 50221153;
  return kSuccess;
}
hipError_t hipRuntimeGetVersion(int* v) {
  *v = 50221153;
  return kSuccess;
}
hipError_t hipGetDeviceCount(int* n) {
  *n = device_count();
  return *n > 0 ? kSuccess : kNoDevice;
}
hipError_t hipDeviceGet(int* d, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) return kInvalidDevice;
  *d = ordinal;
  return kSuccess;
}
hipError_t hipDeviceGetName(char* name, int len, int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  std::strncpy(name, kName, size_t(len));
  if (len > 0) name[len - 1] = 0;
  return kSuccess;
}
hipError_t hipDeviceTotalMem(size_t* bytes, int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  *bytes = size_t(64) << 30;
  return kSuccess;
}
hipError_t hipDeviceGetAttribute(int* v, int attribute, int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  switch (attribute) {
    case 56: *v = 1024; return kSuccess;  // hipDeviceAttributeMaxThreadsPerBlock
    case 63: *v = 110; return kSuccess;   // hipDeviceAttributeMultiprocessorCount (CUs)
    case 87: *v = 64; return kSuccess;    // hipDeviceAttributeWarpSize
    default: return kInvalidValue;
  }
}
hipError_t hipGetDeviceProperties(void* out, int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  DeviceProp p{};
  std::strncpy(p.name, kName, sizeof p.name - 1);
  p.totalGlobalMem = size_t(64) << 30;
  p.gcnArch = 910;
  std::strncpy(p.gcnArchName, "gfx90a:sramecc+:xnack-", sizeof p.gcnArchName - 1);
  std::memcpy(out, &p, sizeof p);
  return kSuccess;
}
const char* hipGetErrorName(hipError_t code) {
  switch (code) {
    case kSuccess: return "hipSuccess";
    case kInvalidValue: return "hipErrorInvalidValue";
    case kOutOfMemory: return "hipErrorOutOfMemory";
    case kNoDevice: return "hipErrorNoDevice";
    case kInvalidDevice: return "hipErrorInvalidDevice";
    case kInvalidImage: return "hipErrorInvalidImage";
    case kNoBinaryForGpu: return "hipErrorNoBinaryForGpu";
    case kInvalidHandle: return "hipErrorInvalidHandle";
    case kNotFound: return "hipErrorNotFound";
    case kNotReady: return "hipErrorNotReady";
    default: return "hipErrorUnknown";
  }
}
const char* hipGetErrorString(hipError_t code) {
  switch (code) {
    case kSuccess: return "no error";
    case kInvalidValue: return "emulated HIP runtime: invalid argument";
    case kOutOfMemory: return "emulated HIP runtime: out of memory";
    case kNoDevice: return "emulated HIP runtime: no device (EMU_HIP_DEVICES)";
    case kInvalidDevice: return "emulated HIP runtime: no such device";
    case kInvalidImage: return "emulated HIP runtime: the image is not an AMDGPU code object (ELF)";
    case kInvalidHandle: return "emulated HIP runtime: invalid handle";
    case kNotFound: return "emulated HIP runtime: no such kernel in the module";
    case kNotReady: return "emulated HIP runtime: work still outstanding";
    default: return "emulated HIP runtime: unknown error";
  }
}
hipError_t hipSetDevice(int d) {
  if (d < 0 || d >= device_count()) return kInvalidDevice;
  current_device = d;
  return kSuccess;
}
hipError_t hipDeviceSynchronize() {
  emu_runtime::wait_device_idle();
  return kSuccess;
}

hipError_t hipModuleLoadData(void** module, const void* image) {
  const auto* p = static_cast<const unsigned char*>(image);
  if (!module || !p || std::memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return kInvalidImage;
  uint16_t machine;
  std::memcpy(&machine, p + 0x12, 2);
  if (machine != 0xe0) return kNoBinaryForGpu;  // EM_AMDGPU
  *module = new Module{std::string(reinterpret_cast<const char*>(p), emu_runtime::elf_size(p))};
  return kSuccess;
}
hipError_t hipModuleUnload(void* module) {
  delete static_cast<Module*>(module);
  return kSuccess;
}
hipError_t hipModuleGetFunction(void** function, void* module, const char* name) {
  if (!module || !name || !function) return kInvalidHandle;
  const KernelEntry* k = emu_runtime::find_kernel(kKernels, *static_cast<Module*>(module), name);
  if (!k) return kNotFound;
  *function = const_cast<KernelEntry*>(k);
  return kSuccess;
}
hipError_t hipModuleLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared_bytes, void*, void** params, void** extra) {
  if (!function || extra || shared_bytes > 0) return kInvalidValue;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > 1024) return kInvalidValue;
  static_cast<KernelEntry*>(function)->launch(dim3(gx, gy, gz), dim3(bx, by, bz), params);
  return kSuccess;
}

hipError_t hipMalloc(void** pointer, size_t bytes) {
  if (!pointer) return kInvalidValue;
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!p) return kOutOfMemory;
  *pointer = p;
  return kSuccess;
}
hipError_t hipFree(void* pointer) {
  emu_runtime::wait_device_idle();
  std::free(pointer);
  return kSuccess;
}
hipError_t hipMemcpyHtoD(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
  return kSuccess;
}
hipError_t hipMemcpyDtoH(void* dst, void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
  return kSuccess;
}
hipError_t hipMemcpyDtoD(void* dst, void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
  return kSuccess;
}
hipError_t hipMemsetD32(void* dst, int value, size_t count) {
  auto* p = static_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = uint32_t(value);
  return kSuccess;
}
hipError_t hipStreamCreate(void** stream) {
  *stream = new char;
  return kSuccess;
}
hipError_t hipStreamCreateWithFlags(void** stream, unsigned) { return hipStreamCreate(stream); }
hipError_t hipStreamDestroy(void* stream) {
  delete static_cast<char*>(stream);
  return kSuccess;
}
hipError_t hipStreamQuery(void* stream) { return emu_runtime::stream_done(stream, UINT64_MAX) ? kSuccess : kNotReady; }
hipError_t hipStreamSynchronize(void* stream) {
  emu_runtime::wait_stream(stream, UINT64_MAX);
  return kSuccess;
}
hipError_t hipEventCreateWithFlags(void** event, unsigned) {
  *event = new emu_runtime::Event{std::chrono::steady_clock::now(), nullptr, 0};
  return kSuccess;
}
hipError_t hipEventRecord(void* event, void* stream) {
  static_cast<emu_runtime::Event*>(event)->record(stream);
  return kSuccess;
}
hipError_t hipStreamWaitEvent(void*, void* event, unsigned) {
  static_cast<emu_runtime::Event*>(event)->wait();
  return kSuccess;
}
hipError_t hipEventDestroy(void* event) {
  delete static_cast<emu_runtime::Event*>(event);
  return kSuccess;
}

}  // extern "C"
