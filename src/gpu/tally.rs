//! `Tally`: the counters of one GPU runtime's calls, kept by `runtime::Counted` for both vendors
//! and read as a `device::WorkCounters` snapshot (`Memory::work_counters`). Each count is a
//! relaxed atomic add, so counting takes no lock on a launch: kernel functions are registered in
//! fixed slots when they are resolved (under a lock, once per function), and a launch finds its
//! slot by the handle `register` gave. Shared through an `Arc`, so a bench can read the totals
//! after the runtime, and the frees of its kept blocks at the end, are gone.

use crate::device::WorkCounters;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// How many kernel functions one runtime can resolve (the kernel index has about 50).
const MAX_FUNCTIONS: usize = 256;

/// A resolved kernel function: the vendor's handle, its name and its launches.
struct Function {
    vendor_handle: usize,
    name: String,
    launches: AtomicU64,
}

/// Every count but the per-function launches, as `WorkCounters` names them.
#[derive(Default)]
struct Counts {
    launches: AtomicU64,
    host_to_device_copies: AtomicU64,
    host_to_device_bytes: AtomicU64,
    device_to_host_copies: AtomicU64,
    device_to_host_bytes: AtomicU64,
    device_to_device_copies: AtomicU64,
    device_to_device_bytes: AtomicU64,
    memsets: AtomicU64,
    synchronizations: AtomicU64,
    allocations: AtomicU64,
    allocation_bytes: AtomicU64,
    frees: AtomicU64,
    reused_allocations: AtomicU64,
    kept_frees: AtomicU64,
}

/// The counters of one runtime's calls.
pub struct Tally {
    counts: Counts,
    functions: Box<[OnceLock<Function>]>,
    /// Slots of `functions` in use; taken only to register a function.
    registered: Mutex<usize>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            counts: Counts::default(),
            functions: (0..MAX_FUNCTIONS).map(|_| OnceLock::new()).collect(),
            registered: Mutex::new(0),
        }
    }
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Relaxed);
}

impl Tally {
    /// The handle launches name kernel function `name` by (its vendor handle `vendor_handle`):
    /// the slot it was registered in before, or a new one.
    pub fn register(&self, vendor_handle: usize, name: &str) -> Result<usize> {
        let mut used = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let known =
            self.functions[..*used].iter().position(|f| f.get().is_some_and(|f| f.vendor_handle == vendor_handle));
        if let Some(slot) = known {
            return Ok(slot);
        }
        let slot = *used;
        let function = Function { vendor_handle, name: name.to_string(), launches: AtomicU64::new(0) };
        if slot == MAX_FUNCTIONS || self.functions[slot].set(function).is_err() {
            return Err(Error::Config(format!(
                "kernel {name}: one GPU runtime resolves at most {MAX_FUNCTIONS} kernel functions"
            )));
        }
        *used += 1;
        Ok(slot)
    }

    /// Counts a launch of the function registered as `handle` and returns its vendor handle.
    pub fn launch(&self, handle: usize) -> Result<usize> {
        let function = self.functions.get(handle).and_then(OnceLock::get).ok_or_else(|| {
            Error::Config(format!("launch of kernel handle {handle}, which this GPU runtime did not resolve"))
        })?;
        add(&function.launches, 1);
        add(&self.counts.launches, 1);
        Ok(function.vendor_handle)
    }

    pub fn host_to_device(&self, bytes: usize) {
        add(&self.counts.host_to_device_copies, 1);
        add(&self.counts.host_to_device_bytes, bytes);
    }

    /// A copy to the host, which waits for the device.
    pub fn device_to_host(&self, bytes: usize) {
        add(&self.counts.device_to_host_copies, 1);
        add(&self.counts.device_to_host_bytes, bytes);
        self.synchronization();
    }

    pub fn device_to_device(&self, bytes: usize) {
        add(&self.counts.device_to_device_copies, 1);
        add(&self.counts.device_to_device_bytes, bytes);
    }

    pub fn memset(&self) {
        add(&self.counts.memsets, 1);
    }

    pub fn synchronization(&self) {
        add(&self.counts.synchronizations, 1);
    }

    /// An allocation from the vendor's allocator.
    pub fn allocation(&self, bytes: usize) {
        add(&self.counts.allocations, 1);
        add(&self.counts.allocation_bytes, bytes);
    }

    /// A free through the vendor, which synchronizes the device.
    pub fn free(&self) {
        add(&self.counts.frees, 1);
        self.synchronization();
    }

    /// A request served from a kept block.
    pub fn reused_allocation(&self) {
        add(&self.counts.reused_allocations, 1);
    }

    /// A free kept for reuse (no vendor call).
    pub fn kept_free(&self) {
        add(&self.counts.kept_frees, 1);
    }

    /// Everything counted so far.
    pub fn snapshot(&self) -> WorkCounters {
        let c = &self.counts;
        let mut launches_by_kernel = std::collections::BTreeMap::new();
        for f in self.functions.iter().map_while(OnceLock::get) {
            let n = f.launches.load(Relaxed);
            if n > 0 {
                *launches_by_kernel.entry(f.name.clone()).or_insert(0) += n;
            }
        }
        WorkCounters {
            launches: c.launches.load(Relaxed),
            launches_by_kernel,
            host_to_device_copies: c.host_to_device_copies.load(Relaxed),
            host_to_device_bytes: c.host_to_device_bytes.load(Relaxed),
            device_to_host_copies: c.device_to_host_copies.load(Relaxed),
            device_to_host_bytes: c.device_to_host_bytes.load(Relaxed),
            device_to_device_copies: c.device_to_device_copies.load(Relaxed),
            device_to_device_bytes: c.device_to_device_bytes.load(Relaxed),
            memsets: c.memsets.load(Relaxed),
            synchronizations: c.synchronizations.load(Relaxed),
            allocations: c.allocations.load(Relaxed),
            allocation_bytes: c.allocation_bytes.load(Relaxed),
            frees: c.frees.load(Relaxed),
            reused_allocations: c.reused_allocations.load(Relaxed),
            kept_frees: c.kept_frees.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_count_per_function_by_the_handle_registration_gave() {
        let t = Tally::default();
        let gemm = t.register(0xa0, "gemm").unwrap();
        let cast = t.register(0xb0, "cast").unwrap();
        assert_eq!(t.register(0xa0, "gemm").unwrap(), gemm, "a function resolved twice keeps its slot");
        // The same name in another module is another function, counted under the same name.
        let gemm_again = t.register(0xc0, "gemm").unwrap();
        assert_ne!(gemm_again, gemm);
        assert_eq!(t.launch(gemm).unwrap(), 0xa0);
        assert_eq!(t.launch(gemm_again).unwrap(), 0xc0);
        assert_eq!(t.launch(cast).unwrap(), 0xb0);
        assert!(t.launch(99).is_err());
        t.device_to_host(16);
        t.free();
        t.allocation(256);
        let s = t.snapshot();
        assert_eq!((s.launches, s.launches_of("gemm"), s.launches_of("cast")), (3, 2, 1));
        assert_eq!((s.device_to_host_copies, s.device_to_host_bytes, s.synchronizations), (1, 16, 2));
        assert_eq!((s.allocations, s.allocation_bytes, s.frees), (1, 256, 1));
    }

    #[test]
    fn registering_past_the_slots_is_an_error_naming_the_kernel() {
        let t = Tally::default();
        for i in 0..MAX_FUNCTIONS {
            t.register(i + 1, "k").unwrap();
        }
        let e = t.register(0, "one_too_many").unwrap_err().to_string();
        assert!(e.contains("one_too_many") && e.contains("256"), "{e}");
    }
}
