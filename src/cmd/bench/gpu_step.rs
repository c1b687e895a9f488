//! `trident bench step --device cuda|hip`: the training step of `bench step` (`ops::train_step`:
//! forward and backward of one micro-batch, the gradient norm and clip, AdamW, the working
//! weights refreshed) on the GPU Device, as ms per step, tokens/s, model TFLOP/s and MFU against
//! the device's datasheet dense bf16 peak (`gpu::peaks`; none for a device not in the table), and
//! what its GPU work costs as the Device counts it (`Memory::work_counters`): the first step
//! apart (it allocates activations, scratch and the blocks later steps reuse), the mean per step
//! over the timed steps after it, per transformer layer forward and backward
//! (`Gpt::count_layer_work`), and the whole run from opening the device to its teardown, which
//! the emulating runtimes' own counts are held to (tests/gpu/emu_runtime.h).
//!
//! Time is the host's clock over the timed steps and a synchronize after them; the counter
//! windows close before that synchronize, so it is counted in the run only.

use super::gpu::{format_records, open_gpu, GpuRecord};
use super::ops::{train_step, StepModel, STEP_ADAMW};
use crate::device::counters::FIELDS;
use crate::device::prelude::*;
use crate::device::WorkCounters;
use crate::error::Result;
use crate::gpu::device::GpuDevice;
use crate::gpu::kernels::Vendor;
use crate::gpu::peaks;
use crate::model::Gpt;
use crate::optim::AdamW;
use crate::real::Precision;
use std::time::Instant;

/// What one `bench step --device cuda|hip` measured.
pub struct StepReport {
    pub record: GpuRecord,
    pub tokens_per_s: f64,
    pub layers: usize,
    /// Timed steps after the first.
    pub steps: usize,
    /// The Device's work making the model and the optimizer, before the first step.
    pub setup: WorkCounters,
    pub first: WorkCounters,
    /// Summed over the timed steps.
    pub timed: WorkCounters,
    /// Summed over the layers and the timed steps: the layers' forward and backward passes.
    pub layer_forward: WorkCounters,
    pub layer_backward: WorkCounters,
    /// Everything from opening the device to its teardown (its kept blocks freed).
    pub run: WorkCounters,
}

/// What `measure` counted and timed.
struct Measured {
    setup: WorkCounters,
    first: WorkCounters,
    timed: WorkCounters,
    layer_forward: WorkCounters,
    layer_backward: WorkCounters,
    steps: usize,
    seconds_per_step: f64,
}

/// Opens device 0 of `vendor`, runs one step and then `steps` timed ones (default: enough to
/// fill `min_seconds` at the first step's pace, at least 2) of `m` in bf16, and reports them.
pub fn step(vendor: Vendor, m: &StepModel, min_seconds: f64, steps: Option<usize>) -> Result<StepReport> {
    let kind = match vendor {
        Vendor::Cuda => "cuda",
        Vendor::Hip => "hip",
    };
    GpuDevice::check_head_dim_for(kind, m.cfg.head_dim())?;
    let gpu = open_gpu(vendor, &format!("bench step --device {kind}"))?;
    let (device, peak) = (gpu.name.clone(), peaks::lookup(&gpu.name));
    let dev = GpuDevice::on(gpu)?;
    let tally = dev.tally();
    let measured = measure(&dev, m, min_seconds, steps)?;
    drop(dev);
    let secs = measured.seconds_per_step;
    let tokens_per_s = (m.micro_batch * m.seq) as f64 / secs;
    let record = GpuRecord {
        bench: "step",
        device_kind: kind,
        shape: m.name.clone(),
        dtype: "bf16",
        device,
        achieved: m.flops() / secs / 1e12,
        unit: "TFLOP/s",
        peak: peak.map(|p| p.bf16_tflops),
        ms: 1e3 * secs,
        note: format!(
            "{tokens_per_s:.0} tokens/s; {}; {} timed steps after the first",
            if peak.is_some() { "MFU is the ratio" } else { "no datasheet peak for this device, so no MFU" },
            measured.steps
        ),
    };
    Ok(StepReport {
        record,
        tokens_per_s,
        layers: m.cfg.num_layers,
        steps: measured.steps,
        setup: measured.setup,
        first: measured.first,
        timed: measured.timed,
        layer_forward: measured.layer_forward,
        layer_backward: measured.layer_backward,
        run: tally.snapshot(),
    })
}

/// Makes the model and its optimizer on `dev`, then counts and times the steps.
fn measure(dev: &GpuDevice, m: &StepModel, min_seconds: f64, steps: Option<usize>) -> Result<Measured> {
    let counters = || dev.work_counters().unwrap_or_default();
    let opened = counters();
    dev.set_matmul_precision(Precision::Bf16);
    let mut model = Gpt::new(dev, m.cfg.clone(), 1234);
    model.set_precision(dev, Precision::Bf16);
    let mut opt = AdamW::new(dev, &model.params, STEP_ADAMW);
    let mut norm = [dev.scalars(1), dev.scalars(2)];
    let (tokens, labels) = m.batch();
    let setup = counters().since(&opened);
    let mut run = |model: &mut Gpt<GpuDevice>, opt: &mut AdamW<GpuDevice>| {
        train_step(dev, (model, opt, &mut norm), (&tokens, &labels), (m.micro_batch, m.seq));
    };

    let (before, started) = (counters(), Instant::now());
    run(&mut model, &mut opt);
    let first = counters().since(&before);
    dev.synchronize()?;
    let first_seconds = started.elapsed().as_secs_f64();
    let steps = steps.unwrap_or_else(|| ((min_seconds / first_seconds.max(1e-6)).ceil() as usize).clamp(2, 10_000));

    model.count_layer_work();
    let (before, started) = (counters(), Instant::now());
    for _ in 0..steps {
        run(&mut model, &mut opt);
    }
    let timed = counters().since(&before);
    dev.synchronize()?;
    let seconds_per_step = started.elapsed().as_secs_f64() / steps as f64;
    let (mut layer_forward, mut layer_backward) = (WorkCounters::default(), WorkCounters::default());
    for [forward, backward] in model.layer_work().unwrap_or_default() {
        layer_forward.add(forward);
        layer_backward.add(backward);
    }
    Ok(Measured { setup, first, timed, layer_forward, layer_backward, steps, seconds_per_step })
}

/// `n / divisor` as the report writes a mean: whole numbers without a fraction.
fn mean(n: u64, divisor: usize) -> String {
    let v = n as f64 / divisor.max(1) as f64;
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// A JSON object of every total of `c`, each divided by `divisor`.
fn counters_json(c: &WorkCounters, divisor: usize) -> String {
    let fields: Vec<String> = c.fields().iter().map(|(k, v)| format!("\"{k}\": {}", mean(*v, divisor))).collect();
    format!("{{{}}}", fields.join(", "))
}

/// A JSON object of the launches per kernel function of `c`, divided by `divisor`.
fn kernels_json(c: &WorkCounters, divisor: usize) -> String {
    let fields: Vec<String> =
        c.launches_by_kernel.iter().map(|(k, v)| format!("\"{k}\": {}", mean(*v, divisor))).collect();
    format!("{{{}}}", fields.join(", "))
}

impl StepReport {
    /// Divisors of the per-layer means: every layer of every timed step.
    fn layer_steps(&self) -> usize {
        self.layers * self.steps
    }

    /// One JSON record: the kernel benches' fields, then tokens/s and the counters (`first_step`,
    /// `per_step` and `per_layer_forward` / `per_layer_backward` means and the launches per kernel
    /// function of each, `setup` and the whole `run`), each keyed as `WorkCounters::fields`.
    pub fn json(&self) -> String {
        format!(
            "{{{}, \"tokens_per_s\": {}, \"layers\": {}, \"timed_steps\": {}, \"first_step\": {}, \"per_step\": {}, \
             \"per_layer_forward\": {}, \"per_layer_backward\": {}, \"per_step_launches_by_kernel\": {}, \
             \"per_layer_forward_launches_by_kernel\": {}, \"per_layer_backward_launches_by_kernel\": {}, \"setup\": {}, \
             \"run\": {}, \"run_launches_by_kernel\": {}}}",
            self.record.json_fields(),
            self.tokens_per_s,
            self.layers,
            self.steps,
            counters_json(&self.first, 1),
            counters_json(&self.timed, self.steps),
            counters_json(&self.layer_forward, self.layer_steps()),
            counters_json(&self.layer_backward, self.layer_steps()),
            kernels_json(&self.timed, self.steps),
            kernels_json(&self.layer_forward, self.layer_steps()),
            kernels_json(&self.layer_backward, self.layer_steps()),
            counters_json(&self.setup, 1),
            counters_json(&self.run, 1),
            kernels_json(&self.run, 1),
        )
    }

    /// The kernel benches' table row, then the counters: the first step, the mean per timed step,
    /// and per layer forward and backward; then the launches per kernel function of each mean.
    pub fn table(&self) -> String {
        let mut out = format_records(std::slice::from_ref(&self.record), false);
        out.push_str(&format!(
            "\nGPU work, as the Device counts it: {:<8} {:>14} {:>16} {:>16}\n",
            "first step",
            format!("per step ({})", self.steps),
            "per layer fwd",
            "per layer bwd"
        ));
        let rows =
            [self.first.fields(), self.timed.fields(), self.layer_forward.fields(), self.layer_backward.fields()];
        let divisors = [1, self.steps, self.layer_steps(), self.layer_steps()];
        for (i, name) in FIELDS.iter().enumerate() {
            let v: Vec<String> = rows.iter().zip(divisors).map(|(r, d)| mean(r[i].1, d)).collect();
            out.push_str(&format!(
                "  {:<32} {:>10} {:>14} {:>16} {:>16}\n",
                name.replace('_', " "),
                v[0],
                v[1],
                v[2],
                v[3]
            ));
        }
        let by_kernel = [
            ("per step", &self.timed, self.steps),
            ("per layer forward", &self.layer_forward, self.layer_steps()),
            ("per layer backward", &self.layer_backward, self.layer_steps()),
        ];
        for (what, c, divisor) in by_kernel {
            let kernels: Vec<String> =
                c.launches_by_kernel.iter().map(|(k, n)| format!("{k} {}", mean(*n, divisor))).collect();
            out.push_str(&format!("launches {what} by kernel: {}\n", kernels.join(", ")));
        }
        out
    }
}
