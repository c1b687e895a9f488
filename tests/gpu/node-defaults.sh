# Sourced by gpu-bench.sh, first-light.sh and plan-calibrate.sh (with `root` set to the checkout): the binary and
# PyTorch's Python they run on a GPU node.
#   bin: TRIDENT_BIN, else target-nompi/release/trident (`make NO_MPI=1 build`: no MPI library
#        needed on the node), else target/release/trident;
#   py:  TORCH_PYTHON, else /opt/torch/.venv/bin/python where there, else python3.
# shellcheck shell=bash disable=SC2034  # both are read by the scripts that source this
if [ -n "${TRIDENT_BIN:-}" ]; then
  bin=$TRIDENT_BIN
elif [ -x "${root:?}/target-nompi/release/trident" ]; then
  bin=$root/target-nompi/release/trident
else
  bin=$root/target/release/trident
fi
if [ -n "${TORCH_PYTHON:-}" ]; then
  py=$TORCH_PYTHON
elif [ -x /opt/torch/.venv/bin/python ]; then
  py=/opt/torch/.venv/bin/python
else
  py=python3
fi

# find_lib WHO VAR PATTERN...: when VAR is unset and trident's loader would find nothing, the first
# file matching a PATTERN under the site-packages of PyTorch's Python or the usual pip places.
find_lib() {
  local who=$1 var=$2 dirs=() d f
  shift 2
  [ -z "${!var:-}" ] || return 0
  mapfile -t dirs < <("$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  dirs+=(/opt/torch/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages)
  for d in "${dirs[@]}"; do
    for pattern in "$@"; do
      for f in "$d"/$pattern; do
        if [ -f "$f" ]; then
          export "$var=$f"
          echo "$who: $var=$f (found in $d)"
          return 0
        fi
      done
    done
  done
}

# gpu_libraries WHO: checks that the binary runs, then sets TRIDENT_NVRTC and TRIDENT_NCCL where
# trident's loader would find neither library (PyTorch's pip wheels carry both); WHO prefixes what
# it says. Returns 1 when the binary does not run.
gpu_libraries() {
  local who=$1 found
  if ! found=$("$bin" info 2>/dev/null); then
    echo "$who: $bin does not run here; build it with 'make NO_MPI=1 build' or set TRIDENT_BIN" >&2
    return 1
  fi
  if ! grep -q '^nvrtc: [0-9]' <<<"$found"; then
    find_lib "$who" TRIDENT_NVRTC 'nvidia/cu13/lib/libnvrtc.so.13' 'nvidia/*/lib/libnvrtc.so.13' 'nvidia/cuda_nvrtc/lib/libnvrtc.so.12'
  fi
  if ! grep -q '^nccl: [0-9]' <<<"$found"; then
    find_lib "$who" TRIDENT_NCCL 'nvidia/nccl/lib/libnccl.so.2' 'nvidia/*/lib/libnccl.so.2'
  fi
}
