# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_distributed.py's stream test, started with `torchrun --nproc_per_node 2`.

    stream_worker.py ddp MODEL_DIR OUT_DIR

One 2-step GRPO run under DDP (gloo, CPU), shuffle off, on 16 prompts streamed from two shards
(`to_iterable_dataset(num_shards=2)`: given a `datasets.IterableDataset` with as many shards as processes,
accelerate would hand each process its own shard and each would build generation batches from its own prompts).
Each rank writes `OUT_DIR/ddp_rank<r>.json`: the prompts of this rank's generation batches (recorded by the reward
function) and a SHA-256 of the final weights.
"""

import hashlib
import json
import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(4)]


def main() -> None:
    from datasets import Dataset

    from trl import GRPOConfig, GRPOTrainer

    mode, model_dir, out_dir = sys.argv[1:4]
    calls = []

    def recorder(prompts, completion_ids, **kwargs):
        calls.append(list(prompts))
        return [float(ids[0] % 5) for ids in completion_ids]

    torch.manual_seed(0)
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=4,
        num_generations=2,
        gradient_accumulation_steps=2,
        max_completion_length=4,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.04,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    stream = Dataset.from_dict({"prompt": PROMPTS}).to_iterable_dataset(num_shards=2)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=recorder, args=args, train_dataset=stream)
    trainer.train()
    digest = hashlib.sha256()
    named = trainer.accelerator.unwrap_model(trainer.model).named_parameters()
    for _, p in sorted(named, key=lambda item: item[0]):
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    result = {"prompts": calls, "weights": digest.hexdigest()}
    rank = int(os.environ["RANK"])
    with open(os.path.join(out_dir, f"{mode}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
