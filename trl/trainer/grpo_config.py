# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`GRPOConfig`: every knob of GRPO and of iterative GRPO (reference-model syncing), validated in one place."""

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
SYNC_STRATEGIES = ("steps", "epoch")
GENERATION_IMPLEMENTATIONS = ("shared_prefix", "generate")


@dataclass
class GRPOConfig(TrainingArguments):
    r"""
    Configuration class for [`GRPOTrainer`].

    Only the parameters specific to GRPO are listed here; see [`~transformers.TrainingArguments`] for the rest.
    Batch sizes count *completions*: `per_device_train_batch_size=8` with `num_generations=4` holds two prompts.
    Unlike recent TRL releases, `bf16`, `gradient_checkpointing` and `logging_steps` keep the `TrainingArguments`
    defaults (fp32, off, 500): set them explicitly for GPU runs.

    Parameters:
        > Parameters that control the model

        model_init_kwargs (`dict[str, Any]` or `None`, *optional*):
            Keyword arguments for [`~transformers.AutoModelForCausalLM.from_pretrained`], used when `model` is given
            to [`GRPOTrainer`] as a path. `"dtype"` may be a string such as `"bfloat16"` or `"auto"`.
        disable_dropout (`bool`, *optional*, defaults to `False`):
            Set every dropout probability of the policy (and reference) model to zero, so that the log-probabilities
            seen when sampling and when training agree.

        > Parameters that control the data and generation batches

        remove_unused_columns (`bool`, *optional*, defaults to `False`):
            Keep this `False`: every dataset column except `"prompt"` is passed to the reward functions.
        max_prompt_length (`int` or `None`, *optional*, defaults to `512`):
            Prompts longer than this (in tokens) keep their last `max_prompt_length` tokens. `None` keeps them whole.
        num_generations (`int`, *optional*, defaults to `8`):
            Number of completions sampled per prompt (the group size G of arXiv 2402.03300). Must be at least 2.
            The global generation batch (`per_device_train_batch_size × num_processes × steps_per_generation`)
            must be divisible by it.
        max_completion_length (`int`, *optional*, defaults to `256`):
            Maximum number of tokens per completion.
        shuffle_dataset (`bool`, *optional*, defaults to `True`):
            Shuffle the training prompts (seeded by `seed`).
        steps_per_generation (`int` or `None`, *optional*):
            Number of micro-batches each generation batch is split into. Defaults to `gradient_accumulation_steps`.
            Mutually exclusive with `generation_batch_size`.
        generation_batch_size (`int` or `None`, *optional*):
            Global number of completions generated at once. Must be a multiple of
            `per_device_train_batch_size × num_processes`; sets `steps_per_generation`.
        ds3_gather_for_generation (`bool`, *optional*, defaults to `True`):
            Under DeepSpeed ZeRO-3, gather the policy weights once for generation (fast) instead of generating
            with partitioned weights (slow, but fits models larger than one device).

        > Parameters that control sampling

        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature. The training log-probabilities use the same temperature.
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus-sampling probability mass.
        top_k (`int`, *optional*, defaults to `0`):
            Top-k filtering; `0` disables it.
        min_p (`float` or `None`, *optional*):
            Minimum token probability relative to the most likely token.
        repetition_penalty (`float`, *optional*, defaults to `1.0`):
            Penalty for repeated tokens; `1.0` disables it.
        generation_kwargs (`dict[str, Any]` or `None`, *optional*):
            Extra keyword arguments for [`~transformers.GenerationConfig`]; they override the fields above.
        cache_implementation (`str` or `None`, *optional*):
            KV-cache implementation for `generate` (e.g. `"static"`); `None` uses transformers' dynamic cache.
        generation_implementation (`str`, *optional*, defaults to `"shared_prefix"`):
            How completions are sampled. `"shared_prefix"`: prefill each distinct prompt once and copy its KV cache
            to its `num_generations` rows, then `generate`; `"generate"`: `generate` on the repeated prompts, as TRL
            does. Both sample from the same distribution; see "Generation paths" in the docs.

        > Parameters that control the loss

        learning_rate (`float`, *optional*, defaults to `1e-6`):
            Initial learning rate of [`~torch.optim.AdamW`] (overrides the `TrainingArguments` default).
        beta (`float`, *optional*, defaults to `0.04`):
            Weight of the KL penalty to the reference model (the DeepSeekMath value, arXiv 2402.03300). This fork
            exists for the reference model, so the default keeps it on; `0.0` loads no reference model at all
            and is incompatible with `sync_ref_model=True`.
        num_iterations (`int`, *optional*, defaults to `1`):
            Number of optimisation passes per generation batch (μ in Algorithm 1 of arXiv 2402.03300).
        epsilon (`float`, *optional*, defaults to `0.2`):
            Lower clipping range of the probability ratio (and upper too when `epsilon_high` is `None`).
        epsilon_high (`float` or `None`, *optional*):
            Upper clipping range (DAPO's clip-higher, arXiv 2503.14476). Defaults to `epsilon`.
        reward_weights (`list[float]` or `None`, *optional*):
            One weight per reward function; all `1.0` by default.
        scale_rewards (`str` or `bool`, *optional*, defaults to `"group"`):
            Divide centred rewards by the group's standard deviation (`"group"`), by the whole batch's (`"batch"`)
            or not at all (`"none"`, Dr. GRPO, arXiv 2503.20783). `True`/`False` mean `"group"`/`"none"`.
        loss_type (`str`, *optional*, defaults to `"dapo"`):
            How per-token losses are averaged: `"grpo"` (per sequence, then over sequences), `"bnpo"` (over the
            tokens of the micro-batch), `"dr_grpo"` (sum divided by batch size × `max_completion_length`) or
            `"dapo"` (over the tokens of the whole generation batch, all processes).
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            Exclude completions that hit `max_completion_length` without an EOS token from the loss.
        use_bias_correction_kl (`bool`, *optional*, defaults to `True`):
            Multiply each token's k3 KL by the importance ratio π_θ/π_θ_old before adding it to the loss. Its value
            is 1 on-policy, but its gradient makes the KL gradient the unbiased gradient of the reverse KL
            (DeepSeek-V3.2, arXiv 2512.02556). `False` uses the plain k3 estimator, whose gradient is biased.

        > Parameters that control iterative GRPO (reference-model syncing)

        sync_ref_model (`bool`, *optional*, defaults to `False`):
            Periodically move the reference model towards the policy (iterative GRPO, Algorithm 1 of
            arXiv 2402.03300; soft update of TR-DPO, arXiv 2404.09656). Requires `beta > 0`.
        ref_model_mixup_alpha (`float`, *optional*, defaults to `0.6`):
            α in π_ref ← α·π_θ + (1 − α)·π_ref, in (0, 1]. `1.0` is a hard reset (a bitwise copy).
        ref_model_sync_steps (`int`, *optional*, defaults to `512`):
            τ: sync after every τ-th optimizer step (not micro-batch). At least 1.
        ref_model_sync_strategy (`str`, *optional*, defaults to `"steps"`):
            `"steps"` syncs every `ref_model_sync_steps` optimizer steps; `"epoch"` syncs at the end of every
            epoch instead.

        > Parameters that control logging

        log_completions (`bool`, *optional*, defaults to `False`):
            Print a table of prompts, completions and rewards every `logging_steps` steps.
        num_completions_to_print (`int` or `None`, *optional*, defaults to `4`):
            Rows of that table; `None` prints all.
    """

    # Model
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for AutoModelForCausalLM.from_pretrained when `model` is a path."},
    )
    disable_dropout: bool = field(default=False, metadata={"help": "Set all dropout probabilities to zero."})

    # Data and generation batches
    remove_unused_columns: bool | None = field(
        default=False, metadata={"help": "Keep False: extra dataset columns are passed to the reward functions."}
    )
    max_prompt_length: int | None = field(
        default=512, metadata={"help": "Keep the last `max_prompt_length` prompt tokens; None keeps all."}
    )
    num_generations: int = field(default=8, metadata={"help": "Completions sampled per prompt (group size G)."})
    max_completion_length: int = field(default=256, metadata={"help": "Maximum tokens per completion."})
    shuffle_dataset: bool = field(default=True, metadata={"help": "Shuffle the training prompts."})
    steps_per_generation: int | None = field(
        default=None, metadata={"help": "Micro-batches per generation batch; defaults to gradient_accumulation_steps."}
    )
    generation_batch_size: int | None = field(
        default=None, metadata={"help": "Global completions per generation batch; sets steps_per_generation."}
    )
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Under ZeRO-3, gather the policy weights for generation."}
    )

    # Sampling
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus-sampling probability mass."})
    top_k: int = field(default=0, metadata={"help": "Top-k filtering; 0 disables it."})
    min_p: float | None = field(default=None, metadata={"help": "Minimum token probability relative to the top one."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty; 1.0 disables it."})
    generation_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Extra GenerationConfig keyword arguments (override the fields above)."}
    )
    cache_implementation: str | None = field(
        default=None, metadata={"help": "KV-cache implementation for generate (e.g. 'static'); None: dynamic."}
    )
    generation_implementation: str = field(
        default="shared_prefix",
        metadata={
            "help": "'shared_prefix' (prefill each distinct prompt once, share its KV cache) or 'generate'.",
            "choices": GENERATION_IMPLEMENTATIONS,
        },
    )

    # Loss
    learning_rate: float = field(default=1e-6, metadata={"help": "Initial AdamW learning rate."})
    beta: float = field(default=0.04, metadata={"help": "KL coefficient; 0.0 loads no reference model."})
    num_iterations: int = field(default=1, metadata={"help": "Optimisation passes per generation batch (μ)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower (and default upper) clipping range."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range; defaults to epsilon."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function."})
    scale_rewards: str = field(
        default="group", metadata={"help": "Reward scaling: 'group', 'batch' or 'none'.", "choices": SCALE_REWARDS}
    )
    loss_type: str = field(
        default="dapo",
        metadata={"help": "Loss normalisation: 'grpo', 'bnpo', 'dr_grpo' or 'dapo'.", "choices": LOSS_TYPES},
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Exclude completions without an EOS token from the loss."}
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata={"help": "Multiply the per-token KL by the importance ratio (unbiased reverse-KL gradient)."},
    )

    # Iterative GRPO
    sync_ref_model: bool = field(
        default=False, metadata={"help": "Periodically sync the reference model with the policy (needs beta > 0)."}
    )
    ref_model_mixup_alpha: float = field(
        default=0.6, metadata={"help": "alpha in ref <- alpha*policy + (1-alpha)*ref, in (0, 1]; 1.0 is a hard reset."}
    )
    ref_model_sync_steps: int = field(default=512, metadata={"help": "Sync every this many optimizer steps."})
    ref_model_sync_strategy: str = field(
        default="steps", metadata={"help": "'steps' or 'epoch'.", "choices": SYNC_STRATEGIES}
    )

    # Logging
    log_completions: bool = field(default=False, metadata={"help": "Print sample completions when logging."})
    num_completions_to_print: int | None = field(default=4, metadata={"help": "Rows of the completions table."})

    def __post_init__(self):
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = "group" if self.scale_rewards else "none"
        super().__post_init__()

        errors = []
        if self.num_generations < 2:
            errors.append(f"num_generations must be at least 2 (got {self.num_generations}): GRPO needs a group.")
        if self.max_completion_length < 1:
            errors.append(f"max_completion_length must be at least 1 (got {self.max_completion_length}).")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            errors.append(f"max_prompt_length must be at least 1 or None (got {self.max_prompt_length}).")
        if self.beta < 0:
            errors.append(f"beta must be >= 0 (got {self.beta}).")
        if self.num_iterations < 1:
            errors.append(f"num_iterations must be at least 1 (got {self.num_iterations}).")
        if self.epsilon <= 0 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            errors.append(f"epsilon and epsilon_high must be > 0 (got {self.epsilon}, {self.epsilon_high}).")
        if self.temperature <= 0:
            errors.append(f"temperature must be > 0 (got {self.temperature}).")
        if self.generation_implementation not in GENERATION_IMPLEMENTATIONS:
            errors.append(
                f"generation_implementation must be one of {', '.join(GENERATION_IMPLEMENTATIONS)} "
                f"(got {self.generation_implementation!r})."
            )
        if self.loss_type not in LOSS_TYPES:
            errors.append(f"loss_type must be one of {', '.join(LOSS_TYPES)} (got {self.loss_type!r}).")
        if self.scale_rewards not in SCALE_REWARDS:
            errors.append(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)} (got {self.scale_rewards!r}).")
        if not 0.0 < self.ref_model_mixup_alpha <= 1.0:
            errors.append(
                f"ref_model_mixup_alpha must be in (0, 1] (got {self.ref_model_mixup_alpha}); use 1.0 for a hard "
                "reset of the reference model."
            )
        if self.ref_model_sync_steps < 1:
            errors.append(f"ref_model_sync_steps must be at least 1 (got {self.ref_model_sync_steps}).")
        if self.ref_model_sync_strategy not in SYNC_STRATEGIES:
            errors.append(
                f"ref_model_sync_strategy must be one of {', '.join(SYNC_STRATEGIES)} "
                f"(got {self.ref_model_sync_strategy!r})."
            )
        if self.sync_ref_model and self.beta == 0.0:
            errors.append(
                "sync_ref_model=True needs a reference model, but beta=0.0 loads none: set beta > 0 or "
                "sync_ref_model=False."
            )
        if self.reward_weights is not None and len(self.reward_weights) == 0:
            errors.append("reward_weights must be None or a non-empty list.")

        num_processes = self.world_size
        local_batch = self.per_device_train_batch_size * num_processes
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            errors.append("Set steps_per_generation or generation_batch_size, not both.")
        elif self.generation_batch_size is not None:
            if self.generation_batch_size % local_batch != 0:
                errors.append(
                    f"generation_batch_size ({self.generation_batch_size}) must be a multiple of "
                    f"per_device_train_batch_size × num_processes ({local_batch})."
                )
            else:
                self.steps_per_generation = self.generation_batch_size // local_batch
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        if self.steps_per_generation < 1:
            errors.append(f"steps_per_generation must be at least 1 (got {self.steps_per_generation}).")
        self.generation_batch_size = local_batch * self.steps_per_generation
        if self.num_generations >= 2 and self.generation_batch_size % self.num_generations != 0:
            errors.append(
                f"The generation batch ({self.generation_batch_size} completions = per_device_train_batch_size "
                f"{self.per_device_train_batch_size} × {num_processes} processes × steps_per_generation "
                f"{self.steps_per_generation}) must be divisible by num_generations ({self.num_generations}): change "
                "per_device_train_batch_size, steps_per_generation or num_generations."
            )
        if errors:
            raise ValueError("Invalid GRPOConfig:\n- " + "\n- ".join(errors))
