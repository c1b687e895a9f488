//! Megatron-LM's own example job scripts run on the CPU under mpirun with only sizes and paths
//! changed (and bf16 for the GPT-3 script's fp16): `examples/llama/train_llama3_8b_h100_fp8.sh`
//! (its bf16 variant, on mock data, as the script runs without a tokenizer) and
//! `examples/gpt3/train_gpt3_175b_distributed.sh`. Each passes `--save X --load X` from an empty X,
//! as the scripts do: the first launch starts from scratch and stops after 3 iterations, the
//! second resumes and matches an uninterrupted run bit for bit. Every flag of both scripts runs,
//! `--overlap-param-gather` and `--grad-reduce-in-bf16` included.

mod common;
#[path = "common/untrusted.rs"]
mod untrusted;
use common::*;
use std::path::Path;

/// The Llama 3 8B script's flags in its order (MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS with
/// DDP_ARGS, the mock branch of DATA_ARGS_LIST, EVAL_AND_LOGGING_ARGS), sizes shrunk: 2 layers of
/// hidden 64 (FFN 224, 4 heads in 2 groups of 16 channels), 64 tokens, a vocabulary of 1000, a
/// global batch of 8 over 48 samples. The script splits "--split '99,1,0'" as a shell word list,
/// so Megatron receives the quotes; so does trident here.
const LLAMA3: &[&str] = &[
    "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "224",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
    "--seq-length", "64", "--max-position-embeddings", "64", "--position-embedding-type", "rope",
    "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--swiglu", "--normalization", "RMSNorm", "--init-method-std", "0.0134", "--attention-backend", "fused",
    "--apply-layernorm-1p", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--train-samples", "48", "--lr-decay-samples", "40",
    "--lr-warmup-samples", "8", "--lr", "0.00015", "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4",
    "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
    "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level", "1", "--exit-duration-in-mins", "235",
    "--tensor-model-parallel-size", "1", "--context-parallel-size", "1", "--sequence-parallel",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--data-cache-path", "CACHE",
    "--tiktoken-pattern", "v2", "--split", "'99,1,0'", "--no-create-attention-mask-in-dataloader",
    "--no-mmap-bin-files", "--num-workers", "1",
    "--log-interval", "1", "--eval-iters", "2", "--eval-interval", "3", "--save-interval", "3", "--log-throughput",
    "--profile", "--profile-step-start", "4", "--profile-step-end", "6", "--ckpt-format", "torch_dist",
    "--distributed-timeout-minutes", "60", "--save", "CKPT", "--load", "CKPT", "--tensorboard-dir", "TB",
];

/// The GPT-3 175B script's flags in its order (GPT_MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS,
/// DATA_ARGS, EVAL_AND_LOGGING_ARGS), sizes shrunk: 4 layers of hidden 64, 64 tokens, TP 2 x PP 2,
/// the batch stepping from 4 to 8 after 512 tokens, 6 iterations with the decay over 5; --bf16 for
/// --fp16.
const GPT3: &[&str] = &[
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
    "--max-position-embeddings", "64", "--attention-backend", "auto",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--step-batch-size-schedule", "0:4 512:8",
    "--train-iters", "6", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
    "--init-method-std", "0.006", "--clip-grad", "1.0", "--bf16", "--lr", "6.0e-5", "--lr-decay-style", "cosine",
    "--min-lr", "6.0e-6", "--lr-warmup-fraction", ".001", "--lr-decay-iters", "5",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--data-path", "DATA", "--vocab-file", "VOCAB", "--merge-file", "MERGES", "--split", "949,50,1",
    "--log-interval", "1", "--save-interval", "3", "--eval-interval", "3", "--save", "CKPT", "--load", "CKPT",
    "--eval-iters", "2", "--tensorboard-dir", "TB",
];

/// `script` with its placeholders filled from `paths`.
fn flags(script: &[&str], paths: &[(&str, String)]) -> Vec<String> {
    let fill = |w: &str| paths.iter().find(|(k, _)| *k == w).map_or(w.to_string(), |(_, v)| v.clone());
    script.iter().map(|w| fill(w)).collect()
}

/// Runs `args` on `ranks` ranks, asserting success; returns stdout.
fn launch(ranks: usize, args: &[String]) -> String {
    let mut all = vec!["train".to_string()];
    all.extend_from_slice(args);
    let o = mpirun_command(ranks, &[]).args(&all).output().expect("mpirun runs: install Open MPI");
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    stdout(&o)
}

/// The script's run twice over an empty `--save X --load X` (stopping after iteration 3, then
/// resuming) against one uninterrupted run.
fn runs_twice_and_resumes(name: &str, script: &[&str], ranks: usize, paths: &[(&str, String)], dir: &Path) {
    let ckpt = dir.join(format!("{name}-ckpt"));
    let with = |ckpt: &Path, tb: &str| {
        let mut p = paths.to_vec();
        p.extend([("CKPT", ckpt.display().to_string()), ("TB", dir.join(tb).display().to_string())]);
        flags(script, &p)
    };
    let json = |n: &str| dir.join(format!("{name}-{n}.jsonl"));
    let log = |n: &str| vec!["--log-json".to_string(), json(n).display().to_string()];
    let whole_ckpt = dir.join(format!("{name}-whole"));
    launch(ranks, &[with(&whole_ckpt, "tb-whole"), log("whole")].concat());
    let first = launch(ranks, &[with(&ckpt, "tb"), log("split"), vec!["--exit-interval".into(), "3".into()]].concat());
    assert!(first.contains("no checkpoint yet: starting from scratch"), "{name}: {first}");
    let second = launch(ranks, &[with(&ckpt, "tb"), log("split")].concat());
    assert!(second.contains("(iteration 3)"), "{name}: the second launch did not resume: {second}");
    let (whole, split) = (logged_losses(&json("whole")), logged_losses(&json("split")));
    assert_eq!(whole.len(), 6, "{name}: {whole:?}");
    assert_eq!(split, whole, "{name}: the resumed run differs from the uninterrupted one");
}

#[test]
fn llama3_8b_script_runs_twice_with_save_and_load() {
    let dir = scratch("megatron-llama3");
    let paths = [("CACHE", dir.join("cache").display().to_string())];
    runs_twice_and_resumes("llama3", LLAMA3, 2, &paths, &dir);
}

#[test]
fn gpt3_175b_script_runs_twice_with_save_and_load() {
    let dir = scratch("megatron-gpt3");
    let (vocab, merges) = untrusted::gpt2_files(&dir, &[]);
    let text = dir.join("corpus.txt");
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/tinyshakespeare.txt")).unwrap();
    std::fs::write(&text, &corpus[..200_000]).unwrap();
    let prefix = dir.join("corpus");
    let (v, m) = (vocab.display().to_string(), merges.display().to_string());
    let o = run(&[
        "prepare", "--input", text.to_str().unwrap(), "--output-prefix", prefix.to_str().unwrap(),
        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", &v, "--merge-file", &m, "--append-eod",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let data = format!("{}_text_document", prefix.display());
    let paths = [("DATA", data), ("VOCAB", v), ("MERGES", m)];
    runs_twice_and_resumes("gpt3", GPT3, 4, &paths, &dir);
}
