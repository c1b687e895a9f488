"""Builds the train/valid/test datasets with megatron-core's BlendedMegatronDatasetBuilder and
GPTDataset (or MockGPTDataset) and writes their samples as `trident check data --dump` writes
them, for tests/datasets.rs. Usage: datasets_compare.py SPEC_JSON OUT_JSONL [SPEC_JSON OUT_JSONL ...]
(several pairs in one run: megatron-core takes seconds to import), where each SPEC has
seed, seq_length, counts [train, valid, test], per_split_samples, vocab, eod, surplus, and one
of: "data_path" (a list, with "split"), "per_split" ([list or null] x 3) or "mock": true."""
import json
import sys
import warnings

warnings.filterwarnings("ignore")

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import get_blend_from_list


class Tokenizer:
    """What the GPT datasets read of a tokenizer."""

    def __init__(self, vocab, eod):
        self.vocab_size = vocab
        self.eod = eod
        self.pad = -1
        self.unique_identifiers = {"class": "Tokenizer", "vocab": vocab, "eod": eod}


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: datasets_compare.py SPEC_JSON OUT_JSONL [SPEC_JSON OUT_JSONL ...]")
    for spec, out in zip(args[::2], args[1::2]):
        write_samples(json.loads(spec), out)


def write_samples(spec, out_path):
    blend, per_split, split, mock = None, None, None, bool(spec.get("mock"))
    if "data_path" in spec:
        blend = get_blend_from_list(spec["data_path"])
        split = spec["split"]
    elif "per_split" in spec:
        per_split = [get_blend_from_list(x) for x in spec["per_split"]]
    config = GPTDatasetConfig(
        random_seed=spec["seed"],
        sequence_length=spec["seq_length"],
        blend=blend,
        blend_per_split=per_split,
        split=split,
        path_to_cache=None,
        tokenizer=Tokenizer(spec["vocab"], spec["eod"]),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        mid_level_dataset_surplus=spec["surplus"],
    )
    cls = MockGPTDataset if mock else GPTDataset
    datasets = BlendedMegatronDatasetBuilder(cls, spec["counts"], lambda: True, config).build()
    with open(out_path, "w") as out:
        for name, ds, count in zip(["train", "valid", "test"], datasets, spec["counts"]):
            # trident builds no dataset for a split nothing is asked of.
            if ds is None or count == 0:
                continue
            for i in range(min(spec["per_split_samples"], len(ds))):
                item = ds[i]
                tokens = item["tokens"].tolist() + [int(item["labels"][-1])]
                out.write(json.dumps({"split": name, "sample": i, "tokens": tokens}) + "\n")


if __name__ == "__main__":
    main()
