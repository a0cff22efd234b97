# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The vLLM importance-sampling correction as pure tensor functions: the weight that reweights each completion token
sampled by vLLM towards the trainer's own distribution, and its logged metrics (TRL 1.16's names and definitions).

vLLM and the trainer hold the same weights but compute a token's log-prob with different kernels (and, on
accelerators, precisions), so completions sampled by vLLM are slightly off-policy for the trainer. The correction
multiplies the per-token policy loss by the detached ratio ρ = π_trainer(token) / π_vLLM(token), bounded:

- `truncate` (TIS, truncated importance sampling): ρ ← clamp(ρ, C_min, C_max). From F. Yao, L. Liu, D. Zhang,
  C. Dong, J. Shang and J. Gao, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (blog post,
  2025, https://fengyao.notion.site/off-policy-rl; no arXiv version).
- `mask` (MIS, masked importance sampling): ρ ← ρ inside [C_min, C_max] and 0 outside, so the token or sequence leaves
  the gradient. The upper bound: J. Liu, Y. Li, Y. Fu, J. Wang, Q. Liu and Y. Shen, "When Speed Kills Stability:
  Demystifying RL Collapse from the Training-Inference Mismatch" (blog post, 2025,
  https://yingru.notion.site/When-Speed-Kills-Stability-271211a558b7808d8b12d403fd15edda); both bounds: IcePop
  (https://ringtech.notion.site/icepop; Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for
  Trillion-Scale Thinking Model", arXiv 2510.18855).
- `token` granularity: one ratio per token, ρ_it = exp(old_it − vllm_it). `sequence` granularity: one ratio per
  completion, ρ_i = exp(Σ_t (old_it − vllm_it)), the likelihood ratio of the whole sequence (the same "When Speed
  Kills Stability" post argues that this one is unbiased), applied to every token of the completion.

These are the four `vllm_importance_sampling_mode` values of TRL 1.16 (docs: "GRPO Trainer", the training-inference
mismatch section, and the "Paper Index" entries "Truncated Importance Sampling", "Masked Importance Sampling",
"Sequence-level Importance Sampling"). Notation: N completions, L completion tokens.
"""

import torch


IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

RATIO_METRIC = "sampling/importance_sampling_ratio"
LOGP_DIFFERENCE_METRIC = "sampling/sampling_logp_difference"


def _granularity(mode: str) -> str:
    """`"token"` or `"sequence"` for a known mode; a `ValueError` naming the four modes otherwise."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(
            f"Unknown vLLM importance sampling mode: {mode!r}. It must be one of 'token_truncate', 'token_mask', "
            "'sequence_truncate' or 'sequence_mask'."
        )
    return mode.split("_", 1)[0]


def _log_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, counted): d = old − sampling on the masked tokens that are not NaN, 0 elsewhere; counted marks those tokens.
    Both `(N, L)`; no gradient."""
    if not old.shape == sampling.shape == mask.shape or old.dim() != 2:
        raise ValueError(
            "old_per_token_logps, sampling_per_token_logps and mask must have the same (N, L) shape (got "
            f"{tuple(old.shape)}, {tuple(sampling.shape)} and {tuple(mask.shape)})."
        )
    difference = old.detach() - sampling.detach()
    counted = (mask != 0) & ~torch.isnan(difference)
    return torch.where(counted, difference, torch.zeros_like(difference)), counted


def vllm_importance_sampling_ratio(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """The importance-sampling weight of vLLM's samples, ρ = π_trainer / π_vLLM, bounded as `mode` says (see the module
    docstring for the four modes and their sources). No gradient flows through it.

    With d_it = old_it − sampling_it on the tokens where `mask` is non-zero, and 0 on the others and where d is NaN
    (a token vLLM returned no log-prob for, or a padded one): token modes give ρ_it = exp(d_it); sequence modes give
    ρ_i = exp(Σ_t d_it), a sum over the completion's tokens (not a mean). Then `*_truncate` clamps ρ to
    [clip_min, clip_max] and `*_mask` sets ρ to 0 where it lies outside [clip_min, clip_max] (bounds included in the
    kept range). A `None` bound is not applied (−∞ / +∞). Token modes leave the masked-out positions at exp(0) = 1
    before the bounds; the loss ignores them anyway. With `top_k`/`top_p` below their defaults, vLLM's processed
    log-probs are renormalised over the kept tokens while the trainer's are not, so ρ ≠ 1 even with identical weights
    (as in TRL 1.16).

    Args:
        old_per_token_logps: `(N, L)` float tensor, the trainer's log-prob of each sampled token under the weights
            that sampled it (TRL's "old" log-probs).
        sampling_per_token_logps: `(N, L)` float tensor, vLLM's log-prob of the same tokens as it sampled them
            (processed: after temperature and top-k/top-p), NaN where it has none.
        mask: `(N, L)` tensor of any dtype, non-zero on completion tokens.
        mode: one of `IMPORTANCE_SAMPLING_MODES`.
        clip_min: lower bound C_min, or `None`.
        clip_max: upper bound C_max, or `None`.

    Returns:
        Detached tensor of the log-probs' dtype: `(N, L)` for token modes, `(N, 1)` for sequence modes.

    Raises:
        ValueError: for an unknown `mode`, or inputs that are not three tensors of one `(N, L)` shape.
    """
    granularity = _granularity(mode)
    log_ratio, _ = _log_ratio(old_per_token_logps, sampling_per_token_logps, mask)
    if granularity == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if mode.endswith("_truncate"):
        if clip_min is not None or clip_max is not None:
            ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        keep = torch.ones_like(ratio, dtype=torch.bool)
        if clip_min is not None:
            keep &= ratio >= clip_min
        if clip_max is not None:
            keep &= ratio <= clip_max
        ratio = torch.where(keep, ratio, torch.zeros_like(ratio))
    return ratio


def importance_sampling_metrics(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    ratio: torch.Tensor,
    mode: str,
) -> dict[str, torch.Tensor]:
    """This process's values of TRL 1.16's importance-sampling metrics, as 0-dim tensors of the log-probs' dtype:

    - `sampling/sampling_logp_difference/mean` and `/max`: of |old − sampling| over the tokens where `mask` is
      non-zero and the difference is not NaN;
    - `sampling/importance_sampling_ratio/min`, `/mean` and `/max`: of `ratio` (after its bounds) over all N
      sequences for sequence modes, over the masked tokens for token modes.

    Each is 0.0 when there is nothing to reduce. Across processes TRL gathers these local values and logs the mean of
    the means, the max of the maxes and the min of the mins (so the logged means weigh every process equally, not
    every token).

    Args:
        old_per_token_logps: `(N, L)` float tensor (see `vllm_importance_sampling_ratio`).
        sampling_per_token_logps: `(N, L)` float tensor, NaN where vLLM gave no log-prob.
        mask: `(N, L)` tensor, non-zero on completion tokens.
        ratio: what `vllm_importance_sampling_ratio` returned for these inputs and `mode`: `(N, L)` or `(N, 1)`.
        mode: one of `IMPORTANCE_SAMPLING_MODES`.

    Returns:
        `{name: 0-dim tensor}` for the five names above.

    Raises:
        ValueError: for an unknown `mode`, mismatched `(N, L)` inputs, or a `ratio` of the wrong shape for `mode`.
    """
    granularity = _granularity(mode)
    log_ratio, counted = _log_ratio(old_per_token_logps, sampling_per_token_logps, mask)
    expected = (mask.shape[0], 1) if granularity == "sequence" else tuple(mask.shape)
    if tuple(ratio.shape) != expected:
        raise ValueError(f"ratio must have shape {expected} for mode {mode!r} (got {tuple(ratio.shape)}).")
    difference = log_ratio.abs()[counted]
    ratio = ratio.detach().reshape(-1) if granularity == "sequence" else ratio.detach()[mask != 0]
    zero = torch.zeros((), dtype=old_per_token_logps.dtype, device=old_per_token_logps.device)

    def reduce(values: torch.Tensor, how) -> torch.Tensor:
        return how(values).to(zero.dtype) if values.numel() else zero.clone()

    return {
        f"{LOGP_DIFFERENCE_METRIC}/mean": reduce(difference, torch.mean),
        f"{LOGP_DIFFERENCE_METRIC}/max": reduce(difference, torch.max),
        f"{RATIO_METRIC}/min": reduce(ratio, torch.min),
        f"{RATIO_METRIC}/mean": reduce(ratio, torch.mean),
        f"{RATIO_METRIC}/max": reduce(ratio, torch.max),
    }


def reduced_over_processes(metrics: dict[str, torch.Tensor], gather) -> dict[str, float]:
    """`importance_sampling_metrics` of every process in one value each, as TRL 1.16 logs them: the mean of the
    processes' means, the largest maximum and the smallest minimum. `gather` is accelerate's (`(1,)` tensors in, the
    processes' values out)."""
    reduced = {}
    for name, value in metrics.items():
        values = gather(value.reshape(1))
        reduced[name] = (
            values.max() if name.endswith("/max") else values.min() if name.endswith("/min") else values.mean()
        ).item()
    return reduced
