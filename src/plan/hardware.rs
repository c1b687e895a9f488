//! The machines `trident plan` knows: per-GPU peak rates, memory and links, and the alpha-beta
//! cost of the collectives the layouts use over intra-node and inter-node links.
//!
//! Every figure is a vendor data-sheet number or a published measurement, named beside it; the
//! user can override each one (`--gemm-efficiency`, `--intra-node-bandwidth`, ...), and `plan`
//! prints the values it used with its result.

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
    pub name: &'static str,
    /// Dense 16-bit (bf16/fp16) tensor-core peak, FLOP/s.
    pub peak_16bit_flops: f64,
    /// Dense fp32 peak without TF32 (trident's f32 path computes in true f32), FLOP/s.
    pub peak_fp32_flops: f64,
    /// Fraction of peak the large GEMMs of a transformer layer reach.
    pub gemm_efficiency: f64,
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
}

/// 1 GB/s in bytes/s.
const GB: f64 = 1e9;
/// 1 GiB in bytes.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The fraction of peak the GEMMs of a layer reach in a whole training step, the same for every
/// GPU unless overridden. cuBLAS alone reaches about 80% of the A100's 312 TFLOP/s on large square
/// bf16 GEMMs; the model does not itemise launch gaps, the less square shapes (QKV, fc2) or
/// unfused small kernels, so this one constant carries them. It was set once, to 0.65, so that the
/// model reproduces the throughput level of Megatron's 2021 weak-scaling table
/// (tests/plan.rs; BENCHMARKS.md), and is used unchanged for every row and every GPU.
pub const DEFAULT_GEMM_EFFICIENCY: f64 = 0.65;

/// Named GPUs. Sources (vendor data sheets unless said otherwise):
/// - `a100`: NVIDIA A100 80GB SXM: 312 TFLOP/s dense bf16/fp16, 19.5 TFLOP/s fp32, 2039 GB/s HBM2e,
///   80 GiB. DGX A100 node (as on Selene, where Megatron's 2021 table was measured): 8 GPUs on
///   NVLink 3 (600 GB/s bidirectional per GPU; nccl-tests all-reduce busbw about 230 GB/s), 8
///   Mellanox HDR 200 Gb/s NICs = 25 GB/s per GPU per direction, about 23 GB/s achieved.
/// - `h100`: NVIDIA H100 SXM5 80GB: 989 TFLOP/s dense bf16/fp16, 67 TFLOP/s fp32, 3350 GB/s HBM3.
///   DGX H100: 8 GPUs on NVLink 4 (900 GB/s bidirectional; nccl-tests busbw about 360 GB/s),
///   8 ConnectX-7 400 Gb/s NICs = 50 GB/s per GPU, about 45 GB/s achieved.
/// - `mi250x`: one GCD of an AMD Instinct MI250X (the unit a rank drives): 191.5 TFLOP/s dense
///   bf16/fp16 and 47.9 TFLOP/s fp32 matrix (half the package's 383 / 95.7), 1638 GB/s (half of
///   3.2 TB/s), 64 GiB. Frontier node: 8 GCDs joined by Infinity Fabric (50-200 GB/s per link;
///   the ring is bound by the 50 GB/s links), 4 Slingshot-11 200 Gb/s NICs = 12.5 GB/s per GCD.
/// - `mi300x`: AMD Instinct MI300X: 1307 TFLOP/s dense bf16/fp16, 163.4 TFLOP/s fp32, 5300 GB/s
///   HBM3, 192 GiB. 8-GPU platform: 7 Infinity Fabric links of 64 GB/s per direction each
///   (RCCL all-reduce busbw about 300 GB/s), one 400 Gb/s NIC per GPU, about 45 GB/s achieved.
///
/// Latencies: about 5 us per step inside a node and 10 us between nodes (NCCL/RCCL small-message
/// times on these systems are a few to ten microseconds).
pub fn machine(name: &str) -> Result<Machine> {
    let intra = |gbs: f64| Link { latency_s: 5e-6, bytes_per_s: gbs * GB };
    let inter = |gbs: f64| Link { latency_s: 10e-6, bytes_per_s: gbs * GB };
    let m = match name {
        "a100" => Machine {
            name: "a100",
            peak_16bit_flops: 312e12,
            peak_fp32_flops: 19.5e12,
            gemm_efficiency: DEFAULT_GEMM_EFFICIENCY,
            hbm_bytes_per_s: 2039.0 * GB,
            memory_bytes: 80.0 * GIB,
            gpus_per_node: 8,
            intra: intra(230.0),
            inter: inter(23.0),
        },
        "h100" => Machine {
            name: "h100",
            peak_16bit_flops: 989e12,
            peak_fp32_flops: 67e12,
            gemm_efficiency: DEFAULT_GEMM_EFFICIENCY,
            hbm_bytes_per_s: 3350.0 * GB,
            memory_bytes: 80.0 * GIB,
            gpus_per_node: 8,
            intra: intra(360.0),
            inter: inter(45.0),
        },
        "mi250x" => Machine {
            name: "mi250x",
            peak_16bit_flops: 191.5e12,
            peak_fp32_flops: 47.9e12,
            gemm_efficiency: DEFAULT_GEMM_EFFICIENCY,
            hbm_bytes_per_s: 1638.0 * GB,
            memory_bytes: 64.0 * GIB,
            gpus_per_node: 8,
            intra: intra(50.0),
            inter: inter(12.5),
        },
        "mi300x" => Machine {
            name: "mi300x",
            peak_16bit_flops: 1307e12,
            peak_fp32_flops: 163.4e12,
            gemm_efficiency: DEFAULT_GEMM_EFFICIENCY,
            hbm_bytes_per_s: 5300.0 * GB,
            memory_bytes: 192.0 * GIB,
            gpus_per_node: 8,
            intra: intra(300.0),
            inter: inter(45.0),
        },
        other => return Err(Error::flag("--gpu", format!("'{other}'"), "a100, h100, mi250x or mi300x")),
    };
    Ok(m)
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

/// The collectives the cost model prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Machine {
    /// Seconds for one collective over `bytes` (the full buffer each member holds) on a group
    /// placed as `at`: hierarchical, as NCCL/RCCL run it on multi-GPU nodes with one NIC per GPU.
    /// Inside a node the buffer moves (n-1)/n of its size per step over the node's fabric; between
    /// nodes each member carries 1/per_node of it over its own NIC. An all-reduce is a
    /// reduce-scatter plus an all-gather, so it costs twice either; each ring step pays alpha.
    pub fn collective_s(&self, op: Collective, bytes: f64, at: Placement) -> f64 {
        if at.size <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let passes = match op {
            Collective::AllReduce => 2.0,
            Collective::ReduceScatter | Collective::AllGather => 1.0,
        };
        let k = at.per_node as f64;
        let nodes = at.nodes() as f64;
        let intra = if at.per_node > 1 {
            passes * ((k - 1.0) / k * bytes / self.intra.bytes_per_s + (k - 1.0) * self.intra.latency_s)
        } else {
            0.0
        };
        let inter = if at.nodes() > 1 {
            passes * ((nodes - 1.0) / nodes * bytes / k / self.inter.bytes_per_s + (nodes - 1.0) * self.inter.latency_s)
        } else {
            0.0
        };
        intra + inter
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
