# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Offline demo: a randomly initialised (cold-start) tiny Qwen2 learns to echo a digit ("7=" → "7") with GRPO,
once with a reference that follows the policy (iterative GRPO) and once with a fixed reference.

Builds the model and tokenizer into `<output_dir>/model` (loaded back with `from_pretrained`), trains both runs from
that same model with the same prompts and the same strong KL penalty (`--beta`), prints a summary, and writes
`<output_dir>/reward_kl.png` (accuracy and KL per step of both runs) and `<output_dir>/summary.json`. Also writes the
prompts to `<output_dir>/prompts.jsonl`, so the same run works through `trl grpo` (printed at the end).

    python examples/iterative_grpo_demo.py            # ~20 s on 2 idle CPU cores, minutes on busy ones
    python examples/iterative_grpo_demo.py --max_steps 10 --output_dir /tmp/demo
"""

import argparse
import json
import os
import sys
import time
import warnings


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the demo runs on the CPU; keeps DeepSpeed's probe quiet
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import ProgressCallback  # noqa: E402

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import accuracy_reward, arithmetic_corpus, best_constant_accuracy, make_echo_dataset  # noqa: E402


ACCURACY = "rewards/accuracy_reward/mean"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="demo_output")
    parser.add_argument("--max_steps", type=int, default=400)
    parser.add_argument("--sync_steps", type=int, default=25, help="ref_model_sync_steps (τ)")
    parser.add_argument("--alpha", type=float, default=0.6, help="ref_model_mixup_alpha (α)")
    parser.add_argument("--beta", type=float, default=0.5, help="KL coefficient, strong on purpose")
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no_kl_correction", action="store_true", help="use_bias_correction_kl=False (TRL's default is True)"
    )
    parser.add_argument("--skip_fixed", action="store_true", help="train only the iterative-GRPO run")
    parser.add_argument("--no_plot", action="store_true")
    return parser.parse_args(argv)


def demo_config(
    output_dir: str,
    *,
    beta: float,
    learning_rate: float,
    max_steps: int,
    seed: int,
    alpha: float | None,
    sync_steps: int,
    use_bias_correction_kl: bool = True,
    **overrides,
) -> GRPOConfig:
    """The demo's GRPOConfig; `alpha=None` keeps the reference fixed. Also used by benchmarks/reproduce_cold_start.py.

    Every setting the result depends on is written out, none is left to GRPOConfig's defaults.
    """
    with warnings.catch_warnings():  # transformers renames `gradient_checkpointing`; the TRL name is kept here
        warnings.simplefilter("ignore", FutureWarning)
        settings = dict(
            output_dir=output_dir,
            per_device_train_batch_size=64,  # completions per step: 8 prompts × 8
            gradient_accumulation_steps=1,
            num_generations=8,
            max_completion_length=1,  # the answer is one token
            mask_truncated_completions=False,  # a one-token completion has no room for EOS: keep it in the loss
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=0,
            beta=beta,
            epsilon=0.2,
            num_iterations=1,
            loss_type="dapo",
            scale_rewards="group",
            use_bias_correction_kl=use_bias_correction_kl,
            sync_ref_model=alpha is not None,
            ref_model_sync_steps=sync_steps,
            ref_model_mixup_alpha=alpha if alpha is not None else 0.6,
            max_steps=max_steps,
            logging_steps=1,
            bf16=False,
            gradient_checkpointing=False,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=seed,
            # each distinct prompt computed once (the defaults; scoring still runs plain passes here: 2-token prompts
            # are below grpo_scoring.MIN_SHARED_PREFIX_TOKENS); `False` runs TRL's plain generate and passes
            shared_prefix=True,
        )
        settings.update(overrides)
        return GRPOConfig(**settings)


class BarOnly(ProgressCallback):
    """The progress bar without a printed dictionary of metrics at every step (the summary comes at the end)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def window_mean(values: list[float], n: int) -> float:
    values = values[:n] if n > 0 else values[n:]
    return sum(values) / max(len(values), 1)


def moving_average(values: list[float], n: int) -> list[float]:
    """Trailing mean over up to `n` values (shorter at the start), same length as `values`."""
    return [sum(values[max(0, i + 1 - n) : i + 1]) / (i + 1 - max(0, i + 1 - n)) for i in range(len(values))]


def train(model_dir: str, dataset, args, sync: bool) -> dict:
    name = "iterative" if sync else "fixed"
    print(f"--- {'iterative GRPO: reference synced' if sync else 'fixed reference'} ---", flush=True)
    config = demo_config(
        os.path.join(args.output_dir, f"run_{name}"),
        beta=args.beta,
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        seed=args.seed,
        alpha=args.alpha if sync else None,
        sync_steps=args.sync_steps,
        use_bias_correction_kl=not args.no_kl_correction,
    )
    trainer = GRPOTrainer(model=model_dir, reward_funcs=accuracy_reward, args=config, train_dataset=dataset)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(BarOnly())
    start = time.time()
    trainer.train()
    elapsed = time.time() - start
    history = [h for h in trainer.state.log_history if "reward" in h]
    window = max(1, min(40, len(history) // 4))
    return {
        "steps": trainer.state.global_step,
        "window": window,
        "initial_reward": window_mean([h["reward"] for h in history], window),
        "final_reward": window_mean([h["reward"] for h in history], -window),
        "initial_accuracy": window_mean([h[ACCURACY] for h in history], window),
        "final_accuracy": window_mean([h[ACCURACY] for h in history], -window),
        "final_kl": window_mean([h["kl"] for h in history], -window),
        "num_syncs": trainer.sync_callback.num_syncs if trainer.sync_callback is not None else 0,
        "train_seconds": round(elapsed, 1),
        "history": {key: [h[key] for h in history] for key in ("step", ACCURACY, "kl")},
    }


def plot(runs: dict, chance: float, args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_kl) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    styles = {"iterative": ("tab:blue", f"reference synced (α={args.alpha}, every {args.sync_steps} steps)")}
    styles["fixed"] = ("tab:grey", "fixed reference (the initial model)")
    for name, run in runs.items():
        color, label = styles[name]
        steps = run["history"]["step"]
        ax_acc.plot(steps, moving_average(run["history"][ACCURACY], 10), color=color, label=label)
        ax_kl.plot(steps, moving_average(run["history"]["kl"], 10), color=color, label=label)
    ax_acc.axhline(
        chance, color="black", linestyle=":", linewidth=0.8, label=f"best prompt-blind answer ({chance:.2f})"
    )
    if "iterative" in runs:
        for step in range(args.sync_steps, runs["iterative"]["steps"] + 1, args.sync_steps):
            ax_kl.axvline(step, color="tab:blue", linestyle=":", linewidth=0.5, alpha=0.5)
    ax_acc.set_ylabel("accuracy (10-step mean)")
    ax_acc.set_ylim(-0.02, 1.02)
    ax_kl.set_ylabel("KL(policy ‖ reference), k3\n(10-step mean)")
    ax_kl.set_xlabel("optimizer step (dotted: reference syncs)")
    ax_acc.legend(loc="center right", fontsize=8)
    fig.suptitle(f'Cold-start tiny Qwen2 learns to echo a digit ("7=" → "7"), β={args.beta}', fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    torch.set_num_threads(1)  # a tiny model is overhead-bound: one thread is faster than two on 2 cores
    model_dir = build_tiny_causal_lm(
        os.path.join(args.output_dir, "model"), corpus=arithmetic_corpus(), seed=args.seed
    )
    dataset = make_echo_dataset(1000, seed=args.seed)
    dataset.to_json(os.path.join(args.output_dir, "prompts.jsonl"))
    chance = best_constant_accuracy(dataset["answer"])

    start = time.time()
    runs = {"iterative": train(model_dir, dataset, args, sync=True)}
    if not args.skip_fixed:
        runs["fixed"] = train(model_dir, dataset, args, sync=False)
    summary = {"chance_accuracy": chance, "beta": args.beta, "use_bias_correction_kl": not args.no_kl_correction}
    summary["total_seconds"] = round(time.time() - start, 1)
    summary.update(runs)  # per run: the numbers printed below and its per-step curves ("history")

    window = runs["iterative"]["window"]
    correction = "off" if args.no_kl_correction else "on"
    print(f"\n=== Iterative GRPO demo summary (β={args.beta}, KL correction {correction}, {args.max_steps} steps) ===")
    print(f"reward = accuracy: 1 for the right digit, else 0; best prompt-blind answer: {chance:.3f}")
    print(f"{'':28}{'first ' + str(window) + ' steps':>16}{'last ' + str(window) + ' steps':>16}{'KL at end':>12}")
    for name, label in (("iterative", f"synced (α={args.alpha}, τ={args.sync_steps})"), ("fixed", "fixed reference")):
        if name in runs:
            run = runs[name]
            print(
                f"{label:28}{run['initial_accuracy']:>16.3f}{run['final_accuracy']:>16.3f}{run['final_kl']:>12.4f}"
                f"   ({run['train_seconds']} s, {run['num_syncs']} syncs)"
            )
    print(f"training time: {summary['total_seconds']} s")
    if not args.no_plot:
        png = os.path.join(args.output_dir, "reward_kl.png")
        plot(runs, chance, args, png)
        summary["plot"] = png
        print(f"plot: {png}")
    with open(os.path.join(args.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        "same pipeline from the command line:\n"
        f"  trl grpo --model_name_or_path {model_dir} --dataset_name {os.path.join(args.output_dir, 'prompts.jsonl')} "
        "--reward_funcs trl.tasks.arithmetic.accuracy_reward --per_device_train_batch_size 64 --num_generations 8 "
        f"--max_completion_length 1 --learning_rate {args.learning_rate} --beta {args.beta} --sync_ref_model "
        f"--ref_model_mixup_alpha {args.alpha} --ref_model_sync_steps {args.sync_steps} --max_steps 50 --bf16 false "
        f"--gradient_checkpointing false --use_cpu --report_to none --output_dir {os.path.join(args.output_dir, 'cli_run')}"
    )
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
