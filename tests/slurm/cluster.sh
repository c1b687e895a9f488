#!/bin/bash
# A throw-away Slurm cluster on this host for `make slurm-test` (run as root; Debian's slurm-wlm
# and munge; no systemd needed). Everything it writes lives under DIR, and it stops only the
# daemons it started, by the pids it recorded.
#
#   tests/slurm/cluster.sh start one DIR   one node "localhost": 8 CPUs, 8 fake GPUs
#   tests/slurm/cluster.sh start two DIR   two nodes n1, n2 on 127.0.0.1 (two slurmd): 128 CPUs and
#                                          8 fake GPUs each, Frontier/Perlmutter-style features and
#                                          partitions, so site scripts run unchanged
#   tests/slurm/cluster.sh stop DIR        stops slurmd(s), slurmctld, munged (pids from DIR/pids)
#
# After start, `export SLURM_CONF=DIR/etc/slurm.conf` points sbatch/srun/squeue at the cluster.
# What it cannot check (binding, fabrics, per-host behaviour): docs/design.md, Placing ranks on a node.
set -euo pipefail

usage() { echo "usage: cluster.sh start one|two DIR | cluster.sh stop DIR" >&2; exit 2; }

# stop_pid FILE NAME: kills the pid in FILE if it still is a NAME process, waits for it to end.
stop_pid() {
  local file=$1 name=$2 pid comm
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  if [ "$comm" = "$name" ]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    echo "cluster: stopped $name (pid $pid)"
  elif [ -n "$comm" ]; then
    echo "cluster: pid $pid from $file is now '$comm', not $name: left alone" >&2
  fi
  rm -f "$file"
}

stop() {
  local dir=$1 f
  [ -d "$dir/pids" ] || return 0
  for f in "$dir"/pids/slurmd-*.pid; do stop_pid "$f" slurmd; done
  stop_pid "$dir/pids/slurmctld.pid" slurmctld
  stop_pid "$dir/pids/munged.pid" munged
}

# write_conf LAYOUT DIR: slurm.conf and gres.conf for the layout.
write_conf() {
  local layout=$1 dir=$2 port
  if [ "$layout" = one ]; then port=6817; else port=6917; fi
  cat >"$dir/etc/slurm.conf" <<CONF
# Written by tests/slurm/cluster.sh: a $layout-node test cluster under $dir.
ClusterName=trident$layout
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
# Debian's MPICH works without --mpi=; Open MPI (trident's default build) needs --mpi=pmix.
MpiDefault=pmi2
# No cgroups, no CPU binding: two real cores pose as many (config_overrides), and task/affinity
# cannot lay tasks out on fake CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# One TmpFS per node, so two PMIx servers on one host do not collide.
TmpFS=$dir/tmp/%n
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# sbatch --wait polls every 2 s when MinJobAge is this small (else it backs off to 32 s).
MinJobAge=4
KillWait=10
InactiveLimit=0
MailProg=/bin/true
AllowSpecResourcesUsage=YES
GresTypes=gpu
CONF
  if [ "$layout" = one ]; then
    cat >>"$dir/etc/slurm.conf" <<CONF
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=16000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    printf 'AutoDetect=off\nNodeName=localhost Name=gpu File=%s/dev/fakegpu[0-7]\n' "$dir" >"$dir/etc/gres.conf"
  else
    cat >>"$dir/etc/slurm.conf" <<CONF
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port + 4))-$((port + 5)) CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=16000 Gres=gpu:8 Features=gpu,nvme State=UNKNOWN
PartitionName=batch   Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
PartitionName=debug   Nodes=n[1-2] MaxTime=INFINITE State=UP
PartitionName=regular Nodes=n[1-2] MaxTime=INFINITE State=UP
CONF
    printf 'AutoDetect=off\nNodeName=n[1-2] Name=gpu File=%s/dev/fakegpu[0-7]\n' "$dir" >"$dir/etc/gres.conf"
  fi
}

start() {
  local layout=$1 dir=$2 nodes n i state=""
  [ "$(id -u)" = 0 ] || { echo "cluster: must run as root (mknod, SlurmUser=root)" >&2; exit 2; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  mkdir -p "$dir"/{etc,run,log,dev,munge,pids,spool/ctld}
  write_conf "$layout" "$dir"
  if [ "$layout" = one ]; then nodes=localhost; else nodes="n1 n2"; fi
  for n in $nodes; do mkdir -p "$dir/spool/$n" "$dir/tmp/$n"; done
  # Fake GPUs must be character devices (slurmd rejects plain files): clones of /dev/null.
  for i in 0 1 2 3 4 5 6 7; do [ -c "$dir/dev/fakegpu$i" ] || mknod "$dir/dev/fakegpu$i" c 1 3; done
  export SLURM_CONF=$dir/etc/slurm.conf
  # A private munged with its own key and socket, so the system's munge is not needed or touched.
  [ -f "$dir/munge/key" ] || { dd if=/dev/urandom of="$dir/munge/key" bs=1024 count=1 status=none; chmod 600 "$dir/munge/key"; }
  setsid munged --foreground --force --socket="$dir/munge/socket" --key-file="$dir/munge/key" \
    --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed" >"$dir/log/munged.out" 2>&1 </dev/null &
  echo $! >"$dir/pids/munged.pid"
  for _ in $(seq 50); do [ -S "$dir/munge/socket" ] && break; sleep 0.1; done
  [ -S "$dir/munge/socket" ] || { echo "cluster: munged did not start: $dir/log/munged.out" >&2; stop "$dir"; exit 1; }
  setsid slurmctld -D -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 </dev/null &
  echo $! >"$dir/pids/slurmctld.pid"
  for n in $nodes; do
    setsid slurmd -D -N "$n" -f "$SLURM_CONF" >"$dir/log/slurmd-$n.out" 2>&1 </dev/null &
    echo $! >"$dir/pids/slurmd-$n.pid"
  done
  for _ in $(seq 300); do
    state=$(sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$state" = "idle " ] && break
    sleep 0.1
  done
  if [ "$state" != "idle " ]; then
    echo "cluster: nodes not idle ($state); logs in $dir/log" >&2
    stop "$dir"
    exit 1
  fi
  echo "cluster: $layout-node cluster up (munged $(cat "$dir/pids/munged.pid"), slurmctld $(cat "$dir/pids/slurmctld.pid"), slurmd $(cat "$dir"/pids/slurmd-*.pid | tr '\n' ' '))"
}

case "${1:-}" in
  start)
    if [ $# -ne 3 ] || { [ "$2" != one ] && [ "$2" != two ]; }; then usage; fi
    start "$2" "$3"
    ;;
  stop) [ $# -eq 2 ] || usage; stop "$2" ;;
  *) usage ;;
esac
