//! Megatron's dataset blends: `--data-path 0.3 a 0.7 b` parsed as megatron-core parses it, the
//! number of samples each dataset contributes, and the `BlendedDataset` that interleaves them by
//! weight (its dataset index and dataset-sample index), reproduced exactly so a blend yields the
//! same samples in the same order as Megatron's.

use super::gpt_dataset::GptDataset;
use super::index_cache::{stale, Array};
use crate::error::{Error, Result};
use std::path::PathBuf;

/// Dataset prefixes, with weights when the list gave them.
#[derive(Clone, Debug, PartialEq)]
pub struct Blend {
    pub prefixes: Vec<PathBuf>,
    pub weights: Option<Vec<f64>>,
}

impl Blend {
    /// The values of `flag` as Megatron reads them: an odd count is a list of prefixes; an even
    /// count alternates weight and prefix, unless no "weight" is a number (then all are
    /// prefixes). Weights must be positive.
    pub fn parse(flag: &str, values: &[String]) -> Result<Blend> {
        let expected = "PREFIX..., or WEIGHT PREFIX pairs such as 0.3 a_text_document 0.7 b_text_document";
        if values.is_empty() {
            return Err(Error::flag(flag, "no value", expected));
        }
        let prefixes_only =
            || Blend { prefixes: values.iter().map(|v| PathBuf::from(v.trim())).collect(), weights: None };
        if values.len() % 2 == 1 {
            return Ok(prefixes_only());
        }
        let weights: Vec<Option<f64>> = values.iter().step_by(2).map(|w| w.trim().parse::<f64>().ok()).collect();
        if weights.iter().all(Option::is_none) {
            return Ok(prefixes_only());
        }
        let mut parsed = Vec::with_capacity(weights.len());
        for (pair, weight) in values.chunks(2).zip(weights) {
            match weight {
                Some(w) if w.is_finite() && w > 0.0 => parsed.push(w),
                _ => {
                    return Err(Error::flag(
                        flag,
                        format!("'{}' as the weight of {}", pair[0], pair[1]),
                        format!("a positive number for every dataset ({expected})"),
                    ))
                }
            }
        }
        let prefixes = values.iter().skip(1).step_by(2).map(|p| PathBuf::from(p.trim())).collect();
        Ok(Blend { prefixes, weights: Some(parsed) })
    }
}

/// numpy's sum of a float64 array: pairwise summation with eight accumulators in blocks of up
/// to 128, so normalised weights round exactly as megatron-core's do.
fn numpy_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        return a.iter().fold(0.0, |acc, &x| acc + x);
    }
    if n <= 128 {
        let mut r = [0.0; 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for block in a[8..whole].chunks_exact(8) {
            for (acc, &x) in r.iter_mut().zip(block) {
                *acc += x;
            }
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[whole..] {
            res += x;
        }
        return res;
    }
    let mut half = n / 2;
    half -= half % 8;
    numpy_sum(&a[..half]) + numpy_sum(&a[half..])
}

/// megatron-core's `normalize`: each weight over numpy's sum of them.
pub fn normalize(weights: &[f64]) -> Vec<f64> {
    let total = numpy_sum(weights);
    weights.iter().map(|w| w / total).collect()
}

/// The samples each dataset contributes to each split for normalised `weights` and the splits'
/// sample counts: `ceil(ceil(count · weight) · (1 + surplus))` (megatron-core's
/// `_get_size_per_split_per_dataset`), one `[train, valid, test]` per dataset.
pub fn samples_per_dataset(weights: &[f64], counts: [usize; 3], surplus: f64) -> Vec<[usize; 3]> {
    weights.iter().map(|&w| counts.map(|n| ((n as f64 * w).ceil() * (1.0 + surplus)).ceil() as usize)).collect()
}

/// Datasets interleaved by weight: sample `i` of the blend is sample `sample_index[i]` of
/// dataset `dataset_index[i]`.
pub struct BlendedDataset {
    datasets: Vec<GptDataset>,
    dataset_index: Vec<u16>,
    sample_index: Vec<u64>,
}

impl BlendedDataset {
    /// `size` samples drawn from `datasets` in proportion to `weights` (normalised here, as
    /// megatron-core's `BlendedDataset` does even when they already are): each sample goes to the
    /// dataset furthest below its share so far (ties to the first). `split` names the split in
    /// the error when a dataset has fewer samples than the blend draws from it.
    pub fn build(datasets: Vec<GptDataset>, weights: &[f64], size: usize, split: &str) -> Result<BlendedDataset> {
        assert_eq!(datasets.len(), weights.len(), "one weight per dataset");
        if datasets.len() >= i16::MAX as usize {
            return Err(Error::Config(format!("a blend of {} datasets; at most 32766", datasets.len())));
        }
        let weights = normalize(weights);
        let (dataset_index, sample_index) = blending_indices(&weights, size);
        let blend = BlendedDataset { datasets, dataset_index, sample_index };
        for (k, (ds, n)) in blend.datasets.iter().zip(blend.drawn()).enumerate() {
            if n > ds.len() {
                return Err(Error::Data(format!(
                    "the {split} blend draws {n} samples from dataset {k} ({}), which has {}; raise \
                     --mid-level-dataset-surplus (Megatron's remedy) or the dataset's weight",
                    ds.describe(),
                    ds.len()
                )));
            }
        }
        Ok(blend)
    }

    /// Samples the blend draws from each of its datasets.
    pub fn drawn(&self) -> Vec<usize> {
        let mut drawn = vec![0usize; self.datasets.len()];
        for &d in &self.dataset_index {
            drawn[d as usize] += 1;
        }
        drawn
    }

    /// The blend's two indexes as Megatron's int16 and int64 arrays, for the cache.
    pub fn to_arrays(&self) -> [(&'static str, Array); 2] {
        let n = vec![self.len()];
        [
            ("dataset_index", Array::I16(n.clone(), self.dataset_index.iter().map(|&d| d as i16).collect())),
            ("dataset_sample_index", Array::I64(n, self.sample_index.iter().map(|&s| s as i64).collect())),
        ]
    }

    /// The blend from cached indexes, checked against its datasets.
    pub fn from_arrays(datasets: Vec<GptDataset>, arrays: &[(std::path::PathBuf, Array)]) -> Result<BlendedDataset> {
        let [(dataset_path, dataset), (sample_path, sample)] = arrays else {
            return Err(Error::Config(format!("{} cached arrays for a blend, not 2", arrays.len())));
        };
        let (which, samples) = (dataset.values(), sample.values());
        if which.len() != samples.len() {
            return Err(stale(
                sample_path,
                format!("{} entries beside {} in {}", samples.len(), which.len(), dataset_path.display()),
            ));
        }
        let mut dataset_index = Vec::with_capacity(which.len());
        let mut sample_index = Vec::with_capacity(which.len());
        for (&d, &k) in which.iter().zip(&samples) {
            let Some(ds) = usize::try_from(d).ok().and_then(|d| datasets.get(d)) else {
                return Err(stale(dataset_path, format!("dataset {d} of a blend of {}", datasets.len())));
            };
            if !usize::try_from(k).is_ok_and(|k| k < ds.len()) {
                return Err(stale(sample_path, format!("sample {k} of {}, which has {}", ds.describe(), ds.len())));
            }
            dataset_index.push(d as u16);
            sample_index.push(k as u64);
        }
        Ok(BlendedDataset { datasets, dataset_index, sample_index })
    }

    pub fn len(&self) -> usize {
        self.dataset_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dataset_index.is_empty()
    }

    /// Which dataset, and which of its samples (a position in its shuffle), blend sample `i` is.
    fn index(&self, i: usize) -> (usize, usize) {
        (self.dataset_index[i] as usize, self.sample_index[i] as usize)
    }

    /// Fills `out` with blend sample `i % len()` (as `GptDataset::get`).
    pub fn get(&self, i: usize, out: &mut [u32]) -> Result<()> {
        let (d, sample) = self.index(i % self.len().max(1));
        self.datasets[d].get(sample, out)
    }

    pub fn datasets(&self) -> &[GptDataset] {
        &self.datasets
    }
}

/// megatron-core's `build_blending_indices`: the error of dataset k at sample i is
/// `weights[k] · max(i, 1) − drawn[k]`; the sample goes to the largest error.
fn blending_indices(weights: &[f64], size: usize) -> (Vec<u16>, Vec<u64>) {
    let mut drawn = vec![0u64; weights.len()];
    let mut dataset_index = Vec::with_capacity(size);
    let mut sample_index = Vec::with_capacity(size);
    for i in 0..size {
        let at = (i as f64).max(1.0);
        let mut best = 0;
        let mut best_error = weights[0] * at - drawn[0] as f64;
        for (k, &w) in weights.iter().enumerate().skip(1) {
            let error = w * at - drawn[k] as f64;
            if error > best_error {
                best_error = error;
                best = k;
            }
        }
        dataset_index.push(best as u16);
        sample_index.push(drawn[best]);
        drawn[best] += 1;
    }
    (dataset_index, sample_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_blends_as_megatron() {
        let b = Blend::parse("--data-path", &strings(&["a"])).unwrap();
        assert_eq!((b.prefixes, b.weights), (vec![PathBuf::from("a")], None));
        let b = Blend::parse("--data-path", &strings(&["30", "a", "70", "b"])).unwrap();
        assert_eq!(b.prefixes, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(b.weights, Some(vec![30.0, 70.0]));
        // Two prefixes and no numbers: no weights.
        let b = Blend::parse("--data-path", &strings(&["a", "b"])).unwrap();
        assert_eq!((b.prefixes.len(), b.weights), (2, None));
        for bad in [&["0", "a", "1", "b"][..], &["x", "a", "1", "b"], &["-1", "a", "2", "b"], &[]] {
            let err = Blend::parse("--data-path", &strings(bad)).unwrap_err().to_string();
            assert!(err.starts_with("flag --data-path"), "{bad:?}: {err}");
        }
    }

    // numpy 2.4.6: np.sum of these arrays; for the long one the pairwise sum differs from a
    // left fold in the last bits.
    #[test]
    fn sums_as_numpy() {
        assert_eq!(numpy_sum(&[0.1, 0.2, 0.3]), 0.6000000000000001);
        let tenths: Vec<f64> = (1..=9).map(|i| i as f64 / 10.0).collect();
        assert_eq!(numpy_sum(&tenths), 4.5);
        let many: Vec<f64> = (0..300).map(|i| 1.0 / (i as f64 + 3.0)).collect();
        assert_eq!(numpy_sum(&many), 4.789297397713862);
        assert_eq!(many.iter().sum::<f64>(), 4.789297397713856);
    }

    // megatron-core 0.16.1: _get_size_per_split_per_dataset(normalize([0.3, 0.7]), [1000, 96, 32],
    // surplus=0.005) and helpers.build_blending_indices(normalize([1, 2, 3]), size=12).
    #[test]
    fn sizes_and_blending_match_megatron() {
        let w = normalize(&[0.3, 0.7]);
        assert_eq!(samples_per_dataset(&w, [1000, 96, 32], 0.005), [[302, 30, 11], [704, 69, 24]]);
        assert_eq!(samples_per_dataset(&w, [1000, 96, 32], 0.0), [[300, 29, 10], [700, 68, 23]]);
        let (d, s) = blending_indices(&normalize(&[1.0, 2.0, 3.0]), 12);
        assert_eq!(d, [2, 1, 0, 2, 1, 2, 0, 2, 1, 2, 1, 2]);
        assert_eq!(s, [0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 3, 5]);
    }
}
