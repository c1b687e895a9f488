//! Megatron-LM's legacy `torch` checkpoint format: `iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt`,
//! one `torch.save` file per model-parallel rank, its `model` (or `model0`, `model1`, ... under
//! virtual pipeline stages) a state dict of this rank's shards with layers numbered from 0 on
//! each stage. The layout comes from the saved arguments; each rank's tensors are placed into
//! the full ones as trident's own layout of the same sizes places them (megatron-core and trident
//! split every parameter alike).

mod optim;

use super::torch_file::TorchFile;
use super::{fused_norm_name, is_model_key, layout_of, split_layer};
use crate::checkpoint::convert::{FullCheckpoint, Layout};
use crate::error::{Error, Result};
use crate::model::ModelParallel;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const FILE: &str = "model_optim_rng.pt";

fn map(path: &Path) -> Result<memmap2::Mmap> {
    let file = crate::files::open_regular(path, "read Megatron checkpoint")?;
    // Safety: the map is read-only and lives while the bytes are parsed; a file changed under a
    // running read gives wrong values or a format error, as a read() would.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, "map", e))
}

/// The layout's rank files, every one checked to exist before any is read.
fn rank_files(iter_dir: &Path, layout: &Layout) -> Result<Vec<(usize, usize, PathBuf)>> {
    let mut out = Vec::new();
    for tp in 0..layout.tp {
        for pp in 0..layout.pp {
            let path = iter_dir.join(crate::checkpoint::shard_name(tp, pp, layout.pp)).join(FILE);
            if !path.is_file() {
                return Err(Error::format(
                    iter_dir,
                    format!(
                        "the saved arguments give tensor-parallel {} x pipeline {}, but {} is missing",
                        layout.tp,
                        layout.pp,
                        path.display()
                    ),
                ));
            }
            out.push((tp, pp, path));
        }
    }
    Ok(out)
}

/// Megatron's local name of trident's parameter `name` in a chunk whose first layer is `first`,
/// and the fused-norm spelling Transformer Engine's layers use.
fn local_names(name: &str, first: usize) -> Vec<String> {
    match split_layer(name) {
        (Some(l), suffix) => {
            let local = l - first;
            let mut names = vec![format!("decoder.layers.{local}.{suffix}")];
            names.extend(fused_norm_name(suffix).map(|f| format!("decoder.layers.{local}.{f}")));
            names
        }
        (None, name) => vec![name.to_string()],
    }
}

/// The first rank's file: `mp_rank_00`'s, or `mp_rank_00_000`'s under a pipeline.
pub fn first_file(iter_dir: &Path) -> PathBuf {
    let single = iter_dir.join(crate::checkpoint::shard_name(0, 0, 1)).join(FILE);
    match single.is_file() {
        true => single,
        false => iter_dir.join(crate::checkpoint::shard_name(0, 0, 2)).join(FILE),
    }
}

/// Reads every rank file of the legacy checkpoint in `iter_dir` into full tensors.
pub fn read(iter_dir: &Path) -> Result<FullCheckpoint> {
    let first_path = first_file(iter_dir);
    let first_map = map(&first_path)?;
    let (meta, iteration, model) = super::saved_run(&TorchFile::parse(&first_map, &first_path)?, &first_path)?;
    let layout = layout_of(&meta, &model, &first_path)?;
    let files = rank_files(iter_dir, &layout)?;
    let mut held = 0u64;
    for (_, _, path) in &files {
        held += std::fs::metadata(path).map_err(|e| Error::io(path, "read", e))?.len();
    }
    super::ensure_files_hold(&model, held, iter_dir)?;
    // Where the ranks saved optimizer state, each rank's weights are kept to place its state.
    let first = TorchFile::parse(&first_map, &first_path)?;
    let with_optimizer = files[0].2.with_file_name(optim::FILE).is_file() || optim::holds_state(&first);
    let step = optim::step(&first)?;
    let impl_te = first.pickle.get(first.pickle.root, "args").and_then(|a| first.pickle.get(a, "transformer_impl"));
    let impl_te = impl_te.and_then(|id| first.pickle.str(id)).map(|s| s == "transformer_engine");
    drop(first);
    let mut ranks = Vec::new();
    drop(first_map);
    let mut tensors: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut filled: BTreeMap<String, usize> = BTreeMap::new();
    for info in model.parameters(&ModelParallel::single()) {
        tensors.insert(format!("param/{}", info.name), vec![0.0; info.numel()]);
    }
    for (tp, pp, path) in files {
        let bytes = map(&path)?;
        let file = TorchFile::parse(&bytes, &path)?;
        let mp = layout.model_parallel(tp);
        for (c, plan) in layout.plans(&model, pp)?.iter().enumerate() {
            let key = if layout.chunks > 1 { format!("model{c}") } else { "model".to_string() };
            let p = &file.pickle;
            let state = p.get(p.root, &key).ok_or_else(|| Error::format(&path, format!("no '{key}' state dict")))?;
            let entries = p.entries(state).ok_or_else(|| Error::format(&path, format!("'{key}' is not a dict")))?;
            let mut unused: BTreeSet<&str> =
                entries.iter().filter_map(|&(k, _)| p.str(k)).filter(|k| is_model_key(k)).collect();
            let params = model.chunk_parameters(&mp, plan);
            let mut weights = Vec::new();
            for info in &params {
                let names = local_names(&info.name, plan.layers.start);
                let found = names.iter().find_map(|n| p.get(state, n).map(|id| (n, id)));
                if info.tied_copy {
                    // The last stage's copy of a tied embedding (`output_layer.weight`) is the first's.
                    if with_optimizer {
                        let copy = p.get(state, "output_layer.weight").map(|id| file.tensor(id, "output_layer.weight"));
                        weights.push(copy.transpose()?.map(|t| t.data));
                    }
                    unused.remove("output_layer.weight");
                    continue;
                }
                let (name, id) = found.ok_or_else(|| {
                    Error::format(&path, format!("'{key}' has no '{}' (trident's {})", names[0], info.name))
                })?;
                unused.remove(name.as_str());
                // A replicated parameter is read from tensor-parallel rank 0 alone.
                let replica = info.partition.is_none() && info.partition2.is_none() && tp > 0;
                if replica && !with_optimizer {
                    continue;
                }
                let t = file.tensor(id, name)?;
                if t.shape != info.shape {
                    return Err(Error::format(
                        &path,
                        format!(
                            "'{name}' has shape {:?}; this layout's shard of {} is {:?}",
                            t.shape, info.name, info.shape
                        ),
                    ));
                }
                if !replica {
                    let full = tensors.get_mut(&format!("param/{}", info.name)).expect("every parameter was listed");
                    for (local, &v) in t.data.iter().enumerate() {
                        full[info.global_index(local)] = v;
                    }
                    *filled.entry(info.name.clone()).or_default() += t.data.len();
                }
                if with_optimizer {
                    weights.push(Some(t.data));
                }
            }
            if with_optimizer {
                ranks.push(optim::RankChunk { tp, pp, chunk: c, params, weights });
            }
            if !model.arch.untie_embeddings {
                unused.remove("output_layer.weight");
            }
            if let Some(extra) = unused.first() {
                return Err(Error::format(
                    &path,
                    format!("'{key}' holds '{extra}', which the model its arguments describe does not have"),
                ));
            }
        }
    }
    for info in model.parameters(&ModelParallel::single()) {
        if filled.get(&info.name).copied().unwrap_or(0) != info.numel() {
            return Err(Error::format(iter_dir, format!("the rank files do not cover {} exactly once", info.name)));
        }
    }
    let mut meta = meta;
    if with_optimizer {
        if let Some(mapped) = optim::read(iter_dir, &layout, &model, &ranks, step, impl_te)? {
            tensors.extend(mapped.tensors);
            meta.insert("adam_step".into(), mapped.step.to_string());
        }
    }
    Ok(FullCheckpoint { iteration, meta, model, layout: Layout::single(), tensors })
}
