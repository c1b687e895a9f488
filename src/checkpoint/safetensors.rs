//! Hugging Face interchange: a checkpoint's weights as a GPT-2 `model.safetensors` plus
//! `config.json` (Hugging Face tensor names and shapes; its Conv1D weights are stored [in, out],
//! and its fused QKV columns are [all q | all k | all v] where ours are grouped per head), and the
//! reverse, so a model trained here loads in `transformers` and a GPT-2 from there trains here.
//! Llama-family models go to and come from `LlamaForCausalLM` in `hf_llama.rs`; this file holds
//! the safetensors and JSON readers both use.

use super::convert::FullCheckpoint;
use crate::error::{Error, Result};
use crate::model::GptConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A parsed JSON value (the safetensors header and config.json need nothing more).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub(super) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    pub(super) fn as_usize(&self) -> Option<usize> {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as usize),
            _ => None,
        }
    }
    pub(super) fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(n) => Some(*n),
            _ => None,
        }
    }
    pub(super) fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A strict recursive-descent JSON parser; errors say the byte offset.
struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn fail<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!("{what} at byte {}", self.pos))
    }
    fn ws(&mut self) {
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        self.ws();
        if self.bytes.get(self.pos) == Some(&c) {
            self.pos += 1;
            Ok(())
        } else {
            self.fail(&format!("expected '{}'", c as char))
        }
    }
    fn value(&mut self) -> std::result::Result<Json, String> {
        self.ws();
        match self.bytes.get(self.pos) {
            None => self.fail("unexpected end"),
            Some(b'{') => {
                self.pos += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.bytes.get(self.pos) == Some(&b'}') {
                    self.pos += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let Json::Str(key) = self.value()? else { return self.fail("expected a string key") };
                    self.expect(b':')?;
                    fields.push((key, self.value()?));
                    self.ws();
                    match self.bytes.get(self.pos) {
                        Some(b',') => self.pos += 1,
                        Some(b'}') => {
                            self.pos += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return self.fail("expected ',' or '}'"),
                    }
                }
            }
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.ws();
                if self.bytes.get(self.pos) == Some(&b']') {
                    self.pos += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.bytes.get(self.pos) {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {
                            self.pos += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return self.fail("expected ',' or ']'"),
                    }
                }
            }
            Some(b'"') => {
                self.pos += 1;
                let mut out = Vec::new();
                loop {
                    match self.bytes.get(self.pos) {
                        None => return self.fail("unterminated string"),
                        Some(b'"') => {
                            self.pos += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let esc = *self.bytes.get(self.pos + 1).ok_or("unterminated escape")?;
                            self.pos += 2;
                            match esc {
                                b'"' | b'\\' | b'/' => out.push(esc),
                                b'n' => out.push(b'\n'),
                                b't' => out.push(b'\t'),
                                b'r' => out.push(b'\r'),
                                b'b' => out.push(8),
                                b'f' => out.push(12),
                                b'u' => {
                                    let hex = self.bytes.get(self.pos..self.pos + 4).ok_or("short \\u escape")?;
                                    let code =
                                        u32::from_str_radix(std::str::from_utf8(hex).map_err(|_| "bad \\u")?, 16)
                                            .map_err(|_| format!("bad \\u escape at byte {}", self.pos))?;
                                    self.pos += 4;
                                    let ch = char::from_u32(code).unwrap_or('\u{fffd}');
                                    out.extend_from_slice(ch.to_string().as_bytes());
                                }
                                _ => return self.fail("unknown escape"),
                            }
                        }
                        Some(&c) => {
                            out.push(c);
                            self.pos += 1;
                        }
                    }
                }
                String::from_utf8(out)
                    .map(Json::Str)
                    .map_err(|_| format!("invalid UTF-8 in a string before byte {}", self.pos))
            }
            Some(b't') if self.bytes[self.pos..].starts_with(b"true") => {
                self.pos += 4;
                Ok(Json::Bool(true))
            }
            Some(b'f') if self.bytes[self.pos..].starts_with(b"false") => {
                self.pos += 5;
                Ok(Json::Bool(false))
            }
            Some(b'n') if self.bytes[self.pos..].starts_with(b"null") => {
                self.pos += 4;
                Ok(Json::Null)
            }
            Some(_) => {
                let start = self.pos;
                while self.pos < self.bytes.len()
                    && (self.bytes[self.pos].is_ascii_digit() || b"+-.eE".contains(&self.bytes[self.pos]))
                {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or("");
                text.parse().map(Json::Num).map_err(|_| format!("bad value at byte {start}"))
            }
        }
    }
}

pub(super) fn parse_json(bytes: &[u8], path: &Path) -> Result<Json> {
    let mut p = Parser { bytes, pos: 0 };
    let v = p.value().map_err(|e| Error::format(path, format!("invalid JSON: {e}")))?;
    p.ws();
    if p.pos != bytes.len() {
        return Err(Error::format(path, format!("invalid JSON: trailing bytes at byte {}", p.pos)));
    }
    Ok(v)
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    super::write_synced(&tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "rename", e))
}

/// Writes named f32 tensors as a safetensors file (header padded to 8 bytes).
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    let mut entries = Vec::new();
    let mut offset = 0usize;
    for (name, shape, data) in tensors {
        let end = offset + data.len() * 4;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        entries.push(format!(
            "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            dims.join(",")
        ));
        offset = end;
    }
    entries.push("\"__metadata__\":{\"format\":\"pt\"}".to_string());
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for (_, _, data) in tensors {
        for x in data {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    write_atomic(path, &out)
}

/// Tensors by name: shape and values.
pub type NamedTensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every tensor of a safetensors file as f32 (F32, F16 and BF16 are accepted).
pub fn read_safetensors(path: &Path) -> Result<NamedTensors> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .ok_or_else(|| Error::format(path, "shorter than a safetensors header"))?;
    let data_start = 8usize.checked_add(header_len).filter(|&e| e <= bytes.len()).ok_or_else(|| {
        Error::format(path, format!("header of {header_len} bytes runs past the end of the {}-byte file", bytes.len()))
    })?;
    let header = parse_json(&bytes[8..data_start], path)?;
    let Json::Obj(fields) = header else { return Err(Error::format(path, "the header is not a JSON object")) };
    let data = &bytes[data_start..];
    let mut out = BTreeMap::new();
    for (name, info) in fields {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| Error::format(path, format!("tensor '{name}': {what}"));
        let dtype = match info.get("dtype") {
            Some(Json::Str(s)) => s.clone(),
            _ => return Err(bad("no dtype")),
        };
        let shape: Vec<usize> = match info.get("shape") {
            Some(Json::Arr(dims)) => {
                dims.iter().map(Json::as_usize).collect::<Option<_>>().ok_or_else(|| bad("bad shape"))?
            }
            _ => return Err(bad("no shape")),
        };
        let (begin, end) = match info.get("data_offsets") {
            Some(Json::Arr(o)) if o.len() == 2 => (o[0].as_usize(), o[1].as_usize()),
            _ => return Err(bad("no data_offsets")),
        };
        let (Some(begin), Some(end)) = (begin, end) else { return Err(bad("bad data_offsets")) };
        if begin > end || end > data.len() {
            return Err(bad(&format!(
                "data [{begin}, {end}) runs past the {} bytes of data (truncated file?)",
                data.len()
            )));
        }
        let raw = &data[begin..end];
        let numel: usize = shape.iter().product();
        let values: Vec<f32> = match dtype.as_str() {
            "F32" => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
            "BF16" => {
                raw.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()
            }
            "F16" => raw.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
            other => return Err(bad(&format!("dtype {other} (expected F32, BF16 or F16)"))),
        };
        if values.len() != numel {
            return Err(bad(&format!("shape {shape:?} holds {numel} elements but the data holds {}", values.len())));
        }
        out.insert(name, (shape, values));
    }
    Ok(out)
}

/// The weights of a Hugging Face directory: `model.safetensors`, or the files that
/// `model.safetensors.index.json`'s `weight_map` names (large models are sharded), merged.
/// Returns the path errors should name with them.
pub fn read_hf_weights(dir: &Path) -> Result<(PathBuf, NamedTensors)> {
    let single = dir.join("model.safetensors");
    let index_path = dir.join("model.safetensors.index.json");
    if single.exists() || !index_path.exists() {
        return Ok((single.clone(), read_safetensors(&single)?));
    }
    let text = std::fs::read(&index_path).map_err(|e| Error::io(&index_path, "read", e))?;
    let Some(Json::Obj(map)) = parse_json(&text, &index_path)?.get("weight_map").cloned() else {
        return Err(Error::format(&index_path, "no 'weight_map' object"));
    };
    let mut files: Vec<&str> = map.iter().filter_map(|(_, f)| f.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    let mut out = NamedTensors::new();
    for file in files {
        out.extend(read_safetensors(&dir.join(file))?);
    }
    Ok((index_path, out))
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            sign | ((127 - 15 + 1 - shift) << 23) | ((f << shift) & 0x3ff) << 13
        }
        (31, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

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
pub fn export_hf(full: &FullCheckpoint, dir: &Path) -> Result<()> {
    let cfg = &full.model;
    if !cfg.arch.features().is_empty() {
        return super::hf_llama::export(full, dir);
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let params: BTreeMap<String, Vec<f32>> =
        full.tensors.iter().filter_map(|(k, v)| k.strip_prefix("param/").map(|n| (n.to_string(), v.clone()))).collect();
    write_safetensors(&dir.join("model.safetensors"), &to_hf(cfg, &params))?;
    let config = format!(
        "{{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": {},\n  \
         \"n_positions\": {},\n  \"n_ctx\": {},\n  \"n_embd\": {},\n  \"n_layer\": {},\n  \"n_head\": {},\n  \
         \"n_inner\": {},\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": {:?},\n  \
         \"initializer_range\": {},\n  \"tie_word_embeddings\": true,\n  \"bos_token_id\": 256,\n  \
         \"eos_token_id\": 256,\n  \"trident_unpadded_vocab_size\": {},\n  \"trident_tokenizer\": \"ByteTokenizer\"\n}}\n",
        cfg.padded_vocab_size,
        cfg.max_position_embeddings,
        cfg.max_position_embeddings,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_attention_heads,
        cfg.ffn_hidden_size,
        cfg.arch.norm_epsilon,
        cfg.init_method_std,
        cfg.vocab_size
    );
    write_atomic(&dir.join("config.json"), config.as_bytes())
}

/// Reads a Hugging Face directory (`config.json`, `model.safetensors`) into our model shape and
/// full parameters: a `LlamaForCausalLM` (by `model_type` or `architectures`) through `hf_llama`,
/// else a GPT-2.
pub fn import_hf(dir: &Path) -> Result<(GptConfig, BTreeMap<String, Vec<f32>>)> {
    let config_path = dir.join("config.json");
    let text = std::fs::read(&config_path).map_err(|e| Error::io(&config_path, "read", e))?;
    let config = parse_json(&text, &config_path)?;
    let model_type = config.get("model_type").and_then(Json::as_str);
    let llama_class = matches!(config.get("architectures"), Some(Json::Arr(a)) if a.iter().any(|x| x.as_str() == Some("LlamaForCausalLM")));
    match model_type {
        Some("llama") => return super::hf_llama::import(&config, &config_path, dir),
        None if llama_class => return super::hf_llama::import(&config, &config_path, dir),
        None | Some("gpt2") => {}
        Some(other) => {
            return Err(Error::format(
                &config_path,
                format!("model_type '{other}': convert --load-hf reads GPT-2 ('gpt2') and Llama ('llama') models"),
            ))
        }
    }
    let num = |key: &str| -> Result<usize> {
        config
            .get(key)
            .and_then(Json::as_usize)
            .ok_or_else(|| Error::format(&config_path, format!("'{key}' is missing or not a whole number")))
    };
    let h = num("n_embd")?;
    let vocab = num("vocab_size")?;
    let cfg = GptConfig {
        num_layers: num("n_layer")?,
        hidden_size: h,
        num_attention_heads: num("n_head")?,
        ffn_hidden_size: config.get("n_inner").and_then(Json::as_usize).unwrap_or(4 * h),
        max_position_embeddings: num("n_positions")?,
        vocab_size: config.get("trident_unpadded_vocab_size").and_then(Json::as_usize).unwrap_or(vocab),
        padded_vocab_size: vocab,
        init_method_std: 0.02,
        arch: crate::model::Arch {
            norm_epsilon: config.get("layer_norm_epsilon").and_then(Json::as_f64).unwrap_or(1e-5),
            ..crate::model::Arch::GPT2
        },
    };
    cfg.validate()?;
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

    #[test]
    fn json_and_half_floats() {
        let j = parse_json(br#"{"a": [1, 2.5e1, "x\n\u00e9"], "b": {"c": null, "d": true}}"#, Path::new("t")).unwrap();
        assert_eq!(j.get("a"), Some(&Json::Arr(vec![Json::Num(1.0), Json::Num(25.0), Json::Str("x\né".into())])));
        assert!(parse_json(b"{\"a\": 1,}", Path::new("t")).is_err());
        assert!(parse_json(b"{\"a\": 1} x", Path::new("t")).is_err());
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    }
}
