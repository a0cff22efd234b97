# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Trainer callbacks: *when* the reference model is synced with the policy (`SyncRefModelCallback`) and *when* the
reward models are refreshed (`RewardModelRefreshCallback`)."""

import math

from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import has_length
from transformers.utils import logging

from .ref_sync import ReferenceSync, pair_for_sync, sync_reference_model


logger = logging.get_logger(__name__)


class SyncRefModelCallback(TrainerCallback):
    """Moves the reference model towards the policy during training: π_ref ← α·π_θ + (1 − α)·π_ref.

    With `ref_model_sync_strategy="steps"` (default) the sync runs at the end of every `ref_model_sync_steps`-th
    optimizer step (after the optimizer update; micro-batches of gradient accumulation do not count); with
    `"epoch"` it runs at the end of the optimizer step that completes each epoch (an epoch cut short by `max_steps`
    does not sync). Either way it runs before that step's checkpoint is saved, and `on_train_begin` warns when the
    schedule leaves no sync in the run. α is `ref_model_mixup_alpha`. α = 1 is Algorithm 1 of DeepSeekMath
    (arXiv 2402.03300); 0 < α < 1 is the soft update of TR-DPO (arXiv 2404.09656). How the tensors are mixed
    (float32 maths, one rounding, fused kernels; local ZeRO-3 partitions and FSDP2 shards mixed without communication)
    is `trl.trainer.ref_sync`'s job. `num_syncs` is also the reference's version: [`GRPOTrainer`] rescores buffered
    reference log-probs computed at an older one before their loss.

    [`GRPOTrainer`] registers exactly one instance when `sync_ref_model=True`; you do not need to add it.

    Args:
        ref_model (`torch.nn.Module` or `None`):
            The reference model to update in place. `None` for a PEFT policy whose reference is its frozen `"ref"`
            adapter (see `add_reference_adapter`): then only adapter tensors are mixed.
        accelerator (`accelerate.Accelerator`, *optional*):
            Used to unwrap the policy (DDP and friends) before syncing.

    Attributes:
        num_syncs (`int`): syncs done so far in this run.
        last_sync_step (`int`): optimizer step of the last sync (0 before the first).
    """

    def __init__(self, ref_model: nn.Module | None, accelerator=None):
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.num_syncs = 0
        self.last_sync_step = 0
        self._sync: ReferenceSync | None = None  # the pairing, matched by name and validated once

    @classmethod
    def attach(cls, callback_handler, ref_model: nn.Module | None, accelerator=None) -> "SyncRefModelCallback":
        """The one sync callback of a trainer: the first `SyncRefModelCallback` already in `callback_handler` (a
        user-supplied one), bound to `ref_model` and `accelerator`, or a new one added at the end."""
        existing = [cb for cb in callback_handler.callbacks if isinstance(cb, cls)]
        if existing:
            existing[0].ref_model, existing[0].accelerator = ref_model, accelerator
            return existing[0]
        callback = cls(ref_model=ref_model, accelerator=accelerator)
        callback_handler.add_callback(callback)
        return callback

    def sync(self, args: TrainingArguments, state: TrainerState, model: nn.Module) -> None:
        """Sync now, whatever the schedule says."""
        if self._sync is None:
            unwrap = self.accelerator.unwrap_model if self.accelerator is not None else (lambda m: m)
            reference = unwrap(self.ref_model) if self.ref_model is not None else None  # None: PEFT "ref" adapter
            self._sync = pair_for_sync(unwrap(model), reference)  # DDP / DeepSpeed engines -> modules
        self._sync(args.ref_model_mixup_alpha)
        self.num_syncs += 1
        self.last_sync_step = state.global_step

    @staticmethod
    def sync_target_model(model: nn.Module, target_model: nn.Module, alpha: float) -> None:
        """One sync of `target_model` towards `model` (TRL's name): `trl.sync_reference_model(model, target_model, alpha)`."""
        sync_reference_model(model, target_model, alpha)

    def state_dict(self) -> dict[str, int]:
        """Counters to store in a checkpoint next to the reference weights."""
        return {"num_syncs": self.num_syncs, "last_sync_step": self.last_sync_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.num_syncs, self.last_sync_step = int(state["num_syncs"]), int(state["last_sync_step"])

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        """Warn when the schedule leaves no sync in this run (the reference then stays the initial model)."""
        steps = state.max_steps
        if getattr(args, "ref_model_sync_strategy", "steps") == "steps":
            tau = args.ref_model_sync_steps
            if steps > 0 and steps // tau == state.global_step // tau:
                logger.warning(
                    f"ref_model_sync_steps={tau} but the run ends at optimizer step {steps} (now at "
                    f"{state.global_step}): no sync will happen, so the reference stays where it is, as with "
                    f"sync_ref_model=False. Set ref_model_sync_steps to at most {max(steps - state.global_step, 1)}."
                )
            return
        dataloader = kwargs.get("train_dataloader")
        batches = len(dataloader) if dataloader is not None and has_length(dataloader) else None
        if batches and steps > 0 and steps < math.ceil(batches / args.gradient_accumulation_steps):
            logger.warning(
                f"ref_model_sync_strategy='epoch' but the run ends at optimizer step {steps}, before its first epoch "
                f"ends ({math.ceil(batches / args.gradient_accumulation_steps)} steps): no sync will happen. Raise "
                "max_steps, or sync by steps (ref_model_sync_strategy='steps')."
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs):
        """Sync at the end of every τ-th optimizer step, or (per-epoch strategy) of the step that completes an epoch.

        Both run before the `Trainer` saves a checkpoint for that step, so the checkpoint holds the synced reference.
        An epoch is complete when `state.epoch` is a whole number: `Trainer` sets it to `epoch + (micro-batch + 1) /
        micro-batches per epoch` before this call.
        """
        if getattr(args, "ref_model_sync_strategy", "steps") == "steps":
            if state.global_step % args.ref_model_sync_steps == 0:
                self.sync(args, state, model)
        elif state.epoch is not None and float(state.epoch).is_integer() and state.global_step > self.last_sync_step:
            self.sync(args, state, model)


class RewardModelRefreshCallback(TrainerCallback):
    """Trains the reward models further every `reward_model_update_steps` optimizer steps (Algorithm 1, line 12, of
    DeepSeekMath, arXiv 2402.03300): on the policy's completions since the previous update plus replayed earlier ones.

    What is trained and how (labels, replay buffer, losses, optimizer) is `trl.trainer.reward_model_refresh`'s job;
    this callback only decides when. [`GRPOTrainer`] registers one when `reward_model_update_steps` is set, placed
    before any [`SyncRefModelCallback`] (see `register`), so that a step that does both follows Algorithm 1's
    order: reward-model update, then π_ref ← π_θ.

    Args:
        refresh (`RewardModelRefresh`): the trainer's refresher; `refresh.update(global_step)` runs one update.
    """

    def __init__(self, refresh):
        self.refresh = refresh

    def register(self, callback_handler) -> None:
        """Insert this callback just before the first `SyncRefModelCallback` of `callback_handler` (at the end when
        there is none): callbacks run in list order, so the update precedes the reference sync at a shared step."""
        callbacks = callback_handler.callbacks
        sync = [i for i, callback in enumerate(callbacks) if isinstance(callback, SyncRefModelCallback)]
        callbacks.insert(sync[0] if sync else len(callbacks), self)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        steps = getattr(args, "reward_model_update_steps", None)
        if steps and state.global_step % steps == 0:
            self.refresh.update(state.global_step)


class RichProgressCallback(TrainerCallback):  # STUB: being written
    pass


class LogCompletionsCallback(TrainerCallback):  # STUB: being written
    pass
