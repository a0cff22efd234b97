# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPOTrainer under accelerate's FSDP2 plugin on 2 CPU processes (gloo), for tests/test_fsdp2.py.

    accelerate launch --config_file trl/accelerate_configs/fsdp2.yaml --num_processes 2 --mixed_precision no \
        tests/distributed_workers/fsdp2_trainer_worker.py MODE MODEL_DIR OUT_DIR

MODE: `fsdp2` (iterative GRPO, checkpoints every 2 steps), `fsdp2_resume` (resumes `fsdp2`'s checkpoint-2 and
trains to the same last step), `fsdp2_lora` (the `fsdp2` run with a LoRA policy and its "ref" adapter, no
checkpoints), `ddp` (the `fsdp2` run without FSDP, started with `torchrun`: what FSDP2 must match).

accelerate 1.15 turns FSDP on only for GPU-like devices: with `use_cpu=True` it runs CPU processes as DDP (gloo) and
drops the FSDP plugin it built from the launch's environment. `enable_fsdp_on_cpu` lifts exactly that one check (the
distributed type); the rest is accelerate's own FSDP2 code: the plugin from `accelerate launch`'s environment,
`fsdp2_prepare_model` (auto-wrap policy, `fully_shard`, the full state dict broadcast from rank 0 with
`cpu_ram_efficient_loading`), FSDP2 gradient clipping and the FSDP checkpoint save/load that `Trainer` calls.
Each rank writes `OUT_DIR/<mode>_rank<r>.json`.
"""

import hashlib
import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from sync_worker import (
    PROMPTS,
    checked_sync,
    count_collectives,
    digits_reward,
    finish,
    full_state,
    grpo_config,
    run_fsdp2,
)  # noqa: E402


ALPHA, TAU, STEPS, SAVE_STEPS, RESUME_FROM = 0.6, 2, 6, 2, 2


def enable_fsdp_on_cpu() -> None:
    """Let accelerate keep its FSDP plugin on CPU processes (see the module docstring)."""
    import accelerate.state
    from accelerate.utils import DistributedType

    original = accelerate.state.AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and kwargs.get("fsdp_plugin") is not None:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = kwargs["fsdp_plugin"]
            # as accelerate records it, so that later `AcceleratorState()` calls keep it
            accelerate.state.PartialState._shared_state["distributed_type"] = self.distributed_type

    accelerate.state.AcceleratorState.__init__ = init


def digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of every tensor's bytes, in name order: equal digests mean bitwise-equal models."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def grpo_args(output_dir: str):
    """`sync_worker`'s GRPO run (τ = 2, α = 0.6), for 6 steps with a checkpoint every 2."""
    return grpo_config(output_dir, None, ALPHA, max_steps=STEPS, save_strategy="steps", save_steps=SAVE_STEPS)


def gathered(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of `tensors`, DTensors gathered whole (every rank must call it)."""
    return {
        n: (t.detach().full_tensor() if type(t).__name__ == "DTensor" else t.detach()).clone()
        for n, t in tensors.items()
    }


def checked_adapter_sync(callback, args, state, policy, records: list) -> None:
    """Run `callback.sync` on a LoRA policy: its "ref" adapter must become lerp_fp32(ref, default, α) of the gathered
    tensors, with no collective during the sync."""
    from trl.models.utils import adapter_parameters

    def adapters():
        default = adapter_parameters(policy, "default")
        return {n.replace(".default.", ".ref."): t for n, t in default.items()}, adapter_parameters(policy, "ref")

    default, reference = adapters()
    default_before, ref_before = gathered(default), gathered(reference)
    with count_collectives() as counts:
        callback.sync(args, state, policy)
    ref_after = gathered(adapters()[1])
    alpha = args.ref_model_mixup_alpha
    records.append(
        {
            "step": state.global_step,
            "dtensors": sum(type(t).__name__ == "DTensor" for t in reference.values()),
            "tensors": len(reference),
            "max_error": max(
                (ref_after[n] - torch.lerp(ref_before[n], default_before[n], alpha)).abs().max().item()
                for n in ref_after
            ),
            "policy_ref_gap": max((default_before[n] - ref_before[n]).abs().max().item() for n in ref_before),
            "collectives": counts["calls"],
            "profiler_collectives": counts["profiler_events"],
            "profiler_names": counts["profiler_names"],
            "checksum": [sum(t.double().sum().item() for t in ref_after.values())],
        }
    )


def build_trainer(model_dir: str, output_dir: str, generations: list, syncs: list, lora: bool = False):
    """A GRPOTrainer that records every generation call (completions, all-gathers, forwards) and checks every
    reference sync against the formula (gathered before and after, collectives counted around the sync alone:
    `sync_worker.checked_sync` for a reference model, `checked_adapter_sync` for a LoRA reference adapter)."""
    from datasets import Dataset
    from peft import LoraConfig

    from trl import GRPOTrainer, SyncRefModelCallback

    class CheckedSyncCallback(SyncRefModelCallback):
        def sync(self, args, state, model):
            unwrap = self.accelerator.unwrap_model
            if lora:
                checked_adapter_sync(super(), args, state, unwrap(model), syncs)
            else:
                reference = unwrap(self.ref_model)
                checked_sync(super(), args, state, unwrap(model), reference, syncs, args.ref_model_mixup_alpha)

    class RecordingTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            policy = self.accelerator.unwrap_model(self.model)
            forwards = []
            hook = policy.register_forward_pre_hook(lambda module, inputs: forwards.append(1))
            with count_collectives() as counts:
                completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            hook.remove()
            generations.append(
                {
                    "step": self.state.global_step,
                    "completion_ids": completion_ids,
                    "fsdp_all_gathers": counts["fsdp_all_gathers"],
                    "forwards": len(forwards),
                }
            )
            return completion_ids, logprobs

    args = grpo_args(output_dir)
    if lora:
        args.save_strategy = "no"
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return RecordingTrainer(
        model=model_dir,
        reward_funcs=digits_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        callbacks=[CheckedSyncCallback(ref_model=None)],
        peft_config=peft_config if lora else None,
    )


def placements(model) -> dict[str, list]:
    """Each parameter's layout and local shape (DTensor placements included): what decides a local sync."""
    from trl.reference.layouts import partitioning

    return {name: [str(x) for x in partitioning(p)] for name, p in model.named_parameters()}


def reshard_settings(policy) -> list:
    """Each FSDP2 state's reshard-after-forward setting (private attributes; what `fsdp2_gathered` must restore)."""
    from trl.models.utils import fsdp2_modules

    states = [m._get_fsdp_state() for m in fsdp2_modules(policy)]
    return [(s._auto_reshard_after_forward, [g.post_forward_mesh_info for g in s._fsdp_param_groups]) for s in states]


def all_sharded(policy) -> bool:
    return all(type(p).__name__ == "DTensor" and p.to_local().numel() < p.numel() for p in policy.parameters())


def generation_probe(trainer, model_dir: str) -> dict:
    """After training: sample the same prompts with the same seed from the FSDP2 policy, its weights gathered once
    (the default), by FSDP2 at every forward (`ds3_gather_for_generation=False`), or gathered once on a torch without
    the private attributes `fsdp2_gathered` reads (hidden here: it must fall back to FSDP2's own gathering), plain and
    shared-prefix, and from a plain (unsharded) copy of its weights; count FSDP2's all-gathers and the forwards."""
    from transformers import AutoModelForCausalLM

    from trl.generation.grpo_generation import sample_completions
    from trl.models.utils import fsdp2_modules, unwrap_model_for_generation

    policy = trainer.model_wrapped
    config = trainer.generation_config
    # 2 distinct 20-token prompts, each twice: long enough for shared-prefix generation to share
    ids = torch.randint(5, 300, (2, 20), generator=torch.Generator().manual_seed(0)).repeat_interleave(2, 0)
    mask = torch.ones_like(ids)
    plain = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(model_dir).config)
    plain.load_state_dict(full_state(trainer.accelerator.unwrap_model(policy)), strict=False)
    plain.tie_weights()
    settings = reshard_settings(policy)
    out = {"restored": True, "sharded_on_exit": True}
    for implementation in ("generate", "shared_prefix"):
        torch.manual_seed(1)
        out[f"plain_{implementation}"] = sample_completions(plain, ids, mask, config, implementation).tolist()
        for case in ("per_forward", "once", "fallback"):
            hidden = {}
            if case == "fallback":
                for module in fsdp2_modules(policy):
                    state = module._get_fsdp_state()
                    hidden[state] = state.__dict__.pop("_auto_reshard_after_forward")
            forwards = []
            hook = policy.register_forward_pre_hook(lambda module, inputs: forwards.append(1))
            torch.manual_seed(1)
            with count_collectives() as counts:
                with unwrap_model_for_generation(policy, trainer.accelerator, case != "per_forward") as m:
                    completions = sample_completions(m, ids, mask, config, implementation)
            hook.remove()
            for state, value in hidden.items():
                state._auto_reshard_after_forward = value
            if case == "once":
                out["sharded_on_exit"] &= all_sharded(policy)
                out["restored"] &= reshard_settings(policy) == settings
            out[f"fsdp2_{implementation}_{case}"] = {
                "ids": completions.tolist(),
                "fsdp_all_gathers": counts["fsdp_all_gathers"],
                "forwards": len(forwards),
            }
            for module in fsdp2_modules(policy):  # FSDP2 itself leaves the last-run group gathered after a forward
                module.reshard()
    return out


def run(mode: str, model_dir: str, out_dir: str) -> dict:
    from safetensors.torch import load_file

    from trl.models.utils import adapter_parameters, fsdp2_modules
    from trl.scoring.prefix_sharing import scoring_sharing_blocker

    lora = mode == "fsdp2_lora"
    generations, syncs = [], []
    trainer = build_trainer(model_dir, os.path.join(out_dir, f"{mode}_run"), generations, syncs, lora=lora)
    unwrap = trainer.accelerator.unwrap_model
    result = {"distributed_type": trainer.accelerator.distributed_type.value}
    if not lora:
        reference = unwrap(trainer.ref_model)
        checkpoint_weights = load_file(os.path.join(model_dir, "model.safetensors"))  # read by every rank here
        ref_at_init = full_state(reference)
        result.update(
            {
                "ref_type": type(trainer.ref_model).__name__,
                "ref_layouts": sorted({placement[0] for placement in placements(reference).values()}),
                "ref_init_equals_checkpoint": all(
                    torch.equal(ref_at_init[n], checkpoint_weights[n]) for n in checkpoint_weights if n in ref_at_init
                ),
                "ref_init_names_checked": sum(n in ref_at_init for n in checkpoint_weights),
            }
        )
    resume = os.path.join(out_dir, "fsdp2_run", f"checkpoint-{RESUME_FROM}") if mode == "fsdp2_resume" else None
    trainer.train(resume_from_checkpoint=resume)
    policy = unwrap(trainer.model_wrapped)
    result.update(
        {
            "policy_type": type(trainer.model_wrapped).__name__,
            # what FSDP2 all-gathers as one: each layer, and the embedding, final norm and LM head together
            "fsdp_param_groups": sum(len(m._get_fsdp_state()._fsdp_param_groups) for m in fsdp2_modules(policy)),
            "fallback": len(trainer.sync_callback._sync.fallback),
            "local_pairs": len(trainer.sync_callback._sync.local),
            "scoring_blocker": scoring_sharing_blocker(trainer.model_wrapped),
            "syncs": syncs,
            "num_syncs": trainer.sync_callback.num_syncs,
            "generations": generations,
            "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
            "global_step": trainer.state.global_step,
            "policy_digest": digest(full_state(policy)),
        }
    )
    if lora:
        ref_adapter = adapter_parameters(policy, "ref")
        result["ref_adapter_layouts"] = sorted({type(t).__name__ for t in ref_adapter.values()})
        result["ref_adapter_digest"] = digest(gathered(ref_adapter))
    else:
        result["same_placements"] = placements(policy) == placements(reference)
        result["reference_digest"] = digest(full_state(reference))
    if mode == "fsdp2":
        result["probe"] = generation_probe(trainer, model_dir)
        result["raw"] = run_fsdp2(model_dir)  # hand-sharded models: matched and mismatched placements
    return result


def main() -> None:
    mode, model_dir, out_dir = sys.argv[1:4]
    enable_fsdp_on_cpu()
    finish(mode, out_dir, run(mode, model_dir, out_dir))


if __name__ == "__main__":
    main()
