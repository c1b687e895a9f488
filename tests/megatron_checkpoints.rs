//! Megatron-LM checkpoints both ways (`checkpoint::megatron`). Always: a checkpoint trident
//! writes with `convert --save-megatron` reads back bit for bit, `train --load` and `generate
//! --load` take it as it is, a legacy `model_optim_rng.pt` of the same weights reads the same, and
//! 60 fuzzed files of both formats give clean errors (or, where a flip lands in a weight's bytes,
//! a clean load), never a panic or a hang. Where megatron-core is installed (the Python that
//! `TORCH_PYTHON` names, else the torch venv `.ci/run` makes; the script is
//! tests/megatron_checkpoints.py): a GPT and a Llama built by megatron-core's GPTModel at
//! tensor-parallel 2 x pipeline 2, one Adam step taken by its optimizer, and saved by its
//! dist_checkpointing (and as legacy per-rank files) load here with megatron-core's logits (1e-5
//! of each position's largest) and, from torch_dist, its AdamW moments and step (the same state,
//! bit for bit, from its distributed optimizer's buffers in both formats), keep training
//! (at tensor-parallel 2 too), give its logits under the position ids its GPT dataset makes for
//! `--reset-position-ids` (which move GPT's learned positions only) and its attention mask
//! (`--reset-attention-mask`), and come back through `convert --save-megatron` into megatron-core
//! with trident's logits.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use trident::checkpoint::megatron::torch_file::{save, Value};
use trident::checkpoint::read_any as read_full;

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what}: {}\n{}", stderr(&o), stdout(&o));
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The model flags of tests/megatron_checkpoints.py's cases, as `train` takes them.
fn model_flags(case: &str) -> Vec<&'static str> {
    let mut f = vec![
        "--num-layers",
        "4",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--ffn-hidden-size",
        "128",
        "--max-position-embeddings",
        "64",
        "--seq-length",
        "32",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "300",
        "--hidden-dropout",
        "0",
        "--attention-dropout",
        "0",
    ];
    if case == "gpt" {
        // The checkpoint's GELU is Megatron's unfused, exact one.
        f.push("--no-bias-gelu-fusion");
    }
    if case == "llama" {
        f.extend([
            "--normalization",
            "RMSNorm",
            "--swiglu",
            "--position-embedding-type",
            "rope",
            "--rotary-base",
            "500000",
            "--group-query-attention",
            "--num-query-groups",
            "2",
            "--untie-embeddings-and-output-weights",
            "--disable-bias-linear",
        ]);
    }
    f
}

/// Trains `case`'s model for `iters` iterations from `load` (if any), saving to `save`.
fn train(data: &str, case: &str, load: Option<&Path>, save: &Path, iters: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "--data-path",
        data,
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "4",
        "--train-iters",
        iters,
        "--lr",
        "1e-3",
        "--eval-iters",
        "0",
        "--log-interval",
        "1",
        "--save",
        s(save),
    ];
    args.extend(model_flags(case));
    if let Some(l) = load {
        args.extend(["--load", s(l)]);
    }
    args.extend(extra);
    run(&args)
}

/// Every logit within 1e-5 of its position's largest |logit|.
fn assert_logits_close(what: &str, ours: &[f32], theirs: &[f32], vocab: usize) {
    assert_eq!(ours.len(), theirs.len(), "{what}: logit counts");
    for (t, (a, b)) in ours.chunks(vocab).zip(theirs.chunks(vocab)).enumerate() {
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            let rel = (*x as f64 - *y as f64).abs() / scale;
            assert!(rel <= 1e-5, "{what}: position {t}, token {j}: trident {x} vs megatron-core {y} (scale {scale})");
        }
    }
}

/// A prompt with two end-of-document tokens (299, the last id) inside it.
const TOKENS: [u32; 8] = [1, 5, 299, 9, 200, 33, 299, 7];
const EOD: u32 = 299;

fn joined() -> String {
    TOKENS.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn python(py: &str, args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/megatron_checkpoints.py");
    let o = Command::new(py).arg(script).args(args).env("TRIDENT_MCORE_PORT", port()).output().expect("python runs");
    assert!(o.status.success(), "megatron_checkpoints.py {args:?}: {}", stderr(&o));
}

/// A port for gloo's rendezvous, apart for each test process.
fn port() -> String {
    (20000 + std::process::id() % 20000).to_string()
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn megatron_logits(py: &str, ckpt: &Path, out: &Path) -> Vec<f32> {
    python(py, &["logits", s(ckpt), &joined(), s(out)]);
    read_f32(out)
}

/// megatron-core's logits of TOKENS with its own position ids, then with those its GPT dataset
/// gives under `--reset-position-ids` (`_get_ltor_masks_and_position_ids`), then with those and
/// its mask under `--reset-attention-mask` too.
fn megatron_logits_and_reset(py: &str, ckpt: &Path, out: &Path) -> [Vec<f32>; 3] {
    python(py, &["logits", s(ckpt), &joined(), s(out), &EOD.to_string()]);
    let with = |ext: &str| read_f32(&PathBuf::from(format!("{}.{ext}", s(out))));
    [read_f32(out), with("reset"), with("docs")]
}

#[test]
fn megatron_core_checkpoints_load_train_and_go_back() {
    let Some(py) =
        python_with("torch, megatron.core, psutil", "trident is not compared with megatron-core's checkpoints")
    else {
        return;
    };
    let dir = scratch("megatron-core-checkpoints");
    let data = prepared_corpus(&dir);
    for case in ["gpt", "llama"] {
        let made = dir.join(case);
        python(&py, &["make", s(&made), case]);
        let [theirs, reset, docs] =
            megatron_logits_and_reset(&py, &made.join("dist"), &dir.join(format!("{case}.logits")));
        // megatron-core's rotary angles do not read the position ids: only GPT's positions move.
        assert_eq!(theirs != reset, case == "gpt", "{case}: the logits under reset positions");
        for format in ["dist", "legacy"] {
            let full = read_full(&made.join(format)).unwrap();
            assert_eq!(full.iteration, 7, "{case} {format}");
            assert_eq!(full.meta["consumed_train_samples"], "56");
            let ours = checkpoint_logits(&full, &TOKENS);
            assert_logits_close(&format!("{case} {format}"), &ours, &theirs, full.model.padded_vocab_size);
            if format == "dist" {
                let vocab = full.model.padded_vocab_size;
                let ours = checkpoint_logits_reset(&full, &TOKENS, (Some(EOD), None));
                assert_logits_close(&format!("{case} --reset-position-ids"), &ours, &reset, vocab);
                let ours = checkpoint_logits_reset(&full, &TOKENS, (Some(EOD), Some(EOD)));
                assert_logits_close(&format!("{case} --reset-attention-mask"), &ours, &docs, vocab);
                assert!(docs != reset, "{case}: the prompt's documents must change what attention sees");
            }
            assert_moments_of_one_step(&format!("{case} {format}"), &full);
        }
        // The same step taken by megatron-core's distributed optimizer (Megatron-LM's
        // --use-distributed-optimizer) and saved in its buffers, torch_dist's buckets or the legacy
        // format's distrib_optim.pt, or per parameter (--dist-ckpt-optim-fully-reshardable),
        // reads as the same state, bit for bit; so does the legacy files' non-distributed optimizer.
        let plain = read_full(&made.join("dist")).unwrap();
        for format in ["distopt", "distopt-full", "legacy-distopt", "legacy"] {
            let distributed = read_full(&made.join(format)).unwrap();
            assert_eq!(distributed.meta.get("adam_step"), plain.meta.get("adam_step"), "{case} {format}: the step");
            assert!(plain.tensors.keys().eq(distributed.tensors.keys()), "{case} {format}: the state's tensors");
            for (name, values) in &plain.tensors {
                let same = values.iter().zip(&distributed.tensors[name]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{case} {format}: {name} from the distributed optimizer's buffers");
            }
        }
        if case == "gpt" {
            let targets = [
                ("distopt", "iter_0000007/.metadata"),
                ("distopt", "iter_0000007/__0_0.distcp"),
                ("legacy-distopt", "iter_0000007/mp_rank_00_000/distrib_optim.pt"),
                ("distopt", "iter_0000007/__2_1.distcp"),
                ("legacy-distopt", "iter_0000007/mp_rank_01_001/distrib_optim.pt"),
                ("legacy-distopt", "iter_0000007/mp_rank_00_000/model_optim_rng.pt"),
            ];
            let targets: Vec<_> = targets.iter().map(|(d, f)| (made.join(d), PathBuf::from(f))).collect();
            let (refused, loaded) = fuzz(&dir, &targets, 24, 51);
            assert!(refused >= 6, "{refused} of 24 refused, {loaded} loaded: the fuzzing missed the structure");
        }
        // It keeps training: one rank from the distributed optimizer's files, then two
        // tensor-parallel ranks from the legacy ones.
        let saved = dir.join(format!("{case}-trained"));
        let o = ok(train(&data, case, Some(&made.join("distopt")), &saved, "9", &[]), "training on");
        let line = stdout(&o).lines().find(|l| l.contains("loaded checkpoint")).unwrap_or_default().to_string();
        assert!(!line.contains("fresh AdamW"), "the moments were mapped: {line}");
        assert_eq!(loss_count(&o), 2, "iterations 8 and 9");
        let tp2 = dir.join(format!("{case}-tp2"));
        let flags: Vec<String> = ["train", "--data-path", &data, "--micro-batch-size", "2", "--global-batch-size", "4"]
            .iter()
            .map(|x| x.to_string())
            .chain(["--train-iters", "9", "--lr", "1e-3", "--eval-iters", "0", "--load"].map(String::from))
            .chain([s(&made.join("legacy")).to_string(), "--save".into(), s(&tp2).to_string()])
            .chain(["--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"].map(String::from))
            .chain(model_flags(case).into_iter().map(String::from))
            .collect();
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        let o = mpirun(2, &refs);
        assert!(o.status.success(), "tensor-parallel 2 from the legacy files: {}", stderr(&o));
        let line = stdout(&o).lines().find(|l| l.contains("loaded checkpoint")).unwrap_or_default().to_string();
        assert!(!line.contains("fresh AdamW"), "the legacy files' moments were mapped: {line}");
        // And back: trident's trained weights as a torch_dist checkpoint megatron-core loads.
        let back = dir.join(format!("{case}-back"));
        ok(run(&["convert", "--load", s(&saved), "--save-megatron", s(&back)]), "convert --save-megatron");
        let trained = read_full(&saved).unwrap();
        let theirs = megatron_logits(&py, &back, &dir.join(format!("{case}-back.logits")));
        assert_logits_close(&format!("{case} back"), &checkpoint_logits(&trained, &TOKENS), &theirs, 384);
    }
}

/// megatron-core's Adam took one step from zero moments: exp_avg is 0.1 g and exp_avg_sq
/// 0.001 g^2, so each element's v is 0.1 m^2 (f32 rounding aside), and the step count is 1.
fn assert_moments_of_one_step(case: &str, full: &trident::checkpoint::convert::FullCheckpoint) {
    assert_eq!(full.meta.get("adam_step").map(String::as_str), Some("1"), "{case}");
    let mut nonzero = 0;
    for (name, m) in full.tensors.iter().filter(|(k, _)| k.starts_with("adam_m/")) {
        let v = &full.tensors[&name.replace("adam_m/", "adam_v/")];
        for (a, b) in m.iter().zip(v) {
            let want = 0.1 * (*a as f64) * (*a as f64);
            assert!((*b as f64 - want).abs() <= 1e-5 * want + 1e-30, "{case} {name}: m {a}, v {b}");
            nonzero += (*a != 0.0) as usize;
        }
    }
    let params = full.tensors.keys().filter(|k| k.starts_with("param/")).count();
    assert_eq!(full.tensors.keys().filter(|k| k.starts_with("adam_m/")).count(), params, "{case}: every moment");
    assert!(nonzero > 1000, "{case}: {nonzero} nonzero moments");
}

fn loss_count(o: &Output) -> usize {
    stdout(o).lines().filter(|l| l.contains("lm loss:")).count()
}

/// A trident checkpoint of the Llama case trained 2 iterations, written as Megatron's torch_dist
/// and as a legacy one-rank `model_optim_rng.pt` (the same weights, bf16 and f32 tensors mixed).
fn megatron_pair(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let data = prepared_corpus(dir);
    let trained = dir.join("trained");
    ok(train(&data, "llama", None, &trained, "2", &[]), "training");
    let dist = dir.join("dist");
    ok(run(&["convert", "--load", s(&trained), "--save-megatron", s(&dist)]), "convert --save-megatron");
    let full = read_full(&trained).unwrap();
    let legacy = dir.join("legacy");
    let rank = legacy.join("iter_0000002/mp_rank_00");
    std::fs::create_dir_all(&rank).unwrap();
    let model: Vec<(String, Value)> = full
        .model
        .parameters(&trident::model::ModelParallel::single())
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let data = full.tensors[&format!("param/{}", p.name)].clone();
            (p.name, Value::Tensor { shape: p.full_shape, data, bf16: i % 2 == 1 })
        })
        .collect();
    let state = Value::Dict(vec![
        ("args".into(), trident::checkpoint::megatron::dist::args_namespace(&full)),
        ("iteration".into(), Value::Int(2)),
        ("model".into(), Value::Dict(model)),
    ]);
    std::fs::write(rank.join("model_optim_rng.pt"), save(&state, "model_optim_rng")).unwrap();
    std::fs::write(legacy.join("latest_checkpointed_iteration.txt"), "2\n").unwrap();
    (trained, dist, legacy)
}

#[test]
fn megatron_files_written_here_read_back_and_run() {
    let dir = scratch("megatron-round-trip");
    let (trained, dist, legacy) = megatron_pair(&dir);
    let (a, b) = (read_full(&trained).unwrap(), read_full(&dist).unwrap());
    assert_eq!((a.model.clone(), b.iteration), (b.model.clone(), 2));
    for (name, values) in a.tensors.iter().filter(|(k, _)| k.starts_with("param/")) {
        assert!(values.iter().zip(&b.tensors[name]).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} changed");
    }
    // The legacy file holds every other tensor in bf16: those read back rounded, the rest exact.
    let c = read_full(&legacy).unwrap();
    for (name, values) in a.tensors.iter().filter(|(k, _)| k.starts_with("param/")) {
        let close = values.iter().zip(&c.tensors[name]).all(|(x, y)| (x - y).abs() <= x.abs() / 128.0);
        assert!(close, "{name} is not its bf16 rounding");
    }
    let data = prepared_corpus(&dir);
    let o = ok(train(&data, "llama", Some(&dist), &dir.join("resumed"), "3", &[]), "training from torch_dist");
    assert_eq!(loss_count(&o), 1);
    // --use-checkpoint-args takes the model from Megatron's saved arguments.
    let resumed = dir.join("from-args");
    let o = run(&[
        "train",
        "--data-path",
        &data,
        "--load",
        s(&dist),
        "--use-checkpoint-args",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "300",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "4",
        "--train-iters",
        "3",
        "--eval-iters",
        "0",
        "--save",
        s(&resumed),
    ]);
    assert_eq!(loss_count(&ok(o, "--use-checkpoint-args")), 1);
    assert_eq!(read_full(&resumed).unwrap().model, a.model);
    let generate = ["generate", "--load", s(&dist), "--tokenizer-type", "NullTokenizer", "--vocab-size", "300"];
    let o = ok(run(&[&generate[..], &["--max-new-tokens", "4", "--temperature", "0"]].concat()), "generate");
    assert!(!stdout(&o).is_empty());
    // A model other than the flags' is refused naming what differs.
    let o = train(&data, "gpt", Some(&dist), &dir.join("other"), "3", &[]);
    assert_clean_error(&o, &["does not fit this model", "normalization"]);
}

/// A 32-bit linear congruential generator: the fuzzer's choices, the same every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Runs `convert --load ck` with a time limit: a hang fails the test as a panic would.
fn convert_within(ck: &Path, out: &Path) -> Output {
    let bin = env!("CARGO_BIN_EXE_trident");
    let mut child = Command::new(bin)
        .args(["convert", "--load", s(ck), "--save", s(out)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "convert --load {} hangs", ck.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Saved arguments that describe a model far larger than the files (16 million layers) are refused
/// before anything that size, or a list of its parameters, is allocated.
#[test]
fn saved_arguments_cannot_size_the_model_beyond_the_files() {
    let dir = scratch("megatron-crafted-args");
    let (trained, dist, _) = megatron_pair(&dir);
    let full = read_full(&trained).unwrap();
    let Value::Namespace(mut fields) = trident::checkpoint::megatron::dist::args_namespace(&full) else {
        unreachable!()
    };
    for (k, v) in fields.iter_mut() {
        if k == "num_layers" {
            *v = Value::Int(1 << 24);
        }
    }
    let common = Value::Dict(vec![("args".into(), Value::Namespace(fields)), ("iteration".into(), Value::Int(2))]);
    std::fs::write(dist.join("iter_0000002/common.pt"), save(&common, "common")).unwrap();
    let o = convert_within(&dist, &dir.join("out"));
    assert_clean_error(&o, &["the files hold"]);
}

#[test]
fn fuzzed_megatron_files_are_clean_errors() {
    let dir = scratch("megatron-fuzz");
    let (_, dist, legacy) = megatron_pair(&dir);
    let targets: Vec<(PathBuf, PathBuf)> = [".metadata", "common.pt", "__0_0.distcp"]
        .iter()
        .map(|f| (dist.clone(), PathBuf::from("iter_0000002").join(f)))
        .chain(std::iter::once((legacy.clone(), PathBuf::from("iter_0000002/mp_rank_00/model_optim_rng.pt"))))
        .collect();
    let (refused, loaded) = fuzz(&dir, &targets, 60, 50);
    assert!(refused >= 30, "{refused} of 60 refused, {loaded} loaded: the fuzzing missed the structure");
}

/// `trials` copies of the checkpoints in `targets` (a root and one file in it, in turn), that
/// file truncated, bit-flipped or overwritten with 0xff, each read by `convert`: a clean
/// one-line error or a load, never a panic or a hang. Returns (refused, loaded).
fn fuzz(dir: &Path, targets: &[(PathBuf, PathBuf)], trials: usize, seed: u64) -> (usize, usize) {
    let mut rng = Lcg(seed);
    let (mut refused, mut loaded) = (0, 0);
    for trial in 0..trials {
        let (root, file) = &targets[trial % targets.len()];
        let copy = dir.join(format!("fuzz{seed}-{trial}"));
        let _ = std::fs::remove_dir_all(&copy);
        let o = Command::new("cp").args(["-r", s(root), s(&copy)]).output().unwrap();
        assert!(o.status.success());
        let path = copy.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        match trial % 3 {
            0 => bytes.truncate(rng.next(bytes.len())),
            1 => {
                for _ in 0..1 + rng.next(8) {
                    let at = rng.next(bytes.len());
                    bytes[at] ^= 1 << rng.next(8);
                }
            }
            _ => {
                // A run of bytes set to 0xff: lengths, counts and offsets at their largest.
                let at = rng.next(bytes.len());
                let end = (at + 1 + rng.next(8)).min(bytes.len());
                bytes[at..end].iter_mut().for_each(|b| *b = 0xff);
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let out = dir.join(format!("out{seed}-{trial}"));
        let o = convert_within(&copy, &out);
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "trial {trial} ({}): {err}", path.display());
        if o.status.success() {
            loaded += 1;
        } else {
            assert!(err.starts_with("trident: error:") && err.lines().count() == 1, "trial {trial}: {err}");
            refused += 1;
        }
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::fs::remove_dir_all(&out);
    }
    (refused, loaded)
}
