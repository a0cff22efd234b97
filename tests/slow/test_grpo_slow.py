# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GPU tests on a ~0.5B-parameter Qwen2 configuration (random weights, bf16): `make slow_tests`.

Skipped without CUDA (see tests/conftest.py). Each test trains a few GRPO steps and checks the reference against
the sync formula bit for bit: round_bf16(lerp_fp32(reference, policy, α)).
"""

import pytest
import torch
from transformers import TrainerCallback, set_seed

from trl import GRPOConfig, GRPOTrainer
from trl.models.tiny import QWEN2_5_0_5B_SHAPE, build_tokenizer, tiny_qwen2_config
from trl.tasks import arithmetic_corpus, make_arithmetic_dataset


pytestmark = pytest.mark.slow


def varied_reward(completions, **kwargs):
    """Differs within almost every group, so every step moves the policy."""
    return [float(len(c) % 7) for c in completions]


@pytest.fixture(scope="module")
def qwen2_half_b(tmp_path_factory) -> str:
    """A Qwen2.5-0.5B-shaped model (494M parameters) with random bf16 weights, saved with our tiny tokenizer."""
    from transformers import Qwen2ForCausalLM

    folder = str(tmp_path_factory.mktemp("qwen2-0.5b"))
    tokenizer = build_tokenizer(arithmetic_corpus())
    config = tiny_qwen2_config(tokenizer, **QWEN2_5_0_5B_SHAPE)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    assert 480e6 < sum(p.numel() for p in model.parameters()) < 510e6
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-5,
        beta=0.04,
        bf16=True,
        gradient_checkpointing=False,  # TRL's default is True; one test below turns it on
        sync_ref_model=True,
        ref_model_sync_steps=2,
        max_steps=4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        model_init_kwargs={"dtype": "bfloat16"},
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


class Snapshot(TrainerCallback):
    """Copies the reference and the policy at the end of every step: `before` (passed in `callbacks=`, so it runs
    before the sync callback) or `after` (added with `add_callback`, so it runs after it)."""

    def __init__(self, get_tensors):
        self.get_tensors, self.steps = get_tensors, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.steps[state.global_step] = {k: v.detach().clone() for k, v in self.get_tensors().items()}


def named(model, keep=lambda name: True):
    return {n: p for n, p in model.named_parameters() if keep(n)}


@pytest.mark.parametrize("alpha", [1.0, 0.6], ids=["hard", "soft"])
def test_full_finetune_bf16_sync_is_exact(qwen2_half_b, tmp_path, alpha):
    set_seed(0)
    holder = {}
    before = Snapshot(
        lambda: {
            **{f"ref.{k}": v for k, v in named(holder["t"].ref_model).items()},
            **{f"pol.{k}": v for k, v in named(holder["t"].model).items()},
        }
    )
    trainer = GRPOTrainer(
        model=qwen2_half_b,
        reward_funcs=varied_reward,
        args=grpo_args(tmp_path, ref_model_mixup_alpha=alpha),
        train_dataset=make_arithmetic_dataset(64),
        callbacks=[before],
    )
    holder["t"] = trainer
    after = Snapshot(lambda: named(trainer.ref_model))
    trainer.add_callback(after)
    trainer.train()

    assert next(trainer.ref_model.parameters()).dtype == torch.bfloat16
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    for step in (2, 4):
        for name, value in after.steps[step].items():
            expected = torch.lerp(
                before.steps[step][f"ref.{name}"].float(), before.steps[step][f"pol.{name}"].float(), alpha
            ).to(torch.bfloat16)
            assert torch.equal(value, expected), f"{name} after sync step {step}"
    for step in (1, 3):  # no sync: the reference is where it was
        assert all(torch.equal(after.steps[step][k], before.steps[step][f"ref.{k}"]) for k in after.steps[step])


def test_lora_sync_copies_the_adapter(qwen2_half_b, tmp_path):
    from peft import LoraConfig

    set_seed(0)
    peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=qwen2_half_b,
        reward_funcs=varied_reward,
        args=grpo_args(tmp_path, learning_rate=1e-3, ref_model_mixup_alpha=1.0),
        train_dataset=make_arithmetic_dataset(64),
        peft_config=peft_config,
    )
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model)
    adapter = {n.replace(".default.", ".ref."): p for n, p in policy.named_parameters() if ".default." in n}
    reference = {n: p for n, p in policy.named_parameters() if ".ref." in n}
    assert trainer.ref_model is None and set(adapter) == set(reference) and len(reference) > 0
    assert all(torch.equal(adapter[n], reference[n]) for n in reference)  # hard sync at step 4
    assert all(not p.requires_grad for p in reference.values())
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_gradient_checkpointing_with_sync(qwen2_half_b, tmp_path):
    set_seed(0)
    trainer = GRPOTrainer(
        model=qwen2_half_b,
        reward_funcs=varied_reward,
        args=grpo_args(tmp_path, gradient_checkpointing=True, ref_model_mixup_alpha=1.0),
        train_dataset=make_arithmetic_dataset(64),
    )
    trainer.train()
    policy, reference = named(trainer.model), named(trainer.ref_model)
    assert all(torch.equal(policy[n], reference[n]) for n in reference)
    grad_norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(grad_norms) == 4 and all(g > 0 and torch.isfinite(torch.tensor(g)) for g in grad_norms)


def test_zero3_single_gpu_sync(qwen2_half_b, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed

    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29533",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    ds_config = {
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }
    set_seed(0)
    trainer = GRPOTrainer(
        model=qwen2_half_b,
        reward_funcs=varied_reward,
        args=grpo_args(tmp_path, deepspeed=ds_config, ref_model_mixup_alpha=1.0, learning_rate=1e-4),
        train_dataset=make_arithmetic_dataset(64),
    )
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert hasattr(next(reference.parameters()), "ds_id")  # the reference is partitioned like the policy
    assert len(trainer.sync_callback._sync.fallback) == 0  # shard-local, no gather
    pol, ref = named(policy), named(reference)
    with deepspeed.zero.GatheredParameters(list(pol.values()) + list(ref.values())):
        assert all(torch.equal(pol[n], ref[n]) for n in ref)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_shared_prefix_scoring_matches_one_pass_on_gpu(qwen2_half_b, checkpointing):
    """fp32 on CUDA (sdpa): log-probs and gradients of shared-prefix scoring against one plain pass."""
    from transformers import AutoModelForCausalLM

    from trl.trainer.grpo_scoring import score_completions

    model = AutoModelForCausalLM.from_pretrained(qwen2_half_b, dtype=torch.float32).cuda().train()
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (4, 96), generator=g).repeat_interleave(8, 0)
    mask = torch.ones(32, 96 + 48, dtype=torch.long)
    mask[:8, :30] = 0  # one left-padded prompt
    mask[::5, -10:] = 0  # completions that ended early
    ids = torch.cat([prompts, torch.randint(3, model.config.vocab_size, (32, 48), generator=g)], 1).cuda()
    mask = mask.cuda()
    results, shapes, forward = {}, [], model.forward
    model.forward = lambda **kwargs: shapes.append(tuple(kwargs["input_ids"].shape)) or forward(**kwargs)
    for share in (False, True):
        model.zero_grad()
        logps = score_completions(model, ids, mask, 48, 0.9, share_prefix=share).per_token_logps
        (logps * mask[:, -48:]).sum().backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        results[share] = (logps.detach(), grads)
    assert shapes == [(32, 144), (4, 95), (32, 49)]  # plain; then 4 distinct prompts, then every row
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-4, rtol=0)
    worst = max(((results[True][1][n] - grad).norm() / grad.norm()).item() for n, grad in results[False][1].items())
    assert worst < 1e-3, worst
