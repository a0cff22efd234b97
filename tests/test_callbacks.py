# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""SyncRefModelCallback: when the reference is synced (unit, with a fake TrainerState) and in a real GRPO run."""

import pytest
import torch
from conftest import tiny_grpo_kwargs
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState

from trl import GRPOConfig, GRPOTrainer, SyncRefModelCallback
from trl.tasks import closeness_reward


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- unit tests


class Scalar(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([value]))


def sync_args(tmp_path, **sync_fields) -> GRPOConfig:
    """A GRPOConfig that only matters for its sync fields (the callback is driven by hand, no training)."""
    return GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=8,
        beta=0.04,
        sync_ref_model=True,
        **sync_fields,
    )


def run_schedule(tmp_path, strategy, steps, epoch_end_at=()):
    """Drive the callback as `Trainer` does: `state.epoch` is a whole number at the step that completes an epoch."""
    args = sync_args(tmp_path, ref_model_sync_steps=3, ref_model_mixup_alpha=1.0, ref_model_sync_strategy=strategy)
    policy, reference = Scalar(0.0), Scalar(-1.0)
    callback = SyncRefModelCallback(reference)
    state, control = TrainerState(), TrainerControl()
    synced_at = []
    for step in range(1, steps + 1):
        policy.w.data.fill_(float(step))  # "optimizer step"
        state.global_step = step
        ended = sum(end <= step for end in epoch_end_at)
        state.epoch = ended if step in epoch_end_at else ended + 0.5
        callback.on_step_end(args, state, control, model=policy)
        if reference.w.item() == step:
            synced_at.append(step)
    return callback, synced_at, reference


def test_steps_strategy_syncs_every_tau_optimizer_steps(tmp_path):
    callback, synced_at, reference = run_schedule(tmp_path, "steps", 10, epoch_end_at=(5,))
    assert synced_at == [3, 6, 9]
    assert reference.w.item() == 9.0  # untouched at step 10 and at the epoch end
    assert (callback.num_syncs, callback.last_sync_step) == (3, 9)


def test_epoch_strategy_syncs_only_at_the_step_that_ends_an_epoch(tmp_path):
    callback, synced_at, reference = run_schedule(tmp_path, "epoch", 10, epoch_end_at=(4, 10))
    assert synced_at == [4, 10]
    assert (callback.num_syncs, callback.last_sync_step) == (2, 10)
    state = _state(10)
    state.epoch = 2.0
    callback.on_step_end(_args(tmp_path, "epoch"), state, TrainerControl(), model=Scalar(99.0))
    assert callback.num_syncs == 2 and reference.w.item() == 10.0  # no step since the last sync: no second sync
    callback.on_epoch_end(_args(tmp_path, "epoch"), _state(11), TrainerControl(), model=Scalar(99.0))
    assert callback.num_syncs == 2  # the end of an epoch cut short by max_steps is not a sync point


@pytest.mark.parametrize(
    ("strategy", "sync_steps", "max_steps", "global_step", "warned"),
    [
        ("steps", 10, 8, 0, "ref_model_sync_steps=10 but the run ends at optimizer step 8 (now at 0)"),
        ("steps", 5, 8, 0, None),
        ("steps", 5, 9, 6, "ref_model_sync_steps=5 but the run ends at optimizer step 9 (now at 6)"),
        ("epoch", 1, 3, 0, "ref_model_sync_strategy='epoch' but the run ends at optimizer step 3, before its first"),
        ("epoch", 1, 4, 0, None),
    ],
)
def test_a_schedule_without_any_sync_warns_at_train_begin(
    tmp_path, monkeypatch, strategy, sync_steps, max_steps, global_step, warned
):
    from trl.trainer import callbacks

    messages = []
    monkeypatch.setattr(callbacks.logger, "warning", messages.append)
    args = sync_args(tmp_path, ref_model_sync_steps=sync_steps, ref_model_sync_strategy=strategy)
    state = _state(global_step)
    state.max_steps = max_steps
    loader = [None] * 4  # 4 micro-batches per epoch, accumulation 1: 4 optimizer steps per epoch
    SyncRefModelCallback(Scalar(0.0)).on_train_begin(args, state, TrainerControl(), train_dataloader=loader)
    assert (messages[0][: len(warned)] if messages else None) == warned


def _args(tmp_path, strategy):
    return GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=8,
        beta=0.04,
        sync_ref_model=True,
        ref_model_sync_strategy=strategy,
    )


def _state(step):
    state = TrainerState()
    state.global_step = step
    return state


def test_soft_sync_uses_mixup_alpha(tmp_path):
    args = sync_args(tmp_path, ref_model_sync_steps=1, ref_model_mixup_alpha=0.25)
    reference = Scalar(0.0)
    callback = SyncRefModelCallback(reference)
    callback.on_step_end(args, _state(1), TrainerControl(), model=Scalar(4.0))
    assert reference.w.item() == 1.0  # 0.75·0 + 0.25·4
    callback.on_step_end(args, _state(2), TrainerControl(), model=Scalar(4.0))
    assert reference.w.item() == 1.75  # 0.75·1 + 0.25·4


# ---------------------------------------------------------------- in a real training run


class Recorder(TrainerCallback):
    """Snapshots policy and reference after every optimizer step (added last, so it runs after the sync)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.records = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.records[state.global_step] = (snapshot(model), snapshot(self.trainer.ref_model))


def first_token_reward(completion_ids, **kwargs):
    """A reward that varies within groups even for a random model (the arithmetic rewards are all 0 there)."""
    return [float(ids[0] % 5) for ids in completion_ids]


def make_trainer(tiny_lm_path, dataset, grpo_kwargs, callbacks=None, **overrides):
    args = GRPOConfig(**{**grpo_kwargs, **overrides})
    return GRPOTrainer(
        tiny_lm_path, [first_token_reward, closeness_reward], args=args, train_dataset=dataset, callbacks=callbacks
    )


@pytest.fixture(scope="module")
def hard_sync_run(tiny_lm_path, _arithmetic_dataset, tmp_path_factory):
    kwargs = tiny_grpo_kwargs(str(tmp_path_factory.mktemp("sync")))
    torch.manual_seed(0)
    trainer = make_trainer(
        tiny_lm_path,
        _arithmetic_dataset,
        kwargs,
        max_steps=4,
        sync_ref_model=True,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=1.0,
    )
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    initial = (snapshot(trainer.model), snapshot(trainer.ref_model))
    trainer.train()
    return trainer, recorder, initial


def test_recorder_runs_after_the_sync_callback(hard_sync_run):
    trainer, recorder, _ = hard_sync_run
    callbacks = trainer.callback_handler.callbacks
    sync_index = next(i for i, cb in enumerate(callbacks) if isinstance(cb, SyncRefModelCallback))
    assert callbacks.index(recorder) > sync_index  # on_step_end is called in list order


def test_exactly_one_sync_callback_registered(hard_sync_run):
    trainer, _, _ = hard_sync_run
    syncs = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SyncRefModelCallback)]
    assert len(syncs) == 1 and syncs[0] is trainer.sync_callback
    assert syncs[0].ref_model is trainer.ref_model
    assert (syncs[0].num_syncs, syncs[0].last_sync_step) == (2, 4)


def test_hard_sync_every_two_optimizer_steps_is_bitwise(hard_sync_run):
    trainer, recorder, (policy0, ref0) = hard_sync_run
    assert same(policy0, ref0)  # the reference starts as a bitwise copy of the policy
    assert sorted(recorder.records) == [1, 2, 3, 4]  # optimizer steps, not the 8 micro-batches
    previous_ref = ref0
    for step in (1, 2, 3, 4):
        policy, ref = recorder.records[step]
        if step % 2 == 0:
            assert same(ref, policy), f"reference should equal the policy bitwise after step {step}"
        else:
            assert same(ref, previous_ref), f"reference should be unchanged after step {step}"
            assert not same(policy, ref), f"the policy should have moved away from the reference at step {step}"
        previous_ref = ref
    # The final state of the trainer's models is the state after step 4.
    assert same(snapshot(trainer.ref_model), snapshot(trainer.model))


def test_num_syncs_logged_per_step(hard_sync_run):
    trainer, _, _ = hard_sync_run
    logged = {entry["step"]: entry["ref_model/num_syncs"] for entry in trainer.state.log_history if "loss" in entry}
    assert logged == {1: 0, 2: 1, 3: 1, 4: 2}
    since = {
        entry["step"]: entry["ref_model/steps_since_sync"] for entry in trainer.state.log_history if "loss" in entry
    }
    assert since == {1: 1, 2: 0, 3: 1, 4: 0}


def test_user_supplied_sync_callback_is_reused_not_duplicated(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    mine = SyncRefModelCallback(ref_model=nn.Linear(1, 1))
    trainer = make_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs, callbacks=[mine], sync_ref_model=True)
    syncs = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SyncRefModelCallback)]
    assert syncs == [mine] and trainer.sync_callback is mine
    assert mine.ref_model is trainer.ref_model and mine.accelerator is trainer.accelerator


def test_no_sync_callback_without_sync_ref_model(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = make_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs)
    assert trainer.sync_callback is None
    assert not any(isinstance(cb, SyncRefModelCallback) for cb in trainer.callback_handler.callbacks)


def test_without_sync_the_reference_never_moves(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = make_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs, max_steps=2)
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    policy0, ref0 = snapshot(trainer.model), snapshot(trainer.ref_model)
    trainer.train()
    assert sorted(recorder.records) == [1, 2]
    for step, (policy, ref) in recorder.records.items():
        assert same(ref, ref0), step
        assert not same(policy, policy0), step
    assert "ref_model/num_syncs" not in trainer.state.log_history[0]


def test_sync_target_model_static_alias():
    policy, target = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    expected = torch.lerp(target.weight.detach().clone(), policy.weight.detach(), 0.25)
    SyncRefModelCallback.sync_target_model(policy, target, 0.25)
    assert torch.equal(target.weight, expected)


def test_callback_pairs_once():
    torch.manual_seed(0)
    policy, reference = (
        nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)),
        nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)),
    )
    callback = SyncRefModelCallback(ref_model=reference)
    args = type("Args", (), {"ref_model_mixup_alpha": 1.0})()
    state = type("State", (), {"global_step": 3})()
    callback.sync(args, state, policy)
    plan = callback._sync
    callback.sync(args, state, policy)
    assert callback._sync is plan and callback.num_syncs == 2 and callback.last_sync_step == 3
    assert all(torch.equal(p, r) for p, r in zip(policy.parameters(), reference.parameters()))


def test_attach_binds_a_user_callback_or_adds_one():
    from transformers.trainer_callback import CallbackHandler

    reference, accelerator = nn.Linear(1, 1), object()
    mine = SyncRefModelCallback(ref_model=None)
    handler = CallbackHandler([mine], None, None, None, None)
    assert SyncRefModelCallback.attach(handler, reference, accelerator) is mine
    assert mine.ref_model is reference and mine.accelerator is accelerator
    empty = CallbackHandler([], None, None, None, None)
    added = SyncRefModelCallback.attach(empty, reference, accelerator)
    assert empty.callbacks == [added] and added is not mine and added.ref_model is reference
