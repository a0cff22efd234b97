# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Computing each distinct prompt once: GRPO repeats every prompt `num_generations` times, so the keys and values of a
prompt's tokens are the same in all of its rows. Generation prefills each distinct prompt once and lets `generate`
continue from the copied cache; scoring (reference, old-policy and training log-probs) runs the distinct prompts, then
the completions of every row on top of them, gradients included."""

import functools
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from ..reference.layouts import PLAIN, parameter_layouts


def unique_prompt_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of a left-padded prompt batch and, for every row, the index of its distinct row.

    Args:
        prompt_ids, prompt_mask: `(N, P)` integer tensors; two rows are the same prompt when both their ids and mask
            are equal.

    Returns:
        `first` `(U,)` int64: the first row of each distinct prompt, in order of first appearance; `inverse` `(N,)`
        int64: `prompt_ids[first][inverse] == prompt_ids`.
    """
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    n = inverse.numel()
    # first occurrence of each unique row, then renumber the unique rows by first appearance
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=inverse.device), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return first[order], rank[inverse]


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """`(N, T)` int64 positions numbered over the attended tokens (left padding does not shift them; padded positions
    get 0), as `generate` numbers a left-padded prompt; `mask` is the `(N, T)` attention mask."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def split_lengths(mask: torch.Tensor, prompt_length: int) -> tuple[int, int]:
    """`(prefix, total)`: the positions a prompt pass over the first `prompt_length - 1` columns of the `(N, T)`
    attention `mask` reaches, and those a single forward over all `T` columns reaches (the attended tokens of the
    longest row, i.e. `max(position_ids) + 1` as `position_ids_from_mask` and `generate` number them; only the RoPE
    check `rope_sharing_blocker` reads them)."""
    counts = mask.long().cumsum(-1)
    prefix = int(counts[:, prompt_length - 2].max()) if prompt_length > 1 else 0
    return prefix, int(counts[:, -1].max())


class _WriteOnceLayer(DynamicLayer):
    """Keeps the keys/values of the first `update` and hands later ones back unchanged: gradient checkpointing replays
    a layer's forward during the backward pass, and the replay must neither append a second copy nor see the first."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            return super().update(key_states, value_states, *args, **kwargs)
        return key_states, value_states


class _PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values are views of buffers with room for `room` more positions: `update` writes
    the new positions in place instead of concatenating (which copies the whole cache at every decode step). Once the
    room is used up, or after anything replaced the views (`crop`, `batch_select_indices`, ...), it concatenates as
    `DynamicLayer` does."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        n = keys.size(-2)
        self.buffers = [x.new_empty((*x.shape[:-2], n + room, x.size(-1))) for x in (keys, values)]
        for buffer, x in zip(self.buffers, (keys, values)):
            buffer[..., :n, :] = x
        self.keys, self.values = self.views = tuple(buffer[..., :n, :] for buffer in self.buffers)

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = self.buffers
        n, end = self.keys.size(-2), self.keys.size(-2) + key_states.size(-2)
        in_place = (
            self.keys is self.views[0]
            and self.values is self.views[1]
            and end <= keys.size(-2)
            and key_states.shape[:-2] == keys.shape[:-2]
        )
        if not in_place:
            return super().update(key_states, value_states, *args, **kwargs)
        keys[..., n:end, :] = key_states
        values[..., n:end, :] = value_states
        self.keys, self.values = self.views = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values


class _PrefixLayer(DynamicLayer):
    """A read-only prefix: `update` returns prefix + new states without storing them, so a forward (and its replay
    under gradient checkpointing) attends to the prefix and leaves the cache as it was. It holds the U distinct
    prompts' keys/values and expands them to the N rows (`inverse`) only inside `update`, one layer at a time."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, inverse: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.inverse = keys, values, inverse
        self.reads = 0  # a model that ignored the cache would leave it at 0 (see `prefix_was_read`)

    def update(self, key_states, value_states, *args, **kwargs):
        self.reads += 1
        # index_select, not `keys[inverse]`: the backward of advanced indexing adds the rows' gradients with
        # multi-threaded atomics on the CPU (index_put_ with accumulate=True from 32,768 elements on), in an order
        # that changes from run to run; index_select's backward (index_add_) sums them in a fixed order
        keys, values = self.keys.index_select(0, self.inverse), self.values.index_select(0, self.inverse)
        return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)


def inner_pass_model(model: nn.Module) -> tuple[nn.Module, object]:
    """The module that runs a pass a rank may make and another may not (the prompt pass of `shared_prefix_cache`), and
    the context to run it in.

    Under DDP and a DeepSpeed (ZeRO-0/1/2) engine: the model inside the wrapper (`extract_model_from_parallel`, which
    keeps PEFT and accelerate's mixed-precision forward, `keep_fp32_wrapper=True`), in the engine's `torch_autocast`
    context (ZeRO-3 makes no prompt pass in scoring, where it shares in `pack_completions`' inline rows only, and
    shares in generation with the weights gathered and DeepSpeed's hooks removed: `scoring_sharing_blocker`,
    `grpo_generation.shared_prefix_blocker`).
    Whether a pass shares is decided per process from its own data (prompt width, repeated prompts, RoPE lengths),
    and every forward of the wrapper takes part in collectives (DDP broadcasts its buffers, by default on each
    forward): the prompt pass must not add one on some ranks only. Its gradients still reach the parameters, through
    the cache, and DDP's or ZeRO's gradient hooks fire once per parameter and backward as without sharing. Anything
    else (a plain or PEFT model; FSDP, whose forward gathers the weights) is run as it is.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return model, nullcontext()
    engine = model
    while isinstance(engine, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        engine = engine.module
    context = nullcontext()
    if type(engine).__name__ == "DeepSpeedEngine":  # its forward runs the module under its `torch_autocast` config
        from deepspeed.runtime.torch_autocast import autocast_if_enabled

        context = autocast_if_enabled(engine)
    return extract_model_from_parallel(model, keep_fp32_wrapper=True), context


def text_config(model: nn.Module):
    """The text model's config of `model`, through DDP/DeepSpeed/PEFT wrappers."""
    config = extract_model_from_parallel(model).config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def shared_prompts(
    model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, full_attention: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`unique_prompt_rows(prompt_ids, prompt_mask)` when a batch's prompts can be computed once per distinct prompt,
    else `None`: nothing to share (no repeated prompt, P = 1), prompts that are not left-padded (a row whose last
    token is padding), PEFT prompt learning (prompt or prefix tuning adds its own tokens to every forward), and with
    `full_attention` (scoring), a model whose cache has layers other than plain full-attention ones (sliding
    windows, linear attention)."""
    if prompt_ids.size(1) < 2 or not bool(prompt_mask[:, -1].all()):
        return None
    peft_config = getattr(extract_model_from_parallel(model), "active_peft_config", None)
    if getattr(peft_config, "is_prompt_learning", False):  # PEFT prepends its own virtual tokens or cache
        return None
    if full_attention and cache_layers_blocker(model) is not None:
        return None
    first, inverse = unique_prompt_rows(prompt_ids, prompt_mask)
    return None if first.numel() == prompt_ids.size(0) else (first, inverse)


def cache_layers_blocker(model: nn.Module) -> str | None:
    """Why a read-only shared prompt cache cannot serve `model`'s scoring passes: its cache has layers other than
    plain full-attention ones (sliding windows, linear attention), named by type; `None` when all are full-attention
    layers."""
    kinds = {type(layer).__name__ for layer in DynamicCache(config=text_config(model)).layers}
    others = sorted(kinds - {DynamicLayer.__name__})
    return f"a cache with {', '.join(others)} layers (sliding windows or linear attention)" if others else None


def shared_prefix_cache(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    read_only: bool = False,
    room: int = 0,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> DynamicCache | None:
    """The KV cache of every prompt row but its last token, computed once per distinct prompt.

    Args:
        model: a causal LM (or a PEFT/DDP/DeepSpeed wrapper around one). Gradients flow into the shared keys/values
            when they are enabled (each distinct prompt then receives the summed gradient of its rows). The prompt
            pass runs on the model inside a DDP or DeepSpeed wrapper (`inner_pass_model`), so a rank that shares
            makes as many wrapped forwards (and their collectives) as one that does not.
        prompt_ids, prompt_mask: `(N, P)` left-padded prompts and their attention mask.
        read_only: `False` (generation): a `DynamicCache` that `generate` extends. `True` (scoring): a cache whose
            layers return prefix + new keys/values without storing them, so one forward over the completions attends
            to the prompt, and gradient checkpointing can replay it; `None` for models whose cache has layers other
            than plain full-attention ones (sliding windows, linear attention).
        room: generation only: the positions `generate` will add (the last prompt token and all new tokens but the
            last, i.e. `max_new_tokens`); each full-attention layer then writes them in place into buffers of that
            size instead of concatenating its whole cache at every step (the same keys and values). 0: grown by
            concatenation, as `DynamicCache` does.
        shared: what `shared_prompts(model, prompt_ids, prompt_mask, read_only)` returned for these prompts, when the
            caller already has it (not `None`); else it is computed here.

    Returns:
        A `DynamicCache` of length P - 1 for the N rows (`read_only`: it keeps the U distinct prompts and expands
        them to the N rows when a layer reads them), or `None` when sharing saves nothing (no repeated prompt, P = 1),
        the prompts are not left-padded (a row whose last token is padding), or for PEFT prompt learning (prompt or
        prefix tuning adds its own tokens to every forward).
    """
    shared = shared or shared_prompts(model, prompt_ids, prompt_mask, full_attention=read_only)
    if shared is None:
        return None
    first, inverse = shared
    cache = DynamicCache(config=text_config(model))
    if read_only:
        cache.layers = [_WriteOnceLayer() for _ in cache.layers]
    ids, mask = prompt_ids[first, :-1], prompt_mask[first, :-1]
    inner, context = inner_pass_model(model)  # DDP/DeepSpeed unwrapped: one wrapped forward per pass on every rank
    with context:
        inner(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            cache=cache,
            logits_to_keep=1,
        )
    if read_only:
        if not all(layer.is_initialized for layer in cache.layers):  # a layer did not write: the model has no use
            return None  # for this cache
        # a new cache object: a replay of the prompt pass (gradient checkpointing) still finds its write-once layers
        prefix = DynamicCache(config=text_config(model))
        prefix.layers = [_PrefixLayer(layer.keys, layer.values, inverse) for layer in cache.layers]
        return prefix
    cache.batch_select_indices(inverse)
    if room > 0:  # full-attention layers: the N rows' keys/values in buffers with `room` more positions
        cache.layers = [
            _PreallocatedLayer(x.keys, x.values, room) if type(x) is DynamicLayer and x.is_initialized else x
            for x in cache.layers
        ]
    return cache


# Packed rows are tried from the longest segment's width up to a whole prompt's segments end to end, in steps of
# 1/PACKED_WIDTH_STEPS of the longest (see `pack_completions`).
PACKED_WIDTH_STEPS = 4
# What the cache layout's prompt pass costs, in positions of the estimate, per position it runs: a second pass (its
# small matrix products, and the weights' gradients of two passes added), measured on SmolLM2-135M, one thread, 2
# prompts × 8 completions of 16-128 tokens (benchmarks/benchmark_packed_scoring.py): with 2.5 the estimate picked
# the faster layout at every length (inline at 16 and 32 tokens: 11 and 18 % less time with gradients than the cache
# layout; the cache layout at 64 and 128, where the inline rows attend over ~250 positions or repeat the prompt:
# inline took 7 and 20 % more).
PROMPT_PASS_COST_FACTOR = 2.5
# Attention models whose causal mask transformers builds with `masking_utils.create_causal_mask`, which hands a 4-D
# mask to the attention as it is, and whose positions come from `position_ids` only (RoPE): a packed pass is exact
# for them (tests/test_prefix_sharing.py checks each against the padded pass).
PACKABLE_MODEL_TYPES = ("gemma", "llama", "mistral", "olmo2", "phi3", "qwen2", "qwen3")
# The 4-D mask each attention implementation reads: bool (True: attend) or additive float (0, or the dtype's lowest).
_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}


class PackedCompletions(NamedTuple):
    """The scored positions of a batch's completions laid end to end in rows (see `pack_completions`).

    `input_ids`, `position_ids`: `(R, W)` int64. `attention_mask`: `(R, 1, W, K + W)` bool, True where a position
    attends: first the K positions of the prompts' shared cache, then the row's own (K = 0 when `inline`). `rows`:
    `(R,)` int64, a batch row whose prompt each packed row holds or continues. `source`: `(M,)` int64, the flat
    indices (into R·W) of the positions that predict the M completion tokens (inline, a prompt's last position
    predicts the first token of each of its completions, so it can appear more than once); `targets`: `(M,)` int64,
    those tokens; `dest`: `(M,)` int64, their flat indices into the `(N, L)` result. `inline`: each row starts with
    its prompt's attended tokens and the pass reads no cache; else the rows continue `shared_prefix_cache`'s
    prompts."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    source: torch.Tensor
    targets: torch.Tensor
    dest: torch.Tensor
    inline: bool = False


def _first_fit(lengths: list[int], prompts: list[int], capacity: int) -> list[list[tuple[int, int]]]:
    """Rows (indices into `lengths`; rows of negative length left out) placed in bins of `capacity` positions,
    longest first, each into the first bin of its own prompt with room: `[[(row, offset)]]` per bin."""
    bins: list[list[tuple[int, int]]] = []
    open_bins: dict[int, list[int]] = {}  # prompt -> its bins' indices
    fill: list[int] = []
    for row in sorted((i for i, n in enumerate(lengths) if n >= 0), key=lambda i: (-lengths[i], i)):
        mine = open_bins.setdefault(prompts[row], [])
        b = next((b for b in mine if fill[b] + lengths[row] <= capacity), None)
        if b is None:
            b = len(bins)
            bins.append([])
            fill.append(0)
            mine.append(b)
        bins[b].append((row, fill[b]))
        fill[b] += lengths[row]
    return bins


def _cheapest_bins(
    lengths: list[int], prompts: list[int], lead: dict[int, int], cached: int, pairs_per_position: float | None
) -> tuple[float, list[list[tuple[int, int]]], int]:
    """`(cost, bins, width)`: the `_first_fit` filling of `lengths` (negative: left out) with the lowest estimated
    cost among capacities from the longest row up to a whole prompt's rows end to end, in steps of a quarter of the
    longest (only the longest's without `pairs_per_position`). A bin of prompt p starts with `lead[p]` positions,
    and every row is as wide as the widest bin; the cost is rows × width positions, plus the attention's rows × width
    × (`cached` + width) pairs at `1 / pairs_per_position` position each."""
    longest = max(1, max(lengths))
    totals: dict[int, int] = {}  # each prompt's segments end to end: the widest row that can help
    for row, n in enumerate(lengths):
        if n >= 0:
            totals[prompts[row]] = totals.get(prompts[row], 0) + n
    distinct = len(totals)
    step = -(-longest // PACKED_WIDTH_STEPS)
    widest = max(longest, *totals.values()) if pairs_per_position else longest
    best = None
    for capacity in [*range(longest, widest, step), widest]:
        bins = _first_fit(lengths, prompts, capacity)
        width = max(lead[prompts[b[0][0]]] + sum(lengths[row] for row, _ in b) for b in bins)
        cost = len(bins) * width * (1 + ((cached + width) / pairs_per_position if pairs_per_position else 0))
        if best is None or cost < best[0]:
            best = (cost, bins, width)
        if len(bins) == distinct:  # one row per prompt: wider rows change nothing
            break
    return best


def pack_completions(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    inverse: torch.Tensor,
    pairs_per_position: float | None = None,
    layout: str = "cache",
) -> PackedCompletions | None:
    """Lay the positions that score each completion end to end in rows, completions of the same prompt sharing a row,
    under a mask that lets each position see the attended tokens of its prompt and its own completion's earlier
    positions only: one pass over them scores the whole batch with no padded position but the rows' slack, and
    nothing of one completion reaches another. Its results are the padded pass's up to float rounding (other matrix
    shapes). Two layouts:

    - `"cache"`: the prompts, all but their last token (K = `prompt_length` - 1 positions), are in a shared cache
      (`shared_prefix_cache`, a pass of its own); each completion's segment is its last prompt token, then every
      completion token but the last.
    - `"inline"`: each row starts with its prompt's attended tokens, so there is one pass and no cache; a segment is
      every completion token but the last, and the prompt's last position predicts the first token of each of its
      completions. A prompt whose completions fill more than one row is repeated in each. Only for prompts whose
      attended tokens are their last ones (left padding without holes); other batches get the cache layout.
    - `"auto"`: the layout with the lower estimated cost, the cache layout's including its prompt pass (U distinct
      prompts × K positions, weighted by `PROMPT_PASS_COST_FACTOR`).

    Within a layout the rows are filled first fit, longest segment first, at capacities from the longest segment up
    to a whole prompt's segments end to end (in steps of a quarter of the longest), and the filling with the lowest
    estimated cost is kept: rows × width positions, plus the attention's rows × width × (keys per position) pairs at
    `1 / pairs_per_position` position each (wider rows leave less slack but attend over more positions; `None`: the
    longest segment's width only, and the layouts compare positions only).

    Args:
        input_ids, attention_mask: `(N, P + L)` left-padded prompt + completion, `P = prompt_length`.
        prompt_length: P.
        inverse: `(N,)` int64, each row's distinct prompt (`unique_prompt_rows`): rows of one prompt share a row.
        pairs_per_position: how many attended (query, key) pairs cost as much as one position of the linear layers.
        layout: `"cache"`, `"inline"` or `"auto"`.

    Returns:
        `PackedCompletions`, or `None` when no row has a completion token or a row's completion mask is not its
        first tokens (an attended position after a masked one).

    Raises:
        ValueError: for another `layout`.
    """
    if layout not in ("cache", "inline", "auto"):
        raise ValueError(f"layout must be 'cache', 'inline' or 'auto', not {layout!r}.")
    completion = attention_mask[:, prompt_length:].bool()
    if bool((completion[:, 1:] & ~completion[:, :-1]).any()) or not bool(completion.any()):
        return None
    lengths, prompts = completion.sum(1).tolist(), inverse.tolist()
    cached = prompt_length - 1
    prompt_mask = attention_mask[:, :prompt_length].bool()
    prompt_tokens = prompt_mask.long().sum(1)
    columns = torch.arange(prompt_length, device=attention_mask.device)
    left_padded = bool((prompt_mask == (columns >= prompt_length - prompt_tokens[:, None])).all())
    options = []
    if layout != "inline" or not left_padded:
        cost, bins, width = _cheapest_bins(
            [n if n > 0 else -1 for n in lengths], prompts, dict.fromkeys(prompts, 0), cached, pairs_per_position
        )
        pairs = cached / pairs_per_position if pairs_per_position else 0
        prompt_pass = PROMPT_PASS_COST_FACTOR * len(set(prompts)) * cached * (1 + pairs)
        options.append((cost + prompt_pass, bins, width, False))
    if layout != "cache" and left_padded:
        lead = dict(zip(prompts, prompt_tokens.tolist()))
        # a completion of one token is scored by its prompt's last position alone: a segment of 0
        options.append((*_cheapest_bins([n - 1 for n in lengths], prompts, lead, 0, pairs_per_position), True))
    _, bins, width, inline = min(options, key=lambda option: option[0])
    n, length = completion.shape
    device = input_ids.device
    ids = input_ids.new_zeros(len(bins), width)
    positions = torch.zeros(len(bins), width, dtype=torch.long, device=device)
    # the batch row each position scores (-1: slack; -2: an inline prompt's token)
    segment = torch.full((len(bins), width), -1, dtype=torch.long, device=device)
    source, dest = [], []
    for r, segments in enumerate(bins):
        first = segments[0][0]
        tokens = int(prompt_tokens[first])
        # inline: the prompt, then tokens 0 .. count-2 from position `tokens`; cache: the last prompt token, then those
        lead, first_position = (tokens, tokens) if inline else (0, tokens - 1)
        if inline:  # the prompt's attended tokens at positions 0, 1, ...
            ids[r, :lead] = input_ids[first, prompt_length - lead : prompt_length]
            positions[r, :lead] = torch.arange(lead, device=device)
            segment[r, :lead] = -2
        for row, offset in segments:
            count, at = lengths[row], r * width + lead + offset
            start, span = (prompt_length, count - 1) if inline else (cached, count)
            ids[r, lead + offset : lead + offset + span] = input_ids[row, start : start + span]
            positions[r, lead + offset : lead + offset + span] = torch.arange(
                first_position, first_position + span, device=device
            )
            segment[r, lead + offset : lead + offset + span] = row
            if inline:  # the first token is predicted by the prompt's last position
                source.append(torch.tensor([r * width + lead - 1], device=device))
            source.append(torch.arange(at, at + span, device=device))
            dest.append(torch.arange(row * length, row * length + count, device=device))
    source, dest = torch.cat(source), torch.cat(dest)
    targets = input_ids[:, prompt_length:].reshape(-1).index_select(0, dest)
    rows = torch.tensor([segments[0][0] for segments in bins], dtype=torch.long, device=device)
    valid = segment != -1
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    own = (segment[:, :, None] == segment[:, None, :]) & causal & valid[:, :, None]
    own |= torch.eye(width, dtype=torch.bool, device=device) & ~valid[:, :, None]  # slack sees itself only
    if inline:  # a completion's positions also see all of its row's prompt (which comes first)
        mask = own | ((segment[:, :, None] >= 0) & (segment[:, None, :] == -2))
    else:
        prompt = prompt_mask[rows, :cached][:, None, :] & valid[:, :, None]
        mask = torch.cat([prompt, own], dim=2)
    return PackedCompletions(ids, positions, mask[:, None], rows, source, targets, dest, inline)


def packing_blocker(model: nn.Module) -> str | None:
    """Why a pass of `model` cannot run on `pack_completions` rows (whose mask is 4-D), or `None`: a model type not
    in `PACKABLE_MODEL_TYPES`, or an attention implementation other than SDPA and eager (flash attention and flex
    attention take no such mask)."""
    config = text_config(model)
    if getattr(config, "model_type", None) not in PACKABLE_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r}, whose handling of a 4-D mask is not tested"
    if getattr(config, "_attn_implementation", None) not in _MASK_KINDS:
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r}"
    return None


def packed_attention_mask(model: nn.Module, mask: torch.Tensor) -> torch.Tensor:
    """`PackedCompletions.attention_mask` in the form `model`'s attention implementation reads (see `_MASK_KINDS`):
    as it is for SDPA, additive in the model's dtype for eager attention."""
    if _MASK_KINDS[text_config(model)._attn_implementation] == "bool":
        return mask
    dtype = extract_model_from_parallel(model).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def prefix_for_rows(model: nn.Module, cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A read-only `shared_prefix_cache` restricted to `rows` (`(k,)` int64 indices into its N rows): the same U
    distinct prompts' keys and values (gradients still reach the one prompt pass), expanded to those rows only."""
    subset = DynamicCache(config=text_config(model))
    subset.layers = [_PrefixLayer(layer.keys, layer.values, layer.inverse[rows]) for layer in cache.layers]
    return subset


def prefix_was_read(cache: DynamicCache) -> bool:
    """Whether every layer of a read-only `shared_prefix_cache` was read since it was made: a model whose forward does
    not pass the cache to its layers computes without the prompt, and the caller must then not use that result."""
    return all(layer.reads > 0 for layer in cache.layers)


def _dropout_in_config(config) -> bool:
    """Whether a config names a dropout (or layer drop) probability above 0 (`attention_dropout`, `dropout`,
    `resid_pdrop`, `hidden_dropout_prob`, `layerdrop`, ...): models also apply them as functions, not modules."""
    return any(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        for key, value in config.to_dict().items()
        if key.endswith(("dropout", "pdrop", "dropout_prob")) or key == "layerdrop"
    )


def length_scaled_ropes(model: nn.Module) -> list[tuple[str, int]]:
    """The rotary embeddings of `model` whose frequencies depend on the length of the sequence a forward sees, as
    `(rope_type, limit)` pairs (one per layer type that has one; `[]` for every other RoPE and for models without one).

    transformers recomputes them in every forward from `max(position_ids) + 1`: `longrope` switches from its short to
    its long factors above `limit` = `original_max_position_embeddings`; `dynamic` (NTK) rescales its base above
    `limit` = `max_position_embeddings`, and keeps that state across forwards. A forward split in two (the prompt
    pass, then the rest on its cache) can then see two frequency sets where one forward sees one. The other types
    of transformers 5.x (`default`, `linear`, `yarn`, `llama3`, `proportional`) fix their frequencies at init.
    """
    config = text_config(model)
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(parameters, dict):
        return []
    # one dict, or one per layer type (e.g. {"full_attention": {...}, "sliding_attention": {...}})
    sets = [parameters] if "rope_type" in parameters or "type" in parameters else list(parameters.values())
    max_positions = getattr(config, "max_position_embeddings", None)
    found = []
    for params in sets:
        if not isinstance(params, dict):
            continue
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        if rope_type == "longrope":
            found.append((rope_type, params.get("original_max_position_embeddings") or max_positions))
        elif "dynamic" in rope_type:  # transformers' test for the dynamic kinds
            found.append((rope_type, max_positions))
    return found


def rope_sharing_blocker(model: nn.Module, prefix_length: int, length: int) -> str | None:
    """Why one forward whose positions reach `length` (`max(position_ids) + 1`) cannot be split into a pass over a
    prefix whose positions reach `prefix_length` and a pass over the rest on its cache, or `None` when the split is
    exact for the RoPE of `model` (see `length_scaled_ropes`): `longrope` when the two lengths lie on different
    sides of its limit; `dynamic` from `length >= max_position_embeddings` on (below it both passes use the
    original frequencies whatever an earlier forward grew them to; from it on each pass rescales by its own length).
    """
    for rope_type, limit in length_scaled_ropes(model):
        if rope_type == "longrope":
            exact = limit is not None and (prefix_length > limit) == (length > limit)
        else:
            exact = limit is not None and length < limit
        if not exact:
            return f"{rope_type} RoPE, whose frequencies depend on the sequence length"
    return None


def scoring_sharing_blocker(model: nn.Module, one_pass: bool = False, gradients: bool | None = None) -> str | None:
    """Why the forwards of `model` cannot use a read-only `shared_prefix_cache` right now (`gradients`: whether the
    pass has gradients or is laid out as if, `None`: `torch.is_grad_enabled()`), or `None` when they can (a
    length-scaled RoPE is decided per pass from its lengths, `rope_sharing_blocker`). With `one_pass`, only the reasons
    that also hold for one forward over rows that start with their prompt (`pack_completions`' inline layout: no cache,
    no prompt pass), i.e. dropout. Reasons:
    - DeepSpeed ZeRO-3 and FSDP2 (DTensor) parameters: each of the two forwards gathers every layer's weights,
      twice the communication of one pass; and with gradients, FSDP2 does not re-gather the weights of a layer
      whose output gets no gradient, which the prompt pass's last layer is;
    - with gradients, dropout that can act (training mode and an `nn.Dropout` with p > 0 or a dropout or layer-drop
      probability > 0 in the text config): the rows of a group would share one dropout mask over their prompt, and
      a layer dropped in one of the two passes only would break the pair;
    - with gradients, gradient checkpointing that would drop the cache: transformers drops the cache of every
      checkpointed layer unless told the layer only reads it (`GradientCheckpointingLayer.
      _can_checkpoint_with_cache`, see `cache_kept_under_checkpointing`), which is only sound with non-reentrant
      checkpointing (the reentrant kind does not send gradients to tensors it is not passed, such as the cached
      prompt keys), and needs a transformers version with that flag.
    """
    if not one_pass and parameter_layouts(model) - {PLAIN}:
        return "ZeRO-3/FSDP2 parameters"
    if not (torch.is_grad_enabled() if gradients is None else gradients):  # `None`: whether this pass has them
        return None
    if model.training and (
        any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in model.modules())
        or _dropout_in_config(text_config(model))
    ):
        return "dropout in a pass with gradients"
    checkpointed = [] if one_pass else checkpointed_modules(model)
    if not checkpointed:
        return None
    if not hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache"):
        return "gradient checkpointing in a transformers version that cannot keep a cache in checkpointed layers"
    for module in checkpointed:
        func = getattr(module, "_gradient_checkpointing_func", None)
        if not isinstance(func, functools.partial) or func.keywords.get("use_reentrant", True) is not False:
            return "reentrant gradient checkpointing"
    return None


def checkpointed_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that transformers' gradient checkpointing recomputes in the backward (in train mode)."""
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) and m.training]


@contextmanager
def cache_kept_under_checkpointing(model: nn.Module):
    """Let the checkpointed layers of `model` keep a read-only cache for the duration (see `scoring_sharing_blocker`;
    the flag is set on the layer instances and removed afterwards)."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    layers = [m for m in layers if "_can_checkpoint_with_cache" not in vars(m)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache
