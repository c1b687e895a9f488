//! Tests of the launch plans: every op's kernel, grid, block and shared memory on an A100, an
//! H100 and an MI250X GCD, the preconditions each checks, and the constants the kernels share.

use super::*;

const A100: DeviceLimits = DeviceLimits::A100;

fn p(op: Op) -> KernelLaunch {
    plan(&op, Vendor::Cuda, &A100, 108).unwrap()
}

/// The attention ops without dropout or documents: (batch, seq, heads, kv_heads, head_dim).
fn fwd(batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Op {
    Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false }
}

fn dkv(batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Op {
    Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false }
}

fn dq(batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Op {
    Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false }
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
    let a = p(fwd(2, 100, 3, 3, 64));
    assert_eq!(
        (a.spec.function, a.config.grid, a.spec.static_shared, a.config.shared_bytes, a.config.needs_shared_optin),
        ("attention_fwd_bf16_d64", [1, 6, 1], 0, 55296, true)
    );
    let gpt2 = (16, 1024, 12, 64);
    let (batch, seq, heads, head_dim) = gpt2;
    assert_eq!(p(fwd(batch, seq, heads, 12, head_dim)).config.grid, [8, 192, 1]);
    let a = p(fwd(1, 77, 2, 2, 128));
    assert_eq!(
        (a.spec.function, a.config.grid, a.config.shared_bytes, a.config.needs_shared_optin),
        ("attention_fwd_bf16_d128", [2, 2, 1], 52224, true)
    );
    // seq·batch = 200 rows, 3 heads: 600 warps, 150 blocks of 4.
    let dl = p(Op::AttentionBwdDelta { batch: 2, seq: 100, heads: 3, kv_heads: 3, head_dim: 64 });
    assert_eq!((dl.config.grid, dl.config.block), ([150, 1, 1], [128, 1, 1]));
    let one = Op::AttentionBwdDelta { batch: 1, seq: 1, heads: 1, kv_heads: 1, head_dim: 128 };
    assert_eq!(p(one).config.grid, [1, 1, 1]);
    let kv = p(dkv(2, 70, 1, 1, 128));
    assert_eq!(
        (kv.spec.function, kv.config.grid, kv.config.shared_bytes, kv.config.needs_shared_optin),
        ("attention_bwd_dkv_bf16_d128", [2, 2, 1], 52480, true)
    );
    let kv = p(dkv(1, 64, 1, 1, 64));
    assert_eq!((kv.config.shared_bytes, kv.config.needs_shared_optin), (37376, false));
    // dQ of d 64: 128 queries per block, like the forward.
    let q = p(dq(1, 1, 1, 1, 64));
    assert_eq!(
        (q.spec.function, q.config.grid, q.spec.static_shared, q.config.shared_bytes, q.config.needs_shared_optin),
        ("attention_bwd_dq_bf16_d64", [1, 1, 1], 0, 55296, true)
    );
    assert_eq!(p(dq(batch, seq, heads, 12, head_dim)).config.grid, [8, 192, 1]);
    assert_eq!(p(dkv(batch, seq, heads, 12, head_dim)).config.grid, [16, 192, 1]);
    // Llama 3 8B's 32 query heads in 8 groups: dK/dV's blocks over the 8 key/value heads.
    assert_eq!(p(dkv(batch, seq, 32, 8, head_dim)).config.grid, [16, 128, 1]);
    let q = p(dq(1, 1, 1, 1, 128));
    assert_eq!((q.config.shared_bytes, q.config.needs_shared_optin), (52224, true));
    // d 32 (64-key and 64-query tiles): all three under the default 48 KiB.
    let a = p(fwd(16, 128, 4, 4, 32));
    assert_eq!(
        (a.spec.function, a.config.grid, a.config.shared_bytes, a.config.needs_shared_optin),
        ("attention_fwd_bf16_d32", [2, 64, 1], 25600, false)
    );
    // HIP's forward blocks own 64 queries at every head dim.
    let hip = fwd(16, 128, 4, 4, 64);
    let hip = plan(&hip, Vendor::Hip, &A100, 108);
    assert_eq!(hip.unwrap().config.grid, [2, 64, 1]);
    let kv = p(dkv(2, 100, 2, 2, 32));
    assert_eq!(
        (kv.spec.function, kv.config.grid, kv.config.shared_bytes, kv.config.needs_shared_optin),
        ("attention_bwd_dkv_bf16_d32", [2, 4, 1], 31744, false)
    );
    let q = p(dq(2, 100, 2, 2, 32));
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
        assert_eq!(p(fwd(batch, seq, heads, kv_heads, head_dim)).config.grid, by_query);
        assert_eq!(p(dkv(batch, seq, heads, kv_heads, head_dim)).config.grid, grid);
        assert_eq!(p(dq(batch, seq, heads, kv_heads, head_dim)).config.grid, by_query);
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
    let op = dkv(1, 8, 1, 1, 128);
    let e = plan(&op, Vendor::Cuda, &smaller, 1).unwrap_err().to_string();
    assert!(e.contains("kernel attention_bwd_dkv_bf16_d128: 52480 bytes of shared memory"), "{e}");
    assert!(plan(&Op::GemmFwd { m: 8, n: 8, k: 8, out: GemmOut::F32 }, Vendor::Cuda, &DeviceLimits::H100, 132).is_ok());
}

#[test]
fn violated_preconditions_are_errors_naming_the_kernel() {
    let attention = |op: Op| plan(&op, Vendor::Cuda, &A100, 108).unwrap_err().to_string();
    let e = attention(fwd(1, 8, 1, 1, 96));
    assert!(e.contains("head dims 32, 64 and 128") && e.contains("head dim is 96"), "{e}");
    let e = attention(dkv(1, 8, 1, 1, 16));
    assert!(e.contains("head dim is 16"), "{e}");
    for kv_heads in [0, 3] {
        let e = attention(dq(1, 8, 4, kv_heads, 64));
        assert!(e.contains(&format!("4 query heads do not fall into {kv_heads} key/value groups")), "{e}");
    }
    let e =
        plan(&Op::GemmFwd { m: 0, n: 8, k: 8, out: GemmOut::Bf16 }, Vendor::Cuda, &A100, 108).unwrap_err().to_string();
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
    let a = h(fwd(2, 100, 3, 3, 64));
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

/// The kernel's own rows per pass and group size are the plan's (one source for both
/// vendors), and the index's shared memory is what it declares: a pass's means and rstds and
/// the flag.
#[test]
fn layernorm_backward_constants_match_the_kernels() {
    let constants = format!("kLnPassRows = {LAYERNORM_BWD_PASS_ROWS}, kLnGroup = {LAYERNORM_BWD_GROUP};");
    let cuda = super::super::cuda::source("layernorm.cu").unwrap();
    let (_, hip) = super::super::hip::source("layernorm.cu").unwrap();
    assert_eq!(cuda, hip, "layernorm.cu is one source for both vendors");
    assert!(cuda.contains(&constants), "layernorm's kernels do not declare {constants}");
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
    assert_eq!(
        (sm90_weight_slices(1100, 8, 8), sm90_weight_slices(1024, 8, 8), sm90_weight_slices(64, 8, 8)),
        (2, 1, 1)
    );
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

/// Attention dropout runs the `_drop_` twins and per-document attention the `_docs_` and
/// `_drop_docs_` ones, on the same grids, on both vendors: dropout on the same shared memory, and
/// on CUDA documents with their starts' bytes more (the forward's and dQ's block of queries, the
/// two stages of dK/dV's query tiles).
#[test]
fn attention_dropout_and_documents_launch_their_twins_on_the_same_grids() {
    for vendor in [Vendor::Cuda, Vendor::Hip] {
        let mi250x =
            DeviceLimits { shared_bytes_per_block: 64 * 1024, shared_bytes_optin: 64 * 1024, warp_size: 64, ..A100 };
        let limits = if vendor == Vendor::Cuda { A100 } else { mi250x };
        for (head_dim, starts) in [(32, [256, 512, 256]), (64, [512, 256, 512]), (128, [256, 128, 256])] {
            let ops = |dropout, documents| {
                let (batch, seq, heads, kv_heads) = (2, 100, 4, 2);
                [
                    Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim, dropout, documents },
                    Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim, dropout, documents },
                    Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim, dropout, documents },
                ]
            };
            let launch = |op: &Op| plan(op, vendor, &limits, 108).unwrap();
            for (i, plain) in ops(false, false).iter().map(launch).enumerate() {
                let extra = if vendor == Vendor::Cuda { starts[i] } else { 0 };
                for (dropout, documents, infix) in
                    [(true, false, "_drop"), (false, true, "_docs"), (true, true, "_drop_docs")]
                {
                    let twin = launch(&ops(dropout, documents)[i]);
                    assert_eq!(twin.spec.function, plain.spec.function.replace("_bf16", &format!("{infix}_bf16")));
                    let more = if documents { extra } else { 0 };
                    assert_eq!(
                        (twin.config.grid, twin.config.block, twin.config.shared_bytes),
                        (plain.config.grid, plain.config.block, plain.config.shared_bytes + more),
                        "{vendor:?} {}",
                        twin.spec.function
                    );
                }
            }
        }
    }
}
