# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Single-process checks of the layout-aware pairing and of the DeepSpeed inference config (multi-process: see
tests/test_distributed.py)."""

import warnings

import pytest
import torch
from torch import nn

from trl import SyncRefModelCallback, sync_reference_model
from trl.models.utils import _inference_deepspeed_config
from trl.trainer.ref_sync import ReferenceSync, pair_for_sync, tensor_layout


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


def test_local_parts_share_storage_and_follow_reassigned_data():
    policy, reference = _pair_of_mlps()
    plan = pair_for_sync(policy, reference)
    reference[0].weight.data = torch.zeros(8, 4)  # an engine re-pointing storage after pairing
    plan(1.0)
    assert torch.equal(reference[0].weight, policy[0].weight)


def test_local_parts_share_storage_with_the_parameters():
    policy, reference = _pair_of_mlps()
    pol, ref = pair_for_sync(policy, reference).local_parts()
    assert len(pol) == len(ref) == 6
    assert all(r.data_ptr() == p.data_ptr() for r, p in zip(ref, reference.parameters()))


def test_mismatched_names_still_raise():
    policy, _ = _pair_of_mlps()
    with pytest.raises(ValueError, match="do not have the same tensors"):
        pair_for_sync(policy, nn.Sequential(nn.Linear(4, 8)))


def test_bf16_reference_fp32_policy_single_rounding():
    policy, reference = _pair_of_mlps()
    reference = reference.to(torch.bfloat16)
    before = [t.clone() for t in reference.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same partitioning: no fallback warning
        sync_reference_model(policy, reference, 0.3)
    for b, p, r in zip(before, policy.parameters(), reference.parameters()):
        assert torch.equal(r, torch.lerp(b.float(), p.float(), 0.3).to(torch.bfloat16))


def test_callback_pairs_once():
    policy, reference = _pair_of_mlps()
    callback = SyncRefModelCallback(ref_model=reference)
    args = type("Args", (), {"ref_model_mixup_alpha": 1.0})()
    state = type("State", (), {"global_step": 3})()
    callback.sync(args, state, policy)
    plan = callback._sync
    callback.sync(args, state, policy)
    assert callback._sync is plan and callback.num_syncs == 2 and callback.last_sync_step == 3
    assert all(torch.equal(p, r) for p, r in zip(policy.parameters(), reference.parameters()))


def test_inference_deepspeed_config_zero3():
    policy_config = {
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "offload_optimizer": {"device": "cpu"},
        },
        "optimizer": {"type": "AdamW"},
        "scheduler": {"type": "WarmupLR"},
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }
    config = _inference_deepspeed_config(policy_config, hidden_size=64)
    assert "optimizer" not in config and "scheduler" not in config and "gradient_clipping" not in config
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_param_persistence_threshold"] == 0 and "offload_optimizer" not in zero
    assert zero["zero_hpz_partition_size"] == 1
    assert zero["reduce_bucket_size"] == int(0.9 * 64 * 64) and config["bf16"] == {"enabled": True}
    assert config["train_micro_batch_size_per_gpu"] == 1 and "train_batch_size" not in config
    assert policy_config["optimizer"] == {"type": "AdamW"}  # the policy's config is not modified


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_inference_deepspeed_config_replicated_stages(stage):
    config = _inference_deepspeed_config(
        {"zero_optimization": {"stage": stage, "overlap_comm": True}, "train_micro_batch_size_per_gpu": 2}, 64
    )
    assert config["zero_optimization"] == {"stage": 0} and config["train_micro_batch_size_per_gpu"] == 2
