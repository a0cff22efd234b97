# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_distributed.py's reward-model refresh test, started with `torchrun --nproc_per_node 2`.

    reward_model_worker.py MODE MODEL_DIR OUT_DIR REWARD_MODEL_DIR      MODE in {ddp, zero3}

ddp: full Algorithm 1 under DDP (gloo, CPU): 4 GRPO steps scored by a tiny reward model that is refreshed every 2
steps, the reference reset (α = 1) at the same steps. Each rank writes a fingerprint of the reward model after every
step, the logged refresh metrics and a checkpoint round trip to `OUT_DIR/ddp_rank<r>.json`.
zero3: building the trainer under DeepSpeed ZeRO-3 must raise; each rank writes the error to `OUT_DIR/zero3_rank<r>.json`.
"""

import hashlib
import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from sync_worker import PROMPTS, finish, grpo_config  # noqa: E402


UPDATE_STEPS = 2


def fingerprint(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def parity_label(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def main() -> None:
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl import GRPOTrainer

    mode, model_dir, out_dir, reward_model_dir = sys.argv[1:5]
    torch.manual_seed(0)
    if mode == "zero3":  # DeepSpeed's comm layer must know the world before from_pretrained partitions
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    args = grpo_config(os.path.join(out_dir, f"{mode}_rm_run"), 3 if mode == "zero3" else None, 1.0)
    args.reward_model_update_steps = UPDATE_STEPS
    if mode == "zero3":
        try:
            GRPOTrainer(
                model=model_dir,
                reward_funcs=[reward_model_dir],
                args=args,
                train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                reward_model_label_func=parity_label,
            )
            finish(mode, out_dir, {"error": None})
        except ValueError as error:
            finish(mode, out_dir, {"error": str(error)})
    args.reward_model_replay_ratio = 0.2
    args.reward_model_learning_rate = 1e-2
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[reward_model_dir],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        reward_model_label_func=parity_label,
    )
    refresh = trainer.reward_model_refresh
    reward_model = refresh.reward_models[0][1]
    fingerprints = {0: fingerprint(reward_model)}

    class Fingerprints(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            fingerprints[state.global_step] = fingerprint(reward_model)

    events = []
    update, sync = refresh.update, trainer.sync_callback.sync
    refresh.update = lambda step: (events.append(["reward model", step]), update(step))
    trainer.sync_callback.sync = lambda a, s, m: (events.append(["reference", s.global_step]), sync(a, s, m))
    trainer.add_callback(Fingerprints())
    trainer.train()
    logs = {e["step"]: e for e in trainer.state.log_history if "loss" in e}

    # Checkpoint round trip: save, scramble the reward model, restore from the file rank 0 wrote.
    before = fingerprint(reward_model)
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)
    trainer.accelerator.wait_for_everyone()
    with torch.no_grad():
        for p in reward_model.parameters():
            p.zero_()
    refresh.load(os.path.join(args.output_dir, f"checkpoint-{trainer.state.global_step}"))
    result = {
        "fingerprints": [fingerprints[s] for s in sorted(fingerprints)],
        "events": events,
        "num_updates": refresh.num_updates,
        "buffer_examples": refresh.buffer.num_examples,
        "replay_fraction": [logs[s].get("reward_model/replay_fraction") for s in sorted(logs)],
        "reward_model_type": type(trainer.reward_funcs[0]).__name__,
        "checkpoint_roundtrip_equal": fingerprint(reward_model) == before,
    }
    finish(mode, out_dir, result)


if __name__ == "__main__":
    main()
