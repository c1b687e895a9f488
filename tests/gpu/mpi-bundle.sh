#!/usr/bin/env bash
# Debian's Open MPI, unpacked into a folder that can travel to a node without MPI (a lent GPU
# machine), where `tests/gpu/layouts.sh` uses it through MPI_BUNDLE=DIR. Run on the build
# machine (Debian 12 or its derivatives; apt reaches the network): `apt-get download` fetches the
# runtime's packages, as the build machine's apt sees them, and `dpkg -x` unpacks each under DIR
# (DIR/usr/bin/mpirun.openmpi, DIR/usr/lib/x86_64-linux-gnu/...). Nothing is installed.
# The binary that runs with it must be built against the same Open MPI (`make build` on this
# machine: target/release/trident), and the node needs a C library at least as new as this one.
# Usage: mpi-bundle.sh DIR. Exit status: 0 when every package was fetched and unpacked.
set -euo pipefail

dir=${1:?usage: mpi-bundle.sh DIR}
# Open MPI's programs and library, PMIx, and the libraries they load that a base system lacks
# (hwloc, libevent, the fabric and verbs libraries Open MPI links against).
packages=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libnuma1
  libpsm2-2 libpsm-infinipath1 libmunge2)
mkdir -p "$dir/debs"
dir=$(cd "$dir" && pwd)
(cd "$dir/debs" && apt-get download "${packages[@]}") || {
  echo "mpi-bundle: apt-get download failed (it needs Debian's package lists: apt-get update)" >&2
  exit 1
}
for deb in "$dir"/debs/*.deb; do
  dpkg -x "$deb" "$dir"
done
rm -rf "$dir/debs" "$dir/usr/share/doc" "$dir/usr/share/man"
if [ ! -x "$dir/usr/bin/mpirun.openmpi" ]; then
  echo "mpi-bundle: no usr/bin/mpirun.openmpi under $dir after unpacking" >&2
  exit 1
fi
echo "mpi-bundle: Open MPI $("$dir/usr/bin/mpirun.openmpi" --version 2>/dev/null | head -n 1 | awk '{print $NF}') in $dir ($(du -sh "$dir" | cut -f1)); use it with MPI_BUNDLE=$dir"
