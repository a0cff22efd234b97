# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Sampling the completions of a generation batch with transformers' `generate`, optionally prefilling each unique
prompt once and sharing its KV cache across the rows that repeat it (GRPO repeats every prompt G times)."""

import torch
from transformers import GenerationConfig, PreTrainedModel

from .grpo_config import GENERATION_IMPLEMENTATIONS
from .prefix_sharing import shared_prefix_cache
from .ref_sync import PLAIN, ZERO3, tensor_layout


ENTRY_POINT = "sample_completions"  # the name the trainer calls (benchmarks time it)


def sample_completions(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    generation_config: GenerationConfig,
    implementation: str = "shared_prefix",
) -> torch.Tensor:
    """Sample one completion per prompt row with `model.generate(generation_config=generation_config)`.

    `"generate"` calls `generate` on the batch as it is (what TRL 1.16 does). `"shared_prefix"` first runs the
    model once over the distinct prompts without their last token, copies that KV cache to every row that repeats the
    prompt, and lets `generate` continue from it: the prompt is prefilled U times instead of N, and everything that
    decides which tokens are drawn (logits processors, the random draws, EOS handling, padding, stopping) is
    `generate`'s own. Completions follow the same distribution; the prefix keys/values come from a smaller batch,
    so they can differ from the unshared ones in the last float bits. It falls back to `"generate"` when there is
    nothing to share (all prompts distinct, one-token prompts), when `generation_config.cache_implementation` asks
    for another cache or `use_cache=False` for none, for models without a `DynamicCache`, when the prompts are not
    left-padded, for PEFT prompt learning (prompt or prefix tuning adds its own tokens or cache), or under DeepSpeed
    ZeRO-3 (whose forward hooks would re-partition the weights gathered for generation).

    Args:
        model: a causal LM (or a PEFT model around one); put in eval mode for the call, then restored. Runs under
            `torch.inference_mode()` (`torch.no_grad()` for ZeRO-3 or DTensor parameters).
        prompt_ids, prompt_mask: `(N, P)` left-padded prompts and their attention mask.
        generation_config: passed to `generate` unchanged.
        implementation: one of `GENERATION_IMPLEMENTATIONS`.

    Returns:
        `(N, L)` int64 completion ids, `L <= max_new_tokens`; after a row's EOS, `generate` fills it with the pad id.

    Raises:
        ValueError: for an unknown `implementation`.
    """
    if implementation not in GENERATION_IMPLEMENTATIONS:
        raise ValueError(
            f"generation_implementation must be one of {GENERATION_IMPLEMENTATIONS}, got {implementation!r}."
        )
    layouts = {tensor_layout(p) for p in model.parameters()}
    zero3, sharded = ZERO3 in layouts, layouts != {PLAIN}
    # ZeRO-3: a forward before `generate` would hand the weights gathered for generation back to their partitions
    # no cache to share: `use_cache=False` (generate would re-read the whole prefix) or a model without DynamicCache
    cached = (
        generation_config.use_cache is not False and getattr(model, "_supports_default_dynamic_cache", lambda: False)()
    )
    share = implementation == "shared_prefix" and generation_config.cache_implementation is None and cached
    share = share and not zero3
    was_training = model.training
    model.eval()  # dropout off, and the KV cache is used even with gradient checkpointing
    try:
        # inference mode: no autograd bookkeeping at all (~7 % less CPU time in `generate` for a small model, same
        # kernels and tokens); sharded parameters keep `no_grad`, as their gather/reshard hooks write tensors that
        # must stay usable outside inference mode
        with torch.no_grad() if sharded else torch.inference_mode():
            cache = shared_prefix_cache(model, prompt_ids, prompt_mask) if share else None
            kwargs = {} if cache is None else {"cache": cache}
            sequences = model.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config, **kwargs
            )
    finally:
        model.train(was_training)
    return sequences[:, prompt_ids.size(1) :].clone()  # a normal tensor: training may save it for backward
