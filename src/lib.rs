//! trident: Megatron-style GPT training in one binary. The library holds everything; `main.rs`
//! only turns a command line into a call and an exit code.

pub mod bench_comm;
pub mod bench_cuda;
pub mod bench_gemm;
pub mod bench_ops;
pub mod bench_summa;
pub mod check_comm;
pub mod checkpoint;
pub mod cli;
pub mod comm;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
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
