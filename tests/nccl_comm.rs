//! The NCCL Comm (`src/gpu/collectives.rs`) under mpirun, on a machine without GPUs: a fake
//! `libnccl.so.2` (`tests/gpu/fake_libnccl.c`: ranks meet in POSIX shared memory named from the
//! unique id) and the fake `libcuda.so.1` with host-memory buffers, streams and events
//! (`fake_libcuda.c` + `fake_libcuda_memory.c`), both built here with `cc`. `trident check nccl`
//! runs every collective on "device" memory and compares it with MPI on host memory bit for bit;
//! these tests run it on 2 and 4 ranks, with a wrong result planted, with a peer that vanishes or
//! exits, with RCCL selected by `--comm-library rccl` and `TRIDENT_RCCL`, and with no driver.
//! `trident bench allreduce --device cuda` runs on the same fakes (the fake device is named like an
//! A100 SXM4 40GB, so its fraction is of that row's NVLink bandwidth); `bench gemm|attention
//! --device cuda` go as far as the fake driver allows (it loads no module) and fail in one line.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Compiles the fakes into `dir`: (libcuda.so.1, libnccl.so.2).
fn build_fakes(dir: &Path) -> (PathBuf, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu");
    let cuda = dir.join("libcuda.so.1");
    let nccl = dir.join("libnccl.so.2");
    for (out, files) in [(&cuda, vec!["fake_libcuda.c", "fake_libcuda_memory.c"]), (&nccl, vec!["fake_libnccl.c"])] {
        let o = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
            .arg(out)
            .args(files.iter().map(|f| src.join(f)))
            .args(["-lpthread", "-ldl"])
            .output()
            .expect("cc runs");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    (cuda, nccl)
}

/// `trident check nccl` on `ranks` ranks with the fakes and extra environment variables.
fn check_nccl(ranks: usize, cuda: &Path, nccl: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let mut c = mpirun_command(ranks, &["check", "nccl"]);
    c.args(extra_args).env("TRIDENT_LIBCUDA", cuda).env("TRIDENT_NCCL", nccl);
    for v in [
        "TRIDENT_RCCL",
        "TRIDENT_NCCL_TIMEOUT_SECS",
        "FAKE_NCCL_FAIL_RANK",
        "FAKE_NCCL_CORRUPT_RANK",
        "FAKE_NCCL_ASYNC",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let start = Instant::now();
    (output_within(c, Duration::from_secs(90)), start.elapsed())
}

/// The output of `c`, killing it (and failing the test) if it runs longer than `limit`: a hang is
/// a failure here, not a stuck test run.
fn output_within(mut c: Command, limit: Duration) -> Output {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("mpirun runs");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.expect("mpirun runs"),
        Err(_) => {
            // SIGTERM first: mpirun passes it on to the ranks it started; SIGKILL if it lingers.
            // SAFETY: sending a signal to a process id has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            if rx.recv_timeout(Duration::from_secs(10)).is_err() {
                // SAFETY: as above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            panic!("mpirun was still running after {limit:?}: the job hung");
        }
    }
}

/// The lines of stderr that trident printed.
fn error_lines(o: &Output) -> Vec<String> {
    stderr(o).lines().filter(|l| l.starts_with("trident: error:")).map(str::to_string).collect()
}

#[test]
fn every_collective_equals_mpi_bit_for_bit_on_2_and_4_ranks() {
    let dir = scratch("nccl-fake");
    let (cuda, nccl) = build_fakes(&dir);
    // Synchronous fake calls, then asynchronous ones (a worker thread per communicator, streams
    // busy until it is done: synchronize polls).
    for (ranks, asynchronous) in [(2, "0"), (4, "0"), (2, "1"), (4, "1")] {
        let (o, took) = check_nccl(ranks, &cuda, &nccl, &[], &[("FAKE_NCCL_ASYNC", asynchronous)]);
        let out = stdout(&o);
        assert!(o.status.success(), "{ranks} ranks: {}{out}", stderr(&o));
        assert!(
            out.contains(&format!("55 collectives on device memory equal MPI's bit for bit on each of {ranks} ranks"))
                && out.contains("NCCL 2.32.99")
                && out.contains(&nccl.display().to_string()),
            "{out}"
        );
        assert_eq!(out.lines().count(), 1, "printed once: {out}");
        eprintln!("{ranks} ranks, FAKE_NCCL_ASYNC={asynchronous}: check nccl took {:.2} s", took.as_secs_f64());
    }
    // A wrong element on one rank (a bit flipped by the fake after its all-gather) is caught.
    let (o, _) = check_nccl(4, &cuda, &nccl, &[], &[("FAKE_NCCL_CORRUPT_RANK", "2")]);
    assert!(!o.status.success());
    let errors = error_lines(&o);
    assert_eq!(errors.len(), 1, "{}", stderr(&o));
    assert!(
        errors[0].starts_with(
            "trident: error: rank 2: communication failure: NCCL all_gather of 1 f32 per rank on rank 2: element 3 is"
        ) && errors[0].contains("but MPI gives"),
        "{}",
        errors[0]
    );
    assert!(!stderr(&o).contains("panicked"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The error lines of a job that must have failed within 20 s (no hang) without a panic.
fn failed_quickly((o, took): (Output, Duration)) -> Vec<String> {
    assert!(!o.status.success());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    error_lines(&o)
}

/// The error line of every rank but rank 1 (the one that vanished), with each of `wants` in it.
fn assert_survivors_say(errors: &[String], wants: &[&str]) {
    for survivor in [0, 2, 3] {
        let line = errors.iter().find(|l| l.starts_with(&format!("trident: error: rank {survivor}: ")));
        let line = line.unwrap_or_else(|| panic!("rank {survivor} printed no error: {errors:?}"));
        assert!(wants.iter().all(|w| line.contains(w)), "{line}");
    }
}

#[test]
fn a_peer_that_vanishes_ends_every_surviving_rank_with_a_clear_error() {
    let dir = scratch("nccl-vanish");
    let (cuda, nccl) = build_fakes(&dir);
    // Rank 1 stops taking part at its third collective; the fake NCCL gives up after 2 s.
    let env = [("FAKE_NCCL_FAIL_RANK", "1"), ("FAKE_NCCL_FAIL_AT", "3"), ("FAKE_NCCL_TIMEOUT_SECS", "2")];
    let errors = failed_quickly(check_nccl(4, &cuda, &nccl, &[], &env));
    let wants = [
        "NCCL: ncclReduceScatter failed with ncclRemoteError (6)",
        "rank 1 did not arrive at ncclReduceScatter within 2 s",
    ];
    assert_survivors_say(&errors, &wants);
    assert!(!errors.iter().any(|l| l.contains("rank 1:")), "{errors:?}");

    // Asynchronous calls: the survivors' streams never finish, and trident's own timeout
    // (TRIDENT_NCCL_TIMEOUT_SECS, polling the stream) aborts the communicator first.
    let env = [
        ("FAKE_NCCL_ASYNC", "1"),
        ("FAKE_NCCL_FAIL_RANK", "1"),
        ("FAKE_NCCL_FAIL_AT", "3"),
        ("FAKE_NCCL_TIMEOUT_SECS", "120"),
        ("TRIDENT_NCCL_TIMEOUT_SECS", "2"),
    ];
    let errors = failed_quickly(check_nccl(4, &cuda, &nccl, &[], &env));
    for survivor in [0, 2, 3] {
        let wanted = format!(
            "trident: error: rank {survivor}: communication failure: NCCL: rank {survivor} of 4: the communication \
             stream did not finish within 2 s (TRIDENT_NCCL_TIMEOUT_SECS); a peer rank has probably exited or hung; \
             the communicator was aborted"
        );
        assert!(errors.contains(&wanted), "{wanted}\nnot in: {errors:?}");
    }
    // ... and when NCCL notices first, its asynchronous error is the message.
    let env = [
        ("FAKE_NCCL_ASYNC", "1"),
        ("FAKE_NCCL_FAIL_RANK", "1"),
        ("FAKE_NCCL_FAIL_AT", "3"),
        ("FAKE_NCCL_TIMEOUT_SECS", "1"),
        ("TRIDENT_NCCL_TIMEOUT_SECS", "60"),
    ];
    let errors = failed_quickly(check_nccl(4, &cuda, &nccl, &[], &env));
    let wants = [
        "NCCL: an enqueued operation (ncclCommGetAsyncError) failed with ncclRemoteError (6)",
        "rank 1 did not arrive at ncclReduceScatter within 1 s",
    ];
    assert_survivors_say(&errors, &wants);

    // Rank 2 exits outright before its first collective: the job ends, non-zero, at once.
    let env = [("FAKE_NCCL_FAIL_RANK", "2"), ("FAKE_NCCL_FAIL_MODE", "exit"), ("FAKE_NCCL_TIMEOUT_SECS", "5")];
    failed_quickly(check_nccl(4, &cuda, &nccl, &[], &env));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn rccl_is_the_same_table_loaded_from_librccl() {
    let dir = scratch("nccl-rccl");
    let (cuda, nccl) = build_fakes(&dir);
    let rccl = dir.join("librccl.so");
    std::fs::copy(&nccl, &rccl).unwrap();
    let missing = dir.join("no-such-libnccl.so.2");
    // TRIDENT_NCCL names a missing file: RCCL must come from TRIDENT_RCCL alone.
    let rccl_env = [("TRIDENT_RCCL", rccl.to_str().unwrap())];
    let (o, _) = check_nccl(2, &cuda, &missing, &["--comm-library", "rccl"], &rccl_env);
    let out = stdout(&o);
    assert!(o.status.success(), "{}{out}", stderr(&o));
    assert!(out.contains("(RCCL 2.32.99, ") && out.contains(&rccl.display().to_string()), "{out}");

    let gone = [("TRIDENT_RCCL", "/nonexistent/librccl.so")];
    let (o, _) = check_nccl(2, &cuda, &nccl, &["--comm-library", "rccl"], &gone);
    let errors = error_lines(&o);
    assert!(!o.status.success());
    assert_eq!(errors.len(), 1, "printed once: {}", stderr(&o));
    assert!(errors[0].contains("/nonexistent/librccl.so not found"), "{}", errors[0]);

    let (o, _) = check_nccl(2, &cuda, &nccl, &["--comm-library", "mpi"], &[]);
    let errors = error_lines(&o);
    assert_eq!(errors, ["trident: error: flag --comm-library: found 'mpi', expected nccl or rccl"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_a_driver_check_nccl_says_so_once() {
    let dir = scratch("nccl-nodriver");
    let (_, nccl) = build_fakes(&dir);
    let (o, _) = check_nccl(2, Path::new("/nonexistent/libcuda.so.1"), &nccl, &[], &[]);
    assert!(!o.status.success());
    assert_eq!(
        error_lines(&o),
        ["trident: error: check nccl (NCCL) needs an NVIDIA GPU: /nonexistent/libcuda.so.1 not found (no NVIDIA driver on this machine)"]
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs the binary alone with the fakes (no mpirun).
fn run_with(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for v in ["TRIDENT_LIBCUDA", "TRIDENT_NCCL", "TRIDENT_RCCL"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the trident binary runs")
}

#[test]
fn the_real_nccl_fails_its_init_without_a_driver_in_its_own_words() {
    let Some(real) = gpu_test_library(NCCL_LIBRARY) else {
        eprintln!("!!!!! NCCL not installed (make gpu-test-libs): the real-NCCL init test is skipped !!!!!");
        return;
    };
    let dir = scratch("nccl-real");
    let (cuda, _) = build_fakes(&dir);
    // The wheel's NCCL reaches its CUDA runtime, which finds no driver of its own: every rank
    // fails in ncclCommInitRank, with ncclGetLastError's text, and none hangs.
    let (o, _) = check_nccl(2, &cuda, &real, &[], &[]);
    assert!(!o.status.success());
    let errors = error_lines(&o);
    assert!(!errors.is_empty(), "{}", stderr(&o));
    for line in &errors {
        assert!(
            line.contains("NCCL: ncclCommInitRank failed with ncclUnhandledCudaError (1): unhandled cuda error"),
            "{line}"
        );
        assert!(line.contains("Cuda failure"), "ncclGetLastError's text: {line}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cuda_benchmarks_report_fractions_of_peak_or_fail_in_one_line() {
    let dir = scratch("cuda-bench");
    let (cuda, nccl) = build_fakes(&dir);
    // All-reduce through the fake NCCL on 2 ranks: one JSON line per size, printed once.
    let mut c = mpirun_command(2, &["bench", "allreduce", "--device", "cuda"]);
    c.args(["--max-size", "64K", "--min-seconds", "0.01", "--json"])
        .env("TRIDENT_LIBCUDA", &cuda)
        .env("TRIDENT_NCCL", &nccl);
    let o = c.output().expect("mpirun runs");
    let out = stdout(&o);
    assert!(o.status.success(), "{}{out}", stderr(&o));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 7, "1 KiB .. 64 KiB: {out}");
    for (i, (line, size)) in lines.iter().zip(["1 KiB", "2 KiB", "4 KiB", "8 KiB", "16 KiB", "32 KiB", "64 KiB"]).enumerate() {
        assert!(line.contains(&format!("\"shape\": \"{size} on 2 ranks\"")), "{line}");
        assert!(line.contains("\"device\": \"Fake A100-SXM4-40GB\"") && line.contains("\"peak\": 300.0"), "{line}");
        assert!(line.contains("\"unit\": \"GB/s bus\"") && line.contains("NCCL 2.32.99"), "{line}");
        let ratio: f64 = json_field(line, "ratio").unwrap().parse().unwrap();
        let achieved: f64 = json_field(line, "achieved").unwrap().parse().unwrap();
        let ms: f64 = json_field(line, "ms").unwrap().parse().unwrap();
        // Bus bandwidth on 2 ranks is the message's bytes over the time; achieved is printed to
        // 3 decimals (a loaded machine can take milliseconds for 1 KiB: 0.000 GB/s).
        let expected = (1024u64 << i) as f64 / (ms * 1e6);
        assert!(ms > 0.0 && (achieved - expected).abs() <= 0.0006 + 0.02 * expected, "{line}");
        assert!((ratio - achieved / 300.0).abs() < 1e-3, "{line}");
    }

    // No driver: one line, non-zero, for each CUDA benchmark.
    let none = Path::new("/nonexistent/libcuda.so.1");
    for what in ["gemm", "attention", "layernorm", "gelu", "xent", "embedding"] {
        let o = run_with(&["bench", what, "--device", "cuda"], &[("TRIDENT_LIBCUDA", none)]);
        assert_clean_error(
            &o,
            &[&format!("bench {what} --device cuda needs an NVIDIA GPU: /nonexistent/libcuda.so.1 not found")],
        );
    }
    let o = run_with(&["bench", "allreduce", "--device", "cuda"], &[("TRIDENT_LIBCUDA", none)]);
    assert_clean_error(&o, &["bench allreduce --device cuda needs an NVIDIA GPU"]);
    let o = run_with(&["bench", "peak", "--device", "cuda"], &[("TRIDENT_LIBCUDA", &cuda)]);
    assert_clean_error(&o, &["the GPU benchmarks are gemm, gemm-bwd, attention, layernorm, gelu, xent, embedding, step and allreduce"]);
    let o = run_with(&["bench", "step", "--device", "cuda"], &[("TRIDENT_LIBCUDA", &cuda)]);
    assert_clean_error(&o, &["bench step --device cuda needs --dtype bf16"]);
    let o = run_with(&["bench", "gemm", "--device", "gpu"], &[]);
    assert_clean_error(&o, &["flag --device: found 'gpu', expected cpu, cuda or hip"]);
    let o = run_with(&["bench", "gelu"], &[]);
    assert_clean_error(&o, &["bench gelu times a GPU kernel: add --device cuda or --device hip"]);

    // The fake driver: the kernel file compiles (NVRTC) and the module load is refused.
    if let Some(nvrtc) = gpu_test_library(NVRTC_LIBRARY) {
        let cache = dir.join("cache");
        let env = [
            ("TRIDENT_LIBCUDA", cuda.as_path()),
            ("TRIDENT_NVRTC", nvrtc.as_path()),
            ("TRIDENT_CACHE_DIR", cache.as_path()),
        ];
        for what in ["gemm", "attention", "layernorm", "gelu", "xent", "embedding"] {
            let o = run_with(&["bench", what, "--device", "cuda"], &env);
            assert_clean_error(
                &o,
                &["cuModuleLoadData failed with CUDA_ERROR_NOT_SUPPORTED (801): fake driver: cannot run kernels"],
            );
        }
    } else {
        eprintln!("!!!!! NVRTC not installed (make gpu-test-libs): the fake-driver part of the CUDA bench test is skipped !!!!!");
    }
    let _ = std::fs::remove_dir_all(dir);
}
