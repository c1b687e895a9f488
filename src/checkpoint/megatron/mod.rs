//! Megatron-LM's checkpoints, read and written without Python: the `torch_dist` format
//! (`dist`: megatron-core's `dist_checkpointing` over PyTorch's distributed checkpoint, global
//! tensors in chunks) and the legacy `torch` format (`legacy`: one `torch.save` file per
//! model-parallel rank, `mp_rank_TT[_PPP]/model_optim_rng.pt`). Both hold the argument namespace
//! of the run that wrote them, from which the model, the layout and the run's position are taken
//! (`args_meta`); the weights are reassembled into a `FullCheckpoint` under trident's names, which
//! are megatron-core's own. AdamW's moments, step and master weights come along from
//! megatron-core's non-distributed optimizer (per parameter) and its distributed optimizer (its
//! gradient buffers, `buffer`), in both formats; a layout neither reader places leaves the
//! optimizer to start fresh, as `--no-load-optim` does, and the run says so.
//!
//! Every file is untrusted: PyTorch's pickles are parsed, never executed (`pickle`); a file a
//! checkpoint names stays inside its directory; every size is checked against the bytes the files
//! hold before anything that size is allocated.

pub mod buffer;
pub mod dist;
pub mod legacy;
pub mod pickle;
pub mod torch_file;
pub mod zip;

use super::convert::{FullCheckpoint, Layout};
use crate::error::{Error, Result};
use crate::model::GptConfig;
use pickle::{Id, Node, Pickle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which of Megatron's formats an iteration directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    TorchDist,
    Legacy,
}

/// The Megatron format in `iter_dir`, if any: `.metadata` (torch_dist) or an
/// `mp_rank_*/model_optim_rng.pt` (legacy).
pub fn format_of(iter_dir: &Path) -> Option<Format> {
    if iter_dir.join(".metadata").is_file() {
        return Some(Format::TorchDist);
    }
    let entries = std::fs::read_dir(iter_dir).ok()?;
    let legacy = entries.flatten().any(|e| e.path().join("model_optim_rng.pt").is_file());
    legacy.then_some(Format::Legacy)
}

/// The iteration directory the tracker in `dir` names: `iter_NNNNNNN`, or `release` for a
/// released (converted) checkpoint, as Megatron names them.
pub fn latest_dir(dir: &Path) -> Result<(u64, PathBuf)> {
    let tracker = dir.join(super::TRACKER);
    let bytes = crate::files::read_regular(&tracker, "read")?;
    let text = String::from_utf8_lossy(&bytes);
    match text.trim() {
        "release" => Ok((0, dir.join("release"))),
        t => {
            let n = t.parse().map_err(|_| {
                Error::format(&tracker, format!("expected an iteration number or 'release', found '{t}'"))
            })?;
            Ok((n, super::iteration_dir(dir, n)))
        }
    }
}

/// Megatron's flags that change the model in ways trident does not build, with what each needs.
const REFUSED: [(&str, &str); 7] = [
    ("num_experts", "mixtures of experts"),
    ("qk_layernorm", "LayerNorm on queries and keys"),
    ("multi_latent_attention", "multi-latent attention"),
    ("rotary_interleaved", "interleaved rotary embeddings"),
    ("squared_relu", "the squared-ReLU MLP"),
    ("mtp_num_layers", "multi-token prediction"),
    ("add_qkv_bias", "a QKV bias without the other linear biases"),
];

/// Reads the argument namespace `args` of a Megatron checkpoint as trident's checkpoint metadata:
/// the model (`shape::model_meta`'s keys), the run's position, and the layout it was saved in.
pub fn args_meta(p: &Pickle, args: Id, path: &Path) -> Result<BTreeMap<String, String>> {
    if p.class(args) != Some(("argparse", "Namespace")) {
        return Err(Error::format(path, "'args' is not Megatron-LM's argument namespace (argparse.Namespace)"));
    }
    let field = |name: &str| p.get(args, name).map(|id| p.node(id)).filter(|n| **n != Node::None);
    let count = |name: &str| -> Result<Option<usize>> {
        match field(name) {
            None => Ok(None),
            Some(Node::Int(v)) if *v >= 0 => Ok(Some(*v as usize)),
            Some(other) => Err(Error::format(path, format!("args.{name} is {other:?}, not a count"))),
        }
    };
    let need = |name: &str| count(name)?.ok_or_else(|| Error::format(path, format!("args.{name} is missing")));
    let flag = |name: &str| matches!(field(name), Some(Node::Bool(true)));
    let number = |name: &str| match field(name) {
        Some(Node::Float(v)) => Some(*v),
        Some(Node::Int(v)) => Some(*v as f64),
        _ => None,
    };
    let text = |name: &str| match field(name) {
        Some(Node::Str(s)) => Some(s.clone()),
        _ => None,
    };
    for (name, what) in REFUSED {
        let set = match field(name) {
            Some(Node::Bool(b)) => *b,
            Some(Node::Int(v)) => *v > 0,
            Some(_) => true,
            None => false,
        };
        // Megatron's own QKV bias flag is set whenever the linear biases are.
        if set && !(name == "add_qkv_bias" && flag("add_bias_linear")) {
            return Err(Error::Unsupported(format!(
                "{}: the checkpoint's model uses {what} (args.{name}), which trident does not build",
                path.display()
            )));
        }
    }
    let (hidden, heads) = (need("hidden_size")?, need("num_attention_heads")?);
    let padded = need("padded_vocab_size")?;
    let mut meta = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        meta.insert(k.to_string(), v);
    };
    for key in ["num_layers", "ffn_hidden_size", "max_position_embeddings", "seq_length"] {
        put(key, need(key)?.to_string());
    }
    put("hidden_size", hidden.to_string());
    put("num_attention_heads", heads.to_string());
    put("padded_vocab_size", padded.to_string());
    // Megatron keeps the padded vocabulary alone; `--vocab-size` is NullTokenizer's, which adds
    // the end-of-document id. Otherwise the real size is unknown here: the padded one stands in,
    // and a run loading the checkpoint takes its own tokenizer's where the padded sizes agree.
    let null_vocab = match (text("tokenizer_type").as_deref(), count("vocab_size")?) {
        (Some("NullTokenizer"), Some(v)) => Some(v + 1),
        _ => None,
    };
    put("vocab_size", null_vocab.filter(|&v| v <= padded).unwrap_or(padded).to_string());
    if let Some(t) = text("tokenizer_type") {
        put("tokenizer", t);
    }
    if let Some(norm) = text("normalization") {
        put("normalization", norm);
    }
    for (key, v) in [("norm_epsilon", number("norm_epsilon")), ("rotary_base", number("rotary_base"))] {
        if let Some(v) = v {
            put(key, format!("{v}"));
        }
    }
    if let Some(v) = number("rotary_percent") {
        put("rotary_percent", format!("{v}"));
    }
    if let Some(pos) = text("position_embedding_type") {
        put("position_embedding_type", pos);
    }
    for key in ["swiglu", "use_rope_scaling", "untie_embeddings_and_output_weights", "apply_layernorm_1p"] {
        if flag(key) {
            put(key, "true".into());
        }
    }
    // Megatron-LM's fused bias-GELU (its default where fc1 has a bias) is the tanh form, as
    // `--openai-gelu` is; unfused, the GELU is PyTorch's exact erf one.
    let fused = field("bias_gelu_fusion").is_none_or(|_| flag("bias_gelu_fusion"))
        && field("add_bias_linear").is_none_or(|_| flag("add_bias_linear"));
    if !flag("swiglu") && !flag("openai_gelu") && !fused {
        put("gelu_erf", "true".into());
    }
    if field("add_bias_linear").is_some() && !flag("add_bias_linear") {
        put("disable_bias_linear", "true".into());
    }
    // Megatron records the defaults it filled in; trident records only what differs from them.
    if let Some(g) = count("num_query_groups")?.filter(|&g| flag("group_query_attention") && g != heads) {
        put("num_query_groups", g.to_string());
    }
    if let Some(k) = count("kv_channels")?.filter(|&k| heads == 0 || k != hidden / heads) {
        put("kv_channels", k.to_string());
    }
    let position = [
        ("consumed_train_samples", count("consumed_train_samples")?),
        ("consumed_valid_samples", count("consumed_valid_samples")?),
        ("seed", count("seed")?),
        ("make_vocab_size_divisible_by", count("make_vocab_size_divisible_by")?),
    ];
    for (key, v) in position {
        put(key, v.unwrap_or(0).to_string());
    }
    put("tensor_model_parallel_size", count("tensor_model_parallel_size")?.unwrap_or(1).to_string());
    put("pipeline_model_parallel_size", count("pipeline_model_parallel_size")?.unwrap_or(1).to_string());
    put("virtual_pipeline_chunks", count("virtual_pipeline_model_parallel_size")?.unwrap_or(1).to_string());
    for key in ["decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"] {
        put(key, count(key)?.map_or("none".into(), |n| n.to_string()));
    }
    Ok(meta)
}

/// A step count `what` saved as an int, a float or a one-element tensor.
pub fn step_count(file: &torch_file::TorchFile, step: Id, what: &str) -> Result<u64> {
    let p = &file.pickle;
    let value = match p.int(step) {
        Some(v) => v as f64,
        None if file.is_tensor(step) => {
            let t = file.tensor(step, what)?;
            *t.data.first().ok_or_else(|| Error::format(&file.path, format!("an empty {what}")))? as f64
        }
        None => match p.node(step) {
            Node::Float(v) => *v,
            other => return Err(Error::format(&file.path, format!("{what} is {other:?}, not a count"))),
        },
    };
    if !(0.0..=1e15).contains(&value) || value.fract() != 0.0 {
        return Err(Error::format(&file.path, format!("{what} {value} is not a step count")));
    }
    Ok(value as u64)
}

/// The model a Megatron checkpoint's metadata (`args_meta`) describes, validated.
pub fn model_of(meta: &BTreeMap<String, String>, path: &Path) -> Result<GptConfig> {
    let shard = super::Shard { meta: meta.clone(), tensors: Vec::new() };
    super::shape::model_from_shard(&shard, path)
}

/// The layout a Megatron checkpoint was saved in, from `args_meta`'s keys.
pub fn layout_of(meta: &BTreeMap<String, String>, model: &GptConfig, path: &Path) -> Result<Layout> {
    let n = |k: &str| meta.get(k).and_then(|v| v.parse::<usize>().ok());
    let layout = Layout {
        v: false,
        tp: n("tensor_model_parallel_size").unwrap_or(1),
        pp: n("pipeline_model_parallel_size").unwrap_or(1),
        chunks: n("virtual_pipeline_chunks").unwrap_or(1),
        first_stage_layers: n("decoder_first_pipeline_num_layers"),
        last_stage_layers: n("decoder_last_pipeline_num_layers"),
        sequence_parallel: false,
        summa: None,
    };
    layout.validate(model).map_err(|e| Error::format(path, format!("the layout in args: {e}")))?;
    Ok(layout)
}

/// Megatron's name of trident's parameter `name` inside a layer, where megatron-core fuses a norm
/// into the linear layer after it (Transformer Engine's modules, and every `torch_dist`
/// checkpoint): `input_layernorm.weight` is `self_attention.linear_qkv.layer_norm_weight`.
pub fn fused_norm_name(suffix: &str) -> Option<String> {
    let (module, param) = suffix.rsplit_once('.')?;
    let into = match module {
        "input_layernorm" => "self_attention.linear_qkv",
        "pre_mlp_layernorm" => "mlp.linear_fc1",
        _ => return None,
    };
    Some(format!("{into}.layer_norm_{param}"))
}

/// A trident parameter name split into its layer and the rest: `decoder.layers.3.mlp...` is
/// `(Some(3), "mlp...")`; a parameter outside the layers is `(None, name)`.
pub fn split_layer(name: &str) -> (Option<usize>, &str) {
    if let Some(rest) = name.strip_prefix("decoder.layers.") {
        if let Some((l, suffix)) = rest.split_once('.') {
            if let Ok(l) = l.parse() {
                return (Some(l), suffix);
            }
        }
    }
    (None, name)
}

/// Whether a key of a Megatron state dict is the model's (not optimizer, RNG or bookkeeping).
pub fn is_model_key(key: &str) -> bool {
    ["embedding.", "decoder.", "output_layer.", "mtp."].iter().any(|p| key.starts_with(p))
        && !key.contains("_extra_state")
}

/// The Megatron checkpoint in `iter_dir` (of `format`; the tracker's iteration `iteration`) as full
/// tensors under trident's names (the weights, and AdamW's moments where they map; else
/// `optimizer_state` none), with its model, position and layout in the metadata.
fn read(iter_dir: &Path, format: Format, iteration: u64) -> Result<FullCheckpoint> {
    let mut full = match format {
        Format::TorchDist => dist::read(iter_dir)?,
        Format::Legacy => legacy::read(iter_dir)?,
    };
    if full.iteration == u64::MAX {
        full.iteration = iteration;
    }
    // The moments, where they were mapped (`dist`), come with their step; else the weights alone.
    if !full.tensors.keys().any(|k| k.starts_with("adam_m/")) {
        full.meta.insert("optimizer_state".into(), "none".into());
        full.meta.insert("adam_step".into(), "0".into());
    }
    for (k, v) in [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", full.iteration.to_string()),
        ("imported_from", format!("Megatron-LM {}", iter_dir.display())),
    ] {
        full.meta.insert(k.into(), v);
    }
    Ok(full)
}

/// The latest checkpoint in `dir` when it is Megatron-LM's, with its iteration directory; None
/// when `dir` holds no tracker or its iteration directory holds no Megatron files (trident's own
/// checkpoint).
pub fn read_if_megatron(dir: &Path) -> Result<Option<(PathBuf, FullCheckpoint)>> {
    if !dir.join(super::TRACKER).is_file() {
        return Ok(None);
    }
    let Ok((iteration, iter_dir)) = latest_dir(dir) else { return Ok(None) };
    match format_of(&iter_dir) {
        Some(format) => Ok(Some((iter_dir.clone(), read(&iter_dir, format, iteration)?))),
        None => Ok(None),
    }
}

/// The metadata (`args_meta`) of the latest checkpoint in `dir` when it is Megatron-LM's, read
/// from its saved arguments alone (`common.pt`, or the first rank's file without its tensors),
/// once its files are known to hold the model they describe: what `--use-checkpoint-args` takes
/// before the model exists. None for trident's own checkpoints.
pub fn saved_args(dir: &Path) -> Result<Option<(PathBuf, BTreeMap<String, String>)>> {
    if !dir.join(super::TRACKER).is_file() {
        return Ok(None);
    }
    let Ok((_, iter_dir)) = latest_dir(dir) else { return Ok(None) };
    let path = match format_of(&iter_dir) {
        None => return Ok(None),
        Some(Format::TorchDist) => iter_dir.join("common.pt"),
        Some(Format::Legacy) => legacy::first_file(&iter_dir),
    };
    let file = crate::files::open_regular(&path, "read Megatron checkpoint")?;
    // Safety: read-only; a file changed under the read gives a format error or wrong values.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&path, "map", e))?;
    let (meta, _, model) = saved_run(&torch_file::TorchFile::parse(&bytes, &path)?, &path)?;
    let mut held = 0u64;
    for entry in walk_files(&iter_dir)? {
        held += std::fs::metadata(&entry).map_err(|e| Error::io(&entry, "read", e))?.len();
    }
    ensure_files_hold(&model, held, &iter_dir)?;
    Ok(Some((path, meta)))
}

/// The regular files of an iteration directory and of its rank directories (one level down).
fn walk_files(iter_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let list = |d: &Path| std::fs::read_dir(d).map_err(|e| Error::io(d, "list", e));
    for entry in list(iter_dir)?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(list(&path)?.flatten().map(|e| e.path()).filter(|p| p.is_file()));
        } else if path.is_file() {
            out.push(path);
        }
    }
    Ok(out)
}

/// What a Megatron state dict's saved arguments say (`args_meta`), the iteration it records
/// (`iteration_of`) and the model they describe (`model_of`); `file` was read from `path`.
pub fn saved_run(file: &torch_file::TorchFile, path: &Path) -> Result<(BTreeMap<String, String>, u64, GptConfig)> {
    let p = &file.pickle;
    let args = p.get(p.root, "args").ok_or_else(|| Error::format(path, "no 'args': not a Megatron-LM checkpoint"))?;
    // Version 3.0 (Megatron-LM since 2020) holds QKV as [q heads of a group, k, v] per group;
    // earlier versions ordered the rows otherwise.
    let version = p.get(p.root, "checkpoint_version").map(|v| p.node(v));
    let version = match version {
        None => None,
        Some(Node::Float(v)) => Some(*v),
        Some(Node::Int(v)) => Some(*v as f64),
        Some(other) => return Err(Error::format(path, format!("checkpoint_version is {other:?}, not a number"))),
    };
    if let Some(v) = version.filter(|&v| v < 3.0) {
        return Err(Error::Unsupported(format!(
            "{}: checkpoint_version {v}; trident reads version 3.0 (Megatron-LM's since 2020), whose QKV rows \
             are grouped per query group: load and save it once with Megatron-LM to upgrade it",
            path.display()
        )));
    }
    let meta = args_meta(p, args, path)?;
    let iteration = iteration_of(p, path)?;
    let model = model_of(&meta, path)?;
    Ok((meta, iteration, model))
}

/// The iteration a Megatron state dict records (`iteration`), or `u64::MAX` to take the tracker's.
pub fn iteration_of(p: &Pickle, path: &Path) -> Result<u64> {
    match p.get(p.root, "iteration").map(|id| p.node(id)) {
        None => Ok(u64::MAX),
        Some(Node::Int(v)) if *v >= 0 => Ok(*v as u64),
        Some(other) => Err(Error::format(path, format!("'iteration' is {other:?}, not a count"))),
    }
}

/// Checks that `held` bytes of checkpoint files can hold `model`'s weights at 2 bytes each (bf16,
/// the narrowest Megatron writes) before they are allocated as f32.
pub fn ensure_files_hold(model: &GptConfig, held: u64, what: &Path) -> Result<()> {
    let params = model.parameter_count().unwrap_or(usize::MAX) as u64;
    if held < params.saturating_mul(2) {
        return Err(Error::format(
            what,
            format!("the arguments describe {params} parameters, but the files hold {held} bytes in all"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_checkpoint_versions_and_unbuilt_models_are_refused() {
        use torch_file::Value;
        let args = |extra: Vec<(String, Value)>| {
            let mut fields: Vec<(String, Value)> = [
                ("num_layers", 2),
                ("hidden_size", 8),
                ("num_attention_heads", 2),
                ("ffn_hidden_size", 32),
                ("max_position_embeddings", 16),
                ("seq_length", 16),
                ("padded_vocab_size", 64),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::Int(v)))
            .collect();
            fields.extend(extra);
            Value::Namespace(fields)
        };
        let run = |version: f64, extra: Vec<(String, Value)>| {
            let state = Value::Dict(vec![
                ("args".into(), args(extra)),
                ("checkpoint_version".into(), Value::Float(version)),
                ("iteration".into(), Value::Int(5)),
            ]);
            let bytes = torch_file::save(&state, "common");
            let file = torch_file::TorchFile::parse(&bytes, Path::new("common.pt")).unwrap();
            saved_run(&file, Path::new("common.pt")).map(|(meta, it, model)| (meta, it, model.num_layers))
        };
        let (meta, iteration, layers) = run(3.0, vec![]).unwrap();
        assert_eq!((iteration, layers, meta["vocab_size"].as_str()), (5, 2, "64"));
        assert!(run(2.0, vec![]).unwrap_err().to_string().contains("checkpoint_version 2"));
        let experts = run(3.0, vec![("num_experts".into(), Value::Int(8))]).unwrap_err().to_string();
        assert!(experts.contains("mixtures of experts"), "{experts}");
    }

    #[test]
    fn names_map_both_ways() {
        assert_eq!(fused_norm_name("input_layernorm.weight").unwrap(), "self_attention.linear_qkv.layer_norm_weight");
        assert_eq!(fused_norm_name("pre_mlp_layernorm.bias").unwrap(), "mlp.linear_fc1.layer_norm_bias");
        assert_eq!(fused_norm_name("mlp.linear_fc1.weight"), None);
        assert_eq!(split_layer("decoder.layers.12.mlp.linear_fc2.weight"), (Some(12), "mlp.linear_fc2.weight"));
        assert_eq!(split_layer("decoder.final_layernorm.weight"), (None, "decoder.final_layernorm.weight"));
        assert!(is_model_key("decoder.layers.mlp.linear_fc1.weight"));
        assert!(!is_model_key("decoder.layers.mlp.linear_fc1._extra_state/shard_0_4"));
        assert!(!is_model_key("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight"));
    }
}
