# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""CPU milliseconds to sample one GRPO generation batch with each generation path, at several prompt lengths.

    python benchmarks/benchmark_generation.py                      # 3.1M-parameter Qwen2, 2 prompts × 8, 32 tokens
    python benchmarks/benchmark_generation.py --prompt_lengths 5,64,256 --repeats 5
    python benchmarks/benchmark_generation.py --smoke        # 1 prompt × 2, 4 tokens, prompt lengths 5 and 16, once

The paths alternate within each repeat (medians are printed); both sample with the same `GenerationConfig`.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

import torch  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402

from trl.generation.grpo_generation import (
    GENERATION_IMPLEMENTATIONS,  # noqa: E402
    sample_completions,  # noqa: E402
)
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import arithmetic_corpus  # noqa: E402


SMOKE = dict(prompt_lengths="5,16", prompts=1, num_generations=2, max_completion_length=4, repeats=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt_lengths", default="5,64,256")
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts per batch")
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model_dir", default=None, help="where to build the model (default: a new temp dir)")
    args = parse_args_with_smoke(parser, SMOKE, argv)
    torch.set_num_threads(args.threads)
    shape = dict(hidden_size=256, num_layers=4, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2)
    model_dir = build_tiny_causal_lm(
        args.model_dir or tempfile.mkdtemp(prefix="qwen2-"), corpus=arithmetic_corpus(), **shape
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = GenerationConfig(
        max_new_tokens=args.max_completion_length,
        do_sample=True,
        top_k=0,
        pad_token_id=model.config.pad_token_id,
        eos_token_id=model.config.eos_token_id,
        disable_compile=True,
    )
    print(
        f"Sampling {args.prompts} prompts × {args.num_generations} completions of up to {args.max_completion_length} "
        f"tokens, Qwen2 {shape}, fp32, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}; CPU ms per batch"
    )
    print("| prompt tokens | " + " | ".join(GENERATION_IMPLEMENTATIONS) + " | shared_prefix / generate |")
    print("|---:|" + "---:|" * (len(GENERATION_IMPLEMENTATIONS) + 1))
    for length in (int(x) for x in args.prompt_lengths.split(",")):
        ids = torch.randint(10, model.config.vocab_size, (args.prompts, length))
        ids = ids.repeat_interleave(args.num_generations, 0)
        mask = torch.ones_like(ids)
        times = {impl: [] for impl in GENERATION_IMPLEMENTATIONS}
        for _ in range(args.repeats):
            for impl in GENERATION_IMPLEMENTATIONS:
                start = time.process_time()
                sample_completions(model, ids, mask, config, impl)
                times[impl].append((time.process_time() - start) * 1e3)
        med = {impl: statistics.median(t) for impl, t in times.items()}
        print(
            f"| {length} | "
            + " | ".join(f"{med[i]:.1f}" for i in GENERATION_IMPLEMENTATIONS)
            + f" | {med['shared_prefix'] / med['generate']:.2f} |"
        )


if __name__ == "__main__":
    main()
