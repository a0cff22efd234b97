# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The gradient of a weight that the LM head and the input embedding share (tied embeddings), formed without
copies of the whole `(V, H)` weight.

PyTorch's autograd adds a sparse gradient (an embedding lookup's rows) to a dense one that arrived first (the LM
head's) out of place: a new `(V, H)` tensor per lookup, and on a CPU each such tensor is also fresh pages from the
kernel (113 MB for SmolLM2-135M, two lookups per training pass with shared-prefix scoring). `TiedGradSink` lets the
block-wise LM head of `chunked_logprobs` and the lookups of one pass add into one tensor in place and hand autograd
the sum once; `lm_head.sparse_tied_embedding_grad` installs the lookups."""

from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F


class TiedGradSink:
    """Collects the gradient of a weight shared by the LM head and the input embedding (tied embeddings) over one
    forward pass's uses of it, and hands autograd the sum once, as a single dense contribution.

    Each use registers in the forward (`register`); in the backward, the LM head adds its dense `(V, H)` gradient
    (`add_dense`), each embedding lookup adds its rows in place (`add_rows`, `index_add_`), and the use whose backward
    runs last returns the total (`done`); the others return `None`. Autograd then receives one dense gradient for the
    weight instead of a dense one and a sparse one per lookup, which it would add out of place (a new `(V, H)` tensor
    per lookup). The sum is kept in float32 and cast to the weight's dtype once, in `done`: a bf16 weight's gradient is
    rounded once, not once per addition (each lookup row added to a bf16 sum would round again). If a registered use's
    backward does not run in a backward pass that ran another's (so the total would never be returned), that backward
    ends with a `RuntimeError` instead of losing the gradient. The count starts over in every backward pass (autograd's
    graph task), also after one that failed half-way.
    """

    def __init__(self):
        self.registered = 0  # uses recorded in the forward (only those that need the weight's gradient)
        self.pending = 0  # uses whose backward has not run yet in the current backward pass
        self.grad = None  # the float32 `(V, H)` sum of the current backward pass
        self.dtype = None  # the shared weight's dtype, which `done` hands autograd
        self.task = None  # the backward pass (graph task id) the count belongs to

    def register(self, weight: torch.Tensor) -> None:
        """A use of `weight` (the shared `(V, H)` weight) in the forward that needs its gradient."""
        self.registered += 1
        self.dtype = weight.dtype

    def _begin(self) -> None:
        task = torch._C._current_graph_task_id()
        if task != self.task:  # first use in this backward pass: start over, and check at its end that all ran
            self.task, self.pending, self.grad = task, self.registered, None
            torch.autograd.Variable._execution_engine.queue_callback(self._check)

    def _check(self) -> None:
        pending, self.task, self.grad = self.pending, None, None
        if pending:
            raise RuntimeError(
                f"{pending} of {self.registered} uses of the tied embedding weight got no gradient in this backward "
                "pass, so its summed gradient was not handed to autograd; set `chunked_logprobs=False`."
            )

    def add_dense(self, grad: torch.Tensor) -> None:
        """Add a dense `(V, H)` gradient (float32 for exact sums; another dtype is upcast)."""
        self._begin()
        grad = grad.float()
        self.grad = grad if self.grad is None else self.grad.add_(grad)

    def add_rows(self, ids: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor) -> None:
        """Add `rows` `(M, H)` into the rows `ids` `(M,)` of the sum (a lookup's gradient), in float32."""
        self._begin()
        if self.grad is None:
            self.grad = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        self.grad.index_add_(0, ids, rows.float())

    def done(self) -> torch.Tensor | None:
        """Called once by every use's backward (after its `add_*`, if it had a gradient to add): the total in the
        weight's dtype for the last one, `None` for the others."""
        self._begin()
        self.pending -= 1
        if self.pending < 0:
            raise RuntimeError("A use of the tied embedding weight ran its backward twice in one backward pass.")
        if self.pending:
            return None
        grad, self.grad = self.grad, None
        return None if grad is None else grad.to(self.dtype)


class _TiedLookup(torch.autograd.Function):
    """`F.embedding(ids, weight, padding_idx)` whose weight gradient (no row for `padding_idx`) goes to a
    `TiedGradSink`, or, without one, is returned as a sparse COO tensor (what `nn.Embedding(sparse=True)` gives)."""

    @staticmethod
    def forward(ctx, ids, weight, sink, padding_idx):
        ctx.save_for_backward(ids)
        ctx.sink, ctx.padding_idx, ctx.weight_shape = sink, padding_idx, weight.shape
        if not ctx.needs_input_grad[1]:  # no gradient for the weight from this lookup (frozen, no_grad)
            sink = ctx.sink = None
        ctx.weight = weight if sink is not None else None  # the sink allocates the sum like the weight
        if sink is not None:
            sink.register(weight)
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        ids, rows = ids.reshape(-1), grad.reshape(-1, grad.size(-1))
        if ctx.padding_idx is not None:  # the padding row gets no gradient, as in nn.Embedding
            keep = ids != ctx.padding_idx
            ids, rows = ids[keep], rows[keep]
        if ctx.sink is None:  # each looked-up row once, its repeats summed in float32 and rounded once
            unique, position = ids.unique(return_inverse=True)
            summed = rows.new_zeros((unique.numel(), rows.size(1)), dtype=torch.float32)
            summed.index_add_(0, position, rows.float())
            sparse = torch.sparse_coo_tensor(
                unique.unsqueeze(0), summed.to(rows.dtype), ctx.weight_shape, is_coalesced=True, check_invariants=False
            )
            return None, sparse, None, None
        ctx.sink.add_rows(ids, rows, ctx.weight)
        return None, ctx.sink.done(), None, None


@contextmanager
def tied_lookups(embedding: nn.Embedding, sink_of):
    """Inside this block `embedding` looks its rows up through `_TiedLookup`, with the sink `sink_of()` returns at
    each call (`None`: a sparse gradient). Its forward is restored when the block ends."""

    def forward(ids):
        sink = sink_of() if torch.is_grad_enabled() else None  # no graph, no backward to wait for
        return _TiedLookup.apply(ids, embedding.weight, sink, embedding.padding_idx)

    embedding.forward = forward
    try:
        yield
    finally:
        del embedding.forward
