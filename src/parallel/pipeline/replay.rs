//! A schedule replayed in model time: every stage runs its pass list in order, each pass as soon
//! as the passes it depends on (the previous virtual stage's forward, the next one's B, its own
//! F before B and B before W) are done, transfers free. The bubble it gives is the schedule's own,
//! for the planner's pricing and for the tests that hold each schedule to its theory; a run's
//! measured bubble (`--timing-trace`, the end-of-run report) adds what the hardware does.

use super::{Pass, Placement};
use std::collections::BTreeMap;

/// The per-stage bubble of running `passes(s)` on every stage s placed by `lay`: (the step's
/// time - the stage's busy time) / the stage's busy time, where a whole stage's forward takes
/// `cost[0]`, its B `cost[1]` and its W `cost[2]` (an unsplit backward B + W), a chunk's its
/// share. `None` if the lists deadlock (a pass waits for one no stage will run).
pub fn replay_bubble(lay: Placement, passes: &dyn Fn(usize) -> Vec<Pass>, cost: [f64; 3]) -> Option<Vec<f64>> {
    let lists: Vec<Vec<Pass>> = (0..lay.stages).map(passes).collect();
    let share = lay.chunks as f64;
    // (kind: 0 forward, 1 input gradients, 2 weights; virtual stage; micro-batch) -> finish time.
    let mut done: BTreeMap<(u8, usize, usize), f64> = BTreeMap::new();
    let (mut next, mut clock, mut busy) = (vec![0usize; lay.stages], vec![0f64; lay.stages], vec![0f64; lay.stages]);
    loop {
        let mut progressed = false;
        for s in 0..lay.stages {
            while let Some(&pass) = lists[s].get(next[s]) {
                let (kind, micro, chunk, time) = match pass {
                    Pass::Forward { micro, chunk } => (0, micro, chunk, cost[0]),
                    Pass::Input { micro, chunk } => (1, micro, chunk, cost[1]),
                    Pass::Backward { micro, chunk } => (1, micro, chunk, cost[1] + cost[2]),
                    Pass::Weight { micro, chunk } => (2, micro, chunk, cost[2]),
                };
                let vs = lay.virtual_stage(s, chunk);
                let needs: Vec<(u8, usize, usize)> = match kind {
                    0 => (vs > 0).then(|| (0, vs - 1, micro)).into_iter().collect(),
                    1 => [Some((0, vs, micro)), (vs < lay.last()).then(|| (1, vs + 1, micro))]
                        .into_iter()
                        .flatten()
                        .collect(),
                    _ => vec![(1, vs, micro)],
                };
                let Some(ready) = needs.iter().map(|k| done.get(k).copied()).collect::<Option<Vec<f64>>>() else {
                    break;
                };
                let start = ready.into_iter().fold(clock[s], f64::max);
                clock[s] = start + time / share;
                busy[s] += time / share;
                done.insert((kind, vs, micro), clock[s]);
                next[s] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    if (0..lay.stages).any(|s| next[s] < lists[s].len()) {
        return None;
    }
    let step = clock.iter().copied().fold(0.0, f64::max);
    Some(busy.iter().map(|b| (step - b) / b).collect())
}

#[cfg(test)]
mod tests {
    use super::super::{passes, Schedule};
    use super::*;

    fn bubble(schedule: Schedule, p: usize, m: usize, cost: [f64; 3]) -> f64 {
        let chunks = if schedule == Schedule::ZbV { 2 } else { 1 };
        let lay = Placement::new(schedule, p, chunks);
        let stages = replay_bubble(lay, &|s| passes(schedule, p, s, m, chunks), cost).expect("no deadlock");
        stages.into_iter().fold(0.0, f64::max)
    }

    /// 1F1B's (p-1)/m, ZB-H1's (p-1)/(3m) and ZB-V's (p-1)/(6m) with F, B and W equally long;
    /// and the bounds at 4 stages and 8 micro-batches with B half as long again as F
    /// (attention's backward) and W as long as F: zb-h1 at most half of 1F1B's, zb-v a quarter.
    #[test]
    fn zero_bubble_schedules_reach_their_theory() {
        for (p, m) in [(2, 4), (4, 8), (4, 16), (8, 16), (3, 6)] {
            let (pf, mf) = (p as f64, m as f64);
            let unit = [1.0, 1.0, 1.0];
            let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
            let one = bubble(Schedule::OneFOneB, p, m, unit);
            assert!(close(one, (pf - 1.0) / mf), "1f1b p {p} m {m}: {one}");
            let h1 = bubble(Schedule::ZbH1, p, m, unit);
            assert!(close(h1, (pf - 1.0) / (3.0 * mf)), "zb-h1 p {p} m {m}: {h1}");
            let v = bubble(Schedule::ZbV, p, m, unit);
            assert!(close(v, (pf - 1.0) / (6.0 * mf)), "zb-v p {p} m {m}: {v}");
        }
        for cost in [[1.0, 1.5, 1.0], [1.0, 1.3, 0.8], [1.0, 2.0, 1.0]] {
            let one = bubble(Schedule::OneFOneB, 4, 8, cost);
            assert!(bubble(Schedule::ZbH1, 4, 8, cost) <= one / 2.0, "{cost:?}");
            assert!(bubble(Schedule::ZbV, 4, 8, cost) <= one / 4.0, "{cost:?}");
        }
    }

    #[test]
    fn a_list_that_waits_on_nothing_it_will_get_is_a_deadlock() {
        let lay = Placement::new(Schedule::OneFOneB, 2, 1);
        // Stage 0 runs B before its F was ever sent on: nothing feeds stage 1's forward.
        let order = |s: usize| match s {
            0 => vec![Pass::Backward { micro: 0, chunk: 0 }, Pass::Forward { micro: 0, chunk: 0 }],
            _ => passes(Schedule::OneFOneB, 2, 1, 1, 1),
        };
        assert_eq!(replay_bubble(lay, &order, [1.0; 3]), None);
    }
}
