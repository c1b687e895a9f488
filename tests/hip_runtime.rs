//! The HIP runtime, hipRTC and RCCL at run time, on a machine without ROCm: `trident info`'s AMD
//! section and `--device hip` with nothing installed, and with a fake `libamdhip64.so` (built
//! here from `tests/gpu/fake_libamdhip64.c`) that reports two MI250X GCDs but cannot run kernels,
//! one whose `hipInit` fails, and one that lacks an entry point; and a fake `libhiprtc.so`
//! (`tests/gpu/fake_libhiprtc.c`) for hipRTC's version line and error mapping.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HIP_VARS: [&str; 4] = ["TRIDENT_LIBAMDHIP64", "TRIDENT_HIPRTC", "TRIDENT_RCCL", "FAKE_HIP_INIT_FAIL"];

/// Runs the binary with extra environment variables (and no inherited HIP library variables).
fn run_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for v in HIP_VARS {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the trident binary runs")
}

/// Builds the fake HIP runtime (with extra C flags) into `dir`.
fn fake_libamdhip64(dir: &Path, flags: &[&str]) -> PathBuf {
    fake_library(dir, "libamdhip64", flags)
}

/// Builds `tests/gpu/fake_<name>.c` into `dir/<name>.so`.
fn fake_library(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(format!("{name}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/gpu/fake_{name}.c"));
    let o =
        Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src).args(flags).output().expect("cc runs");
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

const TRAIN_HIP: [&str; 7] = ["train", "--device", "hip", "--preset", "tiny", "--data-path", "x"];

#[test]
fn without_rocm_info_says_so_and_device_hip_fails_in_one_line() {
    let rocm = Path::new("/dev/kfd").exists();
    let o = run_env(&["info", "--cpu-threads", "1"], &[]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    if rocm {
        eprintln!("this machine has an AMD GPU driver: the no-ROCm lines are checked with missing files");
    } else {
        assert!(out.contains("hip runtime: libamdhip64.so not found (no ROCm on this machine)"), "{out}");
        assert!(
            out.contains("hiprtc: libhiprtc.so / libhiprtc.so.7 / libhiprtc.so.6 / libhiprtc.so.5 not found"),
            "{out}"
        );
        assert!(out.contains("rccl: librccl.so.1 / librccl.so not found"), "{out}");
        let o = run_env(&TRAIN_HIP, &[]);
        assert_clean_error(
            &o,
            &["--device hip: libamdhip64.so not found (no ROCm on this machine); train on the CPU with --device cpu"],
        );
    }
    assert!(out.contains("hip backend: not built yet"), "{out}");
    let missing = [
        ("TRIDENT_LIBAMDHIP64", Path::new("/nonexistent/libamdhip64.so")),
        ("TRIDENT_HIPRTC", Path::new("/nonexistent/libhiprtc.so")),
        ("TRIDENT_RCCL", Path::new("/nonexistent/librccl.so")),
    ];
    let out = stdout(&run_env(&["info", "--cpu-threads", "1"], &missing));
    for line in [
        "hip runtime: /nonexistent/libamdhip64.so not found (no ROCm on this machine)",
        "hiprtc: /nonexistent/libhiprtc.so not found (no ROCm on this machine",
        "rccl: /nonexistent/librccl.so not found",
    ] {
        assert!(out.contains(line), "{line} not in {out}");
    }
    let o = run_env(&TRAIN_HIP, &missing[..1]);
    assert_clean_error(
        &o,
        &["--device hip: /nonexistent/libamdhip64.so not found (no ROCm on this machine)", "--device cpu"],
    );
}

#[test]
fn a_hip_runtime_without_the_hip_backend_is_reported_not_used() {
    let dir = scratch("fake-libamdhip64");
    let lib = fake_libamdhip64(&dir, &[]);
    let env = [("TRIDENT_LIBAMDHIP64", lib.as_path())];
    let o = run_env(&["info", "--cpu-threads", "1"], &env);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = lib.canonicalize().unwrap().display().to_string();
    assert!(out.contains(&format!("hip runtime: HIP 6.2.41133, driver 60241133 ({path}), 2 devices")), "{out}");
    for i in 0..2 {
        let line = format!("hip device {i}: AMD Instinct MI250X, gfx90a, 110 compute units, 64.0 GiB");
        assert!(out.contains(&line), "{line} not in {out}");
    }
    let o = run_env(&TRAIN_HIP, &env);
    assert_clean_error(
        &o,
        &["--device hip: the HIP runtime (HIP 6.2.41133, 2 devices) was found", "the HIP backend is not built yet"],
    );

    // hipInit failing: the runtime's own name and message for the code.
    let mut c = Command::new(BIN);
    c.args(["info", "--cpu-threads", "1"]).env("TRIDENT_LIBAMDHIP64", &lib).env("FAKE_HIP_INIT_FAIL", "1");
    let out = stdout(&c.output().unwrap());
    assert!(
        out.contains(
            "hip runtime: HIP: hipInit failed with hipErrorNoDevice (100): no ROCm-capable device is detected"
        ),
        "{out}"
    );
    let mut c = Command::new(BIN);
    c.args(TRAIN_HIP).env("TRIDENT_LIBAMDHIP64", &lib).env("FAKE_HIP_INIT_FAIL", "1");
    assert_clean_error(
        &c.output().unwrap(),
        &[
            "--device hip: the HIP runtime was found but HIP: hipInit failed with hipErrorNoDevice (100)",
            "--device cpu",
        ],
    );

    // A runtime that lacks entry points: the missing symbol is named, and without hipGetErrorName
    // the code is named from trident's own table.
    let old = dir.join("old");
    std::fs::create_dir_all(&old).unwrap();
    let old_lib = fake_libamdhip64(&old, &["-DFAKE_HIP_OLD"]);
    let o = run_env(&["info", "--cpu-threads", "1"], &[("TRIDENT_LIBAMDHIP64", &old_lib)]);
    let out = stdout(&o);
    assert!(
        o.status.success() && out.contains("hip device 0: ") && out.contains("has no symbol hipDeviceGetAttribute"),
        "{out}{}",
        stderr(&o)
    );
    let mut c = Command::new(BIN);
    c.args(["info", "--cpu-threads", "1"]).env("TRIDENT_LIBAMDHIP64", &old_lib).env("FAKE_HIP_INIT_FAIL", "1");
    let out = stdout(&c.output().unwrap());
    assert!(
        out.contains("hip runtime: HIP: hipInit failed with hipErrorNoDevice (100): no description (hipGetErrorString unavailable)"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hiprtc_reports_its_version_and_names_its_codes() {
    use trident::gpu::hiprtc::Hiprtc;
    let dir = scratch("fake-libhiprtc");
    let lib = fake_library(&dir, "libhiprtc", &[]);
    let out = stdout(&run_env(&["info", "--cpu-threads", "1"], &[("TRIDENT_HIPRTC", &lib)]));
    assert!(out.contains(&format!("hiprtc: 6.2 ({})", lib.canonicalize().unwrap().display())), "{out}");
    let hiprtc = Hiprtc::open(&[lib.display().to_string()]).unwrap();
    assert_eq!(hiprtc.version().unwrap(), (6, 2));
    let e = hiprtc.check("hiprtcCompileProgram", 6).unwrap_err().to_string();
    assert_eq!(e, "hipRTC: hiprtcCompileProgram failed with HIPRTC_ERROR_COMPILATION (6): HIPRTC_ERROR_COMPILATION");
    let e = hiprtc.check("hiprtcCreateProgram", 3).unwrap_err().to_string();
    assert!(e.contains("HIPRTC_ERROR_INVALID_INPUT (3): no description"), "{e}");
    // An entry point the fake lacks: named, not a crash.
    // SAFETY: the call fails at symbol lookup, before any pointer is used.
    let e = unsafe { hiprtc.api.hiprtcGetCodeSize(std::ptr::null_mut(), std::ptr::null_mut()) }.err().unwrap();
    assert!(e.to_string().contains("has no symbol hiprtcGetCodeSize"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
