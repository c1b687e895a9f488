//! Model shapes `trident plan --model NAME` knows: trident's presets (with GPT-2's vocabulary for
//! the GPT-2 sizes), the rows of Megatron's 2021 weak-scaling table (Narayanan et al., arXiv
//! 2104.04473, Table 1: sequence 2048, vocabulary 51,200) and GPT-3 175B.

use crate::config::PRESETS;
use crate::error::{Error, Result};

/// A transformer's shape, enough to price it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub ffn_hidden_size: usize,
    pub seq_length: usize,
    /// Rows of the position embedding.
    pub max_position_embeddings: usize,
    /// The vocabulary after Megatron's padding (rows of the word embedding).
    pub padded_vocab_size: usize,
}

impl Shape {
    /// Parameters of the whole model (tied output layer counted once).
    pub fn parameters(&self) -> f64 {
        let (h, f) = (self.hidden_size as f64, self.ffn_hidden_size as f64);
        self.num_layers as f64 * layer_parameters(h, f)
            + (self.padded_vocab_size + self.max_position_embeddings) as f64 * h
            + 2.0 * h
    }
}

/// Weights and biases of one GPT layer: QKV (3h² + 3h), projection (h² + h), fc1 (hf + f),
/// fc2 (fh + h), two LayerNorms (4h).
pub fn layer_parameters(h: f64, f: f64) -> f64 {
    4.0 * h * h + 2.0 * h * f + 9.0 * h + f
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

fn gpt(layers: usize, hidden: usize, heads: usize, seq: usize, padded_vocab: usize) -> Shape {
    Shape {
        num_layers: layers,
        hidden_size: hidden,
        num_attention_heads: heads,
        ffn_hidden_size: 4 * hidden,
        seq_length: seq,
        max_position_embeddings: seq,
        padded_vocab_size: padded_vocab,
    }
}

/// Every name `--model` accepts (the Llama presets are refused by `named` for now).
pub fn names() -> Vec<&'static str> {
    let gpt2 = PRESETS.iter().filter(|p| p.arch.features().is_empty());
    gpt2.map(|p| p.name).chain(MEGATRON_2021.iter().map(|r| r.0)).chain(["gpt3-175b"]).collect()
}

/// The shape called `name`.
pub fn named(name: &str) -> Result<Shape> {
    if let Some(&(_, l, h, a)) = MEGATRON_2021.iter().find(|r| r.0 == name) {
        return Ok(gpt(l, h, a, 2048, 51200));
    }
    if name == "gpt3-175b" {
        // GPT-3's 50,257 tokens padded to a multiple of 128.
        return Ok(gpt(96, 12288, 96, 2048, 50304));
    }
    if let Some(p) = PRESETS.iter().find(|p| p.name == name) {
        let features = p.arch.features();
        if !features.is_empty() {
            return Err(Error::Unsupported(format!(
                "plan --model {name}: the planner prices GPT-2's architecture only so far, not {}",
                features.join(", ")
            )));
        }
        // The GPT-2 sizes are planned with GPT-2's vocabulary; tiny and small with the bytes'.
        let vocab = if p.name.starts_with("gpt2") { 50304 } else { 384 };
        return Ok(Shape {
            max_position_embeddings: p.max_position_embeddings,
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

    #[test]
    fn unknown_model_names_the_choices() {
        let e = named("gpt-9").unwrap_err().to_string();
        assert!(e.contains("--model") && e.contains("megatron-1t"), "{e}");
    }
}
