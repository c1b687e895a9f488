//! `--check-for-nan-in-loss-and-grad` (on by default): a checkpoint with a NaN planted in one
//! weight, resumed on one rank and on a two-stage pipeline under mpirun, stops every rank with one
//! line naming the iteration and the rank whose loss went non-finite, exits non-zero and writes no
//! checkpoint of the bad step; `--no-check-for-nan-in-loss-and-grad` trains on through it.

mod common;
use common::*;
use std::path::Path;
use trident::checkpoint::convert::{read_full, write_layout, Layout};

/// `train` arguments of a 2-layer model resumed from `load` (or fresh), saving every iteration.
fn train_args(data: &str, iters: &str, save: &Path, load: Option<&Path>, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--data-path", data, "--train-iters", iters, "--lr-decay-iters", "8", "--save-interval", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(SMALL.iter().map(|s| s.to_string()));
    a.extend(["--save".to_string(), save.display().to_string()]);
    a.extend(SAME_PADDING.iter().map(|s| s.to_string()));
    if let Some(l) = load {
        a.extend(["--load".to_string(), l.display().to_string()]);
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// Writes the checkpoint in `from` to `to` as layout `layout`, with one element of layer 0's
/// first weight set to NaN.
fn plant_nan(from: &Path, to: &Path, layout: Layout) -> String {
    let mut full = read_full(from).unwrap();
    let name = full
        .tensors
        .keys()
        .find(|k| k.starts_with("param/") && k.contains("layers.0.") && k.ends_with("weight"))
        .cloned()
        .expect("a weight of layer 0");
    full.tensors.get_mut(&name).unwrap()[3] = f32::NAN;
    write_layout(&full, to, layout).unwrap();
    name
}

/// The iterations checkpointed in `dir` (none when it holds no checkpoint).
fn saved_iterations(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("iter_"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_planted_nan_stops_every_rank_before_a_checkpoint() {
    let dir = scratch("nan-check");
    let data = prepared_corpus(&dir);
    let good = dir.join("good");
    let o = run(&strs(&train_args(&data, "2", &good, None, &[])));
    assert!(o.status.success(), "{}", stderr(&o));

    // One rank: the NaN reaches the loss of rank 0 at iteration 3, the first after the load.
    let bad = dir.join("bad-1");
    plant_nan(&good, &bad, Layout::single());
    let out = dir.join("out-1");
    let o = run(&strs(&train_args(&data, "4", &out, Some(&bad), &[])));
    assert_clean_error(&o, &["iteration 3:", "not finite", "non-finite loss on rank 0 of 1", "before any checkpoint"]);
    assert!(saved_iterations(&out).is_empty(), "a checkpoint was written: {:?}", saved_iterations(&out));

    // Two pipeline stages: the NaN is in stage 0's layer, the loss is on stage 1 (rank 1); both
    // ranks stop, the error is said once, and neither writes a checkpoint.
    let bad2 = dir.join("bad-pp2");
    plant_nan(&good, &bad2, Layout { pp: 2, ..Layout::single() });
    let out2 = dir.join("out-pp2");
    let args = train_args(&data, "4", &out2, Some(&bad2), &["--pipeline-model-parallel-size", "2"]);
    let o = mpirun(2, &strs(&args));
    assert_one_error(&o, &["iteration 3:", "not finite", "non-finite loss on rank 1 of 2", "before any checkpoint"]);
    assert!(saved_iterations(&out2).is_empty(), "a checkpoint was written: {:?}", saved_iterations(&out2));

    // Two data-parallel replicas both hold the NaN: both ranks are named.
    let out3 = dir.join("out-dp2");
    let o = mpirun(2, &strs(&train_args(&data, "4", &out3, Some(&bad), &[])));
    assert_one_error(&o, &["iteration 3:", "non-finite loss on ranks 0 and 1 of 2"]);
    assert!(saved_iterations(&out3).is_empty(), "a checkpoint was written: {:?}", saved_iterations(&out3));

    // Without the check the run trains on to its end, says so, and logs the NaN (null in JSON).
    let out4 = dir.join("out-off");
    let json = dir.join("off.jsonl");
    let off = ["--no-check-for-nan-in-loss-and-grad", "--log-json", json.to_str().unwrap()];
    let o = mpirun(2, &strs(&train_args(&data, "4", &out4, Some(&bad2), &[&off[..], &["--pipeline-model-parallel-size", "2"]].concat())));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("iteration 3: loss NaN"), "{}", stdout(&o));
    assert!(stdout(&o).contains("training on (--no-check-for-nan-in-loss-and-grad)"), "{}", stdout(&o));
    assert_eq!(saved_iterations(&out4).len(), 2, "{:?}", saved_iterations(&out4));
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.lines().all(|l| l.contains("\"loss\": null")), "{text}");

    // Both switches at once is one usage error.
    let o = run(&strs(&train_args(&data, "4", &out4, None, &["--check-for-nan-in-loss-and-grad", off[0]])));
    assert_clean_error(&o, &["contradict"]);
}
