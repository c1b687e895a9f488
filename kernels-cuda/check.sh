#!/usr/bin/env bash
# `make kernels-check`: compiles every kernel in kernels/ (the portable ones) and kernels-cuda/
# with nvcc for sm_80 and sm_90a,
# as both modules (bf16 storage, and fp16 with -DTRIDENT_FP16: common/base.cuh; the fp16 rows
# name the file as file[fp16]),
# prints each kernel's registers, shared memory, stack and spills (ptxas -v), fails on any
# spill, and confirms the tensor-core instructions in the SASS: HMMA (mma.sync) in the GEMMs of
# gemm_bf16.cu and gemm_bf16_bwd.cu and in the attention kernels (both archs; attention stays on
# mma.sync on sm_90a too), and for sm_90a in every kernel of gemm_bf16_sm90.cu (the forward,
# backward-input and backward-weight GEMMs) both HGMMA (wgmma) and UTMALDG (TMA loads), so a
# kernel that lost its wgmma or its TMA fails (for sm_80 that file compiles to trapping stubs, so
# nothing is required there).
# No GPU is needed. nvcc comes from NVIDIA's pip wheels, installed once into .cache/cuda-toolchain
# (pip --target: no venv, and untouched by Debian's externally-managed Python rule) and reused
# while the pinned versions match. KERNELS_CHECK_NVCC_FLAGS adds nvcc flags for experiments.
# `--fetch-only` installs the wheels and stops (`make cuda-toolchain`, which CI runs beside a build).
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLCHAIN=.cache/cuda-toolchain
PINS="nvidia-cuda-nvcc==13.5.37 nvidia-cuda-runtime==13.5.37 nvidia-cuda-cccl==13.3.5.0.6 nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37"
BIN=$TOOLCHAIN/nvidia/cu13/bin

if [ ! -x "$BIN/nvcc" ] || [ "$(cat "$TOOLCHAIN/.pins" 2>/dev/null)" != "$PINS" ]; then
  command -v python3 >/dev/null 2>&1 || { echo "kernels-check: needs python3 with pip to fetch nvcc" >&2; exit 1; }
  echo "kernels-check: installing the CUDA compiler wheels into $TOOLCHAIN ($PINS)"
  rm -rf "$TOOLCHAIN"
  # shellcheck disable=SC2086 # PINS is a list of requirements
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$TOOLCHAIN" $PINS
  echo "$PINS" >"$TOOLCHAIN/.pins"
fi
[ "${1:-}" != --fetch-only ] || exit 0
NVCC=$BIN/nvcc
CUOBJDUMP=$BIN/cuobjdump
"$NVCC" --version | tail -1

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# arch name -> nvcc target flags
declare -A ARCH_FLAGS=([sm_80]="-arch=sm_80" [sm_90a]="-gencode=arch=compute_90a,code=sm_90a")
# kernel file (or file:arch) -> SASS instruction that must appear (the tensor-core path is
# really taken)
declare -A MUST_HAVE=([gemm_bf16.cu]="HMMA" [gemm_bf16_bwd.cu]="HMMA" [attention_fwd.cu]="HMMA"
  [attention_bwd.cu]="HMMA" [attention_block.cu]="HMMA" [gemm_bf16_sm90.cu:sm_90a]="HGMMA")
# file:arch -> SASS instructions that must appear in every kernel function of the file
declare -A EVERY_KERNEL_HAS=([gemm_bf16_sm90.cu:sm_90a]="HGMMA UTMALDG")

status=0
# module -> its define (the bf16 module has none: the text it always was)
declare -A MODULE_FLAGS=([bf16]="" [fp16]="-DTRIDENT_FP16")
# Every compile first, as many at once as there are cores (KERNELS_CHECK_JOBS), each one's ptxas
# report and exit status kept beside its cubin; the checks below read them in order. The GEMM and
# attention files, the longest compiles, start first.
jobs_max=${KERNELS_CHECK_JOBS:-$(nproc)}
for src in kernels-cuda/*.cu kernels/*.cu; do
  file=$(basename "$src")
  for module in bf16 fp16; do
  for arch in sm_80 sm_90a; do
    cubin=$OUT/${file%.cu}.$arch.$module.cubin
    # shellcheck disable=SC2086 # the flags are words
    { "$NVCC" -cubin -O3 -std=c++17 ${ARCH_FLAGS[$arch]} ${MODULE_FLAGS[$module]} -I kernels -I kernels-cuda ${KERNELS_CHECK_NVCC_FLAGS:-} -Xptxas -v -o "$cubin" "$src" >"$cubin.log" 2>&1
      echo $? >"$cubin.status"; } &
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  done
  done
done
wait
printf '%-7s %-18s %-30s %5s %10s %9s %14s\n' arch file kernel regs smem_bytes stack spill_st/ld
for src in kernels/*.cu kernels-cuda/*.cu; do
  file=$(basename "$src")
  for module in bf16 fp16; do
  label=$file; [ "$module" = bf16 ] || label="${file}[$module]"
  for arch in sm_80 sm_90a; do
    cubin=$OUT/${file%.cu}.$arch.$module.cubin
    log=$(cat "$cubin.log")
    if [ "$(cat "$cubin.status")" != 0 ]; then
      echo "$log" >&2
      echo "kernels-check: $label does not compile for $arch" >&2
      status=1
      continue
    fi
    # ptxas -v reports per entry: "Compiling entry function 'k' for 'sm_80'", then the stack and
    # spill line, then "Used N registers, ... M bytes smem ...".
    table=$(awk -v arch="$arch" -v file="$label" '
      /Compiling entry function/ { match($0, /function .[^'"'"']*/); name = substr($0, RSTART + 10, RLENGTH - 10); stack = 0; st = 0; ld = 0 }
      /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
      /Used [0-9]+ registers/ {
        regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
        smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
        printf "%-7s %-18s %-30s %5s %10s %9s %14s\n", arch, file, name, regs, smem, stack, st "/" ld
        if (st + ld > 0) spills = 1
      }
      END { exit spills }' <<<"$log") || { status=1; spill_seen=1; }
    echo "$table"
    if [ "${spill_seen:-0}" = 1 ]; then
      echo "kernels-check: $label spills registers on $arch (a kernel that spills is a bug)" >&2
      spill_seen=0
    fi
    want=${MUST_HAVE[$file:$arch]:-${MUST_HAVE[$file]:-}}
    if [ -n "$want" ]; then
      n=$("$CUOBJDUMP" -sass "$cubin" | grep -c "$want" || true)
      if [ "$n" -gt 0 ]; then
        ops=$("$CUOBJDUMP" -sass "$cubin" | grep -oE "${want}[.A-Z0-9x]*" | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')
        echo "        SASS of $label for $arch: $ops"
      else
        echo "kernels-check: no $want in the SASS of $label for $arch" >&2
        status=1
      fi
    fi
    for need in ${EVERY_KERNEL_HAS[$file:$arch]:-}; do
      # cuobjdump prints "Function : <name>" before each kernel's SASS.
      missing=$("$CUOBJDUMP" -sass "$cubin" | awk -v want="$need" '
        /Function : / { if (name != "" && !seen) print name; name = $3; seen = 0 }
        index($0, want) { seen = 1 }
        END { if (name != "" && !seen) print name }')
      kernels=$("$CUOBJDUMP" -sass "$cubin" | grep -c "Function : " || true)
      if [ -n "$missing" ] || [ "$kernels" -eq 0 ]; then
        echo "kernels-check: no $need in the SASS of ${missing:-any kernel} ($label, $arch)" >&2
        status=1
      else
        echo "        every one of the $kernels kernels of $label for $arch has $need"
      fi
    done
  done
  done
done
echo "kernels-check: on sm_90a the linear layers' GEMMs (forward, backward-input, backward-weight) have wgmma + TMA versions (gemm_bf16_sm90.cu: HGMMA, UTMALDG); attention stays on mma.sync (HMMA)"
if [ $status = 0 ]; then echo "kernels-check: all kernels compile for sm_80 and sm_90a, bf16 and fp16 modules, no spills"; fi
exit $status
