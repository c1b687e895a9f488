//! What the GPU Device and the GPU benches need of a vendor's runtime: `GpuRuntime` (allocate,
//! free, copy, memset, load a module, find a function, launch, synchronize), which `CudaRuntime`
//! (cuda_runtime.rs) implements on the CUDA driver and `HipRuntime` (hip_runtime.rs) on the HIP
//! runtime, with launches from typed arguments (`Arg`) and timing for the benches;
//! `FreedBlocks`, the freed allocations both runtimes keep for reuse.

use crate::error::Result;
use std::ffi::c_void;

/// What the Device needs of a GPU runtime. Pointers are device addresses; handles are opaque.
pub trait GpuRuntime: Send + Sync {
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Gives back an allocation of `bytes` from `alloc`.
    fn free(&self, pointer: u64, bytes: usize);
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()>;
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// Copies `bytes` between device allocations, in order with the launches.
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Sets `count` 32-bit words at `dst` to `value`.
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()>;
    /// Loads a compiled module (CUBIN) and returns its handle; it stays loaded for the runtime's life.
    fn load_module(&self, image: &[u8]) -> Result<usize>;
    fn function(&self, module: usize, name: &str) -> Result<usize>;
    /// Launches `function` with `params[i]` pointing to argument i, no dynamic shared memory.
    fn launch(&self, function: usize, grid: [u32; 3], block: [u32; 3], params: &mut [*mut c_void]) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// A one-line description: the GPU, its architecture and the driver.
    fn describe(&self) -> String;

    /// Launches `function` with `args`, each widened into a 64-bit slot whose address is its
    /// `kernelParams` entry (the kernel reads an `int` or `float` from the slot's first bytes).
    fn launch_args(&self, function: usize, grid: [u32; 3], block: [u32; 3], args: &[Arg]) -> Result<()> {
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
        self.launch(function, grid, block, &mut params)
    }

    /// Milliseconds the device spends on the work `enqueue` launches, for the benches: here the
    /// host's clock from an idle device to the end of a synchronize after it (HIP); CUDA times it
    /// with events on its stream.
    fn time_ms(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.synchronize()?;
        let started = std::time::Instant::now();
        enqueue()?;
        self.synchronize()?;
        Ok(started.elapsed().as_secs_f64() * 1e3)
    }
}

/// One kernel argument, passed by address as `cuLaunchKernel` / `hipModuleLaunchKernel` want.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

/// Freed device allocations (bytes, pointer) that a runtime keeps and hands to later requests of
/// the same size: `cuMemFree` / `hipFree` synchronize the whole device, which would make the
/// host wait for pipeline sends whose receives the peer posts only later (and cost a stall per
/// free besides). Reuse is safe because every launch and copy runs in order on the compute
/// stream and every communication stream waits for it before touching a buffer.
#[derive(Default)]
pub struct FreedBlocks(std::sync::Mutex<Vec<(usize, u64)>>);

impl FreedBlocks {
    /// A kept block of exactly `bytes`, else `fresh(bytes)`; when that fails and blocks of other
    /// sizes are kept, they go back through `release` and `fresh` is tried once more.
    pub fn alloc(&self, bytes: usize, fresh: impl Fn(usize) -> Result<u64>, release: impl Fn(u64)) -> Result<u64> {
        {
            let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = kept.iter().position(|&(b, _)| b == bytes) {
                return Ok(kept.swap_remove(i).1);
            }
        }
        match fresh(bytes) {
            Err(_) if !self.0.lock().map(|k| k.is_empty()).unwrap_or(true) => {
                self.release_all(release);
                fresh(bytes)
            }
            other => other,
        }
    }
    pub fn keep(&self, pointer: u64, bytes: usize) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((bytes, pointer));
    }
    /// Every kept block through `release` (at the runtime's end).
    pub fn release_all(&self, release: impl Fn(u64)) {
        let kept = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, pointer) in kept {
            release(pointer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn kept_blocks_go_to_requests_of_their_size_and_back_when_an_allocation_fails() {
        use std::cell::{Cell, RefCell};
        let kept = FreedBlocks::default();
        let (next, out_of_memory, released) = (Cell::new(0x1000u64), Cell::new(false), RefCell::new(Vec::new()));
        let fresh = |bytes: usize| {
            if out_of_memory.get() && released.borrow().is_empty() {
                return Err(Error::Comm("out of memory".into()));
            }
            let p = next.get();
            next.set(p + bytes as u64);
            Ok(p)
        };
        let release = |p: u64| released.borrow_mut().push(p);
        let a = kept.alloc(256, fresh, release).unwrap();
        kept.keep(a, 256);
        let b = kept.alloc(512, fresh, release).unwrap();
        assert_ne!(a, b, "a block of another size");
        assert_eq!(kept.alloc(256, fresh, release).unwrap(), a, "the kept block of the same size");
        kept.keep(a, 256);
        kept.keep(b, 512);
        // Out of memory for a new size: the kept blocks go back, then the request is retried.
        out_of_memory.set(true);
        let c = kept.alloc(1024, fresh, release).unwrap();
        assert_eq!(released.borrow().len(), 2);
        assert!(c != a && c != b);
        // Nothing kept and still out of memory: the error.
        released.borrow_mut().clear();
        assert!(kept.alloc(2048, fresh, release).is_err());
    }
}
