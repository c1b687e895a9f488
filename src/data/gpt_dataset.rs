//! Megatron's GPTDataset: the `--split` of a dataset into train/valid/test, and the document,
//! sample and shuffle indices that turn one split into shuffled samples of `seq_length + 1`
//! tokens, reproducing Megatron's (and numpy's) choices exactly so runs are comparable.
//!
//! The three indices (Megatron notes, section 6.3):
//! - document index: the split's sequence ids tiled once per epoch and shuffled;
//! - sample index: for each sample boundary, the (document-index position, token offset) of the
//!   token where one sample ends and the next begins, so consecutive samples share one token;
//! - shuffle index: a permutation of the samples.
//!
//! One `RandomState(seed)` feeds the document-index shuffles and then the shuffle-index shuffles,
//! in that order; the order is what makes the result match Megatron's.

use super::index_cache::{stale, Array};
use super::numpy_rng::RandomState;
use super::source::Source;
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::Arc;

const SPLIT_EXPECTED: &str = "1 to 3 non-negative weights separated by ',' or '/', e.g. 969,30,1";

/// Parses `--split` as Megatron writes it: "969,30,1", "969, 30, 1" or "98/2/0", quoted or not
/// (a job script's `"--split '99,1,0'"` hands Megatron the quotes, which it skips).
pub fn parse_split(s: &str) -> Result<Vec<f64>> {
    let quotes: &[char] = &['\'', '"'];
    let weights = s
        .trim()
        .trim_matches(quotes)
        .split([',', '/'])
        .map(|part| part.trim().parse::<f64>().ok().filter(|w| w.is_finite() && *w >= 0.0))
        .collect::<Option<Vec<f64>>>()
        .filter(|weights| weights.len() <= 3);
    weights.ok_or_else(|| Error::flag("--split", format!("\"{s}\""), SPLIT_EXPECTED))
}

/// The train, valid and test ranges of `num_documents` for `--split` weights (missing weights
/// are 0). As in Megatron, the weights are normalised, their running sums taken, and each
/// boundary is `round(sum · N)` with Python's round-half-to-even; a zero weight gives an empty
/// range.
pub fn split_ranges(weights: &[f64], num_documents: usize) -> Result<[Range<usize>; 3]> {
    let valid = (1..=3).contains(&weights.len()) && weights.iter().all(|w| w.is_finite() && *w >= 0.0);
    let total: f64 = weights.iter().sum();
    if !valid || total <= 0.0 {
        return Err(Error::flag("--split", format!("{weights:?}"), format!("{SPLIT_EXPECTED}, not all zero")));
    }
    let n = num_documents as f64;
    let mut bounds = [0usize; 4];
    let mut running = 0.0;
    for i in 0..3 {
        running += weights.get(i).map_or(0.0, |w| w / total);
        // Rounding error can push the running sum a hair above 1; never past the data.
        bounds[i + 1] = ((running * n).round_ties_even() as usize).min(num_documents);
    }
    Ok([bounds[0]..bounds[1], bounds[1]..bounds[2], bounds[2]..bounds[3]])
}

/// The permutation of samples, narrow while sample ids fit in u32 (Megatron's uint32 threshold).
enum ShuffleIndex {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl ShuffleIndex {
    /// `0..total` with `[0, first)` and `[first, total)` shuffled separately, in that order.
    fn build(first: usize, total: usize, rng: &mut RandomState) -> ShuffleIndex {
        fn shuffled<T>(first: usize, total: usize, rng: &mut RandomState, id: impl Fn(usize) -> T) -> Vec<T> {
            let mut index: Vec<T> = (0..total).map(id).collect();
            let (head, tail) = index.split_at_mut(first);
            rng.shuffle(head);
            rng.shuffle(tail);
            index
        }
        if total < u32::MAX as usize - 1 {
            ShuffleIndex::Narrow(shuffled(first, total, rng, |i| i as u32))
        } else {
            ShuffleIndex::Wide(shuffled(first, total, rng, |i| i as u64))
        }
    }

    fn get(&self, i: usize) -> usize {
        match self {
            ShuffleIndex::Narrow(index) => index[i] as usize,
            ShuffleIndex::Wide(index) => index[i] as usize,
        }
    }

    fn len(&self) -> usize {
        match self {
            ShuffleIndex::Narrow(index) => index.len(),
            ShuffleIndex::Wide(index) => index.len(),
        }
    }
}

/// One split of an indexed dataset as shuffled samples of `seq_length + 1` tokens.
pub struct GptDataset {
    data: Arc<Source>,
    /// "train split of data/x_text_document", for messages.
    description: String,
    seq_length: usize,
    vocab_size: usize,
    num_epochs: usize,
    /// Sequence ids, one entry per sequence per epoch (Megatron: int32).
    document_index: Vec<u32>,
    /// Sample boundaries: position in `document_index` and token offset in that sequence.
    sample_positions: Vec<u32>,
    sample_offsets: Vec<u32>,
    shuffle_index: ShuffleIndex,
}

impl GptDataset {
    /// Builds the indices for the sequences `sequences` of `data` (Megatron's GPT split is over
    /// sequence indices, which equal document indices unless documents are empty or split into
    /// sentences) so that at least `num_samples` samples exist (usually more: the last epoch is
    /// used up to its end). `name` is the split's name ("train", "valid", "test"); `vocab_size`
    /// bounds the token ids `get` accepts.
    pub fn build(
        data: Arc<Source>,
        sequences: Range<usize>,
        num_samples: usize,
        seq_length: usize,
        seed: u64,
        name: &str,
        vocab_size: usize,
    ) -> Result<GptDataset> {
        let seed = u32::try_from(seed)
            .map_err(|_| Error::flag("--seed", seed, "an integer from 0 to 4294967295 (numpy's RandomState range)"))?;
        if seq_length == 0 {
            return Err(Error::flag("--seq-length", 0, "a positive number of tokens"));
        }
        let description = format!("{name} split of {}", data.describe());
        if sequences.is_empty() || sequences.end > data.num_sequences() {
            return Err(Error::Data(format!(
                "{description} has {} sequences (of {} in the file); give it a larger --split weight or use more data",
                sequences.len(),
                data.num_sequences()
            )));
        }

        // Megatron's epoch arithmetic, in u64 because token counts outgrow u32.
        let s = seq_length as u64;
        let tokens_per_epoch: u64 = sequences.clone().map(|i| data.sequence_length(i) as u64).sum();
        // Fewer tokens than a sample is fine (samples then span epochs, as in Megatron); none
        // at all would make Megatron count epochs forever.
        if tokens_per_epoch == 0 {
            return Err(Error::Data(format!("{description} has {} sequences, all empty", sequences.len())));
        }
        let too_many =
            || Error::Config(format!("{num_samples} samples of {seq_length} tokens overflow a 64-bit token count"));
        let tokens_requested =
            (num_samples as u64).checked_mul(s).and_then(|t| t.checked_add(1)).ok_or_else(too_many)?;
        let num_epochs = tokens_requested.div_ceil(tokens_per_epoch).max(1);
        let tokens_built = num_epochs.checked_mul(tokens_per_epoch).ok_or_else(too_many)?;
        let num_built = (tokens_built - 1) / s;

        // When only a small part of the last epoch is needed, Megatron shuffles that epoch on its
        // own, so the samples actually used cover the earlier epochs completely instead of mixing
        // in a scattered part of the last one.
        let samples_before_final = if num_epochs > 1 { ((num_epochs - 1) * tokens_per_epoch - 1) / s } else { 0 };
        let separate_final_epoch = num_epochs > 1 && {
            let per_epoch = (tokens_per_epoch - 1) / s;
            let from_final = (num_samples as u64).saturating_sub(samples_before_final);
            from_final < (0.80 * per_epoch as f64) as u64
        };

        // Sequence ids and document-index positions are kept in 32 bits (Megatron: int32).
        let index_len = num_epochs
            .checked_mul(sequences.len() as u64)
            .filter(|&len| len < u64::from(u32::MAX) && sequences.end < u32::MAX as usize);
        let Some(index_len) = index_len else {
            return Err(Error::Config(format!(
                "{description}: {num_samples} samples need {num_epochs} epochs of sequences \
                 {}..{}, beyond the 2^32 document-index entries and sequence ids this build holds",
                sequences.start, sequences.end
            )));
        };

        let mut rng = RandomState::new(seed);
        let one_epoch = sequences.start as u32..sequences.end as u32;
        let mut document_index: Vec<u32> = Vec::with_capacity(index_len as usize);
        for _ in 0..num_epochs {
            document_index.extend(one_epoch.clone());
        }
        if separate_final_epoch {
            let (earlier, last) = document_index.split_at_mut((index_len - sequences.len() as u64) as usize);
            rng.shuffle(earlier);
            rng.shuffle(last);
        } else {
            rng.shuffle(&mut document_index);
        }

        let (sample_positions, sample_offsets) =
            build_sample_index(&data, &document_index, seq_length, num_built as usize);
        let first_shuffle = if separate_final_epoch { samples_before_final } else { num_built };
        let shuffle_index = ShuffleIndex::build(first_shuffle as usize, num_built as usize, &mut rng);

        Ok(GptDataset {
            data,
            description,
            seq_length,
            vocab_size,
            num_epochs: num_epochs as usize,
            document_index,
            sample_positions,
            sample_offsets,
            shuffle_index,
        })
    }

    /// The three indexes as numpy arrays in Megatron's dtypes (document index int32, sample
    /// index int32 pairs, or int64 past int32, shuffle index uint32 or int64), for the cache.
    pub fn to_arrays(&self) -> [(&'static str, Array); 3] {
        let document =
            Array::I32(vec![self.document_index.len()], self.document_index.iter().map(|&d| d as i32).collect());
        let pairs = self.sample_positions.iter().zip(&self.sample_offsets).flat_map(|(&p, &o)| [p, o]);
        let shape = vec![self.sample_positions.len(), 2];
        let sample = if self.document_index.len() < i32::MAX as usize
            && self.sample_offsets.iter().all(|&o| o <= i32::MAX as u32)
        {
            Array::I32(shape, pairs.map(|v| v as i32).collect())
        } else {
            Array::I64(shape, pairs.map(i64::from).collect())
        };
        let shuffle = match &self.shuffle_index {
            ShuffleIndex::Narrow(v) => Array::U32(vec![v.len()], v.clone()),
            ShuffleIndex::Wide(v) => Array::I64(vec![v.len()], v.iter().map(|&x| x as i64).collect()),
        };
        [("document_index", document), ("sample_index", sample), ("shuffle_index", shuffle)]
    }

    /// The dataset from cached indexes (`to_arrays`' order, each with the file it came from),
    /// checked to fit `sequences` of `data` so a stale or foreign cache is an error, not a panic.
    pub fn from_arrays(
        data: Arc<Source>,
        sequences: Range<usize>,
        seq_length: usize,
        name: &str,
        vocab_size: usize,
        arrays: &[(std::path::PathBuf, Array)],
    ) -> Result<GptDataset> {
        let [(doc_path, document), (sample_path, sample), (shuffle_path, shuffle)] = arrays else {
            return Err(Error::Config(format!("{} cached arrays for a GPT dataset, not 3", arrays.len())));
        };
        let document_index: Vec<u32> = document
            .values()
            .into_iter()
            .map(|d| u32::try_from(d).ok().filter(|&d| sequences.contains(&(d as usize))))
            .collect::<Option<_>>()
            .ok_or_else(|| stale(doc_path, format!("an entry outside sequences {sequences:?}")))?;
        if sequences.is_empty() || document_index.is_empty() || !document_index.len().is_multiple_of(sequences.len()) {
            return Err(stale(doc_path, format!("{} entries for {} sequences", document_index.len(), sequences.len())));
        }
        let pairs = sample.values();
        if sample.shape().len() != 2 || sample.shape()[1] != 2 || pairs.len() < 2 {
            return Err(stale(sample_path, format!("shape {:?}, not (samples + 1, 2)", sample.shape())));
        }
        let (mut positions, mut offsets) = (Vec::with_capacity(pairs.len() / 2), Vec::with_capacity(pairs.len() / 2));
        for pair in pairs.chunks_exact(2) {
            let position = usize::try_from(pair[0]).ok().filter(|&p| p < document_index.len());
            let fits = position.is_some_and(|p| {
                positions.last().is_none_or(|&last| p >= last as usize)
                    && usize::try_from(pair[1])
                        .is_ok_and(|o| o < data.sequence_length(document_index[p] as usize).max(1))
            });
            if !fits {
                return Err(stale(sample_path, format!("boundary {} is ({}, {})", positions.len(), pair[0], pair[1])));
            }
            positions.push(pair[0] as u32);
            offsets.push(pair[1] as u32);
        }
        let samples = positions.len() - 1;
        let order = shuffle.values();
        if order.len() != samples || order.iter().any(|&k| !(0..samples as i64).contains(&k)) {
            return Err(stale(shuffle_path, format!("not a permutation of the {samples} samples")));
        }
        let shuffle_index = match shuffle {
            Array::U32(_, v) => ShuffleIndex::Narrow(v.clone()),
            _ => ShuffleIndex::Wide(order.iter().map(|&k| k as u64).collect()),
        };
        Ok(GptDataset {
            description: format!("{name} split of {}", data.describe()),
            data,
            seq_length,
            vocab_size,
            num_epochs: document_index.len() / sequences.len(),
            document_index,
            sample_positions: positions,
            sample_offsets: offsets,
            shuffle_index,
        })
    }

    /// Samples built, which can exceed the number requested.
    pub fn len(&self) -> usize {
        self.shuffle_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn seq_length(&self) -> usize {
        self.seq_length
    }

    /// "train split of data/x_text_document", for messages.
    pub fn describe(&self) -> &str {
        &self.description
    }

    pub fn num_epochs(&self) -> usize {
        self.num_epochs
    }

    /// The shuffled sequence ids, one per sequence per epoch.
    pub fn document_index(&self) -> &[u32] {
        &self.document_index
    }

    /// Boundary `k` of the sample index (`0..=len()`): a position in the document index and a
    /// token offset in that sequence.
    pub fn sample_index(&self, k: usize) -> (usize, usize) {
        (self.sample_positions[k] as usize, self.sample_offsets[k] as usize)
    }

    /// The sample that position `i` of the run reads.
    pub fn shuffle_index(&self, i: usize) -> usize {
        self.shuffle_index.get(i)
    }

    /// Fills `out` (`seq_length + 1` tokens) with sample `shuffle_index(i % len())`: the input is
    /// `out[..s]` and the labels `out[1..]`. Positions past the end wrap around. Every token is
    /// checked against the vocabulary, since an out-of-range id would otherwise index past the
    /// embedding table on the device.
    pub fn get(&self, i: usize, out: &mut [u32]) -> Result<()> {
        if out.len() != self.seq_length + 1 {
            return Err(Error::Config(format!(
                "a sample buffer of {} tokens for the {}, whose samples have seq_length + 1 = {}",
                out.len(),
                self.description,
                self.seq_length + 1
            )));
        }
        let sample = self.shuffle_index.get(i % self.len().max(1));
        let (mut position, mut offset) = self.sample_index(sample);
        let (end_position, end_offset) = self.sample_index(sample + 1);
        let mut filled = 0;
        loop {
            let seq = self.document_index[position] as usize;
            let stop = if position == end_position { end_offset + 1 } else { self.data.sequence_length(seq) };
            let piece = out.get_mut(filled..filled + (stop - offset)).ok_or_else(|| {
                Error::Data(format!(
                    "{}: sample {sample} spans more than {} tokens",
                    self.description,
                    self.seq_length + 1
                ))
            })?;
            self.data.read(seq, offset, piece)?;
            if let Some((k, id)) = piece.iter().enumerate().find(|(_, &id)| id as usize >= self.vocab_size) {
                return Err(Error::Data(format!(
                    "{}: sequence {seq} holds token id {id} at offset {}, but the vocabulary has \
                     {} ids; was it prepared with a different tokenizer?",
                    self.data.origin(),
                    offset + k,
                    self.vocab_size
                )));
            }
            filled += piece.len();
            if position == end_position {
                break;
            }
            position += 1;
            offset = 0;
        }
        Ok(())
    }
}

/// Megatron's `build_sample_idx` with the extra label token: sample k covers tokens
/// `[k·s, k·s + s]` of the doc-shuffled token stream, and boundary k + 1 records where its last
/// token lies, which is also where sample k + 1 starts. The caller sized `num_samples` so that
/// the stream holds every token walked here.
fn build_sample_index(
    data: &Source,
    document_index: &[u32],
    seq_length: usize,
    num_samples: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut positions = Vec::with_capacity(num_samples + 1);
    let mut offsets = Vec::with_capacity(num_samples + 1);
    let (mut position, mut offset) = (0usize, 0usize);
    positions.push(0);
    offsets.push(0);
    for _ in 0..num_samples {
        // Tokens still to cover, counting the one at the current boundary.
        let mut remaining = seq_length + 1;
        loop {
            let available = data.sequence_length(document_index[position] as usize) - offset;
            if available >= remaining {
                offset += remaining - 1;
                break;
            }
            remaining -= available;
            position += 1;
            offset = 0;
        }
        // Positions are below the document-index length, checked to fit in u32, and offsets
        // below a sequence length, an i32.
        positions.push(position as u32);
        offsets.push(offset as u32);
    }
    (positions, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::indexed::{IndexedDataset, IndexedDatasetWriter, TokenDtype};

    /// A dataset whose document d has the given length and holds tokens 100·d, 100·d + 1, ….
    fn dataset(lengths: &[u32]) -> Arc<Source> {
        let prefix = crate::data::test_dir("gpt").join("d");
        let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::I32).unwrap();
        for (d, &length) in lengths.iter().enumerate() {
            let tokens: Vec<u32> = (0..length).map(|t| 100 * d as u32 + t).collect();
            writer.add_document(&tokens).unwrap();
        }
        writer.finish().unwrap();
        Arc::new(Source::Indexed(IndexedDataset::open(&prefix).unwrap()))
    }

    fn sample_index(ds: &GptDataset) -> Vec<(usize, usize)> {
        (0..=ds.len()).map(|k| ds.sample_index(k)).collect()
    }

    fn shuffle_index(ds: &GptDataset) -> Vec<usize> {
        (0..ds.len()).map(|i| ds.shuffle_index(i)).collect()
    }

    #[test]
    fn parses_megatron_split_forms() {
        assert_eq!(parse_split("969,30,1").unwrap(), [969.0, 30.0, 1.0]);
        assert_eq!(parse_split("969, 30, 1").unwrap(), [969.0, 30.0, 1.0]);
        assert_eq!(parse_split("98/2/0").unwrap(), [98.0, 2.0, 0.0]);
        assert_eq!(parse_split("0.9,0.1").unwrap(), [0.9, 0.1]);
        assert_eq!(parse_split("100").unwrap(), [100.0]);
        assert_eq!(parse_split("'99,1,0'").unwrap(), [99.0, 1.0, 0.0]);
        assert_eq!(parse_split("\"99, 1, 0\"").unwrap(), [99.0, 1.0, 0.0]);
        for bad in ["", "1,,2", "a,b", "-1,2", "1,2,3,4", "inf"] {
            let err = parse_split(bad).unwrap_err().to_string();
            assert!(err.starts_with("flag --split") && err.contains("e.g. 969,30,1"), "{bad}: {err}");
        }
    }

    // Expected ranges from Megatron's bookend formula (parse_and_normalize_split, then
    // int(round(bookend * N))) run in Python; [1,1] of 5 shows round-half-to-even (2.5 -> 2).
    #[test]
    fn split_ranges_match_megatron() {
        assert_eq!(split_ranges(&[969.0, 30.0, 1.0], 1000).unwrap(), [0..969, 969..999, 999..1000]);
        assert_eq!(split_ranges(&[1.0, 1.0], 5).unwrap(), [0..2, 2..5, 5..5]);
        assert_eq!(split_ranges(&[1.0, 2.0, 1.0], 6).unwrap(), [0..2, 2..4, 4..6]);
        assert_eq!(split_ranges(&[98.0, 2.0], 7).unwrap(), [0..7, 7..7, 7..7]);
        assert_eq!(split_ranges(&[1.0], 3).unwrap(), [0..3, 3..3, 3..3]);
        assert!(split_ranges(&[0.0, 0.0], 3).is_err());
        assert!(split_ranges(&[1.0, -1.0], 3).is_err());
        assert!(split_ranges(&[], 3).is_err());
    }

    // Reference values: a throwaway Python script re-expressing Megatron's _get_num_epochs,
    // separate-final-epoch rule, _build_document_index, helpers.cpp build_sample_idx and
    // _build_shuffle_index on numpy 2.4.6's legacy RandomState printed the indices below.
    //
    // Hand check of the one-epoch case (lengths [5,3,7,1,4], s = 4, 20 tokens, (20-1)/4 = 4
    // samples). numpy shuffles the document order to [4,0,1,2,3], i.e. lengths [4,5,3,7,1], so
    // positions 0..5 hold stream tokens 0-3, 4-8, 9-11, 12-18 and 19. Boundary k sits on token
    // 4k: token 4 is position 1 offset 0, token 8 position 1 offset 4, token 12 position 3
    // offset 0, token 16 position 3 offset 4.
    #[test]
    fn one_epoch_indices_match_megatron_and_samples_overlap_by_one_token() {
        let data = dataset(&[5, 3, 7, 1, 4]);
        let ds = GptDataset::build(data.clone(), 0..5, 4, 4, 1234, "train", 500).unwrap();
        assert_eq!(ds.num_epochs(), 1);
        assert_eq!(ds.document_index(), [4, 0, 1, 2, 3]);
        assert_eq!(sample_index(&ds), [(0, 0), (1, 0), (1, 4), (3, 0), (3, 4)]);
        assert_eq!(shuffle_index(&ds), [2, 1, 3, 0]);

        // Samples in sample order, i.e. undoing the shuffle, rebuild the doc-shuffled stream.
        let stream: Vec<u32> = ds
            .document_index()
            .iter()
            .flat_map(|&d| (0..data.sequence_length(d as usize) as u32).map(move |t| 100 * d + t))
            .collect();
        let mut out = [0u32; 5];
        for i in 0..ds.len() {
            ds.get(i, &mut out).unwrap();
            let k = ds.shuffle_index(i);
            assert_eq!(out[..], stream[4 * k..4 * k + 5], "sample {k}");
        }
        // Position 0 reads sample 2, stream tokens 8..=12: the last token of document 0, all of
        // document 1, and the first token of document 2.
        ds.get(0, &mut out).unwrap();
        assert_eq!(out, [4, 100, 101, 102, 200]);
        // Wrapping past the end reads the same samples again.
        let mut again = [0u32; 5];
        ds.get(ds.len(), &mut again).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn multi_epoch_indices_match_megatron() {
        let data = dataset(&[5, 3, 7, 1, 4]);
        // 9 samples need 37 tokens: two epochs, the second providing 5 of 4 per-epoch samples,
        // above the 80% threshold, so both epochs are shuffled together.
        let ds = GptDataset::build(data.clone(), 0..5, 9, 4, 1234, "train", 500).unwrap();
        assert_eq!(ds.num_epochs(), 2);
        assert_eq!(ds.document_index(), [2, 2, 4, 1, 0, 3, 4, 0, 1, 3]);
        assert_eq!(sample_index(&ds), [(0, 0), (0, 4), (1, 1), (1, 5), (2, 2), (3, 2), (4, 3), (6, 1), (7, 1), (8, 0)]);
        assert_eq!(shuffle_index(&ds), [7, 3, 5, 1, 4, 8, 0, 2, 6]);

        // 5 samples: the second epoch provides 1 sample, below int(0.8·4) = 3, so it is
        // shuffled separately, in both the document and the shuffle index.
        let ds = GptDataset::build(data, 0..5, 5, 4, 1234, "train", 500).unwrap();
        assert_eq!(ds.document_index(), [4, 0, 1, 2, 3, 3, 2, 1, 0, 4]);
        assert_eq!(sample_index(&ds), [(0, 0), (1, 0), (1, 4), (3, 0), (3, 4), (5, 0), (6, 3), (7, 0), (8, 1), (9, 0)]);
        assert_eq!(shuffle_index(&ds), [2, 0, 3, 1, 5, 8, 4, 6, 7]);
    }

    #[test]
    fn larger_split_matches_megatron() {
        let lengths: Vec<u32> = (0..1000).map(|i| 1 + (i * 7919) % 37).collect();
        let data = dataset(&lengths);
        let [train, _, _] = split_ranges(&parse_split("969,30,1").unwrap(), data.num_sequences()).unwrap();

        let ds = GptDataset::build(data.clone(), train.clone(), 3000, 16, 7, "train", 100_000).unwrap();
        assert_eq!((ds.num_epochs(), ds.len()), (3, 3432));
        assert_eq!(ds.document_index()[..6], [899, 749, 602, 820, 868, 263]);
        assert_eq!(ds.document_index()[ds.document_index().len() - 4..], [449, 959, 802, 936]);
        assert_eq!([1, 2, 1000, 3432].map(|k| ds.sample_index(k)), [(1, 4), (2, 10), (854, 7), (2906, 6)]);
        assert_eq!([0, 1, 2, 3, 4, 5].map(|i| ds.shuffle_index(i)), [1146, 277, 78, 65, 680, 2228]);
        assert_eq!([3428, 3429, 3430, 3431].map(|i| ds.shuffle_index(i)), [2852, 2883, 3201, 2393]);

        let ds = GptDataset::build(data, train, 5000, 16, 7, "train", 100_000).unwrap();
        assert_eq!((ds.num_epochs(), ds.len()), (5, 5720));
        assert_eq!(ds.document_index()[..4], [921, 653, 105, 577]);
        assert_eq!(ds.document_index()[969..973], [764, 428, 637, 554]);
        assert_eq!(ds.document_index()[ds.document_index().len() - 3..], [665, 30, 444]);
        assert_eq!([1, 3000, 5720].map(|k| ds.sample_index(k)), [(0, 16), (2554, 14), (4843, 22)]);
        assert_eq!([0, 1, 2, 3].map(|i| ds.shuffle_index(i)), [2307, 2306, 1583, 2339]);
        assert_eq!([5716, 5717, 5718, 5719].map(|i| ds.shuffle_index(i)), [5297, 5213, 5159, 5126]);
    }

    #[test]
    fn unusable_splits_and_flags_are_reported() {
        let data = dataset(&[5, 3]);
        let err = |documents: Range<usize>, seq_length: usize, seed: u64| {
            GptDataset::build(data.clone(), documents, 10, seq_length, seed, "valid", 500).err().unwrap().to_string()
        };
        let prefix = data.describe();
        assert_eq!(err(2..2, 4, 1), format!("bad training data: valid split of {prefix} has 0 sequences (of 2 in the file); give it a larger --split weight or use more data"));
        // Eight tokens and samples of nine: every sample spans two epochs, as in Megatron.
        let short = GptDataset::build(data.clone(), 0..2, 3, 8, 1, "valid", 500).unwrap();
        assert_eq!((short.num_epochs(), short.len()), (4, 3));
        assert!(err(0..3, 4, 1).contains("has 3 sequences (of 2 in the file)"));
        assert!(err(0..2, 0, 1).starts_with("flag --seq-length"));
        assert!(err(0..2, 4, 1 << 32).starts_with("flag --seed"));
        let ds = GptDataset::build(data, 0..2, 1, 4, 1, "valid", 500).unwrap();
        let wrong = ds.get(0, &mut [0u32; 4]).unwrap_err().to_string();
        assert!(wrong.contains("sample buffer of 4 tokens") && wrong.contains("seq_length + 1 = 5"), "{wrong}");
    }
}
