# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.data_utils: every function against TRL 1.16's on the same rows and the same tokenizer (a tiny BPE with a
small ChatML template that renders tools and a `think` switch), outputs and errors; then the corner cases where we
chose to differ, and that the trainer uses this definition."""

import json
import subprocess
import tempfile

import pytest
from upstream_venv import upstream_env, upstream_trl_python_or_skip

import trl
from trl import data_utils
from trl.models.tiny import build_tokenizer
from trl.trainer import grpo_inputs, grpo_trainer


# ChatML, plus two things TRL's helpers must pass through: `tools` (names listed in a system block) and a template
# variable `think` that makes the generation prompt differ from how an assistant turn opens in a full conversation,
# so the prompt has to be cut back to what it shares with prompt + answer.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if think %}<think>\n{% endif %}{% endif %}"
)

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


ASK = [user("What is 2+3?")]
CHOSEN, REJECTED = [assistant("It is 5.")], [assistant("It is 6.")]

# (case id, function name, positional example, tools or None, template kwargs). Functions that take a tokenizer get
# it as their second argument.
CASES = [
    ("prompt_only", "apply_chat_template", {"prompt": ASK}, None, {}),
    ("prompt_only_extra_columns", "apply_chat_template", {"prompt": ASK, "answer": 5, "id": "a"}, None, {}),
    ("prompt_ends_with_assistant", "apply_chat_template", {"prompt": ASK + [assistant("It is")]}, None, {}),
    ("prompt_ends_with_tool", "apply_chat_template", {"prompt": ASK + [{"role": "tool", "content": "5"}]}, None, {}),
    ("prompt_completion", "apply_chat_template", {"prompt": ASK, "completion": CHOSEN}, None, {}),
    ("preference", "apply_chat_template", {"prompt": ASK, "chosen": CHOSEN, "rejected": REJECTED}, None, {}),
    ("implicit_preference", "apply_chat_template", {"chosen": ASK + CHOSEN, "rejected": ASK + REJECTED}, None, {}),
    (
        "unpaired_preference",
        "apply_chat_template",
        {"prompt": ASK, "completion": REJECTED, "label": False},
        None,
        {},
    ),
    ("language_modelling", "apply_chat_template", {"messages": ASK + CHOSEN}, None, {}),
    ("tools", "apply_chat_template", {"prompt": ASK, "completion": CHOSEN}, [TOOL], {}),
    ("tools_empty_list", "apply_chat_template", {"prompt": ASK}, [], {}),
    ("tools_messages", "apply_chat_template", {"messages": ASK + CHOSEN}, [TOOL], {}),
    ("think_prompt_only", "apply_chat_template", {"prompt": ASK}, None, {"think": True}),
    ("think_prompt_completion", "apply_chat_template", {"prompt": ASK, "completion": CHOSEN}, None, {"think": True}),
    (
        "think_preference",
        "apply_chat_template",
        {"prompt": ASK, "chosen": CHOSEN, "rejected": REJECTED},
        None,
        {"think": True},
    ),
    (
        "chat_template_kwargs_column",
        "apply_chat_template",
        {"prompt": ASK, "completion": CHOSEN, "chat_template_kwargs": {"think": True}},
        None,
        {},
    ),
    ("error_last_role_system", "apply_chat_template", {"prompt": [{"role": "system", "content": "Be"}]}, None, {}),
    ("error_completion_only", "apply_chat_template", {"completion": CHOSEN}, None, {}),
    ("error_no_known_column", "apply_chat_template", {"text": "2+3="}, None, {}),
    ("error_text_prompt", "apply_chat_template", {"prompt": "2+3="}, None, {}),
    ("maybe_conversational", "maybe_apply_chat_template", {"prompt": ASK, "completion": CHOSEN}, None, {}),
    ("maybe_text_prompt", "maybe_apply_chat_template", {"prompt": "2+3=", "answer": 5}, None, {}),
    ("maybe_text_lm", "maybe_apply_chat_template", {"text": "2+3=5"}, None, {}),
    ("maybe_tools_think", "maybe_apply_chat_template", {"prompt": ASK}, [TOOL], {"think": True}),
    ("is_conv_prompt", "is_conversational", {"prompt": ASK}, None, None),
    ("is_conv_text_prompt", "is_conversational", {"prompt": "2+3="}, None, None),
    ("is_conv_messages", "is_conversational", {"messages": ASK + CHOSEN}, None, None),
    ("is_conv_text_lm", "is_conversational", {"text": "hello"}, None, None),
    ("is_conv_implicit", "is_conversational", {"chosen": ASK + CHOSEN, "rejected": ASK + REJECTED}, None, None),
    ("is_conv_no_role", "is_conversational", {"prompt": [{"content": "hi"}]}, None, None),
    ("is_conv_list_of_text", "is_conversational", {"prompt": ["hi"]}, None, None),
    ("is_conv_sharegpt", "is_conversational", {"messages": [{"from": "human", "value": "hi"}]}, None, None),
    (
        "extract_conversational",
        "extract_prompt",
        {"chosen": ASK + CHOSEN, "rejected": ASK + REJECTED, "score": 1},
        None,
        None,
    ),
    (
        "extract_multi_turn",
        "extract_prompt",
        {"chosen": ASK + CHOSEN + [user("Sure?")] + CHOSEN, "rejected": ASK + CHOSEN + [user("Sure?")] + REJECTED},
        None,
        None,
    ),
    (
        "extract_text_space",
        "extract_prompt",
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        None,
        None,
    ),
    ("extract_text_no_space", "extract_prompt", {"chosen": "2+3=5", "rejected": "2+3=6"}, None, None),
    ("extract_text_prefix", "extract_prompt", {"chosen": "abc", "rejected": "abcdef"}, None, None),
    ("extract_identical", "extract_prompt", {"chosen": ASK + CHOSEN, "rejected": ASK + CHOSEN}, None, None),
    ("extract_first_differs", "extract_prompt", {"chosen": "yes", "rejected": "no"}, None, None),
    (
        "maybe_extract_implicit",
        "maybe_extract_prompt",
        {"chosen": ASK + CHOSEN, "rejected": ASK + REJECTED},
        None,
        None,
    ),
    (
        "maybe_extract_explicit",
        "maybe_extract_prompt",
        {"prompt": ASK, "chosen": CHOSEN, "rejected": REJECTED},
        None,
        None,
    ),
    (
        "maybe_extract_text_prompt_with_conversations",
        "maybe_extract_prompt",
        {"prompt": "What is 2+3?", "chosen": ASK + CHOSEN, "rejected": ASK + REJECTED},
        None,
        None,
    ),
    (
        "maybe_extract_text_explicit",
        "maybe_extract_prompt",
        {"prompt": "2+3=", "chosen": "5", "rejected": "6"},
        None,
        None,
    ),
    ("maybe_extract_not_preference", "maybe_extract_prompt", {"prompt": ASK, "completion": CHOSEN}, None, None),
    (
        "from_value_sharegpt",
        "is_conversational_from_value",
        {"conversations": [{"from": "a", "value": "b"}]},
        None,
        None,
    ),
    ("from_value_chatml", "is_conversational_from_value", {"conversations": ASK}, None, None),
    ("from_value_text", "is_conversational_from_value", {"conversations": "hi"}, None, None),
    ("from_value_missing", "is_conversational_from_value", {"messages": ASK}, None, None),
    (
        "chatml_conversations",
        "maybe_convert_to_chatml",
        {"conversations": [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "hello", "weight": 1}]},
        None,
        None,
    ),
    (
        "chatml_columns",
        "maybe_convert_to_chatml",
        {"prompt": [{"from": "user", "value": "hi"}], "completion": [{"from": "assistant", "value": "yo"}], "n": 1},
        None,
        None,
    ),
    ("chatml_already", "maybe_convert_to_chatml", {"messages": ASK + CHOSEN}, None, None),
    ("chatml_text", "maybe_convert_to_chatml", {"prompt": "hi", "completion": "yo"}, None, None),
]

# Runs a case list through whichever `trl` the interpreter imports: {"version", "results": {case id: {"value": ...}
# or {"error": [type name, message]}}}. The same source runs in TRL 1.16's venv and, exec'd, in this process.
RUNNER = r"""
import json, sys


def run_cases(tokenizer_path, cases):
    import trl
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    out = {}
    for case_id, name, example, tools, kwargs in cases:
        func = getattr(trl, name)
        try:
            value = func(example) if kwargs is None else func(example, tokenizer, tools, **kwargs)
            out[case_id] = {"value": value}
        except Exception as error:
            out[case_id] = {"error": [type(error).__name__, str(error)]}
    return json.loads(json.dumps({"version": trl.__version__, "results": out}))


if __name__ == "__main__":
    print(json.dumps(run_cases(*json.loads(sys.stdin.read()))))
"""


@pytest.fixture(scope="module")
def chat_tokenizer_path(tmp_path_factory):
    tokenizer = build_tokenizer(["What is 2+3? It is 5.", "The sky is blue."], vocab_size=300)
    tokenizer.chat_template = TEMPLATE
    path = str(tmp_path_factory.mktemp("chat-tokenizer"))
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def upstream_results(chat_tokenizer_path):
    python = upstream_trl_python_or_skip()
    done = subprocess.run(
        [python, "-P", "-c", RUNNER],
        input=json.dumps([chat_tokenizer_path, CASES]),
        cwd=tempfile.gettempdir(),  # not this repository: `import trl` must find TRL 1.16
        env=upstream_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def our_results(chat_tokenizer_path):
    namespace = {"__name__": "runner"}
    exec(RUNNER, namespace)
    return namespace["run_cases"](chat_tokenizer_path, json.loads(json.dumps(CASES)))


def test_each_side_ran_its_own_trl(our_results, upstream_results):
    assert upstream_results["version"] == "1.16.0"
    assert our_results["version"] == trl.__version__ != "1.16.0"
    assert set(our_results["results"]) == set(upstream_results["results"]) == {case[0] for case in CASES}


@pytest.mark.parametrize("case_id", [case[0] for case in CASES])
def test_matches_trl_1_16(our_results, upstream_results, case_id):
    ours, theirs = our_results["results"][case_id], upstream_results["results"][case_id]
    if "value" in theirs and isinstance(theirs["value"], dict):
        assert list(ours["value"].items()) == list(theirs["value"].items())  # the same keys in the same order
    assert ours == theirs


# ------------------------------------------------------------------------------------- values, checked by hand


@pytest.fixture(scope="module")
def tokenizer(chat_tokenizer_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_tokenizer_path)


def test_prompt_completion_values(tokenizer):
    out = data_utils.apply_chat_template({"prompt": ASK, "completion": CHOSEN, "answer": 5}, tokenizer)
    assert out == {
        "prompt": "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        "completion": "It is 5.<|im_end|>\n",
    }


def test_generation_prompt_cut_to_the_shared_prefix(tokenizer):
    alone = data_utils.apply_chat_template({"prompt": ASK}, tokenizer, think=True)
    assert alone["prompt"].endswith("<|im_start|>assistant\n<think>\n")
    paired = data_utils.apply_chat_template({"prompt": ASK, "completion": CHOSEN}, tokenizer, think=True)
    # "<think>\n" is not in the rendered conversation: the prompt stops where the two renderings part.
    assert paired["prompt"] == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert paired["completion"] == "It is 5.<|im_end|>\n"


def test_tools_are_rendered_and_an_empty_list_is_none(tokenizer):
    with_tool = data_utils.apply_chat_template({"prompt": ASK}, tokenizer, [TOOL])
    assert with_tool["prompt"].startswith("<|im_start|>system\nTools: add<|im_end|>\n")
    assert data_utils.apply_chat_template({"prompt": ASK}, tokenizer, []) == data_utils.apply_chat_template(
        {"prompt": ASK}, tokenizer
    )


def test_assistant_last_continues_the_message(tokenizer):
    out = data_utils.apply_chat_template({"prompt": ASK + [assistant("It is")]}, tokenizer)
    assert out == {"prompt": "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\nIt is"}


def test_errors(tokenizer):
    with pytest.raises(KeyError, match=r"Invalid keys in the example: \{'completion'\}"):
        data_utils.apply_chat_template({"completion": CHOSEN}, tokenizer)
    with pytest.raises(KeyError, match="Invalid keys in the example"):
        data_utils.apply_chat_template({"prompt": ASK, "messages": ASK}, tokenizer)
    with pytest.raises(ValueError, match="Invalid role in the last message: system"):
        data_utils.apply_chat_template({"prompt": [{"role": "system", "content": "x"}]}, tokenizer)
    with pytest.raises(TypeError, match="multiple values for keyword argument 'think'"):
        data_utils.apply_chat_template({"prompt": ASK, "chat_template_kwargs": {"think": True}}, tokenizer, think=1)


def test_maybe_apply_returns_text_rows_unchanged(tokenizer):
    row = {"prompt": "2+3=", "answer": 5}
    assert data_utils.maybe_apply_chat_template(row, tokenizer) is row


def test_extract_prompt_values():
    assert data_utils.extract_prompt({"chosen": "The sky is blue.", "rejected": "The sky is green."}) == {
        "prompt": "The sky is",
        "chosen": " blue.",
        "rejected": " green.",
    }
    assert data_utils.extract_prompt({"chosen": ASK + CHOSEN, "rejected": ASK + REJECTED}) == {
        "prompt": ASK,
        "chosen": CHOSEN,
        "rejected": REJECTED,
    }
    assert data_utils.extract_prompt({"chosen": "abc", "rejected": "abcdef"}) == {
        "prompt": "ab",
        "chosen": "c",
        "rejected": "cdef",
    }


def test_dataset_map(tokenizer):
    from datasets import Dataset

    dataset = Dataset.from_dict({"chosen": [ASK + CHOSEN], "rejected": [ASK + REJECTED]})
    dataset = dataset.map(data_utils.maybe_extract_prompt).map(
        data_utils.maybe_apply_chat_template, fn_kwargs={"processing_class": tokenizer}
    )
    assert dataset[0] == {
        "prompt": "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "It is 5.<|im_end|>\n",
        "rejected": "It is 6.<|im_end|>\n",
    }


# ------------------------------------------------------------------------------ where we chose to differ from TRL


def test_empty_message_lists_are_not_conversational():
    # TRL 1.16 raises IndexError on these.
    assert not data_utils.is_conversational({"prompt": []})
    assert not data_utils.is_conversational_from_value({"conversations": []})


def test_the_first_message_column_decides():
    # TRL picks the column from a set (arbitrary order); we look at prompt, chosen, rejected, completion, messages.
    assert data_utils.is_conversational({"messages": ASK, "prompt": "2+3="}) is False
    assert data_utils.is_conversational({"completion": "5", "chosen": ASK + CHOSEN}) is True


def test_extract_prompt_first_character_differs():
    # TRL 1.16 gives {"prompt": "yes", "chosen": " ", "rejected": "o"} (its space rule wraps around to the last
    # character); we take no prompt when the first characters differ.
    assert data_utils.extract_prompt({"chosen": "yes ", "rejected": "no"}) == {
        "prompt": "",
        "chosen": "yes ",
        "rejected": "no",
    }
    with pytest.raises(ValueError, match="non-empty 'chosen' and 'rejected'"):
        data_utils.extract_prompt({"chosen": [], "rejected": ASK})


def test_chat_template_kwargs_none_is_no_kwargs(tokenizer):
    # TRL 1.16 raises TypeError; `Dataset.from_list` fills a missing dict column with None.
    row = {"prompt": ASK, "chat_template_kwargs": None}
    assert data_utils.apply_chat_template(row, tokenizer) == data_utils.apply_chat_template({"prompt": ASK}, tokenizer)


def test_convert_to_chatml_in_place():
    row = {"conversations": [{"from": "user", "value": "hi"}]}
    assert data_utils.maybe_convert_to_chatml(row) is row
    assert row == {"messages": [{"role": "user", "content": "hi"}]}


def test_the_trainer_uses_the_data_utils_definition():
    assert grpo_trainer.is_conversational is data_utils.is_conversational is trl.is_conversational
    assert not hasattr(grpo_inputs, "is_conversational")  # one definition
