# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Ready-made reward functions for `GRPOTrainer(reward_funcs=...)`, with the names and behaviour of `trl.rewards`
# in TRL 1.16. The math-answer checks need the optional `math-verify` package (`pip install "trl[math]"`).
"""Reward functions to pass to `GRPOTrainer(reward_funcs=...)`, compatible with TRL 1.16's `trl.rewards`."""

from .accuracy_rewards import accuracy_reward, get_cosine_scaled_reward, reasoning_accuracy_reward
from .format_rewards import think_format_reward
from .other_rewards import get_repetition_penalty_reward, get_soft_overlong_punishment


__all__ = [
    "accuracy_reward",
    "get_cosine_scaled_reward",
    "get_repetition_penalty_reward",
    "get_soft_overlong_punishment",
    "reasoning_accuracy_reward",
    "think_format_reward",
]
