# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""How reward models are trained further during GRPO on the policy's own labelled samples, with replay.

DeepSeekMath's iterative GRPO (arXiv 2402.03300, Algorithm 1, line 12; §4.1.4) keeps training the reward model on
the policy's samples with a replay mechanism that mixes in 10% historical data. This module owns *how*: collecting
labelled completions from each generation batch, the replay buffer, one update, its metrics and its checkpoint
state. *When* is `RewardModelRefreshCallback`'s job (every `reward_model_update_steps` optimizer steps).
"""

import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import DistributedType, gather_object
from torch import nn

from .grpo_inputs import derived_seed, reward_columns
from .grpo_rewards import reward_model_inputs


POINTWISE, PAIRWISE = "pointwise", "pairwise"
REWARD_MODEL_REFRESH_FILE = "reward_model_refresh.pt"  # reward-model weights, optimizers, replay buffer, counters

# One labelled completion: {"prompt", "completion" (text or messages), "label": float, "group": int}. A *unit* is
# what replay draws: one example ("pointwise") or the labelled examples of one prompt's group ("pairwise").
Example = dict[str, Any]
Unit = list[Example]


# ---- pure maths: tensors in, tensors out ----


def pointwise_reward_model_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of the reward logits against labels in [0, 1] (an outcome reward model), mean over rows.

    ℓ = −mean_i [y_i log σ(r_i) + (1 − y_i) log(1 − σ(r_i))]  (outcome supervision, arXiv 2402.03300 §4.1.2).

    Args:
        logits: `(N,)` reward-model scores r_i (any float dtype; computed in float32).
        labels: `(N,)` float labels y_i in [0, 1].

    Returns:
        Scalar float32 loss.
    """
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def preference_pairs(labels: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices `(better, worse)`, each `(P,)` int64, of every ordered pair in one group with `labels[better] >
    labels[worse]`. Ties and pairs across groups are not pairs.

    Args:
        labels: `(N,)` float labels.
        groups: `(N,)` integer group ids (rows of one prompt share an id).
    """
    better = (groups[:, None] == groups[None, :]) & (labels[:, None] > labels[None, :])
    i, j = better.nonzero(as_tuple=True)
    return i, j


def pairwise_reward_model_loss(logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry loss over the preference pairs of each group: −mean_{(i, j)} log σ(r_i − r_j), y_i > y_j.

    (Bradley & Terry 1952; the reward-model loss of InstructGPT, arXiv 2203.02155.)

    Args:
        logits: `(N,)` reward-model scores.
        labels: `(N,)` float labels (only their order within a group matters).
        groups: `(N,)` integer group ids.

    Returns:
        Scalar float32 loss; `0 · Σ logits` (zero, zero gradient, still in the graph) when there is no pair.
    """
    i, j = preference_pairs(labels, groups)
    if i.numel() == 0:
        return logits.float().sum() * 0.0
    return -F.logsigmoid(logits.float()[i] - logits.float()[j]).mean()


def reward_model_accuracy(logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, loss_type: str) -> float:
    """How often the reward model agrees with the labels: `"pointwise"`, the share of rows with `(r > 0) == (y ≥
    0.5)`; `"pairwise"`, the share of preference pairs with r_better > r_worse. NaN when there is nothing to score."""
    if loss_type == PAIRWISE:
        i, j = preference_pairs(labels, groups)
        return (logits[i] > logits[j]).float().mean().item() if i.numel() else float("nan")
    if logits.numel() == 0:
        return float("nan")
    return ((logits > 0) == (labels >= 0.5)).float().mean().item()


def replay_count(num_fresh: int, ratio: float) -> int:
    """Replay units to draw so that they make up `ratio` of fresh + replay: ⌊ratio · num_fresh / (1 − ratio) + ½⌋."""
    return math.floor(ratio * num_fresh / (1.0 - ratio) + 0.5)


def training_batches(units: list[Unit], order: list[int], batch_size: int) -> list[list[Example]]:
    """Walk `units` in `order`, cutting a batch as soon as it holds at least `batch_size` examples (units stay whole,
    so a group is never split); the last batch may be smaller."""
    batches, current = [], []
    for index in order:
        current.extend(units[index])
        if len(current) >= batch_size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


# ---- the replay buffer ----


class ReplayBuffer:
    """The labelled units of earlier updates, at most `capacity` examples (oldest units dropped first).

    Draws are without replacement from a caller-given `torch.Generator`, so they are reproducible from a seed.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.units: list[Unit] = []

    def __len__(self) -> int:
        return len(self.units)

    @property
    def num_examples(self) -> int:
        return sum(len(unit) for unit in self.units)

    def add(self, units: list[Unit]) -> None:
        self.units.extend(units)
        total = self.num_examples
        while self.units and total > self.capacity:
            total -= len(self.units.pop(0))

    def sample(self, k: int, generator: torch.Generator) -> list[Unit]:
        """`min(k, len(self))` distinct units in a random order."""
        order = torch.randperm(len(self.units), generator=generator)[: min(k, len(self.units))]
        return [self.units[i] for i in order.tolist()]


def score_examples(
    model: nn.Module, tokenizer, examples: list[Example], chat_template_kwargs: dict[str, Any] | None = None
) -> torch.Tensor:
    """`(N,)` float32 first logits of `model` on the examples, with gradients: the inputs of the trainer's reward
    call (`reward_model_inputs`; conversational examples rendered with the same `chat_template_kwargs`)."""
    device = next(model.parameters()).device
    prompts, completions = [e["prompt"] for e in examples], [e["completion"] for e in examples]
    encoded = reward_model_inputs(tokenizer, prompts, completions, chat_template_kwargs, device)
    return model(**encoded).logits[:, 0].float()


# ---- one refresher for all trainable reward models of a trainer ----


class RewardModelRefresh:
    """Collects labelled completions and trains the reward models on fresh + replayed examples when asked.

    Every process sees the whole global batch (completions are gathered at collection), draws the same replay with
    the same seed and runs the same update, so under DDP the reward models stay identical without an all-reduce.
    The reward models keep eval mode (no dropout) while they train, have their own AdamW (no weight decay, no
    scheduler) and never enter the policy's optimizer; their parameters require gradients only inside `update`.

    Args:
        reward_models: `(name, model, tokenizer)` of each reward model to train.
        label_func: `f(prompts, completions, completion_ids, trainer_state, **columns) -> list[float | None]`, one
            label per completion; `None` rows are not used.
        args: the `GRPOConfig` (`reward_model_*` fields, `num_generations`, `seed`).
        accelerator: gathers completions across processes.
        metrics: the trainer's list-valued metrics dict to append to.

    Raises:
        ValueError: (in `collect`) if `label_func` returns a wrong number of labels, or a `"pointwise"` label
            outside [0, 1].
    """

    def __init__(
        self, reward_models: list[tuple[str, nn.Module, Any]], label_func: Callable, args, accelerator, metrics
    ):
        self.reward_models = reward_models
        self.label_func = label_func
        self.args = args
        self.accelerator = accelerator
        self.metrics = metrics
        self.optimizers = [
            torch.optim.AdamW(model.parameters(), lr=args.reward_model_learning_rate, weight_decay=0.0)
            for _, model, _ in reward_models
        ]
        self.buffer = ReplayBuffer(args.reward_model_replay_buffer_size)
        self.pending: list[Unit] = []  # units collected since the last update
        self.num_updates = 0
        self.last_update_step = 0
        self.num_groups = 0  # groups collected so far (ids for pairwise units)

    @classmethod
    def for_trainer(cls, trainer, label_func: Callable | None) -> "RewardModelRefresh | None":
        """The refresher of a `GRPOTrainer`, or `None` when `reward_model_update_steps` is `None`.

        Raises:
            ValueError: if `reward_model_update_steps` is set without `label_func`, `label_func` is given without
                `reward_model_update_steps`, no reward function is a `PreTrainedModel`, or training runs under
                DeepSpeed or FSDP.
        """
        from transformers import PreTrainedModel

        args = trainer.args
        if args.reward_model_update_steps is None:
            if label_func is not None:
                raise ValueError(
                    "reward_model_label_func is only used to train reward models: set "
                    "GRPOConfig.reward_model_update_steps or drop reward_model_label_func."
                )
            return None
        if label_func is None:
            raise ValueError(
                "reward_model_update_steps is set, so reward models are trained on labelled completions: pass "
                "GRPOTrainer(..., reward_model_label_func=f) returning a label (or None) per completion."
            )
        accelerator = trainer.accelerator
        unwrap = lambda f: accelerator.unwrap_model(f) if isinstance(f, nn.Module) else f  # noqa: E731
        models = [
            (name, unwrap(func), tokenizer)
            for func, name, tokenizer in zip(
                trainer.reward_funcs, trainer.reward_func_names, trainer.reward_processing_classes
            )
            if isinstance(unwrap(func), PreTrainedModel)
        ]
        if not models:
            raise ValueError(
                "reward_model_update_steps is set but reward_funcs holds no sequence-classification reward model to "
                "train: add one (a path or a PreTrainedModel) or set reward_model_update_steps=None."
            )
        sharded = getattr(accelerator, "distributed_type", None) in (DistributedType.DEEPSPEED, DistributedType.FSDP)
        if sharded or getattr(accelerator.state, "deepspeed_plugin", None) is not None or accelerator.is_fsdp2:
            raise ValueError(
                "reward_model_update_steps works on one device and under DDP, not under DeepSpeed or FSDP (the "
                "reward model would be sharded without an optimizer): use DDP or set reward_model_update_steps=None."
            )
        return cls(models, label_func, args, accelerator, trainer._metrics["train"])

    # ---- collection ----

    def collect(self, inputs: list[dict], prompts: list, completions: list, completion_ids: list, trainer_state):
        """Label this process's completions with `label_func`, gather all processes' rows (global batch order) and
        keep the labelled ones as pending units, grouped `num_generations` rows per prompt."""
        columns = reward_columns(inputs)
        labels = self.label_func(
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
            **columns,
        )
        got = "None" if labels is None else len(labels)
        rows = [
            {"prompt": p, "completion": c, "label": None if y is None else float(y)}
            for p, c, y in zip(prompts, completions, labels if got == len(prompts) else [])
        ]
        # Gathered before any check, so that every process raises the same error (one raising alone would leave the
        # others waiting in the next collective).
        per_process = [(got, len(prompts), rows)]
        if self.accelerator.num_processes > 1:
            per_process = gather_object(per_process)
        for got, expected, _ in per_process:
            if got != expected:
                raise ValueError(
                    f"reward_model_label_func returned {got} labels for {expected} completions; it must return one "
                    "label (or None) per completion."
                )
        rows = [row for _, _, process_rows in per_process for row in process_rows]
        if self.args.reward_model_loss_type == POINTWISE:
            bad = [r["label"] for r in rows if r["label"] is not None and not 0.0 <= r["label"] <= 1.0]
            if bad:
                raise ValueError(
                    f"reward_model_loss_type='pointwise' needs labels in [0, 1]; reward_model_label_func returned "
                    f"{bad[:3]}. Rescale the labels or use reward_model_loss_type='pairwise'."
                )
        size = self.args.num_generations
        for start in range(0, len(rows), size):
            group = [{**r, "group": self.num_groups} for r in rows[start : start + size] if r["label"] is not None]
            self.num_groups += 1
            if self.args.reward_model_loss_type == PAIRWISE:
                self.pending.extend([group] if group else [])
            else:
                self.pending.extend([example] for example in group)

    # ---- the update ----

    def _generator(self) -> torch.Generator:
        # 0x524D: "RM", apart from the other seeded streams
        return torch.Generator().manual_seed(derived_seed(self.args.seed, 0x524D, self.num_updates))

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        if self.args.reward_model_loss_type == PAIRWISE:
            return pairwise_reward_model_loss(logits, labels, groups)
        return pointwise_reward_model_loss(logits, labels)

    def update(self, global_step: int) -> None:
        """Train every reward model on the pending units + a replayed share, then move the pending units to the
        replay buffer. A `"pairwise"` batch without a preference pair is skipped (no optimizer step). Appends
        `reward_model/<name>/loss` (mean over its trained batches, NaN if none), `reward_model/<name>/accuracy`
        (on the fresh examples, before training), `reward_model/replay_fraction` and `reward_model/num_updates`."""
        args = self.args
        fresh = self.pending
        self.last_update_step = global_step
        if not fresh:
            return
        generator = self._generator()
        replay = self.buffer.sample(replay_count(len(fresh), args.reward_model_replay_ratio), generator)
        units = fresh + replay
        orders = [
            torch.randperm(len(units), generator=generator).tolist() for _ in range(args.reward_model_num_epochs)
        ]
        fresh_examples = [e for unit in fresh for e in unit]
        for (name, model, tokenizer), optimizer in zip(self.reward_models, self.optimizers):
            device = next(model.parameters()).device
            with torch.no_grad():
                logits = score_examples(model, tokenizer, fresh_examples, args.chat_template_kwargs)
            labels, groups = _labels_and_groups(fresh_examples, device)
            accuracy = reward_model_accuracy(logits, labels, groups, args.reward_model_loss_type)
            losses = []
            model.requires_grad_(True)
            try:
                for order in orders:
                    for batch in training_batches(units, order, args.reward_model_batch_size):
                        labels, groups = _labels_and_groups(batch, device)
                        if (
                            args.reward_model_loss_type == PAIRWISE
                            and preference_pairs(labels, groups)[0].numel() == 0
                        ):
                            continue  # nothing to compare: no optimizer step
                        logits = score_examples(model, tokenizer, batch, args.chat_template_kwargs)
                        loss = self._loss(logits, labels, groups)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        optimizer.step()
                        losses.append(loss.item())
            finally:
                optimizer.zero_grad(set_to_none=True)
                model.requires_grad_(False)
            self.metrics[f"reward_model/{name}/loss"].append(sum(losses) / len(losses) if losses else float("nan"))
            self.metrics[f"reward_model/{name}/accuracy"].append(accuracy)
        self.metrics["reward_model/replay_fraction"].append(len(replay) / len(units))
        self.buffer.add(fresh)
        self.pending = []
        self.num_updates += 1
        self.metrics["reward_model/num_updates"] = [self.num_updates]

    # ---- checkpoints ----

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer state of every reward model, the replay buffer, the pending units and counters."""
        return {
            "models": [
                {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
                for _, m, _ in self.reward_models
            ],
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "buffer": self.buffer.units,
            "pending": self.pending,
            "counters": {
                "num_updates": self.num_updates,
                "last_update_step": self.last_update_step,
                "num_groups": self.num_groups,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (bitwise: tensors are copied, not recomputed).

        Raises:
            ValueError: if the saved state holds a different number of reward models.
        """
        if len(state["models"]) != len(self.reward_models):
            raise ValueError(
                f"The checkpoint holds {len(state['models'])} reward models but this trainer refreshes "
                f"{len(self.reward_models)}: resume with the same reward_funcs."
            )
        with torch.no_grad():
            for (_, model, _), weights in zip(self.reward_models, state["models"]):
                model.load_state_dict(weights)
        for optimizer, saved in zip(self.optimizers, state["optimizers"]):
            optimizer.load_state_dict(saved)
        self.buffer.units, self.pending = state["buffer"], state["pending"]
        counters = state["counters"]
        self.num_updates, self.last_update_step = counters["num_updates"], counters["last_update_step"]
        self.num_groups = counters["num_groups"]

    def save(self, folder: str, should_save: bool) -> None:
        """Write `REWARD_MODEL_REFRESH_FILE` into `folder` (every process holds the same state; one writes)."""
        if should_save:
            os.makedirs(folder, exist_ok=True)
            torch.save(self.state_dict(), os.path.join(folder, REWARD_MODEL_REFRESH_FILE))

    def load(self, checkpoint: str) -> None:
        """Restore from `checkpoint`'s `REWARD_MODEL_REFRESH_FILE`.

        Raises:
            FileNotFoundError: if the checkpoint has none (it was not written with `reward_model_update_steps` set).
        """
        path = os.path.join(checkpoint, REWARD_MODEL_REFRESH_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: this checkpoint was written without reward_model_update_steps, so the trained "
                "reward models, their optimizers and the replay buffer cannot be restored."
            )
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def _labels_and_groups(examples: list[Example], device) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.tensor([e["label"] for e in examples], dtype=torch.float32, device=device)
    groups = torch.tensor([e["group"] for e in examples], dtype=torch.long, device=device)
    return labels, groups
