# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_grpo_metrics.py, started with `torchrun --nproc_per_node 2` (gloo, CPU).

    metrics_worker.py metrics MODEL_DIR OUT_DIR

Each rank (1) trains one GRPO step whose reward is constant within each group and different between the two groups
(one group per process), and (2) runs `compute_loss` on a hand-made micro-batch with different token counts per
rank (rank 0: 10 tokens at KL 0.1, all clipped high; rank 1: 90 tokens at KL 0.01, 9 clipped high, 5 clipped low).
It writes the logged values to `OUT_DIR/metrics_rank<r>.json`.
"""

import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sync_worker import finish  # noqa: E402


def prompt_reward(prompts, log_extra, log_metric, **kwargs):
    """1.0 for the first prompt, 3.0 for the second: constant within each group. Rank 0 alone logs a column of the
    completions table; each rank logs its rank as a metric (logged: their mean)."""
    rank = dist.get_rank()
    if rank == 0:
        log_extra("rank", [rank] * len(prompts))
    log_metric("rank_metric", float(rank))
    return [1.0 if p == "1+1=" else 3.0 for p in prompts]


def log_ratio_with_k3(target: float) -> float:
    """x > 0 with exp(x) − x − 1 = target (Newton's method in float64)."""
    x = 1.0
    for _ in range(50):
        x -= (torch.tensor(x).exp().item() - x - 1 - target) / (torch.tensor(x).exp().item() - 1)
    return x


def handmade_micro_batch(rank: int) -> dict[str, torch.Tensor]:
    """4 completions of width 25: rank 0 has 10 tokens, rank 1 has 90."""
    lengths = torch.tensor([3, 3, 2, 2] if rank == 0 else [25, 25, 25, 15])
    mask = (torch.arange(25).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ref = torch.full((4, 25), log_ratio_with_k3(0.1 if rank == 0 else 0.01))  # policy log-probs are 0
    old = torch.zeros(4, 25)
    if rank == 0:
        advantages = torch.ones(4)
        old[:] = -1.0  # ratio e > 1 + ε: every token clipped high
    else:
        advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
        old[0, :9] = -1.0  # 9 tokens clipped high
        old[2, :5] = 1.0  # ratio 1/e < 1 − ε with Â < 0: 5 tokens clipped low
    return {
        "prompt_ids": torch.ones(4, 2, dtype=torch.long),
        "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "completion_ids": torch.ones(4, 25, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(50.0),
    }


def main() -> None:
    from datasets import Dataset

    from trl import GRPOConfig, GRPOTrainer

    _, model_dir, out_dir = sys.argv[1:4]
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        learning_rate=1e-2,
        beta=0.1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
        log_completions=True,
    )
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+3="]})  # one generation batch: both prompts
    trainer = GRPOTrainer(model=model_dir, reward_funcs=prompt_reward, args=args, train_dataset=dataset)
    trainer.train()
    logged = trainer.state.log_history[0]
    table = {k: v for k, v in trainer._last_completions.items() if k in ("prompt", "rank")}  # rank 0 only

    rank = dist.get_rank()
    trainer.model.train()
    from trl.scoring.grpo_scoring import Scores
    from trl.trainer import grpo_trainer

    zeros = lambda model, input_ids, *a, **k: Scores(torch.zeros(input_ids.size(0), 25), torch.zeros(4, 25), None)  # noqa: E731
    grpo_trainer.score_completions = zeros  # policy log-probs (and entropies) are 0
    trainer._metrics["train"].clear()
    trainer.args.use_bias_correction_kl = False  # the handmade KL values are logged as they are (ratios are not 1)
    trainer.compute_loss(trainer.model, handmade_micro_batch(rank))
    handmade = {key: values[-1] for key, values in trainer._metrics["train"].items()}

    finish("metrics", out_dir, {"logged": logged, "handmade": handmade, "table": table})


if __name__ == "__main__":
    main()
