//! Batch-size ramp-up (`--rampup-batch-size START INCREMENT SAMPLES`): the global batch of every
//! iteration and the run's iteration count equal megatron-core's num-microbatches calculator as
//! Megatron-LM's training loop runs it (`rampup_compare.py`, where megatron-core is installed; it
//! says when it skips), in the configuration and in a real run's log; layouts under mpirun (DP 2
//! with ZeRO-1, interleaved PP 2, TP 2 with sequence parallelism, 2-D TP) follow one rank's
//! losses; a resume mid-ramp continues the uninterrupted run bit for bit; bad ramps are one clear
//! error each; `--decrease-batch-size-if-needed` rounds a ramp batch down to whole micro-batches.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use trident::config::TrainConfig;

/// (start, increment, ramp samples, global batch, micro-batch, data-parallel size, train samples,
/// 1 for --decrease-batch-size-if-needed).
const CASES: &[[u64; 8]] = &[
    [4, 4, 64, 16, 2, 1, 200, 0],
    [16, 8, 3000, 256, 4, 2, 9000, 0],
    [2, 2, 8, 8, 1, 1, 30, 0],
    [8, 8, 1000, 64, 4, 2, 1000, 0],
    [32, 32, 10000, 1024, 4, 8, 50000, 0],
    [6, 6, 100, 36, 3, 2, 107, 0],
    [10, 5, 333, 40, 5, 1, 777, 0],
    [16, 8, 3000, 256, 8, 2, 9000, 1],
    [10, 4, 100, 30, 5, 2, 300, 1],
];

/// The DP 2 run of `decrease_batch_size_if_needed_rounds_the_ramp_down`.
const DECREASED: [u64; 8] = [6, 2, 64, 16, 2, 2, 200, 1];

fn megatron_case(c: &[u64; 8]) -> String {
    format!(
        r#"{{"start": {}, "increment": {}, "samples": {}, "global_batch_size": {}, "micro_batch_size": {}, "data_parallel_size": {}, "train_samples": {}, "decrease": {}}}"#,
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[5],
        c[6],
        c[7] == 1
    )
}

/// megatron-core's [global batch, micro-batches] per iteration of each case, or None (said) when
/// it is not installed.
fn megatron_batches(cases: &[[u64; 8]]) -> Option<Vec<Vec<[u64; 2]>>> {
    let py = python_with("megatron.core", "ramp-up is not compared with megatron-core")?;
    let arg = format!("[{}]", cases.iter().map(megatron_case).collect::<Vec<_>>().join(", "));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rampup_compare.py");
    let o = Command::new(&py).args([script, &arg]).output().expect("python runs");
    assert!(o.status.success(), "rampup_compare.py: {}", stderr(&o));
    let text = stdout(&o);
    let body = text.trim().trim_start_matches("[[[").trim_end_matches("]]]");
    Some(
        body.split("]], [[")
            .map(|case| {
                case.split("], [")
                    .map(|p| {
                        let v: Vec<u64> = p.split(',').map(|x| x.trim().parse().unwrap()).collect();
                        [v[0], v[1]]
                    })
                    .collect()
            })
            .collect(),
    )
}

fn config(words: &str) -> Result<TrainConfig, String> {
    let words: Vec<String> = words.split_whitespace().map(String::from).collect();
    let args = trident::cli::parse("train", trident::flags::TRAIN_FLAGS, &words).map_err(|e| e.to_string())?.unwrap();
    TrainConfig::from_args(&args).map_err(|e| e.to_string())
}

#[test]
fn every_iterations_global_batch_equals_megatron_cores() {
    let Some(theirs) = megatron_batches(CASES) else { return };
    assert_eq!(theirs.len(), CASES.len());
    for (c, want) in CASES.iter().zip(&theirs) {
        let flags = format!(
            "--data-path unused --rampup-batch-size {} {} {} --global-batch-size {} --micro-batch-size {} \
             --train-samples {} --lr 1e-3{}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[6],
            if c[7] == 1 { " --decrease-batch-size-if-needed" } else { "" }
        );
        let cfg = config(&flags).unwrap_or_else(|e| panic!("{flags}: {e}"));
        assert_eq!(cfg.train_iters as usize, want.len(), "{flags}: iterations");
        let mut consumed = 0u64;
        for (it, [batch, micro]) in want.iter().enumerate() {
            let ours = cfg.running_batch_at(consumed, (c[4] * c[5]) as usize) as u64;
            assert_eq!(ours, *batch, "{flags}: iteration {}: global batch", it + 1);
            assert_eq!(ours / (c[4] * c[5]), *micro, "{flags}: iteration {}: micro-batches", it + 1);
            consumed += ours;
        }
        eprintln!("{flags}: {} iterations, {} of them ramping", want.len(), want.iter().filter(|b| b[0] < c[3]).count());
    }
}

/// A 4-layer model of width 32 on one thread, ramping 4 -> 16 by 4 over 64 samples with
/// micro-batches of 2 (2, 4, 6, then 8 of them), 200 samples (19 iterations).
const RAMP: &str = "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 \
                    --global-batch-size 16 --rampup-batch-size 4 4 64 --train-samples 200 --lr 1e-3 \
                    --lr-warmup-samples 16 --log-interval 1 --eval-interval 10 --eval-iters 1 --cpu-threads 1";

fn ramp_args(data: &str, json: &Path, extra: &[&str]) -> Vec<String> {
    args_from(RAMP, data, json, extra)
}

fn args_from(words: &str, data: &str, json: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--data-path", data].iter().map(|s| s.to_string()).collect();
    a.extend(words.split_whitespace().map(String::from));
    a.extend(SAME_PADDING.iter().map(|s| s.to_string()));
    a.extend(["--log-json".to_string(), json.display().to_string()]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// (global batch, consumed samples) of each line of a `--log-json` file.
fn logged_batches(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let field = |k| json_field(l, k).unwrap().parse().unwrap();
            (field("global_batch_size"), field("consumed_samples"))
        })
        .collect()
}

#[test]
fn layouts_follow_one_rank_through_the_ramp_and_resume_mid_ramp_is_exact() {
    let dir = scratch("rampup");
    let data = prepared_corpus(&dir);
    let base = dir.join("base.jsonl");
    let o = run(&strs(&ramp_args(&data, &base, &[])));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("batch-size ramp-up: global batch 4 rising by 4 over 64 samples to 16"), "{}", stdout(&o));
    let logged = logged_batches(&base);
    let want: Vec<u64> = [vec![4; 6], vec![8; 3], vec![12; 2], vec![16; 8]].concat();
    assert_eq!(logged.iter().map(|b| b.0).collect::<Vec<_>>(), want, "the logged global batches");
    let mut consumed = 0;
    for (it, (batch, after)) in logged.iter().enumerate() {
        consumed += batch;
        assert_eq!(*after, consumed, "iteration {}: consumed samples", it + 1);
    }
    if let Some(theirs) = megatron_batches(&[[4, 4, 64, 16, 2, 1, 200, 0]]) {
        assert_eq!(theirs[0].iter().map(|b| b[0]).collect::<Vec<_>>(), want, "megatron-core's batches");
    }
    let base_losses = loss_values(&base);
    // Its first 6 iterations (batches of 4 at 0..20 consumed samples) are a constant batch of 4's,
    // bit for bit: the same samples, the same rates (a function of the consumed samples), and
    // each loss averaged over the iteration's own tokens.
    let constant = dir.join("constant.jsonl");
    let words = RAMP.replace("--global-batch-size 16 --rampup-batch-size 4 4 64", "--global-batch-size 4");
    let o = run(&strs(&args_from(&words, &data, &constant, &[])));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(logged_losses(&constant)[..6], logged_losses(&base)[..6], "the ramp's first batches of 4");
    assert!(base_losses.iter().all(|l| *l < 6.0), "losses above ln(257): {base_losses:?}");

    // Resume mid-ramp (after iteration 7, a batch of 8 with 4 micro-batches): bit for bit.
    let ckpt = dir.join("ckpt");
    let resumed = dir.join("resumed.jsonl");
    let save = ["--save", ckpt.to_str().unwrap()];
    let o = run(&strs(&ramp_args(&data, &resumed, &[&save[..], &["--exit-interval", "7"]].concat())));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&strs(&ramp_args(&data, &resumed, &[&save[..], &["--load", ckpt.to_str().unwrap()]].concat())));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(logged_losses(&resumed), logged_losses(&base), "the resumed run's losses");
    assert_eq!(logged_batches(&resumed), logged, "the resumed run's batches");

    // Layouts: each ramp value's micro-batch count splits over the layout (interleaved PP 2
    // needs an even count: 2, 4, 6, 8).
    for (ranks, what, flags) in [
        (2, "DP 2 + ZeRO-1", "--use-distributed-optimizer"),
        (2, "interleaved PP 2", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"),
        (2, "TP 2 + SP", "--tensor-model-parallel-size 2 --sequence-parallel"),
        (4, "2-D TP", "--tensor-model-parallel-size 4 --tensor-parallel-mode 2d"),
    ] {
        let json = dir.join(format!("{}.jsonl", what.replace(' ', "_")));
        let extra: Vec<&str> = flags.split(' ').collect();
        let o = mpirun(ranks, &strs(&ramp_args(&data, &json, &extra)));
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        assert_eq!(logged_batches(&json), logged, "{what}: the logged batches");
        let losses = loss_values(&json);
        assert_eq!(losses.len(), base_losses.len(), "{what}");
        for (it, (a, b)) in losses.iter().zip(&base_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{what}: iteration {}: loss {a} vs one rank {b}", it + 1);
        }
    }
}

#[test]
fn bad_ramps_are_one_clear_error() {
    for (flags, needle) in [
        ("--rampup-batch-size 32 8 100 --train-samples 1000", "start batch size 32 is larger than --global-batch-size 16"),
        ("--rampup-batch-size 4 5 100 --train-samples 1000", "the increment 5 does not divide"),
        ("--rampup-batch-size 4 4 100 --train-iters 50", "needs sample-based training: give --train-samples instead of --train-iters"),
        ("--rampup-batch-size 4 4 100", "needs sample-based training"),
        ("--rampup-batch-size 4 4 --train-samples 1000", "--rampup-batch-size"),
        ("--rampup-batch-size 4 0 100 --train-samples 1000", "all positive"),
    ] {
        let e = config(&format!("--data-path unused --global-batch-size 16 --micro-batch-size 2 {flags}"))
            .err()
            .unwrap_or_else(|| panic!("{flags}: accepted"));
        assert!(e.contains(needle), "{flags}: {e}");
    }
    // A ramp value that the micro-batch x data-parallel size does not divide, and one that the
    // interleaved schedule cannot take, stop the run before it starts: once, on every rank.
    let dir = scratch("rampup-bad");
    let data = prepared_corpus(&dir);
    let json = dir.join("x.jsonl");
    let words = RAMP.replace("--micro-batch-size 2", "--micro-batch-size 8");
    let o = run(&strs(&args_from(&words, &data, &json, &[])));
    assert_clean_error(&o, &["--rampup-batch-size: at 0 consumed samples the global batch is 4", "--micro-batch-size 8"]);
    let words = RAMP.replace("--rampup-batch-size 4 4 64", "--rampup-batch-size 2 2 64");
    let interleaved = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"];
    let o = mpirun(2, &strs(&args_from(&words, &data, &json, &interleaved)));
    assert_one_error(&o, &["--rampup-batch-size: at 0 consumed samples the global batch is 2", "interleaved"]);
}

#[test]
fn decrease_batch_size_if_needed_rounds_the_ramp_down() {
    // DP 2 with micro-batches of 2: the ramp's 6, 10 and 14 are not whole micro-batches on both
    // ranks; without the flag that is one error, with it they round down to 4, 8 and 12.
    let dir = scratch("rampup-decrease");
    let data = prepared_corpus(&dir);
    let json = dir.join("decreased.jsonl");
    let words = RAMP.replace("--rampup-batch-size 4 4 64", "--rampup-batch-size 6 2 64");
    let o = mpirun(2, &strs(&args_from(&words, &data, &json, &[])));
    assert_one_error(&o, &["at 0 consumed samples the global batch is 6", "--decrease-batch-size-if-needed rounds it down"]);
    let o = mpirun(2, &strs(&args_from(&words, &data, &json, &["--decrease-batch-size-if-needed"])));
    assert!(o.status.success(), "{}", stderr(&o));
    let logged = logged_batches(&json);
    let batches: Vec<u64> = logged.iter().map(|b| b.0).collect();
    assert_eq!(batches[..10], [4, 4, 4, 4, 8, 8, 8, 12, 12, 16], "{batches:?}");
    let mut consumed = 0;
    for (it, (batch, after)) in logged.iter().enumerate() {
        consumed += batch;
        assert_eq!(*after, consumed, "iteration {}: consumed samples", it + 1);
    }
    if let Some(theirs) = megatron_batches(&[DECREASED]) {
        assert_eq!(theirs[0].iter().map(|b| b[0]).collect::<Vec<_>>(), batches, "megatron-core's running batches");
    }
}
