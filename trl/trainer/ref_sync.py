# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""How one reference model is moved towards one policy: π_ref ← α·π_θ + (1 − α)·π_ref (the only place that knows).

Iterative GRPO (DeepSeekMath, arXiv 2402.03300, Algorithm 1) resets the reference to the policy (α = 1); TR-DPO
(arXiv 2404.09656) mixes it softly (0 < α < 1). *When* to sync is decided by `SyncRefModelCallback`.
"""

from collections.abc import Iterator

import torch
from torch import nn


REFERENCE_ADAPTER = "ref"  # name of the frozen reference adapter of a PEFT policy


def _named_float_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, then floating-point buffers, by name (integer buffers such as position ids are left alone)."""
    yield from model.named_parameters()
    for name, buffer in model.named_buffers():
        if buffer.is_floating_point():
            yield name, buffer


def paired_tensors(policy: nn.Module, reference: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Match the tensors of `reference` with those of `policy` by name.

    Returns:
        `(policy_tensors, reference_tensors)`, two aligned lists (the `.data` of each parameter).

    Raises:
        ValueError: if the two models do not have the same tensor names and shapes.
    """
    policy_tensors = dict(_named_float_tensors(policy))
    ref_items = list(_named_float_tensors(reference))
    missing = [name for name, _ in ref_items if name not in policy_tensors]
    if missing or len(ref_items) != len(policy_tensors):
        extra = sorted(set(policy_tensors) - {name for name, _ in ref_items})
        raise ValueError(
            "The reference model and the policy do not have the same tensors; "
            f"only in the reference: {missing[:5]}, only in the policy: {extra[:5]}. Build the reference with "
            "`trl.create_reference_model(policy)`."
        )
    pol, ref = [], []
    for name, tensor in ref_items:
        source = policy_tensors[name]
        if source.shape != tensor.shape:
            raise ValueError(f"Tensor {name!r} has shape {tuple(tensor.shape)} in the reference but {tuple(source.shape)} in the policy.")
        pol.append(source.detach())
        ref.append(tensor.detach())
    return pol, ref


def paired_adapter_tensors(model: nn.Module, policy_adapter: str = "default", reference_adapter: str = "ref") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Match the tensors of a PEFT model's reference adapter with those of its policy adapter.

    With LoRA the reference is the shared base model plus a frozen second adapter (see
    `add_reference_adapter`); syncing mixes adapter tensors only. A parameter belongs to an adapter
    when its name has a component equal to the adapter's name (e.g. `...lora_A.default.weight`).

    Returns:
        `(policy_tensors, reference_tensors)`, two aligned lists.

    Raises:
        ValueError: if the two adapters do not have the same tensors.
    """
    def adapter_tensors(adapter: str) -> dict[str, torch.Tensor]:
        found = {}
        for name, parameter in model.named_parameters():
            parts = name.split(".")
            if adapter in parts:
                parts[parts.index(adapter)] = "<adapter>"
                found[".".join(parts)] = parameter.detach()
        return found

    policy, reference = adapter_tensors(policy_adapter), adapter_tensors(reference_adapter)
    if not reference or set(policy) != set(reference) or any(policy[k].shape != reference[k].shape for k in reference):
        raise ValueError(
            f"Adapter {reference_adapter!r} does not mirror adapter {policy_adapter!r} "
            f"({len(reference)} vs {len(policy)} tensors); create it with add_reference_adapter."
        )
    keys = sorted(reference)
    return [policy[k] for k in keys], [reference[k] for k in keys]


@torch.no_grad()
def mix_tensors_(reference: list[torch.Tensor], policy: list[torch.Tensor], alpha: float) -> None:
    """In place, `reference[i] ← round(lerp_fp32(reference[i], policy[i], alpha))` for every i.

    The arithmetic is done in float32 and rounded once to each reference tensor's dtype (`torch._foreach_lerp_`
    does exactly this for bf16/fp16, checked in the tests), so small α steps on bf16 weights are not lost to a
    double rounding; a step smaller than half a bf16 ulp of the weight still cannot be stored. `alpha == 1` is a
    bitwise copy. Tensors are processed with fused multi-tensor (`_foreach`) kernels per (device, dtype) group.

    Args:
        reference: tensors to update, any float dtype.
        policy: tensors of the same shapes (a different dtype or device is allowed and cast once per tensor).
        alpha: mixing weight in (0, 1].

    Raises:
        ValueError: if alpha is outside (0, 1] or the lists differ in length.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}.")
    if len(reference) != len(policy):
        raise ValueError(f"{len(reference)} reference tensors but {len(policy)} policy tensors.")
    groups: dict[tuple, tuple[list, list]] = {}
    for ref, pol in zip(reference, policy):
        if pol.dtype != ref.dtype and alpha != 1.0:
            # Mixed dtypes (e.g. fp32 master policy, bf16 reference): mix in fp32, round once.
            ref.copy_(torch.lerp(ref.float(), pol.to(ref.device, torch.float32), alpha))
            continue
        pol = pol.to(ref.device, ref.dtype)  # no-op when already matching
        key = (ref.device, ref.dtype)
        groups.setdefault(key, ([], []))
        groups[key][0].append(ref)
        groups[key][1].append(pol)
    for refs, pols in groups.values():
        if alpha == 1.0:
            torch._foreach_copy_(refs, pols)
        elif refs[0].dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            torch._foreach_lerp_(refs, pols, alpha)
        else:  # other float formats: explicit fp32 maths, one rounding
            for ref, pol in zip(refs, pols):
                ref.copy_(torch.lerp(ref.float(), pol.float(), alpha))


@torch.no_grad()
def sync_reference_model(policy: nn.Module, reference: nn.Module, alpha: float) -> None:
    """π_ref ← α·π_θ + (1 − α)·π_ref for every parameter and floating buffer of `reference`, in place.

    Args:
        policy: the (unwrapped) policy model.
        reference: a model with the same tensor names and shapes (e.g. from `create_reference_model(policy)`).
        alpha: mixing weight in (0, 1]; 1.0 copies the policy bit for bit (arXiv 2402.03300, Algorithm 1).

    Raises:
        ValueError: if alpha is outside (0, 1] or the models' tensors do not match.
    """
    policy_tensors, reference_tensors = paired_tensors(policy, reference)
    mix_tensors_(reference_tensors, policy_tensors, alpha)


def add_reference_adapter(model: nn.Module, name: str = REFERENCE_ADAPTER) -> None:
    """Give a PEFT policy a frozen reference adapter `name`, a copy of its active adapter (bit for bit).

    The reference is then "base weights + reference adapter": no second copy of the base model, and a policy that
    starts from a trained adapter keeps that adapter as its reference (KL ≈ 0 at the first step). The new adapter's
    parameters never require gradients, so they never enter an optimizer.

    Args:
        model: a `peft.PeftModel` (not wrapped by DDP/DeepSpeed).
        name: the reference adapter's name.

    Raises:
        ValueError: if the model already has an adapter called `name`.
    """
    if name in model.peft_config:
        raise ValueError(f"The model already has an adapter named {name!r}.")
    active = model.active_adapter
    model.add_adapter(name, model.peft_config[active])
    policy_tensors, reference_tensors = paired_adapter_tensors(model, active, name)
    mix_tensors_(reference_tensors, policy_tensors, 1.0)
    for param_name, parameter in model.named_parameters():
        if name in param_name.split("."):
            parameter.requires_grad_(False)


def reference_pairs(policy: nn.Module, reference: nn.Module | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The `(policy, reference)` tensor lists to mix: a separate reference model's tensors, or, when `reference` is
    the policy itself (PEFT), the reference adapter's tensors against the active adapter's."""
    if reference is None or reference is policy:
        return paired_adapter_tensors(policy, policy.active_adapter, REFERENCE_ADAPTER)
    return paired_tensors(policy, reference)
