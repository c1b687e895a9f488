//! The timing record of a run on this rank: trace spans of forward, backward, send, receive and
//! optimizer work, and on a track of its own the communication the step waits for (the gradient
//! sync: the data-parallel buckets' wait and the other sums) (`--timing-trace`, written as one
//! Chrome trace of every rank), and the pipeline busy and wall time behind the measured bubble
//! fraction.

use crate::error::{Error, Result};
use crate::parallel::grid::{Grid, Groups};
use std::path::Path;
use std::time::Instant;

/// A span of the timing trace: what ran, for which (micro-batch, chunk), from when, how long.
#[derive(Clone, Copy, Debug)]
struct Span {
    kind: SpanKind,
    micro: usize,
    chunk: usize,
    start_us: f64,
    dur_us: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpanKind {
    Forward,
    Backward,
    Send,
    Recv,
    Optimizer,
    /// A zero-bubble schedule's W pass (its B pass is a `Backward` span).
    Weight,
    /// The gradient sync after the pipeline's passes: waiting for the data-parallel buckets'
    /// all-reduces (or the distributed optimizer's reduce-scatters) and the tied-embedding and
    /// sequence-parallel sums: the step's exposed gradient communication.
    GradSync,
}

impl SpanKind {
    fn name(self) -> &'static str {
        match self {
            SpanKind::Forward => "forward",
            SpanKind::Backward => "backward",
            SpanKind::Send => "send",
            SpanKind::Recv => "recv",
            SpanKind::Optimizer => "optimizer",
            SpanKind::Weight => "weight",
            SpanKind::GradSync => "grad-sync",
        }
    }
    fn from_code(code: f64) -> SpanKind {
        const ALL: [SpanKind; 7] = [
            SpanKind::Forward,
            SpanKind::Backward,
            SpanKind::Send,
            SpanKind::Recv,
            SpanKind::Optimizer,
            SpanKind::Weight,
            SpanKind::GradSync,
        ];
        ALL[code as usize]
    }
    fn code(self) -> f64 {
        self as usize as f64
    }
}

/// The timing record of this rank: trace spans (with `--timing-trace`) and the per-iteration
/// pipeline busy and wall time behind the measured bubble fraction.
pub(super) struct Timeline {
    origin: Instant,
    record_spans: bool,
    spans: Vec<Span>,
    pub busy_secs: f64,
    pub wall_secs: f64,
    /// The most micro-batch activation sets held at once in one iteration.
    pub peak_live: usize,
}

impl Timeline {
    /// A timeline starting now; it keeps spans only for a trace (`record_spans`).
    pub fn new(record_spans: bool) -> Timeline {
        Timeline {
            origin: Instant::now(),
            record_spans,
            spans: Vec::new(),
            busy_secs: 0.0,
            wall_secs: 0.0,
            peak_live: 0,
        }
    }
    /// Keeps spans from now on (`on`) or stops keeping them (`--profile`'s range).
    pub fn record(&mut self, on: bool) {
        self.record_spans = on;
    }
    pub fn now_us(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1e6
    }
    pub fn span(&mut self, kind: SpanKind, micro: usize, chunk: usize, start_us: f64) {
        let dur_us = self.now_us() - start_us;
        if matches!(kind, SpanKind::Forward | SpanKind::Backward | SpanKind::Weight) {
            self.busy_secs += dur_us * 1e-6;
        }
        if self.record_spans {
            self.spans.push(Span { kind, micro, chunk, start_us, dur_us });
        }
    }
}

/// Writes the Chrome trace of every rank's spans (gathered to rank 0) to `path`.
pub(super) fn write_trace(path: &Path, groups: &Groups, tl: &Timeline) -> Result<()> {
    let world = &*groups.world;
    let mine: Vec<f64> =
        tl.spans.iter().flat_map(|s| [s.kind.code(), s.micro as f64, s.chunk as f64, s.start_us, s.dur_us]).collect();
    let mut counts = vec![0f64; world.size()];
    world.all_gather(&[mine.len() as f64], &mut counts);
    let longest = counts.iter().fold(0f64, |m, &c| m.max(c)) as usize;
    let mut padded = mine.clone();
    padded.resize(longest, 0.0);
    let mut all = vec![0f64; longest * world.size()];
    world.all_gather(&padded, &mut all);
    if groups.grid.rank != 0 {
        return Ok(());
    }
    let mut events = Vec::new();
    for (rank, block) in all.chunks(longest.max(1)).enumerate().take(world.size()) {
        let g = Grid { rank, ..groups.grid };
        let (tp, dp, pp) = (rank % g.tp, (rank / g.tp) % g.dp, rank / (g.tp * g.dp));
        // Each rank's passes on track `rank`, the communication it waited for on track
        // `world + rank` beside it.
        let comm_tid = world.size() + rank;
        events.push(format!(
            "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": {rank}, \"args\": {{\"name\": \"rank {rank} (pp {pp}, tp {tp}, dp {dp})\"}}}}"
        ));
        events.push(format!(
            "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": {comm_tid}, \"args\": {{\"name\": \"rank {rank} communication waited for\"}}}}"
        ));
        for e in block[..counts[rank] as usize].chunks_exact(5) {
            let kind = SpanKind::from_code(e[0]);
            let (label, tid) = match kind {
                SpanKind::Optimizer => ("optimizer".to_string(), rank),
                SpanKind::GradSync => ("gradient sync".to_string(), comm_tid),
                _ => (format!("{} mb{} c{}", kind.name(), e[1], e[2]), rank),
            };
            events.push(format!(
                "{{\"name\": \"{label}\", \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": 0, \"tid\": {tid}}}",
                kind.name(),
                e[3],
                e[4]
            ));
        }
    }
    let text = format!("{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{}\n]}}\n", events.join(",\n"));
    std::fs::write(path, text).map_err(|e| Error::io(path, "write", e))
}
