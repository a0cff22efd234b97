# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What a GRPO checkpoint holds beyond the `Trainer`'s own files: the synced reference (weights and sync counters)
and the unused rest of a generation batch, so that a resumed run continues bitwise like the uninterrupted one."""

import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.utils import logging

from ..models.utils import adapter_parameters
from .layouts import gathered_tensor
from .ref_sync import named_float_tensors


logger = logging.get_logger(__name__)

REF_MODEL_FILE = "ref_model.safetensors"  # full fine-tuning: the synced reference's weights
REF_ADAPTER_FILE = "ref_adapter.safetensors"  # PEFT: the reference adapter's tensors
REF_SYNC_STATE_FILE = "ref_sync_state.json"  # sync counters
GENERATION_BUFFER_FILE = "generation_buffer_rank{rank}.pt"  # the rest of a generation batch cut by a checkpoint


def reference_tensors(
    ref_model: nn.Module | None, policy: nn.Module, ref_adapter: str | None
) -> dict[str, torch.Tensor]:
    """The reference's own tensors by name (this rank's view).

    Args:
        ref_model: the unwrapped reference model (full fine-tuning), or `None` with PEFT.
        policy: the unwrapped policy; with PEFT its parameters under the `ref_adapter` name are the reference.
        ref_adapter: name of the PEFT reference adapter.

    Returns:
        The reference model's parameters and floating buffers, or the reference adapter's parameters.
    """
    if ref_model is not None:
        return dict(named_float_tensors(ref_model))
    return adapter_parameters(policy, ref_adapter)


def save_reference_state(
    tensors: dict[str, torch.Tensor], folder: str, file_name: str, sync_state: dict, should_save: bool
) -> None:
    """Write the full reference tensors to `folder/file_name` and the sync counters to `REF_SYNC_STATE_FILE`.

    Sharded tensors (ZeRO-3, FSDP2) are gathered one at a time, so every rank must call this; only the rank with
    `should_save` writes.
    """
    state = {}
    for name, tensor in tensors.items():
        with gathered_tensor(tensor, modify=False) as full:
            if should_save:
                state[name] = full.detach().to("cpu", copy=True).contiguous()
    if not should_save:
        return
    save_file(state, os.path.join(folder, file_name))
    with open(os.path.join(folder, REF_SYNC_STATE_FILE), "w") as f:
        json.dump(sync_state, f)


def load_reference_state(tensors: dict[str, torch.Tensor], checkpoint: str, file_name: str) -> dict | None:
    """Copy the reference saved in `checkpoint/file_name` into `tensors` (every rank its own part).

    Returns:
        The saved sync counters, or `None` (with a warning) when the checkpoint has no reference.

    Raises:
        ValueError: if the saved tensors do not match the reference's names.
    """
    weights = os.path.join(checkpoint, file_name)
    if not os.path.exists(weights):
        logger.warning(
            f"Checkpoint {checkpoint} has no synced reference model ({file_name}): the reference restarts from the "
            "initial model, so the KL anchor jumps back to where training began. Checkpoints written by this version "
            "with sync_ref_model=True include it."
        )
        return None
    saved = load_file(weights)
    if set(saved) != set(tensors):
        raise ValueError(
            f"{weights} does not match the reference model: {sorted(set(saved) ^ set(tensors))[:5]} differ."
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            with gathered_tensor(tensor, modify=True) as full:
                full.copy_(saved[name])
    with open(os.path.join(checkpoint, REF_SYNC_STATE_FILE)) as f:
        return json.load(f)


def save_generation_buffer(folder: str, rank: int, step: int, inputs: list[dict], num_processes: int = 1) -> None:
    """Keep this process's micro-batches of the generation batch a checkpoint cut, the micro-step reached and the
    number of processes that shared the batch."""
    os.makedirs(folder, exist_ok=True)
    state = {"step": step, "inputs": inputs, "num_processes": num_processes}
    torch.save(state, os.path.join(folder, GENERATION_BUFFER_FILE.format(rank=rank)))


def load_generation_buffer(
    checkpoint: str, rank: int, device: torch.device, num_processes: int = 1
) -> tuple[int, list[dict]] | None:
    """`(step, micro-batches)` saved by `save_generation_buffer`, or `None` when the checkpoint has none.

    A buffer saved by a different number of processes is not used (with a warning): its slices do not match this
    run's, and with more processes now, the ranks without a file would generate while the others do not, and wait
    for each other forever. Every rank then regenerates the batch.
    """
    path = os.path.join(checkpoint, GENERATION_BUFFER_FILE.format(rank=rank))
    if not os.path.exists(path):
        return None
    saved = torch.load(path, map_location=device, weights_only=True)
    if saved.get("num_processes", num_processes) != num_processes:
        logger.warning(
            f"{path} was saved by {saved['num_processes']} processes and this run has {num_processes}: the rest of "
            "the cut generation batch is generated again, so the resumed run is not bit-identical."
        )
        return None
    return saved["step"], saved["inputs"]
