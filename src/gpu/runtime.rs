//! What the GPU Device and the GPU benches need of a vendor's runtime. `VendorRuntime` is the
//! calls (allocate, free, copy, memset, load a module, find a function, launch, synchronize),
//! which `CudaRuntime` (cuda_runtime.rs) makes one for one on the CUDA driver and `HipRuntime`
//! (hip_runtime.rs) on the HIP runtime. `GpuRuntime` is what everything above uses: the same
//! calls with freed blocks kept for reuse and every call counted, plus timing for the benches and
//! launches from typed arguments (`Arg`); `Counted` implements it once for both vendors over
//! either vendor's runtime. Also `FreedBlocks`, the freed allocations kept for reuse.

use super::launch::LaunchConfig;
use super::tally::Tally;
use super::tma::{gemm_operand, TensorMap, TiledMap};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// A GPU runtime's calls. Pointers are device addresses; handles are opaque. A vendor's runtime
/// makes each as one call of its own (`cuMemAlloc` / `cuMemFree`, `hipMalloc` / `hipFree`, ...);
/// `Counted` makes them through one, keeping freed blocks and counting.
pub trait VendorRuntime: Send + Sync {
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Gives back an allocation of `bytes` from `alloc`: the vendor frees it (which synchronizes
    /// the device); `Counted` keeps it for a later request of its size.
    fn free(&self, pointer: u64, bytes: usize);
    /// Copies `src` to the device; returns when `src` may be reused.
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies to the host after the work already enqueued (so the host waits for the device).
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// Copies `bytes` between device allocations, in order with the launches.
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Sets `count` 32-bit words at `dst` to `value`.
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()>;
    /// Loads a compiled module (CUBIN) and returns its handle; it stays loaded for the runtime's life.
    fn load_module(&self, image: &[u8]) -> Result<usize>;
    fn function(&self, module: usize, name: &str) -> Result<usize>;
    /// Launches `function` with `params[i]` pointing to argument i, on `config`'s grid and block
    /// with its dynamic shared memory (opting the function in first where it needs more than the
    /// default per-block amount).
    fn launch(&self, function: usize, config: &LaunchConfig, params: &mut [*mut c_void]) -> Result<()>;
    /// A TMA tensor map (`cuTensorMapEncodeTiled`): CUDA on compute capability 9.0 only.
    fn tensor_map(&self, _map: &TiledMap) -> Result<TensorMap> {
        Err(Error::Unsupported("TMA tensor maps exist on CUDA devices of compute capability 9.0 only".into()))
    }
    fn synchronize(&self) -> Result<()>;

    /// Starts (`on`) or stops the vendor profiler's capture range (`--profile`).
    fn profiler(&self, on: bool) -> Result<()>;
    /// A one-line description: the GPU, its architecture and the driver.
    fn describe(&self) -> String;
    /// Milliseconds of device time the work `enqueue` launches takes, measured with the vendor's
    /// events (the host waits once, for the end event); None where this runtime has no timing
    /// events, and then `enqueue` has not run.
    fn time_with_events(&self, _enqueue: &mut dyn FnMut() -> Result<()>) -> Option<Result<f64>> {
        None
    }
}

/// What the Device and the benches use of a GPU runtime (`Counted`): its calls with freed blocks
/// kept for reuse and every call counted, timing, and launches from typed arguments.
pub trait GpuRuntime: VendorRuntime {
    /// The counters of every call since the runtime was opened (`Tally::snapshot` reads them).
    fn tally(&self) -> &Arc<Tally>;

    /// Milliseconds the device spends on the work `enqueue` launches, for the benches: events on
    /// the stream where the vendor has them here (CUDA), else the host's clock from an idle
    /// device to the end of a synchronize after it (HIP).
    fn time_ms(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        if let Some(ms) = self.time_with_events(enqueue) {
            return ms;
        }
        self.synchronize()?;
        let started = std::time::Instant::now();
        enqueue()?;
        self.synchronize()?;
        Ok(started.elapsed().as_secs_f64() * 1e3)
    }

    /// Launches `function` with `args`, each widened into a 64-bit slot whose address is its
    /// `kernelParams` entry (the kernel reads an `int`, `float` or `double` from the slot's first bytes), a
    /// tensor map from its own 64-byte aligned copy.
    fn launch_args(&self, function: usize, config: &LaunchConfig, args: &[Arg]) -> Result<()> {
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::F64(v) => v.to_bits(),
                Arg::Map(_) => 0,
            })
            .collect();
        let mut maps: Vec<TensorMap> =
            args.iter().filter_map(|a| if let Arg::Map(m) = a { Some(*m) } else { None }).collect();
        let mut next_map = maps.iter_mut();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .zip(args)
            .map(|(s, a)| match a {
                Arg::Map(_) => (next_map.next().expect("one copy per map") as *mut TensorMap).cast(),
                _ => (s as *mut u64).cast(),
            })
            .collect();
        self.launch(function, config, &mut params)
    }

    /// The tensor map of a bf16 [rows, cols] operand of the sm_90a GEMMs at `pointer`
    /// (`tma::gemm_operand`; `mn_major`: the reduction runs down its rows).
    fn operand_map(&self, pointer: u64, rows: usize, cols: usize, mn_major: bool) -> Result<TensorMap> {
        self.tensor_map(&gemm_operand(pointer, rows, cols, mn_major)?)
    }
}

/// One kernel argument, passed by address as `cuLaunchKernel` / `hipModuleLaunchKernel` want.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    F64(f64),
    /// A `const __grid_constant__ CUtensorMap` parameter (the sm_90a GEMMs).
    Map(TensorMap),
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
    pub fn alloc(
        &self,
        bytes: usize,
        fresh: impl Fn(usize) -> Result<u64>,
        release: impl Fn(u64, usize),
    ) -> Result<u64> {
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
    /// Every kept block through `release` (pointer, bytes; at the runtime's end).
    pub fn release_all(&self, release: impl Fn(u64, usize)) {
        let kept = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for (bytes, pointer) in kept {
            release(pointer, bytes);
        }
    }
}

/// The one `GpuRuntime`, for both vendors: a `VendorRuntime` whose freed allocations are kept
/// for reuse (`FreedBlocks`) and whose every call is counted (`Tally`) on its way through, so
/// that what is counted, and how, is the same code for CUDA and HIP. Function handles are the
/// tally's slots (`Tally::register`), so a launch counts per kernel function without a lock.
pub struct Counted<V: VendorRuntime> {
    vendor: V,
    freed: FreedBlocks,
    tally: Arc<Tally>,
}

impl<V: VendorRuntime> Counted<V> {
    pub fn new(vendor: V) -> Counted<V> {
        Counted { vendor, freed: FreedBlocks::default(), tally: Arc::default() }
    }

    /// The vendor's runtime underneath (uncounted).
    pub fn vendor(&self) -> &V {
        &self.vendor
    }

    /// Frees a block through the vendor (once per block, through `FreedBlocks`).
    fn release(&self, pointer: u64, bytes: usize) {
        self.tally.free();
        self.vendor.free(pointer, bytes);
    }
}

impl<V: VendorRuntime> Drop for Counted<V> {
    /// The kept blocks go back to the vendor before it is dropped (with its modules and context).
    fn drop(&mut self) {
        self.freed.release_all(|p, bytes| self.release(p, bytes));
    }
}

impl<V: VendorRuntime> VendorRuntime for Counted<V> {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        let fresh_made = std::cell::Cell::new(false);
        let fresh = |bytes| {
            let pointer = self.vendor.alloc(bytes)?;
            self.tally.allocation(bytes);
            fresh_made.set(true);
            Ok(pointer)
        };
        let pointer = self.freed.alloc(bytes, fresh, |p, bytes| self.release(p, bytes))?;
        if !fresh_made.get() {
            self.tally.reused_allocation();
        }
        Ok(pointer)
    }
    fn free(&self, pointer: u64, bytes: usize) {
        self.tally.kept_free();
        self.freed.keep(pointer, bytes);
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.tally.host_to_device(src.len());
        self.vendor.copy_to_device(dst, src)
    }
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.tally.device_to_host(dst.len());
        // It waits for the queued work, collectives included (`--distributed-timeout-minutes`).
        crate::comm::watchdog::waiting("a device-to-host copy (behind the queued work and collectives)", || {
            self.vendor.copy_to_host(dst, src)
        })
    }
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.tally.device_to_device(bytes);
        self.vendor.copy_on_device(dst, src, bytes)
    }
    fn memset_u32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        self.tally.memset();
        self.vendor.memset_u32(dst, value, count)
    }
    fn load_module(&self, image: &[u8]) -> Result<usize> {
        self.vendor.load_module(image)
    }
    fn function(&self, module: usize, name: &str) -> Result<usize> {
        self.tally.register(self.vendor.function(module, name)?, name)
    }
    fn launch(&self, function: usize, config: &LaunchConfig, params: &mut [*mut c_void]) -> Result<()> {
        let vendor_handle = self.tally.launch(function)?;
        self.vendor.launch(vendor_handle, config, params)
    }
    fn tensor_map(&self, map: &TiledMap) -> Result<TensorMap> {
        self.vendor.tensor_map(map)
    }
    fn synchronize(&self) -> Result<()> {
        self.tally.synchronization();
        crate::comm::watchdog::waiting("a device synchronisation (the queued work and collectives)", || {
            self.vendor.synchronize()
        })
    }
    fn profiler(&self, on: bool) -> Result<()> {
        self.vendor.profiler(on)
    }
    fn describe(&self) -> String {
        self.vendor.describe()
    }
    fn time_with_events(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Option<Result<f64>> {
        let ms = self.vendor.time_with_events(enqueue)?;
        // The host waited for the end event.
        self.tally.synchronization();
        Some(ms)
    }
}

impl<V: VendorRuntime> GpuRuntime for Counted<V> {
    fn tally(&self) -> &Arc<Tally> {
        &self.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::Mutex;

    /// A vendor that hands out addresses and logs its calls.
    #[derive(Default)]
    struct Logged {
        next: Mutex<u64>,
        calls: Mutex<Vec<String>>,
    }

    impl Logged {
        fn log(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }
    }

    impl VendorRuntime for Logged {
        fn alloc(&self, bytes: usize) -> Result<u64> {
            let mut next = self.next.lock().unwrap();
            *next += 0x1000;
            self.log(format!("alloc {bytes}"));
            Ok(*next)
        }
        fn free(&self, pointer: u64, bytes: usize) {
            self.log(format!("free {pointer:#x} {bytes}"));
        }
        fn copy_to_device(&self, _: u64, src: &[u8]) -> Result<()> {
            self.log(format!("htod {}", src.len()));
            Ok(())
        }
        fn copy_to_host(&self, dst: &mut [u8], _: u64) -> Result<()> {
            self.log(format!("dtoh {}", dst.len()));
            Ok(())
        }
        fn copy_on_device(&self, _: u64, _: u64, bytes: usize) -> Result<()> {
            self.log(format!("dtod {bytes}"));
            Ok(())
        }
        fn memset_u32(&self, _: u64, _: u32, count: usize) -> Result<()> {
            self.log(format!("memset {count}"));
            Ok(())
        }
        fn load_module(&self, _: &[u8]) -> Result<usize> {
            Ok(7)
        }
        fn function(&self, _: usize, name: &str) -> Result<usize> {
            Ok(if name == "gemm" { 0xa0 } else { 0xb0 })
        }
        fn launch(&self, function: usize, _: &LaunchConfig, _: &mut [*mut c_void]) -> Result<()> {
            self.log(format!("launch {function:#x}"));
            Ok(())
        }
        fn synchronize(&self) -> Result<()> {
            self.log("sync".into());
            Ok(())
        }
        fn profiler(&self, on: bool) -> Result<()> {
            self.log(format!("profiler {on}"));
            Ok(())
        }
        fn describe(&self) -> String {
            "logged".into()
        }
    }

    #[test]
    fn counted_passes_every_call_through_once_and_counts_it() {
        let rt = Counted::new(Logged::default());
        let (gemm, cast) = (rt.function(7, "gemm").unwrap(), rt.function(7, "cast").unwrap());
        let one = LaunchConfig { grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, needs_shared_optin: false };
        rt.launch_args(gemm, &one, &[Arg::I32(1)]).unwrap();
        rt.launch_args(gemm, &one, &[]).unwrap();
        rt.launch_args(cast, &one, &[]).unwrap();
        let a = rt.alloc(256).unwrap();
        rt.copy_to_device(a, &[0; 12]).unwrap();
        rt.copy_to_host(&mut [0; 8], a).unwrap();
        rt.copy_on_device(a, a, 4).unwrap();
        rt.memset_u32(a, 0, 64).unwrap();
        rt.free(a, 256);
        assert_eq!(rt.alloc(256).unwrap(), a, "the kept block");
        rt.free(a, 256);
        assert!(rt.time_ms(&mut || Ok(())).unwrap() >= 0.0);
        let calls = rt.vendor().calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                "launch 0xa0",
                "launch 0xa0",
                "launch 0xb0",
                "alloc 256",
                "htod 12",
                "dtoh 8",
                "dtod 4",
                "memset 64",
                "sync",
                "sync"
            ]
        );
        let c = rt.tally().snapshot();
        assert_eq!((c.launches, c.launches_of("gemm"), c.launches_of("cast")), (3, 2, 1));
        assert_eq!(
            (c.host_to_device_copies, c.host_to_device_bytes, c.device_to_host_copies, c.device_to_host_bytes),
            (1, 12, 1, 8)
        );
        assert_eq!((c.device_to_device_copies, c.device_to_device_bytes, c.memsets), (1, 4, 1));
        // The copy to the host and the two of the host-clock timing.
        assert_eq!(c.synchronizations, 3);
        assert_eq!((c.allocations, c.allocation_bytes, c.reused_allocations, c.kept_frees, c.frees), (1, 256, 1, 2, 0));
        // At the end the kept block goes back through the vendor: a free, which synchronizes.
        let tally = rt.tally().clone();
        drop(rt);
        let c = tally.snapshot();
        assert_eq!((c.frees, c.synchronizations), (1, 4));
    }

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
        let release = |p: u64, _bytes: usize| released.borrow_mut().push(p);
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
