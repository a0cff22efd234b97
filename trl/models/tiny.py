# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Tiny, randomly initialised Qwen2 models and a home-made BPE tokenizer, saved to disk for offline tests and demos.

No model hub is needed: the tokenizer is trained with `tokenizers` on a small corpus and the models are built from
configs, then everything is written with `save_pretrained` so that callers go through the real
`from_pretrained(path)` code. `AutoTokenizer` maps a `model_type="qwen2"` folder to `Qwen2Tokenizer`, which rebuilds
its normaliser and pre-tokeniser itself, so the BPE is trained with exactly those (taken from transformers).
"""

import json
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer


EOS_TOKEN = "<|endoftext|>"  # also the pad token, as in Qwen2 base models
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT_CORPUS = [
    "What is 3 + 4? The answer is 7.",
    "Compute 12 - 5 = 7 and 2 * 9 = 18.",
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Reply with a number: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "system user assistant: think, then answer. Yes or no?",
]


def build_tokenizer(corpus: list[str] | None = None, vocab_size: int = 384) -> Qwen2Tokenizer:
    """Train a byte-level BPE on `corpus` with Qwen2's normaliser and pre-tokeniser, as a `Qwen2Tokenizer`.

    The alphabet holds all 256 byte-level symbols, so any text encodes and decodes back unchanged; merges learnt on
    the corpus fill the rest of `vocab_size`. EOS = pad = `<|endoftext|>`; the chat template is ChatML.

    Args:
        corpus: training texts; defaults to a few English and arithmetic sentences.
        vocab_size: target vocabulary size, special tokens included.
    """
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes, "\n" of the chat template too
        show_progress=False,
    )
    bpe.train_from_iterator(corpus or DEFAULT_CORPUS, trainer)
    model_state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_state["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=model_state["vocab"], merges=merges, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, unk_token=None
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


# Keyword arguments of `tiny_qwen2_config` for the shape of Qwen2.5-0.5B (494M parameters with its 151936-token
# vocabulary, tied embeddings): random weights of a real size, for GPU tests and benchmarks.
QWEN2_5_0_5B_SHAPE = dict(
    hidden_size=896,
    num_layers=24,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=2048,
)


def tiny_qwen2_config(tokenizer, hidden_size: int = 64, num_layers: int = 2, **overrides) -> Qwen2Config:
    """A Qwen2 config sized for CPU tests (`hidden_size` 64, 2 layers, 4 heads, 2 KV heads by default)."""
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def build_tiny_causal_lm(
    save_dir: str, corpus: list[str] | None = None, seed: int = 0, tokenizer_vocab_size: int = 384, **config_overrides
) -> str:
    """Save a random tiny `Qwen2ForCausalLM` and its tokenizer to `save_dir`; return the path.

    `config_overrides` go to [`tiny_qwen2_config`] (e.g. `hidden_size`, `num_layers`, or a model `vocab_size` larger
    than the tokenizer's to match a real model's parameter count).

    The tokenizer is checked to round-trip through `AutoTokenizer.from_pretrained(save_dir)` with identical ids.

    Raises:
        RuntimeError: if the reloaded tokenizer encodes the corpus differently.
    """
    corpus = corpus or DEFAULT_CORPUS
    tokenizer = build_tokenizer(corpus, tokenizer_vocab_size)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_qwen2_config(tokenizer, **config_overrides))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    os.makedirs(save_dir, exist_ok=True)
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    reloaded = AutoTokenizer.from_pretrained(save_dir)
    sample = corpus[:8] + [tokenizer.apply_chat_template([{"role": "user", "content": corpus[0]}], tokenize=False)]
    if [tokenizer(t)["input_ids"] for t in sample] != [reloaded(t)["input_ids"] for t in sample]:
        raise RuntimeError(f"The tokenizer saved in {save_dir} does not reload with the same ids.")
    return save_dir


def build_tiny_reward_model(save_dir: str, tokenizer_dir: str, seed: int = 1, **config_overrides) -> str:
    """Save a random tiny `Qwen2ForSequenceClassification` (one label) with the tokenizer of `tokenizer_dir`."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(tiny_qwen2_config(tokenizer, num_labels=1, **config_overrides))
    os.makedirs(save_dir, exist_ok=True)
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return save_dir
