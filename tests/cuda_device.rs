//! The CUDA Device on a machine without a GPU: `tests/gpu/emu_libcuda.cpp` is a CUDA driver that
//! runs the kernels under the SIMT emulation (built here with g++ and loaded through
//! `TRIDENT_LIBCUDA`), and the pip wheel's NVRTC really compiles them to CUBINs that the fake
//! driver checks. Every Device op runs against the reference device on a few shapes (ragged ones
//! included), and `trident train --device cuda --bf16` follows the CPU's `--bf16` losses.
//!
//! NVRTC comes from `make gpu-test-libs` (or `TRIDENT_NVRTC`); without it these tests fail, unless
//! `TRIDENT_SKIP_NVRTC_TESTS=1` is set, when they say loudly that they skipped.

mod common;
use common::gpu_device::{self, run_with, train_losses, TINY_GPU};
use common::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use trident::gpu::device::GpuDevice;

const SEED: u64 = 23;

/// NVRTC from `TRIDENT_NVRTC` or `make gpu-test-libs`; None (loudly) under TRIDENT_SKIP_NVRTC_TESTS=1.
fn nvrtc_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TRIDENT_NVRTC") {
        if Path::new(&p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    let root = std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/trident-gpu-libs")).ok();
    let found = root.and_then(|r| std::fs::read_dir(r).ok()).and_then(|entries| {
        let mut libs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("nvidia/cu13/lib/libnvrtc.so.13")))
            .filter(|p| p.is_file())
            .collect();
        libs.sort();
        libs.pop()
    });
    if found.is_some() {
        return found;
    }
    if std::env::var("TRIDENT_SKIP_NVRTC_TESTS").as_deref() == Ok("1") {
        let _ = writeln!(std::io::stderr(), "!!!!! SKIPPED: no NVRTC (TRIDENT_NVRTC, `make gpu-test-libs`); TRIDENT_SKIP_NVRTC_TESTS=1 skips the CUDA Device tests !!!!!");
        return None;
    }
    panic!("no NVRTC: run `make gpu-test-libs` or set TRIDENT_NVRTC (or TRIDENT_SKIP_NVRTC_TESTS=1 to skip)");
}

/// The emulating driver, built once per test process (about 6 s), and the environment that
/// points trident at it, at NVRTC and at a kernel cache kept between runs.
struct Emulated {
    env: Vec<(&'static str, PathBuf)>,
}

fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Option<Emulated>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let nvrtc = nvrtc_path()?;
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-device");
            std::fs::create_dir_all(&dir).unwrap();
            // Built under a private name, then renamed over the shared one (a process that still
            // has the old file mapped keeps it).
            let building = dir.join(format!("libcuda-emu.so.{}", std::process::id()));
            let lib = dir.join("libcuda-emu.so");
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/emu_libcuda.cpp");
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
            let out = Command::new(&cxx)
                .args([
                    "-std=c++20",
                    "-O2",
                    "-shared",
                    "-fPIC",
                    "-DTRIDENT_EMU",
                    "-pthread",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                ])
                .arg(&src)
                .arg("-o")
                .arg(&building)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cxx} (install g++): {e}"));
            assert!(
                out.status.success(),
                "building the emulating driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&building, &lib).unwrap();
            let env = vec![
                ("TRIDENT_LIBCUDA", lib),
                ("TRIDENT_NVRTC", nvrtc),
                ("TRIDENT_CACHE_DIR", dir.join("kernel-cache")),
            ];
            for (k, v) in &env {
                // Every test of this process sets the same values, before any driver is loaded.
                std::env::set_var(k, v);
            }
            Some(Emulated { env })
        })
        .as_ref()
}

/// One CUDA Device for the whole test process (its kernels compile once).
fn device() -> Option<&'static GpuDevice> {
    static DEV: OnceLock<Option<GpuDevice>> = OnceLock::new();
    DEV.get_or_init(|| {
        emulated()?;
        Some(GpuDevice::cuda(0).unwrap_or_else(|e| panic!("the CUDA Device on the emulated driver: {e}")))
    })
    .as_ref()
}

#[test]
fn elementwise_ops_match_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::elementwise_ops_match_the_reference(dev, SEED);
}

#[test]
fn embeddings_match_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::embeddings_match_the_reference(dev, SEED);
}

#[test]
fn layernorm_whole_and_split_match_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::layernorm_whole_and_split_match_the_reference(dev, SEED);
}

#[test]
fn cross_entropy_pieces_match_the_reference() {
    let Some(dev) = device() else { return };
    gpu_device::cross_entropy_pieces_match_the_reference(dev, SEED);
}

#[test]
fn linear_layers_match_the_reference_on_bf16_operands() {
    let Some(dev) = device() else { return };
    gpu_device::linear_layers_match_the_reference_on_bf16_operands(dev, SEED);
}

#[test]
fn attention_matches_the_reference_within_the_bf16_rule() {
    let Some(dev) = device() else { return };
    gpu_device::attention_matches_the_reference_within_the_bf16_rule(dev, SEED);
}

#[test]
fn the_head_dim_check_names_the_device() {
    let e = GpuDevice::check_head_dim(96).unwrap_err().to_string();
    assert!(e.contains("--device cuda") && e.contains("head dims 64 and 128") && e.contains("is 96"), "{e}");
}

#[test]
fn train_on_cuda_follows_the_cpu_bf16_losses_and_parallel_layouts_follow_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-train");
    let data = prepared_corpus(&dir);
    let cpu = train_losses(&emu.env, &dir, &data, "cpu", 1, &[]);
    let gpu = train_losses(&emu.env, &dir, &data, "cuda", 1, &[]);
    for (i, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        let rel = (c - g).abs() / c.abs();
        eprintln!("iteration {}: cpu {c:.6} cuda {g:.6} (relative difference {rel:.2e})", i + 1);
        // Both round GEMM operands to bf16; attention differs (the CPU's in f32, the GPU's with
        // bf16 probabilities and outputs), so the curves agree to bf16 precision, not bit for bit.
        assert!(rel < 5e-3, "iteration {}: cpu loss {c}, cuda loss {g}", i + 1);
    }
    assert_eq!((cpu.len(), gpu.len()), (6, 6));
    assert!(gpu.windows(2).any(|w| w[0] != w[1]), "the cuda loss never changed");
    // Deterministic, and a checkpoint of device buffers resumes the run bit for bit.
    let ckpt = dir.join("ckpt");
    let ckpt_s = ckpt.to_str().unwrap();
    let first = train_losses(&emu.env, &dir, &data, "cuda", 1, &["--save", ckpt_s, "--exit-interval", "3"]);
    let resumed = train_losses(&emu.env, &dir, &data, "cuda", 1, &["--load", ckpt_s]);
    assert_eq!(first, gpu[..3], "a second run differs");
    assert_eq!(resumed, gpu[3..], "the resumed run differs from the uninterrupted one");
    // Tensor x pipeline parallel on the CUDA Device, through the host-staged MPI path: the same
    // run as one rank, up to the reduction order's f32 rounding (and the bf16 roundings after it).
    // 2-D tensor parallelism (SUMMA) adds the split LayerNorm (`layernorm_sums` and friends).
    let layouts: [(&str, &[&str]); 2] = [
        ("TP 2 x PP 2", &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
        ("2-D TP 2 x 2", &["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]),
    ];
    for (name, flags) in layouts {
        let parallel = train_losses(&emu.env, &dir, &data, "cuda", 4, flags);
        assert_eq!(parallel.len(), 6, "{name}");
        for (i, (one, four)) in gpu.iter().zip(&parallel).enumerate() {
            let rel = (one - four).abs() / one.abs();
            eprintln!("iteration {}: cuda on 1 rank {one:.6}, {name} {four:.6} (relative difference {rel:.2e})", i + 1);
            assert!(rel < 1e-3, "iteration {}: one rank {one}, {name} {four}", i + 1);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cuda_without_bf16_or_with_another_head_dim_is_a_clear_error() {
    let Some(emu) = emulated() else { return };
    let o = run_with(&emu.env, &["train", "--device", "cuda", "--preset", "tiny", "--data-path", "x"]);
    assert_clean_error(&o, &["--device cuda needs --bf16"]);
    let dir = scratch("cuda-headdim");
    let data = prepared_corpus(&dir);
    let mut args = vec!["train", "--device", "cuda", "--data-path", &data, "--train-iters", "1"];
    args.extend_from_slice(TINY_GPU);
    let pos = args.iter().position(|a| *a == "--num-attention-heads").unwrap();
    args[pos + 1] = "4";
    let o = run_with(&emu.env, &args);
    assert_clean_error(&o, &["head dims 64 and 128", "is 32"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_gpu_compares_the_device_with_the_reference() {
    let Some(emu) = emulated() else { return };
    let o = run_with(&emu.env, &["check", "gpu"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("trident_smoke_axpy launched over 1048579 elements") && out.contains("result exact"), "{out}");
    assert!(
        out.contains("gpu check: device 0: the CUDA Device matches the reference device on 126 op outputs"),
        "{out}"
    );
    assert!(out.contains("gpu check: passed on 1 NVIDIA device"), "{out}");
}

#[test]
fn the_emulating_driver_checks_images_names_and_launches() {
    use trident::gpu::cache::ModuleCache;
    use trident::gpu::device::{CudaRuntime, GpuRuntime};
    use trident::gpu::driver::Driver;
    use trident::gpu::kernels::KernelModules;
    let Some(emu) = emulated() else { return };
    let rt = CudaRuntime::new(Driver::load().unwrap(), 0).unwrap();
    let cache = emu.env.iter().find(|(k, _)| *k == "TRIDENT_CACHE_DIR").unwrap().1.clone();
    let image = KernelModules::new(ModuleCache::new(&cache)).image("casts.cu", "sm_80").unwrap();
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
    assert!(rt.launch(f, [1, 1, 1], [32, 1, 1], &mut params).is_ok());
    let e = rt.launch(f, [1, 1, 1], [2048, 1, 1], &mut params).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
}

/// `make gpu-check`'s script end to end on the emulated GPU (small shapes and model, 6
/// iterations): check gpu, check ops, TP 2 x PP 2 on cuda vs cpu; and the same with a loss
/// tolerance no two backends meet, which must fail in the last step.
#[test]
fn gpu_check_script_passes_on_the_emulated_gpu_and_fails_a_tight_tolerance() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-gpu-check");
    let data = prepared_corpus(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/gpu-check.sh");
    let run = |rtol: &str| {
        let mut c = Command::new("bash");
        c.arg(&script).arg(BIN).arg(&data);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        c.env("GPU_CHECK_ITERS", "6")
            .env("GPU_CHECK_SIZE", "small")
            .env("GPU_CHECK_RTOL", rtol)
            .env("GPU_CHECK_DIR", dir.join(format!("logs-{rtol}")))
            .env(
                "GPU_CHECK_MODEL",
                "--num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 \
                 --global-batch-size 4 --lr 1e-3 --eval-iters 1 --cpu-threads 1",
            );
        c.output().unwrap()
    };
    let o = run("1e-2");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for want in [
        "passed on 1 NVIDIA device",
        "ops check: all 126 outputs within their bounds",
        "losses check: 6 iterations agree",
        "gpu-check: passed on cuda",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
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
        "gemm_fwd_bf16, grid [3, 4, 1], spot check",
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

/// The emulating drivers' copy of `check gpu`'s smoke kernel is the binary's own source.
#[test]
fn the_emulated_smoke_kernel_is_the_binarys() {
    let inc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/smoke_axpy.inc")).unwrap();
    let code = |s: &str| -> String {
        s.lines().filter(|l| !l.trim_start().starts_with("//")).flat_map(|l| l.split_whitespace()).collect()
    };
    assert_eq!(code(&inc), code(trident::gpu::smoke::AXPY_SOURCE));
}
