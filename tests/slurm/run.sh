#!/bin/bash
# `make slurm-test`: the job scripts, run for real on Slurm clusters started on this host.
#
#   1. bash -n and shellcheck on every script; the dry-run launch lines (cargo test --test job_scripts)
#   2. one node (8 fake GPUs): dgx.sbatch on the CPUs, 4 ranks TP=2 x PP=2, through sbatch --wait;
#      the loss, the finished line and each rank's placement are checked
#   3. the same job stopped by the wall-time signal (SIGUSR1 to the batch shell, as
#      --signal=B:USR1 sends it): checkpoint, exit 75, scontrol requeue, resume with --load;
#      its losses equal step 2's bit for bit
#   4. two fake nodes: frontier.sbatch (2 ranks per node) and polaris.pbs through the PBS
#      compatibility shim, each rank's GPU checked from its placement line
#
# Needs root, Debian's slurm-wlm and munge, shellcheck, Open MPI (the Makefile installs them), and a
# built target/release/trident. Stops only the daemons it started, by pid, also on failure.
# WORK=dir keeps the clusters, jobs and logs there (default: a fresh temporary directory).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
T0=$(date +%s)
KEEP_WORK=${WORK:+1}
WORK=${WORK:-$(mktemp -d -t trident-slurm-test.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
BIN=$ROOT/target/release/trident
CLUSTER=$ROOT/tests/slurm/cluster.sh
CLUSTERS=()

step() { printf '[slurm-test +%3ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() {
  printf '[slurm-test] FAILED: %s\n' "$*" >&2
  exit 1
}
cleanup() {
  local rc=$? c
  for c in "${CLUSTERS[@]}"; do
    # Jobs first: their steps are not children of the daemons.
    SLURM_CONF=$c/etc/slurm.conf scancel --full --quiet --user=root 2>/dev/null || true
    "$CLUSTER" stop "$c" || true
  done
  if [ "$rc" != 0 ]; then
    echo "[slurm-test] logs and job output are in $WORK" >&2
  elif [ -z "$KEEP_WORK" ]; then
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "needs root (the test cluster's slurmd runs as root and makes fake GPU devices)"
for tool in sbatch srun scontrol slurmctld slurmd munged shellcheck mpirun; do
  command -v "$tool" >/dev/null || fail "$tool is missing: make slurm-test installs slurm-wlm, munge and shellcheck with apt"
done
[ -x "$BIN" ] || fail "$BIN is missing: make build"

step "1/4 bash -n and shellcheck on job-scripts/ and tests/slurm/"
SCRIPTS=(job-scripts/lib.sh job-scripts/frontier.sbatch job-scripts/perlmutter.sbatch job-scripts/dgx.sbatch
  job-scripts/polaris.pbs job-scripts/local.sh tests/slurm/run.sh tests/slurm/cluster.sh tests/slurm/pbs-compat.sh)
for s in "${SCRIPTS[@]}"; do bash -n "$s" || fail "bash -n $s"; done
shellcheck -x "${SCRIPTS[@]}" || fail "shellcheck"
step "    ${#SCRIPTS[@]} scripts clean; dry-run launch lines:"
cargo test --release --quiet --test job_scripts 2>&1 | grep -E "test result|FAILED|panicked" || fail "the dry-run tests"

step "    preparing the bundled corpus"
mkdir -p "$WORK/data"
"$BIN" prepare --input data/tinyshakespeare.txt --output-prefix "$WORK/data/shakespeare" --append-eod >/dev/null
export DATA_PATH=$WORK/data/shakespeare_text_document TRIDENT=$BIN TRIDENT_JOB_SCRIPTS=$ROOT/job-scripts

# submit NAME SBATCH-ARGS... SCRIPT: sbatch --test-only, then sbatch --wait under a timeout; the
# job's output goes to $WORK/NAME.out. Returns sbatch's exit code (the job's).
submit() {
  local name=$1
  shift
  sbatch --test-only "$@" >"$WORK/$name.test-only" 2>&1 || {
    cat "$WORK/$name.test-only" >&2
    fail "$name: sbatch --test-only refused the job"
  }
  local rc=0
  timeout 300 sbatch --wait --parsable --output="$WORK/$name.out" "$@" >"$WORK/$name.id" || rc=$?
  [ "$rc" != 124 ] || fail "$name: no result within 300 s"
  return "$rc"
}

# The "iteration N | loss" pairs of a metrics.jsonl, one per line, for comparing runs bit for bit.
losses() { sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,}]*\).*/\1 \2/p' "$1"; }

# check_placements OUT RANKS RANKS_PER_NODE: every rank printed one placement line, local ranks
# count 0..RANKS_PER_NODE-1 on each node, and each rank took the device the rules give it:
# the only visible one, else TRIDENT_GPU_ORDER[local mod len] when set, else local mod n.
check_placements() {
  local out=$1 ranks=$2 per_node=$3 order=${4:-} n=0 line rank local_ node visible ids count gpu physical want
  local -a list ord
  while IFS= read -r line; do
    rank=$(sed -n 's/.*placement: rank \([0-9]*\)\/.*/\1/p' <<<"$line")
    local_=$(sed -n 's/.* local \([0-9]*\)\/.*/\1/p' <<<"$line")
    node=$(sed -n 's/.* node \([^ ]*\) .*/\1/p' <<<"$line")
    visible=$(sed -n 's/.* | visible \([^|]*\) | .*/\1/p' <<<"$line")
    gpu=$(sed -n 's/.* | gpu \([0-9]*\) (physical \([^;]*\);.*/\1/p' <<<"$line")
    physical=$(sed -n 's/.* | gpu \([0-9]*\) (physical \([^;]*\);.*/\2/p' <<<"$line")
    [ "$local_" = $((rank % per_node)) ] || fail "rank $rank: local rank $local_, expected $((rank % per_node)): $line"
    if [ "$per_node" -lt "$ranks" ]; then
      want=n$((rank / per_node + 1))
      [ "$node" = "$want" ] || fail "rank $rank: on node '$node', expected $want: $line"
    fi
    if [[ $visible == all* ]]; then
      ids=""
      count=0
    else
      ids=$(sed -n 's/^[A-Z_]*=\([0-9,]*\) (\([0-9]*\))$/\1/p' <<<"$visible")
      count=$(sed -n 's/^[A-Z_]*=\([0-9,]*\) (\([0-9]*\))$/\2/p' <<<"$visible")
      [ -n "$ids" ] || fail "rank $rank: cannot read the visible devices '$visible'"
    fi
    IFS=, read -r -a list <<<"$ids"
    if [ "$count" = 1 ]; then
      want=0
    elif [ -n "$order" ]; then
      IFS=, read -r -a ord <<<"$order"
      want=${ord[$((local_ % ${#ord[@]}))]}
    elif [ "$count" -gt 1 ]; then
      want=$((local_ % count))
    else
      want=$local_
    fi
    [ "$gpu" = "$want" ] || fail "rank $rank: took gpu '$gpu', expected $want: $line"
    if [ -n "$ids" ]; then
      [ "$physical" = "${list[$want]}" ] || fail "rank $rank: physical '$physical', expected ${list[$want]}: $line"
    fi
    printf '      rank %s: node %s local %s visible %-28s -> gpu %s (physical %s)\n' \
      "$rank" "${node:-localhost}" "$local_" "$visible" "$gpu" "$physical"
    n=$((n + 1))
  done < <(grep -o 'placement: rank .*' "$out" | sort -k3,3n)
  [ "$n" = "$ranks" ] || fail "$n placement lines in $out, expected $ranks"
}

# check_finished OUT ITERS: the job trained to ITERS, said so, and the loss fell below 4 nats
# (it starts near ln 257 = 5.5 on the byte vocabulary).
check_finished() {
  local out=$1 iters=$2 loss
  grep -q "trident-job: finished: training complete" "$out" || fail "no 'finished' line in $out"
  loss=$(grep -E "iteration +$iters/ +$iters \|" "$out" | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p' | tail -n 1)
  [ -n "$loss" ] || fail "no loss line for iteration $iters in $out"
  awk -v l="$loss" 'BEGIN { exit !(l + 0 < 4.0) }' || fail "loss $loss at iteration $iters is not below 4.0"
  step "    iteration $iters: lm loss $loss"
}

ITERS=30
export DEVICE=cpu PRESET=tiny TP=2 PP=2 SRUN_MPI=pmix SAVE_INTERVAL=1000
export TRAIN_ARGS="--train-iters $ITERS --log-interval 1 --eval-interval 15 --eval-iters 2"

step "2/4 one-node cluster: dgx.sbatch, 4 ranks TP=2 x PP=2 on the CPUs"
"$CLUSTER" start one "$WORK/one"
CLUSTERS+=("$WORK/one")
export SLURM_CONF=$WORK/one/etc/slurm.conf
t=$(date +%s)
# --time=30: the scripts ask for SIGUSR1 600 s before the limit (--signal=B:USR1@600), so a shorter
# limit would signal a job that runs long on a loaded machine (a 10-minute one at once, and the
# job would checkpoint and requeue instead of finishing); step 3 sends the signal itself.
submit dgx -N 1 --ntasks-per-node=4 --gpus-per-node=4 --time=30 \
  --export=ALL,RUN_DIR="$WORK/dgx" job-scripts/dgx.sbatch || fail "dgx.sbatch: exit code $? (see $WORK/dgx.out)"
step "    job $(cat "$WORK/dgx.id") done in $(($(date +%s) - t)) s (sbatch --wait rc 0)"
check_finished "$WORK/dgx.out" "$ITERS"
check_placements "$WORK/dgx.out" 4 4

step "3/4 the same job stopped by the wall-time signal, requeued and resumed"
t=$(date +%s)
rc=0
timeout 300 sbatch --wait --parsable --output="$WORK/requeue.out" -N 1 --ntasks-per-node=4 --gpus-per-node=4 \
  --time=30 --export=ALL,RUN_DIR="$WORK/requeue" job-scripts/dgx.sbatch >"$WORK/requeue.id" &
waiter=$!
for _ in $(seq 300); do [ -s "$WORK/requeue.id" ] && break; sleep 0.1; done
job=$(cat "$WORK/requeue.id")
for _ in $(seq 600); do
  [ "$(losses "$WORK/requeue/logs/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 0.1
done
# What `#SBATCH --signal=B:USR1@600` does ahead of the time limit: SIGUSR1 to the batch shell only.
scancel --batch --signal=USR1 "$job"
step "    job $job: SIGUSR1 sent to the batch shell after iteration $(losses "$WORK/requeue/logs/metrics.jsonl" | wc -l)"
# Slurm holds a requeued job for about two minutes (BeginTime); release it sooner. Not at once:
# slurmd refuses a credential issued in the same second as the requeue revoked the old one.
for _ in $(seq 600); do
  if squeue -h -j "$job" -o '%T %r' 2>/dev/null | grep -q 'PENDING BeginTime'; then
    # The node must have cleaned up the old step first, or the new step's launch can fail.
    for _ in $(seq 100); do
      [ "$(sinfo -h -o %T 2>/dev/null | tr -d '*' | sort -u)" = idle ] && break
      sleep 0.1
    done
    sleep 3
    scontrol update JobId="$job" StartTime=now
    step "    job $job requeued; released from its BeginTime hold"
    break
  fi
  kill -0 "$waiter" 2>/dev/null || break
  sleep 0.1
done
wait "$waiter" || rc=$?
[ "$rc" = 0 ] || fail "the requeued job ended with $rc (see $WORK/requeue.out)"
step "    job $job done in $(($(date +%s) - t)) s, one requeue"
# srun forwards the signal to every rank; rank 0 names it, or (when another rank's handler ran
# before its own by the iteration's agreement) says that another rank stopped the run.
grep -Eq "exiting program at iteration .*(SIGUSR1 received|a stop signal reached another rank)" "$WORK/requeue.out" ||
  fail "no stop line in $WORK/requeue.out"
grep -q "trident-job: requeueing job $job" "$WORK/requeue.out" || fail "the script did not requeue"
grep -q -- "--load $WORK/requeue/checkpoints" "$WORK/requeue.out" || fail "the restart did not resume with --load"
stopped=$(grep -o "exiting program at iteration [0-9]*" "$WORK/requeue.out" | grep -o '[0-9]*$')
check_finished "$WORK/requeue.out" "$ITERS"
for r in 0 1; do
  [ -f "$WORK/requeue/logs/dgx-$job.$r.log" ] || fail "no log of restart $r in $WORK/requeue/logs"
done
losses "$WORK/dgx/logs/metrics.jsonl" >"$WORK/losses.straight"
losses "$WORK/requeue/logs/metrics.jsonl" >"$WORK/losses.requeued"
[ "$(wc -l <"$WORK/losses.straight")" = "$ITERS" ] || fail "the straight run logged $(wc -l <"$WORK/losses.straight") iterations"
diff "$WORK/losses.straight" "$WORK/losses.requeued" >/dev/null || fail "the requeued run's losses differ (diff $WORK/losses.straight $WORK/losses.requeued)"
step "    stopped at iteration $stopped, resumed, $ITERS losses equal to the uninterrupted run's bit for bit"
"$CLUSTER" stop "$WORK/one"
CLUSTERS=()

step "4/4 two fake nodes: frontier.sbatch, 2 nodes x 2 ranks TP=2 x PP=2"
"$CLUSTER" start two "$WORK/two"
CLUSTERS+=("$WORK/two")
export SLURM_CONF=$WORK/two/etc/slurm.conf
# Open MPI across two "nodes" that are one host: its shared-memory transport would mix them up,
# and TCP over the host's own external address has failed to connect under load (EINPROGRESS,
# then a crashed rank); loopback reaches every "node".
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_btl_tcp_if_include=lo
ITERS=20
export TRAIN_ARGS="--train-iters $ITERS --log-interval 5 --eval-iters 0"
t=$(date +%s)
RANKS_PER_NODE=2 submit frontier --time=30 --export=ALL,RUN_DIR="$WORK/frontier" job-scripts/frontier.sbatch ||
  fail "frontier.sbatch: exit code $? (see $WORK/frontier.out)"
step "    job $(cat "$WORK/frontier.id") done in $(($(date +%s) - t)) s"
check_finished "$WORK/frontier.out" "$ITERS"
check_placements "$WORK/frontier.out" 4 2

step "    polaris.pbs through the PBS compatibility shim, 2 nodes x 2 ranks"
t=$(date +%s)
# srun reads the --mpi plugin from SLURM_MPI_TYPE (the shim's mpiexec calls plain srun).
SLURM_MPI_TYPE=pmix NRANKS_PER_NODE=2 submit polaris --exclusive --time=30 \
  --export="ALL,RUN_DIR=$WORK/polaris,BASH_ENV=$ROOT/tests/slurm/pbs-compat.sh" job-scripts/polaris.pbs ||
  fail "polaris.pbs: exit code $? (see $WORK/polaris.out)"
step "    job $(cat "$WORK/polaris.id") done in $(($(date +%s) - t)) s"
grep -q -- "--exit-duration-in-mins 50" "$WORK/polaris.out" || fail "polaris.pbs did not derive --exit-duration-in-mins from its walltime"
check_finished "$WORK/polaris.out" "$ITERS"
check_placements "$WORK/polaris.out" 4 2 3,2,1,0
[ "$(grep -cE "(PALS_LOCAL_RANKID|PMI_LOCAL_RANK)=[0-9]+ agrees" "$WORK/polaris.out")" = 4 ] ||
  fail "not every rank's PALS local rank agrees with the MPI split in $WORK/polaris.out"

step "all passed in $(($(date +%s) - T0)) s"
