# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.tasks.arithmetic: the dataset and the two verifiable rewards, by hand."""

from trl.tasks import (
    SUM_QUESTION,
    accuracy_reward,
    answer_reward,
    arithmetic_corpus,
    closeness_reward,
    make_arithmetic_dataset,
)


def test_dataset_rows_are_correct_sums():
    dataset = make_arithmetic_dataset(32, seed=3)
    assert dataset.column_names == ["prompt", "answer"] and len(dataset) == 32
    for row in dataset:
        a, b = row["prompt"].rstrip("=").split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9 and int(row["answer"]) == int(a) + int(b)
    assert make_arithmetic_dataset(32, seed=3)["prompt"] == dataset["prompt"]
    assert make_arithmetic_dataset(32, seed=4)["prompt"] != dataset["prompt"]


def test_conversational_dataset():
    row = make_arithmetic_dataset(4, seed=3, conversational=True)[0]
    plain = make_arithmetic_dataset(4, seed=3)[0]
    assert row["prompt"] == [{"role": "user", "content": plain["prompt"]}] and row["answer"] == plain["answer"]


def test_question_template():
    plain = make_arithmetic_dataset(4, seed=3)
    asked = make_arithmetic_dataset(4, seed=3, conversational=True, template=SUM_QUESTION)
    for row, question in zip(plain, asked):
        a, b = row["prompt"].rstrip("=").split("+")
        assert question["prompt"] == [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
        assert question["answer"] == row["answer"]


def test_answer_reward_by_hand():
    completions = ["8", "The answer is 8.", "3 + 5 = 8", "18", "eight", [{"role": "assistant", "content": " 8!"}]]
    assert answer_reward(completions, ["8"] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_closeness_reward_by_hand():
    completions = ["7", " 9 apples", "17", "x7", "", "3"]
    answers = ["7", "7", "7", "7", "7", "15"]
    # |n − a|/10: 0 → 1, 2 → 0.8, 10 → 0, no leading integer → 0, 12 → max(0, −0.2) = 0.
    assert closeness_reward(completions, answers) == [1.0, 0.8, 0.0, 0.0, 0.0, 0.0]


def test_accuracy_reward_by_hand():
    completions = ["7", " 7 is it", "70", "x7", [{"role": "assistant", "content": "12"}]]
    assert accuracy_reward(completions, ["7", "7", "7", "7", "12"]) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_corpus_covers_all_sums():
    corpus = arithmetic_corpus()
    assert "9+9=18" in corpus and "0+0=0" in corpus and len(corpus) == 103
