//! `trident convert`: reads a checkpoint (trident's, or Hugging Face GPT-2 or Llama weights as a
//! fresh checkpoint at iteration 0) and writes it in another tensor/pipeline layout
//! (`checkpoint::convert`) and/or as Hugging Face weights (`checkpoint::safetensors`, which hands
//! Llamas to `checkpoint::hf_llama`).

use super::flags;
use crate::checkpoint::convert::{read_full, write_layout, FullCheckpoint, Layout};
use crate::checkpoint::safetensors::{export_hf, import_hf};
use crate::cli::Args;
use crate::error::{Error, Result};
use crate::parallel::grid::TensorMode;
use std::collections::BTreeMap;
use std::path::Path;
use crate::flags::CONVERT_FLAGS;

/// `trident convert`: reshard a checkpoint, or move weights to and from Hugging Face's format.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) =
        flags("convert", "reshard a checkpoint, or export / import Hugging Face GPT-2 / Llama", CONVERT_FLAGS, rest)?
    else {
        return Ok(());
    };
    let full = match (a.path("--load"), a.path("--load-hf")) {
        (Some(dir), None) => read_full(&dir)?,
        (None, Some(dir)) => from_hf(&dir)?,
        _ => return Err(Error::Usage("convert needs exactly one of --load DIR or --load-hf DIR".into())),
    };
    if a.path("--save").is_none() && a.path("--save-hf").is_none() {
        return Err(Error::Usage("convert needs --save DIR and/or --save-hf DIR".into()));
    }
    if let Some(dir) = a.path("--save-hf") {
        export_hf(&full, &dir)?;
        println!("wrote {} and {}", dir.join("config.json").display(), dir.join("model.safetensors").display());
    }
    if let Some(dir) = a.path("--save") {
        save(&a, &full, &dir)?;
        // The tokenizer saved beside the source checkpoints goes with them.
        if let Some(flags) = a.path("--load").map(|src| crate::checkpoint::tokenizer::saved_flags(&src)).transpose()? {
            crate::checkpoint::tokenizer::save(&dir, &flags.unwrap_or_default())?;
        }
    }
    Ok(())
}

/// Hugging Face GPT-2 or Llama weights as a one-rank checkpoint at iteration 0, with zeroed Adam
/// moments.
fn from_hf(dir: &Path) -> Result<FullCheckpoint> {
    let (model, params) = import_hf(dir)?;
    let mut meta = BTreeMap::new();
    for (k, v) in [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", "0".to_string()),
        ("consumed_train_samples", "0".to_string()),
        ("consumed_valid_samples", "0".to_string()),
        ("adam_step", "0".to_string()),
        ("seed", "1234".to_string()),
        ("tokenizer", "ByteTokenizer".to_string()),
        ("seq_length", model.max_position_embeddings.to_string()),
        ("imported_from", dir.display().to_string()),
    ]
    .into_iter()
    .chain(crate::checkpoint::shape::model_meta(&model))
    {
        meta.insert(k.to_string(), v);
    }
    let mut tensors = BTreeMap::new();
    for (name, values) in params {
        tensors.insert(format!("adam_m/{name}"), vec![0.0; values.len()]);
        tensors.insert(format!("adam_v/{name}"), vec![0.0; values.len()]);
        tensors.insert(format!("param/{name}"), values);
    }
    let layout = Layout {
        tp: 1,
        pp: 1,
        chunks: 1,
        first_stage_layers: None,
        last_stage_layers: None,
        sequence_parallel: false,
        summa: None,
    };
    Ok(FullCheckpoint { iteration: 0, meta, model, layout, tensors })
}

/// `--save DIR`: `full` written in the layout the `--target-*` flags describe.
fn save(a: &Args, full: &FullCheckpoint, dir: &Path) -> Result<()> {
    let positive = |name: &str, default: usize| -> Result<usize> {
        match a.usize(name)? {
            Some(0) => Err(Error::flag(name, 0, "a positive whole number")),
            other => Ok(other.unwrap_or(default)),
        }
    };
    let (tp, pp) = (positive("--target-tensor-parallel-size", 1)?, positive("--target-pipeline-parallel-size", 1)?);
    let chunks = match a.usize("--target-num-layers-per-virtual-pipeline-stage")? {
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
