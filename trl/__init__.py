# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""TRL-compatible GRPO with iterative GRPO: the reference model is periodically synced with the policy."""

# PEP 440: the TRL release whose API and behaviour this package follows, then this fork's own version as a local
# label. It sorts above that release (`Version("1.16.0+iterative.0.1") > Version("1.16.0")`) and satisfies
# `trl>=1.16`, so libraries that compare `trl.__version__` with a minimum accept it.
__version__ = "1.16.0+iterative.0.1"

from .data_utils import (
    apply_chat_template,
    extract_prompt,
    is_conversational,
    is_conversational_from_value,
    maybe_apply_chat_template,
    maybe_convert_to_chatml,
    maybe_extract_prompt,
)
from .models import create_reference_model
from .scripts import DatasetMixtureConfig, ScriptArguments, TrlParser, get_dataset, init_zero_verbose
from .trainer import (
    GRPOConfig,
    GRPOTrainer,
    LogCompletionsCallback,
    ModelConfig,
    RewardModelRefreshCallback,
    RichProgressCallback,
    SyncRefModelCallback,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
    sync_reference_model,
)


__all__ = [
    "DatasetMixtureConfig",
    "GRPOConfig",
    "GRPOTrainer",
    "LogCompletionsCallback",
    "ModelConfig",
    "RewardModelRefreshCallback",
    "RichProgressCallback",
    "ScriptArguments",
    "SyncRefModelCallback",
    "TrlParser",
    "apply_chat_template",
    "create_reference_model",
    "extract_prompt",
    "get_dataset",
    "get_kbit_device_map",
    "get_peft_config",
    "get_quantization_config",
    "init_zero_verbose",
    "is_conversational",
    "is_conversational_from_value",
    "maybe_apply_chat_template",
    "maybe_convert_to_chatml",
    "maybe_extract_prompt",
    "sync_reference_model",
]
