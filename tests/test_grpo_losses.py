# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The GRPO maths (trl.trainer.grpo_losses) against hand-computed values."""

import math

import pytest
import torch

from trl.trainer.grpo_losses import (
    ADVANTAGE_STD_EPS,
    CLIPPED_LOSS_TYPES,
    KL_LOG_RATIO_LINEAR_FROM,
    LOSS_TYPES,
    aggregate_loss,
    cispo_loss,
    clipped_surrogate,
    completion_mask,
    group_advantages,
    high_entropy_mask,
    importance_ratio,
    importance_weighted_kl,
    kl_k3,
    masked_mean,
    off_policy_sequence_mask,
    pad_to_multiple,
    per_token_policy_loss,
    sapo_loss,
    selective_log_softmax,
    vespo_weights,
)


def exact(values, dtype=torch.float32):
    return torch.tensor(values, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------- group_advantages


def test_group_advantages_binary_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), num_generations=4)
    expected = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-4)  # mean 0.5, sample std sqrt(1/3), eps 1e-4
    assert ADVANTAGE_STD_EPS == 1e-4
    assert expected == pytest.approx(0.866, abs=1e-3)
    torch.testing.assert_close(adv, exact([expected, -expected, expected, -expected]), rtol=1e-6, atol=0)


def test_group_advantages_two_groups_are_independent():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 4.0, 6.0, 8.0]), num_generations=4)
    # Second group: mean 5, centred [-3,-1,1,3], sample std sqrt(20/3).
    s = math.sqrt(20.0 / 3.0) + 1e-4
    e = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-4)
    torch.testing.assert_close(adv, exact([e, -e, e, -e, -3 / s, -1 / s, 1 / s, 3 / s]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("value, group_size", [(0.1, 7), (0.3, 6), (0.01, 6), (0.7, 7)])
def test_group_advantages_zero_std_group_is_exactly_zero(value, group_size):
    rewards = torch.full((group_size,), value)
    # The naive float32 computation leaves a residue here (this is what makes the test meaningful) ...
    naive = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    assert (naive != 0).any()
    # ... the library does not: an all-equal group gets exactly 0, whatever the scaling.
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, group_size, scale_rewards=scale)
        assert torch.equal(adv, torch.zeros(group_size)), scale


def test_group_advantages_invalid_completion_is_left_out():
    nan = float("nan")
    rewards = torch.tensor([1.0, nan, 0.0, 2.0, 5.0, 5.0, nan, 7.0])
    valid = ~torch.isnan(rewards)
    adv = group_advantages(rewards, num_generations=4, valid=valid)
    # Group 1 without the invalid one: [1, 0, 2] → mean 1, centred [0, -1, 1], sample std 1.
    # Group 2 without the invalid one: [5, 5, 7] → mean 17/3, centred [-2/3, -2/3, 4/3], std sqrt((4/9+4/9+16/9)/2).
    s2 = math.sqrt((4 / 9 + 4 / 9 + 16 / 9) / 2) + 1e-4
    expected = [0.0, 0.0, -1 / 1.0001, 1 / 1.0001, -2 / 3 / s2, -2 / 3 / s2, 0.0, 4 / 3 / s2]
    torch.testing.assert_close(adv, exact(expected), rtol=1e-6, atol=1e-7)
    assert adv[1].item() == 0.0 and adv[6].item() == 0.0
    assert adv[0].item() == 0.0  # 1 is exactly the mean of the valid values
    # Same as computing on the group with the invalid completion removed.
    torch.testing.assert_close(adv[[0, 2, 3]], group_advantages(torch.tensor([1.0, 0.0, 2.0]), 3), rtol=0, atol=0)
    torch.testing.assert_close(adv[[4, 5, 7]], group_advantages(torch.tensor([5.0, 5.0, 7.0]), 3), rtol=1e-6, atol=0)


def test_group_advantages_single_valid_or_none_valid_gives_zero():
    rewards = torch.tensor([3.0, 1.0, 2.0, 9.0, 1.0, 2.0])
    valid = torch.tensor([True, False, False, False, False, False])
    assert torch.equal(group_advantages(rewards, 3, valid=valid), torch.zeros(6))


def test_group_advantages_batch_scaling():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 3.0, 3.0, 5.0])
    adv = group_advantages(rewards, num_generations=4, scale_rewards="batch")
    # Batch mean 2, squared deviations 1,4,1,4,1,1,1,9 → sample variance 22/7.
    s = math.sqrt(22 / 7) + 1e-4
    expected = [0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s, -0.5 / s, -0.5 / s, 1.5 / s]
    torch.testing.assert_close(adv, exact(expected), rtol=1e-6, atol=0)


def test_group_advantages_no_scaling():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 3.0, 3.0, 5.0])
    adv = group_advantages(rewards, num_generations=4, scale_rewards="none")
    assert torch.equal(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, -0.5, -0.5, -0.5, 1.5]))


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="5 rewards cannot be split into groups of num_generations=2"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(
        ValueError, match="Invalid value for scale_rewards: std. scale_rewards must be 'group', 'batch' or 'none'"
    ):
        group_advantages(torch.tensor([0.0, 1.0]), 2, scale_rewards="std")


# ---------------------------------------------------------------- completion_mask


@pytest.mark.parametrize(
    ("rewards", "scale_rewards"),
    [
        ([1e20, -1e20, 0.0, 1.0], "group"),  # the variance overflows: every advantage would be 0
        ([3e38, 3e38, 1.0, 0.0], "group"),  # the sum overflows: the advantages would be NaN
        ([3e38, 3e38, 1.0, 0.0], "none"),
        ([3e38, -3e38, -3e38, 0.0], "none"),  # a finite mean, but r − mean overflows
        ([3e38, -3e38, -3e38, 0.0], "batch"),
    ],
)
def test_group_advantages_refuse_rewards_whose_statistics_overflow(rewards, scale_rewards):
    with pytest.raises(ValueError, match=r"too large for their group statistics: their mean or standard deviation"):
        group_advantages(torch.tensor(rewards), 4, scale_rewards)


def test_group_advantages_without_scaling_do_not_need_the_std():
    rewards = torch.tensor([1e20, -1e20, 0.0, 0.0])
    assert torch.equal(group_advantages(rewards, 4, "none"), rewards)  # the mean is 0


def test_completion_mask_pad_equals_eos():
    # Pad == EOS == 0: the mask stops at the *first* EOS, it does not drop every 0.
    assert torch.equal(completion_mask(torch.tensor([[5, 6, 0, 0, 0]]), 0), torch.tensor([[1, 1, 1, 0, 0]]))


def test_completion_mask_cases():
    ids = torch.tensor([[5, 6, 7, 8], [0, 5, 0, 6], [5, 6, 7, 0], [3, 3, 3, 3]])
    expected = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    mask = completion_mask(ids, 0)
    assert mask.dtype == torch.long
    assert torch.equal(mask, expected)


def test_completion_mask_list_of_eos_ids():
    ids = torch.tensor([[5, 9, 1, 1], [5, 6, 2, 9], [4, 4, 4, 4]])
    assert torch.equal(completion_mask(ids, [2, 9]), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]))


# ---------------------------------------------------------------- selective_log_softmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_log_softmax_matches_log_softmax_gather(dtype):
    logits = (torch.randn(3, 5, 11) * 4).to(dtype)
    index = torch.randint(0, 11, (3, 5))
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    out = selective_log_softmax(logits, index)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    assert torch.equal(out, expected)
    # Chunked (one row of 5 × 11 float32 = 220 bytes per chunk) gives the same values.
    assert torch.equal(selective_log_softmax(logits, index, max_chunk_bytes=220), expected)


# ---------------------------------------------------------------- kl_k3


def test_kl_k3_moderate_values():
    x = torch.linspace(-5.0, 5.0, 101, dtype=torch.float64)  # x = log π_ref − log π_θ
    logp = torch.zeros(1, 101)
    kl = kl_k3(logp, x.float().unsqueeze(0))
    torch.testing.assert_close(kl.double(), (torch.exp(x) - x - 1).unsqueeze(0), rtol=1e-5, atol=1e-6)


def test_kl_k3_zero_when_equal():
    logp = torch.randn(4, 6) - 3
    assert torch.equal(kl_k3(logp, logp.clone()), torch.zeros(4, 6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kl_k3_finite_value_and_gradient_at_extreme_log_ratios(dtype):
    logp = torch.zeros(1, 2, dtype=dtype, requires_grad=True)
    ref = torch.tensor([[100.0, -100.0]], dtype=dtype)  # x = +100 and −100
    kl = kl_k3(logp, ref)
    kl.sum().backward()
    assert kl.dtype == torch.float32
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
    c = KL_LOG_RATIO_LINEAR_FROM
    # x = 100: tangent continuation e^c (1 + x − c) − x − 1; x = −100: e^−100 + 100 − 1 = 99.
    torch.testing.assert_close(kl, torch.tensor([[math.exp(c) * (1 + 100 - c) - 101, 99.0]]), rtol=1e-6, atol=0)
    # d kl / d logp = −(d k3/dx) = −(e^min(x, c) − 1).
    expected_grad = torch.tensor([[-(math.exp(c) - 1), 1.0]]).to(dtype)
    torch.testing.assert_close(logp.grad, expected_grad, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=0)


def _expected_kl_gradient(theta, ref_logp, bias_correction):
    """Σ_y π_old(y) ∇θ[estimator(y)] at θ = θ_old: the exact expectation of the per-token KL term's gradient when
    the token y is sampled from π_old over a small vocabulary."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, dim=-1)  # log π_θ(y) for every y: (V,)
    old_logp = logp.detach()
    per_token = kl_k3(logp.unsqueeze(0), ref_logp.unsqueeze(0))
    if bias_correction:
        ratio = importance_ratio(logp.unsqueeze(0), old_logp.unsqueeze(0), torch.ones(1, logp.numel()))
        per_token = importance_weighted_kl(per_token, ratio)
    (old_logp.exp() * per_token.squeeze(0)).sum().backward()
    return theta.grad


def test_importance_weighted_kl_gradient_is_the_reverse_kl_gradient():
    torch.manual_seed(0)
    theta, ref_logp = torch.randn(6, dtype=torch.float64), torch.log_softmax(torch.randn(6, dtype=torch.float64), -1)
    # Analytic: KL(π_θ ‖ π_ref) = Σ π_θ (log π_θ − log π_ref); its gradient by autograd.
    exact_theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(exact_theta, -1)
    (logp.exp() * (logp - ref_logp)).sum().backward()
    corrected = _expected_kl_gradient(theta.float(), ref_logp.float(), bias_correction=True)
    plain = _expected_kl_gradient(theta.float(), ref_logp.float(), bias_correction=False)
    torch.testing.assert_close(corrected.double(), exact_theta.grad, rtol=1e-5, atol=1e-6)
    # The plain k3 gradient points elsewhere (its expectation is ∇ of a different function).
    assert (plain.double() - exact_theta.grad).abs().max() > 0.05


def test_importance_weighted_kl_value_is_unchanged_on_policy():
    logp, ref = torch.randn(3, 5) - 2, torch.randn(3, 5) - 2
    kl = kl_k3(logp, ref)
    mask = torch.ones(3, 5)
    assert torch.equal(importance_weighted_kl(kl, importance_ratio(logp, logp.clone(), mask)), kl)
    old = logp - 0.5  # ρ = e^0.5 everywhere
    torch.testing.assert_close(importance_weighted_kl(kl, importance_ratio(logp, old, mask)), kl * math.exp(0.5))


def test_kl_k3_is_continuous_at_the_linear_switch():
    c = KL_LOG_RATIO_LINEAR_FROM
    x = torch.tensor([[c - 1e-3, c, c + 1e-3]], dtype=torch.float32)
    kl = kl_k3(torch.zeros_like(x), x)
    exact_values = torch.exp(x.double()) - x.double() - 1
    torch.testing.assert_close(kl.double(), exact_values, rtol=1e-5, atol=0)


def test_kl_k3_non_negative_on_a_wide_grid():
    x = torch.cat([torch.linspace(-100.0, 100.0, 20001), torch.tensor([0.0, 1e-7, -1e-7])])
    kl = kl_k3(torch.zeros_like(x), x)
    assert torch.isfinite(kl).all()
    assert (kl >= 0).all()


def test_kl_k3_non_negative_for_small_log_ratios():
    x = torch.logspace(-10, -1, 20000)
    x = torch.cat([x, -x])
    kl = kl_k3(torch.zeros_like(x), x)
    assert (kl >= 0).all(), f"min {kl.min().item():.3g}, {(kl < 0).sum().item()} negative values"


# ---------------------------------------------------------------- clipped_surrogate


def test_clipped_surrogate_by_hand():
    ratios = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1, 1.1])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, -2.0])
    logp = torch.log(ratios).view(6, 1).requires_grad_(True)
    old = torch.zeros(6, 1)
    ratio = importance_ratio(logp, old, torch.ones(6, 1))
    loss, low, high = clipped_surrogate(ratio, advantages, epsilon_low=0.2, epsilon_high=0.2)
    # −min(ρA, clip(ρ, 0.8, 1.2)A):
    #  ρ=1.5,A=+1 → −1.2 (clipped high); ρ=1.5,A=−1 → +1.5; ρ=0.5,A=+1 → −0.5; ρ=0.5,A=−1 → +0.8 (clipped low);
    #  ρ=1.1,A=±2 → ∓2.2.
    torch.testing.assert_close(loss.squeeze(1), torch.tensor([-1.2, 1.5, -0.5, 0.8, -2.2, 2.2]), rtol=1e-6, atol=1e-6)
    assert torch.equal(high.squeeze(1), torch.tensor([True, False, False, False, False, False]))
    assert torch.equal(low.squeeze(1), torch.tensor([False, False, False, True, False, False]))
    loss.sum().backward()
    # d(−ρA)/d log π = −ρA where not clipped; 0 where the clipped branch is active.
    torch.testing.assert_close(
        logp.grad.squeeze(1), torch.tensor([0.0, 1.5, -0.5, 0.0, -2.2, 2.2]), rtol=1e-6, atol=1e-6
    )


def test_clipped_surrogate_asymmetric_clip_higher():
    ratio = torch.tensor([[1.25, 1.3]])
    loss, low, high = clipped_surrogate(ratio, torch.tensor([1.0]), epsilon_low=0.2, epsilon_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, -1.28]]), rtol=1e-6, atol=0)
    assert torch.equal(high, torch.tensor([[False, True]]))
    assert not low.any()


def test_clipped_surrogate_on_policy_is_minus_advantage():
    logp = torch.randn(3, 4)
    adv = torch.tensor([0.5, -1.0, 2.0])
    loss, low, high = clipped_surrogate(importance_ratio(logp, logp.detach(), torch.ones(3, 4)), adv, 0.2, 0.2)
    assert torch.equal(loss, -adv.unsqueeze(1).expand(3, 4))
    assert not low.any() and not high.any()


# ---------------------------------------------------------------- aggregate_loss


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])


def test_aggregate_loss_grpo():
    # Row means (1+2)/2 = 1.5 and (5+6+7)/3 = 6 → 3.75.
    assert aggregate_loss(PER_TOKEN, MASK, "grpo").item() == 3.75


def test_aggregate_loss_bnpo():
    assert aggregate_loss(PER_TOKEN, MASK, "bnpo").item() == pytest.approx(21 / 5, rel=1e-7)


def test_aggregate_loss_dr_grpo():
    assert aggregate_loss(PER_TOKEN, MASK, "dr_grpo", max_completion_length=4).item() == 21 / 8
    assert aggregate_loss(PER_TOKEN, MASK, "dr_grpo", max_completion_length=16).item() == 21 / 32


def test_aggregate_loss_dapo():
    # Masked sum 21 over 10 tokens of the whole generation batch.
    assert aggregate_loss(PER_TOKEN, MASK, "dapo", num_items_in_batch=10).item() == pytest.approx(2.1, rel=1e-7)
    torch.testing.assert_close(
        aggregate_loss(PER_TOKEN, MASK, "dapo", num_items_in_batch=torch.tensor(10.0)), torch.tensor(2.1)
    )


def test_aggregate_loss_empty_mask_is_zero():
    mask = torch.zeros(2, 4, dtype=torch.long)
    for loss_type in ("grpo", "bnpo"):
        assert aggregate_loss(PER_TOKEN, mask, loss_type).item() == 0.0


def test_aggregate_loss_errors():
    with pytest.raises(
        ValueError,
        match="Unknown loss type: sum. loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo",
    ):
        aggregate_loss(PER_TOKEN, MASK, "sum")
    with pytest.raises(ValueError, match="dr_grpo' needs max_completion_length"):
        aggregate_loss(PER_TOKEN, MASK, "dr_grpo")
    with pytest.raises(ValueError, match="dapo' needs num_items_in_batch"):
        aggregate_loss(PER_TOKEN, MASK, "dapo")


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_gradient_accumulation_equivalence(loss_type):
    """Two micro-batches, each divided by the 2 accumulation steps, add up to the loss of the whole batch."""
    per_token = torch.randn(4, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    total_tokens = mask.sum().item()  # 15
    kwargs = dict(max_completion_length=6)
    whole = aggregate_loss(per_token, mask, loss_type, num_items_in_batch=total_tokens, **kwargs)
    # The trainer passes num_items = total tokens / (processes × micro-batches) to each micro-batch.
    micro = [
        aggregate_loss(per_token[i : i + 2], mask[i : i + 2], loss_type, num_items_in_batch=total_tokens / 2, **kwargs)
        for i in (0, 2)
    ]
    torch.testing.assert_close(micro[0] / 2 + micro[1] / 2, whole, rtol=1e-12, atol=0)


def test_bnpo_is_not_accumulation_invariant():
    """Documented behaviour: bnpo normalises per micro-batch, so unequal token counts break the equivalence."""
    per_token = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    whole = aggregate_loss(per_token, mask, "bnpo")  # 6/4 = 1.5
    split = (
        aggregate_loss(per_token[:1], mask[:1], "bnpo") / 2 + aggregate_loss(per_token[1:], mask[1:], "bnpo") / 2
    )  # (1+3)/2
    assert whole.item() == 1.5 and split.item() == 2.0


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == 2.0
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------- pad_to_multiple


def test_pad_to_multiple():
    ids = torch.tensor([[5, 6, 7], [8, 9, 1]])
    assert torch.equal(pad_to_multiple(ids, 4, 0, side="left"), torch.tensor([[0, 5, 6, 7], [0, 8, 9, 1]]))
    assert torch.equal(pad_to_multiple(ids, 2, -1), torch.tensor([[5, 6, 7, -1], [8, 9, 1, -1]]))
    assert pad_to_multiple(ids, 3, 0) is ids and pad_to_multiple(ids, None, 0) is ids


# ---------------------------------------------------------------- entropy (selective_log_softmax)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_log_softmax_entropy_value_and_gradient(dtype):
    logits = (torch.randn(3, 5, 11) * 3).to(dtype).requires_grad_(True)
    index = torch.randint(0, 11, (3, 5))
    logps, entropy = selective_log_softmax(logits, index, return_entropy=True)
    reference = torch.distributions.Categorical(logits=logits.detach().float().requires_grad_(True))
    assert entropy.dtype == torch.float32 and entropy.shape == (3, 5)
    torch.testing.assert_close(entropy, reference.entropy(), rtol=1e-5, atol=1e-6)
    assert torch.equal(logps, selective_log_softmax(logits, index))
    # Chunked: same values.
    chunked = selective_log_softmax(logits, index, max_chunk_bytes=220, return_entropy=True)
    assert torch.equal(chunked[1], entropy)
    # Gradient of H = −Σ p log p with respect to the logits: −p (log p + H).
    entropy.sum().backward()
    p = torch.softmax(logits.detach().float(), -1)
    expected = -p * (torch.log_softmax(logits.detach().float(), -1) + entropy.detach().unsqueeze(-1))
    torch.testing.assert_close(
        logits.grad.float(), expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6
    )


def test_uniform_distribution_entropy_is_log_vocab():
    _, entropy = selective_log_softmax(torch.zeros(1, 2, 8), torch.zeros(1, 2, dtype=torch.long), return_entropy=True)
    torch.testing.assert_close(entropy, torch.full((1, 2), math.log(8.0)))


# ---------------------------------------------------------------- importance_ratio


def test_importance_ratio_token_and_sequence_value_and_gradient():
    logp = torch.tensor([[0.2, 0.4, 9.9], [0.1, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    token = importance_ratio(logp, old, mask, "token")
    torch.testing.assert_close(token, torch.exp(logp.detach()))
    sequence = importance_ratio(logp, old, mask, "sequence")
    # Mean log-ratio over valid tokens: (0.2 + 0.4)/2 = 0.3 and 0.1; padding (9.9) never counts.
    assert sequence.shape == (2, 1)
    torch.testing.assert_close(sequence, torch.tensor([[math.exp(0.3)], [math.exp(0.1)]]))
    sequence.sum().backward()
    # d exp(mean)/d log π_t = exp(mean) / |o| on valid tokens, 0 on padding.
    expected = torch.tensor([[math.exp(0.3) / 2, math.exp(0.3) / 2, 0.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    with pytest.raises(
        ValueError,
        match="Unknown importance sampling level: seq. importance_sampling_level must be 'token' or 'sequence'",
    ):
        importance_ratio(logp, old, mask, "seq")


def test_importance_weighted_kl_broadcasts_a_sequence_ratio():
    kl = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(
        importance_weighted_kl(kl, torch.tensor([[2.0], [0.5]])), torch.tensor([[2.0, 4.0], [1.5, 2.0]])
    )


# ---------------------------------------------------------------- delta, cispo, sapo, vespo


def test_clipped_surrogate_two_sided_delta():
    ratio = torch.tensor([[3.0, 1.5, 3.0]], requires_grad=True)
    adv = torch.tensor([-1.0])
    plain, _, _ = clipped_surrogate(ratio, adv, 0.2, 0.2)
    loss, low, high = clipped_surrogate(ratio, adv, 0.2, 0.2, delta=2.0)
    # Â < 0: −min(min(ρ, δ)·Â, clip(ρ)·Â) = min(ρ, δ) when ρ > 1.2: 3 → 2 (capped), 1.5 → 1.5.
    torch.testing.assert_close(plain, torch.tensor([[3.0, 1.5, 3.0]]))
    torch.testing.assert_close(loss, torch.tensor([[2.0, 1.5, 2.0]]))
    assert not low.any() and not high.any()
    loss.sum().backward()
    torch.testing.assert_close(ratio.grad, torch.tensor([[0.0, 1.0, 0.0]]))  # capped tokens carry no gradient


def test_cispo_loss_value_and_gradient():
    logp = torch.log(torch.tensor([[0.5, 3.0, 6.0]])).requires_grad_(True)
    ratio = importance_ratio(logp, torch.zeros(1, 3), torch.ones(1, 3))
    loss = cispo_loss(ratio, torch.tensor([2.0]), logp, epsilon_high=5.0)
    weights = torch.tensor([[0.5, 3.0, 5.0]])  # min(ρ, 5)
    torch.testing.assert_close(loss, -weights * 2.0 * logp.detach())
    loss.sum().backward()
    # The weight is detached: the gradient is −min(ρ, ε_max)·Â, also where ρ is clipped (unlike PPO's clip).
    torch.testing.assert_close(logp.grad, -weights * 2.0)


def test_sapo_loss_value_and_gradient():
    ratio = torch.tensor([[1.5, 1.0], [1.5, 1.0]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss = sapo_loss(ratio, adv, temperature_pos=1.0, temperature_neg=1.05)
    s_pos, s_neg = 1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(-1.05 * 0.5))
    expected = torch.tensor([[-4 * s_pos * 2.0, -2.0 * 2.0], [4 / 1.05 * s_neg, 2 / 1.05]])
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    # d/dρ = −4·σ(1 − σ)·Â: at ρ = 1 it is −Â, the unclipped surrogate's gradient.
    expected_grad = torch.tensor([[-4 * s_pos * (1 - s_pos) * 2.0, -2.0], [4 * s_neg * (1 - s_neg), 1.0]])
    torch.testing.assert_close(ratio.grad, expected_grad)


def test_vespo_weights_by_hand():
    logp = torch.tensor([[0.1, 0.2, 5.0], [0.1, 0.2, 5.0], [0.0, 0.0, 0.0], [30.0, 30.0, 0.0]])
    old = torch.zeros(4, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0, 0.0, 1.0])
    phi = vespo_weights(adv, logp, old, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    w = math.exp(0.3)  # the sum (not the mean) of the valid log-ratios
    expected = [
        math.exp(3 + 2 * 0.3 - 3 * w),
        math.exp(2 + 3 * 0.3 - 2 * w),
        1.0,  # φ(1) = 1
        0.0,  # log w clamped to 20: e^(3 + 40 − 3e^20) underflows to 0
    ]
    torch.testing.assert_close(phi, torch.tensor(expected).unsqueeze(1), rtol=1e-5, atol=0)
    assert not phi.requires_grad


def test_vespo_policy_loss_gradient_is_phi_times_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.1]])
    out = per_token_policy_loss(logp, old, torch.tensor([0.5]), torch.ones(1, 2), loss_type="vespo")
    phi = math.exp(3 + 2 * 0.2 - 3 * math.exp(0.2))
    torch.testing.assert_close(out.metrics["vespo/phi_seq_mean"], torch.tensor([[phi]]))
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -phi * 0.5))


# ---------------------------------------------------------------- masks


def test_off_policy_sequence_mask_by_hand():
    logp = torch.zeros(4, 3)
    # mean over valid tokens of log π_old − log π_θ: 0.6, 0.4, 2.0, 0.6 (the padded 50.0 never counts)
    old = torch.tensor([[0.6, 0.6, 50.0], [0.4, 0.4, 50.0], [2.0, 2.0, 2.0], [1.2, 0.0, 50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([-1.0, -1.0, 1.0, 0.0])
    keep = off_policy_sequence_mask(adv, logp, old, mask, threshold=0.5)
    # drop only: negative advantage AND drift > 0.5
    assert torch.equal(keep, torch.tensor([[0.0], [1.0], [1.0], [1.0]]))


def test_high_entropy_mask_by_hand():
    entropies = torch.tensor([[0.1, 0.5, 0.9, 100.0], [0.3, 0.7, 50.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # valid: 0.1 0.3 0.5 0.7 0.9; 0.6-quantile (linear) = 0.5 + 0.4·0.2 = 0.58 → keep 0.9 and 0.7, never padding
    kept = high_entropy_mask(entropies, mask, quantile=1 - 0.4)
    assert torch.equal(kept, torch.tensor([[False, False, True, False], [False, True, False, False]]))
    assert torch.equal(high_entropy_mask(entropies, mask, 0.0), mask.bool())
    assert torch.equal(high_entropy_mask(entropies, mask, 1.0), entropies == 0.9)
    # Other processes' low-entropy tokens lower the threshold: with three 0.0s added, the 0.6-quantile of the 8 values
    # (position 4.2 of 0 0 0 0.1 0.3 0.5 0.7 0.9) is 0.34, so 0.5 is kept too.
    others = lambda x: torch.cat([x, torch.zeros(3)])  # noqa: E731
    with_others = high_entropy_mask(entropies, mask, 1 - 0.4, gather=others)
    assert torch.equal(with_others, torch.tensor([[False, True, True, False], [False, True, False, False]]))
    assert not high_entropy_mask(entropies, torch.zeros_like(mask), 1 - 0.4).any()


# ---------------------------------------------------------------- per_token_policy_loss


def test_policy_loss_dispatch_matches_the_formulas():
    torch.manual_seed(0)
    logp, old = torch.randn(4, 5) - 1, torch.randn(4, 5) - 1
    adv, mask = torch.tensor([1.0, -0.5, 0.0, 2.0]), torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 5, [1] + [0] * 4])
    ratio = torch.exp(logp - old)
    for loss_type in CLIPPED_LOSS_TYPES:
        out = per_token_policy_loss(logp, old, adv, mask, loss_type=loss_type, epsilon=0.2, epsilon_high=0.28)
        expected, low, high = clipped_surrogate(ratio, adv, 0.2, 0.28)
        assert torch.equal(out.per_token_loss, expected) and torch.equal(out.ratio, ratio)
        assert torch.equal(out.metrics["clip_ratio/region_mean"], (low | high).float())
    cispo = per_token_policy_loss(logp, old, adv, mask, loss_type="cispo", epsilon_high=4.0)
    assert torch.equal(cispo.per_token_loss, cispo_loss(ratio, adv, logp, 4.0))
    assert torch.equal(cispo.metrics["cispo_clip_ratio"], ((ratio > 4.0) & (adv.unsqueeze(1) > 0)).float())
    sapo = per_token_policy_loss(logp, old, adv, mask, loss_type="sapo", sapo_temperature_pos=2.0)
    assert torch.equal(sapo.per_token_loss, sapo_loss(ratio, adv, 2.0, 1.05)) and sapo.metrics == {}
    with pytest.raises(
        ValueError,
        match="Unknown loss type: ppo. loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo",
    ):
        per_token_policy_loss(logp, old, adv, mask, loss_type="ppo")


def test_gspo_sequence_level_gradient():
    """GSPO (loss_type='grpo', sequence level), unclipped: the loss is −mean_i ρ_i·Â_i, so
    d/d log π_{i,t} = −ρ_i·Â_i / (N·|o_i|) on valid tokens."""
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.05, -0.95, -1.0], [-2.0, -2.1, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    out = per_token_policy_loss(logp, old, adv, mask, loss_type="grpo", importance_sampling_level="sequence")
    rho = torch.tensor([1.0, math.exp(0.05)])  # exp(mean log-ratio): 0 and 0.1/2
    assert out.ratio.shape == (2, 1) and out.per_token_loss.shape == (2, 3)
    torch.testing.assert_close(out.ratio.squeeze(1), rho)
    loss = aggregate_loss(out.per_token_loss, mask, "grpo")
    torch.testing.assert_close(loss, -(rho * adv).mean())
    loss.backward()
    expected = torch.tensor([[-1 / 6, -1 / 6, -1 / 6], [rho[1] * 2 / 4, rho[1] * 2 / 4, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def test_policy_loss_masks():
    logp = torch.zeros(2, 2, requires_grad=True)
    old = torch.tensor([[1.0, 1.0], [1.0, 1.0]])  # drift log π_old − log π_θ = 1 for both sequences
    adv = torch.tensor([-1.0, 1.0])
    token_mask = torch.tensor([[True, True], [True, False]])
    token_mask = token_mask * off_policy_sequence_mask(adv, logp, old, torch.ones(2, 2), threshold=0.5)
    out = per_token_policy_loss(logp, old, adv, torch.ones(2, 2), token_mask, loss_type="grpo")
    # Sequence 0 (Â < 0, drift 1 > 0.5) is dropped, sequence 1 (Â > 0) kept; the token mask drops token (1, 1).
    # ρ = e^−1 and Â = +1: −min(ρ, clip(ρ, 0.8, 1.2)) = −e^−1.
    r = math.exp(-1.0)
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[0.0, 0.0], [-r, 0.0]]))
    out.per_token_loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [-r, 0.0]]))


def test_aggregate_loss_new_types():
    assert aggregate_loss(PER_TOKEN, MASK, "sapo").item() == aggregate_loss(PER_TOKEN, MASK, "grpo").item()
    for loss_type in ("cispo", "vespo"):
        assert aggregate_loss(PER_TOKEN, MASK, loss_type, num_items_in_batch=10).item() == pytest.approx(2.1, rel=1e-7)
    # luspo: per-sequence sums 3 and 18, mean 10.5
    assert aggregate_loss(PER_TOKEN, MASK, "luspo").item() == 10.5
    with pytest.raises(ValueError, match="loss_type='cispo' needs num_items_in_batch"):
        aggregate_loss(PER_TOKEN, MASK, "cispo")


def test_entropy_without_gradient_keeps_the_log_prob_gradient():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    index = torch.randint(0, 7, (2, 3))
    logps, entropy = selective_log_softmax(logits, index, return_entropy=True, entropy_grad=False)
    assert logps.requires_grad and not entropy.requires_grad
    assert torch.equal(entropy, selective_log_softmax(logits, index, return_entropy=True)[1].detach())


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_per_token_advantages_equal_broadcast_sequence_advantages(loss_type):
    """A subclass may give `(N, L)` advantages (TRL 1.16 allows it): one value repeated over a row's tokens is the
    `(N,)` case exactly."""
    torch.manual_seed(0)
    logp = -torch.rand(3, 4)
    old = logp + 0.1 * torch.randn(3, 4)
    adv = torch.tensor([1.0, -0.5, 0.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    kwargs = dict(loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None)
    by_sequence = per_token_policy_loss(logp, old, adv, mask, **kwargs)
    by_token = per_token_policy_loss(logp, old, adv.unsqueeze(1).expand(3, 4), mask, **kwargs)
    assert torch.equal(by_sequence.per_token_loss, by_token.per_token_loss)
