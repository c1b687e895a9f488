#!/usr/bin/env bash
# make gpu-check: trident's kernels on this node's GPUs (NVIDIA, else AMD), in three steps:
#   1. `trident check gpu`: a kernel compiled at run time, loaded, launched and checked on every GPU;
#   2. `trident check ops`: every op of the GPU Device against the f64 reference device;
#   3. a 20-iteration TP=2 x PP=2 run (4 ranks, bf16) on the GPUs and the same run on the CPU
#      backend, their losses compared iteration by iteration (`trident check losses`).
# With no GPU, step 1 says what is missing and the script exits non-zero.
# Usage: gpu-check.sh BIN DATA_PREFIX. Environment: GPU_CHECK_LAUNCH (default: Open MPI's or
# MPICH's mpirun/mpiexec with -np 4; under Slurm e.g. "srun -n 4"), GPU_CHECK_ITERS (20),
# GPU_CHECK_SIZE (full; small for the check ops shapes), GPU_CHECK_MODEL (the model flags),
# GPU_CHECK_RTOL (the loss agreement, 1e-2), GPU_CHECK_DIR (where the logs go; a temporary directory),
# GPU_CHECK_COLLECTIVES (--gpu-collectives of the GPU run: nccl, the default on NVIDIA, rccl,
# the default on AMD, or mpi).
set -euo pipefail

bin=${1:?usage: gpu-check.sh BIN DATA_PREFIX}
data=${2:?usage: gpu-check.sh BIN DATA_PREFIX}
iters=${GPU_CHECK_ITERS:-20}
size=${GPU_CHECK_SIZE:-full}
rtol=${GPU_CHECK_RTOL:-1e-2}
collectives=${GPU_CHECK_COLLECTIVES:-}
read -r -a model <<<"${GPU_CHECK_MODEL:---num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4 --global-batch-size 16 --lr 1e-3}"
if [ -n "${GPU_CHECK_LAUNCH:-}" ]; then
  read -r -a launch <<<"$GPU_CHECK_LAUNCH"
elif command -v mpirun.openmpi >/dev/null 2>&1; then
  launch=(mpirun.openmpi --oversubscribe --bind-to none -np 4)
  [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
elif command -v mpirun >/dev/null 2>&1; then
  launch=(mpirun -np 4)
else
  echo "gpu-check: no mpirun found for the 4-rank run; set GPU_CHECK_LAUNCH (e.g. \"srun -n 4\")" >&2
  exit 1
fi
dir=${GPU_CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trident-gpu-check.XXXXXX")}
mkdir -p "$dir"

echo "== gpu-check 1/3: check gpu"
smoke=$("$bin" check gpu) || exit 1
echo "$smoke"
case "$smoke" in
  *"NVIDIA device"*) device=cuda ;;
  *"AMD device"*) device=hip ;;
  *) echo "gpu-check: cannot tell the GPU vendor from check gpu's report" >&2; exit 1 ;;
esac
# NCCL on NVIDIA, RCCL on AMD (both on device memory, pipeline p2p included).
[ -n "$collectives" ] || { [ "$device" = cuda ] && collectives=nccl || collectives=rccl; }

echo "== gpu-check 2/3: check ops --device $device --size $size"
"$bin" check ops --device "$device" --size "$size"

echo "== gpu-check 3/3: $iters iterations TP=2 x PP=2 on $device ($collectives) and on the CPU (bf16; logs in $dir)"
for dev in "$device" cpu; do
  how=()
  [ "$dev" = cpu ] || how=(--gpu-collectives "$collectives")
  "${launch[@]}" "$bin" train --device "$dev" "${how[@]}" --bf16 --data-path "$data" --train-iters "$iters" \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --log-interval 1 \
    --eval-interval 1000000 --log-json "$dir/$dev.jsonl" "${model[@]}" >"$dir/$dev.log" 2>&1 || {
    echo "gpu-check: the $dev run failed; its output:" >&2
    tail -n 30 "$dir/$dev.log" >&2
    exit 1
  }
done
"$bin" check losses "$dir/$device.jsonl" "$dir/cpu.jsonl" --rtol "$rtol"
echo "gpu-check: passed on $device"
