#!/usr/bin/env python3
# OPTIONAL COMPARISON, NOT PART OF TRIDENT. trident neither needs nor imports PyTorch; this script
# only lets `make gpu-bench` (tests/gpu/gpu-bench.sh) time the same work in PyTorch on the same GPU
# in the same run, so that trident's numbers stand beside a well-known baseline. Without PyTorch
# (or with one that has no CUDA/ROCm) it says so in one record and the benchmark goes on without it.
#
# What it times, each the PyTorch counterpart of a trident bench the shell script runs:
#   --gemm ID=MxNxK          torch.matmul(a, w.t()) on bf16 a [M, K] and w [N, K] into bf16 [M, N]
#                            (trident: `bench gemm --shape MxNxK`, the same NT product).
#   --attention ID=BxSxHxD[xG]  F.scaled_dot_product_attention(q, k, v, is_causal=True) on bf16
#                            [B, H, S, D] (G key/value heads: grouped-query attention, enable_gqa)
#                            on the fastest of its flash, cuDNN and memory-efficient backends that
#                            run here, timed each and named in the note (trident: `bench
#                            attention`): ID.fwd the forward alone, ID forward + backward.
#   --step ID=LxHxAxVxBxS    one GPT-2 training step in bf16 autocast: L layers, hidden H, A heads,
#                            vocabulary V padded to a multiple of 128, micro-batch B of S tokens;
#                            forward, backward, gradient clip at 1.0, fused AdamW (trident: `bench
#                            step --dtype bf16`, the same model, tokens, clip and AdamW settings).
#   --llama-step ID=LxHxAxGxFxVxBxS  the same for a Llama: G key/value heads, SwiGLU width F,
#                            RMSNorm, rotary positions, no biases, an output layer of its own
#                            (trident: `bench step --preset llama3-8b` with those sizes).
#   --compile                each step also under torch.compile (ID.compile), where it compiles.
# FLOPs are counted as trident counts them (2MNK; causal attention 4BHS²D/2; GPT-2 steps
# Megatron's 72BSLH²(1 + S/6H + V/12LH); Llama steps 3 x tokens x (L (2 x weights + 4 S x A·D) +
# 2 H V), attention counted whole as Megatron counts it), so a TFLOP/s ratio is the inverse of the
# time ratio.
# Kernels are timed as trident times them: 3 warm-up launches, one launch to size the batch, then
# a batch that fills --min-seconds (at least 3), with CUDA events; a step with the host clock
# around the timed steps and a synchronize after them.
#
# Output: one JSON object per line (stdout, or --out): first {"bench": "torch", ...} saying which
# PyTorch ran where, then one record per case ({"bench", "case", "shape", "ms", "tflops", ...}),
# or {"bench": "skipped", "case", "why"} for a case it could not run ("case": "*" for all of them).
# It exits 0 whenever it could say what it did; 2 on bad arguments.
#
# --device cpu runs the same code on the CPU (tiny shapes; the tests use it to prove this script
# runs where no GPU is): the numbers then mean nothing.

import argparse
import json
import math
import sys
import time


def parse_case(text, parts, form):
    """ID=AxBx... -> (ID, [A, B, ...]), or an argparse error naming the expected form."""
    case, sep, shape = text.partition("=")
    try:
        dims = [int(x) for x in shape.split("x")]
    except ValueError:
        dims = []
    if not sep or not case or len(dims) != parts or min(dims) <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': expected ID={form}")
    return case, dims


def attention_case(text):
    """ID=BxSxHxD or ID=BxSxHxDxG -> (ID, [B, S, H, D, G]), G defaulting to H."""
    try:
        case, dims = parse_case(text, 5, "BxSxHxDxG")
    except argparse.ArgumentTypeError:
        case, dims = parse_case(text, 4, "BxSxHxD[xG]")
        dims = dims + [dims[2]]
    if dims[2] % dims[4]:
        raise argparse.ArgumentTypeError(f"'{text}': {dims[4]} key/value heads do not divide {dims[2]} heads")
    return case, dims


def arguments(argv):
    p = argparse.ArgumentParser(description="PyTorch's side of `make gpu-bench` (optional).")
    p.add_argument("--device", choices=["cuda", "hip", "cpu"], default="cuda")
    p.add_argument("--min-seconds", type=float, default=0.3)
    p.add_argument("--steps", type=int, default=None, help="timed training steps (default: fill --min-seconds)")
    p.add_argument("--gemm", action="append", default=[], type=lambda t: parse_case(t, 3, "MxNxK"))
    p.add_argument("--attention", action="append", default=[], type=attention_case)
    p.add_argument("--step", action="append", default=[], type=lambda t: parse_case(t, 6, "LxHxAxVxBxS"))
    p.add_argument("--llama-step", action="append", default=[], type=lambda t: parse_case(t, 8, "LxHxAxGxFxVxBxS"))
    p.add_argument("--compile", action="store_true", help="also time each step under torch.compile")
    p.add_argument("--out", default=None, help="write the JSON lines here instead of stdout")
    return p.parse_args(argv)


def gemm_flops(m, n, k):
    return 2.0 * m * n * k


def attention_flops(b, s, h, d):
    # Causal: the kernels skip the masked half of Q·Kᵀ and P·V.
    return 4.0 * b * h * s * s * d / 2.0


def padded_vocab(v):
    return -(-v // 128) * 128


def step_flops(layers, hidden, vocab, batch, seq):
    b, s, l, h, v = batch, seq, layers, hidden, padded_vocab(vocab)
    return 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))


def llama_step_flops(layers, hidden, heads, groups, ffn, vocab, batch, seq):
    """trident's count for a Llama step (GptConfig::flops_per_iteration): forward and backward of
    every GEMM's weights, attention's two products counted over the whole sequence, the head."""
    d = hidden // heads
    width = heads * d
    weights = hidden * (heads + 2 * groups) * d + width * hidden + hidden * 2 * ffn + ffn * hidden
    per_token = layers * (2.0 * weights + 4.0 * seq * width) + 2.0 * hidden * padded_vocab(vocab)
    return 3.0 * batch * seq * per_token


def which_torch(device):
    """(torch module or None, header record, why-skipped or None)."""
    header = {"bench": "torch", "python": sys.executable, "device_kind": device}
    try:
        import torch
    except Exception as e:  # an absent or broken install: say which and go on without it
        return None, header, f"no PyTorch in {sys.executable} ({type(e).__name__}: {e})"
    header["torch"] = torch.__version__
    header["cuda"] = torch.version.cuda
    header["hip"] = getattr(torch.version, "hip", None)
    if device == "cpu":
        header["device"] = "cpu"
        return torch, header, None
    built = header["hip"] and "ROCm" or header["cuda"] and "CUDA"
    wanted = "ROCm" if device == "hip" else "CUDA"
    if not built:
        return None, header, f"PyTorch {torch.__version__} in {sys.executable} is built without CUDA or ROCm"
    if built != wanted:
        return None, header, f"PyTorch {torch.__version__} is built for {built}, the GPU wants {wanted}"
    if not torch.cuda.is_available():
        return None, header, f"PyTorch {torch.__version__} ({built}) sees no GPU (torch.cuda.is_available() is False)"
    header["device"] = torch.cuda.get_device_name(0)
    return torch, header, None


class Timer:
    """Milliseconds per call of a launch, as trident's benches time their kernels."""

    def __init__(self, torch, on_gpu, min_seconds):
        self.torch, self.on_gpu, self.min_seconds = torch, on_gpu, min_seconds

    def batch_ms(self, fn, n):
        if self.on_gpu:
            start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) * 1e3

    def ms(self, fn):
        for _ in range(3):
            fn()
        once = max(self.batch_ms(fn, 1), 1e-3)
        n = min(max(math.ceil(self.min_seconds * 1e3 / once), 3), 100_000)
        return self.batch_ms(fn, n) / n


def sdpa_backends(torch):
    """(name, context) for each fast scaled_dot_product_attention backend this PyTorch names: the
    context lets SDPA use that backend alone."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # PyTorch before 2.3: flash alone
        only = torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
        return [("flash", lambda: only)]
    names = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")]
    return [(n, lambda b=getattr(SDPBackend, b): sdpa_kernel([b])) for n, b in names if hasattr(SDPBackend, b)]


def sdpa(torch, q, k, v, groups):
    """Causal SDPA of q [B, H, S, D] against `groups` key/value heads in k, v [B, G, S, D]."""
    import torch.nn.functional as F

    if groups == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def gemm(torch, dev, timer, case, dims):
    m, n, k = dims
    g = torch.Generator(device=dev).manual_seed(1)
    a = torch.rand(m, k, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
    w = torch.rand(n, k, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    ms = timer.ms(lambda: torch.matmul(a, w.t(), out=out))
    return {"shape": f"{m}x{n}x{k}", "ms": ms, "tflops": gemm_flops(m, n, k) / ms / 1e9, "note": "torch.matmul(a, w.t())"}


def attention(torch, dev, timer, case, dims):
    """Two records: CASE.fwd, the forward alone, and CASE, forward + backward (FLOPs 3.5 x the
    forward's, as trident's fwd+bwd record counts them), both on the backend whose forward +
    backward was fastest; the note names it and what the others took."""
    b, s, h, d, groups = dims
    g = torch.Generator(device=dev).manual_seed(3)
    q, dout = (torch.rand(b, h, s, d, device=dev, generator=g).sub_(0.5).to(torch.bfloat16) for _ in range(2))
    k, v = (torch.rand(b, groups, s, d, device=dev, generator=g).sub_(0.5).to(torch.bfloat16) for _ in range(2))
    timed, failed = [], []
    for name, only in sdpa_backends(torch):
        try:
            with only():
                with torch.no_grad():
                    fwd_ms = timer.ms(lambda: sdpa(torch, q, k, v, groups))
                for t in (q, k, v):
                    t.requires_grad_(True)

                def both():
                    sdpa(torch, q, k, v, groups).backward(dout)
                    q.grad = k.grad = v.grad = None

                both_ms = timer.ms(both)
            timed.append((both_ms, fwd_ms, name))
        except RuntimeError as e:  # a backend that does not take this shape, dtype or device
            failed.append(f"{name}: {str(e).splitlines()[0][:80]}")
        finally:
            for t in (q, k, v):
                t.requires_grad_(False)
    if not timed:
        raise RuntimeError("no SDPA backend ran: " + "; ".join(failed))
    both_ms, fwd_ms, name = min(timed)
    others = [f"{n} {ms:.3f} ms" for ms, _, n in sorted(timed) if n != name] + [f"{f} (failed)" for f in failed]
    gqa = f", {groups} key/value heads (enable_gqa)" if groups != h else ""
    note = f"scaled_dot_product_attention, {name} backend (fastest fwd+bwd of those that ran), causal{gqa}"
    if others:
        note += "; others: " + ", ".join(others)
    flops = attention_flops(b, s, h, d)
    shape = f"{b}x{s}x{h}x{d}" + (f"x{groups}" if groups != h else "")
    return [
        (f"{case}.fwd", {"shape": shape, "ms": fwd_ms, "tflops": flops / fwd_ms / 1e9, "backend": name, "note": note}),
        (case, {"shape": shape, "ms": both_ms, "tflops": 3.5 * flops / both_ms / 1e9, "backend": name, "note": note}),
    ]


def gpt2(torch, layers, hidden, heads, vocab, positions):
    """GPT-2 as trident's bench step trains it: learned positions, pre-LayerNorm blocks, tanh
    GELU, the word embedding tied to the output head, no dropout."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.attn_proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc, self.fc_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split(hidden, dim=2)
            q, k, v = (t.view(b, s, heads, hidden // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(b, s, hidden))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(padded_vocab(vocab), hidden), nn.Embedding(positions, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens, labels):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))

    return Gpt2()


def llama(torch, layers, hidden, heads, groups, ffn, vocab, positions):
    """A Llama as trident's bench step trains one: RMSNorm, rotary positions (base 500000, the
    halves of each head rotated), grouped-query attention, SwiGLU, no biases, an output layer of
    its own, no dropout."""
    import torch.nn as nn
    import torch.nn.functional as F

    d = hidden // heads
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)

    def rotate(x, cos, sin):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def norm():
        return nn.RMSNorm(hidden, eps=1e-5) if hasattr(nn, "RMSNorm") else nn.LayerNorm(hidden, bias=False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm_1, self.norm_2 = norm(), norm()
            self.qkv = nn.Linear(hidden, (heads + 2 * groups) * d, bias=False)
            self.proj = nn.Linear(heads * d, hidden, bias=False)
            self.fc1, self.fc2 = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm_1(x)).split([heads * d, groups * d, groups * d], dim=2)
            q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
            y = sdpa(torch, rotate(q, cos, sin), rotate(k, cos, sin), v, groups)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, heads * d))
            gate, up = self.fc1(self.norm_2(x)).chunk(2, dim=-1)
            return x + self.fc2(F.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(padded_vocab(vocab), hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.output = norm(), nn.Linear(hidden, padded_vocab(vocab), bias=False)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens, labels):
            s = tokens.shape[1]
            cos, sin = self.cos[:s], self.sin[:s]
            x = self.embedding(tokens)
            for block in self.blocks:
                x = block(x, cos, sin)
            logits = self.output(self.norm(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))

    return Llama()


def train(torch, dev, model, batch, seq, steps, min_seconds):
    """Times training steps of `model` on trident's synthetic micro-batch (B x S): (seconds per
    step, timed steps, last loss, the optimizer's note)."""
    note = "bf16 autocast, clip 1.0, AdamW fused"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    except (RuntimeError, TypeError) as e:  # fused AdamW on a device or version without it
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        note = f"bf16 autocast, clip 1.0, AdamW not fused ({e})"
    # The tokens and labels of trident's bench step.
    n = batch * seq
    tokens = torch.tensor([i * 31 % 256 for i in range(n)], device=dev).view(batch, seq)
    labels = torch.tensor([i * 17 % 256 for i in range(n)], device=dev).view(batch, seq)
    device_type = "cpu" if dev == "cpu" else "cuda"

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            loss = model(tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def synchronize():
        if dev != "cpu":
            torch.cuda.synchronize()

    # The first step makes AdamW's state (and compiles, under torch.compile); the second, a
    # settled one, sizes the timed run.
    train_step()
    synchronize()
    t = time.perf_counter()
    train_step()
    synchronize()
    once = max(time.perf_counter() - t, 1e-6)
    steps = steps or min(max(math.ceil(min_seconds / once), 2), 10_000)
    t = time.perf_counter()
    for _ in range(steps):
        loss = train_step()
    synchronize()
    return (time.perf_counter() - t) / steps, steps, float(loss.detach()), note


def step(torch, dev, timer, case, dims, steps, compile_too, llama_dims=None):
    """CASE's record, and CASE.compile's under --compile (or why it did not compile)."""
    if llama_dims is None:
        layers, hidden, heads, vocab, batch, seq = dims
        groups, ffn = heads, 4 * hidden
    else:
        layers, hidden, heads, groups, ffn, vocab, batch, seq = llama_dims
    if hidden % heads or heads % groups:
        raise ValueError(f"hidden {hidden} does not split into {heads} heads in {groups} groups")
    # trident's presets have 1024 positions (gpt2-124m) or 8192 (llama3-8b), more when the
    # sequence is longer.
    if llama_dims is None:
        build = lambda: gpt2(torch, layers, hidden, heads, vocab, max(1024, seq)).to(dev)
        flops = step_flops(layers, hidden, vocab, batch, seq)
        shape = f"{layers}x{hidden}x{heads}x{padded_vocab(vocab)}x{batch}x{seq}"
    else:
        build = lambda: llama(torch, layers, hidden, heads, groups, ffn, vocab, max(8192, seq)).to(dev)
        flops = llama_step_flops(layers, hidden, heads, groups, ffn, vocab, batch, seq)
        shape = f"{layers}x{hidden}x{heads}x{groups}x{ffn}x{padded_vocab(vocab)}x{batch}x{seq}"
    records = []
    for variant in ["eager"] + (["compile"] if compile_too else []):
        c = case if variant == "eager" else f"{case}.compile"
        torch.manual_seed(1234)
        model = build()
        try:
            if variant == "compile":
                model = torch.compile(model)
            seconds, timed, loss, note = train(torch, dev, model, batch, seq, steps, timer.min_seconds)
        except Exception as e:  # torch.compile without a working backend here: say so
            if variant == "eager":
                raise
            records.append((c, {"why": f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}))
            continue
        records.append((c, {
            "shape": shape,
            "ms": seconds * 1e3,
            "tflops": flops / seconds / 1e12,
            "tokens_per_s": batch * seq / seconds,
            "timed_steps": timed,
            "loss": loss,
            "note": note + (", torch.compile" if variant == "compile" else ", eager"),
        }))
        del model
    return records


def main(argv):
    args = arguments(argv)
    out = open(args.out, "w") if args.out else sys.stdout

    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    torch, header, why = which_torch(args.device)
    emit(header)
    if why:
        emit({"bench": "skipped", "case": "*", "why": why})
        return 0
    dev = "cpu" if args.device == "cpu" else "cuda"
    timer = Timer(torch, dev != "cpu", args.min_seconds)
    work = [("gemm", gemm, c) for c in args.gemm]
    work += [("attention", attention, c) for c in args.attention]
    work += [("step", lambda *a: step(*a, args.steps, args.compile), c) for c in args.step]
    work += [("step", lambda *a: step(*a, args.steps, args.compile, a[4]), c) for c in args.llama_step]
    for bench, run, (case, dims) in work:
        try:
            records = run(torch, dev, timer, case, dims)
            # A bench gives one record for its case, or (case, record) pairs (attention: two).
            for c, record in records if isinstance(records, list) else [(case, records)]:
                if "why" in record:
                    emit({"bench": "skipped", "case": c, "why": record["why"]})
                else:
                    emit({"bench": bench, "case": c, "dtype": "bf16", **record})
        except Exception as e:  # one case that cannot run (no flash kernel, out of memory): say so
            emit({"bench": "skipped", "case": case, "why": f"PyTorch {bench} failed: {type(e).__name__}: {e}"})
        finally:
            if dev != "cpu":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
