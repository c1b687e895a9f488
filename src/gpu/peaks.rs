//! The datasheet peaks of the data-center GPUs trident targets, found by the name the driver
//! reports (`cuDeviceGetName`), so that `trident bench ... --device cuda` can say what fraction of
//! the device its kernels and collectives reach.
//!
//! Sources (dense figures: NVIDIA quotes tensor-core rates "with sparsity", twice the dense rate,
//! and NVLink bandwidth as the sum of both directions, twice the per-direction rate that bus
//! bandwidth is compared with):
//! - A100: NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4): BF16 tensor
//!   312 TFLOP/s dense (624 sparse); HBM 1,555 GB/s (40 GB), 2,039 GB/s (80 GB SXM4), 1,935 GB/s
//!   (80 GB PCIe); NVLink 600 GB/s (SXM4; PCIe cards through an NVLink bridge for 2 GPUs).
//! - H100: NVIDIA H100 datasheet and Hopper whitepaper: BF16 989.4 TFLOP/s dense (SXM5, 1,979
//!   sparse), 756 dense (PCIe, 1,513 sparse), 835 dense (NVL, 1,671 sparse); HBM3 3,350 GB/s
//!   (SXM5), HBM2e 2,000 GB/s (PCIe), 3,900 GB/s (NVL); NVLink 900 GB/s (SXM5), 600 GB/s bridge
//!   (PCIe, NVL).
//! - H200: NVIDIA H200 datasheet: the H100 SXM5's compute (989 dense), HBM3e 4,800 GB/s, NVLink
//!   900 GB/s.
//! - GH200: NVIDIA GH200 Grace Hopper datasheet: the H100 SXM5's compute (989 dense); HBM3 96 GB at
//!   4,000 GB/s, or HBM3e 144 GB at 4,900 GB/s; NVLink 900 GB/s between GPUs.

/// What one device can do at most.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    /// The device, as the table calls it.
    pub name: &'static str,
    /// Dense bf16 tensor-core TFLOP/s (f32 accumulate).
    pub bf16_tflops: f64,
    /// HBM bandwidth, GB/s.
    pub hbm_gbs: f64,
    /// NVLink bandwidth per direction, GB/s: what nccl-tests' bus bandwidth is compared with.
    pub nvlink_gbs: f64,
}

const fn peak(name: &'static str, bf16_tflops: f64, hbm_gbs: f64, nvlink_gbs: f64) -> Peak {
    Peak { name, bf16_tflops, hbm_gbs, nvlink_gbs }
}

pub const A100_SXM_40GB: Peak = peak("A100 SXM4 40GB", 312.0, 1555.0, 300.0);
pub const A100_SXM_80GB: Peak = peak("A100 SXM4 80GB", 312.0, 2039.0, 300.0);
pub const A100_PCIE_40GB: Peak = peak("A100 PCIe 40GB", 312.0, 1555.0, 300.0);
pub const A100_PCIE_80GB: Peak = peak("A100 PCIe 80GB", 312.0, 1935.0, 300.0);
pub const H100_SXM: Peak = peak("H100 SXM5", 989.4, 3350.0, 450.0);
pub const H100_PCIE: Peak = peak("H100 PCIe", 756.0, 2000.0, 300.0);
pub const H100_NVL: Peak = peak("H100 NVL", 835.0, 3900.0, 300.0);
pub const H200: Peak = peak("H200", 989.4, 4800.0, 450.0);
pub const GH200_HBM3: Peak = peak("GH200 (96GB HBM3)", 989.4, 4000.0, 450.0);
pub const GH200_HBM3E: Peak = peak("GH200 (144GB HBM3e)", 989.4, 4900.0, 450.0);

/// Every entry of the table.
pub const PEAKS: &[Peak] = &[
    A100_SXM_40GB,
    A100_SXM_80GB,
    A100_PCIE_40GB,
    A100_PCIE_80GB,
    H100_SXM,
    H100_PCIE,
    H100_NVL,
    H200,
    GH200_HBM3,
    GH200_HBM3E,
];

/// The peak of the device the driver names `device_name` ("NVIDIA A100-SXM4-80GB", "NVIDIA H100
/// 80GB HBM3", "NVIDIA GH200 480GB", ...), or None for a device not in the table. Case and
/// separators do not matter; the model is found first (GH200 before H200, whose name it contains),
/// then the form factor and memory.
pub fn lookup(device_name: &str) -> Option<Peak> {
    let name: String =
        device_name.to_ascii_uppercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { ' ' }).collect();
    let words: Vec<&str> = name.split_whitespace().collect();
    let has = |w: &str| words.iter().any(|x| x.contains(w));
    let pcie = has("PCIE");
    let gb80 = has("80G");
    if has("GH200") {
        // The 480GB / 576GB superchips count their LPDDR5X too; the HBM3e part says HBM3E or 144G.
        return Some(if has("HBM3E") || has("144G") { GH200_HBM3E } else { GH200_HBM3 });
    }
    if has("H200") {
        return Some(H200);
    }
    if has("H100") {
        return Some(if pcie {
            H100_PCIE
        } else if words.contains(&"NVL") {
            H100_NVL
        } else {
            H100_SXM
        });
    }
    if has("A100") {
        return Some(match (pcie, gb80) {
            (false, false) => A100_SXM_40GB,
            (false, true) => A100_SXM_80GB,
            (true, false) => A100_PCIE_40GB,
            (true, true) => A100_PCIE_80GB,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_map_to_their_rows() {
        for (reported, expected) in [
            ("NVIDIA A100-SXM4-40GB", A100_SXM_40GB),
            ("NVIDIA A100-SXM4-80GB", A100_SXM_80GB),
            ("NVIDIA A100-PCIE-40GB", A100_PCIE_40GB),
            ("NVIDIA A100 80GB PCIe", A100_PCIE_80GB),
            ("Fake A100-SXM4-40GB", A100_SXM_40GB),
            ("NVIDIA H100 80GB HBM3", H100_SXM),
            ("NVIDIA H100 PCIe", H100_PCIE),
            ("NVIDIA H100 NVL", H100_NVL),
            ("NVIDIA H200", H200),
            ("NVIDIA H200 NVL", H200),
            ("NVIDIA GH200 480GB", GH200_HBM3),
            ("NVIDIA GH200 120GB", GH200_HBM3),
            ("NVIDIA GH200 144G HBM3e", GH200_HBM3E),
            ("nvidia h100 80gb hbm3", H100_SXM),
        ] {
            assert_eq!(lookup(reported), Some(expected), "{reported}");
        }
        for unknown in ["NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "NVIDIA L40S", ""] {
            assert_eq!(lookup(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn the_table_holds_dense_rates_and_per_direction_links() {
        for p in PEAKS {
            // Dense bf16 is half the sparse figure NVIDIA quotes; no part here exceeds 1000 dense.
            assert!(p.bf16_tflops >= 300.0 && p.bf16_tflops < 1000.0, "{p:?}");
            assert!(p.nvlink_gbs == 300.0 || p.nvlink_gbs == 450.0, "{p:?}");
            assert!(p.hbm_gbs >= 1555.0 && p.hbm_gbs <= 4900.0, "{p:?}");
        }
    }
}
