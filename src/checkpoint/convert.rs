//! `trident convert`: reshards a checkpoint to another tensor- and pipeline-parallel layout. Every
//! shard is read, each parameter and both AdamW moments are reassembled into full tensors (the
//! partition of every parameter is known from its name and the layout), and the full tensors are
//! cut again for the target layout and written as a new checkpoint, atomically like any other.

use super::shape::model_from_shard;
use super::{SavedTensor, Shard};
use crate::error::{Error, Result};
use crate::model::{ChunkPlan, GptConfig, ModelParallel};
use crate::parallel::grid::{SummaCoord, TensorMode};
use crate::parallel::pipeline::{chunk_layers, Placement};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The model-parallel layout of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tp: usize,
    pub pp: usize,
    /// Model chunks per pipeline stage (virtual stages).
    pub chunks: usize,
    /// Whether the two chunks of each stage sit in a V (zb-v's placement) rather than Megatron's
    /// interleaving.
    pub v: bool,
    pub first_stage_layers: Option<usize>,
    pub last_stage_layers: Option<usize>,
    pub sequence_parallel: bool,
    /// A SUMMA grid (side q, depth d) under 2-D / 2.5-D tensor parallelism; None under 1-D.
    pub summa: Option<(usize, usize)>,
}

impl Layout {
    /// One rank: no tensor or pipeline split.
    pub const fn single() -> Layout {
        Layout {
            tp: 1,
            pp: 1,
            chunks: 1,
            v: false,
            first_stage_layers: None,
            last_stage_layers: None,
            sequence_parallel: false,
            summa: None,
        }
    }

    /// How tensor-parallel rank `tp_rank` of this layout splits the model.
    pub fn model_parallel(&self, tp_rank: usize) -> ModelParallel {
        let mut mp = ModelParallel::one_d(self.tp, tp_rank, self.sequence_parallel);
        mp.summa = self.summa.map(|(q, d)| SummaCoord::of(tp_rank, q, d));
        mp
    }

    /// `1d`, `2d (q 2)`, `2.5d (q 2, depth 2)`: what checkpoints record.
    pub fn tensor_mode(&self) -> TensorMode {
        self.summa.map_or(TensorMode::OneD, |(q, depth)| TensorMode::Summa { q, depth })
    }

    /// Checks that `cfg` splits over this layout: sizes of at least 1, at most two more virtual
    /// stages than layers, a V of two chunks per stage, a SUMMA grid of q x q x depth ranks, and the model's own divisibility
    /// rules (`GptConfig::validate_parallel`).
    pub fn validate(&self, cfg: &GptConfig) -> Result<()> {
        let stages = self.pp.checked_mul(self.chunks).filter(|&v| v >= 1 && v <= cfg.num_layers.saturating_add(2));
        if self.tp == 0 || stages.is_none() {
            return Err(Error::Config(format!(
                "a layout of tensor-parallel size {}, {} pipeline stages and {} virtual stages each does not fit {} \
                 layers",
                self.tp, self.pp, self.chunks, cfg.num_layers
            )));
        }
        if self.v && (self.chunks != 2 || self.pp < 2) {
            return Err(Error::Config(format!(
                "a V placement needs two chunks on each of at least two stages, not {} on {}",
                self.chunks, self.pp
            )));
        }
        if let Some((q, depth)) = self.summa {
            if q < 2 || depth == 0 || q.checked_mul(q).and_then(|g| g.checked_mul(depth)) != Some(self.tp) {
                return Err(Error::Config(format!(
                    "a SUMMA grid of q {q} and depth {depth} is not tensor-parallel size {}",
                    self.tp
                )));
            }
        }
        cfg.validate_parallel(&self.model_parallel(0), 0)
    }

    /// The chunks pipeline stage `pp_rank` holds.
    pub fn plans(&self, cfg: &GptConfig, pp_rank: usize) -> Result<Vec<ChunkPlan>> {
        let lay = Placement { stages: self.pp, chunks: self.chunks, v: self.v };
        (0..self.chunks)
            .map(|c| {
                let layers =
                    chunk_layers(cfg.num_layers, lay, pp_rank, c, self.first_stage_layers, self.last_stage_layers)?;
                let (first, last) = lay.ends(pp_rank, c);
                Ok(ChunkPlan { layers, first, last })
            })
            .collect()
    }
}

/// A checkpoint with every tensor whole: `prefix/name` (prefix param, adam_m or adam_v) to values.
#[derive(Clone)]
pub struct FullCheckpoint {
    pub iteration: u64,
    pub meta: BTreeMap<String, String>,
    pub model: GptConfig,
    pub layout: Layout,
    pub tensors: BTreeMap<String, Vec<f32>>,
}

impl FullCheckpoint {
    /// The same model with each norm's scale held as itself: under `--apply-layernorm-1p` the
    /// weights `w` become `1 + w` and the architecture drops the flag (for formats that hold
    /// the scale, such as Hugging Face's).
    pub fn with_norm_scales(&self) -> FullCheckpoint {
        let mut out = self.clone();
        if out.model.arch.zero_centered_gamma {
            for (name, values) in out.tensors.iter_mut() {
                if name.strip_prefix("param/").is_some_and(crate::model::Arch::is_norm_weight) {
                    values.iter_mut().for_each(|v| *v += 1.0);
                }
            }
            out.model.arch.zero_centered_gamma = false;
        }
        out
    }
}

const PREFIXES: [&str; 3] = ["param", "adam_m", "adam_v"];

/// The tensor prefixes a checkpoint holds: all three, or the weights alone when it was saved with
/// `--no-save-optim` (its metadata says `optimizer_state` none).
pub fn held_prefixes(meta: &BTreeMap<String, String>) -> &'static [&'static str] {
    match meta.get("optimizer_state").map(String::as_str) {
        Some("none") => &PREFIXES[..1],
        _ => &PREFIXES,
    }
}

/// The layout the first shard of a checkpoint (`shard`, read from `path`, inside its iteration
/// directory) records for `model`, validated, once its iteration's shards are known to hold the
/// model's weights (and moments, where saved): what may be allocated from the metadata.
pub fn recorded_layout(shard: &Shard, path: &Path, model: &GptConfig) -> Result<Layout> {
    let layout = layout_of(shard, path)?;
    layout.validate(model).map_err(|e| Error::format(path, format!("the recorded layout: {e}")))?;
    let iter_dir =
        path.parent().and_then(Path::parent).ok_or_else(|| Error::format(path, "not inside an iteration directory"))?;
    ensure_shards_hold(iter_dir, model, &layout, held_prefixes(&shard.meta))?;
    Ok(layout)
}

/// The `virtual_pipeline_placement` a checkpoint records for a layout's chunks.
pub fn placement_name(v: bool) -> &'static str {
    if v {
        "v"
    } else {
        "interleaved"
    }
}

fn layout_of(shard: &Shard, path: &Path) -> Result<Layout> {
    let count = |key: &str| -> Result<usize> { shard.meta_value(path, key) };
    // Absent keys (older shards) take their defaults; a value present must parse.
    let or = |key: &str, default: usize| -> Result<usize> {
        shard.meta.get(key).map_or(Ok(default), |_| shard.meta_value(path, key))
    };
    let optional = |key: &str| -> Result<Option<usize>> {
        match shard.meta.get(key).map(String::as_str) {
            None | Some("none") => Ok(None),
            Some(_) => shard.meta_value(path, key).map(Some),
        }
    };
    Ok(Layout {
        tp: count("tensor_model_parallel_size")?,
        pp: count("pipeline_model_parallel_size")?,
        chunks: or("virtual_pipeline_chunks", 1)?,
        v: match shard.meta.get("virtual_pipeline_placement").map(String::as_str) {
            None | Some("interleaved") => false,
            Some("v") => true,
            Some(other) => {
                return Err(Error::format(
                    path,
                    format!("virtual_pipeline_placement is '{other}', not interleaved or v"),
                ))
            }
        },
        first_stage_layers: optional("decoder_first_pipeline_num_layers")?,
        last_stage_layers: optional("decoder_last_pipeline_num_layers")?,
        sequence_parallel: shard
            .meta
            .get("sequence_parallel")
            .map_or(Ok(false), |_| shard.meta_value(path, "sequence_parallel"))?,
        summa: match or("summa_q", 0)? {
            0 => None,
            q => Some((q, count("tesseract_depth")?)),
        },
    })
}

/// Checks that the shards of `layout` in `iter_dir` hold, in all, at least the bytes of `model`'s
/// weights and both AdamW moments, before anything that size is allocated: metadata alone cannot
/// make a reader allocate what the files do not hold.
fn ensure_shards_hold(iter_dir: &Path, model: &GptConfig, layout: &Layout, prefixes: &[&str]) -> Result<()> {
    let mut held = 0u64;
    for tp_rank in 0..layout.tp {
        for pp_rank in 0..layout.pp {
            let path = iter_dir.join(super::shard_name(tp_rank, pp_rank, layout.pp)).join(super::SHARD_FILE);
            held += std::fs::metadata(&path).map_err(|e| Error::io(&path, "read checkpoint shard", e))?.len();
        }
    }
    let needed = model.parameter_count().map_or(u64::MAX, |n| (n as u64).saturating_mul(prefixes.len() as u64 * 4));
    if held < needed {
        let what = if prefixes.len() == 1 { "without optimizer state" } else { "with both AdamW moments" };
        return Err(Error::format(
            iter_dir,
            format!(
                "the metadata describes {} parameters ({what}, {needed} bytes), but the {} shard(s) hold {held} \
                 bytes in all",
                model.parameter_count().unwrap_or(usize::MAX),
                layout.tp * layout.pp
            ),
        ));
    }
    Ok(())
}

/// Reads every shard of the latest checkpoint in `dir` and reassembles full tensors (trident's
/// own; `checkpoint::read_any` reads Megatron-LM's too).
pub fn read_full(dir: &Path) -> Result<FullCheckpoint> {
    let iteration = super::latest_iteration(dir)?;
    let iter_dir = super::iteration_dir(dir, iteration);
    // The first shard names the layout: mp_rank_00 without a pipeline, mp_rank_00_000 with one.
    let first_name = [super::shard_name(0, 0, 1), super::shard_name(0, 0, 2)]
        .into_iter()
        .find(|n| iter_dir.join(n).join(super::SHARD_FILE).exists())
        .ok_or_else(|| {
            let shard = iter_dir.join(super::shard_name(0, 0, 1)).join(super::SHARD_FILE);
            super::missing_shard(&shard, &iter_dir).unwrap_or_else(|| {
                Error::format(&iter_dir, "no mp_rank_00 or mp_rank_00_000 shard: not a complete checkpoint")
            })
        })?;
    let (_, first_path, first) = super::load_latest(dir, &first_name)?;
    let model = model_from_shard(&first, &first_path)?;
    let layout = recorded_layout(&first, &first_path, &model)?;
    let prefixes = held_prefixes(&first.meta);
    let mut tensors: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for p in model.parameters(&ModelParallel::single()) {
        for prefix in prefixes {
            tensors.insert(format!("{prefix}/{}", p.name), vec![f32::NAN; p.numel()]);
        }
    }
    for tp_rank in 0..layout.tp {
        for pp_rank in 0..layout.pp {
            let (_, path, shard) = super::load_latest(dir, &super::shard_name(tp_rank, pp_rank, layout.pp))?;
            let mp = layout.model_parallel(tp_rank);
            for (c, plan) in layout.plans(&model, pp_rank)?.iter().enumerate() {
                for info in model.chunk_parameters(&mp, plan).iter().filter(|i| !i.tied_copy) {
                    for prefix in prefixes {
                        let t = shard.tensor(&path, &format!("{prefix}/chunk{c}/{}", info.name))?;
                        if t.data.len() != info.numel() {
                            return Err(Error::format(
                                &path,
                                format!("tensor '{}' has {} elements, expected {}", t.name, t.data.len(), info.numel()),
                            ));
                        }
                        let full =
                            tensors.get_mut(&format!("{prefix}/{}", info.name)).expect("every parameter was listed");
                        for (local, &v) in t.data.iter().enumerate() {
                            full[info.global_index(local)] = v;
                        }
                    }
                }
            }
        }
    }
    if let Some((name, _)) = tensors.iter().find(|(_, v)| v.iter().any(|x| x.is_nan())) {
        return Err(Error::format(&iter_dir, format!("the shards do not cover all of {name}")));
    }
    Ok(FullCheckpoint { iteration, meta: first.meta.clone(), model, layout, tensors })
}

/// The parameters with a row per vocabulary entry (the output layer only when untied).
pub const VOCAB_ROWS: [&str; 2] = ["embedding.word_embeddings.weight", "output_layer.weight"];

impl FullCheckpoint {
    /// Pads (or trims) the vocabulary to `padded` rows, as Megatron's checkpoint converter does:
    /// new weight rows copy the last row, new AdamW moment rows are zero; rows past `padded` are
    /// dropped (never below the real vocabulary). Records `padded` in the model and the metadata.
    pub fn repad_vocab(&mut self, padded: usize) -> Result<()> {
        let (old, h) = (self.model.padded_vocab_size, self.model.hidden_size);
        if padded < self.model.vocab_size.max(1) || old == 0 {
            return Err(Error::Config(format!(
                "padding a vocabulary of {} ids held in {old} rows to {padded} rows",
                self.model.vocab_size
            )));
        }
        if padded == old {
            return Ok(());
        }
        for name in VOCAB_ROWS {
            for prefix in PREFIXES {
                let Some(t) = self.tensors.get_mut(&format!("{prefix}/{name}")) else { continue };
                t.truncate(padded.min(old) * h);
                let fill = match prefix {
                    "param" => t[(old - 1).min(padded - 1) * h..].to_vec(),
                    _ => vec![0.0; h],
                };
                while t.len() < padded * h {
                    t.extend_from_slice(&fill);
                }
            }
        }
        self.model.padded_vocab_size = padded;
        self.meta.insert("padded_vocab_size".into(), padded.to_string());
        self.model.validate()
    }
}

/// Writes `full` as a checkpoint of layout `target` in `dir`. Returns the iteration directory.
pub fn write_layout(full: &FullCheckpoint, dir: &Path, target: Layout) -> Result<PathBuf> {
    let cfg = &full.model;
    target.validate(cfg)?;
    super::begin(dir, full.iteration)?;
    for tp_rank in 0..target.tp {
        for pp_rank in 0..target.pp {
            let mp = target.model_parallel(tp_rank);
            let mut shard = Shard { meta: full.meta.clone(), tensors: Vec::new() };
            for (k, v) in [
                ("tensor_model_parallel_size", target.tp.to_string()),
                ("tensor_model_parallel_rank", tp_rank.to_string()),
                ("pipeline_model_parallel_size", target.pp.to_string()),
                ("pipeline_model_parallel_rank", pp_rank.to_string()),
                ("virtual_pipeline_chunks", target.chunks.to_string()),
                ("virtual_pipeline_placement", placement_name(target.v).to_string()),
                (
                    "decoder_first_pipeline_num_layers",
                    target.first_stage_layers.map_or("none".into(), |n| n.to_string()),
                ),
                ("decoder_last_pipeline_num_layers", target.last_stage_layers.map_or("none".into(), |n| n.to_string())),
                ("sequence_parallel", target.sequence_parallel.to_string()),
                ("tensor_parallel_mode", target.tensor_mode().describe()),
                ("summa_q", target.summa.map_or(0, |(q, _)| q).to_string()),
                ("tesseract_depth", target.summa.map_or(0, |(_, d)| d).to_string()),
            ] {
                shard.meta.insert(k.to_string(), v);
            }
            for (c, plan) in target.plans(cfg, pp_rank)?.iter().enumerate() {
                for info in cfg.chunk_parameters(&mp, plan) {
                    for prefix in held_prefixes(&full.meta) {
                        let whole = &full.tensors[&format!("{prefix}/{}", info.name)];
                        let data = (0..info.numel()).map(|local| whole[info.global_index(local)]).collect();
                        shard.tensors.push(SavedTensor {
                            name: format!("{prefix}/chunk{c}/{}", info.name),
                            shape: info.shape.clone(),
                            data,
                        });
                    }
                }
            }
            super::write_shard(dir, full.iteration, &super::shard_name(tp_rank, pp_rank, target.pp), &shard)?;
        }
    }
    super::commit(dir, full.iteration)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint holding only vocabulary-row tensors: 5 ids padded to 6 rows of width 2,
    /// row r of the weights holding (r, r), of both moments 1.
    fn vocab_only(untied: bool) -> FullCheckpoint {
        let model = GptConfig {
            num_layers: 1,
            hidden_size: 2,
            num_attention_heads: 1,
            ffn_hidden_size: 8,
            max_position_embeddings: 4,
            vocab_size: 5,
            padded_vocab_size: 6,
            init_method_std: 0.02,
            arch: crate::model::Arch::GPT2,
        };
        let mut tensors = BTreeMap::new();
        for name in &VOCAB_ROWS[..1 + untied as usize] {
            tensors.insert(format!("param/{name}"), (0..12).map(|i| (i / 2) as f32).collect());
            tensors.insert(format!("adam_m/{name}"), vec![1.0; 12]);
            tensors.insert(format!("adam_v/{name}"), vec![1.0; 12]);
        }
        FullCheckpoint { iteration: 0, meta: BTreeMap::new(), model, layout: Layout::single(), tensors }
    }

    #[test]
    fn repadding_copies_the_last_row_zeroes_new_moments_and_trims_back() {
        let mut c = vocab_only(true);
        c.repad_vocab(8).unwrap();
        assert_eq!((c.model.padded_vocab_size, c.meta["padded_vocab_size"].as_str()), (8, "8"));
        for name in VOCAB_ROWS {
            let want: Vec<f32> = (0..16).map(|i| (i / 2).min(5) as f32).collect();
            assert_eq!(c.tensors[&format!("param/{name}")], want, "{name}");
            for m in ["adam_m", "adam_v"] {
                let want: Vec<f32> = (0..16).map(|i| if i < 12 { 1.0 } else { 0.0 }).collect();
                assert_eq!(c.tensors[&format!("{m}/{name}")], want, "{m}/{name}");
            }
        }
        c.repad_vocab(5).unwrap();
        assert!(c.repad_vocab(4).is_err(), "below the vocabulary");
        assert_eq!(c.tensors["param/embedding.word_embeddings.weight"], [0., 0., 1., 1., 2., 2., 3., 3., 4., 4.]);
        assert_eq!(c.tensors["adam_v/output_layer.weight"], [1.0; 10]);
        // A tied model has no output layer to pad.
        let mut tied = vocab_only(false);
        tied.repad_vocab(7).unwrap();
        assert_eq!(tied.tensors.len(), 3);
        assert_eq!(tied.tensors["param/embedding.word_embeddings.weight"].len(), 14);
    }
}
