#!/usr/bin/env bash
# `make test`'s runner: what `cargo test --release` runs, with the test binaries two at a time.
#
# `cargo test` runs its test binaries one after another, and many of them leave a core idle for
# most of their run (an emulated GPU test on one thread, ranks waiting on each other, a killed
# run's timeout), so on 2 cores the suite took about a fifth longer than its CPU time needs.
# Here every binary is built once (`cargo test --no-run`), then run TEST_JOBS at a time
# (default 2), the slowest first so the slots end together, each one's output kept in
# target/test-logs/NAME.log and printed when it fails; then the doctests. Exit status 0 only
# when every binary and the doctests pass.
#
# Knobs: TEST_JOBS (binaries at once), CARGO. The binaries see the environment the Makefile
# sets (TRIDENT_SKIP_LOG, TRIDENT_NVRTC, ...), and no standard input (mpirun would read it).
# One file alone is still `cargo test --release --test NAME`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 101
CARGO=${CARGO:-cargo}
JOBS=${TEST_JOBS:-2}
LOGS=target/test-logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

# Build every test target, as `cargo test` would, and list the binaries: "name path", the
# library's and the command's unit tests as lib and bin.
if ! $CARGO test --release --no-run --message-format=json-render-diagnostics >"$LOGS/build.json"; then
  echo "run.sh: the tests did not build" >&2
  exit 101
fi
grep '"reason":"compiler-artifact"' "$LOGS/build.json" | grep '"profile":{[^}]*"test":true}' | grep '"executable":"' |
  sed -n 's/.*"kind":\["\([a-z-]*\)"\].*"name":"\([A-Za-z0-9_-]*\)".*"executable":"\([^"]*\)".*/\1 \2 \3/p' |
  awk '{ print ($1 == "test" ? $2 : $1), $3 }' >"$LOGS/binaries"
if [ ! -s "$LOGS/binaries" ]; then
  echo "run.sh: no test binary in cargo's build output ($LOGS/build.json)" >&2
  exit 101
fi

# The slowest first (seconds on 2 cores, measured; a binary not named here runs after them).
SLOWEST=(cuda_device hip_device megatron_checkpoints parallel gpu_runtime training rampup learning
  hip_runtime hf_llama nccl_comm cuda_emulation convert hip_emulation first_light job_control dropout
  llama_parallel context tokenizers datasets cpu_isa gpu_bench checkpoint_kill)
order() {
  local n pattern
  for n in "${SLOWEST[@]}"; do grep "^$n " "$LOGS/binaries"; done
  pattern=$(IFS='|'; echo "${SLOWEST[*]}")
  grep -v -E "^($pattern) " "$LOGS/binaries"
}

run_one() {
  local name=$1 exe=$2 start status
  start=$(date +%s)
  "$exe" </dev/null >"$LOGS/$name.log" 2>&1
  status=$?
  echo "$status" >"$LOGS/$name.status"
  local result
  result=$(grep -E '^test result:' "$LOGS/$name.log" | tail -1)
  if [ "$status" -eq 0 ]; then
    printf 'ok     %-16s %4ss  %s\n' "$name" "$(($(date +%s) - start))" "$result"
  else
    printf 'FAILED %-16s %4ss  %s (exit %s; log %s)\n' "$name" "$(($(date +%s) - start))" "$result" "$status" \
      "$LOGS/$name.log"
  fi
}
export -f run_one
export LOGS

echo "run.sh: $(wc -l <"$LOGS/binaries") test binaries, $JOBS at a time; logs in $LOGS"
# shellcheck disable=SC2016 # run_one's arguments expand in the shell xargs starts
order | xargs -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"'

echo "run.sh: doctests"
$CARGO test --release --doc >"$LOGS/doctests.log" 2>&1
echo $? >"$LOGS/doctests.status"
grep -E '^test result:' "$LOGS/doctests.log" | tail -1

statuses=("$LOGS"/*.status)
failed=()
for s in "${statuses[@]}"; do
  [ "$(cat "$s")" = 0 ] || failed+=("$(basename "$s" .status)")
done
if [ "$(wc -l <"$LOGS/binaries")" -ne "$((${#statuses[@]} - 1))" ]; then
  echo "run.sh: a test binary did not report a status" >&2
  exit 101
fi
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do
    echo "==== $f: $LOGS/$f.log (failures and the end)"
    grep -E -A30 '^failures:$' "$LOGS/$f.log" | head -200
    tail -5 "$LOGS/$f.log"
  done
  echo "run.sh: FAILED: ${failed[*]}"
  exit 101
fi
echo "run.sh: every test binary and the doctests passed"
