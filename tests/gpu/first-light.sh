#!/usr/bin/env bash
# shellcheck disable=SC2317  # the steps are functions that `run` calls through bash -c
# make gpu-first-light: everything trident does on one NVIDIA GPU, in one run, each step's log and
# a JSON summary in one folder. A GPU owner runs it unchanged on a node with the binary (built
# elsewhere: `make NO_MPI=1 build`; no Rust toolchain, MPI or network needed on the node):
#   tests/gpu/first-light.sh [--out DIR] [--deadline SECONDS]
# The steps, in order; each has its own time limit, cut to what is left of the deadline, and a
# step that fails or runs out of time does not stop the ones after it:
#   env         the GPU (nvidia-smi), nvcc, PyTorch, and the NVRTC and NCCL libraries used
#   info        trident info
#   check-gpu   trident check gpu (a kernel compiled by NVRTC, launched and checked)
#   probe       one small GEMM bench on the device's own architecture (sm_90a: wgmma fed by TMA);
#               when it fails or hangs, the steps after it run with TRIDENT_CUDA_ARCH=sm_90 (the
#               mma.sync kernels), so that one broken kernel family does not hide the rest
#   check-ops   trident check ops --device cuda --size full (every Device op against the reference)
#   check-nccl  trident check nccl (one rank: NCCL's collectives on device memory against the host)
#   train       a 200-iteration run of the `tiny` preset (4 heads of 32) with --device cuda --bf16
#               on the bundled corpus, and the same run with --device cpu --bf16 beside it
#   losses      trident check losses cuda.jsonl cpu.jsonl --rtol 1e-2 --from 100 (docs/design.md's bf16
#               bound: within 1% after 100 iterations; two bf16 runs part by ~2% around iteration 20,
#               where tiny's warmup ends, and come back)
#   bench       tests/gpu/gpu-bench.sh: GEMMs (GPT-2 124M, GPT-3 layer, 4096^3), causal attention
#               (sequence 1024 and 4096, head dims 64 and 128), the GPT-2 124M step (micro-batch 16,
#               sequence 1024), each beside PyTorch measured in the same run
#   memcheck    compute-sanitizer --tool memcheck over check ops --size small
#   racecheck   compute-sanitizer --tool racecheck over check ops --size small
#   ncu         Nsight Compute over one bench (FIRST_LIGHT_NCU, below), when set
# Environment:
#   TRIDENT_BIN          the binary (default target-nompi/release/trident, else target/release/trident)
#   TRIDENT_NVRTC, TRIDENT_NCCL   the libraries; when unset and the loader finds none, the script
#                        looks in the site-packages of PyTorch's Python and the usual pip places
#   TORCH_PYTHON         PyTorch's Python (default /opt/torch/.venv/bin/python, else python3)
#   FIRST_LIGHT_STEPS    the steps to run, space-separated (default: all but ncu)
#   FIRST_LIGHT_ITERS    iterations of the train steps (default 200)
#   FIRST_LIGHT_MODEL    the train steps' model flags (default "--preset tiny": the preset itself, on
#                        the head dim 32 attention kernels)
#   FIRST_LIGHT_NCU      "KERNEL_REGEX BENCH ARGS...": ncu profiles the kernels matching KERNEL_REGEX
#                        in `trident bench BENCH ARGS...` (e.g. "attention_bwd attention --shape
#                        4x4096x16x128 --device cuda")
#   GPU_BENCH_*          passed to gpu-bench.sh (its header); the defaults here are the issue's shapes
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on bad arguments.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=""
budget=1800
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --deadline) budget=${2:?--deadline needs seconds}; shift 2 ;;
    -h | --help) sed -n '3,/^# Exit status/p' "$0"; exit 0 ;;
    *) echo "first-light: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case $budget in
  '' | *[!0-9]*) echo "first-light: --deadline takes whole seconds, found '$budget'" >&2; exit 2 ;;
esac
out=${out:-$root/runs/first-light/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
deadline=$(($(date +%s) + budget))

# bin and py (TRIDENT_BIN, TORCH_PYTHON and their defaults).
bin="" py=""
# shellcheck disable=SC1091
. "$here/node-defaults.sh"
steps=${FIRST_LIGHT_STEPS:-env info check-gpu probe check-ops check-nccl train losses bench memcheck racecheck}
[ -z "${FIRST_LIGHT_NCU:-}" ] || [[ " $steps " == *" ncu "* ]] || steps="$steps ncu"
iters=${FIRST_LIGHT_ITERS:-200}
# The tiny preset itself (4 heads of 32): the GPU's attention kernels take head dims 32, 64 and 128.
model_flags=${FIRST_LIGHT_MODEL:---preset tiny}
: >"$out/steps.tsv"
failed=0

wanted() { [[ " $steps " == *" $1 "* ]]; }

# record NAME STATUS RC SECONDS NOTE: one row of the summary.
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(tr '\t\n' '  ' <<<"$5")" >>"$out/steps.tsv"; }

# run NAME LIMIT CMD...: CMD under `timeout`, its output in NAME.log, a summary row.
run() {
  local name=$1 limit=$2 left rc=0 t0 secs status note
  shift 2
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 5 ]; then
    record "$name" skipped - 0 "the deadline left no time"
    echo "== $name: skipped (the deadline left no time)"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (at most ${limit}s): $*"
  t0=$(date +%s.%N)
  # bash -c runs the script's own functions (exported below) as well as programs.
  timeout -k 10 "$limit" bash -c '"$@"' first-light "$@" >"$out/$name.log" 2>&1 || rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  note=$(grep -v '^[[:space:]]*$' "$out/$name.log" | tail -n 1 | cut -c1-300)
  case $rc in
    0) status=passed ;;
    124 | 137) status=timeout; note="ran out of its ${limit}s; last line: $note" ;;
    *) status=failed ;;
  esac
  record "$name" "$status" "$rc" "$secs" "$note"
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "   $status (exit $rc) after ${secs}s; the end of $name.log:"
    tail -n 15 "$out/$name.log" | sed 's/^/   | /'
  else
    echo "   passed in ${secs}s"
  fi
}

gpu_libraries first-light || exit 1
export TRIDENT_CACHE_DIR=${TRIDENT_CACHE_DIR:-$out/kernel-cache}

environment() {
  nvidia-smi || echo "(no nvidia-smi)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
    --format=csv || true
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' ||
    echo "(no PyTorch at $py)"
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -n 1
  command -v ncu >/dev/null && ncu --version | tail -n 1
  uname -a
  echo "TRIDENT_BIN=$bin TRIDENT_CUDA_ARCH=${TRIDENT_CUDA_ARCH:-} TRIDENT_NVRTC=${TRIDENT_NVRTC:-} TRIDENT_NCCL=${TRIDENT_NCCL:-} TRIDENT_CACHE_DIR=$TRIDENT_CACHE_DIR"
}

# The two training runs side by side: the CPU one in the background, then the GPU one.
train_pair() {
  local data=$out/data/shakespeare common cpu_pid cpu_rc=0 gpu_rc=0 threads
  mkdir -p "$out/data"
  "$bin" prepare --input "$root/data/tinyshakespeare.txt" --output-prefix "$data" --append-eod >"$out/prepare.log" 2>&1 ||
    { echo "prepare failed: $(tail -n 1 "$out/prepare.log")"; return 1; }
  read -r -a model <<<"$model_flags"
  common=(train "${model[@]}" --bf16 --data-path "${data}_text_document" --train-iters "$iters" --log-interval 1
    --eval-interval "$iters" --eval-iters 10)
  threads=$(($(nproc) / 2))
  [ "$threads" -ge 1 ] || threads=1
  "$bin" "${common[@]}" --device cpu --cpu-threads "$threads" --log-json "$out/train-cpu.jsonl" >"$out/train-cpu.log" 2>&1 &
  cpu_pid=$!
  "$bin" "${common[@]}" --device cuda --log-json "$out/train-cuda.jsonl" >"$out/train-cuda.log" 2>&1 || gpu_rc=$?
  wait "$cpu_pid" || cpu_rc=$?
  echo "cuda run: exit $gpu_rc, $(grep -c . "$out/train-cuda.jsonl" 2>/dev/null || echo 0) lines; last: $(tail -n 1 "$out/train-cuda.log")"
  echo "cpu run: exit $cpu_rc, $(grep -c . "$out/train-cpu.jsonl" 2>/dev/null || echo 0) lines; last: $(tail -n 1 "$out/train-cpu.log")"
  [ "$gpu_rc" -eq 0 ] && [ "$cpu_rc" -eq 0 ]
}

bench() {
  GPU_BENCH_GEMMS=${GPU_BENCH_GEMMS-square=4096x4096x4096 gpt2-124m.qkv=16384x2304x768 gpt2-124m.proj=16384x768x768 \
gpt2-124m.fc1=16384x3072x768 gpt2-124m.fc2=16384x768x3072 gpt2-124m.head=16384x50304x768 \
gpt3-175b.qkv=8192x36864x12288 gpt3-175b.proj=8192x12288x12288 gpt3-175b.fc1=8192x49152x12288 \
gpt3-175b.fc2=8192x12288x49152} \
  GPU_BENCH_ATTENTION=${GPU_BENCH_ATTENTION-s1024.d64=16x1024x32x64 s1024.d128=16x1024x16x128 \
s4096.d64=4x4096x32x64 s4096.d128=4x4096x16x128} \
  GPU_BENCH_STEP=${GPU_BENCH_STEP-gpt2-124m=12x768x12x50257x16x1024} \
  TRIDENT_BIN=$bin TORCH_PYTHON=$py "$here/gpu-bench.sh" --device cuda --out "$out/bench.json"
}

# sanitize TOOL: compute-sanitizer over the small check ops.
sanitize() {
  command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer on the PATH"; return 1; }
  compute-sanitizer --tool "$1" --error-exitcode 3 --print-limit 20 "$bin" check ops --device cuda --size small
}

# ncu_profile: Nsight Compute over FIRST_LIGHT_NCU's bench, the report as text.
ncu_profile() {
  command -v ncu >/dev/null || { echo "no ncu on the PATH"; return 1; }
  local regex args
  read -r regex args <<<"$FIRST_LIGHT_NCU"
  # shellcheck disable=SC2086
  ncu --clock-control none --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats "$bin" bench $args --min-seconds 0.05
}

export bin out py root here iters model_flags
export -f environment train_pair bench sanitize ncu_profile
wanted env && run env 60 environment
wanted info && run info 30 "$bin" info
wanted check-gpu && run check-gpu 120 "$bin" check gpu
if wanted probe; then
  run probe 60 "$bin" bench gemm --device cuda --shape 512x512x512 --min-seconds 0.05
  if [ "$(tail -n 1 "$out/steps.tsv" | cut -f2)" != passed ] && [ -z "${TRIDENT_CUDA_ARCH:-}" ]; then
    export TRIDENT_CUDA_ARCH=sm_90
    echo "   the steps below run with TRIDENT_CUDA_ARCH=sm_90 (no wgmma GEMMs)"
    record probe-fallback note - 0 "TRIDENT_CUDA_ARCH=sm_90 for the steps below"
  fi
fi
wanted check-ops && run check-ops 180 "$bin" check ops --device cuda --size full
wanted check-nccl && run check-nccl 60 "$bin" check nccl
wanted train && run train 150 train_pair
wanted losses && run losses 30 "$bin" check losses "$out/train-cuda.jsonl" "$out/train-cpu.jsonl" --rtol 1e-2 \
  --from $((iters / 2))
wanted bench && run bench 240 bench
wanted memcheck && run memcheck 150 sanitize memcheck
wanted racecheck && run racecheck 150 sanitize racecheck
wanted ncu && run ncu 180 ncu_profile

awk -F'\t' -v now="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -v bin="$bin" '
  function q(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
  { rows[NR] = sprintf("    {\"step\": %s, \"status\": %s, \"exit\": %s, \"seconds\": %s, \"last_line\": %s}",
      q($1), q($2), ($3 == "-" ? "null" : $3), $4, q($5)) }
  END {
    printf "{\n  \"when\": %s,\n  \"binary\": %s,\n  \"steps\": [\n", q(now), q(bin)
    for (i = 1; i <= NR; i++) printf "%s%s\n", rows[i], (i < NR ? "," : "")
    printf "  ]\n}\n"
  }' "$out/steps.tsv" >"$out/summary.json"
echo
echo "first-light: logs and summary.json in $out"
printf '%-11s %-8s %5s %8s  %s\n' step status exit seconds "last line"
while IFS=$'\t' read -r name status rc secs note; do
  printf '%-11s %-8s %5s %8s  %s\n' "$name" "$status" "$rc" "$secs" "${note:0:110}"
done <"$out/steps.tsv"
exit "$failed"
