//! The GPU libraries, found at run time: the CUDA driver (`driver`), NVRTC (`nvrtc`), NCCL and
//! RCCL (`nccl`), the HIP runtime (`hip`) and hipRTC (`hiprtc`), each a table of entry points resolved with `dlopen`/`dlsym` (`dl`), their status
//! codes mapped onto one error (`status`), the on-disk kernel cache (`cache`), launch geometry
//! (`launch`), the embedded CUDA kernels and their launch table (`kernels`) and the embedded HIP
//! kernels (`hip_kernels`). The binary links none of them: on a machine without
//! them, everything here answers with an error naming the library.
//! The GPU Device (the `Device` trait on a GPU) is `device`, on a small runtime trait that the
//! CUDA driver table implements there and the HIP runtime table in `hip_device`.
//! `trident train` opens the rank's GPU through `open`, which hands the Device the maker of its
//! NCCL / RCCL collectives (`attach`) for `Device::attach_collectives`.

mod attach;
pub mod cache;
pub mod collectives;
pub mod device;
pub mod dl;
pub mod driver;
pub mod hip;
pub mod hip_device;
pub mod hip_kernels;
pub mod hiprtc;
pub mod kernels;
pub mod launch;
pub mod nccl;
pub mod nvrtc;
pub mod open;
pub mod peaks;
pub mod status;

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
    lines.push("cuda backend: `train --device cuda --bf16` (bf16 GEMMs and attention, head dims 64 and 128; kernels compiled by NVRTC on first use and cached); `make gpu-check` launches a test kernel".into());
    match nvrtc::Nvrtc::load().and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, (major, minor))) => lines.push(format!("nvrtc: {major}.{minor} ({})", n.path())),
        Err(e) => lines.push(format!("nvrtc: {e}")),
    }
    match nccl::Nccl::load(nccl::Flavor::Nccl).and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, v)) => lines.push(format!("nccl: {v} ({})", n.path())),
        Err(e) => lines.push(format!("nccl: {e}")),
    }
    lines.push(kernels::info_line());
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
    lines.push("hip backend: `train --device hip --bf16` (bf16 MFMA GEMMs and attention, head dims 64 and 128; kernels compiled by hipRTC for the device's gfx architecture on first use and cached); `make gpu-check` launches a test kernel".into());
    match hiprtc::Hiprtc::load().and_then(|r| r.version().map(|v| (r, v))) {
        Ok((r, (major, minor))) => lines.push(format!("hiprtc: {major}.{minor} ({})", r.path())),
        Err(e) => lines.push(format!("hiprtc: {e}")),
    }
    match nccl::Nccl::load(nccl::Flavor::Rccl).and_then(|n| n.version().map(|v| (n, v))) {
        Ok((n, v)) => lines.push(format!("rccl: {v} ({})", n.path())),
        Err(e) => lines.push(format!("rccl: {e}")),
    }
    lines.push(hip_kernels::info_line());
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
