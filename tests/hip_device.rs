//! The HIP Device on a machine without an AMD GPU: `tests/gpu/emu_libamdhip64.cpp` is a HIP
//! runtime that runs the kernels-hip/ kernels under the SIMT emulation with 64-lane wavefronts
//! (built here with g++ and loaded through `TRIDENT_LIBAMDHIP64`; it describes 8 MI250X GCDs,
//! gfx90a), and the machine's real hipRTC (Debian's ROCm 5.2, in libamdhip64.so.5) compiles them
//! to gfx90a code objects that the fake runtime checks. Every Device op runs against the reference
//! device on a few shapes (ragged ones included), with the HIP launch geometry (`Vendor::block`),
//! and `trident train --device hip --bf16` follows the CPU's `--bf16` losses on one rank and on
//! four (TP 2 x PP 2 under mpirun), where RCCL on HIP streams (the fake NCCL of
//! `tests/gpu/fake_libnccl.c` as `TRIDENT_RCCL`, asynchronous) gives the same losses bit for bit
//! as the host-staged MPI path.
//!
//! Without a hipRTC (`make test` adds Debian's as root; or `TRIDENT_HIPRTC`) these tests say loudly that
//! they skip.

mod common;
use common::gpu_device::{self, fake_nccl, train_losses, Emulated};
use common::*;

use std::path::PathBuf;
use std::sync::OnceLock;

use trident::device::prelude::*;
use trident::gpu::device::GpuDevice;

const SEED: u64 = 29;

/// The emulating runtime, built once per test process (about 5 s); hipRTC is found as usual.
fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Result<Emulated, Missing>> = OnceLock::new();
    present(BUILT.get_or_init(|| {
        trident::gpu::hiprtc::Hiprtc::load().map_err(|e| missing_hiprtc(&e))?;
        let runtime = ("emu_libamdhip64.cpp", "libamdhip64-emu.so", "the emulating HIP runtime");
        Ok(gpu_device::emulate(runtime, "TRIDENT_LIBAMDHIP64", &[]))
    }))
}

/// One HIP Device for the whole test process (its kernels compile once).
fn device() -> Option<&'static GpuDevice> {
    static DEV: OnceLock<GpuDevice> = OnceLock::new();
    emulated()?;
    Some(DEV.get_or_init(|| {
        let dev = GpuDevice::hip(0).unwrap_or_else(|e| panic!("the HIP Device on the emulated runtime: {e}"));
        let d = dev.describe();
        assert!(d.contains("Emulated AMD Instinct MI250X") && d.contains("gfx90a") && d.contains("MFMA"), "{d}");
        dev
    }))
}

#[test]
fn every_device_op_matches_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::every_op_matches_the_reference(dev, SEED);
}

#[test]
fn adamw_group_is_one_launch_with_the_bits_of_adamw_per_tensor() {
    let Some(_) = device() else { return };
    gpu_device::adamw_group_is_adamw_per_tensor_bit_for_bit(|| GpuDevice::hip(0).unwrap());
}

#[test]
fn zero_buffers_is_one_launch_that_zeroes_exactly_its_buffers() {
    let Some(_) = device() else { return };
    gpu_device::zero_buffers_is_fill_zero_in_one_launch(|| GpuDevice::hip(0).unwrap());
}

#[test]
fn bf16_buffers_round_trip_and_bf16_storage_agrees_with_f32() {
    let Some(dev) = device() else { return };
    gpu_device::bf16_buffers_round_trip(dev);
    gpu_device::bf16_storage_agrees_with_f32_storage(dev);
}

#[test]
fn the_head_dim_check_names_the_device() {
    let e = GpuDevice::check_head_dim_for("hip", 96).unwrap_err().to_string();
    assert!(e.contains("--device hip") && e.contains("head dims 32, 64 and 128") && e.contains("is 96"), "{e}");
}

/// The `tiny` preset itself (4 heads of 32: the d 32 MFMA attention kernels) trains on the HIP
/// Device and follows the CPU's `--bf16` losses (on a short sequence, so it runs in seconds here).
#[test]
fn train_tiny_preset_on_hip_follows_the_cpu_bf16_losses() {
    let Some(emu) = emulated() else { return };
    gpu_device::tiny_preset_follows_the_cpu_bf16_losses(emu, "hip");
}

/// Per-document attention (`--reset-attention-mask`) trains on the HIP Device as on the CPU.
#[test]
fn train_documents_on_hip_follows_the_cpu_bf16_losses() {
    let Some(emu) = emulated() else { return };
    gpu_device::tiny_preset_documents_follow_the_cpu(emu, "hip");
}

/// The `llama-tiny` preset (RMSNorm, SwiGLU, rotary embedding, untied output layer, and 4 query
/// heads of 32 in 2 key/value groups: the d 32 grouped-query attention kernels) trains on the HIP
/// Device and follows the CPU's `--bf16` losses within the GPT-2 bound.
#[test]
fn train_llama_tiny_preset_on_hip_follows_the_cpu_bf16_losses() {
    let Some(emu) = emulated() else { return };
    gpu_device::llama_tiny_preset_follows_the_cpu_bf16_losses(emu, "hip");
}

/// `check ops --device hip --fp16`: every Device op on the HIP fp16 module (binary16 storage:
/// rounding, the 16-bit copies, AdamW's working copy, GEMMs and attention on the f16 MFMA) within
/// fp16's bounds, its code objects compiled by hipRTC with -DTRIDENT_FP16; and each emulating
/// runtime refuses the other storage type's code objects, so no test runs one module's kernels on
/// the other's buffers.
#[test]
fn the_fp16_module_passes_every_op_check_and_each_runtime_refuses_the_other_module() {
    let (Some(emu), Some(fp16)) = (emulated(), gpu_device::fp16_env(emulated)) else { return };
    let out = gpu_device::fp16_module_passes_every_op_check_and_each_runtime_refuses_the_other(
        &emu.env,
        fp16,
        "hip",
        ("runtime", "hipErrorInvalidImage"),
    );
    assert!(out.contains("Emulated AMD Instinct MI250X"), "{out}");
}

/// `train --device hip --fp16` on the tiny preset: the loss scaler on the device path skips the
/// same overflowed steps and backs its scale off as the CPU's `--fp16` does.
#[test]
fn train_tiny_preset_on_hip_fp16_skips_and_backs_off_as_the_cpu_does() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("hip-train-fp16");
    gpu_device::tiny_preset_fp16_skips_as_the_cpu_does(fp16, &dir, "hip");
    let _ = std::fs::remove_dir_all(dir);
}

/// `train --device hip --fp16` on the `llama-tiny` preset: the fp16 module's Llama-family
/// kernels follow the CPU's `--fp16` losses.
#[test]
fn train_llama_tiny_preset_on_hip_fp16_follows_the_cpu() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("hip-train-llama-fp16");
    gpu_device::llama_tiny_preset_fp16_follows_the_cpu(fp16, &dir, "hip");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--device hip --fp16` with tensor (and sequence) or pipeline parallelism on RCCL (the default
/// with `--device hip`): binary16 buffers as ncclFloat16 through the fake NCCL as `TRIDENT_RCCL`,
/// the same run as through MPI on the host, and one rank's within 1e-3.
#[test]
fn fp16_tensor_and_pipeline_parallel_over_rccl_match_mpi_and_one_rank() {
    let Some(fp16) = gpu_device::fp16_env(emulated) else { return };
    let dir = scratch("hip-rccl-fp16");
    let rccl = fake_nccl(&dir);
    gpu_device::tiny_preset_fp16_over_nccl_matches_mpi(fp16, &dir, ("TRIDENT_RCCL", &rccl), "hip");
    let _ = std::fs::remove_dir_all(dir);
}

/// Context parallelism on the HIP Device: the swap's all-to-alls through the fake NCCL as RCCL
/// on device memory and through MPI give the same run, one rank's within 1e-3.
#[test]
fn context_parallel_over_rccl_matches_mpi_and_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-rccl-cp");
    let rccl = fake_nccl(&dir);
    gpu_device::context_parallel_over_nccl_matches_mpi_and_one_rank(&emu.env, &dir, ("TRIDENT_RCCL", &rccl), "hip");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn train_on_hip_follows_the_cpu_bf16_losses_on_one_and_four_ranks() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-train");
    let data = prepared_corpus(&dir);
    let gpu = gpu_device::follows_the_cpu_bf16_losses(&emu.env, &dir, &data, "hip");
    // Tensor x pipeline parallel on the HIP Device, through the host-staged MPI path: the same
    // run as one rank, up to the reduction order's f32 rounding (and the bf16 roundings after it).
    let tp_pp = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"];
    let parallel = train_losses(&emu.env, &dir, &data, "hip", 4, &[&tp_pp[..], &["--gpu-collectives", "mpi"]].concat());
    // RCCL on HIP streams (the default with --device hip): tensor-parallel all-reduces, the tied
    // embedding's sum and pipeline p2p on device memory, through the fake NCCL run asynchronously
    // with rendezvous sends (4 KiB pieces), as RCCL behaves; the sums are in rank order on both
    // paths, so the losses agree bit for bit.
    let rccl = fake_nccl(&dir);
    let fake = [("FAKE_NCCL_ASYNC", "1"), ("FAKE_NCCL_P2P_CHUNK", "4096")];
    let flags = [&tp_pp[..], &["--num-layers", "2"]].concat();
    let (on_device, calls) =
        gpu_device::train_logging_nccl(emu, (&dir, &data), ("TRIDENT_RCCL", &rccl), &fake, ("hip", 4, &flags));
    eprintln!("TP 2 x PP 2 on hip, RCCL calls on all ranks: {calls:?}");
    // The cross-entropy's f64 row maxima and sums too, on device memory.
    for op in ["all_reduce", "send_recv", "all_reduce f64 max", "all_reduce f64 sum"] {
        assert!(calls.get(op).is_some_and(|&n| n > 0), "no {op} through RCCL: {calls:?}");
    }
    assert_eq!(on_device, parallel, "RCCL on HIP streams and the MPI path differ");
    gpu_device::assert_follows_one_rank(&gpu, "TP 2 x PP 2", &parallel);
    let _ = std::fs::remove_dir_all(dir);
}

/// `trident check nccl --comm-library rccl` on an AMD node (no CUDA driver): every collective
/// through RCCL on the HIP runtime's streams (the fake NCCL as `TRIDENT_RCCL`, asynchronous),
/// compared with MPI bit for bit on two ranks; a planted wrong element fails it.
#[test]
fn check_rccl_runs_on_hip_streams_without_a_cuda_driver() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-check-rccl");
    let rccl = fake_nccl(&dir);
    let run = |corrupt: bool| {
        let mut c = mpirun_command(2, &["check", "nccl", "--comm-library", "rccl"]);
        c.envs(emu.env.iter().cloned());
        c.env("TRIDENT_LIBCUDA", dir.join("no-libcuda.so")).env("TRIDENT_RCCL", &rccl).env("FAKE_NCCL_ASYNC", "1");
        if corrupt {
            c.env("FAKE_NCCL_CORRUPT_RANK", "1");
        }
        c.output().expect("mpirun runs")
    };
    let o = run(false);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("collectives on device memory equal MPI's bit for bit on each of 2 ranks (RCCL"),
        "{}",
        stdout(&o)
    );
    let o = run(true);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("RCCL all_gather") && stderr(&o).contains("but MPI gives"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// `trident bench allreduce --device hip`: RCCL on HIP streams (the fake NCCL as `TRIDENT_RCCL`)
/// on two emulated GCDs, every size from 1 KiB to `--max-size`, each against the host-staged MPI
/// path measured in the same run; `--json` says the device kind.
#[test]
fn bench_allreduce_on_hip_reports_rccl_against_the_host_staged_path() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-bench-allreduce");
    let rccl = fake_nccl(&dir);
    let run = |json: bool| {
        let mut c =
            mpirun_command(2, &["bench", "allreduce", "--device", "hip", "--max-size", "64K", "--min-seconds", "0.01"]);
        if json {
            c.arg("--json");
        }
        c.envs(emu.env.iter().cloned()).env("TRIDENT_RCCL", &rccl).env("FAKE_NCCL_ASYNC", "1");
        c.output().expect("mpirun runs")
    };
    let o = run(false);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    eprintln!("{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("allreduce")).collect();
    assert_eq!(rows.len(), 7, "1 KiB to 64 KiB: {out}");
    assert!(rows[0].contains("1 KiB on 2 ranks") && rows[6].contains("64 KiB on 2 ranks"), "{out}");
    assert!(rows.iter().all(|r| r.contains("GB/s bus") && r.contains("x the host-staged MPI path")), "{out}");
    assert!(out.contains("not in the peak table"), "{out}");
    let o = run(true);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().filter(|l| l.contains("\"device_kind\": \"hip\"")).count(), 7, "{}", stdout(&o));
    // No ROCm: one line.
    let o = std::process::Command::new(BIN)
        .args(["bench", "allreduce", "--device", "hip"])
        .env("TRIDENT_LIBAMDHIP64", dir.join("no-libamdhip64.so"))
        .output()
        .unwrap();
    assert_clean_error(&o, &["bench allreduce --device hip needs an AMD GPU: ", "not found"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `bench gemm|attention|layernorm|gelu|xent|embedding --device hip` on tiny shapes launch the
/// kernels-hip/ twins of the kernels the Device does not, each output checked against the
/// reference device (so every HIP kernel of the index runs on the emulated GCD).
#[test]
fn gpu_kernel_benches_launch_every_kernel_the_device_does_not() {
    let Some(emu) = emulated() else { return };
    let launched = gpu_device::kernel_bench_functions(&emu.env, "hip", gpu_device::TINY_BENCH_SHAPES);
    assert_eq!(launched, gpu_device::bench_kernels(trident::gpu::kernels::Vendor::Hip, "gfx90a"));
}

/// `bench step --device hip` on the emulated GCD: its record, its counters against the emulating
/// runtime's own, and today's baseline (`gpu_device::STEP_BASELINE`).
#[test]
fn bench_step_counts_what_the_emulating_runtime_counts() {
    let Some(emu) = emulated() else { return };
    gpu_device::bench_step_counts_what_the_runtime_counts(emu, "hip");
}

/// `bench step --device hip` runs a Llama (`llama-tiny`, shortened) on the emulated GCD.
#[test]
fn bench_step_runs_a_llama_on_hip() {
    let Some(emu) = emulated() else { return };
    gpu_device::bench_step_runs_a_llama(emu, "hip");
}

/// Issue 18: no device read between log lines; the logged loss and norm as a per-step read gives.
#[test]
fn training_reads_the_device_once_per_log_interval() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-reads");
    gpu_device::train_reads_the_device_once_per_log_interval(&emu.env, &dir, "hip");
}

#[test]
fn hip_without_bf16_or_with_another_head_dim_is_a_clear_error() {
    let Some(emu) = emulated() else { return };
    gpu_device::without_bf16_or_with_another_head_dim_is_a_clear_error(emu, "hip");
}

/// The emulating runtime refuses what a real one would: an image that is not an ELF, an ELF for
/// another machine (a CUBIN's EM_CUDA), a kernel the code object does not hold; and a device
/// ordinal past the ones it has.
#[test]
fn the_emulated_runtime_checks_code_objects_and_devices() {
    use trident::gpu::hip::Hip;
    use trident::gpu::hip_runtime::HipRuntime;
    use trident::gpu::kernels::hip::HipKernelModules;
    use trident::gpu::runtime::VendorRuntime;
    if emulated().is_none() {
        return;
    }
    let rt = HipRuntime::new(Hip::load().unwrap(), 3).unwrap();
    assert_eq!((rt.arch(), rt.info().compute_units), ("gfx90a", 110));
    let e = rt.load_module(b"not a code object, not even an ELF header of 64 bytes.............").unwrap_err();
    assert!(e.to_string().contains("hipModuleLoadData failed with hipErrorInvalidImage"), "{e}");
    let mut cubin = vec![0u8; 64];
    cubin[..4].copy_from_slice(b"\x7fELF");
    (cubin[4], cubin[5], cubin[0x12]) = (2, 1, 0xbe);
    let e = rt.load_module(&cubin).unwrap_err();
    assert!(e.to_string().contains("hipErrorNoBinaryForGpu"), "{e}");
    let cache = trident::gpu::cache::ModuleCache::new(&PathBuf::from(std::env::var("TRIDENT_CACHE_DIR").unwrap()));
    let casts = HipKernelModules::new(cache).image("casts.cu", "gfx90a", trident::gpu::kernels::Storage::Bf16).unwrap();
    let m = rt.load_module(&casts.bytes).unwrap();
    assert!(rt.function(m, "cast_f32_to_bf16").is_ok());
    let e = rt.function(m, "gemm_fwd_bf16").unwrap_err();
    assert!(e.to_string().contains("hipErrorNotFound"), "{e}");
    let e = HipRuntime::new(Hip::load().unwrap(), 8).err().expect("8 devices: 0..7").to_string();
    assert!(e.contains("hipErrorInvalidDevice"), "{e}");
}

/// `make gpu-check` on an AMD node, emulated: check gpu (the smoke kernel, then every Device op),
/// check ops --device hip and the TP 2 x PP 2 comparison with the CPU, with no NVIDIA driver.
#[test]
fn gpu_check_script_runs_on_the_emulated_amd_gpu() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("hip-gpu-check");
    let data = prepared_corpus(&dir);
    // No NVIDIA driver, so check gpu and the script take the AMD side (its GPU run through RCCL,
    // here the fake NCCL).
    let extra = [("TRIDENT_LIBCUDA", dir.join("no-libcuda.so")), ("TRIDENT_RCCL", fake_nccl(&dir))];
    let outputs = gpu_device::ops_checked();
    let device_line = format!("the HIP Device matches the reference device on {outputs} op outputs");
    let ops_line = format!("ops check: all {outputs} outputs within their bounds");
    let wants = [
        device_line.as_str(),
        "passed on 8 AMD devices",
        ops_line.as_str(),
        "losses check: 6 iterations agree",
        "gpu-check: passed on hip",
    ];
    gpu_device::assert_gpu_check_passed(&gpu_device::run_gpu_check(&emu.env, &dir, &data, "1e-2", &extra), &wants);
    let _ = std::fs::remove_dir_all(&dir);
}
