# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: train a causal LM with (iterative) GRPO from the command line or a YAML config, with TRL 1.16's
flags (model, LoRA and quantization flags from `ModelConfig`, dataset mixtures, `--reward_funcs` names).

Example:
    trl grpo --model_name_or_path ./tiny --dataset_name prompts.jsonl \
        --reward_funcs trl.tasks.arithmetic.accuracy_reward \
        --sync_ref_model --ref_model_sync_steps 25 --ref_model_mixup_alpha 0.6 --output_dir out

`main(script_args, training_args, model_args, dataset_args)` is TRL 1.16's entry point (parsed dataclasses in,
trains); `run(argv)` parses and calls it. Both raise every error (for use from Python); `command(argv)`, what the
`trl grpo` command runs, turns a configuration error raised by `build_trainer` into one `trl grpo: error: ...` line.
"""

import argparse
import importlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field

from trl import rewards
from trl.scripts.utils import (
    CONFIG_ERRORS,
    TRACEBACK_FLAG,
    DatasetMixtureConfig,
    ScriptArguments,
    TrlParser,
    dataset_split,
    get_dataset,
    load_dataset_from_path,
    one_line,
    read_yaml_config,
    wants_traceback,
)
from trl.tasks import arithmetic
from trl.trainer import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config, get_quantization_config


logger = logging.getLogger(__name__)

# TRL 1.16's `--reward_funcs` names, with the arguments its script gives the overlong-punishment factory.
TRL_REWARDS = {
    "accuracy_reward": rewards.accuracy_reward,
    "reasoning_accuracy_reward": rewards.reasoning_accuracy_reward,
    "think_format_reward": rewards.think_format_reward,
    "get_soft_overlong_punishment": rewards.get_soft_overlong_punishment(
        max_completion_len=1280, soft_punish_cache=256
    ),
}
# Plus two of the demo task's integer-answer rewards (its `accuracy_reward` is `trl.tasks.arithmetic.accuracy_reward`:
# the bare name is TRL's math-verify reward).
BUILTIN_REWARDS = {
    **TRL_REWARDS,
    "answer_reward": arithmetic.answer_reward,
    "closeness_reward": arithmetic.closeness_reward,
}


@dataclass
class GRPOScriptArguments(ScriptArguments):
    """
    The GRPO script's arguments: [`ScriptArguments`] plus the rewards.

    Args:
        reward_model_name_or_path (`str`, *optional*):
            A sequence-classification reward model (local folder or Hub id), scored before the `reward_funcs`.
        reward_funcs (`list[str]`, *optional*):
            Reward functions, each one of: TRL's names `accuracy_reward`, `reasoning_accuracy_reward`,
            `think_format_reward`, `get_soft_overlong_punishment` (built with `max_completion_len=1280`,
            `soft_punish_cache=256`), the demo's `answer_reward` and `closeness_reward`; a dotted import path
            (`my_lib.rewards.custom_reward`, importable from the current folder) or `my_lib.rewards:custom_reward`;
            or a reward-model folder.
    """

    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Sequence-classification reward model (local folder or Hub id), scored first."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: accuracy_reward, reasoning_accuracy_reward, think_format_reward, "
            "get_soft_overlong_punishment (max_completion_len=1280, soft_punish_cache=256), answer_reward, "
            "closeness_reward, a dotted import path 'my_lib.rewards.custom_reward' (or 'my_lib.rewards:custom_reward'), "
            "or a reward-model folder."
        },
    )


def _import_reward(name: str, module_name: str, function: str):
    if os.getcwd() not in sys.path:  # as TRL: `my_lib.rewards.custom_reward` is found from the current folder
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"Cannot import the module of reward function {name!r}: {error}") from error
    if not callable(getattr(module, function, None)):
        raise ValueError(f"Reward function {name!r}: module {module_name!r} has no function {function!r}.")
    return getattr(module, function)


def resolve_reward_func(name: str):
    """A built-in reward name (TRL's four, `answer_reward`, `closeness_reward`), a reward-model folder (kept as a
    string), `module:function`, or a dotted import path `package.module.function`, in that order.

    Raises:
        ValueError: if `name` is none of these, or its module cannot be imported or has no such function.
    """
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if os.path.isdir(name):  # before the dotted form: "./rm" or "rm-v1.5" are folders, not modules
        return name
    if ":" in name:
        return _import_reward(name, *name.split(":", 1))
    if "." in name.strip("."):
        return _import_reward(name, *name.rsplit(".", 1))
    raise ValueError(
        f"Could not load reward function {name!r}: it is not a built-in name (one of {sorted(BUILTIN_REWARDS)}), "
        "a dotted import path 'package.module.function' (or 'package.module:function'), or a reward-model folder."
    )


def reward_sources(script_args: GRPOScriptArguments) -> list:
    """`--reward_model_name_or_path` (first, as in TRL), then each `--reward_funcs` entry resolved.

    Raises:
        ValueError: if neither is given, or an entry cannot be resolved (see `resolve_reward_func`).
    """
    sources = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    sources += [resolve_reward_func(name) for name in script_args.reward_funcs or []]
    if not sources:
        raise ValueError(
            "No reward source provided: give --reward_funcs (e.g. accuracy_reward, or my_module.my_reward) and/or "
            "--reward_model_name_or_path."
        )
    return sources


def merged_model_init_kwargs(model_args: ModelConfig, given) -> dict:
    """`from_pretrained` kwargs from `--model_revision`, `--dtype`, `--attn_implementation` (when set), overridden by
    `--model_init_kwargs` (a dict, or JSON text on the command line, e.g. `'{"gguf_file": "model.gguf"}'`).
    `trust_remote_code` stays a `GRPOConfig` field, as in TRL.

    Raises:
        ValueError: if `given` is not a JSON object.
    """
    kwargs = {"revision": model_args.model_revision}
    for key in ("dtype", "attn_implementation"):
        if getattr(model_args, key) is not None:
            kwargs[key] = getattr(model_args, key)
    given = given or {}
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except json.JSONDecodeError as error:
            raise ValueError(f"--model_init_kwargs must be a JSON object, got {given!r} ({error}).") from error
    if not isinstance(given, dict):
        raise ValueError(f"--model_init_kwargs must be a JSON object, got {given!r}.")
    return {**kwargs, **given}


def load_script_dataset(script_args: GRPOScriptArguments, dataset_args: DatasetMixtureConfig):
    """The `datasets:` mixture when the config file has one (`--dataset_name` is then ignored, with a warning), else
    `--dataset_name` (streamed with `--dataset_streaming`). Returns `(dataset_dict, name_for_messages)`.

    Raises:
        ValueError: if neither is given, or from `get_dataset`.
        PathNotFoundError: if a dataset path does not exist and is no Hub id either.
    """
    if dataset_args.datasets:
        if script_args.dataset_name:
            logger.warning(
                "Both `datasets` and `dataset_name` are provided: training on the `datasets:` mixture of the config "
                "file; --dataset_name is ignored."
            )
        return get_dataset(dataset_args), "the dataset mixture"
    if not script_args.dataset_name:
        raise ValueError(
            "Either `datasets` or `dataset_name` must be provided: give --dataset_name, or a `datasets:` list in the "
            "--config file."
        )
    name = script_args.dataset_name
    return load_dataset_from_path(name, script_args.dataset_config, streaming=script_args.dataset_streaming), name


DATACLASS_TYPES = (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
DESCRIPTION = (
    "Train with (iterative) GRPO. `--config FILE.yaml` reads any of the flags below from a YAML file (and a "
    "`datasets:` mixture, and `env:` variables); flags given on the command line override it."
)
TRACEBACK_HELP = (
    "A configuration error (a flag value GRPOConfig rejects, a missing model, dataset or config file, an unknown "
    "reward function) prints one line `trl grpo: error: <message>` to stderr and exits with status 2; add "
    "--traceback anywhere on the command line, or set TRL_TRACEBACK=1, to see its full traceback. Errors raised "
    "during training always show their traceback. `accelerate launch` options (num_processes, config_file, ...) "
    "are not taken here: run `accelerate launch [its options] trl/scripts/grpo.py [these flags]`."
)


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None) -> TrlParser:
    """The `TrlParser` of the GRPO script (TRL 1.16's signature): its four dataclasses are
    `(GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)`.

    Args:
        subparsers (`argparse._SubParsersAction`, *optional*):
            Add the parser to these as the subcommand `"grpo"` (and return it), as TRL does. They must make
            `TrlParser`s: `TrlParser(...).add_subparsers()`, or `add_subparsers(parser_class=TrlParser)` on a plain
            `argparse.ArgumentParser`.
        prog (`str`, *optional*, defaults to `"trl grpo"`):
            The program name of a stand-alone parser (a subcommand's is `"<parent prog> grpo"`).

    Raises:
        TypeError: if `subparsers` make parsers of another class (they could not take the dataclasses).
    """
    options = dict(dataclass_types=DATACLASS_TYPES, description=DESCRIPTION, epilog=TRACEBACK_HELP)
    if subparsers is None:
        return TrlParser(prog=prog or "trl grpo", **options)
    parser_class = getattr(subparsers, "_parser_class", None)
    if not (isinstance(parser_class, type) and issubclass(parser_class, TrlParser)):
        name = getattr(parser_class, "__name__", repr(parser_class))
        raise TypeError(
            f"make_parser(subparsers) needs subparsers that make TrlParser parsers, not {name}: create them with "
            "`TrlParser().add_subparsers()` or `parser.add_subparsers(parser_class=TrlParser)`."
        )
    return subparsers.add_parser("grpo", help="Run the GRPO training script", **options)


# TRL 1.16's `trl grpo` hands the flags and config keys its dataclasses do not take to `accelerate launch`
# (`accelerate_config` becoming `--config_file`); this command trains in its own process instead.
TRL_LAUNCHER_KEYS = ("accelerate_config",)


def launcher_options() -> set[str]:
    """The option names (without dashes, `-` spelled `_`) of `accelerate launch`, plus TRL's `accelerate_config`."""
    from accelerate.commands.launch import launch_command_parser

    names = {
        option.lstrip("-").replace("-", "_")
        for action in launch_command_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    return names | set(TRL_LAUNCHER_KEYS)


def refuse_launcher_options(parser: TrlParser, argv: list[str]) -> None:
    """Refuse, before anything is parsed, an `accelerate launch` option among `argv`'s flags and the keys of its
    `--config` file that `parser` does not take itself: what TRL 1.16's `trl grpo` would pass on to the launcher.

    Raises:
        ValueError: naming the option, and saying to run `accelerate launch ... trl/scripts/grpo.py ...` instead.
    """
    keys, config_path = [], None
    for position, arg in enumerate(argv):
        if arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        elif arg == "--config" and position + 1 < len(argv):
            config_path = argv[position + 1]
        elif arg.startswith("--"):
            keys.append(arg[2:].split("=", 1)[0])
    if config_path is not None and os.path.isfile(config_path):
        keys += [str(key) for key in read_yaml_config(config_path)]  # the parser reports what is wrong with it
    taken = {action.dest for action in parser._actions} | {"config", "env"}
    foreign = [key for key in keys if key.replace("-", "_") not in taken]
    if not foreign:
        return
    launcher = launcher_options()
    given = next((key for key in foreign if key.replace("-", "_") in launcher), None)
    if given is not None:
        raise ValueError(
            f"`{given}` is an `accelerate launch` option, which `trl grpo` does not pass on (TRL 1.16 does): run "
            "`accelerate launch --config_file ACCELERATE.yaml [--num_processes N ...] trl/scripts/grpo.py "
            f"[the other flags and --config]` instead, without `{given}` in the flags or the config file."
        )


def parse_args(argv: list[str] | None = None) -> tuple:
    """`(script_args, training_args, model_args, dataset_args)` from `argv` (default `sys.argv[1:]`) and its
    `--config` file.

    Raises:
        ValueError: for an `accelerate launch` option (see `refuse_launcher_options`), an unknown flag or config
            key, or a value a dataclass rejects.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    refuse_launcher_options(parser, argv)
    return parser.parse_args_and_config(argv)


def trainer_from_args(script_args, training_args, model_args, dataset_args) -> GRPOTrainer:
    """Load the dataset and build the trainer from the parsed dataclasses, without training. The eval dataset
    (`--dataset_test_split`) is read only when `--eval_strategy` is not `"no"`, as in TRL.

    Raises:
        ValueError, FileNotFoundError: for a configuration error (what `trl grpo` prints as one line).
    """
    reward_funcs = reward_sources(script_args)  # before the slow loading
    training_args.model_init_kwargs = merged_model_init_kwargs(model_args, training_args.model_init_kwargs)
    dataset, name = load_script_dataset(script_args, dataset_args)
    train_dataset, eval_dataset = dataset_split(dataset, script_args.dataset_train_split, name), None
    if training_args.eval_strategy != "no":  # an IntervalStrategy, a str enum
        try:
            eval_dataset = dataset_split(dataset, script_args.dataset_test_split, name)
        except ValueError as error:
            raise ValueError(
                f"{error} Evaluation (--eval_strategy {getattr(training_args.eval_strategy, 'value', training_args.eval_strategy)}) reads --dataset_test_split "
                f"({script_args.dataset_test_split!r}): name a split the dataset has, split a mixture with "
                "`test_split_size` in the config file, or set --eval_strategy no."
            ) from error
    return GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )


def build_trainer(argv: list[str] | None = None) -> GRPOTrainer:
    """Parse `argv` (default `sys.argv[1:]`) and build the trainer (`trainer_from_args`), without training.

    Raises:
        ValueError, FileNotFoundError: for a configuration error (what `trl grpo` prints as one line).
    """
    return trainer_from_args(*parse_args(argv))


def train(trainer: GRPOTrainer) -> GRPOTrainer:
    """Train (from the checkpoint folder `--resume_from_checkpoint` names, as TRL's script does), save the model to
    `output_dir`, then finish the trackers and the process group (`trainer.end()`), as TRL's script does."""
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    trainer.save_model(trainer.args.output_dir)
    trainer.end()
    return trainer


def main(script_args, training_args, model_args, dataset_args) -> GRPOTrainer:
    """TRL 1.16's entry point: build the trainer from the parsed dataclasses (what `make_parser()` returns), train,
    save; every error is raised. Returns the trainer."""
    return train(trainer_from_args(script_args, training_args, model_args, dataset_args))


def run(argv: list[str] | None = None) -> GRPOTrainer:
    """`trl grpo` as a function: parse `argv` (default `sys.argv[1:]`), then `main`; every error is raised."""
    return main(*parse_args(argv))


def command(argv: list[str]) -> int:
    """`trl grpo ARGV` as the command line runs it; returns the exit status.

    A configuration error (`CONFIG_ERRORS`, raised while parsing the flags, loading the dataset or building the
    trainer) prints one line, `trl grpo: error: <message>`, to stderr and returns 2, as argparse does for a bad flag;
    with `--traceback` in `argv` or `TRL_TRACEBACK=1` it is raised as it is. Errors raised during training are never
    shortened.
    """
    show_traceback = wants_traceback(argv)
    try:
        trainer = build_trainer([arg for arg in argv if arg != TRACEBACK_FLAG])
    except CONFIG_ERRORS as error:
        if show_traceback:
            raise
        print(f"trl grpo: error: {one_line(error)}", file=sys.stderr)
        return 2
    train(trainer)  # then saves, and finishes the trackers and the process group, as TRL's script does
    return 0


if __name__ == "__main__":  # `python trl/scripts/grpo.py ...` or `accelerate launch trl/scripts/grpo.py ...`
    sys.exit(command(sys.argv[1:]))
