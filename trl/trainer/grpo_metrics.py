# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The logged GRPO metrics as pure functions, with the names and meanings TRL 1.16 gives them.

Every function takes tensors already gathered from all processes (or per-sequence sums that the trainer gathers)
and returns plain floats, so a metric means the same on one process and on many: token averages are taken over
all tokens of all processes, not averaged per process. Rewards use NaN for completions no reward function scored.
"""

import math
from collections.abc import Callable

import torch


ZERO_STD_ATOL = 1e-8  # a reward std at most this small counts as "zero std" (no learning signal)


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample (Bessel-corrected) standard deviation ignoring NaNs; NaN where fewer than two values remain.

    Args:
        values: float tensor of any shape.
        dim: dimension to reduce; all dimensions when `None`.

    Returns:
        Float tensor: a scalar for `dim=None`, else `values` with `dim` removed.
    """
    if dim is None:
        values, dim = values.reshape(-1), 0
    valid = ~torch.isnan(values)
    count = valid.sum(dim=dim, keepdim=True).to(values.dtype)
    filled = torch.where(valid, values, torch.zeros_like(values))
    mean = filled.sum(dim=dim, keepdim=True) / count.clamp(min=1)
    squares = torch.where(valid, (values - mean).square(), torch.zeros_like(values)).sum(dim=dim, keepdim=True)
    variance = torch.where(count > 1, squares / (count - 1).clamp(min=1), torch.full_like(count, float("nan")))
    return variance.sqrt().squeeze(dim)


def reward_std(rewards: torch.Tensor) -> float:
    """`reward_std`: standard deviation of the combined reward over the whole batch (all groups, all processes).

    Args:
        rewards: `(N,)` float tensor, NaN for unscored completions.
    """
    return nanstd(rewards).item()


def frac_reward_zero_std(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> float:
    """`frac_reward_zero_std`: share of completions whose reward std is zero (≤ `ZERO_STD_ATOL`).

    The std is the one that scales the advantages: each group's with `scale_rewards` `"group"` or `"none"` (so the
    value is the share of groups without a learning signal), the whole batch's with `"batch"` (so it is 0 or 1).
    A group with fewer than two scored completions has an undefined (NaN) std and does not count as zero, except
    with `num_generations=1` (evaluation with `num_generations_eval=1`), where every group counts as zero-std, as in TRL.

    Args:
        rewards: `(N,)` float tensor, N = B·G with the G completions of a prompt contiguous; NaN for unscored ones.
        num_generations: G.
        scale_rewards: `"group"`, `"batch"` or `"none"`.
    """
    if scale_rewards == "batch":  # a batch of one completion has no spread, as TRL counts it
        std = nanstd(rewards).expand(rewards.numel()) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif num_generations == 1:  # single-completion groups (num_generations_eval=1): no spread, as TRL counts them
        std = torch.zeros_like(rewards)
    else:
        std = nanstd(rewards.view(-1, num_generations), dim=1)
    return (std.abs() <= ZERO_STD_ATOL).float().mean().item()


def sequence_sums(mask: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
    """Per-sequence sums of masked per-token values, plus the token count: what processes gather for token means.

    Args:
        mask: `(N, L)` 0/1 tensor of the tokens that count.
        values: K `(N, L)` tensors (bool or float).

    Returns:
        `(N, K + 1)` float32 tensor: column k is Σ_t values[k]·mask, the last column Σ_t mask.
    """
    mask = mask.float()
    columns = [(v.detach().float() * mask).sum(dim=1) for v in values] + [mask.sum(dim=1)]
    return torch.stack(columns, dim=1)


def token_mean(sums: torch.Tensor) -> torch.Tensor:
    """Means over all tokens of all sequences from gathered `sequence_sums` (0 where there are no tokens).

    Args:
        sums: `(M, K + 1)` float tensor from `sequence_sums`, rows of every process.

    Returns:
        `(K,)` float tensor.
    """
    totals = sums.sum(dim=0)
    return totals[:-1] / totals[-1].clamp(min=1.0)


def loss_metrics(
    values: dict[str, torch.Tensor], mask: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> dict[str, float]:
    """Loss-side metrics (`kl`, `entropy`, `clip_ratio/*`, ...) as TRL 1.16 logs them, over all processes.

    A per-token value `(N, L)` is averaged over every valid token of every process (10 tokens at 0.1 on one process
    and 90 at 0.01 on another give 0.019, not the mean of the two process means); a per-sequence value `(N, 1)`
    (sequence-level importance sampling, VESPO's weight) over every sequence. When `clip_ratio/low_mean` and
    `clip_ratio/high_mean` are given, `clip_ratio/low_min` and `clip_ratio/high_max` are added: the smallest and the
    largest per-sequence share, over the sequences with at least one token (NaN when there are none).

    Args:
        values: name → `(N, L)` or `(N, 1)` tensor (bool or float; detached here).
        mask: `(N, L)` 0/1 tensor of the valid completion tokens.
        gather: concatenates a tensor's rows over processes (`accelerate.utils.gather`); one call for all metrics.

    Returns:
        name → float.
    """
    columns = []
    for value in values.values():
        if value.size(1) == 1 and mask.size(1) != 1:  # one value per sequence, counted once
            value = value.detach().float().squeeze(1)
            columns.append(torch.stack([value, torch.ones_like(value)], dim=1))
        else:
            columns.append(sequence_sums(mask, value))
    sums = gather(torch.cat(columns, dim=1))  # (M, 2K): sum and count per metric
    out = {name: token_mean(sums[:, 2 * k : 2 * k + 2]).item() for k, name in enumerate(values)}
    names = list(values)
    for source, target, pick in (
        ("clip_ratio/low_mean", "clip_ratio/low_min", torch.min),
        ("clip_ratio/high_mean", "clip_ratio/high_max", torch.max),
    ):
        if source in values:
            k = names.index(source)
            total, count = sums[:, 2 * k], sums[:, 2 * k + 1]
            out[target] = pick(total[count > 0] / count[count > 0]).item() if (count > 0).any() else float("nan")
    return out


def completion_length_metrics(lengths: torch.Tensor, terminated: torch.Tensor) -> dict[str, float]:
    """`completions/*`: lengths of all completions and of those that ended with a stop token.

    `clipped_ratio` is the share that did not end with a stop token (they hit `max_completion_length`). The
    `*_terminated_length` values are 0 when no completion terminated.

    Args:
        lengths: `(M,)` tokens per completion (stop token included), all processes.
        terminated: `(M,)` bool, `True` where the completion ended with a stop token.
    """
    lengths = lengths.float()
    ended = lengths[terminated.bool()]
    if ended.numel() == 0:
        ended = lengths.new_zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": (~terminated.bool()).float().mean().item(),
        "completions/mean_terminated_length": ended.mean().item(),
        "completions/min_terminated_length": ended.min().item(),
        "completions/max_terminated_length": ended.max().item(),
    }


def window_mean(values: list[float]) -> float | None:
    """Mean of the values collected since the last log, ignoring NaNs; `None` when no value is left.

    A batch where no reward function scored anything logs NaN for its reward metrics; dropping it keeps the other
    batches of the logging window visible, and `None` keeps JSON loggers working.
    """
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else None
