//! The job scripts without a scheduler: each passes `bash -n`, and its dry run (`DRY_RUN=1`)
//! prints the site's launch line, resumes with `--load` when the run directory holds a checkpoint,
//! and refuses a layout that does not split, before any allocation is spent. `make slurm-test`
//! runs the same scripts for real on a local Slurm.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("job-scripts").join(name)
}

const SCRIPTS: &[&str] = &["lib.sh", "frontier.sbatch", "perlmutter.sbatch", "dgx.sbatch", "polaris.pbs", "local.sh"];

/// Runs `bash SCRIPT` in a clean environment (no scheduler variables) with DRY_RUN=1 and `vars`.
fn dry_run(name: &str, run_dir: &Path, vars: &[(&str, &str)]) -> Output {
    let mut c = Command::new("bash");
    c.arg(script(name)).env_clear().current_dir(run_dir.parent().unwrap());
    for keep in ["PATH", "HOME", "USER"] {
        if let Ok(v) = std::env::var(keep) {
            c.env(keep, v);
        }
    }
    c.env("DRY_RUN", "1")
        .env("RUN_DIR", run_dir)
        .env("TRIDENT", "/opt/trident/bin/trident")
        .env("DATA_PATH", "/data/corpus_text_document");
    for (k, v) in vars {
        c.env(k, v);
    }
    c.output().expect("bash runs")
}

/// The `launch:` line of a dry run (exactly one).
fn launch(o: &Output) -> String {
    let out = stdout(o);
    assert!(o.status.success(), "dry run failed: {}\n{}", out, stderr(o));
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("launch: ")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    lines[0].trim_start_matches("launch: ").to_string()
}

/// Asserts that `line` contains every part, in order.
fn assert_in_order(line: &str, parts: &[&str]) {
    let mut at = 0;
    for p in parts {
        match line[at..].find(p) {
            Some(i) => at += i + p.len(),
            None => panic!("'{p}' missing (or out of order) in: {line}"),
        }
    }
}

const TRAIN: &[&str] = &[
    "/opt/trident/bin/trident train --preset gpt2-124m --data-path /data/corpus_text_document",
    "--save",
    "/checkpoints --save-interval 500 --log-json",
    "/logs/metrics.jsonl --exit-signal-handler",
];

#[test]
fn every_script_parses() {
    for s in SCRIPTS {
        let o = Command::new("bash").arg("-n").arg(script(s)).output().unwrap();
        assert!(o.status.success(), "bash -n {s}: {}", stderr(&o));
    }
}

#[test]
fn dry_runs_print_each_sites_launch_line() {
    let dir = scratch("dry-sites");
    let run = dir.join("run");
    let cases: &[(&str, &[&str])] = &[
        (
            "frontier.sbatch",
            &["srun -N 2 -n 16 --ntasks-per-node=8 -c 7 --gpus-per-task=1 --gpu-bind=closest --kill-on-bad-exit=1 "],
        ),
        (
            "perlmutter.sbatch",
            &["srun -N 2 -n 8 --ntasks-per-node=4 -c 32 --cpu-bind=cores --gpu-bind=none --kill-on-bad-exit=1 "],
        ),
        (
            "dgx.sbatch",
            &["srun --mpi=pmix -N 2 -n 16 --ntasks-per-node=8 -c ", " --cpu-bind=cores --kill-on-bad-exit=1 "],
        ),
        ("polaris.pbs", &["mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth --env OMP_NUM_THREADS=8 "]),
    ];
    for (name, launcher) in cases {
        let o = dry_run(name, &run, &[]);
        let line = launch(&o);
        assert!(line.starts_with(launcher[0]), "{name}: {line}");
        assert_in_order(&line, &[launcher, TRAIN].concat());
        assert!(!line.contains("--load"), "{name}: nothing to resume from: {line}");
        // The GPU default trains in bf16, which the GPU Devices need, and the script says so.
        assert!(line.contains(" --bf16"), "{name}: {line}");
        assert!(stdout(&o).contains("the GPU Device trains in bf16 (--bf16 is added"), "{name}: {}", stdout(&o));
    }
    let env = |name: &str| {
        let out = stdout(&dry_run(name, &run, &[]));
        out.lines().find(|l| l.starts_with("env: ")).unwrap_or_default().to_string()
    };
    // Frontier's alt_read rendezvous goes with the #SBATCH --network=disable_rdzv_get line.
    let frontier = env("frontier.sbatch");
    assert!(frontier.contains("FI_CXI_RDZV_PROTO=alt_read") && frontier.contains("NCCL_NET=OFI"), "{frontier}");
    // RCCL over Slingshot: ATS off, GPU-direct up to the host bridge, and the aws-ofi-rccl plugin
    // first on the loader path when AWS_OFI_RCCL_DIR names one.
    for setting in ["FI_CXI_ATS=0", "NCCL_NET_GDR_LEVEL=PHB", "NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3"] {
        assert!(frontier.contains(setting), "{setting} not in {frontier}");
    }
    assert!(!frontier.contains("LD_LIBRARY_PATH="), "{frontier}");
    let with_plugin = stdout(&dry_run("frontier.sbatch", &run, &[("AWS_OFI_RCCL_DIR", "/opt/aws-ofi-rccl")]));
    assert!(with_plugin.contains("LD_LIBRARY_PATH=/opt/aws-ofi-rccl/lib"), "{with_plugin}");
    let directives = std::fs::read_to_string(script("frontier.sbatch")).unwrap();
    assert!(
        directives.contains("#SBATCH --network=disable_rdzv_get") && directives.contains("#SBATCH --signal=B:USR1@")
    );
    assert!(env("perlmutter.sbatch").contains("TRIDENT_GPU_ORDER=3,2,1,0"));
    assert!(env("polaris.pbs").contains("TRIDENT_GPU_ORDER=3,2,1,0"));
    // Polaris has no warning signal: the walltime (01:00:00) minus 10 minutes bounds the run.
    assert!(launch(&dry_run("polaris.pbs", &run, &[])).ends_with("--exit-duration-in-mins 50"));
    assert!(
        launch(&dry_run("polaris.pbs", &run, &[("EXIT_DURATION_MINS", "5")])).ends_with("--exit-duration-in-mins 5")
    );

    let local = launch(&dry_run("local.sh", &run, &[("MPIEXEC", "mpiexec.mpich"), ("NP", "4")]));
    assert_in_order(&local, &["mpiexec.mpich -np 4 /opt/trident/bin/trident train --preset tiny", "--device cpu"]);
    assert!(!local.contains("--oversubscribe"), "MPICH takes no Open MPI flags: {local}");
}

#[test]
fn dry_runs_follow_the_allocation_and_the_knobs() {
    let dir = scratch("dry-knobs");
    let run = dir.join("run");
    // Inside a 3-node job the node count comes from Slurm; one node forces RCCL onto sockets.
    let o = dry_run("frontier.sbatch", &run, &[("SLURM_JOB_NUM_NODES", "3")]);
    assert!(launch(&o).starts_with("srun -N 3 -n 24 "), "{}", launch(&o));
    let o = dry_run("frontier.sbatch", &run, &[("SLURM_JOB_NUM_NODES", "1"), ("TP", "2"), ("PP", "2")]);
    assert!(stdout(&o).contains("NCCL_NET=Socket") && stdout(&o).contains("8 ranks = TP 2 x PP 2 x DP 2"));
    // Polaris counts nodes in PBS_NODEFILE.
    let nodes = dir.join("nodes");
    std::fs::write(&nodes, "x1\nx2\nx3\n").unwrap();
    let o = dry_run("polaris.pbs", &run, &[("PBS_NODEFILE", nodes.to_str().unwrap())]);
    assert!(launch(&o).starts_with("mpiexec -n 12 --ppn 4 "), "{}", launch(&o));
    // Knobs reach the line; TRAIN_ARGS is appended.
    let o = dry_run(
        "dgx.sbatch",
        &run,
        &[
            ("DEVICE", "cpu"),
            ("PRESET", "tiny"),
            ("TP", "2"),
            ("PP", "2"),
            ("RANKS_PER_NODE", "4"),
            ("CPUS_PER_TASK", "2"),
            ("SRUN_MPI", "pmi2"),
            ("TRAIN_ARGS", "--train-iters 30 --lr 1e-3"),
            ("SLURM_JOB_NUM_NODES", "1"),
        ],
    );
    let line = launch(&o);
    assert_in_order(
        &line,
        &[
            "srun --mpi=pmi2 -N 1 -n 4 --ntasks-per-node=4 -c 2 ",
            "train --preset tiny ",
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --device cpu ",
            "--exit-signal-handler --train-iters 30 --lr 1e-3",
        ],
    );
    assert!(
        !stdout(&o).contains("GPU Device") && !launch(&o).contains("--bf16"),
        "DEVICE=cpu adds nothing: {}",
        stdout(&o)
    );
}

#[test]
fn a_checkpoint_in_the_run_directory_is_resumed() {
    let dir = scratch("dry-resume");
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("checkpoints")).unwrap();
    std::fs::write(run.join("checkpoints/latest_checkpointed_iteration.txt"), "1200\n").unwrap();
    for name in ["frontier.sbatch", "perlmutter.sbatch", "dgx.sbatch", "polaris.pbs", "local.sh"] {
        let o = dry_run(name, &run, &[]);
        let line = launch(&o);
        assert!(line.contains(&format!("--load {}/checkpoints", run.display())), "{name}: {line}");
        assert!(stdout(&o).contains("resuming from the checkpoint of iteration 1200"), "{name}");
    }
}

#[test]
fn bad_knobs_stop_before_the_launch() {
    let dir = scratch("dry-bad");
    let run = dir.join("run");
    for (name, vars, needle) in [
        ("frontier.sbatch", &[("TP", "3")][..], "16 ranks do not split into TP=3 x PP=2"),
        ("perlmutter.sbatch", &[("PP", "x")][..], "PP=x: expected a positive whole number"),
        ("dgx.sbatch", &[("DEVICE", "tpu")][..], "DEVICE=tpu: expected cpu, cuda or hip"),
        ("local.sh", &[("NP", "3"), ("TP", "2")][..], "3 ranks do not split into TP=2 x PP=1"),
    ] {
        let o = dry_run(name, &run, vars);
        assert!(!o.status.success(), "{name} {vars:?}: accepted");
        assert!(stderr(&o).contains(needle), "{name}: {}", stderr(&o));
        assert!(!stdout(&o).contains("launch: "), "{name}: launched anyway");
    }
}
