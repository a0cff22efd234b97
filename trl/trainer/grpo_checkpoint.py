# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What a GRPO checkpoint holds for the data beyond the `Trainer`'s own files: the generation batch being trained on
(`GenerationBuffer`, whose unused rest a checkpoint may cut), and an entry for every stateful callback; the
reference's part is `reference.ref_checkpoint`."""

import os
from collections.abc import Callable
from typing import Any

import torch
from transformers.trainer_callback import ExportableState
from transformers.utils import logging

from .grpo_inputs import micro_batch_rows, shuffle_and_split, shuffle_seed


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


class GenerationBuffer:
    """One training generation batch as the micro-batches it is trained on, and the micro-step reached.

    A generation batch is made every `steps_per_generation × num_iterations` micro-steps, shuffled and cut into
    `steps_per_generation` micro-batches (`fill`), and each micro-batch is trained on `num_iterations` times
    (`next_micro_batch`). A checkpoint that cuts a batch keeps its rest (`save`), so that a resumed run trains on the
    very micro-batches of the uninterrupted one (`load`).

    `step` is the micro-step, `None` until training starts (the trainer then sets the micro-steps already done);
    `inputs` the micro-batches, `None` before the first batch. TRL 1.16 names them `_step` and `_buffered_inputs`
    (trainer attributes in `trl_compat`).
    """

    def __init__(self, steps_per_generation: int, num_iterations: int):
        self.steps_per_generation = steps_per_generation
        self.steps_per_batch = steps_per_generation * num_iterations  # micro-steps trained on one generation batch
        self.step: int | None = None
        self.inputs: list[dict[str, Any]] | None = None

    def reset(self) -> None:
        """Forget the position and the batch (a new `train` call)."""
        self.step, self.inputs = None, None

    def needs_batch(self) -> bool:
        """Whether the micro-step `step` starts a new generation batch (or none is buffered, as after a resume at a
        batch boundary)."""
        return self.step % self.steps_per_batch == 0 or self.inputs is None

    def fill(self, batch: dict[str, Any], seed: int, process_index: int) -> None:
        """Buffer a new generation batch, its rows shuffled with a seed of (`seed`, `step`, process) and cut into
        `steps_per_generation` micro-batches (see `grpo_inputs.shuffle_and_split`)."""
        order_seed = shuffle_seed(seed, self.step, process_index)
        self.inputs = shuffle_and_split(batch, self.steps_per_generation, order_seed)

    def micro_batch_rows(self, rows: int, seed: int, process_index: int) -> list[torch.Tensor]:
        """The rows of a generation batch of `rows` rows, made at micro-step `step` (0 before training starts), that
        each of its micro-batches will hold once `fill` has cut it (`grpo_inputs.micro_batch_rows`)."""
        order_seed = shuffle_seed(seed, self.step or 0, process_index)
        return micro_batch_rows(rows, self.steps_per_generation, order_seed)

    def next_micro_batch(self, refresh: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """The micro-batch of micro-step `step`, passed through `refresh` (and kept so: the reference's log-probs
        after a sync, see `ReferenceModel.with_current_version`); advances `step`."""
        index = self.step % self.steps_per_generation
        self.inputs[index] = refresh(self.inputs[index])
        self.step += 1
        return self.inputs[index]

    def save(self, folder: str, accelerator) -> None:
        """Keep this process's micro-batches of a generation batch that the checkpoint in `folder` cuts (nothing at a
        batch boundary: the resumed run generates the next one); `accelerator` gives the process and their number."""
        if self.inputs is not None and self.step % self.steps_per_batch:
            rank, world = accelerator.process_index, accelerator.num_processes
            save_generation_buffer(folder, rank, self.step, self.inputs, world)

    def load(self, checkpoint: str, accelerator) -> None:
        """Take back this process's position and cut batch saved in `checkpoint`, if any (`load_generation_buffer`,
        onto `accelerator.device`)."""
        rank, device, world = accelerator.process_index, accelerator.device, accelerator.num_processes
        self.step, self.inputs = load_generation_buffer(checkpoint, rank, device, world) or (None, None)
