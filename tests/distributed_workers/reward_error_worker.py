# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_distributed.py's one-process reward error test, started with `torchrun --nproc_per_node 2`.

    reward_error_worker.py ddp MODEL_DIR OUT_DIR

One GRPO step under DDP (gloo, CPU) with a reward function that returns a string on process 0 only (process 1's
rewards are fine). Every rank must raise (not wait in a gather): each prints `rank <r> raised <Type>: <message>`
and writes `{"type", "message"}` to `OUT_DIR/ddp_rank<r>.json`.
"""

import json
import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from sync_worker import PROMPTS, grpo_config  # noqa: E402


def flaky_reward(completions, **kwargs):
    if int(os.environ["RANK"]) == 0:
        return "oops"
    return [float(len(c)) for c in completions]


def main() -> None:
    from datasets import Dataset

    from trl import GRPOTrainer

    mode, model_dir, out_dir = sys.argv[1:4]
    torch.manual_seed(0)
    args = grpo_config(os.path.join(out_dir, "run"), None, 1.0)
    args.max_steps, args.beta, args.sync_ref_model = 1, 0.0, False
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=flaky_reward, args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS})
    )
    rank = trainer.accelerator.process_index
    result = {"type": None, "message": None}
    try:
        trainer.train()
    except (TypeError, ValueError) as error:
        result = {"type": type(error).__name__, "message": str(error)}
    print(f"rank {rank} raised {result['type']}: {result['message']}", flush=True)
    with open(os.path.join(out_dir, f"{mode}_rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stderr.flush()
    os._exit(0)  # no collective after the error: each rank exits on its own (gloo's teardown can abort)


if __name__ == "__main__":
    main()
