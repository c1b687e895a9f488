//! What a run reports besides its iteration lines: the start-up lines (version, model and
//! layout, placement, collectives, parameters), `--log-comm` (elements moved per layer and per
//! group), `--log-memory` (predicted beside measured bytes per rank), `--log-device-work` (each
//! iteration's device work), and the per-stage pipeline bubble and in-flight activations.

use super::chunk::Chunk;
use super::setup::{Datasets, Setup};
use super::TrainSummary;
use crate::comm::runtime::Runtime;
use crate::comm::CommCounters;
use crate::device::{Device, WorkCounters};
use crate::optim::rampup::BatchSchedule;
use crate::parallel::grid::{Grid, Groups};
use crate::parallel::pipeline::Schedule;

/// The start-up lines: rank 0's version and run description, every rank's placement, and rank
/// 0's line on which path collectives take.
pub(super) fn start_up<D: Device>(setup: &Setup<D>, rt: &Runtime) {
    let (cfg, m, grid) = (&setup.cfg, &setup.cfg.model, &setup.grid);
    if setup.say {
        println!(" trident {} ({})", env!("CARGO_PKG_VERSION"), env!("TRIDENT_BUILD_INFO"));
        println!(
            " trident train: preset {} | {} layers, hidden {}, {} heads, seq {}, vocab {} (padded {}) | {} ranks: {}{}{}{} | \
             MPI: {} | device {} | peak {:.1} GFLOP/s per rank ({})",
            cfg.preset,
            m.num_layers,
            m.hidden_size,
            m.num_attention_heads,
            cfg.seq_length,
            m.vocab_size,
            m.padded_vocab_size,
            rt.world_size,
            grid.describe(),
            if setup.mp.sequence_parallel { ", sequence parallel" } else { "" },
            if grid.pp > 1 {
                format!(", {} schedule, {} chunk(s) per stage", setup.stage.schedule.name(), setup.stage.plans.len())
            } else {
                String::new()
            },
            if rt.oversubscribed { ", oversubscribed (collectives yield)" } else { "" },
            rt.library,
            setup.dev.describe(),
            setup.peak.gflops,
            setup.peak.what
        );
    }
    println!(" {}", setup.placement);
    if setup.say {
        println!(" {}", setup.collectives);
        for (name, why) in &setup.cfg.megatron_no_effect {
            println!(" {name}: accepted from Megatron, no effect ({why})");
        }
        for note in &setup.cfg.notes {
            println!(" {note}");
        }
    }
}

/// Rank 0's line on the parameters, the batch and the data.
pub(super) fn parameters<D: Device>(setup: &Setup<D>, chunks: &[Chunk<D>], data: &Datasets) {
    if setup.say {
        println!(
            " parameters: {} on this rank | micro-batch {} x {} micro-batches x {} data-parallel = global batch {} | \
             {} gradient buckets | train samples available {}",
            chunks.iter().map(|c| c.model.params.num_elements()).sum::<usize>(),
            setup.cfg.micro_batch_size,
            setup.n_micro,
            setup.grid.dp,
            setup.cfg.global_batch_size,
            chunks.iter().map(|c| c.buckets.len()).sum::<usize>(),
            data.train.len()
        );
        if let Some(p) = &setup.cfg.profile {
            let ranks = p.ranks.as_ref().map_or("every rank".to_string(), |r| format!("ranks {r:?}"));
            let trace = match &setup.cfg.timing_trace {
                Some(path) => format!("the timing trace ({}) keeps just them", path.display()),
                None => "give --timing-trace FILE for trident's trace of them".to_string(),
            };
            println!(
                " --profile: iterations {} to {} on {ranks}: the device profiler's capture range (CUDA, HIP); {trace}",
                p.start + 1,
                p.end
            );
        }
        if let Some((max, min)) = setup.cfg.lr.decoupled {
            println!(
                " --decoupled-lr {max}: the word embedding and output layer peak at {max} and end at {min}, on the \
                 schedule's warmup and decay"
            );
        }
        match &setup.cfg.rampup {
            Some(BatchSchedule::Ramp(r)) => println!(
                " batch-size ramp-up: global batch {} rising by {} over {} samples to {}{}",
                r.start,
                r.increment,
                r.samples,
                r.global,
                if setup.cfg.decrease_batch_size_if_needed {
                    " (rounded down to whole micro-batches on every data-parallel rank)".to_string()
                } else {
                    format!(" ({} iterations of the ramp)", r.ramp().len())
                }
            ),
            Some(BatchSchedule::Steps(s)) => {
                let steps: Vec<String> = s
                    .steps
                    .iter()
                    .map(|(t, b)| format!("{b} from {t} samples ({} tokens)", t * setup.cfg.seq_length as u64))
                    .collect();
                println!(" step batch-size schedule: global batch {}", steps.join(", "));
            }
            None => {}
        }
    }
}

/// The process's peak resident memory (VmHWM), in bytes, where /proc reports it.
pub(super) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Every group's counters, named, with its size (a2a+p2p's two levels where they are in use).
pub(super) fn group_counters<D: Device>(groups: &Groups, dev: &D) -> Vec<(&'static str, usize, CommCounters)> {
    let levels = groups.cp_levels[0].size() > 1;
    [
        ("tensor", &groups.tp),
        ("summa row", &groups.summa_row),
        ("summa column", &groups.summa_col),
        ("depth", &groups.depth),
        ("data-parallel x depth", &groups.replica),
        ("pipeline", &groups.pp),
        ("embedding", &groups.embedding),
        ("context-parallel", &groups.cp),
    ]
    .into_iter()
    .chain(
        levels
            .then(|| [("context all-to-all", &groups.cp_levels[0]), ("context ring", &groups.cp_levels[1])])
            .into_iter()
            .flatten(),
    )
    .map(|(name, c)| {
        let mut counted = crate::device::comm_counters(dev, &**c);
        if name == "pipeline" {
            if let Some(p2p) = dev.device_p2p() {
                counted.add(&p2p.counters());
            }
        }
        (name, c.size(), counted)
    })
    .collect()
}

/// `--log-comm`: the elements this rank moved (bandwidth-optimal counts, `CommCounters::moved`)
/// per layer per micro-batch, by group, and per step by group and collective, for comparison
/// with the volume formulas of docs/design.md. Printed by the first tensor- and
/// data-parallel rank of each pipeline stage for its own layers.
pub(super) fn log_comm(
    grid: &Grid,
    layers: &[(usize, Vec<[CommCounters; 3]>)],
    n_micro: usize,
    step: &[(&str, usize, CommCounters)],
    iteration: u64,
) {
    let rank = grid.rank;
    println!(" comm at iteration {iteration}, rank {rank} (elements moved per rank, bandwidth-optimal counts):");
    let sizes = [step[0].1, step[1].1, step[2].1];
    for (first, chunk) in layers {
        for (l, groups) in chunk.iter().enumerate() {
            let per: Vec<f64> = groups.iter().zip(sizes).map(|(g, n)| g.moved(n) / n_micro as f64).collect();
            println!(
                "   layer {:>3} per micro-batch: {:.0} = tensor {:.0} + summa row {:.0} + summa column {:.0}",
                first + l,
                per.iter().sum::<f64>(),
                per[0],
                per[1],
                per[2]
            );
        }
    }
    for (name, n, k) in step.iter().filter(|(_, n, _)| *n > 1) {
        println!(
            "   step, {name} group of {n}: {:.0} (all-reduce {}, all-gather {}, reduce-scatter {}, broadcast {}, send {}, \
             all-to-all {} elements counted)",
            k.moved(*n),
            k.all_reduce,
            k.all_gather,
            k.reduce_scatter,
            k.broadcast,
            k.send,
            k.all_to_all
        );
    }
}

/// `--log-memory`: per rank, bytes of weights, gradients, optimizer state and activations,
/// predicted (from parameter counts, the data-parallel sharding's formula and the schedule's
/// in-flight bound) beside measured (the buffers held, the most gradients held at once, and the
/// process's peak resident memory), and the sum of the first three both ways.
pub(super) fn log_memory<D: Device>(setup: &Setup<D>, chunks: &[Chunk<D>]) {
    let (dev, groups, bound) = (&setup.dev, &setup.groups, setup.in_flight_bound());
    let params: usize = chunks.iter().map(|c| c.model.params.num_elements()).sum();
    let replicas = groups.replica.size();
    let zero = setup.cfg.use_distributed_optimizer && replicas > 1;
    let formula_state = if zero {
        chunks.iter().map(|c| 8 * c.model.params.num_elements().div_ceil(replicas)).sum::<usize>()
    } else {
        8 * params
    };
    let predicted_acts: usize = chunks.iter().map(|c| c.model.set_bytes(dev) * bound + c.model.spare_bytes(dev)).sum();
    let measured_state: usize = chunks.iter().map(|c| c.opt.state_bytes(dev)).sum();
    let measured_acts: usize = chunks.iter().map(|c| c.model.activation_bytes(dev)).sum();
    // Summed over chunks both ways (a bound where a rank has several: their peaks need not meet).
    let grads = chunks.iter().map(|c| c.grad_bytes(dev)).fold((0, 0), |(f, m), (a, b)| (f + a, m + b));
    let rss = peak_rss_bytes().unwrap_or(0);
    // Masters, plus mixed precision's working copy.
    let working: usize = chunks.iter().map(|c| c.model.working_bytes(dev)).sum();
    let mine = [
        (4 * params + working) as f64,
        grads.0 as f64,
        grads.1 as f64,
        formula_state as f64,
        measured_state as f64,
        predicted_acts as f64,
        measured_acts as f64,
        rss as f64,
    ];
    let mut all = vec![0f64; mine.len() * groups.world.size()];
    groups.world.all_gather(&mine, &mut all);
    if setup.say {
        println!(
            " memory per rank (MiB): weights | gradients formula / measured | optimizer state formula / measured \
             | activations predicted / measured | peak RSS | weights + gradients + state formula / measured"
        );
        for (rank, r) in all.chunks_exact(mine.len()).enumerate() {
            let mib = |k: usize| r[k] / 1048576.0;
            let (formula, measured) = (r[0] + r[1] + r[3], r[0] + r[2] + r[4]);
            println!(
                "   rank {rank:>3}: {:>9.2} | {:>9.2} / {:>9.2} | {:>9.2} / {:>9.2} | {:>9.2} / {:>9.2} | {:>9.1} | \
                 {:>9.2} / {:>9.2} ({:+.1}%)",
                mib(0),
                mib(1),
                mib(2),
                mib(3),
                mib(4),
                mib(5),
                mib(6),
                mib(7),
                formula / 1048576.0,
                measured / 1048576.0,
                100.0 * (measured / formula - 1.0)
            );
        }
    }
}

/// Prints, per pipeline stage, the measured bubble fraction (time not spent in forward or
/// backward passes over time spent in them, against the longest pipelined time of the iteration)
/// beside the schedule's theory, (p-1)/m, (p-1)/(v m), zb-h1's (p-1)/(3m) or zb-v's (p-1)/(6m); and the most micro-batch activations the
/// stage held at once beside the bound its schedule implies. `busy` and `wall`: pipeline seconds
/// from the second iteration on; `peak`: the most activation sets held in one iteration.
pub(super) fn report_pipeline<D: Device>(
    setup: &Setup<D>,
    (busy, wall): (f64, f64),
    peak: usize,
    summary: &mut TrainSummary,
) {
    let (groups, schedule, v, m) = (&setup.groups, setup.stage.schedule, setup.stage.plans.len(), setup.n_micro);
    let (grid, bound) = (&groups.grid, setup.in_flight_bound());
    let measured = if busy > 0.0 { (wall - busy) / busy } else { f64::NAN };
    let mut all = vec![0f64; 3 * groups.world.size()];
    groups.world.all_gather(&[measured, peak as f64, bound as f64], &mut all);
    let p = grid.pp as f64;
    let theory = match schedule {
        Schedule::Interleaved => (p - 1.0) / (v as f64 * m as f64),
        // Qi et al.'s (p-1)(F+B-W) idle against m(F+B+W) busy, with F, B and W equally long,
        // and ZB-V's half of that again (each chunk is half a stage): `pipeline::replay_bubble`.
        Schedule::ZbH1 => (p - 1.0) / (3.0 * m as f64),
        Schedule::ZbV => (p - 1.0) / (6.0 * m as f64),
        _ => (p - 1.0) / m as f64,
    };
    // Stage figures come from tensor- and data-parallel rank 0 of each stage.
    let at = |r: usize, k: usize| all[3 * grid.rank_of(0, 0, r) + k];
    summary.bubble_fractions = (0..grid.pp).map(|r| at(r, 0)).collect();
    summary.bubble_theory = theory;
    if setup.say {
        for r in 0..grid.pp {
            println!(
                " pipeline stage {r}: bubble fraction {:.3} measured, {theory:.3} in theory ({}, p {}, m {m}, v {v}) | \
                 peak {} micro-batch activations held (schedule bound {})",
                at(r, 0),
                schedule.name(),
                grid.pp,
                at(r, 1),
                at(r, 2)
            );
        }
    }
}

/// `--log-device-work`: the device's work in one iteration (its step, and the read of the log
/// interval's losses and norms when its log line is due; validation and checkpoints excluded),
/// or that the device counts none. With more than one rank, every rank prints its own (`rank`:
/// its rank and the world size), after its rank.
pub(super) fn device_work(iteration: u64, (rank, ranks): (usize, usize), work: Option<WorkCounters>) {
    let on = if ranks > 1 { format!(" on rank {rank}") } else { String::new() };
    match work {
        Some(w) => println!(
            " device work of iteration {iteration}{on}: {} launches, {} device->host copies, {} synchronizations, \
             {} host->device copies, {} allocations, {} frees, {} reused allocations, {} kept frees",
            w.launches,
            w.device_to_host_copies,
            w.synchronizations,
            w.host_to_device_copies,
            w.allocations,
            w.frees,
            w.reused_allocations,
            w.kept_frees
        ),
        None => println!(" device work of iteration {iteration}{on}: not counted on this device"),
    }
}
