//! What the kernel-emulation tests (`cuda_emulation.rs`, `hip_emulation.rs`) share: compiling a
//! C++ harness against the SIMT emulation, a vendor's harness and inputs (`Vendor`), a case
//! directory of input and output arrays the harness reads and writes, deterministic inputs, and
//! the comparison with the reference device under docs/design.md's rule for 16-bit storage,
//! |x - ref| <= atol + rtol |ref|: bf16's 0.079 (llm.c's), or fp16's, 8 times tighter for its 3 more
//! mantissa bits, for a harness built as the fp16 module (`-DTRIDENT_FP16`, `Vendor::half`); and a
//! tighter bound for f32. The cases both vendors run are `emu_cases.rs`'s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use trident::device::prelude::*;
use trident::device::reference::ReferenceDevice;
use trident::real::Precision;
use trident::rng::Stream;

pub const BF16_RTOL: f64 = 0.079;
pub const BF16_ATOL: f64 = 1e-2;
/// fp16 (binary16) storage: bf16's bounds over 2^3, the 3 mantissa bits it has more.
pub const FP16_RTOL: f64 = BF16_RTOL / 8.0;
pub const FP16_ATOL: f64 = BF16_ATOL / 8.0;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The include paths the emulations compile kernels with: kernels/ and both vendors' folders
/// (files include each other as `common/<name>`; no two folders hold the same name: the CUDA
/// headers end in `.cuh`, kernels/common/'s and kernels-hip/common/'s in `.h` with distinct names).
pub fn kernel_include_paths() -> Vec<String> {
    ["kernels", "kernels-cuda", "kernels-hip"].iter().map(|d| format!("-I{}", root().join(d).display())).collect()
}

/// Compiles the harness `source` (relative to the checkout) with the emulation and `defines`,
/// into `CARGO_TARGET_TMPDIR/<kind>/harness-<defines>-<pid>`.
fn compile_harness(source: &str, kind: &str, defines: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(kind);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(format!("harness-{}-{}", defines.join(""), std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let src = root().join(source);
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-DTRIDENT_EMU", "-pthread"])
        .args(kernel_include_paths())
        .args(defines)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler {cxx} (install g++): {e}"));
    assert!(out.status.success(), "compiling {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
    exe
}

/// One vendor's kernels under the emulation: where its cases go, its harness and its inputs.
pub struct Vendor {
    /// The folder of its cases under `CARGO_TARGET_TMPDIR` ("cuda-emu", "hip-emu").
    pub kind: &'static str,
    /// The seed of its inputs.
    pub seed: u64,
    /// Its harness source, relative to the checkout, and the defines it is built with.
    pub harness: &'static str,
    pub defines: &'static [&'static str],
    /// The 16-bit storage format its kernels are built for: bf16, or f16 where `defines` has
    /// `-DTRIDENT_FP16` (the fp16 module). Its inputs are rounded to it, its `.bf16` files hold
    /// its bits, and its 16-bit outputs are held to its bounds.
    pub half: Precision,
    /// Its attention forward also reads a qkv at an odd element offset (HIP's scalar loads).
    pub unaligned_attention: bool,
}

impl Vendor {
    /// A fresh case directory `CARGO_TARGET_TMPDIR/<kind>/<name>` for this vendor's harness.
    pub fn case(&self, name: &str) -> Case {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(self.kind).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Case { dir, harness: self.harness_binary(), half: self.half }
    }
    /// The harness binary of this build, compiled once per test process (about 2 s).
    fn harness_binary(&self) -> PathBuf {
        static BUILT: Mutex<BTreeMap<(&str, &[&str]), PathBuf>> = Mutex::new(BTreeMap::new());
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        let key = (self.harness, self.defines);
        built.entry(key).or_insert_with(|| compile_harness(self.harness, self.kind, self.defines)).clone()
    }
    /// Normal values of the given scale from stream `name`, rounded to the kernels' 16-bit
    /// storage format (`half`), so the reference sees exactly the kernel's inputs.
    pub fn half_values(&self, n: usize, name: &str, scale: f64) -> Vec<f32> {
        let s = Stream::new(self.seed, name, 7);
        (0..n).map(|i| self.half.round((scale * s.normal(i as u64)) as f32)).collect()
    }
    pub fn f32_values(&self, n: usize, name: &str, scale: f64, offset: f64) -> Vec<f32> {
        let s = Stream::new(self.seed, name, 7);
        (0..n).map(|i| (offset + scale * s.normal(i as u64)) as f32).collect()
    }
    /// Token ids uniform in 0..below.
    pub fn tokens(&self, n: usize, name: &str, below: u32) -> Vec<u32> {
        let s = Stream::new(self.seed, name, 9);
        (0..n).map(|i| ((s.uniform(i as u64, 0) * below as f64) as u32).min(below - 1)).collect()
    }
}

/// A case's directory of input and output arrays, and the harness that runs it.
pub struct Case {
    dir: PathBuf,
    harness: PathBuf,
    /// The harness's 16-bit storage format (`Vendor::half`).
    half: Precision,
}

impl Case {
    fn write(&self, name: &str, ext: &str, bytes: Vec<u8>) {
        std::fs::write(self.dir.join(format!("{name}.{ext}")), bytes).unwrap();
    }
    fn read(&self, name: &str, ext: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(format!("{name}.{ext}"))).unwrap()
    }
    /// 16-bit values in the harness's storage format, as the file `<name>.bf16` (the harness's
    /// name for its 16-bit arrays, whichever the format).
    pub fn put_half(&self, name: &str, values: &[f32]) {
        self.write(name, "bf16", values.iter().flat_map(|&x| self.half.to_bits16(x).to_le_bytes()).collect());
    }
    pub fn put_f32(&self, name: &str, values: &[f32]) {
        self.write(name, "f32", values.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    pub fn put_u32(&self, name: &str, values: &[u32]) {
        self.write(name, "u32", values.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    pub fn put_f64(&self, name: &str, values: &[f64]) {
        self.write(name, "f64", values.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    pub fn get_half(&self, name: &str) -> Vec<f32> {
        let bytes = self.read(name, "bf16");
        bytes.chunks_exact(2).map(|b| self.half.from_bits16(u16::from_le_bytes([b[0], b[1]]))).collect()
    }
    /// The 16-bit output `name` against `want` within the storage format's bounds (`half_bounds`);
    /// returns the largest absolute error.
    pub fn check_half(&self, what: &str, name: &str, want: &[f64]) -> f64 {
        let (atol, rtol) = half_bounds(self.half);
        check(what, &self.get_half(name), want, atol, rtol)
    }
    pub fn get_f32(&self, name: &str) -> Vec<f32> {
        self.read(name, "f32").chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
    pub fn get_u32(&self, name: &str) -> Vec<u32> {
        self.read(name, "u32").chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
    pub fn get_f64(&self, name: &str) -> Vec<f64> {
        self.read(name, "f64").chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
    }
    pub fn get_i32(&self, name: &str) -> Vec<i32> {
        self.read(name, "i32").chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
    /// f64 outputs (the kernels' row statistics) as f32, for `check_f32`.
    pub fn get_f64_as_f32(&self, name: &str) -> Vec<f32> {
        self.get_f64(name).iter().map(|&v| v as f32).collect()
    }
    /// Runs `op` of the harness on this case; it must succeed.
    pub fn run(&self, op: &str, args: &[String]) {
        let out = Command::new(&self.harness).arg(op).arg(&self.dir).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "emulated kernel {op} {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    /// Runs `op` of the harness on this case: Ok, or its stderr when it fails.
    pub fn outcome(&self, op: &str, args: &[String]) -> Result<(), String> {
        let out = Command::new(&self.harness).arg(op).arg(&self.dir).args(args).output().unwrap();
        out.status.success().then_some(()).ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }
    /// Runs an op that must fail; returns its stderr.
    pub fn run_failing(&self, op: &str) -> String {
        let out = Command::new(&self.harness).arg(op).arg(&self.dir).output().unwrap();
        assert!(!out.status.success(), "{op} should have failed");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

/// The harness's command-line arguments.
pub fn args(xs: &[&dyn std::fmt::Display]) -> Vec<String> {
    xs.iter().map(|x| x.to_string()).collect()
}

pub fn reference(dev: &ReferenceDevice, host: &[f32]) -> Vec<f64> {
    let mut b = dev.alloc(host.len());
    dev.upload(&mut b, host);
    b
}

/// How far outputs are from the reference: the largest |error| and the number of elements
/// outside atol + rtol |ref|, with the first of them.
pub struct Comparison {
    pub worst: f64,
    pub violations: usize,
    pub first: Option<(usize, f32, f64)>,
}

pub fn compare(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> Comparison {
    assert_eq!(got.len(), want.len(), "output length");
    let mut c = Comparison { worst: 0.0, violations: 0, first: None };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        // A NaN fails the bound as well.
        if err.is_nan() || err > atol + rtol * w.abs() {
            c.violations += 1;
            c.first.get_or_insert((i, g, w));
        }
        if err > c.worst {
            c.worst = err;
        }
    }
    c
}

/// Asserts |got - want| <= atol + rtol |want| elementwise; returns the largest absolute error.
pub fn check(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let c = compare(got, want, atol, rtol);
    if let Some((i, g, w)) = c.first {
        let err = (g as f64 - w).abs();
        panic!(
            "{what}: {} elements out of bounds; element {i} is {g}, the reference {w} (|error| {err:.3e} > \
             {atol:.1e} + {rtol} |ref|)",
            c.violations
        );
    }
    println!("{what}: max |error| {:.3e}, {} elements", c.worst, got.len());
    c.worst
}

/// bf16 outputs: docs/design.md's rule.
pub fn bf16_bounds() -> (f64, f64) {
    (BF16_ATOL, BF16_RTOL)
}

/// 16-bit outputs in `half` (bf16 or f16): docs/design.md's rule with the format's tolerances.
pub fn half_bounds(half: Precision) -> (f64, f64) {
    match half {
        Precision::F16 => (FP16_ATOL, FP16_RTOL),
        _ => bf16_bounds(),
    }
}

/// f32 outputs of f32 arithmetic on exact inputs: a few f32 roundings of the largest value.
pub fn f32_bounds(want: &[f64], rtol: f64) -> (f64, f64) {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    (rtol * scale, rtol)
}

pub fn check_f32(what: &str, got: &[f32], want: &[f64], rtol: f64) -> f64 {
    let (atol, rtol) = f32_bounds(want, rtol);
    check(what, got, want, atol, rtol)
}
