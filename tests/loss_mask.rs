//! Megatron's loss mask: `--eod-mask-loss` leaves out of the loss the prediction made at each
//! end-of-document token (the next document's first token), and `--calculate-per-token-loss`
//! chooses how the counted tokens are averaged (the global batch's sum over its count, or the mean
//! of each micro-batch's mean). Checked against the logits of the trained weights, across layouts,
//! and between the two averagings.

mod common;
use common::*;
use std::path::Path;

const EOD: u16 = 256;

/// A 2-layer model of width 32 on the byte tokenizer, no dropout, a log line per iteration (the
/// validation's flags in `extra`).
fn args<'a>(data: &'a str, json: &'a str, seq: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train", "--data-path", data, "--log-json", json, "--seq-length", seq];
    a.extend(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4"]);
    a.extend(["--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1"]);
    a.extend(["--cpu-threads", "1"]);
    a.extend_from_slice(extra);
    a
}

fn losses_of(o: &std::process::Output, json: &Path) -> Vec<f64> {
    assert!(o.status.success(), "{}", stderr(o));
    loss_values(json)
}

#[test]
fn the_masked_loss_is_the_mean_over_the_predictions_not_made_at_a_document_end() {
    // Every document is [10, 20, 30, EOD] and the sequence length a multiple of 4, so every
    // sample is the same 17 tokens, whatever the shuffle; at a learning rate of 1e-30 no f32
    // weight moves, so the weights saved are those of every iteration's forward.
    let dir = scratch("loss-mask-exact");
    let prefix = dir.join("docs");
    write_u16_dataset(&prefix, &vec![vec![10, 20, 30, EOD]; 64]);
    let data = prefix.to_str().unwrap().to_string();
    let fixed = ["--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-30", "--min-lr", "0"];
    let validate = ["--split", "50,50,0", "--eval-interval", "2", "--eval-iters", "1"];
    let train = |name: &str, extra: &[&str]| {
        let (json, save) = (dir.join(format!("{name}.jsonl")), dir.join(name));
        let (j, s) = (json.to_str().unwrap(), save.to_str().unwrap());
        let mut a = args(&data, j, "16", &["--train-iters", "2", "--save", s]);
        a.extend_from_slice(&fixed);
        a.extend_from_slice(&validate);
        a.extend_from_slice(extra);
        let losses = losses_of(&run(&a), &json);
        let text = std::fs::read_to_string(&json).unwrap();
        let val = text.lines().find_map(|l| json_field(l, "val_loss")).expect("a validation loss is logged");
        ([&losses[..], &[val.parse::<f64>().unwrap()]].concat(), save)
    };
    let (masked, save) = train("masked", &["--eod-mask-loss"]);
    let (all, _) = train("all", &[]);

    let full = trident::checkpoint::read_any(&save).expect("the checkpoint reads back");
    let sample: Vec<u32> = [10, 20, 30, EOD as u32].iter().copied().cycle().take(17).collect();
    let logits = checkpoint_logits(&full, &sample[..16]);
    let vocab = logits.len() / 16;
    let losses: Vec<f64> = (0..16)
        .map(|t| {
            let row: Vec<f64> = logits[t * vocab..(t + 1) * vocab].iter().map(|&x| x as f64).collect();
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln() - row[sample[t + 1] as usize]
        })
        .collect();
    let counted: Vec<f64> = (0..16).filter(|&t| sample[t] != EOD as u32).map(|t| losses[t]).collect();
    assert_eq!(counted.len(), 12, "the 4 predictions made at a document end are left out");
    let expected_masked = counted.iter().sum::<f64>() / 12.0;
    let expected_all = losses.iter().sum::<f64>() / 16.0;
    // Both iterations' losses, then the validation loss.
    for (what, got, want) in [("--eod-mask-loss", &masked, expected_masked), ("every token", &all, expected_all)] {
        assert_eq!(got.len(), 3, "{what}: {got:?}");
        for (k, l) in got.iter().enumerate() {
            assert!((l - want).abs() <= 1e-5 * want, "{what}: loss {k} of {got:?} is {l}, the logits give {want}");
        }
    }
    assert!(
        (expected_masked - expected_all).abs() > 1e-3,
        "the test's data must make the masked loss differ: {expected_masked} vs {expected_all}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn layouts_and_both_averagings_agree_with_one_rank_under_eod_mask_loss() {
    let dir = scratch("loss-mask-layouts");
    let prefix = dir.join("docs");
    // Documents of 3 to 29 tokens, each ending in the end-of-document id.
    write_u16_dataset(&prefix, &generated_documents(400, (12345, 27), EOD));
    let data = prefix.to_str().unwrap().to_string();
    let fixed = ["--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "3e-3"];
    let fixed = [&fixed[..], &SAME_PADDING, &["--lr-warmup-iters", "0", "--eval-iters", "0"]].concat();
    let json = |name: &str| dir.join(format!("{name}.jsonl"));
    let one_rank = |name: &str, extra: &[&str]| {
        let j = json(name);
        let mut a = args(&data, j.to_str().unwrap(), "24", &fixed);
        a.extend_from_slice(extra);
        losses_of(&run(&a), &j)
    };
    let per_micro = one_rank("per-micro", &["--eod-mask-loss"]);
    let per_token = one_rank("per-token", &["--eod-mask-loss", "--calculate-per-token-loss"]);
    let unmasked = one_rank("unmasked", &[]);
    let unmasked_per_token = one_rank("unmasked-per-token", &["--calculate-per-token-loss"]);
    // The same forward at iteration 1, then gradients scaled differently: the micro-batches hold
    // different numbers of document ends.
    assert_eq!(per_micro[0], per_token[0], "iteration 1's loss does not depend on the averaging");
    assert!(per_micro[1..] != per_token[1..], "the averagings train alike: {per_micro:?}");
    assert!(per_micro[0] != unmasked[0], "--eod-mask-loss leaves the loss unchanged: {per_micro:?}");
    assert_eq!(unmasked, unmasked_per_token, "with every token counted the two averagings are one");

    // Pipeline 2 x data-parallel 2 (each rank two micro-batches of its own counts), and tensor
    // parallel 2 x data-parallel 2 with sequence parallelism.
    for (layout, flags) in [
        ("PP 2 x DP 2", vec!["--pipeline-model-parallel-size", "2"]),
        ("TP 2 x DP 2, SP", vec!["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ] {
        for (mode, base, extra) in
            [("per micro-batch", &per_micro, vec![]), ("per token", &per_token, vec!["--calculate-per-token-loss"])]
        {
            let j = json(&format!("{layout}-{mode}"));
            let mut a = args(&data, j.to_str().unwrap(), "24", &fixed);
            a.extend(flags.iter().chain(&extra).chain(&["--eod-mask-loss"]));
            let got = losses_of(&mpirun(4, &a), &j);
            assert_losses_match(&format!("{layout}, {mode}"), &got, base);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
