//! `trident check losses A.jsonl B.jsonl [--rtol R]`: two training runs' `--log-json` losses
//! (`log::read_losses`) compared iteration by iteration, one line each and a verdict.

use crate::error::{Error, Result};

/// `trident check losses A.jsonl B.jsonl [--rtol R]`: two runs' `--log-json` losses, iteration by
/// iteration; fails when an iteration is missing from one of them or differs by more than `R`
/// (relative; default 5e-3, bf16's agreement between backends).
pub fn run(args: &[String]) -> Result<()> {
    let (mut files, mut rtol) = (Vec::new(), 5e-3f64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--rtol" {
            let v = it.next().ok_or_else(|| Error::Usage("check losses: --rtol needs a value".into()))?;
            rtol = v
                .parse()
                .ok()
                .filter(|r: &f64| *r >= 0.0)
                .ok_or_else(|| Error::Usage(format!("check losses: --rtol takes a number >= 0, not {v:?}")))?;
        } else {
            files.push(std::path::PathBuf::from(a));
        }
    }
    let [a, b] = files.as_slice() else {
        return Err(Error::Usage(
            "check losses needs two --log-json files: check losses A.jsonl B.jsonl [--rtol R]".into(),
        ));
    };
    let (la, lb) = (crate::log::read_losses(a)?, crate::log::read_losses(b)?);
    if la.is_empty() {
        return Err(Error::Usage(format!("check losses: {} holds no losses", a.display())));
    }
    let its = |l: &[(u64, f64)]| l.iter().map(|x| x.0).collect::<Vec<_>>();
    if its(&la) != its(&lb) {
        return Err(Error::Usage(format!(
            "check losses: {} logs iterations {:?}, {} logs {:?}",
            a.display(),
            its(&la),
            b.display(),
            its(&lb)
        )));
    }
    let mut worst = 0.0f64;
    for ((i, x), (_, y)) in la.iter().zip(&lb) {
        let rel = (x - y).abs() / x.abs().max(1e-30);
        println!("iteration {i:>5}: {x:.6} {y:.6} (relative difference {rel:.2e})");
        if rel > rtol || rel.is_nan() {
            return Err(Error::Check(format!(
                "check losses: iteration {i}: {x} in {} and {y} in {} differ by {rel:.2e} > {rtol:e}",
                a.display(),
                b.display()
            )));
        }
        worst = worst.max(rel);
    }
    println!("losses check: {} iterations agree within {rtol:e} (largest relative difference {worst:.2e})", la.len());
    Ok(())
}
