# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_weight_sync.py, started with `torchrun --nproc_per_node 2` (gloo, CPU).

    weight_sync_worker.py all MODEL_DIR OUT_DIR

`vllm_weights` of the same model (plain, and with a LoRA adapter) under DeepSpeed ZeRO-3 and under FSDP2
(`fully_shard` per decoder layer, then the root): what every rank receives, compared bitwise with the unsharded
model's state dict (LoRA: peft's `merge_and_unload` of an unsharded copy), and what was whole while it was produced.
Each rank writes `OUT_DIR/all_rank<r>.json`.
"""

import copy
import os
import re
import sys
from collections import Counter


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sync_worker import finish  # noqa: E402


def policies(model_dir: str) -> dict:
    """`{case: (model, expected state)}`: the tiny model with its weights moved, plain and with a LoRA adapter
    (non-zero B on q/v/gate), built identically on every rank; the expected state is what the checkpoint of the
    unsharded model holds (tied `lm_head.weight` left out)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = {}
    for case in ("plain", "lora"):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=generator))
        if case == "lora":
            config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"])
            torch.manual_seed(3)
            model = get_peft_model(model, config)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            state = copy.deepcopy(model).merge_and_unload().state_dict()
        else:
            state = {n: t.clone() for n, t in model.state_dict().items()}
        state.pop("lm_head.weight")  # tied
        out[case] = (model, state)
    return out


def layer_of(name: str) -> str:
    match = re.search(r"layers\.(\d+)\.", name)
    return f"layer{match.group(1)}" if match else "rest"


def parameters_per_group(names) -> dict[str, int]:
    """How many of the parameter `names` each group (`layer_of`) holds."""
    return dict(Counter(layer_of(name) for name in names))


def compare(received: list, expected: dict) -> dict:
    return {
        "names_equal": sorted(n for n, _ in received) == sorted(expected) and len(received) == len(expected),
        "bitwise_equal": all(torch.equal(t, expected[n]) and t.dtype == expected[n].dtype for n, t in received),
        "group_order": list(dict.fromkeys(layer_of(n) for n, _ in received)),
    }


def run_zero3(model_dir: str) -> dict:
    """ZeRO-3: every parameter partitioned (persistence threshold 0); each `GatheredParameters` entry gathers exactly
    one group, and nothing is whole while tensors are yielded."""
    import deepspeed

    from trl.generation.weight_sync import vllm_weight_shapes, vllm_weights

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    out = {}
    for case, (model, expected) in policies(model_dir).items():
        engine, *_ = deepspeed.initialize(model=model, config=config)
        names = {id(p): n for n, p in engine.module.named_parameters()}
        gathers = []
        original = deepspeed.zero.GatheredParameters.__init__

        def recording(self, params, *args, **kwargs):
            gathers.append(sorted({layer_of(names[id(p)]) for p in params}))
            gathers[-1].append(len(params))
            return original(self, params, *args, **kwargs)

        deepspeed.zero.GatheredParameters.__init__ = recording
        try:
            shapes = vllm_weight_shapes(engine)
            gathers_for_shapes = len(gathers)
            received, whole_at_yield = [], []
            for name, tensor in vllm_weights(engine):
                whole_at_yield.append(sum(p.ds_status.name != "NOT_AVAILABLE" for p in engine.module.parameters()))
                received.append((name, tensor))
        finally:
            deepspeed.zero.GatheredParameters.__init__ = original
        params = list(engine.module.parameters())
        group_sizes = parameters_per_group(names.values())
        out[case] = {
            **compare(received, expected),
            "shapes_equal": shapes == {n: tuple(t.shape) for n, t in expected.items()},
            "gathers_for_shapes": gathers_for_shapes,
            "gathers": gathers,
            "group_sizes": group_sizes,
            "max_whole_at_yield": max(whole_at_yield),
            "partitioned": all(hasattr(p, "ds_id") and p.ds_tensor.numel() < p.ds_numel for p in params),
        }
    return out


def run_fsdp2(model_dir: str) -> dict:
    """FSDP2: DTensor parameters; the number of `full_tensor()` calls made when each group's first tensor arrives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from trl.generation.weight_sync import vllm_weight_shapes, vllm_weights

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    for case, (model, expected) in policies(model_dir).items():
        inner = model.get_base_model() if case == "lora" else model
        for layer in inner.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        calls = []
        original = DTensor.full_tensor

        def counting(self, *args, **kwargs):
            calls.append(1)
            return original(self, *args, **kwargs)

        DTensor.full_tensor = counting
        try:
            shapes = vllm_weight_shapes(model)
            calls_for_shapes = len(calls)
            received, calls_at_group_start, group = [], {}, None
            for name, tensor in vllm_weights(model):
                if layer_of(name) != group:
                    group = layer_of(name)
                    calls_at_group_start[group] = len(calls)
                received.append((name, tensor))
        finally:
            DTensor.full_tensor = original
        group_sizes = parameters_per_group(n for n, _ in model.named_parameters())
        out[case] = {
            **compare(received, expected),
            "shapes_equal": shapes == {n: tuple(t.shape) for n, t in expected.items()},
            "calls_for_shapes": calls_for_shapes,
            "calls_at_group_start": calls_at_group_start,
            "group_sizes": group_sizes,
            "dtensor_params": all(isinstance(p, DTensor) for p in model.parameters()),
        }
    return out


def main() -> None:
    mode, model_dir, out_dir = sys.argv[1:4]
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    finish(mode, out_dir, {"zero3": run_zero3(model_dir), "fsdp2": run_fsdp2(model_dir)})


if __name__ == "__main__":
    main()
