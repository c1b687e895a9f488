#!/bin/bash
# trident on one workstation or one node, without a scheduler: mpirun / mpiexec starts the ranks.
#
#   job-scripts/local.sh                               (from the trident checkout)
#   DRY_RUN=1 job-scripts/local.sh                     (prints the launch line, runs nothing)
#   NP=4 TP=2 PP=2 PRESET=tiny job-scripts/local.sh
#
# Knobs (environment variables):
#   NP=2                ranks
#   PRESET=tiny         model and recipe (trident train --preset); TRAIN_ARGS adds or overrides flags
#   TP=2 PP=1           tensor- and pipeline-parallel sizes; DP = NP / (TP x PP)
#   MPIEXEC=mpirun      the launcher of the MPI trident was built with (mpirun.openmpi, mpiexec.mpich)
#   DATA_PATH=...       dataset prefix (default runs/data/shakespeare_text_document, from make train)
#   RUN_DIR=runs/local  checkpoints/, logs/, launches.txt; a run directory with a checkpoint resumes
#   TRIDENT=target/release/trident   the binary
#   DEVICE=cpu          cpu, or cuda / hip (both train with --bf16, added by lib.sh)
#   SAVE_INTERVAL=500   checkpoint every N iterations (and on the stop signal, and at the end)
#   EXIT_DURATION_MINS= optional: stop with a checkpoint after N minutes
#   TRAIN_ARGS=         more `trident train` flags, split at spaces
#   DRY_RUN=1           print the launch line, do nothing
#
# Pausing: `kill -USR1 <pid of this script>` makes every rank finish its iteration and checkpoint;
# the script exits 75, and running it again continues from the checkpoint.
set -euo pipefail

for d in "${TRIDENT_JOB_SCRIPTS:-}" "$(dirname "$0")" "$PWD/job-scripts"; do
  if [ -n "$d" ] && [ -f "$d/lib.sh" ]; then TRIDENT_JOB_SCRIPTS=$d; break; fi
done
[ -f "${TRIDENT_JOB_SCRIPTS:-}/lib.sh" ] || { echo "cannot find job-scripts/lib.sh: set TRIDENT_JOB_SCRIPTS" >&2; exit 1; }
# shellcheck source=job-scripts/lib.sh
. "$TRIDENT_JOB_SCRIPTS/lib.sh"

PRESET=${PRESET:-tiny} TP=${TP:-2} PP=${PP:-1} DEVICE=${DEVICE:-cpu} RUN_NAME=${RUN_NAME:-local}
REQUEUE=0
tj_setup local
NP=${NP:-2}
MPIEXEC=${MPIEXEC:-mpirun}

launcher=("$MPIEXEC" -np "$NP")
# Open MPI binds a rank to one core and refuses root and more ranks than cores unless told.
if "$MPIEXEC" --version 2>/dev/null | grep -q "Open MPI"; then
  launcher+=(--bind-to none)
  [ "$NP" -le "$(nproc)" ] || launcher+=(--oversubscribe)
  [ "$(id -u)" != 0 ] || launcher+=(--allow-run-as-root)
fi

tj_layout "$NP"
tj_train_args
tj_requeue() { :; }
tj_launch "${launcher[@]}"
