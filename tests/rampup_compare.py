"""The reference side of tests/rampup.rs: megatron-core's RampupBatchsizeNumMicroBatchesCalculator,
run as Megatron-LM's training.py runs it. The iteration count of a --train-samples run is
update_train_iters' (Megatron-LM before the step schedules replaced ramp-up: the ramp loop while
the consumed samples are at most the ramp's and the run's, then whole global batches); each
iteration updates the calculator at the samples consumed before it (with the consistency check)
and consumes data-parallel size x micro-batch x micro-batches. Prints one JSON list per case of
[the batch trained, micro-batches per data-parallel rank] for every iteration (the running batch:
the global batch, rounded down to whole micro-batches under decrease_batch_size_if_needed).

  rampup_compare.py CASES_JSON    a JSON list of cases: {"start": .., "increment": .., "samples": ..,
                                  "global_batch_size": .., "micro_batch_size": .., "data_parallel_size": ..,
                                  "train_samples": .., "decrease": true|false}
"""
import json
import sys

from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator


def run(a):
    calc = RampupBatchsizeNumMicroBatchesCalculator(
        a["global_batch_size"], a["micro_batch_size"], a["data_parallel_size"], a["decrease"], 0,
        a["start"], a["increment"], a["samples"])
    # update_train_iters.
    iterations, consumed = 0, 0
    while consumed <= a["samples"] and consumed <= a["train_samples"]:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    calc.update(0, consistency_check=False)
    if a["train_samples"] > consumed:
        iterations += (a["train_samples"] - consumed) // a["global_batch_size"]
    # train(): one update per iteration, then the samples the iteration consumed.
    out, consumed = [], 0
    for _ in range(iterations):
        calc.update(consumed, consistency_check=True)
        micro = calc.get()
        batch = a["data_parallel_size"] * a["micro_batch_size"] * micro
        assert batch == calc.get_current_running_global_batch_size()
        out.append([batch, micro])
        consumed += batch
    return out


def main():
    print(json.dumps([run(a) for a in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
