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
    mine._sync = "the pairing of another trainer's models"
    handler = CallbackHandler([mine], None, None, None, None)
    assert SyncRefModelCallback.attach(handler, reference, accelerator) is mine
    assert mine.ref_model is reference and mine.accelerator is accelerator
    assert mine._sync is None  # paired again with these models at the first sync
    empty = CallbackHandler([], None, None, None, None)
    added = SyncRefModelCallback.attach(empty, reference, accelerator)
    assert empty.callbacks == [added] and added is not mine and added.ref_model is reference


# ---------------------------------------------------------------- RichProgressCallback and LogCompletionsCallback


class PeekAtLogs(TrainerCallback):
    """After a RichProgressCallback in the list: the title of its status panel after each `on_log` update."""

    def __init__(self, rich):
        self.rich, self.titles = rich, []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.titles.append(self.rich.training_status.status.title)


class PeekAtEnd(TrainerCallback):
    """Before a RichProgressCallback in the list: its training task at `on_train_end` (which then resets it)."""

    def __init__(self, rich):
        self.rich, self.at_end = rich, None

    def on_train_end(self, args, state, control, **kwargs):
        task = self.rich.training_bar.tasks[0]
        self.at_end = (task.completed, task.total, task.finished, self.rich.current_step)


def test_rich_progress_callback_tracks_the_steps(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    from trl import RichProgressCallback

    rich = RichProgressCallback()
    at_end, after_log = PeekAtEnd(rich), PeekAtLogs(rich)
    trainer = make_trainer(
        tiny_lm_path, arithmetic_dataset, grpo_kwargs, callbacks=[at_end, rich, after_log], max_steps=2
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert at_end.at_end == (2, 2, True, 2)
    # One status panel per log: the two step logs, then the train summary (logged at the last step).
    assert after_log.titles == [f"[bold green]Step {step}[/bold green]" for step in (1, 2, 2)]
    assert rich.training_bar is None and rich.rich_group is None  # reset at train end, as TRL does
    assert "loss" in trainer.state.log_history[0]


def fake_reporters(monkeypatch):
    """Fake `wandb` and `comet_ml` modules; returns the lists their `log` / `log_table` calls are appended to."""
    import importlib.machinery
    import sys
    import types

    wandb_logs, comet_tables = [], []
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.log = lambda data: wandb_logs.append(data)

    class Experiment:
        def log_table(self, tabular_data, filename):
            comet_tables.append((filename, tabular_data))

    comet = types.ModuleType("comet_ml")
    comet.__spec__ = importlib.machinery.ModuleSpec("comet_ml", None)
    comet.get_running_experiment = Experiment
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "comet_ml", comet)
    return wandb_logs, comet_tables


CHAT_PROMPTS = [[{"role": "user", "content": f"{a}+{b}="}] for a, b in ((1, 2), (3, 4), (5, 6))]


def test_log_completions_callback_logs_a_growing_table(tiny_lm_path, arithmetic_dataset, grpo_kwargs, monkeypatch):
    from datasets import Dataset
    from transformers import GenerationConfig

    from trl import LogCompletionsCallback

    wandb_logs, comet_tables = fake_reporters(monkeypatch)
    trainer = make_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs, max_steps=2)
    trainer.eval_dataset = Dataset.from_dict({"prompt": CHAT_PROMPTS, "answer": [3, 7, 11]})
    tokenizer = trainer.processing_class
    config = GenerationConfig(
        max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    callback = LogCompletionsCallback(trainer, generation_config=config, num_prompts=2, freq=1)
    trainer.add_callback(callback)
    trainer.args.report_to = ["wandb", "comet_ml"]  # after construction: no real integration callbacks
    tokenizer.padding_side = "right"  # the callback pads left for generation, then puts this back
    trainer.train()
    assert tokenizer.padding_side == "right" and trainer.model.training

    rendered = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in CHAT_PROMPTS[:2]]
    assert rendered[0] == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    assert [list(log) for log in wandb_logs] == [["completions"], ["completions"]]
    first, second = (log["completions"] for log in wandb_logs)
    assert list(first.columns) == list(second.columns) == ["step", "prompt", "completion"]
    assert first["step"].tolist() == ["1", "1"] and first["prompt"].tolist() == rendered
    assert second["step"].tolist() == ["1", "1", "2", "2"] and second["prompt"].tolist() == rendered * 2
    assert second.values.tolist()[:2] == first.values.tolist()  # the table grows
    assert callback.table == second.values.tolist()
    # Step 2's completions are the trained model's greedy ones (on_step_end runs after the optimizer step).
    tokenizer.padding_side = "left"
    batch = tokenizer(rendered, return_tensors="pt", padding=True)
    output = trainer.model.generate(**batch, generation_config=config)
    expected = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert second["completion"].tolist()[2:] == expected
    assert [name for name, _ in comet_tables] == ["completions.csv"] * 2
    assert comet_tables[-1][1].values.tolist() == callback.table


def test_log_completions_frequency_defaults_to_eval_steps(monkeypatch):
    from types import SimpleNamespace

    from accelerate import Accelerator
    from datasets import Dataset

    from trl import LogCompletionsCallback

    wandb_logs, _ = fake_reporters(monkeypatch)
    trainer = SimpleNamespace(eval_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3="]}))
    trainer.accelerator = Accelerator(cpu=True)
    callback = LogCompletionsCallback(trainer)
    monkeypatch.setattr(callback, "_generate", lambda prompts, tokenizer, batch_size: [p[::-1] for p in prompts])
    args = SimpleNamespace(report_to=["wandb"], per_device_eval_batch_size=2)
    for step in (1, 2, 3, 3, 4, 5, 6):  # step 3 twice: logged once
        callback.on_step_end(args, SimpleNamespace(global_step=step, eval_steps=3), None, processing_class=None)
    assert [log["completions"]["step"].tolist() for log in wandb_logs] == [["3"] * 3, ["3"] * 3 + ["6"] * 3]
    assert wandb_logs[-1]["completions"]["completion"].tolist()[:3] == ["=1+1", "=2+2", "=3+3"]
    args.report_to = []  # neither wandb nor comet_ml: rows are kept, nothing is sent
    callback.on_step_end(args, SimpleNamespace(global_step=9, eval_steps=3), None, processing_class=None)
    assert len(wandb_logs) == 2 and len(callback.table) == 9


def test_log_completions_needs_an_eval_dataset():
    from types import SimpleNamespace

    from trl import LogCompletionsCallback

    with pytest.raises(
        ValueError,
        match=r"^Trainer must have an evaluation dataset to use the LogCompletionsCallback: pass `eval_dataset`",
    ):
        LogCompletionsCallback(SimpleNamespace(eval_dataset=None))


def test_log_completions_with_offline_wandb(tiny_lm_path, arithmetic_dataset, grpo_kwargs, tmp_path, monkeypatch):
    """A real wandb run, offline (wandb is not a test dependency: skipped where it is not installed)."""
    import glob
    import json

    wandb = pytest.importorskip("wandb")
    from datasets import Dataset
    from transformers import GenerationConfig

    from trl import LogCompletionsCallback

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    trainer = make_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs, report_to=["wandb"], max_steps=1)
    trainer.eval_dataset = Dataset.from_dict({"prompt": ["1+2=", "3+4="]})
    config = GenerationConfig(max_new_tokens=2, do_sample=False, pad_token_id=trainer.processing_class.pad_token_id)
    callback = LogCompletionsCallback(trainer, generation_config=config, freq=1)
    trainer.add_callback(callback)
    trainer.train()
    wandb.finish()
    [path] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "completions_*.json"))
    with open(path) as f:
        logged = json.load(f)
    assert logged["columns"] == ["step", "prompt", "completion"]
    assert logged["data"] == callback.table and [row[:2] for row in logged["data"]] == [["1", "1+2="], ["1", "3+4="]]
