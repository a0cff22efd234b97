# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The GRPO reward pipeline: load and name reward functions, call them (sync and async) and reward models, turn
`None` into NaN, weight and aggregate the rewards into advantages, and collect what reward functions log.

Shapes: N = B·G completions (the G completions of a prompt contiguous), F = number of reward functions.
"""

import asyncio
import functools
import inspect
import math
import numbers
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Set
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel
from transformers.utils import logging

from ..data_utils import conversation_with_completion
from ..models.utils import explain_missing_path
from .grpo_config import MULTI_OBJECTIVE_AGGREGATIONS
from .grpo_losses import group_advantages
from .grpo_metrics import frac_reward_zero_std


logger = logging.get_logger(__name__)
# TRL 1.16 logs the all-None warning from its trainer's module: the same logger, so its filters and levels apply
trainer_logger = logging.get_logger("trl.trainer.grpo_trainer")

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]
# Keyword arguments the trainer adds for every reward function; not "inputs" of a completion.
HOOK_KWARGS = ("trainer_state", "log_extra", "log_metric")
FLOAT32_MAX = torch.finfo(torch.float32).max


# ---------------------------------------------------------------- setting up


def reward_func_name(func: Any) -> str:
    """The name a reward function's metrics are logged under (`rewards/<name>/mean`).

    A reward model: the last part of its `config._name_or_path`. A `functools.partial` (nested or not): the wrapped
    function's name. A function: its `__name__`. A callable class instance without `__name__`: its class name.
    """
    if isinstance(func, nn.Module):
        return func.config._name_or_path.rstrip("/").split("/")[-1]
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def is_async_reward_func(func: Any) -> bool:
    """True when calling `func` returns a coroutine: an `async def` function, a `functools.partial` of one, or an
    instance of a class whose `__call__` is `async def`."""
    if isinstance(func, nn.Module):
        return False
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def load_reward_funcs(
    reward_funcs: RewardFunc | list[RewardFunc] | None,
    reward_processing_classes: Any = None,
    reward_weights: list[float] | None = None,
    model_init_kwargs: dict[str, Any] | None = None,
) -> tuple[list, list[str], list, torch.Tensor]:
    """Turn the trainer's `reward_funcs` / `reward_processing_classes` / `reward_weights` into aligned lists.

    Paths are loaded as one-label sequence-classification reward models with `model_init_kwargs` (which carries
    `trust_remote_code`), less the policy's `gguf_file` and `quantization_config`, which describe the policy's
    checkpoint, not theirs; a reward model without a tokenizer gets the one saved next to it (from the same
    `revision` when the model was loaded from a path), and its pad token id is set from that tokenizer.

    Returns:
        `(funcs, names, processing_classes, weights)`: `weights` is an `(F,)` float32 tensor (all ones by default).

    Raises:
        ValueError: if there is no reward function, if `reward_weights` or `reward_processing_classes` (a single
            tokenizer counts as a list of one) does not have one entry per reward function, or if a weight is not a
            finite number.
        PathNotFoundError: if a reward-model path is not an existing local folder and no Hub id either.
    """
    if reward_funcs is None or (isinstance(reward_funcs, list) and not reward_funcs):
        raise ValueError(
            "No reward source provided: GRPOTrainer needs at least one reward, so pass `reward_funcs` (a function, a "
            "reward model or its path, or a list of them)."
        )
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    model_init_kwargs = {
        k: v for k, v in (model_init_kwargs or {}).items() if k not in ("gguf_file", "quantization_config")
    }
    # A reward model loaded from a path gets its tokenizer from the same revision.
    revisions = [model_init_kwargs.get("revision") if isinstance(f, str) else None for f in funcs]
    funcs = [_load_reward_model(f, model_init_kwargs) if isinstance(f, str) else f for f in funcs]
    if reward_weights is not None and len(reward_weights) != len(funcs):
        raise ValueError(
            f"Number of reward weights ({len(reward_weights)}) must match number of reward functions ({len(funcs)}): "
            "give one weight per reward function."
        )
    for index, weight in enumerate(reward_weights or []):
        if not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(
                f"reward_weights[{index}] is {weight!r} (for reward function {reward_func_name(funcs[index])!r}): "
                "every reward weight must be a finite number."
            )
    weights = torch.tensor(reward_weights or [1.0] * len(funcs), dtype=torch.float32)
    if reward_processing_classes is None:
        reward_processing_classes = [None] * len(funcs)
    elif not isinstance(reward_processing_classes, list):
        reward_processing_classes = [reward_processing_classes]
    if len(reward_processing_classes) != len(funcs):
        raise ValueError(
            f"The number of reward processing classes ({len(reward_processing_classes)}) must match the number of "
            f"reward functions ({len(funcs)}): give one entry (None for a function) per reward function."
        )
    processing_classes = list(reward_processing_classes)
    for i, (func, tokenizer) in enumerate(zip(funcs, processing_classes)):
        if isinstance(func, PreTrainedModel):
            if tokenizer is None:
                with explain_missing_path(func.config._name_or_path, "Reward tokenizer"):
                    tokenizer = AutoTokenizer.from_pretrained(
                        func.config._name_or_path,
                        revision=revisions[i],
                        trust_remote_code=model_init_kwargs.get("trust_remote_code", False),
                    )
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            func.config.pad_token_id = tokenizer.pad_token_id
            processing_classes[i] = tokenizer
    return funcs, [reward_func_name(f) for f in funcs], processing_classes, weights


def _load_reward_model(path: str, model_init_kwargs: dict[str, Any]) -> PreTrainedModel:
    """A one-label sequence-classification reward model from `path` (a local folder or a Hub id)."""
    with explain_missing_path(path, "Reward model"):
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **model_init_kwargs)


class RewardEventLoop:
    """One asyncio event loop, run by a daemon thread, on which the async reward functions of a batch run together.

    The trainer owns one for its lifetime. Because the loop lives in its own thread, `run` also works when the
    caller's thread already runs an event loop (a notebook, an async application). The loop stops when `close` is
    called or the object is garbage-collected.
    """

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=_run_forever, args=(self.loop, ready), name="GRPOTrainer-reward-loop", daemon=True
        )
        self.thread.start()
        ready.wait()
        self._finalizer = weakref.finalize(self, _stop, self.loop, self.thread)

    def run(self, coroutines: list) -> list:
        """Await all `coroutines` concurrently (`asyncio.gather`) and return their results in order; the first
        exception raised by one of them is raised here."""

        async def gather_all():
            return await asyncio.gather(*coroutines)

        return asyncio.run_coroutine_threadsafe(gather_all(), self.loop).result()

    def close(self) -> None:
        self._finalizer()


def _run_forever(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    if not loop.is_running():
        loop.close()


# ---------------------------------------------------------------- calling the reward functions


def reward_model_inputs(
    tokenizer,
    prompts: list,
    completions: list,
    chat_template_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """What a sequence-classification reward model reads for each prompt + completion: `input_ids` and
    `attention_mask`, `(N, T)` int64, right-padded.

    Conversational pairs (lists of messages) are rendered as one conversation with the reward tokenizer's chat
    template and `chat_template_kwargs`; a prefilled prompt (last message from `assistant`) and its completion share
    one assistant message, the prefill followed by the completion's text (`data_utils.conversation_with_completion`).
    Text pairs are concatenated.
    """
    if isinstance(prompts[0], list):
        kwargs = chat_template_kwargs or {}
        texts = [
            tokenizer.apply_chat_template(conversation_with_completion(p, c), tokenize=False, **kwargs)
            for p, c in zip(prompts, completions)
        ]
    else:
        texts = [p + c for p, c in zip(prompts, completions)]
    return tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False).to(
        device
    )


def reward_model_scores(
    model: nn.Module,
    tokenizer,
    prompts: list,
    completions: list,
    chat_template_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """First logit of a sequence-classification reward model on each prompt + completion (see
    `reward_model_inputs`), `(N,)` float32, without gradients."""
    encoded = reward_model_inputs(tokenizer, prompts, completions, chat_template_kwargs, device)
    with torch.no_grad():
        return model(**encoded).logits[:, 0].float()


def _describe(value: Any) -> str:
    """A short description of a wrong reward value for an error message: its type, and its value when short."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a torch.Tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a numpy array of shape {value.shape}"
    text = repr(value)
    return f"a {type(value).__name__} ({text if len(text) <= 40 else text[:37] + '...'})"


def _as_float(value: Any) -> float | None:
    """A single reward value as a float (`None` → NaN), or `None` when it is not a number.

    Numbers are Python `bool`/`int`/`float` (any `numbers.Real`), numpy scalars, and torch tensors or numpy arrays
    holding exactly one real value; a string is never converted.
    """
    if value is None:
        return float("nan")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if (value.numel() if isinstance(value, torch.Tensor) else value.size) != 1:
            return None
        value = value.item()
    if not isinstance(value, (numbers.Real, np.bool_)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float range (not converted again: that would overflow too)
        return math.inf if value > 0 else -math.inf


def reward_column(values: Any, name: str, num_completions: int) -> list[float]:
    """One reward function's output as floats, `None` → NaN.

    A reward function must return one reward per completion: a list (or tuple, or other iterable) of numbers
    (Python, numpy or one-element torch tensors) or `None`, or a torch tensor / numpy array of length N (shape
    `(N,)`, or `(N, 1)`). `None` and NaN both mean "no reward for this completion" (left out of the group
    statistics, as in TRL); ±inf is refused, since it would turn the group's advantages into NaN.

    Raises:
        TypeError: if `values` is not a sequence (a bare number, `None`, a string, a dict, ...) or an entry is not a
            number or `None` (a string, a list, a multi-element tensor, ...).
        ValueError: if `values` does not hold one value per completion, or an entry is +inf or -inf or does not fit
            in float32 (overflows to ±inf there).
    """
    expected = f"it must return a list of {num_completions} floats (or None), one per completion"
    scalar_array = isinstance(values, (torch.Tensor, np.ndarray)) and values.ndim == 0
    not_a_sequence = (
        values is None or isinstance(values, (str, bytes, Mapping, Set)) or not hasattr(values, "__iter__")
    )
    if scalar_array or not_a_sequence:
        raise TypeError(f"Reward function {name!r} returned {_describe(values)} instead of a list: {expected}.")
    values = list(values)
    if len(values) != num_completions:
        raise ValueError(
            f"Reward function {name!r} returned {len(values)} rewards, but {num_completions} were expected: "
            f"{expected}."
        )
    column = []
    for index, value in enumerate(values):
        reward = _as_float(value)
        if reward is None:
            raise TypeError(
                f"Reward function {name!r} returned {_describe(value)} for completion {index}: {expected}."
            )
        if math.isinf(reward):
            raise ValueError(
                f"Reward function {name!r} returned {reward} for completion {index}: {expected}. Rewards must be "
                'finite: None (or NaN) means "no reward for this completion", inf is not allowed.'
            )
        column.append(reward)
    # The column is stored as float32: a finite float64 beyond float32's range would become ±inf there.
    overflow = torch.isinf(torch.tensor(column, dtype=torch.float32)).nonzero().flatten().tolist()
    if overflow:
        index = overflow[0]
        raise ValueError(
            f"Reward function {name!r} returned {column[index]!r} for completion {index}, which does not fit in "
            f"float32 (it overflows to inf; rewards are stored as float32, whose largest value is {FLOAT32_MAX:.4g}): "
            "return rewards of a smaller magnitude."
        )
    return column


def check_reward_model_scores(scores: torch.Tensor, model: nn.Module, name: str) -> None:
    """Raise if a reward model gave a non-finite score (a model has no way to say "no reward": inf or NaN logits
    are an overflow or broken weights).

    Raises:
        ValueError: naming the model, the first bad completion and the model's dtype.
    """
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if not bad:
        return
    dtype = getattr(model, "dtype", None)
    if dtype == torch.float16:
        hint = "float16 overflows easily: load the reward model in float32 or bfloat16 (`dtype`), or check the model"
    else:
        hint = "check the model's weights and inputs (or, for a float16 checkpoint, load it in float32 or bfloat16)"
    raise ValueError(
        f"Reward model {name!r} ({dtype}) gave a non-finite score ({scores[bad[0]].item()}) for {len(bad)} of "
        f"{scores.numel()} completions (the first is completion {bad[0]}); a reward model's scores must be finite: "
        f"{hint}."
    )


def call_reward_funcs(
    funcs: list,
    names: list[str],
    processing_classes: list,
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    reward_kwargs: dict[str, Any],
    chat_template_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
    loop: RewardEventLoop | None = None,
) -> torch.Tensor:
    """Score N completions with every reward function: `(N, F)` float32, NaN where a function returned `None`.

    Reward models are run in order, plain functions are called in order, then all async functions are awaited
    together on `loop`. Each function is called as `f(prompts=..., completions=..., completion_ids=...,
    **reward_kwargs)`, where the trainer's `reward_kwargs` hold the other dataset columns, `trainer_state`,
    `log_extra` and `log_metric`. When every function returns `None` for some completion, a warning names the inputs
    of the first such completion.

    Raises:
        TypeError: if a function returns something that is not a list of numbers or `None` (see `reward_column`).
        ValueError: if a function's output does not have one value per completion or holds ±inf (or a value that
            overflows float32), if a reward model
            gives a non-finite score, or if there are async functions and no `loop`.
    """
    n = len(prompts)
    rewards = torch.zeros(n, len(funcs), dtype=torch.float32)
    pending = []  # (column, coroutine)
    call_kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
    # A bad return is raised after every function has run: a reward model's forward may be collective (ZeRO-3,
    # FSDP2), so a process must not skip the later ones because its own data failed an earlier check.
    errors: list[Exception] = []
    for i, (func, name, tokenizer) in enumerate(zip(funcs, names, processing_classes)):
        if isinstance(func, nn.Module):
            scores = reward_model_scores(func, tokenizer, prompts, completions, chat_template_kwargs, device).cpu()
            try:
                check_reward_model_scores(scores, func, name)
            except ValueError as error:
                errors.append(error)
            rewards[:, i] = scores
        elif is_async_reward_func(func):
            pending.append((i, func(**call_kwargs)))
        else:
            try:
                rewards[:, i] = torch.tensor(reward_column(func(**call_kwargs), name, n))
            except (TypeError, ValueError) as error:
                errors.append(error)
    if pending:
        if loop is None:
            for _, coroutine in pending:
                coroutine.close()
            raise ValueError("Async reward functions need a RewardEventLoop to run on.")
        for (i, _), values in zip(pending, loop.run([c for _, c in pending])):
            try:
                rewards[:, i] = torch.tensor(reward_column(values, names[i], n))
            except (TypeError, ValueError) as error:
                errors.append(error)
    if errors:
        raise errors[0]
    message = all_none_message(rewards, prompts, completions, reward_kwargs)
    if message is not None:
        trainer_logger.warning(message)
    return rewards.to(device)


def all_none_message(
    rewards_per_func: torch.Tensor, prompts: list, completions: list, reward_kwargs: dict[str, Any]
) -> str | None:
    """The warning for completions that no reward function scored (a row of NaNs), with TRL 1.16's opening and the
    first one's inputs as TRL lists them (dataset columns, then prompt and completion); `None` when every completion
    has at least one reward."""
    unscored = torch.isnan(rewards_per_func).all(dim=1).nonzero().flatten().tolist()
    if not unscored:
        return None
    row = unscored[0]
    inputs = {k: v[row] for k, v in reward_kwargs.items() if k not in HOOK_KWARGS}
    inputs.update(prompt=prompts[row], completion=completions[row])
    return (
        f"All reward functions returned None for the following kwargs:\n{inputs}\n(the first of {len(unscored)} of "
        f"{len(prompts)} completions that no reward function scored; these get advantage 0). Make at least one reward "
        "function return a number for every completion."
    )


# ---------------------------------------------------------------- from rewards to advantages


def weighted_rewards(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, names: list[str] | None = None
) -> torch.Tensor:
    """Σ_k w_k·r_k per completion, `(N,)`, NaN rewards (`None`) counting as 0; refuses a product or a sum that
    overflows the tensor's dtype (float32) to ±inf, which would turn a group's advantages into NaN.

    Args:
        rewards_per_func: `(N, F)` float tensor of finite rewards, NaN for `None`.
        reward_weights: `(F,)` float tensor.
        names: the reward functions' names, for the error message (`reward function <k>` when not given).

    Raises:
        ValueError: naming the reward functions and weights whose weighted reward overflows, or the first completion
            whose weighted sum does.
    """
    weights = reward_weights.to(rewards_per_func)
    products = rewards_per_func * weights.unsqueeze(0)
    rewards = torch.nansum(products, dim=1)
    if torch.isinf(rewards).any() or torch.isinf(products).any():  # rewards and weights are finite: an overflow
        label = [f"reward function {names[k]!r}" if names else f"reward function {k}" for k in range(weights.numel())]
        dtype = str(rewards_per_func.dtype).removeprefix("torch.")
        columns = torch.isinf(products).any(dim=0).nonzero().flatten().tolist()
        if columns:
            parts = []
            for k in columns:
                row = torch.isinf(products[:, k]).nonzero()[0].item()
                parts.append(
                    f"{label[k]} (reward {rewards_per_func[row, k].item():.4g} × weight {weights[k].item():g})"
                )
            raise ValueError(
                f"The weighted reward overflows {dtype} for {', '.join(parts)}: reward × weight must stay within "
                f"±{torch.finfo(rewards_per_func.dtype).max:.4g}; use smaller rewards or reward_weights."
            )
        row = torch.isinf(rewards).nonzero()[0].item()
        terms = "; ".join(
            f"{label[k]}: {products[row, k].item():.4g}"
            for k in range(weights.numel())
            if not products[row, k].isnan()
        )
        raise ValueError(
            f"The weighted sum of the rewards overflows {dtype} for completion {row} (weighted rewards: {terms}): the "
            f"sum must stay within ±{torch.finfo(rewards_per_func.dtype).max:.4g}; use smaller rewards or "
            "reward_weights."
        )
    return rewards


def combine_rewards(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, names: list[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted sum of several reward functions, skipping the ones that returned `None` (stored as NaN).

    Args:
        rewards_per_func: `(N, F)` float tensor, one column per reward function; NaN where a function gave `None`.
        reward_weights: `(F,)` float tensor.
        names: the reward functions' names, for the overflow error.

    Returns:
        `(rewards, valid)`: `(N,)` float rewards (NaN entries count as 0) and an `(N,)` bool mask that is `False`
        where *every* function returned `None`: such completions are left out of their group's statistics.

    Raises:
        ValueError: if a weighted reward or the weighted sum overflows to ±inf (see `weighted_rewards`).
    """
    valid = ~torch.isnan(rewards_per_func).all(dim=1)
    return weighted_rewards(rewards_per_func, reward_weights, names), valid


class AggregatedRewards(NamedTuple):
    """What `aggregate_rewards` returns; every tensor is `(N,)`.

    Attributes:
        advantages: float advantages.
        rewards: the weighted sum of the raw rewards (logged as `reward`, in both aggregation modes); NaN where no
            function scored.
        valid: bool mask of the completions at least one function scored.
        frac_reward_zero_std: the logged `frac_reward_zero_std` of the rewards whose std scales the advantages: the
            weighted sum per group (over the batch with `scale_rewards="batch"`) for `"sum_then_normalize"`; the
            batch of GDPO combined rewards (`normalized_sum`) for `"normalize_then_sum"`, where groups that are
            constant in every reward give 1 (see `grpo_metrics.frac_reward_zero_std`).
    """

    advantages: torch.Tensor
    rewards: torch.Tensor
    valid: torch.Tensor
    frac_reward_zero_std: float


def aggregate_rewards(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
    reward_names: list[str] | None = None,
) -> AggregatedRewards:
    """Advantages from the rewards of several functions, as `multi_objective_aggregation` says.

    - `"sum_then_normalize"`: r = Σ_k w_k·r_k, then group advantages of r scaled as `scale_rewards` says
      (arXiv 2402.03300, §4.1.2).
    - `"normalize_then_sum"` (GDPO, arXiv 2601.05242): each r_k is normalised within its group, (r_k − mean) /
      (std + 1e-4); the weighted sum of those is then normalised over the whole batch the same way.
      `scale_rewards` does not apply.

    A `None` (NaN) leaves its value out of every mean and std and adds 0 to a sum; a completion no function scored
    gets advantage 0. Groups of one completion (`num_generations=1`, evaluation) get advantage 0.

    Args:
        rewards_per_func: `(N, F)` float tensor, NaN for `None`.
        reward_weights: `(F,)` float tensor.
        num_generations: G, the group size.
        scale_rewards: `"group"`, `"batch"` or `"none"` (sum-then-normalise only).
        multi_objective_aggregation: `"sum_then_normalize"` or `"normalize_then_sum"`.
        reward_names: the reward functions' names, for the overflow error (`reward function <k>` when not given).

    Returns:
        [`AggregatedRewards`]: advantages, the logged rewards, the scored mask and `frac_reward_zero_std`.

    Raises:
        ValueError: for an unknown `multi_objective_aggregation` (or `scale_rewards`), N not divisible by G, or a
            weighted reward (or the weighted sum) that overflows float32 (see `weighted_rewards`).
    """
    weighted, valid = combine_rewards(rewards_per_func, reward_weights, reward_names)
    rewards = weighted.masked_fill(~valid, float("nan"))
    if multi_objective_aggregation == "sum_then_normalize":
        advantages = group_advantages(weighted, num_generations, scale_rewards, valid)
        zero_std = frac_reward_zero_std(rewards, num_generations, scale_rewards)
    elif multi_objective_aggregation == "normalize_then_sum":
        combined = normalized_sum(rewards_per_func, reward_weights, num_generations)
        # the whole batch as one group
        advantages = group_advantages(combined.nan_to_num(0.0), combined.numel(), "group", valid)
        zero_std = frac_reward_zero_std(combined, 1, "batch")
    else:
        raise ValueError(
            f"Invalid multi_objective_aggregation: {multi_objective_aggregation}. It must be one of "
            f"{', '.join(MULTI_OBJECTIVE_AGGREGATIONS)}."
        )
    return AggregatedRewards(advantages, rewards, valid, zero_std)


def normalized_sum(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """GDPO's combined reward (arXiv 2601.05242): each reward normalised within its group, (r_k − mean) /
    (std + 1e-4) over the completions it scored, then weighted and summed.

    Args:
        rewards_per_func: `(N, F)` float tensor, NaN for `None`.
        reward_weights: `(F,)` float tensor.
        num_generations: G.

    Returns:
        `(N,)` float tensor; NaN where no function scored the completion.
    """
    normalised = torch.stack(
        [
            group_advantages(column.nan_to_num(0.0), num_generations, "group", ~torch.isnan(column))
            for column in rewards_per_func.unbind(dim=1)
        ],
        dim=1,
    )
    summed = (normalised * reward_weights.to(normalised).unsqueeze(0)).sum(dim=1)
    return summed.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))


# ---------------------------------------------------------------- logging hooks


class RewardLogHooks:
    """What reward functions report through the `log_extra` and `log_metric` keyword arguments.

    `log_extra(column, values)` adds a column (one value per completion of the call) to the completions table;
    `log_metric(name, value)` adds a scalar that is averaged over the batch (all processes) and logged as `name`
    (`eval_<name>` in evaluation), next to `reward`.
    """

    def __init__(self):
        self.extra: dict[str, list] = defaultdict(list)
        self.metrics: dict[str, list[float]] = defaultdict(list)

    def log_extra(self, column: str, values: list) -> None:
        self.extra[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(float(value))

    def kwargs(self) -> dict[str, Callable]:
        return {"log_extra": self.log_extra, "log_metric": self.log_metric}

    def pop(
        self, num_completions: int, gather_object: Callable = lambda x: x, gather: Callable = lambda x: x
    ) -> tuple[dict[str, list], dict[str, float]]:
        """Return and clear `(extra columns over all processes, metric means over all processes)`.

        Every process must call this (it gathers); column and metric names are gathered first and walked in sorted
        order, so processes that logged different names stay aligned. A process that did not log a column fills it
        with `None`. Each column is gathered as one list per process and checked after the gather, so that every
        process raises together (a process raising alone would leave the others waiting in the next gather).

        Raises:
            ValueError: if a column does not have one value per completion on some process.
        """
        columns = {}
        for column in sorted(set(gather_object(sorted(self.extra)))):
            per_process = gather_object([self.extra.get(column, [None] * num_completions)])
            lengths = [len(values) for values in per_process]
            if any(length != num_completions for length in lengths):
                raise ValueError(
                    f"log_extra column {column!r} got {lengths} values (per process) for {num_completions} "
                    "completions each: log one value per completion, once per batch."
                )
            columns[column] = [value for values in per_process for value in values]
        metrics = {}
        for name in sorted(set(gather_object(sorted(self.metrics)))):
            values = self.metrics.get(name, [])
            total, count = gather(torch.tensor([[sum(values), len(values)]], dtype=torch.float64)).sum(dim=0).tolist()
            metrics[name] = total / count
        self.extra.clear()
        self.metrics.clear()
        return columns, metrics


@contextmanager
def raise_on_every_process(num_processes: int, gather_object: Callable[[list], list]):
    """Run the block on every process and raise its reward errors on all of them together.

    A `TypeError` or `ValueError` raised in the block on one process would leave the others waiting in their next
    collective; instead each process's error (or `None`) is gathered once the block ends. The process where it happened
    raises its own error; the others raise the same type, `"reward function error on process <r>: <message>"`. On one
    process the error is raised as it is, with no gather.

    Args:
        num_processes: the number of processes (every one must enter the block).
        gather_object: concatenates a list from every process (`accelerate.utils.gather_object`).
    """
    if num_processes == 1:
        yield
        return
    error = None
    try:
        yield
    except (TypeError, ValueError) as caught:
        error = caught
    kind = "TypeError" if isinstance(error, TypeError) else "ValueError"
    errors = gather_object([None if error is None else (kind, str(error))])
    if error is not None:
        raise error
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        rank, (kind, message) = failed[0]
        raise (TypeError if kind == "TypeError" else ValueError)(f"reward function error on process {rank}: {message}")


# What the trainer passes to every reward function besides the dataset's other columns.
TRAINER_REWARD_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def check_reward_columns(reward_funcs: list, reward_func_names: list[str], train_dataset, eval_dataset=None) -> None:
    """Raise before training when a reward function requires a keyword argument that neither the trainer nor a
    dataset provides (e.g. TRL's `accuracy_reward` on a dataset without a `solution` column), instead of a
    `TypeError` at the first batch. Reward models, and datasets whose columns are unknown (some streams), are skipped.

    Args:
        reward_funcs, reward_func_names: as loaded by `load_reward_funcs`.
        train_dataset, eval_dataset: the trainer's datasets (`eval_dataset` `None`, one, or a dict of named ones);
            a dataset's other columns reach reward functions as keyword arguments.

    Raises:
        ValueError: naming the function, the missing column(s), the dataset and the columns it has.
    """
    evals = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
    datasets = [("train_dataset", train_dataset), *((k, d) for k, d in evals if d is not None)]
    for func, name in zip(reward_funcs, reward_func_names):
        if isinstance(func, nn.Module) or not callable(func):
            continue
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable without a signature
            continue
        required = [
            p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        for dataset_name, dataset in datasets:
            columns = getattr(dataset, "column_names", None)
            if columns is None:
                continue
            given = {*TRAINER_REWARD_KWARGS, *columns} - {"prompt", "completion"}  # (see `grpo_inputs.reward_columns`)
            missing = [arg for arg in required if arg not in given]
            if missing:
                raise ValueError(
                    f"Reward function {name!r} requires the argument(s) {missing}, which reward functions receive from "
                    f"the dataset's columns, but {dataset_name} has only {sorted(columns)}: add the column(s) (e.g. "
                    "a `solution` column for `accuracy_reward`), or use a reward function that reads the columns there "
                    "are."
                )
