//! The machines `trident plan` knows: per-GPU peak rates, memory and links, and the alpha-beta
//! cost of the collectives the layouts use over intra-node and inter-node links.
//!
//! Every figure is a vendor data-sheet number or a published measurement, named beside it; the
//! user can override each one (`--gemm-efficiency`, `--intra-node-bandwidth`, ...), and `plan`
//! prints the values it used with its result.

use super::efficiency::Efficiency;
use crate::error::{Error, Result};

/// One link class: a start-up latency (alpha) and a per-GPU bandwidth in one direction (1/beta).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub latency_s: f64,
    pub bytes_per_s: f64,
}

/// What the planner needs to know about one GPU (or one GCD of an MI250X) and its node.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub name: String,
    /// Dense 16-bit (bf16/fp16) tensor-core peak, FLOP/s.
    pub peak_16bit_flops: f64,
    /// Dense fp8 tensor-core peak, FLOP/s (0 where the GPU has none). Listed for the user's
    /// comparison; trident does not train in fp8, so no layout is priced with it.
    pub peak_fp8_flops: f64,
    /// Dense fp32 peak without TF32 (trident's f32 path computes in true f32), FLOP/s.
    pub peak_fp32_flops: f64,
    /// Fractions of peak the GEMMs (by shape) and flash attention reach, and their source.
    pub efficiency: Efficiency,
    /// HBM bandwidth, bytes/s (memory-bound element-wise work and the optimizer step run at it).
    pub hbm_bytes_per_s: f64,
    /// Memory per GPU, bytes.
    pub memory_bytes: f64,
    /// GPUs that share one node's fast fabric (NVLink / Infinity Fabric).
    pub gpus_per_node: usize,
    /// Between GPUs of one node: achievable all-reduce bus bandwidth (nccl-tests' busbw).
    pub intra: Link,
    /// Between nodes: the NIC bandwidth available to one GPU (NICs per node / GPUs per node).
    pub inter: Link,
    /// NVLink SHARP (NVLS): all-reduce bus bandwidth inside a node when the NVSwitches reduce,
    /// bytes/s (0: the node has no such switch).
    pub nvls_bytes_per_s: f64,
}

/// 1 GB/s in bytes/s.
const GB: f64 = 1e9;
/// 1 GiB in bytes.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Kernel efficiencies per GPU: GEMM `max` and `k_half` (efficiency.rs), flash attention's
/// fraction, and where each came from.
/// - H100 SXM (and the H200 and H100 PCIe, the same Hopper SMs): measured on an H100 SXM, bf16,
///   PyTorch 2.11 (cuBLAS through torch.matmul; flash attention 2 through
///   scaled_dot_product_attention), 156 GEMMs at the per-rank shapes of the Megatron-LM README's
///   H100 table and of Korthikanti et al. 2022, forward and backward (BENCHMARKS.md, "Planner
///   calibration"; `tests/gpu/plan-calibrate.sh`).
/// - A100: `max` set once so the model reproduces the throughput of Megatron's 2021 table
///   (tests/plan.rs; before shapes were priced, one constant 0.65 did that), `k_half` the H100's
///   scaled by the ratio of compute to memory bandwidth (an A100 needs half the H100's operand
///   reuse to keep its tensor cores fed); attention 0.45, flash attention 2's published A100
///   forward + backward level (Dao 2023: 50-70% of peak at head dim 128, less when causal).
/// - B200, MI250X, MI300X: not measured: the H100's GEMM `max`, `k_half` scaled by compute over
///   bandwidth as for the A100, attention 0.3. `plan --calibrate FILE` replaces them with
///   measurements of the machine at hand.
/// - `step`: the fraction of the kernels' isolated speed a whole step keeps. A100: 1 (its `max`
///   was fitted to whole steps). H100: fitted to the Megatron-LM README's 2024 H100 table (rows
///   H1-H9 of tests/plan_published_points.md, each at its published layout); a PyTorch training
///   step of a 1.3B GPT on one H100 measured in the same session as the kernels kept 0.85 of what
///   the kernels alone predict (BENCHMARKS.md). Others: the H100's.
const EFFICIENCIES: &[(&str, f64, f64, f64, f64, &str)] = &[
    ("a100", 0.70, 90.0, 0.45, 1.0, FITTED_A100),
    ("a100-40gb", 0.70, 115.0, 0.45, 1.0, FITTED_A100),
    ("h100", 0.72, 170.0, 0.21, STEP_H100, MEASURED_H100),
    ("h100-pcie", 0.72, 170.0, 0.21, STEP_H100, MEASURED_H100),
    ("h200", 0.72, 170.0, 0.21, STEP_H100, MEASURED_H100),
    ("b200", 0.72, 160.0, 0.3, STEP_H100, ESTIMATED),
    ("mi250x", 0.72, 67.0, 0.3, STEP_H100, ESTIMATED),
    ("mi300x", 0.72, 140.0, 0.3, STEP_H100, ESTIMATED),
];

/// Where a GPU's efficiencies come from, as `plan` reports it.
const MEASURED_H100: &str = "measured on an H100 (cuBLAS, flash attention 2)";
const FITTED_A100: &str = "fitted to Megatron's 2021 A100 table";
const ESTIMATED: &str = "estimated, not measured (use --calibrate)";

/// The H100's whole-step fraction (above).
const STEP_H100: f64 = 0.8;

/// The built-in efficiencies of a named GPU.
fn efficiency_of(name: &str) -> Efficiency {
    let &(_, gemm_max, gemm_k_half, attention, step, source) =
        EFFICIENCIES.iter().find(|e| e.0 == name).expect("every named GPU has efficiencies");
    Efficiency { gemm_max, gemm_k_half, attention, step, source: source.to_string() }
}

/// The GPUs `--gpu` names, as `--gpu`'s help and errors list them.
pub const GPU_NAMES: &[&str] = &["a100", "a100-40gb", "h100", "h100-pcie", "h200", "b200", "mi250x", "mi300x"];

/// One named GPU's figures, in the units a hardware file uses: TFLOP/s dense (bf16, fp8, fp32),
/// HBM GB/s, memory GiB, GPUs per node, intra-node all-reduce bus bandwidth GB/s, inter-node
/// GB/s per GPU.
type Figures = (&'static str, f64, f64, f64, f64, f64, usize, f64, f64);

/// Named GPUs. Peaks, memory and HBM bandwidth are the vendors' data sheets (dense, i.e. without
/// 2:4 sparsity); node figures are the reference systems' (DGX / HGX, Frontier, the MI300X
/// platform): link rates from their data sheets, achievable bus bandwidth as published nccl-tests /
/// rccl-tests levels where named, else estimated from the link rate and said so.
/// - `a100`: A100 80GB SXM: 312 TFLOP/s bf16, no fp8, 19.5 fp32, 2039 GB/s HBM2e, 80 GiB. DGX
///   A100 (Selene, where Megatron's 2021 table was measured): NVLink 3, 600 GB/s bidirectional per
///   GPU, nccl-tests all-reduce busbw about 230 GB/s; 8 HDR 200 Gb/s NICs = 25 GB/s per GPU, about
///   23 GB/s achieved.
/// - `a100-40gb`: A100 40GB SXM: as `a100` with 1555 GB/s HBM2 and 40 GiB (DGX A100 320GB).
/// - `h100`: H100 SXM5 80GB: 989 TFLOP/s bf16, 1979 fp8, 67 fp32, 3350 GB/s HBM3. DGX H100:
///   NVLink 4 through NVSwitch, 900 GB/s bidirectional per GPU, busbw about 360 GB/s without
///   NVLink SHARP; 8 ConnectX-7 400 Gb/s NICs = 50 GB/s per GPU, about 45 achieved.
/// - `h100-pcie`: H100 PCIe 80GB: 756 TFLOP/s bf16, 1513 fp8, 51 fp32, 2000 GB/s HBM2e. An
///   8-GPU PCIe Gen5 server without NVLink bridges: x16 links of 64 GB/s per direction, busbw
///   estimated at 40 GB/s through the PCIe switches; one 400 Gb/s NIC per 2 GPUs, 25 GB/s.
/// - `h200`: H200 SXM 141GB: the H100 SXM's compute (989 / 1979 / 67 TFLOP/s) with 4800 GB/s
///   HBM3e and 141 GB (131 GiB); HGX H200 links as DGX H100's.
/// - `b200`: B200 in an HGX/DGX B200 (the 8-GPU system figures / 8): 2250 TFLOP/s bf16, 4500
///   fp8, 75 fp32, 8000 GB/s HBM3e, 180 GB (167 GiB). NVLink 5, 1800 GB/s bidirectional per GPU;
///   busbw estimated at twice the H100's, 720 GB/s; 8 ConnectX-7 400 Gb/s NICs, 45 GB/s achieved.
/// - `mi250x`: one GCD of an MI250X (the unit a rank drives): 191.5 TFLOP/s bf16 (half the
///   package's 383), no fp8, 47.9 fp32 matrix, 1638 GB/s (half of 3.2 TB/s), 64 GiB. Frontier
///   node: 8 GCDs joined by Infinity Fabric (50-200 GB/s per link; a ring is bound by the 50 GB/s
///   links); 4 Slingshot-11 200 Gb/s NICs = 12.5 GB/s per GCD.
/// - `mi300x`: MI300X: 1307 TFLOP/s bf16, 2615 fp8, 163.4 fp32, 5300 GB/s HBM3, 192 GiB. 8-GPU
///   platform: 7 Infinity Fabric links of 64 GB/s per direction each, RCCL all-reduce busbw about
///   300 GB/s; one 400 Gb/s NIC per GPU, about 45 GB/s achieved.
///
/// Latencies: about 5 us per step inside a node and 10 us between nodes (NCCL/RCCL small-message
/// times on these systems are a few to ten microseconds).
const GPUS: &[Figures] = &[
    ("a100", 312.0, 0.0, 19.5, 2039.0, 80.0, 8, 230.0, 23.0),
    ("a100-40gb", 312.0, 0.0, 19.5, 1555.0, 40.0, 8, 230.0, 23.0),
    ("h100", 989.0, 1979.0, 67.0, 3350.0, 80.0, 8, 360.0, 45.0),
    ("h100-pcie", 756.0, 1513.0, 51.0, 2000.0, 80.0, 8, 40.0, 25.0),
    ("h200", 989.0, 1979.0, 67.0, 4800.0, 141e9 / GIB, 8, 360.0, 45.0),
    ("b200", 2250.0, 4500.0, 75.0, 8000.0, 180e9 / GIB, 8, 720.0, 45.0),
    ("mi250x", 191.5, 0.0, 47.9, 1638.0, 64.0, 8, 50.0, 12.5),
    ("mi300x", 1307.0, 2615.0, 163.4, 5300.0, 192.0, 8, 300.0, 45.0),
];

/// NVLink SHARP all-reduce bus bandwidth, GB/s, where the node's NVSwitches reduce in the switch
/// (NCCL's NVLS algorithm, NCCL 2.17 on): H100 / H200 about 480 in nccl-tests on DGX H100 (against
/// 360 for the ring); B200 estimated at twice that.
const NVLS: &[(&str, f64)] = &[("h100", 480.0), ("h200", 480.0), ("b200", 960.0)];

const INTRA_LATENCY_S: f64 = 5e-6;
const INTER_LATENCY_S: f64 = 10e-6;

fn from_figures(f: &Figures) -> Machine {
    let &(name, bf16, fp8, fp32, hbm, gib, per_node, intra, inter) = f;
    Machine {
        name: name.to_string(),
        peak_16bit_flops: bf16 * 1e12,
        peak_fp8_flops: fp8 * 1e12,
        peak_fp32_flops: fp32 * 1e12,
        efficiency: efficiency_of(name),
        hbm_bytes_per_s: hbm * GB,
        memory_bytes: gib * GIB,
        gpus_per_node: per_node,
        intra: Link { latency_s: INTRA_LATENCY_S, bytes_per_s: intra * GB },
        inter: Link { latency_s: INTER_LATENCY_S, bytes_per_s: inter * GB },
        nvls_bytes_per_s: NVLS.iter().find(|n| n.0 == name).map_or(0.0, |n| n.1 * GB),
    }
}

/// The named GPU (`--gpu`).
pub fn machine(name: &str) -> Result<Machine> {
    GPUS.iter()
        .find(|f| f.0 == name)
        .map(from_figures)
        .ok_or_else(|| Error::flag("--gpu", format!("'{name}'"), GPU_NAMES.join(", ")))
}

/// The keys of a hardware file, each with what it sets.
const HARDWARE_KEYS: &[(&str, &str)] = &[
    ("name", "the GPU's name in the plan"),
    ("base", "a named GPU whose figures the file starts from (then every other key is optional)"),
    ("peak_bf16_tflops", "dense bf16/fp16 TFLOP/s"),
    ("peak_fp8_tflops", "dense fp8 TFLOP/s (0: none)"),
    ("peak_fp32_tflops", "dense fp32 TFLOP/s"),
    ("gemm_efficiency", "fraction of peak GEMMs with a long inner dimension reach"),
    ("gemm_k_half", "inner dimension at which a GEMM reaches half of gemm_efficiency (0: shape-blind)"),
    ("attention_efficiency", "fraction of peak flash attention's forward + backward reaches"),
    ("step_efficiency", "fraction of the kernels' isolated speed a whole training step keeps"),
    ("hbm_gb_per_s", "memory bandwidth, GB/s"),
    ("memory_gib", "memory per GPU, GiB"),
    ("gpus_per_node", "GPUs on one node's fabric"),
    ("intra_node_busbw_gb_per_s", "all-reduce bus bandwidth inside a node, GB/s"),
    ("intra_node_latency_us", "latency per collective step inside a node"),
    ("inter_node_gb_per_s", "network bandwidth per GPU between nodes, GB/s"),
    ("inter_node_latency_us", "latency per collective step between nodes"),
    ("intra_node_nvls_busbw_gb_per_s", "NVLink SHARP all-reduce bus bandwidth inside a node, GB/s (0: none)"),
];

/// A GPU described by a JSON file (`--hardware FILE`): an object of `HARDWARE_KEYS`, every figure
/// given, or `"base": "h100"` and only what differs. Unknown keys, missing figures and values out
/// of range are errors naming the file and the key.
pub fn from_file(path: &std::path::Path) -> Result<Machine> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    let json = crate::data::json::document(&bytes, path)?;
    let fields = json.as_object().ok_or_else(|| Error::format(path, "not a JSON object of GPU figures"))?;
    let expected = || HARDWARE_KEYS.iter().map(|(k, what)| format!("{k} ({what})")).collect::<Vec<_>>().join(", ");
    if let Some((key, _)) = fields.iter().find(|(k, _)| !HARDWARE_KEYS.iter().any(|(known, _)| known == k)) {
        return Err(Error::format(path, format!("unknown key \"{key}\"; the keys are {}", expected())));
    }
    let text = |key: &str| -> Result<Option<String>> {
        match json.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| Error::format(path, format!("\"{key}\" is not a string"))),
        }
    };
    let base = text("base")?
        .map(|b| {
            machine(&b)
                .map_err(|_| Error::format(path, format!("\"base\": \"{b}\" is not one of {}", GPU_NAMES.join(", "))))
        })
        .transpose()?;
    let number = |key: &str, current: Option<f64>, positive: bool| -> Result<f64> {
        match json.get(key) {
            None => current
                .ok_or_else(|| Error::format(path, format!("\"{key}\" is missing (or give \"base\": a named GPU)"))),
            Some(v) => {
                v.as_f64().filter(|x| x.is_finite() && if positive { *x > 0.0 } else { *x >= 0.0 }).ok_or_else(|| {
                    Error::format(
                        path,
                        format!("\"{key}\" is not a {} number", if positive { "positive" } else { "non-negative" }),
                    )
                })
            }
        }
    };
    let b = base.as_ref();
    let built_in = b.map_or_else(|| efficiency_of("h100"), |m| m.efficiency.clone());
    let mut efficiency = Efficiency {
        gemm_max: number("gemm_efficiency", Some(built_in.gemm_max), true)?,
        gemm_k_half: number("gemm_k_half", Some(built_in.gemm_k_half), false)?,
        attention: number("attention_efficiency", Some(built_in.attention), true)?,
        step: number("step_efficiency", Some(built_in.step), true)?,
        source: built_in.source,
    };
    for (key, v) in [
        ("gemm_efficiency", efficiency.gemm_max),
        ("attention_efficiency", efficiency.attention),
        ("step_efficiency", efficiency.step),
    ] {
        if v > 1.0 {
            return Err(Error::format(path, format!("\"{key}\" is above 1")));
        }
    }
    if ["gemm_efficiency", "gemm_k_half", "attention_efficiency", "step_efficiency"]
        .iter()
        .any(|k| json.get(k).is_some())
    {
        efficiency.source = format!("from {}", path.display());
    }
    let per_node = number("gpus_per_node", b.map(|m| m.gpus_per_node as f64), true)?;
    if per_node.fract() != 0.0 {
        return Err(Error::format(path, "\"gpus_per_node\" is not a whole number"));
    }
    Ok(Machine {
        name: text("name")?.or(b.map(|m| format!("{} (modified)", m.name))).unwrap_or_else(|| "custom".to_string()),
        peak_16bit_flops: number("peak_bf16_tflops", b.map(|m| m.peak_16bit_flops / 1e12), true)? * 1e12,
        peak_fp8_flops: number("peak_fp8_tflops", Some(b.map_or(0.0, |m| m.peak_fp8_flops / 1e12)), false)? * 1e12,
        peak_fp32_flops: number("peak_fp32_tflops", b.map(|m| m.peak_fp32_flops / 1e12), true)? * 1e12,
        efficiency,
        hbm_bytes_per_s: number("hbm_gb_per_s", b.map(|m| m.hbm_bytes_per_s / GB), true)? * GB,
        memory_bytes: number("memory_gib", b.map(|m| m.memory_bytes / GIB), true)? * GIB,
        gpus_per_node: per_node as usize,
        intra: Link {
            latency_s: number(
                "intra_node_latency_us",
                Some(b.map_or(INTRA_LATENCY_S, |m| m.intra.latency_s) * 1e6),
                false,
            )? * 1e-6,
            bytes_per_s: number("intra_node_busbw_gb_per_s", b.map(|m| m.intra.bytes_per_s / GB), true)? * GB,
        },
        inter: Link {
            latency_s: number(
                "inter_node_latency_us",
                Some(b.map_or(INTER_LATENCY_S, |m| m.inter.latency_s) * 1e6),
                false,
            )? * 1e-6,
            bytes_per_s: number("inter_node_gb_per_s", b.map(|m| m.inter.bytes_per_s / GB), true)? * GB,
        },
        nvls_bytes_per_s: number(
            "intra_node_nvls_busbw_gb_per_s",
            Some(b.map_or(0.0, |m| m.nvls_bytes_per_s / GB)),
            false,
        )? * GB,
    })
}

/// How a group of `size` GPUs sits on the nodes: `per_node` of its members share a node, so it
/// spans `size / per_node` nodes. Megatron's rank order puts TP peers on adjacent ranks, DP peers
/// `tp` apart and PP peers `tp * dp` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub size: usize,
    pub per_node: usize,
}

impl Placement {
    /// The placement of a group whose members are `stride` ranks apart, with `gpus_per_node`
    /// consecutive ranks on each node.
    pub fn strided(size: usize, stride: usize, gpus_per_node: usize) -> Placement {
        let per_node = if stride >= gpus_per_node { 1 } else { (gpus_per_node / stride).clamp(1, size) };
        Placement { size, per_node }
    }

    pub fn nodes(&self) -> usize {
        self.size.div_ceil(self.per_node)
    }
}

/// The collective algorithms of NCCL/RCCL the cost model knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Ring,
    Tree,
    Nvls,
}

/// The collectives the cost model prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    /// Every member sends each other member its own 1/n of a buffer (`bytes` is that buffer).
    AllToAll,
}

impl Machine {
    /// Seconds for one collective over `bytes` (the full buffer each member holds) on a group
    /// placed as `at`, by the fastest algorithm NCCL/RCCL has for it (as their tuners choose):
    /// the hierarchical ring, and for all-reduce also the tree and NVLS (`algorithm_s`).
    pub fn collective_s(&self, op: Collective, bytes: f64, at: Placement) -> f64 {
        let algorithms: &[Algorithm] = match op {
            Collective::AllReduce => &[Algorithm::Ring, Algorithm::Tree, Algorithm::Nvls],
            _ => &[Algorithm::Ring],
        };
        algorithms.iter().map(|&a| self.algorithm_s(a, op, bytes, at)).fold(f64::INFINITY, f64::min)
    }

    /// Seconds of one collective by one algorithm (infinite where the machine lacks it):
    /// - ring: hierarchical, as NCCL/RCCL run it on multi-GPU nodes with one NIC per GPU. Inside a
    ///   node the buffer moves (n-1)/n of its size per step over the node's fabric; between nodes
    ///   each member carries 1/per_node of it over its own NIC. An all-reduce is a reduce-scatter
    ///   plus an all-gather, so it costs twice either; each ring step pays alpha.
    /// - tree (all-reduce): the same bytes, but the steps between nodes form a pipelined double
    ///   binary tree, 2 log2(nodes) latencies instead of 2 (nodes - 1).
    /// - NVLS (all-reduce inside a node with NVLink SHARP): the switches reduce; the node's part
    ///   runs at the NVLS bus bandwidth, two latencies; between nodes as the ring.
    pub fn algorithm_s(&self, algorithm: Algorithm, op: Collective, bytes: f64, at: Placement) -> f64 {
        if at.size <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let passes = match op {
            Collective::AllReduce => 2.0,
            Collective::ReduceScatter | Collective::AllGather => 1.0,
            Collective::AllToAll => return self.all_to_all_s(bytes, at),
        };
        let k = at.per_node as f64;
        let nodes = at.nodes() as f64;
        let intra = match (at.per_node > 1, algorithm) {
            (false, _) => 0.0,
            (true, Algorithm::Nvls) if self.nvls_bytes_per_s > 0.0 => {
                passes * ((k - 1.0) / k * bytes / self.nvls_bytes_per_s + self.intra.latency_s)
            }
            (true, Algorithm::Nvls) => return f64::INFINITY,
            (true, _) => passes * ((k - 1.0) / k * bytes / self.intra.bytes_per_s + (k - 1.0) * self.intra.latency_s),
        };
        let steps = match algorithm {
            Algorithm::Tree => nodes.log2().ceil(),
            _ => nodes - 1.0,
        };
        let inter = if at.nodes() > 1 {
            passes * ((nodes - 1.0) / nodes * bytes / k / self.inter.bytes_per_s + steps * self.inter.latency_s)
        } else {
            0.0
        };
        intra + inter
    }

    /// An all-to-all of `bytes` per member, as NCCL/RCCL run it (a grouped send and receive per
    /// peer, all at once): of its buffer a member keeps 1/n, sends (k-1)/n to the other members
    /// on its node over the node's fabric and (n-k)/n over its own NIC, both at once; one latency
    /// per peer on each.
    fn all_to_all_s(&self, bytes: f64, at: Placement) -> f64 {
        let (n, k) = (at.size as f64, at.per_node as f64);
        let intra = (k - 1.0) * (bytes / n / self.intra.bytes_per_s + self.intra.latency_s);
        let inter = (n - k) * (bytes / n / self.inter.bytes_per_s + self.inter.latency_s);
        intra.max(inter)
    }

    /// Seconds to send `bytes` from one GPU to another, inside a node or across nodes.
    pub fn p2p_s(&self, bytes: f64, across_nodes: bool) -> f64 {
        let link = if across_nodes { self.inter } else { self.intra };
        link.latency_s + bytes / link.bytes_per_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_follows_megatrons_rank_order() {
        // TP 8 on 8-GPU nodes: each DP group has one member per node.
        assert_eq!(Placement::strided(32, 8, 8), Placement { size: 32, per_node: 1 });
        // TP 2: four DP peers per node.
        assert_eq!(Placement::strided(32, 2, 8), Placement { size: 32, per_node: 4 });
        // A TP group of 4 on one node.
        assert_eq!(Placement::strided(4, 1, 8).nodes(), 1);
        // TP 16 spans two nodes.
        assert_eq!(Placement::strided(16, 1, 8), Placement { size: 16, per_node: 8 });
    }

    #[test]
    fn an_all_to_all_moves_what_leaves_each_member() {
        let h100 = machine("h100").unwrap();
        let bytes = 1e9;
        // Inside a node, 4 members: 3/4 of the buffer over NVLink, n times less than gathering
        // every member's buffer (latencies aside).
        let node = Placement { size: 4, per_node: 4 };
        let a2a = h100.collective_s(Collective::AllToAll, bytes, node);
        let expect = 0.75 * bytes / h100.intra.bytes_per_s + 3.0 * h100.intra.latency_s;
        assert!((a2a / expect - 1.0).abs() < 1e-12, "{a2a} {expect}");
        let gather = h100.collective_s(Collective::AllGather, 4.0 * bytes, node);
        assert!((gather / a2a - 4.0).abs() < 0.05, "{gather} {a2a}");
        // Across 4 nodes, one member each: all of it leaves over the NIC.
        let across = Placement { size: 4, per_node: 1 };
        let a2a = h100.collective_s(Collective::AllToAll, bytes, across);
        assert!((a2a / (0.75 * bytes / h100.inter.bytes_per_s + 3.0 * h100.inter.latency_s) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_fastest_algorithm_prices_each_all_reduce() {
        let (h100, a100) = (machine("h100").unwrap(), machine("a100").unwrap());
        let node = Placement { size: 8, per_node: 8 };
        let ring = |m: &Machine, bytes, at| m.algorithm_s(Algorithm::Ring, Collective::AllReduce, bytes, at);
        // NVLS inside an H100 node: 480 against the ring's 360 GB/s for a large buffer.
        let nvls = h100.algorithm_s(Algorithm::Nvls, Collective::AllReduce, 1e10, node);
        assert!((ring(&h100, 1e10, node) / nvls - 480.0 / 360.0).abs() < 0.01);
        assert_eq!(h100.collective_s(Collective::AllReduce, 1e10, node), nvls);
        // An A100 node has no NVLS: the ring prices it.
        assert_eq!(a100.algorithm_s(Algorithm::Nvls, Collective::AllReduce, 1e9, node), f64::INFINITY);
        assert_eq!(a100.collective_s(Collective::AllReduce, 1e9, node), ring(&a100, 1e9, node));
        // Across 64 nodes a small all-reduce is latency-bound: the tree's 2 x 6 steps beat the
        // ring's 2 x 63; a large one costs the same bytes either way.
        let wide = Placement { size: 64, per_node: 1 };
        let tree = a100.algorithm_s(Algorithm::Tree, Collective::AllReduce, 1e3, wide);
        assert!(tree < ring(&a100, 1e3, wide) / 4.0, "{tree}");
        assert_eq!(a100.collective_s(Collective::AllReduce, 1e3, wide), tree);
        // Reduce-scatter and all-gather are rings only.
        let rs = a100.collective_s(Collective::ReduceScatter, 1e3, wide);
        assert_eq!(rs, a100.algorithm_s(Algorithm::Ring, Collective::ReduceScatter, 1e3, wide));
    }

    #[test]
    fn all_reduce_is_twice_a_reduce_scatter_and_bandwidth_bound_for_large_buffers() {
        let m = machine("a100").unwrap();
        let at = Placement { size: 8, per_node: 8 };
        let bytes = 1e9;
        let ar = m.collective_s(Collective::AllReduce, bytes, at);
        let rs = m.collective_s(Collective::ReduceScatter, bytes, at);
        assert!((ar - 2.0 * rs).abs() < 1e-12);
        // 2 * 7/8 * 1 GB / 230 GB/s, plus 14 steps of 5 us.
        assert!((ar - (2.0 * 0.875 / 230.0 + 14.0 * 5e-6)).abs() < 1e-9, "{ar}");
        assert_eq!(m.collective_s(Collective::AllReduce, bytes, Placement { size: 1, per_node: 1 }), 0.0);
    }
}
