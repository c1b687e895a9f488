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
fn train_on_cuda_follows_the_cpu_bf16_losses_on_one_and_four_ranks() {
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
    assert!(gpu.windows(2).any(|w| w[0] != w[1]), "the cuda loss never changed");
    // Tensor x pipeline parallel on the CUDA Device, through the host-staged MPI path: the same
    // run as one rank, up to the reduction order's f32 rounding (and the bf16 roundings after it).
    let tp_pp = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"];
    let parallel = train_losses(&emu.env, &dir, &data, "cuda", 4, &tp_pp);
    for (i, (one, four)) in gpu.iter().zip(&parallel).enumerate() {
        let rel = (one - four).abs() / one.abs();
        eprintln!(
            "iteration {}: cuda on 1 rank {one:.6}, TP 2 x PP 2 {four:.6} (relative difference {rel:.2e})",
            i + 1
        );
        assert!(rel < 1e-3, "iteration {}: one rank {one}, TP 2 x PP 2 {four}", i + 1);
    }
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
}
