//! Loading BPE tokenizers from their files: GPT-2's vocab.json + merges.txt (Megatron's
//! `GPT2BPETokenizer`) and a Hugging Face tokenizer.json (`HuggingFaceTokenizer`: byte-level BPE
//! with GPT-2's or Llama 3's split pattern, added tokens, a post-processing template) and
//! Megatron's TikTokenizer (`tiktoken`), with the
//! end-of-document token chosen as Megatron would. What trident does not support in a
//! tokenizer.json is one error naming the field and its value.

use super::added::{AddedToken, AddedTokens};
use super::bpe::Bpe;
use super::json::{document, quote, Json};
use super::pretokenize::{Pattern, GPT2_REGEX, LLAMA3_REGEX};
use super::tokenizer::{BpeTokenizer, Source, Tokenizer};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The files Megatron's tokenizer flags name.
#[derive(Clone, Debug, Default)]
pub struct TokenizerFlags<'a> {
    /// `--tokenizer-type`: ByteTokenizer (default), GPT2BPETokenizer, HuggingFaceTokenizer or
    /// NullTokenizer.
    pub kind: Option<&'a str>,
    pub vocab_file: Option<&'a Path>,
    pub merge_file: Option<&'a Path>,
    pub tokenizer_model: Option<&'a Path>,
    pub eod_token: Option<&'a str>,
    /// Apply the tokenizer.json's post-processing template (`--tokenizer-hf-include-special-tokens`).
    pub include_special_tokens: bool,
    /// `--vocab-size`: the null tokenizer's ids before its end-of-document id; TikTokenizer's ids.
    pub vocab_size: Option<usize>,
    /// TikTokenizer's `--tiktoken-pattern`, `--tiktoken-num-special-tokens` and special tokens
    /// (`--tokenizer-special-tokens`, or its older name `--tiktoken-special-tokens`).
    pub tiktoken_pattern: Option<&'a str>,
    pub tiktoken_specials: Option<usize>,
    pub special_tokens: Option<&'a [String]>,
}

/// The tokenizer Megatron's flags (`flags::TOKENIZER_FLAGS`) in `a` describe.
pub fn from_args(a: &crate::cli::Args) -> Result<Tokenizer> {
    if let Some(p) = a.str("--tiktoken-pattern") {
        super::tiktoken::pattern(Some(p))?;
    }
    load(&TokenizerFlags {
        kind: a.str("--tokenizer-type"),
        vocab_file: a.str("--vocab-file").map(Path::new),
        merge_file: a.str("--merge-file").map(Path::new),
        tokenizer_model: a.str("--tokenizer-model").map(Path::new),
        eod_token: a.str("--eod-token"),
        include_special_tokens: a.has("--tokenizer-hf-include-special-tokens"),
        vocab_size: a.usize("--vocab-size")?,
        tiktoken_pattern: a.str("--tiktoken-pattern"),
        tiktoken_specials: a.usize("--tiktoken-num-special-tokens")?,
        special_tokens: a.list("--tokenizer-special-tokens").or_else(|| a.list("--tiktoken-special-tokens")),
    })
}

/// The tokenizer the flags describe; a missing file flag is one error naming it.
pub fn load(flags: &TokenizerFlags) -> Result<Tokenizer> {
    fn need<'p>(p: Option<&'p Path>, name: &str, kind: &str) -> Result<&'p Path> {
        p.ok_or_else(|| Error::Usage(format!("--tokenizer-type {kind} needs {name}")))
    }
    // Megatron's GPT-3 script names GPT-2's files without a type: they are GPT2BPETokenizer's.
    let files = [("--vocab-file", flags.vocab_file.is_some()), ("--merge-file", flags.merge_file.is_some())];
    let kind = match flags.kind {
        Some(kind) => kind,
        None if files.iter().all(|f| f.1) => "GPT2BPETokenizer",
        None => "ByteTokenizer",
    };
    let reads = |name: &str| match name {
        "--vocab-file" | "--merge-file" => kind == "GPT2BPETokenizer",
        _ => kind == "HuggingFaceTokenizer" || kind == "TikTokenizer",
    };
    let mut given = files.into_iter().chain([("--tokenizer-model", flags.tokenizer_model.is_some())]);
    if let Some((name, _)) = given.find(|&(name, on)| on && !reads(name)) {
        return Err(Error::Usage(format!(
            "{name} is not read by --tokenizer-type {kind}{}",
            if flags.kind.is_none() { " (the default; give the type the file belongs to)" } else { "" }
        )));
    }
    if flags.special_tokens.is_some() && kind != "TikTokenizer" {
        return Err(Error::Usage(format!("--tokenizer-special-tokens is read by TikTokenizer only, not {kind}")));
    }
    match kind {
        "ByteTokenizer" => Ok(Tokenizer::Byte),
        "NullTokenizer" => match flags.vocab_size {
            Some(ids) if ids > 0 && ids < u32::MAX as usize => Ok(Tokenizer::Null { ids }),
            Some(ids) => Err(Error::flag("--vocab-size", ids, "from 1 to 4294967294 for NullTokenizer")),
            None => Err(Error::Usage(
                "--tokenizer-type NullTokenizer needs --vocab-size V (ids 0..V, then the end-of-document id V)".into(),
            )),
        },
        kind @ "TikTokenizer" => {
            let model =
                need(flags.tokenizer_model, "--tokenizer-model (Megatron's tiktoken vocabulary, a .json)", kind)?;
            let pattern = super::tiktoken::pattern(flags.tiktoken_pattern)?;
            let vocab = flags.vocab_size.unwrap_or(super::tiktoken::DEFAULT_VOCAB);
            let specials = flags.tiktoken_specials.unwrap_or(super::tiktoken::DEFAULT_SPECIAL);
            let names = super::tiktoken::special_names(flags.special_tokens, specials)?;
            Ok(Tokenizer::Bpe(Box::new(super::tiktoken::load(model, pattern, vocab, names)?)))
        }
        kind @ "GPT2BPETokenizer" => {
            let vocab = need(flags.vocab_file, "--vocab-file (GPT-2's vocab.json / encoder.json)", kind)?;
            let merges = need(flags.merge_file, "--merge-file (GPT-2's merges.txt / vocab.bpe)", kind)?;
            Ok(Tokenizer::Bpe(Box::new(gpt2_files(vocab, merges)?)))
        }
        kind @ "HuggingFaceTokenizer" => {
            let model = need(flags.tokenizer_model, "--tokenizer-model (a tokenizer.json or its directory)", kind)?;
            Ok(Tokenizer::Bpe(Box::new(hugging_face(model, flags.eod_token, flags.include_special_tokens)?)))
        }
        other => Err(Error::flag(
            "--tokenizer-type",
            format!("'{other}'"),
            "ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer or NullTokenizer",
        )),
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    crate::files::read_regular(path, what)
}

/// `{"token": id, ...}` as (token, id) pairs; every id below `Bpe::id_limit` of the count.
fn vocab_pairs(vocab: &Json, path: &Path) -> Result<Vec<(String, u32)>> {
    let fields = vocab.as_object().ok_or_else(|| Error::format(path, "the vocabulary is not a JSON object"))?;
    let limit = Bpe::id_limit(fields.len());
    fields
        .iter()
        .map(|(k, v)| match v.as_usize() {
            Some(id) if id < limit => Ok((k.clone(), id as u32)),
            Some(id) => Err(Error::format(
                path,
                format!(
                    "token {k:?} has id {id}, but the vocabulary lists {} tokens: ids must stay below {limit} (twice \
                     that, plus 256)",
                    fields.len()
                ),
            )),
            None => Err(Error::format(path, format!("token {k:?} has no valid id"))),
        })
        .collect()
}

/// BPE merges: (left, right) token pairs in rank order.
type Merges = Vec<(String, String)>;

/// GPT-2's vocab.json and merges.txt (a `#version` line, then one merge per line: two tokens
/// separated by a space), parsed.
fn gpt2_parts(vocab_path: &Path, merges_path: &Path) -> Result<(Vec<(String, u32)>, Merges)> {
    let vocab = vocab_pairs(&document(&read(vocab_path, "read the vocabulary")?, vocab_path)?, vocab_path)?;
    let text = read(merges_path, "read the merges")?;
    let text = String::from_utf8(text).map_err(|_| Error::format(merges_path, "the merges file is not UTF-8"))?;
    let mut merges = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if (n == 0 && line.starts_with("#version")) || line.is_empty() {
            continue;
        }
        let (l, r) =
            line.split_once(' ').filter(|(l, r)| !l.is_empty() && !r.is_empty() && !r.contains(' ')).ok_or_else(
                || Error::format(merges_path, format!("line {}: expected two tokens separated by one space", n + 1)),
            )?;
        merges.push((l.to_string(), r.to_string()));
    }
    Ok((vocab, merges))
}

/// Megatron's `GPT2BPETokenizer`: vocab.json and merges.txt. The end-of-document token is
/// `<|endoftext|>`.
pub fn gpt2_files(vocab_path: &Path, merges_path: &Path) -> Result<BpeTokenizer> {
    let (vocab, merges) = gpt2_parts(vocab_path, merges_path)?;
    let bpe = Bpe::new(&vocab, &merges, false).map_err(|e| Error::format(merges_path, e))?;
    let eod = bpe
        .id(b"<|endoftext|>")
        .ok_or_else(|| Error::format(vocab_path, "the vocabulary has no <|endoftext|> (GPT-2's end of document)"))?;
    let source = Source::Gpt2Files { vocab: vocab_path.to_path_buf(), merges: merges_path.to_path_buf() };
    tokenizer(source, bpe, (Pattern::Gpt2, false), Vec::new(), (Vec::new(), Vec::new()), eod)
        .map_err(|e| Error::format(vocab_path, e))
}

/// GPT-2's vocab.json and merges.txt as the Hugging Face tokenizer.json that encodes the same:
/// byte-level BPE with GPT-2's split pattern, and `<|endoftext|>` as its special added token.
pub fn gpt2_tokenizer_json(vocab_path: &Path, merges_path: &Path) -> Result<String> {
    let (mut vocab, merges) = gpt2_parts(vocab_path, merges_path)?;
    vocab.sort_by_key(|(_, id)| *id);
    let eod =
        vocab.iter().find(|(t, _)| t == "<|endoftext|>").map(|(_, id)| *id).ok_or_else(|| {
            Error::format(vocab_path, "the vocabulary has no <|endoftext|> (GPT-2's end of document)")
        })?;
    let vocab: Vec<String> = vocab.iter().map(|(t, id)| format!("{}: {id}", quote(t))).collect();
    let merges: Vec<String> = merges.iter().map(|(l, r)| format!("[{}, {}]", quote(l), quote(r))).collect();
    let level = |prefix: bool, trim: bool| {
        format!("{{\"type\": \"ByteLevel\", \"add_prefix_space\": {prefix}, \"trim_offsets\": {trim}, \"use_regex\": true}}")
    };
    Ok(format!(
        "{{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [{{\"id\": {eod}, \
         \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \
         \"normalized\": true, \"special\": true}}],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {},\n  \
         \"post_processor\": {},\n  \"decoder\": {},\n  \"model\": {{\"type\": \"BPE\", \"dropout\": null, \
         \"unk_token\": null, \"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, \
         \"byte_fallback\": false, \"ignore_merges\": false,\n    \"vocab\": {{{}}},\n    \"merges\": [{}]}}\n}}\n",
        level(false, true),
        level(true, false),
        level(true, true),
        vocab.join(", "),
        merges.join(", ")
    ))
}

/// The tokenizer of these parts. Its ids must be dense enough for what the file holds (the
/// largest below twice the tokens listed, plus 256: `Bpe::new`'s rule, so a crafted id cannot size
/// the model's vocabulary), and the template's ids must be among them.
fn tokenizer(
    source: Source,
    bpe: Bpe,
    (pattern, add_prefix_space): (Pattern, bool),
    added: Vec<AddedToken>,
    (prefix, suffix): (Vec<u32>, Vec<u32>),
    eod: u32,
) -> std::result::Result<BpeTokenizer, String> {
    let added = AddedTokens::new(added);
    let vocab_size = added.max_id().map_or(0, |id| id as usize + 1).max(bpe.size());
    let limit = Bpe::id_limit(bpe.listed() + added.len());
    if vocab_size > limit {
        return Err(format!(
            "an added token has id {}, but the file lists {} tokens: ids must stay below {limit} (twice that, plus 256)",
            vocab_size - 1,
            bpe.listed() + added.len()
        ));
    }
    if let Some(id) = prefix.iter().chain(&suffix).find(|&&id| id as usize >= vocab_size) {
        return Err(format!("post_processor: the template's id {id} is past the vocabulary of {vocab_size}"));
    }
    Ok(BpeTokenizer { source, bpe, pattern, add_prefix_space, added, prefix, suffix, eod, vocab_size })
}

/// A field of a tokenizer.json that must hold one of a few values trident supports.
fn unsupported(path: &Path, field: &str, value: &Json) -> Error {
    let shown = match value {
        Json::Str(s) => s.clone(),
        Json::Obj(_) => value.get("type").and_then(Json::as_str).unwrap_or("an object").to_string(),
        other => format!("{other:?}"),
    };
    Error::Unsupported(format!("{}: {field} {shown} is not supported (trident reads byte-level BPE)", path.display()))
}

/// The split pattern and prefix-space option of a tokenizer.json's pre-tokenizer: ByteLevel
/// (GPT-2's pattern), or a Split on a known pattern followed by a ByteLevel without its own.
fn pre_tokenizer(pre: &Json, path: &Path) -> Result<(Pattern, bool)> {
    let kind = pre.get("type").and_then(Json::as_str);
    let prefix = |p: &Json| p.get("add_prefix_space").and_then(Json::as_bool).unwrap_or(false);
    match kind {
        Some("ByteLevel") if pre.get("use_regex").and_then(Json::as_bool).unwrap_or(true) => {
            Ok((Pattern::Gpt2, prefix(pre)))
        }
        Some("Sequence") => {
            let parts = pre.get("pretokenizers").and_then(Json::as_array).unwrap_or(&[]);
            let [split, level] = parts else { return Err(unsupported(path, "pre_tokenizer", pre)) };
            let regex = split.get("pattern").and_then(|p| p.get("Regex")).and_then(Json::as_str);
            let isolated = split.get("behavior").and_then(Json::as_str) == Some("Isolated")
                && split.get("invert").and_then(Json::as_bool) != Some(true);
            let plain_level = level.get("type").and_then(Json::as_str) == Some("ByteLevel")
                && level.get("use_regex").and_then(Json::as_bool) == Some(false);
            match (split.get("type").and_then(Json::as_str), regex.and_then(Pattern::from_regex)) {
                (Some("Split"), Some(p)) if isolated && plain_level => Ok((p, prefix(level))),
                (Some("Split"), None) => Err(Error::Unsupported(format!(
                    "{}: the split pattern {:?} is not one trident knows (GPT-2's {GPT2_REGEX:?} or Llama 3's \
                     {LLAMA3_REGEX:?})",
                    path.display(),
                    regex.unwrap_or("(not a regex)")
                ))),
                _ => Err(unsupported(path, "pre_tokenizer", pre)),
            }
        }
        _ => Err(unsupported(path, "pre_tokenizer", pre)),
    }
}

/// The ids a post-processing template puts before and after a text: `TemplateProcessing`'s
/// `single` (alone or in a `Sequence` with `ByteLevel`), none for `ByteLevel` or null.
fn template(post: &Json, path: &Path) -> Result<(Vec<u32>, Vec<u32>)> {
    let processors: Vec<&Json> = match post.get("type").and_then(Json::as_str) {
        None if *post == Json::Null => return Ok((Vec::new(), Vec::new())),
        Some("Sequence") => post.get("processors").and_then(Json::as_array).unwrap_or(&[]).iter().collect(),
        _ => vec![post],
    };
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    for p in processors {
        match p.get("type").and_then(Json::as_str) {
            Some("ByteLevel") => {}
            Some("TemplateProcessing") => {
                let single = p.get("single").and_then(Json::as_array).unwrap_or(&[]);
                let mut after = false;
                for item in single {
                    if item.get("Sequence").is_some() {
                        after = true;
                        continue;
                    }
                    let name = item.get("SpecialToken").and_then(|t| t.get("id")).and_then(Json::as_str);
                    let ids = name
                        .and_then(|n| p.get("special_tokens")?.get(n)?.get("ids")?.as_array())
                        .ok_or_else(|| unsupported(path, "post_processor", p))?;
                    let ids = ids.iter().map(|i| i.as_usize().and_then(|i| u32::try_from(i).ok()));
                    let ids = ids.collect::<Option<Vec<u32>>>();
                    let ids = ids.ok_or_else(|| unsupported(path, "post_processor", p))?;
                    if after { &mut suffix } else { &mut prefix }.extend(ids);
                }
            }
            _ => return Err(unsupported(path, "post_processor", p)),
        }
    }
    Ok((prefix, suffix))
}

/// The added tokens of a tokenizer.json (only plain ones: no lstrip / rstrip / single_word).
fn added_tokens(json: &Json, path: &Path) -> Result<Vec<AddedToken>> {
    let mut out = Vec::new();
    for t in json.get("added_tokens").and_then(Json::as_array).unwrap_or(&[]) {
        let (Some(content), Some(id)) = (t.get("content").and_then(Json::as_str), t.get("id").and_then(Json::as_usize))
        else {
            return Err(Error::format(path, "an added token lacks its content or id"));
        };
        for flag in ["lstrip", "rstrip", "single_word"] {
            if t.get(flag).and_then(Json::as_bool) == Some(true) {
                return Err(Error::Unsupported(format!(
                    "{}: added token {content:?} has {flag}, which trident does not support",
                    path.display()
                )));
            }
        }
        let id = u32::try_from(id)
            .map_err(|_| Error::format(path, format!("added token {content:?} has id {id}, past 32 bits")))?;
        if !content.is_empty() {
            let special = t.get("special").and_then(Json::as_bool).unwrap_or(false);
            out.push(AddedToken { content: content.to_string(), id, special });
        }
    }
    Ok(out)
}

/// The model part of a tokenizer.json: BPE's vocabulary and merges, nothing else turned on.
fn bpe_model(model: &Json, path: &Path) -> Result<Bpe> {
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(unsupported(path, "model", model));
    }
    for (field, off) in [("dropout", Json::Null), ("byte_fallback", Json::Bool(false)), ("fuse_unk", Json::Bool(false))]
    {
        if let Some(v) = model.get(field).filter(|v| **v != off && **v != Json::Null) {
            return Err(unsupported(path, &format!("model.{field}"), v));
        }
    }
    for field in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if let Some(v) = model.get(field).filter(|v| !matches!(v, Json::Null) && v.as_str() != Some("")) {
            return Err(unsupported(path, &format!("model.{field}"), v));
        }
    }
    let vocab = vocab_pairs(model.get("vocab").unwrap_or(&Json::Null), path)?;
    let merges = model.get("merges").and_then(Json::as_array).unwrap_or(&[]);
    let merges = merges
        .iter()
        .map(|m| match m {
            Json::Str(s) => s.split_once(' ').map(|(l, r)| (l.to_string(), r.to_string())),
            Json::Arr(pair) => match pair.as_slice() {
                [Json::Str(l), Json::Str(r)] => Some((l.clone(), r.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::format(path, "model.merges: each merge must be \"left right\" or [left, right]"))?;
    let ignore_merges = model.get("ignore_merges").and_then(Json::as_bool).unwrap_or(false);
    Bpe::new(&vocab, &merges, ignore_merges).map_err(|e| Error::format(path, e))
}

/// The end-of-document token of a Hugging Face tokenizer: `eod_token` if given, else the
/// `eos_token` of a tokenizer_config.json beside it, else `<|endoftext|>`, else `</s>`.
fn hf_eod(t: &BpeTokenizer, path: &Path, eod_token: Option<&str>) -> Result<u32> {
    let config = path.with_file_name("tokenizer_config.json");
    let from_config = match config.exists() {
        true => {
            let json = document(&read(&config, "read the tokenizer config")?, &config)?;
            let eos = json.get("eos_token");
            eos.and_then(|e| e.as_str().or_else(|| e.get("content").and_then(Json::as_str))).map(str::to_string)
        }
        false => None,
    };
    let named = eod_token.map(str::to_string).or(from_config);
    if let Some(name) = named {
        return t.token_id(&name).ok_or_else(|| {
            Error::Config(format!("the end-of-document token {name:?} is not in the tokenizer {}", path.display()))
        });
    }
    ["<|endoftext|>", "</s>"].iter().find_map(|n| t.token_id(n)).ok_or_else(|| {
        Error::Config(format!(
            "{}: no end-of-document token found (no tokenizer_config.json eos_token, no <|endoftext|> or </s>): \
             name one with --eod-token",
            path.display()
        ))
    })
}

/// Megatron's `HuggingFaceTokenizer`: a tokenizer.json (or a directory holding one). Its
/// post-processing template applies only with `include_special_tokens`, as megatron-core's
/// `--tokenizer-hf-include-special-tokens` (off by default) decides.
pub fn hugging_face(path: &Path, eod_token: Option<&str>, include_special_tokens: bool) -> Result<BpeTokenizer> {
    let path: PathBuf = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
    let json = document(&read(&path, "read the tokenizer")?, &path)?;
    for field in ["normalizer"] {
        if let Some(v) = json.get(field).filter(|v| **v != Json::Null) {
            return Err(unsupported(&path, field, v));
        }
    }
    if let Some(d) = json.get("decoder").filter(|d| **d != Json::Null) {
        if d.get("type").and_then(Json::as_str) != Some("ByteLevel") {
            return Err(unsupported(&path, "decoder", d));
        }
    }
    let bpe = bpe_model(json.get("model").unwrap_or(&Json::Null), &path)?;
    let (pattern, add_prefix_space) = pre_tokenizer(json.get("pre_tokenizer").unwrap_or(&Json::Null), &path)?;
    let added = added_tokens(&json, &path)?;
    let around = template(json.get("post_processor").unwrap_or(&Json::Null), &path)?;
    let around = if include_special_tokens { around } else { (Vec::new(), Vec::new()) };
    let source = Source::HuggingFace { path: path.clone() };
    let mut t =
        tokenizer(source, bpe, (pattern, add_prefix_space), added, around, 0).map_err(|e| Error::format(&path, e))?;
    t.eod = hf_eod(&t, &path, eod_token)?;
    Ok(t)
}
