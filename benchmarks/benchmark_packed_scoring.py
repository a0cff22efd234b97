# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Seconds for the log-prob passes of one GRPO batch with the completions padded, or packed end to end
(`shared_prefix`'s packed rows) in either layout: on the prompts' shared cache, or inline (each row starts with its
prompt: one pass), on SmolLM2-135M-Instruct (2 chat prompts × 8 completions, the trainer's scoring defaults, one
thread), at several completion lengths.

    python benchmarks/benchmark_packed_scoring.py                         # L = 16, 32, 64, 128; 3 repeats
    python benchmarks/benchmark_packed_scoring.py --lengths 16 --repeats 5
    python benchmarks/benchmark_packed_scoring.py --smoke                 # a tiny Qwen2, L = 8, once

Each completion's length is L with probability `--full_fraction` (a sampled batch often runs to the limit), else drawn
uniformly from [L/6, L]; the batch is fixed per L (seed 0). All paths share the prompts (`shared_prefix`) and
alternate within each repeat; medians are printed, with the positions each pass covers (padded: the prompt pass,
then every row as wide as the longest completion plus one; cache: the prompt pass, then the packed rows; inline: the
packed rows, prompts included), the layout the trainer's default (`"auto"`, `pack_completions`' estimate) picks, and
the largest log-prob difference from the padded pass.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

import torch  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl.scoring.grpo_scoring import score_completions  # noqa: E402
from trl.scoring.prefix_sharing import pack_completions, unique_prompt_rows  # noqa: E402


SMOKE = dict(model="tiny", lengths="8", repeats=1)
# the trainer's scoring fields at their defaults
DEFAULTS = dict(share_prefix=True, sparse_embedding_grad=True, chunked_logprobs=True, grouped_kv_attention=True)


def load(name: str, model_dir: str | None):
    if name == "tiny":
        from trl.models.tiny import build_tiny_causal_lm
        from trl.tasks import arithmetic_corpus

        folder = build_tiny_causal_lm(model_dir or tempfile.mkdtemp(prefix="qwen2-"), corpus=arithmetic_corpus())
    else:
        from trl.models.gguf import smollm2_folder

        folder = smollm2_folder(model_dir or os.path.join(tempfile.gettempdir(), "compare-upstream-smollm2"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    return model, AutoTokenizer.from_pretrained(folder)


def batch(tokenizer, length: int, full_fraction: float, vocab_size: int):
    """2 chat prompts (left-padded) × 8 completions of random tokens with the lengths described above."""
    rng = random.Random(0)
    texts = [f"What is {a} + {b}? Answer with the number only." for a, b in ((3, 14), (12, 9))]
    if tokenizer.chat_template:
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts
        ]
    tokenizer.padding_side = "left"
    prompts = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    n = 16
    lengths = [length if rng.random() < full_fraction else rng.randint(max(1, length // 6), length) for _ in range(n)]
    completions = torch.tensor([[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(n)])
    completion_mask = (torch.arange(length) < torch.tensor(lengths)[:, None]).long()
    ids = torch.cat([prompts.input_ids.repeat_interleave(8, 0), completions], 1)
    mask = torch.cat([prompts.attention_mask.repeat_interleave(8, 0), completion_mask], 1)
    return ids, mask


def timed(model, ids, mask, length, packed: bool | str, grad: bool) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        scores = score_completions(model, ids, mask, length, 1.0, compute_entropy=True, packed=packed, **DEFAULTS)
        if grad:
            (scores.per_token_logps * mask[:, -length:]).sum().backward()
    return time.perf_counter() - start, scores.per_token_logps.detach()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--model_dir", default=None, help="smollm2: the converted folder (default: as the compare "
                        "script's); tiny: where to build it (default: a new temp dir)")  # fmt: skip
    parser.add_argument("--lengths", default="16,32,64,128", help="completion lengths L")
    parser.add_argument("--full_fraction", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parse_args_with_smoke(parser, SMOKE, argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, args.model_dir)
    print(
        f"{type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters), 2 prompts × 8 "
        f"completions, {args.threads} thread(s), medians of {args.repeats}; load before: "
        + "/".join(f"{x:.2f}" for x in os.getloadavg())
    )
    rows = []
    paths = (False, "cache", "inline")
    for length in (int(x) for x in args.lengths.split(",")):
        ids, mask = batch(tokenizer, length, args.full_fraction, model.config.vocab_size)
        prompt_length = ids.size(1) - length
        _, inverse = unique_prompt_rows(ids[:, :prompt_length], mask[:, :prompt_length])
        plans = {
            layout: pack_completions(ids, mask, prompt_length, inverse, model.config.hidden_size, layout)
            for layout in ("cache", "inline", "auto")
        }
        times = {(path, grad): [] for path in paths for grad in (True, False)}
        logps = {}
        for _ in range(args.repeats):
            for key in times:
                seconds, logps[key[0]] = timed(model, ids, mask, length, *key)
                times[key].append(seconds)
        valid = mask[:, -length:].bool()
        difference = max(float((logps[path] - logps[False])[valid].abs().max()) for path in paths[1:])
        median = {key: statistics.median(values) for key, values in times.items()}
        prompt_pass = len(set(inverse.tolist())) * (prompt_length - 1)

        def shape(plan):
            return f"{plan.input_ids.numel()} ({' × '.join(map(str, plan.input_ids.shape))})"

        rows.append(
            f"| {length} | {int(valid.sum())} | {prompt_pass} + {ids.size(0) * (length + 1)} "
            f"| {prompt_pass} + {shape(plans['cache'])} | {shape(plans['inline'])} "
            f"| {'inline' if plans['auto'].inline else 'cache'} | "
            + " | ".join(f"{median[path, True]:.3f}" for path in paths)
            + " | "
            + " | ".join(f"{median[path, False]:.3f}" for path in paths)
            + f" | {difference:.1e} |"
        )
    print("\n| L | scored tokens | positions padded | cache | inline | auto picks | fwd+bwd padded s | cache s "
          "| inline s | no-grad padded s | cache s | inline s | max abs log-prob difference |")  # fmt: skip
    print("|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print("load after: " + "/".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
