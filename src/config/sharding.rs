//! The data-parallel sharding flags: `--use-distributed-optimizer` (ZeRO-1), and Megatron FSDP's
//! `--data-parallel-sharding-strategy` (alone, or with `--use-megatron-fsdp`, whose default
//! strategy is `optim_grads_params`).

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
