# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The GRPO maths as pure tensor functions: rewards → advantages, masks, log-probs, KL, clipped loss, normalisation.

Nothing here knows about a trainer or a model; every function takes tensors and returns tensors. Notation follows
DeepSeekMath (arXiv 2402.03300, eq. 3–4 and Algorithm 1): N = B·G completions (B prompts × G = `num_generations`),
L = completion length in tokens.
"""

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
    # Exact zeros for groups with one valid value or all-equal values (no rounding residue from the mean).
    distinct = r.masked_fill(v == 0, float("inf")).amin(1) != r.masked_fill(v == 0, float("-inf")).amax(1)
    centred = centred * distinct.unsqueeze(1)
    if scale_rewards == "group":
        advantages = centred / (group_std + eps)
    elif scale_rewards == "batch":
        flat = rewards[valid]
        batch_std = flat.std() if flat.numel() > 1 else rewards.new_zeros(())
        advantages = centred / (batch_std + eps)
    elif scale_rewards == "none":
        advantages = centred
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    return advantages.reshape(-1)


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


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, max_chunk_bytes: int = 2**28) -> torch.Tensor:
    """log softmax(logits)[index] per position, computed in float32, in row chunks of at most `max_chunk_bytes` of
    float32 logits (one batched kernel for small batches, bounded memory for large vocabularies).

    Args:
        logits: `(N, L, V)` float tensor (any float dtype).
        index: `(N, L)` int tensor of token ids.
        max_chunk_bytes: memory budget of one chunk's float32 log-probs.

    Returns:
        `(N, L)` float32 tensor of log-probabilities.
    """
    row_bytes = max(1, logits[0].numel() * 4)
    rows_per_chunk = max(1, max_chunk_bytes // row_bytes)
    out = []
    for start in range(0, logits.size(0), rows_per_chunk):
        logp = torch.log_softmax(logits[start : start + rows_per_chunk].float(), dim=-1)
        out.append(logp.gather(-1, index[start : start + rows_per_chunk].unsqueeze(-1)).squeeze(-1))
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


def importance_weighted_kl(
    per_token_kl: torch.Tensor, per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor
) -> torch.Tensor:
    """k3 KL multiplied by the importance ratio ρ = π_θ/π_θ_old, for an unbiased reverse-KL gradient.

    Tokens are sampled from π_θ_old, so the k3 estimate of KL(π_θ ‖ π_ref) has to be re-weighted by ρ. On-policy ρ
    equals 1 in value, but ∇(ρ·k3) = ρ·(∇k3 + k3·∇log π_θ), whose expectation under π_θ_old is the exact gradient of
    KL(π_θ ‖ π_ref); the plain ∇k3 is not (DeepSeek-V3.2, arXiv 2512.02556, eq. 7).

    Args:
        per_token_kl: `(N, L)` float32 k3 values from `kl_k3` (differentiable).
        per_token_logps: `(N, L)` policy log-probs (differentiable).
        old_per_token_logps: `(N, L)` log-probs of the sampling policy.

    Returns:
        `(N, L)` float32 tensor.
    """
    return per_token_kl * torch.exp(per_token_logps.float() - old_per_token_logps.float())


def clipped_surrogate(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-style clipped surrogate per token, negated to be minimised (arXiv 2402.03300, eq. 3).

    loss = −min(ρ·Â, clip(ρ, 1 − ε_low, 1 + ε_high)·Â), ρ = exp(log π_θ − log π_θ_old).

    Args:
        per_token_logps: `(N, L)` policy log-probs (differentiable).
        old_per_token_logps: `(N, L)` log-probs of the policy that sampled the data.
        advantages: `(N,)` advantages.
        epsilon_low, epsilon_high: clipping ranges.

    Returns:
        `(per_token_loss, is_low_clipped, is_high_clipped)`, all `(N, L)`; the last two are bool masks of the
        tokens whose ratio was clipped below (Â < 0) or above (Â > 0).
    """
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    adv = advantages.unsqueeze(1)
    per_token_loss = -torch.min(ratio * adv, clipped_ratio * adv)
    is_low_clipped = (ratio < 1.0 - epsilon_low) & (adv < 0)
    is_high_clipped = (ratio > 1.0 + epsilon_high) & (adv > 0)
    return per_token_loss, is_low_clipped, is_high_clipped


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce `(N, L)` per-token losses of one micro-batch to a scalar, as `loss_type` says.

    - `"grpo"`: mean over each sequence's tokens, then mean over sequences (arXiv 2402.03300, eq. 3).
    - `"bnpo"`: mean over all tokens of the micro-batch.
    - `"dr_grpo"`: sum / (N · `max_completion_length`) (Dr. GRPO, arXiv 2503.20783).
    - `"dapo"`: sum / `num_items_in_batch` (DAPO token-level loss, arXiv 2503.14476), where the trainer passes the
      active-token count of the whole generation batch over all processes divided by (processes × micro-batches),
      so that after the trainer's division by the accumulation steps and DDP's average the gradient is the
      token-mean over the generation batch (exactly when `steps_per_generation == gradient_accumulation_steps`,
      the default; otherwise scaled by their ratio).

    Under gradient accumulation the trainer divides each micro-batch's value by the number of accumulation steps,
    which makes `"grpo"`, `"dr_grpo"` and `"dapo"` equal to the loss of the whole batch at once.

    Raises:
        ValueError: for an unknown `loss_type` or a missing normaliser.
    """
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length.")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        if num_items_in_batch is None:
            raise ValueError("loss_type='dapo' needs num_items_in_batch.")
        return masked.sum() / torch.as_tensor(num_items_in_batch, dtype=masked.dtype).clamp(min=1.0)
    raise ValueError(f"loss_type must be 'grpo', 'bnpo', 'dr_grpo' or 'dapo', got {loss_type!r}.")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1 (0 when the mask is empty). Shapes must match."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
