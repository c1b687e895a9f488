//! The `trident` command: parses the subcommand and its flags, runs it, and turns any error into
//! one line on stderr and a non-zero exit status.

use std::process::ExitCode;
use trident::bench_comm::CommBench;
use trident::bench_ops::{print_records, Record};
use trident::cli::{self, flag, many, switch, Args, FlagSpec};
use trident::comm::runtime::Runtime;
use trident::config::{TrainConfig, TRAIN_FLAGS};
use trident::data::prepare::{self, PrepareArgs, TextDocuments};
use trident::device::cpu::{gemm, peak, pool};
use trident::error::{Error, Result};

const USAGE: &str = "\
trident: Megatron-style GPT training in one binary

usage: trident <command> [flags]     (trident <command> --help lists the flags)

commands:
  prepare    text or JSON-lines files -> a Megatron .bin/.idx token dataset
  train      train a GPT model on a prepared dataset
  generate   sample text from a checkpoint
  convert    reshard a checkpoint to another TP/PP layout; export to / import from Hugging Face
  bench      microbenchmarks: peak (FMA peak), gemm (GEMM sweep), attention, layernorm, step,
             allreduce, allgather, reducescatter, sendrecv (collectives, under mpirun);
             gemm, attention and allreduce also on an NVIDIA GPU with --device cuda
  check      `check comm`: verify every collective of the Comm seam on this job (under mpirun);
             `check nccl-id`: rank 0's NCCL unique id reaches every rank (under mpirun);
             `check nccl`: every NCCL collective on GPU memory against MPI (under mpirun);
             `check gpu`: compile, load and launch a test kernel on each NVIDIA GPU, else each AMD GPU;
             `check ops --device cuda|hip|cpu [--size small|full] [--gpu N]`: every Device op against
             the f64 reference; `check losses A.jsonl B.jsonl [--rtol R]`: two runs' losses agree
  plan       choose a tensor/pipeline/data-parallel layout for a model on N GPUs (no GPU needed)
  info       what this binary found on this machine
";

const PREPARE_FLAGS: &[FlagSpec] = &[
    many("--input", "FILE", "text files, or JSON-lines files (.json/.jsonl)"),
    flag("--output-prefix", "P", "writes P_<key>_document.bin/.idx"),
    many("--json-keys", "KEY", "JSON fields to extract, one dataset each (default text)"),
    switch("--append-eod", "end every document with the end-of-document token"),
    flag("--text-documents", "MODE", "how plain text splits into documents: paragraph (default), line, file"),
    flag("--tokenizer-type", "NAME", "ByteTokenizer (the only tokenizer of this build)"),
];

const GENERATE_FLAGS: &[FlagSpec] = &[
    flag("--load", "DIR", "checkpoint directory written by `trident train --save`"),
    flag("--prompt", "TEXT", "text to continue (default: start of a document)"),
    flag("--max-new-tokens", "N", "tokens to sample (default 256)"),
    flag("--temperature", "T", "softmax temperature (default 1.0; 0 is greedy)"),
    flag("--top-k", "K", "sample among the K likeliest tokens (default 40; 1 is greedy, 0 all)"),
    flag("--seed", "SEED", "sampling seed (default 1234)"),
    flag("--cpu-threads", "N", "CPU threads"),
];

const CONVERT_FLAGS: &[FlagSpec] = &[
    flag("--load", "DIR", "checkpoint to read (its latest iteration)"),
    flag("--load-hf", "DIR", "a Hugging Face GPT-2 directory (config.json, model.safetensors) to read instead"),
    flag("--save", "DIR", "write a checkpoint of the target layout"),
    flag("--save-hf", "DIR", "write config.json and model.safetensors for Hugging Face transformers"),
    flag("--target-tensor-parallel-size", "T", "tensor-parallel size of the written checkpoint (default 1)"),
    flag("--target-pipeline-parallel-size", "P", "pipeline size of the written checkpoint (default 1)"),
    flag("--target-num-layers-per-virtual-pipeline-stage", "N", "virtual stages of the written checkpoint"),
    switch("--target-sequence-parallel", "mark the written checkpoint as sequence parallel"),
    flag("--target-tensor-parallel-mode", "MODE", "1d (default), 2d or 2.5d: how the written checkpoint's TP splits"),
    flag("--target-tesseract-depth", "D", "depth of a written 2.5d checkpoint"),
];

const BENCH_FLAGS: &[FlagSpec] = &[
    flag("--cpu-threads", "N", "CPU threads"),
    flag("--min-seconds", "S", "time per shape or size (default 0.3; 0.1 for collectives)"),
    flag("--max-size", "BYTES", "largest collective size (default 1G; suffixes K, M, G)"),
    switch("--json", "print one JSON object per measurement"),
    flag("--dtype", "T", "gemm and step: f32 (default) or bf16"),
    flag("--preset", "NAME", "step, summa: the model (default gpt2-124m)"),
    flag("--hidden-size", "H", "summa: hidden size (default: the preset's)"),
    flag("--micro-batch-size", "B", "step, summa: samples per step (default 4)"),
    flag("--seq-length", "S", "step: tokens per sample (default 64); summa: (default: the preset's, at most 256)"),
    flag("--vocab-size", "V", "step: vocabulary (default 50257, GPT-2's)"),
    flag(
        "--device",
        "D",
        "gemm, attention, layernorm, allreduce: cpu (default), cuda (an NVIDIA GPU; allreduce through NCCL) or hip (an AMD GPU; allreduce through RCCL, against the host-staged MPI path); gelu, xent, embedding: cuda or hip",
    ),
    flag("--comm-library", "LIB", "allreduce --device cuda: nccl (default) or rccl"),
    flag(
        "--shape",
        "S",
        "--device cuda|hip: one shape instead of the sweep (gemm MxNxK; attention BxSxHxD; layernorm RxC; gelu N; xent RxV; embedding BxSxH)",
    ),
];

const INFO_FLAGS: &[FlagSpec] = &[flag("--cpu-threads", "N", "CPU threads to measure the peak with")];

/// Parses flags or prints the help text; `None` means help was printed.
fn flags(command: &str, summary: &str, specs: &[FlagSpec], rest: &[String]) -> Result<Option<Args>> {
    let parsed = cli::parse(command, specs, rest)?;
    if parsed.is_none() {
        print!("{}", cli::help(command, summary, specs));
    }
    Ok(parsed)
}

fn threads(args: &Args) -> Result<usize> {
    match args.usize("--cpu-threads")? {
        Some(0) => Err(Error::flag("--cpu-threads", 0, "a positive whole number")),
        Some(n) => Ok(n),
        None => Ok(pool::default_threads()),
    }
}

fn cmd_prepare(rest: &[String]) -> Result<()> {
    let Some(a) = flags("prepare", "tokenize text into a Megatron .bin/.idx dataset", PREPARE_FLAGS, rest)? else {
        return Ok(());
    };
    let inputs = a.list("--input").ok_or_else(|| Error::Usage("prepare needs --input FILE...".into()))?;
    let output_prefix =
        a.str("--output-prefix").ok_or_else(|| Error::Usage("prepare needs --output-prefix P".into()))?;
    if let Some(t) = a.str("--tokenizer-type") {
        if t != "ByteTokenizer" {
            return Err(Error::Unsupported(format!("--tokenizer-type {t}: only ByteTokenizer is built")));
        }
    }
    let text_documents = match a.str("--text-documents").unwrap_or("paragraph") {
        "paragraph" => TextDocuments::Paragraph,
        "line" => TextDocuments::Line,
        "file" => TextDocuments::File,
        other => return Err(Error::flag("--text-documents", format!("'{other}'"), "paragraph, line or file")),
    };
    let args = PrepareArgs {
        inputs: inputs.iter().map(Into::into).collect(),
        output_prefix: output_prefix.to_string(),
        json_keys: a.list("--json-keys").map(|k| k.to_vec()).unwrap_or_else(|| vec!["text".to_string()]),
        append_eod: a.has("--append-eod"),
        text_documents,
        force_json: None,
    };
    let mut shown = false;
    let summary = prepare::prepare(&args, &mut |p| {
        eprint!(
            "\r prepare: {:.1}/{:.1} MiB, {} documents, {} tokens, {:.1} s",
            p.bytes_done as f64 / 1048576.0,
            p.bytes_total as f64 / 1048576.0,
            p.documents,
            p.tokens,
            p.seconds
        );
        shown = true;
    })?;
    if shown {
        eprintln!();
    }
    println!("{summary}");
    Ok(())
}

/// Starts MPI (or a single process); a launcher mismatch is reported once and ends the process.
fn start_mpi() -> std::result::Result<Runtime, ExitCode> {
    Runtime::init().map_err(|e| {
        if let Some(e) = e {
            eprintln!("trident: error: {e}");
        }
        ExitCode::FAILURE
    })
}

/// `trident train` on every rank of the job. MPI starts first, so that an error every rank
/// detects alike (a flag, a layout) is printed once, by rank 0, and every rank exits non-zero;
/// an error only some ranks see (a failed read) is printed by that rank, which then ends the
/// whole job so that no rank waits forever in a collective.
fn cmd_train(rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = (|| {
        let Some(a) = flags("train", "train a GPT model (Megatron's flag names)", TRAIN_FLAGS, rest)? else {
            return Ok(false);
        };
        let cfg = TrainConfig::from_args(&a)?;
        trident::train::run(&cfg, &rt).map(|summary| summary.stopped.is_some())
    })();
    match result {
        Ok(false) => ExitCode::SUCCESS,
        // Stopped early after a checkpoint (--exit-signal-handler, --exit-duration-in-mins).
        Ok(true) => ExitCode::from(trident::stop::REQUEUE_EXIT_CODE),
        Err(e) if e.is_collective() || rt.world_size == 1 => {
            if rt.world_rank == 0 {
                eprintln!("trident: error: {e}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("trident: error: rank {}: {e}", rt.world_rank);
            rt.abort(1)
        }
    }
}

fn cmd_generate(rest: &[String]) -> Result<()> {
    let Some(a) = flags("generate", "sample a continuation from a checkpoint", GENERATE_FLAGS, rest)? else {
        return Ok(());
    };
    let load = a.path("--load").ok_or_else(|| Error::Usage("generate needs --load DIR".into()))?;
    let temperature = a.f64("--temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(Error::flag("--temperature", temperature, "a number >= 0"));
    }
    trident::generate::run(&trident::generate::GenerateArgs {
        load,
        prompt: a.str("--prompt").unwrap_or("").to_string(),
        max_new_tokens: a.usize("--max-new-tokens")?.unwrap_or(256),
        temperature,
        top_k: a.usize("--top-k")?.unwrap_or(40),
        seed: a.u64("--seed")?.unwrap_or(1234),
        cpu_threads: threads(&a)?,
    })
}

/// `trident convert`: reshard a checkpoint, or move weights to and from Hugging Face's format.
fn cmd_convert(rest: &[String]) -> Result<()> {
    use trident::checkpoint::convert::{read_full, write_layout, FullCheckpoint, Layout};
    use trident::checkpoint::safetensors::{export_hf, import_hf};
    let Some(a) =
        flags("convert", "reshard a checkpoint, or export / import Hugging Face GPT-2 weights", CONVERT_FLAGS, rest)?
    else {
        return Ok(());
    };
    let full = match (a.path("--load"), a.path("--load-hf")) {
        (Some(dir), None) => read_full(&dir)?,
        (None, Some(dir)) => {
            let (model, params) = import_hf(&dir)?;
            let mut meta = std::collections::BTreeMap::new();
            for (k, v) in [
                ("format", "trident-checkpoint".to_string()),
                ("iteration", "0".to_string()),
                ("consumed_train_samples", "0".to_string()),
                ("consumed_valid_samples", "0".to_string()),
                ("adam_step", "0".to_string()),
                ("seed", "1234".to_string()),
                ("tokenizer", "ByteTokenizer".to_string()),
                ("seq_length", model.max_position_embeddings.to_string()),
                ("imported_from", dir.display().to_string()),
            ]
            .into_iter()
            .chain(trident::train::model_meta(&model))
            {
                meta.insert(k.to_string(), v);
            }
            let mut tensors = std::collections::BTreeMap::new();
            for (name, values) in params {
                tensors.insert(format!("adam_m/{name}"), vec![0.0; values.len()]);
                tensors.insert(format!("adam_v/{name}"), vec![0.0; values.len()]);
                tensors.insert(format!("param/{name}"), values);
            }
            let layout = Layout {
                tp: 1,
                pp: 1,
                chunks: 1,
                first_stage_layers: None,
                last_stage_layers: None,
                sequence_parallel: false,
                summa: None,
            };
            FullCheckpoint { iteration: 0, meta, model, layout, tensors }
        }
        _ => return Err(Error::Usage("convert needs exactly one of --load DIR or --load-hf DIR".into())),
    };
    if a.path("--save").is_none() && a.path("--save-hf").is_none() {
        return Err(Error::Usage("convert needs --save DIR and/or --save-hf DIR".into()));
    }
    if let Some(dir) = a.path("--save-hf") {
        export_hf(&full, &dir)?;
        println!("wrote {} and {}", dir.join("config.json").display(), dir.join("model.safetensors").display());
    }
    if let Some(dir) = a.path("--save") {
        let positive = |name: &str, default: usize| -> Result<usize> {
            match a.usize(name)? {
                Some(0) => Err(Error::flag(name, 0, "a positive whole number")),
                other => Ok(other.unwrap_or(default)),
            }
        };
        let (tp, pp) = (positive("--target-tensor-parallel-size", 1)?, positive("--target-pipeline-parallel-size", 1)?);
        let chunks = match a.usize("--target-num-layers-per-virtual-pipeline-stage")? {
            None => 1,
            Some(n) if n > 0 && pp > 1 && full.model.num_layers.is_multiple_of(n * pp) => {
                full.model.num_layers / (n * pp)
            }
            Some(n) => {
                return Err(Error::Config(format!(
                    "--target-num-layers-per-virtual-pipeline-stage {n} does not split {} layers over {pp} stages",
                    full.model.num_layers
                )))
            }
        };
        let mode = trident::parallel::grid::TensorMode::new(
            a.str("--target-tensor-parallel-mode").unwrap_or("1d"),
            a.usize("--target-tesseract-depth")?,
            tp,
        )
        .map_err(|e| Error::Config(e.to_string().replace("--t", "--target-t")))?;
        let target = Layout {
            tp,
            pp,
            chunks,
            first_stage_layers: None,
            last_stage_layers: None,
            sequence_parallel: a.has("--target-sequence-parallel"),
            summa: match mode {
                trident::parallel::grid::TensorMode::OneD => None,
                trident::parallel::grid::TensorMode::Summa { q, depth } => Some((q, depth)),
            },
        };
        let written = write_layout(&full, &dir, target)?;
        println!(
            "converted iteration {} from tensor-parallel {} [{}] x pipeline {} to tensor-parallel {tp} [{}] x pipeline \
             {pp}: {}",
            full.iteration,
            full.layout.tp,
            full.layout.tensor_mode().describe(),
            full.layout.pp,
            target.tensor_mode().describe(),
            written.display()
        );
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
fn cmd_bench_comm(bench: CommBench, rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = (|| -> Result<()> {
        let Some(a) = flags("bench", "collective microbenchmarks", BENCH_FLAGS, rest)? else {
            return Ok(());
        };
        let max = a.str("--max-size").map(|s| parse_bytes("--max-size", s)).transpose()?.unwrap_or(1 << 30);
        let secs = a.f64("--min-seconds")?.unwrap_or(0.1);
        match (a.str("--device").unwrap_or("cpu"), bench) {
            ("cpu", _) => {}
            ("cuda", CommBench::AllReduce) => {
                let dtype = match a.str("--dtype").unwrap_or("f32") {
                    "f32" => trident::comm::Dtype::F32,
                    "bf16" => trident::comm::Dtype::Bf16,
                    other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
                };
                let records = trident::bench_cuda::allreduce(&rt, comm_library(&a)?, dtype, max, secs)?;
                if rt.world_rank == 0 {
                    print!("{}", trident::bench_cuda::format_records(&records, a.has("--json")));
                }
                return Ok(());
            }
            ("hip", CommBench::AllReduce) => {
                let dtype = match a.str("--dtype").unwrap_or("f32") {
                    "f32" => trident::comm::Dtype::F32,
                    "bf16" => trident::comm::Dtype::Bf16,
                    other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
                };
                let records = trident::bench_cuda::allreduce_hip(&rt, dtype, max, secs)?;
                if rt.world_rank == 0 {
                    print!("{}", trident::bench_cuda::format_records(&records, a.has("--json")));
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
        let rows = trident::bench_comm::sweep(bench, &rt, max, secs)?;
        if rt.world_rank == 0 {
            trident::bench_comm::print_table(bench, rt.world_size, &rt.library, &rows);
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => end_after_gpu_comm_error(&rt, e),
    }
}

/// `trident bench summa`: panel against broadcast SUMMA on a q x q grid of ranks.
fn cmd_bench_summa(rest: &[String]) -> ExitCode {
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = (|| -> Result<()> {
        let Some(a) = flags("bench summa", "2-D tensor-parallel SUMMA algorithms", BENCH_FLAGS, rest)? else {
            return Ok(());
        };
        let p = trident::config::preset(a.str("--preset").unwrap_or("gpt2-124m"))?;
        let h = a.usize("--hidden-size")?.unwrap_or(p.hidden_size);
        let mb = a.usize("--micro-batch-size")?.unwrap_or(4);
        let seq = a.usize("--seq-length")?.unwrap_or(p.seq_length.min(256));
        let q = (1..=rt.world_size).find(|q| q * q >= rt.world_size).unwrap_or(1).max(1);
        if !mb.is_multiple_of(q) {
            return Err(Error::Config(format!("--micro-batch-size {mb} is not divisible by q = {q}")));
        }
        let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
        let threads = a.usize("--cpu-threads")?.unwrap_or_else(|| rt.default_threads());
        let rows = trident::bench_summa::run(&rt, threads, h, mb / q * seq, secs)?;
        if rt.world_rank == 0 {
            trident::bench_summa::print_table(&rows, q, &rt.library);
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

/// `trident check comm`: the Comm seam verified on every rank of the job.
/// `trident check gpu`: the device smoke test on every visible NVIDIA GPU, else on every visible
/// AMD GPU; with neither, one line naming what each vendor's side is missing.
fn check_gpu() -> Result<()> {
    use trident::gpu::{driver::Driver, hip::Hip};
    let nvidia = match Driver::load() {
        Ok(driver) => match driver.device_count() {
            Ok(n) if n > 0 => return check_gpu_cuda(&driver, n),
            Ok(_) => format!("the driver ({}) sees no device", driver.path()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    let amd = match Hip::load() {
        Ok(hip) => match hip.device_count() {
            Ok(n) if n > 0 => return check_gpu_hip(&hip, n),
            Ok(_) => format!("the HIP runtime ({}) sees no device", hip.path()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    Err(Error::Usage(format!("check gpu needs an NVIDIA GPU: {nvidia}; or an AMD GPU: {amd}")))
}

fn print_smoke(ordinal: usize, r: &trident::gpu::smoke::SmokeReport) {
    println!(
        "gpu check: device {ordinal} ({}, {}): {} launched over {} elements in {} blocks, result exact ({})",
        r.device,
        r.arch,
        trident::gpu::smoke::AXPY_NAME,
        r.elements,
        r.blocks,
        r.cache
    );
}

/// The GPU Device's ops against the reference device on small shapes, as one line (`check ops`
/// prints the table).
fn device_ops_line<D: trident::device::Device>(ordinal: usize, api: &str, dev: &D, head_dims: &[usize]) -> Result<()> {
    use trident::device::check::{run_all, Size};
    let checks = run_all(dev, Size::Small, head_dims, 7);
    if let Some(bad) = checks.iter().find(|c| !c.passed()) {
        return Err(Error::Check(format!("gpu check: device {ordinal}: the {api} Device: {}", bad.line())));
    }
    println!(
        "gpu check: device {ordinal}: the {api} Device matches the reference device on {} op outputs",
        checks.len()
    );
    Ok(())
}

fn check_gpu_cuda(driver: &trident::gpu::driver::Driver, n: usize) -> Result<()> {
    use trident::gpu::{cache::ModuleCache, nvrtc::Nvrtc, smoke};
    let nvrtc = Nvrtc::load()?;
    let cache = ModuleCache::at_default_root()?;
    for ordinal in 0..n {
        print_smoke(ordinal, &smoke::run(driver, &nvrtc, &cache, ordinal)?);
    }
    // Then the Device itself on each GPU (after every smoke test, so a broken Device does not hide
    // which GPUs launch kernels at all).
    for ordinal in 0..n {
        let dev = trident::gpu::device::GpuDevice::cuda(ordinal)?;
        device_ops_line(ordinal, "CUDA", &dev, &[64, 128])?;
    }
    println!(
        "gpu check: passed on {n} NVIDIA device{}; `trident check ops` compares every fused op with the reference",
        if n == 1 { "" } else { "s" }
    );
    Ok(())
}

fn check_gpu_hip(hip: &trident::gpu::hip::Hip, n: usize) -> Result<()> {
    use trident::gpu::{cache::ModuleCache, hiprtc::Hiprtc, smoke};
    let hiprtc =
        Hiprtc::load().map_err(|e| Error::Usage(format!("check gpu on AMD compiles its kernel with hipRTC: {e}")))?;
    let cache = ModuleCache::at_default_root()?;
    for ordinal in 0..n {
        print_smoke(ordinal, &smoke::run_hip(hip, &hiprtc, &cache, ordinal)?);
    }
    for ordinal in 0..n {
        let dev = trident::gpu::device::GpuDevice::hip(ordinal)?;
        device_ops_line(ordinal, "HIP", &dev, &[64, 128])?;
    }
    println!(
        "gpu check: passed on {n} AMD device{}; `trident check ops` compares every fused op with the reference",
        if n == 1 { "" } else { "s" }
    );
    Ok(())
}

/// `trident check nccl-id`: rank 0 creates an NCCL unique id, the Comm seam broadcasts it, and
/// every rank's copy is gathered back to rank 0 and compared.
fn check_nccl_id(rt: &Runtime) -> Result<String> {
    use trident::gpu::nccl::{exchange_unique_id, Flavor, Nccl, UNIQUE_ID_BYTES};
    let world = rt.group(&(0..rt.world_size).collect::<Vec<_>>());
    let mut nccl = None;
    let id = exchange_unique_id(world.as_ref(), || {
        let lib = Nccl::load(Flavor::Nccl)?;
        let id = lib.unique_id()?;
        nccl = Some(lib);
        Ok(id)
    })?;
    let mut all = vec![0u8; UNIQUE_ID_BYTES * rt.world_size];
    world.all_gather_bytes(&id.internal, &mut all, trident::comm::Dtype::F32);
    if let Some(bad) = all.chunks_exact(UNIQUE_ID_BYTES).position(|c| c != id.internal) {
        return Err(Error::Comm(format!("rank {bad} received another NCCL unique id than rank 0's")));
    }
    let (version, path) = match &nccl {
        Some(n) => (n.version()?, n.path()),
        None => (String::new(), String::new()),
    };
    Ok(format!(
        "nccl id check: rank 0 created {:?} with NCCL {version} ({path}); all {} ranks hold the same {UNIQUE_ID_BYTES} bytes",
        id, rt.world_size
    ))
}

/// `trident check ops [--device cpu|cuda|hip] [--size small|full] [--gpu N]`: every op of the device
/// against the f64 reference device (`device::check`); a table, then one verdict line.
fn check_ops(args: &[String]) -> Result<()> {
    use trident::device::check::{run_all, Size};
    use trident::device::Device;
    let Some(a) = flags("check ops", "every Device op against the f64 reference device", CHECK_OPS_FLAGS, args)? else {
        return Ok(());
    };
    let device = a.str("--device").unwrap_or("cuda");
    let size = match a.str("--size").unwrap_or("full") {
        "small" => Size::Small,
        "full" => Size::Full,
        other => return Err(Error::flag("--size", format!("'{other}'"), "small or full")),
    };
    let ordinal = a.usize("--gpu")?.unwrap_or(0);
    let started = std::time::Instant::now();
    let (name, checks) = match device {
        "cpu" => {
            let dev = trident::device::cpu::CpuDevice::new(pool::default_threads());
            (dev.describe(), run_all(&dev, size, &[32, 64, 128], 7))
        }
        "cuda" => {
            let dev = trident::gpu::device::GpuDevice::cuda(ordinal)?;
            (dev.describe(), run_all(&dev, size, &[64, 128], 7))
        }
        "hip" => {
            let dev = trident::gpu::device::GpuDevice::hip(ordinal)?;
            (dev.describe(), run_all(&dev, size, &[64, 128], 7))
        }
        other => return Err(Error::flag("--device", format!("'{other}'"), "cpu, cuda or hip")),
    };
    println!("{:<28} {:<28} {:>9} {:>11}  verdict", "op", "case", "elements", "max |error|");
    for c in &checks {
        println!("{}", c.line());
    }
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let secs = started.elapsed().as_secs_f64();
    if failed > 0 {
        return Err(Error::Check(format!(
            "check ops on {name}: {failed} of {} outputs outside their bounds (see the table)",
            checks.len()
        )));
    }
    println!("ops check: all {} outputs within their bounds on {name} ({secs:.1} s)", checks.len());
    Ok(())
}

/// `trident check losses A.jsonl B.jsonl [--rtol R]`: two runs' `--log-json` losses, iteration by
/// iteration; fails when an iteration is missing from one of them or differs by more than `R`
/// (relative; default 5e-3, bf16's agreement between backends).
fn check_losses(args: &[String]) -> Result<()> {
    let (mut files, mut rtol) = (Vec::new(), 5e-3f64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--rtol" {
            let v = it.next().ok_or_else(|| Error::Usage("check losses: --rtol needs a value".into()))?;
            rtol = v
                .parse()
                .ok()
                .filter(|r: &f64| *r >= 0.0)
                .ok_or_else(|| Error::Usage(format!("check losses: --rtol takes a number >= 0, not {v:?}")))?;
        } else {
            files.push(std::path::PathBuf::from(a));
        }
    }
    let [a, b] = files.as_slice() else {
        return Err(Error::Usage(
            "check losses needs two --log-json files: check losses A.jsonl B.jsonl [--rtol R]".into(),
        ));
    };
    let (la, lb) = (trident::log::read_losses(a)?, trident::log::read_losses(b)?);
    if la.is_empty() {
        return Err(Error::Usage(format!("check losses: {} holds no losses", a.display())));
    }
    let its = |l: &[(u64, f64)]| l.iter().map(|x| x.0).collect::<Vec<_>>();
    if its(&la) != its(&lb) {
        return Err(Error::Usage(format!(
            "check losses: {} logs iterations {:?}, {} logs {:?}",
            a.display(),
            its(&la),
            b.display(),
            its(&lb)
        )));
    }
    let mut worst = 0.0f64;
    for ((i, x), (_, y)) in la.iter().zip(&lb) {
        let rel = (x - y).abs() / x.abs().max(1e-30);
        println!("iteration {i:>5}: {x:.6} {y:.6} (relative difference {rel:.2e})");
        if rel > rtol || rel.is_nan() {
            return Err(Error::Check(format!(
                "check losses: iteration {i}: {x} in {} and {y} in {} differ by {rel:.2e} > {rtol:e}",
                a.display(),
                b.display()
            )));
        }
        worst = worst.max(rel);
    }
    println!("losses check: {} iterations agree within {rtol:e} (largest relative difference {worst:.2e})", la.len());
    Ok(())
}

const CHECK_OPS_FLAGS: &[FlagSpec] = &[
    flag("--device", "D", "cuda (default), hip or cpu"),
    flag("--size", "S", "small (ragged shapes, seconds on an emulated GPU) or full (default: adds GPT-2-sized shapes)"),
    flag("--gpu", "N", "the GPU to check (default 0)"),
];

const CHECK_NCCL_FLAGS: &[FlagSpec] =
    &[flag("--comm-library", "LIB", "nccl (default; TRIDENT_NCCL names the file) or rccl (TRIDENT_RCCL)")];

/// `--comm-library`: which library of the NCCL ABI the GPU collectives load.
fn comm_library(a: &Args) -> Result<trident::gpu::nccl::Flavor> {
    use trident::gpu::nccl::Flavor;
    match a.str("--comm-library").unwrap_or("nccl") {
        "nccl" => Ok(Flavor::Nccl),
        "rccl" => Ok(Flavor::Rccl),
        other => Err(Error::flag("--comm-library", format!("'{other}'"), "nccl or rccl")),
    }
}

/// How a rank ends after a GPU-collective error: an error every rank meets alike (a flag, a missing
/// library) is printed once by rank 0 and every rank exits; any other (a peer that died, a
/// mismatch seen here) is printed by the rank that met it, which then ends the whole job, after a
/// moment in which the other surviving ranks print theirs (they time out together).
fn end_after_gpu_comm_error(rt: &Runtime, e: Error) -> ExitCode {
    let library_missing = matches!(e, Error::GpuLibrary { .. });
    if e.is_collective() || library_missing || rt.world_size == 1 {
        if rt.world_rank == 0 {
            eprintln!("trident: error: {e}");
        }
        return ExitCode::FAILURE;
    }
    if matches!(&e, Error::Comm(m) if rt.world_rank != 0 && m.starts_with("rank 0 could not")) {
        return ExitCode::FAILURE;
    }
    // One write, so that the lines of ranks failing together do not interleave.
    let line = format!("trident: error: rank {}: {e}\n", rt.world_rank);
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    std::thread::sleep(std::time::Duration::from_millis(500));
    rt.abort(1)
}

/// `trident check nccl`: every collective through NCCL/RCCL on device memory against MPI.
fn check_nccl(rt: &Runtime, rest: &[String]) -> ExitCode {
    let result = (|| -> Result<Option<String>> {
        let Some(a) = flags("check nccl", "NCCL collectives on device memory against MPI", CHECK_NCCL_FLAGS, rest)?
        else {
            return Ok(None);
        };
        trident::gpu::collectives::check(rt, comm_library(&a)?).map(Some)
    })();
    match result {
        Ok(line) => {
            if let (Some(line), 0) = (line, rt.world_rank) {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => end_after_gpu_comm_error(rt, e),
    }
}

fn cmd_check(rest: &[String]) -> ExitCode {
    let target = rest.first().map(String::as_str);
    type Local = fn(&[String]) -> Result<()>;
    let local: Option<Local> = match target {
        Some("ops") => Some(check_ops),
        Some("losses") => Some(check_losses),
        _ => None,
    };
    if let Some(f) = local {
        return match f(&rest[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("trident: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if target == Some("gpu") {
        return match check_gpu() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("trident: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if target != Some("comm") && target != Some("nccl-id") && target != Some("nccl") {
        eprintln!("trident: error: check needs a target: `trident check comm`, `check nccl-id` or `check nccl` (run them under mpirun), `check gpu`, `check ops` or `check losses`");
        return ExitCode::FAILURE;
    }
    let rt = match start_mpi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    if target == Some("nccl") {
        return check_nccl(&rt, &rest[1..]);
    }
    if target == Some("nccl-id") {
        return match check_nccl_id(&rt) {
            Ok(line) => {
                if rt.world_rank == 0 {
                    println!("{line}");
                }
                ExitCode::SUCCESS
            }
            // Rank 0's own failure is printed there; the others only learn that it failed.
            Err(Error::Comm(m)) if rt.world_rank != 0 && m.starts_with("rank 0 could not") => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("trident: error: {e}");
                rt.abort(1)
            }
        };
    }
    match trident::check_comm::run(&rt) {
        Ok(passed) => {
            if rt.world_rank == 0 {
                println!("comm check: {passed} checks passed on each of {} ranks ({})", rt.world_size, rt.library);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("trident: error: {e}");
            rt.abort(1)
        }
    }
}

fn cmd_bench(rest: &[String]) -> Result<()> {
    let (what, rest) = match rest.split_first() {
        Some((w, r)) if !w.starts_with('-') => (w.as_str(), r),
        _ => {
            return Err(Error::Usage(
                "bench needs a target: peak, gemm, attention, layernorm, step, gelu, xent, embedding, allreduce, allgather, reducescatter or sendrecv".into(),
            ))
        }
    };
    let Some(a) = flags(&format!("bench {what}"), "microbenchmarks", BENCH_FLAGS, rest)? else {
        return Ok(());
    };
    match a.str("--device").unwrap_or("cpu") {
        "cpu" => {}
        device @ ("cuda" | "hip") => {
            use trident::gpu::kernels::Vendor;
            let vendor = if device == "cuda" { Vendor::Cuda } else { Vendor::Hip };
            let bench = trident::bench_cuda::GpuBench::parse(what).ok_or_else(|| {
                Error::Unsupported(format!(
                    "bench {what} --device {device}: the GPU benchmarks are gemm, attention, layernorm, gelu, xent, embedding and allreduce"
                ))
            })?;
            let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
            let records = trident::bench_cuda::run(bench, vendor, secs, a.str("--shape"))?;
            print!("{}", trident::bench_cuda::format_records(&records, a.has("--json")));
            return Ok(());
        }
        other => return Err(Error::flag("--device", format!("'{other}'"), "cpu, cuda or hip")),
    }
    let pool = pool::ThreadPool::new(threads(&a)?);
    match what {
        "peak" => {
            let p = peak::measure_fma_peak(&pool, 500);
            println!(
                "fma peak: {:.1} GFLOP/s on {} threads ({:.1} per thread), {}",
                p.gflops, p.threads, p.gflops_per_thread, p.isa
            );
            Ok(())
        }
        "gemm" => {
            let p = peak::measure_fma_peak(&pool, 300);
            let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
            let dtype = match a.str("--dtype").unwrap_or("f32") {
                "f32" => trident::bench_gemm::GemmDtype::F32,
                "bf16" => trident::bench_gemm::GemmDtype::Bf16,
                other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
            };
            let rows = trident::bench_gemm::gemm_sweep_dtype(&pool, trident::bench_gemm::DEFAULT_SHAPES, &p, secs, dtype);
            if a.has("--json") {
                let records: Vec<Record> = rows
                    .iter()
                    .map(|r| Record {
                        bench: "gemm",
                        shape: format!("{}x{}x{} {}", r.m, r.n, r.k, r.layout),
                        dtype: if dtype == trident::bench_gemm::GemmDtype::Bf16 { "bf16" } else { "f32" },
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
                println!("fma peak: {:.1} GFLOP/s on {} threads, gemm kernel {:?}", p.gflops, p.threads, gemm::best_kernel());
                trident::bench_gemm::print_table(&rows);
            }
            Ok(())
        }
        "attention" | "layernorm" | "step" => {
            let dev = trident::device::cpu::CpuDevice::new(pool.threads());
            let p = peak::measure_fma_peak(dev.pool(), 300);
            let secs = a.f64("--min-seconds")?.unwrap_or(0.3);
            let records = match what {
                "attention" => trident::bench_ops::attention(&dev, &p, secs),
                "layernorm" => trident::bench_ops::layernorm(&dev, trident::bench_ops::triad_bandwidth(dev.pool(), secs), secs),
                _ => trident::bench_ops::step(
                    &dev,
                    &p,
                    a.str("--preset").unwrap_or("gpt2-124m"),
                    a.usize("--micro-batch-size")?.unwrap_or(4).max(1),
                    a.usize("--seq-length")?.unwrap_or(64).max(1),
                    a.usize("--vocab-size")?.unwrap_or(50257).max(257),
                    match a.str("--dtype").unwrap_or("f32") {
                        "f32" => trident::real::Precision::F32,
                        "bf16" => trident::real::Precision::Bf16,
                        other => return Err(Error::flag("--dtype", format!("'{other}'"), "f32 or bf16")),
                    },
                    secs,
                )?,
            };
            print_records(&records, a.has("--json"));
            Ok(())
        }
        "gelu" | "xent" | "embedding" => {
            Err(Error::Usage(format!("bench {what} times a GPU kernel: add --device cuda or --device hip")))
        }
        other => Err(Error::Usage(format!(
            "unknown bench target '{other}': use peak, gemm, attention, layernorm, step, gelu, xent, embedding, allreduce, allgather, reducescatter or sendrecv"
        ))),
    }
}

/// `trident plan`: rank tensor/pipeline/data-parallel layouts for a model on N GPUs.
fn cmd_plan(rest: &[String]) -> Result<()> {
    use trident::plan::{self, report, request::PLAN_FLAGS, Request};
    let Some(a) =
        flags("plan", "choose a TP/PP/DP layout: memory per GPU and iteration time of each", PLAN_FLAGS, rest)?
    else {
        return Ok(());
    };
    let req = Request::from_args(&a)?;
    let top = a.usize("--top")?.unwrap_or(5);
    let result = plan::plan(&req)?;
    if a.has("--json") {
        report::print_json(&result, &req, top);
    } else {
        report::print_text(&result, &req, top);
    }
    Ok(())
}

fn cmd_info(rest: &[String]) -> Result<()> {
    let Some(a) = flags("info", "what this binary found on this machine", INFO_FLAGS, rest)? else {
        return Ok(());
    };
    let pool = pool::ThreadPool::new(threads(&a)?);
    let p = peak::measure_fma_peak(&pool, 150);
    println!("trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
    println!(
        "cpu: {} threads; gemm kernel {:?}; element-wise kernels {:?}; fma peak {:.1} GFLOP/s ({})",
        pool.threads(),
        gemm::best_kernel(),
        trident::device::cpu::simd::level(),
        p.gflops,
        p.isa
    );
    for line in trident::gpu::info_lines() {
        println!("{line}");
    }
    for line in trident::gpu::hip_info_lines() {
        println!("{line}");
    }
    #[cfg(feature = "mpi")]
    {
        // MPI_Get_library_version may be called before MPI starts.
        let library = mpi::environment::library_version()
            .map(|s| s.trim_end_matches('\0').lines().next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|_| "an MPI library".into());
        println!("mpi: built with {library}; start many ranks with that MPI's mpirun/mpiexec or srun");
    }
    #[cfg(not(feature = "mpi"))]
    println!("mpi: not built into this binary (cargo --no-default-features): one rank only");
    Ok(())
}

fn run(args: &[String]) -> Result<()> {
    let Some((command, rest)) = args.split_first() else {
        print!("{USAGE}");
        return Err(Error::Usage("no command given".into()));
    };
    match command.as_str() {
        "prepare" => cmd_prepare(rest),
        "train" => unreachable!("train is dispatched before run"),
        "generate" => cmd_generate(rest),
        "bench" => cmd_bench(rest),
        "info" => cmd_info(rest),
        "convert" => cmd_convert(rest),
        "plan" => cmd_plan(rest),
        "--help" | "-h" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "--version" => {
            println!("trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
            Ok(())
        }
        other => Err(Error::Usage(format!("unknown command '{other}' (see `trident --help`)"))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("train") {
        return cmd_train(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("check") {
        return cmd_check(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("bench") {
        if let Some(bench) = args.get(1).and_then(|w| CommBench::parse(w)) {
            return cmd_bench_comm(bench, &args[2..]);
        }
        if args.get(1).map(String::as_str) == Some("summa") {
            return cmd_bench_summa(&args[2..]);
        }
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trident: error: {e}");
            ExitCode::FAILURE
        }
    }
}
