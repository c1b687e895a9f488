//! Hugging Face interchange: a checkpoint's weights as a GPT-2 `model.safetensors` plus
//! `config.json` (Hugging Face tensor names and shapes; its Conv1D weights are stored [in, out],
//! and its fused QKV columns are [all q | all k | all v] where ours are grouped per head), and the
//! reverse, so a model trained here loads in `transformers` and a GPT-2 from there trains here.
//! Llama-family models go to and come from `LlamaForCausalLM` in `hf_llama.rs` (dispatched from
//! here); the files themselves are read and written by `hf_files.rs`.

use super::convert::FullCheckpoint;
use super::hf_files::{read_hf_weights, write_atomic, write_safetensors, Fields};
use super::tokenizer::{fields_json, trident_fields, HfTokenizer};
use crate::data::json::{document, Json};
use crate::error::{Error, Result};
use crate::model::GptConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Our fused QKV row for Hugging Face's c_attn column `col`: HF orders [all q | all k | all v],
/// we order per head [q_h | k_h | v_h].
fn qkv_row(col: usize, heads: usize, head_dim: usize) -> usize {
    let h = heads * head_dim;
    let (part, rest) = (col / h, col % h);
    let (head, j) = (rest / head_dim, rest % head_dim);
    head * 3 * head_dim + part * head_dim + j
}

/// `[rows, cols]` row-major to `[cols, rows]`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = x[r * cols + c];
        }
    }
    out
}

/// The Hugging Face GPT-2 tensors of our parameters, by name: (hf name, hf shape, values).
pub fn to_hf(cfg: &GptConfig, params: &BTreeMap<String, Vec<f32>>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (h, f, heads, d) = (cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.head_dim());
    let p = |name: &str| params[name].clone();
    let mut out = vec![
        ("wte.weight".to_string(), vec![cfg.padded_vocab_size, h], p("embedding.word_embeddings.weight")),
        ("wpe.weight".to_string(), vec![cfg.max_position_embeddings, h], p("embedding.position_embeddings.weight")),
    ];
    for l in 0..cfg.num_layers {
        let ours = |s: &str| params[&format!("decoder.layers.{l}.{s}")].clone();
        let hf = |s: &str| format!("h.{l}.{s}");
        let qkv_w = ours("self_attention.linear_qkv.weight");
        let qkv_b = ours("self_attention.linear_qkv.bias");
        // c_attn.weight[i][col] = our qkv weight[row(col)][i].
        let mut c_attn = vec![0f32; h * 3 * h];
        let mut c_attn_b = vec![0f32; 3 * h];
        for col in 0..3 * h {
            let row = qkv_row(col, heads, d);
            c_attn_b[col] = qkv_b[row];
            for i in 0..h {
                c_attn[i * 3 * h + col] = qkv_w[row * h + i];
            }
        }
        out.extend([
            (hf("ln_1.weight"), vec![h], ours("input_layernorm.weight")),
            (hf("ln_1.bias"), vec![h], ours("input_layernorm.bias")),
            (hf("attn.c_attn.weight"), vec![h, 3 * h], c_attn),
            (hf("attn.c_attn.bias"), vec![3 * h], c_attn_b),
            (hf("attn.c_proj.weight"), vec![h, h], transpose(&ours("self_attention.linear_proj.weight"), h, h)),
            (hf("attn.c_proj.bias"), vec![h], ours("self_attention.linear_proj.bias")),
            (hf("ln_2.weight"), vec![h], ours("pre_mlp_layernorm.weight")),
            (hf("ln_2.bias"), vec![h], ours("pre_mlp_layernorm.bias")),
            (hf("mlp.c_fc.weight"), vec![h, f], transpose(&ours("mlp.linear_fc1.weight"), f, h)),
            (hf("mlp.c_fc.bias"), vec![f], ours("mlp.linear_fc1.bias")),
            (hf("mlp.c_proj.weight"), vec![f, h], transpose(&ours("mlp.linear_fc2.weight"), h, f)),
            (hf("mlp.c_proj.bias"), vec![h], ours("mlp.linear_fc2.bias")),
        ]);
    }
    out.push(("ln_f.weight".to_string(), vec![h], p("decoder.final_layernorm.weight")));
    out.push(("ln_f.bias".to_string(), vec![h], p("decoder.final_layernorm.bias")));
    out
}

/// Writes `full`'s weights to `dir` as `model.safetensors` and `config.json`: a
/// `GPT2LMHeadModel` for GPT-2's architecture, else a `LlamaForCausalLM` (`hf_llama`).
pub fn export_hf(full: &FullCheckpoint, dir: &Path, tok: &HfTokenizer) -> Result<()> {
    let cfg = &full.model;
    if cfg.arch.zero_centered_gamma {
        // Hugging Face models hold each norm's scale itself: 1 + w.
        return export_hf(&full.with_norm_scales(), dir, tok);
    }
    if !cfg.arch.features().is_empty() {
        return super::hf_llama::export(full, dir, tok);
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let params: BTreeMap<String, Vec<f32>> =
        full.tensors.iter().filter_map(|(k, v)| k.strip_prefix("param/").map(|n| (n.to_string(), v.clone()))).collect();
    write_safetensors(&dir.join("model.safetensors"), &to_hf(cfg, &params))?;
    let config = format!(
        "{{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": {},\n  \
         \"n_positions\": {},\n  \"n_ctx\": {},\n  \"n_embd\": {},\n  \"n_layer\": {},\n  \"n_head\": {},\n  \
         \"n_inner\": {},\n  \"activation_function\": \"{}\",\n  \"layer_norm_epsilon\": {:?},\n  \
         \"initializer_range\": {},\n  \"tie_word_embeddings\": true,\n{}\n}}\n",
        cfg.padded_vocab_size,
        cfg.max_position_embeddings,
        cfg.max_position_embeddings,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_attention_heads,
        cfg.ffn_hidden_size,
        // Hugging Face's names: GPT-2's tanh form, or the exact GELU.
        if cfg.arch.gelu == crate::device::Gelu::Erf { "gelu" } else { "gelu_new" },
        cfg.arch.norm_epsilon,
        cfg.init_method_std,
        fields_json(&trident_fields(full, tok)),
    );
    write_atomic(&dir.join("config.json"), config.as_bytes())
}

/// The parsed config.json of a Hugging Face directory, and its path.
pub fn read_config(dir: &Path) -> Result<(Json, PathBuf)> {
    let path = dir.join("config.json");
    let text = crate::files::read_regular(&path, "read")?;
    Ok((document(&text, &path)?, path))
}

/// A GPT-2 config's `activation_function` as trident's GELU: the tanh form (`gelu_new`, GPT-2's
/// default, or `gelu_pytorch_tanh`) or the exact one (`gelu`); any other is refused.
fn hf_gelu(config: &Json, path: &Path) -> Result<crate::device::Gelu> {
    match config.get("activation_function").map(|v| v.as_str()) {
        None | Some(Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast")) => Ok(crate::device::Gelu::Tanh),
        Some(Some("gelu")) => Ok(crate::device::Gelu::Erf),
        Some(other) => Err(Error::format(
            path,
            format!(
                "activation_function {}: trident's GPT-2 runs gelu_new (the tanh form) or gelu (the exact one)",
                other.unwrap_or("(not a string)")
            ),
        )),
    }
}

/// Reads a Hugging Face directory (`config.json`, parsed as `config`, and `model.safetensors`)
/// into our model shape and full parameters: a `LlamaForCausalLM` (by `model_type` or
/// `architectures`) through `hf_llama`, else a GPT-2.
pub fn import_hf(dir: &Path, config: &Json) -> Result<(GptConfig, BTreeMap<String, Vec<f32>>)> {
    let config_path = dir.join("config.json");
    let model_type = config.get("model_type").and_then(Json::as_str);
    let llama_class = matches!(config.get("architectures"), Some(Json::Arr(a)) if a.iter().any(|x| x.as_str() == Some("LlamaForCausalLM")));
    match model_type {
        Some("llama") => return super::hf_llama::import(config, &config_path, dir),
        None if llama_class => return super::hf_llama::import(config, &config_path, dir),
        None | Some("gpt2") => {}
        Some(other) => {
            return Err(Error::format(
                &config_path,
                format!("model_type '{other}': convert --load-hf reads GPT-2 ('gpt2') and Llama ('llama') models"),
            ))
        }
    }
    let c = Fields { json: config, path: &config_path };
    let h = c.count("n_embd", None)?;
    let vocab = c.count("vocab_size", None)?;
    let cfg = GptConfig {
        num_layers: c.count("n_layer", None)?,
        hidden_size: h,
        num_attention_heads: c.count("n_head", None)?,
        ffn_hidden_size: c.count("n_inner", Some(h.saturating_mul(4)))?,
        max_position_embeddings: c.count("n_positions", None)?,
        vocab_size: c.count("trident_unpadded_vocab_size", Some(vocab))?,
        padded_vocab_size: vocab,
        init_method_std: 0.02,
        arch: crate::model::Arch {
            norm_epsilon: c.number("layer_norm_epsilon", 1e-5)?,
            gelu: hf_gelu(config, &config_path)?,
            ..crate::model::Arch::GPT2
        },
    };
    cfg.validate().map_err(|e| Error::format(&config_path, format!("describes no valid model: {e}")))?;
    let (st_path, mut tensors) = read_hf_weights(dir)?;
    // Some exports prefix every name with "transformer.".
    let keys: Vec<String> = tensors.keys().cloned().collect();
    for k in keys {
        if let Some(short) = k.strip_prefix("transformer.") {
            let v = tensors.remove(&k).expect("key listed");
            tensors.insert(short.to_string(), v);
        }
    }
    let (f, heads, d) = (cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.head_dim());
    let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let (s, v) =
            tensors.remove(name).ok_or_else(|| Error::format(&st_path, format!("tensor '{name}' is missing")))?;
        if s != shape {
            return Err(Error::format(
                &st_path,
                format!("tensor '{name}' has shape {s:?}, expected {shape:?} from config.json"),
            ));
        }
        Ok(v)
    };
    let mut params = BTreeMap::new();
    params.insert("embedding.word_embeddings.weight".to_string(), take("wte.weight", &[vocab, h])?);
    params.insert(
        "embedding.position_embeddings.weight".to_string(),
        take("wpe.weight", &[cfg.max_position_embeddings, h])?,
    );
    for l in 0..cfg.num_layers {
        let hf = |s: &str| format!("h.{l}.{s}");
        let ours = |s: &str| format!("decoder.layers.{l}.{s}");
        let c_attn = take(&hf("attn.c_attn.weight"), &[h, 3 * h])?;
        let c_attn_b = take(&hf("attn.c_attn.bias"), &[3 * h])?;
        let mut qkv_w = vec![0f32; 3 * h * h];
        let mut qkv_b = vec![0f32; 3 * h];
        for col in 0..3 * h {
            let row = qkv_row(col, heads, d);
            qkv_b[row] = c_attn_b[col];
            for i in 0..h {
                qkv_w[row * h + i] = c_attn[i * 3 * h + col];
            }
        }
        params.insert(ours("input_layernorm.weight"), take(&hf("ln_1.weight"), &[h])?);
        params.insert(ours("input_layernorm.bias"), take(&hf("ln_1.bias"), &[h])?);
        params.insert(ours("self_attention.linear_qkv.weight"), qkv_w);
        params.insert(ours("self_attention.linear_qkv.bias"), qkv_b);
        params.insert(
            ours("self_attention.linear_proj.weight"),
            transpose(&take(&hf("attn.c_proj.weight"), &[h, h])?, h, h),
        );
        params.insert(ours("self_attention.linear_proj.bias"), take(&hf("attn.c_proj.bias"), &[h])?);
        params.insert(ours("pre_mlp_layernorm.weight"), take(&hf("ln_2.weight"), &[h])?);
        params.insert(ours("pre_mlp_layernorm.bias"), take(&hf("ln_2.bias"), &[h])?);
        params.insert(ours("mlp.linear_fc1.weight"), transpose(&take(&hf("mlp.c_fc.weight"), &[h, f])?, h, f));
        params.insert(ours("mlp.linear_fc1.bias"), take(&hf("mlp.c_fc.bias"), &[f])?);
        params.insert(ours("mlp.linear_fc2.weight"), transpose(&take(&hf("mlp.c_proj.weight"), &[f, h])?, f, h));
        params.insert(ours("mlp.linear_fc2.bias"), take(&hf("mlp.c_proj.bias"), &[h])?);
    }
    params.insert("decoder.final_layernorm.weight".to_string(), take("ln_f.weight", &[h])?);
    params.insert("decoder.final_layernorm.bias".to_string(), take("ln_f.bias", &[h])?);
    Ok((cfg, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_permutation_is_a_bijection() {
        let (heads, d) = (3, 4);
        let mut seen = vec![false; 3 * heads * d];
        for col in 0..3 * heads * d {
            seen[qkv_row(col, heads, d)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // HF column of head 1's k[2] is h + 1*d + 2; our row is 1*3d + d + 2.
        assert_eq!(qkv_row(12 + 4 + 2, heads, d), 12 + 4 + 2);
        assert_eq!(qkv_row(4, heads, d), 12);
    }
}
