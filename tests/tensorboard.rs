//! `--tensorboard-dir`: rank 0 writes TensorBoard event files that TensorBoard's own reader
//! (`EventAccumulator`, tests/tensorboard_read.py; skipped loudly without the `tensorboard`
//! package, which `.ci/run` installs) reads back under Megatron's tags: every iteration's own
//! loss, learning rate, batch size, loss scale, grad norm and params norm (every `--tensorboard-log-interval`
//! iterations), agreeing with the `--log-json` lines (the window's mean loss, the logged
//! iteration's rate, norm and scale, to f32), their "vs samples" copies at the consumed samples;
//! each logged iteration's throughput and memory; the validation and test losses. A resume
//! starts a second file; an unusable directory or interval is one clear error.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Six iterations of a small model, logged every 2, validated every 3 (and a test pass at the
/// end), with TensorBoard scalars in `dir`/tb.
fn train(data: &str, dir: &Path, extra: &[&str]) -> std::process::Output {
    let flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 --micro-batch-size 4 \
                 --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 2 --train-iters 6 --log-interval 2 \
                 --eval-interval 3 --eval-iters 1 --cpu-threads 1";
    let tb = dir.join("tb");
    Command::new(BIN)
        .args(["train", "--data-path", data])
        .args(flags.split_whitespace())
        .arg("--tensorboard-dir")
        .arg(&tb)
        .args(extra)
        .output()
        .unwrap()
}

/// (tag, step, value) of every scalar TensorBoard reads in `dir`.
fn read(python: &str, dir: &Path) -> Vec<(String, u64, f64)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorboard_read.py");
    let o = Command::new(python).arg(script).arg(dir).output().unwrap();
    assert!(o.status.success(), "tensorboard_read.py: {}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| {
            let field = |k: &str| json_field(l, k).unwrap_or_else(|| panic!("{k} in {l}"));
            (
                field("tag").trim_matches('"').to_string(),
                field("step").parse().unwrap(),
                field("value").parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn tensorboard_reads_the_scalars_back() {
    let dir = scratch("tensorboard");
    let data = prepared_corpus(&dir);
    let log = dir.join("log.jsonl");
    let o = train(
        &data,
        &dir,
        &["--log-json", log.to_str().unwrap(), "--log-params-norm", "--log-world-size-to-tensorboard"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let files: Vec<_> = std::fs::read_dir(dir.join("tb")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].to_string_lossy().starts_with("events.out.tfevents."), "{files:?}");
    let Some(python) = python_with("tensorboard", "tests/tensorboard.rs does not read the event files back") else {
        return;
    };
    let scalars = read(&python, &dir.join("tb"));
    let value = |tag: &str, step: u64| {
        scalars.iter().find(|s| s.0 == tag && s.1 == step).map(|s| s.2).unwrap_or_else(|| panic!("{tag} at {step}"))
    };
    let lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(String::from).collect();
    // Iterations 2, 3 (validation), 4 and 6 are logged; every iteration has its own scalars.
    assert_eq!(lines.len(), 4, "{lines:?}");
    let steps = |tag: &str| scalars.iter().filter(|s| s.0 == tag).map(|s| s.1).collect::<Vec<_>>();
    for tag in ["lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm", "params-norm"] {
        assert_eq!(steps(tag), [1, 2, 3, 4, 5, 6], "{tag}");
    }
    assert_eq!(steps("iteration-time"), [2, 3, 4, 6]);
    for it in 1..=6 {
        assert_eq!(value("batch-size", it), 8.0);
        assert_eq!((value("world-size", it), value("world-size vs samples", 8 * it)), (1.0, 1.0));
        for tag in ["lm loss", "learning-rate", "grad-norm"] {
            assert_eq!(value(&format!("{tag} vs samples"), 8 * it), value(tag, it), "{tag} vs samples at {it}");
        }
    }
    let mut previous = 0;
    for line in &lines {
        let json = |k: &str| json_field(line, k).unwrap().parse::<f64>().unwrap();
        let it = json("iteration") as u64;
        let f32_close = |tag: &str, step: u64, want: f64| {
            let got = value(tag, step);
            assert_eq!(got as f32, want as f32, "{tag} at {step}: {got} vs {want}");
        };
        for (tag, key) in [
            ("learning-rate", "lr"),
            ("grad-norm", "grad_norm"),
            ("params-norm", "params_norm"),
            ("loss-scale", "loss_scale"),
            ("throughput", "tflops"),
            ("tokens-per-second", "tokens_per_s"),
            ("mfu", "mfu"),
        ] {
            f32_close(tag, it, json(key));
        }
        // The line's loss is its window's mean; TensorBoard has each iteration's, as f32.
        let window: Vec<f64> = (previous + 1..=it).map(|i| value("lm loss", i)).collect();
        let mean = window.iter().sum::<f64>() / window.len() as f64;
        assert!((mean / json("loss") - 1.0).abs() < 1e-6, "lm loss over {previous}..{it}: {window:?} vs {line}");
        assert!(value("iteration-time", it) > 0.0 && value("mem-max-rss-bytes", it) > 1e6);
        previous = it;
    }
    // Two iterations of a window differ: the scalars are the iterations' own, not the window's.
    assert_ne!(value("lm loss", 1), value("lm loss", 2));
    // Validation at 3 and 6, test at the end, with perplexities.
    for step in [3, 6] {
        let loss = value("lm loss validation", step);
        assert!(loss > 0.0 && (value("lm loss validation ppl", step) / loss.exp() - 1.0).abs() < 1e-5);
    }
    assert!(value("lm loss test", 6) > 0.0);
}

#[test]
fn a_resumed_run_starts_another_file_and_a_bad_directory_is_one_error() {
    let dir = scratch("tensorboard-resume");
    let data = prepared_corpus(&dir);
    let ckpt = dir.join("ckpt");
    let o = train(&data, &dir, &["--save", ckpt.to_str().unwrap(), "--exit-interval", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The event file names carry the start second; a resume in the same second must not reuse
    // the name, so wait a moment.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // The resumed run writes its per-iteration scalars every third iteration.
    let o = train(&data, &dir, &["--load", ckpt.to_str().unwrap(), "--tensorboard-log-interval", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let files = std::fs::read_dir(dir.join("tb")).unwrap().count();
    assert_eq!(files, 2);
    if let Some(python) = python_with("tensorboard", "tests/tensorboard.rs does not read the event files back") {
        let scalars = read(&python, &dir.join("tb"));
        let steps = |tag: &str| scalars.iter().filter(|s| s.0 == tag).map(|s| s.1).collect::<Vec<_>>();
        assert_eq!(steps("lm loss"), [1, 2, 3, 4, 6], "the first run's 1 to 4, the resumed run's 6");
        assert_eq!(steps("grad-norm vs samples"), [8, 16, 24, 32, 48]);
        assert_eq!(steps("iteration-time"), [2, 3, 4, 6], "log lines keep --log-interval");
    }
    let o = train(&data, &dir, &["--tensorboard-log-interval", "0"]);
    assert_clean_error(&o, &["--tensorboard-log-interval", "0"]);
    // A file where the directory should be.
    let blocker = dir.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let o = train(&data, &blocker, &[]);
    assert_clean_error(&o, &["--tensorboard-dir", "file/tb"]);
    // On two ranks the ranks agree on rank 0's failure and all exit 1: rank 0 names the path
    // (and a bad --log-json the same way), no rank aborts the job.
    for flag in ["--tensorboard-dir", "--log-json"] {
        let path = blocker.join("logs");
        let mut args = vec!["train", "--data-path", &data];
        args.extend(SMALL_MODEL_FLAGS.split_whitespace());
        args.extend([flag, path.to_str().unwrap()]);
        let o = mpirun(2, &args);
        let err = stderr(&o);
        assert!(!o.status.success() && !err.contains("panicked"), "{flag}: {err}");
        assert!(err.contains("trident: error: rank 0:") && err.contains(blocker.to_str().unwrap()), "{flag}: {err}");
        assert!(err.contains("1 rank(s) could not open their logs"), "{flag}: {err}");
        assert!(!err.contains("MPI_ABORT"), "{flag}: the job was aborted: {err}");
    }
}

/// The model of `train` without its logging flags, for the two-rank runs.
const SMALL_MODEL_FLAGS: &str = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 \
                              --micro-batch-size 4 --global-batch-size 8 --train-iters 2 --cpu-threads 1";
