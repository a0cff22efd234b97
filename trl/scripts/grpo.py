# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: train a causal LM with (iterative) GRPO from the command line or a YAML config.

Example:
    trl grpo --model_name_or_path ./tiny --dataset_name prompts.jsonl --reward_funcs accuracy_reward \
        --sync_ref_model --ref_model_sync_steps 25 --ref_model_mixup_alpha 0.6 --output_dir out
"""

import importlib
import json
import os
from dataclasses import dataclass, field

from trl.scripts.utils import ScriptArguments, TrlParser, load_dataset_from_path
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
        ValueError: if `name` is none of these.
    """
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" in name:
        module, function = name.split(":", 1)
        return getattr(importlib.import_module(module), function)
    if os.path.isdir(name):
        return name
    raise ValueError(
        f"Unknown reward function {name!r}: use one of {sorted(BUILTIN_REWARDS)}, 'module:function' or a reward-model folder."
    )


def main(argv: list[str] | None = None) -> GRPOTrainer:
    parser = TrlParser(
        (GRPOScriptArguments, GRPOConfig, ModelConfig),
        prog="trl grpo",
        description="Train with (iterative) GRPO. `--config FILE.yaml` reads any of the flags below from a YAML file; "
        "flags given on the command line override it.",
    )
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    model_init_kwargs = {"revision": model_args.model_revision}  # trust_remote_code is a GRPOConfig field, as in TRL
    for key in ("dtype", "attn_implementation"):
        if getattr(model_args, key) is not None:
            model_init_kwargs[key] = getattr(model_args, key)
    given = training_args.model_init_kwargs or {}  # `--model_init_kwargs '{"gguf_file": ...}'` arrives as JSON text
    given = json.loads(given) if isinstance(given, str) else given
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
    dataset = load_dataset_from_path(script_args.dataset_name, script_args.dataset_config)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=[resolve_reward_func(name) for name in script_args.reward_funcs],
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if script_args.dataset_test_split else None,
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    return trainer


if __name__ == "__main__":
    main()
