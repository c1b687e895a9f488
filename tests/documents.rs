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

const EOD: u16 = 256;

/// Documents of 3 to 13 tokens (a fixed generator), each ending in the end-of-document id: a
/// sample of 24 holds several.
fn short_documents(n: usize) -> Vec<Vec<u16>> {
    let mut state = 777u64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u16
    };
    (0..n)
        .map(|_| {
            let len = 2 + next() % 11;
            let mut d: Vec<u16> = (0..len).map(|_| 32 + next() % 90).collect();
            d.push(EOD);
            d
        })
        .collect()
}

/// A 2-layer model of width 32 (4 heads; Llama's RMSNorm, SwiGLU and rotary positions with
/// `llama`), 4 iterations of 4 samples of 24 tokens in micro-batches of `mbs`, one log line per
/// iteration.
fn args(data: &str, json: &str, (llama, mbs): (bool, &str), extra: &[&str]) -> Vec<String> {
    let mut a = vec!["train", "--data-path", data, "--log-json", json, "--seq-length", "24"];
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
    a.into_iter().map(String::from).collect()
}

fn losses(o: &std::process::Output, json: &std::path::Path) -> Vec<f64> {
    assert!(o.status.success(), "{}", stderr(o));
    loss_values(json)
}

#[test]
fn reset_positions_train_as_one_rank_in_every_layout() {
    let dir = scratch("documents-positions");
    let prefix = dir.join("docs");
    write_u16_dataset(&prefix, &short_documents(300));
    let data = prefix.to_str().unwrap().to_string();
    let json = |name: &str| dir.join(format!("{name}.jsonl"));
    let one_rank = |name: &str, llama: bool, extra: &[&str]| {
        let j = json(name);
        let a = args(&data, j.to_str().unwrap(), (llama, "2"), extra);
        let o = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
        (losses(&o, &j), stdout(&o))
    };
    let (reset, _) = one_rank("gpt-reset", false, &["--reset-position-ids"]);
    let (whole, _) = one_rank("gpt-whole", false, &[]);
    assert!(reset[0] != whole[0], "--reset-position-ids changes nothing: {reset:?} vs {whole:?}");
    // Micro-batches of one sample (ordered otherwise than the one rank's pairs), and under 2-D
    // tensor parallelism each rank one sample of two.
    let tp_sp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"];
    let layouts = [
        ("TP 2 x PP 2, SP", "1", [&tp_sp[..], &["--pipeline-model-parallel-size", "2"]].concat()),
        ("TP 2 x DP 2, SP", "1", tp_sp.to_vec()),
        ("2-D TP 2 x 2", "2", vec!["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]),
    ];
    for (layout, mbs, mut extra) in layouts {
        let j = json(layout);
        extra.push("--reset-position-ids");
        let a = args(&data, j.to_str().unwrap(), (false, mbs), &extra);
        let got = losses(&mpirun(4, &a.iter().map(String::as_str).collect::<Vec<_>>()), &j);
        assert_losses_match(layout, &got, &reset);
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
    let prefix = dir.join("docs");
    write_u16_dataset(&prefix, &short_documents(300));
    let data = prefix.to_str().unwrap().to_string();
    let json = |name: &str| dir.join(format!("{name}.jsonl"));
    let resets = ["--reset-attention-mask", "--reset-position-ids"];
    for (model, llama) in [("gpt", false), ("llama", true)] {
        let one_rank = |name: &str, extra: &[&str]| {
            let j = json(&format!("{model}-{name}"));
            let a = args(&data, j.to_str().unwrap(), (llama, "2"), extra);
            losses(&run(&a.iter().map(String::as_str).collect::<Vec<_>>()), &j)
        };
        let masked = one_rank("masked", &resets);
        let positions_only = one_rank("positions", &resets[1..]);
        assert!(masked[0] != positions_only[0], "{model}: the mask changes nothing: {masked:?}");
        let tp_sp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"];
        let mut layouts = vec![
            (
                "TP 2 x PP 2, SP, full recompute",
                "1",
                [&tp_sp[..], &["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full"]].concat(),
            ),
            ("TP 2 x DP 2, SP, selective recompute", "1", [&tp_sp[..], &["--recompute-granularity", "selective"]].concat()),
        ];
        if !llama {
            layouts.push(("2-D TP 2 x 2", "2", vec!["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"]));
        }
        for (layout, mbs, mut extra) in layouts {
            let j = json(&format!("{model}-masked-{layout}"));
            extra.extend(resets);
            let a = args(&data, j.to_str().unwrap(), (llama, mbs), &extra);
            let got = losses(&mpirun(4, &a.iter().map(String::as_str).collect::<Vec<_>>()), &j);
            assert_losses_match(&format!("{model}, {layout}"), &got, &masked);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
