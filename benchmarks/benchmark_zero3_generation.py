# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Generation under DeepSpeed ZeRO-3 on 2 CPU processes (gloo): this package against TRL 1.16.0, same GRPO run.

    python benchmarks/benchmark_zero3_generation.py                  # 2.45M-parameter Qwen2, 32-token completions
    python benchmarks/benchmark_zero3_generation.py --smoke          # 2-layer tiny model, 2 steps

Each implementation trains the same GRPO run (2 processes × 4 completions per step, `ds3_gather_for_generation=True`,
ZeRO-3 with `stage3_param_persistence_threshold=0`, so that every parameter is partitioned) in a fresh `torchrun`:
ours under this interpreter, TRL's under `--upstream_python` (default: the venv of tests/upstream_venv.py). The
worker (this file with `--worker`) imports `trl` (whichever the interpreter has), wraps transformers'
`GenerationMixin.generate` to time it and to count the collectives issued inside it (calls to `torch.distributed`
and `deepspeed.comm`), and never edits either package. With the weights gathered once and DeepSpeed's module hooks
removed for the call, `generate` itself fetches nothing; the one all-reduce per token left is transformers'
synchronised generation, which keeps the processes stepping together. Columns: medians over the steps after the
first of one run each, rank 0.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

from _smoke import ROOT, parse_args_with_smoke, upstream_trl_python


COLLECTIVES = ("all_gather_into_tensor", "all_gather", "allgather_fn", "broadcast", "all_reduce", "reduce_scatter_fn")
PRESETS = {  # model size and run length
    "default": {"hidden_size": 256, "num_layers": 4, "steps": 6, "max_completion_length": 32},
    "smoke": {"hidden_size": 64, "num_layers": 2, "steps": 2, "max_completion_length": 8},
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS))
    parser.add_argument("--impls", default="ours,upstream", help="comma-separated: ours, upstream")
    parser.add_argument("--upstream_python", default=None, help="python of a venv with trl==1.16.0")
    parser.add_argument("--model_dir", default=None, help="where to build the model (default: a temp folder)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parse_args_with_smoke(parser, {"preset": "smoke"}, argv)


@contextmanager
def counted_collectives():
    """Count calls to the collectives of `torch.distributed` and `deepspeed.comm` in the block, by name."""
    import deepspeed.comm
    import torch.distributed

    counts, patched = {}, []
    for owner in (torch.distributed, torch.distributed.distributed_c10d, deepspeed.comm):
        for name in COLLECTIVES:
            original = getattr(owner, name, None)
            if original is None:
                continue

            def counted(*args, _original=original, _name=name, **kwargs):
                counts[_name] = counts.get(_name, 0) + 1
                return _original(*args, **kwargs)

            setattr(owner, name, counted)
            patched.append((owner, name, original))
    try:
        yield counts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def worker(args) -> None:
    """One GRPO run under ZeRO-3 (run by `torchrun` on 2 processes); rank 0 writes the measurements to `--out`."""
    import deepspeed
    import torch.distributed as dist
    import transformers
    from datasets import Dataset

    import trl
    from trl import GRPOConfig, GRPOTrainer

    deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeed must know the world before the model is partitioned
    preset = PRESETS[args.preset]
    calls = []
    generate = transformers.GenerationMixin.generate

    def timed_generate(self, *a, **kw):
        with counted_collectives() as counts:
            start = time.perf_counter()
            out = generate(self, *a, **kw)
            seconds = time.perf_counter() - start
        calls.append({"seconds": seconds, "collectives": counts, "tokens": out.shape[1]})
        return out

    transformers.GenerationMixin.generate = timed_generate
    step_ends = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

    def length_reward(completions, **kwargs):  # varied rewards, so every step has advantages
        return [float(len(c)) for c in completions]

    config = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(args.out), "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=preset["max_completion_length"],
        max_steps=preset["steps"],
        learning_rate=1e-3,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        ds3_gather_for_generation=True,
        deepspeed={
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        },
    )
    prompts = [f"{a} plus {b} is" for a in range(4) for b in range(4)]
    trainer = GRPOTrainer(
        model=args.model_dir,
        reward_funcs=length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        callbacks=[StepTimes()],
    )
    start = time.perf_counter()
    trainer.train()
    if dist.get_rank() == 0:
        starts = [start] + step_ends[:-1]
        with open(args.out, "w") as f:
            json.dump(
                {
                    "trl": trl.__version__,
                    "trl_file": trl.__file__,
                    "calls": calls,
                    "step_seconds": [end - begin for begin, end in zip(starts, step_ends)],
                },
                f,
            )
    dist.barrier()


def build_model(args) -> str:
    from trl.models.tiny import build_tiny_causal_lm
    from trl.tasks import arithmetic_corpus

    preset = PRESETS[args.preset]
    folder = args.model_dir or os.path.join(tempfile.gettempdir(), f"zero3-generation-{args.preset}")
    if not os.path.exists(os.path.join(folder, "config.json")):
        build_tiny_causal_lm(
            folder,
            corpus=arithmetic_corpus(),
            hidden_size=preset["hidden_size"],
            num_layers=preset["num_layers"],
        )
    return folder


def run(python: str, impl: str, args, model_dir: str, out_dir: str) -> dict:
    out = os.path.join(out_dir, impl, "result.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # each interpreter imports its own `trl`
    if impl == "ours":
        env["PYTHONPATH"] = ROOT
    command = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        os.path.abspath(__file__),
    ]
    command += ["--worker", "--preset", args.preset, "--model_dir", model_dir, "--out", out]
    done = subprocess.run(command, env=env, cwd=out_dir, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{impl} worker failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}")
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        worker(args)
        return
    impls = [impl.strip() for impl in args.impls.split(",")]
    upstream = args.upstream_python or (upstream_trl_python() if "upstream" in impls else None)
    sys.path.insert(0, ROOT)
    model_dir = build_model(args)
    preset = PRESETS[args.preset]
    results = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for impl in impls:
            results[impl] = run(sys.executable if impl == "ours" else upstream, impl, args, model_dir, out_dir)
    from transformers import AutoModelForCausalLM

    num_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    print(
        f"\nZeRO-3 (every parameter partitioned), 2 CPU processes (gloo), 1 torch thread each: Qwen2 "
        f"{preset['num_layers']} layers × hidden {preset['hidden_size']} ({num_params / 1e6:.2f}M parameters), 2 × 4 "
        "completions of ≤ "
        f"{preset['max_completion_length']} tokens per step, {preset['steps']} steps (the first dropped), rank 0\n"
    )
    print(
        "| implementation | generate s/step | collectives inside generate per step | step s | generate share of step |"
    )
    print("|---|---:|---|---:|---:|")
    for impl, r in results.items():
        calls, steps = r["calls"][1:], r["step_seconds"][1:]
        names = sorted({name for call in calls for name in call["collectives"]})
        per_step = ", ".join(
            f"{name} {statistics.median(call['collectives'].get(name, 0) for call in calls):g}" for name in names
        )
        generate_s, step_s = statistics.median(c["seconds"] for c in calls), statistics.median(steps)
        label = f"{impl} (trl {r['trl']})"
        print(f"| {label} | {generate_s:.3f} | {per_step or 'none'} | {step_s:.3f} | {generate_s / step_s:.0%} |")


if __name__ == "__main__":
    main()
