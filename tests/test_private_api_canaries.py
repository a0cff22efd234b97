# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Canaries for the private and unstable APIs of torch, transformers, accelerate and DeepSpeed that trl relies on.

Each test checks one such API for the behaviour a trl module relies on: it exists, takes the arguments trl passes, and
returns what trl reads. Where that is cheap to check, the test checks values, on tiny models built in the test. When an
upgrade breaks one, its test fails with a message that names the API and the trl module to port, before a training
run gives wrong numbers (several of these APIs are read with `getattr(..., default)`, so a rename would silently
switch a speed-up off or change a result instead of raising). `setup.py` caps the versions where such an API is
known to change. `test_each_canary_names_a_module_that_uses_its_api` checks that every module named here exists and
still uses its API, so the messages stay right when modules move.
"""

import argparse
import functools
import inspect
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache, GenerationConfig, Trainer, TrainingArguments
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer


REPO = Path(__file__).resolve().parents[1]

# The trl modules that rely on the APIs below (paths from the repository root).
WEIGHT_GRADS = "trl/scoring/weight_grads.py"
PREFIX_SHARING = "trl/scoring/prefix_sharing.py"
GROUPED_KV_ATTENTION = "trl/scoring/grouped_kv_attention.py"
SCORING_PLAN = "trl/scoring/scoring_plan.py"
LM_HEAD = "trl/scoring/lm_head.py"
ACTIVATION_RECOMPUTE = "trl/scoring/activation_recompute.py"
GRPO_GENERATION = "trl/generation/grpo_generation.py"
CPU_DECODING = "trl/generation/cpu_decoding.py"
LAYOUTS = "trl/reference/layouts.py"
REF_SYNC = "trl/reference/ref_sync.py"
MODELS_UTILS = "trl/models/utils.py"
GRPO_TRAINER = "trl/trainer/grpo_trainer.py"
GRPO_CONFIG = "trl/trainer/grpo_config.py"
SCRIPTS_GRPO = "trl/scripts/grpo.py"

# (API, the module that relies on it, a piece of that module's code that uses it): what each canary below guards.
CANARIES = [
    ("torch._C._current_graph_task_id", WEIGHT_GRADS, "torch._C._current_graph_task_id()"),
    ("torch.autograd.Variable._execution_engine.queue_callback", WEIGHT_GRADS, "_execution_engine.queue_callback"),
    ("torch.ops.mkl._mkl_reorder_linear_weight", CPU_DECODING, "torch.ops.mkl._mkl_reorder_linear_weight("),
    ("torch.ops.mkl._mkl_linear", CPU_DECODING, "torch.ops.mkl._mkl_linear("),
    ("torch._foreach_copy_", REF_SYNC, "torch._foreach_copy_("),
    ("torch._foreach_lerp_", REF_SYNC, "torch._foreach_lerp_("),
    ("torch.Tensor._version", ACTIVATION_RECOMPUTE, "._version"),
    ("torch.nn.Module._parameters", ACTIVATION_RECOMPUTE, "module._parameters"),
    ("torch.autograd.graph.saved_tensors_hooks", ACTIVATION_RECOMPUTE, "saved_tensors_hooks(recipes.pack"),
    ("torch.nn.Module._non_persistent_buffers_set", REF_SYNC, "._non_persistent_buffers_set"),
    ("FSDPModule._get_fsdp_state", MODELS_UTILS, "._get_fsdp_state()"),
    ("FSDPState._lazy_init/_auto_reshard_after_forward/_fsdp_param_groups", MODELS_UTILS, "_FSDP2_STATE_ATTRIBUTES"),
    ("torch.compile's OptimizedModule._orig_mod", GRPO_GENERATION, '"_orig_mod"'),
    (
        "torch.multinomial as transformers' generate calls it",
        CPU_DECODING,
        'ScopedPatch(lambda: torch, "multinomial", _multinomial)',
    ),
    (
        "GenerationMixin._prepare_generation_config",
        GRPO_GENERATION,
        "._prepare_generation_config(generation_config)[0]",
    ),
    ("GenerationMixin._supports_default_dynamic_cache", GRPO_GENERATION, '"_supports_default_dynamic_cache"'),
    ("transformers.cache_utils.DynamicLayer", PREFIX_SHARING, "(DynamicLayer)"),
    ("DynamicCache(config=...).layers", PREFIX_SHARING, "DynamicCache(config=text_config(model)).layers"),
    ("generate(cache=...)", GRPO_GENERATION, '{"cache": cache}'),
    (
        "GradientCheckpointingLayer._can_checkpoint_with_cache",
        PREFIX_SHARING,
        "layer._can_checkpoint_with_cache = True",
    ),
    ("GradientCheckpointingLayer._gradient_checkpointing_func", PREFIX_SHARING, '"_gradient_checkpointing_func"'),
    (
        "transformers.integrations.sdpa_attention.use_gqa_in_sdpa",
        GROUPED_KV_ATTENTION,
        'ScopedPatch(_sdpa_attention, "use_gqa_in_sdpa"',
    ),
    ("PretrainedConfig._attn_implementation", PREFIX_SHARING, "_attn_implementation"),
    ("PretrainedConfig._name_or_path", MODELS_UTILS, "config._name_or_path"),
    ("a boolean logits_to_keep (slice_logits_to_keep)", SCORING_PLAN, "_takes_boolean_logits_to_keep"),
    ("Trainer._set_signature_columns_if_needed", GRPO_TRAINER, "def _set_signature_columns_if_needed(self)"),
    ("Trainer._get_dataloader", GRPO_TRAINER, "self._get_dataloader("),
    ("Trainer._get_train_sampler", GRPO_TRAINER, "def _get_train_sampler(self, train_dataset=None)"),
    ("Trainer._get_eval_sampler", GRPO_TRAINER, "def _get_eval_sampler(self, eval_dataset)"),
    ("Trainer._train_batch_size", GRPO_TRAINER, "self._train_batch_size ="),
    ("Trainer._prepare_inputs", GRPO_TRAINER, "def _prepare_inputs(self"),
    ("Trainer._save_checkpoint", GRPO_TRAINER, "super()._save_checkpoint(model, trial)"),
    ("Trainer._get_output_dir", GRPO_TRAINER, "self._get_output_dir(trial=trial)"),
    ("Trainer._load_callback_state", GRPO_TRAINER, "super()._load_callback_state()"),
    ("TrainingArguments._VALID_DICT_FIELDS", GRPO_CONFIG, "TrainingArguments._VALID_DICT_FIELDS +"),
    ("TrainingArguments.gradient_checkpointing alias", GRPO_CONFIG, "gradient_checkpointing: bool = field("),
    ("accelerate's module._hf_hook", LM_HEAD, '"_hf_hook"'),
    ("accelerate's launch_command_parser()._actions", SCRIPTS_GRPO, "launch_command_parser()._actions"),
    ("DeepSpeed ZeRO-3 parameter attributes (ds_id, ds_tensor, ds_shape, ...)", LAYOUTS, "tensor.ds_tensor"),
    ("DeepSpeed ZeRO-3 parameter ds_status/ds_persist/partition()", REF_SYNC, 'ds_status.name == "AVAILABLE"'),
    (
        "DeepSpeedZeRoOffload._remove_module_hooks/setup_zero_stage3_hooks",
        MODELS_UTILS,
        "offload._remove_module_hooks()",
    ),
    ("deepspeed.runtime.torch_autocast.autocast_if_enabled", PREFIX_SHARING, "autocast_if_enabled(engine)"),
]


def relied_on(api: str, module: str, what: str) -> str:
    """The failure message of a canary: the API, the trl module that relies on it, and what it relies on."""
    return f"{module} relies on {api}: {what}. Port {module} to this version's API or cap the version in setup.py."


def require(owner, name: str, api: str, module: str):
    """`getattr(owner, name)`, or a failure naming `api` and `module` when this version has no such attribute."""
    if not hasattr(owner, name):
        label = getattr(owner, "__name__", None) or f"a {type(owner).__name__}"
        pytest.fail(relied_on(api, module, f"{label} has no attribute {name!r} in this version"))
    return getattr(owner, name)


@pytest.mark.parametrize(("api", "module", "usage"), CANARIES, ids=[c[0] for c in CANARIES])
def test_each_canary_names_a_module_that_uses_its_api(api, module, usage):
    path = REPO / module
    assert path.is_file(), f"The canary for {api} names {module}, which does not exist: update CANARIES."
    assert usage in path.read_text(encoding="utf-8"), (
        f"{module} no longer contains {usage!r}: update the canary for {api} (or remove it if nothing uses the API)."
    )


# ---- the tiny model (tests/conftest.py, trl.models.tiny) ----


@pytest.fixture
def lm_path(tiny_lm_path) -> str:
    """conftest's random tiny Qwen2ForCausalLM (`trl.models.tiny`: 2 layers, 64 wide, 4 query heads on 2 key/value
    heads, tied embeddings) and its tokenizer, saved in a temporary folder."""
    return tiny_lm_path


@pytest.fixture
def lm(lm_path):
    """The tiny model, freshly loaded (tests may change it), in eval mode, float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(lm_path, dtype=torch.float32).eval()


def _prompts(vocab_size: int, rows: int = 3, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rows, length)` random ids, left-padded by one token in the first row, and their attention mask."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab_size, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


# ---- torch: autograd internals (trl/scoring/weight_grads.py) ----


class _Probe(torch.autograd.Function):
    """Identity whose backward calls `seen()` and passes the gradient on."""

    @staticmethod
    def forward(ctx, x, seen):
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.seen()
        return grad, None


def test_current_graph_task_id_is_minus_one_outside_and_one_id_per_backward_pass():
    api, module = "torch._C._current_graph_task_id", WEIGHT_GRADS
    task_id = require(torch._C, "_current_graph_task_id", api, module)
    ids = []
    x = torch.ones(3, requires_grad=True)
    for _ in range(2):  # two backward passes over graphs with two probes each
        y = _Probe.apply(_Probe.apply(x * 2, lambda: ids.append(task_id())), lambda: ids.append(task_id()))
        y.sum().backward()
    assert task_id() == -1, relied_on(api, module, "-1 outside a backward pass")
    assert all(isinstance(i, int) and i >= 0 for i in ids), relied_on(api, module, f"an int >= 0 in a backward: {ids}")
    assert ids[0] == ids[1] and ids[2] == ids[3], relied_on(api, module, f"one id for a backward pass: {ids}")
    assert ids[1] != ids[2], relied_on(api, module, f"a new id for every backward pass: {ids}")


def test_execution_engine_queue_callback_runs_at_the_end_of_the_backward_and_raises_from_it():
    api, module = "torch.autograd.Variable._execution_engine.queue_callback", WEIGHT_GRADS
    engine = require(torch.autograd.Variable, "_execution_engine", api, module)
    queue = require(engine, "queue_callback", api, module)
    events = []
    x = torch.ones(2, requires_grad=True)

    def first():  # the first node to run its backward queues the callback; another node runs after it
        events.append("first")
        queue(lambda: events.append("callback"))

    y = _Probe.apply(_Probe.apply(x, lambda: events.append("second")), first)
    y.sum().backward()
    assert events == ["first", "second", "callback"], relied_on(api, module, f"after every node's backward: {events}")

    def failing():
        raise RuntimeError("uses of the tied weight got no gradient")

    y = _Probe.apply(x, lambda: queue(failing))
    with pytest.raises(RuntimeError, match="uses of the tied weight got no gradient"):
        y.sum().backward()


# ---- torch: private MKL ops (trl/generation/cpu_decoding.py) ----


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="PyTorch built without MKL: trl packs no weights")
@pytest.mark.parametrize("rows", [16, 32])
@pytest.mark.parametrize("bias", [True, False])
def test_mkl_packed_linear_is_bitwise_f_linear(rows, bias):
    # 16 and 32 rows only: with fewer, F.linear can take another MKL kernel (measured on an AVX-512 Xeon, torch 2.13:
    # the packed product differs from F.linear in the last bits for 1-2 rows at 64 -> 96, 1-15 rows at 576 -> 1536)
    module = CPU_DECODING
    reorder = require(torch.ops.mkl, "_mkl_reorder_linear_weight", "torch.ops.mkl._mkl_reorder_linear_weight", module)
    linear = require(torch.ops.mkl, "_mkl_linear", "torch.ops.mkl._mkl_linear", module)
    layer = nn.Linear(64, 96, bias=bias)
    packed = reorder(layer.weight.detach(), rows)
    for shape in [(rows, 64), (rows, 1, 64)]:  # one decode step of `rows` sequences, as generate's forward sees it
        x = torch.randn(shape)
        with torch.inference_mode():
            out = linear(x, packed, layer.weight, layer.bias, rows)
            plain = F.linear(x, layer.weight, layer.bias)
        assert out.shape == plain.shape, relied_on(
            "torch.ops.mkl._mkl_linear", module, f"the output shape of F.linear: {out.shape} != {plain.shape}"
        )
        assert torch.equal(out, plain), relied_on(
            "torch.ops.mkl._mkl_reorder_linear_weight + _mkl_linear",
            module,
            f"bitwise F.linear's output at {rows} rows, input {shape}",
        )


# ---- torch: private foreach ops (trl/reference/ref_sync.py) ----


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_copy_and_lerp_are_in_place_and_bitwise_the_per_tensor_ops(dtype):
    module = REF_SYNC
    copy_ = require(torch, "_foreach_copy_", "torch._foreach_copy_", module)
    lerp_ = require(torch, "_foreach_lerp_", "torch._foreach_lerp_", module)
    shapes = [(3, 5), (7,), (2, 2, 4)]
    refs = [torch.randn(s).to(dtype) for s in shapes]
    pols = [torch.randn(s).to(dtype) for s in shapes]
    pointers = [r.data_ptr() for r in refs]
    expected = [torch.lerp(r, p, 0.25) for r, p in zip(refs, pols)]
    lerp_(refs, pols, 0.25)
    assert [r.data_ptr() for r in refs] == pointers, relied_on("torch._foreach_lerp_", module, "in place")
    assert all(torch.equal(r, e) for r, e in zip(refs, expected)), relied_on(
        "torch._foreach_lerp_(tensors, others, weight)", module, f"bitwise torch.lerp per tensor ({dtype})"
    )
    copy_(refs, pols)
    assert [r.data_ptr() for r in refs] == pointers, relied_on("torch._foreach_copy_", module, "in place")
    assert all(torch.equal(r, p) for r, p in zip(refs, pols)), relied_on(
        "torch._foreach_copy_(tensors, sources)", module, f"the sources' values ({dtype})"
    )


# ---- torch: tensor and module internals (trl/scoring/activation_recompute.py, trl/reference/ref_sync.py) ----


def test_tensor_version_counts_in_place_changes_of_a_storage():
    api, module = "torch.Tensor._version", ACTIVATION_RECOMPUTE
    t = torch.zeros(4)
    before = require(t, "_version", api, module)
    view = t[1:]
    t + 1  # out of place: no change
    assert t._version == before, relied_on(api, module, "unchanged by out-of-place operations")
    t.add_(1)
    assert t._version > before, relied_on(api, module, "increased by an in-place operation")
    view.mul_(2)
    assert t._version == view._version == before + 2, relied_on(api, module, "one counter shared by a tensor's views")


def test_module_parameters_dict_is_what_the_forward_reads():
    api, module = "torch.nn.Module._parameters", ACTIVATION_RECOMPUTE
    layer = nn.Linear(3, 2)
    own = require(layer, "_parameters", api, module)
    assert isinstance(own, dict) and set(own) == {"weight", "bias"}, relied_on(api, module, f"a dict by name: {own}")
    weight = own["weight"]
    swapped = torch.randn(2, 3, requires_grad=True)  # a plain tensor, as the recompute's backward swaps in
    x = torch.randn(4, 3)
    layer._parameters.update({"weight": swapped})
    try:
        assert layer.weight is swapped, relied_on(api, module, "attribute access reads the dict")
        assert torch.equal(layer(x), F.linear(x, swapped, layer.bias)), relied_on(api, module, "the forward reads it")
    finally:
        layer._parameters.update({"weight": weight})
    assert layer.weight is weight and isinstance(layer.weight, nn.Parameter)


def test_saved_tensors_hooks_pack_the_saved_tensor_itself():
    api, module = "torch.autograd.graph.saved_tensors_hooks", ACTIVATION_RECOMPUTE
    packed, unpacked = [], []

    def pack(t):
        packed.append(t)
        return t

    def unpack(t):
        unpacked.append(t)
        return t

    a = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        hidden = a.sigmoid()
        out = hidden * b  # saves `hidden` and `b`
    storages = {t.untyped_storage().data_ptr() for t in packed}
    # trl recognises a saved tensor by the address of its storage, to rebuild it instead of keeping it
    assert hidden.untyped_storage().data_ptr() in storages, relied_on(
        api, module, "pack receives a tensor on the storage of the saved forward output"
    )
    out.sum().backward()
    assert unpacked, relied_on(api, module, "unpack called in the backward")
    torch.testing.assert_close(b.grad, hidden.detach(), rtol=0, atol=0)


def test_non_persistent_buffers_set_names_the_buffers_left_out_of_the_state_dict(lm):
    api, module = "torch.nn.Module._non_persistent_buffers_set", REF_SYNC
    names = set()
    for prefix, submodule in lm.named_modules():
        own = require(submodule, "_non_persistent_buffers_set", api, module)
        names |= {f"{prefix}.{name}" if prefix else name for name in own}
    left_out = {name for name, _ in lm.named_buffers()} - set(lm.state_dict())
    assert names == left_out and names, relied_on(
        api, module, f"the names of the buffers missing from the state dict ({sorted(left_out)}), got {sorted(names)}"
    )


# ---- torch: FSDP2 private state (trl/models/utils.py, fsdp2_gathered) ----


def test_fsdp2_private_state_records_and_restores_reshard_after_forward():
    module = MODELS_UTILS
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from torch.distributed.fsdp import FSDPModule, fully_shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard(model[0])
        fully_shard(model)
        api = "FSDPModule._get_fsdp_state"
        assert isinstance(model, FSDPModule)
        root, inner = require(model, "_get_fsdp_state", api, module)(), model[0]._get_fsdp_state()
        for name in ("_lazy_init", "_auto_reshard_after_forward", "_fsdp_param_groups"):
            require(root, name, f"FSDPState.{name}", module)
        api = "FSDPState._lazy_init"
        root._lazy_init()  # the root's setting is decided here: it keeps its parameters after forward
        assert all(g.post_forward_mesh_info is None for g in root._fsdp_param_groups), relied_on(
            api, module, "the root's parameter groups get post_forward_mesh_info=None (no reshard after forward)"
        )
        api = "FSDPState._auto_reshard_after_forward and FSDPParamGroup.post_forward_mesh_info"
        groups = inner._fsdp_param_groups
        assert len(groups) == 1 and groups[0].post_forward_mesh_info is not None, relied_on(
            api, module, "a non-root module's group reshards after forward"
        )
        auto, mesh_infos = inner._auto_reshard_after_forward, [g.post_forward_mesh_info for g in groups]
        assert auto is True, relied_on(api, module, f"True before set_reshard_after_forward, got {auto!r}")
        model[0].set_reshard_after_forward(False, recurse=False)
        assert inner._auto_reshard_after_forward is False and groups[0].post_forward_mesh_info is None, relied_on(
            api, module, "what set_reshard_after_forward(False) changes"
        )
        inner._auto_reshard_after_forward = auto  # how fsdp2_gathered restores the module's own setting
        for group, mesh_info in zip(groups, mesh_infos):
            group.post_forward_mesh_info = mesh_info
        model[0].unshard()
        model[0].reshard()
        assert groups[0].post_forward_mesh_info is mesh_infos[0]
    finally:
        dist.destroy_process_group()


# ---- torch: torch.compile's wrapper (trl/generation/grpo_generation.py) ----


def test_compiled_module_keeps_the_original_in_orig_mod():
    api, module = "torch.compile's OptimizedModule._orig_mod", GRPO_GENERATION
    layer = nn.Linear(2, 2)
    compiled = torch.compile(layer)  # wraps only: nothing is compiled before a call
    assert compiled is not layer
    assert getattr(compiled, "_orig_mod", None) is layer, relied_on(api, module, "the compiled wrapper's module")


# ---- transformers: generation (trl/generation/) ----


def test_prepare_generation_config_merges_the_models_defaults_into_a_copy(lm):
    api, module = "GenerationMixin._prepare_generation_config", GRPO_GENERATION
    prepare = require(lm, "_prepare_generation_config", api, module)
    lm.generation_config.top_k = 7
    lm.generation_config.repetition_penalty = 1.3
    given = GenerationConfig(do_sample=True, max_new_tokens=3, repetition_penalty=1.1)
    result = prepare(given)
    assert isinstance(result, tuple) and len(result) == 2, relied_on(
        api, module, f"a (GenerationConfig, model_kwargs) tuple, got {type(result).__name__}"
    )
    config = result[0]
    assert isinstance(config, GenerationConfig) and config is not given, relied_on(api, module, "a copy at [0]")
    merged = (config.max_new_tokens, config.do_sample, config.top_k, config.repetition_penalty)
    assert merged == (3, True, 7, 1.1), relied_on(
        api, module, f"the given fields, then the model's generation_config, got {merged}"
    )
    assert config.eos_token_id == lm.generation_config.eos_token_id is not None, relied_on(
        api, module, "the model's eos_token_id where the given config has none"
    )
    assert config.temperature == 1.0 and config.top_p == 1.0, relied_on(api, module, "then the global defaults")
    assert given.top_k is None and given.temperature is None, relied_on(api, module, "the given config unchanged")


def test_supports_default_dynamic_cache_is_callable_without_arguments_and_true_for_a_causal_lm(lm):
    api, module = "GenerationMixin._supports_default_dynamic_cache", GRPO_GENERATION
    supports = require(lm, "_supports_default_dynamic_cache", api, module)
    assert supports() is True, relied_on(api, module, "True for a Qwen2 causal LM, called without arguments")
    import transformers

    rwkv = getattr(transformers, "RwkvForCausalLM", None)  # a model without a DynamicCache (an RNN): plain generate
    if rwkv is not None:
        assert rwkv._supports_default_dynamic_cache() is False, relied_on(api, module, "False for RWKV, a class call")


def test_generate_samples_with_torch_multinomial_looked_up_at_call_time(lm, monkeypatch):
    api, module = "torch.multinomial as transformers' generate calls it", CPU_DECODING
    calls, original = [], torch.multinomial

    def spy(input, num_samples, *args, **kwargs):
        calls.append((tuple(input.shape), input.dtype, input.device.type, num_samples, args, kwargs))
        return original(input, num_samples, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    ids, mask = _prompts(lm.config.vocab_size)
    config = GenerationConfig(do_sample=True, max_new_tokens=2, min_new_tokens=2, pad_token_id=0)
    with torch.inference_mode():
        out = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert out.shape == (3, 8)
    assert len(calls) == 2, relied_on(api, module, f"one torch.multinomial call per sampled token, got {len(calls)}")
    shape, dtype, device, samples, args, kwargs = calls[0]
    assert (shape, device, samples) == ((3, lm.config.vocab_size), "cpu", 1), relied_on(
        api, module, f"(N, V) CPU probabilities and num_samples=1, got {shape}, {device}, {samples}"
    )
    assert dtype in (torch.float32, torch.float64) and not args and set(kwargs) <= {"generator"}, relied_on(
        api, module, f"float probabilities, no other arguments (got {dtype}, {args}, {kwargs})"
    )


# ---- transformers: the KV cache (trl/scoring/prefix_sharing.py, trl/generation/grpo_generation.py) ----


class _Counting(DynamicLayer):
    """A `DynamicLayer` subclass as trl writes them: `super().__init__()`, `lazy_initialization` to adopt given keys
    and values, an `update(key_states, value_states, *args, **kwargs)` of its own."""

    def __init__(self, keys=None, values=None):
        super().__init__()
        self.updates = []
        if keys is not None:
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values

    def update(self, key_states, value_states, *args, **kwargs):
        self.updates.append(tuple(key_states.shape))
        return super().update(key_states, value_states, *args, **kwargs)


class _ReadOnly(_Counting):
    """A read-only prefix, as trl's scoring layers: `update` returns prefix + new states without storing them, so a
    replay under gradient checkpointing sees the same cache."""

    def update(self, key_states, value_states, *args, **kwargs):
        self.updates.append(tuple(key_states.shape))
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def test_dynamic_layer_protocol_that_trl_subclasses_rely_on():
    api, module = "transformers.cache_utils.DynamicLayer", PREFIX_SHARING
    layer = DynamicLayer()  # no arguments
    assert layer.is_initialized is False and layer.keys is None, relied_on(api, module, "a new layer: no keys yet")
    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    lazy = require(layer, "lazy_initialization", api, module)
    lazy(k, v)
    assert layer.is_initialized is True, relied_on(api, module, "lazy_initialization(keys, values) initialises it")
    assert layer.keys.numel() == 0 and layer.keys.dtype == k.dtype, relied_on(api, module, "with empty keys")
    layer = DynamicLayer()
    # what the models pass: (key_states, value_states, *args, **kwargs)
    keys, values = layer.update(k, v, kwargs={"cache_position": None})
    assert layer.is_initialized and torch.equal(keys, k) and torch.equal(values, v), relied_on(
        api, module, "update() on a new layer initialises it and returns the states"
    )
    k2, v2 = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    keys, values = layer.update(k2, v2)
    assert torch.equal(keys, torch.cat([k, k2], -2)) and keys is layer.keys, relied_on(
        api, module, "update() concatenates along dim -2 into .keys/.values and returns them"
    )
    assert torch.equal(layer.values, torch.cat([v, v2], -2)) and layer.get_seq_length() == 4
    adopted = _Counting(k, v)
    assert adopted.is_initialized and adopted.keys is k and adopted.get_seq_length() == 3, relied_on(
        api, module, "a subclass adopts keys/values after lazy_initialization; get_seq_length reads .keys"
    )


def test_dynamic_cache_layers_are_replaceable_and_the_forward_updates_each_once(lm):
    api, module = "DynamicCache(config=...).layers", PREFIX_SHARING
    cache = DynamicCache(config=lm.config)
    layers = require(cache, "layers", api, module)
    assert [type(layer) for layer in layers] == [DynamicLayer] * lm.config.num_hidden_layers, relied_on(
        api, module, f"one plain DynamicLayer per full-attention layer, got {[type(x).__name__ for x in layers]}"
    )
    ids, mask = _prompts(lm.config.vocab_size)
    positions = _positions(mask)
    with torch.no_grad():
        whole = lm(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        cache.layers = [_Counting() for _ in cache.layers]  # trl assigns its own layers
        lm(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], position_ids=positions[:, :-2], cache=cache)
        heads, dim = lm.config.num_key_value_heads, lm.config.hidden_size // lm.config.num_attention_heads
        assert [layer.updates for layer in cache.layers] == [[(3, heads, 4, dim)]] * 2, relied_on(
            api, module, "the forward calls update(key_states, ...) of each layer once, (rows, kv heads, T, dim)"
        )
        rest = lm(input_ids=ids[:, -2:], attention_mask=mask, position_ids=positions[:, -2:], cache=cache).logits
    torch.testing.assert_close(
        rest, whole[:, -2:], rtol=1e-5, atol=1e-5, msg=relied_on(api, module, "the same logits")
    )


def test_generate_continues_from_a_given_cache_of_subclassed_layers(lm):
    api, module = "generate(cache=...)", GRPO_GENERATION
    ids, mask = _prompts(lm.config.vocab_size)
    config = GenerationConfig(do_sample=False, max_new_tokens=3, min_new_tokens=3, pad_token_id=0)
    with torch.inference_mode():
        plain = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        cache = DynamicCache(config=lm.config)
        cache.layers = [_Counting() for _ in cache.layers]
        prefix = ids[:, :-1]
        lm(input_ids=prefix, attention_mask=mask[:, :-1], position_ids=_positions(mask[:, :-1]), cache=cache)
        shared = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config, cache=cache)
    assert torch.equal(shared, plain), relied_on(api, module, "the tokens of plain generate (greedy)")
    # the prompt pass, then generate's first step over the last prompt token only, then one token per step
    assert [update[2] for update in cache.layers[0].updates] == [5, 1, 1, 1], relied_on(
        api, module, f"generate keeps the given layers and continues after them: {cache.layers[0].updates}"
    )


def test_gradient_checkpointing_keeps_the_cache_only_with_can_checkpoint_with_cache(lm):
    api, module = "GradientCheckpointingLayer._can_checkpoint_with_cache", PREFIX_SHARING
    assert require(GradientCheckpointingLayer, "_can_checkpoint_with_cache", api, module) is False
    lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # as Trainer does
    lm.train()
    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    func_api = "GradientCheckpointingLayer._gradient_checkpointing_func"
    for layer in layers:
        assert layer.gradient_checkpointing is True
        func = require(layer, "_gradient_checkpointing_func", func_api, module)
        assert isinstance(func, functools.partial) and func.keywords.get("use_reentrant") is False, relied_on(
            func_api, module, f"a functools.partial with the checkpointing keywords, got {func!r}"
        )
    ids, mask = _prompts(lm.config.vocab_size)
    with torch.no_grad():
        prompt = DynamicCache(config=lm.config)
        lm(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], position_ids=_positions(mask[:, :-2]), cache=prompt)
    reads = {}
    for keep in (False, True):
        cache = DynamicCache(config=lm.config)
        cache.layers = [_ReadOnly(layer.keys, layer.values) for layer in prompt.layers]
        for layer in layers:
            layer._can_checkpoint_with_cache = keep  # on the instance, as trl sets it
        try:  # a dropped cache leaves the mask longer than the keys: trl's scoring catches that error
            out = lm(input_ids=ids[:, -2:], attention_mask=mask, position_ids=_positions(mask)[:, -2:], cache=cache)
            out.logits.sum().backward()
        except RuntimeError:
            assert not keep
        reads[keep] = [len(layer.updates) for layer in cache.layers]
        for layer in layers:
            del layer._can_checkpoint_with_cache
    assert reads[False] == [0, 0], relied_on(api, module, f"the cache dropped when False, got reads {reads[False]}")
    assert reads[True] == [2, 2], relied_on(
        api, module, f"the cache kept when True, read by the forward and its replay in the backward: {reads[True]}"
    )


def test_use_gqa_in_sdpa_is_looked_up_by_sdpa_attention_forward_at_every_call(lm, monkeypatch):
    api, module = "transformers.integrations.sdpa_attention.use_gqa_in_sdpa", GROUPED_KV_ATTENTION
    from transformers.integrations import sdpa_attention

    original = require(sdpa_attention, "use_gqa_in_sdpa", api, module)
    assert list(inspect.signature(original).parameters) == ["attention_mask", "key", "value"], relied_on(
        api, module, f"a check of (attention_mask, key, value), got {inspect.signature(original)}"
    )
    ids, mask = _prompts(lm.config.vocab_size)
    with torch.no_grad():
        plain = lm(input_ids=ids, attention_mask=mask).logits
    asked, sdpa_calls, sdpa = [], [], F.scaled_dot_product_attention

    def yes(attention_mask, key, value):
        asked.append(tuple(key.shape))
        return True

    def spy(query, key, value, *args, **kwargs):
        sdpa_calls.append((tuple(key.shape), kwargs.get("enable_gqa", False)))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", yes)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        grouped = lm(input_ids=ids, attention_mask=mask).logits
    heads, dim = lm.config.num_key_value_heads, lm.config.hidden_size // lm.config.num_attention_heads
    assert asked == [(3, heads, 6, dim)] * 2, relied_on(
        api, module, f"asked once per layer by its module name: {asked}"
    )
    assert sdpa_calls == [((3, heads, 6, dim), True)] * 2, relied_on(
        api, module, f"True: SDPA gets the grouped key/value heads with enable_gqa=True, got {sdpa_calls}"
    )
    torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-5, msg=relied_on(api, module, "the same logits"))


# ---- transformers: config and model internals ----


def test_config_attn_implementation_names_the_attention_in_use(lm_path):
    api, module = "PretrainedConfig._attn_implementation", PREFIX_SHARING
    from transformers import AutoModelForCausalLM

    for requested, expected in ((None, "sdpa"), ("eager", "eager")):
        kwargs = {} if requested is None else {"attn_implementation": requested}
        config = AutoModelForCausalLM.from_pretrained(lm_path, **kwargs).config
        text = config.get_text_config()
        assert getattr(text, "_attn_implementation", None) == expected, relied_on(
            api, module, f"{expected!r} (requested: {requested}), got {getattr(text, '_attn_implementation', None)!r}"
        )


def test_config_name_or_path_is_where_the_model_was_loaded_from(lm_path):
    api = "PretrainedConfig._name_or_path"
    module = f"{MODELS_UTILS} (and {GRPO_TRAINER}, trl/trainer/grpo_rewards.py)"
    from transformers import AutoModelForCausalLM

    config = AutoModelForCausalLM.from_pretrained(lm_path).config
    assert getattr(config, "_name_or_path", None) == lm_path, relied_on(
        api, module, "the path given to from_pretrained (where the tokenizer and a ZeRO-3 reference are loaded from)"
    )


def test_boolean_logits_to_keep_gives_the_kept_positions_flattened_in_row_order(lm):
    api, module = "a boolean logits_to_keep (slice_logits_to_keep)", SCORING_PLAN
    ids, mask = _prompts(lm.config.vocab_size)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[0, [1, 4]] = keep[2, [0, 2, 5]] = True
    with torch.no_grad():
        whole = lm(input_ids=ids, attention_mask=mask, logits_to_keep=0).logits
        kept = lm(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
    flat = kept.reshape(-1, kept.size(-1))
    assert flat.shape == (5, lm.config.vocab_size), relied_on(api, module, f"one row per kept position: {kept.shape}")
    torch.testing.assert_close(flat, whole[keep], rtol=1e-5, atol=1e-5, msg=relied_on(api, module, "in row order"))


# ---- transformers: Trainer internals that GRPOTrainer overrides or calls (trl/trainer/grpo_trainer.py) ----


class _HookedTrainer(Trainer):
    """A Trainer overriding the private hooks the way `GRPOTrainer` does, recording each call."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        super().__init__(*args, **kwargs)
        self._train_batch_size = 3  # GRPOTrainer: one loader item is a whole generation batch

    def _set_signature_columns_if_needed(self):
        self.calls.append(("_set_signature_columns_if_needed",))
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def _get_train_sampler(self, train_dataset=None):
        self.calls.append(("_get_train_sampler", train_dataset))
        return torch.utils.data.SequentialSampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        self.calls.append(("_get_eval_sampler", eval_dataset))
        return torch.utils.data.SequentialSampler(eval_dataset)

    def get_train_dataloader(self):
        return self._get_dataloader(
            self.train_dataset, "Training", self._train_batch_size, self._get_train_sampler, True
        )

    def _prepare_inputs(self, inputs):
        self.calls.append(("_prepare_inputs", inputs))
        return {"x": torch.tensor([float(len(row["prompt"])) for row in inputs])}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return (model.w * inputs["x"]).mean()

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        self.calls.append(
            ("_save_checkpoint", trial, folder, os.path.isfile(os.path.join(folder, "trainer_state.json")))
        )

    def _load_callback_state(self):
        self.calls.append(("_load_callback_state",))
        super()._load_callback_state()


class _Weight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))


@pytest.fixture(scope="module")
def trainer_calls(tmp_path_factory):
    """The calls of `_HookedTrainer`'s hooks over 2 steps (a checkpoint after each), a resume from the first
    checkpoint, and an eval dataloader."""
    from datasets import Dataset

    output_dir = str(tmp_path_factory.mktemp("canary-trainer"))
    dataset = Dataset.from_dict({"prompt": ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"], "extra": list(range(6))})
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=1,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    def trainer():
        return _HookedTrainer(
            model=_Weight(), args=TrainingArguments(**settings), data_collator=lambda rows: rows, train_dataset=dataset
        )

    first = trainer()
    first.train()
    first.get_eval_dataloader(dataset)
    resumed = trainer()
    resumed.train(resume_from_checkpoint=os.path.join(output_dir, "checkpoint-1"))
    return {"first": first.calls, "resumed": resumed.calls, "output_dir": output_dir, "dataset": dataset}


def _named(calls, name):
    return [call[1:] for call in calls if call[0] == name]


def test_trainer_reads_the_signature_columns_that_set_signature_columns_if_needed_sets(trainer_calls):
    api, module = "Trainer._set_signature_columns_if_needed", GRPO_TRAINER
    assert _named(trainer_calls["first"], "_set_signature_columns_if_needed"), relied_on(api, module, "called")
    batch = _named(trainer_calls["first"], "_prepare_inputs")[0][0]
    assert all(set(row) == {"prompt"} for row in batch), relied_on(
        api, module, f"the dataset's columns outside _signature_columns removed, got {batch}"
    )


def test_trainer_get_dataloader_takes_the_sampler_function_and_batch_size(trainer_calls):
    api, module = "Trainer._get_dataloader(dataset, description, batch_size, sampler_fn, is_training)", GRPO_TRAINER
    parameters = list(inspect.signature(Trainer._get_dataloader).parameters)
    assert parameters[:6] == ["self", "dataset", "description", "batch_size", "sampler_fn", "is_training"], relied_on(
        api, module, f"these positional parameters, got {parameters}"
    )
    batches = [call[0] for call in _named(trainer_calls["first"], "_prepare_inputs")]
    prompts = [[row["prompt"] for row in batch] for batch in batches]
    assert prompts == [["a", "bb", "ccc"], ["dddd", "eeeee", "ffffff"]], relied_on(
        "Trainer._get_dataloader and Trainer._train_batch_size",
        module,
        f"batches of _train_batch_size rows, in the sampler's order, got {prompts}",
    )


def test_trainer_get_train_sampler_is_called_with_the_dataset(trainer_calls):
    api, module = "Trainer._get_train_sampler(train_dataset)", GRPO_TRAINER
    parameters = list(inspect.signature(Trainer._get_train_sampler).parameters)
    assert parameters == ["self", "train_dataset"], relied_on(api, module, f"this signature, got {parameters}")
    calls = _named(trainer_calls["first"], "_get_train_sampler")
    assert calls and all(len(dataset) == 6 and dataset.column_names == ["prompt"] for (dataset,) in calls), relied_on(
        api, module, f"called with the train dataset (its used columns), got {calls}"
    )


def test_trainer_get_eval_sampler_is_called_with_the_eval_dataset(trainer_calls):
    api, module = "Trainer._get_eval_sampler(eval_dataset)", GRPO_TRAINER
    calls = _named(trainer_calls["first"], "_get_eval_sampler")
    assert len(calls) == 1 and len(calls[0][0]) == 6, relied_on(api, module, f"called by get_eval_dataloader: {calls}")


def test_trainer_prepare_inputs_gets_each_collated_batch(trainer_calls):
    api, module = "Trainer._prepare_inputs", GRPO_TRAINER
    calls = _named(trainer_calls["first"], "_prepare_inputs")
    assert len(calls) == 2 and all(isinstance(batch, list) for (batch,) in calls), relied_on(
        api, module, f"called by training_step with the collator's output, once per step, got {len(calls)} calls"
    )


def test_trainer_save_checkpoint_writes_checkpoint_step_under_get_output_dir(trainer_calls):
    api, module = "Trainer._save_checkpoint(model, trial) and Trainer._get_output_dir(trial=...)", GRPO_TRAINER
    calls = _named(trainer_calls["first"], "_save_checkpoint")
    expected = [(None, os.path.join(trainer_calls["output_dir"], f"checkpoint-{step}"), True) for step in (1, 2)]
    assert calls == expected, relied_on(api, module, f"one call per save, the folder written by super(): {calls}")


def test_trainer_load_callback_state_is_called_on_resume(trainer_calls):
    api, module = "Trainer._load_callback_state", GRPO_TRAINER
    assert _named(trainer_calls["resumed"], "_load_callback_state") == [()], relied_on(
        api, module, "called once when training resumes from a checkpoint"
    )
    assert not _named(trainer_calls["first"], "_load_callback_state")


def test_training_arguments_valid_dict_fields_parses_json_strings_of_subclass_fields():
    api, module = "TrainingArguments._VALID_DICT_FIELDS", GRPO_CONFIG
    fields = require(TrainingArguments, "_VALID_DICT_FIELDS", api, module)
    assert isinstance(fields, list) and all(isinstance(name, str) for name in fields), relied_on(
        api, module, f"a list of field names (extended with +), got {fields!r}"
    )

    @dataclass
    class Arguments(TrainingArguments):
        _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["chat_template_kwargs"]
        chat_template_kwargs: dict | str | None = field(default=None)

    args = Arguments(output_dir="unused", chat_template_kwargs='{"enable_thinking": false}', report_to="none")
    assert args.chat_template_kwargs == {"enable_thinking": False}, relied_on(
        api, module, f"the JSON string of a listed field parsed into a dict, got {args.chat_template_kwargs!r}"
    )


def test_training_arguments_gradient_checkpointing_alias_turns_activation_checkpointing_on():
    api = "TrainingArguments.gradient_checkpointing (a deprecated alias of activation_checkpointing)"
    module = GRPO_CONFIG

    @dataclass
    class Arguments(TrainingArguments):
        gradient_checkpointing: bool = field(default=True)  # GRPOConfig's default, as TRL's

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the alias's deprecation warning
        args = Arguments(output_dir="unused", report_to="none")
    assert getattr(args, "activation_checkpointing", None) is True and args.gradient_checkpointing is True, relied_on(
        api, module, "a subclass default of gradient_checkpointing=True turns activation checkpointing on"
    )


# ---- accelerate ----


def test_accelerate_hook_sets_hf_hook_and_an_instance_forward():
    module = f"{LM_HEAD} (and {CPU_DECODING}, which skips layers with an instance forward)"
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, ModelHook())
    assert isinstance(getattr(layer, "_hf_hook", None), ModelHook), relied_on(
        "accelerate's module._hf_hook", module, "add_hook_to_module sets it"
    )
    assert "forward" in vars(layer), relied_on("accelerate's add_hook_to_module", module, "an instance forward")
    remove_hook_from_module(layer)
    assert not hasattr(layer, "_hf_hook")


def test_accelerate_launch_parser_actions_list_its_options():
    api, module = "accelerate's launch_command_parser()._actions", SCRIPTS_GRPO
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    actions = require(parser, "_actions", api, module)
    options = {option for action in actions for option in action.option_strings}
    assert isinstance(parser, argparse.ArgumentParser) and {"--config_file", "--num_processes"} <= options, relied_on(
        api, module, "argparse actions whose option_strings hold accelerate launch's options"
    )


# ---- DeepSpeed (ZeRO-3 parameters and hooks; read by source, as a ZeRO-3 engine needs distributed ops) ----


def test_deepspeed_zero3_parameters_get_the_attributes_trl_reads():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import partition_parameters

    api, module = "DeepSpeed ZeRO-3 parameter attributes", f"{LAYOUTS}, {REF_SYNC} and {MODELS_UTILS}"
    status = require(partition_parameters, "ZeroParamStatus", "deepspeed ZeroParamStatus", module)
    assert status.AVAILABLE.name == "AVAILABLE", relied_on(api, module, "ds_status.name == 'AVAILABLE' when gathered")
    convert = require(
        partition_parameters.Init, "_convert_to_deepspeed_param", "Init._convert_to_deepspeed_param", module
    )
    source = inspect.getsource(convert)
    for name in ("ds_id", "ds_shape", "ds_tensor", "ds_status", "ds_persist", "ds_process_group", "partition"):
        assert f"param.{name} = " in source, relied_on(
            f"the ZeRO-3 parameter attribute {name}", module, "set on every parameter that zero.Init converts"
        )


def test_deepspeed_zero3_hook_api_that_zero3_gathered_swaps():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import parameter_offload

    module = MODELS_UTILS
    offload = require(parameter_offload, "DeepSpeedZeRoOffload", "deepspeed DeepSpeedZeRoOffload", module)
    for name in ("_remove_module_hooks", "setup_zero_stage3_hooks"):
        method = require(offload, name, f"DeepSpeedZeRoOffload.{name}", module)
        assert list(inspect.signature(method).parameters) == ["self"], relied_on(
            f"DeepSpeedZeRoOffload.{name}", module, "a method called without arguments"
        )
    source = inspect.getsource(offload)
    for name in ("forward_hooks", "backward_hooks"):
        assert f"self.{name} = []" in source and f"self.{name}.append(" in source, relied_on(
            f"DeepSpeedZeRoOffload.{name}", module, "a list of the hook handles it installs"
        )
    stack = require(parameter_offload, "FWD_MODULE_STACK", "deepspeed parameter_offload.FWD_MODULE_STACK", module)
    assert isinstance(stack, list), relied_on("parameter_offload.FWD_MODULE_STACK", module, "a module-level list")


def test_deepspeed_autocast_if_enabled_follows_the_engine():
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime import torch_autocast

    api, module = "deepspeed.runtime.torch_autocast.autocast_if_enabled", PREFIX_SHARING
    autocast_if_enabled = require(torch_autocast, "autocast_if_enabled", api, module)
    device = get_accelerator().device_name()

    class Engine:
        def __init__(self, enabled):
            self.enabled = enabled

        def torch_autocast_enabled(self):
            return self.enabled

        def torch_autocast_dtype(self):
            return torch.bfloat16

    for enabled in (False, True):
        with autocast_if_enabled(Engine(enabled)):
            inside = torch.is_autocast_enabled(device)
            dtype = torch.get_autocast_dtype(device)
        assert inside is enabled and (not enabled or dtype == torch.bfloat16), relied_on(
            api, module, f"a context that runs the engine's torch_autocast setting (enabled={enabled}), got {inside}"
        )
