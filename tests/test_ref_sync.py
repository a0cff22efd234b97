# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reference syncing (trl.reference.ref_sync): ref ← round(fp32 lerp(ref, policy, α)); α = 1 copies bits; the pairing
of the two models' tensors; the reference a policy gets. Multi-process layouts: tests/test_distributed.py."""

import warnings

import pytest
import torch
from torch import nn
from transformers import Qwen2ForCausalLM

from trl import sync_reference_model
from trl.models.tiny import build_tokenizer, tiny_qwen2_config
from trl.reference.layouts import tensor_layout
from trl.reference.ref_sync import REFERENCE_ADAPTER, ReferenceSync, make_reference, mix_tensors_, pair_for_sync


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def make_qwen(tokenizer, seed, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_qwen2_config(tokenizer, **overrides)).to(dtype)


def float_tensors(model):
    out = {name: p.detach().clone() for name, p in model.named_parameters()}
    out.update({name: b.clone() for name, b in model.named_buffers() if b.is_floating_point()})
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alpha_one_is_a_bitwise_copy(tokenizer, dtype):
    policy, reference = make_qwen(tokenizer, 1, dtype), make_qwen(tokenizer, 2, dtype)
    before = float_tensors(reference)
    sync_reference_model(policy, reference, alpha=1.0)
    pol, ref = float_tensors(policy), float_tensors(reference)
    assert pol.keys() == ref.keys() and len(ref) > 10
    differed = 0
    for name in pol:
        assert ref[name].dtype == dtype or not ref[name].is_floating_point()
        assert torch.equal(ref[name], pol[name]), name
        differed += not torch.equal(before[name], pol[name])
    assert differed >= 10  # the models really were different before the sync


def test_soft_update_fp32_matches_float64_formula(tokenizer):
    alpha = 0.6
    policy, reference = make_qwen(tokenizer, 1), make_qwen(tokenizer, 2)
    pol0, ref0 = float_tensors(policy), float_tensors(reference)
    sync_reference_model(policy, reference, alpha)
    ref1 = float_tensors(reference)
    for name in ref0:
        expected = (1 - alpha) * ref0[name].double() + alpha * pol0[name].double()
        torch.testing.assert_close(ref1[name].double(), expected, rtol=0, atol=1e-6, msg=name)
        assert torch.equal(float_tensors(policy)[name], pol0[name])  # the policy is never touched


def test_soft_update_bf16_rounds_once_from_fp32(tokenizer):
    alpha = 0.01
    policy, reference = make_qwen(tokenizer, 1, torch.bfloat16), make_qwen(tokenizer, 2, torch.bfloat16)
    pol0, ref0 = float_tensors(policy), float_tensors(reference)
    sync_reference_model(policy, reference, alpha)
    ref1 = float_tensors(reference)
    changed = total = naive_mismatch = 0
    for name in ref0:
        expected = ref0[name].float().lerp(pol0[name].float(), alpha).bfloat16()
        assert torch.equal(ref1[name], expected), name
        changed += (ref1[name] != ref0[name]).sum().item()
        total += ref0[name].numel()
        # A naive in-place bf16 update rounds twice (after mul_, after add_) and lands elsewhere.
        naive = ref0[name].clone().mul_(1 - alpha).add_(pol0[name], alpha=alpha)
        naive_mismatch += (naive != expected).sum().item()
    # With independent inits the step α·(pol − ref) ≈ 3e-4 exceeds half a bf16 ulp of most weights: not lost.
    assert changed > 0.3 * total, (changed, total)
    assert naive_mismatch > 0.05 * total, (naive_mismatch, total)


def test_soft_update_mixed_dtypes_rounds_once(tokenizer):
    """fp32 policy (e.g. master weights), bf16 reference: mix in fp32, round once to bf16, all pairs local."""
    policy, reference = make_qwen(tokenizer, 1), make_qwen(tokenizer, 2, torch.bfloat16)
    pol0, ref0 = float_tensors(policy), float_tensors(reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same partitioning despite the dtypes: no gather-fallback warning
        sync_reference_model(policy, reference, 0.3)
    for name, value in float_tensors(reference).items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, ref0[name].float().lerp(pol0[name], 0.3).bfloat16()), name
    sync_reference_model(policy, reference, 1.0)
    for name, value in float_tensors(reference).items():
        assert torch.equal(value, pol0[name].bfloat16()), name


class WithBuffers(nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.linear = nn.Linear(3, 4)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(4, 3, generator=g))
            self.linear.bias.copy_(torch.randn(4, generator=g))
        self.register_buffer("running_mean", torch.randn(4, generator=g))
        self.register_buffer("count", torch.tensor([seed, seed + 1], dtype=torch.long))


def test_floating_buffers_synced_integer_buffers_untouched():
    policy, reference = WithBuffers(1), WithBuffers(2)
    sync_reference_model(policy, reference, 0.25)
    expected = (0.75 * WithBuffers(2).running_mean.double() + 0.25 * policy.running_mean.double()).float()
    torch.testing.assert_close(reference.running_mean, expected, rtol=0, atol=1e-6)
    assert torch.equal(reference.count, torch.tensor([2, 3]))
    sync_reference_model(policy, reference, 1.0)
    assert torch.equal(reference.running_mean, policy.running_mean)
    assert torch.equal(reference.linear.weight, policy.linear.weight)
    assert torch.equal(reference.count, torch.tensor([2, 3]))


class WithDerivedBuffer(WithBuffers):
    def __init__(self, seed):
        super().__init__(seed)
        self.register_buffer("derived", torch.full((4,), float(seed)), persistent=False)


def test_non_persistent_buffers_are_left_to_their_model():
    policy, reference = WithDerivedBuffer(1), WithDerivedBuffer(2)
    pol, ref = pair_for_sync(policy, reference).local_parts()
    assert len(pol) == len(ref) == 3  # weight, bias, running_mean: not the derived buffer
    sync_reference_model(policy, reference, 0.5)
    assert torch.equal(reference.derived, torch.full((4,), 2.0))  # not a lerp of the two models' derived values
    sync_reference_model(policy, reference, 1.0)
    assert torch.equal(reference.derived, torch.full((4,), 2.0))
    assert torch.equal(reference.running_mean, policy.running_mean)


def test_dynamic_ntk_policy_with_aliased_frequencies_syncs(tokenizer):
    """Dynamic-NTK RoPE re-points `inv_freq` at `original_inv_freq` after a long then a short input: the policy then
    lists one buffer less than the reference; a sync mixes the weights and leaves both frequency sets alone."""
    rope = {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}
    policy = make_qwen(tokenizer, 1, max_position_embeddings=8, rope_parameters=rope)
    reference = make_qwen(tokenizer, 2, max_position_embeddings=8, rope_parameters=rope)
    frequencies = reference.model.rotary_emb.inv_freq.clone()
    with torch.no_grad():
        policy(torch.randint(5, 50, (1, 20)))  # longer than max_position_embeddings: frequencies rescaled
        policy(torch.randint(5, 50, (1, 4)))  # short again: reset, `inv_freq` aliases `original_inv_freq`
    rotary = policy.model.rotary_emb
    assert rotary.inv_freq is rotary.original_inv_freq  # the aliasing that made the sync raise
    sync_reference_model(policy, reference, 0.5)
    sync_reference_model(policy, reference, 1.0)
    for name, parameter in policy.named_parameters():
        assert torch.equal(reference.get_parameter(name), parameter), name
    assert torch.equal(reference.model.rotary_emb.inv_freq, frequencies)


def _pair_of_mlps(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    policy = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    reference = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    return policy, reference


def test_plain_pairing_is_all_local_and_exact():
    policy, reference = _pair_of_mlps()
    before = {n: t.clone() for n, t in reference.state_dict().items()}
    plan = pair_for_sync(policy, reference)
    assert isinstance(plan, ReferenceSync) and plan.fallback == [] and len(plan.local) == 6
    assert {tensor_layout(p) for _, p, _ in plan.local} == {"plain"}
    plan(0.6)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, torch.lerp(before[name], policy.state_dict()[name], 0.6))


def test_local_parts_follow_storage_reassigned_after_pairing():
    policy, reference = _pair_of_mlps()
    plan = pair_for_sync(policy, reference)
    reference[0].weight.data = torch.zeros(8, 4)  # an engine re-pointing storage after pairing
    plan(1.0)
    assert torch.equal(reference[0].weight, policy[0].weight)


def test_pairs_align_by_name():
    policy, reference = WithBuffers(1), WithBuffers(2)
    pol, ref = pair_for_sync(policy, reference).local_parts()
    assert len(pol) == len(ref) == 3  # weight, bias, running_mean (not the integer buffer)
    assert all(
        p.data_ptr() == q.data_ptr()
        for p, q in zip(pol, [policy.linear.weight, policy.linear.bias, policy.running_mean])
    )
    assert all(
        p.data_ptr() == q.data_ptr()
        for p, q in zip(ref, [reference.linear.weight, reference.linear.bias, reference.running_mean])
    )


def test_mismatched_models_raise(tokenizer):
    with pytest.raises(ValueError, match="do not have the same tensors"):
        sync_reference_model(make_qwen(tokenizer, 1, num_layers=2), make_qwen(tokenizer, 1, num_layers=1), 1.0)
    with pytest.raises(ValueError, match="do not have the same tensors"):
        sync_reference_model(make_qwen(tokenizer, 1), WithBuffers(1), 1.0)
    small = nn.Sequential(nn.Linear(3, 4))
    big = nn.Sequential(nn.Linear(3, 5))
    with pytest.raises(
        ValueError, match=r"Tensor '0.weight' has shape \(5, 3\) in the reference but \(4, 3\) in the policy"
    ):
        sync_reference_model(small, big, 1.0)


@pytest.mark.parametrize("alpha", [0.0, 1.5, -0.1])
def test_alpha_out_of_range_raises(alpha):
    ref, pol = [torch.zeros(3)], [torch.ones(3)]
    with pytest.raises(ValueError, match=rf"alpha must be in \(0, 1\], got {alpha}"):
        mix_tensors_(ref, pol, alpha)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        sync_reference_model(WithBuffers(1), WithBuffers(2), alpha)
    assert torch.equal(ref[0], torch.zeros(3))


def test_mix_tensors_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 reference tensors but 1 policy tensors"):
        mix_tensors_([torch.zeros(2), torch.zeros(2)], [torch.ones(2)], 0.5)


def test_mix_tensors_fp16_and_repeated_syncs_converge():
    ref = [torch.zeros(5, dtype=torch.float16)]
    pol = [torch.full((5,), 2.0, dtype=torch.float16)]
    mix_tensors_(ref, pol, 0.5)
    assert torch.equal(ref[0], torch.full((5,), 1.0, dtype=torch.float16))
    mix_tensors_(ref, pol, 0.5)
    assert torch.equal(ref[0], torch.full((5,), 1.5, dtype=torch.float16))


def test_make_reference_for_each_kind_of_policy(tokenizer):
    from peft import LoraConfig, get_peft_model

    policy = make_qwen(tokenizer, 1)
    assert make_reference(policy, 0.0, True, False) == (None, None)  # beta = 0: no reference at all
    ref_model, ref_adapter = make_reference(policy, 0.04, False, False)
    assert ref_adapter is None and ref_model is not policy
    assert all(torch.equal(p, q) and not q.requires_grad for p, q in zip(policy.parameters(), ref_model.parameters()))
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0)
    peft_policy = get_peft_model(make_qwen(tokenizer, 1), lora)
    assert make_reference(peft_policy, 0.04, False, False) == (None, None)  # base model, adapters disabled
    assert REFERENCE_ADAPTER not in peft_policy.peft_config
    assert make_reference(peft_policy, 0.04, True, False) == (None, REFERENCE_ADAPTER)  # syncing: a frozen copy
    reference = {n: p for n, p in peft_policy.named_parameters() if f".{REFERENCE_ADAPTER}." in n}
    assert len(reference) == 2 * 2 and not any(p.requires_grad for p in reference.values())  # A, B of 2 layers
    for name, parameter in reference.items():
        assert torch.equal(parameter, peft_policy.get_parameter(name.replace(f".{REFERENCE_ADAPTER}.", ".default.")))
