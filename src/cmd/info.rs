//! `trident info`: what this binary found on this machine: its build, the CPU kernels and FMA
//! peak, the GPU libraries and devices of each vendor, and the MPI library it was built with.

use super::{flags, threads};
use crate::device::cpu::{gemm, isa, peak, pool};
use crate::error::Result;
use crate::flags::INFO_FLAGS;

/// `trident info [--cpu-threads N]`.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) = flags("info", "what this binary found on this machine", INFO_FLAGS, rest)? else {
        return Ok(());
    };
    let pool = pool::ThreadPool::new(threads(&a)?);
    let p = peak::measure_fma_peak(&pool, 150);
    println!("trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
    let (active, detected) = (isa::active(), isa::detected());
    println!(
        "cpu: {}; instruction set {}{}; {} threads; gemm kernel {}; bf16 gemm kernel {}; element-wise kernels {}; \
         fma peak {:.1} GFLOP/s ({})",
        isa::cpu_model().unwrap_or_else(|| "model unknown".into()),
        active.name(),
        if active == detected {
            String::new()
        } else {
            format!(" (capped by {}; the CPU has {})", isa::ISA_VAR, detected.name())
        },
        pool.threads(),
        gemm::best_kernel().name(),
        crate::device::cpu::gemm_bf16::choose::chosen().describe(),
        crate::device::cpu::simd::level().name(),
        p.gflops,
        p.isa
    );
    let kernel = gemm::best_kernel();
    let blocks = gemm::blocks(kernel);
    println!(
        "cpu gemm blocking: {} depth block {}, row block {}, column block {} (L1 data cache {})",
        kernel.name(),
        blocks.kc,
        blocks.mc,
        blocks.nc,
        isa::l1d_bytes().map_or_else(|| "size unknown".into(), |b| format!("{} KiB per core", b >> 10))
    );
    for line in crate::gpu::info_lines() {
        println!("{line}");
    }
    for line in crate::gpu::hip_info_lines() {
        println!("{line}");
    }
    #[cfg(feature = "mpi")]
    {
        // MPI_Get_library_version may be called before MPI starts.
        let library = mpi::environment::library_version()
            .map(|s| s.trim_end_matches('\0').lines().next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|_| "an MPI library".into());
        println!("mpi: built with {library}; start many ranks with that MPI's mpirun/mpiexec or srun");
    }
    #[cfg(not(feature = "mpi"))]
    println!("mpi: not built into this binary (cargo --no-default-features): one rank only");
    Ok(())
}
