//! Training output: aligned log lines in Megatron's format for people, and (behind
//! `--log-json`) the same figures as JSON lines for programs, and (behind `--tensorboard-dir`)
//! as TensorBoard scalars under Megatron's tags.

pub mod tensorboard;

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The figures of one logged iteration, averaged over the iterations since the previous log line.
#[derive(Clone, Debug, Default)]
pub struct IterationStats {
    pub iteration: u64,
    pub train_iters: u64,
    pub consumed_samples: u64,
    pub ms_per_iter: f64,
    pub lr: f64,
    pub global_batch_size: usize,
    pub loss: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub tflops: f64,
    pub mfu: f64,
    pub val_loss: Option<f64>,
    /// The loss scale in force (1 without fp16) and the steps skipped for overflow so far.
    pub loss_scale: f64,
    pub skipped_iterations: u64,
    /// The parameters' L2 norm after the step, under `--log-params-norm`.
    pub params_norm: Option<f64>,
    /// The gradient elements that are zero, each parameter counted once, under
    /// `--log-num-zeros-in-grad`.
    pub num_zeros: Option<u64>,
}

/// `[2026-11-22 01:02:03]` in UTC, as Megatron stamps its lines.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm), valid for every date after 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Scientific notation as Python's `{:.6E}` prints it (and so Megatron's logs): a signed,
/// at-least-two-digit exponent, `2.500000E-03`.
pub fn sci(x: f64, digits: usize) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let s = format!("{x:.digits$E}");
    match s.split_once('E') {
        Some((mantissa, exp)) => {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            format!("{mantissa}E{sign}{digits:0>2}")
        }
        None => s,
    }
}

pub fn iteration_line(s: &IterationStats) -> String {
    let width = s.train_iters.to_string().len().max(4);
    format!(
        " [{}] iteration {:>width$}/{:>width$} | consumed samples: {:>10} | elapsed time per iteration (ms): {:.1} | \
         learning rate: {} | global batch size: {:>5} | lm loss: {} | loss scale: {:.1} | grad norm: {:.3} | \
         {}{}number of skipped iterations: {:>3} | tokens/s: {:.0} | TFLOP/s: {:.3} | MFU: {:.1}% |",
        timestamp(),
        s.iteration,
        s.train_iters,
        s.consumed_samples,
        s.ms_per_iter,
        sci(s.lr, 6),
        s.global_batch_size,
        sci(s.loss, 6),
        s.loss_scale,
        s.grad_norm,
        s.num_zeros.map_or(String::new(), |n| format!("num zeros: {n} | ")),
        s.params_norm.map_or(String::new(), |n| format!("params norm: {n:.3} | ")),
        s.skipped_iterations,
        s.tokens_per_s,
        s.tflops,
        100.0 * s.mfu,
    )
}

pub fn validation_line(label: &str, iteration: u64, loss: f64) -> String {
    let text = format!(
        " {label} loss at iteration {iteration} | lm loss value: {} | lm loss PPL: {} | ",
        sci(loss, 6),
        sci(loss.min(700.0).exp(), 6)
    );
    let rule = "-".repeat(text.len());
    format!("{rule}\n{text}\n{rule}")
}

/// A logged iteration's TensorBoard scalars, the window's figures (step: the iteration; Megatron
/// writes its "iteration-time" and "throughput" on the log line too). The iteration's own loss,
/// rate, batch, loss scale and norm come every `--tensorboard-log-interval` (`step_scalars`).
/// `peak_memory_bytes` is the process's peak resident memory, where the system reports it.
pub fn tensorboard_scalars(s: &IterationStats, peak_memory_bytes: Option<u64>) -> Vec<(&'static str, f64)> {
    let mut v = vec![
        ("iteration-time", s.ms_per_iter / 1e3),
        ("throughput", s.tflops),
        ("tokens-per-second", s.tokens_per_s),
        ("mfu", s.mfu),
        ("skipped-iterations", s.skipped_iterations as f64),
    ];
    if let Some(bytes) = peak_memory_bytes {
        v.push(("mem-max-rss-bytes", bytes as f64));
    }
    v
}

/// One iteration's own figures, as Megatron writes them every `--tensorboard-log-interval`
/// iterations (not averaged over the log window).
pub struct StepFigures {
    pub loss: f64,
    pub lr: f64,
    pub global_batch_size: usize,
    pub loss_scale: f64,
    /// None for a step the loss scaler skipped (Megatron has no norm for it).
    pub grad_norm: Option<f64>,
    /// Under `--log-params-norm`.
    pub params_norm: Option<f64>,
    /// Under `--log-num-zeros-in-grad`.
    pub num_zeros: Option<u64>,
    /// The ranks of the run, under `--log-world-size-to-tensorboard`.
    pub world_size: Option<usize>,
}

/// Megatron's per-iteration tags and their "vs samples" copies.
const STEP_TAGS: [(&str, &str); 8] = [
    ("lm loss", "lm loss vs samples"),
    ("learning-rate", "learning-rate vs samples"),
    ("batch-size", "batch-size vs samples"),
    ("loss-scale", "loss-scale vs samples"),
    ("grad-norm", "grad-norm vs samples"),
    ("num-zeros", "num-zeros vs samples"),
    ("params-norm", "params-norm vs samples"),
    ("world-size", "world-size vs samples"),
];

/// An iteration's per-iteration scalars under Megatron's tags: `[0]` against the iteration,
/// `[1]` the "vs samples" copies against the consumed samples.
pub fn step_scalars(s: &StepFigures) -> [Vec<(&'static str, f64)>; 2] {
    let world_size = s.world_size.map(|w| w as f64);
    let values = [
        Some(s.loss),
        Some(s.lr),
        Some(s.global_batch_size as f64),
        Some(s.loss_scale),
        s.grad_norm,
        s.num_zeros.map(|n| n as f64),
        s.params_norm,
        world_size,
    ];
    let present = || STEP_TAGS.iter().zip(values).filter_map(|(tags, v)| v.map(|v| (tags, v)));
    [present().map(|(t, v)| (t.0, v)).collect(), present().map(|(t, v)| (t.1, v)).collect()]
}

/// A number as JSON: non-finite values become null, since JSON has no NaN.
fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_string()
    }
}

pub fn json_line(s: &IterationStats) -> String {
    let mut line = format!(
        "{{\"iteration\": {}, \"loss\": {}, \"lr\": {}, \"grad_norm\": {}, \"ms_per_iter\": {}, \
         \"tokens_per_s\": {}, \"tflops\": {}, \"mfu\": {}, \"consumed_samples\": {}, \"global_batch_size\": {}, \
         \"loss_scale\": {}, \"skipped_iterations\": {}",
        s.iteration,
        json_number(s.loss),
        json_number(s.lr),
        json_number(s.grad_norm),
        json_number(s.ms_per_iter),
        json_number(s.tokens_per_s),
        json_number(s.tflops),
        json_number(s.mfu),
        s.consumed_samples,
        s.global_batch_size,
        json_number(s.loss_scale),
        s.skipped_iterations,
    );
    if let Some(v) = s.val_loss {
        line.push_str(&format!(", \"val_loss\": {}", json_number(v)));
    }
    if let Some(n) = s.params_norm {
        line.push_str(&format!(", \"params_norm\": {}", json_number(n)));
    }
    if let Some(n) = s.num_zeros {
        line.push_str(&format!(", \"num_zeros\": {n}"));
    }
    line.push('}');
    line
}

/// The `--log-json` file, flushed after every line so a crashed run keeps what it logged.
pub struct JsonLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonLog {
    /// Opens for appending when resuming (so one file holds the whole run), else truncates.
    pub fn open(path: &Path, append: bool) -> Result<JsonLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|e| Error::io(path, "open for writing", e))?;
        Ok(JsonLog { path: path.to_path_buf(), out: BufWriter::new(file) })
    }

    pub fn write(&mut self, s: &IterationStats) -> Result<()> {
        writeln!(self.out, "{}", json_line(s))
            .and_then(|_| self.out.flush())
            .map_err(|e| Error::io(&self.path, "write", e))
    }
}

/// The `(iteration, loss)` pairs of a `--log-json` file (lines without a numeric loss skipped).
pub fn read_losses(path: &Path) -> Result<Vec<(u64, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
    let number = |line: &str, key: &str| -> Option<f64> {
        let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
        let rest = &line[at..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let Some(iteration) = number(line, "iteration") else {
            return Err(Error::Format {
                path: path.to_path_buf(),
                problem: format!("line {} is not a --log-json line (no \"iteration\")", n + 1),
            });
        };
        if let Some(loss) = number(line, "loss") {
            out.push((iteration as u64, loss));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_documented_keys() {
        let s = IterationStats { iteration: 3, loss: 2.5, val_loss: Some(2.25), ..Default::default() };
        let j = json_line(&s);
        for key in ["iteration", "loss", "lr", "grad_norm", "ms_per_iter", "tokens_per_s", "tflops", "mfu", "val_loss"]
        {
            assert!(j.contains(&format!("\"{key}\": ")), "{key} missing in {j}");
        }
        assert!(j.contains("\"global_batch_size\": "), "global_batch_size missing in {j}");
        let nan = IterationStats { loss: f64::NAN, ..Default::default() };
        assert!(json_line(&nan).contains("\"loss\": null"));
    }

    #[test]
    fn read_losses_reads_back_json_lines() {
        let dir = std::env::temp_dir().join(format!("trident-read-losses-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.jsonl");
        let a = IterationStats { iteration: 1, loss: 2.5, ..Default::default() };
        let b = IterationStats { iteration: 2, loss: 2.25, val_loss: Some(2.0), ..Default::default() };
        let nan = IterationStats { iteration: 3, loss: f64::NAN, ..Default::default() };
        std::fs::write(&p, format!("{}\n{}\n{}\n", json_line(&a), json_line(&b), json_line(&nan))).unwrap();
        assert_eq!(read_losses(&p).unwrap(), vec![(1, 2.5), (2, 2.25)]);
        std::fs::write(&p, "not json\n").unwrap();
        assert!(read_losses(&p).unwrap_err().to_string().contains("line 1 is not a --log-json line"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scientific_notation_matches_python() {
        assert_eq!(sci(0.0025, 6), "2.500000E-03");
        assert_eq!(sci(4.935883, 6), "4.935883E+00");
        assert_eq!(sci(12345.0, 2), "1.23E+04");
        assert_eq!(sci(1e-120, 1), "1.0E-120");
    }

    #[test]
    fn timestamp_is_well_formed() {
        let t = timestamp();
        assert_eq!(t.len(), 19, "{t}");
        assert!(t.starts_with("20"));
    }
}
