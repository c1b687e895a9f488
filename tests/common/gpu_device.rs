//! What the GPU Device tests (`cuda_device.rs`, `hip_device.rs`) share: one body per group of
//! Device ops, run on a vendor's `GpuDevice` and compared with the reference device on a few
//! shapes (ragged ones included), and the small training run both compare with the CPU's `--bf16`.

use super::emu::{bf16_values, check, check_bf16, check_f32, f32_values};
use super::{loss_values, stderr, stdout, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AttentionShape, Device};
use trident::gpu::device::GpuDevice;
use trident::real::Precision;

pub fn up(dev: &GpuDevice, host: &[f32]) -> <GpuDevice as Device>::Buf {
    let mut b = dev.alloc(host.len());
    dev.upload(&mut b, host);
    b
}
pub fn down(dev: &GpuDevice, b: &<GpuDevice as Device>::Buf) -> Vec<f32> {
    let mut host = vec![0f32; dev.len(b)];
    dev.download(b, &mut host);
    host
}
pub fn refb(host: &[f32]) -> Vec<f64> {
    host.iter().map(|&x| x as f64).collect()
}

/// f32 results of f32 (or better) arithmetic: a few roundings of the largest value.
pub fn close(what: &str, got: &[f32], want: &[f64]) {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    check(what, got, want, 2e-5 * scale, 2e-5);
}

pub fn elementwise_ops_match_the_reference(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    for n in [1usize, 1000, 70_001] {
        let a = f32_values(seed, n, "a", 1.0, 0.0);
        let b = f32_values(seed, n, "b", 2.0, 0.5);
        let (ga, gb) = (up(dev, &a), up(dev, &b));
        let (ra, rb) = (refb(&a), refb(&b));
        let mut out = dev.alloc(n);
        dev.add(&mut out, &ga, &gb);
        let mut want = r.alloc(n);
        r.add(&mut want, &ra, &rb);
        close(&format!("add n={n}"), &down(dev, &out), &want);
        let mut acc = up(dev, &a);
        dev.add_assign(&mut acc, &gb);
        close(&format!("add_assign n={n}"), &down(dev, &acc), &want);
        dev.gelu_forward(&mut out, &ga);
        r.gelu_forward(&mut want, &ra);
        close(&format!("gelu_forward n={n}"), &down(dev, &out), &want);
        dev.gelu_backward(&mut out, &ga, &gb);
        r.gelu_backward(&mut want, &ra, &rb);
        close(&format!("gelu_backward n={n}"), &down(dev, &out), &want);
        let ss = dev.sum_squares(&ga);
        let rs = r.sum_squares(&ra);
        assert!((ss - rs).abs() <= 1e-12 * rs.max(1.0), "sum_squares n={n}: {ss} vs {rs}");
        let mut rounded = up(dev, &a);
        dev.round_to(&mut rounded, Precision::Bf16);
        let want_bits: Vec<f32> = a.iter().map(|&x| Precision::Bf16.round(x)).collect();
        assert_eq!(down(dev, &rounded), want_bits, "round_to bf16 n={n}");
        // The 16-bit copy of bf16 values (mixed precision's saved activations) is exact both ways.
        let half = dev.to_half(&rounded, Precision::Bf16);
        assert_eq!(half, want_bits.iter().map(|&x| Precision::Bf16.to_bits16(x)).collect::<Vec<u16>>());
        let mut back = dev.alloc(n);
        dev.load_half(&half, Precision::Bf16, &mut back);
        assert_eq!(down(dev, &back), want_bits, "load_half n={n}");
        dev.fill(&mut rounded, 0.25);
        assert!(down(dev, &rounded).iter().all(|&x| x == 0.25));
        assert!(dev.len(&dev.alloc(n)) == n && down(dev, &dev.alloc(n)).iter().all(|&x| x == 0.0), "alloc is zeroed");
    }
    for (rows, cols) in [(1, 1), (7, 33), (64, 300)] {
        let x = f32_values(seed, rows * cols, "x", 1.0, 0.0);
        let bias = f32_values(seed, cols, "bias", 1.0, 0.0);
        let mut g = up(dev, &x);
        dev.add_bias(&mut g, &up(dev, &bias), rows, cols);
        let mut want = refb(&x);
        r.add_bias(&mut want, &refb(&bias), rows, cols);
        close(&format!("add_bias {rows}x{cols}"), &down(dev, &g), &want);
    }
    for n in [1usize, 999, 20_000] {
        let p = f32_values(seed, n, "p", 1.0, 0.0);
        let g = f32_values(seed, n, "g", 0.1, 0.0);
        let m = f32_values(seed, n, "m", 0.01, 0.0);
        let v: Vec<f32> = f32_values(seed, n, "v", 0.001, 0.0).iter().map(|x| x.abs()).collect();
        let step =
            AdamWStep { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3, grad_scale: 0.5 };
        let (mut gp, mut gm, mut gv) = (up(dev, &p), up(dev, &m), up(dev, &v));
        dev.adamw(&mut gp, &up(dev, &g), &mut gm, &mut gv, step);
        let (mut rp, mut rm, mut rv) = (refb(&p), refb(&m), refb(&v));
        r.adamw(&mut rp, &refb(&g), &mut rm, &mut rv, step);
        close(&format!("adamw param n={n}"), &down(dev, &gp), &rp);
        close(&format!("adamw m n={n}"), &down(dev, &gm), &rm);
        close(&format!("adamw v n={n}"), &down(dev, &gv), &rv);
    }
}

pub fn embeddings_match_the_reference(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    // (batch, seq, hidden, vocab rows, vocab start): a whole vocabulary and a shard of one.
    for (batch, seq, hidden, rows, start) in [(1, 1, 1, 3, 0), (2, 5, 33, 10, 0), (3, 7, 130, 20, 10)] {
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 7 + 3) % 30) as u32).collect();
        let wte = f32_values(seed, rows * hidden, "wte", 1.0, 0.0);
        let wpe = f32_values(seed, (seq + 2) * hidden, "wpe", 1.0, 0.0);
        let dout = f32_values(seed, batch * seq * hidden, "dout", 1.0, 0.0);
        let what = format!("{batch}x{seq}x{hidden} vocab {start}+{rows}");
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &tokens, &up(dev, &wte), start, batch, seq, hidden);
        let mut want = r.alloc(batch * seq * hidden);
        r.embedding_forward(&mut want, &tokens, &refb(&wte), start, batch, seq, hidden);
        close(&format!("embedding_forward {what}"), &down(dev, &out), &want);
        // Positions 2..2+seq of the table, added on top.
        dev.position_forward(&mut out, &up(dev, &wpe), batch, 2, seq, hidden);
        r.position_forward(&mut want, &refb(&wpe), batch, 2, seq, hidden);
        close(&format!("position_forward {what}"), &down(dev, &out), &want);
        // Backward accumulates ("+=") into gradients that already hold values.
        let dwte0 = f32_values(seed, rows * hidden, "dwte", 1.0, 0.0);
        let mut dwte = up(dev, &dwte0);
        dev.embedding_backward(&mut dwte, &up(dev, &dout), &tokens, start, batch, seq, hidden);
        let mut rwte = refb(&dwte0);
        r.embedding_backward(&mut rwte, &refb(&dout), &tokens, start, batch, seq, hidden);
        close(&format!("embedding_backward {what}"), &down(dev, &dwte), &rwte);
        let dwpe0 = f32_values(seed, (seq + 2) * hidden, "dwpe", 1.0, 0.0);
        let mut dwpe = up(dev, &dwpe0);
        dev.position_backward(&mut dwpe, &up(dev, &dout), batch, 2, seq, hidden);
        let mut rwpe = refb(&dwpe0);
        r.position_backward(&mut rwpe, &refb(&dout), batch, 2, seq, hidden);
        close(&format!("position_backward {what}"), &down(dev, &dwpe), &rwpe);
    }
}

pub fn layernorm_whole_and_split_match_the_reference(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    for (rows, cols) in [(1, 1), (5, 33), (13, 200)] {
        let x = f32_values(seed, rows * cols, "x", 2.0, 0.3);
        let w = f32_values(seed, cols, "w", 0.5, 1.0);
        let b = f32_values(seed, cols, "b", 0.5, 0.0);
        let dy = f32_values(seed, rows * cols, "dy", 1.0, 0.0);
        let dx0 = f32_values(seed, rows * cols, "dx0", 1.0, 0.0);
        let what = format!("{rows}x{cols}");
        let (gx, gw, gb, gdy) = (up(dev, &x), up(dev, &w), up(dev, &b), up(dev, &dy));
        let (rx, rw, rb, rdy) = (refb(&x), refb(&w), refb(&b), refb(&dy));
        let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
        dev.layernorm_forward(&mut out, &mut mean, &mut rstd, &gx, &gw, &gb, rows, cols);
        let (mut rout, mut rmean, mut rrstd) = (r.alloc(rows * cols), r.alloc(rows), r.alloc(rows));
        r.layernorm_forward(&mut rout, &mut rmean, &mut rrstd, &rx, &rw, &rb, rows, cols);
        // A one-column row has variance 0 and rstd 1/sqrt(eps): compare relative to its size.
        close(&format!("layernorm out {what}"), &down(dev, &out), &rout);
        close(&format!("layernorm mean {what}"), &down(dev, &mean), &rmean);
        close(&format!("layernorm rstd {what}"), &down(dev, &rstd), &rrstd);
        let (mut dx, mut dw, mut db) = (up(dev, &dx0), up(dev, &b), up(dev, &w));
        dev.layernorm_backward(&mut dx, &mut dw, &mut db, &gdy, &gx, &gw, &mean, &rstd, rows, cols);
        let (mut rdx, mut rdw, mut rdb) = (refb(&dx0), refb(&b), refb(&w));
        r.layernorm_backward(&mut rdx, &mut rdw, &mut rdb, &rdy, &rx, &rw, &rmean, &rrstd, rows, cols);
        close(&format!("layernorm dinp {what}"), &down(dev, &dx), &rdx);
        close(&format!("layernorm dweight {what}"), &down(dev, &dw), &rdw);
        close(&format!("layernorm dbias {what}"), &down(dev, &db), &rdb);

        // The split pieces, on this slice of columns as if it were a whole row.
        let (mut s, mut rs) = (vec![0f64; rows], vec![0f64; rows]);
        dev.layernorm_sums(&gx, rows, cols, None, &mut s);
        r.layernorm_sums(&rx, rows, cols, None, &mut rs);
        close(&format!("layernorm_sums {what}"), &s.iter().map(|&v| v as f32).collect::<Vec<_>>(), &rs);
        let mu: Vec<f64> = rs.iter().map(|v| v / cols as f64).collect();
        dev.layernorm_sums(&gx, rows, cols, Some(&mu), &mut s);
        r.layernorm_sums(&rx, rows, cols, Some(&mu), &mut rs);
        close(&format!("layernorm_sums centred {what}"), &s.iter().map(|&v| v as f32).collect::<Vec<_>>(), &rs);
        let rstd_h: Vec<f64> = rs.iter().map(|v| 1.0 / (v / cols as f64 + 1e-5).sqrt()).collect();
        dev.layernorm_apply(&mut out, &mut mean, &mut rstd, &gx, &gw, &gb, &mu, &rstd_h, rows, cols);
        r.layernorm_apply(&mut rout, &mut rmean, &mut rrstd, &rx, &rw, &rb, &mu, &rstd_h, rows, cols);
        close(&format!("layernorm_apply {what}"), &down(dev, &out), &rout);
        let (mut bs, mut rbs) = (vec![0f64; 2 * rows], vec![0f64; 2 * rows]);
        dev.layernorm_backward_sums(&gdy, &gx, &gw, &mean, &rstd, rows, cols, &mut bs);
        r.layernorm_backward_sums(&rdy, &rx, &rw, &rmean, &rrstd, rows, cols, &mut rbs);
        close(&format!("layernorm_backward_sums {what}"), &bs.iter().map(|&v| v as f32).collect::<Vec<_>>(), &rbs);
        let (mut dx, mut dw, mut db) = (up(dev, &dx0), up(dev, &b), up(dev, &w));
        dev.layernorm_backward_apply(&mut dx, &mut dw, &mut db, &gdy, &gx, &gw, &mean, &rstd, &rbs, cols, rows, cols);
        let (mut rdx, mut rdw, mut rdb) = (refb(&dx0), refb(&b), refb(&w));
        r.layernorm_backward_apply(
            &mut rdx, &mut rdw, &mut rdb, &rdy, &rx, &rw, &rmean, &rrstd, &rbs, cols, rows, cols,
        );
        close(&format!("layernorm_backward_apply dinp {what}"), &down(dev, &dx), &rdx);
        close(&format!("layernorm_backward_apply dweight {what}"), &down(dev, &dw), &rdw);
        close(&format!("layernorm_backward_apply dbias {what}"), &down(dev, &db), &rdb);
    }
}

pub fn cross_entropy_pieces_match_the_reference(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    for (rows, vocab, start) in [(1, 1, 0), (3, 333, 0), (6, 1000, 500)] {
        let logits = f32_values(seed, rows * vocab, "logits", 3.0, 0.0);
        let targets: Vec<u32> = (0..rows).map(|i| ((i * 389) % (start + vocab)) as u32).collect();
        let what = format!("{rows}x{vocab} from {start}");
        let (g, rl) = (up(dev, &logits), refb(&logits));
        let (mut max, mut rmax) = (vec![0f64; rows], vec![0f64; rows]);
        dev.cross_entropy_max(&g, rows, vocab, &mut max);
        r.cross_entropy_max(&rl, rows, vocab, &mut rmax);
        assert_eq!(max, rmax, "cross_entropy_max {what}");
        let (mut se, mut tl, mut rse, mut rtl) =
            (vec![0f64; rows], vec![0f64; rows], vec![0f64; rows], vec![0f64; rows]);
        dev.cross_entropy_partials(&g, &targets, start, rows, vocab, &max, &mut se, &mut tl);
        r.cross_entropy_partials(&rl, &targets, start, rows, vocab, &rmax, &mut rse, &mut rtl);
        close(&format!("sum_exp {what}"), &se.iter().map(|&v| v as f32).collect::<Vec<_>>(), &rse);
        assert_eq!(tl, rtl, "target_logit {what}");
        let mut gg = up(dev, &logits);
        dev.cross_entropy_backward(&mut gg, &targets, start, rows, vocab, &max, &se, 0.5);
        let mut rg = rl.clone();
        r.cross_entropy_backward(&mut rg, &targets, start, rows, vocab, &rmax, &rse, 0.5);
        check(&format!("cross_entropy_backward {what}"), &down(dev, &gg), &rg, 1e-6, 1e-5);
    }
}

pub fn linear_layers_match_the_reference_on_bf16_operands(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    dev.set_matmul_precision(Precision::Bf16);
    for (rows, k, n) in [(1, 1, 1), (37, 72, 130), (100, 33, 70)] {
        // The GEMMs round their operands to bf16: the reference gets the same bf16 values.
        let x = bf16_values(seed, rows * k, "x", 1.0);
        let w = bf16_values(seed, n * k, "w", 0.2);
        let bias = f32_values(seed, n, "bias", 0.5, 0.0);
        let dy = bf16_values(seed, rows * n, "dy", 1.0);
        let dw0 = f32_values(seed, n * k, "dw0", 1.0, 0.0);
        let what = format!("{rows}x{k}->{n}");
        let (gx, gw, gbias, gdy) = (up(dev, &x), up(dev, &w), up(dev, &bias), up(dev, &dy));
        let (rx, rw, rbias, rdy) = (refb(&x), refb(&w), refb(&bias), refb(&dy));
        for with_bias in [false, true] {
            let mut out = dev.alloc(rows * n);
            dev.linear_forward(&mut out, &gx, &gw, with_bias.then_some(&gbias), rows, k, n);
            let mut want = r.alloc(rows * n);
            r.linear_forward(&mut want, &rx, &rw, with_bias.then_some(&rbias), rows, k, n);
            close(&format!("linear_forward {what} bias {with_bias}"), &down(dev, &out), &want);
        }
        // dinp overwrites (it starts as garbage), dweight and dbias accumulate.
        let mut dx = up(dev, &vec![7.0; rows * k]);
        let (mut dw, mut db) = (up(dev, &dw0), up(dev, &bias));
        dev.linear_backward(Some(&mut dx), &mut dw, Some(&mut db), &gdy, &gx, &gw, rows, k, n);
        let (mut rdx, mut rdw, mut rdb) = (r.alloc(rows * k), refb(&dw0), refb(&bias));
        r.linear_backward(Some(&mut rdx), &mut rdw, Some(&mut rdb), &rdy, &rx, &rw, rows, k, n);
        close(&format!("linear_backward dinp {what}"), &down(dev, &dx), &rdx);
        close(&format!("linear_backward dweight {what}"), &down(dev, &dw), &rdw);
        close(&format!("linear_backward dbias {what}"), &down(dev, &db), &rdb);
        let mut dw = up(dev, &dw0);
        dev.linear_backward(None, &mut dw, None, &gdy, &gx, &gw, rows, k, n);
        close(&format!("linear_backward dweight only {what}"), &down(dev, &dw), &rdw);
    }
}

pub fn attention_matches_the_reference_within_the_bf16_rule(dev: &GpuDevice, seed: u64) {
    let r = ReferenceDevice;
    for (batch, seq, heads, head_dim) in [(1, 1, 1, 64), (2, 37, 2, 64), (1, 70, 1, 128)] {
        let shape = AttentionShape { batch, seq, heads, head_dim };
        let (rows, w) = (shape.rows(), shape.width());
        let qkv = bf16_values(seed, 3 * rows * w, "qkv", 1.0);
        let dout = bf16_values(seed, rows * w, "dout", 1.0);
        let what = format!("b{batch} s{seq} h{heads} d{head_dim}");
        let gq = up(dev, &qkv);
        let (mut out, mut lse) = (dev.alloc(rows * w), dev.alloc(rows * heads));
        dev.attention_forward(&mut out, &mut lse, &gq, shape);
        let (mut rout, mut rlse) = (r.alloc(rows * w), r.alloc(rows * heads));
        r.attention_forward(&mut rout, &mut rlse, &refb(&qkv), shape);
        check_bf16(&format!("attention out {what}"), &down(dev, &out), &rout);
        check_f32(&format!("attention lse {what}"), &down(dev, &lse), &rlse, 1e-4);
        // Backward from the device's own forward (bf16 out), as training runs it.
        let out_host = down(dev, &out);
        let lse_host = down(dev, &lse);
        let mut dqkv = up(dev, &vec![9.0; 3 * rows * w]);
        dev.attention_backward(&mut dqkv, &up(dev, &dout), &gq, &out, &lse, shape);
        let mut rdqkv = r.alloc(3 * rows * w);
        r.attention_backward(&mut rdqkv, &refb(&dout), &refb(&qkv), &refb(&out_host), &refb(&lse_host), shape);
        check_bf16(&format!("attention dqkv {what}"), &down(dev, &dqkv), &rdqkv);
    }
}

pub fn run_with(env: &[(&'static str, PathBuf)], args: &[&str]) -> std::process::Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the trident binary runs")
}

/// A model small enough for the emulation: 2 layers, hidden 128 in 2 heads of 64, seq 16.
pub const TINY_GPU: &[&str] = &[
    "--num-layers",
    "2",
    "--hidden-size",
    "128",
    "--num-attention-heads",
    "2",
    "--seq-length",
    "16",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "4",
    "--lr",
    "1e-3",
    "--log-interval",
    "1",
    "--eval-iters",
    "1",
    "--bf16",
];

/// Trains 6 iterations on `ranks` ranks (under mpirun when more than one) and returns the losses.
pub fn train_losses(
    env: &[(&'static str, PathBuf)],
    dir: &Path,
    data: &str,
    device: &str,
    ranks: usize,
    extra: &[&str],
) -> Vec<f64> {
    let log = dir.join(format!("{device}-{ranks}-{}.jsonl", extra.join("").replace(['-', '/'], "")));
    let log_s = log.to_str().unwrap().to_string();
    let mut args = vec!["train", "--device", device, "--data-path", data, "--train-iters", "6"];
    args.extend_from_slice(TINY_GPU);
    args.extend_from_slice(&["--log-json", &log_s, "--cpu-threads", "1"]);
    args.extend_from_slice(extra);
    let t = std::time::Instant::now();
    let o = if ranks == 1 {
        run_with(env, &args)
    } else {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "--allow-run-as-root", "-np", &ranks.to_string(), BIN]).args(&args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("mpirun runs: install Open MPI")
    };
    assert!(o.status.success(), "--device {device} on {ranks} ranks: {}{}", stdout(&o), stderr(&o));
    eprintln!("--device {device} on {ranks} rank(s) {extra:?}: {:.1} s", t.elapsed().as_secs_f64());
    if device != "cpu" {
        assert!(stdout(&o).contains(&format!("device {device}: Emulated")), "{}", stdout(&o));
    }
    // Callers check the count: a run stopped by --exit-interval logs fewer.
    loss_values(&log)
}
