// dropout.h: the dropout masks of src/device/dropout.rs, for every kernel that drops (one source
// for both vendors and both emulations). Whether an element is kept is word (index & 3) of the
// Philox-4x32-10 block with counter (index >> 2 as two words, place, iteration) and the run's key,
// compared with round(p · 2^32); a kept element is multiplied by the f32 1 / (1 - p). The index
// of an element is its place in the whole iteration's tensor (DropoutSite below), so every
// layout and every recomputation draws the same masks.
#pragma once

// One Philox-4x32-10 block (Random123's constants), as src/rng.rs computes it.
__device__ __forceinline__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
    const unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = (uint32_t)p1;
    c[2] = n2;
    c[3] = (uint32_t)p0;
  }
}

// The (sequence, query head) pair whose attention probabilities an attention kernel masks.
struct DropPair {
  int b, head;
};

// A dropout call as its kernel receives it (`Dropout` of src/device/dropout.rs): threshold and
// scale, key and counter words, and the map from this buffer's rows to the whole tensor.
struct DropoutSite {
  uint32_t threshold, key0, key1, place, iteration;
  float scale;
  unsigned long long sample0;
  int batch, seq, t0, width, col0;
  // Positions t >= jump_at are jump_by further (a context-parallel rank's second chunk).
  int jump_at, jump_by;

  // Word w of a block, selected without indexing (a dynamic index would put the block in local
  // memory).
  static __device__ __forceinline__ uint32_t word(const uint32_t (&c)[4], int w) {
    return w == 0 ? c[0] : w == 1 ? c[1] : w == 2 ? c[2] : c[3];
  }
  __device__ __forceinline__ bool keeps(unsigned long long index) const {
    uint32_t c[4] = {(uint32_t)(index >> 2), (uint32_t)(index >> 34), place, iteration};
    philox4x32_10(c, key0, key1);
    return word(c, (int)(index & 3)) >= threshold;
  }
  // Whether indices index and index + 1 are kept (bits 0 and 1): one Philox block where both
  // fall in it, as two neighbouring keys of an attention row mostly do.
  __device__ __forceinline__ unsigned keeps2(unsigned long long index) const {
    uint32_t c[4] = {(uint32_t)(index >> 2), (uint32_t)(index >> 34), place, iteration};
    philox4x32_10(c, key0, key1);
    const int w = (int)(index & 3);
    const unsigned first = word(c, w) >= threshold ? 1u : 0u;
    if (w < 3) return first | (word(c, w + 1) >= threshold ? 2u : 0u);
    return first | (keeps(index + 1) ? 2u : 0u);
  }
  // Element (row t·batch + b, column c) of a hidden-site buffer.
  __device__ __forceinline__ unsigned long long hidden_index(int row, int col) const {
    const int t = row / batch, b = row % batch;
    const int p = t0 + t + (t >= jump_at ? jump_by : 0);
    return ((sample0 + b) * (unsigned long long)seq + p) * (unsigned long long)width + (col0 + col);
  }
  // The first key's probability of (sequence b, head h, query q).
  __device__ __forceinline__ unsigned long long attention_index(int b, int head, int q) const {
    const unsigned long long s = seq;
    return (((sample0 + b) * (unsigned long long)width + (col0 + head)) * s + q) * s;
  }
};

// The site a kernel's dropout parameters make. Those parameters end its list, in this order and
// with these names (spelled out in each declaration, which the kernel index reads):
//   int d_threshold, float d_scale, int d_key0, int d_key1, int d_place, int d_iteration,
//   int d_sample0_lo, int d_sample0_hi, int d_batch, int d_seq, int d_t0, int d_width, int d_col0
// (C ints carry the u32 words and the two halves of sample0).
#define DROPOUT_SITE                                                                                        \
  DropoutSite {                                                                                             \
    (uint32_t)d_threshold, (uint32_t)d_key0, (uint32_t)d_key1, (uint32_t)d_place, (uint32_t)d_iteration,      \
        d_scale, ((unsigned long long)(uint32_t)d_sample0_hi << 32) | (uint32_t)d_sample0_lo, d_batch, d_seq, \
        d_t0, d_width, d_col0, 0x7fffffff, 0                                                                \
  }

// The site of a hidden-site kernel, whose list ends with `int d_jump_at, int d_jump_by` after the
// parameters above.
#define DROPOUT_ROWS_SITE                                                                                   \
  DropoutSite {                                                                                             \
    (uint32_t)d_threshold, (uint32_t)d_key0, (uint32_t)d_key1, (uint32_t)d_place, (uint32_t)d_iteration,      \
        d_scale, ((unsigned long long)(uint32_t)d_sample0_hi << 32) | (uint32_t)d_sample0_lo, d_batch, d_seq, \
        d_t0, d_width, d_col0, d_jump_at, d_jump_by                                                         \
  }
