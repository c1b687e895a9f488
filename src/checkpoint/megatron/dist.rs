//! Megatron-LM's `torch_dist` checkpoint format, read and written: an iteration directory holding
//! `common.pt` (`torch.save` of the argument namespace and the iteration), `metadata.json` (the
//! backends), `.metadata` (PyTorch's distributed-checkpoint `Metadata`, pickled: each tensor's
//! global size and its chunks, and where each chunk's bytes lie) and the `__R_I.distcp` files
//! holding each chunk as a `torch.save` archive. megatron-core stacks the layers: a layer's
//! parameter is a slice of one tensor of `num_layers` rows (`decoder.layers.mlp.linear_fc1.weight`,
//! global shape `[layers, rows, columns]`), and names each norm after the linear layer it feeds
//! (`self_attention.linear_qkv.layer_norm_weight`). Per-layer keys (`decoder.layers.3.…`, from
//! heterogeneous models) are read too.

mod optim;

use super::pickle::{Pickle, Writer};
use super::torch_file::{self, TorchFile, Value};
use super::{fused_norm_name, is_model_key, split_layer};
use crate::checkpoint::convert::{FullCheckpoint, Layout};
use crate::error::{Error, Result};
use crate::model::{GptConfig, ModelParallel};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One tensor of the checkpoint: its global size and chunks (offsets, sizes).
struct TensorMeta {
    size: Vec<usize>,
    chunks: Vec<(Vec<usize>, Vec<usize>)>,
}

/// Where a chunk's bytes lie: (file, offset, length).
type Place = (String, u64, u64);

/// What `.metadata` says: the tensors by key, and each chunk's place by (key, offsets).
struct Metadata {
    tensors: BTreeMap<String, TensorMeta>,
    places: HashMap<(String, Vec<usize>), Place>,
}

fn parse_metadata(p: &Pickle, path: &Path) -> Result<Metadata> {
    let bad = |what: &str| Error::format(path, format!("not PyTorch's distributed-checkpoint metadata: {what}"));
    if p.class(p.root).map(|c| c.1) != Some("Metadata") {
        return Err(bad("the root is not a Metadata object"));
    }
    let sdm = p
        .get(p.root, "state_dict_metadata")
        .and_then(|id| p.entries(id))
        .ok_or_else(|| bad("no state_dict_metadata"))?;
    let mut tensors = BTreeMap::new();
    for &(k, v) in sdm {
        let key = p.str(k).ok_or_else(|| bad("a key that is not a string"))?;
        if p.class(v).map(|c| c.1) != Some("TensorStorageMetadata") {
            continue; // BytesStorageMetadata: objects (extra state, RNG), not weights.
        }
        let size = p.get(v, "size").and_then(|s| p.usizes(s)).ok_or_else(|| bad(&format!("'{key}' has no size")))?;
        let chunk_ids =
            p.get(v, "chunks").and_then(|c| p.items(c)).ok_or_else(|| bad(&format!("'{key}' has no chunks")))?;
        let mut chunks = Vec::with_capacity(chunk_ids.len());
        for &c in chunk_ids {
            let field = |f: &str| p.get(c, f).and_then(|s| p.usizes(s));
            match (field("offsets"), field("sizes")) {
                (Some(o), Some(s)) => chunks.push((o, s)),
                _ => return Err(bad(&format!("a chunk of '{key}' without offsets and sizes"))),
            }
        }
        tensors.insert(key.to_string(), TensorMeta { size, chunks });
    }
    let sd = p.get(p.root, "storage_data").and_then(|id| p.entries(id)).ok_or_else(|| bad("no storage_data"))?;
    let mut places = HashMap::new();
    for &(index, info) in sd {
        let fqn = p.get(index, "fqn").and_then(|f| p.str(f)).ok_or_else(|| bad("a storage index without its fqn"))?;
        let offset = p.get(index, "offset").and_then(|o| p.usizes(o)).unwrap_or_default();
        let file = p.get(info, "relative_path").and_then(|f| p.str(f));
        let at = |f: &str| p.get(info, f).and_then(|v| p.int(v)).and_then(|v| u64::try_from(v).ok());
        match (file, at("offset"), at("length")) {
            (Some(file), Some(o), Some(l)) => places.insert((fqn.to_string(), offset), (file.to_string(), o, l)),
            _ => return Err(bad(&format!("the storage of '{fqn}' lacks its file, offset or length"))),
        };
    }
    Ok(Metadata { tensors, places })
}

/// The `.distcp` files of the checkpoint, mapped once each, every name kept inside `dir`.
struct Files<'a> {
    dir: &'a Path,
    named_in: PathBuf,
    maps: BTreeMap<String, memmap2::Mmap>,
}

impl Files<'_> {
    fn bytes(&mut self, (file, offset, length): &Place) -> Result<&[u8]> {
        if !self.maps.contains_key(file) {
            let path = crate::files::inside(self.dir, file, &self.named_in)?;
            let f = crate::files::open_regular(&path, "read checkpoint file")?;
            // Safety: read-only; a file changed under the read gives a format error or wrong values.
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(&path, "map", e))?;
            self.maps.insert(file.clone(), map);
        }
        let map = &self.maps[file];
        let end = offset.checked_add(*length).filter(|&e| e <= map.len() as u64);
        let end = end.ok_or_else(|| {
            Error::format(
                &self.dir.join(file),
                format!("{length} bytes at {offset} reach past the file's {} bytes", map.len()),
            )
        })?;
        Ok(&map[*offset as usize..end as usize])
    }
}

/// Whether every chunk lies inside a tensor of `size`.
fn inside(size: &[usize], chunks: &[(Vec<usize>, Vec<usize>)]) -> bool {
    chunks.iter().all(|(o, s)| {
        o.len() == size.len()
            && s.len() == size.len()
            && o.iter().zip(s).zip(size).all(|((&o, &s), &n)| o.checked_add(s).is_some_and(|e| e <= n))
    })
}

/// The tensor `key` whole, checked to be of `shape`, from its chunks.
fn global(md: &Metadata, files: &mut Files, key: &str, shape: &[usize], path: &Path) -> Result<Vec<f32>> {
    let t = &md.tensors[key];
    if t.size != shape {
        return Err(Error::format(path, format!("'{key}' has global size {:?}; the arguments give {shape:?}", t.size)));
    }
    let once = || Error::format(path, format!("the chunks of '{key}' do not cover it exactly once"));
    if !inside(&t.size, &t.chunks) {
        return Err(once());
    }
    let numel: usize = shape.iter().product();
    let mut out = vec![0f32; numel];
    // One bit per element: a chunk overlapping another, or a gap, is refused.
    let mut covered = vec![0u64; numel.div_ceil(64)];
    for (offsets, sizes) in &t.chunks {
        let place = md.places.get(&(key.to_string(), offsets.clone()));
        let place =
            place.ok_or_else(|| Error::format(path, format!("no storage for the chunk of '{key}' at {offsets:?}")))?;
        let item_path = files.dir.join(&place.0);
        let bytes = files.bytes(place)?;
        let item = TorchFile::parse(bytes, &item_path)?;
        let chunk = item.tensor(item.pickle.root, key)?;
        if chunk.shape != *sizes {
            return Err(Error::format(
                &item_path,
                format!("the chunk of '{key}' at {offsets:?} is {:?}, not {sizes:?}", chunk.shape),
            ));
        }
        if !scatter(&mut out, &mut covered, shape, &chunk.data, offsets, sizes) {
            return Err(once());
        }
    }
    if covered.iter().map(|w| w.count_ones() as usize).sum::<usize>() != numel {
        return Err(once());
    }
    Ok(out)
}

/// Writes the chunk `data` (of `sizes`, at `offsets`) into `out` (of `shape`), row by row, marking
/// each element in `covered`; false where an element was written before.
fn scatter(
    out: &mut [f32],
    covered: &mut [u64],
    shape: &[usize],
    data: &[f32],
    offsets: &[usize],
    sizes: &[usize],
) -> bool {
    let nd = shape.len();
    let row = sizes.last().copied().unwrap_or(1);
    if row == 0 {
        return true;
    }
    let mut index = vec![0usize; nd.saturating_sub(1)];
    for chunk_row in data.chunks(row) {
        let mut at = 0;
        for d in 0..nd.saturating_sub(1) {
            at = at * shape[d] + offsets[d] + index[d];
        }
        if nd > 0 {
            at = at * shape[nd - 1] + offsets[nd - 1];
        }
        for i in at..at + row {
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if covered[word] & bit != 0 {
                return false;
            }
            covered[word] |= bit;
        }
        out[at..at + row].copy_from_slice(chunk_row);
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
    true
}

/// The keys megatron-core may give trident's parameter `name`: stacked over the layers (with the
/// layer's row) or per layer, each with the fused-norm spelling first.
fn candidates(name: &str) -> Vec<(String, Option<usize>)> {
    match split_layer(name) {
        (Some(l), suffix) => {
            let mut spellings: Vec<String> = fused_norm_name(suffix).into_iter().collect();
            spellings.push(suffix.to_string());
            let stacked = spellings.iter().map(|s| (format!("decoder.layers.{s}"), Some(l)));
            let single = spellings.iter().map(|s| (format!("decoder.layers.{l}.{s}"), None));
            stacked.chain(single).collect()
        }
        (None, name) => vec![(name.to_string(), None)],
    }
}

/// Reads the torch_dist checkpoint in `iter_dir` into full tensors.
pub fn read(iter_dir: &Path) -> Result<FullCheckpoint> {
    let common_path = iter_dir.join("common.pt");
    let common_bytes = crate::files::read_regular(&common_path, "read Megatron checkpoint")?;
    let common = TorchFile::parse(&common_bytes, &common_path)?;
    let (meta, iteration, model) = super::saved_run(&common, &common_path)?;
    let md_path = iter_dir.join(".metadata");
    let md_bytes = crate::files::read_regular(&md_path, "read Megatron checkpoint")?;
    let md = parse_metadata(&Pickle::parse(&md_bytes, &md_path)?, &md_path)?;
    let mut held = 0u64;
    for file in md.places.values().map(|p| &p.0).collect::<BTreeSet<_>>() {
        let path = crate::files::inside(iter_dir, file, &md_path)?;
        held += std::fs::metadata(&path).map_err(|e| Error::io(&path, "read", e))?.len();
    }
    // The weights' bound first: it also bounds the parameter list built next.
    super::ensure_files_hold(&model, held, iter_dir)?;
    // What the optimizer saved beside the weights, where megatron-core keeps it per parameter in
    // the model's shapes (its non-distributed optimizers, and the distributed one's
    // `fully_reshardable` layout): AdamW's moments, and the f32 master weights (of a bf16 or fp16
    // run; the distributed optimizer's always).
    // A family counts where its first parameter's tensor has the model's own shape: another
    // layout of the same keys (a flattened one) is not mapped, and the load says so.
    let params = model.parameters(&ModelParallel::single());
    let holds = |prefix: &str| {
        let Some(first) = params.first() else { return false };
        candidates(&first.name).iter().any(|(k, row)| {
            let shape: Vec<usize> = row.map(|_| model.num_layers).into_iter().chain(first.full_shape.clone()).collect();
            md.tensors.get(&format!("{prefix}{k}")).is_some_and(|t| t.size == shape)
        })
    };
    let moments = holds(EXP_AVG) && holds(EXP_AVG_SQ);
    let master = [FP32_PARAM, RESHARDABLE_PARAM].into_iter().find(|&prefix| holds(prefix));
    let families = 1 + 2 * moments as u64 + master.is_some() as u64;
    super::ensure_files_hold(&model, held / families, iter_dir)?;
    let mut files = Files { dir: iter_dir, named_in: md_path.clone(), maps: BTreeMap::new() };
    let mut used = BTreeSet::new();
    let mut tensors = BTreeMap::new();
    let weights = [(master.unwrap_or(""), "param")];
    for (prefix, ours) in
        weights.iter().chain(if moments { &[(EXP_AVG, "adam_m"), (EXP_AVG_SQ, "adam_v")][..] } else { &[] })
    {
        for (name, values) in family(&md, &mut files, &model, prefix, &md_path, &mut used)? {
            tensors.insert(format!("{ours}/{name}"), values);
        }
    }
    if master.is_some() {
        // The model's own (bf16) copies of the master weights are accounted for.
        family(&md, &mut files, &model, "", &md_path, &mut used)?;
    }
    let mut meta = meta;
    if !moments {
        // The distributed optimizer's buckets, where it was one.
        if let Some(mapped) = optim::read(&md, &mut files, &model, &meta, &tensors, &md_path)? {
            tensors.extend(mapped.tensors);
            meta.remove("optimizer_state");
            meta.insert("adam_step".into(), mapped.step.to_string());
        }
    }
    if moments {
        match common_step(&common)? {
            Some(step) => {
                meta.remove("optimizer_state");
                meta.insert("adam_step".into(), step.to_string());
            }
            None => tensors.retain(|k, _| k.starts_with("param/")),
        }
    }
    let tied_copy = |k: &str| k == "output_layer.weight" && !model.arch.untie_embeddings;
    if let Some(extra) = md.tensors.keys().find(|k| is_model_key(k) && !used.contains(*k) && !tied_copy(k)) {
        return Err(Error::format(
            &md_path,
            format!("holds '{extra}', which the model its arguments describe does not have"),
        ));
    }
    Ok(FullCheckpoint { iteration, meta, model, layout: Layout::single(), tensors })
}

const EXP_AVG: &str = "optimizer.state.exp_avg.";
const EXP_AVG_SQ: &str = "optimizer.state.exp_avg_sq.";
const FP32_PARAM: &str = "optimizer.state.fp32_param.";
/// The distributed optimizer's master weights in its `fully_reshardable` layout.
const RESHARDABLE_PARAM: &str = "optimizer.state.param.";

/// Every parameter of `model` whole, from the keys `prefix` + megatron-core's key (`candidates`),
/// stacked layers cut into layers; the keys read are added to `used`.
fn family(
    md: &Metadata,
    files: &mut Files,
    model: &GptConfig,
    prefix: &str,
    md_path: &Path,
    used: &mut BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<f32>>> {
    let mut stacked: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for info in model.parameters(&ModelParallel::single()) {
        let keys: Vec<(String, Option<usize>)> =
            candidates(&info.name).into_iter().map(|(k, row)| (format!("{prefix}{k}"), row)).collect();
        let found = keys.iter().find(|(k, _)| md.tensors.contains_key(k)).cloned();
        let (key, row) = found.ok_or_else(|| {
            Error::format(md_path, format!("no tensor for trident's {} (as {})", info.name, keys[0].0))
        })?;
        used.insert(key.clone());
        let values = match row {
            None => global(md, files, &key, &info.full_shape, md_path)?,
            Some(l) => {
                if !stacked.contains_key(&key) {
                    let shape: Vec<usize> =
                        std::iter::once(model.num_layers).chain(info.full_shape.iter().copied()).collect();
                    let whole = global(md, files, &key, &shape, md_path)?;
                    stacked.insert(key.clone(), whole);
                }
                let n = info.numel();
                stacked[&key][l * n..(l + 1) * n].to_vec()
            }
        };
        out.insert(info.name, values);
    }
    Ok(out)
}

/// AdamW's step count as megatron-core saves it beside the moments, from `common.pt`'s optimizer
/// state: `common_step` (one for every parameter) in `optimizer.state` (an f32 optimizer) or
/// `optimizer.optimizer.state` (bf16 and fp16's), or the distributed optimizer's parameter
/// groups' `step` (`optimizer.optimizer.param_groups`, its `fully_reshardable` layout). None
/// where it is not there.
fn common_step(common: &TorchFile) -> Result<Option<u64>> {
    let p = &common.pickle;
    let Some(opt) = p.get(p.root, "optimizer") else { return Ok(None) };
    let inner = p.get(opt, "optimizer");
    let state = p.get(opt, "state").or_else(|| inner.and_then(|o| p.get(o, "state")));
    if let Some(step) = state.and_then(|s| p.get(s, "common_step")) {
        return super::step_count(common, step, "common_step").map(Some);
    }
    let groups = inner.and_then(|o| p.get(o, "param_groups")).and_then(|g| p.items(g)).unwrap_or_default();
    match groups.iter().find_map(|&g| p.get(g, "step")) {
        Some(step) => super::step_count(common, step, "the optimizer's step").map(Some),
        None => Ok(None),
    }
}

/// Megatron's stacked key of trident's parameter `name` (the fused-norm spelling, as
/// megatron-core 0.16 saves) and the layer's row; a parameter outside the layers keeps its name.
fn key_of(name: &str) -> (String, Option<usize>) {
    match split_layer(name) {
        (Some(l), suffix) => {
            (format!("decoder.layers.{}", fused_norm_name(suffix).unwrap_or(suffix.to_string())), Some(l))
        }
        (None, name) => (name.to_string(), None),
    }
}

/// The linear layers whose (empty) extra state megatron-core saves and expects back, per layer.
const EXTRA_STATE: [&str; 4] =
    ["self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"];

const METADATA_MODULE: &str = "torch.distributed.checkpoint.metadata";

/// `torch.Size(v)`.
fn size(w: &mut Writer, v: &[usize]) {
    w.global("torch", "Size");
    w.mark();
    w.int_tuple(v);
    w.tuple();
    w.reduce();
}

/// A dataclass instance: `cls.__new__(cls)` with `fields` as its `__dict__`.
fn dataclass(w: &mut Writer, module: &str, class: &str, fields: impl FnOnce(&mut Writer)) {
    w.global(module, class);
    w.mark();
    w.tuple();
    w.new_obj();
    fields(w);
    w.build();
}

/// One tensor's `TensorStorageMetadata`: f32, whole, in one chunk at the origin.
fn tensor_metadata(w: &mut Writer, shape: &[usize]) {
    dataclass(w, METADATA_MODULE, "TensorStorageMetadata", |w| {
        w.empty_dict();
        w.mark();
        w.str("properties");
        w.global(METADATA_MODULE, "TensorProperties");
        w.mark();
        w.tuple();
        w.new_obj();
        w.mark();
        w.global("torch", "float32");
        w.global("torch.serialization", "_get_layout");
        w.mark();
        w.str("torch.strided");
        w.tuple();
        w.reduce();
        w.bool(false);
        w.global(METADATA_MODULE, "_MEM_FORMAT_ENCODING");
        w.mark();
        w.int(0);
        w.tuple();
        w.reduce();
        w.bool(false);
        w.tuple();
        w.build();
        w.str("size");
        size(w, shape);
        w.str("chunks");
        w.empty_list();
        w.mark();
        dataclass(w, METADATA_MODULE, "ChunkStorageMetadata", |w| {
            w.empty_dict();
            w.mark();
            w.str("offsets");
            size(w, &vec![0; shape.len()]);
            w.str("sizes");
            size(w, shape);
            w.set_items();
        });
        w.appends();
        w.set_items();
    });
}

/// An item of the checkpoint: its key, whether it is a tensor (else an object), its global shape.
struct Item {
    key: String,
    shape: Option<Vec<usize>>,
    place: (u64, u64),
}

/// `.metadata` for `items`, all in `file`.
fn metadata_pickle(items: &[Item], file: &str) -> Vec<u8> {
    let mut w = Writer::new();
    dataclass(&mut w, METADATA_MODULE, "Metadata", |w| {
        w.empty_dict();
        w.mark();
        w.str("state_dict_metadata");
        w.empty_dict();
        w.mark();
        for item in items {
            w.str(&item.key);
            match &item.shape {
                Some(shape) => tensor_metadata(w, shape),
                None => {
                    w.global(METADATA_MODULE, "BytesStorageMetadata");
                    w.mark();
                    w.tuple();
                    w.new_obj();
                }
            }
        }
        w.set_items();
        w.str("planner_data");
        w.none();
        w.str("storage_data");
        w.empty_dict();
        w.mark();
        for item in items {
            dataclass(w, METADATA_MODULE, "MetadataIndex", |w| {
                w.empty_dict();
                w.mark();
                w.str("fqn");
                w.str(&item.key);
                if let Some(shape) = &item.shape {
                    w.str("offset");
                    size(w, &vec![0; shape.len()]);
                }
                w.str("index");
                w.none();
                w.set_items();
            });
            dataclass(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo", |w| {
                w.empty_dict();
                w.mark();
                w.str("relative_path");
                w.str(file);
                w.str("offset");
                w.int(item.place.0 as i64);
                w.str("length");
                w.int(item.place.1 as i64);
                w.set_items();
            });
        }
        w.set_items();
        w.str("version");
        w.str("1.0.0");
        w.set_items();
    });
    w.finish()
}

/// Megatron-LM's argument namespace for `full`: the model, a one-rank layout and the position.
pub fn args_namespace(full: &FullCheckpoint) -> Value {
    let m = &full.model;
    let a = &m.arch;
    let meta_count = |k: &str| full.meta.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let int = |v: usize| Value::Int(v as i64);
    let tanh_gelu = !a.swiglu && a.gelu == crate::device::Gelu::Tanh;
    let mut out: Vec<(String, Value)> = vec![
        ("num_layers".into(), int(m.num_layers)),
        ("hidden_size".into(), int(m.hidden_size)),
        ("ffn_hidden_size".into(), int(m.ffn_hidden_size)),
        ("num_attention_heads".into(), int(m.num_attention_heads)),
        ("kv_channels".into(), int(m.head_dim())),
        ("group_query_attention".into(), Value::Bool(a.num_query_groups.is_some())),
        ("num_query_groups".into(), int(m.kv_heads())),
        ("max_position_embeddings".into(), int(m.max_position_embeddings)),
        ("seq_length".into(), Value::Int(meta_count("seq_length"))),
        ("position_embedding_type".into(), Value::Str(a.position_name().into())),
        ("add_position_embedding".into(), Value::Bool(a.position_name() == "learned_absolute")),
        ("rotary_base".into(), Value::Float(a.rotary_base)),
        ("rotary_percent".into(), Value::Float(a.rotary_percent)),
        ("use_rope_scaling".into(), Value::Bool(a.rope_scaling)),
        (
            "normalization".into(),
            Value::Str(
                if a.normalization == crate::model::Normalization::RmsNorm { "RMSNorm" } else { "LayerNorm" }.into(),
            ),
        ),
        ("norm_epsilon".into(), Value::Float(a.norm_epsilon)),
        ("apply_layernorm_1p".into(), Value::Bool(a.zero_centered_gamma)),
        ("swiglu".into(), Value::Bool(a.swiglu)),
        ("add_bias_linear".into(), Value::Bool(a.add_bias_linear)),
        ("untie_embeddings_and_output_weights".into(), Value::Bool(a.untie_embeddings)),
        // Megatron's `--vocab-size` is NullTokenizer's, without its end-of-document id.
        (
            "vocab_size".into(),
            match full.meta.get("tokenizer").map(String::as_str) {
                Some("NullTokenizer") => int(m.vocab_size.saturating_sub(1)),
                _ => Value::None,
            },
        ),
        // The tanh GELU is Megatron-LM's fused bias-GELU (`--openai-gelu` in older versions); the
        // exact one runs unfused.
        ("openai_gelu".into(), Value::Bool(tanh_gelu)),
        ("bias_gelu_fusion".into(), Value::Bool(tanh_gelu)),
        ("padded_vocab_size".into(), int(m.padded_vocab_size)),
        ("make_vocab_size_divisible_by".into(), Value::Int(meta_count("make_vocab_size_divisible_by").max(1))),
        ("tensor_model_parallel_size".into(), Value::Int(1)),
        ("pipeline_model_parallel_size".into(), Value::Int(1)),
        ("virtual_pipeline_model_parallel_size".into(), Value::None),
        ("iteration".into(), Value::Int(full.iteration as i64)),
        ("consumed_train_samples".into(), Value::Int(meta_count("consumed_train_samples"))),
        ("consumed_valid_samples".into(), Value::Int(meta_count("consumed_valid_samples"))),
        ("seed".into(), Value::Int(meta_count("seed"))),
        ("ckpt_format".into(), Value::Str("torch_dist".into())),
        ("params_dtype".into(), Value::Str("float32".into())),
    ];
    if let Some(t) = full.meta.get("tokenizer") {
        out.push(("tokenizer_type".into(), Value::Str(t.clone())));
    }
    Value::Namespace(out)
}

/// Writes `full`'s weights as a torch_dist checkpoint of iteration `full.iteration` in `dir`
/// (one file of f32 tensors, megatron-core's keys), with the tracker; returns the iteration
/// directory. Written to a staging directory and renamed into place as trident's own checkpoints.
pub fn write(full: &FullCheckpoint, dir: &Path) -> Result<PathBuf> {
    let model: &GptConfig = &full.model;
    let a = &model.arch;
    if !a.swiglu && !a.add_bias_linear && a.gelu == crate::device::Gelu::Tanh {
        return Err(Error::Unsupported(
            "--save-megatron: a tanh-GELU MLP without biases has no Megatron-LM equivalent (its tanh GELU is \
             the fused bias-GELU, which needs fc1's bias; without one it computes the exact erf GELU)"
                .into(),
        ));
    }
    let file = "__0_0.distcp";
    let mut data = Vec::new();
    let mut items = Vec::new();
    let mut push = |key: String, shape: Option<Vec<usize>>, bytes: Vec<u8>, data: &mut Vec<u8>| {
        items.push(Item { key, shape, place: (data.len() as u64, bytes.len() as u64) });
        data.extend_from_slice(&bytes);
    };
    let mut stacked: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for info in model.parameters(&ModelParallel::single()) {
        let values = &full.tensors[&format!("param/{}", info.name)];
        match key_of(&info.name) {
            (key, None) => {
                let t = Value::Tensor { shape: info.full_shape.clone(), data: values.clone(), bf16: false };
                push(key, Some(info.full_shape.clone()), torch_file::save(&t, "archive"), &mut data);
            }
            (key, Some(_)) => {
                let entry = stacked.entry(key).or_insert_with(|| {
                    (std::iter::once(model.num_layers).chain(info.full_shape.iter().copied()).collect(), Vec::new())
                });
                entry.1.extend_from_slice(values);
            }
        }
    }
    for (key, (shape, values)) in stacked {
        let t = Value::Tensor { shape: shape.clone(), data: values, bf16: false };
        push(key, Some(shape), torch_file::save(&t, "archive"), &mut data);
    }
    for l in 0..model.num_layers {
        for module in EXTRA_STATE {
            let key = format!("decoder.layers.{module}._extra_state/shard_{l}_{}", model.num_layers);
            // megatron-core saves each layer's extra state as a one-item list; the local layers' is None.
            push(key, None, torch_file::save(&Value::List(vec![Value::None]), "archive"), &mut data);
        }
    }
    let common = Value::Dict(vec![
        ("args".into(), args_namespace(full)),
        ("checkpoint_version".into(), Value::Float(3.0)),
        ("iteration".into(), Value::Int(full.iteration as i64)),
        ("num_floating_point_operations_so_far".into(), Value::Int(0)),
    ]);
    crate::checkpoint::begin(dir, full.iteration)?;
    let staging = crate::checkpoint::staging_dir(dir, full.iteration);
    let backends = r#"{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}"#;
    for (name, bytes) in [
        (file, data),
        (".metadata", metadata_pickle(&items, file)),
        ("common.pt", torch_file::save(&common, "common")),
        ("metadata.json", backends.as_bytes().to_vec()),
    ] {
        crate::checkpoint::write_synced(&staging.join(name), &bytes)?;
    }
    crate::checkpoint::commit(dir, full.iteration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_scatter_into_place_once() {
        let size = [2, 4];
        assert!(inside(&size, &[(vec![0, 2], vec![2, 2])]));
        assert!(!inside(&size, &[(vec![0, 3], vec![2, 2])]), "outside");
        let (mut out, mut covered) = (vec![0.0; 8], vec![0u64; 1]);
        assert!(scatter(&mut out, &mut covered, &size, &[1.0, 2.0, 3.0, 4.0], &[0, 2], &[2, 2]));
        assert_eq!(out, [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0]);
        assert_eq!(covered[0], 0b1100_1100);
        assert!(!scatter(&mut out, &mut covered, &size, &[5.0, 6.0], &[1, 1], &[1, 2]), "an overlap");
    }

    #[test]
    fn the_metadata_written_reads_back() {
        let items = vec![
            Item { key: "w".into(), shape: Some(vec![3, 2]), place: (0, 10) },
            Item { key: "x/shard_0_1".into(), shape: None, place: (10, 5) },
        ];
        let bytes = metadata_pickle(&items, "__0_0.distcp");
        let p = Pickle::parse(&bytes, Path::new(".metadata")).unwrap();
        let md = parse_metadata(&p, Path::new(".metadata")).unwrap();
        assert_eq!(md.tensors.len(), 1);
        assert_eq!(
            (md.tensors["w"].size.clone(), md.tensors["w"].chunks.clone()),
            (vec![3, 2], vec![(vec![0, 0], vec![3, 2])])
        );
        assert_eq!(md.places[&("w".to_string(), vec![0, 0])], ("__0_0.distcp".to_string(), 0, 10));
    }
}
