# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Digit echo ("7=" → "7"): the smallest skill a cold-start model must read its prompt for; scored by
`accuracy_reward`."""

import random
from collections import Counter

from datasets import Dataset


def make_echo_dataset(num_examples: int = 512, seed: int = 0, conversational: bool = False) -> Dataset:
    """Prompts `"d="` for the digits `d` (each digit equally often, up to one, shuffled); the answer is `"d"`.

    The answer sits one token before the end of the prompt, so a model must attend back to it: a policy that ignores
    the prompt is right 1 time in 10 (see [`best_constant_accuracy`]).

    Returns:
        A `datasets.Dataset` with columns `"prompt"` (str, or a one-message list when `conversational`) and
        `"answer"` (str).
    """
    rng = random.Random(seed)
    digits = [str(i % 10) for i in range(num_examples)]
    rng.shuffle(digits)
    prompts = [f"{d}=" for d in digits]
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    return Dataset.from_dict({"prompt": prompts, "answer": digits})


def best_constant_accuracy(answers: list[str]) -> float:
    """Accuracy of the best policy that ignores the prompt: always giving the most frequent answer.

    Raises:
        ValueError: if `answers` is empty.
    """
    if not answers:
        raise ValueError("best_constant_accuracy needs at least one answer.")
    return Counter(answers).most_common(1)[0][1] / len(answers)
