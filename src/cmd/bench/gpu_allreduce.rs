//! `trident bench allreduce --device cuda|hip`: all-reduce through NCCL (`NcclComm`) on every
//! rank of the job, one GPU per rank, sizes doubling from 1 KiB to `--max-size`, timed with events
//! on the communication stream; the slowest rank's time counts, and bus bandwidth is nccl-tests'
//! `algbw · 2(n-1)/n`, compared with the NVLink bandwidth per direction. On AMD, RCCL on HIP
//! streams against the host-staged MPI path (`allreduce_hip`). Records as the kernel benches'
//! (`gpu::GpuRecord`).

use super::gpu::GpuRecord;
use crate::comm::runtime::Runtime;
use crate::comm::{Dtype, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::collectives::{self, NcclComm};
use crate::gpu::driver::{DeviceBuffer, Event, PrimaryContext};
use crate::gpu::nccl::{Flavor, Nccl};
use crate::gpu::peaks;
use crate::gpu::runtime::VendorRuntime;

/// Bus bandwidth of an all-reduce of `bytes` taking `seconds` on `ranks` ranks, GB/s (nccl-tests).
pub fn allreduce_bus_gbs(bytes: usize, seconds: f64, ranks: usize) -> f64 {
    let n = ranks.max(1) as f64;
    bytes as f64 / seconds / 1e9 * 2.0 * (n - 1.0) / n
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
) -> Result<Vec<GpuRecord>> {
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
        records.push(GpuRecord {
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
pub fn allreduce_hip(rt: &Runtime, dtype: Dtype, max_bytes: usize, min_seconds: f64) -> Result<Vec<GpuRecord>> {
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
            records.push(GpuRecord {
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

    #[test]
    fn bus_bandwidth_and_sizes_follow_their_definitions() {
        // 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
        assert!((allreduce_bus_gbs(1_000_000_000, 0.01, 8) - 175.0).abs() < 1e-9);
        assert_eq!(allreduce_bus_gbs(1 << 20, 1.0, 1), 0.0);
        assert_eq!(allreduce_sizes(4096), [1024, 2048, 4096]);
        assert_eq!(allreduce_sizes(5000), [1024, 2048, 4096]);
        assert!(allreduce_sizes(1000).is_empty());
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(3 << 10), "3 KiB");
    }
}
