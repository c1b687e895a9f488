//! `--data-cache-path`: the indexes a run builds (each GPT dataset's document, sample and shuffle
//! index; each blend's dataset and dataset-sample index) kept as numpy `.npy` files in Megatron's
//! dtypes, so the next run with the same data and flags loads them instead of rebuilding. Files
//! are named `<hash>-<class>-<split>-<index>.npy` beside a `<hash>-<class>-<split>-description.txt`
//! that must match the run's description exactly for a hit; the hash is trident's own (FNV-1a),
//! so trident and Megatron caches can share a directory without mixing. Every rank may write: a
//! file is written under a temporary name and renamed into place, so readers never see half of
//! one. A cached file that does not parse or does not fit the data is an error naming it.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// One numpy array: its shape and its elements in C order.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    I16(Vec<usize>, Vec<i16>),
    I32(Vec<usize>, Vec<i32>),
    U32(Vec<usize>, Vec<u32>),
    I64(Vec<usize>, Vec<i64>),
}

impl Array {
    fn descr(&self) -> &'static str {
        match self {
            Array::I16(..) => "<i2",
            Array::I32(..) => "<i4",
            Array::U32(..) => "<u4",
            Array::I64(..) => "<i8",
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Array::I16(s, _) | Array::I32(s, _) | Array::U32(s, _) | Array::I64(s, _) => s,
        }
    }

    /// The elements widened to i64 (every dtype here fits).
    pub fn values(&self) -> Vec<i64> {
        match self {
            Array::I16(_, v) => v.iter().map(|&x| x.into()).collect(),
            Array::I32(_, v) => v.iter().map(|&x| x.into()).collect(),
            Array::U32(_, v) => v.iter().map(|&x| x.into()).collect(),
            Array::I64(_, v) => v.clone(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            Array::I16(_, v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Array::I32(_, v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Array::U32(_, v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Array::I64(_, v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

const MAGIC: &[u8] = b"\x93NUMPY\x01\x00";

/// The array in `.npy` format 1.0, header padded to 64 bytes as numpy pads it.
pub fn npy_bytes(a: &Array) -> Vec<u8> {
    let shape = match a.shape() {
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", a.descr());
    let unpadded = MAGIC.len() + 2 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&a.bytes());
    out
}

/// Parses a `.npy` file of one of `Array`'s dtypes, C order.
pub fn parse_npy(bytes: &[u8], path: &Path) -> Result<Array> {
    let bad = |why: &str| Error::format(path, format!("not a .npy index trident reads: {why}"));
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" || bytes[6] != 1 {
        return Err(bad("no numpy version-1 magic"));
    }
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header =
        bytes.get(10..10 + header_len).and_then(|h| std::str::from_utf8(h).ok()).ok_or_else(|| bad("header"))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}':"))? + key.len() + 3;
        Some(header[at..].trim_start())
    };
    let descr = field("descr")
        .and_then(|d| d.strip_prefix('\''))
        .and_then(|d| d.split('\'').next())
        .ok_or_else(|| bad("descr"))?;
    if !field("fortran_order").is_some_and(|f| f.starts_with("False")) {
        return Err(bad("fortran_order"));
    }
    let dims = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("shape"))?;
    let shape = dims
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<usize>().map_err(|_| bad("shape")))
        .collect::<Result<Vec<usize>>>()?;
    let data = &bytes[10 + header_len..];
    let width: usize = match descr {
        "<i2" => 2,
        "<i4" | "<u4" => 4,
        "<i8" => 8,
        other => return Err(bad(&format!("dtype {other}"))),
    };
    if shape.iter().try_fold(width, |n, &d| n.checked_mul(d)) != Some(data.len()) {
        return Err(bad("data length does not match the shape"));
    }
    fn items<const W: usize, T>(data: &[u8], f: fn([u8; W]) -> T) -> Vec<T> {
        data.chunks_exact(W).map(|c| f(c.try_into().expect("W-byte chunk"))).collect()
    }
    Ok(match width {
        2 => Array::I16(shape, items(data, i16::from_le_bytes)),
        8 => Array::I64(shape, items(data, i64::from_le_bytes)),
        _ if descr == "<i4" => Array::I32(shape, items(data, i32::from_le_bytes)),
        _ => Array::U32(shape, items(data, u32::from_le_bytes)),
    })
}

/// 64-bit FNV-1a, for file names.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The `--data-cache-path` directory.
pub struct IndexCache {
    dir: PathBuf,
}

impl IndexCache {
    pub fn new(dir: &Path) -> IndexCache {
        IndexCache { dir: dir.to_path_buf() }
    }

    fn path(&self, description: &str, class: &str, split: &str, name: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{:016x}-{class}-{split}-{name}.{ext}", fnv1a(description)))
    }

    /// The arrays `names` cached under `description`, or None when any is missing or the
    /// description differs.
    pub fn load(
        &self,
        description: &str,
        class: &str,
        split: &str,
        names: &[&str],
    ) -> Result<Option<Vec<(PathBuf, Array)>>> {
        let described = std::fs::read_to_string(self.path(description, class, split, "description", "txt"));
        if described.ok().as_deref() != Some(description) {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = self.path(description, class, split, name, "npy");
            let Ok(bytes) = std::fs::read(&path) else { return Ok(None) };
            let array = parse_npy(&bytes, &path)?;
            out.push((path, array));
        }
        Ok(Some(out))
    }

    /// Writes the arrays, then the description (whose presence marks a complete entry).
    pub fn store(&self, description: &str, class: &str, split: &str, arrays: &[(&str, Array)]) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, "create", e))?;
        for (name, array) in arrays {
            write_atomically(&self.path(description, class, split, name, "npy"), &npy_bytes(array))?;
        }
        write_atomically(&self.path(description, class, split, "description", "txt"), description.as_bytes())
    }
}

/// Writes `bytes` under a name no other writer uses (ranks may be processes on several nodes or
/// threads of one), then renames it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let unique = format!("tmp{}-{}-{nanos}", std::process::id(), WRITES.fetch_add(1, Ordering::Relaxed));
    let tmp = path.with_extension(unique);
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, "write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "rename into", e))
}

/// An error about cached `path` that does not fit the data it claims to index.
pub fn stale(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::format(
        path,
        format!("{why}; the cached index does not fit the data: delete it (or the --data-cache-path entry) to rebuild"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // numpy 2.4.6: np.save of np.array([1, -2, 3], dtype=np.int32) is this 128-byte file's
    // header; (2, 2) int64 and uint32 round-trip the same way.
    #[test]
    fn npy_round_trips_in_numpys_layout() {
        let a = Array::I32(vec![3], vec![1, -2, 3]);
        let bytes = npy_bytes(&a);
        assert_eq!(bytes.len(), 128 + 12);
        assert_eq!(&bytes[..10], b"\x93NUMPY\x01\x00\x76\x00");
        assert!(std::str::from_utf8(&bytes[10..128])
            .unwrap()
            .starts_with("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"));
        assert_eq!(bytes[127], b'\n');
        let path = Path::new("x.npy");
        assert_eq!(parse_npy(&bytes, path).unwrap(), a);
        for a in
            [Array::I64(vec![2, 2], vec![1, 2, 3, -4]), Array::U32(vec![0], vec![]), Array::I16(vec![2], vec![7, -7])]
        {
            assert_eq!(parse_npy(&npy_bytes(&a), path).unwrap(), a);
        }
        let mut short = bytes.clone();
        short.pop();
        assert!(parse_npy(&short, path).unwrap_err().to_string().contains("data length"));
        assert!(parse_npy(b"\x93NUMPX", path).is_err());
    }

    #[test]
    fn cache_hits_only_on_the_same_description() {
        let dir = crate::data::test_dir("index-cache");
        let cache = IndexCache::new(&dir.join("c"));
        let arrays = [("a", Array::I32(vec![2], vec![5, 6])), ("b", Array::I64(vec![1], vec![9]))];
        assert!(cache.load("d1", "GPTDataset", "train", &["a", "b"]).unwrap().is_none());
        cache.store("d1", "GPTDataset", "train", &arrays).unwrap();
        let hit = cache.load("d1", "GPTDataset", "train", &["a", "b"]).unwrap().unwrap();
        assert_eq!(hit[0].1, arrays[0].1);
        assert_eq!(hit[1].1, arrays[1].1);
        assert!(cache.load("d2", "GPTDataset", "train", &["a"]).unwrap().is_none());
        assert!(cache.load("d1", "GPTDataset", "valid", &["a"]).unwrap().is_none());
        std::fs::write(&hit[0].0, b"junk").unwrap();
        assert!(cache.load("d1", "GPTDataset", "train", &["a"]).is_err());
    }
}
