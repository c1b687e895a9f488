//! Helpers shared by the integration tests that drive the `trident` binary: scratch directories,
//! running a command, and writing `.bin/.idx` pairs byte by byte from Megatron's layout.

#![allow(dead_code)]

pub mod emu;
pub mod emu_cases;
pub mod gpu_device;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_trident");

/// A fresh directory under the system temp dir, unique to this test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trident-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The command that runs the binary on `ranks` ranks under Open MPI's mpirun (as root,
/// oversubscribed), for callers that add an environment.
pub fn mpirun_command(ranks: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--allow-run-as-root", "-np", &ranks.to_string(), BIN]).args(args);
    c
}

/// Runs the binary on `ranks` ranks under Open MPI's mpirun (as root, oversubscribed).
pub fn mpirun(ranks: usize, args: &[&str]) -> Output {
    mpirun_command(ranks, args)
        .output()
        .expect("mpirun runs: install Open MPI (Debian: libopenmpi-dev openmpi-bin), as .ci/run does")
}

/// The text of field `key` in one `--log-json` line.
pub fn json_field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\": "))? + key.len() + 4;
    Some(line[start..].split([',', '}']).next()?.trim().to_string())
}

/// (iteration, exact text of the loss) of every complete line of a `--log-json` file (a line
/// cut short by a killed process is skipped; a missing file has none).
pub fn logged_losses(path: &Path) -> Vec<(u64, String)> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    text.lines()
        .filter(|l| l.ends_with('}'))
        .map(|l| (json_field(l, "iteration").unwrap().parse().unwrap(), json_field(l, "loss").unwrap()))
        .collect()
}

/// The losses of a `--log-json` file as numbers.
pub fn loss_values(path: &Path) -> Vec<f64> {
    logged_losses(path).iter().map(|(_, l)| l.parse().unwrap()).collect()
}

pub fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("the trident binary runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a clean failure: non-zero exit, exactly one line on stderr that starts with
/// "trident: error:" and contains every one of `needles`, and no panic.
pub fn assert_clean_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {err}");
    assert!(lines[0].starts_with("trident: error:"), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "'{n}' not in: {err}");
    }
}

/// Writes `prefix.bin/.idx` holding one sequence per document, uint16 tokens, by hand from the
/// byte layout of Megatron's MMIDIDX version 1.
pub fn write_u16_dataset(prefix: &Path, docs: &[Vec<u16>]) {
    let mut bin = Vec::new();
    for d in docs {
        for t in d {
            bin.extend_from_slice(&t.to_le_bytes());
        }
    }
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    let mut idx = Vec::new();
    idx.extend_from_slice(b"MMIDIDX\0\0");
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8); // uint16
    idx.extend_from_slice(&(docs.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(docs.len() as u64 + 1).to_le_bytes());
    for d in docs {
        idx.extend_from_slice(&(d.len() as i32).to_le_bytes());
    }
    let mut ptr = 0i64;
    for d in docs {
        idx.extend_from_slice(&ptr.to_le_bytes());
        ptr += 2 * d.len() as i64;
    }
    for i in 0..=docs.len() as i64 {
        idx.extend_from_slice(&i.to_le_bytes());
    }
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
}

/// Prepares the bundled corpus into `dir` and returns the dataset prefix.
pub fn prepared_corpus(dir: &Path) -> String {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/data/tinyshakespeare.txt");
    let prefix = dir.join("shakespeare");
    let o = run(&["prepare", "--input", corpus, "--output-prefix", prefix.to_str().unwrap(), "--append-eod"]);
    assert!(o.status.success(), "prepare failed: {}", stderr(&o));
    format!("{}_text_document", prefix.display())
}

/// Flags for a small, fast model used by the tests (2 micro-batches per iteration).
pub const SMALL: &[&str] = &[
    "--num-layers",
    "2",
    "--hidden-size",
    "32",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--micro-batch-size",
    "4",
    "--global-batch-size",
    "8",
    "--lr",
    "1e-3",
    "--lr-warmup-iters",
    "2",
    "--eval-interval",
    "5",
    "--eval-iters",
    "2",
    "--log-interval",
    "1",
    "--cpu-threads",
    "2",
];
