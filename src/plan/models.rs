//! Model shapes `trident plan --model NAME` knows: trident's presets (with GPT-2's vocabulary for
//! the GPT-2 sizes), the rows of Megatron's 2021 weak-scaling table (Narayanan et al., arXiv
//! 2104.04473, Table 1: sequence 2048, vocabulary 51,200) and GPT-3 175B.

use crate::config::PRESETS;
use crate::data::tokenizer::ByteTokenizer;
use crate::error::{Error, Result};
use crate::model::{Arch, GptConfig, Normalization, PositionEmbedding};

/// A transformer's shape, enough to price it: the sizes, and the architecture's choices that
/// change weights, activations and FLOPs (grouped-query attention, SwiGLU, untied output layer,
/// RMSNorm, linear biases, learned or rotary positions).
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub ffn_hidden_size: usize,
    pub seq_length: usize,
    /// Rows of the position embedding (a learned one only; rotary positions have none).
    pub max_position_embeddings: usize,
    /// The tokenizer's vocabulary, before padding.
    pub vocab_size: usize,
    /// `--make-vocab-size-divisible-by`: the vocabulary pads to a multiple of it times the
    /// tensor-parallel size, as `train` pads it.
    pub vocab_divisible_by: usize,
    pub arch: Arch,
}

impl Shape {
    /// Rows of the word embedding on `tp` tensor-parallel ranks (the whole grid under 2-D /
    /// 2.5-D): Megatron's padding to a multiple of `vocab_divisible_by` x `tp`.
    pub fn padded_vocab_size(&self, tp: usize) -> usize {
        GptConfig::pad_vocab(self.vocab_size, self.vocab_divisible_by * tp)
    }

    /// Parameters of one norm: a weight, and LayerNorm's bias.
    pub fn norm_parameters(&self) -> f64 {
        let per_channel = if self.arch.normalization == Normalization::LayerNorm { 2.0 } else { 1.0 };
        per_channel * self.hidden_size as f64
    }

    /// Weights and biases of one layer: QKV, projection, fc1, fc2 (each with its bias unless
    /// `--disable-bias-linear`), two norms. GPT-2's is 4h² + 2hf + 9h + f.
    pub fn layer_parameters(&self) -> f64 {
        let (h, f) = (self.hidden_size as f64, self.ffn_hidden_size as f64);
        let m = self.model();
        let (qkv, aw, fc1) = (m.qkv_rows() as f64, m.attention_width() as f64, m.fc1_rows() as f64);
        let weights = h * qkv + aw * h + h * fc1 + f * h;
        let biases = if self.arch.add_bias_linear { qkv + h + fc1 + h } else { 0.0 };
        weights + biases + 2.0 * self.norm_parameters()
    }

    /// Parameters of one layer that 1-D tensor parallelism replicates: the two norms and the
    /// biases of the row-parallel projection and fc2.
    pub fn layer_replicated_parameters(&self) -> f64 {
        let biases = if self.arch.add_bias_linear { 2.0 * self.hidden_size as f64 } else { 0.0 };
        2.0 * self.norm_parameters() + biases
    }

    /// Rows of the learned position embedding (none under rotary or no positions).
    pub fn position_rows(&self) -> usize {
        match self.arch.position_embedding {
            PositionEmbedding::LearnedAbsolute => self.max_position_embeddings,
            _ => 0,
        }
    }

    /// The model this shape prices (its vocabulary padded as on one rank): its widths (head
    /// dimension, key/value heads, QKV and fc1 rows, attention width) are the planner's.
    pub fn model(&self) -> GptConfig {
        GptConfig {
            num_layers: self.num_layers,
            hidden_size: self.hidden_size,
            num_attention_heads: self.num_attention_heads,
            ffn_hidden_size: self.ffn_hidden_size,
            max_position_embeddings: self.max_position_embeddings,
            vocab_size: self.vocab_size,
            padded_vocab_size: self.padded_vocab_size(1),
            init_method_std: 0.02,
            arch: self.arch.clone(),
        }
    }

    /// Parameters of the whole model: the layers, the word embedding padded as on one rank (and
    /// the output layer when untied; a tied one is counted once), the position table, the final
    /// norm.
    pub fn parameters(&self) -> f64 {
        let h = self.hidden_size as f64;
        let word = self.padded_vocab_size(1) as f64 * h * if self.arch.untie_embeddings { 2.0 } else { 1.0 };
        self.num_layers as f64 * self.layer_parameters()
            + word
            + self.position_rows() as f64 * h
            + self.norm_parameters()
    }
}

/// (name, layers, hidden, heads) of Megatron's 2021 weak-scaling rows; sequence 2048, vocab 51200.
pub const MEGATRON_2021: &[(&str, usize, usize, usize)] = &[
    ("megatron-1.7b", 24, 2304, 24),
    ("megatron-3.6b", 30, 3072, 32),
    ("megatron-7.5b", 36, 4096, 32),
    ("megatron-18.4b", 40, 6144, 48),
    ("megatron-39.1b", 48, 8192, 64),
    ("megatron-76.1b", 60, 10240, 80),
    ("megatron-145.6b", 80, 12288, 96),
    ("megatron-310.1b", 96, 16384, 128),
    ("megatron-529.6b", 105, 20480, 128),
    ("megatron-1t", 128, 25600, 160),
];

fn gpt(layers: usize, hidden: usize, heads: usize, seq: usize, vocab: usize) -> Shape {
    Shape {
        num_layers: layers,
        hidden_size: hidden,
        num_attention_heads: heads,
        ffn_hidden_size: 4 * hidden,
        seq_length: seq,
        max_position_embeddings: seq,
        vocab_size: vocab,
        vocab_divisible_by: 128,
        arch: Arch::GPT2,
    }
}

/// Every name `--model` accepts.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).chain(MEGATRON_2021.iter().map(|r| r.0)).chain(["gpt3-175b"]).collect()
}

/// The shape called `name`.
pub fn named(name: &str) -> Result<Shape> {
    if let Some(&(_, l, h, a)) = MEGATRON_2021.iter().find(|r| r.0 == name) {
        return Ok(gpt(l, h, a, 2048, 51200));
    }
    if name == "gpt3-175b" {
        // GPT-3's 50,257 tokens.
        return Ok(gpt(96, 12288, 96, 2048, 50257));
    }
    if let Some(p) = PRESETS.iter().find(|p| p.name == name) {
        // A preset's own vocabulary (Llama 3's), else GPT-2's for the 124M-and-up sizes and the
        // bytes' for the small models that train on the bundled corpus.
        let bytes = matches!(p.name, "tiny" | "small" | "llama-tiny");
        let vocab = p.vocab_size.unwrap_or(if bytes { ByteTokenizer::VOCAB_SIZE } else { 50257 });
        return Ok(Shape {
            ffn_hidden_size: p.ffn_hidden_size.unwrap_or(4 * p.hidden_size),
            max_position_embeddings: p.max_position_embeddings,
            arch: p.arch.clone(),
            ..gpt(p.num_layers, p.hidden_size, p.num_attention_heads, p.seq_length, vocab)
        });
    }
    Err(Error::flag("--model", format!("'{name}'"), format!("one of {}", names().join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_rows_have_the_papers_parameter_counts() {
        // Table 1 of the paper, in billions.
        let expected = [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0];
        for (row, want) in MEGATRON_2021.iter().zip(expected) {
            let got = named(row.0).unwrap().parameters() / 1e9;
            assert!((got - want).abs() / want < 0.03, "{}: {got:.3}B, paper {want}B", row.0);
        }
    }

    // As `train` pads (config::tests): GPT-3's 50,257 ids are 50,304 rows on one rank and 51,200
    // on eight; the paper's 51,200 stays 51,200 up to TP 8.
    #[test]
    fn the_vocabulary_pads_by_the_tensor_parallel_size() {
        let gpt3 = named("gpt3-175b").unwrap();
        assert_eq!([1, 2, 8].map(|t| gpt3.padded_vocab_size(t)), [50304, 50432, 51200]);
        let row = named("megatron-1t").unwrap();
        assert_eq!([1, 8].map(|t| row.padded_vocab_size(t)), [51200, 51200]);
    }

    #[test]
    fn llama_3_shapes_have_their_published_parameter_counts() {
        // Meta's model cards: 8,030,261,248 and 70,553,706,496 parameters.
        assert_eq!(named("llama3-8b").unwrap().parameters(), 8_030_261_248.0);
        assert_eq!(named("llama3-70b").unwrap().parameters(), 70_553_706_496.0);
    }

    #[test]
    fn every_preset_has_the_models_own_parameter_count() {
        // The planner's formula against the model's parameter list, preset by preset (GPT-2's
        // tied embedding and learned positions, Llama's GQA, SwiGLU, RMSNorm, untied output).
        for p in PRESETS {
            let shape = named(p.name).unwrap();
            let model = shape.model();
            let listed: usize = model
                .parameters(&crate::model::ModelParallel::single())
                .iter()
                .map(|p| p.shape.iter().product::<usize>())
                .sum();
            assert_eq!(shape.parameters(), listed as f64, "{}", p.name);
        }
    }

    #[test]
    fn unknown_model_names_the_choices() {
        let e = named("gpt-9").unwrap_err().to_string();
        assert!(e.contains("--model") && e.contains("megatron-1t"), "{e}");
    }
}
