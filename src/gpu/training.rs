//! Opening the rank's GPU for `trident train`: the CUDA driver or the HIP runtime, loaded once and
//! kept for the process's life (the communicators' streams borrow its table); the GPU placement
//! chose, after the head-dim check; the nominal peak MFU is measured against; and the Device's
//! collectives, which `attach.rs` makes on the same table when `CollectiveOps::attach_collectives` asks.

use super::collectives::StreamApi;
use super::device::GpuDevice;
use super::driver::Driver;
use super::kernels::{Storage, Vendor};
use crate::device::DevicePeak;
use crate::error::{Error, Result};
use crate::real::Precision;

/// The GPU runtime `--device cuda` or `--device hip` trains on, loaded before placement (which
/// needs its device count) and kept for the process's life: the communicators' streams borrow it.
#[derive(Clone, Copy)]
pub struct TrainingGpu(StreamApi<'static>);

impl TrainingGpu {
    /// `--device cuda`: the CUDA driver.
    pub fn cuda() -> Result<TrainingGpu> {
        let driver = Driver::load()
            .map_err(|e| Error::Usage(format!("--device cuda: {e}; train on the CPU with --device cpu")))?;
        // Kept for the process's life: the communicators' streams borrow it.
        let driver: &'static Driver = Box::leak(Box::new(driver));
        Ok(TrainingGpu(StreamApi::Cuda(driver)))
    }

    /// `--device hip`: the HIP runtime.
    pub fn hip() -> Result<TrainingGpu> {
        let hip: &'static super::hip::Hip = Box::leak(Box::new(super::require_hip_runtime()?));
        Ok(TrainingGpu(StreamApi::Hip(hip)))
    }

    pub fn device_count(self) -> Result<usize> {
        match self.0 {
            StreamApi::Cuda(driver) => driver.device_count(),
            StreamApi::Hip(hip) => hip.device_count(),
        }
    }

    /// The Device on GPU `ordinal` (placement's choice) for a model of `head_dim`, its 16-bit
    /// storage the run's `precision`'s (`Storage::of`: binary16 under `--fp16`), and the nominal
    /// peak of its part; its collectives attach later on this runtime's streams.
    pub fn open(self, ordinal: usize, head_dim: usize, precision: Precision) -> Result<(GpuDevice, DevicePeak)> {
        let storage = Storage::of(precision);
        let (mut dev, peak) = match self.0 {
            StreamApi::Cuda(driver) => {
                GpuDevice::check_head_dim(head_dim)?;
                let dev = GpuDevice::open(Vendor::Cuda, ordinal, storage)?;
                let (major, minor) = driver.device_info(ordinal)?.compute_capability;
                // Dense bf16 (= fp16) tensor-core peaks of the data-center parts (A100: 312, H100 SXM: 989 TFLOP/s).
                let (tflops, part) = if major >= 9 { (989.0, "H100 SXM") } else { (312.0, "A100") };
                let what = format!("nominal dense bf16 of an {part}, sm_{major}{minor}");
                (dev, DevicePeak { gflops: tflops * 1e3, what })
            }
            StreamApi::Hip(hip) => {
                GpuDevice::check_head_dim_for("hip", head_dim)?;
                let dev = GpuDevice::open(Vendor::Hip, ordinal, storage)?;
                let arch = hip.device_info(ordinal)?.arch.unwrap_or_default();
                // Dense bf16 matrix-core peaks: an MI250X GCD (half of 383 TFLOP/s), an MI300X.
                let (tflops, part) = if arch.starts_with("gfx94") { (1307.4, "MI300X") } else { (191.5, "MI250X GCD") };
                let what = format!("nominal dense bf16 of an {part}, {arch}");
                (dev, DevicePeak { gflops: tflops * 1e3, what })
            }
        };
        let api = self.0;
        dev.make_collectives_with(Box::new(move |dev, request| super::attach::attach_collectives(dev, api, request)));
        Ok((dev, peak))
    }
}
