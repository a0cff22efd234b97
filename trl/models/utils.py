# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Model helpers: building a frozen reference model, switching dropout off, unwrapping a policy for generation."""

import copy
from contextlib import contextmanager

from torch import nn


def create_reference_model(model: nn.Module) -> nn.Module:
    """A frozen copy of `model` to serve as the reference model π_ref.

    The copy has the same parameter names, shapes, dtypes and devices, is in eval mode, and none of its parameters
    requires a gradient (so it can never enter an optimizer).

    Args:
        model: a `transformers.PreTrainedModel` (or any `nn.Module`), not wrapped by DDP/DeepSpeed.

    Returns:
        The reference model.

    Raises:
        ValueError: if `model` is a DeepSpeed ZeRO-3 partitioned model (copy its weights from disk instead).
    """
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        raise ValueError(
            "create_reference_model cannot copy a ZeRO-3 partitioned model; load the reference with "
            "from_pretrained before DeepSpeed partitions the policy."
        )
    reference = copy.deepcopy(model)
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference.eval()


def disable_dropout_in_model(model: nn.Module) -> None:
    """Set `p = 0` in every `torch.nn.Dropout` module of `model`, in place."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@contextmanager
def unwrap_model_for_generation(model: nn.Module, accelerator, gather_deepspeed3_params: bool = True):
    """Yield the bare policy for `generate`, gathering ZeRO-3 partitions for the duration if asked.

    Args:
        model: the policy as wrapped by `accelerator.prepare` (DDP, DeepSpeed engine, ...).
        accelerator: the `accelerate.Accelerator` that wrapped it.
        gather_deepspeed3_params: under ZeRO-3, gather all weights once (fast generation, full-model memory)
            instead of letting every forward gather layer by layer.
    """
    unwrapped = accelerator.unwrap_model(model)
    deepspeed_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if deepspeed_plugin is None or deepspeed_plugin.zero_stage != 3 or not gather_deepspeed3_params:
        yield unwrapped
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        yield unwrapped


def prepare_inference_model(model: nn.Module, accelerator) -> nn.Module:
    """Place a frozen model (reference or reward model) for inference under `accelerator`: no optimizer, no DDP."""
    return accelerator.prepare_model(model, evaluation_mode=True)


@contextmanager
def use_adapter(model: nn.Module, name: str):
    """Run a PEFT model with adapter `name` active (frozen) inside the block; the previous adapter is active and
    trainable again afterwards, and `name` stays frozen."""
    previous = model.active_adapter
    model.set_adapter(name, inference_mode=True)
    try:
        yield model
    finally:
        model.set_adapter(previous)
