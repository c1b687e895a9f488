# Sourced by gpu-bench.sh and first-light.sh (with `root` set to the checkout): the binary and
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
