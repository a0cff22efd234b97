# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/reference/layouts.py on one process: plain tensors, and a DTensor on a one-rank gloo mesh (ZeRO-3 partitions and
two-rank shards: tests/test_distributed.py)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trl.reference.layouts import (
    DTENSOR,
    PLAIN,
    full_shape,
    gathered_tensor,
    local_part,
    parameter_layouts,
    partitioning,
    tensor_layout,
)


def test_plain_tensor_is_its_own_local_part_and_full_value():
    tensor = torch.arange(6.0).reshape(2, 3)
    assert tensor_layout(tensor) == PLAIN and full_shape(tensor) == (2, 3)
    assert partitioning(tensor) == (PLAIN, (2, 3)) != partitioning(tensor.T)
    part = local_part(tensor)
    assert part.data_ptr() == tensor.data_ptr() and not part.requires_grad
    with gathered_tensor(tensor, modify=True) as full:
        full.mul_(2)  # a plain tensor is written in place
    assert torch.equal(tensor, 2 * torch.arange(6.0).reshape(2, 3))
    assert parameter_layouts(nn.Linear(2, 2)) == {PLAIN}


@pytest.fixture
def one_rank_mesh(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield dist.device_mesh.init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensor_shard_layout_and_write_back(one_rank_mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    value = torch.arange(8.0).reshape(4, 2)
    shard = distribute_tensor(value.clone(), one_rank_mesh, [Shard(0)])
    assert tensor_layout(shard) == DTENSOR and full_shape(shard) == (4, 2)
    assert partitioning(shard)[:3] == (DTENSOR, (4, 2), (Shard(0),))
    assert torch.equal(local_part(shard), value)
    with gathered_tensor(shard, modify=True) as full:
        full.add_(1.0)
    assert torch.equal(local_part(shard), value + 1.0)  # written back into this rank's shard
    linear = nn.Linear(2, 2)
    linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), one_rank_mesh, [Shard(0)]))
    assert parameter_layouts(linear) == {DTENSOR, PLAIN}
