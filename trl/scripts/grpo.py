# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: train a causal LM with (iterative) GRPO from the command line or a YAML config, with TRL 1.16's
flags (model, LoRA and quantization flags from `ModelConfig`, dataset mixtures, `--reward_funcs` names).

Example:
    trl grpo --model_name_or_path ./tiny --dataset_name prompts.jsonl \
        --reward_funcs trl.tasks.arithmetic.accuracy_reward \
        --sync_ref_model --ref_model_sync_steps 25 --ref_model_mixup_alpha 0.6 --output_dir out

`main` raises every error (for use from Python); the `trl grpo` command (`trl.cli`) turns a configuration error
raised by `build_trainer` into one `trl grpo: error: ...` line.
"""

import importlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field

from trl import rewards
from trl.scripts.utils import (
    DatasetMixtureConfig,
    ScriptArguments,
    TrlParser,
    dataset_split,
    get_dataset,
    load_dataset_from_path,
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
        f"Unknown reward function {name!r}: use one of {sorted(BUILTIN_REWARDS)}, a dotted import path "
        "'package.module.function' (or 'package.module:function'), or a reward-model folder."
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
            "No reward: give --reward_funcs (e.g. accuracy_reward, or my_module.my_reward) and/or "
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
            logger.warning("Both a `datasets:` mixture and --dataset_name are given: training on the mixture.")
        return get_dataset(dataset_args), "the dataset mixture"
    if not script_args.dataset_name:
        raise ValueError("No dataset: give --dataset_name, or a `datasets:` list in the --config file.")
    name = script_args.dataset_name
    return load_dataset_from_path(name, script_args.dataset_config, streaming=script_args.dataset_streaming), name


def make_parser() -> TrlParser:
    return TrlParser(
        (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig),
        prog="trl grpo",
        description="Train with (iterative) GRPO. `--config FILE.yaml` reads any of the flags below from a YAML file "
        "(and a `datasets:` mixture, and `env:` variables); flags given on the command line override it.",
        epilog=TRACEBACK_HELP,
    )


TRACEBACK_HELP = (
    "A configuration error (a flag value GRPOConfig rejects, a missing model, dataset or config file, an unknown "
    "reward function) prints one line `trl grpo: error: <message>` to stderr and exits with status 2; add "
    "--traceback anywhere on the command line, or set TRL_TRACEBACK=1, to see its full traceback. Errors raised "
    "during training always show their traceback."
)


def build_trainer(argv: list[str] | None = None) -> GRPOTrainer:
    """Parse `argv` (default `sys.argv[1:]`), load the dataset and build the trainer, without training. The eval
    dataset (`--dataset_test_split`) is read only when `--eval_strategy` is not `"no"`, as in TRL.

    Raises:
        ValueError, FileNotFoundError: for a configuration error (what `trl grpo` prints as one line).
    """
    script_args, training_args, model_args, dataset_args = make_parser().parse_args_and_config(argv)
    reward_funcs = reward_sources(script_args)  # before the slow loading
    training_args.model_init_kwargs = merged_model_init_kwargs(model_args, training_args.model_init_kwargs)
    dataset, name = load_script_dataset(script_args, dataset_args)
    evaluate = training_args.eval_strategy != "no"
    return GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset_split(dataset, script_args.dataset_train_split, name),
        eval_dataset=dataset_split(dataset, script_args.dataset_test_split, name) if evaluate else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )


def train(trainer: GRPOTrainer) -> GRPOTrainer:
    """Train (from the checkpoint folder `--resume_from_checkpoint` names, as TRL's script does), then save the model
    to `output_dir`."""
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    trainer.save_model(trainer.args.output_dir)
    return trainer


def main(argv: list[str] | None = None) -> GRPOTrainer:
    """`trl grpo` as a function: build the trainer from `argv`, train, save; every error is raised."""
    return train(build_trainer(argv))


if __name__ == "__main__":
    from trl.cli import main as cli_main

    sys.exit(cli_main(["grpo", *sys.argv[1:]]))
