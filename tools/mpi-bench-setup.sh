# Sourced by the multi-rank bench scripts: `mpirun` (MPIRUN, default `mpirun --oversubscribe`,
# plus --allow-run-as-root as root), a scratch directory `tmp` removed on exit, and the bundled
# corpus prepared there as `$tmp/sh_text_document`. Needs `here` (the repository) and `trident`.
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
mpirun=${MPIRUN:-mpirun --oversubscribe $root}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$trident" prepare --input "$here/data/tinyshakespeare.txt" --output-prefix "$tmp/sh" --append-eod > /dev/null
