# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Packed weights compute the same logits, and inverse-CDF draws follow torch.multinomial's distribution
(trl/generation/cpu_decoding.py)."""

import collections
import threading

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import trl.generation.cpu_decoding as cpu_decoding
from trl.generation.cpu_decoding import (
    MIN_NEW_TOKENS_HEAD,
    MIN_NEW_TOKENS_LAYERS,
    inverse_cdf_draw,
    inverse_cdf_sampling,
    packable_linears,
    packed_linear_weights,
)
from trl.generation.grpo_generation import sample_completions


needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="MKL-packed products need an MKL build")


class CountedOps(TorchDispatchMode):
    """Counts the ATen operators run inside it, by name (`mkl._mkl_linear`: the packed products)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.name().split("::")[-1].split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def lm(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_lm_path)


def _batch(tokenizer, repeats=4):
    encoded = tokenizer(["1+2=", "13+4+5="], return_tensors="pt", padding=True, padding_side="left")
    return encoded["input_ids"].repeat_interleave(repeats, 0), encoded["attention_mask"].repeat_interleave(repeats, 0)


def _config(tokenizer, max_new_tokens):
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, disable_compile=True,
    )  # fmt: skip


@needs_mkl
def test_packable_linears_follow_the_number_of_new_tokens(lm):
    model, _ = lm
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert packable_linears(model, MIN_NEW_TOKENS_HEAD - 1) == [] and packable_linears(model, None) == []
    assert packable_linears(model, MIN_NEW_TOKENS_HEAD) == [model.get_output_embeddings()]
    assert packable_linears(model, MIN_NEW_TOKENS_LAYERS - 1) == [model.get_output_embeddings()]
    assert packable_linears(model, MIN_NEW_TOKENS_LAYERS) == linears and len(linears) > 1
    # a forward of someone else's, or a weight that is not float32, is left alone
    head = model.get_output_embeddings()
    head.forward = lambda x: nn.Linear.forward(head, x)
    try:
        assert head not in packable_linears(model, MIN_NEW_TOKENS_LAYERS)
    finally:
        del head.forward
    assert packable_linears(nn.Linear(4, 4).double(), MIN_NEW_TOKENS_LAYERS) == []


@needs_mkl
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_layer_is_bitwise_the_plain_one_at_its_row_count_only(bias, monkeypatch):
    layer = nn.Linear(64, 96, bias=bias)
    calls = []
    monkeypatch.setattr(cpu_decoding, "_packed_forward", _spy(calls))
    with torch.inference_mode(), packed_linear_weights(layer, 16, MIN_NEW_TOKENS_LAYERS):
        assert "forward" in vars(layer)
        for shape in [(16, 64), (16, 1, 64), (4, 4, 64), (5, 64), (86, 64)]:
            x = torch.randn(shape)
            with CountedOps() as ops:
                y = layer(x)
            assert torch.equal(y, F.linear(x, layer.weight, layer.bias)), shape
            # the packed product for the inputs of 16 rows, the layer's own forward for the others
            assert ops.counts["_mkl_linear"] == (x.numel() // 64 == 16), shape
    assert "forward" not in vars(layer)
    assert [rows for rows, packed in calls if packed] == [16, 16, 16] and len(calls) == 5
    # with a graph to build (a trainable weight, gradients on): the plain forward, whose backward exists
    x = torch.randn(16, 64)
    with packed_linear_weights(layer, 16, MIN_NEW_TOKENS_LAYERS), CountedOps() as ops:
        layer(x).sum().backward()
    assert ops.counts["_mkl_linear"] == 0
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(96, 64), rtol=1e-5, atol=1e-5)  # d Σ(xWᵀ)/dW


@needs_mkl
@pytest.mark.parametrize("width, rows", [(64, 16), (64, 2), (576, 8), (576, 16), (896, 16)])
def test_a_layer_is_packed_only_where_the_packed_product_gives_its_bits(width, rows):
    """MKL's packed kernel rounds differently from the plain product for some shapes (here: 896 wide at any row count,
    576 wide below 16 rows, 64 wide at 1-2 rows): such a layer keeps its own forward, so the outputs inside the block
    are the plain ones to the bit either way."""
    layer = nn.Linear(width, 128)
    x = torch.randn(rows, width)
    with torch.inference_mode():
        with packed_linear_weights(layer, rows, MIN_NEW_TOKENS_LAYERS):
            packed = "forward" in vars(layer)
            inside = layer(x)
        assert torch.equal(inside, F.linear(x, layer.weight, layer.bias))
        assert packed is cpu_decoding.packing_is_bitwise(layer, rows)
        probe = torch.randn(rows, width, generator=torch.Generator().manual_seed(0))
        weights = torch.ops.mkl._mkl_reorder_linear_weight(layer.weight, rows)
        same = torch.equal(torch.ops.mkl._mkl_linear(probe, weights, layer.weight, layer.bias, rows), layer(probe))
        assert packed is same


def test_a_layer_whose_packed_product_differs_is_not_packed(monkeypatch):
    layer = nn.Linear(64, 96)
    monkeypatch.setattr(cpu_decoding, "packing_is_bitwise", lambda layer, rows: False)
    with packed_linear_weights(layer, 16, MIN_NEW_TOKENS_LAYERS):
        assert "forward" not in vars(layer)


def _spy(calls):
    packed_forward = cpu_decoding._packed_forward

    def spy(layer, packed, rows, x):
        calls.append((x.numel() // x.size(-1), x.numel() // x.size(-1) == rows))
        return packed_forward(layer, packed, rows, x)

    return spy


@needs_mkl
@pytest.mark.parametrize("max_new_tokens", [MIN_NEW_TOKENS_HEAD, MIN_NEW_TOKENS_LAYERS])
def test_generation_with_packed_weights_draws_the_same_tokens(lm, max_new_tokens):
    model, tokenizer = lm
    ids, mask = _batch(tokenizer)
    config = _config(tokenizer, max_new_tokens)
    config.eos_token_id = None  # every step decodes
    # the layers packed for 8 rows (probed here, so that the counts below hold decode products only)
    layers = [m for m in packable_linears(model, max_new_tokens) if cpu_decoding.packing_is_bitwise(m, 8)]
    outputs, counts = [], []
    for packed in (False, True):
        torch.manual_seed(5)
        with CountedOps() as ops:
            outputs.append(sample_completions(model, ids, mask, config, "shared_prefix", packed_weights=packed))
        counts.append(ops.counts["_mkl_linear"])
    assert outputs[0].shape == (8, max_new_tokens) and torch.equal(outputs[0], outputs[1])
    # one packed product per packed layer and decode step (the prefill of 2 distinct prompts runs plain)
    assert counts == [0, len(layers) * max_new_tokens] and len(layers) >= 1
    assert all("forward" not in vars(m) for m in model.modules())


def test_inverse_cdf_draws_follow_the_weights():
    weights = torch.tensor(
        [[0.0, 2.0, 0.0, 1.0, 0.0, 5.0, 0.0],  # unnormalised, zeros between and at both ends
         [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0],  # one token: the last
         [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # one token: the first
         [1e-30, 1.0, 1.0, 1.0, 1.0, 1.0, 1e-30]],
    )  # fmt: skip
    n = 200_000
    generator = torch.Generator().manual_seed(0)
    draws = inverse_cdf_draw(weights.repeat_interleave(n, 0), generator)
    assert draws.shape == (4 * n, 1) and draws.dtype == torch.int64
    for row in range(4):
        counts = torch.bincount(draws[row * n : (row + 1) * n, 0], minlength=7).double()
        p = weights[row].double() / weights[row].double().sum()
        assert counts[p == 0].sum() == 0, "a zero weight was drawn"
        tolerance = 5 * (n * p * (1 - p)).sqrt() + 1  # 5 standard deviations of a binomial count
        assert ((counts - n * p).abs() <= tolerance).all(), (row, counts.tolist())
    # the same seed, the same draws; a uniform number of 0 picks the first token with a weight
    again = inverse_cdf_draw(weights.repeat_interleave(n, 0), torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


@pytest.mark.parametrize("uniform, expected", [(0.0, 2), (0.5, 2), (2 / 3, 4), (1 - 2**-53, 4), (1.0, 4)])
def test_inverse_cdf_ends_never_pick_a_zero_weight(uniform, expected, monkeypatch):
    """u = 0 picks the first token with a weight; u at the top of [0, 1), and even u = 1 (a product that reaches the
    total), pick the last token with a weight, not the zero-weight tokens after it."""
    weights = torch.tensor([[0.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.full(shape, uniform, dtype=kwargs["dtype"]))
    assert inverse_cdf_draw(weights).item() == expected


def test_multinomial_inside_the_block_only_and_its_errors_kept(monkeypatch):
    original = torch.multinomial
    probs = torch.softmax(torch.randn(3, 50), -1)
    torch.manual_seed(0)
    outside = torch.multinomial(probs, 1)
    torch.manual_seed(0)
    reference = torch.multinomial(probs, 1)
    assert torch.equal(outside, reference)
    calls = []
    draw = cpu_decoding._draw_from_cumulative
    monkeypatch.setattr(cpu_decoding, "_draw_from_cumulative", lambda c, g: calls.append(c.shape) or draw(c, g))
    with inverse_cdf_sampling():
        torch.manual_seed(0)
        inside = torch.multinomial(probs, 1)
        torch.manual_seed(0)
        assert torch.equal(inside, inverse_cdf_draw(probs))
        assert torch.multinomial(probs, 2).shape == (3, 2)  # two samples: torch's own
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.multinomial(probs, 1)))
        thread.start()
        thread.join()
        for bad in (probs - 0.1, probs * float("nan"), torch.zeros(3, 50), probs * float("inf")):
            with pytest.raises(RuntimeError, match="probability tensor contains|invalid multinomial"):
                torch.multinomial(bad, 1)
    # the block's one-sample call and the direct `inverse_cdf_draw`; the other thread, the two-sample call and the bad
    # weights went to torch
    assert calls == [(3, 50), (3, 50)] and len(seen) == 1
    torch.manual_seed(0)
    assert torch.equal(torch.multinomial(probs, 1), reference)
    assert torch.multinomial is original  # put back when the block closed


def test_nested_blocks_and_an_empty_batch():
    original = torch.multinomial
    with inverse_cdf_sampling():
        with inverse_cdf_sampling():
            assert torch.multinomial is not original
        assert torch.multinomial is not original  # the outer block is still open
        assert torch.multinomial(torch.ones(0, 5), 1).shape == (0, 1)  # torch's own answer
    assert torch.multinomial is original


def test_a_patch_installed_after_import_is_called_inside_and_put_back(monkeypatch):
    """Another library's `torch.multinomial`, installed after trl's import: the block's other calls go to it, and the
    block puts that same object back, not torch's own."""
    torch_own = torch.multinomial
    calls = []

    def patched(input, num_samples, replacement=False, *, generator=None, out=None):
        calls.append(num_samples)
        return torch_own(input, num_samples, replacement, generator=generator, out=out)

    monkeypatch.setattr(torch, "multinomial", patched)
    probs = torch.softmax(torch.randn(3, 50), -1)
    with inverse_cdf_sampling():
        with inverse_cdf_sampling():
            assert torch.multinomial is not patched
            assert torch.multinomial(probs, 1).shape == (3, 1)  # the inverse CDF's: not the patch's
            assert torch.multinomial(probs, 2).shape == (3, 2)
        assert torch.multinomial is not patched  # the outer block is still open
    assert torch.multinomial is patched
    assert calls == [2]
    assert torch.multinomial is not cpu_decoding._multinomial and not cpu_decoding.MULTINOMIAL.active()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inverse_cdf_is_not_installed_for_a_generation_off_the_cpu(lm, monkeypatch):
    model, tokenizer = lm
    ids, mask = _batch(tokenizer)
    seen = []
    real_generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: seen.append(torch.multinomial) or real_generate(**kw))
    original = torch.multinomial
    model.cuda()
    try:
        sample_completions(model, ids.cuda(), mask.cuda(), _config(tokenizer, 2), "generate", inverse_cdf=True)
    finally:
        model.cpu()
    assert seen == [original]


def test_first_tokens_with_inverse_cdf_sampling_follow_the_model(lm, monkeypatch):
    model, tokenizer = lm
    n = 3000
    ids, mask = _batch(tokenizer, repeats=n)
    calls, draw = [], cpu_decoding._draw_from_cumulative
    monkeypatch.setattr(cpu_decoding, "_draw_from_cumulative", lambda c, g: calls.append(c.shape) or draw(c, g))
    torch.manual_seed(0)
    first = sample_completions(model, ids, mask, _config(tokenizer, 1), "shared_prefix", inverse_cdf=True)[:, 0]
    assert calls == [(2 * n, model.config.vocab_size)]  # generate's one draw went through the inverse CDF
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids[::n], attention_mask=mask[::n]).logits[:, -1].double(), -1)
    for prompt in range(2):
        counts = torch.bincount(first[prompt * n : (prompt + 1) * n], minlength=probs.size(1)).double()
        p = probs[prompt]
        tolerance = 5 * (n * p * (1 - p)).sqrt() + 2
        assert ((counts - n * p).abs() <= tolerance).all(), (counts - n * p).abs().max()
