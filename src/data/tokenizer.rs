//! Tokenizers: the byte tokenizer (ids 0..=255 are raw bytes, id 256 ends a document), Megatron's
//! null tokenizer (text is ids written as numbers; for mock data), and byte-level BPE (GPT-2's vocab.json + merges.txt, or a Hugging Face tokenizer.json; loaded by
//! `tokenizer_files`): added tokens split out first, then the split pattern, then BPE per piece,
//! with a cache of pieces already encoded.

pub use super::added::AddedToken;
use super::added::AddedTokens;
use super::bpe::Bpe;
use super::pretokenize::Pattern;
use std::collections::HashMap;

/// A tokenizer that needs no vocabulary file: every byte is its own token, so any input (even
/// invalid UTF-8) round-trips exactly, and one extra id separates documents.
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// The end-of-document id that `--append-eod` appends after each document.
    pub const EOD: u32 = 256;
    /// The 256 byte values plus EOD.
    pub const VOCAB_SIZE: usize = 257;

    /// Maps each byte to its own id.
    pub fn encode(text: &[u8]) -> Vec<u32> {
        text.iter().map(|&byte| u32::from(byte)).collect()
    }

    /// Turns ids back into text for people to read. Bytes that are not valid UTF-8 and ids above
    /// EOD become U+FFFD. EOD becomes "\n\n", a paragraph break, so that documents printed one
    /// after another stay visibly apart without inventing a marker string.
    pub fn decode(ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len());
        for &id in ids {
            match u8::try_from(id) {
                Ok(byte) => bytes.push(byte),
                Err(_) if id == Self::EOD => bytes.extend_from_slice(b"\n\n"),
                // The UTF-8 encoding of U+FFFD starts with a lead byte, so it never merges with
                // an unfinished sequence before it and always decodes as one replacement char.
                Err(_) => bytes.extend_from_slice("\u{FFFD}".as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Any tokenizer `prepare` (and later `train` and `generate`) can use.
pub enum Tokenizer {
    Byte,
    /// Megatron's `NullTokenizer` (megatron-core 0.16): `ids` ids, then the end-of-document id
    /// `ids`, so `ids + 1` in all; text is the ids as decimal numbers separated by spaces.
    Null {
        ids: usize,
    },
    Bpe(Box<BpeTokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Byte => write!(f, "ByteTokenizer"),
            Tokenizer::Null { ids } => write!(f, "NullTokenizer ({} ids, eod {ids})", ids + 1),
            Tokenizer::Bpe(t) => write!(f, "{:?} ({} ids, eod {})", t.source, t.vocab_size, t.eod),
        }
    }
}

impl Tokenizer {
    /// Ids 0..vocab_size.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Byte => ByteTokenizer::VOCAB_SIZE,
            Tokenizer::Null { ids } => ids + 1,
            Tokenizer::Bpe(t) => t.vocab_size,
        }
    }

    /// The end-of-document id `--append-eod` appends.
    pub fn eod(&self) -> u32 {
        match self {
            Tokenizer::Byte => ByteTokenizer::EOD,
            Tokenizer::Null { ids } => *ids as u32,
            Tokenizer::Bpe(t) => t.eod,
        }
    }

    /// Whether text must be UTF-8 (BPE splits characters; the byte tokenizer takes any bytes).
    pub fn needs_utf8(&self) -> bool {
        !matches!(self, Tokenizer::Byte)
    }

    /// Megatron's `--tokenizer-type` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Tokenizer::Byte => "ByteTokenizer",
            Tokenizer::Null { .. } => "NullTokenizer",
            Tokenizer::Bpe(t) => match t.source {
                Source::Gpt2Files { .. } => "GPT2BPETokenizer",
                Source::HuggingFace { .. } => "HuggingFaceTokenizer",
                Source::Tiktoken { .. } => "TikTokenizer",
            },
        }
    }

    /// What token `id` prints as in `generate`: its bytes (a byte, a BPE token, an added
    /// token's text; special added tokens print nothing), the end of document (and, for the byte
    /// tokenizer, any id past the bytes) as "\n\n".
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if id == self.eod() {
            return b"\n\n".to_vec();
        }
        match self {
            // A lone byte, even half a character: the next byte completes it on the terminal. An id
            // past the bytes (an imported model's larger vocabulary) prints as the break EOD does.
            Tokenizer::Byte => u8::try_from(id).map_or(b"\n\n".to_vec(), |b| vec![b]),
            Tokenizer::Null { .. } => format!(" {id}").into_bytes(),
            Tokenizer::Bpe(t) => t.decode(&[id], true),
        }
    }

    /// The ids of `text` (UTF-8 unless `needs_utf8` is false: `prepare` checks first; the null
    /// tokenizer's numbers checked by `check_text` first).
    pub fn encode(&self, text: &[u8], cache: &mut PieceCache) -> Vec<u32> {
        match self {
            Tokenizer::Byte => ByteTokenizer::encode(text),
            Tokenizer::Null { .. } => {
                String::from_utf8_lossy(text).split_whitespace().filter_map(|w| w.parse().ok()).collect()
            }
            Tokenizer::Bpe(t) => t.encode(std::str::from_utf8(text).expect("prepare checks UTF-8 first"), cache),
        }
    }
}

impl Tokenizer {
    /// Whether `encode` takes `text` as it is: for the null tokenizer, every word must be an id
    /// below its vocabulary (`what` names the text in the error).
    pub fn check_text(&self, text: &[u8], what: &str) -> crate::error::Result<()> {
        let Tokenizer::Null { ids } = self else { return Ok(()) };
        for word in String::from_utf8_lossy(text).split_whitespace() {
            if !word.parse::<usize>().is_ok_and(|id| id <= *ids) {
                return Err(crate::error::Error::Usage(format!(
                    "{what}: {word:?} is not a token of NullTokenizer, whose text is ids 0 to {ids} written as numbers"
                )));
            }
        }
        Ok(())
    }
}

/// Where a BPE tokenizer came from: Megatron's `--tokenizer-type` and its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `GPT2BPETokenizer`: `--vocab-file` and `--merge-file`.
    Gpt2Files { vocab: std::path::PathBuf, merges: std::path::PathBuf },
    /// `HuggingFaceTokenizer`: `--tokenizer-model`, a tokenizer.json (or the directory holding it).
    HuggingFace { path: std::path::PathBuf },
    /// `TikTokenizer`: `--tokenizer-model`, Megatron's JSON list of ranked tokens (`tiktoken`).
    Tiktoken { path: std::path::PathBuf },
}

/// A byte-level BPE tokenizer.
pub struct BpeTokenizer {
    pub source: Source,
    pub(super) bpe: Bpe,
    pub(super) pattern: Pattern,
    /// Prepend a space to text that does not start with one (a ByteLevel pre-tokenizer option).
    pub(super) add_prefix_space: bool,
    /// Matched before anything else (`AddedTokens::find`).
    pub(super) added: AddedTokens,
    /// Ids around every encoded text (a tokenizer.json's post-processing template: Llama 3's
    /// `<|begin_of_text|>`), when `--tokenizer-hf-include-special-tokens` asks for them.
    pub(super) prefix: Vec<u32>,
    pub(super) suffix: Vec<u32>,
    pub eod: u32,
    pub vocab_size: usize,
}

/// Pieces already encoded, per thread: most words recur, so most pieces skip BPE.
#[derive(Default)]
pub struct PieceCache(HashMap<Box<[u8]>, Box<[u32]>>);

impl PieceCache {
    /// Entries kept before the cache starts over (a few hundred MB at most).
    const CAPACITY: usize = 1 << 20;
}

impl BpeTokenizer {
    /// The ids of `text`: the template's prefix, the text, the suffix. `cache` is the calling
    /// thread's own.
    pub fn encode(&self, text: &str, cache: &mut PieceCache) -> Vec<u32> {
        let mut out = self.prefix.clone();
        let mut at = 0;
        for (start, added) in self.added.find(text.as_bytes()) {
            self.encode_plain(&text[at..start], cache, &mut out);
            out.push(added.id);
            at = start + added.content.len();
        }
        self.encode_plain(&text[at..], cache, &mut out);
        out.extend_from_slice(&self.suffix);
        out
    }

    fn encode_plain(&self, text: &str, cache: &mut PieceCache, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let spaced;
        let text = if self.add_prefix_space && !text.starts_with(' ') {
            spaced = format!(" {text}");
            spaced.as_str()
        } else {
            text
        };
        self.pattern.split(text, |piece| {
            let piece = piece.as_bytes();
            if let Some(ids) = cache.0.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
            let start = out.len();
            self.bpe.encode_piece(piece, out);
            if cache.0.len() >= PieceCache::CAPACITY {
                cache.0.clear();
            }
            cache.0.insert(piece.into(), out[start..].into());
        });
    }

    /// The bytes of `ids`: each token's bytes, an added token's text (left out when special and
    /// `skip_special`). Ids past the vocabulary give U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            if let Some(a) = self.added.by_id(id) {
                if !(skip_special && a.special) {
                    out.extend_from_slice(a.content.as_bytes());
                }
            } else if (id as usize) < self.bpe.size() && !self.bpe.bytes(id).is_empty() {
                out.extend_from_slice(self.bpe.bytes(id));
            } else {
                out.extend_from_slice("\u{FFFD}".as_bytes());
            }
        }
        out
    }

    /// The id of the token whose text is `token` (an added token or a vocabulary entry).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.added.id_of(token).or_else(|| self.bpe.id(token.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::{ByteTokenizer, PieceCache, Tokenizer};

    #[test]
    fn the_null_tokenizer_reads_and_prints_ids_as_numbers() {
        let t = Tokenizer::Null { ids: 100 };
        assert_eq!((t.vocab_size(), t.eod(), t.type_name()), (101, 100, "NullTokenizer"));
        assert_eq!(t.encode(b" 5 17  100\n", &mut PieceCache::default()), [5, 17, 100]);
        assert_eq!(t.token_bytes(17), b" 17");
        assert!(t.check_text(b"0 99 100", "--prompt").is_ok());
        for bad in ["101", "-1", "a", "1.5"] {
            let e = t.check_text(bad.as_bytes(), "--prompt").unwrap_err().to_string();
            assert!(e.contains("--prompt") && e.contains("NullTokenizer"), "{bad}: {e}");
        }
    }

    #[test]
    fn round_trips_bytes_and_marks_documents() {
        let ids = ByteTokenizer::encode("héllo".as_bytes());
        assert_eq!(ids, vec![104, 195, 169, 108, 108, 111]);
        assert_eq!(ByteTokenizer::decode(&ids), "héllo");
        assert_eq!(ByteTokenizer::decode(&[97, ByteTokenizer::EOD, 98]), "a\n\nb");
        assert_eq!(ByteTokenizer::decode(&[97, 300, 0xFF, 98]), "a\u{FFFD}\u{FFFD}b");
        assert_eq!(ByteTokenizer::VOCAB_SIZE, ByteTokenizer::EOD as usize + 1);
    }
}
