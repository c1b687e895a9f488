"""The reference side of tests/tokenizers.rs: token ids from Hugging Face's `tokenizers` package
(and transformers' GPT2Tokenizer for GPT-2's files), and a Llama-3-style tokenizer.json trained on
the bundled corpus. One JSON list of ids per input line.

  encode-gpt2 DIR IN OUT           GPT-2's encoder.json + vocab.bpe in DIR, with `tokenizers`
  encode-transformers DIR IN OUT   the same files through transformers' GPT2Tokenizer
  encode-json TOKENIZER IN OUT [special]
                                   a tokenizer.json, add_special_tokens off (megatron-core's
                                   default), on with `special`
  train-llama3 CORPUS DIR          writes DIR/tokenizer.json and DIR/tokenizer_config.json
  megatron-gpt2 DIR IN PREFIX      PREFIX.bin/.idx as Megatron's tools/preprocess_data.py writes
                                   them with --append-eod (its Encoder.encode: no EOD after an
                                   empty document, one sequence per document) through
                                   megatron-core's IndexedDatasetBuilder and DType.optimal_dtype

  tiktoken-vocab TOKENIZER OUT     Megatron's TikTokenizer vocabulary (a JSON list of ranks) made
                                   from a byte-level tokenizer.json: the 256 bytes, then its
                                   other tokens by id
  encode-tiktoken VOCAB IN OUT PATTERN SPECIALS
                                   TikTokenizer's ids as megatron-core's TikTokenTokenizer gives
                                   them through tiktoken (which CI does not install), written here
                                   from tiktoken's rules: special tokens split out first, the
                                   pattern (the `regex` module), then each piece merged lowest
                                   rank first; ids are SPECIALS + rank
  encode-auto DIR IN OUT           transformers' AutoTokenizer of a Hugging Face directory (what
                                   `trident convert --save-hf` wrote), add_special_tokens off
  greedy DIR PROMPT N OUT          N greedy tokens after PROMPT from the directory's model and
                                   tokenizer through transformers (argmax over the unpadded
                                   vocabulary, as `trident generate --temperature 0`); OUT holds
                                   the new text, each end of document written as a blank line

IN is JSON lines with a "text" key.
"""
import base64
import json
import os
import shutil
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write(path, rows):
    with open(path, "w") as f:
        for ids in rows:
            f.write(json.dumps(list(ids)) + "\n")


def gpt2(d):
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def transformers_gpt2(d, docs):
    from transformers import GPT2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(d, "encoder.json"), os.path.join(tmp, "vocab.json"))
        shutil.copy(os.path.join(d, "vocab.bpe"), os.path.join(tmp, "merges.txt"))
        tok = GPT2Tokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"))
        return [tok.encode(t) for t in docs]


def train_llama3(corpus, out):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([corpus], trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end_of_text|>"}, f)


TIKTOKEN = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+",
}


def byte_decoder():
    # GPT-2's byte-to-character alphabet, inverted.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


def tiktoken_vocab(tokenizer, out):
    model = json.load(open(tokenizer, encoding="utf-8"))["model"]
    dec = byte_decoder()
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    for s, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        b = bytes(dec[c] for c in s)
        if b not in seen:
            seen.add(b)
            tokens.append(b)
    rows = [{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
            for i, t in enumerate(tokens)]
    with open(out, "w") as f:
        json.dump(rows, f)
    print(len(rows))


def tiktoken_ids(vocab, docs, pattern, specials):
    import regex

    ranks = {base64.b64decode(r["token_bytes"]): r["rank"] + specials for r in json.load(open(vocab))}
    names = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]
    names += [f"<SPECIAL_{i}>" for i in range(len(names), specials)]
    special_re = regex.compile("|".join(regex.escape(n) for n in names))
    split = regex.compile(TIKTOKEN[pattern])

    def merged(piece):
        if piece in ranks:
            return [ranks[piece]]
        cuts = list(range(len(piece) + 1))
        while True:
            pairs = [(ranks[piece[cuts[i]:cuts[i + 2]]], i) for i in range(len(cuts) - 2)
                     if piece[cuts[i]:cuts[i + 2]] in ranks]
            if not pairs:
                break
            del cuts[min(pairs)[1] + 1]
        return [ranks[piece[a:b]] for a, b in zip(cuts, cuts[1:])]

    def plain(text):
        return [i for piece in split.findall(text) for i in merged(piece.encode("utf-8"))]

    out = []
    for text in docs:
        ids, at = [], 0
        for m in special_re.finditer(text):
            ids += plain(text[at:m.start()]) + [names.index(m.group())]
            at = m.end()
        out.append(ids + plain(text[at:]))
    return out


def greedy(d, prompt, n, out):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    vocab = model.config.to_dict().get("trident_unpadded_vocab_size", model.config.vocab_size)
    ids = tok.encode(prompt, add_special_tokens=False)
    new = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids + new])).logits[0, -1, :vocab]
            new.append(int(torch.argmax(logits)))
    eos = model.config.eos_token_id
    parts, run = [], []
    for i in new + [eos]:
        if i == eos:
            parts.append(tok.decode(run))
            run = []
        else:
            run.append(i)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(parts))


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "encode-gpt2":
        write(args[2], (e.ids for e in gpt2(args[0]).encode_batch(texts(args[1]))))
    elif mode == "encode-transformers":
        write(args[2], transformers_gpt2(args[0], texts(args[1])))
    elif mode == "encode-json":
        tok = Tokenizer.from_file(args[0])
        special = len(args) > 3 and args[3] == "special"
        write(args[2], (e.ids for e in tok.encode_batch(texts(args[1]), add_special_tokens=special)))
    elif mode == "megatron-gpt2":
        from megatron.core.datasets import indexed_dataset

        tok = gpt2(args[0])
        eod = tok.token_to_id("<|endoftext|>")
        builder = indexed_dataset.IndexedDatasetBuilder(
            args[2] + ".bin", dtype=indexed_dataset.DType.optimal_dtype(tok.get_vocab_size()))
        for enc in tok.encode_batch(texts(args[1])):
            ids = enc.ids + [eod] if enc.ids else []
            builder.add_document(ids, [len(ids)] if ids else [])
        builder.finalize(args[2] + ".idx")
    elif mode == "tiktoken-vocab":
        tiktoken_vocab(args[0], args[1])
    elif mode == "encode-tiktoken":
        write(args[2], tiktoken_ids(args[0], texts(args[1]), args[3], int(args[4])))
    elif mode == "encode-auto":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args[0])
        write(args[2], (tok.encode(t, add_special_tokens=False) for t in texts(args[1])))
    elif mode == "greedy":
        greedy(args[0], args[1], int(args[2]), args[3])
    elif mode == "train-llama3":
        train_llama3(args[0], args[1])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
