//! The learning-rate and weight-decay schedules against megatron-core's
//! `OptimizerParamScheduler`: for each decay style (constant, linear, cosine,
//! inverse-square-root, WSD with each anneal), by iterations and by samples, with a warmup
//! fraction and start, and weight decay growing linearly and by cosine, the rate and decay every
//! iteration trains with equal megatron-core's to 1e-7 (relative), the schedule built by `train`'s
//! own flag parsing. The test runs megatron-core when installed (`.ci/run` installs it) and says
//! it skips otherwise. Also: `train` logs the schedule's rate, the weight-decay schedule reaches
//! the optimizer, `--decoupled-lr` rates the embedding and output layer alone, and mixed or
//! missing flags are one clear error.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use trident::config::TrainConfig;

/// A case: trident's flags and Megatron's arguments (by their names, as JSON) for the same run.
struct Case {
    flags: &'static str,
    megatron: &'static str,
}

const CASES: &[Case] = &[
    Case { flags: "--lr-decay-style cosine", megatron: r#""lr_decay_style": "cosine""# },
    Case {
        flags: "--lr-decay-style linear --lr-decay-iters 80",
        megatron: r#""lr_decay_style": "linear", "lr_decay_iters": 80"#,
    },
    Case { flags: "--lr-decay-style constant", megatron: r#""lr_decay_style": "constant""# },
    Case { flags: "--lr-decay-style inverse-square-root", megatron: r#""lr_decay_style": "inverse-square-root""# },
    Case {
        flags: "--lr-decay-style WSD --lr-wsd-decay-iters 30",
        megatron: r#""lr_decay_style": "WSD", "lr_wsd_decay_iters": 30"#,
    },
    Case {
        flags: "--lr-decay-style WSD --lr-wsd-decay-style linear --lr-wsd-decay-iters 30 --lr-decay-iters 90",
        megatron: r#""lr_decay_style": "WSD", "lr_wsd_decay_style": "linear", "lr_wsd_decay_iters": 30, "lr_decay_iters": 90"#,
    },
    Case {
        flags: "--lr-decay-style WSD --lr-wsd-decay-style cosine --lr-wsd-decay-iters 25",
        megatron: r#""lr_decay_style": "WSD", "lr_wsd_decay_style": "cosine", "lr_wsd_decay_iters": 25"#,
    },
    Case {
        flags: "--lr-decay-style WSD --lr-wsd-decay-style minus_sqrt --lr-wsd-decay-iters 40",
        megatron: r#""lr_decay_style": "WSD", "lr_wsd_decay_style": "minus_sqrt", "lr_wsd_decay_iters": 40"#,
    },
    Case {
        flags: "--lr-decay-style cosine --lr-warmup-fraction 0.07 --lr-warmup-init 1e-5",
        megatron: r#""lr_decay_style": "cosine", "lr_warmup_fraction": 0.07, "lr_warmup_init": 1e-5"#,
    },
    Case {
        flags:
            "--lr-decay-style linear --weight-decay-incr-style linear --start-weight-decay 0.01 --end-weight-decay 0.1",
        megatron: r#""lr_decay_style": "linear", "weight_decay_incr_style": "linear", "start_weight_decay": 0.01, "end_weight_decay": 0.1"#,
    },
    Case {
        flags: "--lr-decay-style cosine --weight-decay-incr-style cosine --start-weight-decay 0 --end-weight-decay 0.2",
        megatron: r#""lr_decay_style": "cosine", "weight_decay_incr_style": "cosine", "start_weight_decay": 0.0, "end_weight_decay": 0.2"#,
    },
    Case {
        flags: "--train-samples 1000 --lr-decay-samples 900 --lr-warmup-samples 100 --lr-decay-style cosine",
        megatron: r#""train_samples": 1000, "lr_decay_samples": 900, "lr_warmup_samples": 100, "lr_decay_style": "cosine""#,
    },
    Case {
        flags: "--train-samples 1003 --lr-warmup-samples 52 --lr-decay-style WSD --lr-wsd-decay-samples 300",
        megatron: r#""train_samples": 1003, "lr_warmup_samples": 52, "lr_decay_style": "WSD", "lr_wsd_decay_samples": 300"#,
    },
    Case {
        flags: "--lr-decay-style cosine --decoupled-lr 5e-4 --decoupled-min-lr 4.5e-5",
        megatron: r#""lr_decay_style": "cosine", "decoupled_lr": 5e-4, "decoupled_min_lr": 4.5e-5"#,
    },
    Case {
        flags: "--train-samples 1000 --lr-warmup-samples 40 --lr-decay-style linear --decoupled-lr 1e-3",
        megatron: r#""train_samples": 1000, "lr_warmup_samples": 40, "lr_decay_style": "linear", "decoupled_lr": 1e-3"#,
    },
    Case {
        flags: "--train-samples 960 --lr-warmup-fraction 0.1 --lr-decay-style inverse-square-root",
        megatron: r#""train_samples": 960, "lr_warmup_fraction": 0.1, "lr_decay_style": "inverse-square-root""#,
    },
];

/// Every case shares a model, a global batch of 8, a peak and a floor; iteration cases run 120
/// iterations with 10 of warmup unless they say otherwise.
const COMMON: &str = "--data-path unused --global-batch-size 8 --micro-batch-size 8 --lr 3e-4 --min-lr 3e-5";

fn trident_config(flags: &str) -> Result<TrainConfig, String> {
    let mut words: Vec<String> = COMMON.split(' ').chain(flags.split(' ')).map(String::from).collect();
    if !flags.contains("--train-samples") {
        words.extend("--train-iters 120".split(' ').map(String::from));
        if !flags.contains("--lr-warmup-fraction") {
            words.extend("--lr-warmup-iters 10".split(' ').map(String::from));
        }
    }
    let args = trident::cli::parse("train", trident::flags::TRAIN_FLAGS, &words).map_err(|e| e.to_string())?.unwrap();
    TrainConfig::from_args(&args).map_err(|e| e.to_string())
}

fn megatron_args(case: &Case) -> String {
    let mut fields =
        vec![r#""global_batch_size": 8, "lr": 3e-4, "min_lr": 3e-5"#.to_string(), case.megatron.to_string()];
    if !case.megatron.contains("train_samples") {
        fields.push(r#""train_iters": 120"#.into());
        if !case.megatron.contains("lr_warmup_fraction") {
            fields.push(r#""lr_warmup_iters": 10"#.into());
        }
    }
    format!("{{{}}}", fields.join(", "))
}

/// `[[[lr, wd, lr2], ...], ...]` as numbers.
fn parse_lists(text: &str) -> Vec<Vec<[f64; 3]>> {
    let mut out = Vec::new();
    for case in text.trim().trim_start_matches("[[").trim_end_matches("]]").split("]], [[") {
        let pairs = case.split("], [").map(|p| {
            let v: Vec<f64> = p.trim_matches(['[', ']']).split(',').map(|x| x.trim().parse().unwrap()).collect();
            [v[0], v[1], v[2]]
        });
        out.push(pairs.collect());
    }
    out
}

#[test]
fn every_schedule_equals_megatron_cores() {
    let Some(py) = python_with("megatron.core", "the schedules are not compared with megatron-core") else { return };
    let cases = format!("[{}]", CASES.iter().map(megatron_args).collect::<Vec<_>>().join(", "));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schedules_compare.py");
    let o = Command::new(&py).args([script, &cases]).output().expect("python runs");
    assert!(o.status.success(), "schedules_compare.py: {}", stderr(&o));
    let theirs = parse_lists(&stdout(&o));
    assert_eq!(theirs.len(), CASES.len());
    for (case, want) in CASES.iter().zip(&theirs) {
        let cfg = trident_config(case.flags).unwrap_or_else(|e| panic!("{}: {e}", case.flags));
        assert_eq!(cfg.train_iters as usize, want.len(), "{}: iterations", case.flags);
        let mut worst = 0f64;
        for (it, [lr, wd, lr2]) in want.iter().enumerate() {
            let samples = (it * cfg.global_batch_size) as u64;
            let decoupled = cfg.lr.decoupled_lr(samples).unwrap_or(cfg.lr.lr(samples));
            let pairs = [("lr", cfg.lr.lr(samples), *lr), ("wd", cfg.lr.weight_decay(samples), *wd)];
            for (what, ours, theirs) in pairs.into_iter().chain([("decoupled lr", decoupled, *lr2)]) {
                let rel = (ours - theirs).abs() / theirs.abs().max(1e-30);
                assert!(
                    rel <= 1e-7 || (ours - theirs).abs() <= 1e-15,
                    "{}: iteration {}: {what} {ours} vs megatron-core {theirs}",
                    case.flags,
                    it + 1
                );
                worst = worst.max(if theirs == 0.0 { 0.0 } else { rel });
            }
        }
        eprintln!("{}: {} iterations, worst relative difference {worst:.1e}", case.flags, want.len());
    }
}

#[test]
fn mixed_or_missing_schedule_flags_are_one_clear_error() {
    for (flags, needle) in [
        ("--train-samples 800 --lr-decay-iters 50", "--lr-decay-iters does not go with --train-samples"),
        ("--lr-warmup-samples 80", "--lr-warmup-samples does not go with --train-iters"),
        ("--lr-decay-style WSD", "needs --lr-wsd-decay-iters or --lr-wsd-decay-samples"),
        ("--lr-decay-style WSD --lr-wsd-decay-style square --lr-wsd-decay-iters 5", "--lr-wsd-decay-style"),
        ("--lr-decay-style step", "inverse-square-root or WSD"),
        ("--weight-decay-incr-style linear", "needs --start-weight-decay and --end-weight-decay"),
        ("--start-weight-decay 0.1 --end-weight-decay 0.2", "need --weight-decay-incr-style linear or cosine"),
        ("--weight-decay-incr-style linear --start-weight-decay 0.2 --end-weight-decay 0.1", "<= --end-weight-decay"),
        ("--lr-warmup-fraction 0.1 --lr-warmup-iters 3", "--lr-warmup-fraction or a warmup count"),
        ("--lr-warmup-init 1", "above --lr"),
        ("--decoupled-min-lr 1e-5", "--decoupled-min-lr needs --decoupled-lr"),
        ("--decoupled-lr 1e-4 --decoupled-min-lr 1e-3", "<= --decoupled-lr"),
        ("--train-samples 5", "less than one global batch"),
    ] {
        let e = trident_config(flags).err().unwrap_or_else(|| panic!("{flags}: accepted"));
        assert!(e.contains(needle), "{flags}: {e}");
    }
}

#[test]
fn train_follows_the_schedule_and_its_weight_decay() {
    let dir = scratch("schedules-train");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    let train = |json: &str, extra: &[&str]| {
        let mut args = one_thread_train_args(&data, 8, 6);
        args.extend(["--log-json".to_string(), p(json)]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read_to_string(dir.join(json)).unwrap()
    };
    // The logged rates are the schedule's at the samples consumed before each iteration: from 0
    // (Megatron's first warmup step trains at --lr-warmup-init).
    let log = train("plain.jsonl", &["--weight-decay", "0"]);
    // one_thread_train_args: --lr 1e-3 (so --min-lr 0), 4 of 6 iterations of warmup, cosine; a
    // global batch of 8.
    let schedule = trident::optim::lr::LrSchedule {
        init_lr: 0.0,
        max_lr: 1e-3,
        min_lr: 0.0,
        warmup_steps: 32.0,
        decay_steps: 48,
        style: trident::optim::lr::DecayStyle::Cosine,
        wsd_decay_steps: 0,
        start_wd: 0.0,
        end_wd: 0.0,
        wd_incr_steps: 48,
        wd_style: trident::optim::lr::IncrStyle::Constant,
        decoupled: None,
    };
    let lrs: Vec<f64> = log.lines().filter_map(|l| json_number(l, "lr")).collect();
    assert_eq!(lrs.len(), 6, "{log}");
    assert_eq!(lrs[0], 0.0, "Megatron's first warmup step trains at --lr-warmup-init");
    for (it, lr) in lrs.iter().enumerate() {
        let want = schedule.lr(8 * it as u64);
        assert!((lr - want).abs() <= 1e-9 * want.max(1e-3), "iteration {}: logged {lr}, schedule {want}", it + 1);
    }
    // A weight decay that grows from 0 changes the run only once it is above 0.
    let grown = train(
        "grown.jsonl",
        &["--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay", "0.5"],
    );
    let (a, b) = (loss_values(Path::new(&p("plain.jsonl"))), loss_values(Path::new(&p("grown.jsonl"))));
    assert_eq!(a[..2], b[..2], "{grown}");
    assert_ne!(a[5], b[5], "the growing weight decay did not reach the optimizer");
}

/// The number after `"key":` in a JSON line.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let rest = line.split(&format!("\"{key}\":")).nth(1)?;
    rest.trim_start().split([',', '}']).next()?.trim().parse().ok()
}
