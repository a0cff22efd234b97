# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Small helpers shared by the reward functions of `trl.rewards`: reading a completion's text.
"""Helpers shared by the `trl.rewards` modules."""

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one completion, as the trainer passes it to reward functions.

    Args:
        completion: a conversational completion (a list of messages; the first one's `"content"` is used, as in
            TRL) or a plain string (standard, non-conversational datasets).

    Returns:
        The completion's text.
    """
    if isinstance(completion, str):
        return completion
    return completion[0]["content"]
