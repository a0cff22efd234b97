# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Scoring completions with a model: per-token log-probs and entropies at the sampling temperature
(`score_completions`), the entry the trainer calls. The layout of each pass and its executors are in
`scoring_plan`; the maths on their outputs is in `grpo_losses`."""

from contextlib import nullcontext
from typing import NamedTuple

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn

from .activation_recompute import recompute_activations_applies, recomputed_activations
from .grouped_kv_attention import grouped_kv_sdpa, grouped_kv_sdpa_applies, recomputes_in_backward
from .lm_head import LogprobReader, head_input_captured, sparse_tied_embedding_grad
from .prefix_sharing import cache_kept_under_checkpointing
from .scoring_plan import EXECUTORS, pass_layout, plan_scoring
from .weight_grads import TiedGradSink


# Shared-prefix scoring adds a forward over the distinct prompts; with fewer prompt tokens than this before the last
# one, that call costs more than it saves (a 2-layer, 64-wide Qwen2 on CPU: 2-token prompts scored ~1.9x slower
# shared, 5-token prompts ~1.6x; at 64 tokens a 4-layer, 256-wide one scores 2.2x faster, at 256 4.2x).
MIN_SHARED_PREFIX_TOKENS = 16


class Scores(NamedTuple):
    """`per_token_logps` `(N, L)` float32; `entropies` `(N, L)` float32 or `None`; `aux_loss` scalar or `None`."""

    per_token_logps: torch.Tensor
    entropies: torch.Tensor | None
    aux_loss: torch.Tensor | None


def score_completions(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    entropy_grad: bool = False,
    share_prefix: bool = False,
    min_prefix_tokens: int | None = None,
    sparse_embedding_grad: bool = False,
    chunked_logprobs: bool = False,
    grouped_kv_attention: bool = False,
    recompute_elementwise_activations: bool = False,
    packed: bool | str = False,
    training_layout: bool = False,
) -> Scores:
    """Log-probs (and optionally entropies) of the last `logits_to_keep` tokens of `input_ids` under `model`, with the
    logits divided by `temperature`, so they describe the distribution the completions were sampled from.

    Position ids come from the attention mask, so left padding does not change the result. Log-probs and entropies are
    0 at the completion positions the attention mask leaves out (whichever path computed them).

    The rows run `batch_size` at a time. `scoring_plan.plan_scoring` decides once per call what the passes may do,
    `scoring_plan.pass_layout` the layout of each pass, and one executor runs it: plain (`score_plain`), or with
    `share_prefix`, each distinct prompt computed once as a read-only KV cache that the completions run on, padded
    (`score_padded_on_cache`) or packed end to end (`score_packed_on_cache`), or packed rows that start with their
    prompt (`score_inline`: one forward, no cache). The shared layouts give the plain result up to float rounding at
    `(P - 1)(N - U)` fewer token positions per pass, U the number of distinct prompts; a pass runs plain where they
    cannot apply (see `plan_scoring`; each reason is logged once at INFO level).

    Args:
        model: a causal LM (possibly wrapped).
        input_ids, attention_mask: `(N, P + L)` prompt + completion.
        logits_to_keep: L.
        temperature: the sampling temperature.
        batch_size: rows per forward pass (all at once when `None`).
        compute_entropy: also return the `(N, L)` entropies.
        compute_aux_loss: pass `output_router_logits=True` and return the mean of the model's MoE load-balancing
            `aux_loss` over the forward passes.
        entropy_grad: let the entropies carry a gradient (only an entropy bonus needs it; it costs memory).
        share_prefix: compute each distinct prompt once per forward pass (see above).
        min_prefix_tokens: share only prompts (padded width P) with at least this many tokens before their last one;
            `None` reads `MIN_SHARED_PREFIX_TOKENS` at call time. Below it the second forward costs more than the
            positions it saves.
        sparse_embedding_grad: with gradients, let a tied input embedding produce only its looked-up rows'
            gradient, added into the LM head's (see `lm_head.sparse_tied_embedding_grad`).
        chunked_logprobs: compute the log-probs and entropies from the LM head's input a block of positions at a
            time (`chunked_logprobs.head_logprobs`), so that the `(rows, L, V)` float32 logits never exist whole; a
            pass runs plain where `lm_head.chunked_logprobs_blocker` names a reason (logged once).
        grouped_kv_attention: on the CPU, let SDPA read grouped-query key/value heads without copying them per query
            head (`grouped_kv_attention.grouped_kv_sdpa`; the same log-probs, gradients to float rounding); not with
            gradients under gradient checkpointing.
        recompute_elementwise_activations: with gradients, let RMSNorms and SwiGLU MLPs keep only their inputs for the
            backward (`activation_recompute.recomputed_activations`; gradients to float rounding); not under gradient
            checkpointing.

        packed: with `share_prefix`, score the completions in rows packed end to end (`prefix_sharing.
            pack_completions`) instead of every row as wide as the longest completion (`scoring_plan.
            score_packed_on_cache`). `True` picks the layout by `pack_completions`' estimate: the rows on the prompts'
            shared cache (`"cache"`), or rows that start with their prompt (`"inline"`, `scoring_plan.score_inline`);
            `"cache"` or `"inline"` forces one (`"auto"`: as `True`). Passes of a model that
            `prefix_sharing.packing_blocker` names a reason for run padded (logged once).
        training_layout: lay the passes out as a pass with gradients would be, also without gradients (the ones that
            rule out the shared cache with gradients: active dropout, checkpointing that drops the cache). The old
            policy's log-probs use it, so that they come from the layout and arithmetic of the training pass over the
            same rows: the same bits where the weights have not changed.

    Returns:
        `Scores`.

    Raises:
        RuntimeError: with `share_prefix`, for a model that accepts the prompt cache but does not hand it to its layers
            (its result would ignore the prompt); set `shared_prefix=False` for such a model.
    """
    batch_size = batch_size or input_ids.size(0)
    logps, entropies, aux_losses = [], [], []
    min_prefix = MIN_SHARED_PREFIX_TOKENS if min_prefix_tokens is None else min_prefix_tokens
    prompt_length = input_ids.size(1) - logits_to_keep
    plan = plan_scoring(
        model,
        prompt_length,
        logits_to_keep,
        share_prefix,
        min_prefix,
        packed,
        chunked_logprobs,
        compute_aux_loss,
        gradients=training_layout or torch.is_grad_enabled(),
    )
    head = extract_model_from_parallel(model).get_output_embeddings() if plan.chunked else None
    one_forward = batch_size >= input_ids.size(0)  # one forward (a kept head block) before the backward
    reader = LogprobReader(type(model).__name__, temperature, compute_entropy, entropy_grad, head, one_forward)
    # a tied embedding's lookups add into the current pass's gradient sink, `reader.sink` (with chunked log-probs)
    tied = sparse_tied_embedding_grad(model, lambda: reader.sink) if sparse_embedding_grad else nullcontext()
    head_input = head_input_captured(model) if plan.chunked else nullcontext()
    grouped = grouped_kv_sdpa() if grouped_kv_attention and grouped_kv_sdpa_applies(model) else nullcontext()
    recompute = recompute_elementwise_activations and torch.is_grad_enabled() and not recomputes_in_backward(model)
    lean = recomputed_activations(model) if recompute and recompute_activations_applies(model) else nullcontext()
    with (
        cache_kept_under_checkpointing(model) if plan.share else nullcontext(),
        tied as embedding,
        head_input as reader.captured,
        grouped,
        lean,
    ):
        for start in range(0, input_ids.size(0), batch_size):
            # the LM head and every lookup of this pass hand autograd one summed gradient for the tied weight
            reader.sink = TiedGradSink() if embedding is not None and plan.chunked else None
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            layout = pass_layout(plan, reader, ids, mask)
            logp, entropy, aux_loss = EXECUTORS[layout.kind](plan, reader, ids, mask, layout)
            if compute_aux_loss:
                aux_losses.append(aux_loss)
            # every path reads 0 where the attention mask leaves a completion position out (a packed pass does not
            # compute them): an old and a new pass of the same row then agree there
            left_out = ~mask[:, prompt_length:].bool()
            logp = logp.masked_fill(left_out, 0.0)
            entropy = None if entropy is None else entropy.masked_fill(left_out, 0.0)
            logps.append(logp)
            if compute_entropy:
                entropies.append(entropy)
    return Scores(
        torch.cat(logps, dim=0),
        torch.cat(entropies, dim=0) if compute_entropy else None,
        torch.stack(aux_losses).mean() if compute_aux_loss else None,
    )
