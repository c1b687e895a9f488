//! The data-parallel flags: `--use-distributed-optimizer` (ZeRO-1), Megatron FSDP's
//! `--data-parallel-sharding-strategy` (alone, or with `--use-megatron-fsdp`, whose default
//! strategy is `optim_grads_params`), and `--grad-reduce-in-bf16`.

use crate::cli::Args;
use crate::error::{Error, Result};

const FLAG: &str = "--data-parallel-sharding-strategy";

/// What the data-parallel ranks shard: `(optimizer state, gradients)`. `optim` (or
/// `--use-distributed-optimizer`) shards AdamW's state (ZeRO-1), `optim_grads` the gradients too
/// (ZeRO-2), `no_shard` neither; `optim_grads_params` (weights too) is refused, naming what runs.
pub(super) fn strategy(args: &Args) -> Result<(bool, bool)> {
    let zero1 = args.has("--use-distributed-optimizer");
    let strategy = match (args.str(FLAG), args.has("--use-megatron-fsdp")) {
        (Some(s), _) => s,
        (None, true) => {
            return Err(Error::Unsupported(format!(
                "--use-megatron-fsdp: its default strategy, {FLAG} optim_grads_params (weights sharded too), \
                 is not built yet (issue 53); {FLAG} optim_grads (ZeRO-2) and optim (ZeRO-1) run"
            )))
        }
        (None, false) => return Ok((zero1, false)),
    };
    match strategy {
        "optim" => Ok((true, false)),
        "optim_grads" => Ok((true, true)),
        "no_shard" if zero1 => Err(Error::Usage(format!(
            "{FLAG} no_shard keeps AdamW's state whole on every rank; --use-distributed-optimizer shards it: \
             drop one, or use {FLAG} optim"
        ))),
        "no_shard" => Ok((false, false)),
        "optim_grads_params" => Err(Error::Unsupported(format!(
            "{FLAG} optim_grads_params: not built yet: the weights stay whole on every rank (issue 53); \
             optim_grads (ZeRO-2), optim (ZeRO-1) and no_shard run"
        ))),
        other => Err(Error::flag(FLAG, other, "no_shard, optim, optim_grads or optim_grads_params")),
    }
}

/// `--grad-reduce-in-bf16`: the data-parallel gradient sums in bf16, with `--bf16` (Megatron's
/// scripts pair them; on a GPU the sums run on bf16 buffers).
pub(super) fn grad_reduce_in_bf16(args: &Args) -> Result<bool> {
    let on = args.has("--grad-reduce-in-bf16");
    if on && !args.has("--bf16") {
        return Err(Error::Usage(
            "--grad-reduce-in-bf16 sums the data-parallel gradients in bf16 and needs --bf16 (as Megatron's scripts \
             pair them)"
                .into(),
        ));
    }
    Ok(on)
}
