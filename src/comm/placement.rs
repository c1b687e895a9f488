//! Device placement: which GPU a rank drives, decided from the node-local rank (MPI's
//! shared-memory split, with the launchers' variables only as a cross-check) and the visibility
//! variables (`CUDA_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, an optional
//! `TRIDENT_GPU_ORDER` reorder). One function decides for every backend, and `trident train`
//! prints its answer as one `placement:` line per rank, so job scripts can be checked on machines
//! without a GPU backend.
//!
//! The rules (docs/design.md, Placing ranks on a node):
//! - the local rank is MPI's: under `mpirun`/`mpiexec` inside a Slurm job every rank inherits the
//!   batch step's `SLURM_LOCALID=0`, so an environment variable that disagrees is reported, never
//!   used;
//! - a visibility variable that is unset means every device is visible, one that is set but empty
//!   means none;
//! - with one visible device the rank takes it (Frontier's `--gpus-per-task=1`); with several,
//!   `local_rank % n`, or `TRIDENT_GPU_ORDER[local_rank % len]` (Perlmutter's and Polaris's
//!   `3,2,1,0`, GPU 3 being closest to the first cores).

use crate::error::{Error, Result};
use std::fmt;

/// The environment variable that reorders the visible GPUs for the local ranks.
pub const GPU_ORDER_VAR: &str = "TRIDENT_GPU_ORDER";

/// Variables through which launchers announce the node-local rank, in the order they are
/// trusted as a cross-check: Open MPI's mpirun, MPICH's hydra, Cray PALS (Polaris, Aurora), and
/// Slurm's srun, whose `SLURM_LOCALID` only counts inside an srun step (see `local_rank_claim`).
const LOCAL_RANK_VARS: &[&str] =
    &["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"];

/// The GPU programming interface whose visibility variables apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuApi {
    Cuda,
    Hip,
}

impl GpuApi {
    /// The interface for `--device`: cuda and hip name theirs; on the CPU (where the choice is
    /// only printed) it is the one the environment points at: ROCm's variables when either is
    /// set, else CUDA's. Slurm sets both CUDA's and ROCm's for a GRES GPU, with equal values.
    pub fn for_device(device: &str, env: &dyn Fn(&str) -> Option<String>) -> GpuApi {
        match device {
            "cuda" => GpuApi::Cuda,
            "hip" => GpuApi::Hip,
            _ if env("ROCR_VISIBLE_DEVICES").is_some() || env("HIP_VISIBLE_DEVICES").is_some() => GpuApi::Hip,
            _ => GpuApi::Cuda,
        }
    }
}

/// Which devices the process may use, as the runtime of `GpuApi` will enumerate them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visible {
    /// No visibility variable is set: every device of the node (how many is the driver's to say).
    All { vars: &'static str },
    /// A variable is set but empty: no device at all.
    None { var: &'static str },
    /// The devices the runtime will number 0, 1, ...: their physical ids (an index, or a UUID),
    /// and the setting that produced them.
    List { ids: Vec<String>, setting: String },
}

/// Parses one visibility variable's value: comma-separated ids, blanks ignored.
fn parse_ids(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

/// The visible devices for `api`. ROCm applies `ROCR_VISIBLE_DEVICES` first (physical ids) and
/// then `HIP_VISIBLE_DEVICES` as indices into what remains; the two compose here the same way.
pub fn visible(api: GpuApi, env: &dyn Fn(&str) -> Option<String>) -> Result<Visible> {
    match api {
        GpuApi::Cuda => Ok(match env("CUDA_VISIBLE_DEVICES") {
            None => Visible::All { vars: "CUDA_VISIBLE_DEVICES unset" },
            Some(v) if parse_ids(&v).is_empty() => Visible::None { var: "CUDA_VISIBLE_DEVICES" },
            Some(v) => Visible::List { ids: parse_ids(&v), setting: format!("CUDA_VISIBLE_DEVICES={}", v.trim()) },
        }),
        GpuApi::Hip => {
            let rocr = env("ROCR_VISIBLE_DEVICES");
            let hip = env("HIP_VISIBLE_DEVICES");
            match (rocr, hip) {
                (None, None) => Ok(Visible::All { vars: "ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES unset" }),
                (Some(r), _) if parse_ids(&r).is_empty() => Ok(Visible::None { var: "ROCR_VISIBLE_DEVICES" }),
                (_, Some(h)) if parse_ids(&h).is_empty() => Ok(Visible::None { var: "HIP_VISIBLE_DEVICES" }),
                (Some(r), None) => {
                    Ok(Visible::List { ids: parse_ids(&r), setting: format!("ROCR_VISIBLE_DEVICES={}", r.trim()) })
                }
                (None, Some(h)) => {
                    Ok(Visible::List { ids: parse_ids(&h), setting: format!("HIP_VISIBLE_DEVICES={}", h.trim()) })
                }
                (Some(r), Some(h)) => {
                    let base = parse_ids(&r);
                    let ids = parse_ids(&h)
                        .iter()
                        .map(|i| {
                            i.parse::<usize>().ok().and_then(|k| base.get(k).cloned()).ok_or_else(|| {
                                Error::Usage(format!(
                                    "HIP_VISIBLE_DEVICES={} selects device '{i}', but ROCR_VISIBLE_DEVICES={} \
                                     leaves only {} device(s), numbered from 0",
                                    h.trim(),
                                    r.trim(),
                                    base.len()
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(Visible::List {
                        ids,
                        setting: format!("HIP_VISIBLE_DEVICES={} of ROCR_VISIBLE_DEVICES={}", h.trim(), r.trim()),
                    })
                }
            }
        }
    }
}

/// Parses `TRIDENT_GPU_ORDER`: distinct device indices, comma-separated.
pub fn parse_order(value: &str) -> Result<Vec<usize>> {
    let bad = |found: String| {
        Error::Usage(format!(
            "{GPU_ORDER_VAR}={value}: found {found}, expected distinct device indices separated by commas \
             (for example 3,2,1,0)"
        ))
    };
    let mut order = Vec::new();
    for item in value.split(',').map(str::trim) {
        let k: usize = item.parse().map_err(|_| bad(format!("'{item}'")))?;
        if order.contains(&k) {
            return Err(bad(format!("{k} twice")));
        }
        order.push(k);
    }
    Ok(order)
}

/// The device this rank drives: the runtime's ordinal (what `cudaSetDevice` / `hipSetDevice`
/// take), the physical id when the visibility list names it, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuChoice {
    pub ordinal: usize,
    pub physical: Option<String>,
    pub rule: String,
}

/// Chooses the device for node-local rank `local_rank`. `device_count` is the driver's count
/// when a GPU backend is loaded (None on the CPU: then an unset visibility variable leaves the
/// ordinal unreduced, and the backend reduces it by the same rule). Returns None when no device
/// is visible.
pub fn choose(
    visible: &Visible,
    local_rank: usize,
    order: Option<&[usize]>,
    device_count: Option<usize>,
) -> Result<Option<GpuChoice>> {
    let n = match visible {
        Visible::None { .. } => return Ok(None),
        Visible::List { ids, .. } => Some(ids.len()),
        Visible::All { .. } => device_count,
    };
    if n == Some(0) {
        return Ok(None);
    }
    if n == Some(1) {
        let rule = "the only visible device".to_string();
        return Ok(Some(GpuChoice { ordinal: 0, physical: physical_id(visible, 0), rule }));
    }
    let (ordinal, rule) = match order {
        Some(order) => {
            let slot = local_rank % order.len();
            let k = order[slot];
            if let Some(n) = n {
                if k >= n {
                    return Err(Error::Usage(format!(
                        "{GPU_ORDER_VAR} names device {k}, but only {n} are visible ({}), numbered from 0",
                        describe_visible(visible)
                    )));
                }
            }
            (k, format!("{GPU_ORDER_VAR}[local rank {local_rank} mod {}]", order.len()))
        }
        None => match n {
            Some(n) => (local_rank % n, format!("local rank {local_rank} mod {n}")),
            None => (local_rank, "local rank; the driver's device count reduces it".to_string()),
        },
    };
    Ok(Some(GpuChoice { ordinal, physical: physical_id(visible, ordinal), rule }))
}

fn physical_id(visible: &Visible, ordinal: usize) -> Option<String> {
    match visible {
        Visible::List { ids, .. } => ids.get(ordinal).cloned(),
        // Without a visibility list the runtime's numbering is the node's.
        Visible::All { .. } => Some(ordinal.to_string()),
        Visible::None { .. } => None,
    }
}

fn describe_visible(visible: &Visible) -> String {
    match visible {
        Visible::All { vars } => format!("all ({vars})"),
        Visible::None { var } => format!("none ({var} is empty)"),
        Visible::List { ids, setting } => format!("{setting} ({})", ids.len()),
    }
}

/// What the launcher's environment says the node-local rank is: the first variable of
/// `LOCAL_RANK_VARS` that is set and trustworthy. `SLURM_LOCALID` counts only in an srun step
/// (`SLURM_STEP_NUM_TASKS` set) that no other launcher sits inside: under mpirun or mpiexec in a
/// batch script every rank inherits the batch step's 0.
pub fn local_rank_claim(env: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    LOCAL_RANK_VARS.iter().find_map(|&var| {
        let value = env(var)?;
        if var == "SLURM_LOCALID" && env("SLURM_STEP_NUM_TASKS").is_none() {
            return None;
        }
        Some((var, value.trim().to_string()))
    })
}

/// Where one rank runs and which GPU it takes: what the `placement:` line says.
#[derive(Clone, Debug)]
pub struct Placement {
    pub world_rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub host: String,
    /// The scheduler's node name when it differs from the host name (Slurm's fake nodes, or a
    /// site whose node names are not host names).
    pub node: Option<String>,
    pub device: String,
    pub api: GpuApi,
    pub visible: Visible,
    pub gpu: Option<GpuChoice>,
    pub claim: Option<(&'static str, String)>,
}

impl Placement {
    /// Decides this rank's placement. `local` is MPI's shared-memory split (rank, size) of the
    /// world; `device` is `--device`; `device_count` the driver's count (None without a GPU
    /// backend). A GPU device with no visible GPU is an error; on the CPU it is only reported.
    pub fn decide(
        world: (usize, usize),
        local: (usize, usize),
        device: &str,
        device_count: Option<usize>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Placement> {
        let api = GpuApi::for_device(device, env);
        let visible = visible(api, env)?;
        let order = env(GPU_ORDER_VAR).filter(|v| !v.trim().is_empty()).map(|v| parse_order(&v)).transpose()?;
        let gpu = choose(&visible, local.0, order.as_deref(), device_count)?;
        if gpu.is_none() && device != "cpu" {
            return Err(Error::Usage(format!(
                "--device {device}: no GPU is visible to this rank ({})",
                describe_visible(&visible)
            )));
        }
        let host = hostname();
        let node = env("SLURMD_NODENAME").filter(|n| !n.is_empty() && *n != host);
        Ok(Placement {
            world_rank: world.0,
            world_size: world.1,
            local_rank: local.0,
            local_size: local.1,
            host,
            node,
            device: device.to_string(),
            api,
            visible,
            gpu,
            claim: local_rank_claim(env),
        })
    }
}

/// The `placement:` line, one per rank, for people and for greps:
/// `placement: rank 3/8 local 1/4 host vm node n2 | visible ROCR_VISIBLE_DEVICES=0,1 (2) | gpu 1
/// (physical 1; local rank 1 mod 2) | device cpu: the GPU is chosen, not used | local rank from
/// the MPI shared-memory split; SLURM_LOCALID=1 agrees`.
impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "placement: rank {}/{} local {}/{} host {}",
            self.world_rank, self.world_size, self.local_rank, self.local_size, self.host
        )?;
        if let Some(node) = &self.node {
            write!(f, " node {node}")?;
        }
        write!(f, " | visible {}", describe_visible(&self.visible))?;
        match &self.gpu {
            Some(g) => {
                write!(f, " | gpu {} (physical {}; {})", g.ordinal, g.physical.as_deref().unwrap_or("?"), g.rule)?
            }
            None => write!(f, " | gpu none")?,
        }
        match self.device.as_str() {
            "cpu" => write!(f, " | device cpu: the GPU is chosen, not used")?,
            d => write!(f, " | device {d}")?,
        }
        write!(f, " | local rank from the MPI shared-memory split")?;
        match &self.claim {
            Some((var, value)) if value.parse::<usize>().ok() == Some(self.local_rank) => {
                write!(f, "; {var}={value} agrees")
            }
            Some((var, value)) => write!(f, "; {var}={value} disagrees and is ignored"),
            None => Ok(()),
        }
    }
}

/// This machine's host name, or "unknown".
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it (or
    // truncates, and the last byte stays 0 because the length passed leaves it out).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k: &str| map.get(k).cloned()
    }

    fn decide(pairs: &[(&str, &str)], local: (usize, usize), device: &str) -> Result<Placement> {
        Placement::decide((local.0, 8), local, device, None, &env_of(pairs))
    }

    #[test]
    fn one_visible_device_is_taken_whatever_the_local_rank() {
        // Frontier: --gpus-per-task=1 --gpu-bind=closest gives each rank its own GCD.
        let p = decide(&[("ROCR_VISIBLE_DEVICES", "6")], (3, 8), "hip").unwrap();
        let g = p.gpu.clone().unwrap();
        assert_eq!((g.ordinal, g.physical.as_deref()), (0, Some("6")));
        assert!(p.to_string().contains("visible ROCR_VISIBLE_DEVICES=6 (1) | gpu 0 (physical 6;"), "{p}");
    }

    #[test]
    fn several_visible_devices_go_by_local_rank_modulo_their_count() {
        let env = [("CUDA_VISIBLE_DEVICES", "4,5,6,7")];
        for local in 0..8 {
            let g = decide(&env, (local, 8), "cuda").unwrap().gpu.unwrap();
            assert_eq!(g.ordinal, local % 4);
            assert_eq!(g.physical.unwrap(), (4 + local % 4).to_string());
        }
    }

    #[test]
    fn unset_means_all_and_empty_means_none() {
        let p = decide(&[], (2, 4), "cpu").unwrap();
        assert!(matches!(p.visible, Visible::All { .. }));
        assert_eq!(p.gpu.as_ref().unwrap().ordinal, 2);
        // With the driver's count the ordinal is reduced.
        let all = Visible::All { vars: "CUDA_VISIBLE_DEVICES unset" };
        assert_eq!(choose(&all, 5, None, Some(4)).unwrap().unwrap().ordinal, 1);
        assert_eq!(choose(&all, 5, None, Some(1)).unwrap().unwrap().ordinal, 0);
        // Empty: none, which is only a report on the CPU and an error on a GPU device.
        let p = decide(&[("CUDA_VISIBLE_DEVICES", "")], (0, 1), "cpu").unwrap();
        assert!(p.gpu.is_none() && p.to_string().contains("visible none (CUDA_VISIBLE_DEVICES is empty) | gpu none"));
        let e = decide(&[("CUDA_VISIBLE_DEVICES", "")], (0, 1), "cuda").unwrap_err().to_string();
        assert!(e.contains("no GPU is visible") && e.contains("CUDA_VISIBLE_DEVICES is empty"), "{e}");
    }

    #[test]
    fn gpu_order_reorders_and_is_checked() {
        // Perlmutter and Polaris: GPU 3 is closest to the first cores.
        let env = [("CUDA_VISIBLE_DEVICES", "0,1,2,3"), (GPU_ORDER_VAR, "3,2,1,0")];
        let picks: Vec<usize> = (0..4).map(|l| decide(&env, (l, 4), "cuda").unwrap().gpu.unwrap().ordinal).collect();
        assert_eq!(picks, [3, 2, 1, 0]);
        // --gpu-bind=none leaves the variable unset: the order still applies.
        let p = decide(&[(GPU_ORDER_VAR, "3,2,1,0")], (1, 4), "cpu").unwrap();
        assert_eq!(p.gpu.unwrap().ordinal, 2);
        // One visible device ignores the order.
        let p = decide(&[("CUDA_VISIBLE_DEVICES", "2"), (GPU_ORDER_VAR, "3,2,1,0")], (1, 4), "cuda").unwrap();
        assert_eq!(p.gpu.unwrap().ordinal, 0);
        for (bad, needle) in [("3,2,x", "'x'"), ("1,1", "1 twice"), ("", "''")] {
            let e = parse_order(bad).unwrap_err().to_string();
            assert!(e.contains(GPU_ORDER_VAR) && e.contains(needle), "{e}");
        }
        let e = decide(&[("CUDA_VISIBLE_DEVICES", "0,1"), (GPU_ORDER_VAR, "3,2,1,0")], (0, 4), "cpu")
            .unwrap_err()
            .to_string();
        assert!(e.contains("names device 3") && e.contains("only 2 are visible"), "{e}");
    }

    #[test]
    fn hip_composes_rocr_and_hip_visible_devices() {
        let env = [("ROCR_VISIBLE_DEVICES", "4,5,6,7"), ("HIP_VISIBLE_DEVICES", "1,3")];
        let v = visible(GpuApi::Hip, &env_of(&env)).unwrap();
        assert_eq!(
            v,
            Visible::List {
                ids: vec!["5".into(), "7".into()],
                setting: "HIP_VISIBLE_DEVICES=1,3 of ROCR_VISIBLE_DEVICES=4,5,6,7".into()
            }
        );
        let e = visible(GpuApi::Hip, &env_of(&[("ROCR_VISIBLE_DEVICES", "4"), ("HIP_VISIBLE_DEVICES", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("leaves only 1 device"), "{e}");
        // On the CPU, ROCm's variables win when set; else CUDA's.
        assert_eq!(GpuApi::for_device("cpu", &env_of(&[("ROCR_VISIBLE_DEVICES", "0")])), GpuApi::Hip);
        assert_eq!(GpuApi::for_device("cpu", &env_of(&[("CUDA_VISIBLE_DEVICES", "0")])), GpuApi::Cuda);
    }

    #[test]
    fn slurm_localid_inherited_under_mpirun_inside_sbatch_loses_to_the_split() {
        // mpirun inside a batch script: every rank inherits the batch step's SLURM_LOCALID=0 and
        // SLURM_PROCID=0 (no SLURM_STEP_NUM_TASKS in the batch step); the split says 3.
        let env =
            [("SLURM_LOCALID", "0"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("CUDA_VISIBLE_DEVICES", "0,1,2,3")];
        let p = decide(&env, (3, 4), "cpu").unwrap();
        assert_eq!(p.local_rank, 3);
        assert_eq!(p.gpu.as_ref().unwrap().ordinal, 3, "the split wins, not SLURM_LOCALID");
        assert_eq!(p.claim, None, "SLURM_LOCALID outside an srun step is not a claim");
        // With Open MPI's own variable present, that one is the cross-check and agrees.
        let mut with_ompi = env.to_vec();
        with_ompi.push(("OMPI_COMM_WORLD_LOCAL_RANK", "3"));
        let line = decide(&with_ompi, (3, 4), "cpu").unwrap().to_string();
        assert!(line.contains("OMPI_COMM_WORLD_LOCAL_RANK=3 agrees"), "{line}");
        // Inside an srun step SLURM_LOCALID is a claim; a disagreeing one is reported and ignored.
        let srun = [("SLURM_LOCALID", "0"), ("SLURM_STEP_NUM_TASKS", "4")];
        let p = decide(&srun, (2, 4), "cpu").unwrap();
        assert_eq!(p.gpu.as_ref().unwrap().ordinal, 2);
        assert!(p.to_string().contains("SLURM_LOCALID=0 disagrees and is ignored"), "{p}");
    }

    #[test]
    fn the_line_names_rank_host_visibility_and_choice() {
        let p = Placement::decide(
            (3, 8),
            (1, 4),
            "cpu",
            None,
            &env_of(&[("ROCR_VISIBLE_DEVICES", "0,1"), ("SLURMD_NODENAME", "n2-fake"), ("PMI_LOCAL_RANK", "1")]),
        )
        .unwrap();
        let line = p.to_string();
        assert!(line.starts_with("placement: rank 3/8 local 1/4 host "), "{line}");
        assert!(
            line.contains(
                " node n2-fake | visible ROCR_VISIBLE_DEVICES=0,1 (2) | gpu 1 (physical 1; local rank 1 mod 2)"
            ),
            "{line}"
        );
        assert!(
            line.contains("device cpu: the GPU is chosen, not used") && line.contains("PMI_LOCAL_RANK=1 agrees"),
            "{line}"
        );
    }
}
