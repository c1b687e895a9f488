//! Launch geometry: the grid and block of a kernel from its problem size and tile size, checked
//! against the device's limits (threads per block, grid dimensions, shared memory per block)
//! before the launch, so a shape that cannot run is an error that names the kernel and the limit
//! instead of a `CUDA_ERROR_INVALID_VALUE` from `cuLaunchKernel`.

use crate::error::{Error, Result};

/// What one device allows a launch (from `cuDeviceGetAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_threads_per_block: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
    /// Shared memory a block gets without opting in.
    pub shared_bytes_per_block: u32,
    /// Shared memory a kernel may opt in to (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub shared_bytes_optin: u32,
    pub warp_size: u32,
}

impl DeviceLimits {
    /// An A100 (sm_80): 1024 threads, 48 KiB default and 163 KiB opt-in shared memory.
    pub const A100: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block: [1024, 1024, 64],
        max_grid: [2_147_483_647, 65_535, 65_535],
        shared_bytes_per_block: 48 * 1024,
        shared_bytes_optin: 163 * 1024,
        warp_size: 32,
    };
    /// An H100 (sm_90): as the A100 with 227 KiB opt-in shared memory.
    pub const H100: DeviceLimits = DeviceLimits { shared_bytes_optin: 227 * 1024, ..DeviceLimits::A100 };
}

/// A checked launch: what `cuLaunchKernel` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// The shared memory exceeds the default per-block amount: the kernel must opt in to it
    /// (set its maximum dynamic shared size) before this launch.
    pub needs_shared_optin: bool,
}

impl LaunchConfig {
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }
    pub fn threads_per_block(&self) -> u32 {
        self.block.iter().product()
    }
}

/// The launch of `kernel` over a problem of `problem` elements per dimension (x, y, z), one block
/// per `tile` of it, with `block` threads and `shared_bytes` of shared memory per block. Ragged
/// sizes round up (the kernel guards its last tile); a zero size is an error, since a launch
/// with an empty grid is invalid and the caller should skip the work instead.
pub fn tiled(
    kernel: &str,
    problem: [usize; 3],
    tile: [usize; 3],
    block: [u32; 3],
    shared_bytes: usize,
    limits: &DeviceLimits,
) -> Result<LaunchConfig> {
    let err = |what: String| Err(Error::Config(format!("kernel {kernel}: {what}")));
    const AXES: [&str; 3] = ["x", "y", "z"];
    let mut grid = [0u32; 3];
    for d in 0..3 {
        if problem[d] == 0 {
            return err(format!("problem size {:?} is zero along {}: nothing to launch", problem, AXES[d]));
        }
        if tile[d] == 0 {
            return err(format!("tile size {:?} is zero along {}", tile, AXES[d]));
        }
        if block[d] == 0 {
            return err(format!("block {:?} is zero along {}", block, AXES[d]));
        }
        if block[d] > limits.max_block[d] {
            return err(format!(
                "block {} threads along {} exceeds the device limit {}",
                block[d], AXES[d], limits.max_block[d]
            ));
        }
        let blocks = problem[d].div_ceil(tile[d]);
        if blocks > limits.max_grid[d] as usize {
            return err(format!(
                "{} blocks along {} ({} elements in tiles of {}) exceed the device limit {}",
                blocks, AXES[d], problem[d], tile[d], limits.max_grid[d]
            ));
        }
        grid[d] = blocks as u32;
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > limits.max_threads_per_block as u64 {
        return err(format!("{threads} threads per block exceed the device limit {}", limits.max_threads_per_block));
    }
    if shared_bytes > limits.shared_bytes_optin as usize {
        return err(format!(
            "{shared_bytes} bytes of shared memory per block exceed the device limit of {} (opt-in; {} by default)",
            limits.shared_bytes_optin, limits.shared_bytes_per_block
        ));
    }
    Ok(LaunchConfig {
        grid,
        block,
        shared_bytes: shared_bytes as u32,
        needs_shared_optin: shared_bytes > limits.shared_bytes_per_block as usize,
    })
}

/// A one-dimensional launch: one thread per element, `threads` per block.
pub fn elementwise(kernel: &str, n: usize, threads: u32, limits: &DeviceLimits) -> Result<LaunchConfig> {
    tiled(kernel, [n, 1, 1], [threads as usize, 1, 1], [threads, 1, 1], 0, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: DeviceLimits = DeviceLimits::A100;

    #[test]
    fn ragged_sizes_round_up_to_whole_tiles() {
        let c = elementwise("axpy", 1000, 256, &L).unwrap();
        assert_eq!((c.grid, c.block, c.shared_bytes), ([4, 1, 1], [256, 1, 1], 0));
        assert_eq!(elementwise("axpy", 1024, 256, &L).unwrap().grid, [4, 1, 1]);
        assert_eq!(elementwise("axpy", 1025, 256, &L).unwrap().grid, [5, 1, 1]);
        assert_eq!(elementwise("axpy", 1, 256, &L).unwrap().grid, [1, 1, 1]);
        // A GEMM of 1000 x 300 in 128 x 64 tiles, 256 threads, 32 KiB of shared memory.
        let g = tiled("gemm", [300, 1000, 1], [64, 128, 1], [256, 1, 1], 32 * 1024, &L).unwrap();
        assert_eq!(g.grid, [5, 8, 1]);
        assert_eq!(g.blocks(), 40);
        assert!(!g.needs_shared_optin);
    }

    #[test]
    fn zero_sizes_are_errors_naming_the_kernel() {
        for (problem, tile, block) in [
            ([0, 1, 1], [1, 1, 1], [32, 1, 1]),
            ([8, 0, 1], [1, 1, 1], [32, 1, 1]),
            ([8, 1, 1], [0, 1, 1], [32, 1, 1]),
            ([8, 1, 1], [1, 1, 1], [0, 1, 1]),
        ] {
            let e = tiled("layernorm_fwd_f32", problem, tile, block, 0, &L).unwrap_err().to_string();
            assert!(e.contains("kernel layernorm_fwd_f32") && e.contains("zero"), "{e}");
        }
    }

    #[test]
    fn limits_are_checked_before_the_launch() {
        let e = elementwise("k", 10, 2048, &L).unwrap_err().to_string();
        assert!(e.contains("2048 threads along x exceeds the device limit 1024"), "{e}");
        let e = tiled("k", [1, 1, 1], [1, 1, 1], [32, 32, 2], 0, &L).unwrap_err().to_string();
        assert!(e.contains("2048 threads per block exceed the device limit 1024"), "{e}");
        let e = tiled("k", [1, 70_000, 1], [1, 1, 1], [32, 1, 1], 0, &L).unwrap_err().to_string();
        assert!(e.contains("70000 blocks along y") && e.contains("65535"), "{e}");
        // Shared memory: default, opt-in, and over the opt-in limit.
        assert!(!tiled("k", [1, 1, 1], [1, 1, 1], [32, 1, 1], 48 * 1024, &L).unwrap().needs_shared_optin);
        assert!(tiled("k", [1, 1, 1], [1, 1, 1], [32, 1, 1], 48 * 1024 + 1, &L).unwrap().needs_shared_optin);
        assert!(tiled("k", [1, 1, 1], [1, 1, 1], [32, 1, 1], 200 * 1024, &DeviceLimits::H100).is_ok());
        let e = tiled("attn", [1, 1, 1], [1, 1, 1], [128, 1, 1], 200 * 1024, &L).unwrap_err().to_string();
        assert!(e.contains("kernel attn: 204800 bytes of shared memory") && e.contains("166912"), "{e}");
    }
}
