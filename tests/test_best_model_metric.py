# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The GRPO eval metrics (`eval_reward`, ...) in what `evaluate()` returns, so that `metric_for_best_model` can name
them as in TRL 1.16, under `evaluate`'s `metric_key_prefix` (one name per eval dataset)."""

import json
import os
import re
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from upstream_venv import run_upstream_script

from trl import GRPOConfig, GRPOTrainer
from trl.trainer.grpo_metrics import check_metric_for_best_model


def first_token_reward(completion_ids, **kwargs):
    return [float(ids[0] % 5) for ids in completion_ids]


def value_reward(completions, value, **kwargs):
    """The row's `value` column: a known reward per dataset."""
    return [float(v) for v in value]


def valued(dataset, value: float, rows: int) -> Dataset:
    return dataset.select(range(rows)).add_column("value", [value] * rows)


def eval_every_step(grpo_kwargs, **overrides) -> GRPOConfig:
    """3 steps, an evaluation and a checkpoint after each, the eval batch = one group of 4 completions per prompt."""
    every_step = dict(max_steps=3, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1)
    return GRPOConfig(**{**grpo_kwargs, **every_step, **overrides})


def logged(trainer, key) -> list[tuple[int, float]]:
    return [(h["step"], h[key]) for h in trainer.state.log_history if key in h]


def test_eval_reward_selects_the_best_checkpoint_and_loads_it(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """The lowest `eval_reward` is best here (`greater_is_better=False`), so that an earlier checkpoint than the last
    is chosen and loading it changes the policy."""
    args = eval_every_step(
        grpo_kwargs, load_best_model_at_end=True, metric_for_best_model="eval_reward", greater_is_better=False
    )
    eval_dataset = arithmetic_dataset.select(range(8))
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
    )
    trainer.train()
    rewards = logged(trainer, "eval_reward")
    assert [step for step, _ in rewards] == [1, 2, 3]
    best_step, best_reward = min(rewards, key=lambda step_value: (step_value[1], step_value[0]))
    assert best_step < 3 and rewards[2][1] > best_reward
    assert trainer.state.best_metric == best_reward
    assert trainer.state.best_model_checkpoint == os.path.join(args.output_dir, f"checkpoint-{best_step}")
    policy = trainer.model.state_dict()
    best = AutoModelForCausalLM.from_pretrained(trainer.state.best_model_checkpoint, dtype=torch.float32).state_dict()
    last = AutoModelForCausalLM.from_pretrained(os.path.join(args.output_dir, "checkpoint-3"), dtype=torch.float32)
    assert all(torch.equal(policy[name], value) for name, value in best.items())
    assert not all(torch.equal(policy[name], value) for name, value in last.state_dict().items())


def test_evaluate_returns_what_it_logs_under_its_prefix(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    eval_dataset = arithmetic_dataset.select(range(4))
    trainer = GRPOTrainer(
        tiny_lm_path,
        first_token_reward,
        args=GRPOConfig(**grpo_kwargs),
        train_dataset=arithmetic_dataset,
        eval_dataset=eval_dataset,
    )
    metrics = trainer.evaluate()
    assert trainer.state.log_history[-1] == {**metrics, "step": 0}
    assert {"eval_loss", "eval_reward", "eval_reward_std", "eval_rewards/first_token_reward/mean"} <= set(metrics)
    test = trainer.evaluate(metric_key_prefix="test")
    assert trainer.state.log_history[-1] == {**test, "step": 0}
    assert {"test_loss", "test_reward", "test_rewards/first_token_reward/mean", "test_completions/mean_length"} <= set(
        test
    )
    assert not [key for key in test if key.startswith("eval_")]


def test_named_eval_datasets_keep_their_own_metrics(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """TRL 1.16 names every dataset's GRPO metrics `eval_reward`, so one overwrites the other in the metrics the best
    model is chosen by; here each has its name and its own values, and `metric_for_best_model` picks one."""
    train_dataset = valued(arithmetic_dataset, 0.0, 64)
    eval_dataset = {"small": valued(arithmetic_dataset, 1.0, 4), "large": valued(arithmetic_dataset, 2.0, 8)}
    args = eval_every_step(grpo_kwargs, metric_for_best_model="eval_large_reward")
    trainer = GRPOTrainer(
        tiny_lm_path, value_reward, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset
    )
    trainer.train()
    assert logged(trainer, "eval_small_reward") == [(1, 1.0), (2, 1.0), (3, 1.0)]
    assert logged(trainer, "eval_large_reward") == [(1, 2.0), (2, 2.0), (3, 2.0)]
    assert not logged(trainer, "eval_reward")
    assert trainer.state.best_metric == 2.0


def test_an_evaluation_reports_only_its_own_batches(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """What a `predict` call or an evaluation that failed half-way recorded is not averaged into the next
    evaluation's metrics (which may choose the best checkpoint)."""
    fail = {"at_call": None}
    calls = []

    def reward(completions, value, **kwargs):
        calls.append(len(calls))
        if len(calls) == fail["at_call"]:
            raise RuntimeError("reward server down")
        return value_reward(completions, value)

    one, three = valued(arithmetic_dataset, 1.0, 4), valued(arithmetic_dataset, 3.0, 8)
    args = GRPOConfig(**grpo_kwargs, per_device_eval_batch_size=4)
    trainer = GRPOTrainer(tiny_lm_path, reward, args=args, train_dataset=three, eval_dataset=one)
    trainer.predict(three)  # 8 prompts x 4 completions: 8 eval batches worth 3.0
    assert trainer.evaluate()["eval_reward"] == 1.0
    fail["at_call"] = len(calls) + 5  # the 5th batch of 8 fails, after 4 batches worth 3.0
    with pytest.raises(RuntimeError, match="reward server down"):
        trainer.evaluate(three)
    assert trainer.evaluate()["eval_reward"] == 1.0


@pytest.mark.parametrize("metric", ["eval_reward", "reward", None])
def test_a_best_metric_naming_no_eval_dataset_raises_before_training(
    tiny_lm_path, arithmetic_dataset, grpo_kwargs, metric
):
    eval_dataset = {"small": arithmetic_dataset.select(range(4)), "large": arithmetic_dataset.select(range(4, 12))}
    args = eval_every_step(grpo_kwargs, metric_for_best_model=metric, load_best_model_at_end=True)
    bare = "loss" if metric is None else "reward"  # load_best_model_at_end alone: transformers' default "loss"
    expected = f'Set GRPOConfig(metric_for_best_model=...) to one of "eval_small_{bare}", "eval_large_{bare}".'
    with pytest.raises(ValueError, match=re.escape(expected)):
        GRPOTrainer(
            tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset
        )


def test_check_metric_for_best_model():
    def args(metric, eval_strategy="steps"):
        return SimpleNamespace(metric_for_best_model=metric, eval_strategy=eval_strategy)

    named = {"a": Dataset.from_dict({"prompt": ["x"]}), "b_set": Dataset.from_dict({"prompt": ["y"]})}
    for metric in ("eval_a_reward", "a_reward", "b_set_loss", "eval_b_set_rewards/f/mean"):
        check_metric_for_best_model(args(metric), named)
    check_metric_for_best_model(args("eval_reward"), named["a"])  # one eval dataset: its metrics are eval_<metric>
    check_metric_for_best_model(args(None), named)
    check_metric_for_best_model(args("reward", eval_strategy="no"), named)  # no evaluation reads it
    with pytest.raises(ValueError, match="metric_for_best_model='c_reward' names no eval dataset"):
        check_metric_for_best_model(args("c_reward"), named)


# Trains 2 steps with an evaluation and a checkpoint after each, keeping the best by `eval_reward`, then evaluates
# once more; prints what `evaluate()` returned and whether a best checkpoint was chosen (`argv`: model path, folder).
BEST_METRIC_SCRIPT = r"""
import json, sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]

dataset = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(4) for b in range(4)]})
args = GRPOConfig(
    output_dir=sys.argv[2], use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
    num_generations=2, per_device_eval_batch_size=4, max_completion_length=4, max_steps=2, logging_steps=1,
    disable_tqdm=True, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
    load_best_model_at_end=True, metric_for_best_model="eval_reward",
)
trainer = GRPOTrainer(sys.argv[1], reward_len, args=args, train_dataset=dataset, eval_dataset=dataset.select(range(4)))
trainer.train()
metrics = trainer.evaluate()
print(json.dumps({"keys": sorted(metrics), "best_chosen": trainer.state.best_model_checkpoint is not None,
                  "returned_is_logged": {**metrics, "step": 2} == trainer.state.log_history[-1]}))
"""


@pytest.mark.parity
def test_best_model_by_eval_reward_as_in_trl_1_16(tiny_lm_path, tmp_path, monkeypatch, capsys):
    upstream = run_upstream_script(BEST_METRIC_SCRIPT, tiny_lm_path, str(tmp_path / "upstream"))
    monkeypatch.setattr("sys.argv", ["best_metric", tiny_lm_path, str(tmp_path / "ours")])
    exec(BEST_METRIC_SCRIPT, {"__name__": "best_metric"})
    ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ours == upstream
    assert (
        upstream["best_chosen"]
        and upstream["returned_is_logged"]
        and {"eval_reward", "epoch"} <= set(upstream["keys"])
    )
