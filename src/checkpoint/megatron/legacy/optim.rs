//! AdamW's state in the legacy format, beside each model-parallel rank's weights, in either
//! of megatron-core's optimizers:
//! - non-distributed: the rank file's `optimizer` is a torch optimizer's state dict (`state` by
//!   parameter index, `param_groups` listing each group's indices), inside `optimizer` with the
//!   f32 master weights in `fp32_from_fp16_params` under bf16 and fp16. megatron-core numbers the
//!   parameters group by group, each group holding in registration order those its `wd_mult`
//!   and `is_decoupled_lr` select (no weight decay for biases and vectors; the decoupled rate
//!   for the embedding and the output layer). The registration order is the one the saved
//!   `transformer_impl` names; without it, both where they agree or the master weights decide.
//! - distributed (`--use-distributed-optimizer`): a `distrib_optim.pt` holding, per model chunk
//!   (keys 0, 1, ...; one parameter type each), the `param` (f32 master weights), `exp_avg` and
//!   `exp_avg_sq` of its whole gradient buffer (`buffer`), the buckets one after another without
//!   their end padding (`buckets_coalesced`). Where a bucket ends is not saved: each parameter is
//!   placed where its master weights equal the weights its rank saved
//!   (`buffer::place_coalesced`), under the registration order that places them all.
//!
//! Where neither maps, the load starts the optimizer fresh and says so.

use super::map;
use crate::checkpoint::convert::Layout;
use crate::checkpoint::megatron::buffer::{
    place_coalesced, registration, same_weight, shared_embedding, Gather, Mapped, STATES,
};
use crate::checkpoint::megatron::pickle::{Id, Node};
use crate::checkpoint::megatron::torch_file::TorchFile;
use crate::error::{Error, Result};
use crate::model::GptConfig;
use crate::tensor::ParamInfo;
use std::collections::BTreeMap;
use std::path::Path;

pub const FILE: &str = "distrib_optim.pt";

/// Parameters with their three states (`param`, `exp_avg`, `exp_avg_sq`).
type States = Vec<(ParamInfo, [Vec<f32>; 3])>;

/// A model-parallel rank's model chunk as the legacy files hold it: its parameters (trident's
/// order) and the weights that rank saved for each (None where it saved none: the tied copy).
pub struct RankChunk {
    pub tp: usize,
    pub pp: usize,
    pub chunk: usize,
    pub params: Vec<ParamInfo>,
    pub weights: Vec<Option<Vec<f32>>>,
}

/// The torch optimizer state dict inside a rank file's `optimizer` (the optimizer's own, or
/// inside its `optimizer` under bf16 and fp16), and the f32 masters beside it where saved.
fn torch_state(file: &TorchFile) -> Option<(Id, Option<Id>)> {
    let p = &file.pickle;
    let opt = p.get(p.root, "optimizer")?;
    match p.get(opt, "optimizer") {
        Some(inner) => Some((inner, p.get(opt, "fp32_from_fp16_params"))),
        None => Some((opt, None)),
    }
}

/// AdamW's step from a rank file's `optimizer`: its parameter groups' `step`, or (a torch
/// optimizer's own state) its first parameter's.
pub fn step(file: &TorchFile) -> Result<Option<u64>> {
    let p = &file.pickle;
    let Some((inner, _)) = torch_state(file) else { return Ok(None) };
    let groups = p.get(inner, "param_groups").and_then(|g| p.items(g)).unwrap_or_default();
    let per_param = p.get(inner, "state").and_then(|s| p.entries(s)).and_then(|e| e.first()).map(|&(_, v)| v);
    let id = groups.iter().find_map(|&g| p.get(g, "step")).or_else(|| per_param.and_then(|s| p.get(s, "step")));
    match id {
        Some(id) => crate::checkpoint::megatron::step_count(file, id, "the optimizer's step").map(Some),
        None => Ok(None),
    }
}

/// Whether a rank file holds optimizer state.
pub fn holds_state(file: &TorchFile) -> bool {
    torch_state(file).is_some()
}

/// One chunk's three states from a parsed `distrib_optim.pt`; None where the file is not
/// megatron-core's coalesced buffers or lacks the chunk.
fn chunk_states(file: &TorchFile, chunk: usize) -> Result<Option<Vec<Vec<f32>>>> {
    let p = &file.pickle;
    if !matches!(p.get(p.root, "buckets_coalesced").map(|id| p.node(id)), Some(Node::Bool(true))) {
        return Ok(None);
    }
    let entries = p.entries(p.root).unwrap_or_default();
    let Some(&(_, by_type)) = entries.iter().find(|&&(k, _)| p.int(k) == Some(chunk as i64)) else { return Ok(None) };
    let [(_, buffer)] = p.entries(by_type).unwrap_or_default() else { return Ok(None) };
    let mut out = Vec::new();
    for (state, _) in STATES {
        let Some(id) = p.get(*buffer, state) else { return Ok(None) };
        let t = file.tensor(id, state)?;
        if t.shape.len() != 1 || out.first().is_some_and(|first: &Vec<f32>| first.len() != t.data.len()) {
            return Ok(None);
        }
        out.push(t.data);
    }
    Ok(Some(out))
}

/// Where `rank`'s parameters lie in its coalesced buffer (registration order, offsets), under the
/// first registration order whose master weights (`master`) equal the rank's saved weights.
fn placement(
    model: &GptConfig,
    layout: &Layout,
    rank: &RankChunk,
    master: &[f32],
) -> Option<(Vec<ParamInfo>, Vec<usize>)> {
    let saved: BTreeMap<&str, Option<&Vec<f32>>> =
        rank.params.iter().zip(&rank.weights).map(|(p, w)| (p.name.as_str(), w.as_ref())).collect();
    for te in [false, true] {
        let params = registration(rank.params.clone(), te);
        let fits = |i: usize, at: usize| {
            let p = &params[i];
            let Some(there) = master.get(at..at + p.numel()) else { return false };
            match saved.get(p.name.as_str()) {
                Some(Some(w)) => there.iter().zip(w.iter()).all(|(&m, &s)| same_weight(m, s)),
                // The tied copy, saved nowhere on its stage, starts its own bucket: no choice.
                _ => true,
            }
        };
        if let Some(at) = place_coalesced(&params, shared_embedding(model, layout.pp), master.len(), fits) {
            return Some((params, at));
        }
    }
    None
}

/// One rank file's parameters (all its chunks, `chunks`) with their states, `param` (the
/// masters, or the saved weights where the run kept no others), `exp_avg`, `exp_avg_sq`, from
/// its non-distributed optimizer, under the registration order `te`. None where a group, an
/// index or a shape does not match, or the masters are not the saved weights.
fn plain_states(file: &TorchFile, chunks: &[&RankChunk], te: bool) -> Result<Option<States>> {
    let p = &file.pickle;
    let Some((inner, masters)) = torch_state(file) else { return Ok(None) };
    let state: BTreeMap<i64, Id> = p
        .get(inner, "state")
        .and_then(|s| p.entries(s))
        .unwrap_or_default()
        .iter()
        .filter_map(|&(k, v)| Some((p.int(k)?, v)))
        .collect();
    let groups = p.get(inner, "param_groups").and_then(|g| p.items(g)).unwrap_or_default();
    let master_groups = masters.and_then(|m| p.items(m));
    let mut members = Vec::new();
    for rank in chunks {
        let saved: BTreeMap<&str, &Option<Vec<f32>>> =
            rank.params.iter().zip(&rank.weights).map(|(p, w)| (p.name.as_str(), w)).collect();
        members.extend(registration(rank.params.clone(), te).into_iter().map(|p| {
            let w = saved[p.name.as_str()].clone();
            (p, w)
        }));
    }
    let flag = |g: Id, k: &str| matches!(p.get(g, k).map(|id| p.node(id)), Some(Node::Bool(true)));
    let decoupled_rate = groups.iter().any(|&g| flag(g, "is_decoupled_lr"));
    let mut out = Vec::new();
    for (g, &group) in groups.iter().enumerate() {
        let wd = match p.get(group, "wd_mult").map(|id| p.node(id)) {
            Some(Node::Float(v)) => *v,
            Some(Node::Int(v)) => *v as f64,
            _ => return Ok(None),
        };
        let decoupled = flag(group, "is_decoupled_lr");
        let selected =
            |m: &ParamInfo| m.decayed() == (wd != 0.0) && (decoupled_rate && m.embedding_or_output()) == decoupled;
        let indices = p.get(group, "params").and_then(|i| p.items(i)).unwrap_or_default();
        let in_group: Vec<&(ParamInfo, Option<Vec<f32>>)> = members.iter().filter(|(m, _)| selected(m)).collect();
        let group_masters = master_groups.and_then(|m| m.get(g)).and_then(|&m| p.items(m));
        if indices.len() != in_group.len() || group_masters.is_some_and(|m| m.len() != in_group.len()) {
            return Ok(None);
        }
        for (k, (&index, (param, saved))) in indices.iter().zip(in_group).enumerate() {
            let Some(&entry) = p.int(index).and_then(|i| state.get(&i)) else { return Ok(None) };
            let mut moments = Vec::new();
            for name in ["exp_avg", "exp_avg_sq"] {
                let Some(id) = p.get(entry, name) else { return Ok(None) };
                let t = file.tensor(id, name)?;
                if t.shape != param.shape {
                    return Ok(None);
                }
                moments.push(t.data);
            }
            let master = match group_masters {
                Some(m) => file.tensor(m[k], "fp32_from_fp16_params")?.data,
                None => saved.clone().unwrap_or_default(),
            };
            let agrees =
                |w: &Vec<f32>| w.len() == master.len() && w.iter().zip(&master).all(|(&s, &m)| same_weight(m, s));
            if saved.as_ref().is_some_and(|w| !agrees(w)) {
                return Ok(None);
            }
            let [m, v] = <[Vec<f32>; 2]>::try_from(moments).expect("two moments");
            out.push((param.clone(), [master, m, v]));
        }
    }
    Ok((out.len() == members.len()).then_some(out))
}

/// The states of one rank file's parameters from its non-distributed optimizer, under the
/// registration order `impl_te` names, else under both where they agree.
fn plain(file: &TorchFile, chunks: &[&RankChunk], impl_te: Option<bool>) -> Result<Option<States>> {
    let orders: Vec<bool> = impl_te.map_or(vec![false, true], |te| vec![te]);
    let mut found: Vec<States> = Vec::new();
    for te in orders {
        if let Some(mut states) = plain_states(file, chunks, te)? {
            states.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            found.push(states);
        }
    }
    let agree = found.windows(2).all(|w| w[0].iter().zip(&w[1]).all(|(a, b)| a.0.name == b.0.name && a.1 == b.1));
    Ok(if agree { found.pop() } else { None })
}

/// AdamW's state of a legacy checkpoint, mapped onto the model's full tensors: from the
/// distributed optimizer's `distrib_optim.pt` where the ranks hold one, else from each rank
/// file's non-distributed optimizer; None where neither maps. `impl_te` is the saved
/// `transformer_impl` (Transformer Engine's or not), where saved.
pub fn read(
    iter_dir: &Path,
    layout: &Layout,
    model: &GptConfig,
    ranks: &[RankChunk],
    step: Option<u64>,
    impl_te: Option<bool>,
) -> Result<Option<Mapped>> {
    let Some(step) = step else { return Ok(None) };
    let mut gathers: Vec<Gather> = STATES.iter().map(|_| Gather::new(model)).collect();
    let rank_dir = |r: &RankChunk| iter_dir.join(crate::checkpoint::shard_name(r.tp, r.pp, layout.pp));
    let distributed = ranks.first().is_some_and(|r| rank_dir(r).join(FILE).is_file());
    let mut put = |p: &ParamInfo, tp: usize, states: &[Vec<f32>], at: usize, path: &Path| -> Result<()> {
        for (gather, data) in gathers.iter_mut().zip(states) {
            if !gather.put(p, tp, data, at) {
                return Err(Error::format(path, format!("{} lies past its saved state's end", p.name)));
            }
        }
        Ok(())
    };
    for (i, rank) in ranks.iter().enumerate() {
        if distributed {
            let path = rank_dir(rank).join(FILE);
            let bytes = map(&path)?;
            let file = TorchFile::parse(&bytes, &path)?;
            let Some(states) = chunk_states(&file, rank.chunk)? else { return Ok(None) };
            let Some((params, at)) = placement(model, layout, rank, &states[0]) else { return Ok(None) };
            for (p, &offset) in params.iter().zip(&at) {
                put(p, rank.tp, &states, offset, &path)?;
            }
        } else if i == 0 || (ranks[i - 1].tp, ranks[i - 1].pp) != (rank.tp, rank.pp) {
            // A rank file's optimizer numbers the parameters of all its chunks together.
            let chunks: Vec<&RankChunk> =
                ranks[i..].iter().take_while(|r| (r.tp, r.pp) == (rank.tp, rank.pp)).collect();
            let path = rank_dir(rank).join(super::FILE);
            let bytes = map(&path)?;
            let file = TorchFile::parse(&bytes, &path)?;
            let Some(states) = plain(&file, &chunks, impl_te)? else { return Ok(None) };
            for (p, s) in &states {
                put(p, rank.tp, s, 0, &path)?;
            }
        }
    }
    let mut tensors = BTreeMap::new();
    for (gather, (_, ours)) in gathers.into_iter().zip(STATES) {
        let Some(full) = gather.finish(ours) else { return Ok(None) };
        tensors.extend(full);
    }
    Ok(Some(Mapped { tensors, step }))
}
