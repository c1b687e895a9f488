"""OPTIONAL comparison for tests/hf_llama.rs: trident's Llama export and import against Hugging Face
transformers' own LlamaForCausalLM. Needs torch and transformers (`.ci/run` installs them into the
torch venv); the Rust test runs this only where they import, and says loudly that it skips
otherwise.

  hf_llama_compare.py logits DIR TOKENS N OUT
      Loads DIR (a `trident convert --save-hf` directory) as LlamaForCausalLM in float32 with eager
      attention, writes the logits of TOKENS (comma-separated ids) to OUT.logits (little-endian f32,
      [len(TOKENS), vocab]) and the greedy continuation of TOKENS by N tokens (argmax over the real
      vocabulary, `trident_unpadded_vocab_size`, as `trident generate --temperature 0` picks) to
      OUT.greedy (ids, space-separated).
  hf_llama_compare.py make DIR CASE
      Saves a LlamaForCausalLM with random weights (every tensor drawn, norm weights near 1, so
      no two weights agree by accident) to DIR with safetensors. CASE "gqa": grouped-query
      attention (4 heads, 2 key/value heads), untied output layer, no biases, Llama 3.1 rope
      scaling, base 500000. CASE "tied": tied output layer, biases on every projection, a head
      dimension other than hidden / heads, base 10000.

Several commands go in one run, separated by `--` (torch and transformers take seconds to import).
"""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def load(path):
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def logits_and_greedy(path, tokens, n, out):
    model = load(path)
    real_vocab = getattr(model.config, "trident_unpadded_vocab_size", model.config.vocab_size)
    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long)
        logits = model(ids, use_cache=False).logits[0].to(torch.float32).contiguous()
        logits.numpy().astype("<f4").tofile(out + ".logits")
        context = list(tokens)
        for _ in range(n):
            step = model(torch.tensor([context], dtype=torch.long), use_cache=False).logits[0, -1, :real_vocab]
            context.append(int(torch.argmax(step)))
    with open(out + ".greedy", "w") as f:
        f.write(" ".join(str(t) for t in context[len(tokens):]))


def make(path, case):
    torch.manual_seed(20)
    common = dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, hidden_act="silu")
    if case == "gqa":
        config = LlamaConfig(**common, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                             tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 8192})
    elif case == "tied":
        config = LlamaConfig(**common, intermediate_size=80, num_attention_heads=4, num_key_value_heads=4,
                             head_dim=24, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    else:
        raise SystemExit(f"unknown case {case}")
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)


def run(command):
    if len(command) == 5 and command[0] == "logits":
        tokens = [int(t) for t in command[2].split(",")]
        logits_and_greedy(command[1], tokens, int(command[3]), command[4])
    elif len(command) == 3 and command[0] == "make":
        make(command[1], command[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    command = []
    for arg in sys.argv[1:] + ["--"]:
        if arg == "--":
            run(command)
            command = []
        else:
            command.append(arg)
