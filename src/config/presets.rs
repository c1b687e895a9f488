//! The model presets (`--preset`): a shape and a training recipe that works for it on this
//! hardware class, and the rule for Llama-family models on a GPU.

use crate::error::{Error, Result};
use crate::model::Arch;

/// A named model shape and a training recipe that works for it on this hardware class.
pub struct Preset {
    pub name: &'static str,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// None: 4 x hidden (GELU), or Megatron's SwiGLU default.
    pub ffn_hidden_size: Option<usize>,
    /// None: the byte tokenizer's 257.
    pub vocab_size: Option<usize>,
    pub arch: Arch,
    pub seq_length: usize,
    pub max_position_embeddings: usize,
    pub micro_batch_size: usize,
    pub global_batch_size: usize,
    pub train_iters: u64,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_iters: u64,
    pub eval_interval: u64,
    pub eval_iters: u64,
    pub log_interval: u64,
}

/// The small models train fast on a CPU: many short iterations, validated every 250.
const TINY: Preset = Preset {
    name: "tiny",
    num_layers: 4,
    hidden_size: 128,
    num_attention_heads: 4,
    ffn_hidden_size: None,
    vocab_size: None,
    arch: Arch::GPT2,
    seq_length: 128,
    max_position_embeddings: 128,
    micro_batch_size: 16,
    global_batch_size: 16,
    train_iters: 1500,
    lr: 2e-3,
    min_lr: 1e-4,
    warmup_iters: 100,
    eval_interval: 250,
    eval_iters: 20,
    log_interval: 50,
};

/// The GPT-2 sizes share one short recipe (1024 tokens, batch 8 in micro-batches of 1, 100
/// iterations); the larger ones differ in shape and learning rate.
const GPT2_124M: Preset = Preset {
    name: "gpt2-124m",
    num_layers: 12,
    hidden_size: 768,
    num_attention_heads: 12,
    ffn_hidden_size: None,
    vocab_size: None,
    arch: Arch::GPT2,
    seq_length: 1024,
    max_position_embeddings: 1024,
    micro_batch_size: 1,
    global_batch_size: 8,
    train_iters: 100,
    lr: 6e-4,
    min_lr: 6e-5,
    warmup_iters: 10,
    eval_interval: 50,
    eval_iters: 2,
    log_interval: 1,
};

pub const PRESETS: &[Preset] = &[
    TINY,
    Preset { name: "small", num_layers: 8, micro_batch_size: 2, ..TINY },
    GPT2_124M,
    Preset {
        name: "gpt2-350m",
        num_layers: 24,
        hidden_size: 1024,
        num_attention_heads: 16,
        lr: 3e-4,
        min_lr: 3e-5,
        ..GPT2_124M
    },
    Preset {
        name: "gpt2-760m",
        num_layers: 24,
        hidden_size: 1536,
        num_attention_heads: 16,
        lr: 2.5e-4,
        min_lr: 2.5e-5,
        ..GPT2_124M
    },
    Preset {
        name: "gpt2-1.5b",
        num_layers: 48,
        hidden_size: 1600,
        num_attention_heads: 25,
        lr: 2e-4,
        min_lr: 2e-5,
        ..GPT2_124M
    },
    LLAMA_TINY,
    // A Llama with GPT-2 124M's sizes (12 x 768, 12 heads in 4 groups, the SwiGLU width of a
    // 4 x 768 GELU MLP's weights): the CPU step compared with gpt2-124m's.
    Preset {
        name: "llama-124m",
        ffn_hidden_size: Some(2048),
        arch: Arch { num_query_groups: Some(4), ..Arch::LLAMA },
        ..GPT2_124M
    },
    LLAMA3_8B,
    Preset {
        name: "llama3-70b",
        num_layers: 80,
        hidden_size: 8192,
        num_attention_heads: 64,
        ffn_hidden_size: Some(28672),
        lr: 1.5e-4,
        min_lr: 1.5e-5,
        ..LLAMA3_8B
    },
];

/// Llama 3's shapes (8B and 70B: grouped-query attention over 8 key/value heads, SwiGLU,
/// rotary positions with base 500000, a 128256-token vocabulary, 8192 positions), with the GPT-2
/// sizes' short recipe, for `plan`, the benchmarks and continued training.
const LLAMA3_8B: Preset = Preset {
    name: "llama3-8b",
    num_layers: 32,
    hidden_size: 4096,
    num_attention_heads: 32,
    ffn_hidden_size: Some(14336),
    vocab_size: Some(128256),
    arch: Arch { num_query_groups: Some(8), rotary_base: 500000.0, ..Arch::LLAMA },
    seq_length: 8192,
    max_position_embeddings: 8192,
    lr: 3e-4,
    min_lr: 3e-5,
    ..GPT2_124M
};

/// The small Llamas train on a CPU like tiny and small: grouped-query attention with 2 heads per
/// key/value head, SwiGLU, rotary positions, untied output layer, no linear biases.
const LLAMA_TINY: Preset = Preset {
    name: "llama-tiny",
    ffn_hidden_size: Some(352),
    arch: Arch { num_query_groups: Some(2), ..Arch::LLAMA },
    ..TINY
};

/// Whether `what` (`train`, `bench step`) may run a model with the Llama-family `features` (none:
/// GPT-2) on `--device device`: on the CPU always; on a GPU (CUDA or HIP, whose kernels run
/// RMSNorm, SwiGLU, rotary embedding and grouped-query attention on 16-bit activations) with
/// `sixteen_bit` activations (`--bf16` or `--fp16`). One clear error otherwise, before any GPU
/// library is looked for.
pub fn llama_on_device(what: &str, device: &str, features: &[&str], sixteen_bit: bool) -> Result<()> {
    if features.is_empty() || sixteen_bit || !matches!(device, "cuda" | "hip") {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{what} --device {device} with {} needs --bf16 or --fp16 (the Llama-family kernels take 16-bit activations)",
        features.join(", ")
    )))
}

pub fn preset(name: &str) -> Result<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
        Error::flag("--preset", format!("'{name}'"), format!("one of {}", names.join(", ")))
    })
}
