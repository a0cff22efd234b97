# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""How a tensor is spread over the ranks (whole, a DeepSpeed ZeRO-3 partition, an FSDP2 DTensor shard), the part a
rank stores, and its full value: the one place that knows each layout, used by syncing, checkpoints, scoring and
generation."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


# Layouts of one tensor. "plain": the full tensor lives on this rank (single device, DDP, ZeRO-1/2).
# "zero3": a DeepSpeed ZeRO-3 parameter; this rank owns the flat 1-D partition `param.ds_tensor`.
# "dtensor": an FSDP2 (or other DTensor) shard; this rank owns `param.to_local()`.
PLAIN, ZERO3, DTENSOR = "plain", "zero3", "dtensor"


def tensor_layout(tensor: torch.Tensor) -> str:
    """`"zero3"`, `"dtensor"` or `"plain"`: how `tensor` is spread over the ranks."""
    if hasattr(tensor, "ds_id"):
        return ZERO3
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            return DTENSOR
    return PLAIN


def parameter_layouts(model: nn.Module) -> set[str]:
    """The layouts of `model`'s parameters: `{"plain"}` when nothing is sharded."""
    return {tensor_layout(p) for p in model.parameters()}


def full_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The shape of the whole tensor, whatever this rank stores of it."""
    return tuple(tensor.ds_shape) if hasattr(tensor, "ds_id") else tuple(tensor.shape)  # DTensor.shape is global


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The piece of `tensor` this rank stores, as a plain tensor sharing its storage (writable in place)."""
    layout = tensor_layout(tensor)
    if layout == ZERO3:
        return tensor.ds_tensor.detach()
    if layout == DTENSOR:
        return tensor.detach().to_local()
    return tensor.detach()


def partitioning(tensor: torch.Tensor) -> tuple:
    """What must agree between two tensors for their local parts to hold the same elements: the layout, and the
    ZeRO-3 partition size and rank, or the DTensor local shape, placements and mesh, or the plain shape."""
    layout = tensor_layout(tensor)
    if layout == ZERO3:
        group = getattr(tensor, "ds_process_group", None)
        dist = torch.distributed
        return (layout, tensor.ds_tensor.numel(), dist.get_rank(group), dist.get_world_size(group))
    if layout == DTENSOR:
        mesh = tensor.device_mesh
        return (
            layout,
            tuple(tensor.to_local().shape),
            tuple(tensor.placements),
            mesh.device_type,
            tuple(mesh.mesh.flatten().tolist()),
        )
    return (layout, tuple(tensor.shape))


@contextmanager
def gathered_tensor(tensor: torch.Tensor, modify: bool) -> Iterator[torch.Tensor]:
    """Yield the full value of one tensor on every rank; with `modify`, write it back to its shards on exit.

    Every rank must call it for the same tensor (collectives under ZeRO-3 and FSDP2). Used by the sync's fallback
    path and to save/restore a sharded reference in checkpoints: one parameter at a time, so memory stays bounded.
    """
    layout = tensor_layout(tensor)
    if layout == ZERO3:
        import deepspeed

        # modifier_rank=0: on exit DeepSpeed re-partitions rank 0's value; every rank computed the same one.
        with deepspeed.zero.GatheredParameters([tensor], modifier_rank=0 if modify else None):
            yield tensor.data
    elif layout == DTENSOR:
        from torch.distributed.tensor import distribute_tensor

        full = tensor.detach().full_tensor()
        yield full
        if modify:  # every rank holds the same `full`: cut out our shard locally (src_data_rank=None: no scatter)
            shard = distribute_tensor(full, tensor.device_mesh, tensor.placements, src_data_rank=None).to_local()
            tensor.detach().to_local().copy_(shard)
    else:
        yield tensor.detach()
