//! The files of a Hugging Face model directory: safetensors read (F32, BF16, F16) and write (F32)
//! (headers, config.json and a sharded model's index through `data::json::document`),
//! and the weights of a directory whole or sharded. The GPT-2 (`safetensors.rs`) and Llama
//! (`hf_llama.rs`) mappings both build on these.

use crate::data::json::{document, Json};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
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
    let header = document(&bytes[8..data_start], path)?;
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
    let Some(Json::Obj(map)) = document(&text, &index_path)?.get("weight_map").cloned() else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    }
}
