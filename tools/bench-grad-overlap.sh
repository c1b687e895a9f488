#!/usr/bin/env bash
# The gradient communication a step waits for, with and without `--overlap-grad-reduce`: the
# distributed optimizer (ZeRO-1) on RANKS data-parallel ranks (default 4), one CPU thread each,
# on PRESET (default gpt2-124m; micro-batch 1 of 256 tokens, 2 micro-batches per rank per step)
# for ITERS iterations (default 6), with --timing-trace. Prints, for each run, the mean of its
# ranks' "gradient sync" spans (the trace's communication track: waiting for the buckets'
# reduce-scatters and the other sums after the last backward) over the iterations after the
# first, the mean iteration time over the same iterations, and the last loss (the same in both).
# A measurement needs a core per rank: with fewer, ranks share cores and the figures measure the
# sharing, so it stops unless FORCE=1.
#
#   tools/bench-grad-overlap.sh
#   RANKS=2 tools/bench-grad-overlap.sh
# Environment: TRIDENT (binary, default target/release/trident), RANKS (4), PRESET
# (gpt2-124m), ITERS (6), BUCKET (--ddp-bucket-size, default 10000000), MPIRUN (mpirun with
# its flags; default `mpirun --oversubscribe`, plus --allow-run-as-root as root).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
ranks=${RANKS:-4}
preset=${PRESET:-gpt2-124m}
iters=${ITERS:-6}
bucket=${BUCKET:-10000000}
need=$ranks knob=RANKS
. "$here/tools/mpi-bench-setup.sh"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores; $ranks ranks, $preset"
for mode in after overlap; do
    extra=()
    [ "$mode" = overlap ] && extra=(--overlap-grad-reduce)
    $mpirun -np "$ranks" "$trident" train --preset "$preset" --data-path "$tmp/sh_text_document" \
        --micro-batch-size 1 --seq-length 256 --global-batch-size $((2 * ranks)) --train-iters "$iters" \
        --eval-iters 0 --log-interval 1 --cpu-threads 1 --use-distributed-optimizer --ddp-bucket-size "$bucket" \
        --timing-trace "$tmp/$mode.json" "${extra[@]}" > "$tmp/$mode.log" 2>&1
    python3 - "$tmp/$mode.json" "$tmp/$mode.log" "$mode" <<'PY'
import json, re, sys
trace, log, mode = sys.argv[1:]
events = json.load(open(trace))["traceEvents"]
syncs = {}
for e in events:
    if e.get("cat") == "grad-sync":
        syncs.setdefault(e["tid"], []).append(e["dur"] / 1000)
mean_sync = sum(sum(d[1:]) / len(d[1:]) for d in syncs.values()) / len(syncs)
lines = [l for l in open(log) if "elapsed time per iteration" in l]
ms = [float(re.search(r"per iteration \(ms\): ([0-9.]+)", l).group(1)) for l in lines[1:]]
loss = re.search(r"lm loss: ([0-9.E+-]+)", lines[-1]).group(1)
print(f"{mode:8s} gradient sync waited {mean_sync:8.1f} ms per step (mean of ranks) | "
      f"iteration {sum(ms) / len(ms):8.1f} ms | last loss {loss}")
PY
done
