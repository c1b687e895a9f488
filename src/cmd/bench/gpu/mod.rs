//! `trident bench gemm|gemm-bwd|attention|layernorm|gelu|xent|embedding --device cuda|hip`: the GPU
//! kernels timed on one GPU, reported as TFLOP/s or GB/s and as a fraction of the device's
//! datasheet peak (`gpu::peaks`; AMD devices have none there), in the records (`GpuRecord`) that
//! the all-reduce and step benches print too.
//!
//! The kernel benches (`run`) open device 0 of either vendor (`gpu::open::OpenGpu`: the vendor's
//! `GpuRuntime` and its kernel images, precompiled or compiled through the disk cache) and
//! resolve the kernels of the index their bench launches (`GpuBench::kernels`). With the GPU
//! Device's (`gpu::device::DEVICE_KERNELS`) that is every kernel of the index: the fused
//! LayerNorm, GELU, cross-entropy and embedding kernels training does not launch yet, the
//! bf16-output GEMMs (forward and backward-input; on compute capability 9.0 the sm_90a wgmma
//! ones) run here (a unit test below holds it). Each launch takes the geometry `kernels::plan` gives; it runs once on
//! deterministic bf16 inputs and its outputs are compared with the reference device (f64) on the
//! same values where that is cheap (docs/design.md's bf16 rule for bf16 outputs, a few f32 roundings
//! for f32 ones; the GEMM spot-checks 64 outputs, llm.c's tolerance), then it is timed over a
//! warm-up and enough launches to fill `--min-seconds` (CUDA events on CUDA, the host clock
//! around a synchronize on HIP). Memory-bound kernels report the bytes they move per second
//! against the HBM peak, GEMM and attention their FLOPs against the dense bf16 peak.
//!
//! `bench allreduce --device cuda|hip` is `gpu_allreduce.rs`; its records are this file's `GpuRecord`.

use crate::comm::Bf16;
use crate::device::prelude::*;
use crate::device::reference::ReferenceDevice;
use crate::device::{AttentionShape, Gelu, LayerNormSaved, Logits, Matrix, Tokens};
use crate::error::{Error, Result};
use crate::gpu::buffer::DeviceMem;
use crate::gpu::hip::Hip;
use crate::gpu::kernels::plan::{
    column_sum_partials, kernel_of, layernorm_bwd_partials, linear_gemms, plan, wgmma, EmbeddingSegments, GemmOut,
    KernelLaunch, Op, COLUMN_SUM_COUNTERS, LAYERNORM_BWD_COUNTERS,
};
use crate::gpu::kernels::{args, Kernel, Launch, Storage, Vendor};
use crate::gpu::open::{Functions, OpenGpu};
use crate::gpu::peaks::{self, Peak};
use crate::gpu::runtime::Arg;

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRecord {
    pub bench: &'static str,
    /// "cuda" or "hip".
    pub device_kind: &'static str,
    pub shape: String,
    pub dtype: &'static str,
    pub device: String,
    pub achieved: f64,
    /// "TFLOP/s" or "GB/s" (bus bandwidth).
    pub unit: &'static str,
    /// The datasheet peak in `unit`, when the device is in the table.
    pub peak: Option<f64>,
    pub ms: f64,
    pub note: String,
}

impl GpuRecord {
    pub fn fraction(&self) -> Option<f64> {
        self.peak.filter(|p| *p > 0.0).map(|p| self.achieved / p)
    }

    /// One JSON object; an unknown peak and fraction are `null`.
    pub fn json(&self) -> String {
        format!("{{{}}}", self.json_fields())
    }

    /// The fields of `json`, without its braces (for a record that adds more). `achieved` and `ms`
    /// are written in full (the shortest text that reads back as the same f64), so that a program
    /// comparing records (`make gpu-bench`) keeps the emulator's tiny rates and a GPU's microseconds.
    pub fn json_fields(&self) -> String {
        let opt = |v: Option<f64>, digits: usize| v.map_or("null".to_string(), |v| format!("{v:.digits$}"));
        format!(
            "\"bench\": \"{}\", \"device_kind\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", \"device\": \"{}\", \
             \"achieved\": {}, \"unit\": \"{}\", \"peak\": {}, \"ratio\": {}, \"ms\": {}, \"note\": \"{}\"",
            self.bench,
            self.device_kind,
            self.shape,
            self.dtype,
            self.device.replace('"', "'"),
            self.achieved,
            self.unit,
            opt(self.peak, 1),
            opt(self.fraction(), 4),
            self.ms,
            self.note.replace('"', "'")
        )
    }
}

/// The table (or JSON lines) of `records`.
pub fn format_records(records: &[GpuRecord], json: bool) -> String {
    let mut out = String::new();
    if json {
        for r in records {
            out.push_str(&r.json());
            out.push('\n');
        }
        return out;
    }
    if let Some(first) = records.first() {
        let peak = match first.peak {
            Some(_) => "peaks from the datasheet table".to_string(),
            None => "not in the peak table: no fraction of peak".to_string(),
        };
        out.push_str(&format!("device: {} ({peak})\n", first.device));
    }
    out.push_str(&format!(
        "{:<10} {:<30} {:>5} {:>12} {:<8} {:>9} {:>7} {:>10}  note\n",
        "bench", "shape", "dtype", "achieved", "unit", "peak", "ratio", "ms"
    ));
    for r in records {
        out.push_str(&format!(
            "{:<10} {:<30} {:>5} {:>12.2} {:<8} {:>9} {:>7} {:>10.4}  {}\n",
            r.bench,
            r.shape,
            r.dtype,
            r.achieved,
            r.unit,
            r.peak.map_or("-".to_string(), |p| format!("{p:.1}")),
            r.fraction().map_or("-".to_string(), |f| format!("{:.1}%", 100.0 * f)),
            r.ms,
            r.note
        ));
    }
    out
}

/// FLOPs of one GEMM `[m, k] · [n, k]ᵀ`.
pub fn gemm_flops(m: usize, n: usize, k: usize) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64
}

/// FLOPs of one causal attention forward: Q·Kᵀ and P·V, 2 · 2 · seq² · d per (batch, head), halved
/// by the causal mask (the work the kernel does: it skips key tiles past the query block).
pub fn attention_flops(batch: usize, seq: usize, heads: usize, head_dim: usize) -> f64 {
    4.0 * batch as f64 * heads as f64 * (seq as f64).powi(2) * head_dim as f64 / 2.0
}

/// `(m, n, k)` of the GEMM sweep: the linear layers of GPT-2 small and GPT-2 XL at 8192 tokens per
/// micro-batch (QKV, projection, MLP up, MLP down), then squares.
pub const GEMM_SHAPES: &[(usize, usize, usize)] = &[
    (8192, 2304, 768),
    (8192, 768, 768),
    (8192, 3072, 768),
    (8192, 768, 3072),
    (8192, 4800, 1600),
    (8192, 6400, 1600),
    (8192, 1600, 6400),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
];

/// `--shape AxBxC[xD]`: the numbers of one shape, `parts` of them, each at least 1.
pub fn parse_shape(text: &str, parts: usize, form: &str) -> Result<Vec<usize>> {
    let v: Vec<usize> = text.split('x').filter_map(|p| p.trim().parse().ok()).filter(|&x| x > 0).collect();
    if v.len() != parts || text.split('x').count() != parts {
        return Err(Error::flag("--shape", format!("'{text}'"), form));
    }
    Ok(v)
}

/// One `--shape` of `bench`: its sizes, and for attention an optional fifth, the key/value heads
/// (grouped-query attention), which must divide the heads.
fn bench_shape(bench: GpuBench, text: &str) -> Result<Vec<usize>> {
    let parts = bench.shapes()[0].len();
    if bench == GpuBench::Attention && text.split('x').count() == parts + 1 {
        let s = parse_shape(text, parts + 1, bench.shape_form())?;
        if !s[2].is_multiple_of(s[4]) {
            let why = format!("'{text}': {} key/value heads do not divide {} heads", s[4], s[2]);
            return Err(Error::flag("--shape", why, bench.shape_form()));
        }
        return Ok(s);
    }
    parse_shape(text, parts, bench.shape_form())
}

/// The attention shape of `s`, `[batch, seq, heads, head_dim]` and optionally the key/value heads.
fn attention_shape(s: &[usize]) -> AttentionShape {
    AttentionShape::new(s[0], s[1], s[2], s[3]).grouped(s.get(4).copied().unwrap_or(s[2]))
}

/// `(batch, seq, heads, head_dim)` of the attention sweep; the first two are GPT-2 small's 8192
/// tokens of hidden 768 in heads of 32 (the `tiny` preset's head dim) and of 64, the same FLOPs.
pub const ATTENTION_SHAPES: &[(usize, usize, usize, usize)] = &[
    (8, 1024, 24, 32),
    (8, 1024, 12, 64),
    (4, 2048, 25, 64),
    (4, 2048, 16, 128),
    (2, 4096, 32, 128),
    (1, 8192, 32, 128),
];

/// A kernel benchmark of `trident bench <name> --device cuda|hip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuBench {
    /// The forward GEMM with a bf16 output: `gemm_fwd_bf16`, or `gemm_fwd_bf16_sm90` (wgmma) on
    /// compute capability 9.0.
    Gemm,
    /// The backward-input GEMM with a bf16 output, dinp = dout · W: `gemm_bwd_input_bf16_bf16out`,
    /// or its sm_90a twin on compute capability 9.0 where TMA can describe the operands; then the
    /// bias gradient of the same bf16 dout (`column_sum_add_bf16`).
    GemmBwd,
    /// The causal attention forward, its backward's three kernels, and forward + backward.
    Attention,
    /// The fused LayerNorm forward and its one-launch backward (`layernorm.cu`).
    Layernorm,
    /// GELU forward and backward on bf16 (`gelu.cu`).
    Gelu,
    /// The vocab-parallel softmax cross-entropy's three kernels (`softmax_xent.cu`).
    Xent,
    /// The word + position embedding forward and both backward kernels (`embedding.cu`), then the
    /// position rows added to bf16 rows on their own (`position_fwd_bf16`).
    Embedding,
}

/// Tokens per micro-batch of the memory-bound sweeps, as the GEMM sweep's (8 x 1024).
const TOKENS: usize = 8192;
/// GPT-2's vocabulary padded to a multiple of 128, as Megatron pads it.
const VOCAB: usize = 50304;

impl GpuBench {
    pub const ALL: [GpuBench; 7] = [
        GpuBench::Gemm,
        GpuBench::GemmBwd,
        GpuBench::Attention,
        GpuBench::Layernorm,
        GpuBench::Gelu,
        GpuBench::Xent,
        GpuBench::Embedding,
    ];

    /// The bench `trident bench <what>` names, if it has a GPU kernel bench.
    pub fn parse(what: &str) -> Option<GpuBench> {
        GpuBench::ALL.into_iter().find(|b| b.name() == what)
    }

    pub fn name(self) -> &'static str {
        match self {
            GpuBench::Gemm => "gemm",
            GpuBench::GemmBwd => "gemm-bwd",
            GpuBench::Attention => "attention",
            GpuBench::Layernorm => "layernorm",
            GpuBench::Gelu => "gelu",
            GpuBench::Xent => "xent",
            GpuBench::Embedding => "embedding",
        }
    }

    /// `--shape`'s form: the sizes one shape of this bench takes.
    fn shape_form(self) -> &'static str {
        match self {
            GpuBench::Gemm => "MxNxK, e.g. 8192x2304x768",
            GpuBench::GemmBwd => "MxNxK (dout M x N, W N x K), e.g. 8192x2304x768",
            GpuBench::Attention => {
                "BxSxHxD[xG] (batch, sequence, heads, head dim 32, 64 or 128, and key/value heads for \
                 grouped-query attention; default H), e.g. 8x1024x12x64 or 1x8192x32x128x8"
            }
            GpuBench::Layernorm => "RxC (rows, channels), e.g. 8192x768",
            GpuBench::Gelu => "N (elements), e.g. 25165824",
            GpuBench::Xent => "RxV (rows, vocabulary), e.g. 8192x50304",
            GpuBench::Embedding => "BxSxH (batch, sequence, hidden), e.g. 8x1024x768",
        }
    }

    /// The sweep: GPT-2 small and XL shapes at 8192 tokens (GEMM and attention: `GEMM_SHAPES`,
    /// `ATTENTION_SHAPES`; the MLP's 4h activations for GELU; the padded vocabulary for the
    /// cross-entropy and the embedding).
    fn shapes(self) -> Vec<Vec<usize>> {
        match self {
            GpuBench::Gemm | GpuBench::GemmBwd => GEMM_SHAPES.iter().map(|&(m, n, k)| vec![m, n, k]).collect(),
            GpuBench::Attention => ATTENTION_SHAPES.iter().map(|&(b, s, h, d)| vec![b, s, h, d]).collect(),
            GpuBench::Layernorm => vec![vec![TOKENS, 768], vec![TOKENS, 1600]],
            GpuBench::Gelu => vec![vec![TOKENS * 3072], vec![TOKENS * 6400]],
            GpuBench::Xent => vec![vec![TOKENS, VOCAB]],
            GpuBench::Embedding => vec![vec![8, 1024, 768], vec![8, 1024, 1600]],
        }
    }

    /// The ops one shape `s` of this bench launches, in order (`wgmma`: the GEMM on sm_90a).
    fn ops(self, s: &[usize], wgmma: bool) -> Vec<Op> {
        match self {
            GpuBench::Gemm | GpuBench::GemmBwd => {
                // The Device's choice for bf16 storage (aligned: fresh allocations).
                let gemms = linear_gemms(wgmma, true, s[0], s[2], s[1], GemmOut::Bf16);
                match self {
                    GpuBench::Gemm => vec![gemms.forward],
                    _ => vec![gemms.backward_input, Op::ColumnSumAdd { rows: s[0], cols: s[1] }],
                }
            }
            GpuBench::Attention => {
                let AttentionShape { batch, seq, heads, kv_heads, head_dim } = attention_shape(s);
                vec![
                    Op::AttentionFwd { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false },
                    Op::AttentionBwdDelta { batch, seq, heads, kv_heads, head_dim },
                    Op::AttentionBwdDkv { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false },
                    Op::AttentionBwdDq { batch, seq, heads, kv_heads, head_dim, dropout: false, documents: false },
                ]
            }
            GpuBench::Layernorm => {
                let (rows, channels) = (s[0], s[1]);
                let fwd = Op::LayernormFwd { rows, channels };
                vec![fwd, Op::LayernormBwd { rows, channels }]
            }
            GpuBench::Gelu => vec![Op::GeluFwd { n: s[0] }, Op::GeluBwd { n: s[0] }],
            GpuBench::Xent => {
                let (rows, vocab) = (s[0], s[1]);
                vec![Op::XentMax { rows, vocab }, Op::XentPartials { rows, vocab }, Op::XentBwd { rows, vocab }]
            }
            GpuBench::Embedding => {
                let (batch, seq, hidden) = (s[0], s[1], s[2]);
                let fwd = Op::EmbeddingFwd { batch, seq, hidden };
                let pos = Op::PositionFwd { batch, positions: seq, hidden };
                let segments = EmbeddingSegments::new(&bench_tokens(batch * seq), 0, VOCAB, batch, seq).segments;
                let wte = Op::EmbeddingBwdWte { positions: batch * seq, segments, hidden };
                vec![fwd, wte, Op::EmbeddingBwdWpe { batch, seq, hidden }, pos]
            }
        }
    }

    /// The kernels of the index this bench's sweep launches on `vendor` for `arch`: with the
    /// Device's (`DEVICE_KERNELS`), every kernel of the index (a unit test below holds that).
    pub fn kernels(self, vendor: Vendor, arch: &str) -> Vec<Kernel> {
        let mut kernels = Vec::new();
        for shape in self.shapes() {
            for k in self.ops(&shape, wgmma(vendor, arch)).iter().filter_map(|op| kernel_of(op).ok()) {
                if !kernels.contains(&k) {
                    kernels.push(k);
                }
            }
        }
        kernels
    }
}

/// `trident bench <bench> --device cuda|hip`: `bench` on device 0 over its sweep, or over the one
/// `--shape` given.
pub fn run(bench: GpuBench, vendor: Vendor, min_seconds: f64, shape: Option<&str>) -> Result<Vec<GpuRecord>> {
    let shapes = match shape {
        None => bench.shapes(),
        Some(text) => vec![bench_shape(bench, text)?],
    };
    let command = format!("bench {} --device {}", bench.name(), vendor.name());
    let gpu = open_gpu(vendor, &command)?;
    let wgmma = wgmma(vendor, &gpu.arch);
    let kernels =
        shapes.iter().flat_map(|s| bench.ops(s, wgmma)).map(|op| kernel_of(&op)).collect::<Result<Vec<_>>>()?;
    let b =
        Bench { functions: gpu.functions(&kernels)?, peak: peaks::lookup(&gpu.name), gpu, bench, command, min_seconds };
    let mut records = Vec::new();
    for s in &shapes {
        let planned = bench.ops(s, wgmma).into_iter().map(|op| b.plan(op)).collect::<Result<Vec<_>>>()?;
        records.extend(match bench {
            GpuBench::Gemm => gemm(&b, &planned, s[0], s[1], s[2])?,
            GpuBench::GemmBwd => gemm_bwd(&b, &planned, s[0], s[1], s[2])?,
            GpuBench::Attention => attention(&b, &planned, attention_shape(s))?,
            GpuBench::Layernorm => layernorm(&b, &planned, s[0], s[1])?,
            GpuBench::Gelu => gelu(&b, &planned, s[0])?,
            GpuBench::Xent => xent(&b, &planned, s[0], s[1])?,
            GpuBench::Embedding => embedding(&b, &planned, s[0], s[1], s[2])?,
        });
    }
    Ok(records)
}

/// What a timed kernel does per launch: FLOPs (reported in TFLOP/s against the bf16 tensor
/// peak) or bytes read and written (GB/s against the HBM peak).
enum Work {
    Flops(f64),
    Bytes(f64),
}

/// An output's bound against the f64 reference: docs/design.md's bf16 rule, or (f32 arithmetic on the
/// same inputs) 1e-4 of the largest reference value plus 1e-4 relative.
#[derive(Clone, Copy)]
enum Bound {
    Bf16,
    F32,
}

/// The largest |got - want| / bound over the pairs (≤ 1 passes).
fn worst(got: &[f32], want: &[f64], bound: Bound) -> f64 {
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let tolerance = match bound {
                Bound::Bf16 => 1e-2 + 0.079 * w.abs(),
                Bound::F32 => 1e-4 * scale + 1e-4 * w.abs() + 1e-30,
            };
            (g as f64 - w).abs() / tolerance
        })
        .fold(0f64, f64::max)
}

/// How much reference work a check may take (f64 element operations); a larger shape checks a
/// prefix of its rows, or, where every row feeds every output (the parameter gradients), nothing.
const CHECK_ELEMENTS: usize = 1 << 24;

/// Opens device 0 of `vendor` for `command`, or says in one line why it cannot.
pub(super) fn open_gpu(vendor: Vendor, command: &str) -> Result<OpenGpu> {
    let (devices, which) = match vendor {
        Vendor::Cuda => {
            let driver = crate::gpu::require_driver(command)?;
            (driver.device_count()?, format!("needs an NVIDIA GPU: the driver ({})", driver.path()))
        }
        Vendor::Hip => {
            let hip = Hip::load().map_err(|e| Error::Usage(format!("{command} needs an AMD GPU: {e}")))?;
            (hip.device_count()?, format!("needs an AMD GPU: the HIP runtime ({})", hip.path()))
        }
    };
    if devices == 0 {
        return Err(Error::Usage(format!("{command} {which} sees no device")));
    }
    // The benches time the bf16 modules.
    OpenGpu::open(vendor, 0, Storage::Bf16)
}

/// A kernel bench's GPU: device 0 with the bench's kernels resolved, and its datasheet peak.
struct Bench {
    bench: GpuBench,
    gpu: OpenGpu,
    functions: Functions,
    peak: Option<Peak>,
    command: String,
    min_seconds: f64,
}

impl Bench {
    /// Device memory holding `host`.
    fn upload<T: bytemuck::Pod>(&self, host: &[T]) -> Result<DeviceMem> {
        let bytes: &[u8] = bytemuck::cast_slice(host);
        let mem = self.zeroed(bytes.len())?;
        if !bytes.is_empty() {
            self.gpu.rt.copy_to_device(mem.pointer(), bytes)?;
        }
        Ok(mem)
    }

    /// Zeroed device memory of at least `bytes` (whole 32-bit words).
    fn zeroed(&self, bytes: usize) -> Result<DeviceMem> {
        let words = bytes.div_ceil(4);
        let mem = DeviceMem::alloc(&self.gpu.rt, 4 * words)?;
        if words > 0 {
            self.gpu.rt.memset_u32(mem.pointer(), 0, words)?;
        }
        Ok(mem)
    }

    /// The first `len` f32 values at `mem`.
    fn f32s(&self, mem: &DeviceMem, len: usize) -> Result<Vec<f32>> {
        let mut host = vec![0f32; len];
        self.gpu.rt.copy_to_host(bytemuck::cast_slice_mut(&mut host), mem.pointer())?;
        Ok(host)
    }

    /// The first `len` f64 values at `mem`.
    fn f64s(&self, mem: &DeviceMem, len: usize) -> Result<Vec<f64>> {
        let mut host = vec![0f64; len];
        self.gpu.rt.copy_to_host(bytemuck::cast_slice_mut(&mut host), mem.pointer())?;
        Ok(host)
    }

    /// The first `len` bf16 values at `mem`, as f32.
    fn bf16s(&self, mem: &DeviceMem, len: usize) -> Result<Vec<f32>> {
        let mut host = vec![Bf16(0); len];
        self.gpu.rt.copy_to_host(bytemuck::cast_slice_mut(&mut host), mem.pointer())?;
        Ok(host.into_iter().map(Bf16::to_f32).collect())
    }

    fn plan(&self, op: Op) -> Result<KernelLaunch> {
        plan(&op, self.gpu.vendor, &self.gpu.limits, self.gpu.multiprocessors as u32)
    }

    /// Launches `planned` once with the arguments `l` (typed: `kernels::args`) after checking
    /// that they fit its kernel (`Launch::retarget`).
    fn launch<const N: usize>(&self, planned: &KernelLaunch, l: &Launch<N>) -> Result<()> {
        self.launch_args(planned, &l.retarget(planned.spec.kernel)?.args)
    }

    /// Launches `planned` once with `args` (already checked against its kernel by `launch`).
    fn launch_args(&self, planned: &KernelLaunch, args: &[Arg]) -> Result<()> {
        let (function, _) = self.functions.get(planned.spec.kernel).ok_or_else(|| {
            Error::Config(format!("{}: kernel {} is not one the bench loaded", self.command, planned.spec.function))
        })?;
        self.gpu.rt.launch_args(function, &planned.config, args)
    }

    /// Milliseconds per launch: a warm-up of 3, one timed launch to size the batch, then a batch
    /// long enough to fill `min_seconds` (at least 3 launches).
    fn time(&self, planned: &KernelLaunch, args: &[Arg]) -> Result<f64> {
        for _ in 0..3 {
            self.launch_args(planned, args)?;
        }
        let rt = &self.gpu.rt;
        let once_ms = rt.time_ms(&mut || self.launch_args(planned, args))?.max(1e-3);
        let iterations = ((self.min_seconds * 1e3 / once_ms).ceil() as usize).clamp(3, 100_000);
        let ms = rt.time_ms(&mut || (0..iterations).try_for_each(|_| self.launch_args(planned, args)))?;
        Ok(ms / iterations as f64)
    }

    /// Times the launches of one shape and makes a record of each: the shape's `passes` (what each
    /// adds to the record's shape), their arguments (launched once through `launch`, so checked
    /// against the kernel), what each does per launch and how its
    /// outputs compared with the reference (None: not checked), after failing the bench on an
    /// output out of its bound.
    fn records(
        &self,
        shape: &str,
        passes: &[&str],
        planned: &[KernelLaunch],
        args: &[&[Arg]],
        work: impl IntoIterator<Item = Work>,
        checks: &[Option<f64>],
    ) -> Result<Vec<GpuRecord>> {
        // The GEMM's check samples 64 outputs.
        let spot = if self.bench == GpuBench::Gemm { "spot " } else { "" };
        for (launch, worst) in planned.iter().zip(checks) {
            if let Some(w) = worst.filter(|w| *w > 1.0) {
                return Err(Error::Data(format!(
                    "{}: {} for {shape} differs from the f64 reference by {w:.2} x its tolerance",
                    self.command, launch.spec.function
                )));
            }
        }
        let mut records = Vec::new();
        for ((((pass, planned), args), work), worst) in passes.iter().zip(planned).zip(args).zip(work).zip(checks) {
            let check = worst.map_or("not checked at this size".into(), |w| format!("check {w:.2} of tolerance"));
            let ms = self.time(planned, args)?;
            let (achieved, unit, peak) = match work {
                Work::Flops(f) => (f / (ms * 1e-3) / 1e12, "TFLOP/s", self.peak.map(|p| p.bf16_tflops)),
                Work::Bytes(b) => (b / (ms * 1e-3) / 1e9, "GB/s", self.peak.map(|p| p.hbm_gbs)),
            };
            records.push(GpuRecord {
                bench: self.bench.name(),
                device_kind: self.gpu.vendor.name(),
                shape: format!("{shape}{pass}"),
                dtype: "bf16",
                device: self.gpu.name.clone(),
                achieved,
                unit,
                peak,
                ms,
                note: format!("{}, grid {:?}, {spot}{check}", planned.spec.function, planned.config.grid),
            });
        }
        Ok(records)
    }
}

/// An `int` kernel argument, or the error naming it.
fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Config(format!("{what} = {v} does not fit the kernels' int arguments")))
}

/// Deterministic bf16 values in [-1, 1).
fn bf16_values(len: usize, seed: u64) -> Vec<Bf16> {
    crate::rng::fill(len, seed).into_iter().map(Bf16::from_f32).collect()
}

/// Deterministic f32 values `offset + scale · [-1, 1)`.
fn f32_values(len: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    crate::rng::fill(len, seed).into_iter().map(|x| offset + scale * x).collect()
}

/// Values as the reference device holds them.
fn wide<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

/// bf16 values as the reference device holds them.
fn wide_bf16(v: &[Bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// `bench gemm`: out = A · Wᵀ (bf16 out) by `gemm_fwd_bf16`, on cc 9.0 by `gemm_fwd_bf16_sm90`
/// (wgmma + TMA); 64 outputs checked
fn gemm(b: &Bench, planned: &[KernelLaunch], m: usize, n: usize, k: usize) -> Result<Vec<GpuRecord>> {
    let (a, w) = (bf16_values(m * k, 1), bf16_values(n * k, 2));
    let (d_a, d_w, d_out) = (b.upload(&a)?, b.upload(&w)?, b.zeroed(2 * m * n)?);
    let (pm, pn, pk) = (int("M", m)?, int("N", n)?, int("K", k)?);
    let map = |d: &DeviceMem, rows| b.gpu.rt.operand_map(d.pointer(), rows, k, false);
    let l = match planned[0].spec.kernel == Kernel::GemmFwdBf16Sm90 {
        true => args::gemm_fwd_bf16_sm90(map(&d_a, m)?, map(&d_w, n)?, d_out.pointer(), 0, 0, pm, pn, pk, 0),
        false => args::gemm_fwd_bf16(d_out.pointer(), d_a.pointer(), d_w.pointer(), 0, 0, pm, pn, pk, 0),
    };
    b.launch(&planned[0], &l)?;
    let checked = [Some(spot_check(&a, &w, &b.bf16s(&d_out, m * n)?, m, n, k))];
    let work = [Work::Flops(gemm_flops(m, n, k))];
    b.records(&format!("{m}x{n}x{k} NT"), &[""], planned, &[&l.args], work, &checked)
}

/// `bench gemm-bwd`: dinp = dout · W (bf16 out) by `gemm_bwd_input_bf16_bf16out`, on cc 9.0 by its
/// sm_90a twin where TMA can describe the operands, 64 outputs checked (as the forward's check on
/// dout and Wᵀ); then dbias += Σ_rows dout (`column_sum_add_bf16`) against the reference when
/// dout fits the budget.
fn gemm_bwd(b: &Bench, planned: &[KernelLaunch], m: usize, n: usize, k: usize) -> Result<Vec<GpuRecord>> {
    let (dout, w) = (bf16_values(m * n, 13), bf16_values(n * k, 14));
    let (d_dout, d_w, d_dinp) = (b.upload(&dout)?, b.upload(&w)?, b.zeroed(2 * m * k)?);
    let (pm, pn, pk) = (int("M", m)?, int("N", n)?, int("K", k)?);
    let rt = &b.gpu.rt;
    let dinp_l = match planned[0].spec.kernel == Kernel::GemmBwdInputBf16Bf16outSm90 {
        true => {
            let (md, mw) = (rt.operand_map(d_dout.pointer(), m, n, false)?, rt.operand_map(d_w.pointer(), n, k, true)?);
            args::gemm_bwd_input_bf16_bf16out_sm90(md, mw, d_dinp.pointer(), pm, pn, pk)
        }
        false => args::gemm_bwd_input_bf16_bf16out(d_dinp.pointer(), d_dout.pointer(), d_w.pointer(), pm, pn, pk),
    };
    // The scratch the Device keeps: the partial column sums, and the strip counters zeroed once.
    let (d_dbias, d_partials) = (b.zeroed(4 * n)?, b.zeroed(4 * column_sum_partials(m, n))?);
    let d_counters = b.zeroed(4 * COLUMN_SUM_COUNTERS)?;
    let (partials, counters) = (d_partials.pointer(), d_counters.pointer());
    let bias_l = args::column_sum_add_bf16(d_dbias.pointer(), partials, counters, d_dout.pointer(), pm, pn);
    b.launch(&planned[0], &dinp_l)?;
    b.launch(&planned[1], &bias_l)?;
    // dinp[i][j] = Σ_p dout[i][p] · W[p][j]: the forward's check with A = dout and Wᵀ's rows.
    let wt: Vec<Bf16> = (0..k * n).map(|e| w[(e % n) * k + e / n]).collect();
    let dinp = spot_check(&dout, &wt, &b.bf16s(&d_dinp, m * k)?, m, k, n);
    let dbias = (m * n <= CHECK_ELEMENTS).then(|| -> Result<f64> {
        let want: Vec<f64> = (0..n).map(|c| (0..m).map(|r| dout[r * n + c].to_f32() as f64).sum()).collect();
        Ok(worst(&b.f32s(&d_dbias, n)?, &want, Bound::F32))
    });
    // dbias: dout once, the partials written and read once, dbias read and written.
    let partials = column_sum_partials(m, n) as f64;
    let work = [Work::Flops(gemm_flops(m, n, k)), Work::Bytes(2.0 * (m * n) as f64 + 8.0 * partials + 8.0 * n as f64)];
    let args = [&dinp_l.args[..], &bias_l.args[..]];
    b.records(&format!("{m}x{n}x{k}"), &[" dinp", " dbias"], planned, &args, work, &[Some(dinp), dbias.transpose()?])
}

/// `bench attention`: the causal forward (FLOPs halved by the mask), then the backward's three
/// kernels (delta = rowsum(dO·O); dK, dV, recomputing S and dP: 4 products; dQ, recomputing S and
/// dP: 3 products; each record counts the products it runs), against the reference device when
/// the shape is small; last, forward + backward as one record: the four times summed, FLOPs 3.5 x
/// the forward's (FlashAttention's count: the backward's 5 products, recomputation not counted),
/// the figure `make gpu-bench` sets beside PyTorch's forward + backward.
fn attention(b: &Bench, planned: &[KernelLaunch], shape: AttentionShape) -> Result<Vec<GpuRecord>> {
    let AttentionShape { batch, seq, heads, kv_heads, head_dim } = shape;
    let (rows, width, qkv_width) = (seq * batch, heads * head_dim, shape.qkv_width());
    let (qkv, dout) = (bf16_values(rows * qkv_width, 3), bf16_values(rows * width, 4));
    let (d_qkv, d_out, d_lse) = (b.upload(&qkv)?, b.zeroed(2 * rows * width)?, b.zeroed(4 * rows * heads)?);
    let (d_dout, d_delta, d_dqkv) = (b.upload(&dout)?, b.zeroed(4 * rows * heads)?, b.zeroed(2 * rows * qkv_width)?);
    let (pb, ps, ph, pg) = (int("batch", batch)?, int("seq", seq)?, int("heads", heads)?, int("kv heads", kv_heads)?);
    // The head dim's kernels: one signature for the three (`Launch::retarget`).
    let fwd = args::attention_fwd_bf16_d64(d_out.pointer(), d_lse.pointer(), d_qkv.pointer(), pb, ps, ph, pg);
    let (dout_at, out_at, pd) = (d_dout.pointer(), d_out.pointer(), int("head dim", head_dim)?);
    let delta = args::attention_bwd_delta_bf16(d_delta.pointer(), dout_at, out_at, pb, ps, ph, pg, pd);
    let [dqkv, qkv_at, lse, delta_at] = [&d_dqkv, &d_qkv, &d_lse, &d_delta].map(|d| d.pointer());
    let dkv = args::attention_bwd_dkv_bf16_d64(dqkv, qkv_at, dout_at, lse, delta_at, pb, ps, ph, pg);
    let dq = args::attention_bwd_dq_bf16_d64(dqkv, qkv_at, dout_at, lse, delta_at, pb, ps, ph, pg);
    b.launch(&planned[0], &fwd)?;
    b.launch(&planned[1], &delta)?;
    b.launch(&planned[2], &dkv)?;
    b.launch(&planned[3], &dq)?;
    let (mut fwd_check, mut delta_check, mut bwd_check) = (None, None, None);
    if rows * seq * width <= CHECK_ELEMENTS {
        let dev = ReferenceDevice;
        let (mut out, mut lse, mut dqkv) =
            (vec![0f64; rows * width], vec![0f64; rows * heads], vec![0f64; rows * qkv_width]);
        let wide_qkv = wide_bf16(&qkv);
        dev.attention_forward(&mut out, &mut lse, &wide_qkv, shape, None, None);
        let gpu_out = b.bf16s(&d_out, rows * width)?;
        fwd_check = Some(worst(&gpu_out, &out, Bound::Bf16));
        // The backward from the GPU's own forward output (bf16, as training feeds it).
        let gpu_out = wide(&gpu_out);
        let wide_dout = wide_bf16(&dout);
        // delta[(b·heads + h)·seq + t] = dO · O over the head's columns of row t·batch + b.
        let mut want = vec![0f64; rows * heads];
        for (i, w) in want.iter_mut().enumerate() {
            let (bh, t) = (i / seq, i % seq);
            let at = (t * batch + bh / heads) * width + (bh % heads) * head_dim;
            *w = (at..at + head_dim).map(|j| wide_dout[j] * gpu_out[j]).sum();
        }
        delta_check = Some(worst(&b.f32s(&d_delta, rows * heads)?, &want, Bound::F32));
        dev.attention_backward(&mut dqkv, &wide_dout, &wide_qkv, &gpu_out, &lse, shape, None, None);
        bwd_check = Some(worst(&b.bf16s(&d_dqkv, rows * qkv_width)?, &dqkv, Bound::Bf16));
    }
    let forward = attention_flops(batch, seq, heads, head_dim);
    let rows_heads_bytes = (2 * 2 * rows * width + 4 * rows * heads) as f64;
    let groups = if kv_heads == heads { String::new() } else { format!(" g{kv_heads}") };
    let work =
        [Work::Flops(forward), Work::Bytes(rows_heads_bytes), Work::Flops(2.0 * forward), Work::Flops(1.5 * forward)];
    let name = format!("b{batch} s{seq} h{heads}{groups} d{head_dim} causal");
    let passes = ["", " bwd delta", " bwd dkv", " bwd dq"];
    let checks = [fwd_check, delta_check, bwd_check, bwd_check];
    let mut records =
        b.records(&name, &passes, planned, &[&fwd.args, &delta.args, &dkv.args, &dq.args], work, &checks)?;
    let ms: f64 = records.iter().map(|r| r.ms).sum();
    let mut both = records[0].clone();
    both.shape = format!("{name} fwd+bwd");
    both.ms = ms;
    both.achieved = 3.5 * forward / (ms * 1e-3) / 1e12;
    let worst_check = checks.iter().flatten().fold(None, |w: Option<f64>, &c| Some(w.map_or(c, |w| w.max(c))));
    let check = worst_check.map_or("not checked at this size".into(), |w| format!("check {w:.2} of tolerance"));
    let kernels: Vec<&str> = planned.iter().map(|p| p.spec.function).collect();
    both.note = format!("{}, FLOPs 3.5 x the forward's, {check}", kernels.join(" + "));
    records.push(both);
    Ok(records)
}

/// `bench layernorm`: `layernorm.cu`'s forward and its one-launch backward (the input gradient
/// accumulated into bf16, the parameter gradients through the partials and the last block) on
/// [rows, c], against the reference device's LayerNorm on the same bf16 inputs (backward on the
/// statistics the forward saved): the outputs of the first rows the budget allows, the parameter
/// gradients when every row fits.
fn layernorm(b: &Bench, planned: &[KernelLaunch], rows: usize, c: usize) -> Result<Vec<GpuRecord>> {
    let (inp, dout) = (bf16_values(rows * c, 3), bf16_values(rows * c, 4));
    let (weight, bias) = (f32_values(c, 5, 0.2, 1.0), f32_values(c, 6, 0.2, 0.0));
    let (d_inp, d_dout, d_w, d_b) = (b.upload(&inp)?, b.upload(&dout)?, b.upload(&weight)?, b.upload(&bias)?);
    let (d_out, d_mean, d_rstd) = (b.zeroed(2 * rows * c)?, b.zeroed(4 * rows)?, b.zeroed(4 * rows)?);
    let (d_dinp, d_dw, d_db) = (b.zeroed(2 * rows * c)?, b.zeroed(4 * c)?, b.zeroed(4 * c)?);
    // The scratch the Device keeps per shape: the partial sums, and the counters zeroed once.
    let d_partials = b.zeroed(4 * layernorm_bwd_partials(rows, c))?;
    let d_counter = b.zeroed(4 * LAYERNORM_BWD_COUNTERS)?;
    let (r, cc, x, dy) = (int("rows", rows)?, int("C", c)?, d_inp.pointer(), d_dout.pointer());
    let (mean, rstd, w) = (d_mean.pointer(), d_rstd.pointer(), d_w.pointer());
    let fwd = args::layernorm_fwd_bf16(d_out.pointer(), mean, rstd, 0, x, 0, w, d_b.pointer(), r, cc);
    let (dinp, dw, db) = (d_dinp.pointer(), d_dw.pointer(), d_db.pointer());
    let bwd =
        args::layernorm_bwd_bf16(dinp, dw, db, d_partials.pointer(), d_counter.pointer(), dy, x, w, mean, rstd, r, cc);
    b.launch(&planned[0], &fwd)?;
    b.launch(&planned[1], &bwd)?;
    let args = [&fwd.args[..], &bwd.args[..]];
    let p = rows.min(CHECK_ELEMENTS / c.max(1));
    let (mean, rstd) = (b.f32s(&d_mean, p)?, b.f32s(&d_rstd, p)?);
    let dev = ReferenceDevice;
    let (mut out_r, mut mean_r, mut rstd_r) = (vec![0f64; p * c], vec![0f64; p], vec![0f64; p]);
    let (x_r, w_r) = (wide_bf16(&inp[..p * c]), wide(&weight));
    let shape = Matrix { rows: p, cols: c };
    dev.layernorm_forward(&mut out_r, (&mut mean_r, &mut rstd_r), &x_r, (&w_r, &wide(&bias)), shape);
    let fwd = worst(&b.bf16s(&d_out, p * c)?, &out_r, Bound::Bf16).max(worst(&mean, &mean_r, Bound::F32)).max(worst(
        &rstd,
        &rstd_r,
        Bound::F32,
    ));
    let (mut dinp_r, mut dw_r, mut db_r) = (vec![0f64; p * c], vec![0f64; c], vec![0f64; c]);
    let (dy_r, m_r, s_r) = (wide_bf16(&dout[..p * c]), wide(&mean), wide(&rstd));
    let saved = LayerNormSaved { inp: &x_r, weight: &w_r, mean: &m_r, rstd: &s_r };
    dev.layernorm_backward(&mut dinp_r, (&mut dw_r, &mut db_r), &dy_r, saved, shape);
    let dx = worst(&b.bf16s(&d_dinp, p * c)?, &dinp_r, Bound::Bf16);
    let dp = worst(&b.f32s(&d_dw, c)?, &dw_r, Bound::F32).max(worst(&b.f32s(&d_db, c)?, &db_r, Bound::F32));
    let (e, r, c_f) = ((rows * c) as f64, rows as f64, c as f64);
    // Backward, what reaches memory: dout and inp read once (the second reads are L1 hits), dinp
    // read and written (bf16), the statistics, the blocks' and groups' partials written and read
    // once, weight read and dweight, dbias read and written.
    let slots = (layernorm_bwd_partials(rows, c) / (2 * c.max(1))) as f64;
    let work = [4.0 * e + 8.0 * (r + c_f), 8.0 * e + 8.0 * r + 16.0 * slots * c_f + 20.0 * c_f];
    let bwd = if p == rows { dx.max(dp) } else { dx };
    let checks = [(p > 0).then_some(fwd), (p > 0).then_some(bwd)];
    b.records(&format!("{rows}x{c}"), &[" fwd", " bwd"], planned, &args, work.map(Work::Bytes), &checks)
}

/// `bench gelu`: `gelu.cu`'s forward and backward over n bf16 elements, against the reference
/// device on the first elements the budget allows.
fn gelu(b: &Bench, planned: &[KernelLaunch], n: usize) -> Result<Vec<GpuRecord>> {
    let inp: Vec<Bf16> = f32_values(n, 7, 3.0, 0.0).into_iter().map(Bf16::from_f32).collect();
    let dout = bf16_values(n, 8);
    let (d_inp, d_dout, d_out, d_dinp) = (b.upload(&inp)?, b.upload(&dout)?, b.zeroed(2 * n)?, b.zeroed(2 * n)?);
    let nn = int("n", n)?;
    let fwd_l = args::gelu_fwd_bf16(d_out.pointer(), d_inp.pointer(), nn, 0);
    let bwd_l = args::gelu_bwd_bf16(d_dinp.pointer(), d_inp.pointer(), d_dout.pointer(), nn, 0);
    b.launch(&planned[0], &fwd_l)?;
    b.launch(&planned[1], &bwd_l)?;
    let p = n.min(CHECK_ELEMENTS);
    let (dev, x_r) = (ReferenceDevice, wide_bf16(&inp[..p]));
    let (mut out_r, mut dinp_r) = (vec![0f64; p], vec![0f64; p]);
    dev.gelu_forward(&mut out_r, &x_r, Gelu::Tanh);
    dev.gelu_backward(&mut dinp_r, &x_r, &wide_bf16(&dout[..p]), Gelu::Tanh);
    let fwd = worst(&b.bf16s(&d_out, p)?, &out_r, Bound::Bf16);
    let bwd = worst(&b.bf16s(&d_dinp, p)?, &dinp_r, Bound::Bf16);
    let work = [4.0 * n as f64, 6.0 * n as f64].map(Work::Bytes);
    b.records(&n.to_string(), &[" fwd", " bwd"], planned, &[&fwd_l.args, &bwd_l.args], work, &[Some(fwd), Some(bwd)])
}

/// `bench xent`: `softmax_xent.cu`'s row max, partial sums (f64 statistics) and gradient (in place,
/// on a copy of the logits) over [rows, v] bf16 logits (the whole vocabulary on one rank), each
/// against the reference device on the first rows the budget allows, given the statistics the
/// previous kernels wrote.
fn xent(b: &Bench, planned: &[KernelLaunch], rows: usize, v: usize) -> Result<Vec<GpuRecord>> {
    let logits: Vec<Bf16> = f32_values(rows * v, 9, 4.0, 0.0).into_iter().map(Bf16::from_f32).collect();
    let targets: Vec<u32> = (0..rows).map(|r| ((r * 7919 + 13) % v.max(1)) as u32).collect();
    let (d_logits, d_targets, d_grad) = (b.upload(&logits)?, b.upload(&targets)?, b.upload(&logits)?);
    let (d_max, d_sum, d_target) = (b.zeroed(8 * rows)?, b.zeroed(8 * rows)?, b.zeroed(8 * rows)?);
    let (r, vv, lg, tg) = (int("rows", rows)?, int("V", v)?, d_logits.pointer(), d_targets.pointer());
    let (mx, sm) = (d_max.pointer(), d_sum.pointer());
    let max_l = args::xent_max_bf16(mx, lg, r, vv);
    let partials_l = args::xent_partials_bf16(sm, d_target.pointer(), lg, tg, 0, mx, r, vv);
    let bwd_l = args::xent_bwd_bf16(d_grad.pointer(), tg, 0, mx, sm, 1.0, r, vv);
    b.launch(&planned[0], &max_l)?;
    b.launch(&planned[1], &partials_l)?;
    b.launch(&planned[2], &bwd_l)?;
    let args = [&max_l.args[..], &partials_l.args[..], &bwd_l.args[..]];
    let p = rows.min(CHECK_ELEMENTS / v.max(1));
    let (gpu_max, gpu_sum, gpu_target) = (b.f64s(&d_max, p)?, b.f64s(&d_sum, p)?, b.f64s(&d_target, p)?);
    let (dev, mut logits_r) = (ReferenceDevice, wide_bf16(&logits[..p * v]));
    let (mut max_r, mut stats_r) = (vec![0f64; p], vec![0f64; 2 * p]);
    dev.cross_entropy_max(&logits_r, p, v, &mut max_r);
    let shape = Logits { rows: p, vocab: v, vocab_start: 0 };
    dev.cross_entropy_partials(&logits_r, &targets[..p], shape, &gpu_max, &mut stats_r);
    let (sum_r, target_r) = stats_r.split_at(p);
    let gpu_stats = [gpu_sum.clone(), gpu_target.clone()].concat();
    dev.cross_entropy_backward(&mut logits_r, &targets[..p], shape, &gpu_max, &gpu_stats, 1.0);
    let narrow = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<_>>();
    let max = worst(&narrow(&gpu_max), &max_r, Bound::F32);
    let partials = worst(&narrow(&gpu_sum), sum_r, Bound::F32).max(worst(&narrow(&gpu_target), target_r, Bound::F32));
    let bwd = worst(&b.bf16s(&d_grad, p * v)?, &logits_r, Bound::Bf16);
    let (e, r) = ((rows * v) as f64, rows as f64);
    let work = [2.0 * e + 8.0 * r, 2.0 * e + 28.0 * r, 4.0 * e + 20.0 * r].map(Work::Bytes);
    let checks = [max, partials, bwd].map(|w| (p > 0).then_some(w));
    b.records(&format!("{rows}x{v}"), &[" max", " partials", " bwd"], planned, &args, work, &checks)
}

/// `bench embedding`: `embedding.cu`'s forward (word rows of a GPT-2-sized table plus positions)
/// and its two backward kernels, against the reference device when the tables fit the budget.
fn embedding(b: &Bench, planned: &[KernelLaunch], batch: usize, seq: usize, hidden: usize) -> Result<Vec<GpuRecord>> {
    let rows = batch * seq;
    let tokens = bench_tokens(rows);
    let segments = EmbeddingSegments::new(&tokens, 0, VOCAB, batch, seq);
    let (wte, dout) = (bf16_values(VOCAB * hidden, 10), bf16_values(rows * hidden, 12));
    let wpe = f32_values(seq * hidden, 11, 1.0, 0.0);
    let (d_tokens, d_wte, d_wpe, d_dout) = (b.upload(&tokens)?, b.upload(&wte)?, b.upload(&wpe)?, b.upload(&dout)?);
    let d_index = b.upload(&segments.words)?;
    let [rows_at, starts_at, positions_at] = segments.offsets().map(|o| d_index.pointer() + 4 * o as u64);
    let (d_out, d_dwte, d_dwpe) =
        (b.zeroed(2 * rows * hidden)?, b.zeroed(4 * VOCAB * hidden)?, b.zeroed(4 * seq * hidden)?);
    let (bb, ss, hh, vr) = (int("batch", batch)?, int("seq", seq)?, int("hidden", hidden)?, int("vocab", VOCAB)?);
    let (tk, dy) = (d_tokens.pointer(), d_dout.pointer());
    let fwd = args::embedding_fwd_bf16(d_out.pointer(), tk, d_wte.pointer(), d_wpe.pointer(), 0, vr, bb, ss, hh);
    let wte_l = args::embedding_bwd_wte_bf16(d_dwte.pointer(), dy, rows_at, starts_at, positions_at, hh);
    let wpe_l = args::embedding_bwd_wpe_bf16(d_dwpe.pointer(), dy, bb, ss, hh);
    let d_pos = b.zeroed(2 * rows * hidden)?;
    let pos = args::position_fwd_bf16(d_pos.pointer(), d_wpe.pointer(), bb, 0, ss, hh);
    b.launch(&planned[0], &fwd)?;
    b.launch(&planned[1], &wte_l)?;
    b.launch(&planned[2], &wpe_l)?;
    b.launch(&planned[3], &pos)?;
    let args = [&fwd.args[..], &wte_l.args[..], &wpe_l.args[..], &pos.args[..]];
    let checked = if (VOCAB + rows) * hidden <= CHECK_ELEMENTS {
        let (dev, dout_r) = (ReferenceDevice, wide_bf16(&dout));
        let (mut out_r, mut dwte_r, mut dwpe_r) =
            (vec![0f64; rows * hidden], vec![0f64; VOCAB * hidden], vec![0f64; seq * hidden]);
        let ids = Tokens { ids: &tokens, batch, seq, vocab_start: 0 };
        dev.embedding_forward(&mut out_r, &wide_bf16(&wte), ids, hidden);
        dev.position_forward(&mut out_r, &wide(&wpe), batch, 0, seq, hidden);
        dev.embedding_backward(&mut dwte_r, &dout_r, ids, hidden);
        dev.position_backward(&mut dwpe_r, &dout_r, batch, 0, seq, hidden);
        let mut pos_r = vec![0f64; rows * hidden];
        dev.position_forward(&mut pos_r, &wide(&wpe), batch, 0, seq, hidden);
        [
            Some(worst(&b.bf16s(&d_out, rows * hidden)?, &out_r, Bound::Bf16)),
            Some(worst(&b.f32s(&d_dwte, VOCAB * hidden)?, &dwte_r, Bound::F32)),
            Some(worst(&b.f32s(&d_dwpe, seq * hidden)?, &dwpe_r, Bound::F32)),
            Some(worst(&b.bf16s(&d_pos, rows * hidden)?, &pos_r, Bound::Bf16)),
        ]
    } else {
        [None; 4]
    };
    let (e, r) = ((rows * hidden) as f64, rows as f64);
    let table = (seq * hidden) as f64;
    // bwd wte: dout once, each touched row of dwte read and written, the index read.
    let (touched, index) = ((segments.segments * hidden) as f64, 4.0 * segments.words.len() as f64);
    let wte = 2.0 * e + 8.0 * touched + index;
    let work = [8.0 * e + 4.0 * r, wte, 2.0 * e + 8.0 * table, 4.0 * e + 4.0 * table].map(Work::Bytes);
    let shape = format!("b{batch} s{seq} h{hidden} v{VOCAB}");
    b.records(&shape, &[" fwd", " bwd wte", " bwd wpe", " position"], planned, &args, work, &checked)
}

/// The tokens of `bench embedding`'s `rows` positions: every fourth one of 16 frequent tokens (each
/// then repeated rows / 64 times, as common words are), the others spread over the vocabulary.
fn bench_tokens(rows: usize) -> Vec<u32> {
    (0..rows).map(|i| if i % 4 == 0 { (i / 4) % 16 } else { (i * 7919 + 1) % VOCAB } as u32).collect()
}

/// The largest |out - ref| / (atol + 0.079 |ref|) over 64 sampled elements (≤ 1 passes).
fn spot_check(a: &[Bf16], w: &[Bf16], out: &[f32], m: usize, n: usize, k: usize) -> f64 {
    let mut worst = 0f64;
    for s in 0..64usize {
        let (i, j) = ((s * 7919) % m, (s * 104_729) % n);
        let reference: f64 = (0..k).map(|p| a[i * k + p].to_f32() as f64 * w[j * k + p].to_f32() as f64).sum();
        let got = out[i * n + j] as f64;
        let atol = 1e-2 * (k as f64).sqrt() / 16.0;
        worst = worst.max((got - reference).abs() / (atol + 0.079 * reference.abs()));
    }
    worst
}

#[cfg(test)]
mod tests;
