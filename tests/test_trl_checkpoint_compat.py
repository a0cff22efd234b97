# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Checkpoints cross between TRL 1.16 and this package: a GRPO run with `sync_ref_model=True` started in TRL resumes
here (its checkpoint holds no reference and no `EntropyCoefficient` state), and one started here resumes in TRL (which
ignores `ref_model.safetensors`, `ref_sync_state.json` and our `stateful_callbacks` entry).

TRL runs in a subprocess (`tests/upstream_venv.py`) on the same tiny model folder. The two packages sample
differently, so final weights are not compared; the reference a resumed run starts from is.
"""

import json
import logging
import shutil
import subprocess
import tempfile

import peft
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from upstream_venv import upstream_env, upstream_trl_python_or_skip

from trl import GRPOConfig, GRPOTrainer
from trl.reference.ref_checkpoint import REF_ADAPTER_FILE, REF_MODEL_FILE, REF_SYNC_STATE_FILE


PROMPTS = [f"{a}+{b}=" for a in range(8) for b in range(4)]

UPSTREAM_SCRIPT = """
import json, sys
from datasets import Dataset
from transformers import set_seed
import trl
from trl import GRPOConfig, GRPOTrainer

assert trl.__version__ == "1.16.0", trl.__file__
spec = json.loads(sys.argv[1])

def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]

set_seed(0)
peft_config = None
if spec["lora"]:
    from peft import LoraConfig
    peft_config = LoraConfig(**spec["lora"])
dataset = Dataset.from_dict({"prompt": spec["prompts"]})
trainer = GRPOTrainer(spec["model"], length_reward, args=GRPOConfig(**spec["args"]), train_dataset=dataset, peft_config=peft_config)
trainer.train(resume_from_checkpoint=spec["resume"])
print("global_step", trainer.state.global_step)
"""


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def config_kwargs(output_dir, **overrides) -> dict:
    """2 steps of 8 completions, a checkpoint after each, the reference reset to the policy after every step."""
    kwargs = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-2,
        beta=0.1,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        ref_model_mixup_alpha=1.0,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=0,
    )
    kwargs.update(overrides)
    return kwargs


LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def run_upstream(
    python: str, model_path, args: dict, resume: str | None = None, lora: bool = False
) -> subprocess.CompletedProcess:
    spec = json.dumps({"model": model_path, "args": args, "resume": resume, "prompts": PROMPTS, "lora": lora and LORA})
    env = upstream_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(
        [python, "-P", "-c", UPSTREAM_SCRIPT, spec],
        cwd=tempfile.gettempdir(),  # not this repository: `import trl` must find TRL 1.16
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ours(model_path, lora=False, **kwargs) -> GRPOTrainer:
    args = GRPOConfig(**config_kwargs(**kwargs))
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    peft_config = peft.LoraConfig(**LORA) if lora else None
    return GRPOTrainer(model_path, length_reward, args=args, train_dataset=dataset, peft_config=peft_config)


class FirstStepReference(TrainerCallback):
    """The reference's tensors when the first (resumed) step begins, after every `on_train_begin`."""

    def __init__(self, trainer):
        self.trainer, self.reference = trainer, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.reference is None:
            self.reference = {k: v.clone() for k, v in self.trainer.reference.tensors(self.trainer.model).items()}


@pytest.fixture(scope="module")
def upstream_python() -> str:
    """The TRL 1.16 venv's python; the tests skip when it cannot be built offline (and fail on CI)."""
    return upstream_trl_python_or_skip()


@pytest.fixture(scope="module")
def trl_checkpoint(upstream_python, tiny_lm_path, tmp_path_factory) -> str:
    """checkpoint-1 of a 2-step TRL 1.16 run (sync_ref_model=True, α = 1, synced after every step)."""
    output_dir = tmp_path_factory.mktemp("trl-run")
    done = run_upstream(upstream_python, tiny_lm_path, config_kwargs(output_dir))
    assert done.returncode == 0, done.stderr[-4000:]
    checkpoint = output_dir / "checkpoint-1"
    assert not (checkpoint / REF_MODEL_FILE).exists()  # what this test is about: TRL does not save its reference
    with open(checkpoint / "trainer_state.json") as f:
        assert "EntropyCoefficient" not in json.load(f)["stateful_callbacks"]
    return str(checkpoint)


@pytest.mark.parametrize("restore_callbacks", [False, True], ids=["default", "restore_callback_states"])
def test_resume_a_trl_checkpoint(tiny_lm_path, trl_checkpoint, tmp_path, caplog, restore_callbacks):
    trainer = ours(tiny_lm_path, output_dir=tmp_path, restore_callback_states_from_checkpoint=restore_callbacks)
    initial = {k: v.clone() for k, v in trainer.reference.tensors(trainer.model).items()}
    probe = FirstStepReference(trainer)
    trainer.add_callback(probe)
    with caplog.at_level(logging.WARNING, logger="trl.reference.ref_checkpoint"):
        trainer.train(resume_from_checkpoint=trl_checkpoint)  # used to fail at the step-2 save: KeyError

    assert trainer.state.global_step == 2
    assert (
        f"Checkpoint {trl_checkpoint} has no synced reference model (ref_model.safetensors), as in checkpoints "
        "written by TRL, which does not save its reference; checkpoints written by this package with "
        "sync_ref_model=True include it. Its training_args.bin gives the settings of the run that wrote it "
        "(sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0, beta=0.1). 1 reference sync(s) "
        "(every 1 steps) had run by step 1, so the reference "
        "starts from the policy's weights at the checkpoint (one sync with alpha=1); this is exactly the "
        "uninterrupted run's reference (synced at step 1). TRL's own resume re-creates the reference from the "
        "initial model instead, so its KL anchor jumps back to where training began."
    ) in caplog.text
    # The reference the resumed step 2 uses is, bit for bit, the policy TRL saved at step 1 (not the initial model).
    saved_policy = dict(AutoModelForCausalLM.from_pretrained(trl_checkpoint).named_parameters())
    assert set(saved_policy) <= set(probe.reference)
    assert all(torch.equal(probe.reference[k], saved_policy[k]) for k in saved_policy)
    assert not all(torch.equal(probe.reference[k], initial[k]) for k in saved_policy)
    assert trainer.sync_callback.num_syncs == 2 and trainer.sync_callback.last_sync_step == 2
    checkpoint_2 = tmp_path / "checkpoint-2"
    assert (checkpoint_2 / REF_MODEL_FILE).exists() and (checkpoint_2 / REF_SYNC_STATE_FILE).exists()
    with open(checkpoint_2 / "trainer_state.json") as f:
        assert set(json.load(f)["stateful_callbacks"]) == {"EntropyCoefficient", "TrainerControl"}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_trl_resumes_our_checkpoint(upstream_python, tiny_lm_path, tmp_path, lora):
    trainer = ours(tiny_lm_path, lora=lora, output_dir=tmp_path / "ours")
    trainer.train()
    checkpoint = tmp_path / "ours" / "checkpoint-1"
    assert (checkpoint / (REF_ADAPTER_FILE if lora else REF_MODEL_FILE)).exists()  # extra files TRL must ignore
    resumed_dir = tmp_path / "trl"
    resumed_dir.mkdir()
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-1")
    # restore_callback_states_from_checkpoint=True also makes TRL read our EntropyCoefficient entry (and skip it).
    # TRL refuses sync_ref_model=True with PEFT: its LoRA run resumes our synced-LoRA checkpoint without syncing.
    args = config_kwargs(resumed_dir, restore_callback_states_from_checkpoint=True, sync_ref_model=not lora)
    done = run_upstream(upstream_python, tiny_lm_path, args, resume=str(resumed_dir / "checkpoint-1"), lora=lora)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "global_step 2" in done.stdout
    with open(resumed_dir / "checkpoint-2" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 2
    assert "Checkpoint included callbacks not included in current configuration. Ignoring. (EntropyCoefficient)" in (
        done.stdout + done.stderr
    )
