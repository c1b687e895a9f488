#!/usr/bin/env bash
# Tokenizer throughput, trident against Hugging Face's `tokenizers`, side by side in one run:
# `trident prepare --workers W` (file read, JSON parse, encode, .bin/.idx write: wall time of the
# whole command) and `tokenizers`' encode_batch and encode_batch_fast (no offsets) with
# RAYON_NUM_THREADS=W (encode only, the texts already in memory), on the same JSON lines: the bundled corpus's paragraphs repeated to about
# SIZE_MB, alternating REPS times. Prints MB/s (10^6 input bytes per second) per run.
#
#   tools/bench-tokenize.sh gpt2 DIR          GPT-2's encoder.json + vocab.bpe in DIR
#   tools/bench-tokenize.sh json TOKENIZER    a tokenizer.json
# Environment: TRIDENT (binary, default target/release/trident), PYTHON (with tokenizers),
# WORKERS (2), SIZE_MB (40), REPS (3), CORPUS (the bundled tinyshakespeare.txt).
set -euo pipefail
kind=$1 files=$2
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
python=${PYTHON:-python3}
workers=${WORKERS:-2} size_mb=${SIZE_MB:-40} reps=${REPS:-3}
corpus=${CORPUS:-$here/data/tinyshakespeare.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" - "$corpus" "$tmp/in.jsonl" "$size_mb" <<'PY'
import json, sys
paras = [p for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()]
target, out, n = int(sys.argv[3]) * 10**6, open(sys.argv[2], "w"), 0
while n < target:
    for p in paras:
        out.write(json.dumps({"text": p}) + "\n")
        n += len(p.encode())
PY
case $kind in
  gpt2) flags=(--tokenizer-type GPT2BPETokenizer --vocab-file "$files/encoder.json" --merge-file "$files/vocab.bpe") ;;
  json) flags=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$files") ;;
  *) echo "usage: $0 gpt2 DIR | json TOKENIZER" >&2; exit 2 ;;
esac
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $workers threads, $(du -m "$tmp/in.jsonl" | cut -f1) MiB of JSON lines"
for rep in $(seq "$reps"); do
  start=$(date +%s.%N)
  "$trident" prepare --input "$tmp/in.jsonl" --output-prefix "$tmp/out" --workers "$workers" "${flags[@]}" >/dev/null 2>&1
  end=$(date +%s.%N)
  bytes=$("$python" -c "import json,sys; print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1])))" "$tmp/in.jsonl")
  echo "run $rep trident prepare: $(echo "$bytes / ($end - $start) / 1000000" | bc -l | xargs printf '%.2f') MB/s"
  RAYON_NUM_THREADS=$workers "$python" - "$kind" "$files" "$tmp/in.jsonl" <<'PY'
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers
kind, files, path = sys.argv[1:4]
if kind == "gpt2":
    tok = Tokenizer(models.BPE.from_file(f"{files}/encoder.json", f"{files}/vocab.bpe"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
else:
    tok = Tokenizer.from_file(files)
texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
n = sum(len(t.encode()) for t in texts)
for name in ["encode_batch", "encode_batch_fast"]:
    if hasattr(tok, name):
        start = time.perf_counter()
        getattr(tok, name)(texts)
        print(f"      tokenizers {name}: {n / (time.perf_counter() - start) / 1e6:.2f} MB/s")
PY
done
