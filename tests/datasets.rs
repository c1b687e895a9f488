//! Megatron's data recipe, sample for sample: for blends of two and three datasets with
//! Megatron-style splits, for an unweighted blend, a lone weighted dataset, per-split blends
//! (`--train-data-path` …) and `--mock-data`, the token ids of the first 1,000 samples of each
//! split (every validation and test sample here) that `trident check data` writes equal those of
//! megatron-core 0.16.1's `BlendedMegatronDatasetBuilder` + `GPTDataset` built from the same
//! seed, lengths, split and counts (tests/datasets_compare.py; skipped, loudly, without
//! megatron-core). Also: `train` trains on a blend and on mock data, and conflicting or broken
//! data flags are one clear error.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Three uint16 datasets of different sizes and document lengths (a fixed LCG), tokens < 256.
fn write_datasets(dir: &Path) -> Vec<String> {
    let mut state = 12345u64;
    let mut next = |bound: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % bound
    };
    [(1500usize, 40u64), (2600, 24), (1100, 90)]
        .iter()
        .enumerate()
        .map(|(k, &(docs, max_len))| {
            let docs: Vec<Vec<u16>> = (0..docs)
                .map(|d| (0..1 + next(max_len)).map(|t| ((k * 50 + d * 7 + t as usize) % 256) as u16).collect())
                .collect();
            let prefix = dir.join(format!("d{k}"));
            write_u16_dataset(&prefix, &docs);
            prefix.display().to_string()
        })
        .collect()
}

/// The run every case sizes its splits by: 4,000 training samples, 6 validations of 5 global
/// batches (240 samples), one test pass (40).
const RUN: &str = "--seq-length 32 --micro-batch-size 8 --global-batch-size 8 --train-iters 500 \
                   --eval-interval 100 --eval-iters 5 --seed 77";
const COUNTS: &str = "[4000, 240, 40]";

/// A case: trident's data flags, and the same data for datasets_compare.py (as JSON members).
fn cases(d: &[String]) -> Vec<(String, String)> {
    let list = |items: &[&str]| format!("[{}]", items.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", "));
    let (a, b, c) = (d[0].as_str(), d[1].as_str(), d[2].as_str());
    vec![
        (
            format!("--data-path 0.3 {a} 0.7 {b} --split 969,30,1"),
            format!("\"data_path\": {}, \"split\": \"969,30,1\"", list(&["0.3", a, "0.7", b])),
        ),
        (
            format!("--data-path 2 {a} 5 {b} 3 {c} --split 969,30,1"),
            format!("\"data_path\": {}, \"split\": \"969,30,1\"", list(&["2", a, "5", b, "3", c])),
        ),
        (
            format!("--data-path 0.25 {c} 0.75 {a} --split 90,8,2 --mid-level-dataset-surplus 0.05"),
            format!("\"data_path\": {}, \"split\": \"90,8,2\", \"surplus\": 0.05", list(&["0.25", c, "0.75", a])),
        ),
        (format!("--data-path {a} {b} {c} --split 98,2"), format!("\"data_path\": {}, \"split\": \"98,2\"", list(&[a, b, c]))),
        (format!("--data-path 1.5 {b} --split 949,50,1"), format!("\"data_path\": {}, \"split\": \"949,50,1\"", list(&["1.5", b]))),
        (
            format!("--train-data-path 0.6 {a} 0.4 {c} --valid-data-path {b} --test-data-path {a} {c}"),
            format!("\"per_split\": [{}, {}, {}]", list(&["0.6", a, "0.4", c]), list(&[b]), list(&[a, c])),
        ),
        ("--mock-data".to_string(), "\"mock\": true".to_string()),
    ]
}

fn dump(dir: &Path, flags: &str, name: &str) -> PathBuf {
    let out = dir.join(format!("{name}.jsonl"));
    let mut args: Vec<String> = ["check", "data"].iter().map(|s| s.to_string()).collect();
    args.extend(flags.split_whitespace().chain(RUN.split_whitespace()).map(String::from));
    args.extend(["--dump".into(), out.display().to_string(), "--dump-samples".into(), "2000".into()]);
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert!(o.status.success(), "check data {flags}: {}", stderr(&o));
    out
}

#[test]
fn samples_equal_megatron_cores() {
    let dir = scratch("datasets-megatron");
    let data = write_datasets(&dir);
    let python = python_with("megatron.core", "tests/datasets.rs does not compare samples with megatron-core's");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/datasets_compare.py");
    let mut ours = Vec::new();
    let mut theirs_args = Vec::new();
    for (n, (flags, spec)) in cases(&data).iter().enumerate() {
        let text = std::fs::read_to_string(dump(&dir, flags, &format!("ours{n}"))).unwrap();
        let count = |split: &str| text.lines().filter(|l| l.contains(&format!("\"split\": \"{split}\""))).count();
        // Every split the run reads is there, the validation split whole (an unweighted blend
        // offers at most one epoch of each dataset, here 69 validation samples) except the mock
        // data's, a third of 205 million tokens.
        let whole_valid = (69..2000).contains(&count("valid")) || (flags == "--mock-data" && count("valid") == 2000);
        assert!(count("train") == 2000 && whole_valid, "{flags}: {}", count("valid"));
        let surplus = if spec.contains("surplus") { String::new() } else { ", \"surplus\": 0.005".into() };
        theirs_args.push(format!(
            "{{\"seed\": 77, \"seq_length\": 32, \"counts\": {COUNTS}, \"per_split_samples\": 2000, \"vocab\": 257, \
             \"eod\": 256{surplus}, {spec}}}"
        ));
        theirs_args.push(dir.join(format!("theirs{n}.jsonl")).display().to_string());
        ours.push((flags.clone(), text));
    }
    let Some(py) = &python else { return };
    // One run for every case: megatron-core takes seconds to import.
    let o = Command::new(py).arg(script).args(&theirs_args).output().unwrap();
    assert!(o.status.success(), "megatron-core on {theirs_args:?}: {}", stderr(&o));
    for (n, (flags, text)) in ours.iter().enumerate() {
        let lines: Vec<&str> = text.lines().collect();
        let theirs = std::fs::read_to_string(&theirs_args[2 * n + 1]).unwrap();
        let first_difference = lines.iter().zip(theirs.lines()).position(|(a, b)| *a != b);
        assert_eq!(first_difference, None, "{flags}: first different sample, line {first_difference:?}");
        assert_eq!(lines.len(), theirs.lines().count(), "{flags}: sample counts");
    }
}

#[test]
fn trains_on_a_blend_and_on_mock_data() {
    let dir = scratch("datasets-train");
    let data = write_datasets(&dir);
    let tiny = "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 4 \
                --global-batch-size 8 --train-iters 4 --eval-interval 2 --eval-iters 1 --log-interval 1 --cpu-threads 1";
    for data_flags in [format!("--data-path 0.5 {} 0.5 {} --split 90,8,2", data[0], data[2]), "--mock-data".into()] {
        let log = dir.join("log.jsonl");
        let _ = std::fs::remove_file(&log);
        let o = Command::new(BIN)
            .args(tiny.split_whitespace())
            .args(data_flags.split_whitespace())
            .arg("--log-json")
            .arg(&log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{data_flags}: {}", stderr(&o));
        let losses = loss_values(&log);
        assert_eq!(losses.len(), 4, "{data_flags}");
        assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0), "{data_flags}: {losses:?}");
        assert!(stdout(&o).contains("validation"), "{data_flags}: {}", stdout(&o));
    }
}

#[test]
fn data_flag_mistakes_are_one_clear_error() {
    let dir = scratch("datasets-errors");
    let data = write_datasets(&dir);
    let (a, b) = (data[0].as_str(), data[1].as_str());
    let cases: Vec<(String, &str)> = vec![
        (format!("--data-path {a} --mock-data"), "give one source of data"),
        (format!("--data-path {a} --train-data-path {b}"), "give one source of data"),
        (format!("--train-data-path {a} --split 90,10"), "--split divides --data-path"),
        (format!("--data-path 0.5 {a} x {b}"), "flag --data-path"),
        (format!("--data-path 0 {a} 1 {b}"), "a positive number"),
        (format!("--data-path 1 {a} 1 {b} --split 10000,0,1"), "has none of its"),
        (format!("--data-path 1 {a} 1 {}/missing", dir.display()), "missing"),
        ("--seq-length 32".to_string(), "no data"),
    ];
    for (flags, needle) in cases {
        let o = Command::new(BIN).args(["check", "data"]).args(flags.split_whitespace()).output().unwrap();
        assert_clean_error(&o, &[needle]);
    }
}

#[test]
fn cached_indexes_are_reused_and_checked() {
    let dir = scratch("datasets-cache");
    let data = write_datasets(&dir);
    let cache = dir.join("cache");
    let flags = format!("--data-path 0.4 {} 0.6 {} --split 90,8,2 --data-cache-path {}", data[0], data[2], cache.display());
    let first = std::fs::read_to_string(dump(&dir, &flags, "first")).unwrap();
    let files = || {
        let mut names: Vec<String> =
            std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    let written = files();
    // Three splits of two GPT datasets (4 files each) and their three blends (3 files each).
    assert_eq!(written.len(), 3 * 2 * 4 + 3 * 3, "{written:?}");
    assert!(written.iter().any(|n| n.ends_with("-BlendedDataset-valid-dataset_index.npy")), "{written:?}");
    // A second run loads them: the same samples, nothing new written.
    let again = std::fs::read_to_string(dump(&dir, &flags, "again")).unwrap();
    assert_eq!(first, again);
    assert_eq!(files(), written);
    // A cached index that does not fit the data is one error naming the file.
    let shuffle = written.iter().find(|n| n.contains("GPTDataset-train-shuffle_index")).unwrap();
    let path = cache.join(shuffle);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let mut args = vec!["check".to_string(), "data".into()];
    args.extend(flags.split_whitespace().chain(RUN.split_whitespace()).map(String::from));
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert_clean_error(&o, &[shuffle, "delete it"]);
    // Another seed is another entry.
    let reseeded: Vec<String> = args.iter().map(|a| if a == "77" { "78".into() } else { a.clone() }).collect();
    let o = Command::new(BIN).args(&reseeded).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(files().len(), 2 * written.len());
}
