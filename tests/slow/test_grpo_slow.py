# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The slow suite: iterative GRPO on the real SmolLM2-135M-Instruct (Llama, tied embeddings, chat template) with
conversational prompts, checking the reference model around every optimizer step.

On a GPU (bf16 weights and autocast):        make slow_tests
On the CPU (fp32, `use_cpu`, smaller runs):  TRL_SLOW_TESTS_ON_CPU=1 make slow_tests   (~4 min on 2 cores)

Without CUDA and without the switch the tests are skipped (tests/conftest.py). `make slow_tests` sets
OMP_WAIT_POLICY=PASSIVE: on a CPU shared with other jobs, spinning OpenMP threads made a step ~10x slower.

Every training test asserts, through `sync_checks.SyncChecker` / `check_records`: the policy moved; right before
each sync the reference differed from the policy, and after it the reference is round(lerp_fp32(reference, policy,
α)) (bitwise; 1 ulp of slack for soft α on CUDA); between syncs the reference did not change. On top of that:
full fine-tuning with a hard and a soft sync (tied embeddings stay one tensor in both models), LoRA (the reference
adapter is the trained adapter after the hard sync, base weights unchanged), gradient checkpointing (a gradient at
every step), ZeRO-3 on one process (the reference partitioned like the policy, synced shard-locally with no
fallback, gathered weights equal) and shared-prefix scoring against one plain pass. The ZeRO-3 run is a subprocess
(`python tests/slow/sync_checks.py`): DeepSpeed's ZeRO-3 flag stays set in accelerate's state for the rest of a
process, and every later `from_pretrained` there would come back partitioned.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from sync_checks import (
    DEVICE,
    ON_CPU,
    SHORT_STEPS,
    STEPS,
    TAU,
    SyncChecker,
    check_records,
    length_reward,
    prompt_dataset,
    sampled_chat_batch,
    slow_config,
    tied,
    whole_parameters,
)
from test_distributed import ROOT, _env, _free_port

from trl import GRPOTrainer


pytestmark = pytest.mark.slow
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sync_checks.py")


def adapter_tensors(model, adapter: str) -> dict[str, torch.Tensor]:
    """Copies of one PEFT adapter's tensors, keyed by name with the adapter's name masked."""
    tag = f".{adapter}."
    return {n.replace(tag, ".<adapter>."): p.detach().clone() for n, p in model.named_parameters() if tag in n}


def train_checked(model_dir: str, output_dir, alpha: float, peft_config=None, **overrides):
    """A trainer (STEPS steps unless `max_steps` is given) with a SyncChecker on the whole model, or with
    `peft_config` on the two adapters; call `train()` on it."""
    holder = {}
    if peft_config is None:
        unwrap = lambda model: holder["t"].accelerator.unwrap_model(model)  # noqa: E731
        policy_tensors = lambda: whole_parameters(unwrap(holder["t"].model))  # noqa: E731
        reference_tensors = lambda: whole_parameters(unwrap(holder["t"].ref_model))  # noqa: E731
    else:
        policy_tensors = lambda: adapter_tensors(holder["t"].model, "default")  # noqa: E731
        reference_tensors = lambda: adapter_tensors(holder["t"].model, "ref")  # noqa: E731
    checker = SyncChecker(policy_tensors, reference_tensors, alpha)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=length_reward,
        args=slow_config(str(output_dir), ref_model_mixup_alpha=alpha, **overrides),
        train_dataset=prompt_dataset(),
        peft_config=peft_config,
        callbacks=[checker.before],
    )
    holder["t"] = trainer
    trainer.add_callback(checker)
    return trainer, checker


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if "loss" in h]


def assert_trained(trainer, steps: int = STEPS) -> None:
    """`steps` finite losses, a sync every TAU steps, and rewards that varied inside (almost) every group."""
    losses = logged(trainer, "loss")
    assert len(losses) == steps and all(torch.isfinite(torch.tensor(losses))), losses
    assert all(f <= 0.25 for f in logged(trainer, "frac_reward_zero_std")), logged(trainer, "frac_reward_zero_std")
    assert trainer.sync_callback.num_syncs == steps // TAU


def optimizer_ids(trainer) -> set[int]:
    return {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}


@pytest.mark.parametrize("alpha", [1.0, 0.6], ids=["hard", "soft"])
def test_full_finetune_sync_is_exact(smollm2_path, tmp_path, alpha):
    trainer, checker = train_checked(smollm2_path, tmp_path, alpha)
    trainer.train()
    assert_trained(trainer)
    check_records(checker, alpha)
    unwrap = trainer.accelerator.unwrap_model
    policy, reference = unwrap(trainer.model), unwrap(trainer.ref_model)
    dtype = torch.float32 if ON_CPU else torch.bfloat16
    assert {p.dtype for p in reference.parameters()} == {p.dtype for p in policy.parameters()} == {dtype}
    assert tied(policy) and tied(reference)  # one embedding/LM-head tensor each, synced once
    assert not any(p.requires_grad for p in reference.parameters())
    assert not optimizer_ids(trainer) & {id(p) for p in reference.parameters()}


def test_lora_sync_copies_the_adapter(smollm2_path, tmp_path):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer, checker = train_checked(
        smollm2_path, tmp_path, 1.0, peft_config=peft_config, learning_rate=1e-3, max_steps=SHORT_STEPS
    )
    adapters = (".default.", ".ref.")
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not any(a in n for a in adapters)}
    trainer.train()
    assert_trained(trainer, SHORT_STEPS)
    # after the (hard) sync the reference adapter is the trained adapter, bitwise
    check_records(checker, 1.0, SHORT_STEPS)
    assert trainer.ref_model is None and checker.records[0]["tensors"] > 0
    after = {n: p for n, p in trainer.model.named_parameters() if not any(a in n for a in adapters)}
    assert after.keys() == base.keys() and all(torch.equal(after[n], base[n]) for n in base)  # base weights frozen
    reference = [p for n, p in trainer.model.named_parameters() if ".ref." in n]
    assert not any(p.requires_grad for p in reference) and not optimizer_ids(trainer) & set(map(id, reference))
    assert tied(trainer.model)


def test_gradient_checkpointing_with_sync(smollm2_path, tmp_path):
    trainer, checker = train_checked(smollm2_path, tmp_path, 1.0, gradient_checkpointing=True, max_steps=SHORT_STEPS)
    trainer.train()
    assert trainer.model.is_gradient_checkpointing  # Trainer turns it on when training starts
    assert_trained(trainer, SHORT_STEPS)
    check_records(checker, 1.0, SHORT_STEPS)  # every tensor moved: gradients reached every checkpointed block
    grad_norms = logged(trainer, "grad_norm")
    assert len(grad_norms) == SHORT_STEPS and all(g > 0 and torch.isfinite(torch.tensor(g)) for g in grad_norms)


def test_zero3_single_process_sync(smollm2_path, tmp_path):
    """ZeRO-3 on one process, in a subprocess (see the module docstring); gloo on the CPU, NCCL on CUDA."""
    import deepspeed  # noqa: F401  (in the test extras: a missing DeepSpeed fails the test, never skips it)

    env = _env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())  # one process: every core (`_env` is made for two)
    if not ON_CPU:
        env.pop("DS_ACCELERATOR")
    proc = subprocess.run(
        [sys.executable, SCRIPT, smollm2_path, str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result = json.loads((tmp_path / "zero3.json").read_text())
    check_records(result, 1.0, SHORT_STEPS)
    assert result["engine"] == "DeepSpeedEngine"
    assert result["policy_partitioned"] and result["reference_partitioned"] and result["same_partitioning"]
    assert result["fallback_pairs"] == 0 and result["local_pairs"] >= result["final_tensors"]  # shard-local sync
    assert result["num_syncs"] == SHORT_STEPS // TAU
    assert result["final_differing"] == 0  # gathered after the last (hard) sync: reference == policy
    assert result["tied"] == [True, True]
    assert len(result["losses"]) == SHORT_STEPS and all(torch.isfinite(torch.tensor(result["losses"])))
    assert all(f <= 0.25 for f in result["frac_reward_zero_std"]), result["frac_reward_zero_std"]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_shared_prefix_scoring_matches_one_pass(smollm2_path, checkpointing):
    """fp32: log-probs and gradients of shared-prefix scoring against one plain pass, on sampled completions of
    the real chat prompts (one of them left-padded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl.scoring.grpo_scoring import score_completions

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).to(DEVICE)
    num_prompts, group, length = (2, 4, 16) if ON_CPU else (4, 8, 48)
    ids, prompt_ids, prompt_mask = sampled_chat_batch(model, tokenizer, num_prompts, group, length)
    assert 30 < prompt_ids.size(1) < 50 and not prompt_mask.all()  # 38 and 39 tokens long with the chat template
    completion = ids[:, prompt_ids.size(1) :]
    mask = torch.cat([prompt_mask, torch.ones_like(completion)], 1)
    mask[::5, -length // 3 :] = 0  # completions that ended early
    completion_mask = mask[:, -length:]
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    results, shapes, forward = {}, [], model.forward
    model.forward = lambda **kwargs: shapes.append(tuple(kwargs["input_ids"].shape)) or forward(**kwargs)
    for share in (False, True):
        model.zero_grad()
        logps = score_completions(model, ids, mask, length, 0.9, share_prefix=share).per_token_logps
        (logps * completion_mask).sum().backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        results[share] = (logps.detach(), grads)
    rows, width = ids.shape
    assert shapes == [(rows, width), (num_prompts, width - length - 1), (rows, length + 1)]  # plain; prompts; rows
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-4, rtol=0)
    assert results[True][1].keys() == results[False][1].keys() and len(results[False][1]) == len(
        list(model.parameters())
    )
    worst = max(((results[True][1][n] - grad).norm() / grad.norm()).item() for n, grad in results[False][1].items())
    assert worst < 1e-3, worst
