# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Which performance paths are on by default on which device: on where runs of this package verified them (values
against the plain path, time and memory measured), and the plain path, TRL's own computation, everywhere else."""

# `GRPOConfig` fields whose default (`None`) resolves to True on these `torch.device` types and to False on all
# others. Only the CPU has run the test suite and the benchmarks so far; no GPU run has checked these paths yet.
VERIFIED_DEVICES: dict[str, tuple[str, ...]] = {
    "shared_prefix": ("cpu",),
    "inverse_cdf_sampling": ("cpu",),  # patches only CPU generation in any case
    "chunked_logprobs": ("cpu",),
}

# Not a field: a tied input embedding's row gradient (`scoring.lm_head.sparse_tied_embedding_grad`), used on these
# device types; elsewhere the embedding's own dense backward runs, as in TRL.
TIED_ROW_GRADIENT_DEVICES: tuple[str, ...] = ("cpu",)


def resolve_device_defaults(args, device_type: str) -> None:
    """Set each field of `VERIFIED_DEVICES` that is `None` on `args` (a `GRPOConfig`) to whether `device_type` (a
    `torch.device.type` such as `"cpu"` or `"cuda"`) is among its verified devices; values set by the user stay."""
    for name, devices in VERIFIED_DEVICES.items():
        if getattr(args, name) is None:
            setattr(args, name, device_type in devices)


def tied_row_gradient(device_type: str) -> bool:
    """Whether the trainer gives a tied input embedding its row gradient on `device_type` (`torch.device.type`)."""
    return device_type in TIED_ROW_GRADIENT_DEVICES
