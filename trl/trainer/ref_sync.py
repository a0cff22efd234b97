# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""How one reference model is moved towards one policy: π_ref ← α·π_θ + (1 − α)·π_ref (the only place that knows).

Iterative GRPO (DeepSeekMath, arXiv 2402.03300, Algorithm 1) resets the reference to the policy (α = 1); TR-DPO
(arXiv 2404.09656) mixes it softly (0 < α < 1). *When* to sync is decided by `SyncRefModelCallback`.
"""

from collections.abc import Iterator

import torch
from torch import nn


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
