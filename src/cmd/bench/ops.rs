//! `trident bench attention|layernorm|step` (and the record format shared with `bench gemm`):
//! each measurement is validated or self-consistent, timed over repeats, and reported beside the
//! peak measured in the same run (the FMA peak for compute, a triad bandwidth for memory), as a
//! table or as JSON lines with `--json`. Also what `bench step` shares with its GPU twin
//! (`gpu_step.rs`): the model (`StepModel`) and the step itself (`train_step`).

use crate::comm::SelfComm;
use crate::config::preset;
use crate::device::cpu::gemm::{gemm, MatRef};
use crate::device::cpu::isa;
use crate::device::cpu::peak::{measure_fma_peak, Peak};
use crate::device::cpu::pool::ThreadPool;
use crate::device::cpu::CpuDevice;
use crate::device::prelude::*;
use crate::device::{AttentionShape, Device};
use crate::device::{LayerNormSaved, Matrix};
use crate::error::Result;
use crate::model::{Gpt, GptConfig};
use crate::optim::{AdamW, AdamWConfig};
use crate::parallel::data::global_grad_sum_squares;
use crate::parallel::tensor::TensorParallel;
use crate::real::Precision;
use std::time::Instant;

/// One measurement, as printed and as written with `--json`.
#[derive(Clone, Debug)]
pub struct Record {
    pub bench: &'static str,
    pub shape: String,
    pub dtype: &'static str,
    pub threads: usize,
    pub achieved: f64,
    pub unit: &'static str,
    pub peak: f64,
    pub ms: f64,
    /// Anything else worth a column (memory held, the GEMM rate compared with).
    pub note: String,
}

impl Record {
    pub fn ratio(&self) -> f64 {
        self.achieved / self.peak
    }

    pub fn json(&self) -> String {
        format!(
            "{{\"bench\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", \"threads\": {}, \"cpu\": {}, \"isa\": \"{}\", \
             \"achieved\": {:.3}, \"unit\": \"{}\", \"peak\": {:.3}, \"ratio\": {:.4}, \"ms\": {:.4}, \"note\": \"{}\"}}",
            self.bench,
            self.shape,
            self.dtype,
            self.threads,
            crate::data::json::quote(&isa::cpu_model().unwrap_or_else(|| "model unknown".into())),
            isa::active().name(),
            self.achieved,
            self.unit,
            self.peak,
            self.ratio(),
            self.ms,
            self.note
        )
    }
}

pub fn print_records(records: &[Record], json: bool) {
    if json {
        for r in records {
            println!("{}", r.json());
        }
        return;
    }
    println!(
        "cpu: {}, instruction set {}{}",
        isa::cpu_model().unwrap_or_else(|| "model unknown".into()),
        isa::active().name(),
        match records.iter().any(|r| r.dtype == "bf16") {
            true => format!(", bf16 gemm kernel {}", crate::device::cpu::gemm_bf16::choose::chosen().describe()),
            false => String::new(),
        }
    );
    println!(
        "{:<10} {:<34} {:>5} {:>7} {:>12} {:<7} {:>10} {:>7} {:>10}  note",
        "bench", "shape", "dtype", "threads", "achieved", "unit", "peak", "ratio", "ms"
    );
    for r in records {
        println!(
            "{:<10} {:<34} {:>5} {:>7} {:>12.2} {:<7} {:>10.2} {:>6.1}% {:>10.3}  {}",
            r.bench,
            r.shape,
            r.dtype,
            r.threads,
            r.achieved,
            r.unit,
            r.peak,
            100.0 * r.ratio(),
            r.ms,
            r.note
        );
    }
}

/// Best mean seconds per call of `f` over a few repeats of at least `min_seconds` each.
fn time_best(min_seconds: f64, f: &mut dyn FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        let mut calls = 0u32;
        while calls == 0 || start.elapsed().as_secs_f64() < min_seconds {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / calls as f64);
    }
    best
}

/// Memory bandwidth of a triad `a = b + s c` over arrays far larger than the caches, in GB/s (the
/// peak the memory-bound benchmarks are compared with).
pub fn triad_bandwidth(pool: &ThreadPool, min_seconds: f64) -> f64 {
    const N: usize = 1 << 24; // 64 MiB per array
    let mut a = vec![0f32; N];
    let b = vec![1f32; N];
    let c = vec![2f32; N];
    let chunk = N / 64;
    let ptr = a.as_mut_ptr() as usize;
    let secs = time_best(min_seconds, &mut || {
        pool.run(64, &|i| {
            // SAFETY: task i writes only its own chunk of `a`.
            let out = unsafe { std::slice::from_raw_parts_mut((ptr as *mut f32).add(i * chunk), chunk) };
            for ((o, &x), &y) in out.iter_mut().zip(&b[i * chunk..]).zip(&c[i * chunk..]) {
                *o = x + 1.5 * y;
            }
        })
    });
    std::hint::black_box(&a);
    3.0 * 4.0 * N as f64 / secs / 1e9
}

fn gemm_rate(pool: &ThreadPool, min_seconds: f64) -> f64 {
    let n = 1024;
    let a = vec![1f32; n * n];
    let b = vec![1f32; n * n];
    let mut c = vec![0f32; n * n];
    let secs = time_best(min_seconds, &mut || {
        gemm(
            pool,
            n,
            n,
            n,
            MatRef { data: &a, row_stride: n, col_stride: 1 },
            MatRef { data: &b, row_stride: 1, col_stride: n },
            &mut c,
            n,
            false,
        )
    });
    2.0 * (n * n * n) as f64 / secs / 1e9
}

/// Causal attention forward and backward on the shapes of the presets; FLOPs as FlashAttention
/// counts them (forward 4 s^2 d per head, backward 2.5x, halved for causal masking).
pub fn attention(dev: &CpuDevice, peak: &Peak, min_seconds: f64) -> Vec<Record> {
    const MIB: f64 = 1048576.0;
    let gemm_gflops = gemm_rate(dev.pool(), min_seconds);
    let shapes = [
        ("tiny b16 s128 h4 d32", AttentionShape::new(16, 128, 4, 32)),
        ("gpt2-124m b1 s1024 h12 d64", AttentionShape::new(1, 1024, 12, 64)),
    ];
    let mut out = Vec::new();
    for (name, shape) in shapes {
        let (rows, width) = (shape.rows(), shape.width());
        let mut qkv = dev.alloc(3 * rows * width);
        dev.upload(
            &mut qkv,
            &(0..3 * rows * width).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.5).collect::<Vec<_>>(),
        );
        let (mut o, mut lse, mut dqkv) =
            (dev.alloc(rows * width), dev.alloc(rows * shape.heads), dev.alloc(3 * rows * width));
        let dout = o.clone();
        let held = 4 * (dev.len(&qkv) + dev.len(&o) + dev.len(&lse) + dev.len(&dqkv) + dev.len(&dout));
        let fwd = time_best(min_seconds, &mut || dev.attention_forward(&mut o, &mut lse, &qkv, shape, None, None));
        let bwd =
            time_best(min_seconds, &mut || dev.attention_backward(&mut dqkv, &dout, &qkv, &o, &lse, shape, None, None));
        let s = shape.seq as f64;
        let flops_fwd = 4.0 * s * s * shape.head_dim as f64 * (shape.batch * shape.heads) as f64 / 2.0;
        let achieved = 3.5 * flops_fwd / (fwd + bwd) / 1e9;
        out.push(Record {
            bench: "attention",
            shape: name.to_string(),
            dtype: "f32",
            threads: dev.pool().threads(),
            achieved,
            unit: "GFLOP/s",
            peak: peak.gflops,
            ms: 1e3 * (fwd + bwd),
            note: format!(
                "fwd+bwd; {:.0}% of the 1024^3 GEMM rate ({gemm_gflops:.0} GFLOP/s); tensors {:.1} MiB + scratch {:.1} MiB \
                 (the s x s score matrices would be {:.1} MiB)",
                100.0 * achieved / gemm_gflops,
                held as f64 / MIB,
                crate::device::cpu::attention::scratch_bytes(&shape, dev.pool().threads()) as f64 / MIB,
                (4 * shape.seq * shape.seq * shape.batch * shape.heads) as f64 / MIB
            ),
        });
    }
    out
}

/// LayerNorm forward and backward over a gpt2-124m activation (4096 rows x 768), in GB/s of
/// compulsory traffic (forward: read x, write y; backward: read dy and x, read and write dx).
pub fn layernorm(dev: &CpuDevice, bandwidth: f64, min_seconds: f64) -> Vec<Record> {
    let (rows, cols) = (4096, 768);
    let n = rows * cols;
    let mut x = dev.alloc(n);
    dev.upload(&mut x, &(0..n).map(|i| (i % 97) as f32 / 97.0).collect::<Vec<_>>());
    let mut w = dev.alloc(cols);
    dev.fill(&mut w, 1.0);
    let b = dev.alloc(cols);
    let (mut y, mut mean, mut rstd) = (dev.alloc(n), dev.alloc(rows), dev.alloc(rows));
    let fwd = time_best(min_seconds, &mut || {
        dev.layernorm_forward(&mut y, (&mut mean, &mut rstd), &x, (&w, &b), Matrix { rows, cols })
    });
    let (mut dx, mut dw, mut db) = (dev.alloc(n), dev.alloc(cols), dev.alloc(cols));
    let bwd = time_best(min_seconds, &mut || {
        dev.layernorm_backward(
            &mut dx,
            (&mut dw, &mut db),
            &y,
            LayerNormSaved { inp: &x, weight: &w, mean: &mean, rstd: &rstd },
            Matrix { rows, cols },
        )
    });
    let gbs = |bytes: f64, secs: f64| bytes / secs / 1e9;
    let shape = format!("{rows} x {cols}");
    let threads = dev.pool().threads();
    vec![
        Record {
            bench: "layernorm",
            shape: shape.clone(),
            dtype: "f32",
            threads,
            achieved: gbs(8.0 * n as f64, fwd),
            unit: "GB/s",
            peak: bandwidth,
            ms: 1e3 * fwd,
            note: "forward".into(),
        },
        Record {
            bench: "layernorm",
            shape,
            dtype: "f32",
            threads,
            achieved: gbs(16.0 * n as f64, bwd),
            unit: "GB/s",
            peak: bandwidth,
            ms: 1e3 * bwd,
            note: "backward".into(),
        },
    ]
}

/// The model `bench step` trains: a preset, with `--num-layers`, `--hidden-size` and
/// `--num-attention-heads` overriding its shape, and one micro-batch of synthetic tokens.
#[derive(Clone, Debug)]
pub struct StepModel {
    /// How the records name it: the preset and what was overridden, the batch, the padded vocabulary.
    pub name: String,
    pub cfg: GptConfig,
    pub micro_batch: usize,
    pub seq: usize,
}

/// What sets a `StepModel`: the preset's name, the overrides of its shape, the micro-batch size,
/// the sequence length and the vocabulary.
pub struct StepFlags<'a> {
    pub preset: &'a str,
    pub num_layers: Option<usize>,
    pub hidden_size: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_query_groups: Option<usize>,
    pub ffn_hidden_size: Option<usize>,
    pub micro_batch: usize,
    pub seq: usize,
    pub vocab: usize,
}

impl StepModel {
    /// The preset with its overrides, checked as training checks a model.
    pub fn new(f: &StepFlags) -> Result<StepModel> {
        let p = preset(f.preset)?;
        let (layers, hidden) = (f.num_layers.unwrap_or(p.num_layers), f.hidden_size.unwrap_or(p.hidden_size));
        let heads = f.num_attention_heads.unwrap_or(p.num_attention_heads);
        // The preset's MLP width and architecture (a Llama's SwiGLU width follows Megatron's
        // default where the hidden size is overridden).
        let ffn = match (f.ffn_hidden_size, p.ffn_hidden_size, f.hidden_size) {
            (Some(w), _, _) | (None, Some(w), None) => w,
            _ if p.arch.swiglu => 4 * hidden * 2 / 3 / 64 * 64,
            _ => 4 * hidden,
        };
        let arch =
            crate::model::Arch { num_query_groups: f.num_query_groups.or(p.arch.num_query_groups), ..p.arch.clone() };
        let cfg = GptConfig {
            num_layers: layers,
            hidden_size: hidden,
            num_attention_heads: heads,
            ffn_hidden_size: ffn,
            max_position_embeddings: p.max_position_embeddings.max(f.seq),
            vocab_size: f.vocab,
            padded_vocab_size: GptConfig::pad_vocab(f.vocab, 128),
            init_method_std: 0.02,
            arch,
        };
        cfg.validate()?;
        let overrides: String = [
            (f.num_layers, 'L'),
            (f.hidden_size, 'h'),
            (f.num_attention_heads, 'a'),
            (f.num_query_groups, 'g'),
            (f.ffn_hidden_size, 'f'),
        ]
        .iter()
        .filter_map(|&(v, tag)| v.map(|v| format!(" {tag}{v}")))
        .collect();
        let name = format!("{}{overrides} mb{} s{} V{}", f.preset, f.micro_batch, f.seq, cfg.padded_vocab_size);
        Ok(StepModel { name, cfg, micro_batch: f.micro_batch, seq: f.seq })
    }

    /// The synthetic micro-batch every step trains on: token ids and their labels.
    pub fn batch(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.micro_batch * self.seq;
        ((0..n).map(|i| (i * 31 % 256) as u32).collect(), (0..n).map(|i| (i * 17 % 256) as u32).collect())
    }

    /// Megatron's model FLOPs of one step.
    pub fn flops(&self) -> f64 {
        self.cfg.flops_per_iteration(self.micro_batch, self.seq)
    }
}

/// The optimizer every `bench step` runs (GPT-2's AdamW settings, as the presets train).
pub const STEP_ADAMW: AdamWConfig =
    AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, decoupled_lr: None };

/// One training step as `train` runs it on one rank: gradients zeroed, forward and backward of
/// one micro-batch (`tokens`, `labels`), the global gradient norm (its squares summed on the
/// device in `norm[0]`) and Megatron's clip at 1.0 (norm and factor into `norm[1]`, on the
/// device), AdamW writing the mixed-precision working weights. Returns the micro-batch's summed
/// token loss, the step's one read of the device.
pub fn train_step<D: Device>(
    dev: &D,
    (model, opt, norm): (&mut Gpt<D>, &mut AdamW<D>, &mut [D::Scalars; 2]),
    (tokens, labels): (&[u32], &[u32]),
    (micro_batch, seq): (usize, usize),
) -> f64 {
    model.params.zero_grads(dev);
    let scale = 1.0 / (micro_batch * seq) as f32;
    let tp = TensorParallel::single();
    let loss = model.forward_backward(dev, tp, tokens, labels, micro_batch, seq, scale, &mut |_, _| {});
    let [sum, clip] = norm;
    global_grad_sum_squares(dev, &[&model.params], 0, true, &SelfComm, sum);
    dev.clip_scale(sum, 0, clip, 0, 1.0, 1.0);
    let (params, working) = model.params_and_working();
    opt.step(dev, params, working, 1e-4, (clip, 1));
    loss
}

/// A model set up to train `bench step`'s synthetic steps at one precision.
struct StepRun {
    model: Gpt<CpuDevice>,
    opt: AdamW<CpuDevice>,
    norm: [<CpuDevice as Memory>::Scalars; 2],
    precision: Precision,
}

impl StepRun {
    fn new(dev: &CpuDevice, m: &StepModel, precision: Precision) -> StepRun {
        let mut model = Gpt::new(dev, m.cfg.clone(), 1234);
        dev.set_matmul_precision(precision);
        model.set_precision(dev, precision);
        let opt = AdamW::new(dev, &model.params, STEP_ADAMW);
        StepRun { model, opt, norm: [dev.scalars(1), dev.scalars(2)], precision }
    }

    /// One `train_step`, the device's GEMMs set to this run's precision.
    fn step(&mut self, dev: &CpuDevice, m: &StepModel, (tokens, labels): (&[u32], &[u32])) {
        dev.set_matmul_precision(self.precision);
        let run = (&mut self.model, &mut self.opt, &mut self.norm);
        train_step(dev, run, (tokens, labels), (m.micro_batch, m.seq));
    }
}

/// `--dtype`'s name of a precision.
fn dtype_name(precision: Precision) -> &'static str {
    match precision {
        Precision::F32 => "f32",
        Precision::Bf16 => "bf16",
        Precision::F16 => "fp16",
    }
}

/// The record of one precision's step, `secs` a step, its MFU against the higher of `peak` and
/// `peak_after`.
fn step_record(
    m: &StepModel,
    (dev, peak, peak_after): (&CpuDevice, &Peak, &Peak),
    precision: Precision,
    secs: f64,
    note: &str,
) -> Record {
    Record {
        bench: "step",
        shape: m.name.clone(),
        dtype: dtype_name(precision),
        threads: dev.pool().threads(),
        achieved: m.flops() / secs / 1e9,
        unit: "GFLOP/s",
        peak: peak.gflops.max(peak_after.gflops),
        ms: 1e3 * secs,
        note: format!(
            "{:.0} tokens/s; {note}{}MFU is the ratio (peak {:.1} before, {:.1} after)",
            (m.micro_batch * m.seq) as f64 / secs,
            match precision {
                Precision::Bf16 =>
                    format!("bf16 gemm kernel {}; ", crate::device::cpu::gemm_bf16::best_bf16_kernel().name()),
                _ => String::new(),
            },
            peak.gflops,
            peak_after.gflops
        ),
    }
}

/// One training step (`train_step`) of a model on synthetic tokens, as MFU: Megatron's model
/// FLOPs over the measured FMA peak, the higher of `peak` (measured at start-up) and a second
/// measurement right after the timed steps. The best step time goes with the best peak: on a
/// shared machine whose speed drifts between the two, one measurement alone can put the ratio
/// anywhere, even above 1.
pub fn step(
    dev: &CpuDevice,
    peak: &Peak,
    m: &StepModel,
    precision: Precision,
    min_seconds: f64,
) -> Result<Vec<Record>> {
    let mut run = StepRun::new(dev, m, precision);
    let (tokens, labels) = m.batch();
    let secs = time_best(min_seconds, &mut || run.step(dev, m, (&tokens, &labels)));
    let peak_after = measure_fma_peak(dev.pool(), 300);
    dev.set_matmul_precision(Precision::F32);
    Ok(vec![step_record(m, (dev, peak, &peak_after), precision, secs, "")])
}

/// `bench step --dtype A,B`: the two precisions' steps interleaved one by one (A B, then B A, so
/// that a drift of the machine's speed falls on both alike), each for at least `min_seconds`
/// and three pairs. Records each precision's median step, and the ratio of B's step time to A's
/// (the median over the adjacent pairs, with its quartiles): on a shared machine whose speed
/// moves by more than the difference, timing A and B in separate runs cannot show it.
pub fn step_pair(
    dev: &CpuDevice,
    peak: &Peak,
    m: &StepModel,
    [a, b]: [Precision; 2],
    min_seconds: f64,
) -> Result<Vec<Record>> {
    let mut runs = [StepRun::new(dev, m, a), StepRun::new(dev, m, b)];
    let (tokens, labels) = m.batch();
    let mut secs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for run in runs.iter_mut() {
        run.step(dev, m, (&tokens, &labels));
    }
    while secs[0].len() < 3 || secs.iter().any(|s| s.iter().sum::<f64>() < min_seconds) {
        let order = if secs[0].len().is_multiple_of(2) { [0, 1] } else { [1, 0] };
        for k in order {
            let start = Instant::now();
            runs[k].step(dev, m, (&tokens, &labels));
            secs[k].push(start.elapsed().as_secs_f64());
        }
    }
    let peak_after = measure_fma_peak(dev.pool(), 300);
    dev.set_matmul_precision(Precision::F32);
    let pairs = secs[0].len();
    let ratios: Vec<f64> = secs[1].iter().zip(&secs[0]).map(|(tb, ta)| tb / ta).collect();
    let (r25, r50, r75) = quartiles(&ratios);
    let median = |s: &[f64]| quartiles(s).1;
    let context = (dev, peak, &peak_after);
    let interleaved = |with: Precision| format!("median of {pairs} steps interleaved with {}'s; ", dtype_name(with));
    let mut out = vec![
        step_record(m, context, a, median(&secs[0]), &interleaved(b)),
        step_record(m, context, b, median(&secs[1]), &interleaved(a)),
    ];
    out.push(Record {
        bench: "step",
        shape: format!("{} {}/{}", m.name, dtype_name(b), dtype_name(a)),
        dtype: dtype_name(b),
        threads: dev.pool().threads(),
        achieved: r50,
        unit: "x",
        peak: 1.0,
        ms: 1e3 * median(&secs[1]),
        note: format!(
            "{b_name} step time over {a_name}'s, adjacent pairs: median {r50:.3}, quartiles {r25:.3}-{r75:.3} of {pairs}",
            b_name = dtype_name(b),
            a_name = dtype_name(a)
        ),
    });
    Ok(out)
}

/// The lower quartile, median and upper quartile of `xs` (not empty), by the nearest rank.
fn quartiles(xs: &[f64]) -> (f64, f64, f64) {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

/// `bench generate`: the time of one new token at position `m.seq` of one sequence, with the
/// key/value cache (`Gpt::decode` of one position, the cache rolled back to `seq - 1` positions
/// each time) and without it (the whole context's forward), and the ratio of the two.
pub fn generate(dev: &CpuDevice, m: &StepModel, min_seconds: f64) -> Vec<Record> {
    let mut model = Gpt::new(dev, m.cfg.clone(), 1234);
    let (tokens, _) = m.batch();
    let context = &tokens[..m.seq];
    let mut cache = model.kv_cache(dev);
    model.decode(dev, &mut cache, &context[..m.seq - 1]);
    let cached = time_best(min_seconds, &mut || {
        cache.truncate(m.seq - 1);
        model.decode(dev, &mut cache, &context[m.seq - 1..]);
    });
    let whole = time_best(min_seconds, &mut || {
        model.forward(dev, TensorParallel::single(), context, 1, m.seq);
    });
    let record = |what: &str, secs: f64| Record {
        bench: "generate",
        shape: format!("{} {what}", m.name),
        dtype: "f32",
        threads: dev.pool().threads(),
        achieved: 1.0 / secs,
        unit: "tokens/s",
        peak: 1.0 / cached,
        ms: 1e3 * secs,
        note: format!("token at position {}; ratio: against the cache", m.seq),
    };
    vec![record("kv-cache", cached), record("recompute", whole)]
}
