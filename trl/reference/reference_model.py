# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The reference model of a GRPO trainer through its life, as one object the trainer holds: built from the policy
(a frozen copy, or a frozen adapter of a PEFT policy), placed under the accelerator, offloaded, lent to the scoring
pass, versioned by its syncs, saved with each checkpoint and restored on resume."""

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from ..models.utils import model_init_kwargs, prepare_inference_model, use_adapter
from .ref_checkpoint import (
    REF_ADAPTER_FILE,
    REF_MODEL_FILE,
    SyncReferenceAtResume,
    load_reference_state,
    reference_state_without_file,
    reference_tensors,
    save_reference_state,
)
from .ref_offload import OffloadedReference
from .ref_sync import make_reference, non_persistent_buffer_names


class ReferenceModel:
    """The reference of a policy: `model`, a frozen copy, or with a PEFT policy its frozen `adapter` (or the base
    model with the adapters off); see `ref_sync.make_reference`. Built before the `Trainer` (a reference adapter is
    added to the policy before it is wrapped), then `prepare`d once the accelerator exists.

    Args:
        policy (`nn.Module`): the policy, as loaded (a `PeftModel` with PEFT).
        args ([`GRPOConfig`]): `beta` (0.0: no reference), `sync_ref_model` (a PEFT policy then gets a reference
            adapter), `model_init_kwargs`, `offload_ref_model` and `output_dir` (where an offloaded one is mapped).
        given_peft_model (`bool`): whether the policy came already wrapped by PEFT.

    Attributes:
        model: the reference model (wrapped for inference after `prepare`), or `None` (PEFT policy, or `beta=0.0`).
        adapter: name of the PEFT reference adapter, or `None` (the base model with the adapters off, or no PEFT).
        offload: the `OffloadedReference` with `offload_ref_model`, else `None`.
        file: the checkpoint file the reference is saved in (`REF_MODEL_FILE` or `REF_ADAPTER_FILE`).
        sync_callback: the `SyncRefModelCallback` that moves the reference (see `follow`), or `None`: never synced.
    """

    def __init__(self, policy: nn.Module, args, given_peft_model: bool):
        self.args = args
        init_kwargs = model_init_kwargs(args)
        self.model, self.adapter = make_reference(
            policy, args.beta, args.sync_ref_model, given_peft_model, init_kwargs
        )
        self.file = REF_MODEL_FILE if self.model is not None else REF_ADAPTER_FILE
        self.offload: OffloadedReference | None = None
        self.sync_callback = None
        self.accelerator = None

    def prepare(self, accelerator) -> None:
        """Place the reference model for inference under `accelerator` and, with `offload_ref_model`, keep its
        weights in a mapped file under `output_dir`.

        Raises:
            ValueError: for `offload_ref_model` without a separate reference model (a PEFT policy).
        """
        self.accelerator = accelerator
        if self.model is not None:
            self.model = prepare_inference_model(self.model, accelerator)
        if self.args.offload_ref_model:
            if self.model is None:
                raise ValueError(
                    "offload_ref_model=True needs a separate reference model; with a PEFT policy the reference is "
                    "the base model with the adapter off or a frozen adapter copy, nothing to offload. Set "
                    "offload_ref_model=False."
                )
            self.offload = OffloadedReference(accelerator.unwrap_model(self.model), self.args.output_dir)

    def follow(self, sync_callback) -> None:
        """Be synced by `sync_callback` (a `SyncRefModelCallback`): its syncs load an offloaded reference, count as
        the reference's `version`, and its counters travel with the reference in checkpoints."""
        self.sync_callback = sync_callback
        sync_callback.reference_loaded = self.loaded

    @property
    def version(self) -> int:
        """Syncs of the reference so far (0 without syncing): buffered reference log-probs carry the value they were
        computed at, and are recomputed when it has moved on."""
        return self.sync_callback.num_syncs if self.sync_callback is not None else 0

    def loaded(self, write: bool = False):
        """A block in which an offloaded reference (`offload_ref_model`) is in memory; `write=True` for changes."""
        return self.offload.loaded(write) if self.offload is not None else nullcontext()

    @contextmanager
    def scoring(self, policy: nn.Module) -> Iterator[nn.Module]:
        """A block that yields the model whose log-probs are the reference's: the reference model (in memory), or
        `policy` (the trainer's, wrapped) with the reference adapter active or the adapters off."""
        if self.model is not None:
            with self.loaded():
                yield self.model
            return
        peft_model = self.accelerator.unwrap_model(policy)
        with use_adapter(peft_model, self.adapter) if self.adapter else peft_model.disable_adapter():
            yield policy

    def with_current_version(self, inputs: dict[str, Any], score) -> dict[str, Any]:
        """`inputs` with `ref_per_token_logps` under the current reference: a micro-batch buffered before a sync (the
        rest of a generation batch with `num_iterations > 1` or `steps_per_generation > gradient_accumulation_steps`)
        is scored again, one reference pass over its rows, so the first loss after a sync already sees it.

        Args:
            inputs: a micro-batch (`prompt_ids`/`prompt_mask` `(N, P)`, `completion_ids`/`completion_mask` `(N, L)`,
                and `ref_per_token_logps` `(N, L)` with its `ref_version` when the loss has a KL term).
            score: `score(input_ids, attention_mask, logits_to_keep, batch_size)` → `(N, L)` reference log-probs.
        """
        if "ref_per_token_logps" not in inputs or inputs.get("ref_version") == self.version:
            return inputs
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
        with torch.no_grad():
            ref_logps = score(input_ids, attention_mask, mask.size(1), input_ids.size(0))
        return {**inputs, "ref_per_token_logps": ref_logps, "ref_version": self.version}

    def tensors(self, policy: nn.Module) -> dict[str, torch.Tensor]:
        """The reference's own tensors by name, this rank's view (see `ref_checkpoint.reference_tensors`); `policy` is
        the trainer's (wrapped or not), whose reference adapter they are with PEFT."""
        model = self.accelerator.unwrap_model(self.model) if self.model is not None else None
        return reference_tensors(model, self.accelerator.unwrap_model(policy), self.adapter)

    def save(self, folder: str, policy: nn.Module, should_save: bool) -> None:
        """Write the reference and the sync counters into the checkpoint `folder` (every rank calls it: sharded
        tensors are gathered; the rank with `should_save` writes)."""
        with self.loaded():
            save_reference_state(self.tensors(policy), folder, self.file, self.sync_callback.state_dict(), should_save)

    def restore(self, checkpoint: str, policy: nn.Module) -> TrainerCallback | None:
        """Load the reference and the sync counters saved in `checkpoint`; for a checkpoint without them (TRL's), the
        counters of the run that wrote it (see `ref_checkpoint.reference_state_without_file`).

        Returns:
            A `SyncReferenceAtResume` callback to add to the trainer when the reference must be synced once with the
            resumed policy, else `None`.

        Raises:
            ValueError: if the saved tensors do not match the reference's names.
        """
        model = self.accelerator.unwrap_model(self.model) if self.model is not None else None
        ignorable = non_persistent_buffer_names(model)  # saved by earlier versions, derived: not restored
        saved = os.path.exists(os.path.join(checkpoint, self.file))  # else nothing is written
        with self.loaded(write=saved):
            state = load_reference_state(self.tensors(policy), checkpoint, self.file, ignorable)
        resume_sync = None
        if state is None:  # e.g. a TRL checkpoint: the reference is rebuilt from the policy once it is loaded
            state, resume_alpha = reference_state_without_file(checkpoint, self.file, self.args)
            if resume_alpha is not None:  # with the α of the run that wrote the checkpoint
                resume_sync = SyncReferenceAtResume(self.sync_callback, resume_alpha)
        self.sync_callback.load_state_dict(state)
        return resume_sync
