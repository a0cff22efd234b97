# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Grouped-query key/value heads handed to SDPA as they are, in a scoped block (`grouped_kv_sdpa`, a patch of
transformers' `use_gqa_in_sdpa` while a block is open), and when a scoring pass may be wrapped in such a block:
never where a layer reruns its forward in the backward, outside the block (`recomputes_in_backward`)."""

from contextlib import contextmanager

import torch
from torch import nn

from ..models.scoped_patch import ScopedPatch
from .prefix_sharing import checkpointed_modules


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


def _use_gqa_in_sdpa(*args, **kwargs):
    """transformers' `use_gqa_in_sdpa` (the check that `sdpa_attention_forward` makes at every call, by its
    module-level name) while a `grouped_kv_sdpa` block is open somewhere: `True` in the block's own thread, the
    function found on entry everywhere else."""
    return GQA_SWITCH.active() or GQA_SWITCH.entry(*args, **kwargs)


def _sdpa_attention():
    from transformers.integrations import sdpa_attention

    return sdpa_attention


# transformers' own switch, answered by `_use_gqa_in_sdpa` while a `grouped_kv_sdpa` block is open (a transformers
# without the switch is left alone: the blocks change nothing)
GQA_SWITCH = ScopedPatch(_sdpa_attention, "use_gqa_in_sdpa", _use_gqa_in_sdpa)


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
    with GQA_SWITCH.block():
        yield
