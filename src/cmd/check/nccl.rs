//! `trident check nccl` and `trident check nccl-id`, on every rank of an MPI job. `check nccl`:
//! an NCCL (or RCCL) communicator over the world runs every collective of `check_cases` on device
//! memory (`gpu::collectives::run_on_device`) and compares it bit for bit with the same op through
//! MPI on host memory (`run_on_host`), on the CUDA driver's streams or, for RCCL on an AMD node,
//! on the HIP runtime's. `check nccl-id`: rank 0's NCCL unique id reaches every rank intact.

use crate::cmd::{comm_library, end_after_gpu_comm_error, flags};
use crate::comm::runtime::Runtime;
use crate::comm::{Bf16, Comm, Dtype, ReduceOp, F16};
use crate::error::{Error, Result};
use crate::gpu::collectives::{
    check_input, rank_device, run_on_device, run_on_host, timeout, Collective, NcclComm, RcclOnHip,
};
use crate::gpu::runtime::VendorRuntime;
use crate::gpu::driver::{DeviceBuffer, Driver, PrimaryContext};
use crate::gpu::hip::Hip;
use crate::gpu::nccl::{exchange_unique_id, Flavor, Nccl, UNIQUE_ID_BYTES};
use std::process::ExitCode;
use crate::flags::CHECK_NCCL_FLAGS;

/// `trident check nccl`: every collective through NCCL/RCCL on device memory against MPI.
pub fn run(rt: &Runtime, rest: &[String]) -> ExitCode {
    let result = crate::error::catch_failure(|| -> Result<Option<String>> {
        let Some(a) = flags("check nccl", "NCCL collectives on device memory against MPI", CHECK_NCCL_FLAGS, rest)?
        else {
            return Ok(None);
        };
        check(rt, comm_library(&a)?).map(Some)
    });
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

/// On every rank of the job, an NCCL (or RCCL) communicator over the world
/// runs every case of `check_cases` on device memory, ordered after the legacy default stream (the
/// Device's compute stream) with events,
/// and the result is compared bit for bit with the same op through MPI on host memory. Returns
/// the report line. RCCL runs on the HIP runtime's streams when the node has no CUDA driver but a
/// HIP runtime (an AMD node), else on the CUDA driver's.
fn check(rt: &Runtime, flavor: Flavor) -> Result<String> {
    if flavor == Flavor::Rccl {
        if let Err(cuda) = Driver::load() {
            return match Hip::load() {
                Ok(hip) => check_on_hip(rt, hip),
                Err(hip) => Err(Error::Usage(format!(
                    "check nccl (RCCL) needs a GPU: no CUDA driver ({cuda}) and no usable HIP runtime ({hip})"
                ))),
            };
        }
    }
    let driver = crate::gpu::require_driver(&format!("check nccl ({})", flavor.api()))?;
    let ordinal = rank_device(rt, &driver, "check nccl")?;
    let context = PrimaryContext::retain(&driver, ordinal)?;
    let nccl = Nccl::load(flavor)?;
    let world = rt.group(&(0..rt.world_size).collect::<Vec<_>>());
    let comm = NcclComm::new(&nccl, &context, world.as_ref(), timeout()?)?;
    let cases = compare_cases(rt, world.as_ref(), &comm, &mut |case, send, recv_bytes| {
        let d_send = DeviceBuffer::alloc(&context, send.len())?;
        let d_recv = DeviceBuffer::alloc(&context, recv_bytes)?;
        // Synchronous copies from pageable memory return before their bytes land; they land in
        // the order of the legacy default stream, which the collective is ordered after (as the
        // Device's are). Ordered after a non-blocking stream of its own instead, on an H100 the
        // all-reduce once read the receive buffer's fill pattern.
        d_send.upload(send)?;
        d_recv.upload(&vec![0xA5u8; recv_bytes])?;
        comm.after_compute(None)?;
        run_on_device(&comm, case, d_send.pointer, d_recv.pointer)?;
        comm.before_compute(None)?;
        comm.synchronize()?;
        let mut got = vec![0u8; recv_bytes];
        d_recv.download(&mut got)?;
        Ok(got)
    })?;
    check_report(rt, cases, &nccl)
}

/// The collectives `trident check nccl` compares: every op in f32, bf16 and binary16 (the
/// storage types of `--bf16` and `--fp16`), sizes from one element to more than a megabyte,
/// ragged ones among them.
fn check_cases(ranks: usize) -> Vec<Collective> {
    let mut cases = Vec::new();
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for count in [1, 1000 + 3, 300_000] {
            cases.push(Collective::AllReduce { count, dtype, op: ReduceOp::Sum });
            cases.push(Collective::AllGather { send_count: count, dtype });
            cases.push(Collective::ReduceScatter { recv_count: count, dtype });
            cases.push(Collective::Broadcast { count, dtype, root: ranks - 1 });
            cases.push(Collective::RingSendRecv { count, dtype });
            cases.push(Collective::AllToAll { count, dtype });
        }
    }
    cases.push(Collective::AllReduce { count: 4099, dtype: Dtype::F32, op: ReduceOp::Max });
    cases
}

/// `check` with RCCL on the HIP runtime (the HIP Device's null stream as the compute stream).
fn check_on_hip(rt: &Runtime, hip: Hip) -> Result<String> {
    let rccl = RcclOnHip::open(rt, hip, "check nccl")?;
    let (device, world, comm) = (&rccl.device, rccl.world.as_ref(), rccl.comm()?);
    let cases = compare_cases(rt, world, &comm, &mut |case, send, recv_bytes| {
        let (d_send, d_recv) = (device.alloc(send.len().max(1))?, device.alloc(recv_bytes.max(1))?);
        let result = (|| {
            device.copy_to_device(d_send, send)?;
            device.copy_to_device(d_recv, &vec![0xA5u8; recv_bytes])?;
            comm.after_compute(None)?;
            run_on_device(&comm, case, d_send, d_recv)?;
            comm.before_compute(None)?;
            comm.synchronize()?;
            device.synchronize()?;
            let mut got = vec![0u8; recv_bytes];
            device.copy_to_host(&mut got, d_recv)?;
            Ok(got)
        })();
        device.free(d_send, send.len().max(1));
        device.free(d_recv, recv_bytes.max(1));
        result
    })?;
    check_report(rt, cases, &rccl.nccl)
}

/// One check case on device memory: the case, this rank's input bytes, the result's byte count ->
/// the result.
type OnDevice<'a> = dyn FnMut(&Collective, &[u8], usize) -> Result<Vec<u8>> + 'a;

/// Runs every case of `check_cases` through `on_device` (the case, this rank's input bytes, the
/// result's byte count -> the result) and compares it with MPI on host memory. Returns the number
/// of cases.
fn compare_cases(rt: &Runtime, world: &dyn Comm, comm: &NcclComm, on_device: &mut OnDevice) -> Result<usize> {
    let cases = check_cases(rt.world_size);
    for (salt, case) in cases.iter().enumerate() {
        let (send_count, recv_count) = case.counts(rt.world_size);
        let bytes = case.dtype().bytes();
        let send = check_input(case.dtype(), send_count, rt.world_rank, salt);
        let got = on_device(case, &send, recv_count * bytes)?;
        let mut want = vec![0u8; recv_count * bytes];
        run_on_host(world, case, &send, &mut want);
        if let Some(at) = (0..recv_count).find(|&i| got[i * bytes..(i + 1) * bytes] != want[i * bytes..(i + 1) * bytes])
        {
            return Err(Error::Comm(format!(
                "{} {} on rank {}: element {at} is {} but MPI gives {}",
                comm.api(),
                case.name(),
                rt.world_rank,
                show(case.dtype(), &got[at * bytes..(at + 1) * bytes]),
                show(case.dtype(), &want[at * bytes..(at + 1) * bytes])
            )));
        }
    }
    Ok(cases.len())
}

fn check_report(rt: &Runtime, cases: usize, nccl: &Nccl) -> Result<String> {
    Ok(format!(
        "nccl check: {} collectives on device memory equal MPI's bit for bit on each of {} ranks ({} {}, {})",
        cases,
        rt.world_size,
        nccl.flavor.api(),
        nccl.version()?,
        nccl.path()
    ))
}

fn show(dtype: Dtype, b: &[u8]) -> String {
    match dtype {
        Dtype::F32 => format!("{}", f32::from_le_bytes(b.try_into().expect("4 bytes"))),
        Dtype::F64 => format!("{}", f64::from_le_bytes(b.try_into().expect("8 bytes"))),
        Dtype::Bf16 => format!("{} (bf16)", Bf16(u16::from_le_bytes(b.try_into().expect("2 bytes"))).to_f32()),
        Dtype::F16 => format!("{} (f16)", F16(u16::from_le_bytes(b.try_into().expect("2 bytes"))).to_f32()),
    }
}

/// `trident check nccl-id`: the report line on rank 0. Rank 0's own failure is printed there; the
/// others only learn that it failed.
pub fn run_id(rt: &Runtime) -> ExitCode {
    match check_id(rt) {
        Ok(line) => {
            if rt.world_rank == 0 {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(Error::Comm(m)) if rt.world_rank != 0 && m.starts_with("rank 0 could not") => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("trident: error: {e}");
            rt.abort(1)
        }
    }
}

/// Rank 0 creates an NCCL unique id, the Comm seam broadcasts it, and
/// every rank's copy is gathered back to rank 0 and compared.
fn check_id(rt: &Runtime) -> Result<String> {
    let world = rt.group(&(0..rt.world_size).collect::<Vec<_>>());
    let mut nccl = None;
    let id = exchange_unique_id(world.as_ref(), || {
        let lib = Nccl::load(Flavor::Nccl)?;
        let id = lib.unique_id()?;
        nccl = Some(lib);
        Ok(id)
    })?;
    let mut all = vec![0u8; UNIQUE_ID_BYTES * rt.world_size];
    world.all_gather_bytes(&id.internal, &mut all, Dtype::F32);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cases_cover_every_op_and_broadcast_from_the_last_rank() {
        let cases = check_cases(4);
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            assert!(cases.iter().any(|c| matches!(c, Collective::RingSendRecv { dtype: d, .. } if *d == dtype)));
            assert!(cases.iter().any(|c| matches!(c, Collective::AllToAll { dtype: d, .. } if *d == dtype)));
            let sums = cases.iter().filter(|c| matches!(c, Collective::AllReduce { dtype: d, .. } if *d == dtype));
            assert_eq!(sums.count(), 3 + usize::from(dtype == Dtype::F32), "{dtype:?}");
        }
        assert_eq!(cases.len(), 55);
        assert!(cases.iter().all(|c| !matches!(c, Collective::Broadcast { root, .. } if *root != 3)));
    }
}
