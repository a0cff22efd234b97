# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# Tests of `trl.rewards`: known values for each reward function, and the same inputs checked against TRL 1.16.
"""Tests for the reward functions of `trl.rewards` (TRL 1.16 compatible)."""

import json
import pickle
import subprocess
import sys
import tempfile
import threading

import pytest
from upstream_venv import upstream_env, upstream_trl_python_or_skip

from trl import rewards
from trl.rewards import (
    accuracy_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)


pytest.importorskip("math_verify")


def conv(*texts: str) -> list[list[dict[str, str]]]:
    """Conversational completions, one assistant message each."""
    return [[{"role": "assistant", "content": text}] for text in texts]


THIRD = r"\frac{1}{3}"


# ---------------------------------------------------------------------------------------------- accuracy_reward


def test_accuracy_reward_boxed_answers():
    completions = conv(
        r"So the answer is \boxed{\frac{1}{3}}.",  # correct
        r"\boxed{\frac{1}{2}}",  # wrong
        r"The answer is $\boxed{0.5}$",  # same value, other notation
        "I do not know.",  # no answer to extract
        r"\boxed{1}",  # gold below cannot be parsed
    )
    solution = [THIRD, THIRD, r"\frac{1}{2}", THIRD, "not a formula"]
    assert accuracy_reward(completions, solution) == [1.0, 0.0, 1.0, 0.0, None]


def test_accuracy_reward_plain_string_completions():
    assert accuracy_reward([r"\boxed{\frac{1}{3}}", r"\boxed{3}"], [THIRD, THIRD]) == [1.0, 0.0]


def test_accuracy_reward_logs_parsed_columns():
    logged = {}
    accuracy_reward(
        conv(r"\boxed{\frac{1}{3}}", "nothing", "x"), [THIRD, THIRD, "hello"], log_extra=logged.__setitem__
    )
    assert logged["solution"] == [THIRD, THIRD, "hello"]
    assert logged["gold_parsed"][2] == "[unparseable]"
    assert logged["answer_parsed"][1:] == ["[unparseable]", "[skipped]"]


def test_accuracy_reward_length_mismatch_raises():
    with pytest.raises(ValueError):
        accuracy_reward(conv(r"\boxed{1}"), ["1", "2"])


def test_accuracy_reward_off_main_thread():
    """math-verify's signal timeouts only work on the main thread; elsewhere they are turned off, not an error."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=accuracy_reward(conv(r"\boxed{2}"), ["2"])))
    thread.start()
    thread.join()
    assert result["r"] == [1.0]


def test_math_rewards_without_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    for call in (
        lambda: accuracy_reward(conv("1"), ["1"]),
        lambda: reasoning_accuracy_reward(conv("</think>1"), ["1"]),
        lambda: get_cosine_scaled_reward(10)(conv("1"), ["1"], [[1]]),
    ):
        with pytest.raises(ImportError, match=r'pip install "trl\[math\]"'):
            call()


# ------------------------------------------------------------------------------------ reasoning_accuracy_reward


def test_reasoning_accuracy_reward():
    completions = conv(
        r"<think>Maybe \boxed{\frac{1}{2}}? No.</think> The answer is \boxed{\frac{1}{3}}",  # right after thinking
        r"<think>It is \boxed{\frac{1}{3}}.</think> So \boxed{\frac{1}{2}}",  # right only inside the thinking
        r"<think>Still thinking: \boxed{\frac{1}{3}}",  # reasoning not finished
        r"<think>Still thinking",  # not finished, gold unparseable: 0.0, not None
        r"<think>done</think> \boxed{1}",  # finished, gold unparseable
    )
    solution = [THIRD, THIRD, THIRD, "hello", "hello"]
    assert reasoning_accuracy_reward(completions, solution) == [1.0, 0.0, 0.0, 0.0, None]


def test_reasoning_accuracy_reward_custom_delimiters():
    completions = conv(r"thinking \boxed{2} <answer> \boxed{\frac{1}{3}}", r"<think>x</think> \boxed{\frac{1}{3}}")
    assert reasoning_accuracy_reward(completions, [THIRD, THIRD], reasoning_delimiters=["<answer>"]) == [1.0, 0.0]


# ------------------------------------------------------------------------------------------ think_format_reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>Reasoning.</think>The answer is 2.", 1.0),
        ("<think>\nline one\nline two\n</think>\n\nanswer", 1.0),
        ("<think></think>", 1.0),
        ("The answer is 2.", 0.0),
        (" <think>leading space</think>2", 0.0),
        ("<think>never closed", 0.0),
        ("no opening</think>2", 0.0),
        ("<think>a<think>b</think>2", 0.0),
        ("<think>a</think><think>b</think>", 0.0),
    ],
)
def test_think_format_reward(text, expected):
    assert think_format_reward(conv(text)) == [expected]
    assert think_format_reward([text]) == [expected]


# ---------------------------------------------------------------------------------- get_soft_overlong_punishment


@pytest.mark.parametrize(
    "length, expected",
    [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (99, -0.95), (100, -1.0), (101, -1.0), (500, -1.0)],
)
def test_soft_overlong_punishment(length, expected):
    punish = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    assert punish(completion_ids=[[7] * length]) == [pytest.approx(expected)]


def test_soft_overlong_punishment_without_buffer():
    punish = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=0)
    assert punish(completion_ids=[[1] * 10, [1] * 11]) == [0.0, -1.0]


# -------------------------------------------------------------------------------- get_repetition_penalty_reward


@pytest.mark.parametrize(
    "ngram_size, max_penalty, ids, expected",
    [
        (3, -1.0, [1, 2, 3, 4, 5], 0.0),  # no repeated trigram
        (3, -1.0, [5, 5, 5, 5, 5], -2 / 3),  # 3 trigrams, 1 distinct
        (3, -1.0, [1, 2, 3, 1, 2, 3], -0.25),  # 4 trigrams, 3 distinct
        (3, -1.0, [1, 2], 0.0),  # shorter than one trigram
        (3, -1.0, [], 0.0),
        (2, -0.5, [1, 1, 1, 1], -1 / 3),  # 3 bigrams, 1 distinct, half the penalty
        (1, -1.0, [4, 4, 4, 4], -0.75),
    ],
)
def test_repetition_penalty(ngram_size, max_penalty, ids, expected):
    penalty = get_repetition_penalty_reward(ngram_size=ngram_size, max_penalty=max_penalty)
    assert penalty(completion_ids=[ids]) == [pytest.approx(expected)]


def test_repetition_penalty_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_penalty"):
        get_repetition_penalty_reward(max_penalty=0.5)
    with pytest.raises(ValueError, match="ngram_size"):
        get_repetition_penalty_reward(ngram_size=0)


# ------------------------------------------------------------------------------------- get_cosine_scaled_reward


@pytest.mark.parametrize(
    "answer, length, expected",
    [
        (THIRD, 0, 1.0),  # correct: max_value_correct at length 0 ...
        (THIRD, 50, 0.75),
        (THIRD, 100, 0.5),  # ... min_value_correct at max_len
        (THIRD, 300, 0.5),  # held past max_len
        ("2", 0, -1.0),  # wrong: min_value_wrong at length 0 ...
        ("2", 50, -0.75),
        ("2", 100, -0.5),  # ... max_value_wrong at max_len
        ("2", 300, -0.5),
    ],
)
def test_cosine_scaled_reward(answer, length, expected):
    reward = get_cosine_scaled_reward(max_len=100)
    value = reward(conv(rf"\boxed{{{answer}}}"), [THIRD], completion_ids=[[1] * length])
    assert value == [pytest.approx(expected)]


def test_cosine_scaled_reward_custom_values_and_unparseable_gold():
    reward = get_cosine_scaled_reward(
        max_len=10, min_value_wrong=-2.0, max_value_wrong=0.0, min_value_correct=1.0, max_value_correct=3.0
    )
    completions = conv(r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{3}}", r"\boxed{5}", r"\boxed{5}")
    values = reward(completions, [THIRD, THIRD, THIRD, "hello"], completion_ids=[[1] * 0, [1] * 10, [1] * 0, [1]])
    assert values == [pytest.approx(3.0), pytest.approx(1.0), pytest.approx(-2.0), None]


# ---------------------------------------------------------------------------------------------------- packaging


def test_public_names_and_callable_names():
    assert sorted(rewards.__all__) == [
        "accuracy_reward",
        "get_cosine_scaled_reward",
        "get_repetition_penalty_reward",
        "get_soft_overlong_punishment",
        "reasoning_accuracy_reward",
        "think_format_reward",
    ]
    built = {
        "cosine_scaled_reward": get_cosine_scaled_reward(10),
        "repetition_penalty_reward": get_repetition_penalty_reward(),
        "soft_overlong_punishment_reward": get_soft_overlong_punishment(10, 2),
    }
    kwargs = dict(completions=conv(r"\boxed{1}"), solution=["1"], completion_ids=[[1, 1, 1, 1]])
    for name, func in built.items():
        assert func.__name__ == name
        assert pickle.loads(pickle.dumps(func))(**kwargs) == func(**kwargs)


# ------------------------------------------------------------------------------------------- against TRL 1.16

# (id, function in trl.rewards, factory kwargs or None for a plain reward function, call kwargs)
UPSTREAM_CASES = [
    (
        "accuracy",
        "accuracy_reward",
        None,
        dict(
            completions=conv(
                r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}", r"$\boxed{0.5}$", "no idea", r"\boxed{1}"
            ),
            solution=[THIRD, THIRD, r"\frac{1}{2}", THIRD, "not a formula"],
        ),
    ),
    (
        "reasoning_accuracy",
        "reasoning_accuracy_reward",
        None,
        dict(
            completions=conv(
                r"<think>\boxed{\frac{1}{2}}</think> \boxed{\frac{1}{3}}",
                r"<think>\boxed{\frac{1}{3}}</think> \boxed{\frac{1}{2}}",
                r"<think>\boxed{\frac{1}{3}}",
                "<think>unfinished",
                r"<think>a</think>b</think> \boxed{1}",
            ),
            solution=[THIRD, THIRD, THIRD, "hello", "1"],
        ),
    ),
    (
        "reasoning_accuracy_delimiters",
        "reasoning_accuracy_reward",
        None,
        dict(
            completions=conv(r"x <answer> \boxed{\frac{1}{3}}", r"<think>x</think> \boxed{\frac{1}{3}}"),
            solution=[THIRD, THIRD],
            reasoning_delimiters=["<answer>", "Final:"],
        ),
    ),
    (
        "think_format",
        "think_format_reward",
        None,
        dict(
            completions=conv(
                "<think>r</think>a",
                "<think>\nr\n</think>\na",
                "<think></think>",
                "plain",
                " <think>r</think>",
                "<think>open",
                "r</think>",
                "<think>a<think>b</think>",
                "<think>a</think><think>b</think>",
                "<think>a</think>\n<think>",
            )
        ),
    ),
    (
        "soft_overlong",
        "get_soft_overlong_punishment",
        dict(max_completion_len=100, soft_punish_cache=20),
        dict(completion_ids=[[1] * n for n in (0, 79, 80, 81, 90, 99, 100, 101, 300)]),
    ),
    (
        "soft_overlong_no_cache",
        "get_soft_overlong_punishment",
        dict(max_completion_len=10, soft_punish_cache=0),
        dict(completion_ids=[[1] * n for n in (9, 10, 11)]),
    ),
    (
        "repetition_default",
        "get_repetition_penalty_reward",
        dict(),
        dict(completion_ids=[[1, 2, 3, 4], [5] * 5, [1, 2, 3, 1, 2, 3], [1, 2], [], [1, 2, 3]]),
    ),
    (
        "repetition_bigram",
        "get_repetition_penalty_reward",
        dict(ngram_size=2, max_penalty=-0.5),
        dict(completion_ids=[[1, 1, 1, 1], [1, 2, 1, 2, 1], [3]]),
    ),
    (
        "cosine_default",
        "get_cosine_scaled_reward",
        dict(max_len=100),
        dict(
            completions=conv(*[r"\boxed{\frac{1}{3}}"] * 4, *[r"\boxed{2}"] * 4, r"\boxed{1}"),
            solution=[THIRD] * 8 + ["hello"],
            completion_ids=[[1] * n for n in (0, 30, 100, 250, 0, 30, 100, 250, 5)],
        ),
    ),
    (
        "cosine_custom",
        "get_cosine_scaled_reward",
        dict(max_len=7, min_value_wrong=-3.0, max_value_wrong=0.25, min_value_correct=0.1, max_value_correct=2.0),
        dict(
            completions=conv(r"\boxed{\frac{1}{3}}", r"\boxed{2}"),
            solution=[THIRD, THIRD],
            completion_ids=[[1] * 3, [1] * 5],
        ),
    ),
]

UPSTREAM_SCRIPT = """
import json, sys
import trl.rewards as rewards
out = {}
for case_id, name, factory_kwargs, kwargs in json.load(sys.stdin):
    func = getattr(rewards, name)
    if factory_kwargs is not None:
        func = func(**factory_kwargs)
    out[case_id] = {"name": func.__name__, "values": func(**kwargs)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def upstream_values() -> dict:
    """TRL 1.16's outputs on `UPSTREAM_CASES`, from one run of its venv."""
    python = upstream_trl_python_or_skip()
    done = subprocess.run(
        [python, "-P", "-c", UPSTREAM_SCRIPT],
        input=json.dumps(UPSTREAM_CASES),
        cwd=tempfile.gettempdir(),  # not this repository: `import trl` must find TRL 1.16
        env=upstream_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "No module named 'math_verify'" in done.stderr:
        pytest.skip("math-verify is not visible to the TRL 1.16 venv")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case_id, name, factory_kwargs, kwargs", UPSTREAM_CASES, ids=[c[0] for c in UPSTREAM_CASES])
def test_matches_trl_1_16(upstream_values, case_id, name, factory_kwargs, kwargs):
    func = getattr(rewards, name)
    if factory_kwargs is not None:
        func = func(**factory_kwargs)
    expected = upstream_values[case_id]
    assert func.__name__ == expected["name"]
    assert func(**kwargs) == [None if v is None else pytest.approx(v, abs=1e-12) for v in expected["values"]]
