//! The model's shape as checkpoint metadata: the keys every shard carries (written by `train`,
//! `convert` and the Hugging Face import) and the `GptConfig` read back from them (by resume,
//! `convert` and `generate`).

use super::Shard;
use crate::error::{Error, Result};
use crate::model::{Arch, GptConfig};
use std::path::Path;

/// The model shape as checkpoint metadata.
pub fn model_meta(m: &GptConfig) -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("num_layers", m.num_layers.to_string()),
        ("hidden_size", m.hidden_size.to_string()),
        ("num_attention_heads", m.num_attention_heads.to_string()),
        ("ffn_hidden_size", m.ffn_hidden_size.to_string()),
        ("max_position_embeddings", m.max_position_embeddings.to_string()),
        ("vocab_size", m.vocab_size.to_string()),
        ("padded_vocab_size", m.padded_vocab_size.to_string()),
    ];
    // The architecture's keys where it differs from GPT-2's (absent keys read back as GPT-2).
    out.extend(m.arch.metadata());
    out
}

/// The model shape recorded in a checkpoint, validated as a model given by flags is (a shape that
/// `GptConfig::validate` refuses is an error naming the shard).
pub fn model_from_shard(shard: &Shard, path: &Path) -> Result<GptConfig> {
    let cfg = GptConfig {
        num_layers: shard.meta_value(path, "num_layers")?,
        hidden_size: shard.meta_value(path, "hidden_size")?,
        num_attention_heads: shard.meta_value(path, "num_attention_heads")?,
        ffn_hidden_size: shard.meta_value(path, "ffn_hidden_size")?,
        max_position_embeddings: shard.meta_value(path, "max_position_embeddings")?,
        vocab_size: shard.meta_value(path, "vocab_size")?,
        padded_vocab_size: shard.meta_value(path, "padded_vocab_size")?,
        init_method_std: 0.02,
        arch: Arch::from_metadata(&|key| shard.meta.get(key).cloned())
            .map_err(|e| Error::format(path, e.to_string()))?,
    };
    cfg.validate().map_err(|e| Error::format(path, format!("the recorded model is not valid: {e}")))?;
    Ok(cfg)
}
