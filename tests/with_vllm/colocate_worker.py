# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""One process of a 2-process colocate run (`torchrun --nproc_per_node 2`, gloo on the CPU): each process has its own
vLLM engine (`external_launcher`), 2 optimizer steps with a hard sync after each; writes what it saw to
`<output_dir>/rank<R>.json`. Usage: colocate_worker.py MODEL_DIR OUTPUT_DIR"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoTokenizer
from vllm_checks import GreedyAfterEachPush, logged, vllm_trainer


def main(model_dir: str, output_dir: str) -> None:
    trainer = vllm_trainer(model_dir, output_dir, "colocate", ref_model_mixup_alpha=1.0, max_steps=2)
    checks = GreedyAfterEachPush(trainer, AutoTokenizer.from_pretrained(model_dir))
    trainer.train()
    digest = hashlib.sha256()
    for name, value in sorted(trainer.model.state_dict().items()):
        digest.update(name.encode() + value.detach().cpu().numpy().tobytes())
    rank = trainer.accelerator.process_index
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "distributed": dist.is_initialized() and dist.get_world_size(),
        "pushed_at": checks.pushed_at,
        "pushes": trainer.vllm_generation.pushes,
        "logp_difference_max": logged(trainer, "sampling/sampling_logp_difference/max"),
        "num_syncs": logged(trainer, "ref_model/num_syncs"),
        "policy_sha256": digest.hexdigest(),
        "step": trainer.state.global_step,
    }
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    torch.distributed.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:3])
