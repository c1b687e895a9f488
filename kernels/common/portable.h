// portable.h: what every kernel of kernels/ includes first. Those kernels are one source for
// both vendors: nvcc and NVRTC compile them for NVIDIA GPUs, hipcc and hipRTC for AMD ones, and
// the host compiler under -DTRIDENT_EMU for either emulation (kernels-cuda/emu/, 32-lane warps;
// kernels-hip/emu/, 64-lane wavefronts, whose builds define TRIDENT_EMU_HIP). This header picks
// the vendor's base (kernels-cuda/common/base.cuh or kernels-hip/common/base.h: the 16-bit
// storage type and its conversions, bit for bit the same on both, kWaveSize, bf16x8 and
// aligned16) and names the few things the vendors spell differently:
//   - shfl_xor(v, offset, width): __shfl_xor_sync over the full warp on CUDA, __shfl_xor on HIP;
//   - CUDA_MIN_BLOCKS(n) in __launch_bounds__(threads CUDA_MIN_BLOCKS(n)): at least n resident
//     blocks per SM on CUDA; nothing on HIP, whose second argument means waves per EU;
//   - TRIDENT_CUDA or TRIDENT_HIP, for a tuning choice one vendor's compiler wants (an unroll
//     count) and nothing that changes a result.
// A kernel here never spells 32 or 64 for the lanes of a wave: kWaveSize, so a row handled by a
// wave is 32 lanes wide on CUDA and 64 on HIP, and the blocks the index launches (the `threads`
// and `hip_threads` of src/gpu/kernels/mod.rs) are multiples of it.
//
// Include paths: files include each other as "common/<name>"; the GPU compilers get the
// vendor's folder and kernels/ as include paths (-I kernels -I kernels-cuda, or kernels-hip),
// and NVRTC and hipRTC get every header under that name (src/gpu/kernels/{cuda,hip}.rs).
#pragma once

#if defined(__HIP__) || defined(__HIPCC_RTC__) || defined(TRIDENT_EMU_HIP)
#define TRIDENT_HIP 1
#include "common/base.h"
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int offset, int width) {
  return __shfl_xor(v, offset, width);
}
#define CUDA_MIN_BLOCKS(n)
#else
#define TRIDENT_CUDA 1
#include "common/base.cuh"
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int offset, int width) {
  return __shfl_xor_sync(FULL_WARP_MASK, v, offset, width);
}
#define CUDA_MIN_BLOCKS(n) , n
#endif

// Four f32 values moved as one 16-byte load or store.
struct alignas(16) F32x4 {
  float v[4];
};

// The cross-entropy target of a token the loss leaves out (Megatron's loss mask, `--eod-mask-loss`;
// PyTorch's ignore_index): it adds nothing to the loss and its logits' gradient is 0. The Device's
// `IGNORED_TARGET` (src/device/kernels.rs).
inline constexpr uint32_t kIgnoredTarget = 0xFFFFFFFFu;
