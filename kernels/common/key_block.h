// key_block.h: one block of context parallelism's blockwise attention (src/device/blocks.rs) for
// the attention kernels of both vendors and both emulations. The queries are one run of positions
// of a fused QKV buffer, the keys and values a run of another (or the same), `keys` positions of
// it; query t sits at key position t + shift, so it sees keys u <= t + shift below `keys`: shift
// 0 is the causal diagonal block, shift >= keys a block wholly before its queries (every key). A
// block's output and log-sum-exp are f32 (merged with the other blocks' by their log-sum-exps)
// and its backward adds to f32 gradients. Dropout draws each probability as the whole-sequence
// kernel does at query q_first + t and key k_first + u. The attention kernels' _block_ variants
// take it (a template flag; the others hold an empty one and never read it).
#pragma once

struct KeyBlock {
  const bf16* kv;  // the keys' and values' buffer, at the run's first position
  int keys, shift;
  int q_first, k_first;  // dropout: the whole-sequence positions of query 0 and key 0

  // The last key position a query at `query` (of the block's queries) sees, as an int bound.
  __device__ __forceinline__ int last_key(int query) const {
    const int last = query + shift;
    return last < keys - 1 ? last : keys - 1;
  }
};
