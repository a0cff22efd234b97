# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Offline demo: iterative GRPO on single-digit addition, from a randomly initialised (cold-start) tiny Qwen2.

Builds the model and tokenizer into `<output_dir>/model` (loaded back with `from_pretrained`), trains with a soft
reference sync every `--sync_steps` optimizer steps, prints a summary and writes `<output_dir>/reward_kl.png`.
Also writes the prompts to `<output_dir>/prompts.jsonl`, so the same run works through `trl grpo` (printed at the end).

    python examples/iterative_grpo_demo.py            # ~1 minute on 2 CPU cores
    python examples/iterative_grpo_demo.py --max_steps 10 --output_dir /tmp/demo
"""

import argparse
import json
import os
import sys
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the demo runs on the CPU; keeps DeepSpeed's probe quiet

import torch  # noqa: E402
from transformers import ProgressCallback  # noqa: E402

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import accuracy_reward, arithmetic_corpus, closeness_reward, make_arithmetic_dataset  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="demo_output")
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--sync_steps", type=int, default=25, help="ref_model_sync_steps (τ)")
    parser.add_argument("--alpha", type=float, default=0.6, help="ref_model_mixup_alpha (α)")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_plot", action="store_true")
    return parser.parse_args(argv)


class BarOnly(ProgressCallback):
    """The progress bar without a printed dictionary of metrics at every step (the summary comes at the end)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def window_mean(values: list[float], n: int) -> float:
    values = values[:n] if n > 0 else values[n:]
    return sum(values) / max(len(values), 1)


def plot(history: list[dict], sync_steps: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax_reward, ax_kl) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_reward.plot(steps, [h["reward"] for h in history], label="mean reward")
    ax_reward.plot(steps, [h["rewards/accuracy_reward/mean"] for h in history], label="accuracy", alpha=0.7)
    ax_kl.plot(steps, [h["kl"] for h in history], color="tab:red", label="KL(policy ‖ reference)")
    for ax in (ax_reward, ax_kl):
        for i, step in enumerate(sync_steps):
            ax.axvline(step, color="grey", linestyle=":", linewidth=0.8, label="reference sync" if i == 0 else None)
        ax.legend(loc="upper left", fontsize=8)
    ax_reward.set_ylabel("reward")
    ax_kl.set_ylabel("KL (k3)")
    ax_kl.set_xlabel("optimizer step")
    fig.suptitle("Iterative GRPO, cold-start tiny Qwen2, single-digit addition")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    torch.set_num_threads(1)  # a tiny model is overhead-bound: one thread is faster than two on 2 cores
    model_dir = build_tiny_causal_lm(
        os.path.join(args.output_dir, "model"), corpus=arithmetic_corpus(), seed=args.seed
    )
    dataset = make_arithmetic_dataset(1000, seed=args.seed)
    dataset.to_json(os.path.join(args.output_dir, "prompts.jsonl"))

    config = GRPOConfig(
        output_dir=os.path.join(args.output_dir, "run"),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=4,
        learning_rate=args.learning_rate,
        beta=args.beta,
        sync_ref_model=True,
        ref_model_sync_steps=args.sync_steps,
        ref_model_mixup_alpha=args.alpha,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=[closeness_reward, accuracy_reward], args=config, train_dataset=dataset
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(BarOnly())
    start = time.time()
    trainer.train()
    elapsed = time.time() - start

    history = [h for h in trainer.state.log_history if "reward" in h]
    sync_steps = [s for s in range(1, args.max_steps + 1) if s % args.sync_steps == 0]
    window = max(1, min(20, len(history) // 4))
    summary = {
        "steps": trainer.state.global_step,
        "initial_reward": window_mean([h["reward"] for h in history], window),
        "final_reward": window_mean([h["reward"] for h in history], -window),
        "final_accuracy": window_mean([h["rewards/accuracy_reward/mean"] for h in history], -window),
        "num_syncs": trainer.sync_callback.num_syncs,
        "final_kl": history[-1]["kl"],
        "train_seconds": round(elapsed, 1),
        "seconds_per_step": round(elapsed / max(trainer.state.global_step, 1), 4),
    }
    print("\n=== Iterative GRPO demo summary ===")
    print(f"initial mean reward (first {window} steps): {summary['initial_reward']:.3f}")
    print(f"final mean reward   (last {window} steps):  {summary['final_reward']:.3f}")
    print(f"final accuracy      (last {window} steps):  {summary['final_accuracy']:.3f}")
    print(f"reference syncs: {summary['num_syncs']} (every {args.sync_steps} steps, alpha={args.alpha})")
    print(f"final KL(policy || reference): {summary['final_kl']:.4f}")
    print(f"training time: {elapsed:.1f} s ({summary['seconds_per_step']} s/step)")
    if not args.no_plot:
        png = os.path.join(args.output_dir, "reward_kl.png")
        plot(history, sync_steps, png)
        summary["plot"] = png
        print(f"plot: {png}")
    with open(os.path.join(args.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        "same pipeline from the command line:\n"
        f"  trl grpo --model_name_or_path {model_dir} --dataset_name {os.path.join(args.output_dir, 'prompts.jsonl')} "
        "--reward_funcs closeness_reward accuracy_reward --per_device_train_batch_size 64 --num_generations 8 "
        f"--max_completion_length 4 --learning_rate {args.learning_rate} --sync_ref_model --ref_model_sync_steps "
        f"{args.sync_steps} --max_steps 50 --use_cpu --report_to none --output_dir {os.path.join(args.output_dir, 'cli_run')}"
    )
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
