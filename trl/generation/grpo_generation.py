# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Sampling the completions of a generation batch with transformers' `generate`, optionally prefilling each unique
prompt once and sharing its KV cache across the rows that repeat it (GRPO repeats every prompt G times); the
`GenerationConfig` that the sampling settings of a `GRPOConfig` make; and what the sampled ids are as completions."""

from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import GenerationMode
from transformers.utils import logging

from ..models.utils import fsdp2_modules, zero3_hooks_removed
from ..reference.layouts import PLAIN, ZERO3, parameter_layouts
from ..scoring.prefix_sharing import length_scaled_ropes, rope_sharing_blocker, shared_prefix_cache, split_lengths
from ..trainer.grpo_losses import completion_mask, pad_to_multiple
from .cpu_decoding import inverse_cdf_sampling, packed_linear_weights


logger = logging.get_logger(__name__)

# How `sample_completions` samples: each distinct prompt prefilled once (`GRPOConfig.shared_prefix`), or plain
# `generate` on the repeated prompts, as TRL does.
GENERATION_IMPLEMENTATIONS = ("shared_prefix", "generate")
_LOGGED_FALLBACKS: set[str] = set()  # reasons for plain `generate` already logged
# the decoding modes that run one row per prompt row, each step on the cache as it is
_SHARED_PREFIX_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


def grpo_generation_kwargs(args, tokenizer, eos_token_ids: list[int]) -> dict:
    """The sampling settings of a [`GRPOConfig`] as keyword arguments of a `GenerationConfig`, as TRL 1.16 sets them
    (its trainer's `generation_kwargs`, in its order).

    Up to `max_completion_length` new tokens are sampled at `temperature` with `top_p`, `top_k`, `min_p` and
    `repetition_penalty`; a completion stops at any of `eos_token_ids`. `args.generation_kwargs` override any of
    these (e.g. `{"num_beams": 2}`).

    Args:
        args: the trainer's config.
        tokenizer: the policy's tokenizer (its pad and BOS ids).
        eos_token_ids: the ids that end a completion (`grpo_inputs.stop_token_ids`).
    """
    settings = dict(
        max_new_tokens=args.max_completion_length,
        do_sample=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_token_ids,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        cache_implementation=args.cache_implementation,
    )
    return {**settings, **(args.generation_kwargs or {})}


def grpo_generation_config(args, tokenizer, eos_token_ids: list[int]) -> GenerationConfig:
    """[`grpo_generation_kwargs`] as a `GenerationConfig`, with `disable_compile=True` (keeps `generate` from
    compiling the model), as TRL 1.16 builds it."""
    return GenerationConfig(**grpo_generation_kwargs(args, tokenizer, eos_token_ids), disable_compile=True)


def effective_generation_config(model: PreTrainedModel, generation_config: GenerationConfig) -> GenerationConfig:
    """The settings `model.generate(generation_config=generation_config)` decodes with: transformers fills every
    field left at `None` from the model's own `generation_config` (its generation_config.json), then from the global
    defaults. This is `GenerationMixin._prepare_generation_config(generation_config)[0]`, a private transformers API
    (signature `(generation_config, **kwargs) -> (GenerationConfig, model_kwargs)` as of the required
    transformers >= 5.24), called as is: its errors are real configuration errors. It returns a copy;
    `generation_config` is not changed."""
    return model._prepare_generation_config(generation_config)[0]


def shared_prefix_blocker(
    model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generation_config: GenerationConfig
) -> str | None:
    """Why `sample_completions(..., "shared_prefix")` runs plain `generate` for this call, or `None` when it can
    hand `generate` a shared prompt cache. Decided on `effective_generation_config` (the model's own
    generation_config.json fills what `generation_config` leaves unset):
    - a decoding mode other than greedy search and sampling (beam search and its variants, assisted or
      prompt-lookup decoding, DoLa, contrastive search): they expand the batch or manage the cache themselves;
    - `num_return_sequences > 1` (`generate` expands every row) or `token_healing` (rewrites the prompt's end);
    - a `cache_implementation` (`generate` refuses a given cache next to one) or `use_cache=False`; a model without
      a `DynamicCache`;
    - DeepSpeed ZeRO-3 parameters, unless gathered with the hooks removed (`models.utils.zero3_gathered`, what
      `ds3_gather_for_generation=True` does): with the hooks, a forward before `generate` would re-partition them;
    - a RoPE whose frequencies depend on the sequence length, where the prompt pass and `generate`'s first step would
      see different ones (`prefix_sharing.rope_sharing_blocker`);
    - a PEFT adapter that prepares each forward from its inputs (aLoRA, X-LoRA: `peft_forward_setup`).
    `shared_prefix_cache` itself still returns `None` (plain `generate`) when there is nothing to share, for
    prompts that are not left-padded and for PEFT prompt learning.
    """
    if ZERO3 in parameter_layouts(model) and not zero3_hooks_removed(model):
        return "DeepSpeed ZeRO-3 parameters that are not gathered for generation"
    config = effective_generation_config(model, generation_config)
    mode = config.get_generation_mode()
    if mode not in _SHARED_PREFIX_MODES:
        return f"generation mode {mode.value}"
    if (config.num_return_sequences or 1) > 1:
        return "num_return_sequences > 1"
    if config.cache_implementation is not None:
        return f"cache_implementation={config.cache_implementation!r}"
    if config.use_cache is False:
        return "use_cache=False"
    if config.token_healing:
        return "token_healing"
    if (reason := peft_forward_setup(model)) is not None:
        return reason
    if not getattr(model, "_supports_default_dynamic_cache", lambda: False)():
        return "a model without a DynamicCache"
    if prompt_ids.size(1) > 1 and length_scaled_ropes(model):
        # the prompt pass reaches all but the last prompt token; generate's first step, the whole prompt
        return rope_sharing_blocker(model, *split_lengths(prompt_mask, prompt_ids.size(1)))
    return None


def generation_forward_model(model: nn.Module) -> nn.Module:
    """The module whose forward `model.generate` runs at every step, for a prompt pass that must compute the keys and
    values `generate`'s own prefill would (`shared_prefix_cache`).

    `torch.compile`'s wrapper (`accelerator.unwrap_model` keeps it) hands `generate` to the model it compiled, which
    decodes uncompiled. A PEFT model (`PeftModel` or `PeftMixedModel`; prompt learning never shares) decodes with its
    base model's `generate`: the transformers model with the adapters in its layers, without the PEFT model's own
    forward or what wraps it. Under mixed precision that wrapper is accelerate's autocast (`accelerator.unwrap_model`
    keeps it too), so `generate` computes a PEFT policy in its weights' dtype while a prompt pass through the PEFT
    model would run in bf16: keys and values of two dtypes in one cache. Any other model decodes with its own
    forward, wrappers included. Adapters whose PEFT forward sets up each call (aLoRA, X-LoRA) never share
    (`peft_forward_setup`).
    """
    model = getattr(model, "_orig_mod", model)
    try:
        from peft import PeftMixedModel, PeftModel
    except ImportError:
        return model
    if isinstance(model, (PeftModel, PeftMixedModel)) and not _is_prompt_learning(model):
        return model.base_model.model
    return model


def _is_prompt_learning(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False))


def peft_forward_setup(model: nn.Module) -> str | None:
    """The PEFT adapter of `model` whose forward and `generate` prepare each call from its inputs (aLoRA's
    invocation-token offsets, X-LoRA's classifier pass) as a reason to run plain `generate`, or `None`: a prompt pass
    on the base model would skip that preparation and compute another cache."""
    config = getattr(getattr(model, "_orig_mod", model), "active_peft_config", None)
    if getattr(config, "alora_invocation_tokens", None) is not None:
        return "an aLoRA adapter (alora_invocation_tokens)"
    if getattr(config, "peft_type", None) == "XLORA":  # PeftType is a str enum
        return "an X-LoRA adapter"
    return None


def sample_completions(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    generation_config: GenerationConfig,
    implementation: str = "shared_prefix",
    packed_weights: bool = False,
    inverse_cdf: bool = False,
) -> torch.Tensor:
    """Sample one completion per prompt row with `model.generate(generation_config=generation_config)`.

    Both implementations sample in eval mode (no dropout) under `torch.inference_mode()` (`torch.no_grad()` for
    sharded parameters); TRL 1.16 samples in the policy's train mode (docs: "Differences from TRL").
    `"generate"` calls `generate` on the batch as it is.
    `"shared_prefix"` first runs the model once over the distinct prompts without their last token, copies that KV
    cache to every row that repeats the prompt (on the CPU into buffers with room for every new position, which the
    decode steps write in place; the prompt pass runs the forward that `generate` decodes with,
    `generation_forward_model`), and lets `generate` continue from it: the prompt is prefilled U times
    instead of N, and everything that decides which tokens are drawn (logits processors, the random draws unless
    `inverse_cdf`, EOS handling, padding, stopping) is `generate`'s own. Completions follow the same distribution; the prefix
    keys/values come from a smaller batch, so they can differ from the unshared ones in the last float bits. It falls
    back to `"generate"` for every setting listed in `shared_prefix_blocker` (a decoding mode other than greedy or
    sampling, e.g. beam search; `num_return_sequences > 1`; a `cache_implementation`, also one set by the model's
    generation_config.json; `use_cache=False`; DeepSpeed ZeRO-3 without `ds3_gather_for_generation`; a
    length-dependent RoPE at the lengths where it matters; ...), when there is nothing to share (all prompts
    distinct, one-token prompts), when the prompts are not left-padded, and for PEFT prompt learning (prompt or prefix
    tuning adds its own tokens or cache); each reason is logged once at INFO level.

    Args:
        model: a causal LM (or a PEFT model around one); put in eval mode for the call, then restored. Runs under
            `torch.inference_mode()` (`torch.no_grad()` for ZeRO-3 or DTensor parameters and FSDP2 modules).
        prompt_ids, prompt_mask: `(N, P)` left-padded prompts and their attention mask.
        generation_config: passed to `generate` unchanged.
        implementation: one of `GENERATION_IMPLEMENTATIONS`.
        packed_weights: on the CPU, let the LM head (and from 32 new tokens on every linear layer) multiply each
            decode step with its weight packed once for the call (`cpu_decoding.packed_linear_weights`: the same
            logits to the bit, only for the layers where MKL's packed product gives the plain one's bits); not for
            sharded parameters.
        inverse_cdf: on the CPU, draw each sampled token with one uniform number per row
            (`cpu_decoding.inverse_cdf_sampling`: the same distribution, other draws than `torch.multinomial`'s);
            the block is opened only when `prompt_ids` are on the CPU, so elsewhere `torch.multinomial` is untouched.

    Returns:
        `(N, L)` int64 completion ids, `L <= max_new_tokens`; after a row's EOS, `generate` fills it with the pad id.

    Raises:
        ValueError: for an unknown `implementation`.
    """
    if implementation not in GENERATION_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {GENERATION_IMPLEMENTATIONS}, got {implementation!r}.")
    # FSDP2 modules count as sharded also while `fsdp2_gathered` holds their parameters unsharded
    sharded = parameter_layouts(model) != {PLAIN} or bool(fsdp2_modules(model))
    share = implementation == "shared_prefix"
    if share:
        blocker = shared_prefix_blocker(model, prompt_ids, prompt_mask, generation_config)
        share = blocker is None
        if blocker is not None and blocker not in _LOGGED_FALLBACKS:
            _LOGGED_FALLBACKS.add(blocker)
            logger.info(f"shared_prefix: some batches run plain generate ({blocker}).")
    was_training = model.training
    model.eval()  # dropout off, and the KV cache is used even with gradient checkpointing
    try:
        # inference mode: no autograd bookkeeping at all (~7 % less CPU time in `generate` for a small model, same
        # kernels and tokens); sharded parameters (and FSDP2 modules) keep `no_grad`, as their gather/reshard hooks
        # write tensors that must stay usable outside inference mode
        with torch.no_grad() if sharded else torch.inference_mode():
            # on the CPU the cache has room for every position `generate` adds: the last prompt token, then all but
            # the last new token (written in place, not concatenated at each step); an accelerator's allocator would
            # reserve all of it at once, also for completions that stop early
            room = (generation_config.max_new_tokens or 0) if prompt_ids.device.type == "cpu" else 0
            cache = (
                shared_prefix_cache(generation_forward_model(model), prompt_ids, prompt_mask, room=room)
                if share
                else None
            )
            kwargs = {} if cache is None else {"cache": cache}
            packed = packed_weights and not sharded
            with (
                packed_linear_weights(model, prompt_ids.size(0), generation_config.max_new_tokens)
                if packed
                else nullcontext(),
                # `torch.multinomial` replaced only where the draws it changes happen: CPU probability rows
                inverse_cdf_sampling() if inverse_cdf and prompt_ids.device.type == "cpu" else nullcontext(),
            ):
                sequences = model.generate(
                    input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config, **kwargs
                )
    finally:
        model.train(was_training)
    if not isinstance(sequences, torch.Tensor):  # `return_dict_in_generate=True`
        sequences = sequences.sequences
    return sequences[:, prompt_ids.size(1) :].clone()  # a normal tensor: training may save it for backward


def left_pad(
    rows: list[list[int]], pad_token_id: int, device=None, pad_to_multiple_of: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(N, P)` int64 ids of `rows` left-padded with `pad_token_id` to the longest row (then to a multiple of
    `pad_to_multiple_of`), and their attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_token_id] * (width - len(row)) + list(row) for row in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], dtype=torch.long)
    ids = pad_to_multiple(ids, pad_to_multiple_of, pad_token_id, side="left")
    return ids.to(device), pad_to_multiple(mask, pad_to_multiple_of, 0, side="left").to(device)


def completion_id_lists(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> list[list[int]]:
    """The N token lists of `(N, L)` sampled `completion_ids`, each cut after its first id of `eos_token_ids`
    (TRL 1.16's `completion_ids` lists)."""
    mask = completion_mask(completion_ids, eos_token_ids).bool().cpu()
    return [row[m].tolist() for row, m in zip(completion_ids.cpu(), mask)]


def decode_completion_lists(
    completion_ids: list[list[int]], tokenizer: PreTrainedTokenizerBase, conversational: bool = False
) -> list:
    """What reward functions receive: each completion decoded with special tokens skipped, as a text, or as
    `[{"role": "assistant", "content": text}]` for conversational prompts (TRL 1.16's `completions`); after a
    prefilled prompt (last message from `assistant`) the text is only what the model added to it."""
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts


class Completions(NamedTuple):
    """N completions as token lists, padded for the loss.

    Attributes:
        completion_ids: `(N, L)` int64 ids, right-padded with the pad token to the longest completion.
        full_mask: `(N, L)` int64, 1 on each completion's tokens (up to and including its first stop token).
        mask: `(N, L)` int64 loss mask: `full_mask`, zeroed on truncated completions with `mask_truncated_completions`.
        terminated: `(N,)` bool, `True` where the completion's last token is a stop (or the pad) token; `False` for
            completions cut by `max_completion_length` (and empty ones).
    """

    completion_ids: torch.Tensor
    full_mask: torch.Tensor
    mask: torch.Tensor
    terminated: torch.Tensor


def pad_completions(
    completion_ids: list[list[int]],
    pad_token_id: int,
    end_ids: list[int],
    mask_truncated_completions: bool = False,
    device=None,
    pad_to_multiple_of: int | None = None,
) -> Completions:
    """The padded ids and masks of N completion token lists, as TRL 1.16 builds them: right-padded with
    `pad_token_id` (to the longest, then to a multiple of `pad_to_multiple_of`); a completion counts as terminated when its last id is in `end_ids` (the stop tokens and the pad
    token), and `mask_truncated_completions` zeroes the loss mask of the others."""
    width = max(1, max(len(row) for row in completion_ids))
    ids = torch.tensor([list(row) + [pad_token_id] * (width - len(row)) for row in completion_ids], dtype=torch.long)
    full_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in completion_ids], dtype=torch.long)
    terminated = torch.tensor([len(row) > 0 and row[-1] in end_ids for row in completion_ids], dtype=torch.bool)
    mask = full_mask * terminated.unsqueeze(1).long() if mask_truncated_completions else full_mask
    ids, full_mask, mask = (
        pad_to_multiple(t, pad_to_multiple_of, value).to(device)
        for t, value in ((ids, pad_token_id), (full_mask, 0), (mask, 0))
    )
    return Completions(ids, full_mask, mask, terminated.to(device))
