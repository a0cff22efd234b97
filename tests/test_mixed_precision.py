# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The trainer's default paths under bf16 mixed precision (`GRPOConfig`'s default `bf16=True`, on the CPU with
`use_cpu=True`) against the plain path, TRL's own computation, on the same completions: fp32 weights under bf16
autocast, bf16 weights, LoRA on q/v (from a config or as a `PeftModel`, with and without gradient checkpointing) and
on every linear layer, each with a reward model given as a path.

Chat prompts of ~25 tokens, so that every default path engages (shared-prefix generation, shared and packed scoring,
block-wise log-probs, and for the tied full fine-tune the sparse embedding gradient). The plain run replays the
default run's completions (an override of TRL's `_generate_single_turn`), so the two runs score the same tokens.
"bf16 noise" is measured, not assumed: a third run, the plain path in float32 (`bf16=False`) on the same completions,
gives the distance that bf16 itself puts between two computations of the same step.
"""

import pytest
import torch
from conftest import tiny_grpo_kwargs
from transformers import AutoModelForCausalLM, TrainerCallback

from trl import GRPOConfig, GRPOTrainer
from trl.generation import grpo_generation
from trl.scoring import lm_head, scoring_plan
from trl.tasks import make_arithmetic_dataset
from trl.tasks.arithmetic import SUM_QUESTION


# every performance field off: what TRL computes (generation is replayed, so only scoring differs in these runs)
PLAIN_PATHS = dict(shared_prefix=False, inverse_cdf_sampling=False, chunked_logprobs=False)
QV = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
# name: (weights' dtype, LoRA target modules or None, LoRA given as a PeftModel, gradient checkpointing)
CASES = {
    "fp32_weights_bf16_autocast": ("float32", None, False, True),
    "bf16_weights": ("bfloat16", None, False, False),
    "lora_qv_config": ("float32", QV, False, False),
    "lora_qv_config_checkpointing": ("float32", QV, False, True),
    "lora_qv_peft_model": ("float32", QV, True, False),
    "lora_qv_peft_model_checkpointing": ("float32", QV, True, True),
    "lora_all_linear": ("float32", dict(r=4, lora_alpha=8, target_modules="all-linear"), False, False),
}
# which default path ran: calls of these module functions that returned something (a cache, a packing plan) in the
# default run, none in the plain runs
SPIED = {
    "generation prompt cache": (grpo_generation, "shared_prefix_cache"),
    "scoring prompt cache or packed rows": (scoring_plan, "pack_completions"),
    "block-wise log-probs": (lm_head, "head_logprobs"),
}


class ReplayTrainer(GRPOTrainer):
    """Records the completions that `_generate_single_turn` samples into `self.completions`, or, with `replay`,
    returns the recorded ones in order (checking that the prompts are the same)."""

    completions: list
    replay = False

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        if self.replay:
            recorded_prompts, result = self.completions.pop(0)
            assert recorded_prompts == prompt_ids
            return result
        result = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self.completions.append((prompt_ids, result))
        return result


class GradientRecorder(TrainerCallback):
    """The float32 copies of every gradient right before each optimizer step."""

    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})


def run(case, lm_path, rm_path, output_dir, completions, replay, monkeypatch, paths=None, bf16=True):
    """Two steps of `case`; returns (logged losses and KLs, gradients per step, parameters before and after, trainable
    names, spied path counts)."""
    from peft import LoraConfig, get_peft_model

    dtype, lora, given_peft_model, checkpointing = CASES[case]
    model, peft_config = lm_path, None
    if lora is not None:
        peft_config = LoraConfig(task_type="CAUSAL_LM", **lora)
    if dtype == "bfloat16" or given_peft_model:
        model = AutoModelForCausalLM.from_pretrained(lm_path, dtype=dtype)
    torch.manual_seed(0)  # the LoRA weights are drawn from the global generator, here or in the trainer's __init__
    if given_peft_model:
        model, peft_config = get_peft_model(model, peft_config), None
    calls = {}
    for label, (module, name) in SPIED.items():
        original = getattr(module, name)

        def spy(*args, _original=original, _label=label, **kwargs):
            result = _original(*args, **kwargs)
            calls[_label] = calls.get(_label, 0) + (result is not None)
            return result

        monkeypatch.setattr(module, name, spy)
    args = GRPOConfig(
        **{
            **tiny_grpo_kwargs(output_dir),
            "bf16": bf16,
            "gradient_checkpointing": checkpointing,
            "per_device_train_batch_size": 6,  # 2 prompts × 3 completions, one micro-batch a step
            "num_generations": 3,
            "gradient_accumulation_steps": 1,
            "max_prompt_length": None,  # whole chat prompts: every shared path engages
            "max_completion_length": 8,
            "learning_rate": 1e-3,
            "max_steps": 2,
            **(paths or {}),
        }
    )
    recorder = GradientRecorder()
    trainer = ReplayTrainer(
        model=model,
        reward_funcs=rm_path,
        args=args,
        train_dataset=make_arithmetic_dataset(16, seed=0, conversational=True, template=SUM_QUESTION),
        peft_config=peft_config,
        callbacks=[recorder],
    )
    trainer.completions, trainer.replay = completions, replay
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    monkeypatch.undo()
    logs = [(h["loss"], h["kl"]) for h in trainer.state.log_history if "loss" in h]
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    return logs, recorder.grads, before, after, trainable, calls


def distance(grads: dict, reference: dict) -> float:
    """‖grads − reference‖ / ‖reference‖ over all parameters together."""
    squared = sum(((grads[n] - g) ** 2).sum() for n, g in reference.items())
    return (squared / sum((g**2).sum() for g in reference.values())).sqrt().item()


@pytest.mark.parametrize("case", list(CASES))
def test_default_paths_train_under_bf16_as_the_plain_path(case, tiny_lm_path, tiny_rm_path, tmp_path, monkeypatch):
    completions = []
    default = run(case, tiny_lm_path, tiny_rm_path, str(tmp_path / "d"), completions, False, monkeypatch)
    recorded = list(completions)
    plain = run(case, tiny_lm_path, tiny_rm_path, str(tmp_path / "p"), completions, True, monkeypatch, PLAIN_PATHS)
    fp32 = run(case, tiny_lm_path, tiny_rm_path, str(tmp_path / "f"), recorded, True, monkeypatch, PLAIN_PATHS, False)
    (logs, grads, before, after, trainable, calls) = default
    assert len(grads) == 2 and not completions and not recorded  # both replays used every recorded batch

    # the default paths ran in the default run and none of them in the plain runs
    lora = CASES[case][1]
    assert {label for label, count in calls.items() if count} == set(SPIED), calls
    assert not any(plain[5].values()) and not any(fp32[5].values())

    # only trainable parameters move; with LoRA those are the adapter's, all of which move, and the base stays as it
    # was to the bit (bf16 weights: an update below half a bf16 ulp is lost, as in TRL, so some stay)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and moved <= trainable
    if lora is not None:
        assert trainable == moved and all(".lora_" in n for n in trainable)
        assert all(torch.equal(before[n], after[n]) for n in before if n not in trainable)

    # within bf16 noise: the default path is no farther from the plain bf16 path than bf16 is from float32 (the plain
    # path's own bf16-vs-float32 distance, measured on the same completions); at step 1 (same weights) half of it
    for step, (d, p, f) in enumerate(zip(grads, plain[1], fp32[1])):
        noise = distance(p, f)
        assert 0 < noise < 0.1, noise  # bf16 rounds (measured 1.0e-2 to 3.4e-2), and not wildly
        assert distance(d, p) <= (0.5 if step == 0 else 1.0) * noise, (step, distance(d, p), noise)
    for (loss, kl), (plain_loss, plain_kl), (fp32_loss, fp32_kl) in zip(logs, plain[0], fp32[0]):
        # the loss is β·KL plus the advantages' token sum at ratio 1, ~1e-7 of float32 rounding: hence the floor. It
        # bites for the full fine-tunes (loss ≈ 2e-4); with LoRA (KL ~1e-5, loss ~1e-7) the KL and gradient checks do
        assert abs(loss - plain_loss) <= abs(plain_loss - fp32_loss) + 1e-6, (loss, plain_loss, fp32_loss)
        assert abs(kl - plain_kl) <= abs(plain_kl - fp32_kl) + 1e-9, (kl, plain_kl, fp32_kl)
