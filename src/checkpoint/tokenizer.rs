//! The tokenizer beside a checkpoint: `train --save` copies the files Megatron's tokenizer flags
//! name into `<save>/tokenizer/`, with a `flags` file that names them there, so that `generate
//! --load` (and anything else that reads the checkpoint) finds the tokenizer without flags. The
//! same tokenizer goes beside Hugging Face weights as transformers reads it (`export_hf`), and is
//! found there again (`from_hf`).
//!
//! The `flags` file is read as untrusted: each line is a known tokenizer flag, given once, with
//! its value escaped (`\\`, `\t`, `\n`, `\r`) so no value can add a line; a file it names must
//! lie inside the folder (`files::inside`), so a crafted checkpoint cannot make `convert` copy a
//! file from elsewhere into its output.

use super::convert::FullCheckpoint;
use super::hf_files::write_atomic;
use crate::data::json::{quote, Json};
use crate::data::tokenizer::Tokenizer;
use crate::data::tokenizer_files::{gpt2_files, gpt2_tokenizer_json, hugging_face};
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
            lines.push(value.as_ref().map_or(flag.clone(), |v| format!("{flag}\t{}", escape(v))));
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
    let bytes = crate::files::read_regular(from, "read the tokenizer file")?;
    write_atomic(to, &bytes)
}

/// A flag's value on one line of the flags file: backslash, tab and line breaks escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\t', "\\t").replace('\n', "\\n").replace('\r', "\\r")
}

/// `escape` undone; None for an escape it never writes.
fn unescape(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '\\' => match chars.next()? {
                '\\' => '\\',
                't' => '\t',
                'n' => '\n',
                'r' => '\r',
                _ => return None,
            },
            c => c,
        });
    }
    Some(out)
}

/// The tokenizer flags saved beside the checkpoints in `load_dir`, file values resolved to the
/// copies there; None when the folder has none (a byte-tokenizer model).
pub fn saved_flags(load_dir: &Path) -> Result<Option<Flags>> {
    let dir = load_dir.join(DIR);
    let path = dir.join("flags");
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    let bytes = crate::files::read_regular(&path, "read")?;
    let text = String::from_utf8(bytes).map_err(|_| Error::format(&path, "not UTF-8"))?;
    let mut out: Flags = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (flag, value) = line.split_once('\t').map_or((line, None), |(f, v)| (f, Some(v)));
        if !crate::flags::TOKENIZER_FLAGS.iter().any(|f| f.name == flag) {
            return Err(Error::format(&path, format!("{flag:?} is not a tokenizer flag")));
        }
        if out.iter().any(|(f, _)| f == flag) {
            return Err(Error::format(&path, format!("{flag} is given twice")));
        }
        let value = value
            .map(|v| unescape(v).ok_or_else(|| Error::format(&path, format!("{flag}: malformed value {v:?}"))))
            .transpose()?;
        let value = match value {
            Some(v) if FILES.iter().any(|(f, _)| *f == flag) => {
                Some(crate::files::inside(&dir, &v, &path)?.display().to_string())
            }
            other => other,
        };
        out.push((flag.to_string(), value));
    }
    // `save` carries a tokenizer_config.json found beside a tokenizer.json: it too must be the
    // folder's own.
    if dir.join("tokenizer_config.json").symlink_metadata().is_ok() {
        crate::files::inside(&dir, "tokenizer_config.json", &dir.join("tokenizer_config.json"))?;
    }
    Ok(Some(out))
}

/// A tokenizer flag's value as `Flags` keeps it: a list flag's values one per line.
pub fn value_of(args: &crate::cli::Args, spec: &crate::cli::FlagSpec) -> Option<String> {
    match spec.arity {
        crate::cli::Arity::Many => args.list(spec.name).map(|v| v.join("\n")),
        _ => args.str(spec.name).map(String::from),
    }
}

/// The tokenizer `flags` describe: the byte tokenizer for none.
pub fn load(flags: &[(String, Option<String>)]) -> Result<Tokenizer> {
    let many =
        |f: &str| crate::flags::TOKENIZER_FLAGS.iter().any(|s| s.name == f && s.arity == crate::cli::Arity::Many);
    let values = |(f, v): &(String, Option<String>)| -> Vec<String> {
        match v {
            Some(v) if many(f) => v.split('\n').map(String::from).collect(),
            v => v.iter().cloned().collect(),
        }
    };
    let words: Vec<String> = flags.iter().flat_map(|p| std::iter::once(p.0.clone()).chain(values(p))).collect();
    let args = crate::cli::parse("tokenizer", crate::flags::TOKENIZER_FLAGS, &words)?.unwrap_or_default();
    crate::data::tokenizer_files::from_args(&args)
}

/// What a Hugging Face config.json says of the tokenizer: Megatron's type, and its
/// end-of-document id (written as both bos and eos) where known.
pub struct HfTokenizer {
    pub type_name: String,
    pub eod: Option<u32>,
}

/// What trident adds to a config.json: the end-of-document id as bos and eos, the unpadded
/// vocabulary, the tokenizer's type, and the padding multiple the checkpoint was trained with (so
/// that an import pads it the same way).
pub fn trident_fields(full: &FullCheckpoint, tok: &HfTokenizer) -> Vec<(&'static str, String)> {
    let eod = tok.eod.map_or("null".into(), |e| e.to_string());
    let mut out = vec![
        ("bos_token_id", eod.clone()),
        ("eos_token_id", eod),
        ("trident_unpadded_vocab_size", full.model.vocab_size.to_string()),
        ("trident_tokenizer", quote(&tok.type_name)),
    ];
    if let Some(by) = full.meta.get("make_vocab_size_divisible_by") {
        out.push(("trident_make_vocab_size_divisible_by", by.clone()));
    }
    out
}

/// `"key": value` lines of a JSON object's body (the values already JSON).
pub fn fields_json(fields: &[(&str, String)]) -> String {
    fields.iter().map(|(k, v)| format!("  \"{k}\": {v}")).collect::<Vec<_>>().join(",\n")
}

fn flag_value<'f>(flags: &'f [(String, Option<String>)], name: &str) -> Option<&'f str> {
    flags.iter().find(|(f, _)| f == name).and_then(|(_, v)| v.as_deref())
}

/// Writes the tokenizer `flags` describe into `hf_dir` as transformers loads it: a GPT-2 BPE's
/// vocab.json and merges.txt with the tokenizer.json built from them and a tokenizer_config.json;
/// a Hugging Face tokenizer's tokenizer.json and its tokenizer_config.json; for TikTokenizer,
/// nothing (transformers has no reader for its vocabulary). `type_name` is the
/// checkpoint's record, for a tokenizer whose files it does not hold.
pub fn export_hf(flags: &[(String, Option<String>)], type_name: &str, hf_dir: &Path) -> Result<HfTokenizer> {
    if flags.is_empty() {
        let eod = (type_name == "ByteTokenizer").then_some(crate::data::tokenizer::ByteTokenizer::EOD);
        return Ok(HfTokenizer { type_name: type_name.to_string(), eod });
    }
    let tok = load(flags)?;
    match (tok.type_name(), flag_value(flags, "--vocab-file"), flag_value(flags, "--merge-file")) {
        ("GPT2BPETokenizer", Some(vocab), Some(merges)) => {
            let (vocab, merges) = (Path::new(vocab), Path::new(merges));
            copy(vocab, &hf_dir.join("vocab.json"))?;
            copy(merges, &hf_dir.join("merges.txt"))?;
            write_atomic(&hf_dir.join("tokenizer.json"), gpt2_tokenizer_json(vocab, merges)?.as_bytes())?;
            let config = "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"bos_token\": \"<|endoftext|>\",\n  \
                          \"eos_token\": \"<|endoftext|>\",\n  \"unk_token\": \"<|endoftext|>\",\n  \
                          \"add_prefix_space\": false\n}\n";
            write_atomic(&hf_dir.join("tokenizer_config.json"), config.as_bytes())?;
        }
        // Megatron's tiktoken vocabulary is no file transformers reads: config.json names the
        // type (`trident_tokenizer`), and the vocabulary stays beside the trident checkpoint.
        ("TikTokenizer", _, _) => {}
        _ => {
            if let Some(model) = flag_value(flags, "--tokenizer-model").map(PathBuf::from) {
                let model = if model.is_dir() { model.join("tokenizer.json") } else { model };
                copy(&model, &hf_dir.join("tokenizer.json"))?;
                let config = model.with_file_name("tokenizer_config.json");
                if config.is_file() {
                    copy(&config, &hf_dir.join("tokenizer_config.json"))?;
                }
            }
        }
    }
    Ok(HfTokenizer { type_name: tok.type_name().to_string(), eod: Some(tok.eod()) })
}

/// The tokenizer beside Hugging Face weights in `hf_dir`, as flags naming its files there, and its
/// type: the kind config.json's `trident_tokenizer` names, else a tokenizer.json
/// (`HuggingFaceTokenizer`), else GPT-2's vocab.json and merges.txt; the byte tokenizer where
/// there is none. A tokenizer trident does not support is one line saying so: the checkpoint then
/// records its type without files, and `generate` asks for its flags. One that breaks its own
/// format, or has more ids than the model's `vocab`, is an error. `config` is the directory's
/// config.json.
pub fn from_hf(hf_dir: &Path, config: &Json, vocab: usize) -> Result<(Flags, String)> {
    let named = config.get("trident_tokenizer").and_then(Json::as_str);
    let (json, vocab_file, merges) =
        (hf_dir.join("tokenizer.json"), hf_dir.join("vocab.json"), hf_dir.join("merges.txt"));
    let pair = |f: &str, v: &str| (f.to_string(), Some(v.to_string()));
    let s = |p: &Path| p.display().to_string();
    let gpt2 = match named {
        Some("ByteTokenizer") => return Ok((Flags::new(), "ByteTokenizer".into())),
        Some("NullTokenizer") if vocab > 1 => {
            let ids = (vocab - 1).to_string();
            return Ok((
                vec![pair("--tokenizer-type", "NullTokenizer"), pair("--vocab-size", &ids)],
                "NullTokenizer".into(),
            ));
        }
        // The export left its vocabulary out (`export_hf`): the type, and the flags to give.
        Some("TikTokenizer") => {
            println!(
                "{} names TikTokenizer, whose vocabulary a Hugging Face directory does not hold: the checkpoint \
                 records TikTokenizer; give train and generate its --tokenizer-model",
                hf_dir.join("config.json").display()
            );
            return Ok((Flags::new(), "TikTokenizer".into()));
        }
        Some("GPT2BPETokenizer") => true,
        Some("HuggingFaceTokenizer") => false,
        None => !json.is_file(),
        Some(other) => {
            return Err(Error::format(
                &hf_dir.join("config.json"),
                format!(
                    "trident_tokenizer {}: expected ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, \
                     TikTokenizer or NullTokenizer (with a vocabulary above 1)",
                    quote(other)
                ),
            ))
        }
    };
    let present = if gpt2 { vocab_file.is_file() && merges.is_file() } else { json.is_file() };
    if !present {
        let kind = named.unwrap_or("ByteTokenizer");
        println!(
            "no tokenizer files in {} (tokenizer.json, or vocab.json and merges.txt): the checkpoint records {kind}; \
             give train and generate the model's tokenizer flags",
            hf_dir.display()
        );
        return Ok((Flags::new(), kind.into()));
    }
    let (kind, files, loaded) = if gpt2 {
        let files = vec![pair("--vocab-file", &s(&vocab_file)), pair("--merge-file", &s(&merges))];
        ("GPT2BPETokenizer", files, gpt2_files(&vocab_file, &merges).map(|t| t.vocab_size))
    } else {
        let files = vec![pair("--tokenizer-model", &s(&json))];
        ("HuggingFaceTokenizer", files, hugging_face(&json, None, false).map(|t| t.vocab_size))
    };
    let flags: Flags = std::iter::once(pair("--tokenizer-type", kind)).chain(files).collect();
    let kind = kind.to_string();
    match loaded {
        Ok(ids) if ids > vocab => Err(Error::Config(format!(
            "the tokenizer in {} has {ids} ids but the model's vocabulary is {vocab}: not this model's tokenizer",
            hf_dir.display()
        ))),
        Ok(_) => Ok((flags, kind)),
        // A tokenizer that breaks its own format (a crafted id, malformed JSON) stops the import;
        // one trident merely does not support lets the weights come without it.
        Err(e @ (Error::Format { .. } | Error::Io { .. })) => Err(e),
        Err(e) => {
            println!("the tokenizer in {} is not carried: {e}; give train and generate its flags", hf_dir.display());
            Ok((Flags::new(), kind))
        }
    }
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

    #[test]
    fn values_cannot_add_lines_or_name_files_elsewhere() {
        let dir = crate::data::test_dir("ckpt-tokenizer-crafted");
        let out = dir.join("save");
        let pair = |f: &str, v: &str| (f.to_string(), Some(v.to_string()));
        let flags = [pair("--tokenizer-type", "HuggingFaceTokenizer"), pair("--eod-token", "a\tb\n--vocab-file\t/x\\")];
        save(&out, &flags).unwrap();
        assert_eq!(saved_flags(&out).unwrap().unwrap(), flags);
        std::fs::write(dir.join("secret"), "{}").unwrap();
        let t = out.join(DIR);
        for (text, needle) in [
            ("--vocab-file\t/etc/passwd\n", "'/etc/passwd'"),
            ("--vocab-file\t../../secret\n", "'../../secret'"),
            ("--weird\tx\n", "not a tokenizer flag"),
            ("--tokenizer-type\tA\n--tokenizer-type\tB\n", "twice"),
            ("--eod-token\ta\\q\n", "malformed"),
        ] {
            std::fs::write(t.join("flags"), text).unwrap();
            let e = saved_flags(&out).unwrap_err().to_string();
            assert!(e.contains("flags") && e.contains(needle), "{text:?}: {e}");
        }
        std::os::unix::fs::symlink(dir.join("secret"), t.join("vocab.json")).unwrap();
        std::fs::write(t.join("flags"), "--vocab-file\tvocab.json\n").unwrap();
        assert!(saved_flags(&out).unwrap_err().to_string().contains("leads out of the directory"));
    }
}
