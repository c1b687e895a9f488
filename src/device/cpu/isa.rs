//! The CPU's instruction-set levels, the best one it has, and the cap `TRIDENT_CPU_ISA` sets
//! for tests and benchmarks: every kernel family (f32 GEMM, bf16 GEMM, element-wise) picks its
//! kernel from `active()`, so `TRIDENT_CPU_ISA=avx2` runs an AVX-512 machine as an AVX2 one. A
//! level the CPU lacks, or a name that is none of the levels, is one clear error (`check`).

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The variable that caps the instruction set.
pub const ISA_VAR: &str = "TRIDENT_CPU_ISA";

/// Instruction-set levels, lowest first; each includes the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Baseline x86-64 (SSE2) or any other architecture: the portable kernels.
    Portable,
    /// AVX2 + FMA (Zen 2/3, Haswell on).
    Avx2,
    /// AVX-512 F, BW, VL, DQ (Zen 4/5, Skylake-SP on).
    Avx512,
    /// AVX-512 with BF16 dot products (`vdpbf16ps`: Zen 4/5, Cooper Lake, Sapphire Rapids on).
    Avx512Bf16,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];

    /// The name `TRIDENT_CPU_ISA` takes and logs print.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s)
    }
}

/// The best level this CPU supports (detected once).
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
            if avx512 && has!("avx512bf16") {
                return Isa::Avx512Bf16;
            }
            if avx512 {
                return Isa::Avx512;
            }
            if has!("avx2") && has!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// The level `TRIDENT_CPU_ISA` asks for given what the CPU has (`detected`), or why it cannot be.
fn capped(value: Option<&str>, detected: Isa) -> std::result::Result<Isa, String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(detected) };
    let names = Isa::ALL.map(Isa::name).join(", ");
    let Some(want) = Isa::parse(value) else {
        return Err(format!("{ISA_VAR}='{value}' is not an instruction-set level; expected one of {names}"));
    };
    if want > detected {
        return Err(format!(
            "{ISA_VAR}={value}: this CPU ({}) supports up to {}",
            cpu_model().unwrap_or_else(|| "model unknown".into()),
            detected.name()
        ));
    }
    Ok(want)
}

fn active_or_error() -> &'static std::result::Result<Isa, String> {
    static ACTIVE: OnceLock<std::result::Result<Isa, String>> = OnceLock::new();
    ACTIVE.get_or_init(|| capped(std::env::var(ISA_VAR).ok().as_deref(), detected()))
}

/// The level the kernels use: the CPU's best, capped by `TRIDENT_CPU_ISA`. A bad cap falls back
/// to the portable level here; `check` (called where the CPU Device starts) turns it into an error.
pub fn active() -> Isa {
    active_or_error().clone().unwrap_or(Isa::Portable)
}

/// The error of a `TRIDENT_CPU_ISA` that names no level or one this CPU lacks.
pub fn check() -> Result<Isa> {
    active_or_error().clone().map_err(Error::Config)
}

/// The CPU's model name, from /proc/cpuinfo (Linux), for `info` and benchmark lines, with its
/// family and model numbers (a VM's name is often only "AMD EPYC") and, for AMD, the core
/// generation they mean. Read once: benchmark records name it on every line.
pub fn cpu_model() -> Option<String> {
    static MODEL: OnceLock<Option<String>> = OnceLock::new();
    MODEL.get_or_init(|| describe_cpu(&std::fs::read_to_string("/proc/cpuinfo").ok()?)).clone()
}

/// `cpu_model` from the text of /proc/cpuinfo (its first processor's fields).
fn describe_cpu(cpuinfo: &str) -> Option<String> {
    let field = |key: &str| {
        cpuinfo
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    let name = field("model name")?;
    let number = |key: &str| field(key).and_then(|v| v.parse::<u32>().ok());
    let (Some(family), Some(model)) = (number("cpu family"), number("model")) else { return Some(name) };
    let generation = match (field("vendor_id").as_deref(), family) {
        (Some("AuthenticAMD"), 23) if model < 0x30 => ", Zen/Zen+",
        (Some("AuthenticAMD"), 23) => ", Zen 2",
        (Some("AuthenticAMD"), 25) if (0x10..=0x1F).contains(&model) || (0x60..=0xAF).contains(&model) => ", Zen 4",
        (Some("AuthenticAMD"), 25) => ", Zen 3",
        (Some("AuthenticAMD"), 26) => ", Zen 5",
        _ => "",
    };
    Some(format!("{name} (family {family} model {model}{generation})"))
}

/// The size in bytes of one core's level-1 data cache, from sysfs (Linux), which `trident info`
/// prints beside the GEMM blocking. `None` where the system does not say.
pub fn l1d_bytes() -> Option<usize> {
    (0..8).find_map(|index| {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
        let is_l1d = read("level")?.trim() == "1" && read("type")?.trim() == "Data";
        if is_l1d {
            parse_cache_size(&read("size")?)
        } else {
            None
        }
    })
}

/// A sysfs cache size ("48K", "2048K", "1M", "32768") in bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        _ => return None,
    };
    digits.parse::<usize>().ok().filter(|&n| n > 0).map(|n| n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_named_with_its_family_model_and_amd_generation() {
        let info = |vendor: &str, family: u32, model: u32| {
            format!("processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: X Y\n")
        };
        let named = |vendor, family, model| describe_cpu(&info(vendor, family, model)).unwrap();
        assert_eq!(named("AuthenticAMD", 25, 17), "X Y (family 25 model 17, Zen 4)");
        assert_eq!(named("AuthenticAMD", 25, 1), "X Y (family 25 model 1, Zen 3)");
        assert_eq!(named("AuthenticAMD", 23, 49), "X Y (family 23 model 49, Zen 2)");
        assert_eq!(named("AuthenticAMD", 26, 2), "X Y (family 26 model 2, Zen 5)");
        assert_eq!(named("GenuineIntel", 6, 207), "X Y (family 6 model 207)");
        assert_eq!(describe_cpu("model name\t: X Y\n").unwrap(), "X Y");
        assert_eq!(describe_cpu("cpu family\t: 25\n"), None);
    }

    #[test]
    fn the_cap_lowers_the_level_and_refuses_what_the_cpu_lacks() {
        assert_eq!(capped(None, Isa::Avx512), Ok(Isa::Avx512));
        assert_eq!(capped(Some(""), Isa::Avx2), Ok(Isa::Avx2));
        assert_eq!(capped(Some("avx2"), Isa::Avx512Bf16), Ok(Isa::Avx2));
        assert_eq!(capped(Some("portable"), Isa::Avx2), Ok(Isa::Portable));
        let lacks = capped(Some("avx512bf16"), Isa::Avx2).unwrap_err();
        assert!(lacks.contains("TRIDENT_CPU_ISA=avx512bf16") && lacks.contains("supports up to avx2"), "{lacks}");
        let unknown = capped(Some("sse9"), Isa::Avx2).unwrap_err();
        assert!(unknown.contains("'sse9'") && unknown.contains("portable, avx2, avx512, avx512bf16"), "{unknown}");
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("48K\n"), Some(48 << 10));
        assert_eq!(parse_cache_size("2048K"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("32768"), Some(32768));
        for bad in ["", "K", "0K", "12Q", "-4K"] {
            assert_eq!(parse_cache_size(bad), None, "{bad}");
        }
        assert!(l1d_bytes().is_none_or(|b| b >= 1024), "{:?}", l1d_bytes());
    }

    #[test]
    fn levels_are_ordered_and_named() {
        for w in Isa::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
    }
}
