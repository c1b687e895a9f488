//! Multi-rank runs under Open MPI's mpirun: every layout of tensor, sequence and data parallelism
//! computes the single-rank run (losses and final weights within 1e-5), impossible layouts fail
//! once and cleanly, a killed rank ends the job, a foreign launcher is detected, the collective
//! benchmark runs, and the binary links nothing but the C runtime and MPI.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn every_layout_computes_the_single_rank_run() {
    let dir = scratch("layouts");
    let data = prepared_corpus(&dir);
    let run_args = |json: &str, ckpt: &str| {
        vec![
            "train".to_string(),
            "--preset".into(),
            "tiny".into(),
            "--data-path".into(),
            data.clone(),
            SAME_PADDING[0].into(),
            SAME_PADDING[1].into(),
            // The tiny preset's own recipe (1500 iterations, warmup 100), stopped after 10.
            "--exit-interval".into(),
            "10".into(),
            "--log-interval".into(),
            "1".into(),
            "--log-json".into(),
            json.into(),
            "--save".into(),
            ckpt.into(),
        ]
    };
    let base_json = dir.join("base.jsonl");
    let base_ckpt = dir.join("base");
    let args = run_args(base_json.to_str().unwrap(), base_ckpt.to_str().unwrap());
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base_losses = loss_values(&base_json);
    assert_eq!(base_losses.len(), 10);
    let base_weights = full_weights(&base_ckpt);

    let layouts: &[(usize, &[&str])] = &[
        (2, &["--tensor-model-parallel-size", "2"]),
        (4, &["--tensor-model-parallel-size", "4"]),
        (2, &[]),
        (4, &[]),
        (4, &["--tensor-model-parallel-size", "2"]),
        (2, &["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
        (4, &["--tensor-model-parallel-size", "4", "--sequence-parallel"]),
        // 8 ranks, TP=2 x DP=4, with small buckets so the overlapped reduction uses several.
        (8, &["--tensor-model-parallel-size", "2", "--ddp-bucket-size", "100000"]),
    ];
    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let json = dir.join(format!("l{i}.jsonl"));
        let ckpt = dir.join(format!("l{i}"));
        let mut args = run_args(json.to_str().unwrap(), ckpt.to_str().unwrap());
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = mpirun(*ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let what = format!("{ranks} ranks {extra:?}");
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        let got = loss_values(&json);
        let loss_rel = got.iter().zip(&base_losses).fold(0f64, |m, (a, b)| m.max((a - b).abs() / b.abs()));
        assert_losses_match(&what, &got, &base_losses);
        let weight_abs = assert_weights_match(&what, &ckpt, &base_weights);
        eprintln!("{what}: losses within {loss_rel:.1e} relative, weights within {weight_abs:.1e}");
    }
}

#[test]
fn pipeline_layouts_compute_the_single_rank_run() {
    let dir = scratch("pipelines");
    let data = prepared_corpus(&dir);
    // The 8-layer preset: 8 micro-batches of 2 per global batch (m >= 2p for p <= 4).
    let run_args = |json: &str, ckpt: &str| {
        ["train", "--preset", "small", "--data-path", &data]
            .iter()
            .chain(&SAME_PADDING)
            .map(|s| s.to_string())
            .chain(
                ["--exit-interval", "10", "--log-interval", "1", "--log-json", json, "--save", ckpt].map(String::from),
            )
            .collect::<Vec<String>>()
    };
    let (base_json, base_ckpt) = (dir.join("base.jsonl"), dir.join("base"));
    let args = run_args(base_json.to_str().unwrap(), base_ckpt.to_str().unwrap());
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base_losses = loss_values(&base_json);
    let base_weights = full_weights(&base_ckpt);
    let trace = dir.join("trace.json");
    let trace_flag = format!("--timing-trace={}", trace.display());
    let zb_trace = dir.join("zb-trace.json");
    let zb_trace_flag = format!("--timing-trace={}", zb_trace.display());
    let zb = ["--pipeline-schedule", "zb-h1"];
    let zbv = ["--pipeline-schedule", "zb-v"];
    let layouts: Vec<(usize, Vec<&str>)> = vec![
            (2, vec!["--pipeline-model-parallel-size", "2"]),
            (4, vec!["--pipeline-model-parallel-size", "4"]),
            (2, vec!["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"]),
            (2, vec!["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "gpipe"]),
            (4, vec!["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2"]),
            (4, vec!["--pipeline-model-parallel-size", "2"]),
            (8, vec!["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", &trace_flag]),
            // Zero-bubble H1 (B and W split): the same losses as 1F1B's (layout 1), bit for bit.
            (4, [&["--pipeline-model-parallel-size", "4"][..], &zb].concat()),
            (
                8,
                [
                    &[
                        "--pipeline-model-parallel-size",
                        "2",
                        "--tensor-model-parallel-size",
                        "2",
                        "--sequence-parallel",
                    ][..],
                    &["--use-distributed-optimizer", &zb_trace_flag],
                    &zb,
                ]
                .concat(),
            ),
            // Zero-bubble V (two chunks per stage in a V, the tied embedding's copies both on
            // stage 0): 1F1B's losses bit for bit (layouts 0 and 1).
            (2, [&["--pipeline-model-parallel-size", "2"][..], &zbv].concat()),
            (4, [&["--pipeline-model-parallel-size", "4"][..], &zbv].concat()),
            (
                8,
                [
                    &["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2"][..],
                    &["--sequence-parallel", "--use-distributed-optimizer"],
                    &zbv,
                ]
                .concat(),
            ),
        ];
    let mut losses = Vec::new();
    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let (json, ckpt) = (dir.join(format!("p{i}.jsonl")), dir.join(format!("p{i}")));
        let mut args = run_args(json.to_str().unwrap(), ckpt.to_str().unwrap());
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = mpirun(*ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let what = format!("{ranks} ranks {extra:?}");
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        losses.push(loss_values(&json));
        assert_losses_match(&what, &losses[i], &base_losses);
        assert_weights_match(&what, &ckpt, &base_weights);
        // Each stage held exactly as many micro-batch activations as its schedule allows.
        let text = stdout(&o);
        let stages: Vec<&str> = text.lines().filter(|l| l.contains("micro-batch activations held")).collect();
        assert!(!stages.is_empty(), "{what}: no pipeline report in {text}");
        for line in stages {
            let held = line.split("peak ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap();
            let bound = line.split("schedule bound ").nth(1).unwrap().trim_end_matches(')');
            assert_eq!(held, bound, "{what}: {line}");
        }
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    let events = chrome_trace_events(&text);
    // Each rank's passes on tracks 0-7, the communication it waited for on tracks 8-15.
    let tracks: std::collections::BTreeSet<String> = events.iter().map(|e| e["tid"].clone()).collect();
    assert_eq!(tracks, (0..16).map(|t| t.to_string()).collect(), "the trace should hold every rank's two tracks");
    for kind in ["forward", "backward", "send", "recv", "optimizer", "grad-sync"] {
        assert!(events.iter().any(|e| e.get("cat").map(String::as_str) == Some(kind)), "no {kind} span in the trace");
    }
    assert_eq!(losses[7], losses[1], "zb-h1 and 1f1b on 4 stages: the same sums in the same order");
    assert_eq!(losses[9], losses[0], "zb-v and 1f1b on 2 stages: the same sums in the same order");
    assert_eq!(losses[10], losses[1], "zb-v and 1f1b on 4 stages");
    let events = chrome_trace_events(&std::fs::read_to_string(&zb_trace).unwrap());
    let spans = |kind: &str| events.iter().filter(|e| e.get("cat").map(String::as_str) == Some(kind)).count();
    assert!(spans("weight") > 0 && spans("weight") == spans("backward"), "one W span per B span");
}

/// A small strict JSON reader for the trace: returns the `traceEvents` objects as maps of their
/// scalar fields (numbers and strings as text), failing on anything that is not JSON.
fn chrome_trace_events(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    #[derive(Debug)]
    enum J {
        Obj(Vec<(String, J)>),
        Arr(Vec<J>),
        Str(String),
        Num(String),
        Lit,
    }
    struct P<'a>(&'a [u8], usize);
    impl P<'_> {
        fn ws(&mut self) {
            while self.1 < self.0.len() && self.0[self.1].is_ascii_whitespace() {
                self.1 += 1;
            }
        }
        fn eat(&mut self, c: u8) {
            self.ws();
            assert_eq!(self.0.get(self.1), Some(&c), "expected '{}' at byte {}", c as char, self.1);
            self.1 += 1;
        }
        fn value(&mut self) -> J {
            self.ws();
            match self.0[self.1] {
                b'{' => {
                    self.1 += 1;
                    let mut fields = Vec::new();
                    self.ws();
                    if self.0[self.1] == b'}' {
                        self.1 += 1;
                        return J::Obj(fields);
                    }
                    loop {
                        let J::Str(key) = self.value() else { panic!("object key must be a string") };
                        self.eat(b':');
                        fields.push((key, self.value()));
                        self.ws();
                        self.1 += 1;
                        match self.0[self.1 - 1] {
                            b',' => continue,
                            b'}' => return J::Obj(fields),
                            c => panic!("unexpected '{}' in object", c as char),
                        }
                    }
                }
                b'[' => {
                    self.1 += 1;
                    let mut items = Vec::new();
                    self.ws();
                    if self.0[self.1] == b']' {
                        self.1 += 1;
                        return J::Arr(items);
                    }
                    loop {
                        items.push(self.value());
                        self.ws();
                        self.1 += 1;
                        match self.0[self.1 - 1] {
                            b',' => continue,
                            b']' => return J::Arr(items),
                            c => panic!("unexpected '{}' in array", c as char),
                        }
                    }
                }
                b'"' => {
                    self.1 += 1;
                    let start = self.1;
                    while self.0[self.1] != b'"' {
                        assert_ne!(self.0[self.1], b'\\', "escapes are not expected in the trace");
                        self.1 += 1;
                    }
                    self.1 += 1;
                    J::Str(String::from_utf8(self.0[start..self.1 - 1].to_vec()).unwrap())
                }
                b't' | b'f' | b'n' => {
                    for lit in ["true", "false", "null"] {
                        if self.0[self.1..].starts_with(lit.as_bytes()) {
                            self.1 += lit.len();
                            return J::Lit;
                        }
                    }
                    panic!("bad literal at {}", self.1)
                }
                _ => {
                    let start = self.1;
                    while self.1 < self.0.len()
                        && (self.0[self.1].is_ascii_digit() || b"+-.eE".contains(&self.0[self.1]))
                    {
                        self.1 += 1;
                    }
                    let num = std::str::from_utf8(&self.0[start..self.1]).unwrap();
                    num.parse::<f64>().unwrap_or_else(|_| panic!("bad number '{num}' at {start}"));
                    J::Num(num.to_string())
                }
            }
        }
    }
    let mut p = P(text.as_bytes(), 0);
    let J::Obj(top) = p.value() else { panic!("a trace is an object") };
    p.ws();
    assert_eq!(p.1, text.len(), "trailing bytes after the trace object");
    let (_, J::Arr(events)) = top.into_iter().find(|(k, _)| k == "traceEvents").expect("traceEvents") else {
        panic!("traceEvents must be an array")
    };
    let mut out = Vec::new();
    for e in events {
        let J::Obj(fields) = e else { panic!("an event is an object") };
        let map: std::collections::BTreeMap<String, String> = fields
            .into_iter()
            .filter_map(|(k, v)| match v {
                J::Str(s) | J::Num(s) => Some((k, s)),
                _ => None,
            })
            .collect();
        for key in ["name", "ph", "pid", "tid"] {
            assert!(map.contains_key(key), "event without {key}: {map:?}");
        }
        if map["ph"] == "X" {
            assert!(map.contains_key("ts") && map.contains_key("dur"), "complete event without ts/dur: {map:?}");
            out.push(map);
        }
    }
    out
}

#[test]
fn impossible_pipelines_fail_once() {
    let dir = scratch("bad-pipelines");
    let data = prepared_corpus(&dir);
    let base = ["train", "--data-path", data.as_str(), "--train-iters", "3"];
    let case = |ranks: usize, extra: &[&str], needles: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let o = if ranks == 1 { run(&args) } else { mpirun(ranks, &args) };
        assert_one_error(&o, needles);
    };
    case(4, &["--pipeline-model-parallel-size", "4", "--num-layers", "6"], &["do not split evenly", "--num-layers 6"]);
    case(1, &["--num-layers-per-virtual-pipeline-stage", "2"], &["needs --pipeline-model-parallel-size > 1"]);
    case(
        2,
        &[
            "--pipeline-model-parallel-size",
            "2",
            "--num-layers-per-virtual-pipeline-stage",
            "1",
            "--global-batch-size",
            "6",
            "--micro-batch-size",
            "2",
        ],
        &["interleaved schedule", "gives 3"],
    );
}

#[test]
fn the_distributed_optimizer_matches_plain_data_parallelism_with_a_quarter_of_the_state() {
    let dir = scratch("zero");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    let args = |json: String, extra: &[&str]| {
        let mut a: Vec<String> =
            ["train", "--preset", "tiny", "--data-path", &data, "--exit-interval", "10", "--log-interval", "1"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        a.extend(["--log-memory".to_string(), "--log-json".to_string(), json]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run4 = |a: Vec<String>| {
        let o = mpirun(4, &a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    // Measured optimizer state of rank 0, in MiB, from the --log-memory table.
    let state = |text: &str| -> f64 {
        let row = text.lines().find(|l| l.trim_start().starts_with("rank   0:")).expect("memory table");
        row.split('|').nth(2).unwrap().split('/').nth(1).unwrap().trim().parse().unwrap()
    };
    let plain = run4(args(p("plain.jsonl"), &[]));
    let zero =
        run4(args(p("zero.jsonl"), &["--use-distributed-optimizer", "--save", &p("ckpt"), "--save-interval", "5"]));
    let (a, b) = (loss_values(Path::new(&p("plain.jsonl"))), loss_values(Path::new(&p("zero.jsonl"))));
    assert_eq!(a.len(), 10);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "ZeRO-1 loss {y} vs plain {x}");
    }
    let (s_plain, s_zero) = (state(&plain), state(&zero));
    assert!((s_zero * 4.0 - s_plain).abs() <= 0.05, "ZeRO-1 state {s_zero} MiB is not a quarter of {s_plain} MiB");
    // Its checkpoint (moments gathered whole) resumes without the distributed optimizer.
    std::fs::write(dir.join("ckpt/latest_checkpointed_iteration.txt"), "5\n").unwrap();
    run4(args(p("resumed.jsonl"), &["--load", &p("ckpt")]));
    let c = loss_values(Path::new(&p("resumed.jsonl")));
    for (x, y) in a[5..].iter().zip(&c) {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "resumed loss {y} vs plain {x}");
    }
}

#[test]
fn impossible_layouts_fail_once_on_every_rank() {
    let dir = scratch("bad-layouts");
    let data = prepared_corpus(&dir);
    let base = ["train", "--data-path", data.as_str(), "--train-iters", "3"];
    let case = |ranks: usize, extra: &[&str], needles: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let started = Instant::now();
        let o = mpirun(ranks, &args);
        assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
        assert_one_error(&o, needles);
    };
    case(6, &["--tensor-model-parallel-size", "4"], &["6 ranks", "--tensor-model-parallel-size 4"]);
    case(3, &["--tensor-model-parallel-size", "3"], &["--num-attention-heads 4", "--tensor-model-parallel-size 3"]);
    case(
        4,
        &["--tensor-model-parallel-size", "4", "--sequence-parallel", "--seq-length", "126"],
        &["--seq-length 126", "--sequence-parallel"],
    );
    // 2-D and 2.5-D: a group that is not q² or d q², a batch that does not split over d q rows,
    // heads or hidden size that do not split over the grid.
    let summa = ["--tensor-parallel-mode", "2d", "--micro-batch-size", "4", "--global-batch-size", "8"];
    let with = |extra: &[&'static str]| summa.iter().chain(extra).copied().collect::<Vec<&str>>();
    case(8, &with(&["--tensor-model-parallel-size", "8"]), &["--tensor-model-parallel-size 8", "square q x q grid"]);
    // Zero-bubble H1 under SUMMA, and with virtual stages.
    case(4, &with(&["--tensor-model-parallel-size", "4", "--pipeline-schedule", "zb-h1"]), &["zb-h1", "2d or 2.5d"]);
    case(
        2,
        &[
            "--pipeline-model-parallel-size",
            "2",
            "--num-layers-per-virtual-pipeline-stage",
            "1",
            "--pipeline-schedule",
            "zb-h1",
        ],
        &["virtual pipeline stages", "zb-h1"],
    );
    case(
        4,
        &["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2.5d", "--tesseract-depth", "2"],
        &["--tensor-model-parallel-size 4", "--tesseract-depth 2"],
    );
    case(
        8,
        &[
            "--tensor-model-parallel-size",
            "8",
            "--tensor-parallel-mode",
            "2.5d",
            "--tesseract-depth",
            "2",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "8",
        ],
        &["--micro-batch-size 2", "divisible by 4"],
    );
    case(
        4,
        &with(&["--tensor-model-parallel-size", "4", "--num-attention-heads", "3", "--hidden-size", "96"]),
        &["--num-attention-heads 3", "q = 2"],
    );
    case(
        4,
        &with(&["--tensor-model-parallel-size", "4", "--num-attention-heads", "2", "--hidden-size", "130"]),
        &["--hidden-size 130", "q² = 4"],
    );
}

/// `--load ckpt` that one rank sees with a checkpoint and another without (a directory local to
/// each node; here each rank's own working directory): every rank stops with the count, instead
/// of one resuming while the other starts from scratch.
#[test]
fn ranks_that_disagree_on_the_checkpoint_to_load_all_stop() {
    let dir = scratch("load-disagree");
    let data = prepared_corpus(&dir);
    let (with, without) = (dir.join("node0"), dir.join("node1"));
    std::fs::create_dir_all(with.join("ckpt")).unwrap();
    std::fs::create_dir_all(&without).unwrap();
    std::fs::write(with.join("ckpt/latest_checkpointed_iteration.txt"), "2\n").unwrap();
    let mut args = vec!["train", "--data-path", data.as_str(), "--train-iters", "3", "--load", "ckpt"];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(&["--tensor-model-parallel-size", "2"]);
    // One application context per rank, each in its own working directory.
    let mut c = std::process::Command::new("mpirun");
    c.args(["--oversubscribe", "--allow-run-as-root", "-np", "1", "-wdir", with.to_str().unwrap(), BIN]).args(&args);
    c.args([":", "-np", "1", "-wdir", without.to_str().unwrap(), BIN]).args(&args);
    let o = c.env("OMPI_MCA_mpi_yield_when_idle", "1").output().expect("mpirun runs");
    assert_one_error(&o, &["--load ckpt: 1 of 2 ranks find a checkpoint there"]);
}

#[test]
fn a_killed_rank_ends_the_job() {
    let dir = scratch("kill");
    let data = prepared_corpus(&dir);
    let mut child = mpirun_command(2, &["train", "--data-path", &data])
        .args(["--train-iters", "100000", "--log-interval", "1", "--tensor-model-parallel-size", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mpirun runs");
    // Wait until both ranks are up, then kill one of them (a child of mpirun) outright.
    let mpirun_pid = child.id();
    let started = Instant::now();
    let victim = loop {
        assert!(started.elapsed() < Duration::from_secs(30), "ranks did not start");
        let ranks = children_named(mpirun_pid, "trident");
        if ranks.len() == 2 {
            std::thread::sleep(Duration::from_secs(2));
            break ranks[1];
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: sending a signal to a process id has no memory-safety preconditions.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let killed = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "the job should fail when a rank dies");
            break;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the job was still running 30 s after a rank died");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pids of the children of `parent` whose command name starts with `name` (from /proc).
fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name is in parentheses; the parent pid is the second field after it.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 2..].split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && comm.starts_with(name) {
            out.push(pid);
        }
    }
    out.sort();
    out
}

#[test]
fn a_foreign_launcher_is_detected() {
    // The binary links Open MPI; MPICH's hydra launcher would start it as silent singletons.
    if Command::new("mpiexec.mpich").arg("--version").output().is_err() {
        panic!("mpiexec.mpich is not installed (Debian: mpich), which .ci/run installs");
    }
    let dir = scratch("foreign");
    let data = prepared_corpus(&dir);
    let o = Command::new("mpiexec.mpich")
        .args(["-n", "2", BIN, "train", "--data-path", &data, "--train-iters", "2"])
        .output()
        .unwrap();
    assert_one_error(&o, &["PMI_SIZE=2", "different MPI's launcher"]);
}

#[test]
fn every_collective_of_the_comm_seam_is_correct() {
    for ranks in [1, 2, 3, 4] {
        let o = mpirun(ranks, &["check", "comm"]);
        assert!(o.status.success(), "{ranks} ranks: {}", stderr(&o));
        assert!(stdout(&o).contains(&format!("64 checks passed on each of {ranks} ranks")), "{}", stdout(&o));
    }
}

#[test]
fn the_allreduce_benchmark_prints_its_table() {
    let o = mpirun(2, &["bench", "allreduce", "--max-size", "1M", "--min-seconds", "0.01"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in ["busbw GB/s", "MPI_Allreduce", "1 KiB", "1 MiB"] {
        assert!(text.contains(needle), "'{needle}' missing in:\n{text}");
    }
    let o = run(&["bench", "allreduce"]);
    assert_clean_error(&o, &["at least 2 ranks"]);
}

#[test]
fn the_binary_links_only_the_c_runtime_and_mpi() {
    let o = Command::new("ldd").arg(BIN).output().expect("ldd runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.is_empty(), "{text}");
    for line in text.lines() {
        let lib = line.trim();
        assert!(!lib.contains("not found"), "unresolved library: {lib}");
        // No GPU library, and nothing from a build tree: the clone's folder or the one above it.
        let clone = Path::new(env!("CARGO_MANIFEST_DIR"));
        let above = clone.parent().filter(|p| p.parent().is_some()).unwrap_or(clone);
        let trees = [clone, above].map(|p| format!("{}/", p.display()));
        let homes = [concat!("/ro", "ot/"), concat!("/ho", "me/")];
        for forbidden in ["cuda", "nccl", "rccl", "hip", homes[0], homes[1], "/target/", &trees[0], &trees[1]] {
            assert!(!lib.contains(forbidden), "{forbidden} in {lib}");
        }
    }
    assert!(text.contains("libmpi") && text.contains("libc.so"), "{text}");
}

#[test]
fn summa_layouts_compute_the_single_rank_run() {
    // 2-D (Optimus) and 2.5-D (Tesseract) tensor parallelism alone and with pipeline, data
    // parallelism and ZeRO-1: losses and every weight of the tiny preset (heads 4, hidden 128,
    // micro-batch 16) after 10 iterations, against the single-rank run.
    let dir = scratch("summa-layouts");
    let data = prepared_corpus(&dir);
    let run_args = |json: &Path, ckpt: &Path| {
        ["train", "--preset", "tiny", "--data-path", &data, "--exit-interval", "10", "--log-interval", "1"]
            .iter()
            .chain(&SAME_PADDING)
            .map(|s| s.to_string())
            .chain(["--log-json".into(), json.display().to_string(), "--save".into(), ckpt.display().to_string()])
            .collect::<Vec<String>>()
    };
    let (base_json, base_ckpt) = (dir.join("base.jsonl"), dir.join("base"));
    let args = run_args(&base_json, &base_ckpt);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base_losses = loss_values(&base_json);
    let base_weights = full_weights(&base_ckpt);
    let two_d = ["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"];
    let two_half = ["--tensor-model-parallel-size", "8", "--tensor-parallel-mode", "2.5d", "--tesseract-depth", "2"];
    let layouts: Vec<(usize, Vec<&str>)> = vec![
        (4, two_d.to_vec()),
        (8, two_half.to_vec()),
        (8, [&two_d[..], &["--pipeline-model-parallel-size", "2"]].concat()),
        (8, two_d.to_vec()),
        (8, [&two_half[..], &["--use-distributed-optimizer"]].concat()),
    ];
    for (i, (ranks, extra)) in layouts.iter().enumerate() {
        let (json, ckpt) = (dir.join(format!("s{i}.jsonl")), dir.join(format!("s{i}")));
        let mut args = run_args(&json, &ckpt);
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = mpirun(*ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let what = format!("{ranks} ranks {extra:?}");
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        assert_eq!(base_losses.len(), 10, "{what}");
        assert_losses_match(&what, &loss_values(&json), &base_losses);
        let worst_weight = assert_weights_match(&what, &ckpt, &base_weights);
        eprintln!("{what}: losses and weights (within {worst_weight:.1e}) match the single-rank run");
    }
}

/// The numbers of `--log-comm`'s lines: per layer per micro-batch (total, tensor, row, column),
/// and per step the data-parallel x depth group's total; and the rank's parameter count.
fn comm_report(out: &str) -> (Vec<[f64; 4]>, Option<f64>, f64) {
    let num = |s: &str| s.trim().parse::<f64>().unwrap();
    let mut layers = Vec::new();
    let mut replica = None;
    let mut params = 0.0;
    for line in out.lines() {
        if let Some(rest) = line.split("per micro-batch: ").nth(1) {
            let parts: Vec<f64> = rest
                .split(['=', '+'])
                .map(|p| num(p.trim().trim_start_matches(|c: char| c.is_alphabetic() || c == ' ')))
                .collect();
            layers.push([parts[0], parts[1], parts[2], parts[3]]);
        }
        if let Some(rest) = line.split("step, data-parallel x depth group of 2: ").nth(1) {
            replica = Some(num(rest.split(' ').next().unwrap()));
        }
        if let Some(rest) = line.split("parameters: ").nth(1) {
            params = num(rest.split(' ').next().unwrap());
        }
    }
    (layers, replica, params)
}

#[test]
fn summa_communication_matches_the_volume_formulas() {
    // docs/design.md's 2-D and 2.5-D volumes, per layer per micro-batch (f = 4h):
    //   V_2D   = 3(q-1)/q² (7 bsh + 12 h²),  V_2.5D = 3(q-1)/q² (7 bsh/d + 12 h²),
    // plus, once per step, the depth all-reduce of every parameter, 2(d-1)/d x the rank's count.
    let dir = scratch("summa-volumes");
    let data = prepared_corpus(&dir);
    for (layers, h, heads, s, b) in [(2usize, 128usize, 4usize, 32usize, 8usize), (1, 256, 8, 64, 4)] {
        for (ranks, d) in [(4usize, 1usize), (8, 2)] {
            let (q, t) = (2usize, ranks);
            let mut args: Vec<String> = [
                "train",
                "--data-path",
                &data,
                "--train-iters",
                "1",
                "--eval-iters",
                "0",
                "--log-comm",
                "--cpu-threads",
                "1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for (flag, v) in [
                ("--num-layers", layers),
                ("--hidden-size", h),
                ("--num-attention-heads", heads),
                ("--seq-length", s),
                ("--micro-batch-size", b),
                ("--global-batch-size", b),
                ("--tensor-model-parallel-size", t),
            ] {
                args.extend([flag.to_string(), v.to_string()]);
            }
            if d == 1 {
                args.extend(["--tensor-parallel-mode".into(), "2d".into()]);
            } else {
                args.extend(["--tensor-parallel-mode".into(), "2.5d".into(), "--tesseract-depth".into(), "2".into()]);
            }
            let o = mpirun(ranks, &args.iter().map(String::as_str).collect::<Vec<_>>());
            let what = format!("h {h}, s {s}, b {b}, q {q}, d {d}");
            assert!(o.status.success(), "{what}: {}", stderr(&o));
            let (per_layer, replica, params) = comm_report(&stdout(&o));
            assert_eq!(per_layer.len(), layers, "{what}: {}", stdout(&o));
            let (bsh, hh) = ((b * s * h) as f64, (h * h) as f64);
            let formula = 3.0 * (q - 1) as f64 / (q * q) as f64 * (7.0 * bsh / d as f64 + 12.0 * hh);
            for (l, [total, tensor, row, col]) in per_layer.iter().enumerate() {
                assert_eq!(*tensor, 0.0, "{what}: SUMMA layers use the row and column groups only");
                assert!((row + col - total).abs() <= 1.0, "{what}: layer {l} total");
                let rel = (total - formula) / formula;
                eprintln!("{what}: layer {l}: counted {total:.0}, formula {formula:.0} ({:+.2}%)", 100.0 * rel);
                assert!(rel.abs() < 0.01, "{what}: layer {l}: counted {total} vs formula {formula}");
            }
            if d > 1 {
                let depth = replica.expect("a depth all-reduce per step");
                assert_eq!(depth, 2.0 * (d - 1) as f64 / d as f64 * params, "{what}: depth all-reduce");
                let per_layer_params = 12.0 * hh / (q * q) as f64;
                eprintln!("{what}: depth all-reduce {depth:.0} per step ({per_layer_params:.0} per layer's weights)");
            } else {
                assert_eq!(replica, None, "{what}: no depth group under 2-D");
            }
        }
    }
}
