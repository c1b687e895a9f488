//! Named parameter tensors on a device: shape, storage, and the rule that makes every element a
//! pure function of (seed, name, index) so any later sharding reproduces the same values.

use crate::device::Device;
use crate::rng::Stream;

/// How a parameter is initialised (Megatron's rules) and whether weight decay applies to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// N(0, std): weights and embeddings, decayed.
    Normal { std: f64 },
    /// Constant (LayerNorm scale 1, biases and LayerNorm shift 0), not decayed.
    Constant(f32),
}

/// What the model and optimizer know about a parameter besides its storage.
#[derive(Clone, Debug)]
pub struct ParamInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl ParamInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Weight decay applies to matrices and embeddings, not to biases or LayerNorm parameters.
    pub fn decayed(&self) -> bool {
        matches!(self.init, Init::Normal { .. })
    }

    /// Elements `range` of the full tensor's initial values, under `seed`. The stream is keyed by
    /// the parameter's name and indexed by the element's position in the full tensor, so a shard
    /// computes exactly the values the unsharded tensor has there.
    pub fn initial_values(&self, seed: u64, range: std::ops::Range<usize>) -> Vec<f32> {
        match self.init {
            Init::Constant(c) => vec![c; range.len()],
            Init::Normal { std } => {
                let stream = Stream::new(seed, &self.name, 0);
                range.map(|i| (std * stream.normal(i as u64)) as f32).collect()
            }
        }
    }
}

/// Parameter values and their gradients, in parallel arrays indexed like `info`, so that one
/// parameter's gradient can be borrowed mutably while others' values are read.
pub struct ParamSet<D: Device> {
    pub info: Vec<ParamInfo>,
    pub values: Vec<D::Buf>,
    pub grads: Vec<D::Buf>,
}

impl<D: Device> ParamSet<D> {
    /// Allocates and initialises every parameter on `dev`.
    pub fn new(dev: &D, info: Vec<ParamInfo>, seed: u64) -> ParamSet<D> {
        let mut values = Vec::with_capacity(info.len());
        let mut grads = Vec::with_capacity(info.len());
        for p in &info {
            let mut v = dev.alloc(p.numel());
            dev.upload(&mut v, &p.initial_values(seed, 0..p.numel()));
            values.push(v);
            grads.push(dev.alloc(p.numel()));
        }
        ParamSet { info, values, grads }
    }

    pub fn zero_grads(&mut self, dev: &D) {
        for g in &mut self.grads {
            dev.fill(g, 0.0);
        }
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
