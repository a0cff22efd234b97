# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""From a [`ModelConfig`] to what `GRPOTrainer` takes: the PEFT `LoraConfig` (`get_peft_config`) and the
bitsandbytes `BitsAndBytesConfig` (`get_quantization_config`), plus the device map for k-bit loading."""

import importlib.util

import torch
from transformers import BitsAndBytesConfig

from .model_config import ModelConfig


def get_quantization_config(model_args: ModelConfig) -> BitsAndBytesConfig | None:
    """The `BitsAndBytesConfig` that `model_args` asks for, or `None` when it asks for neither 4 nor 8 bits.

    4 bits: `bnb_4bit_quant_type`, `use_bnb_nested_quant` (double quantization) and `bnb_4bit_quant_storage` come
    from `model_args`, and the compute dtype is `model_args.dtype`, so the quantized layers compute in the dtype
    the rest of the model is loaded in. 8 bits: bitsandbytes' defaults.

    Loading needs the `bitsandbytes` package (`pip install "trl[quantization]"`); it runs on the CPU as well as on
    CUDA (bitsandbytes 0.50 with transformers 5.24: measured on 2026-12-01 with a tiny Qwen2, 4-bit and 8-bit).

    Raises:
        ValueError: from `BitsAndBytesConfig`, for a value it rejects (e.g. an unknown `bnb_4bit_quant_storage`).
    """
    if model_args.load_in_4bit:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=model_args.dtype,
            bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
            bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
        )
    if model_args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def get_kbit_device_map() -> dict[str, int] | None:
    """Where `from_pretrained(..., device_map=...)` puts a k-bit model: all of it on this process's accelerator
    (`{"": local_process_index}`) when there is a CUDA or XPU device, else `None` (load on the CPU).

    TRL 1.16 no longer has this helper (older TRL releases did); it is kept for scripts written against them.
    """
    from accelerate import PartialState

    has_xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    if torch.cuda.is_available() or has_xpu:
        return {"": PartialState().local_process_index}
    return None


def get_peft_config(model_args: ModelConfig):
    """The `peft.LoraConfig` that `model_args` describes, or `None` when `model_args.use_peft` is false.

    The adapter has no bias (`bias="none"`); `target_parameters` is passed only when `lora_target_parameters` is
    set (PEFT added it in 0.17), so older PEFT releases keep working without it.

    Raises:
        ValueError: if `use_peft` is set and the `peft` package is not installed (`pip install "trl[peft]"`).
    """
    if not model_args.use_peft:
        return None
    if importlib.util.find_spec("peft") is None:
        raise ValueError(
            "You need to have PEFT library installed for use_peft: run `pip install peft` "
            '(or `pip install "trl[peft]"`).'
        )
    from peft import LoraConfig

    optional = {}
    if model_args.lora_target_parameters is not None:
        optional["target_parameters"] = model_args.lora_target_parameters
    return LoraConfig(
        task_type=model_args.lora_task_type,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        modules_to_save=model_args.lora_modules_to_save,
        bias="none",
        use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora,
        **optional,
    )
