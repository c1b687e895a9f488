#!/usr/bin/env bash
# `make kernels-check`, the AMD half: compiles every kernel file in kernels/ (the portable ones)
# and kernels-hip/ as a device-only
# code object (v4, for the ROCm 5.x runtime) for gfx90a (MI250X, Frontier) with Debian's hipcc
# (ROCm 5.2, clang-15) and for gfx942 (MI300X) with Debian's clang-19, which needs one shim: ROCm
# 5.2 ships no oclc_isa_version_942.bc, so a device-library directory is made of links to the 5.2
# bitcode plus that file, generated from the gfx940 one with its ISA number changed (built once
# into $TRIDENT_HIP_DEVLIBS, by default ~/.cache/trident-hip-devlibs, never inside the clone).
# It prints each kernel's SGPRs, VGPRs, AGPRs, scratch, LDS and occupancy (clang's
# kernel-resource-usage remarks), fails on a compile error or any scratch use or spill (but the
# per-document attention kernels' SGPRs kept in VGPR lanes, below), and
# requires v_mfma in the disassembly of every gemm_*.hip and attention_*.hip (the bf16 MFMA is
# v_mfma_f32_32x32x8bf16_1k on gfx90a and v_mfma_f32_32x32x8_bf16 on gfx942: one encoding, two
# names). Every file is compiled as both modules: bf16 storage, and fp16 with -DTRIDENT_FP16
# (common/base.h; its rows name the file as file[fp16]), whose MFMA must be the f16 one
# (v_mfma_f32_32x32x8f16, v_mfma_f32_32x32x8_f16 on gfx942) and no bf16 one, and the other way
# round. No GPU is needed. The compilers come from apt (`make hip-deps`).
# KERNELS_CHECK_HIP_FLAGS adds compiler flags for experiments.
set -euo pipefail
cd "$(dirname "$0")/.."

# hipcc picks the NVIDIA platform when an nvcc is on the PATH; the AMD one is always meant here.
export HIP_PLATFORM=amd
HIPCC=${HIPCC:-hipcc}
CLANG19=${CLANG19:-clang++-19}
OBJDUMP=${OBJDUMP:-llvm-objdump-19}
BITCODE=${ROCM_DEVICE_LIBS:-/usr/lib/x86_64-linux-gnu/amdgcn/bitcode}
for tool in "$HIPCC" "$CLANG19" "$OBJDUMP" llvm-dis-19 llvm-as-19; do
  command -v "$tool" >/dev/null 2>&1 || { echo "kernels-check: $tool not found (run 'make hip-deps': hipcc libamdhip64-dev rocm-device-libs clang-19 lld-19 llvm-19)" >&2; exit 1; }
done
[ -f "$BITCODE/oclc_isa_version_940.bc" ] || { echo "kernels-check: no ROCm device libraries in $BITCODE (apt-get install rocm-device-libs)" >&2; exit 1; }

# The gfx942 shim: links to the 5.2 device libraries plus oclc_isa_version_942.bc. Rebuilt when
# the 5.2 libraries change (their listing is the stamp).
DEVLIBS=${TRIDENT_HIP_DEVLIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/trident-hip-devlibs}/gfx942
stamp=$(find "$BITCODE" -name '*.bc' -printf '%f %s %T@\n' | sort | md5sum | cut -d' ' -f1)
if [ "$(cat "$DEVLIBS/.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "kernels-check: building the gfx942 device-library shim in $DEVLIBS"
  rm -rf "$DEVLIBS.partial" && mkdir -p "$DEVLIBS.partial"
  ln -s "$BITCODE"/*.bc "$DEVLIBS.partial/"
  llvm-dis-19 "$BITCODE/oclc_isa_version_940.bc" -o - | sed 's/i32 9400/i32 9402/' \
    | llvm-as-19 -o "$DEVLIBS.partial/oclc_isa_version_942.bc"
  echo "$stamp" >"$DEVLIBS.partial/.stamp"
  rm -rf "$DEVLIBS" && mv "$DEVLIBS.partial" "$DEVLIBS"
fi
echo "kernels-check: $(hipconfig --version 2>/dev/null | head -1 | sed 's/^/HIP /') hipcc ($("$HIPCC" --version 2>/dev/null | grep -m1 -o 'clang version [0-9.]*' || echo clang-15)) for gfx90a; $("$CLANG19" --version | head -1) for gfx942"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# arch -> the device-only compile command (a plain ELF code object, no offload bundle)
compile() { # arch source output [defines]
  local common=(-O3 -std=c++17 -mcode-object-version=4 --cuda-device-only --no-gpu-bundle-output -c
    -Rpass-analysis=kernel-resource-usage -I kernels -I kernels-hip ${4:+"$4"})
  # shellcheck disable=SC2086 # the flags are words
  case $1 in
    gfx90a) "$HIPCC" --offload-arch=gfx90a "${common[@]}" ${KERNELS_CHECK_HIP_FLAGS:-} -o "$3" "$2" ;;
    gfx942) "$CLANG19" -x hip --rocm-path=/usr --rocm-device-lib-path="$DEVLIBS" --offload-arch=gfx942 \
      "${common[@]}" ${KERNELS_CHECK_HIP_FLAGS:-} -o "$3" "$2" ;;
  esac
}

status=0
# module -> its define (the bf16 module has none: the text it always was), the MFMA its GEMM and
# attention code must issue, and the one it must not
declare -A MODULE_FLAGS=([bf16]="" [fp16]="-DTRIDENT_FP16")
declare -A MODULE_MFMA=([bf16]='v_mfma_f32_32x32x8_?bf16(_1k)?' [fp16]='v_mfma_f32_32x32x8_?f16')
# Every compile first, as many at once as there are cores (KERNELS_CHECK_JOBS), each one's
# remarks and exit status kept beside its code object; the checks below read them in order. The
# GEMM and attention files, the longest compiles, start first.
jobs_max=${KERNELS_CHECK_JOBS:-$(nproc)}
for src in kernels-hip/*.hip kernels/*.cu; do
  file=$(basename "$src")
  for module in bf16 fp16; do
  for arch in gfx90a gfx942; do
    co=$OUT/${file%.*}.$arch.$module.co
    { compile "$arch" "$src" "$co" "${MODULE_FLAGS[$module]}" >"$co.log" 2>&1; echo $? >"$co.status"; } &
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  done
  done
done
wait
printf '%-7s %-24s %-36s %5s %5s %5s %8s %6s %6s\n' arch file kernel SGPR VGPR AGPR scratch LDS waves
for src in kernels/*.cu kernels-hip/*.hip; do
  file=$(basename "$src")
  for module in bf16 fp16; do
  label=$file; [ "$module" = bf16 ] || label="${file}[$module]"
  other=$([ "$module" = bf16 ] && echo fp16 || echo bf16)
  for arch in gfx90a gfx942; do
    co=$OUT/${file%.*}.$arch.$module.co
    log=$(cat "$co.log")
    if [ "$(cat "$co.status")" != 0 ]; then
      echo "$log" | grep -v 'remark:' >&2
      echo "kernels-check: $label does not compile for $arch" >&2
      status=1
      continue
    fi
    # One remark block per kernel: "Function Name: k", then "SGPRs: n", "VGPRs: n", "AGPRs: n",
    # "ScratchSize [bytes/lane]: n", "Occupancy [waves/SIMD]: n", "SGPRs Spill: n",
    # "VGPRs Spill: n", "LDS Size [bytes/block]: n".
    if ! awk -v arch="$arch" -v file="$label" '
      function flush() {
        if (name == "") return
        printf "%-7s %-24s %-36s %5s %5s %5s %8s %6s %6s\n", arch, file, name, sgpr, vgpr, agpr, scratch, lds, waves
        # The per-document (_docs_) attention kernels may keep a few SGPRs in VGPR lanes
        # (v_writelane before the key loop, v_readlane after it: no scratch memory, no work
        # per tile): hipcc 5.2 runs gfx90a out of its 102 SGPRs there, however the bounds are
        # loaded. The context-parallel block kernels (_block_) likewise, with the key buffer,
        # count and shift besides: there a key tile reads a few back (v_readlane, a handful of
        # instructions beside the MFMAs of the tile). Any scratch, any VGPR spill, and an SGPR
        # spill of any other kernel fail.
        if (scratch == 0 && vspill == 0 && sspill > 0 && name ~ /_docs_|_block_/) {
          printf "        %s on %s keeps %s SGPRs in VGPR lanes (no scratch)\n", name, arch, sspill
        } else if (scratch + sspill + vspill > 0) {
          printf "kernels-check: %s uses scratch on %s (%s bytes/lane; %s SGPRs and %s VGPRs spilled): a kernel that spills is a bug\n", name, arch, scratch, sspill, vspill > "/dev/stderr"
          bad = 1
        }
      }
      function value() { v = $0; sub(/ \[-Rpass-analysis.*/, "", v); sub(/.*: /, "", v); return v }
      /remark: Function Name:/ { flush(); name = value(); sgpr = vgpr = agpr = scratch = lds = sspill = vspill = 0; waves = "-" }
      /remark: +SGPRs:/ { sgpr = value() }
      /remark: +VGPRs:/ { vgpr = value() }
      /remark: +AGPRs:/ { agpr = value() }
      /remark: +ScratchSize/ { scratch = value() }
      /remark: +Occupancy/ { waves = value() }
      /remark: +SGPRs Spill:/ { sspill = value() }
      /remark: +VGPRs Spill:/ { vspill = value() }
      /remark: +LDS Size/ { lds = value() }
      END { flush(); if (name == "") { printf "kernels-check: no kernel resource report for %s on %s\n", file, arch > "/dev/stderr"; bad = 1 } exit bad }' <<<"$log"; then
      status=1
    fi
    # e_ident[EI_ABIVERSION] 2 is code object v4, what the ROCm 5.x runtime loads.
    abi=$(od -An -tu1 -j8 -N1 "$co" | tr -d ' ')
    if [ "$abi" != 2 ]; then
      echo "kernels-check: $label for $arch is not code object v4 (ELF ABI version $abi)" >&2
      status=1
    fi
    case $file in
      gemm_*|attention_*)
        ops=$("$OBJDUMP" -d --mcpu="$arch" "$co" | { grep -oE 'v_mfma_[a-z0-9_]+' || true; } | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')
        if [ -z "$ops" ]; then
          echo "kernels-check: no v_mfma in the disassembly of $label for $arch (the matrix cores are not used)" >&2
          status=1
        elif ! grep -qE "${MODULE_MFMA[$module]} " <<<"$ops" || grep -qE "${MODULE_MFMA[$other]} " <<<"$ops"; then
          echo "kernels-check: the $module module's MFMA is not its own in $label for $arch: $ops" >&2
          status=1
        else
          echo "        $label on $arch: $ops"
        fi ;;
    esac
  done
  done
done
if [ $status = 0 ]; then echo "kernels-check: all HIP kernels compile for gfx90a and gfx942 (code object v4), bf16 and fp16 modules, no scratch, each module's own MFMA in the GEMM and attention code"; fi
exit $status
