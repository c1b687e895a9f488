//! Llama-family models to and from Hugging Face's `LlamaForCausalLM` (`trident convert
//! --save-hf` / `--load-hf`). Always: trident -> Hugging Face -> trident is bit-exact (grouped-query
//! and multi-head, untied and tied, with and without biases; one file or shards), and what
//! `LlamaForCausalLM` cannot express fails with one clear error in both directions. Where transformers is installed (the
//! Python that `TORCH_PYTHON` names, else the torch venv `.ci/run` makes, else python3; the script
//! is tests/hf_llama_compare.py): Llamas trained here and exported load in transformers with
//! logits within 1e-4 of trident's (relative to each position's largest logit, f32) and the same
//! greedy continuation as `trident generate --temperature 0`; and random models made by
//! transformers (grouped-query and untied; tied with biases) import with the same logits and
//! greedy continuation here (trident's logits through the library: `read_full`, `Gpt` on the
//! `CpuDevice`, `forward`). Without transformers those two tests say loudly that they skip.

mod common;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use trident::checkpoint::convert::read_full;
use trident::checkpoint::hf_files::{read_safetensors, write_safetensors};

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    o
}

/// `llama-tiny` with `extra` flags on top, trained for 3 iterations on the bundled corpus and
/// saved to `dir/name`.
fn trained(dir: &Path, data: &str, name: &str, extra: &[&str]) -> String {
    trained_preset(dir, data, name, "llama-tiny", extra)
}

/// `preset` with `extra` flags on top, trained for 3 iterations and saved to `dir/name`.
fn trained_preset(dir: &Path, data: &str, name: &str, preset: &str, extra: &[&str]) -> String {
    trained_for(dir, data, name, preset, 3, extra)
}

fn trained_for(dir: &Path, data: &str, name: &str, preset: &str, iters: usize, extra: &[&str]) -> String {
    let save = dir.join(name).display().to_string();
    let iters = iters.to_string();
    let base = ["train", "--preset", preset, "--eval-iters", "0", "--data-path", data, "--train-iters", &iters];
    let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).chain(["--save", save.as_str()]).collect();
    ok(run(&args), &format!("training {name}"));
    save
}

/// Every parameter of checkpoints `a` and `b` bit for bit the same; returns how many.
fn assert_same_params(a: &str, b: &str) -> usize {
    let (a, b) = (read_full(Path::new(a)).unwrap(), read_full(Path::new(b)).unwrap());
    assert_eq!(a.model, b.model, "the model shape changed");
    let params = |t: &std::collections::BTreeMap<String, Vec<f32>>| {
        t.iter().filter(|(k, _)| k.starts_with("param/")).map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
    };
    let (pa, pb) = (params(&a.tensors), params(&b.tensors));
    assert_eq!(pa.iter().map(|p| &p.0).collect::<Vec<_>>(), pb.iter().map(|p| &p.0).collect::<Vec<_>>());
    for ((name, x), (_, y)) in pa.iter().zip(&pb) {
        assert!(x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} changed");
    }
    pa.len()
}

/// The Llamas trident exports: (name, preset, flags). llama-tiny (grouped-query attention,
/// untied, no biases), and tiny made a Llama: tied, with biases, multi-head, Llama 3.1 rope
/// scaling, a head dimension of its own and another norm epsilon.
const CASES: [(&str, &str, &[&str]); 2] = [
    ("gqa", "llama-tiny", &[]),
    (
        "tied",
        "tiny",
        &[
            "--normalization",
            "RMSNorm",
            "--swiglu",
            "--ffn-hidden-size",
            "352",
            "--position-embedding-type",
            "rope",
            "--rotary-base",
            "500000",
            "--use-rope-scaling",
            "--kv-channels",
            "24",
            "--norm-epsilon",
            "1e-6",
        ],
    ),
];

#[test]
fn llama_export_then_import_is_bit_exact() {
    let dir = scratch("hf-llama-round-trip");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    for (name, preset, flags) in CASES {
        let ckpt = trained_preset(&dir, &data, name, preset, flags);
        let hf = p(&format!("{name}-hf"));
        ok(run(&["convert", "--load", &ckpt, "--save-hf", &hf]), "export");
        let config = std::fs::read_to_string(Path::new(&hf).join("config.json")).unwrap();
        assert!(config.contains("\"model_type\": \"llama\"") && config.contains("LlamaForCausalLM"), "{config}");
        let back = p(&format!("{name}-back"));
        ok(run(&["convert", "--load-hf", &hf, "--save", &back]), "import");
        let n = assert_same_params(&ckpt, &back);
        assert!(n >= 4 * 6 + 2, "{name}: only {n} parameters compared");
    }
    let tied = std::fs::read_to_string(dir.join("tied-hf/config.json")).unwrap();
    for needle in ["\"tie_word_embeddings\": true", "\"attention_bias\": true", "\"head_dim\": 24", "\"llama3\""] {
        assert!(tied.contains(needle), "'{needle}' not in {tied}");
    }

    // The same weights in two shards that model.safetensors.index.json lists, as large models
    // are published, import the same.
    let hf = dir.join("gqa-hf");
    let tensors = read_safetensors(&hf.join("model.safetensors")).unwrap();
    std::fs::remove_file(hf.join("model.safetensors")).unwrap();
    let mut shards = [Vec::new(), Vec::new()];
    let mut map = Vec::new();
    for (i, (name, (shape, values))) in tensors.into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        map.push(format!("\"{name}\": \"{file}\""));
        shards[i % 2].push((name, shape, values));
    }
    for (i, shard) in shards.iter().enumerate() {
        write_safetensors(&hf.join(format!("model-0000{}-of-00002.safetensors", i + 1)), shard).unwrap();
    }
    let index = format!("{{\"metadata\": {{}}, \"weight_map\": {{{}}}}}", map.join(", "));
    std::fs::write(hf.join("model.safetensors.index.json"), index).unwrap();
    ok(run(&["convert", "--load-hf", &p("gqa-hf"), "--save", &p("gqa-sharded")]), "import of shards");
    assert_same_params(&p("gqa"), &p("gqa-sharded"));
}

#[test]
fn what_llama_cannot_express_is_one_clear_error() {
    let dir = scratch("hf-llama-errors");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    // Export: RMSNorm alone leaves a GELU MLP and learned positions; rotary on half the head.
    let gelu = trained_preset(&dir, &data, "gelu", "tiny", &["--normalization", "RMSNorm"]);
    assert_clean_error(
        &run(&["convert", "--load", &gelu, "--save-hf", &p("x")]),
        &["LlamaForCausalLM cannot express", "a GELU MLP", "learned absolute positions"],
    );
    let half = trained(&dir, &data, "half", &["--rotary-percent", "0.5"]);
    assert_clean_error(
        &run(&["convert", "--load", &half, "--save-hf", &p("x")]),
        &["rotary embedding on 16 of 32 head dimensions"],
    );
    // Import: configs and weights that trident cannot take.
    let ckpt = trained(&dir, &data, "ok", &[]);
    ok(run(&["convert", "--load", &ckpt, "--save-hf", &p("hf")]), "export");
    let config_path = dir.join("hf/config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let edits: &[(&str, &str, &[&str])] = &[
        ("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", &["hidden_act 'gelu'"]),
        ("\"mlp_bias\": false", "\"mlp_bias\": true", &["attention_bias false with mlp_bias true"]),
        ("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", &["rope_type 'yarn'"]),
        (
            "\"rope_theta\": 10000.0}",
            "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5}",
            &["partial_rotary_factor 0.5"],
        ),
        ("\"model_type\": \"llama\"", "\"model_type\": \"mistral\"", &["model_type 'mistral'"]),
        ("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", &["k_proj.weight", "shape"]),
    ];
    for (from, to, needles) in edits {
        assert!(config.contains(from), "'{from}' not in {config}");
        std::fs::write(&config_path, config.replace(from, to)).unwrap();
        assert_clean_error(&run(&["convert", "--load-hf", &p("hf"), "--save", &p("x")]), needles);
    }
    // Biases the config does not announce are left over, and named.
    std::fs::write(&config_path, &config).unwrap();
    let ckpt_b = trained_preset(
        &dir,
        &data,
        "bias",
        "tiny",
        &["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope"],
    );
    ok(run(&["convert", "--load", &ckpt_b, "--save-hf", &p("hf-b")]), "export");
    let b_config = dir.join("hf-b/config.json");
    let text = std::fs::read_to_string(&b_config).unwrap();
    std::fs::write(
        &b_config,
        text.replace("\"attention_bias\": true", "\"attention_bias\": false")
            .replace("\"mlp_bias\": true", "\"mlp_bias\": false"),
    )
    .unwrap();
    assert_clean_error(
        &run(&["convert", "--load-hf", &p("hf-b"), "--save", &p("x")]),
        &["LlamaForCausalLM does not have", "bias"],
    );
}

/// The Python with torch and transformers, or None (said loudly).
fn transformers_python() -> Option<String> {
    python_with("torch, transformers", "the comparison with transformers' LlamaForCausalLM is not run")
}

/// Runs hf_llama_compare.py's `commands` in one process (torch and transformers take seconds to
/// import).
fn python(py: &str, commands: &[Vec<String>]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hf_llama_compare.py");
    let args = commands.join(&"--".to_string());
    let o = Command::new(py).arg(script).args(&args).output().expect("python runs");
    assert!(o.status.success(), "hf_llama_compare.py {args:?}: {}", stderr(&o));
}

fn command(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// trident's logits for `tokens` ([len, padded vocabulary]) from the checkpoint in `ckpt`.
fn trident_logits(ckpt: &str, tokens: &[u32]) -> (Vec<f32>, usize) {
    let full = read_full(Path::new(ckpt)).unwrap();
    (checkpoint_logits(&full, tokens), full.model.padded_vocab_size)
}

/// Asserts every logit within 1e-4 of its position's largest |logit|; returns the worst ratio.
/// Our rows are `vocab` wide, theirs as wide as Hugging Face's vocabulary: an import pads it for
/// the checkpoint's layout (320 ids become 384 rows), and the padding rows are not compared.
fn assert_logits_close(what: &str, ours: &[f32], theirs: &[f32], vocab: usize) -> f64 {
    let positions = ours.len() / vocab;
    assert!(theirs.len().is_multiple_of(positions), "{what}: {} logits for {positions} positions", theirs.len());
    let their_vocab = theirs.len() / positions;
    assert!(their_vocab <= vocab, "{what}: transformers' vocabulary {their_vocab} is wider than ours {vocab}");
    let mut worst = 0f64;
    for (t, (a, b)) in ours.chunks(vocab).zip(theirs.chunks(their_vocab)).enumerate() {
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            let rel = (*x as f64 - *y as f64).abs() / scale;
            assert!(rel <= 1e-4, "{what}: position {t}, token {j}: trident {x} vs transformers {y} (scale {scale})");
            worst = worst.max(rel);
        }
    }
    worst
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn joined(tokens: &[u32]) -> String {
    tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn an_exported_llama_runs_the_same_in_transformers() {
    let Some(py) = transformers_python() else { return };
    let dir = scratch("hf-llama-transformers-export");
    let data = prepared_corpus(&dir);
    let mut exported = Vec::new();
    for (name, preset, flags) in CASES {
        let ckpt = trained_for(&dir, &data, name, preset, 60, flags);
        let hf = dir.join(format!("{name}-hf")).display().to_string();
        ok(run(&["convert", "--load", &ckpt, "--save-hf", &hf]), "export");
        exported.push((name, ckpt, hf, dir.join(format!("{name}-out"))));
    }
    python(&py, &exported.iter().map(|(_, _, hf, out)| prompt_in_transformers(hf, out)).collect::<Vec<_>>());
    for (name, ckpt, hf, out) in &exported {
        let (worst, n) = compare_with_transformers(ckpt, hf, out);
        let _ = writeln!(
            std::io::stderr(),
            "exported '{name}' Llama: worst logit difference {worst:.2e} of the position's largest; {n} greedy tokens \
             agree"
        );
    }
}

const PROMPT: &str = "ROMEO:\nBut soft, what light";
const CONTINUATION: usize = 40;

/// The hf_llama_compare.py command that runs PROMPT and its greedy continuation in transformers
/// on the checkpoint in `hf`, writing to `out` (.logits, .greedy).
fn prompt_in_transformers(hf: &str, out: &Path) -> Vec<String> {
    let tokens: Vec<u32> = PROMPT.bytes().map(u32::from).collect();
    command(&["logits", hf, &joined(&tokens), &CONTINUATION.to_string(), out.to_str().unwrap()])
}

/// Runs the checkpoint `ckpt` here against what `prompt_in_transformers` wrote for its export
/// `hf` to `out`: the logits of PROMPT (asserted within 1e-4) and its greedy continuation
/// (asserted the same as `trident generate --temperature 0`'s). Returns the worst logit
/// difference and the continuation's length.
fn compare_with_transformers(ckpt: &str, hf: &str, out: &Path) -> (f64, usize) {
    let tokens: Vec<u32> = PROMPT.bytes().map(u32::from).collect();
    let n = CONTINUATION;
    let (ours, vocab) = trident_logits(ckpt, &tokens);
    let worst = assert_logits_close(hf, &ours, &read_f32(&out.with_extension("logits")), vocab);
    let greedy: Vec<u32> = std::fs::read_to_string(out.with_extension("greedy"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(greedy.len(), n);
    let generate = ["generate", "--load", ckpt, "--prompt", PROMPT, "--max-new-tokens", &n.to_string()];
    let o = ok(run(&[&generate[..], &["--temperature", "0"]].concat()), "generate");
    let mut expected = PROMPT.as_bytes().to_vec();
    for &t in &greedy {
        match u8::try_from(t) {
            Ok(byte) => expected.push(byte),
            Err(_) => expected.extend_from_slice(b"\n\n"),
        }
    }
    expected.push(b'\n');
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&expected),
        "{hf}: trident generate's greedy continuation vs transformers'"
    );
    (worst, n)
}

#[test]
fn a_transformers_llama_imports_with_its_logits() {
    let Some(py) = transformers_python() else { return };
    let dir = scratch("hf-llama-transformers-import");
    let tokens: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % 320).collect();
    let cases = ["gqa", "tied"];
    let path = |name: String| dir.join(name).display().to_string();
    let mut commands = Vec::new();
    for case in cases {
        let hf = path(case.to_string());
        commands.push(command(&["make", &hf, case]));
        commands.push(command(&["logits", &hf, &joined(&tokens), "0", &path(format!("{case}-out"))]));
        commands.push(prompt_in_transformers(&hf, Path::new(&path(format!("{case}-prompt")))));
    }
    python(&py, &commands);
    for case in cases {
        let hf = path(case.to_string());
        let ckpt = path(format!("{case}-ckpt"));
        ok(run(&["convert", "--load-hf", &hf, "--save", &ckpt]), "import");
        let (ours, vocab) = trident_logits(&ckpt, &tokens);
        let out = PathBuf::from(path(format!("{case}-out")));
        let worst = assert_logits_close(case, &ours, &read_f32(&out.with_extension("logits")), vocab);
        // Random weights continue a prompt with varied tokens: a sharp test of the greedy path.
        let (_, n) = compare_with_transformers(&ckpt, &hf, Path::new(&path(format!("{case}-prompt"))));
        let _ = writeln!(
            std::io::stderr(),
            "transformers' '{case}' Llama: worst logit difference {worst:.2e} of the position's largest; {n} greedy \
             tokens agree"
        );
    }
}
