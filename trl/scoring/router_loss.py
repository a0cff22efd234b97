# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The Mixture-of-Experts router's load-balancing loss: its weight and whether the trainer adds it
(`GRPOConfig.router_aux_loss_coef` against the model's config). `score_completions(compute_aux_loss=True)` returns
the loss itself."""

from torch import nn


def router_aux_loss_settings(model: nn.Module, router_aux_loss_coef: float | None) -> tuple[float, bool]:
    """The MoE load-balancing loss weight and whether to add it, as `GRPOConfig.router_aux_loss_coef` says.

    `None` takes the model config's own `router_aux_loss_coef` (0 when it has none). The loss is added when the
    model can return router logits (its config has `output_router_logits`) and the weight is not 0.

    Returns:
        `(coefficient, enabled)`.

    Raises:
        ValueError: if a non-zero coefficient is given for a model without router logits.
    """
    config = model.config.get_text_config()
    can_route = hasattr(config, "output_router_logits")
    coef = getattr(config, "router_aux_loss_coef", 0.0) if router_aux_loss_coef is None else router_aux_loss_coef
    if router_aux_loss_coef and not can_route:
        raise ValueError(
            f"router_aux_loss_coef={router_aux_loss_coef}, but {type(model).__name__} is not a Mixture-of-Experts "
            "model: it returns no router logits, so there is no load-balancing loss to weight; leave "
            "router_aux_loss_coef=None (or 0.0)."
        )
    return coef, can_route and coef != 0.0
