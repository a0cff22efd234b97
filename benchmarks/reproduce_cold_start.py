# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reproduction: when does iterative GRPO (reference sync) help a cold-start model learn a skill?

The task and every setting are the demo's (examples/iterative_grpo_demo.py: echo a digit, "7=" → "7", reward 1 for
the right digit, from a randomly initialised tiny Qwen2). Three arms: a fixed reference (`sync_ref_model=False`), a
hard sync (α = 1) and a soft sync (α < 1), both every τ optimizer steps; each over several seeds (a seed sets the
model initialisation, the prompts and their order), several KL coefficients β, with and without
`use_bias_correction_kl`. Prints a markdown table of mean ± std over seeds of the final accuracy and KL (each a run's
mean over the last `--final_fraction` of its steps), writes every per-step curve to `<output_dir>/results.json` and
plots the mean accuracy curves with ±std bands, one panel per (β, correction).

    python benchmarks/reproduce_cold_start.py                 # 60 runs: ~4 min on 2 idle CPU cores, 9-14 busy
    python benchmarks/reproduce_cold_start.py --seeds 0 --betas 0.5 --corrections true --max_steps 50 --plot ''
    python benchmarks/reproduce_cold_start.py --smoke --output_dir /tmp/smoke    # 3 runs of 2 steps, in-process

With `--smoke` the figure goes to `<output_dir>/iterative_grpo_cold_start.png` unless `--plot` is given.
"""

import argparse
import importlib.util
import math
import os
import sys
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

from _reproduction import mean_std, quiet_transformers, run_jobs, save_figure, tail_mean, write_results  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from transformers import PrinterCallback  # noqa: E402

from trl import GRPOTrainer  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import accuracy_reward, arithmetic_corpus, best_constant_accuracy, make_echo_dataset  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PLOT = os.path.join(ROOT, "docs", "source", "imgs", "iterative_grpo_cold_start.png")
ACCURACY = "rewards/accuracy_reward/mean"
CURVES = (ACCURACY, "kl")
ARMS = ("fixed", "hard", "soft")
# `--smoke`: every arm once, one seed, one (β, correction), 2 steps with a sync after each, in this process
SMOKE = dict(seeds=[0], betas=[0.5], corrections=[True], max_steps=2, sync_steps=1, workers=1)


def load_demo():
    """examples/iterative_grpo_demo.py as a module: its `demo_config` is the single source of the settings."""
    spec = importlib.util.spec_from_file_location(
        "iterative_grpo_demo", os.path.join(ROOT, "examples", "iterative_grpo_demo.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def str_to_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="reproduction_output", help="raw results JSON and the tiny models")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help="where to save the figure ('' to skip)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument(
        "--corrections", type=str_to_bool, nargs="+", default=[True, False], help="use_bias_correction_kl"
    )
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--sync_steps", type=int, default=25, help="τ of both sync arms")
    parser.add_argument("--soft_alpha", type=float, default=0.6, help="α of the soft-sync arm")
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--final_fraction", type=float, default=0.1, help="share of the last steps averaged")
    parser.add_argument(
        "--workers", type=int, default=2, help="runs in parallel, one torch thread each; 1 runs them in this process"
    )
    args = parse_args_with_smoke(parser, SMOKE, argv)
    if args.smoke and args.plot == DEFAULT_PLOT:  # a smoke run never replaces the documentation's figure
        args.plot = os.path.join(args.output_dir, os.path.basename(DEFAULT_PLOT))
    return args


def arm_alpha(arm: str, args) -> float | None:
    return {"fixed": None, "hard": 1.0, "soft": args.soft_alpha}[arm]


def model_dir(seed: int, args) -> str:
    return os.path.join(args.output_dir, "models", f"seed{seed}")


def run_one(arm: str, beta: float, correction: bool, seed: int, args) -> dict:
    """Train one arm for one (β, correction, seed) in a worker process (one torch thread); return its curves."""
    import torch

    torch.set_num_threads(1)
    quiet_transformers()
    config = load_demo().demo_config(
        os.path.join(args.output_dir, "runs", f"{arm}_beta{beta}_corr{int(correction)}_seed{seed}"),
        beta=beta,
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        seed=seed,
        alpha=arm_alpha(arm, args),
        sync_steps=args.sync_steps,
        use_bias_correction_kl=correction,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model_dir(seed, args),
        reward_funcs=accuracy_reward,
        args=config,
        train_dataset=make_echo_dataset(1000, seed=seed),
    )
    trainer.remove_callback(PrinterCallback)
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {
        "arm": arm,
        "beta": beta,
        "correction": correction,
        "seed": seed,
        "steps": [h["step"] for h in history],
        **{key: [h[key] for h in history] for key in CURVES},
        "num_syncs": trainer.sync_callback.num_syncs if trainer.sync_callback is not None else 0,
        "train_seconds": round(seconds, 1),
    }


def arm_label(arm: str, args) -> str:
    if arm == "fixed":
        return "fixed reference"
    if arm == "hard":
        return f"hard sync (α=1, τ={args.sync_steps})"
    return f"soft sync (α={args.soft_alpha}, τ={args.sync_steps})"


def groups(args):
    return [(beta, correction) for beta in args.betas for correction in args.corrections]


def summarise(runs: list[dict], args) -> tuple[dict, str]:
    """Per (β, correction, arm): mean and std over seeds of the tail means, the per-seed values; the markdown table."""
    summary = {}
    lines = [
        f"| β | KL correction | arm | final accuracy (n={len(args.seeds)}) | final KL | accuracy per seed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for beta, correction in groups(args):
        for arm in args.arms:
            arm_runs = [r for r in runs if (r["arm"], r["beta"], r["correction"]) == (arm, beta, correction)]
            tails = {key: [tail_mean(r[key], args.final_fraction) for r in arm_runs] for key in CURVES}
            key = f"beta={beta},correction={correction},arm={arm}"
            summary[key] = {name: mean_std(values) for name, values in tails.items()}
            summary[key]["accuracy_per_seed"] = tails[ACCURACY]
            (acc, acc_std), (kl, kl_std) = summary[key][ACCURACY], summary[key]["kl"]
            lines.append(
                f"| {beta} | {'on' if correction else 'off'} | {arm_label(arm, args)} | {acc:.3f} ± {acc_std:.3f} | "
                f"{kl:.3f} ± {kl_std:.3f} | {', '.join(f'{v:.2f}' for v in tails[ACCURACY])} |"
            )
    chance = best_constant_accuracy(make_echo_dataset(1000, seed=args.seeds[0])["answer"])
    lines.append("")
    lines.append(
        f"{args.max_steps} steps; mean ± std over seeds {args.seeds} of each run's mean over its last "
        f"{round(100 * args.final_fraction)}% of steps. Reward = accuracy (1 for the right digit); a policy that "
        f"ignores the prompt scores at most {chance:.2f}."
    )
    return summary, "\n".join(lines)


def plot(runs: list[dict], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = groups(args)
    ncols = len(args.corrections)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.4 * nrows), sharex=True, sharey=True, squeeze=False)
    chance = best_constant_accuracy(make_echo_dataset(1000, seed=args.seeds[0])["answer"])
    for ax, (beta, correction) in zip(axes.flat, panels):
        for arm, color in zip(args.arms, ("tab:grey", "tab:blue", "tab:orange")):
            arm_runs = [r for r in runs if (r["arm"], r["beta"], r["correction"]) == (arm, beta, correction)]
            steps = np.array(arm_runs[0]["steps"])
            window = min(10, len(steps))  # trailing 10-step moving average so the bands are readable
            kernel = np.ones(window) / window
            curves = np.array([np.convolve(r[ACCURACY], kernel, mode="valid") for r in arm_runs])
            mean = curves.mean(0)
            std = curves.std(0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
            x = steps[window - 1 :]
            ax.plot(x, mean, color=color, label=arm_label(arm, args))
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
        ax.axhline(chance, color="black", linestyle=":", linewidth=0.8, label=f"prompt-blind best ({chance:.2f})")
        ax.set_title(f"β={beta}, KL correction {'on' if correction else 'off'}", fontsize=10)
        ax.set_ylim(-0.02, 1.02)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    for ax in axes[-1, :]:
        ax.set_xlabel("optimizer step")
    axes.flat[0].legend(loc="upper left", fontsize=7)
    save_figure(
        fig,
        path,
        f'Cold-start tiny Qwen2 echoing a digit ("7=" → "7"): mean ± std over {len(args.seeds)} seeds '
        "(trailing 10-step mean)",
        dpi=100,
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet_transformers()
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    for seed in args.seeds:  # the same initial model for every run of a seed
        build_tiny_causal_lm(model_dir(seed, args), corpus=arithmetic_corpus(), seed=seed)
    jobs = [
        (arm, beta, correction, seed) for seed in args.seeds for beta, correction in groups(args) for arm in args.arms
    ]

    def report(run, done, total):
        print(
            f"[{time.time() - start:6.0f} s] {done:>3}/{total} β={run['beta']} correction "
            f"{'on ' if run['correction'] else 'off'} {run['arm']:>5} seed {run['seed']}: final accuracy "
            f"{tail_mean(run[ACCURACY], args.final_fraction):.3f}, KL {tail_mean(run['kl'], args.final_fraction):.3f} "
            f"({run['train_seconds']} s)",
            flush=True,
        )

    runs = run_jobs(run_one, jobs, args, report)
    runs.sort(key=lambda r: (r["beta"], not r["correction"], args.arms.index(r["arm"]), r["seed"]))
    summary, table = summarise(runs, args)
    wall = time.time() - start
    print("\n" + table)
    print(f"\ntotal wall time: {wall:.0f} s")
    results = {"args": vars(args), "summary": summary, "table": table, "wall_seconds": round(wall, 1), "runs": runs}
    write_results(results, args.output_dir)
    if args.plot:
        plot(runs, args, args.plot)
        print(f"plot: {args.plot}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
