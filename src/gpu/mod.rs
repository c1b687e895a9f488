//! The GPU libraries, found at run time: the CUDA driver (`driver`), NVRTC (`nvrtc`), NCCL and
//! RCCL (`nccl`), each a table of entry points resolved with `dlopen`/`dlsym` (`dl`), their status
//! codes mapped onto one error (`status`), the on-disk kernel cache (`cache`), launch geometry
//! (`launch`), the embedded CUDA kernels and their launch table (`kernels`) and the device smoke
//! test behind `make gpu-check` (`smoke`). The binary links none of them: on a machine without
//! them, everything here answers with an error naming the library.
//! The CUDA Device (the `Device` trait on a GPU) is not built yet; it will sit on these tables.

pub mod cache;
pub mod dl;
pub mod driver;
pub mod kernels;
pub mod launch;
pub mod nccl;
pub mod nvrtc;
pub mod smoke;
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
    lines.push("cuda backend: not built yet (the driver, NVRTC and NCCL load at run time; `make gpu-check` launches a test kernel)".into());
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

/// Why `--device cuda` cannot run on this build and machine: no driver, a driver that fails, or
/// (with a working driver) the CUDA backend that is not built yet.
pub fn cuda_device_unavailable() -> Error {
    match driver::Driver::load() {
        Err(e) => Error::Usage(format!("--device cuda: {e}; train on the CPU with --device cpu")),
        Ok(d) => {
            let found = match (d.version(), d.device_count()) {
                (Ok((major, minor)), Ok(n)) => format!(
                    "the NVIDIA driver (CUDA {major}.{minor}, {n} device{}) was found",
                    if n == 1 { "" } else { "s" }
                ),
                (Err(e), _) | (_, Err(e)) => format!("the NVIDIA driver was found but {e}"),
            };
            Error::Unsupported(format!(
                "--device cuda: {found}, but the CUDA backend is not built yet (this version trains on the CPU: --device cpu; `make gpu-check` tests the GPU)"
            ))
        }
    }
}

/// Loads the driver for a command that needs a GPU, turning its absence into that command's error.
pub fn require_driver(command: &str) -> Result<driver::Driver> {
    driver::Driver::load().map_err(|e| Error::Usage(format!("{command} needs an NVIDIA GPU: {e}")))
}
