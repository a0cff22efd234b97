# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Our errors and warnings carry TRL 1.16's key phrase for the same condition, so that a user's
`pytest.raises(match=...)` or log filter written against TRL still matches (each message keeps its own explanation
and fix after the phrase).

`KEY_PHRASES` is the one list: every test below triggers a condition in this package and searches its message for the
phrase, and `test_key_phrases_are_trl_1_16s` triggers the same conditions in TRL 1.16 (its venv, one subprocess) and
searches TRL's messages for the same phrases, so the list cannot drift from TRL.
"""

import dataclasses
import json
import logging
import re

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from upstream_venv import run_upstream_script

from trl import GRPOConfig, GRPOTrainer
from trl.trainer.grpo_losses import aggregate_loss, group_advantages, importance_ratio
from trl.trainer.grpo_rewards import aggregate_rewards, call_reward_funcs, load_reward_funcs


# Condition id → TRL 1.16's key phrase (a regular expression, searched with `re.search`).
KEY_PHRASES = {
    # GRPOConfig.__post_init__
    "num_generations_below_2": r"GRPO requires at least 2 generations per prompt",
    "generation_batch_not_divisible_by_global_batch": r"generation_batch_size \(6\) must be divisible by the global "
    r"batch size \(4\)",
    "generation_batch_and_steps_both_set": r"'generation_batch_size' and 'steps_per_generation' can not be both "
    r"configured at the same time",
    "generation_batch_not_divisible_by_num_generations": r"generation_batch_size \(4\) must be divisible by "
    r"num_generations \(3\)",
    "eval_batch_not_divisible": r"must be divisible by the number of generations used for evaluation \(2\)",
    "hub_repo_without_log_completions": r"log_completions_hub_repo is set, but log_completions is False",
    "use_transformers_paged": r"`use_transformers_paged` is deprecated",
    "vllm_clip_min_not_below_clip_max": r"vllm_importance_sampling_clip_min \(2\.0\) must be less than "
    r"vllm_importance_sampling_clip_max \(1\.0\)",
    "vllm_importance_sampling_cap": r"The `vllm_importance_sampling_cap` argument is deprecated",
    # GRPOTrainer.__init__
    "no_reward_source": r"No reward source provided",
    "reward_weights_mismatch": r"Number of reward weights \(2\) must match number of reward functions \(1\)",
    "reward_processing_classes_mismatch": r"The number of reward processing classes \(2\) must match the number of "
    r"reward functions \(1\)",
    "no_train_dataset": r"`train_dataset` is required",
    "sync_ref_model_without_beta": r"`sync_ref_model=True` while `beta=0\.0`",
    "model_init_kwargs_with_instance": r"You passed `model_init_kwargs` to the `GRPOConfig`, but your model is "
    r"already instantiated",
    "quantization_config_with_instance": r"You passed `quantization_config` to the trainer, but your model is "
    r"already instantiated",
    "quantization_config_twice": r"You set `quantization_config` both as a trainer argument and in "
    r"`args\.model_init_kwargs`",
    "processing_class_type": r"The `processing_class` must be either a `PreTrainedTokenizerBase` or a `ProcessorMixin`",
    "peft_config_type": r"`peft_config` must be a `peft\.PeftConfig` instance \(e\.g\. `peft\.LoraConfig`\), got dict",
    "peft_model_with_peft_config": r"You passed a `PeftModel` instance together with a `peft_config` to the trainer",
    "train_dataset_type": r"`train_dataset` must be a `Dataset` or `IterableDataset`, got `list`",
    "router_aux_loss_without_moe": r"is not a Mixture-of-Experts model",
    "peft_adapter_on_lm_head": r"Applying a PEFT adapter to `lm_head` is not supported",  # with cast_lm_head_to_fp32
    "luspo_token_level": r"`importance_sampling_level` should be set to `'sequence'`",
    "vespo_sequence_level": r"VESPO computes sequence-level importance weights internally",
    "sequence_level_token_sum_loss": r"the `'dapo'` loss sums per-token contributions",
    # rewards and advantages
    "all_rewards_none": r"All reward functions returned None for the following kwargs:",
    "reward_count_mismatch": r"returned 3 rewards, but 4 were expected",
    "unknown_scale_rewards": r"Invalid value for scale_rewards: bogus",
    "unknown_multi_objective_aggregation": r"Invalid multi_objective_aggregation: bogus",
    # loss
    "compute_loss_return_outputs": r"The GRPOTrainer does not support returning outputs",
    "unknown_importance_sampling_level": r"Unknown importance sampling level: bogus",
    "unknown_loss_type": r"Unknown loss type: bogus",
    # GRPOTrainer with an IterableDataset
    "iterable_dataset_workers": r"Iterable datasets require `dataloader_num_workers=0`",
    # ModelConfig, get_peft_config
    "model_config_8_and_4_bit": r"You can't use 8 bit and 4 bit precision at the same time",
    "peft_not_installed": r"You need to have PEFT library installed",
    # TrlParser
    "config_file_unknown_arguments": r"Unknown arguments from config file",
    "config_file_not_a_mapping": r"must contain a YAML mapping",
    "config_file_env_not_a_dict": r"`env` field should be a dict in the YAML file",
    "dataclass_field_named_config": r"has a field named 'config'",
    # get_dataset
    "mixture_without_datasets": r"No datasets were loaded from the mixture configuration",
    "mixture_partial_fractions": r"`fraction` must be set for either all datasets in the mixture or none of them",
    "mixture_fraction_with_streaming": r"Using a dataset `fraction` is not supported with streaming datasets",
    # the `trl grpo` script
    "script_unknown_reward_function": r"Could not load reward function 'nope'",
    "script_datasets_and_dataset_name": r"Both `datasets` and `dataset_name` are provided",
    "script_no_dataset": r"Either `datasets` or `dataset_name` must be provided",
    # callbacks
    "log_completions_without_eval_dataset": r"Trainer must have an evaluation dataset to use the "
    r"LogCompletionsCallback",
    "rich_not_installed": r"RichProgressCallback requires the `rich` extra",
}


def phrase(case: str) -> str:
    return KEY_PHRASES[case]


def trl_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("trl")]


def short_reward(completions, **kwargs):  # one reward too few
    return [0.0] * (len(completions) - 1)


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.fixture
def base(tmp_path):
    return dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        save_strategy="no",
        max_steps=1,
    )


@pytest.fixture(scope="module")
def prompts():
    return Dataset.from_dict({"prompt": ["1+1=", "2+2="] * 4})


# ---------------------------------------------------------------- GRPOConfig


CONFIG_ERRORS = [
    ("num_generations_below_2", dict(num_generations=1)),
    ("generation_batch_not_divisible_by_global_batch", dict(generation_batch_size=6)),
    ("generation_batch_and_steps_both_set", dict(generation_batch_size=8, steps_per_generation=2)),
    ("generation_batch_not_divisible_by_num_generations", dict(num_generations=3)),
    ("hub_repo_without_log_completions", dict(log_completions_hub_repo="me/completions")),
    ("sync_ref_model_without_beta", dict(sync_ref_model=True, beta=0.0)),  # TRL: in GRPOTrainer.__init__
    ("unknown_scale_rewards", dict(scale_rewards="bogus")),  # TRL: at the first generation batch
    ("unknown_multi_objective_aggregation", dict(multi_objective_aggregation="bogus")),  # TRL: idem
    ("unknown_importance_sampling_level", dict(importance_sampling_level="bogus")),  # TRL: at the first loss
    ("unknown_loss_type", dict(loss_type="bogus")),  # TRL: idem
    ("use_transformers_paged", dict(use_transformers_paged=True)),  # TRL: a FutureWarning, here not supported
    (
        "vllm_clip_min_not_below_clip_max",
        dict(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.0),
    ),
]


@pytest.mark.parametrize("case, overrides", CONFIG_ERRORS, ids=[c for c, _ in CONFIG_ERRORS])
def test_config_errors_carry_trl_phrase(base, case, overrides):
    with pytest.raises(ValueError, match=phrase(case)):
        GRPOConfig(**{**base, **overrides})


CONFIG_WARNINGS = [
    ("luspo_token_level", dict(loss_type="luspo")),
    ("vespo_sequence_level", dict(loss_type="vespo", importance_sampling_level="sequence")),
    ("sequence_level_token_sum_loss", dict(loss_type="dapo", importance_sampling_level="sequence")),
]


@pytest.mark.parametrize("case, overrides", CONFIG_WARNINGS, ids=[c for c, _ in CONFIG_WARNINGS])
def test_config_warnings_carry_trl_phrase(base, caplog, case, overrides):
    with caplog.at_level(logging.WARNING, logger="trl"):
        GRPOConfig(**{**base, **overrides})
    warnings = trl_warnings(caplog)  # TRL: logger.warning too
    assert len(warnings) == 1 and re.search(phrase(case), warnings[0]), warnings


def test_deprecated_importance_sampling_cap_carries_trl_phrase(base):
    with pytest.warns(FutureWarning, match=phrase("vllm_importance_sampling_cap")):  # TRL: a FutureWarning too
        GRPOConfig(**base, vllm_importance_sampling_cap=2.0)


# ---------------------------------------------------------------- GRPOTrainer.__init__


def test_trainer_init_errors_carry_trl_phrase(tiny_lm_path, base, prompts):
    with pytest.raises(ValueError, match=phrase("no_reward_source")):
        GRPOTrainer(tiny_lm_path, reward_funcs=None, args=GRPOConfig(**base), train_dataset=prompts)
    with pytest.raises(ValueError, match=phrase("reward_weights_mismatch")):
        GRPOTrainer(
            tiny_lm_path, zero_reward, args=GRPOConfig(**base, reward_weights=[1.0, 2.0]), train_dataset=prompts
        )
    with pytest.raises(ValueError, match=phrase("reward_processing_classes_mismatch")):
        GRPOTrainer(
            tiny_lm_path,
            zero_reward,
            args=GRPOConfig(**base),
            train_dataset=prompts,
            reward_processing_classes=[None, None],
        )
    # TRL warns and ignores the argument; here it is an error (same phrase).
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    args = GRPOConfig(**base, model_init_kwargs={"dtype": "float32"})
    with pytest.raises(ValueError, match=phrase("model_init_kwargs_with_instance")):
        GRPOTrainer(model, zero_reward, args=args, train_dataset=prompts)
    with pytest.raises(ValueError, match=phrase("quantization_config_with_instance")):
        GRPOTrainer(model, zero_reward, args=GRPOConfig(**base), train_dataset=prompts, quantization_config={})


def test_trainer_argument_type_errors_carry_trl_phrase(tiny_lm_path, base, prompts):
    """TRL 1.16's checks of the arguments' types and combinations, made before anything is loaded."""
    from peft import LoraConfig, get_peft_model

    args = GRPOConfig(**base, model_init_kwargs={"quantization_config": None})
    with pytest.raises(ValueError, match=phrase("quantization_config_twice")):
        GRPOTrainer(tiny_lm_path, zero_reward, args=args, train_dataset=prompts, quantization_config={})
    with pytest.raises(TypeError, match=phrase("processing_class_type") + r", got `object` \(this package trains"):
        GRPOTrainer(
            tiny_lm_path, zero_reward, args=GRPOConfig(**base), train_dataset=prompts, processing_class=object()
        )
    with pytest.raises(TypeError, match=phrase("peft_config_type")):
        GRPOTrainer(tiny_lm_path, zero_reward, args=GRPOConfig(**base), train_dataset=prompts, peft_config={"r": 8})
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_lm_path), LoraConfig())
    with pytest.raises(ValueError, match=phrase("peft_model_with_peft_config")):
        GRPOTrainer(policy, zero_reward, args=GRPOConfig(**base), train_dataset=prompts, peft_config=LoraConfig())
    with pytest.raises(
        TypeError, match=phrase("train_dataset_type") + re.escape(" (e.g. `datasets.Dataset.from_list")
    ):
        GRPOTrainer(tiny_lm_path, zero_reward, args=GRPOConfig(**base), train_dataset=[{"prompt": "1+1="}] * 8)


def test_reward_loading_errors_carry_trl_phrase():
    with pytest.raises(ValueError, match=phrase("no_reward_source")):
        load_reward_funcs([])
    with pytest.raises(ValueError, match=phrase("reward_weights_mismatch")):
        load_reward_funcs(zero_reward, reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match=phrase("reward_processing_classes_mismatch")):
        load_reward_funcs(zero_reward, reward_processing_classes=[None, None])


def test_missing_train_dataset_carries_trl_phrase(tiny_lm_path, base):
    with pytest.raises(ValueError, match=phrase("no_train_dataset")):
        GRPOTrainer(tiny_lm_path, zero_reward, args=GRPOConfig(**base))


def test_eval_batch_error_carries_trl_phrase(tiny_lm_path, base, prompts):
    args = GRPOConfig(**base, eval_strategy="steps", per_device_eval_batch_size=3)
    with pytest.raises(ValueError, match=phrase("eval_batch_not_divisible")):
        GRPOTrainer(tiny_lm_path, zero_reward, args=args, train_dataset=prompts, eval_dataset=prompts)


def test_router_aux_loss_error_carries_trl_phrase(tiny_lm_path, base, prompts):
    with pytest.raises(ValueError, match=phrase("router_aux_loss_without_moe")):
        GRPOTrainer(
            tiny_lm_path, zero_reward, args=GRPOConfig(**base, router_aux_loss_coef=0.1), train_dataset=prompts
        )


def test_lm_head_adapter_error_carries_trl_phrase(tiny_lm_path, base, prompts):
    """TRL refuses an adapter on the LM head always; here only with cast_lm_head_to_fp32=True (the same phrase)."""
    from peft import LoraConfig

    args = GRPOConfig(**base, cast_lm_head_to_fp32=True)
    with pytest.raises(ValueError, match=phrase("peft_adapter_on_lm_head")):
        GRPOTrainer(
            tiny_lm_path,
            zero_reward,
            args=args,
            train_dataset=prompts,
            peft_config=LoraConfig(target_modules=["lm_head"]),
        )


# ---------------------------------------------------------------- rewards, advantages, loss


def test_reward_errors_and_warnings_carry_trl_phrase(caplog):
    batch = dict(prompts=["1+1="] * 4, completions=["2"] * 4, completion_ids=[[1]] * 4, reward_kwargs={})
    with pytest.raises(ValueError, match=phrase("reward_count_mismatch")):
        call_reward_funcs([short_reward], ["short_reward"], [None], **batch)
    with caplog.at_level(logging.WARNING, logger="trl"):
        rewards = call_reward_funcs([none_reward], ["none_reward"], [None], **batch)
    assert torch.isnan(rewards).all()
    warnings = trl_warnings(caplog)  # TRL: logger.warning too
    assert len(warnings) == 1 and re.search(phrase("all_rewards_none"), warnings[0]), warnings


def test_advantage_and_loss_errors_carry_trl_phrase():
    """The pure functions behind the trainer (GRPOConfig refuses these values first)."""
    with pytest.raises(ValueError, match=phrase("unknown_scale_rewards")):
        group_advantages(torch.tensor([0.0, 1.0]), 2, scale_rewards="bogus")
    with pytest.raises(ValueError, match=phrase("unknown_multi_objective_aggregation")):
        aggregate_rewards(torch.ones(2, 1), torch.ones(1), 2, "group", "bogus")
    logps, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match=phrase("unknown_importance_sampling_level")):
        importance_ratio(logps, logps, mask, "bogus")
    with pytest.raises(ValueError, match=phrase("unknown_loss_type")):
        aggregate_loss(logps, mask, "bogus")


def test_compute_loss_return_outputs_carries_trl_phrase(tiny_lm_path, base, prompts):
    trainer = GRPOTrainer(tiny_lm_path, zero_reward, args=GRPOConfig(**base), train_dataset=prompts)
    with pytest.raises(ValueError, match=phrase("compute_loss_return_outputs")):
        trainer.compute_loss(trainer.model, {}, return_outputs=True)


def test_iterable_dataset_workers_warning_carries_trl_phrase(tiny_lm_path, base, prompts, caplog):
    args = GRPOConfig(**base, dataloader_num_workers=2)
    with caplog.at_level(logging.WARNING, logger="trl"):
        GRPOTrainer(tiny_lm_path, zero_reward, args=args, train_dataset=prompts.to_iterable_dataset())
    warnings = [w for w in trl_warnings(caplog) if re.search(phrase("iterable_dataset_workers"), w)]
    assert len(warnings) == 1 and "dataloader_num_workers=2 becomes 0" in warnings[0], trl_warnings(caplog)


# ---------------------------------------------------------------- the script surface


def test_model_config_and_peft_errors_carry_trl_phrase(monkeypatch):
    import importlib.util

    from trl import ModelConfig, get_peft_config

    with pytest.raises(ValueError, match=phrase("model_config_8_and_4_bit")):
        ModelConfig(load_in_8bit=True, load_in_4bit=True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    with pytest.raises(ValueError, match=phrase("peft_not_installed")):
        get_peft_config(ModelConfig(use_peft=True))


@dataclasses.dataclass
class OneField:
    value: int = 0


@dataclasses.dataclass
class FieldNamedConfig:
    config: str = ""


# What each TrlParser case writes in its config file (the same files for TRL 1.16 in UPSTREAM_SCRIPT).
PARSER_FILES = {
    "config_file_unknown_arguments": "value: 1\nextra: 2\n",
    "config_file_not_a_mapping": "- 1\n- 2\n",
    "config_file_env_not_a_dict": "env: [1]\nvalue: 1\n",
}


@pytest.mark.parametrize("case", sorted(PARSER_FILES))
def test_trl_parser_errors_carry_trl_phrase(tmp_path, case):
    from trl import TrlParser

    path = tmp_path / "config.yaml"
    path.write_text(PARSER_FILES[case])
    with pytest.raises(ValueError, match=phrase(case)):
        TrlParser(OneField).parse_args_and_config(["--config", str(path)])


def test_trl_parser_reserved_field_carries_trl_phrase():
    from trl import TrlParser

    with pytest.raises(ValueError, match=phrase("dataclass_field_named_config")):
        TrlParser(FieldNamedConfig)


def test_mixture_errors_carry_trl_phrase(tmp_path):
    from trl import DatasetMixtureConfig, get_dataset
    from trl.scripts.utils import DatasetConfig

    data = str(tmp_path / "rows.jsonl")
    Dataset.from_dict({"prompt": ["a", "b"]}).to_json(data)
    with pytest.raises(ValueError, match=phrase("mixture_without_datasets")):
        get_dataset(DatasetMixtureConfig())
    partial = [DatasetConfig(path="json", data_files=data, fraction=0.5), DatasetConfig(path="json", data_files=data)]
    with pytest.raises(ValueError, match=phrase("mixture_partial_fractions")):
        get_dataset(DatasetMixtureConfig(datasets=partial))
    both = [DatasetConfig(path="json", data_files=data, fraction=0.5) for _ in range(2)]
    with pytest.raises(ValueError, match=phrase("mixture_fraction_with_streaming")):
        get_dataset(DatasetMixtureConfig(datasets=both, streaming=True))


def test_grpo_script_errors_and_warnings_carry_trl_phrase(tmp_path, caplog):
    from trl import DatasetMixtureConfig
    from trl.scripts.grpo import GRPOScriptArguments, load_script_dataset, resolve_reward_func
    from trl.scripts.utils import DatasetConfig

    with pytest.raises(ValueError, match=phrase("script_unknown_reward_function")):
        resolve_reward_func("nope")
    with pytest.raises(ValueError, match=phrase("script_no_dataset")):
        load_script_dataset(GRPOScriptArguments(), DatasetMixtureConfig())
    data = str(tmp_path / "rows.jsonl")
    Dataset.from_dict({"prompt": ["a", "b"]}).to_json(data)
    mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path="json", data_files=data)])
    with caplog.at_level(logging.WARNING, logger="trl"):
        load_script_dataset(GRPOScriptArguments(dataset_name="ignored"), mixture)
    warnings = trl_warnings(caplog)  # TRL: logger.warning too (accelerate's logger)
    assert len(warnings) == 1 and re.search(phrase("script_datasets_and_dataset_name"), warnings[0]), warnings


def test_callback_errors_carry_trl_phrase(monkeypatch):
    from types import SimpleNamespace

    from trl import LogCompletionsCallback, RichProgressCallback
    from trl.trainer import callbacks

    with pytest.raises(ValueError, match=phrase("log_completions_without_eval_dataset")):
        LogCompletionsCallback(SimpleNamespace(eval_dataset=None))
    monkeypatch.setattr(callbacks, "is_rich_available", lambda: False)
    with pytest.raises(ImportError, match=phrase("rich_not_installed")):
        RichProgressCallback()


# ---------------------------------------------------------------- the phrases are TRL 1.16's


# Triggers every condition of `KEY_PHRASES` in TRL 1.16 and prints {case: [kind, message]}: kind is the exception's
# type name, "warning" for a `logger.warning` or the warning category for `warnings.warn` ("none": nothing happened).
UPSTREAM_SCRIPT = r"""
import json, logging, sys, warnings
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

path, output_dir = sys.argv[1], sys.argv[2]
records = []
class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno == logging.WARNING:
            records.append(record.getMessage())
logging.getLogger().addHandler(Collect())
out = {}

def config(**overrides):
    base = dict(output_dir=output_dir, use_cpu=True, report_to="none", bf16=False, gradient_checkpointing=False,
                per_device_train_batch_size=4, num_generations=2, max_completion_length=4, save_strategy="no",
                max_steps=1)
    return GRPOConfig(**{**base, **overrides})

def run(case, make, warning_category=None):
    records.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            make()
        except Exception as error:
            out[case] = [type(error).__name__, str(error)]
            return
    categorized = [str(w.message) for w in caught if w.category.__name__ == warning_category]
    if categorized:
        out[case] = [warning_category, "\n".join(categorized)]
        return
    out[case] = ["warning", "\n".join(records)] if records else ["none", ""]

prompts = Dataset.from_dict({"prompt": ["1+1=", "2+2="] * 4})
def zero(completions, **kwargs): return [0.0] * len(completions)
def short(completions, **kwargs): return [0.0] * (len(completions) - 1)
def none(completions, **kwargs): return [None] * len(completions)
def trainer(model=path, reward=zero, **kwargs):
    kwargs.setdefault("train_dataset", prompts)
    return GRPOTrainer(model, reward, **kwargs)

run("num_generations_below_2", lambda: config(num_generations=1))
run("generation_batch_not_divisible_by_global_batch", lambda: config(generation_batch_size=6))
run("generation_batch_and_steps_both_set", lambda: config(generation_batch_size=8, steps_per_generation=2))
run("generation_batch_not_divisible_by_num_generations", lambda: config(num_generations=3))
run("eval_batch_not_divisible", lambda: config(eval_strategy="steps", per_device_eval_batch_size=3))
run("hub_repo_without_log_completions", lambda: config(log_completions_hub_repo="me/completions"))
run("use_transformers_paged", lambda: config(use_transformers_paged=True), "FutureWarning")
run("vllm_clip_min_not_below_clip_max",
    lambda: config(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.0))
run("vllm_importance_sampling_cap", lambda: config(vllm_importance_sampling_cap=2.0), "FutureWarning")
run("no_reward_source", lambda: trainer(reward=None, args=config()))
run("reward_weights_mismatch", lambda: trainer(args=config(reward_weights=[1.0, 2.0])))
run("reward_processing_classes_mismatch", lambda: trainer(args=config(), reward_processing_classes=[None, None]))
run("no_train_dataset", lambda: trainer(args=config(), train_dataset=None))
run("sync_ref_model_without_beta", lambda: trainer(args=config(sync_ref_model=True, beta=0.0)))
model = AutoModelForCausalLM.from_pretrained(path)
run("model_init_kwargs_with_instance", lambda: trainer(model, args=config(model_init_kwargs={"dtype": "float32"})))
run("quantization_config_with_instance", lambda: trainer(model, args=config(), quantization_config={}))
run("quantization_config_twice",
    lambda: trainer(args=config(model_init_kwargs={"quantization_config": None}), quantization_config={}))
run("processing_class_type", lambda: trainer(args=config(), processing_class=object()))
run("peft_config_type", lambda: trainer(args=config(), peft_config={"r": 8}))
run("train_dataset_type", lambda: trainer(args=config(), train_dataset=[{"prompt": "1+1="}] * 8))
run("router_aux_loss_without_moe", lambda: trainer(args=config(router_aux_loss_coef=0.1)))
from peft import LoraConfig, get_peft_model
run("peft_model_with_peft_config", lambda: trainer(
    get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig()), args=config(), peft_config=LoraConfig()))
lm_head_lora = LoraConfig(target_modules=["lm_head"])
run("peft_adapter_on_lm_head", lambda: trainer(args=config(cast_lm_head_to_fp32=True), peft_config=lm_head_lora))
run("luspo_token_level", lambda: trainer(args=config(loss_type="luspo")))
run("vespo_sequence_level", lambda: trainer(args=config(loss_type="vespo", importance_sampling_level="sequence")))
run("sequence_level_token_sum_loss", lambda: trainer(args=config(importance_sampling_level="sequence")))

t = trainer(args=config())
batch = [{"prompt": p} for p in ["1+1=", "1+1=", "2+2=", "2+2="]]
def generate():
    return t._generate_and_score_completions(batch)
def with_attribute(name, value, make):
    old = getattr(t, name)
    setattr(t, name, value)
    try:
        return make()
    finally:
        setattr(t, name, old)
run("unknown_scale_rewards", lambda: with_attribute("scale_rewards", "bogus", generate))
run("unknown_multi_objective_aggregation", lambda: with_attribute("multi_objective_aggregation", "bogus", generate))
t.reward_funcs[0] = none
run("all_rewards_none", generate)
t.reward_funcs[0] = short
run("reward_count_mismatch", generate)
t.reward_funcs[0] = zero
inputs = generate()
run("compute_loss_return_outputs", lambda: t.compute_loss(t.model, inputs, return_outputs=True))
loss = lambda: t.compute_loss(t.model, inputs)
run("unknown_importance_sampling_level", lambda: with_attribute("importance_sampling_level", "bogus", loss))
run("unknown_loss_type", lambda: with_attribute("loss_type", "bogus", loss))
stream = prompts.to_iterable_dataset()
run("iterable_dataset_workers", lambda: trainer(args=config(dataloader_num_workers=2), train_dataset=stream))

import dataclasses, os, types
import trl.trainer.callbacks, trl.trainer.utils
from trl import DatasetMixtureConfig, LogCompletionsCallback, ModelConfig, RichProgressCallback, TrlParser
from trl import get_dataset, get_peft_config
from trl.scripts.grpo import GRPOScriptArguments, main as grpo_main
from trl.scripts.utils import DatasetConfig

run("model_config_8_and_4_bit", lambda: ModelConfig(load_in_8bit=True, load_in_4bit=True))
trl.trainer.utils.is_peft_available = lambda: False
run("peft_not_installed", lambda: get_peft_config(ModelConfig(use_peft=True)))

@dataclasses.dataclass
class OneField:
    value: int = 0

@dataclasses.dataclass
class FieldNamedConfig:
    config: str = ""

def parse_file(text):
    config_path = os.path.join(output_dir, "config.yaml")
    os.makedirs(output_dir, exist_ok=True)
    with open(config_path, "w") as f:
        f.write(text)
    return TrlParser(OneField).parse_args_and_config(["--config", config_path])

for case, text in json.loads(sys.argv[3]).items():
    run(case, lambda: parse_file(text))
run("dataclass_field_named_config", lambda: TrlParser(FieldNamedConfig))

data = os.path.join(output_dir, "rows.jsonl")
prompts.to_json(data)
run("mixture_without_datasets", lambda: get_dataset(DatasetMixtureConfig()))
partial = [DatasetConfig(path="json", data_files=data, fraction=0.5), DatasetConfig(path="json", data_files=data)]
run("mixture_partial_fractions", lambda: get_dataset(DatasetMixtureConfig(datasets=partial)))
both = [DatasetConfig(path="json", data_files=data, fraction=0.5) for _ in range(2)]
run("mixture_fraction_with_streaming", lambda: get_dataset(DatasetMixtureConfig(datasets=both, streaming=True)))

model_args = ModelConfig(model_name_or_path=os.path.join(output_dir, "no-such-model"))
mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path="json", data_files=data)])
def script(reward_funcs=("think_format_reward",), dataset_name=None, dataset_args=DatasetMixtureConfig()):
    script_args = GRPOScriptArguments(reward_funcs=list(reward_funcs), dataset_name=dataset_name)
    grpo_main(script_args, config(), model_args, dataset_args)
run("script_unknown_reward_function", lambda: script(reward_funcs=["nope"]))
run("script_no_dataset", lambda: script())
def both_datasets():  # the warning, then a failure to load the missing model
    try:
        script(dataset_name="ignored", dataset_args=mixture)
    except Exception:
        pass
run("script_datasets_and_dataset_name", both_datasets)
run("log_completions_without_eval_dataset", lambda: LogCompletionsCallback(types.SimpleNamespace(eval_dataset=None)))
trl.trainer.callbacks.is_rich_available = lambda: False
run("rich_not_installed", RichProgressCallback)
print(json.dumps(out))
"""

# The kind of report TRL 1.16 makes for each condition (where ours differs, the test of ours says so).
TRL_WARNINGS = {
    "model_init_kwargs_with_instance",
    "quantization_config_with_instance",
    "luspo_token_level",
    "vespo_sequence_level",
    "sequence_level_token_sum_loss",
    "all_rewards_none",
    "iterable_dataset_workers",
    "script_datasets_and_dataset_name",
}
TRL_KINDS = {case: "warning" if case in TRL_WARNINGS else "ValueError" for case in KEY_PHRASES}
TRL_KINDS["use_transformers_paged"] = TRL_KINDS["vllm_importance_sampling_cap"] = "FutureWarning"
TRL_KINDS.update(processing_class_type="TypeError", peft_config_type="TypeError", train_dataset_type="TypeError")
TRL_KINDS["rich_not_installed"] = "ImportError"


@pytest.mark.parity
def test_key_phrases_are_trl_1_16s(tiny_lm_path, tmp_path):
    upstream = run_upstream_script(UPSTREAM_SCRIPT, tiny_lm_path, str(tmp_path / "out"), json.dumps(PARSER_FILES))
    assert set(upstream) == set(KEY_PHRASES)
    for case, key_phrase in KEY_PHRASES.items():
        kind, message = upstream[case]
        assert kind == TRL_KINDS[case], (case, kind, message)
        assert re.search(key_phrase, message), (case, key_phrase, message)
