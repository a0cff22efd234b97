# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""TRL-compatible GRPO with iterative GRPO: the reference model is periodically synced with the policy."""

# PEP 440: the TRL release whose API and behaviour this package follows, then this fork's own version as a local
# label. It sorts above that release (`Version("1.16.0+iterative.0.1") > Version("1.16.0")`) and satisfies
# `trl>=1.16`, so libraries that compare `trl.__version__` with a minimum accept it.
__version__ = "1.16.0+iterative.0.1"

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
