//! Context parallelism under Open MPI's mpirun: each sequence split over 2 and 4 ranks (the
//! all-to-all swap, `--cp-comm-type a2a`; the all-gather and the ring, `all_gather` and `p2p`,
//! with blockwise attention), alone and beside tensor, sequence, pipeline and data parallelism, for GPT-2 and a Llama model with grouped-query attention, computes the
//! single-rank run (losses and final weights within 1e-5); its checkpoints resume bit for bit and
//! at another context-parallel size; layouts it cannot run fail once with one clear line.

mod common;
use common::*;
use std::path::Path;

/// A `train` run of `preset` for 10 iterations (`--exit-interval` in `extra` stops it sooner)
/// logging every loss to `json`, saving to `ckpt`.
fn run_args(preset: &str, data: &str, json: &Path, ckpt: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["train", "--preset", preset, "--data-path", data, SAME_PADDING[0], SAME_PADDING[1]]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (json, ckpt) = (json.to_str().unwrap(), ckpt.to_str().unwrap());
    let exit = if extra.contains(&"--exit-interval") { &[][..] } else { &["--exit-interval", "10"][..] };
    for s in exit.iter().chain(&["--log-interval", "1", "--log-json", json, "--save", ckpt]) {
        args.push(s.to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs each layout of `preset` (with `model` flags) and checks it against one rank.
fn layouts_match_one_rank(name: &str, preset: &str, model: &[&str], layouts: &[(usize, &[&str])]) {
    let dir = scratch(name);
    let data = prepared_corpus(&dir);
    let (base_json, base_ckpt) = (dir.join("base.jsonl"), dir.join("base"));
    let args = run_args(preset, &data, &base_json, &base_ckpt, model);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base_losses = loss_values(&base_json);
    assert_eq!(base_losses.len(), 10);
    let base_weights = full_weights(&base_ckpt);
    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let (json, ckpt) = (dir.join(format!("l{i}.jsonl")), dir.join(format!("l{i}")));
        let mut args = run_args(preset, &data, &json, &ckpt, model);
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = mpirun(*ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let what = format!("{preset} on {ranks} ranks {extra:?}");
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        let got = loss_values(&json);
        assert_losses_match(&what, &got, &base_losses);
        let worst = assert_weights_match(&what, &ckpt, &base_weights);
        let rel = got.iter().zip(&base_losses).fold(0f64, |m, (a, b)| m.max((a - b).abs() / b.abs()));
        eprintln!("{what}: losses within {rel:.1e} relative, weights within {worst:.1e}");
    }
}

/// `--context-parallel-size c --cp-comm-type kind` followed by `rest`.
fn cp(c: &'static str, kind: &'static str, rest: &[&'static str]) -> Vec<&'static str> {
    [&["--context-parallel-size", c, "--cp-comm-type", kind][..], rest].concat()
}

const LEVELS: &str = "--hierarchical-context-parallel-sizes";

const TP2_SP_PP2: &[&str] =
    &["--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2"];

#[test]
fn gpt_context_parallel_layouts_compute_the_single_rank_run() {
    let layouts = [
        (2, cp("2", "a2a", &[])),
        (4, cp("4", "a2a", &[])),
        // Beside data parallelism with ZeRO-1 (gradients and shards over dp x cp) and
        // selective recompute (the swap runs again in backward).
        (4, cp("2", "a2a", &["--use-distributed-optimizer", "--recompute-granularity", "selective"])),
        (8, cp("2", "a2a", TP2_SP_PP2)),
        (2, cp("2", "all_gather", &[])),
        (4, cp("4", "all_gather", &[])),
        (8, cp("2", "all_gather", TP2_SP_PP2)),
        // Megatron's default type, the ring, given by omitting the flag.
        (2, vec!["--context-parallel-size", "2"]),
        (4, cp("4", "p2p", &["--use-distributed-optimizer"])),
        (8, cp("2", "p2p", TP2_SP_PP2)),
        // The swap inside pairs of adjacent ranks, the ring across the pairs; and the ring alone
        // behind a swap of one rank.
        (4, cp("4", "a2a+p2p", &[LEVELS, "2", "2"])),
        (8, cp("2", "a2a+p2p", &[TP2_SP_PP2, &[LEVELS, "1", "2"]].concat())),
    ];
    let layouts: Vec<(usize, &[&str])> = layouts.iter().map(|(n, f)| (*n, &f[..])).collect();
    layouts_match_one_rank("cp-gpt", "tiny", &[], &layouts);
}

#[test]
fn llama_context_parallel_layouts_compute_the_single_rank_run() {
    // llama-tiny: 4 query heads in 2 key/value groups; the swap at CP 2 leaves each rank one
    // group of two; the all-gather splits positions only, so CP 4 runs too.
    let layouts = [
        (2, cp("2", "a2a", &[])),
        (4, cp("2", "a2a", &["--recompute-granularity", "full"])),
        (4, cp("4", "all_gather", &["--recompute-granularity", "selective"])),
        (4, cp("4", "p2p", &["--recompute-granularity", "full"])),
    ];
    let layouts: Vec<(usize, &[&str])> = layouts.iter().map(|(n, f)| (*n, &f[..])).collect();
    layouts_match_one_rank("cp-llama", "llama-tiny", &[], &layouts);
    // 8 heads in 4 groups: CP 4, and TP 2 x CP 2 x PP 2 with SP, each rank keeping whole groups.
    let layouts = [
        (4, cp("4", "a2a", &[])),
        (8, cp("2", "a2a", TP2_SP_PP2)),
        (8, cp("2", "all_gather", TP2_SP_PP2)),
        (8, cp("2", "p2p", TP2_SP_PP2)),
        (4, cp("4", "a2a+p2p", &[LEVELS, "2", "2", "--recompute-granularity", "full"])),
        (8, cp("2", "a2a+p2p", &[TP2_SP_PP2, &[LEVELS, "2", "1"]].concat())),
    ];
    let layouts: Vec<(usize, &[&str])> = layouts.iter().map(|(n, f)| (*n, &f[..])).collect();
    let model = ["--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4"];
    layouts_match_one_rank("cp-llama-8", "llama-tiny", &model, &layouts);
}

/// Dropout under context parallelism draws one rank's masks: the hidden sites' rows jump from a
/// rank's first chunk to its second, the swap's attention numbers its heads and positions in the
/// whole tensor, and each block of the ring and the gather draws its probabilities' masks at its
/// queries' and keys' positions in the whole sequence.
#[test]
fn dropout_under_context_parallelism_draws_the_single_ranks_masks() {
    let both = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"];
    let layouts = [
        (2, cp("2", "a2a", &[])),
        (4, cp("2", "a2a", &["--tensor-model-parallel-size", "2", "--sequence-parallel"])),
        (2, vec!["--context-parallel-size", "2"]),
        (4, cp("4", "all_gather", &["--recompute-granularity", "full"])),
        (4, cp("4", "a2a+p2p", &[LEVELS, "2", "2"])),
    ];
    let layouts: Vec<(usize, &[&str])> = layouts.iter().map(|(n, f)| (*n, &f[..])).collect();
    layouts_match_one_rank("cp-dropout", "tiny", &both, &layouts);
    let hidden = ["--hidden-dropout", "0.1", "--attention-dropout", "0"];
    let layouts = [(4, cp("4", "p2p", &[])), (4, cp("2", "all_gather", &["--recompute-granularity", "full"]))];
    let layouts: Vec<(usize, &[&str])> = layouts.iter().map(|(n, f)| (*n, &f[..])).collect();
    layouts_match_one_rank("cp-dropout-hidden", "llama-tiny", &hidden, &layouts);
}

/// A run saved at CP 2 after 5 iterations resumes at CP 2 with the uninterrupted run's losses bit
/// for bit, and at CP 1 (the checkpoint does not depend on the split) within f32 rounding.
#[test]
fn context_parallel_checkpoints_resume_exactly_and_at_another_size() {
    let dir = scratch("cp-resume");
    let data = prepared_corpus(&dir);
    let cp2: Vec<&str> = vec!["--context-parallel-size", "2", "--cp-comm-type", "a2a"];
    let (whole_json, whole_ckpt) = (dir.join("whole.jsonl"), dir.join("whole"));
    let args = run_args("tiny", &data, &whole_json, &whole_ckpt, &cp2);
    let o = mpirun(2, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = logged_losses(&whole_json);
    assert_eq!(whole.len(), 10);

    let (half_json, ckpt) = (dir.join("half.jsonl"), dir.join("ckpt"));
    let half: Vec<&str> = cp2.iter().chain(&["--save-interval", "5", "--exit-interval", "5"]).copied().collect();
    let args = run_args("tiny", &data, &half_json, &ckpt, &half);
    let o = mpirun(2, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    for (ranks, extra, exact) in [(2, cp2.clone(), true), (1, vec![], false)] {
        let json = dir.join(format!("resumed{ranks}.jsonl"));
        let mut args = run_args("tiny", &data, &json, &dir.join(format!("after{ranks}")), &extra);
        args.extend(["--load", ckpt.to_str().unwrap()].map(String::from));
        let o = mpirun(ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "resume on {ranks}: {}", stderr(&o));
        let resumed = logged_losses(&json);
        assert_eq!(resumed.len(), 5, "resume on {ranks} logs iterations 6 to 10");
        for ((it, got), (want_it, want)) in resumed.iter().zip(&whole[5..]) {
            assert_eq!(it, want_it);
            match exact {
                true => assert_eq!(got, want, "CP 2 resumed, iteration {it}"),
                false => {
                    let (a, b): (f64, f64) = (got.parse().unwrap(), want.parse().unwrap());
                    assert!((a - b).abs() <= 1e-5 * b.abs(), "CP 1 resumed, iteration {it}: {a} vs {b}");
                }
            }
        }
    }
}

/// The a2a swap is an all-to-all: at CP 2 and CP 4 the context-parallel group moves, per layer
/// and micro-batch, `3 (c - 1) / c² b s (w_qkv + w_a)` elements (docs/design.md, Communication
/// volumes: QKV and the output forward, the saved QKV and output, the output's gradient and
/// QKV's gradient backward), and gathers nothing.
#[test]
fn the_a2a_swap_moves_an_all_to_alls_volume() {
    let dir = scratch("cp-a2a-volume");
    let data = prepared_corpus(&dir);
    // The tiny preset: 4 layers, hidden 128 (QKV 384 wide), micro-batch 16 of 128 tokens.
    let (layers, b, s, w) = (4.0, 16.0, 128.0, 384.0 + 128.0);
    for (c, c_arg) in [(2usize, "2"), (4, "4")] {
        let args = ["train", "--preset", "tiny", "--data-path", &data, "--train-iters", "1", "--eval-iters", "0"];
        let o = mpirun(c, &[&args[..], &cp(c_arg, "a2a", &["--log-comm", "--cpu-threads", "1"])].concat());
        let out = stdout(&o);
        assert!(o.status.success(), "CP {c}: {}", stderr(&o));
        let line = out
            .lines()
            .find(|l| l.contains(&format!("context-parallel group of {c}:")))
            .unwrap_or_else(|| panic!("CP {c}: no context-parallel line in\n{out}"));
        let moved: f64 = line.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let c = c as f64;
        let expect = layers * 3.0 * (c - 1.0) / (c * c) * b * s * w;
        assert_eq!(moved, expect, "CP {c}: {line}");
        assert!(line.contains("all-gather 0,"), "CP {c}: {line}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn impossible_context_parallel_layouts_fail_once_on_every_rank() {
    let dir = scratch("cp-bad");
    let data = prepared_corpus(&dir);
    let base = [
        "train",
        "--data-path",
        data.as_str(),
        "--train-iters",
        "3",
        "--hidden-dropout",
        "0",
        "--attention-dropout",
        "0",
    ];
    let case = |ranks: usize, extra: &[&str], needles: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_one_error(&mpirun(ranks, &args), needles);
    };
    let a2a = |extra: &[&'static str]| ["--cp-comm-type", "a2a"].iter().chain(extra).copied().collect::<Vec<&str>>();
    // a2a+p2p without its sizes, with sizes that do not make C or split the heads; a type per layer.
    let levels =
        |sizes: &[&'static str]| [&["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"][..], sizes].concat();
    case(4, &levels(&[]), &["a2a+p2p", "--hierarchical-context-parallel-sizes A B"]);
    case(4, &levels(&[LEVELS, "2", "3"]), &["A x B = --context-parallel-size 4", "[2, 3]"]);
    case(
        4,
        &levels(&[LEVELS, "4", "1", "--num-attention-heads", "2", "--hidden-size", "128"]),
        &["--hierarchical-context-parallel-sizes level, 4 ranks", "2 key/value groups"],
    );
    case(2, &["--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a"], &["one type for every layer"]);
    // A sequence that does not split into 2C chunks; heads that do not split for the swap.
    case(
        4,
        &a2a(&["--context-parallel-size", "4", "--seq-length", "36"]),
        &["--seq-length 36", "2 x --context-parallel-size 4"],
    );
    case(
        4,
        &a2a(&["--context-parallel-size", "4", "--num-attention-heads", "2", "--hidden-size", "128"]),
        &["--context-parallel-size 4", "2 key/value groups"],
    );
    // A world that does not factor; SP over a split sequence that does not divide; dropout.
    case(3, &a2a(&["--context-parallel-size", "2"]), &["3 ranks", "--context-parallel-size 2"]);
    let sp = ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--num-attention-heads", "8"];
    case(
        8,
        &a2a(&[&["--context-parallel-size", "2", "--seq-length", "36"][..], &sp].concat()),
        &["18 positions", "--sequence-parallel"],
    );
    case(
        8,
        &a2a(&["--context-parallel-size", "2", "--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]),
        &["--context-parallel-size", "1-D tensor parallelism"],
    );
}
