//! Dropout masks as a pure function of where an element sits. Whether dropout keeps an element is
//! decided by one word of a Philox-4x32-10 block whose key is the run's seed and whose counter is
//! (the element's index / 4, the place, the iteration); the index is the element's position in
//! the whole iteration's tensor at that place (every micro-batch of every data-parallel rank, all
//! positions, all columns or heads), so every layout, and a recomputed or resumed forward, draws
//! the masks one rank would. The generic row kernels here are what every backend computes
//! (`kernels/common/dropout.h` on the GPUs, line for line).

use crate::real::Real;
use crate::rng::philox4x32;

/// Where in a layer a dropout sits (the counter's place word is `4 · layer + site`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// The embeddings' sum, before the first layer (layer 0's word).
    Embedding = 0,
    /// The attention probabilities.
    Attention = 1,
    /// The attention block's projection, before its residual add.
    AttentionOut = 2,
    /// The MLP's output, before its residual add.
    MlpOut = 3,
}

/// One dropout call: its probability, its Philox key and counter words, and how this buffer's
/// elements map to indices of the whole iteration's tensor. Rows are sequence-first (`t · batch +
/// b`). For the hidden sites, element (row, c) has index `((sample0 + b) · seq + t0 + t) · width +
/// col0 + c` (with `jump`, positions t ≥ at are `by` further on: a context-parallel rank's
/// second chunk); for the attention probabilities, (sequence b, head h, query q, key k) has index
/// `(((sample0 + b) · width + col0 + h) · seq + q) · seq + k` (`width` counts heads there).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping an element, in (0, 1).
    pub p: f32,
    pub key: [u32; 2],
    /// `4 · layer + site`, the layer counted over the whole model.
    pub place: u32,
    pub iteration: u32,
    /// The first sample of this buffer in the iteration's global batch.
    pub sample0: u64,
    /// Samples in this buffer (the `b` of a row).
    pub batch: usize,
    /// Positions of a whole sequence, and the first one this buffer holds.
    pub seq: usize,
    pub t0: usize,
    /// Columns (or heads) of the whole tensor, and the first one this buffer holds.
    pub width: usize,
    pub col0: usize,
    /// `(at, by)`: the buffer's positions from `at` on sit `by` further along the sequence.
    pub jump: Option<(usize, usize)>,
}

impl Dropout {
    /// An element survives when its word is at least this: `round(p · 2³²)`.
    pub fn threshold(&self) -> u32 {
        (self.p as f64 * 4_294_967_296.0).round().min(u32::MAX as f64) as u32
    }

    /// What a kept element is multiplied by, `1 / (1 - p)` rounded to f32.
    pub fn scale(&self) -> f32 {
        (1.0 / (1.0 - self.p as f64)) as f32
    }

    /// The Philox block holding the words of indices `4 · block .. 4 · block + 3`.
    pub fn block(&self, block: u64) -> [u32; 4] {
        philox4x32([block as u32, (block >> 32) as u32, self.place, self.iteration], self.key)
    }

    /// Whether the element of index `index` is kept.
    pub fn keeps(&self, index: u64) -> bool {
        self.block(index >> 2)[(index & 3) as usize] >= self.threshold()
    }

    /// The index of element (row, column) of a hidden-site buffer (rows `t · batch + b`).
    pub fn hidden_index(&self, row: usize, col: usize) -> u64 {
        let (t, b) = (row / self.batch, row % self.batch);
        let t = match self.jump {
            Some((at, by)) if t >= at => t + by,
            _ => t,
        };
        ((self.sample0 + b as u64) * self.seq as u64 + (self.t0 + t) as u64) * self.width as u64
            + (self.col0 + col) as u64
    }

    /// The index of the first key's probability of (sequence b, head h, query q).
    pub fn attention_index(&self, b: usize, head: usize, q: usize) -> u64 {
        let s = self.seq as u64;
        (((self.sample0 + b as u64) * self.width as u64 + (self.col0 + head) as u64) * s + q as u64) * s
    }
}

/// The mask of a run of consecutive indices, one Philox block per four of them.
pub struct Masks<'a> {
    d: &'a Dropout,
    threshold: u32,
    block: u64,
    words: [u32; 4],
}

impl<'a> Masks<'a> {
    pub fn new(d: &'a Dropout) -> Masks<'a> {
        Masks { d, threshold: d.threshold(), block: u64::MAX, words: [0; 4] }
    }

    /// Whether index `index` is kept, reusing the last block drawn.
    #[inline]
    pub fn keeps(&mut self, index: u64) -> bool {
        if index >> 2 != self.block {
            self.block = index >> 2;
            self.words = self.d.block(self.block);
        }
        self.words[(index & 3) as usize] >= self.threshold
    }

    /// Calls `f(j, kept)` for the indices `first ..` of `n` elements, a Philox block per four.
    #[inline]
    fn each(&mut self, first: u64, n: usize, mut f: impl FnMut(usize, bool)) {
        let mut j = 0;
        while j < n {
            let index = first + j as u64;
            let (block, word) = (index >> 2, (index & 3) as usize);
            if block != self.block {
                self.block = block;
                self.words = self.d.block(block);
            }
            let run = (4 - word).min(n - j);
            for k in 0..run {
                f(j + k, self.words[word + k] >= self.threshold);
            }
            j += run;
        }
    }

    /// `keep[j]` = whether index `first + j` is kept.
    pub fn fill(&mut self, keep: &mut [bool], first: u64) {
        self.each(first, keep.len(), |j, kept| keep[j] = kept);
    }

    /// `row[j] = kept(first + j) ? row[j] · scale : 0`.
    pub fn apply<R: Real>(&mut self, row: &mut [R], first: u64, scale: R) {
        self.each(first, row.len(), |j, kept| row[j] = if kept { row[j] * scale } else { R::ZERO });
    }
}

/// `row[j] = keep[j] ? row[j] · scale : 0` (a mask `Masks::fill` drew, applied again).
pub fn apply_kept<R: Real>(row: &mut [R], keep: &[bool], scale: R) {
    for (x, &kept) in row.iter_mut().zip(keep) {
        *x = if kept { *x * scale } else { R::ZERO };
    }
}

/// `out = resid + mask ∘ (x + bias) · scale` over the rows `row0 ..` of a hidden-site buffer
/// (`out`, `resid` and `x` hold those rows, `cols` wide). Megatron's bias-dropout-add.
pub fn bias_dropout_add_rows<R: Real>(
    out: &mut [R],
    (resid, x): (&[R], &[R]),
    bias: Option<&[R]>,
    d: &Dropout,
    row0: usize,
    cols: usize,
) {
    let (mut masks, scale) = (Masks::new(d), R::from_f64(d.scale() as f64));
    for (r, ((o, res), xs)) in
        out.chunks_exact_mut(cols).zip(resid.chunks_exact(cols)).zip(x.chunks_exact(cols)).enumerate()
    {
        let first = d.hidden_index(row0 + r, 0);
        for c in 0..cols {
            let v = match bias {
                Some(b) => xs[c] + b[c],
                None => xs[c],
            };
            o[c] = if masks.keeps(first + c as u64) { res[c] + v * scale } else { res[c] };
        }
    }
}

/// `x = mask ∘ x · scale` in place over the rows `row0 ..` of a hidden-site buffer: the
/// embeddings' dropout, and every hidden dropout's backward.
pub fn dropout_rows<R: Real>(x: &mut [R], d: &Dropout, row0: usize, cols: usize) {
    let (mut masks, scale) = (Masks::new(d), R::from_f64(d.scale() as f64));
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        masks.apply(row, d.hidden_index(row0 + r, 0), scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(p: f32) -> Dropout {
        Dropout {
            p,
            key: [7, 9],
            place: 4 * 3 + 2,
            iteration: 5,
            sample0: 0,
            batch: 2,
            seq: 8,
            t0: 0,
            width: 16,
            col0: 0,
            jump: None,
        }
    }

    #[test]
    fn the_kept_fraction_is_one_minus_p_and_the_masks_depend_on_every_key_word() {
        let d = site(0.1);
        let n = 400_000u64;
        let kept = (0..n).filter(|&i| d.keeps(i)).count() as f64 / n as f64;
        assert!((kept - 0.9).abs() < 0.003, "kept {kept}");
        let differs = |e: Dropout| (0..256).any(|i| e.keeps(i) != d.keeps(i));
        assert!(differs(Dropout { key: [8, 9], ..d }));
        assert!(differs(Dropout { place: d.place + 1, ..d }));
        assert!(differs(Dropout { iteration: 6, ..d }));
        assert_eq!(Dropout { p: 0.5, ..d }.scale(), 2.0);
    }

    #[test]
    fn a_shard_draws_the_whole_tensors_masks() {
        // One buffer of 2 samples x 8 positions x 16 columns against its shards by position
        // (sequence parallelism), by column (SUMMA) and by sample (data parallelism).
        let whole = site(0.3);
        let cols = 16;
        let x: Vec<f64> = (0..16 * cols).map(|i| 1.0 + i as f64).collect();
        let mut full = x.clone();
        dropout_rows(&mut full, &whole, 0, cols);
        assert!(full.contains(&0.0) && full.iter().any(|&v| v != 0.0));
        let at = |t: usize, b: usize, c: usize| full[(t * 2 + b) * cols + c];
        // Positions 4..8 on a second rank.
        let mut part: Vec<f64> = (4..8)
            .flat_map(|t| (0..2).flat_map(move |b| (0..cols).map(move |c| (t, b, c))))
            .map(|(t, b, c)| x[(t * 2 + b) * cols + c])
            .collect();
        dropout_rows(&mut part, &Dropout { t0: 4, ..whole }, 0, cols);
        for (i, &v) in part.iter().enumerate() {
            let (r, c) = (i / cols, i % cols);
            assert_eq!(v, at(4 + r / 2, r % 2, c));
        }
        // Columns 8..16 of sample 1 alone.
        let mut part: Vec<f64> =
            (0..8).flat_map(|t| (8..16).map(move |c| (t, c))).map(|(t, c)| x[(t * 2 + 1) * cols + c]).collect();
        dropout_rows(&mut part, &Dropout { sample0: 1, batch: 1, col0: 8, ..whole }, 0, 8);
        for (i, &v) in part.iter().enumerate() {
            assert_eq!(v, at(i / 8, 1, 8 + i % 8));
        }
    }

    #[test]
    fn fill_and_apply_draw_what_keeps_draws() {
        let d = site(0.4);
        for first in [0u64, 1, 3, 7, 1 << 33] {
            let mut keep = vec![false; 23];
            Masks::new(&d).fill(&mut keep, first);
            let mut row = vec![2.0f64; 23];
            Masks::new(&d).apply(&mut row, first, 3.0);
            for (j, (&k, &x)) in keep.iter().zip(&row).enumerate() {
                assert_eq!(k, d.keeps(first + j as u64));
                assert_eq!(x, if k { 6.0 } else { 0.0 });
            }
        }
    }

    #[test]
    fn bias_dropout_add_keeps_the_residual_where_it_drops() {
        let d = site(0.5);
        let (resid, x, bias) = (vec![1.0f64; 4 * 16], vec![2.0f64; 4 * 16], vec![0.5f64; 16]);
        let mut out = vec![0.0; 4 * 16];
        bias_dropout_add_rows(&mut out, (&resid, &x), Some(&bias), &d, 3, 16);
        for (i, &o) in out.iter().enumerate() {
            let kept = d.keeps(d.hidden_index(3 + i / 16, i % 16));
            assert_eq!(o, if kept { 1.0 + 2.5 * 2.0 } else { 1.0 });
        }
    }
}
