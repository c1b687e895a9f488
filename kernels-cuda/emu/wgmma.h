// wgmma.h: C++ versions of sm_90a's warpgroup matrix-multiply instructions, for kernels that
// issue them through ../common/wgmma.cuh, following the PTX ISA ("Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Instructions") exactly where a kernel can observe it:
//
//   wgmma.fence.sync.aligned
//   wgmma.mma_async.sync.aligned.m64n{128,256}k16.f32.bf16.bf16 d, a-desc, b-desc, scale-d, 1, 1, trans-a, trans-b
//   (.f16.f16 under TRIDENT_FP16: the operands are read as the module's storage type)
//   wgmma.commit_group.sync.aligned;  wgmma.wait_group.sync.aligned N
//
// A warpgroup is four consecutive warps (threads 128w..128w+127). Every instruction is a
// warpgroup collective: all 128 threads must reach the same one (else the emulation reports a
// deadlock or a mismatch), and mma_async must see the same descriptors in every thread.
//
// Asynchrony: mma_async only records the operation (the descriptors, scale-d and where each
// thread keeps its accumulators). It is performed when a wait_group covers its commit group,
// the latest moment the PTX ISA allows: shared memory is read then and the accumulators are
// gathered, updated and scattered then, so a kernel that overwrites an operand tile or reads its
// accumulators before waiting gets a wrong answer here too. Operations still in flight on the
// same accumulators are performed in issue order (the PTX ISA orders accumulator accesses of
// successive mma_async of one shape). With TMA (tma.h): an mma_async whose operands a copy has
// not yet filled (its barrier's phase not waited for) is reported, and so is a copy into
// shared memory an operation still in flight reads.
//
// Matrix descriptor (64 bits): bits 0-13 start address >> 4, bits 16-29 leading-dimension byte
// offset (LBO) >> 4, bits 32-45 stride-dimension byte offset (SBO) >> 4, bits 49-51 base offset,
// bits 62-63 layout type (0 no swizzle, 1 128-byte swizzle, 2 64-byte, 3 32-byte). Only the
// 128-byte swizzle (1) with base offset 0 is emulated (what TMA's CU_TENSOR_MAP_SWIZZLE_128B
// writes, ../emu/tma.h); others fail. The layouts, as CUTLASS's canonical GMMA layouts
// (cute/atom/mma_traits_sm90_gmma.hpp: Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T)) K-major,
// Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) MN-major, T = 8 elements of 16 bits):
// first an unswizzled byte address of element (mn, k) of the 64 x 16 (A) or N x 16 (B) operand,
//   K-major (transpose flag 0): rows of 128 bytes along M / N, the 16 elements of K contiguous
//   in a row, 8 rows a 1024-byte swizzle atom, atoms SBO apart (LBO unused: CUTLASS sets 1);
//     start + (mn / 8) * SBO + (mn % 8) * 128 + k * 2;
//   MN-major (transpose flag 1, imm-trans-a / imm-trans-b; bf16 and f16 only): rows of 128
//   bytes along K, each 64 consecutive elements of M / N, 8 rows an atom; atoms adjacent in K
//   SBO apart, adjacent in M / N LBO apart;
//     start + (mn / 64) * LBO + (mn % 64) * 2 + (k / 8) * SBO + (k % 8) * 128;
// then the hardware's swizzle of that shared address: its 16-byte chunk bits [4:6] XORed with
// bits [7:9] (tma.h's swizzle_128b). The swizzle acts on the address, not on the offset from
// start, so a descriptor may start inside an atom's first row (a K step of 16 elements is
// start + 32 bytes in K-major) and still read what TMA wrote for the 1024-byte aligned atom.
//
// Accumulator fragment of m64nNk16 (f32): warp w of the warpgroup holds rows 16w..16w+15; lane
// (g = lane / 4, t = lane % 4) holds, for each n8 column block j < N / 8, registers
//     d[4j + 0] = D[16w + g][8j + 2t]      d[4j + 1] = D[16w + g][8j + 2t + 1]
//     d[4j + 2] = D[16w + g + 8][8j + 2t]  d[4j + 3] = D[16w + g + 8][8j + 2t + 1].
//
// Shared addresses: a descriptor holds an offset in the CTA's shared window. On the GPU that is
// the cvta'd address; here the kernel names its shared window with wgmma_shared_window (a no-op
// on the GPU) and offsets are taken from its start, and checked against its size.
#pragma once

#include "simt.h"
#include "tma.h"

namespace emu {

inline constexpr int kWgmmaMaxN = 256;  // the shapes the kernels use: m64n128k16, m64n256k16

struct WgmmaOp {
  uint64_t desc_a, desc_b;
  int scale_d;
  int n, trans_a, trans_b;
  unsigned group;
  float* d[128];
};

enum class WgKind : int { Fence = 1, Mma, Commit, Wait };

struct WgOperand {
  WgKind kind;
  uint64_t desc_a, desc_b;
  int scale_d;
  int wait_n;
  float* d;
  int n = 0, trans_a = 0, trans_b = 0;
};

struct Warpgroup {
  const Block* owner = nullptr;  // the block (and blockIdx) this state belongs to
  dim3 owner_idx;
  unsigned arrived = 0;
  unsigned committed = 0;  // commit groups closed so far
  WgOperand ops[128];
  std::vector<WgmmaOp> pending;
};
inline thread_local Warpgroup warpgroups[8];

struct SharedWindow {
  const unsigned char* base = nullptr;
  size_t bytes = 0;
};
inline thread_local SharedWindow shared_window;

inline void wgmma_shared_window(const void* base, size_t bytes) {
  // The window's offsets stand for shared addresses, whose bits [4:9] the swizzle reads.
  if (reinterpret_cast<uintptr_t>(base) % 1024) fail("wgmma shared window not 1024-byte aligned");
  shared_window = SharedWindow{static_cast<const unsigned char*>(base), bytes};
}
inline uint32_t wgmma_shared_offset(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (!shared_window.base || c < shared_window.base || c >= shared_window.base + shared_window.bytes)
    fail("wgmma descriptor address outside the shared window (call wgmma_shared_window first)");
  return uint32_t(c - shared_window.base);
}

// The shared address (offset in the window) of element (mn, k) of an operand through its
// descriptor, K-major or MN-major, 128-byte swizzle.
inline uint64_t wgmma_operand_offset(uint64_t desc, unsigned mn, unsigned k, bool mn_major) {
  const uint64_t start = (desc & 0x3fffu) << 4, lbo = ((desc >> 16) & 0x3fffu) << 4, sbo = ((desc >> 32) & 0x3fffu) << 4;
  if ((desc >> 62) != 1) fail("wgmma descriptor: only the 128-byte swizzle layout (type 1) is emulated");
  if (((desc >> 49) & 7u) != 0) fail("wgmma descriptor: nonzero base offset");
  const uint64_t linear = mn_major ? start + (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128
                                   : start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2;
  return swizzle_128b(linear);
}

inline float wgmma_operand(uint64_t desc, unsigned mn, unsigned k, bool mn_major) {
  const uint64_t at = wgmma_operand_offset(desc, mn, k, mn_major);
  if (at + 2 > shared_window.bytes) fail("wgmma operand read past the shared window");
  uint16_t v;
  std::memcpy(&v, shared_window.base + at, 2);
  return half_bits_to_float(v);  // .bf16, or .f16 under TRIDENT_FP16
}

// The bounding byte range [lo, hi) of shared memory an operand of `rows` x 16 occupies.
inline std::pair<const unsigned char*, const unsigned char*> wgmma_footprint(uint64_t desc, unsigned rows, bool mn_major) {
  uint64_t lo = ~uint64_t(0), hi = 0;
  for (unsigned mn = 0; mn < rows; ++mn)
    for (unsigned k = 0; k < 16; ++k) {
      const uint64_t at = wgmma_operand_offset(desc, mn, k, mn_major);
      lo = std::min(lo, at);
      hi = std::max(hi, at + 2);
    }
  return {shared_window.base + lo, shared_window.base + hi};
}

// D = A · B (+ C when scale-d), over the warpgroup's gathered accumulators.
inline void wgmma_perform(const WgmmaOp& op) {
  const unsigned N = unsigned(op.n);
  static thread_local double A[64][16], B[kWgmmaMaxN][16];
  static thread_local float D[64][kWgmmaMaxN];
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned k = 0; k < 16; ++k) A[r][k] = wgmma_operand(op.desc_a, r, k, op.trans_a);
  for (unsigned n = 0; n < N; ++n)
    for (unsigned k = 0; k < 16; ++k) B[n][k] = wgmma_operand(op.desc_b, n, k, op.trans_b);
  for (unsigned thread = 0; thread < 128; ++thread) {
    const unsigned w = thread / 32, g = (thread % 32) / 4, t = thread % 4;
    for (unsigned j = 0; j < N / 8; ++j)
      for (unsigned e = 0; e < 4; ++e) D[16 * w + g + 8 * (e / 2)][8 * j + 2 * t + e % 2] = op.d[thread][4 * j + e];
  }
  for (unsigned m = 0; m < 64; ++m)
    for (unsigned n = 0; n < N; ++n) {
      double acc = op.scale_d ? double(D[m][n]) : 0.0;
      for (unsigned k = 0; k < 16; ++k) acc += A[m][k] * B[n][k];
      D[m][n] = float(acc);
    }
  for (unsigned thread = 0; thread < 128; ++thread) {
    const unsigned w = thread / 32, g = (thread % 32) / 4, t = thread % 4;
    for (unsigned j = 0; j < N / 8; ++j)
      for (unsigned e = 0; e < 4; ++e) op.d[thread][4 * j + e] = D[16 * w + g + 8 * (e / 2)][8 * j + 2 * t + e % 2];
  }
}

// Whether an operation still in flight in any warpgroup of the block reads shared memory in
// [lo, hi) (tma.h asks before each copy).
inline bool wgmma_reads_in_flight(const unsigned char* lo, const unsigned char* hi) {
  for (const Warpgroup& wg : warpgroups) {
    if (wg.owner != block || wg.owner_idx.x != blockIdx.x || wg.owner_idx.y != blockIdx.y || wg.owner_idx.z != blockIdx.z)
      continue;
    for (const WgmmaOp& op : wg.pending) {
      const auto a = wgmma_footprint(op.desc_a, 64, op.trans_a), b = wgmma_footprint(op.desc_b, unsigned(op.n), op.trans_b);
      if ((a.first < hi && lo < a.second) || (b.first < hi && lo < b.second)) return true;
    }
  }
  return false;
}
inline const bool wgmma_tma_hook = (wgmma_in_flight_overlaps = &wgmma_reads_in_flight, true);

// The warpgroup collective: every thread deposits its operand; the last to arrive checks them
// and acts for all, then releases the others.
inline void warpgroup_collective(const WgOperand& operand) {
  Fiber& f = self();
  if (block->fibers.size() % 128) fail("wgmma in a block whose size is not a multiple of 128 threads");
  Warpgroup& wg = warpgroups[f.linear / 128];
  if (wg.owner != block || wg.owner_idx.x != blockIdx.x || wg.owner_idx.y != blockIdx.y ||
      wg.owner_idx.z != blockIdx.z) {
    if (wg.arrived == 0) {
      // A new block: the previous one must have waited for all its operations.
      if (!wg.pending.empty()) fail("wgmma operations still pending when a block ended");
      wg.owner = block;
      wg.owner_idx = blockIdx;
      wg.committed = 0;
    }
  }
  wg.ops[f.linear % 128] = operand;
  if (++wg.arrived < 128) {
    f.state = State::AtWarp;
    yield_to_scheduler();
    return;
  }
  wg.arrived = 0;
  const WgOperand& first = wg.ops[0];
  for (unsigned i = 1; i < 128; ++i) {
    const WgOperand& o = wg.ops[i];
    if (o.kind != first.kind) fail("threads of one warpgroup reached different wgmma instructions");
    if (o.desc_a != first.desc_a || o.desc_b != first.desc_b || o.scale_d != first.scale_d || o.wait_n != first.wait_n ||
        o.n != first.n || o.trans_a != first.trans_a || o.trans_b != first.trans_b)
      fail("wgmma operands differ across the warpgroup");
  }
  switch (first.kind) {
    case WgKind::Fence: break;
    case WgKind::Mma: {
      const auto a = wgmma_footprint(first.desc_a, 64, first.trans_a);
      const auto b = wgmma_footprint(first.desc_b, unsigned(first.n), first.trans_b);
      if (tma_pending_overlaps(a.first, a.second) || tma_pending_overlaps(b.first, b.second))
        fail("wgmma.mma_async on shared memory a TMA copy has not filled yet (its mbarrier phase not waited for)");
      WgmmaOp op{first.desc_a, first.desc_b, first.scale_d, first.n, first.trans_a, first.trans_b, wg.committed, {}};
      for (unsigned i = 0; i < 128; ++i) op.d[i] = wg.ops[i].d;
      wg.pending.push_back(op);
      break;
    }
    case WgKind::Commit: wg.committed++; break;
    case WgKind::Wait: {
      const unsigned n = unsigned(first.wait_n);
      const unsigned complete_before = wg.committed >= n ? wg.committed - n : 0;
      std::vector<WgmmaOp> still;
      for (const WgmmaOp& op : wg.pending) {
        if (op.group < complete_before)
          wgmma_perform(op);
        else
          still.push_back(op);
      }
      wg.pending.swap(still);
      break;
    }
  }
  const unsigned base = f.linear - f.linear % 128;
  for (unsigned i = 0; i < 128; ++i) {
    Fiber& other = block->fibers[base + i];
    if (&other != &f) other.state = State::Runnable;
  }
}

inline void wgmma_fence() { warpgroup_collective(WgOperand{WgKind::Fence, 0, 0, 0, 0, nullptr}); }
inline void wgmma_commit() { warpgroup_collective(WgOperand{WgKind::Commit, 0, 0, 0, 0, nullptr}); }
inline void wgmma_wait(int n) { warpgroup_collective(WgOperand{WgKind::Wait, 0, 0, 0, n, nullptr}); }
inline void wgmma_bf16(int n, float* d, uint64_t desc_a, uint64_t desc_b, int scale_d, int trans_a, int trans_b) {
  if (n != 128 && n != 256) fail("wgmma shape not emulated (m64n128k16 and m64n256k16 only)");
  warpgroup_collective(WgOperand{WgKind::Mma, desc_a, desc_b, scale_d != 0, 0, d, n, trans_a != 0, trans_b != 0});
}

}  // namespace emu
