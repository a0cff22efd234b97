# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Argument parsing with `--config file.yaml` (command-line flags win) and loading datasets from local paths."""

import os
import sys
from dataclasses import dataclass, field

import yaml
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from transformers import HfArgumentParser

from trl.models.utils import PathNotFoundError, explain_missing_path, one_line


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
        """Parse `args` (default `sys.argv[1:]`) into the dataclasses, with defaults from `--config FILE.yaml`.

        Raises:
            PathNotFoundError: if the config file does not exist.
            ValueError: if `--config` has no file name, the file is not a YAML mapping, or it has unknown keys.
        """
        args = list(sys.argv[1:] if args is None else args)
        args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
        if "--config" in args:
            index = args.index("--config")
            if index + 1 == len(args) or args[index + 1].startswith("--"):
                raise ValueError("--config needs the path of a YAML file: `--config FILE.yaml`.")
            path = args[index + 1]
            if not os.path.isfile(path):
                raise PathNotFoundError(f"The config file {path!r} does not exist.")
            with open(path, encoding="utf-8") as f:
                try:
                    config = yaml.safe_load(f) or {}
                except yaml.YAMLError as error:
                    raise ValueError(
                        f"The config file {path!r} is not valid YAML ({one_line(error, with_type=True, first_only=True)})"
                    ) from error
            if not isinstance(config, dict):
                raise ValueError(
                    f"The config file {path!r} must hold a mapping of flag names to values, not a "
                    f"{type(config).__name__}."
                )
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
    """Load a dataset from a local path (or the hub) as a `DatasetDict` (a single file becomes split `"train"`).

    Raises:
        PathNotFoundError: if `name` is not an existing local path and could not be loaded from the Hub either.
    """
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_info.json"))
        or os.path.exists(os.path.join(name, "dataset_dict.json"))
    ):
        loaded = load_from_disk(name)
        return DatasetDict({"train": loaded}) if isinstance(loaded, Dataset) else loaded
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in _FILE_BUILDERS:
        return load_dataset(_FILE_BUILDERS[extension], data_files={"train": name})
    with explain_missing_path(name, "Dataset"):
        return load_dataset(name, config)


def dataset_split(dataset: DatasetDict, split: str, name: str) -> Dataset:
    """`dataset[split]`.

    Raises:
        ValueError: naming the splits there are, if `dataset` has no split `split`.
    """
    if split not in dataset:
        raise ValueError(f"The dataset {name!r} has no split {split!r}; its splits are {sorted(dataset)}.")
    return dataset[split]


@dataclass
class DatasetMixtureConfig:  # STUB: being written
    datasets: list | None = None


def get_dataset(mixture_config):  # STUB: being written
    raise NotImplementedError


def init_zero_verbose():  # STUB: being written
    raise NotImplementedError
