//! The zip container of `torch.save` files: stored (uncompressed) entries, found through the
//! central directory (ZIP64 included, as PyTorch writes files over 4 GiB), each entry's bytes
//! checked to lie inside the file. The writer stores entries the way PyTorch does, each entry's
//! data aligned to 64 bytes by padding its local header's extra field, so a reader can map
//! storages in place.

use crate::error::{Error, Result};
use std::ops::Range;
use std::path::Path;

/// One entry: its name and where its bytes lie in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    pub data: Range<usize>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

const EOCD: u32 = 0x0605_4b50;
const EOCD64: u32 = 0x0606_4b50;
const EOCD64_LOCATOR: u32 = 0x0706_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;

/// The central directory's (offset, entry count).
fn directory(b: &[u8], path: &Path) -> Result<(usize, usize)> {
    let bad = |what: &str| Error::format(path, format!("not a zip archive (torch.save's format): {what}"));
    let floor = b.len().saturating_sub(22 + 65_535);
    let eocd = (floor..=b.len().saturating_sub(22))
        .rev()
        .find(|&i| u32_at(b, i) == Some(EOCD))
        .ok_or_else(|| bad("no end-of-central-directory record"))?;
    let (mut count, mut offset) = (u16_at(b, eocd + 10).unwrap_or(0) as u64, u32_at(b, eocd + 16).unwrap_or(0) as u64);
    if count == 0xffff || offset == 0xffff_ffff {
        let loc = eocd.checked_sub(20).filter(|&l| u32_at(b, l) == Some(EOCD64_LOCATOR));
        let loc = loc.ok_or_else(|| bad("a ZIP64 archive without its locator"))?;
        let at = u64_at(b, loc + 8).and_then(|v| usize::try_from(v).ok()).filter(|&a| u32_at(b, a) == Some(EOCD64));
        let at = at.ok_or_else(|| bad("the ZIP64 end record is missing"))?;
        count = u64_at(b, at + 32).ok_or_else(|| bad("a truncated ZIP64 end record"))?;
        offset = u64_at(b, at + 48).ok_or_else(|| bad("a truncated ZIP64 end record"))?;
    }
    // Each central entry takes at least 46 bytes: a count the file cannot hold is refused here.
    let offset =
        usize::try_from(offset).ok().filter(|&o| o <= b.len()).ok_or_else(|| bad("a directory past the end"))?;
    if count > ((b.len() - offset) / 46) as u64 {
        return Err(bad(&format!("{count} entries in a directory of {} bytes", b.len() - offset)));
    }
    Ok((offset, count as usize))
}

/// A ZIP64 extra field's sizes and offset, each present only where the directory holds 0xffffffff.
fn zip64_fields(extra: &[u8], wanted: [bool; 3], mut values: [u64; 3]) -> Option<[u64; 3]> {
    let mut at = 0;
    while at + 4 <= extra.len() {
        let (id, len) = (u16_at(extra, at)?, u16_at(extra, at + 2)? as usize);
        let body = extra.get(at + 4..at + 4 + len)?;
        if id == 1 {
            let mut pos = 0;
            for (v, want) in values.iter_mut().zip(wanted) {
                if want {
                    *v = u64_at(body, pos)?;
                    pos += 8;
                }
            }
            return Some(values);
        }
        at += 4 + len;
    }
    wanted.iter().all(|w| !w).then_some(values)
}

/// Every entry of the zip archive `b` (read from `path`), its data range checked against the file.
pub fn entries(b: &[u8], path: &Path) -> Result<Vec<Entry>> {
    let (mut at, count) = directory(b, path)?;
    let bad = |what: String| Error::format(path, format!("zip archive: {what}"));
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        if u32_at(b, at) != Some(CENTRAL) {
            return Err(bad(format!("central directory entry {i} is malformed")));
        }
        let field16 = |o: usize| u16_at(b, at + o).unwrap_or(0) as usize;
        let (method, name_len, extra_len, comment_len) = (field16(10), field16(28), field16(30), field16(32));
        let raw = [u32_at(b, at + 24), u32_at(b, at + 20), u32_at(b, at + 42)].map(|v| v.unwrap_or(0) as u64);
        let name_at = at + 46;
        let name = b.get(name_at..name_at + name_len).ok_or_else(|| bad(format!("entry {i}'s name is cut off")))?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad(format!("entry {i}'s name is not UTF-8")))?;
        let extra = b.get(name_at + name_len..name_at + name_len + extra_len).unwrap_or(&[]);
        let [size, _, local] = zip64_fields(extra, raw.map(|v| v == 0xffff_ffff), raw)
            .ok_or_else(|| bad(format!("'{name}' lacks its ZIP64 sizes")))?;
        if method != 0 {
            return Err(bad(format!(
                "'{name}' is compressed (method {method}); torch.save stores entries uncompressed"
            )));
        }
        let local = usize::try_from(local).ok().filter(|_| u32_at(b, local as usize) == Some(LOCAL));
        let local = local.ok_or_else(|| bad(format!("'{name}' points at no local header")))?;
        let data_at = [26, 28].map(|o| u16_at(b, local + o).unwrap_or(0) as usize);
        let start = local + 30 + data_at[0] + data_at[1];
        let end = usize::try_from(size).ok().and_then(|s| start.checked_add(s)).filter(|&e| e <= b.len());
        let end = end.ok_or_else(|| bad(format!("'{name}' holds {size} bytes past the end of the file")))?;
        out.push(Entry { name, data: start..end });
        at = name_at + name_len + extra_len + comment_len;
    }
    Ok(out)
}

/// A zip archive of stored entries, written as PyTorch writes them.
pub struct ZipWriter {
    pub out: Vec<u8>,
    central: Vec<u8>,
    count: u64,
}

const ALIGN: usize = 64;

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

impl Default for ZipWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl ZipWriter {
    pub fn new() -> ZipWriter {
        ZipWriter { out: Vec::new(), central: Vec::new(), count: 0 }
    }

    /// Stores `data` as `name`, its first byte aligned to 64. Sizes and offsets are always
    /// written as ZIP64 fields, so entries past 4 GiB need nothing else.
    pub fn add(&mut self, name: &str, data: &[u8]) {
        let crc = crc32(data);
        let offset = self.out.len() as u64;
        let zip64 = |local: bool| {
            let mut e = vec![1, 0];
            e.extend_from_slice(&(if local { 16u16 } else { 24 }).to_le_bytes());
            e.extend_from_slice(&(data.len() as u64).to_le_bytes());
            e.extend_from_slice(&(data.len() as u64).to_le_bytes());
            if !local {
                e.extend_from_slice(&offset.to_le_bytes());
            }
            e
        };
        let mut extra = zip64(true);
        let unpadded = self.out.len() + 30 + name.len() + extra.len();
        let pad = (ALIGN - unpadded % ALIGN) % ALIGN;
        if pad > 0 {
            // PyTorch's own padding field ("FB"), at least its 4-byte header.
            let pad = if pad < 4 { pad + ALIGN } else { pad };
            extra.extend_from_slice(b"FB");
            extra.extend_from_slice(&((pad - 4) as u16).to_le_bytes());
            extra.resize(extra.len() + pad - 4, b'Z');
        }
        let header = |sig: u32, central: bool, extra: &[u8]| {
            let mut h = sig.to_le_bytes().to_vec();
            if central {
                h.extend_from_slice(&45u16.to_le_bytes());
            }
            for v in [45u16, 0x0800, 0, 0, 0] {
                h.extend_from_slice(&v.to_le_bytes());
            }
            h.extend_from_slice(&crc.to_le_bytes());
            h.extend_from_slice(&[0xff; 8]);
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&(extra.len() as u16).to_le_bytes());
            if central {
                h.extend_from_slice(&[0; 10]);
                h.extend_from_slice(&[0xff; 4]);
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(extra);
            h
        };
        self.out.extend(header(LOCAL, false, &extra));
        self.out.extend_from_slice(data);
        self.central.extend(header(CENTRAL, true, &zip64(false)));
        self.count += 1;
    }

    /// The archive: entries, central directory, ZIP64 end record and locator, end record.
    pub fn finish(mut self) -> Vec<u8> {
        let (dir_at, dir_len) = (self.out.len() as u64, self.central.len() as u64);
        self.out.append(&mut self.central);
        let end64_at = self.out.len() as u64;
        self.out.extend_from_slice(&EOCD64.to_le_bytes());
        self.out.extend_from_slice(&44u64.to_le_bytes());
        for v in [45u16, 45] {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        self.out.extend_from_slice(&[0; 8]);
        for v in [self.count, self.count, dir_len, dir_at] {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        self.out.extend_from_slice(&EOCD64_LOCATOR.to_le_bytes());
        self.out.extend_from_slice(&0u32.to_le_bytes());
        self.out.extend_from_slice(&end64_at.to_le_bytes());
        self.out.extend_from_slice(&1u32.to_le_bytes());
        self.out.extend_from_slice(&EOCD.to_le_bytes());
        self.out.extend_from_slice(&[0; 4]);
        self.out.extend_from_slice(&[0xff; 4]);
        self.out.extend_from_slice(&[0xff; 8]);
        self.out.extend_from_slice(&[0; 2]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_aligned() {
        let mut w = ZipWriter::new();
        w.add("a/data.pkl", b"hello");
        w.add("a/data/0", &[7u8; 100]);
        let z = w.finish();
        let e = entries(&z, Path::new("t.zip")).unwrap();
        assert_eq!(e.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a/data.pkl", "a/data/0"]);
        assert_eq!(&z[e[0].data.clone()], b"hello");
        assert_eq!(&z[e[1].data.clone()], &[7u8; 100]);
        assert!(e.iter().all(|e| e.data.start % 64 == 0));
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn every_truncation_is_an_error_or_short() {
        let mut w = ZipWriter::new();
        w.add("a/data.pkl", b"hello");
        let z = w.finish();
        for n in 0..z.len() {
            assert!(entries(&z[..n], Path::new("t.zip")).is_err(), "{n}");
        }
    }
}
