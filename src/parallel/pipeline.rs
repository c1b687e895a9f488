//! Pipeline schedules (Megatron's, shared/reference/megatron.md §4): for each stage, the ordered
//! list of forward and backward passes over (micro-batch, model chunk) that GPipe, 1F1B and
//! interleaved 1F1B prescribe, and the split of layers into stages and virtual chunks. The
//! executor (`train.rs`) runs a stage's list in order; sends are non-blocking and receives are
//! matched by tag, so any of these orders completes without deadlock.

use crate::error::{Error, Result};
use std::ops::Range;

/// One pass of the schedule on this stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward { micro: usize, chunk: usize },
    Backward { micro: usize, chunk: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// All forwards, then all backwards (stashes every micro-batch).
    GPipe,
    /// One forward, one backward in the steady state; stage r keeps at most p - r in flight.
    OneFOneB,
    /// 1F1B over v virtual chunks per stage; bubble (p-1)/(v m).
    Interleaved,
}

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule> {
        match s {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            "interleaved-1f1b" | "interleaved" => Ok(Schedule::Interleaved),
            _ => Err(Error::flag("--pipeline-schedule", format!("'{s}'"), "gpipe, 1f1b or interleaved-1f1b")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved-1f1b",
        }
    }
}

/// The passes stage `rank` of `stages` runs for `micro` micro-batches and `chunks` model chunks
/// per stage (chunks > 1 only for the interleaved schedule).
pub fn passes(schedule: Schedule, stages: usize, rank: usize, micro: usize, chunks: usize) -> Vec<Pass> {
    let f = |micro, chunk| Pass::Forward { micro, chunk };
    let b = |micro, chunk| Pass::Backward { micro, chunk };
    match schedule {
        Schedule::GPipe => (0..micro).map(|m| f(m, 0)).chain((0..micro).map(|m| b(m, 0))).collect(),
        Schedule::OneFOneB => {
            let warmup = (stages - rank - 1).min(micro);
            let steady = micro - warmup;
            let mut out: Vec<Pass> = (0..warmup).map(|m| f(m, 0)).collect();
            for i in 0..steady {
                out.push(f(warmup + i, 0));
                out.push(b(i, 0));
            }
            out.extend((steady..micro).map(|m| b(m, 0)));
            out
        }
        Schedule::Interleaved => {
            // Megatron's schedule table with groups of p micro-batches per chunk: forward step k
            // runs table[k]; backward step k runs the same micro-batch on the mirrored chunk.
            let group = stages;
            let mut table = Vec::with_capacity(micro * chunks);
            for g0 in (0..micro).step_by(group) {
                let g1 = (g0 + group).min(micro);
                for c in 0..chunks {
                    table.extend((g0..g1).map(|m| (m, c)));
                }
            }
            let total = table.len();
            let warmup = ((stages - rank - 1) * 2 + (chunks - 1) * group).min(total);
            let steady = total - warmup;
            let fwd = |k: usize| f(table[k].0, table[k].1);
            let bwd = |k: usize| b(table[k].0, chunks - 1 - table[k].1);
            let mut out: Vec<Pass> = (0..warmup).map(fwd).collect();
            for k in 0..steady {
                out.push(fwd(k + warmup));
                out.push(bwd(k));
            }
            out.extend((steady..total).map(bwd));
            out
        }
    }
}

/// The most micro-batch activations (per chunk) alive at once when running `passes`.
pub fn peak_in_flight(passes: &[Pass]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for p in passes {
        match p {
            Pass::Forward { .. } => {
                live += 1;
                peak = peak.max(live);
            }
            Pass::Backward { .. } => live -= 1,
        }
    }
    peak
}

/// Where stage `stage` sends its message of `chunk`: activations to the next stage, gradients
/// (`backward`) to the previous; returns that stage and the chunk the message feeds there (one
/// chunk on when activations wrap from the last stage to the first, one back when gradients wrap
/// from the first to the last).
pub fn send_target(stages: usize, stage: usize, chunk: usize, backward: bool) -> (usize, usize) {
    if backward {
        ((stage + stages - 1) % stages, if stage == 0 { chunk - 1 } else { chunk })
    } else {
        ((stage + 1) % stages, if stage == stages - 1 { chunk + 1 } else { chunk })
    }
}

/// The stage whose messages stage `stage` receives: the previous one's activations, the next
/// one's gradients (`backward`).
pub fn recv_source(stages: usize, stage: usize, backward: bool) -> usize {
    if backward {
        (stage + 1) % stages
    } else {
        (stage + stages - 1) % stages
    }
}

/// The passes of evaluation (forward only): every (micro-batch, chunk) in order.
pub fn forward_passes(micro: usize, chunks: usize) -> Vec<Pass> {
    (0..micro).flat_map(|m| (0..chunks).map(move |c| Pass::Forward { micro: m, chunk: c })).collect()
}

/// Pipeline messages between two stages, one direction and one kind (activations forward or
/// gradients backward), named by the (micro-batch, chunk) they feed on the receiving stage.
type Stream = Vec<(usize, usize)>;

/// Whether FIFO delivery carries every stage's pipeline messages right when `passes(s)` is the
/// order stage s runs its passes in: for each kind (forward activations, backward gradients) and
/// each ordered pair of stages, the order the sender sends must be the order the receiver
/// receives. NCCL's point-to-point calls match in issue order per communicator and peer (MPI's
/// tags are not needed), so the device path runs only layouts this holds for. `Err` names the
/// first pair and position where the orders part.
pub fn fifo_order(stages: usize, chunks: usize, passes: &dyn Fn(usize) -> Vec<Pass>) -> Result<()> {
    use std::collections::BTreeMap;
    let last = stages * chunks - 1;
    // (backward?, sender, receiver) -> messages in the order the sender sends / receiver takes.
    let (mut sent, mut taken): (BTreeMap<_, Stream>, BTreeMap<_, Stream>) = Default::default();
    for s in 0..stages {
        for pass in passes(s) {
            let (backward, micro, chunk) = match pass {
                Pass::Forward { micro, chunk } => (false, micro, chunk),
                Pass::Backward { micro, chunk } => (true, micro, chunk),
            };
            let vs = chunk * stages + s;
            // Forward takes activations after the first virtual stage and sends them before the
            // last; backward takes and sends gradients the other way round.
            let (takes, sends) = if backward { (vs < last, vs > 0) } else { (vs > 0, vs < last) };
            if takes {
                taken.entry((backward, recv_source(stages, s, backward), s)).or_default().push((micro, chunk));
            }
            if sends {
                let (to, to_chunk) = send_target(stages, s, chunk, backward);
                sent.entry((backward, s, to)).or_default().push((micro, to_chunk));
            }
        }
    }
    let keys: std::collections::BTreeSet<_> = sent.keys().chain(taken.keys()).copied().collect();
    for key in keys {
        let (a, b) = (sent.get(&key).map_or(&[][..], |v| &v[..]), taken.get(&key).map_or(&[][..], |v| &v[..]));
        if a != b {
            let (backward, from, to) = key;
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            return Err(Error::Config(format!(
                "pipeline {} from stage {from} to stage {to}: message {at} is sent as {:?} and received as {:?} \
                 ((micro-batch, chunk)); in-order delivery would mix them up",
                if backward { "gradients" } else { "activations" },
                a.get(at),
                b.get(at)
            )));
        }
    }
    Ok(())
}

/// Checks the pipeline layout: virtual chunks need p > 1, the interleaved schedule needs a
/// micro-batch count that is a multiple of p (Megatron's groups of p per chunk).
pub fn validate(schedule: Schedule, stages: usize, chunks: usize, micro: usize) -> Result<()> {
    if chunks > 1 && stages == 1 {
        return Err(Error::Config(
            "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1".into(),
        ));
    }
    if chunks > 1 && schedule != Schedule::Interleaved {
        return Err(Error::Config(format!(
            "virtual pipeline stages need --pipeline-schedule interleaved-1f1b, not {}",
            schedule.name()
        )));
    }
    if schedule == Schedule::Interleaved && (micro < stages || !micro.is_multiple_of(stages)) {
        return Err(Error::Config(format!(
            "the interleaved schedule needs a micro-batch count that is a multiple of \
             --pipeline-model-parallel-size {stages}, and this global batch gives {micro} \
             (--global-batch-size / (--micro-batch-size x data-parallel size))"
        )));
    }
    Ok(())
}

/// Layers of model chunk `chunk` on stage `rank`: the model is cut into `stages * chunks`
/// virtual stages in order (stage r holds virtual stages r, r + p, ...). `first` and `last`
/// optionally fix the layer counts of the first and last virtual stage, the rest splitting the
/// remaining layers evenly.
pub fn chunk_layers(
    num_layers: usize,
    stages: usize,
    chunks: usize,
    rank: usize,
    chunk: usize,
    first: Option<usize>,
    last: Option<usize>,
) -> Result<Range<usize>> {
    let virtual_stages = stages * chunks;
    let mut sizes = vec![0usize; virtual_stages];
    let mut rest = num_layers;
    let mut middle = virtual_stages;
    if let Some(f) = first {
        sizes[0] = f;
        rest = rest
            .checked_sub(f)
            .ok_or_else(|| Error::Config("--decoder-first-pipeline-num-layers exceeds --num-layers".into()))?;
        middle -= 1;
    }
    if let Some(l) = last {
        if virtual_stages < 2 {
            return Err(Error::Config("--decoder-last-pipeline-num-layers needs a pipeline".into()));
        }
        sizes[virtual_stages - 1] = l;
        rest = rest
            .checked_sub(l)
            .ok_or_else(|| Error::Config("--decoder-last-pipeline-num-layers exceeds --num-layers".into()))?;
        middle -= 1;
    }
    if middle > 0 {
        if !rest.is_multiple_of(middle) {
            return Err(Error::Config(format!(
                "{rest} layers do not split evenly over {middle} pipeline stages (--num-layers {num_layers}, \
                 --pipeline-model-parallel-size {stages}{})",
                if chunks > 1 { format!(" x {chunks} virtual stages") } else { String::new() }
            )));
        }
        let start = usize::from(first.is_some());
        let end = virtual_stages - usize::from(last.is_some());
        sizes[start..end].fill(rest / middle);
    } else if rest != 0 {
        return Err(Error::Config(format!("the first and last stage layer counts leave {rest} layers unplaced")));
    }
    let index = chunk * stages + rank;
    let start: usize = sizes[..index].iter().sum();
    Ok(start..start + sizes[index])
}

#[cfg(test)]
mod tests {
    use super::*;
    use Pass::{Backward as B, Forward as F};

    fn check_complete(passes: &[Pass], micro: usize, chunks: usize) {
        for m in 0..micro {
            for c in 0..chunks {
                let fi = passes.iter().position(|p| *p == F { micro: m, chunk: c }).expect("forward present");
                let bi = passes.iter().position(|p| *p == B { micro: m, chunk: c }).expect("backward present");
                assert!(fi < bi, "backward of ({m}, {c}) before its forward");
            }
        }
        assert_eq!(passes.len(), 2 * micro * chunks);
    }

    #[test]
    fn every_schedule_delivers_its_messages_in_order() {
        for stages in 1..=6 {
            for micro in 1..=13 {
                for (schedule, chunks) in [(Schedule::GPipe, 1), (Schedule::OneFOneB, 1)]
                    .into_iter()
                    .chain((2..=4).map(|v| (Schedule::Interleaved, v)))
                {
                    if validate(schedule, stages, chunks, micro).is_err() {
                        continue;
                    }
                    let order = |s| passes(schedule, stages, s, micro, chunks);
                    fifo_order(stages, chunks, &order)
                        .unwrap_or_else(|e| panic!("{schedule:?} p={stages} v={chunks} m={micro}: {e}"));
                    fifo_order(stages, chunks, &|_| forward_passes(micro, chunks))
                        .unwrap_or_else(|e| panic!("evaluation p={stages} v={chunks} m={micro}: {e}"));
                }
            }
        }
    }

    #[test]
    fn an_order_that_fifo_delivery_would_mix_up_is_named() {
        // Stage 1 takes micro-batch 1 before 0: in-order delivery would swap the activations.
        let order = |s: usize| {
            let mut p = passes(Schedule::GPipe, 2, s, 2, 1);
            if s == 1 {
                p.swap(0, 1);
            }
            p
        };
        let e = fifo_order(2, 1, &order).unwrap_err().to_string();
        assert!(e.contains("activations from stage 0 to stage 1: message 0 is sent as Some((0, 0)) and received as Some((1, 0))"), "{e}");
    }

    #[test]
    fn one_f_one_b_keeps_p_minus_rank_in_flight() {
        for p in [2, 4] {
            for m in [p, 2 * p, 4 * p + 1] {
                for r in 0..p {
                    let s = passes(Schedule::OneFOneB, p, r, m, 1);
                    check_complete(&s, m, 1);
                    assert_eq!(peak_in_flight(&s), (p - r).min(m), "p {p} m {m} rank {r}");
                }
            }
        }
        let g = passes(Schedule::GPipe, 4, 1, 8, 1);
        check_complete(&g, 8, 1);
        assert_eq!(peak_in_flight(&g), 8);
    }

    #[test]
    fn interleaved_matches_megatrons_worked_example() {
        // p=2, v=2, m=4 (shared/reference/megatron.md §4.4).
        let r0 = passes(Schedule::Interleaved, 2, 0, 4, 2);
        let expect0 = vec![
            F { micro: 0, chunk: 0 },
            F { micro: 1, chunk: 0 },
            F { micro: 0, chunk: 1 },
            F { micro: 1, chunk: 1 },
            F { micro: 2, chunk: 0 },
            B { micro: 0, chunk: 1 },
            F { micro: 3, chunk: 0 },
            B { micro: 1, chunk: 1 },
            F { micro: 2, chunk: 1 },
            B { micro: 0, chunk: 0 },
            F { micro: 3, chunk: 1 },
            B { micro: 1, chunk: 0 },
            B { micro: 2, chunk: 1 },
            B { micro: 3, chunk: 1 },
            B { micro: 2, chunk: 0 },
            B { micro: 3, chunk: 0 },
        ];
        assert_eq!(r0, expect0);
        let r1 = passes(Schedule::Interleaved, 2, 1, 4, 2);
        assert_eq!(
            &r1[..4],
            &[F { micro: 0, chunk: 0 }, F { micro: 1, chunk: 0 }, F { micro: 0, chunk: 1 }, B { micro: 0, chunk: 1 }]
        );
        check_complete(&r0, 4, 2);
        check_complete(&r1, 4, 2);
        assert!(validate(Schedule::Interleaved, 2, 2, 3).is_err());
        assert!(validate(Schedule::Interleaved, 1, 2, 4).is_err());
    }

    #[test]
    fn layers_split_into_virtual_stages() {
        // L=16, p=4, v=2: rank 0 holds layers 0-1 and 8-9.
        assert_eq!(chunk_layers(16, 4, 2, 0, 0, None, None).unwrap(), 0..2);
        assert_eq!(chunk_layers(16, 4, 2, 0, 1, None, None).unwrap(), 8..10);
        assert_eq!(chunk_layers(16, 4, 2, 3, 1, None, None).unwrap(), 14..16);
        assert_eq!(chunk_layers(10, 4, 1, 0, 0, Some(1), Some(3)).unwrap(), 0..1);
        assert_eq!(chunk_layers(10, 4, 1, 1, 0, Some(1), Some(3)).unwrap(), 1..4);
        assert_eq!(chunk_layers(10, 4, 1, 3, 0, Some(1), Some(3)).unwrap(), 7..10);
        assert!(chunk_layers(10, 4, 1, 0, 0, None, None).unwrap_err().to_string().contains("do not split evenly"));
    }
}
