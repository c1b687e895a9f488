//! Bad input never panics: each malformed file or impossible flag gives one clear line on stderr
//! and a non-zero exit, naming what was wrong.

mod common;
use common::*;

fn train_on(prefix: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["train", "--data-path", prefix, "--train-iters", "3"];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    run(&args)
}

/// A valid little dataset of 40 documents, written by hand.
fn good_dataset(dir: &std::path::Path, name: &str) -> String {
    let docs: Vec<Vec<u16>> = (0..40).map(|d| (0..50 + d).map(|t| ((t * 7 + d) % 256) as u16).collect()).collect();
    let prefix = dir.join(name);
    write_u16_dataset(&prefix, &docs);
    prefix.to_str().unwrap().to_string()
}

#[test]
fn a_good_hand_written_dataset_trains() {
    let dir = scratch("good");
    let p = good_dataset(&dir, "ok");
    let o = train_on(&p, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("iteration"), "{}", stdout(&o));
}

#[test]
fn missing_bin() {
    let dir = scratch("missing-bin");
    let p = good_dataset(&dir, "d");
    std::fs::remove_file(format!("{p}.bin")).unwrap();
    assert_clean_error(&train_on(&p, &[]), &["d.bin"]);
}

#[test]
fn missing_dataset_entirely() {
    let dir = scratch("missing-all");
    let p = dir.join("nothing_text_document");
    assert_clean_error(&train_on(p.to_str().unwrap(), &[]), &["nothing_text_document"]);
}

#[test]
fn truncated_bin() {
    let dir = scratch("trunc-bin");
    let p = good_dataset(&dir, "d");
    let bin = std::fs::read(format!("{p}.bin")).unwrap();
    std::fs::write(format!("{p}.bin"), &bin[..bin.len() / 2]).unwrap();
    assert_clean_error(&train_on(&p, &[]), &["d.bin"]);
}

#[test]
fn wrong_idx_magic() {
    let dir = scratch("magic");
    let p = good_dataset(&dir, "d");
    let mut idx = std::fs::read(format!("{p}.idx")).unwrap();
    idx[0] = b'X';
    std::fs::write(format!("{p}.idx"), idx).unwrap();
    assert_clean_error(&train_on(&p, &[]), &["d.idx", "magic"]);
}

#[test]
fn wrong_idx_version() {
    let dir = scratch("version");
    let p = good_dataset(&dir, "d");
    let mut idx = std::fs::read(format!("{p}.idx")).unwrap();
    idx[9..17].copy_from_slice(&2u64.to_le_bytes());
    std::fs::write(format!("{p}.idx"), idx).unwrap();
    assert_clean_error(&train_on(&p, &[]), &["d.idx", "version"]);
}

#[test]
fn idx_pointers_past_the_bin() {
    let dir = scratch("past");
    let p = good_dataset(&dir, "d");
    let mut idx = std::fs::read(format!("{p}.idx")).unwrap();
    // Grow the last sequence's length: the pointers stay consistent, but the last sequence now
    // ends beyond the end of the .bin.
    let last = 34 + 4 * 39;
    idx[last..last + 4].copy_from_slice(&1000i32.to_le_bytes());
    std::fs::write(format!("{p}.idx"), idx).unwrap();
    assert_clean_error(&train_on(&p, &[]), &["d.bin"]);
}

#[test]
fn token_ids_at_or_above_the_vocabulary() {
    let dir = scratch("vocab");
    let docs: Vec<Vec<u16>> =
        (0..40).map(|d| (0..60).map(|t| if t == 5 { 300 } else { ((t + d) % 256) as u16 }).collect()).collect();
    let prefix = dir.join("big");
    write_u16_dataset(&prefix, &docs);
    assert_clean_error(&train_on(prefix.to_str().unwrap(), &[]), &["300", "257"]);
}

#[test]
fn sequence_longer_than_the_position_table() {
    let dir = scratch("seq");
    let p = good_dataset(&dir, "d");
    assert_clean_error(
        &train_on(&p, &["--max-position-embeddings", "16"]),
        &["--seq-length 32", "--max-position-embeddings 16"],
    );
}

#[test]
fn global_batch_not_a_multiple_of_the_micro_batch() {
    let dir = scratch("gbs");
    let p = good_dataset(&dir, "d");
    let mut args = vec!["train", "--data-path", p.as_str(), "--train-iters", "3"];
    args.extend_from_slice(SMALL);
    let pos = args.iter().position(|a| *a == "--global-batch-size").unwrap();
    args[pos + 1] = "10";
    assert_clean_error(&run(&args), &["--global-batch-size 10", "--micro-batch-size 4"]);
}

#[test]
fn hidden_size_not_divisible_by_heads() {
    let dir = scratch("heads");
    let p = good_dataset(&dir, "d");
    let mut args = vec!["train", "--data-path", p.as_str(), "--train-iters", "3"];
    args.extend_from_slice(SMALL);
    let pos = args.iter().position(|a| *a == "--num-attention-heads").unwrap();
    args[pos + 1] = "5";
    assert_clean_error(&run(&args), &["--hidden-size 32", "--num-attention-heads 5"]);
}

#[test]
fn unknown_and_malformed_flags_are_named() {
    assert_clean_error(&run(&["train", "--num-layer", "3"]), &["--num-layer", "did you mean --num-layers"]);
    assert_clean_error(&run(&["train", "--lr", "fast"]), &["--lr", "'fast'"]);
    assert_clean_error(&run(&["train", "--micro-batch-size"]), &["--micro-batch-size", "no value"]);
    assert_clean_error(&run(&["frobnicate"]), &["frobnicate"]);
    assert_clean_error(
        &run(&["train", "--hidden-dropout", "1.5"]),
        &["--hidden-dropout", "1.5", "a probability in [0, 1)"],
    );
    assert_clean_error(&run(&["train", "--attention-dropout", "-0.1"]), &["--attention-dropout", "a probability"]);
    // Megatron flags whose meaning trident does not build are refused, not ignored.
    assert_clean_error(&run(&["train", "--tp-comm-overlap"]), &["--tp-comm-overlap", "drop the flag"]);
    assert_clean_error(&run(&["train", "--dataloader-type", "cyclic"]), &["--dataloader-type", "cyclic", "single"]);
    assert_clean_error(
        &run(&["train", "--mock-data", "--recompute-activations", "--recompute-granularity", "full"]),
        &["--recompute-activations", "selective", "full"],
    );
}

/// Megatron's `--context-parallel-size 1` (every script passes it) trains; a size the world
/// cannot hold, and a2a+p2p without its levels, are one clear error each (tests/context.rs has the rest).
#[test]
fn context_parallel_size_one_trains_and_impossible_sizes_are_refused() {
    let dir = scratch("context-parallel");
    let p = good_dataset(&dir, "d");
    let o = train_on(&p, &["--context-parallel-size", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean_error(&train_on(&p, &["--context-parallel-size", "2"]), &["--context-parallel-size 2", "1 ranks"]);
    let hierarchical = ["--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"];
    assert_clean_error(&train_on(&p, &hierarchical), &["a2a+p2p", "--hierarchical-context-parallel-sizes A B"]);
}

/// Every Megatron flag trident has not built is refused before any work, its help line (what is
/// missing, and the issue that builds it where one does) in the error; none trains without it.
#[test]
fn every_unbuilt_megatron_flag_is_refused_by_name() {
    let dir = scratch("unbuilt-flags");
    let p = good_dataset(&dir, "d");
    // Each through the configuration (in process: the binary's MPI start-up is most of a run's
    // cost here), and one through the binary.
    let mut refused = 0;
    for spec in trident::flags::TRAIN_FLAGS.iter().filter(|f| f.help.starts_with("not built")) {
        let mut words = vec!["--data-path", p.as_str(), spec.name];
        if !spec.value.is_empty() {
            words.push("x");
        }
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let args = trident::cli::parse("train", trident::flags::TRAIN_FLAGS, &words).unwrap().unwrap();
        let e =
            trident::config::TrainConfig::from_args(&args).err().unwrap_or_else(|| panic!("{} accepted", spec.name));
        let why = spec.help.split(':').nth(1).unwrap_or(spec.help).trim();
        let e = e.to_string();
        assert!(e.contains(spec.name) && e.contains(why.split(';').next().unwrap()), "{}: {e}", spec.name);
        refused += 1;
    }
    // The features of later issues (FP8, sharded gradients and weights, TP overlap, ...).
    assert!(refused >= 8, "{refused} refused flags");
    let no_mask = train_on(&p, &["--reset-attention-mask", "--no-create-attention-mask-in-dataloader"]);
    assert_clean_error(&no_mask, &["--reset-attention-mask", "Megatron-LM refuses the pair"]);
    // The recompute flags that are built: the values trident's full recompute is.
    let o = train_on(
        &p,
        &["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    for (flags, needle) in [
        (&["--recompute-granularity", "full", "--recompute-method", "block"][..], "block is not built"),
        (&["--recompute-granularity", "full", "--recompute-num-layers", "2"], "--recompute-num-layers"),
        (&["--recompute-activations", "--recompute-method", "uniform"], "goes with --recompute-granularity full"),
        (&["--checkpoint-activations", "--recompute-granularity", "selective"], "means --recompute-granularity full"),
        (&["--use-rotary-position-embeddings", "--position-embedding-type", "none"], "contradicts the older flags"),
        (&["--data-impl", "lazy"], "mmap"),
        (&["--vocab-extra-ids", "100"], "T5's sentinel tokens"),
        (&["--activations-checkpoint-method", "uniform", "--recompute-method", "uniform"], "older name"),
    ] {
        assert_clean_error(&train_on(&p, flags), &[needle]);
    }
}

/// A Megatron-LM checkpoint (legacy `torch`: `mp_rank_00/model_optim_rng.pt`; `torch_dist`:
/// `.metadata` and `.distcp` files) under `--load` is read as one (tests/megatron_checkpoints.rs):
/// a malformed one is a clean error naming the file, from every command that reads checkpoints.
#[test]
fn a_malformed_megatron_checkpoint_is_a_clean_error() {
    let dir = scratch("megatron-checkpoint");
    let p = good_dataset(&dir, "d");
    let (legacy, dist) = (dir.join("legacy"), dir.join("dist"));
    std::fs::create_dir_all(legacy.join("iter_0000010/mp_rank_00")).unwrap();
    std::fs::write(legacy.join("iter_0000010/mp_rank_00/model_optim_rng.pt"), b"PK").unwrap();
    std::fs::create_dir_all(dist.join("iter_0000010")).unwrap();
    for f in [".metadata", "__0_0.distcp", "common.pt"] {
        std::fs::write(dist.join("iter_0000010").join(f), b"x").unwrap();
    }
    for (ck, needle) in [(&legacy, "model_optim_rng.pt"), (&dist, "common.pt")] {
        std::fs::write(ck.join("latest_checkpointed_iteration.txt"), "10\n").unwrap();
        let c = ck.to_str().unwrap();
        let needles = [needle, "not a zip archive"];
        assert_clean_error(&train_on(&p, &["--load", c]), &needles);
        assert_clean_error(&run(&["convert", "--load", c, "--save", dir.join("out").to_str().unwrap()]), &needles);
        assert_clean_error(&run(&["generate", "--load", c]), &needles);
    }
}

#[test]
fn load_from_a_directory_that_is_not_a_checkpoint() {
    let dir = scratch("noload");
    let p = good_dataset(&dir, "d");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // Training starts from scratch, as Megatron-LM's does (a job script's first run passes
    // `--save X --load X`; tests/training.rs); generating has nothing to start from.
    let o = train_on(&p, &["--load", empty.to_str().unwrap()]);
    assert!(o.status.success() && stdout(&o).contains("no checkpoint yet: starting from scratch"), "{}", stderr(&o));
    assert_clean_error(&run(&["generate", "--load", empty.to_str().unwrap()]), &["latest_checkpointed_iteration.txt"]);
}
