//! `prepare`: turns plain-text or JSON-lines files into Megatron `.bin/.idx` pairs with a
//! tokenizer (bytes, GPT-2 BPE, a Hugging Face tokenizer.json), as Megatron's
//! `tools/preprocess_data.py` does.
//!
//! Inputs are streamed line by line into batches of documents; `workers` threads encode a batch
//! (each with its own piece cache) and the batch is written in input order, so memory stays
//! bounded by the batch and the longest document (the whole file in `TextDocuments::File`
//! mode), not by the input size, and the output does not depend on the thread count.

use super::indexed::{document_prefix, dtype_for_vocab, IndexedDatasetWriter};
use super::json;
use super::tokenizer::{PieceCache, Tokenizer};
use crate::error::{Error, Result};
use std::fmt;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a plain-text file splits into documents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TextDocuments {
    /// Paragraphs separated by one or more blank (whitespace-only) lines. A paragraph keeps its
    /// internal newlines and its final newline.
    #[default]
    Paragraph,
    /// One document per line, without its line ending; blank lines are skipped.
    Line,
    /// The whole file is one document.
    File,
}

#[derive(Clone, Debug)]
pub struct PrepareArgs {
    pub inputs: Vec<PathBuf>,
    pub output_prefix: String,
    /// JSON keys to extract, one output dataset each; empty means `["text"]`.
    pub json_keys: Vec<String>,
    /// Append the tokenizer's end-of-document id to every non-empty document.
    pub append_eod: bool,
    pub tokenizer: std::sync::Arc<Tokenizer>,
    /// Threads that encode (at least 1).
    pub workers: usize,
    pub text_documents: TextDocuments,
    /// `Some(true)` reads every input as JSON lines, `Some(false)` as plain text; `None` decides
    /// by file name (`.json` and `.jsonl` are JSON lines).
    pub force_json: Option<bool>,
}

/// Where a running `prepare` is, for a progress line on large inputs.
#[derive(Clone, Debug)]
pub struct PrepareProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub documents: u64,
    pub tokens: u64,
    pub seconds: f64,
}

impl fmt::Display for PrepareProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = 100.0 * self.bytes_done as f64 / self.bytes_total.max(1) as f64;
        write!(
            f,
            "{:.1}/{:.1} MiB ({percent:.0}%) | {} documents | {} tokens | {:.1} MiB/s",
            mib(self.bytes_done),
            mib(self.bytes_total),
            self.documents,
            self.tokens,
            mib(self.bytes_done) / self.seconds.max(1e-9)
        )
    }
}

/// What `prepare` wrote.
#[derive(Clone, Debug)]
pub struct PrepareSummary {
    /// Input documents, counted once however many keys each carries.
    pub documents: u64,
    /// Tokens written over all outputs, EODs included.
    pub tokens: u64,
    pub input_bytes: u64,
    pub seconds: f64,
    /// The `.bin` and `.idx` of every output, in key order.
    pub outputs: Vec<PathBuf>,
}

impl fmt::Display for PrepareSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outputs: Vec<String> = self.outputs.iter().map(|path| path.display().to_string()).collect();
        write!(
            f,
            "prepared {} documents, {} tokens from {:.1} MiB in {:.1} s ({:.1} MiB/s) -> {}",
            self.documents,
            self.tokens,
            mib(self.input_bytes),
            self.seconds,
            mib(self.input_bytes) / self.seconds.max(1e-9),
            outputs.join(", ")
        )
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Reports at most this often, so a fast run prints a couple of lines per second at most.
const REPORT_INTERVAL: Duration = Duration::from_millis(500);
/// The clock is read once per this much input, keeping it off the per-line path.
const CLOCK_CHECK_BYTES: u64 = 64 * 1024;

/// Input bytes per batch of documents handed to the workers.
const BATCH_BYTES: usize = 4 << 20;

/// Tokenizes and writes one dataset per key, and keeps the counts behind progress reports.
struct Sink<'a> {
    writers: Vec<IndexedDatasetWriter>,
    append_eod: bool,
    tokenizer: &'a Tokenizer,
    /// One per worker, kept across batches.
    caches: Vec<PieceCache>,
    /// Documents read but not yet written: per document, its text per key.
    batch: Vec<Vec<Vec<u8>>>,
    batch_bytes: usize,
    documents: u64,
    tokens_written: u64,
    bytes_done: u64,
    bytes_total: u64,
    next_clock_check: u64,
    start: Instant,
    last_report: Instant,
    report: &'a mut dyn FnMut(&PrepareProgress),
}

impl Sink<'_> {
    /// Takes one input document: `texts[k]` goes to the dataset of key `k`. `place` says where it
    /// is, for the error when a BPE tokenizer meets bytes that are not UTF-8.
    fn document<T: AsRef<[u8]>>(&mut self, texts: &[T], place: &dyn Fn() -> String) -> Result<()> {
        if self.tokenizer.needs_utf8() {
            for text in texts {
                if let Err(e) = std::str::from_utf8(text.as_ref()) {
                    return Err(Error::Config(format!(
                        "{}: invalid UTF-8 at byte {} of the document: {} reads UTF-8 text (the byte tokenizer \
                         takes any bytes)",
                        place(),
                        e.valid_up_to(),
                        self.tokenizer.type_name()
                    )));
                }
            }
        }
        let texts: Vec<Vec<u8>> = texts.iter().map(|t| t.as_ref().to_vec()).collect();
        self.batch_bytes += texts.iter().map(Vec::len).sum::<usize>();
        self.batch.push(texts);
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Encodes the batch on the workers (contiguous shares, one cache each) and writes it in order.
    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let share = batch.len().div_ceil(self.caches.len()).max(1);
        let (tokenizer, append_eod) = (self.tokenizer, self.append_eod);
        let encode = |docs: &[Vec<Vec<u8>>], cache: &mut PieceCache| -> Vec<Vec<Vec<u32>>> {
            docs.iter()
                .map(|texts| {
                    texts
                        .iter()
                        .map(|text| {
                            let mut ids = tokenizer.encode(text, cache);
                            if append_eod && !ids.is_empty() {
                                ids.push(tokenizer.eod());
                            }
                            ids
                        })
                        .collect()
                })
                .collect()
        };
        let encoded: Vec<Vec<Vec<Vec<u32>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .chunks(share)
                .zip(self.caches.iter_mut())
                .map(|(docs, cache)| s.spawn(move || encode(docs, cache)))
                .collect();
            handles.into_iter().map(|h| h.join().expect("an encoding thread panicked")).collect()
        });
        for doc in encoded.into_iter().flatten() {
            for (writer, ids) in self.writers.iter_mut().zip(&doc) {
                writer.add_document(ids)?;
                self.tokens_written += ids.len() as u64;
            }
            self.documents += 1;
        }
        Ok(())
    }

    /// Counts input bytes read and reports progress when it is due.
    fn consumed(&mut self, bytes: usize) {
        self.bytes_done += bytes as u64;
        if self.bytes_done < self.next_clock_check {
            return;
        }
        self.next_clock_check = self.bytes_done + CLOCK_CHECK_BYTES;
        let now = Instant::now();
        if now.duration_since(self.last_report) >= REPORT_INTERVAL {
            self.last_report = now;
            (self.report)(&PrepareProgress {
                bytes_done: self.bytes_done,
                bytes_total: self.bytes_total,
                documents: self.documents,
                tokens: self.tokens_written,
                seconds: now.duration_since(self.start).as_secs_f64(),
            });
        }
    }
}

/// Whether `path` holds JSON lines; compressed inputs are refused rather than misread.
fn is_json_input(path: &Path, force_json: Option<bool>) -> Result<bool> {
    let name = path.file_name().map(|name| name.to_string_lossy().to_lowercase()).unwrap_or_default();
    if name.ends_with(".gz") {
        return Err(Error::Unsupported(format!(
            "compressed input {}; decompress it first (gunzip -k)",
            path.display()
        )));
    }
    Ok(force_json.unwrap_or(name.ends_with(".json") || name.ends_with(".jsonl")))
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Tokenizes every input into `{output_prefix}_{key}_document.{bin,idx}`, one pair per JSON key
/// (plain text always fills key `text`), with tokens of Megatron's width for the vocabulary
/// (uint16 below 65,500 ids, int32 above). Outputs appear only when all inputs succeeded.
pub fn prepare(args: &PrepareArgs, progress: &mut dyn FnMut(&PrepareProgress)) -> Result<PrepareSummary> {
    let start = Instant::now();
    let keys = if args.json_keys.is_empty() { vec!["text".to_string()] } else { args.json_keys.clone() };
    if args.inputs.is_empty() {
        return Err(Error::Usage("prepare needs at least one input file".into()));
    }
    if let Some(repeated) = keys.iter().enumerate().find(|(i, key)| keys[..*i].contains(key)) {
        return Err(Error::flag(
            "--json-keys",
            keys.join(","),
            format!("distinct keys (\"{}\" is given twice)", repeated.1),
        ));
    }

    // Check every input before creating any output, so a typo in the last file name fails fast.
    let mut inputs = Vec::with_capacity(args.inputs.len());
    let mut bytes_total = 0;
    for path in &args.inputs {
        let json = is_json_input(path, args.force_json)?;
        if !json && keys != ["text"] {
            return Err(Error::Usage(format!(
                "plain-text input {} can only fill key \"text\", but --json-keys asks for {}; \
                 pass JSON-lines inputs or drop --json-keys",
                path.display(),
                keys.join(",")
            )));
        }
        bytes_total += fs::metadata(path).map_err(|e| Error::io(path, "read metadata of", e))?.len();
        inputs.push((path, json));
    }

    let dtype = dtype_for_vocab(args.tokenizer.vocab_size());
    let writers = keys
        .iter()
        .map(|key| IndexedDatasetWriter::create(Path::new(&document_prefix(&args.output_prefix, key)), dtype))
        .collect::<Result<Vec<_>>>()?;
    let mut sink = Sink {
        writers,
        append_eod: args.append_eod,
        tokenizer: &args.tokenizer,
        caches: (0..args.workers.max(1)).map(|_| PieceCache::default()).collect(),
        batch: Vec::new(),
        batch_bytes: 0,
        documents: 0,
        tokens_written: 0,
        bytes_done: 0,
        bytes_total,
        next_clock_check: CLOCK_CHECK_BYTES,
        start,
        last_report: start,
        report: progress,
    };

    for (path, json) in inputs {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        if json {
            read_json_lines(path, &mut reader, &keys, &mut sink)?;
        } else {
            read_text(path, &mut reader, args.text_documents, &mut sink)?;
        }
    }

    sink.flush()?;
    let mut outputs = Vec::with_capacity(2 * keys.len());
    for writer in std::mem::take(&mut sink.writers) {
        let written = writer.finish()?;
        outputs.extend([written.bin_path, written.idx_path]);
    }
    Ok(PrepareSummary {
        documents: sink.documents,
        tokens: sink.tokens_written,
        input_bytes: sink.bytes_done,
        seconds: start.elapsed().as_secs_f64(),
        outputs,
    })
}

/// Reads one line, ending `\n` included; an empty buffer means the end of the file.
fn read_line(path: &Path, reader: &mut impl BufRead, line: &mut Vec<u8>) -> Result<usize> {
    line.clear();
    reader.read_until(b'\n', line).map_err(|e| Error::io(path, "read", e))
}

/// One document per non-blank line, holding the string values of `keys`. Blank lines are
/// skipped, since they are a common artefact at the end of JSON-lines files.
fn read_json_lines(path: &Path, reader: &mut impl BufRead, keys: &[String], sink: &mut Sink) -> Result<()> {
    let mut line = Vec::new();
    let mut line_number = 0;
    while read_line(path, reader, &mut line)? > 0 {
        line_number += 1;
        if !is_blank(&line) {
            let values = json::string_values(&line, keys).map_err(|e| e.at_line(path, line_number))?;
            sink.document(&values, &|| format!("{}: line {line_number}", path.display()))?;
        }
        sink.consumed(line.len());
    }
    Ok(())
}

fn read_text(path: &Path, reader: &mut impl BufRead, split: TextDocuments, sink: &mut Sink) -> Result<()> {
    let mut line = Vec::new();
    let mut line_number = 0;
    match split {
        TextDocuments::File => {
            reader.read_to_end(&mut line).map_err(|e| Error::io(path, "read", e))?;
            sink.document(&[&line], &|| path.display().to_string())?;
            sink.consumed(line.len());
        }
        TextDocuments::Line => {
            while read_line(path, reader, &mut line)? > 0 {
                line_number += 1;
                let text = line.strip_suffix(b"\n").unwrap_or(&line);
                let text = text.strip_suffix(b"\r").unwrap_or(text);
                if !is_blank(text) {
                    sink.document(&[text], &|| format!("{}: line {line_number}", path.display()))?;
                }
                sink.consumed(line.len());
            }
        }
        TextDocuments::Paragraph => {
            let mut paragraph = Vec::new();
            // The line the paragraph starts on, for errors.
            let mut first = 0;
            let place = |first: usize| move || format!("{}: the paragraph from line {first}", path.display());
            while read_line(path, reader, &mut line)? > 0 {
                line_number += 1;
                if !is_blank(&line) {
                    if paragraph.is_empty() {
                        first = line_number;
                    }
                    paragraph.extend_from_slice(&line);
                } else if !paragraph.is_empty() {
                    sink.document(&[&paragraph], &place(first))?;
                    paragraph.clear();
                }
                sink.consumed(line.len());
            }
            if !paragraph.is_empty() {
                sink.document(&[&paragraph], &place(first))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::indexed::IndexedDataset;

    /// Runs `prepare` on one input file with the given contents and returns the decoded
    /// documents of each output, in key order.
    fn documents_of(
        name: &str,
        contents: &[u8],
        keys: &[&str],
        split: TextDocuments,
        eod: bool,
    ) -> Result<Vec<Vec<String>>> {
        let dir = crate::data::test_dir("prepare");
        let input = dir.join(name);
        fs::write(&input, contents).unwrap();
        let args = PrepareArgs {
            inputs: vec![input],
            output_prefix: dir.join("out").display().to_string(),
            json_keys: keys.iter().map(|k| k.to_string()).collect(),
            append_eod: eod,
            text_documents: split,
            force_json: None,
            tokenizer: std::sync::Arc::new(Tokenizer::Byte),
            workers: 2,
        };
        let summary = prepare(&args, &mut |_| {})?;
        let keys = if keys.is_empty() { vec!["text"] } else { keys.to_vec() };
        Ok(keys
            .iter()
            .map(|key| {
                let data = IndexedDataset::open(&dir.join(format!("out_{key}_document"))).unwrap();
                assert_eq!(data.num_documents() as u64, summary.documents);
                let indices = data.document_indices();
                indices
                    .windows(2)
                    .map(|pair| {
                        let mut text = Vec::new();
                        for seq in pair[0] as usize..pair[1] as usize {
                            let mut tokens = vec![0; data.sequence_length(seq)];
                            data.read(seq, 0, &mut tokens).unwrap();
                            for token in tokens {
                                match u8::try_from(token) {
                                    Ok(byte) => text.push(byte),
                                    Err(_) => text.extend_from_slice(b"<EOD>"),
                                }
                            }
                        }
                        String::from_utf8(text).unwrap()
                    })
                    .collect()
            })
            .collect())
    }

    #[test]
    fn paragraphs_split_on_blank_lines_and_keep_their_newlines() {
        let text = b"\n\nfirst line\nsecond line\n\n \t\n\nthird\r\n\r\nlast without newline";
        let docs = documents_of("in.txt", text, &[], TextDocuments::Paragraph, false).unwrap();
        assert_eq!(docs, [["first line\nsecond line\n", "third\r\n", "last without newline"]]);
    }

    #[test]
    fn lines_and_whole_files() {
        let docs = documents_of("in.txt", b"a\r\n\nb\n  \nc", &[], TextDocuments::Line, true).unwrap();
        assert_eq!(docs, [["a<EOD>", "b<EOD>", "c<EOD>"]]);
        let docs = documents_of("in.txt", b"a\n\nb\n", &[], TextDocuments::File, true).unwrap();
        assert_eq!(docs, [["a\n\nb\n<EOD>"]]);
        // An empty file is one empty document, which gets no EOD.
        let docs = documents_of("in.txt", b"", &[], TextDocuments::File, true).unwrap();
        assert_eq!(docs, [[""]]);
    }

    #[test]
    fn json_lines_fill_one_dataset_per_key() {
        let jsonl = b"{\"text\": \"x\\ny\", \"title\": \"T1\"}\n\n{\"title\": \"\", \"text\": \"\\u00e9\"}\n";
        let docs = documents_of("in.jsonl", jsonl, &["text", "title"], TextDocuments::Paragraph, true).unwrap();
        assert_eq!(docs, [vec!["x\ny<EOD>", "é<EOD>"], vec!["T1<EOD>", ""]]);
    }

    #[test]
    fn bad_inputs_fail_before_or_without_leaving_outputs() {
        let err = documents_of("in.jsonl", b"{\"text\": \"a\"}\n{\"text\": 3}\n", &[], TextDocuments::Paragraph, false);
        let err = err.unwrap_err().to_string();
        assert!(err.contains("in.jsonl: line 2, column 10: key \"text\" holds a number"), "{err}");
        let err = documents_of("in.jsonl.gz", b"", &[], TextDocuments::Paragraph, false).unwrap_err().to_string();
        assert!(err.contains("compressed input") && err.contains("in.jsonl.gz"), "{err}");
        let err = documents_of("in.txt", b"a", &["body"], TextDocuments::Paragraph, false).unwrap_err().to_string();
        assert!(err.contains("can only fill key \"text\""), "{err}");
        let err = documents_of("in.json", b"{}", &["a", "a"], TextDocuments::Paragraph, false).unwrap_err().to_string();
        assert!(err.contains("--json-keys") && err.contains("given twice"), "{err}");
    }
}
