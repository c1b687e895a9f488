//! Megatron's `TikTokenizer` (megatron-core's `TikTokenTokenizer`): a JSON list of
//! `{"rank": i, "token_bytes": base64, "token_str": ...}` in rank order, the first 256 the bytes,
//! cut to `--vocab-size` (default 2^17) less the special tokens. Ids 0..S are the S special tokens
//! (`--tiktoken-num-special-tokens`, default 1000): `<unk> <s> </s> <mask> <pad> <cls> <sep>`, then
//! `<SPECIAL_7>` ...; rank r is id S + r. Text is split at special tokens first (tiktoken's
//! `allowed_special="all"`), then by `--tiktoken-pattern` (v1 or v2, the default), then each
//! piece merges by rank (`Bpe::from_ranks`). The end of document is `</s>`.

use super::added::{AddedToken, AddedTokens};
use super::bpe::Bpe;
use super::json::{document, Json};
use super::pretokenize::Pattern;
use super::tokenizer::{BpeTokenizer, Source};
use crate::error::{Error, Result};
use std::path::Path;

/// Megatron's default `vocab_size` for TikTokenizer.
pub const DEFAULT_VOCAB: usize = 1 << 17;

/// Megatron's default number of special tokens.
pub const DEFAULT_SPECIAL: usize = 1000;

/// The special tokens every TikTokenizer has, first, in this order.
const SPECIALS: [&str; 7] = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"];

/// What `--tiktoken-pattern` names.
pub fn pattern(name: Option<&str>) -> Result<Pattern> {
    match name.unwrap_or("v2") {
        "v1" => Ok(Pattern::TiktokenV1),
        "v2" => Ok(Pattern::TiktokenV2),
        other => Err(Error::flag("--tiktoken-pattern", other, "v1 or v2")),
    }
}

/// The `count` special tokens, ids 0.. in order: `given` (`--tokenizer-special-tokens`: unique,
/// holding the seven every TikTokenizer has, at most `count`), else those seven; then
/// `<SPECIAL_i>` up to `count`, as megatron-core names them.
pub fn special_names(given: Option<&[String]>, count: usize) -> Result<Vec<String>> {
    let mut names: Vec<String> = given.map_or_else(|| SPECIALS.map(String::from).to_vec(), <[String]>::to_vec);
    let unique: std::collections::HashSet<&String> = names.iter().collect();
    let missing: Vec<&str> = SPECIALS.iter().copied().filter(|s| !names.iter().any(|n| n == s)).collect();
    if unique.len() != names.len() || !missing.is_empty() || names.len() > count {
        return Err(Error::Usage(format!(
            "--tokenizer-special-tokens must be unique, hold {} and number at most --tiktoken-num-special-tokens \
             ({count}); {} given{}",
            SPECIALS.join(" "),
            names.len(),
            if missing.is_empty() { String::new() } else { format!(", without {}", missing.join(" ")) }
        )));
    }
    names.extend((names.len()..count).map(|i| format!("<SPECIAL_{i}>")));
    Ok(names)
}

/// The tokenizer of the vocabulary file at `path`, with `vocab_size` ids of which the first are
/// the special tokens `specials` (`special_names`).
pub fn load(path: &Path, pattern: Pattern, vocab_size: usize, specials: Vec<String>) -> Result<BpeTokenizer> {
    let count = specials.len();
    if count < SPECIALS.len() || count >= vocab_size || vocab_size > u32::MAX as usize {
        return Err(Error::Usage(format!(
            "TikTokenizer needs at least {} special tokens and fewer than --vocab-size ({vocab_size}, at most \
             4294967295): --tiktoken-num-special-tokens is {count}",
            SPECIALS.len()
        )));
    }
    let eod = specials
        .iter()
        .position(|s| s == "</s>")
        .ok_or_else(|| Error::Usage("TikTokenizer's special tokens must hold </s>, its end of document".into()))?
        as u32;
    let text = crate::files::read_regular(path, "read the TikTokenizer vocabulary")?;
    let json = document(&text, path)?;
    let entries = json.as_array().ok_or_else(|| Error::format(path, "not a JSON list of ranked tokens"))?;
    let wanted = vocab_size - count;
    if entries.len() < wanted {
        return Err(Error::format(
            path,
            format!(
                "{} ranked tokens, but --vocab-size {vocab_size} less {count} special tokens needs {wanted}",
                entries.len()
            ),
        ));
    }
    let mut tokens = Vec::with_capacity(wanted);
    for (i, e) in entries.iter().take(wanted).enumerate() {
        let field = |name: &str| e.get(name);
        if field("rank").and_then(Json::as_usize) != Some(i) {
            return Err(Error::format(path, format!("entry {i} has no \"rank\": {i} (ranks are 0, 1, ... in order)")));
        }
        let bytes = field("token_bytes")
            .and_then(Json::as_str)
            .and_then(base64)
            .ok_or_else(|| Error::format(path, format!("entry {i}'s \"token_bytes\" is not base64 text")))?;
        tokens.push(bytes);
    }
    let bpe = Bpe::from_ranks(tokens, count as u32).map_err(|e| Error::format(path, e))?;
    let added: Vec<AddedToken> = specials
        .into_iter()
        .enumerate()
        .map(|(id, content)| AddedToken { content, id: id as u32, special: true })
        .collect();
    Ok(BpeTokenizer {
        source: Source::Tiktoken { path: path.to_path_buf() },
        bpe,
        pattern,
        add_prefix_space: false,
        added: AddedTokens::new(added),
        prefix: Vec::new(),
        suffix: Vec::new(),
        eod,
        vocab_size,
    })
}

/// Standard base64 (`+`, `/`, `=` padding) decoded; None for anything else.
fn base64(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let body = text.as_bytes();
    if !body.len().is_multiple_of(4) {
        return None;
    }
    let pad = body.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3);
    for (n, quad) in body.chunks(4).enumerate() {
        let last = n + 1 == body.len() / 4;
        let used = if last { 4 - pad } else { 4 };
        let mut v = 0u32;
        for (k, &c) in quad.iter().enumerate() {
            v = v << 6 | if k < used { u32::from(digit(c)?) } else { 0 };
        }
        out.extend_from_slice(&v.to_be_bytes()[1..used]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_the_standard_alphabet() {
        assert_eq!(base64("aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(base64("IQ=="), Some(b"!".to_vec()));
        assert_eq!(base64("/+8A"), Some(vec![0xff, 0xef, 0x00]));
        assert_eq!(base64(""), Some(Vec::new()));
        for bad in ["aGVsbG8", "a===", "a*==", "aGV=bG8="] {
            assert_eq!(base64(bad), None, "{bad}");
        }
    }
}
