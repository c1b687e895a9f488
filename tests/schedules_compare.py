"""The reference side of tests/schedules.rs: megatron-core's OptimizerParamScheduler, built from
Megatron's training flags as megatron/training/training.py's get_optimizer_param_scheduler builds
it (iteration flags times the global batch; sample flags as they are), stepped by one global batch
per iteration. Prints, per iteration, the learning rate and weight decay that iteration trains with
(the scheduler's values before its step), and the rate of the embedding and output layer's group
(decoupled_lr's, as megatron-core's get_standard_config_overrides sets its max_lr and min_lr;
the first group's without it): one JSON list of [lr, wd, lr2] per case.

  schedules_compare.py CASES_JSON     a JSON list of cases, each Megatron's flags by their
                                      argument names: {"train_iters": .., "global_batch_size": .., ...}
"""
import json
import sys

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


class Optimizer:
    def __init__(self, groups):
        self.param_groups = groups


def schedule(a):
    g = a["global_batch_size"]
    if a.get("train_iters"):
        train_iters = a["train_iters"]
        decay = a.get("lr_decay_iters", train_iters) * g
        wd_steps = train_iters * g
        wsd = a["lr_wsd_decay_iters"] * g if "lr_wsd_decay_iters" in a else None
        warmup = a["lr_warmup_fraction"] * decay if "lr_warmup_fraction" in a else a.get("lr_warmup_iters", 0) * g
    else:
        train_iters = a["train_samples"] // g
        decay = a.get("lr_decay_samples", a["train_samples"])
        wd_steps = a["train_samples"]
        wsd = a.get("lr_wsd_decay_samples")
        warmup = a["lr_warmup_fraction"] * decay if "lr_warmup_fraction" in a else a.get("lr_warmup_samples", 0)
    wd = a.get("weight_decay", 0.01)
    groups = [{}]
    if "decoupled_lr" in a:
        groups.append({"max_lr": a["decoupled_lr"], "min_lr": a.get("decoupled_min_lr", a.get("min_lr", 0.0))})
    s = OptimizerParamScheduler(
        Optimizer(groups),
        init_lr=a.get("lr_warmup_init", 0.0),
        max_lr=a["lr"],
        min_lr=a.get("min_lr", 0.0),
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        lr_decay_style=a.get("lr_decay_style", "linear"),
        start_wd=a.get("start_weight_decay", wd),
        end_wd=a.get("end_weight_decay", wd),
        wd_incr_steps=wd_steps,
        wd_incr_style=a.get("weight_decay_incr_style", "constant"),
        use_checkpoint_opt_param_scheduler=False,
        wsd_decay_steps=wsd,
        lr_wsd_decay_style=a.get("lr_wsd_decay_style", "exponential"),
    )
    out = []
    for _ in range(train_iters):
        group, last = s.optimizer.param_groups[0], s.optimizer.param_groups[-1]
        out.append([group["lr"], group["weight_decay"], last["lr"]])
        s.step(increment=g)
    return out


def main():
    print(json.dumps([schedule(a) for a in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
