# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The reward pipeline (trl.trainer.grpo_rewards) against hand-computed values: names, async calls on one loop,
None handling, both multi-objective aggregations, logging hooks."""

import asyncio
import functools
import math
import threading
from unittest import mock

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from trl.trainer import grpo_rewards
from trl.trainer.grpo_losses import group_advantages
from trl.trainer.grpo_metrics import reward_metrics
from trl.trainer.grpo_rewards import (
    RewardEventLoop,
    RewardLogHooks,
    aggregate_rewards,
    all_none_message,
    call_reward_funcs,
    combine_rewards,
    is_async_reward_func,
    load_reward_funcs,
    normalized_sum,
    reward_func_name,
)


NAN = float("nan")
EPS = 1e-4


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


async def async_length_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def scaled(completions, scale, **kwargs):
    return [scale * len(c) for c in completions]


class ClassReward:
    def __call__(self, completions, **kwargs):
        return [1.0] * len(completions)


class AsyncClassReward:
    async def __call__(self, completions, **kwargs):
        return [2.0] * len(completions)


@pytest.fixture
def loop():
    event_loop = RewardEventLoop()
    yield event_loop
    event_loop.close()


# ---------------------------------------------------------------- names and kinds


def test_reward_func_name_falls_back_like_trl(tiny_rm_path):
    assert reward_func_name(length_reward) == "length_reward"
    assert reward_func_name(functools.partial(scaled, scale=2)) == "scaled"
    assert reward_func_name(functools.partial(functools.partial(scaled), scale=2)) == "scaled"
    assert reward_func_name(ClassReward()) == "ClassReward"
    named = ClassReward()
    named.__name__ = "custom"
    assert reward_func_name(named) == "custom"
    assert reward_func_name(AutoModelForSequenceClassification.from_pretrained(tiny_rm_path)) == "tiny-rm"


def test_is_async_reward_func():
    assert is_async_reward_func(async_length_reward)
    assert is_async_reward_func(functools.partial(async_length_reward))
    assert is_async_reward_func(AsyncClassReward())
    assert not is_async_reward_func(length_reward)
    assert not is_async_reward_func(functools.partial(scaled, scale=2))
    assert not is_async_reward_func(ClassReward())


# ---------------------------------------------------------------- load_reward_funcs


@pytest.mark.parametrize("reward_funcs", [None, []])
def test_no_reward_funcs_raises(reward_funcs):
    with pytest.raises(ValueError, match=r"GRPOTrainer needs at least one reward: pass `reward_funcs`"):
        load_reward_funcs(reward_funcs)


def test_reward_models_do_not_get_the_policys_gguf_file(tiny_rm_path):
    """A GGUF policy's `gguf_file` and quantization describe the policy's checkpoint: a reward-model path is loaded
    without them (the tiny reward model has no GGUF file, so passing them on would fail)."""
    funcs, names, _, _ = load_reward_funcs(
        tiny_rm_path, model_init_kwargs={"gguf_file": "policy.gguf", "quantization_config": object()}
    )
    assert isinstance(funcs[0], AutoModelForSequenceClassification.from_pretrained(tiny_rm_path).__class__)
    assert names == ["tiny-rm"]


def test_reward_processing_classes_length_must_match(tiny_lm_path):
    # A single tokenizer is a list of one, as in TRL: it does not match two functions ...
    with pytest.raises(
        ValueError, match=r"lengths of reward_processing_classes \(1\) and reward_funcs \(2\) must match"
    ):
        load_reward_funcs([length_reward, ClassReward()], reward_processing_classes="tok")
    # ... and two entries do not match a single function.
    with pytest.raises(
        ValueError, match=r"lengths of reward_processing_classes \(2\) and reward_funcs \(1\) must match"
    ):
        load_reward_funcs(length_reward, reward_processing_classes=[None, None])


def test_load_reward_funcs_aligns_names_weights_and_tokenizers(tiny_rm_path):
    funcs, names, tokenizers, weights = load_reward_funcs(
        [tiny_rm_path, functools.partial(scaled, scale=3)], reward_weights=[0.5, 2.0]
    )
    assert names == ["tiny-rm", "scaled"]
    assert torch.equal(weights, torch.tensor([0.5, 2.0]))
    assert tokenizers[1] is None and tokenizers[0].pad_token_id == funcs[0].config.pad_token_id
    with pytest.raises(ValueError, match="reward_weights has 1 entries but there are 2 reward functions"):
        load_reward_funcs([length_reward, ClassReward()], reward_weights=[1.0])


# ---------------------------------------------------------------- calling


def test_sync_async_partial_and_class_rewards_fill_their_columns(loop):
    funcs = [length_reward, async_length_reward, functools.partial(scaled, scale=0.5), AsyncClassReward()]
    names = [reward_func_name(f) for f in funcs]
    rewards = call_reward_funcs(funcs, names, [None] * 4, ["p", "p"], ["ab", "abcd"], [[1], [2]], {}, loop=loop)
    assert torch.equal(rewards, torch.tensor([[2.0, 2.0, 1.0, 2.0], [4.0, 4.0, 2.0, 2.0]]))


def test_async_rewards_run_concurrently_on_one_loop(loop):
    """Each function waits for the other: run one after the other, they would time out."""
    started = {}
    seen_loops = []

    def make(name, other):
        async def reward(completions, **kwargs):
            seen_loops.append(asyncio.get_running_loop())
            started[name] = started.get(name) or asyncio.Event()
            started[name].set()
            started[other] = started.get(other) or asyncio.Event()
            await asyncio.wait_for(started[other].wait(), timeout=5)
            return [1.0] * len(completions)

        return reward

    funcs = [make("a", "b"), make("b", "a")]
    for _ in range(2):
        started.clear()
        rewards = call_reward_funcs(funcs, ["a", "b"], [None, None], ["p"], ["c"], [[1]], {}, loop=loop)
        assert rewards.tolist() == [[1.0, 1.0]]
    assert all(seen is loop.loop for seen in seen_loops) and len(seen_loops) == 4
    assert loop.thread is not threading.current_thread()


def test_async_rewards_work_inside_a_running_event_loop(loop):
    async def user_code():  # e.g. a notebook cell or an async application calling the (sync) trainer
        return call_reward_funcs([async_length_reward], ["r"], [None], ["p"], ["abc"], [[1]], {}, loop=loop)

    assert asyncio.run(user_code()).tolist() == [[3.0]]


def test_async_reward_without_a_loop_raises():
    with pytest.raises(ValueError, match="Async reward functions need a RewardEventLoop"):
        call_reward_funcs([async_length_reward], ["r"], [None], ["p"], ["abc"], [[1]], {})


def test_reward_event_loop_stops_on_close():
    event_loop = RewardEventLoop()
    event_loop.close()
    assert not event_loop.thread.is_alive() and event_loop.loop.is_closed()


def test_wrong_length_names_the_function(loop):
    async def short(completions, **kwargs):
        return [1.0]

    with pytest.raises(ValueError, match="Reward function 'short' returned 1 rewards for 2 completions"):
        call_reward_funcs([short], ["short"], [None], ["p", "p"], ["a", "b"], [[1], [2]], {}, loop=loop)


def test_none_becomes_nan_and_all_none_warns_with_the_inputs():
    def half(completions, **kwargs):
        return [None, 1.0]

    def never(completions, **kwargs):
        return [None, None]

    with mock.patch.object(grpo_rewards.logger, "warning") as warning:
        rewards = call_reward_funcs(
            [half, never],
            ["half", "never"],
            [None, None],
            ["1+1=", "2+2="],
            ["5", "4"],
            [[1], [2]],
            {"answer": ["2", "4"], "trainer_state": object(), "log_extra": print, "log_metric": print},
        )
    assert math.isnan(rewards[0, 0]) and rewards[1, 0] == 1.0 and torch.isnan(rewards[:, 1]).all()
    warning.assert_called_once_with(
        "All reward functions returned None for 1 of 2 completions; these get advantage 0. The first one had "
        "inputs {'prompt': '1+1=', 'completion': '5', 'answer': '2'}. Make at least one reward function return a "
        "number for every completion."
    )
    assert all_none_message(torch.tensor([[1.0, NAN]]), ["p"], ["c"], {}) is None


# ---------------------------------------------------------------- aggregation


def test_combine_rewards_weights_and_nan():
    per_func = torch.tensor([[1.0, NAN], [NAN, NAN], [0.5, 2.0], [NAN, -4.0]])
    rewards, valid = combine_rewards(per_func, torch.tensor([2.0, 0.5]))
    # nansum: a None (NaN) counts as 0; a row where every function gave None is invalid.
    assert torch.equal(rewards, torch.tensor([2.0, 0.0, 1.0 + 1.0, -2.0]))
    assert torch.equal(valid, torch.tensor([True, False, True, True]))


def test_sum_then_normalize_is_group_advantages_of_the_weighted_sum():
    per_func = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    weights = torch.tensor([2.0, 1.0])
    advantages, rewards, valid, _ = aggregate_rewards(per_func, weights, 4, "group", "sum_then_normalize")
    assert torch.equal(rewards, torch.tensor([2.0, 1.0, 3.0, 0.0]))  # the logged `reward` reflects the weights
    # mean 1.5, sample std sqrt(5/3)
    expected = (torch.tensor([2.0, 1.0, 3.0, 0.0]) - 1.5) / (math.sqrt(5 / 3) + EPS)
    assert torch.allclose(advantages, expected, rtol=1e-6)
    assert valid.all()


def test_normalize_then_sum_hand_computed():
    # One group of 4 completions, two rewards on very different scales.
    per_func = torch.tensor([[1.0, 10.0], [0.0, 30.0], [1.0, 20.0], [0.0, 20.0]])
    weights = torch.tensor([1.0, 0.5])
    advantages, rewards, _, _ = aggregate_rewards(per_func, weights, 4, "none", "normalize_then_sum")
    std0, std1 = math.sqrt(1 / 3), math.sqrt(200 / 3)  # sample stds of the columns
    norm0 = [(x - 0.5) / (std0 + EPS) for x in (1.0, 0.0, 1.0, 0.0)]
    norm1 = [(x - 20.0) / (std1 + EPS) for x in (10.0, 30.0, 20.0, 20.0)]
    summed = torch.tensor([a + 0.5 * b for a, b in zip(norm0, norm1)], dtype=torch.float64)
    expected = (summed - summed.mean()) / (summed.std() + EPS)  # then normalised over the batch
    assert torch.allclose(advantages.double(), expected, rtol=1e-5)
    assert torch.equal(rewards, torch.tensor([6.0, 15.0, 11.0, 10.0]))  # raw weighted sum, as logged
    # scale_rewards does not change normalize_then_sum
    assert torch.equal(aggregate_rewards(per_func, weights, 4, "group", "normalize_then_sum")[0], advantages)


def _frac_zero_std(*args):
    return aggregate_rewards(*args).frac_reward_zero_std


def test_zero_std_fraction_uses_the_rewards_that_scale_the_advantages():
    # Group 1 constant (2.0), group 2 varies: per-group share 0.5; the batch std is not zero.
    one_func = torch.tensor([2.0, 2.0, 2.0, 2.0, 0.0, 1.0, 0.0, 1.0]).unsqueeze(1)
    ones = torch.ones(1)
    assert _frac_zero_std(one_func, ones, 4, "group") == 0.5
    assert _frac_zero_std(one_func, ones, 4, "none") == 0.5
    assert _frac_zero_std(one_func, ones, 4, "batch") == 0.0
    assert _frac_zero_std(one_func, ones, 4, "group", "normalize_then_sum") == 0.0
    # Constant within each group, different between groups: GDPO normalises every group to 0, so the combined
    # rewards have zero batch std (TRL 1.16 logs 1.0), although the raw weighted sums differ (batch std > 0).
    constant = torch.tensor([[1.0, 5.0]] * 4 + [[3.0, 0.0]] * 4)
    weights = torch.tensor([1.0, 2.0])
    assert _frac_zero_std(constant, weights, 4, "batch", "normalize_then_sum") == 1.0
    assert _frac_zero_std(constant, weights, 4, "batch", "sum_then_normalize") == 0.0
    assert torch.equal(normalized_sum(constant, weights, 4), torch.zeros(8))
    # A completion nobody scored is NaN in the combined reward and left out of the std.
    with_none = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, NAN], [1.0, NAN]])
    combined = normalized_sum(with_none, weights, 4)
    a = 1 / 3 / (math.sqrt(1 / 3) + EPS)  # (1 − 2/3) / (std + eps) over the 3 scored values
    assert combined[[0, 2, 3]].tolist() == pytest.approx([a, -2 * a, a])
    assert math.isnan(combined[1])


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_a_none_never_makes_advantages_nan(aggregation):
    per_func = torch.tensor(
        [[1.0, NAN], [0.0, 2.0], [NAN, NAN], [1.0, 3.0], [0.5, 1.0], [NAN, 1.0], [0.0, NAN], [1.0, 0.0]]
    )
    advantages, rewards, valid, _ = aggregate_rewards(per_func, torch.tensor([1.0, 2.0]), 4, "group", aggregation)
    assert torch.isfinite(advantages).all()
    assert advantages[2] == 0.0 and not valid[2] and math.isnan(rewards[2])  # nobody scored it
    assert torch.equal(rewards[[0, 1, 3]], torch.tensor([1.0, 4.0, 7.0]))
    assert reward_metrics(per_func, ["a", "b"], rewards)["reward"] == pytest.approx((1 + 4 + 7 + 2.5 + 2 + 0 + 1) / 7)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_single_completion_groups_get_zero_advantage(aggregation):
    per_func = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 5.0]])
    advantages, _, _, _ = aggregate_rewards(per_func, torch.ones(2), 1, "group", aggregation)
    # normalize_then_sum: every per-group normalised reward is 0, so the batch-normalised sum is 0 too
    assert torch.equal(advantages, torch.zeros(3))


def test_unknown_aggregation_raises():
    with pytest.raises(ValueError, match="multi_objective_aggregation must be one of sum_then_normalize, normalize_"):
        aggregate_rewards(torch.ones(2, 1), torch.ones(1), 2, "group", "mean")


def test_log_hooks_collect_columns_and_average_metrics():
    hooks = RewardLogHooks()
    kwargs = hooks.kwargs()
    kwargs["log_extra"]("parsed", ["4", None, "7"])
    kwargs["log_metric"]("format_ok", 1.0)
    kwargs["log_metric"]("format_ok", 0.0)
    kwargs["log_metric"]("length", 3)
    columns, metrics = hooks.pop(3)
    assert columns == {"parsed": ["4", None, "7"]}
    assert metrics == {"format_ok": 0.5, "length": 3.0}
    assert hooks.pop(3) == ({}, {})  # cleared


def test_log_hooks_gather_over_processes():
    """Seen from process 0 of 2: the other process logged no column, one value for "m" and a metric "n"."""
    hooks = RewardLogHooks()
    hooks.log_extra("x", [1, 2])
    hooks.log_metric("m", 4.0)
    other_process_objects = iter([[], [[None, None]], ["n"]])  # column names, column "x", metric names
    other_process_stats = iter([[[2.0, 2.0]], [[9.0, 1.0]]])  # (sum, count) of "m", then of "n"

    def gather_object(obj):
        return list(obj) + next(other_process_objects)

    def gather(stats):
        return torch.cat([stats, torch.tensor(next(other_process_stats), dtype=stats.dtype)])

    columns, metrics = hooks.pop(2, gather_object, gather)
    assert columns == {"x": [1, 2, None, None]}
    assert metrics == {"m": (4.0 + 2.0) / 3, "n": 9.0}


def test_log_extra_needs_one_value_per_completion():
    hooks = RewardLogHooks()
    hooks.log_extra("x", [1])
    with pytest.raises(ValueError, match=r"log_extra column 'x' got \[1\] values \(per process\) for 2 completions"):
        hooks.pop(2)


def test_log_extra_length_error_is_raised_on_every_process():
    """Process 0 logged a correct column, process 1 a short one: process 0 must raise too (after the same gathers),
    not go on to the next gather alone and hang."""
    hooks = RewardLogHooks()
    hooks.log_extra("x", [1, 2])
    other_process_objects = iter([["x"], [[7]]])  # column names, then column "x" of process 1
    calls = []

    def gather_object(obj):
        calls.append(obj)
        return list(obj) + next(other_process_objects)

    with pytest.raises(ValueError, match=r"log_extra column 'x' got \[2, 1\] values \(per process\) for 2"):
        hooks.pop(2, gather_object)
    assert calls == [["x"], [[1, 2]]]  # both gathers happened before the error


def test_group_advantages_is_the_shared_normaliser():
    # aggregate_rewards reuses grpo_losses.group_advantages: same numbers for one reward function.
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert torch.equal(aggregate_rewards(r[:, None], torch.ones(1), 4)[0], group_advantages(r, 4))
