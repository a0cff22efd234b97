# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`TRL_RETAIN_FREED_CPU_MEMORY=1` (opt-in): glibc keeps freed blocks for reuse, so new tensors stop faulting in
fresh pages."""

import platform
import resource
import subprocess
import sys

import pytest
import torch

from trl.models import cpu_memory
from trl.models.cpu_memory import allocate_adam_state


# A fresh interpreter per case: the setting is process-wide and cannot be undone.
SCRIPT = """
import resource, sys
import torch
from trl.models.cpu_memory import retain_freed_memory
if sys.argv[1] == "on":
    assert retain_freed_memory() is True and retain_freed_memory() is True  # idempotent
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for mib in range(1, 21):  # tensors of 1, 2, ..., 20 MiB, each freed before the next
    x = torch.ones(mib * 2**18)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # a 64 MiB tensor, above any mmap threshold glibc accepts, five times
    x = torch.ones(2**24)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _transparent_huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.skipif(_transparent_huge_pages_always(), reason="2 MiB pages: the fault counts below assume 4 KiB ones")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    faults = {}
    for mode in ("off", "on"):
        done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        faults[mode] = [int(line) for line in done.stdout.strip().splitlines()[-2:]]
    # 1 + 2 + ... + 20 = 210 MiB = 53,760 pages of 4 KiB. glibc's default maps each block that is larger than the
    # last one freed and unmaps it when freed: every tensor is fresh pages. Retained, the heap grows to the
    # largest block (20 MiB = 5,120 pages, ~9,500 faults measured with the interpreter's own) and is reused.
    assert resource.getpagesize() == 4096
    assert faults["off"][0] > 40_000 and faults["on"][0] < 15_000, faults
    # 5 × 64 MiB = 81,920 pages: mapped afresh every time by default (and by a 32 MiB threshold alone: 81,925
    # measured); with M_MMAP_MAX 0 the heap grows to hold the block (11,264 or 23,296 faults measured, by where the
    # first one lands) and the later ones reuse it
    assert faults["off"][1] > 80_000 and faults["on"][1] < 40_000, faults


@pytest.mark.parametrize(
    "kind, options, float64",
    [
        ("AdamW", {"fused": True}, False),
        ("AdamW", {"foreach": False}, False),
        ("AdamW", {"foreach": True, "amsgrad": True}, False),
        ("Adam", {"weight_decay": 0.1}, False),
        ("Adam", {"foreach": True, "maximize": True}, False),
        ("AdamW", {"foreach": False}, True),  # a float64 default dtype: a float64 `step`
        ("AdamW", {"fused": True}, True),  # ... but a float32 one when fused
    ],
)
def test_adam_state_made_before_the_first_step_gives_the_same_updates(kind, options, float64):
    from types import SimpleNamespace

    def run(eager: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        model[2].bias.requires_grad_(False)  # frozen: no state, in either case
        unused = torch.nn.Parameter(torch.ones(3))  # trainable, never gets a gradient
        optimizer = getattr(torch.optim, kind)([*model.parameters(), unused], lr=1e-2, **options)
        if eager:
            assert allocate_adam_state(SimpleNamespace(optimizer=optimizer)) == 4  # through a wrapper (accelerate's)
            assert allocate_adam_state(optimizer) == 0  # once
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        return model, optimizer, unused

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if float64 else default)
    try:
        (lazy_model, lazy, _), (eager_model, eager, unused) = run(False), run(True)
    finally:
        torch.set_default_dtype(default)
    for a, b in zip(lazy_model.parameters(), eager_model.parameters()):
        assert torch.equal(a, b)
    lazy_state, eager_state = lazy.state_dict()["state"], eager.state_dict()["state"]
    assert set(eager_state) == set(lazy_state) | {4}  # + the unused parameter's zeros, step 0
    assert float(eager_state[4]["step"]) == 0.0 and not eager_state[4]["exp_avg"].any()
    for index, values in lazy_state.items():
        assert values.keys() == eager_state[index].keys()
        for name, value in values.items():
            other = eager_state[index][name]
            assert (value.dtype, value.device) == (other.dtype, other.device) and torch.equal(value, other), name
    assert torch.equal(unused, torch.ones(3))
    step_dtype = torch.float64 if float64 and not options.get("fused") else torch.float32
    assert all(values["step"].dtype == step_dtype for values in eager_state.values())


def test_other_optimizers_are_left_alone():
    class MyAdamW(torch.optim.AdamW):
        pass

    params = [torch.nn.Parameter(torch.ones(2))]
    for optimizer in (torch.optim.SGD(params, lr=0.1), MyAdamW(params), torch.optim.Adagrad(params)):
        before = {k: dict(v) for k, v in optimizer.state.items()}
        assert allocate_adam_state(optimizer) == 0 and optimizer.state == before


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trl.models.tiny import build_tiny_causal_lm
    from trl.tasks import arithmetic_corpus

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("cpu_memory_model")), corpus=arithmetic_corpus())


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_the_trainer_applies_the_settings_when_training_starts_and_only_when_asked(model_dir, tmp_path, monkeypatch):
    from test_iterative_grpo import make_trainer
    from transformers import TrainerCallback

    from trl.models import cpu_memory

    # glibc stand-in: the real settings would hold for the rest of this test process
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(cpu_memory, "libc", FakeLibc)
    monkeypatch.setattr(cpu_memory, "_applied", False)
    seen = []

    class Spy(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            if state.global_step == 0:
                seen.append((len(calls), len(optimizer.optimizer.state)))

    trainers = {}
    for retain in (None, True):  # None: the variable unset (the default)
        if retain:
            monkeypatch.setenv("TRL_RETAIN_FREED_CPU_MEMORY", "1")
        else:
            monkeypatch.delenv("TRL_RETAIN_FREED_CPU_MEMORY", raising=False)
        trainer = make_trainer(model_dir, tmp_path / str(retain), max_steps=2)
        assert calls == []  # building never calls mallopt
        trainer.add_callback(Spy())
        trainer.train()
        trainers[retain] = trainer
    settings = [(-3, 32 * 2**20), (-1, 2**31 - 1), (-4, 0)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_MMAP_MAX
    assert calls == settings  # once, by the second trainer's train()
    trainable = sum(1 for p in trainers[True].model.parameters() if p.requires_grad)
    # default: no mallopt, AdamW's state made lazily at the first step; asked: both before the first step
    assert seen == [(0, 0), (3, trainable)]
    for a, b in zip(trainers[None].model.parameters(), trainers[True].model.parameters()):
        assert torch.equal(a, b)  # the same training


@pytest.mark.parametrize(
    "value, asked",
    [(None, False), ("", False), ("0", False), ("false", False), ("No", False), ("1", True), ("yes", True)],
)
def test_the_environment_variable_asks_for_the_settings(monkeypatch, value, asked):
    if value is None:
        monkeypatch.delenv("TRL_RETAIN_FREED_CPU_MEMORY", raising=False)
    else:
        monkeypatch.setenv("TRL_RETAIN_FREED_CPU_MEMORY", value)
    assert cpu_memory.retain_freed_memory_requested() is asked
