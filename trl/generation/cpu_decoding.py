# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Faster sampling with transformers' `generate` on the CPU: the linear layers' weights packed once per call for MKL's
small-batch products (the same logits to the bit: only where MKL's packed product gives the plain one's bits), and
one uniform draw per row to pick each token by its cumulative
probability (the same distribution as `torch.multinomial`). `grpo_generation.sample_completions` applies both."""

import functools
from contextlib import contextmanager

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn

from ..models.scoped_patch import ScopedPatch
from ..reference.layouts import PLAIN, tensor_layout


# Packing a weight costs about what this many decode steps of 16 rows save, one thread, SmolLM2-135M's shapes (the
# weights not in cache): the LM head (49,152 × 576: packed in 27 ms, 13 ms less per step) pays from 2 steps, the
# layers' projections from 10-36 steps (q/o 12, k/v 36, gate/up 10, down 15). A weight is packed when the call may
# decode this many tokens.
MIN_NEW_TOKENS_HEAD = 4
MIN_NEW_TOKENS_LAYERS = 32


def packable_linears(model: nn.Module, max_new_tokens: int | None) -> list[nn.Linear]:
    """The layers of `model` that `packed_linear_weights` packs for a `generate` call of up to `max_new_tokens` new
    tokens: its LM head from `MIN_NEW_TOKENS_HEAD` tokens on, every other layer from `MIN_NEW_TOKENS_LAYERS` on; none
    without MKL (`torch.backends.mkl`, x86 builds of PyTorch). A packed layer is exactly `nn.Linear` (no subclass:
    quantised and parametrised layers are not) with a float32, contiguous, plain (unsharded) CPU weight, and no
    forward replaced by anyone else (accelerate's offload hooks, `cast_lm_head_to_fp32`). A PEFT LoRA layer's base
    layer and its `lora_A`/`lora_B` are such layers (same outputs); the adapter's own forward runs as it is."""
    if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"):
        return []
    tokens = max_new_tokens or 0
    get_head = getattr(extract_model_from_parallel(model), "get_output_embeddings", lambda: None)
    head = get_head() if tokens >= MIN_NEW_TOKENS_HEAD else None
    candidates = list(model.modules()) if tokens >= MIN_NEW_TOKENS_LAYERS else [head]
    return [
        m
        for m in candidates
        if type(m) is nn.Linear
        and "forward" not in vars(m)
        and m.weight.dtype == torch.float32
        and m.weight.device.type == "cpu"
        and m.weight.is_contiguous()
        and tensor_layout(m.weight) == PLAIN
        and (m.bias is None or (m.bias.dtype == torch.float32 and tensor_layout(m.bias) == PLAIN))
    ]


@contextmanager
def packed_linear_weights(model: nn.Module, rows: int, max_new_tokens: int | None):
    """Inside this block, the `packable_linears(model, max_new_tokens)` multiply inputs of exactly `rows` rows (all
    leading dimensions together: one decode step of `rows` sequences) with a copy of their weight packed for MKL's
    `sgemm` once, at the start (`torch.ops.mkl._mkl_reorder_linear_weight`), instead of MKL packing the weight again
    inside every product. Any other input (another row count, such as a prefill; autocast on; not float32; with
    gradients) runs the layer's own forward. Only the layers whose shape passes `packing_is_bitwise` at `rows` rows are
    packed, so the packed outputs are the plain layer's to the bit: MKL's packed kernel rounds differently for some
    shapes (on the 2-core test machine: every 896-, 2048- and 4864-wide product of Qwen2.5-0.5B's shapes, and
    SmolLM2's 576- and 1536-wide ones below 16 rows), which would change a draw that lands at a rounding boundary.
    SmolLM2-135M's LM head at 16 rows,
    one thread: 14.6 instead of 27.6 ms a step. Costs one packed copy of those weights for the duration; the layers'
    forwards are restored when the block ends."""
    layers = [layer for layer in packable_linears(model, max_new_tokens) if packing_is_bitwise(layer, rows)]
    try:
        for layer in layers:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(layer.weight.detach(), rows)
            layer.forward = functools.partial(_packed_forward, layer, packed, rows)
        yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)


# Whether MKL's packed product gives `nn.Linear`'s bits, by (out features, in features, bias, rows, threads).
_BITWISE_PACKING: dict[tuple, bool] = {}


def packing_is_bitwise(layer: nn.Linear, rows: int) -> bool:
    """Whether MKL's packed product of `layer`'s weight at `rows` rows gives `nn.Linear`'s bits. Probed once per
    shape, bias, row count and thread count in a process (MKL picks its kernels by those, not by the values): one
    product each way on the layer's own weight and a seeded random input."""
    key = (*layer.weight.shape, layer.bias is not None, rows, torch.get_num_threads())
    if key not in _BITWISE_PACKING:
        with torch.no_grad():
            weight, bias = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
            x = torch.randn(rows, weight.size(1), generator=torch.Generator().manual_seed(0))
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
            plain = nn.functional.linear(x, weight, bias)
            _BITWISE_PACKING[key] = torch.equal(torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows), plain)
    return _BITWISE_PACKING[key]


def _packed_forward(layer: nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_autocast_enabled("cpu") or x.numel() == 0:
        return nn.Linear.forward(layer, x)
    graph = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, layer.weight, layer.bias))
    if x.numel() // x.size(-1) != rows or graph:  # the packed product has no backward
        return nn.Linear.forward(layer, x)
    return torch.ops.mkl._mkl_linear(x, packed, layer.weight, layer.bias, rows)


def inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of the `(N, V)` non-negative weights `probs`, drawn with probability `probs[i, j] /
    probs[i].sum()`: a uniform number u in [0, 1) per row picks the first j whose cumulative weight (summed in
    float64) exceeds u × the row's total, so a zero weight is never picked. Returns `(N, 1)` int64, as
    `torch.multinomial(probs, 1)` does; it uses N uniform numbers from `generator` (or the default generator)
    where `torch.multinomial` draws N × V exponential ones."""
    return _draw_from_cumulative(probs.to(torch.float64).cumsum(-1), generator)


def _draw_from_cumulative(cumulative: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    total = cumulative[:, -1:]
    uniform = torch.rand(total.shape, dtype=torch.float64, device=cumulative.device, generator=generator)
    # u × total < total: the last non-zero weight ends at `total`, and a rounded-up product must not pass it
    threshold = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, threshold, right=True)


def _multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
    """`torch.multinomial` while an `inverse_cdf_sampling` block is open somewhere: the block's own thread draws its
    one-sample calls on CPU probability rows with `inverse_cdf_draw`; every other call goes to the `torch.multinomial`
    that was installed when the outermost block opened."""
    if (
        MULTINOMIAL.active()
        and num_samples == 1
        and out is None
        and input.dim() == 2
        and input.device.type == "cpu"
        and input.dtype in (torch.float32, torch.float64)
        and input.numel() > 0
        and bool(input.min() >= 0)  # False for NaN
    ):
        cumulative = input.to(torch.float64).cumsum(-1)
        total = cumulative[:, -1]
        if bool((total > 0).all() & torch.isfinite(total).all()):  # an inf weight makes its row's total inf
            return _draw_from_cumulative(cumulative, generator)
    # anything else, including weights torch.multinomial rejects (with its own error)
    return MULTINOMIAL.entry(input, num_samples, replacement, generator=generator, out=out)


# `torch.multinomial` as `_multinomial` while an `inverse_cdf_sampling` block is open; every draw `_multinomial` does
# not make itself goes to the function installed when the outermost block opened (torch's own, or another
# library's patch)
MULTINOMIAL = ScopedPatch(lambda: torch, "multinomial", _multinomial)


@contextmanager
def inverse_cdf_sampling():
    """Inside this block (in this thread), `torch.multinomial(probs, 1)` on `(N, V)` CPU float rows, what
    transformers' `generate` calls to sample each token, draws with `inverse_cdf_draw`: the same distribution, from N
    uniform numbers instead of the N × V exponential ones of torch's CPU kernel (15 ms a step for 16 rows of
    SmolLM2's 49,152 tokens, one thread, against ~1 ms). The tokens drawn for a given seed differ from
    `torch.multinomial`'s. `torch.multinomial` is replaced while any such block is open: the outermost block records
    the function installed on entry (torch's, or another library's patch), every other thread and call gets that
    function, and the last block to close puts that same object back."""
    with MULTINOMIAL.block():
        yield
