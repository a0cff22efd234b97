# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""TRL-compatible GRPO with iterative GRPO: the reference model is periodically synced with the policy."""

__version__ = "0.1.0.dev0"

from .models import create_reference_model
from .trainer import GRPOConfig, GRPOTrainer, RewardModelRefreshCallback, SyncRefModelCallback, sync_reference_model


__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "RewardModelRefreshCallback",
    "SyncRefModelCallback",
    "create_reference_model",
    "sync_reference_model",
]
