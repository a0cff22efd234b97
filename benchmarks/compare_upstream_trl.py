# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPO seconds/optimizer-step of this package against upstream TRL (PyPI `trl`), same config, same model, same CPU.

Upstream TRL must live in its own virtual environment so that the two `trl` packages never meet, e.g.

    python3 -m venv /tmp/trl-upstream
    /tmp/trl-upstream/bin/pip install torch==2.13.0          # pin torch: the CPU wheel, not a CUDA build
    /tmp/trl-upstream/bin/pip install trl transformers accelerate datasets

then, with the Python where this package is installed:

    python benchmarks/compare_upstream_trl.py                  # ~40 steps × 2 configs × 2 implementations × 3 repeats
    python benchmarks/compare_upstream_trl.py --upstream_python /path/to/venv/bin/python --steps 40 --repeats 3

The tiny model folder is built once (with `trl.models.tiny.build_tiny_causal_lm`) and loaded by both. Each run is a
fresh subprocess: ours under this interpreter, upstream's under `--upstream_python`. The worker (this same file, run
with `--worker`) imports nothing but `trl` (whichever the interpreter has), transformers, datasets and torch, and uses
only the public `GRPOConfig`/`GRPOTrainer` API; the dataset and the reward function are defined here, in plain Python.
Runs alternate ours/upstream within each repeat to spread machine noise over both.

Columns: the median over all kept steps of all runs (wall), their std, the best (lowest) per-run median, the per-run
medians, and the median process CPU time per step. On a machine shared with other work, the wall time of this tiny
model's many small ops is dominated by waiting for descheduled threads (10× swings between runs are possible); the
best-run median and the CPU time are then the more trustworthy comparisons.

Settings that cannot be made identical (the implementations differ, not the config):
- upstream always computes per-token entropies in the loss forward (for its logged metrics) and scores tokens with
  transformers' `fused_lm_head=True` forward; ours computes the full logits of the completion positions and a
  selective log-softmax. That is part of what is being compared.
- upstream's reference sync is a per-parameter `mul_/add_` loop; ours is `mix_tensors_` (also part of the comparison).
- upstream-only knobs are set to their "off"/plain values so that upstream does no extra work we do not do:
  `use_bias_correction_kl=False` (default True: multiplies the KL by the importance ratio), `use_vllm=False`,
  `use_transformers_continuous_batching=False`, `top_entropy_quantile=1.0`, `entropy_coef=0.0`,
  `use_adaptive_entropy=False`, `off_policy_mask_threshold=None`, `importance_sampling_level="token"`,
  `cast_lm_head_to_fp32=False`, `pad_to_multiple_of=None`, `delta=None`, `log_completions=False`.
  `vllm_importance_sampling_correction` only acts with vLLM, which is off.
- upstream's `gradient_checkpointing` defaults to True and `bf16` to True; both are set to False explicitly in both.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


HERE = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))

# Identical in both implementations. `output_dir`, `max_steps`, `sync_ref_model` are added per run.
COMMON = dict(
    per_device_train_batch_size=64,
    gradient_accumulation_steps=1,
    steps_per_generation=1,
    num_generations=8,  # 8 prompts × 8 completions per step
    max_completion_length=8,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=None,
    repetition_penalty=1.0,
    learning_rate=1e-3,
    lr_scheduler_type="linear",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
    beta=0.04,  # both load and score a reference model
    epsilon=0.2,
    epsilon_high=None,
    loss_type="dapo",
    scale_rewards="group",
    num_iterations=1,
    mask_truncated_completions=False,
    ref_model_mixup_alpha=0.6,
    ref_model_sync_steps=1,
    disable_dropout=False,
    shuffle_dataset=True,
    remove_unused_columns=False,
    log_completions=False,
    use_cpu=True,
    bf16=False,
    fp16=False,
    gradient_checkpointing=False,
    torch_compile=False,
    logging_steps=10_000,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    dataloader_num_workers=0,
    seed=0,
    data_seed=0,
    model_init_kwargs={"dtype": "float32"},
)
OURS_ONLY = {}  # ours-only fields keep their defaults (max_prompt_length=None: whole prompts, as upstream)
UPSTREAM_ONLY = dict(
    use_vllm=False,
    use_transformers_continuous_batching=False,
    use_bias_correction_kl=False,
    importance_sampling_level="token",
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
    use_adaptive_entropy=False,
    off_policy_mask_threshold=None,
    delta=None,
    cast_lm_head_to_fp32=False,
    pad_to_multiple_of=None,
    multi_objective_aggregation="sum_then_normalize",
)


# ----------------------------------------------------------------------------------------------------------- worker


def _worker(args) -> None:
    """Runs under either interpreter: trains `args.steps` steps and writes the step times as JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import random
    import re

    import torch

    torch.set_num_threads(args.threads)
    import datasets
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    import trl
    from trl import GRPOConfig, GRPOTrainer  # ours or upstream, whichever this interpreter has

    trl_path = os.path.dirname(os.path.abspath(trl.__file__))
    expected = os.path.join(REPO_ROOT, "trl") if args.worker == "ours" else os.path.realpath(sys.prefix)
    if not os.path.realpath(trl_path).startswith(os.path.realpath(expected)):
        raise RuntimeError(f"--worker {args.worker} imported trl from {trl_path}, expected it under {expected}.")

    rng = random.Random(0)
    rows = {"prompt": [], "answer": []}
    for _ in range(4096):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows["prompt"].append(f"{a}+{b}=")
        rows["answer"].append(str(a + b))
    dataset = Dataset.from_dict(rows)
    first_int = re.compile(r"\s*(\d+)")

    def digit_reward(completions, answer, **kwargs):
        """1 − |n − answer| / 10 (floored at 0) for the integer n the completion starts with, else 0."""
        out = []
        for completion, expected in zip(completions, answer):
            m = first_int.match(completion if isinstance(completion, str) else completion[-1]["content"])
            out.append(max(0.0, 1.0 - abs(int(m.group(1)[:6]) - int(expected)) / 10.0) if m else 0.0)
        return out

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.cpu_times, self._start, self._cpu_start = [], [], None, None

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)
            self.cpu_times.append(time.process_time() - self._cpu_start)

    kwargs = dict(COMMON)
    kwargs.update(OURS_ONLY if args.worker == "ours" else UPSTREAM_ONLY)
    kwargs.update(output_dir=tempfile.mkdtemp(), max_steps=args.steps, sync_ref_model=bool(args.sync))
    config = GRPOConfig(**kwargs)
    trainer = GRPOTrainer(model=args.model_dir, reward_funcs=[digit_reward], args=config, train_dataset=dataset)
    timer = StepTimer()
    trainer.add_callback(timer)  # after the trainer's own callbacks: the reference sync (on_step_end) is timed
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    result = dict(
        impl=args.worker,
        trl_version=trl.__version__,
        trl_path=trl_path,
        torch=torch.__version__,
        transformers=transformers.__version__,
        datasets=datasets.__version__,
        threads=torch.get_num_threads(),
        sync=bool(args.sync),
        times=timer.times,
        cpu_times=timer.cpu_times,
    )
    with open(args.out, "w") as f:
        json.dump(result, f)


# ----------------------------------------------------------------------------------------------------- orchestrator


def _run_worker(python: str, impl: str, model_dir: str, steps: int, sync: bool, threads: int) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("PYTHONPATH", None)  # never let upstream's interpreter see our `trl`
    if impl == "ours":  # this checkout, even if the editable install of `trl` points at another one
        env["PYTHONPATH"] = REPO_ROOT
    cmd = [
        python,
        HERE,
        "--worker",
        impl,
        "--model_dir",
        model_dir,
        "--steps",
        str(steps),
        "--sync",
        str(int(sync)),
        "--threads",
        str(threads),
        "--out",
        out,
    ]
    # cwd outside the repository, so that upstream's interpreter cannot find our `trl` through the current directory
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{impl} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream_python", default="/tmp/trl-upstream/bin/python")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps dropped from the start of every run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--configs", default="none,every", help="comma-separated: none (no sync), every (sync each step)"
    )
    parser.add_argument("--json", default=None, help="also write every step time here")
    parser.add_argument("--worker", choices=["ours", "upstream"], help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    parser.add_argument("--sync", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)

    if not os.path.exists(args.upstream_python):
        raise SystemExit(f"{args.upstream_python} not found: create the upstream venv first (see the docstring).")
    sys.path.insert(0, REPO_ROOT)  # this checkout's `trl`
    from trl.models.tiny import build_tiny_causal_lm
    from trl.tasks import arithmetic_corpus

    model_dir = build_tiny_causal_lm(
        tempfile.mkdtemp(prefix="tiny-qwen2-"), corpus=arithmetic_corpus(), hidden_size=64, num_layers=2
    )
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    runs = {(impl, c): [] for impl in ("ours", "upstream") for c in configs}
    cpu_runs = {(impl, c): [] for impl in ("ours", "upstream") for c in configs}
    meta = {}
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        for c in configs:
            order = ("ours", "upstream") if rep % 2 == 0 else ("upstream", "ours")
            for impl in order:
                python = sys.executable if impl == "ours" else args.upstream_python
                start = time.perf_counter()
                r = _run_worker(python, impl, model_dir, args.steps, c == "every", args.threads)
                kept = r["times"][args.warmup :]
                runs[(impl, c)].append(kept)
                cpu_runs[(impl, c)].append(r["cpu_times"][args.warmup :])
                meta[impl] = r
                print(
                    f"repeat {rep + 1}/{args.repeats} sync={c:<5} {impl:<8} median {statistics.median(kept):.4f} s/step "
                    f"({len(kept)} steps kept, run {time.perf_counter() - start:.0f} s)",
                    flush=True,
                )

    load_after = os.getloadavg()
    m = meta["ours"]
    print(
        f"\nGRPO step, tiny Qwen2 (64-wide, 2 layers), fp32, CPU, {m['threads']} threads, 64 completions/step "
        f"(8 prompts × 8), max_completion_length 8, beta 0.04, loss dapo; {args.steps} steps/run, first "
        f"{args.warmup} dropped, {args.repeats} runs/implementation/config, alternating order"
    )
    for impl in ("ours", "upstream"):
        r = meta[impl]
        print(
            f"- {impl}: trl {r['trl_version']} ({r['trl_path']}), torch {r['torch']}, transformers {r['transformers']}, "
            f"datasets {r['datasets']}"
        )
    print(
        f"- load average (1 min) before/after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} CPUs. Wall "
        "times of small CPU ops balloon when other processes compete for the cores (thread hand-offs wait for a "
        "descheduled thread), so on a busy machine trust 'best run' and 'CPU s/step' more than the pooled median."
    )
    print()
    print(
        "| implementation | version | ref sync | s/step median | std | best run median | per-run medians | CPU s/step median "
        "| ratio ours/upstream (median, best run, CPU) |"
    )
    print("|---|---|---|---:|---:|---:|---|---:|---:|")
    for c in configs:
        stats = {}
        for impl in ("ours", "upstream"):
            pooled = [t for run in runs[(impl, c)] for t in run]
            cpu = [t for run in cpu_runs[(impl, c)] for t in run]
            medians = [statistics.median(run) for run in runs[(impl, c)]]
            stats[impl] = dict(
                median=statistics.median(pooled),
                std=statistics.pstdev(pooled),
                best=min(medians),
                per_run=", ".join(f"{x:.4f}" for x in medians),
                cpu=statistics.median(cpu),
            )
        for impl in ("ours", "upstream"):
            s = stats[impl]
            if impl == "ours":
                u = stats["upstream"]
                ratio = f"{s['median'] / u['median']:.2f}, {s['best'] / u['best']:.2f}, {s['cpu'] / u['cpu']:.2f}"
            else:
                ratio = "1, 1, 1"
            label = "every step" if c == "every" else "none"
            print(
                f"| {impl} | {meta[impl]['trl_version']} | {label} | {s['median']:.4f} | {s['std']:.4f} | {s['best']:.4f} "
                f"| {s['per_run']} | {s['cpu']:.4f} | {ratio} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "wall": {f"{impl}/{c}": v for (impl, c), v in runs.items()},
                    "cpu": {f"{impl}/{c}": v for (impl, c), v in cpu_runs.items()},
                },
                f,
            )


if __name__ == "__main__":
    main()
