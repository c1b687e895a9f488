//! Megatron's per-document positions: under `--reset-position-ids` a sample's positions restart
//! at 0 after each end-of-document token for a learned position embedding. Every layout that
//! splits what positions touch (the sequence under tensor + sequence parallelism, the layers over
//! pipeline stages, the batch and the hidden size under 2-D tensor parallelism) trains as one rank
//! does, and the positions change what is trained; a rotary model trains as without the flag, as
//! in megatron-core. Under `--reset-attention-mask` attention stays within each document, and the
//! same layouts, with full and selective recomputation, train as one rank, GPT and Llama. The
//! logits against megatron-core's own position ids and mask are checked in
//! tests/megatron_checkpoints.rs, the attention op in tests/gradcheck.rs and tests/backends.rs.

mod common;
use common::*;
use std::path::Path;

/// A run's model and batch: Llama's RMSNorm, SwiGLU and rotary positions (else GPT-2's), and the
/// micro-batch size.
type Model<'a> = (bool, &'a str);

/// Trains a 2-layer model of width 32 (4 heads), 4 iterations of 4 samples of 24 tokens, on
/// `ranks` ranks (mpirun above one), logging each iteration to `dir/name.jsonl`: the losses and
/// what the run printed.
fn train(data: &str, (dir, name): (&Path, &str), ranks: usize, (llama, mbs): Model, extra: &[&str]) -> (Vec<f64>, String) {
    let json = dir.join(format!("{name}.jsonl"));
    let mut a = vec!["train", "--data-path", data, "--log-json", json.to_str().unwrap(), "--seq-length", "24"];
    a.extend(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4"]);
    a.extend(["--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1", "--cpu-threads", "1"]);
    a.extend(["--micro-batch-size", mbs, "--global-batch-size", "4", "--train-iters", "4", "--lr", "3e-3"]);
    a.extend(["--lr-warmup-iters", "0", "--eval-iters", "0"]);
    a.extend(SAME_PADDING);
    if llama {
        a.extend(["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope"]);
        a.extend(["--disable-bias-linear", "--untie-embeddings-and-output-weights"]);
    }
    a.extend_from_slice(extra);
    let o = if ranks == 1 { run(&a) } else { mpirun(ranks, &a) };
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    (loss_values(&json), stdout(&o))
}

/// A dataset of documents of 3 to 13 tokens, each ending in the end-of-document id 256: a sample
/// of 24 holds several.
fn short_documents(dir: &Path) -> String {
    let prefix = dir.join("docs");
    write_u16_dataset(&prefix, &generated_documents(300, (777, 11), 256));
    prefix.to_str().unwrap().to_string()
}

/// The layouts that split what documents touch, on 4 ranks: the sequence (tensor + sequence
/// parallel) with the layers (pipeline) or the batch (data parallel), in micro-batches of one
/// sample (ordered otherwise than the one rank's pairs), and with `two_d` the batch and hidden
/// size under 2-D tensor parallelism (each rank one sample of two). `pp_extra` and `dp_extra` go
/// with the first two.
fn layouts<'a>(two_d: bool, pp_extra: &[&'a str], dp_extra: &[&'a str]) -> Vec<(String, &'a str, Vec<&'a str>)> {
    let tp_sp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"];
    let mut l = vec![
        ("TP 2 x PP 2, SP".to_string(), "1", [&tp_sp[..], &["--pipeline-model-parallel-size", "2"], pp_extra].concat()),
        ("TP 2 x DP 2, SP".to_string(), "1", [&tp_sp[..], dp_extra].concat()),
    ];
    if two_d {
        l.push(("2-D TP 2 x 2".to_string(), "2", vec!["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]));
    }
    l
}

#[test]
fn reset_positions_train_as_one_rank_in_every_layout() {
    let dir = scratch("documents-positions");
    let data = short_documents(&dir);
    let one_rank = |name: &str, llama: bool, extra: &[&str]| train(&data, (&dir, name), 1, (llama, "2"), extra);
    let (reset, _) = one_rank("gpt-reset", false, &["--reset-position-ids"]);
    let (whole, _) = one_rank("gpt-whole", false, &[]);
    assert!(reset[0] != whole[0], "--reset-position-ids changes nothing: {reset:?} vs {whole:?}");
    for (layout, mbs, mut extra) in layouts(true, &[], &[]) {
        extra.push("--reset-position-ids");
        let (got, _) = train(&data, (&dir, &layout), 4, (false, mbs), &extra);
        assert_losses_match(&layout, &got, &reset);
    }
    // Rotary positions are megatron-core's: the whole sample's, whatever the flag, said at start.
    let (reset, said) = one_rank("llama-reset", true, &["--reset-position-ids"]);
    let (whole, _) = one_rank("llama-whole", true, &[]);
    assert_eq!(reset, whole, "a rotary model trains the same");
    assert!(said.contains("--reset-position-ids changes nothing for this model"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn reset_attention_masks_train_as_one_rank_in_every_layout() {
    // Each position attends within its own document only (--reset-attention-mask), with the
    // positions reset too, as Megatron's scripts pass both; recomputation rebuilds the same bounds.
    let dir = scratch("documents-attention");
    let data = short_documents(&dir);
    let resets = ["--reset-attention-mask", "--reset-position-ids"];
    for (model, llama) in [("gpt", false), ("llama", true)] {
        let (masked, _) = train(&data, (&dir, &format!("{model}-masked")), 1, (llama, "2"), &resets);
        let (positions_only, _) = train(&data, (&dir, &format!("{model}-positions")), 1, (llama, "2"), &resets[1..]);
        assert!(masked[0] != positions_only[0], "{model}: the mask changes nothing: {masked:?}");
        let recompute = |how| ["--recompute-granularity", how];
        let (full, selective) = (recompute("full"), recompute("selective"));
        // 2-D tensor parallelism runs GPT-2's learned positions only.
        for (layout, mbs, mut extra) in layouts(!llama, &full, &selective) {
            extra.extend(resets);
            let name = format!("{model}-masked-{layout}");
            let (got, _) = train(&data, (&dir, &name), 4, (llama, mbs), &extra);
            assert_losses_match(&format!("{model}, {layout}, {}", extra.join(" ")), &got, &masked);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
