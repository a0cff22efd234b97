# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What a TRL 1.16 GRPO script does, run through GRPOTrainer on a tiny model: async / partial / class rewards,
logging hooks, multi-objective aggregation, all-None warnings, eval groups, chat-template kwargs, padding,
trust_remote_code and the errors for missing inputs. Values are read where a user reads them: the log history,
the completions table, the error message."""

import asyncio
import contextlib
import functools
import io
import json
import math
import re
import sys
from unittest import mock

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from upstream_venv import run_upstream_script

from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_rewards


def first_token_reward(completion_ids, **kwargs):
    return [float(ids[0] % 5) for ids in completion_ids]


def last_log_with(trainer, key):
    return [entry for entry in trainer.state.log_history if key in entry][-1]


def test_async_partial_and_class_rewards_with_logging_hooks(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    returned, loops = {}, []

    async def async_first_token(completion_ids, log_metric, **kwargs):
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        returned["async"] = first_token_reward(completion_ids)
        log_metric("first_token_sum", sum(returned["async"]))
        return returned["async"]

    def length_plus(completion_ids, offset, log_extra, **kwargs):
        returned["partial"] = [len(ids) + offset for ids in completion_ids]
        log_extra("length_plus", returned["partial"])
        return returned["partial"]

    class Judge:
        def __call__(self, completions, log_metric, **kwargs):
            log_metric("judged", len(completions))
            return [1.0] * len(completions)

    args = GRPOConfig(**grpo_kwargs, log_completions=True, num_completions_to_print=2)
    reward_funcs = [async_first_token, functools.partial(length_plus, offset=0.5), Judge()]
    trainer = GRPOTrainer(tiny_lm_path, reward_funcs, args=args, train_dataset=arithmetic_dataset)
    assert trainer.reward_func_names == ["async_first_token", "length_plus", "Judge"]
    trainer.train()

    log = last_log_with(trainer, "reward")
    assert log["rewards/async_first_token/mean"] == pytest.approx(sum(returned["async"]) / 8)
    assert log["rewards/length_plus/mean"] == pytest.approx(sum(returned["partial"]) / 8)
    assert log["rewards/Judge/mean"] == 1.0
    assert log["reward"] == pytest.approx((sum(returned["async"]) + sum(returned["partial"])) / 8 + 1.0)
    assert log["first_token_sum"] == sum(returned["async"]) and log["judged"] == 8.0  # log_metric values
    table = trainer._last_completions  # log_extra adds a column to the completions table
    assert list(table) == ["prompt", "completion", "reward", "length_plus", "advantage"]
    assert table["length_plus"] == returned["partial"]
    assert loops == [trainer._reward_loop.loop]  # the trainer's own loop


def test_logged_names_that_clash_with_built_in_ones_merge_as_in_trl(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """`log_extra("reward", ...)` replaces the table's reward column (`advantage` stays last); `log_metric("reward",
    ...)` is averaged with the built-in `reward` of the batch."""

    def clashing(completions, log_extra, log_metric, **kwargs):
        log_extra("reward", [-7.0] * len(completions))
        log_extra("advantage", [-8.0] * len(completions))
        log_metric("reward", 100.0)
        return [1.0] * len(completions)

    args = GRPOConfig(**grpo_kwargs, log_completions=True)
    trainer = GRPOTrainer(tiny_lm_path, clashing, args=args, train_dataset=arithmetic_dataset)
    trainer.train()
    table = trainer._last_completions
    assert list(table) == ["prompt", "completion", "reward", "advantage"]
    assert table["reward"] == [-7.0] * 8 and table["advantage"] == [0.0] * 8  # the group's advantages, not -8
    assert last_log_with(trainer, "reward")["reward"] == pytest.approx((1.0 + 100.0) / 2)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_aggregation_weights_and_none(tiny_lm_path, arithmetic_dataset, grpo_kwargs, aggregation):
    returned = {}

    def first_token(completion_ids, **kwargs):
        returned["a"] = first_token_reward(completion_ids)
        return returned["a"]

    def odd_or_none(completion_ids, **kwargs):  # None for some completions
        returned["b"] = [None if i % 3 == 0 else float(ids[-1] % 2) for i, ids in enumerate(completion_ids)]
        return returned["b"]

    args = GRPOConfig(
        **grpo_kwargs, reward_weights=[1.0, 3.0], multi_objective_aggregation=aggregation, log_completions=True
    )
    trainer = GRPOTrainer(tiny_lm_path, [first_token, odd_or_none], args=args, train_dataset=arithmetic_dataset)
    trainer.train()
    weighted = [a + (3.0 * b if b is not None else 0.0) for a, b in zip(returned["a"], returned["b"])]
    assert last_log_with(trainer, "reward")["reward"] == pytest.approx(sum(weighted) / 8)  # weights, both modes
    advantages = torch.tensor(trainer._last_completions["advantage"])
    assert torch.isfinite(advantages).all()
    assert trainer._last_completions["reward"] == pytest.approx(weighted)
    a = torch.tensor(returned["a"]).view(2, 4)
    b = torch.tensor([math.nan if v is None else v for v in returned["b"]]).view(2, 4)
    if aggregation == "sum_then_normalize":
        r = torch.tensor(weighted).view(2, 4)
        expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
        expected = torch.where(r.std(1, keepdim=True) > 0, expected, torch.zeros_like(expected))
    else:

        def normalise(x):  # within each group, ignoring NaN; groups with one value or equal values give 0
            mean = torch.nanmean(x, 1, keepdim=True)
            count = (~x.isnan()).sum(1, keepdim=True)
            std = (torch.nansum((x - mean) ** 2, 1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
            return torch.where(std > 0, (x - mean) / (std + 1e-4), torch.zeros_like(x)).nan_to_num(0.0)

        summed = (normalise(a) + 3.0 * normalise(b)).flatten()
        expected = (summed - summed.mean()) / (summed.std() + 1e-4)
    assert torch.allclose(advantages, expected.flatten(), rtol=1e-4, atol=1e-5)


def test_all_none_rewards_warn_with_the_inputs(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    seen = {}

    def never(prompts, completions, answer, **kwargs):
        seen.update(prompt=prompts[0], completion=completions[0], answer=answer[0])
        return [None] * len(prompts)

    trainer = GRPOTrainer(tiny_lm_path, never, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)
    assert grpo_rewards.trainer_logger.name == "trl.trainer.grpo_trainer"  # TRL's logger for this warning
    with mock.patch.object(grpo_rewards.trainer_logger, "warning") as warning:
        trainer.train()
    warning.assert_called_once_with(
        "All reward functions returned None for the following kwargs:\n"
        f"{ {'answer': seen['answer'], 'prompt': seen['prompt'], 'completion': seen['completion']} }\n(the first of 8 "
        "of 8 completions that no reward function scored; these get advantage 0). Make at least one reward function "
        "return a number for every completion."
    )
    assert all(chunk["advantages"].eq(0).all() for chunk in trainer._buffered_inputs)


def test_num_generations_eval_one(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    prompts_seen, returned = [], []

    def recording(prompts, completion_ids, **kwargs):
        prompts_seen.extend(prompts)
        returned.extend(first_token_reward(completion_ids))
        return returned[-len(prompts) :]

    # 3 completions per eval batch: not divisible by num_generations=4, fine for num_generations_eval=1.
    args = GRPOConfig(**grpo_kwargs, num_generations_eval=1, per_device_eval_batch_size=3)
    eval_dataset = arithmetic_dataset.select(range(3))
    trainer = GRPOTrainer(
        tiny_lm_path, recording, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
    )
    metrics = trainer.evaluate()
    order = torch.randperm(3, generator=torch.Generator().manual_seed(args.seed)).tolist()  # TRL's seeded order
    assert prompts_seen == [eval_dataset["prompt"][i] for i in order]  # one completion per prompt
    assert metrics["eval_loss"] == 0.0
    logged = trainer.state.log_history[-1]
    # Every single-completion group counts as zero-std (as TRL); reward_std is the std over the whole eval batch.
    assert logged["eval_frac_reward_zero_std"] == 1.0
    values = torch.tensor(returned)  # one eval batch of 3 single-completion groups
    assert logged["eval_reward"] == pytest.approx(values.mean().item())
    assert logged["eval_reward_std"] == pytest.approx(values.std().item())


def test_evaluation_does_not_replace_the_training_completions_table(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """The table printed at the next training log shows training completions, not the last eval batch (with
    num_iterations=2 the next step generates nothing new)."""
    args = GRPOConfig(**grpo_kwargs, log_completions=True, num_iterations=2, num_generations_eval=2)
    eval_dataset = Dataset.from_dict({"prompt": ["eval prompt"] * 2})
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
    )
    trainer.train()
    table = trainer._last_completions
    assert len(table["prompt"]) == 8 and set(table["prompt"]) <= set(arithmetic_dataset["prompt"])
    trainer.evaluate()
    assert trainer._last_completions is table


def test_eval_prompts_come_in_trls_seeded_order(tiny_lm_path, grpo_kwargs):
    """The eval sampler shuffles with `seed` like TRL 1.16's: the order below was recorded from TRL 1.16.0's
    `GRPOTrainer.evaluate()` on these 10 prompts with seed=3, num_generations_eval=2, and is the same at every call."""
    dataset = Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(10)]})
    args = GRPOConfig(**{**grpo_kwargs, "seed": 3}, num_generations_eval=2, per_device_eval_batch_size=4)
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=dataset, eval_dataset=dataset)
    sampler = trainer._get_eval_sampler(dataset)
    trl_order = [6, 0, 3, 7, 8, 5, 1, 9, 2, 4]
    assert list(sampler) == [i for i in trl_order for _ in range(2)]
    assert list(sampler) == list(trainer._get_eval_sampler(dataset))


def test_eval_batch_must_divide_by_num_generations_eval(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**grpo_kwargs, num_generations_eval=3, per_device_eval_batch_size=4)
    with pytest.raises(
        ValueError,
        match=r"must be divisible by the number of generations used for evaluation \(3\) \(num_generations_eval",
    ):
        GRPOTrainer(
            tiny_lm_path,
            first_token_reward,
            args=args,
            train_dataset=arithmetic_dataset,
            eval_dataset=arithmetic_dataset,
        )


def test_chat_template_kwargs_and_unique_prompts(tiny_lm_path, grpo_kwargs):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    tokenizer.chat_template = (
        "{% if enable_thinking is defined and not enable_thinking %}9 {% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+1="}] for i in range(8)]})
    args = GRPOConfig(
        **grpo_kwargs, chat_template_kwargs={"enable_thinking": False}, log_completions=True, log_unique_prompts=True
    )
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    table = trainer._last_completions
    assert len(table["prompt"]) == 2  # 8 completions of 2 prompts: one row per prompt
    assert len({str(p) for p in table["prompt"]}) == 2  # the prompts as given (messages), as TRL logs them
    # The chat template saw enable_thinking=False: every tokenised prompt starts with its "9 " marker.
    prompt_ids = torch.cat([chunk["prompt_ids"] for chunk in trainer._buffered_inputs])
    prompt_mask = torch.cat([chunk["prompt_mask"] for chunk in trainer._buffered_inputs])
    texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(prompt_ids, prompt_mask)]
    assert all(t.startswith("9 ") and t.endswith("+1=") for t in texts), texts


def test_pad_to_multiple_of_pads_and_masks(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """Padding is invisible: the same completions, reference log-probs and gradient as without it (the loss itself
    is ≈ 0 on-policy, so it would not show a difference)."""
    runs = {}
    for multiple in (None, 8):
        args = GRPOConfig(**{**grpo_kwargs, "pad_to_multiple_of": multiple, "beta": 0.1})
        trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
        trainer.train()
        batch = trainer._buffered_inputs[0]
        prompt, mask = batch["prompt_ids"], batch["completion_mask"].bool()
        runs[multiple] = {
            "grad_norm": last_log_with(trainer, "grad_norm")["grad_norm"],
            "prompts": [ids[m.bool()].tolist() for ids, m in zip(prompt, batch["prompt_mask"])],
            "completions": [ids[m].tolist() for ids, m in zip(batch["completion_ids"], mask)],
            "ref": batch["ref_per_token_logps"][mask],
        }
        if multiple:
            assert prompt.size(1) == 8 and batch["completion_ids"].size(1) == 8
            assert batch["completion_mask"][:, 4:].eq(0).all()  # max_completion_length=4: the rest is padding
    padded, plain = runs[8], runs[None]
    assert padded["prompts"] == plain["prompts"] and padded["completions"] == plain["completions"]
    assert torch.allclose(padded["ref"], plain["ref"], atol=1e-5)
    assert padded["grad_norm"] > 0 and padded["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)


def test_trust_remote_code_reaches_every_load(tiny_lm_path, tiny_rm_path, arithmetic_dataset, grpo_kwargs):
    calls = []

    def recorder(cls):
        original = cls.from_pretrained

        def from_pretrained(path, *args, **kwargs):
            calls.append((cls.__name__, kwargs.get("trust_remote_code")))
            return original(path, *args, **kwargs)

        return mock.patch.object(cls, "from_pretrained", from_pretrained)

    with (
        recorder(AutoModelForCausalLM),
        recorder(AutoModelForSequenceClassification),
        recorder(AutoTokenizer),
    ):
        GRPOTrainer(
            tiny_lm_path,
            [tiny_rm_path, first_token_reward],
            args=GRPOConfig(**grpo_kwargs, trust_remote_code=True),
            train_dataset=arithmetic_dataset,
        )
    assert sorted(set(calls)) == [
        ("AutoModelForCausalLM", True),
        ("AutoModelForSequenceClassification", True),
        ("AutoTokenizer", True),
    ]
    assert len(calls) == 4  # policy, its tokenizer, reward model, its tokenizer


def test_tokenizers_are_loaded_from_the_models_revision(tiny_lm_path, tiny_rm_path, arithmetic_dataset, grpo_kwargs):
    """`model_init_kwargs={"revision": ...}` (the CLI's `--model_revision`): the policy's and the reward model's
    tokenizers come from the same revision as the weights, as in TRL; a reward model passed as an object gets None."""
    calls = []
    original = AutoTokenizer.from_pretrained

    def from_pretrained(path, *args, **kwargs):
        calls.append((path, kwargs.get("revision")))
        return original(path, *args, **kwargs)

    reward_model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path, num_labels=1)
    with mock.patch.object(AutoTokenizer, "from_pretrained", from_pretrained):
        GRPOTrainer(
            tiny_lm_path,
            [tiny_rm_path, reward_model, first_token_reward],
            args=GRPOConfig(**grpo_kwargs, model_init_kwargs={"revision": "v2"}),
            train_dataset=arithmetic_dataset,
        )
    assert calls == [(tiny_lm_path, "v2"), (tiny_rm_path, "v2"), (tiny_rm_path, None)]


# ---------------------------------------------------------------- missing inputs


def test_missing_reward_funcs_raises(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    with pytest.raises(
        ValueError, match=r"No reward source provided: GRPOTrainer needs at least one reward, so pass `reward_funcs`"
    ):
        GRPOTrainer(tiny_lm_path, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)


def test_missing_train_dataset_raises(tiny_lm_path, grpo_kwargs):
    with pytest.raises(ValueError, match=r"`train_dataset` is required: GRPOTrainer samples its prompts from it"):
        GRPOTrainer(tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs))


def test_reward_processing_classes_must_match_a_single_function(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    with pytest.raises(
        ValueError, match=r"number of reward processing classes \(2\) must match the number of reward functions \(1\)"
    ):
        GRPOTrainer(
            tiny_lm_path,
            first_token_reward,
            args=GRPOConfig(**grpo_kwargs),
            train_dataset=arithmetic_dataset,
            reward_processing_classes=[None, None],
        )


def test_unsupported_feature_raises_at_init(grpo_kwargs):
    with pytest.raises(ValueError, match=r"use_transformers_continuous_batching=True asks for continuous batching, "):
        GRPOConfig(**grpo_kwargs, use_transformers_continuous_batching=True)


def test_quantization_config_reaches_from_pretrained(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    seen, original = [], AutoModelForCausalLM.from_pretrained
    sentinel = object()  # stands for a BitsAndBytesConfig (a real one is loaded in tests/test_script_surface.py)

    def from_pretrained(path, *args, **kwargs):
        seen.append(kwargs.pop("quantization_config", None))
        return original(path, *args, **kwargs)

    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", from_pretrained):
        GRPOTrainer(
            tiny_lm_path,
            first_token_reward,
            args=GRPOConfig(**grpo_kwargs),
            train_dataset=arithmetic_dataset,
            quantization_config=sentinel,
        )
    assert seen == [sentinel]
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    with pytest.raises(
        ValueError, match="but your model is already instantiated: quantization_config applies when `model` is a path"
    ):
        GRPOTrainer(model, first_token_reward, args=GRPOConfig(**grpo_kwargs), quantization_config=sentinel)


@pytest.mark.parametrize("name", ["tools", "rollout_func", "environment_factory"])
def test_tool_and_rollout_arguments_raise(tiny_lm_path, arithmetic_dataset, grpo_kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` \\(tool calling / custom rollouts\\) is not supported"):
        GRPOTrainer(
            tiny_lm_path,
            first_token_reward,
            args=GRPOConfig(**grpo_kwargs),
            train_dataset=arithmetic_dataset,
            **{name: [len] if name == "tools" else len},
        )


def test_eval_sampling_depends_on_the_step_not_on_earlier_evaluations(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """Eval draws are seeded by (optimizer step, batch index), so a resumed run evaluates exactly like the
    uninterrupted one, however many evaluations came before."""
    drawn = []

    def recording(completion_ids, **kwargs):
        drawn.append([tuple(ids) for ids in completion_ids])
        return first_token_reward(completion_ids)

    args = GRPOConfig(**{**grpo_kwargs, "per_device_eval_batch_size": 4, "max_completion_length": 8})
    eval_dataset = arithmetic_dataset.select(range(8))

    def evaluate(trainer, step):
        drawn.clear()
        trainer.state.global_step = step
        trainer.evaluate()
        return list(drawn)

    first = GRPOTrainer(
        tiny_lm_path, recording, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
    )
    at_3 = evaluate(first, 3)
    assert len(at_3) == 8 and at_3[0] != at_3[1]  # 8 prompts × 4 completions in batches of 4: 8 eval batches
    assert evaluate(first, 3) == at_3  # a second evaluation at the same step draws the same
    assert evaluate(first, 4) != at_3  # another step, other draws
    fresh = GRPOTrainer(
        tiny_lm_path, recording, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
    )
    assert evaluate(fresh, 3) == at_3  # as a resumed trainer at step 3 would


# Builds a trainer on a tiny model and prints, as JSON, what a subclass or callback written for TRL 1.16 reads from it:
# TRL's trainer attributes (config copies, the attributes of unsupported features at their "off" values, the sampling
# kwargs) and its static and instance helpers on fixed tensors. Run by this package in-process and by TRL 1.16 in its
# venv (`argv`: model path, output folder).
SURFACE_SCRIPT = r"""
import json, sys
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]

args = GRPOConfig(
    output_dir=sys.argv[2], use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
    num_generations=4, max_completion_length=5, top_k=7, epsilon=0.25, vllm_mode="server",
    vllm_importance_sampling_clip_min=0.5, generation_kwargs={"top_p": 0.8}, log_multimodal=False,
)
trainer = GRPOTrainer(sys.argv[1], reward_len, args=args, train_dataset=Dataset.from_dict({"prompt": ["a", "b"] * 4}))
names = [
    "beta", "chat_template", "chat_template_kwargs", "continuous_batching_config", "environment_factories",
    "environments", "eos_token_ids", "epsilon_high", "epsilon_low", "generation_kwargs", "importance_sampling_level",
    "log_completions", "log_multimodal", "log_unique_prompts", "loss_type", "mask_truncated_completions",
    "max_completion_length", "max_tool_calling_iterations", "min_p", "multi_objective_aggregation",
    "num_completions_to_print", "num_generations", "num_generations_eval", "num_iterations",
    "off_policy_mask_threshold", "pad_to_multiple_of", "repetition_penalty", "reward_func_names", "rollout_func",
    "scale_rewards", "shuffle_dataset", "tools", "top_entropy_quantile", "top_k", "top_p", "use_transformers_continuous_batching",
    "use_vllm", "vllm_gpu_memory_utilization", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_mode", "vllm_tensor_parallel_size", "_current_train_step_time",
]
out = {name: getattr(trainer, name) for name in names}
out["reward_weights"] = trainer.reward_weights.tolist()
out["_tokenizer"] = trainer._tokenizer is trainer.processing_class
out["_metrics"] = sorted(trainer._metrics)
generator = torch.Generator().manual_seed(0)
log_ratio = 0.3 * torch.randn(4, 6, generator=generator)
mask = torch.ones(4, 6)
mask[1, 4:] = 0
advantages = torch.tensor([[1.0], [-0.5], [0.0], [-2.0]])
is_ratio = 0.5 + torch.rand(4, 6, generator=generator)
out["gamma_weights"] = GRPOTrainer.get_gamma_weights(advantages, log_ratio, mask, None).tolist()
out["gamma_weights_is"] = GRPOTrainer.get_gamma_weights(advantages, log_ratio, mask, is_ratio, 1.5, 2.5, 2.0, 1.0).tolist()
out["off_policy_mask"] = GRPOTrainer.get_off_policy_mask(advantages, log_ratio, torch.zeros(4, 6), mask, 0.1).tolist()
out["high_entropy_mask"] = trainer.get_high_entropy_mask(log_ratio.abs(), mask, 0.6).tolist()
print(json.dumps(out))
"""


@pytest.mark.parity
def test_trainer_surface_matches_trl_1_16(tiny_lm_path, tmp_path):
    """TRL 1.16's trainer attributes and helpers that subclasses and callbacks read have the same values here, on
    the same model and config (the unsupported features' attributes at TRL's values without them)."""
    upstream = run_upstream_script(SURFACE_SCRIPT, tiny_lm_path, str(tmp_path / "upstream"))
    printed = io.StringIO()
    with mock.patch.object(sys, "argv", ["surface", tiny_lm_path, str(tmp_path / "ours")]):
        with contextlib.redirect_stdout(printed):
            exec(SURFACE_SCRIPT, {"__name__": "surface"})
    ours = json.loads(printed.getvalue().strip().splitlines()[-1])
    assert set(ours) == set(upstream)
    tensors = {"gamma_weights", "gamma_weights_is", "off_policy_mask", "high_entropy_mask"}
    for name in sorted(set(upstream) - tensors):
        assert ours[name] == upstream[name], name
    for name in sorted(tensors):
        assert torch.allclose(torch.tensor(ours[name]), torch.tensor(upstream[name]), rtol=1e-5, atol=0), name
    assert ours["tools"] == [] and ours["max_tool_calling_iterations"] == sys.maxsize  # the values compared
    assert 0.0 < min(min(row) for row in ours["gamma_weights_is"]) and ours["off_policy_mask"] != [[1.0]] * 4


def test_attributes_of_unsupported_features_are_read_only(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset
    )
    assert trainer.tools == [] and trainer.tools is not trainer.tools  # a new list: appending to it changes nothing
    for name in ["tools", "rollout_func", "environments", "environment_factories", "chat_template"]:
        with pytest.raises(AttributeError, match=f"`{name}` belongs to a TRL 1.16 feature that this package does not"):
            setattr(trainer, name, None)
    with pytest.raises(AttributeError, match=re.escape("set `args.vllm_mode` (GRPOConfig)")):
        trainer.vllm_mode = "server"
    assert trainer.generation_kwargs["max_new_tokens"] == grpo_kwargs["max_completion_length"]
    assert trainer.generation_kwargs["eos_token_id"] == trainer.eos_token_ids == trainer.generation_config.eos_token_id


def test_gamma_weights_by_hand():
    """VESPO's φ(w) = e^λ · w^k · e^(−λw) with TRL 1.16's defaults (k, λ) = (2, 3) for Â ≥ 0 and (3, 2) below; a
    token-level importance-sampling ratio multiplies w (all positions), the log-ratios count on valid tokens only."""
    advantages, mask = torch.tensor([[1.0], [-1.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    log_ratio = torch.tensor([[0.0, 0.0], [0.2, 5.0]])  # row 2: the masked 5.0 does not count
    weights = GRPOTrainer.get_gamma_weights(advantages, log_ratio, mask, None)
    w2 = math.exp(0.2)
    expected = [[1.0], [math.exp(2.0) * w2**3 * math.exp(-2.0 * w2)]]
    assert torch.allclose(weights, torch.tensor(expected), rtol=1e-6)
    is_ratio = torch.tensor([[math.exp(0.5), 1.0], [1.0, 1.0]])
    weighted = GRPOTrainer.get_gamma_weights(advantages, log_ratio, mask, is_ratio)
    w1 = math.exp(0.5)
    assert torch.allclose(weighted[0], torch.tensor([math.exp(3.0) * w1**2 * math.exp(-3.0 * w1)]), rtol=1e-6)
