#!/usr/bin/env bash
# make gpu-calibrate: the measurements `trident plan --calibrate FILE` prices layouts with, taken on
# one GPU of the machine to plan for. For each per-rank GEMM of a transformer layer under tensor
# parallelism (QKV, projection, fc1, fc2 and the output layer, forward and both backward
# products), causal flash attention at per-rank head counts, and element-wise passes, it times
#   PyTorch (tests/gpu/torch_compare.py: cuBLAS through torch.matmul, flash attention through
#            scaled_dot_product_attention): what Megatron-LM on PyTorch reaches on this GPU, and
#   trident  (`trident bench gemm|attention --device D --shape ... --json`): what trident reaches,
# and writes each side's JSON lines, which `plan --calibrate` reads as they are:
#   OUT/torch.jsonl, OUT/trident.jsonl, OUT/log
# It also times two GPT training steps on the one GPU (PyTorch and trident) for checking `plan`'s
# single-GPU prediction. Needs no Rust toolchain and no network (see gpu-bench.sh).
#
# Usage: plan-calibrate.sh [--out DIR] [--deadline SECONDS] [--device cuda|hip]
# Environment:
#   TRIDENT_BIN, TORCH_PYTHON      as gpu-bench.sh
#   CALIBRATE_LAYERS   "H:F:TP:T ..." hidden size, FFN size, tensor-parallel size, tokens per
#                      micro-batch (default: the layers of the Megatron-LM README's 2024 H100 table
#                      and of Korthikanti et al. 2022, tests/plan_published_points.md)
#   CALIBRATE_ATTENTION  "BxSxHxD ..." (default: sequence 2048, 4096 and 8192 at 8-16 heads of 128)
#   CALIBRATE_STEPS    "ID=LxHxAxVxBxS ..." (default gpt2-124m and a 1.3B GPT)
#   CALIBRATE_SIDES    "torch trident" (default both)
# Exit status: 0 when every trident bench that ran passed, 1 otherwise, 2 on bad arguments.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out="" budget=540 device=cuda
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --deadline) budget=${2:?--deadline needs seconds}; shift 2 ;;
    --device) device=${2:?--device needs cuda or hip}; shift 2 ;;
    -h | --help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    *) echo "plan-calibrate: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out=${out:-$root/runs/calibrate/$device-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
deadline=$(($(date +%s) + budget))
bin="" py=""
# shellcheck disable=SC1091
. "$here/node-defaults.sh"
gpu_libraries plan-calibrate || exit 1
if ! "$bin" info 2>/dev/null | grep -q "^$device device 0:"; then
  echo "plan-calibrate: trident info lists no $device device 0: this script measures a GPU (run it on a GPU node)" >&2
  exit 1
fi
export TRIDENT_CACHE_DIR=${TRIDENT_CACHE_DIR:-$out/kernel-cache}
sides=${CALIBRATE_SIDES:-torch trident}
layers=${CALIBRATE_LAYERS:-2048:8192:1:4096 4096:16384:2:4096 6144:24576:4:4096 7168:28672:8:4096 \
8192:32768:8:4096 10240:40960:8:4096 12288:49152:8:4096 16384:65536:8:4096 18432:73728:8:4096 \
6144:24576:8:8192 12288:49152:8:2048 20480:81920:8:2048 25600:102400:8:2048}
attention=${CALIBRATE_ATTENTION:-1x2048x12x128 1x2048x16x128 1x4096x8x128 1x4096x16x128 1x8192x8x128}
steps=${CALIBRATE_STEPS:-gpt2-124m=12x768x12x50257x8x1024 gpt-1.3b=24x2048x16x50257x4x2048}
vocab=131072
log=$out/log
: >"$log"
failed=0
{ "$bin" info; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv; } >>"$log" 2>&1

# Per-rank GEMMs M x N x K of one layer (fwd: tokens x out x in) and its two backward products
# (input gradient: tokens x in x out; weight gradient: out x in x tokens), and the output layer's.
gemms() {
  local l h f tp t nk n k
  for l in $layers; do
    IFS=: read -r h f tp t <<<"$l"
    for nk in "$((3 * h / tp)) $h" "$h $((h / tp))" "$((f / tp)) $h" "$h $((f / tp))" "$((vocab / tp)) $h"; do
      read -r n k <<<"$nk"
      echo "${t}x${n}x${k}"
      [ -n "${FORWARD_ONLY:-}" ] || { echo "${t}x${k}x${n}"; echo "${n}x${k}x${t}"; }
    done
  done | sort -u
}
shapes=$(gemms)
# trident times the forward products (its backward kernels are timed by gpu-bench.sh).
forward=$(FORWARD_ONLY=1 gemms)

left() { echo $((deadline - $(date +%s))); }

if [[ " $sides " == *" torch "* ]]; then
  args=(--device "$device" --min-seconds 0.05 --out "$out/torch.jsonl")
  for s in $shapes; do args+=(--gemm "g$s=$s"); done
  for a in $attention; do args+=(--attention "a$a=$a"); done
  for s in $steps; do args+=(--step "$s"); done
  echo "== PyTorch: $(wc -w <<<"$shapes") GEMMs, attention, steps ($(left) s left)" | tee -a "$log"
  timeout "$(left)" "$py" "$here/torch_compare.py" "${args[@]}" >>"$log" 2>&1 || echo "plan-calibrate: PyTorch failed or ran out of time" | tee -a "$log"
  # Element-wise passes (LayerNorm, GELU, residual add) on [T, h] bf16: bytes moved per second.
  [ "$device" = cpu ] || timeout "$(left)" "$py" - >>"$out/torch.jsonl" 2>>"$log" <<'EOF' || echo "plan-calibrate: element-wise timing failed" | tee -a "$log"
import json, sys, torch
import torch.nn.functional as F
dev = "cuda"
for t, h in [(4096, 4096), (4096, 12288), (8192, 8192)]:
    x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
    y = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
    w = torch.ones(h, device=dev, dtype=torch.bfloat16)
    for name, fn, moved in [("layernorm", lambda: F.layer_norm(x, (h,), w, w), 2), ("gelu", lambda: F.gelu(x), 2), ("add", lambda: x + y, 3)]:
        for _ in range(3): fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50): fn()
        e.record(); e.synchronize()
        ms = s.elapsed_time(e) / 50
        print(json.dumps({"bench": "elementwise", "case": name, "shape": f"{t}x{h}", "ms": ms, "gb_per_s": moved * 2 * t * h / ms / 1e6}))
EOF
fi

if [[ " $sides " == *" trident "* ]]; then
  : >"$out/trident.jsonl"
  echo "== trident: GEMMs ($(left) s left)" | tee -a "$log"
  for s in $forward; do
    [ "$(left)" -gt 60 ] || { echo "plan-calibrate: out of time at GEMM $s" | tee -a "$log"; break; }
    timeout 60 "$bin" bench gemm --device "$device" --shape "$s" --min-seconds 0.05 --json >>"$out/trident.jsonl" 2>>"$log" ||
      { echo "plan-calibrate: trident bench gemm $s failed" | tee -a "$log"; failed=1; }
  done
  for a in $attention; do
    [ "$(left)" -gt 40 ] || break
    timeout 60 "$bin" bench attention --device "$device" --shape "$a" --json >>"$out/trident.jsonl" 2>>"$log" ||
      { echo "plan-calibrate: trident bench attention $a failed" | tee -a "$log"; failed=1; }
  done
  for c in $steps; do
    [ "$(left)" -gt 60 ] || break
    IFS=x read -r l h a v b s <<<"${c#*=}"
    timeout "$(($(left) - 10))" "$bin" bench step --device "$device" --dtype bf16 --num-layers "$l" --hidden-size "$h" \
      --num-attention-heads "$a" --vocab-size "$v" --micro-batch-size "$b" --seq-length "$s" --steps 3 --json \
      >>"$out/trident.jsonl" 2>>"$log" || { echo "plan-calibrate: trident bench step $c failed" | tee -a "$log"; failed=1; }
  done
fi
echo "== done ($(left) s left): $(grep -c . "$out/torch.jsonl" 2>/dev/null) PyTorch records, $(grep -c . "$out/trident.jsonl" 2>/dev/null) trident records" | tee -a "$log"
exit "$failed"
