//! Data formats at the crate boundary: hand-built Megatron `.bin/.idx` files, writer/reader
//! round trips, every malformed-file error, `prepare` outputs, and vocabulary checks on samples.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trident::data::gpt_dataset::GptDataset;
use trident::data::indexed::{IndexedDataset, IndexedDatasetWriter, TokenDtype};
use trident::data::prepare::{prepare, PrepareArgs, TextDocuments};
use trident::data::source::Source;
use trident::data::tokenizer::ByteTokenizer;

/// A fresh directory under the system temp dir, unique per process and test.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trident-data-formats-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// An `.idx` file built field by field from the documented layout, like Python's struct.pack.
fn idx_bytes(dtype_code: u8, lengths: &[i32], pointers: &[i64], document_indices: &[i64]) -> Vec<u8> {
    let mut bytes = b"MMIDIDX\x00\x00".to_vec();
    bytes.extend(1u64.to_le_bytes());
    bytes.push(dtype_code);
    bytes.extend((lengths.len() as u64).to_le_bytes());
    bytes.extend((document_indices.len() as u64).to_le_bytes());
    lengths.iter().for_each(|v| bytes.extend(v.to_le_bytes()));
    pointers.iter().for_each(|v| bytes.extend(v.to_le_bytes()));
    document_indices.iter().for_each(|v| bytes.extend(v.to_le_bytes()));
    bytes
}

/// Three documents of 2, 1 and 1 sequences, as `--split-sentences` would write them.
const TOKENS: [&[u32]; 4] = [&[10, 11, 12], &[13, 14], &[40_000, 0, 65_535, 7], &[9]];
const DOCUMENT_INDICES: [i64; 4] = [0, 2, 3, 4];

/// Writes `TOKENS` by hand in the given dtype and returns the prefix.
fn hand_written(dir: &Path, dtype: TokenDtype) -> PathBuf {
    let itemsize = dtype.itemsize() as i64;
    let lengths: Vec<i32> = TOKENS.iter().map(|t| t.len() as i32).collect();
    let pointers: Vec<i64> = lengths
        .iter()
        .scan(0, |at, &len| {
            let start = *at;
            *at += len as i64 * itemsize;
            Some(start)
        })
        .collect();
    let mut bin = Vec::new();
    for &token in TOKENS.iter().flat_map(|t| t.iter()) {
        match dtype {
            TokenDtype::U16 => bin.extend((token as u16).to_le_bytes()),
            TokenDtype::I32 => bin.extend((token as i32).to_le_bytes()),
            other => panic!("no hand writer for {other:?}"),
        }
    }
    let prefix = dir.join(format!("hand_{}", dtype.name()));
    fs::write(prefix.with_extension("bin"), bin).unwrap();
    fs::write(prefix.with_extension("idx"), idx_bytes(dtype.code(), &lengths, &pointers, &DOCUMENT_INDICES)).unwrap();
    prefix
}

fn read_all(data: &IndexedDataset) -> Vec<Vec<u32>> {
    (0..data.num_sequences())
        .map(|seq| {
            let mut tokens = vec![0; data.sequence_length(seq)];
            data.read(seq, 0, &mut tokens).unwrap();
            tokens
        })
        .collect()
}

#[test]
fn hand_written_pairs_read_correctly() {
    let dir = temp_dir("hand");
    for dtype in [TokenDtype::U16, TokenDtype::I32] {
        let data = IndexedDataset::open(&hand_written(&dir, dtype)).unwrap();
        assert_eq!(data.dtype(), dtype);
        assert_eq!((data.num_sequences(), data.num_documents(), data.num_tokens()), (4, 3, 10));
        assert_eq!(data.document_indices(), DOCUMENT_INDICES);
        assert_eq!(data.document_sequences(0..1).unwrap(), 0..2);
        assert_eq!(data.document_sequences(1..3).unwrap(), 2..4);
        assert_eq!(read_all(&data), TOKENS.map(|t| t.to_vec()));
        let mut middle = [0u32; 2];
        data.read(2, 1, &mut middle).unwrap();
        assert_eq!(middle, [0, 65_535]);
        let err = data.read(2, 3, &mut middle).unwrap_err().to_string();
        assert!(err.contains("tokens 3..5 of sequence 2") && err.contains("it has 4 tokens"), "{err}");
        assert!(data.read(4, 0, &mut []).unwrap_err().to_string().contains("sequence 4 requested"));
    }
}

#[test]
fn writer_output_reads_back() {
    let dir = temp_dir("roundtrip");
    let prefix = dir.join("rt");
    let documents: Vec<Vec<u32>> = vec![vec![1, 2, 3], vec![], vec![256; 1000], vec![65_535], vec![]];
    let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U16).unwrap();
    documents.iter().try_for_each(|d| writer.add_document(d)).unwrap();
    let summary = writer.finish().unwrap();
    assert_eq!((summary.documents, summary.sequences, summary.tokens), (5, 3, 1004));
    assert_eq!(summary.bin_path, dir.join("rt.bin"));

    let data = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(data.document_indices(), [0, 1, 1, 2, 3, 3]);
    let non_empty: Vec<Vec<u32>> = documents.into_iter().filter(|d| !d.is_empty()).collect();
    assert_eq!(read_all(&data), non_empty);
    // Only the final pair is left: the temporary files were renamed away.
    let mut names: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["rt.bin", "rt.idx"]);

    // An empty dataset has an empty .bin, which must not be memory-mapped.
    let empty = dir.join("empty");
    IndexedDatasetWriter::create(&empty, TokenDtype::I32).unwrap().finish().unwrap();
    assert_eq!(fs::metadata(dir.join("empty.bin")).unwrap().len(), 0);
    let data = IndexedDataset::open(&empty).unwrap();
    assert_eq!((data.num_sequences(), data.num_documents()), (0, 0));
}

#[test]
fn malformed_pairs_name_the_file_and_the_problem() {
    let dir = temp_dir("malformed");
    let good_bin = [10u16, 11, 12, 13, 14].iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
    let good_idx = idx_bytes(8, &[3, 2], &[0, 6], &[0, 1, 2]);

    // Each case: a file to damage, its new contents, and the phrases the error must contain.
    let mut bad_magic = good_idx.clone();
    bad_magic[..9].copy_from_slice(b"TNTIDX\x00\x00\x00");
    let mut bad_version = good_idx.clone();
    bad_version[9] = 2;
    let mut bad_dtype = good_idx.clone();
    bad_dtype[17] = 9;
    let mut float_dtype = good_idx.clone();
    float_dtype[17] = 7;
    let cases = vec![
        ("missing bin", "bin", None, vec!["x.bin: cannot open", "No such file"]),
        ("missing idx", "idx", None, vec!["x.idx: cannot open", "No such file"]),
        (
            "truncated bin",
            "bin",
            Some(good_bin[..9].to_vec()),
            vec!["x.bin: token file is 9 bytes", "need 10 bytes", "truncated .bin"],
        ),
        (
            "pointers past bin",
            "idx",
            Some(idx_bytes(8, &[3, 200], &[0, 6], &[0, 1, 2])),
            vec!["x.bin: token file is 10 bytes", "203 uint16 tokens that need 406 bytes"],
        ),
        (
            "short idx",
            "idx",
            Some(good_idx[..20].to_vec()),
            vec!["x.idx: index is 20 bytes, shorter than the 34-byte MMIDIDX header"],
        ),
        (
            "truncated idx",
            "idx",
            Some(good_idx[..good_idx.len() - 1].to_vec()),
            vec!["x.idx: truncated", "2 sequences and 3 document indices, which need 82 bytes, but the file has 81"],
        ),
        (
            "overlong idx",
            "idx",
            Some([good_idx.clone(), vec![0; 5]].concat()),
            vec!["x.idx: inconsistent length", "need 82 bytes (or 84 with sequence modes), but the file has 87"],
        ),
        (
            "wrong magic",
            "idx",
            Some(bad_magic),
            vec!["x.idx: wrong magic: found \"TNTIDX\\x00\\x00\\x00\", expected \"MMIDIDX\\0\\0\""],
        ),
        ("wrong version", "idx", Some(bad_version), vec!["x.idx: unsupported index version 2, expected 1"]),
        ("unknown dtype", "idx", Some(bad_dtype), vec!["x.idx: unknown token dtype code 9"]),
        ("float dtype", "idx", Some(float_dtype), vec!["x.idx: token dtype float32 (code 7) not supported"]),
        (
            "negative length",
            "idx",
            Some(idx_bytes(8, &[3, -2], &[0, 6], &[0, 1, 2])),
            vec!["x.idx: sequence 1 has negative length -2"],
        ),
        (
            "bad pointer",
            "idx",
            Some(idx_bytes(8, &[3, 2], &[0, 8], &[0, 1, 2])),
            vec!["x.idx: sequence 1 starts at byte 8 of the .bin, but the lengths before it put it at byte 6"],
        ),
        (
            "doc index start",
            "idx",
            Some(idx_bytes(8, &[3, 2], &[0, 6], &[1, 1, 2])),
            vec!["x.idx: the document index starts at 1, expected 0"],
        ),
        (
            "doc index order",
            "idx",
            Some(idx_bytes(8, &[3, 2], &[0, 6], &[0, 2, 1, 2])),
            vec!["x.idx: document index entry 2 is 1, smaller than the entry before it (2)"],
        ),
        (
            "doc index end",
            "idx",
            Some(idx_bytes(8, &[3, 2], &[0, 6], &[0, 1])),
            vec!["x.idx: the document index ends at 1, expected the sequence count 2"],
        ),
        (
            "empty doc index",
            "idx",
            Some(idx_bytes(8, &[3, 2], &[0, 6], &[])),
            vec!["x.idx: the document index is empty"],
        ),
    ];
    let prefix = dir.join("x");
    for (name, damaged, contents, phrases) in cases {
        fs::write(dir.join("x.bin"), &good_bin).unwrap();
        fs::write(dir.join("x.idx"), &good_idx).unwrap();
        assert!(IndexedDataset::open(&prefix).is_ok(), "{name}: the undamaged pair must open");
        let path = dir.join(format!("x.{damaged}"));
        match contents {
            Some(bytes) => fs::write(&path, bytes).unwrap(),
            None => fs::remove_file(&path).unwrap(),
        }
        let err = IndexedDataset::open(&prefix).err().unwrap_or_else(|| panic!("{name}: opened")).to_string();
        assert!(!err.contains('\n'), "{name}: error is not one line: {err}");
        for phrase in phrases {
            assert!(err.contains(phrase), "{name}: {err:?} lacks {phrase:?}");
        }
    }
}

fn prepare_one(dir: &Path, input: &str, contents: &[u8], append_eod: bool) -> trident::data::prepare::PrepareSummary {
    let path = dir.join(input);
    fs::write(&path, contents).unwrap();
    let args = PrepareArgs {
        inputs: vec![path],
        output_prefix: dir.join("P").display().to_string(),
        json_keys: Vec::new(),
        append_eod,
        text_documents: TextDocuments::Paragraph,
        force_json: None,
        tokenizer: std::sync::Arc::new(trident::data::tokenizer::Tokenizer::Byte),
        workers: 1,
    };
    let mut reports = 0;
    let summary = prepare(&args, &mut |_| reports += 1).unwrap();
    // Inputs this small finish long before the first progress report is due.
    assert_eq!(reports, 0);
    summary
}

#[test]
fn prepare_writes_megatron_named_documents() {
    let eod = ByteTokenizer::EOD;
    let dir = temp_dir("prepare-text");
    let summary = prepare_one(&dir, "in.txt", b"ab\ncd\n\n\nxyz\n", true);
    assert_eq!((summary.documents, summary.tokens, summary.input_bytes), (2, 12, 12));
    assert_eq!(summary.outputs, [dir.join("P_text_document.bin"), dir.join("P_text_document.idx")]);
    assert!(summary.to_string().starts_with("prepared 2 documents, 12 tokens from"), "{summary}");
    let data = IndexedDataset::open(&dir.join("P_text_document")).unwrap();
    assert_eq!(data.dtype(), TokenDtype::U16);
    assert_eq!(read_all(&data), [vec![97, 98, 10, 99, 100, 10, eod], vec![120, 121, 122, 10, eod]]);

    let dir = temp_dir("prepare-json");
    let jsonl = b"{\"text\": \"hi\", \"id\": 1}\n{\"text\": \"\"}\n{\"id\": [2], \"text\": \"\\u00e9\"}\n";
    let summary = prepare_one(&dir, "in.jsonl", jsonl, true);
    assert_eq!((summary.documents, summary.tokens), (3, 6));
    let data = IndexedDataset::open(&dir.join("P_text_document")).unwrap();
    // The empty document has no sequence and no EOD, only a repeated document index.
    assert_eq!(data.document_indices(), [0, 1, 1, 2]);
    assert_eq!(read_all(&data), [vec![104, 105, eod], vec![0xC3, 0xA9, eod]]);
}

#[test]
fn samples_with_ids_outside_the_vocabulary_are_errors() {
    let dir = temp_dir("vocab");
    let prefix = dir.join("v");
    let mut writer = IndexedDatasetWriter::create(&prefix, TokenDtype::U16).unwrap();
    writer.add_document(&[1, 2, 3, 4, 5, 6]).unwrap();
    writer.add_document(&[7, 8, 300, 9, 10, 11]).unwrap();
    writer.finish().unwrap();
    let data = Arc::new(Source::Indexed(IndexedDataset::open(&prefix).unwrap()));
    let ds = GptDataset::build(data.clone(), 0..2, 2, 4, 1234, "train", ByteTokenizer::VOCAB_SIZE).unwrap();
    let mut out = [0u32; 5];
    let errors: Vec<String> = (0..ds.len()).filter_map(|i| ds.get(i, &mut out).err()).map(|e| e.to_string()).collect();
    assert!(!errors.is_empty(), "no sample reached token 300");
    for err in errors {
        assert!(
            err.starts_with("bad training data: ")
                && err.contains("v.bin: sequence 1 holds token id 300 at offset 2, but the vocabulary has 257 ids"),
            "{err}"
        );
    }
    // The same data is fine with a vocabulary that covers it.
    let ds = GptDataset::build(data, 0..2, 2, 4, 1234, "train", 301).unwrap();
    (0..ds.len()).for_each(|i| ds.get(i, &mut out).unwrap());
}
