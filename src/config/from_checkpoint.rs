//! `--use-checkpoint-args`: the model's shape, sequence length and tokenizer taken from the
//! checkpoint `--load` names (its metadata and the tokenizer saved beside it), as Megatron takes
//! them from a checkpoint's saved arguments. Flags given beside it still apply on top; one that
//! contradicts the checkpoint is refused when the checkpoint loads, naming the key.

use super::presets::Preset;
use crate::checkpoint::tokenizer::Flags;
use crate::cli::Args;
use crate::error::{Error, Result};
use crate::model::GptConfig;

/// What a checkpoint says of the run that wrote it.
pub(super) struct CheckpointArgs {
    pub model: GptConfig,
    pub seq_length: usize,
    /// The tokenizer flags saved beside the checkpoints; None for the byte tokenizer.
    pub tokenizer: Option<Flags>,
    /// Where it came from, for the start-up line.
    pub path: std::path::PathBuf,
}

/// The checkpoint's arguments under `--use-checkpoint-args`; None without the flag, or when
/// `--load` holds no checkpoint yet (a first run: the flags give the model, and `notes` says so).
pub(super) fn checkpoint_args(args: &Args, notes: &mut Vec<String>) -> Result<Option<CheckpointArgs>> {
    if !args.has("--use-checkpoint-args") {
        return Ok(None);
    }
    let load = args.path("--load").ok_or_else(|| Error::Usage("--use-checkpoint-args needs --load DIR".into()))?;
    let holds = |dir: &std::path::Path| dir.join("latest_checkpointed_iteration.txt").exists();
    // While --load holds nothing, the run starts from --pretrained-checkpoint: its arguments.
    let pretrained = args.path("--pretrained-checkpoint").filter(|p| holds(p));
    let load = match (holds(&load), pretrained) {
        (true, _) => load,
        (false, Some(p)) => p,
        (false, None) => {
            notes.push(format!(
                "--use-checkpoint-args: no checkpoint in {} yet, so the flags give the model (as in Megatron)",
                load.display()
            ));
            return Ok(None);
        }
    };
    // A Megatron-LM checkpoint's arguments (its files already checked to hold the model).
    let megatron = crate::checkpoint::megatron::saved_args(&load)?;
    let is_megatron = megatron.is_some();
    let (path, meta) = match megatron {
        Some(found) => found,
        None => crate::checkpoint::latest_metadata(&load)?,
    };
    let shard = crate::checkpoint::Shard { meta, tensors: Vec::new() };
    let model = crate::checkpoint::shape::model_from_shard(&shard, &path)?;
    // The model is built before its shards are read and checked: a crafted header must not size
    // it beyond what the checkpoint's shards hold (`convert`'s check).
    if !is_megatron {
        crate::checkpoint::convert::recorded_layout(&shard, &path, &model)?;
    }
    let seq_length = shard.meta_value(&path, "seq_length")?;
    let tokenizer = crate::checkpoint::tokenizer::saved_flags(&load)?;
    Ok(Some(CheckpointArgs { model, seq_length, tokenizer, path }))
}

/// `base`'s training recipe with the checkpoint's model and sequence length.
pub(super) fn preset_for(base: &Preset, c: &CheckpointArgs) -> Preset {
    let m = &c.model;
    Preset {
        name: base.name,
        num_layers: m.num_layers,
        hidden_size: m.hidden_size,
        num_attention_heads: m.num_attention_heads,
        ffn_hidden_size: Some(m.ffn_hidden_size),
        vocab_size: Some(m.vocab_size),
        arch: m.arch.clone(),
        seq_length: c.seq_length,
        max_position_embeddings: m.max_position_embeddings,
        ..*base
    }
}
