//! `WorkCounters`: what a device's work has cost so far, as the device counts it
//! (`Memory::work_counters`; the GPU Device's runtime counts every call it makes, the CPU counts
//! nothing). A snapshot is plain numbers; `since` gives the work between two snapshots, `add`
//! sums pieces of work, and `fields` names every total the way `bench step --json` and the
//! emulating GPU runtimes' counter files (tests/gpu/emu_runtime.h) write them.

use std::collections::BTreeMap;

/// Kernel launches, copies, memsets, synchronisations and allocations, counted since the device
/// was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkCounters {
    /// Kernel launches, in all and per kernel function (by its name).
    pub launches: u64,
    pub launches_by_kernel: BTreeMap<String, u64>,
    /// Copies from host memory to device memory, and their bytes.
    pub host_to_device_copies: u64,
    pub host_to_device_bytes: u64,
    /// Copies from device memory to host memory (each one waits for the device), and their bytes.
    pub device_to_host_copies: u64,
    pub device_to_host_bytes: u64,
    /// Copies between device allocations, and their bytes.
    pub device_to_device_copies: u64,
    pub device_to_device_bytes: u64,
    /// Memsets of device memory.
    pub memsets: u64,
    /// Times the host waited for the device: explicit synchronizations, and the calls that
    /// synchronize implicitly (copies to the host, frees of device memory, timing events).
    pub synchronizations: u64,
    /// Allocations from the vendor's allocator (`cuMemAlloc`, `hipMalloc`), and their bytes.
    pub allocations: u64,
    pub allocation_bytes: u64,
    /// Frees through the vendor (`cuMemFree`, `hipFree`; each one synchronizes the device).
    pub frees: u64,
    /// Requests served from freed blocks kept for reuse, and frees kept for it (no vendor call).
    pub reused_allocations: u64,
    pub kept_frees: u64,
}

impl WorkCounters {
    /// The work counted after `before` was (a snapshot taken earlier from the same device).
    pub fn since(&self, before: &WorkCounters) -> WorkCounters {
        let mut launches_by_kernel = BTreeMap::new();
        for (name, &n) in &self.launches_by_kernel {
            let earlier = before.launches_by_kernel.get(name).copied().unwrap_or(0);
            if n > earlier {
                launches_by_kernel.insert(name.clone(), n - earlier);
            }
        }
        let mut out = WorkCounters { launches_by_kernel, ..WorkCounters::default() };
        for ((field, now), then) in out.totals_mut().into_iter().zip(self.totals()).zip(before.totals()) {
            *field = now - then;
        }
        out
    }

    /// Adds `other`'s work to this.
    pub fn add(&mut self, other: &WorkCounters) {
        for (name, n) in &other.launches_by_kernel {
            *self.launches_by_kernel.entry(name.clone()).or_insert(0) += n;
        }
        for (field, more) in self.totals_mut().into_iter().zip(other.totals()) {
            *field += more;
        }
    }

    /// Launches of the kernel function `name`.
    pub fn launches_of(&self, name: &str) -> u64 {
        self.launches_by_kernel.get(name).copied().unwrap_or(0)
    }

    /// Every total by name, in the order of `FIELDS`.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        FIELDS.iter().copied().zip(self.totals()).collect()
    }

    fn totals(&self) -> [u64; 14] {
        [
            self.launches,
            self.host_to_device_copies,
            self.host_to_device_bytes,
            self.device_to_host_copies,
            self.device_to_host_bytes,
            self.device_to_device_copies,
            self.device_to_device_bytes,
            self.memsets,
            self.synchronizations,
            self.allocations,
            self.allocation_bytes,
            self.frees,
            self.reused_allocations,
            self.kept_frees,
        ]
    }

    fn totals_mut(&mut self) -> [&mut u64; 14] {
        [
            &mut self.launches,
            &mut self.host_to_device_copies,
            &mut self.host_to_device_bytes,
            &mut self.device_to_host_copies,
            &mut self.device_to_host_bytes,
            &mut self.device_to_device_copies,
            &mut self.device_to_device_bytes,
            &mut self.memsets,
            &mut self.synchronizations,
            &mut self.allocations,
            &mut self.allocation_bytes,
            &mut self.frees,
            &mut self.reused_allocations,
            &mut self.kept_frees,
        ]
    }
}

/// The names of `WorkCounters`' totals, as `fields` gives them.
pub const FIELDS: [&str; 14] = [
    "launches",
    "host_to_device_copies",
    "host_to_device_bytes",
    "device_to_host_copies",
    "device_to_host_bytes",
    "device_to_device_copies",
    "device_to_device_bytes",
    "memsets",
    "synchronizations",
    "allocations",
    "allocation_bytes",
    "frees",
    "reused_allocations",
    "kept_frees",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn with_launches(kernels: &[(&str, u64)]) -> WorkCounters {
        WorkCounters {
            launches: kernels.iter().map(|k| k.1).sum(),
            launches_by_kernel: kernels.iter().map(|&(k, n)| (k.to_string(), n)).collect(),
            ..WorkCounters::default()
        }
    }

    #[test]
    fn the_difference_of_two_snapshots_is_the_work_between_them_and_adds_back_up() {
        let mut before = with_launches(&[("gemm", 4), ("cast", 2)]);
        before.device_to_host_copies = 3;
        before.device_to_host_bytes = 24;
        before.synchronizations = 3;
        before.allocations = 7;
        let mut after = with_launches(&[("gemm", 10), ("cast", 2), ("adamw", 5)]);
        after.device_to_host_copies = 4;
        after.device_to_host_bytes = 32;
        after.synchronizations = 5;
        after.allocations = 7;
        after.frees = 1;
        let d = after.since(&before);
        assert_eq!(d.launches, 11);
        assert_eq!((d.launches_of("gemm"), d.launches_of("cast"), d.launches_of("adamw")), (6, 0, 5));
        // A kernel that did not run in between is not listed.
        assert_eq!(d.launches_by_kernel.keys().collect::<Vec<_>>(), ["adamw", "gemm"]);
        assert_eq!((d.device_to_host_copies, d.device_to_host_bytes, d.synchronizations), (1, 8, 2));
        assert_eq!((d.allocations, d.frees), (0, 1));
        assert_eq!(after.since(&after), WorkCounters::default());
        let mut sum = before.clone();
        sum.add(&d);
        assert_eq!(sum, after);
        let named: BTreeMap<_, _> = d.fields().into_iter().collect();
        assert_eq!((named["launches"], named["device_to_host_copies"], named["frees"]), (11, 1, 1));
        assert_eq!(named.len(), FIELDS.len());
    }
}
