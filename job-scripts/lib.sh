# shellcheck shell=bash
# job-scripts/lib.sh: what every trident job script shares, sourced by frontier.sbatch,
# perlmutter.sbatch, dgx.sbatch, polaris.pbs and local.sh. It sets the common knobs' defaults,
# lays out the run directory, resumes from its last checkpoint, checks the TP x PP x DP layout,
# prints the launch line (and stops there under DRY_RUN=1), runs it, forwards the scheduler's
# signals to it, and turns "trident stopped to be requeued" into a requeue.
#
# The contract with the binary (see docs/clusters.md):
#   trident train --exit-signal-handler   SIGUSR1 or SIGTERM: finish the iteration, checkpoint, exit
#   exit code 75                          stopped early after a checkpoint: requeue me
#   <save>/trident_stopped_for_requeue.txt  the same, written by rank 0 (srun --kill-on-bad-exit
#                                         can turn 75 into 143 when ranks exit a moment apart)
#   exit code 0                           finished; anything else: failed
#
# Run directory ($RUN_DIR):
#   checkpoints/   --save and --load (Megatron's iter_NNNNNNN/ and latest_checkpointed_iteration.txt)
#   logs/          <site>-<job id>.<restart>.log (the launch's whole output) and metrics.jsonl
#   launches.txt   one line per launch: date, job id, restart count, the launch line

TJ_REQUEUE_CODE=75
TJ_MARKER=trident_stopped_for_requeue.txt
TJ_ENV=()

tj_say() { printf 'trident-job: %s\n' "$*"; }
tj_die() {
  printf 'trident-job: error: %s\n' "$*" >&2
  exit 1
}

# tj_export NAME VALUE: exports a site variable and remembers it for the dry run's listing.
tj_export() {
  export "$1=$2"
  TJ_ENV+=("$1=$2")
}

# tj_directive SCRIPT PATTERN: the first number after PATTERN in the script's own directives
# (used outside a job, for a dry run, where the scheduler's variables are not set).
tj_directive() {
  sed -n "s/^$2\([0-9][0-9]*\).*/\1/p" "$1" | head -n 1
}

# tj_setup SITE: the knobs every script shares (the site script sets its own defaults first).
tj_setup() {
  TJ_SITE=$1
  TJ_SUBMIT_DIR=${SLURM_SUBMIT_DIR:-${PBS_O_WORKDIR:-$PWD}}
  TJ_JOB_ID=${SLURM_JOB_ID:-${PBS_JOBID:-local-$$}}
  TJ_RESTART=${SLURM_RESTART_COUNT:-0}
  TRIDENT=${TRIDENT:-$TJ_SUBMIT_DIR/target/release/trident}
  RUN_NAME=${RUN_NAME:-${SLURM_JOB_NAME:-${PBS_JOBNAME:-trident}}}
  RUN_DIR=${RUN_DIR:-$TJ_SUBMIT_DIR/runs/$RUN_NAME}
  DATA_PATH=${DATA_PATH:-$TJ_SUBMIT_DIR/runs/data/shakespeare_text_document}
  PRESET=${PRESET:-gpt2-124m}
  TP=${TP:-1}
  PP=${PP:-1}
  DEVICE=${DEVICE:-cpu}
  SAVE_INTERVAL=${SAVE_INTERVAL:-500}
  EXIT_DURATION_MINS=${EXIT_DURATION_MINS:-}
  REQUEUE=${REQUEUE:-1}
  DRY_RUN=${DRY_RUN:-0}
  TRAIN_ARGS=${TRAIN_ARGS:-}
  TJ_CKPT=$RUN_DIR/checkpoints
  case "$DEVICE" in
    cpu | cuda | hip) ;;
    *) tj_die "DEVICE=$DEVICE: expected cpu, cuda or hip" ;;
  esac
  if [ "$DEVICE" != cpu ]; then
    tj_say "DEVICE=$DEVICE: the GPU Device trains in bf16 (--bf16 is added; GEMM and attention operands" \
      "in bf16, f32 accumulation; head dim 64 or 128); DEVICE=cpu trains on the nodes' CPUs"
  fi
  if [ "$DEVICE" = cuda ]; then
    tj_say "DEVICE=cuda: tensors move through NCCL on device memory (set TRIDENT_NCCL if libnccl.so.2 is not" \
      "on the library path, or add --gpu-collectives mpi to TRAIN_ARGS to stage them through host memory)"
  elif [ "$DEVICE" = hip ]; then
    tj_say "DEVICE=hip: tensors move through RCCL on device memory (set TRIDENT_RCCL if librccl.so is not" \
      "on the library path, or add --gpu-collectives mpi to TRAIN_ARGS to stage them through host memory)"
  fi
}

# tj_layout RANKS: checks that RANKS split into TP x PP x DP before any rank starts.
tj_layout() {
  local ranks=$1 mp
  for v in TP PP; do
    case "${!v}" in
      '' | *[!0-9]* | 0) tj_die "$v=${!v}: expected a positive whole number" ;;
    esac
  done
  mp=$((TP * PP))
  if [ "$ranks" -lt 1 ] || [ $((ranks % mp)) -ne 0 ]; then
    tj_die "$ranks ranks do not split into TP=$TP x PP=$PP x DP (TP x PP = $mp must divide the rank count)"
  fi
  # shellcheck disable=SC2034 # TJ_RANKS is the site scripts' rank count for their launch line.
  TJ_RANKS=$ranks
  TJ_DP=$((ranks / mp))
  tj_say "layout: $ranks ranks = TP $TP x PP $PP x DP $TJ_DP; preset $PRESET; device $DEVICE; run directory $RUN_DIR"
}

# The iteration of the last complete checkpoint, or 0.
tj_latest() {
  local f=$TJ_CKPT/latest_checkpointed_iteration.txt
  if [ -f "$f" ]; then tr -d '[:space:]' <"$f"; else echo 0; fi
}

# Fills TJ_ARGS with `trident train`'s flags: resume from the run directory when it holds a
# checkpoint, stop on the scheduler's signal with a checkpoint.
tj_train_args() {
  local -a extra=()
  TJ_ARGS=(train --preset "$PRESET" --data-path "$DATA_PATH"
    --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
    --device "$DEVICE" --save "$TJ_CKPT" --save-interval "$SAVE_INTERVAL"
    --log-json "$RUN_DIR/logs/metrics.jsonl" --exit-signal-handler)
  if [ "$DEVICE" != cpu ] && [[ " $TRAIN_ARGS " != *" --bf16 "* ]]; then
    TJ_ARGS+=(--bf16)  # the GPU Devices multiply bf16 operands
  fi
  if [ -n "$EXIT_DURATION_MINS" ]; then
    TJ_ARGS+=(--exit-duration-in-mins "$EXIT_DURATION_MINS")
  fi
  if [ "$(tj_latest)" != 0 ]; then
    TJ_ARGS+=(--load "$TJ_CKPT")
    tj_say "resuming from the checkpoint of iteration $(tj_latest) in $TJ_CKPT"
  fi
  # TRAIN_ARGS is split at white space (no quoting inside it).
  read -r -a extra <<<"$TRAIN_ARGS"
  TJ_ARGS+=("${extra[@]}")
}

# Forwards a signal the scheduler sent to this shell to the launcher (srun, mpiexec, mpirun),
# which passes it on to every rank.
tj_forward() {
  TJ_SIGNAL=$1
  TJ_INTERRUPTED=1
  tj_say "received SIG$1; forwarding it to the launcher (pid $TJ_PID): the ranks finish the iteration and checkpoint"
  kill -s "$1" "$TJ_PID" 2>/dev/null || true
}

# tj_launch LAUNCHER...: runs LAUNCHER... $TRIDENT $TJ_ARGS (or prints it under DRY_RUN=1), then
# decides: finished, stopped to be requeued (tj_requeue, defined by the site script), or failed.
tj_launch() {
  local -a cmd=("$@" "$TRIDENT" "${TJ_ARGS[@]}")
  local line before after rc log
  line=$(printf '%q ' "${cmd[@]}")
  line=${line% }
  if [ "$DRY_RUN" = 1 ]; then
    [ ${#TJ_ENV[@]} -eq 0 ] || printf 'env: %s\n' "${TJ_ENV[*]}"
    printf 'launch: %s\n' "$line"
    exit 0
  fi
  [ -x "$TRIDENT" ] || tj_die "TRIDENT=$TRIDENT is not an executable: build it (make build) or set TRIDENT"
  [ -f "$DATA_PATH.idx" ] || tj_die "DATA_PATH=$DATA_PATH: no $DATA_PATH.idx (run trident prepare, or make train once)"
  mkdir -p "$RUN_DIR/logs" "$TJ_CKPT" || tj_die "cannot create the run directory $RUN_DIR"
  log=$RUN_DIR/logs/$TJ_SITE-$TJ_JOB_ID.$TJ_RESTART.log
  printf '%s job %s restart %s: %s\n' "$(date '+%F %T')" "$TJ_JOB_ID" "$TJ_RESTART" "$line" >>"$RUN_DIR/launches.txt"
  tj_say "log: $log"
  printf 'launch: %s\n' "$line" | tee -a "$log"
  rm -f "$TJ_CKPT/$TJ_MARKER"
  before=$(tj_latest)
  TJ_SIGNAL=
  trap 'tj_forward USR1' USR1
  trap 'tj_forward TERM' TERM
  "${cmd[@]}" > >(tee -a "$log") 2>&1 &
  TJ_PID=$!
  # A trapped signal interrupts `wait`; wait again until the launcher itself has ended.
  while :; do
    TJ_INTERRUPTED=0
    rc=0
    wait "$TJ_PID" || rc=$?
    [ "$TJ_INTERRUPTED" = 1 ] || break
  done
  trap - USR1 TERM
  after=$(tj_latest)
  if [ "$rc" = 0 ]; then
    # srun can end 0 when the step never started (a launch failure on the node): trident's banner
    # is the proof that the ranks ran.
    grep -q '^ trident ' "$log" || tj_die "the launcher exited 0 but trident never started; see $log"
    tj_say "finished: training complete (last checkpoint: iteration $after)"
    exit 0
  fi
  if [ "$rc" != "$TJ_REQUEUE_CODE" ] && [ ! -f "$TJ_CKPT/$TJ_MARKER" ]; then
    tj_die "the launch failed with exit code $rc; see $log"
  fi
  tj_say "stopped early with a checkpoint at iteration $after (exit code $rc): $(sed -n 's/^reason //p' "$TJ_CKPT/$TJ_MARKER" 2>/dev/null)"
  if [ "$after" = "$before" ]; then
    tj_die "no new checkpoint since the launch (iteration $before): not requeueing, to avoid a loop"
  fi
  if [ "$TJ_SIGNAL" = TERM ]; then
    tj_say "SIGTERM came from a cancellation, the time limit or a preemption: not requeueing; submit again to continue"
    exit "$TJ_REQUEUE_CODE"
  fi
  if [ "$REQUEUE" != 1 ]; then
    tj_say "REQUEUE=$REQUEUE: not requeueing; run again to continue from iteration $after"
    exit "$TJ_REQUEUE_CODE"
  fi
  tj_requeue
}

# Slurm: requeue this job (it keeps its id; the next start resumes from the run directory).
# `scontrol requeue` ends this script at once, so it is the last thing done.
tj_requeue_slurm() {
  tj_say "requeueing job $SLURM_JOB_ID (restart $((TJ_RESTART + 1))); it resumes from $TJ_CKPT"
  scontrol requeue "$SLURM_JOB_ID" || tj_die "scontrol requeue $SLURM_JOB_ID failed: submit again to continue"
  exit 0
}
