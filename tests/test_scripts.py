# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl grpo`: flags, YAML config, local dataset formats, reward-function resolution, configuration errors."""

import os
import subprocess
import sys

import pytest
import yaml

from trl import GRPOTrainer, rewards
from trl.cli import main as cli_main
from trl.models.tiny import build_tiny_causal_lm
from trl.models.utils import PathNotFoundError
from trl.scripts.grpo import resolve_reward_func
from trl.scripts.grpo import run as grpo_run
from trl.scripts.utils import load_dataset_from_path, one_line
from trl.tasks import arithmetic, arithmetic_corpus, make_arithmetic_dataset


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
    trainer = grpo_run(
        [
            "--model_name_or_path",
            model_dir,
            "--dataset_name",
            data,
            "--reward_funcs",
            "closeness_reward",
            "trl.tasks.arithmetic.accuracy_reward",
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


def test_cli_resumes_from_checkpoint(tmp_path, model_dir, monkeypatch):
    """`--resume_from_checkpoint` continues the run (it was parsed and then ignored: the run restarted at step 0)."""
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(32).to_json(data)
    flags = ["--model_name_or_path", model_dir, "--dataset_name", data, "--reward_funcs", "closeness_reward"]
    flags += ["--beta", "0.04", "--sync_ref_model", "true", "--ref_model_sync_steps", "1", "--logging_steps", "1"]
    flags += ["--output_dir", str(tmp_path / "out"), *COMMON, "--save_strategy", "steps", "--save_steps", "1"]
    grpo_run([*flags, "--max_steps", "1"])
    checkpoint = str(tmp_path / "out" / "checkpoint-1")
    trained_steps = []
    training_step = GRPOTrainer.training_step

    def counting(self, *args, **kwargs):
        trained_steps.append(self.state.global_step)
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "training_step", counting)
    resumed = grpo_run([*flags, "--max_steps", "2", "--resume_from_checkpoint", checkpoint])
    assert resumed.state.global_step == 2 and trained_steps == [1]  # only step 2 is trained again
    assert resumed.sync_callback.num_syncs == 2  # the checkpoint's sync plus one


def test_cli_yaml_config_with_override(tmp_path, model_dir):
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(32).to_json(data)
    config = {
        "model_name_or_path": model_dir,
        "dataset_name": data,
        "reward_funcs": ["trl.tasks.arithmetic:accuracy_reward"],
        "max_steps": 5,
        "beta": 0.1,
        "sync_ref_model": True,
        "ref_model_sync_steps": 1,
        "ref_model_mixup_alpha": 0.5,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = grpo_run([f"--config={path}", "--max_steps", "1", "--attn_implementation", "eager", *COMMON])
    assert trainer.state.global_step == 1  # the flag overrides the file
    assert trainer.args.beta == 0.1 and trainer.args.ref_model_mixup_alpha == 0.5
    assert trainer.model.config._attn_implementation == "eager"
    assert trainer.sync_callback.num_syncs == 1


def test_cli_model_init_kwargs_as_json(tmp_path, model_dir):
    """`--model_init_kwargs` is JSON text on the command line (e.g. `'{"gguf_file": "model.gguf"}'`)."""
    data = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(8).to_json(data)
    argv = ["--model_name_or_path", model_dir, "--dataset_name", data, "--max_steps", "1"]
    argv += ["--reward_funcs", "closeness_reward"]
    argv += ["--model_init_kwargs", '{"attn_implementation": "eager"}', "--output_dir", str(tmp_path / "out")]
    trainer = grpo_run(argv + COMMON)
    assert trainer.args.model_init_kwargs["attn_implementation"] == "eager"
    assert trainer.model.config._attn_implementation == "eager"


def test_cli_rejects_unknown_yaml_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"not_a_field": 1}))
    with pytest.raises(
        ValueError, match=r"^Unknown arguments from config file: \['not_a_field'\]\. No flag has these names"
    ):
        grpo_run(["--config", str(path)])


def test_cli_config_file_errors(tmp_path):
    """Before: FileNotFoundError with errno text, IndexError for a trailing `--config`, yaml's ScannerError, and
    "Unknown keys in the config file: [1, 2]" for a YAML list. Now: TRL 1.16's key phrases where it has them."""
    listed, broken = tmp_path / "list.yaml", tmp_path / "broken.yaml"
    listed.write_text("- 1\n- 2\n")
    broken.write_text("beta: [0.1\n")
    with pytest.raises(PathNotFoundError, match=r"^The config file '.*missing\.yaml' does not exist\.$"):
        grpo_run(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ValueError, match=r"^--config needs the path of a YAML file: `--config FILE\.yaml`\.$"):
        grpo_run(["--config"])
    with pytest.raises(
        ValueError,
        match=r"^Config file '.*list\.yaml' must contain a YAML mapping \(flag names to values\), not a list",
    ):
        grpo_run(["--config", str(listed)])
    with pytest.raises(
        ValueError, match=r"^The config file '.*broken\.yaml' is not valid YAML \((Scanner|Parser)Error: "
    ):
        grpo_run(["--config", str(broken)])


def test_resolve_reward_func(tmp_path):
    """The bare `accuracy_reward` is TRL's (math-verify) reward, as in TRL 1.16's script; it used to be the demo's
    integer reward, which is now `trl.tasks.arithmetic.accuracy_reward` (dotted, TRL's form) or `...:accuracy_reward`."""
    assert resolve_reward_func("accuracy_reward") is rewards.accuracy_reward
    assert resolve_reward_func("trl.tasks.arithmetic.accuracy_reward") is arithmetic.accuracy_reward
    assert resolve_reward_func("trl.tasks.arithmetic:accuracy_reward") is arithmetic.accuracy_reward
    assert resolve_reward_func("closeness_reward") is arithmetic.closeness_reward
    assert resolve_reward_func("answer_reward") is arithmetic.answer_reward
    assert resolve_reward_func(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError) as raised:
        resolve_reward_func("nope")
    assert str(raised.value) == (
        "Could not load reward function 'nope': it is not a built-in name (one of ['accuracy_reward', "
        "'answer_reward', 'closeness_reward', 'get_soft_overlong_punishment', 'reasoning_accuracy_reward', "
        "'think_format_reward']), a dotted import path 'package.module.function' (or 'package.module:function'), "
        "or a reward-model folder."
    )
    with pytest.raises(ValueError) as raised:
        resolve_reward_func("no_such_module_xyz.reward")
    assert str(raised.value) == (
        "Cannot import the module of reward function 'no_such_module_xyz.reward': No module named 'no_such_module_xyz'"
    )
    # Before: ModuleNotFoundError / AttributeError from importlib, with a traceback in the CLI.
    with pytest.raises(ValueError) as raised:
        resolve_reward_func("no_such_module_xyz:reward")
    assert str(raised.value) == (
        "Cannot import the module of reward function 'no_such_module_xyz:reward': No module named 'no_such_module_xyz'"
    )
    with pytest.raises(ValueError) as raised:
        resolve_reward_func("trl.tasks.arithmetic:nope")
    assert str(raised.value) == (
        "Reward function 'trl.tasks.arithmetic:nope': module 'trl.tasks.arithmetic' has no function 'nope'."
    )


def test_console_script_usage(capsys):
    assert cli_main([]) == 2
    assert "usage: trl {grpo,vllm-serve,convert-gguf,env}" in capsys.readouterr().err  # a usage error goes to stderr
    assert cli_main(["--help"]) == 0
    assert "usage: trl {grpo,vllm-serve,convert-gguf,env}" in capsys.readouterr().out


def test_shipped_example_yaml_parses():
    import os

    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "grpo_demo.yaml")
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    script_args, training_args, model_args, _ = parser.parse_args_and_config(["--config", path, "--max_steps", "7"])
    assert model_args.model_name_or_path == "demo_output/model"
    assert script_args.reward_funcs == ["trl.tasks.arithmetic.accuracy_reward"]  # the demo's, not TRL's math reward
    assert resolve_reward_func(script_args.reward_funcs[0]) is arithmetic.accuracy_reward
    assert training_args.beta == 0.5 and training_args.max_completion_length == 1
    assert training_args.sync_ref_model and training_args.ref_model_sync_steps == 25
    assert training_args.max_steps == 7  # the flag overrides the file


# ---------------------------------------------------------------- configuration errors: one line, exit status 2


def test_missing_dataset_path_says_it_does_not_exist(tmp_path, monkeypatch):
    """Before: `FileNotFoundError: Couldn't find any data file at ...` (absolute) or `ConnectionError: Couldn't reach
    'data.jsonl' on the Hub (OfflineModeIsEnabled)` (relative, a typo in the current folder)."""
    missing = str(tmp_path / "data.jsonl")
    with pytest.raises(PathNotFoundError) as raised:
        load_dataset_from_path(missing)
    assert str(raised.value) == (
        f"Dataset '{missing}' is not an existing local folder (or file) and could not be loaded from the Hugging Face "
        f"Hub (FileNotFoundError: Couldn't find any data file at {missing}.)"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathNotFoundError) as raised:
        load_dataset_from_path("data.jsonl")
    assert str(raised.value) == (
        "Dataset 'data.jsonl' is not an existing local folder (or file) and could not be loaded from the Hugging Face "
        "Hub (ConnectionError: Couldn't reach 'data.jsonl' on the Hub (OfflineModeIsEnabled))"
    )


def test_one_line_joins_a_config_error_list():
    error = ValueError("Invalid GRPOConfig:\n- beta must be >= 0 (got -1.0).\n- temperature must be > 0 (got 0.0).")
    assert one_line(error) == "Invalid GRPOConfig: beta must be >= 0 (got -1.0). temperature must be > 0 (got 0.0)."
    assert one_line(ValueError("a\n- b\n- c")) == "a b; c"
    assert one_line(FileNotFoundError()) == "FileNotFoundError"


@pytest.fixture
def data_path(tmp_path):
    path = str(tmp_path / "d.jsonl")
    make_arithmetic_dataset(8).to_json(path)
    return path


def cli_argv(model_dir, data_path, tmp_path, *extra):
    # --activation_checkpointing: transformers 5 warns about the deprecated `gradient_checkpointing` otherwise (see
    # COMMON), which would add a FutureWarning line to stderr.
    paths = ["--model_name_or_path", model_dir, "--dataset_name", data_path, "--output_dir", str(tmp_path / "o")]
    paths += ["--reward_funcs", "trl.tasks.arithmetic.accuracy_reward"]
    flags = ["--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--activation_checkpointing", "false"]
    sizes = [
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "4",
        "--max_steps",
        "1",
    ]
    return ["grpo", *paths, *flags, *sizes, *extra]


def test_cli_config_errors_are_one_line(tmp_path, model_dir, data_path, capsys):
    """In process: `trl.cli.main` returns 2 and prints one `trl grpo: error:` line (the last line of stderr: the
    cases that load the policy first also show its loading progress bar)."""
    missing = str(tmp_path / "nowhere")
    cases = [
        (
            ["--num_generations", "3"],
            "Invalid GRPOConfig: generation_batch_size (4) must be divisible by num_generations (3). The generation "
            "batch (4 completions = per_device_train_batch_size 4 × 1 processes × steps_per_generation 1) must hold "
            "whole groups: change per_device_train_batch_size, steps_per_generation or num_generations.",
        ),
        (
            ["--beta", "-1", "--temperature", "0"],
            "Invalid GRPOConfig: beta must be >= 0 (got -1.0). temperature must be > 0 (got 0.0).",
        ),
        (
            ["--reward_funcs", "accuracy_rewards"],
            "Could not load reward function 'accuracy_rewards': it is not a built-in name (one of ['accuracy_reward', "
            "'answer_reward', 'closeness_reward', 'get_soft_overlong_punishment', 'reasoning_accuracy_reward', "
            "'think_format_reward']), a dotted import path 'package.module.function' (or 'package.module:function'), "
            "or a reward-model folder.",
        ),
        (["--config", missing + ".yaml"], f"The config file '{missing}.yaml' does not exist."),
        (
            ["--reward_weights", "inf"],
            "reward_weights[0] is inf (for reward function 'accuracy_reward'): every reward weight must be a finite "
            "number.",
        ),
        (  # the test split is read only when evaluation is on, as in TRL
            ["--eval_strategy", "steps", "--dataset_test_split", "validation"],
            f"The dataset '{data_path}' has no split 'validation'; its splits are ['train']. Evaluation (--eval_strategy "
            "steps) reads --dataset_test_split ('validation'): name a split the dataset has, split a mixture with "
            "`test_split_size` in the config file, or set --eval_strategy no.",
        ),
        (["--model_init_kwargs", "[1]"], "--model_init_kwargs must be a JSON object, got [1]."),
        (
            ["--use_liger_kernel", "true"],
            "Invalid GRPOConfig: use_liger_kernel=True asks for Liger Kernel, which this package does not support "
            "(neither Liger's fused linear GRPO loss nor the Triton layer kernels that TRL 1.16, which deprecates this "
            "field, has transformers patch into the model; here `chunked_logprobs` (on by default in CPU runs) keeps "
            "the LM head's logits from existing whole): set it to False.",
        ),
    ]
    for extra, message in cases:
        assert cli_main(cli_argv(model_dir, data_path, tmp_path, *extra)) == 2, extra
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert [line for line in err.splitlines() if line.strip()][-1] == f"trl grpo: error: {message}", extra
    argv = cli_argv(model_dir, data_path, tmp_path)
    argv[2] = missing
    assert cli_main(argv) == 2
    assert capsys.readouterr().err == (
        f"trl grpo: error: Model '{missing}' is not an existing local folder (or file) and could not be loaded from "
        f"the Hugging Face Hub (OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        f"'{missing}'. Use `repo_type` argument if needed.)\n"
    )


def test_cli_without_reward_or_dataset_is_one_line(tmp_path, model_dir, data_path, capsys):
    """`--reward_funcs` has no default now (TRL's: None), and `--dataset_name` is optional (a `datasets:` mixture can
    replace it): leaving both out says which flags are missing."""
    argv = cli_argv(model_dir, data_path, tmp_path)
    without_reward = [arg for arg in argv if arg not in ("--reward_funcs", "trl.tasks.arithmetic.accuracy_reward")]
    assert cli_main(without_reward) == 2
    assert capsys.readouterr().err == (
        "trl grpo: error: No reward source provided: give --reward_funcs (e.g. accuracy_reward, or "
        "my_module.my_reward) and/or --reward_model_name_or_path.\n"
    )
    without_data = [arg for arg in argv if arg not in ("--dataset_name", data_path)]
    assert cli_main(without_data) == 2
    assert capsys.readouterr().err == (
        "trl grpo: error: Either `datasets` or `dataset_name` must be provided: give --dataset_name, or a "
        "`datasets:` list in the --config file.\n"
    )


def test_cli_eval_split_only_with_evaluation(tmp_path, model_dir):
    """As TRL's script: `--dataset_test_split` (default "test") is read when `--eval_strategy` is not "no"."""
    from datasets import DatasetDict

    from trl.scripts.grpo import build_trainer

    saved = str(tmp_path / "saved")
    DatasetDict(
        {"train": make_arithmetic_dataset(8, seed=0), "test": make_arithmetic_dataset(4, seed=1)}
    ).save_to_disk(saved)
    argv = cli_argv(model_dir, saved, tmp_path)[1:]
    assert build_trainer(argv).eval_dataset is None
    trainer = build_trainer([*argv, "--eval_strategy", "steps", "--eval_steps", "1"])
    assert trainer.eval_dataset["prompt"] == make_arithmetic_dataset(4, seed=1)["prompt"]
    assert trainer.train_dataset["prompt"] == make_arithmetic_dataset(8, seed=0)["prompt"]


# Lines other libraries log while `trl` imports them, on some machines only: bitsandbytes 0.50 on a CPU with
# AVX512-BF16 warns that its optional `kernels` package is missing, or, where `kernels` is installed (transformers
# requires it in fresh installs), that it skips the Hub's publisher check offline. They are not the CLI's output.
IMPORT_NOISE = (
    "Failed to load CPU gemm_4bit_forward from kernels-community",
    "Skipping publisher trust check for 'kernels-community/",
)


def stderr_lines(text: str) -> list[str]:
    """The non-empty lines of a stderr capture, without other libraries' import-time warnings (`IMPORT_NOISE`)."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith(IMPORT_NOISE)]


def run_cli(argv, **env):
    return subprocess.run(
        [sys.executable, "-m", "trl.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **env},
        timeout=300,
    )


def test_trl_grpo_config_error_prints_one_line_and_exits_2(tmp_path, model_dir, data_path, capsys):
    """Before: exit status 1 and a 24-line traceback on stderr. The console script (a subprocess) once; then the
    same `main` in this process."""
    done = run_cli(cli_argv(model_dir, data_path, tmp_path, "--beta", "-1"))
    assert done.returncode == 2
    assert stderr_lines(done.stderr) == ["trl grpo: error: Invalid GRPOConfig: beta must be >= 0 (got -1.0)."]
    missing = str(tmp_path / "prompts.jsonl")
    capsys.readouterr()
    assert cli_main(cli_argv(model_dir, missing, tmp_path)) == 2
    assert stderr_lines(capsys.readouterr().err) == [
        f"trl grpo: error: Dataset '{missing}' is not an existing local folder (or file) and could not be loaded from "
        f"the Hugging Face Hub (FileNotFoundError: Couldn't find any data file at {missing}.)"
    ]


def test_traceback_on_request(tmp_path, model_dir, data_path, monkeypatch, capsys):
    """`TRL_TRACEBACK=1`, or `--traceback` before or after the command: the error is raised as it is (to the caller
    here; from the console script, Python prints its traceback and exits with status 1)."""
    argv = cli_argv(model_dir, data_path, tmp_path, "--beta", "-1")
    error = r"^Invalid GRPOConfig:\n- beta must be >= 0 \(got -1.0\)\.$"
    for flagged in (["--traceback", *argv], [*argv, "--traceback"]):
        with pytest.raises(ValueError, match=error):
            cli_main(flagged)
    monkeypatch.setenv("TRL_TRACEBACK", "1")
    with pytest.raises(ValueError, match=error):
        cli_main(argv)
    assert "trl grpo: error:" not in capsys.readouterr().err


def test_traceback_help_is_documented(capsys):
    with pytest.raises(SystemExit):
        cli_main(["grpo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "prints one line `trl grpo: error: <message>` to stderr and exits with status 2; add --traceback" in help_text
    )
    assert "or set TRL_TRACEBACK=1, to see its full traceback" in help_text
    cli_main(["--help"])
    assert "--traceback   show the full traceback of a configuration error" in capsys.readouterr().out


def test_errors_during_training_keep_their_traceback(tmp_path, model_dir, data_path, monkeypatch):
    """Only errors raised before training are shortened: a reward function returning inf raises from `train`."""
    (tmp_path / "my_rewards.py").write_text(
        "def inf_reward(completions, **kwargs):\n    return [float('inf')] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = cli_argv(
        model_dir, data_path, tmp_path, "--reward_funcs", "my_rewards:inf_reward", "--num_generations", "4"
    )
    with pytest.raises(ValueError, match=r"^Reward function 'inf_reward' returned inf for completion 0: it must"):
        cli_main(argv)


# ------------------------------------------------------------------ TRL 1.16's make_parser and main signatures


def test_make_parser_takes_trl_arguments():
    """`make_parser(subparsers=None, prog=None)`: stand-alone, or the `grpo` subcommand of a TrlParser."""
    import argparse

    from trl import TrlParser
    from trl.scripts.grpo import DATACLASS_TYPES, make_parser

    assert make_parser().prog == "trl grpo" and make_parser(prog="grpo.py").prog == "grpo.py"
    parent = TrlParser(prog="trl")
    subparsers = parent.add_subparsers(dest="command")
    grpo = make_parser(subparsers)
    assert isinstance(grpo, TrlParser) and subparsers.choices["grpo"] is grpo and grpo.prog == "trl grpo"
    assert grpo.dataclass_types == list(DATACLASS_TYPES)
    parsed = grpo.parse_args_and_config(["--output_dir", "o", "--use_cpu", "--bf16", "false", "--lora_r", "4"])
    assert [type(p) for p in parsed] == list(DATACLASS_TYPES) and parsed[2].lora_r == 4
    plain = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(TypeError, match=r"^make_parser\(subparsers\) needs subparsers that make TrlParser parsers"):
        make_parser(plain)
    grpo = make_parser(argparse.ArgumentParser(prog="x").add_subparsers(parser_class=TrlParser))
    assert grpo.prog == "x grpo"


def test_main_takes_the_parsed_dataclasses(tmp_path, model_dir, data_path):
    """TRL 1.16's `main(script_args, training_args, model_args, dataset_args)`: train, save, end."""
    from trl.scripts.grpo import main, make_parser

    parsed = make_parser().parse_args_and_config(cli_argv(model_dir, data_path, tmp_path, "--max_steps", "1")[1:])
    trainer = main(*parsed)
    assert trainer.state.global_step == 1
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "model.safetensors"))


def test_script_file_runs_as_main(tmp_path, model_dir, data_path):
    """`python trl/scripts/grpo.py ...` (what `accelerate launch trl/scripts/grpo.py ...` runs) is `trl grpo`."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trl", "scripts", "grpo.py")
    done = subprocess.run(
        [sys.executable, script, *cli_argv(model_dir, data_path, tmp_path, "--beta", "-1")[1:]],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"},
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "trl grpo: error: Invalid GRPOConfig: beta must be >= 0 (got -1.0)."


def launcher_error(key):
    return (
        f"trl grpo: error: `{key}` is an `accelerate launch` option, which `trl grpo` does not pass on (TRL 1.16 "
        "does): run `accelerate launch --config_file ACCELERATE.yaml [--num_processes N ...] trl/scripts/grpo.py "
        f"[the other flags and --config]` instead, without `{key}` in the flags or the config file."
    )


def test_accelerate_launch_options_are_one_line_errors(tmp_path, model_dir, data_path, capsys):
    """TRL 1.16's `trl grpo` passes them on to `accelerate launch`; this one names them and says what to run."""
    argv = cli_argv(model_dir, data_path, tmp_path)
    for extra, key in [(["--num_processes", "2"], "num_processes"), (["--config-file=a.yaml"], "config-file")]:
        assert cli_main([*argv, *extra]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == launcher_error(key)
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump({"accelerate_config": "zero2", "beta": 0.1}))
    assert cli_main([*argv, "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == launcher_error("accelerate_config")
    # Not an accelerate option: HfArgumentParser's error, as before.
    assert cli_main([*argv, "--not_a_flag", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "trl grpo: error: Some specified arguments are not used by the HfArgumentParser: ['--not_a_flag', '1']"
    )


@pytest.mark.parametrize(
    "flag, message",
    [
        (["--loss_type", "foo"], "argument --loss_type/--loss-type: invalid choice: 'foo'"),
        (["--learning_rate", "abc"], "argument --learning_rate/--learning-rate: invalid float value: 'abc'"),
    ],
)
def test_a_bad_flag_is_one_line(flag, message, capsys):
    """Before: ~218 lines of usage, then the error."""
    with pytest.raises(SystemExit) as exited:
        cli_main(["grpo", "--model_name_or_path", "m", "--dataset_name", "d", *flag])
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"trl grpo: error: {message}")
    assert lines[0].endswith("(`trl grpo --help` lists the flags)")


def test_trl_env_prints_the_versions(capsys):
    import torch
    import transformers

    import trl

    assert cli_main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"- trl (iterative GRPO fork): {trl.__version__} (")
    assert f"- torch: {torch.__version__}" in lines and f"- transformers: {transformers.__version__}" in lines
    assert any(line.startswith("- Python: ") for line in lines) and len(lines) == 4 + 8


def test_a_missing_eval_split_says_which_flag_to_change(tmp_path, model_dir, data_path, capsys):
    argv = cli_argv(model_dir, data_path, tmp_path, "--eval_strategy", "steps", "--eval_steps", "1")
    assert cli_main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"trl grpo: error: The dataset {data_path!r} has no split 'test'; its splits are ['train']. Evaluation "
        "(--eval_strategy steps) reads --dataset_test_split ('test'): name a split the dataset has, split a mixture "
        "with `test_split_size` in the config file, or set --eval_strategy no."
    )
