//! `trident check data [train flags] [--dump FILE] [--dump-samples N]`: the datasets `train`
//! would build from the same flags, described split by split, and optionally their samples'
//! token ids as JSON lines, so a user can compare them with Megatron's before a long run.

use super::super::flags;
use crate::config::TrainConfig;
use crate::data::datasets::{Dataset, SPLIT_NAMES};
use crate::error::{Error, Result};
use crate::flags::CHECK_DATA_FLAGS;
use std::io::Write;

pub fn run(args: &[String]) -> Result<()> {
    let summary = "the datasets `train` builds from the same flags: splits, blends, epochs; --dump writes samples";
    let Some(a) = flags("check data", summary, CHECK_DATA_FLAGS, args)? else {
        return Ok(());
    };
    let cfg = TrainConfig::from_args(&a)?;
    let sets = crate::train::build_datasets(&cfg)?;
    let splits = [Some(&sets.train), sets.valid.as_ref(), sets.test.as_ref()];
    for (name, split) in SPLIT_NAMES.iter().zip(splits) {
        match split {
            None => println!("{name}: none"),
            Some(ds) => println!("{name}: {}", describe(ds)),
        }
    }
    let Some(path) = a.path("--dump") else { return Ok(()) };
    let per_split = a.usize("--dump-samples")?.unwrap_or(1000);
    let file = std::fs::File::create(&path).map_err(|e| Error::io(&path, "create", e))?;
    let mut out = std::io::BufWriter::new(file);
    let mut sample = vec![0u32; cfg.seq_length + 1];
    let mut written = 0;
    for (name, split) in SPLIT_NAMES.iter().zip(splits) {
        let Some(ds) = split else { continue };
        for i in 0..per_split.min(ds.len()) {
            ds.get(i, &mut sample)?;
            let tokens: Vec<String> = sample.iter().map(u32::to_string).collect();
            writeln!(out, "{{\"split\": \"{name}\", \"sample\": {i}, \"tokens\": [{}]}}", tokens.join(", "))
                .map_err(|e| Error::io(&path, "write", e))?;
            written += 1;
        }
    }
    out.flush().map_err(|e| Error::io(&path, "write", e))?;
    println!("wrote {written} samples to {}", path.display());
    Ok(())
}

/// "4000 samples of 2 datasets: a 30.0% (1202 drawn of 1208 built, 2 epochs), b …".
fn describe(ds: &Dataset) -> String {
    match ds {
        Dataset::Single(d) => format!("{} samples, {} epochs, {}", d.len(), d.num_epochs(), d.describe()),
        Dataset::Blended(b) => {
            let drawn = b.drawn();
            let parts: Vec<String> = b
                .datasets()
                .iter()
                .zip(&drawn)
                .map(|(d, &n)| {
                    let share = 100.0 * n as f64 / b.len().max(1) as f64;
                    format!("{} {share:.1}% ({n} drawn of {} built, {} epochs)", d.describe(), d.len(), d.num_epochs())
                })
                .collect();
            format!("{} samples blended from {} datasets: {}", b.len(), parts.len(), parts.join("; "))
        }
    }
}
