# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_distributed.py, started with `torchrun --nproc_per_node 2` (gloo, CPU).

    sync_worker.py MODE MODEL_DIR OUT_DIR      MODE in {ddp, zero2, zero3, zero3_lora}

Each rank checks every reference sync against the formula on gathered tensors and writes what it measured to
`OUT_DIR/<mode>_rank<r>.json`; the test asserts on those numbers. The gathering done for checking happens outside
the counted region; only the sync itself is counted for collectives.
"""

import json
import os
import sys
import warnings
from contextlib import contextmanager


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


ALPHA, TAU, STEPS = 0.6, 2, 4
COLLECTIVES = (
    "all_gather_into_tensor",
    "all_gather",
    "_all_gather_base",
    "broadcast",
    "all_reduce",
    "reduce_scatter_tensor",
    "scatter",
    "all_to_all_single",
)
FUNCTIONAL_COLLECTIVES = (
    "all_gather_tensor",
    "all_gather_single",
    "all_gather_tensor_autograd",
    "all_reduce",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "all_to_all_single",
)  # DTensor


@contextmanager
def count_collectives():
    """Count calls to torch.distributed / deepspeed.comm collectives and `GatheredParameters` entries in the block."""
    counts = {"calls": 0, "by_name": {}}
    patched = []

    def wrap(owner, name):
        original = getattr(owner, name, None)
        if original is None:
            return

        def counted(*args, **kwargs):
            counts["calls"] += 1
            counts["by_name"][name] = counts["by_name"].get(name, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, name, counted)
        patched.append((owner, name, original))

    owners = [torch.distributed, torch.distributed.distributed_c10d]
    try:
        import deepspeed

        owners.append(deepspeed.comm)
        wrap(deepspeed.zero.GatheredParameters, "__enter__")
        wrap(deepspeed.comm, "allgather_fn")
    except ImportError:
        pass
    for owner in owners:
        for name in COLLECTIVES:
            wrap(owner, name)
    for name in FUNCTIONAL_COLLECTIVES:
        wrap(torch.distributed._functional_collectives, name)
    # Belt and braces: every c10d collective, whoever calls it, shows up as a profiler event.
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    try:
        with profiler:
            yield counts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    events = [
        e.name
        for e in profiler.events()
        if any(k in e.name.lower() for k in ("c10d", "gloo", "nccl", "allgather", "all_gather", "broadcast"))
    ]
    counts["profiler_events"] = len(events)
    counts["profiler_names"] = sorted(set(events))[:10]
    # FSDP2 all-gathers run in C++ (no Python collective to count): one "FSDP::all_gather (<modules>)" event each
    counts["fsdp_all_gathers"] = sum(e.name.startswith("FSDP::all_gather (") for e in profiler.events())


def full_state(model) -> dict[str, torch.Tensor]:
    """Every float tensor of `model`, gathered whole on this rank (ZeRO-3 params, DTensors or plain tensors)."""
    from trl.reference.layouts import tensor_layout
    from trl.reference.ref_sync import named_float_tensors

    tensors = dict(named_float_tensors(model))
    zero3 = [t for t in tensors.values() if tensor_layout(t) == "zero3"]
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(zero3):
            return {n: t.detach().clone() for n, t in tensors.items()}
    return {
        n: (t.detach().full_tensor() if tensor_layout(t) == "dtensor" else t.detach()).clone()
        for n, t in tensors.items()
    }


def checksum(state: dict[str, torch.Tensor]) -> list[float]:
    return [
        sum(t.double().sum().item() for t in state.values()),
        sum(t.double().abs().sum().item() for t in state.values()),
    ]


def expected_after(before: dict, policy: dict, alpha: float) -> dict:
    return {n: torch.lerp(before[n].float(), policy[n].float(), alpha).to(before[n].dtype) for n in before}


def max_error(actual: dict, expected: dict) -> float:
    assert actual.keys() == expected.keys()
    return max((actual[n].float() - expected[n].float()).abs().max().item() for n in actual)


def checked_sync(callback, args, state, policy, reference, records: list, alpha: float) -> None:
    """Run `callback.sync` once, comparing the gathered reference with the formula; append a record."""
    policy_before, ref_before = full_state(policy), full_state(reference)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with count_collectives() as counts:
            callback.sync(args, state, policy)
    ref_after = full_state(reference)
    records.append(
        {
            "step": state.global_step,
            "max_error": max_error(ref_after, expected_after(ref_before, policy_before, alpha)),
            "policy_ref_gap": max_error(policy_before, ref_before),  # > 0: the sync had something to do
            "collectives": counts["calls"],
            "profiler_collectives": counts["profiler_events"],
            "profiler_names": counts["profiler_names"],
            "warnings": [str(w.message) for w in caught if "partitioned the same way" in str(w.message)],
            "checksum": checksum(ref_after),
        }
    )


PROMPTS = [f"What is {a} + {b}?" for a in range(4) for b in range(4)]


def digits_reward(completions, **kwargs):  # varied rewards, so the policy moves away from the reference
    return [sum(c.isdigit() for c in text) + 0.1 * len(text) for text in completions]


def grpo_config(run_dir: str, zero_stage: int | None, alpha: float, **overrides):
    """The GRPO run every worker mode trains: 4 steps, τ = TAU, on 2 processes; DeepSpeed when `zero_stage` is set;
    `overrides` replace any of these settings."""
    from trl import GRPOConfig

    extra = {}
    if zero_stage is not None:
        extra["deepspeed"] = {
            "zero_optimization": {"stage": zero_stage},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        }
    settings = dict(
        output_dir=run_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=STEPS,
        learning_rate=5e-2,
        beta=0.1,
        sync_ref_model=True,
        ref_model_sync_steps=TAU,
        ref_model_mixup_alpha=alpha,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
    )
    return GRPOConfig(**{**settings, **extra, **overrides})


def run_grpo(mode: str, model_dir: str, out_dir: str) -> dict:
    from datasets import Dataset

    from trl import GRPOTrainer, SyncRefModelCallback

    records: list[dict] = []

    class CheckedSyncCallback(SyncRefModelCallback):
        def sync(self, args, state, model):
            unwrap = self.accelerator.unwrap_model
            checked_sync(
                super(), args, state, unwrap(model), unwrap(self.ref_model), records, args.ref_model_mixup_alpha
            )

    args = grpo_config(os.path.join(out_dir, f"{mode}_run"), int(mode[-1]) if mode.startswith("zero") else None, ALPHA)
    callback = CheckedSyncCallback(ref_model=None)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=digits_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        callbacks=[callback],
    )
    generate_saw_full_weights, generate_collectives = [], []
    policy_generate = trainer.model.generate

    def available(params) -> bool:
        return all(getattr(p, "ds_status", None) is None or p.ds_status.name == "AVAILABLE" for p in params)

    def recording_generate(*args, **kwargs):
        """ZeRO-3: are the weights gathered for generate (ds3_gather_for_generation), and do they stay gathered,
        with no collective inside `generate` (no per-layer fetches at each decode step)?"""
        params = list(trainer.model.parameters())
        before = available(params)
        with count_collectives() as counts:
            out = policy_generate(*args, **kwargs)
        generate_saw_full_weights.append(before and available(params))
        generate_collectives.append(counts["by_name"])
        return out

    trainer.model.generate = recording_generate
    trainer.train()
    result = {
        "syncs": records,
        "num_syncs": trainer.sync_callback.num_syncs,
        "bound_callback": trainer.sync_callback is callback,
        "ref_type": type(trainer.ref_model).__name__,
        "policy_type": type(trainer.model_wrapped).__name__,
        "fallback": len(callback._sync.fallback),
        "generate_saw_full_weights": generate_saw_full_weights,
        "generate_collectives": generate_collectives,
    }
    result["ref_forward_error"] = reference_forward_error(trainer)
    result["shared_scoring"] = shared_scoring(trainer)
    result["checkpoint_roundtrip_equal"] = checkpoint_roundtrip(trainer)
    if mode == "zero3":
        result["mismatch"] = zero3_mismatch(trainer)
        result["generation_probe"] = zero3_generation_probe(trainer)
    return result


def zero3_generation_probe(trainer) -> dict:
    """Plain and shared-prefix generation of the same prompts with the same seed, inside the gathered block of
    `ds3_gather_for_generation=True`: the tokens, the forwards and the collectives inside the call."""
    from trl.generation.grpo_generation import sample_completions
    from trl.models.utils import unwrap_model_for_generation

    # 2 distinct 20-token prompts, each twice: long enough for shared-prefix generation to share
    ids = torch.randint(5, 300, (2, 20), generator=torch.Generator().manual_seed(0)).repeat_interleave(2, 0)
    engine = trainer.model_wrapped
    module_ids = {name: module.ds_id for name, module in engine.module.named_modules()}
    out = {}
    for implementation in ("generate", "shared_prefix"):
        forwards = []
        with unwrap_model_for_generation(engine, trainer.accelerator, True) as model:
            hook = model.register_forward_pre_hook(lambda module, inputs: forwards.append(1))
            torch.manual_seed(1)
            with count_collectives() as counts:
                completions = sample_completions(
                    model, ids, torch.ones_like(ids), trainer.generation_config, implementation
                )
            hook.remove()
        out[implementation] = {
            "ids": completions.tolist(),
            "forwards": len(forwards),
            "collectives": counts["by_name"],
        }
    # the hooks came back as DeepSpeed set them up: module ids kept, every parameter released, none marked in use
    out["module_ids_kept"] = module_ids == {name: module.ds_id for name, module in engine.module.named_modules()}
    out["params_released"] = all(
        not p.ds_active_sub_modules and p.ds_status.name == "NOT_AVAILABLE" for p in engine.module.parameters()
    )
    return out


def checkpoint_roundtrip(trainer) -> bool:
    """Save a checkpoint, zero this rank's part of the reference, restore it: is the gathered reference bitwise back?"""
    from trl.reference.layouts import local_part
    from trl.reference.ref_sync import named_float_tensors

    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    before = full_state(reference)
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)
    with torch.no_grad():
        for _, tensor in named_float_tensors(reference):
            local_part(tensor).zero_()
    folder = os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
    trainer.accelerator.wait_for_everyone()  # rank 0 writes the file the others read
    trainer._load_reference_state(folder)
    after = full_state(reference)
    return all(torch.equal(before[n], after[n]) for n in before) and any(t.abs().sum() > 0 for t in after.values())


def reference_forward_error(trainer) -> float:
    """Max |logits| difference between the synced reference as prepared (engine) and a plain copy of its weights.

    Catches a forward that still reads stale gathered copies instead of the mixed partitions.
    """
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    state = full_state(reference)
    plain = type(reference)(reference.config)  # the constructor does not enter zero.Init
    plain.load_state_dict(state, strict=False)
    plain.eval()
    input_ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = plain(input_ids=input_ids).logits
        actual = trainer.ref_model(input_ids=input_ids).logits
    return (actual - expected).abs().max().item()


def shared_scoring(trainer) -> dict:
    """Shared-prefix scoring through the prepared policy (DDP or DeepSpeed engine, training mode): the max |log-prob
    difference| to one plain pass without gradients, and whether passes without and with gradients share (not for
    ZeRO-3 parameters); then the same for packed rows that start with their prompt (`packed="inline"`: one pass, no
    cache, so also for ZeRO-3 parameters)."""
    from trl.scoring.grpo_scoring import score_completions

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(5, 40, (2, 6), generator=g).repeat_interleave(3, 0)
    input_ids = torch.cat([prompts, torch.randint(5, 40, (6, 4), generator=g)], 1)
    mask = torch.ones_like(input_ids)
    mask[:3, :2] = 0  # a left-padded prompt
    policy = trainer.model_wrapped
    policy.train()
    inner = trainer.accelerator.unwrap_model(trainer.model)
    forward, shapes = inner.forward, []
    inner.forward = lambda **kwargs: shapes.append(list(kwargs["input_ids"].shape)) or forward(**kwargs)
    with torch.no_grad():
        plain = score_completions(policy, input_ids, mask, 4, 1.0, share_prefix=False).per_token_logps
        assert shapes == [[6, 10]], shapes  # one plain pass
        shapes.clear()
        shared = score_completions(
            policy, input_ids, mask, 4, 1.0, share_prefix=True, min_prefix_tokens=1
        ).per_token_logps
        shares_without_gradients = shapes == [[2, 5], [6, 5]]  # 2 distinct prompts, then every row
    shapes.clear()
    assert score_completions(
        policy, input_ids, mask, 4, 1.0, share_prefix=True, min_prefix_tokens=1
    ).per_token_logps.requires_grad
    shares_with_gradients = shapes == [[2, 5], [6, 5]]
    inline_kwargs = dict(share_prefix=True, min_prefix_tokens=1, packed="inline")
    shapes.clear()
    with torch.no_grad():
        inline = score_completions(policy, input_ids, mask, 4, 1.0, **inline_kwargs).per_token_logps
        inline_without_gradients = len(shapes) == 1 and shapes[0][0] < 6  # one pass, fewer rows than the batch
    shapes.clear()
    assert score_completions(policy, input_ids, mask, 4, 1.0, **inline_kwargs).per_token_logps.requires_grad
    inner.forward = forward
    return {
        "error": (shared - plain).abs().max().item(),
        "shares_without_gradients": shares_without_gradients,
        "shares_with_gradients": shares_with_gradients,
        "inline_error": (inline - plain).abs().max().item(),
        "inline_without_gradients": inline_without_gradients,
        "inline_with_gradients": len(shapes) == 1 and shapes[0][0] < 6,
    }


def zero3_mismatch(trainer) -> dict:
    """Force partition mismatches: a ZeRO-3 policy with an unpartitioned reference, and the other way round."""
    import deepspeed
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    from trl import SyncRefModelCallback
    from trl.models.utils import prepare_deepspeed

    class State:
        global_step = 0

    out = {}
    policy_z3 = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    plain_ref = type(policy_z3)(policy_z3.config)  # the constructor does not enter zero.Init (from_* would)
    with deepspeed.zero.GatheredParameters(list(policy_z3.parameters())):
        plain_policy = {n: p.detach().clone() for n, p in policy_z3.named_parameters()}
    for name, p in plain_ref.named_parameters():
        p.data.copy_(plain_policy[name] * 0.5)
    assert not is_deepspeed_zero3_enabled() or not hasattr(next(plain_ref.parameters()), "ds_id")

    # (a) partitioned policy, replicated reference: gather each policy parameter, mix into the replica.
    cases = {"policy_zero3_ref_plain": (policy_z3, plain_ref)}
    # (b) replicated policy, partitioned reference: gather each reference parameter, mix, re-partition.
    ref_z3 = prepare_deepspeed(
        AutoModelForCausalLM.from_pretrained(policy_z3.config._name_or_path), trainer.accelerator
    ).module
    cases["policy_plain_ref_zero3"] = (plain_ref, ref_z3)
    for case, (policy, reference) in cases.items():
        records: list[dict] = []
        callback = SyncRefModelCallback(ref_model=reference)
        args = type("Args", (), {"ref_model_mixup_alpha": ALPHA})()
        for _ in range(2):
            checked_sync(callback, args, State, policy, reference, records, ALPHA)
        out[case] = {
            "syncs": records,
            "fallback": len(callback._sync.fallback),
            "local": len(callback._sync.local),
            "warnings_total": sum(len(r["warnings"]) for r in records),
        }
    return out


def run_fsdp2(model_dir: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    from transformers import AutoModelForCausalLM

    from trl import SyncRefModelCallback

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    class State:
        global_step = 0

    args = type("Args", (), {"ref_model_mixup_alpha": ALPHA})()

    def sharded(seed: int, placement=None):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        generator = torch.Generator().manual_seed(seed)  # same values on every rank
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=generator))
        kwargs = {"mesh": mesh}
        if placement is not None:
            kwargs["shard_placement_fn"] = placement
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model

    out = {}
    on_dim1 = lambda p: Shard(1) if p.dim() == 2 else Shard(0)  # noqa: E731
    for case, ref_placement in (("matched", None), ("mismatch", on_dim1)):
        policy, reference = sharded(1), sharded(2, ref_placement)
        callback = SyncRefModelCallback(ref_model=reference)
        records: list[dict] = []
        for round_ in range(2):
            checked_sync(callback, args, State, policy, reference, records, ALPHA)
            with torch.no_grad():  # move the policy again (same change on every rank, local shards only)
                for p in policy.parameters():
                    p.to_local().mul_(1.0 + 0.01 * (round_ + 1))
        with torch.no_grad():  # the synced reference still runs a forward (reads the mixed shards)
            logits = reference(input_ids=torch.tensor([[1, 2, 3]])).logits
        out[case] = {
            "syncs": records,
            "fallback": len(callback._sync.fallback),
            "local": len(callback._sync.local),
            "warnings_total": sum(len(r["warnings"]) for r in records),
            "dtensor_params": sum(type(p).__name__ == "DTensor" for p in reference.parameters()),
            "forward_finite": bool(torch.isfinite(logits).all()),
        }
    return out


def run_zero3_lora(model_dir: str, out_dir: str) -> dict:
    """LoRA policy under ZeRO-3 with its frozen "ref" adapter: after hard syncs (α = 1) the gathered reference
    adapter equals the gathered policy adapter, bit for bit, and the mixed parts were real partitions."""
    from datasets import Dataset
    from peft import LoraConfig

    from trl import GRPOTrainer
    from trl.reference.layouts import tensor_layout

    args = grpo_config(os.path.join(out_dir, "zero3_lora_run"), 3, 1.0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=digits_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        peft_config=lora,
    )
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    adapter = {n.replace(".default.", ".ref."): p for n, p in policy.named_parameters() if ".default." in n}
    reference = {n: p for n, p in policy.named_parameters() if ".ref." in n}
    local_numels = [p.ds_tensor.numel() for p in reference.values() if tensor_layout(p) == "zero3"]
    full_adapter, full_reference = full_state_of(adapter), full_state_of(reference)
    return {
        "num_syncs": trainer.sync_callback.num_syncs,
        "zero3_reference_params": len(local_numels),
        "reference_params": len(reference),
        "local_numel": sum(local_numels),
        "equal": sorted(full_adapter) == sorted(full_reference)
        and all(torch.equal(full_adapter[n], full_reference[n]) for n in full_reference),
        "lora_b_moved": any(full_reference[n].abs().sum().item() > 0 for n in full_reference if "lora_B" in n),
    }


def full_state_of(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The given ZeRO-3 (or plain) parameters gathered whole on this rank."""
    import deepspeed

    zero3 = [t for t in tensors.values() if hasattr(t, "ds_id")]
    with deepspeed.zero.GatheredParameters(zero3):
        return {n: t.detach().clone() for n, t in tensors.items()}


def main() -> None:
    mode, model_dir, out_dir = sys.argv[1:4]
    torch.manual_seed(0)
    if mode.startswith("zero"):  # DeepSpeed's comm layer must know the world before from_pretrained partitions
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    result = run_zero3_lora(model_dir, out_dir) if mode == "zero3_lora" else run_grpo(mode, model_dir, out_dir)
    finish(mode, out_dir, result)


def finish(mode: str, out_dir: str, result: dict) -> None:
    """Write this rank's `result` (with the world size) to `OUT_DIR/<mode>_rank<r>.json` and exit (every worker)."""
    result["world_size"] = dist.get_world_size()
    with open(os.path.join(out_dir, f"{mode}_rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # results are written: skip interpreter teardown, where gloo has been seen to abort


if __name__ == "__main__":
    main()
