//! `trident bench <target>`: the dispatch of every benchmark to its module (their flags are
//! `flags::BENCH_FLAGS`). On one process: `peak`, `gemm` (`gemm`), `attention`, `layernorm`,
//! `step` and `generate` (`ops`) on the CPU, `gemm`, `attention`, `layernorm`, `gelu`, `xent`, `embedding
//! --device cuda|hip` (`gpu`), and `step --device cuda|hip` (`gpu_step`). On every rank of an
//! MPI job: the collectives (`comm`; `allreduce --device cuda|hip` through `gpu`) and `summa`
//! (`summa`).

pub mod comm;
pub mod gemm;
pub mod gpu;
pub mod gpu_allreduce;
pub mod gpu_step;
pub mod ops;
pub mod summa;

use super::{comm_library, end_after_gpu_comm_error, exit, flags, start_mpi, threads};
use crate::cli::Args;
use crate::device::cpu::{peak, pool};
use crate::error::{Error, Result};
use crate::flags::BENCH_FLAGS;
use crate::gpu::kernels::Vendor;
use comm::CommBench;
use ops::{print_records, Record};
use std::process::ExitCode;

/// `trident bench <target> [flags]`: the collectives and `summa` start MPI, the others run here.
pub fn run(rest: &[String]) -> ExitCode {
    if let Some(bench) = rest.first().and_then(|w| CommBench::parse(w)) {
        return run_collective(bench, &rest[1..]);
    }
    if rest.first().map(String::as_str) == Some("summa") {
        return run_summa(&rest[1..]);
    }
    exit(crate::error::catch_failure(|| single_process(rest)))
}

/// The benchmarks of one process: on the CPU, or on one GPU with `--device cuda|hip`.
fn single_process(rest: &[String]) -> Result<()> {
    let (what, rest) = match rest.split_first() {
        Some((w, r)) if !w.starts_with('-') => (w.as_str(), r),
        _ => {
            return Err(Error::Usage(
                "bench needs a target: peak, gemm, gemm-bwd, attention, layernorm, step, generate, gelu, xent, embedding, allreduce, allgather, reducescatter or sendrecv".into(),
            ))
        }
    };
    let Some(a) = flags(&format!("bench {what}"), "microbenchmarks", BENCH_FLAGS, rest)? else {
        return Ok(());
    };
    match a.str("--device").unwrap_or("cpu") {
        "cpu" => on_cpu(what, &a),
        device @ ("cuda" | "hip") => on_gpu(what, device, &a),
        other => Err(Error::flag("--device", format!("'{other}'"), "cpu, cuda or hip")),
    }
}

/// `bench gemm|gemm-bwd|attention|layernorm|gelu|xent|embedding --device cuda|hip`: the kernels of the
/// GPU kernel index on GPT-2-sized shapes (or the one `--shape`), each checked against the
/// reference device, then timed. `bench step --device cuda|hip`: a training step on the GPU
/// Device, with what its GPU work costs.
fn on_gpu(what: &str, device: &str, a: &Args) -> Result<()> {
    let vendor = if device == "cuda" { Vendor::Cuda } else { Vendor::Hip };
    let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
    if what == "step" {
        let dtype = a.str("--dtype").unwrap_or("f32");
        if dtype != "bf16" {
            return Err(Error::Usage(format!(
                "bench step --device {device} needs --dtype bf16 (the {} kernels multiply bf16 operands with f32 \
                 accumulation; found {dtype})",
                device.to_uppercase()
            )));
        }
        let steps = a.usize("--steps")?;
        if steps == Some(0) {
            return Err(Error::flag("--steps", 0, "a positive whole number"));
        }
        let model = step_model(a, (4, 64))?;
        // --dtype bf16 (checked above): the Llama-family kernels' 16-bit activations.
        crate::config::llama_on_device("bench step", device, &model.cfg.arch.features(), true)?;
        let report = gpu_step::step(vendor, &model, secs, steps)?;
        print!("{}", if a.has("--json") { report.json() + "\n" } else { report.table() });
        return Ok(());
    }
    let bench = gpu::GpuBench::parse(what).ok_or_else(|| {
        Error::Unsupported(format!(
            "bench {what} --device {device}: the GPU benchmarks are gemm, gemm-bwd, attention, layernorm, gelu, xent, embedding, step and allreduce"
        ))
    })?;
    let records = gpu::run(bench, vendor, secs, a.str("--shape"))?;
    print!("{}", gpu::format_records(&records, a.has("--json")));
    Ok(())
}

/// `bench peak|gemm|attention|layernorm|step|generate` on the CPU's thread pool.
fn on_cpu(what: &str, a: &Args) -> Result<()> {
    let pool = pool::ThreadPool::new(threads(a)?);
    match what {
        "peak" => {
            let p = peak::measure_fma_peak(&pool, 500);
            println!(
                "fma peak: {:.1} GFLOP/s on {} threads ({:.1} per thread), {}; cpu: {}, instruction set {}",
                p.gflops,
                p.threads,
                p.gflops_per_thread,
                p.isa,
                crate::device::cpu::isa::cpu_model().unwrap_or_else(|| "model unknown".into()),
                crate::device::cpu::isa::active().name()
            );
            Ok(())
        }
        "gemm" => gemm_on_cpu(&pool, a),
        "generate" => {
            let dev = crate::device::cpu::CpuDevice::new(pool.threads());
            let m = step_model(a, (1, 512))?;
            let m = ops::StepModel { seq: m.seq.max(2), ..m };
            let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
            print_records(&ops::generate(&dev, &m, secs), a.has("--json"));
            Ok(())
        }
        "attention" | "layernorm" | "step" => {
            let dev = crate::device::cpu::CpuDevice::new(pool.threads());
            let p = peak::measure_fma_peak(dev.pool(), 300);
            let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
            let records = match what {
                "attention" => ops::attention(&dev, &p, secs),
                "layernorm" => ops::layernorm(&dev, ops::triad_bandwidth(dev.pool(), secs), secs),
                _ => match step_dtypes(a)?[..] {
                    [one] => ops::step(&dev, &p, &step_model(a, (4, 64))?, one, secs)?,
                    [x, y] => ops::step_pair(&dev, &p, &step_model(a, (4, 64))?, [x, y], secs)?,
                    _ => unreachable!("step_dtypes gives one or two"),
                },
            };
            print_records(&records, a.has("--json"));
            Ok(())
        }
        "gemm-bwd" | "gelu" | "xent" | "embedding" => {
            Err(Error::Usage(format!("bench {what} times a GPU kernel: add --device cuda or --device hip")))
        }
        other => Err(Error::Usage(format!(
            "unknown bench target '{other}': use peak, gemm, gemm-bwd, attention, layernorm, step, generate, gelu, xent, embedding, allreduce, allgather, reducescatter or sendrecv"
        ))),
    }
}

/// `bench step`'s `--dtype` on the CPU: f32 (the default) or bf16, or two of them to compare
/// (`f32,bf16`).
fn step_dtypes(a: &Args) -> Result<Vec<crate::real::Precision>> {
    let text = a.str("--dtype").unwrap_or("f32");
    let expected = "f32 or bf16, or two to compare, as f32,bf16";
    let parsed: Vec<_> = text
        .split(',')
        .map(|d| match d {
            "f32" => Ok(crate::real::Precision::F32),
            "bf16" => Ok(crate::real::Precision::Bf16),
            _ => Err(Error::flag("--dtype", format!("'{text}'"), expected)),
        })
        .collect::<Result<_>>()?;
    if parsed.len() > 2 || (parsed.len() == 2 && parsed[0] == parsed[1]) {
        return Err(Error::flag("--dtype", format!("'{text}'"), expected));
    }
    Ok(parsed)
}

/// `bench step`'s (and `bench generate`'s) model from its flags (`ops::StepModel`), on the CPU
/// and on a GPU alike; `(micro_batch, seq)` are the default micro-batch and sequence length.
fn step_model(a: &Args, (micro_batch, seq): (usize, usize)) -> Result<ops::StepModel> {
    ops::StepModel::new(&ops::StepFlags {
        preset: a.str("--preset").unwrap_or("gpt2-124m"),
        num_layers: a.usize("--num-layers")?,
        hidden_size: a.usize("--hidden-size")?,
        num_attention_heads: a.usize("--num-attention-heads")?,
        num_query_groups: a.usize("--num-query-groups")?,
        ffn_hidden_size: a.usize("--ffn-hidden-size")?,
        micro_batch: a.usize("--micro-batch-size")?.unwrap_or(micro_batch).max(1),
        seq: a.usize("--seq-length")?.unwrap_or(seq).max(1),
        vocab: a.usize("--vocab-size")?.unwrap_or(50257).max(257),
    })
}

/// `bench gemm` on the CPU: the sweep as a table beside the FMA peak, or as JSON records.
fn gemm_on_cpu(pool: &pool::ThreadPool, a: &Args) -> Result<()> {
    let p = peak::measure_fma_peak(pool, 300);
    let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
    let dtype = match a.str("--dtype").unwrap_or("f32") {
        "f32" => gemm::GemmDtype::F32,
        "bf16" => gemm::GemmDtype::Bf16,
        other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
    };
    let parse = |text| gpu::parse_shape(text, 3, "MxNxK, like 256x2304x768");
    let one = a.str("--shape").map(parse).transpose()?.map(|v| (v[0], v[1], v[2]));
    let shapes = one.as_ref().map_or(gemm::DEFAULT_SHAPES, std::slice::from_ref);
    let rows = gemm::gemm_sweep_dtype(pool, shapes, &p, secs, dtype);
    if a.has("--json") {
        let records: Vec<Record> = rows
            .iter()
            .map(|r| Record {
                bench: "gemm",
                shape: format!("{}x{}x{} {}", r.m, r.n, r.k, r.layout),
                dtype: if dtype == gemm::GemmDtype::Bf16 { "bf16" } else { "f32" },
                threads: pool.threads(),
                achieved: r.gflops,
                unit: "GFLOP/s",
                peak: p.gflops,
                ms: 2.0 * (r.m * r.n * r.k) as f64 / r.gflops / 1e6,
                note: format!("kernel {}, max rel err {:.1e}", r.kernel, r.max_rel_err),
            })
            .collect();
        print_records(&records, true);
    } else {
        println!(
            "cpu: {}, instruction set {}; fma peak: {:.1} GFLOP/s on {} threads, {}",
            crate::device::cpu::isa::cpu_model().unwrap_or_else(|| "model unknown".into()),
            crate::device::cpu::isa::active().name(),
            p.gflops,
            p.threads,
            match dtype {
                gemm::GemmDtype::F32 => format!("gemm kernel {}", crate::device::cpu::gemm::best_kernel().name()),
                gemm::GemmDtype::Bf16 => {
                    format!("bf16 gemm kernel {}", crate::device::cpu::gemm_bf16::choose::chosen().describe())
                }
            }
        );
        gemm::print_table(&rows);
    }
    Ok(())
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024).
fn parse_bytes(flag_name: &str, s: &str) -> Result<usize> {
    let (digits, scale) = match s.trim().to_ascii_uppercase().chars().last() {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(scale))
        .filter(|&v| v >= 1024)
        .ok_or_else(|| Error::flag(flag_name, format!("'{s}'"), "a size of at least 1K, like 64M or 1G"))
}

/// `trident bench <collective>` on every rank of the job (MPI first, errors printed once).
fn run_collective(bench: CommBench, rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = crate::error::catch_failure(|| -> Result<()> {
        let Some(a) = flags("bench", "collective microbenchmarks", BENCH_FLAGS, rest)? else {
            return Ok(());
        };
        let max = a.str("--max-size").map(|s| parse_bytes("--max-size", s)).transpose()?.unwrap_or(1 << 30);
        let secs = a.f64("--min-seconds")?.unwrap_or(0.1);
        match (a.str("--device").unwrap_or("cpu"), bench) {
            ("cpu", _) => {}
            (device @ ("cuda" | "hip"), CommBench::AllReduce) => {
                let dtype = match a.str("--dtype").unwrap_or("f32") {
                    "f32" => crate::comm::Dtype::F32,
                    "bf16" => crate::comm::Dtype::Bf16,
                    other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
                };
                let records = match device {
                    "cuda" => gpu_allreduce::allreduce(&rt, comm_library(&a)?, dtype, max, secs)?,
                    _ => gpu_allreduce::allreduce_hip(&rt, dtype, max, secs)?,
                };
                if rt.world_rank == 0 {
                    print!("{}", gpu::format_records(&records, a.has("--json")));
                }
                return Ok(());
            }
            (device @ ("cuda" | "hip"), _) => {
                return Err(Error::Unsupported(format!(
                    "--device {device}: of the collectives, only allreduce is benchmarked on the GPU"
                )))
            }
            (other, _) => return Err(Error::flag("--device", format!("'{other}'"), "cpu, cuda or hip")),
        }
        let rows = comm::sweep(bench, &rt, max, secs)?;
        if rt.world_rank == 0 {
            comm::print_table(bench, rt.world_size, &rt.library, &rows);
        }
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => end_after_gpu_comm_error(&rt, e),
    }
}

/// `trident bench summa`: panel against broadcast SUMMA on a q x q grid of ranks.
fn run_summa(rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = (|| -> Result<()> {
        let Some(a) = flags("bench summa", "2-D tensor-parallel SUMMA algorithms", BENCH_FLAGS, rest)? else {
            return Ok(());
        };
        let p = crate::config::preset(a.str("--preset").unwrap_or("gpt2-124m"))?;
        let h = a.usize("--hidden-size")?.unwrap_or(p.hidden_size);
        let mb = a.usize("--micro-batch-size")?.unwrap_or(4);
        let seq = a.usize("--seq-length")?.unwrap_or(p.seq_length.min(256));
        let q = (1..=rt.world_size).find(|q| q * q >= rt.world_size).unwrap_or(1).max(1);
        if !mb.is_multiple_of(q) {
            return Err(Error::Config(format!("--micro-batch-size {mb} is not divisible by q = {q}")));
        }
        let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
        let threads = a.usize("--cpu-threads")?.unwrap_or_else(|| rt.default_threads());
        let rows = summa::run(&rt, threads, h, mb / q * seq, secs)?;
        if rt.world_rank == 0 {
            summa::print_table(&rows, q, &rt.library);
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if rt.world_rank == 0 {
                eprintln!("trident: error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
