"""OPTIONAL comparison for tests/megatron_checkpoints.rs: trident's reader and writer of Megatron-LM
checkpoints against megatron-core's own GPTModel and dist_checkpointing. Needs torch and
megatron-core (`.ci/run` installs them into the torch venv); the Rust test runs this only where they
import, and says loudly that it skips otherwise.

  megatron_checkpoints.py make DIR CASE
      Builds a GPTModel with random weights on 4 CPU processes (gloo), tensor-parallel 2 x pipeline 2,
      takes one Adam step (megatron-core's optimizer, torch's step), and saves it twice, as
      Megatron-LM's training loop does: DIR/dist in the torch_dist format (dist_checkpointing.save
      of the model's and the optimizer's sharded state, with the common state Megatron-LM writes:
      its argument namespace, iteration and checkpoint version) and DIR/legacy in the legacy torch
      format (one model_optim_rng.pt per model-parallel rank). Then the same model takes the same
      step with megatron-core's distributed optimizer, saved as DIR/distopt (torch_dist, its
      dp_reshardable buckets), DIR/distopt-full (torch_dist, its fully_reshardable layout) and
      DIR/legacy-distopt (model_optim_rng.pt and distrib_optim.pt per rank). CASE "gpt":
      LayerNorm, GELU (tanh form), learned positions, biases, tied output layer. CASE "llama": RMSNorm, SwiGLU, rotary positions (base 500000),
      grouped queries (4 heads, 2 groups), no biases, untied output layer.
  megatron_checkpoints.py logits CKPT TOKENS OUT
      Loads the torch_dist checkpoint CKPT (its latest iteration) into a one-rank GPTModel built from
      the arguments it holds and writes the logits of TOKENS (comma-separated ids) to OUT
      (little-endian f32, [len(TOKENS), padded vocabulary]).

The argument namespace holds the fields of Megatron-LM's `arguments.py` that describe the model, the
layout and the run's position, under their names there.
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist

from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

ITERATION = 7

# megatron-core moves a few tensors to the GPU with `.cuda()` (the tied embedding's first
# all-reduce); on these CPU processes they stay where they are.
torch.Tensor.cuda = lambda self, *args, **kwargs: self
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.cuda.current_device = lambda: "cpu"
_tensor = torch.tensor


def _cpu_tensor(*args, **kwargs):
    """megatron-core's f32 optimizer makes its loss scale with device='cuda'."""
    if kwargs.get("device") == "cuda":
        kwargs["device"] = "cpu"
    return _tensor(*args, **kwargs)


torch.tensor = _cpu_tensor
# Attention forks the CUDA generator for its dropout (0 here): no generator to fork on the CPU.
tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()


def case_args(case, tp, pp):
    common = dict(num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  max_position_embeddings=64, seq_length=32, padded_vocab_size=384, vocab_size=300,
                  make_vocab_size_divisible_by=64, tensor_model_parallel_size=tp,
                  pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=None,
                  decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
                  sequence_parallel=False, consumed_train_samples=56, consumed_valid_samples=16,
                  iteration=ITERATION, apply_layernorm_1p=False, rotary_percent=1.0,
                  use_rope_scaling=False, kv_channels=None, tokenizer_type="NullTokenizer",
                  ckpt_format="torch_dist", seed=1234, transformer_impl="local")
    if case == "gpt":
        return argparse.Namespace(**common, normalization="LayerNorm", norm_epsilon=1e-5, swiglu=False, openai_gelu=False,
                                  bias_gelu_fusion=False,
                                  position_embedding_type="learned_absolute", rotary_base=10000,
                                  group_query_attention=False, num_query_groups=None,
                                  untie_embeddings_and_output_weights=False, add_bias_linear=True)
    return argparse.Namespace(**common, normalization="RMSNorm", norm_epsilon=1e-5, swiglu=True,
                              position_embedding_type="rope", rotary_base=500000,
                              group_query_attention=True, num_query_groups=2,
                              untie_embeddings_and_output_weights=True, add_bias_linear=False)


def tanh_gelu(x):
    """GELU's tanh form: what Megatron-LM's fused bias-GELU (its default where fc1 has a bias) and
    `--openai-gelu` compute."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def activation(args):
    """The MLP's activation as Megatron-LM's arguments make it: SwiGLU's SiLU; the tanh GELU where
    the bias-GELU fusion runs (or --openai-gelu); else the exact GELU (the GPT case: unfused)."""
    if args.swiglu:
        return torch.nn.functional.silu
    fused = getattr(args, "bias_gelu_fusion", True) and getattr(args, "add_bias_linear", True)
    return tanh_gelu if fused or getattr(args, "openai_gelu", False) else torch.nn.functional.gelu


def build(args):
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        normalization=args.normalization, layernorm_epsilon=args.norm_epsilon,
        gated_linear_unit=args.swiglu,
        activation_func=activation(args),
        add_bias_linear=args.add_bias_linear, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        use_cpu_initialization=True, init_method_std=0.05, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False)
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization=args.normalization),
        vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
        pre_process=pre, post_process=post,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_base=args.rotary_base,
        rotary_percent=args.rotary_percent)
    return model


def randomize(model, seed):
    """Every weight drawn (norm weights near 1), so no two weights agree by accident; each
    model-parallel rank draws its own shard."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            p.copy_(1.0 + noise if "norm" in name else noise)
        # A tied output layer on the last stage is a copy of the first stage's embedding: as
        # megatron-core starts it, zero there and summed over the embedding group.
        if model.share_embeddings_and_output_weights and model._is_in_embd_group():
            weight = model.shared_embedding_or_output_weight()
            if not model.pre_process:
                weight.zero_()
            dist.all_reduce(weight, group=model.embd_group)


def adam_step(model, rank):
    """megatron-core's optimizer (Adam, f32, not distributed) after one step on random gradients
    (the step itself is torch's Adam: megatron-core's own step wants a GPU for its norms). From
    zero moments, exp_avg is 0.1 g and exp_avg_sq 0.001 g^2: exp_avg_sq = 0.1 exp_avg^2."""
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, params_dtype=torch.float32, clip_grad=0.0), [ddp])
    g = torch.Generator().manual_seed(200 + rank)
    for p in ddp.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 0.01
    optimizer.optimizer.step()
    return optimizer


@contextlib.contextmanager
def cuda_type_names():
    """megatron-core's distributed optimizer accepts parameters whose `type()` names a CUDA tensor."""
    plain = torch.Tensor.type

    def cuda_type(self, *args, **kwargs):
        name = plain(self, *args, **kwargs)
        return name.replace("torch.", "torch.cuda.", 1) if not (args or kwargs) else name

    torch.Tensor.type = cuda_type
    try:
        yield
    finally:
        torch.Tensor.type = plain


def distributed_adam_step(model, rank):
    """The same step as `adam_step` (the same gradients, drawn in the same order) taken by
    megatron-core's distributed optimizer, which keeps its state in the gradient buffer's buckets:
    each parameter's gradient is placed on the main parameter that holds its range."""
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    ddp = DistributedDataParallel(model.config, ddp_config, model)
    config = OptimizerConfig(optimizer="adam", lr=1e-3, params_dtype=torch.float32, clip_grad=0.0,
                             use_distributed_optimizer=True)
    optimizer = get_megatron_optimizer(config, [ddp])
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    g = torch.Generator().manual_seed(200 + rank)
    for p in ddp.parameters():
        grad = torch.randn(p.shape, generator=g) * 0.01
        part = next(o for o in parts if p in o.model_param_group_index_map)
        group, order = part.model_param_group_index_map[p]
        main = part.optimizer.param_groups[group]["params"][order]
        span = part._get_model_param_range_map(p)["param"]
        main.grad = grad.view(-1)[span.start:span.end].clone()
    for part in parts:
        part.optimizer.step()
    return optimizer


def save_fully_reshardable(model, optimizer, directory, common):
    """DIR/distopt-full: the distributed optimizer's state as Megatron-LM saves it under
    --dist-ckpt-optim-fully-reshardable (torch_dist, its `fully_reshardable` layout: each
    parameter's state in the parameter's shape)."""
    iter_dir = os.path.join(directory, "distopt-full", f"iter_{ITERATION:07d}")
    if dist.get_rank() == 0:
        os.makedirs(iter_dir, exist_ok=True)
    dist.barrier()
    model_state = model.sharded_state_dict()
    metadata = {"distrib_optim_sharding_type": "fully_reshardable"}
    optimizer_state = optimizer.sharded_state_dict(model_state, metadata=metadata)
    dist_checkpointing.save(dict(common, model=model_state, optimizer=optimizer_state), iter_dir)
    dist.barrier()
    if dist.get_rank() == 0:
        tracker(os.path.join(directory, "distopt-full"))


def save_both(model, optimizer, directory, names, common, distributed=False):
    """Saves `model` and `optimizer` as Megatron-LM's training loop does: DIR/names[0] in the
    torch_dist format (dist_checkpointing.save of their sharded state with the common state; a
    distributed optimizer in its default `dp_reshardable` layout of its buckets) and DIR/names[1]
    in the legacy format (model_optim_rng.pt per model-parallel rank, with the distributed
    optimizer's buffers gathered into distrib_optim.pt beside it)."""
    dist_root, legacy_root = (os.path.join(directory, n) for n in names)
    iter_dir = os.path.join(dist_root, f"iter_{ITERATION:07d}")
    if dist.get_rank() == 0:
        os.makedirs(iter_dir, exist_ok=True)
    dist.barrier()
    model_state = model.sharded_state_dict()
    metadata = {"metadata": {"distrib_optim_sharding_type": "dp_reshardable"}} if distributed else {}
    optimizer_state = optimizer.sharded_state_dict(model_state, **metadata)
    dist_checkpointing.save(dict(common, model=model_state, optimizer=optimizer_state), iter_dir)
    tp, pp = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()
    shard = os.path.join(legacy_root, f"iter_{ITERATION:07d}", f"mp_rank_{tp:02d}_{pp:03d}")
    os.makedirs(shard, exist_ok=True)
    legacy_args = argparse.Namespace(**dict(vars(common["args"]), ckpt_format="torch",
                                            use_distributed_optimizer=distributed))
    torch.save(dict(common, args=legacy_args, model=model.state_dict_for_save_checkpoint(),
                    optimizer=optimizer.state_dict()),
               os.path.join(shard, "model_optim_rng.pt"))
    if distributed:
        optimizer.save_parameter_state(os.path.join(shard, "distrib_optim.pt"))
    dist.barrier()
    if dist.get_rank() == 0:
        tracker(dist_root)
        tracker(legacy_root)


def tracker(root):
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def make_rank(rank, world, directory, case):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TRIDENT_MCORE_PORT", "29611"))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    args = case_args(case, 2, 2)
    model = build(args)
    randomize(model, 100 + rank)
    optimizer = adam_step(model, rank)
    common = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
              "num_floating_point_operations_so_far": 0}
    save_both(model, optimizer, directory, ("dist", "legacy"), common)
    # The same model (the same seeds) after the same step by the distributed optimizer.
    model = build(args)
    randomize(model, 100 + rank)
    with cuda_type_names():
        optimizer = distributed_adam_step(model, rank)
        save_both(model, optimizer, directory, ("distopt", "legacy-distopt"), common, distributed=True)
        save_fully_reshardable(model, optimizer, directory, common)
    dist.destroy_process_group()


def latest(root):
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        return os.path.join(root, f"iter_{int(f.read().strip()):07d}")


def logits(ckpt, tokens, out, eod=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TRIDENT_MCORE_PORT", "29611"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    iter_dir = latest(ckpt)
    common = dist_checkpointing.load_common_state_dict(iter_dir)
    args = common["args"]
    args.tensor_model_parallel_size = args.pipeline_model_parallel_size = 1
    model = build(args)
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, iter_dir)
    model.load_state_dict(state["model"])
    model.eval()
    ids = torch.tensor([tokens], dtype=torch.long)
    positions = torch.arange(len(tokens)).unsqueeze(0)
    # Megatron's mask: True where a query may not attend (the future).
    mask = torch.triu(torch.ones(len(tokens), len(tokens)), diagonal=1).bool()[None, None]
    with torch.no_grad():
        out_logits = model(ids, positions, attention_mask=mask)[0].to(torch.float32).contiguous()
    out_logits.numpy().astype("<f4").tofile(out)
    if eod is not None:
        # --reset-position-ids: the position ids megatron-core's GPT dataset gives the sample.
        _, _, reset = _get_ltor_masks_and_position_ids(ids[0], eod, True, False, False, False)
        with torch.no_grad():
            out_logits = model(ids, reset.unsqueeze(0), attention_mask=mask)[0].to(torch.float32).contiguous()
        out_logits.numpy().astype("<f4").tofile(out + ".reset")
        # --reset-attention-mask too: the mask its dataset makes (True where a query may not look).
        docs_mask, _, reset = _get_ltor_masks_and_position_ids(ids[0], eod, True, True, False, True)
        with torch.no_grad():
            out_logits = model(ids, reset.unsqueeze(0), attention_mask=docs_mask.unsqueeze(0))[0]
        out_logits.to(torch.float32).contiguous().numpy().astype("<f4").tofile(out + ".docs")
    dist.destroy_process_group()


def main(argv):
    if argv[0] == "make":
        torch.multiprocessing.spawn(make_rank, args=(4, argv[1], argv[2]), nprocs=4, join=True)
    elif argv[0] == "logits":
        logits(argv[1], [int(t) for t in argv[2].split(",")], argv[3], int(argv[4]) if len(argv) > 4 else None)
    else:
        sys.exit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
