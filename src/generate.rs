//! `trident generate`: loads the latest checkpoint and samples a continuation of a prompt with
//! temperature and top-k, printing it as it is produced.

use crate::checkpoint;
use crate::checkpoint::shape::model_from_shard;
use crate::data::tokenizer::{PieceCache, Tokenizer};
use crate::device::cpu::CpuDevice;
use crate::device::prelude::*;
use crate::error::{Error, Result};
use crate::model::gpt::KvCache;
use crate::model::Gpt;
use crate::parallel::tensor::TensorParallel;
use crate::rng::Stream;
use std::io::Write;
use std::path::PathBuf;

pub struct GenerateArgs {
    pub load: PathBuf,
    pub prompt: String,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub top_k: usize,
    pub seed: u64,
    pub cpu_threads: usize,
    /// Keep each layer's keys and values (`Gpt::decode`); false recomputes the whole context.
    pub kv_cache: bool,
    /// The tokenizer the model was trained with (`--tokenizer-type` and its files).
    pub tokenizer: Tokenizer,
}

/// The logits of the position after `context`: from the cache, fed the positions it has not seen
/// (the whole prompt first, then one token per call), while the context fits the position table;
/// else (and without a cache) from the whole context's last `window` positions, recomputed.
fn next_logits(
    model: &mut Gpt<CpuDevice>,
    dev: &CpuDevice,
    context: &[u32],
    cache: &mut Option<KvCache<CpuDevice>>,
    window: usize,
) -> Vec<f32> {
    let vocab = model.cfg.padded_vocab_size;
    match cache {
        Some(c) if context.len() <= window => model.decode(dev, c, &context[c.len()..]),
        _ => {
            let ctx = &context[context.len().saturating_sub(window)..];
            let logits = model.forward(dev, TensorParallel::single(), ctx, 1, ctx.len());
            // Row order is t * batch + b, so with batch 1 the last position is the last row.
            let mut full = vec![0.0f32; dev.len(logits)];
            dev.download(logits, &mut full);
            full.split_off(full.len() - vocab)
        }
    }
}

/// Picks the next token from `logits` (the real vocabulary only): greedy when `top_k == 1` or
/// the temperature is 0, else a draw from the top-k softmax at `temperature` using `u` in (0, 1).
pub fn sample_token(logits: &[f32], temperature: f64, top_k: usize, u: f64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if top_k == 1 || temperature <= 0.0 {
        return order[0];
    }
    let k = if top_k == 0 { logits.len() } else { top_k.min(logits.len()) };
    let top = &order[..k];
    let max = logits[top[0]] as f64;
    let weights: Vec<f64> = top.iter().map(|&i| ((logits[i] as f64 - max) / temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut target = u * total;
    for (&i, w) in top.iter().zip(&weights) {
        if target < *w {
            return i;
        }
        target -= w;
    }
    top[k - 1]
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let (iteration, path, shard) = checkpoint::load_single(&args.load)?;
    let saved_tp: usize = shard.meta_value(&path, "tensor_model_parallel_size").unwrap_or(1);
    let saved_pp: usize = shard.meta_value(&path, "pipeline_model_parallel_size").unwrap_or(1);
    if saved_tp != 1 || saved_pp != 1 {
        return Err(Error::Unsupported(format!(
            "{} holds one shard of a tensor-parallel {saved_tp} x pipeline {saved_pp} model; generate reads \
             single-rank checkpoints (resharding arrives with `trident convert`)",
            path.display()
        )));
    }
    let cfg = model_from_shard(&shard, &path)?;
    let trained_with = shard.meta.get("tokenizer").map_or("ByteTokenizer", String::as_str);
    let tok = &args.tokenizer;
    if trained_with != tok.type_name() {
        return Err(Error::Config(format!(
            "{} was trained with --tokenizer-type {trained_with}: pass it (and its files) to generate, not {}",
            path.display(),
            tok.type_name()
        )));
    }
    if tok.vocab_size() > cfg.vocab_size {
        return Err(Error::Config(format!(
            "the tokenizer has {} ids but {} has a vocabulary of {}: not the tokenizer it was trained with",
            tok.vocab_size(),
            path.display(),
            cfg.vocab_size
        )));
    }
    // Every parameter is checked against the shard before the model is built, so a shard's
    // metadata cannot make this allocate a model the file does not hold.
    let held: usize = shard.tensors.iter().map(|t| t.data.len()).sum();
    let described = cfg.parameter_count().unwrap_or(usize::MAX);
    if described > held {
        return Err(Error::format(
            &path,
            format!("the metadata describes {described} parameters but the shard holds {held} values"),
        ));
    }
    for info in cfg.parameters(&crate::model::ModelParallel::single()) {
        let t = shard.tensor(&path, &format!("param/chunk0/{}", info.name))?;
        if t.shape != info.shape {
            return Err(Error::format(
                &path,
                format!("tensor '{}' has shape {:?}, expected {:?}", t.name, t.shape, info.shape),
            ));
        }
    }
    tok.check_text(args.prompt.as_bytes(), "--prompt")?;
    let mut context = tok.encode(args.prompt.as_bytes(), &mut PieceCache::default());
    if context.is_empty() {
        context.push(tok.eod());
    }
    // Rotary positions and the cache need no more positions than the prompt and the new tokens
    // (a learned position table is a parameter, held whole).
    let mut run_cfg = cfg.clone();
    if cfg.arch.position_embedding != crate::model::PositionEmbedding::LearnedAbsolute {
        let needed = context.len().saturating_add(args.max_new_tokens);
        run_cfg.max_position_embeddings = cfg.max_position_embeddings.min(needed);
    }
    let dev = CpuDevice::new(args.cpu_threads);
    let mut model = Gpt::new(&dev, run_cfg, 0);
    for (i, info) in model.params.info.iter().enumerate() {
        let t = shard.tensor(&path, &format!("param/chunk0/{}", info.name))?;
        dev.upload(&mut model.params.values[i], &t.data);
    }
    // What the norms read under --apply-layernorm-1p (1 + w) follows the loaded weights.
    model.refresh_working_weights(&dev);
    drop(shard);
    eprintln!(" loaded {} (iteration {iteration}); sampling {} tokens", path.display(), args.max_new_tokens);

    let stream = Stream::new(args.seed, "generate", 1);
    let mut out = std::io::stdout().lock();
    let io_err = |e| Error::io(std::path::Path::new("<stdout>"), "write", e);
    out.write_all(args.prompt.as_bytes()).map_err(io_err)?;
    // Past the position table the window slides (with a shortened table the context never gets
    // there).
    let window = model.cfg.max_position_embeddings;
    let mut cache = args.kv_cache.then(|| model.kv_cache(&dev));
    for step in 0..args.max_new_tokens {
        let host = next_logits(&mut model, &dev, &context, &mut cache, window);
        let next = sample_token(&host[..cfg.vocab_size], args.temperature, args.top_k, stream.uniform(step as u64, 0));
        context.push(next as u32);
        // Raw bytes go straight out, so a multi-byte character split over tokens still prints
        // whole; the end-of-document id is shown as the paragraph break it stands for.
        out.write_all(&tok.token_bytes(next as u32)).map_err(io_err)?;
        out.flush().map_err(io_err)?;
    }
    out.write_all(b"\n").map_err(io_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_top_k_sampling() {
        let logits = [0.0, 3.0, 1.0, 2.0];
        assert_eq!(sample_token(&logits, 1.0, 1, 0.99), 1);
        assert_eq!(sample_token(&logits, 0.0, 40, 0.99), 1);
        // With top-2 only tokens 1 and 3 can be drawn, whatever the uniform draw.
        for u in [0.0, 0.3, 0.7, 0.999] {
            let t = sample_token(&logits, 1.0, 2, u);
            assert!(t == 1 || t == 3);
        }
        assert_eq!(sample_token(&logits, 1.0, 2, 0.999), 3);
    }
}
