//! Helpers of the crafted-file suites (`tests/untrusted_files.rs`, `tests/untrusted_fuzz.rs`): the
//! binary run with its peak memory measured (`wait4`'s maximum resident set) and a watchdog
//! against hangs; small valid models, checkpoints, Hugging Face directories and tokenizer files to
//! craft from; and shards written byte by byte in version 1's layout, which every trident reads.

#![allow(dead_code)]

use crate::common::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use trident::checkpoint::{SavedTensor, Shard};

/// The peak resident memory any run of a crafted input may reach: 64 MiB (the binary itself and
/// a tiny model take a few MiB), plus four times the bytes of the input (a reader maps or reads
/// its file once and builds values of at most twice its size). docs/formats.md states the
/// bound for inputs of any size.
pub fn peak_bound_kib(input_bytes: u64) -> u64 {
    64 * 1024 + 4 * input_bytes / 1024
}

/// The bound for a run on valid files that describe a model of `parameters`: `peak_bound_kib` of
/// the input plus 16 bytes a parameter (its f32 weights and both AdamW moments, which `convert`
/// holds whole).
pub fn model_bound_kib(input_bytes: u64, parameters: u64) -> u64 {
    peak_bound_kib(input_bytes) + 16 * parameters / 1024
}

/// The bound for reading a tokenizer file of `input_bytes`: 64 MiB plus 24 times the file (its
/// JSON tree, the vocabulary and merges taken from it, and the BPE tables built from those).
pub fn tokenizer_bound_kib(input_bytes: u64) -> u64 {
    64 * 1024 + 24 * input_bytes / 1024
}

/// A tokenizer.json in `dir` of the 256 bytes, `<|endoftext|>` and `merges` merges, each joining
/// a token made earlier with a byte (tokens of up to 12 bytes): a large, valid BPE.
pub fn large_tokenizer_json(dir: &Path, merges: usize) -> PathBuf {
    use trident::data::bpe::byte_char;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut known: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let (mut pairs, mut rng) = (Vec::new(), Rng(0x70c));
    while pairs.len() < merges {
        let left = tokens
            [if tokens.len() > 256 && rng.below(3) > 0 { 256 + rng.below(tokens.len() - 256) } else { rng.below(256) }]
        .clone();
        let right = tokens[rng.below(256)].clone();
        let joined = format!("{left}{right}");
        if joined.chars().count() > 12 || !known.insert(joined.clone()) {
            continue;
        }
        pairs.push(format!("[{}, {}]", json_string(&left), json_string(&right)));
        tokens.push(joined);
    }
    let eod = tokens.len();
    let vocab: Vec<String> = tokens.iter().enumerate().map(|(i, t)| format!("{}: {i}", json_string(t))).collect();
    let level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
    let text = format!(
        "{{\"added_tokens\": [{{\"id\": {eod}, \"content\": \"<|endoftext|>\", \"special\": true}}], \
         \"normalizer\": null, \"pre_tokenizer\": {level}, \"post_processor\": null, \"decoder\": {level}, \
         \"model\": {{\"type\": \"BPE\", \"vocab\": {{{}}}, \"merges\": [{}]}}}}",
        vocab.join(", "),
        pairs.join(", ")
    );
    let path = dir.join("large-tokenizer.json");
    std::fs::write(&path, text).unwrap();
    path
}

/// A finished run: its output and its peak resident memory in KiB.
pub struct Measured {
    pub out: Output,
    pub peak_kib: u64,
}

/// Runs the binary with `args`, measuring its peak memory; a run still going after `timeout`
/// is killed (and reported as hung by the assertions, through its signal). The child is reaped by
/// `wait4`, which also gives its resource use, not by `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn run_measured_for<S: AsRef<std::ffi::OsStr>>(args: &[S], timeout: Duration) -> Measured {
    let mut command = Command::new(BIN);
    // An address-space ceiling of 8 GiB as a safety net: a reader that tries to allocate
    // gigabytes fails at once (and is reported as the abort it is) instead of thrashing the
    // machine the tests share. The bound asserted is far lower.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit { rlim_cur: 8 << 30, rlim_max: 8 << 30 };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        });
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the trident binary starts");
    let pid = child.id() as libc::pid_t;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let done = Arc::new(AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            let step = Duration::from_millis(20);
            let mut waited = Duration::ZERO;
            while !done.load(Ordering::SeqCst) && waited < timeout {
                std::thread::sleep(step);
                waited += step;
            }
            if !done.load(Ordering::SeqCst) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    done.store(true, Ordering::SeqCst);
    watch.join().unwrap();
    assert_eq!(got, pid, "wait4 on the trident process");
    let out =
        Output { status: ExitStatus::from_raw(status), stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
    Measured { out, peak_kib: usage.ru_maxrss as u64 }
}

/// `run_measured_for` with a minute to finish.
pub fn run_measured<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Measured {
    run_measured_for(args, Duration::from_secs(60))
}

/// Total bytes of the regular files under `path` (or of the file itself).
pub fn bytes_under(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if meta.is_dir() {
        std::fs::read_dir(path).unwrap().map(|e| bytes_under(&e.unwrap().path())).sum()
    } else if meta.is_file() {
        meta.len()
    } else {
        0
    }
}

/// Asserts that a run on a crafted input ended as it must: exit 1 with one line on stderr naming
/// each of `needles` (the file, the value), no panic, no signal, and a peak memory under
/// `peak_bound_kib` of `input_bytes`.
pub fn assert_refused(m: &Measured, input_bytes: u64, needles: &[&str]) {
    let err = stderr(&m.out);
    assert!(
        m.out.status.signal().is_none(),
        "killed by signal {:?} (a hang or an abort): {err}",
        m.out.status.signal()
    );
    assert_eq!(m.out.status.code(), Some(1), "expected exit 1: {err}\n{}", stdout(&m.out));
    assert_bounded(m, input_bytes);
    assert_clean_error(&m.out, needles);
}

/// Runs every case (a name and a closure that asserts), then fails naming each case that failed,
/// so one failing case does not hide the others.
pub fn all_cases(cases: Vec<(String, Box<dyn FnOnce() + '_>)>) {
    let mut failed = Vec::new();
    for (name, case) in cases {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)).is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "failed cases (each one's assertion is printed above): {failed:?}");
}

/// A case for `all_cases`.
pub fn case<'a>(name: impl Into<String>, f: impl FnOnce() + 'a) -> (String, Box<dyn FnOnce() + 'a>) {
    (name.into(), Box::new(f))
}

/// Asserts the peak memory bound alone (for runs that may succeed).
pub fn assert_bounded(m: &Measured, input_bytes: u64) {
    let bound = peak_bound_kib(input_bytes);
    assert!(
        m.peak_kib <= bound,
        "peak memory {} KiB above the bound {bound} KiB (64 MiB + 4 x {input_bytes} input bytes): {}",
        m.peak_kib,
        stderr(&m.out)
    );
}

/// Asserts that no file under `dir` holds `secret` (a file from outside the input, which a
/// crafted value named).
pub fn assert_not_copied(dir: &Path, secret: &[u8]) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            assert_not_copied(&p, secret);
        } else if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret),
                "{} holds the outside file's bytes",
                p.display()
            );
        }
    }
}

/// `prepare`'s arguments: `input` into `output_prefix`, with EOD, and the `tokenizer` flags.
pub fn prepare_args(input: &Path, output_prefix: &Path, tokenizer: &[&str]) -> Vec<String> {
    let mut args =
        vec!["prepare", "--input", input.to_str().unwrap(), "--output-prefix", output_prefix.to_str().unwrap()];
    args.push("--append-eod");
    args.extend_from_slice(tokenizer);
    args.into_iter().map(String::from).collect()
}

/// `check data`'s arguments for the dataset `prefix` and a one-layer model of width 16 on
/// sequences of 8, then `extra` (the batch, iterations and whatever else).
pub fn check_data_args(prefix: &Path, extra: &[&str]) -> Vec<String> {
    let model = "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1";
    let mut args = vec!["check", "data", "--data-path", prefix.to_str().unwrap()];
    args.extend(model.split_whitespace());
    args.extend_from_slice(extra);
    args.into_iter().map(String::from).collect()
}

/// The shape of the tiny fixtures: one layer of width 16 with 2 heads.
pub const TINY_SHAPE: &[&str] = &["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2"];

/// A model of `shape` with `extra` flags trained one iteration on mock data, on one thread.
pub fn train_mock(save: &Path, shape: &[&str], extra: &[&str]) {
    let save = save.to_str().unwrap();
    let mut args = vec!["train", "--mock-data"];
    args.extend_from_slice(shape);
    args.extend_from_slice(&[
        "--seq-length",
        "16",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "2",
        "--train-iters",
        "1",
        "--eval-iters",
        "0",
        "--cpu-threads",
        "1",
        "--save",
        save,
    ]);
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "training the fixture failed: {}", stderr(&o));
}

/// A one-layer GPT-2 checkpoint (byte tokenizer) in `dir/name`.
pub fn gpt2_checkpoint(dir: &Path, name: &str) -> PathBuf {
    let ck = dir.join(name);
    train_mock(&ck, TINY_SHAPE, &[]);
    ck
}

/// A one-layer Llama checkpoint (RMSNorm, SwiGLU, rotary positions, untied) in `dir/name`.
pub fn llama_checkpoint(dir: &Path, name: &str) -> PathBuf {
    let ck = dir.join(name);
    let llama = [
        "--swiglu",
        "--normalization",
        "RMSNorm",
        "--position-embedding-type",
        "rope",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--ffn-hidden-size",
        "32",
    ];
    train_mock(&ck, TINY_SHAPE, &llama);
    ck
}

/// `checkpoint` exported as a Hugging Face directory `dir/name`.
pub fn hf_dir(checkpoint: &Path, dir: &Path, name: &str) -> PathBuf {
    let hf = dir.join(name);
    let o = run(&["convert", "--load", checkpoint.to_str().unwrap(), "--save-hf", hf.to_str().unwrap()]);
    assert!(o.status.success(), "exporting the fixture failed: {}", stderr(&o));
    hf
}

/// GPT-2-style vocab.json and merges.txt in `dir`: the 256 bytes of the byte alphabet, `<|endoftext|>`
/// (id 256) and the merges "t h", "th e"; `extra` more (token, id) entries in the vocabulary.
pub fn gpt2_files(dir: &Path, extra: &[(&str, u64)]) -> (PathBuf, PathBuf) {
    use trident::data::bpe::byte_char;
    let mut entries: Vec<String> =
        (0..=255u8).map(|b| format!("{}: {b}", json_string(&byte_char(b).to_string()))).collect();
    entries.push("\"<|endoftext|>\": 256".into());
    entries.push("\"th\": 257".into());
    entries.push("\"the\": 258".into());
    entries.extend(extra.iter().map(|(t, id)| format!("{}: {id}", json_string(t))));
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    std::fs::write(&vocab, format!("{{{}}}", entries.join(", "))).unwrap();
    std::fs::write(&merges, "#version: 0.2\nt h\nth e\n").unwrap();
    (vocab, merges)
}

/// `s` as a JSON string.
pub fn json_string(s: &str) -> String {
    trident::data::json::quote(s)
}

/// A Hugging Face tokenizer.json (`dir/tokenizer.json`) built from `gpt2_files`, its added
/// tokens replaced by `added` (a JSON array's items) when given.
pub fn tokenizer_json(dir: &Path, added: Option<&str>) -> PathBuf {
    let (vocab, merges) = gpt2_files(dir, &[]);
    let mut text = trident::data::tokenizer_files::gpt2_tokenizer_json(&vocab, &merges).unwrap();
    if let Some(added) = added {
        let start = text.find("\"added_tokens\": [").unwrap() + "\"added_tokens\": [".len();
        let end = start + text[start..].find("}],").unwrap() + 1;
        text.replace_range(start..end, added);
    }
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, text).unwrap();
    path
}

/// The path of the latest shard `mp_rank_00` of `checkpoint`.
pub fn shard_file(checkpoint: &Path) -> PathBuf {
    trident::checkpoint::load_latest(checkpoint, "mp_rank_00").unwrap().1
}

/// The latest shard `mp_rank_00` of `checkpoint`.
pub fn read_shard(checkpoint: &Path) -> Shard {
    trident::checkpoint::load_latest(checkpoint, "mp_rank_00").unwrap().2
}

/// A shard's bytes in version 1's layout (`key=value` lines as given, then the tensors and the
/// checksum), which every trident reads.
pub fn shard_v1_bytes(header: &str, tensors: &[SavedTensor]) -> Vec<u8> {
    let mut out = b"TRIDENTCKPT\0".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    for t in tensors {
        out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in &t.shape {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        for x in &t.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    let sum = trident::rng::fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// `shard`'s metadata as version 1's lines, with `changes` applied: (key, Some(value)) sets a
/// key, (key, None) removes it.
pub fn header_with(shard: &Shard, changes: &[(&str, Option<&str>)]) -> String {
    let mut meta = shard.meta.clone();
    for (k, v) in changes {
        match v {
            Some(v) => meta.insert(k.to_string(), v.to_string()),
            None => meta.remove(*k),
        };
    }
    meta.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// Overwrites the latest shard `mp_rank_00` of `checkpoint` with `bytes`.
pub fn write_shard_file(checkpoint: &Path, bytes: &[u8]) {
    std::fs::write(shard_file(checkpoint), bytes).unwrap();
}

/// A copy of the directory tree `from` at `to` (regular files and directories).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A small deterministic generator for the fuzzing (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One entry of a crafted safetensors header: name, dtype, shape, and the [begin, end) of its data.
pub type RawEntry = (String, &'static str, Vec<u64>, u64, u64);

/// Writes a safetensors file of `entries` and `data` exactly as given (nothing checked).
pub fn write_raw_safetensors(path: &Path, entries: &[RawEntry], data: &[u8]) {
    let items: Vec<String> = entries
        .iter()
        .map(|(name, dtype, shape, b, e)| {
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!(
                "{}: {{\"dtype\": \"{dtype}\", \"shape\": [{}], \"data_offsets\": [{b}, {e}]}}",
                json_string(name),
                dims.join(", ")
            )
        })
        .collect();
    let mut header = format!("{{{}}}", items.join(", ")).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// The tensors of a safetensors file `path` as F32 entries laid end to end after `gap` bytes (0
/// for the file's own layout), with their data: for rewriting a valid file with one thing changed.
pub fn f32_entries(path: &Path, gap: u64) -> (Vec<RawEntry>, Vec<u8>) {
    let tensors = trident::checkpoint::hf_files::read_safetensors(path).unwrap();
    let (mut entries, mut data) = (Vec::new(), vec![0u8; gap as usize]);
    for (name, (shape, values)) in tensors {
        let begin = data.len() as u64;
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        entries.push((name, "F32", shape.iter().map(|&d| d as u64).collect(), begin, data.len() as u64));
    }
    (entries, data)
}
