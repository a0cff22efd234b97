# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.tasks.echo: the digit-echo dataset and the prompt-blind baseline, by hand."""

from collections import Counter

import pytest

from trl.tasks import accuracy_reward, best_constant_accuracy, make_echo_dataset


def test_echo_rows_and_balance():
    dataset = make_echo_dataset(25, seed=3)
    assert dataset.column_names == ["prompt", "answer"] and len(dataset) == 25
    assert all(row["prompt"] == row["answer"] + "=" for row in dataset)
    # 25 rows: digits 0-4 three times, 5-9 twice.
    assert Counter(dataset["answer"]) == {**{str(d): 3 for d in range(5)}, **{str(d): 2 for d in range(5, 10)}}
    assert make_echo_dataset(25, seed=3)["prompt"] == dataset["prompt"]
    assert make_echo_dataset(25, seed=4)["prompt"] != dataset["prompt"]


def test_echo_conversational():
    row = make_echo_dataset(4, seed=3, conversational=True)[0]
    plain = make_echo_dataset(4, seed=3)[0]
    assert row["prompt"] == [{"role": "user", "content": plain["prompt"]}] and row["answer"] == plain["answer"]


def test_best_constant_accuracy_by_hand():
    assert best_constant_accuracy(["1", "2", "2", "3"]) == 0.5
    assert best_constant_accuracy(make_echo_dataset(1000)["answer"]) == 0.1
    with pytest.raises(ValueError, match="best_constant_accuracy needs at least one answer."):
        best_constant_accuracy([])


def test_echo_is_scored_by_accuracy_reward():
    dataset = make_echo_dataset(3, seed=0)
    answers = dataset["answer"]
    completions = [answers[0], answers[1] + answers[1], "x"]  # right, a two-digit number, no digit
    assert accuracy_reward(completions, answers) == [1.0, 0.0, 0.0]
