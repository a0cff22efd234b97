# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Answer-checking rewards for math tasks: compare a completion's (boxed) LaTeX answer with the gold solution using
# `math-verify`, optionally after dropping the reasoning, or scaled by the completion's length.
"""Math accuracy rewards (`accuracy_reward`, `reasoning_accuracy_reward`, `get_cosine_scaled_reward`)."""

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from ._utils import completion_text


_INSTALL_HINT = 'pip install "trl[math]"  (or: pip install "math-verify>=0.9.0")'

# math-verify enforces its timeouts with signals, which only work on the main thread; elsewhere they are turned off.
_PARSE_TIMEOUT_S = 10
_VERIFY_TIMEOUT_S = 5


def _load_math_verify(caller: str) -> tuple[Any, Any, Any, Any]:
    """Import math-verify on first use: `(parse, verify, LatexExtractionConfig, NormalizationConfig)`.

    Raises:
        ImportError: if math-verify is not installed, saying how to install it.
    """
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError as error:
        raise ImportError(f"`{caller}` needs the `math-verify` package: {_INSTALL_HINT}") from error
    return parse, verify, LatexExtractionConfig, NormalizationConfig


class _AnswerChecker:
    """Grades answers against gold solutions with math-verify, with the timeouts right for the calling thread."""

    def __init__(self, caller: str):
        self.parse, self.verify, latex_config, normalization_config = _load_math_verify(caller)
        on_main_thread = threading.current_thread() is threading.main_thread()
        self.parse_timeout = _PARSE_TIMEOUT_S if on_main_thread else None
        self.verify_timeout = _VERIFY_TIMEOUT_S if on_main_thread else None
        if not on_main_thread:  # math-verify warns on every call that its timeout is off
            logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
            logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
        # The answer must be well-formed LaTeX; a `\boxed{}` one is looked for first, and bare text is not tried.
        self.answer_config = [
            latex_config(
                normalization_config=normalization_config(units=True),
                boxed_match_priority=0,
                try_extract_without_anchor=False,
            )
        ]

    def grade(self, answer: str, gold: str) -> tuple[float | None, str, str]:
        """`(reward, gold as parsed, answer as parsed)`: 1.0 / 0.0, or `None` when the gold cannot be parsed."""
        gold_parsed = self.parse(gold, parsing_timeout=self.parse_timeout)
        if not gold_parsed:
            return None, "[unparseable]", "[skipped]"
        answer_parsed = self.parse(
            answer,
            extraction_config=self.answer_config,
            extraction_mode="first_match",
            parsing_timeout=self.parse_timeout,
        )
        reward = float(self.verify(gold_parsed, answer_parsed, timeout_seconds=self.verify_timeout))
        return reward, str(gold_parsed), str(answer_parsed) if answer_parsed else "[unparseable]"


def _log_parsed(log_extra: Callable | None, solution: list[str], gold: list[str], answers: list[str]) -> None:
    if log_extra is not None:
        log_extra("solution", list(solution))
        log_extra("gold_parsed", gold)
        log_extra("answer_parsed", answers)


def accuracy_reward(
    completions: list[list[dict[str, str]]],
    solution: list[str],
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 when a completion's LaTeX answer equals the gold solution (checked with math-verify), else 0.0.

    The answer is taken from the completion's first LaTeX expression, a `\boxed{...}` one before any other; it is
    compared with the gold symbolically, so `\frac{1}{2}` and `0.5` agree. When the gold solution itself cannot
    be parsed the reward is `None`, so the trainer leaves the example out of that reward (as TRL 1.16 does). This
    is the rule-based accuracy reward of DeepSeek-R1 (arXiv 2501.12948) as used in Open-R1 and TRL.

    Args:
        completions: the completions, conversational (`[{"role": "assistant", "content": ...}]`) or plain strings.
        solution: the gold answers, one per completion (the dataset's `solution` column).
        log_extra: the trainer's hook; when given, the columns `solution`, `gold_parsed` and `answer_parsed` are
            added to the logged completions table.
        **kwargs: the trainer's other keyword arguments, ignored.

    Returns:
        One value per completion: 1.0 (correct), 0.0 (wrong or no parseable answer) or `None` (gold unparseable).

    Raises:
        ImportError: if `math-verify` is not installed (`pip install "trl[math]"`).
        ValueError: if `completions` and `solution` differ in length.
    """
    checker = _AnswerChecker("accuracy_reward")
    rewards, gold_strs, answer_strs = [], [], []
    for completion, gold in zip(completions, solution, strict=True):
        reward, gold_str, answer_str = checker.grade(completion_text(completion), gold)
        rewards.append(reward)
        gold_strs.append(gold_str)
        answer_strs.append(answer_str)
    _log_parsed(log_extra, solution, gold_strs, answer_strs)
    return rewards


def reasoning_accuracy_reward(
    completions: list[list[dict[str, str]]],
    solution: list[str],
    reasoning_delimiters: list[str] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """`accuracy_reward` on the final answer only: the text after the end of the reasoning.

    For reasoning models, whose thinking may hold intermediate (and wrong) boxed expressions. The first delimiter of
    `reasoning_delimiters` found in a completion ends its reasoning, and the answer is read from what follows its
    last occurrence. A completion with none of the delimiters has not finished reasoning and gets 0.0 (a penalty,
    not `None`), whatever the gold; otherwise the reward is as in `accuracy_reward`, `None` when the gold cannot be
    parsed.

    Args:
        completions: the completions, conversational (`[{"role": "assistant", "content": ...}]`) or plain strings.
        solution: the gold answers, one per completion (the dataset's `solution` column).
        reasoning_delimiters: the strings that close the reasoning, tried in order; `None` means `["</think>"]`.
        log_extra: the trainer's hook; when given, the columns `solution`, `gold_parsed` and `answer_parsed` are
            added to the logged completions table.
        **kwargs: the trainer's other keyword arguments, ignored.

    Returns:
        One value per completion: 1.0 (correct), 0.0 (wrong, no parseable answer, or reasoning not finished) or
        `None` (gold unparseable).

    Raises:
        ImportError: if `math-verify` is not installed (`pip install "trl[math]"`).
        ValueError: if `completions` and `solution` differ in length.
    """
    checker = _AnswerChecker("reasoning_accuracy_reward")
    delimiters = ["</think>"] if reasoning_delimiters is None else reasoning_delimiters
    rewards, gold_strs, answer_strs = [], [], []
    for completion, gold in zip(completions, solution, strict=True):
        text = completion_text(completion)
        delimiter = next((d for d in delimiters if d in text), None)
        if delimiter is None:
            reward, gold_str, answer_str = 0.0, "[incomplete reasoning]", "[incomplete reasoning]"
        else:
            reward, gold_str, answer_str = checker.grade(text.rsplit(delimiter, 1)[-1], gold)
        rewards.append(reward)
        gold_strs.append(gold_str)
        answer_strs.append(answer_str)
    _log_parsed(log_extra, solution, gold_strs, answer_strs)
    return rewards


class _CosineScaledReward:
    """The callable `get_cosine_scaled_reward` returns (a class so that it pickles)."""

    __name__ = "cosine_scaled_reward"

    def __init__(
        self,
        max_len: int,
        min_value_wrong: float,
        max_value_wrong: float,
        min_value_correct: float,
        max_value_correct: float,
    ):
        self.max_len = max_len
        self.min_value_wrong = min_value_wrong
        self.max_value_wrong = max_value_wrong
        self.min_value_correct = min_value_correct
        self.max_value_correct = max_value_correct

    def __call__(
        self,
        completions: list[list[dict[str, str]]],
        solution: list[str],
        completion_ids: list[list[int]],
        **kwargs: Any,
    ) -> list[float | None]:
        correctness = accuracy_reward(completions, solution)
        rewards = []
        for correct, ids in zip(correctness, completion_ids, strict=True):
            if correct is None:  # gold unparseable: skipped, as in accuracy_reward
                rewards.append(None)
                continue
            if correct:  # short correct answers score highest
                at_zero, at_max_len = self.max_value_correct, self.min_value_correct
            else:  # short wrong answers are punished most
                at_zero, at_max_len = self.min_value_wrong, self.max_value_wrong
            # Past max_len the length is held at max_len (the cosine would otherwise rise again).
            weight = 0.5 * (1.0 + math.cos(math.pi * min(len(ids) / self.max_len, 1.0)))  # 1 at length 0, 0 at max
            rewards.append(float(at_max_len + (at_zero - at_max_len) * weight))
        return rewards


def get_cosine_scaled_reward(
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
) -> Callable:
    r"""Build a correctness reward whose value follows a cosine of the completion's length.

    From "Demystifying Long Chain-of-Thought Reasoning in LLMs" (Yeo et al., arXiv 2502.03373): with `t` the
    completion's length in tokens, capped at `max_len`,
    `r = v_end + (v_start - v_end) * (1 + cos(pi * t / max_len)) / 2`. A correct completion (`accuracy_reward` is
    1.0) goes from `v_start = max_value_correct` at length 0 down to `v_end = min_value_correct` at `max_len`, so
    shorter correct answers are preferred; a wrong one goes from `v_start = min_value_wrong` at length 0 up to
    `v_end = max_value_wrong` at `max_len`, so a model that is wrong is pushed to think longer. When the gold cannot
    be parsed the reward is `None`.

    Args:
        max_len: the length, in tokens, at which the schedule ends (longer completions get the `max_len` value).
        min_value_wrong: the reward of a wrong completion of length 0.
        max_value_wrong: the reward of a wrong completion of length `max_len` or more.
        min_value_correct: the reward of a correct completion of length `max_len` or more.
        max_value_correct: the reward of a correct completion of length 0.

    Returns:
        A reward function `f(completions, solution, completion_ids, **kwargs) -> list[float | None]` (named
        `cosine_scaled_reward`); calling it needs `math-verify` (`pip install "trl[math]"`).
    """
    return _CosineScaledReward(max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)
