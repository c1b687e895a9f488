//! `trident convert`: a checkpoint resharded to other tensor/pipeline layouts continues the
//! original run's losses; export to Hugging Face safetensors and import back is bit-exact; and bad
//! inputs (no tracker, a truncated shard or safetensors file, another model shape) fail with one
//! clear line naming the file.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use trident::checkpoint::convert::read_full;

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// `trident train` with the concatenated `args` on `ranks` ranks (under mpirun when more than one),
/// padded the same at every layout.
fn train_on(ranks: usize, args: &[&[&str]]) -> Output {
    let args: Vec<&str> = std::iter::once("train").chain(SAME_PADDING).chain(args.concat()).collect();
    if ranks == 1 {
        run(&args)
    } else {
        mpirun(ranks, &args)
    }
}

/// The tiny preset without evaluation (add the data, iterations and checkpoint flags).
const TINY: [&str; 4] = ["--preset", "tiny", "--eval-iters", "0"];

/// Asserts that checkpoints `a` and `b` hold the same tensors whose names start with `prefix`,
/// bit for bit; returns how many.
fn assert_same_tensors(a: &str, b: &str, prefix: &str) -> usize {
    let (a, b) = (read_full(Path::new(a)).unwrap(), read_full(Path::new(b)).unwrap());
    let names =
        |t: &BTreeMap<String, Vec<f32>>| t.keys().filter(|k| k.starts_with(prefix)).cloned().collect::<Vec<_>>();
    assert_eq!(names(&a.tensors), names(&b.tensors));
    for name in names(&a.tensors) {
        assert_eq!(a.tensors[&name].len(), b.tensors[&name].len(), "{name}'s size changed");
        let same = a.tensors[&name].iter().zip(&b.tensors[&name]).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name} changed");
    }
    names(&a.tensors).len()
}

/// Asserts that the losses logged in `log` continue `reference`, up to the reduction order.
fn assert_continues(log: &str, reference: &[f64], what: &str) {
    let got = loss_values(Path::new(log));
    assert_eq!(got.len(), reference.len(), "{log}");
    for (a, b) in got.iter().zip(reference) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{log}: {a} vs {what} {b}");
    }
}

#[test]
fn resharded_checkpoints_continue_the_original_run() {
    let dir = scratch("convert");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    let small = ["--preset", "small", "--data-path", &data, "--train-iters", "10", "--log-interval", "1"];
    let train = |ranks: usize, layout: &[&str], extra: &[&str]| {
        ok(train_on(ranks, &[&small, &["--eval-iters", "0"], layout, extra]))
    };
    let tp2pp2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"];
    train(4, &tp2pp2, &["--save", &p("orig"), "--exit-interval", "6"]);
    train(4, &tp2pp2, &["--load", &p("orig"), "--log-json", &p("orig.jsonl")]);
    let reference = loss_values(Path::new(&p("orig.jsonl")));
    assert_eq!(reference.len(), 4);

    ok(run(&["convert", "--load", &p("orig"), "--save", &p("t1")]));
    ok(run(&["convert", "--load", &p("orig"), "--save", &p("t4"), "--target-tensor-parallel-size", "4"]));
    let back = ["--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"];
    ok(run(&["convert", "--load", &p("t4"), "--save", &p("back"), back[0], back[1], back[2], back[3]]));

    // Back at the original layout, every tensor (weights and both moments) is bit-identical.
    assert_same_tensors(&p("orig"), &p("back"), "");

    train(1, &[], &["--load", &p("t1"), "--log-json", &p("t1.jsonl")]);
    train(4, &["--tensor-model-parallel-size", "4"], &["--load", &p("t4"), "--log-json", &p("t4.jsonl")]);
    train(4, &tp2pp2, &["--load", &p("back"), "--log-json", &p("back.jsonl")]);
    for name in ["t1.jsonl", "t4.jsonl", "back.jsonl"] {
        assert_continues(&p(name), &reference, "the original layout's");
    }

    // Megatron's padding for 4 ranks at the default 128 is 512 rows: convert pads the 264 rows
    // it was trained with (new weight rows copy the last, new moment rows are zero), and a run
    // that pads otherwise is told why the checkpoint does not fit.
    let to_512 = ["--target-tensor-parallel-size", "4", "--make-vocab-size-divisible-by", "128"];
    let o = ok(run(&[&["convert", "--load", &p("orig"), "--save", &p("t4pad")][..], &to_512].concat()));
    assert!(stdout(&o).contains("from 264 to 512 rows"), "{}", stdout(&o));
    let (orig, padded) = (read_full(Path::new(&p("orig"))).unwrap(), read_full(Path::new(&p("t4pad"))).unwrap());
    assert_eq!(padded.model.padded_vocab_size, 512);
    let name = "embedding.word_embeddings.weight";
    let h = padded.model.hidden_size;
    let (w, w0) = (&padded.tensors[&format!("param/{name}")], &orig.tensors[&format!("param/{name}")]);
    assert_eq!(w[..264 * h], w0[..]);
    assert!((264..512).all(|r| w[r * h..(r + 1) * h] == w0[263 * h..]));
    assert!(padded.tensors[&format!("adam_v/{name}")][264 * h..].iter().all(|&v| v == 0.0));
    let o = train_on(4, &[&small, &["--eval-iters", "0", "--tensor-model-parallel-size", "4", "--load", &p("t4pad")]]);
    assert_one_error(&o, &["padded_vocab_size is 512 in the checkpoint but 264 here", "--make-vocab-size-divisible-by"]);
    let resumed = ["train", "--load", &p("t4pad"), "--tensor-model-parallel-size", "4", "--exit-interval", "7"];
    ok(mpirun(4, &[&resumed[..], &small, &["--eval-iters", "0"]].concat()));
}

#[test]
fn summa_checkpoints_resume_bit_exactly_and_convert_to_and_from_1d() {
    // A 2-D checkpoint resumes with the uninterrupted run's losses bit for bit, converts to 1-D
    // and to 2.5-D (and the 2.5-D one back to 2-D, tensor for tensor), and every conversion
    // continues the original losses; a mismatched mode is one clear error.
    let dir = scratch("convert-summa");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    let model = ["--data-path", &data, "--train-iters", "8", "--seq-length", "32", "--micro-batch-size", "4"];
    let batch = ["--global-batch-size", "8", "--log-interval", "1", "--eval-iters", "0"];
    let train = |ranks: usize, layout: &[&str], extra: &[&str]| train_on(ranks, &[&model, &batch, layout, extra]);
    let two_d = ["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d"];
    let two_half = ["--tensor-model-parallel-size", "8", "--tensor-parallel-mode", "2.5d", "--tesseract-depth", "2"];
    ok(train(4, &two_d, &["--log-json", &p("whole.jsonl")]));
    ok(train(4, &two_d, &["--save", &p("orig"), "--exit-interval", "4"]));
    ok(train(4, &two_d, &["--load", &p("orig"), "--log-json", &p("resumed.jsonl")]));
    let whole = loss_values(Path::new(&p("whole.jsonl")));
    let resumed = loss_values(Path::new(&p("resumed.jsonl")));
    assert_eq!(resumed.len(), 4);
    for (a, b) in resumed.iter().zip(&whole[4..]) {
        assert_eq!(a.to_bits(), b.to_bits(), "resumed 2-D loss {a} vs uninterrupted {b}");
    }

    ok(run(&["convert", "--load", &p("orig"), "--save", &p("one")]));
    let to_25 = ["--target-tensor-parallel-size", "8", "--target-tensor-parallel-mode", "2.5d"];
    let depth = ["--target-tesseract-depth", "2"];
    ok(run(&[&["convert", "--load", &p("orig"), "--save", &p("t25")][..], &to_25, &depth].concat()));
    let to_2d = ["--target-tensor-parallel-size", "4", "--target-tensor-parallel-mode", "2d"];
    ok(run(&["convert", "--load", &p("t25"), "--save", &p("back"), to_2d[0], to_2d[1], to_2d[2], to_2d[3]]));
    assert_same_tensors(&p("orig"), &p("back"), "");

    ok(train(1, &[], &["--load", &p("one"), "--log-json", &p("one.jsonl")]));
    ok(train(8, &two_half, &["--load", &p("t25"), "--log-json", &p("t25.jsonl")]));
    for name in ["one.jsonl", "t25.jsonl"] {
        assert_continues(&p(name), &whole[4..], "the 2-D run's");
    }
    let o = train(1, &[], &["--load", &p("orig")]);
    assert_clean_error(&o, &["--tensor-parallel-mode 2d (q 2)", "trident convert"]);
}

#[test]
fn hugging_face_export_and_import_round_trip_bit_exactly() {
    let dir = scratch("hf");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    ok(train_on(1, &[&TINY, &["--data-path", &data, "--train-iters", "3", "--save", &p("ckpt")]]));
    ok(run(&["convert", "--load", &p("ckpt"), "--save-hf", &p("hf")]));
    let config = std::fs::read_to_string(dir.join("hf/config.json")).unwrap();
    assert!(config.contains("\"model_type\": \"gpt2\"") && config.contains("\"n_layer\": 4"), "{config}");
    ok(run(&["convert", "--load-hf", &p("hf"), "--save", &p("back")]));
    assert_eq!(assert_same_tensors(&p("ckpt"), &p("back"), "param/"), 4 * 12 + 4);
    // The imported weights train further here.
    ok(train_on(1, &[&TINY, &["--data-path", &data, "--train-iters", "2", "--load", &p("back")]]));

    // A truncated safetensors file names itself.
    let st = dir.join("hf/model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_error(
        &run(&["convert", "--load-hf", &p("hf"), "--save", &p("x")]),
        &["model.safetensors", "truncated"],
    );
    // Another model shape: config.json that disagrees with the tensors.
    std::fs::write(&st, &bytes).unwrap();
    std::fs::write(dir.join("hf/config.json"), config.replace("\"n_embd\": 128", "\"n_embd\": 64")).unwrap();
    assert_clean_error(
        &run(&["convert", "--load-hf", &p("hf"), "--save", &p("x")]),
        &["model.safetensors", "wte.weight", "shape"],
    );
}

#[test]
fn a_hugging_face_gpt2_keeps_its_norm_epsilon_and_its_gelu() {
    let dir = scratch("hf-eps");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    ok(train_on(1, &[&TINY, &["--data-path", &data, "--train-iters", "1", "--save", &p("ckpt")]]));
    ok(run(&["convert", "--load", &p("ckpt"), "--save-hf", &p("hf")]));
    let config_path = dir.join("hf/config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    assert!(config.contains("\"layer_norm_epsilon\": 1e-5"), "{config}");
    // Another epsilon is carried into the checkpoint (where training refuses it for LayerNorm),
    // not silently replaced by the default.
    std::fs::write(&config_path, config.replace("\"layer_norm_epsilon\": 1e-5", "\"layer_norm_epsilon\": 1e-6"))
        .unwrap();
    ok(run(&["convert", "--load-hf", &p("hf"), "--save", &p("back")]));
    assert_eq!(read_full(Path::new(&p("back"))).unwrap().model.arch.norm_epsilon, 1e-6);
    // GPT-2's tanh GELU is "gelu_new"; "gelu" is the exact one, which the model keeps; others are
    // refused by name.
    assert!(config.contains("\"activation_function\": \"gelu_new\""), "{config}");
    std::fs::write(&config_path, config.replace("\"gelu_new\"", "\"gelu\"")).unwrap();
    ok(run(&["convert", "--load-hf", &p("hf"), "--save", &p("erf")]));
    let erf = read_full(Path::new(&p("erf"))).unwrap();
    assert_eq!(erf.model.arch.gelu, trident::device::Gelu::Erf);
    ok(run(&["convert", "--load", &p("erf"), "--save-hf", &p("hf-erf")]));
    let again = std::fs::read_to_string(dir.join("hf-erf/config.json")).unwrap();
    assert!(again.contains("\"activation_function\": \"gelu\""), "{again}");
    std::fs::write(&config_path, config.replace("\"gelu_new\"", "\"relu\"")).unwrap();
    assert_clean_error(&run(&["convert", "--load-hf", &p("hf"), "--save", &p("x")]), &["activation_function relu"]);
}

#[test]
fn bad_checkpoints_give_one_clear_error() {
    let dir = scratch("convert-bad");
    let data = prepared_corpus(&dir);
    let p = |name: &str| dir.join(name).display().to_string();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    assert_clean_error(
        &run(&["convert", "--load", &p("empty"), "--save", &p("x")]),
        &["latest_checkpointed_iteration.txt"],
    );
    ok(train_on(1, &[&TINY, &["--data-path", &data, "--train-iters", "2", "--save", &p("ckpt")]]));
    let shard = dir.join("ckpt/iter_0000002/mp_rank_00/model_optim_rng.bin");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    assert_clean_error(
        &run(&["convert", "--load", &p("ckpt"), "--save", &p("x")]),
        &["model_optim_rng.bin", "checksum"],
    );
    assert_clean_error(&run(&["convert", "--save", &p("x")]), &["--load"]);
}
