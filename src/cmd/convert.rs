//! `trident convert`: reads a checkpoint (trident's, or Hugging Face GPT-2 or Llama weights as a
//! fresh checkpoint at iteration 0) and writes it in another tensor/pipeline layout
//! (`checkpoint::convert`) and/or as Hugging Face weights (`checkpoint::safetensors`, which hands
//! Llamas to `checkpoint::hf_llama`), or as a Megatron-LM torch_dist checkpoint
//! (`checkpoint::megatron`), which `--load` also reads.

use super::flags;
use crate::checkpoint::convert::{write_layout, FullCheckpoint, Layout};
use crate::checkpoint::safetensors::{export_hf, import_hf, read_config};
use crate::checkpoint::tokenizer;
use crate::cli::Args;
use crate::data::json::Json;
use crate::error::{Error, Result};
use crate::flags::CONVERT_FLAGS;
use crate::model::GptConfig;
use crate::parallel::grid::TensorMode;
use std::collections::BTreeMap;
use std::path::Path;

/// `trident convert`: reshard a checkpoint, or move weights to and from Hugging Face's format.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) =
        flags("convert", "reshard a checkpoint, or export / import Hugging Face GPT-2 / Llama", CONVERT_FLAGS, rest)?
    else {
        return Ok(());
    };
    // The tokenizer goes with the weights: the one saved beside the checkpoints, or the one
    // beside the Hugging Face weights.
    let (mut full, tokenizer) = match (a.path("--load"), a.path("--load-hf")) {
        (Some(dir), None) => (crate::checkpoint::read_any(&dir)?, tokenizer::saved_flags(&dir)?.unwrap_or_default()),
        (None, Some(dir)) => {
            let (config, _) = read_config(&dir)?;
            let mut full = from_hf(&dir, &config)?;
            let (flags, kind) = tokenizer::from_hf(&dir, &config, full.model.vocab_size)?;
            full.meta.insert("tokenizer".into(), kind);
            (full, flags)
        }
        _ => return Err(Error::Usage("convert needs exactly one of --load DIR or --load-hf DIR".into())),
    };
    if ["--save", "--save-hf", "--save-megatron"].iter().all(|f| a.path(f).is_none()) {
        return Err(Error::Usage("convert needs --save DIR, --save-hf DIR and/or --save-megatron DIR".into()));
    }
    if let Some(dir) = a.path("--save-megatron") {
        let written = crate::checkpoint::megatron::dist::write(&full, &dir)?;
        println!("wrote iteration {} as a Megatron-LM torch_dist checkpoint: {}", full.iteration, written.display());
    }
    if let Some(dir) = a.path("--save-hf") {
        let kind = full.meta.get("tokenizer").map_or("ByteTokenizer", String::as_str);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create directory", e))?;
        let tok = tokenizer::export_hf(&tokenizer, kind, &dir)?;
        export_hf(&full, &dir, &tok)?;
        let beside = if tokenizer.is_empty() { String::new() } else { format!(", with its {} files", tok.type_name) };
        println!("wrote {} and {}{beside}", dir.join("config.json").display(), dir.join("model.safetensors").display());
    }
    if let Some(dir) = a.path("--save") {
        save(&a, &mut full, &dir)?;
        tokenizer::save(&dir, &tokenizer)?;
    }
    Ok(())
}

/// Hugging Face GPT-2 or Llama weights as a one-rank checkpoint at iteration 0, with zeroed Adam
/// moments (`config`: its config.json).
fn from_hf(dir: &Path, config: &Json) -> Result<FullCheckpoint> {
    let (model, params) = import_hf(dir, config)?;
    let mut meta = BTreeMap::new();
    for (k, v) in [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", "0".to_string()),
        ("consumed_train_samples", "0".to_string()),
        ("consumed_valid_samples", "0".to_string()),
        ("adam_step", "0".to_string()),
        ("seed", "1234".to_string()),
        ("seq_length", model.max_position_embeddings.to_string()),
        ("imported_from", dir.display().to_string()),
    ]
    .into_iter()
    .chain(crate::checkpoint::shape::model_meta(&model))
    {
        meta.insert(k.to_string(), v);
    }
    // The padding multiple a trident export records, so that `--save` pads as it was trained.
    if let Some(v) = config.get("trident_make_vocab_size_divisible_by") {
        let path = dir.join("config.json");
        let by = v
            .as_usize()
            .ok_or_else(|| Error::format(&path, "'trident_make_vocab_size_divisible_by' is not a whole number"))?;
        GptConfig::padded_vocab(model.vocab_size, by, 1, Some(&path))?;
        meta.insert("make_vocab_size_divisible_by".into(), by.to_string());
    }
    let mut tensors = BTreeMap::new();
    for (name, values) in params {
        tensors.insert(format!("adam_m/{name}"), vec![0.0; values.len()]);
        tensors.insert(format!("adam_v/{name}"), vec![0.0; values.len()]);
        tensors.insert(format!("param/{name}"), values);
    }
    Ok(FullCheckpoint { iteration: 0, meta, model, layout: Layout::single(), tensors })
}

/// `--save DIR`: `full` written in the layout the `--target-*` flags describe, its vocabulary
/// padded for that layout as `train` pads it.
fn save(a: &Args, full: &mut FullCheckpoint, dir: &Path) -> Result<()> {
    let positive = |name: &str, default: usize| -> Result<usize> {
        match a.usize(name)? {
            Some(0) => Err(Error::flag(name, 0, "a positive whole number")),
            other => Ok(other.unwrap_or(default)),
        }
    };
    let (tp, pp) = (positive("--target-tensor-parallel-size", 1)?, positive("--target-pipeline-parallel-size", 1)?);
    let v = match a.str("--target-pipeline-schedule") {
        None => false,
        Some("zb-v") if pp > 1 => true,
        Some(s) => {
            let why = if s == "zb-v" {
                "a pipeline of at least 2 stages"
            } else {
                "zb-v (the one schedule that places layers its own way)"
            };
            return Err(Error::flag("--target-pipeline-schedule", s, why));
        }
    };
    let chunks = match a.usize("--target-num-layers-per-virtual-pipeline-stage")? {
        None if v => 2,
        None => 1,
        Some(n) if n > 0 && pp > 1 && full.model.num_layers.is_multiple_of(n * pp) => full.model.num_layers / (n * pp),
        Some(n) => {
            return Err(Error::Config(format!(
                "--target-num-layers-per-virtual-pipeline-stage {n} does not split {} layers over {pp} stages",
                full.model.num_layers
            )))
        }
    };
    let mode = TensorMode::new(
        a.str("--target-tensor-parallel-mode").unwrap_or("1d"),
        a.usize("--target-tesseract-depth")?,
        tp,
    )
    .map_err(|e| Error::Config(e.to_string().replace("--t", "--target-t")))?;
    let target = Layout {
        v,
        tp,
        pp,
        chunks,
        first_stage_layers: None,
        last_stage_layers: None,
        sequence_parallel: a.has("--target-sequence-parallel"),
        summa: match mode {
            TensorMode::OneD => None,
            TensorMode::Summa { q, depth } => Some((q, depth)),
        },
    };
    repad_for(a, full, tp)?;
    let written = write_layout(full, dir, target)?;
    println!(
        "converted iteration {} from tensor-parallel {} [{}] x pipeline {} to tensor-parallel {tp} [{}] x pipeline \
         {pp}: {}",
        full.iteration,
        full.layout.tp,
        full.layout.tensor_mode().describe(),
        full.layout.pp,
        target.tensor_mode().describe(),
        written.display()
    );
    Ok(())
}

/// Pads the vocabulary to a multiple of `--make-vocab-size-divisible-by` (else the checkpoint's
/// own, else Megatron's 128) times the target tensor-parallel size `tp`, saying so when it changes.
fn repad_for(a: &Args, full: &mut FullCheckpoint, tp: usize) -> Result<()> {
    let flag = "--make-vocab-size-divisible-by";
    let (by, to) = match a.usize(flag)? {
        Some(k) => (k, GptConfig::padded_vocab(full.model.vocab_size, k, tp, None)?),
        None => {
            let recorded = full.meta.get("make_vocab_size_divisible_by").map(|v| {
                v.parse()
                    .map_err(|_| Error::Config(format!("the checkpoint records make_vocab_size_divisible_by '{v}'")))
            });
            let by = recorded.transpose()?.unwrap_or(128);
            let to = GptConfig::padded_vocab(full.model.vocab_size, by, tp, None)
                .map_err(|e| Error::Config(format!("the value the checkpoint records: {e}")))?;
            (by, to)
        }
    };
    let from = full.model.padded_vocab_size;
    if from != to {
        full.repad_vocab(to)?;
        println!(
            "padded the vocabulary of {} from {from} to {to} rows ({flag} {by} x tensor-parallel size {tp}; new rows \
             copy the last one, as Megatron's converter does)",
            full.model.vocab_size
        );
    }
    full.meta.insert("make_vocab_size_divisible_by".into(), by.to_string());
    Ok(())
}
