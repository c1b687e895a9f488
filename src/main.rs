//! The `trident` command: hands the command line to `trident::cmd`, which parses the subcommand and
//! its flags, runs it, and turns any error into one line on stderr and a non-zero exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    trident::cmd::main(&args)
}
