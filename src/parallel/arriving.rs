//! Parameters whose values are still on their way: the distributed optimizer's all-gathers of
//! its updated weights through the MPI Comm, started in its step and finished there
//! (`settle_all`) or, under `--overlap-param-gather`, each just before the next forward reads one
//! of its bucket's parameters, or before anything else reads them.

use crate::comm::Pending;
use crate::device::Device;
use crate::tensor::ParamSet;
use std::ops::Range;

/// Buckets of parameters whose all-gathers are in flight: each bucket's parameters, and its
/// all-gather of the padded bucket (every rank's block, in rank order).
#[derive(Default)]
pub struct Arriving {
    buckets: Vec<(Range<usize>, Box<dyn Pending>)>,
}

impl Arriving {
    pub fn push(&mut self, params: Range<usize>, gather: Box<dyn Pending>) {
        self.buckets.push((params, gather));
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Drives every all-gather in flight without waiting.
    pub fn poll(&mut self) {
        for (_, g) in &mut self.buckets {
            g.poll();
        }
    }

    /// Finishes the all-gather of every bucket holding a parameter of `range` and writes those
    /// buckets' values into `set`; returns the parameters written.
    pub fn settle<D: Device>(&mut self, dev: &D, set: &mut ParamSet<D>, range: Range<usize>) -> Vec<Range<usize>> {
        let mut written = Vec::new();
        let mut k = 0;
        while k < self.buckets.len() {
            let params = self.buckets[k].0.clone();
            if params.start < range.end && range.start < params.end {
                let (params, gather) = self.buckets.swap_remove(k);
                let flat = gather.wait();
                let mut offset = 0;
                for i in params.clone() {
                    let n = set.info[i].numel();
                    dev.upload(&mut set.values[i], &flat[offset..offset + n]);
                    offset += n;
                }
                written.push(params);
            } else {
                k += 1;
            }
        }
        written
    }

    /// Finishes every all-gather in flight (`settle` over all parameters).
    pub fn settle_all<D: Device>(&mut self, dev: &D, set: &mut ParamSet<D>) -> Vec<Range<usize>> {
        let all = 0..set.info.len();
        self.settle(dev, set, all)
    }
}
