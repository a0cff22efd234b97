# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Counts (does not run) the memory of a LoRA reference adapter against a full reference copy, in a table.

    python benchmarks/lora_reference_memory.py [--rank 16]
    python benchmarks/lora_reference_memory.py --smoke       # the same counts (they take seconds already)

Models are built on the meta device, so the 0.5B configuration costs no memory here.
"""

import argparse
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from trl.models.tiny import QWEN2_5_0_5B_SHAPE, build_tokenizer, tiny_qwen2_config
from trl.reference.ref_sync import REFERENCE_ADAPTER, add_reference_adapter
from trl.tasks import arithmetic_corpus


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers
from _smoke import parse_args_with_smoke  # noqa: E402


def count(config, rank: int, bytes_per_param: int) -> tuple[int, int]:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        full = sum(p.numel() for p in model.parameters())
        peft_model = get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM"))
        add_reference_adapter(peft_model)
    adapter = sum(p.numel() for n, p in peft_model.named_parameters() if f".{REFERENCE_ADAPTER}." in n)
    return full * bytes_per_param, adapter * bytes_per_param


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=16)
    args = parse_args_with_smoke(parser, {}, argv)  # counting on the meta device is already a smoke run
    print(f"\nReference memory, LoRA rank {args.rank} on all linear layers, bf16 weights (2 bytes/parameter)")
    print(f"| {'model':<22} | {'full reference copy':>20} | {'reference adapter':>18} | {'ratio':>8} |")
    print(f"|{'-' * 24}|{'-' * 22}|{'-' * 20}|{'-' * 10}|")
    for name, config in (
        ("tiny (tests)", tiny_qwen2_config(build_tokenizer(arithmetic_corpus()))),
        ("Qwen2 0.5B shape", tiny_qwen2_config(build_tokenizer(arithmetic_corpus()), **QWEN2_5_0_5B_SHAPE)),
    ):
        full, adapter = count(config, args.rank, 2)
        print(f"| {name:<22} | {full / 2**20:>16.2f} MiB | {adapter / 2**20:>14.3f} MiB | {adapter / full:>8.2%} |")


if __name__ == "__main__":
    main()
