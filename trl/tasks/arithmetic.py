# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Single-digit addition ("3+4=" → "7") with two verifiable rewards: closeness of the answer and exact answer."""

import random
import re

from datasets import Dataset


_FIRST_INTEGER = re.compile(r"\s*(\d+)")
_ANY_INTEGER = re.compile(r"\d+")


SUM_QUESTION = "What is {a} + {b}? Answer with the number only."


def make_arithmetic_dataset(
    num_examples: int = 512,
    seed: int = 0,
    max_operand: int = 9,
    conversational: bool = False,
    template: str = "{a}+{b}=",
) -> Dataset:
    """Prompts `template.format(a=a, b=b)` (by default `"a+b="`) with `0 ≤ a, b ≤ max_operand` and their answers.
    For a chat model, `conversational=True, template=SUM_QUESTION` asks "What is a + b? Answer with the number only."

    Returns:
        A `datasets.Dataset` with columns `"prompt"` (str, or a one-message list when `conversational`) and
        `"answer"` (str).
    """
    rng = random.Random(seed)
    rows = {"prompt": [], "answer": []}
    for _ in range(num_examples):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        text = template.format(a=a, b=b)
        rows["prompt"].append([{"role": "user", "content": text}] if conversational else text)
        rows["answer"].append(str(a + b))
    return Dataset.from_dict(rows)


def arithmetic_corpus(max_operand: int = 9) -> list[str]:
    """Texts to train a tokenizer that covers the task (plus some English, so the model starts with choices)."""
    sums = [f"{a}+{b}={a + b}" for a in range(max_operand + 1) for b in range(max_operand + 1)]
    prose = [
        "The quick brown fox jumps over the lazy dog.",
        "What is the answer? Think step by step, then reply.",
        "Hello world, this is a tiny cold-start language model.",
    ]
    return sums + prose


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def closeness_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """max(0, 1 − |n − answer| / 10) for the integer n the completion starts with; 0.0 when it starts with none.

    A dense signal for a cold-start model: any leading number earns something, the right one earns 1.
    """
    rewards = []
    for completion, expected in zip(completions, answer):
        match = _FIRST_INTEGER.match(_text(completion))
        rewards.append(max(0.0, 1.0 - abs(int(match.group(1)) - int(expected)) / 10.0) if match else 0.0)
    return rewards


def accuracy_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the completion starts with the right integer, else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        match = _FIRST_INTEGER.match(_text(completion))
        rewards.append(1.0 if match and match.group(1) == str(expected) else 0.0)
    return rewards


def answer_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the first integer anywhere in the completion is the answer, else 0.0: the answer must come before any
    other number. "8" and "The answer is 8." are right, "3 + 5 = 8" is not. For chat models, which rarely start
    with the bare number (`accuracy_reward` asks for that).
    """
    found = [_ANY_INTEGER.search(_text(completion)) for completion in completions]
    return [
        1.0 if match is not None and match.group(0) == str(expected) else 0.0 for match, expected in zip(found, answer)
    ]
