# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Format rewards: check that a completion lays out its reasoning the expected way (`<think>...</think>`).
"""Rewards on the shape of a completion rather than on its answer."""

from typing import Any

from ._utils import completion_text


_OPEN, _CLOSE = "<think>", "</think>"


def think_format_reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """1.0 for each completion whose reasoning is wrapped in one `<think>...</think>` block, else 0.0.

    A completion has the right format when it starts with `<think>`, a `</think>` follows, and `<think>` does not
    appear a second time; anything may come after `</think>` (the final answer). This is the format reward of
    DeepSeek-R1 (arXiv 2501.12948), as TRL 1.16 defines it.

    Args:
        completions: the completions, conversational (`[{"role": "assistant", "content": ...}]`) or plain strings.
        **kwargs: the trainer's other keyword arguments, ignored.

    Returns:
        One float per completion: 1.0 when the format is right, 0.0 otherwise.
    """
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        body = text[len(_OPEN) :]
        well_formed = text.startswith(_OPEN) and _OPEN not in body and _CLOSE in body
        rewards.append(1.0 if well_formed else 0.0)
    return rewards
