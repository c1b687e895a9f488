//! `trident train`: starts MPI, parses the flags into a `TrainConfig`, runs `train::run` on every
//! rank, and turns the outcome into the exit status (the requeue code after a stop that saved a
//! checkpoint).

use super::{flags, start_mpi};
use crate::config::TrainConfig;
use crate::flags::TRAIN_FLAGS;
use std::process::ExitCode;

/// `trident train` on every rank of the job. MPI starts first, so that an error every rank
/// detects alike (a flag, a layout) is printed once, by rank 0, and every rank exits non-zero;
/// an error only some ranks see (a failed read) is printed by that rank, which then ends the
/// whole job so that no rank waits forever in a collective.
pub fn run(rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // A Device op that failed (`error::fail`) ends the run like any error.
    let result = crate::error::catch_failure(|| {
        let Some(a) = flags("train", "train a GPT model (Megatron's flag names)", TRAIN_FLAGS, rest)? else {
            return Ok(false);
        };
        let cfg = TrainConfig::from_args(&a)?;
        crate::train::run(&cfg, &rt).map(|summary| summary.stopped.is_some())
    });
    match result {
        Ok(false) => ExitCode::SUCCESS,
        // Stopped early after a checkpoint (--exit-signal-handler, --exit-duration-in-mins).
        Ok(true) => ExitCode::from(crate::stop::REQUEUE_EXIT_CODE),
        Err(e) if e.is_collective() || rt.world_size == 1 => {
            if rt.world_rank == 0 {
                eprintln!("trident: error: {e}");
            }
            ExitCode::FAILURE
        }
        Err(e) => super::abort_after(&rt, &e),
    }
}
