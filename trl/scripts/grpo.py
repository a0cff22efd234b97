# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: train a causal LM with (iterative) GRPO from the command line or a YAML config.

Example:
    trl grpo --model_name_or_path ./tiny --dataset_name prompts.jsonl --reward_funcs accuracy_reward \
        --sync_ref_model --ref_model_sync_steps 25 --ref_model_mixup_alpha 0.6 --output_dir out

`main` raises every error (for use from Python); the `trl grpo` command (`trl.cli`) turns a configuration error
raised by `build_trainer` into one `trl grpo: error: ...` line.
"""

import importlib
import json
import os
import sys
from dataclasses import dataclass, field

from trl.scripts.utils import ScriptArguments, TrlParser, dataset_split, load_dataset_from_path
from trl.tasks import arithmetic
from trl.trainer import GRPOConfig, GRPOTrainer


BUILTIN_REWARDS = {
    name: getattr(arithmetic, name) for name in ("accuracy_reward", "answer_reward", "closeness_reward")
}


@dataclass
class ModelConfig:
    """Which model to train, and LoRA settings when `use_peft` is set."""

    model_name_or_path: str = field(metadata={"help": "Local model folder (or hub id)."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of a hub model."})
    dtype: str | None = field(default=None, metadata={"help": "'auto', 'bfloat16', 'float16' or 'float32'."})
    attn_implementation: str | None = field(
        default=None, metadata={"help": "e.g. 'sdpa', 'eager', 'flash_attention_2'."}
    )
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "Module names to adapt."})


@dataclass
class GRPOScriptArguments(ScriptArguments):
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy_reward"],
        metadata={
            "help": "Built-in names (accuracy_reward, answer_reward, closeness_reward), 'module:function', or reward-model "
            "paths."
        },
    )


def resolve_reward_func(name: str):
    """A built-in reward name, an importable `module:function`, or else a reward-model path (kept as a string).

    Raises:
        ValueError: if `name` is none of these, or its module cannot be imported or has no such function.
    """
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" in name:
        module_name, function = name.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"Cannot import the module of reward function {name!r}: {error}") from error
        if not callable(getattr(module, function, None)):
            raise ValueError(f"Reward function {name!r}: module {module_name!r} has no function {function!r}.")
        return getattr(module, function)
    if os.path.isdir(name):
        return name
    raise ValueError(
        f"Unknown reward function {name!r}: use one of {sorted(BUILTIN_REWARDS)}, 'module:function' or a reward-model folder."
    )


TRACEBACK_HELP = (
    "A configuration error (a flag value GRPOConfig rejects, a missing model, dataset or config file, an unknown "
    "reward function) prints one line `trl grpo: error: <message>` to stderr and exits with status 2; add "
    "--traceback anywhere on the command line, or set TRL_TRACEBACK=1, to see its full traceback. Errors raised "
    "during training always show their traceback."
)


def make_parser() -> TrlParser:
    return TrlParser(
        (GRPOScriptArguments, GRPOConfig, ModelConfig),
        prog="trl grpo",
        description="Train with (iterative) GRPO. `--config FILE.yaml` reads any of the flags below from a YAML file; "
        "flags given on the command line override it.",
        epilog=TRACEBACK_HELP,
    )


def build_trainer(argv: list[str] | None = None) -> GRPOTrainer:
    """Parse `argv` (default `sys.argv[1:]`), load the dataset and build the trainer, without training.

    Raises:
        ValueError, FileNotFoundError: for a configuration error (what `trl grpo` prints as one line).
    """
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    reward_funcs = [resolve_reward_func(name) for name in script_args.reward_funcs]  # before the slow loading
    model_init_kwargs = {"revision": model_args.model_revision}  # trust_remote_code is a GRPOConfig field, as in TRL
    for key in ("dtype", "attn_implementation"):
        if getattr(model_args, key) is not None:
            model_init_kwargs[key] = getattr(model_args, key)
    given = training_args.model_init_kwargs or {}  # `--model_init_kwargs '{"gguf_file": ...}'` arrives as JSON text
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except json.JSONDecodeError as error:
            raise ValueError(f"--model_init_kwargs must be a JSON object, got {given!r} ({error}).") from error
    if not isinstance(given, dict):
        raise ValueError(f"--model_init_kwargs must be a JSON object, got {given!r}.")
    training_args.model_init_kwargs = {**model_init_kwargs, **given}
    peft_config = None
    if model_args.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules or "all-linear",
            task_type="CAUSAL_LM",
        )
    name = script_args.dataset_name
    dataset = load_dataset_from_path(name, script_args.dataset_config)
    test_split = script_args.dataset_test_split
    return GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset_split(dataset, script_args.dataset_train_split, name),
        eval_dataset=dataset_split(dataset, test_split, name) if test_split else None,
        peft_config=peft_config,
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
