//! Helpers shared by the integration tests that drive the `trident` binary: scratch directories,
//! running a command, and writing `.bin/.idx` pairs byte by byte from Megatron's layout.

#![allow(dead_code)]

pub mod emu;
pub mod emu_cases;
pub mod gpu_device;
pub mod numeric;

use std::io::Write;
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
    // Ranks waiting in MPI give up the core: the test threads run several jobs at once on few
    // cores, and Open MPI busy-polls unless it sees the oversubscription itself (parallel.rs took
    // 15-20% longer so, on 2 cores).
    if std::env::var_os("OMPI_MCA_mpi_yield_when_idle").is_none() {
        c.env("OMPI_MCA_mpi_yield_when_idle", "1");
    }
    c
}

/// NVRTC's and NCCL's files in `make gpu-test-libs`'s pip wheels: (the variable that names one,
/// its path inside an install).
pub const NVRTC_LIBRARY: (&str, &str) = ("TRIDENT_NVRTC", "nvidia/cu13/lib/libnvrtc.so.13");
pub const NCCL_LIBRARY: (&str, &str) = ("TRIDENT_NCCL", "nvidia/nccl/lib/libnccl.so.2");

/// A GPU library for the tests (`NVRTC_LIBRARY` or `NCCL_LIBRARY`): the file its variable names,
/// else the newest install of `make gpu-test-libs` under ~/.cache/trident-gpu-libs, if any.
pub fn gpu_test_library((var, relative): (&str, &str)) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var) {
        if Path::new(&p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    let root = PathBuf::from(std::env::var("HOME").ok()?).join(".cache/trident-gpu-libs");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join(relative)))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

/// `gpu_test_library` for a test that needs the library: None, after the test says it skips
/// (`skip`), when it is absent.
pub fn required_gpu_test_library(library: (&str, &str)) -> Option<PathBuf> {
    gpu_test_library(library).or_else(|| missing_gpu_test_library(library).skip())
}

/// What a test lacks without `library`, and how to get it.
pub fn missing_gpu_test_library((var, relative): (&str, &str)) -> Missing {
    Missing::new(
        format!("{var} names no file and ~/.cache/trident-gpu-libs holds no {relative}"),
        "`make gpu-test-libs` (or `make test`) pip-installs the NVRTC and NCCL wheels",
    )
}

/// What a test lacks without hipRTC (`e`: why it did not load).
pub fn missing_hiprtc(e: &dyn std::fmt::Display) -> Missing {
    Missing::new(
        format!("no hipRTC on this machine ({e})"),
        "`make test` installs Debian's (libamdhip64-5 libhiprtc-builtins5) with apt when run as root",
    )
}

/// An optional dependency a test did not find: what is missing, and how to get it.
#[derive(Clone, Debug)]
pub struct Missing {
    pub what: String,
    pub how: String,
}

impl Missing {
    pub fn new(what: impl Into<String>, how: impl Into<String>) -> Missing {
        Missing { what: what.into(), how: how.into() }
    }

    /// The running test skips for want of this (`skip`); None, for `let ... else { return }`.
    pub fn skip<T>(&self) -> Option<T> {
        skip(&self.what, &self.how);
        None
    }
}

/// `built` (what a test process builds once: an emulated runtime, a device), or None after the
/// running test says it skips for want of what `built` lacked. Every test that needs it says so,
/// not only the first.
pub fn present<T>(built: &Result<T, Missing>) -> Option<&T> {
    match built {
        Ok(t) => Some(t),
        Err(m) => m.skip(),
    }
}

/// The running test skips work for want of `missing`, which `how` gets: said on stderr, recorded
/// for `make test`'s summary (a line in the file `TRIDENT_SKIP_LOG` names: test binary, test,
/// what is missing, how to get it), and under `TRIDENT_CI=1` a failure, since CI installs every
/// optional dependency.
pub fn skip(missing: &str, how: &str) {
    record_skip("skipped", missing, how);
    if std::env::var("TRIDENT_CI").as_deref() == Ok("1") {
        panic!("TRIDENT_CI=1 and this test would skip: {missing} ({how})");
    }
}

/// The running test cannot apply on this machine (a CPU without the instruction set it caps
/// to): said and recorded as `skip` is, but never a failure, since no install would change it.
pub fn not_applicable(why: &str) {
    record_skip("not applicable", why, "another machine");
}

fn record_skip(kind: &str, missing: &str, how: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let binary = env!("CARGO_CRATE_NAME");
    // Written to the process stderr directly: the test harness would capture eprintln!.
    let _ = writeln!(std::io::stderr(), "!!!!! {kind}: {binary}::{test}: {missing} ({how}) !!!!!");
    if let Ok(log) = std::env::var("TRIDENT_SKIP_LOG") {
        let line = format!("{kind}\t{binary}::{test}\t{missing}\t{how}\n");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        // One write per line: appends from parallel tests do not interleave.
        let _ = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
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

/// `n` documents from a fixed generator seeded by `seed`: each of `2 + next % spread` ordinary
/// tokens (32..122) followed by the end-of-document id `eod`.
pub fn generated_documents(n: usize, (seed, spread): (u64, u16), eod: u16) -> Vec<Vec<u16>> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u16
    };
    (0..n)
        .map(|_| {
            let len = 2 + next() % spread;
            let mut d: Vec<u16> = (0..len).map(|_| 32 + next() % 90).collect();
            d.push(eod);
            d
        })
        .collect()
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

/// `train` arguments for a 2-layer model of width 64 on one CPU thread, slow enough (about 7 ms
/// an iteration at a global batch of 16) that a signal or a kill lands mid-run: no evaluation, a
/// log line per iteration.
pub fn one_thread_train_args(data: &str, global_batch_size: usize, train_iters: usize) -> Vec<String> {
    let model = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 --micro-batch-size 4";
    let run = format!(
        "--global-batch-size {global_batch_size} --lr 1e-3 --lr-warmup-iters 4 --train-iters {train_iters} \
         --log-interval 1 --eval-iters 0 --cpu-threads 1"
    );
    let words = model.split_whitespace().chain(run.split_whitespace()).map(String::from);
    ["train", "--data-path", data].into_iter().map(String::from).chain(words).collect()
}

/// Pads the byte tokenizer's 257 ids to 264 rows (8 x 33) at every tensor-parallel size up to 8:
/// Megatron pads the vocabulary to a multiple of `--make-vocab-size-divisible-by` x the TP size
/// (128 x TP by default: 384 rows on one rank, 512 on two), so a test that compares a layout with
/// one rank gives both this, and both hold the same model.
pub const SAME_PADDING: [&str; 2] = ["--make-vocab-size-divisible-by", "33"];

/// Flags for a small, fast model used by the tests (2 micro-batches per iteration), without
/// dropout, so that its losses compare with fixed values, PyTorch's and other devices' runs
/// (`tests/dropout.rs` holds dropout's own).
pub const SMALL: &[&str] = &[
    "--hidden-dropout",
    "0",
    "--attention-dropout",
    "0",
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

/// Asserts each of `got`'s losses within 1e-5 (relative) of the one-rank run's `base` (`what`
/// names the run).
pub fn assert_losses_match(what: &str, got: &[f64], base: &[f64]) {
    assert_eq!(got.len(), base.len(), "{what}");
    for (it, (a, b)) in got.iter().zip(base).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{what}: iteration {}: loss {a} vs single-rank {b}", it + 1);
    }
}

/// Asserts every element of every weight in the checkpoint `ckpt` within 1e-5 of the one-rank
/// run's `base` (`full_weights`; weights are O(0.01..1)); returns the largest difference.
pub fn assert_weights_match(what: &str, ckpt: &Path, base: &[(String, Vec<f32>)]) -> f32 {
    let mut worst = 0f32;
    for ((name, w), (_, b)) in full_weights(ckpt).iter().zip(base) {
        let d = w.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(d <= 1e-5, "{what}: {name} differs from the single-rank run by {d}");
        worst = worst.max(d);
    }
    worst
}

/// Every parameter of the latest checkpoint in `dir`, reassembled from its tensor- and
/// pipeline-parallel shards into full tensors (in the canonical parameter order).
pub fn full_weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let (_, path, first) = trident::checkpoint::load_latest(dir, &trident::checkpoint::shard_name(0, 0, 1))
        .or_else(|_| trident::checkpoint::load_latest(dir, &trident::checkpoint::shard_name(0, 0, 2)))
        .unwrap();
    let meta = |key: &str| first.meta_value::<usize>(&path, key).unwrap();
    let (tp, pp, chunks) =
        (meta("tensor_model_parallel_size"), meta("pipeline_model_parallel_size"), meta("virtual_pipeline_chunks"));
    let sp: bool = first.meta_value(&path, "sequence_parallel").unwrap();
    let cfg = trident::checkpoint::shape::model_from_shard(&first, &path).unwrap();
    let mut full: Vec<(String, Vec<f32>)> = cfg
        .parameters(&trident::model::ModelParallel::single())
        .iter()
        .map(|p| (p.name.clone(), vec![f32::NAN; p.numel()]))
        .collect();
    for tp_rank in 0..tp {
        for pp_rank in 0..pp {
            let (_, path, shard) =
                trident::checkpoint::load_latest(dir, &trident::checkpoint::shard_name(tp_rank, pp_rank, pp)).unwrap();
            let mut mp = trident::model::ModelParallel::one_d(tp, tp_rank, sp);
            // 2-D / 2.5-D shards are blocks of the SUMMA grid (depth copies repeat layer 0's).
            let q: usize = first.meta_value(&path, "summa_q").unwrap_or(0);
            if q > 0 {
                let depth: usize = first.meta_value(&path, "tesseract_depth").unwrap();
                mp.summa = Some(trident::parallel::grid::SummaCoord::of(tp_rank, q, depth));
            }
            let v = first.meta.get("virtual_pipeline_placement").is_some_and(|p| p == "v");
            let lay = trident::parallel::pipeline::Placement { stages: pp, chunks, v };
            for c in 0..chunks {
                let layers =
                    trident::parallel::pipeline::chunk_layers(cfg.num_layers, lay, pp_rank, c, None, None).unwrap();
                let (first, last) = lay.ends(pp_rank, c);
                let plan = trident::model::ChunkPlan { layers, first, last };
                for info in cfg.chunk_parameters(&mp, &plan).iter().filter(|i| !i.tied_copy) {
                    let t = shard.tensor(&path, &format!("param/chunk{c}/{}", info.name)).unwrap();
                    let values = &mut full.iter_mut().find(|(n, _)| *n == info.name).unwrap().1;
                    for (local, &v) in t.data.iter().enumerate() {
                        values[info.global_index(local)] = v;
                    }
                }
            }
        }
    }
    for (name, values) in &full {
        assert!(values.iter().all(|v| !v.is_nan()), "{name} was not covered by the shards");
    }
    full
}

/// The Python that imports `modules` (e.g. "torch, transformers"): `TORCH_PYTHON`, else the venv
/// `.ci/run` makes (~/.cache/trident-torch-2.15.0), else the GPU nodes' /opt/torch/.venv, else
/// python3, the first that exists. None, said loudly with `what_skips`, when it cannot.
///
/// The modules are found, not imported: megatron-core takes 5 s to import and torch 2 s, and the
/// scripts that use them import them anyway, so a broken install fails there, naming itself.
pub fn python_with(modules: &str, what_skips: &str) -> Option<String> {
    let home = std::env::var("HOME").unwrap_or_default();
    let venvs = [format!("{home}/.cache/trident-torch-2.15.0/bin/python"), "/opt/torch/.venv/bin/python".into()];
    let py = std::env::var("TORCH_PYTHON")
        .ok()
        .or_else(|| venvs.into_iter().find(|v| Path::new(v).is_file()))
        .unwrap_or_else(|| "python3".into());
    let ok = Command::new(&py).args(["-c", FIND_MODULES, modules]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            &format!("{py} does not have {modules}: {what_skips}"),
            "`.ci/run` installs them into ~/.cache/trident-torch-2.15.0; TORCH_PYTHON names another Python",
        );
    }
    ok.then_some(py)
}

/// Exits 0 when every module of the comma-separated list in argv[1] is installed.
const FIND_MODULES: &str = "import importlib.util, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
sys.exit(0 if all(found(m.strip()) for m in sys.argv[1].split(',')) else 1)";

/// Asserts that an mpirun job failed, with exactly one trident error line naming `needles`.
pub fn assert_one_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("trident: error:")).collect();
    assert_eq!(lines.len(), 1, "expected the error once, from rank 0: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "'{n}' not in {}", lines[0]);
    }
}

/// The logits ([len, padded vocabulary]) of a whole checkpoint's model for `tokens`, one rank on
/// the CPU: what tests compare with transformers' and megatron-core's.
pub fn checkpoint_logits(full: &trident::checkpoint::convert::FullCheckpoint, tokens: &[u32]) -> Vec<f32> {
    checkpoint_logits_reset(full, tokens, (None, None))
}

/// `checkpoint_logits` with the positions (`--reset-position-ids`) and the attention
/// (`--reset-attention-mask`) restarting after each end-of-document token given for each.
pub fn checkpoint_logits_reset(
    full: &trident::checkpoint::convert::FullCheckpoint,
    tokens: &[u32],
    (positions, attention): (Option<u32>, Option<u32>),
) -> Vec<f32> {
    use trident::device::prelude::*;
    let dev = trident::device::cpu::CpuDevice::new(1);
    let mut model = trident::model::Gpt::new(&dev, full.model.clone(), 0);
    model.set_reset_position_ids(positions);
    model.set_reset_attention_mask(attention);
    for (i, info) in model.params.info.iter().enumerate() {
        dev.upload(&mut model.params.values[i], &full.tensors[&format!("param/{}", info.name)]);
    }
    let logits = model.forward(&dev, trident::parallel::tensor::TensorParallel::single(), tokens, 1, tokens.len());
    let mut out = vec![0f32; dev.len(logits)];
    dev.download(logits, &mut out);
    out
}
