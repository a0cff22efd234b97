# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The GRPO maths as pure tensor functions: rewards → advantages, masks, log-probs, KL, clipped loss, normalisation.

Nothing here knows about a trainer or a model; every function takes tensors and returns tensors. Notation follows
DeepSeekMath (arXiv 2402.03300, eq. 3–4 and Algorithm 1): N = B·G completions (B prompts × G = `num_generations`),
L = completion length in tokens.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import torch


# exp(20) ≈ 4.9e8: beyond this log-ratio the k3 estimator is continued linearly (see `kl_k3`).
KL_LOG_RATIO_LINEAR_FROM = 20.0
ADVANTAGE_STD_EPS = 1e-4


def group_reward_std(rewards: torch.Tensor, num_generations: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Sample (Bessel-corrected) standard deviation of each group's valid rewards; 0 with fewer than two.

    Args:
        rewards: `(N,)` float tensor, N = B·G, the G completions of a prompt contiguous.
        num_generations: G.
        valid: optional `(N,)` bool mask of the rewards to count.

    Returns:
        `(B,)` float tensor.
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).view(-1, num_generations)
    v = valid.view(-1, num_generations).to(rewards.dtype)
    count = v.sum(dim=1)
    mean = r.sum(dim=1, keepdim=True) / count.clamp(min=1).unsqueeze(1)
    return (((r - mean) * v).square().sum(dim=1) / (count - 1).clamp(min=1)).sqrt()


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    valid: torch.Tensor | None = None,
    eps: float = ADVANTAGE_STD_EPS,
) -> torch.Tensor:
    """Group-relative advantages Â_i = (r_i − mean(r_group)) / (std + eps) (arXiv 2402.03300, §4.1.2).

    The mean and the sample (Bessel-corrected) standard deviation are taken over the G completions of each prompt,
    counting only `valid` ones. A group whose valid rewards are all equal gets advantages of exactly 0, and so do
    invalid completions.

    Args:
        rewards: `(N,)` float tensor, N = B·G, the G completions of a prompt contiguous.
        num_generations: G.
        scale_rewards: `"group"` divides by the group's std, `"batch"` by the std of all valid rewards, `"none"`
            does not divide (Dr. GRPO, arXiv 2503.20783).
        valid: optional `(N,)` bool mask; `False` entries get advantage 0 and do not move their group's statistics.
        eps: added to the std.

    Returns:
        `(N,)` float tensor of advantages.

    Raises:
        ValueError: if N is not a multiple of G or `scale_rewards` is unknown.
    """
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of num_generations={num_generations}."
        )
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).view(-1, num_generations)
    v = valid.view(-1, num_generations).to(rewards.dtype)
    mean = r.sum(dim=1, keepdim=True) / v.sum(dim=1, keepdim=True).clamp(min=1)
    centred = (r - mean) * v
    group_std = group_reward_std(rewards, num_generations, valid).unsqueeze(1)
    _check_finite_statistics(mean, group_std if scale_rewards == "group" else mean)
    # Exact zeros for groups with one valid value or all-equal values (no rounding residue from the mean).
    distinct = r.masked_fill(v == 0, float("inf")).amin(1) != r.masked_fill(v == 0, float("-inf")).amax(1)
    centred = centred * distinct.unsqueeze(1)
    if scale_rewards == "group":
        advantages = centred / (group_std + eps)
    elif scale_rewards == "batch":
        flat = rewards[valid]
        batch_std = flat.std() if flat.numel() > 1 else rewards.new_zeros(())
        _check_finite_statistics(batch_std, batch_std)
        advantages = centred / (batch_std + eps)
    elif scale_rewards == "none":
        advantages = centred
    else:
        raise ValueError(
            f"Invalid value for scale_rewards: {scale_rewards}. scale_rewards must be 'group', 'batch' or 'none'."
        )
    _check_finite_statistics(mean, advantages)  # r − mean itself can overflow while the mean does not
    return advantages.reshape(-1)


def _check_finite_statistics(mean: torch.Tensor, std: torch.Tensor) -> None:
    """Raise a `ValueError` when finite rewards are too large for their mean, standard deviation (or advantages) in
    their dtype (e.g. ±1e20 in one float32 group: the variance overflows, and every advantage would silently become
    0; 3e38 and −3e38: r − mean overflows)."""
    if not (torch.isfinite(mean).all() and torch.isfinite(std).all()):
        raise ValueError(
            "The rewards are too large for their group statistics: their mean or standard deviation overflows "
            f"{mean.dtype} (rewards near ±1e19 or beyond in float32). Scale the reward functions or reward_weights "
            "down."
        )


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """Mask of the tokens that belong to each completion: everything up to and including the first EOS.

    Found by position, so it stays right when the pad token equals the EOS token.

    Args:
        completion_ids: `(N, L)` int tensor of generated ids (right-padded after EOS).
        eos_token_id: one id or a list of ids that end a completion.

    Returns:
        `(N, L)` int64 tensor of 1s and 0s.
    """
    eos_ids = torch.as_tensor(eos_token_id, device=completion_ids.device).reshape(-1)
    is_eos = torch.isin(completion_ids, eos_ids)
    length = completion_ids.size(1)
    first_eos = torch.where(
        is_eos.any(dim=1), is_eos.int().argmax(dim=1), torch.full_like(is_eos[:, 0], length, dtype=torch.long)
    )
    positions = torch.arange(length, device=completion_ids.device).unsqueeze(0)
    return (positions <= first_eos.unsqueeze(1)).long()


def pad_to_multiple(tensor: torch.Tensor, multiple: int | None, value: int, side: str = "right") -> torch.Tensor:
    """Pad the last dimension of `tensor` with `value` on `side` (`"left"` or `"right"`) to a multiple of `multiple`.

    Args:
        tensor: `(N, L)` tensor (ids or a mask).
        multiple: the multiple; `None` returns `tensor` unchanged.
        value: the fill value (the pad token id for ids, 0 for masks).

    Returns:
        `(N, L')` tensor, L' the smallest multiple of `multiple` that is at least L.
    """
    extra = -tensor.size(-1) % multiple if multiple else 0
    if extra == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (extra, 0) if side == "left" else (0, extra), value=value)


def selective_log_softmax(
    logits: torch.Tensor,
    index: torch.Tensor,
    max_chunk_bytes: int = 2**28,
    return_entropy: bool = False,
    entropy_grad: bool = True,
    temperature: float = 1.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature)[index] per position, computed in float32, in row chunks of at most
    `max_chunk_bytes` of float32 logits (one batched kernel for small batches, bounded memory for large vocabularies).

    The logits are cast to float32 before the division by the temperature, as the sampler divides them in
    `generate` and as `scoring.chunked_logprobs` does: one rounding rule on every path (dividing bf16 logits in bf16
    would round them a second time).

    Args:
        logits: `(N, L, V)` float tensor (any float dtype), not yet divided by the temperature.
        index: `(N, L)` int tensor of token ids.
        max_chunk_bytes: memory budget of one chunk's float32 log-probs.
        return_entropy: also return the entropy −Σ_v p_v log p_v of each position's distribution (in nats).
        entropy_grad: whether the entropies carry a gradient (`False` saves an `(N, L, V)` float32 buffer).
        temperature: the sampling temperature (> 0).

    Returns:
        `(N, L)` float32 log-probabilities, and with `return_entropy` a second `(N, L)` float32 tensor of entropies.
    """
    row_bytes = max(1, logits[0].numel() * 4)
    rows_per_chunk = max(1, max_chunk_bytes // row_bytes)
    out, entropies = [], []
    for start in range(0, logits.size(0), rows_per_chunk):
        chunk = logits[start : start + rows_per_chunk].float()
        if temperature != 1.0:  # x / 1.0 == x: no copy for nothing
            chunk = chunk / temperature
        logp = torch.log_softmax(chunk, dim=-1)
        out.append(logp.gather(-1, index[start : start + rows_per_chunk].unsqueeze(-1)).squeeze(-1))
        if return_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropies.append(-(logp.exp() * logp).sum(-1))
    if return_entropy:
        return torch.cat(out, dim=0), torch.cat(entropies, dim=0)
    return torch.cat(out, dim=0)


def kl_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) with the unbiased, non-negative k3 estimator (arXiv 2402.03300, eq. 4; Schulman 2020).

    k3(x) = exp(x) − x − 1 with x = log π_ref − log π_θ, computed in float32. For x above
    `KL_LOG_RATIO_LINEAR_FROM` (= 20) it continues along its tangent, so value and gradient stay finite (and
    positive) even for log-ratios of ±100 in bf16 inputs.

    Args:
        per_token_logps: `(N, L)` policy log-probs (differentiable).
        ref_per_token_logps: `(N, L)` reference log-probs.

    Returns:
        `(N, L)` float32 tensor.
    """
    x = ref_per_token_logps.float() - per_token_logps.float()
    x_clamped = x.clamp(max=KL_LOG_RATIO_LINEAR_FROM)
    # expm1 avoids the cancellation of exp(x) - 1 near x = 0; the clamp removes the last rounding below zero.
    return (torch.expm1(x_clamped) - x + torch.exp(x_clamped) * (x - x_clamped)).clamp(min=0.0)


def importance_weighted_kl(per_token_kl: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """k3 KL multiplied by the importance ratio ρ = π_θ/π_θ_old, for an unbiased reverse-KL gradient.

    Tokens are sampled from π_θ_old, so the k3 estimate of KL(π_θ ‖ π_ref) has to be re-weighted by ρ. On-policy ρ
    equals 1 in value, but ∇(ρ·k3) = ρ·(∇k3 + k3·∇log π_θ), whose expectation under π_θ_old is the exact gradient of
    KL(π_θ ‖ π_ref); the plain ∇k3 is not (DeepSeek-V3.2, arXiv 2512.02556, eq. 7). With sequence-level importance
    sampling the sequence's weight multiplies each of its tokens (then the gradient is no longer exactly unbiased).

    Args:
        per_token_kl: `(N, L)` float32 k3 values from `kl_k3` (differentiable).
        ratio: `(N, L)` or `(N, 1)` differentiable importance weights from `importance_ratio`.

    Returns:
        `(N, L)` float32 tensor.
    """
    return per_token_kl * ratio.float()


def importance_ratio(
    per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """Importance weight ρ of the data under π_θ, per token or per sequence.

    - `"token"`: ρ_t = exp(log π_θ(y_t) − log π_θ_old(y_t)) (PPO, GRPO).
    - `"sequence"`: one length-normalised weight per completion, ρ = exp(mean_t over valid tokens of the log-ratio)
      = (π_θ(y)/π_θ_old(y))^(1/|y|) (GSPO, arXiv 2507.18071, eq. 7).

    Args:
        per_token_logps: `(N, L)` policy log-probs (differentiable).
        old_per_token_logps: `(N, L)` log-probs of the policy that sampled the data.
        mask: `(N, L)` 1 for valid completion tokens.
        level: `"token"` or `"sequence"`.

    Returns:
        `(N, L)` (token) or `(N, 1)` (sequence) float tensor.

    Raises:
        ValueError: for an unknown `level`.
    """
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        mask = mask.to(log_ratio.dtype)
        return torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
    raise ValueError(
        f"Unknown importance sampling level: {level}. importance_sampling_level must be 'token' or 'sequence'."
    )


def per_token_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """`(N, 1)` from one advantage per completion `(N,)`, so it broadcasts over tokens; `(N, L)` per-token advantages
    (which TRL 1.16 also accepts from subclasses) and `(N, 1)` are returned as they are."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-style clipped surrogate, negated to be minimised (arXiv 2402.03300, eq. 3).

    loss = −min(min(ρ, δ)·Â, clip(ρ, 1 − ε_low, 1 + ε_high)·Â). The cap δ on the unclipped branch is the two-sided
    clipping of INTELLECT-2 (arXiv 2505.07291): it bounds the loss of negative-advantage tokens whose ratio has
    grown far above 1 (use δ > 1 + ε_high); `delta=None` is the plain GRPO surrogate.

    Args:
        ratio: `(N, L)` or `(N, 1)` importance weights from `importance_ratio` (differentiable).
        advantages: `(N,)` advantages, or `(N, L)` per token.
        epsilon_low, epsilon_high: clipping ranges.
        delta: optional upper cap of the unclipped ratio.

    Returns:
        `(per_token_loss, is_low_clipped, is_high_clipped)`, all of `ratio`'s shape; the last two are bool masks of
        the weights clipped below (Â < 0) or above (Â > 0), judged on the uncapped ratio.
    """
    adv = per_token_advantages(advantages)
    clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    capped_ratio = ratio if delta is None else ratio.clamp(max=delta)
    per_token_loss = -torch.min(capped_ratio * adv, clipped_ratio * adv)
    is_low_clipped = (ratio < 1.0 - epsilon_low) & (adv < 0)
    is_high_clipped = (ratio > 1.0 + epsilon_high) & (adv > 0)
    return per_token_loss, is_low_clipped, is_high_clipped


def cispo_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, per_token_logps: torch.Tensor, epsilon_high: float
) -> torch.Tensor:
    """CISPO per-token loss (MiniMax-M1, arXiv 2506.13585, eq. 4): −sg(min(ρ, ε_max))·Â·log π_θ.

    The importance weight is clipped (from above only) and detached, so every token keeps a gradient
    −min(ρ, ε_max)·Â·∇log π_θ; only its size is bounded. `epsilon_high` plays ε_max (the paper uses 5).

    Args:
        ratio: `(N, L)` or `(N, 1)` importance weights.
        advantages: `(N,)`, or `(N, L)` per token.
        per_token_logps: `(N, L)` policy log-probs (differentiable).
        epsilon_high: ε_max.

    Returns:
        `(N, L)` float tensor.
    """
    return -ratio.clamp(max=epsilon_high).detach() * per_token_advantages(advantages) * per_token_logps


def sapo_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO per-token loss (Soft Adaptive Policy Optimization, arXiv 2511.20347): −(4/τ)·σ(τ·(ρ − 1))·Â.

    A smooth gate replaces the hard clip: its gradient (4·σ(1 − σ))·Â·∇ρ equals ∇(ρ·Â) at ρ = 1 and fades as ρ
    leaves 1, faster for larger τ. τ is `temperature_pos` where Â > 0 and `temperature_neg` elsewhere.

    Args:
        ratio: `(N, L)` or `(N, 1)` importance weights (differentiable).
        advantages: `(N,)`, or `(N, L)` per token.
        temperature_pos, temperature_neg: τ for positive and for non-positive advantages (> 0).

    Returns:
        Float tensor of `ratio`'s shape.
    """
    adv = per_token_advantages(advantages)
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)
    return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv


VESPO_LOG_WEIGHT_MIN = math.log(1e-8)  # sequence weights below 1e-8 count as 1e-8
VESPO_LOG_WEIGHT_MAX = 20.0


@torch.no_grad()
def vespo_weights(
    advantages: torch.Tensor,
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """VESPO sequence weights φ(w) = e^λ · w^k · e^(−λ·w) (arXiv 2602.10693), with φ(1) = 1; no gradient.

    w = π_θ(y)/π_θ_old(y) is the whole sequence's (un-normalised) ratio: the sum of the per-token log-ratios, each
    clamped to ±20, over valid tokens, then clamped to [log 1e-8, 20]. φ is computed in log space; (k, λ) are
    (`k_pos`, `lambda_pos`) where Â ≥ 0, else (`k_neg`, `lambda_neg`); λ is floored at 1e-4. Overflows count as 0.

    Args:
        advantages: `(N,)`, or `(N, L)` per token (then the weights are `(N, L)`).
        per_token_logps, old_per_token_logps: `(N, L)`.
        mask: `(N, L)` 1 for valid completion tokens.
        k_pos, lambda_pos, k_neg, lambda_neg: the Gamma-shape parameters.
        importance_sampling_ratio: optional `(N, L)` token-level correction π_θ_old/π_sampler (TRL's vLLM
            importance sampling; never set by this trainer): its logs, each clamped to [log 1e-8, 20], are added to
            log w over every position, as TRL 1.16 does.

    Returns:
        `(N, 1)` float tensor.
    """
    log_ratio = (per_token_logps - old_per_token_logps).clamp(-20.0, 20.0)
    log_w = (log_ratio * mask.to(log_ratio.dtype)).sum(-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_is = importance_sampling_ratio.log().clamp(VESPO_LOG_WEIGHT_MIN, VESPO_LOG_WEIGHT_MAX)
        log_w = log_w + log_is.sum(-1, keepdim=True)
    log_w = log_w.clamp(VESPO_LOG_WEIGHT_MIN, VESPO_LOG_WEIGHT_MAX)
    nonneg = per_token_advantages(advantages) >= 0
    k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """Off-policy sequence masking of DeepSeek-V3.2 (arXiv 2512.02556, eq. 9): drop a completion from the policy loss
    when its advantage is negative *and* the sampling policy has drifted from π_θ by more than `threshold`, measured
    as the mean over valid tokens of log π_sampling − log π_θ (a KL(π_sampling ‖ π_θ) estimate; no gradient).

    Args:
        advantages: `(N,)`, `(N, 1)` or `(N, L)`.
        per_token_logps: `(N, L)` policy log-probs.
        sampling_per_token_logps: `(N, L)` log-probs of the policy that sampled the data.
        mask: `(N, L)` 1 for valid completion tokens.
        threshold: δ of eq. 9 (e.g. 0.5).

    Returns:
        `(N, 1)` float tensor of 1 (keep) and 0 (drop).
    """
    mask = mask.to(per_token_logps.dtype)
    drift = torch.nan_to_num(sampling_per_token_logps - per_token_logps.detach(), nan=0.0)
    mean_drift = (drift * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    keep = (per_token_advantages(advantages) >= 0) | (mean_drift <= threshold)
    return keep.to(per_token_logps.dtype)


def high_entropy_mask(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    quantile: float,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Keep only the valid tokens whose entropy is at least the `quantile` quantile (linear interpolation,
    `torch.quantile`) of the entropies of all valid tokens ("Beyond the 80/20 rule", arXiv 2506.01939): with
    `quantile = 1 − ρ` the top-ρ fraction (`top_entropy_quantile = ρ`, as the trainer passes it). Padding never
    counts, nor is kept.

    Args:
        entropies: `(N, L)` float per-token entropies.
        mask: `(N, L)` 1 for valid completion tokens.
        quantile: in [0, 1]; 0 keeps every valid token, 1 only the highest-entropy one(s).
        gather: optional function mapping this process's 1-D tensor of valid entropies to the concatenation over
            all processes (so every process uses the same threshold); identity when `None`.

    Returns:
        `(N, L)` bool tensor.
    """
    valid = mask.bool()
    values = entropies[valid].float()
    if gather is not None:
        values = gather(values)
    if values.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(values, quantile)
    return (entropies >= threshold) & valid


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the clipped surrogate, and clip_ratio metrics
TOKEN_SUM_LOSS_TYPES = ("dapo", "cispo", "vespo")  # token sums over the generation batch's active tokens
# GRPOConfig fields that `per_token_policy_loss` takes as keyword arguments, under the same names.
POLICY_LOSS_FIELDS = (
    "loss_type",
    "importance_sampling_level",
    "epsilon",
    "epsilon_high",
    "delta",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)


class PolicyLoss(NamedTuple):
    """What `per_token_policy_loss` returns.

    - `per_token_loss`: `(N, L)` float policy loss of every token (masks applied, no KL, not yet normalised).
    - `ratio`: `(N, L)` or `(N, 1)` differentiable importance weight ρ (what the KL correction multiplies by).
    - `metrics`: name → float tensor (`(N, L)` or `(N, 1)`) to be averaged over valid tokens and logged.
    """

    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    metrics: dict[str, torch.Tensor]


def per_token_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_mask: torch.Tensor | None = None,
    *,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> PolicyLoss:
    """The policy term of the GRPO loss for every `loss_type`, before normalisation (see `aggregate_loss`).

    ρ comes from `importance_ratio` at `importance_sampling_level`; then, by `loss_type`:
    `"grpo"`, `"bnpo"`, `"dr_grpo"`, `"dapo"`, `"luspo"` use `clipped_surrogate` (with `delta`); `"cispo"` uses
    `cispo_loss` (ε_max = `epsilon_high`); `"sapo"` uses `sapo_loss`; `"vespo"` uses −φ(w)·Â·log π_θ with the
    sequence weights of `vespo_weights`. `token_mask` zeroes tokens: e.g. `high_entropy_mask`, times the `(N, 1)`
    `off_policy_sequence_mask` of the dropped completions. The keyword arguments are the `GRPOConfig` fields of the
    same names (`POLICY_LOSS_FIELDS`).

    Args:
        per_token_logps: `(N, L)` float32 policy log-probs (differentiable).
        old_per_token_logps: `(N, L)` float32 log-probs of the sampling policy (`per_token_logps.detach()`
            on-policy).
        advantages: `(N,)` float advantages, or `(N, L)` per token (e.g. from a subclass, as TRL allows).
        mask: `(N, L)` 1 for valid completion tokens.
        token_mask: optional `(N, L)` or `(N, 1)` bool or 0/1 mask of the tokens that keep their policy loss.

    Returns:
        A `PolicyLoss`.

    Raises:
        ValueError: for an unknown `loss_type` or `importance_sampling_level`.
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio = importance_ratio(per_token_logps, old_per_token_logps, mask, importance_sampling_level)
    adv = per_token_advantages(advantages)
    metrics = {}
    if loss_type in CLIPPED_LOSS_TYPES:
        per_token_loss, low, high = clipped_surrogate(ratio, advantages, epsilon, epsilon_high, delta)
        metrics["clip_ratio/low_mean"] = low.float()
        metrics["clip_ratio/high_mean"] = high.float()
        metrics["clip_ratio/region_mean"] = (low | high).float()
    elif loss_type == "cispo":
        per_token_loss = cispo_loss(ratio, advantages, per_token_logps, epsilon_high)
        metrics["cispo_clip_ratio"] = ((ratio > epsilon_high) & (adv > 0)).float()
    elif loss_type == "sapo":
        per_token_loss = sapo_loss(ratio, advantages, sapo_temperature_pos, sapo_temperature_neg)
    elif loss_type == "vespo":
        gamma = (vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg)
        phi = vespo_weights(advantages, per_token_logps, old_per_token_logps, mask, *gamma)
        per_token_loss = -phi * adv * per_token_logps
        metrics["vespo/phi_seq_mean"] = phi
    else:
        raise ValueError(f"Unknown loss type: {loss_type}. loss_type must be one of {', '.join(LOSS_TYPES)}.")
    if token_mask is not None:
        per_token_loss = per_token_loss * token_mask.to(per_token_loss.dtype)
    return PolicyLoss(per_token_loss.expand(mask.shape), ratio, metrics)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce `(N, L)` per-token losses of one micro-batch to a scalar, as `loss_type` says.

    - `"grpo"` and `"sapo"`: mean over each sequence's tokens, then mean over sequences (arXiv 2402.03300, eq. 3).
    - `"bnpo"`: mean over all tokens of the micro-batch.
    - `"dr_grpo"`: sum / (N · `max_completion_length`) (Dr. GRPO, arXiv 2503.20783).
    - `"dapo"`, `"cispo"` and `"vespo"`: sum / `num_items_in_batch` (DAPO token-level loss, arXiv 2503.14476), where
      the trainer passes the active-token count of the whole generation batch over all processes divided by
      (processes × micro-batches), so that after the trainer's division by the accumulation steps and DDP's average
      the gradient is the token-mean over the generation batch (exactly when `steps_per_generation ==
      gradient_accumulation_steps`, the default; otherwise scaled by their ratio).
    - `"luspo"`: each sequence's token *sum*, then mean over sequences (LUSPO, arXiv 2602.05261: a sequence's loss
      scaled by its length).

    Under gradient accumulation the trainer divides each micro-batch's value by the number of accumulation steps,
    which makes every type but `"bnpo"` equal to the loss of the whole batch at once.

    Raises:
        ValueError: for an unknown `loss_type` or a missing normaliser.
    """
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length.")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type in TOKEN_SUM_LOSS_TYPES:
        if num_items_in_batch is None:
            raise ValueError(f"loss_type={loss_type!r} needs num_items_in_batch.")
        return masked.sum() / torch.as_tensor(num_items_in_batch, dtype=masked.dtype).clamp(min=1.0)
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    raise ValueError(f"Unknown loss type: {loss_type}. loss_type must be one of {', '.join(LOSS_TYPES)}.")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1 (0 when the mask is empty). Shapes must match."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
