// ptx.h: C++ versions of the PTX instructions the kernels issue through inline asm on the GPU,
// reproducing the PTX ISA's register-fragment and shared-memory layouts exactly, so a wrong
// fragment index gives a wrong answer here just as it would on an A100.
//
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   (warp-wide; see mma_m16n8k16 below;
//                                                          .f16.f16 under TRIDENT_FP16)
//   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
//   cp.async.cg.shared.global [dst], [src], 16, src_size;  cp.async.commit_group;  cp.async.wait_group N
//
// Layout facts used (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix"): a lane's
// group is lane / 4 and its index in the group is lane % 4; a .b32 register holding two 16-bit
// elements keeps the one with the lower column (or row) index in its low half.
#pragma once

#include "simt.h"

namespace emu {

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16 (the fp16 module's storage, -DTRIDENT_FP16): bits to float (exact), and float to
// the nearest binary16 with ties to even (cvt.rn.f16.f32): beyond 65504 by half an ulp or more
// rounds to infinity, below 2^-14 to the subnormals (multiples of 2^-24), NaN stays a quiet NaN.
inline float f16_bits_to_float(uint16_t b) {
  const uint32_t sign = uint32_t(b & 0x8000u) << 16, exponent = (b >> 10) & 31u, mantissa = b & 0x3ffu;
  float f;
  if (exponent == 0) {
    f = std::ldexp(float(mantissa), -24);
    return sign ? -f : f;
  }
  const uint32_t u = sign | (exponent == 31 ? 0x7f800000u | (mantissa << 13) : ((exponent + 112) << 23) | (mantissa << 13));
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // quiet NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above (or infinity): infinity
  if (a < 0x38800000u) {                        // below 2^-14: a multiple of 2^-24, ties to even
    float magnitude;
    std::memcpy(&magnitude, &a, 4);
    return sign | uint16_t(std::nearbyint(magnitude * 16777216.0f));
  }
  const uint32_t rounded = (a + 0xfffu + ((a >> 13) & 1u)) >> 13;  // the carry may raise the exponent
  return sign | uint16_t(rounded - (112u << 10));
}
// The module's 16-bit storage type (base.cuh): bf16, or binary16 under TRIDENT_FP16; what the
// tensor-core instructions below read their operands as.
inline float half_bits_to_float(uint16_t b) {
#ifdef TRIDENT_FP16
  return f16_bits_to_float(b);
#else
  return bf16_bits_to_float(b);
#endif
}
inline uint16_t low_half(uint32_t r) { return uint16_t(r & 0xffffu); }
inline uint16_t high_half(uint32_t r) { return uint16_t(r >> 16); }
inline uint32_t pack_halves(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// D = A * B + C for a 16x16 (row-major) A, a 16x8 (column-major) B and 16x8 f32 C and D.
// Per lane (g = lane / 4, t = lane % 4):
//   a[0] = A[g][2t..2t+1]     a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]     b[1] = B[2t+8..2t+9][g]
//   c[0..1] = C[g][2t..2t+1]  c[2..3] = C[g+8][2t..2t+1]  (and D likewise)
// The operands are the module's storage type (.bf16, or .f16 under TRIDENT_FP16). The products of
// 16-bit values are exact; the sums are taken in double and rounded once to f32,
// which is within the hardware's accumulation error of any order it uses.
struct MmaOperand {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};
struct MmaResult {
  float d[4];
};
inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  MmaOperand op;
  std::memcpy(op.a, a, sizeof op.a);
  std::memcpy(op.b, b, sizeof op.b);
  std::memcpy(op.c, c, sizeof op.c);
  MmaResult r = warp_collective<MmaOperand, MmaResult>(kMma, 0xffffffffu, op, [](const MmaOperand* ops, MmaResult* res,
                                                                                   unsigned lanes) {
    if (lanes != 32) fail("mma.sync in a partial warp");
    float A[16][16], B[16][8], C[16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
      const unsigned g = lane / 4, t = lane % 4;
      const MmaOperand& o = ops[lane];
      for (int h = 0; h < 2; ++h) {
        auto half = [h](uint32_t reg) { return half_bits_to_float(h ? high_half(reg) : low_half(reg)); };
        A[g][2 * t + h] = half(o.a[0]);
        A[g + 8][2 * t + h] = half(o.a[1]);
        A[g][2 * t + 8 + h] = half(o.a[2]);
        A[g + 8][2 * t + 8 + h] = half(o.a[3]);
        B[2 * t + h][g] = half(o.b[0]);
        B[2 * t + 8 + h][g] = half(o.b[1]);
        C[g][2 * t + h] = o.c[h];
        C[g + 8][2 * t + h] = o.c[2 + h];
      }
    }
    float D[16][8];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double acc = C[i][j];
        for (int k = 0; k < 16; ++k) acc += double(A[i][k]) * double(B[k][j]);
        D[i][j] = float(acc);
      }
    for (unsigned lane = 0; lane < 32; ++lane) {
      const unsigned g = lane / 4, t = lane % 4;
      res[lane] = MmaResult{{D[g][2 * t], D[g][2 * t + 1], D[g + 8][2 * t], D[g + 8][2 * t + 1]}};
    }
  });
  std::memcpy(d, r.d, sizeof r.d);
}

// ldmatrix: `matrices` 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the addresses of
// the eight 16-byte rows of matrix i (lanes beyond 8*matrices give none). Lane l receives, in
// register i, row l/4 elements 2(l%4) and 2(l%4)+1 of matrix i; with .trans, elements
// [2(l%4)][l/4] and [2(l%4)+1][l/4], i.e. the same fragment of the transposed matrix.
struct LdmatrixResult {
  uint32_t r[4];
};
inline void ldmatrix(uint32_t* regs, int matrices, bool trans, const void* row_address) {
  if (reinterpret_cast<uintptr_t>(row_address) % 16) fail("ldmatrix row address not 16-byte aligned");
  const int kind = kLdmatrix + 16 * (matrices + 8 * int(trans));
  LdmatrixResult r = warp_collective<const void*, LdmatrixResult>(
      kind, 0xffffffffu, row_address, [matrices, trans](const void* const* rows, LdmatrixResult* res, unsigned lanes) {
        if (lanes != 32) fail("ldmatrix in a partial warp");
        for (unsigned lane = 0; lane < 32; ++lane) {
          for (int i = 0; i < matrices; ++i) {
            auto element = [&](unsigned row, unsigned col) {
              uint16_t v;
              std::memcpy(&v, static_cast<const unsigned char*>(rows[8 * i + row]) + 2 * col, 2);
              return v;
            };
            const unsigned a = lane / 4, b = 2 * (lane % 4);
            res[lane].r[i] = trans ? pack_halves(element(b, a), element(b + 1, a)) : pack_halves(element(a, b), element(a, b + 1));
          }
        }
      });
  std::memcpy(regs, r.r, sizeof(uint32_t) * unsigned(matrices));
}

// cp.async: the destination holds no defined value from the instruction on (it is filled with
// 0xFF bytes, NaN as bf16 and f32, the earliest moment the copy may land), and the copy is
// performed when a cp.async.wait_group covers its group (the latest moment the PTX memory model
// allows). So a kernel that reads its tile before waiting, or before the barrier that follows the
// wait, reads garbage here too; and one that refills a buffer another warp has yet to read (no
// barrier between that read and the cp.async) hands that warp NaNs, which simt.h's warp-first
// schedule makes happen. Bytes past src_bytes are zero-filled.
inline void cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes || (src_bytes && reinterpret_cast<uintptr_t>(src) % bytes))
    fail("cp.async address not aligned to the copy size");
  if (src_bytes > bytes) fail("cp.async src_size larger than the copy");
  Fiber& f = self();
  std::memset(dst, 0xFF, bytes);
  f.copies.push_back(PendingCopy{dst, src, bytes, src_bytes, f.committed_groups});
}
inline void cp_async_commit() { self().committed_groups++; }
inline void cp_async_wait(unsigned newest_pending) {
  Fiber& f = self();
  const unsigned complete_before = f.committed_groups >= newest_pending ? f.committed_groups - newest_pending : 0;
  auto done = std::stable_partition(f.copies.begin(), f.copies.end(),
                                    [&](const PendingCopy& c) { return c.group >= complete_before; });
  for (auto it = done; it != f.copies.end(); ++it) {
    std::memcpy(it->dst, it->src, it->src_bytes);
    std::memset(static_cast<unsigned char*>(it->dst) + it->src_bytes, 0, it->bytes - it->src_bytes);
  }
  f.copies.erase(done, f.copies.end());
}

}  // namespace emu
