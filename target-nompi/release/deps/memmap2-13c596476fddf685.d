/work/main/target-nompi/release/deps/memmap2-13c596476fddf685.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/unix.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/advice.rs

/work/main/target-nompi/release/deps/libmemmap2-13c596476fddf685.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/unix.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/advice.rs

/work/main/target-nompi/release/deps/libmemmap2-13c596476fddf685.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/unix.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/advice.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/lib.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/unix.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/memmap2-0.9.12/src/advice.rs:
