//! How fast a GPU runs the kernels of a layer, as fractions of its dense peak: GEMMs by shape and
//! flash attention, built in per GPU or calibrated from measurements (`plan --calibrate FILE`).
//!
//! GEMMs: a product of M x N x K reaches `max · K / (K + k_half)` of peak. The inner dimension is
//! what tensor parallelism shrinks (the projection and fc2 take K = h/t and a4h/t), and it sets how
//! much of each output tile's time goes to loading operands rather than multiplying them. Fitted to
//! 156 bf16 cuBLAS products on an H100 (BENCHMARKS.md, "Planner calibration"): max 0.72, k_half 170,
//! RMS error 0.028 of peak, against 0.035 for one constant.
//!
//! Attention: flash attention's forward and backward (the backward recomputing the scores) run at
//! one fraction of peak on the FLOPs they execute: causal, 2bs²d per head forward, 2.5x that
//! backward.

use crate::data::json::Json;
use crate::error::{Error, Result};
use std::path::Path;

/// A GPU's kernel efficiencies and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Efficiency {
    /// Fraction of peak a GEMM with a long inner dimension reaches.
    pub gemm_max: f64,
    /// The inner dimension at which a GEMM reaches half of `gemm_max` (0: shape-blind).
    pub gemm_k_half: f64,
    /// Fraction of peak flash attention's causal forward + backward reaches.
    pub attention: f64,
    /// Fraction of the kernels' isolated speed a whole training step keeps (launch gaps, clocks
    /// under sustained power, host work between kernels): compute times are divided by it.
    pub step: f64,
    /// Where the figures came from, for the report.
    pub source: String,
}

impl Efficiency {
    /// Fraction of peak for one product of `k`-long dot products.
    pub fn gemm(&self, k: f64) -> f64 {
        self.gemm_max * k / (k + self.gemm_k_half)
    }
}

/// What `calibrate` read from a file of benchmark records.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub gemms: usize,
    pub attentions: usize,
    /// RMS difference between the fitted GEMM model and the measured fractions.
    pub gemm_rms: f64,
}

/// Fits `max · k / (k + k_half)` to measured (k, fraction) points by least squares: k_half on a
/// 10-wide grid up to 4000, max in closed form for each. Returns (max, k_half, rms).
pub fn fit_gemm(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let mut best = (f64::INFINITY, 0.0, 0.0);
    for step in 0..=400 {
        let k_half = 10.0 * step as f64;
        let x: Vec<f64> = points.iter().map(|&(k, _)| k / (k + k_half)).collect();
        let max = x.iter().zip(points).map(|(x, p)| x * p.1).sum::<f64>() / x.iter().map(|x| x * x).sum::<f64>();
        let err: f64 = x.iter().zip(points).map(|(x, p)| (max * x - p.1).powi(2)).sum();
        if err < best.0 {
            best = (err, max, k_half);
        }
    }
    (best.1, best.2, (best.0 / points.len() as f64).sqrt())
}

/// The dimensions of a bench record's "shape": "MxNxK" (PyTorch's) or "MxNxK NT" (trident's) for a
/// GEMM, "BxSxHxD" or "b1 s4096 h16 d128 causal fwd+bwd" for attention.
fn dims(shape: &str) -> Option<Vec<f64>> {
    let first = shape.split_whitespace().next()?;
    if first.contains('x') {
        return first.split('x').map(|d| d.parse::<f64>().ok().filter(|v| *v > 0.0)).collect();
    }
    let mut out = Vec::new();
    for (tag, word) in ["b", "s", "h", "d"].iter().zip(shape.split_whitespace()) {
        out.push(word.strip_prefix(tag)?.parse::<f64>().ok().filter(|v| *v > 0.0)?);
    }
    Some(out)
}

/// Reads `trident bench gemm|attention --json` or `tests/gpu/plan-calibrate.sh` output (JSON lines;
/// other records are skipped) and fits `eff` to it: the GEMMs' model by least squares, attention
/// as total FLOPs over total time of its forward + backward records. 16-bit records only; `peak`
/// is the GPU's dense 16-bit FLOP/s. Needs at least 3 GEMMs; attention keeps `eff`'s figure when
/// the file has none.
pub fn calibrate(path: &Path, peak: f64, eff: &mut Efficiency) -> Result<Calibration> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
    let (mut gemms, mut attention) = (Vec::new(), (0usize, 0.0f64, 0.0f64));
    for (i, line) in text.lines().enumerate().filter(|(_, l)| l.trim_start().starts_with('{')) {
        let record = crate::data::json::document(line.as_bytes(), path)
            .map_err(|_| Error::format(path, format!("line {} is not a JSON object", i + 1)))?;
        let field = |k: &str| record.get(k).and_then(Json::as_str).unwrap_or("");
        let ms = record.get("ms").and_then(Json::as_f64).filter(|v| v.is_finite() && *v > 0.0);
        let sixteen = matches!(field("dtype"), "bf16" | "fp16" | "f16");
        let (Some(ms), Some(d), true) = (ms, dims(field("shape")), sixteen) else { continue };
        match field("bench") {
            "gemm" if d.len() == 3 => gemms.push((d[2], 2.0 * d[0] * d[1] * d[2] / (ms * 1e-3) / peak)),
            // Forward + backward: PyTorch's case without ".fwd", trident's "fwd+bwd" record.
            "attention" if d.len() == 4 && !field("case").ends_with(".fwd") => {
                let trident_record = field("shape").contains(' ');
                if trident_record && !field("shape").ends_with("fwd+bwd") {
                    continue;
                }
                let flops = 3.5 * 2.0 * d[0] * d[2] * d[1] * d[1] * d[3];
                attention = (attention.0 + 1, attention.1 + flops, attention.2 + ms * 1e-3);
            }
            _ => {}
        }
    }
    if gemms.len() < 3 {
        return Err(Error::format(
            path,
            format!(
                "{} 16-bit GEMM records (\"bench\": \"gemm\" with \"shape\" MxNxK and \"ms\"); calibration needs at least 3 \
                 (tests/gpu/plan-calibrate.sh or `trident bench gemm --device cuda --dtype bf16 --json` writes them)",
                gemms.len()
            ),
        ));
    }
    let (max, k_half, rms) = fit_gemm(&gemms);
    eff.gemm_max = max.min(1.0);
    eff.gemm_k_half = k_half;
    if attention.0 > 0 {
        eff.attention = (attention.1 / attention.2 / peak).min(1.0);
    }
    eff.source = format!(
        "calibrated from {} ({} GEMMs, fit RMS {:.3}; {} attention records{})",
        path.display(),
        gemms.len(),
        rms,
        attention.0,
        if attention.0 == 0 { ", attention figure kept" } else { "" }
    );
    Ok(Calibration { gemms: gemms.len(), attentions: attention.0, gemm_rms: rms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_planted_model() {
        let points: Vec<(f64, f64)> =
            [512.0, 1024.0, 2048.0, 4096.0, 8192.0].iter().map(|&k| (k, 0.8 * k / (k + 300.0))).collect();
        let (max, k_half, rms) = fit_gemm(&points);
        assert!((max - 0.8).abs() < 1e-9 && k_half == 300.0 && rms < 1e-9, "{max} {k_half} {rms}");
    }

    #[test]
    fn shapes_of_both_benches_parse() {
        assert_eq!(dims("4096x2304x768 NT"), Some(vec![4096.0, 2304.0, 768.0]));
        assert_eq!(dims("1x4096x16x128"), Some(vec![1.0, 4096.0, 16.0, 128.0]));
        assert_eq!(dims("b1 s4096 h16 d128 causal fwd+bwd"), Some(vec![1.0, 4096.0, 16.0, 128.0]));
        assert_eq!(dims("4096x0x768"), None);
        assert_eq!(dims("gpt2-124m L12 h768"), None);
    }
}
