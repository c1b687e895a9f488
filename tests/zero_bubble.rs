//! Zero-bubble V under Open MPI's mpirun, beyond `parallel.rs`'s losses against one rank: its
//! checkpoints resume bit for bit, reshard with `trident convert` to other layouts and back into
//! the V, and are refused by name under a schedule that places layers otherwise; layouts the V
//! cannot take fail once with one clear line.

mod common;
use common::*;
use std::path::Path;

/// A `train` run of the 8-layer preset for 10 iterations (`--exit-interval` in `extra` stops it
/// sooner) logging every loss to `json`, saving to `ckpt`.
fn run_args(data: &str, json: &Path, ckpt: &Path, extra: &[&str]) -> Vec<String> {
    let (json, ckpt) = (json.to_str().unwrap(), ckpt.to_str().unwrap());
    let mut args: Vec<String> = ["train", "--preset", "small", "--data-path", data, SAME_PADDING[0], SAME_PADDING[1]]
        .iter()
        .chain(&["--train-iters", "10", "--log-interval", "1", "--log-json", json, "--save", ckpt])
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn mpirun_args(ranks: usize, args: &[String]) -> std::process::Output {
    mpirun(ranks, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A zb-v run saved after 5 iterations resumes under zb-v with the uninterrupted run's losses
/// bit for bit; `trident convert` takes its checkpoint to one stage (within f32 rounding of the
/// same losses) and back into a V; 1F1B refuses the V's checkpoint on every rank, naming the fix.
#[test]
fn zero_bubble_v_checkpoints_resume_exactly_and_reshard() {
    let dir = scratch("zbv-resume");
    let data = prepared_corpus(&dir);
    let zbv: Vec<&str> = vec!["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-v"];
    let (whole_json, whole_ckpt) = (dir.join("whole.jsonl"), dir.join("whole"));
    let o = mpirun_args(2, &run_args(&data, &whole_json, &whole_ckpt, &zbv));
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = logged_losses(&whole_json);
    assert_eq!(whole.len(), 10);
    let ckpt = dir.join("ckpt");
    let half: Vec<&str> = zbv.iter().chain(&["--save-interval", "5", "--exit-interval", "5"]).copied().collect();
    let o = mpirun_args(2, &run_args(&data, &dir.join("half.jsonl"), &ckpt, &half));
    assert!(o.status.success(), "{}", stderr(&o));
    // One stage, and a V again, through convert.
    let (one, back) = (dir.join("one"), dir.join("back"));
    let convert = |to: &Path, extra: &[&str]| {
        let mut a = vec!["convert", "--load", ckpt.to_str().unwrap(), "--save", to.to_str().unwrap()];
        a.extend_from_slice(extra);
        let o = run(&a);
        assert!(o.status.success(), "convert {extra:?}: {}", stderr(&o));
    };
    convert(&one, &[]);
    convert(&back, &["--target-pipeline-parallel-size", "2", "--target-pipeline-schedule", "zb-v"]);
    for (name, ranks, flags, from, exact) in [
        ("zb-v", 2, zbv.clone(), &ckpt, true),
        ("one rank", 1, vec![], &one, false),
        ("converted zb-v", 2, zbv.clone(), &back, true),
    ] {
        let json = dir.join(format!("resumed-{}.jsonl", name.replace(' ', "-")));
        let mut args = run_args(&data, &json, &dir.join(format!("after-{name}")), &flags);
        args.extend(["--load".to_string(), from.to_str().unwrap().to_string()]);
        let o = mpirun_args(ranks, &args);
        assert!(o.status.success(), "resume {name}: {}", stderr(&o));
        let resumed = logged_losses(&json);
        assert_eq!(resumed.len(), 5, "resume {name} logs iterations 6 to 10");
        for ((it, got), (want_it, want)) in resumed.iter().zip(&whole[5..]) {
            assert_eq!(it, want_it);
            let (a, b): (f64, f64) = (got.parse().unwrap(), want.parse().unwrap());
            let ok = if exact { got == want } else { (a - b).abs() <= 1e-5 * b.abs() };
            assert!(ok, "{name} resumed, iteration {it}: {a} vs {b}");
        }
    }
    let one_f_one_b = ["--pipeline-model-parallel-size", "2", "--load", ckpt.to_str().unwrap()];
    let o = mpirun_args(2, &run_args(&data, &dir.join("refused.jsonl"), &dir.join("refused"), &one_f_one_b));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("in zb-v's V") && err.contains("--pipeline-schedule zb-v"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn layouts_the_v_cannot_take_fail_once_on_every_rank() {
    let dir = scratch("zbv-bad");
    let data = prepared_corpus(&dir);
    let (pp2, zbv) = (["--pipeline-model-parallel-size", "2"], ["--pipeline-schedule", "zb-v"]);
    let cases: [(usize, Vec<&str>, &str); 3] = [
        (1, zbv.to_vec(), "two model chunks on each of at least two stages"),
        (
            2,
            [&pp2[..], &zbv, &["--num-layers-per-virtual-pipeline-stage", "1"]].concat(),
            "this layout has 2 stage(s) of 4",
        ),
        (2, [&pp2[..], &zbv, &["--num-layers", "6"]].concat(), "do not split evenly"),
    ];
    for (ranks, flags, want) in cases {
        let json = dir.join("bad.jsonl");
        let o = mpirun_args(ranks, &run_args(&data, &json, &dir.join("bad"), &flags));
        assert!(!o.status.success(), "{flags:?} ran");
        let err = stderr(&o);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(want)).collect();
        assert_eq!(lines.len(), 1, "{flags:?}: one line naming the problem, got:\n{err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
