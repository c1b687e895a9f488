/work/main/target-nompi/release/deps/trident-f7c020bb99cca37b.d: src/main.rs

/work/main/target-nompi/release/deps/trident-f7c020bb99cca37b: src/main.rs

src/main.rs:

# env-dep:CARGO_PKG_VERSION=0.1.0
# env-dep:TRIDENT_BUILD_INFO=66e941a48d7d+dirty release x86_64-unknown-linux-gnu, rustc 1.95.0 (59807616e 2026-04-14)
