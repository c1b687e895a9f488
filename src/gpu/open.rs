//! One GPU of either vendor, opened for the GPU Device or a GPU bench: its `GpuRuntime` (the
//! vendor's runtime, counted: `runtime::Counted`), where its
//! kernel images come from (`KernelModules` for CUDA, `HipKernelModules` for HIP: precompiled, or
//! compiled for the device's architecture through the disk cache), its name, architecture,
//! launch limits and multiprocessor count, the 16-bit storage its modules are compiled for
//! (`Storage`: bf16, or fp16); and `Functions`, kernels of the index resolved on it once,
//! each file loaded once.

use super::cache::{default_root, ModuleCache};
use super::cuda_runtime::CudaRuntime;
use super::driver::Driver;
use super::hip::Hip;
use super::hip_runtime::HipRuntime;
use super::kernels::cuda::{arch_for, KernelModules};
use super::kernels::hip::HipKernelModules;
use super::kernels::{Kernel, Storage, Vendor, KERNELS};
use super::launch::DeviceLimits;
use super::runtime::{Counted, GpuRuntime};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where an opened GPU's kernel images come from.
enum Images {
    Cuda(KernelModules),
    Hip(HipKernelModules),
}

/// An opened GPU.
pub struct OpenGpu {
    pub rt: Arc<dyn GpuRuntime>,
    pub vendor: Vendor,
    /// The device's name as its runtime reports it (the key of `peaks::lookup`).
    pub name: String,
    /// What the kernels are compiled for: `sm_XY` (`sm_90a` on compute capability 9.0) or `gfx...`.
    pub arch: String,
    /// SMs (CUDA) or compute units (HIP), at least 1.
    pub multiprocessors: usize,
    pub limits: DeviceLimits,
    /// The storage type of the modules it loads.
    pub storage: Storage,
    images: Images,
}

impl OpenGpu {
    /// GPU `ordinal` of `vendor`'s runtime, its modules of `storage`.
    pub fn open(vendor: Vendor, ordinal: usize, storage: Storage) -> Result<OpenGpu> {
        match vendor {
            Vendor::Cuda => OpenGpu::cuda(ordinal, storage),
            Vendor::Hip => OpenGpu::hip(ordinal, storage),
        }
    }

    /// GPU `ordinal` of the CUDA driver (compute capability 8.0 or newer), its kernels compiled by
    /// NVRTC through the disk cache (or taken from this build's precompiled images) as the modules
    /// of `storage`.
    pub fn cuda(ordinal: usize, storage: Storage) -> Result<OpenGpu> {
        let rt = CudaRuntime::new(Driver::load()?, ordinal)?;
        let info = rt.info().clone();
        Ok(OpenGpu {
            rt: Arc::new(Counted::new(rt)),
            vendor: Vendor::Cuda,
            arch: arch_for(info.compute_capability)?,
            multiprocessors: info.multiprocessors.max(1) as usize,
            limits: info.limits,
            name: info.name,
            storage,
            images: Images::Cuda(KernelModules::new(ModuleCache::new(&default_root(&|k| std::env::var(k).ok())?))),
        })
    }

    /// GPU `ordinal` of the HIP runtime, its kernels (kernels/ and kernels-hip/) compiled for the device's gfx
    /// architecture by hipRTC through the disk cache (or taken from this build's precompiled code
    /// objects) as the modules of `storage`.
    pub fn hip(ordinal: usize, storage: Storage) -> Result<OpenGpu> {
        let rt = HipRuntime::new(Hip::load()?, ordinal)?;
        let (arch, limits, name) = (rt.arch().to_string(), rt.limits(), rt.info().name.clone());
        let multiprocessors = rt.info().compute_units.max(1) as usize;
        let root = default_root(&|k| std::env::var(k).ok())?;
        Ok(OpenGpu {
            rt: Arc::new(Counted::new(rt)),
            vendor: Vendor::Hip,
            name,
            arch,
            multiprocessors,
            limits,
            storage,
            images: Images::Hip(HipKernelModules::new(ModuleCache::new(&root))),
        })
    }

    /// The loadable image of `file` (of this vendor's suite) for this GPU's architecture.
    pub fn image(&self, file: &str) -> Result<Vec<u8>> {
        match &self.images {
            Images::Cuda(m) => m.image(file, &self.arch, self.storage).map(|i| i.bytes),
            Images::Hip(m) => m.image(file, &self.arch, self.storage).map(|i| i.bytes),
        }
    }

    /// Loads the files that hold `kernels` (each file once) and finds their functions.
    pub fn functions(&self, kernels: &[Kernel]) -> Result<Functions> {
        let mut loaded: Vec<(&str, usize)> = Vec::new();
        let mut table = vec![None; KERNELS.len()];
        for &k in kernels {
            let spec = k.spec();
            let threads = self.vendor.threads(k).ok_or_else(|| {
                Error::Unsupported(format!("kernel {}: no {:?} twin of {}", spec.function, self.vendor, spec.file))
            })?;
            let module = match loaded.iter().find(|(f, _)| *f == spec.file) {
                Some((_, m)) => *m,
                None => {
                    let m = self.rt.load_module(&self.image(&self.vendor.file(spec.file))?)?;
                    loaded.push((spec.file, m));
                    m
                }
            };
            table[k as usize] = Some((self.rt.function(module, spec.function)?, threads));
        }
        Ok(Functions(table))
    }
}

/// Kernels resolved on one GPU: each one's function handle and its vendor's block size.
pub struct Functions(Vec<Option<(usize, u32)>>);

impl Functions {
    /// The function handle and threads per block of `k`, if it was resolved.
    pub fn get(&self, k: Kernel) -> Option<(usize, u32)> {
        self.0[k as usize]
    }
}
