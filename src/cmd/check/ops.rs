//! `trident check ops`: every op of a Device run on deterministic inputs and compared with the
//! f64 reference device (what `make gpu-check` runs on a GPU node, and what the tests run on the
//! emulated GPUs through `run_all`), printed as a table and one verdict line. Each case reports its largest error as a fraction of its bound:
//! - f32 arithmetic on exact inputs: `|x - ref| <= 2e-5 (max|ref| + |ref|)`;
//! - bf16 products (GEMMs on bf16 operands, attention): docs/design.md's bf16 rule `1e-2 + 0.079 |ref|`;
//!   with `--fp16` (a GPU's fp16 module: binary16 storage and operands) the rule with fp16's
//!   tolerances, 8 times tighter for its 3 more mantissa bits: `1.25e-3 + 0.079 / 8 |ref|`;
//! - exact ops (`round_to`, `fill`, `cross_entropy_max`, the target logit): equality.
//!
//! Inputs of the 16-bit products are values of the run's 16-bit format already (bf16, or binary16
//! with `--fp16`), so the reference sees exactly the operands the kernels multiply; the rounding,
//! 16-bit copy and AdamW working-copy cases use that format too.

use crate::cmd::flags;
use crate::device::prelude::*;
use crate::device::reference::ReferenceDevice;
use crate::device::{AdamWStep, AdamWTensor, AttentionShape, Device, Dropout};
use crate::device::{Gelu, Gemm, LayerNormSaved, Logits, Matrix, Tokens};
use crate::error::{Error, Result};
use crate::flags::CHECK_OPS_FLAGS;
use crate::real::Precision;
use crate::rng::Stream;

mod attention;

/// Case sizes: `Small` keeps an emulated GPU fast; `Full` adds GPT-2-sized shapes for a real one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Small,
    Full,
}

/// How a case is judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// f32 arithmetic: `rtol (max|ref| + |ref|)`.
    F32(f64),
    /// docs/design.md's bf16 rule: `1e-2 + 0.079 |ref|`.
    Bf16,
    /// The same rule with fp16's tolerances: `1.25e-3 + 0.079 / 8 |ref|`.
    Fp16,
    /// `atol + rtol |ref|`.
    Abs {
        atol: f64,
        rtol: f64,
    },
    Exact,
}

impl Bound {
    fn allows(self, want: f64, scale: f64) -> f64 {
        match self {
            Bound::F32(rtol) => rtol * (scale + want.abs()),
            Bound::Bf16 => 1e-2 + 0.079 * want.abs(),
            Bound::Fp16 => 1.25e-3 + 0.079 / 8.0 * want.abs(),
            Bound::Abs { atol, rtol } => atol + rtol * want.abs(),
            Bound::Exact => 0.0,
        }
    }
}

/// One compared output.
#[derive(Clone, Debug)]
pub struct OpCheck {
    pub op: &'static str,
    pub case: String,
    pub elements: usize,
    /// The largest |error|.
    pub max_error: f64,
    /// Elements outside their bound (a NaN counts).
    pub violations: usize,
    /// The first violation: index, value, reference.
    pub first: Option<(usize, f32, f64)>,
}

impl OpCheck {
    pub fn passed(&self) -> bool {
        self.violations == 0
    }
    /// One table row.
    pub fn line(&self) -> String {
        let verdict = match self.first {
            None => "ok".to_string(),
            Some((i, g, w)) => format!("FAILED: {} of them, element {i} is {g}, the reference {w}", self.violations),
        };
        format!("{:<28} {:<28} {:>9} {:>11.3e}  {verdict}", self.op, self.case, self.elements, self.max_error)
    }
}

/// Compares `got` with `want` under `bound`.
pub fn compare(op: &'static str, case: &str, got: &[f32], want: &[f64], bound: Bound) -> OpCheck {
    let mut c = OpCheck { op, case: case.to_string(), elements: got.len(), max_error: 0.0, violations: 0, first: None };
    if got.len() != want.len() {
        c.violations = 1;
        c.first = Some((got.len().min(want.len()), f32::NAN, f64::NAN));
        return c;
    }
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        if err.is_nan() || err > bound.allows(w, scale) {
            c.violations += 1;
            c.first.get_or_insert((i, g, w));
        }
        if err > c.max_error {
            c.max_error = err;
        }
    }
    c
}

/// Compares one f64 result (host sums) with its reference without rounding it to f32.
fn compare_f64(op: &'static str, case: &str, got: f64, want: f64, bound: Bound) -> OpCheck {
    let err = (got - want).abs();
    let bad = err.is_nan() || err > bound.allows(want, want.abs());
    OpCheck {
        op,
        case: case.to_string(),
        elements: 1,
        max_error: err,
        violations: usize::from(bad),
        first: bad.then_some((0, got as f32, want)),
    }
}

/// Normal values from a named stream (`round` to the 16-bit format for operands of 16-bit
/// products).
fn values(seed: u64, n: usize, name: &str, scale: f64, offset: f64, round: Option<Precision>) -> Vec<f32> {
    let s = Stream::new(seed, name, 11);
    (0..n)
        .map(|i| {
            let x = (offset + scale * s.normal(i as u64)) as f32;
            round.map_or(x, |p| p.round(x))
        })
        .collect()
}

struct Run<'a, D: Device> {
    dev: &'a D,
    seed: u64,
    /// The 16-bit format of the run: bf16, or f16 (`--fp16`).
    half: Precision,
    out: Vec<OpCheck>,
}

impl<D: Device> Run<'_, D> {
    fn up(&self, host: &[f32]) -> D::Buf {
        let mut b = self.dev.alloc(host.len());
        self.dev.upload(&mut b, host);
        b
    }
    fn down(&self, b: &D::Buf) -> Vec<f32> {
        let mut host = vec![0f32; self.dev.len(b)];
        self.dev.download(b, &mut host);
        host
    }
    fn f32s(&self, n: usize, name: &str, scale: f64, offset: f64) -> Vec<f32> {
        values(self.seed, n, name, scale, offset, None)
    }
    /// A buffer of the run's 16-bit format (the device's 16-bit storage) holding `host`.
    fn up16(&self, host: &[f32]) -> D::Buf {
        let mut b = self.dev.alloc_in(host.len(), self.half);
        self.dev.upload(&mut b, host);
        b
    }
    /// Values of the run's 16-bit format.
    fn halves(&self, n: usize, name: &str, scale: f64) -> Vec<f32> {
        values(self.seed, n, name, scale, 0.0, Some(self.half))
    }
    /// The 16-bit products' bound: docs/design.md's rule with the format's tolerances.
    fn half_bound(&self) -> Bound {
        if self.half == Precision::F16 {
            Bound::Fp16
        } else {
            Bound::Bf16
        }
    }
    /// `bf16` or `fp16`: the name of a case of the 16-bit format.
    fn named(&self, bf16: &'static str, fp16: &'static str) -> &'static str {
        if self.half == Precision::F16 {
            fp16
        } else {
            bf16
        }
    }
    fn push(&mut self, op: &'static str, case: &str, got: &[f32], want: &[f64], bound: Bound) {
        self.out.push(compare(op, case, got, want, bound));
    }
    fn push_dev(&mut self, op: &'static str, case: &str, got: &D::Buf, want: &[f64], bound: Bound) {
        let host = self.down(got);
        self.push(op, case, &host, want, bound);
    }
    fn push_host(&mut self, op: &'static str, case: &str, got: &[f64], want: &[f64], bound: Bound) {
        let got: Vec<f32> = got.iter().map(|&v| v as f32).collect();
        // Host sums in f64 are compared at their own scale (f32 storage of the inputs only).
        self.push(op, case, &got, want, bound);
    }
}

fn refb(host: &[f32]) -> Vec<f64> {
    host.iter().map(|&x| x as f64).collect()
}

const F32: Bound = Bound::F32(2e-5);

fn elementwise<D: Device>(run: &mut Run<D>, sizes: &[usize]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &n in sizes {
        let case = format!("n={n}");
        let a = run.f32s(n, "a", 1.0, 0.0);
        let b = run.f32s(n, "b", 2.0, 0.5);
        let (ga, gb) = (run.up(&a), run.up(&b));
        let (ra, rb) = (refb(&a), refb(&b));
        let mut out = dev.alloc(n);
        let mut want = r.alloc(n);
        dev.add(&mut out, &ga, &gb);
        r.add(&mut want, &ra, &rb);
        run.push_dev("add", &case, &out, &want, F32);
        let mut acc = run.up(&a);
        dev.add_assign(&mut acc, &gb);
        run.push_dev("add_assign", &case, &acc, &want, F32);
        let forms =
            [(Gelu::Tanh, "gelu_forward", "gelu_backward"), (Gelu::Erf, "gelu_forward erf", "gelu_backward erf")];
        for (form, fwd, bwd) in forms {
            dev.gelu_forward(&mut out, &ga, form);
            r.gelu_forward(&mut want, &ra, form);
            run.push_dev(fwd, &case, &out, &want, F32);
            dev.gelu_backward(&mut out, &ga, &gb, form);
            r.gelu_backward(&mut want, &ra, &rb, form);
            run.push_dev(bwd, &case, &out, &want, F32);
        }
        // Summed into a device scalar that already holds 1, so the accumulation is checked too.
        let (mut acc, mut racc) = (dev.scalars(2), r.scalars(2));
        dev.write_scalars(&mut acc, &[0.0, 1.0]);
        r.write_scalars(&mut racc, &[0.0, 1.0]);
        dev.sum_squares_into(&[&ga, &gb], &mut acc, 1);
        r.sum_squares_into(&[&ra, &rb], &mut racc, 1);
        let (mut ss, mut rs) = ([0.0; 2], [0.0; 2]);
        dev.read_scalars(&acc, &mut ss);
        r.read_scalars(&racc, &mut rs);
        let (ss, rs) = (ss[1], rs[1]);
        // Compared in f64: the sums are f64 on every backend.
        let exact = Bound::Abs { atol: 1e-12 * rs.max(1.0), rtol: 0.0 };
        run.out.push(compare_f64("sum_squares", &case, ss, rs, exact));
        // The norm and clip factor from the reference's sum, clipping (to a tenth of the norm,
        // under a loss scale of 8) and not (clip 0): exactly the host formula's values.
        let (mut clip, mut rclip) = (dev.scalars(4), r.scalars(4));
        dev.write_scalars(&mut acc, &[rs, rs]);
        dev.clip_scale(&acc, 1, &mut clip, 0, 0.1 * rs.sqrt() / 8.0, 8.0);
        dev.clip_scale(&acc, 0, &mut clip, 2, 0.0, 1.0);
        r.clip_scale(&racc, 1, &mut rclip, 0, 0.1 * rs.sqrt() / 8.0, 8.0);
        r.clip_scale(&racc, 1, &mut rclip, 2, 0.0, 1.0);
        let (mut cs, mut rcs) = ([0.0; 4], [0.0; 4]);
        dev.read_scalars(&clip, &mut cs);
        r.read_scalars(&rclip, &mut rcs);
        for (what, i) in [("clip_scale norm", 0), ("clip_scale factor", 1), ("clip_scale norm, clip 0", 2)] {
            run.out.push(compare_f64(what, &case, cs[i], rcs[i], Bound::Exact));
        }
        run.out.push(compare_f64("clip_scale factor, clip 0", &case, cs[3], 1.0, Bound::Exact));
        let mut rounded = run.up(&a);
        dev.round_to(&mut rounded, run.half);
        let bits: Vec<f64> = a.iter().map(|&x| run.half.round(x) as f64).collect();
        run.push_dev(run.named("round_to bf16", "round_to fp16"), &case, &rounded, &bits, Bound::Exact);
        // The 16-bit copy of 16-bit values (mixed precision's saved activations, in the device's
        // memory) is exact both ways.
        let half = dev.to_half(&rounded, run.half);
        assert_eq!(dev.half_len(&half), n, "to_half keeps the length");
        let mut back = dev.alloc(n);
        dev.load_half(&half, run.half, &mut back);
        let op = run.named("to_half + load_half bf16", "to_half + load_half fp16");
        run.push_dev(op, &case, &back, &bits, Bound::Exact);
        // The run's 16-bit storage (`alloc_in`; a CPU keeps f32 rounded where stored, hence the
        // `round_to`, a no-op on 16-bit storage): upload rounds to nearest even, download, a copy
        // out to f32 and `fill` are exact.
        let mut stored = dev.alloc_in(n, run.half);
        dev.upload(&mut stored, &a);
        dev.round_to(&mut stored, run.half);
        let mut out32 = dev.alloc(n);
        dev.copy(&mut out32, 0, &stored, 0, n);
        let op = run.named("bf16 storage upload + copy", "fp16 storage upload + copy");
        run.push_dev(op, &case, &out32, &bits, Bound::Exact);
        dev.fill(&mut stored, -0.3);
        dev.round_to(&mut stored, run.half);
        let fill = vec![run.half.round(-0.3) as f64; n];
        run.push_dev(run.named("bf16 storage fill", "fp16 storage fill"), &case, &stored, &fill, Bound::Exact);
        dev.fill(&mut rounded, 0.25);
        run.push_dev("fill", &case, &rounded, &vec![0.25; n], Bound::Exact);
        let zeros = dev.alloc(n);
        run.push_dev("alloc (zeroed)", &case, &zeros, &vec![0.0; n], Bound::Exact);
    }
    for (rows, cols) in [(1, 1), (7, 33), (64, 300)] {
        let x = run.f32s(rows * cols, "x", 1.0, 0.0);
        let bias = run.f32s(cols, "bias", 1.0, 0.0);
        let mut g = run.up(&x);
        dev.add_bias(&mut g, &run.up(&bias), Matrix { rows, cols });
        let mut want = refb(&x);
        r.add_bias(&mut want, &refb(&bias), Matrix { rows, cols });
        run.push_dev("add_bias", &format!("{rows}x{cols}"), &g, &want, F32);
    }
    dropout(run);
    for &n in sizes {
        let p = run.f32s(n, "p", 1.0, 0.0);
        let g = run.f32s(n, "g", 0.1, 0.0);
        let m = run.f32s(n, "m", 0.01, 0.0);
        let v: Vec<f32> = run.f32s(n, "v", 0.001, 0.0).iter().map(|x| x.abs()).collect();
        let step = AdamWStep { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3 };
        // The gradient factor is read from the device's scalars (slot 1), as training passes it.
        let (mut scale, mut rscale) = (dev.scalars(2), r.scalars(2));
        dev.write_scalars(&mut scale, &[0.0, 0.5]);
        r.write_scalars(&mut rscale, &[0.0, 0.5]);
        let (mut gp, mut gm, mut gv, mut gw) = (run.up(&p), run.up(&m), run.up(&v), dev.alloc(n));
        let gg = run.up(&g);
        let working = Some((&mut gw, run.half));
        let t = AdamWTensor { param: &mut gp, grad: &gg, m: &mut gm, v: &mut gv, decayed: true, working };
        dev.adamw(t, step, (&scale, 1));
        let (mut rp, mut rm, mut rv) = (refb(&p), refb(&m), refb(&v));
        let rg = refb(&g);
        let t = AdamWTensor { param: &mut rp, grad: &rg, m: &mut rm, v: &mut rv, decayed: true, working: None };
        r.adamw(t, step, (&rscale, 1));
        let case = format!("n={n}");
        run.push_dev("adamw param", &case, &gp, &rp, F32);
        // The working copy written in the same pass is exactly the updated master, rounded.
        let rounded: Vec<f64> = run.down(&gp).iter().map(|&x| run.half.round(x) as f64).collect();
        let op = run.named("adamw working copy bf16", "adamw working copy fp16");
        run.push_dev(op, &case, &gw, &rounded, Bound::Exact);
        run.push_dev("adamw m", &case, &gm, &rm, F32);
        run.push_dev("adamw v", &case, &gv, &rv, F32);
    }
}

/// A dropout site placed inside a larger tensor: samples from beyond 2³² in the counter, a later
/// position and column, p = 0.3 (the masks must agree bit for bit, or the error is whole values).
fn dropout_site(rows: usize, cols: usize) -> Dropout {
    let batch = 3.min(rows.max(1));
    let key = crate::rng::key(7, "dropout");
    let (seq, t0) = (rows.div_ceil(batch) + 5, 5);
    // Positions from the second on 3 further: a context-parallel rank's second chunk.
    let jump = Some((1, 3));
    Dropout {
        p: 0.3,
        key,
        place: 4 * 2 + 3,
        iteration: 9,
        sample0: 1 << 33,
        batch,
        seq,
        t0,
        width: cols + 7,
        col0: 7,
        jump,
    }
}

/// Megatron's bias-dropout-add (with and without a bias) and the in-place dropout.
fn dropout<D: Device>(run: &mut Run<D>) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for (rows, cols) in [(1, 1), (7, 33), (64, 300)] {
        let (n, shape, d) = (rows * cols, Matrix { rows, cols }, dropout_site(rows, cols));
        let (x, resid, bias) =
            (run.f32s(n, "x", 1.0, 0.0), run.f32s(n, "resid", 1.0, 0.0), run.f32s(cols, "bias", 1.0, 0.0));
        let case = format!("{rows}x{cols}");
        for with_bias in [true, false] {
            let (gb, rb) = (run.up(&bias), refb(&bias));
            let mut g = dev.alloc(n);
            dev.bias_dropout_add(&mut g, (&run.up(&resid), &run.up(&x)), with_bias.then_some(&gb), &d, shape);
            let mut want = r.alloc(n);
            r.bias_dropout_add(&mut want, (&refb(&resid), &refb(&x)), with_bias.then_some(&rb), &d, shape);
            let op = if with_bias { "bias_dropout_add" } else { "bias_dropout_add (no bias)" };
            run.push_dev(op, &case, &g, &want, Bound::F32(2e-5));
        }
        let mut g = run.up(&x);
        dev.dropout(&mut g, &d, shape);
        let mut want = refb(&x);
        r.dropout(&mut want, &d, shape);
        run.push_dev("dropout", &case, &g, &want, Bound::F32(2e-5));
    }
}

/// `OptimizerOps::adamw_group` on one group of tensors of `sizes` (and a ragged 2,049: on the GPU, one
/// launch over 2,048-element chunks), every other one decayed, each with a working copy (16-bit
/// storage on even tensors, an f32 copy rounded to 16 bits on odd ones): against the reference's
/// group, its tensors' values end to end in one comparison per output.
fn adamw_group<D: Device>(run: &mut Run<D>, sizes: &[usize]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    let sizes: Vec<usize> = sizes.iter().copied().chain([2049]).collect();
    let host = |what: &str, scale: f64| -> Vec<Vec<f32>> {
        sizes.iter().enumerate().map(|(i, &n)| run.f32s(n, &format!("group {what} {i}"), scale, 0.0)).collect()
    };
    let (p, g, m) = (host("p", 1.0), host("g", 0.1), host("m", 0.01));
    let v: Vec<Vec<f32>> = host("v", 0.001).iter().map(|t| t.iter().map(|x| x.abs()).collect()).collect();
    let step = AdamWStep { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3 };
    let (mut scale, mut rscale) = (dev.scalars(2), r.scalars(2));
    dev.write_scalars(&mut scale, &[0.0, 0.5]);
    r.write_scalars(&mut rscale, &[0.0, 0.5]);
    let ups = |x: &[Vec<f32>]| -> Vec<D::Buf> { x.iter().map(|t| run.up(t)).collect() };
    let (mut gp, gg, mut gm, mut gv) = (ups(&p), ups(&g), ups(&m), ups(&v));
    let mut gw: Vec<D::Buf> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| if i.is_multiple_of(2) { dev.alloc_in(n, run.half) } else { dev.alloc(n) })
        .collect();
    let refs = |x: &[Vec<f32>]| -> Vec<Vec<f64>> { x.iter().map(|t| refb(t)).collect() };
    let (mut rp, rg, mut rm, mut rv) = (refs(&p), refs(&g), refs(&m), refs(&v));
    let tensors = (gp.iter_mut().zip(&gg).zip(gm.iter_mut().zip(gv.iter_mut())).zip(gw.iter_mut()).enumerate())
        .map(|(i, (((param, grad), (m, v)), w))| AdamWTensor {
            param,
            grad,
            m,
            v,
            decayed: i.is_multiple_of(2),
            working: Some((w, run.half)),
        })
        .collect();
    dev.adamw_group(tensors, step, (&scale, 1));
    let tensors = (rp.iter_mut().zip(&rg).zip(rm.iter_mut().zip(rv.iter_mut())).enumerate())
        .map(|(i, ((param, grad), (m, v)))| AdamWTensor {
            param,
            grad,
            m,
            v,
            decayed: i.is_multiple_of(2),
            working: None,
        })
        .collect();
    r.adamw_group(tensors, step, (&rscale, 1));
    let case = format!("{} tensors, {} elements", sizes.len(), sizes.iter().sum::<usize>());
    let downs = |x: &[D::Buf]| -> Vec<f32> { x.iter().flat_map(|b| run.down(b)).collect() };
    let (got_p, got_w) = (downs(&gp), downs(&gw));
    // The working copy written in the same pass is exactly the updated master, rounded.
    let rounded: Vec<f64> = got_p.iter().map(|&x| run.half.round(x) as f64).collect();
    let (got_m, got_v) = (downs(&gm), downs(&gv));
    let flat = |x: Vec<Vec<f64>>| -> Vec<f64> { x.concat() };
    run.push("adamw_group param", &case, &got_p, &flat(rp), F32);
    let op = run.named("adamw_group working copy bf16", "adamw_group working copy fp16");
    run.push(op, &case, &got_w, &rounded, Bound::Exact);
    run.push("adamw_group m", &case, &got_m, &flat(rm), F32);
    run.push("adamw_group v", &case, &got_v, &flat(rv), F32);
}

fn embeddings<D: Device>(run: &mut Run<D>, cases: &[(usize, usize, usize, usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &(batch, seq, hidden, rows, start) in cases {
        let tokens: Vec<u32> = (0..batch * seq).map(|i| ((i * 7 + 3) % (rows + start + 5)) as u32).collect();
        let wte = run.f32s(rows * hidden, "wte", 1.0, 0.0);
        let wpe = run.f32s((seq + 2) * hidden, "wpe", 1.0, 0.0);
        let dout = run.f32s(batch * seq * hidden, "dout", 1.0, 0.0);
        let case = format!("{batch}x{seq}x{hidden} vocab {start}+{rows}");
        let mut out = dev.alloc(batch * seq * hidden);
        dev.embedding_forward(&mut out, &run.up(&wte), Tokens { ids: &tokens, batch, seq, vocab_start: start }, hidden);
        let mut want = r.alloc(batch * seq * hidden);
        r.embedding_forward(&mut want, &refb(&wte), Tokens { ids: &tokens, batch, seq, vocab_start: start }, hidden);
        run.push_dev("embedding_forward", &case, &out, &want, F32);
        dev.position_forward(&mut out, &run.up(&wpe), batch, 2, seq, hidden);
        r.position_forward(&mut want, &refb(&wpe), batch, 2, seq, hidden);
        run.push_dev("position_forward", &case, &out, &want, F32);
        let dwte0 = run.f32s(rows * hidden, "dwte", 1.0, 0.0);
        let mut dwte = run.up(&dwte0);
        dev.embedding_backward(
            &mut dwte,
            &run.up(&dout),
            Tokens { ids: &tokens, batch, seq, vocab_start: start },
            hidden,
        );
        let mut rwte = refb(&dwte0);
        r.embedding_backward(&mut rwte, &refb(&dout), Tokens { ids: &tokens, batch, seq, vocab_start: start }, hidden);
        run.push_dev("embedding_backward", &case, &dwte, &rwte, F32);
        let dwpe0 = run.f32s((seq + 2) * hidden, "dwpe", 1.0, 0.0);
        let mut dwpe = run.up(&dwpe0);
        dev.position_backward(&mut dwpe, &run.up(&dout), batch, 2, seq, hidden);
        let mut rwpe = refb(&dwpe0);
        r.position_backward(&mut rwpe, &refb(&dout), batch, 2, seq, hidden);
        run.push_dev("position_backward", &case, &dwpe, &rwpe, F32);
    }
}

fn layernorm<D: Device>(run: &mut Run<D>, cases: &[(usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &(rows, cols) in cases {
        let x = run.f32s(rows * cols, "x", 2.0, 0.3);
        let w = run.f32s(cols, "w", 0.5, 1.0);
        let b = run.f32s(cols, "b", 0.5, 0.0);
        let dy = run.f32s(rows * cols, "dy", 1.0, 0.0);
        let dx0 = run.f32s(rows * cols, "dx0", 1.0, 0.0);
        let case = format!("{rows}x{cols}");
        let (gx, gw, gb, gdy) = (run.up(&x), run.up(&w), run.up(&b), run.up(&dy));
        let (rx, rw, rb, rdy) = (refb(&x), refb(&w), refb(&b), refb(&dy));
        let (mut out, mut mean, mut rstd) = (dev.alloc(rows * cols), dev.alloc(rows), dev.alloc(rows));
        dev.layernorm_forward(&mut out, (&mut mean, &mut rstd), &gx, (&gw, &gb), Matrix { rows, cols });
        let (mut rout, mut rmean, mut rrstd) = (r.alloc(rows * cols), r.alloc(rows), r.alloc(rows));
        r.layernorm_forward(&mut rout, (&mut rmean, &mut rrstd), &rx, (&rw, &rb), Matrix { rows, cols });
        run.push_dev("layernorm_forward out", &case, &out, &rout, F32);
        run.push_dev("layernorm_forward mean", &case, &mean, &rmean, F32);
        run.push_dev("layernorm_forward rstd", &case, &rstd, &rrstd, F32);
        let (mut dx, mut dw, mut db) = (run.up(&dx0), run.up(&b), run.up(&w));
        dev.layernorm_backward(
            &mut dx,
            (&mut dw, &mut db),
            &gdy,
            LayerNormSaved { inp: &gx, weight: &gw, mean: &mean, rstd: &rstd },
            Matrix { rows, cols },
        );
        let (mut rdx, mut rdw, mut rdb) = (refb(&dx0), refb(&b), refb(&w));
        r.layernorm_backward(
            &mut rdx,
            (&mut rdw, &mut rdb),
            &rdy,
            LayerNormSaved { inp: &rx, weight: &rw, mean: &rmean, rstd: &rrstd },
            Matrix { rows, cols },
        );
        run.push_dev("layernorm_backward dinp", &case, &dx, &rdx, F32);
        run.push_dev("layernorm_backward dweight", &case, &dw, &rdw, F32);
        run.push_dev("layernorm_backward dbias", &case, &db, &rdb, F32);

        // The split pieces (2-D / 2.5-D TP), on this block of columns as if it were a whole row.
        let (mut s, mut rs) = (vec![0f64; rows], vec![0f64; rows]);
        dev.layernorm_sums(&gx, Matrix { rows, cols }, None, &mut s);
        r.layernorm_sums(&rx, Matrix { rows, cols }, None, &mut rs);
        run.push_host("layernorm_sums", &case, &s, &rs, F32);
        let mu: Vec<f64> = rs.iter().map(|v| v / cols as f64).collect();
        dev.layernorm_sums(&gx, Matrix { rows, cols }, Some(&mu), &mut s);
        r.layernorm_sums(&rx, Matrix { rows, cols }, Some(&mu), &mut rs);
        run.push_host("layernorm_sums centred", &case, &s, &rs, F32);
        let rstd_h: Vec<f64> = rs.iter().map(|v| 1.0 / (v / cols as f64 + 1e-5).sqrt()).collect();
        dev.layernorm_apply(&mut out, (&mut mean, &mut rstd), &gx, (&gw, &gb), (&mu, &rstd_h), Matrix { rows, cols });
        r.layernorm_apply(&mut rout, (&mut rmean, &mut rrstd), &rx, (&rw, &rb), (&mu, &rstd_h), Matrix { rows, cols });
        run.push_dev("layernorm_apply", &case, &out, &rout, F32);
        let (mut bs, mut rbs) = (vec![0f64; 2 * rows], vec![0f64; 2 * rows]);
        dev.layernorm_backward_sums(
            &gdy,
            LayerNormSaved { inp: &gx, weight: &gw, mean: &mean, rstd: &rstd },
            Matrix { rows, cols },
            &mut bs,
        );
        r.layernorm_backward_sums(
            &rdy,
            LayerNormSaved { inp: &rx, weight: &rw, mean: &rmean, rstd: &rrstd },
            Matrix { rows, cols },
            &mut rbs,
        );
        run.push_host("layernorm_backward_sums", &case, &bs, &rbs, F32);
        let (mut dx, mut dw, mut db) = (run.up(&dx0), run.up(&b), run.up(&w));
        dev.layernorm_backward_apply(
            &mut dx,
            (&mut dw, &mut db),
            &gdy,
            LayerNormSaved { inp: &gx, weight: &gw, mean: &mean, rstd: &rstd },
            (&rbs, cols),
            Matrix { rows, cols },
        );
        let (mut rdx, mut rdw, mut rdb) = (refb(&dx0), refb(&b), refb(&w));
        r.layernorm_backward_apply(
            &mut rdx,
            (&mut rdw, &mut rdb),
            &rdy,
            LayerNormSaved { inp: &rx, weight: &rw, mean: &rmean, rstd: &rrstd },
            (&rbs, cols),
            Matrix { rows, cols },
        );
        run.push_dev("layernorm_backward_apply dx", &case, &dx, &rdx, F32);
        run.push_dev("layernorm_backward_apply dw", &case, &dw, &rdw, F32);
        run.push_dev("layernorm_backward_apply db", &case, &db, &rdb, F32);
    }
}

/// RMSNorm on the run's 16-bit activations (f32 weight and rstd), dinp and dweight "+=".
fn rmsnorm<D: Device>(run: &mut Run<D>, cases: &[(usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    let bound = run.half_bound();
    for &(rows, cols) in cases {
        let (x, dy, dx0) = (
            run.halves(rows * cols, "x", 2.0),
            run.halves(rows * cols, "dy", 1.0),
            run.halves(rows * cols, "dx0", 1.0),
        );
        let (w, dw0) = (run.f32s(cols, "w", 0.5, 1.0), run.f32s(cols, "b", 0.5, 0.0));
        let case = format!("{rows}x{cols}");
        let (gx, gdy, gw) = (run.up16(&x), run.up16(&dy), run.up(&w));
        let (mut out, mut rstd) = (dev.alloc_in(rows * cols, run.half), dev.alloc(rows));
        dev.rmsnorm_forward(&mut out, &mut rstd, &gx, &gw, Matrix { rows, cols }, 1e-5);
        let (mut rout, mut rrstd) = (r.alloc(rows * cols), r.alloc(rows));
        r.rmsnorm_forward(&mut rout, &mut rrstd, &refb(&x), &refb(&w), Matrix { rows, cols }, 1e-5);
        run.push_dev("rmsnorm_forward out", &case, &out, &rout, bound);
        run.push_dev("rmsnorm_forward rstd", &case, &rstd, &rrstd, F32);
        let (mut dx, mut dw) = (run.up16(&dx0), run.up(&dw0));
        dev.rmsnorm_backward(&mut dx, &mut dw, &gdy, (&gx, &gw), &rstd, Matrix { rows, cols });
        let (mut rdx, mut rdw) = (refb(&dx0), refb(&dw0));
        r.rmsnorm_backward(&mut rdx, &mut rdw, &refb(&dy), (&refb(&x), &refb(&w)), &rrstd, Matrix { rows, cols });
        run.push_dev("rmsnorm_backward dinp", &case, &dx, &rdx, bound);
        run.push_dev("rmsnorm_backward dweight", &case, &dw, &rdw, F32);
    }
}

/// SwiGLU on the run's 16-bit activations: rows of 2f (gate, up) in, [rows, f] out; the backward
/// overwrites a dinp that starts non-zero.
fn swiglu<D: Device>(run: &mut Run<D>, cases: &[(usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    let bound = run.half_bound();
    for &(rows, f) in cases {
        let (x, dy) = (run.halves(rows * 2 * f, "x", 2.0), run.halves(rows * f, "dy", 1.0));
        let case = format!("{rows}x{f}");
        let (gx, gdy) = (run.up16(&x), run.up16(&dy));
        let mut out = dev.alloc_in(rows * f, run.half);
        dev.swiglu_forward(&mut out, &gx, rows, f);
        let mut rout = r.alloc(rows * f);
        r.swiglu_forward(&mut rout, &refb(&x), rows, f);
        run.push_dev("swiglu_forward", &case, &out, &rout, bound);
        let mut dx = run.up16(&vec![9.0; rows * 2 * f]);
        dev.swiglu_backward(&mut dx, &gx, &gdy, rows, f);
        let mut rdx = r.alloc(rows * 2 * f);
        r.swiglu_backward(&mut rdx, &refb(&x), &refb(&dy), rows, f);
        run.push_dev("swiglu_backward", &case, &dx, &rdx, bound);
    }
}

/// Rotary embedding in place on a 16-bit QKV of `shape` (groups of `shape.group_size()` query
/// heads), the first `rd` components of each q and k head rotated from position `t0`, then
/// rotated back on the same buffer (the backward); the f32 table holds real cosines and sines.
fn rope<D: Device>(run: &mut Run<D>, cases: &[(AttentionShape, usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    let bound = run.half_bound();
    for &(shape, rd, t0) in cases {
        let n = shape.rows() * shape.qkv_width();
        let qkv = run.halves(n, "qkv", 1.0);
        let mut table = Vec::new();
        for t in 0..t0 + shape.seq {
            let angle = |j: usize| t as f64 * 10000f64.powf(-2.0 * j as f64 / rd as f64);
            table.extend((0..rd / 2).map(|j| angle(j).cos() as f32));
            table.extend((0..rd / 2).map(|j| angle(j).sin() as f32));
        }
        let rotary = crate::device::Rotary { rotary_dim: rd, t0 };
        let case = format!(
            "b{} s{} h{}/{} d{} rd{rd} t0 {t0}",
            shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim
        );
        let mut g = run.up16(&qkv);
        let gt = run.up(&table);
        let (mut rq, rt) = (refb(&qkv), refb(&table));
        dev.rope_forward(&mut g, &gt, shape, rotary);
        r.rope_forward(&mut rq, &rt, shape, rotary);
        run.push_dev("rope_forward", &case, &g, &rq, bound);
        // Backward on the device's forward output: the reference rotates the same values back.
        let mut rq = refb(&run.down(&g));
        dev.rope_backward(&mut g, &gt, shape, rotary);
        r.rope_backward(&mut rq, &rt, shape, rotary);
        run.push_dev("rope_backward", &case, &g, &rq, bound);
    }
}

fn cross_entropy<D: Device>(run: &mut Run<D>, cases: &[(usize, usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    for &(rows, vocab, start) in cases {
        let logits = run.f32s(rows * vocab, "logits", 3.0, 0.0);
        // Row 1's token is one the loss leaves out (`--eod-mask-loss`).
        let targets: Vec<u32> = (0..rows)
            .map(|i| if i == 1 { crate::device::kernels::IGNORED_TARGET } else { ((i * 389) % (start + vocab)) as u32 })
            .collect();
        let case = format!("{rows}x{vocab} from {start}");
        let (g, rl) = (run.up(&logits), refb(&logits));
        // The statistics live in the device's scalars; each step reads from the reference's
        // statistics (written to the device), so each op is checked on its own.
        let (mut dmax, mut rmax_s) = (dev.scalars(rows), r.scalars(rows));
        dev.cross_entropy_max(&g, rows, vocab, &mut dmax);
        r.cross_entropy_max(&rl, rows, vocab, &mut rmax_s);
        let (mut max, mut rmax) = (vec![0f64; rows], vec![0f64; rows]);
        dev.read_scalars(&dmax, &mut max);
        r.read_scalars(&rmax_s, &mut rmax);
        run.push_host("cross_entropy_max", &case, &max, &rmax, Bound::Exact);
        dev.write_scalars(&mut dmax, &rmax);
        let (mut dstats, mut rstats_s) = (dev.scalars(2 * rows), r.scalars(2 * rows));
        dev.cross_entropy_partials(&g, &targets, Logits { rows, vocab, vocab_start: start }, &dmax, &mut dstats);
        r.cross_entropy_partials(&rl, &targets, Logits { rows, vocab, vocab_start: start }, &rmax_s, &mut rstats_s);
        let (mut stats, mut rstats) = (vec![0f64; 2 * rows], vec![0f64; 2 * rows]);
        dev.read_scalars(&dstats, &mut stats);
        r.read_scalars(&rstats_s, &mut rstats);
        run.push_host("cross_entropy sum_exp", &case, &stats[..rows], &rstats[..rows], F32);
        run.push_host("cross_entropy target_logit", &case, &stats[rows..], &rstats[rows..], Bound::Exact);
        dev.write_scalars(&mut dstats, &rstats);
        // The loss is added to what the accumulator holds (here 1).
        let (mut acc, mut racc) = (dev.scalars(1), r.scalars(1));
        dev.write_scalars(&mut acc, &[1.0]);
        r.write_scalars(&mut racc, &[1.0]);
        dev.cross_entropy_loss(&dmax, &dstats, &targets, rows, &mut acc, 0);
        r.cross_entropy_loss(&rmax_s, &rstats_s, &targets, rows, &mut racc, 0);
        let (mut loss, mut rloss) = ([0.0], [0.0]);
        dev.read_scalars(&acc, &mut loss);
        r.read_scalars(&racc, &mut rloss);
        let exact = Bound::Abs { atol: 1e-12 * rloss[0].abs().max(1.0), rtol: 0.0 };
        run.out.push(compare_f64("cross_entropy_loss", &case, loss[0], rloss[0], exact));
        let mut gg = run.up(&logits);
        dev.cross_entropy_backward(&mut gg, &targets, Logits { rows, vocab, vocab_start: start }, &dmax, &dstats, 0.5);
        let mut rg = rl.clone();
        r.cross_entropy_backward(
            &mut rg,
            &targets,
            Logits { rows, vocab, vocab_start: start },
            &rmax_s,
            &rstats_s,
            0.5,
        );
        run.push_dev("cross_entropy_backward", &case, &gg, &rg, Bound::Abs { atol: 1e-6, rtol: 1e-5 });
    }
}

/// The operands are 16-bit values and products accumulate in f32 on every backend (the GPU
/// kernels and the CPU's 16-bit GEMM alike), so the outputs are held to f32's bound.
fn linear<D: Device>(run: &mut Run<D>, cases: &[(usize, usize, usize)]) {
    let (dev, r) = (run.dev, ReferenceDevice);
    dev.set_matmul_precision(run.half);
    let bound = F32;
    for &(rows, k, n) in cases {
        let x = run.halves(rows * k, "x", 1.0);
        let w = run.halves(n * k, "w", 0.2);
        let bias = run.f32s(n, "bias", 0.5, 0.0);
        let dy = run.halves(rows * n, "dy", 1.0);
        let dw0 = run.f32s(n * k, "dw0", 1.0, 0.0);
        let case = format!("{rows}x{k}->{n}");
        let (gx, gw, gbias, gdy) = (run.up(&x), run.up(&w), run.up(&bias), run.up(&dy));
        let (rx, rw, rbias, rdy) = (refb(&x), refb(&w), refb(&bias), refb(&dy));
        for (op, with_bias) in [("linear_forward", false), ("linear_forward + bias", true)] {
            let mut out = dev.alloc(rows * n);
            dev.linear_forward(&mut out, &gx, &gw, with_bias.then_some(&gbias), Gemm { rows, k, n });
            let mut want = r.alloc(rows * n);
            r.linear_forward(&mut want, &rx, &rw, with_bias.then_some(&rbias), Gemm { rows, k, n });
            run.push_dev(op, &case, &out, &want, bound);
        }
        // dinp overwrites (it starts as garbage); dweight and dbias accumulate.
        let mut dx = run.up(&vec![7.0; rows * k]);
        let (mut dw, mut db) = (run.up(&dw0), run.up(&bias));
        dev.linear_backward(Some(&mut dx), (&mut dw, Some(&mut db)), &gdy, &gx, &gw, Gemm { rows, k, n });
        let (mut rdx, mut rdw, mut rdb) = (r.alloc(rows * k), refb(&dw0), refb(&bias));
        r.linear_backward(Some(&mut rdx), (&mut rdw, Some(&mut rdb)), &rdy, &rx, &rw, Gemm { rows, k, n });
        run.push_dev("linear_backward dinp", &case, &dx, &rdx, bound);
        run.push_dev("linear_backward dweight", &case, &dw, &rdw, bound);
        run.push_dev("linear_backward dbias", &case, &db, &rdb, bound);
        let mut dw = run.up(&dw0);
        dev.linear_backward(None, (&mut dw, None), &gdy, &gx, &gw, Gemm { rows, k, n });
        run.push_dev("linear_backward dweight only", &case, &dw, &rdw, bound);
        let mut dx = run.up(&vec![7.0; rows * k]);
        dev.linear_backward_input(&mut dx, &gdy, &gw, Gemm { rows, k, n });
        run.push_dev("linear_backward_input", &case, &dx, &rdx, bound);
    }
}

/// Runs every op of `dev` on the cases of `size` and compares each output with the reference.
/// `head_dims` are the attention head dimensions the device supports. `half` is the 16-bit format
/// (bf16, or f16 for a GPU Device on its fp16 module): the linear layers run with that matmul
/// precision (on the CPU its 16-bit GEMM), and the 16-bit cases use it. The Llama-family ops
/// (RMSNorm, SwiGLU, rotary embedding, grouped-query attention) run on every Device.
pub fn run_all<D: Device>(dev: &D, size: Size, head_dims: &[usize], seed: u64, half: Precision) -> Vec<OpCheck> {
    let mut run = Run { dev, seed, half, out: Vec::new() };
    let full = size == Size::Full;
    let sizes: &[usize] = if full { &[1, 1000, 70_001, 4_000_037] } else { &[1, 1000, 70_001] };
    elementwise(&mut run, sizes);
    adamw_group(&mut run, sizes);
    let mut emb = vec![(1, 1, 1, 3, 0), (2, 5, 33, 10, 0), (3, 7, 130, 20, 10)];
    let mut ln = vec![(1, 1), (5, 33), (13, 200)];
    // 70 x 64: the 16-byte path and a backward of 3 blocks; 5 x 33: one element at a time.
    let mut rms = vec![(1, 1), (5, 33), (70, 64)];
    // SwiGLU's (rows, f): one element at a time, then 8 per thread.
    let mut glu = vec![(1, 1), (5, 33), (7, 64)];
    // Rotary (shape, rotary dim, first position): 2 groups of 2 query heads, one group of 3 with
    // rotary on 6 of 16 components from position 5, and multi-head attention on half the head.
    let sh = AttentionShape::new;
    let mut rot = vec![(sh(2, 5, 4, 8).grouped(2), 8, 0), (sh(1, 3, 3, 16).grouped(1), 6, 5), (sh(2, 4, 2, 8), 4, 1)];
    let mut xent = vec![(1, 1, 0), (3, 333, 0), (6, 1000, 500)];
    // (rows, inputs, outputs); 1100 x 8 -> 8: on sm_90a, dW's one tile in 2 slices of its
    // 18-step reduction (plan::sm90_weight_slices).
    let mut lin = vec![(1, 1, 1), (37, 72, 130), (100, 33, 70), (1100, 8, 8)];
    let mut attn = Vec::new();
    // Per-document attention: 2 groups of 2 query heads over several tiles of every head dim.
    let docs: Vec<AttentionShape> = head_dims.iter().map(|&d| sh(2, 130, 4, d).grouped(2)).collect();
    for &d in head_dims {
        attn.extend([sh(1, 1, 1, d), sh(2, 37, 2, d)]);
        // Grouped-query attention: 2 groups of 2 query heads; one group of 4 (multi-query).
        attn.extend([sh(2, 37, 4, d).grouped(2), sh(1, 70, 4, d).grouped(1)]);
    }
    if full {
        emb.push((4, 256, 768, 50304, 0));
        ln.push((1024, 768));
        rms.push((1024, 768));
        glu.push((1024, 2048));
        rot.push((sh(4, 256, 32, 128).grouped(8), 128, 0));
        xent.push((512, 25152, 25152));
        lin.extend([(512, 768, 2304), (512, 3072, 768)]);
        for &d in head_dims {
            attn.push(sh(2, 512, 768 / d, d));
            attn.push(sh(2, 512, 768 / d, d).grouped(768 / d / 2));
        }
    } else if let Some(&d) = head_dims.last() {
        attn.push(sh(1, 70, 1, d));
    }
    embeddings(&mut run, &emb);
    layernorm(&mut run, &ln);
    rmsnorm(&mut run, &rms);
    swiglu(&mut run, &glu);
    rope(&mut run, &rot);
    cross_entropy(&mut run, &xent);
    linear(&mut run, &lin);
    attention::attention(&mut run, &attn, false);
    attention::attention(&mut run, &docs, true);
    attention::attention_dropout(&mut run, head_dims);
    attention::attention_blocks(&mut run, head_dims);
    run.out
}

/// `trident check ops [--device cpu|cuda|hip] [--size small|full] [--gpu N] [--fp16]`: every op of
/// the device against the f64 reference device; a table, then one verdict line. `--fp16` checks a
/// GPU Device on its fp16 module (binary16 storage) with fp16's bounds.
pub fn run(args: &[String]) -> Result<()> {
    let Some(a) = flags("check ops", "every Device op against the f64 reference device", CHECK_OPS_FLAGS, args)? else {
        return Ok(());
    };
    let device = a.str("--device").unwrap_or("cuda");
    let size = match a.str("--size").unwrap_or("full") {
        "small" => Size::Small,
        "full" => Size::Full,
        other => return Err(Error::flag("--size", format!("'{other}'"), "small or full")),
    };
    let ordinal = a.usize("--gpu")?.unwrap_or(0);
    let half = if a.has("--fp16") { Precision::F16 } else { Precision::Bf16 };
    let started = std::time::Instant::now();
    let gpu = |vendor| {
        use crate::gpu::device::GpuDevice;
        let dev = GpuDevice::open(vendor, ordinal, crate::gpu::kernels::Storage::of(half))?;
        Ok::<_, Error>((dev.describe(), run_all(&dev, size, &GpuDevice::HEAD_DIMS, 7, half)))
    };
    let (name, checks) = match device {
        "cpu" => {
            let dev = crate::device::cpu::CpuDevice::new(crate::comm::runtime::process_cpus());
            (dev.describe(), run_all(&dev, size, &[32, 64, 128], 7, half))
        }
        "cuda" => gpu(crate::gpu::kernels::Vendor::Cuda)?,
        "hip" => gpu(crate::gpu::kernels::Vendor::Hip)?,
        other => return Err(Error::flag("--device", format!("'{other}'"), "cpu, cuda or hip")),
    };
    println!("{:<28} {:<28} {:>9} {:>11}  verdict", "op", "case", "elements", "max |error|");
    for c in &checks {
        println!("{}", c.line());
    }
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let secs = started.elapsed().as_secs_f64();
    if failed > 0 {
        return Err(Error::Check(format!(
            "check ops on {name}: {failed} of {} outputs outside their bounds (see the table)",
            checks.len()
        )));
    }
    println!("ops check: all {} outputs within their bounds on {name} ({secs:.1} s)", checks.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;

    #[test]
    fn the_cpu_device_passes_every_op() {
        let dev = CpuDevice::new(2);
        for half in [Precision::Bf16, Precision::F16] {
            let checks = run_all(&dev, Size::Small, &[32, 64], 5, half);
            assert!(checks.len() > 60, "{} checks", checks.len());
            for c in &checks {
                assert!(c.passed(), "{half:?}: {}", c.line());
            }
        }
    }

    #[test]
    fn a_wrong_output_is_reported_with_its_first_bad_element() {
        let c = compare("op", "case", &[1.0, 2.0, 3.5], &[1.0, 2.0, 3.0], F32);
        assert!(!c.passed() && c.violations == 1 && c.first == Some((2, 3.5, 3.0)), "{c:?}");
        assert!(c.line().contains("FAILED: 1 of them, element 2 is 3.5, the reference 3"), "{}", c.line());
        let nan = compare("op", "case", &[f32::NAN], &[0.0], Bound::Bf16);
        assert!(!nan.passed());
        assert!(!compare("op", "case", &[1.0], &[1.0, 2.0], Bound::Exact).passed(), "a short output fails");
        assert!(compare("op", "case", &[1.005], &[1.0], Bound::Bf16).passed());
        assert!(compare("op", "case", &[1.02], &[1.0], Bound::Bf16).passed());
        assert!(!compare("op", "case", &[1.02], &[1.0], Bound::Fp16).passed(), "fp16's bound is tighter");
        assert!(compare("op", "case", &[1.01], &[1.0], Bound::Fp16).passed());
        assert!(!compare("op", "case", &[1.0 + 1e-7], &[1.0], Bound::Exact).passed());
    }
}
