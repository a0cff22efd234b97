# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The layout of each forward pass of `score_completions`, decided in one place, and one executor per layout.

`plan_scoring` decides once per call what its passes may do, `pass_layout` the layout of each pass from its rows;
both log why a pass runs plain, once per reason (INFO). Each layout is run by one function (`EXECUTORS`):

- `"plain"` (`score_plain`): every row whole, as wide as the longest completion;
- `"padded cache"` (`score_padded_on_cache`): each distinct prompt computed once, every row's completion on that
  shared KV cache;
- `"packed cache"` (`score_packed_on_cache`): the completions packed end to end in rows on that cache;
- `"inline"` (`score_inline`): packed rows that start with their prompt, one forward and no cache.

The shared layouts give the plain pass's log-probs and gradients up to float rounding."""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn
from transformers import DynamicCache
from transformers.utils import logging

from .lm_head import LogprobReader, chunked_logprobs_blocker
from .prefix_sharing import (
    PackedCompletions,
    cache_layers_blocker,
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
from .weight_grads import TiedGradSink


logger = logging.get_logger(__name__)
_LOGGED_BLOCKERS: set[tuple[str, str]] = set()  # (field, reason) of plain passes already logged


@dataclass(frozen=True)
class ScoringPlan:
    """What the passes of one `score_completions` call may do (`plan_scoring`), and what their executors read.

    `model`: the scored model. `prompt_length`: P, the prompts' padded width. `logits_to_keep`: L. `share`: a pass may
    share its prompts (on their cache, or inline). `inline_only`: in rows that start with their prompt only, the cache
    being ruled out for `cache_blocker`. `length_scaled`: a RoPE whose frequencies follow the sequence length (each
    pass checks the positions it reaches). `chunked`: log-probs from the LM head's input (`chunked_logprobs`).
    `packed`: `score_completions`' argument, `False` where `packing_blocker` names a reason. `compute_aux_loss`: the
    call returns the MoE router loss (its passes all run plain). `no_router_logits`: `{"output_router_logits":
    False}` for a MoE model whose config asks for router logits (a shared pass would pair them with the whole
    attention mask), else `{}`."""

    model: nn.Module
    prompt_length: int
    logits_to_keep: int
    share: bool
    inline_only: bool
    cache_blocker: str | None
    length_scaled: bool
    chunked: bool
    packed: bool | str
    compute_aux_loss: bool
    no_router_logits: dict


def plan_scoring(
    model: nn.Module,
    prompt_length: int,
    logits_to_keep: int,
    share_prefix: bool,
    min_prefix: int,
    packed: bool | str,
    chunked_logprobs: bool,
    compute_aux_loss: bool,
    gradients: bool = True,
) -> ScoringPlan:
    """The `ScoringPlan` of a `score_completions` call of `model` on prompts of padded width `prompt_length`; each
    reason its passes run plain for is logged once (INFO).

    With `share_prefix`, a pass runs plain instead for prompts shorter than `min_prefix` + 1, when there is nothing to
    share, with `compute_aux_loss` (the router loss covers every token of one pass), for caches other than full
    attention, for PEFT prompt learning, for ZeRO-3/FSDP2 parameters, for a pass whose two halves would see different
    RoPE frequencies (`longrope` when the prompt and the whole sequence lie on different sides of
    `original_max_position_embeddings`, `dynamic` from `max_position_embeddings` tokens on; per pass, `pass_layout`),
    and, for a pass with `gradients` (or laid out as one), for active dropout and gradient checkpointing that would
    drop the cache (see `prefix_sharing.scoring_sharing_blocker`). For ZeRO-3/FSDP2 parameters and checkpointing that
    would drop the cache, a pass with `packed` (`True` or `"inline"`) still shares in inline rows (`score_inline`),
    which need no cache and no second forward; it runs plain where those do not apply. Passes of a model that
    `prefix_sharing.packing_blocker` names a reason for run padded, and `chunked_logprobs` is off where
    `lm_head.chunked_logprobs_blocker` names one."""
    share = share_prefix and prompt_length - 1 >= min_prefix
    if share and (layers := cache_layers_blocker(model)) is not None:  # no pass can share: say so once
        share = False
        _log_blocker(layers)
    inline_only = False  # no shared cache, but one pass over packed rows that start with their prompt
    cache_blocker = None
    if share:
        cache_blocker = "the MoE router loss" if compute_aux_loss else scoring_sharing_blocker(model, False, gradients)
        if cache_blocker is not None:
            inline_blocker = _inline_blocker(model, packed, compute_aux_loss, gradients)
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
    if chunked_logprobs and (blocker := chunked_logprobs_blocker(model)) is not None:
        chunked_logprobs = False
        _log_blocker(blocker, "chunked_logprobs")
    if packed and share and (blocker := packing_blocker(model)) is not None:
        packed = False
        _log_blocker(blocker, "shared_prefix (packed rows)")
    return ScoringPlan(
        model=model,
        prompt_length=prompt_length,
        logits_to_keep=logits_to_keep,
        share=share,
        inline_only=inline_only,
        cache_blocker=cache_blocker,
        length_scaled=length_scaled,
        chunked=chunked_logprobs,
        packed=packed,
        compute_aux_loss=compute_aux_loss,
        no_router_logits=no_router_logits,
    )


class PassLayout(NamedTuple):
    """The layout of one pass (`pass_layout`): `kind`, the `EXECUTORS` key that runs it; `packed`, its packed rows
    (`"packed cache"`, `"inline"`); `cache`, the read-only shared cache of its prompts (`"padded cache"`, `"packed
    cache"`)."""

    kind: str
    packed: PackedCompletions | None = None
    cache: DynamicCache | None = None


PLAIN_PASS = PassLayout("plain")


def pass_layout(plan: ScoringPlan, reader: LogprobReader, ids: torch.Tensor, mask: torch.Tensor) -> PassLayout:
    """The layout of the pass over the rows `ids`, `mask` `(n, P + L)`, within what `plan` allows; each reason a
    pass runs plain for is logged once (INFO).

    A length-scaled RoPE is checked against the positions this pass reaches, and its packed rows then continue the
    cache (inline rows hold whole sequences, whose reach is not checked here). Where the pass shares on the cache,
    the cache is made here (the prompt pass, `prefix_sharing.shared_prefix_cache`): a model that writes nothing into
    it runs plain after all, and `reader.sink` is renewed, since that prompt pass's lookup gets no gradient."""
    model, prompt_length = plan.model, plan.prompt_length
    share_here = plan.share
    if plan.length_scaled:  # the positions the prompt pass (all but the last prompt token) and this pass reach
        prefix_reach, reach = split_lengths(mask, prompt_length)
        blocker = rope_sharing_blocker(model, prefix_reach, reach)
        if blocker is not None:
            share_here = False
            _log_blocker(blocker)
    packed = None
    shared = shared_prompts(model, ids[:, :prompt_length], mask[:, :prompt_length], True) if share_here else None
    if shared is not None and plan.packed:
        layout, width = _packing_layout(plan), text_config(model).hidden_size
        packed = pack_completions(ids, mask, prompt_length, shared[1], width, layout)
        if packed is not None and plan.length_scaled:  # packed rows leave out empty completions: the positions
            reach = int(packed.position_ids.max()) + 1  # they reach can fall on the prompt pass's other side
            if rope_sharing_blocker(model, prefix_reach, reach) is not None:
                packed = None
    if plan.inline_only and (packed is None or not packed.inline):  # no cache to fall back on: one plain pass
        if shared is not None:
            refused = (
                "prompts that are not left-padded"
                if packed is not None
                else "no completion token, or a completion mask with a gap"
            )
            _log_blocker(f"{plan.cache_blocker}; this pass's rows do not start with their prompt: {refused}")
        return PLAIN_PASS
    if shared is None:
        return PLAIN_PASS
    if packed is not None and packed.inline:
        return PassLayout("inline", packed)
    cache = shared_prefix_cache(model, ids[:, :prompt_length], mask[:, :prompt_length], True, 0, shared)
    if cache is None:
        if reader.sink is not None:  # a prompt pass whose cache is not used: its lookup gets no gradient,
            reader.sink = TiedGradSink()  # so the plain pass counts on a new sink
        return PLAIN_PASS
    return PassLayout("padded cache" if packed is None else "packed cache", packed, cache)


def _packing_layout(plan: ScoringPlan) -> str:
    """The `pack_completions` layout that a pass of `plan` asks for: `"cache"` for a length-scaled RoPE (inline rows
    hold whole sequences, whose reach a length-scaled RoPE is not checked for here), `"inline"` where the cache is
    ruled out, else `plan.packed` (`True`: `"auto"`)."""
    if plan.length_scaled:
        return "cache"
    if plan.inline_only:
        return "inline"
    return "auto" if plan.packed is True else plan.packed


class PassScores(NamedTuple):
    """What one pass scored: `logps` `(n, L)` float32; `entropies` `(n, L)` float32 or `None`; `aux_loss` the MoE
    router loss (plain passes with `compute_aux_loss`) or `None`. Values at the completion positions the attention
    mask leaves out are whatever the layout computed there (`score_completions` sets them to 0)."""

    logps: torch.Tensor
    entropies: torch.Tensor | None
    aux_loss: torch.Tensor | None


def score_plain(
    plan: ScoringPlan, reader: LogprobReader, ids: torch.Tensor, mask: torch.Tensor, layout: PassLayout
) -> PassScores:
    """Every row whole, `(n, P + L)`, as wide as the longest completion, with position ids from the attention mask:
    the logits (or the LM head's input) at the last L + 1 positions. With `compute_aux_loss` the model returns its
    router logits and its MoE load-balancing `aux_loss` (over every token of the pass: such a call runs plain
    throughout)."""
    extra = {"output_router_logits": True} if plan.compute_aux_loss else {}
    outputs = plan.model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        logits_to_keep=plan.logits_to_keep + 1,
        use_cache=False,
        **extra,
    )
    logp, entropy = reader(outputs, ids[:, -plan.logits_to_keep :])
    return PassScores(logp, entropy, outputs.aux_loss if plan.compute_aux_loss else None)


def score_padded_on_cache(
    plan: ScoringPlan, reader: LogprobReader, ids: torch.Tensor, mask: torch.Tensor, layout: PassLayout
) -> PassScores:
    """The distinct prompts of the pass's rows (all but their last token) ran once in `pass_layout`, into the
    read-only KV cache `layout.cache` (`prefix_sharing.shared_prefix_cache`); here every row's last prompt token and
    completion, `(n, 1 + L)`, run on top of it (the last prompt token predicts the first completion token).
    Gradients reach the shared prompt through the cache. The result is the plain pass's up to float rounding (the
    prompt is computed in a smaller batch) at `(P - 1)(n - U)` fewer token positions, U the number of distinct
    prompts."""
    prompt_length = plan.prompt_length
    outputs = _forward_on_cache(
        plan,
        layout.cache,
        plan.logits_to_keep + 1,
        input_ids=ids[:, prompt_length - 1 :],
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask)[:, prompt_length - 1 :],
    )
    logp, entropy = reader(outputs, ids[:, prompt_length:])
    return PassScores(logp, entropy, None)


def score_packed_on_cache(
    plan: ScoringPlan, reader: LogprobReader, ids: torch.Tensor, mask: torch.Tensor, layout: PassLayout
) -> PassScores:
    """As `score_padded_on_cache`, but the completions are laid end to end in `layout.packed`'s rows `(R, W)`
    (`prefix_sharing.pack_completions`: each completion's positions see its prompt, through the cache restricted to
    the prompt each row continues, and its own earlier positions only) instead of every row as wide as the longest
    completion: no padded position but the rows' slack, one forward over the completions all the same; the same
    log-probs and gradients up to float rounding. The M predicted tokens' values land at their places in the `(n,
    L)` result, 0 elsewhere."""
    packed = layout.packed
    outputs = _forward_on_cache(
        plan,
        prefix_for_rows(plan.model, layout.cache, packed.rows),
        0,
        input_ids=packed.input_ids,
        attention_mask=packed_attention_mask(plan.model, packed.attention_mask),
        position_ids=packed.position_ids,
    )
    values = reader(outputs, packed.targets[None], packed.source)
    return PassScores(*_unpacked_scores(values, packed, ids.size(0), plan.logits_to_keep), None)


def score_inline(
    plan: ScoringPlan, reader: LogprobReader, ids: torch.Tensor, mask: torch.Tensor, layout: PassLayout
) -> PassScores:
    """A single forward, no prompt pass and no cache: each of `layout.packed`'s rows `(R, W)` holds a prompt's
    attended tokens, then its completions end to end (`pack_completions`' inline layout: picked by its estimate,
    forced by `packed="inline"`, never for a length-scaled RoPE; also the one way to share where the cache is ruled
    out). Without `chunked_logprobs` (which reads the head's input at the predicting positions only), a transformers
    model gets a boolean `logits_to_keep`, so that its head makes logits at the positions that predict a completion
    token only, none over the rest of the prompts (`_positions_to_keep`). The M predicted tokens' values land at
    their places in the `(n, L)` result, 0 elsewhere."""
    packed = layout.packed
    keep, source = 0, packed.source  # chunked log-probs read the head's input at `source` only
    if not plan.chunked and _takes_boolean_logits_to_keep(plan.model):  # logits where a target is
        keep, source = _positions_to_keep(packed)  # predicted only, none over the rest of the prompts
    outputs = plan.model(
        input_ids=packed.input_ids,
        attention_mask=packed_attention_mask(plan.model, packed.attention_mask),
        position_ids=packed.position_ids,
        logits_to_keep=keep,
        use_cache=False,
        **plan.no_router_logits,
    )
    values = reader(outputs, packed.targets[None], source)
    return PassScores(*_unpacked_scores(values, packed, ids.size(0), plan.logits_to_keep), None)


EXECUTORS = {
    "plain": score_plain,
    "padded cache": score_padded_on_cache,
    "packed cache": score_packed_on_cache,
    "inline": score_inline,
}


def _forward_on_cache(plan: ScoringPlan, cache: DynamicCache, logits_to_keep: int, **inputs: torch.Tensor):
    """`plan.model`'s outputs for `inputs` (`input_ids`, `attention_mask`, `position_ids`) on the prompts' read-only
    shared `cache`, with `logits_to_keep`.

    Raises:
        RuntimeError: for a model that accepts the prompt cache but does not hand it to its layers (its result would
            ignore the prompt).
    """
    ignored = f"{type(plan.model).__name__} ignored the shared prompt cache; set `shared_prefix=False`."
    try:
        outputs = plan.model(**inputs, cache=cache, logits_to_keep=logits_to_keep, **plan.no_router_logits)
    except RuntimeError as error:  # the packed mask covers the cache: without it, shapes disagree
        if not prefix_was_read(cache):
            raise RuntimeError(ignored) from error
        raise
    if not prefix_was_read(cache):
        raise RuntimeError(ignored)
    return outputs


def _unpacked_scores(values, packed: PackedCompletions, rows: int, width: int) -> tuple:
    """`(log-probs, entropies or None)` `(1, M)` of a packed pass, each predicted token's value at its place in the
    `(rows, width)` result; 0 elsewhere."""
    return tuple(None if v is None else unpacked(v[0], packed.dest, rows, width) for v in values)


def unpacked(values: torch.Tensor, dest: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """The `(rows, width)` tensor with `values` `(M,)` at the flat indices `dest` `(M,)` and 0 elsewhere
    (differentiable: `index_copy`, whose backward reads the gradient at `dest`)."""
    return values.new_zeros(rows * width).index_copy(0, dest, values).view(rows, width)


def _positions_to_keep(packed: PackedCompletions) -> tuple[torch.Tensor, torch.Tensor]:
    """For inline rows `packed`: the `(rows, W)` bool `logits_to_keep` that makes the model's head compute logits only
    at the positions of `packed.source` (transformers' `slice_logits_to_keep`: the kept positions come flattened, in
    row order), and `packed.source` as indices into those `(K, V)` logits (a prompt's last position is kept once and
    read once per completion it starts)."""
    keep = torch.zeros(packed.input_ids.numel(), dtype=torch.bool, device=packed.input_ids.device)
    keep[packed.source] = True
    return keep.view_as(packed.input_ids), (keep.cumsum(0) - 1)[packed.source]


def _takes_boolean_logits_to_keep(model: nn.Module) -> bool:
    """Whether `model` (through DDP/DeepSpeed/FSDP and PEFT wrappers) is a transformers model class, whose forward
    hands a boolean `logits_to_keep` to `slice_logits_to_keep` (transformers >= 5.24), with its weights on one device
    (under a `device_map` over several the mask, on the inputs' device, would index hidden states on another). Remote
    code may read `logits_to_keep` as an int only: it gets 0 (logits at every position) instead."""
    inner = extract_model_from_parallel(model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    devices = set((getattr(inner, "hf_device_map", None) or {}).values())
    return type(inner).__module__.startswith("transformers.models.") and len(devices) <= 1


def _inline_blocker(model: nn.Module, packed: bool | str, compute_aux_loss: bool, gradients: bool) -> str | None:
    """Why `model`'s passes cannot share their prompts in rows that start with them (`pack_completions`' inline
    layout), or `None`: the one way to share where the prompt cache is ruled out."""
    if packed in (False, "cache"):
        return f"packed={packed!r}"
    if compute_aux_loss:
        return "the MoE router loss"
    if ropes := length_scaled_ropes(model):
        return f"a RoPE whose frequencies follow the sequence length ({ropes[0][0]!r})"
    return packing_blocker(model) or scoring_sharing_blocker(model, one_pass=True, gradients=gradients)


def _log_blocker(blocker: str, field: str = "shared_prefix") -> None:
    """Say once per process, at INFO level, that some passes run plain for `blocker` (`field`: the setting that cannot
    apply)."""
    if (field, blocker) not in _LOGGED_BLOCKERS:
        _LOGGED_BLOCKERS.add((field, blocker))
        logger.info(f"{field}: some log-prob passes run plain ({blocker}).")
