//! Named parameter tensors on a device: shape, storage, and the rule that makes every element a
//! pure function of (seed, name, index) so any later sharding reproduces the same values.

use crate::device::Device;
use crate::rng::Stream;
use std::ops::Range;

/// How a parameter is initialised (Megatron's rules) and whether weight decay applies to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// N(0, std): weights and embeddings, decayed.
    Normal { std: f64 },
    /// Constant (LayerNorm scale 1, biases and LayerNorm shift 0), not decayed.
    Constant(f32),
}

/// How a tensor-parallel parameter is split: along `dim` of its full shape into `parts` equal
/// contiguous pieces, of which this rank holds piece `rank`; or, with `chunks` > 1, the dimension
/// is first cut into `chunks` equal blocks and each block split so (SwiGLU's fc1: every rank
/// holds its share of the gate rows, then of the up rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub dim: usize,
    pub rank: usize,
    pub parts: usize,
    pub chunks: usize,
}

/// What the model and optimizer know about a parameter besides its storage.
#[derive(Clone, Debug)]
pub struct ParamInfo {
    pub name: String,
    /// This rank's shape (the full shape divided along the partition dimension).
    pub shape: Vec<usize>,
    pub full_shape: Vec<usize>,
    pub init: Init,
    /// None for parameters every tensor-parallel rank holds whole (LayerNorm, row-parallel
    /// biases, position embedding).
    pub partition: Option<Partition>,
    /// A second split along another dimension (2-D tensor parallelism's blocks of a matrix).
    pub partition2: Option<Partition>,
    /// Under sequence parallelism this replicated parameter's gradient is computed from this
    /// rank's sequence shard only, and must be summed over the tensor-parallel group.
    pub sequence_parallel: bool,
    /// The last pipeline stage's copy of the word embedding (the tied output layer): kept equal
    /// to the first stage's by summing the two gradients, and counted once in the norm.
    pub tied_copy: bool,
}

impl ParamInfo {
    /// A parameter held whole by every rank.
    pub fn replicated(name: String, shape: Vec<usize>, init: Init) -> ParamInfo {
        ParamInfo {
            name,
            full_shape: shape.clone(),
            shape,
            init,
            partition: None,
            partition2: None,
            sequence_parallel: false,
            tied_copy: false,
        }
    }

    /// A parameter split along `dim` over `parts` ranks, of which this is `rank`.
    pub fn split(name: String, full_shape: Vec<usize>, init: Init, dim: usize, rank: usize, parts: usize) -> ParamInfo {
        ParamInfo::split_chunks(name, full_shape, init, dim, (rank, parts), 1)
    }

    /// A parameter whose dimension `dim` is `chunks` blocks, each split over `parts` ranks
    /// (`Partition`); this rank's shard holds its piece of every block, in block order.
    pub fn split_chunks(
        name: String,
        full_shape: Vec<usize>,
        init: Init,
        dim: usize,
        (rank, parts): (usize, usize),
        chunks: usize,
    ) -> ParamInfo {
        let mut shape = full_shape.clone();
        assert!(
            shape[dim].is_multiple_of(parts * chunks),
            "{name}: dimension {dim} of {full_shape:?} does not split {parts} ways in {chunks} blocks"
        );
        shape[dim] /= parts;
        let partition = (parts > 1).then_some(Partition { dim, rank, parts, chunks });
        ParamInfo {
            name,
            shape,
            full_shape,
            init,
            partition,
            partition2: None,
            sequence_parallel: false,
            tied_copy: false,
        }
    }

    /// A matrix split into a grid of blocks: `(rank, parts)` along dimension 0 and along
    /// dimension 1 (2-D tensor parallelism).
    pub fn block(
        name: String,
        full_shape: Vec<usize>,
        init: Init,
        (r0, p0): (usize, usize),
        (r1, p1): (usize, usize),
    ) -> ParamInfo {
        let mut info = ParamInfo::split(name, full_shape, init, 0, r0, p0);
        assert!(
            info.shape[1].is_multiple_of(p1),
            "{}: dimension 1 of {:?} does not split {p1} ways",
            info.name,
            info.full_shape
        );
        info.shape[1] /= p1;
        info.partition2 = (p1 > 1).then_some(Partition { dim: 1, rank: r1, parts: p1, chunks: 1 });
        info
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The index in the full tensor of this shard's element `local`.
    pub fn global_index(&self, local: usize) -> usize {
        match (self.partition, self.partition2) {
            (None, None) => local,
            (Some(p), None) => {
                // Row-major: split the local index at the partition dimension, offset that coordinate.
                let inner: usize = self.shape[p.dim + 1..].iter().product();
                let (outer, rest) = (local / (self.shape[p.dim] * inner), local % (self.shape[p.dim] * inner));
                let (coord, inner_index) = (rest / inner, rest % inner);
                // The piece of block `coord / per_block` this rank holds.
                let per_block = self.shape[p.dim] / p.chunks;
                let (block, within) = (coord / per_block, coord % per_block);
                let global_coord = block * per_block * p.parts + p.rank * per_block + within;
                (outer * self.full_shape[p.dim] + global_coord) * inner + inner_index
            }
            (p0, p1) => {
                // A block of a matrix: offset both coordinates.
                let (r, c) = (local / self.shape[1], local % self.shape[1]);
                let off =
                    |p: Option<Partition>, d: usize| p.filter(|p| p.dim == d).map_or(0, |p| p.rank * self.shape[d]);
                let (r, c) = (r + off(p0, 0) + off(p1, 0), c + off(p0, 1) + off(p1, 1));
                r * self.full_shape[1] + c
            }
        }
    }

    /// Whether this rank's gradient counts in the global norm (Megatron's rule, each parameter
    /// once): a tensor-parallel shard on every rank, a parameter every rank holds whole on
    /// tensor-parallel rank 0 only, the tied output-layer copy not at all.
    pub fn counted_in_norm(&self, tp_rank: usize) -> bool {
        !self.tied_copy && (self.partition.is_some() || tp_rank == 0)
    }

    /// Whether `--decoupled-lr` sets this parameter's rate: the word embedding (and its tied copy)
    /// and the output layer, as Megatron marks them (`is_embedding_or_output_parameter`; not the
    /// position embedding).
    pub fn embedding_or_output(&self) -> bool {
        self.name == "embedding.word_embeddings.weight" || self.name == "output_layer.weight"
    }

    /// Weight decay applies to matrices and embeddings, not to biases or LayerNorm parameters.
    pub fn decayed(&self) -> bool {
        matches!(self.init, Init::Normal { .. })
    }

    /// Initial values of this rank's elements `range`, under `seed`. The stream is keyed by the
    /// parameter's name and indexed by the element's position in the full tensor, so a shard
    /// holds exactly the values the unsharded tensor has there.
    pub fn initial_values(&self, seed: u64, range: std::ops::Range<usize>) -> Vec<f32> {
        match self.init {
            Init::Constant(c) => vec![c; range.len()],
            Init::Normal { std } => {
                let stream = Stream::new(seed, &self.name, 0);
                range.map(|i| (std * stream.normal(self.global_index(i) as u64)) as f32).collect()
            }
        }
    }

    /// `initial_values(seed, 0..numel)` computed by up to `threads` threads, each filling one
    /// contiguous part. Every element is a pure function of its index, so the values do not
    /// depend on the thread count; the normal draws (a Philox block, a logarithm and a cosine
    /// each) are what makes a large model's start slow on one thread.
    pub fn initial_values_on(&self, seed: u64, threads: usize) -> Vec<f32> {
        let numel = self.numel();
        let part = numel.div_ceil(threads.max(1)).max(INIT_ELEMS_PER_THREAD);
        if numel <= part || matches!(self.init, Init::Constant(_)) {
            return self.initial_values(seed, 0..numel);
        }
        let mut values = vec![0.0f32; numel];
        std::thread::scope(|scope| {
            for (i, out) in values.chunks_mut(part).enumerate() {
                let start = i * part;
                scope.spawn(move || out.copy_from_slice(&self.initial_values(seed, start..start + out.len())));
            }
        });
        values
    }
}

/// The least work worth a thread of `initial_values_on` (about a millisecond of draws).
const INIT_ELEMS_PER_THREAD: usize = 1 << 14;

/// Parameter values and their gradients, in parallel arrays indexed like `info`, so that one
/// parameter's gradient can be borrowed mutably while others' values are read. A gradient may be
/// released between uses (`free_grads`, ZeRO-2) and is then made again, zeroed, before backward
/// next adds into it (`ensure_grads`).
pub struct ParamSet<D: Device> {
    pub info: Vec<ParamInfo>,
    pub values: Vec<D::Buf>,
    pub grads: Vec<D::Buf>,
    /// The most bytes of gradients held at once since `ensure_grads` first made one again, with
    /// `outside`: gradient bytes held elsewhere now (ZeRO-2's packed copies in flight).
    peak_grad_bytes: usize,
    outside: usize,
}

impl<D: Device> ParamSet<D> {
    /// Allocates and initialises every parameter on `dev`.
    pub fn new(dev: &D, info: Vec<ParamInfo>, seed: u64) -> ParamSet<D> {
        let mut values = Vec::with_capacity(info.len());
        let mut grads = Vec::with_capacity(info.len());
        for p in &info {
            let mut v = dev.alloc(p.numel());
            dev.upload(&mut v, &p.initial_values_on(seed, dev.host_threads()));
            values.push(v);
            grads.push(dev.alloc(p.numel()));
        }
        ParamSet { info, values, grads, peak_grad_bytes: 0, outside: 0 }
    }

    /// Makes again, zeroed, the gradients of `range` that `free_grads` released, before backward
    /// adds into them; a no-op for gradients held.
    pub fn ensure_grads(&mut self, dev: &D, range: Range<usize>) {
        let mut made = false;
        for i in range {
            if dev.len(&self.grads[i]) == 0 {
                self.grads[i] = dev.alloc(self.info[i].numel());
                made = true;
            }
        }
        if made {
            self.peak_grad_bytes = self.peak_grad_bytes.max(self.grad_bytes(dev) + self.outside);
        }
    }

    /// Records `bytes` of this set's gradients held outside it now (packed for a collective), so
    /// that the peak counts them beside the gradients held.
    pub fn held_outside(&mut self, dev: &D, bytes: usize) {
        self.outside = bytes;
        self.peak_grad_bytes = self.peak_grad_bytes.max(self.grad_bytes(dev) + bytes);
    }

    /// Releases the gradients of `range` (their sums went elsewhere: ZeRO-2's shard).
    pub fn free_grads(&mut self, dev: &D, range: Range<usize>) {
        for i in range {
            self.grads[i] = dev.alloc(0);
        }
    }

    /// Bytes of the gradients held now.
    pub fn grad_bytes(&self, dev: &D) -> usize {
        self.grads.iter().map(|g| 4 * dev.len(g)).sum()
    }

    /// The most bytes of gradients held at once: all of them, unless some were released and
    /// made again since (then the peak of those moments, with those held outside the set).
    pub fn peak_grad_bytes(&self, dev: &D) -> usize {
        self.peak_grad_bytes.max(self.grad_bytes(dev))
    }

    pub fn zero_grads(&mut self, dev: &D) {
        dev.zero_buffers(self.grads.iter_mut().collect());
    }

    pub fn num_elements(&self) -> usize {
        self.info.iter().map(ParamInfo::numel).sum()
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.info.iter().position(|p| p.name == name)
    }
}

/// Two distinct elements of a slice, both mutable.
pub fn pair_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert!(i < j, "pair_mut needs i < j");
    let (head, tail) = v.split_at_mut(j);
    (&mut head[i], &mut tail[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_hold_exactly_the_full_tensors_values() {
        let init = Init::Normal { std: 1.0 };
        let full = ParamInfo::replicated("w".into(), vec![4, 6], init);
        let all = full.initial_values(9, 0..24);
        for dim in 0..2 {
            let parts = [2, 3][dim];
            for rank in 0..parts {
                let shard = ParamInfo::split("w".into(), vec![4, 6], init, dim, rank, parts);
                let vals = shard.initial_values(9, 0..shard.numel());
                for (local, v) in vals.iter().enumerate() {
                    let (r, c) = (local / shard.shape[1], local % shard.shape[1]);
                    let (gr, gc) =
                        if dim == 0 { (rank * shard.shape[0] + r, c) } else { (r, rank * shard.shape[1] + c) };
                    assert_eq!(*v, all[gr * 6 + gc], "dim {dim} rank {rank} element {local}");
                }
            }
        }
        // Any thread count gives the same values (a part per thread, and parts smaller than
        // the least a thread takes).
        let big = ParamInfo::split("w".into(), vec![96, 1024], init, 1, 1, 2);
        let serial = big.initial_values(9, 0..big.numel());
        for threads in [1, 2, 3, 7] {
            assert_eq!(big.initial_values_on(9, threads), serial, "{threads} threads");
        }
        assert_eq!(full.initial_values_on(9, 4), all);
        // Blocks of a 2 x 3 grid.
        for (r0, r1) in [(0, 0), (1, 2), (0, 1)] {
            let shard = ParamInfo::block("w".into(), vec![4, 6], init, (r0, 2), (r1, 3));
            assert_eq!(shard.shape, vec![2, 2]);
            let vals = shard.initial_values(9, 0..shard.numel());
            for (local, v) in vals.iter().enumerate() {
                let (r, c) = (r0 * 2 + local / 2, r1 * 2 + local % 2);
                assert_eq!(*v, all[r * 6 + c], "block ({r0}, {r1}) element {local}");
            }
        }
    }
}
