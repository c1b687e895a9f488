// documents.h: per-document attention (--reset-attention-mask) for the attention kernels of both
// vendors and both emulations. `starts` holds, at b·seq + t, the first position of the document
// that position t of sequence b lies in, so query t sees the keys from starts[b·seq + t] to t
// (src/device/kernels.rs's document_start). The attention kernels' _docs_ variants take it (a
// template flag; the others hold an empty one and never read it). The GPU Device uploads each
// start clamped to its position and checks that within a sequence they never decrease
// (`GpuDevice::document_starts`), so over a run of consecutive positions the first has the
// smallest start and the last the largest: the kernels skip and mask whole tiles from those two.
#pragma once

struct Documents {
  const int* starts;  // of sequence 0, or (after `sequence`) of one sequence
  int seq;

  // The starts of sequence b alone: the kernels take theirs once, then index by position (an
  // empty one, of the kernels without documents, stays empty).
  __device__ __forceinline__ Documents sequence(int b) const {
    return Documents{starts == nullptr ? nullptr : starts + (size_t)b * seq, seq};
  }

  // The first key position t of the sequence sees; a position past the end reads the last one's
  // (rows past seq are computed and discarded).
  __device__ __forceinline__ int start(int t) const { return starts[t < seq ? t : seq - 1]; }

  // One past the last position of the sequence whose document starts at or before `key`: the
  // queries from there on see no key up to `key`. A binary search over the non-decreasing starts
  // after `key`.
  __device__ __forceinline__ int end_after(int key) const {
    int lo = key + 1, hi = seq;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (start(mid) > key)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }
};
