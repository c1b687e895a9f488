//! `trident check <target>`: verifications a person runs on a new machine or build. On one
//! process: `gpu` (a test kernel and the Device's ops on each GPU), `ops` (every Device op against
//! the f64 reference), `losses` (two runs' losses agree) and `data` (the datasets `train` would
//! build, and their samples). On every rank of an MPI job: `comm`
//! (the Comm seam), `nccl` (NCCL/RCCL collectives on device memory against MPI) and `nccl-id`.

pub mod comm;
pub mod data;
pub mod gpu;
pub mod losses;
pub mod nccl;
pub mod ops;

use super::{exit, start_mpi};
use std::process::ExitCode;

/// `trident check <target> [flags]`: the targets that need MPI start it, the others run here.
pub fn run(rest: &[String]) -> ExitCode {
    let target = rest.first().map(String::as_str);
    let args = rest.get(1..).unwrap_or_default();
    match target {
        // A GPU op that failed (`error::fail`) ends the check like any error.
        Some("ops") => return exit(crate::error::catch_failure(|| ops::run(args))),
        Some("losses") => return exit(crate::error::catch_failure(|| losses::run(args))),
        Some("data") => return exit(data::run(args)),
        Some("gpu") => return exit(crate::error::catch_failure(gpu::run)),
        Some("comm" | "nccl-id" | "nccl") => {}
        _ => {
            eprintln!("trident: error: check needs a target: `trident check comm`, `check nccl-id` or `check nccl` (run them under mpirun), `check gpu`, `check ops`, `check losses` or `check data`");
            return ExitCode::FAILURE;
        }
    }
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match target {
        Some("nccl") => nccl::run(&rt, args),
        Some("nccl-id") => nccl::run_id(&rt),
        _ => match comm::run(&rt) {
            Ok(passed) => {
                if rt.world_rank == 0 {
                    println!("comm check: {passed} checks passed on each of {} ranks ({})", rt.world_size, rt.library);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("trident: error: {e}");
                rt.abort(1)
            }
        },
    }
}
