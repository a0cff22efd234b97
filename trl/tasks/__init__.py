# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Small verifiable-reward tasks generated in code (no download), used by the demo, the CLI and the tests."""

from .arithmetic import (
    SUM_QUESTION,
    accuracy_reward,
    answer_reward,
    arithmetic_corpus,
    closeness_reward,
    make_arithmetic_dataset,
)
from .echo import best_constant_accuracy, make_echo_dataset


__all__ = [
    "SUM_QUESTION",
    "accuracy_reward",
    "answer_reward",
    "arithmetic_corpus",
    "best_constant_accuracy",
    "closeness_reward",
    "make_arithmetic_dataset",
    "make_echo_dataset",
]
