# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`get_peft_config`, `get_quantization_config`, `get_kbit_device_map` (STUB: being written)."""


def get_peft_config(model_args):
    raise NotImplementedError


def get_quantization_config(model_args):
    raise NotImplementedError


def get_kbit_device_map():
    raise NotImplementedError
