# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""A training step leaves the process as it found it: glibc's malloc settings, torch's and transformers' functions, the
classes of the model and of `torch.nn`, and a patch of `torch.multinomial` that another library installed after trl's
import."""

import json
import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh process, so that no earlier test has imported, wrapped or restored anything.
SCRIPT = r"""
import ctypes, json, sys, tempfile

import torch
import transformers.integrations.sdpa_attention as sdpa_attention
import transformers.models.qwen2.modeling_qwen2 as modeling_qwen2

import trl
import trl.tasks
from trl.models.tiny import build_tiny_causal_lm

torch_multinomial = torch.multinomial


def theirs(*args, **kwargs):  # another library's patch, installed after trl's import
    return torch_multinomial(*args, **kwargs)


torch.multinomial = theirs


def snapshot():
    own = modeling_qwen2.__name__
    classes = [c for c in vars(modeling_qwen2).values() if isinstance(c, type) and c.__module__ == own]
    classes += [torch.nn.Linear, torch.nn.Embedding, torch.nn.Module]
    return {
        "torch.multinomial": torch.multinomial,
        "use_gqa_in_sdpa": sdpa_attention.use_gqa_in_sdpa,
        **{f"sdpa_attention.{name}": value for name, value in vars(sdpa_attention).items()},
        **{
            f"{cls.__qualname__}.{name}": value
            for cls in classes
            for name, value in vars(cls).items()
            if callable(value) or isinstance(value, (staticmethod, classmethod, property))
        },
    }


class MallInfo2(ctypes.Structure):  # glibc's mallinfo2(): hblks counts the blocks malloc serves by mmap
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


# Whether glibc serves a 40 MiB block with a mapping of its own, as its defaults do above the largest mmap threshold
# (32 MiB); `trl.models.cpu_memory.retain_freed_memory` turns that off for good (M_MMAP_MAX = 0).
def glibc_maps_big_blocks():
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):  # not glibc, or glibc before 2.33: nothing to observe
        return None
    libc.mallinfo2.restype = MallInfo2
    mapped = libc.mallinfo2().hblks
    block = torch.empty(40 * 2**20, dtype=torch.uint8)
    mapped_now = libc.mallinfo2().hblks
    del block
    return mapped_now > mapped


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


with tempfile.TemporaryDirectory() as tmp:
    path = build_tiny_causal_lm(f"{tmp}/model", corpus=trl.tasks.arithmetic_corpus())
    before = snapshot()
    config = trl.GRPOConfig(
        output_dir=f"{tmp}/out", use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=1, beta=0.04,
        gradient_checkpointing=False, recompute_elementwise_activations=True,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=path, reward_funcs=length, args=config, train_dataset=trl.tasks.make_arithmetic_dataset(16)
    )
    trainer.train()
    after = snapshot()
changed = sorted(name for name in before.keys() | after.keys() if before.get(name) is not after.get(name))
verdict = {"changed": changed, "theirs_installed": torch.multinomial is theirs, "steps": trainer.state.global_step}
verdict["glibc_maps_big_blocks"] = glibc_maps_big_blocks()
print(json.dumps(verdict))
"""


def test_a_training_step_changes_no_library_function_or_class():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env.pop("TRL_RETAIN_FREED_CPU_MEMORY", None)  # the default: glibc's settings left alone
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    # glibc's defaults still map a big block of its own (None where mallinfo2 does not exist to tell)
    assert verdict.pop("glibc_maps_big_blocks") is not False
    assert verdict == {"changed": [], "theirs_installed": True, "steps": 1}
