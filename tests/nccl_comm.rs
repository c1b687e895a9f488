//! The NCCL Comm (`src/gpu/collectives.rs`) under mpirun, on a machine without GPUs: a fake
//! `libnccl.so.2` (`tests/gpu/fake_libnccl.c`: ranks meet in POSIX shared memory named from the
//! unique id) and the fake `libcuda.so.1` with host-memory buffers, streams and events
//! (`fake_libcuda.c` + `fake_libcuda_memory.c`), both built here with `cc`. `trident check nccl`
//! runs every collective on "device" memory and compares it with MPI on host memory bit for bit;
//! these tests run it on 2 and 4 ranks, with a wrong result planted, with a peer that vanishes or
//! exits, with RCCL selected by `--comm-library rccl` and `TRIDENT_RCCL`, and with no driver.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
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
            .output()
            .expect("cc runs");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    (cuda, nccl)
}

/// `trident check nccl` on `ranks` ranks with the fakes and extra environment variables.
fn check_nccl(ranks: usize, cuda: &Path, nccl: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--allow-run-as-root", "-np", &ranks.to_string(), BIN, "check", "nccl"])
        .args(extra_args)
        .env("TRIDENT_LIBCUDA", cuda)
        .env("TRIDENT_NCCL", nccl);
    for v in ["TRIDENT_RCCL", "TRIDENT_NCCL_TIMEOUT_SECS", "FAKE_NCCL_FAIL_RANK", "FAKE_NCCL_CORRUPT_RANK"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let start = Instant::now();
    let o = c.output().expect("mpirun runs");
    (o, start.elapsed())
}

/// The lines of stderr that trident printed.
fn error_lines(o: &Output) -> Vec<String> {
    stderr(o).lines().filter(|l| l.starts_with("trident: error:")).map(str::to_string).collect()
}

#[test]
fn every_collective_equals_mpi_bit_for_bit_on_2_and_4_ranks() {
    let dir = scratch("nccl-fake");
    let (cuda, nccl) = build_fakes(&dir);
    for ranks in [2, 4] {
        let (o, took) = check_nccl(ranks, &cuda, &nccl, &[], &[]);
        let out = stdout(&o);
        assert!(o.status.success(), "{ranks} ranks: {}{out}", stderr(&o));
        assert!(
            out.contains(&format!("31 collectives on device memory equal MPI's bit for bit on each of {ranks} ranks"))
                && out.contains("NCCL 2.32.99")
                && out.contains(&nccl.display().to_string()),
            "{out}"
        );
        assert_eq!(out.lines().count(), 1, "printed once: {out}");
        eprintln!("{ranks} ranks: check nccl took {:.2} s", took.as_secs_f64());
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

#[test]
fn a_peer_that_vanishes_ends_every_surviving_rank_with_a_clear_error() {
    let dir = scratch("nccl-vanish");
    let (cuda, nccl) = build_fakes(&dir);
    // Rank 1 stops taking part at its third collective; the fake NCCL gives up after 2 s.
    let env = [("FAKE_NCCL_FAIL_RANK", "1"), ("FAKE_NCCL_FAIL_AT", "3"), ("FAKE_NCCL_TIMEOUT_SECS", "2")];
    let (o, took) = check_nccl(4, &cuda, &nccl, &[], &env);
    assert!(!o.status.success());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let errors = error_lines(&o);
    for survivor in [0, 2, 3] {
        let line = errors.iter().find(|l| l.starts_with(&format!("trident: error: rank {survivor}: ")));
        let line = line.unwrap_or_else(|| panic!("rank {survivor} printed no error: {}", stderr(&o)));
        assert!(
            line.contains("NCCL: ncclReduceScatter failed with ncclRemoteError (6)")
                && line.contains("rank 1 did not arrive at ncclReduceScatter within 2 s"),
            "{line}"
        );
    }
    assert!(!errors.iter().any(|l| l.contains("rank 1:")), "{errors:?}");
    assert!(!stderr(&o).contains("panicked"));

    // Rank 2 exits outright before its first collective: the job ends, non-zero, at once.
    let env = [("FAKE_NCCL_FAIL_RANK", "2"), ("FAKE_NCCL_FAIL_MODE", "exit"), ("FAKE_NCCL_TIMEOUT_SECS", "5")];
    let (o, took) = check_nccl(4, &cuda, &nccl, &[], &env);
    assert!(!o.status.success());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
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
