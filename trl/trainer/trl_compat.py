# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What subclasses written for TRL 1.16's `GRPOTrainer` read and override, beyond the steps of the trainer itself:
`compute_loss` → `_compute_loss`, the entropy and off-policy masks, the reward-logging hooks, the entropy coefficient,
the generation batch and its micro-step (`_buffered_inputs`, `_step`), the config-valued attributes, the attributes of
features not supported here (their "off" values), and a check that no override of a TRL method this trainer never
calls is silently ignored."""

import os
import sys
from functools import partial

import torch
from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase, ProcessorMixin
from transformers.utils import is_peft_available

from .grpo_config import GRPOConfig
from .grpo_losses import high_entropy_mask, off_policy_sequence_mask, vespo_weights


# Attributes TRL 1.16's GRPOTrainer copies from its config (`self.<name>`), here read-only views of `self.args` (a
# value set on the trainer would not reach the loss, so setting one raises instead). Name on the trainer → field.
CONFIG_ATTRIBUTES = {
    "chat_template_kwargs": "chat_template_kwargs",
    "epsilon_low": "epsilon",
    "epsilon_high": "epsilon_high",
    "importance_sampling_level": "importance_sampling_level",
    "log_completions": "log_completions",
    "log_multimodal": "log_multimodal",
    "log_unique_prompts": "log_unique_prompts",
    "mask_truncated_completions": "mask_truncated_completions",
    "max_tool_calling_iterations": "max_tool_calling_iterations",
    "min_p": "min_p",
    "multi_objective_aggregation": "multi_objective_aggregation",
    "num_completions_to_print": "num_completions_to_print",
    "off_policy_mask_threshold": "off_policy_mask_threshold",
    "pad_to_multiple_of": "pad_to_multiple_of",
    "repetition_penalty": "repetition_penalty",
    "scale_rewards": "scale_rewards",
    "shuffle_dataset": "shuffle_dataset",
    "top_entropy_quantile": "top_entropy_quantile",
    "top_k": "top_k",
    "top_p": "top_p",
    "use_transformers_continuous_batching": "use_transformers_continuous_batching",
    "use_vllm": "use_vllm",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "vllm_importance_sampling_clip_max": "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min": "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_correction": "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode": "vllm_importance_sampling_mode",
    "vllm_mode": "vllm_mode",
    "vllm_tensor_parallel_size": "vllm_tensor_parallel_size",
}
# The ones TRL derives from their field rather than copying it.
DERIVED_ATTRIBUTES = {
    "chat_template_kwargs": lambda args: args.chat_template_kwargs or {},
    "epsilon_high": lambda args: args.epsilon if args.epsilon_high is None else args.epsilon_high,
    "max_tool_calling_iterations": lambda args: (
        sys.maxsize if args.max_tool_calling_iterations is None else args.max_tool_calling_iterations
    ),
}

# TRL 1.16 attributes of features this package does not have (tool calling, custom rollouts, environments, a training
# chat template for tools, continuous batching), read-only at the value TRL holds when the feature is off. Name →
# a function returning that value (a new list each time).
UNSUPPORTED_FEATURE_ATTRIBUTES = {
    "chat_template": lambda: None,
    "continuous_batching_config": lambda: None,
    "environment_factories": lambda: None,
    "environments": lambda: None,
    "rollout_func": lambda: None,
    "tools": list,
}

# TRL 1.16 GRPOTrainer methods that this trainer does not have or never calls, with what to override instead.
UNCALLED_TRL_METHODS = {
    "_get_tool_suffix_ids": "tool calling is not supported here",
    "_tool_call_loop": "tool calling is not supported here",
    "get_gamma_weights": "the VESPO weights come from `trl.trainer.grpo_losses.vespo_weights`, called inside "
    "`_compute_loss`: override `_compute_loss`",
}


def _config_attribute(name: str, field: str) -> property:
    derive = DERIVED_ATTRIBUTES.get(name, lambda args: getattr(args, field))

    def get(self):
        return derive(self.args)

    def set_(self, value):
        raise AttributeError(
            f"`{field}` is read from the trainer's config: set `args.{field}` (GRPOConfig) before building the "
            "trainer; a value set on the trainer would not reach the loss."
        )

    return property(get, set_, doc=f"`args.{field}` (read-only; TRL 1.16 keeps a copy on the trainer).")


def _unsupported_feature_attribute(name: str, off_value) -> property:
    def set_(self, value):
        raise AttributeError(
            f"`{name}` belongs to a TRL 1.16 feature that this package does not support (tool calling, custom "
            'rollouts, environments, continuous batching: see "Features not supported" in '
            "docs/source/grpo_trainer.md); it stays at its value without the feature."
        )

    return property(lambda self: off_value(), set_, doc=f"`{off_value()!r}`: TRL 1.16's value without the feature.")


def gather_valid_entropies(accelerator, values: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's 1-D tensor of (non-negative) entropies; their lengths may differ.

    Each is padded to the longest with −1 before the gather, and the pads are dropped after it.
    """
    gathered = accelerator.gather(accelerator.pad_across_processes(values, dim=0, pad_index=-1.0))
    return gathered[gathered >= 0]


class TRLTrainerSurface:
    """Mixin of [`GRPOTrainer`]: TRL 1.16's methods and attributes with the same names, arguments and returns, each
    one called by the trainer's own steps (so a subclass's override takes effect). Needs `self.args`,
    `self.accelerator`, `self.entropy_control`, `self.generation_buffer`, `self._reward_hooks` and `self.reference`, and
    `_compute_loss` from the trainer."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """GRPO loss of one micro-batch (see `_compute_loss`).

        Raises:
            ValueError: if `return_outputs` is requested (GRPO has no model outputs to return).
        """
        if return_outputs:
            raise ValueError(
                "The GRPOTrainer does not support returning outputs: GRPO has no model outputs to return, call "
                "`compute_loss` with return_outputs=False."
            )
        return self._compute_loss(model, inputs)

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """`(N, L)` bool mask of the valid tokens whose entropy is at least the `threshold` quantile (in [0, 1]) of
        the entropies of every process's valid tokens (TRL 1.16's signature: the trainer passes `1 −
        top_entropy_quantile`); see `grpo_losses.high_entropy_mask` (arXiv 2506.01939)."""
        gather_all = partial(gather_valid_entropies, self.accelerator)
        return high_entropy_mask(entropies.detach(), mask, threshold, gather_all)

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """`(N, 1)` float mask, 0 for the completions that off-policy sequence masking drops (DeepSeek-V3.2,
        arXiv 2512.02556), with TRL 1.16's signature (`advantages` `(N, 1)` or `(N,)`); see
        `grpo_losses.off_policy_sequence_mask`."""
        return off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )

    @staticmethod
    def get_gamma_weights(
        advantages: torch.Tensor,
        log_ratio_per_token: torch.Tensor,
        mask: torch.Tensor,
        importance_sampling_ratio: torch.Tensor | None,
        k_pos: float = 2.0,
        lambda_pos: float = 3.0,
        k_neg: float = 3.0,
        lambda_neg: float = 2.0,
    ) -> torch.Tensor:
        """`(N, 1)` VESPO sequence weights φ(w) (arXiv 2602.10693) from `(N, L)` per-token log-ratios log π_θ/π_old,
        with TRL 1.16's signature and defaults (`advantages` `(N, 1)` or `(N,)`; `importance_sampling_ratio` `(N, L)`
        or `None`); see `grpo_losses.vespo_weights`, which `_compute_loss` calls (this method is not called by the
        trainer, so overriding it raises a `TypeError`)."""
        return vespo_weights(
            advantages,
            log_ratio_per_token,
            torch.zeros_like(log_ratio_per_token),
            mask,
            k_pos,
            lambda_pos,
            k_neg,
            lambda_neg,
            importance_sampling_ratio,
        )

    def _log_completion_extra(self, column: str, values: list) -> None:
        """What reward functions call as `log_extra(column, values)`: one value per completion of the call, shown as
        a column of the completions table."""
        self._reward_hooks.log_extra(column, values)

    def _log_metric(self, name: str, value: float) -> None:
        """What reward functions call as `log_metric(name, value)`: a scalar averaged over the batch (all processes)
        and logged as `name`."""
        self._reward_hooks.log_metric(name, value)

    def _log_hooks(self) -> dict:
        return {"log_extra": self._log_completion_extra, "log_metric": self._log_metric}

    @property
    def _tokenizer(self):
        """The policy's tokenizer (TRL 1.16's name; here always `processing_class`: text-only models)."""
        return self.processing_class

    @property
    def ref_model(self):
        """The reference model (TRL 1.16's attribute), read-only: `self.reference.model`, `None` for a PEFT policy
        (its reference is an adapter or the base model) or with `beta=0.0`."""
        return self.reference.model

    @ref_model.setter
    def ref_model(self, value):
        raise AttributeError(
            "`ref_model` is built from the trainer's config and synced with the policy by `SyncRefModelCallback`, "
            "which a model set here would bypass: set `args.beta` (0.0: no reference model) and `args.sync_ref_model` "
            "before building the trainer, or override `_ref_per_token_logps` to score with another model."
        )

    # ---- TRL 1.16's attributes for the generation batch (the state lives in `self.generation_buffer`) ----

    @property
    def _step(self) -> int | None:
        """The micro-step reached in training (`GenerationBuffer.step`); `None` before training starts."""
        return self.generation_buffer.step

    @_step.setter
    def _step(self, value: int | None) -> None:
        self.generation_buffer.step = value

    @property
    def _buffered_inputs(self) -> list[dict] | None:
        """The micro-batches of the generation batch being trained on (`GenerationBuffer.inputs`)."""
        return self.generation_buffer.inputs

    @_buffered_inputs.setter
    def _buffered_inputs(self, value: list[dict] | None) -> None:
        self.generation_buffer.inputs = value

    # ---- TRL 1.16's attributes for the entropy bonus (the state lives in `self.entropy_control`) ----

    @property
    def entropy_coef(self) -> float:
        """The entropy-bonus coefficient now (changed after each optimizer step with `use_adaptive_entropy`)."""
        return self.entropy_control.coef

    @entropy_coef.setter
    def entropy_coef(self, value: float) -> None:
        self.entropy_control.coef = float(value)

    @property
    def use_adaptive_entropy(self) -> bool:
        return self.entropy_control.adaptive


for _name, _field in CONFIG_ATTRIBUTES.items():
    setattr(TRLTrainerSurface, _name, _config_attribute(_name, _field))
for _name, _off_value in UNSUPPORTED_FEATURE_ATTRIBUTES.items():
    setattr(TRLTrainerSurface, _name, _unsupported_feature_attribute(_name, _off_value))


def check_unsupported_arguments(**arguments) -> None:
    """Raise for TRL 1.16's tool-calling and custom-rollout arguments (`tools`, `rollout_func`,
    `environment_factory`, given by name) that are not `None`.

    Raises:
        ValueError: naming the first such argument.
    """
    for name, value in arguments.items():
        if value is not None:
            raise ValueError(
                f"`{name}` (tool calling / custom rollouts) is not supported by this package: leave it None."
            )


def check_argument_types(model, args, train_dataset, processing_class, quantization_config, peft_config) -> None:
    """The checks TRL 1.16's `GRPOTrainer.__init__` makes on its arguments' types and combinations, with TRL's
    messages (our explanation after them), before anything is loaded.

    Raises:
        ValueError: `quantization_config` given both to the trainer and in `args.model_init_kwargs`; a `PeftModel`
            together with a `peft_config`.
        TypeError: a `processing_class` that is no tokenizer or processor; a `peft_config` that is no
            `peft.PeftConfig`; a `train_dataset` that is no `Dataset` or `IterableDataset`.
        ImportError: a `peft_config` without the `peft` library.
    """
    if quantization_config is not None and "quantization_config" in (args.model_init_kwargs or {}):
        raise ValueError(
            "You set `quantization_config` both as a trainer argument and in `args.model_init_kwargs`. Please set it "
            "in only one place, preferably as a trainer argument."
        )
    if processing_class is not None and not isinstance(processing_class, (PreTrainedTokenizerBase, ProcessorMixin)):
        raise TypeError(
            "The `processing_class` must be either a `PreTrainedTokenizerBase` or a `ProcessorMixin`, got "
            f"`{type(processing_class).__name__}` (this package trains text-only models: pass the model's tokenizer)."
        )
    if peft_config is not None:
        if not is_peft_available():
            raise ImportError(
                "You passed `peft_config` but the `peft` library is not installed. Install it with "
                "`pip install trl[peft]`."
            )
        from peft import PeftConfig

        if not isinstance(peft_config, PeftConfig):
            raise TypeError(
                "`peft_config` must be a `peft.PeftConfig` instance (e.g. `peft.LoraConfig`), got "
                f"{type(peft_config).__name__}."
            )
        if hasattr(model, "peft_config"):
            raise ValueError(
                "You passed a `PeftModel` instance together with a `peft_config` to the trainer. Please first merge "
                "and unload the existing adapter, save the resulting base model, and then pass that base model along "
                "with the new `peft_config` to the trainer (or pass the `PeftModel` alone to train its adapter)."
            )
    if train_dataset is not None and not isinstance(train_dataset, (Dataset, IterableDataset)):
        raise TypeError(
            f"`train_dataset` must be a `Dataset` or `IterableDataset`, got `{type(train_dataset).__name__}` (e.g. "
            "`datasets.Dataset.from_list(rows)` for a list of rows, or `dataset_dict['train']` for a `DatasetDict`)."
        )


def default_config(model) -> GRPOConfig:
    """TRL 1.16's config when none is given: `GRPOConfig("<model name>-GRPO")`, the name being the last part of the
    model's path (`model` a path or a `PreTrainedModel`), or `model` when it has none."""
    name = model if isinstance(model, str) else model.config._name_or_path
    return GRPOConfig(f"{os.path.basename(str(name).rstrip('/')) or 'model'}-GRPO")


def check_overrides(trainer_class: type, base: type) -> None:
    """Raise if `trainer_class` (a subclass of `base`, the GRPOTrainer) defines a TRL 1.16 method that `base` never
    calls, so the override would silently do nothing.

    Raises:
        TypeError: naming the method, the class and what to override instead.
    """
    for klass in trainer_class.__mro__:
        if klass is base:
            break
        for name, instead in UNCALLED_TRL_METHODS.items():
            if name in vars(klass):
                raise TypeError(
                    f"{klass.__name__} overrides `{name}`, a TRL 1.16 GRPOTrainer method that this trainer never "
                    f"calls, so the override would be silently ignored ({instead}). See the table of overridable "
                    "methods in docs/source/grpo_trainer.md."
                )
