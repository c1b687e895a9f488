// emu_libamdhip64.cpp: a HIP runtime (libamdhip64.so's entry points, as src/gpu/hip.rs's table
// names them) that runs trident's HIP kernels (kernels/, kernels-hip/) on the CPU, so the HIP Device trains end
// to end on a machine without an AMD GPU. tests/hip_device.rs builds it with
//   g++ -std=c++20 -O2 -shared -fPIC -DTRIDENT_EMU -pthread -I kernels -I kernels-cuda -I kernels-hip emu_libamdhip64.cpp -o libamdhip64-emu.so
// and points TRIDENT_LIBAMDHIP64 at the result (hipRTC is the machine's real one); built with
// -DTRIDENT_FP16 as well (libamdhip64-emu-fp16.so) it runs the fp16 module's kernels instead
// (`--fp16`; see hipModuleLoadData).
//
// Model. EMU_HIP_DEVICES devices (default 8, the GCDs of an MI250X node), each an MI250X GCD:
// gfx90a, 110 compute units, wave64, 1024 threads and 64 KiB of LDS per workgroup, 64 GiB. Device
// memory is host memory: hipMalloc is an aligned malloc, copies are memcpy, and kernels and copies
// are synchronous; streams and events follow the fake NCCL's progress per stream (emu_runtime.h,
// "Streams": RCCL on HIP streams), and hipFree / hipDeviceSynchronize wait for its operations.
// hipModuleLoadData accepts only an AMDGPU code object (a 64-bit ELF
// for EM_AMDGPU, what hipRTC writes) and keeps its bytes; hipModuleGetFunction resolves a name in
// the table of every extern "C" kernel of the HIP suite (emu_runtime.h's, which the CUDA kernels
// share), and answers hipErrorNotFound when
// the code object does not contain that name (with its NUL, as the string table holds it) or the
// table lacks it. hipModuleLaunchKernel unpacks kernelParams with the kernel's own C++ signature
// and runs the kernel's source under the SIMT emulation with 64-lane wavefronts
// (kernels-hip/emu/hip.h). Dynamic shared memory is passed up to the 64 KiB of LDS (trident's
// HIP kernels use static LDS only); `extra` is refused, as is a workgroup over 1024 threads.
// hipGetDeviceProperties writes a struct of its own layout (name first, gcnArchName later, as
// every ROCm has them), which trident reads by content.
// Every launch, copy, memset, synchronization, allocation and free is counted on the runtime's
// side of the ABI and written at exit to the file EMU_COUNTERS_FILE names (emu_runtime.h,
// `Counters`), so a test can hold trident's own counts to the runtime's.
#include <cstdarg>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

// The portable kernels of kernels/ pick the HIP base (kernels/common/portable.h).
#define TRIDENT_EMU_HIP 1
#include "../../kernels/adamw.cu"
#include "../../kernels-hip/attention_block.hip"
#include "../../kernels-hip/attention_bwd.hip"
#include "../../kernels-hip/attention_fwd.hip"
#include "../../kernels/casts.cu"
#include "../../kernels/embedding.cu"
#include "../../kernels/gelu.cu"
#include "../../kernels-hip/gemm_bf16.hip"
#include "../../kernels-hip/gemm_bf16_bwd.hip"
#include "../../kernels/layernorm.cu"
#include "../../kernels/rope.cu"
#include "../../kernels/softmax_xent.cu"
#include "../../kernels/tensor_ops.cu"
#include "smoke_axpy.inc"
#include "emu_runtime.h"

typedef int hipError_t;

namespace {

using namespace emu_runtime;  // its error codes are HIP's (hipErrorInvalidValue = 1, ...)

constexpr hipError_t kNoBinaryForGpu = 209;

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
hipError_t hipDeviceSynchronize() { return synchronize_device(); }
hipError_t hipProfilerStart() { return profiler_mark("start") == 0 ? kSuccess : kInvalidValue; }
hipError_t hipProfilerStop() { return profiler_mark("stop") == 0 ? kSuccess : kInvalidValue; }

// The storage type this runtime's kernels were built for: bf16, or binary16 when built with
// -DTRIDENT_FP16 (libamdhip64-emu-fp16.so, for `--fp16`). A code object compiled for the other one
// (the fp16 module's objects hold the symbol trident_storage_fp16, kernels-hip/common/base.h) is
// refused as an invalid image, so a Device can never run one storage type's kernels on the
// other's buffers here.
#ifdef TRIDENT_FP16
constexpr bool kFp16Runtime = true;
#else
constexpr bool kFp16Runtime = false;
#endif

hipError_t hipModuleLoadData(void** module, const void* image) {
  Module* m = module ? load_elf(image) : nullptr;
  if (!m) return kInvalidImage;
  uint16_t machine;
  std::memcpy(&machine, m->image.data() + 0x12, 2);
  if (machine != 0xe0) {  // EM_AMDGPU
    delete m;
    return kNoBinaryForGpu;
  }
  if ((m->image.find(std::string("trident_storage_fp16") + '\0') != std::string::npos) != kFp16Runtime) {
    std::fprintf(stderr, "emulated HIP runtime: a %s module on the %s runtime\n", kFp16Runtime ? "bf16" : "fp16",
                 kFp16Runtime ? "fp16" : "bf16");
    delete m;
    return kInvalidImage;
  }
  *module = m;
  return kSuccess;
}
hipError_t hipModuleUnload(void* module) { return unload_module(module); }
hipError_t hipModuleGetFunction(void** function, void* module, const char* name) {
  return get_function(function, module, name);
}
hipError_t hipModuleLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared_bytes, void*, void** params, void** extra) {
  return launch(function, dim3(gx, gy, gz), dim3(bx, by, bz), shared_bytes, params, extra, ~0u, 65536);
}

hipError_t hipMalloc(void** pointer, size_t bytes) { return malloc_device(pointer, bytes); }
hipError_t hipFree(void* pointer) { return free_device(pointer); }
hipError_t hipMemcpyHtoD(void* dst, const void* src, size_t bytes) {
  return copy(dst, src, bytes, Direction::kHostToDevice);
}
hipError_t hipMemcpyDtoH(void* dst, void* src, size_t bytes) { return copy(dst, src, bytes, Direction::kDeviceToHost); }
hipError_t hipMemcpyDtoD(void* dst, void* src, size_t bytes) {
  return copy(dst, src, bytes, Direction::kDeviceToDevice);
}
hipError_t hipMemsetD32(void* dst, int value, size_t count) { return fill_u32(dst, uint32_t(value), count); }

hipError_t hipStreamCreate(void** stream) { return create_stream(stream); }
hipError_t hipStreamCreateWithFlags(void** stream, unsigned) { return create_stream(stream); }
hipError_t hipStreamDestroy(void* stream) { return destroy_stream(stream); }
hipError_t hipStreamQuery(void* stream) { return query_stream(stream); }
hipError_t hipStreamSynchronize(void* stream) { return synchronize_stream(stream); }
hipError_t hipStreamWaitEvent(void*, void* event, unsigned) { return synchronize_event(event, false); }

hipError_t hipEventCreateWithFlags(void** event, unsigned) { return create_event(event); }
hipError_t hipEventRecord(void* event, void* stream) { return record_event(event, stream); }
hipError_t hipEventDestroy(void* event) { return destroy_event(event); }

}  // extern "C"
