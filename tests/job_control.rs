//! What batch job scripts rely on: `--exit-signal-handler` (a signal to one rank stops every rank
//! after the same iteration, with a checkpoint, exit code 75 and the stop marker),
//! `--exit-duration-in-mins`, a resume that continues the uninterrupted run bit for bit, the
//! per-rank `placement:` lines (the MPI split beats an inherited `SLURM_LOCALID`), and
//! `--distributed-timeout-minutes` ending a job whose rank stopped answering.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ITERS: usize = 300;
const REQUEUE: i32 = 75;
const MARKER: &str = "trident_stopped_for_requeue.txt";

/// A model slow enough (about 7 ms per iteration on one core) that a signal lands mid-run.
fn flags(data: &str) -> Vec<String> {
    flags_for(data, ITERS)
}

fn flags_for(data: &str, iters: usize) -> Vec<String> {
    one_thread_train_args(data, 16, iters)
}

/// The model of `flags` with one micro-batch an iteration, for runs on two ranks: they meet at
/// every collective, and where cores are shared (`make test` runs two files at once) each meeting
/// can wait a scheduler slice; four micro-batches an iteration took minutes so.
fn two_rank_flags(data: &str) -> Vec<String> {
    one_thread_train_args(data, 4, ITERS)
}

fn with(mut args: Vec<String>, more: &[&str]) -> Vec<String> {
    args.extend(more.iter().map(|s| s.to_string()));
    args
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("the run ends")
}

/// Waits until the JSON log has at least `lines` iterations (or the child ended).
fn wait_for_iterations(child: &mut Child, json: &Path, lines: usize) {
    let start = Instant::now();
    while logged_losses(json).len() < lines {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before iteration {lines}");
        assert!(start.elapsed() < Duration::from_secs(60), "no iteration {lines} within 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill(pid: u32, signal: &str) {
    let ok = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -{signal} {pid}");
}

fn tracker(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("latest_checkpointed_iteration.txt")).unwrap().trim().parse().unwrap()
}

/// Checks a stopped run: exit 75, the marker names the checkpointed iteration, which is before
/// the end. Returns that iteration.
fn assert_stopped(o: &Output, ckpt: &Path, reason: &str) -> u64 {
    assert_eq!(o.status.code(), Some(REQUEUE), "stdout: {}\nstderr: {}", stdout(o), stderr(o));
    let it = tracker(ckpt);
    assert!(it >= 1 && it < ITERS as u64, "stopped at {it}");
    let marker = std::fs::read_to_string(ckpt.join(MARKER)).unwrap();
    assert!(marker.starts_with(&format!("iteration {it}\n")), "{marker}");
    assert!(marker.contains(reason) && marker.contains("exit_code 75"), "{marker}");
    assert!(stdout(o).contains(&format!("exiting program at iteration {it}: ")), "{}", stdout(o));
    it
}

/// Resumes to the end (exit 0, the marker gone) and checks that the log, appended across both
/// runs, equals the uninterrupted run's bit for bit.
fn resume_and_compare(mut cmd: Command, args: &[String], ckpt: &Path, json: &Path, base: &[(u64, String)]) {
    let o = cmd.args(args).output().unwrap();
    assert!(o.status.success(), "resume: {}", stderr(&o));
    assert!(!ckpt.join(MARKER).exists(), "a finished run leaves no stop marker");
    assert_eq!(tracker(ckpt), ITERS as u64);
    let resumed = logged_losses(json);
    assert_eq!(resumed.len(), base.len(), "every iteration logged once across stop and resume");
    assert_eq!(resumed, base, "the stopped and resumed run differs from the uninterrupted one");
}

#[test]
fn sigusr1_stops_one_rank_run_with_a_checkpoint_and_resume_is_bit_exact() {
    let dir = scratch("sigusr1-1");
    let data = prepared_corpus(&dir);
    let (base_json, json, ckpt) = (dir.join("base.jsonl"), dir.join("run.jsonl"), dir.join("ckpt"));
    let o = run(&with(flags(&data), &["--log-json", base_json.to_str().unwrap()])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let base = logged_losses(&base_json);
    assert_eq!(base.len(), 300);

    let args = with(
        flags(&data),
        &["--save", ckpt.to_str().unwrap(), "--exit-signal-handler", "--log-json", json.to_str().unwrap()],
    );
    let mut child = Command::new(BIN).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_iterations(&mut child, &json, 5);
    kill(child.id(), "USR1");
    let o = finish(child);
    let it = assert_stopped(&o, &ckpt, "SIGUSR1");
    assert_eq!(logged_losses(&json).len() as u64, it, "the iteration in flight finished, no more");

    let resume = with(args, &["--load", ckpt.to_str().unwrap()]);
    resume_and_compare(Command::new(BIN), &resume, &ckpt, &json, &base);
}

#[test]
fn sigterm_to_one_of_two_ranks_stops_both_after_the_same_iteration() {
    let dir = scratch("sigterm-2");
    let data = prepared_corpus(&dir);
    let (base_json, json, ckpt) = (dir.join("base.jsonl"), dir.join("run.jsonl"), dir.join("ckpt"));
    let layout = ["--tensor-model-parallel-size", "2"];
    let o = mpirun_command(2, &[])
        .args(with(two_rank_flags(&data), &[&layout[..], &["--log-json", base_json.to_str().unwrap()]].concat()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let base = logged_losses(&base_json);

    let args = with(
        two_rank_flags(&data),
        &[
            &layout[..],
            &["--save", ckpt.to_str().unwrap(), "--exit-signal-handler", "--log-json", json.to_str().unwrap()],
        ]
        .concat(),
    );
    let mut child = mpirun_command(2, &[]).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_iterations(&mut child, &json, 5);
    // The ranks are mpirun's children; signal only the last one (rank 0 writes the log, so the
    // stop must travel through the agreement to reach it).
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap();
    let ranks: Vec<u32> = children.split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(ranks.len(), 2, "mpirun's children: {children}");
    kill(*ranks.iter().max().unwrap(), "TERM");
    let o = finish(child);
    // Whichever rank saw it, rank 0 reports the stop.
    assert_stopped(&o, &ckpt, "--exit-signal-handler");

    let resume = with(args, &["--load", ckpt.to_str().unwrap()]);
    resume_and_compare(mpirun_command(2, &[]), &resume, &ckpt, &json, &base);
}

/// A rank that stops answering (SIGSTOP: alive, holding its resources, never reaching the next
/// collective) leaves the other waiting; past `--distributed-timeout-minutes` (here 0.1, six
/// seconds) that rank says which wait timed out and the whole job ends, instead of hanging.
#[test]
fn a_stuck_rank_ends_the_job_after_the_distributed_timeout() {
    let dir = scratch("timeout-2");
    let data = prepared_corpus(&dir);
    let json = dir.join("run.jsonl");
    let args = with(
        two_rank_flags(&data),
        &["--tensor-model-parallel-size", "2", "--distributed-timeout-minutes", "0.1", "--log-json", json.to_str().unwrap()],
    );
    let mut child = mpirun_command(2, &[]).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_iterations(&mut child, &json, 3);
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap();
    let ranks: Vec<u32> = children.split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(ranks.len(), 2, "mpirun's children: {children}");
    let stuck = *ranks.iter().max().unwrap();
    kill(stuck, "STOP");
    let started = Instant::now();
    let o = finish(child);
    let _ = Command::new("kill").args(["-KILL", &stuck.to_string()]).status();
    assert!(!o.status.success(), "the job ended cleanly with a rank stopped");
    let err = stderr(&o);
    assert!(
        err.contains("has waited on the other ranks for more than --distributed-timeout-minutes 0.1"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "the job took {:?} to end", started.elapsed());
}

#[test]
fn exit_duration_stops_after_the_first_iteration_past_it() {
    let dir = scratch("duration");
    let data = prepared_corpus(&dir);
    let ckpt = dir.join("ckpt");
    // 0.0001 minutes (6 ms) have passed by the end of the first iteration.
    let args = with(flags(&data), &["--save", ckpt.to_str().unwrap(), "--exit-duration-in-mins", "0.0001"]);
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert_eq!(assert_stopped(&o, &ckpt, "--exit-duration-in-mins"), 1);

    // Without --save there is nothing to resume from: refused before any work.
    let args = with(flags(&data), &["--exit-signal-handler"]);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_clean_error(&o, &["--exit-signal-handler", "--save"]);
    let args = with(flags(&data), &["--save", "x", "--exit-duration-in-mins", "0"]);
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_clean_error(&o, &["--exit-duration-in-mins", "positive"]);
}

/// The `placement:` lines of a run, by world rank: (local rank, gpu ordinal, physical id).
fn placements(out: &str) -> Vec<(usize, usize, String)> {
    let mut v: Vec<(usize, usize, usize, String)> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("placement: rank "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let rank = w[0].split('/').next().unwrap().parse().unwrap();
            let local = w[2].split('/').next().unwrap().parse().unwrap();
            let g = w.iter().position(|&x| x == "gpu").unwrap();
            let ordinal = w[g + 1].parse().unwrap();
            let physical = w[g + 3].trim_end_matches(';').to_string();
            (rank, local, ordinal, physical)
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, l, o, p)| (l, o, p)).collect()
}

#[test]
fn placement_follows_the_mpi_split_not_an_inherited_slurm_localid() {
    let dir = scratch("placement");
    let data = prepared_corpus(&dir);
    let short = flags_for(&data, 5);
    // mpirun inside a batch script: every rank inherits SLURM_LOCALID=0 from the batch step.
    let o = mpirun_command(2, &[])
        .args(&short)
        .env("SLURM_LOCALID", "0")
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "4")
        .env("CUDA_VISIBLE_DEVICES", "4,5")
        .env_remove("ROCR_VISIBLE_DEVICES")
        .env_remove("HIP_VISIBLE_DEVICES")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(placements(&stdout(&o)), [(0, 0, "4".into()), (1, 1, "5".into())], "{}", stdout(&o));

    // Perlmutter's reorder over all four visible GPUs.
    let o = mpirun_command(2, &[])
        .args(&short)
        .env("CUDA_VISIBLE_DEVICES", "0,1,2,3")
        .env("TRIDENT_GPU_ORDER", "3,2,1,0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(placements(&stdout(&o)), [(0, 3, "3".into()), (1, 2, "2".into())], "{}", stdout(&o));

    // A bad order ends every rank with the reason, and no rank hangs.
    let o = mpirun_command(2, &[]).args(&short).env("TRIDENT_GPU_ORDER", "3,3").output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("TRIDENT_GPU_ORDER=3,3") && err.contains("2 rank(s) could not choose their GPU"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
