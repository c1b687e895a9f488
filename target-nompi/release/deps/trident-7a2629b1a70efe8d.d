/work/main/target-nompi/release/deps/trident-7a2629b1a70efe8d.d: src/lib.rs src/bench_comm.rs src/bench_gemm.rs src/checkpoint/mod.rs src/cli.rs src/comm/mod.rs src/comm/runtime.rs src/config.rs src/data/mod.rs src/data/gpt_dataset.rs src/data/indexed.rs src/data/json.rs src/data/numpy_rng.rs src/data/prepare.rs src/data/tokenizer.rs src/device/mod.rs src/device/cpu/mod.rs src/device/cpu/gemm.rs src/device/cpu/peak.rs src/device/cpu/pool.rs src/device/cpu/simd.rs src/device/kernels.rs src/device/reference.rs src/error.rs src/generate.rs src/log.rs src/model/mod.rs src/model/gpt.rs src/optim/mod.rs src/optim/lr.rs src/parallel/mod.rs src/parallel/data.rs src/parallel/grid.rs src/parallel/tensor.rs src/real.rs src/rng.rs src/tensor.rs src/train.rs

/work/main/target-nompi/release/deps/libtrident-7a2629b1a70efe8d.rlib: src/lib.rs src/bench_comm.rs src/bench_gemm.rs src/checkpoint/mod.rs src/cli.rs src/comm/mod.rs src/comm/runtime.rs src/config.rs src/data/mod.rs src/data/gpt_dataset.rs src/data/indexed.rs src/data/json.rs src/data/numpy_rng.rs src/data/prepare.rs src/data/tokenizer.rs src/device/mod.rs src/device/cpu/mod.rs src/device/cpu/gemm.rs src/device/cpu/peak.rs src/device/cpu/pool.rs src/device/cpu/simd.rs src/device/kernels.rs src/device/reference.rs src/error.rs src/generate.rs src/log.rs src/model/mod.rs src/model/gpt.rs src/optim/mod.rs src/optim/lr.rs src/parallel/mod.rs src/parallel/data.rs src/parallel/grid.rs src/parallel/tensor.rs src/real.rs src/rng.rs src/tensor.rs src/train.rs

/work/main/target-nompi/release/deps/libtrident-7a2629b1a70efe8d.rmeta: src/lib.rs src/bench_comm.rs src/bench_gemm.rs src/checkpoint/mod.rs src/cli.rs src/comm/mod.rs src/comm/runtime.rs src/config.rs src/data/mod.rs src/data/gpt_dataset.rs src/data/indexed.rs src/data/json.rs src/data/numpy_rng.rs src/data/prepare.rs src/data/tokenizer.rs src/device/mod.rs src/device/cpu/mod.rs src/device/cpu/gemm.rs src/device/cpu/peak.rs src/device/cpu/pool.rs src/device/cpu/simd.rs src/device/kernels.rs src/device/reference.rs src/error.rs src/generate.rs src/log.rs src/model/mod.rs src/model/gpt.rs src/optim/mod.rs src/optim/lr.rs src/parallel/mod.rs src/parallel/data.rs src/parallel/grid.rs src/parallel/tensor.rs src/real.rs src/rng.rs src/tensor.rs src/train.rs

src/lib.rs:
src/bench_comm.rs:
src/bench_gemm.rs:
src/checkpoint/mod.rs:
src/cli.rs:
src/comm/mod.rs:
src/comm/runtime.rs:
src/config.rs:
src/data/mod.rs:
src/data/gpt_dataset.rs:
src/data/indexed.rs:
src/data/json.rs:
src/data/numpy_rng.rs:
src/data/prepare.rs:
src/data/tokenizer.rs:
src/device/mod.rs:
src/device/cpu/mod.rs:
src/device/cpu/gemm.rs:
src/device/cpu/peak.rs:
src/device/cpu/pool.rs:
src/device/cpu/simd.rs:
src/device/kernels.rs:
src/device/reference.rs:
src/error.rs:
src/generate.rs:
src/log.rs:
src/model/mod.rs:
src/model/gpt.rs:
src/optim/mod.rs:
src/optim/lr.rs:
src/parallel/mod.rs:
src/parallel/data.rs:
src/parallel/grid.rs:
src/parallel/tensor.rs:
src/real.rs:
src/rng.rs:
src/tensor.rs:
src/train.rs:

# env-dep:CARGO_PKG_VERSION=0.1.0
# env-dep:TRIDENT_BUILD_INFO=66e941a48d7d+dirty release x86_64-unknown-linux-gnu, rustc 1.95.0 (59807616e 2026-04-14)
