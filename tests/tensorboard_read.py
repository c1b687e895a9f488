"""Reads a --tensorboard-dir with TensorBoard's own EventAccumulator and prints every scalar as
a JSON line {"tag", "step", "value"}, for tests/tensorboard.rs. Usage: tensorboard_read.py DIR."""
import json
import sys
import warnings

warnings.filterwarnings("ignore")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
    acc.Reload()
    for tag in sorted(acc.Tags()["scalars"]):
        for e in acc.Scalars(tag):
            print(json.dumps({"tag": tag, "step": e.step, "value": e.value}))


if __name__ == "__main__":
    main()
