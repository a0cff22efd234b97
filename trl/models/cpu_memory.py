# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Where a CPU training step's temporary tensors get their memory from (glibc's malloc).

A GRPO step on the CPU allocates and frees weight- and activation-sized tensors by the thousand (KV caches, logits
blocks, gradients, optimizer temporaries). glibc serves blocks above its mmap threshold with a fresh `mmap` and
returns them with `munmap` when freed, and trims the top of its heap above the trim threshold; either way the next
tensor of that size comes as fresh pages, each one a page fault that the kernel zero-fills. On SmolLM2-135M that was
~190,000 faults and 0.4-0.9 s of system time per ~7.5 s step. `retain_freed_memory` raises both thresholds and turns
glibc's own mappings off (blocks above the highest mmap threshold glibc accepts, 32 MiB, such as the 113 MB gradient
of SmolLM2's tied embedding, come from the main thread's heap too), so that freed blocks stay in the process and the
next tensors reuse them. The trainer's tensors are made on the main thread (CPU autograd runs on the caller's);
other threads allocate from their own glibc heaps of at most 64 MiB, which still map bigger blocks.

Where long-lived tensors land matters then too: AdamW creates its two moments (2 × the trainable parameters) at its
first step, in whatever gaps the first step's temporaries left, and the later steps' temporaries no longer fit
around them. `RetainFreedMemoryCallback` creates them before the first step instead (same zeros, same dtypes).

Both are opt-in, and no `GRPOConfig` field: the environment variable `TRL_RETAIN_FREED_CPU_MEMORY=1` (off by default)
makes a CPU trainer apply them when training starts, or a user calls `retain_freed_memory` (and `allocate_adam_state`)
themselves. The glibc settings hold for the whole process and cannot be undone, so nothing here runs when a trainer is
only built."""

import ctypes
import functools
import os
import platform

import torch
from transformers import TrainerCallback
from transformers.utils import logging


logger = logging.get_logger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# The largest mmap threshold glibc accepts on 64-bit systems (HEAP_MAX_SIZE / 2): blocks above it are mapped unless
# M_MMAP_MAX is 0.
MMAP_THRESHOLD_BYTES = 32 * 2**20
# Keep up to this much free memory at the top of the heap (mallopt takes an int).
TRIM_THRESHOLD_BYTES = 2**31 - 1
_applied = False
# The environment variable that asks a CPU trainer to apply both when training starts.
RETAIN_FREED_MEMORY_ENV = "TRL_RETAIN_FREED_CPU_MEMORY"


def retain_freed_memory_requested() -> bool:
    """Whether `TRL_RETAIN_FREED_CPU_MEMORY` is set to something other than "", "0", "false" or "no"."""
    return os.environ.get(RETAIN_FREED_MEMORY_ENV, "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library this process already runs on (`dlopen(NULL)`), with `errno` kept for `ctypes.get_errno`."""
    return ctypes.CDLL(None, use_errno=True)


def retain_freed_memory() -> bool:
    """Make glibc keep freed memory in the process for later allocations (`mallopt`: mmap threshold 32 MiB, trim
    threshold 2 GiB, and no `mmap` of glibc's own on the main thread's heap: `M_MMAP_MAX` 0), for the rest of the
    process (the settings cannot be undone; `malloc_trim(0)` hands free pages back); returns whether they are in
    effect.

    Only for glibc (Linux); elsewhere nothing changes and `False` is returned, as when `mallopt` refuses (a setting
    accepted before the refused one stays, and a warning says so). Setting the mmap threshold also turns off glibc's
    own adjustment of it. Without `M_MMAP_MAX` 0, a block above 32 MiB (glibc's highest threshold) was still a fresh
    mapping whenever no freed block of the heap could hold it: on SmolLM2-135M the tied embedding's 113 MB gradient,
    27,649 faults in some steps and none in others, depending on where earlier blocks had landed (with
    `offload_ref_model=True`, 0.16 and 0.30 s more per step in two paired runs). Blocks above 32 MiB then stay in the
    process after they are freed, as the smaller ones did, and a large `realloc` copies instead of remapping. When
    the heap cannot grow, glibc still maps a block rather than fail, and threads other than the main one keep their
    own heaps, which map blocks above 64 MiB. The process's resident memory stays near its high-water mark instead of
    shrinking between steps; its peak can be higher (blocks kept for reuse that the peak's allocations do not fit
    into). On SmolLM2-135M the peaks moved by −20 to +69 MB in three paired runs with the thresholds alone, and by
    −24 and −38 MB (offload) and +12 and +22 MB (defaults) with `M_MMAP_MAX` 0 in two more pairs: see "The tied
    gradient, page faults and a nondeterministic backward" and "Page faults: the blocks glibc would still map" in
    the GRPO trainer docs.
    """
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mmap_set = libc().mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        ok = mmap_set and libc().mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        ok = ok and libc().mallopt(_M_MMAP_MAX, 0) == 1
    except (OSError, AttributeError):
        return False
    if mmap_set and not ok:
        logger.warning(
            "retain_freed_memory: glibc took the mmap threshold (32 MiB) but refused the trim threshold or M_MMAP_MAX."
        )
    if ok:
        _applied = True
        logger.info("retain_freed_memory: glibc keeps freed memory for reuse (no mmap of its own).")
    return ok


def allocate_adam_state(optimizer: torch.optim.Optimizer) -> int:
    """Create now the zero state that `torch.optim.Adam` and `AdamW` create at a parameter's first step; returns for
    how many parameters it did.

    For each parameter of `optimizer` (or of the optimizer it wraps, e.g. accelerate's `AcceleratedOptimizer`) that
    requires a gradient and has no state yet: `step` (a 0-d tensor, on the parameter's device when the group is
    `fused` or `capturable`, else on the CPU; float32, or float64 under a float64 default dtype unless fused), `exp_avg`,
    `exp_avg_sq` and, with `amsgrad`, `max_exp_avg_sq` (zeros like the parameter), as the optimizer's own lazy
    initialisation would at its first step: the updates are bitwise the same (tested). A parameter that never gets a
    gradient keeps this zero state (`step` 0; 2-3× its size, saved in checkpoints), where the lazy one would have
    none. A parameter that a `fused` group cannot take (not floating point) is skipped, so that the optimizer's own
    check raises its error at the first step. Any other optimizer class, a subclass included, is left alone (0).
    """
    optimizer = getattr(optimizer, "optimizer", optimizer)
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return 0
    made = 0
    for group in optimizer.param_groups:
        fused, on_device = group.get("fused"), group.get("fused") or group.get("capturable")
        step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 and not fused else torch.float32
        names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group.get("amsgrad") else ("exp_avg", "exp_avg_sq")
        for p in group["params"]:
            if not p.requires_grad or optimizer.state[p] or (fused and not torch.is_floating_point(p)):
                continue  # not trained, already has state, or left to the fused optimizer's own check
            state = {"step": torch.zeros((), dtype=step_dtype, device=p.device if on_device else "cpu")}
            state.update({name: torch.zeros_like(p, memory_format=torch.preserve_format) for name in names})
            optimizer.state[p] = state
            made += 1
    return made


class RetainFreedMemoryCallback(TrainerCallback):
    """`TRL_RETAIN_FREED_CPU_MEMORY=1` on a CPU run: at the start of training (after a checkpoint's optimizer state is
    loaded, before the first step), `retain_freed_memory`, then, where glibc took the settings, `allocate_adam_state`:
    the moments are then allocated before any step's temporaries (see the module docstring)."""

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if retain_freed_memory() and optimizer is not None and (made := allocate_adam_state(optimizer)):
            logger.info(
                f"{RETAIN_FREED_MEMORY_ENV}: Adam(W) state of {made} parameters allocated before the first step."
            )
