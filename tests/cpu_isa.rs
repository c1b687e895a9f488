//! `TRIDENT_CPU_ISA` from the outside: it caps the CPU kernels' instruction set (`info` and the
//! GEMM bench say which ran), and a level the CPU lacks or a name that is no level is one clear
//! error; `TRIDENT_BF16_KERNEL` likewise pins the bf16 GEMM's kernel, which is otherwise measured
//! once per CPU model. Also the peak the CPU step bench measures its MFU against.

mod common;
use common::*;
use std::process::{Command, Output};

fn with_isa(isa: &str, args: &[&str]) -> Output {
    Command::new(BIN).env("TRIDENT_CPU_ISA", isa).args(args).output().expect("the trident binary runs")
}

/// The level `trident info` reports without a cap (the CPU's best).
fn detected() -> String {
    let out = stdout(&run(&["info"]));
    let line = out.lines().find(|l| l.starts_with("cpu: ")).expect("info has a cpu line").to_string();
    let after = line.split("instruction set ").nth(1).expect("the cpu line names the instruction set");
    after.split([';', ' ']).next().unwrap().to_string()
}

#[test]
fn the_cap_lowers_the_level_info_and_benches_report() {
    let best = detected();
    let o = with_isa("portable", &["info"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("instruction set portable"), "{text}");
    assert!(text.contains("gemm kernel portable") && text.contains("element-wise kernels baseline"), "{text}");
    if best != "portable" {
        assert!(text.contains(&format!("capped by TRIDENT_CPU_ISA; the CPU has {best}")), "{text}");
    }
    if !["avx2", "avx512", "avx512bf16"].contains(&best.as_str()) {
        not_applicable(&format!("this CPU has no AVX2 ({best}): the AVX2 cap is not tried"));
        return;
    }
    // The text tables name the CPU and the level too.
    for args in [&["bench", "peak"][..], &["bench", "layernorm", "--min-seconds", "0.01"][..]] {
        let o = with_isa("avx2", args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("cpu: ") && stdout(&o).contains("instruction set avx2"),
            "{args:?}: {}",
            stdout(&o)
        );
    }
    let o = with_isa("avx2", &["info"]);
    assert!(
        stdout(&o)
            .contains("gemm kernel avx2; bf16 gemm kernel avx2 (the one fast kernel this CPU runs); element-wise"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("cpu gemm blocking: avx2 depth block 256, row block 96"), "{}", stdout(&o));
    // Both GEMMs run their AVX2 kernels, and every record names the CPU and the level.
    for dtype in ["f32", "bf16"] {
        let o = with_isa("avx2", &["bench", "gemm", "--dtype", dtype, "--min-seconds", "0.01", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let records: Vec<String> = stdout(&o).lines().filter(|l| l.starts_with('{')).map(String::from).collect();
        assert!(!records.is_empty(), "no records for {dtype}");
        for r in &records {
            assert!(r.contains("kernel avx2") && r.contains("\"isa\": \"avx2\"") && r.contains("\"cpu\": "), "{r}");
        }
    }
}

#[test]
fn a_level_the_cpu_lacks_or_no_level_is_one_clear_error() {
    assert_clean_error(&with_isa("sse9", &["info"]), &["TRIDENT_CPU_ISA='sse9'", "portable, avx2, avx512, avx512bf16"]);
    assert_clean_error(
        &with_isa("sse9", &["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch-size", "8"]),
        &["sse9"],
    );
    if detected() != "avx512bf16" {
        assert_clean_error(&with_isa("avx512bf16", &["info"]), &["TRIDENT_CPU_ISA=avx512bf16", "supports up to"]);
    } else {
        not_applicable("this CPU has every level: no level to refuse");
    }
}

/// The bf16 GEMM's kernel: where the CPU runs more than one fast kernel, `info` says it measured
/// them (naming each one's rate) and keeps the verdict in the cache, which the next run reads;
/// `TRIDENT_BF16_KERNEL` pins any kernel the CPU runs (`info`, the GEMM bench's records and the
/// step bench's note name it), and a name that is no kernel, or one the CPU cannot run, is one
/// clear error.
#[test]
fn the_bf16_kernel_is_measured_once_per_model_or_pinned() {
    let cache = scratch("bf16-kernel-cache");
    let with = |vars: &[(&str, &str)], args: &[&str]| -> Output {
        let mut command = Command::new(BIN);
        command.env("TRIDENT_CACHE_DIR", &cache).env_remove("TRIDENT_BF16_KERNEL").args(args);
        for (k, v) in vars {
            command.env(k, v);
        }
        command.output().expect("the trident binary runs")
    };
    let info = |vars: &[(&str, &str)]| {
        let o = with(vars, &["info"]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let best = detected();
    let first = info(&[]);
    let file = cache.join("cpu").join("bf16-gemm");
    if ["avx512", "avx512bf16"].contains(&best.as_str()) {
        assert!(first.contains("(measured, GFLOP/s on one core: avx512"), "{first}");
        let line = std::fs::read_to_string(&file).expect("the verdict is kept");
        assert!(line.starts_with(&format!("bf16-gemm-v1\t{best}\t")), "{line}");
        let again = info(&[]);
        assert!(again.contains("(measured before on this CPU model, GFLOP/s on one core: avx512"), "{again}");
    } else {
        assert!(first.contains("(the one fast kernel this CPU runs)"), "{first}");
        assert!(!file.exists(), "nothing measured, nothing kept");
    }
    let runs = ["portable", "avx2", "avx512", "avx512bf16"];
    let level = runs.iter().position(|l| *l == best).unwrap_or(0);
    for (at, kernel) in runs.iter().enumerate() {
        let pin = [("TRIDENT_BF16_KERNEL", *kernel)];
        if at > level {
            assert_clean_error(&with(&pin, &["info"]), &[&format!("TRIDENT_BF16_KERNEL={kernel}"), "runs up to"]);
            continue;
        }
        let text = info(&pin);
        assert!(text.contains(&format!("bf16 gemm kernel {kernel} (pinned by TRIDENT_BF16_KERNEL)")), "{text}");
        let args = ["bench", "gemm", "--dtype", "bf16", "--shape", "40x70x56", "--min-seconds", "0.01", "--json"];
        let o = with(&pin, &args);
        assert!(o.status.success(), "{kernel}: {}", stderr(&o));
        let records: Vec<String> = stdout(&o).lines().filter(|l| l.starts_with('{')).map(String::from).collect();
        assert_eq!(records.len(), 3, "{kernel}: {}", stdout(&o));
        assert!(records.iter().all(|r| r.contains(&format!("kernel {kernel},"))), "{records:?}");
    }
    let step = ["bench", "step", "--preset", "tiny", "--micro-batch-size", "2", "--seq-length", "16"];
    let o = with(
        &[("TRIDENT_BF16_KERNEL", "portable")],
        &[&step[..], &["--dtype", "bf16", "--min-seconds", "0.01"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("bf16 gemm kernel portable (pinned by TRIDENT_BF16_KERNEL)"), "{}", stdout(&o));
    assert!(stdout(&o).contains("bf16 gemm kernel portable; "), "the record's note: {}", stdout(&o));
    assert_clean_error(
        &with(&[("TRIDENT_BF16_KERNEL", "amx")], &["info"]),
        &["TRIDENT_BF16_KERNEL='amx'", "avx512bf16, avx512, avx2, portable"],
    );
    let _ = std::fs::remove_dir_all(&cache);
}

/// `bench step` measures the FMA peak before and after its timed steps and reports MFU against
/// the higher one, naming both, so that a machine whose speed drifts between start-up and the
/// steps cannot put the ratio above what the faster moment allows.
#[test]
fn bench_step_reports_mfu_against_the_higher_of_two_peaks() {
    let args = ["bench", "step", "--preset", "tiny", "--micro-batch-size", "2", "--seq-length", "16"];
    let o = run(&[&args[..], &["--vocab-size", "257", "--min-seconds", "0.01", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let record = text.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no record: {text}"));
    let number = |key: &str| -> f64 {
        let at = record.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("no {key}: {record}"));
        let rest = &record[at + key.len() + 4..];
        rest[..rest.find([',', '}']).unwrap()].parse().unwrap()
    };
    let note = record.split("(peak ").nth(1).unwrap_or_else(|| panic!("the note names no peaks: {record}"));
    let peaks: Vec<f64> = note.split([' ', ',', ')']).filter_map(|w| w.parse().ok()).collect();
    assert_eq!(peaks.len(), 2, "{record}");
    assert!((number("peak") - peaks[0].max(peaks[1])).abs() < 0.06, "{record}");
    assert!((number("ratio") - number("achieved") / number("peak")).abs() < 1e-3, "{record}");
}

/// `bench step --dtype f32,bf16` interleaves the two precisions' steps and adds the ratio of
/// their median step times' pairs: three records, the third naming the pair; a list of one
/// precision twice, or of three, is one clear error.
#[test]
fn bench_step_compares_two_dtypes_interleaved() {
    let args = ["bench", "step", "--preset", "tiny", "--micro-batch-size", "2", "--seq-length", "16"];
    let o =
        run(&[&args[..], &["--vocab-size", "257", "--min-seconds", "0.01", "--json", "--dtype", "f32,bf16"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let records: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(records.len(), 3, "{text}");
    let number = |record: &str, key: &str| -> f64 {
        let at = record.find(&format!("\"{key}\": ")).unwrap_or_else(|| panic!("no {key}: {record}"));
        let rest = &record[at + key.len() + 4..];
        rest[..rest.find([',', '}']).unwrap()].parse().unwrap()
    };
    assert!(records[0].contains("\"dtype\": \"f32\"") && records[0].contains("interleaved with bf16's"), "{text}");
    assert!(records[1].contains("\"dtype\": \"bf16\"") && records[1].contains("interleaved with f32's"), "{text}");
    assert!(records[2].contains(" bf16/f32\"") && records[2].contains("\"unit\": \"x\""), "{text}");
    let ratio = number(records[2], "achieved");
    assert!(ratio > 0.0 && ratio.is_finite(), "{text}");
    assert!(records[2].contains(&format!("median {ratio:.3}")), "{text}");
    assert!((number(records[2], "ms") - number(records[1], "ms")).abs() < 1e-3, "{text}");
    for bad in ["bf16,bf16", "f32,bf16,f32", "f32,fp8"] {
        assert_clean_error(
            &run(&[&args[..], &["--dtype", bad]].concat()),
            &["--dtype", &format!("'{bad}'"), "f32,bf16"],
        );
    }
}

/// `bench gemm --shape MxNxK` times that one shape (in each layout) instead of the sweep, at
/// either dtype; a malformed shape is one clear error.
#[test]
fn bench_gemm_times_one_shape_on_the_cpu() {
    for dtype in ["f32", "bf16"] {
        let o = run(&["bench", "gemm", "--dtype", dtype, "--shape", "40x24x56", "--min-seconds", "0.01", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = stdout(&o);
        let records: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(records.len(), 3, "one record per layout: {text}");
        for (r, layout) in records.iter().zip(["NT", "NN", "TN"]) {
            assert!(r.contains(&format!("\"shape\": \"40x24x56 {layout}\"")), "{r}");
            assert!(r.contains(&format!("\"dtype\": \"{dtype}\"")), "{r}");
        }
    }
    assert_clean_error(&run(&["bench", "gemm", "--shape", "40x24"]), &["--shape", "'40x24'", "MxNxK"]);
    assert_clean_error(&run(&["bench", "gemm", "--shape", "40x0x8"]), &["--shape", "'40x0x8'"]);
}
