//! A Llama-family model (the `llama-tiny` preset: grouped-query attention, SwiGLU, rotary
//! positions, RMSNorm, untied output layer, no linear biases) in every 1-D layout under Open MPI's
//! mpirun: tensor parallelism splitting query groups, sequence parallelism, the pipeline
//! schedules, data parallelism and ZeRO-1, recomputation, bf16, computing the single-rank run; a
//! resumed run bit-exact; `convert` to one rank and back continuing the same losses; and the
//! layouts a Llama cannot take failing with one clear error.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    o
}

/// `trident train --preset llama-tiny` on `ranks` ranks with the concatenated flags (padded the
/// same at every layout).
fn train_on(ranks: usize, args: &[&[&str]]) -> Output {
    let args: Vec<&str> =
        ["train", "--preset", "llama-tiny", "--eval-iters", "0"].into_iter().chain(SAME_PADDING).chain(args.concat()).collect();
    if ranks == 1 {
        run(&args)
    } else {
        mpirun(ranks, &args)
    }
}

/// Losses within `rel` of `base`, iteration by iteration; returns the largest relative difference.
fn assert_losses(what: &str, got: &[f64], base: &[f64], rel: f64) -> f64 {
    assert_eq!(got.len(), base.len(), "{what}");
    let mut worst = 0f64;
    for (it, (a, b)) in got.iter().zip(base).enumerate() {
        assert!((a - b).abs() <= rel * b.abs(), "{what}: iteration {}: loss {a} vs single-rank {b}", it + 1);
        worst = worst.max((a - b).abs() / b.abs());
    }
    worst
}

#[test]
fn llama_layouts_compute_the_single_rank_run() {
    let dir = scratch("llama-layouts");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    // The preset's own recipe (1500 iterations, warmup 100), stopped after 10.
    let common = ["--data-path", &data, "--exit-interval", "10", "--log-interval", "1"];
    ok(train_on(1, &[&common, &["--log-json", &p("base.jsonl"), "--save", &p("base")]]), "one rank");
    let base = loss_values(Path::new(&p("base.jsonl")));
    assert_eq!(base.len(), 10);
    let base_weights = full_weights(Path::new(&p("base")));
    let tp2pp2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"];
    let layouts: &[(usize, &[&[&str]])] = &[
        // The layout: TP 2 x PP 2 x DP 2 with sequence parallelism and ZeRO-1.
        (8, &[&tp2pp2, &["--sequence-parallel", "--use-distributed-optimizer"]]),
        // Query groups split over 2 ranks (one group each), full recompute.
        (2, &[&["--tensor-model-parallel-size", "2", "--recompute-granularity", "full"]]),
        // Interleaved 1F1B over 2 stages of 2 virtual stages (two micro-batches of 8).
        (2, &[&["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "8"]]),
        (2, &[&["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "gpipe"]]),
        (4, &[&["--recompute-granularity", "selective", "--use-distributed-optimizer"]]),
    ];
    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let (json, ckpt) = (p(&format!("l{i}.jsonl")), p(&format!("l{i}")));
        let what = format!("{ranks} ranks {extra:?}");
        ok(train_on(*ranks, &[&common, &["--log-json", &json, "--save", &ckpt], &extra.concat()]), &what);
        let worst = assert_losses(&what, &loss_values(Path::new(&json)), &base, 1e-5);
        let mut weight_abs = 0f32;
        for ((name, w), (_, b)) in full_weights(Path::new(&ckpt)).iter().zip(&base_weights) {
            let diff = w.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= 1e-5, "{what}: {name} differs from the single-rank run by {diff}");
            weight_abs = weight_abs.max(diff);
        }
        eprintln!("{what}: losses within {worst:.1e} relative, weights within {weight_abs:.1e}");
    }
    // bf16: the same layout against one rank in bf16, within bf16's rounding of the activations.
    ok(train_on(1, &[&common, &["--bf16", "--log-json", &p("bf16.jsonl")]]), "bf16 one rank");
    let tp2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--bf16"];
    ok(train_on(2, &[&common, &tp2, &["--log-json", &p("bf16-tp2.jsonl")]]), "bf16 TP 2");
    let bf16 = loss_values(Path::new(&p("bf16.jsonl")));
    assert_losses("bf16 TP 2", &loss_values(Path::new(&p("bf16-tp2.jsonl"))), &bf16, 2e-2);
    assert_losses("bf16 one rank against f32", &bf16, &base, 2e-2);
}

#[test]
fn a_llama_resumes_bit_exactly_and_converts_to_one_rank_and_back() {
    let dir = scratch("llama-resume");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    let common = ["--data-path", &data, "--train-iters", "10", "--log-interval", "1"];
    let tp2pp2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel"];
    ok(train_on(4, &[&common, &tp2pp2, &["--log-json", &p("whole.jsonl")]]), "uninterrupted");
    ok(train_on(4, &[&common, &tp2pp2, &["--save", &p("orig"), "--exit-interval", "6"]]), "first half");
    ok(train_on(4, &[&common, &tp2pp2, &["--load", &p("orig"), "--log-json", &p("resumed.jsonl")]]), "resumed");
    let whole = loss_values(Path::new(&p("whole.jsonl")));
    let resumed = loss_values(Path::new(&p("resumed.jsonl")));
    assert_eq!(resumed.len(), 4);
    for (a, b) in resumed.iter().zip(&whole[6..]) {
        assert_eq!(a.to_bits(), b.to_bits(), "resumed loss {a} vs uninterrupted {b}");
    }
    ok(run(&["convert", "--load", &p("orig"), "--save", &p("one")]), "convert to one rank");
    let back = ["--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"];
    ok(run(&["convert", "--load", &p("one"), "--save", &p("back"), back[0], back[1], back[2], back[3]]), "and back");
    ok(train_on(1, &[&common, &["--load", &p("one"), "--log-json", &p("one.jsonl")]]), "one rank");
    ok(train_on(4, &[&common, &tp2pp2, &["--load", &p("back"), "--log-json", &p("back.jsonl")]]), "back");
    for name in ["one.jsonl", "back.jsonl"] {
        assert_losses(name, &loss_values(Path::new(&p(name))), &whole[6..], 1e-5);
    }
    // Resuming a Llama checkpoint as GPT-2 is one clear error naming the difference.
    let o = run(&["train", "--preset", "tiny", "--data-path", &data, "--load", &p("one"), "--train-iters", "12"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("normalization is RMSNorm in the checkpoint but GPT-2's default here"), "{}", stderr(&o));
}

#[test]
fn what_a_llama_cannot_do_yet_is_one_clear_error() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--tensor-model-parallel-size", "4"], &["--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"]),
        (&["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"], &["2-D / 2.5-D", "RMSNorm, SwiGLU"]),
        (&["--device", "cuda"], &["train --device cuda with RMSNorm", "needs --bf16 or --fp16", "16-bit"]),
        (&["--device", "hip"], &["train --device hip with RMSNorm", "needs --bf16 or --fp16", "16-bit activations"]),
        (&["--num-query-groups", "2"], &["--num-query-groups needs --group-query-attention"]),
        (&["--rotary-percent", "0.3"], &["--rotary-percent 0.3", "even number"]),
    ];
    for (flags, needles) in cases {
        let ranks = if flags.contains(&"4") { 4 } else { 1 };
        let o = train_on(ranks, &[&["--data-path", "nowhere"], flags]);
        assert!(!o.status.success(), "{flags:?} ran");
        let err = stderr(&o);
        for n in *needles {
            assert!(err.contains(n), "{flags:?}: '{n}' not in: {err}");
        }
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
    // GPT-2 tiny with a rotary flag but learned positions: the flag needs rope.
    let o = run(&["train", "--preset", "tiny", "--data-path", "x", "--rotary-base", "500000"]);
    assert!(stderr(&o).contains("--rotary-base needs --position-embedding-type rope"), "{}", stderr(&o));
}
