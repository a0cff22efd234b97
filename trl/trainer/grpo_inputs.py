# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What goes into generation and into the loss, as TRL 1.16 builds it: prompt token ids, the tokens that stop a
completion, and the shuffled micro-batches of a generation batch."""

from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging


logger = logging.get_logger(__name__)


def derived_seed(*entropy: int) -> int:
    """A 63-bit seed that depends on every number in `entropy` (e.g. seed, purpose, step, process), well mixed."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0] >> 1)


def shuffle_seed(seed: int, step: int, process_index: int) -> int:
    """Seed of the micro-batch shuffle of the generation batch made at micro-step `step` on a process."""
    return derived_seed(seed, 2, step, process_index)  # 0 and 1 seed train and eval sampling


def stop_token_ids(tokenizer_eos_token_id: int | None, model_eos_token_id: int | list[int] | None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS, then each id of the model's
    `generation_config.eos_token_id` (instruct models list several, e.g. an end-of-turn token)."""
    if model_eos_token_id is None:
        ids = []
    else:
        ids = [model_eos_token_id] if isinstance(model_eos_token_id, int) else list(model_eos_token_id)
    if tokenizer_eos_token_id is not None and tokenizer_eos_token_id not in ids:
        ids = [tokenizer_eos_token_id, *ids]
    return ids


def ends_with_stop(completion_ids: torch.Tensor, completion_mask: torch.Tensor, end_ids: list[int]) -> torch.Tensor:
    """Whether each completion's last token (the last one under the mask) is one of `end_ids`.

    Args:
        completion_ids: `(N, L)` int tensor.
        completion_mask: `(N, L)` 0/1 tensor of each completion's tokens (a prefix of every row).
        end_ids: ids that count as a proper end (the stop tokens and the pad token, as in TRL).

    Returns:
        `(N,)` bool tensor; `False` for completions cut by `max_completion_length`.
    """
    last = (completion_mask.sum(dim=1) - 1).clamp(min=0).unsqueeze(1)
    return torch.isin(completion_ids.gather(1, last).squeeze(1), torch.as_tensor(end_ids, device=last.device))


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids of a batch of prompts, left-padded, exactly as TRL 1.16 tokenizes them.

    Standard (text) prompts go through `tokenizer(text)`, which adds the tokenizer's special tokens (the BOS of
    Llama-style tokenizers). Conversational prompts (lists of messages) go through `apply_chat_template` with the
    generation prompt, which adds only what the template writes (a BOS, a default system turn...). With
    `max_prompt_length`, longer prompts keep their last `max_prompt_length` tokens and a warning counts them.

    Args:
        tokenizer: the policy's tokenizer, with a pad token.
        prompts: B texts or B lists of `{"role", "content"}` messages.
        max_prompt_length: optional cut (TRL 1.16 has none).
        chat_template_kwargs: extra keyword arguments for the chat template (e.g. `{"enable_thinking": False}`).

    Returns:
        `(prompt_ids, prompt_mask, truncated)`: `(B, P)` int64 ids left-padded with the pad token, the `(B, P)`
        int64 attention mask, and a `(B,)` bool tensor of the prompts that were cut.
    """
    conversational = isinstance(prompts[0], list)
    if conversational:
        encoded = tokenizer.apply_chat_template(
            prompts, add_generation_prompt=True, tokenize=True, return_dict=True, **(chat_template_kwargs or {})
        )
    else:
        encoded = tokenizer(text=prompts)
    ids = [list(row) for row in encoded["input_ids"]]
    truncated = torch.tensor([max_prompt_length is not None and len(row) > max_prompt_length for row in ids])
    if truncated.any():
        logger.warning(
            f"max_prompt_length={max_prompt_length} cut {int(truncated.sum())} of {len(ids)} prompts in this batch "
            f"(longest: {max(len(row) for row in ids)} tokens) to their last {max_prompt_length} tokens; set "
            "max_prompt_length=None to keep prompts whole."
        )
        ids = [row[-max_prompt_length:] for row in ids]
    width = max(len(row) for row in ids)
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + row for row in ids], dtype=torch.long)
    prompt_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], dtype=torch.long)
    return prompt_ids, prompt_mask, truncated


def split_tensor_dict(batch: dict[str, Any], num_chunks: int) -> list[dict[str, Any]]:
    """Split every tensor with a batch dimension into `num_chunks` equal parts; scalars and `None` are shared."""
    chunks = [{} for _ in range(num_chunks)]
    for key, value in batch.items():
        parts = (
            value.chunk(num_chunks) if isinstance(value, torch.Tensor) and value.dim() > 0 else [value] * num_chunks
        )
        for chunk, part in zip(chunks, parts):
            chunk[key] = part
    return chunks


def shuffle_and_split(batch: dict[str, Any], num_chunks: int, seed: int) -> list[dict[str, Any]]:
    """Shuffle the rows of a generation batch (one permutation for every tensor) and cut it into micro-batches.

    As in TRL, micro-batches mix completions of different groups; this changes the gradient of per-micro-batch
    normalisations such as `loss_type="bnpo"`. The permutation is `torch.randperm` under a generator seeded with
    `seed`, so a run (and a resumed run) shuffles the same way every time.

    Args:
        batch: tensors with the same first dimension N (scalars and `None` are shared by every micro-batch).
        num_chunks: number of micro-batches; must divide N.
        seed: seed of the permutation.

    Returns:
        `num_chunks` dicts with the same keys.
    """
    rows = next(v.size(0) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    shuffled = {
        key: value[order.to(value.device)] if isinstance(value, torch.Tensor) and value.dim() > 0 else value
        for key, value in batch.items()
    }
    return split_tensor_dict(shuffled, num_chunks)
