//! What makes a model GPT-2 or Llama-family, as Megatron's flags say it: the normalization
//! (`--normalization`, `--norm-epsilon`), the MLP's activation (`--swiglu`, `--openai-gelu`), the positions
//! (`--position-embedding-type`, `--rotary-base`, `--rotary-percent`, `--use-rope-scaling`), the
//! attention's key/value heads (`--group-query-attention`, `--num-query-groups`, `--kv-channels`),
//! the output layer (`--untie-embeddings-and-output-weights`), the linear layers' biases
//! (`--disable-bias-linear`) and the norms' zero-centred scale (`--apply-layernorm-1p`); and the
//! rotary embedding's table of angles.

use crate::device::Gelu;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalization {
    LayerNorm,
    RmsNorm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionEmbedding {
    LearnedAbsolute,
    Rope,
    None,
}

/// Llama 3.1's rotary frequency scaling (`--use-rope-scaling`, megatron-core's and Hugging Face's
/// "llama3" rope type): factor 8, low- and high-frequency factors 1 and 4, over an original
/// context of 8192 positions.
pub const ROPE_SCALING: (f64, f64, f64, f64) = (8.0, 1.0, 4.0, 8192.0);

/// The architecture of a GPT-family model beyond its sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Arch {
    pub normalization: Normalization,
    pub norm_epsilon: f64,
    /// The MLP is SwiGLU: fc1 makes the gate and the up projection (`2 f` rows, gate first).
    pub swiglu: bool,
    /// The GELU of a non-SwiGLU MLP: the tanh form (GPT-2's, Megatron's `--openai-gelu`) or the
    /// exact erf one (megatron-core's default).
    pub gelu: Gelu,
    pub position_embedding: PositionEmbedding,
    pub rotary_base: f64,
    /// The fraction of each head's dimensions that rotate.
    pub rotary_percent: f64,
    pub rope_scaling: bool,
    /// Key/value heads; None: one per attention head.
    pub num_query_groups: Option<usize>,
    /// Dimensions per head; None: hidden size / heads.
    pub kv_channels: Option<usize>,
    pub untie_embeddings: bool,
    pub add_bias_linear: bool,
    /// `--apply-layernorm-1p`: each norm's weight `w` starts at 0 and scales by `1 + w`
    /// (megatron-core's `layernorm_zero_centered_gamma`), LayerNorm and RMSNorm alike.
    pub zero_centered_gamma: bool,
}

impl Arch {
    /// GPT-2: LayerNorm, GELU, learned positions, multi-head attention, tied output layer, biases.
    pub const GPT2: Arch = Arch {
        normalization: Normalization::LayerNorm,
        norm_epsilon: 1e-5,
        swiglu: false,
        gelu: Gelu::Tanh,
        position_embedding: PositionEmbedding::LearnedAbsolute,
        rotary_base: 10000.0,
        rotary_percent: 1.0,
        rope_scaling: false,
        num_query_groups: None,
        kv_channels: None,
        untie_embeddings: false,
        add_bias_linear: true,
        zero_centered_gamma: false,
    };

    /// Llama's recipe: RMSNorm, SwiGLU, rotary positions, untied output layer, no linear biases
    /// (the query groups and rotary base are the model's).
    pub const LLAMA: Arch = Arch {
        normalization: Normalization::RmsNorm,
        swiglu: true,
        position_embedding: PositionEmbedding::Rope,
        untie_embeddings: true,
        add_bias_linear: false,
        ..Arch::GPT2
    };

    /// What this model has that GPT-2 does not, named for errors ("RMSNorm, SwiGLU").
    pub fn features(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let checks = [
            (self.normalization == Normalization::RmsNorm, "RMSNorm"),
            (self.swiglu, "SwiGLU"),
            (self.position_embedding == PositionEmbedding::Rope, "rotary position embedding"),
            (self.position_embedding == PositionEmbedding::None, "no position embedding"),
            (self.num_query_groups.is_some(), "grouped-query attention"),
            (self.kv_channels.is_some(), "--kv-channels"),
            (self.untie_embeddings, "an untied output layer"),
            (!self.add_bias_linear, "linear layers without biases"),
        ];
        for (on, name) in checks {
            if on {
                out.push(name);
            }
        }
        out
    }

    /// Where a norm's weight starts: 1, or 0 under `--apply-layernorm-1p` (its scale is `1 + w`).
    pub fn norm_weight_init(&self) -> crate::tensor::Init {
        crate::tensor::Init::Constant(if self.zero_centered_gamma { 0.0 } else { 1.0 })
    }

    /// Whether parameter `name` is a norm's weight (Megatron's names: `input_layernorm.weight`,
    /// `pre_mlp_layernorm.weight`, `final_layernorm.weight`).
    pub fn is_norm_weight(name: &str) -> bool {
        name.ends_with("layernorm.weight")
    }

    /// The rotated dimensions of a head of `head_dim` (Megatron: `head_dim · rotary_percent`).
    pub fn rotary_dim(&self, head_dim: usize) -> usize {
        (head_dim as f64 * self.rotary_percent) as usize
    }

    /// Checks the architecture flags against the model's heads and head dimension.
    pub fn validate(&self, heads: usize, head_dim: usize) -> Result<()> {
        if let Some(g) = self.num_query_groups {
            if g == 0 || !heads.is_multiple_of(g) {
                return Err(Error::Config(format!(
                    "--num-query-groups {g} must divide --num-attention-heads {heads} (each group shares one key and \
                     value head)"
                )));
            }
        }
        if !(self.norm_epsilon > 0.0 && self.norm_epsilon.is_finite()) {
            return Err(Error::flag("--norm-epsilon", self.norm_epsilon, "a positive number"));
        }
        if self.position_embedding == PositionEmbedding::Rope {
            let rd = self.rotary_dim(head_dim);
            if !(self.rotary_percent > 0.0 && self.rotary_percent <= 1.0) || rd == 0 || rd % 2 == 1 {
                return Err(Error::Config(format!(
                    "--rotary-percent {} of a head dimension of {head_dim} gives {rd} rotated dimensions; they must be \
                     an even number above 0 (and the percent at most 1)",
                    self.rotary_percent
                )));
            }
            if !(self.rotary_base > 1.0 && self.rotary_base.is_finite()) {
                return Err(Error::flag("--rotary-base", self.rotary_base, "a number above 1"));
            }
        }
        Ok(())
    }

    /// The inverse frequencies of the rotated pairs: `base^(-2i / rotary_dim)`, scaled as Llama
    /// 3.1 scales them under `rope_scaling` (long wavelengths divided by the factor, short ones
    /// kept, a smooth blend between).
    pub fn rotary_inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let rd = self.rotary_dim(head_dim);
        let (factor, low, high, old) = ROPE_SCALING;
        (0..rd / 2)
            .map(|i| {
                let f = self.rotary_base.powf(-((2 * i) as f64) / rd as f64);
                if !self.rope_scaling {
                    return f;
                }
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < old / high {
                    f
                } else if wavelen > old / low {
                    f / factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect()
    }

    /// The table `AttentionOps::rope_forward` reads: per position `0..positions`, the cosines and then
    /// the sines of `position · inv_freq[i]` ([positions, rotary_dim], computed in f64, held f32).
    pub fn rotary_table(&self, head_dim: usize, positions: usize) -> Vec<f32> {
        self.rotary_table_at(head_dim, 0..positions)
    }

    /// The rotary table whose row `i` holds the angles of position `positions[i]` (a
    /// context-parallel rank's positions).
    pub fn rotary_table_at(&self, head_dim: usize, positions: impl ExactSizeIterator<Item = usize>) -> Vec<f32> {
        let inv = self.rotary_inv_freq(head_dim);
        let mut out = Vec::with_capacity(positions.len() * 2 * inv.len());
        for t in positions {
            out.extend(inv.iter().map(|f| (t as f64 * f).cos() as f32));
            out.extend(inv.iter().map(|f| (t as f64 * f).sin() as f32));
        }
        out
    }

    /// The architecture as checkpoint metadata: (key, value) pairs, each absent key meaning
    /// GPT-2's value (so checkpoints written before these keys existed read as GPT-2).
    pub fn metadata(&self) -> Vec<(&'static str, String)> {
        let g = Arch::GPT2;
        let mut out = Vec::new();
        let mut put = |key, differs: bool, value: String| {
            if differs {
                out.push((key, value));
            }
        };
        let norm = match self.normalization {
            Normalization::LayerNorm => "LayerNorm",
            Normalization::RmsNorm => "RMSNorm",
        };
        put("normalization", self.normalization != g.normalization, norm.into());
        put("norm_epsilon", self.norm_epsilon != g.norm_epsilon, format!("{:e}", self.norm_epsilon));
        put("swiglu", self.swiglu, "true".into());
        put("gelu_erf", self.gelu == Gelu::Erf, "true".into());
        put("position_embedding_type", self.position_embedding != g.position_embedding, self.position_name().into());
        put("rotary_base", self.rotary_base != g.rotary_base, format!("{}", self.rotary_base));
        put("rotary_percent", self.rotary_percent != g.rotary_percent, format!("{}", self.rotary_percent));
        put("use_rope_scaling", self.rope_scaling, "true".into());
        put("num_query_groups", self.num_query_groups.is_some(), format!("{}", self.num_query_groups.unwrap_or(0)));
        put("kv_channels", self.kv_channels.is_some(), format!("{}", self.kv_channels.unwrap_or(0)));
        put("untie_embeddings_and_output_weights", self.untie_embeddings, "true".into());
        put("disable_bias_linear", !self.add_bias_linear, "true".into());
        put("apply_layernorm_1p", self.zero_centered_gamma, "true".into());
        out
    }

    /// The architecture from checkpoint metadata (`metadata`'s keys; `get` returns a key's value).
    pub fn from_metadata(get: &dyn Fn(&str) -> Option<String>) -> Result<Arch> {
        let bad = |key: &str, v: &str| Error::Config(format!("checkpoint metadata: {key} = '{v}' is not understood"));
        let num = |key: &str| -> Result<Option<f64>> {
            get(key).map(|v| v.parse::<f64>().map_err(|_| bad(key, &v))).transpose()
        };
        let count = |key: &str| -> Result<Option<usize>> {
            get(key).map(|v| v.parse::<usize>().map_err(|_| bad(key, &v))).transpose()
        };
        let flag = |key: &str| get(key).is_some_and(|v| v == "true");
        let g = Arch::GPT2;
        let normalization = match get("normalization").as_deref() {
            None | Some("LayerNorm") => Normalization::LayerNorm,
            Some("RMSNorm") => Normalization::RmsNorm,
            Some(v) => return Err(bad("normalization", v)),
        };
        let position_embedding = match get("position_embedding_type") {
            None => g.position_embedding,
            Some(v) => Arch::parse_position(&v).map_err(|_| bad("position_embedding_type", &v))?,
        };
        Ok(Arch {
            normalization,
            norm_epsilon: num("norm_epsilon")?.unwrap_or(g.norm_epsilon),
            swiglu: flag("swiglu"),
            gelu: if flag("gelu_erf") { Gelu::Erf } else { Gelu::Tanh },
            position_embedding,
            rotary_base: num("rotary_base")?.unwrap_or(g.rotary_base),
            rotary_percent: num("rotary_percent")?.unwrap_or(g.rotary_percent),
            rope_scaling: flag("use_rope_scaling"),
            num_query_groups: count("num_query_groups")?,
            kv_channels: count("kv_channels")?,
            untie_embeddings: flag("untie_embeddings_and_output_weights"),
            add_bias_linear: !flag("disable_bias_linear"),
            zero_centered_gamma: flag("apply_layernorm_1p"),
        })
    }

    /// Megatron's name of the position embedding type.
    pub fn position_name(&self) -> &'static str {
        match self.position_embedding {
            PositionEmbedding::LearnedAbsolute => "learned_absolute",
            PositionEmbedding::Rope => "rope",
            PositionEmbedding::None => "none",
        }
    }

    /// `--position-embedding-type`'s values.
    pub fn parse_position(s: &str) -> Result<PositionEmbedding> {
        match s {
            "learned_absolute" => Ok(PositionEmbedding::LearnedAbsolute),
            "rope" => Ok(PositionEmbedding::Rope),
            "none" => Ok(PositionEmbedding::None),
            _ => Err(Error::flag("--position-embedding-type", format!("'{s}'"), "learned_absolute, rope or none")),
        }
    }

    /// `--normalization`'s values.
    pub fn parse_normalization(s: &str) -> Result<Normalization> {
        match s {
            "LayerNorm" => Ok(Normalization::LayerNorm),
            "RMSNorm" => Ok(Normalization::RmsNorm),
            _ => Err(Error::flag("--normalization", format!("'{s}'"), "LayerNorm or RMSNorm")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_an_empty_one_is_gpt2() {
        let none = |_: &str| None;
        assert_eq!(Arch::from_metadata(&none).unwrap(), Arch::GPT2);
        assert!(Arch::GPT2.metadata().is_empty());
        let llama = Arch {
            num_query_groups: Some(2),
            rotary_base: 500000.0,
            rope_scaling: true,
            kv_channels: Some(48),
            rotary_percent: 0.5,
            norm_epsilon: 1e-6,
            zero_centered_gamma: true,
            ..Arch::LLAMA
        };
        let erf = Arch { gelu: Gelu::Erf, ..Arch::GPT2 };
        for arch in [llama, erf] {
            let m = arch.metadata();
            let get = |k: &str| m.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone());
            assert_eq!(Arch::from_metadata(&get).unwrap(), arch);
        }
        assert_eq!(Arch { gelu: Gelu::Erf, ..Arch::GPT2 }.metadata(), [("gelu_erf", "true".to_string())]);
    }

    #[test]
    fn rope_scaling_keeps_short_wavelengths_and_divides_long_ones() {
        let base = Arch { rotary_base: 500000.0, ..Arch::LLAMA };
        let scaled = Arch { rope_scaling: true, ..base.clone() };
        let (a, b) = (base.rotary_inv_freq(128), scaled.rotary_inv_freq(128));
        assert_eq!(a[0], b[0]); // wavelength 2 pi: kept
        assert!((b[63] - a[63] / 8.0).abs() < 1e-18); // the longest: divided by 8
        let blended = (0..64).filter(|&i| b[i] != a[i] && (b[i] - a[i] / 8.0).abs() > 1e-18).count();
        assert!(blended > 0, "some frequencies fall in the smooth band");
        // Positions 0 and 1 of the table: cos 0 = 1, sin 0 = 0, then the first frequency's angle.
        let t = base.rotary_table(4, 2);
        assert_eq!(&t[..4], &[1.0, 1.0, 0.0, 0.0]);
        assert_eq!(t[4], 1f64.cos() as f32);
    }
}
