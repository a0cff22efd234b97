# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reference syncing on 2 CPU processes (gloo): DDP and DeepSpeed ZeRO-2/3, plus the accelerate configs (FSDP2:
tests/test_fsdp2.py).

Each launch runs `tests/distributed_workers/sync_worker.py` under `torchrun --nproc_per_node 2` once per module and
the tests assert on the JSON every rank writes. The DeepSpeed CPU communication op is JIT-compiled once (~40 s on a
clean machine) into the torch extensions cache, outside the launches' time limits.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch
import yaml


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "distributed_workers", "sync_worker.py")
REWARD_MODEL_WORKER = os.path.join(ROOT, "tests", "distributed_workers", "reward_model_worker.py")
ALPHA, TAU, STEPS = 0.6, 2, 4
NOT_SAME_PARTITIONING = "partitioned the same way"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        DS_BUILD_OPS="0",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")


def accelerate_launch(config: str) -> tuple[str, ...]:
    """`accelerate launch` with `trl/accelerate_configs/<config>` on 2 processes, full precision, a free port."""
    config_file = os.path.join(ROOT, "trl", "accelerate_configs", config)
    return ("-m", "accelerate.commands.launch", "--config_file", config_file, "--num_processes", "2")


def _launch(
    mode: str, model_dir: str, out_dir, timeout: int = 150, worker: str = WORKER, extra=(), launcher=TORCHRUN
) -> list[dict]:
    """Run the worker on 2 processes; return each rank's JSON (rank 0 first).

    `launcher`: `TORCHRUN` (`--standalone` lets the rendezvous pick a free port itself) or `accelerate_launch(...)`,
    which gets a free port here. A launch that fails is retried once: gloo's teardown has been seen to abort a
    process after all results were written (1 run in ~70), which says nothing about the code under test; a real
    failure fails twice.
    """
    if launcher is not TORCHRUN:
        launcher = (*launcher, "--mixed_precision", "no", "--main_process_port", str(_free_port()))
    command = [
        sys.executable,
        *launcher,
        worker,
        mode,
        model_dir,
        str(out_dir),
        *extra,
    ]
    for attempt in range(2):
        # its own process group, so that a hang is ended with the workers, not only the launcher
        launcher = subprocess.Popen(
            command,
            env=_env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
            raise
        proc = subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)
        if proc.returncode == 0:
            break
    assert proc.returncode == 0, f"{mode} workers failed twice:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out_dir / f"{mode}_rank{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from trl.models.tiny import build_tiny_causal_lm
    from trl.tasks import arithmetic_corpus

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("dist_model")), corpus=arithmetic_corpus())


@pytest.fixture(scope="module")
def ddp_results(model_dir, tmp_path_factory):
    return _launch("ddp", model_dir, tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def deepspeed_op():
    """Compile DeepSpeed's CPU communication op once, in one process, into the torch extensions cache."""
    pytest.importorskip("deepspeed")
    warm = "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
    subprocess.run([sys.executable, "-c", warm], env=_env(), cwd=ROOT, check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def zero2_results(model_dir, tmp_path_factory, deepspeed_op):
    return _launch("zero2", model_dir, tmp_path_factory.mktemp("zero2"))


@pytest.fixture(scope="module")
def zero3_results(model_dir, tmp_path_factory, deepspeed_op):
    return _launch("zero3", model_dir, tmp_path_factory.mktemp("zero3"))


@pytest.fixture(scope="module")
def zero3_lora_results(model_dir, tmp_path_factory, deepspeed_op):
    pytest.importorskip("peft")
    return _launch("zero3_lora", model_dir, tmp_path_factory.mktemp("zero3_lora"))


def test_zero3_lora_reference_adapter_syncs_its_partitions(zero3_lora_results):
    for rank in zero3_lora_results:
        assert rank["world_size"] == 2 and rank["num_syncs"] == STEPS // TAU
        # Every reference-adapter tensor is a ZeRO-3 parameter and this rank owns a real slice of it.
        assert rank["zero3_reference_params"] == rank["reference_params"] == 8 and rank["local_numel"] > 0
        assert rank["lora_b_moved"]  # training moved the adapter away from its zero init: equality is not vacuous
        assert rank["equal"]  # after the hard sync at step 4: gathered "ref" adapter == gathered policy adapter


def _assert_exact_syncs(records: list[dict], expected_steps: list[int]) -> None:
    assert [r["step"] for r in records] == expected_steps
    for r in records:
        assert r["policy_ref_gap"] > 1e-3  # the policy had moved: the check is not vacuous
        assert r["max_error"] <= 1e-6  # gathered reference == round(lerp_fp32(reference, policy, α))


@pytest.mark.parametrize("mode", ["ddp", "zero2", "zero3"])
def test_grpo_sync_matches_formula_on_every_rank(mode, request):
    """4 GRPO steps, τ = 2, α = 0.6: after each sync the gathered reference is the formula of the gathered policy."""
    results = request.getfixturevalue(f"{mode}_results")
    for rank in results:
        assert rank["world_size"] == 2
        assert rank["num_syncs"] == STEPS // TAU and rank["bound_callback"]
        assert rank["fallback"] == 0
        _assert_exact_syncs(rank["syncs"], [2, 4])
        assert rank["ref_forward_error"] <= 1e-5  # the prepared reference's forward reads the mixed weights
        # shared-prefix scoring through the DDP/DeepSpeed wrapper: on the prompt cache never for ZeRO-3 parameters,
        # in packed rows that start with their prompt (one pass) for all
        shares = mode != "zero3"
        assert rank["shared_scoring"] == {
            "error": pytest.approx(0, abs=1e-5),
            "shares_without_gradients": shares,
            "shares_with_gradients": shares,
            "inline_error": pytest.approx(0, abs=1e-5),
            "inline_without_gradients": True,
            "inline_with_gradients": True,
        }
        assert rank["checkpoint_roundtrip_equal"]  # the reference saved in a checkpoint restores bitwise
    assert [r["checksum"] for r in results[0]["syncs"]] == [r["checksum"] for r in results[1]["syncs"]]
    expected_types = {
        "ddp": ("DistributedDataParallel", "Qwen2ForCausalLM"),
        "zero2": ("DeepSpeedEngine", "DeepSpeedEngine"),  # reference: a stage-0 inference engine (a replica)
        "zero3": ("DeepSpeedEngine", "DeepSpeedEngine"),
    }
    assert (results[0]["policy_type"], results[0]["ref_type"]) == expected_types[mode]
    # Generation sees whole weights, and keeps them: under ZeRO-3 they are gathered once per generation call
    # (ds3_gather_for_generation=True) with DeepSpeed's module hooks removed, so `generate` itself fetches no layer
    # (before that it ran 16 broadcasts and 2 all-gathers per call here). Its only collective is transformers' one
    # all-reduce per token of synchronised generation (ZeRO-3).
    for rank in results:
        assert rank["generate_saw_full_weights"] and all(rank["generate_saw_full_weights"])
        for counts in rank["generate_collectives"]:
            assert set(counts) <= {"all_reduce"}, counts
            assert counts.get("all_reduce", 0) == (7 if mode == "zero3" else 0)


@pytest.mark.parametrize("mode", ["ddp", "zero2", "zero3"])
def test_sync_performs_no_collective(mode, request):
    for rank in request.getfixturevalue(f"{mode}_results"):
        for r in rank["syncs"]:
            assert r["collectives"] == 0 and r["profiler_collectives"] == 0, r["profiler_names"]
            assert r["warnings"] == []


def test_zero3_shared_prefix_generation_shares_on_the_gathered_weights(zero3_results):
    """With the weights gathered and DeepSpeed's hooks removed, the prompt pass runs before `generate` without
    fetching or releasing anything: one more forward, the same tokens as plain `generate`, no fetch in the call."""
    for rank in zero3_results:
        plain, shared = rank["generation_probe"]["generate"], rank["generation_probe"]["shared_prefix"]
        assert shared["ids"] == plain["ids"]
        assert shared["forwards"] == plain["forwards"] + 1
        for counts in (plain["collectives"], shared["collectives"]):
            assert set(counts) <= {"all_reduce"}, counts
        assert rank["generation_probe"]["module_ids_kept"] and rank["generation_probe"]["params_released"]


def test_zero3_partition_mismatch_falls_back_warns_once_and_is_exact(zero3_results):
    for rank in zero3_results:
        for case in ("policy_zero3_ref_plain", "policy_plain_ref_zero3"):
            result = rank["mismatch"][case]
            assert result["fallback"] > 0
            assert result["warnings_total"] == 1 and len(result["syncs"][0]["warnings"]) == 1  # at pairing only
            for r in result["syncs"]:
                assert r["max_error"] <= 1e-6 and r["policy_ref_gap"] > 1e-3
                assert r["collectives"] > 0  # the fallback gathers (and shows that the counter sees gathers)
    for case in ("policy_zero3_ref_plain", "policy_plain_ref_zero3"):
        sums = [[r["checksum"] for r in rank["mismatch"][case]["syncs"]] for rank in zero3_results]
        assert sums[0] == sums[1]


@pytest.mark.parametrize(
    "name, distributed_type, extra",
    [
        ("multi_gpu.yaml", "MULTI_GPU", {}),
        ("zero2.yaml", "DEEPSPEED", {"zero_stage": 2}),
        ("zero3.yaml", "DEEPSPEED", {"zero_stage": 3, "zero3_init_flag": True}),
        ("fsdp2.yaml", "FSDP", {"fsdp_version": 2}),
    ],
)
def test_accelerate_configs(name, distributed_type, extra):
    with open(os.path.join(ROOT, "trl", "accelerate_configs", name)) as f:
        config = yaml.safe_load(f)
    assert config["distributed_type"] == distributed_type
    assert config["num_processes"] == 8 and config["compute_environment"] == "LOCAL_MACHINE"
    section = config.get("deepspeed_config") or config.get("fsdp_config") or {}
    for key, value in extra.items():
        assert section[key] == value


@pytest.fixture(scope="module")
def ddp_reward_model_results(model_dir, tmp_path_factory):
    from trl.models.tiny import build_tiny_reward_model

    reward_model_dir = build_tiny_reward_model(str(tmp_path_factory.mktemp("dist_rm")), model_dir)
    out_dir = tmp_path_factory.mktemp("ddp_rm")
    return _launch("ddp", model_dir, out_dir, worker=REWARD_MODEL_WORKER, extra=[reward_model_dir])


def test_ddp_reward_model_refresh_is_identical_on_every_rank(ddp_reward_model_results):
    """Algorithm 1 on 2 processes: reward model refreshed every 2 steps, then the reference reset, for 4 steps."""
    rank0, rank1 = ddp_reward_model_results
    for rank in (rank0, rank1):
        assert rank["world_size"] == 2 and rank["reward_model_type"] == "Qwen2ForSequenceClassification"
        assert rank["events"] == [["reward model", 2], ["reference", 2], ["reward model", 4], ["reference", 4]]
        fingerprints = rank["fingerprints"]  # steps 0..4: the weights change at steps 2 and 4 only
        assert [fingerprints[s] != fingerprints[s - 1] for s in range(1, 5)] == [False, True, False, True]
        # Both processes' completions: 2 × 4 per step, 16 per update; the second update replays 4 of 20 (0.2).
        assert rank["num_updates"] == 2 and rank["buffer_examples"] == 32
        assert rank["replay_fraction"] == [None, 0.0, None, 0.2]
        assert rank["checkpoint_roundtrip_equal"]
    assert rank0["fingerprints"] == rank1["fingerprints"]  # the same update on every rank, bit for bit


def test_zero3_reward_model_refresh_is_refused_at_init(model_dir, tmp_path_factory, deepspeed_op):
    from trl.models.tiny import build_tiny_reward_model

    reward_model_dir = build_tiny_reward_model(str(tmp_path_factory.mktemp("z3_rm")), model_dir)
    out_dir = tmp_path_factory.mktemp("zero3_rm")
    for rank in _launch("zero3", model_dir, out_dir, worker=REWARD_MODEL_WORKER, extra=[reward_model_dir]):
        assert rank["world_size"] == 2
        assert rank["error"].startswith(
            "reward_model_update_steps works on one device and under DDP, not under DeepSpeed"
        )


PREFIX_SHARING_WORKER = os.path.join(ROOT, "tests", "distributed_workers", "prefix_sharing_worker.py")


@pytest.fixture(scope="module")
def ddp_sharing_results(model_dir, tmp_path_factory):
    return _launch("ddp", model_dir, tmp_path_factory.mktemp("ddp_sharing"), worker=PREFIX_SHARING_WORKER)


@pytest.fixture(scope="module")
def zero2_sharing_results(model_dir, tmp_path_factory, deepspeed_op):
    return _launch("zero2", model_dir, tmp_path_factory.mktemp("zero2_sharing"), worker=PREFIX_SHARING_WORKER)


@pytest.fixture(scope="module")
def zero3_sharing_results(model_dir, tmp_path_factory, deepspeed_op):
    return _launch("zero3", model_dir, tmp_path_factory.mktemp("zero3_sharing"), worker=PREFIX_SHARING_WORKER)


@pytest.fixture(scope="module")
def fsdp2_sharing_results(model_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("fsdp2_sharing")
    launcher = accelerate_launch("fsdp2.yaml")
    return _launch("fsdp2", model_dir, out_dir, timeout=240, worker=PREFIX_SHARING_WORKER, launcher=launcher)


@pytest.mark.parametrize(
    "mode, policy_type",
    [
        ("ddp", "DistributedDataParallel"),
        ("zero2", "DeepSpeedEngine"),
        ("zero3", "DeepSpeedEngine"),
        ("fsdp2", "FSDPQwen2ForCausalLM"),
    ],
)
def test_shared_prefix_scoring_trains_as_plain_scoring(mode, policy_type, request):
    """2 GRPO steps on 2 processes at the default sharing threshold (24-token prompts, 16 needed), with TRL's default
    gradient checkpointing (under ZeRO-3 and FSDP2, whose parameters rule out the prompt cache, the passes share in
    packed rows that start with their prompt): `shared_prefix=True` really shares (reference and training passes)
    and gives the loss, entropy and gradient norm of `shared_prefix=False` to rtol 1e-5 (the loss, ~0 at step 1 where the
    advantages cancel: also abs 1e-6), and every per-token log-prob within 1e-5 + 1e-6 of its size (the passes run
    other matrix shapes: one pass over rows that start with their prompt, where the plain pass pads)."""
    for rank in request.getfixturevalue(f"{mode}_sharing_results"):
        plain, shared = rank["False"], rank["True"]
        assert rank["world_size"] == 2 and shared["policy_type"] == policy_type
        assert shared["threshold"] == 16 and shared["prompt_tokens"] > shared["threshold"] + 1
        # one reference and one training pass per step shared their prompts, in rows that start with their prompt
        # (24-token prompts, completions of at most 6: the inline layout is estimated cheaper); the plain run never did
        assert shared["shared"] == {"with_gradients": 2, "without_gradients": 2} and shared["inline_passes"] == 4
        assert shared["plain_pass_logs"] == []
        assert plain["shared"] == {"with_gradients": 0, "without_gradients": 0}
        assert len(plain["steps"]) == len(shared["steps"]) == 2
        for ours, reference in zip(shared["steps"], plain["steps"]):
            assert reference["grad_norm"] > 1e-2  # a real gradient
            assert ours["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
            assert ours["entropy"] == pytest.approx(reference["entropy"], rel=1e-5)
            assert ours["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)
        assert len(plain["logps"]) == len(shared["logps"]) == 4  # per step: reference, then training
        for ours, reference in zip(shared["logps"], plain["logps"]):
            torch.testing.assert_close(torch.tensor(ours), torch.tensor(reference), atol=1e-5, rtol=1e-6)


@pytest.fixture(scope="module")
def ddp_diverge_sharing_results(model_dir, tmp_path_factory):
    # a hang (the ranks' DDP collectives no longer pairing up) ends at the timeout; a run takes ~40 s
    out_dir = tmp_path_factory.mktemp("ddp_diverge_sharing")
    return _launch("ddp_diverge", model_dir, out_dir, timeout=120, worker=PREFIX_SHARING_WORKER)


def test_ranks_that_decide_differently_on_sharing_train_as_plain_scoring(ddp_diverge_sharing_results):
    """DDP with rank 0 on 24-token prompts (shared) and rank 1 on 12-token ones (below the threshold: plain), in
    the same steps. The prompt pass runs inside the DDP wrapper, so both ranks make one DDP forward (and buffer
    broadcast) per pass: the run finishes, with the loss, entropy and gradient norm of the plain run to rtol 1e-5
    (with the prompt pass run through the DDP wrapper, rank 0 made an extra DDP forward and the run hung)."""
    rank0, rank1 = ddp_diverge_sharing_results
    assert [rank["True"]["prompt_tokens"] for rank in (rank0, rank1)] == [24, 12]
    assert rank0["True"]["shared"] == {"with_gradients": 2, "without_gradients": 2}
    assert rank1["True"]["shared"] == {"with_gradients": 0, "without_gradients": 0}
    # rank 0 also packed completions of different lengths into shared rows (a 4-D mask); rank 1 ran padded rows
    assert rank0["True"]["packed_passes"] > 0 and rank1["True"]["packed_passes"] == 0
    for rank in (rank0, rank1):
        plain, shared = rank["False"], rank["True"]
        assert rank["world_size"] == 2 and shared["policy_type"] == "DistributedDataParallel"
        assert plain["shared"] == {"with_gradients": 0, "without_gradients": 0}
        assert len(plain["steps"]) == len(shared["steps"]) == 2
        for ours, reference in zip(shared["steps"], plain["steps"]):
            assert reference["grad_norm"] > 1e-2
            assert ours["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
            assert ours["entropy"] == pytest.approx(reference["entropy"], rel=1e-5)
            assert ours["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-6)
        # per step: reference, then training pass. Within 1e-5 but step 2's training pass (measured 2.2e-5): it runs
        # on weights that step 1's Adam update (lr 5e-2) moved apart by float rounding, also on rank 1, plain in both
        assert len(plain["logps"]) == len(shared["logps"]) == 4
        for index, (ours, reference) in enumerate(zip(shared["logps"], plain["logps"])):
            difference = (torch.tensor(ours) - torch.tensor(reference)).abs().max()
            assert difference <= (5e-5 if index == 3 else 1e-5), (index, difference)


REWARD_ERROR_WORKER = os.path.join(ROOT, "tests", "distributed_workers", "reward_error_worker.py")


def test_reward_error_on_one_process_is_raised_on_every_process(model_dir, tmp_path):
    """A reward function returns a string on process 0 only. Before: process 0 raised its TypeError alone and
    process 1 waited in `gather(rewards)` (the launch hit the timeout). Now every process raises, naming the error."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [REWARD_ERROR_WORKER, "ddp", model_dir, str(tmp_path)]
    try:
        proc = subprocess.run(command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the workers hung on a reward error raised on one process:\n{timeout.stdout}\n{timeout.stderr}")
    assert proc.returncode == 0, f"workers failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    local = (
        "Reward function 'flaky_reward' returned a str ('oops') instead of a list: it must return a list of 4 floats "
        "(or None), one per completion."
    )
    results = [json.loads((tmp_path / f"ddp_rank{rank}.json").read_text()) for rank in range(2)]
    assert results == [
        {"type": "TypeError", "message": local},
        {"type": "TypeError", "message": f"reward function error on process 0: {local}"},
    ]
    assert f"rank 0 raised TypeError: {local}" in proc.stdout
    assert f"rank 1 raised TypeError: reward function error on process 0: {local}" in proc.stdout


STREAM_WORKER = os.path.join(ROOT, "tests", "distributed_workers", "stream_worker.py")


def test_stream_gives_each_rank_the_groups_of_the_map_style_run(model_dir, tmp_path):
    """2 steps, shuffle off, 16 prompts streamed from two shards (which accelerate would hand out one per process),
    generation batches of 8 prompts × 2 completions: each rank trains on the prompts `RepeatSampler` and accelerate's
    `BatchSamplerShard` give it with the map-style dataset (rank 0 the first 4 of each generation batch, rank 1 the
    next 4; measured equal to a map-style run, weights included), to the same weights on both ranks.

    Before `WholeStream`, as in TRL 1.16, rank 0 trained on 0+0…0+3 at both steps and rank 1 on 2+0…2+3."""
    results = _launch("ddp", model_dir, tmp_path, timeout=120, worker=STREAM_WORKER)
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(4)]
    for rank, result in enumerate(results):
        expected = [[p for p in prompts[8 * k + 4 * rank : 8 * k + 4 * rank + 4] for _ in range(2)] for k in range(2)]
        assert result["prompts"] == expected, rank
    assert results[0]["weights"] == results[1]["weights"]
