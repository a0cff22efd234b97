# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/trainer/grpo_checkpoint.py: the cut generation batch saved with a checkpoint, and when it is not reused."""

import logging

import torch

from trl.trainer.grpo_checkpoint import GENERATION_BUFFER_FILE, load_generation_buffer, save_generation_buffer


def test_generation_buffer_round_trip_and_other_world_size(tmp_path, caplog):
    inputs = [{"advantages": torch.tensor([0.5, -0.5])}, {"advantages": torch.tensor([1.0, -1.0])}]
    save_generation_buffer(str(tmp_path), 0, 3, inputs, num_processes=1)
    step, loaded = load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=1)
    assert step == 3 and [b["advantages"].tolist() for b in loaded] == [[0.5, -0.5], [1.0, -1.0]]
    # Resumed on 2 processes: rank 1 has no file, so rank 0 must not use its own either (else rank 1 would generate
    # alone and wait in a collective forever).
    assert load_generation_buffer(str(tmp_path), 1, torch.device("cpu"), num_processes=2) is None
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_checkpoint"):
        assert load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=2) is None
    path = tmp_path / GENERATION_BUFFER_FILE.format(rank=0)
    assert f"{path} was saved by 1 processes and this run has 2" in caplog.text
    # A buffer from before the process count was saved is used as it is.
    torch.save({"step": 1, "inputs": inputs}, path)
    assert load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=2)[0] == 1
