# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""RMSNorm and SwiGLU activations rebuilt in the backward (`recompute_elementwise_activations`) against the plain
pass: the same forward bitwise, gradients to float rounding, fewer saved bytes, and where it stays off."""

from contextlib import nullcontext

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from trl.scoring import activation_recompute
from trl.scoring.activation_recompute import _Recipes, recompute_activations_applies, recomputed_activations
from trl.scoring.grpo_scoring import score_completions


def tiny(kind: str = "llama", **overrides):
    common = dict(
        vocab_size=96, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    common.update(overrides)
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


def saved_bytes(model, ids, lean: bool) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """Bytes of the distinct non-parameter storages the training pass keeps for its backward (recipes count 0),
    the loss, and the parameters' gradients."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def count(t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    model.zero_grad(set_to_none=True)
    if lean:
        original = _Recipes.pack

        def pack(self, t):
            packed = original(self, t)
            count(packed)
            return packed

        _Recipes.pack = pack
        try:
            with recomputed_activations(model):
                loss = model(ids).logits.float().logsumexp(-1).mean()
        finally:
            _Recipes.pack = original
    else:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (count(t), t)[1], lambda t: t):
            loss = model(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    return sum(kept.values()), loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_same_loss_gradients_to_rounding_and_fewer_saved_bytes(kind):
    model = tiny(kind)
    assert recompute_activations_applies(model)
    ids = torch.randint(0, 96, (3, 11), generator=torch.Generator().manual_seed(1))
    plain_bytes, plain_loss, plain_grads = saved_bytes(model, ids, lean=False)
    lean_bytes, lean_loss, lean_grads = saved_bytes(model, ids, lean=True)
    assert torch.equal(lean_loss, plain_loss)  # the forward is the same operations on the same inputs
    for got, want in zip(lean_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # per token and layer: 2 norms keep their input only (-2 x 32 of 4 x 32), the MLP drops act(gate) and the
    # product (-2 x 88); the final norm too. At least a third of what the plain pass keeps is gone.
    assert lean_bytes < 0.67 * plain_bytes, (lean_bytes, plain_bytes)


def test_only_the_blocks_model_is_wrapped_and_only_inside_the_block():
    model, other = tiny(), tiny()  # two models of the same classes
    norm_cls, mlp_cls = type(model.model.norm), type(model.model.layers[0].mlp)
    class_forwards = (norm_cls.__dict__["forward"], mlp_cls.__dict__["forward"])
    assert recompute_activations_applies(model)  # changes nothing
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    _, plain_loss, _ = saved_bytes(model, ids, lean=False)
    out = model(ids).logits.float().logsumexp(-1).mean()
    assert "_RecomputedBackward" not in repr_graph(out.grad_fn)
    wrappable = [m for m in model.modules() if isinstance(m, (norm_cls, mlp_cls))]
    assert len(wrappable) == 3 * 2 + 1  # 2 norms and an MLP in each of 2 layers, the final norm
    with recomputed_activations(model):
        assert all("forward" in vars(m) for m in wrappable)
        lean = model(ids).logits.float().logsumexp(-1).mean()
        # the second model, outside the block's model: its modules run their class's forward
        assert not any("forward" in vars(m) for m in other.modules())
        assert other.model.norm.forward.__func__ is norm_cls.__dict__["forward"]
        assert other.model.layers[0].mlp.forward.__func__ is mlp_cls.__dict__["forward"]
        theirs = other(ids).logits.float().logsumexp(-1).mean()
    assert "_RecomputedBackward" in repr_graph(lean.grad_fn)
    assert "_RecomputedBackward" not in repr_graph(theirs.grad_fn)
    assert torch.equal(out.detach(), plain_loss) and torch.equal(lean.detach(), plain_loss)
    assert not any("forward" in vars(m) for m in model.modules())  # deleted when the block closed
    assert (norm_cls.__dict__["forward"], mlp_cls.__dict__["forward"]) == class_forwards
    assert activation_recompute._SCOPED == {}


def test_nested_blocks_and_a_forward_set_by_someone_else():
    model = tiny()
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    final_norm = model.model.norm
    hooked = final_norm.forward  # e.g. an offload hook's forward, set on the instance
    final_norm.forward = hooked
    with recomputed_activations(model):
        inner = model.model.layers[0].mlp.forward
        with recomputed_activations(model):
            assert model.model.layers[0].mlp.forward is inner  # the same wrapper, counted twice
        assert model.model.layers[0].mlp.forward is inner  # the outer block is still open
        assert final_norm.forward is hooked  # left as it is
        lean = model(ids).logits.float().logsumexp(-1).mean()
    # the layers' norms and MLPs recomputed, the final norm not: 3 per layer
    assert repr_graph(lean.grad_fn).split().count("_RecomputedBackward") == 3 * 2
    assert final_norm.forward is hooked
    assert [name for name, m in model.named_modules() if "forward" in vars(m)] == ["model.norm"]


def repr_graph(fn) -> str:
    seen, stack, names = set(), [fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return " ".join(names)


def test_no_graph_change_without_gradients_or_under_autocast():
    model = tiny()
    recompute_activations_applies(model)
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    with recomputed_activations(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(ids).logits.float().sum()
        with torch.no_grad():
            assert model(ids).logits.grad_fn is None
    assert "_RecomputedBackward" not in repr_graph(autocast.grad_fn)


def test_a_changed_input_is_an_error_that_names_the_field():
    """A tensor a recipe rebuilds from, changed in place after the forward, would give a wrong gradient."""
    norm = tiny().model.norm
    recompute_activations_applies(norm)
    x = torch.randn(4, 32, requires_grad=True)
    h = x * 1.0
    with recomputed_activations(norm):
        y = norm(h)
        z = (y @ torch.randn(32, 5, requires_grad=True)).sum()  # the product saves y: a recipe
    with torch.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="recompute_elementwise_activations=False"):
        z.backward()


def test_not_for_sharded_parameters_nor_unknown_modules(monkeypatch):
    model = tiny()
    monkeypatch.setattr(activation_recompute, "parameter_layouts", lambda m: {"zero3"})
    assert not recompute_activations_applies(model)
    monkeypatch.undo()
    assert not recompute_activations_applies(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3)))


def test_score_completions_uses_it_only_with_gradients_and_without_checkpointing(monkeypatch):
    model = tiny().train()
    ids = torch.randint(0, 96, (4, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    entered = []
    real = activation_recompute.recomputed_activations

    def spy(scored):
        entered.append(scored is model)
        return real(scored)

    monkeypatch.setattr("trl.scoring.grpo_scoring.recomputed_activations", spy)
    results = {}
    for flag in (False, True):
        model.zero_grad(set_to_none=True)
        scores = score_completions(model, ids, mask, 4, 4, recompute_elementwise_activations=flag)
        scores.per_token_logps.sum().backward()
        results[flag] = (scores.per_token_logps.detach(), [p.grad.clone() for p in model.parameters()])
    assert entered == [True]
    assert torch.equal(results[True][0], results[False][0])
    for got, want in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        score_completions(model, ids, mask, 4, 4, recompute_elementwise_activations=True)
    model.gradient_checkpointing_enable()
    score_completions(model, ids, mask, 4, 4, recompute_elementwise_activations=True)
    assert entered == [True]


def norm_and_weight(seed: int = 2):
    norm = tiny().model.norm
    recompute_activations_applies(norm)
    return norm, torch.randn(32, 5, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def test_parameter_hooks_see_the_gradient_once():
    """The backward's rerun reads detached copies of the norm's weight, so a hook on it runs once, as in a plain
    pass, and a hook that changes the gradient changes it once."""
    results = {}
    for lean in (False, True):
        norm, w = norm_and_weight()
        calls = []
        norm.weight.register_hook(lambda g: calls.append(1) or g * 2)
        h = torch.randn(4, 32, generator=torch.Generator().manual_seed(0), requires_grad=True) * 1.0
        with recomputed_activations(norm) if lean else nullcontext():
            z = (norm(h) @ w).sum()
        z.backward()
        results[lean] = (len(calls), norm.weight.grad.clone())
    assert results[True][0] == results[False][0] == 1
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-6, atol=1e-7)


def modify_norm_input_after_the_norm(norm, w):
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    h = x * 1.0
    out = norm(h)
    h.add_(1.0)  # before the product saves the norm's output: the recipe would rebuild it from the changed input
    return (out @ w).sum()


def modify_kept_weight(norm, w):
    h = torch.randn(4, 32, generator=torch.Generator().manual_seed(1), requires_grad=True) * 1.0
    z = (norm(h) + 1.0).sum()  # no recipe: only the norm's own saved input and weight
    with torch.no_grad():
        norm.weight.mul_(3.0)
    return z


@pytest.mark.parametrize("change", [modify_norm_input_after_the_norm, modify_kept_weight])
def test_in_place_changes_are_caught_as_autograd_would(change):
    """Under saved-tensor hooks autograd skips its own in-place check; the hooks check versions instead, from the
    moment the norm ran (a recipe) or the tensor was saved (everything else). The plain pass raises too."""
    norm, w = norm_and_weight()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        change(norm, w).backward()
    norm, w = norm_and_weight()
    with recomputed_activations(norm):
        z = change(norm, w)
    with pytest.raises(RuntimeError, match="modified in place after the forward.*recompute_elementwise_activations"):
        z.backward()


def test_second_order_gradients_are_refused():
    model = tiny(attn_implementation="eager")
    recompute_activations_applies(model)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    with recomputed_activations(model):
        loss = model(ids).logits.logsumexp(-1).mean()
    with pytest.raises(RuntimeError, match="no second-order gradients"):
        torch.autograd.grad(loss, list(model.parameters()), create_graph=True)


class DropoutMLP(nn.Module):
    """The SwiGLU pattern followed by something the wrapper would skip (Seed-OSS's residual dropout)."""

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return nn.functional.dropout(down_proj, p=0.5, training=self.training)


class GatedRMSNorm(nn.Module):
    """An "RMSNorm" that reads parameters of submodules."""

    def __init__(self):
        super().__init__()
        self.inner, self.gate = nn.RMSNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        return self.inner(x) * torch.sigmoid(self.gate(x))


def test_only_exact_swiglu_forwards_and_self_contained_norms():
    from transformers.models.llama.modeling_llama import LlamaMLP

    assert activation_recompute._is_swiglu(LlamaMLP.forward)
    assert not activation_recompute._is_swiglu(DropoutMLP.forward)
    assert not recompute_activations_applies(DropoutMLP())
    torch.manual_seed(0)
    norm = GatedRMSNorm()
    assert recompute_activations_applies(norm)  # an RMSNorm class: its wrapper calls its own forward
    x = torch.randn(3, 8, requires_grad=True)
    plain = torch.autograd.grad(norm(x).square().sum(), list(norm.parameters()))
    with recomputed_activations(norm):
        out = norm(x)
    # torch's own nn.RMSNorm inside is self-contained: recomputed; the gated norm around it runs as it is
    assert repr_graph(out.grad_fn).split().count("_RecomputedBackward") == 1
    lean = torch.autograd.grad(out.square().sum(), list(norm.parameters()))
    for got, want in zip(lean, plain):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_parametrized_norm_weight_gets_its_gradient():
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, weight):
            return weight * 2

    grads = {}
    for lean in (False, True):
        norm, w = norm_and_weight()
        parametrize.register_parametrization(norm, "weight", Double())
        h = torch.randn(4, 32, generator=torch.Generator().manual_seed(1), requires_grad=True) * 1.0
        with recomputed_activations(norm) if lean else nullcontext():
            z = (norm(h) @ w).sum()
        z.backward()
        grads[lean] = norm.parametrizations.weight.original.grad
    assert grads[True] is not None and torch.equal(grads[True], grads[False])


def test_not_under_fsdp():
    class FullyShardedDataParallel(nn.Module):  # the name is what is checked (FSDP1 swaps parameters for views)
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert not recompute_activations_applies(FullyShardedDataParallel(tiny()))
