#!/usr/bin/env bash
# make gpu-layouts: every parallel layout as 4 ranks sharing this node's one GPU, each run beside
# the same run on the CPU and their losses compared iteration by iteration (`trident check
# losses`). The ranks share the GPU, which NCCL and RCCL refuse, so the GPU runs move tensors
# through MPI on host memory (`--gpu-collectives mpi`); NCCL itself is `make gpu-check`'s.
#   tp2-pp2         TP 2 x PP 2
#   tp2-dp2-zero1   TP 2 x DP 2 with the distributed optimizer (ZeRO-1)
#   tp2d            2-D tensor parallelism, 2 x 2 (SUMMA: the split LayerNorm)
#   llama-tp2-dp2   the llama-tiny preset (RMSNorm, SwiGLU, rotary, grouped queries), TP 2 x DP 2
#   cp2-dp2-p2p     context parallelism's ring (--cp-comm-type p2p, the block kernels), CP 2 x DP 2
#   cp4-all-gather  context parallelism's all_gather blocks, CP 4
# Usage: layouts.sh [--out DIR]   (logs, and summary.tsv: layout, passed or failed, why)
# Environment:
#   TRIDENT_BIN      the binary, built with MPI (default target/release/trident)
#   MPI_BUNDLE       a folder `tests/gpu/mpi-bundle.sh` filled (Debian's Open MPI unpacked), for a
#                    node without MPI: its mpirun and libraries are used
#   LAYOUTS_LAUNCH   the 4-rank launcher (default: Open MPI's mpirun with -np 4; e.g. "srun -n 4")
#   LAYOUTS          the layouts to run, space-separated (default: all six)
#   LAYOUTS_ITERS    iterations (default 20); LAYOUTS_RTOL the loss agreement (default 1e-2)
#   LAYOUTS_MODEL    the GPT layouts' model and batch flags (default: 4 layers of 128 in 4 heads,
#                    64 tokens, micro-batch 2, global batch 8)
#   LAYOUTS_DEVICE   cuda or hip (default: device 0 that `trident info` lists, NVIDIA first)
#   LAYOUTS_DATA     a dataset prefix (default: the bundled corpus, prepared into the out folder)
# Exit status: 0 when every layout followed the CPU, 1 when one did not or could not run, 2 on bad
# arguments.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -h | --help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    *) echo "layouts: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out=${out:-$root/runs/gpu-layouts/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 2
bin=${TRIDENT_BIN:-$root/target/release/trident}
iters=${LAYOUTS_ITERS:-20}
rtol=${LAYOUTS_RTOL:-1e-2}
read -r -a layouts <<<"${LAYOUTS:-tp2-pp2 tp2-dp2-zero1 tp2d llama-tp2-dp2 cp2-dp2-p2p cp4-all-gather}"

if [ -n "${MPI_BUNDLE:-}" ]; then
  # Debian's Open MPI unpacked under MPI_BUNDLE/usr: its programs, libraries, components and
  # help files found there (OPAL_PREFIX relocates the installation).
  usr=$(cd "$MPI_BUNDLE/usr" && pwd) || { echo "layouts: MPI_BUNDLE=$MPI_BUNDLE has no usr/" >&2; exit 2; }
  export OPAL_PREFIX=$usr PATH="$usr/bin:$PATH"
  export LD_LIBRARY_PATH="$usr/lib/x86_64-linux-gnu:$usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "${LAYOUTS_LAUNCH:-}" ]; then
  read -r -a launch <<<"$LAYOUTS_LAUNCH"
elif command -v mpirun.openmpi >/dev/null 2>&1; then
  launch=(mpirun.openmpi --oversubscribe --bind-to none -np 4)
  [ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
elif command -v mpirun >/dev/null 2>&1; then
  launch=(mpirun -np 4)
else
  echo "layouts: no mpirun here; set MPI_BUNDLE (tests/gpu/mpi-bundle.sh) or LAYOUTS_LAUNCH" >&2
  exit 1
fi

if ! info=$("$bin" info 2>&1); then
  echo "layouts: $bin does not run here: $(tail -n 1 <<<"$info")" >&2
  exit 1
fi
device=${LAYOUTS_DEVICE:-}
if [ -z "$device" ]; then
  if grep -q '^cuda device 0:' <<<"$info"; then device=cuda; elif grep -q '^hip device 0:' <<<"$info"; then device=hip; fi
fi
case $device in
  cuda | hip) ;;
  "") echo "layouts: no GPU: trident info lists no cuda or hip device 0" >&2; exit 1 ;;
  *) echo "layouts: LAYOUTS_DEVICE is cuda or hip, found '$device'" >&2; exit 2 ;;
esac

data=${LAYOUTS_DATA:-}
if [ -z "$data" ]; then
  data=$out/data/shakespeare
  mkdir -p "$out/data"
  "$bin" prepare --input "$root/data/tinyshakespeare.txt" --output-prefix "$data" --append-eod >"$out/prepare.log" 2>&1 ||
    { echo "layouts: prepare failed: $(tail -n 1 "$out/prepare.log")" >&2; exit 1; }
  data=${data}_text_document
fi

# The layout's flags (the model included).
flags_of() {
  local gpt
  read -r -a gpt <<<"${LAYOUTS_MODEL:---num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 \
--micro-batch-size 2 --global-batch-size 8 --lr 1e-3}"
  case $1 in
    tp2-pp2) echo "${gpt[*]} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" ;;
    tp2-dp2-zero1) echo "${gpt[*]} --tensor-model-parallel-size 2 --use-distributed-optimizer" ;;
    tp2d) echo "${gpt[*]} --tensor-model-parallel-size 4 --tensor-parallel-mode 2d" ;;
    llama-tp2-dp2) echo "--preset llama-tiny --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --tensor-model-parallel-size 2" ;;
    cp2-dp2-p2p) echo "${gpt[*]} --context-parallel-size 2 --cp-comm-type p2p" ;;
    cp4-all-gather) echo "${gpt[*]} --context-parallel-size 4 --cp-comm-type all_gather" ;;
    *) return 1 ;;
  esac
}

printf 'layout\tresult\twhy\n' >"$out/summary.tsv"
failed=0
for layout in "${layouts[@]}"; do
  if ! flags=$(flags_of "$layout"); then
    echo "layouts: unknown layout '$layout' (tp2-pp2 tp2-dp2-zero1 tp2d llama-tp2-dp2 cp2-dp2-p2p cp4-all-gather)" >&2
    exit 2
  fi
  read -r -a flags <<<"$flags"
  echo "== $layout: $iters iterations on $device (--gpu-collectives mpi) and on the CPU, 4 ranks, bf16"
  why=""
  for dev in "$device" cpu; do
    how=()
    [ "$dev" = cpu ] || how=(--gpu-collectives mpi)
    if ! "${launch[@]}" "$bin" train --device "$dev" "${how[@]}" --bf16 --data-path "$data" --train-iters "$iters" \
      --log-interval 1 --eval-interval 1000000 --log-json "$out/$layout.$dev.jsonl" "${flags[@]}" \
      </dev/null >"$out/$layout.$dev.log" 2>&1; then
      why="the $dev run failed: $(grep -m 1 -E 'error|panicked' "$out/$layout.$dev.log" || tail -n 1 "$out/$layout.$dev.log")"
      break
    fi
  done
  if [ -z "$why" ] && ! "$bin" check losses "$out/$layout.$device.jsonl" "$out/$layout.cpu.jsonl" --rtol "$rtol" \
    >"$out/$layout.check.log" 2>&1; then
    why="the losses part: $(tail -n 1 "$out/$layout.check.log")"
  fi
  if [ -z "$why" ]; then
    echo "layouts: $layout follows the CPU ($(tail -n 1 "$out/$layout.check.log"))"
    printf '%s\tpassed\t\n' "$layout" >>"$out/summary.tsv"
  else
    echo "layouts: $layout FAILED: $why" >&2
    printf '%s\tfailed\t%s\n' "$layout" "$(tr '\t\n' '  ' <<<"$why")" >>"$out/summary.tsv"
    failed=1
  fi
done
echo "layouts: logs and summary.tsv in $out"
exit "$failed"
