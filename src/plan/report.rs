//! The text of `trident plan` (its command prints it): the assumptions, a table of the best
//! layouts with the reason each is bounded where it is, a line per dropped (tp, pp) alternative,
//! or JSON lines.

use super::hardware::GIB;
use super::models::Shape;
use super::{recompute_name, Candidate, Layout, Plan, Request};

/// A layout in one short phrase, for messages.
pub fn describe(l: &Layout) -> String {
    let mode = match l.tp_mode {
        super::TpMode::OneD => String::new(),
        super::TpMode::Summa { q, depth: 1 } => format!(" (2d, q {q})"),
        super::TpMode::Summa { q, depth } => format!(" (2.5d, q {q}, depth {depth})"),
    };
    let mut s = format!(
        "tp {}{mode} pp {} dp {} micro-batch {} recompute {}",
        l.tp,
        l.pp,
        l.dp,
        l.micro_batch,
        recompute_name(l.recompute)
    );
    if l.vpp > 1 {
        s.push_str(&format!(" vpp {}", l.vpp));
    }
    if l.zero1 {
        s.push_str(if l.shard_grads { " zero2" } else { " zero1" });
    }
    if l.cp > 1 {
        s.push_str(&format!(" cp {} {}", l.cp, if l.cp_a2a { "a2a" } else { "p2p" }));
    }
    if l.pp > 1 && l.schedule != super::Schedule::OneF1B {
        s.push_str(&format!(" {}", l.schedule.name(l.vpp)));
    }
    s
}

/// What bounds a layout: its largest costs besides the GEMMs, as shares of the iteration, and how
/// close it is to the memory limit.
pub fn reason(c: &Candidate, req: &Request) -> String {
    let t = &c.timing;
    let total = c.iteration_s();
    let g = req.machine.gpus_per_node;
    let tp_link = if c.layout.tp > g { "inter-node" } else { "intra-node" };
    let recompute_s = t.gemm_s * (1.0 - c.model_flops / c.executed_flops);
    let mut parts = vec![
        (
            t.bubble_s,
            format!(
                "bubble (pp {}, {} micro-batches{})",
                c.layout.pp,
                c.micro_batches(),
                if c.layout.vpp > 1 { format!(", vpp {}", c.layout.vpp) } else { String::new() }
            ),
        ),
        (
            t.tp_comm_s,
            match c.layout.tp_mode {
                super::TpMode::OneD => format!("TP all-reduces ({tp_link})"),
                _ => format!("SUMMA gathers and reduce-scatters ({tp_link})"),
            },
        ),
        (
            t.dp_comm_s,
            if c.layout.shard_grads {
                "ZeRO-2 reduce-scatters (every micro-batch) + all-gather".to_string()
            } else if c.layout.zero1 {
                "ZeRO-1 reduce-scatter + all-gather".to_string()
            } else {
                "DP gradient all-reduce".to_string()
            },
        ),
        (t.pp_comm_s, "pipeline sends".to_string()),
        (t.cp_comm_s, if c.layout.cp_a2a { "context-parallel swaps" } else { "context-parallel ring" }.to_string()),
        (t.attention_s, "attention".to_string()),
        (t.memory_bound_s, "memory-bound element-wise work".to_string()),
        (t.optimizer_s, "optimizer step".to_string()),
        (recompute_s, format!("{} recompute", recompute_name(c.layout.recompute))),
    ];
    parts.retain(|(s, _)| *s / total >= 0.01);
    parts.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out: Vec<String> =
        parts.iter().take(3).map(|(s, what)| format!("{what} {:.0}%", 100.0 * s / total)).collect();
    if out.is_empty() {
        out.push("GEMM-bound".into());
    }
    let used = c.memory.total_bytes() / req.usable_bytes();
    if used > 0.9 {
        out.push(format!("memory {:.0}% of usable", 100.0 * used));
    }
    out.join("; ")
}

/// The assumptions the numbers rest on, one line each.
pub fn assumptions(req: &Request) -> Vec<String> {
    let m = &req.machine;
    let (e, f) = (&m.efficiency, &req.features);
    let peak = match req.precision {
        super::Precision::Fp32 => m.peak_fp32_flops,
        _ => m.peak_16bit_flops,
    };
    let mut lines = vec![
        format!(
            "GPU {}: {:.0} TFLOP/s dense {}; HBM {:.0} GB/s; {:.0} GiB, {:.0}% kept free and {:.1} GiB for the runtime{}",
            m.name,
            peak / 1e12,
            req.precision.name(),
            m.hbm_bytes_per_s / 1e9,
            m.memory_bytes / GIB,
            100.0 * req.memory_headroom,
            req.runtime_reserve_bytes / GIB,
            if m.peak_fp8_flops > 0.0 {
                format!(" (fp8: {:.0} TFLOP/s dense, not priced: trident trains in 16 or 32 bits)", m.peak_fp8_flops / 1e12)
            } else {
                String::new()
            }
        ),
        format!(
            "links: {} GPUs per node; intra-node {:.0} GB/s bus bandwidth, {:.0} us per step; inter-node {:.1} GB/s per GPU, {:.0} us per step",
            m.gpus_per_node,
            m.intra.bytes_per_s / 1e9,
            m.intra.latency_s * 1e6,
            m.inter.bytes_per_s / 1e9,
            m.inter.latency_s * 1e6
        ),
        format!(
            "kernels ({}): a GEMM reaches {:.2} x K/(K + {:.0}) of peak for inner dimension K (forward, input and \
             weight gradients each by its own K after the split); a whole step keeps {:.2} of the kernels' speed; {}",
            e.source,
            e.gemm_max,
            e.gemm_k_half,
            e.step,
            if f.flash_attention {
                format!(
                    "flash attention {:.2} of peak on its causal FLOPs (no scores in memory)",
                    e.attention
                )
            } else {
                "unfused attention (--attention-backend unfused): score GEMMs at the large-GEMM rate, the scores held in \
                 memory (13 B per score forward, 2x backward, at HBM speed)"
                    .to_string()
            }
        ),
        "model: Megatron's FLOPs (2 per weight and token, 24bsh²+4bs²h per GPT-2 layer forward; backward 2x, full \
         recompute +1 forward); activations per Korthikanti et al.; \
         16-bit weights + fp32 grads, master weights and AdamW (18 B/param, 6 + 12/dp with ZeRO-1)"
            .into(),
        format!(
            "comm: alpha-beta, each collective by the fastest algorithm the machine has (hierarchical ring; all-reduce also as a tree across nodes{}); {}; DP all-reduce overlaps the last micro-batch's backward; ZeRO-1 {}; \
             pipeline time m x slowest stage + (p-1)/v x mean stage",
            if m.nvls_bytes_per_s > 0.0 {
                format!(" and NVLS inside a node, {:.0} GB/s", m.nvls_bytes_per_s / 1e9)
            } else {
                String::new()
            },
            if f.tp_comm_overlap {
                "TP collectives overlapped with the layer's GEMMs (--tp-comm-overlap: Megatron's; trident does not overlap them yet)"
            } else {
                "TP all-reduces and SUMMA panel gathers / reduce-scatters (2-D, 2.5-D) not overlapped"
            },
            match (f.overlap_grad_reduce, f.overlap_param_gather) {
                (false, false) => "reduce-scatter + fp32 all-gather not overlapped",
                (true, false) => "reduce-scatter behind the last backward (--overlap-grad-reduce, as trident's buckets run it), fp32 all-gather not overlapped",
                (false, true) => "reduce-scatter not overlapped, 16-bit all-gather behind the next forward (--overlap-param-gather: Megatron's; trident's gathers fp32)",
                (true, true) => "reduce-scatter behind the last backward and 16-bit all-gather behind the next forward (--overlap-param-gather's 16-bit gather is Megatron's; trident's gathers fp32)",
            }
        ),
    ];
    let zero2 = "ZeRO-2 (--data-parallel-sharding-strategy optim_grads, as trident runs it): gradients and optimizer \
                 state split over data-parallel ranks, each micro-batch's gradients reduce-scattered bucket by bucket \
                 (behind its backward under --overlap-grad-reduce), the weights all-gathered as under ZeRO-1";
    match (f.shard_params, req.pins.shard_grads, req.pins.zero1) {
        (true, ..) => lines.push(
            "sharding: ZeRO-3 / FSDP (--data-parallel-sharding-strategy optim_grads_params): weights, gradients and \
             optimizer state split over data-parallel ranks, each layer's weights all-gathered before its forward and its \
             backward and its gradients reduce-scattered, every micro-batch, prefetched behind the layer before; priced \
             for comparison, trident runs ZeRO-2 at most"
                .to_string(),
        ),
        (false, Some(true), _) => lines.push(format!("sharding: {zero2}")),
        (false, None, None | Some(true)) => {
            lines.push(format!("sharding: ZeRO-1 and, where it is, {zero2}; both priced (zero 1 / 2 below)"))
        }
        _ => {}
    }
    lines
}

/// The plan as `trident plan` prints it: the request and its assumptions, the best `top` layouts
/// (all that fit when 0) with what bounds each, the other tensor x pipeline splits, the
/// tensor-parallel modes compared, and the verdict; lines ending in newlines.
pub fn text(plan: &Plan, req: &Request, top: usize) -> String {
    let mut out = String::new();
    // One line of the report.
    macro_rules! say {
        ($($t:tt)*) => {{
            out.push_str(&format!($($t)*));
            out.push('\n');
        }};
    }
    let s = &req.shape;
    say!(
        "trident plan: {} ({:.2}B parameters: {} layers, hidden {}, {} heads{}, sequence {}, vocabulary {}{}) on {} x {}, global batch {}",
        req.model_name,
        s.parameters() / 1e9,
        s.num_layers,
        s.hidden_size,
        s.num_attention_heads,
        heads(s),
        s.seq_length,
        s.vocab_size,
        features(s),
        req.gpus,
        req.machine.name,
        req.global_batch
    );
    for line in assumptions(req) {
        say!("  {line}");
    }
    say!("");
    say!(
        "{:>4} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>6} {:>10} {:>11} {:>12} {:>11}  bounded by",
        "rank",
        "tp",
        "mode",
        "pp",
        "dp",
        "vpp",
        "micro",
        "recompute",
        "zero",
        "memory GiB",
        "iteration s",
        "TFLOP/s/GPU",
        "tokens/s"
    );
    let shown = if top == 0 { plan.ranked.len() } else { top.min(plan.ranked.len()) };
    for (i, c) in plan.ranked.iter().take(shown).enumerate() {
        let l = &c.layout;
        say!(
            "{:>4} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>6} {:>10.1} {:>11.3} {:>12.1} {:>11.0}  {}",
            i + 1,
            l.tp,
            match l.tp_mode {
                super::TpMode::Summa { depth, .. } if depth > 1 => format!("2.5d{depth}"),
                m => m.name().to_string(),
            },
            l.pp,
            l.dp,
            l.vpp,
            l.micro_batch,
            recompute_name(l.recompute),
            match (l.zero1, l.shard_grads) {
                (false, _) => "no",
                (true, false) => "1",
                (true, true) => "2",
            },
            c.memory_gib(),
            c.iteration_s(),
            c.tflops_per_gpu(),
            c.tokens_per_s(),
            reason(c, req)
        );
    }
    let best = plan.ranked[0];
    say!("");
    for line in why_best(plan, req) {
        say!("{line}");
    }
    say!("");
    say!("other tensor x pipeline splits:");
    let mut lines = Vec::new();
    for (&(t, p), (fit, smallest)) in &plan.by_tp_pp {
        if (t, p) == (best.layout.tp, best.layout.pp) {
            continue;
        }
        let line = match fit {
            Some(c) => {
                let slower = c.iteration_s() / best.iteration_s() - 1.0;
                (slower, format!("  tp {t:>3} pp {p:>3}: {:.1}% slower at best ({})", 100.0 * slower, reason(c, req)))
            }
            None => (
                f64::INFINITY,
                format!(
                    "  tp {t:>3} pp {p:>3}: does not fit, needs at least {:.1} GiB ({}) of {:.1} GiB usable",
                    smallest.memory_gib(),
                    describe(&smallest.layout),
                    req.usable_bytes() / GIB
                ),
            ),
        };
        lines.push((t * p, line));
    }
    // The nearest competitors first, then the splits that do not fit (smallest model-parallel
    // size first), at most ten lines.
    lines.sort_by(|a, b| a.1 .0.total_cmp(&b.1 .0).then(a.0.cmp(&b.0)));
    for (_, (_, line)) in lines.iter().take(10) {
        say!("{line}");
    }
    if lines.len() > 10 {
        say!("  ... and {} more", lines.len() - 10);
    }
    say!("");
    for line in mode_comparison(plan, s) {
        say!("{line}");
    }
    say!("");
    say!(
        "{} layouts priced, {} fit; best: {} at {:.3} s per iteration, {:.1} TFLOP/s per GPU ({:.0}% of peak, model FLOPs {:.1})",
        plan.considered,
        plan.ranked.len(),
        describe(&best.layout),
        best.iteration_s(),
        best.tflops_per_gpu(),
        100.0 * best.tflops_per_gpu() * 1e12
            / match req.precision {
                super::Precision::Fp32 => req.machine.peak_fp32_flops,
                _ => req.machine.peak_16bit_flops,
            },
        best.model_tflops_per_gpu()
    );
    out
}

/// Why the best layout wins and what limits it: against the best layout of the nearest other
/// tensor x pipeline split, the parts of the iteration that differ most (seconds, signed: what the
/// winner saves or pays); then what bounds the winner, its memory against the limit, and whether
/// the no-pipeline rule chose it over a faster pipelined layout.
pub fn why_best(plan: &Plan, req: &Request) -> Vec<String> {
    let best = plan.ranked[0];
    let (b, tp_pp) = (&best.timing, (best.layout.tp, best.layout.pp));
    let mut out = Vec::new();
    let rival = plan
        .by_tp_pp
        .iter()
        .filter(|(&k, _)| k != tp_pp)
        .filter_map(|(_, (fit, _))| *fit)
        .min_by(|x, y| x.iteration_s().total_cmp(&y.iteration_s()));
    match rival {
        Some(r) => {
            let t = &r.timing;
            let mut parts = [
                (b.gemm_s - t.gemm_s, "GEMMs"),
                (b.attention_s - t.attention_s, "attention"),
                (b.memory_bound_s - t.memory_bound_s, "element-wise"),
                (b.tp_comm_s - t.tp_comm_s, "TP communication"),
                (b.cp_comm_s - t.cp_comm_s, "context-parallel communication"),
                (b.pp_comm_s - t.pp_comm_s, "pipeline sends"),
                (b.bubble_s - t.bubble_s, "bubble"),
                (b.dp_comm_s - t.dp_comm_s, "data-parallel communication"),
                (b.optimizer_s - t.optimizer_s, "optimizer step"),
            ];
            parts.sort_by(|x, y| y.0.abs().total_cmp(&x.0.abs()));
            let scale = best.iteration_s();
            let differs: Vec<String> = parts
                .iter()
                .filter(|(d, _)| d.abs() >= 0.001 * scale)
                .take(3)
                .map(|(d, what)| format!("{what} {}{:.3} s", if *d < 0.0 { "-" } else { "+" }, d.abs()))
                .collect();
            let gap = r.iteration_s() / best.iteration_s() - 1.0;
            out.push(format!(
                "why it wins: {:.1}% {} than the next split's best ({}){}",
                100.0 * gap.abs(),
                if gap >= 0.0 { "faster" } else { "slower" },
                describe(&r.layout),
                if differs.is_empty() {
                    String::new()
                } else {
                    format!("; against it the winner spends {}", differs.join(", "))
                }
            ));
            if gap < 0.0 {
                out.push(format!(
                    "  chosen without a pipeline: within {:.0}% of the fastest, where Megatron's practice takes no pipeline",
                    100.0 * super::NO_PIPELINE_TOLERANCE
                ));
            }
        }
        None => out.push("why it wins: no other tensor x pipeline split fits".to_string()),
    }
    let bounds = reason(&best, req);
    out.push(if bounds.contains("memory") {
        format!("what limits it: {bounds}")
    } else {
        format!(
            "what limits it: {bounds}; memory {:.1} of {:.1} GiB usable",
            best.memory_gib(),
            req.usable_bytes() / GIB
        )
    });
    out
}

/// The attention heads' departures from GPT-2 for the header: " in 8 query groups", " of 128 channels".
fn heads(s: &Shape) -> String {
    let mut out = String::new();
    let m = s.model();
    if m.kv_heads() != s.num_attention_heads {
        out += &format!(" in {} query groups", m.kv_heads());
    }
    if m.attention_width() != s.hidden_size {
        out += &format!(" of {} channels", m.head_dim());
    }
    out
}

/// The rest of the architecture's departures from GPT-2 for the header: "; RMSNorm, SwiGLU, ...".
fn features(s: &Shape) -> String {
    let features: Vec<_> =
        s.arch.features().into_iter().filter(|f| !f.starts_with("grouped") && !f.starts_with("--kv")).collect();
    if features.is_empty() {
        String::new()
    } else {
        format!("; {}", features.join(", "))
    }
}

/// Whether 2-D and 2.5-D tensor parallelism beat Megatron's 1-D here: the best layout of each
/// mode against the best 1-D one, and, at each tensor-parallel size both can use, which wins.
pub fn mode_comparison(plan: &Plan, shape: &Shape) -> Vec<String> {
    let best_of = |name: &str| plan.ranked.iter().find(|c| c.layout.tp_mode.name() == name);
    let mut out = Vec::new();
    let Some(one_d) = best_of("1d") else {
        out.push("tensor-parallel modes: no 1-D layout fits".into());
        for name in ["2d", "2.5d"] {
            if let Some(c) = best_of(name) {
                out.push(format!("  {name}: best is {} at {:.3} s", describe(&c.layout), c.iteration_s()));
            }
        }
        return out;
    };
    out.push(format!("tensor-parallel modes: best 1d is {} at {:.3} s", describe(&one_d.layout), one_d.iteration_s()));
    for name in ["2d", "2.5d"] {
        let Some(c) = best_of(name) else {
            let features = shape.arch.features();
            out.push(if features.is_empty() {
                format!("  {name}: no layout of this mode fits (or the grid does not divide the model)")
            } else {
                format!("  {name}: runs GPT-2's architecture only, not {}", features.join(", "))
            });
            continue;
        };
        let gain = one_d.iteration_s() / c.iteration_s() - 1.0;
        // At the same tensor-parallel size, with everything else free.
        let same_t = plan.ranked.iter().find(|o| o.layout.tp_mode.name() == "1d" && o.layout.tp == c.layout.tp);
        let vs_same = same_t.map_or(String::new(), |o| {
            format!("; against 1d at tp {}: {:+.1}%", o.layout.tp, 100.0 * (o.iteration_s() / c.iteration_s() - 1.0))
        });
        out.push(format!(
            "  {name}: best is {} at {:.3} s, {} 1d by {:.1}%{vs_same}",
            describe(&c.layout),
            c.iteration_s(),
            if gain > 0.0 { "beats" } else { "trails" },
            100.0 * gain.abs()
        ));
    }
    out
}

fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{}", (x * 1e4).round() / 1e4)
    } else {
        "null".into()
    }
}

/// One JSON object for a layout: the documented keys `tp pp dp vpp micro_batch recompute zero1
/// memory_gib iteration_s tflops_per_gpu`, then the extras `tp_mode sequence_parallel
/// micro_batches bubble_fraction model_tflops_per_gpu tokens_per_s pipeline_schedule cp zero2 reason`.
pub fn json(c: &Candidate, req: &Request) -> String {
    let l = &c.layout;
    format!(
        "{{\"tp\":{},\"pp\":{},\"dp\":{},\"vpp\":{},\"micro_batch\":{},\"recompute\":\"{}\",\"zero1\":{},\
         \"memory_gib\":{},\"iteration_s\":{},\"tflops_per_gpu\":{},\"tp_mode\":\"{}\",\"sequence_parallel\":{},\
         \"micro_batches\":{},\"bubble_fraction\":{},\"model_tflops_per_gpu\":{},\"tokens_per_s\":{},\"pipeline_schedule\":\"{}\",\"cp\":{},\
         \"zero2\":{},\"reason\":{}}}",
        l.tp,
        l.pp,
        l.dp,
        l.vpp,
        l.micro_batch,
        recompute_name(l.recompute),
        l.zero1,
        json_number(c.memory_gib()),
        json_number(c.iteration_s()),
        json_number(c.tflops_per_gpu()),
        l.tp_mode.name(),
        l.sequence_parallel,
        c.micro_batches(),
        json_number(c.bubble_fraction()),
        json_number(c.model_tflops_per_gpu()),
        json_number(c.tokens_per_s()),
        if l.pp > 1 { l.schedule.name(l.vpp) } else { "none" },
        l.cp,
        l.shard_grads,
        crate::data::json::quote(&reason(c, req))
    )
}

/// The best `top` layouts (all that fit when 0) as JSON lines, best first.
pub fn json_lines(plan: &Plan, req: &Request, top: usize) -> String {
    let shown = if top == 0 { plan.ranked.len() } else { top.min(plan.ranked.len()) };
    plan.ranked.iter().take(shown).map(|c| json(c, req) + "\n").collect()
}
