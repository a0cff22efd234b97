# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Length and repetition penalties computed on the completion's token ids (no answer checking).
"""Penalties on completion token ids: soft overlong punishment (DAPO) and n-gram repetition."""

from collections.abc import Callable
from typing import Any


class _RepetitionPenaltyReward:
    """The callable `get_repetition_penalty_reward` returns (a class so that it pickles)."""

    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float):
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        rewards = []
        n = self.ngram_size
        for ids in completion_ids:
            ids = list(ids)
            total = len(ids) - n + 1
            if total <= 0:  # shorter than one n-gram: nothing can repeat
                rewards.append(0.0)
                continue
            distinct = len({tuple(ids[start : start + n]) for start in range(total)})
            repeated_share = 1.0 - distinct / total
            # `0.0` rather than `-0.0` when nothing repeats.
            rewards.append(repeated_share * self.max_penalty if repeated_share > 0 else 0.0)
        return rewards


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable:
    """Build a reward that penalizes completions repeating their own token n-grams.

    From "Demystifying Long Chain-of-Thought Reasoning in LLMs" (Yeo et al., arXiv 2502.03373): with `U` the
    number of distinct n-grams of a completion and `T` the number of all its n-grams, the penalty is
    `(1 - U / T) * max_penalty`, so 0.0 for no repetition and close to `max_penalty` for a completion that repeats
    one n-gram throughout. A completion with fewer than `ngram_size` tokens gets 0.0.

    Args:
        ngram_size: the length `n` of the token n-grams compared.
        max_penalty: the penalty's limit for full repetition; must be zero or negative.

    Returns:
        A reward function `f(completion_ids, **kwargs) -> list[float]` (named `repetition_penalty_reward`) giving
        one value in `[max_penalty, 0]` per completion.

    Raises:
        ValueError: if `max_penalty` is positive, or `ngram_size` is smaller than 1.
    """
    if max_penalty > 0:
        raise ValueError(f"max_penalty must be zero or negative, got {max_penalty}")
    if ngram_size < 1:
        raise ValueError(f"ngram_size must be at least 1, got {ngram_size}")
    return _RepetitionPenaltyReward(ngram_size, max_penalty)


class _SoftOverlongPunishment:
    """The callable `get_soft_overlong_punishment` returns (a class so that it pickles)."""

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        free_len = self.max_completion_len - self.soft_punish_cache  # longest length with no penalty
        rewards = []
        for ids in completion_ids:
            length = len(ids)
            if length <= free_len:
                rewards.append(0.0)
            elif length <= self.max_completion_len:  # inside the buffer (empty when the buffer is 0)
                rewards.append((free_len - length) / self.soft_punish_cache)
            else:
                rewards.append(-1.0)
        return rewards


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable:
    """Build DAPO's soft overlong punishment: a length penalty that grows over a buffer before the length limit.

    Eq. (13) of "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476). With
    `L = max_completion_len` and `C = soft_punish_cache`, a completion of `n` tokens gets 0.0 when `n <= L - C`,
    `((L - C) - n) / C` (from just below 0 down to -1.0) when `L - C < n <= L`, and -1.0 when `n > L`. It only
    penalizes; short completions are not rewarded.

    Args:
        max_completion_len: the length limit `L`, in tokens (usually the config's `max_completion_length`).
        soft_punish_cache: the buffer `C`, in tokens, over which the penalty ramps up.

    Returns:
        A reward function `f(completion_ids, **kwargs) -> list[float]` (named `soft_overlong_punishment_reward`)
        giving one value in `[-1, 0]` per completion.
    """
    return _SoftOverlongPunishment(max_completion_len, soft_punish_cache)
