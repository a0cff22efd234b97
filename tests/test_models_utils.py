# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.models.utils: the reference model is a frozen, separate, bitwise copy; dropout can be switched off."""

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from trl import create_reference_model
from trl.models.utils import (
    PathNotFoundError,
    _inference_deepspeed_config,
    adapter_parameters,
    check_distributed_setup,
    disable_dropout_in_model,
    explain_missing_path,
    load_policy,
    load_tokenizer,
)


def test_create_reference_model_is_a_frozen_bitwise_copy(tiny_lm_path):
    policy = AutoModelForCausalLM.from_pretrained(tiny_lm_path).train()
    reference = create_reference_model(policy)
    pol, ref = dict(policy.named_parameters()), dict(reference.named_parameters())
    assert pol.keys() == ref.keys()
    for name in pol:
        assert torch.equal(pol[name], ref[name]), name
        assert ref[name].dtype == pol[name].dtype and ref[name].device == pol[name].device
        assert ref[name].data_ptr() != pol[name].data_ptr()  # separate storage
        assert not ref[name].requires_grad and pol[name].requires_grad
    assert not reference.training and policy.training
    # Tied embeddings stay tied in the copy (one tensor, as in the policy).
    assert reference.lm_head.weight is reference.model.embed_tokens.weight
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    assert not torch.equal(next(policy.parameters()), next(reference.parameters()))


def test_disable_dropout_in_model():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.3), nn.Sequential(nn.Dropout(0.5)))
    disable_dropout_in_model(model)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.0, 0.0]
    model.train()
    x = torch.ones(1000, 2)
    assert torch.equal(model(x), model(x))


@pytest.mark.parametrize("pattern", [None, "model.layers.{layer}"])
def test_create_reference_model_shares_the_first_layers(tiny_lm_path, pattern):
    policy = AutoModelForCausalLM.from_pretrained(tiny_lm_path).train()
    reference = create_reference_model(policy, num_shared_layers=1, pattern=pattern)
    pol, ref = dict(policy.named_parameters()), dict(reference.named_parameters())
    names = list(pol)
    first_unshared = names.index(next(n for n in names if n.startswith("model.layers.1.")))
    shared, unshared = names[:first_unshared], names[first_unshared:]
    assert shared[0] == "model.embed_tokens.weight" and any(n.startswith("model.layers.0.") for n in shared)
    for name in shared:  # same storage, frozen in both models
        assert ref[name].data_ptr() == pol[name].data_ptr(), name
        assert not pol[name].requires_grad and not ref[name].requires_grad
    for name in unshared:  # a separate frozen copy; the policy keeps training these
        assert ref[name].data_ptr() != pol[name].data_ptr() and torch.equal(ref[name], pol[name]), name
        assert pol[name].requires_grad and not ref[name].requires_grad
    assert not reference.training


def test_create_reference_model_without_a_matching_layer_pattern_raises():
    with pytest.raises(ValueError, match=r"No parameter name contains 'h.2', so the first 2 layers cannot be shared"):
        create_reference_model(nn.Sequential(nn.Linear(2, 2)), num_shared_layers=2, pattern="h.{layer}")
    with pytest.raises(ValueError, match=r"No parameter name contains 'transformer.h.1' or 'model.decoder.layers.1'"):
        create_reference_model(nn.Sequential(nn.Linear(2, 2)), num_shared_layers=1)


def test_adapter_parameters_match_the_adapter_name_as_a_whole_component(tiny_lm_path):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_lm_path), lora)
    model.add_adapter("def", LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0))
    default = adapter_parameters(model, "default")
    layers = model.config.num_hidden_layers
    assert len(default) == 2 * layers and all(".default." in name for name in default)  # "def" is not "default"
    assert len(adapter_parameters(model, "def")) == 2 * layers
    assert all(default[name] is model.get_parameter(name) for name in default)  # the parameters, not copies


def test_inference_deepspeed_config_zero3():
    policy_config = {
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "offload_optimizer": {"device": "cpu"},
        },
        "optimizer": {"type": "AdamW"},
        "scheduler": {"type": "WarmupLR"},
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }
    config = _inference_deepspeed_config(policy_config, hidden_size=64)
    assert "optimizer" not in config and "scheduler" not in config and "gradient_clipping" not in config
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_param_persistence_threshold"] == 0 and "offload_optimizer" not in zero
    assert zero["zero_hpz_partition_size"] == 1
    assert zero["reduce_bucket_size"] == int(0.9 * 64 * 64) and config["bf16"] == {"enabled": True}
    assert config["train_micro_batch_size_per_gpu"] == 1 and "train_batch_size" not in config
    assert policy_config["optimizer"] == {"type": "AdamW"}  # the policy's config is not modified


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_inference_deepspeed_config_replicated_stages(stage):
    config = _inference_deepspeed_config(
        {"zero_optimization": {"stage": stage, "overlap_comm": True}, "train_micro_batch_size_per_gpu": 2}, 64
    )
    assert config["zero_optimization"] == {"stage": 0} and config["train_micro_batch_size_per_gpu"] == 2


def test_zero3_reference_is_loaded_with_the_policys_from_pretrained_kwargs(tiny_lm_path, monkeypatch):
    """A ZeRO-3 partitioned policy cannot be deep-copied: its reference is loaded again, from the same revision and
    GGUF file as the policy (dense), with the policy's config and dtype."""
    policy = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    for parameter in policy.parameters():
        parameter.ds_id = 0  # what `deepspeed.zero.Init` marks a partitioned parameter with
    calls = []

    def from_pretrained(path, **kwargs):
        calls.append((path, kwargs))
        return AutoModelForCausalLM.from_config(kwargs["config"])

    monkeypatch.setattr(type(policy), "from_pretrained", staticmethod(from_pretrained))
    init_kwargs = {"revision": "v2", "gguf_file": "model.gguf", "dtype": torch.float16}
    reference = create_reference_model(policy, from_pretrained_kwargs=init_kwargs)
    [(path, kwargs)] = calls
    assert path == tiny_lm_path and kwargs["revision"] == "v2" and kwargs["gguf_file"] == "model.gguf"
    assert kwargs["config"] is policy.config and kwargs["dtype"] == policy.dtype == torch.float32
    assert kwargs["quantization_config"].dequantize is True  # dense GGUF weights, like the policy's
    assert all(not p.requires_grad for p in reference.parameters()) and not reference.training


# ---------------------------------------------------------------- paths that do not exist


def _args(**overrides):
    from types import SimpleNamespace

    return SimpleNamespace(model_init_kwargs=None, trust_remote_code=False, gradient_checkpointing=False, **overrides)


def test_load_policy_missing_path_says_it_does_not_exist(tmp_path, monkeypatch):
    """Before: `OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name'` for an absolute path and
    `OSError: We couldn't connect to 'https://huggingface.co' to load the files ...` for a relative one."""
    missing = str(tmp_path / "checkpoints" / "step-100")
    with pytest.raises(PathNotFoundError) as raised:
        load_policy(missing, _args())
    assert str(raised.value) == (
        f"Model '{missing}' is not an existing local folder (or file) and could not be loaded from the Hugging Face "
        f"Hub (OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{missing}'. Use "
        "`repo_type` argument if needed.)"
    )
    assert isinstance(raised.value, FileNotFoundError)  # and so an OSError, like the loader's own error
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathNotFoundError) as raised:
        load_policy("my_model", _args())
    assert str(raised.value) == (
        "Model 'my_model' is not an existing local folder (or file) and could not be loaded from the Hugging Face "
        "Hub (OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
        "the cached files.)"
    )


def test_load_tokenizer_missing_path_says_it_does_not_exist(tiny_lm_path, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    assert load_tokenizer(model, _args()).pad_token is not None  # the saved one loads as before
    moved = str(tmp_path / "moved")
    model.config._name_or_path = moved
    with pytest.raises(PathNotFoundError) as raised:
        load_tokenizer(model, _args())
    assert str(raised.value).startswith(
        f"Tokenizer '{moved}' is not an existing local folder (or file) and could not be loaded from the Hugging "
        "Face Hub (OSError: "
    )
    model.config._name_or_path = ""  # built in memory: no saved tokenizer anywhere
    with pytest.raises(ValueError) as raised:
        load_tokenizer(model, _args())
    assert str(raised.value) == (
        "The model was not loaded from a path (its `config._name_or_path` is empty), so there is no saved tokenizer "
        "to load: pass `processing_class`."
    )


def test_explain_missing_path_leaves_existing_paths_and_other_errors_alone(tmp_path):
    with pytest.raises(OSError, match="^disk on fire$") as raised:  # the path exists: unchanged
        with explain_missing_path(str(tmp_path)):
            raise OSError("disk on fire")
    assert type(raised.value) is OSError
    with pytest.raises(KeyError):  # not a loading error: unchanged
        with explain_missing_path(str(tmp_path / "missing")):
            raise KeyError("x")
    with explain_missing_path(str(tmp_path / "missing")):  # nothing raised: nothing to explain
        pass


class FakeAccelerator:
    def __init__(self, num_processes: int, distributed_type: str):
        from accelerate.utils import DistributedType

        self.num_processes, self.distributed_type = num_processes, DistributedType(distributed_type)
        self.is_main_process = True


def test_processes_launched_but_not_distributed_are_refused(monkeypatch):
    """`accelerate launch` on 2 CPU processes without use_cpu leaves each process alone (distributed_type NO)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ValueError,
        match=r"2 processes were launched \(WORLD_SIZE=2\) but accelerate set this one up "
        r"alone \(distributed_type NO\).*set `use_cpu=True` in the GRPOConfig",
    ):
        check_distributed_setup(FakeAccelerator(1, "NO"))
    check_distributed_setup(FakeAccelerator(2, "MULTI_CPU"))  # launched and distributed
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_distributed_setup(FakeAccelerator(1, "NO"))  # one process


def test_fsdp_dropped_on_cpu_processes_is_a_warning(monkeypatch):
    from trl.models import utils

    messages = []
    monkeypatch.setattr(utils.logger, "warning", messages.append)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    check_distributed_setup(FakeAccelerator(2, "MULTI_CPU"))
    assert len(messages) == 1 and "accelerate does not shard on CPU processes: this run is DDP" in messages[0]
    check_distributed_setup(FakeAccelerator(2, "FSDP"))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    check_distributed_setup(FakeAccelerator(2, "MULTI_CPU"))
    assert len(messages) == 1
