# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Per-token log-probs and entropies straight from the LM head's input, a block of positions at a time, so that the
`(positions × vocabulary)` float32 logits, their softmax and their gradient never exist whole, forward or backward.
Pure tensors in and out; `scoring_plan` decides when a forward pass uses it, and `lm_head.LogprobReader` calls it."""

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F


# Positions per block: the float32 logits of one block take at most this many bytes. On the CPU 64 MiB (341 positions
# of a 49,152-token vocabulary), where more does not pay; on accelerators 512 MiB (~880 positions of a 152k
# vocabulary), so that a pass is a few large products rather than hundreds of small ones. A handful of such blocks is
# all the log-prob maths ever holds at once.
DEFAULT_BLOCK_BYTES = 2**26
ACCELERATOR_BLOCK_BYTES = 2**29


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    head_dtype: torch.dtype | None = None,
    block_bytes: int | None = None,
    grad_sink=None,
    keep_block: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z)[index] and the entropy of softmax(z), for z = (hidden · weightᵀ + bias) / temperature, computed
    in blocks of positions; the backward recomputes each block's logits instead of storing them (all but a single
    block, which is kept when `keep_block`).

    The logits are what the LM head computes: the product in `head_dtype` (what the head's forward used: autocast's
    dtype when autocast was on around it, float32 for a head kept in float32 by `lm_head.cast_lm_head_to_fp32`,
    else the weight's dtype), then cast to float32 and divided by the temperature, as
    `grpo_losses.selective_log_softmax` does. The results and gradients equal that path's up to float rounding (the
    blocks' products may round differently, and the weight's gradient is summed over blocks in float32); the memory
    is O(block) instead of O(positions × vocabulary), plus a float32 `(V, H)` gradient accumulator for a weight
    stored in a lower precision, at the cost of a second LM-head product in the backward when there is more than one
    block.

    Args:
        hidden: `(..., H)` the LM head's input (any float dtype).
        weight: `(V, H)` the LM head's weight; `bias`: `(V,)` or `None`.
        index: `(...)` int64 token ids whose log-probs are returned (the shape of `hidden` without `H`).
        temperature: the sampling temperature (the logits are divided by it).
        compute_entropy: also return the entropies −Σ p log p (nats); they carry a gradient when the caller needs one.
        head_dtype: the dtype of the head's product; `None`: the weight's.
        block_bytes: the most bytes one block's float32 logits may take; `None`: `DEFAULT_BLOCK_BYTES` on the CPU,
            `ACCELERATOR_BLOCK_BYTES` elsewhere.
        grad_sink: a `weight_grads.TiedGradSink` that also collects the tied input embedding's gradient: the
            weight's gradient goes through it (summed with the embedding's rows before autograd sees it).
        keep_block: when all positions fit in one block and a backward will follow, keep that block's `(M, V)`
            float32 log-probs from the forward to the backward instead of recomputing them (one LM-head product
            less; `False` for callers that run several forwards before one backward, which would hold one block
            each).

    Returns:
        `(logps, entropies)`: float32 tensors of `index`'s shape; `entropies` is `None` without `compute_entropy`.

    Raises:
        ValueError: if `hidden` is not `index`'s shape plus the weight's hidden size.
    """
    if tuple(hidden.shape) != (*index.shape, weight.size(1)):
        raise ValueError(
            f"hidden states of shape {tuple(hidden.shape)} do not match token ids of shape {tuple(index.shape)} and "
            f"an LM head weight of shape {tuple(weight.shape)}: expected {(*index.shape, weight.size(1))}."
        )
    if block_bytes is None:
        block_bytes = DEFAULT_BLOCK_BYTES if hidden.device.type == "cpu" else ACCELERATOR_BLOCK_BYTES
    rows = max(1, block_bytes // max(1, 4 * weight.size(0)))
    logps, entropies = _HeadLogProbs.apply(
        hidden.reshape(-1, hidden.size(-1)),
        weight,
        bias,
        index.reshape(-1),
        temperature,
        compute_entropy,
        head_dtype or weight.dtype,
        rows,
        grad_sink if torch.is_grad_enabled() else None,  # no graph, no backward to wait for
        keep_block,
    )
    return logps.view(index.shape), (entropies.view(index.shape) if compute_entropy else None)


def _block_logits(hidden, weight, bias, temperature) -> torch.Tensor:
    """`(rows, V)` float32 logits of one block; `weight` and `bias` already in the head's dtype."""
    with torch.autocast(hidden.device.type, enabled=False):  # the dtype is chosen here, not by an outer autocast
        logits = F.linear(hidden.to(weight.dtype), weight, bias).float()
    return logits / temperature if temperature != 1.0 else logits


class _HeadLogProbs(torch.autograd.Function):
    """`head_logprobs` on flattened positions: `(M, H)` hidden states and `(M,)` ids in, `(M,)` float32 log-probs and
    `(M,)` (or `(0,)`) float32 entropies out. Saves the inputs and the `(M,)` log-sum-exp, and the `(M, V)` log-probs
    only when they fit in one block."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, temperature, compute_entropy, head_dtype, rows, sink, keep_block):
        ctx.set_materialize_grads(False)  # an output the loss does not use gets no gradient work
        ctx.sink = sink if ctx.needs_input_grad[1] else None  # the weight's gradient goes through the sink
        if ctx.sink is not None:
            sink.register(weight)
        n = hidden.size(0)
        head_weight = weight.to(head_dtype)  # once for all blocks (a no-op in the weight's own dtype)
        head_bias = None if bias is None else bias.to(head_dtype)
        logps = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropies = torch.empty(n if compute_entropy else 0, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        log_probs = None
        for start in range(0, n, rows):
            block = slice(start, start + rows)
            log_probs = _block_logits(hidden[block], head_weight, head_bias, temperature)  # a fresh (rows, V) tensor
            lse[block] = torch.logsumexp(log_probs, dim=-1)
            logps[block] = log_probs.gather(-1, index[block].unsqueeze(-1)).squeeze(-1) - lse[block]
            log_probs.sub_(lse[block].unsqueeze(-1))  # the logits become log p in place
            if compute_entropy:  # H = −Σ p log p, as the plain path sums it
                entropies[block] = -(log_probs.exp().mul_(log_probs)).sum(-1)
        # A single block is kept for the backward, which then need not recompute it: the backward frees it first
        # thing, well before its own peak (the weights' gradients at its end).
        ctx.kept = log_probs if keep_block and n <= rows and any(ctx.needs_input_grad[:3]) else None
        del log_probs
        ctx.save_for_backward(hidden, weight, bias, index, lse, entropies)
        ctx.settings = (temperature, head_dtype, rows)
        return logps, entropies

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logps, grad_entropies):
        hidden, weight, bias, index, lse, entropies = ctx.saved_tensors
        temperature, head_dtype, rows = ctx.settings
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if grad_logps is None and grad_entropies is None:
            return (None, ctx.sink.done() if ctx.sink is not None else None) + (None,) * 8
        head_weight = weight.to(head_dtype)
        head_bias = None if bias is None else bias.to(head_dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = None  # summed over blocks in float32 (the first block's product starts it)
        grad_bias = torch.zeros(weight.size(0), dtype=torch.float32, device=weight.device) if need_bias else None
        for start in range(0, hidden.size(0), rows):
            block = slice(start, start + rows)
            # one (rows, V) float32 buffer turned in place into log p, p and the logits' gradient (two with the
            # entropies' gradient): d logp_i / dz = onehot(i) − p, d H / dz = −p (log p + H)
            if start == 0 and ctx.kept is not None:  # the forward's block, used up (a second backward recomputes)
                log_probs, ctx.kept = ctx.kept, None
            else:
                log_probs = _block_logits(hidden[block], head_weight, head_bias, temperature)
                log_probs = log_probs.sub_(lse[block].unsqueeze(-1))
            if grad_entropies is None:
                grad = log_probs.exp_().mul_(-grad_logps[block].unsqueeze(-1))
            else:
                probs = log_probs.exp()
                grad = log_probs.add_(entropies[block].unsqueeze(-1)).mul_(probs)
                grad.mul_(-grad_entropies[block].unsqueeze(-1))
                if grad_logps is not None:
                    grad.sub_(probs.mul_(grad_logps[block].unsqueeze(-1)))
                del probs
            if grad_logps is not None:
                grad.scatter_add_(-1, index[block].unsqueeze(-1), grad_logps[block].unsqueeze(-1))
            if temperature != 1.0:
                grad /= temperature
            grad = grad.to(head_dtype)  # the plain path's float32 → head-dtype cast of the logits' gradient
            if need_hidden:
                grad_hidden[block] = (grad @ head_weight).to(hidden.dtype)
            if need_weight:
                grad_weight = _add_float32_product(grad_weight, grad.t(), hidden[block].to(head_dtype))
            if need_bias:
                grad_bias += grad.float().sum(0)
        if need_weight and grad_weight is None:  # no position: no block ran
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = grad_bias.to(bias.dtype) if need_bias else None
        if ctx.sink is not None:  # the tied embedding's rows are added to the float32 sum, which is cast once
            if grad_weight is not None:
                ctx.sink.add_dense(grad_weight)
            grad_weight = ctx.sink.done()
        elif need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None


def _add_float32_product(total: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`total + a @ b` (`a @ b` when `total` is `None`) in float32, in place, for operands in the head's dtype `(V, M)`
    and `(M, H)`: on CUDA in bf16/fp16, a product of those operands with float32 accumulation and output
    (`torch.mm(..., out_dtype=torch.float32)`, at the tensor cores' rate, where a float32 product with TF32 off runs
    several times slower); elsewhere a float32 product of the upcast operands, added in place (exact casts: the same
    sums up to their order)."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and b.dtype == a.dtype:
        if total is None:
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.addmm(total, a, b, out_dtype=torch.float32, out=total)  # in place: no (V, H) temporary
    a, b = a.float(), b.float()
    return torch.mm(a, b) if total is None else total.addmm_(a, b)
