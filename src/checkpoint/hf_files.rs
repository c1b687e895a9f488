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

/// config.json's fields, read with the path in every error.
pub struct Fields<'a> {
    pub json: &'a Json,
    pub path: &'a Path,
}

impl Fields<'_> {
    pub fn bad(&self, key: &str, what: &str) -> Error {
        Error::format(self.path, format!("'{key}' {what}"))
    }
    pub fn count(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.json.get(key) {
            None | Some(Json::Null) => default.ok_or_else(|| self.bad(key, "is missing")),
            Some(v) => v.as_usize().ok_or_else(|| self.bad(key, "is not a whole number from 0 to 2^53")),
        }
    }
    pub fn number(&self, key: &str, default: f64) -> Result<f64> {
        match self.json.get(key) {
            None | Some(Json::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.bad(key, "is not a number")),
        }
    }
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.json.get(key) {
            None | Some(Json::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(key, "is not true or false")),
        }
    }
}

/// One tensor's entry in a safetensors header, checked: its dtype's width in bytes, its shape,
/// and the byte range of its data (relative to the data section).
struct Entry {
    name: String,
    dtype: String,
    width: usize,
    shape: Vec<usize>,
    range: std::ops::Range<usize>,
}

/// The header entry `name` of the safetensors file `path`, checked against the `data_len` bytes
/// of data: a known dtype, a shape whose element count (checked arithmetic) times the dtype's
/// width is exactly its byte range, the range inside the data and aligned to the dtype.
fn entry(path: &Path, name: String, info: &Json, data_len: usize) -> Result<Entry> {
    let bad = |what: &str| Error::format(path, format!("tensor '{name}': {what}"));
    let dtype = info.get("dtype").and_then(Json::as_str).ok_or_else(|| bad("no dtype"))?.to_string();
    let width: usize = match dtype.as_str() {
        "F32" => 4,
        "BF16" | "F16" => 2,
        other => return Err(bad(&format!("dtype {other} (expected F32, BF16 or F16)"))),
    };
    let shape: Vec<usize> = match info.get("shape") {
        Some(Json::Arr(dims)) => {
            dims.iter().map(Json::as_usize).collect::<Option<_>>().ok_or_else(|| bad("bad shape"))?
        }
        _ => return Err(bad("no shape")),
    };
    let (begin, end) = match info.get("data_offsets").and_then(Json::as_array) {
        Some([b, e]) => {
            (b.as_usize().ok_or_else(|| bad("bad data_offsets"))?, e.as_usize().ok_or_else(|| bad("bad data_offsets"))?)
        }
        _ => return Err(bad("no data_offsets")),
    };
    if begin > end || end > data_len {
        return Err(bad(&format!("data [{begin}, {end}) runs past the {data_len} bytes of data (truncated file?)")));
    }
    let bytes = shape.iter().try_fold(width, |n, &d| n.checked_mul(d));
    if bytes != Some(end - begin) {
        return Err(bad(&format!("shape {shape:?} of {dtype} does not fill its {} bytes of data", end - begin)));
    }
    if !begin.is_multiple_of(width) {
        return Err(bad(&format!("data at offset {begin} is not aligned to {dtype}'s {width} bytes")));
    }
    Ok(Entry { name, dtype, width, shape, range: begin..end })
}

/// Reads every tensor of a safetensors file as f32 (F32, F16 and BF16 are accepted). The file is
/// mapped, not read; each entry must cover its own bytes (no two overlap), so the tensors built
/// come to at most twice the file's size.
pub fn read_safetensors(path: &Path) -> Result<NamedTensors> {
    let file = crate::files::open_regular(path, "read")?;
    // SAFETY: the map is read-only and lives only in this function; a file truncated meanwhile
    // by another process is the one hazard, as with any memory-mapped reader.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, "map", e))?;
    let bytes: &[u8] = &map;
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| Error::format(path, "shorter than a safetensors header"))?;
    let data_start = usize::try_from(header_len).ok().and_then(|n| n.checked_add(8)).filter(|&e| e <= bytes.len());
    let data_start = data_start.ok_or_else(|| {
        Error::format(path, format!("header of {header_len} bytes runs past the end of the {}-byte file", bytes.len()))
    })?;
    let header = document(&bytes[8..data_start], path)?;
    let Json::Obj(fields) = header else { return Err(Error::format(path, "the header is not a JSON object")) };
    let data = &bytes[data_start..];
    let mut entries = Vec::with_capacity(fields.len());
    for (name, info) in fields {
        if name != "__metadata__" {
            entries.push(entry(path, name, &info, data.len())?);
        }
    }
    entries.sort_by_key(|e| (e.range.start, e.range.end));
    for pair in entries.windows(2) {
        if pair[1].range.start < pair[0].range.end {
            return Err(Error::format(
                path,
                format!(
                    "tensors '{}' and '{}' overlap in the data: each tensor has bytes of its own",
                    pair[0].name, pair[1].name
                ),
            ));
        }
    }
    let mut out = BTreeMap::new();
    for e in entries {
        let raw = &data[e.range.clone()];
        let values: Vec<f32> = match e.dtype.as_str() {
            "F32" => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
            "BF16" => {
                raw.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()
            }
            _ => raw.chunks_exact(e.width).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        };
        if out.insert(e.name.clone(), (e.shape, values)).is_some() {
            return Err(Error::format(path, format!("tensor '{}' appears twice", e.name)));
        }
    }
    Ok(out)
}

/// The weights of a Hugging Face directory: `model.safetensors`, or the files that
/// `model.safetensors.index.json`'s `weight_map` names (large models are sharded), merged. Each
/// file the index names must lie in the directory (`files::inside`), and a tensor may come from
/// one file only. Returns the path errors should name with them.
pub fn read_hf_weights(dir: &Path) -> Result<(PathBuf, NamedTensors)> {
    let single = dir.join("model.safetensors");
    let index_path = dir.join("model.safetensors.index.json");
    if single.exists() || !index_path.exists() {
        return Ok((single.clone(), read_safetensors(&single)?));
    }
    let text = crate::files::read_regular(&index_path, "read")?;
    let Some(Json::Obj(map)) = document(&text, &index_path)?.get("weight_map").cloned() else {
        return Err(Error::format(&index_path, "no 'weight_map' object"));
    };
    let mut files = Vec::new();
    for (tensor, file) in &map {
        let file = file
            .as_str()
            .ok_or_else(|| Error::format(&index_path, format!("weight_map: '{tensor}' does not name a file")))?;
        files.push(file);
    }
    files.sort_unstable();
    files.dedup();
    let mut out = NamedTensors::new();
    for file in files {
        let path = crate::files::inside(dir, file, &index_path)?;
        for (name, tensor) in read_safetensors(&path)? {
            if out.insert(name.clone(), tensor).is_some() {
                return Err(Error::format(&path, format!("tensor '{name}' is in another file of the index too")));
            }
        }
    }
    Ok((index_path, out))
}

pub(crate) fn f16_to_f32(h: u16) -> f32 {
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
