#!/usr/bin/env bash
# Activation memory per rank under context parallelism: one iteration of an 8-layer GPT-2-shaped
# model (hidden 512 in 8 heads of 64, the tiny preset's vocabulary) at SEQ tokens (default 4096),
# micro-batch 1, on 1 rank and as CP 2 and CP 4 (`--cp-comm-type a2a`), each with --log-memory.
# Prints each run's measured activation bytes on rank 0 (the saved activations plus the swap's
# buffers), its ratio to one rank's, and the first iteration's loss (the same on every layout).
#
#   tools/bench-context-memory.sh
# Environment: TRIDENT (binary, default target/release/trident), SEQ (4096), MPIRUN (mpirun
# with its flags; default `mpirun --oversubscribe`, plus --allow-run-as-root as root).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
seq=${SEQ:-4096}
. "$here/tools/mpi-bench-setup.sh"
args=(train --preset tiny --data-path "$tmp/sh_text_document" --train-iters 1 --eval-iters 0
    --log-interval 1 --cpu-threads 1 --num-layers 8 --hidden-size 512 --num-attention-heads 8
    --seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size 1 --global-batch-size 1
    --log-memory)
base=""
for cp in 1 2 4; do
    if [ "$cp" = 1 ]; then
        "$trident" "${args[@]}" > "$tmp/cp$cp.log" 2>&1
    else
        $mpirun -np "$cp" "$trident" "${args[@]}" --context-parallel-size "$cp" --cp-comm-type a2a \
            > "$tmp/cp$cp.log" 2>&1
    fi
    mib=$(grep -m1 "^ *rank *0:" "$tmp/cp$cp.log" | awk -F'|' '{split($4, a, "/"); print a[2] + 0}')
    loss=$(grep -m1 -o "lm loss: [0-9.E+-]*" "$tmp/cp$cp.log")
    base=${base:-$mib}
    printf "CP %d: activations %8.2f MiB on rank 0, %.3f of one rank's; %s\n" "$cp" "$mib" \
        "$(echo "$mib / $base" | bc -l)" "$loss"
done
