//! The process-level view of a run: which rank this is, how many there are, how many share this
//! node, the CPUs this process may use, and how to build the communicator of a group of ranks.
//! With MPI (the default build) the launcher decides; without a launcher, or in a build without
//! MPI, it is one rank.

use super::{Comm, SelfComm};
use crate::error::Error;

/// Environment variables through which launchers announce the job size, in the order they are
/// trusted: Open MPI's mpirun, MPICH's hydra and Cray PALS (`PMI_SIZE`), PMIx launchers, and
/// Slurm's srun. Slurm's is the step's own count, `SLURM_STEP_NUM_TASKS`, which only an srun step
/// sets; `SLURM_NTASKS` is not used, because mpirun or mpiexec inside a batch script hands every
/// rank the allocation's count (4 for a `mpirun -n 2` in an `sbatch -n 4` job). A launcher nested
/// inside an srun step (mpirun starting its daemons with srun) sets its own variable, which is
/// found first.
const LAUNCHER_SIZE_VARS: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
    ("PMIX_SIZE", "PMIX_RANK"),
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
];

pub struct Runtime {
    pub world_rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    /// More ranks on this node than it has cores: collectives yield while they wait.
    pub oversubscribed: bool,
    /// The MPI library this binary runs with, or a note that it has none.
    pub library: String,
    #[cfg(feature = "mpi")]
    mpi: Option<super::mpi::MpiWorld>,
}

fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// The CPUs this process may use, and so its default thread count: `SLURM_CPUS_PER_TASK` when it
/// is set to a positive integer, else the CPUs in this process's affinity mask, else what the
/// standard library reports, and never less than one.
pub fn process_cpus() -> usize {
    if let Ok(value) = std::env::var("SLURM_CPUS_PER_TASK") {
        if let Ok(count) = value.trim().parse::<usize>() {
            if count >= 1 {
                return count;
            }
        }
    }
    if let Some(count) = affinity_cpu_count() {
        return count;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(target_os = "linux")]
fn affinity_cpu_count() -> Option<usize> {
    // SAFETY: `cpu_set_t` is plain bits, so all-zero is a valid empty set; the kernel writes at
    // most `size_of::<cpu_set_t>()` bytes into it, and CPU_COUNT only reads it.
    let count = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        libc::CPU_COUNT(&set)
    };
    usize::try_from(count).ok().filter(|&n| n >= 1)
}

#[cfg(not(target_os = "linux"))]
fn affinity_cpu_count() -> Option<usize> {
    None
}

/// The job size a launcher announced in the environment, if any, and this process's rank in it.
fn launcher_job(env: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, usize, usize)> {
    LAUNCHER_SIZE_VARS.iter().find_map(|(size_var, rank_var)| {
        let size: usize = env(size_var)?.trim().parse().ok()?;
        let rank = env(rank_var).and_then(|r| r.trim().parse().ok()).unwrap_or(0);
        Some((*size_var, size, rank))
    })
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Checks the world MPI built against the size the launcher announced. A mismatch means the
/// ranks do not form one job: a binary started by another MPI's launcher (or srun with the wrong
/// `--mpi` plugin) runs as N silent singletons, each training alone. Returns the error and
/// whether this process should print it (the launcher's rank 0, so the job shows it once).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn check_world(
    size: usize,
    library: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<(), (Error, bool)> {
    let Some((var, job_size, job_rank)) = launcher_job(env) else { return Ok(()) };
    if job_size == size {
        return Ok(());
    }
    let err = if size == 1 {
        Error::Usage(format!(
            "the launcher started {job_size} processes ({var}={job_size}) but MPI sees each as a world \
             of 1: this binary is linked against {library} and was started by a different MPI's launcher; \
             use the mpirun/mpiexec of the same MPI (or srun with the matching --mpi plugin)"
        ))
    } else {
        Error::Usage(format!(
            "the launcher announced {job_size} processes ({var}={job_size}) but MPI's world has {size}: \
             the ranks do not form the job the launcher started (a nested or mismatched launcher); \
             start the binary directly with one mpirun/mpiexec/srun"
        ))
    };
    Err((err, job_rank == 0))
}

impl Runtime {
    /// One process, no MPI.
    pub fn single() -> Runtime {
        Runtime {
            world_rank: 0,
            world_size: 1,
            local_rank: 0,
            local_size: 1,
            oversubscribed: false,
            library: "none (single process)".into(),
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// Initialises MPI when this build has it, and checks that the launcher and the library
    /// agree on the job size: a binary started by another MPI's launcher runs as N silent
    /// singletons, which is reported here instead. The error is printed by the launcher's rank 0
    /// only (`Err(None)` on the others), so the job shows it once.
    pub fn init() -> std::result::Result<Runtime, Option<Error>> {
        #[cfg(feature = "mpi")]
        {
            let Some(world) = super::mpi::MpiWorld::init() else {
                return Err(Some(Error::Usage("MPI was already initialised".into())));
            };
            use mpi::topology::Communicator;
            let (rank, size) = (world.world.rank() as usize, world.world.size() as usize);
            if let Err((err, print)) = check_world(size, &world.library, &process_env) {
                // With a real world of several ranks, MPI's rank 0 prints, not the launcher's.
                let print = if size > 1 { rank == 0 } else { print };
                return Err(print.then_some(err));
            }
            let (local_rank, local_size) = world.local();
            let library = world.library.clone();
            Ok(Runtime {
                world_rank: rank,
                world_size: size,
                local_rank,
                local_size,
                oversubscribed: local_size > online_cpus(),
                library,
                mpi: Some(world),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            if let Some((var, job_size, job_rank)) = launcher_job(&process_env).filter(|j| j.1 > 1) {
                let err = Error::Unsupported(format!(
                    "started as one of {job_size} processes ({var}={job_size}), but this binary was built without \
                     MPI (cargo --no-default-features); rebuild with the default features to run on many ranks"
                ));
                return Err((job_rank == 0).then_some(err));
            }
            Ok(Runtime::single())
        }
    }

    /// CPU threads a rank should use by default: its affinity mask, shared fairly with the other
    /// ranks on the node.
    pub fn default_threads(&self) -> usize {
        let fair = (online_cpus() / self.local_size.max(1)).max(1);
        process_cpus().min(fair).max(1)
    }

    /// The communicator of the group `ranks` (world ranks, in group order) that contains this
    /// rank. Collective over the world: every rank calls it for its own group, in the same order.
    pub fn group(&self, ranks: &[usize]) -> Box<dyn Comm> {
        debug_assert!(ranks.contains(&self.world_rank));
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &self.mpi {
            // MPI's split is collective over the world even for groups of one.
            let color = *ranks.iter().min().expect("a group has ranks");
            let key = ranks.iter().position(|&r| r == self.world_rank).expect("this rank is in its group");
            let comm = mpi.split(color, key);
            if ranks.len() > 1 {
                return Box::new(super::mpi::MpiComm::new(comm, self.oversubscribed));
            }
        }
        let _ = ranks;
        Box::new(SelfComm)
    }

    /// The MPI library's own blocking all-reduce on the world (the baseline of the comm
    /// benchmarks); None without MPI.
    pub fn library_all_reduce(&self, send: &[f32], recv: &mut [f32]) -> Option<()> {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &self.mpi {
            mpi.library_all_reduce(send, recv);
            return Some(());
        }
        let _ = (send, recv);
        None
    }

    /// Ends the whole job now: used when one rank fails alone, where returning would leave the
    /// others waiting in a collective forever. With several ranks MPI_Abort ends every one (this
    /// one too: it does not return); alone, it is the exit status `code` for `main` to return.
    pub fn abort(&self, code: u8) -> std::process::ExitCode {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &self.mpi {
            if self.world_size > 1 {
                mpi.abort(code.into());
            }
        }
        std::process::ExitCode::from(code)
    }
}

impl Error {
    /// Whether every rank detects this error identically (flags, layouts, shared files), so rank
    /// 0 alone can print it and all ranks can exit normally.
    pub fn is_collective(&self) -> bool {
        matches!(self, Error::Flag { .. } | Error::Usage(_) | Error::Config(_) | Error::Unsupported(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_runtime_has_one_rank_and_self_groups() {
        let rt = Runtime::single();
        assert_eq!((rt.world_rank, rt.world_size), (0, 1));
        assert_eq!(rt.group(&[0]).size(), 1);
        assert!(rt.default_threads() >= 1);
    }

    #[test]
    fn process_cpus_is_positive() {
        assert!(process_cpus() >= 1);
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn world_check_catches_singletons_and_mismatches() {
        // MPICH started by srun --mpi=pmix: each of 4 processes is a world of 1.
        let e = check_world(1, "MPICH", &env_of(&[("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_PROCID", "2")])).unwrap_err();
        assert!(e.0.to_string().contains("SLURM_STEP_NUM_TASKS=4") && e.0.to_string().contains("world of 1"));
        assert!(!e.1, "only the launcher's rank 0 prints");
        let e = check_world(2, "Open MPI", &env_of(&[("PMI_SIZE", "4"), ("PMI_RANK", "0")])).unwrap_err();
        assert!(e.0.to_string().contains("PMI_SIZE=4") && e.0.to_string().contains("world has 2") && e.1);
        assert!(check_world(4, "Open MPI", &env_of(&[("OMPI_COMM_WORLD_SIZE", "4")])).is_ok());
        assert!(check_world(1, "Open MPI", &env_of(&[])).is_ok());
    }

    #[test]
    fn mpirun_inside_sbatch_is_judged_by_its_own_variables() {
        // The batch step's SLURM_NTASKS=4 is inherited by the 2 ranks of `mpirun -n 2`: not a
        // mismatch. Open MPI's own variable is trusted first.
        let env = env_of(&[("SLURM_NTASKS", "4"), ("SLURM_PROCID", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert!(check_world(2, "Open MPI", &env).is_ok());
        // Multi-node mpirun starts its daemons with srun: the ranks see that step's count (the
        // node count), but mpirun's variable wins.
        let env = env_of(&[("SLURM_STEP_NUM_TASKS", "2"), ("OMPI_COMM_WORLD_SIZE", "8")]);
        assert!(check_world(8, "Open MPI", &env).is_ok());
    }
}
