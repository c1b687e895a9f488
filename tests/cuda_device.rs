//! The CUDA Device on a machine without a GPU: `tests/gpu/emu_libcuda.cpp` is a CUDA driver that
//! runs the kernels under the SIMT emulation (built here with g++ and loaded through
//! `TRIDENT_LIBCUDA`), and the pip wheel's NVRTC really compiles them to CUBINs that the fake
//! driver checks. Every Device op runs against the reference device on a few shapes (ragged ones
//! included), and `trident train --device cuda --bf16` follows the CPU's `--bf16` losses.
//!
//! NVRTC comes from `make gpu-test-libs` (or `TRIDENT_NVRTC`); without it these tests skip, saying
//! so (`common::skip`; a failure under `TRIDENT_CI=1`).

mod common;
use common::gpu_device::{self, down, fake_nccl, run_with, train_losses, up, Emulated, TINY_GPU};
use common::*;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use trident::device::prelude::*;
use trident::device::Matrix;
use trident::gpu::device::GpuDevice;

const SEED: u64 = 23;

/// The emulating driver, built once per test process (about 6 s), with NVRTC.
fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Result<Emulated, Missing>> = OnceLock::new();
    present(BUILT.get_or_init(gpu_device::emulate_cuda))
}

/// One CUDA Device for the whole test process (its kernels compile once).
fn device() -> Option<&'static GpuDevice> {
    static DEV: OnceLock<GpuDevice> = OnceLock::new();
    emulated()?;
    Some(
        DEV.get_or_init(|| {
            GpuDevice::cuda(0).unwrap_or_else(|e| panic!("the CUDA Device on the emulated driver: {e}"))
        }),
    )
}

#[test]
fn device_to_device_copies_move_exactly_the_range_and_the_default_copy_agrees() {
    let Some(dev) = device() else { return };
    let src: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let g = up(dev, &src);
    let mut dst = up(dev, &vec![-1.0; 600]);
    dev.copy(&mut dst, 100, &g, 337, 401);
    dev.copy(&mut dst, 0, &g, 0, 0);
    let got = down(dev, &dst);
    let mut want = vec![-1.0f32; 600];
    want[100..501].copy_from_slice(&src[337..738]);
    assert_eq!(got, want);
    // The trait's default (host staging), as the CPU backend runs it, does the same.
    let cpu = trident::device::cpu::CpuDevice::new(1);
    let mut c_dst = cpu.alloc(600);
    cpu.upload(&mut c_dst, &[-1.0; 600]);
    let mut c_src = cpu.alloc(1000);
    cpu.upload(&mut c_src, &src);
    cpu.copy(&mut c_dst, 100, &c_src, 337, 401);
    let mut c_got = vec![0f32; 600];
    cpu.download(&c_dst, &mut c_got);
    assert_eq!(c_got, want);
    // No communicator for a group the Device was not given: host staging.
    assert!(dev.device_comm(&trident::comm::SelfComm).is_none());
}

/// cuMemFree synchronizes the whole device (and would make the host wait for pipeline sends whose
/// receives the peer posts later): the runtime keeps freed blocks and hands them to requests of
/// the same size, and a Device buffer made from a reused block still starts zeroed. The counters
/// tell the driver's allocations and frees from the kept blocks' reuse.
#[test]
fn freed_device_memory_is_reused_by_requests_of_its_size_and_starts_zeroed() {
    use trident::gpu::cuda_runtime::CudaRuntime;
    use trident::gpu::runtime::{Counted, GpuRuntime, VendorRuntime};
    if device().is_none() {
        return;
    }
    let rt = Counted::new(CudaRuntime::new(trident::gpu::driver::Driver::load().unwrap(), 0).unwrap());
    let a = rt.alloc(4096).unwrap();
    rt.free(a, 4096);
    let b = rt.alloc(2048).unwrap();
    assert_ne!(a, b, "a block of another size was handed out");
    assert_eq!(rt.alloc(4096).unwrap(), a, "the freed block was not reused");
    assert_ne!(rt.alloc(4096).unwrap(), a, "one block was handed out twice");
    let c = rt.tally().snapshot();
    assert_eq!((c.allocations, c.allocation_bytes, c.reused_allocations, c.kept_frees), (3, 10240, 1, 1));
    assert_eq!((c.frees, c.synchronizations), (0, 0), "a kept block costs no cuMemFree");
    let tally = rt.tally().clone();
    rt.free(b, 2048);
    drop(rt);
    let c = tally.snapshot();
    assert_eq!((c.kept_frees, c.frees, c.synchronizations), (2, 1, 1), "the kept block is freed at the end");
    // A Device of its own, so that no other test's work is counted.
    let dev = &GpuDevice::cuda(0).unwrap();
    let mut x = dev.alloc(777);
    dev.fill(&mut x, 5.0);
    let before = dev.work_counters().unwrap();
    drop(x);
    let y = dev.alloc(777);
    let reuse = dev.work_counters().unwrap().since(&before);
    assert_eq!((reuse.kept_frees, reuse.reused_allocations, reuse.allocations, reuse.memsets), (1, 1, 0, 1));
    assert_eq!(down(dev, &y), vec![0.0; 777]);
}

#[test]
fn every_device_op_matches_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::every_op_matches_the_reference(dev, SEED);
}

/// RMSNorm's one-launch backward over 1,100 rows: 35 blocks in 3 groups, so the two-level
/// last-block sum of the dweight partials runs (`check ops --size small` stays within one group),
/// the same bits on a second run from the same inputs (the counters back at 0), and dinp and
/// dweight against the reference within docs/design.md's bf16 rule and f32 roundings.
#[test]
fn rmsnorm_backward_sums_its_block_groups_deterministically() {
    use trident::cmd::check::ops::{compare, Bound};
    use trident::device::reference::ReferenceDevice;
    use trident::real::Precision::Bf16;
    let Some(dev) = device() else { return };
    let (rows, cols) = (1100, 40);
    let value = |i: usize, k: f32| Bf16.round(((i as f32 * k).sin() * 1.7 + 0.1).clamp(-3.0, 3.0));
    let x: Vec<f32> = (0..rows * cols).map(|i| value(i, 0.37)).collect();
    let dy: Vec<f32> = (0..rows * cols).map(|i| value(i, 0.91)).collect();
    let w: Vec<f32> = (0..cols).map(|c| 0.5 + c as f32 / 40.0).collect();
    let up16 = |host: &[f32]| {
        let mut b = dev.alloc_in(host.len(), Bf16);
        dev.upload(&mut b, host);
        b
    };
    let (gx, gdy, gw) = (up16(&x), up16(&dy), up(dev, &w));
    let (mut out, mut rstd) = (dev.alloc_in(rows * cols, Bf16), dev.alloc(rows));
    dev.rmsnorm_forward(&mut out, &mut rstd, &gx, &gw, Matrix { rows, cols }, 1e-6);
    let run = || {
        let (mut dx, mut dw) = (up16(&vec![0.25; rows * cols]), up(dev, &vec![1.0; cols]));
        dev.rmsnorm_backward(&mut dx, &mut dw, &gdy, (&gx, &gw), &rstd, Matrix { rows, cols });
        (down(dev, &dx), down(dev, &dw))
    };
    let (dx, dw) = run();
    assert_eq!(run(), (dx.clone(), dw.clone()), "a second backward gave other bits");
    let r = ReferenceDevice;
    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let (mut rout, mut rrstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
    r.rmsnorm_forward(&mut rout, &mut rrstd, &wide(&x), &wide(&w), Matrix { rows, cols }, 1e-6);
    let (mut rdx, mut rdw) = (vec![0.25; rows * cols], vec![1.0; cols]);
    r.rmsnorm_backward(&mut rdx, &mut rdw, &wide(&dy), (&wide(&x), &wide(&w)), &rrstd, Matrix { rows, cols });
    for c in [
        compare("rmsnorm_forward out", "", &down(dev, &out), &rout, Bound::Bf16),
        compare("rmsnorm_backward dinp", "", &dx, &rdx, Bound::Bf16),
        compare("rmsnorm_backward dweight", "", &dw, &rdw, Bound::F32(2e-5)),
    ] {
        assert!(c.passed(), "{}", c.line());
    }
}

#[test]
fn adamw_group_is_one_launch_with_the_bits_of_adamw_per_tensor() {
    let Some(_) = device() else { return };
    gpu_device::adamw_group_is_adamw_per_tensor_bit_for_bit(|| GpuDevice::cuda(0).unwrap());
}

#[test]
fn zero_buffers_is_one_launch_that_zeroes_exactly_its_buffers() {
    let Some(_) = device() else { return };
    gpu_device::zero_buffers_is_fill_zero_in_one_launch(|| GpuDevice::cuda(0).unwrap());
}

#[test]
fn bf16_buffers_round_trip_and_bf16_storage_agrees_with_f32() {
    let Some(dev) = device() else { return };
    gpu_device::bf16_buffers_round_trip(dev);
    gpu_device::bf16_storage_agrees_with_f32_storage(dev);
}

#[test]
fn the_head_dim_check_names_the_device() {
    let e = GpuDevice::check_head_dim(96).unwrap_err().to_string();
    assert!(e.contains("--device cuda") && e.contains("head dims 32, 64 and 128") && e.contains("is 96"), "{e}");
}

#[test]
fn train_on_cuda_follows_the_cpu_bf16_losses_and_parallel_layouts_follow_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-train");
    let data = prepared_corpus(&dir);
    let gpu = gpu_device::follows_the_cpu_bf16_losses(&emu.env, &dir, &data, "cuda");
    // Deterministic, and a checkpoint of device buffers resumes the run bit for bit.
    let ckpt = dir.join("ckpt");
    let ckpt_s = ckpt.to_str().unwrap();
    let first = train_losses(&emu.env, &dir, &data, "cuda", 1, &["--save", ckpt_s, "--exit-interval", "3"]);
    // The resumed run profiles its first iteration (4): the driver's profiler range opens before
    // it and closes after it, and the losses do not notice.
    let profiled = dir.join("profiler.log");
    let mut env = emu.env.clone();
    env.push(("EMU_PROFILER_LOG", profiled.clone()));
    let profile = ["--profile", "--profile-step-start", "3", "--profile-step-end", "4"];
    let resumed = train_losses(&env, &dir, &data, "cuda", 1, &[&["--load", ckpt_s][..], &profile].concat());
    assert_eq!(first, gpu[..3], "a second run differs");
    assert_eq!(resumed, gpu[3..], "the resumed run differs from the uninterrupted one");
    assert_eq!(std::fs::read_to_string(&profiled).unwrap(), "start\nstop\n", "cuProfilerStart, then Stop");
    // Tensor x pipeline parallel on the CUDA Device, through the host-staged MPI path: the same
    // run as one rank, up to the reduction order's f32 rounding (and the bf16 roundings after it).
    // 2-D tensor parallelism (SUMMA) adds the split LayerNorm (`layernorm_sums` and friends).
    // (`--gpu-collectives mpi`; `nccl_collectives_*` below runs the NCCL path.)
    let layouts: [(&str, &[&str]); 2] = [
        (
            "TP 2 x PP 2",
            &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--gpu-collectives", "mpi"],
        ),
        (
            "2-D TP 2 x 2",
            &["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d", "--gpu-collectives", "mpi"],
        ),
    ];
    for (name, flags) in layouts {
        gpu_device::assert_follows_one_rank(&gpu, name, &train_losses(&emu.env, &dir, &data, "cuda", 4, flags));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The `tiny` preset itself (4 heads of 32: the d 32 attention kernels) trains on the CUDA Device
/// and follows the CPU's `--bf16` losses (on a short sequence, so it runs in seconds here).
#[test]
fn train_tiny_preset_on_cuda_follows_the_cpu_bf16_losses() {
    let Some(emu) = emulated() else { return };
    gpu_device::tiny_preset_follows_the_cpu_bf16_losses(emu, "cuda");
}

/// Per-document attention (`--reset-attention-mask`) trains on the CUDA Device as on the CPU.
#[test]
fn train_documents_on_cuda_follows_the_cpu_bf16_losses() {
    let Some(emu) = emulated() else { return };
    gpu_device::tiny_preset_documents_follow_the_cpu(emu, "cuda");
}

/// The `llama-tiny` preset (grouped-query attention, RMSNorm, SwiGLU, rotary) trains on the CUDA
/// Device and follows the CPU's `--bf16` losses, and on two tensor-parallel ranks the one-rank run.
#[test]
fn train_llama_tiny_preset_on_cuda_follows_the_cpu_bf16_losses_and_tensor_parallel_one_rank() {
    let Some(emu) = emulated() else { return };
    gpu_device::llama_tiny_preset_follows_the_cpu_bf16_losses(emu, "cuda");
}

/// Trains layout `name` with `--gpu-collectives nccl` (through the fake NCCL with its `settings`)
/// and with `--gpu-collectives mpi`, which must call NCCL for nothing: both runs' losses, and the
/// operations of the NCCL run counted by name.
fn through_nccl_and_mpi(
    emu: &Emulated,
    dir_data: (&Path, &str),
    (nccl, settings): (&Path, &[(&'static str, &str)]),
    (name, ranks, flags): (&str, usize, &[&str]),
) -> ([Vec<f64>; 2], std::collections::BTreeMap<String, usize>) {
    let run = |path: &str| {
        let args = [flags, &["--gpu-collectives", path]].concat();
        let (losses, calls) =
            gpu_device::train_logging_nccl(emu, dir_data, ("TRIDENT_NCCL", nccl), settings, ("cuda", ranks, &args));
        eprintln!("{name}, --gpu-collectives {path}: NCCL calls on all ranks {calls:?}");
        (losses, calls)
    };
    let (on_device, calls) = run("nccl");
    let (on_host, none) = run("mpi");
    assert!(none.is_empty(), "{name}: --gpu-collectives mpi called NCCL: {none:?}");
    ([on_device, on_host], calls)
}

#[test]
fn nccl_collectives_on_device_memory_match_mpi_and_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-train");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    // Three iterations: the collectives of a step are the same every step.
    let iters = ["--train-iters", "3"];
    let one = train_losses(&emu.env, &dir, &data, "cuda", 1, &iters);
    // (name, ranks, flags, the operations the NCCL path must have run)
    let layouts: [(&str, usize, &[&str], &[&str]); 3] = [
        // The vocab-parallel cross-entropy's row maxima and sums, f64 on device memory.
        (
            "TP 2 x PP 2",
            4,
            &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
            &["all_reduce", "all_reduce f64 max", "all_reduce f64 sum"],
        ),
        ("DP 2 with ZeRO-1", 2, &["--use-distributed-optimizer"], &["reduce_scatter", "all_gather"]),
        (
            "TP 2 x DP 2, sequence parallel",
            4,
            &["--tensor-model-parallel-size", "2", "--sequence-parallel"],
            &["all_gather", "reduce_scatter", "all_reduce"],
        ),
    ];
    for (name, ranks, flags, ops) in layouts {
        let flags = &[flags, &iters[..]].concat();
        let (losses, calls) = through_nccl_and_mpi(emu, (&dir, &data), (&nccl, &[]), (name, ranks, flags));
        for op in ops {
            assert!(calls.get(*op).is_some_and(|&n| n > 0), "{name}: no {op} through NCCL: {calls:?}");
        }
        // Both paths sum in rank order (the fake NCCL by construction, MPI over two ranks
        // trivially), so they agree bit for bit; one rank differs by the reduction order only.
        assert_eq!(losses[0], losses[1], "{name}: NCCL and MPI paths differ");
        gpu_device::assert_follows_one_rank(&one, name, &losses[0]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The distributed optimizer in buckets on device memory: under `--overlap-grad-reduce` each
/// bucket's reduce-scatter is enqueued on the communicator's stream during the last backward
/// (the fake NCCL asynchronous, as NCCL is: its worker is that stream, ordered after the compute
/// enqueued before by an event, and compute after the step waits on it), with the same bits as
/// reduce-scatters after backward and as the MPI path; one reduce-scatter and one all-gather of
/// the weights per bucket and step. Under TP 2 with sequence parallelism the sequence-parallel
/// gradients are summed over the pair on the device after the reduce-scatter.
#[test]
fn zero1_buckets_reduce_scatter_during_backward_on_nccl_with_the_same_bits() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-zero-overlap");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let zero = ["--train-iters", "3", "--use-distributed-optimizer", "--ddp-bucket-size", "100000"];
    let settings = [("FAKE_NCCL_ASYNC", "1")];
    let sp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"];
    // `--grad-reduce-in-bf16`: the reduce-scatters on bf16 device buffers (NCCL's bf16 sum).
    let bf16 = ["--bf16", "--grad-reduce-in-bf16"];
    for (name, ranks, extra) in [("DP 2", 2, &[][..]), ("TP 2 x DP 2, SP", 4, &sp[..]), ("DP 2, bf16 sums", 2, &bf16)] {
        let plain = [&zero[..], extra].concat();
        // Through MPI, the weights' all-gathers also finish as the next forward reaches them.
        let overlap = [&plain[..], &["--overlap-grad-reduce", "--overlap-param-gather"]].concat();
        let go = |flags: &[&str]| through_nccl_and_mpi(emu, (&dir, &data), (&nccl, &settings), (name, ranks, flags));
        let ((after, after_calls), (during, calls)) = (go(&plain), go(&overlap));
        assert_eq!(after[0], after[1], "{name}, after backward: NCCL and MPI paths differ");
        assert_eq!(during[0], during[1], "{name}, overlapped: NCCL and MPI paths differ");
        assert_eq!(during[0], after[0], "{name}: the overlap changed the losses");
        assert_eq!(calls, after_calls, "{name}: the same collectives, only earlier");
        // Three steps: each rank's parameters in buckets of at least 100,000 elements, their
        // weights all-gathered in f32 (sequence parallelism's activations go in bf16).
        let per_step = calls.get("all_gather f32").copied().unwrap_or(0) / (ranks * 3);
        assert!((2..=9).contains(&per_step), "{name}: {per_step} buckets per step: {calls:?}");
        match name {
            "DP 2" => assert_eq!(calls.get("all_gather f32"), calls.get("reduce_scatter f32 sum"), "{calls:?}"),
            "DP 2, bf16 sums" => {
                assert_eq!(calls.get("all_gather f32"), calls.get("reduce_scatter bf16 sum"), "{calls:?}")
            }
            _ => {}
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// ZeRO-2 (`--data-parallel-sharding-strategy optim_grads`) on device memory: every bucket is
/// reduce-scattered each micro-batch from a packed copy made for it (its whole gradients
/// released) and summed into its block on the device; overlapped or not, through NCCL or MPI,
/// the same bits, and two micro-batches make two reduce-scatters per weight all-gather. The
/// collectives run on a stream of their own, each after an event the compute stream recorded,
/// and the compute stream waits for events recorded on theirs (`assert_ordered_by_events`).
#[test]
fn zero2_reduce_scatters_every_micro_batch_on_nccl_with_the_same_bits() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-zero2");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    // 4 samples over 2 ranks in micro-batches of 1: two micro-batches per step.
    let zero2 = ["--train-iters", "3", "--data-parallel-sharding-strategy", "optim_grads", "--micro-batch-size", "1"];
    let streams = dir.join("streams.log");
    let settings = [("FAKE_NCCL_ASYNC", "1"), ("EMU_STREAM_LOG", streams.to_str().unwrap())];
    let bf16 = ["--bf16", "--grad-reduce-in-bf16"];
    for (name, extra, sums) in
        [("DP 2", &[][..], "reduce_scatter f32 sum"), ("DP 2, bf16 sums", &bf16, "reduce_scatter bf16 sum")]
    {
        let plain = [&zero2[..], extra].concat();
        let overlap = [&plain[..], &["--overlap-grad-reduce", "--overlap-param-gather"]].concat();
        let go = |flags: &[&str]| through_nccl_and_mpi(emu, (&dir, &data), (&nccl, &settings), (name, 2, flags));
        let ((after, after_calls), (during, calls)) = (go(&plain), go(&overlap));
        assert_eq!(after[0], after[1], "{name}: NCCL and MPI paths differ");
        assert_eq!(during[0], during[1], "{name}, overlapped: NCCL and MPI paths differ");
        assert_eq!(during[0], after[0], "{name}: the overlap changed the losses");
        assert_eq!(calls, after_calls, "{name}: the same collectives");
        let (gathers, scatters) = (calls.get("all_gather f32").copied(), calls.get(sums).copied());
        assert!(gathers.is_some_and(|g| g > 0 && scatters == Some(2 * g)), "{name}: {calls:?}");
    }
    assert_ordered_by_events(&std::fs::read_to_string(&streams).unwrap());
    let _ = std::fs::remove_dir_all(dir);
}

/// From the emulated driver's and the fake NCCL's EMU_STREAM_LOG, for every process that ran
/// reduce-scatters or all-gathers through NCCL: no kernel was launched on their streams; each
/// followed, since the operation before it on its stream, that stream's wait for an event last
/// recorded on a compute stream (one kernels run on); and the compute stream waited for events
/// recorded on the collectives' streams.
fn assert_ordered_by_events(log: &str) {
    use std::collections::{HashMap, HashSet};
    let by_pid = by_process(log);
    let mut checked = 0;
    for (pid, lines) in by_pid {
        let compute: HashSet<&str> = lines.iter().filter(|w| w[0] == "launch").map(|w| w[1]).collect();
        let (mut recorded_on, mut ready, mut collectives, mut back) = (HashMap::new(), HashSet::new(), 0, 0);
        for w in &lines {
            match w[..] {
                ["record", event, stream] => drop(recorded_on.insert(event, stream)),
                ["wait", stream, event] => match recorded_on.get(event) {
                    Some(on) if compute.contains(on) => drop(ready.insert(stream)),
                    Some(_) if compute.contains(stream) => back += 1,
                    _ => {}
                },
                ["nccl", "reduce_scatter" | "all_gather", stream] => {
                    assert!(!compute.contains(stream), "process {pid}: a collective on the compute stream {stream}");
                    assert!(ready.remove(stream), "process {pid}: a collective on {stream} not ordered after compute");
                    collectives += 1;
                }
                _ => {}
            }
        }
        if collectives > 0 {
            assert!(back > 0, "process {pid}: the compute stream never waited for the collectives' stream");
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} processes ran collectives through NCCL");
}

/// EMU_STREAM_LOG's lines by process id, each as its words after the id.
fn by_process(log: &str) -> std::collections::HashMap<&str, Vec<Vec<&str>>> {
    let mut by_pid: std::collections::HashMap<&str, Vec<Vec<&str>>> = std::collections::HashMap::new();
    for line in log.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        by_pid.entry(words[0]).or_default().push(words[1..].to_vec());
    }
    by_pid
}

/// Pipeline p2p through NCCL on device memory, for every schedule, against the same runs with
/// pipeline messages through MPI on host memory. The fake NCCL runs asynchronously here, as the
/// real one does (each communicator's operations finish later on its own "stream"; the emulated
/// driver makes events, stream waits and cuMemFree wait for them), and moves messages in 4 KiB
/// pieces, so a send waits for its receive: an order of sends and receives that would deadlock
/// or mix up messages on a GPU node fails (or times out) here.
#[test]
fn pipeline_p2p_on_device_memory_matches_mpi_for_every_schedule() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-p2p");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    // Three iterations: each runs its schedule whole (warm-up, steady state, cool-down).
    let pp2: &[&str] = &["--pipeline-model-parallel-size", "2", "--global-batch-size", "8", "--train-iters", "3"];
    let layouts: [(&str, usize, Vec<&str>); 8] = [
        ("PP 2, 1F1B", 2, pp2.to_vec()),
        ("PP 2, GPipe", 2, [pp2, &["--pipeline-schedule", "gpipe"]].concat()),
        // The zero-bubble W pass on the GPU Device: B's input-gradient GEMM alone, W's weight
        // GEMM from the kept operands.
        ("PP 2, zero-bubble H1", 2, [pp2, &["--pipeline-schedule", "zb-h1"]].concat()),
        (
            "PP 2 x 2 virtual stages, interleaved 1F1B",
            2,
            [pp2, &["--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "1"]].concat(),
        ),
        ("PP 4, 1F1B", 4, [&pp2[2..], &["--pipeline-model-parallel-size", "4", "--num-layers", "4"]].concat()),
        // Zero-bubble V: both kinds of message flow both ways (eight links), the turn stays on
        // the last stage.
        ("PP 2, zero-bubble V", 2, [pp2, &["--num-layers", "4", "--pipeline-schedule", "zb-v"]].concat()),
        (
            "PP 4, zero-bubble V",
            4,
            [&pp2[2..], &["--pipeline-model-parallel-size", "4", "--num-layers", "8", "--pipeline-schedule", "zb-v"]]
                .concat(),
        ),
        (
            "TP 2 x PP 2 x 2 virtual stages, sequence parallel",
            4,
            [
                pp2,
                &["--tensor-model-parallel-size", "2", "--sequence-parallel", "--num-layers", "4"],
                &["--num-layers-per-virtual-pipeline-stage", "1"],
            ]
            .concat(),
        ),
    ];
    // Asynchronous, in 4 KiB pieces.
    let fake = [("FAKE_NCCL_ASYNC", "1"), ("FAKE_NCCL_P2P_CHUNK", "4096"), ("FAKE_NCCL_TIMEOUT_SECS", "60")];
    for (name, ranks, flags) in layouts {
        let (losses, calls) = through_nccl_and_mpi(emu, (&dir, &data), (&nccl, &fake), (name, ranks, &flags));
        // Every message is one send and one receive, each its own call.
        let n = calls.get("send_recv").copied().unwrap_or(0);
        assert!(n > 0 && n % 2 == 0, "{name}: pipeline messages did not go through NCCL: {calls:?}");
        assert_eq!(losses[0].len(), 3, "{name}: {:?}", losses[0]);
        assert_eq!(losses[0], losses[1], "{name}: pipeline p2p through NCCL and through MPI differ");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn log_comm_counts_the_nccl_path_as_the_mpi_path() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-logcomm");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let report = |path: &str| {
        let mut c = mpirun_command(2, &["train", "--device", "cuda"]);
        c.args(["--data-path", &data, "--train-iters", "2", "--log-comm"]).args(TINY_GPU).args([
            "--tensor-model-parallel-size",
            "2",
            "--cpu-threads",
            "1",
            "--gpu-collectives",
            path,
        ]);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        c.env("TRIDENT_NCCL", &nccl).env("TRIDENT_RCCL", &nccl);
        let o = c.output().expect("mpirun runs");
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let lines: Vec<String> =
            out.lines().filter(|l| l.starts_with("   layer") || l.starts_with("   step")).map(String::from).collect();
        assert!(out.contains(&format!("--gpu-collectives {path}")), "{out}");
        if path != "mpi" {
            assert!(out.contains(&format!("collectives: {} ", path.to_uppercase())), "{out}");
        }
        lines
    };
    let (on_device, on_host) = (report("nccl"), report("mpi"));
    assert!(on_device.iter().any(|l| l.contains("tensor group of 2") && !l.contains(": 0 (")), "{on_device:?}");
    assert_eq!(on_device, on_host);
    // RCCL is the same table from TRIDENT_RCCL (here the same fake library).
    assert_eq!(report("rccl"), on_host);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn nccl_training_ends_on_a_dead_peer_or_a_missing_library_with_one_clear_line() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-fail");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let mut args = vec!["train", "--device", "cuda", "--data-path", &data, "--train-iters", "4"];
    args.extend_from_slice(TINY_GPU);
    args.extend_from_slice(&["--tensor-model-parallel-size", "2", "--cpu-threads", "1"]);
    let run = |args: &[&str], env: &[(&str, &Path)]| {
        let t = std::time::Instant::now();
        let o = mpirun_command(2, args).envs(emu.env.iter().cloned()).envs(env.iter().copied()).output();
        (o.expect("mpirun runs"), t.elapsed())
    };
    let mpirun = |env: &[(&str, &Path)]| run(&args, env);
    // Rank 1 stops taking part at its 20th collective (during the first iteration's backward);
    // the fake NCCL gives up after 2 s and rank 0 ends with NCCL's error.
    let (o, took) = mpirun(&[
        ("TRIDENT_NCCL", &nccl),
        ("FAKE_NCCL_FAIL_RANK", Path::new("1")),
        ("FAKE_NCCL_FAIL_AT", Path::new("20")),
        ("FAKE_NCCL_TIMEOUT_SECS", Path::new("2")),
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("trident: error: rank 0: NCCL: ncclAllReduce failed with ncclRemoteError (6)")
                && l.contains("rank 1 did not arrive at ncclAllReduce within 2 s")
                && l.ends_with("(--gpu-collectives)")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Pipeline p2p: process 1 (the last stage) stops taking part at its 5th operation on one of
    // its links; stage 0's receive of the gradients ends at the fake's timeout with one line.
    let mut pp_args = args.clone();
    let tp = pp_args.iter().position(|a| *a == "--tensor-model-parallel-size").unwrap();
    pp_args[tp] = "--pipeline-model-parallel-size";
    let (o, took) = run(
        &pp_args,
        &[
            ("TRIDENT_NCCL", &nccl),
            ("FAKE_NCCL_FAIL_PROCESS", Path::new("1")),
            ("FAKE_NCCL_FAIL_AT", Path::new("5")),
            ("FAKE_NCCL_TIMEOUT_SECS", Path::new("2")),
        ],
    );
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    eprintln!("a vanished pipeline peer, after {:.1} s:\n{err}", took.as_secs_f64());
    assert!(
        err.lines().any(|l| l.starts_with("trident: error: rank 0: NCCL: ")
            && l.contains("ncclRemoteError (6)")
            && l.ends_with("(pipeline p2p, --gpu-collectives)")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // No NCCL library: one line naming the flag and the way out, every rank exits non-zero.
    let (o, _) = mpirun(&[("TRIDENT_NCCL", Path::new("/nonexistent/libnccl.so.2"))]);
    let err = stderr(&o);
    assert!(!o.status.success());
    let lines: Vec<_> = err.lines().filter(|l| l.starts_with("trident: error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("--gpu-collectives nccl: ") && lines[0].contains("--gpu-collectives mpi"), "{err}");
    // Flag values.
    let o =
        run_with(&emu.env, &["train", "--device", "cuda", "--bf16", "--gpu-collectives", "gloo", "--data-path", "x"]);
    assert_clean_error(&o, &["--gpu-collectives", "gloo", "nccl, rccl or mpi"]);
    let o = run_with(&emu.env, &["train", "--gpu-collectives", "nccl", "--data-path", "x"]);
    assert_clean_error(&o, &["--gpu-collectives nccl moves device memory and needs --device cuda or hip"]);
    let o =
        run_with(&emu.env, &["train", "--device", "hip", "--bf16", "--gpu-collectives", "nccl", "--data-path", "x"]);
    assert_clean_error(&o, &["--gpu-collectives nccl is NVIDIA's library; on AMD GPUs use rccl"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `check ops --fp16`: every Device op on the fp16 module (binary16 storage: rounding, the 16-bit
/// copies, AdamW's working copy, GEMMs and attention on f16 operands) within fp16's bounds; and
/// each emulating driver refuses the other storage type's modules, so no test runs one module's
/// kernels on the other's buffers.
#[test]
fn the_fp16_module_passes_every_op_check_and_each_driver_refuses_the_other_module() {
    let (Some(emu), Some(fp16)) = (emulated(), gpu_device::fp16_env(emulated)) else { return };
    gpu_device::fp16_module_passes_every_op_check_and_each_runtime_refuses_the_other(
        &emu.env,
        fp16,
        "cuda",
        ("driver", "CUDA_ERROR_INVALID_IMAGE"),
    );
}

/// `--device cuda --fp16` with tensor (and sequence) or pipeline parallelism on NCCL: binary16
/// buffers through the fake NCCL as ncclFloat16, the same run as through MPI on the host, and
/// one rank's within 1e-3.
#[test]
fn fp16_tensor_and_pipeline_parallel_over_nccl_match_mpi_and_one_rank() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("cuda-nccl-fp16");
    let nccl = fake_nccl(&dir);
    gpu_device::tiny_preset_fp16_over_nccl_matches_mpi(fp16, &dir, ("TRIDENT_NCCL", &nccl), "cuda");
    let _ = std::fs::remove_dir_all(dir);
}

/// Context parallelism on the CUDA Device: the swap's all-to-alls through the fake NCCL on
/// device memory and through MPI give the same run, one rank's within 1e-3.
#[test]
fn context_parallel_over_nccl_matches_mpi_and_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-cp");
    let nccl = fake_nccl(&dir);
    gpu_device::context_parallel_over_nccl_matches_mpi_and_one_rank(&emu.env, &dir, ("TRIDENT_NCCL", &nccl), "cuda");
    let _ = std::fs::remove_dir_all(dir);
}

/// The context-parallel ring (`--cp-comm-type p2p`, CP 2) on the CUDA Device through the
/// asynchronous fake NCCL: the same losses as through MPI, and in the emulated driver's and the
/// fake NCCL's stream log every pass on a stream no kernel runs on, after an event recorded on
/// the compute stream, the compute stream waiting for it again, and block kernels launched on the
/// compute stream while passes were in flight (the key/value rows forward and backward, and the
/// key/value gradient beside the next step's blocks). Waiting at once in `pass_start` fails it.
#[test]
fn the_ring_passes_keys_and_values_beside_the_blocks_on_nccl() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-ring");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let streams = dir.join("streams.log");
    let settings =
        [("FAKE_NCCL_ASYNC", "1"), ("EMU_STREAM_LOG", streams.to_str().unwrap()), ("EMU_STREAM_LOG_LAUNCHES", "all")];
    let flags = ["--train-iters", "2", "--context-parallel-size", "2", "--cp-comm-type", "p2p"];
    let ([on_device, on_host], calls) =
        through_nccl_and_mpi(emu, (&dir, &data), (&nccl, &settings), ("CP 2, p2p", 2, &flags));
    assert_eq!(on_device, on_host, "the ring through NCCL and through MPI differ");
    assert!(calls.get("send_recv").is_some_and(|&n| n > 0), "{calls:?}");
    let overlapped = passes_beside_compute(&std::fs::read_to_string(&streams).unwrap());
    assert!(
        overlapped.len() >= 2 && overlapped.iter().all(|&(passes, beside)| passes > 0 && beside > 0),
        "{overlapped:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Per process of `log` (EMU_STREAM_LOG with every launch) that ran sends and receives through
/// NCCL: how many it ran, and how many of them had kernels launched on a compute stream between
/// their submission and the compute stream's wait for their stream; each checked to run on a
/// stream no kernel runs on, after its stream waited for an event recorded on a compute stream.
fn passes_beside_compute(log: &str) -> Vec<(usize, usize)> {
    use std::collections::{HashMap, HashSet};
    let by_pid = by_process(log);
    let mut out = Vec::new();
    for (pid, lines) in by_pid {
        let compute: HashSet<&str> = lines.iter().filter(|w| w[0] == "launch").map(|w| w[1]).collect();
        let (mut recorded_on, mut ready) = (HashMap::new(), HashSet::new());
        // Passes in flight: their stream and the compute launches since.
        let (mut open, mut passes, mut beside): (Vec<(&str, usize)>, usize, usize) = (Vec::new(), 0, 0);
        for w in &lines {
            match w[..] {
                ["launch", _] => open.iter_mut().for_each(|p| p.1 += 1),
                ["record", event, stream] => drop(recorded_on.insert(event, stream)),
                ["wait", stream, event] => match recorded_on.get(event) {
                    Some(on) if compute.contains(on) => drop(ready.insert(stream)),
                    Some(on) if compute.contains(stream) => {
                        let (landed, left): (Vec<_>, Vec<_>) = open.into_iter().partition(|p| p.0 == *on);
                        beside += landed.iter().filter(|p| p.1 > 0).count();
                        open = left;
                    }
                    _ => {}
                },
                ["nccl", "send_recv", stream] => {
                    assert!(!compute.contains(stream), "process {pid}: a pass on the compute stream {stream}");
                    assert!(ready.remove(stream), "process {pid}: a pass on {stream} not ordered after compute");
                    open.push((stream, 0));
                    passes += 1;
                }
                _ => {}
            }
        }
        if passes > 0 {
            out.push((passes, beside));
        }
    }
    out
}

/// `train --device cuda --fp16` on the tiny preset: the loss scaler on the device path skips the
/// same overflowed steps and backs its scale off as the CPU's `--fp16` does.
#[test]
fn train_tiny_preset_on_cuda_fp16_skips_and_backs_off_as_the_cpu_does() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("cuda-train-fp16");
    gpu_device::tiny_preset_fp16_skips_as_the_cpu_does(fp16, &dir, "cuda");
    let _ = std::fs::remove_dir_all(dir);
}

/// `train --device cuda --fp16` on the `llama-tiny` preset: the fp16 module's Llama-family
/// kernels follow the CPU's `--fp16` losses.
#[test]
fn train_llama_tiny_preset_on_cuda_fp16_follows_the_cpu() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("cuda-train-llama-fp16");
    gpu_device::llama_tiny_preset_fp16_follows_the_cpu(fp16, &dir, "cuda");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 18: no device read between log lines; the logged loss and norm as a per-step read gives.
#[test]
fn training_reads_the_device_once_per_log_interval() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-reads");
    gpu_device::train_reads_the_device_once_per_log_interval(&emu.env, &dir, "cuda");
}

/// Issue 18 in TP x PP (sequence parallel) and ZeRO-1 layouts: the gradient norm's sums on the
/// NCCL communicators, no device read between log lines and no allocation after the first step
/// on any rank; the norms are the MPI path's and the one-rank run's.
#[test]
fn multi_rank_training_reads_the_device_once_per_log_interval() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-reads-multi");
    let nccl = fake_nccl(&dir);
    gpu_device::multi_rank_training_reads_the_device_once_per_log_interval(&emu.env, &dir, &nccl, "cuda");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cuda_without_bf16_or_with_another_head_dim_is_a_clear_error() {
    let Some(emu) = emulated() else { return };
    gpu_device::without_bf16_or_with_another_head_dim_is_a_clear_error(emu, "cuda");
}

#[test]
fn check_gpu_compares_the_device_with_the_reference() {
    let Some(emu) = emulated() else { return };
    let o = run_with(&emu.env, &["check", "gpu"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("trident_smoke_axpy launched over 1048579 elements") && out.contains("result exact"), "{out}");
    assert!(
        out.contains(&format!(
            "gpu check: device 0: the CUDA Device matches the reference device on {} op outputs",
            gpu_device::ops_checked()
        )),
        "{out}"
    );
    assert!(out.contains("gpu check: passed on 1 NVIDIA device"), "{out}");
}

#[test]
fn the_emulating_driver_checks_images_names_and_launches() {
    use trident::gpu::cache::ModuleCache;
    use trident::gpu::cuda_runtime::CudaRuntime;
    use trident::gpu::driver::Driver;
    use trident::gpu::kernels::cuda::KernelModules;
    use trident::gpu::launch::LaunchConfig;
    use trident::gpu::runtime::VendorRuntime;
    let Some(emu) = emulated() else { return };
    let rt = CudaRuntime::new(Driver::load().unwrap(), 0).unwrap();
    let cache = emu.env.iter().find(|(k, _)| *k == "TRIDENT_CACHE_DIR").unwrap().1.clone();
    let image = KernelModules::new(ModuleCache::new(&cache))
        .image("casts.cu", "sm_80", trident::gpu::kernels::Storage::Bf16)
        .unwrap();
    // A CUBIN loads; a name it does not hold is not found, even one another file defines.
    let module = rt.load_module(&image.bytes).unwrap();
    assert!(rt.function(module, "cast_f32_to_bf16").is_ok());
    let e = rt.function(module, "add_f32").unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_NOT_FOUND"), "{e}");
    // PTX text (or anything not ELF) is refused.
    let e = rt.load_module(b".version 8.0\n.target sm_80\0").unwrap_err().to_string();
    assert!(e.contains("cuModuleLoadData") && e.contains("CUDA_ERROR_INVALID_IMAGE"), "{e}");
    // A launch runs (n = 0 elements: nothing to touch); more than 1024 threads per block is refused.
    let f = rt.function(module, "cast_f32_to_bf16").unwrap();
    let (mut out, mut inp, mut n) = (0u64, 0u64, 0i32);
    let mut params: Vec<*mut std::ffi::c_void> =
        vec![(&mut out as *mut u64).cast(), (&mut inp as *mut u64).cast(), (&mut n as *mut i32).cast()];
    let config = |block: u32, shared_bytes: u32, needs_shared_optin: bool| LaunchConfig {
        grid: [1, 1, 1],
        block: [block, 1, 1],
        shared_bytes,
        needs_shared_optin,
    };
    assert!(rt.launch(f, &config(32, 0, false), &mut params).is_ok());
    let e = rt.launch(f, &config(2048, 0, false), &mut params).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
    // Dynamic shared memory: up to 48 KiB as is, more only once the function opted in (which the
    // runtime does when the launch says it must), never past the device's opt-in limit.
    assert!(rt.launch(f, &config(32, 48 * 1024, false), &mut params).is_ok());
    let e = rt.launch(f, &config(32, 64 * 1024, false), &mut params).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
    assert!(rt.launch(f, &config(32, 64 * 1024, true), &mut params).is_ok());
    let e = rt.launch(f, &config(32, 200 * 1024, true), &mut params).unwrap_err().to_string();
    assert!(e.contains("cuFuncSetAttribute") && e.contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
}

/// `make gpu-check`'s script end to end on the emulated GPU (small shapes and model, 6
/// iterations): check gpu, check ops, TP 2 x PP 2 on cuda vs cpu; and the same with a loss
/// tolerance no two backends meet, which must fail in the last step.
#[test]
fn gpu_check_script_passes_on_the_emulated_gpu_and_fails_a_tight_tolerance() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-gpu-check");
    let data = prepared_corpus(&dir);
    // The GPU run's tensors move through NCCL (the fake one, on the emulated device memory).
    let nccl = fake_nccl(&dir);
    let run = |rtol: &str| gpu_device::run_gpu_check(&emu.env, &dir, &data, rtol, &[("TRIDENT_NCCL", nccl.clone())]);
    let ops = format!("ops check: all {} outputs within their bounds", gpu_device::ops_checked());
    let wants = ["passed on 1 NVIDIA device", &ops, "losses check: 6 iterations agree", "gpu-check: passed on cuda"];
    gpu_device::assert_gpu_check_passed(&run("1e-2"), &wants);
    let o = run("1e-9");
    assert!(!o.status.success(), "a 1e-9 loss tolerance passed:\n{}", stdout(&o));
    assert!(stderr(&o).contains("check losses: iteration") && stderr(&o).contains("> 1e-9"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench gemm|attention --device cuda` launch the real kernels on the emulated GPU (one small
/// shape each): a record with the kernel, its grid, the GEMM's spot check against f64, and the
/// A100 datasheet peak the fraction is taken of.
#[test]
fn cuda_benches_launch_their_kernels_on_the_emulated_gpu() {
    let Some(emu) = emulated() else { return };
    let o = run_with(
        &emu.env,
        &["bench", "gemm", "--device", "cuda", "--shape", "256x192x128", "--min-seconds", "0.01", "--json"],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for want in [
        "\"bench\": \"gemm\"",
        "\"shape\": \"256x192x128 NT\"",
        "gemm_fwd_bf16, grid [2, 2, 1], spot check",
        "\"peak\": 312",
    ] {
        assert!(out.contains(want), "{want:?} missing from {out}");
    }
    let o = run_with(
        &emu.env,
        &["bench", "attention", "--device", "cuda", "--shape", "1x128x2x64", "--min-seconds", "0.01"],
    );
    assert!(o.status.success() && stdout(&o).contains("attention_fwd_bf16_d64"), "{}{}", stdout(&o), stderr(&o));
    let o = run_with(&emu.env, &["bench", "attention", "--device", "cuda", "--shape", "1x128x2"]);
    assert_clean_error(&o, &["--shape", "BxSxHxD"]);
}

/// `bench gemm|gemm-bwd|attention|layernorm|gelu|xent|embedding --device cuda` on tiny shapes launch
/// the kernels of the index the Device does not, each output checked against the reference device;
/// on an emulated compute capability 9.0 the GEMM benches run the sm_90a wgmma kernels instead.
/// With `every_device_op_matches_the_reference`, every kernel of the index runs on the emulated
/// GPU.
#[test]
fn gpu_kernel_benches_launch_every_kernel_the_device_does_not() {
    use trident::gpu::kernels::Vendor;
    let Some(emu) = emulated() else { return };
    let launched = gpu_device::kernel_bench_functions(&emu.env, "cuda", gpu_device::TINY_BENCH_SHAPES);
    assert_eq!(launched, gpu_device::bench_kernels(Vendor::Cuda, "sm_80"));
    let mut hopper = emu.env.clone();
    hopper.push(("EMU_CUDA_CC", PathBuf::from("90")));
    let shapes = [("gemm", "130x192x160"), ("gemm-bwd", "130x192x160")];
    let launched = gpu_device::kernel_bench_functions(&hopper, "cuda", &shapes);
    assert_eq!(launched, ["column_sum_add_bf16", "gemm_bwd_input_bf16_bf16out_sm90", "gemm_fwd_bf16_sm90"]);
    assert!(launched.iter().all(|f| gpu_device::bench_kernels(Vendor::Cuda, "sm_90a").contains(f)));
}

/// On an emulated compute capability 9.0 the Device runs the linear layers' three GEMMs on the
/// sm_90a kernels (wgmma fed by TMA, `plan::linear_gemms`): a training run of the tiny model
/// (every width a multiple of 8) follows the CPU's bf16 losses with the bound the sm_80 run meets,
/// and the emulating driver's own launch counts show that the sm_90a kernels computed every
/// product (bf16 storage's on their bf16-output twins) and the mma.sync GEMMs none. `check ops` passes with its bounds, its linear case of
/// 72 inputs and 130 outputs running the forward on sm_90a and the backward products (rows of
/// 130) on mma.sync, the other cases (33 and 1 inputs) wholly on mma.sync.
#[test]
fn on_compute_capability_9_the_linear_layers_run_on_the_sm90_gemms() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-sm90");
    let data = prepared_corpus(&dir);
    let counters = dir.join("emu-counters.txt");
    let mut hopper = emu.env.clone();
    hopper.push(("EMU_CUDA_CC", PathBuf::from("90")));
    hopper.push(("EMU_COUNTERS_FILE", counters.clone()));
    let launches = |kernels: &[&str]| -> Vec<u64> {
        let text = std::fs::read_to_string(&counters).unwrap_or_else(|e| panic!("no {}: {e}", counters.display()));
        let count = |kernel: &&str| -> u64 {
            let key = format!("launches.{kernel} ");
            text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.parse().unwrap())
        };
        kernels.iter().map(count).collect()
    };
    // Each product's sm_90a kernels, f32 out (f32 buffers: `check ops`, the partial sums a
    // tensor-parallel group reduces) and bf16 out (bf16 storage: the layers and the logits under
    // --bf16), and the mma.sync ones.
    let sm90 = ["gemm_fwd_bf16_f32out_sm90", "gemm_bwd_input_bf16_sm90", "gemm_bwd_weight_bf16_sm90"];
    let sm90_bf16 = ["gemm_fwd_bf16_sm90", "gemm_bwd_input_bf16_bf16out_sm90"];
    let sm80 = ["gemm_fwd_bf16_f32out", "gemm_bwd_input_bf16", "gemm_bwd_weight_bf16"];
    let sm80_bf16 = ["gemm_fwd_bf16", "gemm_bwd_input_bf16_bf16out"];
    gpu_device::follows_the_cpu_bf16_losses(&hopper, &dir, &data, "cuda");
    let (f32out, bf16out) = (launches(&sm90), launches(&sm90_bf16));
    let products = [f32out[0] + bf16out[0], f32out[1] + bf16out[1], f32out[2]];
    let mma = [launches(&sm80), launches(&sm80_bf16)].concat();
    assert!(products.iter().chain(&bf16out).all(|&n| n > 0), "sm_90a {f32out:?} {bf16out:?}");
    assert!(mma.iter().all(|&n| n == 0), "mma.sync {mma:?}");
    let o = run_with(&hopper, &["check", "ops", "--device", "cuda", "--size", "small"]);
    assert!(o.status.success(), "check ops on compute capability 9.0: {}{}", stdout(&o), stderr(&o));
    // On sm_90a: the 37x72->130 case's forward with and without bias, and the 1100x8->8 case's
    // products (its dW in 2 slices: check ops compares it; its input gradient twice, with the
    // weight gradient and alone); on mma.sync: 2 forwards x 2 cases, 2 backward-input (dinp
    // given, and alone) and 2 backward-weight x 3 cases; all f32 out.
    assert_eq!((launches(&sm90), launches(&sm80)), (vec![4, 2, 2], vec![4, 6, 6]));
    assert_eq!([launches(&sm90_bf16), launches(&sm80_bf16)].concat(), [0, 0, 0, 0]);
    // The report names what ran (on the H100 it once said mma.sync here).
    let said = stdout(&o);
    assert!(
        said.contains("(device 0, sm_90, ")
            && said.contains("kernels for sm_90a, bf16 GEMMs and attention (wgmma + TMA GEMMs"),
        "{said}"
    );
    // TRIDENT_CUDA_ARCH=sm_90: the same device on the mma.sync kernels alone.
    let mut mma_only = hopper.clone();
    mma_only.push(("TRIDENT_CUDA_ARCH", PathBuf::from("sm_90")));
    let o = run_with(&mma_only, &["check", "ops", "--device", "cuda", "--size", "small"]);
    assert!(o.status.success(), "check ops with TRIDENT_CUDA_ARCH=sm_90: {}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("kernels for sm_90, bf16 GEMMs and attention (mma.sync)"), "{}", stdout(&o));
    assert_eq!((launches(&sm90), launches(&sm80)), (vec![0, 0, 0], vec![8, 8, 8]));
    mma_only.push(("TRIDENT_CUDA_ARCH", PathBuf::from("sm_100")));
    let o = run_with(&mma_only, &["check", "ops", "--device", "cuda", "--size", "small"]);
    assert!(
        !o.status.success() && stderr(&o).contains("TRIDENT_CUDA_ARCH=sm_100: expected an architecture"),
        "{}",
        stderr(&o)
    );
}

/// `bench step --device cuda` on the emulated GPU: its record, its counters against the
/// emulating driver's own, and today's baseline (`gpu_device::STEP_BASELINE`).
#[test]
fn bench_step_counts_what_the_emulating_driver_counts() {
    let Some(emu) = emulated() else { return };
    gpu_device::bench_step_counts_what_the_runtime_counts(emu, "cuda");
}

/// `bench step --device cuda` on the `llama-tiny` preset (grouped-query attention, RMSNorm,
/// SwiGLU, rotary) runs on the emulated GPU: one record, with the Llama-family kernels launched.
#[test]
fn bench_step_runs_a_llama_on_cuda() {
    let Some(emu) = emulated() else { return };
    gpu_device::bench_step_runs_a_llama(emu, "cuda");
}

/// The emulating drivers' copy of `check gpu`'s smoke kernel is the binary's own source.
#[test]
fn the_emulated_smoke_kernel_is_the_binarys() {
    let inc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/smoke_axpy.inc")).unwrap();
    let code = |s: &str| -> String {
        s.lines().filter(|l| !l.trim_start().starts_with("//")).flat_map(|l| l.split_whitespace()).collect()
    };
    assert_eq!(code(&inc), code(trident::cmd::check::gpu::AXPY_SOURCE));
}
