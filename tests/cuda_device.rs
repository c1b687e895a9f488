//! The CUDA Device on a machine without a GPU: `tests/gpu/emu_libcuda.cpp` is a CUDA driver that
//! runs the kernels under the SIMT emulation (built here with g++ and loaded through
//! `TRIDENT_LIBCUDA`), and the pip wheel's NVRTC really compiles them to CUBINs that the fake
//! driver checks. Every Device op runs against the reference device on a few shapes (ragged ones
//! included), and `trident train --device cuda --bf16` follows the CPU's `--bf16` losses.
//!
//! NVRTC comes from `make gpu-test-libs` (or `TRIDENT_NVRTC`); without it these tests fail, unless
//! `TRIDENT_SKIP_NVRTC_TESTS=1` is set, when they say loudly that they skipped.

mod common;
use common::emu::{bf16_values, check, f32_values};
use common::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use trident::device::reference::ReferenceDevice;
use trident::device::{AdamWStep, AttentionShape, Device};
use trident::gpu::device::GpuDevice;
use trident::real::Precision;

const SEED: u64 = 23;

/// NVRTC from `TRIDENT_NVRTC` or `make gpu-test-libs`; None (loudly) under TRIDENT_SKIP_NVRTC_TESTS=1.
fn nvrtc_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TRIDENT_NVRTC") {
        if Path::new(&p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    let root = std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/trident-gpu-libs")).ok();
    let found = root.and_then(|r| std::fs::read_dir(r).ok()).and_then(|entries| {
        let mut libs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("nvidia/cu13/lib/libnvrtc.so.13")))
            .filter(|p| p.is_file())
            .collect();
        libs.sort();
        libs.pop()
    });
    if found.is_some() {
        return found;
    }
    if std::env::var("TRIDENT_SKIP_NVRTC_TESTS").as_deref() == Ok("1") {
        let _ = writeln!(std::io::stderr(), "!!!!! SKIPPED: no NVRTC (TRIDENT_NVRTC, `make gpu-test-libs`); TRIDENT_SKIP_NVRTC_TESTS=1 skips the CUDA Device tests !!!!!");
        return None;
    }
    panic!("no NVRTC: run `make gpu-test-libs` or set TRIDENT_NVRTC (or TRIDENT_SKIP_NVRTC_TESTS=1 to skip)");
}

/// The emulating driver, built once per test process (about 6 s), and the environment that
/// points trident at it, at NVRTC and at a kernel cache kept between runs.
struct Emulated {
    env: Vec<(&'static str, PathBuf)>,
}

fn emulated() -> Option<&'static Emulated> {
    static BUILT: OnceLock<Option<Emulated>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let nvrtc = nvrtc_path()?;
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-device");
            std::fs::create_dir_all(&dir).unwrap();
            // Built under a private name, then renamed over the shared one (a process that still
            // has the old file mapped keeps it).
            let building = dir.join(format!("libcuda-emu.so.{}", std::process::id()));
            let lib = dir.join("libcuda-emu.so");
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/emu_libcuda.cpp");
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
            let out = Command::new(&cxx)
                .args([
                    "-std=c++20",
                    "-O2",
                    "-shared",
                    "-fPIC",
                    "-DTRIDENT_EMU",
                    "-pthread",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                ])
                .arg(&src)
                .arg("-o")
                .arg(&building)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cxx} (install g++): {e}"));
            assert!(
                out.status.success(),
                "building the emulating driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&building, &lib).unwrap();
            let env = vec![
                ("TRIDENT_LIBCUDA", lib),
                ("TRIDENT_NVRTC", nvrtc),
                ("TRIDENT_CACHE_DIR", dir.join("kernel-cache")),
            ];
            for (k, v) in &env {
                // Every test of this process sets the same values, before any driver is loaded.
                std::env::set_var(k, v);
            }
            Some(Emulated { env })
        })
        .as_ref()
}

/// One CUDA Device for the whole test process (its kernels compile once).
fn device() -> Option<&'static GpuDevice> {
    static DEV: OnceLock<Option<GpuDevice>> = OnceLock::new();
    DEV.get_or_init(|| {
        emulated()?;
        Some(GpuDevice::cuda(0).unwrap_or_else(|e| panic!("the CUDA Device on the emulated driver: {e}")))
    })
    .as_ref()
}

fn up(dev: &GpuDevice, host: &[f32]) -> <GpuDevice as Device>::Buf {
    let mut b = dev.alloc(host.len());
    dev.upload(&mut b, host);
    b
}
fn down(dev: &GpuDevice, b: &<GpuDevice as Device>::Buf) -> Vec<f32> {
    let mut host = vec![0f32; dev.len(b)];
    dev.download(b, &mut host);
    host
}
fn refb(host: &[f32]) -> Vec<f64> {
    host.iter().map(|&x| x as f64).collect()
}

/// f32 results of f32 (or better) arithmetic: a few roundings of the largest value.
fn close(what: &str, got: &[f32], want: &[f64]) {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    check(what, got, want, 2e-5 * scale, 2e-5);
}

#[test]
fn device_to_device_copies_move_exactly_the_range_and_the_default_copy_agrees() {
    let Some(dev) = device() else { return };
    let src: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let g = up(dev, &src);
    let mut dst = up(dev, &vec![-1.0; 600]);
    dev.copy(&mut dst, 100, &g, 337, 401);
    dev.copy(&mut dst, 0, &g, 0, 0);
    let got = down(dev, &dst);
    let mut want = vec![-1.0f32; 600];
    want[100..501].copy_from_slice(&src[337..738]);
    assert_eq!(got, want);
    // The trait's default (host staging), as the CPU backend runs it, does the same.
    let cpu = trident::device::cpu::CpuDevice::new(1);
    let mut c_dst = cpu.alloc(600);
    cpu.upload(&mut c_dst, &[-1.0; 600]);
    let mut c_src = cpu.alloc(1000);
    cpu.upload(&mut c_src, &src);
    cpu.copy(&mut c_dst, 100, &c_src, 337, 401);
    let mut c_got = vec![0f32; 600];
    cpu.download(&c_dst, &mut c_got);
    assert_eq!(c_got, want);
    // No communicator for a group the Device was not given: host staging.
    assert!(dev.device_comm(&trident::comm::SelfComm).is_none());
}

#[test]
fn elementwise_ops_match_the_reference() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    for n in [1usize, 1000, 70_001] {
        let a = f32_values(SEED, n, "a", 1.0, 0.0);
        let b = f32_values(SEED, n, "b", 2.0, 0.5);
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
        let x = f32_values(SEED, rows * cols, "x", 1.0, 0.0);
        let bias = f32_values(SEED, cols, "bias", 1.0, 0.0);
        let mut g = up(dev, &x);
        dev.add_bias(&mut g, &up(dev, &bias), rows, cols);
        let mut want = refb(&x);
        r.add_bias(&mut want, &refb(&bias), rows, cols);
        close(&format!("add_bias {rows}x{cols}"), &down(dev, &g), &want);
    }
    for n in [1usize, 999, 20_000] {
        let p = f32_values(SEED, n, "p", 1.0, 0.0);
        let g = f32_values(SEED, n, "g", 0.1, 0.0);
        let m = f32_values(SEED, n, "m", 0.01, 0.0);
        let v: Vec<f32> = f32_values(SEED, n, "v", 0.001, 0.0).iter().map(|x| x.abs()).collect();
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

#[test]
fn embeddings_match_the_reference() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    // (batch, seq, hidden, vocab rows, vocab start): a whole vocabulary and a shard of one.
    for (batch, seq, hidden, rows, start) in [(1, 1, 1, 3, 0), (2, 5, 33, 10, 0), (3, 7, 130, 20, 10)] {
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 7 + 3) % 30) as u32).collect();
        let wte = f32_values(SEED, rows * hidden, "wte", 1.0, 0.0);
        let wpe = f32_values(SEED, (seq + 2) * hidden, "wpe", 1.0, 0.0);
        let dout = f32_values(SEED, batch * seq * hidden, "dout", 1.0, 0.0);
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
        let dwte0 = f32_values(SEED, rows * hidden, "dwte", 1.0, 0.0);
        let mut dwte = up(dev, &dwte0);
        dev.embedding_backward(&mut dwte, &up(dev, &dout), &tokens, start, batch, seq, hidden);
        let mut rwte = refb(&dwte0);
        r.embedding_backward(&mut rwte, &refb(&dout), &tokens, start, batch, seq, hidden);
        close(&format!("embedding_backward {what}"), &down(dev, &dwte), &rwte);
        let dwpe0 = f32_values(SEED, (seq + 2) * hidden, "dwpe", 1.0, 0.0);
        let mut dwpe = up(dev, &dwpe0);
        dev.position_backward(&mut dwpe, &up(dev, &dout), batch, 2, seq, hidden);
        let mut rwpe = refb(&dwpe0);
        r.position_backward(&mut rwpe, &refb(&dout), batch, 2, seq, hidden);
        close(&format!("position_backward {what}"), &down(dev, &dwpe), &rwpe);
    }
}

#[test]
fn layernorm_whole_and_split_match_the_reference() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    for (rows, cols) in [(1, 1), (5, 33), (13, 200)] {
        let x = f32_values(SEED, rows * cols, "x", 2.0, 0.3);
        let w = f32_values(SEED, cols, "w", 0.5, 1.0);
        let b = f32_values(SEED, cols, "b", 0.5, 0.0);
        let dy = f32_values(SEED, rows * cols, "dy", 1.0, 0.0);
        let dx0 = f32_values(SEED, rows * cols, "dx0", 1.0, 0.0);
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

#[test]
fn cross_entropy_pieces_match_the_reference() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    for (rows, vocab, start) in [(1, 1, 0), (3, 333, 0), (6, 1000, 500)] {
        let logits = f32_values(SEED, rows * vocab, "logits", 3.0, 0.0);
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

#[test]
fn linear_layers_match_the_reference_on_bf16_operands() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    dev.set_matmul_precision(Precision::Bf16);
    for (rows, k, n) in [(1, 1, 1), (37, 72, 130), (100, 33, 70)] {
        // The GEMMs round their operands to bf16: the reference gets the same bf16 values.
        let x = bf16_values(SEED, rows * k, "x", 1.0);
        let w = bf16_values(SEED, n * k, "w", 0.2);
        let bias = f32_values(SEED, n, "bias", 0.5, 0.0);
        let dy = bf16_values(SEED, rows * n, "dy", 1.0);
        let dw0 = f32_values(SEED, n * k, "dw0", 1.0, 0.0);
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

#[test]
fn attention_matches_the_reference_within_the_bf16_rule() {
    let Some(dev) = device() else { return };
    let r = ReferenceDevice;
    for (batch, seq, heads, head_dim) in [(1, 1, 1, 64), (2, 37, 2, 64), (1, 70, 1, 128)] {
        let shape = AttentionShape { batch, seq, heads, head_dim };
        let (rows, w) = (shape.rows(), shape.width());
        let qkv = bf16_values(SEED, 3 * rows * w, "qkv", 1.0);
        let dout = bf16_values(SEED, rows * w, "dout", 1.0);
        let what = format!("b{batch} s{seq} h{heads} d{head_dim}");
        let gq = up(dev, &qkv);
        let (mut out, mut lse) = (dev.alloc(rows * w), dev.alloc(rows * heads));
        dev.attention_forward(&mut out, &mut lse, &gq, shape);
        let (mut rout, mut rlse) = (r.alloc(rows * w), r.alloc(rows * heads));
        r.attention_forward(&mut rout, &mut rlse, &refb(&qkv), shape);
        common::emu::check_bf16(&format!("attention out {what}"), &down(dev, &out), &rout);
        common::emu::check_f32(&format!("attention lse {what}"), &down(dev, &lse), &rlse, 1e-4);
        // Backward from the device's own forward (bf16 out), as training runs it.
        let out_host = down(dev, &out);
        let lse_host = down(dev, &lse);
        let mut dqkv = up(dev, &vec![9.0; 3 * rows * w]);
        dev.attention_backward(&mut dqkv, &up(dev, &dout), &gq, &out, &lse, shape);
        let mut rdqkv = r.alloc(3 * rows * w);
        r.attention_backward(&mut rdqkv, &refb(&dout), &refb(&qkv), &refb(&out_host), &refb(&lse_host), shape);
        common::emu::check_bf16(&format!("attention dqkv {what}"), &down(dev, &dqkv), &rdqkv);
    }
    let e = GpuDevice::check_head_dim(96).unwrap_err().to_string();
    assert!(e.contains("head dims 64 and 128") && e.contains("is 96"), "{e}");
}

fn run_with(env: &[(&'static str, PathBuf)], args: &[&str]) -> std::process::Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the trident binary runs")
}

/// A model small enough for the emulation: 2 layers, hidden 128 in 2 heads of 64, seq 16.
const TINY_GPU: &[&str] = &[
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
fn train_losses(
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
    if device == "cuda" {
        assert!(stdout(&o).contains("device cuda: Emulated A100"), "{}", stdout(&o));
    }
    loss_values(&log)
}

#[test]
fn train_on_cuda_follows_the_cpu_bf16_losses_and_parallel_layouts_follow_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-train");
    let data = prepared_corpus(&dir);
    let cpu = train_losses(&emu.env, &dir, &data, "cpu", 1, &[]);
    let gpu = train_losses(&emu.env, &dir, &data, "cuda", 1, &[]);
    for (i, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        let rel = (c - g).abs() / c.abs();
        eprintln!("iteration {}: cpu {c:.6} cuda {g:.6} (relative difference {rel:.2e})", i + 1);
        // Both round GEMM operands to bf16; attention differs (the CPU's in f32, the GPU's with
        // bf16 probabilities and outputs), so the curves agree to bf16 precision, not bit for bit.
        assert!(rel < 5e-3, "iteration {}: cpu loss {c}, cuda loss {g}", i + 1);
    }
    assert_eq!((cpu.len(), gpu.len()), (6, 6));
    assert!(gpu.windows(2).any(|w| w[0] != w[1]), "the cuda loss never changed");
    // Deterministic, and a checkpoint of device buffers resumes the run bit for bit.
    let ckpt = dir.join("ckpt");
    let ckpt_s = ckpt.to_str().unwrap();
    let first = train_losses(&emu.env, &dir, &data, "cuda", 1, &["--save", ckpt_s, "--exit-interval", "3"]);
    let resumed = train_losses(&emu.env, &dir, &data, "cuda", 1, &["--load", ckpt_s]);
    assert_eq!(first, gpu[..3], "a second run differs");
    assert_eq!(resumed, gpu[3..], "the resumed run differs from the uninterrupted one");
    // Tensor x pipeline parallel on the CUDA Device, through the host-staged MPI path: the same
    // run as one rank, up to the reduction order's f32 rounding (and the bf16 roundings after it).
    // 2-D tensor parallelism (SUMMA) adds the split LayerNorm (`layernorm_sums` and friends).
    // (`--gpu-collectives mpi`; `nccl_collectives_*` below runs the NCCL path.)
    let layouts: [(&str, &[&str]); 2] = [
        (
            "TP 2 x PP 2",
            &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--gpu-collectives", "mpi"],
        ),
        (
            "2-D TP 2 x 2",
            &["--tensor-model-parallel-size", "4", "--tensor-parallel-mode", "2d", "--gpu-collectives", "mpi"],
        ),
    ];
    for (name, flags) in layouts {
        let parallel = train_losses(&emu.env, &dir, &data, "cuda", 4, flags);
        assert_eq!(parallel.len(), 6, "{name}");
        for (i, (one, four)) in gpu.iter().zip(&parallel).enumerate() {
            let rel = (one - four).abs() / one.abs();
            eprintln!("iteration {}: cuda on 1 rank {one:.6}, {name} {four:.6} (relative difference {rel:.2e})", i + 1);
            assert!(rel < 1e-3, "iteration {}: one rank {one}, {name} {four}", i + 1);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The fake NCCL (`tests/gpu/fake_libnccl.c`: ranks meet in POSIX shared memory and read device
/// pointers as host pointers, which the emulating driver's device memory is), built into `dir`.
fn fake_nccl(dir: &Path) -> PathBuf {
    let lib = dir.join("libnccl.so.2");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/fake_libnccl.c");
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&lib)
        .arg(src)
        .args(["-lpthread", "-ldl"])
        .output()
        .expect("cc runs");
    assert!(o.status.success(), "{}", stderr(&o));
    lib
}

/// The operations the fake NCCL logged (FAKE_NCCL_LOG), counted by name.
fn nccl_calls(log: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *counts.entry(line.split(' ').next().unwrap_or("").to_string()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn nccl_collectives_on_device_memory_match_mpi_and_one_rank() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-train");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let one = train_losses(&emu.env, &dir, &data, "cuda", 1, &[]);
    // (name, ranks, flags, the operations the NCCL path must have run)
    let layouts: [(&str, usize, &[&str], &[&str]); 3] = [
        (
            "TP 2 x PP 2",
            4,
            &["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
            &["all_reduce"],
        ),
        ("DP 2 with ZeRO-1", 2, &["--use-distributed-optimizer"], &["reduce_scatter", "all_gather"]),
        (
            "TP 2 x DP 2, sequence parallel",
            4,
            &["--tensor-model-parallel-size", "2", "--sequence-parallel"],
            &["all_gather", "reduce_scatter", "all_reduce"],
        ),
    ];
    for (name, ranks, flags, ops) in layouts {
        let mut losses = Vec::new();
        for path in ["nccl", "mpi"] {
            let log = dir.join(format!("nccl-{}-{path}.log", name.replace(' ', "")));
            let _ = std::fs::remove_file(&log);
            let mut env = emu.env.clone();
            env.push(("TRIDENT_NCCL", nccl.clone()));
            env.push(("FAKE_NCCL_LOG", log.clone()));
            let mut args = flags.to_vec();
            args.extend_from_slice(&["--gpu-collectives", path]);
            losses.push(train_losses(&env, &dir, &data, "cuda", ranks, &args));
            let calls = nccl_calls(&log);
            eprintln!("{name}, --gpu-collectives {path}: NCCL calls on all ranks {calls:?}");
            if path == "nccl" {
                for op in ops {
                    assert!(calls.get(*op).is_some_and(|&n| n > 0), "{name}: no {op} through NCCL: {calls:?}");
                }
            } else {
                assert!(calls.is_empty(), "{name}: --gpu-collectives mpi called NCCL: {calls:?}");
            }
        }
        // Both paths sum in rank order (the fake NCCL by construction, MPI over two ranks
        // trivially), so they agree bit for bit; one rank differs by the reduction order only.
        assert_eq!(losses[0], losses[1], "{name}: NCCL and MPI paths differ");
        for (i, (a, b)) in one.iter().zip(&losses[0]).enumerate() {
            let rel = (a - b).abs() / a.abs();
            assert!(rel < 1e-3, "iteration {}: one rank {a}, {name} {b}", i + 1);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn log_comm_counts_the_nccl_path_as_the_mpi_path() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-logcomm");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let report = |path: &str| {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "--allow-run-as-root", "-np", "2", BIN, "train", "--device", "cuda"])
            .args(["--data-path", &data, "--train-iters", "2", "--log-comm"])
            .args(TINY_GPU)
            .args(["--tensor-model-parallel-size", "2", "--cpu-threads", "1", "--gpu-collectives", path]);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        c.env("TRIDENT_NCCL", &nccl).env("TRIDENT_RCCL", &nccl);
        let o = c.output().expect("mpirun runs");
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let lines: Vec<String> =
            out.lines().filter(|l| l.starts_with("   layer") || l.starts_with("   step")).map(String::from).collect();
        assert!(out.contains(&format!("--gpu-collectives {path}")), "{out}");
        if path != "mpi" {
            assert!(out.contains(&format!("collectives: {} ", path.to_uppercase())), "{out}");
        }
        lines
    };
    let (on_device, on_host) = (report("nccl"), report("mpi"));
    assert!(on_device.iter().any(|l| l.contains("tensor group of 2") && !l.contains(": 0 (")), "{on_device:?}");
    assert_eq!(on_device, on_host);
    // RCCL is the same table from TRIDENT_RCCL (here the same fake library).
    assert_eq!(report("rccl"), on_host);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn nccl_training_ends_on_a_dead_peer_or_a_missing_library_with_one_clear_line() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-nccl-fail");
    let data = prepared_corpus(&dir);
    let nccl = fake_nccl(&dir);
    let mut args = vec!["train", "--device", "cuda", "--data-path", &data, "--train-iters", "4"];
    args.extend_from_slice(TINY_GPU);
    args.extend_from_slice(&["--tensor-model-parallel-size", "2", "--cpu-threads", "1"]);
    let mpirun = |env: &[(&str, &Path)]| {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "--allow-run-as-root", "-np", "2", BIN]).args(&args);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let t = std::time::Instant::now();
        let o = c.output().expect("mpirun runs");
        (o, t.elapsed())
    };
    // Rank 1 stops taking part at its 20th collective (during the first iteration's backward);
    // the fake NCCL gives up after 2 s and rank 0 ends with NCCL's error.
    let (o, took) = mpirun(&[
        ("TRIDENT_NCCL", &nccl),
        ("FAKE_NCCL_FAIL_RANK", Path::new("1")),
        ("FAKE_NCCL_FAIL_AT", Path::new("20")),
        ("FAKE_NCCL_TIMEOUT_SECS", Path::new("2")),
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("trident: error: rank 0: NCCL: ncclAllReduce failed with ncclRemoteError (6)")
                && l.contains("rank 1 did not arrive at ncclAllReduce within 2 s")
                && l.ends_with("(--gpu-collectives)")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // No NCCL library: one line naming the flag and the way out, every rank exits non-zero.
    let (o, _) = mpirun(&[("TRIDENT_NCCL", Path::new("/nonexistent/libnccl.so.2"))]);
    let err = stderr(&o);
    assert!(!o.status.success());
    let lines: Vec<_> = err.lines().filter(|l| l.starts_with("trident: error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("--gpu-collectives nccl: ") && lines[0].contains("--gpu-collectives mpi"), "{err}");
    // Flag values.
    let o =
        run_with(&emu.env, &["train", "--device", "cuda", "--bf16", "--gpu-collectives", "gloo", "--data-path", "x"]);
    assert_clean_error(&o, &["--gpu-collectives", "gloo", "nccl, rccl or mpi"]);
    let o = run_with(&emu.env, &["train", "--gpu-collectives", "nccl", "--data-path", "x"]);
    assert_clean_error(&o, &["--gpu-collectives nccl moves device memory and needs --device cuda"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cuda_without_bf16_or_with_another_head_dim_is_a_clear_error() {
    let Some(emu) = emulated() else { return };
    let o = run_with(&emu.env, &["train", "--device", "cuda", "--preset", "tiny", "--data-path", "x"]);
    assert_clean_error(&o, &["--device cuda needs --bf16"]);
    let dir = scratch("cuda-headdim");
    let data = prepared_corpus(&dir);
    let mut args = vec!["train", "--device", "cuda", "--data-path", &data, "--train-iters", "1"];
    args.extend_from_slice(TINY_GPU);
    let pos = args.iter().position(|a| *a == "--num-attention-heads").unwrap();
    args[pos + 1] = "4";
    let o = run_with(&emu.env, &args);
    assert_clean_error(&o, &["head dims 64 and 128", "is 32"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_gpu_compares_the_device_with_the_reference() {
    let Some(emu) = emulated() else { return };
    let o = run_with(&emu.env, &["check", "gpu"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("trident_smoke_axpy launched over 1048579 elements") && out.contains("result exact"), "{out}");
    assert!(
        out.contains("gpu check: device 0: the CUDA Device matches the reference device on 126 op outputs"),
        "{out}"
    );
    assert!(out.contains("gpu check: passed on 1 NVIDIA device"), "{out}");
}

#[test]
fn the_emulating_driver_checks_images_names_and_launches() {
    use trident::gpu::cache::ModuleCache;
    use trident::gpu::device::{CudaRuntime, GpuRuntime};
    use trident::gpu::driver::Driver;
    use trident::gpu::kernels::KernelModules;
    let Some(emu) = emulated() else { return };
    let rt = CudaRuntime::new(Driver::load().unwrap(), 0).unwrap();
    let cache = emu.env.iter().find(|(k, _)| *k == "TRIDENT_CACHE_DIR").unwrap().1.clone();
    let image = KernelModules::new(ModuleCache::new(&cache)).image("casts.cu", "sm_80").unwrap();
    // A CUBIN loads; a name it does not hold is not found, even one another file defines.
    let module = rt.load_module(&image.bytes).unwrap();
    assert!(rt.function(module, "cast_f32_to_bf16").is_ok());
    let e = rt.function(module, "add_f32").unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_NOT_FOUND"), "{e}");
    // PTX text (or anything not ELF) is refused.
    let e = rt.load_module(b".version 8.0\n.target sm_80\0").unwrap_err().to_string();
    assert!(e.contains("cuModuleLoadData") && e.contains("CUDA_ERROR_INVALID_IMAGE"), "{e}");
    // A launch runs (n = 0 elements: nothing to touch); more than 1024 threads per block is refused.
    let f = rt.function(module, "cast_f32_to_bf16").unwrap();
    let (mut out, mut inp, mut n) = (0u64, 0u64, 0i32);
    let mut params: Vec<*mut std::ffi::c_void> =
        vec![(&mut out as *mut u64).cast(), (&mut inp as *mut u64).cast(), (&mut n as *mut i32).cast()];
    assert!(rt.launch(f, [1, 1, 1], [32, 1, 1], &mut params).is_ok());
    let e = rt.launch(f, [1, 1, 1], [2048, 1, 1], &mut params).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_INVALID_VALUE"), "{e}");
}

/// `make gpu-check`'s script end to end on the emulated GPU (small shapes and model, 6
/// iterations): check gpu, check ops, TP 2 x PP 2 on cuda vs cpu; and the same with a loss
/// tolerance no two backends meet, which must fail in the last step.
#[test]
fn gpu_check_script_passes_on_the_emulated_gpu_and_fails_a_tight_tolerance() {
    let Some(emu) = emulated() else { return };
    let dir = scratch("cuda-gpu-check");
    let data = prepared_corpus(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/gpu-check.sh");
    let nccl = fake_nccl(&dir);
    let run = |rtol: &str| {
        let mut c = Command::new("bash");
        c.arg(&script).arg(BIN).arg(&data);
        for (k, v) in &emu.env {
            c.env(k, v);
        }
        // The GPU run's tensors move through NCCL (the fake one, on the emulated device memory).
        c.env("TRIDENT_NCCL", &nccl);
        c.env("GPU_CHECK_ITERS", "6")
            .env("GPU_CHECK_SIZE", "small")
            .env("GPU_CHECK_RTOL", rtol)
            .env("GPU_CHECK_DIR", dir.join(format!("logs-{rtol}")))
            .env(
                "GPU_CHECK_MODEL",
                "--num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 \
                 --global-batch-size 4 --lr 1e-3 --eval-iters 1 --cpu-threads 1",
            );
        c.output().unwrap()
    };
    let o = run("1e-2");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for want in [
        "passed on 1 NVIDIA device",
        "ops check: all 126 outputs within their bounds",
        "losses check: 6 iterations agree",
        "gpu-check: passed on cuda",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    let o = run("1e-9");
    assert!(!o.status.success(), "a 1e-9 loss tolerance passed:\n{}", stdout(&o));
    assert!(stderr(&o).contains("check losses: iteration") && stderr(&o).contains("> 1e-9"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench gemm|attention --device cuda` launch the real kernels on the emulated GPU (one small
/// shape each): a record with the kernel, its grid, the GEMM's spot check against f64, and the
/// A100 datasheet peak the fraction is taken of.
#[test]
fn cuda_benches_launch_their_kernels_on_the_emulated_gpu() {
    let Some(emu) = emulated() else { return };
    let o = run_with(
        &emu.env,
        &["bench", "gemm", "--device", "cuda", "--shape", "256x192x128", "--min-seconds", "0.01", "--json"],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for want in [
        "\"bench\": \"gemm\"",
        "\"shape\": \"256x192x128 NT\"",
        "gemm_fwd_bf16, grid [3, 4, 1], spot check",
        "\"peak\": 312",
    ] {
        assert!(out.contains(want), "{want:?} missing from {out}");
    }
    let o = run_with(
        &emu.env,
        &["bench", "attention", "--device", "cuda", "--shape", "1x128x2x64", "--min-seconds", "0.01"],
    );
    assert!(o.status.success() && stdout(&o).contains("attention_fwd_bf16_d64"), "{}{}", stdout(&o), stderr(&o));
    let o = run_with(&emu.env, &["bench", "attention", "--device", "cuda", "--shape", "1x128x2"]);
    assert_clean_error(&o, &["--shape", "BxSxHxD"]);
}
