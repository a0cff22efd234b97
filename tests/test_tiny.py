# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.models.tiny: offline tiny models and tokenizer round-trip through from_pretrained."""

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl.models.tiny import EOS_TOKEN, build_tokenizer, tiny_qwen2_config
from trl.tasks import arithmetic_corpus


def test_tiny_causal_lm_reloads(tiny_lm_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    assert tokenizer.eos_token == tokenizer.pad_token == EOS_TOKEN
    assert model.config.eos_token_id == tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)
    ids = tokenizer("3+4=7", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "3+4=7"


def test_tiny_models_are_deterministic(tiny_lm_path, tmp_path):
    from trl.models.tiny import build_tiny_causal_lm

    again = build_tiny_causal_lm(str(tmp_path / "again"), corpus=arithmetic_corpus(), seed=0)
    a, b = AutoModelForCausalLM.from_pretrained(tiny_lm_path), AutoModelForCausalLM.from_pretrained(again)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name


def test_tiny_reward_model_reloads(tiny_rm_path, tiny_lm_path):
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path)
    assert rm.config.num_labels == 1
    assert (
        AutoTokenizer.from_pretrained(tiny_rm_path).get_vocab()
        == AutoTokenizer.from_pretrained(tiny_lm_path).get_vocab()
    )


def test_tiny_config_overrides():
    config = tiny_qwen2_config(build_tokenizer(), hidden_size=32, num_layers=1, num_labels=1)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (32, 64, 1)


def test_tokenizer_round_trips_the_chat_template(tiny_lm_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}], tokenize=False, add_generation_prompt=True
    )
    assert "\n" in text
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
