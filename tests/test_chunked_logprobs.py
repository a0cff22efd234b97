# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The block-wise LM-head log-probs (`chunked_logprobs`) and the sparse tied-embedding gradient against the plain
computation: values and gradients to float rounding, the paths taken, and what is restored."""

import logging
import threading
from unittest.mock import patch

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from trl.scoring import grouped_kv_attention, scoring_plan
from trl.scoring.chunked_logprobs import head_logprobs
from trl.scoring.grpo_scoring import score_completions
from trl.scoring.lm_head import (
    cast_lm_head_to_fp32,
    chunked_logprobs_blocker,
    sparse_tied_embedding_grad,
    tied_input_embedding,
)
from trl.scoring.weight_grads import TiedGradSink, _TiedLookup
from trl.trainer.grpo_losses import selective_log_softmax


def plain_head_logprobs(hidden, weight, bias, index, temperature):
    logits = F.linear(hidden, weight, bias).float() / temperature
    return selective_log_softmax(logits, index, return_entropy=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_logprobs_equal_the_plain_log_softmax_with_gradients(bias, temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True) if bias else None
    index = torch.randint(0, 50, (3, 7), generator=g)
    w_logp, w_ent = torch.rand(3, 7, generator=g), torch.rand(3, 7, generator=g)
    grads = {}
    for name in ("plain", "blocks"):
        inputs = [hidden, weight] + ([b] if bias else [])
        if name == "plain":
            logp, ent = plain_head_logprobs(hidden, weight, b, index, temperature)
        else:  # 4 float32 logits rows per block: 6 blocks, the last one short
            logp, ent = head_logprobs(hidden, weight, b, index, temperature, True, block_bytes=4 * 50 * 4)
        grads[name] = (logp.detach(), ent.detach(), torch.autograd.grad((logp * w_logp + ent * w_ent).sum(), inputs))
    torch.testing.assert_close(grads["blocks"][0], grads["plain"][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads["blocks"][1], grads["plain"][1], rtol=1e-6, atol=1e-6)
    for got, want in zip(grads["blocks"][2], grads["plain"][2]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_head_logprobs_single_block_is_kept_for_the_backward():
    """One block (the default for a small batch): the forward's log-probs serve the backward, which does not
    recompute them; a second backward of the same graph recomputes and gets the same gradients."""
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 5, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    index = torch.randint(0, 50, (2, 5), generator=g)
    plain_logp, plain_ent = plain_head_logprobs(hidden, weight, None, index, 0.7)
    want = torch.autograd.grad((plain_logp * 0.3 + plain_ent * 0.1).sum(), [hidden, weight])
    products, linear = [], F.linear
    with patch("trl.scoring.chunked_logprobs.F.linear", side_effect=lambda *a: products.append(1) or linear(*a)):
        logp, ent = head_logprobs(hidden, weight, None, index, 0.7, True)
        loss = (logp * 0.3 + ent * 0.1).sum()
        first = torch.autograd.grad(loss, [hidden, weight], retain_graph=True)
        assert len(products) == 1  # the forward's only: the backward used the kept block
        second = torch.autograd.grad(loss, [hidden, weight])
        assert len(products) == 2  # recomputed
    for got, again, expected in zip(first, second, want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(got, again)


def test_head_logprobs_without_entropy_and_in_bf16():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 5, 8, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(30, 8, generator=g).bfloat16().requires_grad_()
    index = torch.randint(0, 30, (2, 5), generator=g)
    logp, entropy = head_logprobs(hidden, weight, None, index, block_bytes=3 * 30 * 4)
    assert entropy is None and logp.dtype == torch.float32
    want = plain_head_logprobs(hidden, weight, None, index, 1.0)[0]
    torch.testing.assert_close(logp, want, rtol=0, atol=1e-5)  # the same bf16 products, cast to float32
    got_grads = torch.autograd.grad(logp.sum(), [hidden, weight])
    want_grads = torch.autograd.grad(want.sum(), [hidden, weight])
    for got, want_grad in zip(got_grads, want_grads):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want_grad.float(), rtol=2e-2, atol=2e-2)  # bf16 rounding


def test_head_logprobs_float32_head_projects_in_float32():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(4, 8, generator=g).bfloat16()
    weight = torch.randn(30, 8, generator=g)
    index = torch.randint(0, 30, (4,), generator=g)
    logp, _ = head_logprobs(hidden, weight, None, index, head_dtype=torch.float32)
    want = selective_log_softmax(F.linear(hidden.float(), weight).unsqueeze(0), index.unsqueeze(0))[0]
    torch.testing.assert_close(logp, want, rtol=1e-6, atol=1e-6)


def test_head_logprobs_refuses_mismatched_shapes():
    with pytest.raises(
        ValueError, match=r"hidden states of shape \(2, 5, 8\) do not match token ids of shape \(2, 4\)"
    ):
        head_logprobs(torch.zeros(2, 5, 8), torch.zeros(30, 8), None, torch.zeros(2, 4, dtype=torch.long))


def batch(vocab_size: int, rows: int = 6, prompt: int = 20, completion: int = 6):
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, vocab_size, (2, prompt), generator=g).repeat_interleave(rows // 2, 0)
    ids = torch.cat([prompts, torch.randint(3, vocab_size, (rows, completion), generator=g)], 1)
    mask = torch.ones_like(ids)
    mask[::2, :2] = 0  # left padding on some rows
    mask[1::3, -2:] = 0  # completions that ended early
    return ids, mask


def scores_and_grads(model, ids, mask, **kwargs):
    model.zero_grad(set_to_none=True)
    scores = score_completions(model, ids, mask, 6, 0.7, compute_entropy=True, entropy_grad=True, **kwargs)
    ((scores.per_token_logps * 0.3 + scores.entropies * 0.1) * mask[:, -6:]).sum().backward()
    return scores, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(chunked_logprobs=True),
        dict(sparse_embedding_grad=True),
        dict(chunked_logprobs=True, sparse_embedding_grad=True, share_prefix=True, min_prefix_tokens=4),
    ],
    ids=["chunked", "sparse_embedding", "all_with_shared_prefix"],
)
def test_score_completions_paths_equal_the_plain_pass(tiny_lm_path, kwargs):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    assert tied_input_embedding(model) is model.model.embed_tokens  # the tiny Qwen2 ties its embeddings
    ids, mask = batch(model.config.vocab_size)
    plain, plain_grads = scores_and_grads(model, ids, mask)
    calls, rerouted = [], []
    model.lm_head.register_forward_hook(lambda module, args, out: calls.append(tuple(out.shape)))
    model.model.embed_tokens.register_forward_pre_hook(lambda module, args: rerouted.append("forward" in vars(module)))
    with torch.profiler.profile(record_shapes=True) as profile:
        scores, grads = scores_and_grads(model, ids, mask, **kwargs)
    passes = 2 if kwargs.get("share_prefix") else 1  # the prompt pass, then the completions on its cache
    assert rerouted == [kwargs.get("sparse_embedding_grad", False)] * passes
    # copies of the tied weight's (V, H) gradient: autograd adds a lookup's sparse rows to the LM head's dense
    # gradient out of place, one copy per lookup; none when the block-wise head collects the rows
    vh = [model.config.vocab_size, model.config.hidden_size]
    counts = {e.key: e.count for e in profile.key_averages(group_by_input_shape=True) if e.input_shapes[:1] == [vh]}
    copies = counts.get("aten::copy_", 0) - counts.get("aten::clone", 0)  # not the clone of `scores_and_grads`
    if kwargs.get("sparse_embedding_grad"):
        assert copies == (0 if kwargs.get("chunked_logprobs") else passes)
    torch.testing.assert_close(scores.per_token_logps, plain.per_token_logps, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.entropies, plain.entropies, rtol=1e-5, atol=1e-5)
    assert grads.keys() == plain_grads.keys() and not any(g.is_sparse for g in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    vocab = model.config.vocab_size
    # the chunked path's head returns no logits (0 positions); the plain one, the 7 kept positions' logits
    assert calls[-1] == ((6, 0, vocab) if kwargs.get("chunked_logprobs") else (6, 7, vocab))
    assert "forward" not in vars(model.lm_head) and "forward" not in vars(model.model.embed_tokens)  # all restored


def test_sparse_tied_embedding_grad_reroutes_only_where_it_applies(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    embedding = model.get_input_embeddings()
    with sparse_tied_embedding_grad(model) as rerouted:
        assert rerouted is embedding and "forward" in vars(embedding)
    assert "forward" not in vars(embedding)
    with torch.no_grad(), sparse_tied_embedding_grad(model) as rerouted:
        assert rerouted is None and "forward" not in vars(embedding)  # nothing to save without gradients
    embedding.weight.requires_grad_(False)
    assert tied_input_embedding(model) is None  # frozen (as under LoRA)
    embedding.weight.requires_grad_(True)
    embedding.scale_grad_by_freq = True  # a gradient scaled by token counts: left to nn.Embedding
    assert tied_input_embedding(model) is None
    embedding.scale_grad_by_freq = False
    model.lm_head.weight = nn.Parameter(embedding.weight.detach().clone())  # untied
    assert tied_input_embedding(model) is None
    with sparse_tied_embedding_grad(model) as rerouted:
        assert rerouted is None and "forward" not in vars(embedding)


def tied_pass(weight, ids, sink, padding_idx=None, lookups=1):
    """One pass of a tied weight: `lookups` embedding lookups of `ids`, then the block-wise head on their sum."""
    hidden = sum(_TiedLookup.apply(ids, weight, sink, padding_idx) for _ in range(lookups))
    return head_logprobs(hidden[:, :-1], weight, None, ids[:, 1:], grad_sink=sink)[0]


def test_tied_grad_sink_hands_autograd_one_dense_sum():
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 40, (3, 6), generator=g)
    ids[0, :2] = 5  # the padding id: its row gets no gradient from the lookups
    plain = F.embedding(ids, weight, padding_idx=5)
    plain = plain + F.embedding(ids, weight, padding_idx=5)
    want = torch.autograd.grad(head_logprobs(plain[:, :-1], weight, None, ids[:, 1:])[0].sum(), weight)[0]
    sink = TiedGradSink()
    logps = tied_pass(weight, ids, sink, padding_idx=5, lookups=2)
    assert sink.registered == 3  # two lookups and the head
    got = torch.autograd.grad(logps.sum(), weight, retain_graph=True)[0]
    assert not got.is_sparse
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # a second backward of the same graph (retain_graph): the sink starts over and gives the same sum
    torch.testing.assert_close(torch.autograd.grad(logps.sum(), weight)[0], want, rtol=1e-6, atol=1e-6)
    # without a sink the lookup's rows come back sparse
    rows = torch.autograd.grad(_TiedLookup.apply(ids, weight, None, 5).sum(), weight)[0]
    assert rows.is_sparse
    torch.testing.assert_close(rows.to_dense(), torch.autograd.grad(F.embedding(ids, weight, 5).sum(), weight)[0])


def tiny_llama(tied: bool) -> nn.Module:
    """A random 2-layer, 64-wide Llama (512-token vocabulary, GQA) in eval mode, the same weights for a given `tied`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("chunked", [True, False], ids=["sink", "sparse rows"])
def test_tied_embedding_gradient_in_bf16_is_summed_in_float32(chunked):
    # A tiny bf16 Llama with tied embeddings whose prompts repeat 6 token ids, so each looked-up row of the embedding
    # gathers dozens of additions: the shared weight's gradient against the float64 model's, relative error. Measured:
    # plain 1.21e-2; row gradient into the float32 sink (with chunked log-probs) 5.9e-3 (6.0e-3 when the sink summed in
    # bf16); sparse rows alone 7.2e-3 (1.75e-2 when their repeats were summed in bf16, 1.4× worse than plain).
    model64 = tiny_llama(tied=True).double()
    g = torch.Generator().manual_seed(1)
    ids = torch.cat(
        [
            torch.randint(0, 6, (4, 24), generator=g).repeat_interleave(4, 0),
            torch.randint(0, 6, (16, 10), generator=g),
        ],
        1,
    )
    advantages = torch.randn(16, 1, generator=g)

    def tied_grad(model, **kwargs):
        out = score_completions(model, ids, torch.ones_like(ids), 10, 0.7, **kwargs)
        (out.per_token_logps * advantages).sum().backward()
        return model.get_input_embeddings().weight.grad.double()

    want = tied_grad(model64)
    fast = dict(sparse_embedding_grad=True, chunked_logprobs=chunked, share_prefix=chunked, packed=chunked)
    errors = {}
    for name, kwargs in {"plain": {}, "fast": fast}.items():
        model = tiny_llama(tied=True).to(torch.bfloat16)
        model.load_state_dict(model64.state_dict())
        got = tied_grad(model, **kwargs)
        errors[name] = ((got - want).norm() / want.norm()).item()
    assert errors["fast"] < errors["plain"], errors


def test_tied_grad_sink_sums_bf16_rows_in_float32_and_rounds_once():
    # 20 lookups of the same 3 ids in one pass (the head and each lookup add into one sink): the sink hands autograd
    # the float32 sum of their bf16 gradients, rounded once to bf16, bit for bit. A bf16 sum, as before, rounded after
    # each lookup's addition: 65 % of the looked-up rows' entries differed from this one.
    g = torch.Generator().manual_seed(6)
    weight = torch.randn(8, 16, generator=g).bfloat16().requires_grad_(True)
    ids = torch.tensor([1, 4, 6] * 10)
    upstream = [torch.randn(30, 16, generator=g).bfloat16() for _ in range(20)]
    sink = TiedGradSink()
    sum((_TiedLookup.apply(ids, weight, sink, None) * u).sum() for u in upstream).backward()
    want = torch.zeros(8, 16)
    for u in upstream:
        want.index_add_(0, ids, u.float())
    assert weight.grad.dtype == torch.bfloat16 and torch.equal(weight.grad, want.bfloat16())


def test_one_temperature_rule_on_the_plain_and_chunked_paths_in_bf16():
    # Both paths cast the bf16 logits to float32, then divide by the temperature. Measured on this tiny bf16 Llama:
    # the two differ by at most 4.8e-7 at T = 1 and 9.5e-7 at T = 0.7 (the head's products, rounded differently);
    # when the plain path divided the bf16 logits in bf16, they differed by 1.1e-3 at T = 0.7.
    model = tiny_llama(tied=False).to(torch.bfloat16)
    ids = torch.randint(0, 512, (6, 30), generator=torch.Generator().manual_seed(1))
    gaps = {}
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            plain = score_completions(model, ids, torch.ones_like(ids), 10, temperature).per_token_logps
            chunked = score_completions(model, ids, torch.ones_like(ids), 10, temperature, chunked_logprobs=True)
            gaps[temperature] = (plain - chunked.per_token_logps).abs().max().item()
    assert gaps[0.7] <= 4 * gaps[1.0] + 1e-6, gaps


def test_tied_grad_sink_refuses_to_drop_a_gradient():
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 40, (2, 5), generator=g)
    sink = TiedGradSink()
    logps = tied_pass(weight, ids, sink)
    orphan = _TiedLookup.apply(ids, weight, sink, None)  # registered, but the loss never reads it
    assert orphan.requires_grad
    with pytest.raises(
        RuntimeError,
        match=r"1 of 3 uses of the tied embedding weight got no gradient .*"
        r"set `chunked_logprobs=False`",
    ):
        logps.sum().backward()


def test_chunked_logprobs_runs_plain_for_logit_transforms_and_adapted_heads(tiny_lm_path, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    assert chunked_logprobs_blocker(model) is None
    model.config.final_logit_softcapping = 30.0
    assert chunked_logprobs_blocker(model) == "final_logit_softcapping=30.0 in the model config"
    ids, mask = batch(model.config.vocab_size)
    scoring_plan._LOGGED_BLOCKERS.clear()
    with caplog.at_level(logging.INFO, logger="trl.scoring.scoring_plan"):
        scores = score_completions(model, ids, mask, 6, 1.0, chunked_logprobs=True)
    assert "chunked_logprobs: some log-prob passes run plain (final_logit_softcapping=30.0" in caplog.text
    model.config.final_logit_softcapping = None
    torch.testing.assert_close(scores.per_token_logps, score_completions(model, ids, mask, 6, 1.0).per_token_logps)
    model.config.logits_scaling = 1.0  # a scale of 1 changes nothing
    assert chunked_logprobs_blocker(model) is None

    class Adapted(nn.Module):  # a PEFT-style layer around the head
        def __init__(self, base_layer):
            super().__init__()
            self.base_layer, self.weight = base_layer, base_layer.weight

    model.lm_head = Adapted(model.lm_head)
    assert chunked_logprobs_blocker(model) == "an LM head of type Adapted"


def test_chunked_logprobs_keeps_a_float32_head(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.bfloat16)
    cast_lm_head_to_fp32(model)
    own_forward = model.lm_head.forward
    ids, mask = batch(model.config.vocab_size)
    with torch.no_grad():
        plain = score_completions(model, ids, mask, 6, 1.0).per_token_logps
        chunked = score_completions(model, ids, mask, 6, 1.0, chunked_logprobs=True).per_token_logps
    assert model.lm_head.forward is own_forward and model.lm_head.weight.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=0, atol=1e-5)


def test_chunked_logprobs_follows_autocast_inside_the_forward(tiny_lm_path):
    """accelerate turns autocast on inside the prepared model's forward only: the head's product runs in bf16 there,
    and so must the blocks (a float32 product would differ by ~1e-3 in the log-probs)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    ids, mask = batch(model.config.vocab_size)
    results = {}
    for chunked in (False, True):
        model.zero_grad(set_to_none=True)
        logps = score_completions(model, ids, mask, 6, 1.0, chunked_logprobs=chunked).per_token_logps
        (logps * mask[:, -6:]).sum().backward()
        results[chunked] = (logps.detach(), model.model.norm.weight.grad.clone())
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-2, atol=1e-3)
    with torch.no_grad():  # the same blocks in float32 are measurably different: the test can tell the two apart
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -7:-1]
        fp32 = head_logprobs(hidden.float(), model.lm_head.weight, None, ids[:, -6:], head_dtype=torch.float32)[0]
    assert (fp32 - results[True][0]).abs().max() > 1e-4


def test_tied_grad_sink_starts_over_after_a_failed_backward():
    """A backward that raises half-way (retain_graph) leaves a partial sum; the next backward pass must not add to it."""
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 40, (2, 5), generator=g)

    class FailOnce(torch.autograd.Function):
        failed = False

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if not FailOnce.failed:
                FailOnce.failed = True
                raise ValueError("once")
            return grad

    sink = TiedGradSink()
    hidden = _TiedLookup.apply(ids, weight, sink, None)
    loss = head_logprobs(hidden[:, :-1], weight, None, ids[:, 1:], grad_sink=sink)[0].sum()
    loss = loss + FailOnce.apply(hidden).sum()
    with pytest.raises(ValueError, match="once"):
        loss.backward(retain_graph=True)
    weight.grad = None
    loss.backward()
    plain = F.embedding(ids, weight)
    want = torch.autograd.grad(head_logprobs(plain[:, :-1], weight, None, ids[:, 1:])[0].sum() + plain.sum(), weight)
    torch.testing.assert_close(weight.grad, want[0], rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # no graph: nothing registers, nothing waits for a backward
        fresh = TiedGradSink()
        head_logprobs(_TiedLookup.apply(ids, weight, None, None)[:, :-1], weight, None, ids[:, 1:], grad_sink=fresh)
    assert fresh.registered == 0


def test_a_prompt_pass_whose_cache_is_dropped_costs_no_gradient(tiny_lm_path, monkeypatch):
    """`shared_prefix_cache` can run the prompt pass and still return None (a layer that wrote nothing): the
    plain pass that follows must not wait for the dropped prompt lookup's gradient."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    ids, mask = batch(model.config.vocab_size)
    plain, plain_grads = scores_and_grads(model, ids, mask)
    real = scoring_plan.shared_prefix_cache
    monkeypatch.setattr(scoring_plan, "shared_prefix_cache", lambda *a: real(*a) and None)
    kwargs = dict(chunked_logprobs=True, sparse_embedding_grad=True, share_prefix=True, min_prefix_tokens=4)
    scores, grads = scores_and_grads(model, ids, mask, **kwargs)
    torch.testing.assert_close(scores.per_token_logps, plain.per_token_logps, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_embedding_subclass_with_its_own_forward_gets_the_sparse_flag(tiny_lm_path):
    """Gemma scales its embedding in a forward of its own: the rerouted lookup would skip it, so the subclass
    keeps its forward and nn.Embedding's sparse gradient (set for the pass, restored after)."""

    class ScaledEmbedding(nn.Embedding):
        def forward(self, input_ids):
            return super().forward(input_ids) * 2.0

    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    old = model.model.embed_tokens
    scaled = ScaledEmbedding(old.num_embeddings, old.embedding_dim, old.padding_idx)
    scaled.weight = old.weight  # still tied to the LM head
    model.model.embed_tokens = scaled
    ids, mask = batch(model.config.vocab_size)
    plain, plain_grads = scores_and_grads(model, ids, mask)
    flags = []
    scaled.register_forward_pre_hook(lambda module, args: flags.append((module.sparse, "forward" in vars(module))))
    scores, grads = scores_and_grads(model, ids, mask, chunked_logprobs=True, sparse_embedding_grad=True)
    assert flags == [(True, False)] and scaled.sparse is False
    for name, grad in grads.items():
        assert not grad.is_sparse
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("share_prefix", [False, True], ids=["plain", "shared_prefix"])
def test_grouped_kv_attention_is_bitwise_the_copied_heads(tiny_lm_path, share_prefix, monkeypatch):
    from transformers.integrations import sdpa_attention

    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32, attn_implementation="sdpa")
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2  # grouped-query attention
    ids, mask = batch(model.config.vocab_size)
    switch = sdpa_attention.use_gqa_in_sdpa
    kwargs = dict(share_prefix=share_prefix, min_prefix_tokens=4, chunked_logprobs=True)
    copies = []
    repeat_kv = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or repeat_kv(x, n))
    copied, copied_grads = scores_and_grads(model, ids, mask, **kwargs)
    layers = model.config.num_hidden_layers * (2 if share_prefix else 1)
    assert copies == [2] * 2 * layers  # keys and values, every layer of every forward
    copies.clear()
    grouped, grouped_grads = scores_and_grads(model, ids, mask, grouped_kv_attention=True, **kwargs)
    assert copies == [] and not grouped_kv_attention.GQA_SWITCH.active()  # only inside the pass
    assert torch.equal(grouped.per_token_logps, copied.per_token_logps)
    assert torch.equal(grouped.entropies, copied.entropies)
    # two query heads per key/value head: the kernel's sum of their key/value gradients is one exact addition
    assert all(torch.equal(grouped_grads[n], g) for n, g in copied_grads.items())

    assert grouped_kv_attention.grouped_kv_sdpa_applies(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert not grouped_kv_attention.grouped_kv_sdpa_applies(model)  # the recomputation would run outside the block
    with torch.no_grad():
        assert grouped_kv_attention.grouped_kv_sdpa_applies(model)
    model.gradient_checkpointing_disable()
    assert grouped_kv_attention.grouped_kv_sdpa_applies(model)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model.model.layers[0] = checkpoint_wrapper(model.model.layers[0])  # torch's wrapper (accelerate's FSDP option)
    assert not grouped_kv_attention.grouped_kv_sdpa_applies(model)
    seen = []
    with grouped_kv_attention.grouped_kv_sdpa():  # this thread only
        thread = threading.Thread(target=lambda: seen.append(grouped_kv_attention.GQA_SWITCH.active()))
        thread.start()
        thread.join()
        seen.append(grouped_kv_attention.GQA_SWITCH.active())
    assert seen == [False, True]
    assert sdpa_attention.use_gqa_in_sdpa is switch  # transformers' own function, back after every block


def test_grouped_kv_sdpa_wraps_the_switch_found_on_entry_and_puts_it_back(monkeypatch):
    """A `use_gqa_in_sdpa` installed by someone else: outside the block's thread it still answers, and the last
    block to close puts that same object back."""
    from transformers.integrations import sdpa_attention

    asked = []

    def theirs(*args, **kwargs):
        asked.append(len(args) + len(kwargs))
        return False

    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", theirs)
    seen = []
    with grouped_kv_attention.grouped_kv_sdpa():
        with grouped_kv_attention.grouped_kv_sdpa():
            seen.append(sdpa_attention.use_gqa_in_sdpa(None, None))
        assert sdpa_attention.use_gqa_in_sdpa is not theirs  # the outer block is still open
        thread = threading.Thread(target=lambda: seen.append(sdpa_attention.use_gqa_in_sdpa(None, None)))
        thread.start()
        thread.join()
    assert seen == [True, False] and asked == [2]
    assert sdpa_attention.use_gqa_in_sdpa is theirs
    assert not grouped_kv_attention.GQA_SWITCH.active()
