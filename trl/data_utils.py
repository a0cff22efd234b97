# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Per-example dataset helpers with the names and behaviour of TRL 1.16's `trl.data_utils`: tell conversational
examples from plain-text ones, render them with a chat template, split implicit prompts off preference pairs, and
convert ShareGPT-style `from`/`value` messages to ChatML `role`/`content`. Three helpers of ours decide how a prefill
(a prompt ending with an assistant message) is rendered, for the trainer and its reward models as for these.

Every dataset helper takes one example (a `dict`, as `datasets.Dataset.map` passes it) and returns a `dict`, so each
can be used as `dataset.map(fn)` or `dataset.map(fn, fn_kwargs={"processing_class": tokenizer})`.
"""

from collections.abc import Callable, Sequence
from typing import Any


# The message columns TRL looks at, in the order we look at them: the first one present decides.
MESSAGE_KEYS = ("prompt", "chosen", "rejected", "completion", "messages")

# The column sets `apply_chat_template` accepts (TRL's dataset kinds) and what each one is.
DATASET_KINDS = {
    frozenset({"messages"}): "language modelling",
    frozenset({"prompt"}): "prompt-only",
    frozenset({"prompt", "completion"}): "prompt-completion",
    frozenset({"prompt", "chosen", "rejected"}): "preference",
    frozenset({"chosen", "rejected"}): "preference with implicit prompt",
    frozenset({"prompt", "completion", "label"}): "unpaired preference",
}


def _is_message_list(value: Any, role_key: str = "role", content_key: str | None = None) -> bool:
    """True for a non-empty list whose first item is a dict with `role_key` (and `content_key` when given)."""
    if not isinstance(value, list) or not value or not isinstance(value[0], dict):
        return False
    return role_key in value[0] and (content_key is None or content_key in value[0])


def is_conversational(example: dict[str, Any]) -> bool:
    """Whether an example holds chat messages rather than plain text.

    Args:
        example (`dict[str, Any]`): one dataset row. Only the columns `"prompt"`, `"chosen"`, `"rejected"`,
            `"completion"` and `"messages"` are looked at; the first of them (in that order) that the row has decides.

    Returns:
        `bool`: `True` when that column is a non-empty list whose first item is a `dict` with a `"role"` key
        (e.g. `{"prompt": [{"role": "user", "content": "Hi"}]}`); `False` otherwise, also when the row has none of
        those columns.

    TRL compatibility: same answers as TRL 1.16 for rows whose message columns are all of one format. Two
    differences: TRL picks the deciding column from a `set` (arbitrary order when a row mixes text and messages),
    we always take the first in the order above; and an empty list is `False` here where TRL raises `IndexError`.
    """
    key = next((key for key in MESSAGE_KEYS if key in example), None)
    return key is not None and _is_message_list(example[key])


def is_prefill(prompt: Any) -> bool:
    """Whether a prompt is a prefill: a list of messages whose last one is from `assistant` (e.g. `[{"role": "user",
    "content": "3 + 4?"}, {"role": "assistant", "content": "The answer is"}]`), which the model is to continue rather
    than answer in a new turn. Text prompts and empty lists are not prefills."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and isinstance(prompt[-1], dict)
        and prompt[-1].get("role") == "assistant"
    )


def prompt_template_flags(prompt: list[dict]) -> dict[str, bool]:
    """The `apply_chat_template` flags that render a conversational prompt for generation: a prefill (see
    [`is_prefill`]) is left open (`continue_final_message=True`, no generation prompt), any other prompt gets the
    generation prompt (a new assistant turn opened after it)."""
    prefill = is_prefill(prompt)
    return {"add_generation_prompt": not prefill, "continue_final_message": prefill}


def conversation_with_completion(prompt: list[dict], completion: list[dict]) -> list[dict]:
    """A conversational prompt and its completion as one conversation, as a reward model reads it.

    Args:
        prompt (`list[dict]`): the prompt's messages.
        completion (`list[dict]`): the completion's messages, `[{"role": "assistant", "content": text}]` as reward
            functions receive it.

    Returns:
        `list[dict]`: `prompt + completion`, except for a prefill (see [`is_prefill`]): its final assistant message
        and the completion's first message become one assistant message whose content is the prefill followed by
        the completion's text (`"The answer is"` + `" 7"`), so the prefill appears once, in the turn the model
        continued. The inputs are not modified.
    """
    if not (is_prefill(prompt) and completion):
        return prompt + completion
    merged = {**prompt[-1], "content": prompt[-1]["content"] + completion[0]["content"]}
    return [*prompt[:-1], merged, *completion[1:]]


def _render(processing_class, messages: list[dict], tools, kwargs: dict, **flags) -> str:
    """`processing_class.apply_chat_template(messages, tokenize=False, ...)` as one string."""
    return processing_class.apply_chat_template(messages, tools=tools, tokenize=False, **flags, **kwargs)


def _shared_prefix(text: str, other: str) -> str:
    """The longest common prefix of two strings."""
    length = 0
    for a, b in zip(text, other):
        if a != b:
            break
        length += 1
    return text[:length]


def apply_chat_template(
    example: dict[str, list[dict[str, str]]],
    processing_class,
    tools: list[dict | Callable] | None = None,
    **template_kwargs: Any,
) -> dict[str, str]:
    """Render a conversational example to text with the chat template of `processing_class`.

    Args:
        example (`dict[str, list[dict[str, str]]]`): one conversational row of one of TRL's dataset kinds, by its
            columns: `messages` (language modelling), `prompt` (prompt-only), `prompt` + `completion`,
            `prompt` + `chosen` + `rejected` (preference), `chosen` + `rejected` (preference with the prompt inside
            both), `prompt` + `completion` + `label` (unpaired preference). Other columns are ignored and not
            returned. An optional `"chat_template_kwargs"` column (a `dict`, or `None` for none) is passed on to the
            template.
        processing_class (`PreTrainedTokenizerBase` or `ProcessorMixin`): anything with `apply_chat_template`.
        tools (`list[dict | Callable]`, *optional*): function schemas (or functions) for templates that render tools;
            an empty list counts as `None`.
        **template_kwargs: extra variables for the template (e.g. `enable_thinking=False`).

    Returns:
        `dict[str, str]`: the same columns as text (`messages` becomes `text`; `label` is copied unchanged).
        The prompt gets the generation prompt when its last message is from `user` or `tool`, and is left open
        (`continue_final_message`) when it is from `assistant`. `completion`, `chosen` and `rejected` are what the
        template adds after the prompt: the prompt is cut to the characters it shares with each rendered
        prompt + answer, so `prompt + completion` is exactly the rendered conversation even for templates whose
        generation prompt differs from how they open an assistant turn.

    Raises:
        KeyError: if the row's columns are not one of the kinds above.
        ValueError: if the prompt's last message has another role (e.g. `system`).
        TypeError: if a key is both in `"chat_template_kwargs"` and in `template_kwargs`.

    TRL compatibility: same signature, outputs and errors as TRL 1.16's `apply_chat_template`, except that a
    `"chat_template_kwargs"` of `None` means none here (TRL raises `TypeError`).
    """
    tools = tools or None
    columns = {key for key in example if key in (*MESSAGE_KEYS, "label")}
    if frozenset(columns) not in DATASET_KINDS:
        raise KeyError(f"Invalid keys in the example: {columns}")
    kwargs = dict(example.get("chat_template_kwargs") or {})  # None (a row without it in a dataset column): none
    for key in template_kwargs:
        if key in kwargs:
            raise TypeError(f"apply_chat_template() got multiple values for keyword argument '{key}'")
    kwargs.update(template_kwargs)

    output = {}
    if "messages" in example:
        output["text"] = _render(processing_class, example["messages"], tools, kwargs)
    if "prompt" in example:
        prompt_messages = example["prompt"]
        last_role = prompt_messages[-1]["role"]
        if last_role not in ("user", "tool", "assistant"):
            raise ValueError(f"Invalid role in the last message: {last_role}")
        prompt = _render(processing_class, prompt_messages, tools, kwargs, **prompt_template_flags(prompt_messages))
        answers = {}
        for key in ("chosen", "rejected", "completion"):
            if key in example:
                answers[key] = _render(processing_class, prompt_messages + example[key], tools, kwargs)
                prompt = _shared_prefix(prompt, answers[key])
        output["prompt"] = prompt
        for key, whole in answers.items():
            output[key] = whole[len(prompt) :]
    else:
        for key in ("chosen", "rejected"):
            if key in example:
                output[key] = _render(processing_class, example[key], tools, kwargs)
    if "label" in example:
        output["label"] = example["label"]
    # TRL's key order: text, prompt, chosen, rejected, completion, label.
    order = ("text", "prompt", "chosen", "rejected", "completion", "label")
    return {key: output[key] for key in order if key in output}


def maybe_apply_chat_template(
    example: dict[str, list[dict[str, str]]],
    processing_class,
    tools: list[dict | Callable] | None = None,
    **template_kwargs: Any,
) -> dict[str, str]:
    """[`apply_chat_template`] for conversational rows (see [`is_conversational`]); other rows are returned as they
    are (the same object).

    Args and Raises: as [`apply_chat_template`].

    TRL compatibility: same as TRL 1.16's `maybe_apply_chat_template`.
    """
    if not is_conversational(example):
        return example
    return apply_chat_template(example, processing_class, tools, **template_kwargs)


def extract_prompt(example: dict[str, Sequence]) -> dict[str, Sequence]:
    """Split the prompt that `chosen` and `rejected` share off both of them.

    Args:
        example (`dict[str, Sequence]`): a row with `"chosen"` and `"rejected"`, both lists of messages or both
            strings. Other columns are dropped.

    Returns:
        `dict[str, Sequence]`: `{"prompt", "chosen", "rejected"}`, where `prompt` is the items (messages or
        characters) both share up to the first position where they differ, and `chosen` / `rejected` are the rest.
        For strings, a space just before that position goes to the answers (`"The sky is"`, `" blue."`). When one
        side is a prefix of the other (no differing position), the split is before the last item of the shorter
        one, so each answer keeps at least its final item.

    Raises:
        ValueError: if `chosen` or `rejected` is empty.

    TRL compatibility: same results as TRL 1.16's `extract_prompt`, except two corner cases where TRL has no
    meaningful answer: an empty side (TRL raises `UnboundLocalError`) and strings that differ at the first character
    while `chosen` ends with a space (TRL then cuts that trailing space off as the "prompt").
    """
    chosen, rejected = example["chosen"], example["rejected"]
    shorter = min(len(chosen), len(rejected))
    if shorter == 0:
        raise ValueError("extract_prompt needs non-empty 'chosen' and 'rejected'.")
    split = next((i for i in range(shorter) if chosen[i] != rejected[i]), None)
    if split is None:
        split = shorter - 1
    elif split > 0 and chosen[split - 1] == " ":
        split -= 1
    return {"prompt": chosen[:split], "chosen": chosen[split:], "rejected": rejected[split:]}


def maybe_extract_prompt(example: dict[str, list]) -> dict[str, list]:
    """[`extract_prompt`] for preference rows whose prompt is still inside `chosen` and `rejected`.

    Returns:
        `dict[str, list]`: the row itself when it is not a preference row (no `chosen` or `rejected`) or when it has
        a `prompt` of the same format as `chosen` (both messages or both text); otherwise `extract_prompt` of its
        `chosen` and `rejected` (a `prompt` column of the other format, e.g. a text copy of a conversational
        prompt, is replaced, and other columns are dropped).

    TRL compatibility: same as TRL 1.16's `maybe_extract_prompt`.
    """
    if "chosen" not in example or "rejected" not in example:
        return example
    if "prompt" in example:
        same_format = is_conversational({"prompt": example["prompt"]}) == is_conversational(
            {"chosen": example["chosen"]}
        )
        if same_format:
            return example
    return extract_prompt({"chosen": example["chosen"], "rejected": example["rejected"]})


def is_conversational_from_value(example: dict[str, Any]) -> bool:
    """Whether `example["conversations"]` holds ShareGPT-style messages (`{"from": ..., "value": ...}`).

    Returns:
        `bool`: `True` for a non-empty list whose first item is a `dict` with both `"from"` and `"value"`; `False`
        otherwise (including ChatML `role`/`content` messages, plain text, a missing column or an empty list).

    TRL compatibility: same as TRL 1.16's `is_conversational_from_value`, except that an empty list is `False`
    here where TRL raises `IndexError`.
    """
    return _is_message_list(example.get("conversations"), "from", "value")


def maybe_convert_to_chatml(example: dict[str, list]) -> dict[str, list]:
    """Rename ShareGPT-style message keys to ChatML ones, in place: `from` → `role`, `value` → `content`, in every
    message of the list columns `prompt`, `completion`, `chosen`, `rejected`, `messages` and `conversations`; then
    the column `conversations` becomes `messages`.

    Args:
        example (`dict[str, list]`): one row; it is modified.

    Returns:
        `dict[str, list]`: the same `dict` object. Rows already in ChatML (or plain text) come back unchanged.

    TRL compatibility: same as TRL 1.16's `maybe_convert_to_chatml` (also in place).
    """
    renames = (("from", "role"), ("value", "content"))
    for key in (*MESSAGE_KEYS, "conversations"):
        value = example.get(key)
        if not isinstance(value, list):
            continue
        for message in value:
            if isinstance(message, dict):
                for old, new in renames:
                    if old in message:
                        message[new] = message.pop(old)
    if "conversations" in example:
        example["messages"] = example.pop("conversations")
    return example
