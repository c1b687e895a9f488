#!/usr/bin/env bash
# The bubble each pipeline schedule leaves, measured: 8 layers of hidden 256 (4 heads; 8
# micro-batches of 2 per global batch of 16) on STAGES pipeline stages (default 4), one CPU
# thread per rank, under
# 1F1B, zb-h1 and zb-v for ITERS iterations (default 8). Prints each stage's measured bubble
# fraction (the run's end-of-run report: time outside its forward, B and W passes over the time in
# them, from the second iteration on, against the slowest stage's step) beside the schedule's
# theory, the worst stage's as a share of 1F1B's worst, and the last iteration's time. The three
# runs' losses are the same.
# A measurement needs a core per rank: with fewer, ranks share cores and the figures measure the
# sharing, so it stops unless FORCE=1.
#
#   tools/bench-pipeline-bubble.sh            # 4 stages
#   STAGES=2 tools/bench-pipeline-bubble.sh
# Environment: TRIDENT (binary, default target/release/trident), STAGES (4), ITERS (8), MPIRUN
# (mpirun with its flags; default `mpirun --oversubscribe`, plus --allow-run-as-root as root).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
stages=${STAGES:-4}
iters=${ITERS:-8}
need=$stages knob=STAGES
. "$here/tools/mpi-bench-setup.sh"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores; $stages stages, 8 micro-batches"
worst_1f1b=""
for schedule in 1f1b zb-h1 zb-v; do
    $mpirun -np "$stages" "$trident" train --preset small --data-path "$tmp/sh_text_document" \
        --hidden-size 256 --num-attention-heads 4 --micro-batch-size 2 --global-batch-size 16 \
        --train-iters "$iters" --eval-iters 0 --log-interval 1 --cpu-threads 1 \
        --pipeline-model-parallel-size "$stages" --pipeline-schedule "$schedule" > "$tmp/$schedule.log" 2>&1
    measured=$(grep "bubble fraction" "$tmp/$schedule.log" | sed 's/.*bubble fraction \([0-9.]*\) measured.*/\1/' | xargs)
    theory=$(grep -m1 "bubble fraction" "$tmp/$schedule.log" | sed 's/.*measured, \([0-9.]*\) in theory.*/\1/')
    worst=$(echo "$measured" | tr ' ' '\n' | sort -g | tail -1)
    worst_1f1b=${worst_1f1b:-$worst}
    last=$(grep "iteration *$iters/" "$tmp/$schedule.log")
    loss=$(echo "$last" | grep -o "lm loss: [0-9.E+-]*")
    ms=$(echo "$last" | grep -o "per iteration (ms): [0-9.]*" | awk '{print $NF}')
    printf "%-6s stages %s | worst %.3f, %.2f of 1F1B's | theory %s | %s ms (last iteration) | %s\n" "$schedule" \
        "$measured" "$worst" "$(echo "$worst / $worst_1f1b" | bc -l)" "$theory" "$ms" "$loss"
done
