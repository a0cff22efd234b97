# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What a GRPO checkpoint holds for the data beyond the `Trainer`'s own files: the unused rest of a generation batch
cut by a checkpoint, and an entry for every stateful callback; the reference's part is `reference.ref_checkpoint`."""

import os

import torch
from transformers.trainer_callback import ExportableState
from transformers.utils import logging


logger = logging.get_logger(__name__)

GENERATION_BUFFER_FILE = "generation_buffer_rank{rank}.pt"  # the rest of a generation batch cut by a checkpoint


def add_missing_callback_states(stateful_callbacks: dict, callbacks: list) -> None:
    """Give every `ExportableState` callback an entry in `stateful_callbacks` (in place).

    `Trainer._save_checkpoint` updates the entries of the trainer state loaded from a checkpoint and fails with a
    `KeyError` on a callback the checkpoint did not save (e.g. `EntropyCoefficient` in a TRL checkpoint).
    """
    for callback in callbacks:
        if isinstance(callback, ExportableState):
            stateful_callbacks.setdefault(type(callback).__name__, callback.state())


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
