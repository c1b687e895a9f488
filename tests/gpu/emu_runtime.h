// emu_runtime.h: what the emulating GPU runtimes (emu_libcuda.cpp, emu_libamdhip64.cpp) share,
// included after the kernel sources: calling a kernel with the runtime's `kernelParams`, the
// table entry a function handle points to, a loaded module (the ELF image's bytes), and the
// fake NCCL's per-stream progress behind streams and events.
#pragma once

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace emu_runtime {

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

// The table entry of `name`, or null when the module's image lacks the symbol (its name and NUL,
// as the string table holds it) or the table has no such kernel.
template <size_t N>
const KernelEntry* find_kernel(const KernelEntry (&table)[N], const Module& module, const char* name) {
  if (module.image.find(std::string(name) + '\0') == std::string::npos) return nullptr;
  for (const KernelEntry& k : table)
    if (std::strcmp(k.name, name) == 0) return &k;
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

}  // namespace emu_runtime
