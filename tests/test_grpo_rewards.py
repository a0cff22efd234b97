# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The reward pipeline (trl.trainer.grpo_rewards) against hand-computed values: names, async calls on one loop,
None handling, both multi-objective aggregations, logging hooks."""

import asyncio
import collections
import functools
import math
import threading
from unittest import mock

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import PathNotFoundError
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
    reward_column,
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
    with pytest.raises(
        ValueError, match=r"No reward source provided: GRPOTrainer needs at least one reward, so pass `reward_funcs`"
    ):
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
        ValueError, match=r"number of reward processing classes \(1\) must match the number of reward functions \(2\)"
    ):
        load_reward_funcs([length_reward, ClassReward()], reward_processing_classes="tok")
    # ... and two entries do not match a single function.
    with pytest.raises(
        ValueError, match=r"number of reward processing classes \(2\) must match the number of reward functions \(1\)"
    ):
        load_reward_funcs(length_reward, reward_processing_classes=[None, None])


def test_load_reward_funcs_aligns_names_weights_and_tokenizers(tiny_rm_path):
    funcs, names, tokenizers, weights = load_reward_funcs(
        [tiny_rm_path, functools.partial(scaled, scale=3)], reward_weights=[0.5, 2.0]
    )
    assert names == ["tiny-rm", "scaled"]
    assert torch.equal(weights, torch.tensor([0.5, 2.0]))
    assert tokenizers[1] is None and tokenizers[0].pad_token_id == funcs[0].config.pad_token_id
    with pytest.raises(
        ValueError, match=r"Number of reward weights \(1\) must match number of reward functions \(2\)"
    ):
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

    with pytest.raises(ValueError, match="Reward function 'short' returned 1 rewards, but 2 were expected"):
        call_reward_funcs([short], ["short"], [None], ["p", "p"], ["a", "b"], [[1], [2]], {}, loop=loop)


def test_none_becomes_nan_and_all_none_warns_with_the_inputs():
    def half(completions, **kwargs):
        return [None, 1.0]

    def never(completions, **kwargs):
        return [None, None]

    with mock.patch.object(grpo_rewards.trainer_logger, "warning") as warning:
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
        "All reward functions returned None for the following kwargs:\n{'answer': '2', 'prompt': '1+1=', "
        "'completion': '5'}\n(the first of 1 of 2 completions that no reward function scored; these get advantage 0). "
        "Make at least one reward function return a number for every completion."
    )
    assert all_none_message(torch.tensor([[1.0, NAN]]), ["p"], ["c"], {}) is None


# ---------------------------------------------------------------- what a reward function may return

INF = float("inf")
LIST_OF_2 = "it must return a list of 2 floats (or None), one per completion."
FINITE = 'Rewards must be finite: None (or NaN) means "no reward for this completion", inf is not allowed.'


def returning(value, is_async):
    """A reward function named `bad` (sync or async) that returns `value`."""

    def bad(completions, **kwargs):
        return value

    async def async_bad(completions, **kwargs):
        return value

    if is_async:
        async_bad.__name__ = "bad"
        return async_bad
    return bad


WRONG_RETURNS = [  # (returned for 2 completions, error type, message)
    (0.5, TypeError, f"Reward function 'bad' returned a float (0.5) instead of a list: {LIST_OF_2}"),
    (None, TypeError, f"Reward function 'bad' returned None instead of a list: {LIST_OF_2}"),
    ("11", TypeError, f"Reward function 'bad' returned a str ('11') instead of a list: {LIST_OF_2}"),
    (
        {"a": 1.0, "b": 2.0},
        TypeError,
        f"Reward function 'bad' returned a dict ({{'a': 1.0, 'b': 2.0}}) instead of a list: {LIST_OF_2}",
    ),
    (
        torch.tensor(1.0),
        TypeError,
        f"Reward function 'bad' returned a torch.Tensor of shape () instead of a list: {LIST_OF_2}",
    ),
    ([1.0], ValueError, f"Reward function 'bad' returned 1 rewards, but 2 were expected: {LIST_OF_2}"),
    ([1.0, 2.0, 3.0], ValueError, f"Reward function 'bad' returned 3 rewards, but 2 were expected: {LIST_OF_2}"),
    (["1", 2.0], TypeError, f"Reward function 'bad' returned a str ('1') for completion 0: {LIST_OF_2}"),
    ([1.0, [2.0]], TypeError, f"Reward function 'bad' returned a list ([2.0]) for completion 1: {LIST_OF_2}"),
    ([{"r": 1}, 2.0], TypeError, f"Reward function 'bad' returned a dict ({{'r': 1}}) for completion 0: {LIST_OF_2}"),
    (
        [torch.tensor([1.0, 2.0]), 1.0],
        TypeError,
        f"Reward function 'bad' returned a torch.Tensor of shape (2,) for completion 0: {LIST_OF_2}",
    ),
    (
        torch.ones(2, 2),
        TypeError,
        f"Reward function 'bad' returned a torch.Tensor of shape (2,) for completion 0: {LIST_OF_2}",
    ),
    ([1 + 2j, 1.0], TypeError, f"Reward function 'bad' returned a complex ((1+2j)) for completion 0: {LIST_OF_2}"),
    ([1.0, INF], ValueError, f"Reward function 'bad' returned inf for completion 1: {LIST_OF_2} {FINITE}"),
    ([-INF, None], ValueError, f"Reward function 'bad' returned -inf for completion 0: {LIST_OF_2} {FINITE}"),
    (
        np.array([0.0, np.inf]),
        ValueError,
        f"Reward function 'bad' returned inf for completion 1: {LIST_OF_2} {FINITE}",
    ),
    (
        [torch.tensor(-INF), 1],
        ValueError,
        f"Reward function 'bad' returned -inf for completion 0: {LIST_OF_2} {FINITE}",
    ),
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("value", "error", "message"), WRONG_RETURNS)
def test_wrong_reward_returns_raise_naming_the_function(loop, is_async, value, error, message):
    """Before: a bare float raised `TypeError: object of type 'float' has no len()`, strings were parsed as numbers
    ("11" gave [1.0, 1.0]) and ±inf passed through."""
    with pytest.raises(error) as raised:
        call_reward_funcs(
            [returning(value, is_async)], ["bad"], [None], ["p", "p"], ["a", "b"], [[1], [2]], {}, loop=loop
        )
    assert str(raised.value) == message


ACCEPTED_RETURNS = [  # (returned for 2 completions, the column)
    ([1, 2.5], [1.0, 2.5]),
    ((True, False), [1.0, 0.0]),
    ([np.float32(0.25), np.int64(3)], [0.25, 3.0]),
    ([np.bool_(True), np.float64(NAN)], [1.0, NAN]),
    ([torch.tensor(1.5), torch.tensor([2.0])], [1.5, 2.0]),
    ([torch.tensor(True), np.array([4])], [1.0, 4.0]),
    ([None, float("nan")], [NAN, NAN]),  # both mean "no reward for this completion", as in TRL
    (torch.tensor([0.5, NAN]), [0.5, NAN]),  # a (N,) tensor, as TRL's torch.tensor(...) accepts
    (torch.tensor([[0.5], [1.0]]), [0.5, 1.0]),  # (N, 1): TRL accepts it too
    (np.array([3, 4], dtype=np.int32), [3.0, 4.0]),
    (np.array([[3.0], [4.0]]), [3.0, 4.0]),
    (collections.deque([1.0, None]), [1.0, NAN]),  # any iterable, as TRL's list comprehension
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("value", "column"), ACCEPTED_RETURNS)
def test_accepted_reward_returns(loop, is_async, value, column):
    rewards = call_reward_funcs(
        [returning(value, is_async)], ["ok"], [None], ["p"] * 2, ["a", "b"], [[1]] * 2, {}, loop=loop
    )
    assert rewards.dtype == torch.float32 and rewards.shape == (2, 1)
    assert torch.equal(rewards[:, 0].nan_to_num(-7.0), torch.tensor(column).nan_to_num(-7.0))


@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays")
def test_accepted_returns_give_what_trl_computes():
    """TRL 1.16 replaces None by NaN and calls `torch.tensor(output, dtype=torch.float32)` (then assigns it to a
    column): every output it accepts gives the same column here; it rejects only two that are accepted here, a
    list mixing a 1-element numpy array in and an (N, 1) numpy array."""
    rejected_by_trl = []
    for index, (value, _) in enumerate(ACCEPTED_RETURNS):
        try:
            trl_column = torch.zeros(2)
            trl_column[:] = torch.tensor([NAN if v is None else v for v in value], dtype=torch.float32)
        except (TypeError, RuntimeError):
            rejected_by_trl.append(index)
            continue
        ours = torch.tensor(grpo_rewards.reward_column(value, "ok", 2))
        assert torch.equal(ours.nan_to_num(-7.0), trl_column.nan_to_num(-7.0)), value
    assert [ACCEPTED_RETURNS[i][0].__class__.__name__ for i in rejected_by_trl] == ["list", "ndarray"]


def test_reward_model_non_finite_scores_raise_naming_the_model(tiny_rm_path):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path)
    funcs, names, tokenizers, _ = load_reward_funcs(model)

    def overflow_second_completion(module, inputs, output):
        output = output.clone()
        output[1] = INF
        return output

    handle = model.score.register_forward_hook(overflow_second_completion)
    args = (funcs, names, tokenizers, ["1+1=", "2+2="], ["2", "4"], [[1], [2]], {})
    with pytest.raises(ValueError) as raised:
        call_reward_funcs(*args)
    assert str(raised.value) == (
        "Reward model 'tiny-rm' (torch.float32) gave a non-finite score (inf) for 1 of 2 completions (the first is "
        "completion 1); a reward model's scores must be finite: check the model's weights and inputs (or, for a "
        "float16 checkpoint, load it in float32 or bfloat16)."
    )
    model.half()  # the float16 hint
    with pytest.raises(ValueError) as raised:
        call_reward_funcs(*args)
    assert str(raised.value) == (
        "Reward model 'tiny-rm' (torch.float16) gave a non-finite score (inf) for 1 of 2 completions (the first is "
        "completion 1); a reward model's scores must be finite: float16 overflows easily: load the reward model in "
        "float32 or bfloat16 (`dtype`), or check the model."
    )
    handle.remove()
    model.float()
    assert torch.isfinite(call_reward_funcs(*args)).all()


@pytest.mark.parametrize("weight", [INF, -INF, NAN, "1.0", None])
def test_reward_weights_must_be_finite_numbers(weight):
    """Before: an inf or NaN weight was accepted (and made every advantage NaN); a str failed inside torch."""
    with pytest.raises(ValueError) as raised:
        load_reward_funcs([length_reward, ClassReward()], reward_weights=[1.0, weight])
    assert str(raised.value) == (
        f"reward_weights[1] is {weight!r} (for reward function 'ClassReward'): every reward weight must be a finite "
        "number."
    )


def test_reward_trainer_refuses_inf_before_any_update(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """Before: training went on with an inf reward, grad_norm was NaN and after one optimizer step every weight of
    the policy was NaN."""

    def inf_reward(completion_ids, **kwargs):
        return [INF if i == 3 else float(ids[0] % 5) for i, ids in enumerate(completion_ids)]

    args = GRPOConfig(**grpo_kwargs)
    trainer = GRPOTrainer(tiny_lm_path, inf_reward, args=args, train_dataset=arithmetic_dataset)
    initial = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}
    with pytest.raises(ValueError) as raised:
        trainer.train()
    assert str(raised.value) == (
        "Reward function 'inf_reward' returned inf for completion 3: it must return a list of 8 floats (or None), "
        f"one per completion. {FINITE}"
    )
    assert trainer.state.global_step == 0
    after = trainer.model.state_dict()
    assert after.keys() == initial.keys()
    assert all(torch.equal(after[name], initial[name]) for name in initial)


# ---------------------------------------------------------------- reward-model paths that do not exist


def test_missing_reward_model_path_says_so(tmp_path, monkeypatch):
    """Before: `OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '...'` for an absolute
    path, `We couldn't connect to 'https://huggingface.co' ...` for a relative one."""
    missing = str(tmp_path / "my-reward-model")
    with pytest.raises(PathNotFoundError) as raised:
        load_reward_funcs(missing)
    assert str(raised.value) == (
        f"Reward model '{missing}' is not an existing local folder (or file) and could not be loaded from the Hugging "
        f"Face Hub (OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{missing}'. Use "
        "`repo_type` argument if needed.)"
    )
    assert isinstance(raised.value, FileNotFoundError) and isinstance(raised.value.__cause__, OSError)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathNotFoundError) as raised:
        load_reward_funcs("rm-typo")
    assert str(raised.value).startswith(
        "Reward model 'rm-typo' is not an existing local folder (or file) and could not be loaded from the Hugging "
        "Face Hub (OSError: We couldn't connect to 'https://huggingface.co'"
    )


def test_existing_but_broken_reward_model_folder_keeps_its_error(tmp_path):
    """Only a path that does not exist gets the new message: an existing folder's own error is raised unchanged."""
    (tmp_path / "empty-rm").mkdir()
    with pytest.raises(ValueError, match=r"^Unrecognized model in .*empty-rm\. Should have a `model_type` key"):
        load_reward_funcs(str(tmp_path / "empty-rm"))


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
    with pytest.raises(
        ValueError, match="Invalid multi_objective_aggregation: mean. It must be one of sum_then_normalize, normalize_"
    ):
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


# ---------------------------------------------------------------- float32 overflow and one-process errors

FLOAT32 = "rewards are stored as float32, whose largest value is 3.403e+38): return rewards of a smaller magnitude."


@pytest.mark.parametrize(
    "value, shown", [(1e39, "1e+39"), (-1e39, "-1e+39"), (np.float64(5e38), "5e+38"), (10**39, "1e+39")]
)
def test_reward_beyond_float32_raises_naming_the_function(value, shown):
    """Before: `math.isinf` of the float64 passed, the float32 column held inf and every advantage was NaN."""
    with pytest.raises(ValueError) as raised:
        reward_column([0.0, value, 1.0, 2.0], "big", 4)
    assert str(raised.value) == (
        f"Reward function 'big' returned {shown} for completion 1, which does not fit in float32 (it overflows to "
        f"inf; {FLOAT32}"
    )
    assert reward_column([3.4e38, -3.4e38], "big", 2) == [3.4e38, -3.4e38]  # within float32: kept


def test_an_int_beyond_float64_raises_the_named_error():
    with pytest.raises(ValueError, match=r"^Reward function 'huge' returned inf for completion 0: it must return"):
        reward_column([10**400, 1], "huge", 2)


def test_every_reward_function_runs_before_a_bad_return_is_raised():
    """A later reward (a model's forward may be collective under ZeRO-3/FSDP2) still runs on the failing process."""
    called = []

    def bad(completions, **kwargs):
        return 0.5

    def later(completions, **kwargs):
        called.append(len(completions))
        return [1.0] * len(completions)

    with pytest.raises(TypeError, match=r"^Reward function 'bad' returned a float \(0.5\) instead of a list"):
        call_reward_funcs([bad, later], ["bad", "later"], [None, None], ["p", "p"], ["a", "b"], [[1], [2]], {})
    assert called == [2]


def test_reward_beyond_float32_raises_through_call_reward_funcs():
    def big(completions, **kwargs):
        return [1e39] + [0.0] * (len(completions) - 1)

    with pytest.raises(
        ValueError, match=r"^Reward function 'big' returned 1e\+39 for completion 0, which does not fit"
    ):
        call_reward_funcs([big], ["big"], [None], ["p", "p"], ["a", "b"], [[1], [2]], {})


def test_weighted_reward_overflow_raises_naming_the_function_and_weight():
    """Before: 3e38 × 2.0 became inf in float32 and `aggregate_rewards` returned all-NaN advantages silently."""
    rewards = torch.tensor([[3e38, 1.0], [0.0, 1.0], [1.0, NAN], [2.0, 3.0]])
    weights = torch.tensor([2.0, 1.0])
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        with pytest.raises(ValueError) as raised:
            aggregate_rewards(rewards, weights, 4, multi_objective_aggregation=aggregation, reward_names=["big", "b"])
        assert str(raised.value) == (
            "The weighted reward overflows float32 for reward function 'big' (reward 3e+38 × weight 2): reward × "
            "weight must stay within ±3.403e+38; use smaller rewards or reward_weights."
        )
    with pytest.raises(ValueError, match=r"^The weighted reward overflows float32 for reward function 0 \(reward 3e"):
        combine_rewards(rewards, weights)  # without names: the function's index
    # 3e38 × 1 fits in float32, but that group's standard deviation does not (it would zero every advantage)
    with pytest.raises(ValueError, match=r"too large for their group statistics"):
        aggregate_rewards(rewards, torch.tensor([1.0, 1.0]), 4)


def test_weighted_sum_overflow_raises_naming_the_completion():
    rewards = torch.tensor([[3e38, 3e38], [0.0, 1.0], [1.0, NAN], [2.0, 3.0]])
    with pytest.raises(ValueError) as raised:
        combine_rewards(rewards, torch.tensor([1.0, 1.0]), ["a", "b"])
    assert str(raised.value) == (
        "The weighted sum of the rewards overflows float32 for completion 0 (weighted rewards: reward function 'a': "
        "3e+38; reward function 'b': 3e+38): the sum must stay within ±3.403e+38; use smaller rewards or "
        "reward_weights."
    )


def test_trainer_refuses_a_weighted_reward_that_overflows(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    def huge(completions, **kwargs):
        return [3e38] * len(completions)

    args = GRPOConfig(**{**grpo_kwargs, "reward_weights": [2.0]})
    trainer = GRPOTrainer(tiny_lm_path, huge, args=args, train_dataset=arithmetic_dataset)
    with pytest.raises(
        ValueError, match=r"^The weighted reward overflows float32 for reward function 'huge' \(reward"
    ):
        trainer.train()
    assert trainer.state.global_step == 0


def _bad_reward(completions, **kwargs):
    return "oops"


def _fine_reward(completions, **kwargs):
    return [1.0] * len(completions)


BAD_REWARD = (
    "Reward function '_bad_reward' returned a str ('oops') instead of a list: it must return a list of 1 floats (or "
    "None), one per completion."
)


@pytest.mark.parametrize("this_process_fails", [True, False])
def test_reward_error_on_one_process_is_raised_on_every_process(
    tiny_lm_path, arithmetic_dataset, grpo_kwargs, this_process_fails
):
    """Two processes simulated (the other's part of `gather_object` is made up); exactly one process's reward
    function fails. Before: the process whose rewards were fine returned them and went on to `gather(rewards)`,
    where it waited forever for the process that had raised."""
    reward = _bad_reward if this_process_fails else _fine_reward
    trainer = GRPOTrainer(tiny_lm_path, reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)
    gathered = []

    def gather_object(obj):  # this process is process 1; process 0 fails when this one does not
        gathered.append(obj)
        return ([None] if this_process_fails else [("TypeError", BAD_REWARD)]) + obj

    processes = mock.patch.object(type(trainer.accelerator), "num_processes", new_callable=mock.PropertyMock)
    with processes as num_processes, mock.patch("trl.trainer.grpo_trainer.gather_object", gather_object):
        num_processes.return_value = 2
        with pytest.raises(TypeError) as raised:
            trainer._calculate_rewards([{"prompt": "1+1="}], ["1+1="], ["2"], [[5]])
    assert gathered == [[("TypeError", BAD_REWARD)] if this_process_fails else [None]]
    assert str(raised.value) == (
        BAD_REWARD if this_process_fails else f"reward function error on process 0: {BAD_REWARD}"
    )


def test_reward_error_on_one_process_gathers_nothing(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = GRPOTrainer(tiny_lm_path, _bad_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)
    with mock.patch("trl.trainer.grpo_trainer.gather_object", side_effect=AssertionError("gathered")):
        with pytest.raises(TypeError) as raised:
            trainer._calculate_rewards([{"prompt": "1+1="}], ["1+1="], ["2"], [[5]])
    assert str(raised.value) == BAD_REWARD


def test_a_reward_needing_a_missing_column_is_refused_before_training(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """TRL's `accuracy_reward` reads a `solution` column; the arithmetic dataset has `answer`. Before: a `TypeError`
    from inside the reward pipeline at the first batch, after the model was loaded and the first generation ran."""
    from trl.rewards import accuracy_reward

    def needs_answer(completions, answer, **kwargs):
        return [0.0] * len(completions)

    args = GRPOConfig(**grpo_kwargs)
    expected = (
        r"Reward function 'accuracy_reward' requires the argument\(s\) \['solution'\], which reward functions receive "
        r"from the dataset's columns, but train_dataset has only \['answer', 'prompt'\]"
    )
    with pytest.raises(ValueError, match=expected):
        GRPOTrainer(tiny_lm_path, [needs_answer, accuracy_reward], args=args, train_dataset=arithmetic_dataset)
    eval_dataset = arithmetic_dataset.remove_columns("answer")
    with pytest.raises(ValueError, match=r"'needs_answer' requires the argument\(s\) \['answer'\].*eval_dataset has"):
        GRPOTrainer(tiny_lm_path, needs_answer, args=args, train_dataset=arithmetic_dataset, eval_dataset=eval_dataset)
    trainer = GRPOTrainer(tiny_lm_path, needs_answer, args=args, train_dataset=arithmetic_dataset)  # has `answer`
    assert trainer.reward_func_names == ["needs_answer"]
