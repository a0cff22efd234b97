# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: flags, YAML config, local dataset formats, reward-function resolution."""

import pytest
import yaml

from trl.cli import main as cli_main
from trl.models.tiny import build_tiny_causal_lm
from trl.scripts.grpo import main as grpo_main
from trl.scripts.grpo import resolve_reward_func
from trl.scripts.utils import load_dataset_from_path
from trl.tasks import accuracy_reward, arithmetic_corpus, make_arithmetic_dataset


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("cli_model")), corpus=arithmetic_corpus())


COMMON = [
    "--per_device_train_batch_size",
    "8",
    "--num_generations",
    "4",
    "--max_completion_length",
    "4",
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--gradient_checkpointing",
    "false",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
    "--disable_tqdm",
    "true",
]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved"])
def test_dataset_formats_load(tmp_path, fmt):
    dataset = make_arithmetic_dataset(10)
    if fmt == "jsonl":
        path = str(tmp_path / "d.jsonl")
        dataset.to_json(path)
    elif fmt == "parquet":
        path = str(tmp_path / "d.parquet")
        dataset.to_parquet(path)
    else:
        path = str(tmp_path / "saved")
        dataset.save_to_disk(path)
    loaded = load_dataset_from_path(path)["train"]
    assert loaded["prompt"] == dataset["prompt"] and loaded["answer"] == dataset["answer"]


def test_cli_flags_train_and_sync(tmp_path, model_dir):
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(32).to_json(data)
    trainer = grpo_main(
        [
            "--model_name_or_path",
            model_dir,
            "--dataset_name",
            data,
            "--reward_funcs",
            "closeness_reward",
            "accuracy_reward",
            "--beta",
            "0.04",
            "--sync_ref_model",
            "true",
            "--ref_model_sync_steps",
            "1",
            "--max_steps",
            "2",
            "--logging_steps",
            "1",
            "--output_dir",
            str(tmp_path / "out"),
            *COMMON,
        ]
    )
    assert trainer.state.global_step == 2
    assert trainer.sync_callback.num_syncs == 2
    assert trainer.reward_func_names == ["closeness_reward", "accuracy_reward"]
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_cli_yaml_config_with_override(tmp_path, model_dir):
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(32).to_json(data)
    config = {
        "model_name_or_path": model_dir,
        "dataset_name": data,
        "reward_funcs": ["accuracy_reward"],
        "max_steps": 5,
        "beta": 0.1,
        "sync_ref_model": True,
        "ref_model_sync_steps": 1,
        "ref_model_mixup_alpha": 0.5,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = grpo_main([f"--config={path}", "--max_steps", "1", "--attn_implementation", "eager", *COMMON])
    assert trainer.state.global_step == 1  # the flag overrides the file
    assert trainer.args.beta == 0.1 and trainer.args.ref_model_mixup_alpha == 0.5
    assert trainer.model.config._attn_implementation == "eager"
    assert trainer.sync_callback.num_syncs == 1


def test_cli_model_init_kwargs_as_json(tmp_path, model_dir):
    """`--model_init_kwargs` is JSON text on the command line (e.g. `'{"gguf_file": "model.gguf"}'`)."""
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(8).to_json(data)
    argv = ["--model_name_or_path", model_dir, "--dataset_name", data, "--max_steps", "1"]
    argv += ["--model_init_kwargs", '{"attn_implementation": "eager"}', "--output_dir", str(tmp_path / "out")]
    trainer = grpo_main(argv + COMMON)
    assert trainer.args.model_init_kwargs["attn_implementation"] == "eager"
    assert trainer.model.config._attn_implementation == "eager"


def test_cli_rejects_unknown_yaml_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"not_a_field": 1}))
    with pytest.raises(ValueError, match=r"Unknown keys in the config file: \['not_a_field'\]"):
        grpo_main(["--config", str(path)])


def test_resolve_reward_func(tmp_path):
    assert resolve_reward_func("accuracy_reward") is accuracy_reward
    assert resolve_reward_func("trl.tasks.arithmetic:closeness_reward").__name__ == "closeness_reward"
    assert resolve_reward_func(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="Unknown reward function 'nope'"):
        resolve_reward_func("nope")


def test_console_script_usage(capsys):
    assert cli_main([]) == 2
    assert "usage: trl {grpo,convert-gguf}" in capsys.readouterr().err  # a usage error goes to stderr
    assert cli_main(["--help"]) == 0
    assert "usage: trl {grpo,convert-gguf}" in capsys.readouterr().out


def test_shipped_example_yaml_parses():
    import os

    from trl import GRPOConfig
    from trl.scripts.grpo import GRPOScriptArguments, ModelConfig
    from trl.scripts.utils import TrlParser

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "grpo_demo.yaml")
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", path, "--max_steps", "7"])
    assert model_args.model_name_or_path == "demo_output/model"
    assert script_args.reward_funcs == ["accuracy_reward"]
    assert training_args.beta == 0.5 and training_args.max_completion_length == 1
    assert training_args.sync_ref_model and training_args.ref_model_sync_steps == 25
    assert training_args.max_steps == 7  # the flag overrides the file
