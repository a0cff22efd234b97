# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Dataset helpers of TRL 1.16's `trl.data_utils` (STUB: being written)."""


def is_conversational(example):
    raise NotImplementedError


def apply_chat_template(example, tokenizer, tools=None, **template_kwargs):
    raise NotImplementedError


def maybe_apply_chat_template(example, tokenizer, tools=None, **template_kwargs):
    raise NotImplementedError


def extract_prompt(example):
    raise NotImplementedError


def maybe_extract_prompt(example):
    raise NotImplementedError
