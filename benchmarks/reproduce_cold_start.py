# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reproduction: does iterative GRPO (reference sync) help a cold-start model when the KL penalty is strong?

Three arms on the embedded single-digit addition task, from a randomly initialised tiny Qwen2, with a high `beta`:
a fixed reference (`sync_ref_model=False`), a hard sync (α = 1) and a soft sync (α < 1), both syncs every τ
optimizer steps. Each arm runs for the same number of steps over several seeds; a seed sets the model init, the
dataset and the prompt order. Prints a markdown table of mean ± std over seeds of the final reward, accuracy and KL
(each averaged over the last `--final_fraction` of the steps), writes the raw per-step curves to
`<output_dir>/results.json` and plots mean curves with ±std bands.

    python benchmarks/reproduce_cold_start.py                 # ~4-5 minutes on 2 idle CPU cores
    python benchmarks/reproduce_cold_start.py --seeds 0 --max_steps 50 --plot /tmp/p.png   # smoke run
"""

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import sys
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import accuracy_reward, arithmetic_corpus, closeness_reward, make_arithmetic_dataset  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PLOT = os.path.join(ROOT, "docs", "source", "imgs", "iterative_grpo_cold_start.png")
CURVES = ("reward", "rewards/accuracy_reward/mean", "kl")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="reproduction_output", help="raw results JSON and the tiny models")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help="where to save the figure ('' to skip)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["fixed", "hard", "soft"], choices=["fixed", "hard", "soft"])
    parser.add_argument("--max_steps", type=int, default=600)
    parser.add_argument("--beta", type=float, default=0.5, help="KL coefficient, high on purpose")
    parser.add_argument("--sync_steps", type=int, default=25, help="τ of both sync arms")
    parser.add_argument("--soft_alpha", type=float, default=0.6, help="α of the soft-sync arm")
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--final_fraction", type=float, default=0.1, help="share of the last steps averaged")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel, one torch thread each")
    return parser.parse_args(argv)


def arm_settings(arm: str, args) -> dict:
    if arm == "fixed":
        return {"sync_ref_model": False}
    alpha = 1.0 if arm == "hard" else args.soft_alpha
    return {"sync_ref_model": True, "ref_model_mixup_alpha": alpha, "ref_model_sync_steps": args.sync_steps}


def model_dir(seed: int, args) -> str:
    return os.path.join(args.output_dir, "models", f"seed{seed}")


def run_one(arm: str, seed: int, args) -> dict:
    """Train one arm for one seed (in a worker process, one torch thread); return its per-step curves."""
    import torch

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    config = GRPOConfig(
        output_dir=os.path.join(args.output_dir, "runs", f"{arm}_seed{seed}"),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=4,
        learning_rate=args.learning_rate,
        beta=args.beta,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
        **arm_settings(arm, args),
    )
    trainer = GRPOTrainer(
        model=model_dir(seed, args),
        reward_funcs=[closeness_reward, accuracy_reward],
        args=config,
        train_dataset=make_arithmetic_dataset(4096, seed=seed),
    )
    trainer.remove_callback(PrinterCallback)
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {
        "arm": arm,
        "seed": seed,
        "steps": [h["step"] for h in history],
        **{key: [h[key] for h in history] for key in CURVES},
        "num_syncs": trainer.sync_callback.num_syncs if trainer.sync_callback is not None else 0,
        "train_seconds": round(seconds, 1),
    }


def best_constant_answer(max_operand: int = 9) -> tuple[float, int]:
    """Expected reward of the best single answer given to every prompt (a policy that ignores the prompt)."""
    sums = [str(a + b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    best = []
    for guess in range(2 * max_operand + 1):
        completions = [str(guess)] * len(sums)
        total = sum(closeness_reward(completions, sums)) + sum(accuracy_reward(completions, sums))
        best.append((total / len(sums), guess))
    return max(best)


def tail_mean(values: list[float], fraction: float) -> float:
    n = max(1, math.ceil(len(values) * fraction))
    return sum(values[-n:]) / n


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def arm_label(arm: str, args) -> str:
    if arm == "fixed":
        return "fixed reference"
    if arm == "hard":
        return f"hard sync (α=1, τ={args.sync_steps})"
    return f"soft sync (α={args.soft_alpha}, τ={args.sync_steps})"


def summarise(runs: list[dict], args) -> tuple[dict, str]:
    """Per arm: mean and std over seeds of the tail means; and the markdown table."""
    summary = {}
    for arm in args.arms:
        arm_runs = [r for r in runs if r["arm"] == arm]
        summary[arm] = {key: mean_std([tail_mean(r[key], args.final_fraction) for r in arm_runs]) for key in CURVES}
    pct = round(100 * args.final_fraction)
    lines = [
        f"| arm (β={args.beta}, {args.max_steps} steps, {len(args.seeds)} seeds) | final reward | final accuracy | final KL |",
        "| --- | --- | --- | --- |",
    ]
    for arm in args.arms:
        s = summary[arm]
        lines.append(
            f"| {arm_label(arm, args)} | {s['reward'][0]:.3f} ± {s['reward'][1]:.3f} | "
            f"{s['rewards/accuracy_reward/mean'][0]:.3f} ± {s['rewards/accuracy_reward/mean'][1]:.3f} | "
            f"{s['kl'][0]:.4f} ± {s['kl'][1]:.4f} |"
        )
    lines.append("")
    best_reward, best_answer = best_constant_answer()
    lines.append(
        f"Mean ± std over seeds {args.seeds} of each run's mean over its last {pct}% of steps. "
        "Reward = closeness_reward + accuracy_reward (max 2); always answering "
        f'"{best_answer}" scores {best_reward:.3f} (accuracy 0.100).'
    )
    return summary, "\n".join(lines)


def plot(runs: list[dict], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_reward, ax_kl) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for arm, color in zip(args.arms, ("tab:grey", "tab:blue", "tab:orange")):
        arm_runs = [r for r in runs if r["arm"] == arm]
        steps = np.array(arm_runs[0]["steps"])
        for ax, key in ((ax_reward, "reward"), (ax_kl, "kl")):
            curves = np.array([r[key] for r in arm_runs])
            # light smoothing (trailing moving average over 10 steps) so the bands are readable
            window = min(10, curves.shape[1])
            kernel = np.ones(window) / window
            curves = np.array([np.convolve(c, kernel, mode="valid") for c in curves])
            mean, std = curves.mean(0), curves.std(0, ddof=1) if len(curves) > 1 else np.zeros(curves.shape[1])
            x = steps[window - 1 :]
            ax.plot(x, mean, color=color, label=arm_label(arm, args))
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
    best_reward, best_answer = best_constant_answer()
    ax_reward.axhline(
        best_reward,
        color="black",
        linestyle=":",
        linewidth=0.8,
        label=f'always answering "{best_answer}" ({best_reward:.2f})',
    )
    ax_reward.set_ylabel("reward (closeness + accuracy)")
    ax_kl.set_ylabel("KL(policy ‖ reference), k3")
    ax_kl.set_xlabel("optimizer step")
    ax_reward.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"Cold-start tiny Qwen2, single-digit addition, β={args.beta}: mean ± std over {len(args.seeds)} seeds\n"
        "(trailing 10-step moving average)",
        fontsize=10,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    for seed in args.seeds:  # same initial model for every arm of a seed
        build_tiny_causal_lm(model_dir(seed, args), corpus=arithmetic_corpus(), seed=seed)
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    runs = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_one, arm, seed, args) for arm, seed in jobs]
        for future in concurrent.futures.as_completed(futures):
            run = future.result()
            runs.append(run)
            arm, seed = run["arm"], run["seed"]
            print(
                f"[{time.time() - start:6.0f} s] {arm:>5} seed {seed}: final reward "
                f"{tail_mean(run['reward'], args.final_fraction):.3f}, accuracy "
                f"{tail_mean(run['rewards/accuracy_reward/mean'], args.final_fraction):.3f}, KL "
                f"{tail_mean(run['kl'], args.final_fraction):.4f} ({run['train_seconds']} s)",
                flush=True,
            )
    runs.sort(key=lambda r: (args.seeds.index(r["seed"]), args.arms.index(r["arm"])))
    summary, table = summarise(runs, args)
    wall = time.time() - start
    print("\n" + table)
    print(f"\ntotal wall time: {wall:.0f} s")
    results = {"args": vars(args), "summary": summary, "table": table, "wall_seconds": round(wall, 1), "runs": runs}
    path = os.path.join(args.output_dir, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"raw results: {path}")
    if args.plot:
        plot(runs, args, args.plot)
        print(f"plot: {args.plot}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
