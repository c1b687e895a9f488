//! Dropout (`--hidden-dropout`, `--attention-dropout`) on the tiny presets: every layout draws the
//! single rank's masks (TP 2 x PP 2 x DP 2 with sequence parallelism, 2-D SUMMA, ZeRO-1, an
//! interleaved pipeline; the Llama one's grouped-query heads over TP 2 with sequence parallelism:
//! losses and every weight within 1e-5 over 10 iterations), recomputation draws them again (the
//! same losses bit for bit), a resumed run continues bit for bit, and dropout changes the run.

mod common;
use common::*;
use std::path::Path;

/// The tiny preset's run with dropout 0.1 (or `p`) everywhere and `extra`.
fn train_args(data: &str, json: &Path, extra: &[&str]) -> Vec<String> {
    train_args_at(("tiny", "0.1"), data, json, extra)
}

fn train_args_at((preset, p): (&str, &str), data: &str, json: &Path, extra: &[&str]) -> Vec<String> {
    ["train", "--preset", preset, "--data-path", data, "--log-interval", "1", "--cpu-threads", "1"]
        .iter()
        .chain(&SAME_PADDING)
        .chain(&["--hidden-dropout", p, "--attention-dropout", p])
        .chain(extra)
        .map(|s| s.to_string())
        .chain(["--log-json".to_string(), json.display().to_string()])
        .collect()
}

fn trained(o: &std::process::Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", stderr(o));
}

#[test]
fn every_layout_draws_the_single_ranks_masks() {
    // Two micro-batches of 8 against one of 16: the masks follow the sample, not the micro-batch.
    let interleaved =
        ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "8"];
    let layouts: &[(usize, &[&str])] = &[
        (8, &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel"]),
        (4, &["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]),
        (2, &["--use-distributed-optimizer"]),
        (2, &interleaved),
    ];
    layouts_draw_one_ranks_masks("tiny", layouts);
}

#[test]
fn llama_heads_draw_the_single_ranks_masks() {
    // 4 query heads in 2 groups, split over TP 2 with sequence parallelism.
    layouts_draw_one_ranks_masks("llama-tiny", &[(2, &["--tensor-model-parallel-size", "2", "--sequence-parallel"])]);
}

fn layouts_draw_one_ranks_masks(preset: &str, layouts: &[(usize, &[&str])]) {
    let dir = scratch(&format!("dropout-{preset}"));
    let data = prepared_corpus(&dir);
    let (base_json, base_ckpt) = (dir.join("base.jsonl"), dir.join("base"));
    let ten = ["--exit-interval", "10", "--save", base_ckpt.to_str().unwrap()];
    let args = train_args_at((preset, "0.1"), &data, &base_json, &ten);
    trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), "one rank");
    let base = loss_values(&base_json);
    assert_eq!(base.len(), 10);
    let base_weights = full_weights(&base_ckpt);
    // Without dropout the same run computes other losses: the masks act.
    let plain_json = dir.join("plain.jsonl");
    let args = train_args_at((preset, "0"), &data, &plain_json, &["--exit-interval", "10"]);
    trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), "no dropout");
    let plain = loss_values(&plain_json);
    assert!(plain.iter().zip(&base).skip(1).all(|(a, b)| (a - b).abs() > 1e-4), "{plain:?} vs {base:?}");

    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let (json, ckpt) = (dir.join(format!("l{i}.jsonl")), dir.join(format!("l{i}")));
        let mut args = train_args_at((preset, "0.1"), &data, &json, extra);
        args.extend(["--exit-interval", "10", "--save", ckpt.to_str().unwrap()].map(String::from));
        let what = format!("{ranks} ranks {extra:?}");
        trained(&mpirun(*ranks, &args.iter().map(String::as_str).collect::<Vec<_>>()), &what);
        assert_losses_match(&what, &loss_values(&json), &base);
        let worst = assert_weights_match(&what, &ckpt, &base_weights);
        eprintln!("{what}: losses and weights (within {worst:.1e}) equal one rank's");
    }
}

#[test]
fn recomputation_and_resumption_draw_the_same_masks() {
    let dir = scratch("dropout-again");
    let data = prepared_corpus(&dir);
    let base_json = dir.join("base.jsonl");
    let args = train_args(&data, &base_json, &["--exit-interval", "8"]);
    trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), "one rank");
    let base = loss_values(&base_json);
    assert_eq!(base.len(), 8);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let recomputes: &[&[&str]] = &[
        &["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
        &["--recompute-granularity", "selective"],
    ];
    for (i, extra) in recomputes.iter().enumerate() {
        let json = dir.join(format!("r{i}.jsonl"));
        let mut args = train_args(&data, &json, extra);
        args.extend(["--exit-interval", "8"].map(String::from));
        trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), &format!("{extra:?}"));
        assert_eq!(bits(&loss_values(&json)), bits(&base), "{extra:?} changed the losses");
    }
    // Stopped after iteration 4 and resumed: iterations 5..8 as in the uninterrupted run.
    let ckpt = dir.join("ckpt");
    let c = ckpt.to_str().unwrap();
    let first = dir.join("first.jsonl");
    let args = train_args(&data, &first, &["--exit-interval", "4", "--save", c]);
    trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), "first half");
    let second = dir.join("second.jsonl");
    let args = train_args(&data, &second, &["--exit-interval", "8", "--load", c]);
    trained(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), "resumed");
    assert_eq!(bits(&loss_values(&first)), bits(&base[..4]));
    assert_eq!(bits(&loss_values(&second)), bits(&base[4..]), "the resumed run drew other masks");
}
