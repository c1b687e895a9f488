//! The GPU libraries at run time, on a machine without a GPU: NVRTC compiles to CUBIN through the
//! module cache (hits, corruption, syntax errors), NCCL's version, unique id, error strings and
//! header values, the NCCL id exchange under mpirun, `trident info`, `--device cuda` and
//! `check gpu` with no driver, and with a fake `libcuda.so.1` (built here from
//! `tests/gpu/fake_libcuda.c`) that reports two A100s but cannot run kernels (the emulating
//! driver that does run them is tests/cuda_device.rs's).
//!
//! NVRTC and NCCL come from their pip wheels: `make test` installs them and passes their paths in
//! `TRIDENT_NVRTC` / `TRIDENT_NCCL`. Without them these tests skip, saying so (`common::skip`; a
//! failure under `TRIDENT_CI=1`).

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use trident::error::Error;
use trident::gpu::cache::{ModuleCache, Outcome};
use trident::gpu::nccl::{DataType, Flavor, Nccl, RedOp};
use trident::gpu::nvrtc::Nvrtc;

fn nvrtc_path() -> Option<PathBuf> {
    required_gpu_test_library(NVRTC_LIBRARY)
}

fn nccl_path() -> Option<PathBuf> {
    required_gpu_test_library(NCCL_LIBRARY)
}

fn nvrtc() -> Option<Nvrtc> {
    nvrtc_path().map(|p| Nvrtc::open(&[p.display().to_string()]).expect("NVRTC loads"))
}

const SCALE: &str = r#"
extern "C" __global__ void scale(float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}
"#;

fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

#[test]
fn nvrtc_compiles_for_sm80_and_sm90a_and_the_cache_hits_the_second_time() {
    let Some(nvrtc) = nvrtc() else { return };
    let (major, minor) = nvrtc.version().unwrap();
    assert!(major >= 12, "NVRTC {major}.{minor}");
    let dir = scratch("nvrtc-cache");
    let cache = ModuleCache::new(&dir);
    for arch in ["sm_80", "sm_90a"] {
        let t = std::time::Instant::now();
        let first = cache.get_or_compile(&nvrtc, "scale", SCALE, arch, &[]).unwrap();
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(first.outcome, Outcome::Compiled, "{arch}");
        assert!(is_elf(&first.bytes), "{arch}: a CUBIN is an ELF file");
        let stored = std::fs::metadata(&first.path).unwrap().modified().unwrap();
        let t = std::time::Instant::now();
        let second = cache.get_or_compile(&nvrtc, "scale", SCALE, arch, &[]).unwrap();
        let hit_ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(second.outcome, Outcome::Hit, "{arch}: no recompilation");
        assert_eq!(second.bytes, first.bytes, "{arch}: the same bytes");
        assert_eq!(std::fs::metadata(&first.path).unwrap().modified().unwrap(), stored, "{arch}: entry not rewritten");
        eprintln!("{arch}: NVRTC compile {compile_ms:.0} ms, cache hit {hit_ms:.2} ms, {} bytes", first.bytes.len());
    }
    // Two architectures, two entries; other options are another key.
    let entries = std::fs::read_dir(cache.dir()).unwrap().count();
    assert_eq!(entries, 2);
    let o = cache.get_or_compile(&nvrtc, "scale", SCALE, "sm_80", &["--use_fast_math".to_string()]).unwrap();
    assert_eq!(o.outcome, Outcome::Compiled);
    // PTX for a virtual architecture.
    let ptx = cache.get_or_compile(&nvrtc, "scale", SCALE, "compute_80", &[]).unwrap();
    let text = String::from_utf8_lossy(&ptx.bytes);
    assert!(text.contains(".target sm_80") && text.contains(".entry scale"), "{text}");
    assert_eq!(ptx.bytes.last(), Some(&0), "PTX ends in NUL for cuModuleLoadData");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_corrupt_cache_entry_is_compiled_again() {
    let Some(nvrtc) = nvrtc() else { return };
    let dir = scratch("nvrtc-corrupt");
    let cache = ModuleCache::new(&dir);
    let good = cache.get_or_compile(&nvrtc, "scale", SCALE, "sm_80", &[]).unwrap();
    let pristine = std::fs::read(&good.path).unwrap();
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let damages: [(&str, Damage, &str); 3] = [
        ("flipped byte", Box::new(|b: &mut Vec<u8>| *b.last_mut().unwrap() ^= 0x40), "checksum mismatch"),
        ("truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() / 2)), "header says"),
        ("emptied", Box::new(|b: &mut Vec<u8>| b.clear()), "shorter than"),
    ];
    for (what, damage, reason) in damages {
        let mut bytes = pristine.clone();
        damage(&mut bytes);
        std::fs::write(&good.path, &bytes).unwrap();
        let again = cache.get_or_compile(&nvrtc, "scale", SCALE, "sm_80", &[]).unwrap();
        match &again.outcome {
            Outcome::Recompiled(r) => assert!(r.contains(reason), "{what}: {r}"),
            other => panic!("{what}: expected a recompilation, got {other:?}"),
        }
        assert_eq!(again.bytes, good.bytes, "{what}: the recompiled CUBIN equals the first");
        assert_eq!(std::fs::read(&good.path).unwrap(), pristine, "{what}: the entry is replaced");
        assert_eq!(cache.get_or_compile(&nvrtc, "scale", SCALE, "sm_80", &[]).unwrap().outcome, Outcome::Hit);
    }
    // No temporary files are left beside the entry.
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_syntax_error_is_one_error_carrying_nvrtcs_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let dir = scratch("nvrtc-syntax");
    let cache = ModuleCache::new(&dir);
    let broken = "extern \"C\" __global__ void broken(float* y) { y[0] = 1.0f }\n";
    let e = cache.get_or_compile(&nvrtc, "broken", broken, "sm_80", &[]).err().expect("a compile error");
    match &e {
        Error::GpuCall { api, call, code, name, message } => {
            assert_eq!(
                (*api, *call, *code, name.as_str()),
                ("NVRTC", "nvrtcCompileProgram", 6, "NVRTC_ERROR_COMPILATION")
            );
            assert!(
                message.contains("kernel broken for sm_80")
                    && message.contains("broken.cu(1)")
                    && message.contains("error"),
                "{message}"
            );
        }
        other => panic!("expected an NVRTC error, got {other:?}"),
    }
    let line = e.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(!cache.dir().exists() || std::fs::read_dir(cache.dir()).unwrap().count() == 0, "nothing cached");
    // A bad architecture and a bad option are errors too, not panics.
    assert!(nvrtc.compile("scale", SCALE, "gfx90a", &[]).err().unwrap().to_string().contains("not a GPU architecture"));
    let e = nvrtc.compile("scale", SCALE, "sm_80", &["--no-such-option".into()]).err().unwrap().to_string();
    assert!(e.contains("NVRTC_ERROR_INVALID_OPTION"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn nvrtc_names_its_codes_as_our_table_does() {
    let Some(nvrtc) = nvrtc() else { return };
    for (code, name) in trident::gpu::status::NVRTC_RESULT_NAMES.iter().enumerate() {
        assert_eq!(nvrtc.describe(code as i32), *name, "code {code}");
    }
}

#[test]
fn nccl_reports_its_version_ids_and_errors_as_nccl_h_says() {
    let Some(path) = nccl_path() else { return };
    let nccl = Nccl::open(Flavor::Nccl, &[path.display().to_string()]).unwrap();
    let v = nccl.version().unwrap();
    assert!(v.starts_with("2."), "{v}");
    let a = nccl.unique_id().unwrap();
    let b = nccl.unique_id().unwrap();
    assert_ne!(a.internal, [0; 128]);
    assert_ne!(a, b, "each id is a new bootstrap address");
    // The library's strings begin with our table's descriptions.
    for (code, (_, message)) in trident::gpu::status::NCCL_RESULT_NAMES.iter().enumerate().skip(1) {
        let e = nccl.check("ncclTest", code as i32).unwrap_err().to_string();
        assert!(e.contains(message), "code {code}: {e}");
    }
    // Enum values against the wheel's own header.
    let header = std::fs::read_to_string(path.parent().unwrap().parent().unwrap().join("include/nccl.h")).unwrap();
    // The first "NAME = digits" (an enum member) or "#define NAME digits" in the header.
    let value = |name: &str| -> i32 {
        for (at, _) in header.match_indices(name) {
            let before = header[..at].chars().last().unwrap_or(' ');
            let rest = &header[at + name.len()..];
            if before.is_alphanumeric() || before == '_' || rest.starts_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let rest = rest.trim_start_matches([' ', '\t']);
            let rest = rest.strip_prefix('=').unwrap_or(rest).trim_start_matches([' ', '\t']);
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if !digits.is_empty() {
                return digits.parse().unwrap();
            }
        }
        panic!("{name} has no value in nccl.h")
    };
    for (name, ours) in [
        ("ncclInt8", DataType::Int8 as i32),
        ("ncclUint8", DataType::Uint8 as i32),
        ("ncclInt32", DataType::Int32 as i32),
        ("ncclUint32", DataType::Uint32 as i32),
        ("ncclInt64", DataType::Int64 as i32),
        ("ncclUint64", DataType::Uint64 as i32),
        ("ncclFloat16", DataType::Float16 as i32),
        ("ncclFloat32", DataType::Float32 as i32),
        ("ncclFloat64", DataType::Float64 as i32),
        ("ncclBfloat16", DataType::Bfloat16 as i32),
        ("ncclFloat8e4m3", DataType::Float8e4m3 as i32),
        ("ncclFloat8e5m2", DataType::Float8e5m2 as i32),
        ("ncclSum", RedOp::Sum as i32),
        ("ncclProd", RedOp::Prod as i32),
        ("ncclMax", RedOp::Max as i32),
        ("ncclMin", RedOp::Min as i32),
        ("ncclAvg", RedOp::Avg as i32),
        ("NCCL_UNIQUE_ID_BYTES", 128),
    ] {
        assert_eq!(value(name), ours, "{name}");
    }
    for (code, (name, _)) in trident::gpu::status::NCCL_RESULT_NAMES.iter().enumerate() {
        assert_eq!(value(name), code as i32, "{name}");
    }
}

#[test]
fn every_rank_receives_rank_zeros_nccl_id() {
    let Some(path) = nccl_path() else { return };
    for ranks in [2, 3] {
        let o = mpirun_command(ranks, &["check", "nccl-id"]).env("TRIDENT_NCCL", &path).output().expect("mpirun runs");
        let out = stdout(&o);
        assert!(o.status.success(), "{ranks} ranks: {}{out}", stderr(&o));
        assert!(
            out.contains(&format!("all {ranks} ranks hold the same 128 bytes")) && out.contains("with NCCL 2."),
            "{out}"
        );
        assert_eq!(out.lines().count(), 1, "printed once: {out}");
    }
    // Without NCCL, rank 0 says so once and the job fails.
    let o = mpirun_command(2, &["check", "nccl-id"])
        .env("TRIDENT_NCCL", "/nonexistent/libnccl.so.2")
        .output()
        .expect("mpirun runs");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("trident: error:")).count(), 1, "{err}");
    assert!(err.contains("/nonexistent/libnccl.so.2 not found"), "{err}");
}

/// Runs the binary with extra environment variables (and no inherited GPU library variables).
fn run_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for v in ["TRIDENT_LIBCUDA", "TRIDENT_NVRTC", "TRIDENT_NCCL", "FAKE_CUDA_INIT_FAIL"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the trident binary runs")
}

/// Builds the fake driver (with extra C flags) into `dir`.
fn fake_libcuda(dir: &Path, flags: &[&str]) -> PathBuf {
    let out = dir.join("libcuda.so.1");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/fake_libcuda.c");
    let o =
        Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src).args(flags).output().expect("cc runs");
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
fn without_a_driver_info_says_so_and_cuda_commands_fail_in_one_line() {
    let nvrtc = nvrtc_path();
    let nccl = nccl_path();
    let mut env: Vec<(&str, &Path)> = vec![("TRIDENT_LIBCUDA", Path::new("/nonexistent/libcuda.so.1"))];
    let o = run_env(&["info", "--cpu-threads", "1"], &[]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("this machine has an NVIDIA driver: the no-driver lines are checked with a missing TRIDENT_LIBCUDA");
    } else {
        assert!(out.contains("cuda driver: libcuda.so.1 not found (no NVIDIA driver on this machine)"), "{out}");
    }
    assert!(out.contains("cuda backend: `train --device cuda --bf16`") && out.contains("; 1 threads;"), "{out}");
    if let (Some(nvrtc), Some(nccl)) = (&nvrtc, &nccl) {
        env.push(("TRIDENT_NVRTC", nvrtc));
        env.push(("TRIDENT_NCCL", nccl));
        let o = run_env(&["info", "--cpu-threads", "1"], &env);
        let out = stdout(&o);
        assert!(
            out.contains("cuda driver: /nonexistent/libcuda.so.1 not found (no NVIDIA driver on this machine)"),
            "{out}"
        );
        assert!(out.contains("nvrtc: 13.") && out.contains(&nvrtc.display().to_string()), "{out}");
        assert!(out.contains("nccl: 2.") && out.contains(&nccl.display().to_string()), "{out}");
    }
    let o = run_env(&["info", "--cpu-threads", "1"], &[("TRIDENT_NVRTC", Path::new("/nonexistent/libnvrtc.so.13"))]);
    assert!(stdout(&o).contains("nvrtc: /nonexistent/libnvrtc.so.13 not found (no CUDA toolkit"), "{}", stdout(&o));

    let no_driver = [("TRIDENT_LIBCUDA", Path::new("/nonexistent/libcuda.so.1"))];
    let o = run_env(&["train", "--device", "cuda", "--preset", "tiny", "--data-path", "x", "--bf16"], &no_driver);
    assert_clean_error(
        &o,
        &["--device cuda: /nonexistent/libcuda.so.1 not found (no NVIDIA driver on this machine)", "--device cpu"],
    );
    // Flags are checked before any runtime is loaded.
    let o = run_env(&["train", "--device", "cuda", "--preset", "tiny", "--data-path", "x"], &no_driver);
    assert_clean_error(&o, &["--device cuda needs --bf16 or --fp16"]);
    let o = run_env(&["check", "gpu"], &no_driver);
    assert_clean_error(&o, &["check gpu needs an NVIDIA GPU: /nonexistent/libcuda.so.1 not found"]);
}

#[test]
fn make_gpu_check_without_a_gpu_says_it_needs_one() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("this machine has an NVIDIA driver: `make gpu-check` is a real run here, not tested");
        return;
    }
    // `-o build`: the binary under test is current; make must not rebuild it under running tests.
    let o = Command::new("make")
        .args(["--no-print-directory", "-o", "build", "gpu-check", &format!("BIN={BIN}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TRIDENT_LIBCUDA")
        .output()
        .expect("make runs");
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(!o.status.success(), "{out}{err}");
    assert!(!err.contains("panicked") && !err.contains("core dumped"), "{err}");
    assert!(out.contains("cuda driver: libcuda.so.1 not found"), "{out}");
    assert!(
        err.contains(
            "trident: error: check gpu needs an NVIDIA GPU: libcuda.so.1 not found (no NVIDIA driver on this machine)"
        ),
        "{err}"
    );
}

#[test]
fn a_driver_without_the_cuda_backend_is_reported_not_used() {
    let dir = scratch("fake-libcuda");
    let lib = fake_libcuda(&dir, &[]);
    let o = run_env(&["info", "--cpu-threads", "1"], &[("TRIDENT_LIBCUDA", &lib)]);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("cuda driver: CUDA 12.4 ({}), 2 devices", lib.canonicalize().unwrap().display())),
        "{out}"
    );
    assert!(
        out.contains("cuda device 1: Fake A100-SXM4-40GB, compute capability 8.0 (sm_80), 108 SMs, 40.0 GiB"),
        "{out}"
    );
    // The CUDA Device needs --bf16; with it, creating the Device reaches cuModuleLoadData, which
    // this fake refuses (tests/cuda_device.rs trains on the emulating one).
    let o =
        run_env(&["train", "--device", "cuda", "--preset", "tiny", "--data-path", "x"], &[("TRIDENT_LIBCUDA", &lib)]);
    assert_clean_error(&o, &["--device cuda needs --bf16"]);

    // cuInit failing: the driver's own name and message for the code.
    let mut c = Command::new(BIN);
    c.args(["info", "--cpu-threads", "1"]).env("TRIDENT_LIBCUDA", &lib).env("FAKE_CUDA_INIT_FAIL", "1");
    let out = stdout(&c.output().unwrap());
    assert!(out.contains("cuda driver: CUDA driver: cuInit failed with CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected"), "{out}");

    // A driver that lacks an entry point: the symbol is named, nothing panics.
    let old = dir.join("old");
    std::fs::create_dir_all(&old).unwrap();
    let old_lib = fake_libcuda(&old, &["-DFAKE_CUDA_NO_ATTRIBUTE"]);
    let o = run_env(&["info", "--cpu-threads", "1"], &[("TRIDENT_LIBCUDA", &old_lib)]);
    let out = stdout(&o);
    assert!(o.status.success() && out.contains("has no symbol cuDeviceGetAttribute"), "{out}{}", stderr(&o));

    // check gpu goes through NVRTC and the cache up to cuModuleLoadData, which the fake refuses.
    if let Some(nvrtc) = nvrtc_path() {
        let cache = dir.join("cache");
        let env = [
            ("TRIDENT_LIBCUDA", lib.as_path()),
            ("TRIDENT_NVRTC", nvrtc.as_path()),
            ("TRIDENT_CACHE_DIR", cache.as_path()),
        ];
        let o = run_env(&["check", "gpu"], &env);
        assert_clean_error(&o, &["CUDA driver: cuModuleLoadData failed with CUDA_ERROR_NOT_SUPPORTED (801): fake driver: cannot run kernels"]);
        let entries: Vec<_> =
            std::fs::read_dir(cache.join("kernels")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries.len(), 1);
        assert!(entries[0].to_string_lossy().starts_with("trident_smoke_axpy-sm_80-"), "{entries:?}");

        // Training creates the CUDA Device, whose first module load the fake refuses: one clean
        // line naming the call (the kernels compile into the cache tests/cuda_device.rs shares).
        let shared_cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-device/kernel-cache");
        let env = [
            ("TRIDENT_LIBCUDA", lib.as_path()),
            ("TRIDENT_NVRTC", nvrtc.as_path()),
            ("TRIDENT_CACHE_DIR", shared_cache.as_path()),
        ];
        let o = run_env(
            &[
                "train",
                "--device",
                "cuda",
                "--bf16",
                "--preset",
                "tiny",
                "--num-attention-heads",
                "2",
                "--data-path",
                "x",
            ],
            &env,
        );
        assert_clean_error(&o, &["cuModuleLoadData failed with CUDA_ERROR_NOT_SUPPORTED (801)"]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Every embedded kernel file compiles with NVRTC for sm_80 and sm_90a (headers by include name),
/// as both modules (bf16, and fp16: `-DTRIDENT_FP16`, its own cache entry), each CUBIN holds the
/// functions of the kernel table with the static shared memory the table states, and a second
/// request is a cache hit. Prints the compile time and size per file.
#[test]
fn every_embedded_kernel_compiles_with_nvrtc_for_sm80_and_sm90a() {
    use trident::gpu::kernels::cuda::{self, KernelModules, Origin};
    use trident::gpu::kernels::{declared_functions, Storage, KERNELS};
    let Some(nvrtc) = nvrtc() else { return };
    let dir = scratch("nvrtc-kernels");
    let modules = KernelModules::nvrtc_only(ModuleCache::new(&dir), nvrtc);
    let mut report = String::new();
    for (file, _) in cuda::files() {
        for (arch, storage) in
            [("sm_80", Storage::Bf16), ("sm_90a", Storage::Bf16), ("sm_80", Storage::F16), ("sm_90a", Storage::F16)]
        {
            let t = std::time::Instant::now();
            let first = modules.image(file, arch, storage).unwrap_or_else(|e| panic!("{file} for {arch}: {e}"));
            let seconds = t.elapsed().as_secs_f64();
            assert_eq!(first.origin, Origin::Nvrtc(Outcome::Compiled), "{file} {arch}");
            let info = cuda::read_cubin(&first.bytes).unwrap();
            let arch_number: u32 = arch.trim_start_matches("sm_").trim_end_matches('a').parse().unwrap();
            for k in KERNELS.iter().filter(|k| k.file == *file) {
                assert!(
                    info.functions.iter().any(|f| f == k.function),
                    "{} missing from {file} for {arch}: {:?}",
                    k.function,
                    info.functions
                );
                // sm_90a CUBINs place a kernel's shared variables after a 1 KiB window the
                // system reserves (section `.nv.shared.reserved.0`): the section is 1024 B longer,
                // for static and dynamic shared memory alike (the GEMMs' is all dynamic), and for
                // every kernel of a file that declares dynamic shared memory (attention_bwd.cu's
                // delta kernel beside dK/dV and dQ).
                let file_dynamic = KERNELS.iter().any(|j| j.file == k.file && j.dynamic_shared > 0);
                let uses_shared = k.static_shared > 0 || k.dynamic_shared > 0 || file_dynamic;
                let reserved = if arch == "sm_90a" && uses_shared { 1024 } else { 0 };
                if arch_number < k.min_arch {
                    continue; // compiled as a trapping stub below its architecture
                }
                assert_eq!(
                    info.static_shared(k.function),
                    (k.static_shared + reserved) as u64,
                    "static shared memory of {} ({arch})",
                    k.function
                );
            }
            for declared in declared_functions(cuda::source(file).unwrap()) {
                assert!(info.functions.contains(&declared), "{declared} missing from {file} for {arch}");
            }
            let t = std::time::Instant::now();
            let second = modules.image(file, arch, storage).unwrap();
            assert_eq!(second.origin, Origin::Nvrtc(Outcome::Hit), "{file} {arch}");
            assert_eq!(second.bytes, first.bytes);
            report.push_str(&format!(
                "{file:18} {arch:7} {:4} nvrtc {:6.2} s  cubin {:7} B  cache hit {:5.1} ms\n",
                storage.name(),
                seconds,
                first.bytes.len(),
                t.elapsed().as_secs_f64() * 1e3
            ));
        }
    }
    let _ = writeln!(std::io::stderr(), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
