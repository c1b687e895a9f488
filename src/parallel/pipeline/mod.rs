//! Pipeline schedules (Megatron's; docs/design.md, Pipeline schedules): for each stage, the ordered
//! list of forward and backward passes over (micro-batch, model chunk) that GPipe, 1F1B and
//! interleaved 1F1B prescribe, and zero-bubble H1 (Qi et al., ICLR 2024), whose backward is
//! split into B (input gradients) and W (weight gradients); and the split of layers into stages
//! and virtual chunks. The
//! executor (`train.rs`) runs a stage's list in order; sends are non-blocking and receives are
//! matched by tag, so any of these orders completes without deadlock.

mod replay;
mod zero_bubble;

use crate::error::{Error, Result};
use std::ops::Range;

pub use replay::replay_bubble;

/// One pass of the schedule on this stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward {
        micro: usize,
        chunk: usize,
    },
    /// The whole backward.
    Backward {
        micro: usize,
        chunk: usize,
    },
    /// A zero-bubble schedule's B: the backward but for the linear layers' weight gradients; it
    /// takes and sends the gradients, and frees the activations, as `Backward` does.
    Input {
        micro: usize,
        chunk: usize,
    },
    /// A zero-bubble schedule's W: the linear layers' weight gradients, after B.
    Weight {
        micro: usize,
        chunk: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// All forwards, then all backwards (stashes every micro-batch).
    GPipe,
    /// One forward, one backward in the steady state; stage r keeps at most p - r in flight.
    OneFOneB,
    /// 1F1B over v virtual chunks per stage; bubble (p-1)/(v m).
    Interleaved,
    /// Zero-bubble H1: 1F1B's warm-up, each backward split into B and W, stage r deferring r W
    /// passes into the cool-down; at most p micro-batches held (1F1B's stage 0).
    ZbH1,
    /// Zero-bubble V: two chunks per stage placed in a V (`Placement`), each backward split;
    /// at most 1F1B's stage-0 activations on every stage.
    ZbV,
}

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule> {
        match s {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            "interleaved-1f1b" | "interleaved" => Ok(Schedule::Interleaved),
            "zb-h1" => Ok(Schedule::ZbH1),
            "zb-v" => Ok(Schedule::ZbV),
            _ => Err(Error::flag(
                "--pipeline-schedule",
                format!("'{s}'"),
                "gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v",
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved-1f1b",
            Schedule::ZbH1 => "zb-h1",
            Schedule::ZbV => "zb-v",
        }
    }

    /// Whether the schedule splits backward into B and W passes.
    pub fn splits_backward(self) -> bool {
        matches!(self, Schedule::ZbH1 | Schedule::ZbV)
    }

    /// Whether the schedule places its two chunks per stage in a V (`Placement`).
    pub fn v_shaped(self) -> bool {
        self == Schedule::ZbV
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
        Schedule::ZbH1 => zero_bubble::zb_h1(stages, rank, micro),
        Schedule::ZbV => zero_bubble::zb_v(stages, rank, micro),
    }
}

/// The most micro-batch activations (per chunk) alive at once when running `passes`: from a
/// micro-batch's forward to its backward, or to its W pass where the backward is split (W reads
/// the activations B left).
pub fn peak_in_flight(passes: &[Pass]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for p in passes {
        match p {
            Pass::Forward { .. } => {
                live += 1;
                peak = peak.max(live);
            }
            Pass::Backward { .. } | Pass::Weight { .. } => live -= 1,
            Pass::Input { .. } => {}
        }
    }
    peak
}

/// Where the model's `stages * chunks` virtual stages (in model order) sit on the pipeline:
/// stage r holds virtual stages r, r + p, ... (Megatron's interleaving; one chunk: stage r holds
/// r), or, under zb-v, two in a V: r and 2p - 1 - r, so the first and the last virtual stage
/// share stage 0 and the turn from the first arm to the second stays on stage p - 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub stages: usize,
    pub chunks: usize,
    pub v: bool,
}

impl Placement {
    /// Megatron's placement (`v` false), or zb-v's V.
    pub fn new(schedule: Schedule, stages: usize, chunks: usize) -> Placement {
        Placement { stages, chunks, v: schedule.v_shaped() }
    }

    /// The virtual stage of `chunk` on `stage`.
    pub fn virtual_stage(self, stage: usize, chunk: usize) -> usize {
        if self.v && chunk == 1 {
            2 * self.stages - 1 - stage
        } else {
            chunk * self.stages + stage
        }
    }

    /// The (stage, chunk) holding virtual stage `vs`.
    pub fn place(self, vs: usize) -> (usize, usize) {
        if self.v && vs >= self.stages {
            (2 * self.stages - 1 - vs, 1)
        } else {
            (vs % self.stages, vs / self.stages)
        }
    }

    /// The last virtual stage (the loss's).
    pub fn last(self) -> usize {
        self.stages * self.chunks - 1
    }

    /// Whether `chunk` on `stage` is the model's first virtual stage (the embedding's) and its
    /// last (the loss's).
    pub fn ends(self, stage: usize, chunk: usize) -> (bool, bool) {
        let vs = self.virtual_stage(stage, chunk);
        (vs == 0, vs == self.last())
    }

    /// Where (stage, chunk) sends its message: activations to the next virtual stage, gradients
    /// (`backward`) to the previous; the (stage, chunk) the message feeds there.
    pub fn target(self, stage: usize, chunk: usize, backward: bool) -> (usize, usize) {
        let vs = self.virtual_stage(stage, chunk);
        self.place(if backward { vs - 1 } else { vs + 1 })
    }

    /// Where the message (stage, chunk) takes comes from: the previous virtual stage's
    /// activations, the next one's gradients (`backward`).
    pub fn source(self, stage: usize, chunk: usize, backward: bool) -> (usize, usize) {
        let vs = self.virtual_stage(stage, chunk);
        self.place(if backward { vs + 1 } else { vs - 1 })
    }

    /// Whether the messages `chunk` sends and takes (`backward`: gradients) travel toward lower
    /// stage numbers: gradients do, activations do not (the interleaved wrap from the last stage
    /// to the first counts as onward), and along a V's second arm the other way round.
    pub fn upward(self, chunk: usize, backward: bool) -> bool {
        backward != (self.v && chunk == 1)
    }
}

/// The passes of evaluation (forward only): every (micro-batch, chunk) in order.
pub fn forward_passes(micro: usize, chunks: usize) -> Vec<Pass> {
    (0..micro).flat_map(|m| (0..chunks).map(move |c| Pass::Forward { micro: m, chunk: c })).collect()
}

/// Pipeline messages between two stages, one direction and one kind (activations forward or
/// gradients backward), named by the (micro-batch, chunk) they feed on the receiving stage.
type Stream = Vec<(usize, usize)>;

/// A link: which kind of message (gradients: `backward`), from which stage to which.
type Link = (bool, usize, usize);

/// The messages `pass` on stage `s` takes and sends: each its link and the (micro-batch, chunk)
/// it feeds on the receiving stage. Forward takes activations after the first virtual stage and
/// sends them before the last; backward takes and sends gradients the other way round. A link
/// from a stage to itself (a V's turn) is a hand-over in memory, not a message.
fn pass_messages(lay: Placement, s: usize, pass: Pass) -> [Option<(Link, (usize, usize))>; 2] {
    let (backward, micro, chunk) = match pass {
        Pass::Forward { micro, chunk } => (false, micro, chunk),
        Pass::Backward { micro, chunk } | Pass::Input { micro, chunk } => (true, micro, chunk),
        Pass::Weight { .. } => return [None, None],
    };
    let vs = lay.virtual_stage(s, chunk);
    let (takes, sends) = if backward { (vs < lay.last(), vs > 0) } else { (vs > 0, vs < lay.last()) };
    let (to, to_chunk) = if sends { lay.target(s, chunk, backward) } else { (s, chunk) };
    let from = if takes { lay.source(s, chunk, backward).0 } else { s };
    [takes.then_some(((backward, from, s), (micro, chunk))), sends.then_some(((backward, s, to), (micro, to_chunk)))]
}

/// Whether a message goes from a stage to itself (a V's turn): handed over, never sent.
fn local(((_, from, to), _): &(Link, (usize, usize))) -> bool {
    from == to
}

/// Whether FIFO delivery carries every stage's pipeline messages right when `passes(s)` is the
/// order stage s runs its passes in: for each kind (forward activations, backward gradients) and
/// each ordered pair of stages, the order the sender sends must be the order the receiver
/// receives. NCCL's point-to-point calls match in issue order per communicator and peer (MPI's
/// tags are not needed), so the device path runs only layouts this holds for. `Err` names the
/// first pair and position where the orders part.
pub fn fifo_order(lay: Placement, passes: &dyn Fn(usize) -> Vec<Pass>) -> Result<()> {
    use std::collections::BTreeMap;
    // (backward?, sender, receiver) -> messages in the order the sender sends / receiver takes.
    let (mut sent, mut taken): (BTreeMap<_, Stream>, BTreeMap<_, Stream>) = Default::default();
    for s in 0..lay.stages {
        for pass in passes(s) {
            let [takes, sends] = pass_messages(lay, s, pass);
            if let Some((link, feeds)) = takes {
                taken.entry(link).or_default().push(feeds);
            }
            if let Some((link, feeds)) = sends {
                sent.entry(link).or_default().push(feeds);
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

/// When stage `stage` may write again into the buffer of each message it sends while running
/// `passes(stage)` (in its send order), with no wait: `Some(n)` once it has made `n` receives,
/// `None` only after the pass list (when its sends are waited for). The rule is causal, on the
/// streams alone: the stage that receives message X sends this stage a message in the pass that
/// took X or a later one, so that message leaves after X arrived whole (its send is ordered after
/// the compute that waited for X), and this stage's work ordered after receiving it (compute, and
/// receives, which wait for compute) cannot overtake X's send reading the buffer. With in-order
/// delivery per link (`fifo_order`), the n-th send on a link is the receiver's n-th receive on it.
/// So the buffers a stage holds at once, and with them the buffers it allocates, are a function
/// of the schedule alone (`message_buffers`). Hand-overs within a stage are no messages here.
pub fn send_releases(lay: Placement, stage: usize, passes: &dyn Fn(usize) -> Vec<Pass>) -> Vec<Option<usize>> {
    // Per stage, in pass order: (pass index, link) of each receive and each send.
    let mut taken: Vec<Vec<(usize, Link)>> = vec![Vec::new(); lay.stages];
    let mut sent: Vec<Vec<(usize, Link)>> = vec![Vec::new(); lay.stages];
    for s in 0..lay.stages {
        for (i, pass) in passes(s).into_iter().enumerate() {
            let [takes, sends] = pass_messages(lay, s, pass).map(|m| m.filter(|m| !local(m)));
            taken[s].extend(takes.map(|(link, _)| (i, link)));
            sent[s].extend(sends.map(|(link, _)| (i, link)));
        }
    }
    // The n-th message on `link` as its receiver takes it: (pass index, receive ordinal there).
    let receipt = |link: Link, n: usize| -> Option<(usize, usize)> {
        let on = taken[link.2].iter().enumerate().filter(|(_, (_, l))| *l == link).nth(n);
        on.map(|(ordinal, &(pass, _))| (pass, ordinal))
    };
    let mut sent_on = std::collections::BTreeMap::<Link, usize>::new();
    sent[stage]
        .iter()
        .map(|&(_, link)| {
            let n = sent_on.entry(link).or_default();
            let (took_at, _) = receipt(link, *n)?;
            *n += 1;
            let to = link.2;
            // The first message back from `to`, on either kind, sent in the pass that took this
            // one or later; released once this stage has received it.
            [false, true]
                .into_iter()
                .filter_map(|backward| {
                    let back = (backward, to, stage);
                    let later = sent[to].iter().filter(|(_, l)| *l == back).position(|&(pass, _)| pass >= took_at)?;
                    receipt(back, later).map(|(_, ordinal)| ordinal + 1)
                })
                .min()
        })
        .collect()
}

/// The message buffers stage `stage` holds at most at once while running `passes(stage)` with
/// `send_releases`' rule: a receive takes a buffer, a pass whose output is sent takes one for it,
/// the received one is free again once its pass ran, a sent one at its release (or the end), one
/// handed over within the stage once the pass that takes it ran.
pub fn message_buffers(lay: Placement, stage: usize, passes: &dyn Fn(usize) -> Vec<Pass>) -> usize {
    let releases = send_releases(lay, stage, passes);
    let (mut held, mut peak, mut received) = (0usize, 0usize, 0usize);
    let mut in_flight: Vec<Option<usize>> = Vec::new();
    let mut releases = releases.into_iter();
    for pass in passes(stage) {
        let [takes, sends] = pass_messages(lay, stage, pass);
        let mut take = |held: &mut usize, received: usize| {
            let before = in_flight.len();
            in_flight.retain(|r| r.is_none_or(|r| r > received));
            *held -= before - in_flight.len();
            *held += 1;
            peak = peak.max(*held);
        };
        if takes.as_ref().is_some_and(|m| !local(m)) {
            take(&mut held, received);
            received += 1;
        }
        if sends.is_some() {
            take(&mut held, received);
        }
        if takes.is_some() {
            held -= 1;
        }
        if sends.as_ref().is_some_and(|m| !local(m)) {
            in_flight.push(releases.next().flatten());
        }
    }
    peak
}

/// Checks the pipeline layout: virtual chunks need p > 1, the interleaved schedule needs a
/// micro-batch count that is a multiple of p (Megatron's groups of p per chunk).
pub fn validate(schedule: Schedule, stages: usize, chunks: usize, micro: usize) -> Result<()> {
    if schedule == Schedule::ZbV && (stages < 2 || chunks != 2) {
        return Err(Error::Config(format!(
            "--pipeline-schedule zb-v places two model chunks on each of at least two stages (a V); this layout \
             has {stages} stage(s) of {chunks} chunk(s) (leave --num-layers-per-virtual-pipeline-stage out, or \
             make it --num-layers / (2 x --pipeline-model-parallel-size))"
        )));
    }
    if chunks > 1 && stages == 1 {
        return Err(Error::Config(
            "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1".into(),
        ));
    }
    if chunks > 1 && !matches!(schedule, Schedule::Interleaved | Schedule::ZbV) {
        // zb-h1 included: its table is built for one chunk per stage.
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
/// virtual stages in order, placed by `lay` (stage r holds virtual stages r, r + p, ..., or a
/// V's r and 2p - 1 - r). `first` and `last`
/// optionally fix the layer counts of the first and last virtual stage, the rest splitting the
/// remaining layers evenly.
pub fn chunk_layers(
    num_layers: usize,
    lay: Placement,
    rank: usize,
    chunk: usize,
    first: Option<usize>,
    last: Option<usize>,
) -> Result<Range<usize>> {
    let (stages, chunks, virtual_stages) = (lay.stages, lay.chunks, lay.stages * lay.chunks);
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
    let index = lay.virtual_stage(rank, chunk);
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
                for (schedule, chunks) in
                    [(Schedule::GPipe, 1), (Schedule::OneFOneB, 1), (Schedule::ZbH1, 1), (Schedule::ZbV, 2)]
                        .into_iter()
                        .chain((2..=4).map(|v| (Schedule::Interleaved, v)))
                {
                    if validate(schedule, stages, chunks, micro).is_err() {
                        continue;
                    }
                    let order = |s| passes(schedule, stages, s, micro, chunks);
                    fifo_order(Placement::new(schedule, stages, chunks), &order)
                        .unwrap_or_else(|e| panic!("{schedule:?} p={stages} v={chunks} m={micro}: {e}"));
                    fifo_order(Placement::new(schedule, stages, chunks), &|_| forward_passes(micro, chunks))
                        .unwrap_or_else(|e| panic!("evaluation p={stages} v={chunks} m={micro}: {e}"));
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_on_two_stages_frees_each_send_at_its_answer() {
        // Stage 0: F0 F1 B0 F2 B1 F3 B2 B3; stage 1: F0 B0 F1 B1 F2 B2 F3 B3. Stage 1 takes
        // activation k at its F_k and answers with gradient k at B_k, stage 0's k-th receive: its
        // k-th send is free once it has received k + 1 times. Stage 1's gradient k is taken at
        // stage 0's B_k; the activations sent after that are 2 and 3 (stage 1's receives 2 and 3)
        // for gradients 0 and 1, none for the last two.
        let order = |s| passes(Schedule::OneFOneB, 2, s, 4, 1);
        let one = Placement::new(Schedule::OneFOneB, 2, 1);
        assert_eq!(send_releases(one, 0, &order), [Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(send_releases(one, 1, &order), [Some(3), Some(4), None, None]);
        // Stage 0 holds two activations in flight and a received gradient; never sending four
        // before reusing one (every send kept to the step's end would be five buffers).
        assert_eq!(message_buffers(one, 0, &order), 3);
        assert_eq!(message_buffers(one, 1, &order), 3);
        // Evaluation: nothing answers a forward-only pass list on two stages.
        let eval = |_| forward_passes(4, 1);
        assert_eq!(send_releases(one, 0, &eval), [None; 4]);
    }

    #[test]
    fn every_schedule_frees_its_sends_at_an_answer_and_holds_a_bounded_pool() {
        for stages in 2..=5 {
            for micro in 1..=9 {
                for (schedule, chunks) in [
                    (Schedule::GPipe, 1),
                    (Schedule::OneFOneB, 1),
                    (Schedule::ZbH1, 1),
                    (Schedule::ZbV, 2),
                    (Schedule::Interleaved, 2),
                    (Schedule::Interleaved, 3),
                ] {
                    if validate(schedule, stages, chunks, micro).is_err() {
                        continue;
                    }
                    let order = |s| passes(schedule, stages, s, micro, chunks);
                    let lay = Placement::new(schedule, stages, chunks);
                    let case = format!("{schedule:?} p={stages} v={chunks} m={micro}");
                    for s in 0..stages {
                        let list = order(s);
                        // Device messages: a V's hand-overs within the stage are none.
                        let messages: Vec<_> =
                            list.iter().map(|&p| pass_messages(lay, s, p).map(|m| m.filter(|m| !local(m)))).collect();
                        let receives = messages.iter().filter(|[t, _]| t.is_some()).count();
                        let sends = messages.iter().filter(|[_, x]| x.is_some()).count();
                        let releases = send_releases(lay, s, &order);
                        assert_eq!(releases.len(), sends, "{case} stage {s}");
                        // A send is freed only by a receive after it: the n-th receive comes
                        // after the send in this stage's pass order.
                        let mut receive_pass = Vec::new();
                        let mut send_pass = Vec::new();
                        for (i, [t, x]) in messages.iter().enumerate() {
                            receive_pass.extend(t.map(|_| i));
                            send_pass.extend(x.map(|_| i));
                        }
                        for (k, r) in releases.iter().enumerate() {
                            if let Some(n) = *r {
                                assert!(
                                    n <= receives && receive_pass[n - 1] > send_pass[k],
                                    "{case} stage {s} send {k}"
                                );
                            }
                        }
                        // Outside GPipe (which holds every micro-batch by design) the pool is the
                        // schedule's, not the step's: at most the activations in flight and their
                        // gradients' answers, not every send of the step.
                        let pool = message_buffers(lay, s, &order);
                        let in_flight = peak_in_flight(&list);
                        assert!(pool >= 1 && pool <= 2 * in_flight + 2, "{case} stage {s}: {pool} buffers");
                        if schedule != Schedule::GPipe && micro >= 2 * stages {
                            assert!(pool < sends + 1, "{case} stage {s}: {pool} buffers for {sends} sends");
                        }
                    }
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
        let e = fifo_order(Placement::new(Schedule::GPipe, 2, 1), &order).unwrap_err().to_string();
        assert!(
            e.contains(
                "activations from stage 0 to stage 1: message 0 is sent as Some((0, 0)) and received as Some((1, 0))"
            ),
            "{e}"
        );
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

    /// zb-h1: every micro-batch's F, B and W once each, in that order; stage r holds from F to B
    /// 1F1B's p - r and from F to W at most p (1F1B's stage 0); a worked example.
    #[test]
    fn zero_bubble_h1_splits_each_backward_and_keeps_one_f_one_b_memory() {
        use Pass::{Forward as F, Input as B, Weight as W};
        for p in 1..=5 {
            for m in 1..=11 {
                for r in 0..p {
                    let list = passes(Schedule::ZbH1, p, r, m, 1);
                    let case = format!("p {p} m {m} rank {r}");
                    assert_eq!(list.len(), 3 * m, "{case}");
                    let at =
                        |want: Pass| list.iter().position(|&x| x == want).unwrap_or_else(|| panic!("{case}: {want:?}"));
                    for k in 0..m {
                        let (f, b, w) =
                            (at(F { micro: k, chunk: 0 }), at(B { micro: k, chunk: 0 }), at(W { micro: k, chunk: 0 }));
                        assert!(f < b && b < w, "{case}: micro-batch {k} at {f} {b} {w}");
                    }
                    let one_f_one_b = passes(Schedule::OneFOneB, p, r, m, 1);
                    let (mut to_b, mut most_to_b) = (0usize, 0usize);
                    for pass in &list {
                        match pass {
                            F { .. } => to_b += 1,
                            B { .. } => to_b -= 1,
                            _ => {}
                        }
                        most_to_b = most_to_b.max(to_b);
                    }
                    assert_eq!(most_to_b, peak_in_flight(&one_f_one_b), "{case}: held from F to B");
                    let stage0 = peak_in_flight(&passes(Schedule::OneFOneB, p, 0, m, 1));
                    assert!(peak_in_flight(&list) <= stage0, "{case}: held from F to W");
                }
            }
        }
        let f = |micro| F { micro, chunk: 0 };
        let (b, w) = (|micro| B { micro, chunk: 0 }, |micro| W { micro, chunk: 0 });
        assert_eq!(
            passes(Schedule::ZbH1, 2, 0, 4, 1),
            [f(0), f(1), b(0), w(0), f(2), b(1), w(1), f(3), b(2), w(2), b(3), w(3)]
        );
        // Stage 1 leaves W0 until after B1, and runs it in the time stage 0 spends on B1.
        assert_eq!(
            passes(Schedule::ZbH1, 2, 1, 4, 1),
            [f(0), b(0), f(1), b(1), w(0), f(2), b(2), w(1), f(3), b(3), w(2), w(3)]
        );
        assert_eq!(Schedule::parse("zb-h1").unwrap().name(), "zb-h1");
        assert!(validate(Schedule::ZbH1, 2, 2, 4).is_err(), "one chunk per stage");
    }

    #[test]
    fn interleaved_matches_megatrons_worked_example() {
        // p=2, v=2, m=4 (docs/design.md's table).
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
        assert_eq!(chunk_layers(16, Placement::new(Schedule::Interleaved, 4, 2), 0, 0, None, None).unwrap(), 0..2);
        assert_eq!(chunk_layers(16, Placement::new(Schedule::Interleaved, 4, 2), 0, 1, None, None).unwrap(), 8..10);
        assert_eq!(chunk_layers(16, Placement::new(Schedule::Interleaved, 4, 2), 3, 1, None, None).unwrap(), 14..16);
        assert_eq!(chunk_layers(10, Placement::new(Schedule::OneFOneB, 4, 1), 0, 0, Some(1), Some(3)).unwrap(), 0..1);
        assert_eq!(chunk_layers(10, Placement::new(Schedule::OneFOneB, 4, 1), 1, 0, Some(1), Some(3)).unwrap(), 1..4);
        assert_eq!(chunk_layers(10, Placement::new(Schedule::OneFOneB, 4, 1), 3, 0, Some(1), Some(3)).unwrap(), 7..10);
        assert!(chunk_layers(10, Placement::new(Schedule::OneFOneB, 4, 1), 0, 0, None, None)
            .unwrap_err()
            .to_string()
            .contains("do not split evenly"));
    }
}
