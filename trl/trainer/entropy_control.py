# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The entropy-bonus coefficient: fixed, or adapted once per optimizer step (Skywork-OR1, arXiv 2505.22312), with
its state saved in checkpoints (`trainer_state.json`) and restored on resume; the bonus term and its metrics."""

import math
from collections.abc import Callable

import torch
from accelerate.utils import gather
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .grpo_losses import masked_mean
from .grpo_metrics import policy_loss_metric


class EntropyCoefficient(TrainerCallback, ExportableState):
    """Holds the weight of the entropy bonus `loss − coef · mean entropy` of [`GRPOTrainer`].

    Fixed (`adaptive=False`): `coef` stays `entropy_coef`. Adaptive (Skywork-OR1, arXiv 2505.22312): after every
    optimizer step, the token-weighted mean entropy H of that step's micro-batches over all processes moves `coef` by
    `coef_delta` (up when H ≤ `target`, down otherwise) within [`coef_min`, `coef_max`]; the bonus of the next step is
    applied only while the last measured H is at most `target` (none before the first measurement).

    Args:
        entropy_coef: initial (or fixed) coefficient.
        adaptive: adapt it as above.
        coef_min, coef_max, coef_delta, target: the adaptive bounds, step and target entropy (nats).
    """

    def __init__(
        self,
        entropy_coef: float = 0.0,
        adaptive: bool = False,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
        coef_delta: float = 0.005,
        target: float = 0.2,
    ):
        self.entropy_coef, self.adaptive = entropy_coef, adaptive
        self.coef_min, self.coef_max, self.coef_delta, self.target = coef_min, coef_max, coef_delta, target
        self.coef = entropy_coef
        self.last_entropy = math.inf  # the last step's measured entropy
        self._window: torch.Tensor | None = None  # [entropy sum, token count] of this step's micro-batches

    @classmethod
    def from_config(cls, args) -> "EntropyCoefficient":
        """Built from a [`GRPOConfig`]'s `entropy_coef`, `use_adaptive_entropy`, `entropy_coef_min/max/delta` and
        `entropy_target`."""
        return cls(
            args.entropy_coef,
            args.use_adaptive_entropy,
            args.entropy_coef_min,
            args.entropy_coef_max,
            args.entropy_coef_delta,
            args.entropy_target,
        )

    @property
    def enabled(self) -> bool:
        """Whether the bonus term is part of the loss at all."""
        return self.adaptive or self.entropy_coef != 0.0

    def applied(self) -> float:
        """The coefficient to multiply the mean entropy by in the current optimizer step."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def add_bonus(
        self,
        loss: torch.Tensor,
        entropies: torch.Tensor,
        mask: torch.Tensor,
        training: bool,
        end_of_step: bool,
        reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> tuple[torch.Tensor, float | None]:
        """One micro-batch's loss with the bonus: `loss − applied() · mean(entropies over mask)`.

        In training the micro-batch is also observed (see `observe`), after the bonus is taken, so a step's bonus
        uses the coefficient set by the step before.

        Args:
            loss: scalar loss without the bonus.
            entropies: `(N, L)` per-token entropies (with a gradient, for the bonus to act).
            mask: `(N, L)` 0/1 tensor of the tokens the policy loss acts on.
            training: a training micro-batch (evaluation neither observes nor logs the coefficient).
            end_of_step: the last micro-batch of an optimizer step.
            reduce: sums a tensor over processes.

        Returns:
            `(loss, coef)`: `coef` is the coefficient to log as `entropy_coef` at the end of a training step, else
            `None`.
        """
        loss = loss - self.applied() * masked_mean(entropies, mask)
        if training:
            self.observe(entropies, mask, end_of_step, reduce)
        return loss, self.coef if training and end_of_step else None

    def add_logged_bonus(
        self,
        loss: torch.Tensor,
        entropies: torch.Tensor,
        mask: torch.Tensor,
        metrics: dict[str, list],
        loss_type: str,
        training: bool,
        accumulation_steps: int,
        accelerator,
    ) -> torch.Tensor:
        """`add_bonus` in the trainer's loss, with TRL's metrics appended to `metrics`: `policy_loss`, the loss before
        the bonus (see `grpo_metrics.policy_loss_metric`), and `entropy_coef` at the end of a training step.

        Args:
            loss, entropies, mask, training: as in `add_bonus`.
            metrics: name → values logged at the next log (the trainer's of this mode).
            loss_type: the config's `loss_type`.
            accumulation_steps: micro-batches in the current accumulation window.
            accelerator: the trainer's; its `sync_gradients` marks the end of an optimizer step, its `reduce` sums
                over processes.
        """
        metrics["policy_loss"].append(
            policy_loss_metric(
                loss, loss_type, training=training, accumulation_steps=accumulation_steps, gather=gather
            )
        )
        end_of_step = accelerator.sync_gradients
        loss, coef = self.add_bonus(
            loss, entropies, mask, training=training, end_of_step=end_of_step, reduce=accelerator.reduce
        )
        if coef is not None:  # the coefficient of optimizer steps: never an eval metric
            metrics["entropy_coef"].append(coef)
        return loss

    def observe(
        self,
        entropies: torch.Tensor,
        mask: torch.Tensor,
        end_of_step: bool,
        reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> None:
        """Add one training micro-batch's `(N, L)` entropies over `mask`; at the end of an optimizer step, sum the
        step's totals over processes with `reduce` and update `coef` (adaptive mode only)."""
        if not self.adaptive:
            return
        mask = mask.to(entropies.dtype)
        stats = torch.stack([(entropies.detach() * mask).sum(), mask.sum()]).float()
        self._window = stats if self._window is None else self._window + stats
        if end_of_step:
            total = reduce(self._window)
            self.last_entropy = (total[0] / total[1].clamp(min=1.0)).item()
            step = self.coef_delta if self.last_entropy <= self.target else -self.coef_delta
            self.coef = min(max(self.coef + step, self.coef_min), self.coef_max)
            self._window = None

    def state(self) -> dict:
        args = dict(entropy_coef=self.entropy_coef, adaptive=self.adaptive, coef_min=self.coef_min)
        args.update(coef_max=self.coef_max, coef_delta=self.coef_delta, target=self.target)
        return {"args": args, "attributes": {"coef": self.coef, "last_entropy": self.last_entropy}}

    def on_train_begin(self, args, state, control, **kwargs):
        """On resume, take back the coefficient and the last entropy saved in the checkpoint's trainer state."""
        self._window = None
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if state.global_step > 0 and isinstance(saved, dict):
            self.coef, self.last_entropy = saved["attributes"]["coef"], saved["attributes"]["last_entropy"]
