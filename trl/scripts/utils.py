# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What training scripts share, with TRL 1.16's names: `TrlParser` (flags plus a `--config file.yaml` whose values
the command line overrides), `ScriptArguments`, dataset mixtures (`DatasetMixtureConfig`, `get_dataset`), loading a
dataset from a local path, and `init_zero_verbose`."""

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml
from datasets import (
    Dataset,
    DatasetDict,
    IterableDataset,
    IterableDatasetDict,
    ReadInstruction,
    concatenate_datasets,
    load_dataset,
    load_from_disk,
)
from transformers import HfArgumentParser

from trl.models.utils import PathNotFoundError, explain_missing_path, one_line


logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments:
    """
    The data side of a training script (TRL 1.16's fields and defaults).

    Args:
        dataset_name (`str`, *optional*):
            The dataset: a folder written by `save_to_disk`, a `.json`/`.jsonl`/`.parquet`/`.csv` file, a folder of
            such files, or a Hub id (needs the network). Not needed, and ignored, when a `datasets:` mixture
            ([`DatasetMixtureConfig`]) is given.
        dataset_config (`str`, *optional*):
            Configuration name of a Hub dataset (the `name` argument of `datasets.load_dataset`).
        dataset_train_split (`str`, *optional*, defaults to `"train"`):
            The split to train on.
        dataset_test_split (`str`, *optional*, defaults to `"test"`):
            The split to evaluate on; read only when evaluation is on (`eval_strategy` other than `"no"`).
        dataset_streaming (`bool`, *optional*, defaults to `False`):
            Load the dataset as an `IterableDataset` (streamed, never held in memory as a whole).
        ignore_bias_buffers (`bool`, *optional*, defaults to `False`):
            A DDP workaround kept for TRL compatibility: tell DDP to skip boolean buffers (causal masks) when it
            broadcasts buffers (https://github.com/huggingface/transformers/issues/22482). `trl grpo` does not read
            it.
    """

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Local dataset folder/file, or a Hub id; ignored when a `datasets:` mixture is given."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration name of a Hub dataset (load_dataset's `name`)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(
        default="test", metadata={"help": "Split to evaluate on (read only when eval_strategy is not 'no')."}
    )
    dataset_streaming: bool = field(
        default=False, metadata={"help": "Load the dataset as a streamed IterableDataset."}
    )
    ignore_bias_buffers: bool = field(
        default=False,
        metadata={"help": "DDP workaround: skip boolean mask buffers when broadcasting buffers (TRL compatibility)."},
    )


@dataclass
class DatasetConfig:
    """
    One dataset of a [`DatasetMixtureConfig`]; the fields are `datasets.load_dataset`'s arguments.

    Parameters:
        path (`str`):
            A Hub id, a builder name (`"json"`, `"parquet"`, `"csv"`, with `data_files`), or a local path: a folder
            written by `save_to_disk`, a `.json`/`.jsonl`/`.parquet`/`.csv` file (its one split is `"train"`), or a
            folder of data files.
        name (`str`, *optional*):
            Configuration name of a Hub dataset.
        data_dir (`str`, *optional*):
            Folder (inside `path`) to read the data files from.
        data_files (`str`, `list[str]` or `dict[str, str]`, *optional*):
            The data file(s) to read.
        split (`str`, *optional*, defaults to `"train"`):
            The split to take, e.g. `"train"` or `"train[:100]"`.
        columns (`list[str]`, *optional*):
            Keep only these columns; `None` keeps them all.
        fraction (`float`, *optional*):
            This dataset's share of the mixture. Set it for every dataset of the mixture or for none. The shares
            are normalised to sum to 1 and the mixture is made as large as possible without repeating a row: each
            dataset contributes its first `round(share × N)` rows. Not available with streaming. `None` everywhere
            concatenates the datasets whole.
    """

    path: str
    name: str | None = None
    data_dir: str | None = None
    data_files: str | list[str] | dict[str, str] | None = None
    split: str = "train"
    columns: list[str] | None = None
    fraction: float | None = None


@dataclass
class DatasetMixtureConfig:
    """
    A training set made of several datasets, concatenated in the order given (see [`get_dataset`]). It is written as
    a YAML section of the `--config` file:

    ```yaml
    datasets:
      - path: prompts_a.jsonl
        columns: [prompt, answer]
      - path: trl-lib/DeepMath-103K
        split: train[:1000]
    streaming: false
    test_split_size: 0.1
    ```

    Parameters:
        datasets (`list[DatasetConfig]`):
            The datasets, in order. A mapping (as the YAML file gives) becomes a [`DatasetConfig`].
        streaming (`bool`, *optional*, defaults to `False`):
            Load every dataset as a streamed `IterableDataset`.
        test_split_size (`float` or `int`, *optional*):
            Split the mixture into `"train"` and `"test"`: a fraction of the rows (`0.1`) or a number of rows
            (`datasets.Dataset.train_test_split`'s `test_size`). `None` keeps everything in `"train"`.
    """

    datasets: list[DatasetConfig] = field(
        default_factory=list, metadata={"help": "Datasets of the mixture, in order (a YAML list of mappings)."}
    )
    streaming: bool = field(default=False, metadata={"help": "Load the mixture's datasets as streamed datasets."})
    test_split_size: float | None = field(
        default=None,
        metadata={"help": "Split the mixture into train/test: a fraction or a number of test rows (none by default)."},
    )

    def __post_init__(self):
        self.datasets = [DatasetConfig(**item) if isinstance(item, dict) else item for item in self.datasets]


# What `trl grpo` reports as one line when raised before training starts (PathNotFoundError is a FileNotFoundError).
CONFIG_ERRORS = (ValueError, FileNotFoundError)
TRACEBACK_FLAG, TRACEBACK_ENV = "--traceback", "TRL_TRACEBACK"


def wants_traceback(argv: list[str]) -> bool:
    """`--traceback` is in `argv` or `TRL_TRACEBACK` is set to something other than "", "0", "false" or "no"."""
    return TRACEBACK_FLAG in argv or os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _warning_as_log_record(message, category, filename, lineno, file=None, line=None):
    """Stands in for `warnings.showwarning`: the warning is logged by the root logger, at WARNING level, as
    `path:line: Category: message`, so the logging configuration decides whether it is shown."""
    logging.getLogger().warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)


def init_zero_verbose():
    """Quiet logging for a command-line script: only errors are logged (through Rich when it is installed, in the
    format `[time] message`), and Python warnings are routed into the logging system instead of printed. Call it
    before importing the libraries whose output it should silence."""
    import warnings

    from transformers.utils import is_rich_available

    if is_rich_available():
        from rich.logging import RichHandler as handler_class
    else:
        handler_class = logging.StreamHandler
    logging.basicConfig(level=logging.ERROR, handlers=[handler_class()], format="%(message)s", datefmt="[%X]")
    warnings.showwarning = _warning_as_log_record


def _parser_actions(parser: argparse.ArgumentParser):
    """Every action of `parser` and, in place of a subcommand action, every action of its subcommands' parsers."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            yield action
            continue
        for subparser in action.choices.values():
            yield from _parser_actions(subparser)


class TrlParser(HfArgumentParser):
    """An `HfArgumentParser` that also reads `--config file.yaml`.

    The file maps flag names to values; they replace the dataclasses' defaults, and flags given on the command line
    override them. Its optional `env:` mapping sets environment variables before parsing.

    ```yaml
    env:
      WANDB_PROJECT: grpo
    learning_rate: 1.0e-6
    ```

    Args:
        dataclass_types (dataclass type or iterable of them, *optional*):
            The dataclasses to parse into, in the order `parse_args_and_config` returns them.
        **kwargs:
            Passed to `HfArgumentParser` (and on to `argparse.ArgumentParser`: `prog`, `description`, ...).

    Raises:
        ValueError: if a dataclass has a field named `config` (the name is taken by `--config`).
    """

    def __init__(self, dataclass_types=None, **kwargs):
        if dataclass_types is None:
            types = []
        else:  # one dataclass, or several
            types = list(dataclass_types) if isinstance(dataclass_types, Iterable) else [dataclass_types]
        clashing = [cls.__name__ for cls in types if any(f.name == "config" for f in dataclasses.fields(cls))]
        if clashing:
            raise ValueError(
                f"{clashing[0]} has a field named 'config', which TrlParser keeps for the `--config FILE.yaml` "
                "flag: rename the field."
            )
        super().__init__(dataclass_types=types, **kwargs)

    def error(self, message: str):
        """A bad flag (unknown, a wrong type, not one of the choices): one line `<prog>: error: <message>` on stderr
        and exit status 2, as argparse, but without the usage of every flag (hundreds of lines for `trl grpo`)."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")

    def parse_args_and_config(
        self,
        args: Iterable[str] | None = None,
        return_remaining_strings: bool = False,
        fail_with_unknown_args: bool = True,
        separate_remaining_strings: bool = False,
    ) -> tuple:
        """Parse `args` (default `sys.argv[1:]`) into the dataclasses, with defaults from `--config FILE.yaml`.

        Keys of the file that no dataclass has become strings `["--key", "value", ...]`: returned as the last item
        with `return_remaining_strings=True` (after the command line's own leftovers; as a separate item before
        them with `separate_remaining_strings=True`), an error with `fail_with_unknown_args=True` (the default),
        ignored otherwise. Unknown command-line flags are an error unless `return_remaining_strings` is set.

        Raises:
            PathNotFoundError: if the config file does not exist.
            ValueError: if `--config` has no file name, the file is not valid YAML or not a mapping, its `env` is
                not a mapping, it has unknown keys (see above), or the command line has unknown flags.
        """
        args = list(sys.argv[1:] if args is None else args)
        args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
        config_remaining = []
        if "--config" in args:
            index = args.index("--config")
            if index + 1 == len(args) or args[index + 1].startswith("--"):
                raise ValueError("--config needs the path of a YAML file: `--config FILE.yaml`.")
            config = read_yaml_config(args[index + 1])
            del args[index : index + 2]
            env = config.pop("env", {})
            if not isinstance(env, dict):
                raise ValueError(
                    f"`env` field should be a dict in the YAML file (variable names to values), got {env!r}."
                )
            for key, value in env.items():
                os.environ[str(key)] = str(value)
            config_remaining = self.set_defaults_with_config(**config)
            if config_remaining and fail_with_unknown_args and not return_remaining_strings:
                unknown = sorted(item[2:] for item in config_remaining[::2])
                raise ValueError(
                    f"Unknown arguments from config file: {unknown}. No flag has these names: remove or rename them "
                    "(or parse with `fail_with_unknown_args=False` to ignore them)."
                )
        output = self.parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings)
        if not return_remaining_strings:
            return output
        if separate_remaining_strings:
            return (*output[:-1], config_remaining, output[-1])
        return (*output[:-1], config_remaining + output[-1])

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        """Make each `kwargs` value the default of the flag with that name (in subparsers too), and no longer
        required; returns `["--key", "str(value)", ...]` for the keys no flag takes."""
        taken = set()
        for action in _parser_actions(self):
            if action.dest in kwargs:
                action.default = kwargs[action.dest]
                action.required = False
                taken.add(action.dest)
        leftover = []
        for key, value in kwargs.items():
            if key not in taken:
                leftover += [f"--{key}", str(value)]
        return leftover


def read_yaml_config(path: str) -> dict:
    """The mapping in the YAML file `path`.

    Raises:
        PathNotFoundError: if the file does not exist.
        ValueError: if it is not valid YAML, or holds something other than a mapping.
    """
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
            f"Config file {path!r} must contain a YAML mapping (flag names to values), not a {type(config).__name__}."
        )
    return config


_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in ("dataset_info.json", "dataset_dict.json")
    )


def _data_file_builder(path: str) -> str | None:
    """The `datasets` builder of a local data file (`"json"` for `.jsonl`), or `None` when `path` is not one."""
    extension = os.path.splitext(path)[1].lower()
    return _FILE_BUILDERS.get(extension) if os.path.isfile(path) else None


def _stream_saved(saved: Dataset | DatasetDict) -> IterableDataset | IterableDatasetDict:
    if isinstance(saved, Dataset):
        return saved.to_iterable_dataset()
    return IterableDatasetDict({split: part.to_iterable_dataset() for split, part in saved.items()})


def _load_local(path: str, split: str | None = None, streaming: bool = False):
    """Read `path` when it is a `save_to_disk` folder or a single local data file; `None` when it is neither.

    Without `split`, the whole `DatasetDict` (`IterableDatasetDict` with `streaming`), where a lone saved `Dataset`
    or a data file is split `"train"`; with `split`, that one split, which may be a slice (`"train[:100]"`,
    `"train[10%:]+test"`). A streamed data file takes plain split names only (`datasets` refuses slices there).

    Raises:
        ValueError: if there is no split `split` (naming the splits there are).
    """
    if _is_saved_dataset(path):
        saved = load_from_disk(path)
        splits = DatasetDict({"train": saved}) if isinstance(saved, Dataset) else saved
        if split is None:
            return _stream_saved(splits) if streaming else splits
        part = dataset_split(splits, split, path)
        return part.to_iterable_dataset() if streaming else part
    builder = _data_file_builder(path)
    if builder is None:
        return None
    return load_dataset(builder, data_files={"train": path}, split=split, streaming=streaming)


def load_dataset_from_path(
    name: str, config: str | None = None, streaming: bool = False
) -> DatasetDict | IterableDatasetDict:
    """Load a dataset from a local path (or the Hub) as a `DatasetDict` (an `IterableDatasetDict` with
    `streaming=True`); a single data file, or a `save_to_disk` folder of one `Dataset`, becomes split `"train"`.

    Raises:
        PathNotFoundError: if `name` is not an existing local path and could not be loaded from the Hub either.
    """
    local = _load_local(name, streaming=streaming)
    if local is not None:
        return local
    with explain_missing_path(name, "Dataset"):
        return load_dataset(name, config, streaming=streaming)


def dataset_split(dataset: DatasetDict | IterableDatasetDict, split: str, name: str) -> Dataset | IterableDataset:
    """`dataset[split]`, where `split` may also be a slice in `datasets`' split syntax (`"train[:100]"`,
    `"train[10%:20%]"`, `"train+test"`) when `dataset` is a `DatasetDict` (a streamed one has no length to slice).

    Raises:
        ValueError: naming the splits there are, if `dataset` has no split `split` (or no split that the slice
            names); if the slice is malformed, or `dataset` is streamed and `split` is a slice.
    """
    if split in dataset:
        return dataset[split]
    named = [piece.split("[", 1)[0].strip() for piece in split.split("+")]  # "train[:10]+test" -> train, test
    missing = [piece for piece in named if piece not in dataset]
    if missing:
        raise ValueError(f"The dataset {name!r} has no split {missing[0]!r}; its splits are {sorted(dataset)}.")
    if not isinstance(dataset, DatasetDict):
        raise ValueError(f"The split {split!r} of {name!r} is a slice, which a streamed dataset cannot take.")
    sizes = {key: len(part) for key, part in dataset.items()}
    try:
        ranges = ReadInstruction.from_spec(split).to_absolute(sizes)
    except (ValueError, AssertionError) as error:
        raise ValueError(f"The split {split!r} of {name!r} is not a valid slice: {error}") from error
    return concatenate_datasets([dataset[r.splitname].select(range(r.from_, r.to)) for r in ranges])


def load_mixture_part(dataset_config: DatasetConfig, streaming: bool = False) -> Dataset | IterableDataset:
    """One split of one dataset of a mixture. A `save_to_disk` folder and a single local data file (given as
    `path`, without `data_dir`/`data_files`) are read directly (a saved folder's split may be a slice such as
    `"train[:100]"`); anything else goes to `datasets.load_dataset`.

    Raises:
        ValueError: if the dataset has no split `dataset_config.split`.
        PathNotFoundError: if `path` is not an existing local path and could not be loaded from the Hub either.
    """
    path, split = dataset_config.path, dataset_config.split
    if dataset_config.data_dir is None and dataset_config.data_files is None:
        local = _load_local(path, split, streaming)
        if local is not None:
            return local
    with explain_missing_path(path, "Dataset"):
        return load_dataset(
            path,
            name=dataset_config.name,
            data_dir=dataset_config.data_dir,
            data_files=dataset_config.data_files,
            split=split,
            streaming=streaming,
        )


def get_dataset(mixture_config: DatasetMixtureConfig) -> DatasetDict | IterableDatasetDict:
    """The datasets of `mixture_config` concatenated in order (each reduced to its `columns`, and cut to its
    `fraction` of the mixture when fractions are set), as split `"train"`; or split into `"train"` and `"test"`
    (`datasets.Dataset.train_test_split`, shuffled, unseeded as in TRL) when `test_split_size` is set. With
    `streaming`, an `IterableDatasetDict` with split `"train"`.

    Raises:
        ValueError: if the mixture has no datasets; if `fraction` is set for some datasets but not all, or is set
            with `streaming`; if `test_split_size` is set with `streaming` (a stream cannot be split); if a dataset
            has no split `split` (or its slice is malformed), the message naming the splits it has; or from
            `datasets` when the datasets' columns do not match.
        PathNotFoundError: if a dataset's `path` is not an existing local path and could not be loaded from the
            Hub either.
    """
    if not mixture_config.datasets:
        raise ValueError(
            "No datasets were loaded from the mixture configuration: list at least one dataset under `datasets:`."
        )
    streaming = mixture_config.streaming
    fractions = [dataset_config.fraction for dataset_config in mixture_config.datasets]
    if any(fraction is not None for fraction in fractions):
        if None in fractions:
            raise ValueError(
                f"`fraction` must be set for either all datasets in the mixture or none of them (got {fractions})."
            )
        if streaming:
            raise ValueError(
                "Using a dataset `fraction` is not supported with streaming datasets: a streamed dataset has no "
                "length to take a share of."
            )
    if streaming and mixture_config.test_split_size is not None:
        raise ValueError("`test_split_size` cannot be used with `streaming`: a streamed dataset cannot be split.")
    parts = []
    for dataset_config in mixture_config.datasets:
        logger.info(f"Loading {dataset_config.path!r} (split {dataset_config.split!r}) for the dataset mixture")
        part = load_mixture_part(dataset_config, streaming)
        parts.append(part.select_columns(dataset_config.columns) if dataset_config.columns is not None else part)
    if fractions[0] is not None:
        shares = [fraction / sum(fractions) for fraction in fractions]
        # The largest mixture size N for which no dataset has to give more rows than it has.
        size = min(len(part) / share for part, share in zip(parts, shares) if share > 0)
        parts = [part.select(range(round(share * size))) for part, share in zip(parts, shares)]
    mixture = concatenate_datasets(parts)
    if streaming:
        return IterableDatasetDict({"train": mixture})
    if mixture_config.test_split_size is not None:
        return mixture.train_test_split(test_size=mixture_config.test_split_size)
    return DatasetDict({"train": mixture})
