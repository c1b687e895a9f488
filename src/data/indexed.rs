//! Megatron's memory-mapped indexed dataset (`MMIDIDX` version 1): a `.bin` file of raw token ids
//! and an `.idx` file describing its sequences and documents, read with full validation and
//! written atomically.
//!
//! `.idx` layout, all integers little-endian (see the Megatron notes, section 6.1):
//!
//! | offset     | size | field                                            |
//! |------------|------|--------------------------------------------------|
//! | 0          | 9    | magic `MMIDIDX\0\0`                              |
//! | 9          | 8    | u64 version = 1                                  |
//! | 17         | 1    | u8 dtype code of the tokens in `.bin`            |
//! | 18         | 8    | u64 `N`, the sequence count                      |
//! | 26         | 8    | u64 `D`, the document-index count (documents + 1) |
//! | 34         | 4N   | i32 sequence lengths in tokens                   |
//! | 34+4N      | 8N   | i64 byte offset of each sequence in `.bin`       |
//! | 34+12N     | 8D   | i64 document indices `[0, …, N]`                 |
//! | 34+12N+8D  | N    | optional i8 sequence modes (multimodal only)     |

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
const VERSION: u64 = 1;
const HEADER_BYTES: usize = 34;

/// The element type of the token ids in `.bin`, with numpy's dtype codes as Megatron stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenDtype {
    U8,
    I8,
    I16,
    I32,
    I64,
    F64,
    F32,
    U16,
}

impl TokenDtype {
    const ALL: [TokenDtype; 8] = [
        TokenDtype::U8,
        TokenDtype::I8,
        TokenDtype::I16,
        TokenDtype::I32,
        TokenDtype::I64,
        TokenDtype::F64,
        TokenDtype::F32,
        TokenDtype::U16,
    ];

    /// The dtype for an `.idx` dtype code, or `None` for a code Megatron never writes.
    pub fn from_code(code: u8) -> Option<TokenDtype> {
        Self::ALL.into_iter().find(|dtype| dtype.code() == code)
    }

    /// The code stored at byte 17 of the `.idx` header.
    pub fn code(self) -> u8 {
        match self {
            TokenDtype::U8 => 1,
            TokenDtype::I8 => 2,
            TokenDtype::I16 => 3,
            TokenDtype::I32 => 4,
            TokenDtype::I64 => 5,
            TokenDtype::F64 => 6,
            TokenDtype::F32 => 7,
            TokenDtype::U16 => 8,
        }
    }

    /// Bytes per token in `.bin`.
    pub fn itemsize(self) -> usize {
        match self {
            TokenDtype::U8 | TokenDtype::I8 => 1,
            TokenDtype::I16 | TokenDtype::U16 => 2,
            TokenDtype::I32 | TokenDtype::F32 => 4,
            TokenDtype::I64 | TokenDtype::F64 => 8,
        }
    }

    /// numpy's name for the dtype, so messages read like the Python tools' output.
    pub fn name(self) -> &'static str {
        match self {
            TokenDtype::U8 => "uint8",
            TokenDtype::I8 => "int8",
            TokenDtype::I16 => "int16",
            TokenDtype::I32 => "int32",
            TokenDtype::I64 => "int64",
            TokenDtype::F64 => "float64",
            TokenDtype::F32 => "float32",
            TokenDtype::U16 => "uint16",
        }
    }

    /// The largest token id the dtype can store, or `None` for the float dtypes, which cannot
    /// hold token ids at all.
    pub fn max_token(self) -> Option<u32> {
        match self {
            TokenDtype::U8 => Some(u8::MAX.into()),
            TokenDtype::I8 => Some(127),
            TokenDtype::I16 => Some(32_767),
            TokenDtype::U16 => Some(u16::MAX.into()),
            TokenDtype::I32 => Some(i32::MAX as u32),
            TokenDtype::I64 => Some(u32::MAX),
            TokenDtype::F32 | TokenDtype::F64 => None,
        }
    }
}

/// The token dtype Megatron's `optimal_dtype` picks: uint16 when every id fits well below its
/// limit, int32 otherwise.
pub fn dtype_for_vocab(vocab_size: usize) -> TokenDtype {
    if vocab_size < 65_500 {
        TokenDtype::U16
    } else {
        TokenDtype::I32
    }
}

/// The dataset prefix `tools/preprocess_data.py` writes for one JSON key.
pub fn document_prefix(output_prefix: &str, key: &str) -> String {
    format!("{output_prefix}_{key}_document")
}

/// Appends a suffix to a path without treating dots in the prefix as an extension, because
/// Megatron prefixes such as `data/web.v2_text_document` contain dots of their own.
fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A read-only file mapping. Empty files are not mapped, because a zero-length mapping is an
/// error on some platforms.
enum Mapped {
    Empty,
    Map(Mmap),
}

impl Mapped {
    fn open(path: &Path) -> Result<Mapped> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let len = file.metadata().map_err(|e| Error::io(path, "read metadata of", e))?.len();
        if len == 0 {
            return Ok(Mapped::Empty);
        }
        // SAFETY: the mapping is read-only and lives as long as the dataset. Another process
        // truncating the file underneath us is outside what any reader can defend against;
        // Megatron's numpy memmap makes the same assumption.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "memory-map", e))?;
        Ok(Mapped::Map(map))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Mapped::Empty => &[],
            Mapped::Map(map) => map,
        }
    }
}

/// `W` little-endian bytes at `at`; callers have checked the range against the file length.
fn le_bytes<const W: usize>(bytes: &[u8], at: usize) -> [u8; W] {
    let mut raw = [0u8; W];
    raw.copy_from_slice(&bytes[at..at + W]);
    raw
}

/// A validated, memory-mapped `.bin/.idx` pair.
pub struct IndexedDataset {
    prefix: PathBuf,
    bin_path: PathBuf,
    idx_path: PathBuf,
    dtype: TokenDtype,
    idx: Mapped,
    bin: Mapped,
    num_sequences: usize,
    num_document_indices: usize,
    num_tokens: usize,
}

impl IndexedDataset {
    /// Maps `prefix.idx` and `prefix.bin` and checks every invariant the readers rely on, so
    /// that a damaged or mismatched pair fails here with one clear line instead of producing
    /// garbage samples later.
    pub fn open(prefix: &Path) -> Result<IndexedDataset> {
        let idx_path = with_suffix(prefix, ".idx");
        let bin_path = with_suffix(prefix, ".bin");
        let idx = Mapped::open(&idx_path)?;
        let bin = Mapped::open(&bin_path)?;
        let bad_idx = |problem: String| Error::format(&idx_path, problem);
        let bytes = idx.bytes();

        if bytes.len() < HEADER_BYTES {
            return Err(bad_idx(format!(
                "index is {} bytes, shorter than the {HEADER_BYTES}-byte MMIDIDX header \
                 (truncated, or not a Megatron index)",
                bytes.len()
            )));
        }
        if &bytes[..9] != MAGIC {
            return Err(bad_idx(format!(
                "wrong magic: found \"{}\", expected \"MMIDIDX\\0\\0\" (not a Megatron MMIDIDX index)",
                bytes[..9].escape_ascii()
            )));
        }
        let version = u64::from_le_bytes(le_bytes(bytes, 9));
        if version != VERSION {
            return Err(bad_idx(format!("unsupported index version {version}, expected {VERSION}")));
        }
        let code = bytes[17];
        let dtype = TokenDtype::from_code(code)
            .ok_or_else(|| bad_idx(format!("unknown token dtype code {code}, expected 1..=8 (numpy dtype codes)")))?;
        if dtype.max_token().is_none() {
            return Err(bad_idx(format!(
                "token dtype {} (code {code}) not supported: token ids must be integers",
                dtype.name()
            )));
        }

        // The header counts decide where every array lives; check them against the file length
        // in u128 so that absurd counts cannot overflow before they are rejected.
        let n = u64::from_le_bytes(le_bytes(bytes, 18));
        let d = u64::from_le_bytes(le_bytes(bytes, 26));
        let needed = HEADER_BYTES as u128 + 12 * u128::from(n) + 8 * u128::from(d);
        let found = bytes.len() as u128;
        if found < needed {
            return Err(bad_idx(format!(
                "truncated: the header announces {n} sequences and {d} document indices, which \
                 need {needed} bytes, but the file has {found}"
            )));
        }
        if found != needed && found != needed + u128::from(n) {
            return Err(bad_idx(format!(
                "inconsistent length: the header announces {n} sequences and {d} document \
                 indices, which need {needed} bytes (or {} with sequence modes), but the file has \
                 {found}",
                needed + u128::from(n)
            )));
        }
        // Both counts are now bounded by the file length, so they fit in usize.
        let (n, d) = (n as usize, d as usize);

        let lengths_at = HEADER_BYTES;
        let pointers_at = lengths_at + 4 * n;
        let documents_at = pointers_at + 8 * n;
        let itemsize = dtype.itemsize() as u64;
        let mut next_pointer: u64 = 0;
        let mut num_tokens: u64 = 0;
        for i in 0..n {
            let length = i32::from_le_bytes(le_bytes(bytes, lengths_at + 4 * i));
            let pointer = i64::from_le_bytes(le_bytes(bytes, pointers_at + 8 * i));
            if length < 0 {
                return Err(bad_idx(format!("sequence {i} has negative length {length}")));
            }
            if u64::try_from(pointer) != Ok(next_pointer) {
                return Err(bad_idx(format!(
                    "sequence {i} starts at byte {pointer} of the .bin, but the lengths before it \
                     put it at byte {next_pointer}"
                )));
            }
            // A length is below 2^31 and an itemsize at most 8, so only the running sums can
            // overflow, and only for an index far larger than any real file.
            let length = length as u64;
            num_tokens += length;
            next_pointer = next_pointer
                .checked_add(length * itemsize)
                .ok_or_else(|| bad_idx(format!("sequence {i} ends beyond 2^64 bytes")))?;
        }

        let document_index = |j: usize| i64::from_le_bytes(le_bytes(bytes, documents_at + 8 * j));
        if d == 0 {
            return Err(bad_idx(format!("the document index is empty; it must run from 0 to the sequence count {n}")));
        }
        if document_index(0) != 0 {
            return Err(bad_idx(format!("the document index starts at {}, expected 0", document_index(0))));
        }
        for j in 1..d {
            let (previous, current) = (document_index(j - 1), document_index(j));
            if current < previous {
                return Err(bad_idx(format!(
                    "document index entry {j} is {current}, smaller than the entry before it \
                     ({previous}); entries must not decrease"
                )));
            }
        }
        let last = document_index(d - 1);
        if u64::try_from(last) != Ok(n as u64) {
            return Err(bad_idx(format!("the document index ends at {last}, expected the sequence count {n}")));
        }

        let bin_bytes = bin.bytes().len() as u64;
        if bin_bytes < next_pointer {
            return Err(Error::format(
                &bin_path,
                format!(
                    "token file is {bin_bytes} bytes, but {} describes {n} sequences of \
                     {num_tokens} {} tokens that need {next_pointer} bytes (truncated .bin, or \
                     .bin and .idx from different runs)",
                    idx_path.display(),
                    dtype.name()
                ),
            ));
        }

        Ok(IndexedDataset {
            prefix: prefix.to_path_buf(),
            bin_path,
            idx_path,
            dtype,
            idx,
            bin,
            num_sequences: n,
            num_document_indices: d,
            // The tokens fit in a mapped file, so their count fits in usize.
            num_tokens: num_tokens as usize,
        })
    }

    /// The prefix the dataset was opened with, without extension.
    pub fn path_prefix(&self) -> &Path {
        &self.prefix
    }

    pub fn bin_path(&self) -> &Path {
        &self.bin_path
    }

    pub fn idx_path(&self) -> &Path {
        &self.idx_path
    }

    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    pub fn num_sequences(&self) -> usize {
        self.num_sequences
    }

    /// The number of documents, one less than the length of the document index.
    pub fn num_documents(&self) -> usize {
        self.num_document_indices - 1
    }

    /// Total tokens over all sequences.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Tokens in sequence `i`. Panics if `i >= num_sequences()`, like slice indexing.
    pub fn sequence_length(&self, i: usize) -> usize {
        assert!(i < self.num_sequences, "sequence {i} of {}", self.num_sequences);
        // Validated on open: lengths are non-negative i32.
        i32::from_le_bytes(le_bytes(self.idx.bytes(), HEADER_BYTES + 4 * i)) as usize
    }

    fn sequence_pointer(&self, i: usize) -> usize {
        let at = HEADER_BYTES + 4 * self.num_sequences + 8 * i;
        // Validated on open: pointers are non-negative and inside the mapped .bin.
        i64::from_le_bytes(le_bytes(self.idx.bytes(), at)) as usize
    }

    fn document_index(&self, j: usize) -> usize {
        let at = HEADER_BYTES + 12 * self.num_sequences + 8 * j;
        // Validated on open: entries run from 0 to num_sequences without decreasing.
        i64::from_le_bytes(le_bytes(self.idx.bytes(), at)) as usize
    }

    /// A copy of the document index `[0, …, num_sequences]`, decoded from the mapping.
    pub fn document_indices(&self) -> Vec<i64> {
        (0..self.num_document_indices).map(|j| self.document_index(j) as i64).collect()
    }

    /// The sequences that make up a range of documents.
    pub fn document_sequences(&self, documents: Range<usize>) -> Result<Range<usize>> {
        if documents.start > documents.end || documents.end > self.num_documents() {
            return Err(Error::Data(format!(
                "documents {}..{} requested from {}, which has {} documents",
                documents.start,
                documents.end,
                self.prefix.display(),
                self.num_documents()
            )));
        }
        Ok(self.document_index(documents.start)..self.document_index(documents.end))
    }

    /// Reads `out.len()` tokens of sequence `seq`, starting at token `offset` of that sequence.
    pub fn read(&self, seq: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        if seq >= self.num_sequences {
            return Err(Error::Data(format!(
                "{}: sequence {seq} requested, but the dataset has {} sequences",
                self.bin_path.display(),
                self.num_sequences
            )));
        }
        let length = self.sequence_length(seq);
        let end = offset.checked_add(out.len()).filter(|&end| end <= length).ok_or_else(|| {
            Error::Data(format!(
                "{}: tokens {offset}..{} of sequence {seq} requested, but it has {length} tokens",
                self.bin_path.display(),
                offset.saturating_add(out.len())
            ))
        })?;
        let itemsize = self.dtype.itemsize();
        let start_byte = self.sequence_pointer(seq) + offset * itemsize;
        let end_byte = start_byte + (end - offset) * itemsize;
        // Open checked that every sequence lies inside the .bin, so this cannot fail; `get`
        // keeps a broken invariant an error instead of a panic.
        let bytes =
            self.bin.bytes().get(start_byte..end_byte).ok_or_else(|| {
                Error::format(&self.bin_path, format!("sequence {seq} runs past the end of the file"))
            })?;
        let unsigned = |v: i64| u32::try_from(v).map_err(|_| v);
        let decoded = match self.dtype {
            TokenDtype::U8 => decode::<1>(bytes, out, |b| Ok(u32::from(b[0]))),
            TokenDtype::U16 => decode::<2>(bytes, out, |b| Ok(u32::from(u16::from_le_bytes(b)))),
            TokenDtype::I8 => decode::<1>(bytes, out, |b| unsigned(i8::from_le_bytes(b).into())),
            TokenDtype::I16 => decode::<2>(bytes, out, |b| unsigned(i16::from_le_bytes(b).into())),
            TokenDtype::I32 => decode::<4>(bytes, out, |b| unsigned(i32::from_le_bytes(b).into())),
            TokenDtype::I64 => decode::<8>(bytes, out, |b| unsigned(i64::from_le_bytes(b))),
            TokenDtype::F32 | TokenDtype::F64 => {
                return Err(Error::Unsupported(format!("float token dtype {}", self.dtype.name())))
            }
        };
        decoded.map_err(|(k, value)| {
            Error::format(
                &self.bin_path,
                format!(
                    "sequence {seq} holds {value} at token {}, which is not a token id \
                     (negative or above 4294967295)",
                    offset + k
                ),
            )
        })
    }
}

/// Decodes `W`-byte little-endian items into `out`; on a value that is not a token id returns
/// its position and value.
fn decode<const W: usize>(
    bytes: &[u8],
    out: &mut [u32],
    to_id: impl Fn([u8; W]) -> std::result::Result<u32, i64>,
) -> std::result::Result<(), (usize, i64)> {
    for (k, (slot, item)) in out.iter_mut().zip(bytes.chunks_exact(W)).enumerate() {
        let mut raw = [0u8; W];
        raw.copy_from_slice(item);
        *slot = to_id(raw).map_err(|value| (k, value))?;
    }
    Ok(())
}

/// What `IndexedDatasetWriter::finish` wrote.
#[derive(Clone, Debug)]
pub struct WriteSummary {
    pub documents: usize,
    pub sequences: usize,
    pub tokens: u64,
    pub bin_path: PathBuf,
    pub idx_path: PathBuf,
}

/// Writes a `.bin/.idx` pair one document at a time, each non-empty document as one sequence,
/// as `tools/preprocess_data.py` does without `--split-sentences`.
///
/// Both files are written under temporary names in the destination directory and renamed into
/// place only by `finish`, so a crash or an error never leaves a half-written pair under the
/// final names. Dropping an unfinished writer removes its temporary files.
pub struct IndexedDatasetWriter {
    dtype: TokenDtype,
    bin_path: PathBuf,
    idx_path: PathBuf,
    bin_tmp: PathBuf,
    idx_tmp: PathBuf,
    bin: Option<BufWriter<File>>,
    lengths: Vec<i32>,
    document_indices: Vec<i64>,
    num_tokens: u64,
    encoded: Vec<u8>,
}

impl IndexedDatasetWriter {
    pub fn create(prefix: &Path, dtype: TokenDtype) -> Result<IndexedDatasetWriter> {
        let bin_path = with_suffix(prefix, ".bin");
        if dtype.max_token().is_none() {
            return Err(Error::Unsupported(format!(
                "writing {} with float token dtype {}; use uint16 or int32",
                bin_path.display(),
                dtype.name()
            )));
        }
        let tmp = format!(".tmp-{}", std::process::id());
        let bin_tmp = with_suffix(&bin_path, &tmp);
        let file = File::create(&bin_tmp).map_err(|e| Error::io(&bin_tmp, "create", e))?;
        let idx_path = with_suffix(prefix, ".idx");
        Ok(IndexedDatasetWriter {
            dtype,
            idx_tmp: with_suffix(&idx_path, &tmp),
            bin_path,
            idx_path,
            bin_tmp,
            bin: Some(BufWriter::with_capacity(1 << 20, file)),
            lengths: Vec::new(),
            document_indices: vec![0],
            num_tokens: 0,
            encoded: Vec::new(),
        })
    }

    /// Appends one document. An empty document adds no sequence but still ends a document, so
    /// the document index repeats its previous entry, as in Megatron.
    pub fn add_document(&mut self, tokens: &[u32]) -> Result<()> {
        let document = self.document_indices.len() - 1;
        if !tokens.is_empty() {
            let length = i32::try_from(tokens.len()).map_err(|_| {
                Error::Data(format!(
                    "document {document} for {} has {} tokens, more than the {} one .idx \
                     sequence can hold",
                    self.bin_path.display(),
                    tokens.len(),
                    i32::MAX
                ))
            })?;
            // Encode the whole document before writing, so a bad id leaves the file untouched.
            let max = self.dtype.max_token().unwrap_or(0);
            self.encoded.clear();
            for &id in tokens {
                if id > max {
                    return Err(Error::Data(format!(
                        "token id {id} in document {document} does not fit the {} token dtype \
                         of {} (largest id {max})",
                        self.dtype.name(),
                        self.bin_path.display()
                    )));
                }
                match self.dtype {
                    TokenDtype::U8 | TokenDtype::I8 => self.encoded.push(id as u8),
                    TokenDtype::U16 | TokenDtype::I16 => self.encoded.extend_from_slice(&(id as u16).to_le_bytes()),
                    TokenDtype::I32 => self.encoded.extend_from_slice(&id.to_le_bytes()),
                    TokenDtype::I64 | TokenDtype::F32 | TokenDtype::F64 => {
                        self.encoded.extend_from_slice(&u64::from(id).to_le_bytes())
                    }
                }
            }
            if let Some(bin) = self.bin.as_mut() {
                bin.write_all(&self.encoded).map_err(|e| Error::io(&self.bin_tmp, "write", e))?;
            }
            self.lengths.push(length);
            self.num_tokens += tokens.len() as u64;
        }
        self.document_indices.push(self.lengths.len() as i64);
        Ok(())
    }

    /// Writes the `.idx`, syncs both files and renames them into place.
    pub fn finish(mut self) -> Result<WriteSummary> {
        if let Some(bin) = self.bin.take() {
            let file = bin.into_inner().map_err(|e| Error::io(&self.bin_tmp, "write", e.into_error()))?;
            file.sync_all().map_err(|e| Error::io(&self.bin_tmp, "sync", e))?;
        }
        self.write_index().map_err(|e| Error::io(&self.idx_tmp, "write", e))?;

        // Remove the old index first: if we crash between the renames, the reader then reports
        // a missing .idx rather than pairing a new .bin with a stale .idx.
        match fs::remove_file(&self.idx_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&self.idx_path, "remove the old", e));
            }
            _ => {}
        }
        fs::rename(&self.bin_tmp, &self.bin_path).map_err(|e| Error::io(&self.bin_path, "rename into", e))?;
        fs::rename(&self.idx_tmp, &self.idx_path).map_err(|e| Error::io(&self.idx_path, "rename into", e))?;
        // Make the renames themselves durable. Some filesystems refuse to sync a directory;
        // the data is already synced, so that is not worth failing the whole run for.
        let dir = match self.idx_path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }

        Ok(WriteSummary {
            documents: self.document_indices.len() - 1,
            sequences: self.lengths.len(),
            tokens: self.num_tokens,
            bin_path: self.bin_path.clone(),
            idx_path: self.idx_path.clone(),
        })
    }

    fn write_index(&self) -> std::io::Result<()> {
        let mut idx = BufWriter::new(File::create(&self.idx_tmp)?);
        idx.write_all(MAGIC)?;
        idx.write_all(&VERSION.to_le_bytes())?;
        idx.write_all(&[self.dtype.code()])?;
        idx.write_all(&(self.lengths.len() as u64).to_le_bytes())?;
        idx.write_all(&(self.document_indices.len() as u64).to_le_bytes())?;
        for length in &self.lengths {
            idx.write_all(&length.to_le_bytes())?;
        }
        let mut pointer: i64 = 0;
        for &length in &self.lengths {
            idx.write_all(&pointer.to_le_bytes())?;
            pointer += i64::from(length) * self.dtype.itemsize() as i64;
        }
        for index in &self.document_indices {
            idx.write_all(&index.to_le_bytes())?;
        }
        idx.into_inner().map_err(|e| e.into_error())?.sync_all()
    }
}

impl Drop for IndexedDatasetWriter {
    fn drop(&mut self) {
        // After a successful finish the temporary names no longer exist and these fail quietly.
        let _ = fs::remove_file(&self.bin_tmp);
        let _ = fs::remove_file(&self.idx_tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip_and_match_megatron() {
        for dtype in TokenDtype::ALL {
            assert_eq!(TokenDtype::from_code(dtype.code()), Some(dtype));
        }
        assert_eq!(TokenDtype::from_code(0), None);
        assert_eq!(TokenDtype::from_code(9), None);
        assert_eq!(TokenDtype::U16.code(), 8);
        assert_eq!(TokenDtype::I32.code(), 4);
        assert_eq!(dtype_for_vocab(257), TokenDtype::U16);
        assert_eq!(dtype_for_vocab(65_499), TokenDtype::U16);
        assert_eq!(dtype_for_vocab(65_500), TokenDtype::I32);
        assert_eq!(document_prefix("data/web", "text"), "data/web_text_document");
    }

    #[test]
    fn suffix_keeps_dots_in_the_prefix() {
        assert_eq!(
            with_suffix(Path::new("d/web.v2_text_document"), ".bin"),
            PathBuf::from("d/web.v2_text_document.bin")
        );
    }

    #[test]
    fn writer_rejects_ids_that_do_not_fit_and_cleans_up() {
        let dir = crate::data::test_dir("indexed-fit");
        let prefix = dir.join("p");
        let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U8).unwrap();
        writer.add_document(&[1, 2, 255]).unwrap();
        let err = writer.add_document(&[3, 256]).unwrap_err().to_string();
        assert!(err.contains("token id 256 in document 1") && err.contains("uint8"), "{err}");
        drop(writer);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "temporary files left behind");
    }

    #[test]
    fn every_integer_dtype_round_trips() {
        let dir = crate::data::test_dir("indexed-dtypes");
        for dtype in TokenDtype::ALL.into_iter().filter(|d| d.max_token().is_some()) {
            let prefix = dir.join(dtype.name());
            let max = dtype.max_token().unwrap();
            let mut writer = IndexedDatasetWriter::create(&prefix, dtype).unwrap();
            writer.add_document(&[0, 1, max]).unwrap();
            writer.add_document(&[]).unwrap();
            writer.add_document(&[7]).unwrap();
            let summary = writer.finish().unwrap();
            assert_eq!((summary.documents, summary.sequences, summary.tokens), (3, 2, 4));
            let data = IndexedDataset::open(&prefix).unwrap();
            assert_eq!(data.dtype(), dtype);
            assert_eq!(data.document_indices(), vec![0, 1, 1, 2]);
            let mut out = [0u32; 3];
            data.read(0, 0, &mut out).unwrap();
            assert_eq!(out, [0, 1, max]);
            data.read(1, 0, &mut out[..1]).unwrap();
            assert_eq!(out[0], 7);
            assert_eq!(data.document_sequences(1..3).unwrap(), 1..2);
        }
    }

    #[test]
    fn negative_stored_tokens_are_reported() {
        let dir = crate::data::test_dir("indexed-negative");
        let prefix = dir.join("p");
        let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::I16).unwrap();
        writer.add_document(&[5, 6]).unwrap();
        writer.finish().unwrap();
        fs::write(dir.join("p.bin"), (-3i16).to_le_bytes().repeat(2)).unwrap();
        let data = IndexedDataset::open(&prefix).unwrap();
        let err = data.read(0, 1, &mut [0u32; 1]).unwrap_err().to_string();
        assert!(err.contains("p.bin") && err.contains("holds -3 at token 1"), "{err}");
        let err = data.read(0, 1, &mut [0u32; 2]).unwrap_err().to_string();
        assert!(err.contains("tokens 1..3 of sequence 0") && err.contains("has 2 tokens"), "{err}");
    }
}
