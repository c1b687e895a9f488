//! Random corruption of valid files, 100 trials per kind of input (trident checkpoints, Hugging
//! Face directories, tokenizer files, `.bin/.idx` datasets): byte changes, numbers that size
//! gigabytes or overflow, truncations, repeated and deleted runs, and for checkpoints a checksum
//! sealed again over the damage so the parser behind it is reached. Every run must end with exit
//! 0 or with exit 1 and one error line, never a panic, a signal or a hang, and stay under
//! `peak_bound_kib` of its input. A fixed seed per kind, so a failure reproduces.

mod common;
#[path = "common/untrusted.rs"]
mod untrusted;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use untrusted::*;

const TRIALS: usize = 100;

/// Numbers a hostile file would hold, as text and as 64-bit fields.
const TEXT_VALUES: &[&str] = &[
    "0",
    "-1",
    "4294967294",
    "4294967361",
    "9223372036854775808",
    "4611686018427387904",
    "1e30",
    "100000000000",
    "\"",
    "{",
    "]",
    "null",
    "\\u0000",
    ",",
];
const FIELD_VALUES: &[u64] = &[0, 1, 3, u64::MAX, 1 << 62, 1 << 32, 1 << 40];

/// One to four random edits of `bytes`; `text` picks edits that keep a JSON file's shape
/// plausible.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, text: bool) {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len().max(1));
        match rng.below(6) {
            0 if !bytes.is_empty() => bytes[at] = rng.next() as u8,
            // The next run of digits replaced by a hostile number: the file stays well-formed.
            5 if text => {
                let Some(start) = bytes[at..].iter().position(u8::is_ascii_digit).map(|i| at + i) else { continue };
                let end = start + bytes[start..].iter().take_while(|b| b.is_ascii_digit()).count();
                let v = TEXT_VALUES[rng.below(8)];
                bytes.splice(start..end, v.bytes());
            }
            1 if text => {
                let v = TEXT_VALUES[rng.below(TEXT_VALUES.len())];
                bytes.splice(at..at, v.bytes());
            }
            1 if bytes.len() >= 8 => {
                let at = at.min(bytes.len() - 8);
                bytes[at..at + 8].copy_from_slice(&FIELD_VALUES[rng.below(FIELD_VALUES.len())].to_le_bytes());
            }
            2 => bytes.truncate(at),
            3 => {
                let end = (at + 1 + rng.below(64)).min(bytes.len());
                let run = bytes[at.min(end)..end].to_vec();
                let to = rng.below(bytes.len().max(1));
                bytes.splice(to..to, run);
            }
            _ => {
                let end = (at + 1 + rng.below(64)).min(bytes.len());
                bytes.drain(at.min(end)..end);
            }
        }
    }
}

/// Asserts that a run on a corrupted input ended cleanly; returns a description of what went
/// wrong instead of panicking, so every bad trial is listed.
fn clean_end(m: &Measured, input_bytes: u64, trial: &str) -> Option<String> {
    let err = stderr(&m.out);
    let code = m.out.status.code();
    let errors = err.lines().filter(|l| l.starts_with("trident: error:")).count();
    let bound = peak_bound_kib(input_bytes);
    let bad = if let Some(sig) = m.out.status.signal() {
        format!("signal {sig}")
    } else if err.contains("panicked") {
        "a panic".into()
    } else if code == Some(1) && errors != 1 {
        format!("{errors} error lines")
    } else if code != Some(0) && code != Some(1) {
        format!("exit {code:?}")
    } else if m.peak_kib > bound {
        format!("peak {} KiB above {bound} KiB", m.peak_kib)
    } else {
        return None;
    };
    Some(format!("{trial}: {bad}: {}", err.lines().last().unwrap_or("")))
}

/// Runs `TRIALS` trials: each copies `fixture` to a fresh directory, corrupts one of its files
/// (chosen by `pick`), and runs `commands` on the copy.
fn fuzz(
    name: &str,
    seed: u64,
    fixture: &Path,
    pick: &dyn Fn(&mut Rng, &Path) -> (PathBuf, bool),
    commands: &dyn Fn(&Path, &Path) -> Vec<Vec<String>>,
) {
    let dir = scratch(&format!("fuzz-{name}"));
    let mut rng = Rng(seed);
    let (mut failures, mut refused) = (Vec::new(), 0);
    for trial in 0..TRIALS {
        let copy = dir.join(format!("t{trial}"));
        copy_tree(fixture, &copy);
        let (file, text) = pick(&mut rng, &copy);
        let mut bytes = std::fs::read(&file).unwrap();
        mutate(&mut rng, &mut bytes, text);
        std::fs::write(&file, &bytes).unwrap();
        for args in commands(&copy, &dir.join(format!("out{trial}"))) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let m = run_measured(&args);
            refused += usize::from(m.out.status.code() == Some(1));
            let what = format!("{name} trial {trial} ({}, {})", file.display(), args[0]);
            failures.extend(clean_end(&m, bytes_under(&copy), &what));
        }
        let _ = std::fs::remove_dir_all(&copy);
    }
    println!("{name}: {TRIALS} trials, {refused} runs refused with one error, {} failures", failures.len());
    assert!(failures.is_empty(), "{} bad ends:\n{}", failures.len(), failures.join("\n"));
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn corrupted_checkpoints_end_cleanly() {
    let dir = scratch("fuzz-checkpoint-base");
    let ck = gpt2_checkpoint(&dir, "ck");
    // Half the trials seal the checksum again over the damage, to reach the parser behind it.
    let pick = |rng: &mut Rng, copy: &Path| {
        let file = shard_file(copy);
        if rng.below(2) == 0 {
            // The metadata (after magic, version and its length) edited as text, its length
            // field kept true.
            let mut bytes = std::fs::read(&file).unwrap();
            let header_end = 24 + u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
            let mut meta = bytes[24..header_end].to_vec();
            mutate(rng, &mut meta, true);
            bytes[16..24].copy_from_slice(&(meta.len() as u64).to_le_bytes());
            bytes.splice(24..header_end, meta);
            let n = bytes.len().saturating_sub(8);
            let sum = trident::rng::fnv1a64(&bytes[..n]);
            bytes[n..].copy_from_slice(&sum.to_le_bytes());
            // The corruption is done; the generic edit below gets an untouched marker file.
            std::fs::write(&file, &bytes).unwrap();
            let marker = copy.join("untouched");
            std::fs::write(&marker, b"x").unwrap();
            return (marker, false);
        }
        (file, false)
    };
    let commands = |copy: &Path, out: &Path| {
        vec![
            strings(&["convert", "--load", p(copy), "--save", p(out)]),
            strings(&["generate", "--load", p(copy), "--max-new-tokens", "2", "--prompt", "a"]),
        ]
    };
    fuzz("checkpoints", 0x5eed_0001, &ck, &pick, &commands);
}

#[test]
fn corrupted_hugging_face_directories_end_cleanly() {
    let dir = scratch("fuzz-hf-base");
    let hf = hf_dir(&llama_checkpoint(&dir, "ck"), &dir, "hf");
    let pick = |rng: &mut Rng, copy: &Path| match rng.below(2) {
        0 => (copy.join("config.json"), true),
        _ => (copy.join("model.safetensors"), rng.below(2) == 0),
    };
    let commands = |copy: &Path, out: &Path| vec![strings(&["convert", "--load-hf", p(copy), "--save", p(out)])];
    fuzz("hf", 0x5eed_0002, &hf, &pick, &commands);
}

#[test]
fn corrupted_tokenizers_end_cleanly() {
    let dir = scratch("fuzz-tokenizer-base");
    let fixture = dir.join("fixture");
    std::fs::create_dir_all(&fixture).unwrap();
    let added =
        "{\"id\": 256, \"content\": \"<|endoftext|>\", \"special\": true}, {\"id\": 259, \"content\": \"<|x|>\"}";
    std::fs::rename(tokenizer_json(&fixture, Some(added)), fixture.join("hf.json")).unwrap();
    gpt2_files(&fixture, &[]);
    std::fs::write(fixture.join("text.txt"), "the theme of <|x|> the thing\n\nmore text, the end\n").unwrap();
    let pick = |rng: &mut Rng, copy: &Path| {
        let name = ["hf.json", "vocab.json", "merges.txt"][rng.below(3)];
        (copy.join(name), true)
    };
    let commands = |copy: &Path, out: &Path| {
        let (text, hf, vocab, merges) =
            (copy.join("text.txt"), copy.join("hf.json"), copy.join("vocab.json"), copy.join("merges.txt"));
        let hf = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", p(&hf)];
        let gpt2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", p(&vocab), "--merge-file", p(&merges)];
        vec![
            prepare_args(&text, &out.with_extension("hf"), &hf),
            prepare_args(&text, &out.with_extension("gpt2"), &gpt2),
        ]
    };
    fuzz("tokenizers", 0x5eed_0003, &fixture, &pick, &commands);
}

#[test]
fn corrupted_datasets_end_cleanly() {
    let dir = scratch("fuzz-dataset-base");
    let fixture = dir.join("fixture");
    std::fs::create_dir_all(&fixture).unwrap();
    let docs: Vec<Vec<u16>> = (0..6u16).map(|d| (0..20 + 3 * d).map(|t| (t * 7 + d) % 257).collect()).collect();
    write_u16_dataset(&fixture.join("d_text_document"), &docs);
    let pick = |rng: &mut Rng, copy: &Path| {
        let ext = if rng.below(4) == 0 { "bin" } else { "idx" };
        (copy.join("d_text_document").with_extension(ext), false)
    };
    let commands = |copy: &Path, out: &Path| {
        let (cache, out) = (copy.join("cache"), p(out).to_string());
        let rest =
            ["--data-cache-path", p(&cache), "--global-batch-size", "2", "--train-iters", "4", "--eval-iters", "1"];
        let dump = ["--eval-interval", "2", "--dump", &out, "--dump-samples", "8"];
        vec![check_data_args(&copy.join("d_text_document"), &[&rest[..], &dump[..]].concat())]
    };
    fuzz("datasets", 0x5eed_0004, &fixture, &pick, &commands);
}
