# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The logged GRPO metrics as pure functions, with the names and meanings TRL 1.16 gives them, and the completions
table printed at logging steps.

Every function takes tensors already gathered from all processes (or per-sequence sums that the trainer gathers)
and returns plain floats, so a metric means the same on one process and on many: token averages are taken over
all tokens of all processes, not averaged per process. Rewards use NaN for completions no reward function scored.
"""

import math
from collections.abc import Callable

import torch

from ..rewards._utils import completion_text
from .grpo_losses import TOKEN_SUM_LOSS_TYPES


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


def reward_metrics(rewards_per_func: torch.Tensor, names: list[str], rewards: torch.Tensor) -> dict[str, float]:
    """The logged reward values of one batch: `reward` (mean of the weighted sum over scored completions) and
    `rewards/<name>/mean`, `rewards/<name>/std` (sample std) per function over the completions it scored; NaN where
    there is nothing (or, for a std, one value) to average.

    Args:
        rewards_per_func: `(N, F)`, NaN for `None`.
        names: F names.
        rewards: `(N,)` weighted sums, NaN where no function scored (as returned by `aggregate_rewards`).
    """
    metrics = {}
    for name, column in zip(names, rewards_per_func.unbind(dim=1)):
        column = column[~torch.isnan(column)]
        metrics[f"rewards/{name}/mean"] = column.mean().item() if column.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = column.std().item() if column.numel() > 1 else float("nan")
    metrics["reward"] = torch.nanmean(rewards).item()
    return metrics


def generation_batch_metrics(
    completion_lengths: torch.Tensor,
    terminated: torch.Tensor,
    rewards_per_func: torch.Tensor,
    reward_names: list[str],
    rewards: torch.Tensor,
    frac_zero_std: float,
    truncated: torch.Tensor | None = None,
    hook_metrics: dict[str, float] | None = None,
) -> list[tuple[str, float]]:
    """Everything logged about one generation batch, over all processes, in TRL's order: `prompts/truncated_ratio`
    (when prompts are cut, `truncated` given), `completions/*`, `rewards/<name>/mean|std`, `reward`, the reward
    functions' own `log_metric` values, `reward_std` and `frac_reward_zero_std`.

    Returned as `(name, value)` pairs, not a dict: a `log_metric` name may repeat a built-in one (`reward`, say),
    and then both values count in the logged mean, as in TRL.

    Args:
        completion_lengths: `(N,)` tokens per completion (stop token included).
        terminated: `(N,)` bool, `True` where the completion ended with a stop token.
        rewards_per_func: `(N, F)` float rewards, NaN for `None`.
        reward_names: F names.
        rewards: `(N,)` weighted sums, NaN where no function scored (`grpo_rewards.aggregate_rewards`).
        frac_zero_std: `frac_reward_zero_std`, from `aggregate_rewards`.
        truncated: `(N,)` bool, the completion rows whose prompt `max_prompt_length` cut.
        hook_metrics: name → value averaged over processes (`RewardLogHooks.pop`).
    """
    pairs = [] if truncated is None else [("prompts/truncated_ratio", truncated.float().mean().item())]
    pairs += completion_length_metrics(completion_lengths, terminated).items()
    pairs += reward_metrics(rewards_per_func, reward_names, rewards).items()
    pairs += (hook_metrics or {}).items()
    return pairs + [("reward_std", reward_std(rewards)), ("frac_reward_zero_std", frac_zero_std)]


def policy_loss_metric(
    loss: torch.Tensor,
    loss_type: str,
    training: bool,
    accumulation_steps: int,
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> float:
    """`policy_loss` as TRL logs it next to an entropy bonus: the micro-batch's scalar `loss` before the bonus,
    averaged over processes; in training, the token-sum loss types (`TOKEN_SUM_LOSS_TYPES`, whose value is already a
    share of the step's total) log it divided by the window's `accumulation_steps`: their share of the step."""
    share = accumulation_steps if training and loss_type in TOKEN_SUM_LOSS_TYPES else 1
    return gather(loss.detach() / share).nanmean().item()


def completions_table(columns: dict[str, list], unique_prompts: bool = False) -> dict[str, list]:
    """The completions table as columns of equal length; with `unique_prompts`, only the first row of each prompt
    (TRL's `log_unique_prompts`)."""
    if not unique_prompts:
        return columns
    seen, keep = set(), []
    for i, prompt in enumerate(columns["prompt"]):
        if str(prompt) not in seen:
            seen.add(str(prompt))
            keep.append(i)
    return {name: [values[i] for i in keep] for name, values in columns.items()}


def batch_completions_table(
    prompts: list,
    completions: list,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    extra_columns: dict[str, list],
    unique_prompts: bool = False,
    gather_object: Callable[[list], list] = lambda x: x,
) -> dict[str, list]:
    """The completions table of one generation batch, over all processes: `prompt`, `completion` (its text), `reward`,
    the reward functions' `log_extra` columns (one may replace `reward`) and `advantage` last, as in TRL; with
    `unique_prompts`, one row per prompt (see `completions_table`).

    Args:
        prompts, completions: this process's N prompts and completions (as reward functions receive them).
        rewards, advantages: `(M,)` over all processes (`grpo_rewards.aggregate_rewards`).
        extra_columns: column → M values, over all processes (`RewardLogHooks.pop`).
        gather_object: concatenates a list over processes (`accelerate.utils.gather_object`).
    """
    table = {
        "prompt": gather_object(prompts),
        "completion": gather_object([completion_text(c) for c in completions]),
        "reward": rewards.tolist(),
        **extra_columns,
        "advantage": advantages.tolist(),
    }
    return completions_table(table, unique_prompts)


def print_completions_table(table: dict[str, list], step: int, max_rows: int | None = None) -> None:
    """Print the completions table with `rich`: one column per key, floats to 3 decimals, at most `max_rows` rows
    (all when `None` or 0)."""
    from rich.console import Console
    from rich.table import Table

    printed = Table(title=f"Completions at step {step}", show_lines=True)
    for column in table:
        printed.add_column(column)
    rows = list(zip(*table.values()))
    for row in rows[: max_rows or len(rows)]:
        printed.add_row(*(f"{value:.3f}" if isinstance(value, float) else str(value) for value in row))
    Console().print(printed)


def window_mean(values: list[float]) -> float | None:
    """Mean of the values collected since the last log, ignoring NaNs; `None` when no value is left.

    A batch where no reward function scored anything logs NaN for its reward metrics; dropping it keeps the other
    batches of the logging window visible, and `None` keeps JSON loggers working.
    """
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else None


def check_metric_for_best_model(args, eval_dataset) -> None:
    """With several named eval datasets (`eval_dataset={"a": ..., "b": ...}`), the GRPO metrics of each are returned
    and logged as `eval_<name>_<metric>` (transformers' naming of `eval_<name>_loss`), so when evaluations choose the
    best checkpoint (`args.metric_for_best_model` set, `args.eval_strategy` not `"no"`), the metric must name the dataset
    it is read from; checked before training, rather than at the first evaluation.

    Raises:
        ValueError: if `eval_dataset` is a dict and `metric_for_best_model` (with transformers' `eval_` prefix added
            when missing) names none of its datasets, e.g. `"eval_reward"`; the message lists the names to use.
    """
    metric_for_best_model = args.metric_for_best_model
    if metric_for_best_model is None or args.eval_strategy == "no" or not isinstance(eval_dataset, dict):
        return
    metric = metric_for_best_model if metric_for_best_model.startswith("eval_") else f"eval_{metric_for_best_model}"
    if any(metric.startswith(f"eval_{name}_") for name in eval_dataset):
        return
    bare = metric.removeprefix("eval_")
    choices = ", ".join(f'"eval_{name}_{bare}"' for name in eval_dataset)
    raise ValueError(
        f"metric_for_best_model={metric_for_best_model!r} names no eval dataset: with several eval datasets each one's "
        f"metrics are named eval_<name>_<metric>. Set GRPOConfig(metric_for_best_model=...) to one of {choices}."
    )
