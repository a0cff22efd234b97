# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Shared-prefix scoring (trl/scoring/prefix_sharing.py, grpo_scoring.score_completions(share_prefix=True)): the same
log-probs, entropies and gradients as one plain pass, with each distinct prompt computed once."""

import functools
from unittest.mock import patch

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl import GRPOConfig, GRPOTrainer
from trl.scoring import grpo_scoring, scoring_plan
from trl.scoring.grpo_scoring import score_completions
from trl.scoring.prefix_sharing import (
    PACKABLE_MODEL_TYPES,
    pack_completions,
    packing_blocker,
    rope_sharing_blocker,
    scoring_sharing_blocker,
    split_lengths,
)


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


def _batch(vocab_size, prompt_lengths=(6, 3), repeats=4, completion_length=5, seed=0, lengths=None):
    """Left-padded prompts of different lengths, each repeated `repeats` times, then right-padded completions (of
    `lengths` tokens, or every third row 2 tokens short)."""
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
    if lengths is not None:
        completion_mask = (torch.arange(completion_length) < torch.tensor(lengths)[:, None]).long()
    ids = torch.cat([torch.stack(prompts), completions], 1)
    mask = torch.cat([torch.stack(prompt_mask).long(), completion_mask], 1)
    return ids, mask, completion_length


def _score_and_grads(model, ids, mask, length, share, packed=False):
    model.zero_grad()
    scores = score_completions(model, ids, mask, length, 0.7, None, True, False, True, share, packed=packed)
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


@pytest.mark.parametrize("packed", [False, "cache", "inline"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_scoring_equals_one_plain_pass_values_and_gradients(model, checkpointing, packed):
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
        assert scoring_sharing_blocker(model) is None
    ids, mask, length = _batch(model.config.vocab_size, lengths=(5, 1, 2, 5, 3, 2, 5, 1))
    plain = _score_and_grads(model, ids, mask, length, share=False)
    shapes = _record_forward_shapes(model)
    shared = _score_and_grads(model, ids, mask, length, share=True, packed=packed)
    # 2 distinct prompts: all but their last token once, then every row's last prompt token + completion: padded to
    # the longest plus one position, or packed: rows of 7 holding 5 + 2, 5 + 1 (prompt A), 5 + 2, 3 + 1 (prompt B);
    # or inline, one pass: each prompt, then its completions but their last tokens (A: 6 + 4 + 4 + 1, B: 3 + 4 + 2 + 1)
    completions = (ids.size(0), length + 1) if not packed else (4, 7)
    expected = [(2, 6 + 9)] if packed == "inline" else [(2, ids.size(1) - length - 1), completions]
    assert shapes == expected
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
    valid = mask[:, -length:].bool()
    assert (shared[0][~valid] == 0).all() and (shared[1][~valid] == 0).all()
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
    # logged once per process, with why the inline rows (which need no cache) were not used either
    scoring_plan._LOGGED_BLOCKERS.clear()
    with patch.object(scoring_plan.logger, "info") as info:
        score_completions(model, ids, mask, length, 1.0, share_prefix=True)
        score_completions(model, ids, mask, length, 1.0, share_prefix=True)
    assert shapes == [tuple(ids.shape)] * 2
    info.assert_called_once_with(
        "shared_prefix: some log-prob passes run plain (reentrant gradient checkpointing; no rows that start "
        "with their prompt either: packed=False)."
    )


def test_a_pass_without_gradients_can_take_the_training_layout(model):
    # The old log-probs' pass (no gradients) is laid out as the training pass over the same rows will be, so the two
    # give the same bits: here reentrant checkpointing keeps the training pass off the prompts' cache.
    model.gradient_checkpointing_enable({"use_reentrant": True})
    ids, mask, length = _batch(model.config.vocab_size)
    shapes = _record_forward_shapes(model)
    with torch.no_grad():
        free = score_completions(model, ids, mask, length, 1.0, share_prefix=True).per_token_logps
        assert len(shapes) == 2  # the distinct prompts' pass, then the completions on their cache
        as_training = score_completions(model, ids, mask, length, 1.0, share_prefix=True, training_layout=True)
    training = score_completions(model, ids, mask, length, 1.0, share_prefix=True).per_token_logps
    assert shapes[2:] == [tuple(ids.shape)] * 2  # one plain forward each
    assert torch.equal(as_training.per_token_logps, training.detach())
    torch.testing.assert_close(free, training.detach())  # another layout: equal up to rounding only


def test_a_pass_that_cannot_use_the_cache_still_shares_in_inline_rows(model):
    """Reentrant checkpointing (and ZeRO-3/FSDP2 parameters) rule out the prompt cache, not one forward over rows
    that start with their prompt: with packing allowed, the pass runs inline, the same values and gradients as one
    plain pass; a pass that packs on the cache only (`"cache"`) runs plain."""
    ids, mask, length = _batch(model.config.vocab_size, lengths=(5, 1, 2, 5, 3, 2, 5, 1))
    plain = _score_and_grads(model, ids, mask, length, share=False)
    model.gradient_checkpointing_enable({"use_reentrant": True})
    assert scoring_sharing_blocker(model) == "reentrant gradient checkpointing"
    assert scoring_sharing_blocker(model, one_pass=True) is None
    shapes = _record_forward_shapes(model)
    inline = _score_and_grads(model, ids, mask, length, share=True, packed=True)
    assert shapes == [(2, 6 + 9)]  # one pass: each prompt, then its completions (see the first test)
    torch.testing.assert_close(inline[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(inline[1], plain[1], atol=1e-5, rtol=0)
    for name, grad in plain[2].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(inline[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)
    shapes.clear()
    scoring_plan._LOGGED_BLOCKERS.clear()
    with patch.object(scoring_plan.logger, "info") as info:
        _score_and_grads(model, ids, mask, length, share=True, packed="cache")
    assert shapes == [tuple(ids.shape)]
    plain_because = "shared_prefix: some log-prob passes run plain (reentrant gradient checkpointing; no rows "
    info.assert_called_once_with(f"{plain_because}that start with their prompt either: packed='cache').")
    # dropout rules out both: the rows of a prompt would share one dropout mask over it
    model.config.attention_dropout = 0.1
    assert scoring_sharing_blocker(model, one_pass=True) == "dropout in a pass with gradients"
    shapes.clear()
    with patch.object(scoring_plan.logger, "info") as info:
        _score_and_grads(model, ids, mask, length, share=True, packed=True)
    assert shapes == [tuple(ids.shape)]
    # the cache's reason is the inline rows' too: said once
    info.assert_called_once_with("shared_prefix: some log-prob passes run plain (dropout in a pass with gradients).")


@pytest.mark.parametrize(
    "hole, reason",
    [
        ((slice(0, 4), 1), "prompts that are not left-padded"),  # a masked token inside the first prompt
        ((0, 7), "no completion token, or a completion mask with a gap"),  # a masked token inside a completion
    ],
)
def test_a_pass_without_cache_or_inline_rows_says_why(model, hole, reason):
    """Where the cache is ruled out (reentrant checkpointing) and a pass's rows cannot start with their prompt, it
    runs plain and the log says which of its rows stood in the way."""
    ids, mask, length = _batch(model.config.vocab_size)
    mask[hole] = 0
    model.gradient_checkpointing_enable({"use_reentrant": True})
    shapes = _record_forward_shapes(model)
    scoring_plan._LOGGED_BLOCKERS.clear()
    with patch.object(scoring_plan.logger, "info") as info:
        _score_and_grads(model, ids, mask, length, share=True, packed=True)
    assert shapes == [tuple(ids.shape)]
    info.assert_called_once_with(
        "shared_prefix: some log-prob passes run plain (reentrant gradient checkpointing; this pass's rows do "
        f"not start with their prompt: {reason})."
    )


def test_inline_rows_make_logits_only_where_a_completion_token_is_predicted(model):
    """Without `chunked_logprobs` the LM head makes logits at every position the model hands it. One 30-token prompt
    with two 2-token completions: the inline row holds 30 + 1 + 1 = 32 positions, of which 3 predict a completion
    token (the prompt's last, for both first tokens, then each completion's first), so the head sees those 3 (the
    plain pass: 2 rows × 3), none of the prompt's others; the log-probs, entropies and gradients are the plain pass's.
    The same where the prompt cache is ruled out (reentrant checkpointing: inline rows or nothing). A model class from
    outside transformers (remote code may read `logits_to_keep` as an int only) gets 0: logits at all 32 positions."""
    g = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.randint(3, 64, (1, 30), generator=g).repeat(2, 1), torch.randint(3, 64, (2, 2))], 1)
    mask = torch.ones_like(ids)
    head_inputs = []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: head_inputs.append(args[0].shape))
    plain = _score_and_grads(model, ids, mask, 2, share=False)
    assert head_inputs == [(2, 3, model.config.hidden_size)]
    shapes = _record_forward_shapes(model)
    for reentrant in (False, True):
        if reentrant:
            model.gradient_checkpointing_enable({"use_reentrant": True})
        shapes.clear(), head_inputs.clear()
        inline = _score_and_grads(model, ids, mask, 2, share=True, packed="inline" if not reentrant else True)
        assert shapes == [(1, 32)] and head_inputs == [(3, model.config.hidden_size)]
        _assert_same_scores(inline, plain)
    model.__class__ = type("RemoteCodeLM", (type(model),), {})  # defined here: its module is not transformers'
    shapes.clear(), head_inputs.clear()
    _assert_same_scores(_score_and_grads(model, ids, mask, 2, share=True, packed=True), plain)
    assert shapes == [(1, 32)] and head_inputs == [(1, 32, model.config.hidden_size)]


def _assert_same_scores(scores, reference):
    """`_score_and_grads` results: log-probs and entropies to 1e-5, gradients to 1e-5 of their largest entry."""
    torch.testing.assert_close(scores[0], reference[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(scores[1], reference[1], atol=1e-5, rtol=0)
    for name, grad in reference[2].items():
        torch.testing.assert_close(scores[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


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
    for packed in (False, "cache"):  # (the inline layout reads no cache)
        with torch.no_grad(), pytest.raises(RuntimeError, match="shared_prefix=False"):
            score_completions(DropsCache(model), ids, mask, length, 1.0, share_prefix=True, packed=packed)


@pytest.mark.parametrize("layout", ["cache", "inline"])
def test_lora_gradients_match(model, layout):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    ids, mask, length = _batch(model.config.vocab_size)
    plain = _score_and_grads(lora, ids, mask, length, share=False)
    shapes = _record_forward_shapes(lora)
    shared = _score_and_grads(lora, ids, mask, length, share=True, packed=layout)
    if layout == "cache":  # the shared, packed path ran (each completion alone in its row)
        assert shapes[1] == (ids.size(0), length)
    else:  # one pass, each row holding a prompt (6 tokens, 3 of them padding for the second) and its completions
        assert len(shapes) == 1 and shapes[0][0] < ids.size(0) and shapes[0][1] > 6
    assert plain[2] and all("lora_" in name for name in plain[2])
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


def test_training_with_and_without_sharing_agrees(tiny_lm_path, _arithmetic_dataset, grpo_kwargs, monkeypatch):
    """Two optimizer steps with TRL's default gradient checkpointing: the same loss, entropy and gradient norm at each
    step (Adam's first step is lr·sign(g), so equal parameters alone would not show equal gradients), the same
    parameters."""
    shared_passes = []  # (gradients on, rows) of every pass that shared its prompts: in a cache, or inline
    make_cache, pack = scoring_plan.shared_prefix_cache, scoring_plan.pack_completions

    def counting(model, ids, *args):
        cache = make_cache(model, ids, *args)
        if cache is not None:
            shared_passes.append((torch.is_grad_enabled(), ids.size(0)))
        return cache

    def counting_inline(ids, *args):
        plan = pack(ids, *args)
        if plan is not None and plan.inline:
            shared_passes.append((torch.is_grad_enabled(), ids.size(0)))
        return plan

    monkeypatch.setattr(scoring_plan, "shared_prefix_cache", counting)
    monkeypatch.setattr(scoring_plan, "pack_completions", counting_inline)
    params, logged = {}, {}
    for share in (False, True):
        kwargs = {**grpo_kwargs, "gradient_checkpointing": True, "max_steps": 2, "shared_prefix": share}
        # the tolerances below were sized on torch.multinomial's samples of this seed; with the inverse-CDF draws one
        # parameter of 8,192 ends 1.2e-4 apart (Adam's near-sign first steps on a near-zero gradient)
        kwargs["inverse_cdf_sampling"] = False
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


ROPE_TYPES = ["default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"]
LENGTH_SCALED = {"dynamic", "longrope"}  # their frequencies follow max(position_ids) + 1 of each forward
MAX_POSITIONS, ORIGINAL_MAX_POSITIONS, HEAD_DIM = 16, 8, 8


def _rope_llama(rope_type):
    """A random 2-layer Llama with the given RoPE (transformers 5.x spells it `rope_parameters`): scaling above
    `original_max_position_embeddings` = 8 (`longrope`, `yarn`, `llama3`) or `max_position_embeddings` = 16
    (`dynamic`); weights large enough that a change of frequencies shows in the log-probs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    params = {"rope_type": rope_type, "rope_theta": 10000.0}
    original = {"original_max_position_embeddings": ORIGINAL_MAX_POSITIONS}
    params.update(
        {
            "linear": {"factor": 4.0},
            "dynamic": {"factor": 4.0},
            "yarn": {"factor": MAX_POSITIONS / ORIGINAL_MAX_POSITIONS, **original},
            "longrope": {
                "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                "long_factor": [2.0 + 0.5 * i for i in range(HEAD_DIM // 2)],
                "factor": MAX_POSITIONS / ORIGINAL_MAX_POSITIONS,
                **original,
            },
            "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, **original},
            "proportional": {"partial_rotary_factor": 0.5},
        }.get(rope_type, {})
    )
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,
        rope_parameters=params,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_every_rope_type_of_transformers_is_covered():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}


@pytest.mark.parametrize(
    "prompt_length, completion_length",
    [
        (6, 14),  # prompt pass: 5 positions (< 8); whole sequence: 20 (> 16): across both limits
        (12, 3),  # prompt pass: 11 (> 8); whole sequence: 15 (< 16): on one side of each limit
    ],
)
@pytest.mark.parametrize("packed", [False, "cache", "inline"])
@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_shared_scoring_is_exact_for_every_rope_type(rope_type, prompt_length, completion_length, packed):
    """Where a RoPE rescales with the sequence length and the prompt pass would see other frequencies than the
    whole sequence, the pass runs plain (bitwise the plain result); everywhere else it shares, within 1e-5."""
    model = _rope_llama(rope_type)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 64, (2, prompt_length), generator=g).repeat_interleave(3, 0)
    ids = torch.cat([prompts, torch.randint(1, 64, (6, completion_length), generator=g)], 1)
    mask = torch.ones_like(ids)
    mask[:3, :2] = 0  # a left-padded prompt
    blocked = rope_type in LENGTH_SCALED and completion_length == 14
    scoring_plan._LOGGED_BLOCKERS.clear()
    with torch.no_grad(), patch.object(scoring_plan.logger, "info") as info:
        plain = score_completions(model, ids, mask, completion_length, 1.0).per_token_logps
        shapes = _record_forward_shapes(model)
        kwargs = dict(share_prefix=True, packed=packed)
        shared = score_completions(model, ids, mask, completion_length, 1.0, **kwargs).per_token_logps
        score_completions(model, ids, mask, completion_length, 1.0, **kwargs)
    assert (shared - plain).abs().max() <= 1e-5
    if blocked:
        assert shapes == [tuple(ids.shape)] * 2
        assert torch.equal(shared, plain)
        info.assert_called_once_with(
            f"shared_prefix: some log-prob passes run plain ({rope_type} RoPE, whose frequencies depend on "
            "the sequence length)."
        )
    elif packed == "inline" and rope_type not in LENGTH_SCALED:  # one pass, rows that start with their prompt
        assert len(shapes) == 2 and shapes[0] == shapes[1] and shapes[0][1] > prompt_length
        info.assert_not_called()
    else:
        # it shared (packed: every row as long as the longest, so one completion per row and no extra position; a
        # length-scaled RoPE is not given inline rows)
        assert shapes[:2] == [(2, prompt_length - 1), (6, completion_length + (not packed))]
        info.assert_not_called()
    reason = f"{rope_type} RoPE, whose frequencies depend on the sequence length"
    assert scoring_sharing_blocker(model) is None  # the RoPE is decided per pass, from its lengths
    lengths = torch.ones(2, 20, dtype=torch.long)
    lengths[1, :3] = 0  # the longer row decides: a prompt pass over 5 positions, a forward over 20
    assert split_lengths(lengths, 6) == (5, 20)
    assert rope_sharing_blocker(model, 5, 20) == (reason if rope_type in LENGTH_SCALED else None)


def test_packed_rows_that_leave_out_the_longest_prompt_keep_longrope_exact():
    """Packed rows leave out rows with no completion token (e.g. truncated ones under `mask_truncated_completions`):
    here every row of the 11-token prompt. The prompt pass then reaches 10 positions (above `longrope`'s limit of 8,
    long factors) and the packed rows only 5 (short factors), where one plain forward reaches 14 (long): the pass
    runs padded instead, as exact as the plain one."""
    model = _rope_llama("longrope")
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 64, (2, 11), generator=g).repeat_interleave(2, 0)
    ids = torch.cat([prompts, torch.randint(1, 64, (4, 3), generator=g)], 1)
    mask = torch.ones_like(ids)
    mask[2:, :8] = 0  # the second prompt: 3 tokens, left-padded
    mask[:2, 11:] = 0  # the first prompt's rows: no completion token
    shapes = _record_forward_shapes(model)
    with torch.no_grad():
        plain = score_completions(model, ids, mask, 3, 1.0).per_token_logps
        packed = score_completions(model, ids, mask, 3, 1.0, share_prefix=True, packed=True).per_token_logps
    assert shapes[1:] == [(2, 10), (4, 4)]  # shared, padded
    assert (packed - plain).abs().max() <= 1e-5


def test_split_lengths_counts_the_attended_tokens_of_the_longest_row():
    """The positions the prompt pass (the first P - 1 columns) and the whole forward reach: `max(position_ids) + 1`
    as scoring numbers them, so scoring and generation decide the RoPE check on the same numbers."""
    from trl.scoring.prefix_sharing import position_ids_from_mask

    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    for prompt_length in (2, 3, 4, 5):
        prefix, total = split_lengths(mask, prompt_length)
        assert prefix == int(position_ids_from_mask(mask[:, : prompt_length - 1]).max()) + 1
        assert total == int(position_ids_from_mask(mask).max()) + 1 == 5
    assert split_lengths(mask, 4) == (3, 5)


@pytest.mark.parametrize("packed", [False, "cache", "inline"])
def test_prompt_pass_runs_inside_the_data_parallel_wrapper(model, packed):
    """Under DDP each wrapped forward broadcasts buffers, and ranks decide on sharing from their own data: the prompt
    pass runs on the wrapped module, so a shared pass makes one wrapped forward, as a plain one does (here
    `nn.DataParallel`, which on CPU calls its module as DDP does). Same values and gradients as one plain pass."""
    wrapper = torch.nn.DataParallel(model)
    calls = []
    wrapper.register_forward_pre_hook(lambda module, args: calls.append(1))
    ids, mask, length = _batch(model.config.vocab_size)
    plain = _score_and_grads(wrapper, ids, mask, length, share=False)
    assert len(calls) == 1
    shapes = _record_forward_shapes(model)
    shared = _score_and_grads(wrapper, ids, mask, length, share=True, packed=packed)
    completions = (ids.size(0), length + (not packed))  # packed: one completion a row, no extra position
    assert len(calls) == 2  # one wrapped forward per pass, whichever way it runs
    if packed == "inline":  # one pass on rows that hold their prompt
        assert len(shapes) == 1 and shapes[0][1] > ids.size(1) - length
    else:
        assert shapes == [(2, ids.size(1) - length - 1), completions]
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_shared_prefix_generation_is_exact_for_every_rope_type(rope_type):
    """`generate` prefills the prompt in one forward; with a shared prefix the prompt pass sees all but the last
    prompt token and generate's first step the whole prompt. Seeded sampling with the logits of every step: equal
    draws and logits within 1e-5 against plain `generate`, at prompt lengths where the two passes would see other
    RoPE frequencies (longrope: 9 tokens, just over its limit of 8; dynamic: 17 > 16) and at one where they do not."""
    from transformers import GenerationConfig

    from trl.generation.grpo_generation import sample_completions

    config = GenerationConfig(
        max_new_tokens=6, do_sample=True, top_k=0, pad_token_id=0, eos_token_id=None, disable_compile=True,
        return_dict_in_generate=True, output_logits=True,
    )  # fmt: skip
    batches = []
    for prompt_length in (ORIGINAL_MAX_POSITIONS + 1, MAX_POSITIONS + 1, 5):
        ids = torch.randint(1, 64, (2, prompt_length), generator=torch.Generator().manual_seed(0))
        ids, mask = ids.repeat_interleave(3, 0), torch.ones(6, prompt_length, dtype=torch.long)
        outputs = {}
        for implementation in ("generate", "shared_prefix"):
            # a fresh model each time: `dynamic` keeps the frequencies a longer forward grew, so even two plain
            # `generate` calls on one model can differ (transformers' own behaviour)
            model = _rope_llama(rope_type)
            generate = model.generate
            model.generate = lambda generate=generate, **kwargs: (
                outputs.setdefault(implementation, generate(**kwargs)).sequences
            )
            torch.manual_seed(0)
            sample_completions(model, ids, mask, config, implementation)
        plain, shared = outputs["generate"], outputs["shared_prefix"]
        assert torch.equal(plain.sequences, shared.sequences)
        for a, b in zip(plain.logits, shared.logits, strict=True):
            assert (a - b).abs().max() <= 1e-5, (prompt_length, (a - b).abs().max())
        batches.append((prompt_length, model, ids, mask))
    from trl.generation.grpo_generation import shared_prefix_blocker

    crosses = {"longrope": ORIGINAL_MAX_POSITIONS + 1, "dynamic": MAX_POSITIONS + 1}.get(rope_type)
    for prompt_length, model, ids, mask in batches:  # plain generate exactly where the two passes would differ
        blocker = shared_prefix_blocker(model, ids, mask, config)
        assert (blocker is not None) == (prompt_length == crosses), blocker


def test_the_prefix_rows_gradient_is_the_same_in_every_run():
    """The read-only prefix expands U prompts to N rows; the backward sums each prompt's N/U row gradients. With
    `keys[inverse]` that sum ran as multi-threaded atomic adds on the CPU (from 32,768 elements on), in an order that
    changed from run to run: a resumed run then differed from an uninterrupted one in the last bits."""
    from trl.scoring.prefix_sharing import _PrefixLayer

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        keys = torch.randn(1, 3, 43, 64, generator=g, requires_grad=True)  # 8 rows of one prompt: 66,048 elements
        values = torch.randn(1, 3, 43, 64, generator=g, requires_grad=True)
        new = torch.randn(8, 3, 5, 64, generator=g)
        weights = torch.randn(8, 3, 48, 64, generator=g)
        grads = set()
        for _ in range(50):
            layer = _PrefixLayer(keys, values, torch.zeros(8, dtype=torch.long))
            k, v = layer.update(new, new)
            grad_k, grad_v = torch.autograd.grad(((k + v) * weights).sum(), [keys, values])
            torch.testing.assert_close(grad_k, weights[:, :, :43].sum(0, keepdim=True), rtol=1e-5, atol=1e-5)
            grads.add((grad_k.numpy().tobytes(), grad_v.numpy().tobytes()))
        assert len(grads) == 1
    finally:
        torch.set_num_threads(threads)


def _hand_worked_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt A = [11, 12, 13] (rows 0-2), prompt B = [pad, 22, 23] (row 3); completions of 3, 1, 2 and 2 tokens."""
    ids = torch.tensor(
        [
            [11, 12, 13, 101, 102, 103],
            [11, 12, 13, 111, 0, 0],
            [11, 12, 13, 121, 122, 0],
            [0, 22, 23, 131, 132, 0],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0]])
    return ids, mask


def test_pack_completions_lays_out_each_completion_on_its_prompt():
    """A hand-worked packing: prompt A = [11, 12, 13] (rows 0-2), prompt B = [pad, 22, 23] (row 3); completions of
    3, 1, 2 and 2 tokens. Rows of 3 (the longest), filled longest first: row 0; row 2 then row 1 (A); row 3 (B)."""
    ids, mask = _hand_worked_batch()
    plan = pack_completions(ids, mask, 3, torch.tensor([0, 0, 0, 1]))
    # each completion: its last prompt token, then its tokens but the last; slack (row 2's end) holds 0
    assert plan.input_ids.tolist() == [[13, 101, 102], [13, 121, 13], [23, 131, 0]]
    # positions over the attended tokens: A's last prompt token is at 2, B's (left-padded) at 1
    assert plan.position_ids.tolist() == [[2, 3, 4], [2, 3, 2], [1, 2, 0]]
    assert plan.rows.tolist() == [0, 2, 3]
    # flat packed index -> flat (N, L) index of the token it predicts, and that token
    assert plan.source.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert plan.dest.tolist() == [0, 1, 2, 6, 7, 3, 9, 10]
    assert plan.targets.tolist() == [101, 102, 103, 121, 122, 111, 131, 132]
    assert plan.attention_mask.shape == (3, 1, 3, 2 + 3)
    expected = [
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],  # row 0 alone: its prompt, then causal
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]],  # row 2's two positions, then row 1's one
        [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 1]],  # B's padded first token unseen; slack sees itself
    ]
    assert plan.attention_mask[:, 0].long().tolist() == expected
    # a completion mask that is not each row's first tokens, or no token at all: nothing to pack
    holes = mask.clone()
    holes[0, 4] = 0
    assert pack_completions(ids, holes, 3, torch.tensor([0, 0, 0, 1])) is None
    empty = mask.clone()
    empty[:, 3:] = 0
    assert pack_completions(ids, empty, 3, torch.tensor([0, 0, 0, 1])) is None


def test_inline_packing_puts_each_prompt_at_the_start_of_its_row():
    """The batch of the test above, inline: prompt A = [11, 12, 13] (rows 0-2), B = [pad, 22, 23] (row 3). Segments
    are the completion tokens but the last (2, 0, 1, 1 positions); positions only in the estimate, so A's rows end to
    end (3 + 3) beat two rows of 3 + 2: [A | row 0 | row 2 | row 1 (empty)], [B | row 3 | slack]."""
    ids, mask = _hand_worked_batch()
    plan = pack_completions(ids, mask, 3, torch.tensor([0, 0, 0, 1]), 1e9, "inline")
    assert plan.inline and plan.rows.tolist() == [0, 3]
    assert plan.input_ids.tolist() == [[11, 12, 13, 101, 102, 121], [22, 23, 131, 0, 0, 0]]
    # positions over the attended tokens: each completion continues its prompt; slack at 0
    assert plan.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 0, 0, 0]]
    # the prompt's last position (flat 2 for A, 7 for B) predicts the first token of each of its completions
    assert plan.source.tolist() == [2, 3, 4, 2, 5, 2, 7, 8]
    assert plan.dest.tolist() == [0, 1, 2, 6, 7, 3, 9, 10]
    assert plan.targets.tolist() == [101, 102, 103, 121, 122, 111, 131, 132]
    assert plan.attention_mask.shape == (2, 1, 6, 6)
    expected = [
        # the prompt causal; row 0's tokens see the prompt and themselves; row 2's token the prompt and itself
        [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0],
         [1, 1, 1, 0, 0, 1]],
        # B's two attended prompt tokens, row 3's token; slack sees itself only
        [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0],
         [0, 0, 0, 0, 0, 1]],
    ]  # fmt: skip
    assert plan.attention_mask[:, 0].long().tolist() == expected
    # a prompt whose attended tokens are not its last ones cannot go inline: the cache layout instead
    holes = mask.clone()
    holes[0:3, 1] = 0
    assert not pack_completions(ids, holes, 3, torch.tensor([0, 0, 0, 1]), 1e9, "inline").inline
    with pytest.raises(ValueError, match="layout must be 'cache', 'inline' or 'auto', not 'rows'"):
        pack_completions(ids, mask, 3, torch.tensor([0, 0, 0, 1]), layout="rows")


def test_auto_layout_charges_the_prompt_pass():
    """One 10-token prompt (K = 9 cached positions), positions only. Two 2-token completions: cache 2 × 2 + 2.5 × 9
    = 26.5 against inline 2 rows × (10 + 1) = 22: inline. Four 8-token ones: cache 4 × 8 + 22.5 = 54.5 against
    inline 4 × (10 + 7) = 68: the cache layout."""
    from trl.scoring.prefix_sharing import PROMPT_PASS_COST_FACTOR

    assert PROMPT_PASS_COST_FACTOR == 2.5
    for rows, tokens, inline in ((2, 2, True), (4, 8, False)):
        ids = torch.randint(3, 50, (rows, 10 + tokens), generator=torch.Generator().manual_seed(0))
        ids[:, :10] = ids[0, :10]
        plan = pack_completions(ids, torch.ones_like(ids), 10, torch.zeros(rows, dtype=torch.long), layout="auto")
        assert plan.inline == inline
        assert plan.input_ids.shape == ((rows, 10 + tokens - 1) if inline else (rows, tokens))


def test_pack_completions_widens_rows_where_that_saves_positions():
    """One prompt, completions of 4, 3, 3 and 2 tokens (12 positions). Rows of 4: [4], [3], [3], [2] = 16
    positions; rows of 6: [4, 2], [3, 3] = 12. The attention's cost per pair of positions decides between them."""
    ids = torch.randint(3, 50, (4, 2 + 4), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for row, n in enumerate([4, 3, 3, 2]):
        mask[row, 2 + n :] = 0
    inverse = torch.zeros(4, dtype=torch.long)
    assert pack_completions(ids, mask, 2, inverse).input_ids.shape == (4, 4)  # no cost given: the longest's width
    assert pack_completions(ids, mask, 2, inverse, 1e9).input_ids.shape == (2, 6)  # positions only
    # attention (pairs of positions, 1 cached prompt position) at 1/4 position a pair: 4 × 4 × (1 + 5/4) = 36
    # against 2 × 6 × (1 + 7/4) = 33; at 2 positions a pair: 16 × 11 = 176 against 12 × 15 = 180
    assert pack_completions(ids, mask, 2, inverse, 4.0).input_ids.shape == (2, 6)
    assert pack_completions(ids, mask, 2, inverse, 0.5).input_ids.shape == (4, 4)


@pytest.mark.parametrize("layout", ["cache", "inline"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", PACKABLE_MODEL_TYPES)
def test_packed_scoring_is_exact_for_every_packable_model_type(model_type, attention, layout):
    """Each model type allowed to pack, with SDPA (a boolean mask) and eager attention (an additive one): packed
    log-probs and gradients against the padded pass on the shared prompt, to float rounding, from fewer positions."""
    from transformers import AutoConfig

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=8)
    # no sliding window (Mistral's default has one): a sliding-window cache scores plain, shared or not
    config = AutoConfig.for_model(model_type, vocab_size=64, num_key_value_heads=2, pad_token_id=0, **sizes)
    config.sliding_window = None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention).float().train()
    assert packing_blocker(model) is None
    ids, mask, length = _batch(64, lengths=(5, 1, 2, 5, 3, 2, 5, 1))
    padded = _score_and_grads(model, ids, mask, length, share=True)
    shapes = _record_forward_shapes(model)
    packed = _score_and_grads(model, ids, mask, length, share=True, packed=layout)
    # the prompt pass, then rows of 7 positions, two completions each; or one pass over rows that start with their
    # prompt (see the first test)
    assert shapes == ([(2, ids.size(1) - length - 1), (4, 7)] if layout == "cache" else [(2, 15)])
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    for name, grad in padded[2].items():
        torch.testing.assert_close(packed[2][name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


def test_other_models_and_attention_kernels_score_padded(model):
    """A model type not checked above, or an attention implementation that takes no 4-D mask: padded, logged once."""
    ids, mask, length = _batch(model.config.vocab_size, lengths=(5, 1, 2, 5, 3, 2, 5, 1))
    model.config.model_type = "qwen2_custom"  # as a remote-code model's own type would be
    assert packing_blocker(model) == "model type 'qwen2_custom', whose handling of a 4-D mask is not tested"
    scoring_plan._LOGGED_BLOCKERS.clear()
    shapes = _record_forward_shapes(model)
    with torch.no_grad(), patch.object(scoring_plan.logger, "info") as info:
        for _ in range(2):
            score_completions(model, ids, mask, length, 1.0, share_prefix=True, packed=True)
    assert shapes[1] == shapes[3] == (ids.size(0), length + 1)
    info.assert_called_once_with(
        "shared_prefix (packed rows): some log-prob passes run plain (model type 'qwen2_custom', whose handling of a "
        "4-D mask is not tested)."
    )
    model.config.model_type = "qwen2"
    model.config._attn_implementation = "flash_attention_2"
    assert packing_blocker(model) == "attention implementation 'flash_attention_2'"


def test_generation_cache_writes_in_place_until_its_room_is_used_up():
    from trl.scoring.prefix_sharing import _PreallocatedLayer

    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 4, 8, generator=g)
    layer = _PreallocatedLayer(keys, values, room=3)
    buffer = layer.buffers[0]
    steps = [(torch.randn(2, 3, 1, 8, generator=g), torch.randn(2, 3, 1, 8, generator=g)) for _ in range(4)]
    expected_keys, expected_values = keys, values
    for index, (k, v) in enumerate(steps):
        out_keys, out_values = layer.update(k, v)
        expected_keys, expected_values = torch.cat([expected_keys, k], -2), torch.cat([expected_values, v], -2)
        assert torch.equal(out_keys, expected_keys) and torch.equal(out_values, expected_values)
        # in the buffer for 3 steps; the 4th no longer fits and is concatenated, as DynamicLayer does
        assert (out_keys.data_ptr() == buffer.data_ptr()) == (index < 3)
        assert layer.get_seq_length() == 5 + index
    # after anything replaced the views (here a crop), it concatenates too
    layer = _PreallocatedLayer(keys, values, room=3)
    layer.crop(-1)
    out_keys, _ = layer.update(*steps[0])
    assert out_keys.data_ptr() != layer.buffers[0].data_ptr()
    assert torch.equal(out_keys, torch.cat([keys[..., :3, :], steps[0][0]], -2))
