# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""How one reference model is moved towards one policy: π_ref ← α·π_θ + (1 − α)·π_ref (the only place that knows),
and what a policy's reference is (a frozen copy, or a frozen adapter of a PEFT policy).

Iterative GRPO (DeepSeekMath, arXiv 2402.03300, Algorithm 1) resets the reference to the policy (α = 1); TR-DPO
(arXiv 2404.09656) mixes it softly (0 < α < 1). *When* to sync is decided by `SyncRefModelCallback`.
"""

import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models.utils import adapter_parameters, create_reference_model, fsdp2_modules
from .layouts import full_shape, gathered_tensor, local_part, partitioning


REFERENCE_ADAPTER = "ref"  # name of the frozen reference adapter of a PEFT policy


def non_persistent_buffer_names(model: nn.Module | None) -> set[str]:
    """Names of `model`'s non-persistent buffers (derived tensors such as rotary `inv_freq`, not in its state dict)."""
    if model is None:
        return set()
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        for name in module._non_persistent_buffers_set
    }


def named_float_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a sync mixes and a checkpoint saves, by name: parameters, then persistent floating-point buffers.

    Integer buffers (position ids) and non-persistent buffers are left alone: the latter are derived from the config
    by the model that owns them (rotary `inv_freq`, which dynamic-NTK RoPE recomputes and may alias with
    `original_inv_freq`), so mixing two models' copies would give neither model's values.
    """
    yield from model.named_parameters()
    derived = non_persistent_buffer_names(model)
    for name, buffer in model.named_buffers():
        if buffer.is_floating_point() and name not in derived:
            yield name, buffer


@dataclass
class ReferenceSync:
    """A validated pairing of one reference with one policy; calling it syncs: `sync(alpha)`.

    Build it once with [`pair_for_sync`] and call it at every sync (the callback caches it). The local parts (whole
    tensors, ZeRO-3 partitions or DTensor shards) are mixed in place with no communication; the pairs whose
    partitions do not line up (`fallback`, normally empty) are gathered and mixed one parameter at a time.

    The pairs hold the parameters, not their local parts: the local parts are looked up at each call (one attribute
    access per tensor), so an engine that re-points a partition's storage (e.g. when loading a checkpoint) is
    still followed.

    Attributes:
        local: `(name, policy tensor, reference tensor)` whose local parts are mixed directly.
        fallback: `(name, policy tensor, reference tensor)` mixed through a per-parameter gather.
        reference: the reference model (to release full copies a sharded engine may still hold).
    """

    local: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    fallback: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    reference: nn.Module | None = None

    def local_parts(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`(policy_parts, reference_parts)`: aligned local parts of the directly mixed pairs."""
        return [local_part(p) for _, p, _ in self.local], [local_part(r) for _, _, r in self.local]

    @torch.no_grad()
    def __call__(self, alpha: float) -> None:
        """Sync: every reference tensor ← round(lerp_fp32(reference, policy, alpha)); see `mix_tensors_`."""
        if self.reference is not None:
            _drop_full_copies(self.reference)
        policy_parts, reference_parts = self.local_parts()
        # ZeRO-3 keeps small ("persistent") parameters gathered on every rank next to their partition and refreshes
        # them only after the next optimizer step. When both sides hold such a full copy (a PEFT reference adapter
        # inside the policy's engine), mix it too, so the next forward already sees the synced reference: local, no gather.
        for _, policy_tensor, reference_tensor in self.local:
            if _persistent_full_copy(reference_tensor) and _persistent_full_copy(policy_tensor):
                policy_parts.append(policy_tensor.data)
                reference_parts.append(reference_tensor.data)
        mix_tensors_(reference_parts, policy_parts, alpha)
        for _, policy_tensor, reference_tensor in self.fallback:
            with (
                gathered_tensor(policy_tensor, modify=False) as policy_full,
                gathered_tensor(reference_tensor, modify=True) as reference_full,
            ):
                mix_tensors_([reference_full], [policy_full], alpha)


def _persistent_full_copy(tensor: torch.Tensor) -> bool:
    """A ZeRO-3 parameter that DeepSpeed keeps gathered between forwards (`ds_persist`) and that is gathered now."""
    return hasattr(tensor, "ds_id") and getattr(tensor, "ds_persist", False) and tensor.ds_status.name == "AVAILABLE"


def _drop_full_copies(reference: nn.Module) -> None:
    """Free full copies a sharded reference may still hold, so that its next forward gathers the mixed shards.

    ZeRO-3 keeps "persistent" (small) parameters gathered between forwards and FSDP2 keeps modules unsharded when
    `reshard_after_forward=False`; releasing them is local (no communication).
    """
    for parameter in reference.parameters():
        if hasattr(parameter, "ds_id") and parameter.ds_status.name == "AVAILABLE":
            parameter.partition()  # frees the gathered copy; the partition `ds_tensor` is kept as is
    for module in fsdp2_modules(reference):
        module.reshard()


def pair_for_sync(policy: nn.Module, reference: nn.Module | None) -> ReferenceSync:
    """Match `reference`'s tensors with `policy`'s by name and check once that their local parts line up.

    `reference=None` (or the policy itself) means a PEFT policy whose reference is its frozen `"ref"` adapter
    (see `add_reference_adapter`): the pairs are then the two adapters' tensors.

    Names and full shapes must agree. For each pair the layout and partitioning (ZeRO-3 partition size and rank,
    DTensor local shape, placements and mesh) are compared; pairs that differ go to the per-parameter gather
    fallback, with one warning.

    Returns:
        A [`ReferenceSync`]; call it with `alpha` to sync.

    Raises:
        ValueError: if the two models do not have the same tensor names and shapes.
    """
    if reference is None or reference is policy:
        return ReferenceSync(local=_adapter_pairs(policy, policy.active_adapter, REFERENCE_ADAPTER))
    _drop_full_copies(reference)  # FSDP2: see the sharded parameters, not transient unsharded ones
    policy_tensors = dict(named_float_tensors(policy))
    ref_items = list(named_float_tensors(reference))
    missing = [name for name, _ in ref_items if name not in policy_tensors]
    if missing or len(ref_items) != len(policy_tensors):
        extra = sorted(set(policy_tensors) - {name for name, _ in ref_items})
        raise ValueError(
            "The reference model and the policy do not have the same tensors; "
            f"only in the reference: {missing[:5]}, only in the policy: {extra[:5]}. Build the reference with "
            "`trl.create_reference_model(policy)`."
        )
    plan = ReferenceSync(reference=reference)
    for name, tensor in ref_items:
        source = policy_tensors[name]
        if full_shape(source) != full_shape(tensor):
            raise ValueError(
                f"Tensor {name!r} has shape {full_shape(tensor)} in the reference but {full_shape(source)} in the policy."
            )
        same = partitioning(source) == partitioning(tensor)
        (plan.local if same else plan.fallback).append((name, source, tensor))
    if plan.fallback:
        name, source, tensor = plan.fallback[0]
        warnings.warn(
            f"The policy and the reference are not partitioned the same way for {len(plan.fallback)} tensors (e.g. "
            f"{name!r}: {partitioning(source)} vs {partitioning(tensor)}); those are synced by gathering one "
            "parameter at a time, which communicates. Prepare the reference like the policy (same ZeRO-3 or FSDP2 "
            "settings) for a communication-free sync.",
            stacklevel=2,
        )
    return plan


def _masked(name: str, adapter: str) -> str:
    """`name` with its `adapter` component replaced by `<adapter>`, so two adapters' tensors match by name."""
    parts = name.split(".")
    parts[parts.index(adapter)] = "<adapter>"
    return ".".join(parts)


def _adapter_pairs(
    model: nn.Module, policy_adapter: str, reference_adapter: str
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """`(name, policy parameter, reference parameter)` for each tensor of a PEFT model's two adapters.

    With LoRA the reference is the shared base model plus a frozen second adapter (see `add_reference_adapter`);
    syncing mixes adapter tensors only. A parameter belongs to an adapter when its name has a component equal to the
    adapter's name (e.g. `...lora_A.default.weight`); names are matched with that component masked.

    Raises:
        ValueError: if the two adapters do not have the same tensors.
    """

    def adapter_tensors(adapter: str) -> dict[str, torch.Tensor]:  # names with the adapter component masked
        return {_masked(name, adapter): p for name, p in adapter_parameters(model, adapter).items()}

    policy, reference = adapter_tensors(policy_adapter), adapter_tensors(reference_adapter)
    if (
        not reference
        or set(policy) != set(reference)
        or any(full_shape(policy[k]) != full_shape(reference[k]) for k in reference)
    ):
        raise ValueError(
            f"Adapter {reference_adapter!r} does not mirror adapter {policy_adapter!r} "
            f"({len(reference)} vs {len(policy)} tensors); create it with add_reference_adapter."
        )
    return [(k, policy[k], reference[k]) for k in sorted(reference)]


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
    pair_for_sync(policy, reference)(alpha)


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
    model.add_adapter(name, copy.deepcopy(model.peft_config[active]))
    ReferenceSync(local=_adapter_pairs(model, active, name))(1.0)
    for parameter in adapter_parameters(model, name).values():
        parameter.requires_grad_(False)


def make_reference(
    policy: nn.Module, beta: float, sync_ref_model: bool, given_peft_model: bool, init_kwargs: dict | None = None
) -> tuple[nn.Module | None, str | None]:
    """The reference of `policy`, as `(ref_model, ref_adapter)`.

    - `beta == 0`: none, `(None, None)`.
    - Full fine-tuning: a frozen copy, `(create_reference_model(policy), None)`; a ZeRO-3 partitioned policy's is
      loaded again with `init_kwargs` (the policy's `from_pretrained` arguments).
    - PEFT, syncing or starting from a given (possibly trained) adapter: the shared base weights plus a frozen copy
      of the policy's adapter, `(None, REFERENCE_ADAPTER)` (see `add_reference_adapter`).
    - PEFT otherwise: the base model with adapters disabled, `(None, None)`.
    """
    if beta == 0.0:
        return None, None
    if not hasattr(policy, "peft_config"):
        return create_reference_model(policy, from_pretrained_kwargs=init_kwargs), None
    if sync_ref_model or given_peft_model:
        add_reference_adapter(policy, REFERENCE_ADAPTER)
        return None, REFERENCE_ADAPTER
    return None, None
