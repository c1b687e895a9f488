//! The data-parallel flags: `--use-distributed-optimizer` (ZeRO-1), Megatron FSDP's
//! `--data-parallel-sharding-strategy` (alone, or with `--use-megatron-fsdp`, whose default
//! strategy is `optim_grads_params`), and `--grad-reduce-in-bf16`.

use crate::cli::Args;
use crate::error::{Error, Result};

const FLAG: &str = "--data-parallel-sharding-strategy";

/// Whether AdamW's state is sharded over the data-parallel ranks: `optim` (or
/// `--use-distributed-optimizer`) shards it, `no_shard` keeps it whole; the strategies that also
/// shard gradients and weights are refused, naming what runs instead.
pub(super) fn distributed_optimizer(args: &Args) -> Result<bool> {
    let zero1 = args.has("--use-distributed-optimizer");
    let strategy = match (args.str(FLAG), args.has("--use-megatron-fsdp")) {
        (Some(s), _) => s,
        (None, true) => {
            return Err(Error::Unsupported(format!(
                "--use-megatron-fsdp: its default strategy, {FLAG} optim_grads_params (weights and gradients \
                 sharded too), is not built yet (issue 53); {FLAG} optim runs (ZeRO-1)"
            )))
        }
        (None, false) => return Ok(zero1),
    };
    match strategy {
        "optim" => Ok(true),
        "no_shard" if zero1 => Err(Error::Usage(format!(
            "{FLAG} no_shard keeps AdamW's state whole on every rank; --use-distributed-optimizer shards it: \
             drop one, or use {FLAG} optim"
        ))),
        "no_shard" => Ok(false),
        "optim_grads" | "optim_grads_params" => Err(Error::Unsupported(format!(
            "{FLAG} {strategy}: not built yet: gradients (optim_grads) and weights (optim_grads_params) stay whole \
             on every rank (issue 53); optim (ZeRO-1: AdamW's state sharded) and no_shard run"
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
