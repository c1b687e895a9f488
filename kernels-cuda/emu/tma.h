// tma.h: C++ versions of sm_90's tensor memory accelerator (TMA) and of the shared-memory
// barriers (mbarrier) that signal its copies, for kernels that issue them through
// ../common/tma.cuh, following the PTX ISA ("cp.async.bulk.tensor", "mbarrier") and the CUDA
// driver's cuTensorMapEncodeTiled where a kernel or its host can observe them:
//
//   mbarrier.init.shared::cta.b64 [bar], count
//   mbarrier.arrive.shared::cta.b64 _, [bar]
//   mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], tx
//   mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity   (in a loop until p)
//   cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, c1}], [bar]
//   (and .1d to .5d alike)
//
// Tensor map. `encode_tiled` checks the arguments as cuTensorMapEncodeTiled documents them
// (rank 1..5; global address 16-byte aligned; every global stride a multiple of 16 below 2^40;
// box sizes 1..256 with the innermost box a multiple of 16 bytes, and at most the swizzle span
// (128 bytes) under CU_TENSOR_MAP_SWIZZLE_128B; element strides 1) and keeps the address, sizes,
// byte strides, box and swizzle in the 128-byte opaque map; only what the kernels use is
// emulated (bf16 or f32 elements, no interleave, no swizzle or the 128-byte swizzle with an
// innermost box of exactly 128 bytes, out-of-bounds fill with zeros, element strides 1):
// anything else is refused. A copy writes the box into shared memory, dimension 0 fastest, an
// element whose coordinate lies outside [0, size) in any dimension as zero, and counts the whole
// box's bytes (zeros included) towards its barrier. Without swizzle the box lands densely; with
// the 128-byte swizzle the byte at dense offset o lands at shared address (dst + o) with its
// 16-byte chunk bits [4:6] XORed with bits [7:9] (the PTX ISA's 128B swizzle: within each
// 128-byte row of the box the 8 chunks are permuted by the row's index mod 8, a pattern that
// repeats every 1024 bytes), which wgmma's 128B-swizzle descriptors (../emu/wgmma.h) undo; the
// destination must then be 1024-byte aligned, the pattern's period, so that the swizzle of the
// address is the swizzle of the offset the kernel's descriptors assume (else refused).
//
// mbarrier. A phase completes when its pending arrival count reaches zero and its transaction
// count (bytes announced by expect-tx, less the bytes completed copies delivered) is zero; then
// the phase number advances and the pending count is reset to the init count. try_wait.parity P
// is true once the phase of parity P has completed, i.e. while the current phase's parity is not
// P. The state lives beside the 8-byte barrier word (which the kernel never reads).
//
// Asynchrony, at the latest moment the PTX ISA allows: a copy is performed (shared memory
// written, its bytes completed) only when a thread waits on its barrier after every arrival of
// the phase is in; so a kernel that reads a tile before waiting, or waits on the wrong parity,
// sees the old contents. Besides, a wgmma issued on shared memory a copy has not yet filled, and
// a copy into shared memory a wgmma still in flight reads, are reported (../emu/wgmma.h checks
// both), as is a copy outside the shared window, a barrier used before init, more arrivals than
// the count, and more bytes than announced. A wait that can never complete (nobody arrives, or
// fewer bytes arrive than announced) leaves the waiting threads blocked: the scheduler reports a
// deadlock.
#pragma once

#include <map>

#include "simt.h"

namespace emu {

// ---- the tensor map (CUtensorMap: 128 bytes, 64-byte aligned) ----------------------------

inline constexpr uint64_t kTensorMapMagic = 0x7472696465'6e746dull;  // "tridentm"

struct TensorMapState {
  uint64_t magic;
  const unsigned char* base;
  uint64_t dims[5];
  uint64_t strides[5];  // bytes; strides[0] is the element size
  uint32_t box[5];
  uint32_t rank;
  uint32_t element_bytes;
  uint32_t swizzle_128b;  // 0: no swizzle; 1: CU_TENSOR_MAP_SWIZZLE_128B
};
static_assert(sizeof(TensorMapState) <= 128);

// cuTensorMapEncodeTiled's enums, as cuda.h numbers them.
inline constexpr int kTmaUint16 = 1, kTmaFloat32 = 7, kTmaBfloat16 = 9;
inline constexpr int kTmaSwizzleNone = 0, kTmaSwizzle128B = 3;

// The 128-byte swizzle of a shared-memory address (or of an offset from a 1024-byte aligned
// base): the 16-byte chunk index, bits [4:6], XORed with bits [7:9].
inline uint64_t swizzle_128b(uint64_t address) { return address ^ (((address >> 7) & 7u) << 4); }

// 0 and the map in `map` (128 bytes), or CUDA_ERROR_INVALID_VALUE (1) with `why` set.
inline int encode_tiled(void* map, int data_type, unsigned rank, const void* address, const uint64_t* dims,
                        const uint64_t* strides, const unsigned* box, const unsigned* element_strides, int interleave,
                        int swizzle, int l2_promotion, int oob_fill, const char** why) {
  auto refuse = [why](const char* w) {
    *why = w;
    return 1;
  };
  if (reinterpret_cast<uintptr_t>(map) % 64) return refuse("the tensor map is not 64-byte aligned");
  unsigned element = 0;
  switch (data_type) {
    case kTmaUint16: case kTmaBfloat16: element = 2; break;
    case kTmaFloat32: element = 4; break;
    default: return refuse("element type not emulated (bf16, u16 or f32)");
  }
  if (rank < 1 || rank > 5) return refuse("rank outside 1..5");
  if (reinterpret_cast<uintptr_t>(address) % 16) return refuse("global address not 16-byte aligned");
  if (interleave != 0) return refuse("interleaved layouts are not emulated");
  if (swizzle != kTmaSwizzleNone && swizzle != kTmaSwizzle128B)
    return refuse("only no swizzle and the 128-byte swizzle are emulated");
  if (l2_promotion < 0 || l2_promotion > 3) return refuse("unknown L2 promotion");
  if (oob_fill != 0) return refuse("only out-of-bounds fill with zeros (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) is emulated");
  TensorMapState s{};
  s.magic = kTensorMapMagic;
  s.base = static_cast<const unsigned char*>(address);
  s.rank = rank;
  s.element_bytes = element;
  for (unsigned d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (uint64_t(1) << 32)) return refuse("global size outside 1..2^32");
    if (box[d] == 0 || box[d] > 256) return refuse("box size outside 1..256");
    if (element_strides[d] != 1) return refuse("element strides other than 1 are not emulated");
    s.dims[d] = dims[d];
    s.box[d] = box[d];
    if (d == 0) {
      s.strides[0] = element;
    } else {
      const uint64_t st = strides[d - 1];
      if (st % 16 || st >= (uint64_t(1) << 40)) return refuse("global stride not a multiple of 16 below 2^40");
      s.strides[d] = st;
    }
  }
  if ((uint64_t(box[0]) * element) % 16) return refuse("innermost box not a multiple of 16 bytes");
  if (swizzle == kTmaSwizzle128B) {
    if (uint64_t(box[0]) * element > 128) return refuse("innermost box over the 128-byte swizzle span");
    if (uint64_t(box[0]) * element != 128)
      return refuse("the 128-byte swizzle is emulated only for an innermost box of exactly 128 bytes");
    s.swizzle_128b = 1;
  }
  std::memset(map, 0, 128);
  std::memcpy(map, &s, sizeof s);
  return 0;
}

// ---- mbarrier and the copies that complete on it -------------------------------------------

struct TmaCopy {
  unsigned char* dst;
  TensorMapState map;
  int64_t coords[5];
  uint64_t bytes;
};

struct Mbarrier {
  unsigned expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;
  std::vector<TmaCopy> copies;  // issued, not yet performed
  std::vector<unsigned> waiters;
};

struct BarrierTable {
  const Block* owner = nullptr;
  dim3 owner_idx;
  std::map<const void*, Mbarrier> barriers;
};
inline thread_local BarrierTable barrier_table;

// The barriers of the running block (a new block starts with none; one that ends with copies
// never waited for is an error).
inline std::map<const void*, Mbarrier>& block_barriers() {
  BarrierTable& t = barrier_table;
  if (t.owner != block || t.owner_idx.x != blockIdx.x || t.owner_idx.y != blockIdx.y || t.owner_idx.z != blockIdx.z) {
    for (auto& [_, b] : t.barriers)
      if (!b.copies.empty()) fail("a block ended with TMA copies nobody waited for");
    t.barriers.clear();
    t.owner = block;
    t.owner_idx = blockIdx;
  }
  return t.barriers;
}

inline Mbarrier& barrier_at(const void* bar) {
  if (reinterpret_cast<uintptr_t>(bar) % 8) fail("mbarrier not 8-byte aligned");
  auto& all = block_barriers();
  auto it = all.find(bar);
  if (it == all.end()) fail("mbarrier used before mbarrier.init");
  return it->second;
}

// Byte ranges [lo, hi) of shared memory that issued copies have not yet filled.
inline bool tma_pending_overlaps(const unsigned char* lo, const unsigned char* hi) {
  for (auto& [_, b] : block_barriers())
    for (const TmaCopy& c : b.copies)
      if (c.dst < hi && lo < c.dst + c.bytes) return true;
  return false;
}

inline void perform_copy(const TmaCopy& c) {
  const TensorMapState& m = c.map;
  uint32_t box[5] = {1, 1, 1, 1, 1};
  for (unsigned d = 0; d < m.rank; ++d) box[d] = m.box[d];
  uint64_t o = 0;  // the dense offset in the box
  for (uint32_t i4 = 0; i4 < box[4]; ++i4)
    for (uint32_t i3 = 0; i3 < box[3]; ++i3)
      for (uint32_t i2 = 0; i2 < box[2]; ++i2)
        for (uint32_t i1 = 0; i1 < box[1]; ++i1)
          for (uint32_t i0 = 0; i0 < box[0]; ++i0, o += m.element_bytes) {
            unsigned char* out = c.dst + (m.swizzle_128b ? swizzle_128b(o) : o);
            const uint32_t at[5] = {i0, i1, i2, i3, i4};
            bool inside = true;
            uint64_t offset = 0;
            for (unsigned d = 0; d < m.rank; ++d) {
              const int64_t x = c.coords[d] + int64_t(at[d]);
              inside = inside && x >= 0 && uint64_t(x) < m.dims[d];
              offset += uint64_t(x) * m.strides[d];
            }
            if (inside)
              std::memcpy(out, m.base + offset, m.element_bytes);
            else
              std::memset(out, 0, m.element_bytes);
          }
}

inline void wake(Mbarrier& b) {
  for (unsigned t : b.waiters) block->fibers[t].state = State::Runnable;
  b.waiters.clear();
}

// Once every arrival of the phase is in: the copies land and their bytes complete; with the
// transaction count back at zero the phase completes.
inline void settle(Mbarrier& b) {
  if (b.pending != 0) return;
  for (const TmaCopy& c : b.copies) {
    perform_copy(c);
    b.tx -= int64_t(c.bytes);
  }
  b.copies.clear();
  if (b.tx < 0) fail("mbarrier: copies delivered more bytes than expect-tx announced");
  if (b.tx == 0) {
    b.phase++;
    b.pending = b.expected;
    wake(b);
  }
}

inline void mbarrier_init(void* bar, unsigned count) {
  if (count == 0 || count > (1u << 20) - 1) fail("mbarrier.init count outside 1..2^20-1");
  if (reinterpret_cast<uintptr_t>(bar) % 8) fail("mbarrier not 8-byte aligned");
  Mbarrier& b = block_barriers()[bar];
  if (!b.copies.empty()) fail("mbarrier.init on a barrier with copies in flight");
  b = Mbarrier{};
  b.expected = b.pending = count;
}

inline void mbarrier_arrive(void* bar, uint32_t expect_tx) {
  Mbarrier& b = barrier_at(bar);
  if (b.pending == 0) fail("mbarrier: more arrivals than its count in one phase");
  b.tx += int64_t(expect_tx);
  b.pending--;
  if (b.pending == 0 && b.copies.empty()) settle(b);
  wake(b);  // waiters re-check (and settle the copies)
}

// try_wait.parity in a loop: blocks the thread until the phase of `parity` has completed.
inline void mbarrier_wait(void* bar, uint32_t parity) {
  for (;;) {
    Mbarrier& b = barrier_at(bar);
    settle(b);
    if ((b.phase & 1) != (parity & 1)) return;
    Fiber& f = self();
    b.waiters.push_back(f.linear);
    f.state = State::AtWarp;
    yield_to_scheduler();
  }
}

// Copies that wgmma.h asks about: the bounding range of shared memory a wgmma still in flight
// reads (set by wgmma.h; checked against each new copy's destination).
inline bool (*wgmma_in_flight_overlaps)(const unsigned char* lo, const unsigned char* hi) = nullptr;

inline void tma_load(void* dst, const void* map, const int* coords, unsigned rank, void* bar) {
  TensorMapState m;
  std::memcpy(&m, map, sizeof m);
  if (m.magic != kTensorMapMagic) fail("cp.async.bulk.tensor: not a tensor map made by cuTensorMapEncodeTiled");
  if (m.rank != rank) fail("cp.async.bulk.tensor: the instruction's dimension differs from the tensor map's rank");
  if (reinterpret_cast<uintptr_t>(dst) % 128) fail("cp.async.bulk.tensor: shared destination not 128-byte aligned");
  if (m.swizzle_128b && reinterpret_cast<uintptr_t>(dst) % 1024)
    fail("cp.async.bulk.tensor: 128-byte swizzle into a shared destination not 1024-byte aligned");
  uint64_t bytes = m.element_bytes;
  for (unsigned d = 0; d < m.rank; ++d) bytes *= m.box[d];
  auto* out = static_cast<unsigned char*>(dst);
  if (wgmma_in_flight_overlaps && wgmma_in_flight_overlaps(out, out + bytes))
    fail("cp.async.bulk.tensor into shared memory a wgmma still in flight reads (stage reused before wgmma.wait_group)");
  if (tma_pending_overlaps(out, out + bytes)) fail("cp.async.bulk.tensor into shared memory another copy is still filling");
  Mbarrier& b = barrier_at(bar);
  TmaCopy c{out, m, {}, bytes};
  for (unsigned d = 0; d < rank; ++d) c.coords[d] = coords[d];
  b.copies.push_back(c);
  wake(b);
}

}  // namespace emu
