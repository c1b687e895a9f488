//! Hugging Face interchange for Llama-family models: a checkpoint as `LlamaForCausalLM`'s
//! `config.json` and `model.safetensors`, and the reverse (`safetensors.rs` dispatches here by the
//! model's architecture on export and by config.json's `model_type` / `architectures` on import).
//!
//! The layouts: our fused QKV weight holds, per query group, the group's query heads, then its key
//! head, then its value head (`[q_g0 .. q_g(n-1) | k_g | v_g]`, `head_dim` rows each: Megatron's
//! layout); Hugging Face keeps `q_proj`, `k_proj` and `v_proj` apart, query head j reading
//! key/value head j / n. Our rotary embedding rotates the pairs (i, i + d/2) as Hugging Face's
//! `rotate_half` does, so query and key rows move across unpermuted (Meta's original checkpoints
//! interleave the pairs and need a permutation; neither side here does). fc1 under SwiGLU is
//! `[gate; up]`: `gate_proj` and `up_proj`. Every other weight is `[out, in]` on both sides.
//!
//! What `LlamaForCausalLM` cannot express (LayerNorm, a GELU MLP, learned or no positions, rotary
//! embedding on part of the head) and what trident cannot (another activation or rope type, Llama
//! 3.1 scaling with other constants, biases on attention but not on the MLP or the reverse) is
//! one error naming it.

use super::convert::FullCheckpoint;
use super::hf_files::{read_hf_weights, write_atomic, write_safetensors, Fields, NamedTensors};
use super::tokenizer::HfTokenizer;
use super::tokenizer::{fields_json, trident_fields};
use crate::data::json::Json;
use crate::error::{Error, Result};
use crate::model::arch::ROPE_SCALING;
use crate::model::{Arch, GptConfig, Normalization, PositionEmbedding};
use std::collections::BTreeMap;
use std::path::Path;

/// Which of Hugging Face's attention projections a row of our fused QKV weight belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proj {
    Q,
    K,
    V,
}

/// Where row `row` of our fused QKV weight lives in Hugging Face's projections: (projection, row).
fn qkv_source(row: usize, heads: usize, groups: usize, head_dim: usize) -> (Proj, usize) {
    let per_group = heads / groups;
    let block = (per_group + 2) * head_dim;
    let (g, r) = (row / block, row % block);
    if r < per_group * head_dim {
        (Proj::Q, g * per_group * head_dim + r)
    } else if r < (per_group + 1) * head_dim {
        (Proj::K, g * head_dim + r - per_group * head_dim)
    } else {
        (Proj::V, g * head_dim + r - (per_group + 1) * head_dim)
    }
}

/// What `LlamaForCausalLM` cannot express in this architecture, one phrase each.
fn unexpressible(cfg: &GptConfig) -> Vec<String> {
    let arch = &cfg.arch;
    let mut out = Vec::new();
    if arch.normalization == Normalization::LayerNorm {
        out.push("LayerNorm (Llama normalises with RMSNorm)".to_string());
    }
    if !arch.swiglu {
        out.push("a GELU MLP (Llama's MLP is SwiGLU)".to_string());
    }
    match arch.position_embedding {
        PositionEmbedding::Rope => {}
        PositionEmbedding::LearnedAbsolute => out.push("learned absolute positions (Llama rotates)".to_string()),
        PositionEmbedding::None => out.push("no position embedding (Llama rotates)".to_string()),
    }
    let (rd, d) = (arch.rotary_dim(cfg.head_dim()), cfg.head_dim());
    if arch.position_embedding == PositionEmbedding::Rope && rd != d {
        out.push(format!(
            "rotary embedding on {rd} of {d} head dimensions (--rotary-percent {}; Llama rotates the whole head)",
            arch.rotary_percent
        ));
    }
    out
}

/// Llama's config.json for `cfg`: both transformers 5's `rope_parameters` and the `rope_theta` /
/// `rope_scaling` pair that earlier versions read (transformers 5 reads either).
fn config_json(cfg: &GptConfig, trident: Vec<(&'static str, String)>) -> String {
    let arch = &cfg.arch;
    let (factor, low, high, old) = ROPE_SCALING;
    let llama3 = format!(
        "\"factor\": {factor:?}, \"low_freq_factor\": {low:?}, \"high_freq_factor\": {high:?}, \
         \"original_max_position_embeddings\": {}",
        old as usize
    );
    let theta = arch.rotary_base;
    let (rope_scaling, rope_parameters) = if arch.rope_scaling {
        (
            format!("{{\"rope_type\": \"llama3\", {llama3}}}"),
            format!("{{\"rope_type\": \"llama3\", \"rope_theta\": {theta:?}, {llama3}}}"),
        )
    } else {
        ("null".to_string(), format!("{{\"rope_type\": \"default\", \"rope_theta\": {theta:?}}}"))
    };
    let fields = [
        ("architectures", "[\"LlamaForCausalLM\"]".to_string()),
        ("model_type", "\"llama\"".to_string()),
        ("vocab_size", cfg.padded_vocab_size.to_string()),
        ("hidden_size", cfg.hidden_size.to_string()),
        ("intermediate_size", cfg.ffn_hidden_size.to_string()),
        ("num_hidden_layers", cfg.num_layers.to_string()),
        ("num_attention_heads", cfg.num_attention_heads.to_string()),
        ("num_key_value_heads", cfg.kv_heads().to_string()),
        ("head_dim", cfg.head_dim().to_string()),
        ("max_position_embeddings", cfg.max_position_embeddings.to_string()),
        ("rms_norm_eps", format!("{:?}", arch.norm_epsilon)),
        ("rope_theta", format!("{theta:?}")),
        ("rope_scaling", rope_scaling),
        ("rope_parameters", rope_parameters),
        ("hidden_act", "\"silu\"".to_string()),
        ("tie_word_embeddings", (!arch.untie_embeddings).to_string()),
        ("attention_bias", arch.add_bias_linear.to_string()),
        ("mlp_bias", arch.add_bias_linear.to_string()),
        ("initializer_range", format!("{:?}", cfg.init_method_std)),
        ("torch_dtype", "\"float32\"".to_string()),
    ];
    format!("{{\n{}\n}}\n", fields_json(&[&fields[..], &trident].concat()))
}

/// The Hugging Face Llama tensors of our parameters: (hf name, hf shape, values).
pub fn to_hf(cfg: &GptConfig, params: &BTreeMap<String, Vec<f32>>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (h, f, heads, groups, d) =
        (cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let bias = cfg.arch.add_bias_linear;
    let p = |name: &str| params[name].clone();
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.padded_vocab_size, h],
        p("embedding.word_embeddings.weight"),
    )];
    for l in 0..cfg.num_layers {
        let ours = |s: &str| params[&format!("decoder.layers.{l}.{s}")].clone();
        let hf = |s: &str| format!("model.layers.{l}.{s}");
        let qkv_w = ours("self_attention.linear_qkv.weight");
        let qkv_b = if bias { ours("self_attention.linear_qkv.bias") } else { Vec::new() };
        let (mut w, mut b) = (
            [vec![0f32; heads * d * h], vec![0f32; groups * d * h], vec![0f32; groups * d * h]],
            [vec![0f32; heads * d], vec![0f32; groups * d], vec![0f32; groups * d]],
        );
        for row in 0..cfg.qkv_rows() {
            let (proj, r) = qkv_source(row, heads, groups, d);
            w[proj as usize][r * h..(r + 1) * h].copy_from_slice(&qkv_w[row * h..(row + 1) * h]);
            if bias {
                b[proj as usize][r] = qkv_b[row];
            }
        }
        let fc1 = ours("mlp.linear_fc1.weight");
        let [q, k, v] = w;
        out.extend([
            (hf("input_layernorm.weight"), vec![h], ours("input_layernorm.weight")),
            (hf("self_attn.q_proj.weight"), vec![heads * d, h], q),
            (hf("self_attn.k_proj.weight"), vec![groups * d, h], k),
            (hf("self_attn.v_proj.weight"), vec![groups * d, h], v),
            (hf("self_attn.o_proj.weight"), vec![h, heads * d], ours("self_attention.linear_proj.weight")),
            (hf("post_attention_layernorm.weight"), vec![h], ours("pre_mlp_layernorm.weight")),
            (hf("mlp.gate_proj.weight"), vec![f, h], fc1[..f * h].to_vec()),
            (hf("mlp.up_proj.weight"), vec![f, h], fc1[f * h..].to_vec()),
            (hf("mlp.down_proj.weight"), vec![h, f], ours("mlp.linear_fc2.weight")),
        ]);
        if bias {
            let fc1_b = ours("mlp.linear_fc1.bias");
            let [qb, kb, vb] = b;
            out.extend([
                (hf("self_attn.q_proj.bias"), vec![heads * d], qb),
                (hf("self_attn.k_proj.bias"), vec![groups * d], kb),
                (hf("self_attn.v_proj.bias"), vec![groups * d], vb),
                (hf("self_attn.o_proj.bias"), vec![h], ours("self_attention.linear_proj.bias")),
                (hf("mlp.gate_proj.bias"), vec![f], fc1_b[..f].to_vec()),
                (hf("mlp.up_proj.bias"), vec![f], fc1_b[f..].to_vec()),
                (hf("mlp.down_proj.bias"), vec![h], ours("mlp.linear_fc2.bias")),
            ]);
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h], p("decoder.final_layernorm.weight")));
    if cfg.arch.untie_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.padded_vocab_size, h], p("output_layer.weight")));
    }
    out
}

/// Writes `full`'s weights to `dir` as a `LlamaForCausalLM` (`model.safetensors`, `config.json`).
pub fn export(full: &FullCheckpoint, dir: &Path, tok: &HfTokenizer) -> Result<()> {
    let cfg = &full.model;
    let missing = unexpressible(cfg);
    if !missing.is_empty() {
        return Err(Error::Unsupported(format!(
            "exporting this model ({}) to Hugging Face: LlamaForCausalLM cannot express {}, and GPT2LMHeadModel takes \
             only GPT-2's architecture",
            cfg.arch.features().join(", "),
            missing.join("; ")
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let params: BTreeMap<String, Vec<f32>> =
        full.tensors.iter().filter_map(|(k, v)| k.strip_prefix("param/").map(|n| (n.to_string(), v.clone()))).collect();
    write_safetensors(&dir.join("model.safetensors"), &to_hf(cfg, &params))?;
    write_atomic(&dir.join("config.json"), config_json(cfg, trident_fields(full, tok)).as_bytes())
}

/// The rotary base and whether Llama 3.1's scaling applies, from transformers 5's
/// `rope_parameters` or the earlier `rope_theta` / `rope_scaling`.
fn rope_from_hf(c: &Fields) -> Result<(f64, bool)> {
    let params =
        ["rope_parameters", "rope_scaling"].iter().find_map(|k| c.json.get(k).filter(|v| matches!(v, Json::Obj(_))));
    let p = Fields { json: params.unwrap_or(&Json::Null), path: c.path };
    let theta = p.number("rope_theta", c.number("rope_theta", 10000.0)?)?;
    let partial = p.number("partial_rotary_factor", c.number("partial_rotary_factor", 1.0)?)?;
    if partial != 1.0 {
        return Err(Error::format(
            c.path,
            format!(
                "partial_rotary_factor {partial}: LlamaForCausalLM rotates the whole head, and so does this import"
            ),
        ));
    }
    let rope_type =
        params.and_then(|p| p.get("rope_type").or(p.get("type"))).and_then(Json::as_str).unwrap_or("default");
    match rope_type {
        "default" => Ok((theta, false)),
        "llama3" => {
            let (factor, low, high, old) = ROPE_SCALING;
            let want = [
                ("factor", factor),
                ("low_freq_factor", low),
                ("high_freq_factor", high),
                ("original_max_position_embeddings", old),
            ];
            for (key, value) in want {
                let got = p.number(key, f64::NAN)?;
                if got != value {
                    return Err(Error::format(
                        c.path,
                        format!(
                            "rope scaling 'llama3' with {key} {got}: trident's --use-rope-scaling is Llama 3.1's (factor \
                             {factor}, low_freq_factor {low}, high_freq_factor {high}, original_max_position_embeddings \
                             {old})"
                        ),
                    ));
                }
            }
            Ok((theta, true))
        }
        other => Err(Error::format(
            c.path,
            format!("rope_type '{other}': trident rotates with the default rope or Llama 3.1's 'llama3' scaling"),
        )),
    }
}

/// Our model shape from a Llama config.json.
fn config_from_hf(c: &Fields) -> Result<GptConfig> {
    let act = c.json.get("hidden_act").and_then(Json::as_str).unwrap_or("silu");
    if act != "silu" {
        return Err(Error::format(c.path, format!("hidden_act '{act}': trident's SwiGLU gates with silu")));
    }
    let (attention_bias, mlp_bias) = (c.flag("attention_bias", false)?, c.flag("mlp_bias", false)?);
    if attention_bias != mlp_bias {
        return Err(Error::format(
            c.path,
            format!(
                "attention_bias {attention_bias} with mlp_bias {mlp_bias}: trident's linear layers have biases all \
                 together or not at all (--disable-bias-linear)"
            ),
        ));
    }
    let (h, heads) = (c.count("hidden_size", None)?, c.count("num_attention_heads", None)?);
    let kv = c.count("num_key_value_heads", Some(heads))?;
    let head_dim = c.count("head_dim", Some(h / heads.max(1)))?;
    let (rotary_base, rope_scaling) = rope_from_hf(c)?;
    let vocab = c.count("vocab_size", None)?;
    let cfg = GptConfig {
        num_layers: c.count("num_hidden_layers", None)?,
        hidden_size: h,
        num_attention_heads: heads,
        ffn_hidden_size: c.count("intermediate_size", None)?,
        max_position_embeddings: c.count("max_position_embeddings", Some(2048))?,
        vocab_size: c.count("trident_unpadded_vocab_size", Some(vocab))?,
        padded_vocab_size: vocab,
        init_method_std: 0.02,
        arch: Arch {
            norm_epsilon: c.number("rms_norm_eps", 1e-6)?,
            rotary_base,
            rope_scaling,
            // Absent where they say what the defaults say, as the flags would leave them.
            num_query_groups: (kv != heads).then_some(kv),
            kv_channels: (head_dim * heads != h).then_some(head_dim),
            untie_embeddings: !c.flag("tie_word_embeddings", false)?,
            add_bias_linear: attention_bias,
            ..Arch::LLAMA
        },
    };
    cfg.validate().map_err(|e| Error::format(c.path, format!("describes no valid model: {e}")))?;
    Ok(cfg)
}

/// Reads a Hugging Face `LlamaForCausalLM` directory (its parsed config.json is `config`) into our
/// model shape and full parameters.
pub fn import(config: &Json, config_path: &Path, dir: &Path) -> Result<(GptConfig, BTreeMap<String, Vec<f32>>)> {
    let cfg = config_from_hf(&Fields { json: config, path: config_path })?;
    let (st_path, tensors) = read_hf_weights(dir)?;
    let params = from_hf(&cfg, tensors, &st_path)?;
    Ok((cfg, params))
}

/// Our parameters from Hugging Face's Llama tensors; a tensor left over is an error (a bias the
/// config does not announce, another model's weights), except rotary buffers older exports saved
/// and a tied model's copy of the embedding as `lm_head.weight`.
fn from_hf(cfg: &GptConfig, mut tensors: NamedTensors, st_path: &Path) -> Result<BTreeMap<String, Vec<f32>>> {
    let (h, f, heads, groups, d) =
        (cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let (bias, v) = (cfg.arch.add_bias_linear, cfg.padded_vocab_size);
    let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let (s, values) =
            tensors.remove(name).ok_or_else(|| Error::format(st_path, format!("tensor '{name}' is missing")))?;
        if s != shape {
            return Err(Error::format(
                st_path,
                format!("tensor '{name}' has shape {s:?}, expected {shape:?} from config.json"),
            ));
        }
        Ok(values)
    };
    let mut params = BTreeMap::new();
    params.insert("embedding.word_embeddings.weight".to_string(), take("model.embed_tokens.weight", &[v, h])?);
    for l in 0..cfg.num_layers {
        let hf = |s: &str| format!("model.layers.{l}.{s}");
        let ours = |s: &str| format!("decoder.layers.{l}.{s}");
        let shapes = [heads * d, groups * d, groups * d];
        let w = [
            take(&hf("self_attn.q_proj.weight"), &[shapes[0], h])?,
            take(&hf("self_attn.k_proj.weight"), &[shapes[1], h])?,
            take(&hf("self_attn.v_proj.weight"), &[shapes[2], h])?,
        ];
        let b = if bias {
            [
                take(&hf("self_attn.q_proj.bias"), &shapes[0..1])?,
                take(&hf("self_attn.k_proj.bias"), &shapes[1..2])?,
                take(&hf("self_attn.v_proj.bias"), &shapes[2..3])?,
            ]
        } else {
            [Vec::new(), Vec::new(), Vec::new()]
        };
        let mut qkv_w = vec![0f32; cfg.qkv_rows() * h];
        let mut qkv_b = vec![0f32; cfg.qkv_rows()];
        for row in 0..cfg.qkv_rows() {
            let (proj, r) = qkv_source(row, heads, groups, d);
            qkv_w[row * h..(row + 1) * h].copy_from_slice(&w[proj as usize][r * h..(r + 1) * h]);
            if bias {
                qkv_b[row] = b[proj as usize][r];
            }
        }
        let mut fc1 = take(&hf("mlp.gate_proj.weight"), &[f, h])?;
        fc1.extend(take(&hf("mlp.up_proj.weight"), &[f, h])?);
        params.insert(ours("input_layernorm.weight"), take(&hf("input_layernorm.weight"), &[h])?);
        params.insert(ours("self_attention.linear_qkv.weight"), qkv_w);
        params
            .insert(ours("self_attention.linear_proj.weight"), take(&hf("self_attn.o_proj.weight"), &[h, heads * d])?);
        params.insert(ours("pre_mlp_layernorm.weight"), take(&hf("post_attention_layernorm.weight"), &[h])?);
        params.insert(ours("mlp.linear_fc1.weight"), fc1);
        params.insert(ours("mlp.linear_fc2.weight"), take(&hf("mlp.down_proj.weight"), &[h, f])?);
        if bias {
            let mut fc1_b = take(&hf("mlp.gate_proj.bias"), &[f])?;
            fc1_b.extend(take(&hf("mlp.up_proj.bias"), &[f])?);
            params.insert(ours("self_attention.linear_qkv.bias"), qkv_b);
            params.insert(ours("self_attention.linear_proj.bias"), take(&hf("self_attn.o_proj.bias"), &[h])?);
            params.insert(ours("mlp.linear_fc1.bias"), fc1_b);
            params.insert(ours("mlp.linear_fc2.bias"), take(&hf("mlp.down_proj.bias"), &[h])?);
        }
    }
    params.insert("decoder.final_layernorm.weight".to_string(), take("model.norm.weight", &[h])?);
    if cfg.arch.untie_embeddings {
        params.insert("output_layer.weight".to_string(), take("lm_head.weight", &[v, h])?);
    } else {
        tensors.remove("lm_head.weight");
    }
    let left: Vec<&String> = tensors.keys().filter(|k| !k.ends_with("rotary_emb.inv_freq")).collect();
    if !left.is_empty() {
        let shown: Vec<&str> = left.iter().take(4).map(|s| s.as_str()).collect();
        return Err(Error::format(
            st_path,
            format!(
                "{} tensor(s) that config.json's LlamaForCausalLM does not have ({}{}): another model, or biases \
                 that attention_bias / mlp_bias do not announce?",
                left.len(),
                shown.join(", "),
                if left.len() > 4 { ", ..." } else { "" }
            ),
        ));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_rows_map_one_to_one_onto_the_projections() {
        let (heads, groups, d) = (6, 2, 4);
        let mut seen = [vec![false; heads * d], vec![false; groups * d], vec![false; groups * d]];
        for row in 0..(heads + 2 * groups) * d {
            let (proj, r) = qkv_source(row, heads, groups, d);
            assert!(!seen[proj as usize][r], "row {row} lands on a taken row");
            seen[proj as usize][r] = true;
        }
        assert!(seen.iter().all(|s| s.iter().all(|&x| x)));
        // Group 1 starts at row 5 d: its first query head is head 3; its key and value heads are 1.
        assert_eq!(qkv_source(5 * d, heads, groups, d), (Proj::Q, 3 * d));
        assert_eq!(qkv_source(8 * d + 1, heads, groups, d), (Proj::K, d + 1));
        assert_eq!(qkv_source(9 * d + 2, heads, groups, d), (Proj::V, d + 2));
    }
}
