//! `--tensorboard-dir`: TensorBoard event files, written by hand so no TensorFlow or protobuf
//! library is needed. A file is a sequence of TFRecords (a little-endian u64 length, its masked
//! CRC-32C, the bytes, their masked CRC-32C), each one a serialized `tensorflow.Event`: the first
//! carries the file version, the rest a step, a wall time and a `Summary` of tagged scalars.
//! The protobuf fields used: Event {double wall_time = 1; int64 step = 2; string file_version =
//! 3; Summary summary = 5}, Summary {repeated Value value = 1}, Value {string tag = 1; float
//! simple_value = 2}.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bytewise from a table.
pub fn crc32c(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
            *slot = c;
        }
        table
    });
    !bytes.iter().fold(!0u32, |c, &b| table[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8))
}

/// TFRecord's masked CRC: rotated right by 15 and offset, so a CRC of data holding CRCs is not
/// degenerate.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field (wire type 2).
fn bytes_field(field: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// An `Event` with its wall time and step, and either the file version or a summary.
fn event(wall_time: f64, step: i64, file_version: Option<&str>, scalars: &[(&str, f64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(1 << 3 | 1); // wall_time: 64-bit
    out.extend_from_slice(&wall_time.to_le_bytes());
    out.push(2 << 3); // step: varint (int64, two's complement)
    varint(step as u64, &mut out);
    if let Some(version) = file_version {
        bytes_field(3, version.as_bytes(), &mut out);
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut v = Vec::new();
            bytes_field(1, tag.as_bytes(), &mut v);
            v.push(2 << 3 | 5); // simple_value: 32-bit
            v.extend_from_slice(&(*value as f32).to_le_bytes());
            bytes_field(1, &v, &mut summary);
        }
        bytes_field(5, &summary, &mut out);
    }
    out
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One run's event file in `--tensorboard-dir`, named as TensorBoard's writers name theirs
/// (`events.out.tfevents.<seconds>.<host>.<pid>.0`), flushed after every write so a watching
/// TensorBoard sees each point as it is logged and a killed run keeps what it logged. A resumed
/// run starts a new file beside the old ones, as TensorBoard's writers do.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    pub fn create(dir: &Path) -> Result<EventWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create the --tensorboard-dir directory", e))?;
        let host =
            std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
        let host = if host.is_empty() { "localhost".to_string() } else { host };
        let secs = now() as u64;
        let path = dir.join(format!("events.out.tfevents.{secs}.{host}.{}.0", std::process::id()));
        let file = File::create(&path).map_err(|e| Error::io(&path, "create", e))?;
        let mut writer = EventWriter { path, out: BufWriter::new(file) };
        writer.write(&event(now(), 0, Some("brain.Event:2"), &[]))?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tagged scalars at `step`, as one event.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> Result<()> {
        self.write(&event(now(), step as i64, None, scalars))
    }

    fn write(&mut self, event: &[u8]) -> Result<()> {
        self.out
            .write_all(&record(event))
            .and_then(|()| self.out.flush())
            .map_err(|e| Error::io(&self.path, "write", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The CRC-32C check value (RFC 3720, iSCSI) and TFRecord's framing of an empty record.
    #[test]
    fn crc32c_and_record_framing() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        let r = record(b"abc");
        assert_eq!(r.len(), 8 + 4 + 3 + 4);
        assert_eq!(&r[..8], &3u64.to_le_bytes());
        assert_eq!(&r[8..12], &masked_crc32c(&3u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&r[12..15], b"abc");
        assert_eq!(masked_crc32c(b"abc"), crc32c(b"abc").rotate_right(15).wrapping_add(0xa282_ead8));
    }

    // Hand-decoded bytes of an event with one scalar: wall_time 1.5 at step 300, tag "lr", 0.25.
    #[test]
    fn events_encode_as_protobuf() {
        let e = event(1.5, 300, None, &[("lr", 0.25)]);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0xAC, 0x02]); // 300 as a varint
        want.extend_from_slice(&[0x2A, 11, 0x0A, 9, 0x0A, 2, b'l', b'r', 0x15]);
        want.extend_from_slice(&0.25f32.to_le_bytes());
        assert_eq!(e, want);
        let v = event(0.0, 0, Some("brain.Event:2"), &[]);
        assert_eq!(&v[v.len() - 15..], b"\x1a\x0dbrain.Event:2");
    }
}
