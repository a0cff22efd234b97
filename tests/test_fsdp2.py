# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPOTrainer under accelerate's FSDP2 plugin on 2 CPU processes (gloo), started with
`accelerate launch --config_file trl/accelerate_configs/fsdp2.yaml --num_processes 2 --mixed_precision no`.

accelerate 1.15 enables FSDP for GPU-like devices only; the worker (`tests/distributed_workers/fsdp2_trainer_worker.py`)
lifts that one check and runs everything else as accelerate runs it on GPUs (see its docstring). Three launches per
module: the FSDP2 run (6 steps, τ = 2, α = 0.6, a checkpoint every 2 steps), its resume from checkpoint-2, the same
run with a LoRA policy, and the same run under DDP (torchrun, no FSDP); plus, inside the FSDP2 launch, a generation
probe and hand-sharded models whose placements match or differ.
"""

import pytest
from test_distributed import TORCHRUN, _assert_exact_syncs, _launch, accelerate_launch


WORKER = "tests/distributed_workers/fsdp2_trainer_worker.py"
STEPS, TAU, COMPLETION_LENGTH = 6, 2, 6
NOT_SAME_PARTITIONING = "partitioned the same way"


def _run(mode: str, model_dir: str, out_dir, launcher) -> list[dict]:
    return _launch(mode, model_dir, out_dir, timeout=240, worker=WORKER, launcher=launcher)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from trl.models.tiny import build_tiny_causal_lm
    from trl.tasks import arithmetic_corpus

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("fsdp2_model")), corpus=arithmetic_corpus())


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fsdp2_trainer")


@pytest.fixture(scope="module")
def fsdp2(model_dir, out_dir):
    return _run("fsdp2", model_dir, out_dir, accelerate_launch("fsdp2.yaml"))


@pytest.fixture(scope="module")
def resumed(model_dir, out_dir, fsdp2):  # reads fsdp2's checkpoint-2
    return _run("fsdp2_resume", model_dir, out_dir, accelerate_launch("fsdp2.yaml"))


@pytest.fixture(scope="module")
def lora(model_dir, out_dir):
    return _run("fsdp2_lora", model_dir, out_dir, accelerate_launch("fsdp2.yaml"))


@pytest.fixture(scope="module")
def ddp(model_dir, out_dir):
    return _run("ddp", model_dir, out_dir, TORCHRUN)


def test_accelerate_prepares_policy_and_reference_with_fsdp2(fsdp2):
    for rank in fsdp2:
        assert rank["world_size"] == 2 and rank["distributed_type"] == "FSDP"
        assert rank["policy_type"] == rank["ref_type"] == "FSDPQwen2ForCausalLM"
        assert rank["ref_layouts"] == ["dtensor"]
        # With cpu_ram_efficient_loading (the shipped config), rank 1 loads no weights: rank 0's are broadcast.
        assert rank["ref_init_equals_checkpoint"] and rank["ref_init_names_checked"] == 26
        assert rank["same_placements"] and rank["fallback"] == 0 and rank["local_pairs"] == 26
        assert rank["global_step"] == STEPS
        # no prompt cache under FSDP2 (rows that start with their prompt still share: test_distributed.py)
        assert rank["scoring_blocker"] == "ZeRO-3/FSDP2 parameters"


def test_every_sync_is_the_formula_on_local_shards_without_collectives(fsdp2):
    for rank in fsdp2:
        assert rank["num_syncs"] == STEPS // TAU
        _assert_exact_syncs(rank["syncs"], [2, 4, 6])
        for r in rank["syncs"]:
            assert r["max_error"] == 0.0  # float32: the lerp is the formula to the bit
            assert r["collectives"] == 0 and r["profiler_collectives"] == 0, r["profiler_names"]
    assert [r["checksum"] for r in fsdp2[0]["syncs"]] == [r["checksum"] for r in fsdp2[1]["syncs"]]


def test_ranks_agree(fsdp2):
    assert fsdp2[0]["policy_digest"] == fsdp2[1]["policy_digest"]
    assert fsdp2[0]["reference_digest"] == fsdp2[1]["reference_digest"]
    assert fsdp2[0]["losses"] == fsdp2[1]["losses"] and len(fsdp2[0]["losses"]) == STEPS


def test_generation_gathers_each_parameter_group_once(fsdp2):
    for rank in fsdp2:
        groups = rank["fsdp_param_groups"]
        assert groups == 3  # layer 0, layer 1, and the embedding + final norm + LM head
        assert len(rank["generations"]) == STEPS
        for g in rank["generations"]:
            assert g["forwards"] == 1 + COMPLETION_LENGTH  # the shared prompt pass, then one forward per new token
            assert g["fsdp_all_gathers"] == groups
        probe = rank["probe"]
        for implementation in ("generate", "shared_prefix"):
            once, per_forward = probe[f"fsdp2_{implementation}_once"], probe[f"fsdp2_{implementation}_per_forward"]
            assert once["fsdp_all_gathers"] == groups
            # ds3_gather_for_generation=False: FSDP2 gathers the layers again at every forward (TRL 1.16's way)
            assert per_forward["fsdp_all_gathers"] >= 2 * COMPLETION_LENGTH
            # a torch without the private FSDP2 state read to restore it: FSDP2's own gathering, no error
            assert probe[f"fsdp2_{implementation}_fallback"]["fsdp_all_gathers"] == per_forward["fsdp_all_gathers"]
        # shared-prefix generation did share: one more (prompt) forward than plain generate
        assert probe["fsdp2_shared_prefix_once"]["forwards"] == probe["fsdp2_generate_once"]["forwards"] + 1
        # after the gathered block every parameter is a shard again and FSDP2's reshard settings are as before
        assert probe["sharded_on_exit"] and probe["restored"]


def test_generation_samples_what_the_unsharded_weights_sample(fsdp2):
    """Same seed, same prompts: the FSDP2 policy (gathered once, per forward, or through the fallback; plain or
    shared-prefix generation) draws the tokens a plain model with its gathered weights draws."""
    for rank in fsdp2:
        probe = rank["probe"]
        for implementation in ("generate", "shared_prefix"):
            for case in ("once", "per_forward", "fallback"):
                assert probe[f"fsdp2_{implementation}_{case}"]["ids"] == probe[f"plain_{implementation}"]


def test_generation_samples_what_ddp_samples(fsdp2, ddp):
    """Sampling is seeded by (seed, step, process index), so a 2-process FSDP2 run draws, rank by rank and step by
    step, the completions of the 2-process DDP run; its losses agree to float rounding (gradients are reduced in
    another order). A 1-process run draws other samples: its one process has another seed than rank 1."""
    for f, d in zip(fsdp2, ddp):
        assert d["distributed_type"] == "MULTI_CPU" and d["ref_type"] == "Qwen2ForCausalLM"
        assert [g["completion_ids"] for g in f["generations"]] == [g["completion_ids"] for g in d["generations"]]
        # the first step's loss to float rounding; then the two reduction orders drift apart through lr = 5e-2
        # updates (measured: 9e-5 relative by step 6 on losses of ~0.01, with the default inverse-CDF draws)
        assert f["losses"][0] == pytest.approx(d["losses"][0], rel=1e-5, abs=1e-7)
        assert f["losses"] == pytest.approx(d["losses"], rel=3e-4, abs=1e-6)


def test_resume_from_an_fsdp2_checkpoint_is_bitwise(fsdp2, resumed):
    for f, r in zip(fsdp2, resumed):
        assert r["global_step"] == STEPS and r["distributed_type"] == "FSDP"
        assert r["policy_digest"] == f["policy_digest"] and r["reference_digest"] == f["reference_digest"]
        assert r["losses"] == f["losses"]  # steps 1-2 from the checkpoint's log, 3-6 trained again
        full = {g["step"]: g["completion_ids"] for g in f["generations"]}
        assert [g["step"] for g in r["generations"]] == [2, 3, 4, 5]
        assert all(g["completion_ids"] == full[g["step"]] for g in r["generations"])
        _assert_exact_syncs(r["syncs"], [4, 6])
        assert r["num_syncs"] == STEPS // TAU  # the counters came back with the checkpoint


def test_lora_reference_adapter_syncs_its_shards(lora):
    for rank in lora:
        assert rank["policy_type"] == "FSDPPeftModelForCausalLM" and rank["ref_adapter_layouts"] == ["DTensor"]
        assert rank["fallback"] == 0 and rank["local_pairs"] == 8  # lora_A/B of q_proj and v_proj, 2 layers
        assert rank["num_syncs"] == STEPS // TAU and rank["global_step"] == STEPS
        _assert_exact_syncs(rank["syncs"], [2, 4, 6])
        for r in rank["syncs"]:
            assert r["dtensors"] == r["tensors"] == 8
            assert r["max_error"] == 0.0 and r["collectives"] == 0 and r["profiler_collectives"] == 0
        assert all(g["fsdp_all_gathers"] > 0 for g in rank["generations"])
    assert lora[0]["ref_adapter_digest"] == lora[1]["ref_adapter_digest"]
    assert lora[0]["policy_digest"] == lora[1]["policy_digest"] and lora[0]["losses"] == lora[1]["losses"]


def test_hand_sharded_models_sync_locally_when_placements_match(fsdp2):
    for rank in fsdp2:
        result = rank["raw"]["matched"]
        assert result["dtensor_params"] > 0 and result["fallback"] == 0
        assert result["warnings_total"] == 0 and result["forward_finite"]
        for r in result["syncs"]:
            assert r["max_error"] <= 1e-6 and r["policy_ref_gap"] > 1e-3
            assert r["collectives"] == 0 and r["profiler_collectives"] == 0, r["profiler_names"]
    assert fsdp2[0]["raw"]["matched"]["syncs"][-1]["checksum"] == fsdp2[1]["raw"]["matched"]["syncs"][-1]["checksum"]


def test_placement_mismatch_falls_back_warns_once_and_is_exact(fsdp2):
    for rank in fsdp2:
        result = rank["raw"]["mismatch"]
        assert result["fallback"] > 0 and result["local"] > 0  # 2-D weights differ (Shard(1)); 1-D ones line up
        assert result["warnings_total"] == 1 and NOT_SAME_PARTITIONING in result["syncs"][0]["warnings"][0]
        for r in result["syncs"]:
            assert r["max_error"] <= 1e-6 and r["collectives"] > 0
