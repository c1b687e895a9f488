//! `trident bench gemm|attention|allreduce --device cuda`: the embedded CUDA kernels and the NCCL
//! Comm timed on an NVIDIA GPU, reported as TFLOP/s (or bus bandwidth) and as a fraction of the
//! device's datasheet peak (`gpu::peaks`).
//!
//! GEMM and attention compile their kernel file through `KernelModules` (precompiled image or
//! NVRTC and the disk cache), launch with the geometry `kernels::plan` gives, and are timed with
//! CUDA events on a stream over a warm-up and then enough launches to fill `--min-seconds`. The
//! GEMM's output is spot-checked against an f64 dot product of the same bf16 inputs (llm.c's
//! tolerance). All-reduce runs through `NcclComm` on every rank of the job, sizes doubling from
//! 1 KiB to `--max-size`, timed with events on the communication stream; the slowest rank's time
//! counts, and bus bandwidth is nccl-tests' `algbw · 2(n-1)/n`, compared with the NVLink
//! bandwidth per direction.

use crate::comm::runtime::Runtime;
use crate::comm::{Bf16, Dtype, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::collectives::{self, NcclComm};
use crate::gpu::driver::{CuFunction, DeviceBuffer, DeviceInfo, Driver, Event, Module, PrimaryContext, Stream};
use crate::gpu::kernels::cuda::{arch_for, KernelModules};
use crate::gpu::kernels::plan::{plan, GemmOut, KernelLaunch, Op};
use crate::gpu::kernels::Vendor;
use crate::gpu::nccl::{Flavor, Nccl};
use crate::gpu::peaks::{self, Peak};
use std::ffi::c_void;

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaRecord {
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

impl CudaRecord {
    pub fn fraction(&self) -> Option<f64> {
        self.peak.filter(|p| *p > 0.0).map(|p| self.achieved / p)
    }

    /// One JSON object; an unknown peak and fraction are `null`.
    pub fn json(&self) -> String {
        let opt = |v: Option<f64>, digits: usize| v.map_or("null".to_string(), |v| format!("{v:.digits$}"));
        format!(
            "{{\"bench\": \"{}\", \"device_kind\": \"{}\", \"shape\": \"{}\", \"dtype\": \"{}\", \"device\": \"{}\", \
             \"achieved\": {:.3}, \"unit\": \"{}\", \"peak\": {}, \"ratio\": {}, \"ms\": {:.4}, \"note\": \"{}\"}}",
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
pub fn format_records(records: &[CudaRecord], json: bool) -> String {
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

/// Bus bandwidth of an all-reduce of `bytes` taking `seconds` on `ranks` ranks, GB/s (nccl-tests).
pub fn allreduce_bus_gbs(bytes: usize, seconds: f64, ranks: usize) -> f64 {
    let n = ranks.max(1) as f64;
    bytes as f64 / seconds / 1e9 * 2.0 * (n - 1.0) / n
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

/// `(batch, seq, heads, head_dim)` of the attention sweep.
pub const ATTENTION_SHAPES: &[(usize, usize, usize, usize)] =
    &[(8, 1024, 12, 64), (4, 2048, 25, 64), (4, 2048, 16, 128), (2, 4096, 32, 128), (1, 8192, 32, 128)];

/// The GPU a single-process benchmark uses (device 0) and its peak.
struct Gpu {
    info: DeviceInfo,
    peak: Option<Peak>,
    arch: String,
}

fn open_gpu(driver: &Driver, command: &str) -> Result<Gpu> {
    if driver.device_count()? == 0 {
        return Err(Error::Usage(format!(
            "{command} needs an NVIDIA GPU: the driver ({}) sees no device",
            driver.path()
        )));
    }
    let info = driver.device_info(0)?;
    let arch = arch_for(info.compute_capability)?;
    Ok(Gpu { peak: peaks::lookup(&info.name), info, arch })
}

/// Times `launch` on `stream`: a warm-up of 3, then one timed launch to size the batch, then a
/// batch long enough to fill `min_seconds` (at least 3 launches). Returns ms per launch.
fn time_launches(
    driver: &Driver,
    stream: &Stream,
    min_seconds: f64,
    launch: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..3 {
        launch()?;
    }
    let (start, end) = (Event::new(driver, true)?, Event::new(driver, true)?);
    start.record(Some(stream))?;
    launch()?;
    end.record(Some(stream))?;
    end.synchronize()?;
    let once_ms = f64::from(start.elapsed_ms(&end)?).max(1e-3);
    let iterations = ((min_seconds * 1e3 / once_ms).ceil() as usize).clamp(3, 100_000);
    start.record(Some(stream))?;
    for _ in 0..iterations {
        launch()?;
    }
    end.record(Some(stream))?;
    end.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&end)?) / iterations as f64)
}

/// Launches `function` with `launch`'s geometry on `stream`; `params` point at the arguments.
fn launch_kernel(
    driver: &Driver,
    function: CuFunction,
    launch: &KernelLaunch,
    stream: &Stream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let c = &launch.config;
    // SAFETY: `params` holds one pointer per kernel argument, each to a value of the argument's
    // type that outlives the call (the driver copies them at launch); the geometry was checked
    // against the device's limits by `kernels::plan`; the stream belongs to the current context.
    let status = unsafe {
        driver.api.cuLaunchKernel(
            function,
            c.grid[0],
            c.grid[1],
            c.grid[2],
            c.block[0],
            c.block[1],
            c.block[2],
            c.shared_bytes,
            stream.handle,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }?;
    driver.check("cuLaunchKernel", status)
}

/// Deterministic bf16 values in [-1, 1).
fn bf16_values(len: usize, seed: u64) -> Vec<Bf16> {
    crate::bench_gemm::fill(len, seed).into_iter().map(Bf16::from_f32).collect()
}

/// `trident bench gemm --device cuda`: `gemm_fwd_bf16` (bf16 out, no epilogue) over `GEMM_SHAPES`.
pub fn gemm(min_seconds: f64, shapes: &[(usize, usize, usize)]) -> Result<Vec<CudaRecord>> {
    let command = "bench gemm --device cuda";
    let driver = crate::gpu::require_driver(command)?;
    let gpu = open_gpu(&driver, command)?;
    let modules = KernelModules::new(crate::gpu::cache::ModuleCache::at_default_root()?);
    let context = PrimaryContext::retain(&driver, 0)?;
    let image = modules.image("gemm_bf16.cu", &gpu.arch)?;
    let module = Module::load(&context, &image.bytes)?;
    let stream = Stream::non_blocking(&driver)?;
    let mut records = Vec::new();
    for &(m, n, k) in shapes {
        let launch = plan(
            &Op::GemmFwd { m, n, k, out: GemmOut::Bf16 },
            Vendor::Cuda,
            &gpu.info.limits,
            gpu.info.multiprocessors as u32,
        )?;
        let function = module.function(launch.spec.function)?;
        let a = bf16_values(m * k, 1);
        let w = bf16_values(n * k, 2);
        let (d_a, d_w) = (DeviceBuffer::alloc(&context, m * k * 2)?, DeviceBuffer::alloc(&context, n * k * 2)?);
        let d_out = DeviceBuffer::alloc(&context, m * n * 2)?;
        d_a.upload(bytemuck::cast_slice(&a))?;
        d_w.upload(bytemuck::cast_slice(&w))?;
        let (mut p_out, mut p_a, mut p_w, mut p_bias, mut p_residual) =
            (d_out.pointer, d_a.pointer, d_w.pointer, 0u64, 0u64);
        let (mut pm, mut pn, mut pk, mut gelu) = (m as i32, n as i32, k as i32, 0i32);
        let mut params: [*mut c_void; 9] = [
            (&mut p_out as *mut u64).cast(),
            (&mut p_a as *mut u64).cast(),
            (&mut p_w as *mut u64).cast(),
            (&mut p_bias as *mut u64).cast(),
            (&mut p_residual as *mut u64).cast(),
            (&mut pm as *mut i32).cast(),
            (&mut pn as *mut i32).cast(),
            (&mut pk as *mut i32).cast(),
            (&mut gelu as *mut i32).cast(),
        ];
        let ms = time_launches(&driver, &stream, min_seconds, &mut || {
            launch_kernel(&driver, function, &launch, &stream, &mut params)
        })?;
        stream.synchronize()?;
        let mut out = vec![Bf16(0); m * n];
        d_out.download(bytemuck::cast_slice_mut(&mut out))?;
        let worst = spot_check(&a, &w, &out, m, n, k);
        if worst > 1.0 {
            return Err(Error::Data(format!(
                "{command}: {} for {m}x{n}x{k} differs from the f64 reference by {worst:.2} x the bf16 tolerance",
                launch.spec.function
            )));
        }
        let tflops = gemm_flops(m, n, k) / (ms * 1e-3) / 1e12;
        records.push(CudaRecord {
            bench: "gemm",
            device_kind: "cuda",
            shape: format!("{m}x{n}x{k} NT"),
            dtype: "bf16",
            device: gpu.info.name.clone(),
            achieved: tflops,
            unit: "TFLOP/s",
            peak: gpu.peak.map(|p| p.bf16_tflops),
            ms,
            note: format!(
                "{}, grid {:?}, spot check {:.2} of tolerance",
                launch.spec.function, launch.config.grid, worst
            ),
        });
    }
    Ok(records)
}

/// The largest |out - ref| / (atol + 0.079 |ref|) over 64 sampled elements (≤ 1 passes).
fn spot_check(a: &[Bf16], w: &[Bf16], out: &[Bf16], m: usize, n: usize, k: usize) -> f64 {
    let mut worst = 0f64;
    for s in 0..64usize {
        let (i, j) = ((s * 7919) % m, (s * 104_729) % n);
        let reference: f64 = (0..k).map(|p| a[i * k + p].to_f32() as f64 * w[j * k + p].to_f32() as f64).sum();
        let got = out[i * n + j].to_f32() as f64;
        let atol = 1e-2 * (k as f64).sqrt() / 16.0;
        worst = worst.max((got - reference).abs() / (atol + 0.079 * reference.abs()));
    }
    worst
}

/// `trident bench attention --device cuda`: the causal forward over `ATTENTION_SHAPES`.
pub fn attention(min_seconds: f64, shapes: &[(usize, usize, usize, usize)]) -> Result<Vec<CudaRecord>> {
    let command = "bench attention --device cuda";
    let driver = crate::gpu::require_driver(command)?;
    let gpu = open_gpu(&driver, command)?;
    let modules = KernelModules::new(crate::gpu::cache::ModuleCache::at_default_root()?);
    let context = PrimaryContext::retain(&driver, 0)?;
    let image = modules.image("attention_fwd.cu", &gpu.arch)?;
    let module = Module::load(&context, &image.bytes)?;
    let stream = Stream::non_blocking(&driver)?;
    let mut records = Vec::new();
    for &(batch, seq, heads, head_dim) in shapes {
        let launch = plan(
            &Op::AttentionFwd { batch, seq, heads, head_dim },
            Vendor::Cuda,
            &gpu.info.limits,
            gpu.info.multiprocessors as u32,
        )?;
        let function = module.function(launch.spec.function)?;
        let rows = seq * batch;
        let qkv = bf16_values(rows * heads * 3 * head_dim, 3);
        let d_qkv = DeviceBuffer::alloc(&context, qkv.len() * 2)?;
        let d_out = DeviceBuffer::alloc(&context, rows * heads * head_dim * 2)?;
        let d_lse = DeviceBuffer::alloc(&context, batch * heads * seq * 4)?;
        d_qkv.upload(bytemuck::cast_slice(&qkv))?;
        let (mut p_out, mut p_lse, mut p_qkv) = (d_out.pointer, d_lse.pointer, d_qkv.pointer);
        let (mut pb, mut ps, mut ph) = (batch as i32, seq as i32, heads as i32);
        let mut params: [*mut c_void; 6] = [
            (&mut p_out as *mut u64).cast(),
            (&mut p_lse as *mut u64).cast(),
            (&mut p_qkv as *mut u64).cast(),
            (&mut pb as *mut i32).cast(),
            (&mut ps as *mut i32).cast(),
            (&mut ph as *mut i32).cast(),
        ];
        let ms = time_launches(&driver, &stream, min_seconds, &mut || {
            launch_kernel(&driver, function, &launch, &stream, &mut params)
        })?;
        stream.synchronize()?;
        records.push(CudaRecord {
            bench: "attention",
            device_kind: "cuda",
            shape: format!("b{batch} s{seq} h{heads} d{head_dim} causal"),
            dtype: "bf16",
            device: gpu.info.name.clone(),
            achieved: attention_flops(batch, seq, heads, head_dim) / (ms * 1e-3) / 1e12,
            unit: "TFLOP/s",
            peak: gpu.peak.map(|p| p.bf16_tflops),
            ms,
            note: format!("{}, grid {:?}", launch.spec.function, launch.config.grid),
        });
    }
    Ok(records)
}

/// The all-reduce sizes: powers of two from 1 KiB up to `max_bytes`, whole elements of `dtype`.
pub fn allreduce_sizes(max_bytes: usize) -> Vec<usize> {
    std::iter::successors(Some(1024usize), |b| b.checked_mul(2)).take_while(|&b| b <= max_bytes).collect()
}

/// `trident bench allreduce --device cuda`: NCCL sum all-reduce on every rank of the job (one GPU
/// per rank: the local rank's), out of place. Every rank returns the same records.
pub fn allreduce(
    rt: &Runtime,
    flavor: Flavor,
    dtype: Dtype,
    max_bytes: usize,
    min_seconds: f64,
) -> Result<Vec<CudaRecord>> {
    let command = "bench allreduce --device cuda";
    let driver = crate::gpu::require_driver(command)?;
    let ordinal = collectives::rank_device(rt, &driver, command)?;
    let info = driver.device_info(ordinal)?;
    let peak = peaks::lookup(&info.name);
    let context = PrimaryContext::retain(&driver, ordinal)?;
    let nccl = Nccl::load(flavor)?;
    let world = rt.group(&(0..rt.world_size).collect::<Vec<_>>());
    let comm = NcclComm::new(&nccl, &context, world.as_ref(), collectives::timeout()?)?;
    let sizes = allreduce_sizes(max_bytes);
    let largest = *sizes.last().ok_or_else(|| Error::flag("--max-size", max_bytes, "at least 1K"))?;
    let send = DeviceBuffer::alloc(&context, largest)?;
    let recv = DeviceBuffer::alloc(&context, largest)?;
    send.upload(&collectives::check_input(dtype, largest / dtype.bytes(), rt.world_rank, 0))?;
    let (start, end) = (Event::new(&driver, true)?, Event::new(&driver, true)?);
    let mut records = Vec::new();
    for bytes in sizes {
        let count = bytes / dtype.bytes();
        let run = |iterations: usize| -> Result<f64> {
            start.record(comm.cuda_stream())?;
            for _ in 0..iterations {
                comm.all_reduce(send.pointer, recv.pointer, count, dtype, ReduceOp::Sum)?;
            }
            end.record(comm.cuda_stream())?;
            comm.synchronize()?;
            Ok(f64::from(start.elapsed_ms(&end)?) / iterations as f64)
        };
        run(2)?;
        let once_ms = run(1)?.max(1e-3);
        // Every rank must issue the same number of collectives: agree on the largest count.
        let mut iterations = [((min_seconds * 1e3 / once_ms).ceil()).clamp(3.0, 10_000.0)];
        world.all_reduce(&mut iterations, ReduceOp::Max);
        let mut ms = [run(iterations[0] as usize)?];
        world.all_reduce(&mut ms, ReduceOp::Max);
        let busbw = allreduce_bus_gbs(bytes, ms[0] * 1e-3, rt.world_size);
        records.push(CudaRecord {
            bench: "allreduce",
            device_kind: "cuda",
            shape: format!("{} on {} ranks", human_bytes(bytes), rt.world_size),
            dtype: if dtype == Dtype::Bf16 { "bf16" } else { "f32" },
            device: info.name.clone(),
            achieved: busbw,
            unit: "GB/s bus",
            peak: peak.map(|p| p.nvlink_gbs),
            ms: ms[0],
            note: format!("{} {}, algbw {:.2} GB/s", comm.api(), nccl.version()?, bytes as f64 / (ms[0] * 1e-3) / 1e9),
        });
    }
    Ok(records)
}

/// `trident bench allreduce --device hip`: RCCL's sum all-reduce on the HIP runtime's streams on
/// every rank (one GPU per rank: the local rank's), out of place, timed on the host from the
/// first enqueue to the communicator's stream being idle. There is no datasheet peak for AMD's
/// GPU-to-GPU links here, so each size is compared with the baseline a run would otherwise take,
/// `--gpu-collectives mpi`: the same all-reduce staged through host memory (copy out, MPI, copy
/// in), measured in the same process. Every rank returns the same records.
pub fn allreduce_hip(rt: &Runtime, dtype: Dtype, max_bytes: usize, min_seconds: f64) -> Result<Vec<CudaRecord>> {
    use crate::gpu::runtime::GpuRuntime;
    let command = "bench allreduce --device hip";
    let hip = crate::gpu::hip::Hip::load().map_err(|e| Error::Usage(format!("{command} needs an AMD GPU: {e}")))?;
    let rccl = collectives::RcclOnHip::open(rt, hip, command)?;
    let (device, world, nccl, comm) = (&rccl.device, rccl.world.as_ref(), &rccl.nccl, rccl.comm()?);
    let sizes = allreduce_sizes(max_bytes);
    let largest = *sizes.last().ok_or_else(|| Error::flag("--max-size", max_bytes, "at least 1K"))?;
    let (send, recv) = (device.alloc(largest)?, device.alloc(largest)?);
    let input = collectives::check_input(dtype, largest / dtype.bytes(), rt.world_rank, 0);
    device.copy_to_device(send, &input)?;
    let mut host = vec![0u8; largest];
    let mut records = Vec::new();
    let result = (|| -> Result<()> {
        for bytes in sizes {
            let count = bytes / dtype.bytes();
            // Milliseconds per all-reduce over `iterations`, the slowest rank's.
            let timed = |iterations: usize, host: &mut Vec<u8>, staged: bool| -> Result<f64> {
                world.barrier();
                let t = std::time::Instant::now();
                for _ in 0..iterations {
                    if staged {
                        device.copy_to_host(&mut host[..bytes], send)?;
                        world.all_reduce_bytes(&mut host[..bytes], dtype, ReduceOp::Sum);
                        device.copy_to_device(recv, &host[..bytes])?;
                    } else {
                        comm.after_compute(None)?;
                        comm.all_reduce(send, recv, count, dtype, ReduceOp::Sum)?;
                    }
                }
                comm.synchronize()?;
                let mut ms = [t.elapsed().as_secs_f64() * 1e3 / iterations as f64];
                world.all_reduce(&mut ms, ReduceOp::Max);
                Ok(ms[0])
            };
            let mut measure = |staged: bool| -> Result<f64> {
                timed(2, &mut host, staged)?;
                let once_ms = timed(1, &mut host, staged)?.max(1e-3);
                // Every rank issues the same count: the timings above are already the maximum.
                let iterations = ((min_seconds * 1e3 / once_ms).ceil()).clamp(3.0, 10_000.0) as usize;
                timed(iterations, &mut host, staged)
            };
            let ms = measure(false)?;
            let staged_ms = measure(true)?;
            let (busbw, staged_busbw) = (
                allreduce_bus_gbs(bytes, ms * 1e-3, rt.world_size),
                allreduce_bus_gbs(bytes, staged_ms * 1e-3, rt.world_size),
            );
            records.push(CudaRecord {
                bench: "allreduce",
                device_kind: "hip",
                shape: format!("{} on {} ranks", human_bytes(bytes), rt.world_size),
                dtype: if dtype == Dtype::Bf16 { "bf16" } else { "f32" },
                device: rccl.name.clone(),
                achieved: busbw,
                unit: "GB/s bus",
                peak: None,
                ms,
                note: format!(
                    "{} {}, {:.2} x the host-staged MPI path ({staged_busbw:.3} GB/s bus, {staged_ms:.4} ms)",
                    comm.api(),
                    nccl.version()?,
                    busbw / staged_busbw.max(1e-12)
                ),
            });
        }
        Ok(())
    })();
    device.free(send, largest);
    device.free(recv, largest);
    result.map(|_| records)
}

fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(peak: Option<f64>) -> CudaRecord {
        CudaRecord {
            bench: "gemm",
            device_kind: "cuda",
            shape: "4096x4096x4096 NT".into(),
            dtype: "bf16",
            device: "NVIDIA A100-SXM4-80GB".into(),
            achieved: 156.0,
            unit: "TFLOP/s",
            peak,
            ms: 0.881,
            note: "gemm_fwd_bf16".into(),
        }
    }

    #[test]
    fn flops_and_bus_bandwidth_follow_their_definitions() {
        assert_eq!(gemm_flops(2, 3, 4), 48.0);
        // 8 x 1024 x 12 x 64 causal: 4 · b · h · s² · d / 2.
        assert_eq!(attention_flops(8, 1024, 12, 64), 4.0 * 8.0 * 12.0 * 1024.0 * 1024.0 * 64.0 / 2.0);
        // 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
        assert!((allreduce_bus_gbs(1_000_000_000, 0.01, 8) - 175.0).abs() < 1e-9);
        assert_eq!(allreduce_bus_gbs(1 << 20, 1.0, 1), 0.0);
        assert_eq!(allreduce_sizes(4096), [1024, 2048, 4096]);
        assert_eq!(allreduce_sizes(5000), [1024, 2048, 4096]);
        assert!(allreduce_sizes(1000).is_empty());
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(3 << 10), "3 KiB");
    }

    #[test]
    fn records_report_the_fraction_of_peak_or_say_there_is_none() {
        let r = record(Some(312.0));
        assert_eq!(r.fraction(), Some(0.5));
        let j = r.json();
        assert!(
            j.contains("\"peak\": 312.0") && j.contains("\"ratio\": 0.5000") && j.contains("\"unit\": \"TFLOP/s\""),
            "{j}"
        );
        let table = format_records(&[r], false);
        assert!(table.starts_with("device: NVIDIA A100-SXM4-80GB (peaks from the datasheet table)\n"), "{table}");
        assert!(table.lines().nth(2).unwrap().contains("50.0%"), "{table}");
        let unknown = record(None);
        assert_eq!(unknown.fraction(), None);
        assert!(unknown.json().contains("\"peak\": null, \"ratio\": null"), "{}", unknown.json());
        let table = format_records(&[unknown], false);
        assert!(table.contains("not in the peak table") && !table.contains('%'), "{table}");
        assert_eq!(format_records(&[record(Some(1.0)), record(None)], true).lines().count(), 2);
    }

    #[test]
    fn every_sweep_shape_plans_on_an_a100_and_an_h100() {
        use crate::gpu::launch::DeviceLimits;
        for limits in [DeviceLimits::A100, DeviceLimits::H100] {
            for &(m, n, k) in GEMM_SHAPES {
                let l = plan(&Op::GemmFwd { m, n, k, out: GemmOut::Bf16 }, Vendor::Cuda, &limits, 108).unwrap();
                assert_eq!(l.config.grid, [n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1]);
            }
            for &(batch, seq, heads, head_dim) in ATTENTION_SHAPES {
                let l = plan(&Op::AttentionFwd { batch, seq, heads, head_dim }, Vendor::Cuda, &limits, 108).unwrap();
                assert_eq!(l.config.grid, [seq.div_ceil(64) as u32, (batch * heads) as u32, 1]);
            }
        }
    }

    #[test]
    fn the_spot_check_accepts_exact_products_and_rejects_wrong_ones() {
        let (m, n, k) = (3, 2, 4);
        let a = bf16_values(m * k, 5);
        let w = bf16_values(n * k, 6);
        let exact: Vec<Bf16> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                Bf16::from_f32((0..k).map(|p| a[i * k + p].to_f32() * w[j * k + p].to_f32()).sum())
            })
            .collect();
        assert!(spot_check(&a, &w, &exact, m, n, k) <= 1.0);
        let mut wrong = exact.clone();
        for x in wrong.iter_mut() {
            *x = Bf16::from_f32(x.to_f32() * 1.5 + 0.5);
        }
        assert!(spot_check(&a, &w, &wrong, m, n, k) > 1.0);
    }
}
