# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/trainer/grpo_metrics.py: each logged metric has TRL 1.16's name and value, on one process and on two
(gloo), and the trainer logs them (NaN-dropping window means, step_time, num_tokens)."""

import math
import os

import pytest
import torch
from test_distributed import ROOT, _launch

from trl import GRPOConfig, GRPOTrainer
from trl.trainer.grpo_metrics import (
    batch_completions_table,
    completion_length_metrics,
    completions_table,
    frac_reward_zero_std,
    generation_batch_metrics,
    loss_metrics,
    nanstd,
    policy_loss_metric,
    print_completions_table,
    reward_metrics,
    reward_std,
    sequence_sums,
    token_mean,
    window_mean,
)
from trl.trainer.grpo_rewards import aggregate_rewards


NAN = float("nan")
SQRT_8_7 = math.sqrt(8 / 7)  # sample std of four 1s and four 3s


def test_nanstd_is_the_bessel_corrected_std_of_the_non_nan_values():
    assert nanstd(torch.tensor([1.0, 2.0, 3.0, NAN])).item() == pytest.approx(1.0)
    assert math.isnan(nanstd(torch.tensor([1.0, NAN])).item())  # one value: undefined
    per_row = nanstd(torch.tensor([[1.0, 3.0, NAN], [2.0, 2.0, 2.0]]), dim=1)
    assert per_row.tolist() == pytest.approx([math.sqrt(2.0), 0.0])


def test_reward_std_is_the_std_of_the_whole_batch():
    """A reward constant within each group: TRL logs ≈ 1.07, the mean of per-group stds would be 0."""
    rewards = torch.tensor([1.0] * 4 + [3.0] * 4)
    assert reward_std(rewards) == pytest.approx(SQRT_8_7)
    assert reward_std(torch.tensor([1.0, NAN, 1.0, NAN, 3.0, 3.0, 3.0, 3.0])) == pytest.approx(
        torch.tensor([1.0, 1.0, 3.0, 3.0, 3.0, 3.0]).std().item()
    )


def test_frac_reward_zero_std_uses_a_tolerance_and_the_std_that_scales_the_advantages():
    tiny, small = [0.0, 0.0, 0.0, 2e-8], [0.0, 0.0, 0.0, 2e-7]  # stds 1e-8 (zero) and 1e-7 (not zero)
    rewards = torch.tensor([1.0] * 4 + tiny + small + [1.0, 2.0, 3.0, 4.0])
    assert frac_reward_zero_std(rewards, 4, "group") == 0.5
    assert frac_reward_zero_std(rewards, 4, "none") == 0.5
    # A group with a single scored completion has no std: it does not count as zero.
    assert frac_reward_zero_std(torch.tensor([1.0, NAN, NAN, NAN, 2.0, 2.0, 2.0, 2.0]), 4) == 0.5
    # "batch": the batch std decides for everyone.
    constant_per_group = torch.tensor([1.0] * 4 + [3.0] * 4)
    assert frac_reward_zero_std(constant_per_group, 4, "group") == 1.0
    assert frac_reward_zero_std(constant_per_group, 4, "batch") == 0.0
    assert frac_reward_zero_std(torch.full((8,), 2.0), 4, "batch") == 1.0
    # A batch of one completion (evaluation with num_generations_eval=1 and one prompt): no spread, as in TRL.
    assert frac_reward_zero_std(torch.tensor([3.0]), 1, "batch") == 1.0


def test_token_means_weight_every_token_of_every_process_equally():
    """10 tokens at KL 0.1 (process 0) and 90 at 0.01 (process 1): 0.019, not the mean of process means 0.055."""
    mask0 = torch.zeros(2, 50, dtype=torch.long)
    mask0[0, :10] = 1
    mask1 = torch.zeros(2, 50, dtype=torch.long)
    mask1[:, :45] = 1
    kl0, kl1 = torch.full((2, 50), 0.1), torch.full((2, 50), 0.01)
    gathered = torch.cat([sequence_sums(mask0, kl0), sequence_sums(mask1, kl1)])
    assert gathered.shape == (4, 2)
    assert token_mean(gathered).item() == pytest.approx(0.019)
    assert token_mean(torch.zeros(3, 2)).item() == 0.0  # no tokens at all


def test_loss_metrics_clip_ratios():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    low = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)  # masked tokens don't count
    high = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    values = {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low | high}
    assert loss_metrics(values, mask) == pytest.approx(
        {
            "clip_ratio/low_mean": 1 / 6,
            "clip_ratio/high_mean": 4 / 6,
            "clip_ratio/region_mean": 5 / 6,
            "clip_ratio/low_min": 0.0,  # sequence 2 (sequence 3 has no tokens and is left out)
            "clip_ratio/high_max": 1.0,
        }
    )
    empty = loss_metrics(values, torch.zeros_like(mask))
    assert math.isnan(empty["clip_ratio/low_min"]) and math.isnan(empty["clip_ratio/high_max"])


def test_loss_metrics_per_sequence_values_count_once_per_sequence_over_processes():
    """Sequence-level ratios `(N, 1)` are averaged over sequences (TRL); per-token ones over tokens, and `gather`
    pools the rows of every process before dividing."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    per_sequence = torch.tensor([[1.0], [0.0]])  # sequence 0 clipped, sequence 1 not
    per_token = torch.tensor([[0.3, 0.3, 0.3, 9.0], [0.1, 9.0, 9.0, 9.0]])
    two_processes = lambda t: torch.cat([t, t.new_tensor([[0.0, 1.0, 4 * 0.5, 4.0]])])  # noqa: E731
    out = loss_metrics({"clip_ratio/high_mean": per_sequence, "entropy": per_token}, mask, two_processes)
    # high_mean: (1 + 0 + 0) / 3 sequences; entropy: (0.9 + 0.1 + 2.0) / (3 + 1 + 4) tokens.
    assert out == pytest.approx({"clip_ratio/high_mean": 1 / 3, "entropy": 3.0 / 8, "clip_ratio/high_max": 1.0})


def test_completion_length_metrics():
    metrics = completion_length_metrics(torch.tensor([2, 4, 8, 8]), torch.tensor([True, True, False, False]))
    assert metrics == {
        "completions/mean_length": 5.5,
        "completions/min_length": 2.0,
        "completions/max_length": 8.0,
        "completions/clipped_ratio": 0.5,
        "completions/mean_terminated_length": 3.0,
        "completions/min_terminated_length": 2.0,
        "completions/max_terminated_length": 4.0,
    }
    none_ended = completion_length_metrics(torch.tensor([8, 8]), torch.tensor([False, False]))
    assert none_ended["completions/mean_terminated_length"] == none_ended["completions/max_terminated_length"] == 0
    assert none_ended["completions/clipped_ratio"] == 1.0


def test_batch_completions_table_puts_log_extra_columns_before_advantage():
    prompts, completions = (
        ["p", "p"],
        [[{"role": "assistant", "content": "1"}], [{"role": "assistant", "content": "2"}]],
    )
    rewards, advantages = torch.tensor([1.0, 0.0]), torch.tensor([0.5, -0.5])
    table = batch_completions_table(
        prompts, completions, rewards, advantages, {"reward": [9.0, 8.0], "judge": ["a", "b"]}
    )
    assert list(table) == ["prompt", "completion", "reward", "judge", "advantage"]  # a column may replace `reward`
    assert list(table.values()) == [["p", "p"], ["1", "2"], [9.0, 8.0], ["a", "b"], [0.5, -0.5]]
    two_processes = batch_completions_table(prompts, ["x", "y"], rewards, advantages, {}, True, lambda xs: xs + xs)
    assert two_processes == {"prompt": ["p"], "completion": ["x"], "reward": [1.0], "advantage": [0.5]}


def test_completions_table_unique_prompts():
    table = {"prompt": ["a", "a", "b", "b"], "completion": ["1", "2", "3", "4"], "advantage": [0.1, 0.2, 0.3, 0.4]}
    assert completions_table(table) is table
    assert completions_table(table, unique_prompts=True) == {
        "prompt": ["a", "b"],
        "completion": ["1", "3"],
        "advantage": [0.1, 0.3],
    }


def test_reward_metrics_per_function_ignore_none():
    per_func = torch.tensor([[1.0, NAN], [3.0, NAN], [2.0, 4.0]])
    _, rewards, _, _ = aggregate_rewards(per_func, torch.tensor([1.0, 0.5]), 3)
    metrics = reward_metrics(per_func, ["a", "b"], rewards)
    assert metrics["rewards/a/mean"] == 2.0 and metrics["rewards/a/std"] == 1.0
    assert metrics["rewards/b/mean"] == 4.0 and math.isnan(metrics["rewards/b/std"])  # one value: no std
    assert metrics["reward"] == pytest.approx((1.0 + 3.0 + 4.0) / 3)


# ---------------------------------------------------------------- logging hooks and the completions table


def test_generation_batch_metrics_holds_every_batch_metric_with_its_value():
    per_func = torch.tensor([[1.0, NAN], [3.0, NAN], [2.0, 4.0], [0.0, 0.0]])
    scored = aggregate_rewards(per_func, torch.tensor([1.0, 0.5]), 2)
    lengths, terminated = torch.tensor([2, 4, 3, 1]), torch.tensor([True, False, True, True])
    pairs = generation_batch_metrics(
        lengths, terminated, per_func, ["a", "b"], scored.rewards, scored.frac_reward_zero_std,
        truncated=torch.tensor([True, True, False, False]), hook_metrics={"my/metric": 0.25},
    )  # fmt: skip
    assert [name for name, _ in pairs] == [
        "prompts/truncated_ratio",
        *completion_length_metrics(lengths, terminated),
        "rewards/a/mean",
        "rewards/a/std",
        "rewards/b/mean",
        "rewards/b/std",
        "reward",
        "my/metric",
        "reward_std",
        "frac_reward_zero_std",
    ]
    metrics = dict(pairs)
    assert metrics["prompts/truncated_ratio"] == 0.5 and metrics["completions/mean_length"] == 2.5
    assert metrics["reward"] == pytest.approx((1 + 3 + 4 + 0) / 4) and metrics["my/metric"] == 0.25
    assert metrics["reward_std"] == pytest.approx(torch.tensor([1.0, 3.0, 4.0, 0.0]).std().item())
    assert metrics["frac_reward_zero_std"] == 0.0  # groups (1, 3) and (4, 0) both vary
    no_cut = generation_batch_metrics(lengths, terminated, per_func, ["a", "b"], scored.rewards, 0.0)
    assert "prompts/truncated_ratio" not in dict(no_cut)
    # A reward function's `log_metric("reward", ...)` adds a value next to the built-in one (both are averaged).
    clash = generation_batch_metrics(
        lengths, terminated, per_func, ["a", "b"], scored.rewards, 0.0, None, {"reward": 9.0}
    )
    assert [value for name, value in clash if name == "reward"] == [pytest.approx(2.0), 9.0]


def test_policy_loss_metric_is_the_step_share_for_token_sum_losses_in_training():
    loss = torch.tensor(0.6)
    assert policy_loss_metric(loss, "dapo", True, 3) == pytest.approx(0.2)
    assert policy_loss_metric(loss, "dapo", False, 3) == pytest.approx(0.6)  # evaluation: the batch's own value
    assert policy_loss_metric(loss, "grpo", True, 3) == pytest.approx(0.6)
    two_processes = policy_loss_metric(loss, "grpo", True, 3, lambda t: torch.stack([t, torch.tensor(0.2)]))
    assert two_processes == pytest.approx(0.4)


def test_print_completions_table_prints_floats_to_three_decimals_and_at_most_max_rows(capsys):
    table = {"prompt": ["p1", "p2", "p3"], "reward": [0.12345, 1.0, 2.0], "advantage": [-1.5, 0.0, 1.5]}
    print_completions_table(table, step=7, max_rows=2)
    out = capsys.readouterr().out
    assert "Completions at step 7" in out and "0.123" in out and "-1.500" in out and "p2" in out
    assert "p3" not in out and "0.12345" not in out
    print_completions_table(table, step=8)
    assert "p3" in capsys.readouterr().out


def test_window_mean_drops_nans():
    assert window_mean([1.0, NAN, 3.0]) == 2.0
    assert window_mean([NAN, NAN]) is None


# ---------------------------------------------------------------- in the trainer, one process


def group_constant_reward(prompts, **kwargs):
    return [1.0 if p == "1+1=" else 3.0 for p in prompts]


@pytest.mark.parametrize(
    "scale_rewards, aggregation, zero_std",
    [("group", "sum_then_normalize", 1.0), ("batch", "sum_then_normalize", 0.0), ("group", "normalize_then_sum", 1.0)],
)
def test_trainer_logs_batch_reward_std_and_zero_std_share(
    tiny_lm_path, grpo_kwargs, scale_rewards, aggregation, zero_std
):
    """GDPO (normalize_then_sum): a reward constant within each group normalises to 0 everywhere, so the batch of
    combined rewards has zero std (TRL logs 1.0), even though the raw rewards differ between groups."""
    from datasets import Dataset

    args = GRPOConfig(**{**grpo_kwargs, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1})
    args.scale_rewards, args.multi_objective_aggregation = scale_rewards, aggregation
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+3="]})
    trainer = GRPOTrainer(tiny_lm_path, group_constant_reward, args=args, train_dataset=dataset)
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["reward"] == 2.0
    assert log["reward_std"] == pytest.approx(SQRT_8_7)
    assert log["frac_reward_zero_std"] == zero_std
    assert log["num_tokens"] == trainer.state.num_input_tokens_seen > 0
    assert log["step_time"] > 0.0
    assert "prompts/truncated_ratio" in log  # the test config sets max_prompt_length
    for key in ("clip_ratio/low_min", "clip_ratio/high_max", "completions/mean_terminated_length"):
        assert key in log


def test_log_drops_nan_values_of_the_window(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**grpo_kwargs)
    trainer = GRPOTrainer(tiny_lm_path, group_constant_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.model.train()
    trainer._metrics["train"]["reward"] += [1.0, NAN, 2.0]
    trainer._metrics["train"]["rewards/f/mean"] += [NAN]
    trainer.log({"loss": 0.5})
    assert trainer.state.log_history[-1]["reward"] == 1.5
    assert trainer.state.log_history[-1]["rewards/f/mean"] is None


# ---------------------------------------------------------------- two processes (gloo)


def test_metrics_on_two_processes(tmp_path, tiny_lm_path):
    worker = os.path.join(ROOT, "tests", "distributed_workers", "metrics_worker.py")
    results = _launch("metrics", tiny_lm_path, tmp_path, worker=worker)
    for rank in results:
        assert rank["world_size"] == 2
        # One group per process, reward 1 on one and 3 on the other: the std over the whole batch.
        assert rank["logged"]["reward_std"] == pytest.approx(SQRT_8_7)
        assert rank["logged"]["frac_reward_zero_std"] == 1.0
        # 10 tokens at 0.1 on rank 0, 90 at 0.01 on rank 1.
        assert rank["handmade"]["kl"] == pytest.approx(0.019, abs=1e-6)
        assert rank["handmade"] == pytest.approx(
            {
                "kl": rank["handmade"]["kl"],
                "entropy": 0.0,  # the stubbed scores have zero entropy
                "clip_ratio/low_mean": 5 / 100,
                "clip_ratio/high_mean": (10 + 9) / 100,
                "clip_ratio/region_mean": (10 + 9 + 5) / 100,
                "clip_ratio/low_min": 0.0,
                "clip_ratio/high_max": 1.0,
            }
        )
    # Reward-function hooks across processes: the metric is averaged over ranks (0 and 1); the column rank 1 did not
    # log is filled with None; the completions table lives on the main process only.
    assert results[0]["logged"]["rank_metric"] == 0.5
    assert results[0]["table"]["rank"] == [0] * 4 + [None] * 4
    assert results[0]["table"]["prompt"] == ["1+1="] * 4 + ["2+3="] * 4
    assert results[1]["table"] == {}
    # Every logged value is global, except step_time (each process's own clock, as in TRL).
    same = [{k: v for k, v in r["logged"].items() if k != "step_time"} for r in results]
    assert same[0] == same[1]
