//! `make gpu-first-light` (`tests/gpu/first-light.sh`) on the emulated GPU of
//! `tests/cuda_device.rs`: the steps that take seconds there (the GPU's environment, `trident
//! info`, `check gpu`, the sm_90a probe, the cuda-vs-cpu training pair on a one-layer model and
//! its loss check), one that cannot run here (compute-sanitizer, absent: it must fail and the run
//! with it, after the others), the summary JSON that lists each, and a deadline that leaves no
//! time (every step skipped, said). `check ops`, `check nccl` and the bench table have their own
//! tests (tests/cuda_device.rs, tests/gpu_bench.rs).
//!
//! Without NVRTC these tests skip, saying so (`common::skip`; a failure under `TRIDENT_CI=1`).

mod common;
use common::gpu_device::{self, Emulated};
use common::*;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;

fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Result<Emulated, Missing>> = OnceLock::new();
    present(BUILT.get_or_init(gpu_device::emulate_cuda))
}

/// Runs the script into `out` with the emulated driver, `steps`, and `more` arguments.
fn first_light(emu: &Emulated, out: &Path, steps: &str, more: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/first-light.sh");
    let mut c = Command::new("bash");
    c.arg(&script).arg("--out").arg(out).args(more);
    for (k, v) in &emu.env {
        c.env(k, v);
    }
    c.env("TRIDENT_BIN", BIN)
        .env("FIRST_LIGHT_STEPS", steps)
        .env("FIRST_LIGHT_ITERS", "4")
        .env(
            "FIRST_LIGHT_MODEL",
            "--num-layers 1 --hidden-size 128 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 \
             --global-batch-size 2 --lr 1e-3",
        )
        // No compute-sanitizer on the PATH: its step must fail and say why.
        .env("PATH", "/usr/bin:/bin");
    c.output().expect("bash runs the script")
}

/// The summary's rows as (step, status).
fn statuses(out: &Path) -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(out.join("summary.json")).expect("summary.json is written");
    doc.lines()
        .filter(|l| l.trim_start().starts_with("{\"step\""))
        .map(|l| {
            let v = trident::data::json::string_values(l.trim().trim_end_matches(',').as_bytes(), &["step", "status"])
                .unwrap_or_else(|e| panic!("{l}: {e}"));
            (v[0].clone(), v[1].clone())
        })
        .collect()
}

#[test]
fn first_light_runs_its_steps_on_the_emulated_gpu_and_a_failing_step_fails_the_run_after_the_rest() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("first-light");
    let out = dir.join("out");
    let o = first_light(emu, &out, "env info check-gpu probe train losses memcheck", &["--deadline", "900"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "compute-sanitizer is absent, so the run fails:\n{text}\n{}", stderr(&o));
    let want = [
        ("env", "passed"),
        ("info", "passed"),
        ("check-gpu", "passed"),
        ("probe", "passed"),
        ("train", "passed"),
        ("losses", "passed"),
        ("memcheck", "failed"),
    ];
    let got = statuses(&out);
    assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())), "{text}");
    assert!(text.contains("no compute-sanitizer on the PATH"), "{text}");
    // The training pair wrote both logs, 4 iterations each, and the losses were judged from the 2nd.
    for dev in ["cuda", "cpu"] {
        let log = std::fs::read_to_string(out.join(format!("train-{dev}.jsonl"))).unwrap();
        assert_eq!(log.lines().count(), 4, "{dev}: {log}");
    }
    let losses = std::fs::read_to_string(out.join("losses.log")).unwrap();
    assert!(
        losses.contains("(before --from: not judged)") && losses.contains("3 iterations agree within 1e-2"),
        "{losses}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_deadline_that_leaves_no_time_skips_every_step_and_says_so() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("first-light-deadline");
    let out = dir.join("out");
    let o = first_light(emu, &out, "info check-gpu", &["--deadline", "0"]);
    assert!(o.status.success(), "skipped steps are not failures:\n{}", stdout(&o));
    assert_eq!(statuses(&out), [("info".to_string(), "skipped".to_string()), ("check-gpu".into(), "skipped".into())]);
    let bad = first_light(emu, &out, "info", &["--deadline", "soon"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--deadline takes whole seconds"), "{}", stderr(&bad));
    let _ = std::fs::remove_dir_all(dir);
}

/// `make gpu-layouts` (`tests/gpu/layouts.sh`) on the emulated GPU: TP 2 x PP 2 as 4 ranks sharing
/// the one GPU (`--gpu-collectives mpi`) follows the same 4-rank run on the CPU, and the summary
/// says so; a layout the script does not know is refused before anything runs. (Its other
/// layouts are flags of the same loop; `tests/cuda_device.rs` trains each of them on emulation.)
#[test]
fn the_layouts_script_runs_four_ranks_on_the_emulated_gpu_beside_the_cpu() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("gpu-layouts");
    let out = dir.join("out");
    let layouts = |names: &str| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/layouts.sh");
        let mut c = Command::new("bash");
        c.arg(&script).arg("--out").arg(&out);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        c.env("TRIDENT_BIN", BIN).env("LAYOUTS", names).env("LAYOUTS_ITERS", "2");
        let model = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1 \
                     --global-batch-size 4 --lr 1e-3";
        c.env("LAYOUTS_MODEL", model);
        c.env("OMPI_MCA_mpi_yield_when_idle", "1").env_remove("MPI_BUNDLE").env_remove("LAYOUTS_LAUNCH");
        c.output().expect("bash runs the script")
    };
    let o = layouts("tp2-pp2");
    assert!(o.status.success(), "layouts failed:\n{}\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("layouts: tp2-pp2 follows the CPU (losses check: 2 iterations agree"), "{}", stdout(&o));
    let summary = std::fs::read_to_string(out.join("summary.tsv")).unwrap();
    assert_eq!(summary, "layout\tresult\twhy\ntp2-pp2\tpassed\t\n");
    let bad = layouts("tp3");
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("unknown layout 'tp3'"), "{}", stderr(&bad));
    let _ = std::fs::remove_dir_all(dir);
}
