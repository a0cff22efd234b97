# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Trainers, their configs and callbacks."""

from .callbacks import RewardModelRefreshCallback, SyncRefModelCallback
from .grpo_config import GRPOConfig
from .grpo_trainer import GRPOTrainer
from .ref_sync import sync_reference_model


__all__ = ["GRPOConfig", "GRPOTrainer", "RewardModelRefreshCallback", "SyncRefModelCallback", "sync_reference_model"]
