//! Which bf16 GEMM kernel this process runs. `TRIDENT_BF16_KERNEL` pins one (a kernel's name; one
//! this CPU cannot run, or no kernel's name, is one clear error before any command: `check`).
//! Otherwise, where the CPU (at the level `TRIDENT_CPU_ISA` allows) runs more than one fast
//! kernel, each multiplies the same product on one thread, in turns, best of `ROUNDS`, and the
//! fastest wins, a kernel later in `Bf16Kernel::ALL` only where it beats the choice so far by
//! `MARGIN` (so that timing noise never trades the preferred kernel for an equal one). Why measure:
//! `vdpbf16ps` does two products per lane at twice the FMA rate on Zen 4 and Zen 5, but at about
//! the FMA's instruction rate or below on some Intel Xeons, where the widened FMA kernel wins.
//!
//! The verdict is kept per CPU model and instruction-set level in trident's cache
//! (`cpu/bf16-gemm` under `files::cache_root`), one line each, so the ranks of later runs on that
//! model agree without measuring; delete the file to measure again. The file is read as crafted:
//! at most `MAX_CACHE_BYTES` of it, and a line that does not parse, or names a kernel this CPU
//! cannot run, is ignored (and dropped when the file is next written). It is written whole to a
//! temporary file and renamed. The kernels' results differ only where a product or a partial sum
//! is denormal (see the module above), so the choice changes speed, not the losses.

use super::{gemm_bf16_with, Bf16Kernel};
use crate::device::cpu::gemm::MatRef;
use crate::device::cpu::isa::{self, Isa};
use crate::device::cpu::pool::ThreadPool;
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

/// The variable that pins the bf16 kernel.
pub const KERNEL_VAR: &str = "TRIDENT_BF16_KERNEL";

/// The product each candidate runs (`m × n × k`): one row block and one depth block, about 0.1
/// GFLOP, a millisecond or two per run on one core.
const PROBE_SHAPE: (usize, usize, usize) = (128, 512, 768);
/// Timed runs per candidate, after one untimed run each.
const ROUNDS: usize = 4;
/// How much faster a later kernel must be than the choice so far to replace it.
const MARGIN: f64 = 0.10;
/// The most of the cache file that is read.
const MAX_CACHE_BYTES: u64 = 64 << 10;
/// The most entries the cache file keeps (the newest).
const MAX_ENTRIES: usize = 64;
/// The cache lines' format; a line of another is ignored.
const FORMAT: &str = "bf16-gemm-v1";

/// Each candidate's GFLOP/s on one core.
pub type Rates = Vec<(Bf16Kernel, f64)>;

/// The kernel this process runs and how it was chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub kernel: Bf16Kernel,
    pub how: How,
}

#[derive(Clone, Debug, PartialEq)]
pub enum How {
    /// The only fast kernel this CPU runs (or the portable one).
    Only,
    /// Named by `TRIDENT_BF16_KERNEL`.
    Pinned,
    /// Measured now: each candidate's GFLOP/s on one core.
    Measured(Rates),
    /// Measured by an earlier run on this CPU model, read from the cache file.
    Remembered(Rates),
}

impl Choice {
    /// The kernel's name and why, for `trident info`, bench headers and the training log.
    pub fn describe(&self) -> String {
        let rates = |r: &[(Bf16Kernel, f64)]| {
            r.iter().map(|(k, g)| format!("{} {g:.1}", k.name())).collect::<Vec<_>>().join(", ")
        };
        let why = match &self.how {
            How::Only => "the one fast kernel this CPU runs".to_string(),
            How::Pinned => format!("pinned by {KERNEL_VAR}"),
            How::Measured(r) => format!("measured, GFLOP/s on one core: {}", rates(r)),
            How::Remembered(r) => format!("measured before on this CPU model, GFLOP/s on one core: {}", rates(r)),
        };
        format!("{} ({why})", self.kernel.name())
    }
}

/// This process's choice, made once (a bad pin falls back to measuring here; `check` reports it).
pub fn chosen() -> &'static Choice {
    static CHOSEN: OnceLock<Choice> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok();
        if let Ok(Some(kernel)) = pinned(&env) {
            return Choice { kernel, how: How::Pinned };
        }
        let cache = crate::files::cache_root(&env).ok().map(|root| root.join("cpu").join("bf16-gemm"));
        choose(&candidates(), &key(), cache.as_deref(), &measure)
    })
}

/// The error of a `TRIDENT_BF16_KERNEL` that names no kernel or one this CPU cannot run.
pub fn check() -> Result<()> {
    pinned(&|k: &str| std::env::var(k).ok()).map(|_| ())
}

/// The kernel `TRIDENT_BF16_KERNEL` pins, if it is set.
fn pinned(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Bf16Kernel>> {
    let Some(value) = env(KERNEL_VAR).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let names = Bf16Kernel::ALL.map(Bf16Kernel::name).join(", ");
    let Some(kernel) = Bf16Kernel::parse(&value) else {
        return Err(Error::Config(format!(
            "{KERNEL_VAR}='{value}' names no bf16 GEMM kernel; expected one of {names}"
        )));
    };
    if !kernel.is_available() {
        return Err(Error::Config(format!(
            "{KERNEL_VAR}={value}: the kernel needs instruction set {}, and this CPU ({}) runs up to {}",
            kernel.isa().name(),
            isa::cpu_model().unwrap_or_else(|| "model unknown".into()),
            isa::active().name()
        )));
    }
    Ok(Some(kernel))
}

/// The kernels worth measuring here: every one this CPU runs but the portable one (which the
/// others always beat), preferred first.
fn candidates() -> Vec<Bf16Kernel> {
    Bf16Kernel::ALL.into_iter().filter(|k| k.is_available() && *k != Bf16Kernel::Portable).collect()
}

/// The cache key: the CPU model and the level the kernels may use.
fn key() -> String {
    format!("{}\t{}", isa::active().name(), clean(&isa::cpu_model().unwrap_or_else(|| "model unknown".into())))
}

/// A field for a cache line: no tab or line break inside.
fn clean(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// The choice among `candidates`: the only one, the cache's verdict for `key`, or `measure`'s
/// (then written to the cache).
fn choose(
    candidates: &[Bf16Kernel],
    key: &str,
    cache: Option<&Path>,
    measure: &dyn Fn(&[Bf16Kernel]) -> Rates,
) -> Choice {
    match candidates {
        [] => return Choice { kernel: Bf16Kernel::Portable, how: How::Only },
        [only] => return Choice { kernel: *only, how: How::Only },
        _ => {}
    }
    let entries = cache.map(read_cache).unwrap_or_default();
    if let Some((kernel, rates)) = entries.iter().find(|e| e.0 == key).and_then(|e| verdict(&e.1, candidates)) {
        return Choice { kernel, how: How::Remembered(rates) };
    }
    let rates = measure(candidates);
    let kernel = pick(&rates);
    if let Some(path) = cache {
        let line = format!("{kernel}\t{}", rates_field(&rates), kernel = kernel.name());
        // A cache that cannot be written costs the next run a measurement, nothing more.
        let _ = write_cache(path, entries, key, &line);
    }
    Choice { kernel, how: How::Measured(rates) }
}

/// The fastest of the measured kernels, preferring earlier ones within `MARGIN`.
fn pick(rates: &[(Bf16Kernel, f64)]) -> Bf16Kernel {
    let mut best = rates[0];
    for &(kernel, rate) in &rates[1..] {
        if rate > best.1 * (1.0 + MARGIN) {
            best = (kernel, rate);
        }
    }
    best.0
}

/// Times each candidate on `PROBE_SHAPE`, one thread, the runs of the candidates interleaved.
fn measure(candidates: &[Bf16Kernel]) -> Rates {
    let pool = ThreadPool::new(1);
    let (m, n, k) = PROBE_SHAPE;
    let (a, b) = (crate::rng::fill(m * k, 11), crate::rng::fill(k * n, 12));
    let mut c = vec![0.0f32; m * n];
    let mut best = vec![f64::MAX; candidates.len()];
    for round in 0..=ROUNDS {
        for (slot, &kernel) in best.iter_mut().zip(candidates) {
            let start = Instant::now();
            let (a, b) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
            gemm_bf16_with(kernel, &pool, m, n, k, a, b, &mut c, n, false);
            if round > 0 {
                *slot = slot.min(start.elapsed().as_secs_f64());
            }
        }
    }
    let flops = 2.0 * (m * n * k) as f64;
    candidates.iter().zip(best).map(|(&kernel, t)| (kernel, flops / t.max(1e-9) / 1e9)).collect()
}

/// A cache line's rates: `name=GFLOP/s` joined by commas.
fn rates_field(rates: &[(Bf16Kernel, f64)]) -> String {
    rates.iter().map(|(k, g)| format!("{}={g:.1}", k.name())).collect::<Vec<_>>().join(",")
}

/// A cache entry's kernel and rates (the value after the key: `kernel<TAB>rates`), where the
/// rates name exactly `candidates`, each once, and the kernel is one of them.
fn verdict(value: &str, candidates: &[Bf16Kernel]) -> Option<(Bf16Kernel, Rates)> {
    let (kernel, rates) = value.split_once('\t')?;
    let kernel = Bf16Kernel::parse(kernel).filter(|k| candidates.contains(k))?;
    let rates: Rates = rates
        .split(',')
        .map(|r| {
            let (name, rate) = r.split_once('=')?;
            Some((Bf16Kernel::parse(name)?, rate.parse::<f64>().ok().filter(|g| g.is_finite() && *g > 0.0)?))
        })
        .collect::<Option<_>>()?;
    let same = rates.len() == candidates.len() && candidates.iter().all(|c| rates.iter().any(|r| r.0 == *c));
    same.then_some((kernel, rates))
}

/// The cache file's entries as (key, value): lines of our format with a key (`isa<TAB>model`)
/// and a value; anything else is left out. A missing or unreadable file has none.
fn read_cache(path: &Path) -> Vec<(String, String)> {
    let Ok(file) = crate::files::open_regular(path, "the bf16 kernel cache") else { return Vec::new() };
    let mut text = Vec::new();
    if file.take(MAX_CACHE_BYTES).read_to_end(&mut text).is_err() {
        return Vec::new();
    }
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(5, '\t');
            let (format, level, model, kernel, rates) =
                (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            (format == FORMAT && Isa::parse(level).is_some() && !rates.contains('\t'))
                .then(|| (format!("{level}\t{model}"), format!("{kernel}\t{rates}")))
        })
        .collect()
}

/// Writes the cache with `entries` (the file's, as read) and `key`'s new `value`, the newest
/// `MAX_ENTRIES` kept: to a temporary file, then renamed over the old one.
fn write_cache(path: &Path, entries: Vec<(String, String)>, key: &str, value: &str) -> std::io::Result<()> {
    let mut kept: Vec<(String, String)> = entries.into_iter().filter(|e| e.0 != key).collect();
    kept.push((key.to_string(), value.to_string()));
    let start = kept.len().saturating_sub(MAX_ENTRIES);
    let text: String = kept[start..].iter().map(|(k, v)| format!("{FORMAT}\t{k}\t{v}\n")).collect();
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temporary: PathBuf = dir.join(format!(".bf16-gemm.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&temporary).and_then(|mut f| f.write_all(text.as_bytes()));
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&temporary);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Bf16Kernel::{Avx2, Avx512, Avx512Bf16, Portable};

    #[test]
    fn a_later_kernel_must_win_by_the_margin() {
        assert_eq!(pick(&[(Avx512Bf16, 100.0), (Avx512, 109.0)]), Avx512Bf16);
        assert_eq!(pick(&[(Avx512Bf16, 100.0), (Avx512, 111.0)]), Avx512);
        assert_eq!(pick(&[(Avx512Bf16, 230.0), (Avx512, 115.0), (Avx2, 100.0)]), Avx512Bf16);
        assert_eq!(pick(&[(Avx512Bf16, 60.0), (Avx512, 115.0), (Avx2, 120.0)]), Avx512);
        assert_eq!(pick(&[(Avx512, 100.0), (Avx2, 130.0)]), Avx2);
    }

    #[test]
    fn the_pin_names_a_kernel_this_cpu_runs() {
        let env = |value: &'static str| move |k: &str| (k == KERNEL_VAR).then(|| value.to_string());
        assert_eq!(pinned(&env("")).unwrap(), None);
        assert_eq!(pinned(&|_: &str| None).unwrap(), None);
        assert_eq!(pinned(&env(" portable ")).unwrap(), Some(Portable));
        let unknown = pinned(&env("amx")).unwrap_err().to_string();
        assert!(unknown.contains("'amx'") && unknown.contains("avx512bf16, avx512, avx2, portable"), "{unknown}");
        for kernel in Bf16Kernel::ALL {
            let got = pinned(&env(kernel.name()));
            match kernel.is_available() {
                true => assert_eq!(got.unwrap(), Some(kernel)),
                false => assert!(got.unwrap_err().to_string().contains("runs up to"), "{}", kernel.name()),
            }
        }
    }

    /// A fresh cache directory under the system's temporary folder.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("trident-bf16-choice-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_measured_choice_is_remembered_per_model_and_level() {
        let dir = scratch("remember");
        let file = dir.join("cpu").join("bf16-gemm");
        let measured = std::cell::Cell::new(0);
        let measure = |c: &[Bf16Kernel]| {
            measured.set(measured.get() + 1);
            c.iter().enumerate().map(|(i, &k)| (k, 50.0 + 100.0 * i as f64)).collect()
        };
        let both = [Avx512Bf16, Avx512];
        let first = choose(&both, "avx512bf16\tModel A", Some(&file), &measure);
        assert_eq!((first.kernel, measured.get()), (Avx512, 1));
        assert!(matches!(first.how, How::Measured(_)), "{first:?}");
        let again = choose(&both, "avx512bf16\tModel A", Some(&file), &measure);
        assert_eq!((again.kernel, measured.get()), (Avx512, 1), "read back, not measured");
        assert_eq!(again.how, How::Remembered(vec![(Avx512Bf16, 50.0), (Avx512, 150.0)]));
        assert!(again.describe().starts_with("avx512 (measured before"), "{}", again.describe());
        // Another model, and the same model under another level, are measured; both lines stay.
        choose(&both, "avx512bf16\tModel B", Some(&file), &measure);
        choose(&[Avx512, Avx2], "avx512\tModel A", Some(&file), &measure);
        assert_eq!(measured.get(), 3);
        assert_eq!(read_cache(&file).len(), 3);
        // One candidate, or none, is never measured.
        assert_eq!(choose(&[Avx2], "k", Some(&file), &measure).kernel, Avx2);
        assert_eq!(choose(&[], "k", None, &measure), Choice { kernel: Portable, how: How::Only });
        assert_eq!(measured.get(), 3);
        let names: Vec<_> =
            std::fs::read_dir(file.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["bf16-gemm"], "no temporary file left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A crafted cache: lines that do not parse, kernels this CPU lacks or rates for other
    /// candidates, an oversized file; each is measured past, and the rewritten file keeps only
    /// lines that parse.
    #[test]
    fn a_crafted_cache_is_measured_past() {
        let dir = scratch("crafted");
        let file = dir.join("bf16-gemm");
        std::fs::create_dir_all(&dir).unwrap();
        let measure = |c: &[Bf16Kernel]| c.iter().map(|&k| (k, 100.0)).collect::<Vec<_>>();
        let both = [Avx512Bf16, Avx512];
        let key = "avx512bf16\tModel";
        for crafted in [
            "garbage\n",
            "bf16-gemm-v1\tavx512bf16\tModel\tamx\tamx=900\n",
            "bf16-gemm-v1\tavx512bf16\tModel\tavx2\tavx512bf16=1,avx512=2\n",
            "bf16-gemm-v1\tavx512bf16\tModel\tavx512\tavx512bf16=1\n",
            "bf16-gemm-v1\tavx512bf16\tModel\tavx512\tavx512bf16=1,avx512=NaN\n",
            "bf16-gemm-v1\tavx512bf16\tModel\tavx512\tavx512bf16=1,avx512=-5\n",
            "bf16-gemm-v1\tsse9\tModel\tavx512\tavx512bf16=1,avx512=2\n",
            "bf16-gemm-v2\tavx512bf16\tModel\tavx512\tavx512bf16=1,avx512=2\n",
        ] {
            std::fs::write(&file, crafted).unwrap();
            let choice = choose(&both, key, Some(&file), &measure);
            assert_eq!(choice.kernel, Avx512Bf16, "{crafted:?}");
            assert!(matches!(choice.how, How::Measured(_)), "{crafted:?}");
        }
        // Past the read limit nothing more is read: the entry beyond it is not found.
        let mut big = "x".repeat(MAX_CACHE_BYTES as usize);
        big.push_str("\nbf16-gemm-v1\tavx512bf16\tModel\tavx512\tavx512bf16=1,avx512=2\n");
        std::fs::write(&file, &big).unwrap();
        assert!(matches!(choose(&both, key, Some(&file), &measure).how, How::Measured(_)));
        assert!(std::fs::metadata(&file).unwrap().len() < 200, "rewritten without the junk");
        // A directory where the file should be: measured, nothing written, no error.
        let _ = std::fs::remove_file(&file);
        std::fs::create_dir_all(&file).unwrap();
        assert!(matches!(choose(&both, key, Some(&file), &measure).how, How::Measured(_)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_keeps_the_newest_entries() {
        let dir = scratch("newest");
        let file = dir.join("bf16-gemm");
        for model in 0..MAX_ENTRIES + 5 {
            let entries = read_cache(&file);
            write_cache(&file, entries, &format!("avx2\tModel {model}"), "avx2\tavx2=1.0").unwrap();
        }
        let entries = read_cache(&file);
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert_eq!(entries.last().unwrap().0, format!("avx2\tModel {}", MAX_ENTRIES + 4));
        assert_eq!(entries[0].0, "avx2\tModel 5");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The probe runs every candidate this CPU has and reports a rate for each.
    #[test]
    fn the_probe_times_every_candidate() {
        let candidates = candidates();
        let rates = measure(&candidates);
        assert_eq!(rates.iter().map(|r| r.0).collect::<Vec<_>>(), candidates);
        assert!(rates.iter().all(|r| r.1.is_finite() && r.1 > 0.0), "{rates:?}");
        assert!(chosen().kernel.is_available());
        assert_eq!(clean("a\tb\nc"), "a b c");
    }
}
