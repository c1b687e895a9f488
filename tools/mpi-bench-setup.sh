# Sourced by the multi-rank bench scripts: `mpirun` (MPIRUN, default `mpirun --oversubscribe`,
# plus --allow-run-as-root as root), a scratch directory `tmp` removed on exit, and the bundled
# corpus prepared there as `$tmp/sh_text_document`. Needs `here` (the repository) and `trident`;
# with `need` (ranks that must each have a core) and `knob` (the variable that sets them), it
# first stops unless the machine has that many cores (FORCE=1 runs anyway): with fewer, ranks
# share cores and the figures measure the sharing.
if [ -n "${need:-}" ]; then
    cores=$(nproc)
    if [ "$cores" -lt "$need" ] && [ "${FORCE:-0}" != 1 ]; then
        echo "$(basename "$0"): $need ranks need $need cores and this machine has $cores;" \
            "$knob=$cores measures here (FORCE=1 runs anyway, measuring the cores' sharing)" >&2
        exit 2
    fi
fi
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
mpirun=${MPIRUN:-mpirun --oversubscribe $root}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$trident" prepare --input "$here/data/tinyshakespeare.txt" --output-prefix "$tmp/sh" --append-eod > /dev/null
