//! The HIP runtime, hipRTC and RCCL at run time, on a machine without ROCm: `trident info`'s AMD
//! section and `--device hip` with nothing installed, and with a fake `libamdhip64.so` (built
//! here from `tests/gpu/fake_libamdhip64.c`) that reports two MI250X GCDs but cannot run kernels,
//! one whose `hipInit` fails, and one that lacks an entry point; and a fake `libhiprtc.so`
//! (`tests/gpu/fake_libhiprtc.c`) for hipRTC's version line and error mapping. `trident check gpu`
//! on AMD runs end to end against the fake runtime (which executes the smoke kernel on the host),
//! its kernel compiled by the real hipRTC when the machine has one (Debian's ROCm 5.2 holds it in
//! libamdhip64.so.5 and compiles without a GPU), else by the fake. With the real hipRTC, every
//! embedded kernels-hip file is compiled for gfx90a and checked (code object header, kernels
//! present, cache hit on the second request).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HIP_VARS: [&str; 7] = [
    "TRIDENT_LIBAMDHIP64",
    "TRIDENT_HIPRTC",
    "TRIDENT_RCCL",
    "FAKE_HIP_INIT_FAIL",
    "FAKE_HIP_RUNS",
    "FAKE_HIP_WRONG",
    "TRIDENT_CACHE_DIR",
];

/// Whether the dynamic loader knows a HIP runtime (ROCm installed, with or without a GPU).
fn rocm_installed() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libamdhip64.so"))
}

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

/// A HIP training run as a user starts it; without its last word (`--bf16`) the flags are refused
/// before any runtime is loaded.
const TRAIN_HIP: [&str; 8] = ["train", "--device", "hip", "--preset", "tiny", "--data-path", "x", "--bf16"];

#[test]
fn without_rocm_info_says_so_and_device_hip_fails_in_one_line() {
    let rocm = Path::new("/dev/kfd").exists() || rocm_installed();
    let o = run_env(&["info", "--cpu-threads", "1"], &[]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    if rocm {
        eprintln!("this machine has a ROCm install: the no-ROCm lines are checked with missing files");
    } else {
        assert!(out.contains("hip runtime: libamdhip64.so not found (no ROCm on this machine)"), "{out}");
        assert!(
            out.contains(
                "hiprtc: libhiprtc.so / libhiprtc.so.7 / libhiprtc.so.6 / libhiprtc.so.5 / libamdhip64.so.5 not found"
            ),
            "{out}"
        );
        assert!(out.contains("rccl: librccl.so.1 / librccl.so not found"), "{out}");
        let o = run_env(&TRAIN_HIP, &[]);
        assert_clean_error(
            &o,
            &["--device hip: libamdhip64.so not found (no ROCm on this machine); train on the CPU with --device cpu"],
        );
    }
    assert!(out.contains("hip backend: `train --device hip --bf16`"), "{out}");
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
fn a_hip_runtime_is_reported_and_device_hip_needs_bf16_or_fp16() {
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
    let o = run_env(&TRAIN_HIP[..7], &env);
    assert_clean_error(
        &o,
        &["--device hip needs --bf16 or --fp16 (the HIP kernels multiply 16-bit operands with f32 accumulation)"],
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
    let lib = fake_library(&dir, "libhiprtc", &["-DFAKE_HIPRTC_VERSION_ONLY"]);
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

/// The real hipRTC when the machine has one (`$TRIDENT_HIPRTC`, else the sonames, which include
/// ROCm 5's libamdhip64.so.5), else None after saying why the test is skipped.
fn real_hiprtc() -> Option<trident::gpu::hiprtc::Hiprtc> {
    match trident::gpu::hiprtc::Hiprtc::load() {
        Ok(h) => Some(h),
        Err(e) => missing_hiprtc(&e).skip(),
    }
}

#[test]
fn check_gpu_on_amd_compiles_launches_and_checks_the_result_exactly() {
    let dir = scratch("hip-check-gpu");
    let runtime = fake_libamdhip64(&dir, &[]);
    let fake_rtc_dir = dir.join("rtc");
    std::fs::create_dir_all(&fake_rtc_dir).unwrap();
    let fake_rtc = fake_library(&fake_rtc_dir, "libhiprtc", &[]);
    let cache = dir.join("cache");
    let no_cuda = Path::new("/nonexistent/libcuda.so.1");
    let run = |hiprtc: Option<&Path>, extra: &[(&str, &str)]| {
        let mut c = Command::new(BIN);
        c.args(["check", "gpu"]);
        for v in HIP_VARS {
            c.env_remove(v);
        }
        c.env("TRIDENT_LIBCUDA", no_cuda).env("TRIDENT_LIBAMDHIP64", &runtime).env("TRIDENT_CACHE_DIR", &cache);
        if let Some(h) = hiprtc {
            c.env("TRIDENT_HIPRTC", h);
        }
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    // The real hipRTC when there is one (it compiles for gfx90a without a GPU), else the fake.
    let real = real_hiprtc().is_some();
    let hiprtc = if real { None } else { Some(fake_rtc.as_path()) };
    let o = run(hiprtc, &[("FAKE_HIP_RUNS", "1")]);
    let out = stdout(&o);
    // This fake runs only the smoke kernel: check gpu's second half, the HIP Device's ops, stops
    // at its first kernel (tests/hip_device.rs runs that half on the emulating runtime).
    assert!(!o.status.success(), "{out}");
    assert_clean_error(&o, &["hipModuleLoadData", "fake HIP runtime: no such kernel in the module"]);
    let line = "gpu check: device 0 (AMD Instinct MI250X, gfx90a): trident_smoke_axpy launched over 1048579 elements in 4097 blocks, result exact (compiled by hipRTC, stored in ";
    assert!(out.contains(line), "{out}");
    assert!(out.contains("gpu check: device 1 (AMD Instinct MI250X, gfx90a): trident_smoke_axpy launched over 1048579 elements in 4097 blocks, result exact (cached "), "{out}");
    let entries: Vec<String> = std::fs::read_dir(cache.join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // The smoke kernel's code object, and the first file the Device compiled before the fake refused it.
    let smoke: Vec<&String> = entries.iter().filter(|e| e.starts_with("trident_smoke_axpy-gfx90a-")).collect();
    assert!(smoke.len() == 1 && smoke[0].ends_with(".co") && entries.len() <= 2, "{entries:?}");
    // The second run loads the cached code object.
    let out = stdout(&run(hiprtc, &[("FAKE_HIP_RUNS", "1")]));
    assert!(!out.contains("compiled by hipRTC") && out.contains("result exact (cached "), "{out}");

    // One wrong element is caught, named, and fails the check.
    let o = run(hiprtc, &[("FAKE_HIP_RUNS", "1"), ("FAKE_HIP_WRONG", "1")]);
    assert_clean_error(
        &o,
        &["gpu check: trident_smoke_axpy on device 0 (AMD Instinct MI250X) computed y[1048578] = 1163, expected 1162"],
    );
    // A runtime that cannot load the code object: its own error, one line.
    let o = run(hiprtc, &[]);
    assert_clean_error(
        &o,
        &["HIP: hipModuleLoadData failed with hipErrorNotSupported (801): fake HIP runtime: cannot run kernels"],
    );
    // Neither vendor present: what each side is missing, one line, non-zero exit.
    let mut c = Command::new(BIN);
    c.args(["check", "gpu"]).env("TRIDENT_LIBCUDA", no_cuda).env("TRIDENT_LIBAMDHIP64", "/nonexistent/libamdhip64.so");
    assert_clean_error(
        &c.output().unwrap(),
        &[
            "check gpu needs an NVIDIA GPU: /nonexistent/libcuda.so.1 not found",
            "or an AMD GPU: /nonexistent/libamdhip64.so not found (no ROCm on this machine)",
        ],
    );
    // A runtime whose hipInit fails: named in the one line.
    let o = run(Some(&fake_rtc), &[("FAKE_HIP_RUNS", "1"), ("FAKE_HIP_INIT_FAIL", "1")]);
    assert_clean_error(&o, &["or an AMD GPU: HIP: hipInit failed with hipErrorNoDevice (100)"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hiprtc_compiles_every_hip_kernel_for_gfx90a() {
    use trident::gpu::cache::{ModuleCache, Outcome};
    use trident::gpu::kernels::hip::{self, code_object_header, HipKernelModules, HipOrigin};
    use trident::gpu::kernels::{cuda::read_cubin, declared_functions, Storage};
    let Some(hiprtc) = real_hiprtc() else { return };
    let dir = scratch("hiprtc-kernels");
    let modules = HipKernelModules::hiprtc_only(ModuleCache::new(&dir), hiprtc);
    // Both modules of every file (bf16, and fp16: -DTRIDENT_FP16, its own cache entry); the fp16
    // module's code objects carry its mark (kernels-hip/common/base.h) and the bf16 ones do not.
    for (file, text) in hip::files() {
        for storage in [Storage::Bf16, Storage::F16] {
            let started = std::time::Instant::now();
            let got = modules.image(file, "gfx90a", storage).unwrap_or_else(|e| panic!("{file} {storage:?}: {e}"));
            let ms = started.elapsed().as_millis();
            assert_eq!(got.origin, HipOrigin::Hiprtc(Outcome::Compiled), "{file} {storage:?}");
            let header = code_object_header(&got.bytes).unwrap();
            assert_eq!(header.arch, Some("gfx90a"), "{file}");
            assert!(header.version >= 4, "{file}: code object v{}", header.version);
            let functions = read_cubin(&got.bytes).unwrap().functions;
            for f in declared_functions(text) {
                assert!(functions.contains(&f), "{f} not in the code object of {file}: {functions:?}");
            }
            let marked = got.bytes.windows(21).any(|w| w == b"trident_storage_fp16\0");
            assert_eq!(marked, storage == Storage::F16, "{file} {storage:?}: the fp16 module's mark");
            eprintln!("hipRTC {file} ({}) for gfx90a: {} bytes in {ms} ms", storage.name(), got.bytes.len());
            let again = modules.image(file, "gfx90a", storage).unwrap().origin;
            assert_eq!(again, HipOrigin::Hiprtc(Outcome::Hit), "{file} {storage:?}");
        }
    }
    let e = modules.image("gemm_bf16.hip", "sm_80", Storage::Bf16).err().expect("not an AMD architecture").to_string();
    assert!(e.contains("'sm_80' is not an AMD GPU architecture"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_hip_compile_error_is_one_line_with_the_log() {
    use trident::gpu::cache::ModuleCache;
    let dir = scratch("hiprtc-broken");
    let lib = fake_library(&dir, "libhiprtc", &[]);
    let hiprtc = trident::gpu::hiprtc::Hiprtc::open(&[lib.display().to_string()]).unwrap();
    let cache = ModuleCache::new(&dir);
    let e = cache
        .get_or_compile_hip(&hiprtc, "broken", "#error planted\n", &[], "gfx90a", &[])
        .err()
        .expect("a compile error")
        .to_string();
    assert_eq!(
        e,
        "hipRTC: hiprtcCompileProgram failed with HIPRTC_ERROR_COMPILATION (6): kernel broken for gfx90a: kernel.hip:1:2: error: planted | 1 error generated."
    );
    assert!(!dir.join("kernels").exists(), "nothing cached for a failed compile");
    let _ = std::fs::remove_dir_all(dir);
}
