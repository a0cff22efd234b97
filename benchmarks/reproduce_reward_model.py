# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reproduction: a frozen reward model against one refreshed with replay (Algorithm 1 of arXiv 2402.03300).

On the embedded single-digit addition task, for each seed: a random tiny Qwen2 policy samples completions; a tiny
sequence-classification reward model is fitted (pointwise BCE) to their *true* reward, `true_reward` (in [0, 1]);
then GRPO trains the policy on the reward model's score alone, with the reward model either (a) frozen or (b)
refreshed every `--update_steps` optimizer steps on the policy's new completions, labelled by `true_reward`,
with `--replay_ratio` replay. The true reward and the reward model's own prediction of it, σ(score), are logged on
every batch (as zero-weight reward functions, so they do not train the policy). Prints a markdown table of mean ±
std over seeds (each run's mean over its last `--final_fraction` of steps), writes the per-step curves to
`<output_dir>/results.json` and plots them.

    python benchmarks/reproduce_reward_model.py              # a few minutes on 2 CPU cores
    python benchmarks/reproduce_reward_model.py --seeds 0 --max_steps 20 --plot ''   # a short run
    python benchmarks/reproduce_reward_model.py --smoke --output_dir /tmp/smoke      # 1 seed, 2 steps, 1 worker

With `--smoke` the figure goes to `<output_dir>/reward_model_refresh.png` unless `--plot` is given.
"""

import argparse
import concurrent.futures
import json
import os
import re
import sys
import time
from collections import defaultdict
from types import SimpleNamespace


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

from _reproduction import mean_std, quiet_transformers, save_figure, tail_mean  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from transformers import PrinterCallback  # noqa: E402

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm, build_tiny_reward_model  # noqa: E402
from trl.tasks import arithmetic_corpus, make_arithmetic_dataset  # noqa: E402
from trl.trainer.reward_model_refresh import RewardModelRefresh, score_examples  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PLOT = os.path.join(ROOT, "docs", "source", "imgs", "reward_model_refresh.png")
TRUE, PREDICTED = "rewards/true_reward/mean", "rewards/predicted_reward/mean"
ARMS = ("frozen", "refreshed")
_INTEGER = re.compile(r"\d+")
# `--smoke`: one seed, the reward model fitted on 4 prompts × 8 samples for one epoch, 2 steps with a refresh after each
SMOKE = dict(seeds=[0], max_steps=2, fit_prompts=4, fit_epochs=1, update_steps=1, workers=1)


def true_reward(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """The true reward (and label): max(0, 1 − |n − answer| / 10) for the first integer n anywhere in the
    completion, 0.0 when there is none. A random tiny policy writes an integer in about one completion in eight."""
    rewards = []
    for completion, expected in zip(completions, answer):
        match = _INTEGER.search(completion)
        rewards.append(max(0.0, 1.0 - abs(int(match.group(0)) - int(expected)) / 10.0) if match else 0.0)
    return rewards


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="reproduction_output/reward_model", help="results JSON and models")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help="where to save the figure ('' to skip)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--max_steps", type=int, default=120)
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="policy learning rate")
    parser.add_argument("--fit_prompts", type=int, default=32, help="prompts × 8 initial samples to fit the RM on")
    parser.add_argument("--fit_epochs", type=int, default=20)
    parser.add_argument("--rm_learning_rate", type=float, default=1e-3)
    parser.add_argument("--update_steps", type=int, default=10, help="M: refresh every M optimizer steps")
    parser.add_argument("--replay_ratio", type=float, default=0.1)
    parser.add_argument("--final_fraction", type=float, default=0.2, help="share of the last steps averaged")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel, one torch thread each")
    args = parse_args_with_smoke(parser, SMOKE, argv)
    if args.smoke and args.plot == DEFAULT_PLOT:  # a smoke run never replaces the documentation's figure
        args.plot = os.path.join(args.output_dir, os.path.basename(DEFAULT_PLOT))
    return args


def paths(seed: int, args) -> tuple[str, str]:
    base = os.path.join(args.output_dir, "models", f"seed{seed}")
    return os.path.join(base, "policy"), os.path.join(base, "rm")


def fit_reward_model(seed: int, args) -> dict:
    """Sample 8 completions for each of `fit_prompts` prompts from the initial policy, label them with the true
    reward and fit the reward model to them (the refresher's own update, `fit_epochs` passes, no replay)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(1)
    policy_dir, rm_dir = paths(seed, args)
    build_tiny_causal_lm(policy_dir, corpus=arithmetic_corpus(), seed=seed)
    build_tiny_reward_model(rm_dir, policy_dir, seed=seed + 1000)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    data = make_arithmetic_dataset(args.fit_prompts, seed=10_000 + seed)  # not the training prompts
    prompts = [p for p in data["prompt"] for _ in range(8)]
    answers = [a for a in data["answer"] for _ in range(8)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = policy.generate(**encoded, do_sample=True, max_new_tokens=4, pad_token_id=tokenizer.pad_token_id)
    completions = tokenizer.batch_decode(out[:, encoded["input_ids"].size(1) :], skip_special_tokens=True)

    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval().requires_grad_(False)
    rm.config.pad_token_id = tokenizer.pad_token_id
    config = GRPOConfig(
        output_dir=os.path.join(args.output_dir, "fit"),
        use_cpu=True,
        report_to="none",
        num_generations=8,
        seed=seed,
        reward_model_update_steps=1,
        reward_model_replay_ratio=0.0,
        reward_model_learning_rate=args.rm_learning_rate,
        reward_model_num_epochs=args.fit_epochs,
        reward_model_batch_size=32,
    )
    metrics = defaultdict(list)
    refresh = RewardModelRefresh(
        [("rm", rm, tokenizer)], true_reward, config, SimpleNamespace(num_processes=1), metrics
    )
    inputs = [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)]
    refresh.collect(inputs, prompts, completions, [[]] * len(prompts), trainer_state=None)
    examples = [e for unit in refresh.pending for e in unit]
    refresh.update(global_step=0)
    with torch.no_grad():
        predicted = torch.sigmoid(score_examples(rm, tokenizer, examples))
    labels = torch.tensor([e["label"] for e in examples])
    rm.save_pretrained(rm_dir)
    return {
        "seed": seed,
        "fit_examples": len(examples),
        "fit_true_reward": labels.mean().item(),
        "fit_predicted_reward": predicted.mean().item(),
        "fit_mae": (predicted - labels).abs().mean().item(),
    }


def run_one(arm: str, seed: int, args) -> dict:
    """Train one arm for one seed (in a worker process, one torch thread); return its per-step curves."""
    import torch

    torch.set_num_threads(1)
    quiet_transformers()
    policy_dir, rm_dir = paths(seed, args)
    refresh = {}
    if arm == "refreshed":
        refresh = dict(
            reward_model_update_steps=args.update_steps,
            reward_model_replay_ratio=args.replay_ratio,
            reward_model_learning_rate=args.rm_learning_rate,
            reward_model_batch_size=32,
        )
    config = GRPOConfig(
        output_dir=os.path.join(args.output_dir, "runs", f"{arm}_seed{seed}"),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=4,
        learning_rate=args.learning_rate,
        beta=0.0,
        reward_weights=[1.0, 0.0, 0.0],  # the policy sees the reward model's score only
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
        **refresh,
    )
    holder = {}

    def predicted_reward(prompts, completions, **kwargs):
        """σ(score) of the reward model as it is now: its prediction of the true reward (labels are in [0, 1])."""
        _, model, tokenizer = holder["rm"]
        examples = [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)]
        with torch.no_grad():
            return torch.sigmoid(score_examples(model, tokenizer, examples)).tolist()

    trainer = GRPOTrainer(
        model=policy_dir,
        reward_funcs=[rm_dir, true_reward, predicted_reward],
        args=config,
        train_dataset=make_arithmetic_dataset(4096, seed=seed),
        reward_model_label_func=true_reward if arm == "refreshed" else None,
    )
    holder["rm"] = ("rm", trainer.reward_funcs[0], trainer.reward_processing_classes[0])
    trainer.remove_callback(PrinterCallback)
    start = time.time()
    trainer.train()
    history = [h for h in trainer.state.log_history if TRUE in h]
    refresher = trainer.reward_model_refresh
    return {
        "arm": arm,
        "seed": seed,
        "steps": [h["step"] for h in history],
        "true": [h[TRUE] for h in history],
        "predicted": [h[PREDICTED] for h in history],
        "rm_accuracy_before_update": [
            h["reward_model/rm/accuracy"] for h in history if "reward_model/rm/accuracy" in h
        ],
        "num_updates": refresher.num_updates if refresher is not None else 0,
        "train_seconds": round(time.time() - start, 1),
    }


def summarise(runs: list[dict], fits: list[dict], args) -> tuple[dict, str]:
    summary = {}
    for arm in ARMS:
        arm_runs = [r for r in runs if r["arm"] == arm]
        tails = {key: [tail_mean(r[key], args.final_fraction) for r in arm_runs] for key in ("true", "predicted")}
        tails["gap"] = [p - t for p, t in zip(tails["predicted"], tails["true"])]
        first = {key: [r[key][0] for r in arm_runs] for key in ("true", "predicted")}
        summary[arm] = {
            **{key: mean_std(v) for key, v in tails.items()},
            **{f"initial_{key}": mean_std(v) for key, v in first.items()},
        }
    pct = round(100 * args.final_fraction)
    lines = [
        f"| reward model ({args.max_steps} steps, {len(args.seeds)} seeds) | true reward, step 1 | final true reward "
        "| final RM prediction σ(score) | final gap (prediction − true) |",
        "| --- | --- | --- | --- | --- |",
    ]
    names = {
        "frozen": "(a) frozen",
        "refreshed": f"(b) refreshed every {args.update_steps} steps, {args.replay_ratio:.0%} replay",
    }
    for arm in ARMS:
        s = summary[arm]
        lines.append(
            f"| {names[arm]} | {s['initial_true'][0]:.3f} ± {s['initial_true'][1]:.3f} | {s['true'][0]:.3f} ± "
            f"{s['true'][1]:.3f} | {s['predicted'][0]:.3f} ± {s['predicted'][1]:.3f} | {s['gap'][0]:+.3f} ± "
            f"{s['gap'][1]:.3f} |"
        )
    fit_mae = mean_std([f["fit_mae"] for f in fits])
    lines += [
        "",
        f"Mean ± std over seeds {args.seeds} of each run's mean over its last {pct}% of steps. True reward = "
        f"true_reward in [0, 1]. The reward model was first fitted on {fits[0]['fit_examples']} samples of the "
        f"initial policy (mean absolute error of σ(score) there: {fit_mae[0]:.3f} ± {fit_mae[1]:.3f}).",
    ]
    return summary, "\n".join(lines)


def plot(runs: list[dict], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, arm in zip(axes, ARMS):
        arm_runs = [r for r in runs if r["arm"] == arm]
        steps = np.array(arm_runs[0]["steps"])
        for key, color, label in (
            ("true", "tab:green", "true reward"),
            ("predicted", "tab:red", "RM prediction σ(score)"),
        ):
            curves = np.array([r[key] for r in arm_runs])
            window = min(5, curves.shape[1])
            kernel = np.ones(window) / window
            curves = np.array([np.convolve(c, kernel, mode="valid") for c in curves])
            mean, std = curves.mean(0), curves.std(0, ddof=1) if len(curves) > 1 else np.zeros(curves.shape[1])
            x = steps[window - 1 :]
            ax.plot(x, mean, color=color, label=label)
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
        if arm == "refreshed":
            for step in range(args.update_steps, args.max_steps + 1, args.update_steps):
                ax.axvline(step, color="grey", linewidth=0.4, linestyle=":")
        ax.set_title(
            "(a) frozen reward model" if arm == "frozen" else f"(b) refreshed every {args.update_steps} steps (dotted)"
        )
        ax.set_xlabel("optimizer step")
    axes[0].set_ylabel("mean over the batch's completions")
    axes[0].legend(loc="upper left", fontsize=8)
    save_figure(
        fig,
        path,
        f"GRPO on a learnt reward model, tiny Qwen2, single-digit addition: mean ± std over {len(args.seeds)} seeds "
        "(5-step moving average)",
        dpi=110,
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet_transformers()
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers) as pool:
        fits = list(pool.map(fit_reward_model, args.seeds, [args] * len(args.seeds)))
        for fit in fits:
            print(
                f"[{time.time() - start:6.0f} s] seed {fit['seed']}: reward model fitted on {fit['fit_examples']} "
                f"samples, true {fit['fit_true_reward']:.3f}, predicted {fit['fit_predicted_reward']:.3f}, "
                f"MAE {fit['fit_mae']:.3f}",
                flush=True,
            )
        futures = [pool.submit(run_one, arm, seed, args) for seed in args.seeds for arm in ARMS]
        runs = []
        for future in concurrent.futures.as_completed(futures):
            run = future.result()
            runs.append(run)
            print(
                f"[{time.time() - start:6.0f} s] {run['arm']:>9} seed {run['seed']}: final true "
                f"{tail_mean(run['true'], args.final_fraction):.3f}, predicted "
                f"{tail_mean(run['predicted'], args.final_fraction):.3f}, {run['num_updates']} RM updates "
                f"({run['train_seconds']} s)",
                flush=True,
            )
    runs.sort(key=lambda r: (args.seeds.index(r["seed"]), ARMS.index(r["arm"])))
    summary, table = summarise(runs, fits, args)
    wall = time.time() - start
    print("\n" + table)
    print(f"\ntotal wall time: {wall:.0f} s")
    results = {"args": vars(args), "summary": summary, "table": table, "wall_seconds": round(wall, 1)}
    results.update(fits=fits, runs=runs)
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
