//! Byte-level BPE: a vocabulary of byte strings and a ranked list of merges, applied to each
//! piece of pre-tokenized text. The strings of vocab.json / merges.txt / tokenizer.json are
//! written in GPT-2's byte-to-character alphabet (`byte_char`); they are turned back into bytes
//! once, at load, so encoding works on the text's own UTF-8 bytes.
//!
//! Merging: every adjacent pair with a merge sits in a heap by (rank, position); the lowest rank
//! merges first, the leftmost of equal ranks first, and stale entries are skipped when popped
//! (n log n in the piece's length, so a long run of one class costs no quadratic time).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's map from a byte to the character that stands for it in vocabulary files: the
/// printable bytes `!`..`~`, `¡`..`¬` and `®`..`ÿ` stand for themselves, the other 68 take the
/// characters from U+0100 on, in byte order.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("below U+0144")
}

/// The byte each character of the alphabet stands for.
fn alphabet() -> HashMap<char, u8> {
    (0..=255u8).map(|b| (byte_char(b), b)).collect()
}

/// A loaded BPE model.
pub struct Bpe {
    /// Each id's bytes (empty for ids the vocabulary does not use).
    tokens: Vec<Vec<u8>>,
    ids: HashMap<Vec<u8>, u32>,
    /// (left, right) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    byte_ids: [u32; 256],
    /// A piece that is itself in the vocabulary is one token (Llama 3's `ignore_merges`).
    ignore_merges: bool,
}

impl Bpe {
    /// Builds the model from (string, id) pairs and ranked (left, right) merges, both in the
    /// byte alphabet. Errors name what is wrong (a string outside the alphabet, a merge whose
    /// parts or result are not in the vocabulary, a byte without a token).
    pub fn new(vocab: &[(String, u32)], merges: &[(String, String)], ignore_merges: bool) -> Result<Bpe, String> {
        let table = alphabet();
        let bytes_of = |s: &str| -> Result<Vec<u8>, String> {
            s.chars()
                .map(|c| table.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| format!("token {s:?} has a character outside the byte-level alphabet"))
        };
        let size = vocab.iter().map(|&(_, id)| id as usize + 1).max().unwrap_or(0);
        if size > Bpe::id_limit(vocab.len()) {
            return Err(format!(
                "a token has id {}, but the vocabulary lists {} tokens: ids must stay below {} (twice that, plus 256)",
                size - 1,
                vocab.len(),
                Bpe::id_limit(vocab.len())
            ));
        }
        let mut tokens = vec![Vec::new(); size];
        let mut ids = HashMap::with_capacity(vocab.len());
        for (s, id) in vocab {
            let b = bytes_of(s)?;
            tokens[*id as usize] = b.clone();
            ids.insert(b, *id);
        }
        let mut byte_ids = [0u32; 256];
        for b in 0..=255u8 {
            byte_ids[b as usize] =
                *ids.get(&vec![b]).ok_or_else(|| format!("the vocabulary has no token for the byte 0x{b:02x}"))?;
        }
        let mut ranked = HashMap::with_capacity(merges.len());
        for (rank, (l, r)) in merges.iter().enumerate() {
            let (lb, rb) = (bytes_of(l)?, bytes_of(r)?);
            let id = |b: &Vec<u8>, what: &str| {
                ids.get(b)
                    .copied()
                    .ok_or_else(|| format!("merge {} ({l:?} {r:?}): {what} is not in the vocabulary", rank + 1))
            };
            let merged = [lb.as_slice(), rb.as_slice()].concat();
            let key = (id(&lb, "the left part")?, id(&rb, "the right part")?);
            // The first (lowest-ranked) of duplicate merges wins, as in `tokenizers`.
            ranked.entry(key).or_insert((rank as u32, id(&merged, "the merged token")?));
        }
        Ok(Bpe { tokens, ids, merges: ranked, byte_ids, ignore_merges })
    }

    /// A tiktoken model: `tokens[i]` (raw bytes) has id `first_id + i`, the first 256 are the bytes
    /// in order, and a piece merges by the ids of what its neighbours make (tiktoken's rule, the
    /// lowest first, the leftmost of equal ones): every split of a token into two tokens is a
    /// merge ranked by the whole token's id; a piece that is a token is that token.
    pub fn from_ranks(tokens: Vec<Vec<u8>>, first_id: u32) -> Result<Bpe, String> {
        let size = first_id as usize + tokens.len();
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if i < 256 && t.as_slice() != [i as u8] {
                return Err(format!("rank {i} is {t:?}, not the byte {i}: the first 256 ranks are the bytes in order"));
            }
            if ids.insert(t.clone(), first_id + i as u32).is_some() {
                return Err(format!("the bytes {t:?} have two ranks"));
            }
        }
        if tokens.len() < 256 {
            return Err(format!("{} ranks: the first 256 must be the bytes", tokens.len()));
        }
        let mut merges = HashMap::new();
        for (i, t) in tokens.iter().enumerate().skip(256) {
            let id = first_id + i as u32;
            for cut in 1..t.len() {
                if let (Some(&l), Some(&r)) = (ids.get(&t[..cut]), ids.get(&t[cut..])) {
                    merges.insert((l, r), (id, id));
                }
            }
        }
        let byte_ids = std::array::from_fn(|b| first_id + b as u32);
        let mut all = vec![Vec::new(); size];
        for (i, t) in tokens.into_iter().enumerate() {
            all[first_id as usize + i] = t;
        }
        Ok(Bpe { tokens: all, ids, merges, byte_ids, ignore_merges: true })
    }

    /// The ids a file that lists `listed` tokens may use: below twice that, plus 256. Real
    /// vocabularies number their tokens densely; the rule keeps a crafted id (2^32 - 2 in a
    /// 3 KB file) from sizing a table, or a model's vocabulary, beyond what the file holds.
    pub fn id_limit(listed: usize) -> usize {
        listed.saturating_mul(2).saturating_add(256)
    }

    /// The tokens the vocabulary lists.
    pub fn listed(&self) -> usize {
        self.ids.len()
    }

    /// Ids 0..size (the largest id plus one).
    pub fn size(&self) -> usize {
        self.tokens.len()
    }

    /// The id of the token whose bytes are `bytes`.
    pub fn id(&self, bytes: &[u8]) -> Option<u32> {
        self.ids.get(bytes).copied()
    }

    /// The bytes of token `id` (empty past the vocabulary).
    pub fn bytes(&self, id: u32) -> &[u8] {
        self.tokens.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Appends the ids of one piece.
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 || self.ignore_merges {
            if let Some(id) = self.id(piece) {
                out.push(id);
                return;
            }
        }
        // Symbols as a linked list: id, previous and next index (usize::MAX at the ends), alive.
        let n = piece.len();
        let mut id: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { usize::MAX } else { i }).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        let pair = |l: u32, r: u32| self.merges.get(&(l, r)).copied();
        for i in 0..n.saturating_sub(1) {
            if let Some((rank, _)) = pair(id[i], id[i + 1]) {
                heap.push(Reverse((rank, i)));
            }
        }
        while let Some(Reverse((rank, i))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j == usize::MAX {
                continue;
            }
            let Some((r, merged)) = pair(id[i], id[j]) else { continue };
            if r != rank {
                continue;
            }
            id[i] = merged;
            alive[j] = false;
            next[i] = next[j];
            if next[j] != usize::MAX {
                prev[next[j]] = i;
            }
            if prev[i] != usize::MAX {
                if let Some((r, _)) = pair(id[prev[i]], id[i]) {
                    heap.push(Reverse((r, prev[i])));
                }
            }
            if next[i] != usize::MAX {
                if let Some((r, _)) = pair(id[i], id[next[i]]) {
                    heap.push(Reverse((r, i)));
                }
            }
        }
        let mut i = 0;
        while i != usize::MAX {
            out.push(id[i]);
            i = next[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(0), 'Ā');
        assert_eq!(byte_char(0xAD), 'Ń');
        let all: std::collections::BTreeSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
        assert_eq!(alphabet().len(), 256);
    }

    #[test]
    fn merges_apply_lowest_rank_first() {
        let mut vocab: Vec<(String, u32)> = (0..=255u8).map(|b| (byte_char(b).to_string(), b as u32)).collect();
        for (s, id) in [("ab", 256), ("bc", 257), ("abc", 258), ("aa", 259)] {
            vocab.push((s.into(), id));
        }
        let merges: Vec<(String, String)> = [("b", "c"), ("a", "b"), ("a", "bc"), ("a", "a")]
            .iter()
            .map(|(l, r)| (l.to_string(), r.to_string()))
            .collect();
        let bpe = Bpe::new(&vocab, &merges, false).unwrap();
        let enc = |s: &str| {
            let mut out = Vec::new();
            bpe.encode_piece(s.as_bytes(), &mut out);
            out
        };
        // "bc" (rank 0) before "ab" (rank 1), then "a"+"bc" (rank 2).
        assert_eq!(enc("abc"), [258]);
        assert_eq!(enc("abab"), [256, 256]);
        // Equal ranks merge leftmost first: "aaa" is "aa" "a".
        assert_eq!(enc("aaa"), [259, b'a' as u32]);
        assert_eq!(enc("xyz"), [b'x' as u32, b'y' as u32, b'z' as u32]);
        let bad = Bpe::new(&vocab, &[("a".into(), "z".into())], false).err().unwrap();
        assert!(bad.contains("merge 1") && bad.contains("merged token"), "{bad}");
    }

    #[test]
    fn ranks_merge_lowest_first_as_tiktoken_does() {
        // tiktoken's loop: merge the adjacent pair whose bytes have the lowest rank, leftmost first.
        let tiktoken = |ranks: &HashMap<Vec<u8>, u32>, piece: &[u8]| -> Vec<u32> {
            if let Some(&r) = ranks.get(piece) {
                return vec![r];
            }
            let mut parts: Vec<usize> = (0..=piece.len()).collect();
            loop {
                let best = (0..parts.len().saturating_sub(2))
                    .filter_map(|i| ranks.get(&piece[parts[i]..parts[i + 2]]).map(|&r| (r, i)))
                    .min();
                let Some((_, i)) = best else { break };
                parts.remove(i + 1);
            }
            parts.windows(2).map(|w| ranks[&piece[w[0]..w[1]]]).collect()
        };
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for t in ["ab", "bc", "abc", "aa", "aab", "bcd", "cd", "abcd", "da"] {
            tokens.push(t.as_bytes().to_vec());
        }
        let bpe = Bpe::from_ranks(tokens.clone(), 1000).unwrap();
        let ranks: HashMap<Vec<u8>, u32> =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), 1000 + i as u32)).collect();
        let mut seed = 7u64;
        for _ in 0..2000 {
            let piece: Vec<u8> = (0..1 + seed % 9)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    b"abcdx"[(seed >> 33) as usize % 5]
                })
                .collect();
            let mut got = Vec::new();
            bpe.encode_piece(&piece, &mut got);
            assert_eq!(got, tiktoken(&ranks, &piece), "{:?}", String::from_utf8_lossy(&piece));
        }
        let bad = Bpe::from_ranks(vec![vec![1]], 0).err().unwrap();
        assert!(bad.contains("the byte 0"), "{bad}");
    }
}
