// simt.h: the SIMT model on the CPU, so that the kernels in kernels-cuda/ run unchanged under
// g++ (-std=c++20, -DTRIDENT_EMU) in `cargo test` on a machine without a GPU.
//
// Model. A launch runs its blocks on a small pool of OS threads; each block's threads are fibers
// on one OS thread, switched cooperatively by a hand-written x86-64 context switch (no syscalls,
// so a 128-thread block costs microseconds per barrier). A fiber runs until it reaches a
// synchronisation point and then yields to the block's scheduler:
//   - __syncthreads(): the fiber waits until every live thread of the block waits (threads that
//     have returned no longer count, as on the hardware);
//   - warp collectives (__shfl_*_sync, __syncwarp, votes, and the tensor-core and ldmatrix
//     instructions of ptx.h): each lane deposits its operand in the warp's slot; the last lane
//     to arrive computes every lane's result at once, so the collective reads memory at one
//     instant, as the warp-wide instruction does, and releases the others.
// Even blocks give every runnable fiber a turn per pass; odd blocks run one warp as far as it
// goes before the next (warp_first_schedule below). A collective that can never complete (a lane
// returned, or sits at __syncthreads) and a barrier that can never open are reported as a
// deadlock with the block and thread states, and the process aborts: divergent barriers are bugs
// the emulation finds rather than hides.
//
// Wave size. TRIDENT_EMU_WAVE_SIZE (a compile-time parameter, 32 unless defined) is the number
// of lanes a warp collective spans: 32 for CUDA warps, 64 for AMD wavefronts (kernels-hip/emu/
// hip.h defines it as 64). Lane masks are 64-bit for wave64 (emu::LaneMask), as HIP's __ballot.
//
// __shared__ is `static thread_local`: one copy per OS thread, which is one block at a time, and
// launches do not nest. Dynamic shared memory (`extern __shared__` on the GPU; base.cuh's
// DYNAMIC_SHARED, tma.cuh's dynamic_shared) is a buffer per OS thread of the size the launch
// gives (launch_dynamic), filled with a 0xA5 pattern at the launch's start so that a kernel
// reading what it never wrote gets garbage, as on the GPU; a kernel that uses more than the
// launch gave is reported (dynamic_shared).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#error "the SIMT emulation's context switch is written for x86-64"
#endif

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#ifndef TRIDENT_EMU_WAVE_SIZE
#define TRIDENT_EMU_WAVE_SIZE 32
#endif
static_assert(TRIDENT_EMU_WAVE_SIZE == 32 || TRIDENT_EMU_WAVE_SIZE == 64, "a wave has 32 or 64 lanes");

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline constexpr int warpSize = TRIDENT_EMU_WAVE_SIZE;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local

// The CUDA math functions the host library lacks.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

namespace emu {

inline constexpr unsigned kWaveSize = TRIDENT_EMU_WAVE_SIZE;
using LaneMask = std::conditional_t<kWaveSize == 64, uint64_t, uint32_t>;
inline constexpr LaneMask kAllLanes = ~LaneMask(0);
// The mask of the first `lanes` lanes of a wave.
inline constexpr LaneMask lanes_mask(unsigned lanes) { return lanes >= kWaveSize ? kAllLanes : ((LaneMask(1) << lanes) - 1); }

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emu: block (%u,%u,%u) thread (%u,%u,%u): %s\n", blockIdx.x, blockIdx.y, blockIdx.z,
               threadIdx.x, threadIdx.y, threadIdx.z, what);
  std::fflush(stderr);
  std::abort();
}

// ---- context switch (x86-64 System V) -------------------------------------------------------
// switch_stack saves the callee-saved registers, MXCSR and the x87 control word on the current
// stack, stores the stack pointer in *save, loads `next` and restores the same set from there.
extern "C" void trident_emu_switch_stack(void** save, void* next);
asm(R"(
  .text
  .p2align 4
  .globl trident_emu_switch_stack
  .type trident_emu_switch_stack,@function
trident_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  leaq -8(%rsp), %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw 4(%rsp)
  ldmxcsr (%rsp)
  leaq 8(%rsp), %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size trident_emu_switch_stack, .-trident_emu_switch_stack
)");

enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Done };

// A cp.async copy that has been issued but not yet waited for (see ptx.h).
struct PendingCopy {
  void* dst;
  const void* src;
  unsigned bytes, src_bytes;
  unsigned group;
};

struct Fiber {
  void* sp = nullptr;
  State state = State::Runnable;
  dim3 tid;
  unsigned linear = 0;
  unsigned collective_count = 0;  // which of the warp's two slots the next collective uses
  unsigned committed_groups = 0;  // cp.async groups committed so far
  std::vector<PendingCopy> copies;
  std::unique_ptr<unsigned char[]> stack;
};

// One slot per parity: a lane can be at most one collective ahead of the slowest lane, so two
// slots keep a fast lane's next operand from overwriting one that is still being read.
inline constexpr size_t kOperandBytes = 48, kResultBytes = 16;
struct WarpSlot {
  alignas(16) unsigned char operand[kWaveSize][kOperandBytes];
  alignas(16) unsigned char result[kWaveSize][kResultBytes];
  int kind[kWaveSize];
  unsigned arrived = 0;
};
struct Warp {
  unsigned lanes = 0;
  WarpSlot slot[2];
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  unsigned live = 0;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
};
inline thread_local Block* block;

// The dynamic shared memory of the block running on this OS thread (1024-byte aligned), and the
// amount the next launch from this thread gives each block (set by launch_dynamic).
inline thread_local size_t dynamic_shared_bytes = 0;
inline thread_local unsigned char* dynamic_shared_base = nullptr;
inline thread_local size_t next_launch_dynamic_shared = 0;

inline Fiber& self() { return *block->current; }
inline unsigned lane_id() { return self().linear % kWaveSize; }

inline void yield_to_scheduler() {
  Fiber& f = self();
  trident_emu_switch_stack(&f.sp, block->scheduler_sp);
}

[[noreturn]] inline void fiber_main() {
  block->body(block->body_arg);
  Fiber& f = self();
  f.state = State::Done;
  f.copies.clear();
  block->live--;
  trident_emu_switch_stack(&f.sp, block->scheduler_sp);
  __builtin_unreachable();
}

inline constexpr size_t kStackBytes = 128 * 1024;

// Fiber stacks outlive a launch: a launch takes them from this pool and gives them back, so a
// stack is allocated once per fiber the busiest launch had. Allocating 128 KiB a fiber a launch
// (an mmap each, at that size) made the kernel's page faults and unmaps a third of a short
// launch's time.
inline std::mutex stack_pool_mutex;
inline std::vector<std::unique_ptr<unsigned char[]>> stack_pool;

inline std::unique_ptr<unsigned char[]> take_stack() {
  std::lock_guard<std::mutex> lock(stack_pool_mutex);
  if (stack_pool.empty()) return std::unique_ptr<unsigned char[]>(new unsigned char[kStackBytes]);
  auto stack = std::move(stack_pool.back());
  stack_pool.pop_back();
  return stack;
}

inline void give_back_stacks(std::vector<Fiber>& fibers) {
  std::lock_guard<std::mutex> lock(stack_pool_mutex);
  for (auto& f : fibers) stack_pool.push_back(std::move(f.stack));
}

inline void prepare_stack(Fiber& f) {
  // The initial frame mirrors what trident_emu_switch_stack pops: the FP control words, six
  // callee-saved registers and a return address (fiber_main). After its `ret` the stack pointer
  // is 8 mod 16, as at any function entry.
  uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.get()) + kStackBytes) & ~uintptr_t(15);
  uint64_t* frame = reinterpret_cast<uint64_t*>(top - 9 * sizeof(uint64_t));
  frame[0] = 0x1F80ull | (0x037Full << 32);  // default MXCSR; x87 control word in the upper half
  for (int i = 1; i <= 6; ++i) frame[i] = 0;
  frame[7] = reinterpret_cast<uint64_t>(&fiber_main);
  frame[8] = 0;
  f.sp = frame;
}

// The order in which a block's fibers take turns. Lockstep (even blocks, by linear index): every
// runnable fiber once per pass, so the warps advance about one collective at a time. Warp first
// (odd blocks): a warp runs until all its threads wait at a barrier (or return) before the next
// warp starts, so one warp gets a whole phase ahead of the others, as on the hardware when warps
// are scheduled unevenly: a shared-memory write not ordered by a barrier after another warp's
// last read of the same place (a cp.async stage refilled too early) lands before that read.
inline bool warp_first_schedule() {
  const unsigned linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return linear % 2 == 1;
}

inline unsigned count(unsigned n, dim3 d) { return n ? d.x * d.y * d.z : 0; }
inline dim3 unflatten(unsigned i, dim3 d) { return dim3(i % d.x, (i / d.x) % d.y, i / (d.x * d.y)); }

[[noreturn]] inline void deadlock(Block& b) {
  unsigned at_barrier = 0, at_warp = 0, done = 0;
  for (auto& f : b.fibers) {
    at_barrier += f.state == State::AtBarrier;
    at_warp += f.state == State::AtWarp;
    done += f.state == State::Done;
  }
  std::fprintf(stderr,
               "emu: deadlock in block (%u,%u,%u): %u threads at __syncthreads, %u in a warp collective or mbarrier "
               "wait, %u returned (a barrier or warp collective in divergent code, a lane that returned early, or "
               "an mbarrier phase that cannot complete)\n",
               blockIdx.x, blockIdx.y, blockIdx.z, at_barrier, at_warp, done);
  std::fflush(stderr);
  std::abort();
}

inline void run_block(Block& b) {
  for (auto& f : b.fibers) {
    f.state = State::Runnable;
    f.collective_count = 0;
    f.committed_groups = 0;
    f.copies.clear();
    prepare_stack(f);
  }
  for (auto& w : b.warps) w.slot[0].arrived = w.slot[1].arrived = 0;
  b.live = unsigned(b.fibers.size());
  const bool warp_first = warp_first_schedule();
  while (b.live > 0) {
    bool ran = false;
    for (size_t i = 0; i < b.fibers.size();) {
      Fiber& f = b.fibers[i];
      if (f.state != State::Runnable) {
        ++i;
        continue;
      }
      b.current = &f;
      threadIdx = f.tid;
      trident_emu_switch_stack(&b.scheduler_sp, f.sp);
      ran = true;
      // Warp first: when this fiber completed a collective (its warp's first lane runnable
      // again), the warp goes on from its first lane.
      const size_t first = i - i % kWaveSize;
      i = warp_first && first < i && b.fibers[first].state == State::Runnable ? first : i + 1;
    }
    if (ran || b.live == 0) continue;
    // Nothing can run: either every live thread waits at __syncthreads (open it) or no
    // progress is possible.
    unsigned waiting = 0;
    for (auto& f : b.fibers) waiting += f.state == State::AtBarrier;
    if (waiting != b.live) deadlock(b);
    for (auto& f : b.fibers)
      if (f.state == State::AtBarrier) f.state = State::Runnable;
  }
}

template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block_dim, Kernel kernel, Args... args) {
  const unsigned threads = count(1, block_dim), blocks = count(1, grid);
  if (threads == 0 || threads > 1024) {
    std::fprintf(stderr, "emu: launch with %u threads per block (1..1024 allowed)\n", threads);
    std::abort();
  }
  const unsigned workers = std::max(1u, std::min(blocks, std::max(1u, std::thread::hardware_concurrency())));
  const size_t dynamic_bytes = std::exchange(next_launch_dynamic_shared, 0);
  std::atomic<unsigned> next{0};
  auto body = [&] { kernel(args...); };
  auto worker = [&] {
    std::unique_ptr<unsigned char[]> dynamic(new unsigned char[dynamic_bytes + 1024]);
    dynamic_shared_bytes = dynamic_bytes;
    dynamic_shared_base = dynamic.get() + (1024 - reinterpret_cast<uintptr_t>(dynamic.get()) % 1024);
    std::memset(dynamic_shared_base, 0xA5, dynamic_bytes);
    Block b;
    b.fibers.resize(threads);
    for (unsigned t = 0; t < threads; ++t) {
      b.fibers[t].tid = unflatten(t, block_dim);
      b.fibers[t].linear = t;
      b.fibers[t].stack = take_stack();
    }
    b.warps.resize((threads + kWaveSize - 1) / kWaveSize);
    for (unsigned w = 0; w < b.warps.size(); ++w) b.warps[w].lanes = std::min(kWaveSize, threads - kWaveSize * w);
    b.body = [](void* p) { (*static_cast<decltype(body)*>(p))(); };
    b.body_arg = &body;
    block = &b;
    blockDim = block_dim;
    gridDim = grid;
    for (unsigned i; (i = next.fetch_add(1)) < blocks;) {
      blockIdx = unflatten(i, grid);
      run_block(b);
    }
    block = nullptr;
    dynamic_shared_bytes = 0;
    dynamic_shared_base = nullptr;
    give_back_stacks(b.fibers);
  };
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
}

// `extern __shared__` of the GPU build: the launch's dynamic shared memory (launch_dynamic),
// 1024-byte aligned, for a kernel that uses `bytes` of it; using more than the launch gave is
// reported (the GPU build of base.cuh's DYNAMIC_SHARED traps on the same check).
inline unsigned char* dynamic_shared(size_t bytes) {
  if (bytes > dynamic_shared_bytes) {
    char what[160];
    std::snprintf(what, sizeof what, "the kernel uses %zu bytes of dynamic shared memory, the launch gave %zu", bytes,
                  dynamic_shared_bytes);
    fail(what);
  }
  return dynamic_shared_base;
}

// launch with `bytes` of dynamic shared memory per block.
template <class Kernel, class... Args>
void launch_dynamic(size_t bytes, dim3 grid, dim3 block_dim, Kernel kernel, Args... args) {
  next_launch_dynamic_shared = bytes;
  launch(grid, block_dim, kernel, args...);
}

// ---- warp collectives ---------------------------------------------------------------------
// Every lane of the warp passes its operand; `compute(operands, results, lanes)` runs once, in
// the last lane to arrive, over all lanes' operands. The mask must name every lane of the warp:
// partial-warp collectives are not used by the kernels and are not emulated.
template <class Operand, class Result, class Compute>
Result warp_collective(int kind, LaneMask mask, const Operand& operand, Compute compute) {
  static_assert(sizeof(Operand) <= kOperandBytes && sizeof(Result) <= kResultBytes);
  static_assert(std::is_trivially_copyable_v<Operand> && std::is_trivially_copyable_v<Result>);
  Fiber& f = self();
  Warp& w = block->warps[f.linear / kWaveSize];
  const unsigned lane = f.linear % kWaveSize;
  const LaneMask full = lanes_mask(w.lanes);
  if (mask != kAllLanes && mask != full) fail("warp collective with a partial mask (not emulated)");
  WarpSlot& s = w.slot[f.collective_count++ & 1];
  std::memcpy(s.operand[lane], &operand, sizeof(Operand));
  s.kind[lane] = kind;
  if (++s.arrived == w.lanes) {
    s.arrived = 0;
    Operand ops[kWaveSize];
    Result res[kWaveSize];
    for (unsigned l = 0; l < w.lanes; ++l) {
      if (s.kind[l] != kind) fail("lanes of one warp reached different warp collectives");
      std::memcpy(&ops[l], s.operand[l], sizeof(Operand));
    }
    compute(ops, res, w.lanes);
    for (unsigned l = 0; l < w.lanes; ++l) std::memcpy(s.result[l], &res[l], sizeof(Result));
    const unsigned first = f.linear - lane;
    for (unsigned l = 0; l < w.lanes; ++l) {
      Fiber& other = block->fibers[first + l];
      if (&other != &f) other.state = State::Runnable;
    }
  } else {
    f.state = State::AtWarp;
    yield_to_scheduler();
  }
  Result r;
  std::memcpy(&r, s.result[lane], sizeof(Result));
  return r;
}

enum Kind : int { kSyncWarp = 1, kShfl, kVote, kMma, kLdmatrix };
enum class Shuffle { Index, Up, Down, Xor };

template <class T>
T shuffle(Shuffle how, LaneMask mask, T value, int arg, int width) {
  static_assert(sizeof(T) <= 8);
  if (width < 1 || width > int(kWaveSize) || (width & (width - 1))) fail("shuffle width must be a power of two <= the wave size");
  struct Operand {
    T value;
    int source;
  };
  const int lane = int(lane_id());
  const int segment = lane & ~(width - 1);
  int source = lane;
  switch (how) {
    case Shuffle::Index: source = segment + (arg & (width - 1)); break;
    case Shuffle::Up: source = lane - arg >= segment ? lane - arg : lane; break;
    case Shuffle::Down: source = lane + arg < segment + width ? lane + arg : lane; break;
    case Shuffle::Xor: source = (lane ^ arg) < segment + width ? (lane ^ arg) : lane; break;
  }
  return warp_collective<Operand, T>(kShfl, mask, Operand{value, source},
                                     [](const Operand* ops, T* res, unsigned lanes) {
                                       for (unsigned l = 0; l < lanes; ++l) {
                                         // A source lane past a partial warp's end reads the lane itself.
                                         unsigned s = unsigned(ops[l].source);
                                         res[l] = ops[s < lanes ? s : l].value;
                                       }
                                     });
}

enum class Vote { Any, All, Ballot };
inline LaneMask vote(Vote how, LaneMask mask, bool predicate) {
  return warp_collective<int, LaneMask>(kVote, mask, int(predicate), [how](const int* ops, LaneMask* res, unsigned lanes) {
    LaneMask ballot = 0;
    for (unsigned l = 0; l < lanes; ++l) ballot |= LaneMask(ops[l] != 0) << l;
    const LaneMask full = lanes_mask(lanes);
    const LaneMask r = how == Vote::Ballot ? ballot : how == Vote::Any ? LaneMask(ballot != 0) : LaneMask(ballot == full);
    for (unsigned l = 0; l < lanes; ++l) res[l] = r;
  });
}

}  // namespace emu

inline void __syncthreads() {
  emu::Fiber& f = emu::self();
  f.state = emu::State::AtBarrier;
  emu::yield_to_scheduler();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  emu::warp_collective<int, int>(emu::kSyncWarp, mask, 0, [](const int*, int* res, unsigned lanes) {
    for (unsigned l = 0; l < lanes; ++l) res[l] = 0;
  });
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu::shuffle(emu::Shuffle::Index, mask, v, src, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::shuffle(emu::Shuffle::Up, mask, v, int(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::shuffle(emu::Shuffle::Down, mask, v, int(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu::shuffle(emu::Shuffle::Xor, mask, v, lane_mask, width);
}
inline int __any_sync(unsigned mask, int p) { return int(emu::vote(emu::Vote::Any, mask, p != 0)); }
inline int __all_sync(unsigned mask, int p) { return int(emu::vote(emu::Vote::All, mask, p != 0)); }
inline unsigned __ballot_sync(unsigned mask, int p) { return unsigned(emu::vote(emu::Vote::Ballot, mask, p != 0)); }

// ---- global-memory atomics and fences ---------------------------------------------------------
// Blocks run on several OS threads at once (launch's worker pool), so a kernel whose blocks
// communicate through global memory (an atomic counter, then the last block reading what the
// others wrote) is a real concurrent program here, modelled with the C++ memory model: an atomic
// is a seq_cst read-modify-write through std::atomic_ref on the same address, and __threadfence
// a seq_cst fence. A block's stores before its fence and its atomic are visible to the block whose
// atomic reads the value it wrote (or a later one), once that block has fenced too, as on the GPU.
// (x86 keeps stores in order, so a kernel missing a fence still passes here: the emulation
// proves the protocol's logic, which block adds what and who resets the counter, not its fences.)
// Threads of one block are fibers on one OS thread, so between them an atomic is plain program
// order, as a block's own accesses are on the GPU after __syncthreads.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_add(value, std::memory_order_seq_cst);
}
inline int atomicAdd(int* address, int value) {
  return std::atomic_ref<int>(*address).fetch_add(value, std::memory_order_seq_cst);
}
// CUDA's atomicInc: old = *address; *address = old >= limit ? 0 : old + 1; returns old.
inline unsigned atomicInc(unsigned* address, unsigned limit) {
  std::atomic_ref<unsigned> a(*address);
  unsigned old = a.load(std::memory_order_seq_cst);
  while (!a.compare_exchange_weak(old, old >= limit ? 0u : old + 1u, std::memory_order_seq_cst)) {
  }
  return old;
}
