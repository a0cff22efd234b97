# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPOConfig: defaults, derived batch sizes, bool→str mapping of scale_rewards, and every validation message."""

import re

import pytest

from trl import GRPOConfig


@pytest.fixture
def base(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")


def test_defaults(base):
    args = GRPOConfig(**base)
    assert args.num_generations == 8
    assert args.beta == 0.04
    assert args.epsilon == 0.2
    assert args.epsilon_high is None
    assert args.num_iterations == 1
    assert args.loss_type == "dapo"
    assert args.scale_rewards == "group"
    assert args.sync_ref_model is False
    assert args.ref_model_mixup_alpha == 0.6
    assert args.ref_model_sync_steps == 512
    assert args.ref_model_sync_strategy == "steps"
    assert args.learning_rate == 1e-6
    assert args.remove_unused_columns is False
    assert args.max_prompt_length is None  # TRL 1.16 has no prompt cut
    assert args.max_completion_length == 512
    assert args.num_completions_to_print is None
    assert args.temperature == 1.0
    assert args.mask_truncated_completions is False
    assert args.reward_weights is None
    # Derived: steps_per_generation = gradient_accumulation_steps, generation batch = per-device × processes × spg.
    assert args.world_size == 1
    assert args.steps_per_generation == args.gradient_accumulation_steps == 1
    assert args.generation_batch_size == args.per_device_train_batch_size * 1 * 1


def test_steps_per_generation_defaults_to_gradient_accumulation_steps(base):
    args = GRPOConfig(**base, per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=3)
    assert args.steps_per_generation == 3
    assert args.generation_batch_size == 12


def test_steps_per_generation_sets_generation_batch_size(base):
    args = GRPOConfig(**base, per_device_train_batch_size=4, num_generations=4, steps_per_generation=5)
    assert args.steps_per_generation == 5
    assert args.generation_batch_size == 20
    assert args.gradient_accumulation_steps == 1


def test_generation_batch_size_sets_steps_per_generation(base):
    args = GRPOConfig(**base, per_device_train_batch_size=4, num_generations=8, generation_batch_size=16)
    assert args.steps_per_generation == 4
    assert args.generation_batch_size == 16


@pytest.mark.parametrize("value, expected", [(True, "group"), (False, "none"), ("batch", "batch"), ("none", "none")])
def test_scale_rewards_mapping(base, value, expected):
    assert GRPOConfig(**base, scale_rewards=value).scale_rewards == expected


def test_valid_edge_values(base):
    args = GRPOConfig(
        **base,
        ref_model_mixup_alpha=1.0,
        ref_model_sync_steps=1,
        sync_ref_model=True,
        num_generations=2,
        per_device_train_batch_size=2,
        ref_model_sync_strategy="epoch",
    )
    assert (args.ref_model_mixup_alpha, args.ref_model_sync_steps, args.ref_model_sync_strategy) == (1.0, 1, "epoch")


INVALID = [
    (dict(ref_model_mixup_alpha=0.0), "ref_model_mixup_alpha must be in (0, 1] (got 0.0); use 1.0 for a hard reset"),
    (dict(ref_model_mixup_alpha=1.5), "ref_model_mixup_alpha must be in (0, 1] (got 1.5)"),
    (dict(ref_model_mixup_alpha=-0.1), "ref_model_mixup_alpha must be in (0, 1] (got -0.1)"),
    (dict(ref_model_sync_steps=0), "ref_model_sync_steps must be at least 1 (got 0)."),
    (dict(num_generations=1), "num_generations must be at least 2 (got 1): GRPO needs a group."),
    (
        dict(per_device_train_batch_size=3, num_generations=2),
        "The generation batch (3 completions = per_device_train_batch_size 3 × 1 processes × steps_per_generation 1) "
        "must be divisible by num_generations (2)",
    ),
    (
        dict(sync_ref_model=True, beta=0.0),
        "sync_ref_model=True needs a reference model, but beta=0.0 loads none: set beta > 0 or sync_ref_model=False.",
    ),
    (dict(loss_type="ppo"), "loss_type must be one of grpo, bnpo, dr_grpo, dapo (got 'ppo')."),
    (dict(scale_rewards="global"), "scale_rewards must be one of group, batch, none (got 'global')."),
    (dict(ref_model_sync_strategy="never"), "ref_model_sync_strategy must be one of steps, epoch (got 'never')."),
    (
        dict(steps_per_generation=2, generation_batch_size=16),
        "Set steps_per_generation or generation_batch_size, not both.",
    ),
    (
        dict(per_device_train_batch_size=4, num_generations=2, generation_batch_size=10),
        "generation_batch_size (10) must be a multiple of per_device_train_batch_size × num_processes (4).",
    ),
    (dict(beta=-0.1), "beta must be >= 0 (got -0.1)."),
    (dict(num_iterations=0), "num_iterations must be at least 1 (got 0)."),
    (dict(max_completion_length=0), "max_completion_length must be at least 1 (got 0)."),
    (dict(reward_weights=[]), "reward_weights must be None or a non-empty list."),
]


@pytest.mark.parametrize(
    "overrides, message", INVALID, ids=[next(iter(o)) + "=" + str(next(iter(o.values()))) for o, _ in INVALID]
)
def test_invalid_values_raise(base, overrides, message):
    kwargs = {**base, "per_device_train_batch_size": 8, **overrides}
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        GRPOConfig(**kwargs)
    assert str(info.value).startswith("Invalid GRPOConfig:\n- ")


def test_all_errors_are_reported_together(base):
    with pytest.raises(ValueError) as info:
        GRPOConfig(**base, ref_model_mixup_alpha=0.0, ref_model_sync_steps=0, loss_type="x")
    message = str(info.value)
    assert message.count("\n- ") == 3
    for piece in ("ref_model_mixup_alpha", "ref_model_sync_steps", "loss_type"):
        assert piece in message
