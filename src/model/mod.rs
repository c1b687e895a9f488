//! The GPT-2 model on one device: its configuration, its parameters (Megatron's names and
//! initialisation), and the hand-written forward and backward passes in `gpt/`.

pub mod arch;
pub mod gpt;

pub use arch::{Arch, Normalization, PositionEmbedding};

pub use gpt::Gpt;

use crate::error::{Error, Result};
use crate::parallel::context::ContextSplit;
use crate::parallel::grid::SummaCoord;
use crate::tensor::{Init, ParamInfo};

/// How this rank's model replica is split: its tensor-parallel size and rank, whether the
/// activations outside attention and MLP are split along the sequence (1-D), its place in a
/// SUMMA grid under 2-D / 2.5-D tensor parallelism (None under 1-D), and which positions of each
/// sequence it holds under context parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelParallel {
    pub tp_size: usize,
    pub tp_rank: usize,
    pub sequence_parallel: bool,
    pub summa: Option<SummaCoord>,
    pub context: ContextSplit,
}

impl ModelParallel {
    pub fn single() -> ModelParallel {
        ModelParallel::one_d(1, 0, false)
    }

    /// 1-D tensor parallelism over `tp_size` ranks.
    pub fn one_d(tp_size: usize, tp_rank: usize, sequence_parallel: bool) -> ModelParallel {
        ModelParallel { tp_size, tp_rank, sequence_parallel, summa: None, context: ContextSplit::single() }
    }

    /// How many ways attention heads, and the MLP's and QKV's output features, are split: t under
    /// 1-D, q under SUMMA.
    pub fn feature_split(&self) -> usize {
        self.summa.map_or(self.tp_size, |c| c.q)
    }

    /// How many ways the batch of a micro-batch is split: d q under SUMMA, 1 under 1-D.
    pub fn batch_split(&self) -> usize {
        self.summa.map_or(1, |c| c.q * c.depth)
    }

    /// Whether this rank counts the parameters it holds in the gradient norm: every rank but the
    /// depth copies of 2.5-D (which hold the same shards as depth layer 0).
    pub fn counts_parameters(&self) -> bool {
        self.summa.is_none_or(|c| c.dep == 0)
    }
}

/// Activation recomputation (`--recompute-granularity`): keep every activation for backward, or
/// recompute the attention core (selective), or whole layers from their inputs (full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    #[default]
    None,
    Selective,
    Full,
}

impl Recompute {
    pub fn parse(s: &str) -> Result<Recompute> {
        match s {
            "full" => Ok(Recompute::Full),
            "selective" => Ok(Recompute::Selective),
            "none" => Ok(Recompute::None),
            _ => Err(Error::flag("--recompute-granularity", format!("'{s}'"), "full or selective")),
        }
    }
}

/// Which part of the model one chunk (a pipeline stage, or one virtual stage of it) holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Transformer layers, by global index.
    pub layers: std::ops::Range<usize>,
    /// Holds the embeddings (the first virtual stage).
    pub first: bool,
    /// Holds the final LayerNorm, the output layer and the loss (the last virtual stage).
    pub last: bool,
}

impl ChunkPlan {
    pub fn whole(cfg: &GptConfig) -> ChunkPlan {
        ChunkPlan { layers: 0..cfg.num_layers, first: true, last: true }
    }
}

/// The most parameters a model may have (2^44, about 17.6 trillion: ten times the largest
/// dense models trained), so that a model's bytes, gradients and both AdamW moments (16 bytes a
/// parameter) fit in 64-bit arithmetic with room to spare, whatever a file claims.
pub const MAX_PARAMETERS: usize = 1 << 44;

/// The largest `--make-vocab-size-divisible-by` accepted, from a flag or a file (Megatron's default
/// is 128; 2^16 already pads a vocabulary by up to 65,535 rows per tensor-parallel rank).
pub const MAX_VOCAB_PADDING_MULTIPLE: usize = 1 << 16;

/// The shape of a GPT-2 model. `padded_vocab_size` is the vocabulary rounded up as Megatron
/// pads it (`--make-vocab-size-divisible-by`), which is the row count of the word embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub ffn_hidden_size: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub padded_vocab_size: usize,
    pub init_method_std: f64,
    /// GPT-2's or a Llama-family architecture.
    pub arch: Arch,
}

impl GptConfig {
    /// Checks the shape; every error names the flags to change.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("--num-layers", self.num_layers),
            ("--hidden-size", self.hidden_size),
            ("--num-attention-heads", self.num_attention_heads),
            ("--ffn-hidden-size", self.ffn_hidden_size),
            ("--max-position-embeddings", self.max_position_embeddings),
        ];
        for (flag, v) in positive {
            if v == 0 {
                return Err(Error::Config(format!("{flag} must be at least 1")));
            }
        }
        if self.arch.kv_channels.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(Error::Config(format!(
                "--hidden-size {} is not divisible by --num-attention-heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        if self.vocab_size == 0 {
            return Err(Error::Config("the vocabulary is empty (vocab_size 0)".into()));
        }
        if self.padded_vocab_size < self.vocab_size {
            return Err(Error::Config("padded vocabulary smaller than the vocabulary".into()));
        }
        if self.parameter_count().is_none_or(|n| n > MAX_PARAMETERS) {
            return Err(Error::Config(format!(
                "the model's sizes (hidden {}, {} layers, {} heads of {}, MLP {}, vocabulary {}, {} positions) describe                  more than {MAX_PARAMETERS} parameters or overflow",
                self.hidden_size,
                self.num_layers,
                self.num_attention_heads,
                self.arch.kv_channels.map_or("hidden / heads".to_string(), |d| d.to_string()),
                self.ffn_hidden_size,
                self.padded_vocab_size,
                self.max_position_embeddings
            )));
        }
        if !(self.init_method_std > 0.0 && self.init_method_std.is_finite()) {
            return Err(Error::Config(format!("--init-method-std {} must be positive", self.init_method_std)));
        }
        if self.arch.kv_channels == Some(0) {
            return Err(Error::flag("--kv-channels", 0, "a positive whole number"));
        }
        self.arch.validate(self.num_attention_heads, self.head_dim())
    }

    /// The whole model's parameters (one rank, the tied output layer counted once), in checked
    /// arithmetic: None when a product overflows. Every size the model derives (`qkv_rows`,
    /// `attention_width`, `fc1_rows`, each parameter's elements) is a factor of a term here, so a
    /// model that `validate` accepts cannot overflow any of them.
    pub fn parameter_count(&self) -> Option<usize> {
        let (h, f, l) = (self.hidden_size, self.ffn_hidden_size, self.num_layers);
        let d = self.arch.kv_channels.unwrap_or(h / self.num_attention_heads.max(1));
        let kv = self.arch.num_query_groups.unwrap_or(self.num_attention_heads);
        let qkv_rows = kv.checked_mul(2)?.checked_add(self.num_attention_heads)?.checked_mul(d)?;
        let attention_width = self.num_attention_heads.checked_mul(d)?;
        let fc1_rows = f.checked_mul(if self.arch.swiglu { 2 } else { 1 })?;
        let bias = usize::from(self.arch.add_bias_linear);
        let norms = if self.arch.normalization == Normalization::LayerNorm { 2 } else { 1 };
        let layer = [
            qkv_rows.checked_mul(h)?,
            qkv_rows.checked_mul(bias)?,
            h.checked_mul(attention_width)?,
            h.checked_mul(bias)?,
            fc1_rows.checked_mul(h)?,
            fc1_rows.checked_mul(bias)?,
            h.checked_mul(f)?,
            h.checked_mul(bias)?,
            h.checked_mul(2 * norms)?,
        ];
        let layer = layer.into_iter().try_fold(0usize, usize::checked_add)?;
        let vocab = self.padded_vocab_size.checked_mul(h)?;
        let positions = match self.arch.position_embedding {
            PositionEmbedding::LearnedAbsolute => self.max_position_embeddings.checked_mul(h)?,
            _ => 0,
        };
        let output = if self.arch.untie_embeddings { vocab } else { 0 };
        [layer.checked_mul(l)?, vocab, positions, output, h.checked_mul(norms)?]
            .into_iter()
            .try_fold(0usize, usize::checked_add)
    }

    /// Dimensions per attention head: `--kv-channels`, else hidden size / heads.
    pub fn head_dim(&self) -> usize {
        self.arch.kv_channels.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Key/value heads: the query groups under grouped-query attention, else one per head.
    pub fn kv_heads(&self) -> usize {
        self.arch.num_query_groups.unwrap_or(self.num_attention_heads)
    }

    /// Rows of the fused QKV weight: every query head, and a key and a value head per group.
    pub fn qkv_rows(&self) -> usize {
        (self.num_attention_heads + 2 * self.kv_heads()) * self.head_dim()
    }

    /// Width of the attention output (the projection's input): heads x head dimension.
    pub fn attention_width(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Rows of fc1's weight: the MLP width, twice it under SwiGLU (gate, then up).
    pub fn fc1_rows(&self) -> usize {
        if self.arch.swiglu {
            2 * self.ffn_hidden_size
        } else {
            self.ffn_hidden_size
        }
    }

    /// Megatron's padding: the smallest multiple of `divisible_by` at or above `vocab`.
    pub fn pad_vocab(vocab: usize, divisible_by: usize) -> usize {
        vocab.div_ceil(divisible_by.max(1)) * divisible_by.max(1)
    }

    /// `vocab` padded as Megatron pads it, to a multiple of `--make-vocab-size-divisible-by`
    /// (`divisible_by`) times the tensor-parallel size. A multiple of 0 or above
    /// `MAX_VOCAB_PADDING_MULTIPLE` is an error, naming `file` when the value came from one.
    pub fn padded_vocab(
        vocab: usize,
        divisible_by: usize,
        tensor_parallel: usize,
        file: Option<&std::path::Path>,
    ) -> Result<usize> {
        let fail = |what: String| match file {
            Some(path) => Error::format(path, what),
            None => Error::Config(what),
        };
        if divisible_by == 0 || divisible_by > MAX_VOCAB_PADDING_MULTIPLE {
            return Err(fail(format!(
                "--make-vocab-size-divisible-by {divisible_by} is not 1 to {MAX_VOCAB_PADDING_MULTIPLE} (Megatron's \
                 default is 128)"
            )));
        }
        let by = divisible_by.checked_mul(tensor_parallel.max(1)).filter(|&b| b <= usize::MAX / 2);
        by.and_then(|by| vocab.div_ceil(by).checked_mul(by)).ok_or_else(|| {
            fail(format!("{vocab} ids padded to a multiple of {divisible_by} x {tensor_parallel} overflow"))
        })
    }

    /// Checks that the model splits over `mp`: heads, MLP width and padded vocabulary divide by
    /// the tensor-parallel size, and under sequence parallelism the sequence does too.
    pub fn validate_parallel(&self, mp: &ModelParallel, seq_length: usize) -> Result<()> {
        if let Some(c) = mp.summa {
            return self.validate_summa(c.q);
        }
        let t = mp.tp_size;
        let flag = "--tensor-model-parallel-size";
        if !self.num_attention_heads.is_multiple_of(t) {
            return Err(Error::Config(format!(
                "--num-attention-heads {} is not divisible by {flag} {t}",
                self.num_attention_heads
            )));
        }
        if self.arch.num_query_groups.is_some() && !self.kv_heads().is_multiple_of(t) {
            return Err(Error::Config(format!(
                "--num-query-groups {} is not divisible by {flag} {t} (each rank holds whole query groups, as in \
                 Megatron)",
                self.kv_heads()
            )));
        }
        if !self.ffn_hidden_size.is_multiple_of(t) {
            return Err(Error::Config(format!(
                "--ffn-hidden-size {} is not divisible by {flag} {t}",
                self.ffn_hidden_size
            )));
        }
        if !self.padded_vocab_size.is_multiple_of(t) {
            return Err(Error::Config(format!(
                "the padded vocabulary {} ({} rounded up to --make-vocab-size-divisible-by) is not divisible by {flag} \
                 {t}; pick --make-vocab-size-divisible-by as a multiple of {t}",
                self.padded_vocab_size, self.vocab_size
            )));
        }
        self.validate_context(mp.context.size, seq_length)?;
        let local = seq_length / mp.context.size;
        if mp.sequence_parallel && !local.is_multiple_of(t) {
            let what = match mp.context.size {
                1 => format!("--seq-length {seq_length}"),
                c => format!("each rank's {local} positions (--seq-length {seq_length} / --context-parallel-size {c})"),
            };
            return Err(Error::Config(format!(
                "{what} is not divisible by {flag} {t}, which --sequence-parallel needs"
            )));
        }
        Ok(())
    }

    /// Checks that the sequence splits over `c` context-parallel ranks: into 2c chunks of equal
    /// length.
    fn validate_context(&self, c: usize, seq_length: usize) -> Result<()> {
        if c > 1 && !seq_length.is_multiple_of(2 * c) {
            return Err(Error::Config(format!(
                "--seq-length {seq_length} does not split into 2 x --context-parallel-size {c} = {} chunks of \
                 equal length (each rank holds chunks i and {}-i, Megatron's load balancing)",
                2 * c,
                2 * c - 1
            )));
        }
        Ok(())
    }

    /// Checks that each tensor-parallel rank's (of `t`) query heads and key/value groups split
    /// into `c` blocks, as `--cp-comm-type a2a`'s swap needs (over the whole group, or over
    /// a2a+p2p's inner groups: `hierarchical`).
    pub fn validate_head_swap(&self, c: usize, t: usize, hierarchical: bool) -> Result<()> {
        let (heads, groups) = (self.num_attention_heads / t, self.kv_heads() / t);
        let over = match hierarchical {
            true => format!(
                "--cp-comm-type a2a+p2p splits each rank's attention heads over its first \
                 --hierarchical-context-parallel-sizes level, {c} ranks"
            ),
            false => format!("--cp-comm-type a2a splits each rank's attention heads over --context-parallel-size {c}"),
        };
        if !groups.is_multiple_of(c) {
            return Err(Error::Config(format!(
                "{over}, but a \
                 tensor-parallel rank holds {heads} query heads in {groups} key/value group{} (--num-query-groups \
                 / --tensor-model-parallel-size), not a multiple of {c}",
                if groups == 1 { "" } else { "s" }
            )));
        }
        Ok(())
    }

    /// Checks that the model splits over a q x q SUMMA grid: heads by q (attention stays local),
    /// hidden and MLP widths by q² (LayerNorm and bias shards), the vocabulary and the position
    /// table by q (embedding blocks).
    fn validate_summa(&self, q: usize) -> Result<()> {
        let features = self.arch.features();
        if !features.is_empty() {
            return Err(Error::Unsupported(format!(
                "2-D / 2.5-D tensor parallelism runs GPT-2's architecture only; this model has {}: use \
                 --tensor-parallel-mode 1d",
                features.join(", ")
            )));
        }
        let why = format!("which 2-D / 2.5-D tensor parallelism with a {q} x {q} grid needs");
        let checks = [
            ("--num-attention-heads", self.num_attention_heads, q, "q"),
            ("--hidden-size", self.hidden_size, q * q, "q²"),
            ("--ffn-hidden-size", self.ffn_hidden_size, q * q, "q²"),
            ("--max-position-embeddings", self.max_position_embeddings, q, "q"),
        ];
        for (flag, v, by, what) in checks {
            if !v.is_multiple_of(by) {
                return Err(Error::Config(format!("{flag} {v} is not divisible by {what} = {by}, {why}")));
            }
        }
        if !self.padded_vocab_size.is_multiple_of(q) {
            return Err(Error::Config(format!(
                "the padded vocabulary {} is not divisible by q = {q}, {why}; pick --make-vocab-size-divisible-by \
                 as a multiple of {q}",
                self.padded_vocab_size
            )));
        }
        Ok(())
    }

    /// Every parameter of the whole model in canonical order (one chunk holding everything).
    pub fn parameters(&self, mp: &ModelParallel) -> Vec<ParamInfo> {
        self.chunk_parameters(mp, &ChunkPlan::whole(self))
    }

    /// The parameters of one model chunk in canonical order, with Megatron-core GPT names, as this
    /// tensor-parallel rank holds them: QKV and fc1 split by output rows (column-parallel), the
    /// attention projection and fc2 by input columns (row-parallel), the word embedding by
    /// vocabulary rows; everything else replicated. The first chunk holds the embeddings, the last
    /// the final LayerNorm and (when it is not also the first) its copy of the tied embedding.
    pub fn chunk_parameters(&self, mp: &ModelParallel, plan: &ChunkPlan) -> Vec<ParamInfo> {
        if let Some(c) = mp.summa {
            return self.summa_chunk_parameters(c, plan);
        }
        let (h, f, aw) = (self.hidden_size, self.ffn_hidden_size, self.attention_width());
        let std = self.init_method_std;
        let scaled = std / (2.0 * self.num_layers as f64).sqrt();
        let (t, r) = (mp.tp_size, mp.tp_rank);
        let sp = mp.sequence_parallel && t > 1;
        let arch = &self.arch;
        let rep = |name: String, shape: Vec<usize>, init: Init| ParamInfo::replicated(name, shape, init);
        // Norms and the position embedding see only this rank's sequence shard under SP.
        let rep_sp =
            |name: String, shape: Vec<usize>, init: Init| ParamInfo { sequence_parallel: sp, ..rep(name, shape, init) };
        let split =
            |name: String, shape: Vec<usize>, init: Init, dim: usize| ParamInfo::split(name, shape, init, dim, r, t);
        // SwiGLU's fc1 rows are the gate's then the up projection's: each rank holds its share of both.
        let fc1_chunks = if arch.swiglu { 2 } else { 1 };
        let fc1 = |name: String, shape: Vec<usize>, init: Init| {
            ParamInfo::split_chunks(name, shape, init, 0, (r, t), fc1_chunks)
        };
        let vocab = |name: &str| split(name.into(), vec![self.padded_vocab_size, h], Init::Normal { std }, 0);
        let bias = arch.add_bias_linear;
        let norm_bias = arch.normalization == Normalization::LayerNorm;
        let zero = Init::Constant(0.0);
        let gamma = arch.norm_weight_init();
        let mut out = Vec::new();
        if plan.first {
            out.push(vocab("embedding.word_embeddings.weight"));
            if arch.position_embedding == PositionEmbedding::LearnedAbsolute {
                let shape = vec![self.max_position_embeddings, h];
                out.push(rep_sp("embedding.position_embeddings.weight".into(), shape, Init::Normal { std }));
            }
        }
        for l in plan.layers.clone() {
            let n = |s: &str| format!("decoder.layers.{l}.{s}");
            let norm = |out: &mut Vec<ParamInfo>, name: &str| {
                out.push(rep_sp(n(&format!("{name}.weight")), vec![h], gamma));
                if norm_bias {
                    out.push(rep_sp(n(&format!("{name}.bias")), vec![h], zero));
                }
            };
            norm(&mut out, "input_layernorm");
            out.push(split(n("self_attention.linear_qkv.weight"), vec![self.qkv_rows(), h], Init::Normal { std }, 0));
            if bias {
                out.push(split(n("self_attention.linear_qkv.bias"), vec![self.qkv_rows()], zero, 0));
            }
            out.push(split(n("self_attention.linear_proj.weight"), vec![h, aw], Init::Normal { std: scaled }, 1));
            if bias {
                out.push(rep(n("self_attention.linear_proj.bias"), vec![h], zero));
            }
            norm(&mut out, "pre_mlp_layernorm");
            out.push(fc1(n("mlp.linear_fc1.weight"), vec![self.fc1_rows(), h], Init::Normal { std }));
            if bias {
                out.push(fc1(n("mlp.linear_fc1.bias"), vec![self.fc1_rows()], zero));
            }
            out.push(split(n("mlp.linear_fc2.weight"), vec![h, f], Init::Normal { std: scaled }, 1));
            if bias {
                out.push(rep(n("mlp.linear_fc2.bias"), vec![h], zero));
            }
        }
        if plan.last {
            out.push(rep_sp("decoder.final_layernorm.weight".into(), vec![h], gamma));
            if norm_bias {
                out.push(rep_sp("decoder.final_layernorm.bias".into(), vec![h], zero));
            }
            if arch.untie_embeddings {
                out.push(vocab("output_layer.weight"));
            } else if !plan.first {
                // Same name, so the same initial values as the first stage's embedding.
                out.push(ParamInfo { tied_copy: true, ..vocab("embedding.word_embeddings.weight") });
            }
        }
        out
    }

    /// The parameters of one chunk as SUMMA grid position (row i, column j) holds them
    /// (parallel::summa's layout): a linear weight `[n, k]` as the block of output rows j and
    /// input columns i; a vector over features as sub-block i of block j (`[n/q²]`); the word
    /// embedding as vocabulary block i, hidden block j; the position table as position block i,
    /// hidden block j. Depth layers of 2.5-D hold the same blocks.
    fn summa_chunk_parameters(&self, c: SummaCoord, plan: &ChunkPlan) -> Vec<ParamInfo> {
        let (h, f, q) = (self.hidden_size, self.ffn_hidden_size, c.q);
        let std = self.init_method_std;
        let scaled = std / (2.0 * self.num_layers as f64).sqrt();
        let (i, j) = (c.row, c.col);
        let gamma = self.arch.norm_weight_init();
        let matrix =
            |name: String, n: usize, k: usize, init: Init| ParamInfo::block(name, vec![n, k], init, (j, q), (i, q));
        let vector = |name: String, n: usize, init: Init| ParamInfo::split(name, vec![n], init, 0, j * q + i, q * q);
        let word = || {
            ParamInfo::block(
                "embedding.word_embeddings.weight".into(),
                vec![self.padded_vocab_size, h],
                Init::Normal { std },
                (i, q),
                (j, q),
            )
        };
        let mut out = Vec::new();
        if plan.first {
            out.push(word());
            out.push(ParamInfo::block(
                "embedding.position_embeddings.weight".into(),
                vec![self.max_position_embeddings, h],
                Init::Normal { std },
                (i, q),
                (j, q),
            ));
        }
        for l in plan.layers.clone() {
            let n = |s: &str| format!("decoder.layers.{l}.{s}");
            out.extend([
                vector(n("input_layernorm.weight"), h, gamma),
                vector(n("input_layernorm.bias"), h, Init::Constant(0.0)),
                matrix(n("self_attention.linear_qkv.weight"), 3 * h, h, Init::Normal { std }),
                vector(n("self_attention.linear_qkv.bias"), 3 * h, Init::Constant(0.0)),
                matrix(n("self_attention.linear_proj.weight"), h, h, Init::Normal { std: scaled }),
                vector(n("self_attention.linear_proj.bias"), h, Init::Constant(0.0)),
                vector(n("pre_mlp_layernorm.weight"), h, gamma),
                vector(n("pre_mlp_layernorm.bias"), h, Init::Constant(0.0)),
                matrix(n("mlp.linear_fc1.weight"), f, h, Init::Normal { std }),
                vector(n("mlp.linear_fc1.bias"), f, Init::Constant(0.0)),
                matrix(n("mlp.linear_fc2.weight"), h, f, Init::Normal { std: scaled }),
                vector(n("mlp.linear_fc2.bias"), h, Init::Constant(0.0)),
            ]);
        }
        if plan.last {
            out.push(vector("decoder.final_layernorm.weight".into(), h, gamma));
            out.push(vector("decoder.final_layernorm.bias".into(), h, Init::Constant(0.0)));
            if !plan.first {
                out.push(ParamInfo { tied_copy: true, ..word() });
            }
        }
        out
    }

    /// Model FLOPs of one iteration over `samples` sequences of length `seq` (Narayanan et al.
    /// 2021, no recompute): 72 B s l h² (1 + s/(6h) + V/(12 l h)) for GPT-2; for other
    /// architectures the same count term by term: three passes of 2 FLOPs per weight per token
    /// (QKV with its key/value groups, projection, fc1 with SwiGLU's gate, fc2, the logits), and
    /// 4 s a per token per layer for the attention scores and values (a = heads x head dim).
    pub fn flops_per_iteration(&self, samples: usize, seq: usize) -> f64 {
        if !self.arch.features().is_empty() {
            let (h, f, aw) = (self.hidden_size as f64, self.ffn_hidden_size as f64, self.attention_width() as f64);
            let weights = h * self.qkv_rows() as f64 + aw * h + h * self.fc1_rows() as f64 + f * h;
            let per_token_layer = 2.0 * weights + 4.0 * seq as f64 * aw;
            let per_token = self.num_layers as f64 * per_token_layer + 2.0 * h * self.padded_vocab_size as f64;
            return 3.0 * (samples * seq) as f64 * per_token;
        }
        let (b, s, l, h, v) = (
            samples as f64,
            seq as f64,
            self.num_layers as f64,
            self.hidden_size as f64,
            self.padded_vocab_size as f64,
        );
        72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(arch: Arch) -> GptConfig {
        GptConfig {
            num_layers: 3,
            hidden_size: 24,
            num_attention_heads: 6,
            ffn_hidden_size: 40,
            max_position_embeddings: 16,
            vocab_size: 50,
            padded_vocab_size: 64,
            init_method_std: 0.02,
            arch,
        }
    }

    #[test]
    fn the_parameter_count_is_the_parameters_elements() {
        let archs = [
            Arch::GPT2,
            Arch::LLAMA,
            Arch { num_query_groups: Some(2), kv_channels: Some(8), add_bias_linear: true, ..Arch::LLAMA },
            Arch { untie_embeddings: false, position_embedding: PositionEmbedding::None, ..Arch::LLAMA },
        ];
        for arch in archs {
            let cfg = model(arch);
            let listed: usize = cfg.parameters(&ModelParallel::single()).iter().map(|p| p.numel()).sum();
            assert_eq!(cfg.parameter_count(), Some(listed), "{:?}", cfg.arch);
            cfg.validate().unwrap();
        }
    }

    #[test]
    fn sizes_that_overflow_or_name_nothing_are_refused() {
        let llama = model(Arch::LLAMA);
        let bad = [
            GptConfig { vocab_size: 0, ..llama.clone() },
            GptConfig { num_attention_heads: 0, ..llama.clone() },
            GptConfig { num_layers: 0, ..llama.clone() },
            GptConfig { arch: Arch { kv_channels: Some(1 << 63), ..Arch::LLAMA }, ..llama.clone() },
            GptConfig { hidden_size: 1 << 40, num_attention_heads: 1, ..llama.clone() },
            GptConfig { num_layers: usize::MAX, ..llama.clone() },
        ];
        for cfg in bad {
            assert!(cfg.validate().is_err(), "{cfg:?}");
        }
        assert_eq!(GptConfig::padded_vocab(257, 128, 2, None).unwrap(), 512);
        for (by, tp) in [(0, 1), (MAX_VOCAB_PADDING_MULTIPLE + 1, 1), (1 << 16, usize::MAX / 4)] {
            assert!(GptConfig::padded_vocab(257, by, tp, None).is_err(), "{by} x {tp}");
        }
    }
}
