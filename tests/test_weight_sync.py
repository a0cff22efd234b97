# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the policy sends to vLLM (`trl.generation.weight_sync`): checkpoint names, bitwise values, merged LoRA
adapters left untouched, the check of a push; under ZeRO-3 and FSDP2 on 2 gloo processes, one group at a time."""

import copy
import inspect
import os

import pytest
import torch
from safetensors import safe_open
from test_distributed import _launch, deepspeed_op  # noqa: F401  (the fixture compiles DeepSpeed's CPU op once)
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from trl.generation.weight_sync import check_vllm_weight_names, vllm_weight_shapes, vllm_weights


SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def tiny(kind: str, dtype=torch.float32):
    """A random 2-layer model: `"qwen2"` (tied embeddings, q/k/v biases), `"llama_tied"` or `"llama_untied"`."""
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SIZES, num_key_value_heads=2, tie_word_embeddings=True))
    else:
        config = LlamaConfig(**SIZES, num_key_value_heads=2, tie_word_embeddings=kind == "llama_tied")
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def saved_keys(model, tmp_path) -> list[str]:
    """The tensor names `save_pretrained` writes (what a vLLM engine started from that folder loads)."""
    model.save_pretrained(tmp_path)
    keys = []
    for file in sorted(os.listdir(tmp_path)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(tmp_path, file), "pt") as f:
                keys += list(f.keys())
    return keys


def lora_policy(dtype=torch.float32, with_reference_adapter: bool = False):
    """An untied tiny Llama with LoRA (r=4, non-zero B) on q/v/gate and a trained `lm_head` copy (modules_to_save);
    optionally a second, inactive adapter `"ref"` (as the iterative-GRPO reference of a PEFT policy)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "gate_proj"],
        modules_to_save=["lm_head"],
        init_lora_weights=False,
    )
    policy = get_peft_model(tiny("llama_untied", dtype), config)
    if with_reference_adapter:
        policy.add_adapter("ref", config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:  # move B and the head copy away from their init
                p.add_(torch.randn(p.shape, generator=generator).to(dtype))
    return policy


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_unchanged(model, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("kind", ["qwen2", "llama_tied", "llama_untied"])
def test_names_are_the_saved_checkpoint_and_values_the_state_dict(kind, tmp_path):
    model = tiny(kind)
    weights = vllm_weights(model)
    assert inspect.isgenerator(weights)
    received = list(weights)
    names = [n for n, _ in received]
    assert sorted(names) == sorted(saved_keys(model, tmp_path)) and len(set(names)) == len(names)
    assert ("lm_head.weight" in names) == (kind == "llama_untied")
    # fixed order: each decoder layer, then the rest
    assert names[0] == "model.layers.0.self_attn.q_proj.weight"
    state = model.state_dict()
    assert all(torch.equal(t, state[n]) and t.dtype == torch.float32 for n, t in received)
    assert vllm_weight_shapes(model) == {n: tuple(t.shape) for n, t in received}


def test_moe_experts_fused_in_memory_are_sent_per_expert_as_saved(tmp_path):
    """transformers 5 fuses a Qwen3-MoE layer's experts into 3-D tensors; its checkpoint (and vLLM) has one
    weight per expert: the names, values and shapes sent are the saved file's."""
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **SIZES, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2
    )
    model = Qwen3MoeForCausalLM(config)
    assert tuple(model.model.layers[0].mlp.experts.gate_up_proj.shape) == (4, 32, 32)  # fused in memory
    model.save_pretrained(tmp_path)
    saved = load_file(os.path.join(tmp_path, "model.safetensors"))
    received = list(vllm_weights(model))
    assert sorted(n for n, _ in received) == sorted(saved) and len(received) == len(saved) == 45
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in saved
    assert all(torch.equal(t, saved[n]) for n, t in received)
    assert vllm_weight_shapes(model) == {n: tuple(t.shape) for n, t in saved.items()}


def test_fixed_order_layers_then_the_rest():
    names = [n for n, _ in vllm_weights(tiny("llama_untied"))]
    layer0 = [n for n in names if n.startswith("model.layers.0.")]
    layer1 = [n for n in names if n.startswith("model.layers.1.")]
    assert names == layer0 + layer1 + ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    assert len(layer0) == len(layer1) == 9  # q, k, v, o, gate, up, down, 2 norms
    assert names == [n for n, _ in vllm_weights(tiny("llama_untied"))]


def test_a_compiled_policy_sends_its_inner_model_names():
    model = tiny("llama_tied")
    compiled = torch.compile(model)  # nothing compiles before a forward
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    received, expected = list(vllm_weights(compiled)), list(vllm_weights(model))
    assert [n for n, _ in received] == [n for n, _ in expected]
    assert all(torch.equal(a, b) and a.data_ptr() == b.data_ptr() for (_, a), (_, b) in zip(received, expected))


def test_bf16_policy_yields_bf16_tensors():
    model = tiny("qwen2", torch.bfloat16)
    state = model.state_dict()
    received = list(vllm_weights(model))
    assert {t.dtype for _, t in received} == {torch.bfloat16}
    assert all(torch.equal(t, state[n]) for n, t in received)


def test_lora_yields_merged_weights_bitwise_like_merge_and_unload(tmp_path):
    policy = lora_policy(with_reference_adapter=True)
    before = snapshot(policy)
    merged_model = copy.deepcopy(policy).merge_and_unload()  # merges the active adapter only
    expected = merged_model.state_dict()
    received = list(vllm_weights(policy))
    names = [n for n, _ in received]
    assert sorted(names) == sorted(saved_keys(merged_model, tmp_path)) == sorted(expected)
    assert not any("lora" in n or "base_layer" in n or "modules_to_save" in n or ".ref." in n for n in names)
    got = dict(received)
    assert all(torch.equal(got[n], expected[n]) for n in expected)
    # not vacuous: the adapters and the head copy changed what is sent, by W + scale * B @ A
    q = policy.base_model.model.model.layers[0].self_attn.q_proj
    base = q.base_layer.weight.detach()
    delta = q.lora_B["default"].weight @ q.lora_A["default"].weight * q.scaling["default"]
    assert q.scaling["default"] == 2.0 and delta.abs().max() > 0.1
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], base + delta)
    assert torch.equal(
        got["model.layers.0.self_attn.k_proj.weight"],
        before["base_model.model.model.layers.0.self_attn.k_proj.weight"],
    )
    head = before["base_model.model.lm_head.modules_to_save.default.weight"]
    assert torch.equal(got["lm_head.weight"], head)
    assert not torch.equal(head, before["base_model.model.lm_head.original_module.weight"])
    assert vllm_weight_shapes(policy) == {n: tuple(t.shape) for n, t in received}
    assert_unchanged(policy, before)  # the policy was never modified: base weights and adapters bitwise


def test_lora_bf16_rounds_the_fp32_merge_once():
    policy = lora_policy(torch.bfloat16)
    got = dict(vllm_weights(policy))
    v = policy.base_model.model.model.layers[1].mlp.gate_proj
    a, b = v.lora_A["default"].weight.float(), v.lora_B["default"].weight.float()
    exact = (v.base_layer.weight.float() + (b @ a) * v.scaling["default"]).to(torch.bfloat16)
    assert got["model.layers.1.mlp.gate_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(got["model.layers.1.mlp.gate_proj.weight"], exact)
    # peft's merge rounds the delta to bf16 first: at most one bf16 step (2^-7 relative) away
    peft_merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    for name, tensor in got.items():
        gap = (tensor.float() - peft_merged[name].float()).abs()
        assert (gap <= tensor.float().abs() * 2**-7 + 1e-30).all(), name


def test_early_stop_and_consumer_errors_leave_the_policy_untouched():
    policy = lora_policy()
    before = snapshot(policy)
    weights = vllm_weights(policy)
    assert [next(weights)[0] for _ in range(3)] == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ]
    weights.close()
    assert_unchanged(policy, before)
    with pytest.raises(RuntimeError, match="consumer failed"):
        for name, _ in vllm_weights(policy):
            if name.startswith("model.layers.1."):
                raise RuntimeError("consumer failed")
    assert_unchanged(policy, before)


def test_adapters_already_merged_are_not_added_twice():
    policy = lora_policy()
    policy.merge_adapter()
    got = dict(vllm_weights(policy))
    q = policy.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)


def test_a_trained_copy_of_a_tied_head_is_sent_only_when_tied_like_it():
    from peft import LoraConfig, get_peft_model

    with pytest.warns(UserWarning, match="ensure_weight_tying"):  # peft warns too
        untied = get_peft_model(
            tiny("llama_tied"), LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])
        )
    with pytest.raises(ValueError) as error:
        next(vllm_weights(untied))
    assert str(error.value) == (
        "Cannot send the weights of 'lm_head' to vLLM: its trained copy (`modules_to_save`) is not tied like the "
        "original weight (tied embeddings), and vLLM's model keeps them tied. Tie the copies "
        "(`LoraConfig(ensure_weight_tying=True)`) or leave this module out of modules_to_save."
    )
    config = LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"], ensure_weight_tying=True)
    tied = get_peft_model(tiny("llama_tied"), config)
    copy_ = tied.base_model.model.lm_head.modules_to_save["default"].weight
    with torch.no_grad():
        copy_.add_(1.0)  # the embedding's copy is the same tensor
    received = dict(vllm_weights(tied))
    assert "lm_head.weight" not in received
    assert torch.equal(received["model.embed_tokens.weight"], copy_)


def test_unsupported_peft_layers_are_refused_by_name():
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(tiny("llama_untied"), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    weights = vllm_weights(policy)  # lazy: the error comes at the first tensor
    message = (
        "Cannot send the weights of 'model.layers.0.self_attn.q_proj' (Linear) to vLLM: only plain LoRA on linear "
        "layers is merged (no DoRA, lora_bias, LoRA on embeddings or convolutions, or other PEFT methods). Merge the "
        "adapter into the model before training, or train without vLLM."
    )
    with pytest.raises(ValueError) as error:
        next(weights)
    assert str(error.value) == message
    with pytest.raises(ValueError) as error:
        vllm_weight_shapes(policy)
    assert str(error.value) == message


def test_check_names_accepts_the_engine_names_and_refuses_anything_else():
    expected = vllm_weight_shapes(tiny("qwen2"))
    check_vllm_weight_names(expected.items(), expected)  # the same metadata: no error
    check_vllm_weight_names(reversed(list(expected.items())), expected)  # order does not matter
    meta = [(n, s) for n, s in expected.items() if n != "model.layers.1.mlp.up_proj.weight"]
    meta[0] = ("model.layers.0.self_attn.q_proj.weight", (32, 31))
    meta += [("lm_head.weight", (96, 32)), ("base_model.model.model.norm.weight", (32,))]
    with pytest.raises(ValueError) as error:
        check_vllm_weight_names(meta, expected)
    assert str(error.value) == (
        "Refused to push the policy's weights to vLLM (nothing was sent): they do not match the policy's names and "
        "shapes when the trainer was built; unknown names (2): lm_head.weight, base_model.model.model.norm.weight; wrong "
        "shapes (1): model.layers.0.self_attn.q_proj.weight (32, 31) instead of (32, 32); missing names (1): "
        "model.layers.1.mlp.up_proj.weight. A reload that fails leaves the engine unusable."
    )
    with pytest.raises(ValueError) as error:
        check_vllm_weight_names([], expected)
    assert str(error.value).endswith(
        "missing names (26): model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.q_proj.bias, "
        "model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.k_proj.bias, "
        "model.layers.0.self_attn.v_proj.weight and 21 more. A reload that fails leaves the engine unusable."
    )


@pytest.fixture(scope="module")
def distributed(tmp_path_factory, deepspeed_op) -> list[dict]:  # noqa: F811
    """`vllm_weights` under ZeRO-3 and FSDP2 on 2 gloo processes (tests/distributed_workers/weight_sync_worker.py)."""
    pytest.importorskip("peft")

    from trl.models.tiny import build_tiny_causal_lm

    model_dir = build_tiny_causal_lm(str(tmp_path_factory.mktemp("weight_sync_model")))
    worker = os.path.join(os.path.dirname(__file__), "distributed_workers", "weight_sync_worker.py")
    return _launch("all", model_dir, tmp_path_factory.mktemp("weight_sync"), timeout=180, worker=worker)


@pytest.mark.parametrize("backend", ["zero3", "fsdp2"])
@pytest.mark.parametrize("case", ["plain", "lora"])
def test_sharded_policies_yield_the_unsharded_tensors_bitwise(distributed, backend, case):
    for rank in distributed:  # every rank receives the values (only the pushing rank will use them)
        result = rank[backend][case]
        assert result["names_equal"] and result["bitwise_equal"] and result["shapes_equal"]
        assert result["group_order"] == ["layer0", "layer1", "rest"]
    assert distributed[0][backend][case] == distributed[1][backend][case]


@pytest.mark.parametrize("case", ["plain", "lora"])
def test_zero3_gathers_one_group_at_a_time(distributed, case):
    per_layer = 12 if case == "plain" else 18  # 9 weights, 3 biases (+ 3 LoRA A/B pairs)
    result = distributed[0]["zero3"][case]
    assert result["partitioned"]  # every parameter really is split (no persistent whole copies)
    assert result["group_sizes"] == {"layer0": per_layer, "layer1": per_layer, "rest": 2}
    # one GatheredParameters per group, holding exactly that group's parameters; none for the shapes
    assert result["gathers"] == [["layer0", per_layer], ["layer1", per_layer], ["rest", 2]]
    assert result["gathers_for_shapes"] == 0
    assert result["max_whole_at_yield"] == 0  # released (copied) before its tensors are handed out


@pytest.mark.parametrize("case", ["plain", "lora"])
def test_fsdp2_gathers_one_group_at_a_time(distributed, case):
    per_layer = 12 if case == "plain" else 18
    result = distributed[0]["fsdp2"][case]
    assert result["dtensor_params"]
    assert result["group_sizes"] == {"layer0": per_layer, "layer1": per_layer, "rest": 2}
    # when a group's first tensor arrives, exactly the groups so far have been gathered (lazily, in order)
    assert result["calls_at_group_start"] == {"layer0": per_layer, "layer1": 2 * per_layer, "rest": 2 * per_layer + 2}
    assert result["calls_for_shapes"] == 0
