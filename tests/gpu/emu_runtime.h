// emu_runtime.h: what the emulating GPU runtimes (emu_libcuda.cpp, emu_libamdhip64.cpp) share,
// included after the kernel sources: calling a kernel with the runtime's `kernelParams`, the
// table entry a function handle points to and the kernels both vendors have, a loaded module
// (the ELF image's bytes), launches, device memory (host memory), the fake NCCL's per-stream
// progress behind streams and events, and the counters of what the calls cost (`Counters`).
#pragma once

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

namespace emu_runtime {

// What the calls into this runtime cost, counted on this side of the ABI, independently of
// trident's own counting (src/gpu/tally.rs), under the names `WorkCounters::fields` gives them:
// launches (also per kernel function, as `launches.<name>`), copies each way and their bytes,
// memsets, synchronizations (the host waiting for the device: cuCtxSynchronize /
// hipDeviceSynchronize, synchronous copies to the host, cuMemFree / hipFree, cuEventSynchronize),
// allocations and their bytes, frees; and stream_synchronizations, which only communicators make.
// When the process exits they are written as `key value` lines to the file EMU_COUNTERS_FILE
// names (`%p` in it becomes the process id), if it is set.
class Counters {
 public:
  enum Key {
    kLaunches,
    kHostToDeviceCopies,
    kHostToDeviceBytes,
    kDeviceToHostCopies,
    kDeviceToHostBytes,
    kDeviceToDeviceCopies,
    kDeviceToDeviceBytes,
    kMemsets,
    kSynchronizations,
    kAllocations,
    kAllocationBytes,
    kFrees,
    kStreamSynchronizations,
    kKeys,
  };
  void add(Key key, uint64_t n = 1) { values_[key].fetch_add(n, std::memory_order_relaxed); }
  void launch(const char* kernel) {
    add(kLaunches);
    std::lock_guard<std::mutex> lock(mutex_);
    ++by_kernel_[kernel];
  }
  ~Counters() { write(); }

 private:
  void write() {
    const char* named = std::getenv("EMU_COUNTERS_FILE");
    if (!named || !*named) return;
    std::string path = named;
    if (size_t at = path.find("%p"); at != std::string::npos) path.replace(at, 2, std::to_string(getpid()));
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return;
    static constexpr const char* kNames[kKeys] = {
        "launches",      "host_to_device_copies",  "host_to_device_bytes",  "device_to_host_copies",
        "device_to_host_bytes", "device_to_device_copies", "device_to_device_bytes", "memsets",
        "synchronizations", "allocations",         "allocation_bytes",      "frees",
        "stream_synchronizations"};
    for (int k = 0; k < kKeys; ++k)
      std::fprintf(f, "%s %llu\n", kNames[k], static_cast<unsigned long long>(values_[k].load()));
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [kernel, n] : by_kernel_)
      std::fprintf(f, "launches.%s %llu\n", kernel.c_str(), static_cast<unsigned long long>(n));
    std::fclose(f);
  }
  std::atomic<uint64_t> values_[kKeys] = {};
  std::mutex mutex_;
  std::map<std::string, uint64_t> by_kernel_;
};
// This runtime's counters, written when the process exits.
inline Counters counters;

// The profiler API's capture range (`--profile`): each start or stop appends "start" or "stop" to
// the file EMU_PROFILER_LOG names (nothing when it is unset), so a test sees the calls a run made.
inline int profiler_mark(const char* what) {
  const char* path = std::getenv("EMU_PROFILER_LOG");
  if (path == nullptr) return 0;
  FILE* f = std::fopen(path, "a");
  if (f == nullptr) return 1;
  std::fprintf(f, "%s\n", what);
  std::fclose(f);
  return 0;
}

// Calls a kernel of type void(Args...) with its arguments read from kernelParams, as the
// runtimes do: params[i] points to argument i.
template <class... Args, size_t... I>
void launch_unpacked(void (*kernel)(Args...), dim3 grid, dim3 block, void** params, std::index_sequence<I...>) {
  emu::launch(grid, block, kernel, *static_cast<std::remove_cv_t<std::remove_reference_t<Args>>*>(params[I])...);
}
template <class... Args>
void launch_kernel(void (*kernel)(Args...), dim3 grid, dim3 block, void** params) {
  launch_unpacked(kernel, grid, block, params, std::index_sequence_for<Args...>{});
}

// A kernel the runtime can run: its name and a launcher that unpacks kernelParams.
struct KernelEntry {
  const char* name;
  void (*launch)(dim3, dim3, void**);
};
#define EMU_KERNEL(k) {#k, [](dim3 g, dim3 b, void** p) { emu_runtime::launch_kernel(k, g, b, p); }}

// Every extern "C" kernel both kernels-cuda/ and kernels-hip/ define (under the same names and
// arguments), and check gpu's smoke kernel; each runtime adds its own.
inline const KernelEntry kKernelsOfBothVendors[] = {
    EMU_KERNEL(trident_smoke_axpy),
    EMU_KERNEL(adamw_f32_bf16),
    EMU_KERNEL(adamw_multi_f32_bf16),
    EMU_KERNEL(zero_multi_u32),
    EMU_KERNEL(clip_scale_f64),
    EMU_KERNEL(attention_bwd_delta_bf16),
    EMU_KERNEL(attention_bwd_dkv_bf16_d32),
    EMU_KERNEL(attention_bwd_dkv_bf16_d64),
    EMU_KERNEL(attention_bwd_dkv_bf16_d128),
    EMU_KERNEL(attention_bwd_dq_bf16_d32),
    EMU_KERNEL(attention_bwd_dq_bf16_d64),
    EMU_KERNEL(attention_bwd_dq_bf16_d128),
    EMU_KERNEL(attention_fwd_bf16_d32),
    EMU_KERNEL(attention_fwd_bf16_d64),
    EMU_KERNEL(attention_fwd_bf16_d128),
    EMU_KERNEL(attention_fwd_drop_bf16_d32),
    EMU_KERNEL(attention_fwd_drop_bf16_d64),
    EMU_KERNEL(attention_fwd_drop_bf16_d128),
    EMU_KERNEL(attention_bwd_dkv_drop_bf16_d32),
    EMU_KERNEL(attention_bwd_dkv_drop_bf16_d64),
    EMU_KERNEL(attention_bwd_dkv_drop_bf16_d128),
    EMU_KERNEL(attention_bwd_dq_drop_bf16_d32),
    EMU_KERNEL(attention_bwd_dq_drop_bf16_d64),
    EMU_KERNEL(attention_bwd_dq_drop_bf16_d128),
    EMU_KERNEL(attention_fwd_docs_bf16_d32),
    EMU_KERNEL(attention_fwd_docs_bf16_d64),
    EMU_KERNEL(attention_fwd_docs_bf16_d128),
    EMU_KERNEL(attention_fwd_drop_docs_bf16_d32),
    EMU_KERNEL(attention_fwd_drop_docs_bf16_d64),
    EMU_KERNEL(attention_fwd_drop_docs_bf16_d128),
    EMU_KERNEL(attention_bwd_dkv_docs_bf16_d32),
    EMU_KERNEL(attention_bwd_dkv_docs_bf16_d64),
    EMU_KERNEL(attention_bwd_dkv_docs_bf16_d128),
    EMU_KERNEL(attention_bwd_dkv_drop_docs_bf16_d32),
    EMU_KERNEL(attention_bwd_dkv_drop_docs_bf16_d64),
    EMU_KERNEL(attention_bwd_dkv_drop_docs_bf16_d128),
    EMU_KERNEL(attention_bwd_dq_docs_bf16_d32),
    EMU_KERNEL(attention_bwd_dq_docs_bf16_d64),
    EMU_KERNEL(attention_bwd_dq_docs_bf16_d128),
    EMU_KERNEL(attention_bwd_dq_drop_docs_bf16_d32),
    EMU_KERNEL(attention_bwd_dq_drop_docs_bf16_d64),
    EMU_KERNEL(attention_bwd_dq_drop_docs_bf16_d128),
    EMU_KERNEL(attention_block_fwd_bf16_d32),
    EMU_KERNEL(attention_block_fwd_bf16_d64),
    EMU_KERNEL(attention_block_fwd_bf16_d128),
    EMU_KERNEL(attention_block_fwd_drop_bf16_d32),
    EMU_KERNEL(attention_block_fwd_drop_bf16_d64),
    EMU_KERNEL(attention_block_fwd_drop_bf16_d128),
    EMU_KERNEL(attention_block_bwd_dkv_bf16_d32),
    EMU_KERNEL(attention_block_bwd_dkv_bf16_d64),
    EMU_KERNEL(attention_block_bwd_dkv_bf16_d128),
    EMU_KERNEL(attention_block_bwd_dkv_drop_bf16_d32),
    EMU_KERNEL(attention_block_bwd_dkv_drop_bf16_d64),
    EMU_KERNEL(attention_block_bwd_dkv_drop_bf16_d128),
    EMU_KERNEL(attention_block_bwd_dq_bf16_d32),
    EMU_KERNEL(attention_block_bwd_dq_bf16_d64),
    EMU_KERNEL(attention_block_bwd_dq_bf16_d128),
    EMU_KERNEL(attention_block_bwd_dq_drop_bf16_d32),
    EMU_KERNEL(attention_block_bwd_dq_drop_bf16_d64),
    EMU_KERNEL(attention_block_bwd_dq_drop_bf16_d128),
    EMU_KERNEL(cast_f32_to_bf16),
    EMU_KERNEL(cast_bf16_to_f32),
    EMU_KERNEL(embedding_fwd_bf16),
    EMU_KERNEL(embedding_bwd_wte_bf16),
    EMU_KERNEL(embedding_bwd_wpe_bf16),
    EMU_KERNEL(gelu_fwd_bf16),
    EMU_KERNEL(gelu_bwd_bf16),
    EMU_KERNEL(gemm_fwd_bf16_f32out),
    EMU_KERNEL(gemm_fwd_bf16),
    EMU_KERNEL(gemm_bwd_input_bf16),
    EMU_KERNEL(gemm_bwd_input_bf16_bf16out),
    EMU_KERNEL(gemm_bwd_weight_bf16),
    EMU_KERNEL(layernorm_fwd_bf16),
    EMU_KERNEL(layernorm_bwd_bf16),
    EMU_KERNEL(rmsnorm_fwd_bf16),
    EMU_KERNEL(rmsnorm_bwd_bf16),
    EMU_KERNEL(swiglu_fwd_bf16),
    EMU_KERNEL(swiglu_bwd_bf16),
    EMU_KERNEL(rope_fwd_bf16),
    EMU_KERNEL(rope_bwd_bf16),
    EMU_KERNEL(xent_max_bf16),
    EMU_KERNEL(xent_partials_bf16),
    EMU_KERNEL(xent_bwd_bf16),
    EMU_KERNEL(add_f32),
    EMU_KERNEL(add_assign_f32),
    EMU_KERNEL(attention_merge_f32),
    EMU_KERNEL(add_bias_f32),
    EMU_KERNEL(bias_dropout_add_f32),
    EMU_KERNEL(dropout_f32),
    EMU_KERNEL(round_bf16_f32),
    EMU_KERNEL(gelu_fwd_f32),
    EMU_KERNEL(gelu_bwd_f32),
    EMU_KERNEL(embedding_fwd_f32),
    EMU_KERNEL(position_fwd_f32),
    EMU_KERNEL(position_fwd_bf16),
    EMU_KERNEL(layernorm_apply_f32),
    EMU_KERNEL(layernorm_bwd_apply_dx_f32),
    EMU_KERNEL(xent_bwd_f32),
    EMU_KERNEL(embedding_bwd_f32),
    EMU_KERNEL(position_bwd_f32),
    EMU_KERNEL(column_sum_add_f32),
    EMU_KERNEL(column_sum_add_bf16),
    EMU_KERNEL(layernorm_bwd_params_f32),
    EMU_KERNEL(layernorm_fwd_f32),
    EMU_KERNEL(layernorm_bwd_dx_f32),
    EMU_KERNEL(layernorm_sums_f32),
    EMU_KERNEL(layernorm_bwd_sums_f32),
    EMU_KERNEL(xent_max_f32),
    EMU_KERNEL(xent_partials_f32),
    EMU_KERNEL(sum_squares_f32),
    EMU_KERNEL(sum_into_f64),
    EMU_KERNEL(xent_loss_f64),
};

struct Module {
  std::string image;  // the ELF file's bytes
};

// The size of an ELF64 image from its header: the section header table ends the file (as in
// every CUBIN NVRTC and every code object hipRTC writes); the program headers are checked too.
inline size_t elf_size(const unsigned char* p) {
  uint64_t shoff, phoff;
  uint16_t shentsize, shnum, phentsize, phnum;
  std::memcpy(&phoff, p + 0x20, 8);
  std::memcpy(&shoff, p + 0x28, 8);
  std::memcpy(&phentsize, p + 0x36, 2);
  std::memcpy(&phnum, p + 0x38, 2);
  std::memcpy(&shentsize, p + 0x3a, 2);
  std::memcpy(&shnum, p + 0x3c, 2);
  size_t end = std::max<size_t>(shoff + size_t(shentsize) * shnum, phoff + size_t(phentsize) * phnum);
  return std::max<size_t>(end, 64);
}

// A module of the image if it is a 64-bit ELF file (its bytes kept), else null.
inline Module* load_elf(const void* image) {
  const auto* p = static_cast<const unsigned char*>(image);
  if (!p || std::memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return nullptr;
  return new Module{std::string(reinterpret_cast<const char*>(p), elf_size(p))};
}

// The table entry of `name` among the kernels of both vendors and the runtime's own
// (`vendor_only`), or null when the module's image lacks the symbol (its name and NUL, as the
// string table holds it) or no table has such a kernel.
inline const KernelEntry* find_kernel(const Module& module, const char* name, const KernelEntry* vendor_only = nullptr,
                                      size_t vendor_only_count = 0) {
  if (module.image.find(std::string(name) + '\0') == std::string::npos) return nullptr;
  for (const KernelEntry& k : kKernelsOfBothVendors)
    if (std::strcmp(k.name, name) == 0) return &k;
  for (size_t i = 0; i < vendor_only_count; ++i)
    if (std::strcmp(vendor_only[i].name, name) == 0) return &vendor_only[i];
  return nullptr;
}

// Streams. Kernels and copies run on the host when called, so the compute stream never has work
// outstanding. Communication streams may: when the fake NCCL (tests/gpu/fake_libnccl.c, loaded
// from TRIDENT_NCCL or TRIDENT_RCCL) runs asynchronously (FAKE_NCCL_ASYNC=1), its operations
// finish later on worker threads, and its fake_nccl_stream_progress() says how many of a stream's
// operations are submitted and finished. An event recorded on such a stream completes when the
// operations submitted before it have; queries answer "not ready" until then, synchronizations
// wait, and a stream's wait for an event blocks the host (the compute stream, being the host,
// cannot run ahead of the event). Freeing memory and synchronizing the device wait for every
// outstanding operation, as the real calls synchronize the device.
using NcclProgress = void (*)(void*, uint64_t*, uint64_t*);
using NcclPending = int (*)();
template <typename F>
F nccl_symbol(const char* name) {
  for (const char* var : {"TRIDENT_NCCL", "TRIDENT_RCCL"}) {
    const char* path = std::getenv(var);
    void* h = path ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : nullptr;
    if (h) return reinterpret_cast<F>(dlsym(h, name));
  }
  return nullptr;
}
// The fake NCCL's progress function once it is loaded (looked up again until it is).
inline NcclProgress progress_fn() {
  static NcclProgress progress = nullptr;
  if (!progress) progress = nccl_symbol<NcclProgress>("fake_nccl_stream_progress");
  return progress;
}
// Operations submitted on `stream` so far (0 without the fake NCCL or for the null stream).
inline uint64_t submitted_on(void* stream) {
  NcclProgress progress = stream ? progress_fn() : nullptr;
  uint64_t submitted = 0, finished = 0;
  if (progress) progress(stream, &submitted, &finished);
  return submitted;
}
// Whether the first `target` operations submitted on `stream` (all of them for UINT64_MAX) have
// finished.
inline bool stream_done(void* stream, uint64_t target) {
  NcclProgress progress = stream ? progress_fn() : nullptr;
  if (!progress) return true;
  uint64_t submitted = 0, finished = 0;
  progress(stream, &submitted, &finished);
  return finished >= (target == UINT64_MAX ? submitted : target);
}
inline void wait_stream(void* stream, uint64_t target) {
  while (!stream_done(stream, target)) sched_yield();
}
inline void wait_device_idle() {
  static NcclPending pending = nullptr;
  if (!pending) pending = nccl_symbol<NcclPending>("fake_nccl_pending");
  while (pending && pending() > 0) sched_yield();
}
// EMU_STREAM_LOG=path appends "<pid> launch <stream>" the first time a kernel is launched on a
// stream (every time with EMU_STREAM_LOG_LAUNCHES=all), "<pid> record <event> <stream>" per event
// record and "<pid> wait <stream> <event>" per stream wait (the fake NCCL adds "<pid> nccl <op>
// <stream>"), so a test sees which streams the compute and the collectives run on, the events
// that order them, and what compute was enqueued while a collective was in flight.
inline void stream_log(const char* kind, void* a, void* b, bool pair = true) {
  const char* path = std::getenv("EMU_STREAM_LOG");
  if (!path || !*path) return;
  char line[128];
  int len = pair ? std::snprintf(line, sizeof line, "%d %s %p %p\n", int(getpid()), kind, a, b)
                 : std::snprintf(line, sizeof line, "%d %s %p\n", int(getpid()), kind, a);
  FILE* f = std::fopen(path, "a");
  if (!f) return;
  std::fwrite(line, 1, size_t(len), f);
  std::fclose(f);
}
inline void log_launch_stream(void* stream) {
  static std::mutex lock;
  static std::map<void*, bool> seen;
  std::lock_guard<std::mutex> hold(lock);
  static const bool every = [] {
    const char* v = std::getenv("EMU_STREAM_LOG_LAUNCHES");
    return v && std::strcmp(v, "all") == 0;
  }();
  if (!seen[stream] || every) {
    seen[stream] = true;
    stream_log("launch", stream, nullptr, false);
  }
}

// An event: the host's clock when recorded (elapsed time is the difference: what the benches
// read) and the point of its stream it marks.
struct Event {
  std::chrono::steady_clock::time_point at;
  void* stream;
  uint64_t target;
  void record(void* s) {
    at = std::chrono::steady_clock::now();
    stream = s;
    target = submitted_on(s);
  }
  bool done() const { return stream_done(stream, target); }
  void wait() const { wait_stream(stream, target); }
};

// The calls both runtimes make the same, under their own names and argument types (the entry
// points of emu_libcuda.cpp and emu_libamdhip64.cpp forward to these). Each returns one of the
// error codes below, which have the same numbers in both APIs (HIP took CUDA's).
enum : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidImage = 200,
  kInvalidHandle = 400,
  kNotFound = 500,
  kNotReady = 600,
};

inline int unload_module(void* module) {
  delete static_cast<Module*>(module);
  return kSuccess;
}
// The function `name` of `module`: its table entry among the kernels of both vendors and the
// runtime's own (`vendor_only`).
inline int get_function(void** function, void* module, const char* name, const KernelEntry* vendor_only = nullptr,
                        size_t vendor_only_count = 0) {
  if (!module || !name || !function) return kInvalidHandle;
  const KernelEntry* k = find_kernel(*static_cast<Module*>(module), name, vendor_only, vendor_only_count);
  if (!k) return kNotFound;
  *function = const_cast<KernelEntry*>(k);
  return kSuccess;
}
// Runs the kernel a function handle points to with `shared_bytes` of dynamic shared memory
// (emu::launch_dynamic's); refuses more dynamic shared memory than `max_dynamic_shared` (the
// function's allowance: none unless the runtime says otherwise), `extra`, an empty grid or block,
// more than 1024 threads per block, and grid y or z above `max_grid_yz`.
inline int launch(void* function, dim3 grid, dim3 block, unsigned shared_bytes, void** params, void** extra,
                  unsigned max_grid_yz, unsigned max_dynamic_shared = 0) {
  if (!function) return kInvalidValue;
  counters.launch(static_cast<KernelEntry*>(function)->name);
  if (extra || shared_bytes > max_dynamic_shared) return kInvalidValue;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) return kInvalidValue;
  if (block.x * block.y * block.z > 1024 || grid.y > max_grid_yz || grid.z > max_grid_yz) return kInvalidValue;
  emu::next_launch_dynamic_shared = shared_bytes;
  static_cast<KernelEntry*>(function)->launch(grid, block, params);
  return kSuccess;
}

// Device memory is host memory, 256-byte aligned as the runtimes' allocations are; freeing it
// waits for every outstanding operation, as the real calls synchronize the device.
inline int malloc_device(void** pointer, size_t bytes) {
  if (!pointer) return kInvalidValue;
  *pointer = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!*pointer) return kOutOfMemory;
  counters.add(Counters::kAllocations);
  counters.add(Counters::kAllocationBytes, bytes);
  return kSuccess;
}
inline int free_device(void* pointer) {
  counters.add(Counters::kFrees);
  counters.add(Counters::kSynchronizations);
  wait_device_idle();
  std::free(pointer);
  return kSuccess;
}
// Which way a copy goes; a synchronous copy to the host makes the host wait for the device.
enum class Direction { kHostToDevice, kDeviceToHost, kDeviceToDevice };
inline int copy(void* dst, const void* src, size_t bytes, Direction direction, bool synchronous = true) {
  switch (direction) {
    case Direction::kHostToDevice:
      counters.add(Counters::kHostToDeviceCopies);
      counters.add(Counters::kHostToDeviceBytes, bytes);
      break;
    case Direction::kDeviceToHost:
      counters.add(Counters::kDeviceToHostCopies);
      counters.add(Counters::kDeviceToHostBytes, bytes);
      if (synchronous) counters.add(Counters::kSynchronizations);
      break;
    case Direction::kDeviceToDevice:
      counters.add(Counters::kDeviceToDeviceCopies);
      counters.add(Counters::kDeviceToDeviceBytes, bytes);
      break;
  }
  if (bytes) std::memmove(dst, src, bytes);
  return kSuccess;
}
inline int fill_u32(void* dst, uint32_t value, size_t count) {
  counters.add(Counters::kMemsets);
  auto* p = static_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
  return kSuccess;
}
inline int synchronize_device() {
  counters.add(Counters::kSynchronizations);
  wait_device_idle();
  return kSuccess;
}

// A stream is a handle of its own, so work waited for on the wrong stream shows.
inline int create_stream(void** stream) {
  *stream = new char;
  return kSuccess;
}
inline int destroy_stream(void* stream) {
  delete static_cast<char*>(stream);
  return kSuccess;
}
inline int query_stream(void* stream) { return stream_done(stream, UINT64_MAX) ? kSuccess : kNotReady; }
inline int synchronize_stream(void* stream) {
  counters.add(Counters::kStreamSynchronizations);
  wait_stream(stream, UINT64_MAX);
  return kSuccess;
}

inline int create_event(void** event) {
  *event = new Event{std::chrono::steady_clock::now(), nullptr, 0};
  return kSuccess;
}
inline int record_event(void* event, void* stream) {
  stream_log("record", event, stream);
  static_cast<Event*>(event)->record(stream);
  return kSuccess;
}
inline int query_event(void* event) { return static_cast<Event*>(event)->done() ? kSuccess : kNotReady; }
// Synchronizing with an event, or making a stream wait for it, blocks the host until it is done
// (only the first is counted: on a GPU a stream's wait does not block the host).
inline int synchronize_event(void* event, bool counted = true) {
  if (counted) counters.add(Counters::kSynchronizations);
  static_cast<Event*>(event)->wait();
  return kSuccess;
}
inline int elapsed_ms(float* ms, void* start, void* end) {
  auto d = static_cast<Event*>(end)->at - static_cast<Event*>(start)->at;
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return kSuccess;
}
inline int destroy_event(void* event) {
  delete static_cast<Event*>(event);
  return kSuccess;
}

}  // namespace emu_runtime
