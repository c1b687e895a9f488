//! The GPU libraries, found at run time, and the GPU Device on them. The binary links none of
//! them: on a machine without them, everything here answers with an error naming the library.
//!
//! The files, lowest first; a file imports only files above it in this list (test modules
//! aside), so the folder has no import loop (`tests/house.rs` checks it):
//! 1. `dl` (`dlopen` and the `api_table!` of entry points), `launch` (launch geometry checked
//!    against the device's limits), `peaks` (datasheet peaks), `rtc` (what NVRTC and hipRTC take
//!    and give back alike); then `status` (each library's status codes as one error).
//! 2. The library tables: `driver` (CUDA driver), `nvrtc`, `hip` (HIP runtime), `hiprtc`, `nccl`
//!    (NCCL and RCCL); then `cache` (the NVRTC / hipRTC module cache).
//! 3. `kernels`: the kernel index (`kernels/mod.rs`: every kernel function, its file and its
//!    geometry per vendor), `kernels::cuda` and `kernels::hip` (the embedded sources and their
//!    images: precompiled, or compiled by NVRTC / hipRTC through the cache), `kernels::plan` (an
//!    op's checked launch).
//! 4. `tally` (`Tally`, the counters of a runtime's calls), `tma` (TMA tensor maps: `TensorMap`
//!    and the sm_90a GEMMs' operand geometry), then `runtime` (`VendorRuntime`, a
//!    runtime's calls; `GpuRuntime`, what the Device needs of a runtime: those calls, counted,
//!    with timing; `Counted`, its one implementation over either vendor's runtime, freed blocks
//!    kept for reuse; `FreedBlocks`; `Arg`).
//! 5. `cuda_runtime` and `hip_runtime`: `VendorRuntime` on the CUDA driver and on the HIP runtime.
//!    `open` (`OpenGpu`: one GPU of either vendor opened with its runtime, kernel images and
//!    limits; `Functions`, kernels of the index resolved on it).
//! 6. `buffer` (`DeviceMem`, `GpuBuf`, and `GpuP2p`, what the Device asks of its pipeline links).
//! 7. `collectives` (NCCL / RCCL communicators on device memory: `NcclComm`, `DeviceNccl` with
//!    its all-to-all as grouped sends and receives, and the `Collective` cases `check nccl` and
//!    `bench allreduce` run); `pipeline_nccl` (`PipelineNccl`, the pipeline's links).
//! 8. `device` (`GpuDevice`, the `Device` trait on a GPU; its ops in `device_ops` (the
//!    Llama-family ones in `llama_ops`), an optimizer
//!    group's one AdamW launch and its table kept on the device in `adamw`), which holds
//!    its communicators as `DeviceComm` / `GpuP2p` trait objects and so names no type of
//!    `collectives`.
//! 9. `attach` (the NCCL / RCCL communicators of a training run's groups, made when
//!    `CollectiveOps::attach_collectives` asks), then `training` (`trident train`'s GPU: the runtime kept
//!    for the process's life, the Device on the rank's GPU with its nominal peak and the maker of
//!    its collectives).
//!
//! This file: `trident info`'s GPU lines, its AMD section, and the errors of `--device cuda` and
//! `--device hip`.

mod adamw;
mod attach;
mod attention_ops;
pub mod buffer;
pub mod cache;
pub mod collectives;
pub mod cuda_runtime;
pub mod device;
mod device_ops;
pub mod dl;
pub mod driver;
pub mod hip;
pub mod hip_runtime;
pub mod hiprtc;
pub mod kernels;
pub mod launch;
mod llama_ops;
pub mod nccl;
pub mod nvrtc;
pub mod open;
pub mod peaks;
mod pipeline_nccl;
pub mod rtc;
pub mod runtime;
pub mod status;
pub mod tally;
pub mod tma;
pub mod training;

use crate::error::{Error, Result};

/// `trident info`'s lines about the GPU libraries: the driver and its devices, NVRTC, NCCL.
pub fn info_lines() -> Vec<String> {
    let mut lines = Vec::new();
    match driver::Driver::load() {
        Err(e) => lines.push(format!("cuda driver: {e}")),
        Ok(d) => match (d.version(), d.device_count()) {
            (Ok((major, minor)), Ok(n)) => {
                lines.push(format!(
                    "cuda driver: CUDA {major}.{minor} ({}), {n} device{}",
                    d.path(),
                    if n == 1 { "" } else { "s" }
                ));
                for i in 0..n {
                    match d.device_info(i) {
                        Ok(info) => lines.push(format!(
                            "cuda device {i}: {}, compute capability {}.{} ({}), {} SMs, {:.1} GiB",
                            info.name,
                            info.compute_capability.0,
                            info.compute_capability.1,
                            info.arch(),
                            info.multiprocessors,
                            info.total_bytes as f64 / (1u64 << 30) as f64
                        )),
                        Err(e) => lines.push(format!("cuda device {i}: {e}")),
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => lines.push(format!("cuda driver: {} loaded, but {e}", d.path())),
        },
    }
    lines.push("cuda backend: `train --device cuda --bf16` or `--fp16` (16-bit GEMMs and attention, head dims 32, 64 and 128; kernels compiled by NVRTC on first use and cached); `make gpu-check` launches a test kernel".into());
    match nvrtc::Nvrtc::load().and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, (major, minor))) => lines.push(format!("nvrtc: {major}.{minor} ({})", n.path())),
        Err(e) => lines.push(format!("nvrtc: {e}")),
    }
    match nccl::Nccl::load(nccl::Flavor::Nccl).and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, v)) => lines.push(format!("nccl: {v} ({})", n.path())),
        Err(e) => lines.push(format!("nccl: {e}")),
    }
    lines.push(kernels::cuda::info_line());
    match cache::default_root(&|k| std::env::var(k).ok()) {
        Ok(root) => lines.push(format!("kernel cache: {}", cache::ModuleCache::new(&root).dir().display())),
        Err(e) => lines.push(format!("kernel cache: {e}")),
    }
    lines
}

/// `trident info`'s AMD section: the HIP runtime and its devices, hipRTC, RCCL.
pub fn hip_info_lines() -> Vec<String> {
    let mut lines = Vec::new();
    match hip::Hip::load() {
        Err(e) => lines.push(format!("hip runtime: {e}")),
        Ok(h) => match (h.runtime_version(), h.driver_version(), h.device_count()) {
            (Ok(runtime), Ok(driver), Ok(n)) => {
                lines.push(format!(
                    "hip runtime: HIP {runtime}, driver {driver} ({}), {n} device{}",
                    h.path(),
                    if n == 1 { "" } else { "s" }
                ));
                for i in 0..n {
                    match h.device_info(i) {
                        Ok(d) => lines.push(format!(
                            "hip device {i}: {}, {}, {} compute units, {:.1} GiB",
                            d.name,
                            d.arch.as_deref().unwrap_or("gfx architecture unknown"),
                            d.compute_units,
                            d.total_bytes as f64 / (1u64 << 30) as f64
                        )),
                        Err(e) => lines.push(format!("hip device {i}: {e}")),
                    }
                }
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                lines.push(format!("hip runtime: {} loaded, but {e}", h.path()))
            }
        },
    }
    lines.push("hip backend: `train --device hip --bf16` or `--fp16` (bf16 or fp16 MFMA GEMMs and attention, head dims 32, 64 and 128; kernels compiled by hipRTC for the device's gfx architecture on first use and cached); `make gpu-check` launches a test kernel".into());
    match hiprtc::Hiprtc::load().and_then(|r| r.version().map(|v| (r, v))) {
        Ok((r, (major, minor))) => lines.push(format!("hiprtc: {major}.{minor} ({})", r.path())),
        Err(e) => lines.push(format!("hiprtc: {e}")),
    }
    match nccl::Nccl::load(nccl::Flavor::Rccl).and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, v)) => lines.push(format!("rccl: {v} ({})", n.path())),
        Err(e) => lines.push(format!("rccl: {e}")),
    }
    lines.push(kernels::hip::info_line());
    lines
}

/// The HIP runtime for `--device hip`, or why it cannot run: none on this machine, or one that fails.
pub fn require_hip_runtime() -> Result<hip::Hip> {
    hip::Hip::load().map_err(|e| match e {
        e @ Error::GpuLibrary { .. } => Error::Usage(format!("--device hip: {e}; train on the CPU with --device cpu")),
        e => {
            Error::Usage(format!("--device hip: the HIP runtime was found but {e}; train on the CPU with --device cpu"))
        }
    })
}

/// Loads the driver for a command that needs a GPU, turning its absence into that command's error.
pub fn require_driver(command: &str) -> Result<driver::Driver> {
    driver::Driver::load().map_err(|e| Error::Usage(format!("{command} needs an NVIDIA GPU: {e}")))
}
