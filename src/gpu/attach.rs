//! The GPU Device's collectives for a training run (`CollectiveOps::attach_collectives`, through the
//! maker `training.rs` gives the Device): `--gpu-collectives nccl|rccl` loads the library once every
//! rank agrees it could, then makes a `DeviceNccl` for each group that moves tensors and the
//! `PipelineNccl` links, on the CUDA driver's or the HIP runtime's streams.

use super::collectives::{DeviceNccl, StreamApi};
use super::device::{group_key, GpuDevice};
use super::nccl::{Flavor, Nccl};
use super::pipeline_nccl::PipelineNccl;
use crate::comm::ReduceOp;
use crate::device::{CollectiveLibrary, CollectivesRequest};
use crate::error::{Error, Result};

/// `--gpu-collectives nccl|rccl` on the GPU Device, with streams made by `api` (the CUDA driver,
/// or the HIP runtime for RCCL on AMD): loads the library (every rank agrees that it could before
/// any communicator is made), then creates, eagerly and in the same order on every rank, one
/// communicator for each of this rank's groups that moves tensors (tensor parallel, the
/// tied-embedding pair, data parallel x depth, the gradient norm's group) and has more than one
/// rank, and the pipeline links.
/// Returns the start-up line saying which path the collectives take.
pub fn attach_collectives(
    dev: &mut GpuDevice,
    api: StreamApi<'static>,
    request: &CollectivesRequest,
) -> Result<String> {
    let flavor = match request.library {
        CollectiveLibrary::Mpi => {
            return Ok("collectives: MPI, device buffers staged through host memory (--gpu-collectives mpi)".into())
        }
        CollectiveLibrary::Rccl => Flavor::Rccl,
        CollectiveLibrary::Nccl => Flavor::Nccl,
    };
    let world = request.world;
    if world.size() == 1 {
        return Ok("collectives: none (one rank)".into());
    }
    let loaded = Nccl::load(flavor);
    let mut failed = [f64::from(u8::from(loaded.is_err()))];
    world.all_reduce(&mut failed, ReduceOp::Sum);
    let flag = format!("--gpu-collectives {}", request.library.name());
    let nccl = match loaded {
        Err(e) => {
            return Err(Error::Usage(format!("{flag}: {e}; or move tensors through MPI with --gpu-collectives mpi")))
        }
        Ok(_) if failed[0] > 0.0 => {
            return Err(Error::Usage(format!(
                "{flag}: {} rank(s) could not load {}; or move tensors through MPI with --gpu-collectives mpi",
                failed[0],
                flavor.api()
            )))
        }
        Ok(n) => n,
    };
    let describe = format!("{} {} ({})", flavor.api(), nccl.version().unwrap_or_default(), nccl.path());
    // The library table lives as long as the process (the communicators borrow it).
    let nccl: &'static Nccl = Box::leak(Box::new(nccl));
    let mut comms = Vec::new();
    let mut names = Vec::new();
    for (name, group) in request.groups {
        if group.size() > 1 {
            let c = DeviceNccl::new(nccl, api, group)
                .map_err(|e| Error::Comm(format!("{flag}: creating the communicator of the {name} group: {e}")))?;
            comms.push((group_key(group), c));
            names.push(name);
        }
    }
    dev.attach_comms(comms);
    if request.pipeline.size() > 1 {
        // NCCL delivers one link's messages in the order they were sent (MPI matched them by
        // tag); the caller checked that this run's schedule keeps that order on every stage.
        let links = PipelineNccl::new(nccl, api, request.pipeline, request.pipeline_links)
            .map_err(|e| Error::Comm(format!("{flag}: {e}")))?;
        names.push("pipeline p2p");
        dev.attach_p2p(links);
    }
    Ok(format!(
        "collectives: {describe} on device memory for the {} group(s) (--gpu-collectives {}); \
         2-D SUMMA and the logged loss's sums through MPI on host memory",
        if names.is_empty() { "no multi-rank".to_string() } else { names.join(", ") },
        request.library.name()
    ))
}
