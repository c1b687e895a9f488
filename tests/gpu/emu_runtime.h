// emu_runtime.h: what the emulating GPU runtimes (emu_libcuda.cpp, emu_libamdhip64.cpp) share,
// included after the kernel sources: calling a kernel with the runtime's `kernelParams`, the
// table entry a function handle points to, and a loaded module (the ELF image's bytes).
#pragma once

#include <algorithm>
#include <cstdint>
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

}  // namespace emu_runtime
