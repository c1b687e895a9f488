#!/usr/bin/env bash
# Per-rank memory of weights + gradients + optimizer state under each data-parallel sharding
# strategy: gpt2-124m (VOCAB tokens, default GPT-2's 50,257; mock data) on RANKS data-parallel ranks
# (default 4), one iteration of micro-batch 1 x 256 tokens, 2 micro-batches per rank, with
# --log-memory; no_shard, optim (ZeRO-1), optim_grads (ZeRO-2) and optim_grads with
# --overlap-grad-reduce. Prints rank 0's gradients by trident's formula (which counts the buckets
# in flight) and measured, the three together both ways, and the textbook figure (weights 4Ψ,
# gradients 4Ψ or 4Ψ/N, AdamW's moments 8Ψ or 8Ψ/N bytes) beside the measured total. Memory,
# not time: ranks may share cores.
#
#   tools/bench-sharding-memory.sh
#   VOCAB=257 tools/bench-sharding-memory.sh   # the layers' share without GPT-2's tied embedding
# Environment: TRIDENT (binary, default target/release/trident), RANKS (4), VOCAB, MPIRUN (mpirun with
# its flags; default `mpirun --oversubscribe`, plus --allow-run-as-root as root).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
ranks=${RANKS:-4}
vocab=${VOCAB:-50257}
. "$here/tools/mpi-bench-setup.sh"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); gpt2-124m, vocabulary $vocab, on $ranks ranks"
echo "strategy            | gradients formula / measured MiB | w+g+s formula / measured MiB | textbook MiB (measured vs it)"
for mode in no_shard optim optim_grads optim_grads+overlap; do
    extra=(--data-parallel-sharding-strategy "${mode%+overlap}")
    [ "$mode" != "${mode%+overlap}" ] && extra+=(--overlap-grad-reduce)
    $mpirun -np "$ranks" "$trident" train --preset gpt2-124m --mock-data --tokenizer-type NullTokenizer \
        --vocab-size "$vocab" --micro-batch-size 1 --seq-length 256 --global-batch-size $((2 * ranks)) \
        --train-iters 1 --eval-iters 0 --log-interval 1 --cpu-threads 1 --log-memory "${extra[@]}" \
        > "$tmp/$mode.log" 2>&1 || { cat "$tmp/$mode.log" >&2; exit 1; }
    python3 - "$tmp/$mode.log" "$mode" "$ranks" <<'PY'
import re, sys
log, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(log).read()
psi = int(re.search(r"parameters: (\d+) on this rank", text).group(1))
row = next(l for l in text.splitlines() if l.strip().startswith("rank   0:"))
f = row.split("|")
grads = [float(x) for x in f[1].split("/")]
total = [float(x) for x in re.split(r"[/(]", f[5])[:2]]
share = {"no_shard": (1, 1), "optim": (1, n), "optim_grads": (n, n), "optim_grads+overlap": (n, n)}[mode]
textbook = (4 * psi + 4 * psi / share[0] + 8 * psi / share[1]) / 2**20
print(f"{mode:19s} | {grads[0]:10.2f} / {grads[1]:10.2f}          | {total[0]:9.2f} / {total[1]:9.2f}        "
      f"| {textbook:9.2f} ({100 * (total[1] / textbook - 1):+.1f}%)")
PY
done
