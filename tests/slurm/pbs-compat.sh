# shellcheck shell=bash
# PBS Pro / Cray PALS compatibility for running job-scripts/polaris.pbs on the test Slurm cluster:
# sbatch reads the script's #PBS directives itself; this file (loaded through BASH_ENV, an absolute
# path) supplies what PBS and PALS would: PBS_JOBID, PBS_JOBNAME, PBS_O_WORKDIR, PBS_NODEFILE, and
# an `mpiexec` that takes PALS's flags (-n, --ppn, --depth, --cpu-bind, --env) and runs srun, with
# PALS's per-rank variables (PMI_LOCAL_RANK, PALS_LOCAL_RANKID, PALS_RANKID, PALS_NODEID).
#   sbatch --exclusive --export=ALL,BASH_ENV=$PWD/tests/slurm/pbs-compat.sh job-scripts/polaris.pbs
if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${PBS_JOBID:-}" ]; then
  export PBS_JOBID=$SLURM_JOB_ID PBS_JOBNAME=${SLURM_JOB_NAME:-job} PBS_O_WORKDIR=${SLURM_SUBMIT_DIR:-$PWD}
  # Every bash started before PBS_JOBID is exported reads BASH_ENV too: one file per job.
  export PBS_NODEFILE=${TMPDIR:-/tmp}/trident-pbs-nodefile.$SLURM_JOB_ID
  scontrol show hostnames "$SLURM_JOB_NODELIST" >"$PBS_NODEFILE"
fi

mpiexec() {
  local n="" ppn="" depth=1 e
  local -a envs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -n | -np) n=$2; shift 2 ;;
      --ppn | -ppn) ppn=$2; shift 2 ;;
      --ppn=*) ppn=${1#*=}; shift ;;
      -d | --depth) depth=$2; shift 2 ;;
      --depth=*) depth=${1#*=}; shift ;;
      --env | -env) envs+=("$2"); shift 2 ;;
      --env=*) envs+=("${1#*=}"); shift ;;
      --cpu-bind | --hostfile) shift 2 ;;
      --cpu-bind=* | --hostfile=* | --envall | --no-vni | -l | --line-buffer) shift ;;
      --) shift; break ;;
      -*) echo "pbs-compat mpiexec: unknown flag $1" >&2; return 2 ;;
      *) break ;;
    esac
  done
  for e in "${envs[@]}"; do export "${e?}"; done
  # shellcheck disable=SC2016 # expanded by the per-rank bash, not here
  srun ${n:+-n "$n"} ${ppn:+--ntasks-per-node="$ppn"} -c "$depth" bash -c \
    'export PMI_LOCAL_RANK=$SLURM_LOCALID PALS_LOCAL_RANKID=$SLURM_LOCALID PALS_RANKID=$SLURM_PROCID PALS_NODEID=$SLURM_NODEID; exec "$@"' \
    mpiexec-rank "$@"
}
export -f mpiexec
