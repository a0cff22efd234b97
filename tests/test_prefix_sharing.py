# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Shared-prefix scoring (trl/trainer/prefix_sharing.py, grpo_scoring.score_completions(share_prefix=True)): the same
log-probs, entropies and gradients as one plain pass, with each distinct prompt computed once."""

import functools
from unittest.mock import patch

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_scoring
from trl.trainer.grpo_scoring import score_completions
from trl.trainer.prefix_sharing import scoring_sharing_blocker


PACKAGE_MIN_SHARED_PREFIX_TOKENS = grpo_scoring.MIN_SHARED_PREFIX_TOKENS  # read before any test patches it


@pytest.fixture(autouse=True)
def _share_short_prompts(monkeypatch):
    """These tests use prompts of a few tokens; the trainer shares from 17 (see the test of the threshold)."""
    monkeypatch.setattr(grpo_scoring, "MIN_SHARED_PREFIX_TOKENS", 1)


@pytest.fixture
def model(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    model.train()
    return model


def _batch(vocab_size, prompt_lengths=(6, 3), repeats=4, completion_length=5, seed=0):
    """Left-padded prompts of different lengths, each repeated `repeats` times, then right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    width = max(prompt_lengths)
    prompts, prompt_mask = [], []
    for length in prompt_lengths:
        ids = torch.randint(3, vocab_size, (width,), generator=g)
        ids[: width - length] = 0
        prompts += [ids] * repeats
        prompt_mask += [torch.arange(width) >= width - length] * repeats
    n = len(prompts)
    completions = torch.randint(3, vocab_size, (n, completion_length), generator=g)
    completion_mask = torch.ones(n, completion_length, dtype=torch.long)
    completion_mask[::3, -2:] = 0  # some completions ended early
    ids = torch.cat([torch.stack(prompts), completions], 1)
    mask = torch.cat([torch.stack(prompt_mask).long(), completion_mask], 1)
    return ids, mask, completion_length


def _score_and_grads(model, ids, mask, length, share):
    model.zero_grad()
    scores = score_completions(model, ids, mask, length, 0.7, None, True, False, True, share)
    completion_mask = mask[:, -length:]
    ((scores.per_token_logps + scores.entropies) * completion_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return scores.per_token_logps.detach(), scores.entropies.detach(), grads


def _record_forward_shapes(model):
    shapes = []
    original = model.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    model.forward = forward
    return shapes


@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_scoring_equals_one_plain_pass_values_and_gradients(model, checkpointing):
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
        assert scoring_sharing_blocker(model) is None
    ids, mask, length = _batch(model.config.vocab_size)
    plain = _score_and_grads(model, ids, mask, length, share=False)
    shapes = _record_forward_shapes(model)
    shared = _score_and_grads(model, ids, mask, length, share=True)
    # 2 distinct prompts: all but their last token once, then every row's last prompt token + completion
    assert shapes == [(2, ids.size(1) - length - 1), (ids.size(0), length + 1)]
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) == len(list(model.parameters()))
    for name, grad in plain[2].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)
    # the layers' flags are restored afterwards
    assert not any("_can_checkpoint_with_cache" in vars(m) for m in model.modules())


def test_shared_scoring_without_gradients(model):
    ids, mask, length = _batch(model.config.vocab_size, prompt_lengths=(2, 7, 4), repeats=3)
    with torch.no_grad():
        plain = score_completions(model, ids, mask, length, 1.0, batch_size=6)
        shapes = _record_forward_shapes(model)
        shared = score_completions(model, ids, mask, length, 1.0, batch_size=6, share_prefix=True)
    torch.testing.assert_close(shared.per_token_logps, plain.per_token_logps, atol=1e-5, rtol=0)
    prompt = ids.size(1) - length - 1
    # chunks of 6 rows: prompts A A A B B B | C C C, then each chunk's rows
    assert shapes == [(2, prompt), (6, length + 1), (1, prompt), (3, length + 1)]


def _moe_model(**overrides):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        **overrides,
    )
    torch.manual_seed(0)
    return MixtralForCausalLM(config).eval()


def test_moe_model_that_asks_for_router_logits(model):
    moe = _moe_model(output_router_logits=True)
    ids, mask, length = _batch(moe.config.vocab_size)
    with torch.no_grad():
        plain = score_completions(moe, ids, mask, length, 1.0)
        shapes = _record_forward_shapes(moe)
        shared = score_completions(moe, ids, mask, length, 1.0, share_prefix=True)
        assert len(shapes) == 2
        # the training pass computes the router loss over every token of one pass: no sharing there
        shapes.clear()
        score_completions(moe, ids, mask, length, 1.0, compute_aux_loss=True, share_prefix=True)
        assert shapes == [tuple(ids.shape)]
    torch.testing.assert_close(shared.per_token_logps, plain.per_token_logps, atol=1e-5, rtol=0)


def test_prompt_learning_adapters_and_dropout_fall_back(model):
    peft = pytest.importorskip("peft")
    ids, mask, length = _batch(model.config.vocab_size)
    tuned = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    with torch.no_grad():
        plain = score_completions(tuned, ids, mask, length, 1.0)
        shared = score_completions(tuned, ids, mask, length, 1.0, share_prefix=True)
    torch.testing.assert_close(shared.per_token_logps, plain.per_token_logps, atol=0, rtol=0)  # the same one pass

    dropout = AutoModelForCausalLM.from_pretrained(model.config._name_or_path, attention_dropout=0.5)
    dropout.train()
    assert scoring_sharing_blocker(dropout) == "dropout in a pass with gradients"  # one mask for a group's prompt
    with torch.no_grad():
        assert scoring_sharing_blocker(dropout) is None
    dropout.eval()
    assert scoring_sharing_blocker(dropout) is None
    from transformers import OPTConfig, OPTForCausalLM  # dropout applied as a function, named `dropout` in the config

    opt = OPTForCausalLM(
        OPTConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            ffn_dim=16,
            word_embed_proj_dim=16,
        )
    )
    assert opt.config.dropout > 0 and scoring_sharing_blocker(opt.train()) == "dropout in a pass with gradients"
    assert scoring_sharing_blocker(opt.eval()) is None


def test_reentrant_checkpointing_falls_back_to_plain_passes(model):
    model.gradient_checkpointing_enable({"use_reentrant": True})
    # reentrant checkpointing would lose the cached prompt's gradient
    assert scoring_sharing_blocker(model) == "reentrant gradient checkpointing"
    with torch.no_grad():
        assert scoring_sharing_blocker(model) is None  # nothing is checkpointed without gradients
    ids, mask, length = _batch(model.config.vocab_size)
    shapes = _record_forward_shapes(model)
    grpo_scoring._LOGGED_BLOCKERS.discard("reentrant gradient checkpointing")  # logged once per process
    with patch.object(grpo_scoring.logger, "info") as info:
        score_completions(model, ids, mask, length, 1.0, share_prefix=True)
        score_completions(model, ids, mask, length, 1.0, share_prefix=True)
    assert shapes == [tuple(ids.shape)] * 2
    info.assert_called_once_with(
        "shared_prefix_scoring: some log-prob passes run plain (reentrant gradient checkpointing)."
    )


def test_nothing_to_share_uses_one_plain_pass(model):
    ids, mask, length = _batch(model.config.vocab_size, prompt_lengths=(6, 3), repeats=1)  # all prompts distinct
    shapes = _record_forward_shapes(model)
    with torch.no_grad():
        score_completions(model, ids, mask, length, 1.0, share_prefix=True)
    assert shapes == [tuple(ids.shape)]


def test_a_model_that_ignores_the_cache_is_an_error(model):
    class DropsCache(torch.nn.Module):  # fills the prompt cache, then runs the completions without it
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.calls = inner, inner.config, 0

        def forward(self, cache=None, **kwargs):
            self.calls += 1
            return self.inner(**kwargs, **({"cache": cache} if self.calls == 1 else {}))

    ids, mask, length = _batch(model.config.vocab_size)
    with torch.no_grad(), pytest.raises(RuntimeError, match="shared_prefix_scoring=False"):
        score_completions(DropsCache(model), ids, mask, length, 1.0, share_prefix=True)


def test_lora_gradients_match(model):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    ids, mask, length = _batch(model.config.vocab_size)
    plain = _score_and_grads(lora, ids, mask, length, share=False)
    shapes = _record_forward_shapes(lora)
    shared = _score_and_grads(lora, ids, mask, length, share=True)
    assert len(shapes) == 2  # the shared path ran
    assert plain[2] and all("lora_" in name for name in plain[2])
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


def test_training_with_and_without_sharing_agrees(tiny_lm_path, _arithmetic_dataset, grpo_kwargs, monkeypatch):
    """Two optimizer steps with TRL's default gradient checkpointing: the same loss, entropy and gradient norm at each
    step (Adam's first step is lr·sign(g), so equal parameters alone would not show equal gradients), the same
    parameters."""
    from trl.trainer import grpo_scoring

    shared_passes = []  # (gradients on, rows) of every pass that shared its prompts
    make_cache = grpo_scoring.shared_prefix_cache

    def counting(model, ids, *args):
        cache = make_cache(model, ids, *args)
        if cache is not None:
            shared_passes.append((torch.is_grad_enabled(), ids.size(0)))
        return cache

    monkeypatch.setattr(grpo_scoring, "shared_prefix_cache", counting)
    params, logged = {}, {}
    for share in (False, True):
        kwargs = {**grpo_kwargs, "gradient_checkpointing": True, "max_steps": 2, "shared_prefix_scoring": share}
        kwargs["output_dir"] = f"{grpo_kwargs['output_dir']}/{share}"
        trainer = GRPOTrainer(
            tiny_lm_path,
            lambda completions, **kw: [float(len(c)) for c in completions],
            args=GRPOConfig(**kwargs),
            train_dataset=_arithmetic_dataset,
        )
        trainer.train()
        params[share] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        history = [log for log in trainer.state.log_history if "grad_norm" in log]
        logged[share] = [(log["loss"], log["entropy"], log["grad_norm"]) for log in history]
        if share:  # per step: 2 reference chunks of 4 rows (one prompt each) and micro-batches with gradients
            assert shared_passes.count((False, 4)) == 4 and (True, 4) in shared_passes, shared_passes
        else:
            assert shared_passes == []
    assert len(logged[True]) == len(logged[False]) == 2
    for (loss, entropy, grad_norm), (plain_loss, plain_entropy, plain_grad_norm) in zip(logged[True], logged[False]):
        assert grad_norm > 1e-3  # a real gradient, not rounding noise
        # on-policy GRPO losses are ~0 (advantages average out): the entropy and gradient norm carry the signal
        assert loss == pytest.approx(plain_loss, rel=1e-4, abs=1e-6)
        assert entropy == pytest.approx(plain_entropy, rel=1e-5)
        assert grad_norm == pytest.approx(plain_grad_norm, rel=1e-4)
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm_path).state_dict()
    assert any(not torch.equal(p, initial[n]) for n, p in params[True].items())  # it trained
    for name, value in params[False].items():
        torch.testing.assert_close(params[True][name], value, atol=1e-4, rtol=1e-4)


def test_short_prompts_are_scored_in_one_plain_pass(model):
    """Below `min_prefix_tokens` the second forward costs more than it saves; the trainer's default is 16."""
    ids, mask, length = _batch(model.config.vocab_size, prompt_lengths=(6, 3))  # 6-token padded prompts
    shapes = _record_forward_shapes(model)
    with torch.no_grad():
        score_completions(model, ids, mask, length, 1.0, share_prefix=True, min_prefix_tokens=6)
        assert shapes == [tuple(ids.shape)]
        score_completions(model, ids, mask, length, 1.0, share_prefix=True, min_prefix_tokens=5)
        assert len(shapes) == 3  # 5 tokens before the last: shared
    assert PACKAGE_MIN_SHARED_PREFIX_TOKENS == 16
