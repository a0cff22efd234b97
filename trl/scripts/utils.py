# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Argument parsing with `--config file.yaml` (command-line flags win) and loading datasets from local paths."""

import os
import sys
from dataclasses import dataclass, field

import yaml
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from transformers import HfArgumentParser


@dataclass
class ScriptArguments:
    """Arguments of the data side of a training script.

    Args:
        dataset_name: a dataset saved with `save_to_disk`, a `.json`/`.jsonl`/`.parquet`/`.csv` file, a folder of
            such files, or a hub id (needs network).
        dataset_config: dataset configuration name (hub datasets only).
        dataset_train_split, dataset_test_split: split names.
    """

    dataset_name: str = field(metadata={"help": "Local dataset folder/file, or hub id."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    dataset_test_split: str | None = field(default=None, metadata={"help": "Evaluation split (none by default)."})


class TrlParser(HfArgumentParser):
    """`HfArgumentParser` that also reads `--config file.yaml`; flags given on the command line override the file."""

    def parse_args_and_config(self, args: list[str] | None = None):
        args = list(sys.argv[1:] if args is None else args)
        args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
        if "--config" in args:
            index = args.index("--config")
            with open(args[index + 1], encoding="utf-8") as f:
                config = yaml.safe_load(f) or {}
            del args[index : index + 2]
            known = {action.dest for action in self._actions}
            unknown = sorted(set(config) - known)
            if unknown:
                raise ValueError(f"Unknown keys in the config file: {unknown}.")
            for action in self._actions:
                if action.dest in config:
                    action.required = False
            self.set_defaults(**config)
        return self.parse_args_into_dataclasses(args=args)


_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_dataset_from_path(name: str, config: str | None = None) -> DatasetDict:
    """Load a dataset from a local path (or the hub) as a `DatasetDict` (a single file becomes split `"train"`)."""
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_info.json"))
        or os.path.exists(os.path.join(name, "dataset_dict.json"))
    ):
        loaded = load_from_disk(name)
        return DatasetDict({"train": loaded}) if isinstance(loaded, Dataset) else loaded
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in _FILE_BUILDERS:
        return load_dataset(_FILE_BUILDERS[extension], data_files={"train": name})
    return load_dataset(name, config)
