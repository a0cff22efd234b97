# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Time and peak memory of the LM head's side of one GRPO training pass (hidden states → per-token log-probs and
entropies at the sampling temperature → a loss → its backward into the hidden states and the head's weight), plain
(TRL's computation: the whole `(positions × vocabulary)` logits, then a float32 log-softmax) against `chunked_logprobs`
(`scoring.chunked_logprobs.head_logprobs`: a block of positions at a time), on one device, in the head's dtype.

    python benchmarks/benchmark_lm_head.py                          # Qwen2.5-0.5B's head, 8 × 512 positions, bf16
    python benchmarks/benchmark_lm_head.py --preset smollm2 --positions 2048
    python benchmarks/benchmark_lm_head.py --smoke                  # a small head on the CPU, once

On a GPU this is the row that decides whether `chunked_logprobs` pays there (it is off by default on accelerators
until a run shows it, see `trl/trainer/device_defaults.py`). Peak memory is CUDA's `max_memory_allocated` above
what was allocated before the pass (`n/a` on the CPU). `max abs Δ logp` is the largest difference of the chunked
log-probs from the plain ones; `rel Δ grad W` the relative difference of the head weight's gradients.
"""

import argparse
import os
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

import torch  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from trl.scoring.chunked_logprobs import head_logprobs  # noqa: E402
from trl.trainer.grpo_losses import selective_log_softmax  # noqa: E402


PRESETS = {"0.5b": (151_936, 896), "smollm2": (49_152, 576), "small": (4_096, 128)}  # (vocabulary, hidden size)
SMOKE = dict(preset="small", positions=256, repeats=1, device="cpu", dtype="float32")


def plain(hidden, weight, index, temperature):
    """TRL's computation: the logits in the head's dtype, then a float32 log-softmax (and the entropies)."""
    return selective_log_softmax(F.linear(hidden, weight), index, return_entropy=True, temperature=temperature)


def chunked(hidden, weight, index, temperature):
    return head_logprobs(hidden, weight, None, index, temperature, compute_entropy=True, head_dtype=weight.dtype)


def run(path, hidden, weight, index, advantages, temperature, device):
    """One pass and its backward: `(seconds, peak bytes or None, log-probs, weight gradient)`."""
    hidden = hidden.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    logps, entropies = path(hidden, weight, index, temperature)
    loss = -(logps * advantages).mean() - 0.01 * entropies.mean()
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    return seconds, peak, logps.detach(), weight.grad


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="0.5b", choices=sorted(PRESETS))
    parser.add_argument("--positions", type=int, default=8 * 512, help="completion tokens of one training pass")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parse_args_with_smoke(parser, SMOKE, argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    vocab, width = PRESETS[args.preset]
    g = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(args.positions, width, generator=g).to(device, dtype)
    weight = (torch.randn(vocab, width, generator=g) * width**-0.5).to(device, dtype)
    index = torch.randint(0, vocab, (args.positions,), generator=g).to(device)
    advantages = torch.randn(args.positions, generator=g).to(device)
    results = {}
    for name, path in (("plain", plain), ("chunked_logprobs", chunked)):
        runs = [run(path, hidden, weight, index, advantages, args.temperature, device) for _ in range(args.repeats)]
        results[name] = runs
    _, _, plain_logps, plain_grad = results["plain"][-1]
    print(
        f"\nLM head, preset {args.preset} ({vocab} × {width}), {args.positions} positions, {args.dtype}, "
        f"T = {args.temperature}, device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"median of {args.repeats}\n"
    )
    print("| path | ms (median) | peak MiB | max abs Δ logp | rel Δ grad W |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        _, peak, logps, grad = runs[-1]
        ms = statistics.median(r[0] for r in runs) * 1e3
        peak_text = f"{peak / 2**20:.0f}" if peak is not None else "n/a"
        delta = (logps - plain_logps).abs().max().item()
        rel = ((grad.float() - plain_grad.float()).norm() / plain_grad.float().norm()).item()
        print(f"| {name} | {ms:.1f} | {peak_text} | {delta:.2e} | {rel:.2e} |")


if __name__ == "__main__":
    main()
