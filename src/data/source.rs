//! Where a GPT dataset's sequences come from: a memory-mapped `.bin/.idx` dataset, or Megatron's
//! mock data (`--mock-data`), so the dataset layers above read either the same way.

use super::indexed::IndexedDataset;
use super::numpy_rng::Pcg64;
use crate::error::{Error, Result};

/// The sequences of one low-level dataset.
pub enum Source {
    Indexed(IndexedDataset),
    Mock(MockData),
}

impl Source {
    pub fn num_sequences(&self) -> usize {
        match self {
            Source::Indexed(d) => d.num_sequences(),
            Source::Mock(m) => m.lengths.len(),
        }
    }

    /// Tokens in sequence `i` (panics past the end, like slice indexing).
    pub fn sequence_length(&self, i: usize) -> usize {
        match self {
            Source::Indexed(d) => d.sequence_length(i),
            Source::Mock(m) => m.lengths[i] as usize,
        }
    }

    /// Tokens over all sequences.
    pub fn num_tokens(&self) -> usize {
        match self {
            Source::Indexed(d) => d.num_tokens(),
            Source::Mock(m) => m.lengths.iter().map(|&l| l as usize).sum(),
        }
    }

    /// Reads `out.len()` tokens of sequence `seq` from token `offset`.
    pub fn read(&self, seq: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        match self {
            Source::Indexed(d) => d.read(seq, offset, out),
            Source::Mock(m) => m.read(seq, offset, out),
        }
    }

    /// The dataset's name in messages: its path prefix, or "mock data".
    pub fn describe(&self) -> String {
        match self {
            Source::Indexed(d) => d.path_prefix().display().to_string(),
            Source::Mock(_) => "mock data".to_string(),
        }
    }

    /// Where the tokens are stored, for messages about a token: the `.bin` file, or "mock data".
    pub fn origin(&self) -> String {
        match self {
            Source::Indexed(d) => d.bin_path().display().to_string(),
            Source::Mock(_) => "mock data".to_string(),
        }
    }
}

/// Megatron's `MockGPTLowLevelDataset`: 100,000 sequences whose lengths numpy's
/// `default_rng(0).integers(1, 4096)` draws; a sequence of length L holds 1, 2, …, L − 1 (modulo
/// the vocabulary) and ends with the end-of-document token.
pub struct MockData {
    lengths: Vec<u32>,
    vocab_size: u32,
    eod: u32,
}

impl MockData {
    const SEED: u64 = 0;
    const SEQUENCES: usize = 100_000;
    const MAX_LENGTH: i32 = 4096;

    /// `vocab_size` is the tokenizer's (unpadded) vocabulary, as Megatron's mock data takes it.
    pub fn new(vocab_size: usize, eod: u32) -> Result<MockData> {
        let vocab_size = u32::try_from(vocab_size).ok().filter(|&v| v > eod && v > 1).ok_or_else(|| {
            Error::Config(format!("mock data for a vocabulary of {vocab_size} ids with end-of-document id {eod}"))
        })?;
        let mut rng = Pcg64::new(Self::SEED);
        let lengths = (0..Self::SEQUENCES).map(|_| rng.integer_i32(1, Self::MAX_LENGTH) as u32).collect();
        Ok(MockData { lengths, vocab_size, eod })
    }

    fn read(&self, seq: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        let length = *self.lengths.get(seq).ok_or_else(|| {
            Error::Data(format!("mock data: sequence {seq} requested, but it has {} sequences", self.lengths.len()))
        })? as usize;
        if offset + out.len() > length {
            return Err(Error::Data(format!(
                "mock data: tokens {offset}..{} of sequence {seq} requested, but it has {length} tokens",
                offset + out.len()
            )));
        }
        for (k, slot) in out.iter_mut().enumerate() {
            let t = offset + k;
            *slot = if t + 1 == length { self.eod } else { ((t + 1) as u64 % u64::from(self.vocab_size)) as u32 };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // numpy 2.4.6: default_rng(0).integers(1, 4096, size=100000, dtype=np.int32) starts
    // 3484, 2609, 2094 and ends 100, 769. Megatron's mock sequence 2 (vocabulary 300, eod 299)
    // ends [292, 293, 299]; sequence 0's tokens 298..302 are [299, 0, 1, 2]: the counting wraps
    // modulo the vocabulary, and passes through the eod id on the way.
    #[test]
    fn mock_data_matches_megatron() {
        let mock = Source::Mock(MockData::new(300, 299).unwrap());
        assert_eq!(mock.num_sequences(), 100_000);
        assert_eq!([0, 1, 2, 99_998, 99_999].map(|i| mock.sequence_length(i)), [3484, 2609, 2094, 100, 769]);
        let mut tail = [0u32; 3];
        mock.read(2, 2091, &mut tail).unwrap();
        assert_eq!(tail, [292, 293, 299]);
        let mut wrap = [0u32; 4];
        mock.read(0, 298, &mut wrap).unwrap();
        assert_eq!(wrap, [299, 0, 1, 2]);
        assert!(mock.read(0, 3482, &mut wrap).is_err());
        assert!(MockData::new(10, 10).is_err());
    }
}
