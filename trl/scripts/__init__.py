# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Command-line entry points (`trl grpo`) and TRL 1.16's script helpers: `TrlParser`, `ScriptArguments`,
`DatasetMixtureConfig`, `get_dataset`, `init_zero_verbose`."""

from .utils import DatasetMixtureConfig, ScriptArguments, TrlParser, get_dataset, init_zero_verbose


__all__ = ["DatasetMixtureConfig", "ScriptArguments", "TrlParser", "get_dataset", "init_zero_verbose"]
