# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`ModelConfig` (STUB: being written)."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    model_name_or_path: str | None = None
