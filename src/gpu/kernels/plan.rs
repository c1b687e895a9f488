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
    AttentionFwd { batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize },
    AttentionBwdDelta { batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize },
    AttentionBwdDkv { batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize },
    AttentionBwdDq { batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize },
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
/// `layernorm_bwd_bf16`'s rows per pass (kernels-cuda/layernorm.cu's kLnPassRows): the Device
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
/// (kernels-cuda/tensor_ops.cu's kColumnStrip, kColumnChunkRows).
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
        | Op::AttentionBwdDq { batch, seq, heads, head_dim, .. } => {
            ([seq, batch * heads, 1], [attention_queries(vendor, head_dim), 1, 1])
        }
        Op::AttentionBwdDkv { batch, seq, kv_heads, .. } => ([seq, batch * kv_heads, 1], [64, 1, 1]),
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
    let by_dim = |d: usize, [d32, d64, d128]: [Kernel; 3], what: &str| match d {
        32 => Ok(d32),
        64 => Ok(d64),
        128 => Ok(d128),
        _ => Err(Error::Unsupported(format!(
            "{what} on the GPU: the kernels are built for head dims 32, 64 and 128, and this model's head dim is {d}"
        ))),
    };
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
        Op::AttentionFwd { head_dim, .. } => by_dim(
            head_dim,
            [Kernel::AttentionFwdBf16D32, Kernel::AttentionFwdBf16D64, Kernel::AttentionFwdBf16D128],
            "attention forward",
        )?,
        Op::AttentionBwdDelta { head_dim, .. } => {
            by_dim(head_dim, [Kernel::AttentionBwdDeltaBf16; 3], "attention backward")?
        }
        Op::AttentionBwdDkv { head_dim, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDkvBf16D32, Kernel::AttentionBwdDkvBf16D64, Kernel::AttentionBwdDkvBf16D128],
            "attention backward",
        )?,
        Op::AttentionBwdDq { head_dim, .. } => by_dim(
            head_dim,
            [Kernel::AttentionBwdDqBf16D32, Kernel::AttentionBwdDqBf16D64, Kernel::AttentionBwdDqBf16D128],
            "attention backward",
        )?,
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
        Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim }
        | Op::AttentionBwdDelta { batch, seq, heads, kv_heads, head_dim }
        | Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim }
        | Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim } => {
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
mod tests {
    use super::*;

    const A100: DeviceLimits = DeviceLimits::A100;

    fn p(op: Op) -> KernelLaunch {
        plan(&op, Vendor::Cuda, &A100, 108).unwrap()
    }

    /// The positions grouped by local row, rows ascending and positions (t·batch + b) ascending
    /// within each; tokens outside the shard dropped; the offsets of the three parts.
    #[test]
    fn embedding_segments_group_positions_by_row_in_order() {
        // batch 2, seq 3: tokens[b·seq + t]; position t·2 + b.
        let tokens = [7, 5, 9, 5, 7, 4];
        let s = EmbeddingSegments::new(&tokens, 5, 3, 2, 3);
        // Rows (token - 5) inside [0, 3): t0 b0 = 7 -> 2 (pos 0), t0 b1 = 5 -> 0 (pos 1),
        // t1 b0 = 5 -> 0 (pos 2), t1 b1 = 7 -> 2 (pos 3), t2 b0 = 9 and t2 b1 = 4 outside.
        assert_eq!(s.segments, 2);
        assert_eq!(s.words, [0, 2, 0, 2, 4, 1, 2, 0, 3]);
        assert_eq!(s.offsets(), [0, 2, 5]);
        let none = EmbeddingSegments::new(&tokens, 100, 5, 2, 3);
        assert_eq!((none.segments, none.words), (0, vec![0]));
    }

    #[test]
    fn geometry_for_ragged_shapes_matches_the_kernel_headers() {
        // gemm_bf16.cu: a 128 x 128 tile per block of 256 threads, 80 KiB of dynamic shared memory
        // (above the default 48 KiB: the kernel opts in).
        let g = p(Op::GemmFwd { m: 100, n: 70, k: 33, out: GemmOut::Bf16 });
        assert_eq!((g.spec.function, g.config.grid, g.config.block), ("gemm_fwd_bf16", [1, 1, 1], [256, 1, 1]));
        assert_eq!((g.config.shared_bytes, g.spec.static_shared, g.config.needs_shared_optin), (81920, 0, true));
        assert_eq!(p(Op::GemmFwd { m: 1, n: 1, k: 1, out: GemmOut::F32 }).config.grid, [1, 1, 1]);
        assert_eq!(p(Op::GemmFwd { m: 1024, n: 3072, k: 768, out: GemmOut::F32 }).config.grid, [24, 8, 1]);
        assert_eq!(p(Op::GemmFwd { m: 129, n: 257, k: 8, out: GemmOut::F32 }).config.grid, [3, 2, 1]);
        assert_eq!(p(Op::LayernormFwd { rows: 7, channels: 33 }).config.grid, [2, 1, 1]);
        let q = p(Op::PositionFwd { batch: 2, positions: 3, hidden: 100 });
        assert_eq!((q.spec.function, q.config.grid, q.config.block), ("position_fwd_bf16", [3, 1, 1], [256, 1, 1]));
        // 64-column strips by 256-row chunks (at least one), both column sums alike.
        let s = p(Op::ColumnSumAdd { rows: 1000, cols: 257 });
        assert_eq!((s.spec.function, s.config.grid, s.config.block), ("column_sum_add_bf16", [5, 4, 1], [256, 1, 1]));
        let s = p(Op::ColumnSumAddF32 { rows: 0, cols: 64 });
        assert_eq!((s.spec.function, s.config.grid, s.spec.static_shared), ("column_sum_add_f32", [1, 1, 1], 1028));
        assert_eq!(p(Op::ColumnSumAdd { rows: 16384, cols: 768 }).config.grid, [12, 64, 1]);
        assert_eq!(column_sum_partials(16384, 3072), 64 * 3072);
        let wide = Op::ColumnSumAdd { rows: 1, cols: COLUMN_SUM_COUNTERS * COLUMN_SUM_STRIP + 1 };
        let e = plan(&wide, Vendor::Cuda, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("column_sum_add_bf16") && e.contains("4096 the Device keeps"), "{e}");
        let d = p(Op::LayernormBwd { rows: 90, channels: 129 });
        assert_eq!((d.spec.function, d.config.grid, d.config.block), ("layernorm_bwd_bf16", [3, 1, 1], [512, 1, 1]));
        // GELU: 8 elements per thread.
        let e = p(Op::GeluFwd { n: 1000 });
        assert_eq!((e.config.grid, e.config.block), ([1, 1, 1], [256, 1, 1]));
        assert_eq!(p(Op::GeluBwd { n: 16384 * 3072 }).config.grid, [8 * 108, 1, 1]);
        assert_eq!(p(Op::GeluBwd { n: 2049 * 8 }).config.grid, [9, 1, 1]);
        // Grid-stride kernels stop at 8 blocks per SM.
        assert_eq!(p(Op::AdamW { n: 124_000_000 }).config.grid, [8 * 108, 1, 1]);
        assert_eq!(p(Op::GeluBwd { n: 1 }).config.grid, [1, 1, 1]);
        let x = p(Op::XentPartials { rows: 5, vocab: 1000 });
        // 32 doubles of reduction scratch (the f64 sum), the max's 32 floats.
        assert_eq!((x.config.grid, x.config.block, x.spec.static_shared), ([5, 1, 1], [256, 1, 1], 256));
        assert_eq!(p(Op::XentMax { rows: 5, vocab: 1000 }).spec.static_shared, 128);
        assert_eq!(p(Op::EmbeddingFwd { batch: 3, seq: 5, hidden: 130 }).config.grid, [2, 15, 1]);
        assert_eq!(p(Op::EmbeddingBwdWte { positions: 15, segments: 7, hidden: 130 }).config.grid, [7, 2, 1]);
        assert_eq!(p(Op::EmbeddingBwdWpe { batch: 3, seq: 5, hidden: 130 }).config.grid, [2, 5, 1]);
        // attention_fwd.cu: Q and a 2-stage K/V ring in dynamic shared memory, 128 queries per
        // block for d 64, 64 for d 128; both above the default 48 KiB (opted in).
        let a = p(Op::AttentionFwd { batch: 2, seq: 100, heads: 3, kv_heads: 3, head_dim: 64 });
        assert_eq!(
            (a.spec.function, a.config.grid, a.spec.static_shared, a.config.shared_bytes, a.config.needs_shared_optin),
            ("attention_fwd_bf16_d64", [1, 6, 1], 0, 55296, true)
        );
        let gpt2 = (16, 1024, 12, 64);
        let (batch, seq, heads, head_dim) = gpt2;
        assert_eq!(p(Op::AttentionFwd { batch, seq, heads, kv_heads: 12, head_dim }).config.grid, [8, 192, 1]);
        let a = p(Op::AttentionFwd { batch: 1, seq: 77, heads: 2, kv_heads: 2, head_dim: 128 });
        assert_eq!(
            (a.spec.function, a.config.grid, a.config.shared_bytes, a.config.needs_shared_optin),
            ("attention_fwd_bf16_d128", [2, 2, 1], 52224, true)
        );
        // seq·batch = 200 rows, 3 heads: 600 warps, 150 blocks of 4.
        let dl = p(Op::AttentionBwdDelta { batch: 2, seq: 100, heads: 3, kv_heads: 3, head_dim: 64 });
        assert_eq!((dl.config.grid, dl.config.block), ([150, 1, 1], [128, 1, 1]));
        let one = Op::AttentionBwdDelta { batch: 1, seq: 1, heads: 1, kv_heads: 1, head_dim: 128 };
        assert_eq!(p(one).config.grid, [1, 1, 1]);
        let kv = p(Op::AttentionBwdDkv { batch: 2, seq: 70, heads: 1, kv_heads: 1, head_dim: 128 });
        assert_eq!(
            (kv.spec.function, kv.config.grid, kv.config.shared_bytes, kv.config.needs_shared_optin),
            ("attention_bwd_dkv_bf16_d128", [2, 2, 1], 52480, true)
        );
        let kv = p(Op::AttentionBwdDkv { batch: 1, seq: 64, heads: 1, kv_heads: 1, head_dim: 64 });
        assert_eq!((kv.config.shared_bytes, kv.config.needs_shared_optin), (37376, false));
        // dQ of d 64: 128 queries per block, like the forward.
        let q = p(Op::AttentionBwdDq { batch: 1, seq: 1, heads: 1, kv_heads: 1, head_dim: 64 });
        assert_eq!(
            (q.spec.function, q.config.grid, q.spec.static_shared, q.config.shared_bytes, q.config.needs_shared_optin),
            ("attention_bwd_dq_bf16_d64", [1, 1, 1], 0, 55296, true)
        );
        assert_eq!(p(Op::AttentionBwdDq { batch, seq, heads, kv_heads: 12, head_dim }).config.grid, [8, 192, 1]);
        assert_eq!(p(Op::AttentionBwdDkv { batch, seq, heads, kv_heads: 12, head_dim }).config.grid, [16, 192, 1]);
        // Llama 3 8B's 32 query heads in 8 groups: dK/dV's blocks over the 8 key/value heads.
        assert_eq!(p(Op::AttentionBwdDkv { batch, seq, heads: 32, kv_heads: 8, head_dim }).config.grid, [16, 128, 1]);
        let q = p(Op::AttentionBwdDq { batch: 1, seq: 1, heads: 1, kv_heads: 1, head_dim: 128 });
        assert_eq!((q.config.shared_bytes, q.config.needs_shared_optin), (52224, true));
        // d 32 (64-key and 64-query tiles): all three under the default 48 KiB.
        let a = p(Op::AttentionFwd { batch: 16, seq: 128, heads: 4, kv_heads: 4, head_dim: 32 });
        assert_eq!(
            (a.spec.function, a.config.grid, a.config.shared_bytes, a.config.needs_shared_optin),
            ("attention_fwd_bf16_d32", [2, 64, 1], 25600, false)
        );
        // HIP's forward blocks own 64 queries at every head dim.
        let hip = Op::AttentionFwd { batch: 16, seq: 128, heads: 4, kv_heads: 4, head_dim: 64 };
        let hip = plan(&hip, Vendor::Hip, &A100, 108);
        assert_eq!(hip.unwrap().config.grid, [2, 64, 1]);
        let kv = p(Op::AttentionBwdDkv { batch: 2, seq: 100, heads: 2, kv_heads: 2, head_dim: 32 });
        assert_eq!(
            (kv.spec.function, kv.config.grid, kv.config.shared_bytes, kv.config.needs_shared_optin),
            ("attention_bwd_dkv_bf16_d32", [2, 4, 1], 31744, false)
        );
        let q = p(Op::AttentionBwdDq { batch: 2, seq: 100, heads: 2, kv_heads: 2, head_dim: 32 });
        assert_eq!(
            (q.spec.function, q.config.grid, q.config.shared_bytes, q.config.needs_shared_optin),
            ("attention_bwd_dq_bf16_d32", [2, 4, 1], 30720, false)
        );
        let dl = p(Op::AttentionBwdDelta { batch: 2, seq: 100, heads: 2, kv_heads: 2, head_dim: 32 });
        assert_eq!((dl.spec.function, dl.config.grid), ("attention_bwd_delta_bf16", [100, 1, 1]));
        // HIP's twins declare their LDS statically: nothing dynamic to pass.
        assert_eq!(Vendor::Hip.dynamic_shared(Kernel::AttentionFwdBf16D128), 0);
    }

    /// Every shape `tests/cuda_emulation.rs` runs, with the grid its harness
    /// (`kernels-cuda/emu/tests/harness.cpp`) launches: the same numbers, restated here.
    #[test]
    fn backward_gemm_wgmma_and_cast_launches_match_their_headers() {
        // gemm_bf16_bwd.cu: a 128 x 128 tile of dinp [M, K] or dW [N, K] per block of 256 threads.
        let d = p(Op::GemmBwdInput { m: 100, n: 70, k: 33, out: GemmOut::F32 });
        assert_eq!((d.spec.function, d.config.grid, d.config.block), ("gemm_bwd_input_bf16", [1, 1, 1], [256, 1, 1]));
        assert_eq!((d.config.shared_bytes, d.config.needs_shared_optin), (75776, true));
        let w = p(Op::GemmBwdWeight { m: 37, n: 130, k: 99 });
        assert_eq!((w.spec.function, w.config.grid, w.config.shared_bytes), ("gemm_bwd_weight_bf16", [1, 2, 1], 69632));
        assert_eq!(p(Op::GemmBwdInput { m: 8192, n: 768, k: 3072, out: GemmOut::F32 }).config.grid, [24, 64, 1]);
        // gemm_bf16_sm90.cu: 3 warpgroups per 128 x 256 tile of out [M, N] or dinp [M, K]
        // (197704 bytes of dynamic shared memory, over an A100's opt-in: an H100's), per 128 x
        // 128 tile of dW [N, K] (132168), opted in; sm_90a only.
        let h100 = |op: Op| plan(&op, Vendor::Cuda, &DeviceLimits::H100, 132).unwrap();
        let g = h100(Op::GemmFwdSm90 { m: 130, n: 192, k: 160, out: GemmOut::F32 });
        assert_eq!((g.config.grid, g.config.block, g.spec.min_arch), ([1, 2, 1], [384, 1, 1], 90));
        assert_eq!((g.config.shared_bytes, g.config.needs_shared_optin), (197704, true));
        let d = h100(Op::GemmBwdInputSm90 { m: 300, n: 264, k: 264, out: GemmOut::F32 });
        assert_eq!((d.spec.function, d.config.grid), ("gemm_bwd_input_bf16_sm90", [2, 3, 1]));
        let w = h100(Op::GemmBwdWeightSm90 { m: 520, n: 80, k: 136 });
        assert_eq!(
            (w.spec.function, w.config.grid, w.config.shared_bytes),
            ("gemm_bwd_weight_bf16_sm90", [2, 1, 1], 132168)
        );
        // GPT-3 175B's MLP at 2048 tokens: 12288 -> 49152.
        assert_eq!(h100(Op::GemmFwdSm90 { m: 2048, n: 49152, k: 12288, out: GemmOut::F32 }).config.grid, [192, 16, 1]);
        // casts.cu: eight elements per thread, blocks of 256, grid-stride.
        assert_eq!(p(Op::CastF32ToBf16 { n: 20_000 }).config.grid, [10, 1, 1]);
        assert_eq!(p(Op::CastBf16ToF32 { n: 1 }).config.grid, [1, 1, 1]);
        assert_eq!(p(Op::CastF32ToBf16 { n: 1 << 30 }).config.grid, [8 * 108, 1, 1]);
        let empty = Op::GemmBwdInput { m: 0, n: 1, k: 1, out: GemmOut::F32 };
        assert!(plan(&empty, Vendor::Cuda, &DeviceLimits::A100, 108).is_err());
    }

    #[test]
    fn geometry_matches_the_emulation_harness_on_its_shapes() {
        let cd = |n: usize, t: usize| n.div_ceil(t) as u32;
        for (m, n, k) in [(64, 64, 32), (100, 70, 72), (37, 130, 100), (130, 192, 160), (1, 1, 1), (17, 9, 7)]
            .into_iter()
            .chain([(64, 64, 64), (77, 99, 56), (129, 65, 33)])
        {
            for out in [GemmOut::F32, GemmOut::Bf16] {
                let g = p(Op::GemmFwd { m, n, k, out });
                assert_eq!((g.config.grid, g.config.block), ([cd(n, 128), cd(m, 128), 1], [256, 1, 1]));
            }
        }
        for (rows, channels) in [(4, 32), (7, 50), (13, 200), (6, 768), (3, 5), (5, 96), (9, 130), (2, 31)] {
            assert_eq!(p(Op::LayernormFwd { rows, channels }).config.grid, [cd(rows, 4), 1, 1]);
            assert_eq!(p(Op::LayernormBwd { rows, channels }).config.grid, [cd(rows, 32), 1, 1]);
        }
        for (rows, vocab) in [(5, 1000), (3, 333), (2, 12565), (4, 1)] {
            for op in [Op::XentMax { rows, vocab }, Op::XentPartials { rows, vocab }, Op::XentBwd { rows, vocab }] {
                assert_eq!((p(op).config.grid, p(op).config.block), ([rows as u32, 1, 1], [256, 1, 1]));
            }
        }
        for (batch, seq, hidden) in [(2, 5, 96), (3, 7, 130), (1, 4, 200), (4, 3, 33)] {
            let h = cd(hidden, 128);
            assert_eq!(p(Op::EmbeddingFwd { batch, seq, hidden }).config.grid, [h, (seq * batch) as u32, 1]);
            let segments = batch * seq - 1;
            let wte = p(Op::EmbeddingBwdWte { positions: batch * seq, segments, hidden });
            assert_eq!(wte.config.grid, [segments as u32, h, 1]);
            assert_eq!(p(Op::EmbeddingBwdWpe { batch, seq, hidden }).config.grid, [h, seq as u32, 1]);
        }
        let multi_head = [(1, 64, 1, 64), (2, 100, 3, 64), (1, 1, 2, 64), (1, 77, 2, 128), (2, 130, 1, 128)];
        let multi_head = multi_head.into_iter().chain([(1, 5, 1, 128), (2, 100, 2, 64), (1, 1, 1, 64)]);
        let multi_head = multi_head.chain([(2, 70, 1, 128), (1, 3, 1, 128), (2, 37, 3, 32), (2, 100, 2, 32)]);
        let multi_head = multi_head.chain([(1, 130, 1, 32), (2, 457, 2, 32)]);
        // Grouped-query attention: dK/dV's blocks over the key/value heads, the others' over the
        // query heads.
        let grouped = [(2, 100, 4, 2, 64), (1, 130, 4, 1, 64), (2, 77, 8, 2, 128), (1, 45, 2, 1, 128)];
        let grouped = grouped.into_iter().chain([(2, 100, 6, 3, 32), (1, 70, 4, 1, 32)]);
        for (batch, seq, heads, kv_heads, head_dim) in multi_head.map(|(b, s, h, d)| (b, s, h, h, d)).chain(grouped) {
            let grid = [cd(seq, 64), (batch * kv_heads) as u32, 1];
            let by_query = [cd(seq, if head_dim == 64 { 128 } else { 64 }), (batch * heads) as u32, 1];
            assert_eq!(p(Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim }).config.grid, by_query);
            assert_eq!(p(Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim }).config.grid, grid);
            assert_eq!(p(Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim }).config.grid, by_query);
            let delta = p(Op::AttentionBwdDelta { batch, seq, heads, kv_heads, head_dim });
            assert_eq!(delta.config.grid, [cd(seq * batch * heads, 4), 1, 1]);
        }
    }

    #[test]
    fn shared_memory_over_the_device_limit_is_an_error_naming_the_kernel() {
        let tiny = DeviceLimits { shared_bytes_per_block: 96, ..DeviceLimits::A100 };
        let e = plan(&Op::XentMax { rows: 8, vocab: 8 }, Vendor::Cuda, &tiny, 1).unwrap_err().to_string();
        assert!(e.contains("kernel xent_max_bf16: 128 bytes of static shared memory"), "{e}");
    }

    #[test]
    fn dynamic_shared_memory_over_the_opt_in_limit_is_an_error_naming_the_kernel() {
        let small = DeviceLimits { shared_bytes_optin: 64 * 1024, ..DeviceLimits::A100 };
        let e = plan(&Op::GemmBwdWeight { m: 8, n: 8, k: 8 }, Vendor::Cuda, &small, 1).unwrap_err().to_string();
        assert!(e.contains("kernel gemm_bwd_weight_bf16: 69632 bytes of shared memory"), "{e}");
        let smaller = DeviceLimits { shared_bytes_optin: 50 * 1024, ..DeviceLimits::A100 };
        let op = Op::AttentionBwdDkv { batch: 1, seq: 8, heads: 1, kv_heads: 1, head_dim: 128 };
        let e = plan(&op, Vendor::Cuda, &smaller, 1).unwrap_err().to_string();
        assert!(e.contains("kernel attention_bwd_dkv_bf16_d128: 52480 bytes of shared memory"), "{e}");
        assert!(
            plan(&Op::GemmFwd { m: 8, n: 8, k: 8, out: GemmOut::F32 }, Vendor::Cuda, &DeviceLimits::H100, 132).is_ok()
        );
    }

    #[test]
    fn violated_preconditions_are_errors_naming_the_kernel() {
        let attention = |op: Op| plan(&op, Vendor::Cuda, &A100, 108).unwrap_err().to_string();
        let e = attention(Op::AttentionFwd { batch: 1, seq: 8, heads: 1, kv_heads: 1, head_dim: 96 });
        assert!(e.contains("head dims 32, 64 and 128") && e.contains("head dim is 96"), "{e}");
        let e = attention(Op::AttentionBwdDkv { batch: 1, seq: 8, heads: 1, kv_heads: 1, head_dim: 16 });
        assert!(e.contains("head dim is 16"), "{e}");
        for kv_heads in [0, 3] {
            let e = attention(Op::AttentionBwdDq { batch: 1, seq: 8, heads: 4, kv_heads, head_dim: 64 });
            assert!(e.contains(&format!("4 query heads do not fall into {kv_heads} key/value groups")), "{e}");
        }
        let e = plan(&Op::GemmFwd { m: 0, n: 8, k: 8, out: GemmOut::Bf16 }, Vendor::Cuda, &A100, 108)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kernel gemm_fwd_bf16") && e.contains("zero"), "{e}");
        let e = plan(&Op::GeluFwd { n: 3_000_000_000 }, Vendor::Cuda, &A100, 108).unwrap_err().to_string();
        assert!(e.contains("kernel gelu_fwd_bf16: n = 3000000000 does not fit"), "{e}");
        // Grid y is at most 65535: batch·heads for attention, seq·batch rows for the embedding.
        let e = plan(&Op::EmbeddingFwd { batch: 64, seq: 2048, hidden: 768 }, Vendor::Cuda, &A100, 108)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kernel embedding_fwd_bf16") && e.contains("131072 blocks along y"), "{e}");
    }

    /// HIP runs the same grids with its own workgroups, except where a workgroup covers a
    /// different number of columns (LayerNorm's dparams: 256 per workgroup); the wgmma GEMM has
    /// no HIP twin.
    #[test]
    fn hip_launches_follow_the_hip_workgroups() {
        let mi250x =
            DeviceLimits { shared_bytes_per_block: 64 * 1024, shared_bytes_optin: 64 * 1024, warp_size: 64, ..A100 };
        let h = |op: Op| plan(&op, Vendor::Hip, &mi250x, 110).unwrap();
        let g = h(Op::GemmFwd { m: 100, n: 70, k: 33, out: GemmOut::Bf16 });
        assert_eq!((g.config.grid, g.config.block, g.config.shared_bytes), ([2, 2, 1], [256, 1, 1], 0));
        let w = h(Op::GemmBwdWeight { m: 37, n: 130, k: 99 });
        assert_eq!((w.config.grid, w.config.shared_bytes), ([2, 3, 1], 0));
        let d = h(Op::LayernormBwd { rows: 70, channels: 300 });
        assert_eq!((d.config.grid, d.config.block), ([3, 1, 1], [512, 1, 1]));
        assert_eq!(h(Op::LayernormFwd { rows: 7, channels: 33 }).config.grid, [2, 1, 1]);
        let a = h(Op::AttentionFwd { batch: 2, seq: 100, heads: 3, kv_heads: 3, head_dim: 64 });
        assert_eq!((a.config.grid, a.config.block), ([2, 6, 1], [128, 1, 1]));
        let sm90 = Op::GemmFwdSm90 { m: 64, n: 64, k: 64, out: GemmOut::F32 };
        let e = plan(&sm90, Vendor::Hip, &mi250x, 110).unwrap_err().to_string();
        assert!(e.contains("gemm_fwd_bf16_f32out_sm90") && e.contains("no twin of gemm_bf16_sm90.cu"), "{e}");
    }

    /// layernorm_bwd_bf16's blocks: one per 32 rows, capped at 256 and by the partials' budget
    /// (fewer for wide rows), at least one; the partials hold the blocks' and the groups' column
    /// sums, and the Device's counters serve the largest grid's groups.
    #[test]
    fn layernorm_backward_blocks_and_partials_follow_the_shape() {
        assert_eq!(layernorm_bwd_blocks(7, 33), 1);
        assert_eq!(layernorm_bwd_blocks(0, 33), 1);
        assert_eq!(layernorm_bwd_blocks(65, 33), 3);
        // GPT-2 124M's step (16 x 1024 tokens): 256 blocks of 64 rows, 16 groups.
        assert_eq!(layernorm_bwd_blocks(16384, 768), 256);
        assert_eq!(layernorm_bwd_blocks(8192, 768), 256);
        assert_eq!(layernorm_bwd_blocks(8192, 1600), 256);
        // GPT-3 175B: 12288 channels, at most 85 blocks of partials (8 MiB), any row count.
        assert_eq!(layernorm_bwd_blocks(2048, 12288), 64);
        assert_eq!(layernorm_bwd_blocks(1 << 20, 12288), 85);
        assert_eq!(layernorm_bwd_blocks(3, 1 << 22), 1);
        assert_eq!(layernorm_bwd_partials(7, 33), 2 * 2 * 33);
        assert_eq!(layernorm_bwd_partials(16384, 768), (256 + 16) * 2 * 768);
        assert_eq!(layernorm_bwd_partials(1 << 20, 12288), (85 + 6) * 2 * 12288);
        assert!(layernorm_bwd_blocks(1 << 20, 12288) * 2 * 12288 <= LAYERNORM_BWD_PARTIAL_BUDGET);
        assert_eq!(LAYERNORM_BWD_COUNTERS, 17);
        for rows in [1, 100, 1 << 14, 1 << 30] {
            assert!(layernorm_bwd_blocks(rows, 1).div_ceil(LAYERNORM_BWD_GROUP) < LAYERNORM_BWD_COUNTERS);
        }
        let g = p(Op::LayernormBwd { rows: 2048, channels: 12288 });
        assert_eq!((g.config.grid, g.config.shared_bytes, g.spec.static_shared), ([64, 1, 1], 0, 260));
    }

    /// The kernels' own rows per pass and group size are the plan's (both suites), and the index's
    /// shared memory is what they declare: a pass's means and rstds and the flag.
    #[test]
    fn layernorm_backward_constants_match_the_kernels() {
        let constants = format!("kLnPassRows = {LAYERNORM_BWD_PASS_ROWS}, kLnGroup = {LAYERNORM_BWD_GROUP};");
        let cuda = super::super::cuda::source("layernorm.cu").unwrap();
        let (_, hip) = super::super::hip::source("layernorm.hip").unwrap();
        for text in [cuda, hip] {
            assert!(text.contains(&constants), "layernorm's kernels do not declare {constants}");
        }
        let spec = p(Op::LayernormBwd { rows: 1, channels: 1 }).spec;
        assert_eq!(spec.static_shared as usize, 2 * 4 * LAYERNORM_BWD_PASS_ROWS + 4);
    }

    /// Backward-weight's slices on sm_90a, a function of the shape alone: GPT-2 124M at 16 x 1024
    /// tokens cuts the 36-tile projection into 3 (108 blocks) and fc1/fc2's 144 tiles into 4 (576
    /// blocks, 4.4 waves of 64 steps where 1 slice ran 2 waves of 256); qkv's 108 tiles fill a
    /// wave alone, the head's 2358 and GPT-3's are far past `SM90_SLICE_MAX_TILES`; short
    /// reductions keep 8 steps a slice (1100 rows: 18 steps, 2 slices; 1024: a tie, 1). The grid's
    /// z is the slices.
    #[test]
    fn sm90_weight_slices_fill_the_sms_for_layers_with_few_tiles() {
        let gpt2 = [(768, 768, 3), (3072, 768, 4), (768, 3072, 4), (2304, 768, 1), (50304, 768, 1)];
        for (n, k, want) in gpt2 {
            assert_eq!(sm90_weight_slices(16384, n, k), want, "{n} x {k}");
        }
        assert_eq!(sm90_weight_slices(2048, 12288, 12288), 1);
        assert_eq!((sm90_weight_slices(1100, 8, 8), sm90_weight_slices(1024, 8, 8), sm90_weight_slices(64, 8, 8)), (2, 1, 1));
        // The partials: a 128 x 128 f32 tile per tile and slice, none for one slice.
        assert_eq!(sm90_weight_partials(16384, 768, 768), 36 * 3 * 128 * 128);
        assert_eq!((sm90_weight_partials(1100, 8, 8), sm90_weight_partials(16384, 2304, 768)), (128 * 128 * 2, 0));
        let h100 = |op: Op| plan(&op, Vendor::Cuda, &DeviceLimits::H100, 132).unwrap();
        assert_eq!(h100(Op::GemmBwdWeightSm90 { m: 16384, n: 768, k: 768 }).config.grid, [6, 6, 3]);
        assert_eq!(h100(Op::GemmBwdWeightSm90 { m: 16384, n: 3072, k: 768 }).config.grid, [6, 24, 4]);
    }

    /// The sm_90a kernels where the device has wgmma and TMA can describe the operands; the
    /// mma.sync ones elsewhere, per product.
    #[test]
    fn linear_gemms_pick_sm90_on_compute_capability_9() {
        let sm90 = LinearGemms {
            forward: Op::GemmFwdSm90 { m: 100, n: 3072, k: 768, out: GemmOut::F32 },
            backward_input: Op::GemmBwdInputSm90 { m: 100, n: 3072, k: 768, out: GemmOut::F32 },
            backward_weight: Op::GemmBwdWeightSm90 { m: 100, n: 3072, k: 768 },
        };
        assert_eq!(linear_gemms(true, true, 100, 768, 3072, GemmOut::F32), sm90);
        let sm80 = LinearGemms {
            forward: Op::GemmFwd { m: 100, n: 3072, k: 768, out: GemmOut::F32 },
            backward_input: Op::GemmBwdInput { m: 100, n: 3072, k: 768, out: GemmOut::F32 },
            backward_weight: Op::GemmBwdWeight { m: 100, n: 3072, k: 768 },
        };
        assert_eq!(linear_gemms(false, true, 100, 768, 3072, GemmOut::F32), sm80);
        assert_eq!(linear_gemms(true, false, 100, 768, 3072, GemmOut::F32), sm80);
        // The LM head of an unpadded vocabulary: the forward reads rows of 768 (TMA), the
        // backward products rows of 50257 (not a multiple of 8: mma.sync).
        let head = linear_gemms(true, true, 100, 768, 50257, GemmOut::F32);
        assert_eq!(head.forward, Op::GemmFwdSm90 { m: 100, n: 50257, k: 768, out: GemmOut::F32 });
        assert_eq!(head.backward_input, Op::GemmBwdInput { m: 100, n: 50257, k: 768, out: GemmOut::F32 });
        assert_eq!(head.backward_weight, Op::GemmBwdWeight { m: 100, n: 50257, k: 768 });
        let small = linear_gemms(true, true, 7, 33, 8, GemmOut::F32).forward;
        assert_eq!(small, Op::GemmFwd { m: 7, n: 8, k: 33, out: GemmOut::F32 });
        // bf16 storage: the bf16-output kernels on both paths, dW still f32.
        let bf16 = |wgmma| linear_gemms(wgmma, true, 100, 768, 3072, GemmOut::Bf16);
        let kernels = |g: LinearGemms| [g.forward, g.backward_input, g.backward_weight].map(|o| kernel_of(&o).unwrap());
        use Kernel::*;
        assert_eq!(kernels(bf16(true)), [GemmFwdBf16Sm90, GemmBwdInputBf16Bf16outSm90, GemmBwdWeightBf16Sm90]);
        assert_eq!(kernels(bf16(false)), [GemmFwdBf16, GemmBwdInputBf16Bf16out, GemmBwdWeightBf16]);
        let f32 = |wgmma| linear_gemms(wgmma, true, 100, 768, 3072, GemmOut::F32);
        assert_eq!(kernels(f32(true)), [GemmFwdBf16F32outSm90, GemmBwdInputBf16Sm90, GemmBwdWeightBf16Sm90]);
        assert_eq!(kernels(f32(false)), [GemmFwdBf16F32out, GemmBwdInputBf16, GemmBwdWeightBf16]);
        // The head of an unpadded vocabulary on bf16: sm_90a forward, mma.sync backward-input.
        let head = kernels(linear_gemms(true, true, 100, 768, 50257, GemmOut::Bf16));
        assert_eq!(head[..2], [GemmFwdBf16Sm90, GemmBwdInputBf16Bf16out]);
        // HIP (no wgmma): the MFMA twins of the bf16-output kernels, planned with HIP workgroups.
        let mi250x = DeviceLimits { shared_bytes_optin: 64 * 1024, warp_size: 64, ..A100 };
        for op in [bf16(false).forward, bf16(false).backward_input] {
            let l = plan(&op, Vendor::Hip, &mi250x, 110).unwrap();
            assert_eq!((l.config.block, l.config.shared_bytes), ([256, 1, 1], 0), "{}", l.spec.function);
        }
    }
}
