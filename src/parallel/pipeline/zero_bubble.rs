//! The zero-bubble schedules' tables (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
//! each backward split into B (the input gradients the previous stage waits for) and W (the
//! linear layers' weight gradients, which nothing waits for), W moved into time 1F1B leaves idle.
//! ZB-H1 keeps one chunk per stage; ZB-V places two chunks per stage in a V (`Placement`). Both
//! hold at most 1F1B's stage-0 activations on every stage (`replay`'s tests measure the bubbles).

use super::Pass;

/// Zero-bubble H1 on stage `rank` (the paper's handcrafted order): 1F1B's warm-up, then each
/// backward split, its B sending the input gradient on before any W runs. While forwards remain,
/// stage r leaves the W of its first r B passes for later, so its steady state runs F, B and the
/// W of a micro-batch r places back; the last W passes run after the last B. The gradients cross
/// the pipeline at B's pace while the deferred W passes fill the cool-down the earlier stages
/// would otherwise idle through: the bubble is (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W). A
/// micro-batch is held from its F to its W, at most p on every stage: 1F1B's most (stage 0's).
pub(super) fn zb_h1(stages: usize, rank: usize, micro: usize) -> Vec<Pass> {
    let mut t = Table::default();
    for _ in 0..(stages - rank - 1).min(micro) {
        t.f(0);
    }
    let mut deferred = 0;
    for _ in 0..micro {
        let with_forward = t.f[0] < micro;
        if with_forward {
            t.f(0);
        }
        t.b(0);
        if with_forward && deferred < rank {
            deferred += 1;
        } else {
            t.w(0);
        }
    }
    while t.w[0] < micro {
        t.w(0);
    }
    t.out
}

/// Zero-bubble V on stage `rank` of `stages` (the paper's handcrafted ZB-V): the stage holds
/// chunk 0 on the V's first arm and chunk 1 on its second. Warm-up: 2(p - r) - 1 forwards of
/// chunk 0, then r pairs of chunk 1's and chunk 0's, then p - r of chunk 1's each followed by its
/// B and W; the steady state runs chunk 0's F, B, W then chunk 1's; the cool-down r pairs of B
/// (chunk 0's, chunk 1's), then p - r of chunk 0's B each with a W, then the W passes left. The
/// table is laid out for at least 2p - 1 micro-batches and cut to `micro` (a pass of a dropped
/// micro-batch only waits on passes of that micro-batch, so the cut order cannot deadlock).
/// With F, B and W equally long its bubble is (p - 1)/(6m) of the step, a sixth of 1F1B's; each
/// stage holds at most 2p chunk activations, 1F1B's stage 0 (each chunk is half a stage).
pub(super) fn zb_v(stages: usize, rank: usize, micro: usize) -> Vec<Pass> {
    let (p, r) = (stages, rank);
    let n = micro.max(2 * p - 1);
    let mut t = Table::default();
    t.times(2 * (p - r) - 1, |t| t.f(0));
    t.times(r, |t| [t.f(1), t.f(0)]);
    t.times(p - r, |t| [t.f(1), t.b(1), t.w(1)]);
    while t.f[1] < t.f[0] || t.f[0] < n {
        if t.f[0] < n {
            t.f(0);
        }
        t.times(1, |t| [t.b(0), t.w(0), t.f(1), t.b(1), t.w(1)]);
    }
    t.times(r, |t| [t.b(0), t.b(1)]);
    t.times(p - r, |t| [t.b(0), t.w(0)]);
    for chunk in [1, 0] {
        while t.w[chunk] < t.b[chunk] {
            t.w(chunk);
        }
    }
    debug_assert!(t.f == [n, n] && t.b == [n, n] && t.w == [n, n], "zb-v's table runs every pass once");
    t.out.retain(|pass| pass_micro(*pass) < micro);
    t.out
}

/// The micro-batch a pass runs.
fn pass_micro(pass: Pass) -> usize {
    match pass {
        Pass::Forward { micro, .. }
        | Pass::Backward { micro, .. }
        | Pass::Input { micro, .. }
        | Pass::Weight { micro, .. } => micro,
    }
}

/// A stage's pass list being laid out: the next micro-batch of each chunk's F, B and W (each
/// kind runs a chunk's micro-batches in order).
#[derive(Default)]
struct Table {
    out: Vec<Pass>,
    f: [usize; 2],
    b: [usize; 2],
    w: [usize; 2],
}

impl Table {
    /// Lays out `step` `n` times.
    fn times<R>(&mut self, n: usize, step: impl Fn(&mut Table) -> R) {
        for _ in 0..n {
            step(self);
        }
    }
    fn f(&mut self, chunk: usize) {
        self.out.push(Pass::Forward { micro: self.f[chunk], chunk });
        self.f[chunk] += 1;
    }
    fn b(&mut self, chunk: usize) {
        self.out.push(Pass::Input { micro: self.b[chunk], chunk });
        self.b[chunk] += 1;
    }
    fn w(&mut self, chunk: usize) {
        self.out.push(Pass::Weight { micro: self.w[chunk], chunk });
        self.w[chunk] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{chunk_layers, passes, peak_in_flight, validate, Placement, Schedule};
    use super::*;
    use Pass::{Forward as F, Input as B, Weight as W};

    /// zb-v: every (micro-batch, chunk)'s F, B and W once each, in that order; at most 2p chunk
    /// activations held (1F1B's stage 0, each chunk half a stage), for any micro-batch count.
    #[test]
    fn zero_bubble_v_runs_every_pass_once_within_one_f_one_b_memory() {
        for p in 2..=5 {
            for m in 1..=12 {
                for r in 0..p {
                    let list = passes(Schedule::ZbV, p, r, m, 2);
                    let case = format!("p {p} m {m} rank {r}");
                    assert_eq!(list.len(), 6 * m, "{case}");
                    let at =
                        |want: Pass| list.iter().position(|&x| x == want).unwrap_or_else(|| panic!("{case}: {want:?}"));
                    for (micro, chunk) in (0..m).flat_map(|k| [(k, 0), (k, 1)]) {
                        let (f, b, w) = (at(F { micro, chunk }), at(B { micro, chunk }), at(W { micro, chunk }));
                        assert!(f < b && b < w, "{case}: ({micro}, {chunk}) at {f} {b} {w}");
                    }
                    assert!(peak_in_flight(&list) <= 2 * p, "{case}: {}", peak_in_flight(&list));
                }
            }
        }
        // Stage 1 of 2 turns the V: chunk 0's forward feeds its own chunk 1 at once.
        let f = |micro, chunk| F { micro, chunk };
        assert_eq!(passes(Schedule::ZbV, 2, 1, 3, 2)[..4], [f(0, 0), f(0, 1), f(1, 0), f(1, 1)]);
        assert_eq!(Schedule::parse("zb-v").unwrap().name(), "zb-v");
        assert!(validate(Schedule::ZbV, 2, 1, 4).is_err() && validate(Schedule::ZbV, 1, 2, 4).is_err());
    }

    /// The V: 16 layers on 4 stages, stage 0 holds the first two and the last two.
    #[test]
    fn the_v_places_the_first_and_last_layers_on_stage_0() {
        let lay = Placement::new(Schedule::ZbV, 4, 2);
        assert_eq!(chunk_layers(16, lay, 0, 0, None, None).unwrap(), 0..2);
        assert_eq!(chunk_layers(16, lay, 0, 1, None, None).unwrap(), 14..16);
        assert_eq!(chunk_layers(16, lay, 3, 0, None, None).unwrap(), 6..8);
        assert_eq!(chunk_layers(16, lay, 3, 1, None, None).unwrap(), 8..10);
        assert_eq!((lay.target(3, 0, false), lay.target(3, 1, true)), ((3, 1), (3, 0)), "the turn stays on stage 3");
        assert_eq!((lay.target(1, 1, false), lay.source(1, 1, false)), ((0, 1), (2, 1)));
        assert!(!lay.upward(0, false) && lay.upward(1, false) && lay.upward(0, true) && !lay.upward(1, true));
    }
}
