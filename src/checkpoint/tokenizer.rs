//! The tokenizer beside a checkpoint: `train --save` copies the files Megatron's tokenizer flags
//! name into `<save>/tokenizer/`, with a `flags` file that names them there, so that `generate
//! --load` (and anything else that reads the checkpoint) finds the tokenizer without flags.

use super::hf_files::write_atomic;
use crate::error::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// The folder under a save directory.
pub const DIR: &str = "tokenizer";

/// The file flags and the names their files take in the folder.
const FILES: &[(&str, &str)] =
    &[("--vocab-file", "vocab.json"), ("--merge-file", "merges.txt"), ("--tokenizer-model", "tokenizer.json")];

/// Megatron's tokenizer flags as given: each flag with its value (none for a switch).
pub type Flags = Vec<(String, Option<String>)>;

/// Copies the tokenizer that `flags` describes into `save_dir/tokenizer/`; nothing for the byte
/// tokenizer (no flags).
pub fn save(save_dir: &Path, flags: &[(String, Option<String>)]) -> Result<()> {
    if flags.is_empty() {
        return Ok(());
    }
    let dir = save_dir.join(DIR);
    fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create", e))?;
    let mut lines = Vec::new();
    for (flag, value) in flags {
        let (Some(&(_, name)), Some(value)) = (FILES.iter().find(|(f, _)| f == flag), value) else {
            lines.push(value.as_ref().map_or(flag.clone(), |v| format!("{flag}\t{v}")));
            continue;
        };
        let mut source = PathBuf::from(value);
        if flag == "--tokenizer-model" {
            if source.is_dir() {
                source = source.join("tokenizer.json");
            }
            let config = source.with_file_name("tokenizer_config.json");
            if config.is_file() {
                copy(&config, &dir.join("tokenizer_config.json"))?;
            }
        }
        copy(&source, &dir.join(name))?;
        lines.push(format!("{flag}\t{name}"));
    }
    write_atomic(&dir.join("flags"), (lines.join("\n") + "\n").as_bytes())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    let bytes = fs::read(from).map_err(|e| Error::io(from, "read the tokenizer file", e))?;
    write_atomic(to, &bytes)
}

/// The tokenizer flags saved beside the checkpoints in `load_dir`, file values resolved to the
/// copies there; None when the folder has none (a byte-tokenizer model).
pub fn saved_flags(load_dir: &Path) -> Result<Option<Flags>> {
    let dir = load_dir.join(DIR);
    let path = dir.join("flags");
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, "read", e)),
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (flag, value) = line.split_once('\t').map_or((line, None), |(f, v)| (f, Some(v)));
        let file = FILES.iter().any(|(f, _)| *f == flag);
        let value = value.map(|v| if file { dir.join(v).display().to_string() } else { v.to_string() });
        out.push((flag.to_string(), value));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_flags_round_trip() {
        let dir = crate::data::test_dir("ckpt-tokenizer");
        let (vocab, merges) = (dir.join("v.json"), dir.join("m.txt"));
        fs::write(&vocab, "{}").unwrap();
        fs::write(&merges, "#version: 0.2\n").unwrap();
        let s = |p: &Path| p.display().to_string();
        let pair = |f: &str, v: &str| (f.to_string(), Some(v.to_string()));
        let flags = [
            pair("--tokenizer-type", "GPT2BPETokenizer"),
            pair("--vocab-file", &s(&vocab)),
            pair("--merge-file", &s(&merges)),
        ];
        let out = dir.join("save");
        save(&out, &flags).unwrap();
        let back = saved_flags(&out).unwrap().unwrap();
        let t = out.join(DIR);
        let want = [
            pair("--tokenizer-type", "GPT2BPETokenizer"),
            pair("--vocab-file", &s(&t.join("vocab.json"))),
            pair("--merge-file", &s(&t.join("merges.txt"))),
        ];
        assert_eq!(back, want);
        assert_eq!(fs::read_to_string(t.join("merges.txt")).unwrap(), "#version: 0.2\n");
        assert_eq!(saved_flags(&dir).unwrap(), None);
        save(&dir.join("bytes"), &[]).unwrap();
        assert!(!dir.join("bytes").exists());
    }
}
