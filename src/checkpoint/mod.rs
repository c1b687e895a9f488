//! Checkpoints: one directory per iteration (`iter_0000100/mp_rank_00/model_optim_rng.bin`) and
//! Megatron's tracker file `latest_checkpointed_iteration.txt`. Every file is written under a
//! temporary name, fsynced and renamed, and the tracker moves only after the iteration directory
//! is complete, so a crash at any moment leaves the previous checkpoint intact and the latest one
//! named. Each file ends with a checksum that is verified on load.
//!
//! A shard is read as untrusted input: its metadata is a JSON object of strings (version 2;
//! version 1's `key=value` lines are still read), every key must be one of `METADATA_KEYS` and
//! appear once, tensor names are unique, and every count is checked against the bytes present
//! before anything is allocated, so a crafted shard can neither add a key to what we write nor
//! make a reader allocate more than the file holds (docs/formats.md states the bounds).

pub mod convert;
pub mod hf_files;
pub mod hf_llama;
pub mod megatron;
pub mod safetensors;
pub mod shape;
pub mod tokenizer;

use crate::data::json::{document, quote, Json};
use crate::error::{Error, Result};
use crate::rng::fnv1a64;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 12] = b"TRIDENTCKPT\0";
/// 2: the metadata is a JSON object of strings. 1: `key=value` lines (read, never written).
const VERSION: u32 = 2;

/// Every metadata key a shard may carry (what `train`, `convert` and the Hugging Face import
/// write); reading refuses any other, so a file cannot smuggle a key into what we write next.
pub const METADATA_KEYS: &[&str] = &[
    // The run's position and provenance.
    "format",
    "iteration",
    "consumed_train_samples",
    "consumed_valid_samples",
    "lr_schedule_samples",
    "optimizer_state",
    "adam_step",
    "seed",
    "rng",
    "seq_length",
    "tokenizer",
    "make_vocab_size_divisible_by",
    "imported_from",
    "loss_scale",
    "loss_scale_growth_tracker",
    "loss_scale_hysteresis_left",
    // The layout.
    "tensor_model_parallel_size",
    "tensor_model_parallel_rank",
    "pipeline_model_parallel_size",
    "pipeline_model_parallel_rank",
    "virtual_pipeline_chunks",
    "virtual_pipeline_placement",
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "data_parallel_size",
    "sequence_parallel",
    "tensor_parallel_mode",
    "summa_q",
    "tesseract_depth",
    // The model's shape (`shape::model_meta`) and architecture (`Arch::metadata`).
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "max_position_embeddings",
    "vocab_size",
    "padded_vocab_size",
    "normalization",
    "norm_epsilon",
    "swiglu",
    "gelu_erf",
    "position_embedding_type",
    "rotary_base",
    "rotary_percent",
    "use_rope_scaling",
    "num_query_groups",
    "kv_channels",
    "untie_embeddings_and_output_weights",
    "disable_bias_linear",
    "apply_layernorm_1p",
];
pub const TRACKER: &str = "latest_checkpointed_iteration.txt";
pub const SHARD_FILE: &str = "model_optim_rng.bin";

/// One named f32 tensor in a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The contents of one shard: text metadata (iteration, data position, model shape, layout) and
/// tensors (parameters and optimizer moments).
#[derive(Clone, Debug, Default)]
pub struct Shard {
    pub meta: BTreeMap<String, String>,
    pub tensors: Vec<SavedTensor>,
}

impl Shard {
    /// A metadata value parsed as `T`; a missing or malformed one is a format error on `path`.
    pub fn meta_value<T: std::str::FromStr>(&self, path: &Path, key: &str) -> Result<T> {
        let raw = self.meta.get(key).ok_or_else(|| Error::format(path, format!("missing metadata '{key}'")))?;
        raw.parse().map_err(|_| Error::format(path, format!("metadata '{key}' has malformed value '{raw}'")))
    }

    pub fn tensor(&self, path: &Path, name: &str) -> Result<&SavedTensor> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::format(path, format!("tensor '{name}' is missing")))
    }
}

pub fn iteration_dir(dir: &Path, iteration: u64) -> PathBuf {
    dir.join(format!("iter_{iteration:07}"))
}

/// Megatron's name for a model-parallel rank's shard directory: `mp_rank_TT` without a pipeline,
/// `mp_rank_TT_PPP` with one.
pub fn shard_name(tp_rank: usize, pp_rank: usize, pp_size: usize) -> String {
    if pp_size > 1 {
        format!("mp_rank_{tp_rank:02}_{pp_rank:03}")
    } else {
        format!("mp_rank_{tp_rank:02}")
    }
}

pub fn shard_path(dir: &Path, iteration: u64, name: &str) -> PathBuf {
    iteration_dir(dir, iteration).join(name).join(SHARD_FILE)
}

fn encode(shard: &Shard) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let fields: Vec<String> = shard.meta.iter().map(|(k, v)| format!("{}: {}", quote(k), quote(v))).collect();
    let header = format!("{{{}}}", fields.join(", "));
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&(shard.tensors.len() as u64).to_le_bytes());
    for t in &shard.tensors {
        out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in &t.shape {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        out.reserve(t.data.len() * 4);
        for &x in &t.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A bounds-checked little-endian reader over a shard's bytes; running off the end is a format
/// error that names the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            Error::format(self.path, format!("truncated: {what} needs {n} bytes at offset {}", self.pos))
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn len(&mut self, what: &str) -> Result<usize> {
        let v = self.u64(what)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= self.bytes.len())
            .ok_or_else(|| Error::format(self.path, format!("{what} {v} is larger than the file")))
    }
}

/// `version` if this build reads it (1 and `VERSION`).
fn readable_version(version: u32, path: &Path) -> Result<u32> {
    if version != 1 && version != VERSION {
        return Err(Error::format(
            path,
            format!("checkpoint version {version}, this build reads versions 1 and {VERSION}"),
        ));
    }
    Ok(version)
}

fn decode(bytes: &[u8], path: &Path) -> Result<Shard> {
    if bytes.len() < MAGIC.len() + 12 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(Error::format(path, "not a trident checkpoint shard (bad magic)"));
    }
    let body_len = bytes.len() - 8;
    let stored = u64::from_le_bytes(bytes[body_len..].try_into().expect("8 bytes"));
    let actual = fnv1a64(&bytes[..body_len]);
    if stored != actual {
        return Err(Error::format(
            path,
            format!(
                "checksum mismatch (stored {stored:016x}, computed {actual:016x}): the file is corrupt or truncated"
            ),
        ));
    }
    let mut r = Reader { bytes: &bytes[..body_len], pos: MAGIC.len(), path };
    let version = readable_version(r.u32("version")?, path)?;
    let header_len = r.len("header length")?;
    let header = r.take(header_len, "header")?;
    let mut shard = Shard { meta: read_metadata(header, version, path)?, tensors: Vec::new() };
    let count = r.len("tensor count")?;
    let mut names = BTreeSet::new();
    for _ in 0..count {
        let name_len = r.u32("name length")? as usize;
        let name = String::from_utf8(r.take(name_len, "tensor name")?.to_vec())
            .map_err(|_| Error::format(path, "tensor name is not UTF-8"))?;
        if !names.insert(name.clone()) {
            return Err(Error::format(path, format!("tensor '{name}' appears twice")));
        }
        let ndim = r.u32("rank")? as usize;
        let mut shape = Vec::with_capacity(ndim.min(8));
        for _ in 0..ndim {
            shape.push(r.len("dimension")?);
        }
        let numel = r.len("element count")?;
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(numel) {
            return Err(Error::format(
                path,
                format!("tensor '{name}': shape {shape:?} does not hold {numel} elements"),
            ));
        }
        let bytes = numel.checked_mul(4).ok_or_else(|| Error::format(path, "tensor larger than the file"))?;
        let raw = r.take(bytes, "tensor data")?;
        let data = raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        shard.tensors.push(SavedTensor { name, shape, data });
    }
    if r.pos != body_len {
        return Err(Error::format(path, "trailing bytes after the last tensor"));
    }
    Ok(shard)
}

/// The metadata of a shard: version 2's JSON object of strings, or version 1's `key=value`
/// lines. A key outside `METADATA_KEYS`, or one given twice, is an error naming it.
fn read_metadata(header: &[u8], version: u32, path: &Path) -> Result<BTreeMap<String, String>> {
    let pairs: Vec<(String, String)> = if version == 1 {
        let text = std::str::from_utf8(header).map_err(|_| Error::format(path, "header is not UTF-8"))?;
        let line = |line: &str| {
            let (k, v) =
                line.split_once('=').ok_or_else(|| Error::format(path, format!("malformed header line '{line}'")))?;
            Ok((k.to_string(), v.to_string()))
        };
        text.lines().map(line).collect::<Result<_>>()?
    } else {
        let Json::Obj(fields) = document(header, path)? else {
            return Err(Error::format(path, "the metadata is not a JSON object"));
        };
        let value = |(k, v): (String, Json)| match v {
            Json::Str(v) => Ok((k, v)),
            _ => Err(Error::format(path, format!("metadata '{k}' is not a string"))),
        };
        fields.into_iter().map(value).collect::<Result<_>>()?
    };
    let mut meta = BTreeMap::new();
    for (k, v) in pairs {
        if !METADATA_KEYS.contains(&k.as_str()) {
            return Err(Error::format(path, format!("unknown metadata key {}: not a shard trident wrote", quote(&k))));
        }
        if meta.insert(k.clone(), v).is_some() {
            return Err(Error::format(path, format!("metadata '{k}' appears twice")));
        }
    }
    Ok(meta)
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| Error::io(path, "create", e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, "write", e))?;
    f.sync_all().map_err(|e| Error::io(path, "fsync", e))
}

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|d| d.sync_all()).map_err(|e| Error::io(path, "fsync directory", e))
}

/// Where the shards of iteration `iteration` are written before the directory is renamed into
/// place; one name for every rank of the job.
pub fn staging_dir(dir: &Path, iteration: u64) -> PathBuf {
    dir.join(format!(".iter_{iteration:07}.tmp"))
}

/// Step 1 (one rank): an empty staging directory for iteration `iteration`.
pub fn begin(dir: &Path, iteration: u64) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let staging = staging_dir(dir, iteration);
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, "remove stale temporary", e))?;
    }
    fs::create_dir_all(&staging).map_err(|e| Error::io(&staging, "create directory", e))
}

/// Step 2 (every writing rank): the shard `name` (see `shard_name`) into the staging directory,
/// fsynced.
pub fn write_shard(dir: &Path, iteration: u64, name: &str, shard: &Shard) -> Result<()> {
    let rank_dir = staging_dir(dir, iteration).join(name);
    fs::create_dir_all(&rank_dir).map_err(|e| Error::io(&rank_dir, "create directory", e))?;
    write_synced(&rank_dir.join(SHARD_FILE), &encode(shard))?;
    sync_dir(&rank_dir)
}

/// Step 3 (one rank, after every shard is written): renames the staging directory into place and
/// then points the tracker at it. Returns the iteration directory.
pub fn commit(dir: &Path, iteration: u64) -> Result<PathBuf> {
    let staging = staging_dir(dir, iteration);
    sync_dir(&staging)?;
    let final_dir = iteration_dir(dir, iteration);
    // Replacing an existing directory of the same iteration takes two renames; the tracker names
    // an intact directory (old or new) at every instant except between them.
    let old_dir = dir.join(format!(".iter_{iteration:07}.old"));
    let replaced = final_dir.exists();
    if replaced {
        if old_dir.exists() {
            fs::remove_dir_all(&old_dir).map_err(|e| Error::io(&old_dir, "remove", e))?;
        }
        fs::rename(&final_dir, &old_dir).map_err(|e| Error::io(&final_dir, "rename", e))?;
    }
    fs::rename(&staging, &final_dir).map_err(|e| Error::io(&staging, "rename", e))?;
    sync_dir(dir)?;
    if replaced {
        fs::remove_dir_all(&old_dir).map_err(|e| Error::io(&old_dir, "remove", e))?;
    }
    let tracker_tmp = dir.join(format!(".{TRACKER}.tmp"));
    write_synced(&tracker_tmp, format!("{iteration}\n").as_bytes())?;
    let tracker = dir.join(TRACKER);
    fs::rename(&tracker_tmp, &tracker).map_err(|e| Error::io(&tracker, "rename", e))?;
    sync_dir(dir)?;
    Ok(final_dir)
}

/// All three steps for a job with one writer.
pub fn save(dir: &Path, iteration: u64, name: &str, shard: &Shard) -> Result<PathBuf> {
    begin(dir, iteration)?;
    write_shard(dir, iteration, name, shard)?;
    commit(dir, iteration)
}

/// The iteration the tracker file in `dir` names.
pub fn latest_iteration(dir: &Path) -> Result<u64> {
    let tracker = dir.join(TRACKER);
    if !tracker.exists() {
        return Err(Error::format(
            dir,
            format!("no {TRACKER}: not a checkpoint directory written by `trident train --save`"),
        ));
    }
    let bytes = crate::files::read_regular(&tracker, "read")?;
    let text = String::from_utf8_lossy(&bytes);
    text.trim()
        .parse()
        .map_err(|_| Error::format(&tracker, format!("expected an iteration number, found '{}'", text.trim())))
}

/// The metadata of the latest checkpoint in `dir` (its first shard's: tensor- and pipeline-parallel
/// rank 0), read from the file's head without its tensors: what `--use-checkpoint-args` takes
/// before the model exists. The whole shard, checksum included, is verified when it is loaded.
pub fn latest_metadata(dir: &Path) -> Result<(PathBuf, BTreeMap<String, String>)> {
    let iteration = latest_iteration(dir)?;
    let single = shard_path(dir, iteration, &shard_name(0, 0, 1));
    let path = match single.exists() {
        true => single,
        // Under pipeline parallelism the first shard is mp_rank_00_000 (any pipeline size).
        false => shard_path(dir, iteration, &shard_name(0, 0, 2)),
    };
    if let Some(e) = missing_shard(&path, &iteration_dir(dir, iteration)) {
        return Err(e);
    }
    let mut file = crate::files::open_regular(&path, "read checkpoint shard")?;
    let size = file.metadata().map_err(|e| Error::io(&path, "read", e))?.len();
    let mut head = vec![0u8; MAGIC.len() + 12];
    std::io::Read::read_exact(&mut file, &mut head)
        .map_err(|_| Error::format(&path, "shorter than a shard's header"))?;
    if &head[..MAGIC.len()] != MAGIC {
        return Err(Error::format(&path, "not a trident checkpoint shard (bad magic)"));
    }
    let version = u32::from_le_bytes(head[MAGIC.len()..MAGIC.len() + 4].try_into().expect("4 bytes"));
    let version = readable_version(version, &path)?;
    let header_len = u64::from_le_bytes(head[MAGIC.len() + 4..].try_into().expect("8 bytes"));
    if header_len > size.saturating_sub(head.len() as u64) {
        return Err(Error::format(&path, format!("a header of {header_len} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; header_len as usize];
    std::io::Read::read_exact(&mut file, &mut header).map_err(|e| Error::io(&path, "read", e))?;
    Ok((path.clone(), read_metadata(&header, version, &path)?))
}

/// Megatron-LM's own files in an iteration directory, named for an error: `torch_dist` (a
/// `.metadata` file and `.distcp` shards) or the legacy `torch` format (`mp_rank_*/model_optim_rng.pt`).
pub fn megatron_files(iter_dir: &Path) -> Option<String> {
    let entries: Vec<PathBuf> = fs::read_dir(iter_dir).ok()?.flatten().map(|e| e.path()).collect();
    if entries.iter().any(|p| p.extension().is_some_and(|e| e == "distcp") || p.ends_with(".metadata")) {
        return Some("torch_dist (.metadata and .distcp files)".into());
    }
    let legacy = entries.iter().map(|d| d.join("model_optim_rng.pt")).find(|p| p.exists())?;
    Some(format!("torch ({})", legacy.display()))
}

/// The error for a trident shard that is not there: Megatron's own files, named, where the
/// iteration directory holds them; else the read's own error.
pub(crate) fn missing_shard(path: &Path, iteration_dir: &Path) -> Option<Error> {
    if path.exists() {
        return None;
    }
    let found = megatron_files(iteration_dir)?;
    Some(Error::Unsupported(format!(
        "{} holds a Megatron-LM checkpoint in the {found} format; this reads trident's own shards: `trident \
         convert --load DIR --save OUT` turns it into one (`train --load` and `generate --load` read it as it is)",
        iteration_dir.display()
    )))
}

/// The latest checkpoint in `dir` as full tensors: Megatron-LM's (`megatron::read_if_megatron`)
/// where `dir` holds one, else trident's (`convert::read_full`).
pub fn read_any(dir: &Path) -> Result<convert::FullCheckpoint> {
    match megatron::read_if_megatron(dir)? {
        Some((_, full)) => Ok(full),
        None => convert::read_full(dir),
    }
}

/// The one-rank shard of the latest checkpoint in `dir`: trident's `mp_rank_00`, or the weights of
/// a Megatron-LM checkpoint (`megatron::read_if_megatron`) of any layout, gathered into one.
pub fn load_single(dir: &Path) -> Result<(u64, PathBuf, Shard)> {
    let Some((iter_dir, full)) = megatron::read_if_megatron(dir)? else {
        return load_latest(dir, &shard_name(0, 0, 1));
    };
    let mut shard = Shard { meta: full.meta.clone(), tensors: Vec::new() };
    for key in ["tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_chunks"] {
        shard.meta.insert(key.into(), "1".into());
    }
    for info in full.model.parameters(&crate::model::ModelParallel::single()) {
        let data = full.tensors[&format!("param/{}", info.name)].clone();
        shard.tensors.push(SavedTensor { name: format!("param/chunk0/{}", info.name), shape: info.full_shape, data });
    }
    Ok((full.iteration, iter_dir, shard))
}

/// Reads and verifies the shard `name` of the latest checkpoint in `dir`.
pub fn load_latest(dir: &Path, name: &str) -> Result<(u64, PathBuf, Shard)> {
    let iteration = latest_iteration(dir)?;
    let path = shard_path(dir, iteration, name);
    if let Some(e) = missing_shard(&path, &iteration_dir(dir, iteration)) {
        return Err(e);
    }
    let bytes = crate::files::read_regular(&path, "read checkpoint shard")?;
    let shard = decode(&bytes, &path)?;
    Ok((iteration, path, shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Shard {
        let mut s = Shard::default();
        s.meta.insert("iteration".into(), "7".into());
        s.tensors.push(SavedTensor { name: "w".into(), shape: vec![2, 3], data: vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5] });
        s
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        let s = sample();
        let bytes = encode(&s);
        let p = Path::new("x.bin");
        let back = decode(&bytes, p).unwrap();
        assert_eq!(back.tensors, s.tensors);
        assert_eq!(back.meta, s.meta);
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert!(decode(&bad, p).unwrap_err().to_string().contains("checksum"));
        assert!(decode(&bytes[..bytes.len() - 3], p).is_err());
        assert!(decode(b"garbage", p).unwrap_err().to_string().contains("magic"));
    }

    /// A shard's bytes as version 1 wrote them: `key=value` lines, then `sample()`'s tensor.
    fn version_1(header: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        let tensors = encode(&Shard { meta: BTreeMap::new(), tensors: sample().tensors });
        let start = MAGIC.len() + 4 + 8 + 2;
        out.extend_from_slice(&tensors[start..tensors.len() - 8]);
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    #[test]
    fn metadata_values_cannot_add_keys_and_keys_are_checked() {
        let p = Path::new("x.bin");
        let mut s = sample();
        let crafted = "ByteTokenizer\nnum_layers=2\nseed=999\"}, \"x\": \"";
        s.meta.insert("tokenizer".into(), crafted.into());
        let back = decode(&encode(&s), p).unwrap();
        assert_eq!(back.meta, s.meta, "a value came back as something else");
        // Version 1 files still read, with their keys checked.
        let old = decode(&version_1("iteration=7\ntokenizer=ByteTokenizer\n"), p).unwrap();
        assert_eq!((old.meta.len(), old.meta["iteration"].as_str()), (2, "7"));
        assert_eq!(old.tensors, sample().tensors);
        for (header, needle) in [("iteration=7\niteration=8\n", "twice"), ("iteration=7\nweird=1\n", "weird")] {
            let e = decode(&version_1(header), p).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let mut unknown = sample();
        unknown.meta.insert("weird".into(), "1".into());
        assert!(decode(&encode(&unknown), p).unwrap_err().to_string().contains("unknown metadata key \"weird\""));
    }

    #[test]
    fn save_replaces_and_tracks_latest() {
        let dir = std::env::temp_dir().join(format!("trident-ckpt-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        save(&dir, 5, "mp_rank_00", &sample()).unwrap();
        save(&dir, 5, "mp_rank_00", &sample()).unwrap();
        save(&dir, 9, "mp_rank_00", &sample()).unwrap();
        let (it, _, shard) = load_latest(&dir, "mp_rank_00").unwrap();
        assert_eq!(it, 9);
        assert_eq!(shard.tensors, sample().tensors);
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left behind");
        fs::remove_dir_all(&dir).unwrap();
    }
}
