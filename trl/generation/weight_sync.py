# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the policy sends to a vLLM engine: its full tensors under the checkpoint names vLLM loaded (LoRA adapters
merged, ZeRO-3 / FSDP2 shards gathered one layer at a time), and the check of a push against what vLLM accepts."""

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from ..models.utils import LAYER_PATTERNS
from ..reference.layouts import DTENSOR, ZERO3, full_shape, tensor_layout


# The checkpoint paths of the decoder-layer lists of common architectures ("model.layers", ...): each layer is one
# gathering group.
_LAYER_LISTS = tuple(pattern.rsplit(".", 1)[0] for pattern in LAYER_PATTERNS)
_SHOWN = 5  # names listed per kind of mismatch in `check_vllm_weight_names`'s error


@dataclass(frozen=True)
class _Lora:
    """One active LoRA adapter to merge into a weight: W + scaling · B @ A (transposed for `fan_in_fan_out`)."""

    layer: nn.Module  # the peft LoRA layer holding `lora_A[adapter]` and `lora_B[adapter]`
    adapter: str
    scaling: float
    fan_in_fan_out: bool


@dataclass(frozen=True)
class _Entry:
    """One checkpoint tensor: its name, and where the policy keeps it (looked up when gathered, because FSDP2
    swaps the registered parameter objects between their sharded and unsharded forms)."""

    name: str
    module: nn.Module
    attribute: str
    loras: tuple[_Lora, ...] = ()

    def tensor(self) -> torch.Tensor:
        return getattr(self.module, self.attribute)


def _unwrap(model: nn.Module, accelerator=None) -> nn.Module:
    """The bare model under DDP / DeepSpeed / FSDP / `torch.compile` wrappers, the transformers model under a PEFT
    model."""
    if accelerator is not None:
        model = accelerator.unwrap_model(model, keep_torch_compile=False)
    else:
        from accelerate.utils import extract_model_from_parallel

        model = extract_model_from_parallel(model, keep_torch_compile=False)
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _lora_layer(module: nn.Module, prefix: str) -> list[_Entry]:
    """The entries of a peft LoRA `Linear` layer: its base layer's tensors, the weight with the active adapters that
    are not merged already.

    Raises:
        ValueError: for other peft layer types (LoRA on embeddings or convolutions, other tuners) and LoRA variants
            (DoRA, `lora_bias`), whose merged weight is not computed here.
    """
    from peft.tuners.lora.layer import Linear

    adapters = [a for a in module.active_adapters if a in module.lora_A]
    variants = {**getattr(module, "use_dora", {}), **getattr(module, "lora_variant", {})}
    unsupported = not isinstance(module, Linear) or any(
        variants.get(a) or getattr(module, "lora_bias", {}).get(a, False) for a in adapters
    )
    if unsupported:
        raise ValueError(
            f"Cannot send the weights of {prefix.rstrip('.')!r} ({type(module).__name__}) to vLLM: only plain LoRA "
            "on linear layers is merged (no DoRA, lora_bias, LoRA on embeddings or convolutions, or other PEFT "
            "methods). Merge the adapter into the model before training, or train without vLLM."
        )
    base = module.get_base_layer()
    loras = tuple(
        _Lora(module, a, float(module.scaling[a]), bool(module.fan_in_fan_out))
        for a in adapters
        if a not in module.merged_adapters  # a merged adapter is already in the base weight
    )
    return [
        _Entry(prefix + name, base, name, loras if name == "weight" else ())
        for name, p in base._parameters.items()
        if p is not None
    ]


def _entries(model: nn.Module) -> list[list[_Entry]]:
    """The checkpoint tensors of a bare (or PEFT base) model in gathering groups: one per decoder layer, in order,
    then one for the rest (embeddings, final norm, head). Tied tensors appear once, under their first name."""
    seen: set[int] = set()
    groups: dict[object, list[_Entry]] = {}
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))  # > 1: a tied weight
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())  # exact names, as save_pretrained drops them

    def add(group, entry: _Entry) -> None:
        tensor = entry.tensor()
        if id(tensor) in seen or entry.name in ignored:
            return
        seen.add(id(tensor))
        groups.setdefault(group, []).append(entry)

    def walk(module: nn.Module, prefix: str, group) -> None:
        kind = type(module).__name__
        if hasattr(module, "lora_A") and hasattr(module, "get_base_layer"):
            for entry in _lora_layer(module, prefix):
                add(group, entry)
            return
        if kind == "ModulesToSaveWrapper":  # the active adapter's trained copy, else the original module
            active = [a for a in module.active_adapters if a in module.modules_to_save]
            chosen = module.modules_to_save[active[0]] if active else module.original_module
            copies = dict(chosen.named_parameters())
            if any(uses[id(p)] > 1 and uses[id(copies[n])] == 1 for n, p in module.original_module.named_parameters()):
                raise ValueError(
                    f"Cannot send the weights of {prefix.rstrip('.')!r} to vLLM: its trained copy (`modules_to_save`) "
                    "is not tied like the original weight (tied embeddings), and vLLM's model keeps them tied. Tie "
                    "the copies (`LoraConfig(ensure_weight_tying=True)`) or leave this module out of modules_to_save."
                )
            walk(chosen, prefix, group)
            return
        if hasattr(module, "get_base_layer") or kind.endswith("Wrapper") and "peft" in type(module).__module__:
            raise ValueError(
                f"Cannot send the weights of {prefix.rstrip('.')!r} ({kind}) to vLLM: only plain LoRA adapters "
                "on linear layers and `modules_to_save` are supported."
            )
        for name, p in module._parameters.items():
            if p is not None:
                add(group, _Entry(prefix + name, module, name))
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                add(group, _Entry(prefix + name, module, name))
        is_layer_list = prefix.rstrip(".") in _LAYER_LISTS
        for name, child in module._modules.items():
            if child is not None:
                walk(child, f"{prefix}{name}.", f"{prefix}{name}" if is_layer_list else group)

    walk(model, "", "rest")
    return [entries for key, entries in groups.items() if key != "rest"] + [groups.get("rest", [])]


def vllm_weight_shapes(model: nn.Module, accelerator=None) -> dict[str, tuple[int, ...]]:
    """The checkpoint names and full shapes that [`vllm_weights`] yields for `model`, without gathering anything
    (ZeRO-3 and FSDP2 parameters know their full shape). Take it when the engine is created and check every push
    against it with [`check_vllm_weight_names`].

    Raises:
        ValueError: as [`vllm_weights`], for PEFT layers whose merge is not supported.
    """
    bare, shapes = _unwrap(model, accelerator), {}
    for group in _entries(bare):  # meta tensors of the full shapes, through the same renaming as the values
        meta = {e.name: torch.empty(full_shape(e.tensor()), dtype=e.tensor().dtype, device="meta") for e in group}
        shapes.update({name: tuple(t.shape) for name, t in _checkpoint_format(bare, meta).items()})
    return shapes


def _checkpoint_format(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` (one group's) as `save_pretrained` writes them: transformers 5 keeps some weights in another layout
    than its checkpoints (the experts of MoE models fused into one tensor per layer) and converts them back on save;
    each such conversion stays within a decoder layer, so a group converts alone. Unchanged for other models."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers without conversions: the names are the checkpoint's
        return tensors
    if not hasattr(model, "config"):
        return tensors
    return revert_weight_conversion(model, tensors)


def _full_values(entries: list[_Entry]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each entry's full value, the group gathered once (a collective under ZeRO-3 and FSDP2) and released after."""
    tensors = {id(t): t for e in entries for t in _group_tensors(e)}
    zero3 = [t for t in tensors.values() if tensor_layout(t) == ZERO3]
    with ExitStack() as stack:
        if zero3:
            import deepspeed

            stack.enter_context(deepspeed.zero.GatheredParameters(zero3, modifier_rank=None))
        full = {}
        for key, t in tensors.items():
            layout = tensor_layout(t)
            if layout == ZERO3:  # the gathered storage is freed on exit: copy it
                full[key] = t.data.detach().clone()
            elif layout == DTENSOR:
                full[key] = t.detach().full_tensor()
            else:
                full[key] = t.detach()
    for entry in entries:
        value = full[id(entry.tensor())]
        if entry.loras:
            merged = value.float()
            for lora in entry.loras:
                a = full[id(lora.layer.lora_A[lora.adapter].weight)].float()
                b = full[id(lora.layer.lora_B[lora.adapter].weight)].float()
                delta = b @ a
                merged = merged + (delta.T if lora.fan_in_fan_out else delta) * lora.scaling
            value = merged.to(value.dtype)
        yield entry.name, value


def _group_tensors(entry: _Entry) -> list[torch.Tensor]:
    """The tensors an entry's full value is computed from: its own, and the LoRA matrices merged into it."""
    lora = [lora.layer.lora_A[lora.adapter].weight for lora in entry.loras]
    lora += [lora.layer.lora_B[lora.adapter].weight for lora in entry.loras]
    return [entry.tensor(), *lora]


def vllm_weights(model: nn.Module, accelerator=None) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's full tensors under the checkpoint names of the model folder vLLM loaded, lazily, for
    `reload_weights(weights_iterator=...)` (one call: vLLM fuses q/k/v and gate/up and needs every part at once).

    The names are those `save_pretrained` writes for the bare transformers model: parameters and persistent buffers
    (`_keys_to_ignore_on_save` excepted), a tied weight once under its first name (`lm_head.weight` of a tied
    model is skipped), weights that transformers keeps in another layout in memory converted back (the fused
    experts of MoE models: one weight per expert). The order is fixed: each decoder layer in turn, then the rest
    (embeddings, final norm, head).
    Each tensor has its full (unsharded) shape and the policy's dtype, on the policy's device.

    - PEFT: every plain LoRA linear layer yields its base weight with the active adapters merged,
      `W + scaling · B @ A`, computed in float32 and rounded once to W's dtype (bitwise what peft's
      `merge_and_unload` gives in float32; in bfloat16 peft rounds twice, and differs by at most one unit in the
      last place). The model itself is never modified, so nothing needs restoring, also when the consumer stops
      early or raises. `modules_to_save` yield the active adapter's copy under the module's plain name; LoRA
      matrices, inactive adapters (the reference's `"ref"` adapter) and `original_module` copies are not sent.
    - DeepSpeed ZeRO-3: the parameters of one group are gathered (`GatheredParameters`), copied and released
      before anything of the group is yielded, so at most one group is whole at a time; yielded tensors are copies.
    - FSDP2 (DTensor parameters): `full_tensor()` per parameter, one group at a time.

    Every rank must run the whole iteration (or stop at the same tensor): ZeRO-3 and FSDP2 gather with collectives.
    Only the rank that pushes to vLLM uses the values; the others drop them.

    Args:
        model: the policy: a transformers model or a PEFT model, bare or as wrapped by `accelerator.prepare`.
        accelerator: the `accelerate.Accelerator` that wrapped it, if any.

    Yields:
        `(name, tensor)`.

    Raises:
        ValueError: (at the first `next`) for PEFT layers other than plain LoRA on linear layers and
            `modules_to_save` (DoRA, `lora_bias`, LoRA on embeddings or convolutions, other PEFT methods), and for a
            `modules_to_save` copy of a tied weight that is not tied like it (vLLM would ignore it).
    """
    bare = _unwrap(model, accelerator)
    for group in _entries(bare):
        yield from _checkpoint_format(bare, dict(_full_values(group))).items()


def check_vllm_weight_names(
    weights_meta: Iterable[tuple[str, tuple[int, ...]]], expected: dict[str, tuple[int, ...]]
) -> None:
    """Check a push's names and shapes against the policy's when the trainer was built (what the engine was loaded
    from, or what a server was first given), before anything is sent.

    A `reload_weights` call that meets an unknown name or a wrong shape leaves the engine unusable (its layers stay
    on meta tensors), and one that leaves out part of a fused q/k/v or gate/up weight loads it wrong, so a push
    must hold exactly the expected tensors.

    Args:
        weights_meta: `(name, shape)` of every tensor to send, e.g. `vllm_weight_shapes(policy).items()`.
        expected: `{name: shape}` accepted by the engine, e.g. `vllm_weight_shapes(policy)` taken at its creation.

    Raises:
        ValueError: listing (up to 5 of each) the unknown names, wrong shapes and missing names.
    """
    meta = {name: tuple(shape) for name, shape in weights_meta}
    unknown = [name for name in meta if name not in expected]
    wrong = [
        f"{n} {meta[n]} instead of {tuple(expected[n])}"
        for n in meta
        if n in expected and meta[n] != tuple(expected[n])
    ]
    missing = [name for name in expected if name not in meta]
    if not (unknown or wrong or missing):
        return

    def listed(items: list[str]) -> str:
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        return ", ".join(items[:_SHOWN]) + more

    problems = [
        f"{label} ({len(items)}): {listed(items)}"
        for label, items in (("unknown names", unknown), ("wrong shapes", wrong), ("missing names", missing))
        if items
    ]
    raise ValueError(
        "Refused to push the policy's weights to vLLM (nothing was sent): they do not match the policy's names "
        f"and shapes when the trainer was built; {'; '.join(problems)}. A reload that fails leaves the engine unusable."
    )
