# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Model helpers for the trainers."""

from .utils import create_reference_model, disable_dropout_in_model, unwrap_model_for_generation


__all__ = ["create_reference_model", "disable_dropout_in_model", "unwrap_model_for_generation"]
