#!/usr/bin/env bash
# make gpu-bench: trident's GEMM, attention and training step on one GPU beside the same work in
# PyTorch, measured in the same run, printed as a table of trident / PyTorch ratios (time, TFLOP/s,
# tokens/s) with each side's MFU against the device's datasheet peak, and written as JSON.
#   trident: `trident bench gemm|attention --device D --shape ... --json` and `trident bench step
#            --device D --dtype bf16 --json` (src/cmd/bench/), one process per case;
#   PyTorch: tests/gpu/torch_compare.py (an optional comparison: torch.matmul, scaled_dot_product
#            _attention on its fastest backend there (named in the JSON), forward alone (case.fwd)
#            and forward + backward (case), GPT-2 and Llama steps in bf16 autocast with fused AdamW,
#            eager (case) and under torch.compile (case.compile) where it compiles),
#            when a PyTorch with CUDA (ROCm for --device hip) is there; otherwise it says why not.
# It needs no Rust toolchain and no network: only the binary, built elsewhere (`make NO_MPI=1
# build` gives target-nompi/release/trident, which needs no MPI library on the node), bash and
# awk; PyTorch's side needs Python with torch. Everything it skipped is listed with the reason.
#
# Usage: gpu-bench.sh [--device cuda|hip] [--out PATH]
# Environment:
#   TRIDENT_BIN    the binary (default: target-nompi/release/trident, else target/release/trident)
#   TORCH_PYTHON   PyTorch's Python (default: /opt/torch/.venv/bin/python if there, else python3)
#   OUT            the JSON file (default runs/gpu-bench/<device>-<date>.json); --out wins
#   GPU_BENCH_DEVICE        cuda or hip (default: device 0 that `trident info` lists, NVIDIA first)
#   GPU_BENCH_MIN_SECONDS   time per kernel case (default 0.3)
#   GPU_BENCH_STEPS         timed training steps (default: enough to fill the minimum time)
#   GPU_BENCH_TOKENS        the GEMMs' M, tokens per micro-batch (default 8192)
#   GPU_BENCH_GEMMS         "CASE=MxNxK ..." (default: GPT-2 124M's and a GPT-3 175B layer's)
#   GPU_BENCH_ATTENTION     "CASE=BxSxHxD[xG] ..." (G: key/value heads; default: GPT-2 124M's
#                           8x1024x12x64, GPT-3 175B's 1x2048x96x128 and Llama 3 8B's 8192 tokens,
#                           1x8192x32x128x8)
#   GPU_BENCH_STEP          "CASE=LxHxAxVxBxS": layers, hidden, heads, vocabulary (padded to a
#                           multiple of 128 on both sides), micro-batch, sequence (default GPT-2
#                           124M, gpt2-124m=12x768x12x50257x8x1024)
#   GPU_BENCH_LLAMA_STEP    "CASE=LxHxAxGxFxVxBxS": a Llama step (`bench step --preset llama3-8b`):
#                           layers, hidden, heads, key/value heads, SwiGLU width, vocabulary,
#                           micro-batch, sequence (default Llama 3 8B's layers, 4 of them to fit
#                           one GPU, at 8192 tokens: llama3-8b.4l=4x4096x32x8x14336x128256x1x8192)
#   GPU_BENCH_TORCH_COMPILE 1 (default) also times PyTorch's steps under torch.compile; 0 does not
#   GPU_BENCH_TORCH_DEVICE  PyTorch's device when not the GPU's: cpu (the tests; numbers meaningless)
# A list set empty runs none of its cases (and says so). Exit status: 0 when every trident bench
# ran, 1 when one failed or there is no GPU, 2 on bad arguments; PyTorch's absence is not a failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

usage() {
  echo "usage: gpu-bench.sh [--device cuda|hip] [--out PATH]   (environment: see the script's header)"
}

device=${GPU_BENCH_DEVICE:-}
out=${OUT:-}
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=${2:?--device needs cuda or hip}; shift 2 ;;
    --out) out=${2:?--out needs a path}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case $device in
  "" | cuda | hip) ;;
  *) echo "gpu-bench: --device is cuda or hip, found '$device'" >&2; exit 2 ;;
esac

# bin and py (TRIDENT_BIN, TORCH_PYTHON and their defaults).
bin="" py=""
# shellcheck disable=SC1091
. "$here/node-defaults.sh"
secs=${GPU_BENCH_MIN_SECONDS:-0.3}
tokens=${GPU_BENCH_TOKENS:-8192}
read -r -a gemms <<<"${GPU_BENCH_GEMMS-gpt2-124m.qkv=${tokens}x2304x768 gpt2-124m.proj=${tokens}x768x768 \
gpt2-124m.fc1=${tokens}x3072x768 gpt2-124m.fc2=${tokens}x768x3072 gpt2-124m.head=${tokens}x50304x768 \
gpt3-175b.qkv=${tokens}x36864x12288 gpt3-175b.proj=${tokens}x12288x12288 gpt3-175b.fc1=${tokens}x49152x12288 \
gpt3-175b.fc2=${tokens}x12288x49152}"
read -r -a attentions <<<"${GPU_BENCH_ATTENTION-gpt2-124m=8x1024x12x64 gpt3-175b=1x2048x96x128 \
llama3-8b=1x8192x32x128x8}"
read -r -a steps <<<"${GPU_BENCH_STEP-gpt2-124m=12x768x12x50257x8x1024}"
read -r -a llama_steps <<<"${GPU_BENCH_LLAMA_STEP-llama3-8b.4l=4x4096x32x8x14336x128256x1x8192}"
compile=${GPU_BENCH_TORCH_COMPILE:-1}

work=$(mktemp -d "${TMPDIR:-/tmp}/trident-gpu-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
: >"$work/torch.jsonl"
: >"$work/trident.tsv"
: >"$work/skipped.tsv"
failed=0

# skip WHAT WHY: one line of what this run did not measure.
skip() { printf '%s\t%s\n' "$1" "$2" >>"$work/skipped.tsv"; }

[ ${#gemms[@]} -gt 0 ] || skip "gemm" "GPU_BENCH_GEMMS is empty"
[ ${#attentions[@]} -gt 0 ] || skip "attention" "GPU_BENCH_ATTENTION is empty"
[ ${#steps[@]} -gt 0 ] || skip "step" "GPU_BENCH_STEP is empty"
[ ${#llama_steps[@]} -gt 0 ] || skip "llama step" "GPU_BENCH_LLAMA_STEP is empty"
[ "$compile" = 1 ] || skip "PyTorch under torch.compile" "GPU_BENCH_TORCH_COMPILE=$compile"

# trident CASE BENCH SHAPE ARGS...: one trident bench, its JSON records in $work/records (or why it
# failed, kept as CASE's row); then `keep` takes the records the table shows.
trident() {
  local case=$1 bench=$2 shape=$3 why
  shift 3
  echo "== trident bench $bench --device $device $case $shape"
  if "$bin" bench "$bench" --device "$device" --min-seconds "$secs" "$@" --json >"$work/records" 2>"$work/stderr" &&
    grep -q '^{' "$work/records"; then
    return 0
  fi
  why=$(tr '\t\n' '  ' <"$work/stderr")
  echo "gpu-bench: trident bench $bench $case failed: ${why:-no JSON record}" >&2
  printf '%s\t%s\t%s\tfailed\tthe bench failed: %s\n' "$case" "$bench" "$shape" "${why:-no JSON record}" >>"$work/trident.tsv"
  failed=1
  return 1
}

# keep CASE BENCH SHAPE PATTERN: the last of the bench's JSON records that matches PATTERN (grep -E)
# as CASE's row.
keep() {
  local line
  line=$(grep '^{' "$work/records" | grep -E -e "$4" | tail -n 1 || true)
  if [ -n "$line" ]; then
    printf '%s\t%s\t%s\tok\t%s\n' "$1" "$2" "$3" "$line" >>"$work/trident.tsv"
  else
    printf '%s\t%s\t%s\tfailed\tno record of the bench matches %s\n' "$1" "$2" "$3" "$4" >>"$work/trident.tsv"
    failed=1
  fi
}

# keep_step CASE SHAPE: a step's record, as CASE's row and, under torch.compile, CASE.compile's
# too (trident's one step beside PyTorch's eager and compiled ones).
keep_step() {
  keep "$1" step "$2" .
  [ "$compile" != 1 ] || keep "$1.compile" step "$2" .
}

# The device: the one asked for, else device 0 of the driver or runtime trident finds.
info=""
if ! info=$("$bin" info 2>&1); then
  echo "gpu-bench: $bin does not run here: $(tail -n 1 <<<"$info")" >&2
  echo "gpu-bench: build it with 'make NO_MPI=1 build' (no MPI library needed on the node) or set TRIDENT_BIN" >&2
  exit 1
fi
if [ -z "$device" ]; then
  if grep -q '^cuda device 0:' <<<"$info"; then
    device=cuda
  elif grep -q '^hip device 0:' <<<"$info"; then
    device=hip
  fi
fi

if [ -z "$device" ]; then
  why=$(grep -E '^(cuda driver|hip runtime):' <<<"$info" | tr '\n' ';' || true)
  skip "trident (every bench) and PyTorch" "no GPU: trident info lists no cuda or hip device 0 (${why%;})"
  failed=1
else
  for c in "${gemms[@]}"; do
    trident "${c%%=*}" gemm "${c#*=}" --shape "${c#*=}" && keep "${c%%=*}" gemm "${c#*=}" .
  done
  # Attention: the forward alone (CASE.fwd) and forward + backward (CASE), as PyTorch's two records.
  for c in "${attentions[@]}"; do
    if trident "${c%%=*}" attention "${c#*=}" --shape "${c#*=}"; then
      keep "${c%%=*}.fwd" attention "${c#*=}" '"shape": "[^"]* causal"'
      keep "${c%%=*}" attention "${c#*=}" '"shape": "[^"]* fwd\+bwd"'
    fi
  done
  for c in "${steps[@]}"; do
    IFS=x read -r layers hidden heads vocab batch seq <<<"${c#*=}"
    step_flags=(--dtype bf16 --preset gpt2-124m --num-layers "$layers" --hidden-size "$hidden"
      --num-attention-heads "$heads" --vocab-size "$vocab" --micro-batch-size "$batch" --seq-length "$seq")
    [ -z "${GPU_BENCH_STEPS:-}" ] || step_flags+=(--steps "$GPU_BENCH_STEPS")
    trident "${c%%=*}" step "${c#*=}" "${step_flags[@]}" && keep_step "${c%%=*}" "${c#*=}"
  done
  for c in "${llama_steps[@]}"; do
    IFS=x read -r layers hidden heads groups ffn vocab batch seq <<<"${c#*=}"
    step_flags=(--dtype bf16 --preset llama3-8b --num-layers "$layers" --hidden-size "$hidden"
      --num-attention-heads "$heads" --num-query-groups "$groups" --ffn-hidden-size "$ffn" --vocab-size "$vocab"
      --micro-batch-size "$batch" --seq-length "$seq")
    [ -z "${GPU_BENCH_STEPS:-}" ] || step_flags+=(--steps "$GPU_BENCH_STEPS")
    trident "${c%%=*}" step "${c#*=}" "${step_flags[@]}" && keep_step "${c%%=*}" "${c#*=}"
  done

  torch_device=${GPU_BENCH_TORCH_DEVICE:-$device}
  torch_args=(--device "$torch_device" --min-seconds "$secs" --out "$work/torch.jsonl")
  for c in "${gemms[@]}"; do torch_args+=(--gemm "$c"); done
  for c in "${attentions[@]}"; do torch_args+=(--attention "$c"); done
  for c in "${steps[@]}"; do torch_args+=(--step "$c"); done
  for c in "${llama_steps[@]}"; do torch_args+=(--llama-step "$c"); done
  [ "$compile" != 1 ] || torch_args+=(--compile)
  [ -z "${GPU_BENCH_STEPS:-}" ] || torch_args+=(--steps "$GPU_BENCH_STEPS")
  echo "== PyTorch on $torch_device: $py tests/gpu/torch_compare.py"
  if ! command -v "$py" >/dev/null 2>&1; then
    skip "PyTorch (every comparison)" "no Python at '$py' (set TORCH_PYTHON to a Python with torch)"
  elif ! "$py" "$here/torch_compare.py" "${torch_args[@]}" 2>"$work/stderr"; then
    skip "PyTorch (the cases without a record)" "torch_compare.py failed: $(tail -n 3 "$work/stderr" | tr '\t\n' '  ')"
  fi
fi

if [ -z "$out" ]; then
  out=$root/runs/gpu-bench/${device:-nogpu}-$(date +%Y%m%d-%H%M%S).json
fi
mkdir -p "$(dirname "$out")"
awk -v out="$out" -v bin="$bin" -f "$here/gpu-bench.awk" "$work/torch.jsonl" "$work/trident.tsv" "$work/skipped.tsv"
exit "$failed"
