//! Launch planning: `plan` turns an op (`Op`) and its shape into the kernel of the index that
//! computes it and the grid, block and shared memory its file's opening comment documents, for
//! either vendor (the block from `Vendor::threads`), checked against the device limits
//! (`launch::tiled`) and the kernel's own preconditions (head dim 32, 64 or 128, sizes that fit the
//! kernels' `int` arguments), each violated one an error naming the kernel. The GPU Device plans
//! its GEMM, attention, cast and AdamW launches here; the GPU benches plan every launch here.

use super::{Kernel, KernelSpec, Vendor};
use crate::error::{Error, Result};
use crate::gpu::launch::{tiled, DeviceLimits, LaunchConfig};

/// The GEMM's output type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmOut {
    F32,
    Bf16,
}

/// An op a GPU kernel computes, with the sizes that decide its launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// out [m, n] = A [m, k] · W [n, k]ᵀ (+ bias, GELU, residual fused).
    GemmFwd {
        m: usize,
        n: usize,
        k: usize,
        out: GemmOut,
    },
    /// dinp [m, k] = dout [m, n] · W [n, k] (overwrite), dinp f32 or bf16.
    GemmBwdInput {
        m: usize,
        n: usize,
        k: usize,
        out: GemmOut,
    },
    /// dW [n, k] += dout [m, n]ᵀ · inp [m, k].
    GemmBwdWeight {
        m: usize,
        n: usize,
        k: usize,
    },
    /// The forward GEMM on sm_90a's wgmma fed by TMA (compute capability 9.0 only).
    GemmFwdSm90 {
        m: usize,
        n: usize,
        k: usize,
        out: GemmOut,
    },
    /// `GemmBwdInput` on sm_90a's wgmma fed by TMA.
    GemmBwdInputSm90 {
        m: usize,
        n: usize,
        k: usize,
        out: GemmOut,
    },
    /// `GemmBwdWeight` on sm_90a's wgmma fed by TMA.
    GemmBwdWeightSm90 {
        m: usize,
        n: usize,
        k: usize,
    },
    /// out [positions·batch, hidden] bf16 += the position rows wpe[t0 + p] (`position_fwd_bf16`,
    /// grid-stride).
    PositionFwd {
        batch: usize,
        positions: usize,
        hidden: usize,
    },
    /// The bias gradient of a bf16 dout [rows, cols]: dbias [cols] += its column sums
    /// (`column_sum_add_bf16`: `column_sum_grid` blocks, partials and a last block per strip).
    ColumnSumAdd {
        rows: usize,
        cols: usize,
    },
    /// The same over an f32 dout (`column_sum_add_f32`, the same grid and order).
    ColumnSumAddF32 {
        rows: usize,
        cols: usize,
    },
    CastF32ToBf16 {
        n: usize,
    },
    CastBf16ToF32 {
        n: usize,
    },
    LayernormFwd {
        rows: usize,
        channels: usize,
    },
    /// The whole LayerNorm backward in one launch (`layernorm_bwd_bf16`): dinp, dweight, dbias.
    LayernormBwd {
        rows: usize,
        channels: usize,
    },
    /// RMSNorm's forward (`rmsnorm_fwd_bf16`): LayernormFwd's grid.
    RmsnormFwd {
        rows: usize,
        channels: usize,
    },
    /// RMSNorm's backward (`rmsnorm_bwd_bf16`): LayernormBwd's grid, partials and counters.
    RmsnormBwd {
        rows: usize,
        channels: usize,
    },
    GeluFwd {
        n: usize,
    },
    GeluBwd {
        n: usize,
    },
    /// SwiGLU over rows of 2f (`swiglu_fwd_bf16`): GeluFwd's grid over rows·f.
    SwigluFwd {
        rows: usize,
        f: usize,
    },
    /// Its backward (`swiglu_bwd_bf16`): dinp [rows, 2f] overwritten, the same grid.
    SwigluBwd {
        rows: usize,
        f: usize,
    },
    /// Rotary embedding in place on the QKV (`rope_fwd_bf16`, with `inverse` `rope_bwd_bf16`).
    Rope {
        rows: usize,
        width: usize,
        rotated_heads: usize,
        rotary_dim: usize,
        inverse: bool,
    },
    AdamW {
        n: usize,
    },
    XentMax {
        rows: usize,
        vocab: usize,
    },
    XentPartials {
        rows: usize,
        vocab: usize,
    },
    XentBwd {
        rows: usize,
        vocab: usize,
    },
    EmbeddingFwd {
        batch: usize,
        seq: usize,
        hidden: usize,
    },
    /// dwte += dout's rows by vocabulary row (`embedding_bwd_wte_bf16`): a block per
    /// `EmbeddingSegments` segment and strip of columns, over `positions` rows of dout.
    EmbeddingBwdWte {
        positions: usize,
        segments: usize,
        hidden: usize,
    },
    EmbeddingBwdWpe {
        batch: usize,
        seq: usize,
        hidden: usize,
    },
    /// Causal attention, `heads` query heads in `kv_heads` groups (`kv_heads == heads`: multi-head): the forward
    /// and dQ, a block per (query tile, sequence, query head); the backward's delta, a warp per (row, query head);
    /// dK/dV, a block per (key tile, sequence, key/value head).
    AttentionFwd {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        /// The `_drop_` kernels: attention dropout (`kernels/common/dropout.h`).
        dropout: bool,
        /// The `_docs_` kernels: per-document attention (`kernels/common/documents.h`).
        documents: bool,
    },
    /// One block of context parallelism's blockwise attention (`kernels/common/key_block.h`):
    /// `seq` queries of one fused-QKV buffer against keys of another, as the forward's grid.
    AttentionBlockFwd {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        /// The `_drop_` kernels: attention dropout at the block's whole-sequence positions.
        dropout: bool,
    },
    /// A block's dK/dV, a block per (key tile, sequence, key/value head) over its `keys`, and
    /// its dQ, as the whole attention's over its `seq` queries.
    AttentionBlockBwdDkv {
        batch: usize,
        keys: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        dropout: bool,
    },
    AttentionBlockBwdDq {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        dropout: bool,
    },
    AttentionBwdDelta {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    },
    AttentionBwdDkv {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        /// The `_drop_` kernels: attention dropout (`kernels/common/dropout.h`).
        dropout: bool,
        /// The `_docs_` kernels: per-document attention (`kernels/common/documents.h`).
        documents: bool,
    },
    AttentionBwdDq {
        batch: usize,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        /// The `_drop_` kernels: attention dropout (`kernels/common/dropout.h`).
        dropout: bool,
        /// The `_docs_` kernels: per-document attention (`kernels/common/documents.h`).
        documents: bool,
    },
}

/// A planned launch: which kernel, and the checked geometry. `config.shared_bytes` is the
/// dynamic shared memory to pass to `cuLaunchKernel` (`Vendor::dynamic_shared`): the stages of
/// the sm_80 GEMMs on CUDA, `sm90_gemm_shared_bytes` for the sm_90a GEMMs, the tiles and stages of
/// the attention kernels on CUDA, 0 for every other kernel (they declare theirs statically,
/// `static_shared` bytes); `config.needs_shared_optin` says it is above the default per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    pub spec: &'static KernelSpec,
    pub config: LaunchConfig,
}

/// Grid-stride kernels (GELU, AdamW) launch at most this many blocks per SM: 8 blocks of 256
/// threads fill an SM's 2048 resident threads, so one wave covers the device.
pub const GRID_STRIDE_BLOCKS_PER_SM: usize = 8;

/// The columns of a gemm_bf16_sm90.cu block's tile of D (its kCols): 256 for the forward and
/// backward-input (128 x 256 tiles), 128 for backward-weight (dW is a layer's weight: few tiles).
pub const SM90_GEMM_COLS: usize = 256;
pub const SM90_GEMM_WEIGHT_COLS: usize = 128;

/// The SMs `sm90_weight_slices` fills: an H100 SXM's (and H200's) 132. A constant rather than the
/// device's count, so the slices, and with them every bit of dW, are a function of the shape
/// alone, the same on every sm_90a part.
pub const SM90_SLICE_SMS: usize = 132;
/// Backward-weight launches cut into slices only where dW has at most this many tiles (two waves
/// of `SM90_SLICE_SMS`); the Device keeps one slice counter per tile (u32, zeroed once).
pub const SM90_SLICE_MAX_TILES: usize = 2 * SM90_SLICE_SMS;
/// A slice's extra cost, in 64-deep reduction steps of a tile: publishing its 64 KiB partial
/// tile and the last slice's reading it back (about 5 µs against ~0.55 µs a step on an H100).
const SM90_SLICE_COST_STEPS: usize = 8;

/// The slices (gridDim.z) of `gemm_bwd_weight_bf16_sm90` on dW [n, k] += Σ over m rows: dW has
/// few 128 x 128 tiles (GPT-2's 768 x 768 projection: 36, its fc1/fc2: 144), so one block per
/// tile leaves most of the SMs idle, or runs a second wave of 12 blocks; cutting the reduction into
/// s slices gives s blocks per tile. The s in 1..=4 (each slice at least 8 steps of 64 rows) that
/// minimises ⌈tiles·s / 132⌉ waves of ⌈steps / s⌉ steps plus `SM90_SLICE_COST_STEPS` per extra
/// slice, the fewest slices on a tie; 1 past `SM90_SLICE_MAX_TILES` tiles. GPT-2 124M at 16 x 1024
/// tokens: the projection 3 slices, fc1/fc2 4, qkv (108 tiles) and the head 1.
pub fn sm90_weight_slices(m: usize, n: usize, k: usize) -> usize {
    let tiles = sm90_weight_tiles(n, k);
    let steps = m.div_ceil(64);
    if tiles > SM90_SLICE_MAX_TILES {
        return 1;
    }
    let cost = |s: usize| (tiles * s).div_ceil(SM90_SLICE_SMS) * steps.div_ceil(s) + SM90_SLICE_COST_STEPS * (s - 1);
    (1..=4).filter(|&s| s == 1 || steps >= 8 * s).min_by_key(|&s| (cost(s), s)).unwrap_or(1)
}

/// The 128 x 128 tiles of dW [n, k] in `gemm_bwd_weight_bf16_sm90`.
fn sm90_weight_tiles(n: usize, k: usize) -> usize {
    n.div_ceil(128) * k.div_ceil(SM90_GEMM_WEIGHT_COLS)
}

/// The f32 elements of the `partials` scratch `gemm_bwd_weight_bf16_sm90` needs on dW [n, k]
/// over m rows: a 128 x 128 tile per tile and slice (uninitialised; each slice writes its own
/// before the last reads it), none where there is one slice.
pub fn sm90_weight_partials(m: usize, n: usize, k: usize) -> usize {
    match sm90_weight_slices(m, n, k) {
        1 => 0,
        slices => 128 * SM90_GEMM_WEIGHT_COLS * sm90_weight_tiles(n, k) * slices,
    }
}

/// The dynamic shared memory of gemm_bf16_sm90.cu's kernels whose tiles have `cols` columns (its
/// kSharedBytes): 1 KiB of slack to start the stages on the 128-byte swizzle's 1024-byte period,
/// 4 stages of a 128 x 64 and a `cols` x 64 bf16 tile, and 9 mbarriers; more than the default
/// 48 KiB: the launch opts in.
pub const fn sm90_gemm_shared_bytes(cols: usize) -> usize {
    1024 + 4 * (128 + cols) * 64 * 2 + 9 * 8
}

/// The three GEMMs of a linear layer of `rows` tokens, `k` inputs and `n` outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearGemms {
    pub forward: Op,
    pub backward_input: Op,
    pub backward_weight: Op,
}

/// Whether the linear layers' GEMMs run on sm_90a's wgmma fed by TMA: on CUDA, with the kernels
/// built for `sm_90a` (compute capability 9.0, unless `TRIDENT_CUDA_ARCH` names an older
/// architecture); elsewhere on mma.sync (MFMA on HIP). The Device and the GEMM benches ask this.
pub fn wgmma(vendor: Vendor, arch: &str) -> bool {
    vendor == Vendor::Cuda && arch == "sm_90a"
}

/// The linear layer's GEMMs on a device with (`wgmma`: compute capability 9.0, sm_90a) or without
/// warpgroup wgmma and TMA: each product on the sm_90a kernels where TMA can describe its
/// operands (row pitches multiples of 8 elements: `k` for the forward, `n` and `k` for the
/// backward products; `aligned`: the bf16 operands start on 16 bytes), else on the mma.sync (HIP:
/// MFMA) ones. `out` is the storage type of the forward's output (and residual) and of dinp: f32
/// picks `gemm_fwd_bf16_f32out(_sm90)` / `gemm_bwd_input_bf16(_sm90)`, bf16 `gemm_fwd_bf16(_sm90)`
/// / `gemm_bwd_input_bf16_bf16out(_sm90)`; dW is f32 either way. HIP has no wgmma: pass
/// `wgmma = false` there.
pub fn linear_gemms(wgmma: bool, aligned: bool, rows: usize, k: usize, n: usize, out: GemmOut) -> LinearGemms {
    let (m, tma) = (rows, wgmma && aligned && k.is_multiple_of(8));
    let backward = tma && n.is_multiple_of(8);
    LinearGemms {
        forward: if tma { Op::GemmFwdSm90 { m, n, k, out } } else { Op::GemmFwd { m, n, k, out } },
        backward_input: if backward {
            Op::GemmBwdInputSm90 { m, n, k, out }
        } else {
            Op::GemmBwdInput { m, n, k, out }
        },
        backward_weight: if backward { Op::GemmBwdWeightSm90 { m, n, k } } else { Op::GemmBwdWeight { m, n, k } },
    }
}

/// The f32 elements of partial column sums `layernorm_bwd_bf16`'s blocks may hold at most
/// (8 MiB): it bounds the partials buffer and the last blocks' sums however wide the rows.
pub const LAYERNORM_BWD_PARTIAL_BUDGET: usize = 1 << 21;
/// `layernorm_bwd_bf16`'s rows per pass (kernels/layernorm.cu's kLnPassRows): the Device
/// gives each block at least one pass's worth.
pub const LAYERNORM_BWD_PASS_ROWS: usize = 32;
/// At most this many blocks of `layernorm_bwd_bf16`: two blocks of 512 threads per SM on an
/// H100's 132 SMs fill it in one wave, and the first-level sums stay 16 groups of 16.
pub const LAYERNORM_BWD_MAX_BLOCKS: usize = 256;
/// Blocks per group of `layernorm_bwd_bf16`'s two-level partial sum (its kLnGroup).
pub const LAYERNORM_BWD_GROUP: usize = 16;
/// The u32 counters the Device keeps for `layernorm_bwd_bf16` (zeroed once): one per group of
/// the largest grid, and one for the groups.
pub const LAYERNORM_BWD_COUNTERS: usize = LAYERNORM_BWD_MAX_BLOCKS / LAYERNORM_BWD_GROUP + 1;

/// The blocks (CUDA) or workgroups (HIP) of `layernorm_bwd_bf16` on [rows, channels]: one per
/// `LAYERNORM_BWD_PASS_ROWS` rows, at most `LAYERNORM_BWD_MAX_BLOCKS` and at most as many as keep
/// their partial column sums (2 x channels f32 each) within `LAYERNORM_BWD_PARTIAL_BUDGET`; at
/// least 1. A function of the shape alone, so the sums' grouping, and with it every bit of
/// dweight and dbias, is the same on every device.
pub fn layernorm_bwd_blocks(rows: usize, channels: usize) -> usize {
    let by_width = (LAYERNORM_BWD_PARTIAL_BUDGET / (2 * channels.max(1))).clamp(1, LAYERNORM_BWD_MAX_BLOCKS);
    rows.div_ceil(LAYERNORM_BWD_PASS_ROWS).clamp(1, by_width)
}

/// The f32 elements of the `partials` scratch `layernorm_bwd_bf16` needs on [rows, channels]:
/// each block's two column sums, then each group's (`layernorm_bwd_blocks` plus
/// ⌈blocks / `LAYERNORM_BWD_GROUP`⌉ slots of 2 x channels). The Device allocates it once per shape
/// (its contents need no initialising) beside `LAYERNORM_BWD_COUNTERS` u32 counters it zeroes
/// once; every launch leaves them at 0.
pub fn layernorm_bwd_partials(rows: usize, channels: usize) -> usize {
    let blocks = layernorm_bwd_blocks(rows, channels);
    (blocks + blocks.div_ceil(LAYERNORM_BWD_GROUP)) * 2 * channels
}

/// Columns per block (a strip) and rows per block (a chunk) of `column_sum_add_{f32,bf16}`
/// (kernels/tensor_ops.cu's kColumnStrip, kColumnChunkRows).
pub const COLUMN_SUM_STRIP: usize = 64;
pub const COLUMN_SUM_CHUNK_ROWS: usize = 256;
/// The strips the Device's counter buffer serves (one u32 each, zeroed once): bias gradients up
/// to 262144 columns wide.
pub const COLUMN_SUM_COUNTERS: usize = 4096;

/// The grid of `column_sum_add_{f32,bf16}` on [rows, cols]: ⌈cols/64⌉ strips by ⌈rows/256⌉ chunks
/// (at least one, so no rows still adds 0). A function of the shape alone, and with it every
/// bit of the sums.
pub fn column_sum_grid(rows: usize, cols: usize) -> [usize; 3] {
    [cols.div_ceil(COLUMN_SUM_STRIP), rows.div_ceil(COLUMN_SUM_CHUNK_ROWS).max(1), 1]
}

/// The f32 elements of the `partials` scratch `column_sum_add_*` needs on [rows, cols]: one
/// column sum per chunk (uninitialised; the kernel writes each before reading it).
pub fn column_sum_partials(rows: usize, cols: usize) -> usize {
    column_sum_grid(rows, cols)[1] * cols
}

/// The word-embedding gradient's positions grouped by the vocabulary row they add to, as
/// `embedding_bwd_f32` / `embedding_bwd_wte_bf16` read them: `words` is one upload of u32s,
/// the segments' rows (ascending), then their starts (segments + 1, the last = positions),
/// then the positions (t·batch + b, ascending within a segment). Tokens outside the shard
/// [vocab_start, vocab_start + vocab_rows) have no position here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingSegments {
    pub segments: usize,
    pub words: Vec<u32>,
}

impl EmbeddingSegments {
    /// Groups the positions of `tokens` [batch, seq] (token of position t·batch + b at
    /// `tokens[b·seq + t]`, sequence-first rows as the embedding's) by local vocabulary row.
    pub fn new(tokens: &[u32], vocab_start: usize, vocab_rows: usize, batch: usize, seq: usize) -> EmbeddingSegments {
        // (row, position) in one u64 each: sorting them orders the rows, and the positions within one.
        let mut keys: Vec<u64> = Vec::with_capacity(batch * seq);
        for t in 0..seq {
            for b in 0..batch {
                let row = (tokens[b * seq + t] as usize).wrapping_sub(vocab_start);
                if row < vocab_rows {
                    keys.push((row as u64) << 32 | (t * batch + b) as u64);
                }
            }
        }
        keys.sort_unstable();
        let (mut rows, mut starts) = (Vec::new(), Vec::new());
        for (i, &k) in keys.iter().enumerate() {
            let row = (k >> 32) as u32;
            if rows.last() != Some(&row) {
                rows.push(row);
                starts.push(i as u32);
            }
        }
        let segments = rows.len();
        starts.push(keys.len() as u32);
        rows.extend(starts);
        rows.extend(keys.iter().map(|&k| k as u32));
        EmbeddingSegments { segments, words: rows }
    }

    /// Where the rows, the starts and the positions begin in `words`, in u32s.
    pub fn offsets(&self) -> [usize; 3] {
        [0, self.segments, 2 * self.segments + 1]
    }
}

/// The launch of `op` on a `vendor` device with `limits` and `multiprocessors` SMs (compute units).
pub fn plan(op: &Op, vendor: Vendor, limits: &DeviceLimits, multiprocessors: u32) -> Result<KernelLaunch> {
    let spec = kernel_of(op)?.spec();
    let function = spec.function;
    let threads = vendor.threads(spec.kernel).ok_or_else(|| {
        Error::Unsupported(format!("kernel {function}: kernels-hip/ has no twin of {} to run on {vendor:?}", spec.file))
    })?;
    let ints: Vec<(&str, usize)> = int_arguments(op);
    for (what, v) in ints {
        if v > i32::MAX as usize {
            return Err(Error::Config(format!(
                "kernel {function}: {what} = {v} does not fit the kernel's int argument (at most {})",
                i32::MAX
            )));
        }
    }
    if let Op::AttentionFwd { heads, kv_heads, .. }
    | Op::AttentionBlockFwd { heads, kv_heads, .. }
    | Op::AttentionBlockBwdDkv { heads, kv_heads, .. }
    | Op::AttentionBlockBwdDq { heads, kv_heads, .. }
    | Op::AttentionBwdDelta { heads, kv_heads, .. }
    | Op::AttentionBwdDkv { heads, kv_heads, .. }
    | Op::AttentionBwdDq { heads, kv_heads, .. } = *op
    {
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "kernel {function}: {heads} query heads do not fall into {kv_heads} key/value groups"
            )));
        }
    }
    let t = threads as usize;
    let g = gemm_tile(vendor);
    let (problem, tile) = match *op {
        // A g x g tile of out [m, n] per block.
        Op::GemmFwd { m, n, .. } => ([n, m, 1], [g, g, 1]),
        // A 128 x 256 tile of out [m, n] or dinp [m, k], 128 x 128 of dW [n, k] per block (and
        // per slice of dW's reduction).
        Op::GemmFwdSm90 { m, n, .. } => ([n, m, 1], [SM90_GEMM_COLS, 128, 1]),
        Op::GemmBwdInputSm90 { m, k, .. } => ([k, m, 1], [SM90_GEMM_COLS, 128, 1]),
        Op::GemmBwdWeightSm90 { m, n, k } => ([k, n, sm90_weight_slices(m, n, k)], [SM90_GEMM_WEIGHT_COLS, 128, 1]),
        // A g x g tile of dinp [m, k] or of dW [n, k] per block.
        Op::GemmBwdInput { m, k, .. } => ([k, m, 1], [g, g, 1]),
        Op::GemmBwdWeight { n, k, .. } => ([k, n, 1], [g, g, 1]),
        // Eight elements per thread, grid-stride, capped like AdamW's.
        Op::CastF32ToBf16 { n } | Op::CastBf16ToF32 { n } | Op::GeluFwd { n } | Op::GeluBwd { n } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([n.div_ceil(8).min(cap), 1, 1], [t, 1, 1])
        }
        Op::Rope { rows, rotated_heads, rotary_dim, .. } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([(rows * rotated_heads * (rotary_dim / 2)).min(cap), 1, 1], [t, 1, 1])
        }
        Op::SwigluFwd { rows, f } | Op::SwigluBwd { rows, f } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([(rows * f).div_ceil(8).min(cap), 1, 1], [t, 1, 1])
        }
        Op::ColumnSumAdd { rows, cols } | Op::ColumnSumAddF32 { rows, cols } => {
            let [strips, chunks, _] = column_sum_grid(rows, cols);
            if strips > COLUMN_SUM_COUNTERS {
                return Err(Error::Config(format!(
                    "kernel {function}: {cols} columns need {strips} strip counters, more than the {COLUMN_SUM_COUNTERS} \
                     the Device keeps (at most {} columns)",
                    COLUMN_SUM_COUNTERS * COLUMN_SUM_STRIP
                )));
            }
            ([strips, chunks, 1], [1, 1, 1])
        }
        Op::LayernormFwd { rows, .. } | Op::RmsnormFwd { rows, .. } => ([rows, 1, 1], [4, 1, 1]),
        Op::LayernormBwd { rows, channels } | Op::RmsnormBwd { rows, channels } => {
            ([layernorm_bwd_blocks(rows, channels), 1, 1], [1, 1, 1])
        }
        Op::PositionFwd { batch, positions, hidden } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            let n = batch * positions * hidden;
            ([n.min(cap), 1, 1], [t, 1, 1])
        }
        Op::AdamW { n } => {
            let cap = GRID_STRIDE_BLOCKS_PER_SM * multiprocessors.max(1) as usize * t;
            ([n.min(cap), 1, 1], [t, 1, 1])
        }
        Op::XentMax { rows, .. } | Op::XentPartials { rows, .. } | Op::XentBwd { rows, .. } => {
            ([rows, 1, 1], [1, 1, 1])
        }
        Op::EmbeddingFwd { batch, seq, hidden } => ([hidden, seq * batch, 1], [t, 1, 1]),
        Op::EmbeddingBwdWte { segments, hidden, .. } => ([segments, hidden, 1], [1, t, 1]),
        Op::EmbeddingBwdWpe { seq, hidden, .. } => ([hidden, seq, 1], [t, 1, 1]),
        Op::AttentionFwd { batch, seq, heads, head_dim, .. }
        | Op::AttentionBlockFwd { batch, seq, heads, head_dim, .. }
        | Op::AttentionBlockBwdDq { batch, seq, heads, head_dim, .. }
        | Op::AttentionBwdDq { batch, seq, heads, head_dim, .. } => {
            ([seq, batch * heads, 1], [attention_queries(vendor, head_dim), 1, 1])
        }
        Op::AttentionBwdDkv { batch, seq, kv_heads, .. }
        | Op::AttentionBlockBwdDkv { batch, keys: seq, kv_heads, .. } => ([seq, batch * kv_heads, 1], [64, 1, 1]),
        // A warp per (row, head): 4 per block of 128.
        Op::AttentionBwdDelta { batch, seq, heads, .. } => ([seq * batch * heads, 1, 1], [4, 1, 1]),
    };
    if spec.static_shared > limits.shared_bytes_per_block {
        return Err(Error::Config(format!(
            "kernel {function}: {} bytes of static shared memory exceed the device's {} per block",
            spec.static_shared, limits.shared_bytes_per_block
        )));
    }
    let dynamic = vendor.dynamic_shared(spec.kernel) as usize;
    let config = tiled(function, problem, tile, [threads, 1, 1], dynamic, limits)?;
    Ok(KernelLaunch { spec, config })
}

/// The output tile of a block of the mma.sync / MFMA GEMMs (forward, backward-input,
/// backward-weight): 128 x 128 on CUDA (kernels-cuda/common/gemm_pipeline.cuh), 64 x 64 on HIP
/// (kernels-hip/common/gemm_mfma.h).
pub const fn gemm_tile(vendor: Vendor) -> usize {
    match vendor {
        Vendor::Cuda => 128,
        Vendor::Hip => 64,
    }
}

/// The queries of a block of the attention forward and of dQ: on CUDA 128 for head dim 64 (4 warps
/// of 32 rows) and 64 for 32 and 128 (4 warps of 16: kernels-cuda/attention_fwd.cu's `TilesOf`,
/// attention_bwd.cu's `DqTilesOf`), on HIP 64 (kernels-hip/attention_*.hip).
pub const fn attention_queries(vendor: Vendor, head_dim: usize) -> usize {
    match vendor {
        Vendor::Cuda if head_dim == 64 => 128,
        Vendor::Cuda | Vendor::Hip => 64,
    }
}

/// The kernel that computes `op`.
pub fn kernel_of(op: &Op) -> Result<Kernel> {
    Ok(match *op {
        Op::GemmFwd { out: GemmOut::F32, .. } => Kernel::GemmFwdBf16F32out,
        Op::GemmFwd { out: GemmOut::Bf16, .. } => Kernel::GemmFwdBf16,
        Op::GemmBwdInput { out: GemmOut::F32, .. } => Kernel::GemmBwdInputBf16,
        Op::GemmBwdInput { out: GemmOut::Bf16, .. } => Kernel::GemmBwdInputBf16Bf16out,
        Op::GemmBwdWeight { .. } => Kernel::GemmBwdWeightBf16,
        Op::GemmFwdSm90 { out: GemmOut::F32, .. } => Kernel::GemmFwdBf16F32outSm90,
        Op::GemmFwdSm90 { out: GemmOut::Bf16, .. } => Kernel::GemmFwdBf16Sm90,
        Op::GemmBwdInputSm90 { out: GemmOut::F32, .. } => Kernel::GemmBwdInputBf16Sm90,
        Op::GemmBwdInputSm90 { out: GemmOut::Bf16, .. } => Kernel::GemmBwdInputBf16Bf16outSm90,
        Op::GemmBwdWeightSm90 { .. } => Kernel::GemmBwdWeightBf16Sm90,
        Op::ColumnSumAdd { .. } => Kernel::ColumnSumAddBf16,
        Op::ColumnSumAddF32 { .. } => Kernel::ColumnSumAddF32,
        Op::PositionFwd { .. } => Kernel::PositionFwdBf16,
        Op::CastF32ToBf16 { .. } => Kernel::CastF32ToBf16,
        Op::CastBf16ToF32 { .. } => Kernel::CastBf16ToF32,
        Op::LayernormFwd { .. } => Kernel::LayernormFwdBf16,
        Op::LayernormBwd { .. } => Kernel::LayernormBwdBf16,
        Op::RmsnormFwd { .. } => Kernel::RmsnormFwdBf16,
        Op::RmsnormBwd { .. } => Kernel::RmsnormBwdBf16,
        Op::SwigluFwd { .. } => Kernel::SwigluFwdBf16,
        Op::SwigluBwd { .. } => Kernel::SwigluBwdBf16,
        Op::Rope { inverse: false, .. } => Kernel::RopeFwdBf16,
        Op::Rope { inverse: true, .. } => Kernel::RopeBwdBf16,
        Op::GeluFwd { .. } => Kernel::GeluFwdBf16,
        Op::GeluBwd { .. } => Kernel::GeluBwdBf16,
        Op::AdamW { .. } => Kernel::AdamwF32Bf16,
        Op::XentMax { .. } => Kernel::XentMaxBf16,
        Op::XentPartials { .. } => Kernel::XentPartialsBf16,
        Op::XentBwd { .. } => Kernel::XentBwdBf16,
        Op::EmbeddingFwd { .. } => Kernel::EmbeddingFwdBf16,
        Op::EmbeddingBwdWte { .. } => Kernel::EmbeddingBwdWteBf16,
        Op::EmbeddingBwdWpe { .. } => Kernel::EmbeddingBwdWpeBf16,
        Op::AttentionFwd { .. }
        | Op::AttentionBlockFwd { .. }
        | Op::AttentionBlockBwdDkv { .. }
        | Op::AttentionBlockBwdDq { .. }
        | Op::AttentionBwdDelta { .. }
        | Op::AttentionBwdDkv { .. }
        | Op::AttentionBwdDq { .. } => attention_kernel(op)?,
    })
}

/// The attention ops' kernels, by head dim and variant.
fn attention_kernel(op: &Op) -> Result<Kernel> {
    let by_dim = |d: usize, [d32, d64, d128]: [Kernel; 3], what: &str| match d {
        32 => Ok(d32),
        64 => Ok(d64),
        128 => Ok(d128),
        _ => Err(Error::Unsupported(format!(
            "{what} on the GPU: the kernels are built for head dims 32, 64 and 128, and this model's head dim is {d}"
        ))),
    };
    Ok(match *op {
        Op::AttentionFwd { head_dim, dropout: false, documents: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionFwdBf16D32, Kernel::AttentionFwdBf16D64, Kernel::AttentionFwdBf16D128],
            "attention forward",
        )?,
        Op::AttentionFwd { head_dim, dropout: false, documents: true, .. } => by_dim(
            head_dim,
            [Kernel::AttentionFwdDocsBf16D32, Kernel::AttentionFwdDocsBf16D64, Kernel::AttentionFwdDocsBf16D128],
            "attention forward",
        )?,
        Op::AttentionFwd { head_dim, dropout: true, documents: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionFwdDropBf16D32, Kernel::AttentionFwdDropBf16D64, Kernel::AttentionFwdDropBf16D128],
            "attention forward",
        )?,
        Op::AttentionFwd { head_dim, dropout: true, documents: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionFwdDropDocsBf16D32,
                Kernel::AttentionFwdDropDocsBf16D64,
                Kernel::AttentionFwdDropDocsBf16D128,
            ],
            "attention forward",
        )?,
        Op::AttentionBlockFwd { head_dim, dropout: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBlockFwdBf16D32, Kernel::AttentionBlockFwdBf16D64, Kernel::AttentionBlockFwdBf16D128],
            "attention block forward",
        )?,
        Op::AttentionBlockFwd { head_dim, dropout: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBlockFwdDropBf16D32,
                Kernel::AttentionBlockFwdDropBf16D64,
                Kernel::AttentionBlockFwdDropBf16D128,
            ],
            "attention block forward",
        )?,
        Op::AttentionBlockBwdDkv { head_dim, dropout: false, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBlockBwdDkvBf16D32,
                Kernel::AttentionBlockBwdDkvBf16D64,
                Kernel::AttentionBlockBwdDkvBf16D128,
            ],
            "attention block backward",
        )?,
        Op::AttentionBlockBwdDkv { head_dim, dropout: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBlockBwdDkvDropBf16D32,
                Kernel::AttentionBlockBwdDkvDropBf16D64,
                Kernel::AttentionBlockBwdDkvDropBf16D128,
            ],
            "attention block backward",
        )?,
        Op::AttentionBlockBwdDq { head_dim, dropout: false, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBlockBwdDqBf16D32,
                Kernel::AttentionBlockBwdDqBf16D64,
                Kernel::AttentionBlockBwdDqBf16D128,
            ],
            "attention block backward",
        )?,
        Op::AttentionBlockBwdDq { head_dim, dropout: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBlockBwdDqDropBf16D32,
                Kernel::AttentionBlockBwdDqDropBf16D64,
                Kernel::AttentionBlockBwdDqDropBf16D128,
            ],
            "attention block backward",
        )?,
        Op::AttentionBwdDelta { head_dim, .. } => {
            by_dim(head_dim, [Kernel::AttentionBwdDeltaBf16; 3], "attention backward")?
        }
        Op::AttentionBwdDkv { head_dim, dropout: false, documents: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDkvBf16D32, Kernel::AttentionBwdDkvBf16D64, Kernel::AttentionBwdDkvBf16D128],
            "attention backward",
        )?,
        Op::AttentionBwdDkv { head_dim, dropout: false, documents: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBwdDkvDocsBf16D32,
                Kernel::AttentionBwdDkvDocsBf16D64,
                Kernel::AttentionBwdDkvDocsBf16D128,
            ],
            "attention backward",
        )?,
        Op::AttentionBwdDkv { head_dim, dropout: true, documents: false, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBwdDkvDropBf16D32,
                Kernel::AttentionBwdDkvDropBf16D64,
                Kernel::AttentionBwdDkvDropBf16D128,
            ],
            "attention backward",
        )?,
        Op::AttentionBwdDkv { head_dim, dropout: true, documents: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBwdDkvDropDocsBf16D32,
                Kernel::AttentionBwdDkvDropDocsBf16D64,
                Kernel::AttentionBwdDkvDropDocsBf16D128,
            ],
            "attention backward",
        )?,
        Op::AttentionBwdDq { head_dim, dropout: false, documents: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDqBf16D32, Kernel::AttentionBwdDqBf16D64, Kernel::AttentionBwdDqBf16D128],
            "attention backward",
        )?,
        Op::AttentionBwdDq { head_dim, dropout: false, documents: true, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDqDocsBf16D32, Kernel::AttentionBwdDqDocsBf16D64, Kernel::AttentionBwdDqDocsBf16D128],
            "attention backward",
        )?,
        Op::AttentionBwdDq { head_dim, dropout: true, documents: false, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDqDropBf16D32, Kernel::AttentionBwdDqDropBf16D64, Kernel::AttentionBwdDqDropBf16D128],
            "attention backward",
        )?,
        Op::AttentionBwdDq { head_dim, dropout: true, documents: true, .. } => by_dim(
            head_dim,
            [
                Kernel::AttentionBwdDqDropDocsBf16D32,
                Kernel::AttentionBwdDqDropDocsBf16D64,
                Kernel::AttentionBwdDqDropDocsBf16D128,
            ],
            "attention backward",
        )?,
        _ => unreachable!("kernel_of passes attention ops alone"),
    })
}

/// The sizes an op passes to its kernel as `int`, or that the kernel indexes with `int`.
fn int_arguments(op: &Op) -> Vec<(&'static str, usize)> {
    match *op {
        Op::GemmFwd { m, n, k, .. }
        | Op::GemmBwdInput { m, n, k, .. }
        | Op::GemmBwdWeight { m, n, k }
        | Op::GemmFwdSm90 { m, n, k, .. }
        | Op::GemmBwdInputSm90 { m, n, k, .. }
        | Op::GemmBwdWeightSm90 { m, n, k } => vec![("M", m), ("N", n), ("K", k)],
        Op::CastF32ToBf16 { n } | Op::CastBf16ToF32 { n } => vec![("n", n)],
        Op::ColumnSumAdd { rows, cols } | Op::ColumnSumAddF32 { rows, cols } => vec![("M", rows), ("N", cols)],
        Op::PositionFwd { batch, positions, hidden } => {
            vec![("positions·batch·hidden", batch.saturating_mul(positions).saturating_mul(hidden))]
        }
        Op::LayernormFwd { rows, channels }
        | Op::LayernormBwd { rows, channels }
        | Op::RmsnormFwd { rows, channels }
        | Op::RmsnormBwd { rows, channels } => {
            vec![("rows", rows), ("C", channels)]
        }
        Op::GeluFwd { n } | Op::GeluBwd { n } | Op::AdamW { n } => vec![("n", n)],
        Op::SwigluFwd { rows, f } | Op::SwigluBwd { rows, f } => vec![("rows·2f", rows.saturating_mul(2 * f))],
        Op::Rope { rows, width, .. } => vec![("rows", rows), ("QKV width", width)],
        Op::XentMax { rows, vocab } | Op::XentPartials { rows, vocab } | Op::XentBwd { rows, vocab } => {
            vec![("rows", rows), ("V", vocab)]
        }
        Op::EmbeddingFwd { batch, seq, hidden } | Op::EmbeddingBwdWpe { batch, seq, hidden } => {
            vec![("batch·seq", batch.saturating_mul(seq)), ("hidden", hidden)]
        }
        Op::EmbeddingBwdWte { positions, hidden, .. } => vec![("batch·seq", positions), ("hidden", hidden)],
        Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim, .. }
        | Op::AttentionBlockFwd { batch, seq, heads, kv_heads, head_dim, .. }
        | Op::AttentionBlockBwdDkv { batch, keys: seq, heads, kv_heads, head_dim, .. }
        | Op::AttentionBlockBwdDq { batch, seq, heads, kv_heads, head_dim, .. }
        | Op::AttentionBwdDelta { batch, seq, heads, kv_heads, head_dim }
        | Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim, .. }
        | Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim, .. } => {
            // The statistics' index, and offsets within one position's QKV rows.
            let position = heads.saturating_add(kv_heads.saturating_mul(2)).saturating_mul(head_dim);
            vec![
                ("batch·heads·seq", batch.saturating_mul(heads).saturating_mul(seq)),
                ("batch·(heads + 2·kv_heads)·head_dim", batch.saturating_mul(position)),
            ]
        }
    }
}
#[cfg(test)]
mod tests;
