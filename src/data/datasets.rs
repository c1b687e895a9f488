//! The train, valid and test datasets of a run, built as megatron-core's
//! `BlendedMegatronDatasetBuilder` builds them: one dataset split by `--split`, a weighted blend
//! of several split alike, separate blends per split (`--train-data-path` …), or Megatron's mock
//! data. Each mid-level dataset is a `GptDataset` with its own generator seeded by `--seed`, so
//! the order of building them does not matter; what must match is how many samples each is
//! asked for.

use super::blend::{normalize, samples_per_dataset, Blend, BlendedDataset};
use super::gpt_dataset::{split_ranges, GptDataset};
use super::index_cache::IndexCache;
use super::indexed::IndexedDataset;
use super::json::quote;
use super::source::{MockData, Source};
use crate::error::{Error, Result};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

pub const SPLIT_NAMES: [&str; 3] = ["train", "valid", "test"];

/// Where the samples come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// `--data-path` (one prefix or a blend) split by `--split` weights.
    Split { blend: Blend, split: Vec<f64> },
    /// `--train-data-path`, `--valid-data-path`, `--test-data-path`: a blend per split, unsplit.
    PerSplit([Option<Blend>; 3]),
    /// `--mock-data`: Megatron's mock sequences for a vocabulary and end-of-document id, split
    /// evenly in three as Megatron splits them.
    Mock { vocab_size: usize, eod: u32 },
}

/// What building the datasets needs besides the sample counts.
#[derive(Clone, Debug, PartialEq)]
pub struct DataConfig {
    pub source: DataSource,
    pub seq_length: usize,
    pub seed: u64,
    /// `--mid-level-dataset-surplus`: the extra fraction each blended dataset builds.
    pub surplus: f64,
    /// Token ids must be below this (the model's vocabulary).
    pub vocab_size: usize,
    /// `--data-cache-path`: where built indexes are kept for the next run.
    pub cache: Option<PathBuf>,
}

/// A split's samples: one dataset, or a blend.
pub enum Dataset {
    Single(GptDataset),
    Blended(BlendedDataset),
}

impl Dataset {
    pub fn len(&self) -> usize {
        match self {
            Dataset::Single(d) => d.len(),
            Dataset::Blended(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `out` (`seq_length + 1` tokens) with sample `i`, wrapping past the end.
    pub fn get(&self, i: usize, out: &mut [u32]) -> Result<()> {
        match self {
            Dataset::Single(d) => d.get(i, out),
            Dataset::Blended(b) => b.get(i, out),
        }
    }
}

/// The three splits for `counts` samples each (`[train, valid, test]`); a split with no data or
/// no samples asked for is None.
pub fn build(cfg: &DataConfig, counts: [usize; 3]) -> Result<[Option<Dataset>; 3]> {
    match &cfg.source {
        DataSource::Mock { vocab_size, eod } => {
            let source = Arc::new(Source::Mock(MockData::new(*vocab_size, *eod)?));
            let ranges = split_ranges(&[1.0, 1.0, 1.0], source.num_sequences())?;
            let mut out = [None, None, None];
            for i in 0..3 {
                out[i] = single(cfg, &source, ranges[i].clone(), counts[i], i)?.map(|p| Dataset::Single(p.ds));
            }
            Ok(out)
        }
        DataSource::Split { blend, split } => build_split(cfg, blend, split, counts),
        DataSource::PerSplit(blends) => {
            let mut out = [None, None, None];
            for (i, blend) in blends.iter().enumerate() {
                if let Some(blend) = blend.as_ref().filter(|_| counts[i] > 0) {
                    out[i] = blend_one_split(cfg, blend, counts[i], i)?;
                }
            }
            Ok(out)
        }
    }
}

fn open(prefix: &std::path::Path) -> Result<Arc<Source>> {
    Ok(Arc::new(Source::Indexed(IndexedDataset::open(prefix)?)))
}

/// A dataset of a split, with the description that keys its cached indexes.
struct Part {
    ds: GptDataset,
    key: String,
}

const GPT_INDEXES: [&str; 3] = ["document_index", "sample_index", "shuffle_index"];

/// The `GptDataset` of `sequences` of `source` for split `i`, or None when the split has no
/// sequences (a small dataset's 1/1000 test split can round to none). `samples` 0 builds one
/// epoch (megatron-core's `num_samples=None`). With a cache, indexes built for the same
/// description are loaded instead.
fn single(
    cfg: &DataConfig,
    source: &Arc<Source>,
    sequences: Range<usize>,
    samples: usize,
    i: usize,
) -> Result<Option<Part>> {
    if sequences.is_empty() {
        return Ok(None);
    }
    let name = SPLIT_NAMES[i];
    let key = format!(
        "{{\"class\": \"GPTDataset\", \"dataset\": {}, \"sequences\": {}, \"tokens\": {}, \"split\": \"{name}\", \
         \"indices\": [{}, {}], \"num_samples\": {samples}, \"sequence_length\": {}, \"random_seed\": {}}}",
        quote(&source.describe()),
        source.num_sequences(),
        source.num_tokens(),
        sequences.start,
        sequences.end,
        cfg.seq_length,
        cfg.seed
    );
    let cache = cfg.cache.as_deref().map(IndexCache::new);
    if let Some(arrays) = cache.as_ref().map(|c| c.load(&key, "GPTDataset", name, &GPT_INDEXES)).transpose()?.flatten()
    {
        let ds = GptDataset::from_arrays(source.clone(), sequences, cfg.seq_length, name, cfg.vocab_size, &arrays)?;
        return Ok(Some(Part { ds, key }));
    }
    let ds = GptDataset::build(source.clone(), sequences, samples, cfg.seq_length, cfg.seed, name, cfg.vocab_size)?;
    if let Some(cache) = cache {
        cache.store(&key, "GPTDataset", name, &ds.to_arrays())?;
    }
    Ok(Some(Part { ds, key }))
}

/// `--data-path` with `--split`: every dataset is split alike, and each split blends its parts.
fn build_split(cfg: &DataConfig, blend: &Blend, split: &[f64], counts: [usize; 3]) -> Result<[Option<Dataset>; 3]> {
    let sources = blend.prefixes.iter().map(|p| open(p)).collect::<Result<Vec<_>>>()?;
    let ranges = sources.iter().map(|s| split_ranges(split, s.num_sequences())).collect::<Result<Vec<_>>>()?;
    // A split whose weight is zero has no dataset, whatever the count (Megatron's None split).
    let wanted = |i: usize| counts[i] > 0 && split.get(i).is_some_and(|&w| w > 0.0);
    let mut out = [None, None, None];
    if blend.weights.is_none() && sources.len() == 1 {
        for i in (0..3).filter(|&i| wanted(i)) {
            out[i] = single(cfg, &sources[0], ranges[0][i].clone(), counts[i], i)?.map(|p| Dataset::Single(p.ds));
        }
        return Ok(out);
    }
    let weights = blend.weights.as_ref().map(|w| normalize(w));
    let plan = BlendPlan::new(weights.as_deref(), counts, cfg.surplus, sources.len());
    for i in (0..3).filter(|&i| wanted(i)) {
        let parts = sources
            .iter()
            .zip(&ranges)
            .enumerate()
            .map(|(k, (source, r))| {
                single(cfg, source, r[i].clone(), plan.build[k][i], i)?.ok_or_else(|| {
                    Error::Data(format!(
                        "the {} split of {} has none of its {} sequences (--split {} rounds its share to \
                         none); give that split more weight or the dataset more documents",
                        SPLIT_NAMES[i],
                        source.describe(),
                        source.num_sequences(),
                        split.iter().map(f64::to_string).collect::<Vec<_>>().join(",")
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out[i] = Some(plan.blend(cfg, parts, i, counts[i])?);
    }
    Ok(out)
}

/// `--train-data-path` and friends: split `i` alone, from the whole of each dataset.
fn blend_one_split(cfg: &DataConfig, blend: &Blend, count: usize, i: usize) -> Result<Option<Dataset>> {
    let sources = blend.prefixes.iter().map(|p| open(p)).collect::<Result<Vec<_>>>()?;
    if sources.len() == 1 {
        // megatron-core ignores a lone dataset's weight here.
        let whole = 0..sources[0].num_sequences();
        return Ok(single(cfg, &sources[0], whole, count, i)?.map(|p| Dataset::Single(p.ds)));
    }
    let mut counts = [0; 3];
    counts[i] = count;
    let weights = blend.weights.as_ref().map(|w| normalize(w));
    let plan = BlendPlan::new(weights.as_deref(), counts, cfg.surplus, sources.len());
    let parts = sources
        .iter()
        .enumerate()
        .map(|(k, source)| {
            single(cfg, source, 0..source.num_sequences(), plan.build[k][i], i)?
                .ok_or_else(|| Error::Data(format!("{} holds no sequences", source.describe())))
        })
        .collect::<Result<Vec<_>>>()?;
    plan.blend(cfg, parts, i, count).map(Some)
}

/// How many samples each dataset of a blend builds and contributes, per split.
struct BlendPlan<'a> {
    /// Normalised weights, or None to weigh by the datasets' sizes.
    weights: Option<&'a [f64]>,
    /// Samples each dataset contributes (without the surplus).
    target: Vec<[usize; 3]>,
    /// Samples each dataset builds (with the surplus; 0 = one epoch when unweighted).
    build: Vec<[usize; 3]>,
}

impl<'a> BlendPlan<'a> {
    fn new(weights: Option<&'a [f64]>, counts: [usize; 3], surplus: f64, n: usize) -> BlendPlan<'a> {
        match weights {
            Some(w) => BlendPlan {
                weights,
                target: samples_per_dataset(w, counts, 0.0),
                build: samples_per_dataset(w, counts, surplus),
            },
            None => BlendPlan { weights, target: vec![[0; 3]; n], build: vec![[0; 3]; n] },
        }
    }

    /// The blend of split `i` over its parts: with weights, the sum of the targets; without,
    /// the parts' sizes as weights and at most `count` samples.
    fn blend(&self, cfg: &DataConfig, parts: Vec<Part>, i: usize, count: usize) -> Result<Dataset> {
        let (weights, size) = match self.weights {
            Some(w) => (w.to_vec(), self.target.iter().map(|t| t[i]).sum()),
            None => {
                if let Some(empty) = parts.iter().find(|p| p.ds.is_empty()) {
                    return Err(Error::Data(format!(
                        "{} has fewer tokens than one sample, so an unweighted blend gives it no weight",
                        empty.ds.describe()
                    )));
                }
                let sizes: Vec<f64> = parts.iter().map(|p| p.ds.len() as f64).collect();
                let total: usize = parts.iter().map(|p| p.ds.len()).sum();
                (sizes, count.min(total))
            }
        };
        let name = SPLIT_NAMES[i];
        let key = format!(
            "{{\"class\": \"BlendedDataset\", \"datasets\": [{}], \"split\": \"{name}\", \"weights\": {weights:?}, \"size\": {size}}}",
            parts.iter().map(|p| p.key.as_str()).collect::<Vec<_>>().join(", ")
        );
        let datasets: Vec<GptDataset> = parts.into_iter().map(|p| p.ds).collect();
        let cache = cfg.cache.as_deref().map(IndexCache::new);
        let indexes = ["dataset_index", "dataset_sample_index"];
        if let Some(arrays) =
            cache.as_ref().map(|c| c.load(&key, "BlendedDataset", name, &indexes)).transpose()?.flatten()
        {
            return BlendedDataset::from_arrays(datasets, &arrays).map(Dataset::Blended);
        }
        let blend = BlendedDataset::build(datasets, &weights, size, name)?;
        if let Some(cache) = cache {
            cache.store(&key, "BlendedDataset", name, &blend.to_arrays())?;
        }
        Ok(Dataset::Blended(blend))
    }
}
