//! End-to-end training through the binary: the same flags give the same loss curve, resuming
//! from a checkpoint continues the uninterrupted run bit for bit, a checkpoint of another shape is
//! refused, a trained checkpoint generates text, a Megatron script's no-effect flags change
//! nothing, and `--apply-layernorm-1p` trains as the plain norm scale does.

mod common;
use common::*;
use std::path::Path;

fn train(prefix: &str, iters: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["train", "--data-path", prefix, "--train-iters", iters];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "train failed: {}", stderr(&o));
    o
}

#[test]
fn same_seed_same_curve_and_resume_is_bit_exact() {
    let dir = scratch("resume");
    let data = prepared_corpus(&dir);
    let j = |name: &str| dir.join(name).to_str().unwrap().to_string();

    let (a, b) = (j("a.jsonl"), j("b.jsonl"));
    train(&data, "12", &["--log-json", &a]);
    train(&data, "12", &["--log-json", &b]);
    let (la, lb) = (logged_losses(Path::new(&a)), logged_losses(Path::new(&b)));
    assert_eq!(la.len(), 12);
    assert_eq!(la, lb, "two identical runs differ");
    assert!(la.windows(2).any(|w| w[0].1 != w[1].1), "loss never changed");

    // A different seed gives a different curve, so the comparison above can fail.
    let c = j("c.jsonl");
    train(&data, "12", &["--log-json", &c, "--seed", "7"]);
    assert_ne!(logged_losses(Path::new(&c)), la);

    // Stop at iteration 6 with a checkpoint, resume to 12: iterations 7..12 match bit for bit.
    // Both runs pass `--save X --load X`, as a requeued Megatron job script does: the first finds
    // no checkpoint in X yet and starts from scratch, saying so.
    let (ckpt, r1) = (j("ckpt"), j("r1.jsonl"));
    let o = train(&data, "12", &["--save", &ckpt, "--load", &ckpt, "--exit-interval", "6", "--log-json", &r1]);
    assert!(stdout(&o).contains("exiting program at iteration 6"));
    let scratch_line = format!(
        " --load {ckpt}: no latest_checkpointed_iteration.txt there, so no checkpoint yet: starting from scratch"
    );
    assert_eq!(stdout(&o).lines().filter(|l| l.starts_with(&scratch_line)).count(), 1, "{}", stdout(&o));
    assert_eq!(std::fs::read_to_string(dir.join("ckpt/latest_checkpointed_iteration.txt")).unwrap().trim(), "6");
    train(&data, "12", &["--load", &ckpt, "--save", &ckpt, "--log-json", &r1]);
    let resumed = logged_losses(Path::new(&r1));
    assert_eq!(resumed.iter().map(|l| l.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<u64>>(), "appended log");
    assert_eq!(resumed[6..], la[6..], "resumed run differs from the uninterrupted one");
    assert_eq!(resumed[..6], la[..6]);

    // A checkpoint of another shape is refused with the reason.
    let mut args = vec!["train", "--data-path", data.as_str(), "--train-iters", "14", "--load", ckpt.as_str()];
    args.extend_from_slice(SMALL);
    let pos = args.iter().position(|a| *a == "--hidden-size").unwrap();
    args[pos + 1] = "64";
    assert_clean_error(&run(&args), &["hidden_size is 32 in the checkpoint but 64 here"]);

    // The checkpoint generates: greedy decoding is deterministic and prints the prompt first.
    let g = |seed: &str| {
        run(&[
            "generate",
            "--load",
            &ckpt,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "20",
            "--top-k",
            "1",
            "--seed",
            seed,
        ])
    };
    let (g1, g2) = (g("1"), g("2"));
    assert!(g1.status.success(), "{}", stderr(&g1));
    assert!(stdout(&g1).starts_with("ROMEO:"));
    assert_eq!(stdout(&g1), stdout(&g2), "greedy decoding depends on the seed");
}

#[test]
fn a_corrupted_checkpoint_is_refused() {
    let dir = scratch("corrupt");
    let data = prepared_corpus(&dir);
    let ckpt = dir.join("ckpt");
    train(&data, "3", &["--save", ckpt.to_str().unwrap()]);
    let shard = ckpt.join("iter_0000003/mp_rank_00/model_optim_rng.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let mut args = vec!["train", "--data-path", data.as_str(), "--train-iters", "5", "--load", ckpt.to_str().unwrap()];
    args.extend_from_slice(SMALL);
    assert_clean_error(&run(&args), &["checksum", "model_optim_rng.bin"]);
}

#[test]
fn recompute_gives_the_same_losses_with_less_activation_memory() {
    let dir = scratch("recompute");
    let data = prepared_corpus(&dir);
    let mib = |o: &std::process::Output| -> f64 {
        let text = stdout(o);
        let line = text.lines().find(|l| l.contains("activation memory")).expect("activation memory line").to_string();
        line.split(": ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    let mut runs = Vec::new();
    for mode in ["none", "selective", "full"] {
        let json = dir.join(format!("{mode}.jsonl"));
        let o = train(&data, "5", &["--recompute-granularity", mode, "--log-json", json.to_str().unwrap()]);
        runs.push((mode, logged_losses(&json), mib(&o)));
    }
    let (_, base, base_mib) = &runs[0];
    for (mode, got, mem) in &runs[1..] {
        for ((_, a), (_, b)) in got.iter().zip(base) {
            let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!((a - b).abs() <= 1e-6 * b.abs(), "{mode}: {a} vs {b}");
        }
        assert!(mem < base_mib, "{mode}: {mem} MiB of activations, not less than {base_mib} without recompute");
    }
}

/// A Megatron job script's implementation and logging flags run unchanged: each is named at start
/// as having no effect, and the losses are the run's without them, bit for bit;
/// `--recompute-activations` is Megatron's selective recompute.
#[test]
fn megatron_script_flags_run_unchanged() {
    let dir = scratch("megatron-flags");
    let data = prepared_corpus(&dir);
    let no_effect: &[&[&str]] = &[
        &["--use-mcore-models"],
        &["--transformer-impl", "transformer_engine"],
        &["--attention-backend", "auto"],
        &["--use-flash-attn"],
        &["--no-masked-softmax-fusion"],
        &["--no-gradient-accumulation-fusion"],
        &["--accumulate-allreduce-grads-in-fp32"],
        &["--distributed-backend", "nccl"],
        &["--num-workers", "2"],
        &["--ckpt-format", "torch"],
        &["--log-throughput"],
        &["--log-timers-to-tensorboard"],
        // Llama 3 8B's script (examples/llama): Python's garbage collector and PyTorch's allocator.
        &["--manual-gc"],
        &["--manual-gc-interval", "100"],
        &["--no-manual-gc-eval"],
        &["--empty-unused-memory-level", "0"],
        &["--no-create-attention-mask-in-dataloader"],
        &["--no-mmap-bin-files"],
        &["--cross-entropy-loss-fusion"],
        &["--cross-entropy-fusion-impl", "te"],
        // Older scripts (examples/academic_paper_scripts and the published GPT and Llama recipes).
        &["--override-opt_param-scheduler"],
        &["--no-save-rng"],
        &["--fp16-lm-cross-entropy"],
        &["--no-async-tensor-model-parallel-allreduce"],
        &["--apply-query-key-layer-scaling"],
        &["--use-cpu-initialization"],
        &["--use-legacy-models"],
        &["--tensorboard-queue-size", "5"],
        &["--log-batch-size-to-tensorboard"],
        &["--logging-level", "20"],
        &["--cuda-graph-impl", "none"],
        &["--init-model-with-meta-device"],
        &["--distribute-checkpointed-activations"],
        &["--DDP-impl", "local"],
        &["--use-contiguous-buffers-in-local-ddp"],
        &["--no-scatter-gather-tensors-in-pipeline"],
        &["--timing-log-option", "minmax"],
        &["--barrier-with-L1-time"],
        &["--defer-embedding-wgrad-compute"],
        &["--use-dist-ckpt"],
        &["--auto-detect-ckpt-format"],
        &["--ckpt-fully-parallel-save"],
        &["--ckpt-fully-parallel-load"],
        &["--async-save"],
        &["--dist-ckpt-strictness", "assume_ok_unexpected"],
    ];
    let json = |name: &str| dir.join(format!("{name}.jsonl"));
    let plain = train(&data, "3", &["--log-json", json("plain").to_str().unwrap()]);
    assert!(!stdout(&plain).contains("no effect"), "{}", stdout(&plain));
    let mut args: Vec<&str> = no_effect.concat();
    let megatron_json = json("megatron");
    // Flags that work as in Megatron and ask for what trident does anyway.
    args.extend(["--calculate-per-token-loss", "--context-parallel-size", "1", "--data-impl", "mmap"]);
    args.extend(["--vocab-extra-ids", "0", "--overlap-grad-reduce", "--data-parallel-sharding-strategy", "no_shard"]);
    args.extend(["--dataloader-type", "single", "--log-json", megatron_json.to_str().unwrap()]);
    let o = train(&data, "3", &args);
    let out = stdout(&o);
    for flag in no_effect {
        let said = out.lines().filter(|l| l.starts_with(&format!(" {}: accepted from Megatron, no effect (", flag[0])));
        assert_eq!(said.count(), 1, "{}: {out}", flag[0]);
    }
    let (want, got) = (logged_losses(&json("plain")), logged_losses(&megatron_json));
    assert!(want.len() == 3 && got == want, "{got:?} vs {want:?}");

    let recompute = |flags: &[&str], name: &str| {
        let path = json(name);
        let o = train(&data, "3", &[flags, &["--log-json", path.to_str().unwrap()]].concat());
        (logged_losses(&path), stdout(&o).contains("(recompute: Selective)"))
    };
    let selective = recompute(&["--recompute-granularity", "selective"], "selective");
    assert!(selective.1, "--recompute-granularity selective is not selective");
    assert_eq!(recompute(&["--recompute-activations"], "activations"), selective);
    // Megatron's older full recompute, and the method that full recompute is.
    let full = recompute(&["--recompute-granularity", "full"], "full");
    let older = ["--checkpoint-activations", "--recompute-method", "uniform", "--recompute-num-layers", "1"];
    assert_eq!(recompute(&older, "older"), full);
    let oldest = ["--checkpoint-activations", "--activations-checkpoint-method", "uniform", "--checkpoint-num-layers", "1"];
    assert_eq!(recompute(&oldest, "oldest"), full);
}

/// `--apply-layernorm-1p` holds each norm's weight as `w` with the scale `1 + w`: in f32 it
/// trains as the plain scale does to f32 rounding, its checkpoint holds the scale minus 1, a
/// checkpoint of the other kind is refused, and the Hugging Face export holds the scale itself.
#[test]
fn apply_layernorm_1p_trains_as_the_plain_scale_and_exports_the_scale() {
    let dir = scratch("layernorm-1p");
    let data = prepared_corpus(&dir);
    let llama: &[&str] = &["--swiglu", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights"];
    for (norm, arch) in [("LayerNorm", &[][..]), ("RMSNorm", llama)] {
        let run_with = |name: &str, extra: &[&str]| {
            let (ckpt, json) = (dir.join(format!("{norm}-{name}")), dir.join(format!("{norm}-{name}.jsonl")));
            let mut args = vec!["--normalization", norm, "--save", ckpt.to_str().unwrap()];
            args.extend(arch);
            args.extend(["--log-json", json.to_str().unwrap()]);
            args.extend(extra);
            train(&data, "4", &args);
            (ckpt, loss_values(&json))
        };
        let (plain, want) = run_with("plain", &[]);
        let (shifted, got) = run_with("1p", &["--apply-layernorm-1p"]);
        assert_eq!(got.len(), 4);
        for (g, w) in got.iter().zip(&want) {
            assert!((g / w - 1.0).abs() < 1e-6, "{norm}: losses {got:?} vs {want:?}");
        }
        let (a, b) = (full_weights(&plain), full_weights(&shifted));
        for ((name, scale), (_, w)) in a.iter().zip(&b) {
            let norm_weight = name.ends_with("layernorm.weight");
            for (s, w) in scale.iter().zip(w) {
                let w = if norm_weight { w + 1.0 } else { *w };
                assert!((s - w).abs() < 1e-5, "{norm}: {name}: {s} vs {w} (plus 1 for a norm weight)");
            }
        }
        let mut args = vec!["train", "--data-path", &data, "--train-iters", "5", "--normalization", norm];
        args.extend(arch);
        args.extend(SMALL);
        args.extend(["--load", shifted.to_str().unwrap()]);
        assert_clean_error(&run(&args), &["apply_layernorm_1p is true in the checkpoint"]);
        // Hugging Face holds the scale: exported and imported again, the weights are the plain run's.
        let (hf, back) = (dir.join(format!("{norm}-hf")), dir.join(format!("{norm}-back")));
        for args in [
            ["convert", "--load", shifted.to_str().unwrap(), "--save-hf", hf.to_str().unwrap()],
            ["convert", "--load-hf", hf.to_str().unwrap(), "--save", back.to_str().unwrap()],
        ] {
            let o = run(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        }
        for ((name, scale), (_, got)) in a.iter().zip(&full_weights(&back)) {
            let close = scale.iter().zip(got).all(|(s, g)| (s - g).abs() < 1e-5);
            assert!(close, "{norm}: {name} after the Hugging Face round trip");
        }
    }
}

/// `--profile` keeps the timing trace of iterations start + 1 to end only (one optimizer span
/// each), changes no loss, and its range flags are checked (the CUDA profiler calls are
/// `tests/cuda_device.rs`'s).
#[test]
fn profile_traces_just_its_iterations() {
    let dir = scratch("profile");
    let data = prepared_corpus(&dir);
    let (trace, json) = (dir.join("trace.json"), dir.join("profiled.jsonl"));
    let (trace_s, json_s) = (trace.to_str().unwrap(), json.to_str().unwrap());
    let profile = ["--profile", "--profile-step-start", "1", "--profile-step-end", "3", "--profile-ranks", "0"];
    let o = train(&data, "4", &[&profile[..], &["--timing-trace", trace_s, "--log-json", json_s]].concat());
    assert!(stdout(&o).contains(" --profile: iterations 2 to 3 on ranks [0]:"), "{}", stdout(&o));
    let spans = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(spans.matches("\"name\": \"optimizer\"").count(), 2, "{spans}");
    let plain = dir.join("plain.jsonl");
    train(&data, "4", &["--log-json", plain.to_str().unwrap()]);
    assert_eq!(logged_losses(&json), logged_losses(&plain));
    for (flags, needle) in [
        (&["--profile-step-start", "2"][..], "--profile-step-start sets the range of --profile, which is not given"),
        (&["--profile", "--profile-step-start", "3", "--profile-step-end", "3"], "must be above --profile-step-start"),
        (&["--profile", "--profile-ranks", "1"], "--profile-ranks"),
    ] {
        let mut args = vec!["train", "--data-path", &data, "--train-iters", "4"];
        args.extend(SMALL);
        args.extend(flags);
        assert_clean_error(&run(&args), &[needle]);
    }
}

/// Megatron's partial loads: `--finetune` (and `--pretrained-checkpoint` while `--load` is empty)
/// starts at iteration 0 from the weights alone (the schedule and the data from their start); `--no-load-optim` keeps the iteration and the data
/// but restarts AdamW and the learning-rate schedule, and a checkpoint saved after it carries the
/// restarted schedule on; `--no-load-rng` changes nothing.
#[test]
fn finetune_and_no_load_optim_restore_what_megatron_restores() {
    let dir = scratch("partial-load");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let lrs = |name: &str| -> Vec<(u64, f64)> {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let field = |l: &str, k: &str| json_field(l, k).unwrap().parse::<f64>().unwrap();
        text.lines().map(|l| (field(l, "iteration") as u64, field(l, "lr"))).collect()
    };
    train(&data, "8", &["--log-json", &p("fresh.jsonl")]);
    let fresh = lrs("fresh.jsonl");
    train(&data, "8", &["--save", &p("base"), "--exit-interval", "3"]);
    // --finetune: iterations 1.. again at the fresh schedule's rates, from the trained weights.
    let o =
        train(&data, "8", &["--load", &p("base"), "--finetune", "--exit-interval", "3", "--log-json", &p("ft.jsonl")]);
    assert!(stdout(&o).contains(": its weights alone (as --finetune); this run starts at iteration 0"), "{}", stdout(&o));
    assert_eq!(lrs("ft.jsonl"), fresh[..3]);
    // --pretrained-checkpoint: a requeued fine-tuning job starts from those weights while its
    // --load is empty (the --finetune run above, to the bit), then resumes from its own.
    let job = ["--load", &p("job"), "--save", &p("job"), "--pretrained-checkpoint", &p("base")];
    let o = train(&data, "8", &[&job[..], &["--exit-interval", "3", "--log-json", &p("job.jsonl")]].concat());
    assert!(stdout(&o).contains("holds no checkpoint yet: starting from the weights of --pretrained-checkpoint"));
    assert_eq!(logged_losses(&dir.join("job.jsonl")), logged_losses(&dir.join("ft.jsonl")));
    let o = train(&data, "8", &[&job[..], &["--log-json", &p("job.jsonl")]].concat());
    assert!(stdout(&o).contains("(iteration 3)") && !stdout(&o).contains("pretrained"), "{}", stdout(&o));
    assert_eq!(lrs("job.jsonl").len(), 8);
    let (ft, plain) = (loss_values(&dir.join("ft.jsonl")), loss_values(&dir.join("fresh.jsonl")));
    assert!(ft[0] < plain[0], "the finetuned run did not start from the trained weights: {ft:?} vs {plain:?}");
    // --no-load-optim: iterations 4.. at the rates of 1.., and a checkpoint at 6 carries that on.
    let args = ["--load", &p("base"), "--no-load-optim", "--no-load-rng", "--save", &p("restart")];
    let o = train(&data, "8", &[&args[..], &["--exit-interval", "6", "--log-json", &p("restart.jsonl")]].concat());
    let out = stdout(&o);
    assert!(
        out.contains("--no-load-optim: fresh AdamW state and loss scale; the learning-rate schedule restarts"),
        "{out}"
    );
    assert!(out.contains(" --no-load-rng: accepted from Megatron, no effect ("), "{out}");
    train(&data, "8", &["--load", &p("restart"), "--log-json", &p("restart.jsonl")]);
    let restarted = lrs("restart.jsonl");
    assert_eq!(restarted.iter().map(|r| r.0).collect::<Vec<_>>(), [4, 5, 6, 7, 8]);
    for ((_, got), (_, want)) in restarted.iter().zip(&fresh) {
        assert_eq!(got, want, "{restarted:?} vs the fresh schedule {fresh:?}");
    }
}

/// `--no-save-optim` writes the weights and the run's position alone (a third of the bytes); a
/// run that loads it starts AdamW fresh and restarts the schedule, as `--no-load-optim` does, and
/// `convert` reshards it.
#[test]
fn no_save_optim_checkpoints_hold_the_weights_alone() {
    let dir = scratch("no-save-optim");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    train(&data, "6", &["--save", &p("full"), "--exit-interval", "3"]);
    train(&data, "6", &["--save", &p("lean"), "--exit-interval", "3", "--no-save-optim"]);
    let bytes = |ck: &str| std::fs::metadata(dir.join(ck).join("iter_0000003/mp_rank_00/model_optim_rng.bin")).unwrap().len();
    assert!(bytes("lean") * 5 < bytes("full") * 2, "{} vs {} bytes", bytes("lean"), bytes("full"));
    assert_eq!(full_weights(&dir.join("lean")), full_weights(&dir.join("full")));
    let o = train(&data, "6", &["--load", &p("lean"), "--log-json", &p("resumed.jsonl")]);
    assert!(stdout(&o).contains(": saved with --no-save-optim: fresh AdamW state"), "{}", stdout(&o));
    let o = run(&["convert", "--load", &p("lean"), "--save", &p("tp2"), "--target-tensor-parallel-size", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mpirun(2, &[&["train", "--data-path", &data, "--train-iters", "6"][..], SMALL, &["--tensor-model-parallel-size", "2", "--load", &p("tp2")]].concat());
    assert!(o.status.success() && stdout(&o).contains("saved with --no-save-optim"), "{}", stderr(&o));
}

/// `--use-checkpoint-args` takes the model's shape, sequence length and tokenizer from the
/// checkpoint: a resume that gives none of them continues the run bit for bit; a first run
/// (no checkpoint yet) takes the flags' model and says so.
#[test]
fn use_checkpoint_args_resumes_without_the_model_flags() {
    let dir = scratch("checkpoint-args");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let llama = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--apply-layernorm-1p"];
    let o =
        train(&data, "6", &[&llama[..], &["--save", &p("ck"), "--load", &p("ck"), "--use-checkpoint-args"]].concat());
    assert!(stdout(&o).contains("--use-checkpoint-args: no checkpoint in"), "{}", stdout(&o));
    train(&data, "6", &[&llama[..], &["--log-json", &p("whole.jsonl")]].concat());
    train(&data, "6", &[&llama[..], &["--save", &p("half"), "--exit-interval", "3"]].concat());
    // No shape, architecture or sequence flag: only the recipe (SMALL's batch and schedule flags).
    let shape = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"];
    let mut args = vec!["train", "--data-path", &data, "--train-iters", "6", "--use-checkpoint-args"];
    let mut small = SMALL.iter().peekable();
    while let Some(&flag) = small.next() {
        let value = small.next_if(|v| !v.starts_with("--")).copied();
        if !shape.contains(&flag) {
            args.push(flag);
            args.extend(value);
        }
    }
    let (half, resumed) = (p("half"), p("resumed.jsonl"));
    args.extend(["--load", &half, "--log-json", &resumed]);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("--use-checkpoint-args: the model, sequence length and tokenizer of"),
        "{}",
        stdout(&o)
    );
    assert_eq!(logged_losses(Path::new(&resumed)), logged_losses(&dir.join("whole.jsonl"))[3..]);
    let o = run(&["train", "--data-path", &data, "--use-checkpoint-args"]);
    assert_clean_error(&o, &["--use-checkpoint-args needs --load DIR"]);
}

/// `--log-num-zeros-in-grad` counts each parameter's zero gradient elements once: with an untied
/// word embedding, the rows of tokens a step did not see; one rank, TP 2 and ZeRO-1 over DP 2
/// count the same, in the log line and the JSON log.
#[test]
fn num_zeros_in_grad_counts_each_parameter_once_in_every_layout() {
    let dir = scratch("num-zeros");
    let data = prepared_corpus(&dir);
    // TP 2 pads the vocabulary by 64 x 2, so every layout has the same 384 rows.
    let tp2 = ["--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"];
    let layouts: [(usize, &[&str]); 3] = [(1, &[]), (2, &tp2), (2, &["--use-distributed-optimizer"])];
    let mut counts = Vec::new();
    for (case, (ranks, layout)) in layouts.into_iter().enumerate() {
        let json = dir.join(format!("zeros{case}.jsonl"));
        let mut args = vec!["train", "--data-path", &data, "--train-iters", "3", "--log-num-zeros-in-grad"];
        args.extend_from_slice(SMALL);
        args.extend(layout);
        args.extend(["--untie-embeddings-and-output-weights", "--log-json", json.to_str().unwrap()]);
        let o = if ranks == 1 { run(&args) } else { mpirun(ranks, &args) };
        assert!(o.status.success(), "{layout:?}: {}", stderr(&o));
        let text = std::fs::read_to_string(&json).unwrap();
        let zeros: Vec<u64> = text.lines().map(|l| json_field(l, "num_zeros").expect("num_zeros").parse().unwrap()).collect();
        assert!(stdout(&o).contains(&format!("| num zeros: {} |", zeros[1])), "{}", stdout(&o));
        counts.push(zeros);
    }
    // Hidden 32: whole embedding rows are zero, so the counts are multiples of it.
    assert!(counts[0].iter().all(|&n| n > 0 && n % 32 == 0), "{counts:?}");
    assert!(counts.iter().all(|c| *c == counts[0]), "the layouts count differently: {counts:?}");
}

/// `--log-params-norm` logs the L2 norm of the weights after each step: at the last iteration,
/// the norm of the checkpoint saved there, on one rank and over tensor- and pipeline-parallel
/// ranks (each parameter counted once, the tied output layer not twice) and under ZeRO-1 over
/// two data-parallel ranks; on the log line too.
#[test]
fn params_norm_is_the_saved_weights_norm() {
    let dir = scratch("params-norm");
    let data = prepared_corpus(&dir);
    let layouts: [(usize, &[&str]); 4] = [
        (1, &[]),
        (2, &["--tensor-model-parallel-size", "2"]),
        (2, &["--pipeline-model-parallel-size", "2"]),
        (2, &["--use-distributed-optimizer"]),
    ];
    for (case, (ranks, layout)) in layouts.into_iter().enumerate() {
        let (ckpt, json) = (dir.join(format!("ckpt{case}")), dir.join(format!("log{case}.jsonl")));
        let mut args = vec!["train", "--data-path", &data, "--train-iters", "3", "--log-params-norm"];
        args.extend_from_slice(SMALL);
        args.extend(layout);
        args.extend(["--save", ckpt.to_str().unwrap(), "--log-json", json.to_str().unwrap()]);
        let o = if ranks == 1 { run(&args) } else { mpirun(ranks, &args) };
        assert!(o.status.success(), "{layout:?}: {}", stderr(&o));
        let weights = full_weights(&ckpt);
        let want = weights.iter().flat_map(|(_, v)| v).map(|&w| (w as f64).powi(2)).sum::<f64>().sqrt();
        let text = std::fs::read_to_string(&json).unwrap();
        let norms: Vec<f64> =
            text.lines().map(|l| json_field(l, "params_norm").expect("params_norm").parse().unwrap()).collect();
        assert_eq!(norms.len(), 3, "{layout:?}: {text}");
        let got = norms[2];
        assert!((got / want - 1.0).abs() < 1e-6, "{layout:?}: logged {got}, the checkpoint's weights {want}");
        assert!(norms[0] != norms[1] && norms[1] != norms[2], "{layout:?}: the norm does not follow the steps");
        assert!(stdout(&o).contains(&format!("params norm: {got:.3} |")), "{layout:?}: {}", stdout(&o));
    }
}

#[test]
fn bf16_follows_the_f32_curve_within_one_percent() {
    let dir = scratch("bf16");
    let data = prepared_corpus(&dir);
    let runs: Vec<_> = ["", "--bf16"]
        .iter()
        .map(|flag| {
            let json = dir.join(format!("run{}.jsonl", flag.len()));
            let mut args: Vec<String> = ["train", "--preset", "tiny", "--data-path", &data, "--exit-interval", "200"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(
                ["--log-interval", "10", "--eval-iters", "0", "--cpu-threads", "1", "--log-json"].map(String::from),
            );
            args.push(json.display().to_string());
            if !flag.is_empty() {
                args.push(flag.to_string());
            }
            (std::thread::spawn(move || run(&args.iter().map(String::as_str).collect::<Vec<_>>())), json)
        })
        .collect();
    let mut curves = Vec::new();
    for (handle, json) in runs {
        let o = handle.join().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        curves.push(logged_losses(&json));
    }
    assert_eq!(curves[0].len(), 20);
    for ((it, a), (_, b)) in curves[0].iter().zip(&curves[1]) {
        let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
        assert!((a - b).abs() <= 0.01 * a, "iteration {it}: bf16 loss {b} vs f32 {a}");
    }
}

#[test]
fn mixed_precision_holds_saved_activations_in_16_bits_exactly() {
    // Under --bf16 / --fp16 each layer's saved activations wait for backward as 16-bit copies.
    // The copies are exact: the losses equal full recompute's (which keeps no copies and rebuilds
    // each layer from its input) bit for bit, and selective recompute's too; and the activation
    // memory falls against f32.
    let dir = scratch("half-storage");
    let data = prepared_corpus(&dir);
    let shape = ["--num-layers", "6", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64"];
    let mib = |o: &std::process::Output| -> f64 {
        let text = stdout(o);
        let line = text.lines().find(|l| l.contains("activation memory")).expect("activation memory line").to_string();
        line.split(": ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    let run_with = |extra: &[&str], json: &str| {
        let mut args = vec!["train", "--data-path", data.as_str(), "--train-iters", "4", "--log-interval", "1"];
        args.extend_from_slice(&shape);
        args.extend_from_slice(&["--micro-batch-size", "8", "--global-batch-size", "8", "--eval-iters", "0"]);
        args.extend_from_slice(extra);
        let path = dir.join(json);
        args.extend_from_slice(&["--log-json", path.to_str().unwrap()]);
        let o = run(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        (logged_losses(&path), mib(&o))
    };
    let (_, f32_mib) = run_with(&[], "f32.jsonl");
    for precision in ["--bf16", "--fp16"] {
        let (kept, kept_mib) = run_with(&[precision], "kept.jsonl");
        let (full, _) = run_with(&[precision, "--recompute-granularity", "full"], "full.jsonl");
        let (selective, _) = run_with(&[precision, "--recompute-granularity", "selective"], "selective.jsonl");
        assert_eq!(kept.len(), 4);
        assert_eq!(kept, full, "{precision}: 16-bit copies changed the losses against full recompute");
        assert_eq!(kept, selective, "{precision}: 16-bit copies changed the losses against selective recompute");
        assert!(kept_mib < 0.8 * f32_mib, "{precision}: {kept_mib} MiB of activations against {f32_mib} in f32");
    }
}

#[test]
fn fp16_overflow_skips_the_step_and_halves_the_scale() {
    let dir = scratch("fp16");
    let data = prepared_corpus(&dir);
    let json = dir.join("fp16.jsonl");
    let o = train(&data, "4", &["--fp16", "--hysteresis", "1", "--log-json", json.to_str().unwrap()]);
    let text = stdout(&o);
    assert!(
        text.contains(
            "iteration 1: gradients overflowed at loss scale 4294967296; step skipped, loss scale now 2147483648"
        ),
        "{text}"
    );
    let first = std::fs::read_to_string(&json).unwrap().lines().next().unwrap().to_string();
    assert!(first.contains("\"skipped_iterations\": 1") && first.contains("\"loss_scale\": 2147483648"), "{first}");
}
