# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reward-model refresh (Algorithm 1, line 12, of arXiv 2402.03300): losses, replay, config, trainer hooks, resume."""

import math
import os
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_grpo_kwargs
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback, set_seed

from trl import GRPOConfig, GRPOTrainer, RewardModelRefreshCallback, SyncRefModelCallback
from trl.tasks import make_arithmetic_dataset
from trl.trainer.reward_model_refresh import (
    REWARD_MODEL_REFRESH_FILE,
    ReplayBuffer,
    RewardModelRefresh,
    pairwise_reward_model_loss,
    pointwise_reward_model_loss,
    preference_pairs,
    replay_count,
    reward_model_accuracy,
    score_examples,
    training_batches,
)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---- pure functions ----


def test_pointwise_loss_value_and_gradient():
    logits = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    labels = torch.tensor([1.0, 0.0, 0.5])
    loss = pointwise_reward_model_loss(logits, labels)
    # BCE with logits: softplus(r) − y·r per row, mean over rows; d/dr_i = (σ(r_i) − y_i) / N.
    expected = sum(math.log1p(math.exp(r)) - y * r for r, y in zip([0.5, -1.0, 2.0], [1.0, 0.0, 0.5])) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    grads = [(sigmoid(r) - y) / 3 for r, y in zip([0.5, -1.0, 2.0], [1.0, 0.0, 0.5])]
    assert logits.grad.tolist() == pytest.approx(grads, abs=1e-6)


def test_pairwise_loss_value_and_gradient():
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0], requires_grad=True)
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1])
    better, worse = preference_pairs(labels, groups)
    assert list(zip(better.tolist(), worse.tolist())) == [(0, 1), (2, 1)]  # ties and other groups are no pairs
    loss = pairwise_reward_model_loss(logits, labels, groups)
    expected = -(math.log(sigmoid(1.0)) + math.log(sigmoid(-0.5))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    a, b = 1 - sigmoid(1.0), 1 - sigmoid(-0.5)  # d(−log σ(d))/dd = −(1 − σ(d))
    assert logits.grad.tolist() == pytest.approx([-a / 2, (a + b) / 2, -b / 2, 0.0], abs=1e-6)


def test_pairwise_loss_without_pairs_is_zero_with_zero_gradient():
    logits = torch.tensor([1.0, 3.0], requires_grad=True)
    loss = pairwise_reward_model_loss(logits, torch.tensor([1.0, 1.0]), torch.tensor([0, 0]))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad.tolist() == [0.0, 0.0]


def test_accuracy():
    logits = torch.tensor([0.5, -1.0, 2.0, -0.1])
    assert reward_model_accuracy(logits, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4), "pointwise") == 0.5
    pair_logits = torch.tensor([1.0, 0.0, -0.5])  # pairs (0, 1): right; (2, 1): wrong
    labels, groups = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 0])
    assert reward_model_accuracy(pair_logits, labels, groups, "pairwise") == 0.5
    assert math.isnan(reward_model_accuracy(pair_logits, torch.ones(3), groups, "pairwise"))


@pytest.mark.parametrize(
    "fresh, ratio, count", [(16, 0.1, 2), (16, 0.2, 4), (9, 0.1, 1), (4, 0.1, 0), (100, 0.1, 11), (10, 0.0, 0)]
)
def test_replay_count_makes_the_ratio_up_to_rounding(fresh, ratio, count):
    assert replay_count(fresh, ratio) == count
    # The replay share of fresh + replay is within half a unit of the ratio.
    assert abs(count - ratio * (fresh + count)) <= 0.5 * (1 + ratio)


def test_training_batches_keep_units_whole():
    units = [[{"i": i}] for i in range(5)]
    batches = training_batches(units, [4, 3, 2, 1, 0], batch_size=2)
    assert [[e["i"] for e in b] for b in batches] == [[4, 3], [2, 1], [0]]
    groups = [[{"i": 3 * g + k} for k in range(3)] for g in range(3)]
    assert [len(b) for b in training_batches(groups, [2, 0, 1], batch_size=4)] == [6, 3]


def test_replay_buffer_bounded_and_seeded():
    buffer = ReplayBuffer(capacity=5)
    buffer.add([[{"i": 0}, {"i": 1}], [{"i": 2}, {"i": 3}]])
    buffer.add([[{"i": 4}, {"i": 5}]])  # 6 examples > 5: the oldest unit goes
    assert [[e["i"] for e in u] for u in buffer.units] == [[2, 3], [4, 5]] and buffer.num_examples == 4
    draw = lambda: buffer.sample(5, torch.Generator().manual_seed(3))  # noqa: E731
    assert draw() == draw() and len(draw()) == 2  # never more than held, same seed same draw


# ---- config ----

INVALID = [
    (dict(reward_model_update_steps=0), "reward_model_update_steps must be at least 1 or None (got 0)."),
    (dict(reward_model_replay_ratio=1.0), "reward_model_replay_ratio must be in [0, 1) (got 1.0)."),
    (dict(reward_model_learning_rate=0.0), "reward_model_learning_rate must be > 0 (got 0.0)."),
    (dict(reward_model_num_epochs=0), "reward_model_num_epochs must be at least 1 (got 0)."),
    (dict(reward_model_batch_size=0), "reward_model_batch_size must be at least 1 (got 0)."),
    (dict(reward_model_replay_buffer_size=-1), "reward_model_replay_buffer_size must be >= 0 (got -1)."),
    (
        dict(reward_model_replay_buffer_size=0),
        "reward_model_replay_buffer_size=0 keeps nothing to replay: set reward_model_replay_ratio=0.0 or a positive "
        "buffer size.",
    ),
    (
        dict(reward_model_loss_type="listwise"),
        "reward_model_loss_type must be one of pointwise, pairwise (got 'listwise').",
    ),
]


@pytest.mark.parametrize("overrides, message", INVALID, ids=[next(iter(o)) for o, _ in INVALID])
def test_invalid_config_raises(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2, **overrides)
    assert str(info.value).startswith("Invalid GRPOConfig:\n- ")


def test_config_defaults(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2)
    assert (args.reward_model_update_steps, args.reward_model_replay_ratio, args.reward_model_loss_type) == (
        None,
        0.1,
        "pointwise",
    )
    assert (args.reward_model_learning_rate, args.reward_model_num_epochs, args.reward_model_batch_size) == (
        1e-5,
        1,
        8,
    )
    assert args.reward_model_replay_buffer_size == 10000


# ---- the refresher on its own ----


def parity_label(completions, **kwargs):
    """1.0 for an odd-length completion, 0.0 for an even one, None for an empty one."""
    return [None if len(c) == 0 else float(len(c) % 2) for c in completions]


@pytest.fixture
def refresher(tiny_rm_path, tmp_path):
    def make(**overrides):
        args = GRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2, seed=0, **overrides
        )
        model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path).eval().requires_grad_(False)
        tokenizer = AutoTokenizer.from_pretrained(tiny_rm_path)
        model.config.pad_token_id = tokenizer.pad_token_id
        accelerator = SimpleNamespace(num_processes=1)
        return RewardModelRefresh([("tiny-rm", model, tokenizer)], parity_label, args, accelerator, defaultdict(list))

    return make


def test_collect_drops_none_labels_and_groups_rows(refresher):
    refresh = refresher(reward_model_loss_type="pairwise")
    prompts, completions = ["1+1=", "1+1=", "2+2=", "2+2="], ["2", "", "4 ", "5"]
    refresh.collect([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4, trainer_state=None)
    assert [[(e["completion"], e["label"], e["group"]) for e in u] for u in refresh.pending] == [
        [("2", 1.0, 0)],
        [("4 ", 0.0, 1), ("5", 1.0, 1)],
    ]
    pointwise = refresher()
    pointwise.collect([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4, trainer_state=None)
    assert [len(u) for u in pointwise.pending] == [1, 1, 1]


def test_collect_rejects_bad_labels(refresher):
    refresh = refresher()
    refresh.label_func = lambda completions, **kwargs: [1.0]
    with pytest.raises(ValueError, match=re.escape("reward_model_label_func returned 1 labels for 2 completions")):
        refresh.collect([{"prompt": "a"}] * 2, ["a", "a"], ["b", "c"], [[1], [2]], trainer_state=None)
    refresh.label_func = lambda completions, **kwargs: [2.0, 0.0]
    with pytest.raises(ValueError, match=re.escape("needs labels in [0, 1]; reward_model_label_func returned [2.0]")):
        refresh.collect([{"prompt": "a"}] * 2, ["a", "a"], ["b", "c"], [[1], [2]], trainer_state=None)


def test_collect_raises_on_every_process_when_one_returns_too_few_labels(refresher, monkeypatch):
    """Under DDP the label count is checked after the gather: a process whose own labels are fine raises too (a
    process raising alone would leave the others waiting in the next collective)."""
    import trl.trainer.reward_model_refresh as module

    refresh = refresher()
    refresh.accelerator = SimpleNamespace(num_processes=2)
    other_process = (1, 2, [])  # process 1: one label for its two completions
    monkeypatch.setattr(module, "gather_object", lambda local: local + [other_process])
    with pytest.raises(ValueError, match=re.escape("reward_model_label_func returned 1 labels for 2 completions")):
        refresh.collect([{"prompt": "a"}] * 2, ["a", "a"], ["b", "cc"], [[1], [2]], trainer_state=None)
    monkeypatch.setattr(module, "gather_object", lambda local: local + [(2, 2, local[0][2])])  # both fine
    refresh.collect([{"prompt": "a"}] * 2, ["a", "a"], ["b", "cc"], [[1], [2]], trainer_state=None)
    assert [(u[0]["completion"], u[0]["label"]) for u in refresh.pending] == [("b", 1.0), ("cc", 0.0)] * 2


def test_update_metrics_match_a_hand_computation(refresher):
    """One batch holding the whole set: the logged loss is the loss of the pre-update model on that set, and the
    accuracy is measured on the fresh examples before training; the weights move, the buffer takes the fresh set."""
    refresh = refresher(reward_model_batch_size=64, reward_model_learning_rate=1e-2)
    prompts = ["1+2=", "1+2=", "3+4=", "3+4="]
    completions = ["3", "33", "7 ", "7"]
    refresh.collect([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4, trainer_state=None)
    _, model, tokenizer = refresh.reward_models[0]
    examples = [e for u in refresh.pending for e in u]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        logits = score_examples(model, tokenizer, examples)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    expected_loss = pointwise_reward_model_loss(logits, labels).item()
    expected_accuracy = ((logits > 0) == (labels >= 0.5)).float().mean().item()
    refresh.update(global_step=7)
    metrics = refresh.metrics
    assert metrics["reward_model/tiny-rm/loss"] == [pytest.approx(expected_loss, abs=1e-6)]
    assert metrics["reward_model/tiny-rm/accuracy"] == [expected_accuracy]
    assert metrics["reward_model/replay_fraction"] == [0.0] and metrics["reward_model/num_updates"] == [1]
    assert refresh.last_update_step == 7 and refresh.pending == [] and len(refresh.buffer) == 4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(p.requires_grad for p in model.parameters())  # frozen again outside the update


def test_update_renders_conversations_with_chat_template_kwargs(refresher):
    """The reward model trains on what the trainer's reward call scores: messages rendered with the config's
    chat_template_kwargs (here a marker "9 " that the template writes only with enable_thinking=False)."""
    refresh = refresher(
        reward_model_batch_size=64, reward_model_learning_rate=1e-2, chat_template_kwargs={"enable_thinking": False}
    )
    _, model, tokenizer = refresh.reward_models[0]
    tokenizer.chat_template = (
        "{% if enable_thinking is defined and not enable_thinking %}9 {% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    prompts = [[{"role": "user", "content": p}] for p in ("1+2=", "1+2=", "3+4=", "3+4=")]
    completions = [[{"role": "assistant", "content": c}] for c in ("3", "33", "7 ", "7")]
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    refresh.label_func = lambda completions, **kwargs: labels.tolist()
    refresh.collect([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4, trainer_state=None)
    texts = ["9 1+2=3", "9 1+2=33", "9 3+4=7 ", "9 3+4=7"]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        expected = pointwise_reward_model_loss(model(**encoded).logits[:, 0], labels).item()
        examples = [e for u in refresh.pending for e in u]
        without_kwargs = pointwise_reward_model_loss(score_examples(model, tokenizer, examples), labels).item()
    assert abs(expected - without_kwargs) > 1e-4  # the marker changes the score
    refresh.update(global_step=1)
    assert refresh.metrics["reward_model/tiny-rm/loss"] == [pytest.approx(expected, abs=1e-6)]


def test_update_runs_one_optimizer_step_per_batch_and_epoch(refresher):
    refresh = refresher(reward_model_batch_size=3, reward_model_num_epochs=2)
    prompts, completions = ["1+2="] * 4, ["3", "33", "7 ", "7"]
    refresh.collect([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4, trainer_state=None)
    refresh.update(global_step=1)
    state = refresh.optimizers[0].state_dict()["state"]
    assert {v["step"].item() for v in state.values()} == {4.0}  # 2 epochs × batches of 3 + 1 examples


def test_pairwise_trains_only_on_groups_with_different_labels(refresher):
    refresh = refresher(reward_model_loss_type="pairwise", reward_model_learning_rate=1e-2)
    _, model, _ = refresh.reward_models[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompts = ["1+2=", "1+2=", "3+4=", "3+4="]
    tied = ["3", "5", "7 ", "8 "]  # both groups tied (odd, odd / even, even): no pair, no step
    refresh.collect([{"prompt": p} for p in prompts], prompts, tied, [[1]] * 4, trainer_state=None)
    refresh.update(global_step=1)
    assert _equal(before, model.state_dict()) and refresh.optimizers[0].state_dict()["state"] == {}
    assert math.isnan(refresh.metrics["reward_model/tiny-rm/accuracy"][0])
    refresh.collect([{"prompt": p} for p in prompts], prompts, ["3", "33", "7 ", "8 "], [[1]] * 4, None)
    refresh.update(global_step=2)
    assert not _equal(before, model.state_dict())
    assert refresh.metrics["reward_model/tiny-rm/accuracy"][1] in (0.0, 1.0)  # one pair: right or wrong


# ---- in the trainer ----

M = 2


def make_trainer(lm_path, rm_path, output_dir, callbacks=None, label_func=parity_label, reward_funcs=None, **over):
    set_seed(0)
    kwargs = {
        **tiny_grpo_kwargs(str(output_dir)),
        "max_steps": 5,
        "beta": 0.0,
        "reward_model_update_steps": M,
        "reward_model_replay_ratio": 0.2,
        "reward_model_learning_rate": 1e-2,
        "reward_model_batch_size": 8,
    }
    kwargs.update(over)
    return GRPOTrainer(
        model=lm_path,
        reward_funcs=reward_funcs if reward_funcs is not None else [rm_path],
        args=GRPOConfig(**kwargs),
        train_dataset=make_arithmetic_dataset(64),
        callbacks=callbacks,
        reward_model_label_func=label_func,
    )


def any_label(completions, **kwargs):  # never None: every update sees 8 × M fresh completions
    return [float(len(c) % 2) for c in completions]


class RewardModelSnapshots(TrainerCallback):
    """Added after the trainer's callbacks: sees the reward model after each step's update (if any)."""

    def __init__(self, trainer):
        self.model = trainer.reward_model_refresh.reward_models[0][1]
        self.weights = {0: self._copy()}

    def _copy(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def on_step_end(self, args, state, control, **kwargs):
        self.weights[state.global_step] = self._copy()


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_reward_model_changes_exactly_at_multiples_of_m(tiny_lm_path, tiny_rm_path, tmp_path):
    trainer = make_trainer(tiny_lm_path, tiny_rm_path, tmp_path, label_func=any_label)
    snaps = RewardModelSnapshots(trainer)
    trainer.add_callback(snaps)
    trainer.train()
    changed = [step for step in range(1, 6) if not _equal(snaps.weights[step - 1], snaps.weights[step])]
    assert changed == [2, 4]
    rm_params = {id(p) for p in snaps.model.parameters()}
    assert not any(id(p) in rm_params for group in trainer.optimizer.param_groups for p in group["params"])
    logs = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    # 16 fresh completions per update; the second replays round(0.2 · 16 / 0.8) = 4 of the first: 4 / 20.
    assert [logs[s]["reward_model/replay_fraction"] for s in (2, 4)] == [0.0, 0.2]
    assert [logs[s]["reward_model/num_updates"] for s in (2, 4)] == [1, 2]
    assert all("reward_model/tiny-rm/loss" not in logs[s] for s in (1, 3, 5))
    for s in (2, 4):
        assert logs[s]["reward_model/tiny-rm/loss"] > 0 and 0.0 <= logs[s]["reward_model/tiny-rm/accuracy"] <= 1.0
    assert trainer.reward_model_refresh.buffer.num_examples == 32 and len(trainer.reward_model_refresh.pending) == 8


@pytest.mark.parametrize("user_sync", [False, True], ids=["own-sync", "user-sync"])
def test_update_then_reset_at_a_shared_boundary(tiny_lm_path, tiny_rm_path, tmp_path, user_sync):
    callbacks = [SyncRefModelCallback(ref_model=None)] if user_sync else None
    trainer = make_trainer(
        tiny_lm_path,
        tiny_rm_path,
        tmp_path,
        callbacks=callbacks,
        max_steps=4,
        beta=0.1,
        sync_ref_model=True,
        ref_model_mixup_alpha=1.0,
        ref_model_sync_steps=M,
    )
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert kinds.index(RewardModelRefreshCallback) + 1 == kinds.index(SyncRefModelCallback)
    events = []
    refresh, sync = trainer.reward_model_refresh.update, trainer.sync_callback.sync
    trainer.reward_model_refresh.update = lambda step: (events.append(("reward model", step)), refresh(step))
    trainer.sync_callback.sync = lambda args, state, model: (events.append(("reference", state.global_step)), sync(args, state, model))  # fmt: skip
    trainer.train()
    assert events == [("reward model", 2), ("reference", 2), ("reward model", 4), ("reference", 4)]


def test_init_errors(tiny_lm_path, tiny_rm_path, tmp_path):
    with pytest.raises(ValueError, match=re.escape("pass GRPOTrainer(..., reward_model_label_func=f)")):
        make_trainer(tiny_lm_path, tiny_rm_path, tmp_path, label_func=None)
    with pytest.raises(ValueError, match="reward_funcs holds no sequence-classification reward model to train"):
        make_trainer(tiny_lm_path, tiny_rm_path, tmp_path, reward_funcs=[any_label])
    with pytest.raises(ValueError, match=re.escape("set GRPOConfig.reward_model_update_steps or drop")):
        make_trainer(tiny_lm_path, tiny_rm_path, tmp_path, reward_model_update_steps=None)


def test_resume_is_bitwise_exact(tiny_lm_path, tiny_rm_path, tmp_path):
    """Checkpoint at step 3 (between updates, with pending examples and a filled buffer), resume to step 5."""
    run_a = make_trainer(tiny_lm_path, tiny_rm_path, tmp_path / "a")
    run_a.train()

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    run_b = make_trainer(tiny_lm_path, tiny_rm_path, tmp_path / "b", save_strategy="steps", save_steps=3)
    run_b.add_callback(Stop())
    run_b.train()
    checkpoint = tmp_path / "b" / "checkpoint-3"
    assert (checkpoint / REWARD_MODEL_REFRESH_FILE).exists()

    resumed = make_trainer(tiny_lm_path, tiny_rm_path, tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    a, c = run_a.reward_model_refresh, resumed.reward_model_refresh
    assert _equal(a.reward_models[0][1].state_dict(), c.reward_models[0][1].state_dict())
    state_a, state_c = a.optimizers[0].state_dict()["state"], c.optimizers[0].state_dict()["state"]
    assert all(_equal(state_a[k], state_c[k]) for k in state_a) and len(state_a) > 0
    assert a.buffer.units == c.buffer.units and a.pending == c.pending and c.num_updates == 2
    assert _equal(dict(run_a.model.named_parameters()), dict(resumed.model.named_parameters()))

    os.remove(checkpoint / REWARD_MODEL_REFRESH_FILE)
    with pytest.raises(FileNotFoundError, match="this checkpoint was written without reward_model_update_steps"):
        make_trainer(tiny_lm_path, tiny_rm_path, tmp_path / "b").train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.parametrize("plugin", ["deepspeed", "fsdp2"])
def test_sharded_training_is_refused_at_init(tiny_rm_path, tmp_path, plugin):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path)
    accelerator = SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=object() if plugin == "deepspeed" else None),
        is_fsdp2=plugin == "fsdp2",
        unwrap_model=lambda m: m,
    )
    trainer = SimpleNamespace(
        args=GRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2, reward_model_update_steps=1
        ),
        accelerator=accelerator,
        reward_funcs=[model],
        reward_func_names=["tiny-rm"],
        reward_processing_classes=[None],
        _metrics={"train": defaultdict(list)},
    )
    with pytest.raises(ValueError, match=re.escape("reward_model_update_steps works on one device and under DDP")):
        RewardModelRefresh.for_trainer(trainer, parity_label)
