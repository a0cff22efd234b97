# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Iterative GRPO beyond the basics: LoRA reference adapter, exact resume of the synced reference, per-epoch sync."""

import json
import logging
import os

import pytest
import torch
from transformers import TrainerCallback, set_seed

from trl import GRPOConfig, GRPOTrainer
from trl.models.tiny import build_tiny_causal_lm
from trl.reference.ref_checkpoint import REF_ADAPTER_FILE, REF_MODEL_FILE, REF_SYNC_STATE_FILE
from trl.reference.ref_sync import REFERENCE_ADAPTER
from trl.tasks import arithmetic_corpus, make_arithmetic_dataset


peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("iter_model")), corpus=arithmetic_corpus())


def lora_config():
    return peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )


def length_reward(completions, **kwargs):
    """Varies within almost every group, so every step has a learning signal."""
    return [float(len(c)) for c in completions]


def make_trainer(model, output_dir, dataset=None, peft_config=None, **overrides):
    set_seed(0)  # same LoRA init and data order in every run
    kwargs = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-2,
        beta=0.1,
        sync_ref_model=True,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=1.0,
        max_steps=4,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
        save_strategy="no",
        seed=0,
    )
    kwargs.update(overrides)
    return GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=GRPOConfig(**kwargs),
        train_dataset=dataset if dataset is not None else make_arithmetic_dataset(64),
        peft_config=peft_config,
    )


class Snapshots(TrainerCallback):
    """After every optimizer step (after the sync callback, which was registered first): reference and policy."""

    def __init__(self, trainer):
        self.trainer, self.reference, self.policy_adapter = trainer, {}, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.reference[state.global_step] = {
            k: v.clone() for k, v in self.trainer.reference.tensors(self.trainer.model).items()
        }
        policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.policy_adapter[state.global_step] = {
            k.replace(".default.", f".{REFERENCE_ADAPTER}."): p.detach().clone()
            for k, p in policy.named_parameters()
            if ".default." in k
        }


def test_lora_reference_adapter_hard_sync(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path, peft_config=lora_config())
    snaps = Snapshots(trainer)
    trainer.add_callback(snaps)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    initial_ref = {k: v.clone() for k, v in trainer.reference.tensors(trainer.model).items()}
    trainer.train()

    assert trainer.ref_model is None and trainer.reference.adapter == REFERENCE_ADAPTER
    assert len(initial_ref) == 8  # lora_A/B of q_proj and v_proj in 2 layers
    for step in (1, 2, 3, 4):
        ref, pol = snaps.reference[step], snaps.policy_adapter[step]
        assert set(ref) == set(pol)
        equal = all(torch.equal(ref[k], pol[k]) for k in ref)
        if step % 2 == 0:
            assert equal, f"reference adapter differs from the policy adapter after sync step {step}"
        else:
            assert not equal, f"policy did not move at step {step}"
            previous = snaps.reference[step - 1] if step > 1 else initial_ref
            assert all(torch.equal(ref[k], previous[k]) for k in ref)
    # One copy of the base weights: the policy holds exactly a plain model's parameters plus two small adapters.
    from transformers import AutoModelForCausalLM

    plain = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    assert sum(p.numel() for n, p in policy.named_parameters() if "lora_" not in n) == plain
    # The reference adapter never trains and is not in the optimizer.
    ref_params = [p for n, p in policy.named_parameters() if f".{REFERENCE_ADAPTER}." in n]
    assert len(ref_params) == 8 and all(not p.requires_grad and p.grad is None for p in ref_params)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in ref_params}
    assert {id(p) for n, p in policy.named_parameters() if ".default." in n} <= optimized
    syncs = [h["ref_model/num_syncs"] for h in trainer.state.log_history if "loss" in h]
    assert syncs == [0, 1, 1, 2]
    since = [h["ref_model/steps_since_sync"] for h in trainer.state.log_history if "loss" in h]
    assert since == [1, 0, 1, 0]


def test_lora_from_trained_adapter_keeps_it_as_reference(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a "trained" adapter: non-zero delta
    trainer = make_trainer(model, tmp_path, sync_ref_model=False)
    assert trainer.reference.adapter == REFERENCE_ADAPTER
    trainer.model.train()
    batch = trainer._generate_and_score_completions([x for x in make_arithmetic_dataset(2) for _ in range(4)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    length = batch["completion_ids"].size(1)
    with torch.no_grad():
        policy = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, length)[0]
        with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
            base = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, length)[0]
    reference = batch["ref_per_token_logps"]
    assert (reference - policy).abs().max().item() < 1e-5
    assert (base - policy).abs().max().item() > 1e-3  # "adapters disabled" would have been the wrong reference


def test_fresh_lora_without_sync_uses_disabled_adapters(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path, peft_config=lora_config(), sync_ref_model=False)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert trainer.ref_model is None and trainer.reference.adapter is None
    assert list(policy.peft_config) == ["default"]


def _interrupt_at(step):
    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    return Stop()


@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_resume_restores_synced_reference_exactly(model_dir, tmp_path, use_lora):
    common = dict(ref_model_mixup_alpha=0.5, max_steps=6)
    peft_config = lora_config() if use_lora else None
    run_a = make_trainer(model_dir, tmp_path / "a", peft_config=peft_config, **common)
    snaps = Snapshots(run_a)
    run_a.add_callback(snaps)
    run_a.train()

    run_b = make_trainer(
        model_dir, tmp_path / "b", peft_config=peft_config, save_strategy="steps", save_steps=3, **common
    )
    run_b.add_callback(_interrupt_at(3))
    run_b.train()
    checkpoint = tmp_path / "b" / "checkpoint-3"
    assert (checkpoint / (REF_ADAPTER_FILE if use_lora else REF_MODEL_FILE)).exists()
    assert (checkpoint / REF_SYNC_STATE_FILE).exists()

    resumed = make_trainer(model_dir, tmp_path / "b", peft_config=peft_config, **common)
    resumed._load_reference_state(str(checkpoint))
    after_load = resumed.reference.tensors(resumed.model)
    assert all(torch.equal(after_load[k], snaps.reference[3][k]) for k in after_load)
    assert resumed.sync_callback.num_syncs == 1 and resumed.sync_callback.last_sync_step == 2
    # The step-1 reference differs from the step-3 one: the comparison above can fail.
    assert not all(torch.equal(snaps.reference[1][k], snaps.reference[3][k]) for k in after_load)

    resumed = make_trainer(model_dir, tmp_path / "b", peft_config=peft_config, **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    final = resumed.reference.tensors(resumed.model)
    assert all(torch.equal(final[k], snaps.reference[6][k]) for k in final)
    assert resumed.sync_callback.num_syncs == 3


def test_resume_without_reference_state_warns(model_dir, tmp_path, caplog):
    run = make_trainer(model_dir, tmp_path, save_strategy="steps", save_steps=2, max_steps=2)
    run.train()
    checkpoint = tmp_path / "checkpoint-2"
    os.remove(checkpoint / REF_MODEL_FILE)
    resumed = make_trainer(model_dir, tmp_path, max_steps=3)
    with caplog.at_level(logging.WARNING):
        resumed._load_reference_state(str(checkpoint))
    assert "has no synced reference model (ref_model.safetensors)" in caplog.text
    assert "KL anchor jumps back" in caplog.text


def test_epoch_strategy_syncs_at_each_epoch_end(model_dir, tmp_path):
    dataset = make_arithmetic_dataset(16)  # 16 prompts, 2 per step -> 8 optimizer steps per epoch
    trainer = make_trainer(
        model_dir,
        tmp_path,
        dataset=dataset,
        ref_model_sync_strategy="epoch",
        ref_model_sync_steps=1,
        max_steps=-1,
        num_train_epochs=2,
    )
    sync_steps = []
    original = trainer.sync_callback.sync

    def recording_sync(args, state, model):
        sync_steps.append(state.global_step)
        original(args, state, model)

    trainer.sync_callback.sync = recording_sync
    trainer.train()
    assert trainer.state.global_step == 16
    assert sync_steps == [8, 16]


def test_resume_inside_a_generation_batch_is_exact(model_dir, tmp_path):
    """A checkpoint after step 1 of a generation batch that serves 4 optimizer steps (steps_per_generation=2,
    num_iterations=2): the rest of that batch is saved and the resumed run equals the uninterrupted one."""
    from trl.trainer.grpo_checkpoint import GENERATION_BUFFER_FILE

    common = dict(
        ref_model_mixup_alpha=0.5, max_steps=4, gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=2
    )
    run_a = make_trainer(model_dir, tmp_path / "a", **common)
    run_a.train()

    run_b = make_trainer(model_dir, tmp_path / "b", save_strategy="steps", save_steps=1, **common)
    run_b.add_callback(_interrupt_at(1))
    run_b.train()
    checkpoint = tmp_path / "b" / "checkpoint-1"
    assert (checkpoint / GENERATION_BUFFER_FILE.format(rank=0)).exists()

    resumed = make_trainer(model_dir, tmp_path / "b", **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    policy_a, policy_c = dict(run_a.model.named_parameters()), dict(resumed.model.named_parameters())
    assert all(torch.equal(policy_a[k], policy_c[k]) for k in policy_a)
    ref_a, ref_c = run_a.reference.tensors(run_a.model), resumed.reference.tensors(resumed.model)
    assert all(torch.equal(ref_a[k], ref_c[k]) for k in ref_a)
    # `num_tokens` is cumulative and travels with the trainer state.
    assert resumed.state.num_input_tokens_seen == run_a.state.num_input_tokens_seen > 0
    # Without the saved batch the resumed run regenerates with the moved policy and drifts away.
    os.remove(checkpoint / GENERATION_BUFFER_FILE.format(rank=0))
    drifted = make_trainer(model_dir, tmp_path / "b", **common)
    drifted.train(resume_from_checkpoint=str(checkpoint))
    assert not all(torch.equal(policy_a[k], p) for k, p in drifted.model.named_parameters())


def test_resume_at_an_epoch_that_ends_inside_an_accumulation_window_is_exact(model_dir, tmp_path):
    """One generation batch of 3 micro-batches per epoch, 2 per optimizer step: each epoch is a window of 2 and a
    window of 1, so 2 optimizer steps are 3 micro-batches, not 2 × 2. A run resumed after epoch 1 samples and trains
    exactly like the uninterrupted one, and `step_time` is logged once per optimizer step."""
    from trl.trainer.grpo_inputs import micro_steps_done

    common = dict(
        per_device_train_batch_size=4,
        steps_per_generation=3,
        gradient_accumulation_steps=2,
        max_steps=-1,
        num_train_epochs=2,
        dataset=make_arithmetic_dataset(3),  # 3 prompts × 4 completions: one generation batch per epoch
    )
    run_a = make_trainer(model_dir, tmp_path / "a", **common)

    class StepTimes(TrainerCallback):  # how many step_time values each log averages (before `log` clears them)
        counts = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                self.counts.append(len(run_a._metrics["train"]["step_time"]))

    run_a.add_callback(StepTimes())
    run_a.train()
    assert run_a.state.global_step == 4 and run_a._step == 6
    assert StepTimes.counts == [1, 1, 1, 1]  # one per optimizer step, whatever its window's size
    assert all(log["step_time"] > 0 for log in run_a.state.log_history if "loss" in log)

    run_b = make_trainer(model_dir, tmp_path / "b", save_strategy="steps", save_steps=2, **common)
    run_b.add_callback(_interrupt_at(2))
    run_b.train()
    assert run_b._step == 3 == micro_steps_done(2, 2, 3)
    resumed = make_trainer(model_dir, tmp_path / "b", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-2"))
    assert resumed._step == 6
    policy_a, policy_c = dict(run_a.model.named_parameters()), dict(resumed.model.named_parameters())
    assert all(torch.equal(policy_a[k], policy_c[k]) for k in policy_a)
    ref_a, ref_c = run_a.reference.tensors(run_a.model), resumed.reference.tensors(resumed.model)
    assert all(torch.equal(ref_a[k], ref_c[k]) for k in ref_a)


@pytest.mark.parametrize(
    ("reuse", "use_lora"),
    [(dict(num_iterations=2), False), (dict(steps_per_generation=2), False), (dict(num_iterations=2), True)],
    ids=["num_iterations=2", "steps_per_generation=2", "num_iterations=2-lora"],
)
def test_a_sync_reaches_the_next_loss_of_a_buffered_generation_batch(model_dir, tmp_path, reuse, use_lora):
    """α = 1 every step: each loss after a sync compares the policy with itself, so the KL is 0 at every step, also
    for the micro-batches of a generation batch whose reference log-probs were computed before the sync (0.29 and
    0.07 at steps 2 and 4 when they were not refreshed). With LoRA the reference is the frozen "ref" adapter."""
    peft_config = lora_config() if use_lora else None
    trainer = make_trainer(
        model_dir,
        tmp_path,
        peft_config=peft_config,
        ref_model_sync_steps=1,
        gradient_accumulation_steps=1,
        max_steps=4,
        **reuse,
    )
    trainer.train()
    kls = [log["kl"] for log in trainer.state.log_history if "kl" in log]
    assert len(kls) == 4 and trainer.sync_callback.num_syncs == 4
    assert max(kls) < 1e-6, kls


def test_reference_log_probs_are_scored_again_only_after_a_sync(model_dir, tmp_path):
    """Without syncing (or before the first sync) no micro-batch is scored twice by the reference."""
    trainer = make_trainer(
        model_dir, tmp_path, ref_model_sync_steps=4, gradient_accumulation_steps=1, num_iterations=2
    )
    passes = []
    original = trainer._ref_per_token_logps

    def counting(input_ids, *args):
        passes.append((trainer.state.global_step, input_ids.size(0)))
        return original(input_ids, *args)

    trainer._ref_per_token_logps = counting
    trainer.train()  # generation batches at steps 0 and 2 (each serves 2 optimizer steps); one sync, at step 4
    assert passes == [(0, 8), (2, 8)]


@pytest.mark.parametrize(
    "schedule",
    [
        dict(ref_model_sync_strategy="steps", ref_model_sync_steps=2),
        dict(ref_model_sync_strategy="epoch", steps_per_generation=2),
    ],
    ids=["steps", "epoch"],
)
def test_every_checkpoint_holds_the_reference_of_the_uninterrupted_run(model_dir, tmp_path, schedule):
    """Save at every step, so saves coincide with syncs (every 2nd step; every epoch end = every 2nd step): each
    checkpoint's reference is bitwise the one the run has after that step, and a run resumed from an epoch
    boundary ends where the uninterrupted run does."""
    from safetensors.torch import load_file

    common = dict(
        ref_model_mixup_alpha=0.5,
        gradient_accumulation_steps=1,
        max_steps=-1,
        num_train_epochs=3,
        dataset=make_arithmetic_dataset(4),  # 4 prompts, 2 per optimizer step: 2 steps per epoch
        **schedule,
    )
    run = make_trainer(model_dir, tmp_path / "a", save_strategy="steps", save_steps=1, **common)
    snapshots, counters = Snapshots(run), {}

    class Counters(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            counters[state.global_step] = run.sync_callback.state_dict()

    run.add_callback(snapshots)
    run.add_callback(Counters())
    run.train()
    assert run.state.global_step == 6 and run.sync_callback.num_syncs == 3
    assert [counters[step]["num_syncs"] for step in range(1, 7)] == [0, 1, 1, 2, 2, 3]
    for step in range(1, 7):
        checkpoint = tmp_path / "a" / f"checkpoint-{step}"
        saved = load_file(str(checkpoint / REF_MODEL_FILE))
        assert saved.keys() == snapshots.reference[step].keys()
        assert all(torch.equal(saved[k], snapshots.reference[step][k]) for k in saved), step
        assert json.loads((checkpoint / REF_SYNC_STATE_FILE).read_text()) == counters[step]

    resumed = make_trainer(model_dir, tmp_path / "b", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.sync_callback.num_syncs == 3
    reference, final = resumed.reference.tensors(resumed.model), run.reference.tensors(run.model)
    assert all(torch.equal(reference[k], final[k]) for k in final)
    policy = dict(resumed.model.named_parameters())
    assert all(torch.equal(policy[k], p) for k, p in run.model.named_parameters())


def test_resume_from_a_batch_cut_before_a_sync_is_exact(model_dir, tmp_path):
    """num_iterations=2, a sync every step: checkpoint-1 holds the rest of a generation batch scored by the reference
    before the step-1 sync; the resumed run rescores it against the synced reference, as the uninterrupted run does."""
    from trl.trainer.grpo_checkpoint import GENERATION_BUFFER_FILE

    common = dict(ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, gradient_accumulation_steps=1, num_iterations=2)
    run = make_trainer(model_dir, tmp_path / "a", save_strategy="steps", save_steps=1, **common)
    run.train()
    checkpoint = tmp_path / "a" / "checkpoint-1"
    buffer = torch.load(checkpoint / GENERATION_BUFFER_FILE.format(rank=0), weights_only=True)
    saved_syncs = json.loads((checkpoint / REF_SYNC_STATE_FILE).read_text())["num_syncs"]
    assert [batch["ref_version"] for batch in buffer["inputs"]] == [0] and saved_syncs == 1  # stale: rescored
    resumed = make_trainer(model_dir, tmp_path / "b", **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.sync_callback.num_syncs == run.sync_callback.num_syncs == 4
    reference, final = resumed.reference.tensors(resumed.model), run.reference.tensors(run.model)
    assert all(torch.equal(reference[k], final[k]) for k in final)
    policy = dict(resumed.model.named_parameters())
    assert all(torch.equal(policy[k], p) for k, p in run.model.named_parameters())
    kl = [log["kl"] for log in resumed.state.log_history if "kl" in log and log["step"] > 1]
    assert kl == [log["kl"] for log in run.state.log_history if "kl" in log and log["step"] > 1]
