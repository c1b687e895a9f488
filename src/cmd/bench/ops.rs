//! `trident bench attention|layernorm|step` (and the record format shared with `bench gemm`):
//! each measurement is validated or self-consistent, timed over repeats, and reported beside the
//! peak measured in the same run (the FMA peak for compute, a triad bandwidth for memory), as a
//! table or as JSON lines with `--json`.

use crate::config::preset;
use crate::device::cpu::gemm::{gemm, MatRef};
use crate::device::cpu::peak::Peak;
use crate::device::cpu::pool::ThreadPool;
use crate::device::cpu::CpuDevice;
use crate::device::{AttentionShape, Device};
use crate::error::Result;
use crate::model::{Gpt, GptConfig};
use crate::optim::{AdamW, AdamWConfig};
use crate::parallel::tensor::TensorParallel;
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
            "{{\"bench\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", \"threads\": {}, \"achieved\": {:.3}, \"unit\": \"{}\", \
             \"peak\": {:.3}, \"ratio\": {:.4}, \"ms\": {:.4}, \"note\": \"{}\"}}",
            self.bench,
            self.shape,
            self.dtype,
            self.threads,
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
        ("tiny b16 s128 h4 d32", AttentionShape { batch: 16, seq: 128, heads: 4, head_dim: 32 }),
        ("gpt2-124m b1 s1024 h12 d64", AttentionShape { batch: 1, seq: 1024, heads: 12, head_dim: 64 }),
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
        let fwd = time_best(min_seconds, &mut || dev.attention_forward(&mut o, &mut lse, &qkv, shape));
        let bwd = time_best(min_seconds, &mut || dev.attention_backward(&mut dqkv, &dout, &qkv, &o, &lse, shape));
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
    let fwd =
        time_best(min_seconds, &mut || dev.layernorm_forward(&mut y, &mut mean, &mut rstd, &x, &w, &b, rows, cols));
    let (mut dx, mut dw, mut db) = (dev.alloc(n), dev.alloc(cols), dev.alloc(cols));
    let bwd = time_best(min_seconds, &mut || {
        dev.layernorm_backward(&mut dx, &mut dw, &mut db, &y, &x, &w, &mean, &rstd, rows, cols)
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

/// One training step (forward, backward, AdamW) of a preset's model on synthetic tokens, as MFU:
/// Megatron's model FLOPs over the measured FMA peak.
#[allow(clippy::too_many_arguments)]
pub fn step(
    dev: &CpuDevice,
    peak: &Peak,
    preset_name: &str,
    micro_batch: usize,
    seq: usize,
    vocab: usize,
    precision: crate::real::Precision,
    min_seconds: f64,
) -> Result<Vec<Record>> {
    let p = preset(preset_name)?;
    let cfg = GptConfig {
        num_layers: p.num_layers,
        hidden_size: p.hidden_size,
        num_attention_heads: p.num_attention_heads,
        ffn_hidden_size: 4 * p.hidden_size,
        max_position_embeddings: p.max_position_embeddings.max(seq),
        vocab_size: vocab,
        padded_vocab_size: GptConfig::pad_vocab(vocab, 128),
        init_method_std: 0.02,
    };
    cfg.validate()?;
    let mut model = Gpt::new(dev, cfg.clone(), 1234);
    dev.set_matmul_precision(precision);
    model.set_precision(dev, precision);
    let mut opt = AdamW::new(dev, &model.params, AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 });
    let tokens: Vec<u32> = (0..micro_batch * seq).map(|i| (i * 31 % 256) as u32).collect();
    let labels: Vec<u32> = (0..micro_batch * seq).map(|i| (i * 17 % 256) as u32).collect();
    let scale = 1.0 / (micro_batch * seq) as f32;
    let secs = time_best(min_seconds, &mut || {
        model.params.zero_grads(dev);
        model.forward_backward(
            dev,
            TensorParallel::single(),
            &tokens,
            &labels,
            micro_batch,
            seq,
            scale,
            &mut |_, _| {},
        );
        opt.step(dev, &mut model.params, 1e-4, 1.0);
        model.refresh_working_weights(dev);
    });
    dev.set_matmul_precision(crate::real::Precision::F32);
    let flops = cfg.flops_per_iteration(micro_batch, seq);
    Ok(vec![Record {
        bench: "step",
        shape: format!("{preset_name} mb{micro_batch} s{seq} V{}", cfg.padded_vocab_size),
        dtype: match precision {
            crate::real::Precision::F32 => "f32",
            crate::real::Precision::Bf16 => "bf16",
            crate::real::Precision::F16 => "fp16",
        },
        threads: dev.pool().threads(),
        achieved: flops / secs / 1e9,
        unit: "GFLOP/s",
        peak: peak.gflops,
        ms: 1e3 * secs,
        note: format!("{:.0} tokens/s; MFU is the ratio", (micro_batch * seq) as f64 / secs),
    }])
}
