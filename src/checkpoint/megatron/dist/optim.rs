//! The distributed optimizer's state in a torch_dist checkpoint, as Megatron-LM saves it under
//! `--use-distributed-optimizer` (megatron-core's default `dp_reshardable` layout). Each
//! model-parallel rank (`dp_group_idx_R`, R = pipeline rank x tensor size + tensor rank) and model
//! chunk (`gbuf_idx_C`) keeps its gradient buffer's buckets (`buffer`), one flat tensor per
//! bucket and state: `param` (the f32 master weights), `exp_avg` and `exp_avg_sq`. The saved
//! bucket lengths are checked against the buffer's layout before anything is read, so a file
//! cannot size what is allocated; of the known registration orders, the one whose master weights
//! equal the saved weights (to bf16 or fp16 rounding) is taken, and where none does the state is
//! not mapped and the load starts the optimizer fresh.

use super::{global, Files, Metadata};
use crate::checkpoint::convert::Layout;
use crate::checkpoint::megatron::buffer::{place, registration, same_weight, shared_embedding, Gather, Mapped, STATES};
use crate::checkpoint::megatron::layout_of;
use crate::checkpoint::megatron::torch_file::TorchFile;
use crate::error::Result;
use crate::model::GptConfig;
use crate::tensor::ParamInfo;
use std::collections::BTreeMap;
use std::path::Path;

const PREFIX: &str = "optimizer.distributed.dp_group_idx_";
/// One bucket: the stem of its tensors' keys and its length.
struct Bucket {
    stem: String,
    numel: usize,
}

/// One model-parallel rank's model chunk: its parameters in registration order, each one's
/// (bucket, offset), and its buckets.
struct Unit {
    tp_rank: usize,
    params: Vec<ParamInfo>,
    at: Vec<(usize, usize)>,
    key: (usize, usize),
}

/// A rank's chunk's buffer as its keys name it: their stem (one parameter type) and its buckets
/// by index.
type Buffer<'a> = (&'a str, BTreeMap<usize, Bucket>);

/// The buckets by (rank, chunk), in order; None where a key does not read as megatron-core's, a
/// rank's chunk has two buffers (mixed parameter types), or a state is missing or of another length.
fn buckets(md: &Metadata) -> Option<BTreeMap<(usize, usize), Vec<Bucket>>> {
    // Per (rank, chunk): its buffer's stem (one parameter type) and its buckets by index.
    let mut found: BTreeMap<(usize, usize), Buffer> = BTreeMap::new();
    for (key, t) in md.tensors.range(PREFIX.to_string()..).take_while(|(k, _)| k.starts_with(PREFIX)) {
        let Some(stem) = key.strip_suffix(".param") else { continue };
        let (buffer, bucket) = stem.rsplit_once(".bucket_idx_")?;
        let (rank, rest) = buffer[PREFIX.len()..].split_once(".gbuf_idx_")?;
        let (chunk, _dtype) = rest.split_once(".dtype_")?;
        let (rank, chunk, bucket) = (rank.parse().ok()?, chunk.parse().ok()?, bucket.parse().ok()?);
        let [numel] = t.size[..] else { return None };
        for (state, _) in &STATES[1..] {
            if md.tensors.get(&format!("{stem}.{state}")).map(|t| &t.size[..]) != Some(&[numel]) {
                return None;
            }
        }
        let (stem_of_buffer, chunk_buckets) = found.entry((rank, chunk)).or_insert((buffer, BTreeMap::new()));
        if *stem_of_buffer != buffer {
            return None;
        }
        chunk_buckets.insert(bucket, Bucket { stem: stem.to_string(), numel });
    }
    let mut out = BTreeMap::new();
    for (key, (_, chunk_buckets)) in found {
        if chunk_buckets.keys().copied().ne(0..chunk_buckets.len()) {
            return None;
        }
        out.insert(key, chunk_buckets.into_values().collect());
    }
    Some(out)
}

/// AdamW's step, from rank 0's `optimizer` object (its parameter groups' `step`); None where
/// it is not there.
fn step(md: &Metadata, files: &mut Files) -> Result<Option<u64>> {
    let object = format!("{PREFIX}0.optimizer/");
    let Some(place) = md.places.iter().find(|((fqn, _), _)| fqn.starts_with(&object)).map(|(_, p)| p.clone()) else {
        return Ok(None);
    };
    let item_path = files.dir.join(&place.0);
    let bytes = files.bytes(&place)?;
    let file = TorchFile::parse(bytes, &item_path)?;
    let p = &file.pickle;
    // megatron-core saves the object inside a one-item list.
    let root = p.items(p.root).and_then(|items| items.first().copied()).unwrap_or(p.root);
    let groups = p.get(root, "param_groups").and_then(|g| p.items(g)).unwrap_or_default();
    match groups.iter().find_map(|&g| p.get(g, "step")) {
        Some(id) => crate::checkpoint::megatron::step_count(&file, id, "the optimizer's step").map(Some),
        None => Ok(None),
    }
}

/// Every model-parallel rank's chunks with their parameters placed in `found`'s buckets under
/// one registration order; None where a rank or chunk is missing, extra, or does not fit.
fn units(
    model: &GptConfig,
    layout: &Layout,
    found: &BTreeMap<(usize, usize), Vec<Bucket>>,
    te: bool,
) -> Result<Option<Vec<Unit>>> {
    let shared = shared_embedding(model, layout.pp);
    let mut out = Vec::new();
    for pp in 0..layout.pp {
        let plans = layout.plans(model, pp)?;
        for tp_rank in 0..layout.tp {
            let mp = layout.model_parallel(tp_rank);
            for (c, plan) in plans.iter().enumerate() {
                let key = (pp * layout.tp + tp_rank, c);
                let Some(buckets) = found.get(&key) else { return Ok(None) };
                let params = registration(model.chunk_parameters(&mp, plan), te);
                let sizes: Vec<usize> = buckets.iter().map(|b| b.numel).collect();
                let Some(at) = place(&params, shared, &sizes) else { return Ok(None) };
                out.push(Unit { tp_rank, params, at, key });
            }
        }
    }
    Ok((out.len() == found.len()).then_some(out))
}

/// The distributed optimizer's state, mapped onto the model's full tensors; None where the
/// checkpoint holds none, or holds it in a layout this reader does not know. `weights` are the
/// saved weights (`param/NAME`), which the master weights are checked against.
pub fn read(
    md: &Metadata,
    files: &mut Files,
    model: &GptConfig,
    meta: &BTreeMap<String, String>,
    weights: &BTreeMap<String, Vec<f32>>,
    path: &Path,
) -> Result<Option<Mapped>> {
    if !md.tensors.keys().any(|k| k.starts_with(PREFIX)) {
        return Ok(None);
    }
    let Some(found) = buckets(md) else { return Ok(None) };
    let Some(step) = step(md, files)? else { return Ok(None) };
    let layout = layout_of(meta, model, path)?;
    let mut candidates = Vec::new();
    for te in [false, true] {
        candidates.extend(units(model, &layout, &found, te)?);
    }
    // Each candidate order checked against the saved weights, one bucket read at a time.
    let mut alive = vec![true; candidates.len()];
    for (u, unit) in candidates.first().into_iter().flatten().enumerate() {
        for (b, bucket) in found[&unit.key].iter().enumerate() {
            let master = global(md, files, &format!("{}.param", bucket.stem), &[bucket.numel], path)?;
            for (c, units) in candidates.iter().enumerate() {
                let unit = &units[u];
                // What is read from this rank (a replicated parameter from TP rank 0, the tied
                // embedding from the first stage) is checked: the other copies may differ.
                let mut placed = unit
                    .params
                    .iter()
                    .zip(&unit.at)
                    .filter(|(p, at)| at.0 == b && !p.tied_copy && (p.partition.is_some() || unit.tp_rank == 0));
                alive[c] &= placed.all(|(p, &(_, off))| {
                    let saved = &weights[&format!("param/{}", p.name)];
                    (0..p.numel()).all(|i| same_weight(master[off + i], saved[p.global_index(i)]))
                });
            }
        }
    }
    let Some(chosen) = alive.iter().position(|&a| a) else { return Ok(None) };
    let units = &candidates[chosen];
    let mut tensors = BTreeMap::new();
    for (state, ours) in STATES {
        let mut gather = Gather::new(model);
        for unit in units {
            for (b, bucket) in found[&unit.key].iter().enumerate() {
                let data = global(md, files, &format!("{}.{state}", bucket.stem), &[bucket.numel], path)?;
                for (p, &(_, at)) in unit.params.iter().zip(&unit.at).filter(|(_, at)| at.0 == b) {
                    if !gather.put(p, unit.tp_rank, &data, at) {
                        return Ok(None);
                    }
                }
            }
        }
        let Some(full) = gather.finish(ours) else { return Ok(None) };
        tensors.extend(full);
    }
    Ok(Some(Mapped { tensors, step }))
}
