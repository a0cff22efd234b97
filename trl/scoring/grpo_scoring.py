# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Scoring completions with a model: per-token log-probs and entropies at the sampling temperature, the MoE router
auxiliary loss, and the float32 LM head. The trainer calls these; the maths on their outputs is in `grpo_losses`."""

import contextvars
import threading
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn
from transformers.utils import logging

from ..reference.layouts import PLAIN, tensor_layout
from ..trainer.grpo_losses import selective_log_softmax
from .activation_recompute import recompute_activations_applies, recomputed_activations
from .chunked_logprobs import head_logprobs
from .prefix_sharing import (
    cache_kept_under_checkpointing,
    checkpointed_modules,
    length_scaled_ropes,
    pack_completions,
    packed_attention_mask,
    packing_blocker,
    position_ids_from_mask,
    prefix_for_rows,
    prefix_was_read,
    rope_sharing_blocker,
    scoring_sharing_blocker,
    shared_prefix_cache,
    shared_prompts,
    split_lengths,
    text_config,
)
from .weight_grads import TiedGradSink, tied_lookups


logger = logging.get_logger(__name__)
_LOGGED_BLOCKERS: set[tuple[str, str]] = set()  # (field, reason) of plain passes already logged
# Shared-prefix scoring adds a forward over the distinct prompts; with fewer prompt tokens than this before the last
# one, that call costs more than it saves (a 2-layer, 64-wide Qwen2 on CPU: 2-token prompts scored ~1.9x slower
# shared, 5-token prompts ~1.6x; at 64 tokens a 4-layer, 256-wide one scores 2.2x faster, at 256 4.2x).
MIN_SHARED_PREFIX_TOKENS = 16


class Scores(NamedTuple):
    """`per_token_logps` `(N, L)` float32; `entropies` `(N, L)` float32 or `None`; `aux_loss` scalar or `None`."""

    per_token_logps: torch.Tensor
    entropies: torch.Tensor | None
    aux_loss: torch.Tensor | None


# Set inside `grouped_kv_sdpa`, per context (other threads start from their own, unset, before free-threaded 3.14).
_GROUPED_KV = contextvars.ContextVar("grouped_kv_sdpa", default=False)


def grouped_kv_sdpa_applies(model: nn.Module) -> bool:
    """Whether `grouped_kv_sdpa` may wrap a pass of `model`: its parameters are on the CPU (on CUDA a masked grouped
    SDPA falls back to the math kernel) and, with gradients, no layer recomputes its forward in the backward
    (transformers' gradient checkpointing, torch's `CheckpointWrapper`), which would run outside the block and see
    differently shaped saved tensors."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return False
    return not (torch.is_grad_enabled() and recomputes_in_backward(model))


def recomputes_in_backward(model: nn.Module) -> bool:
    """Whether a layer of `model` reruns its forward in the backward, outside a block that a pass is wrapped in
    (transformers' gradient checkpointing, torch's `CheckpointWrapper`)."""
    wrapped = any(type(m).__name__ == "CheckpointWrapper" for m in model.modules())
    return wrapped or bool(checkpointed_modules(model))


# While any `grouped_kv_sdpa` block is open (all threads together): how many are, and the `use_gqa_in_sdpa` that the
# outermost one found in transformers' `integrations.sdpa_attention` on entry (None: this transformers has none, and
# the blocks change nothing), which the wrapper asks outside a block and the last block to close puts back.
_GQA_INSTALLED = {"blocks": 0, "entry": None}
_GQA_LOCK = threading.Lock()


def _use_gqa_in_sdpa(*args, **kwargs):
    """transformers' `use_gqa_in_sdpa` (the check that `sdpa_attention_forward` makes at every call, by its
    module-level name) while a `grouped_kv_sdpa` block is open somewhere: `True` in the block's own thread, the
    function found on entry everywhere else."""
    return _GROUPED_KV.get() or _GQA_INSTALLED["entry"](*args, **kwargs)


@contextmanager
def grouped_kv_sdpa():
    """Inside the block (in this thread), transformers' SDPA attention hands grouped-query key/value heads to
    `torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)` also when there is an attention mask,
    instead of first copying each key/value head once per query head it serves (`repeat_kv`): transformers' own
    switch for this (`use_gqa_in_sdpa`, which says yes without a mask on CUDA, or with `TRANSFORMERS_SDPA_FORCE_GQA=1`)
    answers yes. On the CPU's flash kernel the outputs are bitwise those of the copies and the gradients equal to
    float rounding (the kernel sums a key/value head's gradient over its query heads in its own order, the same in
    every run; tested on SmolLM2). The copies' memory, saved for the backward (`(rows, query heads, tokens, head
    dim)` twice per layer), is gone and the attention is faster: 1.8× forward and backward for SmolLM2's 9 query
    heads on 3 key/value heads, 16 rows of 60 tokens, one thread. Attention implementations other than SDPA and
    models without grouped heads are not affected. The switch is wrapped only while such a block is open: the
    outermost one records the `use_gqa_in_sdpa` installed on entry, other threads get its answers, and the last
    block to close puts that same object back."""
    from transformers.integrations import sdpa_attention

    with _GQA_LOCK:
        if not _GQA_INSTALLED["blocks"]:
            entry = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
            _GQA_INSTALLED["entry"] = entry
            if entry is not None:
                sdpa_attention.use_gqa_in_sdpa = _use_gqa_in_sdpa
        _GQA_INSTALLED["blocks"] += 1
    token = _GROUPED_KV.set(True)
    try:
        yield
    finally:
        _GROUPED_KV.reset(token)
        with _GQA_LOCK:
            _GQA_INSTALLED["blocks"] -= 1
            if not _GQA_INSTALLED["blocks"]:
                if _GQA_INSTALLED["entry"] is not None:
                    sdpa_attention.use_gqa_in_sdpa = _GQA_INSTALLED["entry"]
                _GQA_INSTALLED["entry"] = None


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
) -> Scores:
    """Log-probs (and optionally entropies) of the last `logits_to_keep` tokens of `input_ids` under `model`, with the
    logits divided by `temperature`, so they describe the distribution the completions were sampled from.

    Position ids come from the attention mask, so left padding does not change the result. Log-probs and entropies are
    0 at the completion positions the attention mask leaves out (whichever path computed them).

    With `share_prefix`, each forward pass first runs the distinct prompts of its rows (all but their last token)
    once, then every row's last prompt token and completion on top of that read-only KV cache
    (`prefix_sharing.shared_prefix_cache`); gradients reach the shared prompt through the cache. The result is the
    unshared one up to float rounding (the prompt is computed in a smaller batch) at `(P - 1)(N - U)` fewer token
    positions per pass, U the number of distinct prompts. With `packed`, a pass may instead hold each prompt at the
    start of its packed rows (one forward, no cache; see below). It runs one plain pass instead for prompts shorter than
    `min_prefix_tokens` + 1, when there is nothing to share, with `compute_aux_loss` (the router loss covers every
    token of one pass), for caches other than full attention, for PEFT prompt learning, for ZeRO-3/FSDP2 parameters, for
    a pass whose two halves would see different RoPE frequencies (`longrope` when the prompt and the whole sequence
    lie on different sides of `original_max_position_embeddings`, `dynamic` from `max_position_embeddings` tokens on),
    and, with gradients, for active dropout and gradient checkpointing that would drop the cache (see
    `prefix_sharing.scoring_sharing_blocker`; each reason is logged once at INFO level). For ZeRO-3/FSDP2 parameters
    and checkpointing that would drop the cache, a pass with `packed` (`True` or `"inline"`) still shares in inline
    rows, which need no cache and no second forward; it runs plain where those do not apply.

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
            gradient, added into the LM head's (see `sparse_tied_embedding_grad`).
        chunked_logprobs: compute the log-probs and entropies from the LM head's input a block of positions at a
            time (`chunked_logprobs.head_logprobs`), so that the `(rows, L, V)` float32 logits never exist whole; a
            pass runs plain where `chunked_logprobs_blocker` names a reason (logged once).
        grouped_kv_attention: on the CPU, let SDPA read grouped-query key/value heads without copying them per query
            head (`grouped_kv_sdpa`; the same log-probs, gradients to float rounding); not with gradients under
            gradient checkpointing.
        recompute_elementwise_activations: with gradients, let RMSNorms and SwiGLU MLPs keep only their inputs for the
            backward (`activation_recompute.recomputed_activations`; gradients to float rounding); not under gradient
            checkpointing.

        packed: with `share_prefix`, score the completions in rows packed end to end (`prefix_sharing.
            pack_completions`: each completion's positions see its prompt and its own earlier positions only) instead
            of every row as wide as the longest completion: no padded position but the rows' slack, one forward over
            the completions all the same; the same log-probs and gradients up to float rounding. `True` picks the
            layout by `pack_completions`' estimate: the rows on the prompts' shared cache (`"cache"`), or rows that
            start with their prompt (`"inline"`: a single forward, no prompt pass; never for a length-scaled RoPE,
            and without `chunked_logprobs` with logits at the positions that predict a completion token only, a
            boolean `logits_to_keep`); `"cache"` or `"inline"` forces one (`"auto"`: as `True`). Passes of a model that
            `prefix_sharing.packing_blocker` names a reason for run padded (logged once).

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
    share = share_prefix and prompt_length - 1 >= min_prefix
    inline_only = False  # no shared cache, but one pass over packed rows that start with their prompt
    if share:
        cache_blocker = "the MoE router loss" if compute_aux_loss else scoring_sharing_blocker(model)
        if cache_blocker is not None:
            inline_blocker = _inline_blocker(model, packed, compute_aux_loss)
            share = inline_only = inline_blocker is None
            if inline_blocker == cache_blocker:  # dropout, the router loss: one reason for both
                _log_blocker(cache_blocker)
            elif inline_blocker is not None:
                _log_blocker(f"{cache_blocker}; no rows that start with their prompt either: {inline_blocker}")
    # a RoPE whose frequencies follow the sequence length: decided per pass from the lengths it sees
    length_scaled = share and prompt_length > 1 and bool(length_scaled_ropes(model))
    # a MoE model whose config asks for router logits would pair them with the whole attention mask
    no_router_logits = (
        {"output_router_logits": False} if getattr(text_config(model), "output_router_logits", 0) else {}
    )
    sink = [None]  # the tied weight's gradient sink of the current pass (with chunked log-probs)
    tied = sparse_tied_embedding_grad(model, lambda: sink[0]) if sparse_embedding_grad else nullcontext()
    if chunked_logprobs and (blocker := chunked_logprobs_blocker(model)) is not None:
        chunked_logprobs = False
        _log_blocker(blocker, "chunked_logprobs")
    head_input = head_input_captured(model) if chunked_logprobs else nullcontext()
    grouped = grouped_kv_sdpa() if grouped_kv_attention and grouped_kv_sdpa_applies(model) else nullcontext()
    recompute = recompute_elementwise_activations and torch.is_grad_enabled() and not recomputes_in_backward(model)
    lean = recomputed_activations(model) if recompute and recompute_activations_applies(model) else nullcontext()
    head = extract_model_from_parallel(model).get_output_embeddings() if chunked_logprobs else None

    def scored(outputs, targets: torch.Tensor, source=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(log-probs, entropies or None)` of `targets` `(rows, W)` from a pass that kept W + 1 positions, or with
        `source` `(M,)`, of `targets` `(1, M)` predicted by those flat positions of a packed pass."""

        def kept(x: torch.Tensor) -> torch.Tensor:  # (rows, W, D) or (1, M, D): the positions that predict targets
            return x[:, :-1, :] if source is None else x.reshape(-1, x.size(-1)).index_select(0, source)[None]

        if not chunked_logprobs:
            logits = kept(outputs.logits)
            if temperature != 1.0:  # x / 1.0 == x: no (N, L, V) copy for nothing
                logits = logits / temperature
            out = selective_log_softmax(logits, targets, 2**28, compute_entropy, entropy_grad)
            return out if compute_entropy else (out, None)
        if not captured:  # the head's input at the W + 1 kept positions; the last one predicts nothing
            raise RuntimeError(
                f"{type(model).__name__} did not call its LM head in the forward pass; set `chunked_logprobs=False`."
            )
        hidden, head_dtype = captured[-1]  # the pass's last head call (a prompt pass may have made one too)
        captured.clear()
        logp, entropy = head_logprobs(
            kept(hidden),
            head.weight,
            head.bias,
            targets,
            temperature,
            compute_entropy,
            head_dtype,
            grad_sink=sink[0],
            keep_block=one_forward,
        )
        return logp, (entropy if entropy_grad else entropy.detach()) if compute_entropy else None

    one_forward = batch_size >= input_ids.size(0)  # one forward (a kept head block) before the backward
    if packed and share and (blocker := packing_blocker(model)) is not None:
        packed = False
        _log_blocker(blocker, "shared_prefix (packed rows)")
    with (
        cache_kept_under_checkpointing(model) if share else nullcontext(),
        tied as embedding,
        head_input as captured,
        grouped,
        lean,
    ):
        for start in range(0, input_ids.size(0), batch_size):
            # the LM head and every lookup of this pass hand autograd one summed gradient for the tied weight
            sink[0] = TiedGradSink() if embedding is not None and chunked_logprobs else None
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            position_ids = position_ids_from_mask(mask)
            share_here = share
            if length_scaled:  # the positions the prompt pass (all but the last prompt token) and this pass reach
                prefix_reach, reach = split_lengths(mask, prompt_length)
                blocker = rope_sharing_blocker(model, prefix_reach, reach)
                if blocker is not None:
                    share_here = False
                    _log_blocker(blocker)
            cache = plan = None
            shared = (
                shared_prompts(model, ids[:, :prompt_length], mask[:, :prompt_length], True) if share_here else None
            )
            if shared is not None and packed:
                # inline rows hold whole sequences, whose reach a length-scaled RoPE is not checked for here
                layout = (
                    "cache" if length_scaled else "inline" if inline_only else "auto" if packed is True else packed
                )
                plan = pack_completions(ids, mask, prompt_length, shared[1], text_config(model).hidden_size, layout)
                if plan is not None and length_scaled:  # packed rows leave out empty completions: the positions
                    reach = int(plan.position_ids.max()) + 1  # they reach can fall on the prompt pass's other side
                    if rope_sharing_blocker(model, prefix_reach, reach) is not None:
                        plan = None
            if inline_only and (plan is None or not plan.inline):  # no cache to fall back on: one plain pass
                if shared is not None:
                    refused = (
                        "prompts that are not left-padded"
                        if plan is not None
                        else "no completion token, or a completion mask with a gap"
                    )
                    _log_blocker(f"{cache_blocker}; this pass's rows do not start with their prompt: {refused}")
                shared = plan = None
            if shared is not None and (plan is None or not plan.inline):
                cache = shared_prefix_cache(model, ids[:, :prompt_length], mask[:, :prompt_length], True, 0, shared)
                if cache is None:
                    plan = None
                    if sink[0] is not None:  # a prompt pass whose cache is not used: its lookup gets no gradient,
                        sink[0] = TiedGradSink()  # so the plain pass counts on a new sink
            if plan is not None and plan.inline:  # one pass: each row holds its prompt, then its completions
                keep, source = 0, plan.source  # chunked log-probs read the head's input at `source` only
                if not chunked_logprobs and _takes_boolean_logits_to_keep(model):  # logits where a target is
                    keep, source = _positions_to_keep(plan)  # predicted only, none over the rest of the prompts
                outputs = model(
                    input_ids=plan.input_ids,
                    attention_mask=packed_attention_mask(model, plan.attention_mask),
                    position_ids=plan.position_ids,
                    logits_to_keep=keep,
                    use_cache=False,
                    **no_router_logits,
                )
                logp, entropy = (
                    None if v is None else unpacked(v[0], plan.dest, ids.size(0), logits_to_keep)
                    for v in scored(outputs, plan.targets[None], source)
                )
            elif cache is None:
                extra = {"output_router_logits": True} if compute_aux_loss else {}
                outputs = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=position_ids,
                    logits_to_keep=logits_to_keep + 1,
                    use_cache=False,
                    **extra,
                )
                logp, entropy = scored(outputs, ids[:, -logits_to_keep:])
                if compute_aux_loss:
                    aux_losses.append(outputs.aux_loss)
            else:  # the last prompt token (it predicts the first completion token) and the completion, on the prompt
                rows_cache = cache if plan is None else prefix_for_rows(model, cache, plan.rows)
                ignored = f"{type(model).__name__} ignored the shared prompt cache; set `shared_prefix=False`."
                try:
                    outputs = model(
                        input_ids=ids[:, prompt_length - 1 :] if plan is None else plan.input_ids,
                        attention_mask=mask if plan is None else packed_attention_mask(model, plan.attention_mask),
                        position_ids=position_ids[:, prompt_length - 1 :] if plan is None else plan.position_ids,
                        cache=rows_cache,
                        logits_to_keep=logits_to_keep + 1 if plan is None else 0,
                        **no_router_logits,
                    )
                except RuntimeError as error:  # the packed mask covers the cache: without it, shapes disagree
                    if not prefix_was_read(rows_cache):
                        raise RuntimeError(ignored) from error
                    raise
                if not prefix_was_read(rows_cache):
                    raise RuntimeError(ignored)
                if plan is None:
                    logp, entropy = scored(outputs, ids[:, prompt_length:])
                else:  # each predicted token's values at its place in the (rows, L) result; 0 elsewhere
                    logp, entropy = (
                        None if v is None else unpacked(v[0], plan.dest, ids.size(0), logits_to_keep)
                        for v in scored(outputs, plan.targets[None], plan.source)
                    )
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


def unpacked(values: torch.Tensor, dest: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """The `(rows, width)` tensor with `values` `(M,)` at the flat indices `dest` `(M,)` and 0 elsewhere
    (differentiable: `index_copy`, whose backward reads the gradient at `dest`)."""
    return values.new_zeros(rows * width).index_copy(0, dest, values).view(rows, width)


def tied_input_embedding(model: nn.Module) -> nn.Embedding | None:
    """`model`'s input embedding when its weight is also the LM head's, trains, and is a plain (unsharded) tensor:
    the case where `sparse_tied_embedding_grad` applies; else `None`."""
    model = extract_model_from_parallel(model)  # DDP and similar wrappers; a PEFT model forwards these getters
    get_input, get_output = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_input is None or get_output is None:
        return None
    embedding, head = get_input(), get_output()
    if not isinstance(embedding, nn.Embedding) or embedding.sparse or embedding.max_norm is not None:
        return None
    if embedding.scale_grad_by_freq or "forward" in vars(embedding):
        return None
    weight = embedding.weight
    if getattr(head, "weight", None) is not weight or not weight.requires_grad or tensor_layout(weight) != PLAIN:
        return None
    return embedding


@contextmanager
def sparse_tied_embedding_grad(model: nn.Module, sink_of=lambda: None):
    """Forward passes inside this block give a tied input embedding (`tied_input_embedding`) a gradient of its
    looked-up rows only; yields the embedding, or `None` (a no-op) where it does not apply.

    The input embedding's dense backward writes a `(V, H)` zero tensor with the rows of the looked-up tokens added
    in, once per forward pass, and autograd then adds each of those to the LM head's dense `(V, H)` gradient of the
    same weight: ~113 MB written and read twice per pass for SmolLM2-135M's 49,152 × 576 float32 embedding. Here the
    embedding looks up through `weight_grads.tied_lookups`: with a `TiedGradSink` from `sink_of()` (the block-wise
    LM head of `chunked_logprobs` takes part), its rows are added in place into the head's gradient before autograd
    gets the sum; without one, it returns them as a sparse tensor, which autograd adds into the head's dense
    gradient. An embedding subclass with a forward of its own (Gemma's scaled embedding) keeps that forward and gets
    `nn.Embedding`'s sparse gradient instead. Either way the weight's gradient is dense (what the optimizer and
    gradient clipping read) and equals the plain one up to the order of float additions. The forward (or the flag)
    is restored when the block ends. Nothing changes for an untied or frozen embedding, a sharded weight, an
    embedding with `max_norm` or `scale_grad_by_freq`, or without gradients.
    """
    embedding = tied_input_embedding(model) if torch.is_grad_enabled() else None
    if embedding is None:
        yield None
        return
    if type(embedding).forward is not nn.Embedding.forward:  # a subclass with its own forward (Gemma's scaled
        embedding.sparse = True  # embedding): nn.Embedding's sparse gradient, inside the subclass's forward
        try:
            yield embedding
        finally:
            embedding.sparse = False
        return
    with tied_lookups(embedding, sink_of):
        yield embedding


def _positions_to_keep(plan) -> tuple[torch.Tensor, torch.Tensor]:
    """For an inline `plan`: the `(rows, W)` bool `logits_to_keep` that makes the model's head compute logits only at
    the positions of `plan.source` (transformers' `slice_logits_to_keep`: the kept positions come flattened, in row
    order), and `plan.source` as indices into those `(K, V)` logits (a prompt's last position is kept once and read
    once per completion it starts)."""
    keep = torch.zeros(plan.input_ids.numel(), dtype=torch.bool, device=plan.input_ids.device)
    keep[plan.source] = True
    return keep.view_as(plan.input_ids), (keep.cumsum(0) - 1)[plan.source]


def _takes_boolean_logits_to_keep(model: nn.Module) -> bool:
    """Whether `model` (through DDP/DeepSpeed/FSDP and PEFT wrappers) is a transformers model class, whose forward
    hands a boolean `logits_to_keep` to `slice_logits_to_keep` (transformers >= 5.24), with its weights on one device
    (under a `device_map` over several the mask, on the inputs' device, would index hidden states on another). Remote
    code may read `logits_to_keep` as an int only: it gets 0 (logits at every position) instead."""
    inner = extract_model_from_parallel(model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    devices = set((getattr(inner, "hf_device_map", None) or {}).values())
    return type(inner).__module__.startswith("transformers.models.") and len(devices) <= 1


def _inline_blocker(model: nn.Module, packed: bool | str, compute_aux_loss: bool) -> str | None:
    """Why `model`'s passes cannot share their prompts in rows that start with them (`pack_completions`' inline
    layout), or `None`: the one way to share where the prompt cache is ruled out."""
    if packed in (False, "cache"):
        return f"packed={packed!r}"
    if compute_aux_loss:
        return "the MoE router loss"
    if ropes := length_scaled_ropes(model):
        return f"a RoPE whose frequencies follow the sequence length ({ropes[0][0]!r})"
    return packing_blocker(model) or scoring_sharing_blocker(model, one_pass=True)


def _log_blocker(blocker: str, field: str = "shared_prefix") -> None:
    if (field, blocker) not in _LOGGED_BLOCKERS:
        _LOGGED_BLOCKERS.add((field, blocker))
        logger.info(f"{field}: some log-prob passes run plain ({blocker}).")


# Text-config fields of models whose causal-LM forward changes the LM head's output before returning it (softcapping:
# Gemma 2/3, RecurrentGemma, xLSTM; a scale: Cohere, Falcon-H1, Granite, MiniCPM3, HyperCLOVA X; a vocabulary cut to
# `unpadded_vocab_size`), and model types that mask some logits (Chameleon's image tokens): `chunked_logprobs` runs
# plain for them.
_LOGIT_TRANSFORM_FIELDS = (
    "final_logit_softcapping",
    "logits_soft_cap",
    "output_logit_soft_cap",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
    "unpadded_vocab_size",
)
_LOGIT_MASKING_MODEL_TYPES = ("chameleon",)


def chunked_logprobs_blocker(model: nn.Module) -> str | None:
    """Why `score_completions(..., chunked_logprobs=True)` computes `model`'s log-probs from its logits after all, or
    `None`: an LM head that is not a plain `nn.Linear` (a subclass with its own forward such as a quantised layer, a
    PEFT adapter on it, an accelerate offload hook, a forward replaced by anyone but `cast_lm_head_to_fp32`), a
    sharded head weight (ZeRO-3, FSDP2), an FSDP1 or static-graph DDP wrapper (their backward hooks hang on the
    model's outputs, which the loss does not read on this path), or a model that transforms the logits after the
    head (`_LOGIT_TRANSFORM_FIELDS` set to anything but `None` or 1, `_LOGIT_MASKING_MODEL_TYPES`)."""
    if type(model).__name__ == "FullyShardedDataParallel" or getattr(model, "static_graph", False):
        static = " with static_graph=True" if getattr(model, "static_graph", False) else ""
        return f"a {type(model).__name__} wrapper{static}"
    unwrapped = extract_model_from_parallel(model)
    head = unwrapped.get_output_embeddings() if hasattr(unwrapped, "get_output_embeddings") else None
    own_forward = head is not None and "forward" in vars(head) and not getattr(head, "float32_head", False)
    if not isinstance(head, nn.Linear) or hasattr(head, "base_layer"):  # PEFT tuner layers are not nn.Linear
        return f"an LM head of type {type(head).__name__}"
    if type(head).forward is not nn.Linear.forward or own_forward or hasattr(head, "_hf_hook"):
        return f"an LM head of type {type(head).__name__} with a forward of its own"
    if tensor_layout(head.weight) != PLAIN:
        return "a sharded LM head weight"
    config = text_config(unwrapped)
    if getattr(config, "model_type", None) in _LOGIT_MASKING_MODEL_TYPES:
        return f"model type {config.model_type!r} (it masks logits after the head)"
    for name in _LOGIT_TRANSFORM_FIELDS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"{name}={getattr(config, name)!r} in the model config"
    return None


@contextmanager
def head_input_captured(model: nn.Module):
    """Inside this block `model`'s LM head records its input and the dtype its product would have run in (autocast's
    when autocast is on around the head, as inside an accelerate-prepared forward; float32 for a head kept in float32
    by `cast_lm_head_to_fp32`; else the weight's), as `((rows, kept positions, H), dtype)` appended to the yielded
    list, and returns a `(rows, 0, V)` tensor instead of logits: no logits are computed, and the weight stays in the
    forward's graph (DDP's unused-parameter search still finds it). Its forward is restored when the block ends."""
    head = extract_model_from_parallel(model).get_output_embeddings()
    captured = []
    own_forward = head.__dict__.get("forward")  # an instance forward (`cast_lm_head_to_fp32`'s), put back after

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        device_type = hidden_states.device.type
        if getattr(head, "float32_head", False):
            dtype = torch.float32
        elif torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        else:
            dtype = head.weight.dtype
        captured.append((hidden_states, dtype))
        return hidden_states[..., :0, :1] * head.weight[:, 0]  # (rows, 0, V), nothing cast or multiplied

    head.forward = forward
    try:
        yield captured
    finally:
        if own_forward is None:
            del head.forward
        else:
            head.forward = own_forward


def router_aux_loss_settings(model: nn.Module, router_aux_loss_coef: float | None) -> tuple[float, bool]:
    """The MoE load-balancing loss weight and whether to add it, as `GRPOConfig.router_aux_loss_coef` says.

    `None` takes the model config's own `router_aux_loss_coef` (0 when it has none). The loss is added when the
    model can return router logits (its config has `output_router_logits`) and the weight is not 0.

    Returns:
        `(coefficient, enabled)`.

    Raises:
        ValueError: if a non-zero coefficient is given for a model without router logits.
    """
    config = model.config.get_text_config()
    can_route = hasattr(config, "output_router_logits")
    coef = getattr(config, "router_aux_loss_coef", 0.0) if router_aux_loss_coef is None else router_aux_loss_coef
    if router_aux_loss_coef and not can_route:
        raise ValueError(
            f"router_aux_loss_coef={router_aux_loss_coef}, but {type(model).__name__} is not a Mixture-of-Experts "
            "model: it returns no router logits, so there is no load-balancing loss to weight; leave "
            "router_aux_loss_coef=None (or 0.0)."
        )
    return coef, can_route and coef != 0.0


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """Keep the LM head's weights in float32 and compute the logits in float32 (ScaleRL, arXiv 2510.13786), in place.

    The hidden states are cast to float32 before the projection, with autocast off, so mixed precision does not
    round the logits back. With tied embeddings the shared weight becomes float32 too, and the embedding output is
    cast back to the model's dtype so the rest of the network is unchanged.

    Raises:
        ValueError: if the LM head carries a PEFT adapter.
    """
    head = model.get_output_embeddings()
    if hasattr(head, "base_layer"):  # a PEFT tuner layer
        raise ValueError(
            "Applying a PEFT adapter to `lm_head` is not supported with cast_lm_head_to_fp32=True: remove 'lm_head' "
            "from the adapter's target_modules, or set cast_lm_head_to_fp32=False."
        )
    dtype = head.weight.dtype
    head.float()

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden_states.device.type, enabled=False):
            return nn.functional.linear(hidden_states.float(), head.weight, head.bias)

    head.forward = forward
    head.float32_head = True  # what `chunked_logprobs.head_logprobs` must compute the same way
    embedding = model.get_input_embeddings()
    if embedding.weight is head.weight and dtype != torch.float32:
        embedding.register_forward_hook(lambda module, args, output: output.to(dtype))


def gather_valid_entropies(accelerator, values: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's 1-D tensor of (non-negative) entropies; their lengths may differ.

    Each is padded to the longest with −1 before the gather, and the pads are dropped after it.
    """
    gathered = accelerator.gather(accelerator.pad_across_processes(values, dim=0, pad_index=-1.0))
    return gathered[gathered >= 0]
