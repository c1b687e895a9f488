//! Crafted model files end in one clear error: trident checkpoints, Hugging Face directories,
//! safetensors, tokenizer.json, vocab.json / merges.txt, `.bin/.idx` and JSON lines, each
//! crafted the way a hostile file would be (a path out of its directory, a value that adds a
//! metadata key, a count that sizes gigabytes, a size that overflows or is zero). Every run must
//! exit 1 with one line naming the file, never panic, hang or be killed, stay under
//! `peak_bound_kib` of its input, and neither read nor write a file outside the directories named.

mod common;
#[path = "common/untrusted.rs"]
mod untrusted;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use untrusted::*;

/// Valid fixtures to copy and craft from: a GPT-2 checkpoint, and Hugging Face exports of it and
/// of a Llama.
struct Base {
    gpt2: PathBuf,
    gpt2_hf: PathBuf,
    llama_hf: PathBuf,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = scratch("untrusted-base");
        let (gpt2, llama) = (gpt2_checkpoint(&dir, "gpt2"), llama_checkpoint(&dir, "llama"));
        let (gpt2_hf, llama_hf) = (hf_dir(&gpt2, &dir, "gpt2-hf"), hf_dir(&llama, &dir, "llama-hf"));
        Base { gpt2, gpt2_hf, llama_hf }
    })
}

/// A copy of the fixture `from` at `dir/name`.
fn copy_of(from: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    copy_tree(from, &to);
    to
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Replaces `from` with `to` in the text file `path` (which must hold it).
fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_checkpoints_tokenizer_flags_cannot_name_files_elsewhere() {
    let dir = scratch("untrusted-tokenizer-flags");
    // A valid vocabulary outside the checkpoint, marked so that a copy of it is found.
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let marker = "SECRET-OUTSIDE-MARKER";
    let (vocab, _) = gpt2_files(&outside, &[(marker, 259)]);
    let relative = "../../outside/vocab.json";
    let cases = [s(&vocab), relative, "vocab.json"].into_iter().enumerate().map(|(i, value)| {
        let (dir, vocab) = (&dir, &vocab);
        case(format!("--vocab-file {value}"), move || {
            let ck = copy_of(&base().gpt2, dir, &format!("ck{i}"));
            let tok = ck.join("tokenizer");
            std::fs::create_dir_all(&tok).unwrap();
            gpt2_files(&tok, &[]);
            std::fs::remove_file(tok.join("vocab.json")).unwrap();
            if value == "vocab.json" {
                std::os::unix::fs::symlink(vocab, tok.join("vocab.json")).unwrap();
            }
            let flags =
                format!("--tokenizer-type\tGPT2BPETokenizer\n--vocab-file\t{value}\n--merge-file\tmerges.txt\n");
            std::fs::write(tok.join("flags"), flags).unwrap();
            let out = dir.join(format!("out{i}"));
            let m = run_measured(&["convert", "--load", s(&ck), "--save", s(&out)]);
            assert_not_copied(&out, marker.as_bytes());
            assert_refused(&m, bytes_under(&ck), &["tokenizer/flags", &format!("'{value}'")]);
            let m = run_measured(&["generate", "--load", s(&ck), "--max-new-tokens", "1"]);
            assert_refused(&m, bytes_under(&ck), &["tokenizer/flags", &format!("'{value}'")]);
        })
    });
    all_cases(cases.collect());
}

#[test]
fn a_config_value_cannot_add_checkpoint_metadata() {
    let dir = scratch("untrusted-metadata");
    let hf = copy_of(&base().gpt2_hf, &dir, "hf");
    let config = hf.join("config.json");
    edit(
        &config,
        "\"trident_tokenizer\": \"ByteTokenizer\"",
        "\"trident_tokenizer\": \"ByteTokenizer\\nnum_layers=2\\nseed=999\"",
    );
    let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("out"))]);
    assert_refused(&m, bytes_under(&hf), &[s(&config), "trident_tokenizer"]);
    // A directory named with a line break and a key is recorded whole, as the path it is.
    let odd = copy_of(&base().gpt2_hf, &dir, "hf\nhidden_size=8");
    let out = dir.join("out-odd");
    let o = run(&["convert", "--load-hf", s(&odd), "--save", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let shard = read_shard(&out);
    assert_eq!(shard.meta["hidden_size"], "16", "a value added a key");
    assert_eq!(shard.meta["imported_from"], s(&odd));
}

/// A metadata key set to a value, or removed (None).
type Change<'a> = (&'a str, Option<&'a str>);

/// The metadata of the GPT-2 fixture's shard with `changes`, over its tensors (or none).
fn crafted_shard(dir: &Path, name: &str, changes: &[Change], keep_tensors: bool) -> PathBuf {
    let ck = copy_of(&base().gpt2, dir, name);
    let shard = read_shard(&ck);
    let tensors = if keep_tensors { shard.tensors.clone() } else { Vec::new() };
    write_shard_file(&ck, &shard_v1_bytes(&header_with(&shard, changes), &tensors));
    ck
}

#[test]
fn a_shard_cannot_describe_a_model_it_does_not_hold() {
    let dir = scratch("untrusted-no-tensors");
    // About 800 bytes that describe 200 million parameters.
    let big = [
        ("hidden_size", Some("4096")),
        ("ffn_hidden_size", Some("16384")),
        ("num_attention_heads", Some("32")),
        ("max_position_embeddings", Some("16")),
    ];
    let ck = crafted_shard(&dir, "ck", &big, false);
    let m = run_measured(&["convert", "--load", s(&ck), "--save", s(&dir.join("out"))]);
    assert_refused(&m, bytes_under(&ck), &["iter_0000001", "hold"]);
    let m = run_measured(&["generate", "--load", s(&ck), "--max-new-tokens", "1"]);
    assert_refused(&m, bytes_under(&ck), &["model_optim_rng.bin", "holds"]);
}

/// `--use-checkpoint-args` builds the model from a shard's head before any shard is read whole and
/// checked: a model larger than the checkpoint's files, or a header longer than its file, is one
/// clear error within the memory bound.
#[test]
fn checkpoint_args_come_from_a_head_that_cannot_size_the_model() {
    let dir = scratch("untrusted-checkpoint-args");
    let big = [
        ("hidden_size", Some("4096")),
        ("ffn_hidden_size", Some("16384")),
        ("num_attention_heads", Some("32")),
        ("max_position_embeddings", Some("16")),
    ];
    let train = |ck: &Path| {
        run_measured(&["train", "--use-checkpoint-args", "--load", s(ck), "--mock-data", "--train-iters", "1"])
    };
    let ck = crafted_shard(&dir, "big", &big, false);
    assert_refused(&train(&ck), bytes_under(&ck), &["iter_0000001", "the metadata describes", "hold"]);
    let long = copy_of(&base().gpt2, &dir, "long");
    let mut bytes = std::fs::read(shard_file(&long)).unwrap();
    bytes[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    write_shard_file(&long, &bytes);
    assert_refused(&train(&long), bytes_under(&long), &["model_optim_rng.bin", "a header of"]);
}

#[test]
fn zero_and_impossible_sizes_in_a_shard_are_errors() {
    let dir = scratch("untrusted-sizes");
    let cases: [(&[Change], &str); 5] = [
        (&[("vocab_size", Some("0"))], "vocabulary is empty"),
        (&[("num_attention_heads", Some("0"))], "--num-attention-heads must be at least 1"),
        (&[("tensor_model_parallel_size", Some("3"))], "not divisible by --tensor-model-parallel-size 3"),
        (&[("num_layers", Some("0"))], "--num-layers must be at least 1"),
        (&[("kv_channels", Some("9223372036854775808"))], "overflow"),
    ];
    let cases = cases.into_iter().enumerate().map(|(i, (changes, needle))| {
        let dir = &dir;
        case(format!("{changes:?}"), move || {
            let ck = crafted_shard(dir, &format!("ck{i}"), changes, true);
            let m = run_measured(&["convert", "--load", s(&ck), "--save", s(&dir.join(format!("out{i}")))]);
            assert_refused(&m, bytes_under(&ck), &["model_optim_rng.bin", needle]);
            let m = run_measured(&["generate", "--load", s(&ck), "--max-new-tokens", "1"]);
            assert_refused(&m, bytes_under(&ck), &["model_optim_rng.bin"]);
        })
    });
    all_cases(cases.collect());
}

#[test]
fn unknown_and_repeated_metadata_keys_are_refused() {
    let dir = scratch("untrusted-keys");
    let cases = [("weird=1\n", "unknown metadata key \"weird\""), ("seed=2\n", "'seed' appears twice")];
    let cases = cases.into_iter().enumerate().map(|(i, (extra, needle))| {
        let dir = &dir;
        case(extra.trim(), move || {
            let ck = copy_of(&base().gpt2, dir, &format!("ck{i}"));
            let shard = read_shard(&ck);
            write_shard_file(&ck, &shard_v1_bytes(&(header_with(&shard, &[]) + extra), &shard.tensors));
            let m = run_measured(&["convert", "--load", s(&ck), "--save", s(&dir.join(format!("out{i}")))]);
            assert_refused(&m, bytes_under(&ck), &["model_optim_rng.bin", needle]);
        })
    });
    all_cases(cases.collect());
}

#[test]
fn a_rotary_model_with_a_vast_position_table_generates_in_bounded_memory() {
    let dir = scratch("untrusted-positions");
    let hf = copy_of(&base().llama_hf, &dir, "hf");
    edit(&hf.join("config.json"), "\"max_position_embeddings\": 128", "\"max_position_embeddings\": 100000000000");
    let ck = dir.join("ck");
    let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&ck)]);
    assert!(m.out.status.success(), "{}", stderr(&m.out));
    assert_bounded(&m, bytes_under(&hf));
    let m = run_measured(&["generate", "--load", s(&ck), "--prompt", "ab", "--max-new-tokens", "3"]);
    assert!(m.out.status.success(), "{}", stderr(&m.out));
    assert_bounded(&m, bytes_under(&ck));
}

#[test]
fn hugging_face_vocabulary_and_padding_values_are_checked() {
    let dir = scratch("untrusted-hf-vocab");
    let cases = [
        ("\"trident_unpadded_vocab_size\": 257", "\"trident_unpadded_vocab_size\": 0", "vocabulary is empty"),
        (
            "\"trident_make_vocab_size_divisible_by\": 128",
            "\"trident_make_vocab_size_divisible_by\": 10000000",
            "--make-vocab-size-divisible-by 10000000",
        ),
        (
            "\"trident_make_vocab_size_divisible_by\": 128",
            "\"trident_make_vocab_size_divisible_by\": 9223372036854775808",
            "trident_make_vocab_size_divisible_by",
        ),
    ];
    let mut cases: Vec<_> = cases
        .into_iter()
        .enumerate()
        .map(|(i, (from, to, needle))| {
            let dir = &dir;
            case(to, move || {
                let hf = copy_of(&base().gpt2_hf, dir, &format!("hf{i}"));
                let config = hf.join("config.json");
                edit(&config, from, to);
                let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join(format!("out{i}")))]);
                assert_refused(&m, bytes_under(&hf), &[&format!("{}: ", s(&config)), needle]);
            })
        })
        .collect();
    // A vocabulary of 2^62 rows, an embedding of that shape with no data: no element count of it
    // is ever computed.
    cases.push(case("vocab_size 2^62", || {
        let hf = copy_of(&base().gpt2_hf, &dir, "hf-rows");
        let config = hf.join("config.json");
        edit(&config, "\"vocab_size\": 384", "\"vocab_size\": 4611686018427387904");
        let (mut entries, data) = f32_entries(&hf.join("model.safetensors"), 0);
        let wte = entries.iter_mut().find(|e| e.0 == "wte.weight").unwrap();
        (wte.2, wte.3, wte.4) = (vec![1 << 62, 16], 0, 0);
        write_raw_safetensors(&hf.join("model.safetensors"), &entries, &data);
        let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("out-rows"))]);
        assert_refused(&m, bytes_under(&hf), &[&format!("{}: ", s(&config)), "vocab_size"]);
    }));
    all_cases(cases);
}

#[test]
fn llama_head_dimensions_that_overflow_are_refused() {
    let dir = scratch("untrusted-head-dim");
    // The fixture has 2 heads, so 2^63 wraps to 0 in unchecked arithmetic: q, k and v of no rows.
    let cases = ["9223372036854775808", "4503599627370496"].into_iter().enumerate().map(|(i, value)| {
        let dir = &dir;
        case(format!("head_dim {value}"), move || {
            let hf = copy_of(&base().llama_hf, dir, &format!("hf{i}"));
            let config = hf.join("config.json");
            edit(&config, "\"head_dim\": 8", &format!("\"head_dim\": {value}"));
            let (mut entries, data) = f32_entries(&hf.join("model.safetensors"), 0);
            for e in entries.iter_mut() {
                if e.0.contains("q_proj") || e.0.contains("k_proj") || e.0.contains("v_proj") {
                    (e.2, e.4) = (vec![0, 16], e.3);
                } else if e.0.contains("o_proj") {
                    (e.2, e.4) = (vec![16, 0], e.3);
                }
            }
            write_raw_safetensors(&hf.join("model.safetensors"), &entries, &data);
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join(format!("out{i}")))]);
            assert_refused(&m, bytes_under(&hf), &[&format!("{}: ", s(&config))]);
        })
    });
    all_cases(cases.collect());
}

#[test]
fn a_weight_map_names_files_inside_its_directory_only() {
    let dir = scratch("untrusted-weight-map");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let outside = elsewhere.join("model-00001-of-00001.safetensors");
    std::fs::copy(base().gpt2_hf.join("model.safetensors"), &outside).unwrap();
    let values =
        [s(&outside), "../elsewhere/model-00001-of-00001.safetensors", "/dev/zero", "linked.safetensors", "fifo"];
    let cases = values.into_iter().enumerate().map(|(i, value)| {
        let (dir, outside) = (&dir, &outside);
        case(value, move || {
            let hf = copy_of(&base().gpt2_hf, dir, &format!("hf{i}"));
            std::fs::remove_file(hf.join("model.safetensors")).unwrap();
            std::os::unix::fs::symlink(outside, hf.join("linked.safetensors")).unwrap();
            let fifo = std::ffi::CString::new(s(&hf.join("fifo"))).unwrap();
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
            let index = hf.join("model.safetensors.index.json");
            let map = format!("{{\"metadata\": {{}}, \"weight_map\": {{\"wte.weight\": {}}}}}", json_string(value));
            std::fs::write(&index, map).unwrap();
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join(format!("out{i}")))]);
            assert_refused(&m, bytes_under(&hf), &["model.safetensors.index.json", &format!("'{value}'")]);
        })
    });
    all_cases(cases.collect());
}

#[test]
fn safetensors_entries_cover_their_own_aligned_bytes() {
    let dir = scratch("untrusted-safetensors");
    let dir = &dir;
    all_cases(vec![
        // 200 entries over one 512 KiB region: 200 MiB of values from a file of half a MiB.
        case("overlapping", || {
            let hf = copy_of(&base().gpt2_hf, dir, "hf-overlap");
            let region = 512 * 1024;
            let entries: Vec<RawEntry> =
                (0..200).map(|i| (format!("t{i:03}"), "BF16", vec![region / 2], 0, region)).collect();
            write_raw_safetensors(&hf.join("model.safetensors"), &entries, &vec![0x3f; region as usize]);
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("out-overlap"))]);
            assert_refused(&m, bytes_under(&hf), &["model.safetensors", "overlap"]);
        }),
        // The fixture's tensors shifted by two bytes: every F32 tensor misaligned.
        case("misaligned", || {
            let hf = copy_of(&base().gpt2_hf, dir, "hf-misaligned");
            let (entries, data) = f32_entries(&hf.join("model.safetensors"), 2);
            write_raw_safetensors(&hf.join("model.safetensors"), &entries, &data);
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("out-misaligned"))]);
            assert_refused(&m, bytes_under(&hf), &["model.safetensors", "not aligned"]);
        }),
        // A tensor of 2^50 x 2^20 elements with no data: its element count overflows.
        case("overflowing", || {
            let hf = copy_of(&base().gpt2_hf, dir, "hf-overflow");
            let (mut entries, data) = f32_entries(&hf.join("model.safetensors"), 0);
            entries.push(("h.9.extra".into(), "F32", vec![1 << 50, 1 << 20], 0, 0));
            write_raw_safetensors(&hf.join("model.safetensors"), &entries, &data);
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("out-overflow"))]);
            assert_refused(&m, bytes_under(&hf), &["model.safetensors", "h.9.extra", "does not fill"]);
        }),
    ]);
}

/// A short text for `prepare` to tokenize.
fn text_file(dir: &Path) -> PathBuf {
    let path = dir.join("text.txt");
    std::fs::write(&path, "the theme of the thing\n\nA <|x|> then more.\n").unwrap();
    path
}

fn prepare_gpt2(dir: &Path, vocab: &Path, merges: &Path) -> Measured {
    let tokenizer = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", s(vocab), "--merge-file", s(merges)];
    run_measured(&prepare_args(&text_file(dir), &dir.join("out"), &tokenizer))
}

fn prepare_hf(dir: &Path, tokenizer: &Path) -> Measured {
    let flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", s(tokenizer)];
    run_measured(&prepare_args(&text_file(dir), &dir.join("out"), &flags))
}

#[test]
fn vocabulary_ids_cannot_size_gigabytes() {
    let dir = scratch("untrusted-vocab-ids");
    let dir = &dir;
    all_cases(vec![
        case("vocab.json", || {
            let sub = dir.join("gpt2");
            std::fs::create_dir_all(&sub).unwrap();
            let (vocab, merges) = gpt2_files(&sub, &[("huge", 4294967294)]);
            let m = prepare_gpt2(&sub, &vocab, &merges);
            assert_refused(&m, bytes_under(&vocab), &["vocab.json", "4294967294"]);
        }),
        // The same files beside Hugging Face weights: the import stops on them.
        case("vocab.json beside weights", || {
            let hf = copy_of(&base().gpt2_hf, dir, "hf");
            let config = hf.join("config.json");
            edit(&config, "\"trident_tokenizer\": \"ByteTokenizer\"", "\"trident_tokenizer\": \"GPT2BPETokenizer\"");
            gpt2_files(&hf, &[("huge", 4294967294)]);
            let m = run_measured(&["convert", "--load-hf", s(&hf), "--save", s(&dir.join("ck"))]);
            assert_refused(&m, bytes_under(&hf), &["vocab.json", "4294967294"]);
        }),
        // A tokenizer.json whose model vocabulary holds the id.
        case("tokenizer.json", || {
            let sub = dir.join("json");
            std::fs::create_dir_all(&sub).unwrap();
            let tokenizer = tokenizer_json(&sub, None);
            edit(&tokenizer, "\"the\": 258", "\"the\": 4294967294");
            let m = prepare_hf(&sub, &tokenizer);
            assert_refused(&m, bytes_under(&tokenizer), &["tokenizer.json", "4294967294"]);
        }),
    ]);
}

#[test]
fn added_token_ids_are_checked_not_truncated() {
    let dir = scratch("untrusted-added-ids");
    let added = |id: u64| {
        format!(
            "{{\"id\": 256, \"content\": \"<|endoftext|>\", \"special\": true}}, {{\"id\": {id}, \"content\": \"<|x|>\", \
             \"special\": true}}"
        )
    };
    let cases = [4294967294u64, (1 << 32) + 65].into_iter().enumerate().map(|(i, id)| {
        let (dir, added) = (&dir, &added);
        case(format!("added id {id}"), move || {
            let sub = dir.join(format!("t{i}"));
            std::fs::create_dir_all(&sub).unwrap();
            let tokenizer = tokenizer_json(&sub, Some(&added(id)));
            let m = prepare_hf(&sub, &tokenizer);
            assert_refused(&m, bytes_under(&tokenizer), &["tokenizer.json", &id.to_string()]);
        })
    });
    all_cases(cases.collect());
    // In range, the added token is split out of the text with its own id.
    let sub = dir.join("fine");
    std::fs::create_dir_all(&sub).unwrap();
    let tokenizer = tokenizer_json(&sub, Some(&added(259)));
    let m = prepare_hf(&sub, &tokenizer);
    assert!(m.out.status.success(), "{}", stderr(&m.out));
    let data = trident::data::indexed::IndexedDataset::open(&sub.join("out_text_document")).unwrap();
    let mut ids = Vec::new();
    for seq in 0..data.num_sequences() {
        let mut part = vec![0u32; data.sequence_length(seq)];
        data.read(seq, 0, &mut part).unwrap();
        ids.extend(part);
    }
    assert!(ids.contains(&259), "{ids:?}");
}

#[test]
fn dataset_and_json_lines_readers_refuse_crafted_counts_and_nesting() {
    let dir = scratch("untrusted-datasets");
    let prefix = dir.join("d_text_document");
    write_u16_dataset(&prefix, &vec![(1..19).collect::<Vec<u16>>(); 4]);
    // The sequence count says 2^61 in a file of a few hundred bytes.
    let idx = prefix.with_extension("idx");
    let mut bytes = std::fs::read(&idx).unwrap();
    bytes[18..26].copy_from_slice(&(1u64 << 61).to_le_bytes());
    std::fs::write(&idx, &bytes).unwrap();
    let batch = ["--global-batch-size", "1", "--train-iters", "2", "--eval-iters", "0"];
    let m = run_measured(&check_data_args(&prefix, &batch));
    assert_refused(&m, bytes_under(&dir), &[".idx"]);
    // A JSON line nested a hundred thousand deep.
    let jsonl = dir.join("deep.jsonl");
    std::fs::write(&jsonl, format!("{{\"text\": \"a\", \"x\": {}}}\n", "[".repeat(100_000))).unwrap();
    let m = run_measured(&["prepare", "--input", s(&jsonl), "--output-prefix", s(&dir.join("j"))]);
    assert_refused(&m, bytes_under(&jsonl), &["deep.jsonl", "nesting"]);
}

#[test]
fn readers_of_real_sized_files_stay_within_the_stated_bound() {
    // About 3.3 million parameters: a 40 MB checkpoint, a 13 MB safetensors file.
    let dir = scratch("untrusted-bound");
    let ck = dir.join("ck");
    train_mock(&ck, &["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4"], &[]);
    let full = trident::checkpoint::convert::read_full(&ck).unwrap();
    let parameters = full.model.parameter_count().unwrap() as u64;
    let (hf, tp2, back) = (dir.join("hf"), dir.join("tp2"), dir.join("back"));
    let runs: [(&[&str], &Path); 4] = [
        (&["convert", "--load", s(&ck), "--save", s(&tp2), "--target-tensor-parallel-size", "2"], &ck),
        (&["convert", "--load", s(&ck), "--save-hf", s(&hf)], &ck),
        (&["convert", "--load-hf", s(&hf), "--save", s(&back)], &hf),
        (&["generate", "--load", s(&ck), "--max-new-tokens", "4", "--prompt", "ab"], &ck),
    ];
    for (args, input) in runs {
        let m = run_measured(args);
        assert!(m.out.status.success(), "{args:?}: {}", stderr(&m.out));
        let bound = model_bound_kib(bytes_under(input), parameters);
        let shown: Vec<&str> = args.iter().copied().filter(|a| !a.contains('/')).collect();
        println!("{}: peak {} KiB, bound {bound} KiB", shown.join(" "), m.peak_kib);
        assert!(m.peak_kib <= bound, "{args:?}: peak {} KiB above {bound} KiB", m.peak_kib);
    }
    // A tokenizer.json of 100,000 merges (about 3 MB).
    let tokenizer = large_tokenizer_json(&dir, 100_000);
    let m = prepare_hf(&dir, &tokenizer);
    assert!(m.out.status.success(), "{}", stderr(&m.out));
    let bound = tokenizer_bound_kib(bytes_under(&tokenizer));
    println!(
        "prepare with {} bytes of tokenizer.json: peak {} KiB, bound {bound} KiB",
        bytes_under(&tokenizer),
        m.peak_kib
    );
    assert!(m.peak_kib <= bound, "prepare: peak {} KiB above {bound} KiB", m.peak_kib);
}
