//! The commands of the `trident` binary: each module takes one subcommand's flags, turns them into
//! calls of the library, and prints what comes back (`prepare`, `train`, `generate`, `convert`,
//! `plan`, `info`, the `bench` and `check` families). This file holds the usage text, the dispatch
//! of `trident <command>`, and the glue the commands share: flag parsing with `--help`, the thread
//! count, MPI's start, and how an error becomes one line on stderr and an exit status. The arrow
//! runs one way: commands import the library, and no library module imports `cmd`.

pub mod bench;
pub mod check;
pub mod convert;
pub mod generate;
pub mod info;
pub mod plan;
pub mod prepare;
pub mod train;

use crate::cli::{self, Args, FlagSpec};
use crate::comm::runtime::Runtime;
use crate::error::{Error, Result};
use crate::gpu::nccl::Flavor;
use std::process::ExitCode;

const USAGE: &str = "\
trident: Megatron-style GPT training in one binary

usage: trident <command> [flags]     (trident <command> --help lists the flags)

commands:
  prepare    text or JSON-lines files -> a Megatron .bin/.idx token dataset
  train      train a GPT model on a prepared dataset
  generate   sample text from a checkpoint
  convert    reshard a checkpoint to another TP/PP layout; export to / import from Hugging Face
  bench      microbenchmarks: peak (FMA peak), gemm (GEMM sweep), attention, layernorm, step,
             allreduce, allgather, reducescatter, sendrecv (collectives, under mpirun);
             gemm, attention and allreduce also on an NVIDIA GPU with --device cuda
  check      `check comm`: verify every collective of the Comm seam on this job (under mpirun);
             `check nccl-id`: rank 0's NCCL unique id reaches every rank (under mpirun);
             `check nccl`: every NCCL collective on GPU memory against MPI (under mpirun);
             `check gpu`: compile, load and launch a test kernel on each NVIDIA GPU, else each AMD GPU;
             `check ops --device cuda|hip|cpu [--size small|full] [--gpu N]`: every Device op against
             the f64 reference; `check losses A.jsonl B.jsonl [--rtol R]`: two runs' losses agree
  plan       choose a tensor/pipeline/data-parallel layout for a model on N GPUs (no GPU needed)
  info       what this binary found on this machine
";

/// `trident <args>`: runs the command and returns the process's exit status.
pub fn main(args: &[String]) -> ExitCode {
    let Some((command, rest)) = args.split_first() else {
        print!("{USAGE}");
        return exit(Err(Error::Usage("no command given".into())));
    };
    // A TRIDENT_CPU_ISA the CPU cannot honour, or a TRIDENT_BF16_KERNEL it cannot run, is one
    // error before any command (every rank).
    if let Err(e) = crate::device::cpu::isa::check().and_then(|_| crate::device::cpu::gemm_bf16::choose::check()) {
        return exit(Err(e));
    }
    match command.as_str() {
        "prepare" => exit(prepare::run(rest)),
        "train" => train::run(rest),
        "generate" => exit(crate::error::catch_failure(|| generate::run(rest))),
        "bench" => bench::run(rest),
        "check" => check::run(rest),
        "info" => exit(info::run(rest)),
        "convert" => exit(convert::run(rest)),
        "plan" => exit(plan::run(rest)),
        "--help" | "-h" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        "--version" => {
            println!("trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
            ExitCode::SUCCESS
        }
        other => exit(Err(Error::Usage(format!("unknown command '{other}' (see `trident --help`)")))),
    }
}

/// The exit status of a command that runs on one process: an error is one line on stderr.
fn exit(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trident: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses flags or prints the help text; `None` means help was printed.
fn flags(command: &str, summary: &str, specs: &[FlagSpec], rest: &[String]) -> Result<Option<Args>> {
    let parsed = cli::parse(command, specs, rest)?;
    if parsed.is_none() {
        print!("{}", cli::help(command, summary, specs));
    }
    Ok(parsed)
}

/// `--cpu-threads`, or every core this process may use.
fn threads(args: &Args) -> Result<usize> {
    match args.usize("--cpu-threads")? {
        Some(0) => Err(Error::flag("--cpu-threads", 0, "a positive whole number")),
        Some(n) => Ok(n),
        None => Ok(crate::comm::runtime::process_cpus()),
    }
}

/// Starts MPI (or a single process); a launcher mismatch is reported once and ends the process.
fn start_mpi() -> std::result::Result<Runtime, ExitCode> {
    Runtime::init().map_err(|e| {
        if let Some(e) = e {
            eprintln!("trident: error: {e}");
        }
        ExitCode::FAILURE
    })
}

/// `--comm-library`: which library of the NCCL ABI the GPU collectives load (`check nccl`,
/// `bench allreduce --device cuda`).
fn comm_library(a: &Args) -> Result<Flavor> {
    match a.str("--comm-library").unwrap_or("nccl") {
        "nccl" => Ok(Flavor::Nccl),
        "rccl" => Ok(Flavor::Rccl),
        other => Err(Error::flag("--comm-library", format!("'{other}'"), "nccl or rccl")),
    }
}

/// How a rank ends after a GPU-collective error: an error every rank meets alike (a flag, a missing
/// library) is printed once by rank 0 and every rank exits; any other (a peer that died, a
/// mismatch seen here) is printed by the rank that met it, which then ends the whole job, after a
/// moment in which the other surviving ranks print theirs (they time out together).
fn end_after_gpu_comm_error(rt: &Runtime, e: Error) -> ExitCode {
    let library_missing = matches!(e, Error::GpuLibrary { .. });
    if e.is_collective() || library_missing || rt.world_size == 1 {
        if rt.world_rank == 0 {
            eprintln!("trident: error: {e}");
        }
        return ExitCode::FAILURE;
    }
    if matches!(&e, Error::Comm(m) if rt.world_rank != 0 && m.starts_with("rank 0 could not")) {
        return ExitCode::FAILURE;
    }
    abort_after(rt, &e)
}

/// Ends the job after an error only this rank met: its line in one write (so that the lines of
/// ranks failing together, and the launcher's abort notice, cannot split it), a moment for the
/// launcher to pass it on and for the other surviving ranks to print theirs, then
/// `Runtime::abort`.
fn abort_after(rt: &Runtime, e: &Error) -> ExitCode {
    let line = format!("trident: error: rank {}: {e}\n", rt.world_rank);
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    std::thread::sleep(ABORT_GRACE);
    rt.abort(1)
}

/// How long a rank that met an error waits before ending the job: the surviving ranks time out
/// on the same dead peer, but each from when it reached the collective, and on a loaded node
/// (ranks sharing cores) one can reach it a second after another; 500 ms lost a rank's line
/// when `make test` ran two test files at once.
const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
