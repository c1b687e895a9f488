//! trident: Megatron-style GPT training in one binary. The library holds everything: the commands
//! (`cmd`: flags in, library calls, printing out) above what they run; `main.rs` only hands the
//! command line to `cmd::main` and returns its exit code.

pub mod checkpoint;
pub mod cli;
pub mod cmd;
pub mod comm;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod files;
pub mod flags;
pub mod generate;
pub mod gpu;
pub mod log;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod plan;
pub mod real;
pub mod rng;
pub mod stop;
pub mod tensor;
pub mod train;
