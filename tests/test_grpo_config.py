# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPOConfig: defaults, derived batch sizes, bool→str mapping of scale_rewards, and every validation message."""

import dataclasses
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments

from trl import GRPOConfig
from trl.trainer import grpo_config


@pytest.fixture
def base(tmp_path):
    return dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")


# TRL 1.16.0's GRPOConfig defaults for every field we share with it (the GRPO fields, and the TrainingArguments
# fields TRL overrides), read from `dataclasses.fields(trl.GRPOConfig)` of TRL 1.16.0.
TRL_1_16_DEFAULTS = {
    "beta": 0.0,
    "bf16": None,
    "cache_implementation": None,
    "cast_lm_head_to_fp32": False,
    "chat_template_kwargs": None,
    "delta": None,
    "disable_dropout": False,
    "ds3_gather_for_generation": True,
    "entropy_coef": 0.0,
    "entropy_coef_delta": 0.005,
    "entropy_coef_max": 1.0,
    "entropy_coef_min": 0.0,
    "entropy_target": 0.2,
    "epsilon": 0.2,
    "epsilon_high": None,
    "generation_batch_size": None,
    "generation_kwargs": None,
    "gradient_checkpointing": True,
    "importance_sampling_level": "token",
    "learning_rate": 1e-06,
    "lr_scheduler_kwargs": None,
    "log_completions": False,
    "log_completions_hub_repo": None,
    "log_multimodal": True,
    "log_unique_prompts": False,
    "logging_steps": 10,
    "loss_type": "dapo",
    "mask_truncated_completions": False,
    "max_completion_length": 512,
    "max_tool_calling_iterations": None,
    "min_p": None,
    "model_init_kwargs": None,
    "multi_objective_aggregation": "sum_then_normalize",
    "num_completions_to_print": None,
    "num_generations": 8,
    "num_generations_eval": None,
    "num_iterations": 1,
    "off_policy_mask_threshold": None,
    "pad_to_multiple_of": "auto",
    "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512,
    "remove_unused_columns": False,
    "repetition_penalty": 1.0,
    "reward_weights": None,
    "router_aux_loss_coef": None,
    "sapo_temperature_neg": 1.05,
    "sapo_temperature_pos": 1.0,
    "scale_rewards": "group",
    "shuffle_dataset": True,
    "steps_per_generation": None,
    "sync_ref_model": False,
    "temperature": 1.0,
    "top_entropy_quantile": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "torch_empty_cache_steps": None,
    "transformers_continuous_batching_config": None,
    "trust_remote_code": False,
    "use_adaptive_entropy": False,
    "use_bias_correction_kl": True,
    "use_liger_kernel": False,
    "use_transformers_continuous_batching": False,
    "use_transformers_paged": False,
    "use_vllm": False,
    "vespo_k_neg": 3.0,
    "vespo_k_pos": 2.0,
    "vespo_lambda_neg": 2.0,
    "vespo_lambda_pos": 3.0,
    "vllm_enable_sleep_mode": False,
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_group_port": 51216,
    "vllm_importance_sampling_cap": None,
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_max_model_length": None,
    "vllm_mode": "colocate",
    "vllm_model_impl": "vllm",
    "vllm_server_base_url": None,
    "vllm_server_host": "0.0.0.0",
    "vllm_server_port": 8000,
    "vllm_server_timeout": 240.0,
    "vllm_structured_outputs_regex": None,
    "vllm_tensor_parallel_size": 1,
}
# Ours only: the generation path, the scoring paths, the opt-in prompt cut, the per-epoch sync strategy, the reference's
# offload and Algorithm 1's reward-model refresh.
OUR_ONLY_DEFAULTS = {
    "shared_prefix": None,
    "inverse_cdf_sampling": None,
    "chunked_logprobs": None,
    "recompute_elementwise_activations": False,
    "max_prompt_length": None,
    "ref_model_sync_strategy": "steps",
    "offload_ref_model": False,
    "reward_model_update_steps": None,
    "reward_model_replay_ratio": 0.1,
    "reward_model_learning_rate": 1e-5,
    "reward_model_num_epochs": 1,
    "reward_model_batch_size": 8,
    "reward_model_replay_buffer_size": 10000,
    "reward_model_loss_type": "pointwise",
}


def test_field_defaults_are_trl_1_16s():
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert {name: defaults[name] for name in TRL_1_16_DEFAULTS} == TRL_1_16_DEFAULTS
    assert {name: defaults[name] for name in OUR_ONLY_DEFAULTS} == OUR_ONLY_DEFAULTS
    grpo_fields = set(defaults) - {f.name for f in dataclasses.fields(TrainingArguments)}
    assert grpo_fields <= set(TRL_1_16_DEFAULTS) | set(OUR_ONLY_DEFAULTS), "a new field needs its TRL default here"


def test_resolved_defaults(base):
    args = GRPOConfig(**base)
    # bf16=None resolves to True (fp16 unset), as in TRL; gradient checkpointing is on; TRL's logging interval.
    assert (args.bf16, args.gradient_checkpointing, args.logging_steps) == (True, True, 10)
    assert (args.beta, args.loss_type, args.importance_sampling_level, args.max_completion_length) == (
        0.0,
        "dapo",
        "token",
        512,
    )
    assert GRPOConfig(**base, bf16=False, gradient_checkpointing=False).bf16 is False
    # Derived: steps_per_generation = gradient_accumulation_steps, generation batch = per-device × processes × spg.
    assert args.world_size == 1
    assert args.steps_per_generation == args.gradient_accumulation_steps == 1
    assert args.generation_batch_size == args.per_device_train_batch_size * 1 * 1


def test_sync_without_beta_is_an_error_with_trl_defaults(base):
    with pytest.raises(ValueError, match=re.escape("`sync_ref_model=True` while `beta=0.0` has nothing to sync")):
        GRPOConfig(**base, sync_ref_model=True)
    assert GRPOConfig(**base, sync_ref_model=True, beta=0.04).sync_ref_model is True


@pytest.mark.parametrize(
    "overrides, warning",
    [
        (dict(loss_type="luspo"), "loss_type='luspo' is defined with sequence-level importance weights"),
        (
            dict(loss_type="vespo", importance_sampling_level="sequence"),
            "loss_type='vespo' builds its own sequence-level weights",
        ),
        (dict(importance_sampling_level="sequence"), "the `'dapo'` loss sums per-token contributions"),
        (
            dict(importance_sampling_level="sequence", loss_type="cispo"),
            "the `'cispo'` loss sums per-token contributions",
        ),
    ],
)
def test_loss_combination_warnings(base, monkeypatch, overrides, warning):
    messages = []
    monkeypatch.setattr(grpo_config.logger, "warning", messages.append)
    GRPOConfig(**base, **overrides)
    assert len(messages) == 1 and warning in messages[0]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(importance_sampling_level="sequence", loss_type="grpo"),
        dict(loss_type="luspo", importance_sampling_level="sequence"),
        dict(loss_type="vespo"),
        dict(loss_type="sapo"),
    ],
)
def test_paper_setups_do_not_warn(base, monkeypatch, overrides):
    messages = []
    monkeypatch.setattr(grpo_config.logger, "warning", messages.append)
    GRPOConfig(**base, **overrides)
    assert messages == []


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
        beta=0.04,
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
    (
        dict(num_generations=1),
        "num_generations must be at least 2 (got 1): GRPO requires at least 2 generations per prompt, since each",
    ),
    (
        dict(per_device_train_batch_size=3, num_generations=2),
        "generation_batch_size (3) must be divisible by num_generations (2). The generation batch (3 completions = "
        "per_device_train_batch_size 3 × 1 processes × steps_per_generation 1) must hold whole groups",
    ),
    (
        dict(sync_ref_model=True, beta=0.0),
        "`sync_ref_model=True` while `beta=0.0` has nothing to sync: beta=0.0 loads no reference model; set beta > 0 or "
        "sync_ref_model=False.",
    ),
    (
        dict(loss_type="ppo"),
        "Unknown loss type: ppo. loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo.",
    ),
    (
        dict(importance_sampling_level="seq"),
        "Unknown importance sampling level: seq. importance_sampling_level must be 'token' or 'sequence'.",
    ),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile must be in [0, 1] (got 1.5)."),
    (dict(top_entropy_quantile=-0.1), "top_entropy_quantile must be in [0, 1] (got -0.1)."),
    (
        dict(sapo_temperature_neg=0.0),
        "sapo_temperature_pos and sapo_temperature_neg must be > 0 (got 1.0, 0.0).",
    ),
    (
        dict(entropy_coef_min=0.5, entropy_coef_max=0.1),
        "entropy_coef_min (0.5) must not exceed entropy_coef_max (0.1).",
    ),
    (
        dict(scale_rewards="global"),
        "Invalid value for scale_rewards: global. It must be one of group, batch, none (or True for group, False for none).",
    ),
    (dict(ref_model_sync_strategy="never"), "ref_model_sync_strategy must be one of steps, epoch (got 'never')."),
    (
        dict(steps_per_generation=2, generation_batch_size=16),
        "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time: set one of "
        "them, the other is derived from it.",
    ),
    (
        dict(per_device_train_batch_size=4, num_generations=2, generation_batch_size=10),
        "generation_batch_size (10) must be divisible by the global batch size (4): a multiple of "
        "per_device_train_batch_size × num_processes.",
    ),
    (dict(beta=-0.1), "beta must be >= 0 (got -0.1)."),
    (dict(num_iterations=0), "num_iterations must be at least 1 (got 0)."),
    (dict(max_completion_length=0), "max_completion_length must be at least 1 (got 0)."),
    (dict(reward_weights=[]), "reward_weights must be None or a non-empty list."),
    (
        dict(multi_objective_aggregation="mean"),
        "Invalid multi_objective_aggregation: mean. It must be one of sum_then_normalize, normalize_then_sum.",
    ),
    (dict(num_generations_eval=0), "num_generations_eval must be at least 1 or None (got 0)."),
    (dict(pad_to_multiple_of=0), "pad_to_multiple_of must be at least 1 or None (got 0)."),
    (
        dict(vllm_mode="remote"),
        "vllm_mode must be 'colocate' (an in-process vLLM engine) or 'server' (a `trl vllm-serve` server) (got "
        "'remote').",
    ),
    (dict(vllm_model_impl="hf"), "vllm_model_impl must be 'vllm' or 'transformers' (got 'hf')."),
    (
        dict(vllm_importance_sampling_mode="token"),
        "Unknown vLLM importance sampling mode: 'token'. vllm_importance_sampling_mode must be one of "
        "'token_truncate', 'token_mask', 'sequence_truncate' or 'sequence_mask'.",
    ),
    (
        dict(vllm_importance_sampling_clip_max=0.0),
        "vllm_importance_sampling_clip_max must be > 0 or None (got 0.0): it bounds a ratio of two probabilities, "
        "which is positive.",
    ),
    (
        dict(vllm_importance_sampling_clip_min=-0.5),
        "vllm_importance_sampling_clip_min must be >= 0 or None (got -0.5): it bounds a ratio of two probabilities, "
        "which is positive.",
    ),
    (
        dict(vllm_importance_sampling_clip_min=3.0),  # TRL 1.16 refuses C_min = C_max too
        "vllm_importance_sampling_clip_min (3.0) must be less than vllm_importance_sampling_clip_max (3.0): lower the "
        "first or raise the second.",
    ),
    (
        dict(vllm_importance_sampling_cap=0.4, vllm_importance_sampling_clip_min=0.5),  # the cap is the upper bound
        "vllm_importance_sampling_clip_min (0.5) must be less than vllm_importance_sampling_clip_max (0.4)",
    ),
    (
        dict(vllm_gpu_memory_utilization=0.0),
        "vllm_gpu_memory_utilization must be in (0, 1] (got 0.0): the fraction of the accelerator's memory the "
        "colocated vLLM engine may take.",
    ),
    (dict(vllm_gpu_memory_utilization=1.5), "vllm_gpu_memory_utilization must be in (0, 1] (got 1.5)"),
    (dict(vllm_tensor_parallel_size=0), "vllm_tensor_parallel_size must be at least 1 (got 0)."),
    (dict(vllm_max_model_length=0), "vllm_max_model_length must be at least 1 or None (got 0)."),
    (dict(vllm_server_timeout=0.0), "vllm_server_timeout must be > 0 seconds (got 0.0)."),
    (dict(vllm_server_port=0), "vllm_server_port must be a TCP port in 1..65535 (got 0)."),
    (dict(vllm_group_port=65536), "vllm_group_port must be a TCP port in 1..65535 (got 65536)."),
    (
        dict(use_vllm=True, vllm_tensor_parallel_size=2),
        "vllm_tensor_parallel_size=2 with vllm_mode='colocate' is not supported here yet: set "
        "vllm_tensor_parallel_size=1, or use vllm_mode='server' with a server started by "
        "`trl vllm-serve --tensor_parallel_size 2`.",
    ),
    (
        dict(use_vllm=True, vllm_enable_sleep_mode=True),  # `base` is a CPU run
        "vllm_enable_sleep_mode=True is not supported here yet (vLLM has no sleep mode on the CPU): set "
        "vllm_enable_sleep_mode=False; the engine then keeps its weights and KV cache between generations (lower "
        "vllm_gpu_memory_utilization to leave the trainer more memory).",
    ),
    (
        dict(use_transformers_continuous_batching=True),
        "use_transformers_continuous_batching=True asks for continuous batching, which this package does not support",
    ),
    (
        dict(use_transformers_paged=True),
        "use_transformers_paged=True asks for continuous batching (`use_transformers_paged` is deprecated in TRL",
    ),
    (
        dict(transformers_continuous_batching_config={}),
        "transformers_continuous_batching_config={} asks for continuous batching, which this package does not",
    ),
    (
        dict(max_tool_calling_iterations=3),
        "max_tool_calling_iterations=3 asks for tool calling, which this package does not support (completions are "
        "generated with transformers' `generate`): leave it None.",
    ),
    (
        dict(log_completions_hub_repo="me/completions"),
        "log_completions_hub_repo='me/completions' asks for uploading completions to the Hub, which this package",
    ),
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


# TRL 1.16.0's defaults (read from its GRPOConfig) for the fields added for compatibility.
def test_pad_to_multiple_of_auto_resolves_to_none_off_neuron(base):
    assert GRPOConfig(**base).pad_to_multiple_of is None  # "auto" resolves to None off AWS Neuron


@pytest.mark.parametrize("value, expected", [("auto", None), ("none", None), ("null", None), ("16", 16), (8, 8)])
def test_pad_to_multiple_of_values(base, value, expected):
    assert GRPOConfig(**base, pad_to_multiple_of=value).pad_to_multiple_of == expected


def test_vllm_fields_are_accepted_while_vllm_is_off(base):
    args = GRPOConfig(**base, vllm_mode="server", vllm_gpu_memory_utilization=0.5, log_multimodal=False)
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (False, "server", 0.5)
    # what only a vLLM run refuses: tensor parallelism and sleep mode in colocate mode
    args = GRPOConfig(**base, vllm_tensor_parallel_size=2, vllm_enable_sleep_mode=True)
    assert (args.use_vllm, args.vllm_tensor_parallel_size, args.vllm_enable_sleep_mode) == (False, 2, True)


def test_use_vllm_is_accepted(base):
    args = GRPOConfig(**base, use_vllm=True)
    assert (args.use_vllm, args.vllm_mode, args.vllm_importance_sampling_mode) == (True, "colocate", "sequence_mask")
    assert (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max) == (None, 3.0)
    # server mode: the server has its own tensor parallelism (`trl vllm-serve --tensor_parallel_size`)
    server = GRPOConfig(**base, use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=2)
    assert (server.vllm_mode, server.vllm_tensor_parallel_size) == ("server", 2)
    edges = GRPOConfig(
        **base,
        use_vllm=True,
        vllm_gpu_memory_utilization=1.0,
        vllm_importance_sampling_clip_min=0.0,  # the same as None (a ratio is > 0)
        vllm_importance_sampling_clip_max=None,  # mask or clamp from below only
        vllm_max_model_length=1,
    )
    assert (edges.vllm_importance_sampling_clip_min, edges.vllm_importance_sampling_clip_max) == (0.0, None)


def test_vllm_sleep_mode_is_refused_on_a_gpu_too(base, monkeypatch):
    _forced_device(monkeypatch, "cuda")
    with pytest.raises(ValueError, match=r"vllm_enable_sleep_mode=True is not supported here yet \(it has not run"):
        GRPOConfig(**{**base, "use_cpu": False}, bf16=False, use_vllm=True, vllm_enable_sleep_mode=True)
    server = GRPOConfig(**{**base, "use_cpu": False}, bf16=False, use_vllm=True, vllm_mode="server")
    assert server.vllm_enable_sleep_mode is False


def test_deprecated_importance_sampling_cap_becomes_clip_max(base):
    """TRL 1.16: a FutureWarning, and the cap's value replaces clip_max, also one that was set."""
    deprecated = (
        "The `vllm_importance_sampling_cap` argument is deprecated and will be removed in TRL 2.0: set "
        "`vllm_importance_sampling_clip_max` instead. Its value 2.0 is used as the upper bound"
    )

    def cap_warnings(caught) -> list[warnings.WarningMessage]:  # transformers adds its own FutureWarnings
        return [w for w in caught if "vllm_importance_sampling_cap" in str(w.message)]

    with pytest.warns(FutureWarning) as caught:
        args = GRPOConfig(**base, vllm_importance_sampling_cap=2.0)
    assert [(w.category, str(w.message)) for w in cap_warnings(caught)] == [(FutureWarning, deprecated + ".")]
    assert cap_warnings(caught)[0].filename == __file__  # points at the caller's line
    assert (args.vllm_importance_sampling_cap, args.vllm_importance_sampling_clip_max) == (2.0, 2.0)
    with pytest.warns(FutureWarning) as caught:
        args = GRPOConfig(**base, vllm_importance_sampling_cap=2.0, vllm_importance_sampling_clip_max=5.0)
    message = deprecated + ", replacing vllm_importance_sampling_clip_max=5.0."
    assert [str(w.message) for w in cap_warnings(caught)] == [message]
    assert args.vllm_importance_sampling_clip_max == 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert GRPOConfig(**base, vllm_importance_sampling_clip_max=5.0).vllm_importance_sampling_clip_max == 5.0
    assert cap_warnings(caught) == []  # no cap, no warning


def test_chat_template_kwargs_from_a_json_string(base):  # as the command line passes it
    args = GRPOConfig(**base, chat_template_kwargs='{"enable_thinking": false}')
    assert args.chat_template_kwargs == {"enable_thinking": False}


def test_a_removed_performance_field_names_its_replacement(grpo_kwargs):
    from trl.trainer.grpo_config import REMOVED_FIELDS

    assert not REMOVED_FIELDS.keys() & {f.name for f in dataclasses.fields(GRPOConfig)}
    with pytest.raises(TypeError) as error:
        GRPOConfig(**grpo_kwargs, shared_prefix_scoring=False, retain_freed_cpu_memory=True)
    assert str(error.value) == (
        "GRPOConfig no longer has retain_freed_cpu_memory, shared_prefix_scoring: use retain_freed_cpu_memory -> the "
        "environment variable TRL_RETAIN_FREED_CPU_MEMORY=1; shared_prefix_scoring -> shared_prefix."
    )
    assert GRPOConfig(**grpo_kwargs, shared_prefix=False).shared_prefix is False


def _forced_device(monkeypatch, device_type: str) -> None:
    """`GRPOConfig.device` reports `device_type` (after TrainingArguments' own device setup has run)."""
    real = GRPOConfig.device.fget
    monkeypatch.setattr(GRPOConfig, "device", property(lambda self: (real(self), torch.device(device_type))[1]))


def _docs_defaults_table() -> dict[str, tuple[str, str]]:
    """The docs' "Performance fields" table: row name → (default on the CPU, default on accelerators)."""
    text = (Path(__file__).parents[1] / "docs/source/grpo_trainer.md").read_text()
    table = text.split("### Performance fields", 1)[1].split("| field | acts on |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {cells[0].strip("| `"): (cells[2], cells[3]) for cells in rows}


@pytest.mark.parametrize("device_type", ["cpu", "cuda", "xpu", "mps", "hpu"])
def test_unverified_performance_paths_are_plain_off_the_cpu(base, monkeypatch, device_type):
    from trl.trainer.device_defaults import TIED_ROW_GRADIENT_DEVICES, VERIFIED_DEVICES, tied_row_gradient

    _forced_device(monkeypatch, device_type)
    args = GRPOConfig(**{**base, "use_cpu": False}, bf16=False)
    on_cpu = device_type == "cpu"
    resolved = {name: getattr(args, name) for name in VERIFIED_DEVICES}
    assert resolved == {"shared_prefix": on_cpu, "inverse_cdf_sampling": on_cpu, "chunked_logprobs": on_cpu}
    assert (args.recompute_elementwise_activations, args.offload_ref_model) == (False, False)
    assert tied_row_gradient(device_type) is on_cpu and TIED_ROW_GRADIENT_DEVICES == ("cpu",)
    # what the user sets stays, on every device
    forced = GRPOConfig(**{**base, "use_cpu": False}, bf16=False, shared_prefix=True, chunked_logprobs=False)
    assert (forced.shared_prefix, forced.chunked_logprobs) == (True, False)
    # the docs' per-device table says the same
    column = 0 if on_cpu else 1
    table = _docs_defaults_table()
    for name in [*VERIFIED_DEVICES, "recompute_elementwise_activations", "offload_ref_model"]:
        assert table[name][column].startswith(f"`{getattr(args, name)}`"), name
    tied_row = next(cells for row, cells in table.items() if "tied input embedding's row gradient" in row)
    assert tied_row[column].startswith("on" if tied_row_gradient(device_type) else "off")


# ---------------------------------------------------------------- no field accepted and silently ignored (issue 41)

# Every field shared with TRL 1.16's GRPOConfig (and ours), in exactly one of these groups. Acted on: read by this
# package (the TrainingArguments fields TRL redeclares by transformers' Trainer, whose subclass GRPOTrainer is).
TRAINING_ARGUMENTS_ACTED_ON = {
    "bf16",
    "gradient_checkpointing",
    "learning_rate",
    "logging_steps",
    "lr_scheduler_kwargs",
    "remove_unused_columns",
    "torch_empty_cache_steps",
}
ACTED_ON = {
    "beta",
    "cache_implementation",
    "cast_lm_head_to_fp32",
    "chat_template_kwargs",
    "delta",
    "disable_dropout",
    "ds3_gather_for_generation",
    "entropy_coef",
    "entropy_coef_delta",
    "entropy_coef_max",
    "entropy_coef_min",
    "entropy_target",
    "epsilon",
    "epsilon_high",
    "generation_batch_size",
    "generation_kwargs",
    "importance_sampling_level",
    "log_completions",
    "log_unique_prompts",
    "loss_type",
    "mask_truncated_completions",
    "max_completion_length",
    "min_p",
    "model_init_kwargs",
    "multi_objective_aggregation",
    "num_completions_to_print",
    "num_generations",
    "num_generations_eval",
    "num_iterations",
    "off_policy_mask_threshold",
    "pad_to_multiple_of",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "repetition_penalty",
    "reward_weights",
    "router_aux_loss_coef",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "scale_rewards",
    "shuffle_dataset",
    "steps_per_generation",
    "sync_ref_model",
    "temperature",
    "top_entropy_quantile",
    "top_k",
    "top_p",
    "trust_remote_code",
    "use_adaptive_entropy",
    "use_bias_correction_kl",
    "vespo_k_neg",
    "vespo_k_pos",
    "vespo_lambda_neg",
    "vespo_lambda_pos",
} | set(OUR_ONLY_DEFAULTS)
# vLLM generation (issue 42), read by the trainer and `trl/generation/vllm_*.py`.
VLLM_ACTED_ON = {
    "use_vllm",
    "vllm_mode",
    "vllm_model_impl",
    "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
}
ACTED_ON |= VLLM_ACTED_ON
# Acted on by GRPOConfig itself: a deprecated TRL name whose value `__post_init__` moves to its new field.
DEPRECATED_ALIASES = {"vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max"}
# Refused: a non-default value (field: the value tried, the fix the message names) raises a ValueError.
RAISES = {
    "use_transformers_continuous_batching": (True, "set it to False"),
    "use_transformers_paged": (True, "set it to False"),
    "transformers_continuous_batching_config": ({"max_batch_tokens": 64}, "leave it None"),
    "max_tool_calling_iterations": (3, "leave it None"),
    "log_completions_hub_repo": ("me/completions", "leave it None"),
    "use_liger_kernel": (True, "set it to False"),
}
# Used only when a refused switch is on, as in TRL (field: a non-default value, its switch); accepted, no effect.
ONLY_WITH = {
    "liger_kernel_config": ({"rms_norm": False}, "use_liger_kernel"),  # TrainingArguments; TRL's GRPOTrainer edits it
}
# Nothing to act on for the models supported here (text only), as in TRL for a text model.
TEXT_ONLY = {"log_multimodal"}
SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trl")


def _readers(name: str) -> list[str]:
    """Files of `trl/` (GRPOConfig's own module aside) whose code, comments stripped, names `name` as an attribute
    (`args.name`) or a string (`getattr(args, "name")`)."""
    pattern = re.compile(rf"\.{name}\b|[\"']{name}[\"']")
    found = []
    for folder, _, files in os.walk(SOURCE):
        for file in files:
            path = os.path.join(folder, file)
            if file.endswith(".py") and path != grpo_config.__file__:
                with open(path) as handle:
                    code = "\n".join(line.split("#")[0] for line in handle)
                if pattern.search(code):
                    found.append(os.path.relpath(path, SOURCE))
    return found


def test_every_shared_field_is_acted_on_refused_or_only_used_with_its_switch():
    """A field added to GRPOConfig (or to the TRL list) fails here until it is put in one group."""
    groups = [ACTED_ON, TRAINING_ARGUMENTS_ACTED_ON, set(RAISES), set(ONLY_WITH), TEXT_ONLY, set(DEPRECATED_ALIASES)]
    assert sum(map(len, groups)) == len(set().union(*groups)), "a field is in two groups"
    ours = {f.name for f in dataclasses.fields(GRPOConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set().union(*groups) == ours | set(TRL_1_16_DEFAULTS) | {"liger_kernel_config"}


def _acting_readers(name: str) -> list[str]:
    """`_readers(name)` without `trl_compat`'s mirror of it as TRL's read-only trainer attribute (`CONFIG_ATTRIBUTES`),
    which acts on nothing."""
    from trl.trainer.trl_compat import CONFIG_ATTRIBUTES

    readers = _readers(name)
    if name in CONFIG_ATTRIBUTES.values():
        readers = [path for path in readers if path != os.path.join("trainer", "trl_compat.py")]
    return readers


@pytest.mark.parametrize("name", sorted(ACTED_ON))
def test_an_acted_on_field_is_read_outside_the_config(name):
    assert _acting_readers(name), f"nothing in trl/ reads {name}"


@pytest.mark.parametrize("name", sorted(set(ONLY_WITH) | TEXT_ONLY))
def test_an_unused_field_is_read_nowhere(name):
    # When one of these starts to be read, move it to ACTED_ON and test its effect.
    assert _acting_readers(name) == []


@pytest.mark.parametrize("alias, field", sorted(DEPRECATED_ALIASES.items()))
def test_a_deprecated_alias_is_read_only_by_the_config(alias, field):
    assert _readers(alias) == []  # GRPOConfig moves its value to `field` (tested above), nothing else reads it
    assert field in ACTED_ON


@pytest.mark.parametrize("name", sorted(RAISES))
def test_a_refused_field_set_raises_naming_it_and_the_fix(base, name):
    value, fix = RAISES[name]
    extra = {"log_completions": True} if name == "log_completions_hub_repo" else {}
    with pytest.raises(ValueError) as info:
        GRPOConfig(**base, **extra, **{name: value})
    pattern = rf"Invalid GRPOConfig:\n- {name}={re.escape(repr(value))} asks for [^\n]+, which this package does not "
    pattern += rf"support \([^\n]+\): {fix}\."
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert getattr(GRPOConfig(**base, **extra), name) == TRL_1_16_DEFAULTS[name]  # the default is accepted


def test_use_liger_kernel_is_refused_with_what_to_use(base):
    with pytest.raises(ValueError) as info:
        GRPOConfig(**base, use_liger_kernel=True)
    assert str(info.value) == (
        "Invalid GRPOConfig:\n- use_liger_kernel=True asks for Liger Kernel, which this package does not support "
        "(neither Liger's fused linear GRPO loss nor the Triton layer kernels that TRL 1.16, which deprecates this "
        "field, has transformers patch into the model; here `chunked_logprobs` (on by default in CPU runs) keeps the "
        "LM head's logits from existing whole): set it to False."
    )


def test_fields_used_only_with_a_refused_switch_are_accepted_while_it_is_off(base):
    values = {name: value for name, (value, _) in ONLY_WITH.items()}
    args = GRPOConfig(**base, **values, log_multimodal=False)
    assert {name: getattr(args, name) for name in values} == values
    assert (args.use_liger_kernel, args.log_multimodal) == (False, False)


@pytest.mark.parametrize("value, expected", [(None, True), ("false", False), ("true", True)])
def test_device_aware_fields_on_the_command_line(tmp_path, value, expected):
    from trl.scripts.utils import TrlParser

    names = ("shared_prefix", "inverse_cdf_sampling", "chunked_logprobs")
    argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    for name in names if value is not None else ():
        argv += [f"--{name}", value]
    (args,) = TrlParser((GRPOConfig,)).parse_args_into_dataclasses(argv)
    assert [getattr(args, name) for name in names] == [expected] * 3  # unset: resolved for this CPU run
