//! `trident plan`'s parsed flags (`flags::PLAN_FLAGS`: Megatron's names where Megatron has one)
//! turned into a validated `Request`.

use super::hardware::{from_file, machine, Machine, GIB};
use super::models::{self, Shape};
use super::{Features, Pins, Precision, Request, Schedule};
use crate::cli::Args;
use crate::error::{Error, Result};
use crate::model::{Arch, Recompute};

/// GiB per GPU the runtime holds before the model's tensors (CUDA context about 0.5, NCCL's
/// buffers for the TP, PP, DP and embedding communicators about 1, cuBLAS / cuDNN workspaces),
/// beside the 10% `--memory-headroom` that allocator fragmentation takes.
pub const RUNTIME_RESERVE_GIB: f64 = 2.0;

fn positive(a: &Args, name: &str) -> Result<Option<usize>> {
    match a.usize(name)? {
        Some(0) => Err(Error::flag(name, 0, "a positive whole number")),
        other => Ok(other),
    }
}

fn positive_f64(a: &Args, name: &str) -> Result<Option<f64>> {
    match a.f64(name)? {
        Some(x) if x <= 0.0 => Err(Error::flag(name, x, "a positive number")),
        other => Ok(other),
    }
}

/// The model shape: `--model`, with any shape or architecture flag given on top of it, or the
/// flags alone (GPT-2's architecture unless the flags say otherwise, as for `train`).
fn shape(a: &Args) -> Result<(String, Shape)> {
    let base = a.str("--model").map(models::named).transpose()?;
    let need = |name: &str, from_model: Option<usize>| -> Result<usize> {
        match (positive(a, name)?, from_model) {
            (Some(v), _) | (None, Some(v)) => Ok(v),
            (None, None) => Err(Error::Usage(format!(
                "plan needs --model NAME or the model's shape: {name} is missing (see `trident plan --help`)"
            ))),
        }
    };
    let layers = need("--num-layers", base.as_ref().map(|s| s.num_layers))?;
    let hidden = need("--hidden-size", base.as_ref().map(|s| s.hidden_size))?;
    let heads = need("--num-attention-heads", base.as_ref().map(|s| s.num_attention_heads))?;
    let seq = need("--seq-length", base.as_ref().map(|s| s.seq_length))?;
    let base_arch = base.as_ref().map_or(Arch::GPT2, |s| s.arch.clone());
    let arch = crate::config::architecture(a, &base_arch)?;
    if arch.kv_channels.is_none() && !hidden.is_multiple_of(heads) {
        return Err(Error::Config(format!("--hidden-size {hidden} is not divisible by --num-attention-heads {heads}")));
    }
    let head_dim = arch.kv_channels.unwrap_or(hidden / heads);
    arch.validate(heads, head_dim)?;
    // As `train`: the model's width while the hidden size and the MLP kind stay, else Megatron's
    // default (two thirds of 4h, a multiple of 64, under SwiGLU).
    let ffn = positive(a, "--ffn-hidden-size")?.unwrap_or(match &base {
        Some(s) if s.hidden_size == hidden && s.arch.swiglu == arch.swiglu => s.ffn_hidden_size,
        _ if arch.swiglu => 4 * hidden * 2 / 3 / 64 * 64,
        _ => 4 * hidden,
    });
    let positions = positive(a, "--max-position-embeddings")?
        .unwrap_or(base.as_ref().map(|s| s.max_position_embeddings.max(seq)).unwrap_or(seq));
    if seq > positions {
        return Err(Error::Config(format!("--seq-length {seq} is above --max-position-embeddings {positions}")));
    }
    let divisible_by = positive(a, "--make-vocab-size-divisible-by")?.unwrap_or(128);
    let vocab = match (positive(a, "--vocab-size")?, &base) {
        (Some(v), _) => v,
        (None, Some(s)) => s.vocab_size,
        (None, None) => 50257,
    };
    let sizes =
        ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--ffn-hidden-size", "--vocab-size"];
    let custom = arch != base_arch || sizes.iter().any(|f| a.has(f));
    let name = match a.str("--model") {
        Some(m) if !custom => m.to_string(),
        Some(m) => format!("{m} (modified)"),
        None => "custom".to_string(),
    };
    Ok((
        name,
        Shape {
            num_layers: layers,
            hidden_size: hidden,
            num_attention_heads: heads,
            ffn_hidden_size: ffn,
            seq_length: seq,
            max_position_embeddings: positions,
            vocab_size: vocab,
            vocab_divisible_by: divisible_by,
            arch,
        },
    ))
}

impl Request {
    pub fn from_args(a: &Args) -> Result<Request> {
        let (model_name, shape) = shape(a)?;
        let gpus = positive(a, "--gpus")?.ok_or_else(|| Error::Usage("plan needs --gpus N".into()))?;
        let global_batch = positive(a, "--global-batch-size")?
            .ok_or_else(|| Error::Usage("plan needs --global-batch-size B".into()))?;
        let precision = Precision::parse(a.str("--precision").unwrap_or("bf16"))?;
        let machine = machine_from_args(a, precision)?;
        let memory_headroom = match a.f64("--memory-headroom")? {
            Some(h) if !(0.0..1.0).contains(&h) => {
                return Err(Error::flag("--memory-headroom", h, "a fraction in [0, 1)"))
            }
            Some(h) => h,
            None => 0.1,
        };
        let runtime_reserve_bytes = match a.f64("--runtime-reserve-gib")? {
            Some(g) if !(g >= 0.0 && g.is_finite()) => return Err(Error::flag("--runtime-reserve-gib", g, "GiB >= 0")),
            Some(g) => g * GIB,
            None => RUNTIME_RESERVE_GIB * GIB,
        };
        let pins = Pins {
            tp: positive(a, "--tensor-model-parallel-size")?,
            pp: positive(a, "--pipeline-model-parallel-size")?,
            micro_batch: positive(a, "--micro-batch-size")?,
            vpp: positive(a, "--num-virtual-stages-per-pipeline-rank")?,
            recompute: a
                .str("--recompute-granularity")
                .map(|s| {
                    Recompute::parse(s).map_err(|_| {
                        Error::flag("--recompute-granularity", format!("'{s}'"), "none, selective or full")
                    })
                })
                .transpose()?,
            zero1: zero1(a)?,
            shard_grads: a.str("--data-parallel-sharding-strategy").map(|s| s.starts_with("optim_grads")),
            tp_mode: match a.str("--tensor-parallel-mode") {
                None => None,
                Some("1d") => Some("1d"),
                Some("2d") => Some("2d"),
                Some("2.5d") => Some("2.5d"),
                Some(other) => {
                    return Err(Error::flag("--tensor-parallel-mode", format!("'{other}'"), "1d, 2d or 2.5d"))
                }
            },
            depth: positive(a, "--tesseract-depth")?,
            cp: positive(a, "--context-parallel-size")?,
            cp_ring: match a.str("--cp-comm-type") {
                None => None,
                Some("a2a") => Some(false),
                Some("p2p") => Some(true),
                Some(other) => return Err(Error::flag("--cp-comm-type", format!("'{other}'"), "a2a or p2p")),
            },
            schedule: a
                .str("--pipeline-schedule")
                .filter(|&s| s != "megatron")
                .map(|s| Schedule::parse(s).map(|sc| (sc, s == "interleaved-1f1b")))
                .transpose()?,
            megatron_schedules: a.str("--pipeline-schedule") == Some("megatron"),
        };
        let features = features(a)?;
        if let Some(cp) = pins.cp.filter(|&c| c > 1) {
            if !shape.seq_length.is_multiple_of(2 * cp) {
                return Err(Error::Config(format!(
                    "--context-parallel-size {cp}: the sequence {} does not split into 2 x {cp} chunks (Megatron's \
                     load-balanced causal split)",
                    shape.seq_length
                )));
            }
            if !features.flash_attention {
                return Err(Error::Config(format!(
                    "--context-parallel-size {cp} needs flash attention (--attention-backend flash)"
                )));
            }
        }
        match (pins.schedule, pins.vpp) {
            (Some((s, _)), Some(v)) if s.fixed_chunks().is_some_and(|f| f != v) => {
                return Err(Error::Config(format!(
                    "--pipeline-schedule {} runs {} per pipeline rank, not \
                     --num-virtual-stages-per-pipeline-rank {v}",
                    a.str("--pipeline-schedule").unwrap_or_default(),
                    super::chunk_count(s.fixed_chunks().unwrap_or(1))
                )))
            }
            (Some((Schedule::OneF1B, true)), Some(1)) => {
                return Err(Error::Config(
                    "--pipeline-schedule interleaved-1f1b needs --num-virtual-stages-per-pipeline-rank 2 or more"
                        .into(),
                ))
            }
            _ => {}
        }
        Ok(Request {
            model_name,
            shape,
            gpus,
            global_batch,
            machine,
            precision,
            memory_headroom,
            runtime_reserve_bytes,
            sequence_parallel: a.has("--sequence-parallel"),
            features,
            pins,
        })
    }
}

/// The GPU of `--gpu` or `--hardware`, with the figures the flags override, then calibrated
/// (`--calibrate FILE`) and the efficiencies the flags set.
fn machine_from_args(a: &Args, precision: Precision) -> Result<Machine> {
    let mut m = match (a.str("--gpu"), a.path("--hardware")) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage(
                "--gpu and --hardware are alternatives (a hardware file can start from a named GPU: \"base\")".into(),
            ))
        }
        (_, Some(file)) => from_file(&file)?,
        (gpu, None) => machine(gpu.unwrap_or("a100"))?,
    };
    if let Some(g) = positive(a, "--gpus-per-node")? {
        m.gpus_per_node = g;
    }
    if let Some(p) = positive_f64(a, "--peak-tflops")? {
        match precision {
            Precision::Fp32 => m.peak_fp32_flops = p * 1e12,
            _ => m.peak_16bit_flops = p * 1e12,
        }
    }
    if let Some(bw) = positive_f64(a, "--hbm-bandwidth")? {
        m.hbm_bytes_per_s = bw * 1e9;
    }
    if let Some(gib) = positive_f64(a, "--memory-gib")? {
        m.memory_bytes = gib * GIB;
    }
    if let Some(bw) = positive_f64(a, "--intra-node-bandwidth")? {
        m.intra.bytes_per_s = bw * 1e9;
    }
    if let Some(bw) = positive_f64(a, "--inter-node-bandwidth")? {
        m.inter.bytes_per_s = bw * 1e9;
    }
    for (name, link) in [("--intra-node-latency-us", &mut m.intra), ("--inter-node-latency-us", &mut m.inter)] {
        match a.f64(name)? {
            Some(us) if us < 0.0 => return Err(Error::flag(name, us, "a latency >= 0")),
            Some(us) => link.latency_s = us * 1e-6,
            None => {}
        }
    }
    if let Some(file) = a.path("--calibrate") {
        let peak = m.peak_16bit_flops;
        super::efficiency::calibrate(&file, peak, &mut m.efficiency)?;
    }
    for (name, slot) in
        [("--gemm-efficiency", &mut m.efficiency.gemm_max), ("--attention-efficiency", &mut m.efficiency.attention)]
    {
        if let Some(e) = a.f64(name)? {
            if !(e > 0.0 && e <= 1.0) {
                return Err(Error::flag(name, e, "a fraction in (0, 1]"));
            }
            *slot = e;
            m.efficiency.source = format!("{} (set by {name})", m.efficiency.source);
        }
    }
    Ok(m)
}

/// The kernels and overlaps to price (`Features`).
fn features(a: &Args) -> Result<Features> {
    let flash_attention =
        match a.str("--attention-backend").unwrap_or("flash") {
            "flash" | "fused" | "auto" => true,
            "unfused" | "local" => false,
            other => return Err(Error::flag(
                "--attention-backend",
                format!("'{other}'"),
                "flash (or fused, auto: flash-class kernels) or unfused (or local: Megatron 2021's, scores in memory)",
            )),
        };
    Ok(Features {
        flash_attention,
        tp_comm_overlap: a.has("--tp-comm-overlap"),
        overlap_grad_reduce: a.has("--overlap-grad-reduce"),
        overlap_param_gather: a.has("--overlap-param-gather"),
        shard_params: a.str("--data-parallel-sharding-strategy") == Some("optim_grads_params"),
    })
}

/// The ZeRO-1 pin: `--zero1 on|off`, or what `--data-parallel-sharding-strategy` implies
/// (`no_shard` off; `optim`, `optim_grads`, `optim_grads_params` on); the two must agree.
fn zero1(a: &Args) -> Result<Option<bool>> {
    let flag = match a.str("--zero1") {
        None => None,
        Some("on") => Some(true),
        Some("off") => Some(false),
        Some(other) => return Err(Error::flag("--zero1", format!("'{other}'"), "on or off")),
    };
    let strategy = match a.str("--data-parallel-sharding-strategy") {
        None => None,
        Some("no_shard") => Some(false),
        Some("optim" | "optim_grads" | "optim_grads_params") => Some(true),
        Some(other) => {
            return Err(Error::flag(
                "--data-parallel-sharding-strategy",
                format!("'{other}'"),
                "no_shard, optim (ZeRO-1), optim_grads (ZeRO-2) or optim_grads_params (ZeRO-3 / FSDP)",
            ))
        }
    };
    match (flag, strategy) {
        (Some(f), Some(s)) if f != s => Err(Error::Config(format!(
            "--zero1 {} contradicts --data-parallel-sharding-strategy {}",
            if f { "on" } else { "off" },
            a.str("--data-parallel-sharding-strategy").unwrap_or_default()
        ))),
        _ => Ok(flag.or(strategy)),
    }
}
