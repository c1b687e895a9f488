//! Data-parallel sharding under Open MPI's mpirun: the distributed optimizer (ZeRO-1) sharded
//! bucket by bucket, with its reduce-scatters overlapped with backward (`--overlap-grad-reduce`)
//! or after it, and its weight all-gathers finished as the next forward reaches each bucket
//! (`--overlap-param-gather`) or at once; all give the same bits, plain data parallelism's
//! losses to f32 rounding, and checkpoints that resume bit for bit. ZeRO-2 (`optim_grads`) the
//! same, its buckets reduced every micro-batch into a shard of the gradients, and its checkpoints
//! continue under every strategy and data-parallel size.

mod common;
use common::*;
use std::path::Path;

/// The tiny preset on 4 ranks for `iters` iterations, logging every loss to `json`.
fn run4(data: &str, json: &Path, iters: &str, extra: &[&str]) -> String {
    let json = json.display().to_string();
    let base = ["train", "--preset", "tiny", "--data-path", data, "--train-iters", "10", "--exit-interval", iters];
    let args = [&base[..], &["--log-interval", "1", "--log-json", &json, "--cpu-threads", "1"], extra].concat();
    let o = mpirun(4, &args);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    stdout(&o)
}

/// The tiny preset on `ranks` ranks in micro-batches of 1 (several per step, each of which
/// ZeRO-2 reduces), logging every loss to `json`.
fn train_on(ranks: usize, data: &str, json: &Path, extra: &[&str]) -> String {
    let json = json.display().to_string();
    let base = ["train", "--preset", "tiny", "--data-path", data, "--train-iters", "10", "--micro-batch-size", "1"];
    let args = [&base[..], &["--log-interval", "1", "--log-json", &json, "--cpu-threads", "1"], extra].concat();
    let o = if ranks == 1 { run(&args) } else { mpirun(ranks, &args) };
    assert!(o.status.success(), "{ranks} ranks, {extra:?}: {}", stderr(&o));
    stdout(&o)
}

/// From rank 0's row of the `--log-memory` table, in MiB: the gradients by the sharding's formula
/// and measured, and weights + gradients + optimizer state by formula and measured.
fn memory_row(out: &str) -> [f64; 4] {
    let row = out.lines().find(|l| l.trim_start().starts_with("rank   0:")).expect("memory table");
    let pair =
        |field: &str| -> Vec<f64> { field.split(['/', '(']).take(2).map(|x| x.trim().parse().unwrap()).collect() };
    let fields: Vec<&str> = row.split('|').collect();
    let (grads, total) = (pair(fields[1]), pair(fields[5]));
    [grads[0], grads[1], total[0], total[1]]
}

const ZERO2: [&str; 2] = ["--data-parallel-sharding-strategy", "optim_grads"];
const LLAMA: [&str; 6] = [
    "--normalization",
    "RMSNorm",
    "--swiglu",
    "--position-embedding-type",
    "rope",
    "--untie-embeddings-and-output-weights",
];

/// ZeRO-2 on 4 ranks, GPT and Llama: plain data parallelism's losses to f32 rounding (each
/// micro-batch's gradients are summed over the ranks before the micro-batches are), the same bits
/// with every overlap on, and per rank a shard of the gradients: measured within 10% of the
/// formula (the shard, plus the buckets backward is filling and the packed copies in flight),
/// and less than plain data parallelism's whole gradients.
#[test]
fn zero2_matches_plain_data_parallelism_with_a_shard_of_the_gradients() {
    let dir = scratch("sharding-zero2");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    for (arch, flags) in [("gpt", &[][..]), ("llama", &LLAMA[..])] {
        let json = |mode: &str| p(&format!("{arch}-{mode}.jsonl"));
        let plain = train_on(4, &data, &json("plain"), &[flags, &["--log-memory"]].concat());
        // Buckets of 50,000 elements (a quarter of a layer): the tiny model's four layers would
        // make a layer's bucket and its copies in flight most of its gradients.
        let zero2 = [flags, &ZERO2[..], &["--log-memory", "--ddp-bucket-size", "50000"]].concat();
        let sharded = train_on(4, &data, &json("zero2"), &zero2);
        let overlap = [&zero2[..], &["--overlap-grad-reduce", "--overlap-param-gather"]].concat();
        let overlapped = train_on(4, &data, &json("overlap"), &overlap);
        let [plain_losses, zero2_losses, overlap_losses] = ["plain", "zero2", "overlap"].map(|m| loss_values(&json(m)));
        assert_eq!(plain_losses.len(), 10);
        assert_eq!(overlap_losses, zero2_losses, "{arch}: the overlaps changed the losses");
        assert_losses_match(&format!("{arch}: ZeRO-2"), &zero2_losses, &plain_losses);
        let whole = memory_row(&plain)[1];
        for (mode, out) in [("ZeRO-2", &sharded), ("ZeRO-2 overlapped", &overlapped)] {
            let [formula, measured, total_formula, total] = memory_row(out);
            assert!(
                (measured - formula).abs() <= 0.1 * formula,
                "{arch}, {mode}: gradients {measured} vs {formula} MiB"
            );
            assert!((total - total_formula).abs() <= 0.1 * total_formula, "{arch}, {mode}: {total} vs {total_formula}");
            assert!(measured < whole, "{arch}, {mode}: gradients {measured} MiB, not less than whole ({whole})");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A checkpoint saved under ZeRO-2 with the overlaps on 4 ranks resumes there bit for bit, and
/// continues under ZeRO-1 on 2 ranks and without sharding on 1 with the same losses (to f32
/// rounding: the sums' order follows the ranks); the same under TP 2 x PP 2 on 8 ranks (with
/// sequence parallelism, Llama's layers), against plain data parallelism there.
#[test]
fn a_zero2_checkpoint_continues_under_every_strategy_and_size() {
    let dir = scratch("sharding-zero2-resume");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    let ckpt = p("ckpt").display().to_string();
    let overlap = [&ZERO2[..], &["--overlap-grad-reduce", "--overlap-param-gather"]].concat();
    let saving = [&overlap[..], &["--save", &ckpt, "--save-interval", "5"]].concat();
    train_on(4, &data, &p("saved.jsonl"), &saving);
    let saved = loss_values(&p("saved.jsonl"));
    std::fs::write(dir.join("ckpt/latest_checkpointed_iteration.txt"), "5\n").unwrap();
    let load = ["--load", ckpt.as_str()];
    train_on(4, &data, &p("again.jsonl"), &[&overlap[..], &load[..]].concat());
    assert_eq!(loss_values(&p("again.jsonl")), saved[5..], "ZeRO-2 resumed on 4 ranks");
    for (ranks, flags) in [(2, &["--use-distributed-optimizer"][..]), (1, &[])] {
        let json = p(&format!("on{ranks}.jsonl"));
        train_on(ranks, &data, &json, &[flags, &load[..]].concat());
        assert_losses_match(&format!("continued on {ranks} ranks"), &loss_values(&json), &saved[5..]);
    }
    let grid = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel"];
    for (arch, flags) in [("gpt", &[][..]), ("llama", &LLAMA[..])] {
        let json = |mode: &str| p(&format!("grid-{arch}-{mode}.jsonl"));
        train_on(8, &data, &json("plain"), &[&grid[..], flags].concat());
        train_on(8, &data, &json("zero2"), &[&grid[..], flags, &overlap[..]].concat());
        let what = format!("{arch}: TP 2 x PP 2 x DP 2, ZeRO-2");
        assert_losses_match(&what, &loss_values(&json("zero2")), &loss_values(&json("plain")));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn overlapped_bucket_reduce_scatters_give_the_plain_runs_bits() {
    let dir = scratch("sharding-overlap");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    // 858,880 parameters in buckets of at least 100,000 elements: several buckets, each padded
    // to a multiple of 4 and sharded on its own.
    let zero = ["--use-distributed-optimizer", "--ddp-bucket-size", "100000"];
    run4(&data, &p("plain.jsonl"), "10", &[]);
    run4(&data, &p("after.jsonl"), "10", &zero);
    let ckpt = p("ckpt").display().to_string();
    let overlap = [&zero[..], &["--overlap-grad-reduce", "--overlap-param-gather"]].concat();
    let trace = p("trace.json").display().to_string();
    let saving = [&overlap[..], &["--save", &ckpt, "--save-interval", "5", "--timing-trace", &trace]].concat();
    let out = run4(&data, &p("overlap.jsonl"), "10", &saving);
    // The trace shows each rank's gradient sync on a communication track of its own (tids 4-7
    // beside the ranks' 0-3), once per iteration.
    let text = std::fs::read_to_string(&trace).unwrap();
    let syncs: Vec<&str> = text.lines().filter(|l| l.contains("\"cat\": \"grad-sync\"")).collect();
    assert_eq!(syncs.len(), 4 * 10, "{} gradient sync spans", syncs.len());
    for rank in 0..4 {
        let track = format!("\"tid\": {}}}", 4 + rank);
        assert_eq!(syncs.iter().filter(|l| l.contains(&track)).count(), 10, "rank {rank}'s communication track");
        assert!(text.contains(&format!("rank {rank} communication waited for")), "track {rank} unnamed");
    }
    let [plain, after, overlapped] = ["plain", "after", "overlap"].map(|n| loss_values(&p(&format!("{n}.jsonl"))));
    assert_eq!(plain.len(), 10, "{out}");
    assert_eq!(after, overlapped, "the overlapped reduce-scatters changed the losses");
    assert_losses_match("ZeRO-1 in buckets", &after, &plain);
    // Resumed at iteration 5 from the overlapped run's checkpoint: the same bits.
    std::fs::write(dir.join("ckpt/latest_checkpointed_iteration.txt"), "5\n").unwrap();
    run4(&data, &p("resumed.jsonl"), "10", &[&overlap[..], &["--load", &ckpt]].concat());
    assert_eq!(loss_values(&p("resumed.jsonl")), overlapped[5..], "resumed from iteration 5");
    let _ = std::fs::remove_dir_all(dir);
}

/// TP 2 x DP 2 with sequence parallelism: the sequence-parallel gradients are summed over the
/// tensor-parallel pair on the shard after the reduce-scatter, so their buckets reduce during
/// backward too; overlapped and not give the same bits, and plain data parallelism's losses.
#[test]
fn sequence_parallel_buckets_overlap_too() {
    let dir = scratch("sharding-sp");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    let tp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"];
    let zero = [&tp[..], &["--use-distributed-optimizer", "--ddp-bucket-size", "100000"]].concat();
    let overlap = [&zero[..], &["--overlap-grad-reduce"]].concat();
    run4(&data, &p("plain.jsonl"), "10", &tp);
    run4(&data, &p("after.jsonl"), "10", &zero);
    let out = run4(&data, &p("overlap.jsonl"), "10", &[&overlap[..], &["--log-comm"]].concat());
    let [plain, after, overlapped] = ["plain", "after", "overlap"].map(|n| loss_values(&p(&format!("{n}.jsonl"))));
    assert_eq!(after, overlapped, "the overlapped reduce-scatters changed the losses");
    assert_losses_match("TP 2 x DP 2, SP, ZeRO-1 in buckets", &after, &plain);
    assert!(out.contains("reduce-scatter"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--overlap-param-gather` under bf16 (each bucket's working copy rounded as it arrives), and
/// with `--log-params-norm` (which reads every weight right after the step): the bits of the
/// gathers finished at once.
#[test]
fn weights_gathered_as_the_forward_reaches_them_give_the_same_bits() {
    let dir = scratch("sharding-gather");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    let text = |n: &str| std::fs::read_to_string(p(n)).unwrap();
    // Every logged field but the timings.
    let timing = ["\"ms_per_iter\"", "\"tokens_per_s\"", "\"tflops\"", "\"mfu\""];
    let strip = |t: String| -> Vec<String> {
        let fields =
            t.lines().flat_map(|l| l.trim_matches(['{', '}']).split(", ").map(str::to_string).collect::<Vec<_>>());
        fields.filter(|f| !timing.iter().any(|k| f.starts_with(k))).collect()
    };
    let zero = ["--use-distributed-optimizer", "--ddp-bucket-size", "100000"];
    for (name, extra) in [("bf16", "--bf16"), ("norm", "--log-params-norm")] {
        let flags = [&zero[..], &[extra]].concat();
        let (at_once, arriving) = (format!("{name}-at-once.jsonl"), format!("{name}-arriving.jsonl"));
        run4(&data, &p(&at_once), "6", &flags);
        run4(&data, &p(&arriving), "6", &[&flags[..], &["--overlap-param-gather"]].concat());
        assert_eq!(logged_losses(&p(&at_once)).len(), 6);
        assert_eq!(strip(text(&arriving)), strip(text(&at_once)), "{name}: every logged value");
    }
    assert!(text("norm-at-once.jsonl").contains("params_norm"), "{}", text("norm-at-once.jsonl"));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--grad-reduce-in-bf16`: the buckets' all-reduces (plain data parallelism) and the
/// distributed optimizer's reduce-scatters (overlapped or not: the same bits) sum in bf16; the
/// losses follow the f32 sums' closely but not bit for bit (the rounding happens), and the flag
/// needs `--bf16`.
#[test]
fn gradients_summed_in_bf16() {
    let dir = scratch("sharding-bf16");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name);
    let bf16 = ["--bf16", "--ddp-bucket-size", "100000"];
    let zero = ["--use-distributed-optimizer", "--grad-reduce-in-bf16"];
    run4(&data, &p("f32-sums.jsonl"), "6", &bf16);
    run4(&data, &p("plain.jsonl"), "6", &[&bf16[..], &["--grad-reduce-in-bf16"]].concat());
    run4(&data, &p("zero.jsonl"), "6", &[&bf16[..], &zero[..]].concat());
    run4(&data, &p("overlap.jsonl"), "6", &[&bf16[..], &zero[..], &["--overlap-grad-reduce"]].concat());
    let [f32_sums, plain, zero, overlap] =
        ["f32-sums", "plain", "zero", "overlap"].map(|n| loss_values(&p(&format!("{n}.jsonl"))));
    assert_eq!(zero, overlap, "the overlap changed the bf16 sums");
    assert_ne!(plain, f32_sums, "the sums were not rounded to bf16");
    for (name, got) in [("plain", &plain), ("ZeRO-1", &zero)] {
        for (a, b) in got.iter().zip(&f32_sums) {
            assert!((a - b).abs() <= 2e-3 * b.abs(), "{name}: bf16 sums' loss {a} vs f32 sums' {b}");
        }
    }
    let o = run(&["train", "--preset", "tiny", "--data-path", &data, "--train-iters", "1", "--grad-reduce-in-bf16"]);
    assert_clean_error(&o, &["--grad-reduce-in-bf16", "needs --bf16"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--data-parallel-sharding-strategy` and `--use-megatron-fsdp`: `optim` is ZeRO-1, `optim_grads`
/// ZeRO-2 and `no_shard` the replicated optimizer; what is not built, contradictions and unknown strategies get one
/// clear line and a non-zero exit.
#[test]
fn sharding_strategies_run_or_say_what_is_missing() {
    let dir = scratch("sharding-flags");
    let data = prepared_corpus(&dir);
    let train = |extra: &[&str]| {
        let base = ["train", "--preset", "tiny", "--data-path", &data, "--train-iters", "1", "--eval-iters", "0"];
        run(&[&base[..], extra].concat())
    };
    let o = train(&["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = train(&["--data-parallel-sharding-strategy", "optim_grads"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (flags, needles) in [
        (
            &["--data-parallel-sharding-strategy", "optim_grads_params"][..],
            &["optim_grads_params: not built yet", "issue 53"][..],
        ),
        (
            &["--use-megatron-fsdp"],
            &["default strategy", "optim_grads_params", "--data-parallel-sharding-strategy optim"],
        ),
        (&["--data-parallel-sharding-strategy", "no_shard", "--use-distributed-optimizer"], &["drop one"]),
        (
            &["--data-parallel-sharding-strategy", "zero3"],
            &["zero3", "no_shard, optim, optim_grads or optim_grads_params"],
        ),
    ] {
        let o = train(flags);
        assert!(!o.status.success(), "{flags:?} ran");
        let e = stderr(&o);
        assert_eq!(e.lines().filter(|l| l.contains("error")).count(), 1, "{flags:?}: {e}");
        for n in needles {
            assert!(e.contains(n), "{flags:?}: '{n}' missing from {e}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
