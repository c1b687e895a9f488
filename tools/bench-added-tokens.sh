#!/usr/bin/env bash
# The cost of added tokens in `trident prepare`: the bundled corpus encoded with a byte-level BPE
# tokenizer.json, once as it is and once with N added tokens (default 20,000: random lowercase
# words of 4 to 10 letters, so that they start and end with every letter the text has, as a
# crafted tokenizer's would), alternating REPS times. Prints each run's wall time, the medians,
# and their ratio.
#
#   tools/bench-added-tokens.sh         the base is the 256 bytes, <|endoftext|> and two merges
#   tools/bench-added-tokens.sh DIR     the base is GPT-2's encoder.json + vocab.bpe in DIR
# Environment: TRIDENT (binary, default target/release/trident), N (20000), REPS (5),
# WORKERS (1), CORPUS (the bundled data/tinyshakespeare.txt).
set -euo pipefail
files=${1:-}
here=$(cd "$(dirname "$0")/.." && pwd)
trident=${TRIDENT:-$here/target/release/trident}
n=${N:-20000} reps=${REPS:-5} workers=${WORKERS:-1}
corpus=${CORPUS:-$here/data/tinyshakespeare.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$files" "$tmp" "$n" <<'PY'
import json, random, sys
files, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if files:
    vocab = json.load(open(f"{files}/encoder.json", encoding="utf-8"))
    merges = [l for l in open(f"{files}/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
else:
    # GPT-2's byte alphabet: printable bytes stand for themselves, the rest from U+0100 on.
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    others = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    vocab = {char[b]: b for b in range(256)} | {"<|endoftext|>": 256, "th": 257, "the": 258}
    merges = ["t h", "th e"]
eod = vocab["<|endoftext|>"]
level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
base = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": eod, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": True, "special": True}],
    "normalizer": None, "pre_tokenizer": level, "post_processor": level, "decoder": level,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
              "merges": merges},
}
json.dump(base, open(f"{out}/plain.json", "w"))
rng, words = random.Random(1234), set()
while len(words) < n:
    words.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 10))))
next_id = max(vocab.values()) + 1
for i, w in enumerate(sorted(words)):
    base["added_tokens"].append({"id": next_id + i, "content": w, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
json.dump(base, open(f"{out}/added.json", "w"))
PY
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $workers worker(s), base ${files:-bytes}, $(du -k "$tmp/added.json" | cut -f1) KiB tokenizer.json with $n added tokens"
declare -A times
for rep in $(seq "$reps"); do
  for kind in plain added; do
    start=$(date +%s.%N)
    "$trident" prepare --input "$corpus" --output-prefix "$tmp/out-$kind" --workers "$workers" \
      --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/$kind.json" >/dev/null
    end=$(date +%s.%N)
    t=$(echo "$end - $start" | bc -l)
    times[$kind]+="$t "
    printf '%-6s run %d: %.3f s\n' "$kind" "$rep" "$t"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
plain=$(echo "${times[plain]}" | median)
added=$(echo "${times[added]}" | median)
printf 'median: %.3f s without added tokens, %.3f s with %d: %.2fx\n' "$plain" "$added" "$n" "$(echo "$added / $plain" | bc -l)"
