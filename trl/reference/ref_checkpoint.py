# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The reference model's part of a GRPO checkpoint: the synced reference (full weights, or a PEFT policy's
reference adapter) and the sync counters, saved beside the `Trainer`'s own files and restored on resume, so that a
resumed run continues bitwise like the uninterrupted one."""

import json
import os
from collections.abc import Collection
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.utils import logging

from ..models.utils import adapter_parameters
from .layouts import gathered_tensor
from .ref_sync import named_float_tensors


logger = logging.get_logger(__name__)

REF_MODEL_FILE = "ref_model.safetensors"  # full fine-tuning: the synced reference's weights
REF_ADAPTER_FILE = "ref_adapter.safetensors"  # PEFT: the reference adapter's tensors
REF_SYNC_STATE_FILE = "ref_sync_state.json"  # sync counters


def reference_tensors(
    ref_model: nn.Module | None, policy: nn.Module, ref_adapter: str | None
) -> dict[str, torch.Tensor]:
    """The reference's own tensors by name (this rank's view).

    Args:
        ref_model: the unwrapped reference model (full fine-tuning), or `None` with PEFT.
        policy: the unwrapped policy; with PEFT its parameters under the `ref_adapter` name are the reference.
        ref_adapter: name of the PEFT reference adapter.

    Returns:
        The reference model's parameters and floating buffers, or the reference adapter's parameters.
    """
    if ref_model is not None:
        return dict(named_float_tensors(ref_model))
    return adapter_parameters(policy, ref_adapter)


def save_reference_state(
    tensors: dict[str, torch.Tensor], folder: str, file_name: str, sync_state: dict, should_save: bool
) -> None:
    """Write the full reference tensors to `folder/file_name` and the sync counters to `REF_SYNC_STATE_FILE`.

    Sharded tensors (ZeRO-3, FSDP2) are gathered one at a time, so every rank must call this; only the rank with
    `should_save` writes.
    """
    state = {}
    for name, tensor in tensors.items():
        with gathered_tensor(tensor, modify=False) as full:
            if should_save:
                state[name] = full.detach().to("cpu", copy=True).contiguous()
    if not should_save:
        return
    save_file(state, os.path.join(folder, file_name))
    with open(os.path.join(folder, REF_SYNC_STATE_FILE), "w") as f:
        json.dump(sync_state, f)


def load_reference_state(
    tensors: dict[str, torch.Tensor], checkpoint: str, file_name: str, ignorable: Collection[str] = ()
) -> dict | None:
    """Copy the reference saved in `checkpoint/file_name` into `tensors` (every rank its own part).

    Args:
        tensors: the reference's tensors by name (see `reference_tensors`).
        checkpoint: the checkpoint folder.
        file_name: `REF_MODEL_FILE` or `REF_ADAPTER_FILE`.
        ignorable: names the file may hold that `tensors` lacks, skipped: the reference's non-persistent buffers,
            which earlier versions saved (they are derived from the config, not trained or synced).

    Returns:
        The saved sync counters, or `None` when the checkpoint has no reference (a TRL checkpoint: see
        `reference_state_without_file`).

    Raises:
        ValueError: if the saved tensors do not match the reference's names.
    """
    weights = os.path.join(checkpoint, file_name)
    if not os.path.exists(weights):
        return None
    saved = load_file(weights)
    missing, extra = set(tensors) - set(saved), set(saved) - set(tensors) - set(ignorable)
    if missing or extra:
        raise ValueError(
            f"{weights} does not match the reference model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(extra)[:5]}."
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            with gathered_tensor(tensor, modify=True) as full:
                full.copy_(saved[name])
    with open(os.path.join(checkpoint, REF_SYNC_STATE_FILE)) as f:
        return json.load(f)


SYNC_SETTINGS = ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha", "beta")  # all in TRL's GRPOConfig


def checkpoint_sync_settings(checkpoint: str) -> dict | None:
    """The reference-sync settings of the run that wrote `checkpoint`, read from its `training_args.bin`.

    That file is the run's pickled `TrainingArguments`. TRL's class path, `trl.trainer.grpo_config.GRPOConfig`, resolves
    to this package's `GRPOConfig`; unpickling restores the attributes TRL saved without calling `__init__` or
    `__post_init__`, so they are TRL's values as they were, and fields TRL lacks are simply absent: a run without
    `ref_model_sync_strategy` (TRL's) synced every `ref_model_sync_steps` steps.

    Returns:
        `sync_ref_model`, `ref_model_sync_steps`, `ref_model_mixup_alpha`, `beta` and `ref_model_sync_strategy`, or
        `None` when the file is missing, cannot be unpickled, or lacks one of these settings.
    """
    try:
        # weights_only=False unpickles arbitrary objects, and unpickling can run arbitrary code: acceptable only
        # because this is the user's own checkpoint, the one they asked to resume (whose weights and optimizer state
        # they trust anyway). Any failure just means the settings are unknown.
        saved = vars(torch.load(os.path.join(checkpoint, TRAINING_ARGS_NAME), weights_only=False))
        settings = {
            "sync_ref_model": bool(saved["sync_ref_model"]),
            "ref_model_sync_steps": int(saved["ref_model_sync_steps"]),
            "ref_model_mixup_alpha": float(saved["ref_model_mixup_alpha"]),
            "beta": float(saved["beta"]),
            "ref_model_sync_strategy": str(saved.get("ref_model_sync_strategy", "steps")),  # TRL: by steps only
        }
    except Exception:
        return None
    if settings["ref_model_sync_steps"] < 1 or settings["ref_model_sync_strategy"] not in ("steps", "epoch"):
        return None
    return settings


def _describe(settings: dict) -> str:
    schedule = (
        "ref_model_sync_strategy='epoch'"
        if settings["ref_model_sync_strategy"] == "epoch"
        else f"ref_model_sync_steps={settings['ref_model_sync_steps']}"
    )
    return (
        f"sync_ref_model={settings['sync_ref_model']}, {schedule}, "
        f"ref_model_mixup_alpha={settings['ref_model_mixup_alpha']}, beta={settings['beta']}"
    )


def reference_state_without_file(checkpoint: str, file_name: str, args) -> tuple[dict, float | None]:
    """What the reference resumes from when `checkpoint` holds none (TRL does not save its reference), with a warning.

    A checkpoint written by this package (its trainer state has an `EntropyCoefficient` entry, which TRL's lacks)
    without a reference comes from a run with `sync_ref_model=False`, and a TRL checkpoint of a PEFT model from a run
    that could not sync (TRL refuses `sync_ref_model` with PEFT): their reference was the initial one, and stays so.

    Otherwise the syncs are counted with the settings of the run that wrote the checkpoint, read from its
    `training_args.bin` (see `checkpoint_sync_settings`): a TRL run syncs every `ref_model_sync_steps` steps (TRL has
    no per-epoch strategy), and one with `sync_ref_model=False` or `beta=0.0` (no reference model) never synced. Only
    when that file cannot be read is the run assumed to have synced like this one (`args`).

    Before the checkpoint's step no sync had run: the reference is the initial model, exactly as in the uninterrupted
    run. Otherwise the uninterrupted run's reference was built from the policy at the last sync, which is lost; the
    nearest state the checkpoint holds is the policy itself, so the reference (the initial model) is synced once with
    the resumed policy with that run's α, π_ref ← α·π_θ + (1 − α)·π_ref: with α = 1 (iterative GRPO) the policy's
    weights at the checkpoint, exact when the checkpoint's step is a sync step. (TRL's own resume keeps the initial
    model.)

    Args:
        checkpoint: the checkpoint folder (its `trainer_state.json` gives the step and epoch).
        file_name: the reference file it lacks.
        args: the resuming run's `GRPOConfig`, assumed to be the checkpoint's run's when its settings cannot be read.

    Returns:
        `(sync counters, resume_alpha)`: the `SyncRefModelCallback` counters at the checkpoint's step, and the α of the
        one sync of the reference with the policy to run once the policy's weights are loaded (`None`: no sync).
    """
    with open(os.path.join(checkpoint, TRAINER_STATE_NAME)) as f:
        trainer_state = json.load(f)
    step, no_syncs = int(trainer_state.get("global_step") or 0), {"num_syncs": 0, "last_sync_step": 0}
    if "EntropyCoefficient" in (trainer_state.get("stateful_callbacks") or {}):  # written by this package
        logger.warning(
            f"Checkpoint {checkpoint} has no synced reference model ({file_name}): it was written by this package "
            "with sync_ref_model=False, whose reference stayed the initial model, so the reference starts from the "
            "initial model (if the file was lost from a run that synced, the KL anchor jumps back to where training "
            "began)."
        )
        return no_syncs, None
    head = (
        f"Checkpoint {checkpoint} has no synced reference model ({file_name}), as in checkpoints written by TRL, which "
        "does not save its reference; checkpoints written by this package with sync_ref_model=True include it. "
    )
    if file_name == REF_ADAPTER_FILE:
        logger.warning(
            head + "TRL cannot sync the reference of a PEFT model, so the run that wrote it kept the initial "
            "reference: the reference adapter starts as a copy of the initial adapter."
        )
        return no_syncs, None
    settings = checkpoint_sync_settings(checkpoint)
    if settings is not None:
        head += f"Its {TRAINING_ARGS_NAME} gives the settings of the run that wrote it ({_describe(settings)}). "
    else:
        settings = {name: getattr(args, name) for name in SYNC_SETTINGS}
        settings["ref_model_sync_strategy"] = getattr(args, "ref_model_sync_strategy", "steps")
        head += (
            f"Its {TRAINING_ARGS_NAME} could not be read, so the run that wrote it is assumed to have synced with this "
            f"run's settings ({_describe(settings)}). "
        )
    if settings["beta"] == 0.0:
        logger.warning(
            head + "That run had no reference model (beta=0.0), so nothing was synced: the reference starts from the "
            "initial model."
        )
        return no_syncs, None
    if not settings["sync_ref_model"]:
        logger.warning(
            head + "That run never synced its reference (sync_ref_model=False), so it stayed the initial model: the "
            "reference starts from the initial model, exactly as in the uninterrupted run; this run syncs it from "
            "here on."
        )
        return no_syncs, None
    alpha = settings["ref_model_mixup_alpha"]
    if settings["ref_model_sync_strategy"] == "epoch":
        # Trainer's epoch is fractional (epoch + micro-batches done / micro-batches per epoch); each completed epoch
        # ended with a sync, the last one at the step that closed epoch `num_syncs`: step / epoch steps per epoch.
        epoch = float(trainer_state.get("epoch") or 0)
        num_syncs = int(epoch)
        exact = num_syncs > 0 and epoch.is_integer()
        last_sync_step = step if exact else (round(num_syncs * step / epoch) if num_syncs else 0)
        schedule = "at the end of every epoch"
    else:
        every = settings["ref_model_sync_steps"]
        num_syncs, last_sync_step, exact = step // every, step // every * every, step % every == 0
        schedule = f"every {every} steps"
    if num_syncs == 0:
        logger.warning(
            head + f"No reference sync ({schedule}) had run by step {step}, so the reference is the initial model, "
            "exactly as in the uninterrupted run."
        )
        return no_syncs, None
    if alpha == 1.0:
        start = "the policy's weights at the checkpoint (one sync with alpha=1)"
        fidelity = (
            f"this is exactly the uninterrupted run's reference (synced at step {step})"
            if exact
            else f"the uninterrupted run's reference was the policy at step {last_sync_step}, which the checkpoint "
            "does not hold: this is the nearest state it does"
        )
    else:
        start = f"the initial model synced once with the policy's weights at the checkpoint (alpha={alpha})"
        fidelity = (
            f"an approximation: the uninterrupted run's reference mixed the policies of all {num_syncs} earlier "
            "syncs, which the checkpoint does not hold"
        )
    logger.warning(
        head + f"{num_syncs} reference sync(s) ({schedule}) had run by step {step}, so the reference starts from "
        f"{start}; {fidelity}. TRL's own resume re-creates the reference from the initial model instead, so its KL "
        "anchor jumps back to where training began."
    )
    return {"num_syncs": num_syncs, "last_sync_step": last_sync_step}, alpha


class SyncReferenceAtResume(TrainerCallback):
    """Syncs the reference once with the resumed policy at `on_train_begin` (after the checkpoint's weights are
    loaded, ZeRO-3 and FSDP included), keeping the sync counters as they were; see `reference_state_without_file`.

    Args:
        sync_callback: the trainer's `SyncRefModelCallback`.
        alpha: α of this one sync: that of the run that wrote the checkpoint (`None`: this run's
            `ref_model_mixup_alpha`).
    """

    def __init__(self, sync_callback, alpha: float | None = None):
        self.sync_callback = sync_callback
        self.alpha = alpha
        self.done = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.done:
            return
        counters = self.sync_callback.state_dict()
        # `sync` reads only `ref_model_mixup_alpha` from its args
        sync_args = args if self.alpha is None else SimpleNamespace(ref_model_mixup_alpha=self.alpha)
        self.sync_callback.sync(sync_args, state, model)
        self.sync_callback.load_state_dict(counters)
        self.done = True
