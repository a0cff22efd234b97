# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Trainers, their configs and callbacks."""

from ..reference.ref_sync import sync_reference_model
from .callbacks import LogCompletionsCallback, RewardModelRefreshCallback, RichProgressCallback, SyncRefModelCallback
from .grpo_config import GRPOConfig
from .grpo_trainer import GRPOTrainer
from .model_config import ModelConfig
from .utils import get_kbit_device_map, get_peft_config, get_quantization_config


__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "LogCompletionsCallback",
    "ModelConfig",
    "RewardModelRefreshCallback",
    "RichProgressCallback",
    "SyncRefModelCallback",
    "get_kbit_device_map",
    "get_peft_config",
    "get_quantization_config",
    "sync_reference_model",
]
