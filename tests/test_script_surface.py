# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""TRL 1.16's script surface: `ModelConfig`, `get_peft_config`, `get_quantization_config`, `ScriptArguments`,
dataset mixtures (`DatasetMixtureConfig`, `get_dataset`), `TrlParser`, the `--reward_funcs` names, QLoRA on the CPU,
and TRL 1.16's own `trl/scripts/grpo.py` file running unchanged on this package."""

import dataclasses
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from upstream_venv import upstream_env, upstream_trl_python_or_skip

from trl import (
    DatasetMixtureConfig,
    GRPOConfig,
    GRPOTrainer,
    ModelConfig,
    ScriptArguments,
    TrlParser,
    get_dataset,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
    rewards,
)
from trl.scripts.grpo import GRPOScriptArguments, make_parser, resolve_reward_func
from trl.scripts.utils import DatasetConfig
from trl.tasks import make_arithmetic_dataset


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEFT_FLAGS = ["--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "v_proj"]
PEFT_FLAGS += ["--use_rslora", "--lora_modules_to_save", "lm_head"]
QUANT_FLAGS = ["--load_in_4bit", "--bnb_4bit_quant_type", "fp4", "--use_bnb_nested_quant", "--dtype", "bfloat16"]

# Run in TRL 1.16's venv: its dataclasses' fields and what its helpers build from the same flags, as JSON.
UPSTREAM_PROBE = """
import dataclasses, json, sys
from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config
from trl.scripts.grpo import GRPOScriptArguments
from trl.scripts.utils import DatasetConfig

def described(cls):
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = {"default": None if default is dataclasses.MISSING else default,
                       "required": default is dataclasses.MISSING, "choices": f.metadata.get("choices")}
    return out

classes = (ModelConfig, ScriptArguments, GRPOScriptArguments, DatasetMixtureConfig, DatasetConfig)
result = {cls.__name__: described(cls) for cls in classes}
(model_args,) = TrlParser(ModelConfig).parse_args_and_config(json.loads(sys.argv[1]))
result["lora"] = get_peft_config(model_args).to_dict()
result["lora"]["target_modules"] = sorted(result["lora"]["target_modules"])
(model_args,) = TrlParser(ModelConfig).parse_args_and_config(json.loads(sys.argv[2]))
result["bnb4"] = get_quantization_config(model_args).to_dict()
result["bnb8"] = get_quantization_config(ModelConfig(load_in_8bit=True)).to_dict()
print(json.dumps(result, default=str))
"""


def described(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        required = default is dataclasses.MISSING
        out[f.name] = {"default": None if required else default, "required": required}
        out[f.name]["choices"] = f.metadata.get("choices")
    return out


@pytest.fixture(scope="module")
def upstream():
    """TRL 1.16's answers to UPSTREAM_PROBE (one subprocess for the whole module)."""
    python = upstream_trl_python_or_skip()
    done = subprocess.run(
        [python, "-P", "-c", UPSTREAM_PROBE, json.dumps(PEFT_FLAGS), json.dumps(QUANT_FLAGS)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env={**upstream_env(), "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ ModelConfig, PEFT and quantization configs


@pytest.mark.parametrize(
    "cls", [ModelConfig, ScriptArguments, GRPOScriptArguments, DatasetMixtureConfig, DatasetConfig]
)
def test_fields_and_defaults_are_trl_1_16s(upstream, cls):
    """Field by field: the same names, in the same order, with the same defaults and `choices`."""
    ours = json.loads(json.dumps(described(cls), default=str))
    assert list(ours) == list(upstream[cls.__name__])
    assert ours == upstream[cls.__name__]


def test_model_config_post_init():
    assert ModelConfig(lora_target_modules=["all-linear"]).lora_target_modules == "all-linear"
    assert ModelConfig(lora_target_modules=["q_proj", "v_proj"]).lora_target_modules == ["q_proj", "v_proj"]
    with pytest.raises(
        ValueError, match=r"^You can't use 8 bit and 4 bit precision at the same time: set only one of load_in_8bit"
    ):
        ModelConfig(load_in_8bit=True, load_in_4bit=True)


def test_peft_flags_build_trl_1_16s_lora_config(upstream):
    (model_args,) = TrlParser(ModelConfig).parse_args_and_config(PEFT_FLAGS)
    lora = get_peft_config(model_args)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.bias) == (8, 16, 0.05, "none")
    assert lora.target_modules == {"q_proj", "v_proj"} and lora.modules_to_save == ["lm_head"]
    assert lora.use_rslora and not lora.use_dora and lora.task_type == "CAUSAL_LM"
    assert lora.target_parameters is None
    ours = {**lora.to_dict(), "target_modules": sorted(lora.target_modules)}
    assert json.loads(json.dumps(ours, default=str)) == upstream["lora"]
    (all_linear,) = TrlParser(ModelConfig).parse_args_and_config(["--use_peft", "--lora_target_modules", "all-linear"])
    assert get_peft_config(all_linear).target_modules == "all-linear"
    assert get_peft_config(ModelConfig()) is None
    with_params = get_peft_config(ModelConfig(use_peft=True, lora_target_parameters=["mlp.experts.gate_up_proj"]))
    assert with_params.target_parameters == ["mlp.experts.gate_up_proj"]


def test_use_peft_without_peft_installed_says_what_to_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    with pytest.raises(ValueError) as raised:
        get_peft_config(ModelConfig(use_peft=True))
    assert str(raised.value) == (
        'You need to have PEFT library installed for use_peft: run `pip install peft` (or `pip install "trl[peft]"`).'
    )
    assert get_peft_config(ModelConfig()) is None  # nothing is checked without use_peft


def test_quantization_configs_are_trl_1_16s(upstream):
    (model_args,) = TrlParser(ModelConfig).parse_args_and_config(QUANT_FLAGS)
    four = get_quantization_config(model_args)
    assert four.load_in_4bit and not four.load_in_8bit
    assert four.bnb_4bit_compute_dtype is torch.bfloat16 and four.bnb_4bit_quant_type == "fp4"
    assert four.bnb_4bit_use_double_quant and four.bnb_4bit_quant_storage == torch.uint8
    assert four.to_dict() == upstream["bnb4"]
    eight = get_quantization_config(ModelConfig(load_in_8bit=True))
    assert eight.load_in_8bit and not eight.load_in_4bit and eight.llm_int8_threshold == 6.0
    assert eight.to_dict() == upstream["bnb8"]
    assert get_quantization_config(ModelConfig()) is None
    assert get_kbit_device_map() == ({"": 0} if torch.cuda.is_available() else None)


def test_qlora_trains_on_the_cpu(tiny_lm_path, grpo_kwargs, arithmetic_dataset):
    """4-bit base weights (bitsandbytes on the CPU) stay packed and bitwise unchanged, also on a CPU with
    AVX512-BF16 (where bitsandbytes 0.50 repacks them for inference); the LoRA B matrices move (A gets no gradient
    while B is still zero)."""
    import bitsandbytes as bnb

    quantization = get_quantization_config(ModelConfig(load_in_4bit=True))
    peft = get_peft_config(ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"]))
    args = GRPOConfig(**{**grpo_kwargs, "beta": 0.0})
    trainer = GRPOTrainer(
        model=tiny_lm_path,
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        train_dataset=arithmetic_dataset.select(range(8)),
        quantization_config=quantization,
        peft_config=peft,
    )
    q_proj = trainer.model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj.base_layer, bnb.nn.Linear4bit) and q_proj.base_layer.weight.dtype == torch.uint8
    # bitsandbytes would repack the weight for its AVX512-BF16 CPU kernel in generation (eval mode), after which
    # its training forward fails: the trainer keeps the loaded layout
    assert q_proj.base_layer.support_avx512bf16_for_cpu is False
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    after = {name: p.detach() for name, p in trainer.model.named_parameters()}
    changed = sorted(name for name in before if not torch.equal(before[name], after[name]))
    lora_b = sorted(name for name in before if "lora_B" in name)
    assert len(lora_b) == 4 and changed == lora_b  # 2 layers × (q_proj, v_proj); nothing else moved
    assert trainer.state.global_step == 1


def test_cli_loads_8bit_with_lora(tmp_path, tiny_lm_path, data_file):
    import bitsandbytes as bnb

    from trl.scripts.grpo import build_trainer

    flags = ["--load_in_8bit", "--use_peft", "--lora_target_modules", "q_proj", "v_proj"]
    trainer = build_trainer(cli_flags(tiny_lm_path, data_file, tmp_path, *flags))
    v_proj = trainer.model.base_model.model.model.layers[1].self_attn.v_proj
    assert isinstance(v_proj.base_layer, bnb.nn.Linear8bitLt) and v_proj.base_layer.weight.dtype == torch.int8
    assert sorted(trainer.model.peft_config["default"].target_modules) == ["q_proj", "v_proj"]


# ------------------------------------------------------------------------------------------ dataset mixtures


def rows(dataset) -> list[dict]:
    return [dict(row) for row in dataset]


@pytest.fixture
def two_files(tmp_path):
    first = Dataset.from_dict({"prompt": ["a0", "a1", "a2"], "answer": ["0", "1", "2"], "extra": [0, 1, 2]})
    second = Dataset.from_dict({"prompt": ["b0", "b1"], "answer": ["5", "6"], "extra": [7, 8]})
    paths = str(tmp_path / "first.jsonl"), str(tmp_path / "second.parquet")
    first.to_json(paths[0])
    second.to_parquet(paths[1])
    return paths


def test_mixture_concatenates_in_order(two_files, tmp_path):
    saved = str(tmp_path / "saved")
    Dataset.from_dict({"prompt": ["c0"], "answer": ["9"], "extra": [3]}).save_to_disk(saved)
    mixture = DatasetMixtureConfig(
        datasets=[
            {"path": two_files[1], "columns": ["prompt", "answer"]},
            {"path": saved, "columns": ["prompt", "answer"]},
        ]
        + [DatasetConfig(path=two_files[0], columns=["prompt", "answer"])]
    )
    assert all(isinstance(d, DatasetConfig) for d in mixture.datasets)
    dataset = get_dataset(mixture)
    assert list(dataset) == ["train"]
    assert rows(dataset["train"]) == [
        {"prompt": "b0", "answer": "5"},
        {"prompt": "b1", "answer": "6"},
        {"prompt": "c0", "answer": "9"},
        {"prompt": "a0", "answer": "0"},
        {"prompt": "a1", "answer": "1"},
        {"prompt": "a2", "answer": "2"},
    ]
    # a builder name with data_files and a sliced split, as `datasets.load_dataset` takes them
    sliced = get_dataset(
        DatasetMixtureConfig(datasets=[DatasetConfig(path="json", data_files=two_files[0], split="train[1:]")])
    )
    assert sliced["train"]["prompt"] == ["a1", "a2"]


def test_mixture_test_split_sizes(two_files):
    configs = [DatasetConfig(path=path) for path in two_files]
    split = get_dataset(DatasetMixtureConfig(datasets=configs, test_split_size=0.4))
    assert (split["train"].num_rows, split["test"].num_rows) == (3, 2)
    assert sorted([*split["train"]["prompt"], *split["test"]["prompt"]]) == ["a0", "a1", "a2", "b0", "b1"]
    split = get_dataset(DatasetMixtureConfig(datasets=configs, test_split_size=1))
    assert (split["train"].num_rows, split["test"].num_rows) == (4, 1)


def test_mixture_fractions(two_files):
    """Shares 1:1 of 3 and 2 rows: the largest mixture without repeats has 4 rows, the first 2 of each."""
    configs = [DatasetConfig(path=two_files[0], fraction=0.5), DatasetConfig(path=two_files[1], fraction=0.5)]
    assert get_dataset(DatasetMixtureConfig(datasets=configs))["train"]["prompt"] == ["a0", "a1", "b0", "b1"]
    configs = [DatasetConfig(path=two_files[0], fraction=3), DatasetConfig(path=two_files[1], fraction=1)]
    assert get_dataset(DatasetMixtureConfig(datasets=configs))["train"]["prompt"] == ["a0", "a1", "a2", "b0"]


def test_streamed_mixture(two_files):
    mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path=p) for p in two_files], streaming=True)
    train = get_dataset(mixture)["train"]
    assert isinstance(train, IterableDataset)
    assert [row["prompt"] for row in train] == ["a0", "a1", "a2", "b0", "b1"]


def test_mixture_errors(two_files, tmp_path):
    with pytest.raises(
        ValueError, match=r"^No datasets were loaded from the mixture configuration: list at least one dataset under"
    ):
        get_dataset(DatasetMixtureConfig())
    partial = [DatasetConfig(path=two_files[0], fraction=0.5), DatasetConfig(path=two_files[1])]
    with pytest.raises(
        ValueError,
        match=r"^`fraction` must be set for either all datasets in the mixture or none of them \(got \[0\.5, None\]\)\.$",
    ):
        get_dataset(DatasetMixtureConfig(datasets=partial))
    streamed = [DatasetConfig(path=two_files[0])]
    with pytest.raises(ValueError, match=r"^`test_split_size` cannot be used with `streaming`"):
        get_dataset(DatasetMixtureConfig(datasets=streamed, streaming=True, test_split_size=0.5))
    with pytest.raises(FileNotFoundError, match=r"^Dataset '.*nowhere' is not an existing local folder"):
        get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(path=str(tmp_path / "nowhere"))]))


# ------------------------------------------------------------------------------------------------- TrlParser


@dataclasses.dataclass
class Small:
    arg1: int
    arg2: str = "alpha"


def test_trl_parser_yaml_env_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_SURFACE_TEST_VAR", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  TRL_SURFACE_TEST_VAR: 7\narg1: 23\narg2: beta\n")
    assert TrlParser(Small).parse_args_and_config(["--config", str(path)]) == (Small(23, "beta"),)
    assert os.environ["TRL_SURFACE_TEST_VAR"] == "7"
    assert TrlParser([Small]).parse_args_and_config(["--config", str(path), "--arg1", "5"]) == (Small(5, "beta"),)
    path.write_text("env: [1]\narg1: 1\n")
    with pytest.raises(
        ValueError, match=r"^`env` field should be a dict in the YAML file \(variable names to values\), got \[1\]\.$"
    ):
        TrlParser(Small).parse_args_and_config(["--config", str(path)])


def test_trl_parser_unknown_config_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("arg1: 1\nextra: 2\n")
    parser = TrlParser(Small)
    with pytest.raises(
        ValueError, match=r"^Unknown arguments from config file: \['extra'\]\. No flag has these names"
    ):
        parser.parse_args_and_config(["--config", str(path)])
    assert TrlParser(Small).parse_args_and_config(["--config", str(path)], fail_with_unknown_args=False) == (Small(1),)
    argv = ["--config", str(path), "--other", "3"]
    assert TrlParser(Small).parse_args_and_config(argv, return_remaining_strings=True) == (
        Small(1),
        ["--extra", "2", "--other", "3"],
    )
    assert TrlParser(Small).parse_args_and_config(
        argv, return_remaining_strings=True, separate_remaining_strings=True
    ) == (Small(1), ["--extra", "2"], ["--other", "3"])


def test_trl_parser_reserves_config():
    @dataclasses.dataclass
    class HasConfig:
        config: str = "x"

    with pytest.raises(ValueError, match=r"^HasConfig has a field named 'config', which TrlParser keeps"):
        TrlParser(HasConfig)


def test_grpo_parser_reads_a_datasets_mixture_from_yaml(tmp_path, two_files):
    path = tmp_path / "mix.yaml"
    config = {"datasets": [{"path": two_files[0], "columns": ["prompt"]}, {"path": two_files[1], "split": "train"}]}
    config.update(test_split_size=0.5, output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, lora_r=4)
    path.write_text(json.dumps(config))  # JSON is YAML
    script_args, training_args, model_args, mixture = make_parser().parse_args_and_config(
        ["--config", str(path), "--lora_r", "8"]
    )
    assert mixture.datasets == [
        DatasetConfig(path=two_files[0], columns=["prompt"]),
        DatasetConfig(path=two_files[1], split="train"),
    ]
    assert mixture.test_split_size == 0.5 and model_args.lora_r == 8  # the flag overrides the file
    assert script_args.dataset_name is None and script_args.dataset_test_split == "test"


# ------------------------------------------------------------------------------------------- --reward_funcs


def test_trl_reward_names_map_to_trl_rewards(tmp_path, monkeypatch):
    assert resolve_reward_func("accuracy_reward") is rewards.accuracy_reward
    assert resolve_reward_func("reasoning_accuracy_reward") is rewards.reasoning_accuracy_reward
    assert resolve_reward_func("think_format_reward") is rewards.think_format_reward
    overlong = resolve_reward_func("get_soft_overlong_punishment")  # max_completion_len=1280, soft_punish_cache=256
    assert overlong(completion_ids=[[0] * 1024, [0] * 1100, [0] * 1280, [0] * 1300]) == [0.0, -0.296875, -1.0, -1.0]
    (tmp_path / "my_lib").mkdir()
    (tmp_path / "my_lib" / "__init__.py").write_text("")
    (tmp_path / "my_lib" / "scores.py").write_text("def custom_reward(completions, **kw):\n    return [2.0]\n")
    monkeypatch.chdir(tmp_path)  # found from the current folder, as in TRL
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve_reward_func("my_lib.scores.custom_reward")(["x"]) == [2.0]
    assert resolve_reward_func("my_lib.scores:custom_reward")(["x"]) == [2.0]
    with pytest.raises(ValueError, match=r"^Reward function 'my_lib\.scores\.nope': module 'my_lib\.scores' has no"):
        resolve_reward_func("my_lib.scores.nope")
    (tmp_path / "rm.v2").mkdir()
    assert resolve_reward_func("rm.v2") == "rm.v2"  # a folder, though it has a dot


def test_reward_model_comes_first_and_no_reward_is_an_error(tmp_path):
    from trl.scripts.grpo import reward_sources

    args = GRPOScriptArguments(reward_model_name_or_path="some/rm", reward_funcs=["think_format_reward"])
    assert reward_sources(args) == ["some/rm", rewards.think_format_reward]
    with pytest.raises(
        ValueError, match=r"^No reward source provided: give --reward_funcs .* and/or --reward_model_name_or_path\.$"
    ):
        reward_sources(GRPOScriptArguments())


# ---------------------------------------------------------------------------------- scripts that run unchanged


@pytest.fixture
def data_file(tmp_path):
    path = str(tmp_path / "prompts.jsonl")
    make_arithmetic_dataset(8).to_json(path)
    return path


def cli_flags(model, data, tmp_path, *extra):
    flags = ["--model_name_or_path", model, "--dataset_name", data, "--output_dir", str(tmp_path / "out")]
    flags += ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "4"]
    flags += ["--max_steps", "1", "--use_cpu", "--bf16", "false", "--report_to", "none"]
    flags += ["--activation_checkpointing", "false", "--learning_rate", "1e-2", "--disable_tqdm", "true"]
    return [*flags, "--reward_funcs", "trl.tasks.arithmetic.closeness_reward", *extra]


def test_cli_streams_the_dataset(tmp_path, tiny_lm_path, data_file, monkeypatch):
    """`--dataset_streaming` hands the trainer an IterableDataset (what it then does with it is the trainer's)."""
    from trl.scripts import grpo

    seen = {}

    def capture(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop")

    monkeypatch.setattr(grpo, "GRPOTrainer", capture)
    with pytest.raises(RuntimeError, match="stop"):
        grpo.build_trainer(cli_flags(tiny_lm_path, data_file, tmp_path, "--dataset_streaming"))
    assert isinstance(seen["train_dataset"], IterableDataset) and seen["eval_dataset"] is None
    assert [row["prompt"] for row in seen["train_dataset"]] == make_arithmetic_dataset(8)["prompt"]
    assert seen["quantization_config"] is None and seen["peft_config"] is None


def test_cli_trains_on_a_streamed_dataset(tmp_path, tiny_lm_path, data_file):
    from trl.scripts.grpo import run

    trainer = run(cli_flags(tiny_lm_path, data_file, tmp_path, "--dataset_streaming", "--max_steps", "2"))
    assert isinstance(trainer.train_dataset, IterableDataset) and trainer.state.global_step == 2


def test_cli_mixture_from_yaml_with_local_paths(tmp_path, tiny_lm_path, two_files):
    """A `datasets:` mixture of a local parquet file and a `save_to_disk` folder, split 4/2 for evaluation;
    `--dataset_name` is then ignored (TRL: with a warning)."""
    from trl.scripts.grpo import build_trainer

    saved = str(tmp_path / "saved")
    Dataset.from_dict({"prompt": ["c0"], "answer": ["9"], "extra": [3]}).save_to_disk(saved)
    config = {"datasets": [{"path": two_files[1]}, {"path": saved}, {"path": two_files[0]}], "test_split_size": 2}
    (tmp_path / "mix.yaml").write_text(json.dumps(config))
    argv = cli_flags(tiny_lm_path, "ignored.jsonl", tmp_path, "--config", str(tmp_path / "mix.yaml"))
    trainer = build_trainer([*argv, "--eval_strategy", "steps", "--eval_steps", "1"])
    train, test = trainer.train_dataset["prompt"], trainer.eval_dataset["prompt"]
    assert (len(train), len(test)) == (4, 2)
    assert sorted([*train, *test]) == ["a0", "a1", "a2", "b0", "b1", "c0"]


@pytest.mark.parity
def test_trl_1_16_grpo_script_runs_unchanged(tmp_path, tiny_lm_path):
    """TRL 1.16's own `trl/scripts/grpo.py` (read from its venv, not copied) with this package as `trl`: it
    parses its flags, loads a local dataset folder, imports a reward by dotted path from the current folder,
    trains one step, saves the model and a checkpoint."""
    python = upstream_trl_python_or_skip()
    found = subprocess.run(
        [python, "-P", "-c", "import trl.scripts.grpo as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=upstream_env(),  # TRL 1.16's file, not ours
    )
    script = found.stdout.strip()
    assert found.returncode == 0 and script.endswith(os.path.join("trl", "scripts", "grpo.py")), found.stderr
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    make_arithmetic_dataset(8).to_json(str(work / "data" / "train.jsonl"))
    (work / "my_rewards.py").write_text(
        "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
    )
    out = str(tmp_path / "out")
    argv = cli_flags(tiny_lm_path, "data", tmp_path)[:-2] + ["--reward_funcs", "my_rewards.length_reward"]
    argv[argv.index("--output_dir") + 1] = out
    argv += ["--save_strategy", "steps", "--save_steps", "1", "--logging_steps", "1"]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(
        [sys.executable, script, *argv], capture_output=True, text=True, cwd=str(work), env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Training completed." in done.stdout and f"Model saved to {out}." in done.stdout
    with open(os.path.join(out, "checkpoint-1", "trainer_state.json")) as f:
        state = json.load(f)
    assert state["global_step"] == 1 and state["log_history"][0]["rewards/length_reward/mean"] > 0
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).state_dict()
    saved = load_file(os.path.join(out, "model.safetensors"))
    assert any(not torch.equal(initial[name], saved[name]) for name in saved)  # it trained


USER_SCRIPT = """
from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.rewards import think_format_reward


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
script_args, training_args, model_args = parser.parse_args_and_config()
dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
trainer = GRPOTrainer(
    model=model_args.model_name_or_path,
    reward_funcs=[think_format_reward, length_reward],
    args=training_args,
    train_dataset=dataset[script_args.dataset_train_split],
    peft_config=get_peft_config(model_args),
)
trainer.train()
trainer.save_model(training_args.output_dir)
RESULT = trainer
"""


def test_a_trl_style_user_script_runs(tmp_path, tiny_lm_path, monkeypatch):
    folder = tmp_path / "data"
    folder.mkdir()
    make_arithmetic_dataset(8).to_json(str(folder / "train.jsonl"))
    script = tmp_path / "train_grpo.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    argv = cli_flags(tiny_lm_path, str(folder), tmp_path)[:-2]  # the script names its own rewards
    argv += ["--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    trainer = runpy.run_path(str(script), run_name="__main__")["RESULT"]
    assert trainer.state.global_step == 1
    assert trainer.reward_func_names == ["think_format_reward", "length_reward"]
    assert trainer.model.peft_config["default"].r == 4
    adapter = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert len(adapter) == 8 and all("lora_" in name for name in adapter)  # 2 layers × 2 modules × (A, B)


def test_mixture_takes_a_sliced_split_of_a_saved_folder(tmp_path):
    """A `save_to_disk` folder with a split such as `train[:2]` (before: "has no split 'train[:2]'")."""
    one = str(tmp_path / "one")
    Dataset.from_dict({"prompt": ["p0", "p1", "p2", "p3"]}).save_to_disk(one)
    two = str(tmp_path / "two")
    DatasetDict(
        {
            "train": Dataset.from_dict({"prompt": ["t0", "t1", "t2", "t3"]}),
            "test": Dataset.from_dict({"prompt": ["e0"]}),
        }
    ).save_to_disk(two)
    parts = [DatasetConfig(path=one, split="train[:2]"), DatasetConfig(path=two, split="train[75%:]+test")]
    assert get_dataset(DatasetMixtureConfig(datasets=parts))["train"]["prompt"] == ["p0", "p1", "t3", "e0"]
    streamed = get_dataset(
        DatasetMixtureConfig(datasets=[DatasetConfig(path=one, split="train[-1:]")], streaming=True)
    )
    assert [row["prompt"] for row in streamed["train"]] == ["p3"]
    for split, message in [
        (
            "validation[:2]",
            rf"^The dataset '{re.escape(one)}' has no split 'validation'; its splits are \['train'\]\.$",
        ),
        (
            "train[:x]",
            rf"^The split 'train\[:x\]' of '{re.escape(one)}' is not a valid slice: Unrecognized instruction",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(path=one, split=split)]))
