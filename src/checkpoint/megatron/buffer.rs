//! megatron-core's gradient buffer, whose layout its distributed optimizer saves its state in:
//! a model chunk's parameters in the reverse of the order the model registered them, each from a
//! multiple of 64 elements, cut into buckets. Under a pipeline a tied embedding (and its
//! last-stage copy) has a bucket of its own; otherwise a bucket ends once it holds the bucket
//! size (`--ddp-bucket-size`, set where gradients are reduced during the backward pass).
//! Two registration orders are known: megatron-core's local layers (the input norm, the
//! attention projection, then QKV) and Transformer Engine's (the projection, then the norm fused
//! into QKV); the readers take the one whose master weights equal the saved weights.

use super::split_layer;
use crate::model::{GptConfig, ModelParallel};
use crate::tensor::ParamInfo;
use std::collections::BTreeMap;

/// The states a buffer holds under megatron-core's names, and trident's.
pub const STATES: [(&str, &str); 3] = [("param", "param"), ("exp_avg", "adam_m"), ("exp_avg_sq", "adam_v")];

/// AdamW's state read from the buffers: full tensors under trident's prefixes, and the step.
pub struct Mapped {
    pub tensors: BTreeMap<String, Vec<f32>>,
    pub step: u64,
}

/// Whether megatron-core gives `p` a bucket of its own: the tied embedding (and its last-stage
/// copy) under a pipeline of `pp` stages.
pub fn shared_embedding(model: &GptConfig, pp: usize) -> impl Fn(&ParamInfo) -> bool + Copy + '_ {
    move |p: &ParamInfo| !model.arch.untie_embeddings && pp > 1 && p.name == "embedding.word_embeddings.weight"
}

/// One state's full tensors, filled from the ranks' buffers, every element once.
pub struct Gather(BTreeMap<String, (Vec<f32>, usize)>);

impl Gather {
    pub fn new(model: &GptConfig) -> Gather {
        let params = model.parameters(&ModelParallel::single());
        Gather(params.into_iter().map(|p| (p.name, (vec![0.0; p.full_shape.iter().product()], 0))).collect())
    }

    /// Places `p`'s values, `data[at..]`, where tensor-parallel rank `tp_rank` holds them: a
    /// replicated parameter's from rank 0 only, the tied embedding's from the first stage only
    /// (where megatron-core saves their weights). False where `data` is too short.
    pub fn put(&mut self, p: &ParamInfo, tp_rank: usize, data: &[f32], at: usize) -> bool {
        if p.tied_copy || (p.partition.is_none() && p.partition2.is_none() && tp_rank > 0) {
            return true;
        }
        let (Some((values, filled)), Some(local)) = (self.0.get_mut(&p.name), data.get(at..at + p.numel())) else {
            return false;
        };
        for (i, &v) in local.iter().enumerate() {
            values[p.global_index(i)] = v;
        }
        *filled += local.len();
        true
    }

    /// The full tensors under `prefix/`; None where an element was not placed exactly once.
    pub fn finish(self, prefix: &str) -> Option<BTreeMap<String, Vec<f32>>> {
        let whole = self.0.values().all(|(values, filled)| *filled == values.len());
        whole.then(|| self.0.into_iter().map(|(name, (values, _))| (format!("{prefix}/{name}"), values)).collect())
    }
}

/// Where a parameter's module registers it in a layer: megatron-core's local layers register
/// the input norm, the attention projection, then QKV; Transformer Engine's fuse the norm into
/// QKV, registered after the projection. Weights come before biases within each.
fn slot(suffix: &str, te: bool) -> u8 {
    let modules = ["input_layernorm", "self_attention.linear_proj", "self_attention.linear_qkv"];
    match modules.iter().position(|m| suffix.starts_with(m)) {
        Some(0) => te as u8,
        Some(1) => !te as u8,
        Some(2) => 2,
        _ if suffix.starts_with("pre_mlp_layernorm") => 3,
        _ if suffix.starts_with("mlp.linear_fc1") => 4,
        _ => 5,
    }
}

/// `params` (trident's order) in the order megatron-core's model registers them: the
/// embeddings, the layers (each as `slot` orders it), the final norm, the output layer.
pub fn registration(params: Vec<ParamInfo>, te: bool) -> Vec<ParamInfo> {
    let mut keyed: Vec<_> = params
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let key = match split_layer(&p.name) {
                (Some(l), suffix) => (1, l, slot(suffix, te)),
                (None, name) if name.starts_with("embedding.") && !p.tied_copy => (0, 0, 0),
                _ => (2, 0, 0),
            };
            (key, i, p)
        })
        .collect();
    keyed.sort_by_key(|(key, i, _)| (*key, *i));
    keyed.into_iter().map(|(_, _, p)| p).collect()
}

/// Each parameter's (bucket, offset) in megatron-core's gradient buffer, laid out from the last
/// registered: every start rounded up to 64 elements; a bucket closes where its saved length
/// (`sizes`) is reached, and around a `shared` parameter (before it at its padded start, after
/// it at its end). None where the lengths do not fit this layout.
pub fn place(
    params: &[ParamInfo],
    shared: impl Fn(&ParamInfo) -> bool,
    sizes: &[usize],
) -> Option<Vec<(usize, usize)>> {
    let mut out = vec![(0, 0); params.len()];
    let (mut bucket, mut at, mut held) = (0usize, 0usize, 0usize);
    for (i, p) in params.iter().enumerate().rev() {
        at = at.next_multiple_of(64);
        if shared(p) && held > 0 {
            if sizes.get(bucket) != Some(&at) {
                return None;
            }
            (bucket, at, held) = (bucket + 1, 0, 0);
        }
        out[i] = (bucket, at);
        at += p.numel();
        held += 1;
        let size = *sizes.get(bucket)?;
        if at > size || (shared(p) && at != size) {
            return None;
        }
        if at == size {
            (bucket, at, held) = (bucket + 1, 0, 0);
        }
    }
    (held == 0 && bucket == sizes.len()).then_some(out)
}

/// Whether the master weight `master` is the saved weight `saved`, or its bf16 or fp16 copy
/// (an fp16 subnormal within its spacing, 2^-24).
pub fn same_weight(master: f32, saved: f32) -> bool {
    (master - saved).abs() <= master.abs() / 256.0 + 2f32.powi(-24)
}

/// Each parameter's offset where a buffer's buckets were saved one after another, each without
/// its end padding (the legacy format's `distrib_optim.pt`): a parameter starts at the previous
/// one's end rounded up to 64 (the same bucket), or at that end unrounded (a new bucket; always
/// after a `shared` parameter), whichever `fits` (its master weights there equal its weights),
/// the rounded first. None where neither fits or the offsets do not end at `total`.
pub fn place_coalesced(
    params: &[ParamInfo],
    shared: impl Fn(&ParamInfo) -> bool,
    total: usize,
    fits: impl Fn(usize, usize) -> bool,
) -> Option<Vec<usize>> {
    let mut out = vec![0; params.len()];
    let (mut end, mut new_bucket) = (0usize, true);
    for (i, p) in params.iter().enumerate().rev() {
        let rounded = end.next_multiple_of(64);
        let start = [rounded, end].into_iter().filter(|&at| at == end || !new_bucket).find(|&at| fits(i, at))?;
        out[i] = start;
        end = start.checked_add(p.numel())?;
        new_bucket = shared(p);
    }
    (end == total).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Init;

    fn params(sizes: &[(&str, usize)]) -> Vec<ParamInfo> {
        sizes.iter().map(|&(n, k)| ParamInfo::replicated(n.into(), vec![k], Init::Constant(0.0))).collect()
    }

    #[test]
    fn buckets_lay_parameters_out_from_the_last_at_multiples_of_64() {
        let p = params(&[("a", 100), ("b", 30), ("c", 64)]);
        let none = |_: &ParamInfo| false;
        // c at 0, b after it, a from 94 rounded up to 128.
        assert_eq!(place(&p, none, &[228]), Some(vec![(0, 128), (0, 64), (0, 0)]));
        // A bucket ends where its saved length is reached.
        assert_eq!(place(&p, none, &[94, 100]), Some(vec![(1, 0), (0, 64), (0, 0)]));
        // Lengths that no parameter ends at, or that leave parameters out, do not fit.
        for sizes in [&[200][..], &[94, 99], &[94], &[228, 1]] {
            assert_eq!(place(&p, none, sizes), None, "{sizes:?}");
        }
    }

    #[test]
    fn a_shared_embedding_has_a_bucket_of_its_own() {
        let p = params(&[("embedding.word_embeddings.weight", 50), ("x", 10), ("y", 64)]);
        let shared = |p: &ParamInfo| p.name.starts_with("embedding.");
        // The bucket before it closes at its padded start (128), or at x's end (74) where a
        // bucket size closed it there.
        assert_eq!(place(&p, shared, &[128, 50]), Some(vec![(1, 0), (0, 64), (0, 0)]));
        assert_eq!(place(&p, shared, &[74, 50]), Some(vec![(1, 0), (0, 64), (0, 0)]));
        assert_eq!(place(&p, shared, &[100, 50]), None);
        assert_eq!(place(&p, shared, &[128, 40, 10]), None);
    }

    #[test]
    fn layers_register_in_megatron_cores_order_or_transformer_engines() {
        let names = [
            "embedding.word_embeddings.weight",
            "decoder.layers.0.input_layernorm.weight",
            "decoder.layers.0.self_attention.linear_qkv.weight",
            "decoder.layers.0.self_attention.linear_proj.weight",
            "decoder.layers.0.pre_mlp_layernorm.weight",
            "decoder.layers.0.mlp.linear_fc1.weight",
            "decoder.layers.0.mlp.linear_fc2.weight",
            "decoder.final_layernorm.weight",
        ];
        let p: Vec<(&str, usize)> = names.iter().map(|&n| (n, 1)).collect();
        let order = |te| registration(params(&p), te).into_iter().map(|p| p.name).collect::<Vec<_>>();
        let at = |i: usize| names[i].to_string();
        assert_eq!(order(false), [0, 1, 3, 2, 4, 5, 6, 7].map(at));
        assert_eq!(order(true), [0, 3, 1, 2, 4, 5, 6, 7].map(at));
    }

    #[test]
    fn master_weights_match_their_bf16_and_fp16_copies_alone() {
        let bf16 = |x: f32| f32::from_bits((crate::checkpoint::megatron::torch_file::bf16_bits(x) as u32) << 16);
        for m in [0.1234567f32, -3.3e-3, 1.0, 7.77e4, 0.0] {
            assert!(same_weight(m, m) && same_weight(m, bf16(m)), "{m}");
            assert!(!same_weight(m, m * 1.01 + 1e-3), "{m}");
        }
        // fp16 rounds 1e-6 to a multiple of its subnormal spacing.
        let spacing = 2f32.powi(-24);
        assert!(same_weight(1e-6, (1e-6 / spacing).round() * spacing));
    }

    #[test]
    fn coalesced_buckets_start_where_the_weights_fit() {
        let p = params(&[("embedding.word_embeddings.weight", 50), ("a", 100), ("b", 30), ("c", 64)]);
        let shared = |p: &ParamInfo| p.name.starts_with("embedding.");
        // c at 0, b at 64; a in b's bucket (at 128) or a new one (at 94), as the weights say; the
        // shared embedding after the bucket closed at its padded start.
        let at = |a_at: usize, e_at: usize| move |i: usize, off: usize| [e_at, a_at, 64, 0][i] == off;
        assert_eq!(place_coalesced(&p, shared, 306, at(128, 256)), Some(vec![256, 128, 64, 0]));
        assert_eq!(place_coalesced(&p, shared, 306, at(94, 256)), Some(vec![256, 94, 64, 0]));
        // Nowhere it fits, or a total the offsets do not reach.
        assert_eq!(place_coalesced(&p, shared, 306, at(100, 256)), None);
        assert_eq!(place_coalesced(&p, shared, 305, at(128, 256)), None);
        // After the shared parameter a new bucket starts at its end, unrounded.
        let q = params(&[("x", 10), ("embedding.word_embeddings.weight", 50)]);
        let fits = |i: usize, off: usize| [50, 0][i] == off;
        assert_eq!(place_coalesced(&q, shared, 60, fits), Some(vec![50, 0]));
    }
}
