//! `make gpu-bench` (`tests/gpu/gpu-bench.sh`) end to end on the emulated GPU of
//! `tests/cuda_device.rs` (`tests/gpu/emu_libcuda.cpp` through `TRIDENT_LIBCUDA`, NVRTC from `make
//! gpu-test-libs`), on tiny shapes so that it takes seconds: trident's GEMM, attention and
//! training step benches, PyTorch's side when the machine has a PyTorch (on the CPU, through
//! `GPU_BENCH_TORCH_DEVICE=cpu`), the table of ratios and its JSON. The numbers are the
//! emulator's and mean nothing; what is checked is the table's shape, that every cell is the
//! JSON's value, that each ratio is trident's value over PyTorch's, and that what was skipped is
//! said. Without PyTorch the comparison part says loudly that it skipped.
//!
//! Without NVRTC these tests skip, saying so (`common::skip`; a failure under `TRIDENT_CI=1`).

mod common;
use common::gpu_device::{self, Emulated};
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use trident::data::json::string_values;

/// The table's numeric columns, as the script's header names them, and the JSON key of each
/// (after bench, case and shape).
const NUMERIC: [(&str, &str); 11] = [
    ("trident_ms", "trident_ms"),
    ("torch_ms", "torch_ms"),
    ("time_ratio", "time_ratio"),
    ("trident_tflops", "trident_tflops"),
    ("torch_tflops", "torch_tflops"),
    ("tflops_ratio", "tflops_ratio"),
    ("trident_tok/s", "trident_tokens_per_s"),
    ("torch_tok/s", "torch_tokens_per_s"),
    ("tok/s_ratio", "tokens_per_s_ratio"),
    ("trident_mfu", "trident_mfu"),
    ("torch_mfu", "torch_mfu"),
];

/// The table's columns, as the script's header names them.
fn columns() -> Vec<&'static str> {
    ["bench", "case", "shape"].into_iter().chain(NUMERIC.map(|(column, _)| column)).collect()
}

/// Tiny cases: GPT-2-like GEMMs, attention at head dims 64 and 128 and grouped-query (4 heads on
/// 2 key/value heads), a 1-layer GPT-2 step and a 1-layer Llama step (2 key/value heads, SwiGLU
/// width 192). PyTorch's steps run eager only here (torch.compile on the CPU takes minutes).
const GEMMS: &str = "gpt2.qkv=64x96x32 gpt2.head=64x384x32";
const ATTENTION: &str = "d64=1x64x2x64 d128=1x32x1x128 gqa=1x32x4x64x2";
const STEP: &str = "tiny=1x128x2x257x1x16";
const LLAMA_STEP: &str = "llama=1x128x4x2x192x257x1x16";

fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Result<Emulated, Missing>> = OnceLock::new();
    present(BUILT.get_or_init(gpu_device::emulate_cuda))
}

/// The emulating HIP runtime (an MI250X GCD), when hipRTC is here to compile the kernels.
fn emulated_hip() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Result<Emulated, Missing>> = OnceLock::new();
    present(BUILT.get_or_init(|| {
        trident::gpu::hiprtc::Hiprtc::load().map_err(|e| missing_hiprtc(&e))?;
        let runtime = ("emu_libamdhip64.cpp", "libamdhip64-emu.so", "the emulating HIP runtime");
        Ok(gpu_device::emulate(runtime, "TRIDENT_LIBAMDHIP64", &[]))
    }))
}

/// Runs the script with the emulated driver, the tiny cases and `env` on top, its JSON in `json`.
fn gpu_bench(emu: &Emulated, json: &Path, env: &[(&str, &str)]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/gpu-bench.sh");
    let mut c = Command::new("bash");
    c.arg(&script).arg("--out").arg(json);
    for (k, v) in &emu.env {
        c.env(k, v);
    }
    c.env("TRIDENT_BIN", BIN)
        .env("GPU_BENCH_MIN_SECONDS", "0.01")
        .env("GPU_BENCH_STEPS", "1")
        .env("GPU_BENCH_GEMMS", GEMMS)
        .env("GPU_BENCH_ATTENTION", ATTENTION)
        .env("GPU_BENCH_STEP", STEP)
        .env("GPU_BENCH_LLAMA_STEP", LLAMA_STEP)
        .env("GPU_BENCH_TORCH_COMPILE", "0")
        .env_remove("GPU_BENCH_DEVICE")
        .env_remove("GPU_BENCH_TORCH_DEVICE")
        .env_remove("OUT");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("bash runs the script")
}

/// The table's rows (after its header) as their whitespace-separated cells, and its `skipped:` lines.
fn table(out: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let mut lines = out.lines().skip_while(|l| !l.starts_with("bench "));
    let header: Vec<&str> =
        lines.next().unwrap_or_else(|| panic!("no table header in:\n{out}")).split_whitespace().collect();
    assert_eq!(header, columns(), "the table's header");
    let rows: Vec<Vec<String>> = lines
        .clone()
        .take_while(|l| !l.starts_with("skipped: ") && *l != "nothing skipped")
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    for r in &rows {
        assert_eq!(r.len(), columns().len(), "a row without a value in each column: {r:?}\n{out}");
    }
    let skipped = lines.filter_map(|l| l.strip_prefix("skipped: ")).map(String::from).collect();
    (rows, skipped)
}

/// The number `"key": N` holds in a one-line JSON object; None for null (or an absent key).
fn number(line: &str, key: &str) -> Option<f64> {
    let from = line.find(&format!("\"{key}\": "))? + key.len() + 4;
    let text: String = line[from..].chars().take_while(|c| !matches!(c, ',' | '}')).collect();
    (text != "null").then(|| text.parse().unwrap_or_else(|_| panic!("{key}: not a number: {text} in {line}")))
}

/// What the JSON holds: the file checked as one strict JSON object with the top-level strings,
/// then its row objects (one a line) and skipped entries (one a line), each checked alone.
struct Report {
    doc: String,
    rows: Vec<String>,
    skipped: Vec<String>,
}

fn report(json: &Path) -> Report {
    let doc = std::fs::read_to_string(json).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    let top = string_values(doc.as_bytes(), &["trident_bin"])
        .unwrap_or_else(|e| panic!("the JSON is not one object naming the binary: {e}\n{doc}"));
    assert_eq!(top[0], BIN);
    let columns: Vec<String> = columns().iter().map(|c| format!("\"{c}\"")).collect();
    let columns = format!("\"columns\": [{}],", columns.join(", "));
    assert!(doc.contains(&columns), "{columns} missing from\n{doc}");
    let objects = |key: &str| -> Vec<String> {
        doc.lines()
            .filter(|l| l.trim_start().starts_with(&format!("{{\"{key}\": ")))
            .map(|l| l.trim().trim_end_matches(',').to_string())
            .collect()
    };
    let (rows, skipped) = (objects("bench"), objects("what"));
    for r in &rows {
        string_values(r.as_bytes(), &["bench", "case", "shape"]).unwrap_or_else(|e| panic!("row {r}: {e}"));
    }
    for s in &skipped {
        string_values(s.as_bytes(), &["what", "why"]).unwrap_or_else(|e| panic!("skipped {s}: {e}"));
    }
    Report { doc, rows, skipped }
}

/// Every cell of the table is the JSON's value (to the table's 4 digits, "-" for null), each
/// ratio is trident's over PyTorch's, and each MFU is its TFLOP/s over the datasheet peak (none
/// without a peak).
fn cells_are_the_json_and_ratios_hold(rows: &[Vec<String>], json: &Report, peak: Option<f64>) {
    assert_eq!(rows.len(), json.rows.len());
    for (cells, line) in rows.iter().zip(&json.rows) {
        let names = string_values(line.as_bytes(), &["bench", "case", "shape"]).unwrap();
        assert_eq!(cells[..3], names[..], "{line}");
        for (cell, (_, key)) in cells[3..].iter().zip(NUMERIC) {
            match number(line, key) {
                None => assert_eq!(cell, "-", "{key}: a value in the table, null in {line}"),
                Some(v) => {
                    let shown: f64 = cell.parse().unwrap_or_else(|_| panic!("{key}: '{cell}' for {v} in {line}"));
                    assert!((shown - v).abs() <= 1e-3 * v.abs(), "{key}: the table shows {shown}, the JSON {v}");
                }
            }
        }
        let v = |k: &str| number(line, k);
        for (ratio, trident, torch) in [
            ("time_ratio", "trident_ms", "torch_ms"),
            ("tflops_ratio", "trident_tflops", "torch_tflops"),
            ("tokens_per_s_ratio", "trident_tokens_per_s", "torch_tokens_per_s"),
        ] {
            match (v(trident), v(torch)) {
                (Some(a), Some(b)) if b > 0.0 => {
                    let r = v(ratio).unwrap_or_else(|| panic!("{ratio} missing in {line}"));
                    assert!((r - a / b).abs() <= 1e-4 * (a / b).abs(), "{ratio} {r} is not {a} / {b}: {line}");
                }
                _ => assert_eq!(v(ratio), None, "{ratio} without both sides: {line}"),
            }
        }
        for (mfu, tflops) in [("trident_mfu", "trident_tflops"), ("torch_mfu", "torch_tflops")] {
            match (v(tflops), peak) {
                (Some(t), Some(peak)) => {
                    let m = v(mfu).unwrap_or_else(|| panic!("{mfu} missing in {line}"));
                    assert!((m - t / peak).abs() <= 1e-4 * (t / peak), "{mfu} {m} is not {t} / {peak}");
                }
                _ => assert_eq!(v(mfu), None, "{mfu} without a TFLOP/s and a peak: {line}"),
            }
        }
    }
}

/// The script end to end: every trident bench runs on the emulated A100 (its datasheet peak, 312
/// TFLOP/s, is the MFU's), the table has a row per case with a value in every trident column, and
/// PyTorch's side either ran (on the CPU, every case compared, or a case it could not run said
/// with its reason) or is said to be absent.
#[test]
fn gpu_bench_runs_end_to_end_on_the_emulated_gpu_and_says_what_it_skipped() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("gpu-bench");
    let json = dir.join("out/gpu-bench.json");
    let torch = python_with("torch", "gpu-bench's PyTorch comparison is exercised only in its absence");
    let mut env = vec![];
    if let Some(py) = &torch {
        env.extend([("TORCH_PYTHON", py.as_str()), ("GPU_BENCH_TORCH_DEVICE", "cpu")]);
    }
    let o = gpu_bench(emu, &json, &env);
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(o.status.success(), "gpu-bench failed:\n{out}\n{err}");
    for bench in ["gemm", "attention", "step"] {
        assert!(out.contains(&format!("== trident bench {bench} --device cuda")), "{out}");
    }
    assert!(out.contains("gpu-bench on Emulated A100-SXM4-40GB"), "{out}");
    assert!(out.contains("dense bf16 peak 312.0 TFLOP/s (datasheet)"), "{out}");
    let (rows, skipped) = table(&out);
    let names: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    // Attention has two rows a case: the forward alone (.fwd) and forward + backward.
    let cases = [
        ("gemm", "gpt2.qkv"),
        ("gemm", "gpt2.head"),
        ("attention", "d64.fwd"),
        ("attention", "d64"),
        ("attention", "d128.fwd"),
        ("attention", "d128"),
        ("attention", "gqa.fwd"),
        ("attention", "gqa"),
        ("step", "tiny"),
        ("step", "llama"),
    ];
    assert_eq!(names, cases);
    assert_eq!(
        rows.iter().map(|r| r[2].as_str()).collect::<Vec<_>>(),
        [
            "64x96x32",
            "64x384x32",
            "1x64x2x64",
            "1x64x2x64",
            "1x32x1x128",
            "1x32x1x128",
            "1x32x4x64x2",
            "1x32x4x64x2",
            "1x128x2x257x1x16",
            "1x128x4x2x192x257x1x16"
        ]
    );
    for r in &rows {
        for (cell, column) in [(&r[3], "trident_ms"), (&r[6], "trident_tflops"), (&r[12], "trident_mfu")] {
            assert!(cell.parse::<f64>().is_ok_and(|v| v > 0.0), "{column} of {r:?} is not a positive number");
        }
        assert_eq!(r[9] != "-", r[0] == "step", "trident tokens/s belongs to the step alone: {r:?}");
    }
    let json_report = report(&json);
    let top = string_values(json_report.doc.as_bytes(), &["device", "device_kind"]).unwrap();
    assert_eq!(top, ["Emulated A100-SXM4-40GB (trident SIMT emulation)", "cuda"]);
    assert!(json_report.doc.contains("\"peak_bf16_tflops\": 312,"), "{}", json_report.doc);
    assert_eq!(skipped.len(), json_report.skipped.len(), "{skipped:?} vs {:?}", json_report.skipped);
    cells_are_the_json_and_ratios_hold(&rows, &json_report, Some(312.0));
    assert_eq!(skipped[0], "PyTorch under torch.compile: GPU_BENCH_TORCH_COMPILE=0", "{skipped:?}");
    match torch {
        None => {
            assert_eq!(skipped.len(), 2, "{skipped:?}");
            assert!(skipped[1].starts_with("PyTorch (every comparison): no PyTorch in "), "{skipped:?}");
            assert!(rows.iter().all(|r| r[4] == "-" && r[5] == "-"), "{out}");
        }
        Some(_) => {
            // Each case is compared, or its skip is said with PyTorch's reason.
            for r in &rows {
                let said = skipped.iter().any(|s| s.starts_with(&format!("PyTorch {} {}: PyTorch", r[0], r[1])));
                assert!((r[4] != "-") != said, "{r:?}: compared and skipped, or neither: {skipped:?}");
            }
            let compared = rows.iter().filter(|r| r[4] != "-").count();
            assert!(compared >= 8, "PyTorch compared only {compared} of 10 rows: {skipped:?}");
            for step in &rows[8..] {
                assert!(step[4] != "-" && step[10] != "-" && step[11] != "-", "the step is not compared: {step:?}");
            }
        }
    }
    assert!(out.contains(&format!("gpu-bench: wrote {}", json.display())), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

/// What the run could not do is said, and a failing trident bench fails the run after the
/// others: a GEMM shape the bench rejects, no Python for PyTorch, a list set empty; with no GPU
/// at all, every bench is skipped with `trident info`'s reason and the run fails.
#[test]
fn gpu_bench_says_why_a_bench_failed_and_what_it_skipped() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("gpu-bench-skips");
    let json = dir.join("skips.json");
    let env = [
        ("GPU_BENCH_GEMMS", "bad=64x0x32 gpt2.qkv=64x96x32"),
        ("GPU_BENCH_ATTENTION", ""),
        ("GPU_BENCH_STEP", ""),
        ("GPU_BENCH_LLAMA_STEP", ""),
        ("TORCH_PYTHON", "/nonexistent/python"),
    ];
    let o = gpu_bench(emu, &json, &env);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "a failed trident bench must fail the run:\n{out}\n{}", stderr(&o));
    let (rows, skipped) = table(&out);
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0][3..].iter().all(|c| c == "-"), "the failed case has values: {:?}", rows[0]);
    assert!(rows[1][3] != "-", "the case after the failed one did not run: {:?}", rows[1]);
    let said = |prefix: &str| skipped.iter().any(|s| s.starts_with(prefix));
    assert!(
        said("trident gemm bad: the bench failed: ") && skipped.iter().any(|s| s.contains("--shape")),
        "{skipped:?}"
    );
    assert!(said("attention: GPU_BENCH_ATTENTION is empty") && said("step: GPU_BENCH_STEP is empty"), "{skipped:?}");
    assert!(said("llama step: GPU_BENCH_LLAMA_STEP is empty"), "{skipped:?}");
    assert!(said("PyTorch (every comparison): no Python at '/nonexistent/python'"), "{skipped:?}");
    cells_are_the_json_and_ratios_hold(&rows, &report(&json), Some(312.0));

    // No GPU: neither a CUDA driver nor a HIP runtime.
    let none = dir.join("none.json");
    let o = gpu_bench(
        emu,
        &none,
        &[("TRIDENT_LIBCUDA", "/nonexistent/libcuda.so.1"), ("TRIDENT_LIBAMDHIP64", "/nonexistent/libamdhip64.so")],
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "no GPU must fail the run:\n{out}\n{}", stderr(&o));
    assert!(out.contains("gpu-bench on no GPU"), "{out}");
    let (rows, skipped) = table(&out);
    assert!(rows.is_empty(), "{rows:?}");
    assert!(skipped.iter().any(|s| s.starts_with("trident (every bench) and PyTorch: no GPU: ")), "{skipped:?}");
    let r = report(&none);
    assert!(r.rows.is_empty() && !r.skipped.is_empty());
    assert!(r.doc.contains("\"device\": null,") && r.doc.contains("\"peak_bf16_tflops\": null,"), "{}", r.doc);
    let _ = std::fs::remove_dir_all(dir);
}

/// The PyTorch script alone, on the CPU (`--device cpu`, tiny shapes): one record per case (two for
/// attention: the forward alone and forward + backward), each
/// a JSON object with its time and rate, the step's tokens/s and a finite loss; on a device its
/// PyTorch cannot use, one record that says why. Without PyTorch only that second part runs.
#[test]
fn the_pytorch_comparison_runs_on_the_cpu_and_says_why_it_cannot_run() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/torch_compare.py");
    let run = |py: &str, args: &[&str]| -> Vec<String> {
        let o = Command::new(py).arg(&script).args(args).output().expect("Python runs");
        assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
        let lines: Vec<String> = stdout(&o).lines().map(String::from).collect();
        for l in &lines {
            string_values(l.as_bytes(), &["bench"]).unwrap_or_else(|e| panic!("{l}: {e}"));
        }
        lines
    };
    let Some(py) =
        python_with("torch", "torch_compare.py's CPU run is exercised only in its record saying PyTorch is absent")
    else {
        let lines = run("python3", &["--device", "cuda", "--gemm", "g=8x8x8"]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[1].starts_with("{\"bench\": \"skipped\", \"case\": \"*\", \"why\": \"no PyTorch in "),
            "{lines:?}"
        );
        return;
    };
    let lines = run(
        &py,
        &[
            "--device",
            "cpu",
            "--min-seconds",
            "0.01",
            "--steps",
            "1",
            "--gemm",
            "g=16x24x8",
            "--attention",
            "a=1x16x2x64",
        ],
    );
    let lines2 = run(&py, &["--device", "cpu", "--min-seconds", "0.01", "--steps", "1", "--step", "s=1x64x2x257x2x16"]);
    let records: Vec<&String> = lines.iter().chain(&lines2[1..]).collect();
    assert!(records[0].starts_with("{\"bench\": \"torch\""), "{records:?}");
    let cases = [
        (records[1], "gemm", "g"),
        (records[2], "attention", "a.fwd"),
        (records[3], "attention", "a"),
        (records[4], "step", "s"),
    ];
    for (r, bench, case) in cases {
        let v = string_values(r.as_bytes(), &["bench", "case"]).unwrap();
        assert_eq!(v, [bench, case], "{r}");
        for key in ["ms", "tflops"] {
            assert!(number(r, key).is_some_and(|x| x > 0.0), "{key} in {r}");
        }
    }
    // Forward + backward counts 3.5 x the forward's FLOPs (not a timing: the CPU's are noise).
    for (r, flops) in [(records[2], 1.0), (records[3], 3.5)] {
        let (ms, tflops) = (number(r, "ms").unwrap(), number(r, "tflops").unwrap());
        let want = flops * 4.0 * 2.0 * 16.0 * 16.0 * 64.0 / 2.0 / ms / 1e9;
        assert!((tflops - want).abs() <= 1e-9 * want, "{r}: {tflops} TFLOP/s, want {want}");
    }
    assert!(number(records[4], "tokens_per_s").is_some_and(|x| x > 0.0), "{}", records[4]);
    assert!(number(records[4], "loss").is_some_and(f64::is_finite), "{}", records[4]);
    // A CPU-only PyTorch asked for the GPU: one record that says so, for every case.
    let lines = run(&py, &["--device", "hip", "--gemm", "g=8x8x8"]);
    assert!(lines[1].starts_with("{\"bench\": \"skipped\", \"case\": \"*\", \"why\": \"PyTorch "), "{lines:?}");
}

/// The scripts (gpu-bench.sh, first-light.sh which runs it, plan-calibrate.sh, node-defaults.sh
/// they source, layouts.sh and mpi-bundle.sh) are clean under shellcheck (installed by `make
/// test`; a skip when absent).
#[test]
fn the_scripts_are_shellcheck_clean() {
    let scripts = ["gpu-bench.sh", "first-light.sh", "node-defaults.sh", "plan-calibrate.sh", "layouts.sh", "mpi-bundle.sh"];
    for name in scripts {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu").join(name);
        let Ok(o) = Command::new("shellcheck").arg(&script).output() else {
            return skip(
                "shellcheck is not installed: the GPU scripts are not linted",
                "`make test` installs it with apt",
            );
        };
        assert!(o.status.success(), "shellcheck {}:\n{}{}", script.display(), stdout(&o), stderr(&o));
    }
}

/// On an AMD GPU (the emulated MI250X, found by `trident info` with no NVIDIA driver there) the
/// same script runs trident's HIP benches; AMD devices have no datasheet peak, so there is no MFU,
/// and it says so.
#[test]
fn gpu_bench_runs_on_the_emulated_amd_gpu_without_an_mfu_and_says_so() {
    let Some(emu) = emulated_hip() else { return };
    let dir = scratch("gpu-bench-hip");
    let json = dir.join("hip.json");
    let env = [
        ("TRIDENT_LIBCUDA", "/nonexistent/libcuda.so.1"),
        ("GPU_BENCH_GEMMS", "gpt2.qkv=64x96x32"),
        ("GPU_BENCH_ATTENTION", "d128=1x32x1x128"),
        ("TORCH_PYTHON", "/nonexistent/python"),
    ];
    let o = gpu_bench(emu, &json, &env);
    let out = stdout(&o);
    assert!(o.status.success(), "gpu-bench on hip failed:\n{out}\n{}", stderr(&o));
    assert!(
        out.contains("== trident bench step --device hip") && out.contains("(hip), dense bf16 peak unknown"),
        "{out}"
    );
    let (rows, skipped) = table(&out);
    let benches = ["gemm", "attention", "attention", "step", "step"];
    assert_eq!(rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), benches);
    assert!(rows.iter().all(|r| r[3] != "-" && r[12] == "-"), "trident's time, and no MFU: {rows:?}");
    assert!(
        skipped.iter().any(|s| s.starts_with("MFU: no datasheet peak for Emulated AMD Instinct MI250X")),
        "{skipped:?}"
    );
    let r = report(&json);
    assert!(r.doc.contains("\"device_kind\": \"hip\",") && r.doc.contains("\"peak_bf16_tflops\": null,"), "{}", r.doc);
    cells_are_the_json_and_ratios_hold(&rows, &r, None);
    let _ = std::fs::remove_dir_all(dir);
}

/// PyTorch's records join trident's by bench and case: an attention case and the step case of
/// one name (the first H200 run of 2026-11-26 named both `gpt2-124m`) each get their own
/// PyTorch time, where joining by case alone gave the attention row the step's.
#[test]
fn pytorch_records_join_by_bench_and_case() {
    let dir = std::env::temp_dir().join(format!("trident-gpu-bench-awk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let torch = concat!(
        "{\"bench\": \"torch\", \"torch\": \"2.x\"}\n",
        "{\"bench\": \"attention\", \"case\": \"gpt2\", \"ms\": 2.0, \"tflops\": 100.0}\n",
        "{\"bench\": \"step\", \"case\": \"gpt2\", \"ms\": 50.0, \"tflops\": 300.0, \"tokens_per_s\": 1000.0}\n",
    );
    let trident = concat!(
        "gpt2\tattention\t1x2x3x4\tok\t{\"ms\": 4.0, \"achieved\": 50.0}\n",
        "gpt2\tstep\t1x2\tok\t{\"ms\": 100.0, \"achieved\": 150.0, \"tokens_per_s\": 500.0}\n",
    );
    let files = [("torch.jsonl", torch), ("trident.tsv", trident), ("skipped.tsv", "")];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let out = Command::new("awk")
        .arg("-v")
        .arg(format!("out={}", dir.join("out.json").display()))
        .args(["-f", "tests/gpu/gpu-bench.awk"])
        .args(files.map(|(name, _)| dir.join(name)))
        .output()
        .expect("awk runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let row = |bench: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with(bench)).unwrap_or_else(|| panic!("no {bench} row in\n{text}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    // bench, case, shape, trident_ms, torch_ms, time_ratio
    assert_eq!(row("attention")[4..6], ["2".to_string(), "2".to_string()], "{text}");
    assert_eq!(row("step")[4..6], ["50".to_string(), "2".to_string()], "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
